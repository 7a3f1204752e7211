/* Tests of the nn module: every layer kind and the whole small network against central finite
 * differences in double precision, the float model against the double reference, the paper
 * model's shapes and parameter count, bit-exact reproducibility, and a short real training
 * run that must lower the loss. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>
#include <criterion/criterion.h>

#include "../common/src/nn/nn_internal.h"
#include "blas_as_programs.h"
#include "mqgrad/data.h"
#include "mqgrad/nn.h"
#include "mqgrad/util.h"

/* Central differences with steps 10*EPS, EPS and EPS/10; an entry passes when
 * |fd - g| <= TOL * (|fd| + |g|) for one of them, the sum floored at 1e-3 of the array's
 * largest gradient (cancellation in the objective makes the differences of near-zero entries
 * noisy). A wrong kernel is off by O(1). The largest step keeps the objective's rounding
 * (a loss over a whole network, about 1e-12 here) from deciding: at EPS alone an entry of
 * fc2.b failed by 1.6e-5 with OpenBLAS's Prescott kernels, which sum in another order than
 * its AVX ones, and agreed to 3e-7 at 10*EPS. */
#define EPS 1e-5
#define TOL 1e-5

static void s_fill(double *v, size_t n, uint64_t seed, double scale)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        v[i] = scale * (2 * mq_rng_double(&rng) - 1);
}

static double s_dot(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* The objective under test, recomputed from the current values of whatever array is being
 * perturbed. */
typedef double(s_obj_fn)(void *ctx);

/* Compares G (the analytic gradient of OBJ with respect to V) against central differences at
 * up to SAMPLES evenly spread entries; returns the worst relative error. */
static double s_fd(s_obj_fn *obj, void *ctx, double *v, const double *g, size_t n,
                   size_t samples)
{
    double worst = 0, gmax = 0;
    size_t step = n > samples ? n / samples : 1;
    for (size_t i = 0; i < n; i++)
        gmax = fmax(gmax, fabs(g[i]));
    for (size_t i = 0; i < n; i += step) {
        /* A ReLU or max-pool kink within a step of the point spoils that difference; a kink
         * cannot sit within every step unless it is closer than EPS/10, so an entry passes
         * if any step agrees. A wrong gradient fails them all. */
        double err = INFINITY, fd = 0;
        for (double h = 10 * EPS; h > EPS / 20 && err > TOL; h /= 10) {
            double keep = v[i];
            v[i] = keep + h;
            double up = obj(ctx);
            v[i] = keep - h;
            double down = obj(ctx);
            v[i] = keep;
            fd = (up - down) / (2 * h);
            err = fmin(err, fabs(fd - g[i]) / fmax(1e-300, fmax(fabs(fd) + fabs(g[i]), 1e-3 * gmax)));
        }
        if (err > worst)
            worst = err;
        if (getenv("MQ_TEST_VERBOSE") && err > TOL)
            fprintf(stderr, "  entry %zu: analytic %.10g finite-difference %.10g\n", i, g[i], fd);
    }
    return worst;
}

/* ---- convolution ---------------------------------------------------------------------- */
typedef struct {
    int n, c, h, w, k;
    double *x, *wt, *b, *col, *y, *r;
} s_conv_t;

static double s_conv_obj(void *p)
{
    s_conv_t *t = p;
    mq_conv_forward_d(t->x, t->n, t->c, t->h, t->w, (size_t)t->c * t->h * t->w,
                      (size_t)t->h * t->w, t->wt, t->b, t->k, t->col, t->y);
    return s_dot(t->y, t->r, (size_t)t->k * t->n * t->h * t->w);
}

Test(nn, conv_gradient_matches_finite_differences)
{
    s_conv_t t = {.n = 2, .c = 3, .h = 6, .w = 7, .k = 4};
    size_t nx = 2 * 3 * 42, nw = 4 * 3 * 25, ny = 4 * 2 * 42, ncol = 75 * 2 * 42;
    t.x = malloc(nx * 8), t.wt = malloc(nw * 8), t.b = malloc(32), t.col = malloc(ncol * 8);
    t.y = malloc(ny * 8), t.r = malloc(ny * 8);
    double *dw = malloc(nw * 8), db[4], *dcol = malloc(ncol * 8), *dx = malloc(nx * 8);
    s_fill(t.x, nx, 1, 1), s_fill(t.wt, nw, 2, 0.3), s_fill(t.b, 4, 3, 0.1), s_fill(t.r, ny, 4, 1);
    s_conv_obj(&t);
    mq_conv_backward_d(t.r, 2, 3, 6, 7, 126, 42, t.wt, 4, t.col, dw, db, dcol, dx);
    cr_expect_lt(s_fd(s_conv_obj, &t, t.x, dx, nx, 1000), TOL, "input gradient");
    cr_expect_lt(s_fd(s_conv_obj, &t, t.wt, dw, nw, 1000), TOL, "weight gradient");
    cr_expect_lt(s_fd(s_conv_obj, &t, t.b, db, 4, 4), TOL, "bias gradient");
    free(t.x), free(t.wt), free(t.b), free(t.col), free(t.y), free(t.r);
    free(dw), free(dcol), free(dx);
}

/* ---- ReLU, max-pool, LRN: element-wise or per-plane layers on one input --------------- */
typedef struct {
    int kind; /* 0 relu, 1 pool, 2 lrn */
    int a, b, c;
    double *x, *y, *r, *scale;
    int32_t *arg;
    size_t ny;
} s_unary_t;

static double s_unary_obj(void *p)
{
    s_unary_t *t = p;
    if (t->kind == 0) {
        memcpy(t->y, t->x, t->ny * 8);
        mq_relu_forward_d(t->y, t->ny);
    } else if (t->kind == 1) {
        mq_pool_forward_d(t->x, t->a, t->b, t->c, t->y, t->arg);
    } else {
        mq_lrn_forward_d(t->x, t->a, (size_t)t->b, t->scale, t->y);
    }
    return s_dot(t->y, t->r, t->ny);
}

static double s_unary_check(int kind, int a, int b, int c, double xscale)
{
    size_t nx = kind == 1 ? (size_t)a * b * c : (size_t)a * b;
    s_unary_t t = {.kind = kind, .a = a, .b = b, .c = c};
    t.ny = kind == 1 ? (size_t)a * mq_pool_out(b) * mq_pool_out(c) : nx;
    t.x = malloc(nx * 8), t.y = malloc(t.ny * 8), t.r = malloc(t.ny * 8);
    t.scale = malloc(2 * nx * 8), t.arg = malloc(t.ny * 4);
    double *dx = malloc(nx * 8), *tmp = malloc(nx * 8);
    s_fill(t.x, nx, 10 + kind, xscale), s_fill(t.r, t.ny, 20 + kind, 1);
    s_unary_obj(&t);
    if (kind == 0) {
        memcpy(dx, t.r, nx * 8);
        mq_relu_backward_d(t.y, dx, nx);
    } else if (kind == 1) {
        mq_pool_backward_d(t.r, t.arg, a, b, c, dx);
    } else {
        mq_lrn_backward_d(t.x, t.scale, t.r, a, (size_t)b, tmp, dx);
    }
    double err = s_fd(s_unary_obj, &t, t.x, dx, nx, 2000);
    free(t.x), free(t.y), free(t.r), free(t.scale), free(t.arg), free(dx), free(tmp);
    return err;
}

Test(nn, relu_gradient_matches_finite_differences)
{
    cr_expect_lt(s_unary_check(0, 10, 17, 0, 1), TOL);
}

Test(nn, maxpool_gradient_matches_finite_differences)
{
    cr_expect_lt(s_unary_check(1, 3, 7, 7, 1), TOL, "odd sides (SAME padding clips)");
    cr_expect_lt(s_unary_check(1, 2, 14, 14, 1), TOL, "even sides");
}

Test(nn, lrn_gradient_matches_finite_differences)
{
    /* Inputs of a few units so the alpha term (0.001/9 per squared neighbour) matters. */
    cr_expect_lt(s_unary_check(2, 12, 5, 0, 20), TOL, "12 channels, wider than the window");
    cr_expect_lt(s_unary_check(2, 3, 4, 0, 20), TOL, "3 channels, narrower than the window");
}

Test(nn, lrn_matches_its_formula)
{
    double x[6] = {1, 2, 3, 4, 5, 6}, y[6], s[12];
    mq_lrn_forward_d(x, 6, 1, s, y);
    /* Channel 0 sees channels 0..4 (radius 4): 1+4+9+16+25 = 55. */
    double want = 1 / pow(1 + 0.001 / 9 * 55, 0.75);
    cr_expect_float_eq(y[0], want, 1e-12);
}

/* ---- fully connected ------------------------------------------------------------------ */
typedef struct {
    double *x, *w, *b, *y, *r;
} s_fc_t;

static double s_fc_obj(void *p)
{
    s_fc_t *t = p;
    mq_fc_forward_d(t->x, 3, 7, 5, t->w, t->b, t->y);
    return s_dot(t->y, t->r, 15);
}

Test(nn, fc_gradient_matches_finite_differences)
{
    double x[21], w[35], b[5], y[15], r[15], dx[21], dw[35], db[5];
    s_fc_t t = {x, w, b, y, r};
    s_fill(x, 21, 5, 1), s_fill(w, 35, 6, 0.5), s_fill(b, 5, 7, 0.1), s_fill(r, 15, 8, 1);
    mq_fc_backward_d(x, r, 3, 7, 5, w, dw, db, dx);
    cr_expect_lt(s_fd(s_fc_obj, &t, x, dx, 21, 21), TOL);
    cr_expect_lt(s_fd(s_fc_obj, &t, w, dw, 35, 35), TOL);
    cr_expect_lt(s_fd(s_fc_obj, &t, b, db, 5, 5), TOL);
}

/* The float model's own fully connected products (fc_x86.c) against sums in double, on
 * shapes with every kind of edge: a batch of 1, batches not a multiple of the tiles, widths
 * below, at and past a tile and rows past a tile (the shapes are in the test). Each value may
 * be off by float rounding of its sum: 1e-5 of the sum of its terms' magnitudes. */
static void s_fc_fast_check(int n, int in, int out)
{
    float *x = malloc(sizeof(float) * n * in), *w = malloc(sizeof(float) * in * out),
          *dy = malloc(sizeof(float) * n * out), *y = malloc(sizeof(float) * n * out),
          *dw = malloc(sizeof(float) * in * out), *dx = malloc(sizeof(float) * n * in),
          *dw2 = malloc(sizeof(float) * in * out);
    double v[3];
    uint64_t seed = 1000u * n + in + 7u * out;
    for (int i = 0; i < n * in; i++)
        s_fill(v, 1, seed++, 1), x[i] = (float)v[0];
    for (int i = 0; i < in * out; i++)
        s_fill(v, 1, seed++, 0.5), w[i] = (float)v[0];
    for (int i = 0; i < n * out; i++)
        s_fill(v, 1, seed++, 1), dy[i] = (float)v[0], y[i] = (float)(i % 5);
    const float l2 = 0.01f;
    mq_fc_fast_forward(x, n, in, out, w, y);
    double loss = mq_fc_fast_backward_l2(x, dy, n, in, out, w, l2, dw, dx, false);
    cr_assert_geq(loss, 0, "%dx%dx%d: the backward did not run", n, in, out);
    double worst = 0, ss = 0;
    for (int m = 0; m < n; m++)
        for (int c = 0; c < out; c++) {
            double sum = (m * out + c) % 5, mag = sum;
            for (int k = 0; k < in; k++) {
                sum += (double)x[m * in + k] * w[k * out + c];
                mag += fabs((double)x[m * in + k] * w[k * out + c]);
            }
            worst = fmax(worst, fabs(y[m * out + c] - sum) / (mag + 1e-30));
        }
    cr_expect_lt(worst, 1e-5, "%dx%dx%d: forward off by %g of its terms", n, in, out, worst);
    worst = 0;
    for (int k = 0; k < in; k++)
        for (int c = 0; c < out; c++) {
            double sum = (double)l2 * w[k * out + c], mag = fabs(sum);
            ss += (double)w[k * out + c] * w[k * out + c];
            for (int m = 0; m < n; m++) {
                sum += (double)x[m * in + k] * dy[m * out + c];
                mag += fabs((double)x[m * in + k] * dy[m * out + c]);
            }
            worst = fmax(worst, fabs(dw[k * out + c] - sum) / (mag + 1e-30));
        }
    cr_expect_lt(worst, 1e-5, "%dx%dx%d: dw off by %g of its terms", n, in, out, worst);
    worst = 0;
    for (int m = 0; m < n; m++)
        for (int k = 0; k < in; k++) {
            double sum = 0, mag = 0;
            for (int c = 0; c < out; c++) {
                sum += (double)dy[m * out + c] * w[k * out + c];
                mag += fabs((double)dy[m * out + c] * w[k * out + c]);
            }
            worst = fmax(worst, fabs(dx[m * in + k] - sum) / (mag + 1e-30));
        }
    cr_expect_lt(worst, 1e-5, "%dx%dx%d: dx off by %g of its terms", n, in, out, worst);
    cr_expect_float_eq(loss, 0.5 * l2 * ss, 1e-5 * loss, "%dx%dx%d: L2 term %g, not %g", n, in, out,
                       loss, 0.5 * l2 * ss);
    /* Without dx: the same dw, bit for bit. */
    cr_expect_float_eq(mq_fc_fast_backward_l2(x, dy, n, in, out, w, l2, dw2, NULL, false), loss, 0);
    cr_expect(memcmp(dw, dw2, sizeof(float) * in * out) == 0, "%dx%dx%d: dw depends on dx", n, in,
              out);
    /* Accumulating: what dw2 held plus the gradient, each value to float rounding of its
     * terms (the old value one of them). */
    for (int i = 0; i < in * out; i++)
        dw2[i] = (float)(i % 7 - 3) * 0.25f;
    double acc_loss = mq_fc_fast_backward_l2(x, dy, n, in, out, w, l2, dw2, dx, true);
    cr_expect_float_eq(acc_loss, loss, 0); /* (a macro that may evaluate its arguments twice) */
    worst = 0;
    for (int i = 0; i < in * out; i++) {
        double old = (i % 7 - 3) * 0.25, mag = fabs(old) + fabs((double)dw[i]) + 1e-30;
        worst = fmax(worst, fabs(dw2[i] - (old + dw[i])) / mag);
    }
    cr_expect_lt(worst, 1e-5, "%dx%dx%d: accumulated dw off by %g", n, in, out, worst);
    free(x), free(w), free(dy), free(y), free(dw), free(dx), free(dw2);
}

/* The kernel sets this CPU has, AVX-512 and AVX2: a test runs each (an AVX-512 machine
 * tests both), or skips where there is neither. */
static const mq_fc_kind_t s_fc_kinds[] = {MQ_FC_AVX512, MQ_FC_AVX2};
static const char *s_fc_names[] = {"AVX-512", "AVX2"};

static bool s_fc_try(size_t k)
{
    if (k == 0 && !mq_fc_use(MQ_FC_AVX512) && !mq_fc_use(MQ_FC_AVX2))
        cr_skip_test("this CPU has neither AVX-512F nor AVX2 with FMA: the model uses sgemm");
    return mq_fc_use(s_fc_kinds[k]);
}

Test(nn, fc_fast_kernels_match_sums_in_double)
{
    mq_nn_set_threads(1);
    /* widths below, at and past a tile of either set (48 and 24 columns), and rows past a
     * tile of either (8, 4 and 2) */
    const int shapes[][3] = {{1, 1, 48},    {1, 7, 50},    {5, 77, 53},  {32, 8, 48},
                             {32, 300, 96}, {33, 129, 97}, {32, 64, 16}, {7, 13, 200},
                             {3, 5, 24},    {9, 3, 31},    {32, 11, 25}};
    for (size_t k = 0; k < 2; k++) {
        if (!s_fc_try(k))
            continue;
        cr_log_info("fully connected kernels: %s", s_fc_names[k]);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            s_fc_fast_check(shapes[i][0], shapes[i][1], shapes[i][2]);
    }
}

/* col2im with AVX-512 and with AVX2 (conv_x86.c) gives what the definition gives, bit for
 * bit: the taps' values added back in the order channel, tap row, tap column, image. Planes
 * of 28 x 28 (49 full vectors of 16), 14 x 14 (a partial last vector), 7 x 7, 5 x 9, 1 x 3
 * and 32 x 32; values with runs of -0.0 (which an AVX2 lane outside the plane must not turn
 * into +0.0) and a NaN. The buffers are exactly the planes, so a sanitizer build sees a
 * vector that reaches past them. */
static void s_conv_fast_check(int n, int c, int h, int w)
{
    const int hw = h * w, K = MQ_KSIZE, P = MQ_KSIZE / 2;
    /* planes with gaps between them, holding -0.0: an add of +0.0 there would show */
    const size_t ld = (size_t)n * hw, sc = hw + 5, sn = c * sc + 3, nx = n * sn;
    float *col = malloc(sizeof(float) * K * K * c * ld), *dx = malloc(sizeof(float) * nx),
          *dref = malloc(sizeof(float) * nx);
    for (size_t i = 0; i < K * K * c * ld; i++)
        col[i] = i % 37 < 9 ? -0.0f : (float)((i * 13) % 29) / 5 - 2;
    col[K * K * c * ld / 2] = NAN;
    for (size_t i = 0; i < nx; i++)
        dx[i] = dref[i] = -0.0f;
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++)
            for (int i = 0; i < hw; i++)
                dref[ni * sn + ci * sc + i] = 0.0f;
    for (int ci = 0; ci < c; ci++)
        for (int t = 0; t < K * K; t++)
            for (int ni = 0; ni < n; ni++)
                for (int i = 0; i < hw; i++) {
                    int sh = i / w + t / K - P, sw = i % w + t % K - P;
                    if (sh >= 0 && sh < h && sw >= 0 && sw < w)
                        dref[ni * sn + ci * sc + sh * w + sw] +=
                            col[(ci * K * K + t) * ld + ni * hw + i];
                }
    mq_conv_fast_col2im(col, ld, n, c, h, w, sn, sc, dx);
    cr_expect(memcmp(dx, dref, sizeof(float) * nx) == 0, "col2im %dx%dx%dx%d", n, c, h, w);
    free(col), free(dx), free(dref);
}

Test(nn, conv_fast_col2im_matches_its_definition)
{
    mq_nn_set_threads(1);
    for (size_t k = 0; k < 2; k++) {
        if (!s_fc_try(k))
            continue;
        cr_log_info("col2im: %s", s_fc_names[k]);
        cr_assert(mq_conv_fast(28, 28) && mq_conv_fast(32, 32), "28 x 28 and 32 x 32 planes taken");
        s_conv_fast_check(3, 1, 28, 28);
        s_conv_fast_check(2, 5, 14, 14);
        s_conv_fast_check(1, 3, 7, 7);
        s_conv_fast_check(2, 2, 5, 9);
        s_conv_fast_check(2, 2, 1, 3);
        s_conv_fast_check(1, 2, 32, 32);
    }
}

/* im2col with AVX-512 and with AVX2 (conv_x86.c) writes the columns the definition gives, bit
 * for bit (-0.0 and a NaN copied, +0.0 where a tap reads outside the plane), for images one
 * after another in each channel (sn == h * w): rows 64-byte aligned (streaming stores) or not
 * (the columns one value off, rows an odd number of values apart), a last vector cut short or
 * not, planes of 28 x 28, 14 x 14, 7 x 7, 5 x 9, 1 x 3 and 3 x 3. What lies between the rows
 * is left alone. It declines, writing nothing, where the images are not one after another. */
static void s_im2col_fast_check(int n, int c, int h, int w, bool aligned)
{
    const int hw = h * w, K = MQ_KSIZE, P = MQ_KSIZE / 2;
    const size_t sc = (size_t)n * hw + 7, ld = (size_t)n * hw + (aligned ? 0 : 3),
                 ncol = K * K * c * ld, bytes = (sizeof(float) * (ncol + 1) + 63) / 64 * 64;
    float *x = malloc(sizeof(float) * c * sc), *buf = aligned_alloc(64, bytes),
          *ref = malloc(sizeof(float) * ncol);
    float *col = aligned ? buf : buf + 1;
    for (size_t i = 0; i < c * sc; i++)
        x[i] = i % 37 < 9 ? -0.0f : (float)((i * 13) % 29) / 5 - 2;
    x[c * sc / 2] = NAN;
    for (size_t i = 0; i < ncol; i++)
        col[i] = ref[i] = 12345.0f;
    for (int ci = 0; ci < c; ci++)
        for (int t = 0; t < K * K; t++)
            for (int ni = 0; ni < n; ni++)
                for (int i = 0; i < hw; i++) {
                    int sh = i / w + t / K - P, sw = i % w + t % K - P;
                    ref[(ci * K * K + t) * ld + ni * hw + i] =
                        sh >= 0 && sh < h && sw >= 0 && sw < w ? x[ci * sc + ni * hw + sh * w + sw]
                                                               : 0.0f;
                }
    cr_assert(mq_conv_fast_im2col(x, n, c, h, w, hw, sc, col, ld), "%dx%dx%dx%d not taken", n, c, h,
              w);
    cr_expect(memcmp(col, ref, sizeof(float) * ncol) == 0, "im2col %dx%dx%dx%d, rows %s", n, c, h,
              w, aligned ? "aligned" : "unaligned");
    free(x), free(buf), free(ref);
}

Test(nn, conv_fast_im2col_matches_its_definition)
{
    for (size_t k = 0; k < 2; k++) {
        if (!s_fc_try(k))
            continue;
        for (int aligned = 0; aligned < 2; aligned++) {
            s_im2col_fast_check(3, 1, 28, 28, aligned);  /* conv1's shape */
            s_im2col_fast_check(32, 2, 14, 14, aligned); /* conv2's, 392 full vectors a row */
            s_im2col_fast_check(5, 3, 14, 14, aligned);  /* the last vector cut short */
            s_im2col_fast_check(2, 3, 7, 7, aligned);
            s_im2col_fast_check(3, 2, 5, 9, aligned);
            s_im2col_fast_check(16, 2, 1, 3, aligned);
            s_im2col_fast_check(1, 2, 3, 3, aligned); /* a row shorter than a vector */
        }
        float x[2 * 49] = {0}, col[25 * 2 * 49];
        for (size_t i = 0; i < sizeof col / sizeof col[0]; i++)
            col[i] = 7.0f;
        cr_expect_not(mq_conv_fast_im2col(x, 2, 1, 7, 7, 50, 100, col, 98),
                      "images apart (sn 50 for 7 x 7 planes) taken");
        cr_expect(col[0] == 7.0f && col[25 * 2 * 49 - 1] == 7.0f, "a declined im2col wrote");
    }
}

/* Max-pooling with AVX-512 (conv_x86.c) takes what the definition takes: for each 3x3
 * window at stride 2 (clipped at the bottom and right), the first of its largest values in
 * row-then-column order, compared with a strict, ordered >. The data has runs of equal
 * values (ReLU's zeros, repeated levels) and a NaN, where the order decides. */
static void s_pool_fast_check(int planes, int h, int w)
{
    const int ho = mq_pool_out(h), wo = mq_pool_out(w);
    const size_t nx = (size_t)planes * h * w, ny = (size_t)planes * ho * wo;
    float *x = malloc(sizeof(float) * nx), *y = malloc(sizeof(float) * ny),
          *yref = malloc(sizeof(float) * ny);
    int32_t *arg = malloc(sizeof(int32_t) * ny), *aref = malloc(sizeof(int32_t) * ny);
    for (size_t i = 0; i < nx; i++) {
        float v = (float)((i * 7) % 11) - 5;
        x[i] = v > 0 ? v : 0;
    }
    x[nx / 3] = NAN;
    for (int p = 0; p < planes; p++)
        for (int i = 0; i < ho; i++)
            for (int j = 0; j < wo; j++) {
                const float *xp = x + (size_t)p * h * w;
                int best = 2 * i * w + 2 * j;
                for (int r = 2 * i; r < 2 * i + 3 && r < h; r++)
                    for (int cc = 2 * j; cc < 2 * j + 3 && cc < w; cc++)
                        if (xp[r * w + cc] > xp[best])
                            best = r * w + cc;
                yref[(size_t)p * ho * wo + i * wo + j] = xp[best];
                aref[(size_t)p * ho * wo + i * wo + j] = best;
            }
    cr_assert(mq_conv_fast_pool(x, planes, h, w, y, arg), "%dx%d planes not taken", h, w);
    cr_expect(memcmp(arg, aref, sizeof(int32_t) * ny) == 0, "positions, %dx%d", h, w);
    cr_expect(memcmp(y, yref, sizeof(float) * ny) == 0, "maxima, %dx%d", h, w);
    free(x), free(y), free(yref), free(arg), free(aref);
}

Test(nn, conv_fast_pool_matches_its_definition)
{
    for (size_t k = 0; k < 2; k++) {
        if (!s_fc_try(k))
            continue;
        cr_log_info("max-pooling: %s", s_fc_names[k]);
        s_pool_fast_check(6, 28, 28);
        s_pool_fast_check(5, 14, 14);
        s_pool_fast_check(3, 7, 7);
        s_pool_fast_check(2, 5, 9);
        s_pool_fast_check(2, 32, 32);
        s_pool_fast_check(2, 31, 17);
        s_pool_fast_check(2, 17, 16);
        s_pool_fast_check(2, 9, 8);
        s_pool_fast_check(2, 1, 1);
        float x[33] = {0}, y[17];
        int32_t arg[17];
        cr_expect_not(mq_conv_fast_pool(x, 1, 1, 33, y, arg), "a plane 33 wide is not its to take");
    }
}

/* v[i] = (i * mul mod m) / m - 0.5: a fixed pattern in [-0.5, 0.5) with no short period. */
static void s_fill_mod(float *v, size_t n, unsigned mul, unsigned m)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(((unsigned)i * mul) % m) / (float)m - 0.5f;
}

/* Split over threads, each product gives the bits it gives on one. (The split needs
 * OpenBLAS's idle threads asleep, which mq_nn_pick_blas_core arranges for the programs and,
 * through blas_as_programs.h, for these tests.) */
static void s_fc_threads_check(const char *set)
{
    const int n = 32, in = 301, out = 500;
    float *x = malloc(sizeof(float) * n * in), *w = malloc(sizeof(float) * in * out),
          *dy = malloc(sizeof(float) * n * out), *r[4][3];
    s_fill_mod(x, (size_t)n * in, 7919u, 101);
    s_fill_mod(w, (size_t)in * out, 104729u, 97);
    for (int i = 0; i < n * out; i++)
        dy[i] = (float)((i * 31) % 89) / 89 - 0.5f;
    double loss[4];
    for (int t = 0; t < 4; t++) {
        mq_nn_set_threads(t + 1);
        r[t][0] = calloc((size_t)n * out, sizeof(float));
        r[t][1] = malloc(sizeof(float) * in * out);
        r[t][2] = malloc(sizeof(float) * n * in);
        mq_fc_fast_forward(x, n, in, out, w, r[t][0]);
        loss[t] = mq_fc_fast_backward_l2(x, dy, n, in, out, w, 0.01f, r[t][1], r[t][2], false);
    }
    for (int t = 1; t < 4; t++) {
        cr_expect(memcmp(r[0][0], r[t][0], sizeof(float) * n * out) == 0,
                  "%s forward: %d threads give other bits than 1", set, t + 1);
        cr_expect(memcmp(r[0][1], r[t][1], sizeof(float) * in * out) == 0,
                  "%s dw: %d threads give other bits than 1", set, t + 1);
        cr_expect(memcmp(r[0][2], r[t][2], sizeof(float) * n * in) == 0,
                  "%s dx: %d threads give other bits than 1", set, t + 1);
        cr_expect(loss[t] == loss[0], "%s L2 term: %d threads give %.17g, 1 gives %.17g", set,
                  t + 1, loss[t], loss[0]);
    }
    for (int t = 0; t < 4; t++)
        free(r[t][0]), free(r[t][1]), free(r[t][2]);
    free(x), free(w), free(dy);
    mq_nn_set_threads(0);
}

Test(nn, fc_fast_kernels_give_the_same_bits_on_any_number_of_threads, .timeout = 60)
{
    setenv(MQ_NN_BLAS_TIMEOUT_ENV, MQ_NN_BLAS_TIMEOUT, 1);
    for (size_t k = 0; k < 2; k++)
        if (s_fc_try(k))
            s_fc_threads_check(s_fc_names[k]);
}

/* ---- softmax cross-entropy and L2 ----------------------------------------------------- */
static const uint8_t s_labels[4] = {3, 0, 9, 3};

static double s_ce_obj(void *p)
{
    return mq_softmax_ce_d(p, s_labels, 4, 10, NULL, NULL) / 4;
}

Test(nn, softmax_ce_gradient_matches_finite_differences)
{
    double z[40], dz[40];
    long correct = 0;
    s_fill(z, 40, 9, 3);
    double sum = mq_softmax_ce_d(z, s_labels, 4, 10, dz, &correct);
    cr_expect_lt(s_fd(s_ce_obj, z, z, dz, 40, 40), TOL);
    cr_expect_gt(sum, 0);
    /* Uniform logits: the loss is log(10) per example. */
    double u[40] = {0};
    cr_expect_float_eq(mq_softmax_ce_d(u, s_labels, 4, 10, NULL, NULL), 4 * log(10.0), 1e-12);
}

static double s_l2_obj(void *p)
{
    double dw[9] = {0};
    return mq_l2_d(p, 9, 0.3, dw);
}

Test(nn, l2_gradient_matches_finite_differences)
{
    double w[9], dw[9] = {0};
    s_fill(w, 9, 11, 2);
    double v = mq_l2_d(w, 9, 0.3, dw);
    cr_expect_float_eq(v, 0.15 * s_dot(w, w, 9), 1e-12, "l2 * 0.5 * ||w||^2");
    cr_expect_lt(s_fd(s_l2_obj, w, w, dw, 9, 9), TOL);
}

/* ---- the whole small network ---------------------------------------------------------- */
typedef struct {
    mq_net_d_t *net;
    double *p, *g, *x;
    uint8_t y[3];
} s_net_t;

static double s_net_obj(void *ctx)
{
    s_net_t *t = ctx;
    return mq_net_grad_d(t->net, t->p, t->g, t->x, t->y, 3, NULL, NULL);
}

Test(nn, small_model_gradient_matches_finite_differences_and_float)
{
    mq_nn_set_threads(1); /* the float model's own fully connected kernels, where they run */
    mq_model_t *m = mq_model_new("small", 2, 3, 0.01f);
    cr_assert_not_null(m);
    mq_model_init(m, 42);
    size_t np = mq_model_nparams(m);
    mq_arch_t arch;
    cr_assert_eq(mq_arch_for("small", 2, 0.01, &arch), 0);
    s_net_t t = {mq_net_new_d(&arch, 3), malloc(np * 8), malloc(np * 8), malloc(3 * 2 * 784 * 8),
                 {7, 2, 5}};
    double *g = malloc(np * 8);
    float *xf = malloc(3 * 2 * 784 * 4);
    s_fill(t.x, 3 * 2 * 784, 12, 1);
    for (size_t i = 0; i < np; i++) /* non-zero biases so their gradients are exercised */
        t.p[i] = mq_model_params(m)[i] + 0.01 * ((i * 7919) % 13);
    for (size_t i = 0; i < np; i++)
        mq_model_params(m)[i] = (float)t.p[i];
    for (int i = 0; i < 3 * 2 * 784; i++)
        xf[i] = (float)t.x[i];
    double loss = s_net_obj(&t);
    memcpy(g, t.g, np * 8);
    float lossf = mq_model_grad(m, xf, t.y, 3);
    cr_expect_float_eq(lossf, loss, 1e-4 * loss, "float loss %g vs double %g", lossf, loss);
    for (size_t k = 0; k < mq_model_ntensors(m); k++) {
        const mq_tensor_view_t *v = mq_model_tensor(m, k);
        double err = s_fd(s_net_obj, &t, t.p + v->offset, g + v->offset, v->count, 40);
        cr_expect_lt(err, TOL, "%s: finite differences disagree (%g)", v->name, err);
        double gmax = 0, dmax = 0;
        for (size_t i = v->offset; i < v->offset + v->count; i++) {
            gmax = fmax(gmax, fabs(g[i]));
            dmax = fmax(dmax, fabs(g[i] - mq_model_grads(m)[i]));
        }
        cr_expect_lt(dmax, 1e-3 * gmax + 1e-7, "%s: float gradient off by %g (max %g)",
                     v->name, dmax, gmax);
    }
    mq_net_destroy_d(&t.net);
    free(t.p), free(t.g), free(t.x), free(g), free(xf);
    mq_model_destroy(&m);
}

/* ---- shapes, reproducibility, evaluation ---------------------------------------------- */
Test(nn, paper_model_has_the_papers_shapes)
{
    static const char *names[] = {"conv1.w", "conv1.b", "conv2.w", "conv2.b", "fc1.w",
                                  "fc1.b",   "fc2.w",   "fc2.b",   "fc3.w",   "fc3.b"};
    const size_t counts[] = {5 * 5 * 1 * 64, 64,   5 * 5 * 64 * 64, 64,      3136 * 2304,
                             2304,           2304 * 3840, 3840,     3840 * 10, 10};
    mq_model_t *m = mq_model_new("paper", 1, 1, 1e-4f);
    cr_assert_not_null(m);
    cr_expect_eq(mq_model_ntensors(m), 10);
    size_t off = 0;
    for (size_t i = 0; i < 10; i++) {
        const mq_tensor_view_t *v = mq_model_tensor(m, i);
        cr_expect_str_eq(v->name, names[i]);
        cr_expect_eq(v->count, counts[i], "%s has %zu", v->name, v->count);
        cr_expect_eq(v->offset, off);
        off += v->count;
    }
    cr_expect_eq(mq_model_nparams(m), 16221386);
    cr_expect_null(mq_model_tensor(m, 10));
    mq_model_destroy(&m);
    m = mq_model_new("paper", 3, 1, 1e-4f); /* CIFAR-10: C = 3 */
    cr_expect_eq(mq_model_nparams(m), 16221386 + 2 * 25 * 64);
    mq_model_destroy(&m);
    cr_expect_null(mq_model_new("resnet", 1, 1, 0));
    cr_expect(strstr(mq_err_last(), "resnet") != NULL, "error names the model: %s",
              mq_err_last());
}

static void s_steps(mq_model_t *m, int steps)
{
    float x[8 * 784];
    uint8_t y[8];
    mq_rng_t rng;
    mq_rng_seed(&rng, 77);
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < 8 * 784; i++)
            x[i] = mq_rng_float(&rng) * 2 - 1;
        for (int i = 0; i < 8; i++)
            y[i] = (uint8_t)mq_rng_below(&rng, 10);
        mq_model_grad(m, x, y, 8);
        mq_sgd_update(mq_model_params(m), mq_model_grads(m), mq_model_nparams(m), 0.05f);
    }
}

Test(nn, same_seed_and_threads_give_bit_identical_params, .timeout = 60)
{
    for (int threads = 1; threads <= 2; threads++) {
        mq_nn_set_threads(threads);
        mq_model_t *a = mq_model_new("small", 1, 8, 1e-3f), *b = mq_model_new("small", 1, 8, 1e-3f);
        mq_model_init(a, 5), mq_model_init(b, 5);
        s_steps(a, 4), s_steps(b, 4);
        cr_expect(memcmp(mq_model_params(a), mq_model_params(b),
                         mq_model_nparams(a) * sizeof(float)) == 0,
                  "threads %d: replicas differ", threads);
        mq_model_init(b, 6);
        cr_expect(memcmp(mq_model_params(a), mq_model_params(b),
                         mq_model_nparams(a) * sizeof(float)) != 0,
                  "another seed gives other parameters");
        mq_model_destroy(&a), mq_model_destroy(&b);
    }
    mq_nn_set_threads(0);
}

/* Whether OpenBLAS's sgemm gives the same bits on 2 threads as on 1, on conv1's forward
 * product (64 x 25088 x 25). Its SkylakeX kernels do; its Haswell kernels (which AMD's Zen
 * cores run too) sum some outputs in another order when the product is split otherwise, so
 * there a step's bits follow the thread count through OpenBLAS alone. */
static bool s_blas_same_bits_on_two_threads(void)
{
    const int m = 64, n = 25088, k = 25;
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n),
          *c[2] = {malloc(sizeof(float) * m * n), malloc(sizeof(float) * m * n)};
    s_fill_mod(a, (size_t)m * k, 7919u, 101);
    s_fill_mod(b, (size_t)k * n, 104729u, 97);
    for (int t = 0; t < 2; t++) {
        mq_nn_set_threads(t + 1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1, a, k, b, n, 0, c[t], n);
    }
    bool same = memcmp(c[0], c[1], sizeof(float) * m * n) == 0;
    free(a), free(b), free(c[0]), free(c[1]);
    return same;
}

/* The paper model's step split over two threads (the fully connected kernels, im2col,
 * col2im, ReLU, pooling, LRN and the update each split their outputs, and OpenBLAS splits its
 * products' outputs) gives the bits one thread gives. Where OpenBLAS's own products do not,
 * two runs on two threads give the same bits (as the small model's above). */
Test(nn, paper_model_step_gives_the_same_bits_on_one_and_two_threads, .timeout = 120)
{
    setenv(MQ_NN_BLAS_TIMEOUT_ENV, MQ_NN_BLAS_TIMEOUT, 1); /* what the programs run with */
    int threads[2] = {1, 2};
    if (!s_blas_same_bits_on_two_threads()) {
        cr_log_info("OpenBLAS's %s kernels give other bits on 2 threads than on 1 (sgemm "
                    "64x25088x25): comparing two runs on 2 threads",
                    mq_nn_blas_core());
        threads[0] = 2;
    }
    enum { N = 32 };
    float *x = malloc(sizeof(float) * N * 784), *p[2];
    uint8_t y[N];
    mq_rng_t rng;
    mq_rng_seed(&rng, 3);
    for (int i = 0; i < N * 784; i++)
        x[i] = mq_rng_float(&rng);
    for (int i = 0; i < N; i++)
        y[i] = (uint8_t)mq_rng_below(&rng, 10);
    size_t np = 0;
    for (int t = 0; t < 2; t++) {
        mq_nn_set_threads(threads[t]);
        mq_model_t *m = mq_model_new("paper", 1, N, 5e-4f);
        cr_assert_not_null(m);
        mq_model_init(m, 11);
        np = mq_model_nparams(m);
        for (int s = 0; s < 2; s++) {
            mq_model_grad(m, x, y, N);
            mq_sgd_update(mq_model_params(m), mq_model_grads(m), np, 0.01f);
        }
        p[t] = malloc(sizeof(float) * np);
        memcpy(p[t], mq_model_params(m), sizeof(float) * np);
        mq_model_destroy(&m);
    }
    size_t diff = 0;
    for (size_t i = 0; i < np; i++)
        diff += memcmp(&p[0][i], &p[1][i], sizeof(float)) != 0;
    cr_expect_eq(diff, 0, "%zu of %zu parameters differ after two steps on %d and %d threads", diff,
                 np, threads[0], threads[1]);
    free(p[0]), free(p[1]), free(x);
    mq_nn_set_threads(0);
}

/* What the ready callback saw of the gradient's tail, and where that tail began. */
typedef struct {
    int calls;
    size_t from;
    float *seen;
    const float *grads;
    size_t n;
} s_ready_t;

static void s_on_ready(void *arg, size_t from)
{
    s_ready_t *r = arg;
    r->calls++;
    r->from = from;
    memcpy(r->seen + from, r->grads + from, (r->n - from) * sizeof(float));
}

Test(nn, ready_callback_sees_the_final_fc_gradients_before_the_convolutions, .timeout = 60)
{
    mq_model_t *m = mq_model_new("small", 1, 8, 1e-3f);
    mq_model_init(m, 3);
    size_t n = mq_model_nparams(m);
    s_ready_t r = {.seen = calloc(n, sizeof(float)), .grads = mq_model_grads(m), .n = n};
    mq_model_on_grad_ready(m, s_on_ready, &r);
    float x[8 * 784];
    uint8_t y[8];
    for (int i = 0; i < 8 * 784; i++)
        x[i] = (float)((i * 37) % 101) / 101 - 0.5f;
    for (int i = 0; i < 8; i++)
        y[i] = (uint8_t)(i % 10);
    memset(mq_model_grads(m), 0, n * sizeof(float)); /* no earlier step's values */
    mq_model_grad(m, x, y, 8);
    cr_assert_eq(r.calls, 1, "called once per step");
    cr_expect_eq(r.from, mq_model_tensor(m, 4)->offset, "from fc1.w on (got %zu)", r.from);
    cr_expect(memcmp(r.seen + r.from, mq_model_grads(m) + r.from, (n - r.from) * sizeof(float)) ==
                  0,
              "what the callback saw is the final gradient");
    bool conv_nonzero = false;
    for (size_t i = 0; i < r.from; i++)
        conv_nonzero |= mq_model_grads(m)[i] != 0;
    cr_expect(conv_nonzero, "the convolutions' gradients come after");
    mq_model_on_grad_ready(m, NULL, NULL);
    mq_model_grad(m, x, y, 8);
    cr_expect_eq(r.calls, 1, "not called once cleared");
    free(r.seen);
    mq_model_destroy(&m);
}

/* With accumulation set on some tensors, a step adds their gradient to what they hold (error
 * feedback's residual), to float rounding of the two, and writes the others bit for bit as a
 * step without it does; on the small and the paper model, with the fully connected kernels
 * and with sgemm (two ways of adding the fully connected layers' gradients onto dw). */
Test(nn, accumulating_tensors_add_their_gradient_and_the_others_are_written_over, .timeout = 60)
{
    enum { N = 8 };
    float x[N * 784];
    uint8_t y[N];
    for (int i = 0; i < N * 784; i++)
        x[i] = (float)((i * 37) % 101) / 101 - 0.5f;
    for (int i = 0; i < N; i++)
        y[i] = (uint8_t)(i % 10);
    static const char *models[] = {"small", "paper"};
    static const mq_fc_kind_t kinds[] = {MQ_FC_AVX512, MQ_FC_AVX2, MQ_FC_BLAS};
    for (size_t mi = 0; mi < 2; mi++)
        for (size_t ki = 0; ki < 3; ki++) {
            if (!mq_fc_use(kinds[ki]))
                continue;
            mq_model_t *m = mq_model_new(models[mi], 1, N, 1e-3f);
            cr_assert_not_null(m);
            mq_model_init(m, 3);
            const size_t np = mq_model_nparams(m), nt = mq_model_ntensors(m);
            float *g = mq_model_grads(m), *want = malloc(np * sizeof *want);
            mq_model_grad(m, x, y, N);
            memcpy(want, g, np * sizeof *want);
            for (unsigned mask = 1; mask <= 2; mask++) { /* 1: every tensor; 2: the weights */
                for (size_t i = 0; i < np; i++)
                    g[i] = (float)((int)(i * 7 % 13) - 6) * 1e-3f;
                for (size_t t = 0; t < nt; t++)
                    mq_model_set_accumulate(m, t, mask == 1 || t % 2 == 0);
                mq_model_grad(m, x, y, N);
                for (size_t t = 0; t < nt; t++) {
                    const mq_tensor_view_t *v = mq_model_tensor(m, t);
                    bool acc = mask == 1 || t % 2 == 0;
                    double worst = 0;
                    for (size_t i = v->offset; i < v->offset + v->count; i++) {
                        double old = (double)((int)(i * 7 % 13) - 6) * 1e-3;
                        if (acc)
                            worst = fmax(worst, fabs(g[i] - (old + want[i])) /
                                                    (fabs(old) + fabs((double)want[i])));
                        else
                            worst = fmax(worst, memcmp(&g[i], &want[i], sizeof *g) != 0);
                    }
                    cr_expect_lt(worst, acc ? 1e-4 : 0.5, "%s, fc kind %zu, mask %u: %s %s (%g)",
                                 models[mi], ki, mask, v->name,
                                 acc ? "did not add its gradient" : "was not written over", worst);
                }
                for (size_t t = 0; t < nt; t++)
                    mq_model_set_accumulate(m, t, false);
            }
            free(want);
            mq_model_destroy(&m);
        }
}

Test(nn, eval_in_chunks_equals_eval_of_each_example)
{
    mq_model_t *m = mq_model_new("small", 1, 4, 0);
    mq_model_init(m, 3);
    float x[10 * 784];
    uint8_t y[10];
    for (int i = 0; i < 10 * 784; i++)
        x[i] = (float)((i * 37 % 101) / 50.0 - 1);
    for (int i = 0; i < 10; i++)
        y[i] = (uint8_t)(i * 3 % 10);
    double all = 0, one = 0;
    long ca = 0, co = 0;
    mq_model_eval(m, x, y, 10, &all, &ca);
    for (int i = 0; i < 10; i++)
        mq_model_eval(m, x + i * 784, y + i, 1, &one, &co);
    cr_expect_float_eq(all, one, 1e-4 * one);
    cr_expect_eq(ca, co);
    mq_model_destroy(&m);
}

Test(nn, small_model_learns_fashion_mnist, .timeout = 120)
{
    char path[512];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", MQ_DEFAULT_DATA_DIR);
    if (access(path, R_OK) != 0)
        cr_skip_test("Fashion-MNIST not installed at %s", MQ_DEFAULT_DATA_DIR);
    mq_dataset_t *train = mq_dataset_load("fashion-mnist", MQ_DEFAULT_DATA_DIR, true);
    mq_dataset_t *test = mq_dataset_load("fashion-mnist", MQ_DEFAULT_DATA_DIR, false);
    cr_assert(train && test, "%s", mq_err_last());
    mq_batcher_t *b = mq_batcher_new(train, 0, 1, 32, 1, true);
    mq_model_t *m = mq_model_new("small", 1, 32, 1e-4f);
    mq_model_init(m, 1);
    float x[32 * 784];
    uint8_t y[32];
    double first = 0, last = 0, ls = 0;
    long correct = 0;
    for (int it = 0; it < 300; it++) {
        mq_batcher_next(b, x, y);
        double loss = mq_model_grad(m, x, y, 32);
        mq_sgd_update(mq_model_params(m), mq_model_grads(m), mq_model_nparams(m), 0.05f);
        first += it < 30 ? loss / 30 : 0;
        last += it >= 270 ? loss / 30 : 0;
    }
    mq_model_eval_data(m, test, 0, 1000, x, 32, &ls, &correct);
    cr_expect_lt(last, 0.7 * first, "mean loss of the last 30 steps %g vs first 30 %g", last,
                 first);
    cr_expect_gt(correct, 600, "test accuracy after 300 steps: %ld/1000", correct);
    mq_model_destroy(&m);
    mq_batcher_destroy(&b);
    mq_dataset_destroy(&train), mq_dataset_destroy(&test);
}
