/* The server actor: register with the scheduler, learn the run and its shard, then serve
 * pushes. This file is the transport and the validation; the key/value layer (mqgrad/kv.h)
 * aggregates. Pushes are held (their frames, not copies) until the round closes, and the
 * reply the layer encodes is sent to every member from its buffers.
 *
 * A round closes on the scheduler's word, so that every server aggregates over the same
 * workers even when one dies half-way through its pushes: the scheduler's ITERATE names the
 * round's members (and names them again, one fewer, when it cuts a lost worker out); when
 * the pushes of every member are in, the server says HAVE; once every server has, the
 * scheduler sends COMMIT with the final set, and the server aggregates over exactly that
 * set. A worker that joins (or fell behind) PULLs the master shard first. */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mqgrad/checkpoint.h"
#include "mqgrad/inbox.h"
#include "mqgrad/kv.h"
#include "mqgrad/nn.h"
#include "mqgrad/node.h"
#include "mqgrad/ps.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/wire.h"

/* One worker's push for the current iteration, kept as received: the key/value layer holds
 * pointers into these frames until the round completes. */
typedef struct {
    uint32_t n;
    zmq_msg_t frames[MQ_WIRE_MAX_TENSORS];
    uint8_t peer[MQ_WIRE_MAX_PEER]; /* the worker that owns this rank: set by its first push */
    size_t peer_len;
} s_slot_t;

typedef struct {
    mq_node_t node; /* scheduler link, pipe, drops, port */
    const mq_server_config_t *cfg;
    zloop_t *loop;
    zsock_t *data;
    char endpoint[256];
    bool welcomed;
    uint32_t rank;
    mq_run_config_t run;
    mq_model_t *model; /* its parameters are the master copy (this shard's range is used) */
    bool awaiting_seed; /* the workers' model: its values come from a worker's SEED */
    mq_codec_t codec;  /* the run's codec for quantized segments, level set per iteration */
    const mq_codec_ops_t *codec_ops; /* its table, looked up once a run */
    mq_kv_t *kv;       /* the shard, the round in flight, the reply, the master-copy update */
    mq_widths_t push_widths; /* the push being taken: its levels */
    s_slot_t *slots;   /* one per worker */
    uint32_t *terms;   /* one per worker rank: the newest term seen (mqgrad/security.h) */
    /* the round in flight: its member set as the scheduler last named it */
    bool set_known, have_sent;
    uint32_t view, nmembers;
    /* sized by the run's worker ranks (WELCOME's), as slots and terms are */
    uint32_t *members;
    uint32_t *member_terms; /* ITERATE's: each member's term */
    int *member_at;         /* by rank: its index in members, -1 outside them */
    uint32_t *ranks;        /* scratch: the ranks a reply or a PROGRESS goes to or names */
    /* under a straggler policy: the last round's reply, kept (references on the layer's
     * buffers) until the next round closes, for a member cut from it whose push comes late:
     * it gets the reply too, and stays in step without pulling the whole model */
    bool kept;
    uint64_t kept_iter;
    uint32_t kept_n;
    mq_tensor_hdr_t kept_hdrs[MQ_WIRE_MAX_TENSORS];
    mq_payload_t kept_payloads[MQ_WIRE_MAX_TENSORS];
    bool *late_sent; /* by rank */
    struct s_snapshot *snapshot; /* the master shard as PULLs of its iteration get it */
    uint64_t keep_from; /* the run's last consistent checkpoint: never pruned (0: none) */
    mq_link_t link;
    mq_msg_t in, out;
    mq_inbox_t data_in, sched_in; /* the data socket's and the scheduler link's */
    char refusal[128];              /* why data_in refused a message */
    mq_sec_t *sec;
    uint8_t run_key[MQ_RUN_KEY_LEN]; /* WELCOME's: workers' tokens derive from it */
    struct {
        mq_metric_t *shard, *rounds, *pushes, *received, *sent, *aggregate, *checkpoint;
        mq_metric_t *drops[MQ_DROP_COUNT_];
    } m; /* in cfg->metrics, all NULL without one */
} s_server_t;

static void s_snapshot_release(struct s_snapshot *s);

static void s_metrics_init(s_server_t *self)
{
    mq_metrics_t *m = self->cfg->metrics;
    if (!m)
        return;
    self->m.shard = mq_metrics_gauge(m, "mqgrad_server_shard",
                                     "The shard this server holds (-1 before it has one).", NULL);
    mq_metric_set(self->m.shard, -1);
    self->m.rounds = mq_metrics_counter(m, "mqgrad_server_rounds_total",
                                        "Rounds aggregated and answered.", NULL);
    self->m.pushes = mq_metrics_counter(m, "mqgrad_server_pushes_total",
                                        "Workers' pushes taken into a round.", NULL);
    self->m.received = mq_metrics_counter(m, "mqgrad_server_received_bytes_total",
                                          "Bytes of the pushes taken.", NULL);
    self->m.sent = mq_metrics_counter(m, "mqgrad_server_sent_bytes_total",
                                      "Bytes of the aggregates sent, over all receivers.", NULL);
    self->m.aggregate = mq_metrics_histogram(
        m, "mqgrad_server_aggregate_seconds",
        "Time to aggregate a round: decode the pushes, average, update, encode the reply.", NULL,
        mq_metrics_seconds_bounds, mq_metrics_seconds_nbounds);
    self->m.checkpoint = mq_metrics_gauge(m, "mqgrad_server_last_checkpoint_timestamp_seconds",
                                          "When the shard's last checkpoint was written, Unix "
                                          "seconds (0: none yet).",
                                          NULL);
    mq_drops_series(m, "mqgrad_server_dropped_messages_total", self->m.drops);
}

int mq_server_config_parse(mq_server_config_t *cfg, int argc, char **argv)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->scheduler, "tcp://127.0.0.1:7000");
    strcpy(cfg->bind, "tcp://*:7100");
    cfg->peer_timeout = 60;
    cfg->shard = -1;
    const mq_flag_t flags[] = {
        {"scheduler", "MQGRAD_SCHEDULER", MQ_FLAG_STR, cfg->scheduler, sizeof cfg->scheduler, 0,
         0, "scheduler endpoint"},
        {"bind", "MQGRAD_SERVER_BIND", MQ_FLAG_STR, cfg->bind, sizeof cfg->bind, 0, 0,
         "endpoint to bind for workers"},
        {"advertise", "MQGRAD_ADVERTISE", MQ_FLAG_STR, cfg->advertise, sizeof cfg->advertise, 0,
         0, "endpoint workers should use (default: bind with this host's address)"},
        {"peer-timeout", "MQGRAD_PEER_TIMEOUT", MQ_FLAG_DOUBLE, &cfg->peer_timeout, 0, 1, 86400,
         "seconds of scheduler silence before giving up"},
        {"dump", NULL, MQ_FLAG_STR, cfg->dump, sizeof cfg->dump, 0, 0,
         "write the final master shard (raw float32) to this file"},
        {"checkpoint-dir", "MQGRAD_CHECKPOINT_DIR", MQ_FLAG_STR, cfg->checkpoint_dir,
         sizeof cfg->checkpoint_dir, 0, 0,
         "directory for shard checkpoints, on a volume that outlives the server (none: no "
         "checkpoints)"},
        {"shard", "MQGRAD_SHARD", MQ_FLAG_LONG, &cfg->shard, 0, -1, MQ_FLAG_MAX_SERVERS - 1,
         "the shard to hold when the run starts, if no other server asks for it: a stable "
         "identity (a StatefulSet's pod index) keeps each volume's checkpoints with their "
         "shard (-1: any)"},
        MQ_SEC_FLAGS(&cfg->sec),
        MQ_HTTP_FLAGS(&cfg->http),
        {0},
    };
    mq_http_cfg_init(&cfg->http, 0);
    int rc = mq_flags_parse(flags, argc, argv, "usage: mqgrad-server [flags]", NULL, 0, NULL);
    return rc != 0 ? rc : mq_sec_config_check(&cfg->sec, "mqgrad-server");
}

static void s_fail(s_server_t *self, const char *what)
{
    mq_node_finish(&self->node, 1, what);
}

static int s_setup(s_server_t *self, const mq_layout_t *layout)
{
    const mq_run_config_t *r = &self->run;
    int channels = strcmp(r->dataset, "cifar10") == 0 ? 3 : 1;
    if (strcmp(r->model, "external") == 0) /* the workers' own model: its layout */
        self->model = mq_model_from_layout(layout);
    else
        self->model = mq_model_new(r->model, channels, 1, r->l2);
    if (!self->model)
        return -1;
    mq_model_init(self->model, r->seed); /* the same initial parameters as every worker */
    mq_kv_config_t kc = {
        .servers = r->servers,
        .rank = self->rank,
        .workers = r->workers,
        .threshold = r->quant_threshold,
        .fp32 = r->fp32,
        .rng_seed = r->seed * 7919ULL + 0x5e4e + self->rank,
    };
    if (mq_codec_parse(r->codec, &self->codec) != 0 || mq_optim_parse(r->optimizer, &kc.optim))
        return -1;
    self->codec_ops = mq_codec_ops(&self->codec); /* the parse found it */
    kc.codec = self->codec;
    self->kv = mq_kv_new(self->model, &kc);
    if (!self->kv)
        return -1;
    self->slots = calloc(r->workers, sizeof *self->slots);
    self->terms = calloc(r->workers, sizeof *self->terms);
    self->members = calloc(r->workers, sizeof *self->members);
    self->member_terms = calloc(r->workers, sizeof *self->member_terms);
    self->member_at = malloc(r->workers * sizeof *self->member_at);
    self->ranks = calloc(r->workers, sizeof *self->ranks);
    self->late_sent = calloc(r->workers, sizeof *self->late_sent);
    if (!self->slots || !self->terms || !self->members || !self->member_terms ||
        !self->member_at || !self->ranks || !self->late_sent) {
        mq_err_set("out of memory for %u workers", r->workers);
        return -1;
    }
    for (uint32_t k = 0; k < r->workers; k++) /* no member set yet */
        self->member_at[k] = -1;
    return mq_link_setup(&self->link, r, "server", self->rank);
}

/* The checkpoint's identity for iteration ITER. */
static mq_ckpt_meta_t s_ckpt_meta(const s_server_t *self, uint64_t iter)
{
    mq_ckpt_meta_t m = {.lineage = self->run.lineage, .iter = iter, .shard = self->rank,
                        .servers = self->run.servers};
    snprintf(m.model, sizeof m.model, "%s", self->run.model);
    snprintf(m.optimizer, sizeof m.optimizer, "%s", self->run.optimizer);
    return m;
}

/* The shard's values and state in freshly allocated buffers (a checkpoint is rare enough to
 * allocate for), or -1 out of memory. */
static int s_shard_buffers(s_server_t *self, float **params, float **state, size_t *n,
                           size_t *nstate)
{
    *n = mq_kv_size(self->kv);
    *nstate = *n * mq_kv_state_per(self->kv);
    *params = malloc(*n * sizeof(float) + 1);
    *state = malloc(*nstate * sizeof(float) + 1);
    if (!*params || !*state) {
        free(*params);
        free(*state);
        mq_err_set("out of memory for a checkpoint of %zu values", *n);
        return -1;
    }
    return 0;
}

/* Starts from the checkpoint of iteration ITER (a resumed run); -1 with the reason. */
static int s_restore(s_server_t *self, uint64_t iter)
{
    if (!self->cfg->checkpoint_dir[0]) {
        mq_err_set("the run resumes at iteration %llu but this server has no --checkpoint-dir",
                   (unsigned long long)iter);
        return -1;
    }
    float *params, *state;
    size_t n, nstate;
    if (s_shard_buffers(self, &params, &state, &n, &nstate) != 0)
        return -1;
    mq_ckpt_meta_t m = s_ckpt_meta(self, iter);
    int rc = mq_ckpt_read(self->cfg->checkpoint_dir, &m, params, n, state, nstate);
    if (rc == 0) {
        mq_kv_restore(self->kv, iter, params, state);
        s_snapshot_release(self->snapshot); /* of the same iteration number, not content */
        self->snapshot = NULL;
        mq_info("resumed shard %u from its checkpoint of iteration %llu", self->rank,
                (unsigned long long)iter);
    }
    free(params);
    free(state);
    return rc;
}

/* Writes the shard as of the start of the current round and tells the scheduler. */
static void s_checkpoint(s_server_t *self)
{
    uint64_t iter = mq_kv_iter(self->kv);
    mq_msg_init(&self->out, MQ_MSG_SAVED);
    self->out.peer_len = 0;
    self->out.iter = iter;
    self->out.saved.shard = self->rank;
    char *error = self->out.saved.error;
    size_t error_len = sizeof self->out.saved.error;
    float *params = NULL, *state = NULL;
    size_t n, nstate;
    if (!self->cfg->checkpoint_dir[0]) {
        snprintf(error, error_len, "server %u has no --checkpoint-dir", self->rank);
    } else if (s_shard_buffers(self, &params, &state, &n, &nstate) != 0) {
        snprintf(error, error_len, "%s", mq_err_last());
    } else {
        mq_kv_export(self->kv, params, state);
        mq_ckpt_meta_t m = s_ckpt_meta(self, iter);
        if (mq_ckpt_write(self->cfg->checkpoint_dir, &m, params, n, state, nstate,
                          self->keep_from) != 0)
            snprintf(error, error_len, "%s", mq_err_last());
        else
            mq_metric_set(self->m.checkpoint, (double)time(NULL));
    }
    free(params);
    free(state);
    if (error[0])
        mq_warn("checkpoint of iteration %llu: %s", (unsigned long long)iter, error);
    mq_wire_send(self->node.sched, &self->out, NULL, 0);
}

/* ERROR to the scheduler: "server R: WHAT: the last error", about iteration ITER; UNREADABLE
 * says it is this shard of that iteration's checkpoint. */
static void s_tell_error(s_server_t *self, const char *what, uint64_t iter, bool unreadable)
{
    mq_msg_init(&self->out, MQ_MSG_ERROR);
    self->out.peer_len = 0;
    self->out.iter = iter;
    self->out.role = MQ_ROLE_SERVER;
    self->out.rank = self->rank;
    self->out.error.unreadable_checkpoint = unreadable;
    snprintf(self->out.error.reason, sizeof self->out.error.reason, "server %u: %s: %s",
             self->rank, what, mq_err_last());
    mq_wire_send(self->node.sched, &self->out, NULL, 0);
}

/* Tells the scheduler why this server cannot take part, then ends. */
static void s_fail_loudly(s_server_t *self, const char *what)
{
    s_tell_error(self, what, 0, false);
    s_fail(self, what);
}

/* This shard of the checkpoint the run goes on from (ITER) cannot be read: the file is moved
 * aside as it is (SHARD.ckpt.unreadable, which pruning never takes and a new checkpoint of
 * the same iteration cannot overwrite), and the scheduler is told, which goes back to the
 * checkpoint before it (every node then registers again) or, without one, ends the run. The
 * server waits for its word. */
static void s_unreadable(s_server_t *self, uint64_t iter)
{
    mq_error("resume: %s", mq_err_last());
    s_tell_error(self, "resume", iter, true); /* before the rename below sets another error */
    if (self->cfg->checkpoint_dir[0]) {
        char path[1100], aside[1200];
        mq_ckpt_meta_t m = s_ckpt_meta(self, iter);
        mq_ckpt_path(self->cfg->checkpoint_dir, &m, path, sizeof path);
        snprintf(aside, sizeof aside, "%s.unreadable", path);
        if (rename(path, aside) == 0)
            mq_warn("moved %s aside, as it is, to %s", path, aside);
    }
}

/* Set up and holding the values the run starts from: iterations may start. */
static void s_ready(s_server_t *self)
{
    const mq_shard_t *shard = mq_kv_shard(self->kv);
    mq_info("ready: shard %u holds [%llu, %llu) in %u segments, %u workers", self->rank,
            (unsigned long long)shard->begin, (unsigned long long)shard->end, shard->nsegs,
            self->run.workers);
    if (mq_node_ready(&self->node, self->rank) != 0)
        s_fail(self, "ready");
}

/* A run of the workers' own model starts from the values of the worker the scheduler named
 * (WELCOME's seed): its SEED holds the shard's segments in fp32. Taken once, before the
 * first round; the master copy's update-rule state starts at zero. */
static bool s_rank_request_ok(s_server_t *self, const mq_msg_t *msg);

static void s_on_seed(void *arg, mq_msg_t *msg, const mq_shard_msg_t *seed)
{
    s_server_t *self = arg;
    if (!s_rank_request_ok(self, msg))
        return;
    const mq_shard_t *shard = mq_kv_shard(self->kv);
    const char *why = NULL;
    mq_drop_t d = MQ_DROP_NONE;
    if (!self->awaiting_seed || msg->iter != 0)
        d = MQ_DROP_DUPLICATE, why = "values when the shard has its own";
    else if (seed->shard != self->rank)
        d = MQ_DROP_SHARD, why = "values for another shard";
    else if (msg->ntensors != shard->nsegs)
        d = MQ_DROP_LAYOUT, why = "values not cut as the shard's segments";
    for (uint32_t i = 0; d == MQ_DROP_NONE && i < shard->nsegs; i++) {
        const mq_tensor_hdr_t *h = &msg->tensors[i];
        const mq_segment_t *seg = &shard->segs[i];
        if (h->codec.id != MQ_CODEC_ID_none || strcmp(h->name, seg->name) != 0 ||
            h->offset != seg->offset || h->count != seg->count)
            d = MQ_DROP_LAYOUT, why = "values not as the shard's segments in fp32";
    }
    if (d != MQ_DROP_NONE) {
        mq_drops_note(&self->node.drops, d, msg->peer, msg->peer_len, why);
        return;
    }
    float *params, *state;
    size_t n, nstate;
    if (s_shard_buffers(self, &params, &state, &n, &nstate) != 0) {
        s_fail_loudly(self, "seed");
        return;
    }
    size_t at = 0;
    for (uint32_t i = 0; i < shard->nsegs; i++) {
        memcpy(params + at, msg->payload[i], shard->segs[i].count * sizeof(float));
        at += shard->segs[i].count;
    }
    memset(state, 0, nstate * sizeof(float));
    mq_kv_restore(self->kv, 0, params, state);
    free(params);
    free(state);
    self->awaiting_seed = false;
    mq_info("took worker %u's values of the shard", msg->rank);
    s_ready(self);
}

static void s_on_welcome(void *arg, mq_msg_t *msg, const mq_welcome_t *w)
{
    s_server_t *self = arg;
    if (self->welcomed)
        return;
    self->run = w->config;
    self->rank = w->rank;
    if (self->rank >= self->run.servers || self->run.workers == 0 ||
        self->run.workers > MQ_FLAG_MAX_WORKERS) {
        mq_err_set("inconsistent welcome (rank %u of %u servers, %u workers)", self->rank,
                   self->run.servers, self->run.workers);
        s_fail(self, "welcome");
        return;
    }
    if (!w->has_run_key) {
        mq_err_set("welcome without the run key");
        s_fail(self, "welcome");
        return;
    }
    memcpy(self->run_key, w->run_key, MQ_RUN_KEY_LEN);
    mq_log_set_tag("server %u", self->rank);
    self->welcomed = true;
    if (mq_node_welcomed(&self->node, self->loop, msg) != 0 ||
        s_setup(self, &msg->layout) != 0) {
        s_fail_loudly(self, "setup");
        return;
    }
    if (self->run.resume_iter > 0 && s_restore(self, self->run.resume_iter) != 0) {
        s_unreadable(self, self->run.resume_iter);
        return;
    }
    mq_metric_set(self->m.shard, self->rank);
    self->awaiting_seed = strcmp(self->run.model, "external") == 0 && self->run.resume_iter == 0;
    if (self->awaiting_seed)
        mq_info("set up: waiting for the first worker's values of the shard");
    else
        s_ready(self);
}

/* ---- aggregation --------------------------------------------------------------------- */

static void s_release_slots(s_server_t *self)
{
    for (uint32_t r = 0; r < self->run.workers; r++) {
        s_slot_t *slot = &self->slots[r];
        for (uint32_t i = 0; i < slot->n; i++)
            zmq_msg_close(&slot->frames[i]);
        slot->n = 0;
    }
}

/* The scheduler committed the round over self->members: the key/value layer makes the reply
 * (and updates the master copy) from exactly those pushes, every push's frames go, and every
 * member gets the reply from the layer's buffers. */
static void s_drop_kept(s_server_t *self)
{
    for (uint32_t i = 0; self->kept && i < self->kept_n; i++)
        self->kept_payloads[i].free_fn((void *)self->kept_payloads[i].data,
                                       self->kept_payloads[i].hint);
    self->kept = false;
}

/* The kept reply to a member whose push for it came late. */
static void s_send_kept(s_server_t *self, const mq_msg_t *push)
{
    if (!self->kept || push->iter != self->kept_iter || push->rank >= self->run.workers ||
        self->late_sent[push->rank])
        return;
    self->late_sent[push->rank] = true;
    mq_msg_init(&self->out, MQ_MSG_AGGREGATE);
    memcpy(self->out.peer, push->peer, push->peer_len);
    self->out.peer_len = push->peer_len;
    self->out.iter = self->kept_iter;
    self->out.aggregate.shard = self->rank;
    self->out.ntensors = self->kept_n;
    memcpy(self->out.tensors, self->kept_hdrs, self->kept_n * sizeof *self->kept_hdrs);
    mq_payload_t copy[MQ_WIRE_MAX_TENSORS];
    size_t bytes = 0;
    for (uint32_t i = 0; i < self->kept_n; i++) {
        const mq_payload_t *k = &self->kept_payloads[i];
        copy[i] = mq_sendbuf_payload(k->hint, k->data, k->len);
        bytes += k->len;
    }
    self->out.sim_time = mq_link_egress(&self->link, bytes);
    if (mq_wire_reply_payloads(self->data, &self->out, copy, self->kept_n,
                               &self->node.drops) != 0)
        mq_warn("aggregate %llu to a late worker %u: %s", (unsigned long long)self->kept_iter,
                push->rank, mq_err_last());
}

static void s_complete(s_server_t *self)
{
    mq_payload_t payloads[MQ_WIRE_MAX_TENSORS];
    uint32_t nsegs = mq_kv_shard(self->kv)->nsegs;
    s_drop_kept(self); /* the layer waits until no reply of the last round is held */
    mq_link_settle(&self->link); /* simulated clock: every push has streamed in */
    /* Every worker whose push is in gets the reply: the members, and under a straggler
     * policy those cut from the round whose pushes came before it closed. */
    uint32_t *to = self->ranks, nto = 0;
    for (uint32_t r = 0; r < self->run.workers; r++)
        if (mq_kv_has(self->kv, r))
            to[nto++] = r;
    mq_msg_init(&self->out, MQ_MSG_AGGREGATE);
    self->out.iter = mq_kv_iter(self->kv);
    self->out.aggregate.shard = self->rank;
    self->out.ntensors = nsegs;
    double t0 = mq_now_s();
    if (mq_kv_complete_set(self->kv, self->members, self->nmembers, self->out.tensors,
                           payloads) != 0) {
        s_fail(self, "aggregate");
        return;
    }
    mq_metric_observe(self->m.aggregate, mq_now_s() - t0);
    s_release_slots(self);
    self->set_known = false;
    size_t bytes = 0;
    for (uint32_t i = 0; i < nsegs; i++)
        bytes += payloads[i].len;
    for (uint32_t k = 0; k < nto; k++) {
        uint32_t r = to[k];
        /* Each send takes its own references on the buffers; ours are dropped after. */
        mq_payload_t copy[MQ_WIRE_MAX_TENSORS];
        for (uint32_t i = 0; i < nsegs; i++)
            copy[i] = mq_sendbuf_payload(payloads[i].hint, payloads[i].data, payloads[i].len);
        memcpy(self->out.peer, self->slots[r].peer, self->slots[r].peer_len);
        self->out.peer_len = self->slots[r].peer_len;
        self->out.sim_time = mq_link_egress(&self->link, bytes);
        /* Without waiting: a member that does not read loses it (counted unread), and the
         * scheduler's --iter-timeout takes it out; the others are served on time. */
        if (mq_wire_reply_payloads(self->data, &self->out, copy, nsegs, &self->node.drops) != 0)
            mq_warn("aggregate %llu to worker %u: %s", (unsigned long long)self->out.iter, r,
                    mq_err_last());
    }
    mq_metric_add(self->m.rounds, 1);
    mq_metric_add(self->m.sent, (double)(bytes * nto));
    if (self->run.report_pushes) { /* ours become the kept ones */
        self->kept = true;
        self->kept_iter = self->out.iter;
        self->kept_n = nsegs;
        memcpy(self->kept_hdrs, self->out.tensors, nsegs * sizeof *self->kept_hdrs);
        memcpy(self->kept_payloads, payloads, nsegs * sizeof *payloads);
        memset(self->late_sent, 0, self->run.workers * sizeof *self->late_sent);
        for (uint32_t k = 0; k < nto; k++) /* they have it */
            self->late_sent[to[k]] = true;
        return;
    }
    for (uint32_t i = 0; i < nsegs; i++)
        payloads[i].free_fn((void *)payloads[i].data, payloads[i].hint);
}

/* Under a straggler policy the scheduler follows every push, to close a round without the
 * late ones. */
static void s_progress(s_server_t *self)
{
    if (!self->run.report_pushes)
        return;
    mq_msg_init(&self->out, MQ_MSG_PROGRESS);
    self->out.peer_len = 0;
    self->out.iter = mq_kv_iter(self->kv);
    mq_members_t *p = &self->out.progress;
    p->shard = self->rank;
    p->view = self->view;
    p->members = self->ranks;
    for (uint32_t r = 0; r < self->run.workers; r++)
        if (mq_kv_has(self->kv, r))
            p->members[p->n_members++] = r;
    mq_wire_send(self->node.sched, &self->out, NULL, 0);
}

/* Tells the scheduler once per member set when every member's push is in. */
static void s_maybe_have(s_server_t *self)
{
    if (!self->set_known || self->have_sent || self->nmembers == 0 ||
        !mq_kv_has_all(self->kv, self->members, self->nmembers))
        return;
    mq_msg_init(&self->out, MQ_MSG_HAVE);
    self->out.peer_len = 0;
    self->out.iter = mq_kv_iter(self->kv);
    self->out.have.shard = self->rank;
    self->out.have.view = self->view;
    /* simulated clock: when the last push streamed in; the commit comes after every
     * server's, as it does on the real clock */
    self->out.sim_time = self->link.simulated ? mq_link_settle(&self->link) : 0;
    if (mq_wire_send(self->node.sched, &self->out, NULL, 0) != 0)
        mq_warn("have %llu: %s", (unsigned long long)self->out.iter, mq_err_last());
    self->have_sent = true;
}

/* Whether MEMBERS[0..N) (strictly increasing: the wire checked it) are ranks of the run: a
 * set of the scheduler's always is. */
static bool s_members_of_run(const s_server_t *self, const uint32_t *members, uint32_t n)
{
    return n <= self->run.workers && (n == 0 || members[n - 1] < self->run.workers);
}

/* The round's member set is MEMBERS[0..N) (s_members_of_run); each rank's place in it is kept
 * too, so that a message's rank is looked up, not searched for. */
static void s_set_members(s_server_t *self, const uint32_t *members, uint32_t n)
{
    for (uint32_t k = 0; k < self->nmembers; k++)
        self->member_at[self->members[k]] = -1;
    self->nmembers = n;
    if (n) /* none: MEMBERS is NULL (a [grow] field with no entries) */
        memcpy(self->members, members, n * sizeof *members);
    for (uint32_t k = 0; k < n; k++)
        self->member_at[members[k]] = (int)k;
}

/* The scheduler names the round's members (again, with a higher view, after a cut). */
static void s_on_iterate(void *arg, mq_msg_t *msg, const mq_iterate_t *it)
{
    s_server_t *self = arg;
    if (!self->kv)
        return;
    uint64_t iter = mq_kv_iter(self->kv);
    if (msg->iter != iter || (self->set_known && it->view <= self->view)) {
        mq_drops_note(&self->node.drops, msg->iter < iter ? MQ_DROP_LATE : MQ_DROP_ITER,
                      (const uint8_t *)"sched", 5, "member set for another round");
        return;
    }
    if (!s_members_of_run(self, it->members, it->n_members)) {
        mq_drops_note(&self->node.drops, MQ_DROP_RANK, (const uint8_t *)"sched", 5,
                      "a member set with ranks the run does not have");
        return;
    }
    if (!self->set_known) /* a round's first view: its time is the round's start */
        mq_link_anchor(&self->link, it->run_time);
    if (it->checkpoint && !self->set_known) {
        self->keep_from = it->keep_from;
        s_checkpoint(self); /* the shard as of the round's start (only its commit changes it) */
    }
    self->set_known = true;
    self->have_sent = false;
    self->view = it->view;
    s_set_members(self, it->members, it->n_members);
    for (uint32_t k = 0; k < it->n_members; k++) { /* a rank's term only grows */
        uint32_t term = it->n_member_terms ? it->member_terms[k] : 0; /* [pairs]: all or none */
        self->member_terms[k] = term;
        if (term > self->terms[it->members[k]])
            self->terms[it->members[k]] = term;
    }
    if (self->nmembers == 0) { /* every member is gone: the round will be run again */
        mq_kv_discard(self->kv);
        s_release_slots(self);
        self->set_known = false;
        return;
    }
    s_maybe_have(self);
}

static void s_on_commit(void *arg, mq_msg_t *msg, const mq_members_t *c)
{
    s_server_t *self = arg;
    if (!self->kv)
        return;
    if (!self->set_known || msg->iter != mq_kv_iter(self->kv) || c->view != self->view ||
        c->n_members == 0 || !s_members_of_run(self, c->members, c->n_members) ||
        !mq_kv_has_all(self->kv, c->members, c->n_members)) {
        mq_drops_note(&self->node.drops, MQ_DROP_ITER, (const uint8_t *)"sched", 5,
                      "commit for a round this server cannot close");
        return;
    }
    s_set_members(self, c->members, c->n_members);
    for (uint32_t k = 0; k < c->n_members; k++) /* members of the round: their terms' */
        self->member_terms[k] = self->terms[c->members[k]];
    mq_link_sync(&self->link, msg->sim_time);
    s_complete(self);
}

/* The master shard and the update rule's state as of one iteration, shared by every PARAMS
 * reply of that iteration: however many workers pull (or a peer that pulls and never reads),
 * one copy exists per iteration, freed when the server and the last send let go of it. */
typedef struct s_snapshot {
    atomic_int refs;
    uint64_t iter;
    size_t n, nstate;
    float *params, *state; /* state: NULL without one */
} s_snapshot_t;

static void s_snapshot_release(struct s_snapshot *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        free(s->params);
        free(s->state);
        free(s);
    }
}

/* A send's free function: the send's reference (on a ZeroMQ I/O thread). */
static void s_snapshot_sent(void *data, void *hint)
{
    (void)data;
    s_snapshot_release(hint);
}

/* The snapshot of the current iteration: the one held, or a new one (the old released).
 * NULL when out of memory. */
static s_snapshot_t *s_snapshot(s_server_t *self, uint64_t iter)
{
    if (self->snapshot && self->snapshot->iter == iter)
        return self->snapshot;
    s_snapshot_release(self->snapshot);
    self->snapshot = NULL;
    s_snapshot_t *s = calloc(1, sizeof *s);
    size_t n = mq_kv_size(self->kv), nstate = n * mq_kv_state_per(self->kv);
    if (!s || !(s->params = malloc(n * sizeof(float) + 1)) ||
        (nstate && !(s->state = malloc(nstate * sizeof(float))))) {
        if (s)
            free(s->params);
        free(s);
        return NULL;
    }
    atomic_init(&s->refs, 1); /* the server's */
    s->iter = iter;
    s->n = n;
    s->nstate = nstate;
    mq_kv_export(self->kv, s->params, s->state);
    return self->snapshot = s;
}

/* A worker that joins (or missed rounds) asks for the master shard as of the current round:
 * every reply of one iteration shares one snapshot, sent without copying and without
 * waiting (a peer that does not read loses its reply, counted), so PULLs cannot multiply the
 * server's memory nor stall it. */
static void s_on_pull(void *arg, mq_msg_t *msg, const mq_shard_msg_t *pull)
{
    s_server_t *self = arg;
    if (!s_rank_request_ok(self, msg))
        return;
    uint64_t iter = mq_kv_iter(self->kv);
    mq_msg_t *out = &self->out;
    memcpy(out->peer, msg->peer, msg->peer_len); /* the reply goes to whoever asked */
    out->peer_len = msg->peer_len;
    if (msg->iter != iter) {
        mq_msg_init(out, MQ_MSG_ERROR);
        out->iter = iter;
        snprintf(out->error.reason, sizeof out->error.reason, "pull for iteration %llu, this server is at %llu",
                 (unsigned long long)msg->iter, (unsigned long long)iter);
        mq_wire_reply(self->data, out, &self->node.drops);
        return;
    }
    s_snapshot_t *snap = s_snapshot(self, iter);
    if (!snap) {
        mq_drops_note(&self->node.drops, MQ_DROP_TOO_MANY, msg->peer, msg->peer_len,
                      "out of memory for a pull");
        return;
    }
    mq_msg_init(out, MQ_MSG_PARAMS);
    out->iter = iter;
    out->params.shard = self->rank;
    out->ntensors = snap->nstate ? 2 : 1;
    /* One reference per payload: each frame's free function lets go of its own. */
    atomic_fetch_add(&snap->refs, (int)out->ntensors);
    mq_payload_t payloads[2] = {
        {snap->params, snap->n * sizeof(float), s_snapshot_sent, snap},
        {snap->state, snap->nstate * sizeof(float), s_snapshot_sent, snap}};
    const char *names[2] = {"params", "state"};
    size_t counts[2] = {snap->n, snap->nstate};
    for (uint32_t i = 0; i < out->ntensors; i++) {
        snprintf(out->tensors[i].name, sizeof out->tensors[i].name, "%s", names[i]);
        out->tensors[i].count = counts[i];
        out->tensors[i].codec = mq_codec_none();
    }
    out->sim_time = mq_link_egress(&self->link, (snap->n + snap->nstate) * sizeof(float));
    if (mq_wire_reply_payloads(self->data, out, payloads, out->ntensors, &self->node.drops) != 0)
        mq_debug("params for iteration %llu: %s", (unsigned long long)iter, mq_err_last());
    else
        mq_info("sent the master shard at iteration %llu to a worker that joins",
                (unsigned long long)iter);
}

/* A worker's message comes from the peer that holds its rank: its routing id is the token
 * the scheduler gave that rank in the term the message names (mqgrad/security.h), not
 * whoever spoke for the rank first, and that term is the rank's newest this server has seen
 * (a member of the round: exactly the round's). A token of an older term (its holder left or
 * was lost, the rank went to another) is revoked. */
static bool s_owner_ok(const s_server_t *self, const mq_msg_t *msg)
{
    if (msg->peer_len != MQ_TOKEN_LEN || msg->rank >= self->run.workers || msg->term == 0 ||
        msg->term < self->terms[msg->rank])
        return false;
    int k = self->set_known ? self->member_at[msg->rank] : -1; /* rank < workers: checked */
    if (k >= 0 && msg->term != self->member_terms[k])
        return false;
    uint8_t token[MQ_TOKEN_LEN]; /* a keyed hash of 16 bytes: cheaper than keeping a table */
    mq_token_make(self->run_key, MQ_ROLE_WORKER, msg->rank, msg->term, token);
    return mq_token_equal(token, msg->peer);
}

/* Validates a push against the run's state and reads its levels into W; returns the drop
 * reason or MQ_DROP_NONE. A push that is the round's, from the holder of its rank, is charged
 * to the emulated link before its layout is checked: its bytes crossed the link whether or
 * not the layout is then taken. */
static mq_drop_t s_check_push(s_server_t *self, const mq_msg_t *msg, mq_widths_t *w,
                              const char **why)
{
    const mq_run_config_t *r = &self->run;
    if (!self->welcomed)
        return *why = "push before the run started", MQ_DROP_ITER;
    if (msg->run_id != self->node.run_id)
        return *why = "push of another run", MQ_DROP_RUN;
    if (msg->push.shard != self->rank)
        return *why = "push for another shard", MQ_DROP_SHARD;
    if (msg->rank >= r->workers)
        return *why = "push from an unknown rank", MQ_DROP_RANK;
    if (!s_owner_ok(self, msg))
        return *why = "push from a peer that does not hold the rank's token", MQ_DROP_AUTH;
    uint64_t iter = mq_kv_iter(self->kv);
    if (msg->iter < iter) /* a straggler's, for a round already closed without it */
        return *why = "push for a closed round", MQ_DROP_LATE;
    if (msg->iter != iter)
        return *why = "future iteration", MQ_DROP_ITER;
    /* Under a straggler policy a member cut from the round still pushes: its push is kept
     * (not aggregated) so that it gets the round's reply and stays in step. */
    if (self->set_known && !r->report_pushes && self->member_at[msg->rank] < 0)
        return *why = "push from a worker that is not a member of the round", MQ_DROP_RANK;
    if (self->slots[msg->rank].n > 0) /* its frames are held until the round closes */
        return *why = "second push from a rank", MQ_DROP_DUPLICATE;
    mq_link_arrive(&self->link, msg->wire_bytes, msg->sim_time);
    if (!(msg->push.lr > 0))
        return *why = "bad learning rate", MQ_DROP_CODEC;
    if (mq_widths_read(w, self->codec_ops, r->fp32, (int)msg->push.bits, msg->push.widths,
                       msg->push.n_widths, (uint32_t)mq_model_ntensors(self->model)) != 0)
        return *why = mq_err_last(), MQ_DROP_CODEC;
    if (mq_kv_pending(self->kv) > 0 &&
        (!mq_widths_equal(w, mq_kv_widths(self->kv)) || msg->push.lr != mq_kv_lr(self->kv)))
        return *why = "bits or learning rate differ from the other pushes", MQ_DROP_LAYOUT;
    if (mq_shard_check(mq_kv_shard(self->kv), msg, w, &self->codec, self->codec_ops) != 0)
        return *why = mq_err_last(), MQ_DROP_LAYOUT;
    return MQ_DROP_NONE;
}

static void s_on_push(void *arg, mq_msg_t *msg, const mq_push_t *push)
{
    s_server_t *self = arg;
    if (self->node.finished)
        return;
    const char *why = "";
    mq_drop_t d = s_check_push(self, msg, &self->push_widths, &why);
    s_slot_t *slot = NULL;
    if (d == MQ_DROP_NONE) {
        slot = &self->slots[msg->rank];
        const uint8_t *data[MQ_WIRE_MAX_TENSORS];
        size_t len[MQ_WIRE_MAX_TENSORS];
        slot->n = mq_msg_take_frames(msg, slot->frames); /* kept, not copied, until the commit */
        for (uint32_t i = 0; i < slot->n; i++) {
            /* after the move: a small message's bytes live inside its zmq_msg_t */
            data[i] = zmq_msg_data(&slot->frames[i]);
            len[i] = zmq_msg_size(&slot->frames[i]);
        }
        /* checked above, so a refusal is a bug: the push is dropped, not kept half-taken */
        if (mq_kv_push(self->kv, msg->iter, msg->rank, &self->push_widths, msg->push.lr, data,
                       len, slot->n) < 0) {
            for (uint32_t i = 0; i < slot->n; i++)
                zmq_msg_close(&slot->frames[i]);
            slot->n = 0;
            d = MQ_DROP_LAYOUT, why = mq_err_last();
        }
    }
    if (d != MQ_DROP_NONE) {
        mq_drops_note(&self->node.drops, d, msg->peer, msg->peer_len, why);
        if (d == MQ_DROP_LATE)
            s_send_kept(self, msg);
        return;
    }
    memcpy(slot->peer, msg->peer, msg->peer_len);
    slot->peer_len = msg->peer_len;
    mq_metric_add(self->m.pushes, 1);
    mq_metric_add(self->m.received, (double)msg->wire_bytes);
    s_progress(self);
    s_maybe_have(self);
}

/* ---- event handlers -------------------------------------------------------------------- */

/* Whether a worker's PULL or SEED may be served: the run is this server's and under way, and
 * the sender holds the token of the rank it names; else the drop is counted. */
static bool s_rank_request_ok(s_server_t *self, const mq_msg_t *msg)
{
    const char *what = mq_msg_type_name(msg->type);
    char why[96];
    if (!self->kv || msg->run_id != self->node.run_id) {
        snprintf(why, sizeof why, "%s before the run started, or of another run", what);
        mq_drops_note(&self->node.drops, MQ_DROP_RUN, msg->peer, msg->peer_len, why);
        return false;
    }
    if (!s_owner_ok(self, msg)) {
        snprintf(why, sizeof why, "%s from a peer that does not hold the rank's token", what);
        mq_drops_note(&self->node.drops, MQ_DROP_AUTH, msg->peer, msg->peer_len, why);
        return false;
    }
    return !self->node.finished;
}

/* Who may send what on the data socket (SECURITY.md): workers push, pull and seed; any key
 * of the cluster may ping. */
static mq_drop_t s_data_refusal(void *arg, mq_msg_t *msg, const char **why)
{
    s_server_t *self = arg;
    if (mq_sec_allows(self->sec, msg,
                      msg->type == MQ_MSG_PING ? MQ_KEYS_KNOWN : MQ_KEYS(MQ_KEY_WORKER)))
        return MQ_DROP_NONE;
    snprintf(self->refusal, sizeof self->refusal, "%s from a %s key: only workers push and pull",
             mq_msg_type_name(msg->type), mq_key_role_name(mq_sec_role(self->sec, msg)));
    *why = self->refusal;
    return MQ_DROP_AUTH;
}

static const mq_handlers_t s_data_handlers = {
    .push = s_on_push, .seed = s_on_seed, .pull = s_on_pull};

static void s_dump(s_server_t *self)
{
    if (!self->cfg->dump[0] || !self->kv)
        return;
    const mq_shard_t *shard = mq_kv_shard(self->kv);
    const float *w = mq_model_params(self->model) + shard->begin;
    if (mq_write_file_atomic(self->cfg->dump, w, (shard->end - shard->begin) * sizeof(float)) != 0)
        mq_error("dump: %s", mq_err_last());
}

static void s_on_stop(void *arg, mq_msg_t *msg, const mq_reason_t *stop)
{
    s_server_t *self = arg;
    mq_info("stop after %llu iterations: %s",
            (unsigned long long)(self->kv ? mq_kv_iter(self->kv) : 0),
            stop->reason[0] ? stop->reason : "run over");
    s_dump(self);
    mq_node_finish(&self->node, 0, NULL);
}

static const mq_handlers_t s_sched_handlers = {
    .welcome = s_on_welcome, .iterate = s_on_iterate, .commit = s_on_commit, .stop = s_on_stop};

static int s_on_sched(zloop_t *loop, zsock_t *sock, void *arg)
{
    s_server_t *self = arg;
    if (mq_node_recv(&self->node, &self->in) == 0)
        mq_inbox_handle(&self->sched_in, sock);
    return 0;
}

static void s_tick(void *arg)
{
    s_server_t *self = arg;
    mq_node_check_peer(&self->node);
    mq_drops_publish(self->m.drops, self->node.drops.count);
}

/* Binds the data socket and registers with the scheduler: 0, or 1 with the error. */
static int s_start(void *arg, mq_service_t *svc)
{
    s_server_t *self = arg;
    self->node.pipe = svc->pipe;
    self->loop = svc->loop;
    self->cfg = svc->cfg;
    svc->drops = &self->node.drops;
    s_metrics_init(self);
    int swept = self->cfg->checkpoint_dir[0] ? mq_tmp_sweep(self->cfg->checkpoint_dir, NULL) : 0;
    if (swept > 0)
        mq_info("removed %d temporary files that writers which died left in %s", swept,
                self->cfg->checkpoint_dir);
    self->data = zsock_new(ZMQ_ROUTER);
    if (!self->data)
        return mq_err_set("cannot create a socket"), 1;
    mq_wire_prepare(self->data, 2000, MQ_WIRE_MAX_MSG);
    zsock_set_router_handover(self->data, 1); /* a worker that rejoins takes its token back */
    if (!(self->sec = mq_sec_open(&self->cfg->sec, MQ_KEY_SERVER)) ||
        mq_sec_serve(self->sec, self->data, "the server's data socket") != 0)
        return 1;
    svc->sec = self->sec;
    if (mq_bind(self->data, self->cfg->bind, &svc->port) != 0)
        return 1;
    char bound[300];
    snprintf(bound, sizeof bound, "%.*s:%d",
             (int)(strrchr(self->cfg->bind, ':') - self->cfg->bind), self->cfg->bind,
             svc->port);
    if (self->cfg->advertise[0])
        snprintf(self->endpoint, sizeof self->endpoint, "%s", self->cfg->advertise);
    else if (mq_advertise_endpoint(bound, self->endpoint, sizeof self->endpoint) != 0)
        return 1;
    self->node.prefer_shard = (uint32_t)(self->cfg->shard + 1);
    if (mq_node_open(&self->node, svc->pipe, self->cfg->scheduler, MQ_ROLE_SERVER,
                     self->endpoint, self->cfg->peer_timeout, self->sec) != 0)
        return 1;
    mq_info("listening on %s (advertised as %s), registering with %s", self->cfg->bind,
            self->endpoint, self->cfg->scheduler);
    self->data_in = (mq_inbox_t){.on = &s_data_handlers, .self = self, .msg = &self->in,
                                 .drops = &self->node.drops, .refuse = s_data_refusal};
    self->sched_in = (mq_inbox_t){.on = &s_sched_handlers, .self = self, .msg = &self->in,
                                  .drops = &self->node.drops, .from = "sched", .from_len = 5};
    zloop_reader(self->loop, self->data, mq_inbox_read, &self->data_in);
    mq_node_listen(&self->node, self->loop, s_on_sched, self);
    return 0;
}

static void s_stop(void *arg)
{
    s_server_t *self = arg;
    if (self->slots)
        s_release_slots(self);
    s_drop_kept(self);
    mq_sec_unserve(self->sec, self->data);
    zsock_destroy(&self->data);
    s_snapshot_release(self->snapshot); /* after the socket: its sends hold their own */
    mq_node_close(&self->node);
    mq_sec_close(&self->sec); /* after its sockets */
    mq_kv_destroy(&self->kv); /* before the model: it holds the master copy's pointer */
    free(self->slots);
    free(self->terms);
    free(self->members), free(self->member_terms), free(self->member_at), free(self->ranks);
    free(self->late_sent);
    mq_model_destroy(&self->model);
    mq_msg_free(&self->in);
    mq_msg_free(&self->out);
}

static const mq_service_ops_t s_ops = {.name = "server",
                                       .size = sizeof(s_server_t),
                                       .start = s_start,
                                       .tick = s_tick,
                                       .stop = s_stop};

void mq_server_actor(zsock_t *pipe, void *args)
{
    mq_service_actor(pipe, &s_ops, args);
}
