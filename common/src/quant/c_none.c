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

/* Index of the first non-finite value in a payload of n little-endian float32 (n if none).
 * The payload may be unaligned (a ZeroMQ frame), so lanes are loaded with memcpy. */
static size_t s_first_bad(const uint8_t *src, size_t n)
{
    size_t i = 0;
    bool any = false;
#if !S_BIG_ENDIAN
    const mq_v4i_t expo = {0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000};
    mq_v4i_t bad = {0, 0, 0, 0};
    for (; i + 4 <= n; i += 4) {
        mq_v4i_t u;
        memcpy(&u, src + 4 * i, sizeof u);
        bad |= (u & expo) == expo;
    }
    any = bad[0] | bad[1] | bad[2] | bad[3];
#endif
    for (; i < n; i++)
        any |= !mq_f32_bits_finite(mq_get_u32(src + 4 * i));
    if (!any)
        return n;
    for (i = 0; i < n; i++)
        if (!mq_f32_bits_finite(mq_get_u32(src + 4 * i)))
            return i;
    return n;
}

static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    (void)c;
    if (len != 4 * n) {
        mq_err_set("none: payload of %zu bytes for %zu values (expected exactly %zu)", len, n,
                   4 * n);
        return -1;
    }
    size_t bad = s_first_bad(src, n);
    if (bad < n) {
        mq_err_set("none: value %zu of %zu is not finite", bad, n);
        return -1;
    }
    return 0;
}

/* Sum of squares of the payload's values, in the order mq_quant_sum_sq takes, so sender and
 * receiver report the same. */
static double s_sum_sq(const uint8_t *src, size_t n)
{
    double s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        float v = mq_get_f32(src + 4 * i);
        s[i % 4] += (double)v * v;
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)c, (void)len;
    if (stats)
        stats->sq = s_sum_sq(src, n);
    size_t i = 0;
#if !S_BIG_ENDIAN
    if (!acc && scale == 1.0f) {
        memcpy(dst, src, 4 * n);
        return;
    }
    const mq_v4f_t vs = mq_v4f_set1(scale);
    for (; i + 4 <= n; i += 4) {
        mq_v4f_t v;
        memcpy(&v, src + 4 * i, sizeof v);
        v *= vs;
        if (acc)
            v += mq_v4f_load(dst + i);
        memcpy(dst + i, &v, sizeof v);
    }
#endif
    for (; i < n; i++) {
        float v = mq_get_f32(src + 4 * i);
        dst[i] = acc ? dst[i] + scale * v : scale * v;
    }
}

const mq_codec_ops_t mq_codec_none_ops = {
    .name = "none",
    .id = MQ_CODEC_NONE,
    .usage = "none",
    .help = "fp32, 4 bytes a value (no compression)",
    .unbiased = true,
    .exact_size = true,
    .max_size = s_max_size,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
