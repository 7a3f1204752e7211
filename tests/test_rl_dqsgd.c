/* Tests of the dqsgd policy (DQ-SGD's bit rule, eqs. 18/20; p_dqsgd.c): widths against hand
 * computations of log2(k alpha^((N-n)/2) |g| + 1) + 1, rounded up and clamped; alpha < 1
 * giving more bits late; the calibration of k to a target width; its options refused with
 * clear errors; save/restore. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/src/rl/rl_internal.h"
#include "policy_test.h"

static mq_policy_t *s_new(const char *spec)
{
    mq_policy_t *p = mq_policy_new(spec, NULL);
    cr_assert_not_null(p, "mq_policy_new(%s): %s", spec, mq_err_last());
    cr_assert_str_eq(p->ops->name, "dqsgd");
    return p;
}

static mq_rl_dqsgd_t *s_dq(mq_policy_t *p)
{
    return p->priv;
}

/* The width dqsgd answers after seeing norm G at iteration M of a run of N iterations. */
static int s_see(mq_policy_t *p, uint64_t m, double g, uint64_t n)
{
    mq_observation_t o = {.iter = m, .loss = 1, .iter_ms = 10, .grad_norm = g, .total_iters = n};
    return mq_policy_observe(p, &o);
}

/* k = 10, alpha = 1 (eq. 20): s = 10 |g| levels, B = ceil(log2(s + 1) + 1).
 *   |g| 0.7 -> s 7:   log2(8) + 1 = 4 exactly          -> 4
 *   |g| 1.4 -> s 14:  log2(15) + 1 = 4.9069             -> 5
 *   |g| 2.8 -> s 28:  log2(29) + 1 = 5.8580             -> 6
 *   |g| 5.6 -> s 56:  log2(57) + 1 = 6.8329             -> 7
 *   |g| 11.2 -> s 112: log2(113) + 1 = 7.8202           -> 8
 *   |g| 22.4 -> s 224: log2(225) + 1 = 8.8138 -> 9, clamped to 8
 *   |g| 0.35 -> s 3.5: log2(4.5) + 1 = 3.1699           -> 4 (rounded up: the step stays <= 1/k)
 *   |g| 0.1 -> s 1:   log2(2) + 1 = 2 exactly           -> 2
 *   |g| 0.05 -> s 0.5: log2(1.5) + 1 = 1.585 -> 2 (B = 1 has no level, and min is 2 anyway)
 * Each doubling of the norm doubles s and adds about one bit. */
Test(rl_dqsgd, rule_by_hand)
{
    static const struct {
        double g, real;
        int bits;
    } want[] = {{0.7, 4.0, 4},           {1.4, 4.906890595608519, 5}, {2.8, 5.857980995127572, 6},
                {5.6, 6.832890014164741, 7}, {11.2, 7.820178962415188, 8},
                {22.4, 8.813781191217037, 8}, {0.35, 3.169925001442312, 4},
                {0.1, 2.0, 2},           {0.05, 1.584962500721156, 2}};
    mq_policy_t *p = s_new("dqsgd:k=10");
    cr_expect_eq(p->bits, 2, "start bits until the first norm");
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_expect_eq(s_see(p, i, want[i].g, 1000), want[i].bits, "|g| = %g", want[i].g);
        cr_expect_float_eq(s_dq(p)->last_real, want[i].real, 1e-9, "|g| = %g", want[i].g);
    }
    mq_rl_dqsgd_t *d = s_dq(p);
    cr_expect_eq(d->decided, 9);
    cr_expect_eq(d->high, 1, "22.4 was clamped down to 8");
    cr_expect_eq(d->low, 0);
    mq_policy_destroy(&p);
}

/* Rounding up keeps the step |g| / (2^(B-1) - 1) at most the rule's 1/k, and B - 1 bits
 * would not: over many norms, whenever the width is not clamped. */
Test(rl_dqsgd, widths_round_up)
{
    mq_policy_t *p = s_new("dqsgd:k=3.7");
    for (int i = 0; i < 2000; i++) {
        double g = exp(-4 + 8.0 * i / 2000);
        int b = s_see(p, (uint64_t)i, g, 0);
        double s = 3.7 * g, levels = ldexp(1, b - 1) - 1, fewer = ldexp(1, b - 2) - 1;
        if (b > 2 && b < 8) {
            cr_assert(levels >= s * (1 - 1e-9), "|g| %g: %d bits have %g levels < %g", g, b,
                      levels, s);
            cr_assert(fewer < s, "|g| %g: %d bits would do", g, b - 1);
        }
    }
    cr_expect_eq(mq_rl_dqsgd_width(7.0 * (1 + 1e-15)), 4, "7 levels up to rounding are 4 bits");
    cr_expect_eq(mq_rl_dqsgd_width(0), 1);
    mq_policy_destroy(&p);
}

/* k = 100, alpha = 0.99, N = 1000, |g| = 1 throughout; the width for iteration n = m + 1:
 *   n = 1:    0.99^(999/2) = 0.0066036 -> s 0.66  -> B 1.73 -> 2
 *   n = 500:  0.99^(500/2) = 0.081059  -> s 8.106 -> B 4.19 -> 5
 *   n = 1000: 0.99^0 = 1               -> s 100   -> B 7.66 -> 8
 * and past the horizon the exponent stays 0. With alpha = 1 the same norms give one width. */
Test(rl_dqsgd, alpha_below_one_gives_more_bits_later)
{
    mq_policy_t *p = s_new("dqsgd:k=100,alpha=0.99");
    cr_expect_eq(s_see(p, 0, 1, 1000), 2);
    cr_expect_float_eq(s_dq(p)->last_real, 1.731494684260994, 1e-9);
    cr_expect_eq(s_see(p, 499, 1, 1000), 5);
    cr_expect_float_eq(s_dq(p)->last_real, 4.186793950210347, 1e-9);
    cr_expect_eq(s_see(p, 999, 1, 1000), 8);
    cr_expect_float_eq(s_dq(p)->last_real, 7.658211482751795, 1e-9);
    cr_expect_eq(s_see(p, 1500, 1, 1000), 8);
    mq_policy_destroy(&p);

    /* non-decreasing over a whole run at constant norm; constant with alpha = 1 */
    mq_policy_t *a = s_new("dqsgd:k=100,alpha=0.99"), *flat = s_new("dqsgd:k=100");
    int prev = 0, first = 0, last = 0;
    for (uint64_t m = 0; m < 1000; m++) {
        int b = s_see(a, m, 1, 1000);
        cr_assert_geq(b, prev, "bits fell at %lu", (unsigned long)m);
        prev = b;
        first = m == 0 ? b : first;
        last = b;
        cr_assert_eq(s_see(flat, m, 1, 1000), 8, "alpha = 1: 100 levels, 8 bits");
    }
    cr_expect_lt(first, last);
    mq_policy_destroy(&a);
    mq_policy_destroy(&flat);

    /* the horizon from the progress of a time budget: (m + 1) / progress = 1000 */
    p = s_new("dqsgd:k=100,alpha=0.99");
    mq_observation_t o = {.iter = 499, .loss = 1, .grad_norm = 1, .progress = 0.5};
    cr_expect_eq(mq_policy_observe(p, &o), 5);
    /* no horizon at all: the factor is 1, and that is counted */
    o = (mq_observation_t){.iter = 500, .loss = 1, .grad_norm = 1};
    cr_expect_eq(mq_policy_observe(p, &o), 8);
    cr_expect_eq(s_dq(p)->no_horizon, 1);
    mq_policy_destroy(&p);
}

ParameterizedTestParameters(rl_dqsgd, calibration_reaches_the_target)
{
    static int widths[] = {2, 3, 4, 5, 6, 7, 8};
    return cr_make_param_array(int, widths, sizeof widths / sizeof widths[0]);
}

/* bits=B: k = (2^(B-1) - 1) / |g_0| makes the first decision B wide whatever the norm; a
 * norm twice (four times) the first one then gives about one (two) bits more. */
ParameterizedTest(int *b, rl_dqsgd, calibration_reaches_the_target)
{
    char spec[32];
    snprintf(spec, sizeof spec, "dqsgd:bits=%d", *b);
    for (double g0 = 1e-4; g0 < 1e4; g0 *= 7.3) {
        mq_policy_t *p = s_new(spec);
        cr_expect_eq(s_see(p, 0, g0, 5000), *b, "%s, |g0| = %g", spec, g0);
        cr_expect_float_eq(s_dq(p)->k, (ldexp(1, *b - 1) - 1) / g0, 1e-9 * s_dq(p)->k);
        cr_expect_float_eq(s_dq(p)->last_real, *b, 1e-9);
        /* s = 2 (2^(B-1) - 1) = 2^B - 2 levels: B + 1 bits (2^B - 1 levels), capped at 8 */
        int up = *b + 1 > 8 ? 8 : *b + 1;
        cr_expect_eq(s_see(p, 1, 2 * g0, 5000), up, "%s, |g| doubled", spec);
        mq_policy_destroy(&p);
    }
}

/* The default target is 4 bits, with alpha < 1 too (the factor at the first decision is
 * part of the calibration); a target outside a narrowed range follows the range. No usable
 * norm: the calibration waits, and the bits stay. */
Test(rl_dqsgd, calibration_defaults_and_waits)
{
    mq_policy_t *p = s_new("dqsgd");
    cr_expect_eq(s_see(p, 0, 0, 100), 2, "no norm: start bits kept");
    cr_expect_eq(s_see(p, 1, NAN, 100), 2);
    cr_expect_eq(s_dq(p)->k, 0, "not calibrated on nothing");
    cr_expect_eq(s_see(p, 2, 0.37, 100), 4, "first usable norm: the default 4 bits");
    cr_expect_float_eq(s_dq(p)->k, 7 / 0.37, 1e-12);
    cr_expect_eq(s_see(p, 3, 0.74, 100), 5, "s = 14 levels");
    cr_expect_eq(s_see(p, 4, 0.185, 100), 4, "s = 3.5 levels, rounded up");
    cr_expect_eq(s_see(p, 5, 0.0925, 100), 3, "s = 1.75 levels");
    cr_expect_eq(s_dq(p)->skipped, 2);
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect(strstr(st.detail, "k=18.9189 (bits=4 on the first norm)"), "%s", st.detail);
    cr_expect(strstr(st.detail, "skipped=2"), "%s", st.detail);
    cr_expect(strstr(st.detail, "mean=4.00"), "%s", st.detail);
    mq_policy_destroy(&p);

    /* alpha = 0.99 over N = 1000: k = 15 / 0.99^(999/2) = 2271.49; the first decision is 5
     * bits, n = 300 gives s = 67.4 (7.10 -> 8), n = 500 s = 184 (8.53 -> clamped to 8) */
    p = s_new("dqsgd:bits=5,alpha=0.99");
    cr_expect_eq(s_see(p, 0, 1, 1000), 5);
    cr_expect_float_eq(s_dq(p)->k, 2271.4938095501943, 1e-6);
    cr_expect_eq(s_see(p, 99, 1, 1000), 6, "n = 100: s = 24.7, B = 5.68");
    cr_expect_eq(s_see(p, 299, 1, 1000), 8, "n = 300: s = 67.4, B = 7.10");
    cr_expect_eq(s_see(p, 499, 1, 1000), 8);
    cr_expect_eq(s_dq(p)->high, 1);
    mq_policy_destroy(&p);

    p = s_new("dqsgd:max=3");
    cr_expect_eq(s_dq(p)->target, 3);
    cr_expect_eq(s_see(p, 0, 1, 0), 3);
    mq_policy_destroy(&p);
}

/* Widths beyond min..max are clamped and counted, on each side. */
Test(rl_dqsgd, clamping_is_recorded)
{
    mq_policy_t *p = s_new("dqsgd:k=10,min=3,max=6,start=3");
    cr_expect_eq(s_see(p, 0, 0.1, 0), 3, "s = 1: 2 bits, clamped up to 3");
    cr_expect_eq(s_see(p, 1, 0.7, 0), 4);
    cr_expect_eq(s_see(p, 2, 11.2, 0), 6, "s = 112: 8 bits, clamped down to 6");
    cr_expect_eq(s_see(p, 3, 1e300, 0), 6, "an overflowing s is clamped too");
    mq_rl_dqsgd_t *d = s_dq(p);
    cr_expect_eq(d->low, 1);
    cr_expect_eq(d->high, 2);
    cr_expect_eq(d->decided, 4);
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect(strstr(st.detail, "clamped=1 up,2 down"), "%s", st.detail);
    cr_expect_eq(st.nq, 4);
    mq_policy_destroy(&p);
}

/* One decision per observation, one history entry per window of T: its action is the
 * change since the previous entry. Repeated and older iterations are ignored. */
Test(rl_dqsgd, decides_every_iteration_records_every_window)
{
    mq_policy_t *p = s_new("dqsgd:k=10,T=3");
    static const double g[] = {0.7, 1.4, 2.8, 0.7, 0.1, 0.1};
    static const int bits[] = {4, 5, 6, 4, 2, 2};
    for (uint64_t m = 0; m < 6; m++) {
        cr_expect_eq(s_see(p, m, g[m], 0), bits[m], "iteration %lu", (unsigned long)m);
        cr_expect_eq(s_see(p, m, 100, 0), bits[m], "a repeated iteration changes nothing");
    }
    const mq_decision_t *h;
    cr_assert_eq(mq_policy_history(p, &h), 2);
    cr_expect_eq(h[0].bits, 6);
    cr_expect_eq(h[0].action, 4, "from the start bits 2");
    cr_expect_eq(h[1].bits, 2);
    cr_expect_eq(h[1].action, -4);
    mq_policy_destroy(&p);
}

Test(rl_dqsgd, bad_options_refused)
{
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"dqsgd:k=0", "dqsgd option k must be > 0"},
        {"dqsgd:t=0", "dqsgd option t must be > 0"},
        {"dqsgd:k=-1", "dqsgd option k (or t): '-1' is not a number"},
        {"dqsgd:k=abc", "dqsgd option k (or t): 'abc' is not a number"},
        {"dqsgd:k=3,t=4", "k and t are the same constant"},
        {"dqsgd:k=30,bits=4", "give k (or t) or bits, not both"},
        {"dqsgd:alpha=0", "dqsgd option alpha must be in (0, 1]"},
        {"dqsgd:alpha=1.5", "dqsgd option alpha must be in (0, 1]"},
        {"dqsgd:alpha=x", "dqsgd option alpha: 'x' is not a number"},
        {"dqsgd:bits=9", "dqsgd option bits (target width): '9' is not an integer in 2..8"},
        {"dqsgd:bits=1", "'1' is not an integer in 2..8"},
        {"dqsgd:bits=7,max=6", "target bits=7 is outside the policy's range 2..6"},
        {"dqsgd:min=1", "min bits 1 is below 2"},
        {"dqsgd:bogus=1", "unknown policy parameter 'bogus' (dqsgd takes k, t, alpha, bits,"},
        {"dqsgd:4", "'4' is not key=value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        test_policy_refused(bad[i].spec, bad[i].msg);
    /* dqsgd's alpha is its own: the loss smoothing keeps its value */
    mq_policy_t *p = s_new("dqsgd:alpha=0.9,T=10");
    cr_expect_float_eq(s_dq(p)->alpha, 0.9, 1e-15);
    cr_expect_float_eq(p->o.alpha, 0.01, 1e-15);
    cr_expect_eq(p->o.T, 10);
    mq_policy_destroy(&p);
}

static int s_feed(mq_policy_t *p, uint64_t from, uint64_t to, int *bits)
{
    for (uint64_t m = from; m < to; m++)
        bits[m] = s_see(p, m, m % 9 == 4 ? NAN : 0.2 + 0.15 * sin((double)m * 0.37), 120);
    return 0;
}

static mq_policy_t *s_save_restore(mq_policy_t *p)
{
    uint8_t *buf;
    size_t len;
    cr_assert_eq(mq_policy_save(p, &buf, &len), 0, "%s", mq_err_last());
    mq_policy_t *q = mq_policy_restore(buf, len);
    cr_assert_not_null(q, "%s", mq_err_last());
    free(buf);
    mq_policy_destroy(&p);
    return q;
}

/* A restart anywhere (before the calibration, inside a window) goes on exactly as without,
 * with the calibrated k, the counters and the history kept. */
Test(rl_dqsgd, save_restore_round_trip)
{
    static const char *specs[] = {"dqsgd", "dqsgd:bits=6,alpha=0.98", "dqsgd:t=12,min=3,start=3"};
    static const uint64_t splits[] = {0, 1, 44, 119};
    for (size_t i = 0; i < 3; i++) {
        for (size_t j = 0; j < 4; j++) {
            int a[120], b[120];
            mq_policy_t *pa = s_new(specs[i]), *pb = s_new(specs[i]);
            s_feed(pa, 0, 120, a);
            s_feed(pb, 0, splits[j], b);
            pb = s_save_restore(pb);
            s_feed(pb, splits[j], 120, b);
            cr_expect_arr_eq(a, b, sizeof a, "%s split at %lu", specs[i],
                             (unsigned long)splits[j]);
            mq_policy_status_t sa, sb;
            mq_policy_status(pa, &sa);
            mq_policy_status(pb, &sb);
            cr_expect_str_eq(sa.detail, sb.detail);
            cr_expect_eq(sa.step, 24);
            cr_expect_eq(sb.step, 24);
            uint8_t *ba, *bb;
            size_t la, lb;
            cr_assert_eq(mq_policy_save(pa, &ba, &la), 0);
            cr_assert_eq(mq_policy_save(pb, &bb, &lb), 0);
            cr_expect(la == lb && memcmp(ba, bb, la) == 0, "%s: saved states differ", specs[i]);
            free(ba);
            free(bb);
            mq_policy_destroy(&pa);
            mq_policy_destroy(&pb);
        }
    }
}

/* The saved k and alpha are checked like every other restored value: alpha 2 (after k in
 * dqsgd's section) is refused under a valid checksum. */
Test(rl_dqsgd, corrupt_section_refused)
{
    mq_policy_t *p = s_new("dqsgd:alpha=0.75");
    s_see(p, 0, 0.5, 100);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(mq_policy_save(p, &buf, &len), 0);
    double k = s_dq(p)->k, two = 2;
    uint8_t kb[8];
    for (int i = 0; i < 8; i++) { /* the file is little-endian whatever the host */
        uint64_t u;
        memcpy(&u, &k, 8);
        kb[i] = (uint8_t)(u >> (8 * i));
    }
    uint8_t *at = memmem(buf, len, kb, 8);
    cr_assert_not_null(at, "k not found in the saved state");
    uint64_t u;
    memcpy(&u, &two, 8);
    for (int i = 0; i < 8; i++)
        at[8 + i] = (uint8_t)(u >> (8 * i));
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, buf, 20), buf + 24, len - 24);
    for (int i = 0; i < 4; i++)
        buf[20 + i] = (uint8_t)(crc >> (8 * i));
    mq_policy_t *q = mq_policy_restore(buf, len);
    cr_expect_null(q);
    cr_expect(strstr(mq_err_last(), "dqsgd alpha outside (0, 1]"), "%s", mq_err_last());
    mq_policy_destroy(&q);
    free(buf);
    mq_policy_destroy(&p);
}
