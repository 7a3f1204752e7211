/* The run directory every training run leaves behind (DESIGN section 8), written the same way
 * by `mqgrad train` and by the scheduler:
 *
 *   config.json    the run's settings (written once at the start, by the caller's JSON)
 *   metrics.csv    one row per iteration, columns in MQ_METRICS_HEADER order; test_acc and
 *                  test_loss are empty where the iteration was not evaluated
 *   events.jsonl   one JSON object per line: {"t": seconds, "iter": m, "event": "...", ...}
 *   summary.json   written at the end (and rewritten at each evaluation, so a killed run
 *                  still leaves one)
 *
 * Rows are flushed as they are written so a run can be followed with tail -f. */
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
    "wait_ms,decode_ms,update_ms,agent_ms,test_acc,test_loss"

typedef struct {
    uint64_t iter;
    double train_time_s; /* training time so far, evaluation excluded */
    double loss, smoothed_loss;
    int bits;            /* 32 for fp32 */
    uint64_t bytes_up, bytes_down; /* wire bytes of this iteration, all workers together */
    double compute_ms, encode_ms, wait_ms, decode_ms, update_ms, agent_ms; /* worker means */
    bool evaluated;
    double test_acc, test_loss;
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
} mq_summary_t;

typedef struct mq_runlog_t mq_runlog_t;

/* Creates DIR (and parents) and writes config.json from CONFIG_JSON (a complete JSON object).
 * NULL with an error if the directory cannot be made or written. */
mq_runlog_t *mq_runlog_new(const char *dir, const char *config_json);
void mq_runlog_destroy(mq_runlog_t **self_p);
const char *mq_runlog_dir(const mq_runlog_t *r);
int mq_runlog_row(mq_runlog_t *r, const mq_metrics_row_t *row);
/* FIELDS_JSON is the rest of the object after "t","iter","event" (may be NULL or ""),
 * e.g. "\"policy\":\"fixed:4\"". */
int mq_runlog_event(mq_runlog_t *r, uint64_t iter, const char *event, const char *fields_json);
int mq_runlog_summary(mq_runlog_t *r, const mq_summary_t *s);

/* Escapes S for use inside a JSON string (quotes not included) into BUF. */
void mq_json_escape(const char *s, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
