/* The adaptive baseline (Oland & Raj as DESIGN section 6 reads them: the bits follow the
 * gradient's mean-square error), deciding once per closed window from the window's mean
 * range and mean square of the quantized tensors. Its threshold is the common option tau. */
#include "rl_internal.h"

#include <math.h>

/* Smallest K in min..max whose uniform quantization noise, Delta_K^2 / 12 with
 * Delta_K = range / (2^K - 1), is at most tau * mean(g^2); max if none is. A zero range needs
 * no bits beyond min. Non-finite or negative statistics say nothing: keep CURRENT. */
int mq_rl_adaptive_bits(const mq_policy_opts_t *o, double range, double sqmean, int current)
{
    if (!isfinite(range) || !isfinite(sqmean) || range < 0 || sqmean < 0)
        return current;
    double budget = o->tau * sqmean;
    for (int k = o->min_bits; k <= o->max_bits; k++) {
        double delta = range / (double)((1u << k) - 1u);
        if (delta * delta / 12.0 <= budget)
            return k;
    }
    return o->max_bits;
}

/* A window without statistics keeps the bits. */
static int s_decide(mq_policy_t *p, const mq_observation_t *obs, double r, mq_decision_t *d)
{
    const mq_rl_window_t *w = &p->win;
    int before = p->bits;
    if (w->range_n > 0 && w->sq_n > 0)
        p->bits = mq_rl_adaptive_bits(&p->o, w->range_sum / w->range_n, w->sq_sum / w->sq_n,
                                      p->bits);
    d->action = p->bits - before;
    return 0;
}

const mq_policy_ops_t mq_policy_adaptive_ops = {
    .name = "adaptive",
    .usage = "adaptive[:tau=X]",
    .help = "fewest bits with noise under tau * mean(g^2) per window (Oland & Raj)",
    .decide = s_decide,
};
