/* Private interface of the nn module: the layer kernels and the network, compiled twice from
 * nn_layers.inc / nn_net.inc, once in float (the suffix _f: what the model runs) and once in
 * double (_d: what the gradient-check tests run against finite differences). Tests include
 * this header through "../common/src/nn/nn_internal.h".
 *
 * Layouts. The public input is NCHW. Inside the convolutional stack activations are CNHW
 * (channel-major, the batch inside each channel): one sgemm per convolution then writes its
 * output K x (N*H*W) directly, with no transpose. Convolution weights are K x C x 5 x 5;
 * fully connected weights are In x Out (row-major, the paper's [3136, 2304] shapes). */
#ifndef MQGRAD_NN_INTERNAL_H
#define MQGRAD_NN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "mqgrad/nn.h"
#include "mqgrad/util.h"

/* Marks a float loop of element-wise work (nn_float.c's kernels, SGD) to be built for
 * baseline x86-64 (SSE2: 4 floats a step) and cloned for AVX2 and AVX-512 (8 and 16 a step),
 * the clone chosen when the library loads. No clone contracts a*b+c into an FMA
 * (common/CMakeLists.txt: -ffp-contract=off) and no such loop reduces across lanes, so every
 * clone gives the same bits. On an Intel Xeon (family 6, model 207) the AVX-512 clones speed
 * up the LRN passes and the paper model's SGD update; on an AMD EPYC with AVX-512 such clones
 * measured a little slower over the whole step (bench/README.md, bench_nn). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MQ_NN_WIDE __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MQ_NN_WIDE
#endif

/* Local response normalization as in AlexNet / TensorFlow's cifar10 example:
 * b_c = a_c / (bias + alpha * sum_{|c'-c| <= radius} a_c'^2)^beta. */
#define MQ_LRN_RADIUS 4
#define MQ_LRN_BIAS 1.0
#define MQ_LRN_ALPHA (0.001 / 9.0)
#define MQ_LRN_BETA 0.75

/* The stages of a training step (mq_nn_stage_name), timed while profiling is on. */
enum {
    MQ_ST_C1_IM2COL,
    MQ_ST_C1_GEMM,
    MQ_ST_P1,
    MQ_ST_N1,
    MQ_ST_C2_IM2COL,
    MQ_ST_C2_GEMM,
    MQ_ST_R2,
    MQ_ST_N2,
    MQ_ST_P2,
    MQ_ST_FC_FWD,
    MQ_ST_SOFTMAX,
    MQ_ST_FC3_BWD,
    MQ_ST_FC2_BWD,
    MQ_ST_FC1_BWD,
    MQ_ST_P2_BWD,
    MQ_ST_N2_BWD,
    MQ_ST_C2_DW,
    MQ_ST_C2_DX,
    MQ_ST_N1_BWD,
    MQ_ST_P1_BWD,
    MQ_ST_C1_DW,
    MQ_ST_OTHER
};
/* The profile of the step running on this thread (NULL: off) and the time of its last mark. */
extern _Thread_local double *mq_nn_prof;
extern _Thread_local double mq_nn_prof_t;
/* Charges the time since the last mark to STAGE. */
static inline void mq_nn_mark(int stage)
{
    if (mq_nn_prof) {
        double t = mq_now_s();
        mq_nn_prof[stage] += t - mq_nn_prof_t;
        mq_nn_prof_t = t;
    }
}

#define MQ_IMG 28        /* input side */
#define MQ_KSIZE 5       /* convolution kernel side, SAME padding 2 */
#define MQ_NCLASS 10
#define MQ_NTENSORS 10

/* The shape of a model: C input channels, K1 and K2 convolution channels, H1 and H2 hidden
 * units of the first two fully connected layers, and the L2 coefficient on fc1.w and fc2.w. */
typedef struct {
    int c, k1, k2, h1, h2;
    double l2;
} mq_arch_t;

/* Fills ARCH for model NAME ("paper", "small"); -1 with an error on an unknown name. */
int mq_arch_for(const char *name, int channels, double l2, mq_arch_t *arch);
/* The ten tensor views (conv1.w ... fc3.b, in that order) and the total parameter count. */
size_t mq_arch_views(const mq_arch_t *arch, mq_tensor_view_t views[MQ_NTENSORS]);
/* Output side of a 3x3 stride-2 SAME max-pool: ceil(h / 2). */
int mq_pool_out(int h);

#define MQ_NN_DECLARE(real, sfx)                                                              \
    /* x (n,c,h,w) at x[n*sn + c*sc + h*W + w]; y is K x N x H x W; col (C*25) x (N*H*W). */ \
    void mq_conv_forward_##sfx(const real *x, int n, int c, int h, int w, size_t sn,          \
                               size_t sc, const real *wt, const real *b, int k, real *col,   \
                               real *y);                                                      \
    /* From dy (K x N*H*W) and the forward's col: dw, db (overwritten) and, if dx is not     \
     * NULL, dx in x's layout (overwritten; dcol is scratch of col's size). */                \
    void mq_conv_backward_##sfx(const real *dy, int n, int c, int h, int w, size_t sn,        \
                                size_t sc, const real *wt, int k, const real *col, real *dw,  \
                                real *db, real *dcol, real *dx);                              \
    void mq_relu_forward_##sfx(real *x, size_t n);                                            \
    /* dy *= (y > 0), y the forward's output. */                                              \
    void mq_relu_backward_##sfx(const real *y, real *dy, size_t n);                           \
    /* planes of h x w -> planes of ceil(h/2) x ceil(w/2); arg holds the argmax. */           \
    void mq_pool_forward_##sfx(const real *x, int planes, int h, int w, real *y, int32_t *arg);\
    void mq_pool_backward_##sfx(const real *dy, const int32_t *arg, int planes, int h, int w, \
                                real *dx);                                                    \
    /* c channels of s positions each (channel stride s); scale (2 x c x s) keeps the two    \
     * powers of the denominators d the backward needs, d^-beta and d^(-beta-1). */         \
    void mq_lrn_forward_##sfx(const real *x, int c, size_t s, real *scale, real *y);          \
    void mq_lrn_backward_##sfx(const real *x, const real *scale, const real *dy, int c,       \
                               size_t s, real *tmp, real *dx);                                 \
    /* y (n x out) = x (n x in) * w (in x out) + b. */                                        \
    void mq_fc_forward_##sfx(const real *x, int n, int in, int out, const real *wt,           \
                             const real *b, real *y);                                         \
    void mq_fc_backward_##sfx(const real *x, const real *dy, int n, int in, int out,          \
                              const real *wt, real *dw, real *db, real *dx);                  \
    /* Mean cross-entropy of softmax(z) (n x k) against y; dz = d(mean)/dz if not NULL;      \
     * adds the correct predictions to *correct if not NULL. Returns the summed loss. */      \
    double mq_softmax_ce_##sfx(const real *z, const uint8_t *y, int n, int k, real *dz,       \
                               long *correct);                                                \
    /* Returns l2 * 0.5 * sum(w^2) and adds l2 * w to dw. */                                  \
    double mq_l2_##sfx(const real *w, size_t n, double l2, real *dw);                         \
    typedef struct mq_net_##sfx##_t mq_net_##sfx##_t;                                        \
    mq_net_##sfx##_t *mq_net_new_##sfx(const mq_arch_t *arch, int max_batch);                 \
    void mq_net_destroy_##sfx(mq_net_##sfx##_t **self_p);                                     \
    /* Forward and backward over a batch of n <= max_batch; returns mean CE + L2 term. Calls \
     * ready (if not NULL) once the fully connected layers' gradients are final. */          \
    double mq_net_grad_##sfx(mq_net_##sfx##_t *net, const real *params, real *grads,          \
                             const real *x, const uint8_t *y, int n, mq_grad_ready_fn *ready, \
                             void *ready_arg);                                                \
    /* From the next mq_net_grad on, TENSOR's gradient is added to what grads holds there     \
     * (ON) or written over it (off, the default). */                                         \
    void mq_net_accumulate_##sfx(mq_net_##sfx##_t *net, size_t tensor, bool on);              \
    /* Forward only; adds summed CE and correct predictions. */                               \
    void mq_net_eval_##sfx(mq_net_##sfx##_t *net, const real *params, const real *x,          \
                           const uint8_t *y, int n, double *loss_sum, long *correct);

MQ_NN_DECLARE(float, f)

/* Threads (pool.c). The model runs its own loops on as many threads as OpenBLAS is set to
 * (mq_nn_set_threads), but only when OpenBLAS's idle threads sleep (OPENBLAS_THREAD_TIMEOUT at
 * most 16, as mq_nn_pick_blas_core sets it): spinning, as they do for 2^28 cycles after each
 * call by default, they hold the cores a helper would need, and a split gained nothing
 * (measured: the same time as one thread). mq_nn_parts() is the number of parts a job should
 * be split into (1 if not). mq_nn_parallel runs fn(arg, i, parts) for i in 0..parts-1, part 0
 * on the caller, and returns when all are done; with fewer helpers than asked for (none could
 * start), or OpenBLAS's threads spinning, it runs fewer parts (part numbers stay below the
 * parts asked for). Jobs split into parts that write disjoint outputs and sum in the same
 * order whatever the split, so results do not depend on the thread count. mq_nn_share is
 * part `part` of `parts` of count units: [*lo, *hi). */
typedef void mq_nn_part_fn(void *arg, int part, int parts);
int mq_nn_parts(void);
/* The parts for a job of COUNT units of about EACH values: mq_nn_parts(), at most COUNT, and
 * 1 under MQ_NN_PAR_MIN values (the small test model's layers, where waking a thread costs
 * more than it saves). */
#define MQ_NN_PAR_MIN ((size_t)1 << 16)
int mq_nn_parts_for(size_t count, size_t each);
void mq_nn_parallel(mq_nn_part_fn *fn, void *arg, int parts);
/* As mq_nn_parallel, for parts that call OpenBLAS: OpenBLAS is set to one thread for the job
 * (and back after), so each part's products run on that part's thread, side by side. One
 * part (PARTS <= 1, or OpenBLAS on one thread) runs on the caller with OpenBLAS as it is. */
void mq_nn_parallel_blas(mq_nn_part_fn *fn, void *arg, int parts);
void mq_nn_share(int count, int part, int parts, int *lo, int *hi);

/* fc_x86.c: the fully connected products in float for a small batch, with AVX-512 or AVX2
 * and FMA. mq_fc_kind() says which run: the best set the CPU has, unless MQGRAD_NN_FC says
 * "blas" (sgemm) or "avx2" (not AVX-512); mq_fc_fast() is true unless sgemm. mq_fc_use()
 * makes KIND the one used (tests), false where the CPU lacks it. They split over
 * mq_nn_parts_for() threads.
 * mq_fc_fast_forward: y += x w (sgemm where the kernels cannot run, or out narrower than a
 * tile: 48 columns with AVX-512, 24 with AVX2).
 * mq_fc_fast_backward_l2: dw = x^T dy + l2 w (added to dw with ACC), dx = dy w^T (dx may be
 * NULL); returns l2 * 0.5 * sum(w^2), or -1 (nothing written) where the kernels cannot run or
 * without scratch memory. */
typedef enum { MQ_FC_BLAS, MQ_FC_AVX2, MQ_FC_AVX512 } mq_fc_kind_t;
mq_fc_kind_t mq_fc_kind(void);
bool mq_fc_use(mq_fc_kind_t kind);
bool mq_fc_fast(void);
/* nn.c: whether conv2's forward product is taken transposed (s_conv_forward): with
 * OpenBLAS's AVX-512 kernels (SkylakeX and its successors), which run that form faster for
 * conv2's shape; its Haswell kernels (AMD's Zen cores too) run the direct form faster
 * (bench/README.md). Fixed for a machine, so the same seed and threads still give the same
 * bits. */
bool mq_nn_conv_transposed(void);
/* conv_x86.c: col2im in float with AVX-512 or AVX2 (as mq_fc_kind()), the portable loop's
 * sums bit for bit; mq_conv_fast(h, w) is true when it is used for h x w planes. */
bool mq_conv_fast(int h, int w);
void mq_conv_fast_col2im(const float *col, size_t ld, int n, int c, int h, int w, size_t sn,
                         size_t sc, float *x);
/* im2col in float with AVX-512 or AVX2 (as mq_fc_kind()), the portable loop's columns;
 * false, with nothing written, where it does not run (sgemm's kind, or images not one after
 * another: sn != h * w). */
bool mq_conv_fast_im2col(const float *x, int n, int c, int h, int w, size_t sn, size_t sc,
                         float *col, size_t ld);
/* Max-pooling's forward (mq_pool_forward_f) with AVX-512 or AVX2 (as mq_fc_kind()), its
 * results bit for bit; false, with nothing written, where it cannot run (neither set, or
 * planes wider than 32). */
bool mq_conv_fast_pool(const float *x, int planes, int h, int w, float *y, int32_t *arg);
void mq_fc_fast_forward(const float *x, int n, int in, int out, const float *wt, float *y);
double mq_fc_fast_backward_l2(const float *x, const float *dy, int n, int in, int out,
                              const float *wt, float l2, float *dw, float *dx, bool acc);
MQ_NN_DECLARE(double, d)

#endif
