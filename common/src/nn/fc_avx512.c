/* The fully connected layers' three products in float, written for a small batch and
 * AVX-512: y += x w, dw = x^T dy + l2 w, dx = dy w^T, with x (n x in), w (in x out), dy
 * (n x out) row-major and n a training batch (tens of rows).
 *
 * Why not sgemm: with n = 32 each weight takes part in only n multiply-adds, so the weights'
 * trip from memory is most of the work. OpenBLAS 0.3.21 packs w into a buffer before its
 * kernel reads it, one more pass over 28-35 MB a layer. Here every product streams w once,
 * row-major, in tiles of a few rows by NP columns: the forward holds a tile in registers and
 * adds it into y (kept in column panels in L2); the backward computes a tile of dw (with
 * its share of the L2 term) in registers, then the same rows' columns of dx while the rows
 * are still cached. The small operands (x transposed, dy and y in panels) are rearranged
 * once per call so that every tile reads them as contiguous runs. Measured on the paper
 * model's layers in bench/README.md.
 *
 * Results are deterministic (fixed summation order, on any number of threads) but not those
 * of sgemm: the sums run in another order. mq_fc_fast() says whether these kernels are used. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "nn_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MQ_FC_X86 1
#define AVX512 __attribute__((target("avx512f,fma,prfchw")))
#else
#define MQ_FC_X86 0
#endif

enum {
    NP = 48,   /* a tile's columns: three vectors of 16 */
    MR = 8,    /* forward tiles: weight rows */
    BR = 4,    /* backward tiles: weight rows */
    AHEAD = 2, /* tiles ahead whose weights (and, backward, dw) are prefetched */
};

#if MQ_FC_X86
/* Per-thread scratch, grown when a larger layer comes and kept: x transposed, y or dy in
 * panels, the backward's partial sums of dx and sums of squares. A thread's buffer is freed
 * when the thread ends (a worker computes on a thread of its own). */
static _Thread_local float *s_buf;
static _Thread_local size_t s_cap;
static pthread_key_t s_buf_key;
static pthread_once_t s_buf_once = PTHREAD_ONCE_INIT;

static void s_buf_key_init(void)
{
    pthread_key_create(&s_buf_key, free);
}

static float *s_scratch(size_t floats)
{
    if (floats > s_cap) {
        pthread_once(&s_buf_once, s_buf_key_init);
        free(s_buf);
        size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
        s_buf = aligned_alloc(64, bytes);
        s_cap = s_buf ? bytes / sizeof(float) : 0;
        pthread_setspecific(s_buf_key, s_buf);
    }
    return s_buf;
}

static int s_round(int v, int to)
{
    return (v + to - 1) / to * to;
}

/* xt (rows x mp) = x^T, zero past n columns and past in rows: tiles then need no edge code
 * for the batch. */
static void s_transpose(const float *x, int n, int in, int rows, int mp, float *xt)
{
    memset(xt, 0, sizeof(float) * (size_t)rows * mp);
    for (int m = 0; m < n; m++)
        for (int k = 0; k < in; k++)
            xt[(size_t)k * mp + m] = x[(size_t)m * in + k];
}

static bool s_cpu_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

/* The mask of the valid lanes of the vector starting at column c of out. */
static inline __mmask16 s_mask(int c, int out)
{
    int left = out - c;
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* The tile of ROWS weight rows from R0 by NP columns from C, AHEAD of the one being
 * computed: its weights to read and, with OWN (a constant at each call), its lines of DW to
 * own (PREFETCHW, which the kernels' target has), so that neither waits on memory when its
 * turn comes. fc1 and fc2 backward 10-14 % faster for it, the forward about 6 %, on 1 and 2
 * threads (bench/README.md). */
AVX512 static inline void s_prefetch_tile(const float *wt, float *dw, bool own, int r0, int rows,
                                          int out, int c)
{
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < 3; v++) {
            const size_t at = (size_t)(r0 + i) * out + c + 16 * v;
            _mm_prefetch((const char *)(wt + at), _MM_HINT_T0);
            if (own)
                __builtin_prefetch(dw + at, 1, 3);
        }
}

/* Rows 0..n of a row-major matrix (n x out), columns [c0, c1) (c0 a multiple of NP), to and
 * from column panels of NP ([panel][n][NP], zero past out): what a tile reads as one
 * contiguous run, where the matrix's own rows are out floats apart, a stride that sends them
 * all to the same few L1 sets. */
static inline size_t s_panel_at(int n, int c, int m)
{
    return (size_t)(c / NP) * n * NP + (size_t)m * NP + c % NP;
}

AVX512 static void s_to_panels(const float *src, int n, int out, int c0, int c1, float *pan)
{
    for (int c = c0; c < c1; c += 16)
        for (int m = 0; m < n; m++)
            _mm512_store_ps(pan + s_panel_at(n, c, m),
                            _mm512_maskz_loadu_ps(s_mask(c, out), src + (size_t)m * out + c));
}

AVX512 static void s_from_panels(const float *pan, int n, int out, int c0, int c1, float *dst)
{
    for (int c = c0; c < c1; c += 16)
        for (int m = 0; m < n; m++)
            _mm512_mask_storeu_ps(dst + (size_t)m * out + c, s_mask(c, out),
                                  _mm512_load_ps(pan + s_panel_at(n, c, m)));
}

/* y += x w. The weights stream once, in tiles of MR rows x NP columns held in registers;
 * y waits in panels of NP columns ([panel][n][NP], in L2), and each tile adds its rows'
 * share to every row of its panel. Threads take disjoint runs of panels. */
typedef struct {
    const float *xt, *wt;
    float *y, *yp;
    int n, in, out, mp;
} s_fwd_t;

AVX512 static void s_forward_part(void *arg, int part, int parts)
{
    const s_fwd_t *j = arg;
    const int n = j->n, in = j->in, out = j->out, mp = j->mp;
    int p0, p1;
    mq_nn_share((out + NP - 1) / NP, part, parts, &p0, &p1);
    const int c0 = p0 * NP, c1 = p1 * NP < out ? p1 * NP : out;
    s_to_panels(j->y, n, out, c0, p1 * NP, j->yp);
    for (int r0 = 0; r0 < in; r0 += MR) {
        const int rr = in - r0 < MR ? in - r0 : MR;
        for (int c = c0; c < c1; c += NP) {
            const __mmask16 k0m = s_mask(c, out), k1m = s_mask(c + 16, out),
                            k2m = s_mask(c + 32, out);
            __m512 w[MR][3];
            if (c + AHEAD * NP < c1)
                s_prefetch_tile(j->wt, NULL, false, r0, rr, out, c + AHEAD * NP);
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                const float *wp = j->wt + (size_t)(r0 + (i < rr ? i : 0)) * out + c;
                w[i][0] = _mm512_maskz_loadu_ps(k0m, wp);
                w[i][1] = _mm512_maskz_loadu_ps(k1m, wp + 16);
                w[i][2] = _mm512_maskz_loadu_ps(k2m, wp + 32);
            }
            float *ap = j->yp + (size_t)c * n;
            const float *xp = j->xt + (size_t)r0 * mp;
            for (int m = 0; m < n; m++, ap += NP) {
                __m512 a0 = _mm512_load_ps(ap), a1 = _mm512_load_ps(ap + 16),
                       a2 = _mm512_load_ps(ap + 32);
#pragma GCC unroll 8
                for (int i = 0; i < MR; i++) { /* rows past rr: xt is zero there */
                    const __m512 b = _mm512_set1_ps(xp[(size_t)i * mp + m]);
                    a0 = _mm512_fmadd_ps(w[i][0], b, a0);
                    a1 = _mm512_fmadd_ps(w[i][1], b, a1);
                    a2 = _mm512_fmadd_ps(w[i][2], b, a2);
                }
                _mm512_store_ps(ap, a0);
                _mm512_store_ps(ap + 16, a1);
                _mm512_store_ps(ap + 32, a2);
            }
        }
    }
    s_from_panels(j->yp, n, out, c0, p1 * NP, j->y);
}

/* False, with nothing done, without scratch memory. */
AVX512 static bool s_forward(const float *x, int n, int in, int out, const float *wt, float *y)
{
    const int mp = s_round(n, MR), rows = s_round(in, MR), op = s_round(out, NP);
    const size_t at = (size_t)s_round(rows * mp, 16); /* yp on a 64-byte boundary */
    float *xt = s_scratch(at + (size_t)op * n);
    if (!xt)
        return false;
    s_transpose(x, n, in, rows, mp, xt);
    s_fwd_t job = {xt, wt, y, xt + at, n, in, out, mp};
    mq_nn_parallel(s_forward_part, &job, mq_nn_parts_for((size_t)op / NP, (size_t)in * NP));
    return true;
}

/* One block of BR weight rows, r0..r0+rr: dw's rows = x^T dy + l2 w, and (with_dx) the
 * block's columns of dx = dy w^T, in one walk along the rows. A tile of BR x NP weights is
 * loaded once; it seeds its dw tile (l2 w, and the sum of squares) and, for each row m of
 * dy, takes dy[m]'s NP values into the dw tile's multiply-adds and into the vector partial
 * sums of dx[m][r0..r0+BR] (part, n x BR vectors, in L1). Returns the rows' sum of w^2. */
__attribute__((always_inline)) AVX512 static inline double
s_backward_rows(const float *xt, int mp, const float *dyp, int n, int in, int out, const float *wt,
                float l2, float *dw, float *dx, float *part, int r0, int rr, bool with_dx)
{
    const __m512 c2 = _mm512_set1_ps(l2);
    double ss = 0;
    if (with_dx)
        memset(part, 0, sizeof(float) * 16 * BR * (size_t)n);
    for (int c = 0; c < out; c += NP) {
        const __mmask16 km[3] = {s_mask(c, out), s_mask(c + 16, out), s_mask(c + 32, out)};
        __m512 w[BR][3], a[BR][3], sq = _mm512_setzero_ps();
        if (c + AHEAD * NP < out)
            s_prefetch_tile(wt, dw, true, r0, rr, out, c + AHEAD * NP);
#pragma GCC unroll 8
        for (int i = 0; i < BR; i++) {
            const float *wp = wt + (size_t)(r0 + (i < rr ? i : 0)) * out + c;
#pragma GCC unroll 8
            for (int v = 0; v < 3; v++) {
                w[i][v] = _mm512_maskz_loadu_ps(km[v], wp + 16 * v);
                if (i < rr)
                    sq = _mm512_fmadd_ps(w[i][v], w[i][v], sq);
                a[i][v] = _mm512_mul_ps(c2, w[i][v]);
            }
        }
        const float *dp = dyp + (size_t)c * n, *xp = xt + (size_t)r0 * mp;
        float *tp = part;
        for (int m = 0; m < n; m++, dp += NP, tp += 16 * BR) {
            __m512 d[3];
#pragma GCC unroll 8
            for (int v = 0; v < 3; v++)
                d[v] = _mm512_load_ps(dp + 16 * v);
#pragma GCC unroll 8
            for (int i = 0; i < BR; i++) { /* rows past rr: xt is zero there */
                const __m512 b = _mm512_set1_ps(xp[(size_t)i * mp + m]);
#pragma GCC unroll 8
                for (int v = 0; v < 3; v++)
                    a[i][v] = _mm512_fmadd_ps(b, d[v], a[i][v]);
            }
            if (!with_dx)
                continue;
#pragma GCC unroll 8
            for (int i = 0; i < BR; i++) {
                __m512 t = _mm512_load_ps(tp + 16 * i);
#pragma GCC unroll 8
                for (int v = 0; v < 3; v++)
                    t = _mm512_fmadd_ps(w[i][v], d[v], t);
                _mm512_store_ps(tp + 16 * i, t);
            }
        }
        for (int i = 0; i < rr; i++) {
            float *gp = dw + (size_t)(r0 + i) * out + c;
#pragma GCC unroll 8
            for (int v = 0; v < 3; v++)
                _mm512_mask_storeu_ps(gp + 16 * v, km[v], a[i][v]);
        }
        ss += _mm512_reduce_add_ps(sq);
    }
    if (with_dx)
        for (int m = 0; m < n; m++)
            for (int i = 0; i < rr; i++)
                dx[(size_t)m * in + r0 + i] =
                    _mm512_reduce_add_ps(_mm512_load_ps(part + 16 * (BR * (size_t)m + i)));
    return ss;
}

typedef struct {
    const float *xt, *dyp, *wt;
    float *dw, *dx, *part;
    double *ss; /* each block's sum of w^2 */
    int n, in, out, mp;
    float l2;
} s_bwd_t;

/* Threads take disjoint runs of row blocks, each with its own partial sums of dx. */
AVX512 static void s_backward_part(void *arg, int part, int parts)
{
    const s_bwd_t *j = arg;
    int b0, b1;
    mq_nn_share((j->in + BR - 1) / BR, part, parts, &b0, &b1);
    float *pp = j->part + (size_t)16 * BR * j->n * part;
    for (int b = b0; b < b1; b++) {
        const int r0 = b * BR, rr = j->in - r0 < BR ? j->in - r0 : BR;
        j->ss[b] = j->dx ? s_backward_rows(j->xt, j->mp, j->dyp, j->n, j->in, j->out, j->wt, j->l2,
                                           j->dw, j->dx, pp, r0, rr, true)
                         : s_backward_rows(j->xt, j->mp, j->dyp, j->n, j->in, j->out, j->wt, j->l2,
                                           j->dw, j->dx, pp, r0, rr, false);
    }
}

AVX512 static double s_backward_l2(const float *x, const float *dy, int n, int in, int out,
                                   const float *wt, float l2, float *dw, float *dx)
{
    const int mp = s_round(n, MR), rows = s_round(in, BR), op = s_round(out, NP),
              blocks = rows / BR, parts = mq_nn_parts_for((size_t)blocks, (size_t)BR * out);
    /* xt, dy's panels, each part's partial sums of dx, each block's sum of squares */
    const size_t at = (size_t)s_round(rows * mp, 16), pt = at + (size_t)op * n,
                 st = pt + (size_t)16 * BR * n * parts;
    float *xt = s_scratch(st + 2 * (size_t)blocks);
    if (!xt)
        return -1;
    float *dyp = xt + at;
    s_transpose(x, n, in, rows, mp, xt);
    s_to_panels(dy, n, out, 0, op, dyp);
    s_bwd_t job = {xt, dyp, wt, dw, dx, xt + pt, (double *)(void *)(xt + st), n, in, out, mp, l2};
    mq_nn_parallel(s_backward_part, &job, parts);
    double ss = 0;
    for (int b = 0; b < blocks; b++)
        ss += job.ss[b];
    return 0.5 * (double)l2 * ss;
}
#endif

/* -1 not decided, 0 the library's sgemm, 1 these kernels. */
static int s_use = -1;

bool mq_fc_fast(void)
{
    int use = __atomic_load_n(&s_use, __ATOMIC_RELAXED);
    if (use < 0) {
        const char *env = getenv("MQGRAD_NN_FC");
#if MQ_FC_X86
        use = s_cpu_ok() && !(env && strcmp(env, "blas") == 0);
#else
        use = 0;
        (void)env;
#endif
        __atomic_store_n(&s_use, use, __ATOMIC_RELAXED);
    }
    return use;
}

void mq_fc_fast_forward(const float *x, int n, int in, int out, const float *wt, float *y)
{
#if MQ_FC_X86
    /* narrower than a tile (the logits): too little to stream, sgemm is faster */
    if (mq_fc_fast() && out >= NP && s_forward(x, n, in, out, wt, y))
        return;
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, out, in, 1, x, in, wt, out, 1, y,
                out);
}

double mq_fc_fast_backward_l2(const float *x, const float *dy, int n, int in, int out,
                              const float *wt, float l2, float *dw, float *dx)
{
#if MQ_FC_X86
    if (mq_fc_fast())
        return s_backward_l2(x, dy, n, in, out, wt, l2, dw, dx);
#endif
    (void)x, (void)dy, (void)n, (void)in, (void)out, (void)wt, (void)l2, (void)dw, (void)dx;
    return -1;
}
