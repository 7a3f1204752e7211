/* Tests of the error-feedback sign codecs and the threshold quantizer (common/quant):
 * EF-signSGD (`sign`), 1-bit SGD (`onebit`) and the dead-zone quantizer of QCMD/QRDA
 * (`thresh`). What a user would notice: the values a payload decodes to (the scale, the two
 * bucket means, unbiasedness and the error bound), that error feedback loses nothing over
 * steps (on the workers and on the server), exact or bounded payload sizes, specs that read
 * back, and bad specs and payloads refused with a reason and without damage. */

#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/quant.h"
#include "gauss.h"

/* ---- helpers ------------------------------------------------------------------------- */



static float *s_zeros(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof *x);
    cr_assert(x);
    return x;
}

static mq_codec_t s_parse(const char *spec)
{
    mq_codec_t c;
    cr_assert_eq(mq_codec_parse(spec, &c), 0, "%s: %s", spec, mq_err_last());
    return c;
}

static uint8_t *s_buf(const mq_codec_t *c, size_t n, size_t *cap)
{
    *cap = mq_codec_payload_size(c, n);
    uint8_t *b = malloc(*cap + 16);
    cr_assert(b);
    memset(b, 0xa5, *cap + 16);
    return b;
}

/* One encode with STATE (n + 1 floats for the EF codecs) and LR; asserts success. */
static size_t s_encode(const mq_codec_t *c, const float *g, size_t n, float *state, float lr,
                       mq_rng_t *rng, uint8_t *buf, size_t cap, mq_codec_stats_t *st)
{
    mq_codec_ctx_t ctx = {.rng = rng, .state = state, .lr = lr};
    size_t len = 0;
    cr_assert_eq(mq_codec_encode_ctx(c, g, n, &ctx, buf, cap, &len, st), 0, "%s", mq_err_last());
    cr_assert(len <= cap);
    return len;
}

static void s_decode(const mq_codec_t *c, const uint8_t *buf, size_t len, float *out, size_t n)
{
    cr_assert_eq(mq_codec_decode(c, buf, len, out, n, 1.0f, false, NULL), 0, "%s",
                 mq_err_last());
}

static float s_f32(const uint8_t *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static void s_put_f32(uint8_t *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int k = 0; k < 4; k++)
        p[k] = (uint8_t)(u >> (8 * k));
}

static double s_sum_sq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

static bool s_close(double a, double b, double rel)
{
    return fabs(a - b) <= rel * fmax(fabs(a), fabs(b)) + 1e-30;
}

/* Spec SPEC formats as WANT and parses back to the same codec. */
static void s_check_spec(const char *spec, const char *want)
{
    mq_codec_t c = s_parse(spec), back;
    char buf[MQ_CODEC_MAX_SPEC];
    mq_codec_format(&c, buf, sizeof buf);
    cr_assert_str_eq(buf, want, "%s formats as '%s', expected '%s'", spec, buf, want);
    cr_assert_eq(mq_codec_parse(buf, &back), 0, "%s", mq_err_last());
    cr_assert(mq_codec_equal(&c, &back), "%s does not parse back to itself", buf);
    cr_assert_eq(mq_codec_validate(&c), 0, "%s", mq_err_last());
}

/* Spec SPEC is refused with a message containing WHY, and OUT is left as it was. */
static void s_check_bad_spec(const char *spec, const char *why)
{
    mq_codec_t c = {.id = MQ_CODEC_ID_uniform, .bits = 6, .param = {11}};
    mq_codec_t before = c;
    cr_assert_eq(mq_codec_parse(spec, &c), -1, "'%s' was accepted", spec);
    cr_assert(strstr(mq_err_last(), why), "'%s': message '%s' lacks '%s'", spec, mq_err_last(),
              why);
    cr_assert(mq_codec_equal(&c, &before), "'%s': output changed on failure", spec);
}

/* The payload BUF[0..len) is refused by mq_codec_decode with a message containing WHY, and
 * dst is left untouched in both plain and accumulating mode. */
static void s_check_bad_payload(const mq_codec_t *c, const uint8_t *buf, size_t len, size_t n,
                                const char *why)
{
    float *dst = malloc(n * sizeof *dst), *ref = malloc(n * sizeof *ref);
    cr_assert(dst && ref);
    for (size_t i = 0; i < n; i++)
        dst[i] = ref[i] = 0.5f + (float)i;
    for (int acc = 0; acc < 2; acc++) {
        cr_assert_eq(mq_codec_decode(c, buf, len, dst, n, 1.0f, acc, NULL), -1,
                     "a bad payload (%s) was accepted", why);
        cr_assert(strstr(mq_err_last(), why), "message '%s' lacks '%s'", mq_err_last(), why);
        cr_assert(memcmp(dst, ref, n * sizeof *dst) == 0, "dst changed (%s)", why);
    }
    free(dst);
    free(ref);
}

/* Error feedback keeps everything: decode(payload) + new residual == old residual (times
 * the lr factor R) + g, to float rounding, for every value. */
static void s_check_conservation(const float *g, const float *e_old, const float *e_new,
                                 const float *dec, size_t n, float r)
{
    for (size_t i = 0; i < n; i++) {
        double lhs = (double)dec[i] + e_new[i], rhs = (double)r * e_old[i] + g[i];
        double tol = 4 * FLT_EPSILON * (fabs(g[i]) + fabs(r * e_old[i]) + fabs(dec[i])) + 1e-30;
        cr_assert(fabs(lhs - rhs) <= tol,
                  "value %zu: decode %g + residual %g != %g * residual %g + gradient %g", i,
                  (double)dec[i], (double)e_new[i], (double)r, (double)e_old[i], (double)g[i]);
    }
}

/* Over 20 steps of fresh gradients (N(MEAN, 0.01^2), seeds SEED, SEED + 1, ...) with an EF
 * codec, error feedback keeps everything (s_check_conservation). The learning rate is LR0
 * for the first ten steps and LR1 after, so the residual counts LR0/LR1 times at step 10;
 * the state keeps the last one. */
static void s_check_residual_steps(const char *spec, size_t n, uint64_t seed, float mean,
                                   float lr0, float lr1)
{
    mq_codec_t c = s_parse(spec);
    size_t cap;
    cr_assert_eq(mq_codec_state_floats(&c, n), n + 1);
    float *e = s_zeros(n + 1), *old = s_zeros(n + 1), *out = s_zeros(n);
    uint8_t *buf = s_buf(&c, n, &cap);
    for (int t = 0; t < 20; t++) {
        float *g = test_gaussian(n, seed + (uint64_t)t, 0.01f, mean);
        memcpy(old, e, (n + 1) * sizeof *e);
        float lr = t < 10 ? lr0 : lr1;
        size_t len = s_encode(&c, g, n, e, lr, NULL, buf, cap, NULL);
        s_decode(&c, buf, len, out, n);
        s_check_conservation(g, old, e, out, n, t == 10 ? lr0 / lr1 : 1.0f);
        cr_assert_eq(e[n], lr, "%s: the residual's learning rate is kept", spec);
        free(g);
    }
    free(e), free(old), free(out), free(buf);
}

typedef struct {
    const char *spec;
    size_t n, size;
} s_size_case_t;

/* Each case's payload size is what it says, and so is the length of an encode. */
static void s_check_sizes(const s_size_case_t *cases, size_t count)
{
    for (size_t k = 0; k < count; k++) {
        mq_codec_t c = s_parse(cases[k].spec);
        size_t n = cases[k].n, cap;
        cr_assert_eq(mq_codec_payload_size(&c, n), cases[k].size, "%s n=%zu", cases[k].spec, n);
        float *g = test_gaussian(n, k, 1.0f, 0.0f), *e = s_zeros(n + 1);
        uint8_t *buf = s_buf(&c, n, &cap);
        cr_assert_eq(s_encode(&c, g, n, e, 0, NULL, buf, cap, NULL), cases[k].size);
        free(g), free(e), free(buf);
    }
}

/* The payload BUF[0..len) of n values decodes to X (a plain decode writes every value), an
 * accumulating decode with SCALE adds SCALE * X (to Gaussian values, seed YSEED), and both
 * decodes report the encoder's sum of squares ENC, that of X. */
static void s_check_accumulate(const mq_codec_t *c, const uint8_t *buf, size_t len, size_t n,
                               float scale, uint64_t yseed, double enc, const char *what)
{
    float *x = s_zeros(n), *y = test_gaussian(n, yseed, 1.0f, 0.0f), *acc = malloc(n * sizeof(float));
    mq_codec_stats_t sd = {-1}, sa = {-1};
    for (size_t i = 0; i < n; i++)
        x[i] = 12345.0f;
    cr_assert_eq(mq_codec_decode(c, buf, len, x, n, 1.0f, false, &sd), 0);
    memcpy(acc, y, n * sizeof *y);
    cr_assert_eq(mq_codec_decode(c, buf, len, acc, n, scale, true, &sa), 0);
    for (size_t i = 0; i < n; i++) {
        cr_assert(x[i] != 12345.0f, "%s: value %zu not written", what, i);
        cr_assert_eq(acc[i], y[i] + scale * x[i], "%s: value %zu", what, i);
    }
    cr_assert_eq(enc, sd.sq, "%s: encode and decode report the same sum of squares", what);
    cr_assert_eq(sa.sq, sd.sq, "%s: the sum of squares is taken before the decode scale", what);
    cr_assert(s_close(sd.sq, s_sum_sq(x, n), 1e-6), "%s: stats %g, decoded %g", what, sd.sq,
              s_sum_sq(x, n));
    free(x), free(y), free(acc);
}

/* The same for the first payload of an EF codec (zero residual, lr unknown) for Gaussian
 * values (seed GSEED, N(MEAN, 0.5^2)). */
static void s_check_ef_accumulate(const char *spec, size_t n, uint64_t gseed, float mean,
                                  float scale, uint64_t yseed)
{
    mq_codec_t c = s_parse(spec);
    size_t cap;
    float *g = test_gaussian(n, gseed, 0.5f, mean), *e = s_zeros(n + 1);
    uint8_t *buf = s_buf(&c, n, &cap);
    mq_codec_stats_t se = {-1};
    size_t len = s_encode(&c, g, n, e, 0, NULL, buf, cap, &se);
    s_check_accumulate(&c, buf, len, n, scale, yseed, se.sq, spec);
    free(g), free(e), free(buf);
}

/* The first payload of an EF codec for n Gaussian values (seed 3): a buffer of s_buf's,
 * *LEN its length. */
static uint8_t *s_first_payload(const mq_codec_t *c, size_t n, size_t *len)
{
    size_t cap;
    float *g = test_gaussian(n, 3, 1.0f, 0.0f), *e = s_zeros(n + 1);
    uint8_t *buf = s_buf(c, n, &cap);
    *len = s_encode(c, g, n, e, 0, NULL, buf, cap, NULL);
    free(g), free(e);
    return buf;
}

/* BUF[0..len) with the float32 at AT set to V (BITS 0), or else with the byte at AT or-ed
 * with BITS, is refused with a message containing WHY (s_check_bad_payload). */
static void s_check_poked(const mq_codec_t *c, const uint8_t *buf, size_t len, size_t n,
                          size_t at, float v, uint8_t bits, const char *why)
{
    uint8_t *bad = malloc(len);
    cr_assert(bad);
    memcpy(bad, buf, len);
    if (bits)
        bad[at] |= bits;
    else
        s_put_f32(bad + at, v);
    s_check_bad_payload(c, bad, len, n, why);
    free(bad);
}

/* An EF codec's encode after one step (lr 0.1, a nonzero residual) with g[AT] = BAD and lr
 * LR is refused with a message containing WHY, and the residual is kept. */
static void s_check_nonfinite_refused(const char *spec, size_t n, size_t at, float bad, float lr,
                                      const char *why)
{
    mq_codec_t c = s_parse(spec);
    size_t cap, len;
    float *g = test_gaussian(n, 1, 1.0f, 0.0f), *e = s_zeros(n + 1), *keep = s_zeros(n + 1);
    uint8_t *buf = s_buf(&c, n, &cap);
    s_encode(&c, g, n, e, 0.1f, NULL, buf, cap, NULL);
    memcpy(keep, e, (n + 1) * sizeof *e);
    g[at] = bad;
    mq_codec_ctx_t ctx = {.state = e, .lr = lr};
    cr_assert_eq(mq_codec_encode_ctx(&c, g, n, &ctx, buf, cap, &len, NULL), -1);
    cr_assert(strstr(mq_err_last(), why), "%s", mq_err_last());
    cr_assert(memcmp(e, keep, (n + 1) * sizeof *e) == 0, "the residual changed");
    free(g), free(e), free(keep), free(buf);
}

/* A parameter server for EF codecs: P workers with residuals encode their gradients, the
 * server decodes the pushes into their mean, encodes it with the reply codec and a residual
 * of its own; returns max |sum of applied updates - (sum of mean gradients - server residual
 * - mean worker residual)| relative to the size of the sums (0 = nothing lost). */
static double s_ps_ef_loss(const char *spec, size_t n, int P, int T)
{
    mq_codec_t c = s_parse(spec), rc = mq_codec_reply(&c);
    cr_assert(mq_codec_equal(&c, &rc), "%s replies with another codec", spec);
    size_t sf = mq_codec_state_floats(&c, n), cap;
    uint8_t *buf = s_buf(&c, n, &cap);
    float *ew = calloc((size_t)P * sf, sizeof(float)), *es = calloc(sf, sizeof(float));
    float *mean = s_zeros(n), *applied = s_zeros(n);
    double *sum_app = calloc(n, sizeof(double)), *sum_g = calloc(n, sizeof(double));
    cr_assert(ew && es && sum_app && sum_g);
    for (int t = 0; t < T; t++) {
        memset(mean, 0, n * sizeof *mean);
        for (int w = 0; w < P; w++) {
            float *g = test_gaussian(n, 1000u * (uint64_t)t + (uint64_t)w, 0.01f, 0.002f * (float)w);
            size_t len = s_encode(&c, g, n, ew + (size_t)w * sf, 0.1f, NULL, buf, cap, NULL);
            cr_assert_eq(mq_codec_decode(&c, buf, len, mean, n, 1.0f / (float)P, true, NULL), 0);
            for (size_t i = 0; i < n; i++)
                sum_g[i] += (double)g[i] / P;
            free(g);
        }
        size_t len = s_encode(&rc, mean, n, es, 0.1f, NULL, buf, cap, NULL);
        s_decode(&rc, buf, len, applied, n);
        for (size_t i = 0; i < n; i++)
            sum_app[i] += applied[i];
    }
    double worst = 0, size = 0;
    for (size_t i = 0; i < n; i++) {
        double ewm = 0;
        for (int w = 0; w < P; w++)
            ewm += ew[(size_t)w * sf + i] / P;
        double want = sum_g[i] - es[i] - ewm;
        worst = fmax(worst, fabs(sum_app[i] - want));
        size = fmax(size, fabs(sum_g[i]));
    }
    free(buf), free(ew), free(es), free(mean), free(applied), free(sum_app), free(sum_g);
    return worst / size;
}

/* ============================ sign ======================================================= */

Test(codec_sign, spec_parse_format_roundtrip)
{
    s_check_spec("sign", "sign");
    s_check_spec("sign:bucket=0", "sign");
    s_check_spec("sign:bucket=256", "sign:bucket=256");
    s_check_spec("sign:bucket=7", "sign:bucket=7");
    mq_codec_t c = s_parse("sign:bucket=96");
    cr_assert(c.id == MQ_CODEC_ID_sign && c.bits == 0 && c.param[0] == 96);
    const mq_codec_ops_t *ops = mq_codec_ops(&c);
    cr_assert(ops && !ops->unbiased && ops->exact_size && ops->max_bits == 0);
}

Test(codec_sign, bad_specs_refused_with_a_reason)
{
    s_check_bad_spec("sign:4", "unknown option '4'");
    s_check_bad_spec("sign:bucket=-1", "bucket");
    s_check_bad_spec("sign:bucket=", "bucket");
    s_check_bad_spec("sign:bucket=12x", "bucket");
    s_check_bad_spec("sign:bucket=99999999999", "bucket");
    s_check_bad_spec("sign:fast", "unknown option 'fast'");
    cr_assert_eq(mq_codec_validate(&(mq_codec_t){.id = MQ_CODEC_ID_sign, .bits = 3}), -1);
    cr_assert(strstr(mq_err_last(), "no bit-width"), "%s", mq_err_last());
    cr_assert_eq(mq_codec_validate(&(mq_codec_t){.id = MQ_CODEC_ID_sign, .param = {0, 1}}), -1);
    cr_assert(strstr(mq_err_last(), "parameter word 1"), "%s", mq_err_last());
}

/* The first step (zero residual): every value decodes to +-||g_b||_1 / d_b of its bucket,
 * negative exactly where g is. */
Test(codec_sign, scale_is_l1_norm_over_d)
{
    static const char *specs[] = {"sign", "sign:bucket=96", "sign:bucket=1"};
    const size_t n = 1003;
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        mq_codec_t c = s_parse(specs[k]);
        size_t B = c.param[0] ? c.param[0] : n, nb = (n + B - 1) / B, cap;
        float *g = test_gaussian(n, 7 + k, 0.02f, 0.003f), *e = s_zeros(n + 1), *out = s_zeros(n);
        g[5] = 0.0f; /* sign(0) = + */
        uint8_t *buf = s_buf(&c, n, &cap);
        size_t len = s_encode(&c, g, n, e, 0.0f, NULL, buf, cap, NULL);
        cr_assert_eq(len, 4 * nb + (n + 7) / 8);
        s_decode(&c, buf, len, out, n);
        for (size_t b = 0; b < nb; b++) {
            size_t i0 = b * B, i1 = i0 + B < n ? i0 + B : n;
            double l1 = 0;
            for (size_t i = i0; i < i1; i++)
                l1 += fabs(g[i]);
            float s = s_f32(buf + 4 * b);
            cr_assert(s_close(s, l1 / (double)(i1 - i0), 1e-6), "%s bucket %zu: scale %g, L1/d %g",
                      specs[k], b, (double)s, l1 / (double)(i1 - i0));
            double err = 0, sq = 0;
            for (size_t i = i0; i < i1; i++) {
                cr_assert_eq(out[i], g[i] < 0 ? -s : s, "%s value %zu: %g for g = %g", specs[k],
                             i, (double)out[i], (double)g[i]);
                err += ((double)out[i] - g[i]) * ((double)out[i] - g[i]);
                sq += (double)g[i] * g[i];
            }
            /* the squared error of a scaled sign: ||g||^2 - ||g||_1^2 / d */
            double want = sq - l1 * l1 / (double)(i1 - i0);
            cr_assert(fabs(err - want) <= 1e-5 * sq + 1e-12, "%s bucket %zu: error %g, want %g",
                      specs[k], b, err, want);
        }
        free(g), free(e), free(out), free(buf);
    }
}

Test(codec_sign, residual_conservation_over_steps)
{
    static const char *specs[] = {"sign", "sign:bucket=100", "sign:bucket=8"};
    for (size_t k = 0; k < 3; k++)
        s_check_residual_steps(specs[k], 1003, 100, 0.001f, 0.05f, 0.05f);
}

/* Over many steps the updates add up to the gradients, up to the last residual, and that
 * residual stays of the order of one gradient (it does not grow with the steps). */
Test(codec_sign, applied_updates_track_the_gradient_sum)
{
    const size_t n = 300;
    const int T = 400;
    mq_codec_t c = s_parse("sign:bucket=64");
    size_t cap;
    float *e = s_zeros(n + 1), *out = s_zeros(n);
    double *sum_g = calloc(n, sizeof(double)), *sum_x = calloc(n, sizeof(double));
    uint8_t *buf = s_buf(&c, n, &cap);
    double gmax = 0;
    for (int t = 0; t < T; t++) {
        float *g = test_gaussian(n, 5000 + (uint64_t)t, 0.01f, 0.0f);
        for (size_t i = 0; i < n; i++) { /* a steady drift under the noise */
            g[i] += 0.004f * sinf((float)i);
            sum_g[i] += g[i];
            gmax = fmax(gmax, fabs(g[i]));
        }
        s_decode(&c, buf, s_encode(&c, g, n, e, 0.1f, NULL, buf, cap, NULL), out, n);
        for (size_t i = 0; i < n; i++)
            sum_x[i] += out[i];
        free(g);
    }
    for (size_t i = 0; i < n; i++) {
        cr_assert(fabs(sum_x[i] + e[i] - sum_g[i]) <= 1e-4 * gmax * T, "value %zu lost mass", i);
        cr_assert(fabs(e[i]) <= 10 * gmax, "value %zu: residual %g grew (max |g| %g)", i,
                  (double)e[i], gmax);
        /* the mean applied update follows the mean gradient */
        cr_assert(fabs(sum_x[i] - sum_g[i]) / T <= 10 * gmax / T + 1e-9);
    }
    free(e), free(out), free(sum_g), free(sum_x), free(buf);
}

Test(codec_sign, payload_size_is_exact)
{
    static const s_size_case_t cases[] = {
        {"sign", 1, 4 + 1},          {"sign", 8, 4 + 1},
        {"sign", 9, 4 + 2},          {"sign", 1000, 4 + 125},
        {"sign:bucket=96", 1000, 4 * 11 + 125},
        {"sign:bucket=512", 1024, 8 + 128},
        {"sign:bucket=2000", 1000, 4 + 125},
    };
    s_check_sizes(cases, sizeof cases / sizeof cases[0]);
    cr_assert_eq(mq_codec_payload_size(&(mq_codec_t){.id = MQ_CODEC_ID_sign}, 0), 0);
}

Test(codec_sign, bad_payloads_refused_dst_untouched)
{
    const size_t n = 13;
    mq_codec_t c = s_parse("sign:bucket=5");
    size_t len;
    uint8_t *buf = s_first_payload(&c, n, &len);
    cr_assert_eq(len, 12 + 2);
    s_check_bad_payload(&c, buf, len - 1, n, "payload of 13 bytes");
    s_check_bad_payload(&c, buf, len + 1, n, "payload of 15 bytes");
    const float scales[] = {NAN, INFINITY, -1.0f};
    for (size_t k = 0; k < 3; k++)
        s_check_poked(&c, buf, len, n, 4, scales[k], 0, "bucket 1 of 3 has scale");
    s_check_poked(&c, buf, len, n, len - 1, 0, 0x80, "padding bits"); /* value 15 of 13 */
    free(buf);
}

Test(codec_sign, accumulate_scale_and_stats)
{
    s_check_ef_accumulate("sign:bucket=50", 777, 11, 0.1f, 0.25f, 12);
}

Test(codec_sign, nonfinite_input_refused_state_kept)
{
    const size_t n = 100;
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++)
        s_check_nonfinite_refused("sign:bucket=16", n, 77, bad[k], 0.2f, "value 77 of 100");
    mq_codec_t c = s_parse("sign:bucket=16");
    size_t cap, len;
    float *g = test_gaussian(n, 1, 1.0f, 0.0f);
    uint8_t *buf = s_buf(&c, n, &cap);
    cr_assert_eq(mq_codec_encode(&c, g, n, buf, cap, &len, NULL, NULL), -1);
    cr_assert(strstr(mq_err_last(), "needs its state"), "%s", mq_err_last());
    free(g), free(buf);
}

/* When the learning rate changes from lr0 to lr1 the residual counts lr0/lr1 times: it
 * stands for the same change of the parameters. */
Test(codec_sign, learning_rate_change_rescales_the_residual)
{
    const size_t n = 200;
    mq_codec_t c = s_parse("sign:bucket=32");
    size_t cap;
    float *e = s_zeros(n + 1), *old = s_zeros(n + 1), *out = s_zeros(n);
    uint8_t *buf = s_buf(&c, n, &cap);
    float *g1 = test_gaussian(n, 1, 1.0f, 0.0f), *g2 = test_gaussian(n, 2, 1.0f, 0.0f);
    s_encode(&c, g1, n, e, 0.1f, NULL, buf, cap, NULL);
    cr_assert_eq(e[n], 0.1f);
    memcpy(old, e, (n + 1) * sizeof *e);
    s_decode(&c, buf, s_encode(&c, g2, n, e, 0.05f, NULL, buf, cap, NULL), out, n);
    s_check_conservation(g2, old, e, out, n, 2.0f);
    cr_assert_eq(e[n], 0.05f);
    memcpy(old, e, (n + 1) * sizeof *e); /* lr unknown: no rescale, the last lr is kept */
    s_decode(&c, buf, s_encode(&c, g1, n, e, 0.0f, NULL, buf, cap, NULL), out, n);
    s_check_conservation(g1, old, e, out, n, 1.0f);
    cr_assert_eq(e[n], 0.05f);
    free(e), free(old), free(out), free(buf), free(g1), free(g2);
}

/* Error feedback on both sides: what the workers apply adds up to the mean gradient, minus
 * only the residuals still held by the server and the workers. */
Test(codec_sign, server_reply_keeps_its_own_residual)
{
    double loss = s_ps_ef_loss("sign:bucket=64", 515, 4, 50);
    cr_assert(loss <= 1e-5, "relative mass lost %g", loss);
}

/* ============================ onebit ===================================================== */

Test(codec_onebit, spec_parse_format_roundtrip)
{
    s_check_spec("onebit", "onebit");
    s_check_spec("onebit:bucket=512", "onebit");
    s_check_spec("onebit:bucket=0", "onebit:bucket=0");
    s_check_spec("onebit:bucket=64", "onebit:bucket=64");
    mq_codec_t c = s_parse("onebit");
    cr_assert(c.id == MQ_CODEC_ID_onebit && c.bits == 0 && c.param[0] == 512, "default bucket 512");
    cr_assert(mq_codec_ops(&c)->exact_size && !mq_codec_ops(&c)->unbiased);
}

Test(codec_onebit, bad_specs_refused_with_a_reason)
{
    s_check_bad_spec("onebit:1", "unknown option '1'");
    s_check_bad_spec("onebit:bucket=x", "bucket");
    s_check_bad_spec("onebit:bucket=-5", "bucket");
    s_check_bad_spec("onebit:tau=1", "unknown option 'tau=1'");
    cr_assert_eq(mq_codec_validate(&(mq_codec_t){.id = MQ_CODEC_ID_onebit, .param = {8, 0, 0, 3}}),
                 -1);
    cr_assert(strstr(mq_err_last(), "parameter word 3"), "%s", mq_err_last());
}

/* The first step: each value decodes to the mean of its bucket's values on its side of 0. */
Test(codec_onebit, decodes_to_the_two_bucket_means)
{
    const size_t n = 1100; /* buckets of 512, 512 and 76 */
    mq_codec_t c = s_parse("onebit");
    size_t cap;
    float *g = test_gaussian(n, 21, 0.02f, 0.01f), *e = s_zeros(n + 1), *out = s_zeros(n);
    for (size_t i = 1024; i < n; i++) /* the last bucket has no negative value */
        g[i] = fabsf(g[i]);
    g[3] = 0.0f;
    uint8_t *buf = s_buf(&c, n, &cap);
    size_t len = s_encode(&c, g, n, e, 0, NULL, buf, cap, NULL);
    cr_assert_eq(len, 3 * 8 + (n + 7) / 8);
    s_decode(&c, buf, len, out, n);
    for (size_t b = 0; b < 3; b++) {
        size_t i0 = 512 * b, i1 = i0 + 512 < n ? i0 + 512 : n, cn = 0, cp = 0;
        double sn = 0, sp = 0;
        for (size_t i = i0; i < i1; i++) {
            if (g[i] < 0)
                sn += g[i], cn++;
            else
                sp += g[i], cp++;
        }
        double mn = cn ? sn / (double)cn : 0, mp = sp / (double)cp;
        cr_assert(s_close(s_f32(buf + 8 * b), mn, 1e-6), "bucket %zu: lo %g, mean %g", b,
                  (double)s_f32(buf + 8 * b), mn);
        cr_assert(s_close(s_f32(buf + 8 * b + 4), mp, 1e-6), "bucket %zu: hi %g, mean %g", b,
                  (double)s_f32(buf + 8 * b + 4), mp);
        for (size_t i = i0; i < i1; i++)
            cr_assert_eq(out[i], g[i] < 0 ? s_f32(buf + 8 * b) : s_f32(buf + 8 * b + 4),
                         "value %zu", i);
    }
    cr_assert_eq(s_f32(buf + 16), 0.0f, "a side with no value is sent as 0");
    free(g), free(e), free(out), free(buf);
}

/* The two means are the best two values for the split at 0: the error never exceeds the
 * scaled sign's (+-L1/d) on the same buckets. */
Test(codec_onebit, error_never_above_scaled_sign)
{
    const size_t n = 2048;
    mq_codec_t ob = s_parse("onebit:bucket=256"), sg = s_parse("sign:bucket=256");
    size_t cap1, cap2;
    uint8_t *b1 = s_buf(&ob, n, &cap1), *b2 = s_buf(&sg, n, &cap2);
    float *e = s_zeros(n + 1), *x1 = s_zeros(n), *x2 = s_zeros(n);
    for (uint64_t seed = 0; seed < 8; seed++) {
        float *g = test_gaussian(n, seed, 1.0f, (float)seed * 0.2f - 0.7f);
        memset(e, 0, (n + 1) * sizeof *e);
        s_decode(&ob, b1, s_encode(&ob, g, n, e, 0, NULL, b1, cap1, NULL), x1, n);
        memset(e, 0, (n + 1) * sizeof *e);
        s_decode(&sg, b2, s_encode(&sg, g, n, e, 0, NULL, b2, cap2, NULL), x2, n);
        double err1 = 0, err2 = 0;
        for (size_t i = 0; i < n; i++) {
            err1 += ((double)x1[i] - g[i]) * ((double)x1[i] - g[i]);
            err2 += ((double)x2[i] - g[i]) * ((double)x2[i] - g[i]);
        }
        cr_assert(err1 <= err2 * (1 + 1e-9), "seed %llu: onebit %g > sign %g",
                  (unsigned long long)seed, err1, err2);
        free(g);
    }
    free(b1), free(b2), free(e), free(x1), free(x2);
}

Test(codec_onebit, residual_conservation_over_steps)
{
    static const char *specs[] = {"onebit", "onebit:bucket=100", "onebit:bucket=0"};
    for (size_t k = 0; k < 3; k++) /* one change of lr: the residual counts 4 times */
        s_check_residual_steps(specs[k], 1003, 300, -0.002f, 0.1f, 0.025f);
}

Test(codec_onebit, payload_size_is_exact)
{
    static const s_size_case_t cases[] = {
        {"onebit", 1, 8 + 1},
        {"onebit", 512, 8 + 64},
        {"onebit", 513, 16 + 65},
        {"onebit:bucket=0", 100000, 8 + 12500},
        {"onebit:bucket=100", 1003, 8 * 11 + 126},
    };
    s_check_sizes(cases, sizeof cases / sizeof cases[0]);
}

Test(codec_onebit, bad_payloads_refused_dst_untouched)
{
    const size_t n = 21;
    mq_codec_t c = s_parse("onebit:bucket=10");
    size_t len;
    uint8_t *buf = s_first_payload(&c, n, &len);
    cr_assert_eq(len, 24 + 3);
    s_check_bad_payload(&c, buf, len - 1, n, "payload of 26 bytes");
    const struct {
        size_t at;
        float v;
    } pokes[] = {{8, 0.5f}, {12, -0.5f}, {16, NAN}, {20, INFINITY}};
    for (size_t k = 0; k < 4; k++)
        s_check_poked(&c, buf, len, n, pokes[k].at, pokes[k].v, 0, "has means");
    s_check_poked(&c, buf, len, n, len - 1, 0, 0x40, "padding bits");
    free(buf);
}

Test(codec_onebit, accumulate_scale_and_stats)
{
    s_check_ef_accumulate("onebit:bucket=300", 1500, 31, 0.2f, 0.5f, 32);
}

Test(codec_onebit, nonfinite_input_refused_state_kept)
{
    s_check_nonfinite_refused("onebit:bucket=16", 64, 50, NAN, 0, "value 50 of 64 is NaN");
}

Test(codec_onebit, server_reply_keeps_its_own_residual)
{
    double loss = s_ps_ef_loss("onebit:bucket=100", 515, 3, 50);
    cr_assert(loss <= 1e-5, "relative mass lost %g", loss);
}

/* ============================ thresh ===================================================== */

/* What thresh decoded G to must be: exact where |g| >= tau (and g != 0), else 0 or
 * tau*sign(g). Returns the payload size these decisions imply (the smallest format). */
static size_t s_thresh_expected_len(const float *g, const float *x, size_t n, float tau)
{
    size_t E = 0, V = 0, next = 0, D = (n + 3) / 4;
    for (size_t i = 0; i < n; i++) {
        unsigned code;
        if (fabsf(g[i]) >= tau && g[i] != 0.0f) {
            cr_assert_eq(x[i], g[i], "value %zu (|g| >= tau) not exact", i);
            code = 3, E++;
        } else if (x[i] == 0.0f) {
            continue;
        } else {
            cr_assert_eq(x[i], g[i] < 0 ? -tau : tau, "value %zu: %g for g %g, tau %g", i,
                         (double)x[i], (double)g[i], (double)tau);
            code = g[i] < 0 ? 2 : 1;
        }
        uint64_t t = (uint64_t)(i - next) << 2 | code;
        do
            V++;
        while (t >>= 7);
        next = i + 1;
    }
    if (D + 4 * E > 4 * n)
        return 12 + 4 * n;
    return 12 + (V < D ? V : D) + 4 * E;
}

static unsigned s_thresh_format(const uint8_t *buf)
{
    return buf[11] >> 6;
}

Test(codec_thresh, spec_parse_format_roundtrip)
{
    s_check_spec("thresh", "thresh");
    s_check_spec("thresh:k=2", "thresh");
    s_check_spec("thresh:k=3", "thresh:k=3");
    s_check_spec("thresh:k=0.5", "thresh:k=0.5");
    s_check_spec("thresh:tau=0.01", "thresh:tau=0.01");
    s_check_spec("thresh:tau=1e-05", "thresh:tau=1e-05");
    s_check_spec("thresh:tau=0.1234567", "thresh:tau=0.1234567");
    mq_codec_t c = s_parse("thresh:tau=0.25");
    cr_assert_eq(mq_codec_param_f(&c, 0), 0.25f);
    const mq_codec_ops_t *ops = mq_codec_ops(&c);
    cr_assert(ops->unbiased && !ops->exact_size && ops->stochastic && ops->stochastic(&c));
    cr_assert_eq(mq_codec_state_floats(&c, 100), 0);
}

Test(codec_thresh, bad_specs_refused_with_a_reason)
{
    s_check_bad_spec("thresh:tau=0", "tau");
    s_check_bad_spec("thresh:tau=-1", "tau");
    s_check_bad_spec("thresh:tau=nan", "tau");
    s_check_bad_spec("thresh:tau=inf", "tau");
    s_check_bad_spec("thresh:tau=1e39", "tau");
    s_check_bad_spec("thresh:k=0", "k");
    s_check_bad_spec("thresh:k=1000", "k");
    s_check_bad_spec("thresh:k=", "k");
    s_check_bad_spec("thresh:tau=0.1:k=3", "exclude each other");
    s_check_bad_spec("thresh:k=3:tau=0.1", "exclude each other");
    s_check_bad_spec("thresh:2", "unknown option '2'");
    s_check_bad_spec("thresh:ratio=0.1", "unknown option 'ratio=0.1'");
    mq_codec_t c = {.id = MQ_CODEC_ID_thresh};
    mq_codec_set_param_f(&c, 0, 0.1f);
    mq_codec_set_param_f(&c, 1, 3.0f);
    cr_assert_eq(mq_codec_validate(&c), -1);
    cr_assert(strstr(mq_err_last(), "both tau and k"), "%s", mq_err_last());
    c.param[1] = 0;
    mq_codec_set_param_f(&c, 0, -0.1f);
    cr_assert_eq(mq_codec_validate(&c), -1);
    cr_assert(strstr(mq_err_last(), "tau"), "%s", mq_err_last());
}

/* tau defaults to 2 RMS(g); each value decodes to itself (|g| >= tau), 0 or tau*sign(g);
 * the size is that of the smallest format, and within max_size. */
Test(codec_thresh, decisions_and_payload_sizes)
{
    static const struct {
        const char *spec;
        size_t n;
        int kind; /* 0 Gaussian, 1 mostly zero, 2 +-1 */
        unsigned format;
    } cases[] = {
        {"thresh", 10001, 0, 1},         {"thresh", 100000, 1, 0},
        {"thresh:k=1", 1000, 2, 2},      {"thresh:k=0.5", 5003, 0, 1},
        {"thresh:tau=0.15", 4097, 0, 1}, {"thresh:tau=0.5", 4097, 0, 0},
        {"thresh:k=8", 3000, 0, 0},      {"thresh", 1, 0, 9 /* either */},
        {"thresh", 3, 1, 0},             {"thresh:k=0.02", 999, 0, 2},
    };
    mq_rng_t rng;
    mq_rng_seed(&rng, 42);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mq_codec_t c = s_parse(cases[k].spec);
        size_t n = cases[k].n, cap;
        float *g = test_gaussian(n, 50 + k, 0.1f, 0.0f), *x = s_zeros(n);
        for (size_t i = 0; i < n; i++) {
            if (cases[k].kind == 1 && i % 97 != 5)
                g[i] = 0.0f;
            if (cases[k].kind == 2)
                g[i] = i % 3 ? 1.0f : -1.0f;
        }
        uint8_t *buf = s_buf(&c, n, &cap);
        cr_assert_eq(cap, 12 + 4 * n);
        size_t len = s_encode(&c, g, n, NULL, 0, &rng, buf, cap, NULL);
        float tau = s_f32(buf);
        if (c.param[0])
            cr_assert_eq(tau, mq_codec_param_f(&c, 0));
        else {
            double k_ = c.param[1] ? mq_codec_param_f(&c, 1) : 2.0;
            cr_assert(s_close(tau, k_ * sqrt(s_sum_sq(g, n) / (double)n), 1e-6),
                      "%s: tau %g", cases[k].spec, (double)tau);
        }
        s_decode(&c, buf, len, x, n);
        cr_assert_eq(len, s_thresh_expected_len(g, x, n, tau), "%s n=%zu", cases[k].spec, n);
        cr_assert(cases[k].format == 9 || s_thresh_format(buf) == cases[k].format,
                  "%s n=%zu: format %u", cases[k].spec, n, s_thresh_format(buf));
        free(g), free(x), free(buf);
    }
}

/* E[decode] = g, value by value: the mean over 20000 seeds is within 5 standard errors of
 * g, and the mean squared error of each value is |g|(tau - |g|) <= tau^2/4. */
Test(codec_thresh, unbiased_with_error_within_tau_squared_over_four)
{
    const size_t n = 43;
    const int N = 20000;
    mq_codec_t c = s_parse("thresh:tau=1");
    size_t cap;
    float g[43], x[43];
    for (size_t i = 0; i < n; i++) /* -1.18 .. 1.18: exact, stochastic and 0, in any lane */
        g[i] = (float)((int)((i + 21) % 43) - 21) * 0.056f;
    double sum[43] = {0}, sq[43] = {0};
    uint8_t *buf = s_buf(&c, n, &cap);
    mq_rng_t rng;
    mq_rng_seed(&rng, 7);
    for (int t = 0; t < N; t++) {
        s_decode(&c, buf, s_encode(&c, g, n, NULL, 0, &rng, buf, cap, NULL), x, n);
        for (size_t i = 0; i < n; i++) {
            sum[i] += x[i];
            sq[i] += ((double)x[i] - g[i]) * ((double)x[i] - g[i]);
        }
    }
    double total = 0;
    for (size_t i = 0; i < n; i++) {
        double a = fabs(g[i]), var = a < 1.0 ? a * (1.0 - a) : 0.0;
        double mean = sum[i] / N, mse = sq[i] / N;
        cr_assert(fabs(mean - g[i]) <= 5 * sqrt(var / N) + 1e-7, "value %zu: mean %g, g %g", i,
                  mean, (double)g[i]);
        cr_assert(mse <= 0.25 + 1e-12, "value %zu: error %g above tau^2/4", i, mse);
        cr_assert(fabs(mse - var) <= 0.05 * 0.25, "value %zu: error %g, expected %g", i, mse,
                  var);
        total += mse;
    }
    cr_assert(total / n <= 0.25);
    free(buf);
}

/* The server re-thresholds the mean of P pushes with its own generator: still unbiased. */
Test(codec_thresh, server_rethreshold_is_unbiased)
{
    const size_t n = 24;
    const int P = 3, N = 20000;
    mq_codec_t c = s_parse("thresh"), rc = mq_codec_reply(&c);
    cr_assert(mq_codec_equal(&c, &rc), "thresh replies with thresh");
    size_t cap;
    float g[3][24], mean[24], x[24];
    double target[24] = {0}, sum[24] = {0}, sq[24] = {0};
    for (int w = 0; w < P; w++) {
        float *t = test_gaussian(n, 90 + (uint64_t)w, 1.0f, 0.2f);
        memcpy(g[w], t, sizeof g[w]);
        for (size_t i = 0; i < n; i++)
            target[i] += (double)t[i] / P;
        free(t);
    }
    uint8_t *buf = s_buf(&c, n, &cap);
    mq_rng_t wr[3], sr;
    for (int w = 0; w < P; w++)
        mq_rng_seed(&wr[w], 100 + (uint64_t)w);
    mq_rng_seed(&sr, 999);
    for (int t = 0; t < N; t++) {
        memset(mean, 0, sizeof mean);
        for (int w = 0; w < P; w++) {
            size_t len = s_encode(&c, g[w], n, NULL, 0, &wr[w], buf, cap, NULL);
            cr_assert_eq(mq_codec_decode(&c, buf, len, mean, n, 1.0f / P, true, NULL), 0);
        }
        s_decode(&rc, buf, s_encode(&rc, mean, n, NULL, 0, &sr, buf, cap, NULL), x, n);
        for (size_t i = 0; i < n; i++) {
            sum[i] += x[i];
            sq[i] += (double)x[i] * x[i];
        }
    }
    for (size_t i = 0; i < n; i++) {
        double m = sum[i] / N, var = sq[i] / N - m * m;
        cr_assert(fabs(m - target[i]) <= 5 * sqrt(var / N) + 1e-6, "value %zu: mean %g, want %g",
                  i, m, target[i]);
    }
    free(buf);
}

Test(codec_thresh, same_seed_same_payload)
{
    const size_t n = 3000;
    mq_codec_t c = s_parse("thresh");
    size_t cap;
    float *g = test_gaussian(n, 5, 1.0f, 0.0f);
    uint8_t *a = s_buf(&c, n, &cap), *b = s_buf(&c, n, &cap);
    mq_rng_t r1, r2;
    mq_rng_seed(&r1, 77);
    mq_rng_seed(&r2, 77);
    size_t la = s_encode(&c, g, n, NULL, 0, &r1, a, cap, NULL);
    size_t lb = s_encode(&c, g, n, NULL, 0, &r2, b, cap, NULL);
    cr_assert(la == lb && memcmp(a, b, la) == 0, "the same seed gave another payload");
    lb = s_encode(&c, g, n, NULL, 0, &r2, b, cap, NULL);
    cr_assert(la != lb || memcmp(a, b, la) != 0, "the next draw gave the same payload");
    free(g), free(a), free(b);
}

/* A value's draw depends on its index and the seed only: a segment and its prefix decode
 * alike on the prefix, whichever loop (four lanes or one) handled each value. */
Test(codec_thresh, draws_depend_on_index_and_seed_only)
{
    const size_t n = 2051;
    mq_codec_t c = s_parse("thresh:tau=0.3");
    size_t cap;
    float *g = test_gaussian(n, 8, 0.2f, 0.0f), *x = s_zeros(n), *y = s_zeros(n);
    uint8_t *buf = s_buf(&c, n, &cap);
    for (size_t m = n - 4; m <= n; m++) {
        mq_rng_t r1, r2;
        mq_rng_seed(&r1, 5);
        mq_rng_seed(&r2, 5);
        s_decode(&c, buf, s_encode(&c, g, n, NULL, 0, &r1, buf, cap, NULL), x, n);
        s_decode(&c, buf, s_encode(&c, g, m, NULL, 0, &r2, buf, cap, NULL), y, m);
        for (size_t i = 0; i < m; i++)
            cr_assert_eq(x[i], y[i], "value %zu of a %zu-value prefix", i, m);
    }
    free(g), free(x), free(y), free(buf);
}

Test(codec_thresh, accumulate_scale_and_stats_in_every_format)
{
    static const struct {
        const char *spec;
        int kind; /* 0 Gaussian, 1 mostly zero, 2 +-1 */
        unsigned format;
    } cases[] = {{"thresh", 0, 1}, {"thresh", 1, 0}, {"thresh:k=1", 2, 2}};
    const size_t n = 2001;
    mq_rng_t rng;
    mq_rng_seed(&rng, 3);
    for (size_t k = 0; k < 3; k++) {
        mq_codec_t c = s_parse(cases[k].spec);
        size_t cap;
        char what[32];
        float *g = test_gaussian(n, 60 + k, 0.3f, 0.05f);
        for (size_t i = 0; i < n; i++) {
            if (cases[k].kind == 1 && i % 50)
                g[i] = 0.0f;
            if (cases[k].kind == 2)
                g[i] = i % 3 ? 0.5f : -0.5f;
        }
        uint8_t *buf = s_buf(&c, n, &cap);
        mq_codec_stats_t se = {-1};
        size_t len = s_encode(&c, g, n, NULL, 0, &rng, buf, cap, &se);
        cr_assert_eq(s_thresh_format(buf), cases[k].format);
        snprintf(what, sizeof what, "format %u", cases[k].format);
        s_check_accumulate(&c, buf, len, n, 0.5f, 70 + k, se.sq, what);
        free(g), free(buf);
    }
}

Test(codec_thresh, needs_a_generator_and_finite_input)
{
    const size_t n = 50;
    mq_codec_t c = s_parse("thresh");
    size_t cap, len;
    float *g = test_gaussian(n, 1, 1.0f, 0.0f);
    uint8_t *buf = s_buf(&c, n, &cap);
    cr_assert_eq(mq_codec_encode(&c, g, n, buf, cap, &len, NULL, NULL), -1);
    cr_assert(strstr(mq_err_last(), "random generator"), "%s", mq_err_last());
    mq_rng_t rng;
    mq_rng_seed(&rng, 1);
    g[5] = NAN;
    cr_assert_eq(mq_codec_encode(&c, g, n, buf, cap, &len, &rng, NULL), -1);
    cr_assert(strstr(mq_err_last(), "value 5 of 50 is NaN"), "%s", mq_err_last());
    free(g), free(buf);
}

/* A hand-made sparse payload: tau, E, format, then bytes. */
static size_t s_make(uint8_t *p, float tau, uint64_t E, unsigned format, const uint8_t *body,
                     size_t blen)
{
    uint64_t w = E | (uint64_t)format << 62;
    s_put_f32(p, tau);
    for (int k = 0; k < 8; k++)
        p[4 + k] = (uint8_t)(w >> (8 * k));
    memcpy(p + 12, body, blen);
    return 12 + blen;
}

Test(codec_thresh, bad_payloads_refused_dst_untouched)
{
    const size_t n = 10;
    mq_codec_t c = s_parse("thresh");
    uint8_t p[64], body[32];
    size_t len;

    /* a good one first: +tau at 2, exact 1.5 at 7 (gap 4) */
    body[0] = 2 << 2 | 1, body[1] = 4 << 2 | 3;
    s_put_f32(body + 2, 1.5f);
    len = s_make(p, 1.0f, 1, 0, body, 6);
    float out[10];
    cr_assert_eq(mq_codec_decode(&c, p, len, out, n, 1.0f, false, NULL), 0, "%s", mq_err_last());
    cr_assert(out[2] == 1.0f && out[7] == 1.5f && out[0] == 0.0f && out[9] == 0.0f);

    s_check_bad_payload(&c, p, 11, n, "shorter than its 12-byte header");
    s_check_bad_payload(&c, p, 12 + 4 * n + 1, n, "at most");
    len = s_make(p, NAN, 1, 0, body, 6);
    s_check_bad_payload(&c, p, len, n, "threshold nan");
    len = s_make(p, -1.0f, 1, 0, body, 6);
    s_check_bad_payload(&c, p, len, n, "threshold -1");
    len = s_make(p, 1.0f, 1, 3, body, 6);
    s_check_bad_payload(&c, p, len, n, "unknown payload format 3");
    len = s_make(p, 1.0f, 1, 0, body, 5); /* cut: the exact value swallows a varint byte */
    s_check_bad_payload(&c, p, len, n, "0 exact entries but 1 exact values");
    len = s_make(p, 1.0f, 0, 0, body, 2); /* an exact entry, and E says none */
    s_check_bad_payload(&c, p, len, n, "1 exact entries but 0 exact values");
    len = s_make(p, 1.0f, 0, 0, body, 6); /* E = 0 makes the value's bytes entries */
    s_check_bad_payload(&c, p, len, n, "code 0");
    len = s_make(p, 1.0f, 5, 0, body, 6);
    s_check_bad_payload(&c, p, len, n, "do not fit");

    uint8_t idx[] = {10 << 2 | 1}; /* index 10 of 10 */
    len = s_make(p, 1.0f, 0, 0, idx, 1);
    s_check_bad_payload(&c, p, len, n, "index out of range");
    uint8_t idx2[] = {5 << 2 | 1, 4 << 2 | 2}; /* 5, then 10 */
    len = s_make(p, 1.0f, 0, 0, idx2, 2);
    s_check_bad_payload(&c, p, len, n, "entry 1 has an index out of range");
    uint8_t code0[] = {3 << 2};
    len = s_make(p, 1.0f, 0, 0, code0, 1);
    s_check_bad_payload(&c, p, len, n, "code 0");
    uint8_t cut[] = {0x81};
    len = s_make(p, 1.0f, 0, 0, cut, 1);
    s_check_bad_payload(&c, p, len, n, "not a valid varint");
    uint8_t longer[] = {0x81, 0x00}; /* 1 written in two bytes */
    len = s_make(p, 1.0f, 0, 0, longer, 2);
    s_check_bad_payload(&c, p, len, n, "not a valid varint");
    uint8_t wide[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
    len = s_make(p, 1.0f, 0, 0, wide, sizeof wide);
    s_check_bad_payload(&c, p, len, n, "not a valid varint");

    uint8_t small[6] = {0 << 2 | 3};
    s_put_f32(small + 1, 0.5f); /* an "exact" value below tau */
    len = s_make(p, 1.0f, 1, 0, small, 5);
    s_check_bad_payload(&c, p, len, n, "exact value 0 of 1 is 0.5");
    s_put_f32(small + 1, NAN);
    len = s_make(p, 1.0f, 1, 0, small, 5);
    s_check_bad_payload(&c, p, len, n, "exact value 0 of 1 is nan");
    uint8_t tau0[] = {0 << 2 | 1};
    len = s_make(p, 0.0f, 0, 0, tau0, 1);
    s_check_bad_payload(&c, p, len, n, "tau = 0");

    /* dense: 3 code bytes for 10 values */
    uint8_t dense[3 + 4] = {0x01, 0x00, 0x00};
    len = s_make(p, 1.0f, 0, 1, dense, 3);
    cr_assert_eq(mq_codec_decode(&c, p, len, out, n, 1.0f, false, NULL), 0, "%s", mq_err_last());
    cr_assert(out[0] == 1.0f && out[1] == 0.0f);
    dense[2] = 0x10; /* value 10: past the end */
    len = s_make(p, 1.0f, 0, 1, dense, 3);
    s_check_bad_payload(&c, p, len, n, "codes after value 9");
    dense[2] = 0x03; /* an exact code with no exact value */
    len = s_make(p, 1.0f, 0, 1, dense, 3);
    s_check_bad_payload(&c, p, len, n, "1 exact codes but 0 exact values");
    len = s_make(p, 1.0f, 1, 1, dense, 3);
    s_check_bad_payload(&c, p, len, n, "dense payload of 15 bytes");

    /* raw */
    uint8_t raw[40];
    for (size_t i = 0; i < n; i++)
        s_put_f32(raw + 4 * i, i % 2 ? 0.0f : 2.0f);
    len = s_make(p, 1.0f, 0, 2, raw, 40);
    cr_assert_eq(mq_codec_decode(&c, p, len, out, n, 1.0f, false, NULL), 0, "%s", mq_err_last());
    s_put_f32(p + 12 + 4 * 3, INFINITY);
    s_check_bad_payload(&c, p, len, n, "value 3 of 10 is inf");
    len = s_make(p, 1.0f, 0, 2, raw, 36);
    s_check_bad_payload(&c, p, len, n, "raw payload of 48 bytes");

    /* the spec's tau must be the payload's */
    mq_codec_t ct = s_parse("thresh:tau=0.5");
    len = s_make(p, 1.0f, 1, 0, body, 6);
    s_check_bad_payload(&ct, p, len, n, "expected the spec's tau = 0.5");
}
