/* A worker's key/value layer: every shard's push encoded from the gradient (fp32 segments
 * straight from it, the others into per-segment buffers) and every shard's aggregate applied
 * to the parameters under the update rule. Everything an iteration touches is allocated by
 * mq_kv_worker_new; an iteration itself allocates nothing (coders grow with the level).
 *
 * Error feedback keeps its residual in the model's gradient buffer: the model adds each
 * quantized tensor's gradient onto it (mq_model_set_accumulate, folded into a pass the
 * backward makes anyway), and the encode reads the sums and leaves the new residual in the
 * same place (mq_codec_encode_ef_inplace): one read and one write a value, where a residual
 * of its own took the encode two reads and a write. */
#include <stdlib.h>
#include <string.h>

#include "mqgrad/kv.h"
#include "mqgrad/util.h"

struct mq_kv_worker_t {
    mq_kv_worker_config_t cfg;
    mq_model_t *model;      /* its parameters take the aggregates */
    mq_shard_t *shards;     /* [servers] */
    mq_seg_coder_t *coders; /* [servers x MQ_WIRE_MAX_TENSORS] */
    mq_sendbuf_t grads_ref; /* counts pushes that still point into the gradient */
    /* segments that went out whole in fp32 (a level of 32 bits), to be zeroed once no push
     * points into them: a residual (error feedback) or a cleared gradient (clear)
     * [servers x MQ_WIRE_MAX_TENSORS] */
    bool *spent;
    bool clear;             /* mq_kv_worker_set_clear */
    uint32_t cleared;       /* shards encoded with clearing since the last wait */
    float *opt_state;       /* the update rule's state over the flat vector */
    size_t opt_per;         /* its floats per element */
    float *scratch;         /* one decoded segment, for rules other than plain SGD */
    mq_rng_t rng;
};

/* With error feedback (ON), the model adds the gradients of the quantized tensors onto what
 * their gradient buffer holds, their residual, which starts at zero; off, it writes them over
 * again. */
static void s_accumulate(mq_kv_worker_t *self, bool on)
{
    float *g = mq_model_grads(self->model);
    for (uint32_t s = 0; s < self->cfg.servers; s++)
        for (uint32_t i = 0; i < self->shards[s].nsegs; i++) {
            const mq_segment_t *seg = &self->shards[s].segs[i];
            if (!seg->quantized)
                continue;
            mq_model_set_accumulate(self->model, seg->tensor, on);
            if (on)
                memset(g + seg->flat, 0, seg->count * sizeof(float));
        }
}

static int s_alloc(mq_kv_worker_t *self)
{
    const mq_kv_worker_config_t *c = &self->cfg;
    size_t np = mq_model_nparams(self->model), maxseg = 0;
    for (uint32_t s = 0; s < c->servers; s++)
        for (uint32_t i = 0; i < self->shards[s].nsegs; i++)
            if (self->shards[s].segs[i].count > maxseg)
                maxseg = self->shards[s].segs[i].count;
    size_t nstate = mq_optim_state_floats(&c->optim, np);
    bool sgd = mq_optim_is_sgd(&c->optim);
    self->opt_per = nstate ? mq_optim_state_floats(&c->optim, 1) : 0;
    self->coders = calloc((size_t)c->servers * MQ_WIRE_MAX_TENSORS, sizeof *self->coders);
    self->opt_state = nstate ? calloc(nstate, sizeof(float)) : NULL;
    self->scratch = sgd ? NULL : malloc(sizeof(float) * (maxseg + 1));
    self->spent = calloc((size_t)c->servers * MQ_WIRE_MAX_TENSORS, sizeof *self->spent);
    if (!self->coders || (nstate && !self->opt_state) || (!sgd && !self->scratch) ||
        !self->spent) {
        mq_err_set("out of memory for a worker of %zu parameters", np);
        return -1;
    }
    return 0;
}

mq_kv_worker_t *mq_kv_worker_new(mq_model_t *model, const mq_kv_worker_config_t *cfg)
{
    mq_kv_worker_t *self = calloc(1, sizeof *self);
    if (!self) {
        mq_err_set("out of memory");
        return NULL;
    }
    self->cfg = *cfg;
    self->model = model;
    if (!cfg->optim.ops) {
        mq_err_set("no update rule");
        goto err;
    }
    if (cfg->servers == 0 || cfg->workers == 0 ||
        cfg->rank >= cfg->workers) {
        mq_err_set("rank %u of %u workers for %u servers", cfg->rank, cfg->workers,
                   cfg->servers);
        goto err;
    }
    self->shards = calloc(cfg->servers, sizeof *self->shards);
    if (!self->shards) {
        mq_err_set("out of memory for a shard plan");
        goto err;
    }
    if (mq_kv_plan(model, cfg->slicer, cfg->servers, cfg->threshold, cfg->fp32, self->shards) !=
            0 ||
        s_alloc(self) != 0)
        goto err;
    for (uint32_t s = 0; s < cfg->servers; s++)
        for (uint32_t i = 0; i < self->shards[s].nsegs; i++)
            if (mq_seg_coder_init(&self->coders[(size_t)s * MQ_WIRE_MAX_TENSORS + i],
                                  &self->shards[s].segs[i], &cfg->codec) != 0)
                goto err;
    if (cfg->error_feedback && mq_codec_state_floats(&cfg->codec, 1024) > 0) {
        mq_err_set("codec %s keeps its own residual: error feedback does not apply",
                   mq_codec_ops(&cfg->codec)->name);
        goto err;
    }
    s_accumulate(self, cfg->error_feedback);
    mq_rng_seed(&self->rng, cfg->rng_seed);
    return self;
err:
    mq_kv_worker_destroy(&self);
    return NULL;
}

void mq_kv_worker_destroy(mq_kv_worker_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_kv_worker_t *self = *self_p;
    mq_sendbuf_release(&self->grads_ref);
    if (self->spent && self->cfg.error_feedback) /* set up: gradients are written over again */
        s_accumulate(self, false);
    if (self->coders)
        for (size_t i = 0; i < (size_t)self->cfg.servers * MQ_WIRE_MAX_TENSORS; i++)
            mq_seg_coder_release(&self->coders[i]);
    free(self->coders);
    free(self->shards);
    free(self->spent);
    free(self->opt_state);
    free(self->scratch);
    free(self);
    *self_p = NULL;
}

const mq_shard_t *mq_kv_worker_shard(const mq_kv_worker_t *self, uint32_t s)
{
    return &self->shards[s];
}

const float *mq_kv_worker_residual(const mq_kv_worker_t *self)
{
    return self->cfg.error_feedback ? mq_model_grads(self->model) : NULL;
}

void mq_kv_worker_set_clear(mq_kv_worker_t *self, bool on)
{
    if (on != self->clear)
        self->cleared = 0; /* the next wait zeroes the whole gradient once */
    self->clear = on;
}

int mq_kv_worker_wait(mq_kv_worker_t *self, int timeout_ms)
{
    if (mq_sendbuf_acquire(&self->grads_ref, 0, timeout_ms) != 0)
        return -1;
    float *g = mq_model_grads(self->model);
    /* a round whose every shard was encoded with clearing has left zeros but where its fp32
     * pushes pointed; any other (the first, one cut short, one this worker missed) is
     * zeroed here, but where a residual lives */
    bool all = self->clear && self->cleared < self->cfg.servers;
    for (size_t k = 0; k < (size_t)self->cfg.servers * MQ_WIRE_MAX_TENSORS; k++) {
        uint32_t s = (uint32_t)(k / MQ_WIRE_MAX_TENSORS), i = (uint32_t)(k % MQ_WIRE_MAX_TENSORS);
        if (i >= self->shards[s].nsegs)
            continue;
        const mq_segment_t *seg = &self->shards[s].segs[i];
        bool residual = self->cfg.error_feedback && seg->quantized;
        if (self->spent[k] || (all && !residual))
            memset(g + seg->flat, 0, seg->count * sizeof(float));
        self->spent[k] = false;
    }
    self->cleared = 0;
    return 0;
}

int mq_kv_worker_encode(mq_kv_worker_t *self, uint32_t s, float *grads, const mq_widths_t *w,
                        float lr, mq_tensor_hdr_t *hdrs, mq_payload_t *payloads,
                        double *sent_sq, double *tensor_sq)
{
    const mq_shard_t *sh = &self->shards[s];
    mq_seg_coder_t *coders = self->coders + (size_t)s * MQ_WIRE_MAX_TENSORS;
    const bool ef = self->cfg.error_feedback;
    if (ef && grads != mq_model_grads(self->model)) {
        mq_err_set("error feedback encodes the model's own gradient buffer, where its "
                   "residual is");
        return -1;
    }
    if (self->clear && grads != mq_model_grads(self->model)) {
        mq_err_set("clearing encodes the model's own gradient buffer, which it zeroes");
        return -1;
    }
    for (uint32_t i = 0; i < sh->nsegs; i++) {
        const mq_segment_t *seg = &sh->segs[i];
        mq_codec_stats_t st; /* |Q(g)|^2, counted from the codes while they are in cache */
        float *v = grads + seg->flat, *res = ef && seg->quantized ? v : NULL;
        float *clr = self->clear && !res ? v : NULL;
        if (mq_ps_encode_segment(seg, &coders[i], mq_widths_at(w, seg->tensor), v,
                                 &self->grads_ref, res, clr, &self->rng, lr, &hdrs[i],
                                 &payloads[i], &st) != 0) {
            for (uint32_t k = 0; k < i; k++)
                payloads[k].free_fn((void *)payloads[k].data, payloads[k].hint);
            return -1;
        }
        if ((res || clr) && hdrs[i].codec.id == MQ_CODEC_ID_none) /* went out whole */
            self->spent[(size_t)s * MQ_WIRE_MAX_TENSORS + i] = true;
        if (seg->quantized && sent_sq)
            *sent_sq += st.sq;
        if (seg->quantized && tensor_sq)
            tensor_sq[seg->tensor] += st.sq;
    }
    self->cleared += self->clear;
    return 0;
}

void mq_kv_worker_apply(mq_kv_worker_t *self, uint32_t s, uint64_t iter, float lr,
                        const mq_tensor_hdr_t *hdrs, const uint8_t *const *data,
                        const size_t *len, double *update_sq)
{
    const mq_shard_t *sh = &self->shards[s];
    float *w = mq_model_params(self->model);
    for (uint32_t i = 0; i < sh->nsegs; i++) {
        const mq_segment_t *seg = &sh->segs[i];
        bool count = seg->quantized && update_sq;
        mq_codec_stats_t st;
        /* the rule's state for a segment is contiguous, at the segment's flat offset */
        mq_ps_apply(&self->cfg.optim, &hdrs[i].codec, data[i], len[i], w + seg->flat,
                    seg->count, self->scratch,
                    self->opt_state ? self->opt_state + self->opt_per * seg->flat : NULL, lr,
                    iter + 1, count ? &st : NULL);
        if (count)
            *update_sq += st.sq;
    }
}

int mq_kv_worker_load(mq_kv_worker_t *self, uint32_t s, const float *params, size_t n,
                      const float *state, size_t nstate)
{
    const mq_shard_t *sh = &self->shards[s];
    size_t total = 0;
    for (uint32_t i = 0; i < sh->nsegs; i++)
        total += sh->segs[i].count;
    if (n != total || nstate != self->opt_per * total) {
        mq_err_set("shard %u: %zu values and %zu state values, this plan has %zu and %zu", s, n,
                   nstate, total, self->opt_per * total);
        return -1;
    }
    float *w = mq_model_params(self->model);
    size_t local = 0;
    for (uint32_t i = 0; i < sh->nsegs; i++) {
        const mq_segment_t *seg = &sh->segs[i];
        memcpy(w + seg->flat, params + local, seg->count * sizeof(float));
        if (self->opt_per)
            memcpy(self->opt_state + self->opt_per * seg->flat, state + self->opt_per * local,
                   self->opt_per * seg->count * sizeof(float));
        local += seg->count;
    }
    return 0;
}

void mq_kv_worker_round(mq_kv_worker_t *self, uint64_t iter)
{
    mq_rng_seed(&self->rng, mq_kv_round_seed(self->cfg.rng_seed, iter));
}
