/* The key/value layer of a parameter server, apart from its transport: one server's shard of
 * the flat vector, the pushes of the iteration in flight, what is made of them (the
 * aggregate), the reply encoded from it and the master copy that takes exactly that reply.
 * It knows neither sockets nor protobuf: pushes come in as payload pointers per (rank,
 * segment), held by the caller until the round completes, and replies go out as
 * mq_payload_t's on the module's reusable buffers. The worker half is its mirror: it encodes
 * a worker's gradient into each shard's push and applies each shard's aggregate, both cut
 * by the same slicer. */
#ifndef MQGRAD_KV_H
#define MQGRAD_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mqgrad/nn.h"
#include "mqgrad/optim.h"
#include "mqgrad/ps.h"
#include "mqgrad/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- seams ---------------------------------------------------------------------------- */

/* The slicer: cuts the model's flat vector into NSERVERS shards (shards[0..nservers)). Each
 * segment must lie inside one tensor (flat = the tensor's offset + offset, its name the
 * tensor's) and every element must belong to exactly one shard; THRESHOLD and FP32 say which
 * segments are quantized. Returns 0, or -1 with an error. mq_shard_plan (contiguous, equal
 * shards) is the default; workers must cut with the same slicer as the servers. */
typedef int mq_kv_slicer_fn(const mq_model_t *m, uint32_t nservers, uint64_t threshold,
                            bool fp32, mq_shard_t *shards);

/* One segment's pushes for an aggregate handler. data[r], len[r] is rank r's payload in
 * CODEC (already validated by the wire), r = 0..npush-1: the order is always the ranks',
 * never the arrival's. */
typedef struct {
    const mq_segment_t *seg; /* seg->count values */
    mq_codec_t codec;        /* the pushes' codec at this iteration's level */
    uint32_t npush;          /* P, every worker */
    const uint8_t *const *data;
    const size_t *len;
    uint64_t iter;
    float lr;
} mq_kv_pushes_t;

/* Cuts M into SHARDS[0..NSERVERS) with SLICER (NULL: mq_shard_plan) and checks the plan:
 * every segment a range of one tensor, at most MQ_WIRE_MAX_TENSORS per shard, as many
 * elements as the model. Both halves plan with it. Returns 0, or -1 with an error. */
int mq_kv_plan(const mq_model_t *m, mq_kv_slicer_fn *slicer, uint32_t nservers,
               uint64_t threshold, bool fp32, mq_shard_t *shards);

/* The aggregate handler: writes what the server replies with for one segment into
 * DST[0..seg->count) (DST holds garbage on entry). ARG is the configuration's aggregate_arg.
 * Returns 0, or -1 with an error (the round then fails). */
typedef int mq_kv_aggregate_fn(void *arg, const mq_kv_pushes_t *in, float *dst);

/* The generator seed of round ITER for a node seeded SEED: each round's random draws (the
 * encoders' stochastic rounding, sampling) are a function of the round, not of the rounds
 * before it, so a run resumed from a checkpoint draws what the undisturbed run drew. */
uint64_t mq_kv_round_seed(uint64_t seed, uint64_t iter);

/* The default handler: the mean, each push decoded straight into DST with scale 1/P and
 * accumulated in rank order (no temporary). Never fails. */
int mq_kv_mean(void *arg, const mq_kv_pushes_t *in, float *dst);

/* ---- the module ----------------------------------------------------------------------- */

typedef struct {
    uint32_t servers;     /* S, shards in the plan */
    uint32_t rank;        /* the shard this server holds */
    uint32_t workers;     /* P, pushes per round */
    uint64_t threshold;   /* tensors with at least this many elements are quantized */
    bool fp32;            /* nothing is quantized */
    mq_codec_t codec;     /* the run's codec for quantized segments, level set per round */
    mq_optim_t optim;     /* the update rule the master copy takes, as every worker does */
    uint64_t rng_seed;    /* the reply encoder's generator */
    mq_kv_slicer_fn *slicer;       /* NULL: mq_shard_plan */
    mq_kv_aggregate_fn *aggregate; /* NULL: mq_kv_mean */
    void *aggregate_arg;
} mq_kv_config_t;

typedef struct mq_kv_t mq_kv_t;

/* A server's key/value state for shard CFG->rank of MODEL, whose parameters are the master
 * copy (borrowed: MODEL must outlive the module, and only this shard's elements are
 * written). Plans the shards with the slicer, checks the plan, and allocates everything the
 * rounds use. NULL with an error on a bad configuration or plan, or out of memory. */
mq_kv_t *mq_kv_new(mq_model_t *model, const mq_kv_config_t *cfg);
/* Frees SELF (waiting, bounded, until ZeroMQ holds no reply) and NULLs *SELF_P; safe twice. */
void mq_kv_destroy(mq_kv_t **self_p);

const mq_shard_t *mq_kv_shard(const mq_kv_t *self);
/* The iteration whose pushes are awaited: 0 first, one more after each completed round. */
uint64_t mq_kv_iter(const mq_kv_t *self);
/* Pushes in for the current round; whether RANK's is among them. */
uint32_t mq_kv_pending(const mq_kv_t *self);
bool mq_kv_has(const mq_kv_t *self, uint32_t rank);
/* The round's levels and learning rate, set by its first push (meaningless before). */
const mq_widths_t *mq_kv_widths(const mq_kv_t *self);
float mq_kv_lr(const mq_kv_t *self);

/* Takes rank RANK's push for iteration ITER at levels W and learning rate LR: DATA[i],
 * LEN[i] is segment i's payload, i < N = the shard's segment count, validated by the wire
 * against the shard and the push codec at W's levels. Only the pointers are kept: the bytes must
 * stay put until mq_kv_complete has returned. The first push of a round sets its level and
 * learning rate. Returns 1 when every rank's push is in (call mq_kv_complete), 0 while some
 * are missing, or -1 with an error (nothing kept) for another iteration, an unknown or
 * repeated rank, a segment count or level or learning rate that differs from the round's. */
int mq_kv_push(mq_kv_t *self, uint64_t iter, uint32_t rank, const mq_widths_t *w, float lr,
               const uint8_t *const *data, const size_t *len, uint32_t n);

/* Completes the round: per segment, in order, the aggregate handler's result is encoded with
 * the reply codec (mq_codec_reply of the push codec, with the module's state and generator),
 * and exactly that payload is applied to the master copy under the update rule at update
 * number iter + 1. Fills HDRS[i] and OUT[i] for each segment; each OUT[i] holds a reference
 * on the module's buffers that the caller drops with out[i].free_fn(data, hint) once sent
 * (mq_sendbuf_payload takes more, one per message). The pushes' pointers are then
 * forgotten and the iteration advances. Waits (bounded) until ZeroMQ holds no reply of the
 * previous round. Returns 0, or -1 with an error: no reference is left in OUT and the round
 * stays open, but the segments before the failing one have updated the master copy and the
 * reply state, so a server cannot go on with the run. */
int mq_kv_complete(mq_kv_t *self, mq_tensor_hdr_t *hdrs, mq_payload_t *out);

/* Membership that changes (docs/operations.md, "Failures and elasticity"): a round is closed
 * over the set of ranks the scheduler commits, not over every rank. Whether each of
 * RANKS[0..N) has its push in. */
bool mq_kv_has_all(const mq_kv_t *self, const uint32_t *ranks, uint32_t n);
/* As mq_kv_complete, over exactly RANKS[0..N) (in rank order, 1 <= N, each with a push in):
 * the handler sees those N pushes and nothing else (the mean is over N), and the pushes of
 * other ranks (a worker cut from the round) are forgotten with the round. */
int mq_kv_complete_set(mq_kv_t *self, const uint32_t *ranks, uint32_t n, mq_tensor_hdr_t *hdrs,
                       mq_payload_t *out);
/* Forgets the round's pushes; the iteration stays (the round is run again). */
void mq_kv_discard(mq_kv_t *self);

/* The shard for a worker that joins: its elements (mq_kv_size, shard-local: segment i at the
 * sum of the earlier segments' counts) and the update rule's state over them (mq_kv_state_per
 * floats per element, same order), as of the start of the current round. */
size_t mq_kv_size(const mq_kv_t *self);
size_t mq_kv_state_per(const mq_kv_t *self);
void mq_kv_export(const mq_kv_t *self, float *params, float *state);
/* The inverse, for a server that resumes from its checkpoint: the shard's elements and state
 * as mq_kv_export wrote them, and the round awaited from now on is ITER (no push kept). The
 * reply codec's own state, if any, starts afresh. */
void mq_kv_restore(mq_kv_t *self, uint64_t iter, const float *params, const float *state);

/* ---- the worker half ------------------------------------------------------------------ */

typedef struct {
    uint32_t servers;       /* S, shards in the plan */
    uint32_t rank;          /* this worker's rank */
    uint32_t workers;       /* P */
    uint64_t threshold;     /* as the servers' */
    bool fp32;
    mq_codec_t codec;       /* the run's codec for quantized segments, level set per push */
    mq_optim_t optim;       /* the update rule the parameters take */
    bool error_feedback;    /* generic error feedback, its residual in the model's gradient */
    uint64_t rng_seed;      /* the push encoder's generator */
    mq_kv_slicer_fn *slicer; /* NULL: mq_shard_plan; must be the servers' */
} mq_kv_worker_config_t;

typedef struct mq_kv_worker_t mq_kv_worker_t;

/* A worker's key/value state for MODEL, whose parameters take the aggregates (borrowed: MODEL
 * must outlive the module). Plans every shard with the slicer and allocates what the
 * iterations use: a segment coder per (shard, segment), the update rule's state and scratch.
 * With error feedback the residual lives in MODEL's gradient buffer: the quantized tensors'
 * part of it is zeroed and MODEL set to add their gradients onto it (mq_model_set_accumulate;
 * set back on destroy). NULL with an error on a bad configuration or plan (error feedback
 * with a codec that keeps its own residual among them), or out of memory. */
mq_kv_worker_t *mq_kv_worker_new(mq_model_t *model, const mq_kv_worker_config_t *cfg);
/* Frees SELF (waiting, bounded, until ZeroMQ holds no push) and NULLs *SELF_P; safe twice. */
void mq_kv_worker_destroy(mq_kv_worker_t **self_p);

/* Shard S of the plan, S < cfg.servers. */
const mq_shard_t *mq_kv_worker_shard(const mq_kv_worker_t *self, uint32_t s);
/* With error feedback, the model's gradient buffer, whose quantized segments hold their
 * residual after an encode (and gradient + residual after the next mq_model_grad); NULL
 * without error feedback. */
const float *mq_kv_worker_residual(const mq_kv_worker_t *self);

/* Clearing (off at first), for a model whose backward adds its gradient onto the buffer
 * (autograd's accumulation) rather than writing it: each segment that holds no residual is
 * zeroed as it is encoded (fp32 ones once sent), and mq_kv_worker_wait leaves the whole
 * gradient zero but for the residuals, so the model needs no pass of its own to zero it. */
void mq_kv_worker_set_clear(mq_kv_worker_t *self, bool on);

/* Waits at most TIMEOUT_MS until no push still points into the gradient (fp32 segments go
 * out straight from it), so it may be overwritten; then zeroes the residual of a segment
 * whose sums went out whole in fp32, and with clearing every value that holds no residual
 * and that the pushes since the last wait did not clear. Returns 0, or -1 with an error. */
int mq_kv_worker_wait(mq_kv_worker_t *self, int timeout_ms);

/* Encodes shard S's push from GRADS (the flat gradient, which must stay put until the
 * messages are sent and mq_kv_worker_wait says so; with error feedback the model's own
 * buffer, mq_model_grads, whose quantized segments it leaves holding their residual) at the
 * levels W and learning rate LR: per segment, in order, HDRS[i] and PAYLOADS[i], i < the shard's
 * segment count. fp32 segments point into GRADS (no copy), quantized ones into the module's
 * buffers, encoded with the module's generator, the codec's state or error feedback. Each
 * payload holds a reference the caller drops with free_fn(data, hint) once sent. Adds
 * |Q(v)|^2 of each quantized segment's push to *SENT_SQ and to TENSOR_SQ[its tensor] (either
 * may be NULL). Returns 0, or -1 with an error and no reference left. */
int mq_kv_worker_encode(mq_kv_worker_t *self, uint32_t s, float *grads, const mq_widths_t *w,
                        float lr, mq_tensor_hdr_t *hdrs, mq_payload_t *payloads,
                        double *sent_sq, double *tensor_sq);

/* Applies shard S's aggregate of iteration ITER to the parameters under the update rule at
 * learning rate LR, update number ITER + 1: DATA[i], LEN[i] is segment i's payload in
 * HDRS[i].codec, all validated by the wire against the shard (mq_shard_check). Adds the
 * decoded |g^|^2 of each quantized segment to *UPDATE_SQ (may be NULL). */
void mq_kv_worker_apply(mq_kv_worker_t *self, uint32_t s, uint64_t iter, float lr,
                        const mq_tensor_hdr_t *hdrs, const uint8_t *const *data,
                        const size_t *len, double *update_sq);

/* Starts round ITER's draws: the push encoder's generator is reseeded with
 * mq_kv_round_seed (the cluster's workers call it before their pushes). */
void mq_kv_worker_round(mq_kv_worker_t *self, uint64_t iter);

/* Takes shard S as a server exported it (mq_kv_export): PARAMS[0..N) shard-local, STATE
 * [0..NSTATE) its update rule's state. -1 with an error when the sizes are not this plan's
 * (then nothing is written). */
int mq_kv_worker_load(mq_kv_worker_t *self, uint32_t s, const float *params, size_t n,
                      const float *state, size_t nstate);

#ifdef __cplusplus
}
#endif
#endif
