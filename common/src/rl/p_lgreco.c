/* L-GreCo as a policy: per-tensor levels chosen by dynamic programming under an error budget
 * (Alimohammadi et al., "L-GreCo: layerwise-adaptive gradient compression"; the allocator is
 * mq_alloc_bits, mqgrad/rl.h). It is the per-layer baseline of issue 41: a controller that
 * trades bits between tensors has to beat it.
 *
 * The model of the error, and what is measured. Tensor l sent at b bits errs by
 * E_l / (2^b - 1)^2 (squared, summed over its values). The workers report, per tensor, the
 * squared error of their push at the level it went at, e_l = |Q(g)|^2 - |g|^2 (unbiased
 * codecs: E|Q(g)|^2 = |g|^2 + E|Q(g) - g|^2), the scheduler averages them over the workers;
 * so E_l = e_l (2^b_l - 1)^2. Over a window of T iterations E_l is averaged; when the window
 * closes, the levels in min..max that send the fewest bits, sum N_l b_l, while the modelled
 * error stays within that of every tensor at `bits=B` (budget sum_l E_l / (2^B - 1)^2, with
 * a slack of 0.1 % for the allocator's rounding), go out for the next window. Uniform B keeps
 * that budget, so the answer never sends more bits than uniform B: it moves bits from the
 * tensors whose error per value is small to those whose is large.
 *
 * Before a window with usable errors (the first, an fp32 run, a codec without a level)
 * every tensor is at B. The common `min`/`max` bound the levels (the paper's 2..8 by
 * default; `min=1` lets a tensor go to one bit). */
#include "rl_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define S_DEFAULT_BITS 4
#define S_STEPS 10000 /* error units of the budget (mq_alloc_bits) */

typedef struct {
    int b;             /* the budget's uniform level (0 until given: then S_DEFAULT_BITS) */
    uint32_t nlayout;  /* tensors of the layout (0: no per-tensor levels yet) */
    uint8_t widths[MQ_POLICY_MAX_TENSORS];
    /* the window's measurements: the tensors last reported, their sizes and summed E_l */
    uint32_t nk, seen;
    uint32_t index[MQ_POLICY_MAX_TENSORS];
    double count[MQ_POLICY_MAX_TENSORS], esum[MQ_POLICY_MAX_TENSORS];
    uint64_t windows, kept; /* windows decided, and of them those left at uniform B */
} s_lgreco_t;

static int s_option(mq_policy_t *p, int index, const char *key, const char *val)
{
    (void)index;
    s_lgreco_t *g = p->priv;
    if (!val || strcmp(key, "bits") != 0)
        return 1;
    long b;
    if (mq_parse_long("lgreco option bits", val, 1, 8, &b) != 0)
        return -1;
    g->b = (int)b;
    return 0;
}

static int s_init(mq_policy_t *p)
{
    s_lgreco_t *g = p->priv;
    if (!g->b)
        g->b = S_DEFAULT_BITS;
    if (g->b < p->o.min_bits || g->b > p->o.max_bits) {
        mq_err_set("lgreco: bits=%d lies outside the levels %d..%d it may choose", g->b,
                   p->o.min_bits, p->o.max_bits);
        return -1;
    }
    p->bits = g->b;
    return 0;
}

/* Whether OBS's per-tensor part is usable: consistent, within bounds, finite. */
static bool s_usable(const mq_observation_t *obs)
{
    if (obs->ntensors == 0 || obs->ntensors > MQ_POLICY_MAX_TENSORS ||
        obs->layout_tensors > MQ_POLICY_MAX_TENSORS || !obs->tensor_count ||
        !obs->tensor_bits || !obs->tensor_index || !obs->tensor_err)
        return false;
    for (uint32_t k = 0; k < obs->ntensors; k++)
        if (obs->tensor_index[k] >= obs->layout_tensors || obs->tensor_bits[k] < 1 ||
            obs->tensor_bits[k] > 16 || !(obs->tensor_err[k] >= 0) ||
            !isfinite(obs->tensor_err[k]) || obs->tensor_count[k] == 0)
            return false;
    return true;
}

static int s_observe(mq_policy_t *p, const mq_observation_t *obs)
{
    s_lgreco_t *g = p->priv;
    if (!s_usable(obs))
        return 0;
    bool same = g->seen && obs->ntensors == g->nk;
    for (uint32_t k = 0; same && k < g->nk; k++)
        same = g->index[k] == obs->tensor_index[k];
    if (!same) { /* another set of tensors: the window starts over from this one */
        g->nk = obs->ntensors;
        g->seen = 0;
        memset(g->esum, 0, sizeof g->esum);
    }
    if (obs->layout_tensors != g->nlayout) {
        g->nlayout = obs->layout_tensors;
        memset(g->widths, g->b, sizeof g->widths);
    }
    for (uint32_t k = 0; k < g->nk; k++) {
        double levels = ldexp(1.0, (int)obs->tensor_bits[k]) - 1;
        g->index[k] = obs->tensor_index[k];
        g->count[k] = (double)obs->tensor_count[k];
        g->esum[k] += obs->tensor_err[k] * levels * levels;
    }
    g->seen++;
    return 0;
}

static int s_decide(mq_policy_t *p, const mq_observation_t *obs, double r, mq_decision_t *d)
{
    (void)obs, (void)r;
    s_lgreco_t *g = p->priv;
    d->action = 0;
    if (!g->seen)
        return 0;
    double e[MQ_POLICY_MAX_TENSORS], budget = 0, uniform = 0, chosen = 0;
    int bits[MQ_POLICY_MAX_TENSORS];
    double levels = ldexp(1.0, g->b) - 1;
    for (uint32_t k = 0; k < g->nk; k++) {
        e[k] = g->esum[k] / g->seen;
        budget += e[k] / (levels * levels);
        uniform += g->count[k] * g->b;
    }
    g->windows++;
    /* The allocator rounds each tensor's error up to a unit of budget / S_STEPS: NK units of
     * slack keep uniform B within the budget as counted. */
    budget *= 1 + (double)(g->nk + 1) / S_STEPS;
    int rc = mq_alloc_bits(g->count, e, g->nk, p->o.min_bits, p->o.max_bits, budget, S_STEPS,
                           bits);
    for (uint32_t k = 0; rc == 0 && k < g->nk; k++)
        chosen += g->count[k] * bits[k];
    if (rc != 0 || chosen > uniform) { /* never more than uniform B, which keeps the budget */
        for (uint32_t k = 0; k < g->nk; k++)
            bits[k] = g->b;
        g->kept++;
    }
    int moved = 0;
    for (uint32_t k = 0; k < g->nk; k++) {
        moved += bits[k] != g->widths[g->index[k]];
        g->widths[g->index[k]] = (uint8_t)bits[k];
    }
    d->action = moved;
    g->seen = 0;
    memset(g->esum, 0, sizeof g->esum);
    return 0;
}

static void s_save(const mq_policy_t *p, mq_rl_writer_t *w)
{
    const s_lgreco_t *g = p->priv;
    mq_rl_put_i32(w, g->b);
    mq_rl_put_u32(w, g->nlayout);
    mq_rl_put(w, g->widths, sizeof g->widths);
    mq_rl_put_u32(w, g->nk);
    mq_rl_put_u32(w, g->seen);
    for (uint32_t k = 0; k < MQ_POLICY_MAX_TENSORS; k++)
        mq_rl_put_u32(w, g->index[k]);
    mq_rl_put_f64s(w, g->count, MQ_POLICY_MAX_TENSORS);
    mq_rl_put_f64s(w, g->esum, MQ_POLICY_MAX_TENSORS);
    mq_rl_put_u64(w, g->windows);
    mq_rl_put_u64(w, g->kept);
}

static int s_restore(mq_policy_t *p, mq_rl_reader_t *r)
{
    s_lgreco_t *g = p->priv;
    int b = mq_rl_get_i32(r, "lgreco bits");
    g->nlayout = mq_rl_get_u32(r, "lgreco layout");
    const uint8_t *w = mq_rl_take(r, sizeof g->widths, "lgreco widths");
    if (w)
        memcpy(g->widths, w, sizeof g->widths);
    g->nk = mq_rl_get_u32(r, "lgreco tensors");
    g->seen = mq_rl_get_u32(r, "lgreco window");
    for (uint32_t k = 0; k < MQ_POLICY_MAX_TENSORS; k++)
        g->index[k] = mq_rl_get_u32(r, "lgreco index");
    if (mq_rl_get_f64s(r, g->count, MQ_POLICY_MAX_TENSORS, "lgreco counts") != 0 ||
        mq_rl_get_f64s(r, g->esum, MQ_POLICY_MAX_TENSORS, "lgreco errors") != 0)
        return -1;
    g->windows = mq_rl_get_u64(r, "lgreco windows");
    g->kept = mq_rl_get_u64(r, "lgreco kept");
    if (r->fail)
        return 0; /* the framing reports the truncation */
    bool ok = b == g->b && g->nlayout <= MQ_POLICY_MAX_TENSORS && g->nk <= MQ_POLICY_MAX_TENSORS;
    for (uint32_t t = 0; ok && t < g->nlayout; t++)
        ok = g->widths[t] >= p->o.min_bits && g->widths[t] <= p->o.max_bits;
    for (uint32_t k = 0; ok && k < g->nk; k++)
        ok = g->index[k] < g->nlayout && isfinite(g->count[k]) && isfinite(g->esum[k]);
    if (!ok) {
        mq_err_set("lgreco: saved levels or tensors out of range");
        return -1;
    }
    return 0;
}

static void s_status(const mq_policy_t *p, mq_policy_status_t *st)
{
    const s_lgreco_t *g = p->priv;
    st->nwidths = g->nlayout;
    memcpy(st->widths, g->widths, g->nlayout);
    double n = 0, nb = 0;
    for (uint32_t k = 0; k < g->nk; k++) {
        n += g->count[k];
        nb += g->count[k] * g->widths[g->index[k]];
    }
    snprintf(st->detail, sizeof st->detail,
             "%.2f bits a value over %u tensors (budget: all at %d); %llu of %llu windows "
             "kept uniform",
             n > 0 ? nb / n : (double)g->b, g->nk, g->b, (unsigned long long)g->kept,
             (unsigned long long)g->windows);
}

static int s_episode(mq_policy_t *p)
{
    s_lgreco_t *g = p->priv;
    int b = g->b;
    memset(g, 0, sizeof *g);
    g->b = b;
    p->bits = b;
    return 0;
}

const mq_policy_ops_t mq_policy_lgreco_ops = {
    .name = "lgreco",
    .usage = "lgreco[:bits=B]",
    .help = "per-tensor levels for the fewest bits at the error of all at B (4), by dynamic "
            "programming (L-GreCo, Alimohammadi et al.)",
    .keys = "bits",
    .size = sizeof(s_lgreco_t),
    .option = s_option,
    .init = s_init,
    .observe = s_observe,
    .decide = s_decide,
    .save = s_save,
    .restore = s_restore,
    .status = s_status,
    .episode = s_episode,
};
