/* The `topk` codec: top-k sparsification with error feedback. Each encode adds the
 * gradient to the residual the previous ones left, sends the k values of largest magnitude
 * exactly, and keeps the rest as the new residual (Aji & Heafield, "Sparse Communication for
 * Distributed Gradient Descent", EMNLP 2017; Stich, Cordonnier & Jaggi, "Sparsified SGD with
 * Memory", NeurIPS 2018).
 *
 * Spec: topk[:ratio=R]   k = max(1, ceil(R * n)), 0 < R <= 1, default 0.01. No level.
 * Parameter words: 0 = R as a float; the others 0.
 * State (n floats, zero at the start): the residual r.
 * Payload: the sparse format of sparse_fmt.h; a server replies with `sparse` (the mean of
 * top-k pushes is the union of their indices, which only an exact sparse vector holds).
 *
 * Per encode, with v = r + g:  send the k largest |v| exactly;  r = v - sent, which is 0
 * where a value was sent and v elsewhere, so decode(payload) + new r == old r + g holds
 * bit for bit.
 *
 * Choices:
 *  - Exact selection in O(n), no sort, no allocation: a radix select on the magnitudes' bit
 *    patterns (the integer order of a non-negative float's bits is its numeric order). A
 *    deterministic strided sample (about 64 values above the k-th, at least 4096, at most
 *    n/8), taken in the pass that adds g to r while each chunk is in cache, gives a bound
 *    four standard deviations below the k-th largest. One read pass copies the values above
 *    it (~1.5 k) and their indices into the payload buffer (it holds n u32 and is free until
 *    the payload is written); three radix levels (11, 11, 9 bits) find the k-th exactly
 *    among them; the payload is written from that list, with no other pass over r. When
 *    the bound fails (data arranged against the stride) a histogram pass of 1/8-octave bins
 *    gives one, and when too many values tie above it the writing scans all of r: exact
 *    either way, only slower. The usual path (NaN check, accumulation, one read pass, the
 *    writing) measured much faster than a histogram pass, a copy of the k-th's bin and a scan
 *    to write (bench/README.md).
 *  - Ties at the k-th magnitude go to the lowest indices, so exactly k values are sent;
 *    zeros are never sent (fewer than k when v has fewer than k nonzeros).
 *  - The payload is the sparse codec's (not a fixed list of k pairs): the same decoder and
 *    validator serve every sparse method, and the delta layout is a quarter to a third
 *    smaller than (index, value) pairs at the usual ratios.
 *  - R is a float: a product R * n within float precision above an integer counts as that
 *    integer (ratio=0.1 on 1000 values is k = 100, not 101).
 *  - The input and residual are checked before the residual changes: a refused encode
 *    leaves the state as it was. */

#include <assert.h>
#include <math.h>
#include <string.h>

#include "sparse_fmt.h"

/* ---- exact selection (sparse_fmt.h; dgc and sdagc use it too) ------------------------ */

uint32_t mq_sparse_kth(uint32_t *a, size_t m, size_t k, size_t *above)
{
    static const int shift[3] = {20, 9, 0};
    static const uint32_t mask[3] = {0x7ff, 0x7ff, 0x1ff};
    uint32_t hist[2048], t = 0;
    size_t ab = 0;
    assert(k >= 1 && k <= m);
    for (int l = 0; l < 3; l++) {
        const int sh = shift[l];
        const uint32_t mk = mask[l];
        memset(hist, 0, (mk + 1) * sizeof hist[0]);
        for (size_t i = 0; i < m; i++)
            hist[(a[i] >> sh) & mk]++;
        uint32_t b = mk;
        size_t cum = 0;
        while (cum + hist[b] < k)
            cum += hist[b--];
        k -= cum;
        ab += cum;
        t |= b << sh;
        if (l < 2) { /* keep the bin's members: the next level orders them */
            size_t w = 0;
            for (size_t i = 0; i < m; i++) {
                a[w] = a[i];
                w += ((a[i] >> sh) & mk) == b;
            }
            m = w;
        }
    }
    *above = ab;
    return t;
}

/* The indices (into IDX) and magnitudes (into MAGS) of the values of x[0..n) with magnitude
 * >= LO, in index order, the first CAP of them stored (either array may be NULL); returns
 * how many there are. */
static size_t s_gather(const float *x, size_t n, uint32_t lo, uint32_t *mags, uint32_t *idx,
                       size_t cap)
{
    size_t c = 0, i = 0;
    const int32_t cmp = (int32_t)lo - 1;
    for (; i + 8 <= n; i += 8)
        for (unsigned bits = mq_sparse_mask8(x + i, cmp); bits; bits &= bits - 1, c++) {
            size_t t = i + (size_t)__builtin_ctz(bits);
            if (c < cap) {
                if (mags)
                    mags[c] = mq_sparse_mag(x[t]);
                if (idx)
                    idx[c] = (uint32_t)t;
            }
        }
    for (; i < n; i++)
        if (mq_sparse_mag(x[i]) >= lo) {
            if (c < cap) {
                if (mags)
                    mags[c] = mq_sparse_mag(x[i]);
                if (idx)
                    idx[c] = (uint32_t)i;
            }
            c++;
        }
    return c;
}

void mq_sparse_cand_init(mq_sparse_cand_t *c, uint8_t *dst, size_t n)
{
    uint32_t *s = mq_sparse_scratch(dst);
    *c = (mq_sparse_cand_t){.mags = s, .cap = n / 2};
    c->idx = s + (n - c->cap);
}

void mq_sparse_gather(mq_sparse_cand_t *c, const float *x, size_t n, uint32_t lo)
{
    c->lo = lo;
    c->m = s_gather(x, n, lo, c->mags, c->idx, c->cap);
}

size_t mq_sparse_count_above(const float *x, size_t n, uint32_t thr, uint32_t *max)
{
    const mq_v4i_t mag = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
    const mq_v4i_t t = {(int32_t)thr, (int32_t)thr, (int32_t)thr, (int32_t)thr};
    mq_v4i_t cnt = {0, 0, 0, 0}, mx = cnt;
    size_t i = 0, c = 0;
    uint32_t m = 0;
    for (; i + 4 <= n; i += 4) {
        mq_v4i_t a;
        memcpy(&a, x + i, sizeof a);
        a &= mag;
        cnt -= a > t; /* a lane's count stays below 2^30: n <= 2^32 */
        mq_v4i_t gt = a > mx;
        mx = (a & gt) | (mx & ~gt);
    }
    for (int l = 0; l < 4; l++) {
        c += (uint32_t)cnt[l];
        m = (uint32_t)mx[l] > m ? (uint32_t)mx[l] : m;
    }
    for (; i < n; i++) {
        uint32_t a = mq_sparse_mag(x[i]);
        c += a > thr;
        m = a > m ? a : m;
    }
    *max = m;
    return c;
}

void mq_sparse_sampler_init(mq_sparse_sampler_t *s, mq_rng_t *rng, size_t n, size_t ns,
                            uint32_t *out)
{
    assert(ns >= 1 && ns <= n);
    *s = (mq_sparse_sampler_t){.rng = rng, .out = out, .ns = ns, .stride = n / ns};
    s->next = rng ? (size_t)mq_rng_below(rng, s->stride) : s->stride / 2;
}

void mq_sparse_sample_upto(mq_sparse_sampler_t *s, const float *x, size_t end)
{
    while (s->j < s->ns && s->next < end) {
        s->out[s->j++] = mq_sparse_mag(x[s->next]);
        size_t lo = s->j * s->stride;
        s->next = lo + (s->rng ? (size_t)mq_rng_below(s->rng, s->stride) : s->stride / 2);
    }
}

size_t mq_sparse_top_samples(size_t n, size_t k)
{
    double s = ceil(64.0 * (double)n / (double)k); /* ~64 sampled values above the k-th */
    size_t most = n < 8192 ? n : n / 8;
    return s < 4096.0 ? (most < 4096 ? most : 4096) : s > (double)most ? most : (size_t)s;
}

mq_sparse_sel_t mq_sparse_top_of(mq_sparse_cand_t *c, const float *x, size_t n, size_t k)
{
    size_t m = c->m, above;
    if (m > c->cap) /* too many to keep with their indices: magnitudes alone fit */
        m = s_gather(x, n, c->lo, c->mags, NULL, n);
    uint32_t t = mq_sparse_kth(c->mags, m, k, &above);
    if (t == 0) /* fewer than k nonzeros: send them all */
        return (mq_sparse_sel_t){.thr = 0, .take_eq = 0, .count = above};
    return (mq_sparse_sel_t){.thr = t, .take_eq = k - above, .count = k};
}

mq_sparse_sel_t mq_sparse_top(const float *x, size_t n, size_t k, mq_sparse_cand_t *c, size_t ns)
{
    if (k > n)
        k = n;
    /* A bound below the k-th largest: the sample's value at k's rank plus four standard
     * deviations of that rank and 8 (it fails about once in 30000 draws). */
    double ks = ceil((double)k * (double)ns / (double)n), r = ks + 4.0 * sqrt(ks) + 8.0;
    size_t above, rank = r >= (double)ns ? ns : (size_t)r;
    mq_sparse_gather(c, x, n, mq_sparse_kth(c->mags, ns, rank, &above));
    if (c->m < k) {
        /* The sample missed (values arranged against its stride): the histogram's bin of
         * the k-th largest, 1/8 octave wide, bounds it instead. */
        uint32_t hist[2048] = {0}, b = 2047;
        for (size_t i = 0; i < n; i++)
            hist[mq_sparse_mag(x[i]) >> 20]++;
        for (size_t cum = 0; cum + hist[b] < k;)
            cum += hist[b--];
        mq_sparse_gather(c, x, n, b << 20);
    }
    return mq_sparse_top_of(c, x, n, k);
}

/* ---- the topk codec ------------------------------------------------------------------- */

#define S_RATIO 0 /* parameter word */
#define S_CHUNK 1024

static const mq_sparse_param_t s_params[] = {
    {.key = "ratio", .word = S_RATIO, .def = 0.01f, .lo = 0.0f, .hi = 1.0f, .lo_open = true},
};
static const mq_sparse_spec_t s_spec = {.codec = "topk", .p = s_params, .np = 1};
MQ_SPARSE_SPEC_FUNCTIONS(s_spec)

static size_t s_state_floats(const mq_codec_t *c, size_t n)
{
    (void)c;
    return n;
}

/* r += g chunk by chunk, each chunk's share of the sample taken while it is in cache. */
static void s_accumulate(float *r, const float *g, size_t n, mq_sparse_sampler_t *smp)
{
    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t end = n - start < S_CHUNK ? n : start + S_CHUNK, i = start;
        for (; i + 4 <= end; i += 4) {
            mq_v4f_t v = mq_v4f_load(r + i) + mq_v4f_load(g + i);
            memcpy(r + i, &v, sizeof v);
        }
        for (; i < end; i++)
            r[i] += g[i];
        mq_sparse_sample_upto(smp, r, end);
    }
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *len, mq_codec_stats_t *stats)
{
    if (mq_sparse_check_n("topk encode", n) < 0)
        return -1;
    float *r = ctx->state;
    if (mq_quant_check_finite_sum("topk encode", src, r, n) < 0)
        return -1;
    size_t k = mq_sparse_count(mq_codec_param_f(c, S_RATIO), n);
    size_t ns = mq_sparse_top_samples(n, k);
    mq_sparse_cand_t cand;
    mq_sparse_sampler_t smp;
    mq_sparse_cand_init(&cand, dst, n);
    mq_sparse_sampler_init(&smp, NULL, n, ns, cand.mags);
    s_accumulate(r, src, n, &smp);
    mq_sparse_sel_t sel = mq_sparse_top(r, n, k, &cand, ns);
    *len = mq_sparse_emit(r, NULL, n, &sel, &cand, dst, stats);
    return 0;
}

const mq_codec_ops_t mq_codec_topk_ops = {
    .name = "topk",
    .id = MQ_CODEC_ID_topk,
    .usage = "topk[:ratio=R]",
    .help = "the k = R*n largest values with a residual (error feedback; Stich et al. 2018)",
    .state_floats = s_state_floats,
    .encode = s_encode,
    MQ_SPARSE_SHARED_OPS,
};
