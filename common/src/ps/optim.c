/* The update rules (mqgrad/optim.h): plain SGD, heavy-ball momentum, AdaGrad, and the two
 * l1-regularized adaptive rules of QCMD adagrad and QRDA adagrad (Xu, Wangni, Zhang, Ye, Wu,
 * Zhao, "Quantized Adaptive Subgradient Algorithms and Their Applications", arXiv 2208.05631,
 * 2022). Only that paper's abstract could be read; the closed forms below are the standard
 * composite mirror descent and regularized dual averaging AdaGrad updates (Duchi, Hazan,
 * Singer, JMLR 2011, "Adaptive Subgradient Methods", eqs. for diagonal AdaGrad with an l1
 * term), with the quantized mean gradient g^ in place of the gradient, as the abstract says
 * ("a quantized gradient-based adaptive learning rate matrix"). Our choices, not the paper's:
 * G accumulates the aggregate g^ (not each worker's), H = delta + sqrt(G), and RDA's proximal
 * term is centred on the initial parameters x_0 (x_0 = 0 gives the textbook form; a CNN
 * cannot start at 0). Adding a rule: its function and `mq_optim_<name>_ops` here, and one line
 * in optims.def. */

#include "mqgrad/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/util.h"

/* ---- the rules ------------------------------------------------------------------------ */

static void s_sgd(const mq_optim_t *o, float *w, const float *g, float *state, size_t n,
                  float lr, uint64_t t)
{
    (void)o, (void)state, (void)t;
    for (size_t i = 0; i < n; i++)
        w[i] -= lr * g[i];
}

/* u <- m u + g; w <- w - lr u (the form PyTorch's SGD uses, dampening 0). */
static void s_momentum(const mq_optim_t *o, float *w, const float *g, float *u, size_t n,
                       float lr, uint64_t t)
{
    (void)t;
    const float m = (float)o->p[0];
    for (size_t i = 0; i < n; i++) {
        u[i] = m * u[i] + g[i];
        w[i] -= lr * u[i];
    }
}

/* Diagonal AdaGrad: G <- G + g^2; w <- w - lr g / (delta + sqrt(G)). The adaptive rules take
 * their own step scale (key "scale", multiplying the run's lr): their first steps move every
 * coordinate by about lr whatever its gradient, so they want a smaller lr than SGD does, and
 * the scale keeps the run's schedule (--lr-decay) while one run compares them with SGD. */
static void s_adagrad(const mq_optim_t *o, float *w, const float *g, float *G, size_t n,
                      float lr, uint64_t t)
{
    (void)t;
    const float delta = (float)o->p[0];
    lr *= (float)o->p[1];
    for (size_t i = 0; i < n; i++) {
        G[i] += g[i] * g[i];
        w[i] -= lr * g[i] / (delta + sqrtf(G[i]));
    }
}

/* Soft threshold: sign(z) max(|z| - k, 0). */
static inline float s_shrink(float z, float k)
{
    float a = fabsf(z) - k;
    return a > 0 ? copysignf(a, z) : 0.0f;
}

/* QCMD adagrad (composite mirror descent): H = delta + sqrt(G),
 * z = w - lr g / H, w <- sign(z) max(|z| - lr l1 / H, 0). p[0] = l1, p[1] = delta, p[2] = scale. */
static void s_qcmd(const mq_optim_t *o, float *w, const float *g, float *G, size_t n, float lr,
                   uint64_t t)
{
    (void)t;
    const float l1 = (float)o->p[0], delta = (float)o->p[1];
    lr *= (float)o->p[2];
    for (size_t i = 0; i < n; i++) {
        G[i] += g[i] * g[i];
        float inv = lr / (delta + sqrtf(G[i]));
        w[i] = s_shrink(w[i] - inv * g[i], inv * l1);
    }
}

/* QRDA adagrad (regularized dual averaging): S <- S + g, G <- G + g^2, H = delta + sqrt(G),
 * w = argmin <S, x> + l1 t |x| + (1 / 2 lr) (x - x0)' H (x - x0)
 *   = sign(z) max(|z| - lr l1 t / H, 0) with z = x0 - lr S / H.
 * State: S, G, x0 (taken at the first step). p[0] = l1, p[1] = delta, p[2] = scale. */
static void s_qrda(const mq_optim_t *o, float *w, const float *g, float *state, size_t n,
                   float lr, uint64_t t)
{
    const float l1 = (float)o->p[0], delta = (float)o->p[1];
    float *S = state, *G = state + n, *x0 = state + 2 * n;
    lr *= (float)o->p[2];
    if (t <= 1)
        memcpy(x0, w, n * sizeof *w);
    const float lt = l1 * (float)t;
    for (size_t i = 0; i < n; i++) {
        S[i] += g[i];
        G[i] += g[i] * g[i];
        float inv = lr / (delta + sqrtf(G[i]));
        w[i] = s_shrink(x0[i] - inv * S[i], inv * lt);
    }
}

#define MQ_OPTIM_DEF(name) extern const mq_optim_ops_t mq_optim_##name##_ops;
#include "optims.def"
#undef MQ_OPTIM_DEF

const mq_optim_ops_t mq_optim_sgd_ops = {
    .name = "sgd", .usage = "sgd", .help = "w -= lr g (applied fused with the decode)",
    .apply = s_sgd};
const mq_optim_ops_t mq_optim_momentum_ops = {
    .name = "momentum", .usage = "momentum[:m=M]",
    .help = "heavy ball, u = m u + g, w -= lr u (m 0.9)", .keys = {"m"}, .defaults = {0.9},
    .lo = {0}, .hi = {0.9999}, .state_per_value = 1, .apply = s_momentum};
const mq_optim_ops_t mq_optim_adagrad_ops = {
    .name = "adagrad", .usage = "adagrad[:delta=D,scale=S]",
    .help = "diagonal AdaGrad on the aggregate, step S x lr (delta 1e-8, S 0.2)",
    .keys = {"delta", "scale"}, .defaults = {1e-8, 0.2}, .lo = {1e-12, 1e-6}, .hi = {1, 100},
    .state_per_value = 1, .apply = s_adagrad};
const mq_optim_ops_t mq_optim_qcmd_ops = {
    .name = "qcmd", .usage = "qcmd[:l1=L,delta=D,scale=S]",
    .help = "QCMD adagrad: AdaGrad mirror descent with l1, step S x lr (L 1e-5, S 0.2)",
    .keys = {"l1", "delta", "scale"}, .defaults = {1e-5, 1e-8, 0.2}, .lo = {0, 1e-12, 1e-6},
    .hi = {1, 1, 100}, .state_per_value = 1, .apply = s_qcmd};
const mq_optim_ops_t mq_optim_qrda_ops = {
    .name = "qrda", .usage = "qrda[:l1=L,delta=D,scale=S]",
    .help = "QRDA adagrad: AdaGrad dual averaging with l1, step S x lr (L 1e-6, S 0.2)",
    .keys = {"l1", "delta", "scale"}, .defaults = {1e-6, 1e-8, 0.2}, .lo = {0, 1e-12, 1e-6},
    .hi = {1, 1, 100}, .state_per_value = 3, .apply = s_qrda};

/* The registry, from optims.def: the idiom of the codecs and the policies. */
static const mq_optim_ops_t *const s_rules[] = {
#define MQ_OPTIM_DEF(name) &mq_optim_##name##_ops,
#include "optims.def"
#undef MQ_OPTIM_DEF
};
#define S_NRULES (sizeof s_rules / sizeof s_rules[0])

/* ---- specs ----------------------------------------------------------------------------- */

static int s_nkeys(const mq_optim_ops_t *r)
{
    int k = 0;
    while (k < MQ_OPTIM_NPARAMS && r->keys[k])
        k++;
    return k;
}

int mq_optim_parse(const char *spec, mq_optim_t *out)
{
    char buf[MQ_OPTIM_MAX_SPEC], names[128] = "", msg[256];
    if (!spec || !*spec || strlen(spec) >= sizeof buf) {
        mq_err_set("optimizer '%s': %s", spec ? spec : "", spec && *spec ? "too long" : "empty");
        return -1;
    }
    strcpy(buf, spec);
    char *opts = strchr(buf, ':');
    if (opts)
        *opts++ = 0;
    const mq_optim_ops_t *r = NULL;
    for (size_t i = 0; i < S_NRULES; i++) {
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                 s_rules[i]->name);
        if (strcmp(buf, s_rules[i]->name) == 0)
            r = s_rules[i];
    }
    if (!r) {
        mq_err_set("optimizer '%s': unknown rule '%s' (expected one of %s)", spec, buf, names);
        return -1;
    }
    mq_optim_t o = {.ops = r};
    memcpy(o.p, r->defaults, sizeof o.p);
    char *save = NULL;
    for (char *kv = opts ? strtok_r(opts, ",", &save) : NULL; kv;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        int k = 0, nk = s_nkeys(r);
        if (eq)
            *eq = 0;
        while (k < nk && strcmp(r->keys[k], kv) != 0)
            k++;
        if (!eq || k == nk) {
            mq_err_set("optimizer '%s': '%s' is not an option of %s (usage: %s)", spec, kv,
                       r->name, r->usage);
            return -1;
        }
        if (mq_parse_double(kv, eq + 1, r->lo[k], r->hi[k], &o.p[k]) < 0) {
            snprintf(msg, sizeof msg, "%s", mq_err_last());
            mq_err_set("optimizer '%s': %s", spec, msg);
            return -1;
        }
    }
    if (opts && !*opts) {
        mq_err_set("optimizer '%s': empty option list after ':'", spec);
        return -1;
    }
    *out = o;
    return 0;
}

void mq_optim_format(const mq_optim_t *o, char *buf, size_t len)
{
    int w = snprintf(buf, len, "%s", o->ops->name);
    for (int k = 0; k < s_nkeys(o->ops) && w >= 0 && (size_t)w < len; k++)
        w += snprintf(buf + w, len - (size_t)w, "%s%s=%g", k ? "," : ":", o->ops->keys[k], o->p[k]);
}

bool mq_optim_is_sgd(const mq_optim_t *o)
{
    return o->ops == &mq_optim_sgd_ops;
}

size_t mq_optim_state_floats(const mq_optim_t *o, size_t n)
{
    return o->ops->state_per_value * n;
}

void mq_optim_help(char *buf, size_t len)
{
    size_t w = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < S_NRULES; i++)
        mq_help_line(buf, len, &w, 24, s_rules[i]->usage, s_rules[i]->help);
}

uint64_t mq_optim_count_zeros(const float *w, size_t n)
{
    uint64_t z = 0;
    for (size_t i = 0; i < n; i++)
        z += w[i] == 0.0f;
    return z;
}
