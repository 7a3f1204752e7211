/* The public model: the architecture table, the flat parameter and gradient arrays with their
 * named views, seeded initialization, SGD and the OpenBLAS thread count. The arithmetic is in
 * nn_layers.inc / nn_net.inc (compiled in float by nn_float.c). */
/* SGD touches every parameter each step: let it vectorize (results unchanged). */
#pragma GCC optimize("tree-vectorize")

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cblas.h>

#include "mqgrad/nn.h"
#include "mqgrad/util.h"
#include "nn_internal.h"

struct mq_model_t {
    char name[16];
    mq_arch_t arch;
    mq_tensor_view_t *views; /* builtin_, or one per tensor of layout */
    size_t nviews;
    mq_tensor_view_t builtin_[MQ_NTENSORS];
    mq_layout_t *layout; /* a layout model's (mq_model_from_layout): no net */
    bool accumulate[MQ_LAYOUT_MAX]; /* mq_model_set_accumulate's */
    size_t nparams;
    float *params, *grads;
    mq_net_f_t *net;
    double *prof; /* mq_model_profile */
    mq_grad_ready_fn *ready;
    void *ready_arg;
};

_Thread_local double *mq_nn_prof;
_Thread_local double mq_nn_prof_t;

static const char *s_stage_names[MQ_NN_NSTAGES] = {
    [MQ_ST_C1_IM2COL] = "conv1 im2col",
    [MQ_ST_C1_GEMM] = "conv1 gemm+bias",
    [MQ_ST_P1] = "relu1+pool1",
    [MQ_ST_N1] = "lrn1",
    [MQ_ST_C2_IM2COL] = "conv2 im2col",
    [MQ_ST_C2_GEMM] = "conv2 gemm+bias",
    [MQ_ST_R2] = "relu2",
    [MQ_ST_N2] = "lrn2",
    [MQ_ST_P2] = "pool2+flatten",
    [MQ_ST_FC_FWD] = "fc1-3 gemm+relu",
    [MQ_ST_SOFTMAX] = "softmax+loss",
    [MQ_ST_FC3_BWD] = "fc3 bwd gemm",
    [MQ_ST_FC2_BWD] = "fc2 bwd + l2",
    [MQ_ST_FC1_BWD] = "fc1 bwd + l2",
    [MQ_ST_P2_BWD] = "pool2 bwd+unflatten",
    [MQ_ST_N2_BWD] = "lrn2+relu2 bwd",
    [MQ_ST_C2_DW] = "conv2 dw gemm+db",
    [MQ_ST_C2_DX] = "conv2 dx gemm+col2im",
    [MQ_ST_N1_BWD] = "lrn1 bwd",
    [MQ_ST_P1_BWD] = "pool1+relu1 bwd",
    [MQ_ST_C1_DW] = "conv1 dw gemm+db",
    [MQ_ST_OTHER] = "other",
};

const char *mq_nn_stage_name(int stage)
{
    return stage >= 0 && stage < MQ_NN_NSTAGES ? s_stage_names[stage] : "?";
}

void mq_model_on_grad_ready(mq_model_t *m, mq_grad_ready_fn *fn, void *arg)
{
    m->ready = fn;
    m->ready_arg = arg;
}

void mq_model_profile(mq_model_t *m, double *seconds)
{
    m->prof = seconds;
}

static const char *s_names[MQ_NTENSORS] = {"conv1.w", "conv1.b", "conv2.w", "conv2.b",
                                           "fc1.w",   "fc1.b",   "fc2.w",   "fc2.b",
                                           "fc3.w",   "fc3.b"};

int mq_pool_out(int h)
{
    return (h + 1) / 2;
}

/* paper: the MQGrad network of section 4.1 (conv 5x5x64 twice, FC 3136-2304-3840-10).
 * small: the same layer kinds with 8 and 16 channels and FC 784-64-32-10, for tests. */
int mq_arch_for(const char *name, int channels, double l2, mq_arch_t *arch)
{
    if (channels < 1 || channels > 16) {
        mq_err_set("model input channels must be 1..16, got %d", channels);
        return -1;
    }
    if (name && strcmp(name, "paper") == 0)
        *arch = (mq_arch_t){channels, 64, 64, 2304, 3840, l2};
    else if (name && strcmp(name, "small") == 0)
        *arch = (mq_arch_t){channels, 8, 16, 64, 32, l2};
    else {
        mq_err_set("unknown model '%s' (expected paper or small)", name ? name : "(null)");
        return -1;
    }
    return 0;
}

size_t mq_arch_views(const mq_arch_t *a, mq_tensor_view_t views[MQ_NTENSORS])
{
    const size_t counts[MQ_NTENSORS] = {
        (size_t)a->k1 * a->c * 25, (size_t)a->k1, (size_t)a->k2 * a->k1 * 25, (size_t)a->k2,
        (size_t)a->k2 * 49 * a->h1, (size_t)a->h1, (size_t)a->h1 * a->h2, (size_t)a->h2,
        (size_t)a->h2 * MQ_NCLASS, MQ_NCLASS};
    size_t off = 0;
    for (int i = 0; i < MQ_NTENSORS; i++) {
        views[i] = (mq_tensor_view_t){s_names[i], off, counts[i]};
        off += counts[i];
    }
    return off;
}

mq_model_t *mq_model_new(const char *name, int channels, int max_batch, float l2)
{
    if (max_batch < 1 || max_batch > 65536) {
        mq_err_set("max batch must be 1..65536, got %d", max_batch);
        return NULL;
    }
    mq_model_t *m = calloc(1, sizeof *m);
    if (!m) {
        mq_err_set("out of memory");
        return NULL;
    }
    if (mq_arch_for(name, channels, l2, &m->arch) < 0)
        goto err;
    snprintf(m->name, sizeof m->name, "%s", name);
    m->views = m->builtin_;
    m->nviews = MQ_NTENSORS;
    m->nparams = mq_arch_views(&m->arch, m->views);
    m->params = calloc(m->nparams, sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    if (!m->params || !m->grads) {
        mq_err_set("out of memory for %zu parameters", m->nparams);
        goto err;
    }
    m->net = mq_net_new_f(&m->arch, max_batch);
    if (!m->net)
        goto err;
    return m;
err:
    mq_model_destroy(&m);
    return NULL;
}

size_t mq_model_count(const char *name, int channels)
{
    mq_arch_t arch;
    mq_tensor_view_t views[MQ_NTENSORS];
    return mq_arch_for(name, channels, 0, &arch) < 0 ? 0 : mq_arch_views(&arch, views);
}

void mq_model_destroy(mq_model_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_model_t *m = *self_p;
    mq_net_destroy_f(&m->net);
    if (m->layout) {
        free(m->views);
        free(m->layout);
    }
    free(m->params);
    free(m->grads);
    free(m);
    *self_p = NULL;
}

const char *mq_model_name(const mq_model_t *m)
{
    return m->name;
}

size_t mq_model_nparams(const mq_model_t *m)
{
    return m->nparams;
}

size_t mq_model_ntensors(const mq_model_t *m)
{
    return m->nviews;
}

const mq_tensor_view_t *mq_model_tensor(const mq_model_t *m, size_t i)
{
    return i < m->nviews ? &m->views[i] : NULL;
}

/* ---- layouts ----------------------------------------------------------------------------- */

int mq_layout_check(const mq_layout_t *l)
{
    if (l->n < 1 || l->n > MQ_LAYOUT_MAX) {
        mq_err_set("a model has 1 to %d tensors, this one %u", MQ_LAYOUT_MAX, l->n);
        return -1;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        const mq_layout_entry_t *e = &l->t[i];
        size_t len = strnlen(e->name, MQ_LAYOUT_NAME);
        if (len == 0 || len == MQ_LAYOUT_NAME) {
            mq_err_set("tensor %u: a name has 1 to %d bytes", i, MQ_LAYOUT_NAME - 1);
            return -1;
        }
        for (size_t k = 0; k < len; k++)
            if (e->name[k] <= ' ' || e->name[k] > '~') {
                mq_err_set("tensor %u ('%.*s'): a name is printable ASCII without spaces", i,
                           (int)len, e->name);
                return -1;
            }
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(l->t[j].name, e->name) == 0) {
                mq_err_set("tensors %u and %u are both named '%s'", j, i, e->name);
                return -1;
            }
        if (e->count < 1 || e->count >= (1ULL << 31) - total) {
            mq_err_set("tensor '%s': %llu elements (a model holds 1 to 2^31 - 1 in all)",
                       e->name, (unsigned long long)e->count);
            return -1;
        }
        total += e->count;
    }
    return 0;
}

int mq_layout_compare(const mq_layout_t *run, const mq_layout_t *got)
{
    for (uint32_t i = 0; i < run->n || i < got->n; i++) {
        if (i >= got->n) {
            mq_err_set("the run's tensor %u '%s' (%llu elements) is missing", i, run->t[i].name,
                       (unsigned long long)run->t[i].count);
            return -1;
        }
        if (i >= run->n) {
            mq_err_set("tensor %u '%s' is one the run does not have (it has %u tensors)", i,
                       got->t[i].name, run->n);
            return -1;
        }
        if (strcmp(run->t[i].name, got->t[i].name) != 0) {
            mq_err_set("tensor %u is '%s', the run's is '%s'", i, got->t[i].name,
                       run->t[i].name);
            return -1;
        }
        if (run->t[i].count != got->t[i].count) {
            mq_err_set("tensor %u '%s' has %llu elements, the run's has %llu", i, got->t[i].name,
                       (unsigned long long)got->t[i].count,
                       (unsigned long long)run->t[i].count);
            return -1;
        }
    }
    return 0;
}

static void s_views_layout(const mq_tensor_view_t *v, size_t n, mq_layout_t *out)
{
    out->n = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        snprintf(out->t[i].name, sizeof out->t[i].name, "%s", v[i].name);
        out->t[i].count = v[i].count;
    }
}

int mq_model_layout_of(const char *name, int channels, mq_layout_t *out)
{
    mq_arch_t arch;
    mq_tensor_view_t views[MQ_NTENSORS];
    if (mq_arch_for(name, channels, 0, &arch) < 0)
        return -1;
    mq_arch_views(&arch, views);
    s_views_layout(views, MQ_NTENSORS, out);
    return 0;
}

void mq_model_layout(const mq_model_t *m, mq_layout_t *out)
{
    s_views_layout(m->views, m->nviews, out);
}

mq_model_t *mq_model_from_layout(const mq_layout_t *l)
{
    if (mq_layout_check(l) != 0)
        return NULL;
    mq_model_t *m = calloc(1, sizeof *m);
    if (!m) {
        mq_err_set("out of memory");
        return NULL;
    }
    snprintf(m->name, sizeof m->name, "external");
    m->layout = malloc(sizeof *m->layout);
    m->views = calloc(l->n, sizeof *m->views);
    if (!m->layout || !m->views)
        goto oom;
    *m->layout = *l;
    m->nviews = l->n;
    for (uint32_t i = 0; i < l->n; i++) {
        m->views[i] = (mq_tensor_view_t){m->layout->t[i].name, m->nparams, l->t[i].count};
        m->nparams += l->t[i].count;
    }
    m->params = calloc(m->nparams, sizeof(float));
    m->grads = calloc(m->nparams, sizeof(float));
    if (!m->params || !m->grads)
        goto oom;
    return m;
oom:
    mq_err_set("out of memory for a model of %zu parameters", m->nparams);
    mq_model_destroy(&m);
    return NULL;
}

bool mq_model_accumulates(const mq_model_t *m, size_t tensor)
{
    return tensor < m->nviews && m->accumulate[tensor];
}

float *mq_model_params(mq_model_t *m)
{
    return m->params;
}

float *mq_model_grads(mq_model_t *m)
{
    return m->grads;
}

/* Weights: He initialization, a normal truncated at two standard deviations (redrawn
 * beyond) with std = sqrt(2 / fan_in) for the layers followed by a ReLU and sqrt(1 / fan_in)
 * for fc3 (the logits). Biases: zero. Draws go tensor by tensor in the flat order, so the
 * result depends on the seed only. */
void mq_model_init(mq_model_t *m, uint64_t seed)
{
    if (m->layout)
        return; /* its values come from its owner (a libmqgrad worker's SEED) */
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    const mq_arch_t *a = &m->arch;
    const double fan_in[MQ_NTENSORS] = {a->c * 25.0,   0, a->k1 * 25.0, 0, a->k2 * 49.0, 0,
                                        (double)a->h1, 0, (double)a->h2, 0};
    for (int t = 0; t < MQ_NTENSORS; t++) {
        float *w = m->params + m->views[t].offset;
        if (fan_in[t] == 0) {
            memset(w, 0, m->views[t].count * sizeof(float));
            continue;
        }
        double sd = sqrt((t == 8 ? 1.0 : 2.0) / fan_in[t]);
        for (size_t i = 0; i < m->views[t].count; i++) {
            double z;
            do
                z = mq_rng_normal(&rng);
            while (fabs(z) > 2.0);
            w[i] = (float)(sd * z);
        }
    }
}

float mq_model_grad(mq_model_t *m, const float *x, const uint8_t *y, int batch)
{
    if (!m->net)
        return NAN;
    mq_nn_prof = m->prof;
    mq_nn_prof_t = m->prof ? mq_now_s() : 0;
    float loss =
        (float)mq_net_grad_f(m->net, m->params, m->grads, x, y, batch, m->ready, m->ready_arg);
    mq_nn_prof = NULL;
    return loss;
}

void mq_model_set_accumulate(mq_model_t *m, size_t tensor, bool on)
{
    if (tensor >= m->nviews)
        return;
    m->accumulate[tensor] = on;
    if (m->net)
        mq_net_accumulate_f(m->net, tensor, on);
}

void mq_model_eval(mq_model_t *m, const float *x, const uint8_t *y, int n, double *loss_sum,
                   long *correct)
{
    if (m->net)
        mq_net_eval_f(m->net, m->params, x, y, n, loss_sum, correct);
}

void mq_model_eval_data(mq_model_t *m, const mq_dataset_t *d, int lo, int hi, float *x,
                        int batch, double *loss_sum, long *correct)
{
    for (int at = lo; at < hi; at += batch) {
        int n = hi - at < batch ? hi - at : batch;
        mq_dataset_export28(d, at, n, x);
        mq_model_eval(m, x, d->labels + at, n, loss_sum, correct);
    }
}

typedef struct {
    float *w;
    const float *g;
    size_t n;
    float lr;
} s_sgd_t;

/* Bound by memory: wider vectors keep more of its bandwidth busy from one core. */
MQ_NN_WIDE static void s_sgd_part(void *arg, int part, int parts)
{
    const s_sgd_t *j = arg;
    /* whole cache lines to each part */
    size_t lo = j->n / 16 * part / parts * 16,
           hi = part + 1 == parts ? j->n : j->n / 16 * (part + 1) / parts * 16;
    float *restrict wr = j->w;
    const float *restrict gr = j->g;
    for (size_t i = lo; i < hi; i++)
        wr[i] -= j->lr * gr[i];
}

/* Bound by memory (two reads and a write a value): a second thread brings more of it. */
void mq_sgd_update(float *w, const float *g, size_t n, float lr)
{
    s_sgd_t j = {w, g, n, lr};
    mq_nn_parallel(s_sgd_part, &j, mq_nn_parts_for(n / 16, 16));
}

void mq_nn_set_threads(int threads)
{
    openblas_set_num_threads(threads > 0 ? threads : openblas_get_num_procs());
}

const char *mq_nn_blas_core(void)
{
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}

bool mq_nn_conv_transposed(void)
{
    const char *core = mq_nn_blas_core();
    return strcasecmp(core, "SkylakeX") == 0 || strcasecmp(core, "Cooperlake") == 0 ||
           strcasecmp(core, "SapphireRapids") == 0;
}

/* The kernels the CPU's features allow, of those every OpenBLAS since 0.3.10 has. */
static const char *s_blas_core_for_cpu(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#endif
    return NULL;
}

void mq_nn_pick_blas_core(char **argv)
{
    const char *core = openblas_get_corename();
    const char *want = s_blas_core_for_cpu();
    const bool kernels = !getenv("OPENBLAS_CORETYPE") && core &&
                         strcasecmp(core, "prescott") == 0 && want,
               timeout = !getenv(MQ_NN_BLAS_TIMEOUT_ENV) && openblas_get_num_threads() > 1;
    if (!kernels && !timeout)
        return; /* the user's choices, or nothing to change */
    if (kernels)
        mq_log(MQ_LOG_INFO,
               "OpenBLAS (%s) does not know this CPU and chose its generic Prescott kernels; "
               "running again with OPENBLAS_CORETYPE=%s, which its features allow (set "
               "OPENBLAS_CORETYPE to choose)",
               openblas_get_config(), want);
    else
        mq_log(MQ_LOG_DEBUG, "running again with %s=%s: OpenBLAS's idle threads sleep",
               MQ_NN_BLAS_TIMEOUT_ENV, MQ_NN_BLAS_TIMEOUT);
    /* The binary's own path, not /proc/self/exe: exec names the process after the file it
     * runs, and ps, pgrep and a container's health checks look for mqgrad-worker, not exe. */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0)
        self[n] = 0;
    else
        snprintf(self, sizeof self, "/proc/self/exe");
    if ((!kernels || setenv("OPENBLAS_CORETYPE", want, 1) == 0) &&
        (!timeout || setenv(MQ_NN_BLAS_TIMEOUT_ENV, MQ_NN_BLAS_TIMEOUT, 1) == 0))
        execv(self, argv);
    mq_log(MQ_LOG_WARN, "could not run again with OpenBLAS's settings (%s)%s", strerror(errno),
           kernels ? ": Prescott kernels" : "");
    if (kernels)
        unsetenv("OPENBLAS_CORETYPE");
    if (timeout)
        unsetenv(MQ_NN_BLAS_TIMEOUT_ENV);
}
