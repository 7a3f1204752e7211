/* The scheduler's own rules that need no cluster: its flags, the learning-rate schedule it
 * sends with every ITERATE, its checkpoint file, and its socket-free modules fed event by
 * event (the run's phases, the round, membership, the agent link, the run's horizon,
 * recovery, the checkpoint in progress, the round's record). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqgrad/util.h"

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

/* The checkpoint keeps the watch's state, the first loss (the flat rule's reference) included,
 * and still reads a file written before that key existed: its run resumes without the rule
 * (first loss NaN). A key that is there must be a number. */
Test(scheduler, checkpoint_keeps_the_first_loss_and_reads_older_files)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-ckpt-%d", (int)getpid());
    cr_assert_eq(mq_mkdirs(dir), 0);
    mq_sched_ckpt_t c = {.iter = 120,
                         .cursor = 3840,
                         .lineage = 0x1234,
                         .servers = 2,
                         .model = "small",
                         .bits = 4,
                         .last_acc = NAN,
                         .acc_iter = NAN,
                         .last_loss = 1.5,
                         .last_sparsity = NAN,
                         .smoothed = 1.6,
                         .best = 1.4,
                         .best_acc = 0.7,
                         .first_loss = 2.334,
                         .seen = 120,
                         .policy = "fixed:4"};
    cr_assert_eq(mq_sched_ckpt_write(dir, &c), 0, "%s", mq_err_last());
    mq_sched_ckpt_t r;
    cr_assert_eq(mq_sched_ckpt_read(dir, &r), 0, "%s", mq_err_last());
    cr_expect_float_eq(r.first_loss, 2.334, 1e-15);
    cr_expect_float_eq(r.smoothed, 1.6, 1e-15);
    cr_expect_eq(r.seen, 120);

    char path[128], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/checkpoint.json", dir);
    cr_assert_eq(mq_read_file(path, &text, &len), 0);
    char *line = strstr(text, "  \"first_loss\"");
    cr_assert_not_null(line, "%s", text);
    char *next = strchr(line, '\n') + 1;
    memmove(line, next, strlen(next) + 1); /* the file as written before the key */
    cr_assert_eq(mq_write_file_atomic(path, text, strlen(text)), 0);
    cr_assert_eq(mq_sched_ckpt_read(dir, &r), 0, "%s", mq_err_last());
    cr_expect(isnan(r.first_loss), "a file without the key: %g", r.first_loss);
    cr_expect_eq(r.iter, 120);

    c.first_loss = NAN; /* written as null: a run that saw no finite loss yet */
    cr_assert_eq(mq_sched_ckpt_write(dir, &c), 0);
    cr_assert_eq(mq_sched_ckpt_read(dir, &r), 0, "%s", mq_err_last());
    cr_expect(isnan(r.first_loss));
    free(text);
    cr_assert_eq(mq_read_file(path, &text, &len), 0);
    line = strstr(text, "\"first_loss\": null");
    cr_assert_not_null(line, "%s", text);
    memcpy(line + 14, "\"no\"", 4);
    cr_assert_eq(mq_write_file_atomic(path, text, strlen(text)), 0);
    cr_expect_eq(mq_sched_ckpt_read(dir, &r), -1, "\"first_loss\": \"no\" read as a number");
    cr_expect(strstr(mq_err_last(), "first_loss"), "%s", mq_err_last());
    free(text);
    unlink(path);
    rmdir(dir);
}

/* ---- the link to the agent (agent_link.c) -------------------------------------------------- */

/* Feeds EVENT in *S, expecting the state WANT and exactly the actions ACTS. */
static void s_al(mq_al_state_t *s, mq_al_event_t event, mq_al_state_t want, unsigned acts)
{
    mq_al_state_t from = *s;
    unsigned got;
    cr_assert_eq(mq_al_step(s, event, &got), 0, "%s in %s: %s", mq_al_event_name(event),
                 mq_al_state_name(from), mq_err_last());
    cr_expect_eq(*s, want, "%s in %s: to %s, expected %s", mq_al_event_name(event),
                 mq_al_state_name(from), mq_al_state_name(*s), mq_al_state_name(want));
    cr_expect_eq(got, acts, "%s in %s: actions %#x, expected %#x", mq_al_event_name(event),
                 mq_al_state_name(from), got, acts);
}

Test(scheduler, an_answering_agent_is_waited_for_and_the_run_goes_on_when_it_decides)
{
    mq_al_state_t s = MQ_AL_ANSWERING;
    s_al(&s, MQ_AL_OBSERVED, MQ_AL_WAITING, MQ_AL_WAIT);
    s_al(&s, MQ_AL_DECISION, MQ_AL_WAITING, MQ_AL_TAKE); /* an older decision: still waiting */
    s_al(&s, MQ_AL_DECISION_DUE, MQ_AL_ANSWERING, MQ_AL_TAKE | MQ_AL_CANCEL | MQ_AL_NEXT);
    s_al(&s, MQ_AL_DEADLINE, MQ_AL_ANSWERING, 0); /* its timer ended: nothing happens */
    s_al(&s, MQ_AL_OBSERVED_LAST, MQ_AL_ANSWERING, MQ_AL_NEXT); /* the last: no wait */
}

Test(scheduler, a_silent_agent_is_counted_said_once_and_not_waited_for_until_it_answers)
{
    mq_al_state_t s = MQ_AL_ANSWERING;
    s_al(&s, MQ_AL_OBSERVED, MQ_AL_WAITING, MQ_AL_WAIT);
    s_al(&s, MQ_AL_DEADLINE, MQ_AL_SILENT, MQ_AL_MISSED | MQ_AL_LOST | MQ_AL_NEXT);
    s_al(&s, MQ_AL_OBSERVED, MQ_AL_SILENT, MQ_AL_NEXT); /* told, not waited for */
    s_al(&s, MQ_AL_UNREACHABLE, MQ_AL_SILENT, MQ_AL_MISSED | MQ_AL_NEXT); /* counted, not said */
    s_al(&s, MQ_AL_DEADLINE, MQ_AL_SILENT, 0);
    s_al(&s, MQ_AL_DECISION, MQ_AL_ANSWERING, MQ_AL_TAKE | MQ_AL_BACK);
    s_al(&s, MQ_AL_OBSERVED, MQ_AL_WAITING, MQ_AL_WAIT); /* waited for again */
    /* an agent that cannot be reached is said lost at once */
    s = MQ_AL_ANSWERING;
    s_al(&s, MQ_AL_UNREACHABLE, MQ_AL_SILENT, MQ_AL_MISSED | MQ_AL_LOST | MQ_AL_NEXT);
    s_al(&s, MQ_AL_DECISION_DUE, MQ_AL_ANSWERING, MQ_AL_TAKE | MQ_AL_BACK);
}

Test(scheduler, a_rollback_or_the_end_of_the_run_ends_a_wait)
{
    mq_al_state_t s = MQ_AL_WAITING;
    s_al(&s, MQ_AL_RESET, MQ_AL_ANSWERING, MQ_AL_CANCEL);
    s_al(&s, MQ_AL_RESET, MQ_AL_ANSWERING, 0);
    s = MQ_AL_SILENT;
    s_al(&s, MQ_AL_RESET, MQ_AL_SILENT, 0); /* still not waited for */
    /* one wait at a time: a second observation while waiting is the caller's bug, refused */
    s = MQ_AL_WAITING;
    unsigned act = 99;
    cr_expect_eq(mq_al_step(&s, MQ_AL_OBSERVED, &act), -1);
    cr_expect_eq(s, MQ_AL_WAITING);
    cr_expect_eq(act, 0);
    cr_expect(strstr(mq_err_last(), "observed") && strstr(mq_err_last(), "waiting"), "%s",
              mq_err_last());
    /* every other cell of the table is defined, and leads to a state */
    for (int st = 0; st < MQ_AL_NSTATES; st++)
        for (int ev = 0; ev < MQ_AL_NEVENTS; ev++) {
            mq_al_state_t x = (mq_al_state_t)st;
            int rc = mq_al_step(&x, (mq_al_event_t)ev, &act);
            bool hole = st == MQ_AL_WAITING && ev <= MQ_AL_UNREACHABLE;
            cr_expect_eq(rc, hole ? -1 : 0, "%s in %s", mq_al_event_name(ev),
                         mq_al_state_name(st));
            cr_expect(x < MQ_AL_NSTATES);
        }
}

Test(scheduler, a_decision_outside_the_levels_or_for_another_layout_is_dropped)
{
    mq_widths_t w;
    const char *why = "";
    mq_status_msg_t d = {.bits = 4};
    cr_expect_eq(mq_al_decision(&d, 10, &w, &why), MQ_DROP_NONE);
    cr_expect_eq(w.bits, 4);
    cr_expect_eq(w.n, 0);
    d.bits = 9;
    cr_expect_eq(mq_al_decision(&d, 10, &w, &why), MQ_DROP_CODEC);
    cr_expect(strstr(why, "bits out of range"), "%s", why);
    d = (mq_status_msg_t){.bits = 3, .n_widths = 3, .widths = {1, 8, 3}};
    cr_expect_eq(mq_al_decision(&d, 3, &w, &why), MQ_DROP_NONE);
    cr_expect_eq(w.n, 3);
    cr_expect_eq(mq_widths_at(&w, 1), 8);
    cr_expect_eq(mq_al_decision(&d, 10, &w, &why), MQ_DROP_LAYOUT);
    cr_expect(strstr(why, "another layout"), "%s", why);
    cr_expect_eq(mq_al_decision(&d, 0, &w, &why), MQ_DROP_LAYOUT, "no layout known");
    d.widths[2] = 0;
    cr_expect_eq(mq_al_decision(&d, 3, &w, &why), MQ_DROP_CODEC);
    cr_expect(strstr(why, "tensor's level"), "%s", why);
}

/* ---- the round in flight (round.c) ------------------------------------------------------- */

/* A round over the N ranks MEMBERS under POLICY (VALUE), view 0. */
static mq_round_t *s_round(mq_stragglers_t policy, double value, const uint32_t *members,
                           uint32_t n, bool evaluate)
{
    static mq_round_t r;
    mq_round_destroy(&r);
    cr_assert_eq(mq_round_init(&r, 16, 4), 0); /* ranks below 16, up to 4 servers */
    r.policy = policy;
    r.value = value;
    r.nmembers = n;
    memcpy(r.members, members, n * sizeof *members);
    mq_round_begin(&r, evaluate);
    return &r;
}

static void s_expect_members(const mq_round_t *r, const uint32_t *want, uint32_t n)
{
    cr_expect_eq(r->nmembers, n, "%u members, expected %u", r->nmembers, n);
    for (uint32_t k = 0; k < n && k < r->nmembers; k++)
        cr_expect_eq(r->members[k], want[k], "member %u is %u, expected %u", k, r->members[k],
                     want[k]);
}

Test(scheduler, a_round_uses_the_policy_levels_raised_by_the_guard_within_the_codec_range)
{
    mq_watch_t watch;
    mq_watch_init(&watch, NULL);
    const mq_codec_ops_t two_to_eight = {.min_bits = 2, .max_bits = 8};
    const mq_codec_ops_t no_levels = {.min_bits = 0, .max_bits = 0};
    mq_widths_t policy = {.bits = 1, .n = 3, .per = {1, 4, 9}};
    mq_widths_t used;
    mq_al_levels(&watch, 0, 1, &policy, &two_to_eight, &used);
    cr_assert_eq(used.bits, 2, "1 bit is below the codec's range");
    cr_assert_eq(used.n, 3);
    cr_assert_eq(used.per[0], 2);
    cr_assert_eq(used.per[1], 4);
    cr_assert_eq(used.per[2], 8, "9 is above it");
    mq_al_levels(&watch, 0, 1, &policy, &no_levels, &used);
    cr_assert_eq(used.bits, 1, "a codec without levels takes the bits as they are");
    mq_al_levels(&watch, 0, 1, &policy, NULL, &used);
    cr_assert_eq(used.bits, 32, "fp32");
    cr_assert_eq(used.n, 0);

    /* a spike at 3 bits: the floor holds 5 (3 + 2) for the next rounds, then lets go */
    uint64_t m = 0;
    for (; m < 30; m++)
        mq_watch_loss(&watch, m, 1, 0, 3, NULL);
    bool spike = false;
    mq_watch_loss(&watch, m, 3, 0, 3, &spike);
    cr_assert(spike);
    mq_widths_t low = {.bits = 3, .n = 2, .per = {3, 6}};
    mq_al_levels(&watch, m + 1, 3, &low, &two_to_eight, &used);
    cr_assert_eq(used.bits, 5);
    cr_assert_eq(used.per[0], 5);
    cr_assert_eq(used.per[1], 6, "a level above the floor stays");
    mq_al_levels(&watch, watch.guard_until, 3, &low, &two_to_eight, &used);
    cr_assert_eq(used.bits, 3, "the floor has let go");
}

Test(scheduler, the_agent_is_told_the_means_and_each_quantized_tensor_of_the_run_layout)
{
    mq_layout_t l = {.n = 3};
    snprintf(l.t[0].name, sizeof l.t[0].name, "conv.w");
    l.t[0].count = 5000;
    snprintf(l.t[1].name, sizeof l.t[1].name, "conv.b");
    l.t[1].count = 32; /* under the threshold: fp32 on the wire, not observed */
    snprintf(l.t[2].name, sizeof l.t[2].name, "fc.w");
    l.t[2].count = 90000;
    mq_widths_t w = {.bits = 3, .n = 3, .per = {2, 8, 5}};
    mq_report_t sum = {.loss = 3, .nonfinite = 1, .grad_sqmean = 8, .grad_range = 4,
                       .grad_sq = 18, .sent_sq = 8, .update_sq = 2, .n_tensor_err = 3,
                       .tensor_err = {0.5, 9, 0.25}, .wait_ms = 50};
    mq_al_round_t r = {.sum = &sum, .nreports = 2, .smoothed_before = 1.25, .iter_ms = 40,
                       .progress = 0.5, .bits = 3, .used_bits = 5, .total_iters = 100,
                       .fallbacks = 2, .layout = &l, .quant_threshold = 1000, .widths = &w};
    mq_obs_msg_t o;
    mq_al_observation(&r, &o);
    cr_assert_float_eq(o.loss, 1.5, 1e-12, "the mean over the reports in hand");
    cr_assert_float_eq(o.loss_smoothed, 1.25, 1e-12);
    cr_assert_float_eq(o.grad_norm, 3, 1e-12);
    cr_assert_float_eq(o.sent_norm, 2, 1e-12);
    cr_assert_float_eq(o.update_norm, 1, 1e-12);
    cr_assert_float_eq(o.grad_sqmean, 4, 1e-12);
    cr_assert_float_eq(o.iter_ms, 40, 1e-12);
    cr_assert_float_eq(o.comm_ms, 25, 1e-12, "the workers' mean wait: what the bits cost");
    cr_assert(o.guard, "the round used 5 bits where the policy chose 3: the guard held them");
    cr_assert_eq(o.bits, 5);
    cr_assert_eq(o.fallbacks, 2);
    cr_assert_eq(o.tensors, 3);
    cr_assert_eq(o.n_tensor_index, 2, "the 32-value bias travels fp32");
    cr_assert_eq(o.tensor_index[0], 0);
    cr_assert_eq(o.tensor_index[1], 2);
    cr_assert_eq(o.tensor_bits[1], 5);
    cr_assert_eq(o.tensor_count[1], 90000);
    cr_assert_float_eq(o.tensor_err[1], 0.125, 1e-12);

    sum.n_tensor_err = 2; /* reports of another layout: no per-tensor part */
    mq_al_observation(&r, &o);
    cr_assert_eq(o.n_tensor_index, 0);
    cr_assert_float_eq(o.loss, 1.5, 1e-12);
    sum.n_tensor_err = 3;
    r.fp32 = true, r.used_bits = 32; /* fp32: no levels, no guard */
    mq_al_observation(&r, &o);
    cr_assert_eq(o.n_tensor_index, 0);
    cr_assert(!o.guard);
    r.fp32 = false, r.layout = NULL; /* no layout known yet */
    mq_al_observation(&r, &o);
    cr_assert_eq(o.n_tensor_index, 0);
}

/* The round's clock on the wall clock: the last to report is the slowest, the round's time is
 * its span less the evaluation's; a cut names the first straggler the slowest (its time so
 * far) and later reports do not displace it; a new round starts over, the run's totals stay. */
Test(scheduler, the_round_clock_times_rounds_and_names_the_slowest_on_the_wall_clock)
{
    mq_round_clock_t c = {.simulated = false};
    mq_rclock_begin(&c, 100.0, 5.0);
    cr_assert_float_eq(c.sim_issued, 0, 1e-12, "no simulated time on the wall clock");
    mq_rclock_report(&c, 2, 100.3, 0);
    mq_rclock_report(&c, 0, 100.5, 0);
    mq_rclock_report(&c, 1, 100.4, 0); /* out of order: not the slowest */
    cr_assert_eq(c.slowest_rank, 0);
    cr_assert_float_eq(c.slowest_ms, 500, 1e-6);
    cr_assert_float_eq(mq_rclock_iter_ms(&c, 100.6, 50), 550, 1e-6, "600 ms less 50 of eval");
    mq_rclock_begin(&c, 200.0, 6.0);
    cr_assert_eq(c.cut, 0);
    cr_assert_float_eq(c.slowest_ms, 0, 1e-12);
    mq_rclock_report(&c, 1, 200.2, 0);
    mq_rclock_cut(&c, 3, 2, 200.7); /* ranks 3 and 4 left out */
    cr_assert_eq(c.slowest_rank, 3);
    cr_assert_float_eq(c.slowest_ms, 700, 1e-6, "its time so far");
    mq_rclock_report(&c, 2, 200.9, 0);
    cr_assert_eq(c.slowest_rank, 3, "a cut straggler is slower than any report after the cut");
    mq_rclock_cut(&c, 5, 1, 201.0);
    cr_assert_eq(c.slowest_rank, 3, "the first cut names the slowest");
    cr_assert_eq(c.cut, 3);
    cr_assert_eq(c.cut_rounds, 1, "one round cut, twice");
    mq_rclock_begin(&c, 300.0, 7.0);
    mq_rclock_cut(&c, 0, 1, 300.1);
    cr_assert_eq(c.cut, 1);
    cr_assert_eq(c.cut_total, 4);
    cr_assert_eq(c.cut_rounds, 2);
}

/* On the simulated clock a round begins at the training time so far and ends at its latest
 * report stamp, whenever the reports arrive; the wall clock does not count. */
Test(scheduler, the_round_clock_follows_the_report_stamps_on_the_simulated_clock)
{
    mq_round_clock_t c = {.simulated = true};
    mq_rclock_begin(&c, 100.0, 12.0);
    cr_assert_float_eq(c.sim_issued, 12.0, 1e-12);
    mq_rclock_report(&c, 1, 150.0, 12.4);
    mq_rclock_report(&c, 0, 160.0, 12.2); /* arrives later, finished sooner */
    cr_assert_eq(c.slowest_rank, 1);
    cr_assert_float_eq(c.slowest_ms, 400, 1e-6);
    cr_assert_float_eq(c.sim_done, 12.4, 1e-12);
    cr_assert_float_eq(mq_rclock_iter_ms(&c, 999.0, 50), 400, 1e-6,
                       "the stamps' span, not the wall clock's, and no evaluation in it");
    mq_rclock_begin(&c, 200.0, 12.4);
    mq_rclock_cut(&c, 2, 1, 230.0);
    cr_assert_float_eq(c.slowest_ms, 0, 1e-12, "a straggler left out has no stamp");
}

Test(scheduler, a_round_commits_when_every_server_has_every_push_and_is_done_with_every_report)
{
    mq_round_t *r = s_round(MQ_STRAGGLERS_WAIT, 0, (uint32_t[]){0, 1}, 2, false);
    mq_round_out_t o;
    mq_round_have(r, 0, 0, 2, &o);
    cr_expect_eq(o.actions, 0);
    mq_round_have(r, 1, 1, 2, &o);
    cr_expect_eq(o.actions, 0, "a HAVE of another view counts for nothing");
    mq_round_have(r, 1, 0, 2, &o);
    cr_expect_eq(o.actions, MQ_RD_COMMIT);
    mq_round_have(r, 1, 0, 2, &o);
    cr_expect_eq(o.actions, 0, "committed once");
    mq_round_report(r, 1, &o);
    cr_expect_eq(o.actions, 0);
    mq_round_report(r, 1, &o);
    mq_round_report(r, 7, &o);
    cr_expect_eq(o.actions, 0, "a second report, or one from outside, changes nothing");
    cr_expect_eq(r->nreports, 1);
    mq_round_report(r, 0, &o);
    cr_expect_eq(o.actions, MQ_RD_DONE);
    cr_expect_eq(o.nleft, 0);
}

Test(scheduler, first_n_cuts_the_members_whose_pushes_are_not_everywhere_before_the_commit)
{
    mq_round_t *r = s_round(MQ_STRAGGLERS_FIRST, 1, (uint32_t[]){0, 1, 2}, 3, false);
    mq_round_out_t o;
    mq_round_progress(r, 0, (uint32_t[]){0, 2}, 2, 2, &o);
    cr_expect_eq(o.actions, 0, "rank 2's push is at one server of two");
    mq_round_progress(r, 1, (uint32_t[]){2}, 1, 2, &o);
    cr_expect_eq(o.actions, MQ_RD_VIEW);
    cr_assert_eq(o.nleft, 2);
    cr_expect_eq(o.left[0], 0);
    cr_expect_eq(o.left[1], 1);
    s_expect_members(r, (uint32_t[]){2}, 1);
    cr_expect_eq(r->view, 1);
    mq_round_have(r, 0, 0, 2, &o);
    cr_expect_eq(o.actions, 0, "the old view's HAVE");
    mq_round_have(r, 0, 1, 2, &o);
    mq_round_have(r, 1, 1, 2, &o);
    cr_expect_eq(o.actions, MQ_RD_COMMIT);
    mq_round_report(r, 2, &o);
    cr_expect_eq(o.actions, MQ_RD_DONE);
    /* an evaluated round waits for every member */
    r = s_round(MQ_STRAGGLERS_FIRST, 1, (uint32_t[]){0, 1}, 2, true);
    mq_round_progress(r, 0, (uint32_t[]){0}, 1, 1, &o);
    cr_expect_eq(o.actions, 0);
    s_expect_members(r, (uint32_t[]){0, 1}, 2);
}

Test(scheduler, after_the_commit_first_n_and_deadline_end_the_round_with_the_reports_in_hand)
{
    mq_round_t *r = s_round(MQ_STRAGGLERS_FIRST, 2, (uint32_t[]){3, 5, 9}, 3, false);
    mq_round_out_t o;
    mq_round_have(r, 0, 0, 1, &o);
    cr_assert_eq(o.actions, MQ_RD_COMMIT);
    mq_round_report(r, 9, &o);
    cr_expect_eq(o.actions, 0, "1 report of the 2 first:2 waits for");
    mq_round_report(r, 3, &o);
    cr_expect_eq(o.actions, MQ_RD_DONE);
    cr_assert_eq(o.nleft, 1);
    cr_expect_eq(o.left[0], 5);
    /* deadline: nothing before its time; after it, a cut needs one member everywhere */
    r = s_round(MQ_STRAGGLERS_DEADLINE, 2.5, (uint32_t[]){0, 1, 2}, 3, false);
    mq_round_progress(r, 0, (uint32_t[]){1}, 1, 1, &o);
    cr_expect_eq(o.actions, 0, "before the deadline");
    mq_round_deadline(r, 1, &o);
    cr_expect_eq(o.actions, MQ_RD_VIEW);
    cr_expect_eq(o.nleft, 2);
    s_expect_members(r, (uint32_t[]){1}, 1);
    r = s_round(MQ_STRAGGLERS_DEADLINE, 2.5, (uint32_t[]){0, 1, 2}, 3, false);
    mq_round_deadline(r, 1, &o);
    cr_expect_eq(o.actions, 0, "no push anywhere: nobody to go on with");
    mq_round_have(r, 0, 0, 1, &o);
    cr_assert_eq(o.actions, MQ_RD_COMMIT);
    mq_round_report(r, 2, &o);
    cr_expect_eq(o.actions, MQ_RD_DONE, "past the deadline, committed: one report is enough");
    cr_expect_eq(o.nleft, 2);
}

Test(scheduler, a_lost_worker_leaves_the_round_unless_its_push_is_in)
{
    mq_round_t *r = s_round(MQ_STRAGGLERS_WAIT, 0, (uint32_t[]){0, 1, 2}, 3, false);
    mq_round_out_t o;
    mq_round_have(r, 0, 0, 2, &o);
    mq_round_lose(r, 1, &o);
    cr_expect_eq(o.actions, MQ_RD_VIEW);
    cr_expect_eq(o.nleft, 0, "lost, not a straggler");
    s_expect_members(r, (uint32_t[]){0, 2}, 2);
    cr_expect_eq(r->view, 1);
    cr_expect(!r->have[0], "the new view needs every HAVE again");
    mq_round_lose(r, 1, &o);
    cr_expect_eq(o.actions, 0, "not a member any more");
    mq_round_lose(r, 0, &o);
    mq_round_lose(r, 2, &o);
    cr_expect_eq(o.actions, MQ_RD_VIEW | MQ_RD_AGAIN, "nobody left: the round runs again");
    /* after the commit: the round stands; done when the others have reported */
    r = s_round(MQ_STRAGGLERS_WAIT, 0, (uint32_t[]){0, 1, 2}, 3, false);
    mq_round_have(r, 0, 0, 1, &o);
    mq_round_report(r, 0, &o);
    mq_round_lose(r, 0, &o);
    cr_expect_eq(o.actions, 0, "it reported: its push is in every aggregate");
    mq_round_report(r, 2, &o);
    cr_expect_eq(o.actions, 0);
    mq_round_lose(r, 1, &o);
    cr_expect_eq(o.actions, MQ_RD_DONE);
    s_expect_members(r, (uint32_t[]){0, 2}, 2);
}

/* ---- membership (membership.c) ----------------------------------------------------------- */

/* A REGISTER of ROLE from connection PEER (one byte), with INCARNATION and try ATTEMPT. */
static mq_msg_t s_reg(mq_role_t role, uint8_t peer, uint64_t incarnation, uint32_t attempt,
                      const char *endpoint, uint32_t prefer)
{
    mq_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = MQ_MSG_REGISTER;
    m.role = role;
    m.peer[0] = peer;
    m.peer_len = 1;
    m.incarnation = incarnation;
    m.register_.attempt = attempt;
    m.register_.prefer_shard = prefer;
    snprintf(m.register_.endpoint, sizeof m.register_.endpoint, "%s", endpoint);
    return m;
}

Test(scheduler, ranks_are_taken_in_order_and_refused_with_the_reason_when_none_is_left)
{
    mq_membership_t mb;
    mq_mb_init(&mb, 2, 1);
    mq_mb_reg_out_t o;
    for (uint32_t k = 0; k < 2; k++) {
        mq_msg_t m = s_reg(MQ_ROLE_WORKER, (uint8_t)k, 100 + k, 0, "", 0);
        cr_assert_eq(mq_mb_again(&mb, &m, &o), -1, "a first try is not a repeat");
        cr_assert_eq(mq_mb_take(&mb, &m, true, 1.0, &o), MQ_MB_TAKEN);
        cr_expect(o.worker);
        cr_expect_eq(o.rank, k);
        cr_expect_eq(mb.workers[k].state, MQ_MB_SETUP);
        cr_expect_eq(mb.worker_term[k], 1);
    }
    mq_msg_t third = s_reg(MQ_ROLE_WORKER, 9, 999, 0, "", 0);
    cr_assert_eq(mq_mb_take(&mb, &third, true, 1.0, &o), MQ_MB_REFUSED);
    cr_expect(strstr(o.why, "all 2 worker ranks are taken (--max-workers)"), "%s", o.why);
    cr_expect_not(o.retry);
    mq_msg_t nowhere = s_reg(MQ_ROLE_SERVER, 5, 500, 0, "", 0);
    cr_assert_eq(mq_mb_take(&mb, &nowhere, true, 1.0, &o), MQ_MB_REFUSED);
    cr_expect(strstr(o.why, "must give its endpoint"), "%s", o.why);
    mq_msg_t sv = s_reg(MQ_ROLE_SERVER, 6, 600, 0, "tcp://a:1", 0);
    cr_assert_eq(mq_mb_take(&mb, &sv, true, 1.0, &o), MQ_MB_TAKEN);
    cr_expect_not(o.worker);
    cr_expect_eq(mb.nservers, 1);
    mq_msg_t sv2 = s_reg(MQ_ROLE_SERVER, 7, 700, 0, "tcp://b:1", 0);
    cr_assert_eq(mq_mb_take(&mb, &sv2, true, 1.0, &o), MQ_MB_REFUSED);
    cr_expect(strstr(o.why, "enough servers"), "%s", o.why);
    /* once the run is under way a server is taken back only after its old self is lost */
    cr_assert_eq(mq_mb_take(&mb, &sv2, false, 1.0, &o), MQ_MB_REFUSED);
    cr_expect(o.retry, "a restarted server may try again");
    mq_msg_t odd = s_reg(MQ_ROLE_NONE, 8, 800, 0, "", 0);
    cr_expect_eq(mq_mb_take(&mb, &odd, true, 1.0, &o), MQ_MB_REFUSED);
    mq_mb_destroy(&mb);
}

/* WELCOME: each node its rank's token of its term and the servers in rank order; the run key to
 * servers only; with an external model the layout to all and the seed word to the seeder
 * alone, on a run from its start; the seeder is the first worker unless it left. */
Test(scheduler, a_welcome_gives_each_node_its_token_and_only_servers_the_run_key)
{
    uint8_t key[MQ_RUN_KEY_LEN], token[MQ_TOKEN_LEN];
    mq_run_key_new(key);
    mq_membership_t mb;
    mq_mb_init(&mb, 3, 2);
    mq_mb_reg_out_t o;
    for (uint32_t k = 0; k < 2; k++) {
        mq_msg_t w = s_reg(MQ_ROLE_WORKER, (uint8_t)k, 100 + k, 0, "", 0);
        cr_assert_eq(mq_mb_take(&mb, &w, true, 1.0, &o), MQ_MB_TAKEN);
        char ep[32];
        snprintf(ep, sizeof ep, "tcp://s%u:1", k);
        mq_msg_t sv = s_reg(MQ_ROLE_SERVER, (uint8_t)(10 + k), 200 + k, 0, ep, 0);
        cr_assert_eq(mq_mb_take(&mb, &sv, true, 1.0, &o), MQ_MB_TAKEN);
    }
    mq_run_config_t config;
    memset(&config, 0, sizeof config);
    mq_layout_t layout = {.n = 1};
    snprintf(layout.t[0].name, sizeof layout.t[0].name, "w");
    layout.t[0].count = 10;
    cr_expect_eq(mq_mb_seeder(&mb, 1), 1, "the first worker to register, while it is there");
    mb.workers[1].state = MQ_MB_FREE;
    cr_expect_eq(mq_mb_seeder(&mb, 1), 0, "it left: the lowest rank held");
    mq_mb_run_t run = {.config = &config, .run_id = 77, .run_key = key, .layout = &layout,
                       .seeder = 0};
    static char endpoints[2][MQ_WIRE_MAX_TEXT];
    static mq_msg_t out;
    mq_mb_welcome(&mb, &mb.workers[0], 0, &run, 5.0, endpoints, &out);
    cr_expect_eq(out.type, MQ_MSG_WELCOME);
    cr_expect_eq(out.run_id, 77);
    cr_expect_eq(mb.workers[0].last_heard, 5.0, "its heartbeats are due from now");
    const mq_welcome_t *w = &out.welcome;
    cr_expect_eq(w->rank, 0);
    cr_assert_eq(w->n_servers, 2);
    cr_expect_str_eq(w->servers[0], "tcp://s0:1");
    cr_expect_str_eq(w->servers[1], "tcp://s1:1");
    cr_expect(!w->has_run_key, "a worker never gets the run key");
    mq_token_make(key, MQ_ROLE_WORKER, 0, mb.worker_term[0], token);
    cr_expect(w->has_token && w->term == mb.worker_term[0] && mq_token_equal(w->token, token));
    cr_expect(w->seed, "the seeder's values start the run");
    cr_expect_eq(out.layout.n, 1);
    mq_mb_welcome(&mb, &mb.servers[1], 1, &run, 6.0, endpoints, &out);
    cr_expect(w->has_run_key && memcmp(w->run_key, key, MQ_RUN_KEY_LEN) == 0);
    mq_token_make(key, MQ_ROLE_SERVER, 1, mb.server_term[1], token);
    cr_expect(mq_token_equal(w->token, token), "a server's token is of its role");
    cr_expect(!w->seed, "a server is no seeder");
    config.resume_iter = 40;
    mq_mb_welcome(&mb, &mb.workers[0], 0, &run, 7.0, endpoints, &out);
    cr_expect(!w->seed, "a resumed run starts from its checkpoint, not the seeder's values");
    config.resume_iter = 0;
    run.layout = NULL;
    mq_mb_welcome(&mb, &mb.workers[0], 0, &run, 8.0, endpoints, &out);
    cr_expect(!w->seed && out.layout.n == 0, "a built-in model needs neither");
    mq_msg_free(&out);
    mq_mb_destroy(&mb);
}

/* Nothing but the run's flags sizes the membership and the round: 1000 worker ranks and 300
 * servers are taken, the next worker is refused naming the run's count, and a round over all
 * of them under first:600 is cut to the 600 whose pushes every server holds, then commits. */
/* A worker's message of RUN with rank RANK's token of TERM under KEY (none if TERM is 0). */
static mq_msg_t s_tokened(mq_msg_type_t type, uint64_t run, uint32_t rank, uint32_t term,
                          const uint8_t *key)
{
    mq_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = type;
    m.role = MQ_ROLE_WORKER;
    m.run_id = run;
    m.rank = rank;
    m.term = term;
    m.has_token = term != 0;
    if (term)
        mq_token_make(key, MQ_ROLE_WORKER, rank, term, m.token);
    return m;
}

Test(scheduler, the_gate_lets_a_rank_speak_only_with_its_current_token)
{
    uint8_t key[MQ_RUN_KEY_LEN], other[MQ_RUN_KEY_LEN];
    mq_run_key_new(key);
    mq_run_key_new(other);
    mq_membership_t mb;
    mq_mb_init(&mb, 2, 1);
    mq_mb_reg_out_t o;
    mq_msg_t reg = s_reg(MQ_ROLE_WORKER, 1, 100, 0, "", 0);
    cr_assert_null(mq_mb_refusal(&mb, NULL, key, 7, &reg), "a REGISTER needs no token");
    cr_assert_eq(mq_mb_take(&mb, &reg, true, 1.0, &o), MQ_MB_TAKEN);
    mq_msg_t ready = s_tokened(MQ_MSG_READY, 7, 0, 1, key);
    cr_assert_null(mq_mb_refusal(&mb, NULL, key, 7, &ready));
    const char *why = "";
    mq_msg_t bare = s_tokened(MQ_MSG_READY, 7, 0, 0, key);
    cr_assert_not_null(why = mq_mb_refusal(&mb, NULL, key, 7, &bare), "no token");
    cr_assert(strstr(why, "token"), "%s", why);
    mq_msg_t forged = s_tokened(MQ_MSG_READY, 7, 0, 1, other);
    cr_assert_not_null(mq_mb_refusal(&mb, NULL, key, 7, &forged), "another run key's token");
    mq_msg_t free_rank = s_tokened(MQ_MSG_HEARTBEAT, 7, 1, 1, key);
    cr_assert_not_null(mq_mb_refusal(&mb, NULL, key, 7, &free_rank), "rank 1 is nobody's");
    mq_msg_t past = s_tokened(MQ_MSG_HEARTBEAT, 7, 5, 1, key);
    cr_assert_not_null(mq_mb_refusal(&mb, NULL, key, 7, &past), "beyond --max-workers");
    mq_msg_t stranger = s_tokened(MQ_MSG_REPORT, 8, 0, 0, key);
    cr_assert_null(mq_mb_refusal(&mb, NULL, key, 7, &stranger),
                   "another run's message passes the gate: the actor tells it to register");
    mq_msg_t ping = {.type = MQ_MSG_PING};
    cr_assert_null(mq_mb_refusal(&mb, NULL, key, 7, &ping));

    /* the rank lost and given out again: the old holder's token is revoked */
    mq_mb_lose(&mb, 0);
    mq_msg_t reg2 = s_reg(MQ_ROLE_WORKER, 2, 200, 0, "", 0);
    cr_assert_eq(mq_mb_take(&mb, &reg2, false, 2.0, &o), MQ_MB_TAKEN);
    cr_assert_eq(o.rank, 0);
    cr_assert_not_null(mq_mb_refusal(&mb, NULL, key, 7, &ready), "term 1 is over");
    mq_msg_t ready2 = s_tokened(MQ_MSG_READY, 7, 0, 2, key);
    cr_assert_null(mq_mb_refusal(&mb, NULL, key, 7, &ready2));
    mq_mb_destroy(&mb);
}

Test(scheduler, a_run_of_a_thousand_workers_and_three_hundred_servers_is_sized_by_its_flags)
{
    static mq_membership_t mb;
    cr_assert_eq(mq_mb_init(&mb, 1000, 300), 0);
    mq_mb_reg_out_t o;
    for (uint32_t k = 0; k < 1000; k++) {
        mq_msg_t m = s_reg(MQ_ROLE_WORKER, (uint8_t)k, 10000 + k, 0, "", 0);
        cr_assert_eq(mq_mb_take(&mb, &m, true, 1.0, &o), MQ_MB_TAKEN, "worker %u", k);
        cr_assert_eq(o.rank, k);
    }
    mq_msg_t late = s_reg(MQ_ROLE_WORKER, 1, 99999, 0, "", 0);
    cr_assert_eq(mq_mb_take(&mb, &late, true, 1.0, &o), MQ_MB_REFUSED);
    cr_expect(strstr(o.why, "all 1000 worker ranks are taken"), "%s", o.why);
    for (uint32_t k = 0; k < 300; k++) {
        char ep[32];
        snprintf(ep, sizeof ep, "tcp://s%u:1", k);
        mq_msg_t m = s_reg(MQ_ROLE_SERVER, (uint8_t)k, 50000 + k, 0, ep, 0);
        cr_assert_eq(mq_mb_take(&mb, &m, true, 1.0, &o), MQ_MB_TAKEN, "server %u", k);
    }
    cr_expect_eq(mb.nservers, 300);
    cr_expect_str_eq(mb.servers[299].endpoint, "tcp://s299:1");
    cr_expect_eq(mq_mb_count(&mb, MQ_MB_SETUP), 1000);
    mq_mb_destroy(&mb);

    static mq_round_t r;
    cr_assert_eq(mq_round_init(&r, 1000, 300), 0);
    r.policy = MQ_STRAGGLERS_FIRST;
    r.value = 600;
    r.nmembers = 1000;
    for (uint32_t k = 0; k < 1000; k++)
        r.members[k] = k;
    mq_round_begin(&r, false);
    static uint32_t first[600];
    for (uint32_t k = 0; k < 600; k++)
        first[k] = k;
    mq_round_out_t out;
    for (uint32_t s = 0; s < 300; s++) {
        mq_round_progress(&r, s, first, 600, 300, &out);
        cr_assert_eq(out.actions, s == 299 ? MQ_RD_VIEW : 0u, "server %u", s);
    }
    cr_expect_eq(out.nleft, 400, "the 400 whose pushes are not everywhere are cut");
    cr_expect_eq(out.left[0], 600);
    cr_expect_eq(r.nmembers, 600);
    for (uint32_t s = 0; s < 300; s++) {
        mq_round_have(&r, s, r.view, 300, &out);
        cr_assert_eq(out.actions, s == 299 ? MQ_RD_COMMIT : 0u, "server %u", s);
    }
    mq_round_destroy(&r);
}

Test(scheduler, a_later_try_moves_the_answers_and_an_earlier_or_the_same_changes_nothing)
{
    mq_membership_t mb;
    mq_mb_init(&mb, 4, 1);
    mq_mb_reg_out_t o;
    mq_msg_t first = s_reg(MQ_ROLE_WORKER, 1, 42, 0, "", 0);
    cr_assert_eq(mq_mb_take(&mb, &first, true, 1.0, &o), MQ_MB_TAKEN);
    mq_msg_t second = s_reg(MQ_ROLE_WORKER, 2, 42, 1, "", 0);
    cr_assert_eq(mq_mb_again(&mb, &second, &o), MQ_MB_MOVED);
    cr_expect(o.worker);
    cr_expect_eq(o.rank, 0);
    cr_expect_eq(mb.workers[0].peer[0], 2, "answered on the later try's connection");
    /* the first try, delivered late on its closed connection, and the second again */
    cr_expect_eq(mq_mb_again(&mb, &first, &o), MQ_MB_SAME);
    cr_expect_eq(mq_mb_again(&mb, &second, &o), MQ_MB_SAME);
    cr_expect_eq(mb.workers[0].peer[0], 2);
    cr_expect_eq(mb.worker_term[0], 1, "a try again is not a new holder");
    cr_expect_eq(mq_mb_count(&mb, MQ_MB_FREE), 1);
    mq_mb_destroy(&mb);
}

Test(scheduler, members_get_ready_join_rounds_fall_silent_and_leave)
{
    mq_membership_t mb;
    mq_mb_init(&mb, 8, 1);
    mq_mb_reg_out_t o;
    mq_msg_t sv = s_reg(MQ_ROLE_SERVER, 10, 10, 0, "tcp://s:1", 0);
    cr_assert_eq(mq_mb_take(&mb, &sv, true, 0.0, &o), MQ_MB_TAKEN);
    mq_msg_t w[3];
    for (int k = 0; k < 3; k++) {
        w[k] = s_reg(MQ_ROLE_WORKER, (uint8_t)k, 20 + (uint64_t)k, 0, "", 0);
        cr_assert_eq(mq_mb_take(&mb, &w[k], true, 0.0, &o), MQ_MB_TAKEN);
        w[k].rank = o.rank; /* READY names the rank it was given */
    }
    cr_expect_not(mq_mb_all_ready(&mb, 2));
    /* READY only from the node, on its connection, once */
    mq_msg_t stranger = w[0];
    stranger.peer[0] = 77;
    cr_expect_not(mq_mb_ready(&mb, &stranger, 1.0), "another connection");
    stranger = w[0];
    stranger.incarnation = 5;
    cr_expect_not(mq_mb_ready(&mb, &stranger, 1.0), "another incarnation");
    cr_expect(mq_mb_ready(&mb, &w[0], 1.0), "worker 0 ready");
    cr_expect_not(mq_mb_ready(&mb, &w[0], 1.0), "twice");
    cr_expect(mq_mb_ready(&mb, &w[1], 1.0), "worker 1 ready");
    cr_expect_not(mq_mb_all_ready(&mb, 2), "the server is not ready");
    cr_expect(mq_mb_ready(&mb, &sv, 1.0), "the server ready");
    cr_expect(mq_mb_all_ready(&mb, 2), "two workers and the server are ready");
    cr_expect_not(mq_mb_all_ready(&mb, 3), "the third is not");
    mq_mb_start(&mb); /* the first members */
    cr_expect_eq(mb.workers[0].state, MQ_MB_ACTIVE);
    cr_expect_eq(mb.servers[0].state, MQ_MB_ACTIVE);
    cr_expect_eq(mb.workers[2].state, MQ_MB_SETUP, "still loading: not a member");
    /* the third gets ready later and joins at the next round */
    cr_expect(mq_mb_ready(&mb, &w[2], 2.0), "worker 2 ready");
    uint32_t members[8], n, joined[8], nj;
    mq_mb_form_round(&mb, members, &n, joined, &nj);
    cr_expect_eq(n, 3);
    cr_expect_eq(nj, 1);
    cr_expect_eq(joined[0], 2);
    mq_mb_form_round(&mb, members, &n, joined, &nj);
    cr_expect_eq(nj, 0, "a member joins once");
    /* worker 1 falls silent: listed; the server, heard at 1.0, too once past the limit */
    mb.workers[0].last_heard = mb.workers[2].last_heard = 9.0;
    mb.servers[0].last_heard = 9.0;
    uint32_t silent[8], ns;
    cr_expect_eq(mq_mb_silent(&mb, 10.0, 5.0, silent, &ns), -1, "the server was heard");
    cr_assert_eq(ns, 1);
    cr_expect_eq(silent[0], 1);
    mb.servers[0].last_heard = 1.0;
    cr_expect_eq(mq_mb_silent(&mb, 10.0, 5.0, silent, &ns), 0);
    bool member = mq_mb_lose(&mb, 1);
    cr_expect(member, "a member was lost");
    cr_expect_eq(mb.workers[1].state, MQ_MB_FREE);
    cr_expect_null(mq_mb_node(&mb, MQ_ROLE_WORKER, 1, 21), "its incarnation holds nothing now");
    member = mq_mb_lose(&mb, 1);
    cr_expect_not(member, "a free rank is no member");
    /* its rank goes to the next holder with a new term; a rollback forgets the nodes, not the
     * terms */
    mq_msg_t next = s_reg(MQ_ROLE_WORKER, 30, 30, 0, "", 0);
    cr_assert_eq(mq_mb_take(&mb, &next, false, 11.0, &o), MQ_MB_TAKEN);
    cr_expect_eq(o.rank, 1);
    cr_expect_eq(mb.worker_term[1], 2);
    mq_mb_forget(&mb);
    cr_expect_eq(mq_mb_count(&mb, MQ_MB_FREE), 0);
    cr_expect_eq(mb.nservers, 0);
    cr_expect_eq(mb.worker_term[1], 2);
    cr_expect_eq(mb.server_term[0], 1);
    mq_mb_destroy(&mb);
}

Test(scheduler, servers_get_the_shard_they_ask_for_whatever_order_they_registered_in)
{
    mq_membership_t mb;
    mq_mb_init(&mb, 4, 3);
    mq_mb_reg_out_t o;
    /* registered in the order a (asks for 2), b (any), c (asks for 0) */
    const char *ep[3] = {"tcp://a:1", "tcp://b:1", "tcp://c:1"};
    uint32_t prefer[3] = {3, 0, 1}; /* 1 + the shard */
    for (int k = 0; k < 3; k++) {
        mq_msg_t m = s_reg(MQ_ROLE_SERVER, (uint8_t)k, 50 + (uint64_t)k, 0, ep[k], prefer[k]);
        cr_assert_eq(mq_mb_take(&mb, &m, true, 0.0, &o), MQ_MB_TAKEN);
    }
    mq_mb_place_servers(&mb);
    cr_expect_str_eq(mb.servers[2].endpoint, "tcp://a:1");
    cr_expect_str_eq(mb.servers[0].endpoint, "tcp://c:1");
    cr_expect_str_eq(mb.servers[1].endpoint, "tcp://b:1");
    for (int i = 0; i < 3; i++)
        cr_expect_eq(mb.servers[i].state, MQ_MB_SETUP);
    mq_mb_destroy(&mb);
}

/* ---- the run's horizon (horizon.c) --------------------------------------------------------- */

Test(scheduler, rounds_are_evaluated_every_n_and_at_the_last_with_its_own_limit)
{
    mq_scheduler_config_t c;
    s_parse(&c, (char *[]){"scheduler", "--iterations", "10", "--eval-every", "4",
                           "--eval-limit", "500", "--final-eval-limit", "0", NULL});
    mq_horizon_t h;
    mq_hz_init(&h, &c);
    double t = 0;
    for (uint64_t it = 0; it < 10; it++) {
        mq_hz_round_t r = mq_hz_round(&h, it, t, 1.0);
        bool want = it == 3 || it == 7 || it == 9;
        cr_expect_eq(r.evaluate, want, "round %llu evaluated: %d", (unsigned long long)it,
                     r.evaluate);
        cr_expect_eq(r.final, it == 9, "round %llu final: %d", (unsigned long long)it, r.final);
        if (r.evaluate)
            cr_expect_eq(r.limit, it == 9 ? 0u : 500u, "round %llu on %u images",
                         (unsigned long long)it, r.limit);
        t += 1.0;
        mq_hz_next_t next = mq_hz_after(&h, it + 1, t, r.evaluate);
        cr_expect_eq(next, it == 9 ? MQ_HZ_END : MQ_HZ_GO_ON, "after round %llu: %d",
                     (unsigned long long)it, next);
    }
}

Test(scheduler, a_time_budget_ends_on_the_foreseen_last_round)
{
    mq_scheduler_config_t c;
    s_parse(&c, (char *[]){"scheduler", "--iterations", "0", "--time-budget", "10",
                           "--eval-every", "0", NULL});
    mq_horizon_t h;
    mq_hz_init(&h, &c);
    /* rounds of 3 s: round 3 starts at 9 s, and 9 + 3 reaches the budget */
    double t = 0;
    for (uint64_t it = 0; it < 4; it++) {
        mq_hz_round_t r = mq_hz_round(&h, it, t, 3.0);
        cr_expect_eq(r.evaluate, it == 3, "round %llu", (unsigned long long)it);
        t += 3.0;
        cr_expect_eq(mq_hz_after(&h, it + 1, t, r.evaluate), it == 3 ? MQ_HZ_END : MQ_HZ_GO_ON,
                     "after round %llu", (unsigned long long)it);
    }
}

Test(scheduler, out_of_time_on_a_round_not_evaluated_the_run_gets_one_more_evaluated)
{
    mq_scheduler_config_t c;
    s_parse(&c, (char *[]){"scheduler", "--iterations", "0", "--time-budget", "10",
                           "--eval-every", "0", "--eval-limit", "100", "--final-eval-limit",
                           "2000", NULL});
    mq_horizon_t h;
    mq_hz_init(&h, &c);
    /* round 2 starts at 6 s after a round of 3 s (6 + 3 < 10: not foreseen as the last), and
     * takes 5 s: the budget is spent on a round that was not evaluated */
    mq_hz_round_t r = mq_hz_round(&h, 2, 6.0, 3.0);
    cr_assert(!r.evaluate && !r.final);
    cr_expect_eq(mq_hz_after(&h, 3, 11.0, false), MQ_HZ_ONE_MORE);
    r = mq_hz_round(&h, 3, 11.0, 5.0);
    cr_expect(r.evaluate && r.final, "the extra round is the evaluated last one");
    cr_expect_eq(r.limit, 2000u);
    cr_expect_eq(mq_hz_after(&h, 4, 14.0, true), MQ_HZ_END);
    /* once only: over again, even unevaluated, it ends */
    cr_expect_eq(mq_hz_after(&h, 4, 14.0, false), MQ_HZ_END);
    /* a rollback to a checkpoint starts the horizon's bookkeeping again */
    mq_hz_restart(&h);
    cr_expect_eq(mq_hz_after(&h, 3, 11.0, false), MQ_HZ_ONE_MORE);
    /* out of iterations, not of time: no extra round */
    s_parse(&c, (char *[]){"scheduler", "--iterations", "5", "--time-budget", "100", NULL});
    mq_hz_init(&h, &c);
    cr_expect_eq(mq_hz_after(&h, 5, 20.0, false), MQ_HZ_END);
    cr_expect_eq(mq_hz_after(&h, 4, 20.0, false), MQ_HZ_GO_ON);
}

/* ---- recovery (recovery.c) ----------------------------------------------------------------- */

/* A report is taken once, from a member, for the round in flight; the rest are drops with
 * their reason, a straggler's and a closed round's counted as late. */
Test(scheduler, a_report_counts_once_for_its_own_round_and_adds_to_the_round_totals)
{
    mq_round_t *r = s_round(MQ_STRAGGLERS_FIRST, 1, (uint32_t[]){0, 2}, 2, true);
    const char *why = "";
    cr_assert_eq(mq_round_report_check(r, true, 7, false, 7, 0, &why), MQ_DROP_NONE);
    cr_assert_eq(mq_round_report_check(r, true, 7, false, 6, 0, &why), MQ_DROP_LATE);
    cr_assert(strstr(why, "closed"), "%s", why);
    cr_assert_eq(mq_round_report_check(r, true, 7, false, 8, 0, &why), MQ_DROP_ITER);
    cr_assert_eq(mq_round_report_check(r, false, 7, false, 7, 0, &why), MQ_DROP_ITER,
                 "no round in flight (paused, waiting for the agent)");
    cr_assert_eq(mq_round_report_check(r, true, 7, false, 7, 1, &why), MQ_DROP_ITER,
                 "rank 1 is not a member");
    cr_assert_eq(mq_round_report_check(r, true, 7, true, 7, 1, &why), MQ_DROP_LATE,
                 "once stragglers were cut, a non-member's report is a straggler's");
    cr_assert(strstr(why, "straggler"), "%s", why);
    mq_round_out_t o;
    mq_round_report(r, 0, &o);
    cr_assert_eq(mq_round_report_check(r, true, 7, false, 7, 0, &why), MQ_DROP_DUPLICATE);

    mq_report_t sum = {0};
    mq_report_t a = {.loss = 1.5, .bytes_up = 100, .nonfinite = 1, .evaluated = true,
                     .eval_correct = 80, .eval_total = 100, .eval_ms = 40, .params = 9,
                     .zero_params = 3, .n_tensor_err = 2, .tensor_err = {0.5, 1.0}};
    mq_report_t b = {.loss = 0.5, .bytes_up = 50, .loss_nonfinite = true, .evaluated = true,
                     .eval_correct = 90, .eval_total = 100, .eval_ms = 60, .params = 9,
                     .zero_params = 3, .n_tensor_err = 2, .tensor_err = {0.25, 0.5}};
    mq_report_t other = {.loss = 1, .n_tensor_err = 3, .tensor_err = {9, 9, 9}};
    mq_round_sum(&sum, &a, 2);
    mq_round_sum(&sum, &b, 2);
    mq_round_sum(&sum, &other, 2);
    cr_assert_float_eq(sum.loss, 3.0, 1e-12);
    cr_assert_eq(sum.bytes_up, 150);
    cr_assert_eq(sum.nonfinite, 1);
    cr_assert(sum.loss_nonfinite, "one non-finite loss makes the round's");
    cr_assert_eq(sum.eval_correct, 170);
    cr_assert_eq(sum.eval_total, 200);
    cr_assert_float_eq(sum.eval_ms, 60, 1e-12, "the longest evaluation, not their sum");
    cr_assert_eq(sum.params, 9);
    cr_assert_eq(sum.n_tensor_err, 2);
    cr_assert_float_eq(sum.tensor_err[0], 0.75, 1e-12, "another layout's errors are not added");
    cr_assert_float_eq(sum.tensor_err[1], 1.5, 1e-12);
}

/* A run's life through the phases' table: registration, setup, rounds, the agent, a pause, a
 * rollback, the end; every event the table does not hold is refused, with the phase kept. */
Test(scheduler, the_phases_move_by_their_table_and_refuse_what_it_does_not_hold)
{
    mq_phases_t ph;
    mq_ph_init(&ph, 100.0);
    cr_assert_eq(ph.phase, MQ_PH_REGISTERING);
    static const struct {
        mq_phase_event_t ev;
        mq_phase_t to;
    } life[] = {
        {MQ_PE_COMPLETE, MQ_PH_PREPARING},   {MQ_PE_ISSUE, MQ_PH_RUNNING},
        {MQ_PE_ASK_AGENT, MQ_PH_WAIT_AGENT}, {MQ_PE_ISSUE, MQ_PH_RUNNING},
        {MQ_PE_ISSUE, MQ_PH_RUNNING},        {MQ_PE_SHORT, MQ_PH_PAUSED},
        {MQ_PE_SHORT, MQ_PH_PAUSED},         {MQ_PE_ISSUE, MQ_PH_RUNNING},
        {MQ_PE_ROLL_BACK, MQ_PH_REGISTERING}, {MQ_PE_COMPLETE, MQ_PH_PREPARING},
        {MQ_PE_FINISH, MQ_PH_DONE},
    };
    for (size_t i = 0; i < sizeof life / sizeof life[0]; i++) {
        mq_phase_t from = ph.phase;
        cr_assert_eq(mq_ph_go(&ph, life[i].ev, 100.0 + (double)i), (int)from, "step %zu: %s",
                     i, mq_err_last());
        cr_assert_eq(ph.phase, life[i].to, "step %zu: %s", i, mq_ph_name(ph.phase));
    }
    /* what the table does not hold */
    static const struct {
        mq_phase_t in;
        mq_phase_event_t ev;
    } refused[] = {
        {MQ_PH_REGISTERING, MQ_PE_ISSUE},   {MQ_PH_REGISTERING, MQ_PE_SHORT},
        {MQ_PH_REGISTERING, MQ_PE_ASK_AGENT}, {MQ_PH_PREPARING, MQ_PE_COMPLETE},
        {MQ_PH_PREPARING, MQ_PE_ASK_AGENT}, {MQ_PH_RUNNING, MQ_PE_COMPLETE},
        {MQ_PH_WAIT_AGENT, MQ_PE_ASK_AGENT}, {MQ_PH_PAUSED, MQ_PE_ASK_AGENT},
        {MQ_PH_PAUSED, MQ_PE_COMPLETE},     {MQ_PH_DONE, MQ_PE_ISSUE},
        {MQ_PH_DONE, MQ_PE_ROLL_BACK},      {MQ_PH_DONE, MQ_PE_FINISH},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ph.phase = refused[i].in;
        cr_assert_eq(mq_ph_go(&ph, refused[i].ev, 200.0), -1, "case %zu was taken", i);
        cr_assert_eq(ph.phase, refused[i].in, "case %zu moved the phase", i);
        cr_assert(strstr(mq_err_last(), mq_ph_name(refused[i].in)), "%s", mq_err_last());
    }
    cr_assert_eq(mq_ph_next(MQ_PH_COUNT_, MQ_PE_ISSUE), -1);
    cr_assert_eq(mq_ph_next(MQ_PH_RUNNING, MQ_PE_COUNT_), -1);
    /* every phase but DONE can roll back and finish */
    for (int p = 0; p < MQ_PH_COUNT_; p++) {
        cr_assert_eq(mq_ph_next((mq_phase_t)p, MQ_PE_ROLL_BACK),
                     p == MQ_PH_DONE ? -1 : MQ_PH_REGISTERING);
        cr_assert_eq(mq_ph_next((mq_phase_t)p, MQ_PE_FINISH), p == MQ_PH_DONE ? -1 : MQ_PH_DONE);
    }
}

/* --start-timeout from the start of registration (again after a rollback), --iter-timeout
 * from the round's issue, --pause-timeout from the start of the pause (a pause that goes on
 * keeps its start); the agent's wait and the end have none here. */
Test(scheduler, each_phase_runs_out_of_time_by_its_own_flag)
{
    mq_scheduler_config_t c;
    s_parse(&c, (char *[]){"mqgrad-scheduler", "--start-timeout", "60", "--iter-timeout", "30",
                           "--pause-timeout", "90", NULL});
    mq_phases_t ph;
    mq_ph_init(&ph, 1000.0);
    cr_expect_eq(mq_ph_due(&ph, &c, 1060.0, 0), MQ_PD_NONE);
    cr_expect_eq(mq_ph_due(&ph, &c, 1060.5, 0), MQ_PD_START);
    mq_ph_go(&ph, MQ_PE_COMPLETE, 1010.0);
    cr_expect_eq(mq_ph_due(&ph, &c, 1060.5, 0), MQ_PD_START, "setup is within the start's time");
    mq_ph_go(&ph, MQ_PE_ISSUE, 1020.0);
    cr_expect_eq(mq_ph_due(&ph, &c, 5000.0, 4990.0), MQ_PD_NONE, "the round is 10 s old");
    cr_expect_eq(mq_ph_due(&ph, &c, 5000.0, 4960.0), MQ_PD_ROUND);
    mq_ph_go(&ph, MQ_PE_ASK_AGENT, 5000.0);
    cr_expect_eq(mq_ph_due(&ph, &c, 9000.0, 4960.0), MQ_PD_NONE, "the agent has its own");
    mq_ph_go(&ph, MQ_PE_SHORT, 6000.0);
    mq_ph_go(&ph, MQ_PE_SHORT, 6050.0); /* still short */
    cr_expect_eq(ph.t_paused, 6000.0);
    cr_expect_eq(mq_ph_due(&ph, &c, 6090.0, 0), MQ_PD_NONE);
    cr_expect_eq(mq_ph_due(&ph, &c, 6090.5, 0), MQ_PD_PAUSE);
    mq_ph_go(&ph, MQ_PE_ROLL_BACK, 7000.0);
    cr_expect_eq(mq_ph_due(&ph, &c, 7059.0, 0), MQ_PD_NONE, "a rollback restarts the start's");
    cr_expect_eq(mq_ph_due(&ph, &c, 7061.0, 0), MQ_PD_START);
    mq_ph_go(&ph, MQ_PE_FINISH, 7062.0);
    cr_expect_eq(mq_ph_due(&ph, &c, 1e9, 0), MQ_PD_NONE);
}

Test(scheduler, a_round_past_its_timeout_takes_out_the_members_that_did_not_push)
{
    mq_round_t *r = s_round(MQ_STRAGGLERS_WAIT, 0, (uint32_t[]){0, 1, 2}, 3, false);
    static mq_membership_t mb;
    mq_mb_init(&mb, 3, 1);
    uint32_t stuck[3];
    cr_expect_eq(mq_rc_stuck(r, &mb, 7, stuck), 0, "nobody moved: the round is what is wrong");
    mq_round_out_t o;
    mq_round_report(r, 0, &o);     /* 0 reported */
    mb.workers[1].pushed = 7 + 1;  /* 1's loop pushed iteration 7 (its heartbeat says) */
    mb.workers[2].pushed = 6 + 1;  /* 2's last push was the round before: stuck */
    cr_assert_eq(mq_rc_stuck(r, &mb, 7, stuck), 1);
    cr_expect_eq(stuck[0], 2);
    mb.workers[2].pushed = 7 + 1;
    cr_expect_eq(mq_rc_stuck(r, &mb, 7, stuck), 0, "every member moved: nobody is stuck");
    mq_mb_destroy(&mb);
}

Test(scheduler, a_lost_server_rolls_back_to_the_last_checkpoint_or_fails_without_one)
{
    mq_rc_plan_t p = mq_rc_server_lost(0, 1, 0, 57);
    cr_expect_eq(p.action, MQ_RC_FAIL);
    cr_expect(strstr(p.why, "--checkpoint-every 0"), "%s", p.why);
    p = mq_rc_server_lost(20, -1, 0, 57);
    cr_expect_eq(p.action, MQ_RC_FAIL, "an unreadable checkpoint is no point to go back to");
    cr_expect(strstr(p.why, "cannot be read"), "%s", p.why);
    p = mq_rc_server_lost(20, 0, 40, 57);
    cr_expect_eq(p.action, MQ_RC_ROLLBACK);
    cr_expect(p.from_checkpoint);
    cr_expect_eq(p.from, 40);
    cr_expect_eq(p.lost, 17);
    p = mq_rc_server_lost(20, 1, 0, 12); /* lost before the first checkpoint */
    cr_expect_eq(p.action, MQ_RC_ROLLBACK);
    cr_expect(!p.from_checkpoint);
    cr_expect_eq(p.from, 0);
    cr_expect_eq(p.lost, 12);
}

/* ---- the run directory (resume.c) ---------------------------------------------------------- */

Test(scheduler, the_run_directory_is_new_resumed_from_its_checkpoint_or_moved_beside_when_over)
{
    mq_scheduler_config_t c;
    char base[64], dir[512];
    snprintf(base, sizeof base, "/tmp/mqgrad-open-%d", (int)getpid());
    s_parse(&c, (char *[]){"scheduler", "--run-dir", base, "--servers", "2", "--model",
                           "small", "--resume", NULL});
    snprintf(dir, sizeof dir, "%s", base);
    mq_sched_opened_t o;
    cr_assert_eq(mq_sched_open_run(&c, dir, sizeof dir, &o), 0, "%s", mq_err_last());
    cr_expect(!o.resumed, "nothing there: a new run");
    for (uint64_t it = 0; it < 30; it++) /* 30 rows recorded, a checkpoint at 20 */
        cr_assert_eq(mq_runlog_row(o.log, &(mq_metrics_row_t){.iter = it, .loss = 1}), 0);
    mq_runlog_destroy(&o.log);
    mq_sched_ckpt_t ck = {.iter = 20, .lineage = 7, .servers = 2, .model = "small", .bits = 4,
                          .last_acc = NAN, .acc_iter = NAN, .last_sparsity = NAN, .best = NAN,
                          .best_acc = NAN, .first_loss = NAN};
    cr_assert_eq(mq_sched_ckpt_write(dir, &ck), 0, "%s", mq_err_last());

    cr_assert_eq(mq_sched_open_run(&c, dir, sizeof dir, &o), 0, "%s", mq_err_last());
    cr_expect(o.resumed && o.has_ckpt);
    cr_expect_eq(o.ckpt.iter, 20);
    cr_expect_eq(o.lost, 10, "rows 20..29 are done again");
    cr_expect_str_eq(dir, base);
    cr_assert_eq(mq_runlog_summary(o.log, &(mq_summary_t){.status = "completed",
                                                          .final_test_acc = NAN,
                                                          .final_loss = NAN,
                                                          .final_sparsity = NAN}),
                 0, "%s", mq_err_last());
    mq_runlog_destroy(&o.log);

    cr_assert_eq(mq_sched_open_run(&c, dir, sizeof dir, &o), 0, "%s", mq_err_last());
    cr_expect(!o.resumed, "a completed run is not resumed: a new one beside it");
    cr_expect(strcmp(dir, base) != 0 && strncmp(dir, base, strlen(base)) == 0, "%s", dir);
    mq_runlog_destroy(&o.log);

    s_parse(&c, (char *[]){"scheduler", "--run-dir", base, "--servers", "3", "--model",
                           "small", "--resume", NULL});
    snprintf(dir, sizeof dir, "%s", base);
    char moved[512];
    snprintf(moved, sizeof moved, "%s/summary.json", base);
    cr_assert_eq(unlink(moved), 0); /* the first run unfinished again, of 2 servers */
    cr_expect_eq(mq_sched_open_run(&c, dir, sizeof dir, &o), -1);
    cr_expect(strstr(mq_err_last(), "2 servers"), "%s", mq_err_last());
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s-2", base, base);
    cr_expect_eq(system(cmd), 0);
}

Test(scheduler, an_unreadable_checkpoint_falls_back_to_the_one_before_or_ends_the_run)
{
    mq_rc_plan_t p = mq_rc_unreadable(100, 100, 0, 50);
    cr_expect_eq(p.action, MQ_RC_ROLLBACK);
    cr_expect_eq(p.from, 50);
    cr_expect_eq(p.lost, 50);
    p = mq_rc_unreadable(100, 100, 1, 0);
    cr_expect_eq(p.action, MQ_RC_FAIL, "no checkpoint before it");
    cr_expect(strstr(p.why, "no consistent checkpoint before iteration 100"), "%s", p.why);
    p = mq_rc_unreadable(100, 100, -1, 0);
    cr_expect_eq(p.action, MQ_RC_FAIL, "the one before cannot be read");
    p = mq_rc_unreadable(100, 100, 0, 100);
    cr_expect_eq(p.action, MQ_RC_FAIL, "the one before is no older");
    p = mq_rc_unreadable(100, 50, 1, 0);
    cr_expect_eq(p.action, MQ_RC_IGNORE, "a second server's word, after the fall-back");

    /* the files: the one before kept beside, and put back in its place */
    char dir[64];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-prev-%d", (int)getpid());
    cr_assert_eq(mq_mkdirs(dir), 0);
    cr_expect_eq(mq_sched_ckpt_keep_prev(dir), 0, "nothing to keep yet");
    mq_sched_ckpt_t c = {.iter = 50, .lineage = 7, .servers = 2, .model = "small", .bits = 4,
                         .last_acc = NAN, .acc_iter = NAN, .last_sparsity = NAN, .best = NAN,
                         .best_acc = NAN, .first_loss = NAN};
    mq_sched_ckpt_t r;
    cr_assert_eq(mq_sched_ckpt_write(dir, &c), 0, "%s", mq_err_last());
    cr_expect_eq(mq_sched_ckpt_read_prev(dir, &r), 1);
    cr_assert_eq(mq_sched_ckpt_keep_prev(dir), 0, "%s", mq_err_last());
    c.iter = 100;
    cr_assert_eq(mq_sched_ckpt_write(dir, &c), 0, "%s", mq_err_last());
    cr_assert_eq(mq_sched_ckpt_read_prev(dir, &r), 0, "%s", mq_err_last());
    cr_expect_eq(r.iter, 50);
    cr_assert_eq(mq_sched_ckpt_fall_back(dir, 100), 0, "%s", mq_err_last());
    cr_assert_eq(mq_sched_ckpt_read(dir, &r), 0, "%s", mq_err_last());
    cr_expect_eq(r.iter, 50, "the one before is the checkpoint now");
    cr_expect_eq(mq_sched_ckpt_read_prev(dir, &r), 1, "and there is none before it");
    char aside[128];
    snprintf(aside, sizeof aside, "%s/checkpoint-unreadable-100.json", dir);
    cr_expect_eq(access(aside, R_OK), 0, "the unreadable one is kept aside");
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(scheduler, a_checkpoint_is_due_every_n_rounds_and_consistent_once_every_server_saved_it)
{
    mq_ckround_t cp;
    mq_cp_init(&cp, 0, 3);
    cr_assert_not(mq_cp_due(&cp, 10, 2), "--checkpoint-every 0: never");
    mq_cp_destroy(&cp);
    mq_cp_init(&cp, 5, 3);
    cr_assert_not(mq_cp_due(&cp, 0, 2), "not at the start");
    cr_assert_not(mq_cp_due(&cp, 7, 2), "not between multiples");
    cr_assert(mq_cp_due(&cp, 5, 2));
    cr_assert_not(mq_cp_due(&cp, 5, 2), "a round issued again is not a second checkpoint");
    cr_assert_eq(mq_cp_keep_from(&cp), 0, "no consistent checkpoint yet");
    /* the servers' word: another iteration's, another shard's, then each shard */
    cr_assert_eq(mq_cp_saved(&cp, 4, 0, true), MQ_CP_IGNORE);
    cr_assert_eq(mq_cp_saved(&cp, 5, 2, true), MQ_CP_IGNORE, "there are two shards");
    cr_assert_eq(mq_cp_saved(&cp, 5, 1, true), MQ_CP_WAIT);
    cr_assert_eq(mq_cp_saved(&cp, 5, 1, true), MQ_CP_WAIT, "one server twice is not two");
    cr_assert_eq(mq_cp_saved(&cp, 5, 0, true), MQ_CP_COMPLETE);
    cr_assert_eq(mq_cp_saved(&cp, 5, 0, true), MQ_CP_IGNORE, "nothing pending after it");
    mq_cp_committed(&cp);
    cr_assert_eq(cp.consistent, 5);
    cr_assert_eq(mq_cp_keep_from(&cp), 5);
    /* the next: one server fails, loudly the first time only; nothing consistent moves */
    cr_assert(mq_cp_due(&cp, 10, 2));
    cr_assert_eq(mq_cp_saved(&cp, 10, 0, true), MQ_CP_WAIT);
    cr_assert_eq(mq_cp_saved(&cp, 10, 1, false), MQ_CP_FAILED_FIRST);
    cr_assert_eq(mq_cp_saved(&cp, 10, 0, true), MQ_CP_IGNORE, "a failed checkpoint is over");
    cr_assert(mq_cp_due(&cp, 15, 2));
    cr_assert_eq(mq_cp_saved(&cp, 15, 0, false), MQ_CP_FAILED);
    cr_assert_eq(cp.consistent, 5);
    cr_assert(mq_cp_due(&cp, 20, 2));
    cr_assert_eq(mq_cp_saved(&cp, 20, 0, true), MQ_CP_WAIT);
    cr_assert_eq(mq_cp_saved(&cp, 20, 1, true), MQ_CP_COMPLETE);
    mq_cp_committed(&cp);
    cr_assert_eq(cp.consistent, 20);
    cr_assert_eq(cp.before, 5);
    cr_assert_eq(mq_cp_keep_from(&cp), 5, "the servers keep the one before too");
    mq_cp_destroy(&cp);
}

Test(scheduler, a_restore_ends_the_checkpoint_in_progress_and_none_is_written_where_it_resumed)
{
    mq_ckround_t cp;
    mq_cp_init(&cp, 5, 3);
    cr_assert(mq_cp_due(&cp, 5, 1));
    mq_cp_restart(&cp, 10, 5); /* resumed from 10, the one before at 5 */
    cr_assert_eq(mq_cp_saved(&cp, 5, 0, true), MQ_CP_IGNORE, "the old one is forgotten");
    cr_assert_eq(cp.consistent, 10);
    cr_assert_eq(mq_cp_keep_from(&cp), 5);
    cr_assert_not(mq_cp_due(&cp, 10, 1), "its shards are the ones it resumed from");
    cr_assert(mq_cp_due(&cp, 15, 1));
    mq_cp_restart(&cp, 0, 0); /* rolled back to the start */
    cr_assert_eq(cp.consistent, 0);
    cr_assert_eq(mq_cp_keep_from(&cp), 0);
    cr_assert_eq(mq_cp_saved(&cp, 15, 0, true), MQ_CP_IGNORE);
    mq_cp_restart(&cp, 10, 10); /* a "before" that is not before is none */
    cr_assert_eq(cp.before, 0);
    mq_cp_destroy(&cp);
}

/* ---- the round's record (record.c) ------------------------------------------------------- */

Test(scheduler, a_closed_round_is_a_row_of_its_reports_means_and_adds_to_the_run_totals)
{
    mq_totals_t t;
    mq_watch_t w;
    mq_rec_init(&t);
    mq_watch_init(&w, NULL);
    cr_assert(isnan(t.last_acc) && isnan(t.last_loss) && t.acc_iter < 0);
    /* two reporters of three members (one cut), evaluated */
    mq_report_t sum = {.loss = 3.0, .bytes_up = 300, .bytes_down = 500, .compute_ms = 40,
                       .wait_ms = 10, .eval_correct = 150, .eval_total = 200, .params = 10,
                       .zero_params = 4, .grad_sq = 8, .sent_sq = 2, .update_sq = 0.5};
    mq_rec_round_t in = {.iter = 4, .train_time_s = 2.5, .bits = 3, .evaluated = true,
                         .nmembers = 3, .nreports = 2, .cut = 1, .slowest_rank = 2,
                         .slowest_ms = 70, .agent_ms = 1.5};
    mq_rec_out_t out;
    cr_assert_eq(mq_rec_round(&t, &w, true, &in, &sum, &out), 0, "a first loss is no spike");
    const mq_metrics_row_t *row = &out.row;
    cr_assert_eq(row->iter, 4);
    cr_assert_float_eq(row->loss, 1.5, 1e-12, "the mean over the reports in hand");
    cr_assert_float_eq(row->compute_ms, 20, 1e-12);
    cr_assert_float_eq(row->wait_ms, 5, 1e-12);
    cr_assert_eq(row->bits, 3);
    cr_assert_eq(row->workers, 3);
    cr_assert_eq(row->stragglers, 1);
    cr_assert_eq(row->slowest_rank, 2);
    cr_assert(row->evaluated);
    cr_assert_float_eq(row->test_acc, 0.75, 1e-12);
    cr_assert_float_eq(t.last_acc, 0.75, 1e-12);
    cr_assert_float_eq(t.last_sparsity, 0.4, 1e-12);
    cr_assert_float_eq(t.acc_iter, 4, 1e-12);
    cr_assert_eq(t.bytes_up, 300);
    double g, q, u;
    mq_rec_norms(&sum, in.nreports, &g, &q, &u);
    cr_assert_float_eq(g, 2, 1e-12);
    cr_assert_float_eq(q, 1, 1e-12);
    cr_assert_float_eq(u, 0.5, 1e-12);

    /* not evaluated, one loss not finite: the row's loss is NaN, the last accuracy stays */
    mq_report_t bad = {.loss = 1, .loss_nonfinite = true, .bytes_up = 100};
    in.iter = 5, in.evaluated = false, in.nreports = 1;
    unsigned a = mq_rec_round(&t, &w, false, &in, &bad, &out);
    cr_assert(isnan(out.row.loss));
    cr_assert(!out.row.evaluated);
    cr_assert_float_eq(t.last_acc, 0.75, 1e-12);
    cr_assert_float_eq(t.acc_iter, 4, 1e-12);
    cr_assert_eq(t.bytes_up, 400);
    cr_assert_eq(a, MQ_REC_DIVERGED, "a loss that is not finite diverges; continue: no stop");
    cr_assert_str_eq(w.rule, "nonfinite");
    in.iter = 6;
    mq_report_t ok = {.loss = 1};
    cr_assert_eq(mq_rec_round(&t, &w, false, &in, &ok, &out), 0, "said once");
}

Test(scheduler, a_spike_raises_the_guard_and_a_divergence_stops_the_run_only_under_stop)
{
    mq_totals_t t;
    mq_watch_t w;
    mq_rec_init(&t);
    mq_watch_init(&w, NULL);
    mq_rec_out_t out;
    mq_rec_round_t in = {.bits = 2, .nmembers = 1, .nreports = 1};
    for (in.iter = 0; in.iter < 30; in.iter++)
        cr_assert_eq(mq_rec_round(&t, &w, true, &in, &(mq_report_t){.loss = 1}, &out), 0);
    unsigned a = mq_rec_round(&t, &w, true, &in, &(mq_report_t){.loss = 3}, &out);
    cr_assert_eq(a, MQ_REC_GUARD, "three times the smoothed loss after the warm-up");
    cr_assert_float_eq(out.smoothed_before, 1, 1e-9);
    cr_assert_gt(mq_watch_bits(&w, in.iter + 1, 2), 2, "the guard's floor holds");
    in.iter++;
    a = mq_rec_round(&t, &w, true, &in, &(mq_report_t){.loss = 1, .nonfinite = 5}, &out);
    cr_assert_eq(a, MQ_REC_DIVERGED | MQ_REC_STOP, "non-finite values, --on-divergence stop");

    /* the accuracy rule, on an evaluated round; a stop already told is not judged twice */
    mq_rec_init(&t);
    mq_watch_init(&w, NULL);
    in = (mq_rec_round_t){.bits = 2, .nmembers = 1, .nreports = 1, .evaluated = true};
    mq_report_t good = {.loss = 1, .eval_correct = 80, .eval_total = 100};
    mq_report_t dead = {.loss = 1, .eval_correct = 10, .eval_total = 100};
    cr_assert_eq(mq_rec_round(&t, &w, true, &in, &good, &out), 0);
    in.iter = 1;
    a = mq_rec_round(&t, &w, true, &in, &dead, &out);
    cr_assert_eq(a, MQ_REC_DIVERGED | MQ_REC_STOP, "from 80 %% to chance");
    cr_assert_str_eq(w.rule, "accuracy");
}

Test(scheduler, the_summary_and_a_checkpoint_carry_the_record_and_a_stale_accuracy_is_not_final)
{
    mq_totals_t t;
    mq_watch_t w;
    mq_rec_init(&t);
    mq_watch_init(&w, NULL);
    mq_rec_out_t out;
    mq_rec_round_t in = {.bits = 4, .nmembers = 2, .nreports = 2, .evaluated = true};
    mq_report_t r = {.loss = 2, .bytes_up = 7, .bytes_down = 9, .eval_correct = 170,
                     .eval_total = 200};
    for (in.iter = 0; in.iter < 3; in.iter++)
        mq_rec_round(&t, &w, false, &in, &r, &out);
    mq_summary_t s = {0};
    mq_rec_summary(&t, &w, &s);
    cr_assert_float_eq(s.final_test_acc, 0.85, 1e-12);
    cr_assert_float_eq(s.final_loss, 1, 1e-12);
    cr_assert_eq(s.bytes_up, 21);
    cr_assert_eq(s.bytes_down, 27);
    cr_assert_null(s.divergence_rule);
    cr_assert(!mq_rec_final(&t, &w, 3), "85 %% at the last round: it learned");

    /* into a checkpoint and back: the same totals and watch */
    mq_sched_ckpt_t c = {0};
    mq_rec_save(&t, &w, &c);
    mq_totals_t t2;
    mq_watch_t w2;
    mq_rec_init(&t2);
    mq_watch_init(&w2, NULL);
    mq_rec_load(&t2, &w2, &c);
    cr_assert_eq(t2.bytes_up, t.bytes_up);
    cr_assert_float_eq(t2.last_acc, t.last_acc, 1e-12);
    cr_assert_float_eq(t2.acc_iter, t.acc_iter, 1e-12);
    cr_assert_float_eq(w2.smoothed, w.smoothed, 1e-12);
    cr_assert_float_eq(w2.best, w.best, 1e-12);
    cr_assert_eq(w2.seen, w.seen);

    /* the run then diverges on a round that is not evaluated: the accuracy measured before
     * is not what it ended with */
    in.evaluated = false;
    mq_rec_round(&t, &w, false, &in, &(mq_report_t){.loss = 2, .nonfinite = 1}, &out);
    memset(&s, 0, sizeof s);
    mq_rec_summary(&t, &w, &s);
    cr_assert_str_eq(s.divergence_rule, "nonfinite");
    cr_assert_eq(s.divergence_iter, 3);
    cr_assert(isnan(s.final_test_acc));
    cr_assert(!mq_rec_final(&t, &w, 4), "the last round was not evaluated: nothing judged");

    /* a run that ends evaluated at chance did not learn */
    mq_rec_init(&t);
    mq_watch_init(&w, NULL);
    in = (mq_rec_round_t){.bits = 4, .nmembers = 1, .nreports = 1, .evaluated = false};
    for (in.iter = 0; in.iter < 99; in.iter++)
        mq_rec_round(&t, &w, false, &in, &(mq_report_t){.loss = 2.3}, &out);
    in.evaluated = true;
    mq_rec_round(&t, &w, false, &in,
                 &(mq_report_t){.loss = 2.3, .eval_correct = 10, .eval_total = 100}, &out);
    cr_assert(mq_rec_final(&t, &w, 100));
    cr_assert_str_eq(w.rule, "chance");
}
