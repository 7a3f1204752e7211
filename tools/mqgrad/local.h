/* `mqgrad local`: the whole cluster as separate processes on this machine, over TCP loopback.
 * Shared with `mqgrad experiment`, which runs it once per method and seed. */
#ifndef MQGRAD_LOCAL_H
#define MQGRAD_LOCAL_H

#include <stdbool.h>

typedef struct {
    long workers, servers;
    char policy[64];    /* agent policy spec, or "none" for fp32 without an agent */
    char run_dir[512];
    char bin_dir[512];  /* where the mqgrad-* executables are; empty = find them */
    /* forwarded to the scheduler when non-empty */
    char model[16], dataset[16], iterations[24], time_budget[24], eval_every[24],
        eval_limit[24], batch[24], lr[24], seed[24], link_mbps[24], bucket[24], threshold[24],
        agent_args[256], final_eval_limit[24], diverge_factor[24], diverge_patience[24], learn_within[24],
        on_divergence[16], guard_spike[24], guard_iters[24], guard_bits[8], progress_every[24],
        lr_decay[24], codec[128], optimizer[64], clock[16], min_workers[24],
        heartbeat_timeout[24], link[256];
    long restarts;      /* times a worker that dies is started again (each worker) */
    char resume[512];   /* --resume RUN_DIR: continue that run (its flags come from local.args) */
    char checkpoint_every[24], stragglers[32];
    bool stochastic, error_feedback;
    /* forwarded to the workers */
    char data_dir[512], threads[8];
    char worker_exec[1024]; /* a program on libmqgrad to run as each worker (sh -c), or "" */
    bool quiet;         /* no progress lines (experiment prints its own) */
    bool insecure;      /* every service --insecure; else throw-away keys in RUN/keys */
    long http_port;     /* the scheduler's /metrics port; the others get free ones (0: none) */
} mq_local_opts_t;

/* Defaults, then MQGRAD_* variables, then ARGV. Returns 0, 1 (help) or 2 (bad usage). */
int mq_local_parse(mq_local_opts_t *o, int argc, char **argv);

/* Checks every flag each service of the run would be started with, with that service's own
 * parser, and that the data set is there, before anything starts or is written: 0, or 2
 * after a message naming the flag, its value and what is allowed. mq_local_run does it
 * first; `mqgrad experiment` does it for every run before the first starts. */
int mq_local_check(const mq_local_opts_t *o);

/* Runs the cluster until the run ends, a process fails, or SIGINT/SIGTERM. A worker that dies
 * is not a failure: the scheduler takes it out of the run, and it is started again (at most
 * --restarts times) to join. Returns 0 when the run completed, 3 (MQ_EXIT_DIVERGED) when it
 * diverged, 1 when a service failed (which one is printed), 130 when interrupted. ARGC and
 * ARGV are the flags, remembered in RUN/local.args for --resume (NULL when none). Returns 2,
 * having started nothing and written nothing, when mq_local_check refuses the flags. Every
 * end writes RUN/summary.json with the status and, unless the run completed, the reason. */
int mq_local_run(const mq_local_opts_t *o, int argc, char **argv);

#endif
