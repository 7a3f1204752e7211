/* A server's key/value layer: the pushes of the round in flight (pointers into the caller's
 * frames), the aggregate handler, the reply encode and the master-copy update. Everything a
 * round touches is allocated by mq_kv_new; a round itself allocates nothing. */
#include "mqgrad/kv.h"

#include <stdlib.h>
#include <string.h>

#include "mqgrad/util.h"

#define S_BUF_TIMEOUT_MS 5000

struct mq_kv_t {
    mq_kv_config_t cfg;
    mq_model_t *model;    /* its parameters are the master copy */
    mq_shard_t shard;
    size_t local[MQ_WIRE_MAX_TENSORS]; /* segment i's first element in agg and opt_state */
    size_t total;         /* elements in the shard */
    float *agg;           /* the round's aggregate, shard-local */
    mq_sendbuf_t agg_ref; /* counts replies that still point into agg (fp32 segments) */
    mq_seg_coder_t coders[MQ_WIRE_MAX_TENSORS]; /* reply buffers and reply-codec state */
    float *opt_state;     /* the update rule's state over the shard */
    size_t opt_per;       /* its floats per element */
    float *scratch;       /* one decoded segment, for rules other than plain SGD */
    mq_rng_t rng;
    /* the round in flight */
    const uint8_t **data; /* [segment * P + rank] */
    size_t *len;
    bool *has;            /* [rank] */
    uint32_t *ranks;      /* the round's aggregated ranks, in order (mq_kv_complete_set) */
    const uint8_t **cdata; /* one segment's pushes of those ranks, compacted: [P] */
    size_t *clen;
    uint32_t filled;
    uint64_t iter;
    mq_widths_t widths;
    float lr;
};

uint64_t mq_kv_round_seed(uint64_t seed, uint64_t iter)
{
    return seed ^ (0x9e3779b97f4a7c15ULL * (iter + 1));
}

int mq_kv_mean(void *arg, const mq_kv_pushes_t *in, float *dst)
{
    (void)arg;
    float scale = 1.0f / (float)in->npush;
    for (uint32_t r = 0; r < in->npush; r++)
        mq_codec_decode_valid(&in->codec, in->data[r], in->len[r], dst, in->seg->count, scale,
                              r > 0, NULL);
    return 0;
}

/* A plan may come from a plugged-in slicer: every segment must lie inside its tensor and the
 * shards must hold as many elements as the model (counted: overlaps are the slicer's). */
static int s_check_plan(const mq_model_t *m, const mq_shard_t *shards, uint32_t nservers)
{
    uint64_t total = 0;
    for (uint32_t s = 0; s < nservers; s++) {
        if (shards[s].nsegs > MQ_WIRE_MAX_TENSORS) {
            mq_err_set("shard %u has %u segments (at most %d)", s, shards[s].nsegs,
                       MQ_WIRE_MAX_TENSORS);
            return -1;
        }
        for (uint32_t i = 0; i < shards[s].nsegs; i++) {
            const mq_segment_t *seg = &shards[s].segs[i];
            const mq_tensor_view_t *v =
                seg->tensor < mq_model_ntensors(m) ? mq_model_tensor(m, seg->tensor) : NULL;
            if (!v || seg->count == 0 || seg->offset > v->count ||
                seg->count > v->count - seg->offset || seg->flat != v->offset + seg->offset ||
                !seg->name || strcmp(seg->name, v->name) != 0) {
                mq_err_set("shard %u segment %u is not a range of one tensor", s, i);
                return -1;
            }
            total += seg->count;
        }
    }
    if (total != mq_model_nparams(m)) {
        mq_err_set("the shards hold %llu elements, the model %zu", (unsigned long long)total,
                   mq_model_nparams(m));
        return -1;
    }
    return 0;
}

int mq_kv_plan(const mq_model_t *m, mq_kv_slicer_fn *slicer, uint32_t nservers,
               uint64_t threshold, bool fp32, mq_shard_t *shards)
{
    if (!slicer)
        slicer = mq_shard_plan;
    if (slicer(m, nservers, threshold, fp32, shards) != 0)
        return -1;
    return s_check_plan(m, shards, nservers);
}

static int s_plan(mq_kv_t *self)
{
    const mq_kv_config_t *c = &self->cfg;
    if (c->workers == 0 || c->servers == 0 ||
        c->rank >= c->servers) {
        mq_err_set("shard %u of %u servers for %u workers", c->rank, c->servers, c->workers);
        return -1;
    }
    mq_shard_t *all = calloc(c->servers, sizeof *all);
    if (!all) {
        mq_err_set("out of memory for a shard plan");
        return -1;
    }
    int rc = mq_kv_plan(self->model, c->slicer, c->servers, c->threshold, c->fp32, all);
    if (rc == 0)
        self->shard = all[c->rank];
    free(all);
    if (rc != 0)
        return -1;
    /* With the default plan a segment's local offset is flat - begin, as it always was. */
    for (uint32_t i = 0; i < self->shard.nsegs; i++) {
        self->local[i] = self->total;
        self->total += self->shard.segs[i].count;
    }
    return 0;
}

static int s_alloc(mq_kv_t *self)
{
    const mq_kv_config_t *c = &self->cfg;
    size_t nslots = (size_t)self->shard.nsegs * c->workers, maxseg = 0;
    for (uint32_t i = 0; i < self->shard.nsegs; i++)
        if (self->shard.segs[i].count > maxseg)
            maxseg = self->shard.segs[i].count;
    size_t nstate = mq_optim_state_floats(&c->optim, self->total);
    bool sgd = mq_optim_is_sgd(&c->optim);
    self->opt_per = nstate ? mq_optim_state_floats(&c->optim, 1) : 0;
    self->agg = malloc(sizeof(float) * (self->total + 1));
    self->opt_state = nstate ? calloc(nstate, sizeof(float)) : NULL;
    self->scratch = sgd ? NULL : malloc(sizeof(float) * (maxseg + 1));
    self->data = calloc(nslots + 1, sizeof *self->data);
    self->len = calloc(nslots + 1, sizeof *self->len);
    self->has = calloc(c->workers, sizeof *self->has);
    self->ranks = calloc(c->workers, sizeof *self->ranks);
    self->cdata = calloc(c->workers, sizeof *self->cdata);
    self->clen = calloc(c->workers, sizeof *self->clen);
    if (!self->agg || (nstate && !self->opt_state) || (!sgd && !self->scratch) || !self->data ||
        !self->len || !self->has || !self->ranks || !self->cdata || !self->clen) {
        mq_err_set("out of memory for a shard of %zu elements", self->total);
        return -1;
    }
    return 0;
}

mq_kv_t *mq_kv_new(mq_model_t *model, const mq_kv_config_t *cfg)
{
    mq_kv_t *self = calloc(1, sizeof *self);
    if (!self) {
        mq_err_set("out of memory");
        return NULL;
    }
    self->cfg = *cfg;
    self->model = model;
    if (!self->cfg.slicer)
        self->cfg.slicer = mq_shard_plan;
    if (!self->cfg.aggregate)
        self->cfg.aggregate = mq_kv_mean;
    if (!cfg->optim.ops) {
        mq_err_set("no update rule");
        goto err;
    }
    if (s_plan(self) != 0 || s_alloc(self) != 0)
        goto err;
    /* The replies' codecs, resolved once: a reply codec keeps its push codec's level. */
    mq_codec_t reply = mq_codec_reply(&cfg->codec);
    for (uint32_t i = 0; i < self->shard.nsegs; i++)
        if (mq_seg_coder_init(&self->coders[i], &self->shard.segs[i], &reply) != 0)
            goto err;
    mq_rng_seed(&self->rng, cfg->rng_seed);
    return self;
err:
    mq_kv_destroy(&self);
    return NULL;
}

void mq_kv_destroy(mq_kv_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_kv_t *self = *self_p;
    for (int i = 0; i < MQ_WIRE_MAX_TENSORS; i++)
        mq_seg_coder_release(&self->coders[i]);
    mq_sendbuf_release(&self->agg_ref);
    free(self->agg);
    free(self->opt_state);
    free(self->scratch);
    free(self->data);
    free(self->len);
    free(self->has);
    free(self->ranks);
    free(self->cdata);
    free(self->clen);
    free(self);
    *self_p = NULL;
}

const mq_shard_t *mq_kv_shard(const mq_kv_t *self)
{
    return &self->shard;
}

uint64_t mq_kv_iter(const mq_kv_t *self)
{
    return self->iter;
}

uint32_t mq_kv_pending(const mq_kv_t *self)
{
    return self->filled;
}

bool mq_kv_has(const mq_kv_t *self, uint32_t rank)
{
    return rank < self->cfg.workers && self->has[rank];
}

const mq_widths_t *mq_kv_widths(const mq_kv_t *self)
{
    return &self->widths;
}

float mq_kv_lr(const mq_kv_t *self)
{
    return self->lr;
}

/* ---- a round ---------------------------------------------------------------------------- */

int mq_kv_push(mq_kv_t *self, uint64_t iter, uint32_t rank, const mq_widths_t *w, float lr,
               const uint8_t *const *data, const size_t *len, uint32_t n)
{
    uint32_t P = self->cfg.workers;
    if (iter != self->iter) {
        mq_err_set("push for iteration %llu, expected %llu", (unsigned long long)iter,
                   (unsigned long long)self->iter);
        return -1;
    }
    if (rank >= P || self->has[rank]) {
        mq_err_set(rank >= P ? "push from rank %u of %u workers" : "second push from rank %u",
                   rank, P);
        return -1;
    }
    if (n != self->shard.nsegs) {
        mq_err_set("push with %u segments, the shard has %u", n, self->shard.nsegs);
        return -1;
    }
    if (self->filled > 0 && (!mq_widths_equal(w, &self->widths) || lr != self->lr)) {
        mq_err_set("push at %d bits%s and lr %g, the round is at %d bits%s and %g", w->bits,
                   w->n ? " per tensor" : "", (double)lr, self->widths.bits,
                   self->widths.n ? " per tensor" : "", (double)self->lr);
        return -1;
    }
    if (self->filled == 0) {
        self->widths = *w;
        self->lr = lr;
    }
    for (uint32_t i = 0; i < n; i++) {
        self->data[(size_t)i * P + rank] = data[i];
        self->len[(size_t)i * P + rank] = len[i];
    }
    self->has[rank] = true;
    return ++self->filled == P;
}

/* Segment I's aggregate over the N ranks in self->ranks into agg, by the handler; a
 * plugged-in handler's result is checked finite (every worker's wire would refuse a
 * non-finite fp32 reply). The handler sees those ranks' pushes compacted, in rank order:
 * pointers move, never bytes. */
static int s_aggregate(mq_kv_t *self, uint32_t i, uint32_t n)
{
    const mq_segment_t *seg = &self->shard.segs[i];
    uint32_t P = self->cfg.workers;
    float *dst = self->agg + self->local[i];
    for (uint32_t k = 0; k < n; k++) {
        self->cdata[k] = self->data[(size_t)i * P + self->ranks[k]];
        self->clen[k] = self->len[(size_t)i * P + self->ranks[k]];
    }
    mq_kv_pushes_t in = {
        .seg = seg,
        .codec = mq_segment_codec(seg, mq_widths_at(&self->widths, seg->tensor), &self->cfg.codec),
        .npush = n,
        .data = self->cdata,
        .len = self->clen,
        .iter = self->iter,
        .lr = self->lr,
    };
    if (self->cfg.aggregate(self->cfg.aggregate_arg, &in, dst) != 0)
        return -1;
    if (self->cfg.aggregate != mq_kv_mean) {
        size_t bad = mq_codec_first_nonfinite(dst, seg->count);
        if (bad < seg->count) {
            mq_err_set("the aggregate of %s has a non-finite value at %zu", seg->name, bad);
            return -1;
        }
    }
    return 0;
}

/* Encodes segment I's aggregate with the reply codec into H and OUT, and applies exactly that
 * payload to the master copy. */
static int s_reply(mq_kv_t *self, uint32_t i, mq_tensor_hdr_t *h, mq_payload_t *out)
{
    const mq_segment_t *seg = &self->shard.segs[i];
    const float *agg = self->agg + self->local[i];
    if (mq_ps_encode_segment(seg, &self->coders[i], mq_widths_at(&self->widths, seg->tensor), agg,
                             &self->agg_ref, NULL, NULL, &self->rng, self->lr, h, out, NULL) != 0)
        return -1;
    mq_ps_apply(&self->cfg.optim, &h->codec, out->data, out->len,
                mq_model_params(self->model) + seg->flat, seg->count, self->scratch,
                self->opt_state ? self->opt_state + self->opt_per * self->local[i] : NULL,
                self->lr, self->iter + 1, NULL);
    return 0;
}

/* Aggregates over the N ranks in self->ranks (each with a push in) and closes the round. */
static int s_complete(mq_kv_t *self, uint32_t n, mq_tensor_hdr_t *hdrs, mq_payload_t *out)
{
    /* The previous round's replies must be gone before the aggregate is overwritten. */
    if (mq_sendbuf_acquire(&self->agg_ref, 0, S_BUF_TIMEOUT_MS) != 0)
        return -1;
    mq_rng_seed(&self->rng, mq_kv_round_seed(self->cfg.rng_seed, self->iter));
    for (uint32_t i = 0; i < self->shard.nsegs; i++) {
        if (s_aggregate(self, i, n) != 0 || s_reply(self, i, &hdrs[i], &out[i]) != 0) {
            for (uint32_t k = 0; k < i; k++)
                out[k].free_fn((void *)out[k].data, out[k].hint);
            return -1;
        }
    }
    mq_kv_discard(self);
    self->iter++;
    return 0;
}

int mq_kv_complete(mq_kv_t *self, mq_tensor_hdr_t *hdrs, mq_payload_t *out)
{
    if (self->filled != self->cfg.workers) {
        mq_err_set("iteration %llu: %u of %u pushes in", (unsigned long long)self->iter,
                   self->filled, self->cfg.workers);
        return -1;
    }
    for (uint32_t r = 0; r < self->cfg.workers; r++)
        self->ranks[r] = r;
    return s_complete(self, self->cfg.workers, hdrs, out);
}

bool mq_kv_has_all(const mq_kv_t *self, const uint32_t *ranks, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++)
        if (!mq_kv_has(self, ranks[k]))
            return false;
    return true;
}

int mq_kv_complete_set(mq_kv_t *self, const uint32_t *ranks, uint32_t n, mq_tensor_hdr_t *hdrs,
                       mq_payload_t *out)
{
    if (n == 0 || n > self->cfg.workers) {
        mq_err_set("iteration %llu: a member set of %u ranks", (unsigned long long)self->iter,
                   n);
        return -1;
    }
    for (uint32_t k = 0; k < n; k++) {
        if (!mq_kv_has(self, ranks[k]) || (k > 0 && ranks[k] <= ranks[k - 1])) {
            mq_err_set("iteration %llu: rank %u is not in the round, or the set is not in "
                       "rank order",
                       (unsigned long long)self->iter, ranks[k]);
            return -1;
        }
        self->ranks[k] = ranks[k];
    }
    return s_complete(self, n, hdrs, out);
}

void mq_kv_discard(mq_kv_t *self)
{
    memset(self->has, 0, self->cfg.workers * sizeof *self->has);
    self->filled = 0;
}

size_t mq_kv_size(const mq_kv_t *self)
{
    return self->total;
}

size_t mq_kv_state_per(const mq_kv_t *self)
{
    return self->opt_per;
}

void mq_kv_export(const mq_kv_t *self, float *params, float *state)
{
    const float *w = mq_model_params(self->model);
    for (uint32_t i = 0; i < self->shard.nsegs; i++) {
        const mq_segment_t *seg = &self->shard.segs[i];
        memcpy(params + self->local[i], w + seg->flat, seg->count * sizeof(float));
    }
    if (self->opt_per && state)
        memcpy(state, self->opt_state, self->opt_per * self->total * sizeof(float));
}

void mq_kv_restore(mq_kv_t *self, uint64_t iter, const float *params, const float *state)
{
    float *w = mq_model_params(self->model);
    for (uint32_t i = 0; i < self->shard.nsegs; i++) {
        const mq_segment_t *seg = &self->shard.segs[i];
        memcpy(w + seg->flat, params + self->local[i], seg->count * sizeof(float));
    }
    if (self->opt_per && state)
        memcpy(self->opt_state, state, self->opt_per * self->total * sizeof(float));
    mq_kv_discard(self);
    self->iter = iter;
}
