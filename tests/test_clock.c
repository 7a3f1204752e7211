/* The simulated clock (mqgrad/ps.h): the link model's arithmetic by hand, and the same runs
 * on both clocks agreeing on iteration times where the real clock measures what the simulated
 * one models (links that dominate the iteration; CPU contention between nodes sharing cores,
 * which the simulated clock removes by design, taken out as bench/clock_check.sh does). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "local_run.h"
#include "mqgrad/ps.h"
#include "mqgrad/util.h"

/* ---- the link model on the simulated clock ---------------------------------------------- */

/* Spins until this thread has used at least S more seconds of CPU. */
static void s_burn(double s)
{
    double end = mq_thread_cpu_s() + s;
    volatile double x = 0;
    while (mq_thread_cpu_s() < end)
        x += 1;
}

Test(clock, egress_blocks_the_sender_and_stamps_the_last_byte)
{
    mq_link_t l;
    mq_link_init(&l, 80, true); /* 10 MB/s */
    double t0 = mq_link_now(&l);
    cr_assert_lt(t0, 0.01, "a new link's time starts at 0, got %g", t0);
    double stamp = mq_link_egress(&l, 5000000);
    cr_assert_float_eq(stamp, t0 + 0.5, 0.01, "5 MB at 10 MB/s leave 0.5 s later: %g", stamp);
    double stamp2 = mq_link_egress(&l, 1000000);
    cr_assert_float_eq(stamp2, stamp + 0.1, 0.01, "the second waits for the first: %g", stamp2);
    cr_assert_geq(mq_link_now(&l), stamp2, "the sender was blocked until its bytes were out");
    cr_assert_eq(l.bytes_out, 6000000);
}

Test(clock, async_egress_queues_the_bytes_and_the_sender_goes_on)
{
    mq_link_t l;
    mq_link_init(&l, 80, true); /* 10 MB/s */
    double t0 = mq_link_now(&l);
    double stamp = mq_link_egress_async(&l, 5000000);
    cr_assert_float_eq(stamp, t0 + 0.5, 0.01, "5 MB at 10 MB/s leave 0.5 s later: %g", stamp);
    cr_assert_lt(mq_link_now(&l), t0 + 0.01, "the sender went on at once");
    s_burn(0.1); /* the backward pass runs while the bytes leave */
    double stamp2 = mq_link_egress_async(&l, 1000000);
    cr_assert_float_eq(stamp2, stamp + 0.1, 0.01, "queued behind the first: %g", stamp2);
    /* a blocking send after them waits for all of them, then its own bytes */
    double stamp3 = mq_link_egress(&l, 1000000);
    cr_assert_float_eq(stamp3, stamp2 + 0.1, 0.01, "behind both: %g", stamp3);
    cr_assert_geq(mq_link_now(&l), stamp3, "a blocking send waits until its bytes are out");
    /* once the NIC is idle, a send starts from the node's time */
    s_burn(0.02);
    double t4 = mq_link_now(&l);
    double stamp4 = mq_link_egress_async(&l, 100000);
    cr_assert_float_eq(stamp4, t4 + 0.01, 0.005, "an idle NIC: %g from %g", stamp4, t4);
    cr_assert_eq(l.bytes_out, 7100000);
    /* the receiver has it when its stamp says, not before */
    mq_link_t r;
    mq_link_init(&r, 80, true);
    mq_link_arrive(&r, 5000000, stamp);
    cr_assert_float_eq(mq_link_settle(&r), stamp, 0.01);
}

Test(clock, ingress_is_charged_in_stamp_order_whatever_the_order_taken)
{
    /* Two 1 MB messages into a 10 MB/s NIC, stamped 2.0 and 1.0 (their last bytes left then):
     * the one stamped 1.0 streamed in during [0.9, 1.0], the other during [1.9, 2.0]; taken in
     * either order, the node has both at 2.0. */
    for (int order = 0; order < 2; order++) {
        mq_link_t l;
        mq_link_init(&l, 80, true);
        double a = order ? 1.0 : 2.0, b = order ? 2.0 : 1.0;
        mq_link_arrive(&l, 1000000, a);
        mq_link_arrive(&l, 1000000, b);
        double t = mq_link_settle(&l);
        cr_assert_float_eq(t, 2.0, 0.005, "order %d: all in at %g, expected 2.0", order, t);
    }
    /* Stamped together, they share the NIC: the second is in 0.1 s after the first. */
    mq_link_t l;
    mq_link_init(&l, 80, true);
    mq_link_arrive(&l, 1000000, 1.0);
    mq_link_arrive(&l, 1000000, 1.0);
    cr_assert_float_eq(mq_link_settle(&l), 1.1, 0.005);
    cr_assert_eq(l.bytes_in, 2000000);
}

Test(clock, compute_is_charged_as_cpu_time_and_idle_time_jumps)
{
    mq_link_t l;
    mq_link_init(&l, 0, true); /* no rate limit: only compute and stamps */
    mq_link_sync(&l, 3.0);     /* a message stamped 3.0: the node was idle until then */
    double t0 = mq_link_now(&l);
    cr_assert_float_eq(t0, 3.0, 0.005);
    s_burn(0.05);
    double t1 = mq_link_now(&l);
    cr_assert(t1 - t0 >= 0.05 && t1 - t0 < 0.1, "50 ms of CPU advance the clock by %g s", t1 - t0);
    /* Work on a message that arrives after the node is free starts at its arrival. */
    mq_link_arrive(&l, 100, 5.0);
    s_burn(0.02);
    double t2 = mq_link_settle(&l);
    cr_assert(t2 >= 5.02 && t2 < 5.06, "arrival 5.0 + 20 ms of work: %g", t2);
    /* A message already waiting when the node is busy costs no idle time. */
    mq_link_arrive(&l, 100, 1.0);
    double t3 = mq_link_settle(&l);
    cr_assert(t3 >= t2 && t3 < t2 + 0.01, "an early message adds no idle time: %g after %g", t3,
              t2);
    /* Evaluation between pause and resume is not the run's time. */
    double p = mq_link_pause(&l);
    s_burn(0.03);
    mq_link_resume(&l);
    cr_assert_lt(mq_link_now(&l) - p, 0.005, "paused work was charged");
}

Test(clock, the_real_clock_is_the_wall)
{
    mq_link_t l;
    mq_link_init(&l, 80, false);
    double w0 = mq_now_s();
    cr_assert_float_eq(mq_link_now(&l), w0, 0.01);
    cr_assert_eq(mq_link_egress(&l, 200000), 0, "a blocking send stamps nothing");
    double w1 = mq_now_s();
    cr_assert(w1 - w0 >= 0.019, "200 kB at 10 MB/s sleep 20 ms, slept %g s", w1 - w0);
}

/* The real clock's async send: no sleep at the sender (it returns well before its 2 s of
 * bytes could have left), a wall-clock stamp, and a receiver that sleeps until then.
 * Stamps no sender could have made are taken as "now": a peer cannot put a receiver to
 * sleep for longer than the bytes it sends. */
Test(clock, the_real_clocks_async_send_sleeps_at_the_receiver)
{
    mq_link_t l, r;
    mq_link_init(&l, 80, false);
    mq_link_init(&r, 80, false);
    double w0 = mq_now_s();
    double stamp = mq_link_egress_async(&l, 20000000); /* 2 s at 10 MB/s */
    double w1 = mq_now_s();
    cr_assert_gt(stamp, 1e9, "a wall-clock stamp (seconds since 1970): %g", stamp);
    cr_assert_lt(w1 - w0, 1.0, "the sender waited %g s for bytes that take 2 s", w1 - w0);
    mq_link_arrive(&r, 20000000, stamp);
    double w2 = mq_now_s();
    cr_assert(w2 - w0 >= 1.99, "the receiver has 20 MB at 10 MB/s after 2 s, had it after %g s",
              w2 - w0);
    /* a stamp an hour ahead: not slept for */
    mq_link_init(&r, 80, false);
    double w3 = mq_now_s();
    mq_link_arrive(&r, 100000, stamp + 3600);
    cr_assert_lt(mq_now_s() - w3, 1.0, "a stamp an hour ahead was slept for");
    cr_assert_eq(r.untrusted, 1, "and counted");
}

/* ---- link schedules (mqgrad/ps.h) ------------------------------------------------------- */

#define MB 1e6

Test(clock, a_schedule_integrates_its_rates_by_hand)
{
    mq_link_rate_t r;
    char err[256];
    /* 8 Mbit/s (1 MB/s) for 2 s, then 80 (10 MB/s) for 2 s, again and again: 22 MB a period */
    cr_assert_eq(mq_link_rate_for("8@0,80@2/4", "worker", 0, &r, err, sizeof err), 0, "%s", err);
    cr_assert_eq(r.n, 2);
    cr_assert_float_eq(mq_link_rate_mbps(&r, 1.0), 8, 1e-9);
    cr_assert_float_eq(mq_link_rate_mbps(&r, 2.0), 80, 1e-9);
    cr_assert_float_eq(mq_link_rate_mbps(&r, 4001.5), 8, 1e-9, "periodic");
    /* 2 MB by t = 2, the third at 10 MB/s */
    cr_assert_float_eq(mq_link_rate_finish(&r, 0, 3 * MB), 2.1, 1e-9);
    /* from 1: 1 MB to 2, 20 to 4, 2 to 6, then 7 of 20 at 10 MB/s */
    cr_assert_float_eq(mq_link_rate_finish(&r, 1, 30 * MB), 6.7, 1e-9);
    cr_assert_float_eq(mq_link_rate_start(&r, 6.7, 30 * MB), 1.0, 1e-9, "backwards, the same");
    /* a thousand whole periods at once, then 1 MB at 1 MB/s */
    cr_assert_float_eq(mq_link_rate_finish(&r, 0, 1000 * 22 * MB + 1 * MB), 4001.0, 1e-6);
    cr_assert_float_eq(mq_link_rate_start(&r, 4001.0, 1000 * 22 * MB + 1 * MB), 0.0, 1e-6);
    /* a link that degrades: 10 MB/s until 10 s, then 1 MB/s for good */
    cr_assert_eq(mq_link_rate_for("80@0,8@10", "server", 3, &r, err, sizeof err), 0, "%s", err);
    cr_assert_float_eq(mq_link_rate_finish(&r, 9, 20 * MB), 20.0, 1e-9);
    cr_assert_float_eq(mq_link_rate_start(&r, 20, 20 * MB), 9.0, 1e-9);
    cr_assert_float_eq(mq_link_rate_start(&r, 1, 20 * MB), -1.0, 1e-9, "before 0: the first");
    cr_assert_float_eq(mq_link_rate_finish(&r, 1e6, 1 * MB), 1e6 + 1, 1e-6, "the last lasts");
}

Test(clock, a_node_takes_its_rank_then_its_role_then_every_node)
{
    const char *spec = "1000;worker=100;worker:2=10;server:0=50";
    struct {
        const char *role;
        int rank;
        double mbps;
    } want[] = {{"worker", 0, 100}, {"worker", 2, 10}, {"server", 0, 50}, {"server", 1, 1000}};
    for (size_t k = 0; k < sizeof want / sizeof *want; k++) {
        mq_link_rate_t r;
        char err[256];
        cr_assert_eq(mq_link_rate_for(spec, want[k].role, want[k].rank, &r, err, sizeof err), 0);
        cr_assert_float_eq(mq_link_rate_mbps(&r, 0), want[k].mbps, 1e-9, "%s %d", want[k].role,
                           want[k].rank);
    }
    mq_link_rate_t r;
    cr_assert_eq(mq_link_rate_for("worker:1=10", "server", 0, &r, NULL, 0), 0);
    cr_assert_eq(r.n, 0, "a node no part names has no emulation");
    cr_assert_eq(mq_link_rate_for("0", "worker", 0, &r, NULL, 0), 0);
    cr_assert_eq(r.n, 0, "a rate of 0 is no emulation");
}

Test(clock, a_bad_schedule_is_refused_naming_its_part)
{
    struct {
        const char *spec, *says;
    } bad[] = {
        {"", "empty"},
        {"fast", "expected a rate"},
        {"80@5", "first step must start at 0"},
        {"80@0,10@0", "after the one before"},
        {"80,10", "needs @SECONDS"},
        {"80@0,10@3/2", "period must be after the last step"},
        {"80/3", "two steps or more"},
        {"0,80@1", "must stand alone"},
        {"2000000", "[0.001, 1000000]"},
        {"80@0,10@3/6x", "after '/'"},
        {"80;gpu=10", "expected worker, server"},
        {"worker:-1=10", "expected a rank"},
        {"80;worker=5;worker=6", "same nodes as an earlier part"},
        {"80@0,1@1,2@2,3@3,4@4,5@5,6@6,7@7,8@8,9@9,10@10,11@11,12@12,13@13,14@14,15@15,16@16",
         "more than 16 steps"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char err[256] = "";
        cr_assert_eq(mq_link_spec_check(bad[k].spec, err, sizeof err), -1, "'%s' accepted",
                     bad[k].spec);
        cr_assert(strstr(err, bad[k].says), "'%s': '%s' does not say '%s'", bad[k].spec, err,
                  bad[k].says);
    }
}

Test(clock, a_send_that_spans_a_rate_change_on_the_simulated_clock)
{
    mq_link_rate_t r;
    cr_assert_eq(mq_link_rate_for("8@0,80@2/4", "worker", 0, &r, NULL, 0), 0);
    mq_link_t l, in;
    mq_link_init_rate(&l, &r, true);
    mq_link_init_rate(&in, &r, true);
    double stamp = mq_link_egress(&l, 3000000); /* 2 MB at 1 MB/s, 1 MB at 10 MB/s */
    cr_assert_float_eq(stamp, 2.1, 0.01);
    cr_assert_float_eq(mq_link_mbps_now(&l), 80, 1e-9, "the node's time is 2.1: the fast half");
    /* The receiver's ingress, on the same schedule, has the message at its stamp. */
    mq_link_arrive(&in, 3000000, stamp);
    cr_assert_float_eq(mq_link_settle(&in), stamp, 0.01);
}

Test(clock, the_real_clocks_schedule_runs_on_the_run_time_it_is_given)
{
    mq_link_rate_t r;
    cr_assert_eq(mq_link_rate_for("8@0,80@2/4", "worker", 0, &r, NULL, 0), 0);
    mq_link_t l;
    mq_link_init_rate(&l, &r, false);
    cr_assert_float_eq(mq_link_mbps_now(&l), 8, 1e-9, "run time 0 at the start");
    mq_link_anchor(&l, 103.0); /* an ITERATE at 103 s of training: the fast half */
    cr_assert_float_eq(mq_link_mbps_now(&l), 80, 1e-9);
    double w0 = mq_now_s();
    mq_link_egress(&l, 1000000); /* 1 MB at 10 MB/s: 0.1 s */
    double took = mq_now_s() - w0;
    cr_assert(took >= 0.095 && took < 0.5, "1 MB at 80 Mbit/s took %.3f s", took);
    mq_link_anchor(&l, 101.0); /* the slow half: 1 MB/s */
    w0 = mq_now_s();
    mq_link_egress(&l, 300000);
    took = mq_now_s() - w0;
    cr_assert(took >= 0.29 && took < 0.8, "0.3 MB at 8 Mbit/s took %.3f s", took);
}

/* ---- the same run on both clocks ------------------------------------------------------- */

/* The median of V[0..N) (sorted in place; N >= 1). */
static double s_median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double x = v[j];
            v[j] = v[j - 1], v[j - 1] = x;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* DIR/metrics.csv's iterations 1.. (0 warms up): each one's time into D and its compute_ms into
 * C (seconds); returns how many (at least 2). */
static int s_iterations(const char *dir, double *d, double *c, int max)
{
    char *csv = test_slurp(dir, "metrics.csv");
    double prev = 0;
    int n = 0, row = 0;
    for (char *save, *line = strtok_r(csv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (row++ == 0)
            continue; /* header: iter,train_time_s,loss,smoothed_loss,bits,up,down,compute_ms */
        double v[8];
        char *p = line;
        for (int k = 0; k < 8; k++) {
            v[k] = strtod(p, &p);
            p += *p == ',';
        }
        if (row > 2 && n < max) {
            d[n] = v[1] - prev;
            c[n] = v[7] / 1e3;
            n++;
        }
        prev = v[1];
    }
    free(csv);
    cr_assert_geq(n, 2, "%s: too few iterations", dir);
    return n;
}

/* Runs NAME (MODEL, ITERS iterations on MBPS, METHOD) on CLOCK into a fresh directory and returns
 * its metrics as s_iterations does. */
static int s_run_clock(const char *name, const char *model, const char *iters, const char *mbps,
                       const char *const *method, const char *clock, double *d, double *c, int max)
{
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-test-clock-%d-%s-%s", (int)getpid(), name, clock);
    const char *args[24] = {"--model",      model, "--iterations",       iters, "--eval-every",
                            "0",            "--final-eval-limit", "100", "--link-mbps", mbps,
                            "--clock",      clock, "--seed",       "1",  "--threshold", "100"};
    int n = 16;
    for (int i = 0; method[i]; i++)
        args[n++] = method[i];
    args[n] = NULL;
    int rc = test_wait(test_spawn_args(dir, args), 300);
    cr_assert_eq(rc, 0, "%s on the %s clock exited %d", name, clock, rc);
    char *sum = test_slurp(dir, "summary.json");
    char says[64];
    snprintf(says, sizeof says, "\"clock\": \"%s\"", clock);
    cr_assert(strstr(sum, says), "the summary names its clock: %s", sum);
    free(sum);
    n = s_iterations(dir, d, c, max);
    test_rmtree(dir);
    return n;
}

/* The simulated clock's iteration (the median; it depends on the machine only through compute
 * time) against the real clock's on this machine. Other processes only ever slow the real run
 * down, so it is measured by its least disturbed iteration, each less the compute it took beyond
 * the simulated run's (contention that separate machines would not have had); and a real run
 * that a loaded machine put out of the tolerance gets up to two more tries. A simulator that
 * charges the wrong bytes or rates is off by far more than 5 % on every try. */
static void s_compare(const char *name, const char *model, const char *iters, const char *mbps,
                      const char *const *method)
{
    double d[64], c[64];
    int n = s_run_clock(name, model, iters, mbps, method, "simulated", d, c, 64);
    double sim = s_median(d, n), sim_compute = s_median(c, n);
    double ratio = 0, real = 0, excess = 0;
    for (int attempt = 1; attempt <= 3; attempt++) {
        n = s_run_clock(name, model, iters, mbps, method, "real", d, c, 64);
        real = INFINITY;
        for (int i = 0; i < n; i++) {
            double x = c[i] > sim_compute ? c[i] - sim_compute : 0;
            if (d[i] - x < real)
                real = d[i] - x, excess = x;
        }
        ratio = sim / real;
        cr_log_info("%s, try %d: real %.1f ms (%.1f of contention), simulated %.1f ms: ratio %.3f",
                    name, attempt, (real + excess) * 1e3, excess * 1e3, sim * 1e3, ratio);
        if (fabs(ratio - 1) <= 0.05)
            break;
    }
    cr_assert(fabs(ratio - 1) <= 0.05,
              "%s: simulated iteration %.1f ms vs real %.1f ms less %.1f ms of contention, "
              "after 3 tries: ratio %.3f, not within 5 %%",
              name, sim * 1e3, (real + excess) * 1e3, excess * 1e3, ratio);
}

/* The paper model throughout: on the small model an iteration takes tens of milliseconds and
 * the real system's fixed costs per message (wake-ups of 6 processes on 2 cores) are several
 * per cent of it, which the link model does not claim to charge (bench/README.md). */
Test(clock, simulated_matches_real_fp32_80mbit, .timeout = 600)
{
    const char *m[] = {"--codec", "none", "--policy", "none", NULL};
    s_compare("fp32", "paper", "4", "80", m);
}

Test(clock, simulated_matches_real_8bit_80mbit, .timeout = 600)
{
    const char *m[] = {"--policy", "fixed:8", NULL};
    s_compare("8bit", "paper", "5", "80", m);
}

/* 2 bits on 40 Mbit/s, not 80: at 80 an iteration is ~1.5 s, of which ~0.1 s is compute and
 * the messages' fixed costs, and on a loaded CI machine the real run's servers lost ~85 ms an
 * iteration to other processes (contention that compute_ms does not see): 5.4 %. At 40 the link
 * is twice the share of the iteration and the same loss is under 3 %. */
Test(clock, simulated_matches_real_2bit_40mbit, .timeout = 600)
{
    const char *m[] = {"--policy", "fixed:2", NULL};
    s_compare("2bit", "paper", "6", "40", m);
}

Test(clock, a_bad_clock_is_refused, .timeout = 60)
{
    const char *args[] = {"--iterations", "1", "--clock", "sundial", NULL};
    int rc = test_wait(test_spawn_args("/tmp/mqgrad-test-clock-bad", args), 30);
    cr_assert_eq(rc, 2, "--clock sundial exited %d, expected 2 (bad usage)", rc);
}

/* ---- link schedules and per-node rates in whole runs ----------------------------------- */

/* Column NAME of DIR/metrics.csv, iterations 1.. (0 warms up), into V (at most MAX); returns
 * how many. */
static int s_column(const char *dir, const char *name, double *v, int max)
{
    char *csv = test_slurp(dir, "metrics.csv");
    int col = -1, n = 0, row = 0;
    for (char *save, *line = strtok_r(csv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *p = line;
        for (int k = 0; *p || k == 0; k++) {
            char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (row == 0 && strlen(name) == len && strncmp(p, name, len) == 0)
                col = k;
            if (row > 1 && k == col && n < max)
                v[n++] = strtod(p, NULL);
            if (!end)
                break;
            p = end + 1;
        }
        cr_assert(row > 0 || col >= 0, "%s/metrics.csv has no column %s", dir, name);
        row++;
    }
    free(csv);
    return n;
}

/* Runs the small model in fp32 for ITERS iterations (or, with ITERS "0", BUDGET seconds of
 * training) under --link SPEC on CLOCK into DIR. */
static void s_run_link(const char *dir, const char *spec, const char *clock, const char *iters,
                       const char *budget)
{
    const char *args[] = {"--model",      "small", "--codec",      "none", "--policy",
                          "none",         "--link", spec,          "--clock", clock,
                          "--iterations", iters,   "--time-budget", budget, "--eval-every",
                          "0",            "--final-eval-limit", "100", "--seed", "1",
                          NULL};
    int rc = test_wait(test_spawn_args(dir, args), 300);
    cr_assert_eq(rc, 0, "--link '%s' on the %s clock exited %d (%s/logs)", spec, clock, rc, dir);
}

/* A square wave between 8 and 80 Mbit/s, 3 s each: on both clocks the round's time follows
 * the link (fp32 traffic dominates the small model's iteration), and the clocks agree. */
Test(clock, a_square_wave_link_on_both_clocks, .timeout = 300)
{
    const char *clocks[2] = {"real", "simulated"};
    double med[2][2]; /* clock, slow/fast half */
    for (int k = 0; k < 2; k++) {
        char dir[256];
        snprintf(dir, sizeof dir, "/tmp/mqgrad-test-clock-%d-square-%s", (int)getpid(), clocks[k]);
        s_run_link(dir, "8@0,80@3/6", clocks[k], "0", "12");
        char *cfg = test_slurp(dir, "config.json");
        cr_assert(strstr(cfg, "\"link\":\"8@0,80@3/6\""), "config.json names the schedule: %s",
                  cfg);
        free(cfg);
        double t[1024], d[1024], half[2][1024];
        int n = s_column(dir, "train_time_s", t, 1024), nh[2] = {0, 0};
        for (int i = 1; i < n; i++) {
            d[i] = t[i] - t[i - 1];
            double phase = fmod(t[i] - d[i] / 2, 6.0); /* where the iteration's middle fell */
            int h = phase > 3.3 && phase < 5.7 ? 1 : phase > 0.3 && phase < 2.7 ? 0 : -1;
            if (h >= 0)
                half[h][nh[h]++] = d[i];
        }
        cr_assert(nh[0] >= 3 && nh[1] >= 3, "%s: %d slow and %d fast iterations", clocks[k],
                  nh[0], nh[1]);
        med[k][0] = s_median(half[0], nh[0]);
        med[k][1] = s_median(half[1], nh[1]);
        cr_log_info("square wave, %s clock: %.1f ms an iteration at 8 Mbit/s (%d), %.1f at 80 "
                    "(%d)",
                    clocks[k], med[k][0] * 1e3, nh[0], med[k][1] * 1e3, nh[1]);
        cr_assert(med[k][0] >= 5 * med[k][1],
                  "%s clock: %.1f ms at 8 Mbit/s is not 5x the %.1f ms at 80", clocks[k],
                  med[k][0] * 1e3, med[k][1] * 1e3);
        test_rmtree(dir);
    }
    for (int h = 0; h < 2; h++)
        cr_assert(fabs(med[1][h] / med[0][h] - 1) <= 0.25,
                  "the %s half: simulated %.1f ms against real %.1f ms", h ? "fast" : "slow",
                  med[1][h] * 1e3, med[0][h] * 1e3);
}

/* One slow worker (8 Mbit/s among 80): it is the round's slowest member, and the round takes
 * at least its NIC's time for its push; slow servers: their ingress of every push. */
Test(clock, one_slow_worker_or_slow_servers_on_both_clocks, .timeout = 300)
{
    const char *clocks[2] = {"real", "simulated"};
    for (int k = 0; k < 2; k++) {
        char dir[256];
        snprintf(dir, sizeof dir, "/tmp/mqgrad-test-clock-%d-slow-%s", (int)getpid(), clocks[k]);
        s_run_link(dir, "80;worker:1=8", clocks[k], "12", "0");
        double t[64], up[64], slowest[64];
        int n = s_column(dir, "train_time_s", t, 64);
        s_column(dir, "bytes_up", up, 64);
        s_column(dir, "slowest_rank", slowest, 64);
        double d[64];
        int ones = 0;
        for (int i = 1; i < n; i++) {
            d[i - 1] = t[i] - t[i - 1];
            ones += slowest[i] == 1;
        }
        double it = s_median(d, n - 1), floor_s = up[0] / 2 / 1e6; /* one worker's push at 1 MB/s */
        cr_log_info("one slow worker, %s clock: %.1f ms an iteration, its push alone %.1f ms; "
                    "slowest rank 1 in %d of %d",
                    clocks[k], it * 1e3, floor_s * 1e3, ones, n - 1);
        cr_assert(ones >= (n - 1) * 9 / 10, "%s: worker 1 was the slowest in %d of %d rounds",
                  clocks[k], ones, n - 1);
        cr_assert(it >= 0.95 * floor_s, "%s: %.1f ms an iteration, below the slow NIC's %.1f",
                  clocks[k], it * 1e3, floor_s * 1e3);
        test_rmtree(dir);

        s_run_link(dir, "80;server=8", clocks[k], "8", "0");
        n = s_column(dir, "train_time_s", t, 64);
        s_column(dir, "bytes_up", up, 64);
        for (int i = 1; i < n; i++)
            d[i - 1] = t[i] - t[i - 1];
        it = s_median(d, n - 1);
        floor_s = up[0] / 2 / 1e6; /* each of the 2 servers takes half of every push at 1 MB/s */
        cr_log_info("slow servers, %s clock: %.1f ms an iteration, their ingress %.1f ms",
                    clocks[k], it * 1e3, floor_s * 1e3);
        cr_assert(it >= 0.95 * floor_s, "%s: %.1f ms an iteration, below the servers' %.1f",
                  clocks[k], it * 1e3, floor_s * 1e3);
        test_rmtree(dir);
    }
}

Test(clock, a_bad_link_schedule_is_refused, .timeout = 60)
{
    const char *args[] = {"--iterations", "1", "--link", "80@0,8@0", NULL};
    int rc = test_wait(test_spawn_args("/tmp/mqgrad-test-clock-badlink", args), 30);
    cr_assert_eq(rc, 2, "--link '80@0,8@0' exited %d, expected 2 (bad usage)", rc);
}
