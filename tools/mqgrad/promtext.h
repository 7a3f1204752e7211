/* A reader for the Prometheus text exposition format (0.0.4), for `mqgrad top`: every
 * sample line (name, labels with \\ \" \n escapes decoded, value including NaN and +Inf,
 * optional timestamp), comments and blank lines skipped. A malformed sample line is skipped
 * and counted, not fatal: one bad line from a service should not blank a whole view. */
#ifndef MQGRAD_CLI_PROMTEXT_H
#define MQGRAD_CLI_PROMTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *name, *value;
} mq_promtext_label_t;

typedef struct {
    const char *name;
    const mq_promtext_label_t *labels; /* NULL when there are none */
    int nlabels;
    double value;
    bool has_timestamp;
    int64_t timestamp_ms;
} mq_promtext_sample_t;

typedef struct {
    mq_promtext_sample_t *samples; /* in the order of the text */
    size_t n;
    int bad;           /* malformed sample lines skipped */
    int bad_line;      /* the first one's line number (1-based; 0 = none) */
    char bad_why[128]; /* and what was wrong with it */
    /* private: the text copy every string points into, and the labels of all samples */
    char *buf;
    mq_promtext_label_t *labels;
    size_t nlabels, cap, label_cap;
} mq_promtext_t;

/* Parses LEN bytes of TEXT (need not be NUL-terminated) into P, which it overwrites. Returns
 * 0, or -1 with an error when out of memory. Free P with mq_promtext_free in both cases.
 * Numbers are read in the C locale's format whatever LC_NUMERIC says. */
int mq_promtext_parse(const char *text, size_t len, mq_promtext_t *p);
void mq_promtext_free(mq_promtext_t *p);

/* The first sample named NAME that has every label given as NULL-terminated name, value
 * pairs after it (it may have others), or NULL:
 *   mq_promtext_find(p, "mqgrad_scheduler_worker_seconds", "rank", "0", "phase", "wait", NULL) */
const mq_promtext_sample_t *mq_promtext_find(const mq_promtext_t *p, const char *name, ...)
    __attribute__((sentinel));
/* The value of S's label NAME, or NULL. */
const char *mq_promtext_label(const mq_promtext_sample_t *s, const char *name);

#endif
