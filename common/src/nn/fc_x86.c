/* The fully connected layers' three products in float, written for a small batch, with
 * AVX-512 or AVX2 and FMA (whichever the CPU has; fc_kernels.inc is the body, built once per
 * set): y += x w, dw = x^T dy + l2 w, dx = dy w^T, with x (n x in), w (in x out), dy
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
 * of sgemm, nor of the other set: the sums run in another order. mq_fc_kind() says which
 * kernels are used. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "mqgrad/util.h"
#include "nn_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "x86_avx2.h"
#define MQ_FC_X86 1
#else
#define MQ_FC_X86 0
#endif

enum { AHEAD = 2 }; /* tiles ahead whose weights (and, backward, dw) are prefetched */

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

typedef struct {
    const float *xt, *wt;
    float *y, *yp;
    int n, in, out, mp;
} s_fwd_t;

typedef struct {
    const float *xt, *dyp, *wt;
    float *dw, *dx, *part;
    double *ss; /* each block's sum of w^2 */
    int n, in, out, mp;
    float l2;
    bool acc; /* dw += the gradient (mq_fc_fast_backward_l2) */
} s_bwd_t;

/* AVX-512: tiles of 8 x 48 forward, 4 x 48 backward. */
#define FK(name) name##_avx512
#define TGT __attribute__((target("avx512f,fma,prfchw")))
#define VL 16
#define vec_t __m512
#define NV 3
#define MR 8
#define BR 4
static inline __mmask16 s_k16(int left)
{
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}
#define V_LOAD(p) _mm512_load_ps(p)
#define V_STORE(p, v) _mm512_store_ps(p, v)
#define V_LOADN(p, left) _mm512_maskz_loadu_ps(s_k16(left), p)
#define V_STOREN(p, left, v) _mm512_mask_storeu_ps(p, s_k16(left), v)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#include "fc_kernels.inc"
#undef FK
#undef TGT
#undef VL
#undef vec_t
#undef NV
#undef MR
#undef BR
#undef V_LOAD
#undef V_STORE
#undef V_LOADN
#undef V_STOREN
#undef V_FMA
#undef V_MUL
#undef V_SET1
#undef V_ZERO
#undef V_HSUM

/* AVX2: 16 registers, so tiles of 4 x 24 forward and 2 x 24 backward. On an AMD EPYC
 * (family 25) these ran the paper model's fc1 and fc2 products at the sgemm peak there on one
 * thread (bench/README.md); tiles of 6 x 16 and 2 or 3 x 16 were no faster. A masked load
 * or store (VMASKMOVPS) is slow, a store much so on AMD's cores: only a tile at the matrix's
 * right edge takes one. */
#define FK(name) name##_avx2
#define TGT __attribute__((target("avx2,fma,prfchw")))
#define VL 8
#define vec_t __m256
#define NV 3
#define MR 4
#define BR 2
TGT static inline float s_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#define V_LOAD(p) _mm256_load_ps(p)
#define V_STORE(p, v) _mm256_store_ps(p, v)
#define V_LOADN(p, left) mq_load8(p, left)
#define V_STOREN(p, left, v)                                                                       \
    ((left) >= 8 ? _mm256_storeu_ps(p, v) : _mm256_maskstore_ps(p, mq_lanes8(left), v))
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_SET1(x) _mm256_set1_ps(x)
#define V_ZERO() _mm256_setzero_ps()
#define V_HSUM(v) s_hsum8(v)
#include "fc_kernels.inc"
#endif

/* Which kernels run: decided once, the best set the CPU has, or MQGRAD_NN_FC's choice
 * ("blas", "avx2", "avx512"; a set the CPU lacks gives the best below it; any other value is
 * named in a warning and ignored). -1: not yet. */
static int s_use = -1;

static mq_fc_kind_t s_best(mq_fc_kind_t want)
{
#if MQ_FC_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("fma"))
        return MQ_FC_BLAS;
    if (want >= MQ_FC_AVX512 && __builtin_cpu_supports("avx512f"))
        return MQ_FC_AVX512;
    if (want >= MQ_FC_AVX2 && __builtin_cpu_supports("avx2"))
        return MQ_FC_AVX2;
#endif
    (void)want;
    return MQ_FC_BLAS;
}

mq_fc_kind_t mq_fc_kind(void)
{
    int use = __atomic_load_n(&s_use, __ATOMIC_RELAXED);
    if (use < 0) {
        const char *env = getenv("MQGRAD_NN_FC");
        mq_fc_kind_t want = MQ_FC_AVX512;
        if (env && strcmp(env, "blas") == 0)
            want = MQ_FC_BLAS;
        else if (env && strcmp(env, "avx2") == 0)
            want = MQ_FC_AVX2;
        else if (env && *env && strcmp(env, "avx512") != 0)
            mq_log(MQ_LOG_WARN,
                   "MQGRAD_NN_FC=%s is not blas, avx2 or avx512: using the best kernels this "
                   "CPU has",
                   env);
        use = (int)s_best(want);
        __atomic_store_n(&s_use, use, __ATOMIC_RELAXED);
    }
    return (mq_fc_kind_t)use;
}

bool mq_fc_use(mq_fc_kind_t kind)
{
    if (s_best(kind) != kind)
        return false;
    __atomic_store_n(&s_use, (int)kind, __ATOMIC_RELAXED);
    return true;
}

bool mq_fc_fast(void)
{
    return mq_fc_kind() != MQ_FC_BLAS;
}

void mq_fc_fast_forward(const float *x, int n, int in, int out, const float *wt, float *y)
{
#if MQ_FC_X86
    /* narrower than a tile (the logits): too little to stream, sgemm is faster */
    switch (mq_fc_kind()) {
    case MQ_FC_AVX512:
        if (out >= 48 && s_forward_avx512(x, n, in, out, wt, y))
            return;
        break;
    case MQ_FC_AVX2:
        if (out >= 24 && s_forward_avx2(x, n, in, out, wt, y))
            return;
        break;
    case MQ_FC_BLAS:
        break;
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, out, in, 1, x, in, wt, out, 1, y,
                out);
}

double mq_fc_fast_backward_l2(const float *x, const float *dy, int n, int in, int out,
                              const float *wt, float l2, float *dw, float *dx, bool acc)
{
#if MQ_FC_X86
    switch (mq_fc_kind()) {
    case MQ_FC_AVX512:
        return s_backward_l2_avx512(x, dy, n, in, out, wt, l2, dw, dx, acc);
    case MQ_FC_AVX2:
        return s_backward_l2_avx2(x, dy, n, in, out, wt, l2, dw, dx, acc);
    case MQ_FC_BLAS:
        break;
    }
#endif
    (void)x, (void)dy, (void)n, (void)in, (void)out, (void)wt, (void)l2, (void)dw, (void)dx;
    (void)acc;
    return -1;
}
