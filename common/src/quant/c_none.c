/* The `none` codec: the values as little-endian float32, 4n bytes. What fp32 runs and the
 * small tensors of a quantized run travel with. */

#include <math.h>
#include <string.h>

#include "quant_internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#define S_BIG_ENDIAN 1 /* the payload is little-endian float32: swap on such hosts */
#else
#define S_BIG_ENDIAN 0
#endif

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    (void)c;
    return 4 * n;
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *len, mq_codec_stats_t *stats)
{
    (void)c, (void)ctx;
    if (mq_quant_check_finite("none encode", src, n) < 0)
        return -1;
#if S_BIG_ENDIAN
    for (size_t i = 0; i < n; i++)
        mq_put_f32(dst + 4 * i, src[i]);
#else
    memcpy(dst, src, 4 * n);
#endif
    if (stats) /* a plain pass: fp32 is not the traffic this is for, and it runs if asked */
        stats->sq = mq_quant_sum_sq(src, n);
    *len = 4 * n;
    return 0;
}

static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    (void)c;
    if (len != 4 * n) {
        mq_err_set("none: payload of %zu bytes for %zu values (expected exactly %zu)", len, n,
                   4 * n);
        return -1;
    }
    size_t bad = mq_quant_first_bad_f32(src, n);
    if (bad < n) {
        mq_err_set("none: value %zu of %zu is not finite", bad, n);
        return -1;
    }
    return 0;
}

static int s_check(const mq_codec_t *c)
{
    return mq_quant_check_unused(c, 0); /* it has no parameters */
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)c, (void)len;
    if (stats) /* from the payload's bytes, in the order encode sums its input */
        stats->sq = mq_quant_sq_f32(src, n);
    mq_quant_decode_f32(src, dst, n, scale, acc);
}

const mq_codec_ops_t mq_codec_none_ops = {
    .name = "none",
    .id = MQ_CODEC_ID_none,
    .usage = "none",
    .help = "fp32, 4 bytes a value (no compression)",
    .unbiased = true,
    .exact_size = true,
    .check = s_check,
    .max_size = s_max_size,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
