/* The run's health: watches the global loss and the evaluated accuracy of a training run,
 * declares it diverged when it is beyond saving, and names a loss spike early enough for the
 * scheduler to raise the bit-width for a while (the guard). No sockets, no clock: the
 * scheduler feeds it one iteration at a time, tests feed it made-up sequences.
 *
 * A run is diverged when (the first rule to fire wins):
 *   nonfinite  a worker reported a non-finite loss or gradient value;
 *   loss       the smoothed loss stayed above loss_factor x the best smoothed loss seen for
 *              `patience` consecutive iterations (from the first iteration on: a learning rate
 *              that is far too high blows the loss up in the first few);
 *   accuracy   an evaluation fell to chance (at most 1.5 / classes) after an earlier one had
 *              been clearly above it (at least 2.5 / classes);
 *   chance     the run ended with its final evaluation at chance (at most 1.5 / classes)
 *              after at least `learn_within` iterations: it did not learn (mq_watch_final);
 *   flat       the same, its final evaluation above chance but under 2 / classes and its
 *              smoothed loss not 5 % below its first loss: it did not learn either, it started
 *              a little above chance (mq_watch_final).
 * A spike is one iteration whose loss exceeds spike_factor x the smoothed loss before it. */
#ifndef MQGRAD_WATCH_H
#define MQGRAD_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit code of a service or command whose run was declared diverged (0 completed, 1 failed,
 * 2 bad usage, 130 interrupted). */
#define MQ_EXIT_DIVERGED 3

/* The loss smoothing (an exponential moving average) the watch and the progress lines use. */
#define MQ_WATCH_SMOOTH_ALPHA 0.1

typedef struct {
    double loss_factor; /* loss rule: multiple of the best smoothed loss (2; 0 = rule off) */
    long patience;      /* loss rule: consecutive iterations above it (15) */
    long warmup;        /* iterations before spikes count (10) */
    int classes;        /* chance level is 1 / classes (10) */
    double spike_factor; /* guard: loss above this x the smoothed loss is a spike (1.5; 0 = off) */
    long guard_iters;    /* guard: iterations a raised floor lasts (10: two MDP windows) */
    int guard_bits;      /* guard: bits added above those that spiked (2) */
    int max_bits;        /* guard: the floor never exceeds this (8) */
    long learn_within;   /* chance, flat rules: runs this long must have learned (50; 0 = off) */
} mq_watch_opts_t;

void mq_watch_opts_default(mq_watch_opts_t *o);

typedef struct {
    mq_watch_opts_t o;
    uint64_t seen;      /* iterations fed */
    double smoothed;    /* EMA of the finite losses */
    double best;        /* lowest smoothed loss (INFINITY before the first) */
    long above;         /* consecutive iterations above loss_factor x best */
    double best_acc;    /* highest evaluated accuracy (-1 before any) */
    double first;       /* the first finite loss (NAN before it) */
    uint64_t guard_until; /* the floor holds for iterations < guard_until */
    int guard_floor;
    uint64_t spikes;    /* how often the guard fired */
    bool diverged;
    uint64_t div_iter;
    bool at_end;        /* the rule judged the run as a whole, as it ended (chance, flat) */
    char rule[16];      /* "nonfinite", "loss", "accuracy", "chance", "flat" */
    char detail[256];   /* the evidence, in words */
} mq_watch_t;

void mq_watch_init(mq_watch_t *w, const mq_watch_opts_t *o);

/* Feeds iteration ITER's global loss (may be NaN or infinite) and the number of non-finite
 * values the workers reported. Returns true when this iteration makes the run diverged
 * (once: later calls return false, while the smoothing and the guard go on; w->rule and
 * w->detail say why). Sets *SPIKE (if not NULL)
 * when the guard fires on this iteration, after which mq_watch_bits raises the floor. BITS
 * is the bit-width iteration ITER used (32 = fp32: the guard stays off). */
bool mq_watch_loss(mq_watch_t *w, uint64_t iter, double loss, uint64_t nonfinite, int bits,
                   bool *spike);

/* Feeds an evaluated test accuracy (0..1) of iteration ITER; true when it makes the run
 * diverged (the accuracy rule). */
bool mq_watch_accuracy(mq_watch_t *w, uint64_t iter, double acc);

/* Judges the end of a run of ITERS iterations whose last evaluation gave ACC (NaN: none was
 * made, nothing is judged): true when it makes the run diverged by the chance or the flat
 * rule (w->at_end is then set). Call it once, after the last iteration's mq_watch_accuracy. */
bool mq_watch_final(mq_watch_t *w, uint64_t iters, double acc);

/* The bits iteration ITER should use given the policy's choice: raised to the guard's floor
 * while it holds. */
int mq_watch_bits(const mq_watch_t *w, uint64_t iter, int policy_bits);

#ifdef __cplusplus
}
#endif
#endif
