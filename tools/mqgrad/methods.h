/* What a name in `mqgrad experiment --methods` runs: a policy, a codec and an update rule.
 * A method is a preset from one table (methods.c; `mqgrad experiment --help` lists them) or
 * POLICY[@CODEC][/OPTIMIZER], and may end with "+exact" (the paper-exact uniform codec). */
#ifndef MQGRAD_METHODS_H
#define MQGRAD_METHODS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char policy[64];    /* agent policy; "none" = fp32 */
    char codec[128];    /* codec spec, "" = the cluster's default (uniform, 512 per range) */
    char optimizer[64]; /* update rule, "" = sgd */
    bool exact;         /* the paper-exact codec (uniform, one range per tensor slice) */
} mq_method_t;

/* Resolves METHOD into *OUT; -1 with an error naming what is wrong. Checks the policy, codec
 * and rule specs. */
int mq_method_resolve(const char *method, mq_method_t *out);

/* One line per preset, for --help. */
void mq_method_help(char *buf, size_t len);

#endif
