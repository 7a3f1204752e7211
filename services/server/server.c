/* The server actor: register with the scheduler, learn the run and its shard, then aggregate
 * pushes. Pushes are held (their frames, not copies) until all workers' are in, decoded in
 * rank order into one sum, re-quantized into reusable buffers, and sent to every worker. */
#include "server.h"

#include <stdlib.h>
#include <string.h>

#include "mqgrad/nn.h"
#include "mqgrad/node.h"
#include "mqgrad/ps.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/wire.h"

#define S_BUF_TIMEOUT_MS 5000

/* One worker's push for the current iteration, kept as received. */
typedef struct {
    bool full;
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
    mq_shard_t shard;
    float *sum;        /* the mean of the current iteration, shard-local */
    mq_codec_t codec;  /* the run's codec for quantized segments, level set per iteration */
    mq_optim_t optim;  /* the update rule, applied to the master copy as workers apply it */
    float *opt_state;  /* its state over this shard's range */
    float *scratch;    /* one decoded segment, for rules other than plain SGD */
    mq_seg_coder_t coders[MQ_WIRE_MAX_TENSORS]; /* reply buffers and reply-codec state */
    mq_sendbuf_t sum_ref;
    s_slot_t *slots;   /* one per worker */
    uint32_t filled;
    uint64_t iter;
    uint32_t bits;
    float lr;
    mq_rng_t rng;
    mq_link_t link;
    mq_msg_t in, out;
} s_server_t;

int mq_server_config_parse(mq_server_config_t *cfg, int argc, char **argv)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->scheduler, "tcp://127.0.0.1:7000");
    strcpy(cfg->bind, "tcp://*:7100");
    cfg->peer_timeout = 60;
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
        {0},
    };
    return mq_flags_parse(flags, argc, argv, "usage: mqgrad-server [flags]", NULL, 0, NULL);
}

static void s_fail(s_server_t *self, const char *what)
{
    mq_node_finish(&self->node, 1, what);
}

static int s_setup(s_server_t *self)
{
    const mq_run_config_t *r = &self->run;
    int channels = strcmp(r->dataset, "cifar10") == 0 ? 3 : 1;
    self->model = mq_model_new(r->model, channels, 1, r->l2);
    if (!self->model)
        return -1;
    mq_model_init(self->model, r->seed); /* the same initial parameters as every worker */
    mq_shard_t all[MQ_WIRE_MAX_SERVERS];
    if (mq_shard_plan(self->model, r->servers, r->quant_threshold, r->fp32, all) != 0)
        return -1;
    self->shard = all[self->rank];
    if (mq_codec_parse(r->codec, &self->codec) != 0 || mq_optim_parse(r->optimizer, &self->optim))
        return -1;
    size_t len = self->shard.end - self->shard.begin;
    size_t nstate = mq_optim_state_floats(&self->optim, len);
    bool sgd = mq_optim_is_sgd(&self->optim);
    self->sum = malloc(sizeof(float) * (len + 1));
    self->slots = calloc(r->workers, sizeof *self->slots);
    self->opt_state = nstate ? calloc(nstate, sizeof(float)) : NULL;
    self->scratch = sgd ? NULL : malloc(sizeof(float) * (len + 1));
    if (!self->sum || !self->slots || (nstate && !self->opt_state) || (!sgd && !self->scratch)) {
        mq_err_set("out of memory");
        return -1;
    }
    mq_rng_seed(&self->rng, r->seed * 7919ULL + 0x5e4e + self->rank);
    mq_link_init(&self->link, r->link_mbps);
    return 0;
}

static void s_on_welcome(s_server_t *self, const mq_msg_t *msg)
{
    if (self->welcomed)
        return;
    self->run = msg->config;
    self->rank = msg->rank;
    if (self->rank >= self->run.servers || self->run.workers == 0) {
        mq_err_set("inconsistent welcome (rank %u of %u servers, %u workers)", self->rank,
                   self->run.servers, self->run.workers);
        s_fail(self, "welcome");
        return;
    }
    mq_log_set_tag("server %u", self->rank);
    self->welcomed = true;
    if (s_setup(self) != 0) {
        s_fail(self, "setup");
        return;
    }
    mq_info("ready: shard %u holds [%llu, %llu) in %u segments, %u workers", self->rank,
            (unsigned long long)self->shard.begin, (unsigned long long)self->shard.end,
            self->shard.nsegs, self->run.workers);
    if (mq_node_ready(&self->node, self->rank) != 0)
        s_fail(self, "ready");
}

/* ---- aggregation --------------------------------------------------------------------- */

static void s_release_slots(s_server_t *self)
{
    for (uint32_t r = 0; r < self->run.workers; r++) {
        s_slot_t *slot = &self->slots[r];
        for (uint32_t i = 0; i < slot->n; i++)
            zmq_msg_close(&slot->frames[i]);
        slot->n = 0;
        slot->full = false;
    }
    self->filled = 0;
}

/* The mean of segment I over all workers, in rank order, into sum. The wire has validated
 * every payload, so nothing here can fail. */
static void s_average(s_server_t *self, uint32_t i)
{
    const mq_segment_t *seg = &self->shard.segs[i];
    mq_codec_t codec = mq_segment_codec(seg, (int)self->bits, &self->codec);
    float *dst = self->sum + (seg->flat - self->shard.begin);
    float scale = 1.0f / (float)self->run.workers;
    for (uint32_t r = 0; r < self->run.workers; r++) {
        zmq_msg_t *f = &self->slots[r].frames[i];
        mq_codec_decode_valid(&codec, zmq_msg_data(f), zmq_msg_size(f), dst, seg->count, scale,
                              r > 0, NULL);
    }
}

/* Encodes segment I of the mean with the reply codec, applies exactly that update to the
 * master copy, returns the payload. */
static int s_requantize(s_server_t *self, uint32_t i, mq_payload_t *out)
{
    const mq_segment_t *seg = &self->shard.segs[i];
    mq_codec_t push = mq_segment_codec(seg, (int)self->bits, &self->codec);
    mq_codec_t reply = mq_codec_reply(&push);
    const float *mean = self->sum + (seg->flat - self->shard.begin);
    if (mq_ps_encode_segment(seg, &reply, mean, &self->coders[i], &self->sum_ref, NULL,
                             &self->rng, self->lr, &self->out.tensors[i], out, NULL) != 0)
        return -1;
    /* The master copy takes exactly the update the workers will apply. */
    size_t local = seg->flat - self->shard.begin;
    size_t per = self->opt_state ? mq_optim_state_floats(&self->optim, 1) : 0;
    mq_ps_apply(&self->optim, &reply, out->data, out->len,
                mq_model_params(self->model) + seg->flat, seg->count, self->scratch,
                self->opt_state ? self->opt_state + per * local : NULL, self->lr, self->iter + 1,
                NULL);
    return 0;
}

static void s_complete(s_server_t *self)
{
    mq_payload_t payloads[MQ_WIRE_MAX_TENSORS];
    /* The previous iteration's replies must be gone before the mean is overwritten. */
    if (mq_sendbuf_acquire(&self->sum_ref, 0, S_BUF_TIMEOUT_MS) != 0) {
        s_fail(self, "aggregate buffer");
        return;
    }
    mq_msg_init(&self->out, MQ_MSG_AGGREGATE);
    self->out.iter = self->iter;
    self->out.shard = self->rank;
    self->out.ntensors = self->shard.nsegs;
    for (uint32_t i = 0; i < self->shard.nsegs; i++) {
        s_average(self, i);
        if (s_requantize(self, i, &payloads[i]) != 0) {
            for (uint32_t k = 0; k < i; k++)
                payloads[k].free_fn((void *)payloads[k].data, payloads[k].hint);
            s_fail(self, "aggregate");
            return;
        }
    }
    s_release_slots(self);
    size_t bytes = 0;
    for (uint32_t i = 0; i < self->shard.nsegs; i++)
        bytes += payloads[i].len;
    for (uint32_t r = 0; r < self->run.workers; r++) {
        /* Each send takes its own references on the buffers; ours are dropped after. */
        mq_payload_t copy[MQ_WIRE_MAX_TENSORS];
        for (uint32_t i = 0; i < self->shard.nsegs; i++)
            copy[i] = mq_sendbuf_payload(payloads[i].hint, payloads[i].data, payloads[i].len);
        memcpy(self->out.peer, self->slots[r].peer, self->slots[r].peer_len);
        self->out.peer_len = self->slots[r].peer_len;
        mq_link_egress(&self->link, bytes);
        if (mq_wire_send(self->data, &self->out, copy, self->shard.nsegs) != 0)
            mq_warn("aggregate %llu to worker %u: %s", (unsigned long long)self->iter, r,
                    mq_err_last());
    }
    for (uint32_t i = 0; i < self->shard.nsegs; i++)
        payloads[i].free_fn((void *)payloads[i].data, payloads[i].hint);
    self->iter++;
}

/* Validates a push against the run's state; returns the drop reason or MQ_DROP_NONE. */
static mq_drop_t s_check_push(s_server_t *self, const mq_msg_t *msg, const char **why)
{
    const mq_run_config_t *r = &self->run;
    bool bits_ok = r->fp32 ? msg->bits == 32 : mq_bits_ok(&self->codec, (int)msg->bits);
    if (!self->welcomed)
        return *why = "push before the run started", MQ_DROP_ITER;
    if (msg->shard != self->rank)
        return *why = "push for another shard", MQ_DROP_SHARD;
    if (msg->rank >= r->workers)
        return *why = "push from an unknown rank", MQ_DROP_RANK;
    if (msg->iter != self->iter)
        return *why = msg->iter < self->iter ? "stale iteration" : "future iteration",
               MQ_DROP_ITER;
    const s_slot_t *slot = &self->slots[msg->rank];
    if (slot->peer_len &&
        (slot->peer_len != msg->peer_len || memcmp(slot->peer, msg->peer, msg->peer_len) != 0))
        return *why = "push from a peer that does not own that rank", MQ_DROP_RANK;
    if (slot->full)
        return *why = "second push from a rank", MQ_DROP_DUPLICATE;
    if (!bits_ok || !(msg->lr > 0))
        return *why = "bad bits or learning rate", MQ_DROP_CODEC;
    if (self->filled > 0 && (msg->bits != self->bits || msg->lr != self->lr))
        return *why = "bits or learning rate differ from the other pushes", MQ_DROP_LAYOUT;
    if (mq_shard_check(&self->shard, msg, (int)msg->bits, &self->codec, false) != 0)
        return *why = mq_err_last(), MQ_DROP_LAYOUT;
    return MQ_DROP_NONE;
}

static void s_on_push(s_server_t *self, mq_msg_t *msg)
{
    const char *why = "";
    mq_drop_t d = s_check_push(self, msg, &why);
    if (d != MQ_DROP_NONE) {
        mq_drops_note(&self->node.drops, d, msg->peer, msg->peer_len, why);
        return;
    }
    mq_link_ingress(&self->link, msg->wire_bytes);
    if (self->filled == 0) {
        self->bits = msg->bits;
        self->lr = msg->lr;
    }
    s_slot_t *slot = &self->slots[msg->rank];
    for (uint32_t i = 0; i < msg->nframes_; i++) {
        zmq_msg_init(&slot->frames[i]);
        zmq_msg_move(&slot->frames[i], &msg->frames_[i]);
    }
    slot->n = msg->nframes_;
    memcpy(slot->peer, msg->peer, msg->peer_len);
    slot->peer_len = msg->peer_len;
    slot->full = true;
    if (++self->filled == self->run.workers)
        s_complete(self);
}

/* ---- event handlers -------------------------------------------------------------------- */

static int s_on_data(zloop_t *loop, zsock_t *sock, void *arg)
{
    s_server_t *self = arg;
    mq_drop_t drop;
    if (mq_wire_recv(sock, &self->in, &drop) != 0) {
        if (drop != MQ_DROP_NONE)
            mq_drops_note(&self->node.drops, drop, self->in.peer, self->in.peer_len, mq_err_last());
        return 0;
    }
    mq_msg_t *msg = &self->in;
    if (msg->type == MQ_MSG_PING) {
        mq_msg_init(msg, MQ_MSG_PONG);
        mq_wire_send(sock, msg, NULL, 0);
    } else if (msg->type == MQ_MSG_PUSH) {
        if (!self->node.finished)
            s_on_push(self, msg);
    } else {
        mq_drops_note(&self->node.drops, MQ_DROP_TYPE, msg->peer, msg->peer_len,
                      mq_msg_type_name(msg->type));
    }
    mq_msg_reset(msg);
    return 0;
}

static void s_dump(s_server_t *self)
{
    if (!self->cfg->dump[0] || !self->model)
        return;
    const float *w = mq_model_params(self->model) + self->shard.begin;
    if (mq_write_file_atomic(self->cfg->dump, w,
                             (self->shard.end - self->shard.begin) * sizeof(float)) != 0)
        mq_error("dump: %s", mq_err_last());
}

static int s_on_sched(zloop_t *loop, zsock_t *sock, void *arg)
{
    s_server_t *self = arg;
    mq_msg_t *msg = &self->in;
    if (mq_node_recv(&self->node, msg) != 0)
        return 0;
    if (msg->type == MQ_MSG_WELCOME) {
        s_on_welcome(self, msg);
    } else if (msg->type == MQ_MSG_STOP) {
        mq_info("stop after %llu iterations: %s", (unsigned long long)self->iter,
                msg->text[0] ? msg->text : "run over");
        s_dump(self);
        mq_node_finish(&self->node, 0, NULL);
    } else {
        mq_drops_note(&self->node.drops, MQ_DROP_TYPE, (const uint8_t *)"sched", 5,
                      mq_msg_type_name(msg->type));
    }
    mq_msg_reset(msg);
    return 0;
}

static int s_on_tick(zloop_t *loop, int timer_id, void *arg)
{
    s_server_t *self = arg;
    mq_node_check_peer(&self->node);
    return 0;
}

static int s_start(s_server_t *self, zsock_t *pipe)
{
    self->data = zsock_new(ZMQ_ROUTER);
    if (!self->data) {
        mq_err_set("cannot create a socket");
        return -1;
    }
    mq_wire_prepare(self->data, 2000);
    if (mq_bind(self->data, self->cfg->bind, &self->node.port) != 0)
        return -1;
    char bound[300];
    snprintf(bound, sizeof bound, "%.*s:%d",
             (int)(strrchr(self->cfg->bind, ':') - self->cfg->bind), self->cfg->bind,
             self->node.port);
    if (self->cfg->advertise[0])
        snprintf(self->endpoint, sizeof self->endpoint, "%s", self->cfg->advertise);
    else if (mq_advertise_endpoint(bound, self->endpoint, sizeof self->endpoint) != 0)
        return -1;
    if (mq_node_open(&self->node, pipe, self->cfg->scheduler, MQ_ROLE_SERVER, self->endpoint,
                     self->cfg->peer_timeout) != 0)
        return -1;
    mq_info("listening on %s (advertised as %s), registering with %s", self->cfg->bind,
            self->endpoint, self->cfg->scheduler);
    zloop_reader(self->loop, self->data, s_on_data, self);
    zloop_reader(self->loop, self->node.sched, s_on_sched, self);
    zloop_timer(self->loop, 1000, 0, s_on_tick, self);
    return 0;
}

void mq_server_actor(zsock_t *pipe, void *args)
{
    s_server_t *self = calloc(1, sizeof *self);
    self->node.pipe = pipe;
    self->cfg = args;
    mq_log_set_tag("server");
    self->loop = zloop_new();
    zloop_set_nonstop(self->loop, true);
    zloop_reader(self->loop, pipe, mq_node_on_pipe, &self->node);
    int rc = s_start(self, pipe);
    zsock_signal(pipe, 0);
    if (rc != 0)
        s_fail(self, "start");
    zloop_start(self->loop);
    if (self->slots)
        s_release_slots(self);
    zsock_destroy(&self->data);
    mq_node_close(&self->node);
    for (int i = 0; i < MQ_WIRE_MAX_TENSORS; i++)
        mq_seg_coder_release(&self->coders[i]);
    mq_sendbuf_release(&self->sum_ref);
    free(self->slots);
    free(self->sum);
    free(self->opt_state);
    free(self->scratch);
    mq_model_destroy(&self->model);
    mq_msg_reset(&self->in);
    zloop_destroy(&self->loop);
    free(self);
    mq_wire_thread_cleanup();
}
