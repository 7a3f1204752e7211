/* Tests of the bit-width policies: the numbers of equations (1)-(3) and of one SARSA update
 * checked against hand computations, epsilon-greedy statistics, the baselines' decisions,
 * save/restore (exact resume, corrupt buffers refused, states of the previous format still
 * read) and the registry. DQ-SGD has its own file, test_rl_dqsgd.c. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/src/rl/rl_internal.h"
#include "policy_test.h"
#include "rl_v1_fixtures.h"

#define EPS 1e-12


/* mqgrad's own data (network, MDP state). */
static mq_rl_mqgrad_t *s_mq(mq_policy_t *p)
{
    cr_assert_str_eq(p->ops->name, "mqgrad");
    return p->priv;
}

Test(rl, defaults_are_the_papers)
{
    mq_policy_opts_t o;
    mq_policy_opts_default(&o);
    cr_expect_eq(o.T, 5);
    cr_expect_float_eq(o.alpha, 0.01, EPS);
    cr_expect_float_eq(o.epsilon, 0.1, EPS);
    cr_expect_float_eq(o.eta, 0.1, EPS);
    cr_expect_float_eq(o.discount, 0.9, EPS);
    cr_expect_float_eq(o.gamma, 300, EPS);
    cr_expect_eq(o.min_bits, 2);
    cr_expect_eq(o.max_bits, 8);
    cr_expect_eq(o.start_bits, 2);
    cr_expect_eq(o.hidden, 10);
    cr_expect_float_eq(o.tau, 0.05, EPS);
    cr_expect(!o.literal_eq3);
}

Test(rl, crc32_known_value)
{
    /* The standard check value of CRC-32/IEEE. */
    cr_expect_eq(mq_rl_crc32(0, (const uint8_t *)"123456789", 9), 0xCBF43926u);
}

/* Equation (1) with alpha = 0.1 on losses 2, 1, 1, 1, 1 | 0.6561:
 *   seed = first loss 2: Lbar1 = 0.1*2 + 0.9*2 = 2
 *   Lbar2 = 0.1*1 + 0.9*2 = 1.9;  Lbar3 = 0.1 + 0.9*1.9 = 1.81
 *   Lbar4 = 0.1 + 0.9*1.81 = 1.729;  Lbar5 = 0.1 + 0.9*1.729 = 1.6561
 *   next window, seeded from 1.6561: 0.1*0.6561 + 0.9*1.6561 = 0.06561 + 1.49049 = 1.5561
 * The network input is Lbar divided by the run's first smoothed loss (2). */
Test(rl, smoothing_follows_equation_1)
{
    mq_policy_opts_t o;
    mq_policy_opts_default(&o);
    o.alpha = 0.1;
    mq_policy_t *p = test_policy_new("mqgrad", &o);
    const double loss[] = {2, 1, 1, 1, 1, 0.6561};
    const double want[] = {2, 1.9, 1.81, 1.729, 1.6561};
    for (int i = 0; i < 5; i++)
        mq_policy_observe(p, &(mq_observation_t){.iter = i, .loss = loss[i], .iter_ms = 10});
    for (int i = 0; i < 5; i++) {
        cr_expect_float_eq(p->win.lbar[i], want[i], 1e-12, "Lbar[%d]", i);
        cr_expect_float_eq(s_mq(p)->x[i], want[i] / 2, 1e-12, "x[%d]", i);
    }
    mq_policy_observe(p, &(mq_observation_t){.iter = 5, .loss = loss[5], .iter_ms = 10});
    cr_expect_float_eq(p->win.lbar[0], 1.5561, 1e-12);
    mq_policy_destroy(&p);
    cr_expect_null(p);
    mq_policy_destroy(&p); /* safe twice */
}

/* Slope of 5, 4, 4, 2, 1 against 1..5: centred i = -2..2, sum d^2 = 10,
 * sum d*y = -10 - 4 + 0 + 2 + 2 = -10, beta = -1. Reward (2): -(-1) * 300 / 250 = 1.2. */
Test(rl, slope_and_reward_follow_equation_2)
{
    const double y[] = {5, 4, 4, 2, 1};
    cr_expect_float_eq(mq_rl_slope(y, 5), -1.0, EPS);
    cr_expect_float_eq(mq_rl_reward(-1.0, 300, 250), 1.2, EPS);
    cr_expect_float_eq(mq_rl_reward(-1.0, 300, 0), 300, EPS, "c clamped to 1 ms");

    /* Same numbers through a policy: alpha = 1 leaves the losses unsmoothed, 5 x 50 ms. */
    mq_policy_opts_t o;
    mq_policy_opts_default(&o);
    o.alpha = 1;
    mq_policy_t *p = test_policy_new("fixed:4", &o);
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect(isnan(st.last_reward));
    for (int i = 0; i < 5; i++)
        mq_policy_observe(p, &(mq_observation_t){.iter = i, .loss = y[i], .iter_ms = 50});
    mq_policy_status(p, &st);
    cr_expect_float_eq(st.last_reward, 1.2, 1e-12);
    cr_expect_eq(st.step, 1);
    mq_policy_destroy(&p);
}

/* A 2-2-3 network (T = 2, bits 2..4) with hand-set weights:
 *   W1 = [[1, 0], [0, -1]], b1 = [0, 0.5]; W2 rows (bits 2, 3, 4) = [0, 1], [1, 0], [0.5, 0.5]
 * options: alpha = 1, epsilon = 0, eta = 0.5, discount = 0.5, gamma = 100. */
static mq_policy_t *s_small_net(double epsilon, bool literal, bool keep_first)
{
    mq_policy_opts_t o;
    mq_policy_opts_default(&o);
    o.T = 2, o.alpha = 1, o.epsilon = epsilon, o.eta = 0.5, o.discount = 0.5, o.gamma = 100;
    o.min_bits = 2, o.max_bits = 4, o.start_bits = 2, o.hidden = 2, o.literal_eq3 = literal;
    mq_policy_t *p = test_policy_new("mqgrad", &o);
    mq_rl_qnet_t *net = &s_mq(p)->net;
    const double w1[] = {1, 0, 0, -1}, b1[] = {0, 0.5};
    const double w2a[] = {0, 1, 1, 0, 0.5, 0.5}, w2b[] = {1, 0, 0, 1, 0.5, 0.5};
    memcpy(net->w1, w1, sizeof w1);
    memcpy(net->b1, b1, sizeof b1);
    memcpy(net->w2, keep_first ? w2b : w2a, sizeof w2a);
    memset(net->b2, 0, 3 * sizeof(double));
    return p;
}

/* Window 0: losses 1, 1 -> x0 = [1, 1] (scale 1); z = [1, -0.5], h = [1, 0],
 *   Q(x0) = [0, 1, 0.5]; n0 = 2: Q(s,0) = 0 < Q(s,1) = 1 -> a0 = 1, bits 3.
 * Window 1: losses 0.5, 0.3, 10 ms each -> beta = -0.2, c = 20, r = 0.2 * 100 / 20 = 1.
 *   Eq. (3): n1 = 2 + argmax(0, 1) = 3. x1 = [0.5, 0.3]: z = [0.5, 0.2], h = [0.5, 0.2],
 *   Q(x1) = [0.2, 0.5, 0.35]; at n1 = 3: 0.5 >= 0.35 -> a1 = 0, bits 3.
 *   TD = 1 + 0.5 * 0.5 - Q(x0, bits 3) = 1.25 - 1 = 0.25; eta * TD = 0.125.
 *   Gradient of output bits 3 at x0 (only h0 active, w2[1][0] = 1):
 *   w1[0] += 0.125 * [1, 1] -> [1.125, 0.125]; b1[0] -> 0.125; w2[1][0] += 0.125 * 1 ->
 *   1.125; b2[1] -> 0.125; everything else unchanged. */
Test(rl, one_sarsa_update_by_hand)
{
    mq_policy_t *p = s_small_net(0, false, false);
    mq_rl_mqgrad_t *m = s_mq(p);
    cr_expect_eq(mq_policy_observe(p, &(mq_observation_t){.iter = 0, .loss = 1, .iter_ms = 1}), 2);
    cr_expect_eq(mq_policy_observe(p, &(mq_observation_t){.iter = 1, .loss = 1, .iter_ms = 1}), 3);
    cr_expect_eq(m->n, 2);
    cr_expect_eq(m->action, 1);
    mq_policy_observe(p, &(mq_observation_t){.iter = 2, .loss = 0.5, .iter_ms = 10});
    int bits = mq_policy_observe(p, &(mq_observation_t){.iter = 3, .loss = 0.3, .iter_ms = 10});
    cr_expect_eq(bits, 3);
    cr_expect_eq(m->n, 3, "equation (3): n1 = n0 + argmax Q(s0, .)");
    cr_expect_eq(m->action, 0);
    const double w1[] = {1.125, 0.125, 0, -1}, b1[] = {0.125, 0.5};
    const double w2[] = {0, 1, 1.125, 0, 0.5, 0.5}, b2[] = {0, 0.125, 0};
    for (int k = 0; k < 4; k++)
        cr_expect_float_eq(m->net.w1[k], w1[k], EPS, "w1[%d]", k);
    for (int k = 0; k < 2; k++)
        cr_expect_float_eq(m->net.b1[k], b1[k], EPS, "b1[%d]", k);
    for (int k = 0; k < 6; k++)
        cr_expect_float_eq(m->net.w2[k], w2[k], EPS, "w2[%d]", k);
    for (int k = 0; k < 3; k++)
        cr_expect_float_eq(m->net.b2[k], b2[k], EPS, "b2[%d]", k);
    /* Status shows Q(s1, .) with the new weights: z = [1.125*0.5 + 0.125*0.3 + 0.125, 0.2]
     * = [0.725, 0.2]; Q = [0.2, 1.125*0.725 + 0.125, 0.5*0.725 + 0.5*0.2]
     * = [0.2, 0.940625, 0.4625]. */
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_eq(st.nq, 3);
    cr_expect_float_eq(st.q_values[0], 0.2, EPS);
    cr_expect_float_eq(st.q_values[1], 0.940625, EPS);
    cr_expect_float_eq(st.q_values[2], 0.4625, EPS);
    cr_expect_float_eq(st.last_reward, 1.0, EPS);
    const mq_decision_t *h;
    cr_assert_eq(mq_policy_history(p, &h), 2);
    cr_expect_eq(h[0].bits, 3);
    cr_expect_eq(h[0].action, 1);
    cr_expect_eq(h[1].iter, 3);
    cr_expect_float_eq(h[1].reward, 1.0, EPS);
    mq_policy_destroy(&p);
}

/* Equation (3) follows the greedy action of s_{t-1}, not the action taken. With
 * W2 rows [1, 0], [0, 1], [0.5, 0.5]: Q(x0) = [1, 0, 0.5], greedy keep; epsilon = 1 always
 * explores, so a0 = 1 and window 1 runs at 3 bits. Then Q(x1) = [0.5, 0.2, 0.35].
 *   literal: n1 = 2 + 0 = 2; greedy at n = 2 is keep (0.5 >= 0.2), explored -> a1 = 1, bits 3.
 *   default: n1 = max(2, 3 bits just used) = 3; greedy at 3 is up (0.35 > 0.2) -> a1 = 0. */
Test(rl, transition_follows_equation_3)
{
    for (int literal = 0; literal < 2; literal++) {
        mq_policy_t *p = s_small_net(1.0, literal, true);
        const double loss[] = {1, 1, 0.5, 0.3};
        int bits = 0;
        for (int i = 0; i < 4; i++) {
            bits = mq_policy_observe(
                p, &(mq_observation_t){.iter = i, .loss = loss[i], .iter_ms = 10});
            if (i == 1)
                cr_expect_eq(bits, 3, "explored +1");
        }
        cr_expect_eq(s_mq(p)->n, literal ? 2 : 3);
        cr_expect_eq(s_mq(p)->action, literal ? 1 : 0);
        cr_expect_eq(bits, 3);
        mq_policy_destroy(&p);
    }
}

/* 20000 draws with epsilon = 0.1: the non-greedy action is a binomial(20000, 0.1) count,
 * mean 2000, sigma = sqrt(20000 * 0.1 * 0.9) = 42.4; accept within 5 sigma (212). */
Test(rl, epsilon_greedy_frequencies)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, 12345);
    int up = 0, keep = 0;
    for (int i = 0; i < 20000; i++) {
        up += mq_rl_egreedy(&rng, 0.1, 0.0, 1.0, true);       /* greedy: 1 */
        keep += 1 - mq_rl_egreedy(&rng, 0.1, 1.0, 0.0, true); /* greedy: 0 */
    }
    cr_expect(abs((20000 - up) - 2000) <= 212, "explored %d times", 20000 - up);
    cr_expect(abs((20000 - keep) - 2000) <= 212, "explored %d times", 20000 - keep);
    for (int i = 0; i < 1000; i++)
        cr_expect_eq(mq_rl_egreedy(&rng, 1.0, 0.0, 1.0, false), 0, "no +1 at max bits");
    /* ties keep, as the paper: Q(s,0) >= Q(s,1) keeps n */
    cr_expect_eq(mq_rl_egreedy(&rng, 0.0, 0.5, 0.5, true), 0);
}

/* A long run on noisy, decreasing losses: the bits are non-decreasing and stay in 2..8
 * (default); with literal_eq3 they stay in range and n_t never decreases. */
Test(rl, mqgrad_bits_never_decrease_long_run)
{
    for (int literal = 0; literal < 2; literal++) {
        mq_policy_opts_t o;
        mq_policy_opts_default(&o);
        o.seed = 99;
        o.literal_eq3 = literal;
        mq_policy_t *p = test_policy_new("mqgrad", &o);
        mq_rng_t rng;
        mq_rng_seed(&rng, 7);
        int prev = 2, prev_n = 2;
        for (uint64_t m = 0; m < 20000; m++) {
            double loss = 2.3 * exp(-(double)m / 4000) + 0.05 * mq_rng_normal(&rng);
            double ms = 100 + 40 * mq_rng_double(&rng);
            int bits = mq_policy_observe(p, OBS(m, loss, ms));
            cr_assert(bits >= 2 && bits <= 8, "bits %d at %lu", bits, (unsigned long)m);
            if (!literal)
                cr_assert_geq(bits, prev, "bits fell at iteration %lu", (unsigned long)m);
            const mq_rl_mqgrad_t *m = s_mq(p);
            if (m->have_state)
                cr_assert_geq(m->n, prev_n);
            prev = bits;
            prev_n = m->have_state ? m->n : prev_n;
        }
        cr_expect_eq(p->step, 4000);
        mq_policy_destroy(&p);
    }
}

Test(rl, fixed_always_k)
{
    mq_policy_t *p = test_policy_new("fixed:1", NULL);
    for (uint64_t m = 0; m < 50; m++)
        cr_expect_eq(mq_policy_observe(p, OBS(m, 1.0 / (m + 1), 5)), 1);
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_str_eq(st.spec, "fixed:1");
    cr_expect_eq(st.step, 10);
    cr_expect_eq(st.nq, 7);
    cr_expect(isnan(st.q_values[0]) && isnan(st.q_values[6]));
    mq_policy_destroy(&p);
}

ParameterizedTestParameters(rl, fixed_k_for_every_width)
{
    static int widths[] = {1, 2, 3, 4, 5, 6, 7, 8};
    return cr_make_param_array(int, widths, sizeof widths / sizeof widths[0]);
}

/* fixed:K answers K from the first iteration on, whatever the losses, and survives a restart. */
ParameterizedTest(int *k, rl, fixed_k_for_every_width)
{
    char spec[16];
    snprintf(spec, sizeof spec, "fixed:%d", *k);
    mq_policy_t *p = test_policy_new(spec, NULL);
    for (uint64_t m = 0; m < 23; m++)
        cr_expect_eq(mq_policy_observe(p, OBS(m, 10.0 - m, 1 + m)), *k);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(mq_policy_save(p, &buf, &len), 0);
    mq_policy_t *q = mq_policy_restore(buf, len);
    cr_assert_not_null(q, "%s", mq_err_last());
    cr_expect_eq(mq_policy_observe(q, OBS(23, 1, 1)), *k);
    free(buf);
    mq_policy_destroy(&q);
    mq_policy_destroy(&p);
}

static int s_adaptive_window(mq_policy_t *p, uint64_t first, double range, double sq)
{
    int bits = 0;
    for (uint64_t m = first; m < first + 5; m++)
        bits = mq_policy_observe(
            p, &(mq_observation_t){
                   .iter = m, .loss = 1, .iter_ms = 5, .grad_range = range, .grad_sqmean = sq});
    return bits;
}

/* tau = 0.05, mean(g^2) = 1, budget 0.05:
 *   range 11.2: K=3: (11.2/7)^2/12 = 0.2133 > 0.05; K=4: (11.2/15)^2/12 = 0.0465 -> 4
 *   range 50:   K=6: (50/63)^2/12 = 0.0525 > 0.05; K=7: (50/127)^2/12 = 0.0129 -> 7
 *   range 1000: K=8: (1000/255)^2/12 = 1.28 > 0.05 -> none, max 8
 *   range 0.5:  K=2: (0.5/3)^2/12 = 0.0023 -> 2 (and the rule may go down) */
Test(rl, adaptive_decisions)
{
    mq_policy_t *p = test_policy_new("adaptive", NULL);
    cr_expect_eq(mq_policy_observe(p, OBS(0, 1, 5)), 2, "starts at start_bits");
    mq_policy_destroy(&p);
    p = test_policy_new("adaptive", NULL);
    cr_expect_eq(s_adaptive_window(p, 0, 11.2, 1), 4);
    cr_expect_eq(s_adaptive_window(p, 5, 50, 1), 7);
    cr_expect_eq(s_adaptive_window(p, 10, 1000, 1), 8);
    cr_expect_eq(s_adaptive_window(p, 15, 0.5, 1), 2);
    cr_expect_eq(s_adaptive_window(p, 20, NAN, NAN), 2, "no statistics: keep");
    const mq_decision_t *h;
    cr_assert_eq(mq_policy_history(p, &h), 5);
    cr_expect_eq(h[3].action, -6, "8 -> 2");
    mq_policy_destroy(&p);
    /* The window's mean is used: ranges 0 and 22.4 average to 11.2 -> 4 bits. */
    p = test_policy_new("adaptive", NULL);
    for (uint64_t m = 0; m < 5; m++)
        mq_policy_observe(
            p, &(mq_observation_t){
                   .iter = m, .loss = 1, .grad_range = m % 2 ? 0 : 22.4, .grad_sqmean = 1});
    /* ranges 22.4, 0, 22.4, 0, 22.4 -> mean 13.44: K=4: (13.44/15)^2/12 = 0.0669 > 0.05;
     * K=5: (13.44/31)^2/12 = 0.0157 -> 5 */
    cr_expect_eq(p->bits, 5);
    mq_policy_destroy(&p);
}

/* Bits 2..8 are 7 stages of equal length: progress f gives 2 + floor(7 f). */
Test(rl, schedule_ramps_over_the_run)
{
    mq_policy_t *p = test_policy_new("schedule", NULL);
    cr_expect_eq(mq_policy_observe(p, OBS(0, 1, 1)), 2);
    int bits = 0;
    for (uint64_t m = 1; m < 5; m++) /* closes at m = 4 with progress 0.5: 2 + 3 = 5 */
        bits = mq_policy_observe(p, &(mq_observation_t){.iter = m, .loss = 1, .progress = 0.5});
    cr_expect_eq(bits, 5);
    mq_policy_destroy(&p);
    /* No progress: (iter + 1) / total_iters; 700 iterations, 100 per width. */
    p = test_policy_new("schedule", NULL);
    int seen[9] = {0};
    for (uint64_t m = 0; m < 700; m++) {
        bits = mq_policy_observe(p, &(mq_observation_t){.iter = m, .loss = 1, .total_iters = 700});
        if (m == 94) /* 2 + floor(7 * 95/700) = 2 + floor(0.95) */
            cr_expect_eq(bits, 2);
        if (m == 104) /* 2 + floor(7 * 105/700) = 2 + floor(1.05) */
            cr_expect_eq(bits, 3);
        seen[bits]++;
    }
    cr_expect_eq(bits, 8);
    for (int k = 2; k <= 8; k++)
        cr_expect_gt(seen[k], 0, "width %d used", k);
    mq_policy_destroy(&p);
}

Test(rl, iterations_out_of_order_and_gaps)
{
    mq_policy_opts_t o;
    mq_policy_opts_default(&o);
    o.alpha = 0.5;
    mq_policy_t *p = test_policy_new("fixed:3", &o);
    mq_policy_observe(p, OBS(0, 4, 10));
    mq_policy_observe(p, OBS(1, 2, 10));
    mq_policy_observe(p, OBS(1, 100, 10)); /* repeated: ignored */
    mq_policy_observe(p, OBS(0, 100, 10)); /* older: ignored */
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_eq(st.observations, 2);
    cr_expect_eq(st.iter, 1);
    /* iteration 2 is missed: its smoothed loss is held. alpha = 0.5:
     * 4 | 0.5*2 + 0.5*4 = 3 | (held) 3 | 0.5*1 + 0.5*3 = 2 | 0.5*1 + 0.5*2 = 1.5 */
    mq_policy_observe(p, OBS(3, 1, 10));
    mq_policy_observe(p, OBS(4, 1, 10));
    const double want[] = {4, 3, 3, 2, 1.5};
    for (int i = 0; i < 5; i++)
        cr_expect_float_eq(p->win.lbar[i], want[i], EPS, "Lbar[%d]", i);
    mq_policy_status(p, &st);
    cr_expect_eq(st.step, 1);
    /* slope of 4, 3, 3, 2, 1.5: sum d*y = -8 - 3 + 0 + 2 + 3 = -6, beta = -0.6;
     * c = 40 ms over 4 iterations scaled to 5 = 50; r = 0.6 * 300 / 50 = 3.6 */
    cr_expect_float_eq(st.last_reward, 3.6, 1e-12);
    /* the closing iteration 9 of window 1 is missed: it closes when 10 arrives */
    for (uint64_t m = 5; m < 9; m++)
        mq_policy_observe(p, OBS(m, 1, 10));
    mq_policy_status(p, &st);
    cr_expect_eq(st.step, 1);
    mq_policy_observe(p, OBS(10, 1, 10));
    mq_policy_status(p, &st);
    cr_expect_eq(st.step, 2);
    const mq_decision_t *h;
    cr_assert_eq(mq_policy_history(p, &h), 2);
    cr_expect_eq(h[1].iter, 10);
    cr_expect_eq(mq_policy_observe(NULL, OBS(11, 1, 1)), -1);
    mq_policy_destroy(&p);
}

/* Non-finite losses carry no information: before the first finite loss the position is
 * back-filled with it, later ones hold the smoothed value. alpha = 0.5 on NaN, 4, inf, 2, 2:
 *   4 (back-filled) | 4 (seed) | 4 (held) | 0.5*2 + 0.5*4 = 3 | 0.5*2 + 0.5*3 = 2.5
 * A NaN time is left out of c: 4 x 10 ms from 4 timed iterations, scaled to 5 -> c = 50. */
Test(rl, non_finite_losses_hold_the_smoothed_value)
{
    mq_policy_opts_t o;
    mq_policy_opts_default(&o);
    o.alpha = 0.5;
    mq_policy_t *p = test_policy_new("fixed:3", &o);
    const double loss[] = {NAN, 4, INFINITY, 2, 2}, ms[] = {10, 10, NAN, 10, 10};
    for (int i = 0; i < 5; i++)
        mq_policy_observe(p, OBS(i, loss[i], ms[i]));
    const double want[] = {4, 4, 4, 3, 2.5};
    for (int i = 0; i < 5; i++)
        cr_expect_float_eq(p->win.lbar[i], want[i], EPS, "Lbar[%d]", i);
    /* slope of 4, 4, 4, 3, 2.5: sum d*y = -8 - 4 + 0 + 3 + 5 = -4, beta = -0.4;
     * r = 0.4 * 300 / 50 = 2.4 */
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_float_eq(st.last_reward, 2.4, 1e-12);
    mq_policy_destroy(&p);
}

/* ---- persistence ------------------------------------------------------------------- */

static mq_observation_t s_obs_at(uint64_t m)
{
    /* a pure function of m, so two runs see the same data */
    return (mq_observation_t){.iter = m,
                              .loss = 2.0 / (1 + 0.02 * m) + 0.01 * sin(m * 1.7),
                              .iter_ms = 50 + (double)(m % 7),
                              .grad_range = 10 + m % 3,
                              .grad_sqmean = 1,
                              .grad_norm = 0.5 + 0.3 * cos(m * 0.3),
                              .total_iters = 100};
}

static void s_feed(mq_policy_t *p, uint64_t from, uint64_t to, int *bits)
{
    for (uint64_t m = from; m < to; m++) {
        mq_observation_t obs = s_obs_at(m);
        bits[m] = mq_policy_observe(p, &obs);
    }
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

static void s_check_resume(const char *spec, uint64_t split)
{
    mq_policy_opts_t o;
    mq_policy_opts_default(&o);
    o.seed = 2024;
    o.epsilon = 0.3; /* explore often so the rng state matters */
    int bits_a[100], bits_b[100];
    mq_policy_t *a = test_policy_new(spec, &o), *b = test_policy_new(spec, &o);
    s_feed(a, 0, 100, bits_a); /* 20 decisions */
    s_feed(b, 0, split, bits_b);
    b = s_save_restore(b);
    s_feed(b, split, 100, bits_b);
    cr_expect_arr_eq(bits_a, bits_b, sizeof bits_a, "%s split at %lu", spec, (unsigned long)split);
    const mq_decision_t *ha, *hb;
    size_t na = mq_policy_history(a, &ha), nb = mq_policy_history(b, &hb);
    cr_assert_eq(na, 20);
    cr_assert_eq(nb, 20);
    for (size_t i = 0; i < na; i++) {
        cr_expect_eq(ha[i].bits, hb[i].bits);
        cr_expect_eq(ha[i].action, hb[i].action);
        cr_expect_eq(memcmp(&ha[i].reward, &hb[i].reward, sizeof(double)), 0);
    }
    uint8_t *ba, *bb;
    size_t la, lb;
    cr_assert_eq(mq_policy_save(a, &ba, &la), 0);
    cr_assert_eq(mq_policy_save(b, &bb, &lb), 0);
    cr_expect_eq(la, lb);
    cr_expect(la == lb && memcmp(ba, bb, la) == 0, "%s: saved states differ", spec);
    free(ba);
    free(bb);
    mq_policy_destroy(&a);
    mq_policy_destroy(&b);
}

Test(rl, resume_is_exact)
{
    s_check_resume("mqgrad", 50); /* 10 decisions, restart, 10 more */
    s_check_resume("mqgrad", 52); /* restart in the middle of a window */
    s_check_resume("mqgrad:T=5,literal_eq3=1", 50);
    s_check_resume("adaptive", 47);
    s_check_resume("schedule", 50);
    s_check_resume("fixed:6", 50);
    s_check_resume("dqsgd", 52);
    s_check_resume("dqsgd:k=30,alpha=0.97", 50);
}

static void s_saved(uint8_t **buf, size_t *len)
{
    mq_policy_t *p = test_policy_new("mqgrad", NULL);
    int bits[60];
    s_feed(p, 0, 60, bits);
    cr_assert_eq(mq_policy_save(p, buf, len), 0);
    mq_policy_destroy(&p);
}

static void s_expect_refused(const uint8_t *buf, size_t len, const char *what)
{
    mq_policy_t *p = mq_policy_restore(buf, len);
    cr_expect_null(p, "accepted a buffer that should say '%s'", what);
    mq_policy_destroy(&p);
    cr_expect(strstr(mq_err_last(), what) != NULL, "error '%s' lacks '%s'", mq_err_last(), what);
}

Test(rl, corrupt_state_refused)
{
    uint8_t *buf;
    size_t len;
    s_saved(&buf, &len);
    uint8_t *c = malloc(len + 1);
    memcpy(c, buf, len);
    c[len / 2] ^= 0x10;
    s_expect_refused(c, len, "checksum");
    memcpy(c, buf, len);
    s_expect_refused(c, len - 1, "truncated");
    s_expect_refused(c, 10, "truncated");
    s_expect_refused(NULL, 0, "truncated");
    c[0] = 'X';
    s_expect_refused(c, len, "magic");
    memcpy(c, buf, len);
    c[8] = 4;
    s_expect_refused(c, len, "version 4");
    memcpy(c, buf, len);
    c[8] = 0;
    s_expect_refused(c, len, "version 0");
    memcpy(c, buf, len);
    c[len] = 0;
    s_expect_refused(c, len + 1, "unexpected bytes");
    /* A size that disagrees with the options, under a valid checksum: T = 3 in the payload
     * (offset: spec length 4 + "mqgrad" 6) while 5 window losses are stored. */
    memcpy(c, buf, len);
    c[24 + 10] = 3;
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, c, 20), c + 24, len - 24);
    for (int i = 0; i < 4; i++)
        c[20 + i] = (uint8_t)(crc >> (8 * i));
    s_expect_refused(c, len, "inconsistent");
    /* the untouched buffer still restores */
    mq_policy_t *p = mq_policy_restore(buf, len);
    cr_expect_not_null(p, "%s", mq_err_last());
    mq_policy_destroy(&p);
    free(c);
    free(buf);
}

/* The observations the version 1 fixtures were written after (rl_v1_fixtures.h). */
static mq_observation_t s_fixture_obs(uint64_t m)
{
    return (mq_observation_t){.iter = m,
                              .loss = 2.0 / (1 + 0.1 * (double)m),
                              .iter_ms = 10 + (double)(m % 3),
                              .grad_range = 10,
                              .grad_sqmean = 1};
}

/* A version 1 state restores into the policy this build makes of the same spec and
 * observations: same status and history, the same decisions after, the same bytes saved. */
static void s_check_v1(const uint8_t *buf, size_t len, const char *spec, uint64_t count)
{
    mq_policy_t *old = mq_policy_restore(buf, len);
    cr_assert_not_null(old, "%s: %s", spec, mq_err_last());
    mq_policy_t *now = test_policy_new(spec, NULL);
    for (uint64_t m = 0; m < count; m++) {
        mq_observation_t o = s_fixture_obs(m);
        mq_policy_observe(now, &o);
    }
    mq_policy_status_t a, b;
    mq_policy_status(old, &a);
    mq_policy_status(now, &b);
    cr_expect_str_eq(a.spec, spec);
    cr_expect_eq(a.bits, b.bits);
    cr_expect_eq(a.step, b.step);
    cr_expect_eq(a.observations, count);
    cr_expect_eq(memcmp(&a.last_reward, &b.last_reward, sizeof(double)), 0);
    for (uint64_t m = count; m < count + 21; m++) {
        mq_observation_t o = s_fixture_obs(m);
        int bo = mq_policy_observe(old, &o), bn = mq_policy_observe(now, &o);
        cr_expect_eq(bo, bn, "%s at %lu", spec, (unsigned long)m);
    }
    uint8_t *ba, *bb;
    size_t la, lb;
    cr_assert_eq(mq_policy_save(old, &ba, &la), 0);
    cr_assert_eq(mq_policy_save(now, &bb, &lb), 0);
    cr_expect(la == lb && memcmp(ba, bb, la) == 0, "%s: resumed and fresh states differ", spec);
    free(ba);
    free(bb);
    mq_policy_destroy(&old);
    mq_policy_destroy(&now);
}

Test(rl, version_1_states_still_restore)
{
    s_check_v1(s_v1_mqgrad, sizeof s_v1_mqgrad, "mqgrad:T=2,hidden=2,max=4", 7);
    s_check_v1(s_v1_fixed, sizeof s_v1_fixed, "fixed:5,T=2", 3);
    /* version 1 named the policy by number too: a number that disagrees is refused
     * (the kind is the first payload word; the checksum is redone) */
    uint8_t c[sizeof s_v1_fixed];
    memcpy(c, s_v1_fixed, sizeof c);
    c[24] = 3;
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, c, 20), c + 24, sizeof c - 24);
    for (int i = 0; i < 4; i++)
        c[20 + i] = (uint8_t)(crc >> (8 * i));
    s_expect_refused(c, sizeof c, "unknown policy kind 3 for spec 'fixed:5,T=2'");
}

/* An open window must hold the last iteration with no more losses than it has seen: a
 * fill of T at position 1 (under a valid checksum) once let the next observation write past
 * the window's buffer. Offset of the fill: header 24, spec 4 + 7, options 80, then rng 32,
 * bits 4, four counters 32, carry 12, scale 12, open 4, index 8. */
Test(rl, open_window_must_hold_the_last_iteration)
{
    mq_policy_t *p = test_policy_new("fixed:3", NULL);
    for (uint64_t m = 0; m < 7; m++)
        mq_policy_observe(p, OBS(m, 1, 1));
    cr_assert_eq(p->win.filled, 2);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(mq_policy_save(p, &buf, &len), 0);
    mq_policy_destroy(&p);
    size_t at = 24 + 4 + 7 + 80 + 32 + 4 + 32 + 12 + 12 + 4 + 8;
    cr_assert_eq(buf[at], 2);
    buf[at] = 5;
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, buf, 20), buf + 24, len - 24);
    for (int i = 0; i < 4; i++)
        buf[20 + i] = (uint8_t)(crc >> (8 * i));
    s_expect_refused(buf, len, "an open window that does not hold the last iteration");
    free(buf);
}

/* A policy's section is framed: one that does not fill it exactly is refused. The section
 * length of a fixed policy (nothing of its own) sits just before the history count. */
Test(rl, policy_section_is_framed)
{
    mq_policy_t *p = test_policy_new("fixed:3", NULL);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(mq_policy_save(p, &buf, &len), 0);
    mq_policy_destroy(&p);
    uint8_t *c = malloc(len + 4);
    cr_assert_not_null(c);
    size_t at = len - 12; /* u32 section length 0, then u64 history count 0 */
    memcpy(c, buf, at);
    const uint8_t section[] = {4, 0, 0, 0, 1, 2, 3, 4};
    memcpy(c + at, section, sizeof section);
    memcpy(c + at + sizeof section, buf + at + 4, 8);
    uint64_t pl = len + 4 - 24;
    for (int i = 0; i < 8; i++)
        c[12 + i] = (uint8_t)(pl >> (8 * i));
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, c, 20), c + 24, (size_t)pl);
    for (int i = 0; i < 4; i++)
        c[20 + i] = (uint8_t)(crc >> (8 * i));
    s_expect_refused(c, len + 4, "4 bytes left in fixed's section");
    free(c);
    free(buf);
}

/* ---- the registry ------------------------------------------------------------------ */

/* A spec every policy accepts: its short usage form, with fixed's K as 3. */
static void s_plain_spec(const mq_policy_ops_t *ops, char *spec, size_t len)
{
    snprintf(spec, len, "%.*s", (int)strcspn(ops->usage, "["), ops->usage);
    char *k = strstr(spec, ":K");
    if (k)
        strcpy(k, ":3");
}

/* Every policy of this build is registered under its name, and the help and the error
 * messages list all the registered ones (a new policy is then listed without a change
 * here; the five below must stay). */
Test(rl, registry_lists_every_policy_with_its_help)
{
    static const char *const known[] = {"mqgrad", "fixed", "adaptive", "schedule", "dqsgd"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        cr_expect_not_null(mq_rl_policy_by_name(known[i]), "%s is not registered", known[i]);
    cr_expect_null(mq_rl_policy_by_name("sarsa"));
    size_t n;
    const mq_policy_ops_t *const *all = mq_rl_policies(&n);
    char help[4096], names[512], want_names[512] = "", expected[600] = "";
    mq_policy_help(help, sizeof help);
    mq_policy_names(names, sizeof names, " | ");
    cr_expect_eq(strncmp(names, "mqgrad | fixed:K | adaptive | schedule | dqsgd", 46), 0, "%s",
                 names);
    const char *line = help;
    for (size_t i = 0; i < n; i++) {
        const mq_policy_ops_t *ops = all[i];
        cr_expect_eq(mq_rl_policy_by_name(ops->name), ops, "%s is registered twice", ops->name);
        cr_expect_eq(strncmp(ops->usage, ops->name, strlen(ops->name)), 0, "%s: usage '%s'",
                     ops->name, ops->usage);
        cr_expect(ops->help && strlen(ops->help) > 20, "%s has no help", ops->name);
        /* one line each, in registry order: "  usage  help" */
        const char *eol = strchr(line, '\n');
        cr_assert_not_null(eol, "help has %zu lines, want %zu:\n%s", i, n, help);
        char want[256];
        snprintf(want, sizeof want, "  %s ", ops->usage);
        cr_expect_eq(strncmp(line, want, strlen(want)), 0, "line %zu: %.*s", i,
                     (int)(eol - line), line);
        size_t hl = strlen(ops->help);
        cr_expect((size_t)(eol - line) > hl && strncmp(eol - hl, ops->help, hl) == 0,
                  "line %zu lacks %s's help", i, ops->name);
        line = eol + 1;
        /* the short forms, as the names list and the errors give them */
        char spec[64];
        snprintf(spec, sizeof spec, "%.*s", (int)strcspn(ops->usage, "["), ops->usage);
        snprintf(want_names + strlen(want_names), sizeof want_names - strlen(want_names),
                 "%s%s", i ? " | " : "", spec);
        snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%s",
                 i == 0 ? "(expected " : i + 1 < n ? ", " : " or ", spec);
    }
    cr_expect_eq(*line, '\0', "help has more lines than policies:\n%s", help);
    cr_expect_str_eq(names, want_names);
    /* cut, still terminated */
    char small[10];
    mq_policy_help(small, sizeof small);
    cr_expect_eq(strlen(small), 9);
    mq_policy_names(small, sizeof small, " | ");
    cr_expect_str_eq(small, "mqgrad | ");
    /* the list in errors comes from the registry too */
    cr_expect_null(mq_policy_new("sarsa", NULL));
    cr_expect(strstr(mq_err_last(), expected), "'%s' lacks '%s'", mq_err_last(), expected);
}

/* What every registered policy must do, whatever it decides: build from its plain spec,
 * answer widths in 1..8, step once per window, and resume exactly from a saved state. */
Test(rl, every_registered_policy_behaves)
{
    size_t n;
    const mq_policy_ops_t *const *all = mq_rl_policies(&n);
    for (size_t i = 0; i < n; i++) {
        char spec[64];
        s_plain_spec(all[i], spec, sizeof spec);
        mq_policy_t *p = test_policy_new(spec, NULL);
        mq_policy_status_t st;
        mq_policy_status(p, &st);
        cr_expect_str_eq(st.spec, spec);
        int bits[100];
        s_feed(p, 0, 100, bits);
        for (int m = 0; m < 100; m++)
            cr_expect(bits[m] >= 1 && bits[m] <= 8, "%s: %d bits at %d", spec, bits[m], m);
        mq_policy_status(p, &st);
        cr_expect_eq(st.step, 20, "%s: one step per window of 5", spec);
        cr_expect_eq(st.observations, 100);
        mq_policy_destroy(&p);
        s_check_resume(spec, 37);
    }
}

/* ---- specs and options ------------------------------------------------------------- */

Test(rl, spec_parameters_override_options)
{
    mq_policy_t *p = test_policy_new("mqgrad:T=10,epsilon=0.05,min=3,start=4,hidden=4", NULL);
    cr_expect_eq(p->o.T, 10);
    cr_expect_float_eq(p->o.epsilon, 0.05, EPS);
    cr_expect_eq(p->o.min_bits, 3);
    cr_expect_eq(p->o.hidden, 4);
    cr_expect_eq(mq_policy_observe(p, OBS(0, 1, 1)), 4, "starts at start=4");
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_eq(st.nq, 6);
    cr_expect(isnan(st.q_values[0]), "no Q-values before the first decision");
    mq_policy_destroy(&p);
    p = test_policy_new("adaptive:tau=0.5", NULL);
    cr_expect_float_eq(p->o.tau, 0.5, EPS);
    mq_policy_destroy(&p);
}

Test(rl, bad_specs_refused)
{
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"", "empty"},
        {"sarsa", "unknown policy 'sarsa'"},
        {"fixed", "needs a bit width"},
        {"fixed:0", "1..8"},
        {"fixed:9", "1..8"},
        {"fixed:x", "1..8"},
        {"fixed:epsilon=0.1", "needs a bit width"},
        {"fixed:4,5", "not key=value"},
        {"mqgrad:T=1", "T"},
        {"mqgrad:alpha=0", "alpha"},
        {"mqgrad:alpha=1.5", "alpha"},
        {"mqgrad:epsilon=2", "epsilon"},
        {"mqgrad:min=5,max=3", "above max"},
        {"mqgrad:start=1", "start bits 1"},
        {"mqgrad:hidden=0", "hidden"},
        {"mqgrad:bogus=1", "unknown policy parameter 'bogus'"},
        {"mqgrad:T", "not key=value"},
        {"mqgrad:literal_eq3=2", "0 or 1"},
        {"mqgrad:T=5,alpha=0.01,epsilon=0.1,eta=0.1,discount=0.9,gamma=300,min=2", "too long"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        test_policy_refused(bad[i].spec, bad[i].msg);
    cr_expect_null(mq_policy_new(NULL, NULL));
}

static void s_expect_bad_opts(const mq_policy_opts_t *o, const char *msg)
{
    mq_policy_t *p = mq_policy_new("mqgrad", o);
    cr_expect_null(p, "accepted options that should say '%s'", msg);
    mq_policy_destroy(&p);
    cr_expect(strstr(mq_err_last(), msg) != NULL, "error '%s' lacks '%s'", mq_err_last(), msg);
}

#define BAD_OPT(stmt, msg)                                                                         \
    do {                                                                                           \
        mq_policy_opts_t o;                                                                        \
        mq_policy_opts_default(&o);                                                                \
        stmt;                                                                                      \
        s_expect_bad_opts(&o, msg);                                                                \
    } while (0)

Test(rl, bad_options_refused)
{
    BAD_OPT(o.T = 1, "T (iterations per MDP step) must be in 2..");
    BAD_OPT(o.alpha = 0, "alpha");
    BAD_OPT(o.alpha = NAN, "alpha");
    BAD_OPT(o.epsilon = -0.1, "epsilon");
    BAD_OPT(o.eta = 0, "eta");
    BAD_OPT(o.discount = 1.5, "discount");
    BAD_OPT(o.gamma = -1, "gamma");
    BAD_OPT(o.min_bits = 0, "within 1..8");
    BAD_OPT(o.max_bits = 9, "within 1..8");
    BAD_OPT((o.min_bits = 6, o.max_bits = 4), "above max");
    BAD_OPT(o.start_bits = 9, "start bits 9 is outside the range 2..8");
    BAD_OPT(o.hidden = 300, "hidden");
    BAD_OPT(o.tau = 0, "tau");
}

/* ---- per-layer bit-widths under an error budget (L-GreCo) ------------------------------ */

/* The best widths by trying every one: the fewest bits whose error keeps BUDGET; false if
 * none does. */
static bool s_alloc_brute(const double *n, const double *e, size_t l, int lo, int hi,
                          double budget, double *best_cost)
{
    int b[8];
    size_t combos = 1;
    for (size_t i = 0; i < l; i++)
        combos *= (size_t)(hi - lo + 1);
    *best_cost = INFINITY;
    for (size_t c = 0; c < combos; c++) {
        size_t x = c;
        double cost = 0;
        for (size_t i = 0; i < l; i++) {
            b[i] = lo + (int)(x % (size_t)(hi - lo + 1));
            x /= (size_t)(hi - lo + 1);
            cost += n[i] * b[i];
        }
        if (mq_alloc_error(e, l, b) <= budget && cost < *best_cost)
            *best_cost = cost;
    }
    return isfinite(*best_cost);
}

Test(rl, per_layer_bits_against_brute_force)
{
    uint64_t x = 12345;
    int checked = 0;
    for (int trial = 0; trial < 300; trial++) {
        size_t l = 1 + trial % 5;
        double n[8], e[8];
        for (size_t i = 0; i < l; i++) { /* sizes 1..1e6 and coefficients over decades */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            n[i] = (double)(1 + x % 1000000);
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            e[i] = pow(10, (double)(x % 6000) / 1000.0 - 3);
        }
        int lo = 1, hi = 8, bits[8];
        /* budgets around the error of 2..6 bits everywhere */
        int ref[8];
        for (size_t i = 0; i < l; i++)
            ref[i] = 2 + trial % 5;
        double budget = mq_alloc_error(e, l, ref) * (0.5 + (double)(trial % 7) / 4.0);
        size_t steps = 2000;
        double best, tight;
        bool feasible = s_alloc_brute(n, e, l, lo, hi, budget, &best);
        int rc = mq_alloc_bits(n, e, l, lo, hi, budget, steps, bits);
        if (!feasible) {
            cr_expect_eq(rc, -1, "trial %d: nothing keeps the budget, yet widths came back", trial);
            continue;
        }
        cr_assert_eq(rc, 0, "trial %d: %s", trial, mq_err_last());
        double cost = 0;
        for (size_t i = 0; i < l; i++) {
            cr_assert(bits[i] >= lo && bits[i] <= hi, "trial %d: width %d", trial, bits[i]);
            cost += n[i] * bits[i];
        }
        cr_expect_leq(mq_alloc_error(e, l, bits), budget * (1 + 1e-12),
                      "trial %d: the widths break the budget", trial);
        cr_expect_geq(cost, best, "trial %d: cheaper than the optimum?", trial);
        /* no worse than the best that keeps a budget smaller by one unit per layer */
        if (s_alloc_brute(n, e, l, lo, hi, budget * (1 - (double)l / (double)steps), &tight))
            cr_expect_leq(cost, tight, "trial %d: %g bits where %g keep a slightly tighter "
                                       "budget", trial, cost, tight);
        checked++;
    }
    cr_expect_geq(checked, 200, "only %d feasible cases", checked);
}

Test(rl, per_layer_bits_spend_where_the_error_is)
{
    /* two layers of equal size, one with 256x the error coefficient: at the budget of 4 bits
     * everywhere, the noisy layer gets more bits than the quiet one (each extra bit cuts a
     * layer's error about 4x), and the total is not above 8 bits a value */
    double n[2] = {1000, 1000}, e[2] = {256, 1};
    int four[2] = {4, 4}, bits[2];
    cr_assert_eq(mq_alloc_bits(n, e, 2, 1, 8, mq_alloc_error(e, 2, four), 10000, bits), 0, "%s",
                 mq_err_last());
    cr_expect_gt(bits[0], bits[1], "noisy layer %d bits, quiet one %d", bits[0], bits[1]);
    cr_expect_leq(bits[0] + bits[1], 8);
    /* bad arguments and an impossible budget are refused, with a reason */
    cr_expect_eq(mq_alloc_bits(n, e, 2, 1, 8, 0, 100, bits), -1);
    cr_expect(strstr(mq_err_last(), "keep the error"), "%s", mq_err_last());
    cr_expect_eq(mq_alloc_bits(n, e, 0, 1, 8, 1, 100, bits), -1);
    cr_expect_eq(mq_alloc_bits(n, e, 2, 3, 2, 1, 100, bits), -1);
    double bad[2] = {NAN, 1};
    cr_expect_eq(mq_alloc_bits(bad, e, 2, 1, 8, 1, 100, bits), -1);
}

/* ---- lgreco: per-tensor levels ----------------------------------------------------- */

/* Iteration M of a layout of 5 tensors, 3 of them quantized (1, 2 and 4, 1000 values each),
 * whose error coefficients are E (error at b bits: E / (2^b - 1)^2), measured at the levels
 * P answers now: what the scheduler would report. */
static mq_observation_t s_tensor_obs(const mq_policy_t *p, uint64_t m, const double *e,
                                     uint64_t *count, uint32_t *bits, uint32_t *index,
                                     double *err)
{
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    static const uint32_t idx[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        index[k] = idx[k];
        count[k] = 1000;
        bits[k] = st.nwidths ? st.widths[idx[k]] : (uint32_t)st.bits;
        double levels = ldexp(1.0, (int)bits[k]) - 1;
        err[k] = e[k] / (levels * levels);
    }
    mq_observation_t o = s_obs_at(m);
    o.ntensors = 3;
    o.layout_tensors = 5;
    o.tensor_count = count;
    o.tensor_bits = bits;
    o.tensor_index = index;
    o.tensor_err = err;
    return o;
}

static void s_feed_tensors(mq_policy_t *p, uint64_t from, uint64_t to, const double *e)
{
    for (uint64_t m = from; m < to; m++) {
        uint64_t count[3];
        uint32_t bits[3], index[3];
        double err[3];
        mq_observation_t o = s_tensor_obs(p, m, e, count, bits, index, err);
        cr_assert_geq(mq_policy_observe(p, &o), 1);
    }
}

Test(rl, lgreco_moves_bits_to_the_noisy_tensor_and_sends_fewer)
{
    /* one tensor with 4096x the others' error: at the budget of 4 bits everywhere it gets
     * more, the quiet ones fewer, and fewer bits go out in all */
    const double e[3] = {4096, 1, 1};
    mq_policy_t *p = test_policy_new("lgreco:bits=4,min=1", NULL);
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_eq(st.bits, 4);
    cr_expect_eq(st.nwidths, 0, "no per-tensor levels before a measurement");
    s_feed_tensors(p, 0, 50, e);
    mq_policy_status(p, &st);
    cr_assert_eq(st.nwidths, 5, "one level per tensor of the layout");
    cr_expect_eq(st.widths[0], 4, "a tensor not reported stays at bits=");
    cr_expect_eq(st.widths[3], 4);
    int b[3] = {st.widths[1], st.widths[2], st.widths[4]}, four[3] = {4, 4, 4};
    cr_expect_gt(b[0], 4, "the noisy tensor: %d bits", b[0]);
    cr_expect_lt(b[1], 4, "a quiet tensor: %d bits", b[1]);
    cr_expect_lt(b[0] + b[1] + b[2], 12, "%d+%d+%d bits a value, uniform 4 sends 12", b[0], b[1],
                 b[2]);
    cr_expect_leq(mq_alloc_error(e, 3, b), mq_alloc_error(e, 3, four) * 1.001,
                  "the error stays within that of 4 bits everywhere");
    cr_expect(strstr(st.detail, "over 3 tensors"), "%s", st.detail);
    /* the levels it measured at do not move its answer: the same every window */
    uint8_t before[5];
    memcpy(before, st.widths, 5);
    s_feed_tensors(p, 50, 100, e);
    mq_policy_status(p, &st);
    cr_expect_arr_eq(st.widths, before, 5);
    /* a new run starts uniform again */
    cr_assert_eq(mq_policy_new_episode(p), 0);
    mq_policy_status(p, &st);
    cr_expect_eq(st.nwidths, 0);
    cr_expect_eq(st.bits, 4);
    mq_policy_destroy(&p);
}

Test(rl, lgreco_equal_tensors_stay_uniform_and_resume_exactly)
{
    /* equal tensors: uniform B is already the cheapest within the budget */
    const double same[3] = {5, 5, 5};
    mq_policy_t *p = test_policy_new("lgreco:bits=3,min=1", NULL);
    s_feed_tensors(p, 0, 20, same);
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    for (int t = 0; t < 5; t++)
        cr_expect_eq(st.widths[t], 3, "tensor %d at %d bits", t, st.widths[t]);
    mq_policy_destroy(&p);
    /* saved mid-window, restored, fed the same: the same levels as one that never stopped */
    const double e[3] = {900, 3, 1};
    mq_policy_t *a = test_policy_new("lgreco:bits=3,min=1", NULL);
    mq_policy_t *b = test_policy_new("lgreco:bits=3,min=1", NULL);
    s_feed_tensors(a, 0, 60, e);
    s_feed_tensors(b, 0, 37, e);
    b = s_save_restore(b);
    s_feed_tensors(b, 37, 60, e);
    mq_policy_status_t sa, sb;
    mq_policy_status(a, &sa);
    mq_policy_status(b, &sb);
    cr_expect_eq(sa.nwidths, sb.nwidths);
    cr_expect_arr_eq(sa.widths, sb.widths, sizeof sa.widths);
    cr_expect_str_eq(sa.detail, sb.detail);
    mq_policy_destroy(&a);
    mq_policy_destroy(&b);
}

Test(rl, lgreco_refuses_bad_options_and_ignores_bad_measurements)
{
    cr_expect_null(mq_policy_new("lgreco:bits=9", NULL));
    cr_expect(strstr(mq_err_last(), "bits"), "%s", mq_err_last());
    cr_expect_null(mq_policy_new("lgreco:bits=1", NULL), "1 lies below the default min 2");
    cr_expect(strstr(mq_err_last(), "outside"), "%s", mq_err_last());
    /* a measurement naming a tensor outside the layout, or a non-finite error, is not used */
    mq_policy_t *p = test_policy_new("lgreco", NULL);
    const double e[3] = {4096, 1, 1};
    for (uint64_t m = 0; m < 10; m++) {
        uint64_t count[3];
        uint32_t bits[3], index[3];
        double err[3];
        mq_observation_t o = s_tensor_obs(p, m, e, count, bits, index, err);
        if (m % 2)
            index[2] = 5; /* the layout has 5 */
        else
            err[0] = NAN;
        cr_expect_eq(mq_policy_observe(p, &o), 4);
    }
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_eq(st.nwidths, 0, "nothing usable was measured");
    mq_policy_destroy(&p);
}
