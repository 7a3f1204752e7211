/* The worker actor: register, take the run's configuration from the scheduler, then for
 * each ITERATE that names it a member compute, quantize, push, wait for every shard's
 * aggregate, apply, report. Payloads go out without copies (quantized segments from
 * reusable buffers, fp32 segments straight from the gradient) and aggregates are decoded
 * straight into the parameters.
 *
 * A replica is in step when it has applied every round before the one it is asked to run.
 * One that is not (it joins late, or a round closed without it) first PULLs every server's
 * master shard, as of that round, and then runs it like the others. */
#include "mqgrad/worker.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/data.h"
#include "mqgrad/inbox.h"
#include "mqgrad/kv.h"
#include "mqgrad/mqgrad.h"
#include "mqgrad/nn.h"
#include "mqgrad/node.h"
#include "mqgrad/ps.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/wire.h"

#define S_BUF_TIMEOUT_MS 5000

/* Who a message on a server's socket comes from: the worker, and the server's shard. */
typedef struct {
    void *worker;
    uint32_t s;
} s_from_server_t;

typedef struct {
    mq_node_t node; /* scheduler link, pipe, drops */
    const mq_worker_config_t *cfg;
    zloop_t *loop;
    /* one per server of the run (WELCOME's): its socket, who its messages come from, its
     * inbox, whether its shard's aggregate came this round, whether the push went to it */
    zsock_t **servers;
    s_from_server_t *from_server;
    mq_inbox_t *server_in, sched_in; /* each socket's inbox */
    bool *got_shard, *pushed;
    bool welcomed;
    uint32_t rank;
    mq_run_config_t run;
    uint32_t nservers;
    mq_model_t *model;
    mq_dataset_t *train, *test;
    mq_batcher_t *batcher;
    float *x; /* a batch's images; an evaluation takes its slice of the test set through it */
    uint8_t *y;
    mq_codec_t codec;   /* the run's codec for quantized segments, level set per iteration */
    mq_codec_t reply;   /* the one the servers answer with (mq_codec_reply) */
    const mq_codec_ops_t *codec_ops, *reply_ops; /* their tables, looked up once a run */
    mq_kv_worker_t *kv; /* the shards: push encode and aggregate apply */
    mq_link_t link;
    uint64_t synced; /* the replica has applied every round before this one */
    /* the iteration in flight */
    bool busy, pulling;
    uint64_t iter;
    mq_widths_t widths; /* the round's levels (ITERATE's): .bits, or one per tensor */
    float lr;
    bool evaluate;
    uint32_t eval_limit;
    uint32_t member, nmembers; /* this worker's index in the round's member set, its size */
    uint64_t cursor;           /* the round's data position */
    uint32_t got;
    double t_pushed;      /* the node's time (mqgrad/ps.h clock) when the pushes were out */
    double t_pushed_wall; /* the same on the wall clock, for the timeout */
    double egress_s;      /* this iteration's time on the NIC: sending, not encoding */
    /* pushes sent from inside the backward pass (s_on_grad_ready), while the convolutions'
     * gradients are still being computed */
    bool computing, push_failed;
    double early_s; /* their time (statistics, encode, send), taken out of compute */
    struct {
        double sq;
        uint64_t n;
        float lo, hi;
    } gs; /* the gradient statistics, summed over the shards as they are pushed */
    /* per tensor of the layout, over the quantized segments pushed: |g|^2 before and |Q(g)|^2
     * after quantization (the report's tensor_err is their difference) */
    double tensor_sq[MQ_WIRE_MAX_TENSORS], tensor_sent[MQ_WIRE_MAX_TENSORS];
    double decode_s;      /* this iteration's time applying aggregates */
    mq_report_t report;
    mq_msg_t in, out;
    /* the next round's ITERATE, come while this one's aggregates are still awaited (a
     * straggler cut from this round gets them after its late push): taken up once they are
     * in, or after S_PENDING_S when they do not come */
    mq_msg_t *pending;
    bool has_pending;
    double t_pending;
    mq_sec_t *sec;
    /* a libmqgrad worker (cfg->ext): the round is computed by the library's caller, who
     * asks for it ("NEXT"); an ITERATE that comes before is held until then */
    const mq_worker_ext_t *ext;
    bool caller_waiting, caller_pushing, caller_evaluating;
    bool clear_grads; /* its "NEXT" asks for the gradient zero at each round (autograd adds) */
    /* the servers' sockets are not read while the caller computes a round whose shards went
     * early (mqgrad_ready): their aggregates wait in ZeroMQ's queue until its "PUSH", so the
     * parameters change only inside mqgrad_push, and the round's report has its loss */
    bool servers_muted;
    mq_msg_t *held;
    bool has_held;
    double t_step; /* when the caller got the round */
    double t_done; /* when the round's last aggregate was applied */
    struct {
        mq_metric_t *rank, *iterations, *loss, *bits, *pushed, *pulled, *link_mbps;
        mq_metric_t *phase[4]; /* compute, encode, wait, decode */
        mq_metric_t *drops[MQ_DROP_COUNT_];
    } m; /* in cfg->metrics, all NULL without one */
} s_worker_t;

#define S_PENDING_S 2.0

static mq_grad_ready_fn s_on_grad_ready;

int mq_worker_config_parse(mq_worker_config_t *cfg, int argc, char **argv)
{
    memset(cfg, 0, sizeof *cfg);
    strcpy(cfg->scheduler, "tcp://127.0.0.1:7000");
    cfg->peer_timeout = 60;
    cfg->iter_timeout = 600;
    const mq_flag_t flags[] = {
        {"scheduler", "MQGRAD_SCHEDULER", MQ_FLAG_STR, cfg->scheduler, sizeof cfg->scheduler, 0,
         0, "scheduler endpoint"},
        {"data-dir", "MQGRAD_DATA_DIR", MQ_FLAG_STR, cfg->data_dir, sizeof cfg->data_dir, 0, 0,
         "dataset directory (default: the data set's own, /usr/share/datasets/NAME)"},
        {"threads", "MQGRAD_THREADS", MQ_FLAG_LONG, &cfg->threads, 0, 0, 256,
         "OpenBLAS threads (0 = default)"},
        {"peer-timeout", "MQGRAD_PEER_TIMEOUT", MQ_FLAG_DOUBLE, &cfg->peer_timeout, 0, 1, 86400,
         "seconds of scheduler silence before giving up"},
        {"iter-timeout", "MQGRAD_ITER_TIMEOUT", MQ_FLAG_DOUBLE, &cfg->iter_timeout, 0, 1, 86400,
         "seconds to wait for the servers' replies"},
        {"dump", "MQGRAD_DUMP", MQ_FLAG_STR, cfg->dump, sizeof cfg->dump, 0, 0,
         "write the final parameters (raw float32) to this file"},
        MQ_SEC_FLAGS(&cfg->sec),
        MQ_HTTP_FLAGS(&cfg->http),
        {0},
    };
    mq_http_cfg_init(&cfg->http, 0);
    int rc = mq_flags_parse(flags, argc, argv, "usage: mqgrad-worker [flags]", NULL, 0, NULL);
    return rc != 0 ? rc : mq_sec_config_check(&cfg->sec, "mqgrad-worker");
}

static void s_fail(s_worker_t *self, const char *what)
{
    mq_node_finish(&self->node, 1, what);
}

/* ---- setup after WELCOME --------------------------------------------------------------- */

static int s_load_data(s_worker_t *self)
{
    const mq_run_config_t *r = &self->run;
    self->train = mq_dataset_load(r->dataset, self->cfg->data_dir, true);
    self->test = self->train ? mq_dataset_load(r->dataset, self->cfg->data_dir, false) : NULL;
    if (!self->test)
        return -1;
    /* Positions come with each ITERATE (mq_batcher_take): the batcher needs no partition. */
    self->batcher = mq_batcher_new(self->train, 0, 1, (int)r->batch, r->seed, true);
    int c = mq_dataset_channels(self->train);
    self->x = malloc(sizeof(float) * r->batch * c * 28 * 28);
    self->y = malloc(r->batch);
    if (!self->batcher || !self->x || !self->y) {
        mq_err_set("out of memory loading the data");
        return -1;
    }
    return 0;
}

/* Evaluates this member's slice of the first LIMIT test images (0 = all) into the report:
 * the round's members split them between them. */
static void s_evaluate(s_worker_t *self, uint32_t limit)
{
    int total = self->test->n;
    if (limit > 0 && (int)limit < total)
        total = (int)limit;
    int lo = (int)((int64_t)total * self->member / self->nmembers);
    int hi = (int)((int64_t)total * (self->member + 1) / self->nmembers);
    double t0 = mq_now_s(), loss_sum = 0;
    long correct = 0;
    /* a batch at a time in the training batches' buffer, free until the next round */
    mq_model_eval_data(self->model, self->test, lo, hi, self->x, (int)self->run.batch, &loss_sum,
                       &correct);
    mq_report_t *rep = &self->report;
    rep->evaluated = true;
    rep->eval_correct = (uint64_t)correct;
    rep->eval_total = (uint64_t)(hi - lo);
    rep->eval_loss_sum = loss_sum;
    rep->eval_ms = (mq_now_s() - t0) * 1e3;
    rep->params = mq_model_nparams(self->model);
    rep->zero_params = mq_optim_count_zeros(mq_model_params(self->model), rep->params);
}

/* The model a libmqgrad worker declared, with its starting values. It is in step with no
 * round: before its first it pulls the servers' values (those of the run's first worker). */
static int s_setup_ext(s_worker_t *self)
{
    self->model = mq_model_from_layout(&self->ext->layout);
    if (!self->model)
        return -1;
    if (self->ext->init)
        memcpy(mq_model_params(self->model), self->ext->init,
               mq_model_nparams(self->model) * sizeof(float));
    self->synced = UINT64_MAX;
    return 0;
}

static int s_setup(s_worker_t *self)
{
    const mq_run_config_t *r = &self->run;
    if (self->ext) {
        if (s_setup_ext(self) != 0)
            return -1;
    } else {
        /* The simulated clock charges a node's compute as its thread's CPU time: one thread. */
        int threads = r->simulated_clock ? 1 : (int)self->cfg->threads;
        if (r->simulated_clock && self->cfg->threads > 1)
            mq_info("simulated clock: OpenBLAS runs on 1 thread, not %ld", self->cfg->threads);
        mq_nn_set_threads(threads);
        if (s_load_data(self) != 0)
            return -1;
        self->model =
            mq_model_new(r->model, mq_dataset_channels(self->train), (int)r->batch, r->l2);
        if (!self->model)
            return -1;
        mq_model_init(self->model, r->seed);
        mq_model_on_grad_ready(self->model, s_on_grad_ready, self);
    }
    mq_kv_worker_config_t kc = {
        .servers = self->nservers,
        .rank = self->rank,
        .workers = r->workers,
        .threshold = r->quant_threshold,
        .fp32 = r->fp32,
        .error_feedback = r->error_feedback,
        .rng_seed = r->seed * 1000003ULL + self->rank + 1,
    };
    if (mq_codec_parse(r->codec, &self->codec) != 0 || mq_optim_parse(r->optimizer, &kc.optim))
        return -1;
    self->reply = mq_codec_reply(&self->codec);
    self->codec_ops = mq_codec_ops(&self->codec); /* the parse found it */
    self->reply_ops = mq_codec_ops(&self->reply);
    kc.codec = self->codec;
    self->kv = mq_kv_worker_new(self->model, &kc);
    if (!self->kv)
        return -1;
    return mq_link_setup(&self->link, r, "worker", self->rank);
}

static const mq_handlers_t s_server_handlers;
static mq_drop_t s_server_refusal(void *arg, mq_msg_t *msg, const char **why);

static int s_connect_servers(s_worker_t *self, const mq_msg_t *welcome)
{
    for (uint32_t s = 0; s < self->nservers; s++) {
        self->servers[s] = zsock_new(ZMQ_DEALER);
        if (!self->servers[s]) {
            mq_err_set("cannot create a socket for server %u", s);
            return -1;
        }
        mq_wire_prepare(self->servers[s], 2000, MQ_WIRE_MAX_MSG);
        /* the rank's token is this worker's name at the servers (mqgrad/security.h) */
        zmq_setsockopt(zsock_resolve(self->servers[s]), ZMQ_ROUTING_ID, welcome->welcome.token,
                       MQ_TOKEN_LEN);
        if (mq_sec_client(self->node.sec, self->servers[s], MQ_KEY_SERVER) != 0)
            return -1;
        if (zsock_connect(self->servers[s], "%s", welcome->welcome.servers[s]) != 0) {
            mq_err_set("cannot connect to server %u at '%s'", s, welcome->welcome.servers[s]);
            return -1;
        }
        self->from_server[s] = (s_from_server_t){.worker = self, .s = s};
        self->server_in[s] = (mq_inbox_t){
            .on = &s_server_handlers, .self = &self->from_server[s], .msg = &self->in,
            .drops = &self->node.drops, .from = &self->from_server[s].s,
            .from_len = sizeof self->from_server[s].s, .refuse = s_server_refusal};
        zloop_reader(self->loop, self->servers[s], mq_inbox_read, &self->server_in[s]);
    }
    return 0;
}

/* Reads the servers' sockets again, or stops reading them (s_worker_t.servers_muted). */
static void s_hear_servers(s_worker_t *self, bool on)
{
    if (self->servers_muted != on)
        return;
    self->servers_muted = !on;
    for (uint32_t s = 0; s < self->nservers; s++)
        if (on)
            zloop_reader(self->loop, self->servers[s], mq_inbox_read, &self->server_in[s]);
        else
            zloop_reader_end(self->loop, self->servers[s]);
}

/* A message to the library's caller: a command and its binary body. */
static void s_tell(s_worker_t *self, const char *cmd, const void *data, size_t len)
{
    zmsg_t *m = zmsg_new();
    zmsg_addstr(m, cmd);
    zmsg_addmem(m, data, len);
    zmsg_send(&m, self->node.pipe);
}

/* The run's first worker of a run of the workers' own model: each server's segments of its
 * values, in fp32, once (copied: this is no round's traffic). */
static int s_seed(s_worker_t *self)
{
    const float *w = mq_model_params(self->model);
    mq_payload_t payloads[MQ_WIRE_MAX_TENSORS];
    mq_msg_t *out = &self->out;
    for (uint32_t s = 0; s < self->nservers; s++) {
        const mq_shard_t *sh = mq_kv_worker_shard(self->kv, s);
        mq_msg_init(out, MQ_MSG_SEED);
        out->peer_len = 0;
        out->rank = self->rank;
        out->seed.shard = s;
        out->ntensors = sh->nsegs;
        for (uint32_t i = 0; i < sh->nsegs; i++) {
            const mq_segment_t *seg = &sh->segs[i];
            mq_tensor_hdr_t *h = &out->tensors[i];
            snprintf(h->name, sizeof h->name, "%s", seg->name);
            h->offset = seg->offset;
            h->count = seg->count;
            h->codec = (mq_codec_t){.id = MQ_CODEC_ID_none, .bits = 32};
            payloads[i] = (mq_payload_t){.data = w + seg->flat, .len = seg->count * sizeof(float)};
        }
        if (mq_wire_send(self->servers[s], out, payloads, sh->nsegs) != 0)
            return -1;
    }
    return 0;
}

/* Tells the library's caller the run and where the model's arrays are. */
static void s_welcome_caller(s_worker_t *self)
{
    mq_worker_welcome_t w = {.params = mq_model_params(self->model),
                             .grads = mq_model_grads(self->model),
                             .nparams = mq_model_nparams(self->model),
                             .rank = self->rank,
                             .run = self->run};
    for (size_t t = 0; t < mq_model_ntensors(self->model); t++)
        w.accumulate[t] = mq_model_accumulates(self->model, t);
    s_tell(self, "WELCOME", &w, sizeof w);
}

static void s_on_welcome(void *arg, mq_msg_t *msg, const mq_welcome_t *w)
{
    s_worker_t *self = arg;
    if (self->welcomed)
        return;
    self->run = msg->welcome.config;
    self->rank = msg->welcome.rank;
    self->nservers = msg->welcome.n_servers;
    if (self->rank >= self->run.workers || self->nservers != self->run.servers ||
        self->nservers == 0 || self->run.batch == 0) {
        mq_err_set("inconsistent welcome (rank %u of %u, %u servers listed, %u expected)",
                   self->rank, self->run.workers, self->nservers, self->run.servers);
        self->nservers = 0; /* nothing is kept per server */
        s_fail(self, "welcome");
        return;
    }
    if (!msg->welcome.has_token) {
        mq_err_set("welcome without the rank's token");
        self->nservers = 0;
        s_fail(self, "welcome");
        return;
    }
    uint32_t n = self->nservers; /* the run's servers: what each round keeps per server */
    if (!(self->servers = calloc(n, sizeof *self->servers)) ||
        !(self->from_server = calloc(n, sizeof *self->from_server)) ||
        !(self->server_in = calloc(n, sizeof *self->server_in)) ||
        !(self->got_shard = calloc(n, sizeof *self->got_shard)) ||
        !(self->pushed = calloc(n, sizeof *self->pushed))) {
        mq_err_set("out of memory for %u servers", n);
        self->nservers = 0;
        s_fail(self, "welcome");
        return;
    }
    if (self->ext && self->run.simulated_clock) {
        /* it charges a node's compute as its actor thread's CPU time; the caller computes
         * on a thread of its own, which that clock would not see */
        mq_err_set("the run is on the simulated clock, which cannot time a libmqgrad worker's "
                   "compute: run it on the real clock");
        s_fail(self, "welcome");
        return;
    }
    mq_log_set_tag("worker %u", self->rank);
    self->welcomed = true;
    if (mq_node_welcomed(&self->node, self->loop, msg) != 0 ||
        s_setup(self) != 0 || s_connect_servers(self, msg) != 0) {
        s_fail(self, "setup");
        return;
    }
    mq_metric_set(self->m.rank, self->rank);
    mq_metric_set(self->m.link_mbps, mq_link_mbps_now(&self->link));
    if (self->ext) {
        if (msg->welcome.seed && s_seed(self) != 0) {
            s_fail(self, "seed");
            return;
        }
        s_welcome_caller(self);
        mq_info("ready: the caller's model, %u tensors (%zu parameters), %u servers%s",
                self->ext->layout.n, mq_model_nparams(self->model), self->nservers,
                msg->welcome.seed ? "; gave the servers its values" : "");
    } else {
        mq_info("ready: model %s (%zu parameters), %d training examples, %u servers",
                self->run.model, mq_model_nparams(self->model), self->train->n, self->nservers);
    }
    if (mq_node_ready(&self->node, self->rank) != 0)
        s_fail(self, "ready");
}

/* ---- one iteration ------------------------------------------------------------------- */

/* Sum of squares, minimum and maximum of p[0..n): eight independent lanes so the compiler
 * vectorizes it without -ffast-math; partial sums in float per block of 4096, then double. */
static void s_stats(const float *p, uint64_t n, double *sq, float *lo, float *hi)
{
    float mn[8], mx[8];
    for (int l = 0; l < 8; l++) {
        mn[l] = *lo;
        mx[l] = *hi;
    }
    uint64_t i = 0;
    for (; i + 4096 <= n; i += 4096) {
        float acc[8] = {0};
        for (uint64_t k = i; k < i + 4096; k += 8)
            for (int l = 0; l < 8; l++) {
                float x = p[k + l];
                acc[l] += x * x;
                mn[l] = x < mn[l] ? x : mn[l];
                mx[l] = x > mx[l] ? x : mx[l];
            }
        for (int l = 0; l < 8; l++)
            *sq += acc[l];
    }
    for (; i < n; i++) {
        *sq += (double)p[i] * p[i];
        mn[0] = p[i] < mn[0] ? p[i] : mn[0];
        mx[0] = p[i] > mx[0] ? p[i] : mx[0];
    }
    for (int l = 0; l < 8; l++) {
        *lo = mn[l] < *lo ? mn[l] : *lo;
        *hi = mx[l] > *hi ? mx[l] : *hi;
    }
}

/* Zeroes the gradient's non-finite values and returns how many there were: a blown-up
 * gradient still travels (no node waits for a push that never comes), and the scheduler ends
 * the run on the count it is told. Only runs when the statistics found one. */
static uint64_t s_sanitize(float *g, size_t n)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(g[i])) {
            g[i] = 0;
            bad++;
        }
    return bad;
}

/* One pass over shard S of the gradient: sum of g^2 (*SQ), count (*N) and range over its
 * quantized part, and a finite check of its fp32 part (the whole shard in an fp32 run) at
 * memory speed. False if a value is not finite. With error feedback the quantized part holds
 * gradient + residual (kv_worker.c), and these are its statistics: what is quantized. */
static bool s_scan(const s_worker_t *self, const float *g, uint32_t s, double *sq, uint64_t *n,
                   float *lo, float *hi, double *seg_sq)
{
    bool fp32_ok = true;
    *sq = 0, *n = 0, *lo = INFINITY, *hi = -INFINITY;
    const mq_shard_t *sh = mq_kv_worker_shard(self->kv, s);
    for (uint32_t i = 0; i < sh->nsegs; i++) {
        const mq_segment_t *seg = &sh->segs[i];
        if (seg->quantized) {
            double before = *sq;
            s_stats(g + seg->flat, seg->count, sq, lo, hi);
            seg_sq[i] = *sq - before;
            *n += seg->count;
        } else if (fp32_ok) {
            fp32_ok = mq_codec_first_nonfinite(g + seg->flat, seg->count) == seg->count;
        }
    }
    return fp32_ok && isfinite(*sq);
}

/* Adds shard S's gradient statistics to the iteration's; a shard with non-finite values has
 * them zeroed and counted first (then scanned again). */
static void s_shard_stats(s_worker_t *self, float *g, uint32_t s)
{
    double sq, seg_sq[MQ_WIRE_MAX_TENSORS];
    uint64_t n;
    float lo, hi;
    const mq_shard_t *sh = mq_kv_worker_shard(self->kv, s);
    if (!s_scan(self, g, s, &sq, &n, &lo, &hi, seg_sq)) {
        self->report.nonfinite += s_sanitize(g + sh->begin, sh->end - sh->begin);
        s_scan(self, g, s, &sq, &n, &lo, &hi, seg_sq);
        if (!isfinite(sq)) /* finite values whose squares overflow */
            sq = DBL_MAX;
    }
    for (uint32_t i = 0; i < sh->nsegs; i++)
        if (sh->segs[i].quantized)
            self->tensor_sq[sh->segs[i].tensor] += seg_sq[i];
    self->gs.sq = fmin(self->gs.sq + sq, DBL_MAX);
    self->gs.n += n;
    self->gs.lo = fminf(self->gs.lo, lo);
    self->gs.hi = fmaxf(self->gs.hi, hi);
}

/* ASYNC: the push is handed to the emulated NIC and the worker goes on (the pushes from inside
 * the backward pass); otherwise the worker waits until its bytes are out (the pushes after it,
 * when the worker has nothing left to do but wait for the replies). */
static int s_push(s_worker_t *self, uint32_t s, bool async)
{
    mq_msg_t *out = &self->out;
    mq_msg_init(out, MQ_MSG_PUSH);
    out->peer_len = 0;
    out->iter = self->iter;
    out->rank = self->rank;
    out->push.shard = s;
    out->push.bits = (uint32_t)self->widths.bits;
    mq_widths_write(&self->widths, out->push.widths, &out->push.n_widths);
    out->push.lr = self->lr;
    out->ntensors = mq_kv_worker_shard(self->kv, s)->nsegs;
    mq_payload_t payloads[MQ_WIRE_MAX_TENSORS];
    if (mq_kv_worker_encode(self->kv, s, mq_model_grads(self->model), &self->widths, self->lr,
                            out->tensors, payloads, &self->report.sent_sq,
                            self->tensor_sent) != 0)
        return -1;
    size_t bytes = 0;
    for (uint32_t i = 0; i < out->ntensors; i++)
        bytes += payloads[i].len;
    double e0 = mq_link_now(&self->link);
    out->sim_time =
        async ? mq_link_egress_async(&self->link, bytes) : mq_link_egress(&self->link, bytes);
    self->egress_s += mq_link_now(&self->link) - e0;
    if (mq_wire_send(self->servers[s], out, payloads, out->ntensors) != 0)
        return -1;
    self->report.bytes_up += out->wire_bytes;
    atomic_store_explicit(&self->node.pushed, self->iter + 1, memory_order_relaxed);
    return 0;
}

/* Pushes shard S unless it went already: its statistics, encode, send. */
static int s_push_shard(s_worker_t *self, uint32_t s, bool async)
{
    if (self->pushed[s])
        return 0;
    self->pushed[s] = true;
    s_shard_stats(self, mq_model_grads(self->model), s);
    return s_push(self, s, async);
}

/* The model's callback from inside the backward pass: the gradient from FROM on is final.
 * Every shard that lies wholly there is pushed now, so its bytes are on the network while
 * the convolutions' backward runs (ZeroMQ's I/O thread sends them). Under link emulation they
 * are handed to the emulated NIC without waiting (mq_link_egress_async), as to a real one:
 * the backward goes on while they pass it, and the server takes them as arriving when their
 * stamp says. */
static void s_on_grad_ready(void *arg, size_t from)
{
    s_worker_t *self = arg;
    if (!self->computing || self->push_failed)
        return;
    double t0 = mq_link_now(&self->link);
    if (self->ext)
        s_hear_servers(self, false);
    /* In this worker's order of the servers (s_pushes: each worker starts with another one, so
     * that the servers' links fill together), as far as the shards are final: a shard out of
     * that order would go to the server every worker's backward pass finishes first, all at
     * once, and that server's link would take them one after another while the others wait. */
    for (uint32_t k = 0; k < self->nservers; k++) {
        uint32_t s = (self->rank + k) % self->nservers;
        if (self->pushed[s])
            continue;
        if (mq_kv_worker_shard(self->kv, s)->begin < from)
            break;
        if (s_push_shard(self, s, true) != 0) {
            self->push_failed = true;
            break;
        }
    }
    self->early_s += mq_link_now(&self->link) - t0;
}

static void s_pushes(s_worker_t *self, double t0, double loss);

/* Computes the round's gradient and pushes it: the replica is in step. A libmqgrad worker's
 * caller computes it: the round goes to the caller, and its "PUSH" goes on (s_pushes). */
static void s_compute(s_worker_t *self)
{
    double t0 = mq_link_now(&self->link);
    if (self->ext)
        mq_kv_worker_set_clear(self->kv, self->clear_grads);
    /* No message may still point into the gradient we are about to overwrite. */
    if (mq_kv_worker_wait(self->kv, S_BUF_TIMEOUT_MS) != 0) {
        s_fail(self, "gradient buffer");
        return;
    }
    mq_kv_worker_round(self->kv, self->iter); /* the round's draws, whatever came before */
    memset(self->pushed, 0, self->nservers * sizeof *self->pushed);
    self->gs.sq = 0, self->gs.n = 0, self->gs.lo = INFINITY, self->gs.hi = -INFINITY;
    memset(self->tensor_sq, 0, sizeof self->tensor_sq);
    memset(self->tensor_sent, 0, sizeof self->tensor_sent);
    self->early_s = 0;
    self->push_failed = false;
    if (self->ext) {
        mqgrad_step_t st = {.iter = self->iter,
                            .member = self->member,
                            .members = self->nmembers,
                            .cursor = self->cursor,
                            .bits = self->widths.bits,
                            .lr = self->lr,
                            .evaluate = self->evaluate,
                            .eval_limit = self->eval_limit};
        self->caller_waiting = false;
        self->caller_pushing = true;
        self->computing = true; /* the caller's: the iteration timeout waits for its push */
        self->t_step = t0;
        s_tell(self, "STEP", &st, sizeof st);
        return;
    }
    mq_batcher_take(self->batcher, self->cursor + (uint64_t)self->member * self->run.batch,
                    self->x, self->y);
    self->computing = true;
    double loss = mq_model_grad(self->model, self->x, self->y, (int)self->run.batch);
    self->computing = false;
    s_pushes(self, t0, loss);
}

/* The round's gradient is in place (since T0, the node's time): every shard not pushed yet
 * goes. */
static void s_pushes(s_worker_t *self, double t0, double loss)
{
    double t1 = mq_link_now(&self->link);
    if (self->push_failed) {
        s_fail(self, "push");
        return;
    }
    /* A non-finite loss cannot travel (the wire refuses it): it is counted instead. */
    self->report.loss = isfinite(loss) ? loss : 0;
    self->report.loss_nonfinite = !isfinite(loss);
    self->report.nonfinite += !isfinite(loss);
    /* Each worker starts with another server, so the servers fill up together: a round
     * closes once every server has every push (the commit), and a server that filled first
     * would only wait. */
    for (uint32_t k = 0; k < self->nservers; k++)
        if (s_push_shard(self, (self->rank + k) % self->nservers, false) != 0) {
            s_fail(self, "push");
            return;
        }
    self->t_pushed = mq_link_now(&self->link);
    self->t_pushed_wall = mq_now_s();
    self->report.grad_sq = self->gs.sq;
    self->report.grad_sqmean = self->gs.n ? self->gs.sq / (double)self->gs.n : 0;
    self->report.grad_range = self->gs.n ? (double)self->gs.hi - self->gs.lo : 0;
    uint32_t nt = (uint32_t)mq_model_ntensors(self->model);
    for (uint32_t t = 0; t < nt; t++) /* an unbiased codec: E|Q(g)|^2 = |g|^2 + E|Q(g) - g|^2 */
        self->report.tensor_err[t] = fmax(self->tensor_sent[t] - self->tensor_sq[t], 0);
    self->report.n_tensor_err = nt;
    self->report.compute_ms = (t1 - t0 - self->early_s) * 1e3;
    /* Time spent sending on an emulated link is communication, not quantization. */
    self->report.encode_ms = (self->t_pushed - t1 + self->early_s - self->egress_s) * 1e3;
    self->report.wait_ms = self->egress_s * 1e3; /* the replies' waits are added later */
}

/* Out of step: asks every server for its master shard as of this round. */
static void s_pull(s_worker_t *self)
{
    mq_info("joining at iteration %llu: pulling the parameters from %u servers",
            (unsigned long long)self->iter, self->nservers);
    self->pulling = true;
    self->t_pushed_wall = mq_now_s(); /* the pull's replies fall under the same timeout */
    mq_msg_t *out = &self->out;
    for (uint32_t s = 0; s < self->nservers; s++) {
        mq_msg_init(out, MQ_MSG_PULL);
        out->peer_len = 0;
        out->iter = self->iter;
        out->rank = self->rank;
        out->pull.shard = s;
        if (mq_wire_send(self->servers[s], out, NULL, 0) != 0) {
            s_fail(self, "pull");
            return;
        }
    }
}

/* A libmqgrad worker's round in flight closed without it: its caller, waiting in
 * mqgrad_push, hears so, and MSG waits for the caller's next "NEXT". True when it does. */
static bool s_abandoned(s_worker_t *self, const mq_msg_t *msg)
{
    if (!self->ext || !self->caller_pushing)
        return false;
    self->caller_pushing = false;
    self->computing = false; /* a "PUSH" still to come from the caller is ignored */
    self->busy = false;
    s_hear_servers(self, true);
    int applied = 0;
    s_tell(self, "APPLIED", &applied, sizeof applied);
    if (msg) /* no memory for its lists: the round is missed, as a lost message's */
        self->has_held = mq_msg_copy(self->held, msg) == 0;
    return true;
}

static void s_on_iterate(s_worker_t *self, const mq_msg_t *msg)
{
    const mq_iterate_t *it = &msg->iterate;
    mq_widths_t widths;
    if (!(it->lr > 0) ||
        mq_widths_read(&widths, self->codec_ops, self->run.fp32, (int)it->bits, it->widths,
                       it->n_widths, (uint32_t)mq_model_ntensors(self->model)) != 0) {
        mq_drops_note(&self->node.drops, MQ_DROP_CODEC, NULL, 0,
                      it->lr > 0 ? mq_err_last() : "iterate with a bad learning rate");
        return;
    }
    /* its place in the member set and the set's size: a worker is sent only to its rounds */
    uint32_t nmembers = it->nmembers;
    int member = it->member < it->nmembers ? (int)it->member : -1;
    if (member < 0) /* not in this round: joins at a later one */
        return;
    if (self->ext && !self->busy && !self->caller_waiting && msg != self->held) {
        /* the caller is still on the last round: this one waits for its "NEXT" */
        self->has_held = mq_msg_copy(self->held, msg) == 0;
        return;
    }
    self->has_held = false;
    if (self->busy && msg->iter <= self->iter) {
        mq_drops_note(&self->node.drops, MQ_DROP_ITER, NULL, 0, "iterate out of order");
        return;
    }
    if (self->busy && !self->pulling && self->run.report_pushes && msg != self->pending) {
        /* our pushes are out: the aggregates may still come (a straggler's late reply) */
        if (mq_msg_copy(self->pending, msg) != 0)
            return; /* no memory for its lists: missed, as a lost message */
        if (!self->has_pending) /* a newer one replaces it; the wait counts from the first */
            self->t_pending = mq_now_s();
        self->has_pending = true;
        return;
    }
    self->has_pending = false;
    if (self->busy) { /* the round in flight closed without us: its aggregates will not come */
        mq_warn("iteration %llu closed without this worker; on to %llu",
                (unsigned long long)self->iter, (unsigned long long)msg->iter);
        if (s_abandoned(self, msg))
            return;
    }
    self->busy = true;
    self->pulling = false;
    self->iter = msg->iter;
    self->widths = widths;
    self->lr = it->lr;
    self->evaluate = it->evaluate;
    self->eval_limit = it->eval_limit;
    self->member = (uint32_t)member;
    self->nmembers = nmembers;
    self->cursor = it->cursor;
    self->got = 0;
    memset(self->got_shard, 0, self->nservers * sizeof *self->got_shard);
    memset(&self->report, 0, sizeof self->report);
    self->egress_s = 0;
    self->decode_s = 0;
    mq_link_sync(&self->link, msg->sim_time);
    mq_link_anchor(&self->link, it->run_time);
    mq_metric_set(self->m.link_mbps, mq_link_mbps_now(&self->link));
    if (self->synced != self->iter)
        s_pull(self);
    else
        s_compute(self);
}

static void s_on_iterate(s_worker_t *self, const mq_msg_t *msg);

/* ---- metrics (mqgrad/metrics.h) --------------------------------------------------------- */

static void s_metrics_init(s_worker_t *self)
{
    mq_metrics_t *m = self->cfg->metrics;
    if (!m)
        return;
    self->m.rank = mq_metrics_gauge(m, "mqgrad_worker_rank",
                                    "This worker's rank in the run (-1 before it has one).", NULL);
    mq_metric_set(self->m.rank, -1);
    self->m.iterations = mq_metrics_counter(m, "mqgrad_worker_iterations_total",
                                            "Iterations this worker computed and applied.", NULL);
    self->m.loss = mq_metrics_gauge(m, "mqgrad_worker_loss",
                                    "Training loss of this worker's last batch.", NULL);
    self->m.bits = mq_metrics_gauge(m, "mqgrad_worker_bits",
                                    "Bit-width of the last iteration (32 = fp32).", NULL);
    self->m.pushed = mq_metrics_counter(m, "mqgrad_worker_pushed_bytes_total",
                                        "Gradient bytes pushed to the servers.", NULL);
    self->m.pulled = mq_metrics_counter(m, "mqgrad_worker_pulled_bytes_total",
                                        "Aggregate and parameter bytes received from the servers.",
                                        NULL);
    self->m.link_mbps = mq_metrics_gauge(m, "mqgrad_worker_link_mbps",
                                         "Rate of the emulated link, Mbit/s (0 = none).", NULL);
    static const char *const phases[4] = {"compute", "encode", "wait", "decode"};
    for (int i = 0; i < 4; i++) {
        char labels[32];
        snprintf(labels, sizeof labels, "phase=\"%s\"", phases[i]);
        self->m.phase[i] = mq_metrics_histogram(
            m, "mqgrad_worker_phase_seconds",
            "Time of each phase of an iteration: the gradient, quantizing it, waiting for the "
            "aggregates (sending on an emulated link included), applying them.",
            labels, mq_metrics_seconds_bounds, mq_metrics_seconds_nbounds);
    }
    mq_drops_series(m, "mqgrad_worker_dropped_messages_total", self->m.drops);
    char labels[96], esc[64];
    snprintf(labels, sizeof labels, "core=\"%s\"",
             mq_metrics_escape(esc, sizeof esc, mq_nn_blas_core()));
    mq_metric_set(mq_metrics_gauge(m, "mqgrad_worker_blas_info",
                                   "The OpenBLAS kernels this worker computes with (value 1).",
                                   labels),
                  1);
}

static void s_metrics_iteration(s_worker_t *self, const mq_report_t *r)
{
    if (!self->cfg->metrics)
        return;
    mq_metric_add(self->m.iterations, 1);
    mq_metric_set(self->m.loss, r->loss_nonfinite ? NAN : r->loss);
    mq_metric_set(self->m.bits, self->widths.bits);
    mq_metric_add(self->m.pushed, (double)r->bytes_up);
    mq_metric_add(self->m.pulled, (double)r->bytes_down);
    const double ms[4] = {r->compute_ms, r->encode_ms, r->wait_ms, r->decode_ms};
    for (int i = 0; i < 4; i++)
        mq_metric_observe(self->m.phase[i], ms[i] * 1e-3);
}

static void s_report(s_worker_t *self, double done);

static void s_finish_iteration(s_worker_t *self)
{
    mq_report_t *r = &self->report;
    /* Waiting: from the pushes to the last aggregate applied, less the applying. */
    double done = mq_link_settle(&self->link);
    r->decode_ms = self->decode_s * 1e3;
    r->wait_ms += (done - self->t_pushed - self->decode_s) * 1e3;
    if (self->ext) { /* the caller evaluates, if asked; the report waits for its "EVAL" */
        int applied = 1;
        self->caller_pushing = false;
        self->caller_evaluating = self->evaluate;
        self->t_done = done;
        s_tell(self, "APPLIED", &applied, sizeof applied);
        if (!self->evaluate)
            s_report(self, done);
        return;
    }
    mq_link_pause(&self->link); /* evaluation is not training time */
    if (self->evaluate)
        s_evaluate(self, self->eval_limit);
    mq_link_resume(&self->link);
    s_report(self, done);
}

/* The round's report to the scheduler (its evaluation included): the worker is in step. */
static void s_report(s_worker_t *self, double done)
{
    mq_report_t *r = &self->report;
    mq_msg_t *out = &self->out;
    mq_msg_init(out, MQ_MSG_REPORT);
    out->peer_len = 0;
    out->sim_time = self->link.simulated ? done : 0;
    out->iter = self->iter;
    out->rank = self->rank;
    out->incarnation = self->node.incarnation;
    out->report = *r;
    s_metrics_iteration(self, r);
    self->busy = false;
    self->synced = self->iter + 1;
    if (mq_wire_send(self->node.sched, out, NULL, 0) != 0) {
        s_fail(self, "report");
        return;
    }
    if (self->has_pending) {
        self->has_pending = false;
        s_on_iterate(self, self->pending);
    }
}

/* One server's master shard for a worker out of step; computes once every shard is in. */
static void s_on_params(void *arg, mq_msg_t *msg, const mq_shard_msg_t *params)
{
    s_worker_t *self = ((s_from_server_t *)arg)->worker;
    uint32_t s = ((s_from_server_t *)arg)->s;
    if (self->node.finished)
        return;
    const char *why = NULL;
    mq_drop_t reason = MQ_DROP_NONE;
    if (!self->pulling || msg->iter != self->iter)
        reason = MQ_DROP_ITER, why = "parameters for another iteration";
    else if (params->shard != s || self->got_shard[s])
        reason = MQ_DROP_SHARD, why = "parameters for another shard, or twice";
    else if ((msg->ntensors != 1 && msg->ntensors != 2) ||
             msg->tensors[0].codec.id != MQ_CODEC_ID_none ||
             (msg->ntensors == 2 && msg->tensors[1].codec.id != MQ_CODEC_ID_none))
        reason = MQ_DROP_LAYOUT, why = "parameters not as fp32 params and state";
    else if (mq_kv_worker_load(self->kv, s, (const float *)msg->payload[0], msg->tensors[0].count,
                               msg->ntensors == 2 ? (const float *)msg->payload[1] : NULL,
                               msg->ntensors == 2 ? msg->tensors[1].count : 0) != 0)
        reason = MQ_DROP_LAYOUT, why = mq_err_last();
    if (reason != MQ_DROP_NONE) {
        mq_drops_note(&self->node.drops, reason, (const uint8_t *)&s, sizeof s, why);
        return;
    }
    mq_link_arrive(&self->link, msg->wire_bytes, msg->sim_time);
    self->report.bytes_down += msg->wire_bytes;
    self->got_shard[s] = true;
    if (++self->got < self->nservers)
        return;
    mq_link_settle(&self->link);
    self->pulling = false;
    self->synced = self->iter;
    self->got = 0;
    memset(self->got_shard, 0, self->nservers * sizeof *self->got_shard);
    mq_info("in step at iteration %llu", (unsigned long long)self->iter);
    s_compute(self);
}

/* Applies one server's aggregate: w += -lr * decode(payload), straight into the parameters. */
static void s_on_aggregate(void *arg, mq_msg_t *msg, const mq_shard_msg_t *agg)
{
    s_worker_t *self = ((s_from_server_t *)arg)->worker;
    uint32_t s = ((s_from_server_t *)arg)->s;
    if (self->node.finished)
        return;
    const char *why = NULL;
    mq_drop_t reason = MQ_DROP_NONE;
    if (!self->busy || self->pulling || msg->iter != self->iter)
        reason = MQ_DROP_ITER, why = "aggregate for another iteration";
    else if (agg->shard != s)
        reason = MQ_DROP_SHARD, why = "aggregate for another shard";
    else if (self->got_shard[s])
        reason = MQ_DROP_DUPLICATE, why = "second aggregate for a shard";
    else if (mq_shard_check(mq_kv_worker_shard(self->kv, s), msg, &self->widths, &self->reply,
                            self->reply_ops) != 0)
        reason = MQ_DROP_LAYOUT, why = mq_err_last();
    if (reason != MQ_DROP_NONE) {
        mq_drops_note(&self->node.drops, reason, (const uint8_t *)&s, sizeof s, why);
        return;
    }
    mq_link_arrive(&self->link, msg->wire_bytes, msg->sim_time);
    double t1 = mq_link_now(&self->link);
    mq_kv_worker_apply(self->kv, s, self->iter, self->lr, msg->tensors, msg->payload,
                       msg->payload_len, &self->report.update_sq);
    self->decode_s += mq_link_now(&self->link) - t1;
    self->report.bytes_down += msg->wire_bytes;
    self->got_shard[s] = true;
    if (++self->got == self->nservers)
        s_finish_iteration(self);
}

/* ---- event handlers -------------------------------------------------------------------- */

/* A server's ERROR answers a PULL it cannot serve: the worker waits for the next round. */
static void s_on_server_error(void *arg, mq_msg_t *msg, const mq_reason_t *error)
{
    s_worker_t *self = ((s_from_server_t *)arg)->worker;
    uint32_t s = ((s_from_server_t *)arg)->s;
    if (self->node.finished)
        return;
    if (self->pulling)
        mq_warn("server %u: %s; waiting for the next round", s, error->reason);
    else
        mq_drops_note(&self->node.drops, MQ_DROP_TYPE, (const uint8_t *)&s, sizeof s,
                      "an error from a server that was asked nothing");
}

static const mq_handlers_t s_server_handlers = {
    .aggregate = s_on_aggregate, .params = s_on_params, .error = s_on_server_error};

static mq_drop_t s_server_refusal(void *arg, mq_msg_t *msg, const char **why)
{
    s_worker_t *self = ((s_from_server_t *)arg)->worker;
    if (self->node.finished || msg->run_id == self->node.run_id)
        return MQ_DROP_NONE; /* once finished, the handlers take nothing */
    *why = "a message of another run";
    return MQ_DROP_RUN;
}

static void s_dump(s_worker_t *self)
{
    if (!self->cfg->dump[0] || !self->model)
        return;
    if (mq_write_file_atomic(self->cfg->dump, mq_model_params(self->model),
                             mq_model_nparams(self->model) * sizeof(float)) != 0)
        mq_error("dump: %s", mq_err_last());
}

static void s_handle_iterate(void *arg, mq_msg_t *msg, const mq_iterate_t *it)
{
    s_worker_t *self = arg;
    if (self->welcomed)
        s_on_iterate(self, msg);
}

static void s_on_stop(void *arg, mq_msg_t *msg, const mq_reason_t *stop)
{
    s_worker_t *self = arg;
    mq_info("stop: %s", stop->reason[0] ? stop->reason : "run over");
    s_dump(self);
    mq_node_finish(&self->node, 0, NULL);
}

static const mq_handlers_t s_sched_handlers = {
    .welcome = s_on_welcome, .iterate = s_handle_iterate, .stop = s_on_stop};

static int s_on_sched(zloop_t *loop, zsock_t *sock, void *arg)
{
    s_worker_t *self = arg;
    if (mq_node_recv(&self->node, &self->in) == 0)
        mq_inbox_handle(&self->sched_in, sock);
    return 0;
}

static void s_tick(void *arg)
{
    s_worker_t *self = arg;
    mq_node_check_peer(&self->node);
    mq_drops_publish(self->m.drops, self->node.drops.count);
    if (!self->node.finished && self->has_pending && mq_now_s() - self->t_pending > S_PENDING_S) {
        self->has_pending = false; /* the aggregates did not come: pull instead */
        if (!s_abandoned(self, self->pending)) {
            self->busy = false;
            s_on_iterate(self, self->pending);
        }
    }
    if (!self->node.finished && self->busy && !self->computing &&
        mq_now_s() - self->t_pushed_wall > self->cfg->iter_timeout) {
        mq_err_set("iteration %llu: %u of %u servers replied within %.0f s",
                   (unsigned long long)self->iter, self->got, self->nservers,
                   self->cfg->iter_timeout);
        s_fail(self, "servers silent");
    }
}

/* ---- the library's caller (cfg->ext) -------------------------------------------------- */

static void s_caller_push(s_worker_t *self, zframe_t *body)
{
    double loss;
    if (!self->computing || !self->caller_pushing || !body ||
        zframe_size(body) != sizeof loss) {
        mq_warn("the caller pushed outside a round: ignored");
        return;
    }
    memcpy(&loss, zframe_data(body), sizeof loss);
    self->computing = false;
    /* every shard: the statistics, the non-finite check, the encode, the send */
    s_pushes(self, self->t_step, loss);
    s_hear_servers(self, true); /* the aggregates of the shards that went early, if any */
}

/* The caller's gradient is final from offset FROM on (mqgrad_ready): the shards there go now,
 * as the C model's do from inside its backward pass. */
static void s_caller_ready(s_worker_t *self, zframe_t *body)
{
    uint64_t from;
    if (!self->computing || !self->caller_pushing || !body || zframe_size(body) != sizeof from)
        return; /* a round the scheduler closed meanwhile: its push is ignored as well */
    memcpy(&from, zframe_data(body), sizeof from);
    s_on_grad_ready(self, (size_t)from);
}

static void s_caller_eval(s_worker_t *self, zframe_t *body)
{
    struct {
        uint64_t correct, total;
        double loss_sum;
    } e;
    if (!self->caller_evaluating || !body || zframe_size(body) != sizeof e) {
        mq_warn("the caller reported an evaluation it was not asked for: ignored");
        return;
    }
    memcpy(&e, zframe_data(body), sizeof e);
    self->caller_evaluating = false;
    mq_report_t *rep = &self->report;
    rep->evaluated = true;
    rep->eval_correct = e.correct <= e.total ? e.correct : e.total;
    rep->eval_total = e.total;
    rep->eval_loss_sum = isfinite(e.loss_sum) ? e.loss_sum : 0;
    rep->eval_ms = (mq_link_now(&self->link) - self->t_done) * 1e3;
    rep->params = mq_model_nparams(self->model);
    rep->zero_params = mq_optim_count_zeros(mq_model_params(self->model), rep->params);
    s_report(self, self->t_done);
}

/* The library caller's commands: "NEXT", "READY", "PUSH", "EVAL". */
static int s_command(void *arg, const char *cmd, zmsg_t *m)
{
    s_worker_t *self = arg;
    zframe_t *body = m ? zmsg_first(m) : NULL;
    if (!self->ext)
        mq_warn("pipe command '%s' ignored: no library caller", cmd);
    else if (streq(cmd, "NEXT")) {
        self->caller_waiting = true;
        if (body && zframe_size(body) == 1)
            self->clear_grads = zframe_data(body)[0] != 0;
        if (self->has_held && !self->node.finished)
            s_on_iterate(self, self->held);
    } else if (streq(cmd, "READY")) {
        if (!self->node.finished)
            s_caller_ready(self, body);
    } else if (streq(cmd, "PUSH")) {
        if (!self->node.finished)
            s_caller_push(self, body);
    } else if (streq(cmd, "EVAL")) {
        if (!self->node.finished)
            s_caller_eval(self, body);
    } else
        mq_warn("unknown pipe command '%s' ignored", cmd);
    return 0;
}

static void s_stop(void *arg)
{
    s_worker_t *self = arg;
    mq_node_leave(&self->node); /* stopped by a signal, not by the run's end */
    for (uint32_t s = 0; self->servers && s < self->nservers; s++)
        zsock_destroy(&self->servers[s]);
    free(self->servers), free(self->from_server), free(self->server_in);
    free(self->got_shard), free(self->pushed);
    mq_node_close(&self->node);
    mq_sec_close(&self->sec); /* after its sockets */
    mq_kv_worker_destroy(&self->kv);
    free(self->x);
    free(self->y);
    mq_batcher_destroy(&self->batcher);
    mq_dataset_destroy(&self->train);
    mq_dataset_destroy(&self->test);
    mq_model_destroy(&self->model);
    mq_msg_free(&self->in);
    mq_msg_free(&self->out);
    if (self->pending)
        mq_msg_free(self->pending);
    if (self->held)
        mq_msg_free(self->held);
    free(self->pending);
    free(self->held);
}

/* Opens the keys and registers with the scheduler: 0, or 1 with the error. */
static int s_start(void *arg, mq_service_t *svc)
{
    s_worker_t *self = arg;
    self->node.pipe = svc->pipe;
    self->loop = svc->loop;
    self->cfg = svc->cfg;
    svc->drops = &self->node.drops;
    self->ext = self->cfg->ext;
    self->node.layout = self->ext ? &self->ext->layout : NULL;
    s_metrics_init(self);
    self->pending = calloc(1, sizeof *self->pending);
    self->held = self->ext ? calloc(1, sizeof *self->held) : NULL;
    if (!self->pending || (self->ext && !self->held))
        return mq_err_set("out of memory"), 1;
    if (!(self->sec = mq_sec_open(&self->cfg->sec, MQ_KEY_WORKER)))
        return 1;
    svc->sec = self->sec;
    if (mq_node_open(&self->node, svc->pipe, self->cfg->scheduler, MQ_ROLE_WORKER, NULL,
                     self->cfg->peer_timeout, self->sec) != 0)
        return 1;
    self->sched_in = (mq_inbox_t){.on = &s_sched_handlers, .self = self, .msg = &self->in,
                                  .drops = &self->node.drops, .from = "sched", .from_len = 5};
    mq_node_listen(&self->node, self->loop, s_on_sched, self);
    return 0;
}

static const mq_service_ops_t s_ops = {.name = "worker",
                                       .size = sizeof(s_worker_t),
                                       .start = s_start,
                                       .command = s_command,
                                       .tick = s_tick,
                                       .stop = s_stop};

void mq_worker_actor(zsock_t *pipe, void *args)
{
    mq_service_actor(pipe, &s_ops, args);
}
