/* The run's health watch: each divergence rule fires on the evidence it names and not on a
 * healthy run; the guard raises the bits after a spike and lets go after its window. */
#include <criterion/criterion.h>
#include <math.h>

#include "mqgrad/watch.h"

/* A healthy run: loss from 2.3 down towards 0.4 with noise, and a dip-free rise early on. */
static double s_healthy(uint64_t m)
{
    double base = 0.4 + 1.9 * exp(-(double)m / 150.0);
    return base * (1.0 + 0.15 * sin((double)m * 1.7));
}

Test(watch, healthy_run_never_diverges)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    for (uint64_t m = 0; m < 3000; m++) {
        bool spike;
        cr_assert(!mq_watch_loss(&w, m, s_healthy(m), 0, 2, &spike), "iteration %llu",
                  (unsigned long long)m);
        cr_assert(!spike, "a 15%% wiggle is not a spike (iteration %llu)", (unsigned long long)m);
        if (m % 100 == 99)
            cr_assert(!mq_watch_accuracy(&w, m, 0.5 + m / 10000.0));
    }
    cr_assert(!w.diverged);
    cr_assert_eq(w.spikes, 0);
}

Test(watch, nonfinite_loss_or_gradient_diverges_at_once)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    cr_assert(!mq_watch_loss(&w, 0, 2.3, 0, 2, NULL));
    cr_assert(mq_watch_loss(&w, 1, NAN, 0, 2, NULL));
    cr_assert_str_eq(w.rule, "nonfinite");
    cr_assert_eq(w.div_iter, 1);
    cr_assert(!mq_watch_loss(&w, 2, NAN, 0, 2, NULL), "fires once");
    /* --on-divergence continue: the smoothing goes on with the finite losses. */
    cr_assert(!mq_watch_loss(&w, 3, 1.3, 0, 2, NULL));
    cr_assert_float_eq(w.smoothed, 0.9 * 2.3 + 0.1 * 1.3, 1e-12);

    mq_watch_init(&w, NULL);
    cr_assert(mq_watch_loss(&w, 0, 2.3, 17, 2, NULL));
    cr_assert_str_eq(w.rule, "nonfinite");
    cr_assert(strstr(w.detail, "17 non-finite"), "detail: %s", w.detail);
    mq_watch_init(&w, NULL);
    cr_assert(mq_watch_loss(&w, 0, INFINITY, 0, 2, NULL));
    cr_assert_str_eq(w.detail, "the training loss is inf");
}

/* The shape of the paper-exact 2-bit run that died: best smoothed about 2.1, a burst of
 * losses up to 65, then a dead network at 2.78. */
Test(watch, loss_blowup_diverges_after_patience)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    uint64_t m = 0;
    for (; m < 80; m++)
        cr_assert(!mq_watch_loss(&w, m, 2.1, 0, 2, NULL));
    double burst[] = {64.9, 30, 35, 12, 20, 9, 40};
    for (size_t i = 0; i < sizeof burst / sizeof *burst; i++, m++)
        cr_assert(!mq_watch_loss(&w, m, burst[i], 0, 2, NULL));
    uint64_t fired = 0;
    for (; m < 200 && !fired; m++)
        if (mq_watch_loss(&w, m, 2.78, 0, 2, NULL))
            fired = m;
    cr_assert(fired > 0, "a blow-up that stays above 2x the best for 15 iterations diverges");
    cr_assert_str_eq(w.rule, "loss");
    cr_assert_eq(w.div_iter, fired);
    cr_assert(fired - 80 >= 14 && fired - 80 <= 30, "fired at %llu", (unsigned long long)fired);
    cr_assert(strstr(w.detail, "best (2.1)"), "detail: %s", w.detail);
}

/* An absurd learning rate: the loss explodes from the second iteration on and never comes back. */
Test(watch, early_blowup_is_caught)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    cr_assert(!mq_watch_loss(&w, 0, 2.33, 0, 4, NULL));
    uint64_t fired = 0;
    for (uint64_t m = 1; m < 100 && !fired; m++)
        if (mq_watch_loss(&w, m, 3e31, 0, 4, NULL))
            fired = m;
    cr_assert_eq(fired, 15, "15 iterations above 2x the first loss (fired at %llu)",
                 (unsigned long long)fired);
    cr_assert_str_eq(w.rule, "loss");
}

/* A healthy run with one bad step that it recovers from at once is not declared diverged. */
Test(watch, one_recovered_spike_is_not_divergence)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    uint64_t m = 0;
    for (; m < 100; m++)
        mq_watch_loss(&w, m, 1.0, 0, 2, NULL);
    cr_assert(!mq_watch_loss(&w, m++, 40.0, 0, 2, NULL));
    for (; m < 200; m++)
        cr_assert(!mq_watch_loss(&w, m, 1.0, 0, 2, NULL), "iteration %llu",
                  (unsigned long long)m);
}

Test(watch, loss_rule_is_configurable_and_can_be_off)
{
    mq_watch_opts_t o;
    mq_watch_opts_default(&o);
    o.loss_factor = 1.2;
    o.patience = 3;
    mq_watch_t w;
    mq_watch_init(&w, &o);
    uint64_t m = 0;
    for (; m < 20; m++)
        mq_watch_loss(&w, m, 1.0, 0, 2, NULL);
    bool fired = false;
    for (int k = 0; k < 40 && !fired; k++, m++)
        fired = mq_watch_loss(&w, m, 1.6, 0, 2, NULL);
    cr_assert(fired, "1.6 against a best of 1.0 with factor 1.2 diverges");

    o.loss_factor = 0;
    mq_watch_init(&w, &o);
    for (m = 0; m < 20; m++)
        mq_watch_loss(&w, m, 1.0, 0, 2, NULL);
    for (; m < 200; m++)
        cr_assert(!mq_watch_loss(&w, m, 50.0, 0, 2, NULL), "rule off");
}

/* The chance rule judges the end of a run: at most 1.5 / classes after learn_within
 * iterations did not learn; a shorter run, a run above it, or no evaluation is not judged. */
Test(watch, a_run_that_ends_at_chance_did_not_learn)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    cr_assert_eq(w.o.learn_within, 50);
    cr_assert(!mq_watch_final(&w, 49, 0.10), "too short to judge");
    cr_assert(!mq_watch_final(&w, 50, 0.151), "above 1.5 x chance");
    cr_assert(!mq_watch_final(&w, 50, NAN), "no evaluation");
    cr_assert(!w.diverged);
    cr_assert(mq_watch_final(&w, 50, 0.15));
    cr_assert_str_eq(w.rule, "chance");
    cr_assert_eq(w.div_iter, 49, "the last iteration's index");
    cr_assert(strstr(w.detail, "15.00%") && strstr(w.detail, "50 iterations"), "detail: %s",
              w.detail);
    cr_assert(!mq_watch_final(&w, 60, 0.05), "once");

    mq_watch_opts_t o;
    mq_watch_opts_default(&o);
    o.learn_within = 0;
    mq_watch_init(&w, &o);
    cr_assert(!mq_watch_final(&w, 1000, 0.1), "rule off");
    mq_watch_init(&w, NULL);
    cr_assert(mq_watch_loss(&w, 0, NAN, 0, 2, NULL));
    cr_assert(!mq_watch_final(&w, 100, 0.1), "already diverged: the first rule stands");
    cr_assert_str_eq(w.rule, "nonfinite");
}

/* Feeds ITERS iterations whose loss goes from FIRST to LAST in a straight line. */
static void s_losses(mq_watch_t *w, uint64_t iters, double first, double last)
{
    for (uint64_t m = 0; m < iters; m++)
        mq_watch_loss(w, m, first + (last - first) * (double)m / (double)(iters - 1), 0, 8, NULL);
}

/* The flat rule: a run that ends above chance but under 2 / classes, with its smoothed loss
 * not 5 % below its first, did not learn; a loss 5 % down, an accuracy at 2 / classes, a
 * short run, or no loss fed is not judged; at chance the chance rule is the one that fires. */
Test(watch, a_run_whose_loss_stays_where_it_began_did_not_learn)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    s_losses(&w, 50, 2.30, 2.29);
    cr_assert(!mq_watch_final(&w, 50, 0.20), "at 2 x chance: it learned something");
    cr_assert(!w.diverged);
    cr_assert(mq_watch_final(&w, 50, 0.172));
    cr_assert_str_eq(w.rule, "flat");
    cr_assert(w.at_end, "judged as the run ends");
    cr_assert_eq(w.div_iter, 49);
    cr_assert(strstr(w.detail, "17.20%") && strstr(w.detail, "first (2.3)"), "detail: %s",
              w.detail);

    mq_watch_init(&w, NULL);
    s_losses(&w, 50, 2.30, 2.05); /* the smoothed loss lags: 2.096, 9 % down */
    cr_assert(!mq_watch_final(&w, 50, 0.172), "the loss fell: a slow run that learns");
    mq_watch_init(&w, NULL);
    s_losses(&w, 49, 2.30, 2.30);
    cr_assert(!mq_watch_final(&w, 49, 0.172), "too short to judge");
    mq_watch_init(&w, NULL);
    cr_assert(!mq_watch_final(&w, 50, 0.172), "no loss fed (a resumed run without one)");
    mq_watch_init(&w, NULL);
    s_losses(&w, 50, 2.30, 2.30);
    cr_assert(mq_watch_final(&w, 50, 0.12));
    cr_assert_str_eq(w.rule, "chance", "at chance, the chance rule");
    cr_assert(w.at_end);
    mq_watch_init(&w, NULL);
    s_losses(&w, 50, 2.30, 2.30);
    cr_assert(mq_watch_loss(&w, 50, NAN, 0, 8, NULL));
    cr_assert(!w.at_end, "the nonfinite rule judges an iteration, not the run");
}

Test(watch, accuracy_to_chance_after_learning_diverges)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    cr_assert(!mq_watch_accuracy(&w, 19, 0.12), "never above chance yet: not diverged");
    cr_assert(!mq_watch_accuracy(&w, 39, 0.53));
    cr_assert(!mq_watch_accuracy(&w, 59, 0.43), "a drop that is not to chance");
    cr_assert(mq_watch_accuracy(&w, 99, 0.087));
    cr_assert_str_eq(w.rule, "accuracy");
    cr_assert_eq(w.div_iter, 99);
    cr_assert(strstr(w.detail, "8.70%") && strstr(w.detail, "53.00%"), "detail: %s", w.detail);
}

Test(watch, guard_raises_bits_on_a_spike_for_its_window)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    uint64_t m = 0;
    for (; m < 30; m++)
        mq_watch_loss(&w, m, 2.0, 0, 3, NULL);
    cr_assert_eq(mq_watch_bits(&w, m, 3), 3);
    bool spike = false;
    mq_watch_loss(&w, m, 3.5, 0, 3, &spike); /* 1.75x the smoothed loss */
    cr_assert(spike);
    cr_assert_eq(w.spikes, 1);
    for (uint64_t k = m + 1; k <= m + 10; k++) {
        cr_assert_eq(mq_watch_bits(&w, k, 3), 5, "bits + 2 while the guard holds");
        cr_assert_eq(mq_watch_bits(&w, k, 7), 7, "never lowers the policy's choice");
    }
    cr_assert_eq(mq_watch_bits(&w, m + 11, 3), 3, "the floor lets go after its window");

    mq_watch_loss(&w, m + 11, 9.0, 0, 7, &spike);
    cr_assert(spike);
    cr_assert_eq(mq_watch_bits(&w, m + 12, 7), 8, "capped at max_bits");
}

Test(watch, guard_is_off_for_fp32_during_warmup_and_when_disabled)
{
    mq_watch_t w;
    mq_watch_init(&w, NULL);
    bool spike;
    for (uint64_t m = 0; m < 30; m++)
        mq_watch_loss(&w, m, 2.0, 0, 32, NULL);
    mq_watch_loss(&w, 30, 9.0, 0, 32, &spike);
    cr_assert(!spike, "fp32 has no bits to raise");

    mq_watch_init(&w, NULL);
    mq_watch_loss(&w, 0, 2.3, 0, 2, &spike);
    mq_watch_loss(&w, 1, 9.0, 0, 2, &spike);
    cr_assert(!spike, "no spikes during the warm-up");

    mq_watch_opts_t o;
    mq_watch_opts_default(&o);
    o.spike_factor = 0;
    mq_watch_init(&w, &o);
    for (uint64_t m = 0; m < 30; m++)
        mq_watch_loss(&w, m, 2.0, 0, 2, NULL);
    mq_watch_loss(&w, 30, 9.0, 0, 2, &spike);
    cr_assert(!spike, "guard off");
}
