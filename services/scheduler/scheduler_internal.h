/* Shared between the scheduler's files; not part of its interface. */
#ifndef MQGRAD_SCHEDULER_INTERNAL_H
#define MQGRAD_SCHEDULER_INTERNAL_H

#include "mqgrad/ps.h"
#include "mqgrad/wire.h"
#include "scheduler.h"

/* The configuration every node receives in WELCOME. */
void mq_sched_run_config(const mq_scheduler_config_t *c, mq_run_config_t *r);
/* The learning rate at PROGRESS (0..1) of the run: --lr, decaying linearly towards zero over
 * the last --lr-decay fraction (0 = constant; never below lr / 1000, as a zero rate would be
 * refused). A warm-down takes the noise of the last iterate out of the final accuracy. */
double mq_sched_lr(const mq_scheduler_config_t *c, double progress);
/* config.json's content. */
int mq_sched_config_json(const mq_scheduler_config_t *c, char *buf, size_t len);

/* ---- checkpoints and resume (resume.c) ---------------------------------------------------- */

/* The scheduler's part of a consistent checkpoint: its state at the start of iteration
 * `iter`, written as RUN/checkpoint.json once every server has written its shard of that
 * iteration. */
typedef struct {
    uint64_t iter, cursor, lineage;
    uint32_t servers;
    char model[16];
    int bits;
    double train_time_s, wall_time_s;
    uint64_t bytes_up, bytes_down, fallbacks;
    double last_acc, acc_iter, last_loss, last_sparsity; /* NaN: none yet */
    double smoothed, best, best_acc, first_loss;         /* the divergence watch */
    uint64_t seen;
    char policy[64];
} mq_sched_ckpt_t;

/* Writes RUN_DIR/checkpoint.json atomically. 0, or -1 with an error. */
int mq_sched_ckpt_write(const char *run_dir, const mq_sched_ckpt_t *c);
/* Reads it: 0, 1 when there is none, -1 with an error naming what is wrong. */
int mq_sched_ckpt_read(const char *run_dir, mq_sched_ckpt_t *c);
/* Whether RUN_DIR holds a run (config.json), and whether that run is over for good (its
 * summary says completed or diverged): then --resume starts a new run beside it. */
bool mq_sched_run_exists(const char *run_dir);
bool mq_sched_run_finished(const char *run_dir);
/* The first of DIR-2, DIR-3, ... that holds no run, into OUT. */
int mq_sched_next_dir(const char *dir, char *out, size_t len);

/* ---- the link to the agent (agent_link.c) -------------------------------------------------
 * After each recorded iteration the scheduler tells the agent (OBSERVE) and waits at most a
 * deadline for its decision on the next; an agent that misses one is not waited for again
 * until it answers, so training never stalls on it (the last bits are reused, each miss
 * counted). Without sockets: the actor feeds the events and carries out the actions.
 *
 *   ANSWERING  OBSERVED: -> WAITING, wait.  OBSERVED_LAST: next.  UNREACHABLE: -> SILENT,
 *              missed, lost, next.  DECISION_DUE, DECISION: take.  DEADLINE, RESET: nothing.
 *   WAITING    DECISION_DUE: -> ANSWERING, take, cancel, next.  DECISION: take (still
 *              waiting).  DEADLINE: -> SILENT, missed, lost, next.  RESET: -> ANSWERING,
 *              cancel.  OBSERVED, OBSERVED_LAST, UNREACHABLE: none (one wait at a time).
 *   SILENT     OBSERVED, OBSERVED_LAST: next (told, not waited for).  UNREACHABLE: missed,
 *              next.  DECISION_DUE, DECISION: -> ANSWERING, take, back.  DEADLINE, RESET:
 *              nothing.
 *
 * OBSERVED: the observation went out; OBSERVED_LAST: it went out for the run's last iteration
 * (nothing to wait for); UNREACHABLE: it could not be sent; DECISION_DUE: the decision on the
 * iteration the scheduler waits to issue; DECISION: any other (late, or unasked); DEADLINE:
 * the wait's timer fired; RESET: the run rolled back (a server was lost). */
typedef enum { MQ_AL_ANSWERING, MQ_AL_WAITING, MQ_AL_SILENT, MQ_AL_NSTATES } mq_al_state_t;
typedef enum {
    MQ_AL_OBSERVED,
    MQ_AL_OBSERVED_LAST,
    MQ_AL_UNREACHABLE,
    MQ_AL_DECISION_DUE,
    MQ_AL_DECISION,
    MQ_AL_DEADLINE,
    MQ_AL_RESET,
    MQ_AL_NEVENTS
} mq_al_event_t;
enum {
    MQ_AL_WAIT = 1 << 0,   /* start the deadline's timer */
    MQ_AL_CANCEL = 1 << 1, /* end it */
    MQ_AL_NEXT = 1 << 2,   /* go on to the next iteration */
    MQ_AL_MISSED = 1 << 3, /* count a fallback: the last bits are reused */
    MQ_AL_LOST = 1 << 4,   /* the agent stopped answering: say so, once */
    MQ_AL_TAKE = 1 << 5,   /* apply the decision */
    MQ_AL_BACK = 1 << 6,   /* the agent answers again: say so */
};

/* Moves *STATE by EVENT and sets *ACTIONS (MQ_AL_* bits). -1 with an error, *STATE unchanged
 * and no actions, for an event the table has no cell for in that state. */
int mq_al_step(mq_al_state_t *state, mq_al_event_t event, unsigned *actions);
const char *mq_al_state_name(mq_al_state_t s);
const char *mq_al_event_name(mq_al_event_t e);
/* A decision's levels into OUT: bits in the controllers' range and, when it has per-tensor
 * levels, one in that range per tensor of a layout of LAYOUT_TENSORS (0: none known). The
 * drop's reason, with WHY, when not. */
mq_drop_t mq_al_decision(const mq_status_msg_t *d, uint32_t layout_tensors, mq_widths_t *out,
                         const char **why);

/* ---- the round in flight (round.c) --------------------------------------------------------
 * A round closes on the scheduler's word: each server says HAVE once it holds every member's
 * push for the member set's current view, and when every server has, the round COMMITs (the
 * servers aggregate over exactly those members). A straggler policy (--stragglers first:N or
 * deadline:S) may leave members out: before the commit, by a new view of the member set made
 * of those whose pushes are at every server (PROGRESS says which each holds); after it, by
 * ending the round with the reports in hand. A lost worker leaves the round too (a new view),
 * unless its push is in already. Without sockets: the actor feeds what arrives and carries
 * out the actions (MQ_RD_*); the members it leaves out come back in OUT->left. */
typedef struct {
    mq_stragglers_t policy; /* --stragglers */
    double value;           /* its N, or its seconds */
    bool evaluate;          /* an evaluated round waits for every member */
    bool committed, deadline_passed;
    uint32_t view; /* the member set's version within the iteration */
    uint32_t nmembers, nreports;
    uint32_t members[MQ_MAX_WORKERS]; /* in rank order */
    bool have[MQ_WIRE_MAX_SERVERS];   /* each server's HAVE for the current view */
    bool got[MQ_MAX_WORKERS];         /* each rank's report */
    uint64_t held[MQ_WIRE_MAX_SERVERS][MQ_MAX_WORKERS / 64]; /* PROGRESS: pushes each holds */
} mq_round_t;

enum {
    MQ_RD_COMMIT = 1 << 0, /* send COMMIT of the member set */
    MQ_RD_VIEW = 1 << 1,   /* send the servers the member set's new view */
    MQ_RD_DONE = 1 << 2,   /* the round is done: record it */
    MQ_RD_AGAIN = 1 << 3,  /* nobody is left in it: issue it again */
};

typedef struct {
    unsigned actions;
    uint32_t nleft;                /* members this event left out (stragglers), rank order */
    uint32_t left[MQ_MAX_WORKERS];
} mq_round_out_t;

/* A new round over R->members (set by the caller): nothing held, reported or committed. The
 * view is left as it is (the caller starts each iteration's at 0). */
void mq_round_begin(mq_round_t *r, bool evaluate);
/* Server SHARD holds every push of VIEW (NSERVERS servers in all): COMMIT when it is the
 * last. A HAVE for another view is ignored. */
void mq_round_have(mq_round_t *r, uint32_t shard, uint32_t view, uint32_t nservers,
                   mq_round_out_t *out);
/* Server SHARD holds the pushes of RANKS (N of them): a straggler policy may cut (VIEW). */
void mq_round_progress(mq_round_t *r, uint32_t shard, const uint32_t *ranks, uint32_t n,
                       uint32_t nservers, mq_round_out_t *out);
/* Member RANK reported: DONE when it is the last, or when the policy ends the round without
 * the others. A second report, or one from outside the member set, changes nothing. */
void mq_round_report(mq_round_t *r, uint32_t rank, mq_round_out_t *out);
/* deadline:S's seconds are over: cut (VIEW) before the commit, end (DONE) after it. */
void mq_round_deadline(mq_round_t *r, uint32_t nservers, mq_round_out_t *out);
/* Worker RANK is gone: out of the round (VIEW; AGAIN when nobody is left) unless it reported;
 * after the commit the round stands without its report (DONE if the others' are in). */
void mq_round_lose(mq_round_t *r, uint32_t rank, mq_round_out_t *out);

#endif
