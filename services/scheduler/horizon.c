/* The run's horizon (scheduler_internal.h): which rounds are evaluated, on how many test
 * images, and when the run ends. Without sockets or clocks: the actor gives the iteration
 * count and the training time, and carries out what it is told. */
#include "scheduler_internal.h"

void mq_hz_init(mq_horizon_t *h, const mq_scheduler_config_t *c)
{
    *h = (mq_horizon_t){.iterations = c->iterations,
                        .time_budget = c->time_budget,
                        .eval_every = c->eval_every,
                        .eval_limit = c->eval_limit,
                        .final_eval_limit = c->final_eval_limit};
}

bool mq_hz_over(const mq_horizon_t *h, uint64_t iter, double train_time)
{
    return (h->iterations > 0 && iter >= (uint64_t)h->iterations) ||
           (h->time_budget > 0 && train_time >= h->time_budget);
}

mq_hz_round_t mq_hz_round(const mq_horizon_t *h, uint64_t iter, double train_time,
                          double last_s)
{
    /* Under a time budget the last round is foreseen from the one before's duration; a
     * wrong guess costs one extra, evaluated round (mq_hz_after: ONE_MORE). */
    bool last = (h->iterations > 0 && iter + 1 >= (uint64_t)h->iterations) ||
                (h->time_budget > 0 && iter > 0 && train_time + last_s >= h->time_budget);
    mq_hz_round_t r = {.final = last || h->one_more};
    r.evaluate = r.final || (h->eval_every > 0 && (iter + 1) % (uint64_t)h->eval_every == 0);
    long limit = r.final && h->final_eval_limit >= 0 ? h->final_eval_limit : h->eval_limit;
    r.limit = (uint32_t)(limit > 0 ? limit : 0);
    return r;
}

mq_hz_next_t mq_hz_after(mq_horizon_t *h, uint64_t iter, double train_time, bool evaluated)
{
    bool over = mq_hz_over(h, iter, train_time);
    /* out of time on a round that was not evaluated, with iterations left: the run ends
     * with an evaluation all the same, one more round */
    if (over && !evaluated && h->time_budget > 0 && !h->one_more &&
        (h->iterations == 0 || iter < (uint64_t)h->iterations)) {
        h->one_more = true;
        return MQ_HZ_ONE_MORE;
    }
    return over || h->one_more ? MQ_HZ_END : MQ_HZ_GO_ON;
}

void mq_hz_restart(mq_horizon_t *h)
{
    h->one_more = false;
}
