/* libmqgrad: the worker's side of an mqgrad cluster as a library, with no model in it.
 *
 * A program that has a model of its own (a PyTorch script through the Python package, or C)
 * joins a cluster with the tensors it trains, then runs the rounds the scheduler issues:
 *
 *     mqgrad_t *w = mqgrad_join(argc, argv, tensors, n, initial_values);
 *     mqgrad_step_t st;
 *     while (mqgrad_next(w, &st) == 1) {           // the round's parameters are in place
 *         loss = forward_backward(mqgrad_params(w), mqgrad_grads(w), st);
 *         mqgrad_push(w, loss);                    // quantize, push, apply the aggregates
 *         if (st.evaluate)
 *             mqgrad_evaluated(w, correct, total, loss_sum);
 *     }
 *     return mqgrad_leave(&w);
 *
 * The parameters and gradients live in two flat float32 arrays the library owns, tensor after
 * tensor in the declared order; the caller computes in place in them (a PyTorch binding makes
 * its tensors views of them), so nothing is copied between the model and the network.
 * Everything else is the C worker's: the codec and error feedback, the update rule, joining
 * late (the parameters are pulled from the servers), leaving on SIGTERM, heartbeats, tokens
 * and CURVE keys, metrics. The run's update rule is applied by the library on every replica
 * and on the servers' master copies alike, so every replica stays equal to them.
 *
 * Every call is made from one thread. Errors: a NULL or -1 return, and mqgrad_error says
 * why. */
#ifndef MQGRAD_MQGRAD_H
#define MQGRAD_MQGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MQGRAD_API_VERSION 1
/* A tensor's name is at most this many bytes (its terminating zero not counted). */
#define MQGRAD_NAME_MAX 63
/* Tensors a model may declare. */
#define MQGRAD_TENSORS_MAX 128

typedef struct mqgrad mqgrad_t;

typedef struct {
    const char *name; /* unique, printable, at most MQGRAD_NAME_MAX bytes */
    uint64_t count;   /* elements, at least 1 */
} mqgrad_tensor_t;

/* The run, as the scheduler's WELCOME gave it. */
typedef struct {
    uint32_t rank;        /* this worker's rank, 0 .. workers - 1 */
    uint32_t workers;     /* the rank space: the most workers the run holds */
    uint32_t servers;
    uint32_t batch;       /* examples per worker per round */
    uint64_t seed;        /* the run's seed */
    char model[16];       /* "external", or the built-in model the run was started with */
    char dataset[16];     /* the data set the run was started with */
    char codec[128];      /* the quantized tensors' codec, without a level */
    char optimizer[64];   /* the update rule every replica applies */
    uint64_t threshold;   /* tensors with at least this many elements are quantized */
    float l2;             /* the run's L2 coefficient (the built-in models put it on their
                           * big fully connected weights; a caller's model may ignore it) */
} mqgrad_run_t;

/* One round to compute. */
typedef struct {
    uint64_t iter;        /* the round, from 0 */
    uint32_t member;      /* this worker's index in the round's member set */
    uint32_t members;     /* the member set's size */
    uint64_t cursor;      /* the run's data position: this member takes the examples at
                           * positions cursor + member*batch .. + batch - 1 of the run's
                           * sequence (mqgrad_examples) */
    int bits;             /* the round's bit-width (32: fp32) */
    float lr;             /* the round's learning rate */
    int evaluate;         /* after mqgrad_push, evaluate and call mqgrad_evaluated */
    uint32_t eval_limit;  /* the evaluation's test examples in total, over the members (0:
                           * all); this member takes its share, [limit*member/members,
                           * limit*(member+1)/members) */
} mqgrad_step_t;

/* Joins the cluster: reads the same flags and MQGRAD_* variables as mqgrad-worker
 * (--scheduler, --peer-timeout, --iter-timeout, the key flags, --http-port; ARGC 0 and ARGV
 * NULL: the variables only), registers with the model's layout TENSORS[0..N) and waits, at
 * most the peer timeout, for the scheduler's answer. A run whose layout came from another
 * worker, or a built-in model's run, refuses a layout that differs, naming the first tensor
 * that differs. INIT, NULL or the model's initial values (every element, in order), is copied
 * in: the run's first worker gives the servers their starting values; every worker then
 * starts from the servers' copy. NULL with the reason in mqgrad_error(NULL). */
mqgrad_t *mqgrad_join(int argc, char **argv, const mqgrad_tensor_t *tensors, size_t n,
                      const float *init);

/* The run's configuration. */
const mqgrad_run_t *mqgrad_run(const mqgrad_t *w);
size_t mqgrad_nparams(const mqgrad_t *w);
/* The flat parameters: the values to compute the next round with (mqgrad_next) and the
 * updated values after mqgrad_push. */
float *mqgrad_params(mqgrad_t *w);
/* The flat gradient the caller fills before mqgrad_push. A tensor for which
 * mqgrad_accumulates says 1 (error feedback: its residual lives there) must have its gradient
 * added to what the array holds, not written over it. */
float *mqgrad_grads(mqgrad_t *w);
int mqgrad_accumulates(const mqgrad_t *w, size_t tensor);
/* For a caller whose backward adds its gradient onto the array (autograd does, onto a .grad
 * that exists) rather than writing it: ON 1 asks that every tensor for which
 * mqgrad_accumulates says 0 be zero in mqgrad_grads when mqgrad_next hands over a round, as
 * mqgrad_push left it (a value written there after mqgrad_push stays). The library zeroes
 * what it has read while encoding it, in cache, so the caller needs no pass of its own over
 * the array; the first round, and one the worker missed, are zeroed whole. Off (0) by
 * default: a caller that writes its gradient over needs none. Between rounds only. Returns
 * 0, or -1 (mqgrad_error). */
int mqgrad_zero_grads(mqgrad_t *w, int on);

/* Waits for the next round this worker is a member of (pulling the parameters first when it
 * is not in step), at most the peer timeout of silence. Returns 1 with STEP filled, 0 when
 * the run is over, or -1 when the worker failed or was stopped (mqgrad_error). */
int mqgrad_next(mqgrad_t *w, mqgrad_step_t *step);

/* Optional, during a round's backward pass: every gradient value at flat offset FROM and
 * after is final for this round. The servers' shards that lie wholly there are encoded and
 * pushed at once, by the library's thread, while the caller computes the rest (the earlier
 * tensors, which a backward pass finishes last): the network overlaps the computation, as
 * the C worker's pushes from inside its backward pass do. The caller must not write there
 * again before mqgrad_push. The parameters do not change before mqgrad_push, even when the
 * servers answer first. Call it with FROM falling as tensors finish; it does not wait.
 * Returns 0, or -1 outside a round or with FROM beyond the parameters. */
int mqgrad_ready(mqgrad_t *w, size_t from);

/* The round's gradient is in mqgrad_grads and LOSS is its loss: pushes what mqgrad_ready has
 * not, waits for every server's aggregate (at most --iter-timeout) and applies them to
 * mqgrad_params. Returns 0, or -1 (mqgrad_error). */
int mqgrad_push(mqgrad_t *w, double loss);

/* After a round with evaluate: this member's share of the test examples gave CORRECT right
 * of TOTAL with summed loss LOSS_SUM. The round's report waits for it. Returns 0 or -1. */
int mqgrad_evaluated(mqgrad_t *w, uint64_t correct, uint64_t total, double loss_sum);

/* The examples of positions POS .. POS + N - 1 of the run's sequence over a training set of
 * SIZE examples, into OUT[0..N): position p is example perm_e[p mod SIZE] of epoch
 * e = p / SIZE, perm_e the run's seeded permutation of epoch e, the one the C workers use, so
 * the members of a round take disjoint examples and an epoch takes each example once whoever
 * joins or leaves. A round's member takes POS = step.cursor + step.member * run.batch,
 * N = run.batch. Returns 0, or -1 (SIZE 0, or out of memory). */
int mqgrad_examples(mqgrad_t *w, uint64_t size, uint64_t pos, size_t n, int64_t *out);

/* Why the last call failed ("" if none); W may be NULL (a failed mqgrad_join). A wait that
 * a signal interrupts (the caller's Ctrl-C or SIGTERM) fails, saying so, so the caller's own
 * handling runs. */
const char *mqgrad_error(const mqgrad_t *w);
/* The exit code the last failed mqgrad_join of this thread means for the process, as
 * mqgrad_leave's: 4 when the scheduler refused the worker (its model is not the run's, the
 * run is over, no rank is free: starting it again as it is cannot help), else 1. */
int mqgrad_join_code(void);

/* Leaves the cluster (the scheduler takes the worker out at once when the run is not over)
 * and frees W, NULLing *W_P. Returns the exit code a worker process should end with, as
 * mqgrad-worker's: 0 (the run is over, or the worker left it), 1 (it failed), 4 (the
 * scheduler refused it: not to be started again as it is). Safe on NULL. */
int mqgrad_leave(mqgrad_t **w_p);

#ifdef __cplusplus
}
#endif
#endif
