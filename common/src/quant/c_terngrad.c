/* The `terngrad` codec: TernGrad's stochastic ternary gradients (W. Wen, C. Xu, F. Yan,
 * C. Wu, Y. Wang, Y. Chen, H. Li, "TernGrad: Ternary Gradients to Reduce Communication in
 * Distributed Deep Learning", NeurIPS 2017). With v one bucket of the gradient,
 *
 *     Q(v_i) = s_t * sgn(v_i) * b_i,   s_t = max_i |v_i|,   b_i ~ Bernoulli(|v_i| / s_t),
 *
 * so E[Q(v)] = v: one scale per bucket and two bits a value. The paper ternarizes layer by
 * layer (a scale per tensor: bucket 0 here) and, to tighten the bound on the gradients its
 * convergence proof needs, clips each value to c * sigma first (c = 2.5 in its experiments).
 * Always stochastic: an encode needs ctx->rng.
 *
 * Spec: terngrad[:bucket=N][:clip=C]. N = 0 (the default) takes one scale per tensor (or per
 * server shard), as the paper; C = 0 (the default) does not clip, C > 0 replaces each value
 * by sgn(v_i) * min(|v_i|, C * sigma) before ternarizing. Takes no bit-width.
 * Parameter words: param[0] = N, param[1] = C as a float32 bit pattern (0 = off, else a
 * finite C in (0, S_CLIP_MAX]); the others are 0.
 * Payload: ceil(n/N) little-endian float32 scales (s_t of each bucket, after clipping), then
 * n 2-bit codes packed least-significant-bit first (value i at bits 2i, 2i+1 of the code
 * stream): 0 = 0, 1 = +s_t, 2 = -s_t; 3 is never written and refused. Exactly
 * 4*ceil(n/N) + ceil(n/4) bytes.
 *
 * Where this file chose:
 * - Clipping is off unless asked for. Clipped, the codec sends an unbiased estimate of the
 *   clipped gradient, not of the gradient: E[Q(v)] != v wherever a value was clipped. Off,
 *   the codec is the estimator the paper's analysis is about and that the codec table
 *   declares (ops->unbiased), and it changes nothing but the quantization when compared with
 *   the other codecs. terngrad:clip=2.5 gives the paper's training setup.
 * - sigma is the root mean square of the bucket (its standard deviation about 0). The paper
 *   takes the standard deviation of a gradient it models as zero-mean, where the two agree;
 *   about the mean, a bucket whose values share a sign and nearly a size (a bias gradient,
 *   a bucket of one value) would have sigma ~ 0 and be clipped to nothing. About 0 at most
 *   1/C^2 of a bucket's values can be clipped, and never a nonzero bucket to 0.
 * - Rounding noise is 16 random bits a value (the uniform codec's generators, seeded from
 *   ctx->rng): P(b_i = 1) is within 2^-16 of |v_i| / s_t. 1 / s_t is rounded up until
 *   s_t * it >= 1 in float, so a value at s_t (the largest, every clipped one) is sent for
 *   certain. A scale below 1 / FLT_MAX (denormals) goes through double.
 * Work goes in chunks of MQ_QUANT_CHUNK values (a multiple of 8, so each starts on a byte of the
 * code stream): codes are made one byte each in L1, then packed four to a byte; decoding
 * takes a byte of four codes at a time through a constant table. */

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant_internal.h"

#define S_BUCKET(c) ((c)->param[0])
#define S_CLIP_MAX 1000.0 /* beyond a few tens of sigma nothing is clipped anyway */

static float s_clip(const mq_codec_t *c)
{
    return mq_codec_param_f(c, 1);
}

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    return 4 * mq_quant_nbuckets(S_BUCKET(c), n) + mq_quant_code_bytes(n, 2);
}

/* ---- encoding ------------------------------------------------------------------------ */

/* Eight floats (two vectors) as four vectors of two doubles: two instructions per vector
 * with SSE2, where generic vectors go value by value. */
MQ_QUANT_INLINE void s_to_double8(mq_v4f_t a, mq_v4f_t b, mq_v2d_t d[4])
{
#if defined(__SSE2__)
    d[0] = (mq_v2d_t)_mm_cvtps_pd((__m128)a);
    d[1] = (mq_v2d_t)_mm_cvtps_pd(_mm_movehl_ps((__m128)a, (__m128)a));
    d[2] = (mq_v2d_t)_mm_cvtps_pd((__m128)b);
    d[3] = (mq_v2d_t)_mm_cvtps_pd(_mm_movehl_ps((__m128)b, (__m128)b));
#else
    for (int k = 0; k < 2; k++) {
        d[k] = (mq_v2d_t){a[2 * k], a[2 * k + 1]};
        d[2 + k] = (mq_v2d_t){b[2 * k], b[2 * k + 1]};
    }
#endif
}

/* max |x_i| of x[0..n), and false if a value is NaN or infinite (v - v sums to NaN then).
 * With SS, also the sum of squares in double (for clipping), in the same pass. */
static bool s_scan(const float *x, size_t n, float *max, double *ss)
{
    const mq_v4u_t absm = {0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu};
    mq_v4f_t m0 = mq_v4f_set1(0.0f), m1 = m0, bad = m0;
    mq_v2d_t a0 = {0, 0}, a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        MQ_QUANT_PREFETCH(x + i);
        mq_v4u_t u0, u1;
        memcpy(&u0, x + i, sizeof u0);
        memcpy(&u1, x + i + 4, sizeof u1);
        mq_v4f_t a = (mq_v4f_t)(u0 & absm), b = (mq_v4f_t)(u1 & absm);
        m0 = mq_v4f_max(a, m0); /* a NaN leaves m as it was; BAD catches it */
        m1 = mq_v4f_max(b, m1);
        bad += (a - a) + (b - b);
        if (ss) {
            mq_v2d_t d[4];
            s_to_double8(a, b, d);
            a0 += d[0] * d[0];
            a1 += d[1] * d[1];
            a2 += d[2] * d[2];
            a3 += d[3] * d[3];
        }
    }
    m0 = mq_v4f_select(m1 > m0, m1, m0);
    float m = m0[0] > m0[1] ? m0[0] : m0[1], m2 = m0[2] > m0[3] ? m0[2] : m0[3], tail = 0.0f;
    m = m > m2 ? m : m2;
    mq_v2d_t sum = (a0 + a1) + (a2 + a3);
    double sq = sum[0] + sum[1];
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        m = a > m ? a : m;
        tail += a - a;
        sq += (double)x[i] * x[i];
    }
    *max = m;
    if (ss)
        *ss = sq;
    return tail == 0.0f && bad[0] == 0.0f && bad[1] == 0.0f && bad[2] == 0.0f && bad[3] == 0.0f;
}

/* What ternarizing one bucket needs. */
typedef struct {
    float scale;  /* s_t, also the clipping threshold (>= every |v_i| without clipping) */
    float inv;    /* 1 / s_t rounded up until s_t * inv >= 1 in float (0: a zero bucket) */
    double inv_d; /* 1 / s_t in double, used when it does not fit a float */
    bool tiny;    /* s_t < 1 / FLT_MAX */
} s_bucket_t;

/* Scale of bucket b (values x[0..n), the first at index AT of TOTAL) into its header word
 * and *p; -1 with an error on a value that is not finite. */
static int s_bucket_scale(const mq_codec_t *c, const float *x, size_t n, size_t b, size_t at,
                          size_t total, uint8_t *hdr, void *bucket)
{
    (void)b;
    s_bucket_t *p = bucket;
    const bool clip = s_clip(c) > 0.0f;
    float m;
    double ss = 0.0;
    if (!s_scan(x, n, &m, clip ? &ss : NULL)) {
        size_t bad = mq_quant_first_nonfinite(x, n);
        mq_err_set("terngrad encode: value %zu of %zu is %s (expected finite numbers)",
                   at + bad, total, isnan(x[bad]) ? "NaN" : "infinite");
        return -1;
    }
    if (clip) {
        double thr = s_clip(c) * sqrt(ss / (double)n);
        if (thr < m) /* rounded up: the threshold is never below C * sigma */
            m = (float)thr < thr ? nextafterf((float)thr, INFINITY) : (float)thr;
    }
    mq_put_f32(hdr, m);
    *p = (s_bucket_t){.scale = m, .inv_d = m > 0.0f ? 1.0 / m : 0.0};
    p->tiny = p->inv_d > FLT_MAX;
    if (!p->tiny && m > 0.0f) {
        /* A value at s_t (the largest, and every clipped one) then has b = 1 for certain:
         * the clamp catches it whatever the noise. Rounding inv up moves a probability by at
         * most 2^-24. */
        p->inv = (float)p->inv_d;
        while (m * p->inv < 1.0f)
            p->inv = nextafterf(p->inv, INFINITY);
    }
    return 0;
}

/* Codes of x[0..n), one bucket's, into q with noise u; returns how many are nonzero (when
 * WANT_NZ). b = trunc(min(min(|x|, s_t) * inv + u, 1)) is 1 with probability |x| / s_t
 * (clipped), and for certain at s_t; code = b + (b & sign) gives 0, 1 or 2. The vector loop
 * and the scalar tail do the same float operations. */
MQ_QUANT_INLINE double s_ternarize_k(const float *x, size_t n, const s_bucket_t *p, const float *u,
                              uint8_t *q, const bool want_nz)
{
    const mq_v4f_t thr = mq_v4f_set1(p->scale), inv = mq_v4f_set1(p->inv),
                   one = mq_v4f_set1(1.0f);
    const mq_v4u_t absm = {0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu};
    mq_v4i_t cnt = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mq_v4i_t k[4];
        MQ_QUANT_PREFETCH(x + i);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            mq_v4u_t bits;
            memcpy(&bits, x + i + 4 * j, sizeof bits);
            mq_v4f_t a = mq_v4f_min((mq_v4f_t)(bits & absm), thr);
            mq_v4f_t y = mq_v4f_min(a * inv + mq_v4f_load(u + i + 4 * j), one);
            mq_v4i_t b = __builtin_convertvector(y, mq_v4i_t);
            if (want_nz)
                cnt += b;
            k[j] = b + (b & (mq_v4i_t)(bits >> 31));
        }
        mq_v4i_narrow16(q + i, k);
    }
    double nz = want_nz ? ((double)cnt[0] + cnt[1]) + ((double)cnt[2] + cnt[3]) : 0.0;
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        a = a < p->scale ? a : p->scale;
        float y = a * p->inv + u[i];
        int b = (int)(y < 1.0f ? y : 1.0f);
        q[i] = (uint8_t)(b + (b & (signbit(x[i]) != 0)));
        nz += b;
    }
    return nz;
}

/* The same for a bucket whose 1 / s_t is beyond float (s_t in the denormals). */
static double s_ternarize_tiny(const float *x, size_t n, const s_bucket_t *p, const float *u,
                               uint8_t *q)
{
    double nz = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a = fabs((double)x[i]);
        int b = a >= p->scale || a * p->inv_d + u[i] >= 1.0;
        q[i] = (uint8_t)(b + (b & (signbit(x[i]) != 0)));
        nz += b;
    }
    return nz;
}

/* A run of one bucket's codes; returns its share of the decoded sum of squares. */
static double s_ternarize(const mq_codec_t *c, const void *bucket, const float *x, size_t n,
                          const float *u, uint8_t *q, bool want_nz)
{
    (void)c;
    const s_bucket_t *p = bucket;
    double nz = p->tiny    ? s_ternarize_tiny(x, n, p, u, q)
                : want_nz ? s_ternarize_k(x, n, p, u, q, true)
                          : s_ternarize_k(x, n, p, u, q, false);
    return (double)p->scale * p->scale * nz;
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *out_len, mq_codec_stats_t *stats)
{
    s_bucket_t p = {0};
    if (mq_quant_scaled_encode(c, S_BUCKET(c), 2, s_bucket_scale, s_ternarize, &p, src, n,
                               ctx->rng, dst, stats) < 0)
        return -1;
    *out_len = s_max_size(c, n);
    return 0;
}

/* ---- decoding ------------------------------------------------------------------------ */

/* A byte of four codes as four unit values (0, +1, -1; code 3 never reaches a decode) and
 * how many of them are nonzero: decoding is a table load and a multiply per four values,
 * with no unpacking. Built by the preprocessor, so it is constant data. */
#define S_U(c) ((c) == 1 ? 1.0f : (c) == 2 ? -1.0f : 0.0f)
#define S_ROW(b) {S_U((b) & 3), S_U(((b) >> 2) & 3), S_U(((b) >> 4) & 3), S_U(((b) >> 6) & 3)}
#define S_ROW4(b) S_ROW(b), S_ROW((b) + 1), S_ROW((b) + 2), S_ROW((b) + 3)
#define S_ROW16(b) S_ROW4(b), S_ROW4((b) + 4), S_ROW4((b) + 8), S_ROW4((b) + 12)
#define S_ROW64(b) S_ROW16(b), S_ROW16((b) + 16), S_ROW16((b) + 32), S_ROW16((b) + 48)
static const float s_unit[256][4] = {S_ROW64(0), S_ROW64(64), S_ROW64(128), S_ROW64(192)};
#define S_NZ(c) ((c) == 1 || (c) == 2)
#define S_CNT(b) (S_NZ((b) & 3) + S_NZ(((b) >> 2) & 3) + S_NZ(((b) >> 4) & 3) + S_NZ(((b) >> 6) & 3))
#define S_CNT4(b) S_CNT(b), S_CNT((b) + 1), S_CNT((b) + 2), S_CNT((b) + 3)
#define S_CNT16(b) S_CNT4(b), S_CNT4((b) + 4), S_CNT4((b) + 8), S_CNT4((b) + 12)
#define S_CNT64(b) S_CNT16(b), S_CNT16((b) + 16), S_CNT16((b) + 32), S_CNT16((b) + 48)
static const uint8_t s_nonzero[256] = {S_CNT64(0), S_CNT64(64), S_CNT64(128), S_CNT64(192)};

/* Code I of the stream at codes. */
static unsigned s_code(const uint8_t *codes, size_t i)
{
    return (codes[i / 4] >> (2 * (i % 4))) & 3;
}

/* dst[k] (+)= the value of codes [i, end) of the stream (0, 1 = +scale, 2 = -scale), k
 * counted from I; returns how many are nonzero. Whole bytes go through s_unit. */
MQ_QUANT_INLINE size_t s_detern_k(const uint8_t *codes, size_t i, size_t end, float scale,
                           const bool acc, float *dst)
{
    const mq_v4f_t vs = mq_v4f_set1(scale);
    size_t nz = 0, k = 0;
    for (; i < end && i % 4; i++, k++) {
        unsigned c = s_code(codes, i);
        float v = s_unit[c][0] * scale;
        dst[k] = acc ? dst[k] + v : v;
        nz += S_NZ(c);
    }
    for (; i + 4 <= end; i += 4, k += 4) {
        uint8_t byte = codes[i / 4];
        mq_v4f_t v = mq_v4f_load(s_unit[byte]) * vs;
        if (acc)
            v += mq_v4f_load(dst + k);
        memcpy(dst + k, &v, sizeof v);
        nz += s_nonzero[byte];
    }
    for (; i < end; i++, k++) {
        unsigned c = s_code(codes, i);
        float v = s_unit[c][0] * scale;
        dst[k] = acc ? dst[k] + v : v;
        nz += S_NZ(c);
    }
    return nz;
}

/* A run of one bucket's codes [i, end) of the stream (the scale at HDR) decoded into dst;
 * returns its share of the decoded sum of squares. */
static double s_detern(const mq_codec_t *c, const uint8_t *hdr, const uint8_t *codes,
                       const uint8_t *q, size_t i, size_t end, float scale, bool acc,
                       bool want_sq, float *dst)
{
    (void)c, (void)q, (void)want_sq;
    const float st = mq_get_f32(hdr);
    const double scale_d = (double)st * scale;
    size_t nz = 0;
    if (fabs(scale_d) > FLT_MAX) { /* saturate the nonzero values, keep the zeros 0 */
        for (size_t k = 0; i < end; i++, k++) {
            unsigned code = s_code(codes, i);
            float v = code == 0 ? 0.0f : (float)(code == 1 ? scale_d : -scale_d);
            dst[k] = acc ? dst[k] + v : v;
            nz += code != 0;
        }
    } else {
        nz = acc ? s_detern_k(codes, i, end, (float)scale_d, true, dst)
                 : s_detern_k(codes, i, end, (float)scale_d, false, dst);
    }
    return (double)st * st * (double)nz;
}

/* Index of the first code 3 in the n codes packed at src, or n. Eight bytes at a time: a
 * 2-bit field is 3 when both its bits are set. The last byte's unused fields are ignored. */
static size_t s_first_code3(const uint8_t *src, size_t n)
{
    const uint64_t lo = 0x5555555555555555ull;
    const size_t full = n / 4;
    size_t at = 0;
    for (; at + 8 <= full; at += 8) {
        uint64_t w;
        memcpy(&w, src + at, 8);
        if (w & (w >> 1) & lo)
            break;
    }
    for (; at < full; at++)
        if (src[at] & (src[at] >> 1) & 0x55)
            break;
    for (size_t i = 4 * at; i < n; i++)
        if (((src[i / 4] >> (2 * (i % 4))) & 3) == 3)
            return i;
    return n;
}

/* Every scale and code is checked before anything is written, so a bad payload leaves dst
 * (and a server's running sum) as it was. */
static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    (void)len; /* exact_size: the interface has checked it */
    const size_t nb = mq_quant_nbuckets(S_BUCKET(c), n), b = mq_quant_first_bad_scale(src, nb);
    if (b < nb) {
        mq_err_set("terngrad decode: bucket %zu of %zu has scale %g (expected a finite scale "
                   ">= 0)",
                   b, nb, (double)mq_get_f32(src + 4 * b));
        return -1;
    }
    size_t bad = s_first_code3(src + 4 * nb, n);
    if (bad < n) {
        mq_err_set("terngrad decode: value %zu of %zu has code 3 (expected 0, 1 = +scale or "
                   "2 = -scale)",
                   bad, n);
        return -1;
    }
    return 0;
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)len;
    mq_quant_scaled_decode(c, S_BUCKET(c), 2, false, s_detern, src, n, scale, acc, dst, stats);
}

/* ---- spec ------------------------------------------------------------------------------ */

static int s_option(mq_codec_t *c, const char *opt)
{
    if (strncmp(opt, "bucket=", 7) == 0)
        return mq_quant_bucket_option(c, opt);
    if (strncmp(opt, "clip=", 5) == 0) {
        float v;
        if (mq_quant_opt_float("terngrad", "clip", opt + 5, 0.0, S_CLIP_MAX, &v) < 0)
            return -1;
        mq_codec_set_param_f(c, 1, v + 0.0f); /* -0 is 0: off */
        return 0;
    }
    if (opt[0] >= '0' && opt[0] <= '9' && !strchr(opt, '=')) {
        mq_err_set("takes no bit-width (got '%s'): it always sends 2 bits a value", opt);
        return -1;
    }
    mq_err_set("unknown option '%s' (expected bucket=N or clip=C)", opt);
    return -1;
}

static void s_format(const mq_codec_t *c, char *buf, size_t len)
{
    char num[32];
    int w = S_BUCKET(c) ? snprintf(buf, len, ":bucket=%u", (unsigned)S_BUCKET(c)) : 0;
    if (w < 0 || (size_t)w >= len)
        return;
    buf[w] = 0;
    if (s_clip(c) > 0.0f) {
        mq_quant_format_float(num, sizeof num, s_clip(c), 6);
        snprintf(buf + w, len - (size_t)w, ":clip=%s", num);
    }
}

static int s_check(const mq_codec_t *c)
{
    float clip = s_clip(c);
    if (c->param[1] != 0 && !(clip > 0.0f && clip <= S_CLIP_MAX)) {
        mq_err_set("codec terngrad: clip %g (expected 0 = off or a number in (0, %g])",
                   (double)clip, S_CLIP_MAX);
        return -1;
    }
    return mq_quant_check_unused(c, 2);
}

const mq_codec_ops_t mq_codec_terngrad_ops = {
    .name = "terngrad",
    .id = MQ_CODEC_ID_terngrad,
    .usage = "terngrad[:bucket=N][:clip=C]",
    .help = "TernGrad (Wen et al.): stochastic ternary of max|g|, 2 bits; clip at C*sigma",
    .min_bits = 0,
    .max_bits = 0,
    .unbiased = true, /* without clip */
    .exact_size = true,
    .option = s_option,
    .format = s_format,
    .check = s_check,
    .max_size = s_max_size,
    .stochastic = mq_quant_always_stochastic,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
