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
#include <math.h>
#include <string.h>

#include "quant_internal.h"

#define S_BUCKET(c) ((c)->param[0])
#define S_BLOCK 512 /* values summed in float lanes before the double total */

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    return 4 * mq_quant_nbuckets(S_BUCKET(c), n) + n / 8 + (n % 8 != 0);
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

/* The first pass for one bucket: its scale ||p||_1 / d. */
static int s_header(const float *g, const float *e, float r, size_t d, size_t at, size_t n,
                    uint8_t *hdr)
{
    double l1 = s_l1(g, e, r, d);
    if (!isfinite(l1)) {
        if (mq_quant_ef_nonfinite("sign encode", g, e, r, d, at, n))
            return -1;
        l1 = s_l1_double(g, e, r, d); /* a float block overflowed */
    }
    double s = l1 / (double)d;
    mq_put_f32(hdr, s > FLT_MAX ? FLT_MAX : (float)s);
    return 0;
}

/* ---- encode and decode ----------------------------------------------------------------- */

/* Bucket b's bits decode to -s_b (set) or +s_b. */
static void s_levels(const uint8_t *hdr, float *lo, float *hi)
{
    float s = mq_get_f32(hdr);
    *lo = -s;
    *hi = s;
}

/* Every value decodes to +-s_b: the sum of squares follows from the scales alone. */
static double s_sum_sq(const mq_codec_t *c, const uint8_t *hdr, size_t n)
{
    const size_t B = mq_quant_bucket_len(S_BUCKET(c), n), nb = mq_quant_nbuckets(S_BUCKET(c), n);
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
    if (mq_quant_signs_encode(S_BUCKET(c), 4, s_header, s_levels, src, n, ctx, dst) < 0)
        return -1;
    if (stats)
        stats->sq = s_sum_sq(c, dst, n);
    *out_len = s_max_size(c, n);
    return 0;
}

static int s_check_header(const uint8_t *hdr, size_t b, size_t nb)
{
    float s = mq_get_f32(hdr);
    if (isfinite(s) && s >= 0.0f)
        return 0;
    mq_err_set("sign decode: bucket %zu of %zu has scale %g (expected a finite number >= 0)", b,
               nb, (double)s);
    return -1;
}

/* exact_size: the interface has checked LEN. */
static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    return mq_quant_signs_validate(S_BUCKET(c), 4, s_check_header, "sign decode", src, len, n);
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)len;
    mq_quant_signs_decode(S_BUCKET(c), 4, s_levels, src, n, scale, acc, dst);
    if (stats)
        stats->sq = s_sum_sq(c, src, n);
}

const mq_codec_ops_t mq_codec_sign_ops = {
    .name = "sign",
    .id = MQ_CODEC_ID_sign,
    .usage = "sign[:bucket=N]",
    .help = "EF-signSGD: signs and ||p||_1/d per N values, residual kept (Karimireddy 2019)",
    .max_size = s_max_size,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
    MQ_QUANT_EF_SIGN_OPS,
};
