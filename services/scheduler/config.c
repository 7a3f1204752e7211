/* The scheduler's flags, their checks, and the run configuration it hands to nodes and writes
 * to config.json. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mqgrad/ps.h"
#include "mqgrad/quant.h"
#include "mqgrad/runlog.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/watch.h"
#include "mqgrad/wire.h"
#include "scheduler.h"
#include "scheduler_internal.h"

static void s_defaults(mq_scheduler_config_t *c)
{
    memset(c, 0, sizeof *c);
    mq_http_cfg_init(&c->http, 0);
    strcpy(c->bind, "tcp://*:7000");
    c->workers = 2;
    c->min_workers = 1;
    c->max_workers = 0; /* not given: max(--workers, 64) */
    c->heartbeat_timeout = 5;
    c->pause_timeout = 600;
    c->checkpoint_every = 100;
    strcpy(c->stragglers, "wait");
    c->servers = 1;
    strcpy(c->model, "paper");
    strcpy(c->dataset, "fashion-mnist");
    c->batch = 32;
    c->lr = 0.01;
    c->l2 = 1e-4;
    c->iterations = -1; /* not given: 200, or none when a time budget is given */
    c->eval_every = 100;
    c->eval_limit = 2000;
    c->final_eval_limit = -1;
    c->agent_deadline_ms = 200;
    c->bits = 2;
    strcpy(c->codec, "uniform");
    c->bucket = -1;
    strcpy(c->optimizer, "sgd");
    c->threshold = 100000;
    c->seed = 1;
    c->start_timeout = 120;
    c->iter_timeout = 600;
    c->progress_every = 2;
    mq_watch_opts_t w;
    mq_watch_opts_default(&w);
    c->diverge_factor = w.loss_factor;
    c->diverge_patience = w.patience;
    c->learn_within = w.learn_within;
    strcpy(c->on_divergence, "stop");
    strcpy(c->clock, "real");
    c->guard_spike = w.spike_factor;
    c->guard_iters = w.guard_iters;
    c->guard_bits = w.guard_bits;
}

int mq_sched_codec(const mq_scheduler_config_t *c, mq_codec_t *out)
{
    mq_codec_t k;
    if (mq_codec_parse(c->codec, &k) != 0)
        return -1;
    bool uniform = k.id == MQ_CODEC_ID_uniform;
    if ((c->bucket >= 0 || c->stochastic) && !uniform) {
        mq_err_set("--%s applies to the uniform codec only (codec is '%s'; give the codec's own "
                   "options in --codec)",
                   c->bucket >= 0 ? "bucket" : "stochastic", c->codec);
        return -1;
    }
    if (uniform && c->bucket >= 0)
        k.param[0] = (uint32_t)c->bucket;
    else if (uniform && !strstr(c->codec, "bucket="))
        k.param[0] = MQ_DEFAULT_BUCKET;
    if (c->stochastic)
        k.param[1] = 1;
    k.bits = k.id == MQ_CODEC_ID_none ? 32 : 0; /* the level is the controller's */
    *out = k;
    return 0;
}

static int s_check(const mq_scheduler_config_t *c)
{
    mq_codec_t k;
    mq_optim_t o;
    if (mq_sched_codec(c, &k) != 0) {
        fprintf(stderr, "mqgrad-scheduler: --codec: %s\n", mq_err_last());
        return 2;
    }
    if (mq_optim_parse(c->optimizer, &o) != 0) {
        fprintf(stderr, "mqgrad-scheduler: --optimizer: %s\n", mq_err_last());
        return 2;
    }
    char why[256];
    if (c->link[0] && c->link_mbps > 0) {
        fprintf(stderr, "mqgrad-scheduler: give --link or --link-mbps, not both\n");
        return 2;
    }
    if (c->link[0] && mq_link_spec_check(c->link, why, sizeof why) != 0) {
        fprintf(stderr, "mqgrad-scheduler: --link: %s\n", why);
        return 2;
    }
    if (c->error_feedback && mq_codec_state_floats(&k, 1024) > 0) {
        fprintf(stderr,
                "mqgrad-scheduler: --error-feedback: codec '%s' keeps its own residual\n",
                c->codec);
        return 2;
    }
    if (k.id != MQ_CODEC_ID_none && !mq_bits_ok(&k, (int)c->bits)) {
        fprintf(stderr, "mqgrad-scheduler: --bits %ld is outside the levels codec '%s' takes\n",
                c->bits, c->codec);
        return 2;
    }
    if (strcmp(c->model, "paper") != 0 && strcmp(c->model, "small") != 0 &&
        strcmp(c->model, "external") != 0) {
        fprintf(stderr, "mqgrad-scheduler: --model '%s' is not 'paper', 'small' or 'external'\n",
                c->model);
        return 2;
    }
    if (strcmp(c->dataset, "fashion-mnist") && strcmp(c->dataset, "mnist") &&
        strcmp(c->dataset, "cifar10")) {
        fprintf(stderr, "mqgrad-scheduler: --dataset '%s' is not fashion-mnist, mnist or cifar10\n",
                c->dataset);
        return 2;
    }
    if (strcmp(c->on_divergence, "stop") != 0 && strcmp(c->on_divergence, "continue") != 0) {
        fprintf(stderr, "mqgrad-scheduler: --on-divergence '%s' is not 'stop' or 'continue'\n",
                c->on_divergence);
        return 2;
    }
    if (strcmp(c->clock, "real") != 0 && strcmp(c->clock, "simulated") != 0) {
        fprintf(stderr, "mqgrad-scheduler: --clock '%s' is not 'real' or 'simulated'\n",
                c->clock);
        return 2;
    }
    if (c->iterations == 0 && c->time_budget <= 0) {
        fprintf(stderr, "mqgrad-scheduler: give --iterations or --time-budget (or both)\n");
        return 2;
    }
    return 0;
}

int mq_sched_stragglers(const char *spec, mq_stragglers_t *kind, double *value)
{
    char *end;
    *value = 0;
    if (strcmp(spec, "wait") == 0) {
        *kind = MQ_STRAGGLERS_WAIT;
        return 0;
    }
    if (strncmp(spec, "deadline:", 9) == 0) {
        *kind = MQ_STRAGGLERS_DEADLINE;
        *value = strtod(spec + 9, &end);
        if (end != spec + 9 && !*end && *value >= 0.01 && *value <= 86400)
            return 0;
    } else if (strncmp(spec, "first:", 6) == 0) {
        *kind = MQ_STRAGGLERS_FIRST;
        *value = strtod(spec + 6, &end);
        if (end != spec + 6 && !*end && *value >= 1 && *value <= MQ_FLAG_MAX_WORKERS &&
            *value == (double)(long)*value)
            return 0;
    }
    mq_err_set("--stragglers '%s': expected wait, deadline:SECONDS (0.01..86400) or first:N "
               "(N >= 1 workers)", spec);
    return -1;
}

int mq_scheduler_config_parse(mq_scheduler_config_t *c, int argc, char **argv)
{
    s_defaults(c);
    const mq_flag_t flags[] = {
        {"bind", "MQGRAD_SCHEDULER_BIND", MQ_FLAG_STR, c->bind, sizeof c->bind, 0, 0,
         "endpoint to bind"},
        {"workers", "MQGRAD_WORKERS", MQ_FLAG_LONG, &c->workers, 0, 1, MQ_FLAG_MAX_WORKERS,
         "workers to wait for before the first iteration (more may join later)"},
        {"min-workers", "MQGRAD_MIN_WORKERS", MQ_FLAG_LONG, &c->min_workers, 0, 1,
         MQ_FLAG_MAX_WORKERS, "below this many workers the run pauses (not fails) until some join"},
        {"max-workers", "MQGRAD_MAX_WORKERS", MQ_FLAG_LONG, &c->max_workers, 0, 1,
         MQ_FLAG_MAX_WORKERS, "workers the run takes at most; later ones are refused (default "
                         "max(--workers, 64))"},
        {"heartbeat-timeout", "MQGRAD_HEARTBEAT_TIMEOUT", MQ_FLAG_DOUBLE, &c->heartbeat_timeout,
         0, 1.5, 3600, "seconds of silence after which a node is lost (heartbeats every 0.5 s)"},
        {"resume", "MQGRAD_RESUME", MQ_FLAG_BOOL, &c->resume, 0, 0, 0,
         "if --run-dir holds an unfinished run, continue it from its last checkpoint (a run "
         "that is over: start a new one beside it)"},
        {"checkpoint-every", "MQGRAD_CHECKPOINT_EVERY", MQ_FLAG_LONG, &c->checkpoint_every, 0, 0,
         1000000000L, "iterations between checkpoints (servers need --checkpoint-dir; 0 = none)"},
        {"stragglers", "MQGRAD_STRAGGLERS", MQ_FLAG_STR, c->stragglers, sizeof c->stragglers, 0,
         0, "wait (for every member) | deadline:SECONDS (close the round then, without the "
            "late) | first:N (close it with the first N members, backup workers)"},
        {"pause-timeout", "MQGRAD_PAUSE_TIMEOUT", MQ_FLAG_DOUBLE, &c->pause_timeout, 0, 1, 86400,
         "seconds the run may stay paused below --min-workers before it fails"},
        {"servers", "MQGRAD_SERVERS", MQ_FLAG_LONG, &c->servers, 0, 1, MQ_FLAG_MAX_SERVERS,
         "servers expected"},
        {"model", "MQGRAD_MODEL", MQ_FLAG_STR, c->model, sizeof c->model, 0, 0,
         "paper | small (the built-in networks) | external (the workers' own model: its layout "
         "and starting values come from the first libmqgrad worker)"},
        {"dataset", "MQGRAD_DATASET", MQ_FLAG_STR, c->dataset, sizeof c->dataset, 0, 0,
         "fashion-mnist | mnist | cifar10"},
        {"batch", "MQGRAD_BATCH", MQ_FLAG_LONG, &c->batch, 0, 1, 4096, "batch per worker"},
        {"lr", "MQGRAD_LR", MQ_FLAG_DOUBLE, &c->lr, 0, 1e-9, 100, "learning rate"},
        {"lr-decay", "MQGRAD_LR_DECAY", MQ_FLAG_DOUBLE, &c->lr_decay, 0, 0, 1,
         "decay lr linearly to 0 over this last fraction of the run (0 = constant)"},
        {"l2", "MQGRAD_L2", MQ_FLAG_DOUBLE, &c->l2, 0, 0, 10, "L2 on the big FC weights"},
        {"iterations", "MQGRAD_ITERATIONS", MQ_FLAG_LONG, &c->iterations, 0, 0, 1000000000L,
         "iterations (0 = until the time budget; default 200, or 0 with --time-budget)"},
        {"time-budget", "MQGRAD_TIME_BUDGET", MQ_FLAG_DOUBLE, &c->time_budget, 0, 0, 1e7,
         "seconds of training time (0 = none)"},
        {"eval-every", "MQGRAD_EVAL_EVERY", MQ_FLAG_LONG, &c->eval_every, 0, 0, 1000000000L,
         "evaluate every N iterations (0 = at the end only)"},
        {"eval-limit", "MQGRAD_EVAL_LIMIT", MQ_FLAG_LONG, &c->eval_limit, 0, 0, 10000000,
         "test examples per evaluation (0 = all)"},
        {"final-eval-limit", "MQGRAD_FINAL_EVAL_LIMIT", MQ_FLAG_LONG, &c->final_eval_limit, 0, -1,
         10000000, "test examples for the last evaluation (0 = all, -1 = --eval-limit)"},
        {"agent", "MQGRAD_AGENT", MQ_FLAG_STR, c->agent, sizeof c->agent, 0, 0,
         "agent endpoint (empty = bits stay at --bits)"},
        {"agent-deadline-ms", "MQGRAD_AGENT_DEADLINE_MS", MQ_FLAG_DOUBLE, &c->agent_deadline_ms,
         0, 1, 60000, "how long to wait for a decision"},
        {"bits", "MQGRAD_BITS", MQ_FLAG_LONG, &c->bits, 0, MQ_QUANT_MIN_BITS, MQ_QUANT_MAX_BITS,
         "bits until the agent decides"},
        {"codec", "MQGRAD_CODEC", MQ_FLAG_STR, c->codec, sizeof c->codec, 0, 0,
         "codec of the big tensors (listed above; none = fp32)"},
        {"bucket", "MQGRAD_BUCKET", MQ_FLAG_LONG, &c->bucket, 0, -1, 1L << 30,
         "uniform: values per range (0 = one per tensor slice: the paper-exact codec; "
         "default 512)"},
        {"stochastic", "MQGRAD_STOCHASTIC", MQ_FLAG_BOOL, &c->stochastic, 0, 0, 0,
         "uniform: stochastic rounding"},
        {"optimizer", "MQGRAD_OPTIMIZER", MQ_FLAG_STR, c->optimizer, sizeof c->optimizer, 0, 0,
         "update rule every node applies to the aggregate (listed above)"},
        {"error-feedback", "MQGRAD_ERROR_FEEDBACK", MQ_FLAG_BOOL, &c->error_feedback, 0, 0, 0,
         "accumulate quantization residuals on workers"},
        {"threshold", "MQGRAD_QUANT_THRESHOLD", MQ_FLAG_LONG, &c->threshold, 0, 0, 1L << 40,
         "tensors smaller than this travel as fp32"},
        {"link-mbps", "MQGRAD_LINK_MBPS", MQ_FLAG_DOUBLE, &c->link_mbps, 0, 0, 1e6,
         "emulated NIC speed of every node in Mbit/s (0 = off)"},
        {"link", "MQGRAD_LINK", MQ_FLAG_STR, c->link, sizeof c->link, 0, 0,
         "emulated NICs' rates over the run's time, per role or rank, instead of --link-mbps: "
         "'80@0,10000@30/60' (a square wave), '1000@0,300@60,80@120', '1000;worker:0=80', "
         "'1000;server=200' (docs/operations.md, Link schedules)"},
        {"clock", "MQGRAD_CLOCK", MQ_FLAG_STR, c->clock, sizeof c->clock, 0, 0,
         "real (links sleep) | simulated (link time computed, compute charged as CPU time)"},
        {"seed", "MQGRAD_SEED", MQ_FLAG_LONG, &c->seed, 0, 0, 1L << 62, "seed"},
        {"run-dir", "MQGRAD_RUN_DIR", MQ_FLAG_STR, c->run_dir, sizeof c->run_dir, 0, 0,
         "run directory (default runs/cluster-<time>)"},
        {"start-timeout", "MQGRAD_START_TIMEOUT", MQ_FLAG_DOUBLE, &c->start_timeout, 0, 1, 86400,
         "seconds to wait for every node to register"},
        {"iter-timeout", "MQGRAD_ITER_TIMEOUT", MQ_FLAG_DOUBLE, &c->iter_timeout, 0, 1, 86400,
         "seconds one iteration may take"},
        {"progress-every", "MQGRAD_PROGRESS_EVERY", MQ_FLAG_DOUBLE, &c->progress_every, 0, 0,
         86400, "seconds between progress lines (0 = none)"},
        {"diverge-factor", "MQGRAD_DIVERGE_FACTOR", MQ_FLAG_DOUBLE, &c->diverge_factor, 0, 0, 1e6,
         "diverged when the smoothed loss stays above this x its best (0 = rule off)"},
        {"diverge-patience", "MQGRAD_DIVERGE_PATIENCE", MQ_FLAG_LONG, &c->diverge_patience, 0, 1,
         1000000000L, "... for this many iterations"},
        {"learn-within", "MQGRAD_LEARN_WITHIN", MQ_FLAG_LONG, &c->learn_within, 0, 0,
         1000000000L,
         "a run of at least this many iterations that ends at chance accuracy, or under 2x "
         "chance with its loss not 5% down, did not learn: it ends diverged (0 = rules off)"},
        {"on-divergence", "MQGRAD_ON_DIVERGENCE", MQ_FLAG_STR, c->on_divergence,
         sizeof c->on_divergence, 0, 0, "stop | continue (the status stays diverged)"},
        {"guard-spike", "MQGRAD_GUARD_SPIKE", MQ_FLAG_DOUBLE, &c->guard_spike, 0, 0, 1e6,
         "raise the bits when a loss exceeds this x the smoothed loss (0 = guard off)"},
        {"guard-iters", "MQGRAD_GUARD_ITERS", MQ_FLAG_LONG, &c->guard_iters, 0, 1, 1000000000L,
         "iterations the raised bits hold"},
        {"guard-bits", "MQGRAD_GUARD_BITS", MQ_FLAG_LONG, &c->guard_bits, 0, 1, MQ_QUANT_MAX_BITS,
         "bits the guard adds"},
        MQ_SEC_FLAGS(&c->sec),
        MQ_HTTP_FLAGS(&c->http),
        {0},
    };
    char codecs[2048], rules[1024], usage[3300];
    mq_codec_help(codecs, sizeof codecs);
    mq_optim_help(rules, sizeof rules);
    snprintf(usage, sizeof usage,
             "usage: mqgrad-scheduler [flags]\n\ncodecs (--codec; K, the bit-width, comes from the "
             "agent):\n%s\nupdate rules (--optimizer):\n%s",
             codecs, rules);
    int rc = mq_flags_parse(flags, argc, argv, usage, NULL, 0, NULL);
    /* A time budget alone means "train for that long": no iteration cap behind the user's
     * back. */
    if (rc == 0 && c->iterations < 0)
        c->iterations = c->time_budget > 0 ? 0 : 200;
    mq_stragglers_t kind;
    double value;
    if (rc == 0 && mq_sched_stragglers(c->stragglers, &kind, &value) != 0) {
        fprintf(stderr, "mqgrad-scheduler: %s\n", mq_err_last());
        rc = 2;
    }
    if (rc == 0 && c->max_workers == 0)
        c->max_workers = c->workers > 64 ? c->workers : 64;
    if (rc == 0 && (c->workers > c->max_workers || c->min_workers > c->max_workers)) {
        fprintf(stderr, "mqgrad-scheduler: --workers %ld and --min-workers %ld must not exceed "
                        "--max-workers %ld\n",
                c->workers, c->min_workers, c->max_workers);
        rc = 2;
    }
    if (rc == 0)
        rc = s_check(c);
    if (rc == 0)
        rc = mq_sec_config_check(&c->sec, "mqgrad-scheduler");
    if (rc == 0 && !c->run_dir[0])
        mq_default_run_dir("cluster", c->run_dir, sizeof c->run_dir);
    return rc;
}

void mq_sched_run_config(const mq_scheduler_config_t *c, mq_run_config_t *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->model, sizeof r->model, "%s", c->model);
    snprintf(r->dataset, sizeof r->dataset, "%s", c->dataset);
    r->batch = (uint32_t)c->batch;
    r->seed = (uint64_t)c->seed;
    r->l2 = (float)c->l2;
    r->workers = (uint32_t)c->max_workers; /* the rank space: nodes size their tables by it */
    r->min_workers = (uint32_t)c->min_workers;
    r->report_pushes = strcmp(c->stragglers, "wait") != 0;
    r->servers = (uint32_t)c->servers;
    r->quant_threshold = (uint64_t)c->threshold;
    mq_codec_t k = mq_codec_none();
    mq_sched_codec(c, &k); /* checked when the flags were parsed */
    mq_codec_format(&k, r->codec, sizeof r->codec);
    snprintf(r->optimizer, sizeof r->optimizer, "%s", c->optimizer);
    r->error_feedback = c->error_feedback;
    r->link_mbps = c->link_mbps;
    snprintf(r->link, sizeof r->link, "%s", c->link);
    r->simulated_clock = strcmp(c->clock, "simulated") == 0;
    r->fp32 = k.id == MQ_CODEC_ID_none;
    r->eval_limit = (uint32_t)c->eval_limit;
}

int mq_sched_config_json(const mq_scheduler_config_t *c, char *buf, size_t len)
{
    char agent[512], spec[MQ_CODEC_MAX_SPEC] = "none";
    mq_json_escape(c->agent, agent, sizeof agent);
    mq_codec_t k = mq_codec_none();
    mq_sched_codec(c, &k);
    mq_codec_format(&k, spec, sizeof spec);
    const mq_codec_ops_t *ops = mq_codec_ops(&k);
    bool uniform = k.id == MQ_CODEC_ID_uniform;
    int n = snprintf(
        buf, len,
        "{\"model\":\"%s\",\"dataset\":\"%s\",\"workers\":%ld,\"min_workers\":%ld,"
        "\"max_workers\":%ld,\"heartbeat_timeout_s\":%g,\"servers\":%ld,\"batch\":%ld,"
        "\"lr\":%.9g,\"lr_decay\":%g,\"l2\":%.9g,\"iterations\":%ld,\"time_budget_s\":%g,\"eval_every\":%ld,"
        "\"eval_limit\":%ld,\"agent\":\"%s\",\"agent_deadline_ms\":%g,\"initial_bits\":%ld,"
        "\"codec\":\"%s\",\"codec_spec\":\"%s\",\"optimizer\":\"%s\",\"bucket\":%ld,"
        "\"stochastic\":%s,\"error_feedback\":%s,"
        "\"quant_threshold\":%ld,\"link_mbps\":%g,\"link\":\"%s\",\"clock\":\"%s\",\"seed\":%ld,\"final_eval_limit\":%ld,"
        "\"diverge_factor\":%g,\"diverge_patience\":%ld,\"learn_within\":%ld,\"on_divergence\":\"%s\","
        "\"guard_spike\":%g,\"guard_iters\":%ld,\"guard_bits\":%ld,\"stragglers\":\"%s\","
        "\"checkpoint_every\":%ld}",
        c->model, c->dataset, c->workers, c->min_workers, c->max_workers, c->heartbeat_timeout,
        c->servers, c->batch, c->lr, c->lr_decay, c->l2,
        c->iterations, c->time_budget, c->eval_every, c->eval_limit, agent, c->agent_deadline_ms, c->bits,
        ops ? ops->name : "none", spec, c->optimizer, uniform ? (long)k.param[0] : 0L,
        uniform && k.param[1] ? "true" : "false",
        c->error_feedback ? "true" : "false", c->threshold, c->link_mbps, c->link, c->clock, c->seed,
        c->final_eval_limit < 0 ? c->eval_limit : c->final_eval_limit, c->diverge_factor,
        c->diverge_patience, c->learn_within, c->on_divergence, c->guard_spike, c->guard_iters, c->guard_bits,
        c->stragglers, c->checkpoint_every);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

double mq_sched_lr(const mq_scheduler_config_t *c, double progress)
{
    double left = 1 - progress;
    if (c->lr_decay <= 0 || left >= c->lr_decay)
        return c->lr;
    double lr = c->lr * left / c->lr_decay;
    return lr > c->lr * 1e-3 ? lr : c->lr * 1e-3; /* the wire refuses a zero rate */
}
