/* The codec interface: specs ("uniform:4:bucket=512"), argument checks and dispatch through
 * a codec's operations table, error feedback on top of any stateless codec, and the small
 * helpers every codec's file shares. Everything a caller passes is checked here, so a
 * codec's own functions can trust their arguments. */

#include <assert.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant_internal.h"

/* ---- helpers for the codecs' files ------------------------------------------------- */

/* ---- finiteness --------------------------------------------------------------------
 * v - v is +0 for every finite v and NaN for NaN and the infinities, so summing it flags a
 * bad value without a branch per element; only then do we look for the index. */

static bool s_lanes_zero(mq_v4f_t v)
{
    return v[0] == 0.0f && v[1] == 0.0f && v[2] == 0.0f && v[3] == 0.0f;
}

size_t mq_quant_first_nonfinite(const float *x, size_t n)
{
    mq_v4f_t acc0 = mq_v4f_set1(0), acc1 = acc0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        mq_v4f_t a = mq_v4f_load(x + i), b = mq_v4f_load(x + i + 4);
        acc0 += a - a;
        acc1 += b - b;
    }
    float tail = 0.0f;
    for (size_t k = i; k < n; k++)
        tail += x[k] - x[k];
    if (tail == 0.0f && s_lanes_zero(acc0 + acc1))
        return n;
    for (i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return n; /* unreachable: some value made the sum NaN */
}

size_t mq_quant_first_nonfinite_sum(const float *a, const float *b, size_t n)
{
    mq_v4f_t acc0 = mq_v4f_set1(0), acc1 = acc0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        mq_v4f_t u = mq_v4f_load(a + i) + mq_v4f_load(b + i);
        mq_v4f_t v = mq_v4f_load(a + i + 4) + mq_v4f_load(b + i + 4);
        acc0 += u - u;
        acc1 += v - v;
    }
    float tail = 0.0f;
    for (size_t k = i; k < n; k++) {
        float v = a[k] + b[k];
        tail += v - v;
    }
    if (tail == 0.0f && s_lanes_zero(acc0 + acc1))
        return n;
    for (i = 0; i < n; i++)
        if (!isfinite(a[i] + b[i]))
            return i;
    return n;
}

int mq_quant_check_finite(const char *who, const float *x, size_t n)
{
    size_t bad = mq_quant_first_nonfinite(x, n);
    if (bad < n) {
        mq_err_set("%s: value %zu of %zu is %s (expected finite numbers)", who, bad, n,
                   isnan(x[bad]) ? "NaN" : "infinite");
        return -1;
    }
    return 0;
}

int mq_quant_check_finite_sum(const char *who, const float *g, const float *r, size_t n)
{
    size_t bad = mq_quant_first_nonfinite_sum(g, r, n);
    if (bad < n) {
        mq_err_set("%s: gradient + residual at value %zu of %zu is not finite (gradient %g, "
                   "residual %g)",
                   who, bad, n, (double)g[bad], (double)r[bad]);
        return -1;
    }
    return 0;
}

bool mq_quant_ef_nonfinite(const char *who, const float *g, const float *e, float r, size_t m,
                           size_t at, size_t n)
{
    for (size_t i = 0; i < m; i++) {
        if (isfinite(g[i] + r * e[i]))
            continue;
        if (!isfinite(g[i]))
            mq_err_set("%s: value %zu of %zu is %s (expected finite numbers)", who, at + i, n,
                       isnan(g[i]) ? "NaN" : "infinite");
        else
            mq_err_set("%s: gradient + residual at value %zu of %zu is not finite (gradient %g, "
                       "residual %g, residual factor %g)",
                       who, at + i, n, (double)g[i], (double)e[i], (double)r);
        return true;
    }
    return false;
}

double mq_quant_sum_sq(const float *x, size_t n)
{
    double s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++)
        s[i % 4] += (double)x[i] * x[i];
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* ---- payloads of little-endian float32 --------------------------------------------------
 * A payload may be unaligned (a ZeroMQ frame), so lanes are loaded with memcpy; on a
 * little-endian host its floats are this host's and load straight from the bytes. */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define S_LITTLE 1
#else
#define S_LITTLE 0
#endif

size_t mq_quant_first_bad_f32(const uint8_t *src, size_t n)
{
    size_t i = 0;
    bool any = false;
#if S_LITTLE
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

void mq_quant_decode_f32(const uint8_t *src, float *dst, size_t n, float scale, bool acc)
{
    size_t i = 0;
#if S_LITTLE
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
        float v = scale * mq_get_f32(src + 4 * i);
        dst[i] = acc ? dst[i] + v : v;
    }
}

double mq_quant_sq_f32(const uint8_t *src, size_t n)
{
    double s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double v = mq_get_f32(src + 4 * i);
        s[i % 4] += v * v;
    }
    return (s[0] + s[1]) + (s[2] + s[3]);
}

/* ---- specs ------------------------------------------------------------------------------ */

/* Puts "codec NAME: " before the last error; returns -1. */
static int s_err_codec(const char *name)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s", mq_err_last());
    mq_err_set("codec %s: %s", name, msg);
    return -1;
}

int mq_quant_opt_float(const char *codec, const char *opt, const char *val, double lo, double hi,
                       float *out)
{
    double d;
    if (mq_parse_double(opt, val, lo, hi, &d) < 0)
        return s_err_codec(codec);
    *out = (float)d;
    return 0;
}

int mq_quant_opt_u32(const char *codec, const char *opt, const char *val, long lo, long hi,
                     uint32_t *out)
{
    long l;
    if (mq_parse_long(opt, val, lo, hi, &l) < 0)
        return s_err_codec(codec);
    *out = (uint32_t)l;
    return 0;
}

int mq_quant_check_unused(const mq_codec_t *c, int first)
{
    for (int i = first; i < MQ_CODEC_NPARAMS; i++)
        if (c->param[i]) {
            mq_err_set("codec %s: parameter word %d is set (unused)", mq_codec_ops(c)->name, i);
            return -1;
        }
    return 0;
}

void mq_quant_format_float(char *buf, size_t len, float v, int digits)
{
    for (; digits <= 9; digits++) {
        snprintf(buf, len, "%.*g", digits, (double)v);
        if ((float)strtod(buf, NULL) == v)
            return;
    }
}

/* The option and check functions run on a codec whose id is set (mq_codec_parse sets it
 * first, mq_codec_validate looks it up), so the error can name it. */
int mq_quant_bucket_option(mq_codec_t *c, const char *opt)
{
    if (strncmp(opt, "bucket=", 7) == 0)
        return mq_quant_opt_u32(mq_codec_ops(c)->name, "bucket", opt + 7, 0, MQ_QUANT_BUCKET_MAX,
                                &c->param[0]);
    mq_err_set("unknown option '%s' (expected bucket=N)", opt);
    return -1;
}

void mq_quant_bucket_format(const mq_codec_t *c, char *buf, size_t len)
{
    const mq_codec_ops_t *ops = mq_codec_ops(c);
    mq_codec_t def = {.id = c->id};
    if (ops->defaults)
        ops->defaults(&def);
    if (c->param[0] != def.param[0])
        snprintf(buf, len, ":bucket=%u", (unsigned)c->param[0]);
    else if (len)
        buf[0] = 0;
}

int mq_quant_bucket_check(const mq_codec_t *c)
{
    return mq_quant_check_unused(c, 1);
}

bool mq_quant_always_stochastic(const mq_codec_t *c)
{
    (void)c;
    return true;
}

/* ---- the one-bit error-feedback codecs and the stochastic ones ---------------------------- */

size_t mq_quant_ef_state_floats(const mq_codec_t *c, size_t n)
{
    (void)c;
    return n ? n + 1 : 0;
}

void mq_quant_noise_seed(mq_quant_noise_t *g, mq_rng_t *rng)
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

float mq_codec_param_f(const mq_codec_t *c, int i)
{
    float v;
    memcpy(&v, &c->param[i], 4);
    return v;
}

void mq_codec_set_param_f(mq_codec_t *c, int i, float v)
{
    memcpy(&c->param[i], &v, 4);
}

size_t mq_codec_first_nonfinite(const float *x, size_t n)
{
    return mq_quant_first_nonfinite(x, n);
}

/* ---- codecs and specs -------------------------------------------------------------- */

/* C's table if C is a registered codec with valid parameters and a level in its range (BASE:
 * or none yet), else NULL with an error. */
static const mq_codec_ops_t *s_validate(const mq_codec_t *c, bool base)
{
    if (!c) {
        mq_err_set("codec: no codec given");
        return NULL;
    }
    const mq_codec_ops_t *ops = mq_codec_lookup(c->id);
    if (!ops) {
        mq_err_set("codec: unknown codec id %u", (unsigned)c->id);
        return NULL;
    }
    if (ops->max_bits == 0) {
        if (c->bits != 0 && !(c->id == MQ_CODEC_ID_none && c->bits == 32)) {
            mq_err_set("codec %s: takes no bit-width (got %d)", ops->name, c->bits);
            return NULL;
        }
    } else if (!(base && c->bits == 0) && (c->bits < ops->min_bits || c->bits > ops->max_bits)) {
        mq_err_set("codec %s: %d bits (expected %d..%d)", ops->name, c->bits, ops->min_bits,
                   ops->max_bits);
        return NULL;
    }
    return ops->check && ops->check(c) < 0 ? NULL : ops;
}

int mq_codec_validate(const mq_codec_t *c)
{
    return s_validate(c, false) ? 0 : -1;
}

int mq_codec_validate_base(const mq_codec_t *c)
{
    return s_validate(c, true) ? 0 : -1;
}

mq_codec_t mq_codec_none(void)
{
    return (mq_codec_t){.id = MQ_CODEC_ID_none, .bits = 32};
}

mq_codec_t mq_codec_uniform(int bits, uint32_t bucket, bool stochastic)
{
    return (mq_codec_t){.id = MQ_CODEC_ID_uniform, .bits = bits, .param = {bucket, stochastic}};
}

mq_codec_t mq_codec_with_bits(const mq_codec_t *base, int bits)
{
    if (bits >= 32)
        return mq_codec_none();
    mq_codec_t c = *base;
    const mq_codec_ops_t *ops = mq_codec_lookup(c.id);
    if (ops && ops->max_bits > 0)
        c.bits = bits;
    return c;
}

mq_codec_t mq_codec_reply(const mq_codec_t *c)
{
    const mq_codec_ops_t *ops = mq_codec_lookup(c->id);
    mq_codec_t out = *c;
    if (ops && ops->reply)
        ops->reply(c, &out);
    return out;
}

int mq_codec_parse(const char *spec, mq_codec_t *out)
{
    char buf[MQ_CODEC_MAX_SPEC], msg[256], names[256] = "";
    if (!spec || !*spec) {
        mq_err_set("codec: empty spec");
        return -1;
    }
    if (strlen(spec) >= sizeof buf) {
        mq_err_set("codec '%.32s...': spec too long", spec);
        return -1;
    }
    if (spec[0] == ':' || strstr(spec, "::") || spec[strlen(spec) - 1] == ':') {
        mq_err_set("codec '%s': empty field between ':'", spec);
        return -1;
    }
    strcpy(buf, spec);
    char *save = NULL;
    char *name = strtok_r(buf, ":", &save);
    const mq_codec_ops_t *ops = mq_codec_by_name(name);
    if (!ops) {
        size_t n;
        const mq_codec_ops_t *const *all = mq_codec_all(&n);
        for (size_t i = 0; i < n; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     all[i]->name);
        mq_err_set("codec '%s': unknown codec '%s' (expected one of %s)", spec, name, names);
        return -1;
    }
    mq_codec_t c = {.id = ops->id, .bits = ops->id == MQ_CODEC_ID_none ? 32 : 0};
    if (ops->defaults)
        ops->defaults(&c);
    char *opt = strtok_r(NULL, ":", &save);
    if (opt && ops->max_bits > 0 && opt[0] >= '0' && opt[0] <= '9' && !strchr(opt, '=')) {
        long k;
        if (mq_parse_long("bits", opt, ops->min_bits, ops->max_bits, &k) < 0) {
            snprintf(msg, sizeof msg, "%s", mq_err_last());
            mq_err_set("codec '%s': %s", spec, msg);
            return -1;
        }
        c.bits = (int)k;
        opt = strtok_r(NULL, ":", &save);
    }
    char seen[MQ_CODEC_MAX_SPEC] = ":"; /* ":key:key:" of the options applied so far */
    for (; opt; opt = strtok_r(NULL, ":", &save)) {
        char key[MQ_CODEC_MAX_SPEC];
        snprintf(key, sizeof key, ":%.*s:", (int)strcspn(opt, "="), opt);
        if (strstr(seen, key)) {
            mq_err_set("codec '%s': option '%s' given twice", spec, opt);
            return -1;
        }
        snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s", key + 1);
        if (!ops->option) {
            mq_err_set("codec '%s': %s takes no options (got '%s')", spec, ops->name, opt);
            return -1;
        }
        if (ops->option(&c, opt) < 0) {
            snprintf(msg, sizeof msg, "%s", mq_err_last());
            mq_err_set("codec '%s': %s (usage: %s)", spec, msg, ops->usage);
            return -1;
        }
    }
    if (mq_codec_validate_base(&c) < 0) {
        snprintf(msg, sizeof msg, "%s", mq_err_last());
        mq_err_set("codec '%s': %s", spec, msg);
        return -1;
    }
    *out = c;
    return 0;
}

bool mq_codec_equal(const mq_codec_t *a, const mq_codec_t *b)
{
    return a->id == b->id && a->bits == b->bits &&
           memcmp(a->param, b->param, sizeof a->param) == 0;
}

/* C's spec with its table OPS in hand (C already valid): no lookup. */
static void s_format_with(const mq_codec_ops_t *ops, const mq_codec_t *c, char *buf, size_t len)
{
    int w = ops->max_bits > 0 && c->bits > 0 ? snprintf(buf, len, "%s:%d", ops->name, c->bits)
                                             : snprintf(buf, len, "%s", ops->name);
    if (w >= 0 && (size_t)w < len && ops->format)
        ops->format(c, buf + w, len - (size_t)w);
}

/* C's spec when its table is OPS or none's, else its id. */
static void s_name_by(const mq_codec_t *c, const mq_codec_ops_t *ops, char *buf, size_t len)
{
    const mq_codec_ops_t *o = c->id == ops->id              ? ops
                              : c->id == MQ_CODEC_ID_none ? &mq_codec_none_ops
                                                           : NULL;
    if (o)
        s_format_with(o, c, buf, len);
    else
        snprintf(buf, len, "of id %u", (unsigned)c->id);
}

bool mq_codec_check(const mq_codec_t *got, const mq_codec_t *want, const mq_codec_ops_t *ops,
                    char *buf, size_t len)
{
    if (mq_codec_equal(got, want))
        return true;
    char g[MQ_CODEC_MAX_SPEC], e[MQ_CODEC_MAX_SPEC];
    s_name_by(got, ops, g, sizeof g);
    s_name_by(want, ops, e, sizeof e);
    snprintf(buf, len, "codec %s, expected %s", g, e);
    return false;
}

void mq_codec_format(const mq_codec_t *c, char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    const mq_codec_ops_t *ops = s_validate(c, true);
    if (!ops) {
        snprintf(buf, len, "invalid");
        return;
    }
    s_format_with(ops, c, buf, len);
}

size_t mq_codec_nbuckets(const mq_codec_t *c, size_t n)
{
    return c && c->id == MQ_CODEC_ID_uniform ? mq_quant_nbuckets(c->param[0], n) : 0;
}

size_t mq_codec_payload_size(const mq_codec_t *c, size_t n)
{
    const mq_codec_ops_t *ops = s_validate(c, false);
    return ops && n <= MQ_QUANT_MAX_N ? ops->max_size(c, n) : 0;
}

size_t mq_codec_state_floats(const mq_codec_t *c, size_t n)
{
    const mq_codec_ops_t *ops = mq_codec_ops(c);
    return ops && ops->state_floats ? ops->state_floats(c, n) : 0;
}

/* ---- encode ------------------------------------------------------------------------- */

/* C checked (BASE: as mq_codec_validate_base) for N values, and its table; NULL with an
 * error. */
static const mq_codec_ops_t *s_resolve(const mq_codec_t *c, size_t n, bool base)
{
    const mq_codec_ops_t *ops = s_validate(c, base);
    if (ops && n > MQ_QUANT_MAX_N) {
        mq_err_set("codec encode: %zu values is more than the %zu supported", n,
                   (size_t)MQ_QUANT_MAX_N);
        return NULL;
    }
    return ops;
}

const mq_codec_ops_t *mq_codec_resolve(const mq_codec_t *c, size_t n)
{
    return s_resolve(c, n, true);
}

/* Checks shared by every encode entry point; returns the codec's table, or NULL. */
static const mq_codec_ops_t *s_check_encode(const mq_codec_t *c, const float *src, size_t n,
                                            const mq_codec_ctx_t *ctx, const uint8_t *dst,
                                            size_t cap, const size_t *out_len)
{
    const mq_codec_ops_t *ops = s_resolve(c, n, false);
    if (!ops)
        return NULL;
    size_t need = ops->max_size(c, n);
    if (!out_len || (n && !src) || (need && !dst)) {
        mq_err_set("codec encode: NULL argument");
        return NULL;
    }
    if (cap < need) {
        mq_err_set("codec encode: %zu values need %zu bytes, buffer holds %zu", n, need, cap);
        return NULL;
    }
    if (n && ops->stochastic && ops->stochastic(c) && !(ctx && ctx->rng)) {
        mq_err_set("codec %s encode: needs a random generator", ops->name);
        return NULL;
    }
    if (n && ops->state_floats && ops->state_floats(c, n) && !(ctx && ctx->state)) {
        mq_err_set("codec %s encode: needs its state (%zu floats)", ops->name,
                   ops->state_floats(c, n));
        return NULL;
    }
    return ops;
}

/* Error feedback for a codec without its own encode_ef: v = src + residual is computed in
 * place in residual (SRC NULL: residual holds it already) and encoded, then the decoded
 * payload is subtracted from it (a decode with scale -1), so no temporary array is needed. */
static int s_ef_generic(const mq_codec_ops_t *ops, const mq_codec_t *c, const float *src,
                        float *residual, size_t n, const mq_codec_ctx_t *ctx, uint8_t *dst,
                        size_t *len, mq_codec_stats_t *stats)
{
    if (src ? mq_quant_check_finite_sum("codec encode", src, residual, n) < 0
            : mq_quant_check_finite("codec encode", residual, n) < 0)
        return -1;
    size_t i = 0;
    for (; src && i + 4 <= n; i += 4) {
        mq_v4f_t v = mq_v4f_load(residual + i) + mq_v4f_load(src + i);
        memcpy(residual + i, &v, sizeof v);
    }
    for (; src && i < n; i++)
        residual[i] += src[i];
    if (ops->encode(c, residual, n, ctx, dst, len, stats) < 0)
        return -1;
    ops->decode(c, dst, *len, residual, n, -1.0f, true, NULL);
    return 0;
}

int mq_codec_encode_resolved(const mq_codec_ops_t *ops, const mq_codec_t *c, const float *src,
                             float *residual, size_t n, const mq_codec_ctx_t *ctx, uint8_t *dst,
                             size_t *out_len, mq_codec_stats_t *stats)
{
    mq_codec_stats_t st = {0};
    size_t len = 0;
    if (n > 0 && !residual) {
        assert(!ctx->clear || ctx->clear == src);
        if (ops->encode(c, src, n, ctx, dst, &len, stats ? &st : NULL) < 0)
            return -1;
        if (ctx->clear && !ops->clears)
            memset(ctx->clear, 0, n * sizeof *ctx->clear);
    } else if (n > 0) {
        /* With one bit the levels are the bucket's min and max, and stochastic rounding
         * leaves a residual as large as the whole range: the residual's range can double
         * every step and reached infinity within a short run when measured (2+ bits shrink
         * it by >= 1/3 a step). Feedback already removes the bias stochastic rounding is
         * for, so round to nearest here rather than fail a run whose policy has just chosen
         * 1 bit. */
        mq_codec_t eff = *c;
        if (c->id == MQ_CODEC_ID_uniform && c->bits == 1 && c->param[1]) {
            static atomic_bool warned;
            eff.param[1] = 0;
            if (!atomic_exchange(&warned, true))
                mq_warn("quant: 1-bit error feedback rounds to nearest (stochastic rounding "
                        "would make the residual diverge)");
        }
        int rc = ops->encode_ef
                     ? ops->encode_ef(&eff, src, residual, n, ctx, dst, &len, stats ? &st : NULL)
                     : s_ef_generic(ops, &eff, src, residual, n, ctx, dst, &len,
                                    stats ? &st : NULL);
        if (rc < 0) { /* a sum that is not finite: error feedback starts over (quant.h) */
            memset(residual, 0, n * sizeof *residual);
            return -1;
        }
    }
    *out_len = len;
    if (stats)
        *stats = st;
    return 0;
}

int mq_codec_encode_ctx(const mq_codec_t *c, const float *src, size_t n,
                        const mq_codec_ctx_t *ctx, uint8_t *dst, size_t cap, size_t *out_len,
                        mq_codec_stats_t *stats)
{
    static const mq_codec_ctx_t none = {0};
    const mq_codec_ops_t *ops = s_check_encode(c, src, n, ctx, dst, cap, out_len);
    if (!ops)
        return -1;
    return mq_codec_encode_resolved(ops, c, src, NULL, n, ctx ? ctx : &none, dst, out_len,
                                    stats);
}

int mq_codec_encode(const mq_codec_t *c, const float *src, size_t n, uint8_t *dst, size_t cap,
                    size_t *out_len, mq_rng_t *rng, mq_codec_stats_t *stats)
{
    mq_codec_ctx_t ctx = {.rng = rng};
    return mq_codec_encode_ctx(c, src, n, &ctx, dst, cap, out_len, stats);
}

/* mq_codec_encode_ef and mq_codec_encode_ef_inplace (SRC NULL: residual holds the sums): the
 * arguments are checked before residual changes. */
static int s_encode_ef(const mq_codec_t *c, const float *src, float *residual, size_t n,
                       uint8_t *dst, size_t cap, size_t *out_len, mq_rng_t *rng,
                       mq_codec_stats_t *stats)
{
    mq_codec_ctx_t ctx = {.rng = rng};
    const mq_codec_ops_t *ops =
        s_check_encode(c, src ? src : residual, n, &ctx, dst, cap, out_len);
    if (!ops)
        return -1;
    if (ops->state_floats && ops->state_floats(c, n)) {
        mq_err_set("codec %s keeps its own residual: error feedback does not apply", ops->name);
        return -1;
    }
    if (n && !residual) {
        mq_err_set("codec encode: NULL residual");
        return -1;
    }
    return mq_codec_encode_resolved(ops, c, src, residual, n, &ctx, dst, out_len, stats);
}

int mq_codec_encode_ef(const mq_codec_t *c, const float *src, float *residual, size_t n,
                       uint8_t *dst, size_t cap, size_t *out_len, mq_rng_t *rng,
                       mq_codec_stats_t *stats)
{
    if (n && !src) {
        mq_err_set("codec encode: NULL argument");
        return -1;
    }
    return s_encode_ef(c, src, residual, n, dst, cap, out_len, rng, stats);
}

int mq_codec_encode_ef_inplace(const mq_codec_t *c, float *v, size_t n, uint8_t *dst, size_t cap,
                               size_t *out_len, mq_rng_t *rng, mq_codec_stats_t *stats)
{
    return s_encode_ef(c, NULL, v, n, dst, cap, out_len, rng, stats);
}

/* ---- decode ------------------------------------------------------------------------- */

bool mq_codec_size_ok(const mq_codec_t *c, size_t len, size_t n)
{
    const mq_codec_ops_t *ops = mq_codec_ops(c);
    if (!ops || n > MQ_QUANT_MAX_N)
        return false;
    size_t max = ops->max_size(c, n);
    return ops->exact_size ? len == max : len <= max;
}

int mq_codec_validate_payload(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    const mq_codec_ops_t *ops = s_validate(c, false);
    if (!ops)
        return -1;
    if (n > MQ_QUANT_MAX_N) {
        mq_err_set("codec decode: %zu values is more than the %zu supported", n,
                   (size_t)MQ_QUANT_MAX_N);
        return -1;
    }
    size_t max = ops->max_size(c, n);
    if (ops->exact_size ? len != max : len > max) { /* mq_codec_size_ok, on the table in hand */
        char spec[MQ_CODEC_MAX_SPEC];
        mq_codec_format(c, spec, sizeof spec);
        mq_err_set("%s: payload of %zu bytes for %zu values (expected %s %zu)", spec, len, n,
                   ops->exact_size ? "exactly" : "at most", max);
        return -1;
    }
    if (n == 0)
        return 0;
    if (!src) {
        mq_err_set("codec decode: NULL payload");
        return -1;
    }
    return ops->validate(c, src, len, n);
}

void mq_codec_decode_valid(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst,
                           size_t n, float scale, bool accumulate, mq_codec_stats_t *stats)
{
    if (n == 0) {
        if (stats)
            stats->sq = 0.0;
        return;
    }
    mq_codec_lookup(c->id)->decode(c, src, len, dst, n, scale, accumulate, stats);
}

int mq_codec_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                    float scale, bool accumulate, mq_codec_stats_t *stats)
{
    if (mq_codec_validate_payload(c, src, len, n) < 0)
        return -1;
    if (!isfinite(scale)) {
        mq_err_set("codec decode: scale %g is not finite", (double)scale);
        return -1;
    }
    if (n && !dst) {
        mq_err_set("codec decode: NULL argument");
        return -1;
    }
    mq_codec_decode_valid(c, src, len, dst, n, scale, accumulate, stats);
    return 0;
}
