/* The `dgc` codec: Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, "Deep Gradient
 * Compression: Reducing the Communication Bandwidth for Distributed Training", ICLR 2018,
 * arXiv 1712.01887). A worker keeps momentum and the unsent accumulation itself and sends
 * about R * n values a step; the server averages the sparse pushes and applies plain SGD
 * (momentum lives on the workers, as in the paper).
 *
 * Spec: dgc[:ratio=R][:momentum=M][:clip=C][:sample=F]
 *   R  fraction of the values sent, 0 < R <= 1, default 0.001 (the paper's 99.9% sparsity)
 *   M  momentum, 0 <= M < 1, default 0.9 (0: plain residual accumulation, no momentum state)
 *   C  local gradient clipping: the segment's gradient is scaled to L2 norm C when longer,
 *      C >= 0, default 0 = off
 *   F  fraction of the values sampled to estimate the threshold, 0 < F <= 1, default 0.01
 * Parameter words: 0 = R, 1 = M, 2 = C, 3 = F (floats); 4, 5 = 0.
 * State (zero at the start): v, the accumulated velocity (n floats), then u, the momentum
 * (n floats, only when M > 0): 2n floats, or n with M = 0.
 * Payload: the sparse format of sparse_fmt.h; a server replies with `sparse`.
 *
 * Per encode, with g the segment's gradient:
 *   g = g * min(1, C / |g|)                 local gradient clipping (C > 0)
 *   u = M u + g;  v = v + u                 momentum correction
 *   thr = a threshold from a sample of |v|  (below)
 *   send v where |v| >= thr;  v = u = 0 there   (momentum factor masking)
 *
 * Choices (the paper's, unless marked ours):
 *  - Threshold: the ceil(R * s)-th largest of s sampled |v|; when that selects more than
 *    1.3 R n values, the exact R n largest of the selected are sent instead (the paper's
 *    hierarchical selection when "far more" values pass; 1.3 is ours). Fewer than R n is
 *    accepted as it comes, as in the paper.
 *  - Sample size s = max(F n, 32 / R) [ours]: with F n alone a small segment's estimate
 *    rests on one or two sampled values above the threshold; 32 of them keep the count
 *    within ~14% (one standard deviation) of R n. The sample is stratified [ours]: one
 *    uniform position in each of s equal strata, taken while v is computed, chunk by chunk,
 *    so it costs no random access to memory. When s reaches n/4 sampling would cost what
 *    exact selection does, so the threshold is exact instead (topk's selection, whose
 *    sample is deterministic) and no random numbers are drawn; sample=1 always does that.
 *  - The values at or above the threshold are copied with their indices into the payload
 *    buffer in the pass that counts them; the payload is then written from that list (and
 *    the exact selection, when needed, runs on it), so selection reads v once.
 *  - Clipping is of this segment's gradient to C [ours as a parameter]: the paper clips
 *    each worker's gradient to the global threshold scaled by N^-1/2 for N workers, so a
 *    run whose global clip is G over N workers passes C = G / sqrt(N).
 *  - Density warm-up (the paper raises sparsity 75% -> 99.9% over the first epochs) is not
 *    in the codec: a codec sees one segment of one iteration and knows no epochs. It is a
 *    schedule of R, and R travels in the parameter words with every payload, so a
 *    controller sets it per iteration (spec "dgc:ratio=0.25" in epoch 0, ...).
 *  - An accumulation that overflows float (a diverged run) fails the encode and resets the
 *    state to zero; a non-finite gradient is refused before the state changes.
 *  - Zeros are never sent. No allocation: the sample and the candidates live in the payload
 *    buffer until the payload is written. The update pass over g, u and v is most of the
 *    encode's time (measured against a memcpy of the vector: bench/README.md). */

#include <math.h>

#include "sparse_fmt.h"

enum { S_RATIO = 0, S_MOMENTUM = 1, S_CLIP = 2, S_SAMPLE = 3 }; /* parameter words */
#define S_CHUNK 1024
#define S_MIN_ABOVE 32 /* sampled values expected above the threshold, at least */
#define S_EXCESS 1.3   /* more than this times R n selected: select exactly among them */

static const mq_sparse_param_t s_params[] = {
    {.key = "ratio", .word = S_RATIO, .def = 0.001f, .lo = 0.0f, .hi = 1.0f, .lo_open = true},
    {.key = "momentum", .word = S_MOMENTUM, .def = 0.9f, .lo = 0.0f, .hi = 1.0f, .hi_open = true},
    {.key = "clip", .word = S_CLIP, .def = 0.0f, .lo = 0.0f, .hi = INFINITY},
    {.key = "sample", .word = S_SAMPLE, .def = 0.01f, .lo = 0.0f, .hi = 1.0f, .lo_open = true},
};
static const mq_sparse_spec_t s_spec = {.codec = "dgc", .p = s_params, .np = 4};
MQ_SPARSE_SPEC_FUNCTIONS(s_spec)

/* Sample size for n values, k of them to send (n/4 or more: the caller selects exactly). */
static size_t s_samples(const mq_codec_t *c, size_t n, size_t k)
{
    size_t s = mq_sparse_count(mq_codec_param_f(c, S_SAMPLE), n);
    double need = ceil((double)S_MIN_ABOVE * (double)n / (double)k);
    return need >= (double)n ? n : s > (size_t)need ? s : (size_t)need;
}

static size_t s_state_floats(const mq_codec_t *c, size_t n)
{
    return mq_codec_param_f(c, S_MOMENTUM) > 0.0f ? 2 * n : n;
}

static bool s_stochastic(const mq_codec_t *c)
{
    return mq_codec_param_f(c, S_SAMPLE) < 1.0f;
}

/* u = m u + s g; v += u (or v += s g without momentum), chunk by chunk, each chunk's share
 * of the sample taken while it is in cache. Returns the index of the first value of v that
 * overflowed, or n. */
static size_t s_update(float *v, float *u, const float *g, size_t n, float m, float s,
                       mq_sparse_sampler_t *smp)
{
    const mq_v4f_t vm = mq_v4f_set1(m), vs = mq_v4f_set1(s);
    mq_v4f_t bad = mq_v4f_set1(0);
    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t end = n - start < S_CHUNK ? n : start + S_CHUNK, i = start;
        for (; i + 4 <= end; i += 4) {
            mq_v4f_t gv = vs * mq_v4f_load(g + i), vv = mq_v4f_load(v + i);
            if (u) {
                gv += vm * mq_v4f_load(u + i);
                memcpy(u + i, &gv, sizeof gv);
            }
            vv += gv;
            bad += vv - vv; /* NaN once a value is infinite */
            memcpy(v + i, &vv, sizeof vv);
        }
        for (; i < end; i++) {
            float gi = s * g[i];
            if (u)
                gi = u[i] = m * u[i] + gi;
            v[i] += gi;
            bad[0] += v[i] - v[i];
        }
        mq_sparse_sample_upto(smp, v, end);
    }
    if (bad[0] == 0.0f && bad[1] == 0.0f && bad[2] == 0.0f && bad[3] == 0.0f)
        return n;
    return mq_quant_first_nonfinite(v, n);
}

/* The selection from a sample c->mags[0..ns) of v's magnitudes, K wanted. */
static mq_sparse_sel_t s_from_sample(const float *v, size_t n, size_t k, mq_sparse_cand_t *c,
                                     size_t ns)
{
    size_t ks = mq_sparse_count((float)((double)k / (double)n), ns), above;
    uint32_t t = mq_sparse_kth(c->mags, ns, ks, &above), lo = t ? t : 1; /* never a zero */
    mq_sparse_gather(c, v, n, lo);
    if ((double)c->m <= S_EXCESS * (double)k)
        return (mq_sparse_sel_t){.thr = lo - 1, .take_eq = 0, .count = c->m};
    return mq_sparse_top_of(c, v, n, k);
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *len, mq_codec_stats_t *stats)
{
    float scale, m = mq_codec_param_f(c, S_MOMENTUM);
    if (mq_sparse_check_n("dgc encode", n) < 0 ||
        mq_sparse_clip_scale("dgc encode", src, n, mq_codec_param_f(c, S_CLIP), &scale) < 0)
        return -1;
    float *v = ctx->state, *u = m > 0.0f ? v + n : NULL;
    size_t k = mq_sparse_count(mq_codec_param_f(c, S_RATIO), n), ns = s_samples(c, n, k);
    bool exact = ns >= n / 4; /* then a sample costs what exact selection does */
    if (exact)
        ns = mq_sparse_top_samples(n, k); /* a deterministic one, to speed up topk's */
    mq_sparse_cand_t cand;
    mq_sparse_sampler_t smp;
    mq_sparse_cand_init(&cand, dst, n);
    mq_sparse_sampler_init(&smp, exact ? NULL : ctx->rng, n, ns, cand.mags);
    size_t bad = s_update(v, u, src, n, m, scale, &smp);
    if (bad < n) {
        memset(v, 0, s_state_floats(c, n) * sizeof *v);
        mq_err_set("dgc encode: the accumulated gradient overflowed at value %zu of %zu (the run "
                   "has diverged); its state is reset to zero",
                   bad, n);
        return -1;
    }
    mq_sparse_sel_t sel = exact ? mq_sparse_top(v, n, k, &cand, ns)
                                : s_from_sample(v, n, k, &cand, ns);
    *len = mq_sparse_emit(v, u, n, &sel, &cand, dst, stats);
    return 0;
}

const mq_codec_ops_t mq_codec_dgc_ops = {
    .name = "dgc",
    .id = MQ_CODEC_ID_dgc,
    .usage = "dgc[:ratio=R][:momentum=M][:clip=C][:sample=F]",
    .help = "Deep Gradient Compression: ~R*n values, momentum kept on workers (Lin et al. 2018)",
    .state_floats = s_state_floats,
    .stochastic = s_stochastic,
    .encode = s_encode,
    MQ_SPARSE_SHARED_OPS,
};
