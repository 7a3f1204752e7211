/* What every mqgrad program shares: table-driven flags whose defaults come from MQGRAD_*
 * environment variables, and the main loop that runs a service actor until it finishes or a
 * signal arrives. */
#ifndef MQGRAD_SERVICE_H
#define MQGRAD_SERVICE_H

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>

#include "mqgrad/security.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes every service shares (docs/operations.md, "Failures and elasticity"): 0 the run is over
 * (completed, or stopped), 1 a failure, 2 a bad flag, 3 the run diverged (mqgrad/watch.h),
 * 4 the scheduler refused this node (no free rank, the run is another one, it was taken
 * out of the run): restarting it as it is will not help. */
#define MQ_EXIT_REFUSED 4
/* Not an exit code: an actor reports it to mq_service_run, which starts the service afresh
 * (a node whose scheduler restarted, or took it out of the run, registers again). */
#define MQ_EXIT_REJOIN 75

typedef enum { MQ_FLAG_STR, MQ_FLAG_LONG, MQ_FLAG_INT, MQ_FLAG_DOUBLE, MQ_FLAG_BOOL } mq_flag_kind_t;

/* One flag: --NAME VALUE (or --NAME=VALUE; a BOOL takes no value). ENV, when set, names the
 * variable whose value replaces the compiled-in default already stored in DST. STR flags
 * write at most LEN bytes (NUL included) into the char array DST; LONG into long, INT into
 * int, DOUBLE into double, BOOL into bool. Numbers must lie in [LO, HI]; a STR flag with LO = 1 refuses
 * an empty value on the command line (an empty environment variable counts as unset). */
typedef struct {
    const char *name;
    const char *env;
    mq_flag_kind_t kind;
    void *dst;
    size_t len;
    double lo, hi;
    const char *help;
} mq_flag_t;

/* Applies environment defaults, then ARGV (argv[0] is the program or subcommand name).
 * FLAGS ends with a zeroed entry. Returns 0 on success, 1 if --help was printed, and 2 after
 * printing a specific message to stderr for a bad flag or value (the exit code to use).
 * Positional arguments are not allowed unless POSITIONAL is given: then they are stored
 * there (up to MAXPOS; *npos set). */
int mq_flags_parse(const mq_flag_t *flags, int argc, char **argv, const char *usage,
                   char **positional, int maxpos, int *npos);
void mq_flags_usage(const mq_flag_t *flags, const char *usage, FILE *out);

/* Blocks SIGINT and SIGTERM in the calling thread and every thread started after it, and
 * turns off CZMQ's own handlers. Call it first in main: a signal then never interrupts a
 * shutdown half-way or kills a service before it is ready; mq_service_signalled polls. */
void mq_service_block_signals(void);
/* True if SIGINT or SIGTERM is pending (and consumes it). Needs mq_service_block_signals. */
bool mq_service_signalled(void);

/* Runs ACTOR_FN(pipe, ARGS) as a service: waits until the actor reports "DONE <code>" on its
 * pipe or SIGINT/SIGTERM arrives (then the actor gets $TERM and shuts down cleanly), and
 * returns the exit code (0 after a signal). "DONE 75" (MQ_EXIT_REJOIN) starts a fresh actor
 * instead, after a short pause. */
int mq_service_run(zactor_fn *actor_fn, void *args);
/* With MQGRAD_LINGER=1 in the environment, an actor's "DONE 0" (the run is over) does not end
 * the process: the actor keeps running (the scheduler refuses new nodes, "the run is over";
 * every service answers PING and serves /metrics) until SIGINT/SIGTERM, then exit 0. For
 * orchestrators that restart a container whatever its exit code (Kubernetes Deployments and
 * StatefulSets), which would otherwise start the run again. */

/* ---- the skeleton every service's actor runs on --------------------------------------
 *
 * A service is its state (SIZE bytes) and the operations below; mq_service_actor owns the
 * rest, the same for the scheduler, the servers, the workers and the agent:
 *   - the state, allocated zeroed and checked, freed last;
 *   - the log tag, the event loop, and its once-a-second tick;
 *   - the pipe: PORT (svc.port), DROPS (*svc.drops, with svc.sec's refusals) and $TERM
 *     (ops.term, then the loop ends) are answered here, any other command goes to
 *     ops.command;
 *   - the start: ops.start opens what the service needs (sockets, files, its readers and
 *     timers on svc.loop) before the pipe is signalled, so the owner's zactor_new returns
 *     with it done; a start that fails (an exit code, with mq_err_set) is logged as
 *     "cannot start: <why>", reported as DONE <code> <why>, and nothing of the service runs
 *     (only PORT, DROPS and $TERM are answered);
 *   - the teardown, in one order: ops.stop (the service closes what it opened, in reverse,
 *     whatever start got to), the loop, the state, the thread's wire buffers;
 *   - a loop that ends without $TERM (a handler returned -1) reports DONE 1.
 * During the run the service reports its own end (mq_service_done, mq_node_finish). */
typedef struct {
    zsock_t *pipe;
    zloop_t *loop;
    void *cfg;  /* the actor's arguments */
    void *self; /* the service's state */
    int port;   /* what PORT answers: the service's bound port, once start knows it */
    const mq_drops_t *drops; /* what DROPS answers (NULL: nothing dropped yet) */
    const mq_sec_t *sec;     /* whose refusals DROPS adds (NULL: none) */
} mq_service_t;

typedef struct {
    const char *name; /* the log tag: "scheduler", "server", "worker", "agent" */
    size_t size;      /* of the service's state */
    /* 0, or the exit code (1 a failure, 2 a bad flag or file, MQ_EXIT_REFUSED) after
     * mq_err_set. SELF is zeroed but for what the service sets here. */
    int (*start)(void *self, mq_service_t *svc);
    /* Optional: a pipe command of the service's own, REST the message's other frames
     * (owned by the skeleton). -1 ends the loop. */
    int (*command)(void *self, const char *cmd, zmsg_t *rest);
    void (*term)(void *self); /* optional: $TERM came, the loop ends after it */
    void (*tick)(void *self); /* optional: every second while the loop runs */
    void (*stop)(void *self); /* releases what start opened; after every start */
} mq_service_ops_t;

/* Runs the service OPS with the arguments CFG as the body of a CZMQ actor on PIPE: a
 * service's zactor_fn is `mq_service_actor(pipe, &its_ops, args)`. */
void mq_service_actor(zsock_t *pipe, const mq_service_ops_t *ops, void *cfg);

/* For actors: tell the owner the service is over with exit CODE. */
void mq_service_done(zsock_t *pipe, int code);
/* The same with the reason, "DONE <code> <why>" (a caller of the worker library shows it). */
void mq_service_done_why(zsock_t *pipe, int code, const char *why);

#ifdef __cplusplus
}
#endif
#endif
