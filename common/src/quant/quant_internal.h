/* Shared between the quant module's files only (not installed, not part of the public API):
 * what a codec's file needs besides mqgrad/quant.h (vector helpers, byte order, buckets, the
 * finiteness scan, sums of squares, spec helpers), what families of codecs share (the sign
 * bits of sign and onebit, the chunked walks of qsgd and terngrad) and the uniform codec's
 * kernels. The static inline helpers here are for hot loops: the compiler inlines them, and
 * the functions a codec's file hands to them, into that file's code. */
#ifndef MQGRAD_QUANT_INTERNAL_H
#define MQGRAD_QUANT_INTERNAL_H

#include <limits.h>
#include <math.h>
#include <string.h>

#include "mqgrad/quant.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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

typedef uint32_t mq_v4u_t __attribute__((vector_size(16)));
typedef double mq_v2d_t __attribute__((vector_size(16)));

/* For the small helpers of the codecs' inner loops: inlined whatever GCC's size heuristics
 * say, so that a loop built of them keeps its values in registers. */
#define MQ_QUANT_INLINE static inline __attribute__((always_inline))

/* Software prefetch 4 KB ahead of the loops that read a gradient: the hardware prefetcher
 * stops at each 4 KB page, and with buckets the reads come in short bursts (as kernels.c).
 * The address may lie past the tensor: a prefetch never faults, and it is formed as an
 * integer so that no pointer leaves its array. */
#if defined(__SSE2__)
#define MQ_QUANT_PREFETCH_TO(p, hint) _mm_prefetch((const char *)((uintptr_t)(p) + 4096), hint)
#define MQ_QUANT_PREFETCH(p) MQ_QUANT_PREFETCH_TO(p, _MM_HINT_T0)
#else
#define MQ_QUANT_PREFETCH(p) ((void)(p))
#endif

/* Lane-wise min(a, b) and max(a, b) (b where a is NaN): one instruction each with SSE2 (the
 * x86-64 baseline), where generic vectors compare and select. */
MQ_QUANT_INLINE mq_v4f_t mq_v4f_min(mq_v4f_t a, mq_v4f_t b)
{
#if defined(__SSE2__)
    return (mq_v4f_t)_mm_min_ps((__m128)a, (__m128)b);
#else
    return mq_v4f_select(a < b, a, b);
#endif
}

MQ_QUANT_INLINE mq_v4f_t mq_v4f_max(mq_v4f_t a, mq_v4f_t b)
{
#if defined(__SSE2__)
    return (mq_v4f_t)_mm_max_ps((__m128)a, (__m128)b);
#else
    return mq_v4f_select(a > b, a, b);
#endif
}

/* Sixteen codes from 32-bit lanes (each 0..255) to bytes: GCC's generic vectors would
 * convert lane by lane, so SSE2 packs them where it can. */
MQ_QUANT_INLINE void mq_v4i_narrow16(uint8_t *q, const mq_v4i_t k[4])
{
#if defined(__SSE2__)
    __m128i a = _mm_packs_epi32((__m128i)k[0], (__m128i)k[1]);
    __m128i b = _mm_packs_epi32((__m128i)k[2], (__m128i)k[3]);
    _mm_storeu_si128((__m128i *)q, _mm_packus_epi16(a, b));
#else
    for (int j = 0; j < 16; j++)
        q[j] = (uint8_t)k[j / 4][j % 4];
#endif
}

/* Set bits of a word (the baseline x86-64 has no popcnt instruction: __builtin_popcount
 * would be a library call). */
static inline size_t mq_quant_popcount64(uint64_t x)
{
    x -= (x >> 1) & UINT64_C(0x5555555555555555);
    x = (x & UINT64_C(0x3333333333333333)) + ((x >> 2) & UINT64_C(0x3333333333333333));
    x = (x + (x >> 4)) & UINT64_C(0x0f0f0f0f0f0f0f0f);
    return (size_t)((x * UINT64_C(0x0101010101010101)) >> 56);
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

/* Index of the first value of x[0..n) that is NaN or infinite, or n if all are finite.
 * The common all-finite case is one branch-free (vectorizable) pass. */
size_t mq_quant_first_nonfinite(const float *x, size_t n);

/* Same for a + b element-wise (the error-feedback input), without storing the sum. */
size_t mq_quant_first_nonfinite_sum(const float *a, const float *b, size_t n);

/* Refuses a non-finite input: -1 with an error naming WHO, the index and the kind. */
int mq_quant_check_finite(const char *who, const float *x, size_t n);
/* The same for g + r, the input of an error-feedback encode (residual R), without storing
 * the sum: the error names WHO, the index and both values. */
int mq_quant_check_finite_sum(const char *who, const float *g, const float *r, size_t n);

/* Sum of squares of x[0..n) in double (four chains, a fixed order). */
double mq_quant_sum_sq(const float *x, size_t n);

/* ---- payloads of little-endian float32 (none, sparse's dense layout, thresh's raw one) --- */

/* Index of the first non-finite of the n float32 at src, or n: one branch-free pass. */
size_t mq_quant_first_bad_f32(const uint8_t *src, size_t n);
/* dst[i] (+)= scale * the n float32 at src (which may be unaligned). */
void mq_quant_decode_f32(const uint8_t *src, float *dst, size_t n, float scale, bool acc);
/* Sum of squares of the n float32 at src in double, in mq_quant_sum_sq's order: encode and
 * decode take it from the same bytes, so they report the same. */
double mq_quant_sq_f32(const uint8_t *src, size_t n);

/* ---- buckets ---------------------------------------------------------------------------
 * Codecs with a scale per bucket (uniform, qsgd, terngrad, sign, onebit) take N values a
 * bucket, N = 0 for one bucket per tensor; the last bucket may be shorter. */

/* The largest N of "bucket=N": a parameter word, read through a long. */
#define MQ_QUANT_BUCKET_MAX ((long)(UINT32_MAX > LONG_MAX ? LONG_MAX : UINT32_MAX))

/* Buckets of n values (0 for n = 0). */
static inline size_t mq_quant_nbuckets(uint32_t bucket, size_t n)
{
    if (n == 0)
        return 0;
    size_t B = bucket ? bucket : n;
    return n / B + (n % B != 0);
}

/* Values in every bucket but the last: N, or n when N is 0 or n or more. */
static inline size_t mq_quant_bucket_len(uint32_t bucket, size_t n)
{
    return bucket && bucket < n ? bucket : n;
}

/* Where the run of values from I ends: at the end of I's bucket (buckets of B values, the
 * last one cut at N) or at END, whichever comes first. The codecs walk a tensor in chunks
 * of a few KB and each chunk in such runs, so that per-bucket constants stay in registers. */
static inline size_t mq_quant_run_end(size_t i, size_t B, size_t n, size_t end)
{
    size_t b_end = (i / B + 1) * B < n ? (i / B + 1) * B : n;
    return b_end < end ? b_end : end;
}

/* K for the 2^K - 1 levels of K-bit codes (levels >= 1). */
static inline int mq_quant_bits_of(uint32_t levels)
{
    return 32 - __builtin_clz(levels);
}

/* Bytes of n codes of K bits packed densely: ceil(n*K/8), with no overflow for any n. */
static inline size_t mq_quant_code_bytes(size_t n, int K)
{
    return (n / 8) * (size_t)K + ((n % 8) * (size_t)K + 7) / 8;
}

/* The first of the NB float32 scales at src that a payload may not carry (not finite, or
 * with the sign bit set: negative or -0), or NB. */
static inline size_t mq_quant_first_bad_scale(const uint8_t *src, size_t nb)
{
    for (size_t b = 0; b < nb; b++) {
        uint32_t u = mq_get_u32(src + 4 * b);
        if (!mq_f32_bits_finite(u) || (u >> 31))
            return b;
    }
    return nb;
}

/* Past this many bytes of decoded output, a plain decode stores with streaming stores: the
 * output cannot stay in a core's cache anyway, and skipping the read-for-ownership of every
 * line saves a third of the memory traffic. Accumulating decode reads dst: it never
 * streams. Past this many bytes of gradient, error feedback rounding to nearest streams its
 * 8-bit codes (c_uniform.c). */
#define MQ_QUANT_STREAM_BYTES ((size_t)16 << 20)

/* Whether N floats are past MQ_QUANT_STREAM_BYTES. */
static inline bool mq_quant_streams(size_t n)
{
    return n >= MQ_QUANT_STREAM_BYTES / sizeof(float);
}

/* ---- specs -------------------------------------------------------------------------- */

/* Parses the value of a "key=value" codec option as a float in [lo, hi] or an integer in
 * [lo, hi]; the error names the codec and the option. */
int mq_quant_opt_float(const char *codec, const char *opt, const char *val, double lo, double hi,
                       float *out);
int mq_quant_opt_u32(const char *codec, const char *opt, const char *val, long lo, long hi,
                     uint32_t *out);
/* 0 if C's parameter words FIRST.. are 0, else -1 with an error naming the codec and the
 * first word that is set. */
int mq_quant_check_unused(const mq_codec_t *c, int first);
/* The shortest decimal of V with DIGITS to 9 significant digits that reads back to V. */
void mq_quant_format_float(char *buf, size_t len, float v, int digits);

/* Operations for a codec whose one option is "bucket=N" (N in parameter word 0; the others
 * unused): option, format (":bucket=N" unless N is the codec's default) and check. */
int mq_quant_bucket_option(mq_codec_t *c, const char *opt);
void mq_quant_bucket_format(const mq_codec_t *c, char *buf, size_t len);
int mq_quant_bucket_check(const mq_codec_t *c);
/* ops->stochastic of a codec that always draws random numbers. */
bool mq_quant_always_stochastic(const mq_codec_t *c);

/* ---- one bit a value with error feedback (sign, onebit) ---------------------------------
 * State: n + 1 floats, the residual e[0..n) in gradient units, then the learning rate it was
 * last updated at (0: not known). p = g + r e is what is encoded, r the residual's factor.
 * Payload bits: value i is bit i%8 of byte i/8, set when p_i < 0; they run across buckets,
 * so a bucket may start or end inside a byte: its first and last values go one at a time
 * (into zeroed bytes), whole bytes eight at a time. */

/* ops->state_floats of these codecs: n + 1 (0 for n = 0). */
size_t mq_quant_ef_state_floats(const mq_codec_t *c, size_t n);

/* The operations table entries these codecs share: biased (the residual makes up for it
 * over steps), payloads of one size, the one option bucket=N, the state above. Each names
 * its own max_size, encode, validate and decode (and defaults). */
#define MQ_QUANT_EF_SIGN_OPS                                                                       \
    .unbiased = false, .exact_size = true, .option = mq_quant_bucket_option,                       \
    .format = mq_quant_bucket_format, .check = mq_quant_bucket_check,                              \
    .state_floats = mq_quant_ef_state_floats

/* The factor the residual is multiplied by at a step with learning rate LR after one with
 * LR0: lr0 / lr when both are known (finite and > 0), so that it stands for the same change
 * of the parameters (lr0 * e), else 1. */
static inline float mq_quant_lr_ratio(float lr0, float lr)
{
    if (!(lr > 0.0f) || !isfinite(lr) || !(lr0 > 0.0f) || !isfinite(lr0) || lr0 == lr)
        return 1.0f;
    return lr0 / lr;
}

/* Keeps LR as the residual's learning rate when it is known. */
static inline void mq_quant_lr_keep(float *lr0, float lr)
{
    if (lr > 0.0f && isfinite(lr))
        *lr0 = lr;
}

/* Sets the error for the first p_i = g_i + r e_i of m values (values AT.. of N) that is not
 * finite, naming WHO; false if every one is finite. */
bool mq_quant_ef_nonfinite(const char *who, const float *g, const float *e, float r, size_t m,
                           size_t at, size_t n);

static inline void mq_quant_sign_put1(const float *g, float *e, float r, size_t i, float lo,
                                      float hi, uint8_t *bits)
{
    float p = g[i] + r * e[i];
    bool neg = p < 0.0f;
    e[i] = p - (neg ? lo : hi);
    bits[i >> 3] |= (uint8_t)((unsigned)neg << (i & 7));
}

/* Values [i0, i1): p_i < 0 sets bit i and decodes to LO, the others to HI; e_i <- p_i - x^_i.
 * The bytes of values before i0 or from i1 that these share must be zeroed or complete. */
static inline void mq_quant_signs_put(const float *g, float *e, float r, size_t i0, size_t i1,
                                      float lo, float hi, uint8_t *bits)
{
    const mq_v4i_t bit_lo = {1, 2, 4, 8}, bit_hi = {16, 32, 64, 128};
    const mq_v4f_t vr = mq_v4f_set1(r), vlo = mq_v4f_set1(lo), vhi = mq_v4f_set1(hi);
    const mq_v4f_t zero = mq_v4f_set1(0.0f);
    size_t i = i0;
    for (; i < i1 && (i & 7); i++)
        mq_quant_sign_put1(g, e, r, i, lo, hi, bits);
    for (; i + 8 <= i1; i += 8) {
        mq_v4f_t p0 = mq_v4f_load(g + i) + vr * mq_v4f_load(e + i);
        mq_v4f_t p1 = mq_v4f_load(g + i + 4) + vr * mq_v4f_load(e + i + 4);
        mq_v4i_t m0 = p0 < zero, m1 = p1 < zero;
        mq_v4f_t e0 = p0 - mq_v4f_select(m0, vlo, vhi), e1 = p1 - mq_v4f_select(m1, vlo, vhi);
        memcpy(e + i, &e0, sizeof e0);
        memcpy(e + i + 4, &e1, sizeof e1);
        mq_v4i_t w = (m0 & bit_lo) | (m1 & bit_hi);
        bits[i >> 3] = (uint8_t)(w[0] | w[1] | w[2] | w[3]);
    }
    for (; i < i1; i++)
        mq_quant_sign_put1(g, e, r, i, lo, hi, bits);
}

/* dst[i] (+)= bit i ? LO : HI for values [i0, i1). */
static inline void mq_quant_signs_get(const uint8_t *bits, size_t i0, size_t i1, float lo,
                                      float hi, bool acc, float *dst)
{
    const mq_v4i_t bit_lo = {1, 2, 4, 8}, bit_hi = {16, 32, 64, 128};
    const mq_v4f_t vlo = mq_v4f_set1(lo), vhi = mq_v4f_set1(hi);
    const mq_v4i_t zero = {0, 0, 0, 0};
    size_t i = i0;
    for (; i < i1 && (i & 7); i++) {
        float v = (bits[i >> 3] >> (i & 7)) & 1 ? lo : hi;
        dst[i] = acc ? dst[i] + v : v;
    }
    for (; i + 8 <= i1; i += 8) {
        int32_t b = bits[i >> 3];
        mq_v4i_t vb = {b, b, b, b};
        mq_v4f_t v0 = mq_v4f_select((vb & bit_lo) != zero, vlo, vhi);
        mq_v4f_t v1 = mq_v4f_select((vb & bit_hi) != zero, vlo, vhi);
        if (acc) {
            v0 += mq_v4f_load(dst + i);
            v1 += mq_v4f_load(dst + i + 4);
        }
        memcpy(dst + i, &v0, sizeof v0);
        memcpy(dst + i + 4, &v1, sizeof v1);
    }
    for (; i < i1; i++) {
        float v = (bits[i >> 3] >> (i & 7)) & 1 ? lo : hi;
        dst[i] = acc ? dst[i] + v : v;
    }
}

/* What a codec's file tells the walks below. LEVELS: the two values the bits of a bucket
 * decode to, LO for a set bit, read from its header HDR. HEADER: bucket's header at HDR
 * from its D values p = g + r e (values AT.. of N), or -1 with an error (see
 * mq_quant_ef_nonfinite) when a p is not finite. CHECK: 0 if bucket B's header (of NB) is
 * one a payload may carry, else -1 with an error. */
typedef void mq_quant_levels_fn(const uint8_t *hdr, float *lo, float *hi);
typedef int mq_quant_header_fn(const float *g, const float *e, float r, size_t d, size_t at,
                               size_t n, uint8_t *hdr);
typedef int mq_quant_header_check_fn(const uint8_t *hdr, size_t b, size_t nb);

/* Encodes g[0..n) with the residual ctx->state in buckets of BUCKET (mq_quant_nbuckets),
 * whose headers (HDR_BYTES each) start dst and whose bits follow them. Two passes: the
 * first writes every header and nothing to the state, so that a refused encode leaves the
 * residual as it was; the second writes the bits and the new residual. The residual counts
 * mq_quant_lr_ratio times this step, and ctx->lr is kept as its learning rate. */
MQ_QUANT_INLINE int mq_quant_signs_encode(uint32_t bucket, size_t hdr_bytes,
                                          mq_quant_header_fn *header, mq_quant_levels_fn *levels,
                                          const float *g, size_t n, const mq_codec_ctx_t *ctx,
                                          uint8_t *dst)
{
    float *e = ctx->state;
    const float r = mq_quant_lr_ratio(e[n], ctx->lr);
    const size_t B = mq_quant_bucket_len(bucket, n), nb = mq_quant_nbuckets(bucket, n);
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, d = b + 1 < nb ? B : n - i0;
        if (header(g + i0, e + i0, r, d, i0, n, dst + hdr_bytes * b) < 0)
            return -1;
    }
    uint8_t *bits = dst + hdr_bytes * nb;
    memset(bits, 0, n / 8 + (n % 8 != 0));
    for (size_t b = 0; b < nb; b++) {
        float lo, hi;
        levels(dst + hdr_bytes * b, &lo, &hi);
        mq_quant_signs_put(g, e, r, b * B, b + 1 < nb ? b * B + B : n, lo, hi, bits);
    }
    mq_quant_lr_keep(&e[n], ctx->lr);
    return 0;
}

/* 0 if every header of such a payload passes CHECK and the padding bits after the n sign
 * bits are 0, else -1 with an error (WHO names the codec). */
MQ_QUANT_INLINE int mq_quant_signs_validate(uint32_t bucket, size_t hdr_bytes,
                                            mq_quant_header_check_fn *check, const char *who,
                                            const uint8_t *src, size_t len, size_t n)
{
    const size_t nb = mq_quant_nbuckets(bucket, n);
    for (size_t b = 0; b < nb; b++)
        if (check(src + hdr_bytes * b, b, nb) < 0)
            return -1;
    if (n % 8 && src[len - 1] >> (n % 8)) {
        mq_err_set("%s: padding bits after value %zu are set (expected 0)", who, n - 1);
        return -1;
    }
    return 0;
}

/* The decode of such a payload: dst[i] (+)= SCALE times the value bit i picks. */
MQ_QUANT_INLINE void mq_quant_signs_decode(uint32_t bucket, size_t hdr_bytes,
                                           mq_quant_levels_fn *levels, const uint8_t *src,
                                           size_t n, float scale, bool acc, float *dst)
{
    const size_t B = mq_quant_bucket_len(bucket, n), nb = mq_quant_nbuckets(bucket, n);
    const uint8_t *bits = src + hdr_bytes * nb;
    for (size_t b = 0; b < nb; b++) {
        float lo, hi;
        levels(src + hdr_bytes * b, &lo, &hi);
        mq_quant_signs_get(bits, b * B, b + 1 < nb ? b * B + B : n, scale * lo, scale * hi, acc,
                           dst);
    }
}

/* ---- the uniform codec's inner loops (kernels.c), one table per instruction set ---- */

/* Rounding noise for stochastic rounding: eight xoshiro128** generators side by side, each
 * output split into two 16-bit uniforms (kernels.c says which value gets which), seeded from
 * the caller's mq_rng_t at each encode: a payload depends only on that seed, whichever
 * kernels run. */
typedef struct {
    uint32_t s[4][8];
} mq_quant_noise_t;

/* A fresh set of generators from the caller's RNG (qsgd, terngrad and uniform seed theirs at
 * each encode): the payload depends only on its seed. */
void mq_quant_noise_seed(mq_quant_noise_t *g, mq_rng_t *rng);

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
     * NULL; x[i] in [lo, hi] with INV = levels / (hi - lo) rounded to a float (the bucket's
     * range), and inv and the result finite: with NOISE NULL kernels may skip the clamp to
     * TOP, as quantize_ef's may (below). With PK not NULL (top = 2^K - 1 with
     * K < 8; n a multiple of 32) the codes are also packed to PK as pack() lays them out,
     * writing up to 8 bytes past them: a separate pack pass is a burst of arithmetic with no
     * loads, which leaves the memory idle while it runs. */
    void (*quantize)(const float *x, size_t n, float lo, float inv, float top, const float *noise,
                     uint8_t *q, uint8_t *pk);
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
    /* noise(g, u, n) then quantize(x, n, lo, inv, top, u, q, pk), bit for bit and with the
     * same generator steps, without the array u: the stochastic encode's inner loop. */
    void (*quantize_noise)(const float *x, size_t n, float lo, float inv, float top,
                           mq_quant_noise_t *g, uint8_t *q, uint8_t *pk);
    /* Min and max of the float sums a[i] + b[i], n > 0; false if a sum is NaN or infinite
     * (error feedback's range, read without storing the sums). */
    bool (*minmax_sum)(const float *a, const float *b, size_t n, float *lo, float *hi);
    /* dst[i] += src[i]. */
    void (*add)(float *dst, const float *src, size_t n);
    /* One bucket run of error feedback: v = r[i] + g[i] (r[i] itself when G is NULL: in place,
     * the sums formed by the caller), q[i] its code (as quantize, or as
     * quantize_noise when G is not NULL), then r[i] = v + the code's value decoded with D
     * (the bucket's dequantize constants at scale -1): add, quantize and an accumulating
     * dequantize bit for bit, in one walk over the values. PK as quantize's (K from D's
     * levels). Every v[i] lies in [lo, hi] with INV = levels / (hi - lo) rounded to a float
     * (the bucket's range), so with G NULL kernels may skip the clamp to TOP: (v - lo) * inv
     * is at most levels * (1 + 3 * 2^-24) after its three roundings, and with 1/2 added it
     * truncates to at most levels. With noise the clamp acts (at 8 bits the largest noise can
     * make y exactly 256). */
    void (*quantize_ef)(const float *g, float *r, size_t n, float lo, float inv, float top,
                        const mq_quant_deq_t *d, mq_quant_noise_t *gen, uint8_t *q, uint8_t *pk);
    /* quantize_ef(g, r, n, ...), then minmax_sum(na, nb, nn, nlo, nhi) of the next bucket
     * (nn > 0; minmax(na, nn, ...) when NB is NULL, as it is when G is), with the same results:
     * error feedback's walk with buckets, where the next bucket's range is scanned while this
     * one is quantized. */
    bool (*quantize_ef_scan)(const float *g, float *r, size_t n, float lo, float inv, float top,
                             const mq_quant_deq_t *d, mq_quant_noise_t *gen, uint8_t *q,
                             uint8_t *pk, const float *na, const float *nb, size_t nn, float *nlo,
                             float *nhi);
} mq_quant_kernels_t;

/* code_sums keeps 32-bit vector lanes, and the sum of squares in 32 bits too: up to this
 * many codes (< 2^31 / 255^2) neither can overflow. */
#define MQ_QUANT_SUMS_MAX 16384

/* Orders the streaming kernels' stores before what follows (once per decode: a fence
 * waits for every pending line). */
void mq_quant_stream_fence(void);

/* The kernels in use: the fastest this CPU runs, unless mq_quant_use_kernels chose others. */
const mq_quant_kernels_t *mq_quant_kernels(void);

/* For tests and benchmarks: "c", "sse2", "avx2", "avx512", "avx512w" (kernels_x86.h) or NULL
 * (the fastest available). Returns -1 with an error if this build or CPU lacks them. Not meant
 * to be called while another thread encodes or decodes. */
int mq_quant_use_kernels(const char *name);

/* ---- a float32 scale per bucket, then stochastic codes (qsgd, terngrad) ---------------
 * Payload: nb little-endian float32 headers (one a bucket), then n codes of K bits packed
 * densely. Both walk a tensor in chunks of MQ_QUANT_CHUNK values (a multiple of 8, so that
 * each chunk starts on a byte of the code stream) and each chunk in runs of one bucket
 * (mq_quant_run_end); the walks are here, what a header and a code are in each codec's file,
 * as functions these inline. */

#define MQ_QUANT_CHUNK 2048 /* values per pass: codes, noise and output stay in L1 */

/* Bucket B's header at HDR, and its constants into *P, for its D values x (the first at
 * index AT of N); -1 with an error for a bucket the codec refuses. */
typedef int mq_quant_bucket_fn(const mq_codec_t *c, const float *x, size_t d, size_t b,
                               size_t at, size_t n, uint8_t *hdr, void *p);
/* The codes q[0..m) of x[0..m), all in the bucket *P describes, with noise u[0..m); returns
 * their share of the decoded sum of squares when WANT_SQ. */
typedef double mq_quant_codes_fn(const mq_codec_t *c, const void *p, const float *x, size_t m,
                                 const float *u, uint8_t *q, bool want_sq);
/* dst[0..end - i) (+)= SCALE times the values of codes [i, end) of one bucket (header HDR):
 * unpacked codes at Q, or the packed stream CODES; returns their share of the decoded sum of
 * squares (when WANT_SQ). */
typedef double mq_quant_values_fn(const mq_codec_t *c, const uint8_t *hdr, const uint8_t *codes,
                                  const uint8_t *q, size_t i, size_t end, float scale, bool acc,
                                  bool want_sq, float *dst);

/* Encodes src[0..n) in buckets of BUCKET values with K-bit codes into dst: each bucket's
 * header when the walk first reaches it (so that its values are still cached), then its
 * codes with rounding noise from RNG's seed, one byte each, packed a chunk at a time. *P is
 * the current bucket's constants. */
MQ_QUANT_INLINE int mq_quant_scaled_encode(const mq_codec_t *c, uint32_t bucket, int K,
                                           mq_quant_bucket_fn *header, mq_quant_codes_fn *codes,
                                           void *p, const float *src, size_t n, mq_rng_t *rng,
                                           uint8_t *dst, mq_codec_stats_t *stats)
{
    const mq_quant_kernels_t *kn = mq_quant_kernels();
    const size_t B = mq_quant_bucket_len(bucket, n);
    const size_t nb = mq_quant_nbuckets(bucket, n), code_bytes = mq_quant_code_bytes(n, K);
    uint8_t *stream = dst + 4 * nb;
    uint8_t q[MQ_QUANT_CHUNK];
    float noise[MQ_QUANT_CHUNK];
    size_t next_bucket = 0;
    double sq = 0.0;
    mq_quant_noise_t gen;
    mq_quant_noise_seed(&gen, rng);
    for (size_t start = 0; start < n; start += MQ_QUANT_CHUNK) {
        size_t len = n - start < MQ_QUANT_CHUNK ? n - start : MQ_QUANT_CHUNK;
        uint8_t *out = K == 8 ? stream + start : q; /* 8-bit codes need no packing */
        kn->noise(&gen, noise, len);
        for (size_t i = start; i < start + len;) {
            size_t b = i / B, end = mq_quant_run_end(i, B, n, start + len);
            if (b == next_bucket) {
                size_t b0 = b * B, d = mq_quant_run_end(b0, B, n, n) - b0;
                if (header(c, src + b0, d, b, b0, n, dst + 4 * b, p) < 0)
                    return -1;
                next_bucket++;
            }
            sq += codes(c, p, src + i, end - i, noise + (i - start), out + (i - start),
                        stats != NULL);
            i = end;
        }
        if (K < 8) {
            size_t at = start / 8 * (size_t)K;
            kn->pack(q, len, stream + at, code_bytes - at, K);
        }
    }
    if (stats)
        stats->sq = sq;
    return 0;
}

/* Decodes such a payload, bucket run by bucket run; with UNPACK each chunk's codes are first
 * unpacked to a byte each (read in place at K = 8), else Q is NULL. A plain decode past
 * MQ_QUANT_STREAM_BYTES decodes each chunk on the stack and streams it to dst. */
MQ_QUANT_INLINE void mq_quant_scaled_decode(const mq_codec_t *c, uint32_t bucket, int K,
                                            bool unpack, mq_quant_values_fn *values,
                                            const uint8_t *src, size_t n, float scale, bool acc,
                                            float *dst, mq_codec_stats_t *stats)
{
    const mq_quant_kernels_t *kn = mq_quant_kernels();
    const size_t B = mq_quant_bucket_len(bucket, n);
    const size_t nb = mq_quant_nbuckets(bucket, n), code_bytes = mq_quant_code_bytes(n, K);
    const uint8_t *codes = src + 4 * nb;
    const bool stream = !acc && mq_quant_streams(n);
    uint8_t buf[MQ_QUANT_CHUNK];
    float out[MQ_QUANT_CHUNK]; /* when streaming, a chunk is decoded here, then stored */
    double sq = 0.0;
    for (size_t start = 0; start < n; start += MQ_QUANT_CHUNK) {
        size_t len = n - start < MQ_QUANT_CHUNK ? n - start : MQ_QUANT_CHUNK;
        const uint8_t *q = NULL;
        if (unpack && K < 8) {
            size_t at = start / 8 * (size_t)K;
            kn->unpack(codes + at, len, code_bytes - at, buf, K);
            q = buf;
        } else if (unpack) {
            q = codes + start;
        }
        float *to = stream ? out : dst + start;
        for (size_t i = start; i < start + len;) {
            size_t end = mq_quant_run_end(i, B, n, start + len);
            sq += values(c, src + 4 * (i / B), codes, q ? q + (i - start) : NULL, i, end, scale,
                         acc, stats != NULL, to + (i - start));
            i = end;
        }
        if (stream)
            kn->stream(dst + start, out, len * sizeof *dst);
    }
    if (stream)
        mq_quant_stream_fence();
    if (stats)
        stats->sq = sq;
}

#endif
