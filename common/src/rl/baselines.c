/* The paper's baselines and the control: adaptive (Oland & Raj as DESIGN section 6 reads
 * them: bits follow the gradient's mean-square error) and schedule (a fixed ramp over the
 * run). fixed:K needs no code: its bits never change. */
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

/* Equal time at each width: the run is cut into max-min+1 stages, stage i runs min+i bits.
 * Progress is obs->progress when positive, else (iter+1)/total_iters (the share of the run
 * done once this iteration is), else 0 (no idea how long the run is: stay at min). */
int mq_rl_schedule_bits(const mq_policy_opts_t *o, const mq_observation_t *obs)
{
    double f = 0;
    if (isfinite(obs->progress) && obs->progress > 0)
        f = obs->progress;
    else if (obs->total_iters > 0)
        f = ((double)obs->iter + 1.0) / (double)obs->total_iters;
    if (f > 1)
        f = 1;
    int levels = o->max_bits - o->min_bits + 1;
    int stage = (int)floor(f * levels);
    if (stage >= levels)
        stage = levels - 1;
    return o->min_bits + stage;
}
