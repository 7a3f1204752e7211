/* The run's health: divergence rules and the loss-spike guard (contract in mqgrad/watch.h).
 * The defaults come from runs of the paper model (docs/codec-sweep.md; the figures are in
 * docs/results.md, "The divergence rules' thresholds"): a run that dies under 2-bit
 * quantization with one range per tensor jumps to several times its smoothed loss within two
 * iterations, then sits dead at chance, so its smoothed loss stays above twice the best for
 * longer than 15 iterations. A patience of 15 catches that, while a healthy run whose loss
 * recovers at once would need a single step of about 50x its best loss to stay above 2x for
 * 15 iterations (0.1 * 50 * 0.9^15 = 1.03), a step no healthy run takes: the runs of the
 * default codec in the sweep (2..8 bits, 2 and 4 workers, 1000 iterations) never came near
 * twice their best.
 * The chance rule's 50 iterations are several times what both models need to leave chance at
 * the default learning rate. The flat rule catches a network that starts a little above
 * chance and stays there, as the small model can at --lr 1e-6; its 5 % is where a learning
 * rate 20 times below the default is not judged, while one 50 or 100 times below judges a
 * seed whose loss hardly moved. */
#include "mqgrad/watch.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The flat rule: a run that learned has its smoothed loss at most this x its first loss. */
#define S_FLAT 0.95

void mq_watch_opts_default(mq_watch_opts_t *o)
{
    *o = (mq_watch_opts_t){
        .loss_factor = 2.0,
        .patience = 15,
        .warmup = 10,
        .classes = 10,
        .spike_factor = 1.5,
        .guard_iters = 10,
        .guard_bits = 2,
        .max_bits = 8,
        .learn_within = 50,
    };
}

void mq_watch_init(mq_watch_t *w, const mq_watch_opts_t *o)
{
    memset(w, 0, sizeof *w);
    if (o)
        w->o = *o;
    else
        mq_watch_opts_default(&w->o);
    if (w->o.classes < 2)
        w->o.classes = 2;
    w->best = INFINITY;
    w->best_acc = -1;
    w->first = NAN;
}

static bool s_diverge(mq_watch_t *w, uint64_t iter, const char *rule)
{
    w->diverged = true;
    w->div_iter = iter;
    snprintf(w->rule, sizeof w->rule, "%s", rule);
    return true;
}

/* Whether ITER's loss is a spike: far above the smoothing of the losses before it. */
static bool s_spike(mq_watch_t *w, uint64_t iter, double loss, int bits)
{
    if (w->o.spike_factor <= 0 || bits >= 32 || (long)iter < w->o.warmup ||
        !(loss > w->o.spike_factor * w->smoothed))
        return false;
    int floor = bits + w->o.guard_bits;
    w->guard_floor = floor > w->o.max_bits ? w->o.max_bits : floor;
    w->guard_until = iter + 1 + (uint64_t)w->o.guard_iters;
    w->spikes++;
    return true;
}

bool mq_watch_loss(mq_watch_t *w, uint64_t iter, double loss, uint64_t nonfinite, int bits,
                   bool *spike)
{
    if (spike)
        *spike = false;
    /* After a divergence (--on-divergence continue) the rules are done, but the smoothing and
     * the guard go on. */
    if (!w->diverged && (nonfinite > 0 || !isfinite(loss))) {
        if (nonfinite > 0)
            snprintf(w->detail, sizeof w->detail,
                     "the workers reported %llu non-finite values in the loss or the gradient",
                     (unsigned long long)nonfinite);
        else
            snprintf(w->detail, sizeof w->detail, "the training loss is %g", loss);
        return s_diverge(w, iter, "nonfinite");
    }
    if (!isfinite(loss))
        return false;
    bool first = w->seen++ == 0;
    if (first)
        w->first = loss;
    if (!first && s_spike(w, iter, loss, bits) && spike)
        *spike = true;
    const double a = MQ_WATCH_SMOOTH_ALPHA;
    w->smoothed = first ? loss : a * loss + (1 - a) * w->smoothed;
    if (w->diverged || w->o.loss_factor <= 0)
        return false;
    if (w->smoothed < w->best)
        w->best = w->smoothed;
    if (w->smoothed > w->o.loss_factor * w->best)
        w->above++;
    else
        w->above = 0;
    if (w->above < w->o.patience)
        return false;
    snprintf(w->detail, sizeof w->detail,
             "the smoothed training loss stayed above %g x its best (%.4g) for %ld iterations; "
             "now %.4g",
             w->o.loss_factor, w->best, w->above, w->smoothed);
    return s_diverge(w, iter, "loss");
}

bool mq_watch_accuracy(mq_watch_t *w, uint64_t iter, double acc)
{
    if (w->diverged || !isfinite(acc))
        return false;
    double chance = 1.0 / w->o.classes;
    if (acc <= 1.5 * chance && w->best_acc >= 2.5 * chance) {
        snprintf(w->detail, sizeof w->detail,
                 "test accuracy fell to %.2f%% (chance is %.0f%%) after reaching %.2f%%",
                 acc * 100, chance * 100, w->best_acc * 100);
        return s_diverge(w, iter, "accuracy");
    }
    if (acc > w->best_acc)
        w->best_acc = acc;
    return false;
}

bool mq_watch_final(mq_watch_t *w, uint64_t iters, double acc)
{
    double chance = 1.0 / w->o.classes;
    if (w->diverged || !isfinite(acc) || w->o.learn_within <= 0 ||
        iters < (uint64_t)w->o.learn_within || acc >= 2 * chance)
        return false;
    const bool at_chance = acc <= 1.5 * chance;
    if (at_chance) {
        snprintf(w->detail, sizeof w->detail,
                 "it did not learn: after %llu iterations the test accuracy is %.2f%%, at "
                 "chance (%.0f%%)",
                 (unsigned long long)iters, acc * 100, chance * 100);
    } else {
        if (!(w->smoothed > S_FLAT * w->first)) /* false too without a first loss (NaN) */
            return false;
        snprintf(w->detail, sizeof w->detail,
                 "it did not learn: after %llu iterations the smoothed training loss is %.4g, "
                 "not %.0f%% below its first (%.4g), and the test accuracy is %.2f%% (chance "
                 "is %.0f%%)",
                 (unsigned long long)iters, w->smoothed, (1 - S_FLAT) * 100, w->first, acc * 100,
                 chance * 100);
    }
    w->at_end = true;
    return s_diverge(w, iters - 1, at_chance ? "chance" : "flat");
}

int mq_watch_bits(const mq_watch_t *w, uint64_t iter, int policy_bits)
{
    if (iter < w->guard_until && policy_bits < w->guard_floor)
        return w->guard_floor;
    return policy_bits;
}
