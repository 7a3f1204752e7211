/* mqgrad-scheduler: membership (registration, ranks), the iteration barrier, the run clock,
 * evaluation, the link to the bit-width agent, and the run directory. It holds the run's
 * configuration and hands it to every node in WELCOME. */
#ifndef MQGRAD_SCHEDULER_H
#define MQGRAD_SCHEDULER_H

#include <czmq.h>
#include <stdbool.h>

#include "mqgrad/http.h"
#include "mqgrad/optim.h"
#include "mqgrad/quant.h"
#include "mqgrad/security.h"
#include "mqgrad/watch.h"

/* Values per quantization range by default. One range per tensor slice (bucket 0, the paper's
 * exact codec) kills the paper model at 2 bits within ~100 iterations; ranges per 512 values
 * train at every width for 8 more bits per 512 values (docs/codec-sweep.md). */
#define MQ_DEFAULT_BUCKET 512

typedef struct {
    char bind[256];
    long workers, servers; /* workers: how many the first iteration waits for */
    long min_workers;      /* below it the run pauses */
    long max_workers;      /* the rank space; registrations beyond it are refused */
    double heartbeat_timeout; /* seconds of silence after which a node is lost */
    double pause_timeout;  /* seconds the run may stay paused before it fails */
    bool resume;           /* continue the unfinished run in run_dir from its last checkpoint */
    char stragglers[32];   /* wait | deadline:SECONDS | first:N (mq_sched_stragglers) */
    long checkpoint_every; /* iterations between consistent checkpoints, 0 = none */
    char model[16], dataset[16];
    long batch;
    double lr, l2;
    double lr_decay;      /* fraction of the run at its end over which lr decays to 0; 0 = none */
    long iterations;      /* 0 = no limit (then a time budget is needed); when not given, 200
                           * without a time budget and 0 with one */
    double time_budget;   /* seconds of training time, evaluation excluded; 0 = none */
    long eval_every;      /* iterations; 0 = only at the end */
    long eval_limit;      /* test examples evaluated, 0 = all */
    long final_eval_limit; /* the same for the run's last evaluation; -1 = eval_limit */
    char agent[256];      /* agent endpoint; empty = no agent, bits stay at --bits */
    double agent_deadline_ms;
    long bits;            /* bits until the agent says otherwise */
    char codec[MQ_CODEC_MAX_SPEC]; /* codec spec (mqgrad/quant.h); none = fp32 everywhere */
    long bucket;          /* uniform's values per range, -1 = the spec's (or the default) */
    bool stochastic, error_feedback;
    char optimizer[MQ_OPTIM_MAX_SPEC]; /* update rule (mqgrad/optim.h) */
    long threshold;       /* tensors with fewer elements travel as fp32 */
    double link_mbps;     /* NIC emulation on every node, 0 = off */
    char link[MQ_LINK_MAX_SPEC]; /* the links' schedules (mqgrad/ps.h); "" = link_mbps */
    char clock[16];       /* real | simulated: the clock of links and compute (mqgrad/ps.h) */
    long seed;
    char run_dir[512];
    double start_timeout, iter_timeout;
    double progress_every; /* seconds between progress lines, 0 = none */
    /* the run's health (mqgrad/watch.h) */
    double diverge_factor; /* loss rule: multiple of the best smoothed loss, 0 = off */
    long diverge_patience; /* loss rule: iterations above it */
    long learn_within;     /* chance, flat rules: a run this long must have learned, 0 = off */
    char on_divergence[16]; /* stop | continue */
    double guard_spike;    /* spike guard: loss / smoothed loss that fires it, 0 = off */
    long guard_iters, guard_bits;
    mq_sec_config_t sec; /* keys (mqgrad/security.h) */
    mq_http_cfg_t http;  /* /metrics (mqgrad/http.h) */
    mq_metrics_t *metrics; /* the registry main serves, or NULL: no metrics */
} mq_scheduler_config_t;

/* The run's codec: --codec with the --bucket and --stochastic shorthands applied (uniform's
 * bucket defaults to MQ_DEFAULT_BUCKET when neither the spec nor --bucket sets it). -1 with
 * an error on a bad spec or a shorthand the codec does not take. */
int mq_sched_codec(const mq_scheduler_config_t *c, mq_codec_t *out);

/* The straggler policy (docs/operations.md, "Failures and elasticity"): WAIT for every member's push (up
 * to --iter-timeout), close the round after a DEADLINE (seconds from its start) with the
 * members whose pushes every server holds by then, or with the FIRST N members to have them
 * everywhere (backup workers). Members cut from a round stay in the run. */
typedef enum { MQ_STRAGGLERS_WAIT, MQ_STRAGGLERS_DEADLINE, MQ_STRAGGLERS_FIRST } mq_stragglers_t;
/* Parses SPEC; -1 with an error for a bad one. */
int mq_sched_stragglers(const char *spec, mq_stragglers_t *kind, double *value);

/* Fills CFG from defaults, MQGRAD_* variables and ARGV. Returns 0, 1 (help) or 2 (bad). */
int mq_scheduler_config_parse(mq_scheduler_config_t *cfg, int argc, char **argv);

/* The scheduler as a CZMQ actor; ARGS is a mq_scheduler_config_t that outlives it. Pipe
 * commands: "PORT" → bound port; $TERM (an interrupted run is recorded and every node told
 * to stop). Reports "DONE <code>": 0 when the run completed, 1 when it failed,
 * MQ_EXIT_DIVERGED when it diverged (mqgrad/watch.h says when). */
void mq_scheduler_actor(zsock_t *pipe, void *args);

#endif
