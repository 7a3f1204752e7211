/* The scheduler's own rules that need no cluster: its flags and the learning-rate schedule it
 * sends with every ITERATE. */
#include <criterion/criterion.h>

#include "scheduler.h"
#include "scheduler_internal.h"
#include "sec_test.h"

static void s_parse(mq_scheduler_config_t *c, char **argv)
{
    int n = 0;
    while (argv[n])
        n++;
    test_keys(); /* a scheduler without keys (or --insecure) refuses its flags */
    cr_assert_eq(mq_scheduler_config_parse(c, n, argv), 0);
}

Test(scheduler, learning_rate_is_constant_by_default)
{
    mq_scheduler_config_t c;
    s_parse(&c, (char *[]){"scheduler", "--lr", "0.02", NULL});
    for (double p = 0; p <= 1.0; p += 0.125)
        cr_expect_float_eq(mq_sched_lr(&c, p), 0.02, 1e-15, "at %g", p);
}

Test(scheduler, learning_rate_warms_down_over_the_last_fraction)
{
    mq_scheduler_config_t c;
    s_parse(&c, (char *[]){"scheduler", "--lr", "0.01", "--lr-decay", "0.25", NULL});
    cr_expect_float_eq(mq_sched_lr(&c, 0.0), 0.01, 1e-15);
    cr_expect_float_eq(mq_sched_lr(&c, 0.75), 0.01, 1e-15, "the decay starts at 75 %%");
    cr_expect_float_eq(mq_sched_lr(&c, 0.875), 0.005, 1e-12, "half way down");
    cr_expect_float_eq(mq_sched_lr(&c, 0.99), 0.0004, 1e-12);
    cr_expect_float_eq(mq_sched_lr(&c, 1.0), 1e-5, 1e-15, "never zero: lr / 1000");
}

Test(scheduler, bad_schedule_flags_are_refused)
{
    mq_scheduler_config_t c;
    char *argv[] = {"scheduler", "--lr-decay", "1.5", NULL};
    cr_expect_eq(mq_scheduler_config_parse(&c, 3, argv), 2);
    char *argv2[] = {"scheduler", "--on-divergence", "maybe", NULL};
    cr_expect_eq(mq_scheduler_config_parse(&c, 3, argv2), 2);
}

/* A time budget alone runs for that long (no hidden cap of iterations); without one the run
 * has 200 iterations; both given, whichever ends first. */
Test(scheduler, time_budget_alone_has_no_iteration_cap)
{
    mq_scheduler_config_t c;
    s_parse(&c, (char *[]){"scheduler", "--time-budget", "120", NULL});
    cr_expect_eq(c.iterations, 0, "--time-budget alone: %ld iterations", c.iterations);
    s_parse(&c, (char *[]){"scheduler", NULL});
    cr_expect_eq(c.iterations, 200);
    s_parse(&c, (char *[]){"scheduler", "--time-budget", "120", "--iterations", "50", NULL});
    cr_expect_eq(c.iterations, 50);
    cr_expect_float_eq(c.time_budget, 120, 1e-12);
}

Test(scheduler, clock_flag)
{
    mq_scheduler_config_t c;
    mq_run_config_t r;
    s_parse(&c, (char *[]){"scheduler", NULL});
    mq_sched_run_config(&c, &r);
    cr_expect_not(r.simulated_clock, "the real clock by default");
    s_parse(&c, (char *[]){"scheduler", "--clock", "simulated", NULL});
    mq_sched_run_config(&c, &r);
    cr_expect(r.simulated_clock);
    char *argv[] = {"scheduler", "--clock", "sundial", NULL};
    cr_expect_eq(mq_scheduler_config_parse(&c, 3, argv), 2);
}
