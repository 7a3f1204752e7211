/* The schedule control: a fixed ramp of the bits over the run, min to max in equal stages,
 * decided once per closed window from the run's progress. */
#include "rl_internal.h"

#include <math.h>

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

static int s_init(mq_policy_t *p)
{
    p->bits = p->o.min_bits;
    return 0;
}

static int s_decide(mq_policy_t *p, const mq_observation_t *obs, double r, mq_decision_t *d)
{
    int before = p->bits;
    p->bits = mq_rl_schedule_bits(&p->o, obs);
    d->action = p->bits - before;
    return 0;
}

const mq_policy_ops_t mq_policy_schedule_ops = {
    .name = "schedule",
    .usage = "schedule",
    .help = "bits ramp from min to max in equal stages over the run (a control)",
    .init = s_init,
    .decide = s_decide,
};
