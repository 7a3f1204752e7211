/* The scheduler actor: registration until the cluster is complete, then the iteration
 * barrier. After all reports of iteration m are in it records the row, tells the agent, and
 * waits at most a deadline for the bits of m+1; a silent agent never stalls the run (the
 * last bits are reused and further waits are skipped until the agent answers again).
 *
 * Membership changes while the run goes on (docs/operations.md, "Failures and elasticity"). Each
 * iteration has a member set: the workers that are up when it is issued. A worker that is
 * silent for --heartbeat-timeout, or says it leaves, is cut from the round in flight: the
 * servers are told the smaller set (a higher view), say HAVE once every member's push is in,
 * and only when every server has does the scheduler COMMIT the set, so every shard averages
 * over the same workers. A worker that registers late gets a free rank, sets up, and is a
 * member from the next iteration on (it pulls the parameters first). Below --min-workers the
 * run pauses until enough are back. */
#include "scheduler.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mqgrad/inbox.h"
#include "mqgrad/nn.h"
#include "mqgrad/ps.h"
#include "mqgrad/runlog.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/watch.h"
#include "mqgrad/wire.h"
#include "scheduler_internal.h"

typedef struct {
    zsock_t *pipe;
    const mq_scheduler_config_t *cfg;
    mq_run_config_t run;
    zloop_t *loop;
    zsock_t *router, *agent;
    mq_phases_t ph; /* where the run is, and since when (phase.c) */
    mq_membership_t mb; /* who holds each rank (membership.c) */
    uint64_t run_id;
    mq_runlog_t *log;
    /* iteration state */
    uint64_t iter;
    int bits;      /* the policy's choice */
    int used_bits; /* what the iteration in flight uses: the policy's, or the guard's floor */
    mq_widths_t widths;      /* the policy's per-tensor levels (n 0: bits for every tensor) */
    mq_widths_t used_widths; /* the iteration in flight's, after the guard and the codec */
    bool evaluate;
    mq_horizon_t hz; /* which rounds are evaluated, when the run ends (horizon.c) */
    double t_observed;
    mq_round_clock_t clock; /* the round in flight's start, span and slowest (round.c) */
    double t_training; /* wall time training started, for the summary */
    /* the round in flight (round.c): its member set, the servers' HAVEs and PROGRESS, the
     * reports, the straggler policy */
    mq_round_t round;
    double commit_sim; /* simulated clock: the latest HAVE's stamp */
    uint64_t cursor, round_cursor; /* the data position: next round's, this round's */
    /* the straggler policy: which ranks' pushes each server holds, the round's cut */
    int deadline_timer;
    mq_report_t sum;
    /* run totals */
    double train_time, agent_ms;
    mq_watch_t watch; /* smoothed loss, divergence, spike guard */
    mq_totals_t tot;  /* bytes, the last loss and evaluation (record.c) */
    double last_iter_s; /* the last iteration's training time, to foresee the budget's end */
    mq_codec_t codec;     /* the run's codec (its level range bounds the bits sent) */
    /* the model's layout: the built-in model's, or with --model external the first worker's;
     * every worker that declares one must match it */
    mq_layout_t layout;
    bool has_layout, external;
    uint32_t seeder; /* external: the rank whose values the servers start from */
    /* agent */
    mq_al_state_t agent_link; /* agent_link.c */
    int agent_timer;
    uint64_t fallbacks;
    char policy[64];
    char reason[512]; /* why the run failed, for summary.json */
    double t_progress;
    mq_msg_t in, out;
    mq_inbox_t router_in, agent_in; /* the nodes' socket's and the agent's */
    /* sized by the run: --max-workers ranks, --servers servers */
    uint32_t *joined, *stuck, *silent; /* ranks, each for its own step */
    uint32_t *terms;                   /* an ITERATE's: each member's term */
    char (*endpoints)[MQ_WIRE_MAX_TEXT]; /* a WELCOME's: the servers' */
    char refusal[160];              /* why router_in refused a message */
    mq_drops_t drops;
    bool log_failed; /* the run directory refused a write: the run fails */
    /* checkpoints and resume */
    char run_dir[512];     /* --run-dir, or beside it when --resume finds that run over */
    uint64_t lineage;      /* the run's first id: its checkpoints' name across restarts */
    double wall_before;    /* wall time of training before this scheduler */
    mq_ckround_t cp;       /* the checkpoint in progress (checkpoints.c) */
    mq_sched_ckpt_t ckpt;  /* ...this state, once every server saved its shard */
    mq_sec_t *sec;
    uint8_t run_key[MQ_RUN_KEY_LEN]; /* nodes' tokens derive from it (mqgrad/security.h) */
    struct {
        mq_metric_t *iteration, *planned, *iterations, *loss, *acc, *test_loss, *bits, *pushed,
            *pulled, *iter_pushed, *fp32_push, *iter_seconds, *members, *workers, *servers,
            *paused, *stragglers, *fallbacks, *ckpt_iter, *ckpt_time, *link, *simulated;
        mq_metric_t *drops[MQ_DROP_COUNT_];
        /* per rank, made when the rank first reports */
        struct s_rank_metrics {
            mq_metric_t *seconds[4], *loss, *straggles;
        } *w; /* --max-workers of them */
    } m; /* in cfg->metrics, all NULL without one */
} s_sched_t;

/* ---- metrics (mqgrad/metrics.h) ------------------------------------------------------------ */

/* The model's parameters: known from the start for a built-in model, from the first worker's
 * layout for the workers' own (0 before). */
static uint64_t s_params(const s_sched_t *self)
{
    uint64_t n = 0;
    for (uint32_t i = 0; self->has_layout && i < self->layout.n; i++)
        n += self->layout.t[i].count;
    return n;
}

/* The fp32 push of the model. */
static void s_metrics_layout(s_sched_t *self)
{
    mq_metric_set(self->m.fp32_push, 4.0 * (double)s_params(self));
}

static void s_metrics_init(s_sched_t *self)
{
    mq_metrics_t *m = self->cfg->metrics;
    if (!m)
        return;
#define S_GAUGE(field, name, help) self->m.field = mq_metrics_gauge(m, name, help, NULL)
#define S_COUNTER(field, name, help) self->m.field = mq_metrics_counter(m, name, help, NULL)
    S_GAUGE(iteration, "mqgrad_scheduler_iteration", "Iterations finished in the run so far.");
    S_GAUGE(planned, "mqgrad_scheduler_iterations_planned",
            "Iterations the run is to make (0: until the time budget is spent).");
    S_COUNTER(iterations, "mqgrad_scheduler_iterations_total",
              "Iterations finished by this scheduler process.");
    S_GAUGE(loss, "mqgrad_scheduler_loss", "Mean training loss of the last iteration.");
    S_GAUGE(acc, "mqgrad_scheduler_test_accuracy_ratio",
            "Test accuracy at the last evaluation, 0 to 1 (NaN before one).");
    S_GAUGE(test_loss, "mqgrad_scheduler_test_loss",
            "Mean test loss at the last evaluation (NaN before one).");
    S_GAUGE(bits, "mqgrad_scheduler_bits", "Bit-width of the last iteration (32 = fp32).");
    S_COUNTER(pushed, "mqgrad_scheduler_pushed_bytes_total",
              "Gradient bytes the workers pushed, as they reported.");
    S_COUNTER(pulled, "mqgrad_scheduler_pulled_bytes_total",
              "Bytes the workers received from the servers, as they reported.");
    S_GAUGE(iter_pushed, "mqgrad_scheduler_iteration_pushed_bytes",
            "Gradient bytes pushed in the last iteration, over its members.");
    S_GAUGE(fp32_push, "mqgrad_scheduler_fp32_push_bytes",
            "Bytes one worker's push would take in fp32: the model's gradient.");
    self->m.iter_seconds = mq_metrics_histogram(
        m, "mqgrad_scheduler_iteration_seconds",
        "Training time of an iteration (simulated under the simulated clock).", NULL,
        mq_metrics_seconds_bounds, mq_metrics_seconds_nbounds);
    S_GAUGE(members, "mqgrad_scheduler_members", "Workers in the last iteration.");
    S_GAUGE(workers, "mqgrad_scheduler_workers", "Workers registered now.");
    S_GAUGE(servers, "mqgrad_scheduler_servers", "Servers registered now.");
    S_GAUGE(paused, "mqgrad_scheduler_paused", "1 while the run waits for --min-workers.");
    S_COUNTER(stragglers, "mqgrad_scheduler_stragglers_total",
              "Members left out of an iteration by the straggler policy.");
    S_COUNTER(fallbacks, "mqgrad_scheduler_agent_fallbacks_total",
              "Iterations that went on without a timely decision of the agent.");
    S_GAUGE(ckpt_iter, "mqgrad_scheduler_last_checkpoint_iteration",
            "Iteration of the last complete checkpoint (0: none yet).");
    S_GAUGE(ckpt_time, "mqgrad_scheduler_last_checkpoint_timestamp_seconds",
            "When the last complete checkpoint was written, Unix seconds (0: none yet).");
    S_GAUGE(link, "mqgrad_scheduler_link_mbps", "Rate of the emulated links, Mbit/s (0: none).");
    S_GAUGE(simulated, "mqgrad_scheduler_simulated_clock", "1 under the simulated clock.");
#undef S_GAUGE
#undef S_COUNTER
    mq_drops_series(m, "mqgrad_scheduler_dropped_messages_total", self->m.drops);
    mq_metric_set(self->m.planned, (double)self->cfg->iterations);
    mq_metric_set(self->m.acc, NAN);
    mq_metric_set(self->m.test_loss, NAN);
    mq_metric_set(self->m.loss, NAN);
    mq_metric_set(self->m.link, self->run.link_mbps);
    mq_metric_set(self->m.simulated, self->run.simulated_clock);
    s_metrics_layout(self);
}

/* Rank R's series, made the first time it reports. */
static void s_metrics_rank(s_sched_t *self, uint32_t r)
{
    mq_metrics_t *m = self->cfg->metrics;
    if (!m || !self->m.w || r >= self->mb.max_workers || self->m.w[r].loss)
        return;
    static const char *const phases[4] = {"compute", "encode", "wait", "decode"};
    char labels[64];
    for (int i = 0; i < 4; i++) {
        snprintf(labels, sizeof labels, "rank=\"%u\",phase=\"%s\"", r, phases[i]);
        self->m.w[r].seconds[i] = mq_metrics_gauge(
            m, "mqgrad_scheduler_worker_seconds",
            "Each worker's time per phase in its last report: the gradient, quantizing, "
            "waiting for the aggregates, applying them.",
            labels);
    }
    snprintf(labels, sizeof labels, "rank=\"%u\"", r);
    self->m.w[r].loss = mq_metrics_gauge(m, "mqgrad_scheduler_worker_loss",
                                         "Each worker's training loss in its last report.", labels);
    self->m.w[r].straggles = mq_metrics_counter(
        m, "mqgrad_scheduler_worker_straggles_total",
        "Iterations each worker was left out of by the straggler policy.", labels);
}

static void s_metrics_report(s_sched_t *self, uint32_t r, const mq_report_t *rep)
{
    if (!self->cfg->metrics)
        return;
    s_metrics_rank(self, r);
    if (!self->m.w || r >= self->mb.max_workers)
        return;
    const double ms[4] = {rep->compute_ms, rep->encode_ms, rep->wait_ms, rep->decode_ms};
    for (int i = 0; i < 4; i++)
        mq_metric_set(self->m.w[r].seconds[i], ms[i] * 1e-3);
    mq_metric_set(self->m.w[r].loss, rep->loss_nonfinite ? NAN : rep->loss);
}


/* What changes without an iteration: membership, the pause, drops. Once a second, and when
 * the cluster is complete (so the first scrape of a run sees its servers). */
static void s_metrics_tick(s_sched_t *self)
{
    if (!self->cfg->metrics)
        return;
    uint32_t servers = 0;
    for (uint32_t i = 0; i < self->mb.want_servers; i++)
        servers += self->mb.servers[i].state != MQ_MB_FREE;
    mq_metric_set(self->m.workers, mq_mb_count(&self->mb, MQ_MB_FREE)); /* FREE: not free */
    mq_metric_set(self->m.servers, servers);
    mq_metric_set(self->m.paused, self->ph.phase == MQ_PH_PAUSED);
    mq_metric_set(self->m.fallbacks, (double)self->fallbacks);
    mq_drops_publish(self->m.drops, self->drops.count);
}

static void s_metrics_straggler(s_sched_t *self, uint32_t r)
{
    if (!self->cfg->metrics)
        return;
    s_metrics_rank(self, r);
    if (self->m.w && r < self->mb.max_workers)
        mq_metric_add(self->m.w[r].straggles, 1);
}

static void s_finish(s_sched_t *self, const char *status, int code);
static void s_agent_event(s_sched_t *self, mq_al_event_t event, const char *why,
                          const mq_status_msg_t *d, const mq_widths_t *w);
static void s_fail(s_sched_t *self, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- sending ----------------------------------------------------------------------------- */

/* Sends self->out to NODE without waiting: a node that does not read (wedged, or an insider
 * holding a rank) loses the message, counted as unread, and never stalls the scheduler; the
 * heartbeat and iteration timeouts deal with the node. */
static int s_send_to(s_sched_t *self, const mq_mb_node_t *node)
{
    memcpy(self->out.peer, node->peer, node->peer_len);
    self->out.peer_len = node->peer_len;
    return mq_wire_reply(self->router, &self->out, &self->drops);
}

/* Sends self->out to every node that holds a rank; returns how many could not be reached. */
static int s_broadcast(s_sched_t *self, bool workers, bool servers)
{
    int failed = 0;
    for (uint32_t i = 0; workers && i < self->mb.max_workers; i++)
        if (self->mb.workers[i].state != MQ_MB_FREE)
            failed += s_send_to(self, &self->mb.workers[i]) != 0;
    for (uint32_t i = 0; servers && i < self->mb.nservers; i++)
        failed += s_send_to(self, &self->mb.servers[i]) != 0;
    return failed;
}

/* The round's member set, with each member's term, into the message to send. */
static void s_put_members(s_sched_t *self)
{
    mq_iterate_t *it = &self->out.iterate;
    it->n_members = it->n_member_terms = self->round.nmembers;
    it->members = self->round.members;
    for (uint32_t k = 0; k < self->round.nmembers; k++)
        self->terms[k] = self->mb.worker_term[self->round.members[k]];
    it->member_terms = self->terms;
}

/* Tells the servers the round's member set (a new view of it). */
static void s_send_members(s_sched_t *self, mq_msg_type_t type, bool checkpoint)
{
    mq_msg_init(&self->out, type);
    self->out.iter = self->iter;
    if (type == MQ_MSG_COMMIT) {
        self->out.sim_time = self->commit_sim;
        self->out.commit.view = self->round.view;
        self->out.commit.n_members = self->round.nmembers;
        self->out.commit.members = self->round.members;
    } else {
        s_put_members(self);
        self->out.iterate.checkpoint = checkpoint;
        self->out.iterate.keep_from = checkpoint ? mq_cp_keep_from(&self->cp) : 0;
        self->out.iterate.run_time = self->train_time;
        self->out.iterate.view = self->round.view;
    }
    if (s_broadcast(self, false, true) != 0)
        mq_warn("iteration %llu: cannot reach every server: %s", (unsigned long long)self->iter,
                mq_err_last());
}

static void s_event(s_sched_t *self, const char *event, const char *fields)
{
    if (self->log && mq_runlog_event(self->log, self->iter, event, fields) != 0 &&
        !self->log_failed) {
        mq_error("events: %s", mq_err_last());
        self->log_failed = true; /* the run fails at the end of the round */
    }
}

/* ---- the run ------------------------------------------------------------------------------ */

/* How far the run is, 0..1: by iterations or by the time budget, whichever is further. */
static double s_progress_fraction(const s_sched_t *self)
{
    const mq_scheduler_config_t *c = self->cfg;
    double p = c->iterations > 0 ? (double)self->iter / (double)c->iterations : 0;
    if (c->time_budget > 0 && self->train_time / c->time_budget > p)
        p = self->train_time / c->time_budget;
    return p > 1 ? 1 : p;
}


static bool s_checkpoint_due(s_sched_t *self);
static int s_on_straggler_deadline(zloop_t *loop, int timer_id, void *arg);
static void s_iteration_done(s_sched_t *self);

/* Moves the run on by EVENT (phase.c's table). One the table refuses is a fault of this
 * actor's: said, and the phase stays. */
static void s_go(s_sched_t *self, mq_phase_event_t event)
{
    if (mq_ph_go(&self->ph, event, mq_now_s()) < 0)
        mq_error("%s", mq_err_last());
}

static void s_pause(s_sched_t *self, uint32_t have)
{
    if (self->ph.phase != MQ_PH_PAUSED) {
        char fields[96];
        snprintf(fields, sizeof fields, "\"workers\":%u,\"min_workers\":%ld", have,
                 self->cfg->min_workers);
        s_event(self, "pause", fields);
        mq_warn("%u workers, fewer than --min-workers %ld: the run pauses at iteration %llu "
                "until enough are back (at most %.0f s)",
                have, self->cfg->min_workers, (unsigned long long)self->iter,
                self->cfg->pause_timeout);
    }
    s_go(self, MQ_PE_SHORT);
}

/* The round's members: every worker up (those ready since the last round join now). */
static void s_form_round(s_sched_t *self)
{
    uint32_t *joined = self->joined, nj;
    mq_mb_form_round(&self->mb, self->round.members, &self->round.nmembers, joined, &nj);
    for (uint32_t k = 0; k < nj; k++) {
        char fields[64];
        snprintf(fields, sizeof fields, "\"rank\":%u,\"workers\":%u", joined[k],
                 self->round.nmembers);
        s_event(self, "worker_joined", fields);
        mq_info("worker %u joins at iteration %llu (%u workers)", joined[k],
                (unsigned long long)self->iter, self->round.nmembers);
    }
}

static void s_issue(s_sched_t *self)
{
    const mq_scheduler_config_t *c = self->cfg;
    uint32_t up = mq_mb_count(&self->mb, MQ_MB_ACTIVE) + mq_mb_count(&self->mb, MQ_MB_READY);
    if (up < (uint32_t)c->min_workers || up == 0) {
        s_pause(self, up);
        return;
    }
    if (self->ph.phase == MQ_PH_PAUSED) {
        char fields[64];
        snprintf(fields, sizeof fields, "\"workers\":%u,\"paused_s\":%.1f", up,
                 mq_now_s() - self->ph.t_paused);
        s_event(self, "resume", fields);
        mq_info("%u workers: the run goes on", up);
    }
    s_form_round(self);
    if (self->deadline_timer >= 0)
        zloop_timer_end(self->loop, self->deadline_timer);
    self->deadline_timer = -1;
    if (self->round.policy == MQ_STRAGGLERS_DEADLINE)
        self->deadline_timer = zloop_timer(self->loop, (size_t)(self->round.value * 1e3), 1,
                                           s_on_straggler_deadline, self);
    self->round_cursor = self->cursor;
    self->cursor += (uint64_t)self->round.nmembers * (uint64_t)c->batch;
    mq_hz_round_t hr = mq_hz_round(&self->hz, self->iter, self->train_time, self->last_iter_s);
    self->evaluate = hr.evaluate;
    mq_al_levels(&self->watch, self->iter, self->bits, &self->widths,
                 self->run.fp32 ? NULL : mq_codec_ops(&self->codec), &self->used_widths);
    self->used_bits = self->used_widths.bits;
    mq_msg_init(&self->out, MQ_MSG_ITERATE);
    self->out.iter = self->iter;
    mq_iterate_t *it = &self->out.iterate;
    it->bits = (uint32_t)self->used_bits;
    mq_widths_write(&self->used_widths, it->widths, &it->n_widths);
    it->lr = (float)mq_sched_lr(c, s_progress_fraction(self));
    it->evaluate = self->evaluate;
    it->eval_limit = hr.limit;
    it->nmembers = self->round.nmembers; /* and each one its index: not the set (the servers') */
    it->cursor = self->round_cursor;
    bool checkpoint = s_checkpoint_due(self);
    mq_round_begin(&self->round, self->evaluate);
    memset(&self->sum, 0, sizeof self->sum);
    s_go(self, MQ_PE_ISSUE);
    /* the agent's and the evaluations' time is not training: not on the simulated clock */
    mq_rclock_begin(&self->clock, mq_now_s(), self->train_time);
    self->out.sim_time = self->clock.sim_issued;
    it->run_time = self->train_time; /* the links' schedules run on it (mqgrad/ps.h) */
    for (uint32_t k = 0; k < self->round.nmembers; k++) {
        it->member = k;
        if (s_send_to(self, &self->mb.workers[self->round.members[k]]) != 0)
            mq_warn("iteration %llu: cannot reach worker %u: %s", (unsigned long long)self->iter,
                    self->round.members[k], mq_err_last()); /* its heartbeats will tell */
    }
    s_send_members(self, MQ_MSG_ITERATE, checkpoint);
}

/* Whether this round writes a checkpoint (checkpoints.c); if so, the state it will hold. */
static bool s_checkpoint_due(s_sched_t *self)
{
    if (!mq_cp_due(&self->cp, self->iter, self->mb.nservers))
        return false;
    double wall = self->wall_before + (self->t_training > 0 ? mq_now_s() - self->t_training : 0);
    self->ckpt = (mq_sched_ckpt_t){
        .iter = self->iter,
        .cursor = self->cursor,
        .lineage = self->lineage,
        .servers = self->mb.nservers,
        .bits = self->bits,
        .train_time_s = self->train_time,
        .wall_time_s = wall,
        .fallbacks = self->fallbacks,
    };
    mq_rec_save(&self->tot, &self->watch, &self->ckpt);
    snprintf(self->ckpt.model, sizeof self->ckpt.model, "%s", self->cfg->model);
    snprintf(self->ckpt.policy, sizeof self->ckpt.policy, "%s", self->policy);
    return true;
}

/* Whether MSG, a message only servers send (HAVE, SAVED, PROGRESS), comes from the server
 * that holds the shard it names; if not it is dropped and counted: a worker's key cannot speak
 * for a shard (cancel checkpoints, name shard files that do not exist, cut members). */
static bool s_from_server(s_sched_t *self, const mq_msg_t *msg, uint32_t shard)
{
    if (shard < self->mb.nservers && mq_mb_from_peer(&self->mb.servers[shard], msg))
        return true;
    char why[96];
    snprintf(why, sizeof why, "%s from a peer that is not that shard's server",
             mq_msg_type_name(msg->type));
    mq_drops_note(&self->drops, MQ_DROP_SHARD, msg->peer, msg->peer_len, why);
    return false;
}

static void s_on_saved(void *arg, mq_msg_t *msg, const mq_saved_t *sv_)
{
    s_sched_t *self = arg;
    const mq_saved_t *sv = sv_;
    if (!s_from_server(self, msg, sv->shard))
        return;
    mq_cp_action_t a = mq_cp_saved(&self->cp, msg->iter, sv->shard, !sv->error[0]);
    if (a == MQ_CP_IGNORE || a == MQ_CP_WAIT)
        return;
    if (a == MQ_CP_FAILED_FIRST || a == MQ_CP_FAILED) {
        if (a == MQ_CP_FAILED_FIRST)
            mq_warn("no checkpoint at iteration %llu: %s (further failures are only events)",
                    (unsigned long long)msg->iter, sv->error);
        char fields[400], why[300];
        mq_json_escape(sv->error, why, sizeof why);
        snprintf(fields, sizeof fields, "\"at\":%llu,\"reason\":\"%s\"",
                 (unsigned long long)msg->iter, why);
        s_event(self, "checkpoint_failed", fields);
        return;
    }
    if (self->cp.consistent > 0 && mq_sched_ckpt_keep_prev(self->run_dir) != 0)
        mq_warn("checkpoint-prev.json: %s (no checkpoint to fall back on)", mq_err_last());
    if (mq_sched_ckpt_write(self->run_dir, &self->ckpt) != 0) {
        mq_error("checkpoint.json: %s", mq_err_last());
        self->log_failed = true;
        return;
    }
    mq_metric_set(self->m.ckpt_iter, (double)self->ckpt.iter);
    mq_cp_committed(&self->cp);
    mq_metric_set(self->m.ckpt_time, (double)time(NULL));
    char fields[64];
    snprintf(fields, sizeof fields, "\"at\":%llu", (unsigned long long)self->ckpt.iter);
    s_event(self, "checkpoint", fields);
}

/* WELCOME to NODE, which holds rank RANK (membership.c says what it holds). */
static void s_welcome(s_sched_t *self, mq_mb_node_t *node, uint32_t rank)
{
    mq_mb_run_t run = {.config = &self->run,
                       .run_id = self->run_id,
                       .run_key = self->run_key,
                       .layout = self->external ? &self->layout : NULL,
                       .seeder = self->seeder};
    mq_mb_welcome(&self->mb, node, rank, &run, mq_now_s(), self->endpoints, &self->out);
    if (s_send_to(self, node) != 0)
        mq_warn("welcome to rank %u: %s", rank, mq_err_last());
}

/* Takes the state of a checkpoint back (a resumed run starts at its iteration). */
static void s_restore(s_sched_t *self, const mq_sched_ckpt_t *c)
{
    self->iter = c->iter;
    self->cursor = c->cursor;
    self->lineage = c->lineage;
    self->bits = c->bits;
    self->train_time = c->train_time_s;
    self->wall_before = c->wall_time_s;
    self->fallbacks = c->fallbacks;
    mq_rec_load(&self->tot, &self->watch, c);
    if (c->policy[0] && !self->policy[0])
        snprintf(self->policy, sizeof self->policy, "%s", c->policy);
    mq_sched_ckpt_t prev;
    mq_cp_restart(&self->cp, c->iter,
                  mq_sched_ckpt_read_prev(self->run_dir, &prev) == 0 ? prev.iter : 0);
}

/* The run directory: a new run, or with --resume the unfinished run there, from its last
 * consistent checkpoint (or from the start when it has none). A run that is over for good
 * makes --resume start a new one beside it. Returns 0, or -1 with the reason. */
static int s_open_run(s_sched_t *self)
{
    mq_sched_opened_t o;
    if (mq_sched_open_run(self->cfg, self->run_dir, sizeof self->run_dir, &o) != 0)
        return -1;
    self->log = o.log;
    if (!o.resumed)
        return 0;
    if (o.has_ckpt)
        s_restore(self, &o.ckpt);
    char fields[200];
    snprintf(fields, sizeof fields,
             "\"from_iter\":%llu,\"iterations_lost\":%llu,\"checkpoint\":%s,"
             "\"run_id\":\"%016llx\"",
             (unsigned long long)self->iter, (unsigned long long)o.lost,
             o.has_ckpt ? "true" : "false", (unsigned long long)self->run_id);
    s_event(self, "restart", fields);
    mq_info("resuming the run in %s at iteration %llu (%s; %llu iterations done since are lost)",
            self->run_dir, (unsigned long long)self->iter,
            o.has_ckpt ? "its last checkpoint" : "no checkpoint yet: from the start",
            (unsigned long long)o.lost);
    return 0;
}

/* Servers took ranks in the order they registered; before they are told, each that asked
 * for a shard (--shard: a stable identity whose volume holds that shard's checkpoints) gets
 * it, unless another asked for the same one first. */
static void s_place_servers(s_sched_t *self)
{
    mq_mb_place_servers(&self->mb);
    for (uint32_t i = 0; i < self->mb.nservers; i++)
        if (self->mb.servers[i].prefer >= 0 && self->mb.servers[i].prefer != (int)i)
            mq_warn("server at %s asked for shard %d, which %s; it holds shard %u",
                    self->mb.servers[i].endpoint, self->mb.servers[i].prefer,
                    (uint32_t)self->mb.servers[i].prefer >= self->mb.nservers
                        ? "the run does not have"
                        : "another server asked for",
                    i);
}

static void s_start(s_sched_t *self)
{
    if (!self->log && s_open_run(self) != 0) { /* open already after a rollback */
        s_fail(self, "run directory: %s", mq_err_last());
        return;
    }
    if (!self->lineage)
        self->lineage = self->run_id;
    self->run.lineage = self->lineage;
    self->run.resume_iter = self->cp.resumed_at;
    if (self->external)
        self->seeder = mq_mb_seeder(&self->mb, self->seeder);
    s_place_servers(self);
    for (uint32_t i = 0; i < self->mb.nservers; i++)
        s_welcome(self, &self->mb.servers[i], i);
    s_metrics_tick(self);
    for (uint32_t i = 0; i < self->mb.max_workers; i++)
        if (self->mb.workers[i].state != MQ_MB_FREE)
            s_welcome(self, &self->mb.workers[i], i);
    char fields[160];
    uint32_t nworkers = mq_mb_count(&self->mb, MQ_MB_FREE);
    snprintf(fields, sizeof fields, "\"workers\":%u,\"servers\":%u,\"run_id\":\"%016llx\"",
             nworkers, self->mb.nservers, (unsigned long long)self->run_id);
    s_event(self, "start", fields);
    mq_info("cluster complete: %u workers, %u servers; run %016llx in %s", nworkers,
            self->mb.nservers, (unsigned long long)self->run_id, self->run_dir);
    s_go(self, MQ_PE_COMPLETE);
}

/* A node finished its setup (data, model). Iteration 0 starts when every server and the
 * --workers first workers have; a worker ready later is a member from the next iteration. */
static void s_on_ready(void *arg, mq_msg_t *msg)
{
    s_sched_t *self = arg;
    if (self->ph.phase == MQ_PH_REGISTERING || self->ph.phase == MQ_PH_DONE ||
        !mq_mb_ready(&self->mb, msg, mq_now_s())) {
        mq_drops_note(&self->drops, MQ_DROP_RANK, msg->peer, msg->peer_len,
                      "ready from an unknown node, twice, or out of phase");
        return;
    }
    if (self->ph.phase == MQ_PH_PAUSED) {
        s_issue(self);
        return;
    }
    if (self->ph.phase != MQ_PH_PREPARING)
        return; /* a member from the next iteration on */
    if (!mq_mb_all_ready(&self->mb, (uint32_t)self->cfg->workers))
        return;
    mq_mb_start(&self->mb); /* the first members: no join events */
    mq_info("every node is ready; training starts");
    s_event(self, "ready", NULL);
    self->t_progress = mq_now_s();
    self->t_training = self->t_progress;
    s_issue(self);
}

static void s_summary(s_sched_t *self, const char *status)
{
    if (!self->log)
        return;
    mq_summary_t s = {
        .iterations = self->iter,
        .train_time_s = self->train_time,
        .policy = self->policy[0] ? self->policy : "unknown (the agent never answered)",
        .model = self->cfg->model,
        .params = s_params(self),
        .dataset = self->cfg->dataset,
        .workers = (int)self->cfg->workers,
        .servers = (int)self->cfg->servers,
        .seed = (uint64_t)self->cfg->seed,
        .link_mbps = self->cfg->link_mbps,
        .clock = self->cfg->clock,
        .wall_time_s = self->wall_before + (self->t_training > 0 ? mq_now_s() - self->t_training : 0),
        .status = status,
        .reason = self->reason[0] ? self->reason : NULL,
    };
    mq_rec_summary(&self->tot, &self->watch, &s);
    if (mq_runlog_summary(self->log, &s) != 0) {
        mq_error("summary: %s", mq_err_last());
        self->log_failed = true;
    }
}

/* Logs why the run cannot go on and ends it "failed" with that reason. */
static void s_fail(s_sched_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->reason, sizeof self->reason, fmt, ap);
    va_end(ap);
    mq_error("%s", self->reason);
    s_finish(self, "failed", 1);
}

static void s_finish(s_sched_t *self, const char *status, int code)
{
    if (self->ph.phase == MQ_PH_DONE)
        return;
    s_go(self, MQ_PE_FINISH);
    s_agent_event(self, MQ_AL_RESET, NULL, NULL, NULL); /* no wait outlives the run */
    s_summary(self, status);
    char fields[96];
    snprintf(fields, sizeof fields, "\"status\":\"%s\"", status);
    s_event(self, "stop", fields);
    /* An interrupted scheduler leaves the nodes be: a scheduler started again with --resume
     * takes them back (they register again); else they give up after --peer-timeout. */
    if (strcmp(status, "interrupted") != 0) {
        mq_msg_init(&self->out, MQ_MSG_STOP);
        snprintf(self->out.stop.reason, sizeof self->out.stop.reason, "run %s", status);
        s_broadcast(self, true, true);
    }
    mq_info("run %s after %llu iterations, %.1f s of training; final loss %.4f, test accuracy "
            "%.2f%%, %.1f MB sent",
            status, (unsigned long long)self->iter, self->train_time, self->tot.last_loss,
            self->tot.last_acc * 100, (double)(self->tot.bytes_up + self->tot.bytes_down) / 1e6);
    if (self->clock.cut_total)
        mq_info("stragglers: %llu rounds closed without %llu late pushes (--stragglers %s)",
                (unsigned long long)self->clock.cut_rounds,
                (unsigned long long)self->clock.cut_total,
                self->cfg->stragglers);
    if (self->log_failed && code == 0) {
        mq_error("the run directory %s is incomplete (a write failed): exit 1", self->run_dir);
        code = 1;
    }
    mq_service_done(self->pipe, code);
}

static void s_progress(s_sched_t *self, bool force)
{
    const mq_scheduler_config_t *c = self->cfg;
    double now = mq_now_s();
    if (c->progress_every <= 0 || (!force && now - self->t_progress < c->progress_every))
        return;
    self->t_progress = now;
    double rate = self->train_time > 0 ? (double)self->iter / self->train_time : 0;
    double left = -1;
    if (c->iterations > 0 && rate > 0)
        left = (double)((uint64_t)c->iterations - self->iter) / rate;
    if (c->time_budget > 0 && (left < 0 || c->time_budget - self->train_time < left))
        left = c->time_budget - self->train_time;
    char acc[32] = "-";
    if (!isnan(self->tot.last_acc))
        snprintf(acc, sizeof acc, "%.2f%%", self->tot.last_acc * 100);
    char it[48];
    if (c->iterations)
        snprintf(it, sizeof it, "%llu/%ld", (unsigned long long)self->iter, c->iterations);
    else
        snprintf(it, sizeof it, "%llu", (unsigned long long)self->iter);
    printf("iter %-11s loss %.4f  acc %-6s  bits %2d  sent %8.1f MB  %5.2f it/s  left %.0f s%s\n",
           it, self->watch.smoothed, acc, self->used_bits,
           (double)(self->tot.bytes_up + self->tot.bytes_down) / 1e6, rate, left < 0 ? 0 : left,
           self->run.simulated_clock ? " (simulated clock)" : "");
    fflush(stdout);
}

static bool s_over(const s_sched_t *self)
{
    return mq_hz_over(&self->hz, self->iter, self->train_time);
}

static void s_diverged(s_sched_t *self);

/* Moves to iteration iter (already advanced): stop, or issue it. */
static void s_next(s_sched_t *self)
{
    mq_hz_next_t next = mq_hz_after(&self->hz, self->iter, self->train_time, self->evaluate);
    if (next == MQ_HZ_ONE_MORE) { /* out of time on a round not evaluated: one more */
        s_issue(self);
        return;
    }
    if (next == MQ_HZ_END) {
        s_progress(self, true);
        /* The last iteration is evaluated (s_issue): a run that ends at chance did not learn. */
        if (mq_rec_final(&self->tot, &self->watch, self->iter))
            s_diverged(self);
        if (self->watch.diverged)
            s_finish(self, "diverged", MQ_EXIT_DIVERGED);
        else
            s_finish(self, "completed", 0);
        return;
    }
    s_progress(self, false);
    s_issue(self);
}

/* The same as JSON fields of an event. */
static void s_norms_json(const s_sched_t *self, char *buf, size_t len)
{
    double g, q, u;
    mq_rec_norms(&self->sum, self->round.nreports, &g, &q, &u);
    snprintf(buf, len, "\"grad_norm\":%.6g,\"sent_norm\":%.6g,\"update_norm\":%.6g", g, q,
             u);
}

/* The run diverged at this iteration: say so once, loudly, with the evidence. */
static void s_diverged(s_sched_t *self)
{
    const mq_watch_t *w = &self->watch;
    bool end = w->at_end; /* judged as the run ends */
    bool stop = strcmp(self->cfg->on_divergence, "stop") == 0;
    const char *action = end ? "end" : stop ? "stop" : "continue";
    char rule[64], detail[600], norms[160] = "", fields[1000];
    mq_json_escape(w->rule, rule, sizeof rule);
    mq_json_escape(w->detail, detail, sizeof detail);
    /* The gradient's norms are the iteration's that diverged; the rules judged at the end
     * (chance, flat) judge the run as a whole. */
    if (!end) {
        norms[0] = ',';
        s_norms_json(self, norms + 1, sizeof norms - 1);
    }
    snprintf(fields, sizeof fields,
             "\"rule\":\"%s\",\"detail\":\"%s\",\"bits\":%d,\"action\":\"%s\"%s", rule, detail,
             self->used_bits, action, norms);
    s_event(self, "diverged", fields);
    mq_error("run diverged at iteration %llu (%s rule): %s", (unsigned long long)w->div_iter,
             w->rule, w->detail);
    if (end)
        printf("DIVERGED at iteration %llu: %s\n", (unsigned long long)w->div_iter, w->detail);
    else
        printf("DIVERGED at iteration %llu: %s; %s (--on-divergence %s)\n",
               (unsigned long long)w->div_iter, w->detail,
               stop ? "stopping the run" : "training goes on", self->cfg->on_divergence);
    fflush(stdout);
}

/* Records the closed round (record.c): its row written, the watch's word said; returns true
 * if the run must stop (it diverged under --on-divergence stop, or its files cannot be
 * written). *SMOOTHED_BEFORE: the smoothed loss before this round's. */
static bool s_record(s_sched_t *self, double *smoothed_before)
{
    mq_rec_round_t in = {
        .iter = self->iter,
        .train_time_s = self->train_time,
        .agent_ms = self->agent_ms,
        .slowest_ms = self->clock.slowest_ms,
        .bits = self->used_bits,
        .evaluated = self->evaluate,
        .nmembers = self->round.nmembers,
        .nreports = self->round.nreports,
        .cut = self->clock.cut,
        .slowest_rank = self->clock.slowest_rank,
    };
    mq_rec_out_t out;
    unsigned a = mq_rec_round(&self->tot, &self->watch,
                              strcmp(self->cfg->on_divergence, "stop") == 0, &in, &self->sum,
                              &out);
    const mq_metrics_row_t *row = &out.row;
    *smoothed_before = out.smoothed_before;
    if (a & MQ_REC_GUARD) {
        char fields[400], norms[160];
        s_norms_json(self, norms, sizeof norms);
        snprintf(fields, sizeof fields,
                 "\"loss\":%.6g,\"smoothed\":%.6g,\"bits\":%d,\"floor\":%d,\"until_iter\":%llu,%s",
                 row->loss, out.smoothed_before, self->used_bits, self->watch.guard_floor,
                 (unsigned long long)self->watch.guard_until, norms);
        s_event(self, "guard", fields);
        mq_warn("loss spike at iteration %llu (%.4g, smoothed %.4g): at least %d bits until "
                "iteration %llu",
                (unsigned long long)self->iter, row->loss, out.smoothed_before,
                self->watch.guard_floor, (unsigned long long)self->watch.guard_until);
    }
    if (a & MQ_REC_DIVERGED)
        s_diverged(self);
    mq_metric_set(self->m.iteration, (double)self->iter + 1);
    mq_metric_add(self->m.iterations, 1);
    mq_metric_set(self->m.loss, row->loss);
    mq_metric_set(self->m.bits, self->used_bits);
    mq_metric_add(self->m.pushed, (double)row->bytes_up);
    mq_metric_add(self->m.pulled, (double)row->bytes_down);
    mq_metric_set(self->m.iter_pushed, (double)row->bytes_up);
    mq_metric_observe(self->m.iter_seconds, self->last_iter_s);
    mq_metric_set(self->m.members, self->round.nmembers);
    mq_metric_add(self->m.stragglers, self->clock.cut);
    if (row->evaluated) {
        mq_metric_set(self->m.acc, row->test_acc);
        mq_metric_set(self->m.test_loss, row->test_loss);
    }
    if (mq_runlog_row(self->log, row) != 0) {
        /* A run that cannot record itself fails now, with the reason, rather than end
         * "completed" with rows missing. */
        mq_error("metrics: %s", mq_err_last());
        self->log_failed = true;
        return true;
    }
    return a & MQ_REC_STOP;
}

/* ---- the agent ----------------------------------------------------------------------------- */

static int s_on_agent_deadline(zloop_t *loop, int timer_id, void *arg);
static void s_take_decision(s_sched_t *self, const mq_status_msg_t *d, const mq_widths_t *w);

/* Feeds EVENT to the link's state machine (agent_link.c) and carries out its actions; WHY
 * says what happened when the agent missed, D and W are the decision taken. */
static void s_agent_event(s_sched_t *self, mq_al_event_t event, const char *why,
                          const mq_status_msg_t *d, const mq_widths_t *w)
{
    unsigned act;
    if (mq_al_step(&self->agent_link, event, &act) != 0) {
        mq_warn("%s", mq_err_last());
        return;
    }
    if (act & MQ_AL_TAKE)
        s_take_decision(self, d, w);
    if (act & MQ_AL_BACK) {
        mq_info("agent answers again (bits %u)", d->bits);
        s_event(self, "agent_back", NULL);
    }
    if (act & MQ_AL_MISSED) {
        self->fallbacks++;
        mq_metric_set(self->m.fallbacks, (double)self->fallbacks);
    }
    if (act & MQ_AL_LOST) {
        mq_warn("agent at %s %s: reusing %d bits, training goes on", self->cfg->agent, why,
                self->bits);
        char fields[160];
        snprintf(fields, sizeof fields, "\"reason\":\"%s\",\"bits\":%d", why, self->bits);
        s_event(self, "agent_fallback", fields);
    }
    if ((act & MQ_AL_CANCEL) && self->agent_timer >= 0)
        zloop_timer_end(self->loop, self->agent_timer);
    if (act & MQ_AL_CANCEL)
        self->agent_timer = -1;
    if (act & MQ_AL_WAIT) {
        s_go(self, MQ_PE_ASK_AGENT);
        self->t_observed = mq_now_s();
        self->agent_timer = zloop_timer(self->loop, (size_t)self->cfg->agent_deadline_ms, 1,
                                        s_on_agent_deadline, self);
    }
    if (act & MQ_AL_NEXT) {
        if (self->ph.phase == MQ_PH_WAIT_AGENT)
            self->agent_ms = (mq_now_s() - self->t_observed) * 1e3;
        s_next(self);
    }
}

static int s_on_agent_deadline(zloop_t *loop, int timer_id, void *arg)
{
    s_sched_t *self = arg;
    self->agent_timer = -1;
    char why[96];
    snprintf(why, sizeof why, "did not answer within %.0f ms", self->cfg->agent_deadline_ms);
    s_agent_event(self, MQ_AL_DEADLINE, why, NULL, NULL);
    return 0;
}

/* Tells the agent about the iteration just recorded; waits for its decision if it has been
 * answering, else goes straight on. */
static void s_observe(s_sched_t *self, double iter_ms, double smoothed_before)
{
    mq_msg_init(&self->out, MQ_MSG_OBSERVE);
    self->out.iter = self->iter - 1;
    mq_al_round_t r = {
        .sum = &self->sum,
        .nreports = self->round.nreports,
        .smoothed_before = smoothed_before,
        .iter_ms = iter_ms,
        .progress = s_progress_fraction(self),
        .bits = self->bits,
        .used_bits = self->used_bits,
        .fp32 = self->run.fp32,
        .total_iters = (uint64_t)self->cfg->iterations,
        .fallbacks = self->fallbacks,
        .layout = self->has_layout ? &self->layout : NULL,
        .quant_threshold = self->run.quant_threshold,
        .widths = &self->used_widths,
    };
    mq_al_observation(&r, &self->out.observe);
    if (mq_wire_send(self->agent, &self->out, NULL, 0) != 0)
        s_agent_event(self, MQ_AL_UNREACHABLE, "is unreachable", NULL, NULL);
    else
        s_agent_event(self, s_over(self) ? MQ_AL_OBSERVED_LAST : MQ_AL_OBSERVED, NULL, NULL,
                      NULL);
}

static void s_on_decision(void *arg, mq_msg_t *msg, const mq_status_msg_t *d)
{
    s_sched_t *self = arg;
    if (self->ph.phase == MQ_PH_DONE)
        return;
    mq_widths_t widths;
    const char *why = "";
    mq_drop_t drop = mq_al_decision(d, self->has_layout ? self->layout.n : 0, &widths, &why);
    if (drop != MQ_DROP_NONE) {
        mq_drops_note(&self->drops, drop, (const uint8_t *)"agent", 5, why);
        return;
    }
    bool due = self->ph.phase == MQ_PH_WAIT_AGENT && msg->iter + 1 == self->iter;
    s_agent_event(self, due ? MQ_AL_DECISION_DUE : MQ_AL_DECISION, NULL, d, &widths);
}

/* Applies decision D, its levels W: the bits and levels of the next iterations, the policy's
 * name, each change recorded. */
static void s_take_decision(s_sched_t *self, const mq_status_msg_t *d, const mq_widths_t *w)
{
    mq_widths_t widths = *w;
    if (!mq_widths_equal(&widths, &self->widths) && widths.n) {
        char fields[MQ_WIRE_MAX_TENSORS * 4 + 32] = "\"widths\":\"";
        for (uint32_t t = 0; t < widths.n; t++)
            snprintf(fields + strlen(fields), sizeof fields - strlen(fields), "%s%u",
                     t ? "," : "", widths.per[t]);
        snprintf(fields + strlen(fields), sizeof fields - strlen(fields), "\"");
        s_event(self, "widths", fields);
    }
    self->widths = widths;
    if (d->policy[0] && !self->policy[0]) {
        snprintf(self->policy, sizeof self->policy, "%s", d->policy);
    } else if (d->policy[0] && strcmp(d->policy, self->policy) != 0) {
        char fields[256];
        snprintf(fields, sizeof fields, "\"from\":\"%s\",\"to\":\"%s\"", self->policy,
                 d->policy);
        s_event(self, "policy", fields);
        snprintf(self->policy, sizeof self->policy, "%s", d->policy);
    }
    if ((int)d->bits != self->bits) {
        char fields[96];
        snprintf(fields, sizeof fields, "\"from\":%d,\"to\":%u", self->bits, d->bits);
        s_event(self, "bits", fields);
    }
    self->bits = (int)d->bits;
}

static void s_iteration_done(s_sched_t *self)
{
    double iter_ms = mq_rclock_iter_ms(&self->clock, mq_now_s(), self->sum.eval_ms);
    self->train_time += iter_ms / 1e3;
    self->last_iter_s = iter_ms / 1e3;
    double smoothed_before;
    bool stop = s_record(self, &smoothed_before);
    self->agent_ms = 0;
    self->iter++;
    self->round.view = 0;
    if (self->log_failed) {
        s_fail(self, "the run's files in %s cannot be written (see the log)", self->cfg->run_dir);
        return;
    }
    if (stop) {
        s_progress(self, true);
        s_finish(self, "diverged", MQ_EXIT_DIVERGED);
        return;
    }
    if (!self->agent || self->run.fp32) {
        s_next(self);
        return;
    }
    s_observe(self, iter_ms, smoothed_before);
}

/* ---- membership and reports ---------------------------------------------------------------- */

/* Answers MSG with ERROR WHY; RETRY tells the node it may register again (it is not part of
 * this run: the scheduler restarted, or took it out), else it is refused for good. */
static void s_refuse(s_sched_t *self, mq_msg_t *msg, const char *why, bool retry)
{
    mq_warn("refused a %s: %s", mq_msg_type_name(msg->type), why);
    mq_msg_init(&self->out, MQ_MSG_ERROR);
    self->out.error.retry = retry;
    memcpy(self->out.peer, msg->peer, msg->peer_len);
    self->out.peer_len = msg->peer_len;
    snprintf(self->out.error.reason, sizeof self->out.error.reason, "%s", why);
    mq_wire_reply(self->router, &self->out, &self->drops);
}

/* Carries out what the round in flight (round.c) asks: the members it left out counted as
 * stragglers, the commit or a new view of the member set sent to the servers, the round
 * recorded, or issued again when nobody is left in it. */
static void s_round_do(s_sched_t *self, const mq_round_out_t *o)
{
    for (uint32_t i = 0; i < o->nleft; i++)
        s_metrics_straggler(self, o->left[i]);
    if (o->nleft)
        mq_rclock_cut(&self->clock, o->left[0], o->nleft, mq_now_s());
    if (o->actions & MQ_RD_COMMIT) {
        s_send_members(self, MQ_MSG_COMMIT, false);
        self->commit_sim = 0;
    }
    if (o->actions & MQ_RD_VIEW)
        s_send_members(self, MQ_MSG_ITERATE, false);
    if (o->actions & MQ_RD_AGAIN) {
        mq_warn("iteration %llu lost every member; it will run again",
                (unsigned long long)self->iter);
        s_issue(self);
    } else if (o->actions & MQ_RD_DONE) {
        s_iteration_done(self);
    }
}

/* Worker RANK is gone (WHY): its rank is free, and the round in flight goes on without it
 * unless it already reported (then its push is in every shard's aggregate). */
static void s_lose_worker(s_sched_t *self, uint32_t rank, const char *why)
{
    bool member = mq_mb_lose(&self->mb, rank);
    uint32_t left = mq_mb_count(&self->mb, MQ_MB_ACTIVE) + mq_mb_count(&self->mb, MQ_MB_READY);
    char fields[200], reason[128];
    mq_json_escape(why, reason, sizeof reason);
    snprintf(fields, sizeof fields, "\"rank\":%u,\"reason\":\"%s\",\"workers\":%u", rank, reason,
             left);
    s_event(self, "worker_lost", fields);
    mq_warn("worker %u lost at iteration %llu (%s); %u workers left", rank,
            (unsigned long long)self->iter, why, left);
    if (!member || self->ph.phase != MQ_PH_RUNNING)
        return;
    mq_round_out_t o; /* out of the round: the servers aggregate over the others */
    mq_round_lose(&self->round, rank, &o);
    s_round_do(self, &o);
}


static void s_on_heartbeat(void *arg, mq_msg_t *msg, const mq_heartbeat_t *hb)
{
    s_sched_t *self = arg;
    mq_mb_node_t *n = mq_mb_node(&self->mb, msg->role, msg->rank, msg->incarnation);
    if (n && msg->run_id == self->run_id) {
        n->last_heard = mq_now_s();
        if (msg->role == MQ_ROLE_WORKER)
            n->pushed = hb->pushed;
        return;
    }
    char why[160];
    snprintf(why, sizeof why, "%s %u is not part of run %016llx (taken out of it, or of another "
             "run)", msg->role == MQ_ROLE_SERVER ? "server" : "worker", msg->rank,
             (unsigned long long)self->run_id);
    s_refuse(self, msg, why, true);
}

static void s_on_leave(void *arg, mq_msg_t *msg)
{
    s_sched_t *self = arg;
    mq_mb_node_t *n = mq_mb_node(&self->mb, MQ_ROLE_WORKER, msg->rank, msg->incarnation);
    if (!n || msg->role != MQ_ROLE_WORKER) {
        mq_drops_note(&self->drops, MQ_DROP_RANK, msg->peer, msg->peer_len,
                      "leave from a node that holds no rank");
        return;
    }
    s_lose_worker(self, msg->rank, "it left (stopped)");
}

/* Why a worker's REGISTER cannot join this run's model, or NULL. */
static const char *s_layout_refusal(s_sched_t *self, const mq_msg_t *msg)
{
    static _Thread_local char why[MQ_WIRE_MAX_TEXT];
    if (msg->layout.n == 0)
        return self->external ? "this run trains the workers' own model (--model external): its "
                                "workers join through libmqgrad (the C library or the Python "
                                "package), which declares the model; mqgrad-worker trains the "
                                "built-in models"
                              : NULL;
    if (!self->has_layout || mq_layout_compare(&self->layout, &msg->layout) == 0)
        return NULL;
    snprintf(why, sizeof why, "the model differs from the run's (%s %s): %s",
             self->external ? "the first worker's," : "built-in", self->run.model, mq_err_last());
    return why;
}

/* A REGISTER: a new holder of a rank (welcomed at once when the run is under way: a member
 * once it is ready; the run starts when the cluster is complete), or a known node's try again
 * on a new connection (answered there from now on, and welcomed again if it was welcomed
 * and has not said it is ready: the first WELCOME went to the connection it gave up). */
static void s_on_register(void *arg, mq_msg_t *msg, const mq_register_t *reg)
{
    (void)reg;
    s_sched_t *self = arg;
    bool worker = msg->role == MQ_ROLE_WORKER;
    if (msg->role != MQ_ROLE_WORKER && msg->role != MQ_ROLE_SERVER) {
        s_refuse(self, msg, "unknown role", false);
        return;
    }
    mq_mb_reg_out_t o;
    int again = mq_mb_again(&self->mb, msg, &o);
    if (again >= 0) {
        mq_mb_node_t *node = o.worker ? &self->mb.workers[o.rank] : &self->mb.servers[o.rank];
        if (again != MQ_MB_MOVED)
            return;
        mq_warn("%s %u registered again from a new connection (it heard nothing on its first): "
                "answering it there",
                o.worker ? "worker" : "server", o.rank);
        if (self->ph.phase != MQ_PH_REGISTERING && node->state == MQ_MB_SETUP)
            s_welcome(self, node, o.rank);
        return;
    }
    if (self->ph.phase == MQ_PH_DONE) {
        s_refuse(self, msg, "the run is over", false);
        return;
    }
    const char *why = worker ? s_layout_refusal(self, msg) : NULL;
    if (why) {
        s_refuse(self, msg, why, false);
        return;
    }
    if (mq_mb_take(&self->mb, msg, self->ph.phase == MQ_PH_REGISTERING, mq_now_s(), &o) !=
        MQ_MB_TAKEN) {
        s_refuse(self, msg, o.why, o.retry);
        return;
    }
    if (worker && !self->has_layout) { /* external: the first worker's model is the run's */
        self->layout = msg->layout;
        self->has_layout = true;
        self->seeder = o.rank;
        s_metrics_layout(self);
        mq_info("the run's model: worker %u's layout, %u tensors", o.rank, self->layout.n);
    }
    mq_mb_node_t *node = worker ? &self->mb.workers[o.rank] : &self->mb.servers[o.rank];
    uint32_t nworkers = mq_mb_count(&self->mb, MQ_MB_FREE);
    mq_info("%s %u registered%s%s (%u/%ld workers, %u/%ld servers)", worker ? "worker" : "server",
            o.rank, worker ? "" : " at ", node->endpoint, nworkers, self->cfg->workers,
            self->mb.nservers, self->cfg->servers);
    if (self->ph.phase != MQ_PH_REGISTERING) {
        s_welcome(self, node, o.rank); /* a late join: a member once it is ready */
        return;
    }
    if (nworkers >= (uint32_t)self->cfg->workers &&
        self->mb.nservers == (uint32_t)self->cfg->servers)
        s_start(self);
}

static void s_on_report(void *arg, mq_msg_t *msg, const mq_report_t *rep)
{
    s_sched_t *self = arg;
    const char *why = NULL;
    mq_drop_t d = MQ_DROP_NONE;
    const mq_mb_node_t *w = mq_mb_node(&self->mb, MQ_ROLE_WORKER, msg->rank, msg->incarnation);
    if (!w || w->state != MQ_MB_ACTIVE || !mq_mb_from_peer(w, msg))
        d = MQ_DROP_RANK, why = "report from a peer that is not that rank";
    else
        d = mq_round_report_check(&self->round, self->ph.phase == MQ_PH_RUNNING, self->iter,
                                  self->clock.cut > 0, msg->iter, msg->rank, &why);
    if (d != MQ_DROP_NONE) {
        mq_drops_note(&self->drops, d, msg->peer, msg->peer_len, why);
        return;
    }
    double now = mq_now_s();
    self->mb.workers[msg->rank].last_heard = now;
    mq_rclock_report(&self->clock, msg->rank, now, msg->sim_time);
    s_metrics_report(self, msg->rank, rep);
    mq_round_sum(&self->sum, rep, self->layout.n);
    mq_round_out_t o;
    mq_round_report(&self->round, msg->rank, &o);
    s_round_do(self, &o);
}


static int s_on_straggler_deadline(zloop_t *loop, int timer_id, void *arg)
{
    s_sched_t *self = arg;
    self->deadline_timer = -1;
    if (self->ph.phase != MQ_PH_RUNNING) {
        self->round.deadline_passed = true;
        return 0;
    }
    mq_round_out_t o;
    mq_round_deadline(&self->round, self->mb.nservers, &o);
    s_round_do(self, &o);
    return 0;
}

static void s_on_progress(void *arg, mq_msg_t *msg, const mq_members_t *p)
{
    s_sched_t *self = arg;
    if (!s_from_server(self, msg, p->shard) || self->ph.phase != MQ_PH_RUNNING ||
        msg->iter != self->iter)
        return;
    mq_round_out_t o;
    mq_round_progress(&self->round, p->shard, p->members, p->n_members, self->mb.nservers, &o);
    s_round_do(self, &o);
}

static void s_on_have(void *arg, mq_msg_t *msg, const mq_members_t *h)
{
    s_sched_t *self = arg;
    if (!s_from_server(self, msg, h->shard))
        return;
    self->mb.servers[h->shard].last_heard = mq_now_s();
    if (self->ph.phase != MQ_PH_RUNNING || msg->iter != self->iter || h->view != self->round.view)
        return; /* for a member set since cut: the new one's HAVE follows */
    if (msg->sim_time > self->commit_sim)
        self->commit_sim = msg->sim_time; /* the simulated commit: after the last server's HAVE */
    mq_round_out_t o;
    mq_round_have(&self->round, h->shard, h->view, self->mb.nservers, &o);
    s_round_do(self, &o);
}

/* ---- event handlers ------------------------------------------------------------------------ */

/* The router's gate: who may send what (mq_mb_refusal), and a node's message of another run is
 * told to register again (a stranger's is not: it names no run). */
static mq_drop_t s_router_refusal(void *arg, mq_msg_t *msg, const char **why)
{
    s_sched_t *self = arg;
    const char *refusal = mq_mb_refusal(&self->mb, self->sec, self->run_key, self->run_id, msg);
    if (refusal) {
        if (msg->type == MQ_MSG_REGISTER) /* said, so the node stops with the reason */
            s_refuse(self, msg, refusal, false);
        *why = refusal;
        return MQ_DROP_AUTH;
    }
    switch (msg->type) {
    case MQ_MSG_REPORT:
    case MQ_MSG_READY:
    case MQ_MSG_HAVE:
    case MQ_MSG_LEAVE:
    case MQ_MSG_SAVED:
    case MQ_MSG_ERROR:
    case MQ_MSG_PROGRESS:
        if (msg->run_id == self->run_id)
            return MQ_DROP_NONE;
        snprintf(self->refusal, sizeof self->refusal,
                 "a %s of run %016llx; this scheduler runs %016llx", mq_msg_type_name(msg->type),
                 (unsigned long long)msg->run_id, (unsigned long long)self->run_id);
        if (msg->run_id) /* a node of another run: told, so it stops (a stranger is not) */
            s_refuse(self, msg, self->refusal, true);
        *why = self->refusal;
        return MQ_DROP_RUN;
    default:
        return MQ_DROP_NONE;
    }
}

/* A node that cannot take part says why; a server's failure ends the run. */
static void s_fall_back(s_sched_t *self, uint32_t server, uint64_t bad, const char *reason);

static void s_on_error(void *arg, mq_msg_t *msg, const mq_reason_t *error)
{
    s_sched_t *self = arg;
    if (self->ph.phase != MQ_PH_DONE && msg->role == MQ_ROLE_SERVER &&
        error->unreadable_checkpoint)
        s_fall_back(self, msg->rank, msg->iter, error->reason);
    else if (self->ph.phase != MQ_PH_DONE && msg->role == MQ_ROLE_SERVER)
        s_fail(self, "server: %s", error->reason);
    else
        mq_error("%s", error->reason);
}

static const mq_handlers_t s_router_handlers = {
    .register_ = s_on_register, .heartbeat = s_on_heartbeat, .report = s_on_report,
    .ready = s_on_ready, .have = s_on_have, .saved = s_on_saved, .progress = s_on_progress,
    .error = s_on_error, .leave = s_on_leave};

static void s_on_agent_error(void *arg, mq_msg_t *msg, const mq_reason_t *error)
{
    mq_warn("agent: %s", error->reason);
}

static const mq_handlers_t s_agent_handlers = {.decision = s_on_decision,
                                               .error = s_on_agent_error};

static void s_missing(s_sched_t *self, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (uint32_t k = 0; k < self->round.nmembers && off < len; k++)
        if (!self->round.got[self->round.members[k]])
            off += (size_t)snprintf(buf + off, len - off, "%s%u", off ? "," : "",
                                    self->round.members[k]);
}

/* The round is past --iter-timeout: the members that are stuck (recovery.c) are taken out of
 * the run as lost workers and the round goes on without them; one that recovers is refused
 * at its next heartbeat and registers again. False when nothing points at some workers
 * rather than at the round. */
static bool s_take_out_stuck(s_sched_t *self, double now)
{
    uint32_t *stuck = self->stuck;
    uint32_t n = mq_rc_stuck(&self->round, &self->mb, self->iter, stuck);
    if (n == 0)
        return false;
    char why[96];
    snprintf(why, sizeof why, "no report within --iter-timeout %.0f s: stuck",
             self->cfg->iter_timeout);
    self->clock.t_issued = now; /* the round as cut gets a timeout of its own */
    for (uint32_t i = 0; i < n && self->ph.phase == MQ_PH_RUNNING; i++)
        s_lose_worker(self, stuck[i], why);
    return true;
}

/* Every node is told WHY and registers again from a clean state; the run goes back to CK's
 * iteration (NULL: to its start), keeping its directory, its id and its time so far. */
static void s_roll_back(s_sched_t *self, const mq_sched_ckpt_t *ck, const char *why)
{
    mq_msg_init(&self->out, MQ_MSG_ERROR);
    self->out.error.retry = true;
    snprintf(self->out.error.reason, sizeof self->out.error.reason, "%s", why);
    s_broadcast(self, true, true);
    double now = mq_now_s();
    double wall = self->wall_before + (self->t_training > 0 ? now - self->t_training : 0);
    mq_mb_forget(&self->mb);
    s_agent_event(self, MQ_AL_RESET, NULL, NULL, NULL);
    if (ck) {
        s_restore(self, ck);
    } else {
        mq_watch_init(&self->watch, &self->watch.o);
        self->iter = self->cursor = 0;
        self->train_time = 0;
        mq_rec_init(&self->tot);
        self->bits = (int)self->cfg->bits;
        mq_cp_restart(&self->cp, 0, 0);
    }
    self->wall_before = wall;
    self->t_training = 0;
    self->round.view = 0;
    mq_hz_restart(&self->hz);
    s_go(self, MQ_PE_ROLL_BACK); /* the registration gets its --start-timeout again */
}

/* A server is lost, and its shard with it: the run goes back to its last consistent
 * checkpoint (recovery.c). Every node is told to register again from a clean state, and the
 * run goes on from there once the cluster is complete again: a restarted server (the
 * restart policy's, or mqgrad local's) takes the free rank. */
static void s_recover(s_sched_t *self, uint32_t server, double silent)
{
    mq_sched_ckpt_t ck = {0};
    int rc = self->cfg->checkpoint_every > 0 ? mq_sched_ckpt_read(self->run_dir, &ck) : 1;
    mq_rc_plan_t plan = mq_rc_server_lost(self->cfg->checkpoint_every, rc, ck.iter, self->iter);
    if (plan.action == MQ_RC_FAIL) {
        s_fail(self, "server %u silent for %.1f s: %s%s%s", server, silent, plan.why,
               rc < 0 ? ": " : "", rc < 0 ? mq_err_last() : "");
        return;
    }
    uint64_t from = plan.from;
    char fields[160];
    snprintf(fields, sizeof fields, "\"server\":%u,\"from_iter\":%llu,\"iterations_lost\":%llu",
             server, (unsigned long long)from, (unsigned long long)plan.lost);
    s_event(self, "rollback", fields);
    mq_warn("server %u silent for %.1f s: the run goes back to iteration %llu (%s), %llu "
            "iterations lost; every node registers again",
            server, silent, (unsigned long long)from,
            plan.from_checkpoint ? "its last checkpoint" : "its start",
            (unsigned long long)plan.lost);
    char why[160];
    snprintf(why, sizeof why, "server %u was lost: the run goes back to iteration %llu", server,
             (unsigned long long)from);
    s_roll_back(self, plan.from_checkpoint ? &ck : NULL, why);
}

/* Server SERVER cannot read its shard of the checkpoint of iteration BAD that the run goes on
 * from (REASON, its words): the run goes back to the consistent checkpoint before it, whose
 * shards every server keeps (ITERATE's keep_from), or, without one, ends. checkpoint.json is
 * moved aside as checkpoint-unreadable-BAD.json; the server moved its file aside too. */
static void s_fall_back(s_sched_t *self, uint32_t server, uint64_t bad, const char *reason)
{
    mq_sched_ckpt_t prev = {0};
    int rc = mq_sched_ckpt_read_prev(self->run_dir, &prev);
    mq_rc_plan_t plan = mq_rc_unreadable(bad, self->cp.consistent, rc, prev.iter);
    if (plan.action == MQ_RC_IGNORE)
        return;
    if (plan.action == MQ_RC_FAIL) {
        s_fail(self, "%s; %s%s%s", reason, plan.why, rc < 0 ? ": " : "",
               rc < 0 ? mq_err_last() : "");
        return;
    }
    if (mq_sched_ckpt_fall_back(self->run_dir, bad) != 0) {
        s_fail(self, "%s; %s", reason, mq_err_last());
        return;
    }
    char fields[600], text[400];
    mq_json_escape(reason, text, sizeof text);
    snprintf(fields, sizeof fields,
             "\"server\":%u,\"iter\":%llu,\"from_iter\":%llu,\"reason\":\"%s\"", server,
             (unsigned long long)bad, (unsigned long long)prev.iter, text);
    s_event(self, "checkpoint_unreadable", fields);
    mq_warn("%s: the run goes back to the checkpoint before it, iteration %llu; every node "
            "registers again",
            reason, (unsigned long long)prev.iter);
    char why[200];
    snprintf(why, sizeof why,
             "server %u cannot read its checkpoint of iteration %llu: the run goes back to "
             "iteration %llu",
             server, (unsigned long long)bad, (unsigned long long)prev.iter);
    s_roll_back(self, &prev, why);
}

/* Nodes silent for longer than the heartbeat timeout are lost: a worker leaves the run, a
 * server's loss takes the run back to its last checkpoint. */
static void s_check_nodes(s_sched_t *self, double now)
{
    double limit = self->cfg->heartbeat_timeout;
    if (self->ph.phase == MQ_PH_REGISTERING) /* nobody beats before its WELCOME */
        return;
    uint32_t *silent = self->silent, n;
    int server = mq_mb_silent(&self->mb, now, limit, silent, &n);
    for (uint32_t k = 0; k < n && self->ph.phase != MQ_PH_DONE; k++) {
        char why[96];
        snprintf(why, sizeof why, "silent for %.1f s",
                 now - self->mb.workers[silent[k]].last_heard);
        s_lose_worker(self, silent[k], why);
    }
    if (server >= 0 && self->ph.phase != MQ_PH_DONE) { /* the workers' losses may have ended it */
        double quiet = now - self->mb.servers[server].last_heard;
        char fields[96];
        snprintf(fields, sizeof fields, "\"rank\":%d,\"silent_s\":%.1f", server, quiet);
        s_event(self, "server_lost", fields);
        s_recover(self, (uint32_t)server, quiet);
    }
}

static void s_tick(void *arg)
{
    s_sched_t *self = arg;
    const mq_scheduler_config_t *c = self->cfg;
    double now = mq_now_s();
    s_check_nodes(self, now);
    s_metrics_tick(self);
    mq_ph_due_t due = mq_ph_due(&self->ph, c, now, self->clock.t_issued);
    if (due == MQ_PD_START) {
        s_fail(self, "only %u/%ld workers and %u/%ld servers registered, %u ready, within %.0f s",
                 mq_mb_count(&self->mb, MQ_MB_FREE), c->workers, self->mb.nservers, c->servers,
                 mq_mb_count(&self->mb, MQ_MB_READY), c->start_timeout);
    } else if (due == MQ_PD_ROUND && !s_take_out_stuck(self, now)) {
        char missing[512];
        s_missing(self, missing, sizeof missing);
        s_fail(self, "iteration %llu did not complete within %.0f s (no report from workers %s)",
                 (unsigned long long)self->iter, c->iter_timeout, missing);
    } else if (due == MQ_PD_PAUSE) {
        s_fail(self, "paused for %.0f s with %u workers (--min-workers %ld): giving up",
                 now - self->ph.t_paused,
                 mq_mb_count(&self->mb, MQ_MB_ACTIVE) + mq_mb_count(&self->mb, MQ_MB_READY),
                 c->min_workers);
    }
    if (self->ph.phase != MQ_PH_DONE) {
        mq_msg_init(&self->out, MQ_MSG_HEARTBEAT);
        s_broadcast(self, true, true);
    }
}

/* $TERM: a run that had begun ends as interrupted (its files say so). */
static void s_term(void *arg)
{
    s_sched_t *self = arg;
    if (self->ph.phase != MQ_PH_DONE && self->ph.phase != MQ_PH_REGISTERING)
        s_finish(self, "interrupted", 0);
}

/* Opens the scheduler's sockets: 0, or 1 (with the error) when it cannot, or 2 when the run
 * directory already holds a run (a bad --run-dir, which exits as a bad flag). */
static int s_open(s_sched_t *self, mq_service_t *svc)
{
    const mq_scheduler_config_t *c = self->cfg;
    /* Said now, not once the cluster is complete: no node waits for a run that cannot be. */
    if (!c->resume && mq_sched_run_exists(self->run_dir)) /* the flag's fault: exit 2 */
        return mq_err_set("run directory %s already holds a run; pick another --run-dir, or "
                          "continue it with --resume", self->run_dir),
               2;
    if (!(self->sec = mq_sec_open(&c->sec, MQ_KEY_SCHEDULER)))
        return 1;
    svc->sec = self->sec;
    self->router = zsock_new(ZMQ_ROUTER);
    if (!self->router)
        return mq_err_set("cannot create a socket"), 1;
    mq_wire_prepare(self->router, 2000, MQ_WIRE_MAX_CONTROL_MSG);
    if (mq_sec_serve(self->sec, self->router, "the scheduler") != 0)
        return 1;
    if (mq_bind(self->router, c->bind, &svc->port) != 0)
        return 1;
    if (c->agent[0]) {
        self->agent = zsock_new(ZMQ_DEALER);
        mq_wire_prepare(self->agent, 0, MQ_WIRE_MAX_CONTROL_MSG);
        /* Never queue for an absent agent, never block on it. */
        zsock_set_immediate(self->agent, 1);
        zsock_set_sndtimeo(self->agent, 0);
        if (mq_sec_client(self->sec, self->agent, MQ_KEY_AGENT) != 0)
            return 1;
        if (zsock_connect(self->agent, "%s", c->agent) != 0) {
            mq_err_set("cannot connect to the agent at '%s'", c->agent);
            return 1;
        }
        self->agent_in = (mq_inbox_t){.on = &s_agent_handlers, .self = self, .msg = &self->in,
                                      .drops = &self->drops, .from = "agent", .from_len = 5};
        zloop_reader(self->loop, self->agent, mq_inbox_read, &self->agent_in);
    }
    self->router_in = (mq_inbox_t){.on = &s_router_handlers, .self = self, .msg = &self->in,
                                   .drops = &self->drops, .refuse = s_router_refusal};
    zloop_reader(self->loop, self->router, mq_inbox_read, &self->router_in);
    mq_info("listening on %s for %ld workers and %ld servers%s%s", c->bind, c->workers,
            c->servers, c->agent[0] ? "; agent at " : "; no agent, fixed bits",
            c->agent[0] ? c->agent : "");
    return 0;
}

static int s_start_service(void *arg, mq_service_t *svc)
{
    s_sched_t *self = arg;
    self->pipe = svc->pipe;
    self->loop = svc->loop;
    self->cfg = svc->cfg;
    svc->drops = &self->drops;
    /* Everything sized by the run: its worker ranks and its servers. */
    uint32_t w = (uint32_t)self->cfg->max_workers, s = (uint32_t)self->cfg->servers;
    if (mq_mb_init(&self->mb, w, s) != 0 || mq_round_init(&self->round, w, s) != 0 ||
        mq_cp_init(&self->cp, self->cfg->checkpoint_every, s) != 0 ||
        !(self->joined = calloc(w, sizeof *self->joined)) ||
        !(self->stuck = calloc(w, sizeof *self->stuck)) ||
        !(self->silent = calloc(w, sizeof *self->silent)) ||
        !(self->terms = calloc(w, sizeof *self->terms)) ||
        !(self->endpoints = calloc(s, sizeof *self->endpoints)) ||
        (self->cfg->metrics && !(self->m.w = calloc(w, sizeof *self->m.w)))) {
        self->ph.phase = MQ_PH_DONE;
        return mq_err_set("out of memory for a run of %u workers and %u servers", w, s), 1;
    }
    mq_hz_init(&self->hz, self->cfg);
    mq_sched_run_config(self->cfg, &self->run);
    self->clock.simulated = self->run.simulated_clock;
    self->external = strcmp(self->run.model, "external") == 0;
    self->has_layout =
        !self->external &&
        mq_model_layout_of(self->run.model, strcmp(self->run.dataset, "cifar10") == 0 ? 3 : 1,
                           &self->layout) == 0;
    self->bits = (int)self->cfg->bits;
    self->agent_link = MQ_AL_ANSWERING;
    self->agent_timer = -1;
    self->deadline_timer = -1;
    mq_sched_stragglers(self->cfg->stragglers, &self->round.policy, &self->round.value);
    mq_rec_init(&self->tot);
    mq_watch_opts_t wo;
    mq_watch_opts_default(&wo);
    wo.loss_factor = self->cfg->diverge_factor;
    wo.patience = self->cfg->diverge_patience;
    wo.spike_factor = self->cfg->guard_spike;
    wo.guard_iters = self->cfg->guard_iters;
    wo.guard_bits = (int)self->cfg->guard_bits;
    wo.max_bits = MQ_QUANT_MAX_BITS;
    wo.learn_within = self->cfg->learn_within;
    mq_watch_init(&self->watch, &wo);
    /* Until an agent names its policy, the run is what it does: fixed bits, or, for a codec
     * that takes no bit-width, the codec itself (and its update rule when not plain SGD). */
    self->codec = mq_codec_none();
    mq_sched_codec(self->cfg, &self->codec);
    if (self->run.fp32)
        snprintf(self->policy, sizeof self->policy, "none");
    else if (mq_codec_ops(&self->codec)->max_bits == 0) {
        bool sgd = strcmp(self->run.optimizer, "sgd") == 0;
        snprintf(self->policy, sizeof self->policy, "%.40s%s%.20s", self->run.codec,
                 sgd ? "" : "/", sgd ? "" : self->run.optimizer);
    }
    else if (!self->cfg->agent[0])
        snprintf(self->policy, sizeof self->policy, "fixed:%d", self->bits);
    snprintf(self->run_dir, sizeof self->run_dir, "%s", self->cfg->run_dir);
    mq_ph_init(&self->ph, mq_now_s());
    /* Names the run on every message, so a node of another run is told, not mixed in. */
    self->run_id = ((uint64_t)zclock_time() << 20) ^ ((uint64_t)getpid() << 4) ^
                   (uint64_t)(uintptr_t)self;
    if (!self->run_id)
        self->run_id = 1;
    mq_wire_set_run_id(self->run_id);
    mq_run_key_new(self->run_key);
    s_metrics_init(self);
    int rc = s_open(self, svc); /* 1: a port taken, keys unreadable; 2: a bad --run-dir */
    if (rc != 0)
        self->ph.phase = MQ_PH_DONE; /* never started */
    return rc;
}

static void s_stop(void *arg)
{
    s_sched_t *self = arg;
    mq_runlog_destroy(&self->log);
    zsock_destroy(&self->agent);
    mq_sec_unserve(self->sec, self->router);
    zsock_destroy(&self->router);
    mq_sec_close(&self->sec); /* after its sockets */
    mq_msg_free(&self->in);
    mq_msg_free(&self->out);
    mq_mb_destroy(&self->mb);
    mq_round_destroy(&self->round);
    mq_cp_destroy(&self->cp);
    free(self->joined), free(self->stuck), free(self->silent), free(self->terms);
    free(self->endpoints);
    free(self->m.w);
}

static const mq_service_ops_t s_ops = {.name = "scheduler",
                                       .size = sizeof(s_sched_t),
                                       .start = s_start_service,
                                       .term = s_term,
                                       .tick = s_tick,
                                       .stop = s_stop};

void mq_scheduler_actor(zsock_t *pipe, void *args)
{
    mq_service_actor(pipe, &s_ops, args);
}
