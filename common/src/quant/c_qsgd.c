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
 * Work goes in chunks of S_CHUNK values like the uniform codec's: a multiple of 8, so each
 * chunk starts on a byte of the code stream; codes are made one byte each in L1, then
 * packed. A bucket's norm is taken when the walk reaches it (bucket = 0: a first pass over
 * the whole tensor). */

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Software prefetch 4 KB ahead of the loops that read the gradient: the hardware prefetcher
 * stops at each 4 KB page, and with buckets the reads come in short bursts (as kernels.c).
 * The address may lie past the tensor: a prefetch never faults, and it is formed as an
 * integer so that no pointer leaves its array. */
#if defined(__SSE2__)
#define S_PREFETCH(p) _mm_prefetch((const char *)((uintptr_t)(p) + 4096), _MM_HINT_T0)
#else
#define S_PREFETCH(p) ((void)(p))
#endif

#define S_BUCKET(c) ((c)->param[0])
#define S_CHUNK 2048 /* values per pass: codes, noise and output stay in L1 */
#define S_INLINE static inline __attribute__((always_inline))

/* Past this many bytes of output, a plain decode stores with streaming stores (as uniform). */
#define S_STREAM_BYTES ((size_t)16 << 20)

typedef double s_v2d_t __attribute__((vector_size(16)));
typedef uint32_t s_v4u_t __attribute__((vector_size(16)));

/* Sixteen codes between bytes and 32-bit lanes. GCC's generic vectors scalarize both
 * conversions, so SSE2 (the x86-64 baseline) does them where it can. */
S_INLINE void s_widen16(const uint8_t *q, mq_v4i_t k[4])
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

/* The inverse, for lanes in 0..255. */
S_INLINE void s_narrow16(uint8_t *q, const mq_v4i_t k[4])
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

/* Lane-wise min(a, b) (b where a is NaN: never here): one instruction with SSE2. */
S_INLINE mq_v4f_t s_min(mq_v4f_t a, mq_v4f_t b)
{
#if defined(__SSE2__)
    return (mq_v4f_t)_mm_min_ps((__m128)a, (__m128)b);
#else
    return mq_v4f_select(a < b, a, b);
#endif
}

/* Levels at K bits: s = 2^(K-1) - 1. */
static int s_levels(int K)
{
    return (1 << (K - 1)) - 1;
}

static size_t s_nbuckets(const mq_codec_t *c, size_t n)
{
    if (n == 0)
        return 0;
    size_t B = S_BUCKET(c) ? S_BUCKET(c) : n;
    return n / B + (n % B != 0);
}

static size_t s_code_bytes(size_t n, int K)
{
    return (n / 8) * (size_t)K + ((n % 8) * (size_t)K + 7) / 8;
}

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    return 4 * s_nbuckets(c, n) + s_code_bytes(n, c->bits);
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
        S_PREFETCH(x + i);
        __m128 v = _mm_loadu_ps(x + i), w = _mm_loadu_ps(x + i + 4);
        __m128d d0 = _mm_cvtps_pd(v), d1 = _mm_cvtps_pd(_mm_movehl_ps(v, v));
        __m128d d2 = _mm_cvtps_pd(w), d3 = _mm_cvtps_pd(_mm_movehl_ps(w, w));
        a0 = _mm_add_pd(a0, _mm_mul_pd(d0, d0));
        a1 = _mm_add_pd(a1, _mm_mul_pd(d1, d1));
        a2 = _mm_add_pd(a2, _mm_mul_pd(d2, d2));
        a3 = _mm_add_pd(a3, _mm_mul_pd(d3, d3));
    }
    s_v2d_t a = (s_v2d_t)_mm_add_pd(_mm_add_pd(a0, a1), _mm_add_pd(a2, a3));
    s = a[0] + a[1];
#endif
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

/* A fresh set of noise generators from the caller's: the payload depends only on its seed. */
static void s_noise_seed(mq_quant_noise_t *g, mq_rng_t *rng)
{
    for (int w = 0; w < 4; w++)
        for (int lane = 0; lane < 8; lane += 2) {
            uint64_t r = mq_rng_next(rng);
            g->s[w][lane] = (uint32_t)r;
            g->s[w][lane + 1] = (uint32_t)(r >> 32);
        }
    for (int lane = 0; lane < 8; lane++) /* an all-zero state would stay zero */
        if (!(g->s[0][lane] | g->s[1][lane] | g->s[2][lane] | g->s[3][lane]))
            g->s[0][lane] = 0x9e3779b9u;
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
static int s_bucket_norm(int K, const float *x, size_t n, size_t b, size_t at, size_t total,
                         uint8_t *hdr, s_bucket_t *p)
{
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
 * exact: a lane adds at most S_CHUNK / 4 squares of at most 127^2, below 2^24. */
S_INLINE double s_quantize_k(const float *x, size_t n, const s_bucket_t *p, int K,
                             const float *u, uint8_t *q, const bool want_sq)
{
    const int s = s_levels(K);
    const mq_v4f_t mult = mq_v4f_set1(p->mult), top = mq_v4f_set1((float)s);
    const s_v4u_t absm = {0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu};
    const uint32_t sb = 1u << (K - 1);
    const s_v4u_t signm = {sb, sb, sb, sb};
    const mq_v4i_t zero = {0, 0, 0, 0};
    mq_v4f_t acc = mq_v4f_set1(0.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mq_v4i_t k[4];
        S_PREFETCH(x + i);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            s_v4u_t bits;
            memcpy(&bits, x + i + 4 * j, sizeof bits);
            mq_v4f_t y = s_min((mq_v4f_t)(bits & absm) * mult + mq_v4f_load(u + i + 4 * j), top);
            mq_v4i_t l = __builtin_convertvector(y, mq_v4i_t);
            if (want_sq) {
                mq_v4f_t lf = __builtin_convertvector(l, mq_v4f_t);
                acc += lf * lf;
            }
            /* the sign bit moved down to bit K-1, kept only for a nonzero level */
            s_v4u_t sign = (bits >> (32 - K)) & signm & (s_v4u_t)(l > zero);
            k[j] = l | (mq_v4i_t)sign;
        }
        s_narrow16(q + i, k);
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

static double s_quantize(const float *x, size_t n, const s_bucket_t *p, int K, const float *u,
                         uint8_t *q, bool want_sq)
{
    if (p->tiny)
        return s_quantize_tiny(x, n, p, K, u, q);
    return want_sq ? s_quantize_k(x, n, p, K, u, q, true) : s_quantize_k(x, n, p, K, u, q, false);
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *out_len, mq_codec_stats_t *stats)
{
    const mq_quant_kernels_t *kn = mq_quant_kernels();
    const int K = c->bits;
    const size_t B = S_BUCKET(c) ? S_BUCKET(c) : n;
    const size_t nb = s_nbuckets(c, n), code_bytes = s_code_bytes(n, K);
    uint8_t *codes = dst + 4 * nb;
    uint8_t q[S_CHUNK];
    float noise[S_CHUNK];
    size_t next_bucket = 0; /* a bucket's norm is taken when the walk first reaches it */
    s_bucket_t p = {0};
    double sq = 0.0;
    mq_quant_noise_t gen;
    s_noise_seed(&gen, ctx->rng);

    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t len = n - start < S_CHUNK ? n - start : S_CHUNK;
        uint8_t *out = K == 8 ? codes + start : q; /* 8-bit codes need no packing */
        kn->noise(&gen, noise, len);
        for (size_t i = start; i < start + len;) {
            size_t b = i / B;
            size_t b_end = (b + 1) * B < n ? (b + 1) * B : n;
            size_t seg_end = b_end < start + len ? b_end : start + len;
            if (b == next_bucket) {
                if (s_bucket_norm(K, src + b * B, b_end - b * B, b, b * B, n, dst + 4 * b, &p) <
                    0)
                    return -1;
                next_bucket++;
            }
            double l2 = s_quantize(src + i, seg_end - i, &p, K, noise + (i - start),
                                   out + (i - start), stats != NULL);
            sq += (double)p.step * p.step * l2;
            i = seg_end;
        }
        if (K < 8) {
            size_t at = start / 8 * (size_t)K;
            kn->pack(q, len, codes + at, code_bytes - at, K);
        }
    }
    if (stats)
        stats->sq = sq;
    *out_len = s_max_size(c, n);
    return 0;
}

/* ---- decoding ------------------------------------------------------------------------ */

/* dst[i] (+)= step * l_i with the code's sign, for codes q[0..n) of one bucket; returns the
 * sum of the squares of the levels when WANT_SQ (exact, as in s_quantize). */
S_INLINE double s_dequantize_k(const uint8_t *q, size_t n, float step, int K, const bool acc,
                               const bool want_sq, float *dst)
{
    const uint32_t lm = (uint32_t)s_levels(K);
    const s_v4u_t lmask = {lm, lm, lm, lm};
    const s_v4u_t top = {0x80000000u, 0x80000000u, 0x80000000u, 0x80000000u};
    const mq_v4f_t vstep = mq_v4f_set1(step);
    mq_v4f_t l2 = mq_v4f_set1(0.0f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        mq_v4i_t k[4];
        s_widen16(q + i, k);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            s_v4u_t code = (s_v4u_t)k[j];
            mq_v4f_t lf = __builtin_convertvector((mq_v4i_t)(code & lmask), mq_v4f_t);
            if (want_sq)
                l2 += lf * lf;
            mq_v4f_t v = (mq_v4f_t)((s_v4u_t)(lf * vstep) ^ ((code << (32 - K)) & top));
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

static double s_dequantize(const uint8_t *q, size_t n, double step_d, int K, bool acc,
                           bool want_sq, float *dst)
{
    const float step = (float)step_d;
    if (fabs(step_d) > FLT_MAX)
        return s_dequantize_wide(q, n, step_d, K, acc, dst);
    if (want_sq)
        return acc ? s_dequantize_k(q, n, step, K, true, true, dst)
                   : s_dequantize_k(q, n, step, K, false, true, dst);
    return acc ? s_dequantize_k(q, n, step, K, true, false, dst)
               : s_dequantize_k(q, n, step, K, false, false, dst);
}

/* Every norm is checked before anything is written, so a bad payload leaves dst (and a
 * server's running sum) as it was. */
static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    (void)len; /* exact_size: the interface has checked it */
    const size_t nb = s_nbuckets(c, n);
    for (size_t b = 0; b < nb; b++) {
        uint32_t u = mq_get_u32(src + 4 * b);
        if (!mq_f32_bits_finite(u) || (u >> 31)) {
            mq_err_set("qsgd:%d decode: bucket %zu of %zu has norm %g (expected a finite "
                       "norm >= 0)",
                       c->bits, b, nb, (double)mq_get_f32(src + 4 * b));
            return -1;
        }
    }
    return 0;
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)len;
    const mq_quant_kernels_t *kn = mq_quant_kernels();
    const int K = c->bits, s = s_levels(K);
    const size_t B = S_BUCKET(c) ? S_BUCKET(c) : n;
    const size_t nb = s_nbuckets(c, n), code_bytes = s_code_bytes(n, K);
    const uint8_t *codes = src + 4 * nb;
    const bool stream = !acc && n >= S_STREAM_BYTES / sizeof(float);
    uint8_t buf[S_CHUNK];
    float out[S_CHUNK]; /* when streaming, a chunk is decoded here, then stored in one go */
    double sq = 0.0;
    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t clen = n - start < S_CHUNK ? n - start : S_CHUNK;
        const uint8_t *q = codes + start; /* 8-bit codes are read in place */
        if (K < 8) {
            size_t at = start / 8 * (size_t)K;
            kn->unpack(codes + at, clen, code_bytes - at, buf, K);
            q = buf;
        }
        float *to = stream ? out : dst + start;
        for (size_t i = start; i < start + clen;) {
            size_t b = i / B;
            size_t b_end = (b + 1) * B < n ? (b + 1) * B : n;
            size_t seg_end = b_end < start + clen ? b_end : start + clen;
            float norm = mq_get_f32(src + 4 * b);
            double l2 = s_dequantize(q + (i - start), seg_end - i, (double)norm / s * scale, K,
                                     acc, stats != NULL, to + (i - start));
            if (stats) {
                float step = (float)((double)norm / s); /* what encode's stats use */
                sq += (double)step * step * l2;
            }
            i = seg_end;
        }
        if (stream)
            kn->stream(dst + start, out, clen * sizeof *dst);
    }
    if (stream)
        mq_quant_stream_fence();
    if (stats)
        stats->sq = sq;
}

/* ---- spec ------------------------------------------------------------------------------ */

#define S_BUCKET_MAX ((long)(UINT32_MAX > LONG_MAX ? LONG_MAX : UINT32_MAX))

static int s_option(mq_codec_t *c, const char *opt)
{
    if (strncmp(opt, "bucket=", 7) == 0)
        return mq_quant_opt_u32("qsgd", "bucket", opt + 7, 0, S_BUCKET_MAX, &c->param[0]);
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
            mq_err_set("codec qsgd: parameter word %d is set (unused)", i);
            return -1;
        }
    return 0;
}

static bool s_stochastic(const mq_codec_t *c)
{
    (void)c;
    return true;
}

const mq_codec_ops_t mq_codec_qsgd_ops = {
    .name = "qsgd",
    .id = MQ_CODEC_QSGD,
    .usage = "qsgd[:B][:bucket=N]",
    .help = "QSGD (Alistarh et al.): sign + B-1 bits of stochastic levels of the 2-norm",
    .min_bits = 2,
    .max_bits = MQ_QUANT_MAX_BITS,
    .unbiased = true,
    .exact_size = true,
    .option = s_option,
    .format = s_format,
    .check = s_check,
    .max_size = s_max_size,
    .stochastic = s_stochastic,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
