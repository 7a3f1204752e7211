/* The `sparse` codec: an exact (lossless) encoding of a vector's nonzeros, and the sparse
 * payload format, selection passes and option tables that topk, dgc and sdagc share
 * (sparse_fmt.h describes the payload). It is what a server replies to those codecs with:
 * the mean of P sparse pushes is the union of their indices, which cannot be sparsified
 * again without loss, so it goes back exactly.
 *
 * Spec: "sparse" (no options, no level; every parameter word 0). No state, no randomness.
 * Payload: sparse_fmt.h's layouts, the smallest of the three for each vector (ties go to
 * dense, then bitmap: the faster to decode). Zeros of either sign are not sent.
 *
 * Choices (measured on Gaussian values at random positions, one core; the figures are in
 * bench/README.md):
 *  - Index coding. At the densities sparsification runs at, the delta layout takes fewer bytes
 *    a value than 8 for (u32 index, f32 value) pairs and 4 + n/(8k) for a bitmap. What it
 *    costs in decode (where clearing dst dominates), accumulation and validation time against
 *    pairs is less than the bytes it saves take on a 1 Gbit/s link. So delta below ~12%
 *    density, the map above, floats above ~97%.
 *  - Values apart from indices, in one block: validation scans them for NaN in one vector
 *    pass, and stats sum them in payload order on both sides, so sender and receiver agree
 *    to the bit (a dense payload's sum is taken from its bytes on both sides too).
 *  - Encode: one vector pass counts the nonzeros, which with n decides the layout (except
 *    between 11.7% and 12.5% density, where a walk counts the gap bytes first), then one
 *    pass writes, visiting only blocks of eight that hold a nonzero.
 *  - Decode without accumulate clears dst, then scatters (one memset is cheaper than
 *    filling the gaps between indices). */

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sparse_fmt.h"

/* ---- layout sizes ------------------------------------------------------------------- */

static size_t s_varint_len(size_t gap)
{
    return 1 + (gap >= (1u << 7)) + (gap >= (1u << 14)) + (gap >= (1u << 21)) +
           (gap >= (1u << 28));
}

static size_t s_bitmap_size(size_t n, size_t k)
{
    return MQ_SPARSE_HDR + 4 * k + (n + 7) / 8;
}

/* The smallest layout for K nonzeros of N values, from K alone when that decides it: dense
 * when no larger than the map; the map when k >= n/8 (every gap takes a byte at least);
 * delta when k <= n/8 - n/127, because gaps of 2 bytes or more are >= 128 positions apart,
 * so the gaps take under k + n/127 bytes. Between the two (11.7%-12.5% density) it depends
 * on the gaps: -1, the caller counts them (s_walk) and asks s_layout_exact. */
static int s_layout(size_t n, size_t k)
{
    if (mq_sparse_max_size(n) <= s_bitmap_size(n, k))
        return MQ_SPARSE_DENSE;
    if (k >= (n + 7) / 8)
        return MQ_SPARSE_BITMAP;
    return k + (n + 126) / 127 <= n / 8 ? MQ_SPARSE_DELTA : -1;
}

/* The same once the delta layout's gap bytes G are known (ties go to the map). */
static uint32_t s_layout_exact(size_t n, size_t k, size_t g)
{
    return s_bitmap_size(n, k) <= MQ_SPARSE_HDR + 4 * k + g ? MQ_SPARSE_BITMAP : MQ_SPARSE_DELTA;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define S_LITTLE 1 /* payload floats are this host's: vector loads straight from the bytes */
#else
#define S_LITTLE 0
#endif

/* Sum of squares of the n little-endian f32 at src, in double, eight chains (value i in
 * chain i % 8) added up in a fixed order: a dense payload's stats, which sender and
 * receiver both take from the payload's bytes, so they agree to the bit. */
static double s_sq_dense(const uint8_t *src, size_t n)
{
    typedef double s_v2d_t __attribute__((vector_size(16)));
    s_v2d_t a[4] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}};
    size_t i = 0;
#if S_LITTLE
    for (; i + 8 <= n; i += 8) {
        mq_v4f_t p, q;
        memcpy(&p, src + 4 * i, sizeof p);
        memcpy(&q, src + 4 * i + 16, sizeof q);
        s_v2d_t p0 = {p[0], p[1]}, p1 = {p[2], p[3]}, q0 = {q[0], q[1]}, q1 = {q[2], q[3]};
        a[0] += p0 * p0, a[1] += p1 * p1, a[2] += q0 * q0, a[3] += q1 * q1;
    }
#endif
    for (; i < n; i++) {
        double v = mq_get_f32(src + 4 * i);
        a[(i & 7) >> 1][i & 1] += v * v;
    }
    s_v2d_t t = (a[0] + a[1]) + (a[2] + a[3]);
    return t[0] + t[1];
}

/* ---- writing -------------------------------------------------------------------------- */

typedef struct {
    uint8_t *dst, *val, *idx;
    size_t n, k, j, prev;
    uint32_t layout;
    double sq[4];
} s_writer_t;

static void s_begin(s_writer_t *w, uint8_t *dst, size_t n, size_t k, uint32_t layout)
{
    *w = (s_writer_t){.dst = dst, .n = n, .k = k, .layout = layout};
    mq_put_u32(dst, layout);
    if (layout == MQ_SPARSE_DENSE) {
        memset(dst + 4, 0, 4 * n); /* all-zero bytes are +0.0f */
        return;
    }
    mq_put_u32(dst + 4, (uint32_t)k);
    w->val = dst + MQ_SPARSE_HDR;
    w->idx = w->val + 4 * k;
    if (layout == MQ_SPARSE_BITMAP)
        memset(w->idx, 0, (n + 7) / 8);
}

/* Value V at index I; indices come in increasing order. Stats: four chains by position in
 * the value block, as decode sums them (a dense payload's are summed at the end). */
static inline void s_put(s_writer_t *w, size_t i, float v)
{
    if (w->layout == MQ_SPARSE_DENSE) {
        mq_put_f32(w->dst + 4 + 4 * i, v);
        return;
    }
    w->sq[w->j & 3] += (double)v * v;
    mq_put_f32(w->val + 4 * w->j++, v);
    if (w->layout == MQ_SPARSE_BITMAP) {
        w->idx[i >> 3] |= (uint8_t)(1u << (i & 7));
        return;
    }
    uint32_t gap = (uint32_t)(i - w->prev);
    w->prev = i;
    for (; gap >= 0x80; gap >>= 7)
        *w->idx++ = (uint8_t)(gap | 0x80);
    *w->idx++ = (uint8_t)gap;
}

static size_t s_end(const s_writer_t *w, mq_codec_stats_t *stats)
{
    if (w->layout == MQ_SPARSE_DENSE) {
        if (stats)
            stats->sq = s_sq_dense(w->dst + 4, w->n);
        return mq_sparse_max_size(w->n);
    }
    if (stats)
        stats->sq = (w->sq[0] + w->sq[1]) + (w->sq[2] + w->sq[3]);
    assert(w->j == w->k);
    if (w->layout == MQ_SPARSE_BITMAP)
        return s_bitmap_size(w->n, w->k);
    return (size_t)(w->idx - w->dst);
}

/* ---- validation ------------------------------------------------------------------------ */

static uint64_t s_get_u64(const uint8_t *p)
{
    return (uint64_t)mq_get_u32(p) | (uint64_t)mq_get_u32(p + 4) << 32;
}

static int s_check_bitmap(const char *who, const uint8_t *map, size_t n, size_t k)
{
    size_t nb = (n + 7) / 8, ones = 0, q = 0;
    for (; q + 8 <= nb; q += 8)
        ones += (size_t)__builtin_popcountll(s_get_u64(map + q));
    for (; q < nb; q++)
        ones += (size_t)__builtin_popcount(map[q]);
    if (n % 8 && map[nb - 1] >> (n % 8)) {
        mq_err_set("%s: bitmap marks indices past the %zu values", who, n);
        return -1;
    }
    if (ones != k) {
        mq_err_set("%s: bitmap marks %zu indices but the count says %zu", who, ones, k);
        return -1;
    }
    return 0;
}

static int s_check_delta(const char *who, const uint8_t *p, const uint8_t *end, size_t n,
                         size_t k)
{
    size_t pos = 0;
    for (size_t j = 0; j < k; j++) {
        uint32_t gap, byte;
        if (p < end && *p < 0x80) { /* the common one-byte gap */
            gap = *p++;
        } else {
            int b = 0;
            gap = 0;
            do {
                if (p == end) {
                    mq_err_set("%s: payload ends inside index %zu of %zu (count inconsistent "
                               "with the length)",
                               who, j, k);
                    return -1;
                }
                byte = *p++;
                if (b == 4 && byte > 0x0f) {
                    mq_err_set("%s: gap of index %zu of %zu is longer than 32 bits", who, j, k);
                    return -1;
                }
                gap |= (byte & 0x7fu) << (7 * b++);
            } while (byte & 0x80);
            if (byte == 0) {
                mq_err_set("%s: gap of index %zu of %zu has a redundant byte", who, j, k);
                return -1;
            }
        }
        if (j > 0 && gap == 0) {
            mq_err_set("%s: index %zu of %zu repeats index %zu (expected strictly increasing "
                       "indices)",
                       who, j, k, pos);
            return -1;
        }
        pos += gap;
        if (pos >= n) {
            mq_err_set("%s: index %zu of %zu is %zu, out of range for %zu values", who, j, k, pos,
                       n);
            return -1;
        }
    }
    if (p != end) {
        mq_err_set("%s: %zu bytes after the last of %zu indices (count inconsistent with the "
                   "length)",
                   who, (size_t)(end - p), k);
        return -1;
    }
    return 0;
}

int mq_sparse_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    const char *who = mq_codec_ops(c)->name;
    if (len < 4) {
        mq_err_set("%s: payload of %zu bytes has no layout tag (expected at least 4)", who, len);
        return -1;
    }
    uint32_t tag = mq_get_u32(src);
    if (tag == MQ_SPARSE_DENSE) {
        if (len != mq_sparse_max_size(n)) {
            mq_err_set("%s: dense payload of %zu bytes for %zu values (expected %zu)", who, len, n,
                       mq_sparse_max_size(n));
            return -1;
        }
        size_t bad = mq_quant_first_bad_f32(src + 4, n);
        if (bad < n) {
            mq_err_set("%s: value %zu of %zu is not finite", who, bad, n);
            return -1;
        }
        return 0;
    }
    if (tag != MQ_SPARSE_DELTA && tag != MQ_SPARSE_BITMAP) {
        mq_err_set("%s: unknown layout tag %u (expected 0 dense, 1 delta or 2 bitmap)", who,
                   (unsigned)tag);
        return -1;
    }
    if (len < MQ_SPARSE_HDR) {
        mq_err_set("%s: payload of %zu bytes is shorter than its 8-byte header", who, len);
        return -1;
    }
    if (n > MQ_SPARSE_MAX_N) {
        mq_err_set("%s: %zu values is more than a sparse layout indexes", who, n);
        return -1;
    }
    size_t k = mq_get_u32(src + 4);
    if (k > n) {
        mq_err_set("%s: count %zu is more than the %zu values", who, k, n);
        return -1;
    }
    if ((len - MQ_SPARSE_HDR) / 4 < k) {
        mq_err_set("%s: count %zu needs %zu bytes of values, the payload has %zu after its "
                   "header (count inconsistent with the length)",
                   who, k, 4 * k, len - MQ_SPARSE_HDR);
        return -1;
    }
    size_t bad = mq_quant_first_bad_f32(src + MQ_SPARSE_HDR, k);
    if (bad < k) {
        mq_err_set("%s: value %zu of %zu is not finite", who, bad, k);
        return -1;
    }
    const uint8_t *idx = src + MQ_SPARSE_HDR + 4 * k;
    if (tag == MQ_SPARSE_DELTA)
        return s_check_delta(who, idx, src + len, n, k);
    if (len != s_bitmap_size(n, k)) {
        mq_err_set("%s: bitmap payload of %zu bytes for %zu of %zu values (expected %zu: count "
                   "inconsistent with the length)",
                   who, len, k, n, s_bitmap_size(n, k));
        return -1;
    }
    return s_check_bitmap(who, idx, n, k);
}

/* ---- decoding --------------------------------------------------------------------------- */

void mq_sparse_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                      float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)c, (void)len;
    uint32_t tag = mq_get_u32(src);
    if (tag == MQ_SPARSE_DENSE) {
        if (stats)
            stats->sq = s_sq_dense(src + 4, n);
        mq_quant_decode_f32(src + 4, dst, n, scale, acc);
        return;
    }
    size_t k = mq_get_u32(src + 4);
    const uint8_t *val = src + MQ_SPARSE_HDR, *idx = val + 4 * k;
    if (!acc)
        memset(dst, 0, 4 * n);
    if (tag == MQ_SPARSE_DELTA) {
        size_t pos = 0;
        for (size_t j = 0; j < k; j++) {
            uint32_t gap = *idx++;
            if (gap & 0x80) {
                gap &= 0x7f;
                for (int sh = 7;; sh += 7) {
                    uint32_t b = *idx++;
                    gap |= (b & 0x7f) << sh;
                    if (!(b & 0x80))
                        break;
                }
            }
            pos += gap;
            dst[pos] += scale * mq_get_f32(val + 4 * j);
        }
    } else {
        size_t nb = (n + 7) / 8, j = 0;
        for (size_t q = 0; q < nb; q += 8) {
            uint64_t w = 0;
            if (q + 8 <= nb)
                w = s_get_u64(idx + q);
            else
                for (size_t b = q; b < nb; b++)
                    w |= (uint64_t)idx[b] << (8 * (b - q));
            for (; w; w &= w - 1, j++)
                dst[8 * q + (size_t)__builtin_ctzll(w)] += scale * mq_get_f32(val + 4 * j);
        }
    }
    if (stats)
        stats->sq = mq_quant_sq_f32(val, k);
}

/* ---- writing what a selection picks --------------------------------------------------- */

/* Visiting the values a selection picks, in index order: with a writer W, writing them and
 * clearing them in CLR and U (either may be NULL); without, counting the bytes of their
 * LEB128 gaps into G. */
typedef struct {
    const float *x;
    uint32_t thr;
    size_t take, left, g, prev;
    s_writer_t *w;
    float *clr, *u;
} s_walk_t;

static inline void s_visit(s_walk_t *k, size_t t)
{
    uint32_t m = mq_sparse_mag(k->x[t]);
    if (m < k->thr || (m == k->thr && !k->take))
        return;
    k->take -= m == k->thr;
    k->left--;
    if (!k->w) {
        k->g += s_varint_len(t - k->prev);
        k->prev = t;
        return;
    }
    s_put(k->w, t, k->x[t]);
    if (k->clr)
        k->clr[t] = 0.0f;
    if (k->u)
        k->u[t] = 0.0f;
}

/* Visits what SEL picks from x[0..n), among the candidates C when not NULL, else among all
 * values; returns the gap bytes when W is NULL. */
static size_t s_walk(const float *x, size_t n, const mq_sparse_sel_t *sel,
                     const mq_sparse_cand_t *c, s_writer_t *w, float *clr, float *u)
{
    s_walk_t k = {.x = x, .thr = sel->thr, .take = sel->thr ? sel->take_eq : 0,
                  .left = sel->count, .w = w, .clr = clr, .u = u};
    if (c) { /* a candidate's line is rarely cached: ask for the ones ahead early */
        for (size_t j = 0; k.left && j < c->m; j++) {
            if (j + 16 < c->m)
                __builtin_prefetch(x + c->idx[j + 16], 1);
            s_visit(&k, c->idx[j]);
        }
        return k.g;
    }
    /* Lanes above CMP may be picked: above THR, or equal to it when ties are taken. */
    const int32_t cmp = (int32_t)(k.take ? k.thr - 1 : k.thr);
    size_t i = 0;
    for (; k.left && i + 8 <= n; i += 8)
        for (unsigned bits = mq_sparse_mask8(x + i, cmp); bits; bits &= bits - 1)
            s_visit(&k, i + (size_t)__builtin_ctz(bits));
    for (; k.left && i < n; i++)
        s_visit(&k, i);
    return k.g;
}

size_t mq_sparse_emit(float *v, float *u, size_t n, const mq_sparse_sel_t *sel,
                      const mq_sparse_cand_t *c, uint8_t *dst, mq_codec_stats_t *stats)
{
    size_t k = sel->count;
    int layout = s_layout(n, k);
    /* The candidates' indices sit at the end of dst: walk them only while the payload,
     * written from the start, cannot reach them. */
    size_t room = c ? (size_t)((uint8_t *)c->idx - dst) : 0;
    size_t most = MQ_SPARSE_HDR + 4 * k + (5 * k > (n + 7) / 8 ? 5 * k : (n + 7) / 8);
    if (!c || c->m > c->cap || layout == MQ_SPARSE_DENSE || most > room)
        c = NULL;
    if (layout < 0)
        layout = (int)s_layout_exact(n, k, s_walk(v, n, sel, c, NULL, NULL, NULL));
    s_writer_t w;
    s_begin(&w, dst, n, k, (uint32_t)layout);
    s_walk(v, n, sel, c, &w, v, u);
    return s_end(&w, stats);
}

/* ---- what dgc and sdagc share ----------------------------------------------------------- */

/* Sum of squares in float lanes per chunk of 1024, added up in double: fast, and within
 * float precision of the exact sum (what a clip factor needs). Infinite or NaN on a
 * non-finite value or a chunk whose float sum overflows; the caller then looks closer. */
static double s_sum_sq_fast(const float *x, size_t n)
{
    double s = 0.0;
    size_t i = 0;
    while (i + 8 <= n) {
        size_t end = n - i > 1024 ? i + 1024 : n - (n - i) % 8;
        mq_v4f_t a0 = mq_v4f_set1(0), a1 = a0;
        for (; i < end; i += 8) {
            mq_v4f_t p = mq_v4f_load(x + i), q = mq_v4f_load(x + i + 4);
            a0 += p * p;
            a1 += q * q;
        }
        a0 += a1;
        s += (double)((a0[0] + a0[1]) + (a0[2] + a0[3]));
    }
    for (; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

int mq_sparse_clip_scale(const char *who, const float *g, size_t n, float clip, float *scale)
{
    *scale = 1.0f;
    if (clip <= 0.0f)
        return mq_quant_check_finite(who, g, n);
    double sq = s_sum_sq_fast(g, n);
    if (!isfinite(sq)) {
        if (mq_quant_check_finite(who, g, n) < 0)
            return -1;
        sq = mq_quant_sum_sq(g, n);
    }
    double norm = sqrt(sq);
    if (norm > clip)
        *scale = (float)(clip / norm);
    return 0;
}

int mq_sparse_check_n(const char *who, size_t n)
{
    if (n > MQ_SPARSE_MAX_N) {
        mq_err_set("%s: %zu values is more than the %zu a sparse payload indexes", who, n,
                   MQ_SPARSE_MAX_N);
        return -1;
    }
    return 0;
}

/* ---- spec options ----------------------------------------------------------------------- */

/* An unbounded option still stops at what a spec can give (mq_sparse_option). */
#define S_OPT_MAX 1e30

static bool s_in_range(const mq_sparse_param_t *p, float f)
{
    return isfinite(f) && (p->lo_open ? f > p->lo : f >= p->lo) &&
           (p->hi_open ? f < p->hi : f <= p->hi) && (!p->integral || f == floorf(f)) &&
           f <= (float)S_OPT_MAX;
}

static void s_range_text(const mq_sparse_param_t *p, char *buf, size_t len)
{
    if (p->integral)
        snprintf(buf, len, "%s = %g..%g", p->key, (double)p->lo, (double)p->hi);
    else if (isinf(p->hi))
        snprintf(buf, len, "%s %s %g", p->key, p->lo_open ? ">" : ">=", (double)p->lo);
    else
        snprintf(buf, len, "%g %s %s %s %g", (double)p->lo, p->lo_open ? "<" : "<=", p->key,
                 p->hi_open ? "<" : "<=", (double)p->hi);
}

void mq_sparse_defaults(const mq_sparse_spec_t *s, mq_codec_t *c)
{
    for (size_t i = 0; i < s->np; i++)
        mq_codec_set_param_f(c, s->p[i].word, s->p[i].def);
}

int mq_sparse_option(const mq_sparse_spec_t *s, mq_codec_t *c, const char *opt)
{
    const char *eq = strchr(opt, '=');
    for (size_t i = 0; eq && i < s->np; i++) {
        const mq_sparse_param_t *p = &s->p[i];
        if (strlen(p->key) != (size_t)(eq - opt) || strncmp(opt, p->key, strlen(p->key)) != 0)
            continue;
        float f;
        char range[96];
        double hi = isinf(p->hi) ? S_OPT_MAX : p->hi;
        if (mq_quant_opt_float(s->codec, p->key, eq + 1, p->lo, hi, &f) < 0)
            return -1;
        f += 0.0f; /* -0 is 0 */
        if (!s_in_range(p, f)) {
            s_range_text(p, range, sizeof range);
            mq_err_set("codec %s: %s is out of range (expected %s)", s->codec, opt, range);
            return -1;
        }
        mq_codec_set_param_f(c, p->word, f);
        return 0;
    }
    char keys[128] = "";
    for (size_t i = 0; i < s->np; i++)
        snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s%s=", i ? ", " : "",
                 s->p[i].key);
    mq_err_set("unknown option '%s' (expected %s)", opt, s->np ? keys : "none");
    return -1;
}

void mq_sparse_format(const mq_sparse_spec_t *s, const mq_codec_t *c, char *buf, size_t len)
{
    size_t w = 0;
    if (len)
        buf[0] = 0;
    for (size_t i = 0; i < s->np && w < len; i++) {
        const mq_sparse_param_t *p = &s->p[i];
        float f = mq_codec_param_f(c, p->word);
        if (f == p->def)
            continue;
        char num[32];
        mq_quant_format_float(num, sizeof num, f, 1);
        int k = snprintf(buf + w, len - w, ":%s=%s", p->key, num);
        if (k < 0)
            return;
        w += (size_t)k;
    }
}

int mq_sparse_check(const mq_sparse_spec_t *s, const mq_codec_t *c)
{
    bool used[MQ_CODEC_NPARAMS] = {false};
    char range[96];
    for (size_t i = 0; i < s->np; i++) {
        const mq_sparse_param_t *p = &s->p[i];
        float f = mq_codec_param_f(c, p->word);
        used[p->word] = true;
        if (!s_in_range(p, f) || (f == 0.0f && signbit(f))) { /* options never write -0 */
            s_range_text(p, range, sizeof range);
            mq_err_set("codec %s: %s is %g (expected %s)", s->codec, p->key, (double)f, range);
            return -1;
        }
    }
    for (int i = 0; i < MQ_CODEC_NPARAMS; i++)
        if (!used[i] && c->param[i]) {
            mq_err_set("codec %s: parameter word %d is set (unused)", s->codec, i);
            return -1;
        }
    return 0;
}

void mq_sparse_reply(const mq_codec_t *c, mq_codec_t *out)
{
    (void)c;
    *out = (mq_codec_t){.id = MQ_CODEC_ID_sparse};
}

size_t mq_sparse_payload_max(const mq_codec_t *c, size_t n)
{
    (void)c;
    return mq_sparse_max_size(n);
}

/* ---- the sparse codec ------------------------------------------------------------------- */

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *len, mq_codec_stats_t *stats)
{
    (void)c, (void)ctx;
    uint32_t max;
    size_t k = mq_sparse_count_above(src, n, 0, &max);
    if (max >= 0x7f800000u)
        return mq_quant_check_finite("sparse encode", src, n);
    int layout = n > MQ_SPARSE_MAX_N ? MQ_SPARSE_DENSE : s_layout(n, k);
    mq_sparse_sel_t all = {.thr = 0, .take_eq = 0, .count = k}; /* every nonzero */
    if (layout < 0)
        layout = (int)s_layout_exact(n, k, s_walk(src, n, &all, NULL, NULL, NULL, NULL));
    if (layout == MQ_SPARSE_DENSE) { /* every value, -0 as +0 (x + 0 is x otherwise) */
        mq_put_u32(dst, MQ_SPARSE_DENSE);
        size_t i = 0;
#if S_LITTLE
        for (; i + 4 <= n; i += 4) {
            mq_v4f_t v = mq_v4f_load(src + i) + mq_v4f_set1(0.0f);
            memcpy(dst + 4 + 4 * i, &v, sizeof v);
        }
#endif
        for (; i < n; i++)
            mq_put_f32(dst + 4 + 4 * i, src[i] + 0.0f);
        if (stats) /* from the payload, as decode takes them */
            stats->sq = s_sq_dense(dst + 4, n);
        *len = mq_sparse_max_size(n);
        return 0;
    }
    s_writer_t w;
    s_begin(&w, dst, n, k, (uint32_t)layout);
    s_walk(src, n, &all, NULL, &w, NULL, NULL);
    *len = s_end(&w, stats);
    return 0;
}

static int s_check(const mq_codec_t *c)
{
    return mq_quant_check_unused(c, 0);
}

const mq_codec_ops_t mq_codec_sparse_ops = {
    .name = "sparse",
    .id = MQ_CODEC_ID_sparse,
    .usage = "sparse",
    .help = "exact nonzeros: LEB128 index gaps, a bitmap or fp32, whichever is smallest",
    .unbiased = true,
    .exact_size = false,
    .check = s_check,
    .max_size = mq_sparse_payload_max,
    .encode = s_encode,
    .validate = mq_sparse_validate,
    .decode = mq_sparse_decode,
};
