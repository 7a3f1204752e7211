/* The `onebit` codec: 1-bit SGD with error feedback. Each value of gradient + residual sends
 * one bit, whether it is negative; each bucket sends the two values the bits decode to.
 *
 * Method: Seide, Fu, Droppo, Li, Yu, "1-Bit Stochastic Gradient Descent and its Application
 * to Data-Parallel Distributed Training of Speech DNNs", Interspeech 2014: quantize each
 * column of the gradient matrix with threshold 0, reconstruct each side by the value that
 * minimizes the squared error, and carry the quantization error to the next minibatch:
 *
 *     p = g + e;   lo = mean{p_i : p_i < 0},  hi = mean{p_i : p_i >= 0} over the bucket;
 *     x^_i = p_i < 0 ? lo : hi;   e <- p - x^
 *
 * Spec: onebit[:bucket=N]. No bit-width.
 * Parameter words: param[0] = N, values per bucket (the default 512; 0 = one bucket for the
 * whole segment); the others are 0.
 * State: n + 1 floats. e[0..n) is the residual, in gradient units; e[n] is the learning rate
 * the residual was last updated at (0: not known).
 * Payload (exactly 8*nb + ceil(n/8) bytes, nb = ceil(n/N) or 1):
 *     nb pairs of little-endian float32 (lo_b, hi_b), bucket by bucket; lo_b <= 0 <= hi_b,
 *     and a side with no value is sent as 0;
 *     ceil(n/8) bytes of bits: value i is bit i%8 of byte i/8, 1 = negative (decodes to
 *     lo_b), 0 = decodes to hi_b; the unused high bits of the last byte are 0.
 *
 * Choices:
 * - Buckets instead of columns. The paper quantizes per column of each weight matrix (2048
 *   values for its 2048-unit hidden layers). A segment here is a flat slice of a layer whose
 *   shape the codec does not know, and in our row-major layers a column is not contiguous,
 *   so a bucket of N consecutive values stands in for it. N = 512 by default: the size the
 *   uniform codec's runs use (docs/results.md: one range per slice of millions of values
 *   failed there), small enough to follow the scale of the gradient along a layer, and the
 *   two floats cost 1/8 bit per value on top of the 1 bit.
 * - Zero goes to the non-negative side (threshold 0, p >= 0 -> hi), as sign(0) = + does in
 *   the `sign` codec; lo is the mean of the strictly negative values.
 * - The residual is kept in gradient units and rescaled by lr0 / lr1 when ctx->lr changes
 *   from lr0 to lr1, so that it stands for the same parameter-space amount (as in `sign`).
 * - Reply: the same codec. The server quantizes the mean of the decoded pushes with a
 *   residual of its own (error feedback on both sides, as in DoubleSqueeze, Tang et al.,
 *   ICML 2019). The paper exchanges quantized gradients between its data-parallel nodes;
 *   what a parameter server sends back is our choice.
 * - The means are summed in float lanes over blocks of S_BLOCK values, the blocks in double,
 *   and rounded to float once.
 * - Two passes: the first computes every bucket's pair and writes nothing to the state, so a
 *   value that is not finite refuses the encode with the residual as it was; the second
 *   writes the bits and the new residual. */

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant_internal.h"

#define S_BUCKET(c) ((c)->param[0])
#define S_DEFAULT_BUCKET 512u
#define S_BUCKET_MAX ((long)(UINT32_MAX > LONG_MAX ? LONG_MAX : UINT32_MAX))
#define S_BLOCK 512 /* values summed in float lanes before the double total */

static size_t s_nbuckets(const mq_codec_t *c, size_t n)
{
    size_t B = S_BUCKET(c);
    if (n == 0)
        return 0;
    return B == 0 || B >= n ? 1 : n / B + (n % B != 0);
}

static size_t s_bucket_len(const mq_codec_t *c, size_t n)
{
    return S_BUCKET(c) && S_BUCKET(c) < n ? S_BUCKET(c) : n;
}

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    return 8 * s_nbuckets(c, n) + n / 8 + (n % 8 != 0);
}

static size_t s_state_floats(const mq_codec_t *c, size_t n)
{
    (void)c;
    return n ? n + 1 : 0;
}

/* ---- residual and learning rate ------------------------------------------------------ */

/* The factor the residual is multiplied by this step: lr0 / lr1 when both are known. */
static float s_lr_ratio(const float *state, size_t n, float lr)
{
    float lr0 = state[n];
    if (!(lr > 0.0f) || !isfinite(lr) || !(lr0 > 0.0f) || !isfinite(lr0) || lr0 == lr)
        return 1.0f;
    return lr0 / lr;
}

static void s_lr_keep(float *state, size_t n, float lr)
{
    if (lr > 0.0f && isfinite(lr))
        state[n] = lr;
}

/* ---- the first pass: the two means ----------------------------------------------------- */

typedef struct {
    double neg, pos; /* sums of the negative and of the non-negative p_i */
    size_t nneg;     /* how many are negative */
} s_sums_t;

/* Sums of p_i = g_i + r e_i over m values, by side. Float lanes per block, blocks in double:
 * a sum is not finite when a p_i is not, or (|p| near FLT_MAX) when a block overflows; the
 * caller tells them apart and recounts in double. */
static s_sums_t s_sums(const float *g, const float *e, float r, size_t m)
{
    const mq_v4f_t vr = mq_v4f_set1(r), zero = mq_v4f_set1(0.0f);
    s_sums_t t = {0.0, 0.0, 0};
    size_t i = 0;
    while (i + 8 <= m) {
        size_t end = m - i > S_BLOCK ? i + S_BLOCK : m;
        mq_v4f_t n0 = zero, n1 = zero, p0 = zero, p1 = zero;
        mq_v4i_t c0 = {0, 0, 0, 0}, c1 = c0;
        for (; i + 8 <= end; i += 8) {
            mq_v4f_t v0 = mq_v4f_load(g + i) + vr * mq_v4f_load(e + i);
            mq_v4f_t v1 = mq_v4f_load(g + i + 4) + vr * mq_v4f_load(e + i + 4);
            mq_v4i_t m0 = v0 < zero, m1 = v1 < zero;
            n0 += mq_v4f_select(m0, v0, zero);
            n1 += mq_v4f_select(m1, v1, zero);
            p0 += mq_v4f_select(m0, zero, v0);
            p1 += mq_v4f_select(m1, zero, v1);
            c0 -= m0; /* lanes of -1 where negative */
            c1 -= m1;
        }
        mq_v4f_t a = n0 + n1, b = p0 + p1;
        mq_v4i_t c = c0 + c1;
        t.neg += ((double)a[0] + a[1]) + ((double)a[2] + a[3]);
        t.pos += ((double)b[0] + b[1]) + ((double)b[2] + b[3]);
        t.nneg += (size_t)(c[0] + c[1] + c[2] + c[3]);
    }
    for (; i < m; i++) {
        float p = g[i] + r * e[i];
        if (p < 0.0f) {
            t.neg += p;
            t.nneg++;
        } else {
            t.pos += p;
        }
    }
    return t;
}

static s_sums_t s_sums_double(const float *g, const float *e, float r, size_t m)
{
    s_sums_t t = {0.0, 0.0, 0};
    for (size_t i = 0; i < m; i++) {
        float p = g[i] + r * e[i];
        if (p < 0.0f) {
            t.neg += p;
            t.nneg++;
        } else {
            t.pos += p;
        }
    }
    return t;
}

/* Sets the error for the first p_i of g[0..m) (values AT.. of N) that is not finite; false
 * if every one is finite. */
static bool s_nonfinite_error(const float *g, const float *e, float r, size_t m, size_t at,
                              size_t n)
{
    for (size_t i = 0; i < m; i++) {
        if (isfinite(g[i] + r * e[i]))
            continue;
        if (!isfinite(g[i]))
            mq_err_set("onebit encode: value %zu of %zu is %s (expected finite numbers)", at + i,
                       n, isnan(g[i]) ? "NaN" : "infinite");
        else
            mq_err_set("onebit encode: gradient + residual at value %zu of %zu is not finite "
                       "(gradient %g, residual %g, residual factor %g)",
                       at + i, n, (double)g[i], (double)e[i], (double)r);
        return true;
    }
    return false;
}

static float s_mean(double sum, size_t count)
{
    if (count == 0)
        return 0.0f;
    double m = sum / (double)count;
    return m > FLT_MAX ? FLT_MAX : m < -FLT_MAX ? -FLT_MAX : (float)m;
}

/* ---- the second pass: bits and residual -------------------------------------------------
 * Bits run across buckets: a bucket may start or end inside a byte, so its first and last
 * values go one at a time (into zeroed bytes) and whole bytes eight at a time. */

static const mq_v4i_t s_lane_bit_lo = {1, 2, 4, 8};
static const mq_v4i_t s_lane_bit_hi = {16, 32, 64, 128};

static inline void s_put1(const float *g, float *e, float r, size_t i, float lo, float hi,
                          uint8_t *bits)
{
    float p = g[i] + r * e[i];
    bool neg = p < 0.0f;
    e[i] = p - (neg ? lo : hi);
    bits[i >> 3] |= (uint8_t)((unsigned)neg << (i & 7));
}

/* Values [i0, i1): p_i < 0 sets bit i and decodes to LO, the others to HI; e_i <- p_i - x^_i. */
static void s_put_bits(const float *g, float *e, float r, size_t i0, size_t i1, float lo,
                       float hi, uint8_t *bits)
{
    const mq_v4f_t vr = mq_v4f_set1(r), vlo = mq_v4f_set1(lo), vhi = mq_v4f_set1(hi);
    const mq_v4f_t zero = mq_v4f_set1(0.0f);
    size_t i = i0;
    for (; i < i1 && (i & 7); i++)
        s_put1(g, e, r, i, lo, hi, bits);
    for (; i + 8 <= i1; i += 8) {
        mq_v4f_t p0 = mq_v4f_load(g + i) + vr * mq_v4f_load(e + i);
        mq_v4f_t p1 = mq_v4f_load(g + i + 4) + vr * mq_v4f_load(e + i + 4);
        mq_v4i_t m0 = p0 < zero, m1 = p1 < zero;
        mq_v4f_t e0 = p0 - mq_v4f_select(m0, vlo, vhi), e1 = p1 - mq_v4f_select(m1, vlo, vhi);
        memcpy(e + i, &e0, sizeof e0);
        memcpy(e + i + 4, &e1, sizeof e1);
        mq_v4i_t w = (m0 & s_lane_bit_lo) | (m1 & s_lane_bit_hi);
        bits[i >> 3] = (uint8_t)(w[0] | w[1] | w[2] | w[3]);
    }
    for (; i < i1; i++)
        s_put1(g, e, r, i, lo, hi, bits);
}

/* dst[i] (+)= bit i ? LO : HI for values [i0, i1). */
static void s_get_bits(const uint8_t *bits, size_t i0, size_t i1, float lo, float hi, bool acc,
                       float *dst)
{
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
        mq_v4f_t v0 = mq_v4f_select((vb & s_lane_bit_lo) != zero, vlo, vhi);
        mq_v4f_t v1 = mq_v4f_select((vb & s_lane_bit_hi) != zero, vlo, vhi);
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

/* Set bits of a word (the baseline x86-64 has no popcnt instruction: __builtin_popcount
 * would be a library call). */
static inline size_t s_popcount64(uint64_t x)
{
    x -= (x >> 1) & UINT64_C(0x5555555555555555);
    x = (x & UINT64_C(0x3333333333333333)) + ((x >> 2) & UINT64_C(0x3333333333333333));
    x = (x + (x >> 4)) & UINT64_C(0x0f0f0f0f0f0f0f0f);
    return (size_t)((x * UINT64_C(0x0101010101010101)) >> 56);
}

/* Set bits among values [i0, i1). */
static size_t s_count_ones(const uint8_t *bits, size_t i0, size_t i1)
{
    size_t count = 0, i = i0;
    for (; i < i1 && (i & 7); i++)
        count += (bits[i >> 3] >> (i & 7)) & 1;
    for (; i + 64 <= i1; i += 64) {
        uint64_t w;
        memcpy(&w, bits + (i >> 3), 8); /* byte order does not change a population count */
        count += s_popcount64(w);
    }
    for (; i + 8 <= i1; i += 8)
        count += s_popcount64(bits[i >> 3]);
    for (; i < i1; i++)
        count += (bits[i >> 3] >> (i & 7)) & 1;
    return count;
}

/* ---- encode and decode ----------------------------------------------------------------- */

/* The sum of squares of the decoded values: per bucket, the count of each side times the
 * square of its value. Encode and decode both take it from the payload, so they agree. */
static double s_sum_sq(const mq_codec_t *c, const uint8_t *src, size_t n)
{
    const size_t B = s_bucket_len(c, n), nb = s_nbuckets(c, n);
    const uint8_t *bits = src + 8 * nb;
    double sq = 0.0;
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, i1 = b + 1 < nb ? i0 + B : n;
        double lo = mq_get_f32(src + 8 * b), hi = mq_get_f32(src + 8 * b + 4);
        size_t nneg = s_count_ones(bits, i0, i1);
        sq += (double)nneg * lo * lo + (double)(i1 - i0 - nneg) * hi * hi;
    }
    return sq;
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *out_len, mq_codec_stats_t *stats)
{
    float *e = ctx->state;
    const float r = s_lr_ratio(e, n, ctx->lr);
    const size_t B = s_bucket_len(c, n), nb = s_nbuckets(c, n);
    uint8_t *bits = dst + 8 * nb;

    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, d = b + 1 < nb ? B : n - i0;
        s_sums_t t = s_sums(src + i0, e + i0, r, d);
        if (!isfinite(t.neg) || !isfinite(t.pos)) {
            if (s_nonfinite_error(src + i0, e + i0, r, d, i0, n))
                return -1;
            t = s_sums_double(src + i0, e + i0, r, d); /* a float block overflowed */
        }
        mq_put_f32(dst + 8 * b, s_mean(t.neg, t.nneg));
        mq_put_f32(dst + 8 * b + 4, s_mean(t.pos, d - t.nneg));
    }

    memset(bits, 0, n / 8 + (n % 8 != 0));
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, i1 = b + 1 < nb ? i0 + B : n;
        s_put_bits(src, e, r, i0, i1, mq_get_f32(dst + 8 * b), mq_get_f32(dst + 8 * b + 4),
                   bits);
    }
    s_lr_keep(e, n, ctx->lr);
    if (stats)
        stats->sq = s_sum_sq(c, dst, n);
    *out_len = s_max_size(c, n);
    return 0;
}

static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    const size_t nb = s_nbuckets(c, n);
    if (len != s_max_size(c, n)) {
        mq_err_set("onebit: payload of %zu bytes for %zu values (expected exactly %zu)", len, n,
                   s_max_size(c, n));
        return -1;
    }
    for (size_t b = 0; b < nb; b++) {
        float lo = mq_get_f32(src + 8 * b), hi = mq_get_f32(src + 8 * b + 4);
        if (!isfinite(lo) || !isfinite(hi) || !(lo <= 0.0f) || !(hi >= 0.0f)) {
            mq_err_set("onebit decode: bucket %zu of %zu has means (%g, %g) (expected finite "
                       "negative-side <= 0 <= non-negative-side)",
                       b, nb, (double)lo, (double)hi);
            return -1;
        }
    }
    if (n % 8 && src[len - 1] >> (n % 8)) {
        mq_err_set("onebit decode: padding bits after value %zu are set (expected 0)", n - 1);
        return -1;
    }
    return 0;
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)len;
    const size_t B = s_bucket_len(c, n), nb = s_nbuckets(c, n);
    const uint8_t *bits = src + 8 * nb;
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, i1 = b + 1 < nb ? i0 + B : n;
        s_get_bits(bits, i0, i1, scale * mq_get_f32(src + 8 * b),
                   scale * mq_get_f32(src + 8 * b + 4), acc, dst);
    }
    if (stats)
        stats->sq = s_sum_sq(c, src, n);
}

/* ---- spec ------------------------------------------------------------------------------ */

static void s_defaults(mq_codec_t *c)
{
    c->param[0] = S_DEFAULT_BUCKET;
}

static int s_option(mq_codec_t *c, const char *opt)
{
    if (strncmp(opt, "bucket=", 7) == 0)
        return mq_quant_opt_u32("onebit", "bucket", opt + 7, 0, S_BUCKET_MAX, &c->param[0]);
    mq_err_set("unknown option '%s' (expected bucket=N)", opt);
    return -1;
}

static void s_format(const mq_codec_t *c, char *buf, size_t len)
{
    if (S_BUCKET(c) != S_DEFAULT_BUCKET)
        snprintf(buf, len, ":bucket=%u", (unsigned)S_BUCKET(c));
    else if (len)
        buf[0] = 0;
}

static int s_check(const mq_codec_t *c)
{
    for (int i = 1; i < MQ_CODEC_NPARAMS; i++)
        if (c->param[i]) {
            mq_err_set("codec onebit: parameter word %d is set (unused)", i);
            return -1;
        }
    return 0;
}

const mq_codec_ops_t mq_codec_onebit_ops = {
    .name = "onebit",
    .id = MQ_CODEC_ONEBIT,
    .usage = "onebit[:bucket=N]",
    .help = "1-bit SGD: sign bits, mean of each side per N=512 values, residual (Seide 2014)",
    .unbiased = false, /* biased; the residual makes up for it over steps */
    .exact_size = true,
    .defaults = s_defaults,
    .option = s_option,
    .format = s_format,
    .check = s_check,
    .max_size = s_max_size,
    .state_floats = s_state_floats,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
