/* The `sign` codec: EF-signSGD, the scaled sign of the gradient plus the residual, with error
 * feedback. One bit per value and one float per bucket.
 *
 * Method: Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and other
 * Gradient Compression Schemes", ICML 2019 (arXiv 1901.09847): EF-SGD with the scaled sign
 * compressor C(p) = (||p||_1 / d) sign(p), the paper's EF-signSGD:
 *
 *     p = g + e;   delta = (||p||_1 / d) * sign(p);   e <- p - delta
 *
 * d being the number of values in the bucket.
 *
 * Spec: sign[:bucket=N]. No bit-width.
 * Parameter words: param[0] = N, values per bucket (0, the default: one scale for the whole
 * segment, as the paper's d = the dimension); the others are 0.
 * State: n + 1 floats. e[0..n) is the residual, in gradient units; e[n] is the learning rate
 * the residual was last updated at (0: not known).
 * Payload (exactly 4*nb + ceil(n/8) bytes, nb = ceil(n/N) or 1):
 *     nb little-endian float32 scales s_b = ||p_b||_1 / d_b, bucket by bucket;
 *     ceil(n/8) bytes of signs: value i is bit i%8 of byte i/8, 1 = negative (p_i < 0);
 *     the unused high bits of the last byte are 0.
 * Value i of bucket b decodes to -s_b if its bit is set, else +s_b.
 *
 * Choices:
 * - sign(0) is +: one bit cannot say 0, so p_i = 0 (and -0) decodes to +s_b; the residual
 *   keeps the difference, so nothing is lost.
 * - The paper adds gamma*g (gamma the step size) to a residual in parameter units. Here the
 *   caller applies lr * decode, so the residual is kept in gradient units (e / gamma). When
 *   ctx->lr changes from lr0 to lr1 the residual is multiplied by lr0 / lr1 before use: the
 *   parameter-space amount it stands for (lr0 * e) is what the next step applies. With
 *   ctx->lr = 0 nothing is rescaled.
 * - Reply: the same codec. The server encodes the mean of the decoded pushes with a residual
 *   of its own, so error feedback runs on both sides, as in DoubleSqueeze (Tang, Yu, Lian,
 *   Zhang, Liu, ICML 2019). The EF-signSGD paper analyses one worker; sending the server's
 *   mean back through the same 1-bit compressor with its own residual is our choice for a
 *   parameter server.
 * - The L1 norm is summed in float lanes over blocks of S_BLOCK values and the blocks in
 *   double, then divided and rounded to float once.
 * - Two passes: the first computes every scale and writes nothing to the state, so a value
 *   that is not finite refuses the encode with the residual as it was; the second writes the
 *   signs and the new residual. */

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant_internal.h"

#define S_BUCKET(c) ((c)->param[0])
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
    return 4 * s_nbuckets(c, n) + n / 8 + (n % 8 != 0);
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

/* ---- the first pass: scales ------------------------------------------------------------ */

/* Sum of |g_i + r e_i| over m values. Float lanes per block, blocks in double: not finite
 * when a p_i is not, or (|p| near FLT_MAX) when a block overflows; the caller tells them
 * apart and recounts in double. */
static double s_l1(const float *g, const float *e, float r, size_t m)
{
    const mq_v4i_t abs = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX};
    const mq_v4f_t vr = mq_v4f_set1(r);
    double total = 0.0;
    size_t i = 0;
    while (i + 8 <= m) {
        size_t end = m - i > S_BLOCK ? i + S_BLOCK : m;
        mq_v4f_t a0 = mq_v4f_set1(0.0f), a1 = a0;
        for (; i + 8 <= end; i += 8) {
            mq_v4f_t p0 = mq_v4f_load(g + i) + vr * mq_v4f_load(e + i);
            mq_v4f_t p1 = mq_v4f_load(g + i + 4) + vr * mq_v4f_load(e + i + 4);
            a0 += (mq_v4f_t)((mq_v4i_t)p0 & abs);
            a1 += (mq_v4f_t)((mq_v4i_t)p1 & abs);
        }
        mq_v4f_t a = a0 + a1;
        total += ((double)a[0] + a[1]) + ((double)a[2] + a[3]);
    }
    for (; i < m; i++)
        total += fabsf(g[i] + r * e[i]);
    return total;
}

static double s_l1_double(const float *g, const float *e, float r, size_t m)
{
    double total = 0.0;
    for (size_t i = 0; i < m; i++)
        total += fabs((double)(g[i] + r * e[i]));
    return total;
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
            mq_err_set("sign encode: value %zu of %zu is %s (expected finite numbers)", at + i, n,
                       isnan(g[i]) ? "NaN" : "infinite");
        else
            mq_err_set("sign encode: gradient + residual at value %zu of %zu is not finite "
                       "(gradient %g, residual %g, residual factor %g)",
                       at + i, n, (double)g[i], (double)e[i], (double)r);
        return true;
    }
    return false;
}

/* ---- the second pass: sign bits and residual -------------------------------------------
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

/* ---- encode and decode ----------------------------------------------------------------- */

/* Every value decodes to +-s_b: the sum of squares follows from the scales alone. */
static double s_sum_sq(const mq_codec_t *c, const uint8_t *hdr, size_t n)
{
    const size_t B = s_bucket_len(c, n), nb = s_nbuckets(c, n);
    double sq = 0.0;
    for (size_t b = 0; b < nb; b++) {
        double s = mq_get_f32(hdr + 4 * b);
        size_t d = b + 1 < nb ? B : n - b * B;
        sq += (double)d * s * s;
    }
    return sq;
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *out_len, mq_codec_stats_t *stats)
{
    float *e = ctx->state;
    const float r = s_lr_ratio(e, n, ctx->lr);
    const size_t B = s_bucket_len(c, n), nb = s_nbuckets(c, n);
    uint8_t *bits = dst + 4 * nb;

    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, d = b + 1 < nb ? B : n - i0;
        double l1 = s_l1(src + i0, e + i0, r, d);
        if (!isfinite(l1)) {
            if (s_nonfinite_error(src + i0, e + i0, r, d, i0, n))
                return -1;
            l1 = s_l1_double(src + i0, e + i0, r, d); /* a float block overflowed */
        }
        double s = l1 / (double)d;
        mq_put_f32(dst + 4 * b, s > FLT_MAX ? FLT_MAX : (float)s);
    }

    memset(bits, 0, n / 8 + (n % 8 != 0));
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, i1 = b + 1 < nb ? i0 + B : n;
        float s = mq_get_f32(dst + 4 * b);
        s_put_bits(src, e, r, i0, i1, -s, s, bits);
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
        mq_err_set("sign: payload of %zu bytes for %zu values (expected exactly %zu)", len, n,
                   s_max_size(c, n));
        return -1;
    }
    for (size_t b = 0; b < nb; b++) {
        float s = mq_get_f32(src + 4 * b);
        if (!isfinite(s) || !(s >= 0.0f)) {
            mq_err_set("sign decode: bucket %zu of %zu has scale %g (expected a finite number "
                       ">= 0)",
                       b, nb, (double)s);
            return -1;
        }
    }
    if (n % 8 && src[len - 1] >> (n % 8)) {
        mq_err_set("sign decode: padding bits after value %zu are set (expected 0)", n - 1);
        return -1;
    }
    return 0;
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)len;
    const size_t B = s_bucket_len(c, n), nb = s_nbuckets(c, n);
    const uint8_t *bits = src + 4 * nb;
    for (size_t b = 0; b < nb; b++) {
        size_t i0 = b * B, i1 = b + 1 < nb ? i0 + B : n;
        float a = scale * mq_get_f32(src + 4 * b);
        s_get_bits(bits, i0, i1, -a, a, acc, dst);
    }
    if (stats)
        stats->sq = s_sum_sq(c, src, n);
}

/* ---- spec ------------------------------------------------------------------------------ */

static int s_option(mq_codec_t *c, const char *opt)
{
    if (strncmp(opt, "bucket=", 7) == 0)
        return mq_quant_opt_u32("sign", "bucket", opt + 7, 0, S_BUCKET_MAX, &c->param[0]);
    mq_err_set("unknown option '%s' (expected bucket=N)", opt);
    return -1;
}

static void s_format(const mq_codec_t *c, char *buf, size_t len)
{
    if (S_BUCKET(c))
        snprintf(buf, len, ":bucket=%u", (unsigned)S_BUCKET(c));
    else if (len)
        buf[0] = 0;
}

static int s_check(const mq_codec_t *c)
{
    for (int i = 1; i < MQ_CODEC_NPARAMS; i++)
        if (c->param[i]) {
            mq_err_set("codec sign: parameter word %d is set (unused)", i);
            return -1;
        }
    return 0;
}

const mq_codec_ops_t mq_codec_sign_ops = {
    .name = "sign",
    .id = MQ_CODEC_SIGN,
    .usage = "sign[:bucket=N]",
    .help = "EF-signSGD: signs and ||p||_1/d per N values, residual kept (Karimireddy 2019)",
    .unbiased = false, /* biased; the residual makes up for it over steps */
    .exact_size = true,
    .option = s_option,
    .format = s_format,
    .check = s_check,
    .max_size = s_max_size,
    .state_floats = s_state_floats,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
