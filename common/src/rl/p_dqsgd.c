/* DQ-SGD's bit rule as a policy: Yan, Huang, Lan, Song, "DQ-SGD: Dynamic Quantization in SGD
 * for Communication-Efficient Distributed Learning", arXiv 2107.14575 (read in the main text
 * of its ICLR 2021 submission; docs/seed-methods.md section 1 says what that text says):
 *
 *     B_n = log2[k * alpha^((N-n)/2) * |g_n| + 1] + 1     eq. 18, strongly convex
 *     B_n = log2[t * |g_n| + 1] + 1                         eq. 20, non-convex (alpha = 1)
 *
 * for the QSGD quantizer with s = 2^(B-1) - 1 levels (codec "qsgd", bits 2..8). In levels,
 * s_n = k alpha^((N-n)/2) |g_n|: the quantization step |g_n| / s_n stays 1/(k alpha^...)
 * whatever the norm, shrinking toward the end of the run when alpha < 1.
 *
 * The paper's text leaves the following open; every choice below is ours:
 *  - One B_n for all workers, decided by the agent. obs->grad_norm (|g| before quantization
 *    over the quantized tensors, RMS over workers) stands for |g_n|, and the width it gives
 *    is for n = obs->iter + 1: a one-iteration lag (the paper's worker knows its own |g_n|).
 *    A non-finite or non-positive norm (not reported) keeps the bits and is counted.
 *  - A decision at every observation, not once per window of T. The window still closes
 *    every T iterations for the reward shown and one history entry (the agent rewrites its
 *    state file at each entry: one per iteration would cost a write per iteration).
 *  - N = obs->total_iters, else (iter + 1) / obs->progress (a run with a time budget), else
 *    unknown, and then the alpha factor is 1 (counted). From n = N on the exponent is 0.
 *  - alpha defaults to 1 (eq. 20): eq. 18 assumes a strongly convex loss, and the networks
 *    trained here are not convex. `alpha=` < 1 gives eq. 18, more bits late in the run.
 *  - k stands for the communication budget C, which the paper does not turn into a number.
 *    `k=` (or `t=`, eq. 20's name for it) sets it; otherwise `bits=` B sets a target width
 *    and k is calibrated on the first usable norm so that this first decision is B wide:
 *    k = (2^(B-1) - 1) / (|g| alpha^((N-n)/2)), with alpha = 1 k = (2^(B-1) - 1) / |g|.
 *    Later widths move with log2 of the norm's ratio to that first one (and with alpha).
 *  - The default target is 4 bits: QSGD at 4 bits is the cheaper QSGD row of the paper's
 *    Table 1 (2.7 points below full precision on CIFAR-10, where 2 bits lose about 14), and
 *    DQ-SGD's own rows average 4.5 to 4.75 bits (32 / its compression ratios). From 4 (7
 *    levels) the norm may grow 18-fold before the rule asks for more than 8 bits and fall
 *    7-fold before it reaches 2, so it has room both ways. The mean width actually used is
 *    in the status line: a run whose norm falls ends below the target; raise `bits=` then.
 *  - Rounding up: B_n = ceil(eq. 18), so the quantization step never exceeds the rule's,
 *    then clamped to min..max (the common options, default 2..8, QSGD's range; min >= 2 as
 *    QSGD has no level at 1 bit). Clamped decisions are counted either way.
 *  - Before the first usable norm the width is the common start bits, as for the other
 *    policies' first window. The key `alpha` is eq. 18's here: the common alpha (the loss
 *    smoothing of MQGrad's eq. (1)) only shapes the reward shown. */
#include "rl_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define S_DEFAULT_TARGET 4

int mq_rl_dqsgd_width(double s)
{
    int b = 1;
    while (b < 64 && ldexp(1.0, b - 1) - 1.0 < s * (1 - 1e-9))
        b++;
    return b;
}

double mq_rl_dqsgd_levels(double k, double alpha, uint64_t n, uint64_t nn, double g)
{
    double f = 1;
    if (alpha < 1 && nn > n)
        f = pow(alpha, (double)(nn - n) / 2.0);
    return k * f * g;
}

static int s_option(mq_policy_t *p, int index, const char *key, const char *val)
{
    mq_rl_dqsgd_t *d = p->priv;
    if (!val)
        return 1;
    if (strcmp(key, "k") == 0 || strcmp(key, "t") == 0) {
        if (d->k_given) {
            mq_err_set("dqsgd: k and t are the same constant (eq. 18's k, eq. 20's t): give it "
                       "once");
            return -1;
        }
        if (mq_parse_double("dqsgd option k (or t)", val, 0, 1e300, &d->k) != 0)
            return -1;
        if (!(d->k > 0)) {
            mq_err_set("dqsgd option %s must be > 0 (the rule's constant), got %s", key, val);
            return -1;
        }
        d->k_given = true;
        return 0;
    }
    if (strcmp(key, "alpha") == 0) {
        if (mq_parse_double("dqsgd option alpha", val, -1e300, 1e300, &d->alpha) != 0)
            return -1;
        if (!(d->alpha > 0 && d->alpha <= 1)) {
            mq_err_set("dqsgd option alpha must be in (0, 1] (1 = eq. 20, the non-convex "
                       "rule), got %s",
                       val);
            return -1;
        }
        return 0;
    }
    if (strcmp(key, "bits") == 0) {
        long b;
        if (mq_parse_long("dqsgd option bits (target width)", val, 2, 8, &b) != 0)
            return -1;
        d->target = (int)b;
        return 0;
    }
    return 1;
}

static int s_init(mq_policy_t *p)
{
    mq_rl_dqsgd_t *d = p->priv;
    const mq_policy_opts_t *o = &p->o;
    if (d->alpha == 0)
        d->alpha = 1;
    if (o->min_bits < 2) {
        mq_err_set("dqsgd: min bits %d is below 2 (QSGD with B bits has 2^(B-1) - 1 levels: "
                   "none at 1 bit)",
                   o->min_bits);
        return -1;
    }
    if (d->k_given && d->target) {
        mq_err_set("dqsgd: give k (or t) or bits, not both (bits= calibrates k on the first "
                   "gradient norm)");
        return -1;
    }
    if (d->target && (d->target < o->min_bits || d->target > o->max_bits)) {
        mq_err_set("dqsgd: target bits=%d is outside the policy's range %d..%d", d->target,
                   o->min_bits, o->max_bits);
        return -1;
    }
    if (!d->k_given && !d->target) /* the default target, inside a narrower range */
        d->target = S_DEFAULT_TARGET < o->min_bits   ? o->min_bits
                    : S_DEFAULT_TARGET > o->max_bits ? o->max_bits
                                                     : S_DEFAULT_TARGET;
    d->last_real = NAN;
    d->recorded = p->bits;
    return 0;
}

/* N: planned iterations, else estimated from the share of the budget used, else 0. */
static uint64_t s_horizon(const mq_observation_t *obs)
{
    if (obs->total_iters > 0)
        return obs->total_iters;
    if (isfinite(obs->progress) && obs->progress > 0)
        return (uint64_t)llround(((double)obs->iter + 1.0) / fmin(obs->progress, 1.0));
    return 0;
}

/* Sets k so that norm G at iteration N of NN gives the target width; false if it cannot. */
static bool s_calibrate(mq_rl_dqsgd_t *d, uint64_t n, uint64_t nn, double g)
{
    double per_k = mq_rl_dqsgd_levels(1.0, d->alpha, n, nn, g);
    double k = (ldexp(1.0, d->target - 1) - 1.0) / per_k;
    if (!(isfinite(k) && k > 0)) {
        mq_warn("rl: dqsgd cannot calibrate k on norm %g at iteration %llu of %llu (alpha %g): "
                "the rule's factor is out of range",
                g, (unsigned long long)n, (unsigned long long)nn, d->alpha);
        return false;
    }
    d->k = k;
    return true;
}

/* Eq. 18 on the norm of iteration obs->iter, for the width of the next one. */
static int s_observe(mq_policy_t *p, const mq_observation_t *obs)
{
    mq_rl_dqsgd_t *d = p->priv;
    const mq_policy_opts_t *o = &p->o;
    double g = obs->grad_norm;
    uint64_t n = obs->iter + 1, nn = s_horizon(obs);
    if (!(isfinite(g) && g > 0) || (d->k == 0 && !s_calibrate(d, n, nn, g))) {
        d->skipped++;
        return 0;
    }
    if (d->alpha < 1 && nn == 0)
        d->no_horizon++;
    double s = mq_rl_dqsgd_levels(d->k, d->alpha, n, nn, g);
    int b = mq_rl_dqsgd_width(s);
    d->last_real = log2(s + 1) + 1;
    if (b < o->min_bits) {
        b = o->min_bits;
        d->low++;
    } else if (b > o->max_bits) {
        b = o->max_bits;
        d->high++;
    }
    p->bits = b;
    d->decided++;
    d->bits_sum += b;
    return 0;
}

/* A window's history entry: the change of bits since the previous entry. */
static int s_decide(mq_policy_t *p, const mq_observation_t *obs, double r, mq_decision_t *dec)
{
    mq_rl_dqsgd_t *d = p->priv;
    dec->action = p->bits - d->recorded;
    d->recorded = p->bits;
    return 0;
}

/* A new run: nothing learned to keep. k is calibrated again on the new run's first norm
 * (its gradients start where the last run's did, not where they ended) unless the spec gave
 * it, and the counters describe the new run, as a fresh dqsgd's would. */
static int s_episode(mq_policy_t *p)
{
    mq_rl_dqsgd_t *d = p->priv;
    if (!d->k_given)
        d->k = 0;
    d->decided = d->low = d->high = d->skipped = d->no_horizon = 0;
    d->bits_sum = 0;
    d->last_real = NAN;
    d->recorded = p->bits;
    return 0;
}

static void s_save(const mq_policy_t *p, mq_rl_writer_t *w)
{
    const mq_rl_dqsgd_t *d = p->priv;
    mq_rl_put_f64(w, d->k);
    mq_rl_put_f64(w, d->alpha);
    mq_rl_put_i32(w, d->target);
    mq_rl_put_u32(w, d->k_given);
    mq_rl_put_u64(w, d->decided);
    mq_rl_put_u64(w, d->low);
    mq_rl_put_u64(w, d->high);
    mq_rl_put_u64(w, d->skipped);
    mq_rl_put_u64(w, d->no_horizon);
    mq_rl_put_f64(w, d->last_real);
    mq_rl_put_f64(w, d->bits_sum);
    mq_rl_put_i32(w, d->recorded);
}

/* The saved options win over the spec's (a default may have changed since). */
static int s_restore(mq_policy_t *p, mq_rl_reader_t *r)
{
    mq_rl_dqsgd_t *d = p->priv;
    d->k = mq_rl_get_f64(r, "dqsgd state");
    d->alpha = mq_rl_get_f64(r, "dqsgd state");
    d->target = mq_rl_get_i32(r, "dqsgd state");
    d->k_given = mq_rl_get_u32(r, "dqsgd state") != 0;
    d->decided = mq_rl_get_u64(r, "dqsgd state");
    d->low = mq_rl_get_u64(r, "dqsgd state");
    d->high = mq_rl_get_u64(r, "dqsgd state");
    d->skipped = mq_rl_get_u64(r, "dqsgd state");
    d->no_horizon = mq_rl_get_u64(r, "dqsgd state");
    d->last_real = mq_rl_get_f64(r, "dqsgd state");
    d->bits_sum = mq_rl_get_f64(r, "dqsgd state");
    d->recorded = mq_rl_get_i32(r, "dqsgd state");
    if (r->fail)
        return 0;
    const char *bad = NULL;
    if (!(isfinite(d->k) && d->k >= 0) || (d->k_given && d->k == 0))
        bad = "k negative or not finite";
    else if (!(d->alpha > 0 && d->alpha <= 1))
        bad = "alpha outside (0, 1]";
    else if (d->k_given ? d->target != 0 : (d->target < 2 || d->target > 8))
        bad = "target bits outside 2..8";
    else if (d->recorded < 1 || d->recorded > 8)
        bad = "recorded bits outside 1..8";
    else if (d->low + d->high > d->decided)
        bad = "more clamped decisions than decisions";
    if (bad) {
        mq_err_set("policy state is inconsistent: dqsgd %s", bad);
        return -1;
    }
    return 0;
}

static void s_status(const mq_policy_t *p, mq_policy_status_t *st)
{
    const mq_rl_dqsgd_t *d = p->priv;
    char k[48];
    if (d->k_given)
        snprintf(k, sizeof k, "k=%.6g", d->k);
    else if (d->k > 0)
        snprintf(k, sizeof k, "k=%.6g (bits=%d on the first norm)", d->k, d->target);
    else
        snprintf(k, sizeof k, "k uncalibrated (bits=%d)", d->target);
    snprintf(st->detail, sizeof st->detail,
             "%s alpha=%g B=%.3f mean=%.2f decided=%llu clamped=%llu up,%llu down skipped=%llu",
             k, d->alpha, d->last_real, d->decided ? d->bits_sum / (double)d->decided : NAN,
             (unsigned long long)d->decided, (unsigned long long)d->low,
             (unsigned long long)d->high, (unsigned long long)d->skipped);
}

const mq_policy_ops_t mq_policy_dqsgd_ops = {
    .name = "dqsgd",
    .usage = "dqsgd[:bits=B|k=K,alpha=A]",
    .help = "DQ-SGD's rule (eqs. 18/20) each iteration, k from bits= (4); codec qsgd",
    .keys = "k, t, alpha, bits",
    .size = sizeof(mq_rl_dqsgd_t),
    .option = s_option,
    .init = s_init,
    .observe = s_observe,
    .decide = s_decide,
    .save = s_save,
    .restore = s_restore,
    .status = s_status,
    .episode = s_episode,
};
