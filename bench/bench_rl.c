/* Decision latency of the bit-width policies: the cost of an observation that only fills the
 * window, of one that closes it (an MDP step), and of saving/restoring the whole state, each
 * printed against a baseline measured in the same run (these machines are noisy). */
#include "mqgrad/rl.h"
#include "mqgrad/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_OBS 200000

static double s_clock_s; /* cost of the two clock reads around a call */

static void s_measure_clock(void)
{
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double t0 = mq_now_s();
        sum += mq_now_s() - t0;
    }
    s_clock_s = sum / 100000;
}

/* Mean seconds per observe call, split into window-filling and window-closing calls. */
static void s_time_policy(const char *spec, double *fill_s, double *close_s)
{
    mq_policy_t *p = mq_policy_new(spec, NULL);
    if (!p) {
        fprintf(stderr, "bench_rl: %s\n", mq_err_last());
        exit(1);
    }
    double fill = 0, close = 0;
    int nfill = 0, nclose = 0;
    for (uint64_t m = 0; m < N_OBS; m++) {
        mq_observation_t o = {.iter = m,
                              .loss = 2.0 / (1 + 1e-4 * m),
                              .iter_ms = 100,
                              .grad_range = 10,
                              .grad_sqmean = 1,
                              .total_iters = N_OBS};
        double t0 = mq_now_s();
        mq_policy_observe(p, &o);
        double dt = mq_now_s() - t0 - s_clock_s;
        if ((m + 1) % 5 == 0)
            close += dt, nclose++;
        else
            fill += dt, nfill++;
    }
    /* the clock correction can leave a small negative mean on a loaded machine */
    *fill_s = fmax(fill / nfill, 0);
    *close_s = fmax(close / nclose, 0);
    mq_policy_destroy(&p);
}

/* Baseline: one memcpy of a 64 KiB buffer, the size of a small gradient tensor. */
static double s_memcpy_s(void)
{
    size_t n = 64 * 1024;
    char *a = malloc(n), *b = malloc(n);
    memset(a, 1, n);
    memset(b, 2, n);
    int reps = 2000;
    double t0 = mq_now_s();
    for (int i = 0; i < reps; i++) {
        memcpy(b, a, n);
        a[i % n] = b[(i * 7) % n];
    }
    double dt = (mq_now_s() - t0) / reps;
    free(a);
    free(b);
    return dt;
}

int main(void)
{
    s_measure_clock();
    double base = s_memcpy_s();
    printf("baseline: memcpy of 64 KiB = %.0f ns\n", base * 1e9);
    const char *specs[] = {"mqgrad", "adaptive", "schedule", "fixed:4"};
    for (int i = 0; i < 4; i++) {
        double fill, close;
        s_time_policy(specs[i], &fill, &close);
        printf("%-9s observe (fill) %6.0f ns = %5.2fx memcpy | decision %6.0f ns = %5.2fx memcpy\n",
               specs[i], fill * 1e9, fill / base, close * 1e9, close / base);
    }
    /* Save/restore after N_OBS/5 decisions: the history dominates the size. */
    mq_policy_t *p = mq_policy_new("mqgrad", NULL);
    for (uint64_t m = 0; m < N_OBS; m++) {
        mq_observation_t o = {.iter = m, .loss = 2.0 / (1 + 1e-4 * m), .iter_ms = 100};
        mq_policy_observe(p, &o);
    }
    uint8_t *buf;
    size_t len;
    double t0 = mq_now_s();
    if (mq_policy_save(p, &buf, &len) != 0)
        return 1;
    double ts = mq_now_s() - t0;
    volatile uint8_t *copy = malloc(len);
    memset((void *)copy, 0, len); /* fault the pages in before timing */
    t0 = mq_now_s();
    memcpy((void *)copy, buf, len);
    copy[len / 2] ^= 1;
    double tc = mq_now_s() - t0;
    t0 = mq_now_s();
    mq_policy_t *q = mq_policy_restore(buf, len);
    double tr = mq_now_s() - t0;
    printf("state after %d decisions: %zu bytes; save %.2f ms = %.0fx memcpy of it, restore "
           "%.2f ms = %.0fx\n",
           N_OBS / 5, len, ts * 1e3, ts / tc, tr * 1e3, tr / tc);
    free((void *)copy);
    free(buf);
    mq_policy_destroy(&q);
    mq_policy_destroy(&p);
    return 0;
}
