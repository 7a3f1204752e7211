/* Update rules as plug-ins: how a node turns the decoded mean gradient into a change of its
 * parameters. One table per rule, registered in common/src/ps/optim.c.
 *
 * Every worker and every server applies the same rule to the same decoded aggregate (the
 * bytes the server sent), so their parameters and the rule's state stay identical without
 * sending either: state costs memory on each node, never traffic. A spec is
 * NAME[:key=value,...], e.g. "sgd", "momentum:m=0.9", "qcmd:l1=1e-5", "qrda:l1=1e-5". */
#ifndef MQGRAD_OPTIM_H
#define MQGRAD_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MQ_OPTIM_NPARAMS 4
#define MQ_OPTIM_MAX_SPEC 64

typedef struct mq_optim_ops mq_optim_ops_t;

typedef struct {
    const mq_optim_ops_t *ops;
    double p[MQ_OPTIM_NPARAMS]; /* the rule's own (momentum, l1, delta, ...) */
} mq_optim_t;

struct mq_optim_ops {
    const char *name;
    const char *usage;
    const char *help;
    const char *keys[MQ_OPTIM_NPARAMS]; /* option names of p[0..], NULL-terminated early */
    double defaults[MQ_OPTIM_NPARAMS];
    double lo[MQ_OPTIM_NPARAMS], hi[MQ_OPTIM_NPARAMS]; /* each option's valid range */
    size_t state_per_value;                            /* floats of state per parameter */
    /* Updates w[0..n) with the mean gradient g[0..n) at learning rate lr; step t counts the
     * updates from 1. state (state_per_value * n floats) is zero before the first step. */
    void (*apply)(const mq_optim_t *o, float *w, const float *g, float *state, size_t n,
                  float lr, uint64_t t);
};

/* Parses SPEC into *OUT; -1 with an error naming the bad part. */
int mq_optim_parse(const char *spec, mq_optim_t *out);
/* Writes a spec that mq_optim_parse reads back. */
void mq_optim_format(const mq_optim_t *o, char *buf, size_t len);
/* True for plain SGD, which nodes apply fused with the decode (w -= lr * decode). */
bool mq_optim_is_sgd(const mq_optim_t *o);
/* Floats of state for n parameters. */
size_t mq_optim_state_floats(const mq_optim_t *o, size_t n);
/* One line per rule for a --help text. */
void mq_optim_help(char *buf, size_t len);
/* How many of w[0..n) are exactly zero (the model sparsity the l1 rules aim at). */
uint64_t mq_optim_count_zeros(const float *w, size_t n);

#ifdef __cplusplus
}
#endif
#endif
