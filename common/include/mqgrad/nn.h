/* The MQGrad paper's CNN (section 4.1) and a small model of the same layer kinds, forward and
 * backward on OpenBLAS. Parameters and gradients each live in one flat float array (the
 * cluster shards it by offset) with a named view per tensor. Input layout is NCHW. */
#ifndef MQGRAD_NN_H
#define MQGRAD_NN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mqgrad/data.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name; /* "conv1.w", "fc1.b", ... */
    size_t offset;    /* first element in the flat parameter array */
    size_t count;     /* elements */
} mq_tensor_view_t;

typedef struct mq_model_t mq_model_t;

/* ---- a model's layout: its tensors' names and sizes in order ---------------------------
 * What the cluster needs of a model it does not compute (a libmqgrad worker's): the servers
 * hold and update a layout model (mq_model_from_layout), the scheduler checks that every
 * worker of a run declares the same layout. */
#define MQ_LAYOUT_MAX 128 /* tensors */
#define MQ_LAYOUT_NAME 64 /* bytes of a name, its terminating zero included */
typedef struct {
    char name[MQ_LAYOUT_NAME];
    uint64_t count;
} mq_layout_entry_t;
typedef struct {
    uint32_t n;
    mq_layout_entry_t t[MQ_LAYOUT_MAX];
} mq_layout_t;

/* Checks L: 1..MQ_LAYOUT_MAX tensors, each with a unique, non-empty name of printable ASCII
 * without spaces and at least one element, fewer than 2^31 elements in all. Returns 0, or -1
 * with an error naming the first bad tensor. */
int mq_layout_check(const mq_layout_t *l);
/* Whether GOT equals the run's layout RUN: 0, or -1 with an error naming the first tensor
 * that differs (its name, its size, or one missing or extra). */
int mq_layout_compare(const mq_layout_t *run, const mq_layout_t *got);
/* The layout of built-in model NAME for C input channels; -1 with an error for a bad name. */
int mq_model_layout_of(const char *name, int channels, mq_layout_t *out);
/* The layout of M. */
void mq_model_layout(const mq_model_t *m, mq_layout_t *out);
/* A model of layout L (checked) and no layers: zeroed parameters and gradients with a view per
 * tensor, and nothing to compute (mq_model_grad returns NaN, mq_model_eval adds nothing,
 * mq_model_init leaves the zeros). Its name is "external". NULL with an error. */
mq_model_t *mq_model_from_layout(const mq_layout_t *l);
/* Whether tensor T's gradient is added onto what mq_model_grads holds (set_accumulate). */
bool mq_model_accumulates(const mq_model_t *m, size_t tensor);

/* Builds model NAME ("paper" or "small") for C input channels of 28x28 images, able to run
 * batches of up to MAX_BATCH, with L2 coefficient L2 on the big FC weights (fc1.w, fc2.w; the
 * paper's loss). Parameters are zero until mq_model_init. NULL with an error on a bad name. */
mq_model_t *mq_model_new(const char *name, int channels, int max_batch, float l2);
void mq_model_destroy(mq_model_t **self_p);
/* The parameters model NAME has for C input channels, without building it; 0 for a bad
 * name. */
size_t mq_model_count(const char *name, int channels);

const char *mq_model_name(const mq_model_t *m);
size_t mq_model_nparams(const mq_model_t *m);
size_t mq_model_ntensors(const mq_model_t *m);
const mq_tensor_view_t *mq_model_tensor(const mq_model_t *m, size_t i);
float *mq_model_params(mq_model_t *m);
float *mq_model_grads(mq_model_t *m);

/* Seeded initialization; the same seed gives the same parameters on every machine. */
void mq_model_init(mq_model_t *m, uint64_t seed);

/* Forward and backward on a batch: x is batch x C x 28 x 28, y holds labels 0..9. Writes the
 * gradient of (mean cross-entropy + L2 term) into mq_model_grads (adds it, for the tensors set
 * to accumulate) and returns that loss. */
float mq_model_grad(mq_model_t *m, const float *x, const uint8_t *y, int batch);

/* From the next mq_model_grad on, tensor TENSOR's gradient is added to what mq_model_grads
 * holds there (ON), or written over it (off, the default): error feedback keeps its residual
 * there, and the backward adds the gradient to it as it computes it (in the same pass, for
 * the fully connected weights, that adds the L2 term), so the encode reads one array. */
void mq_model_set_accumulate(mq_model_t *m, size_t tensor, bool on);

/* Forward only, in chunks of at most max_batch: adds the summed loss and the number of
 * correct predictions of the n examples to *loss_sum and *correct. */
void mq_model_eval(mq_model_t *m, const float *x, const uint8_t *y, int n, double *loss_sum,
                   long *correct);
/* mq_model_eval of examples LO .. HI of D (28x28 centre crops), made a chunk of BATCH at a time
 * in X (room for BATCH images; BATCH the model's max_batch, as the training batches' buffer
 * has): the same sums as over the whole range at once, without the range as floats. */
void mq_model_eval_data(mq_model_t *m, const mq_dataset_t *d, int lo, int hi, float *x,
                        int batch, double *loss_sum, long *correct);

/* Called during mq_model_grad once the gradient from flat index FROM to the end is final
 * (the fully connected layers come first in the backward pass; the convolutions' gradients,
 * before FROM, are still being computed): the caller may read, encode and send that part
 * while the rest of the backward runs (and write it: the backward does not read it again,
 * and error feedback in place leaves its residual there). Not called for a model whose
 * last tensors are not final early; the whole gradient is final when mq_model_grad returns. */
typedef void(mq_grad_ready_fn)(void *arg, size_t from);
void mq_model_on_grad_ready(mq_model_t *m, mq_grad_ready_fn *fn, void *arg);

/* w -= lr * g over n values. */
void mq_sgd_update(float *w, const float *g, size_t n, float lr);

/* The number of threads OpenBLAS may use (0 = its default). */
void mq_nn_set_threads(int threads);

/* OpenBLAS chooses its kernels when it loads, from the CPU's family and model, and a CPU newer
 * than the library gets its generic Prescott kernels: Debian 12's OpenBLAS 0.3.21 on an Intel
 * family 6 model 207 (5th-generation Xeon), whose training step then runs at under half the
 * speed of the AVX-512 kernels (bench/README.md). Call first in main, before any thread: if
 * OpenBLAS chose Prescott on a CPU with AVX2 and FMA, and OPENBLAS_CORETYPE is not set, it
 * runs this program again (its own binary, ARGV, the same environment) with
 * OPENBLAS_CORETYPE naming the kernels the CPU's features allow (SkylakeX or Haswell).
 *
 * It also runs the program again (once, with both settings) when OPENBLAS_THREAD_TIMEOUT is
 * not set and OpenBLAS would run more than one thread: by default OpenBLAS's idle threads
 * spin for 2^28 cycles (about 0.1 s) after every call, on the cores the model's own threads
 * (its fully connected layers) and the other processes of a cluster need next; set to 4, they
 * sleep at once and are woken by the next call.
 * Returns when there is nothing to do, or after a warning if running again failed. */
void mq_nn_pick_blas_core(char **argv);
#define MQ_NN_BLAS_TIMEOUT_ENV "OPENBLAS_THREAD_TIMEOUT"
#define MQ_NN_BLAS_TIMEOUT "4"
/* The name of the OpenBLAS kernels in use ("SkylakeX", "Haswell", "Zen", "Prescott", ...). */
const char *mq_nn_blas_core(void);

/* Profiling (bench_nn --layers). While SECONDS is set on a model, every mq_model_grad on the
 * calling thread adds the time of each stage of the step to seconds[stage]; NULL stops it.
 * The stages are the layers' parts in the order they run (mq_nn_stage_name); with profiling
 * off a step pays one test of a thread-local pointer per stage. */
enum { MQ_NN_NSTAGES = 22 };
const char *mq_nn_stage_name(int stage);
void mq_model_profile(mq_model_t *m, double *seconds);

#ifdef __cplusplus
}
#endif
#endif
