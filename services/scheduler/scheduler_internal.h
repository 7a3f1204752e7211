/* Shared between the scheduler's files; not part of its interface. */
#ifndef MQGRAD_SCHEDULER_INTERNAL_H
#define MQGRAD_SCHEDULER_INTERNAL_H

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

#endif
