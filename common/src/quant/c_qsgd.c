/* The `qsgd` codec: QSGD's stochastic quantizer (D. Alistarh, D. Grubic, J. Li, R. Tomioka,
 * M. Vojnovic, "QSGD: Communication-Efficient SGD via Gradient Quantization and Encoding",
 * NeurIPS 2017) at B bits a value, as DQ-SGD uses it (G. Yan, S.-L. Huang, T. Lan, L. Song,
 * "DQ-SGD: Dynamic Quantization in SGD for Communication-Efficient Distributed Learning",
 * arXiv 2107.14575, 2021). With s = 2^(B-1) - 1 levels and v one bucket of the gradient,
 *
 *     Q(v_i) = ||v||_2 * sgn(v_i) * zeta_i,   zeta_i = (l + 1) / s with probability
 *     |v_i| s / ||v||_2 - l, else l / s,      l = floor(|v_i| s / ||v||_2),
 *
 * so E[Q(v)] = v and E||Q(v) - v||^2 <= min(d/s^2, sqrt(d)/s) ||v||^2 for a bucket of d
 * values (the paper's variance bound, its Lemma 3.1). Always stochastic: an encode needs ctx->rng.
 *
 * Spec: qsgd[:B][:bucket=N], B = 2..8 (1 sign bit + B-1 level bits; without B the
 * controller sets it). N = 0, the default, takes one norm per tensor (or per server shard),
 * the quantizer as the analysis and DQ-SGD state it; the QSGD paper's experiments normalize
 * per bucket (e.g. 512 values), which bounds the variance by min(N/s^2, sqrt(N)/s) for 4
 * more bytes per N values.
 * Parameter words: param[0] = N; the others are 0.
 * Payload: ceil(n/N) little-endian float32 norms (||v||_2 of each bucket), then the n codes
 * of B bits packed densely least-significant-bit first (value i's code at bit i*B of the
 * code stream), code = l | sign << (B-1), sign 1 for a negative value with l > 0. Exactly
 * 4*ceil(n/N) + ceil(n*B/8) bytes.
 *
 * Where this file chose:
 * - B-1 bits hold exactly the levels 0..s, so no level field is out of range: validation
 *   checks the norms (finite, sign bit clear). A zero level carries sign 0, as sgn(0) = 0.
 * - The norm is summed in double and rounded to float32, which keeps it >= max |v_i|; the
 *   multiplier s / norm is rounded up until norm * it >= s in float, so positions above s
 *   come from rounding only (clamped) and a bucket's one nonzero value is level s for
 *   certain. A bucket whose norm exceeds FLT_MAX (values near 1e38) is refused rather than
 *   sent with a clamped, biased norm; one below s / FLT_MAX (denormals) goes through double.
 * - Rounding noise is 16 random bits a value (the uniform codec's generators, seeded from
 *   ctx->rng): a level is rounded up with probability within 2^-16 of the exact one.
 * Work goes in chunks of MQ_QUANT_CHUNK values like the uniform codec's: a multiple of 8, so each
 * chunk starts on a byte of the code stream; codes are made one byte each in L1, then
 * packed. A bucket's norm is taken when the walk reaches it (bucket = 0: a first pass over
 * the whole tensor). */

#include <float.h>
#include <math.h>
#include <string.h>

#include "quant_internal.h"

#define S_BUCKET(c) ((c)->param[0])

/* Sixteen codes from bytes to 32-bit lanes: GCC's generic vectors would convert lane by
 * lane, so SSE2 (the x86-64 baseline) does it where it can (mq_v4i_narrow16 is the
 * inverse). */
MQ_QUANT_INLINE void s_widen16(const uint8_t *q, mq_v4i_t k[4])
{
#if defined(__SSE2__)
    const __m128i z = _mm_setzero_si128(), w = _mm_loadu_si128((const __m128i *)q);
    const __m128i lo = _mm_unpacklo_epi8(w, z), hi = _mm_unpackhi_epi8(w, z);
    k[0] = (mq_v4i_t)_mm_unpacklo_epi16(lo, z);
    k[1] = (mq_v4i_t)_mm_unpackhi_epi16(lo, z);
    k[2] = (mq_v4i_t)_mm_unpacklo_epi16(hi, z);
    k[3] = (mq_v4i_t)_mm_unpackhi_epi16(hi, z);
#else
    for (int j = 0; j < 16; j++)
        k[j / 4][j % 4] = q[j];
#endif
}

/* Levels at K bits: s = 2^(K-1) - 1. */
static int s_levels(int K)
{
    return (1 << (K - 1)) - 1;
}

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    return 4 * mq_quant_nbuckets(S_BUCKET(c), n) + mq_quant_code_bytes(n, c->bits);
}

/* Sum of squares of x[0..n) in double: four chains of two lanes (SSE2 converts four floats
 * in two instructions, where generic vectors go value by value). Any NaN or infinity makes
 * it non-finite, and finite floats cannot overflow it, so it doubles as the finiteness scan. */
static double s_sum_sq(const float *x, size_t n)
{
    size_t i = 0;
    double s = 0.0;
#if defined(__SSE2__)
    __m128d a0 = _mm_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 8 <= n; i += 8) {
        MQ_QUANT_PREFETCH(x + i);
        __m128 v = _mm_loadu_ps(x + i), w = _mm_loadu_ps(x + i + 4);
        __m128d d0 = _mm_cvtps_pd(v), d1 = _mm_cvtps_pd(_mm_movehl_ps(v, v));
        __m128d d2 = _mm_cvtps_pd(w), d3 = _mm_cvtps_pd(_mm_movehl_ps(w, w));
        a0 = _mm_add_pd(a0, _mm_mul_pd(d0, d0));
        a1 = _mm_add_pd(a1, _mm_mul_pd(d1, d1));
        a2 = _mm_add_pd(a2, _mm_mul_pd(d2, d2));
        a3 = _mm_add_pd(a3, _mm_mul_pd(d3, d3));
    }
    mq_v2d_t a = (mq_v2d_t)_mm_add_pd(_mm_add_pd(a0, a1), _mm_add_pd(a2, a3));
    s = a[0] + a[1];
#endif
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

/* ---- encoding ------------------------------------------------------------------------ */

/* What quantizing one bucket needs: |v_i| * mult is v_i's position on the level grid. */
typedef struct {
    float mult;    /* s / norm rounded up until norm * mult >= s in float (0: a zero bucket) */
    double mult_d; /* s / norm in double, used when it does not fit a float */
    float norm;    /* as sent */
    bool tiny;     /* norm < s / FLT_MAX */
    float step;    /* norm / s: what a level decodes to */
} s_bucket_t;

/* The norm of bucket b (values x[0..n), the first at index AT of TOTAL) into its header
 * word and *p; -1 with an error on a non-finite value or a norm beyond float32. */
static int s_bucket_norm(const mq_codec_t *c, const float *x, size_t n, size_t b, size_t at,
                         size_t total, uint8_t *hdr, void *bucket)
{
    const int K = c->bits;
    s_bucket_t *p = bucket;
    double ss = s_sum_sq(x, n);
    if (!isfinite(ss)) {
        size_t bad = mq_quant_first_nonfinite(x, n);
        mq_err_set("qsgd:%d encode: value %zu of %zu is %s (expected finite numbers)", K,
                   at + bad, total, isnan(x[bad]) ? "NaN" : "infinite");
        return -1;
    }
    double nd = sqrt(ss);
    if (nd > FLT_MAX) {
        mq_err_set("qsgd:%d encode: bucket %zu (values %zu..%zu of %zu) has 2-norm %g, beyond "
                   "float32 (expected values well below 1e38)",
                   K, b, at, at + n - 1, total, nd);
        return -1;
    }
    float norm = (float)nd; /* >= every |x_i|: each x_i^2 is exact in double, and the sum,
                             * the square root and the rounding are monotonic */
    mq_put_f32(hdr, norm);
    const int s = s_levels(K);
    *p = (s_bucket_t){.norm = norm, .step = (float)(nd > 0 ? (double)norm / s : 0.0)};
    p->mult_d = norm > 0 ? s / (double)norm : 0.0;
    p->tiny = p->mult_d > FLT_MAX;
    if (!p->tiny && norm > 0) {
        /* A value as large as the norm (the only nonzero one of its bucket) is then level s
         * for certain: the clamp catches it whatever the noise. Rounding mult up moves a
         * level's probability by at most s * 2^-24. */
        p->mult = (float)p->mult_d;
        while (norm * p->mult < (float)s)
            p->mult = nextafterf(p->mult, INFINITY);
    }
    return 0;
}

/* Codes of x[0..n), one bucket's, into q with noise u; returns the sum of the squares of
 * their levels when WANT_SQ. l = trunc(min(|x| * mult + u, s)) is floor(y + u): y rounded
 * up with probability frac(y). The vector loop and the scalar tail do the same float
 * operations, so a payload does not depend on where a chunk's tail falls. The sums are
 * exact: a lane adds at most MQ_QUANT_CHUNK / 4 squares of at most 127^2, below 2^24. */
MQ_QUANT_INLINE double s_quantize_k(const float *x, size_t n, const s_bucket_t *p, int K,
                             const float *u, uint8_t *q, const bool want_sq)
{
    const int s = s_levels(K);
    const mq_v4f_t mult = mq_v4f_set1(p->mult), top = mq_v4f_set1((float)s);
    const mq_v4u_t absm = {0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu};
    const uint32_t sb = 1u << (K - 1);
    const mq_v4u_t signm = {sb, sb, sb, sb};
    const mq_v4i_t zero = {0, 0, 0, 0};
    mq_v4f_t acc = mq_v4f_set1(0.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mq_v4i_t k[4];
        MQ_QUANT_PREFETCH(x + i);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            mq_v4u_t bits;
            memcpy(&bits, x + i + 4 * j, sizeof bits);
            mq_v4f_t y =
                mq_v4f_min((mq_v4f_t)(bits & absm) * mult + mq_v4f_load(u + i + 4 * j), top);
            mq_v4i_t l = __builtin_convertvector(y, mq_v4i_t);
            if (want_sq) {
                mq_v4f_t lf = __builtin_convertvector(l, mq_v4f_t);
                acc += lf * lf;
            }
            /* the sign bit moved down to bit K-1, kept only for a nonzero level */
            mq_v4u_t sign = (bits >> (32 - K)) & signm & (mq_v4u_t)(l > zero);
            k[j] = l | (mq_v4i_t)sign;
        }
        mq_v4i_narrow16(q + i, k);
    }
    double sq = want_sq ? ((double)acc[0] + acc[1]) + ((double)acc[2] + acc[3]) : 0.0;
    for (; i < n; i++) {
        float y = fabsf(x[i]) * p->mult + u[i];
        int l = (int)(y < (float)s ? y : (float)s);
        q[i] = (uint8_t)(l | (l > 0 && signbit(x[i])) << (K - 1));
        sq += (double)l * l;
    }
    return sq;
}

/* The same for a bucket whose s / norm is beyond float (a norm in the denormals). */
static double s_quantize_tiny(const float *x, size_t n, const s_bucket_t *p, int K,
                              const float *u, uint8_t *q)
{
    const int s = s_levels(K);
    double sq = 0.0;
    for (size_t i = 0; i < n; i++) {
        double y = fabs((double)x[i]) * p->mult_d + u[i];
        int l = y < s && fabsf(x[i]) < p->norm ? (int)y : s;
        q[i] = (uint8_t)(l | (l > 0 && signbit(x[i])) << (K - 1));
        sq += (double)l * l;
    }
    return sq;
}

/* A run of one bucket's codes; returns its share of the decoded sum of squares. */
static double s_quantize(const mq_codec_t *c, const void *bucket, const float *x, size_t n,
                         const float *u, uint8_t *q, bool want_sq)
{
    const s_bucket_t *p = bucket;
    const int K = c->bits;
    double l2 = p->tiny     ? s_quantize_tiny(x, n, p, K, u, q)
                : want_sq ? s_quantize_k(x, n, p, K, u, q, true)
                          : s_quantize_k(x, n, p, K, u, q, false);
    return (double)p->step * p->step * l2;
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *out_len, mq_codec_stats_t *stats)
{
    s_bucket_t p = {0};
    if (mq_quant_scaled_encode(c, S_BUCKET(c), c->bits, s_bucket_norm, s_quantize, &p, src, n,
                               ctx->rng, dst, stats) < 0)
        return -1;
    *out_len = s_max_size(c, n);
    return 0;
}

/* ---- decoding ------------------------------------------------------------------------ */

/* dst[i] (+)= step * l_i with the code's sign, for codes q[0..n) of one bucket; returns the
 * sum of the squares of the levels when WANT_SQ (exact, as in s_quantize). */
MQ_QUANT_INLINE double s_dequantize_k(const uint8_t *q, size_t n, float step, int K, const bool acc,
                               const bool want_sq, float *dst)
{
    const uint32_t lm = (uint32_t)s_levels(K);
    const mq_v4u_t lmask = {lm, lm, lm, lm};
    const mq_v4u_t top = {0x80000000u, 0x80000000u, 0x80000000u, 0x80000000u};
    const mq_v4f_t vstep = mq_v4f_set1(step);
    mq_v4f_t l2 = mq_v4f_set1(0.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mq_v4i_t k[4];
        s_widen16(q + i, k);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            mq_v4u_t code = (mq_v4u_t)k[j];
            mq_v4f_t lf = __builtin_convertvector((mq_v4i_t)(code & lmask), mq_v4f_t);
            if (want_sq)
                l2 += lf * lf;
            mq_v4f_t v = (mq_v4f_t)((mq_v4u_t)(lf * vstep) ^ ((code << (32 - K)) & top));
            if (acc)
                v += mq_v4f_load(dst + i + 4 * j);
            memcpy(dst + i + 4 * j, &v, sizeof v);
        }
    }
    double sq = want_sq ? ((double)l2[0] + l2[1]) + ((double)l2[2] + l2[3]) : 0.0;
    for (; i < n; i++) {
        unsigned l = q[i] & lm;
        float v = (float)l * step;
        v = q[i] >> (K - 1) ? -v : v;
        dst[i] = acc ? dst[i] + v : v;
        sq += (double)l * l;
    }
    return sq;
}

/* The same when norm * scale / s is beyond float: through double, so a zero level stays 0
 * (not inf * 0) and the others saturate to infinities as the caller's scale asks. */
static double s_dequantize_wide(const uint8_t *q, size_t n, double step, int K, bool acc,
                                float *dst)
{
    const unsigned lm = (unsigned)s_levels(K);
    double sq = 0.0;
    for (size_t i = 0; i < n; i++) {
        unsigned l = q[i] & lm;
        float v = l ? (float)(step * l) : 0.0f;
        v = q[i] >> (K - 1) ? -v : v;
        dst[i] = acc ? dst[i] + v : v;
        sq += (double)l * l;
    }
    return sq;
}

/* A run of one bucket's codes q[0..end - i) (the norm at HDR) decoded into dst; returns its
 * share of the decoded sum of squares (with the step rounded as encode's stats round it). */
static double s_dequantize(const mq_codec_t *c, const uint8_t *hdr, const uint8_t *codes,
                           const uint8_t *q, size_t i, size_t end, float scale, bool acc,
                           bool want_sq, float *dst)
{
    (void)codes;
    const int K = c->bits, s = s_levels(K);
    const float norm = mq_get_f32(hdr);
    const double step_d = (double)norm / s * scale;
    const float step = (float)step_d;
    const size_t n = end - i;
    double l2;
    if (fabs(step_d) > FLT_MAX)
        l2 = s_dequantize_wide(q, n, step_d, K, acc, dst);
    else if (want_sq)
        l2 = acc ? s_dequantize_k(q, n, step, K, true, true, dst)
                 : s_dequantize_k(q, n, step, K, false, true, dst);
    else
        l2 = acc ? s_dequantize_k(q, n, step, K, true, false, dst)
                 : s_dequantize_k(q, n, step, K, false, false, dst);
    if (!want_sq)
        return 0.0;
    float sstep = (float)((double)norm / s); /* what encode's stats use */
    return (double)sstep * sstep * l2;
}

/* Every norm is checked before anything is written, so a bad payload leaves dst (and a
 * server's running sum) as it was. */
static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    (void)len; /* exact_size: the interface has checked it */
    const size_t nb = mq_quant_nbuckets(S_BUCKET(c), n), b = mq_quant_first_bad_scale(src, nb);
    if (b < nb) {
        mq_err_set("qsgd:%d decode: bucket %zu of %zu has norm %g (expected a finite norm >= 0)",
                   c->bits, b, nb, (double)mq_get_f32(src + 4 * b));
        return -1;
    }
    return 0;
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)len;
    mq_quant_scaled_decode(c, S_BUCKET(c), c->bits, true, s_dequantize, src, n, scale, acc, dst,
                           stats);
}

const mq_codec_ops_t mq_codec_qsgd_ops = {
    .name = "qsgd",
    .id = MQ_CODEC_ID_qsgd,
    .usage = "qsgd[:B][:bucket=N]",
    .help = "QSGD (Alistarh et al.): sign + B-1 bits of stochastic levels of the 2-norm",
    .min_bits = 2,
    .max_bits = MQ_QUANT_MAX_BITS,
    .unbiased = true,
    .exact_size = true,
    .option = mq_quant_bucket_option,
    .format = mq_quant_bucket_format,
    .check = mq_quant_bucket_check,
    .max_size = s_max_size,
    .stochastic = mq_quant_always_stochastic,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
