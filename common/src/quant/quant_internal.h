/* Shared between the quant module's files only (not installed, not part of the public API):
 * what a codec's file needs besides mqgrad/quant.h (byte order, the finiteness scan, sums of
 * squares) and the uniform codec's kernels. */
#ifndef MQGRAD_QUANT_INTERNAL_H
#define MQGRAD_QUANT_INTERNAL_H

#include <string.h>

#include "mqgrad/quant.h"

/* Four-lane vectors (GCC/Clang extensions) for the loops GCC's -O2 will not vectorize on its
 * own: at -O2 it keeps array accumulators in memory and skips selects and widenings. */
typedef float mq_v4f_t __attribute__((vector_size(16)));
typedef int32_t mq_v4i_t __attribute__((vector_size(16)));

static inline mq_v4f_t mq_v4f_load(const float *p)
{
    mq_v4f_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline mq_v4f_t mq_v4f_set1(float x)
{
    return (mq_v4f_t){x, x, x, x};
}

/* Lane-wise m ? a : b for a mask m of all-ones / all-zeros lanes. */
static inline mq_v4f_t mq_v4f_select(mq_v4i_t m, mq_v4f_t a, mq_v4f_t b)
{
    return (mq_v4f_t)(((mq_v4i_t)a & m) | ((mq_v4i_t)b & ~m));
}

/* Largest tensor the codecs accept: keeps n*32 bits and 8*nbuckets inside size_t. */
#define MQ_QUANT_MAX_N (SIZE_MAX / 64)

/* ---- payload bytes: little-endian whatever the host, unaligned ---------------------- */

static inline void mq_put_u32(uint8_t *p, uint32_t u)
{
    p[0] = (uint8_t)u, p[1] = (uint8_t)(u >> 8), p[2] = (uint8_t)(u >> 16), p[3] = (uint8_t)(u >> 24);
}

static inline uint32_t mq_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void mq_put_f32(uint8_t *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    mq_put_u32(p, u);
}

static inline float mq_get_f32(const uint8_t *p)
{
    uint32_t u = mq_get_u32(p);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static inline bool mq_f32_bits_finite(uint32_t u)
{
    return (u & 0x7f800000u) != 0x7f800000u; /* exponent all ones: an infinity or a NaN */
}

/* Refuses a non-finite input: -1 with an error naming WHO, the index and the kind. */
int mq_quant_check_finite(const char *who, const float *x, size_t n);

/* Sum of squares of x[0..n) in double (four chains, a fixed order). */
double mq_quant_sum_sq(const float *x, size_t n);

/* Parses the value of a "key=value" codec option as a float in [lo, hi] or an integer in
 * [lo, hi]; the error names the codec and the option. */
int mq_quant_opt_float(const char *codec, const char *opt, const char *val, double lo, double hi,
                       float *out);
int mq_quant_opt_u32(const char *codec, const char *opt, const char *val, long lo, long hi,
                     uint32_t *out);

/* Index of the first value of x[0..n) that is NaN or infinite, or n if all are finite.
 * The common all-finite case is one branch-free (vectorizable) pass. */
size_t mq_quant_first_nonfinite(const float *x, size_t n);

/* Same for a + b element-wise (the error-feedback input), without storing the sum. */
size_t mq_quant_first_nonfinite_sum(const float *a, const float *b, size_t n);

/* ---- the uniform codec's inner loops (kernels.c), one table per instruction set ---- */

/* Rounding noise for stochastic rounding: eight xoshiro128** generators side by side, each
 * output split into two 16-bit uniforms (kernels.c says which value gets which), seeded from
 * the caller's mq_rng_t at each encode: a payload depends only on that seed, whichever
 * kernels run. */
typedef struct {
    uint32_t s[4][8];
} mq_quant_noise_t;

/* What dequantizing one bucket needs: code q decodes to q == levels ? top : a + q * b. */
typedef struct {
    float a, b, top;
    uint32_t levels;
} mq_quant_deq_t;

/* Sums of codes and of their squares (code_sums). */
typedef struct {
    uint64_t sum, sum_sq;
} mq_quant_sums_t;

typedef struct {
    const char *name;
    /* Min and max of x[0..n), n > 0; false if a value is NaN or infinite. */
    bool (*minmax)(const float *x, size_t n, float *lo, float *hi);
    /* q[i] = trunc(min((x[i] - lo) * inv + r_i, top)), r_i = noise[i] or 0.5 if noise is
     * NULL; x[i] >= lo, and inv and the result finite. */
    void (*quantize)(const float *x, size_t n, float lo, float inv, float top, const float *noise,
                     uint8_t *q);
    /* n uniforms in [0, 1) with 16 random bits each. */
    void (*noise)(mq_quant_noise_t *g, float *u, size_t n);
    /* Packs codes q[0..n) (each < 2^K, K < 8) into ceil(n*K/8) bytes at dst, of which AVAIL
     * bytes are the payload's: nothing past them is written. */
    void (*pack)(const uint8_t *q, size_t n, uint8_t *dst, size_t avail, int K);
    /* The inverse, reading no more than AVAIL bytes from src. */
    void (*unpack)(const uint8_t *src, size_t n, size_t avail, uint8_t *q, int K);
    /* dst[i] (+)= decoded q[i]. */
    void (*dequantize)(const uint8_t *q, size_t n, const mq_quant_deq_t *d, bool acc, float *dst);
    /* Plain dequantize that may use non-temporal stores for dst's whole cache lines. */
    void (*dequantize_stream)(const uint8_t *q, size_t n, const mq_quant_deq_t *d, float *dst);
    /* memcpy that may use non-temporal stores for dst's whole cache lines. Both streaming
     * kernels are to be followed by mq_quant_stream_fence before the caller returns. */
    void (*stream)(void *dst, const void *src, size_t n);
    /* Sums of q[i] and of q[i]^2 over n <= MQ_QUANT_SUMS_MAX codes below 2^K: what a
     * bucket's sum of squared decoded values follows from (mq_codec_stats_t). */
    mq_quant_sums_t (*code_sums)(const uint8_t *q, size_t n, int K);
} mq_quant_kernels_t;

/* code_sums keeps 32-bit vector lanes, and the sum of squares in 32 bits too: up to this
 * many codes (< 2^31 / 255^2) neither can overflow. */
#define MQ_QUANT_SUMS_MAX 16384

/* Orders the streaming kernels' stores before what follows (once per decode: a fence
 * waits for every pending line). */
void mq_quant_stream_fence(void);

/* The kernels in use: the fastest this CPU runs, unless mq_quant_use_kernels chose others. */
const mq_quant_kernels_t *mq_quant_kernels(void);

/* For tests and benchmarks: "c", "sse2", "avx2" or NULL (the fastest available). Returns -1
 * with an error if this build or CPU lacks them. Not meant to be called while another thread
 * encodes or decodes. */
int mq_quant_use_kernels(const char *name);

#endif
