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
#include <math.h>
#include <string.h>

#include "quant_internal.h"

#define S_BUCKET(c) ((c)->param[0])
#define S_DEFAULT_BUCKET 512u
#define S_BLOCK 512 /* values summed in float lanes before the double total */

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    return 8 * mq_quant_nbuckets(S_BUCKET(c), n) + n / 8 + (n % 8 != 0);
}

/* ---- the first pass: the two means ----------------------------------------------------- */

typedef struct {
    double neg, pos; /* sums of the negative and of the non-negative p_i */
    size_t nneg;     /* how many are negative */
} s_sums_t;

/* Adds p_i = g_i + r e_i for values [i, m) to T, one at a time, in double. */
static void s_sums_add(s_sums_t *t, const float *g, const float *e, float r, size_t i, size_t m)
{
    for (; i < m; i++) {
        float p = g[i] + r * e[i];
        if (p < 0.0f) {
            t->neg += p;
            t->nneg++;
        } else {
            t->pos += p;
        }
    }
}

/* Sums of p_i = g_i + r e_i over m values, by side. Float lanes per block, blocks in double:
 * a sum is not finite when a p_i is not, or (|p| near FLT_MAX) when a block overflows; the
 * caller tells them apart and recounts in double (s_sums_add from 0). */
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
    s_sums_add(&t, g, e, r, i, m);
    return t;
}

static float s_mean(double sum, size_t count)
{
    if (count == 0)
        return 0.0f;
    double m = sum / (double)count;
    return m > FLT_MAX ? FLT_MAX : m < -FLT_MAX ? -FLT_MAX : (float)m;
}

/* The first pass for one bucket: the means of its negative and non-negative p_i. */
static int s_header(const float *g, const float *e, float r, size_t d, size_t at, size_t n,
                    uint8_t *hdr)
{
    s_sums_t t = s_sums(g, e, r, d);
    if (!isfinite(t.neg) || !isfinite(t.pos)) {
        if (mq_quant_ef_nonfinite("onebit encode", g, e, r, d, at, n))
            return -1;
        t = (s_sums_t){0.0, 0.0, 0}; /* a float block overflowed */
        s_sums_add(&t, g, e, r, 0, d);
    }
    mq_put_f32(hdr, s_mean(t.neg, t.nneg));
    mq_put_f32(hdr + 4, s_mean(t.pos, d - t.nneg));
    return 0;
}

/* ---- encode and decode ----------------------------------------------------------------- */

/* Set bits among values [i0, i1). */
static size_t s_count_ones(const uint8_t *bits, size_t i0, size_t i1)
{
    size_t count = 0, i = i0;
    for (; i < i1 && (i & 7); i++)
        count += (bits[i >> 3] >> (i & 7)) & 1;
    for (; i + 64 <= i1; i += 64) {
        uint64_t w;
        memcpy(&w, bits + (i >> 3), 8); /* byte order does not change a population count */
        count += mq_quant_popcount64(w);
    }
    for (; i + 8 <= i1; i += 8)
        count += mq_quant_popcount64(bits[i >> 3]);
    for (; i < i1; i++)
        count += (bits[i >> 3] >> (i & 7)) & 1;
    return count;
}

/* Bucket b's bits decode to lo_b (set) or hi_b. */
static void s_levels(const uint8_t *hdr, float *lo, float *hi)
{
    *lo = mq_get_f32(hdr);
    *hi = mq_get_f32(hdr + 4);
}

/* The sum of squares of the decoded values: per bucket, the count of each side times the
 * square of its value. Encode and decode both take it from the payload, so they agree. */
static double s_sum_sq(const mq_codec_t *c, const uint8_t *src, size_t n)
{
    const size_t B = mq_quant_bucket_len(S_BUCKET(c), n), nb = mq_quant_nbuckets(S_BUCKET(c), n);
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
    if (mq_quant_signs_encode(S_BUCKET(c), 8, s_header, s_levels, src, n, ctx, dst) < 0)
        return -1;
    if (stats)
        stats->sq = s_sum_sq(c, dst, n);
    *out_len = s_max_size(c, n);
    return 0;
}

static int s_check_header(const uint8_t *hdr, size_t b, size_t nb)
{
    float lo = mq_get_f32(hdr), hi = mq_get_f32(hdr + 4);
    if (isfinite(lo) && isfinite(hi) && lo <= 0.0f && hi >= 0.0f)
        return 0;
    mq_err_set("onebit decode: bucket %zu of %zu has means (%g, %g) (expected finite "
               "negative-side <= 0 <= non-negative-side)",
               b, nb, (double)lo, (double)hi);
    return -1;
}

/* exact_size: the interface has checked LEN. */
static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    return mq_quant_signs_validate(S_BUCKET(c), 8, s_check_header, "onebit decode", src, len, n);
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)len;
    mq_quant_signs_decode(S_BUCKET(c), 8, s_levels, src, n, scale, acc, dst);
    if (stats)
        stats->sq = s_sum_sq(c, src, n);
}

/* ---- spec ------------------------------------------------------------------------------ */

static void s_defaults(mq_codec_t *c)
{
    c->param[0] = S_DEFAULT_BUCKET;
}

const mq_codec_ops_t mq_codec_onebit_ops = {
    .name = "onebit",
    .id = MQ_CODEC_ID_onebit,
    .usage = "onebit[:bucket=N]",
    .help = "1-bit SGD: sign bits, mean of each side per N=512 values, residual (Seide 2014)",
    .defaults = s_defaults,
    .max_size = s_max_size,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
    MQ_QUANT_EF_SIGN_OPS,
};
