/* The run directory every training run leaves behind (DESIGN section 8), written the same way
 * by `mqgrad train` and by the scheduler:
 *
 *   config.json    the run's settings (written once at the start, by the caller's JSON)
 *   metrics.csv    one row per iteration, columns in MQ_METRICS_HEADER order; test_acc and
 *                  test_loss are empty where the iteration was not evaluated. Columns are
 *                  only ever appended (workers came last), so readers find them by name and
 *                  still read older runs that lack the later ones
 *   events.jsonl   one JSON object per line: {"t": seconds, "iter": m, "event": "...", ...}
 *   summary.json   written at the end (and rewritten at each evaluation, so a killed run
 *                  still leaves one)
 *
 * Rows are written through as they come so a run can be followed with tail -f. A run directory
 * is never truncated: mq_runlog_new refuses a directory that already holds a run, and
 * mq_runlog_append continues one. A write that fails (a full disk) fails the call that made it,
 * with the file and the system's reason in the error. */
#ifndef MQGRAD_RUNLOG_H
#define MQGRAD_RUNLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MQ_METRICS_HEADER                                                                      \
    "iter,train_time_s,loss,smoothed_loss,bits,bytes_up,bytes_down,compute_ms,encode_ms,"      \
    "wait_ms,decode_ms,update_ms,agent_ms,test_acc,test_loss,workers,stragglers,slowest_rank,"    \
    "slowest_ms"

typedef struct {
    uint64_t iter;
    double train_time_s; /* training time so far, evaluation excluded */
    double loss, smoothed_loss;
    int bits;            /* 32 for fp32 */
    uint64_t bytes_up, bytes_down; /* wire bytes of this iteration, all workers together */
    double compute_ms, encode_ms, wait_ms, decode_ms, update_ms, agent_ms; /* worker means */
    bool evaluated;
    double test_acc, test_loss;
    /* Workers whose pushes were aggregated in this iteration (fewer than the run's workers
     * when some were missing from it); 1 for the single-process `mqgrad train`. */
    uint32_t workers;
    /* Members cut from this iteration by the straggler policy (their pushes came too late), the
     * slowest member (a cut one if any, else the last to report) and its time from the
     * iteration's start to its report, ms (to the cut for a cut one). */
    uint32_t stragglers;
    uint32_t slowest_rank;
    double slowest_ms;
} mq_metrics_row_t;

typedef struct {
    uint64_t iterations;
    double train_time_s;
    double final_loss;
    double final_test_acc; /* NaN if never evaluated */
    double final_sparsity; /* parameters exactly zero at the last evaluation / all; NaN if none */
    uint64_t bytes_up, bytes_down;
    const char *policy;    /* "fixed:4", "mqgrad", "none" (fp32), ... */
    const char *model, *dataset;
    uint64_t params;       /* the model's parameters (written when known, > 0) */
    int workers, servers;
    uint64_t seed;
    double link_mbps;      /* 0 = no emulation */
    const char *clock;     /* "real" or "simulated": what train_time_s was measured on */
    double wall_time_s;    /* wall-clock seconds from the first iteration to the end */
    const char *status;    /* "completed", "interrupted", "failed", "diverged" */
    /* Set when status is "diverged" (written only then): the rule that fired ("nonfinite",
     * "loss", "accuracy"), the iteration it fired at, and its evidence in words. */
    const char *divergence_rule;
    uint64_t divergence_iter;
    const char *divergence_detail;
    /* Why the run ended, in words, when it did not complete ("failed", "interrupted"):
     * written only when set. */
    const char *reason;
} mq_summary_t;

typedef struct mq_runlog_t mq_runlog_t;

/* Starts a run in DIR: creates DIR (and parents), metrics.csv with its header, an empty
 * events.jsonl, and config.json from CONFIG_JSON (a complete JSON object; NULL for {}).
 * NULL with an error if DIR already holds a run (any of config.json, metrics.csv,
 * events.jsonl, summary.json: none is ever written over) or cannot be made or written. A
 * missing or empty directory, or one holding only other files, is fine. */
mq_runlog_t *mq_runlog_new(const char *dir, const char *config_json);
/* Reopens the run in DIR to continue it (a resumed run): rows and events are appended after
 * the ones already there, nothing is truncated, config.json is left as it is. NULL with an
 * error naming the file unless DIR has config.json and a metrics.csv whose first line is
 * MQ_METRICS_HEADER (a run written with other columns would get rows that do not line up)
 * and whose last row is complete (ends with a newline). events.jsonl is created if missing.
 * The "t" of the events written from here counts from this call. */
mq_runlog_t *mq_runlog_append(const char *dir);
/* The iteration of the last complete row of DIR/metrics.csv into *ITER: 0, or 1 when the
 * file has no row yet, or -1 with an error (no file, or a last row that does not start with
 * an iteration). What a resumed run continues from. */
int mq_runlog_last_iter(const char *dir, uint64_t *iter);
void mq_runlog_destroy(mq_runlog_t **self_p);
const char *mq_runlog_dir(const mq_runlog_t *r);
/* Appends ROW to metrics.csv. -1 with an error naming the file and the reason ("No space
 * left on device") if it cannot be written. */
int mq_runlog_row(mq_runlog_t *r, const mq_metrics_row_t *row);
/* Appends one line to events.jsonl; -1 as mq_runlog_row. FIELDS_JSON is the rest of the
 * object after "t","iter","event" (may be NULL or ""), e.g. "\"policy\":\"fixed:4\"". */
int mq_runlog_event(mq_runlog_t *r, uint64_t iter, const char *event, const char *fields_json);
/* Replaces summary.json atomically; -1 with an error naming it if that fails. */
int mq_runlog_summary(mq_runlog_t *r, const mq_summary_t *s);
/* The same, into DIR/summary.json without an open run (DIR must exist). */
int mq_summary_write(const char *dir, const mq_summary_t *s);
/* Sets the status and reason of DIR/summary.json, keeping everything else it says (a run
 * that a supervisor ended: the scheduler's own summary said "interrupted"); writes FALLBACK
 * with that status and reason when DIR has no summary.json or one this writer did not make
 * (a run that ended before it began). -1 with an error naming the file if that fails. */
int mq_summary_set_status(const char *dir, const char *status, const char *reason,
                          const mq_summary_t *fallback);

/* Escapes S for use inside a JSON string (quotes not included) into BUF. */
void mq_json_escape(const char *s, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
