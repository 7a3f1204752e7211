/* Shared between the scheduler's files; not part of its interface. */
#ifndef MQGRAD_SCHEDULER_INTERNAL_H
#define MQGRAD_SCHEDULER_INTERNAL_H

#include "mqgrad/ps.h"
#include "mqgrad/runlog.h"
#include "mqgrad/security.h"
#include "mqgrad/watch.h"
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
/* The consistent checkpoint before it, kept as RUN_DIR/checkpoint-prev.json so that a run
 * whose latest checkpoint cannot be read by a server goes back to the one before: keep_prev
 * copies checkpoint.json there before a new one is written (0 when there is none yet);
 * read_prev reads it as mq_sched_ckpt_read; fall_back moves checkpoint.json aside as
 * checkpoint-unreadable-BAD_ITER.json and the previous one in its place. 0, or -1 with an
 * error. */
int mq_sched_ckpt_keep_prev(const char *run_dir);
int mq_sched_ckpt_read_prev(const char *run_dir, mq_sched_ckpt_t *c);
int mq_sched_ckpt_fall_back(const char *run_dir, uint64_t bad_iter);
/* Whether RUN_DIR holds a run (config.json), and whether that run is over for good (its
 * summary says completed or diverged): then --resume starts a new run beside it. */
bool mq_sched_run_exists(const char *run_dir);
bool mq_sched_run_finished(const char *run_dir);
/* The first of DIR-2, DIR-3, ... that holds no run, into OUT. */
int mq_sched_next_dir(const char *dir, char *out, size_t len);

/* The run directory as mq_sched_open_run found it. */
typedef struct {
    mq_runlog_t *log;      /* open for the run's rows and events */
    bool resumed;          /* an unfinished run goes on (--resume) */
    bool has_ckpt;         /* ...from CKPT (else from its start) */
    mq_sched_ckpt_t ckpt;
    uint64_t lost;         /* iterations it had recorded past the point it goes on from */
} mq_sched_opened_t;

/* Opens the run directory RUN_DIR (LEN bytes; --run-dir) for C: a new run; with --resume the
 * unfinished run there, from its last consistent checkpoint (or from its start when it has
 * none), refused when that checkpoint is of another cluster shape; a run over for good makes
 * --resume start a new one beside it (RUN_DIR is then changed). Temporary files that died
 * writers left are removed first. 0, or -1 with the reason. */
int mq_sched_open_run(const mq_scheduler_config_t *c, char *run_dir, size_t len,
                      mq_sched_opened_t *out);

/* ---- the checkpoint in progress (checkpoints.c) -------------------------------------------
 * Every --checkpoint-every iterations the servers write their shards as of the round's start;
 * once all have, the scheduler's state goes to checkpoint.json: a consistent point.
 *
 *   IDLE      a round at a multiple of every (not 0, not the iteration resumed at):
 *             -> PENDING of it, the round's ITERATE says "checkpoint".
 *   PENDING   SAVED of it from a server, ok: tallied; the last -> COMPLETE, IDLE (the actor
 *             writes checkpoint.json, then says committed: the point is consistent).
 *             SAVED of it, failed: -> IDLE, FAILED (FAILED_FIRST the first time in the run:
 *             said loudly once, an event each time).
 *             SAVED of another iteration or shard: IGNORE.
 *   any       a restore (resume, roll back) -> IDLE, consistent at the iteration gone on from.
 *
 * The servers keep the last two consistent checkpoints (ITERATE's keep_from): one whose shard
 * a server cannot read leaves the one before (recovery.c). */
typedef struct {
    long every;          /* --checkpoint-every (0: none) */
    uint64_t resumed_at; /* the iteration the run went on from (no checkpoint there) */
    bool pending;        /* being written... */
    uint64_t iter;       /* ...of this iteration */
    uint32_t servers;    /* ...by this many servers */
    bool *saved;         /* by shard, for the run's servers (cap of them) */
    uint32_t cap;
    bool warned;         /* a failure was said loudly */
    uint64_t consistent; /* the last consistent checkpoint (0: none) */
    uint64_t before;     /* the one before it (checkpoint-prev.json; 0: none) */
} mq_ckround_t;

typedef enum {
    MQ_CP_IGNORE,       /* not the checkpoint in progress */
    MQ_CP_WAIT,         /* tallied; other servers have not said */
    MQ_CP_COMPLETE,     /* every server saved: write checkpoint.json */
    MQ_CP_FAILED_FIRST, /* a server could not: no checkpoint this time (the first failure) */
    MQ_CP_FAILED,       /* the same, again */
} mq_cp_action_t;

/* Checkpoints every EVERY iterations (0: none) of a run of SERVERS servers; -1 when out of
 * memory. mq_cp_destroy frees what it took. */
int mq_cp_init(mq_ckround_t *cp, long every, uint32_t servers);
void mq_cp_destroy(mq_ckround_t *cp);
/* Whether the round ITER, with SERVERS servers, writes a checkpoint; if so it is pending. */
bool mq_cp_due(mq_ckround_t *cp, uint64_t iter, uint32_t servers);
/* The oldest checkpoint a server keeps when it writes a new one. */
uint64_t mq_cp_keep_from(const mq_ckround_t *cp);
/* A server's SAVED: the shard SHARD of iteration ITER was written (OK) or not. */
mq_cp_action_t mq_cp_saved(mq_ckround_t *cp, uint64_t iter, uint32_t shard, bool ok);
/* checkpoint.json now holds the pending checkpoint. */
void mq_cp_committed(mq_ckround_t *cp);
/* The run goes on from iteration AT (0: its start), the checkpoint before it at BEFORE (0:
 * none); nothing pending. */
void mq_cp_restart(mq_ckround_t *cp, uint64_t at, uint64_t before);

/* ---- the run's horizon (horizon.c) --------------------------------------------------------
 * Which rounds are evaluated (every --eval-every, and the last), on how many test images
 * (--eval-limit, or --final-eval-limit for the last), and when the run ends (--iterations,
 * --time-budget of training time). A run that runs out of time on a round that was not
 * evaluated gets one more, evaluated round: a run always ends with an evaluation.
 *
 *   after a round:  not over: GO_ON.  over, evaluated (or out of iterations): END.
 *                   over on time, not evaluated, iterations left: ONE_MORE (once), and that
 *                   round is the final one (evaluated, final limit); after it: END. */
typedef struct {
    long iterations;     /* 0: no limit */
    double time_budget;  /* seconds of training, 0: none */
    long eval_every;     /* 0: the last round only */
    long eval_limit;     /* test images of an evaluation (0: all) */
    long final_eval_limit; /* of the last one (< 0: eval_limit) */
    bool one_more;       /* the extra, evaluated round is under way */
} mq_horizon_t;

typedef struct {
    bool evaluate; /* the members evaluate after this round */
    bool final;    /* it is the run's last (as foreseen) */
    uint32_t limit; /* on this many test images (0: all) */
} mq_hz_round_t;

typedef enum { MQ_HZ_GO_ON, MQ_HZ_ONE_MORE, MQ_HZ_END } mq_hz_next_t;

void mq_hz_init(mq_horizon_t *h, const mq_scheduler_config_t *c);
/* ITER rounds done after TRAIN_TIME seconds of training: is the run's horizon reached? */
bool mq_hz_over(const mq_horizon_t *h, uint64_t iter, double train_time);
/* Round ITER (from 0), issued after TRAIN_TIME seconds of training, the round before having
 * taken LAST_S. */
mq_hz_round_t mq_hz_round(const mq_horizon_t *h, uint64_t iter, double train_time,
                          double last_s);
/* Round ITER - 1 closed (ITER done) at TRAIN_TIME; EVALUATED: whether it was evaluated. */
mq_hz_next_t mq_hz_after(mq_horizon_t *h, uint64_t iter, double train_time, bool evaluated);
/* A rollback to a checkpoint: no extra round is under way. */
void mq_hz_restart(mq_horizon_t *h);

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

/* The levels round ITER uses, into USED: the policy's BITS and per-tensor WIDTHS raised to
 * the spike guard's floor while it holds, within the range of the codec OPS (a policy may
 * range wider: qsgd needs 2 bits for a sign and a level); OPS NULL: an fp32 run, 32 bits. */
void mq_al_levels(const mq_watch_t *watch, uint64_t iter, int bits, const mq_widths_t *widths,
                  const mq_codec_ops_t *ops, mq_widths_t *used);

/* A recorded round as the agent is told of it (OBSERVE). */
typedef struct {
    const mq_report_t *sum; /* the round's totals (round.c) */
    uint32_t nreports;      /* ...over this many reports */
    double smoothed_before; /* the smoothed loss before this round's (record.c) */
    double iter_ms, progress;
    int bits, used_bits; /* the policy's, and the round's (the guard's floor may be higher) */
    bool fp32;
    uint64_t total_iters, fallbacks;
    const mq_layout_t *layout; /* the run's (NULL: not known yet) */
    uint64_t quant_threshold;  /* smaller tensors travel fp32: not observed */
    const mq_widths_t *widths; /* the round's levels */
} mq_al_round_t;

/* OBSERVE's body for round R: the means over its reports, and per quantized tensor of the
 * run's layout its size, level and error (none from reports of another layout, or in fp32). */
void mq_al_observation(const mq_al_round_t *r, mq_obs_msg_t *o);

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
    /* sized by the run (mq_round_init): its workers' ranks and its servers */
    uint32_t max_workers, servers, words; /* words: of a rank set's bits */
    uint32_t *members; /* in rank order */
    bool *have;        /* each server's HAVE for the current view */
    bool *got;         /* each rank's report */
    uint64_t *held;    /* PROGRESS: the pushes each server holds (words per server) */
    uint32_t *in, *left; /* scratch: a cut's members, and the ones left out (out->left) */
} mq_round_t;

enum {
    MQ_RD_COMMIT = 1 << 0, /* send COMMIT of the member set */
    MQ_RD_VIEW = 1 << 1,   /* send the servers the member set's new view */
    MQ_RD_DONE = 1 << 2,   /* the round is done: record it */
    MQ_RD_AGAIN = 1 << 3,  /* nobody is left in it: issue it again */
};

typedef struct {
    unsigned actions;
    uint32_t nleft;       /* members this event left out (stragglers), rank order */
    const uint32_t *left; /* (the round's: valid until its next event) */
} mq_round_out_t;

/* A round of a run of MAX_WORKERS worker ranks and SERVERS servers, no members yet; -1 when
 * out of memory. mq_round_destroy frees what it took. */
int mq_round_init(mq_round_t *r, uint32_t max_workers, uint32_t servers);
void mq_round_destroy(mq_round_t *r);

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
/* Whether a report of MSG_ITER from RANK is one round ITER takes (RUNNING: a round is in
 * flight; CUT: the policy left stragglers out of it): MQ_DROP_NONE, or the drop and WHY (a
 * straggler's report, or one for a closed round, is LATE). */
mq_drop_t mq_round_report_check(const mq_round_t *r, bool running, uint64_t iter, bool cut,
                                uint64_t msg_iter, uint32_t rank, const char **why);
/* Adds a member's report R to the round's totals SUM: sums, the worst flags, the evaluation's
 * counts and its longest time (eval_ms); the per-tensor errors only from a report of
 * NTENSORS tensors, the run's layout. */
void mq_round_sum(mq_report_t *sum, const mq_report_t *r, uint32_t ntensors);
/* deadline:S's seconds are over: cut (VIEW) before the commit, end (DONE) after it. */
void mq_round_deadline(mq_round_t *r, uint32_t nservers, mq_round_out_t *out);
/* Worker RANK is gone: out of the round (VIEW; AGAIN when nobody is left) unless it reported;
 * after the commit the round stands without its report (DONE if the others' are in). */
void mq_round_lose(mq_round_t *r, uint32_t rank, mq_round_out_t *out);

/* The round's clock: when the round in flight began and how long it took on the run's clock
 * (the wall clock, or --clock simulated's, on which rounds follow one another without gaps,
 * so a round begins at the training time so far and ends at its members' latest report
 * stamp), which member was slowest, and what a straggler policy left out. */
typedef struct {
    bool simulated;
    double t_issued;             /* wall clock, s (also --iter-timeout's start) */
    double sim_issued, sim_done; /* simulated: the round began, the latest report's stamp */
    uint32_t cut;                /* members the straggler policy left out of this round */
    uint32_t slowest_rank;       /* the slowest member: the last to report, or the first cut */
    double slowest_ms;           /* ...its time from the round's start (a cut one: so far) */
    uint64_t cut_total, cut_rounds; /* over the run: members left out, rounds cut */
} mq_round_clock_t;

/* A round begins at NOW on the wall clock and TRAIN_TIME (s) of training on the simulated one:
 * nothing cut, nobody slowest yet; the run's totals stay. */
void mq_rclock_begin(mq_round_clock_t *c, double now, double train_time);
/* Member RANK reported at NOW, stamped SIM_TIME: the slowest so far unless the round was cut
 * (a straggler left out is slower still); the simulated round ends at the latest stamp. */
void mq_rclock_report(mq_round_clock_t *c, uint32_t rank, double now, double sim_time);
/* The straggler policy left N members out at NOW, FIRST the lowest rank among them: the first
 * cut of a round names it the slowest (its time so far; 0 on the simulated clock, where it
 * never reported a stamp) and counts the round. */
void mq_rclock_cut(mq_round_clock_t *c, uint32_t first, uint32_t n, double now);
/* The round's training time in ms, done at NOW: the simulated span, or the wall span less the
 * evaluation's EVAL_MS (evaluation is not training). */
double mq_rclock_iter_ms(const mq_round_clock_t *c, double now, double eval_ms);

/* ---- the run's phases (phase.c) -----------------------------------------------------------
 * Where the run is, what moves it on, and how long each phase may last. Every change of phase
 * is an event looked up in one table (mq_ph_next); one that the table does not hold is
 * refused and the phase stays. The deadlines are the flags': --start-timeout from the start
 * of registration (again after a rollback), --iter-timeout from the round's issue,
 * --pause-timeout from the start of a pause.
 *
 *   phase \ event  COMPLETE   ISSUE     SHORT    ASK_AGENT   ROLL_BACK    FINISH
 *   REGISTERING    PREPARING  -         -        -           REGISTERING  DONE
 *   PREPARING      -          RUNNING   PAUSED   -           REGISTERING  DONE
 *   RUNNING        -          RUNNING   PAUSED   WAIT_AGENT  REGISTERING  DONE
 *   WAIT_AGENT     -          RUNNING   PAUSED   -           REGISTERING  DONE
 *   PAUSED         -          RUNNING   PAUSED   -           REGISTERING  DONE
 *   DONE           -          -         -        -           -            -
 */
typedef enum {
    MQ_PH_REGISTERING, /* ranks are taken; nothing is set up */
    MQ_PH_PREPARING,   /* every rank registered and welcomed: the nodes set up */
    MQ_PH_RUNNING,     /* a round is in flight */
    MQ_PH_WAIT_AGENT,  /* the round closed: the agent's decision is awaited */
    MQ_PH_PAUSED,      /* fewer than --min-workers: the round waits for enough of them */
    MQ_PH_DONE,        /* the run is over */
    MQ_PH_COUNT_
} mq_phase_t;

typedef enum {
    MQ_PE_COMPLETE,  /* every rank is registered: WELCOMEs go out */
    MQ_PE_ISSUE,     /* a round goes out */
    MQ_PE_SHORT,     /* a round is due but too few workers are up */
    MQ_PE_ASK_AGENT, /* the round closed and the agent is waited for */
    MQ_PE_ROLL_BACK, /* every node registers again (a lost server, a checkpoint unreadable) */
    MQ_PE_FINISH,    /* the run ends, whatever its status */
    MQ_PE_COUNT_
} mq_phase_event_t;

typedef struct {
    mq_phase_t phase;
    double t_registering; /* when registration began: --start-timeout counts from it */
    double t_paused;      /* when the pause began */
} mq_phases_t;

/* What a phase has run out of time for. */
typedef enum {
    MQ_PD_NONE,
    MQ_PD_START, /* registration and setup took longer than --start-timeout */
    MQ_PD_ROUND, /* the round in flight is older than --iter-timeout */
    MQ_PD_PAUSE  /* paused for longer than --pause-timeout */
} mq_ph_due_t;

/* REGISTERING since NOW. */
void mq_ph_init(mq_phases_t *ph, double now);
/* The phase EVENT leads to from FROM, or -1 where the table has none. */
int mq_ph_next(mq_phase_t from, mq_phase_event_t event);
/* Takes EVENT at NOW: the phase changes by the table (entering REGISTERING restarts the start
 * deadline; entering PAUSED from another phase starts the pause's). Returns the phase it
 * left, or -1 with an error naming the event and the phase (nothing changes). */
int mq_ph_go(mq_phases_t *ph, mq_phase_event_t event, double now);
/* The deadline the phase has passed at NOW, if any; T_ISSUED is the round in flight's issue
 * (the round clock's, moved on when stuck members are taken out). */
mq_ph_due_t mq_ph_due(const mq_phases_t *ph, const mq_scheduler_config_t *c, double now,
                      double t_issued);
const char *mq_ph_name(mq_phase_t phase);

/* ---- membership (membership.c) ------------------------------------------------------------
 * Who holds each worker and server rank, and in what state; the actor feeds what the nodes
 * say and do, and carries out the outcome (welcome, refuse, events, the round). A rank's term
 * (mqgrad/security.h) counts the times it was given out and never goes back, not even when a
 * rollback forgets the nodes (mq_mb_forget): no old token comes back.
 *
 *   FREE    REGISTER: -> SETUP (a rank taken, its term one more; refused with the reason
 *           when none is free, a server after the registration, an unknown role).
 *           READY, HEARTBEAT, LEAVE: not of the run (the actor refuses or drops them).
 *   SETUP   READY: -> READY.  REGISTER again (a later try, a new connection): answered
 *           there from now on (WELCOME again once the run has started); the same try, or
 *           an earlier one arriving late: nothing.  HEARTBEAT: heard.  LEAVE, SILENT,
 *           STUCK: -> FREE.
 *   READY   ROUND: -> ACTIVE (a worker: it joins).  REGISTER again, HEARTBEAT: as SETUP.
 *           READY: refused (twice).  LEAVE, SILENT: -> FREE.
 *   ACTIVE  REGISTER again, HEARTBEAT: as SETUP.  READY: refused.  LEAVE, SILENT, STUCK:
 *           -> FREE, out of the round in flight (the actor tells the round).
 *
 * REGISTER: a node's first try; REGISTER again: its INCARNATION known; ROUND: a round's
 * member set is formed; SILENT: no HEARTBEAT within the timeout; STUCK: a member that did not
 * push within --iter-timeout while others did. */
typedef enum { MQ_MB_FREE, MQ_MB_SETUP, MQ_MB_READY, MQ_MB_ACTIVE } mq_mb_state_t;

typedef struct {
    uint8_t peer[MQ_WIRE_MAX_PEER]; /* where it is answered: its latest try's connection */
    size_t peer_len;
    uint64_t incarnation;
    uint32_t attempt; /* that try (mq_register_t) */
    char endpoint[MQ_WIRE_MAX_TEXT];
    mq_mb_state_t state;
    double last_heard;
    int prefer;      /* a server: the shard it asked for, -1 for any */
    uint64_t pushed; /* a worker: 1 + the iteration its loop last pushed, from its heartbeat */
} mq_mb_node_t;

typedef struct {
    uint32_t max_workers, want_servers; /* --max-workers, --servers: the arrays' sizes */
    mq_mb_node_t *workers, *servers;
    uint32_t nservers; /* registered, in rank order */
    uint32_t *worker_term, *server_term;
} mq_membership_t;

/* What a REGISTER comes to. */
typedef enum {
    MQ_MB_TAKEN,   /* a new holder of OUT->rank */
    MQ_MB_MOVED,   /* a known node's later try: answered on its new connection from now on */
    MQ_MB_SAME,    /* a known node's try on the same connection, or an earlier one: nothing */
    MQ_MB_REFUSED, /* OUT->why; OUT->retry: the node may register again later */
} mq_mb_reg_t;

typedef struct {
    bool worker;
    uint32_t rank;
    bool retry;
    const char *why;
} mq_mb_reg_out_t;

/* Room for MAX_WORKERS worker ranks and WANT_SERVERS servers, every one FREE; -1 when out of
 * memory. mq_mb_destroy frees what it took. */
int mq_mb_init(mq_membership_t *mb, uint32_t max_workers, uint32_t want_servers);
void mq_mb_destroy(mq_membership_t *mb);
/* A known node's REGISTER again (found by its incarnation): MOVED or SAME, or -1 when no
 * rank is held by that incarnation (then it is a first try: mq_mb_take). */
int mq_mb_again(mq_membership_t *mb, const mq_msg_t *msg, mq_mb_reg_out_t *out);
/* A first try of role WORKER or not: TAKEN (the rank in OUT, the node SETUP and heard at NOW)
 * or REFUSED. REGISTERING: the cluster is still being formed (servers are taken only then). */
mq_mb_reg_t mq_mb_take(mq_membership_t *mb, const mq_msg_t *msg, bool registering, double now,
                       mq_mb_reg_out_t *out);
/* Whether MSG came from N's connection (the one it is answered at). */
bool mq_mb_from_peer(const mq_mb_node_t *n, const mq_msg_t *msg);
/* The node of ROLE and RANK that says it is INCARNATION, or NULL. */
mq_mb_node_t *mq_mb_node(mq_membership_t *mb, mq_role_t role, uint32_t rank, uint64_t incarnation);
/* READY from MSG's sender: whether it is the SETUP node of its role, rank and incarnation,
 * on the connection it is answered at; then it is READY, heard at NOW. */
bool mq_mb_ready(mq_membership_t *mb, const mq_msg_t *msg, double now);
/* Workers holding a rank in STATE (MQ_MB_FREE: any state but free). */
uint32_t mq_mb_count(const mq_membership_t *mb, mq_mb_state_t state);
/* Whether every server and at least WORKERS workers are READY. */
bool mq_mb_all_ready(const mq_membership_t *mb, uint32_t workers);
/* ROUND: every READY worker becomes ACTIVE (into JOINED, rank order, N_JOINED of them); the
 * members, every ACTIVE worker in rank order, into MEMBERS (N of them). */
void mq_mb_form_round(mq_membership_t *mb, uint32_t *members, uint32_t *n, uint32_t *joined,
                      uint32_t *n_joined);
/* The run's first round: every server and every READY worker ACTIVE (no one "joins"). */
void mq_mb_start(mq_membership_t *mb);
/* Worker RANK is gone (LEAVE, SILENT, STUCK): FREE; whether it was a member (ACTIVE). */
bool mq_mb_lose(mq_membership_t *mb, uint32_t rank);
/* The nodes silent at NOW for longer than LIMIT seconds: workers into SILENT_WORKERS (rank
 * order), and the first such server (-1: none). */
int mq_mb_silent(const mq_membership_t *mb, double now, double limit, uint32_t *silent_workers,
                 uint32_t *n);
/* Servers took ranks in the order they registered; each that asked for a shard gets it,
 * unless another asked for the same one first. */
void mq_mb_place_servers(mq_membership_t *mb);
/* Forgets every node (a rollback: all register again); the terms stay. */
void mq_mb_forget(mq_membership_t *mb);
/* The worker whose values start an external model's run: SEEDER (the first worker to
 * register) while it holds its rank, else the lowest rank held (it left before the start). */
uint32_t mq_mb_seeder(const mq_membership_t *mb, uint32_t seeder);

/* What the run tells every node in its WELCOME. */
typedef struct {
    const mq_run_config_t *config;
    uint64_t run_id;
    const uint8_t *run_key;    /* MQ_RUN_KEY_LEN bytes */
    const mq_layout_t *layout; /* an external model's, or NULL (a built-in one) */
    uint32_t seeder;           /* mq_mb_seeder */
} mq_mb_run_t;

/* WELCOME for NODE (one of MB's), which holds rank RANK, into OUT (its text fields in
 * ENDPOINTS, MB's nservers of them, which must outlive OUT): the run, its id, the servers'
 * endpoints in rank order and the rank's token of its current term; to a server the run key,
 * with which it checks the workers' tokens (a worker never gets it); with an external model
 * its layout, and to the seeder on a run that starts from its beginning (not resumed) the
 * word that its values start the run. Marks NODE heard from now (NOW): its heartbeats are
 * due from then. */
void mq_mb_welcome(mq_membership_t *mb, mq_mb_node_t *node, uint32_t rank,
                   const mq_mb_run_t *run, double now, char (*endpoints)[MQ_WIRE_MAX_TEXT],
                   mq_msg_t *out);
const char *mq_mb_state_name(mq_mb_state_t s);
/* The gate of the scheduler's socket (SECURITY.md): who may send MSG. A ping from any key of
 * the cluster; a node's message with its role's key (SEC: the keyring, NULL or off: any key)
 * and, once it is of run RUN_ID and not a REGISTER, with the token RUN_KEY gives its rank in
 * the rank's current term (an older term's token is revoked). NULL, or why not. */
const char *mq_mb_refusal(const mq_membership_t *mb, const mq_sec_t *sec,
                          const uint8_t run_key[MQ_RUN_KEY_LEN], uint64_t run_id,
                          const mq_msg_t *msg);

/* ---- recovery (recovery.c) ----------------------------------------------------------------
 *   a round past --iter-timeout:  some member pushed (its report, or its heartbeat's count),
 *                                 others did not -> TAKE OUT those others (stuck: a wedged
 *                                 loop looks alive, its heartbeat thread goes on);
 *                                 nobody pushed, or everybody did -> nothing here (the round
 *                                 itself is wrong: the run fails).
 *   a server lost:                no checkpoints -> FAIL; the checkpoint file unreadable ->
 *                                 FAIL; a checkpoint at C -> ROLLBACK to C; none yet ->
 *                                 ROLLBACK to 0. Every node registers again, the servers load
 *                                 their shards of that iteration, the workers pull them.
 *   a server cannot read its      of the checkpoint C the run goes on from: the one before it
 *   shard of a checkpoint:        (checkpoint-prev.json, B < C) -> ROLLBACK to B; none, or
 *                                 unreadable -> FAIL; of another checkpoint -> IGNORE. */

/* The members of round R that neither reported nor pushed at iteration ITER, into STUCK
 * (rank order): how many, or 0 when none of them moved (or all did). */
uint32_t mq_rc_stuck(const mq_round_t *r, const mq_membership_t *mb, uint64_t iter,
                     uint32_t *stuck);

typedef enum { MQ_RC_FAIL, MQ_RC_ROLLBACK, MQ_RC_IGNORE } mq_rc_action_t;
typedef struct {
    mq_rc_action_t action;
    bool from_checkpoint; /* ROLLBACK: to the checkpoint (else to the start) */
    uint64_t from, lost;  /* ROLLBACK: the iteration gone back to, the iterations lost */
    char why[128];        /* FAIL: why the run cannot go on */
} mq_rc_plan_t;

/* A server is lost at iteration ITER, checkpoints every CHECKPOINT_EVERY iterations;
 * READ_RC is mq_sched_ckpt_read's (0: CKPT_ITER read, 1: none yet, -1: unreadable). */
mq_rc_plan_t mq_rc_server_lost(long checkpoint_every, int read_rc, uint64_t ckpt_iter,
                               uint64_t iter);
/* A server cannot read its shard of the checkpoint of iteration BAD; the run goes on from
 * CONSISTENT, and PREV_RC is mq_sched_ckpt_read_prev's (0: PREV_ITER read, 1: none, -1:
 * unreadable). IGNORE a word on a checkpoint already fallen back from; ROLLBACK to the one
 * before; FAIL without one. */
mq_rc_plan_t mq_rc_unreadable(uint64_t bad, uint64_t consistent, int prev_rc, uint64_t prev_iter);

/* ---- the round's record (record.c) --------------------------------------------------------
 * A closed round becomes a row of metrics.csv and adds to the run's totals; its loss, and its
 * accuracy when it was evaluated, go to the divergence watch (mqgrad/watch.h). Without files
 * or sockets: the actor writes the row, says the events and ends the run as it is told.
 *
 *   a round closed:  the reports' means -> the row (its loss NaN when one was not finite);
 *                    the totals add its bytes and its loss; evaluated: the last accuracy
 *                    and sparsity.  The loss spiked: GUARD (the watch raises the bits for a
 *                    while).  The loss, or else the accuracy, diverged: DIVERGED, and STOP
 *                    under --on-divergence stop.
 *   the run ended:   its last round evaluated at chance, or flat: diverged (mq_rec_final).
 *   the summary:     the totals; an accuracy measured before the run diverged is NaN.
 *   a checkpoint:    the totals and the watch go into it and come back from it. */
typedef struct {
    uint64_t bytes_up, bytes_down;
    double last_loss, last_acc; /* NaN: none yet */
    double last_sparsity;       /* fraction of parameters exactly zero at the last evaluation */
    double acc_iter;            /* the iteration last_acc is of, -1 before any */
} mq_totals_t;

/* A closed round, as the actor saw it. */
typedef struct {
    uint64_t iter;
    double train_time_s, agent_ms, slowest_ms;
    int bits;       /* the bits it used */
    bool evaluated; /* its members were told to evaluate */
    uint32_t nmembers, nreports, cut, slowest_rank;
} mq_rec_round_t;

enum {
    MQ_REC_GUARD = 1 << 0,    /* the loss spiked: say so (the watch holds the raised floor) */
    MQ_REC_DIVERGED = 1 << 1, /* the run diverged at this round: say so, once */
    MQ_REC_STOP = 1 << 2,     /* ...and it stops now (--on-divergence stop) */
};

typedef struct {
    double smoothed_before; /* the watch's smoothed loss before this round's */
    mq_metrics_row_t row;
} mq_rec_out_t;

/* No rounds yet: no bytes, no loss, no accuracy. */
void mq_rec_init(mq_totals_t *t);
/* Round IN closed with the reports' totals SUM: its row into OUT; returns the actions. */
unsigned mq_rec_round(mq_totals_t *t, mq_watch_t *w, bool stop_on_divergence,
                      const mq_rec_round_t *in, const mq_report_t *sum, mq_rec_out_t *out);
/* The gradient's norms of a round: root mean square over its NREPORTS reports of the sums of
 * squares, before quantization, as pushed, and the aggregate applied. */
void mq_rec_norms(const mq_report_t *sum, uint32_t nreports, double *grad, double *sent,
                  double *update);
/* The run ended after ITERS rounds: whether its last evaluation (the last round's, else none
 * is judged) makes it diverged by the chance or the flat rule. */
bool mq_rec_final(const mq_totals_t *t, mq_watch_t *w, uint64_t iters);
/* The summary's totals and divergence fields. */
void mq_rec_summary(const mq_totals_t *t, const mq_watch_t *w, mq_summary_t *s);
/* The totals and the watch's state into a checkpoint, and back. */
void mq_rec_save(const mq_totals_t *t, const mq_watch_t *w, mq_sched_ckpt_t *c);
void mq_rec_load(mq_totals_t *t, mq_watch_t *w, const mq_sched_ckpt_t *c);

#endif
