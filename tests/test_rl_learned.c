/* Tests of the learned policy (p_learned.c) and of episodes (mq_policy_new_episode): its
 * options and their errors, bits kept in range and able to go down, decisions by training
 * time, the reward against hand computations, bit-exact save/restore with the returns,
 * episodes for every policy, epsilon's decay and a greedy epsilon=0, and learning: in a
 * simulated training where low bits are best early and more bits later, the greedy policy
 * trained over episodes beats every fixed width. Last, the agent: a new episode when
 * iteration 0 comes again, and a deployed spec taking over the trained table. */
#include <criterion/criterion.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../common/src/rl/rl_internal.h"
#include "policy_test.h"
#include "agent_internal.h"


static mq_rl_learned_t *s_ln(mq_policy_t *p)
{
    cr_assert_str_eq(p->ops->name, "learned");
    return p->priv;
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

/* ---- a simulated training run ------------------------------------------------------ */

/* A loss that relaxes toward a floor set by the bits: each iteration closes S_RATE of the gap
 * to L* + A 4^-(bits-1) (quantization noise, a quarter per extra bit), and costs
 * S_C0 + S_C1 bits milliseconds (the gradient's bytes on the link). Early, far above every
 * floor, few bits win by iterating faster; near the end the floors of few bits stop the
 * loss, and more bits win. The run ends at a budget of training time. Observed losses carry
 * 2 % noise; |Q(g)| is |g| with the energy uniform quantization adds to a Gaussian. */
#define S_BUDGET_MS 200000.0
#define S_RATE 0.002
#define S_C0 10.0
#define S_C1 40.0
#define S_FLOOR_A 2.0
#define S_LSTAR 0.1
#define S_L0 2.3
#define S_NOISE 0.02

/* The agent's logic and program, not who may talk to it (test_security's): its services and
 * clients here run without keys. Set before Criterion forks the tests. */
__attribute__((constructor)) static void s_no_keys(void)
{
    setenv("MQGRAD_INSECURE", "1", 1);
}

/* A link that changes (the second simulated run): slow for S_SLOW_MS of every S_PERIOD_MS of
 * training (S_C1_SLOW ms a bit), fast the rest (S_C1_FAST). There the quantization noise
 * slows the progress instead of setting a floor: an iteration at b bits closes
 * S_RATE_LINK (1 - 2^-b) of the gap to L*. Per millisecond of training that is
 * (1 - 2^-b) / (S_C0 + c b): on the slow link 0.0100 at 1 bit, 0.0083 at 2, 0.0067 at 3; on
 * the fast one 0.048 at 1 bit, 0.076 at 3, 0.078 at 4, 0.071 at 8. No width is best on both:
 * the best fixed one, 3 bits, makes 0.0206 per millisecond over the square wave, 1 bit on the
 * slow link and 4 on the fast one 0.0236 (1.15x). The communication time is c b. */
#define S_PERIOD_MS 40000.0
#define S_SLOW_MS 32000.0
#define S_C1_SLOW 40.0
#define S_C1_FAST 0.5
#define S_RATE_LINK 0.0005

typedef struct {
    double loss, t_ms;
    uint64_t iter;
    bool changing; /* the second run: the link that changes */
    mq_rng_t rng;
} s_env_t;

static void s_env_start(s_env_t *e, uint64_t seed, bool changing)
{
    e->loss = S_L0;
    e->t_ms = 0;
    e->iter = 0;
    e->changing = changing;
    mq_rng_seed(&e->rng, seed);
}

/* The link of the changing run is fast now. */
static bool s_env_fast(const s_env_t *e)
{
    return e->changing && fmod(e->t_ms, S_PERIOD_MS) >= S_SLOW_MS;
}

/* One iteration at BITS: the observation the scheduler would send. */
static mq_observation_t s_env_step(s_env_t *e, int bits)
{
    double c1 = S_C1, comm_ms = 0; /* the first run does not say what the link costs */
    if (e->changing) {
        c1 = s_env_fast(e) ? S_C1_FAST : S_C1_SLOW;
        comm_ms = c1 * bits;
        e->loss -= S_RATE_LINK * (1 - ldexp(1.0, -bits)) * (e->loss - S_LSTAR);
    } else {
        double floor_b = S_LSTAR + S_FLOOR_A * pow(4.0, -(bits - 1));
        e->loss -= S_RATE * (e->loss - floor_b);
    }
    double ms = S_C0 + c1 * bits;
    e->t_ms += ms;
    double levels = ldexp(1.0, bits) - 1;
    mq_observation_t o = {.iter = e->iter++,
                          .loss = e->loss * (1 + S_NOISE * mq_rng_normal(&e->rng)),
                          .iter_ms = ms,
                          .comm_ms = comm_ms,
                          .progress = fmin(e->t_ms / S_BUDGET_MS, 1.0),
                          .bits = bits,
                          .grad_norm = 1.0,
                          .sent_norm = sqrt(1 + 3 / (levels * levels))};
    return o;
}

/* One episode of P on the simulated run seeded SEED (the changing link's if CHANGING), then
 * a new episode (which records its return). Returns the final (noise-free) loss;
 * SEEN[fast][b] counts iterations at b bits on the slow (0) and fast (1) link. */
static double s_episode_on(mq_policy_t *p, uint64_t seed, bool changing, uint64_t seen[2][9])
{
    s_env_t e;
    s_env_start(&e, seed, changing);
    int bits = p->bits;
    while (e.t_ms < S_BUDGET_MS) {
        if (seen)
            seen[s_env_fast(&e)][bits]++;
        mq_observation_t o = s_env_step(&e, bits);
        bits = mq_policy_observe(p, &o);
        cr_assert(bits >= 1 && bits <= 8);
    }
    cr_assert_eq(mq_policy_new_episode(p), 0, "%s", mq_err_last());
    return e.loss;
}

/* The first run: BITS_SEEN[b] counts iterations at b. */
static double s_episode(mq_policy_t *p, uint64_t seed, uint64_t bits_seen[9])
{
    uint64_t seen[2][9] = {{0}};
    double loss = s_episode_on(p, seed, false, bits_seen ? seen : NULL);
    for (int b = 0; bits_seen && b < 9; b++)
        bits_seen[b] += seen[0][b];
    return loss;
}

static double s_last_return(const mq_policy_t *p)
{
    const double *r;
    size_t n = mq_policy_returns(p, &r);
    cr_assert_gt(n, 0);
    return r[n - 1];
}

static void s_opts(mq_policy_opts_t *o, int min, int max, int start)
{
    mq_policy_opts_default(o);
    o->min_bits = min;
    o->max_bits = max;
    o->start_bits = start;
}

/* ---- options ------------------------------------------------------------------------- */

Test(rl_learned, defaults_and_options)
{
    mq_policy_t *p = test_policy_new("learned", NULL);
    mq_rl_learned_t *m = s_ln(p);
    cr_expect_float_eq(m->every, 5, 1e-12);
    cr_expect_float_eq(m->smooth, 0.1, 1e-12);
    cr_expect_float_eq(m->gain, 100, 1e-12);
    cr_expect_float_eq(m->decay, 0.97, 1e-12);
    cr_expect_float_eq(m->discount, 0.3, 1e-12, "not the common 0.9");
    cr_expect_float_eq(m->floor, 0.01, 1e-12);
    cr_expect_eq(m->frozen, false);
    cr_expect_eq(m->nprog, 4);
    cr_expect_eq(m->ntrend, 2);
    cr_expect_eq(m->nqerr, 3);
    cr_expect_eq(m->nprice, 3);
    cr_expect_eq(m->nstates, 7 * 4 * 2 * 3 * 3,
                 "bits 2..8, 4 progress, 2 trend, 3 error, 3 price buckets");
    cr_expect_eq(p->bits, 2, "starts at the start bits");
    cr_expect(mq_policy_episodic(p));
    const double *r;
    cr_expect_eq(mq_policy_returns(p, &r), 0);
    mq_policy_destroy(&p);

    mq_policy_opts_t o;
    s_opts(&o, 1, 4, 1);
    p = test_policy_new("learned:every=2,gain=10,discount=0,progress=2,frozen", &o);
    m = s_ln(p);
    cr_expect_float_eq(m->every, 2, 1e-12);
    cr_expect_float_eq(m->gain, 10, 1e-12);
    cr_expect_float_eq(m->discount, 0, 1e-12, "learned's own discount");
    cr_expect_eq(m->frozen, true);
    cr_expect_eq(m->nstates, 4 * 2 * 2 * 3 * 3, "bits 1..4, 2 progress buckets");
    cr_expect_float_eq(mq_rl_learned_epsilon(p), 0, 1e-12, "frozen: greedy");
    mq_policy_destroy(&p);
    p = test_policy_new("learned:trend=0,qerr=0,price=0", &o);
    cr_expect_eq(s_ln(p)->nstates, 4 * 4,
                 "bits 1..4, 4 progress buckets, no trend, no error, no price");
    mq_policy_destroy(&p);
    p = test_policy_new("learned:trend=0,qerr=0", &o);
    cr_expect_eq(s_ln(p)->nstates, 4 * 4 * 3, "the price feature on by default");
    mq_policy_destroy(&p);

    p = test_policy_new("learned:epsilon=0.005,every=0", NULL);
    cr_expect_float_eq(s_ln(p)->floor, 0.005, 1e-12, "the floor is at most epsilon");
    cr_expect_float_eq(s_ln(p)->every, 0, 1e-12);
    mq_policy_destroy(&p);

    /* the others have no episodes of their own to report */
    p = test_policy_new("mqgrad", NULL);
    cr_expect_not(mq_policy_episodic(p));
    r = (const double *)p;
    cr_expect_eq(mq_policy_returns(p, &r), 0);
    cr_expect_null(r);
    mq_policy_destroy(&p);
}

Test(rl_learned, bad_options_refused)
{
    static const struct {
        const char *spec, *msg;
    } bad[] = {
        {"learned:every=-1", "learned option every (seconds of training per decision"},
        {"learned:every=x", "'x' is not a number"},
        {"learned:smooth=0", "smooth (loss smoothing per iteration) must be > 0"},
        {"learned:smooth=1.5", "learned option smooth"},
        {"learned:gain=0", "gain (reward scale) must be > 0"},
        {"learned:decay=0", "decay (epsilon's factor per episode) must be > 0"},
        {"learned:decay=2", "learned option decay"},
        {"learned:floor=2", "learned option floor"},
        {"learned:floor=0.5", "epsilon's floor 0.5 is above epsilon 0.1"},
        {"learned:progress=0", "progress (buckets of the run's progress): '0' is not an integer "
                               "in 1..10"},
        {"learned:progress=11", "1..10"},
        {"learned:trend=2", "trend (the loss trend feature, 0 or 1)"},
        {"learned:qerr=yes", "qerr (the quantization error feature, 0 or 1)"},
        {"learned:price=2", "price (the communication share feature, 0 or 1)"},
        {"learned:frozen=2", "learned option frozen"},
        {"learned:every", "'every' is not key=value"},
        {"learned:bogus=1", "learned takes every, smooth, gain, discount, decay, floor, frozen, "
                            "progress, trend, qerr"},
        {"learned:discount=1.5", "learned option discount"},
        {"learned:min=0", "min"},
        {"learned:min=5,max=3", "above max"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        test_policy_refused(bad[i].spec, bad[i].msg);
    /* a floor above epsilon is no contradiction when nothing explores */
    mq_policy_t *p = test_policy_new("learned:floor=0.5,frozen", NULL);
    mq_policy_destroy(&p);
}

/* ---- decisions ----------------------------------------------------------------------- */

/* Explore all the time on a narrow range: every width of 1..3 is used, never another, and
 * the bits go down as often as up. */
Test(rl_learned, bits_stay_in_range_and_go_down)
{
    mq_policy_opts_t o;
    s_opts(&o, 1, 3, 1);
    o.epsilon = 1;
    mq_policy_t *p = test_policy_new("learned:every=0", &o);
    int seen[10] = {0}, downs = 0, ups = 0, prev = p->bits;
    for (uint64_t m = 0; m < 2000; m++) {
        int b = mq_policy_observe(p, OBS(m, 2.0 - 0.0005 * (double)m, 10));
        cr_assert(b >= 1 && b <= 3, "%d bits at %lu", b, (unsigned long)m);
        seen[b]++;
        downs += b < prev;
        ups += b > prev;
        prev = b;
    }
    for (int b = 1; b <= 3; b++)
        cr_expect_gt(seen[b], 100, "width %d used %d times", b, seen[b]);
    cr_expect_gt(downs, 50);
    cr_expect_gt(ups, 50);
    mq_policy_destroy(&p);

    /* greedy on a table that prefers "down" everywhere: one bit less per decision, to min */
    s_opts(&o, 2, 8, 8);
    p = test_policy_new("learned:every=0,epsilon=0", &o);
    mq_rl_learned_t *m = s_ln(p);
    for (int s = 0; s < m->nstates; s++)
        m->q[s * 3] = 1;
    int want[] = {7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 5};
    for (uint64_t i = 0; i < 11; i++)
        cr_expect_eq(mq_policy_observe(p, OBS(i, 1, 10)), want[i], "iteration %lu",
                     (unsigned long)i);
    for (uint64_t i = 11; i < 60; i++)
        mq_policy_observe(p, OBS(i, 1, 10));
    cr_expect_eq(p->bits, 2, "stops at min");
    mq_policy_destroy(&p);
}

/* The iterations at which P decided, over N observations of MS milliseconds each. */
static int s_decision_iters(mq_policy_t *p, uint64_t n, double ms, uint64_t *at)
{
    int k = 0;
    mq_rl_learned_t *m = s_ln(p);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t before = m->decisions;
        mq_policy_observe(p, OBS(i, 2.0 / (1 + 0.01 * (double)i), ms));
        if (m->decisions > before)
            at[k++] = i;
    }
    return k;
}

/* every=1: one decision per second of the iterations' time (and one at the first loss),
 * whatever the iteration count; without times, or with every=0, one per T iterations. */
Test(rl_learned, decisions_by_training_time)
{
    uint64_t at[200];
    mq_policy_t *p = test_policy_new("learned:every=1", NULL);
    int k = s_decision_iters(p, 100, 100, at); /* 10 iterations a second */
    cr_expect_eq(k, 10);
    for (int i = 0; i < k; i++)
        cr_expect_eq(at[i], (uint64_t)(10 * i), "decision %d", i);
    mq_policy_destroy(&p);

    p = test_policy_new("learned:every=1", NULL);
    k = s_decision_iters(p, 100, 250, at); /* 4 a second */
    cr_expect_eq(k, 25);
    for (int i = 0; i < k; i++)
        cr_expect_eq(at[i], (uint64_t)(4 * i), "decision %d", i);
    cr_expect_eq(mq_policy_history(p, &(const mq_decision_t *){NULL}), 20,
                 "the history still has one entry per window of T = 5");
    mq_policy_destroy(&p);

    p = test_policy_new("learned:every=1,T=8", NULL);
    k = s_decision_iters(p, 100, NAN, at); /* no time known: every T */
    cr_expect_eq(k, 13);
    cr_expect_eq(at[1], 8);
    cr_expect_eq(at[12], 96);
    mq_policy_destroy(&p);

    p = test_policy_new("learned:every=0", NULL);
    k = s_decision_iters(p, 100, 250, at);
    cr_expect_eq(k, 20);
    cr_expect_eq(at[1], 5);
    mq_policy_destroy(&p);
}

/* smooth=1 (no smoothing), gain 100, every 1 s of 100 ms iterations: the first loss 4 is
 * S_0; at iteration 10 the loss is 3, r = 100 (4 - 3) / 4 = 25; at 20 it is 3.5 (risen),
 * r = 100 (3 - 3.5) / 4 = -12.5, and the trend feature says "risen". The episode closes at
 * iteration 24 with loss 2: r = 100 (3.5 - 2) / 4 = 37.5, and its return is
 * 25 - 12.5 + 37.5 = 50 = 100 (4 - 2) / 4. */
Test(rl_learned, reward_is_the_normalized_decrease)
{
    mq_policy_t *p = test_policy_new("learned:every=1,smooth=1", NULL);
    mq_rl_learned_t *m = s_ln(p);
    for (uint64_t i = 0; i <= 24; i++) {
        double l = i == 0 ? 4 : i <= 10 ? 4 - 0.1 * (double)i : i <= 20 ? 3.5 : 2;
        mq_policy_observe(p, OBS(i, l, 100));
        if (i == 10)
            cr_expect_float_eq(m->last_r, 25, 1e-12);
        if (i == 20) {
            cr_expect_float_eq(m->last_r, -12.5, 1e-12);
            cr_expect_eq(m->trend, 0, "the loss rose over the interval");
        }
    }
    cr_expect_float_eq(m->ret, 12.5, 1e-12);
    cr_expect_eq(mq_policy_new_episode(p), 0);
    cr_expect_float_eq(s_last_return(p), 50, 1e-12);
    mq_policy_destroy(&p);

    /* smooth 0.5, gain 10, every 0.2 s: losses 4, 2, 2 smooth to 4, 3, 2.5; the decision at
     * iteration 2 gets 10 (4 - 2.5) / 4 = 3.75 */
    p = test_policy_new("learned:every=0.2,smooth=0.5,gain=10", NULL);
    m = s_ln(p);
    const double l[] = {4, 2, 2};
    for (uint64_t i = 0; i < 3; i++)
        mq_policy_observe(p, OBS(i, l[i], 100));
    cr_expect_eq(m->decisions, 2);
    cr_expect_float_eq(m->sm, 2.5, 1e-12);
    cr_expect_float_eq(m->last_r, 3.75, 1e-12);
    mq_policy_destroy(&p);
}

/* ---- episodes and persistence --------------------------------------------------------- */

/* A learned policy trained for 3 episodes and saved in the middle of the 4th continues
 * exactly as the one never saved: bits, returns, saved bytes. */
Test(rl_learned, save_restore_is_bit_exact)
{
    mq_policy_opts_t o;
    s_opts(&o, 1, 8, 4);
    o.epsilon = 0.3;
    o.seed = 99;
    mq_policy_t *a = test_policy_new("learned:every=5", &o), *b = test_policy_new("learned:every=5", &o);
    for (uint64_t ep = 0; ep < 3; ep++) {
        s_episode(a, ep, NULL);
        s_episode(b, ep, NULL);
        b = s_save_restore(b);
    }
    s_env_t ea, eb;
    s_env_start(&ea, 3, true);
    s_env_start(&eb, 3, true);
    int ba = a->bits, bb = b->bits;
    for (int i = 0; i < 1500; i++) {
        if (i == 777)
            b = s_save_restore(b);
        mq_observation_t oa = s_env_step(&ea, ba), ob = s_env_step(&eb, bb);
        ba = mq_policy_observe(a, &oa);
        bb = mq_policy_observe(b, &ob);
        cr_assert_eq(ba, bb, "iteration %d", i);
    }
    const double *ra, *rb;
    size_t na = mq_policy_returns(a, &ra), nb = mq_policy_returns(b, &rb);
    cr_assert_eq(na, 3);
    cr_assert_eq(nb, 3);
    cr_expect_eq(memcmp(ra, rb, 3 * sizeof(double)), 0);
    uint8_t *sa, *sb;
    size_t la, lb;
    cr_assert_eq(mq_policy_save(a, &sa, &la), 0);
    cr_assert_eq(mq_policy_save(b, &sb, &lb), 0);
    cr_expect(la == lb && memcmp(sa, sb, la) == 0, "saved states differ");
    /* values its table cannot hold are refused under a valid checksum: the section starts
     * with every (5) and smooth (0.1); progress buckets follow every, smooth, gain,
     * discount, decay, floor and frozen: 6 doubles and a u32 */
    const double head[2] = {5, 0.1};
    size_t at = 0;
    while (at + 16 <= la && memcmp(sa + at, head, 16) != 0)
        at++;
    cr_assert_lt(at + 16, la, "learned's section not found");
    cr_assert_eq(sa[at + 52], 4);
    sa[at + 52] = 11;
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, sa, 20), sa + 24, la - 24);
    for (int i = 0; i < 4; i++)
        sa[20 + i] = (uint8_t)(crc >> (8 * i));
    cr_expect_null(mq_policy_restore(sa, la));
    cr_expect(strstr(mq_err_last(), "learned feature buckets out of range"), "%s",
              mq_err_last());
    free(sa);
    free(sb);
    mq_policy_destroy(&a);
    mq_policy_destroy(&b);
}

/* A state saved before the price feature (version 2: no price buckets in learned's section,
 * nor the open interval's communication time) restores as a policy without it, which goes
 * on as the one that was saved. The version 2 bytes are made from a version 3 state of
 * learned:price=0 by taking those fields out. */
Test(rl_learned, a_state_from_before_the_price_feature_restores)
{
    mq_policy_opts_t o;
    s_opts(&o, 1, 8, 4);
    o.epsilon = 0.3;
    o.seed = 7;
    mq_policy_t *a = test_policy_new("learned:every=5,price=0", &o);
    for (uint64_t ep = 0; ep < 3; ep++)
        s_episode(a, ep, NULL);
    s_env_t ea, eb;
    s_env_start(&ea, 5, false);
    s_env_start(&eb, 5, false);
    int ba = a->bits;
    for (int i = 0; i < 700; i++) { /* into an open interval */
        mq_observation_t oa = s_env_step(&ea, ba);
        s_env_step(&eb, ba);
        ba = mq_policy_observe(a, &oa);
    }
    uint8_t *buf;
    size_t len;
    cr_assert_eq(mq_policy_save(a, &buf, &len), 0, "%s", mq_err_last());
    cr_assert_eq(buf[8], 3, "saved as version 3");
    const double head[2] = {5, 0.1}; /* every, smooth: learned's section begins with them */
    size_t at = 0;
    while (at + 16 <= len && memcmp(buf + at, head, 16) != 0)
        at++;
    cr_assert_lt(at + 16, len, "learned's section not found");
    uint32_t seclen;
    memcpy(&seclen, buf + at - 4, 4);
    int32_t nprice;
    memcpy(&nprice, buf + at + 64, 4); /* after 6 doubles, frozen and 3 bucket counts */
    cr_assert_eq(nprice, 1);
    /* out: the price buckets, and the section's last 20 bytes (the interval's communication
     * time, the time it is part of, the price bucket) */
    size_t end = at + seclen;
    memmove(buf + end - 20, buf + end, len - end);
    len -= 20;
    memmove(buf + at + 64, buf + at + 68, len - (at + 68));
    len -= 4;
    seclen -= 24;
    memcpy(buf + at - 4, &seclen, 4);
    uint64_t payload = len - 24;
    memcpy(buf + 12, &payload, 8);
    buf[8] = 2;
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, buf, 20), buf + 24, len - 24);
    memcpy(buf + 20, &crc, 4);
    mq_policy_t *b = mq_policy_restore(buf, len);
    cr_assert_not_null(b, "%s", mq_err_last());
    free(buf);
    cr_expect_eq(s_ln(b)->nprice, 1, "no price feature");
    cr_expect_eq(b->bits, a->bits);
    int bb = b->bits;
    for (int i = 0; i < 3000; i++) {
        mq_observation_t oa = s_env_step(&ea, ba), ob = s_env_step(&eb, bb);
        ba = mq_policy_observe(a, &oa);
        bb = mq_policy_observe(b, &ob);
        cr_assert_eq(ba, bb, "iteration %d", i);
    }
    /* deploying it under a spec with the price feature (the default) says what to give */
    mq_policy_t *d = test_policy_new("learned:every=5,epsilon=0", &o);
    cr_expect_neq(mq_policy_adopt(d, b), 0);
    cr_expect(strstr(mq_err_last(), "needs price=0"), "%s", mq_err_last());
    mq_policy_destroy(&d);
    d = test_policy_new("learned:every=5,epsilon=0,price=0", &o);
    cr_expect_eq(mq_policy_adopt(d, b), 0, "%s", mq_err_last());
    mq_policy_destroy(&d);
    mq_policy_destroy(&a);
    mq_policy_destroy(&b);
}

/* The state index of bits B (of MIN..), price bucket PR, in a table of one progress bucket and
 * no trend or error feature. */
static int s_price_state(int b, int min, int pr)
{
    return (b - min) * 3 + pr;
}

/* Deployed (frozen), a table meets a state its training never visited: it decides it by the
 * nearest visited state of the same bits (here: the same bits on a slow link, which says +1),
 * not by its own all-zero values (which would keep the bits); a visited state keeps its own. */
Test(rl_learned, a_frozen_table_reads_an_unvisited_state_as_the_nearest_visited_one)
{
    mq_policy_opts_t o;
    s_opts(&o, 2, 4, 2);
    o.epsilon = 0;
    mq_policy_t *p = test_policy_new("learned:every=1,progress=1,trend=0,qerr=0", &o);
    mq_rl_learned_t *m = s_ln(p);
    cr_assert_eq(m->nstates, 9, "bits 2..4 by 3 price buckets");
    /* trained: at 2 bits on a slow link (price 2), +1; at 3 bits on a fast one (price 0), -1 */
    int slow2 = s_price_state(2, 2, 2), fast3 = s_price_state(3, 2, 0);
    m->q[slow2 * 3 + 2] = 1, m->visits[slow2 * 3 + 2] = 4;
    m->visits[slow2 * 3 + 1] = 4;
    m->q[fast3 * 3 + 0] = 1, m->visits[fast3 * 3 + 0] = 4;
    m->visits[fast3 * 3 + 1] = 4;
    /* a fast link from the start: 2 bits there was never visited */
    mq_observation_t ob = {.loss = 2.0, .iter_ms = 1000, .comm_ms = 100, .bits = 2};
    int bits = mq_policy_observe(p, &ob);
    cr_assert_eq(bits, 3, "read as 2 bits on the slow link: +1 (its own zeros would keep 2)");
    ob.iter = 1, ob.loss = 1.9, ob.bits = 3;
    bits = mq_policy_observe(p, &ob);
    cr_assert_eq(bits, 2, "3 bits on a fast link was visited: its own values, -1");
    mq_policy_destroy(&p);
}

/* The returns are bounded: the last 1024 episodes, oldest first, and saved. */
Test(rl_learned, returns_keep_the_last_1024_episodes)
{
    mq_policy_t *p = test_policy_new("learned:every=0,smooth=1", NULL);
    for (int ep = 0; ep < 1030; ep++) {
        /* return 100 (2 - l1) / 2 with l1 = 2 - ep / 1000 */
        mq_policy_observe(p, OBS(0, 2, 1));
        mq_policy_observe(p, OBS(1, 2 - ep / 1000.0, 1));
        cr_assert_eq(mq_policy_new_episode(p), 0);
    }
    p = s_save_restore(p);
    const double *r;
    cr_assert_eq(mq_policy_returns(p, &r), MQ_RL_MAX_RETURNS);
    cr_expect_float_eq(r[0], 100 * (6 / 1000.0) / 2, 1e-9, "episode 6 is the oldest kept");
    cr_expect_float_eq(r[1023], 100 * (1029 / 1000.0) / 2, 1e-9);
    cr_expect_eq(s_ln(p)->episodes, 1030);
    mq_policy_destroy(&p);
}

/* Iteration 0 is accepted again after a new episode; the common part starts over. */
Test(rl_learned, new_episode_accepts_iteration_0_and_records_the_return)
{
    mq_policy_opts_t o;
    s_opts(&o, 2, 8, 3);
    mq_policy_t *p = test_policy_new("learned:every=1,smooth=1", &o);
    for (uint64_t i = 0; i < 50; i++)
        mq_policy_observe(p, OBS(i, 3 - 0.02 * (double)i, 100));
    mq_policy_observe(p, OBS(0, 9, 100)); /* without a new episode: an old iteration */
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    cr_expect_eq(st.observations, 50);
    cr_expect_eq(st.step, 10);
    p = s_save_restore(p); /* as the agent's state file would */
    cr_assert_eq(mq_policy_new_episode(p), 0);
    mq_policy_status(p, &st);
    cr_expect_eq(st.observations, 0);
    cr_expect_eq(st.step, 0);
    cr_expect_eq(st.bits, 3, "back to the start bits");
    cr_expect(isnan(st.last_reward));
    /* 100 (3 - 2.02) / 3 */
    cr_expect_float_eq(s_last_return(p), 100 * 0.98 / 3, 1e-9);
    for (uint64_t i = 0; i < 20; i++)
        mq_policy_observe(p, OBS(i, 5, 100));
    mq_policy_status(p, &st);
    cr_expect_eq(st.observations, 20, "iteration 0 was accepted again");
    cr_expect_eq(st.step, 4);
    cr_expect_eq(st.iter, 19);
    cr_expect_float_eq(s_ln(p)->s0, 5, 1e-12, "the new episode's own first loss");
    /* an episode without observations records nothing */
    cr_assert_eq(mq_policy_new_episode(p), 0);
    cr_assert_eq(mq_policy_new_episode(p), 0);
    const double *r;
    cr_expect_eq(mq_policy_returns(p, &r), 2);
    cr_expect_eq(s_ln(p)->episodes, 2);
    cr_expect_eq(mq_policy_new_episode(NULL), -1);
    mq_policy_destroy(&p);
}

static mq_observation_t s_obs_at(uint64_t m)
{
    return (mq_observation_t){.iter = m,
                              .loss = 2.0 / (1 + 0.02 * (double)m) + 0.01 * sin((double)m * 1.7),
                              .iter_ms = 50 + (double)(m % 7),
                              .grad_range = 10 + (double)(m % 3),
                              .grad_sqmean = 1,
                              .grad_norm = 0.5 + 0.3 * cos((double)m * 0.3),
                              .sent_norm = 0.55,
                              .total_iters = 100};
}

/* Every policy starts over on a new episode: iteration 0 accepted, bits back to its first
 * width, no steps. Those that learn nothing across runs then answer as a fresh policy does;
 * mqgrad keeps its network and starts a new MDP. */
Test(rl_learned, every_policy_starts_over_on_a_new_episode)
{
    size_t n;
    const mq_policy_ops_t *const *all = mq_rl_policies(&n);
    for (size_t i = 0; i < n; i++) {
        char spec[64];
        snprintf(spec, sizeof spec, "%.*s", (int)strcspn(all[i]->usage, "["), all[i]->usage);
        char *k = strstr(spec, ":K");
        if (k)
            strcpy(k, ":3");
        mq_policy_t *p = test_policy_new(spec, NULL), *fresh = test_policy_new(spec, NULL);
        int first = p->bits;
        for (uint64_t m = 0; m < 100; m++) {
            mq_observation_t o = s_obs_at(m);
            mq_policy_observe(p, &o);
        }
        bool mqgrad = strcmp(spec, "mqgrad") == 0;
        double b2[16] = {0};
        if (mqgrad) {
            const mq_rl_qnet_t *net = &((mq_rl_mqgrad_t *)p->priv)->net;
            memcpy(b2, net->b2, (size_t)net->out * sizeof(double));
        }
        cr_assert_eq(mq_policy_new_episode(p), 0, "%s: %s", spec, mq_err_last());
        if (mqgrad) {
            const mq_rl_mqgrad_t *mq = p->priv, *mf = fresh->priv;
            size_t nb = (size_t)mq->net.out * sizeof(double);
            cr_expect_eq(memcmp(b2, mq->net.b2, nb), 0, "mqgrad keeps its network");
            cr_expect_neq(memcmp(b2, mf->net.b2, nb), 0, "mqgrad had learned something");
            cr_expect_not(mq->have_state, "mqgrad starts a new MDP");
        }
        mq_policy_status_t st;
        mq_policy_status(p, &st);
        cr_expect_eq(st.bits, first, "%s", spec);
        cr_expect_eq(st.step, 0, "%s", spec);
        const mq_decision_t *h;
        cr_expect_eq(mq_policy_history(p, &h), 0, "%s", spec);
        bool same = true;
        for (uint64_t m = 0; m < 100; m++) {
            mq_observation_t o = s_obs_at(m);
            int a = mq_policy_observe(p, &o), b = mq_policy_observe(fresh, &o);
            same = same && a == b;
        }
        mq_policy_status(p, &st);
        cr_expect_eq(st.observations, 100, "%s: iteration 0 accepted again", spec);
        cr_expect_eq(st.step, 20, "%s", spec);
        if (mqgrad) {
            cr_expect(((mq_rl_mqgrad_t *)p->priv)->have_state, "mqgrad decided again");
        } else if (strcmp(spec, "learned") != 0) {
            cr_expect(same, "%s: after a new episode it answers as a fresh one", spec);
        }
        mq_policy_destroy(&p);
        mq_policy_destroy(&fresh);
    }
}

/* ---- exploration -------------------------------------------------------------------- */

Test(rl_learned, epsilon_decays_across_episodes_and_zero_is_greedy)
{
    mq_policy_opts_t o;
    s_opts(&o, 2, 8, 4);
    o.epsilon = 0.5;
    mq_policy_t *p = test_policy_new("learned:decay=0.5,floor=0.05", &o);
    for (int ep = 0; ep < 4; ep++) {
        cr_expect_float_eq(mq_rl_learned_epsilon(p), 0.05 + 0.45 * pow(0.5, ep), 1e-12,
                           "after %d episodes", ep);
        s_episode(p, (uint64_t)ep, NULL);
        p = s_save_restore(p); /* the count is saved */
    }
    cr_expect_float_eq(mq_rl_learned_epsilon(p), 0.05 + 0.45 / 16, 1e-12);
    cr_expect_gt(s_ln(p)->updates, 0);
    mq_policy_destroy(&p);

    /* epsilon=0: no exploration, no learning; two seeds decide alike */
    uint64_t seen_a[9] = {0}, seen_b[9] = {0};
    o.epsilon = 0;
    o.seed = 1;
    mq_policy_t *a = test_policy_new("learned", &o);
    o.seed = 2;
    mq_policy_t *b = test_policy_new("learned", &o);
    for (int ep = 0; ep < 3; ep++) {
        s_episode(a, 7, seen_a);
        s_episode(b, 7, seen_b);
    }
    cr_expect_arr_eq(seen_a, seen_b, sizeof seen_a);
    cr_expect_eq(s_ln(a)->updates, 0, "frozen: no update");
    cr_expect_eq(seen_a[4], seen_a[0] + seen_a[1] + seen_a[2] + seen_a[3] + seen_a[4] +
                                seen_a[5] + seen_a[6] + seen_a[7] + seen_a[8],
                 "an empty table keeps the start bits");
    cr_expect_eq(mq_policy_returns(a, &(const double *){NULL}), 3, "returns still recorded");
    mq_policy_destroy(&a);
    mq_policy_destroy(&b);
}

/* ---- learning ----------------------------------------------------------------------- */

#define S_TRAIN_EPISODES 300
#define S_EVAL_SEEDS 5

/* The mean return and final loss of P over the evaluation runs (seeds 1000...) of the first
 * run, or of the changing link's with CHANGING (then SEEN as s_episode_on's). */
static void s_evaluate_on(mq_policy_t *p, bool changing, double *ret, double *loss,
                          uint64_t seen[2][9])
{
    *ret = *loss = 0;
    for (uint64_t s = 0; s < S_EVAL_SEEDS; s++) {
        *loss += s_episode_on(p, 1000 + s, changing, seen) / S_EVAL_SEEDS;
        *ret += s_last_return(p) / S_EVAL_SEEDS;
    }
}

static void s_evaluate(mq_policy_t *p, double *ret, double *loss, uint64_t bits_seen[9])
{
    uint64_t seen[2][9] = {{0}};
    s_evaluate_on(p, false, ret, loss, seen);
    for (int b = 0; bits_seen && b < 9; b++)
        bits_seen[b] += seen[0][b];
}

/* Trained over 300 episodes of the simulated run (starting at 4 bits of 1..8, epsilon 0.2
 * decaying), the greedy policy ends lower than every fixed width, and its return (the
 * normalized decrease of the smoothed loss, measured the same way for a fixed width:
 * learned on a one-width range) is above every fixed width's, for each of three training
 * seeds. Measured: fixed 3 bits, the best, ends at 0.3203 (return 86.02); learned at
 * 0.2956-0.2966 (returns 87.03-87.07): 4 bits down to 2 at once, then 3, then 4; the best
 * two-switch schedule found by search (2 bits to 15 % of the budget, 3 to 60 %, then 4)
 * ends at 0.289. The test takes about 0.2 s. */
/* Every fixed width 1..8 on the first run or the changing link's: the best return into
 * *BEST_RET (its width returned), the lowest final loss into *BEST_LOSS. */
static int s_best_fixed(bool changing, double *best_ret, double *best_loss)
{
    mq_policy_opts_t o;
    int best = 0;
    *best_ret = -INFINITY, *best_loss = INFINITY;
    for (int b = 1; b <= 8; b++) {
        s_opts(&o, b, b, b);
        mq_policy_t *f = test_policy_new("learned:epsilon=0", &o);
        double ret, loss;
        s_evaluate_on(f, changing, &ret, &loss, NULL);
        printf("%sfixed %d bits: return %.3f, final loss %.4f\n",
               changing ? "changing link, " : "", b, ret, loss);
        if (ret > *best_ret)
            *best_ret = ret, best = b;
        *best_loss = fmin(*best_loss, loss);
        mq_policy_destroy(&f);
    }
    return best;
}

Test(rl_learned, learns_to_beat_every_fixed_width, .timeout = 60)
{
    mq_policy_opts_t o;
    double best_ret, best_loss;
    int best = s_best_fixed(false, &best_ret, &best_loss);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        s_opts(&o, 1, 8, 4);
        o.epsilon = 0.2;
        o.seed = seed;
        mq_policy_t *p = test_policy_new("learned", &o);
        for (uint64_t ep = 0; ep < S_TRAIN_EPISODES; ep++)
            s_episode(p, seed * 100000 + ep, NULL);
        mq_policy_t *g = test_policy_new("learned:epsilon=0", &o);
        cr_assert_eq(mq_policy_adopt(g, p), 0, "%s", mq_err_last());
        uint64_t seen[9] = {0};
        double ret, loss;
        s_evaluate(g, &ret, &loss, seen);
        printf("learned (seed %lu) after %d episodes: return %.3f, final loss %.4f; "
               "iterations at 1..8 bits:",
               (unsigned long)seed, S_TRAIN_EPISODES, ret, loss);
        for (int b = 1; b <= 8; b++)
            printf(" %llu", (unsigned long long)seen[b]);
        printf("\n");
        cr_expect_gt(ret, best_ret, "seed %lu: learned return %.3f, best fixed (%d bits) %.3f",
                     (unsigned long)seed, ret, best, best_ret);
        cr_expect_lt(loss, best_loss, "seed %lu: learned final loss %.4f, best fixed %.4f",
                     (unsigned long)seed, loss, best_loss);
        mq_policy_destroy(&p);
        mq_policy_destroy(&g);
    }
}

/* The share of the iterations in SEEN[1..8] at LO..HI bits. */
static double s_share(const uint64_t seen[9], int lo, int hi)
{
    uint64_t in = 0, all = 0;
    for (int b = 1; b <= 8; b++) {
        all += seen[b];
        in += b >= lo && b <= hi ? seen[b] : 0;
    }
    return all ? (double)in / (double)all : 0;
}

/* Trained greedy on the link that changes (the same 300 episodes, a decision every second of
 * training), the controller that sees the price of a bit (the communication share, on by
 * default) ends lower than every fixed width and above the same controller without that
 * feature (price=0), for each of three training seeds, and plays the answer: few bits on the
 * slow link, more on the fast one. Measured: fixed 3 bits, the best, ends at 0.3855 (return
 * 83.31); with the price 0.3394-0.3746 (returns 83.75-85.31), at 1-2 bits for 89-97 % of the
 * slow link's iterations and at 3-8 for 63-78 % of the fast link's (the answer played
 * without delay would end near L* + 2.2 e^-2.36 = 0.31); without it 0.4090-0.4790 (returns
 * 79.26-82.26), below the best fixed width: blind to the link, it settles on few bits. The
 * test takes about 1 s. */
Test(rl_learned, sees_the_price_of_a_bit_on_a_link_that_changes, .timeout = 60)
{
    mq_policy_opts_t o;
    double best_ret, best_loss;
    int best = s_best_fixed(true, &best_ret, &best_loss);
    for (uint64_t seed = 1; seed <= 3; seed++) {
        double ret[2], loss[2];
        uint64_t seen[2][2][9] = {{{0}}};
        for (int price = 0; price <= 1; price++) {
            s_opts(&o, 1, 8, 4);
            o.epsilon = 0.2;
            o.seed = seed;
            char spec[64];
            snprintf(spec, sizeof spec, "learned:every=1,price=%d", price);
            mq_policy_t *p = test_policy_new(spec, &o);
            for (uint64_t ep = 0; ep < S_TRAIN_EPISODES; ep++)
                s_episode_on(p, seed * 100000 + ep, true, NULL);
            snprintf(spec, sizeof spec, "learned:every=1,price=%d,epsilon=0", price);
            mq_policy_t *g = test_policy_new(spec, &o);
            cr_assert_eq(mq_policy_adopt(g, p), 0, "%s", mq_err_last());
            s_evaluate_on(g, true, &ret[price], &loss[price], seen[price]);
            printf("changing link, learned price=%d (seed %lu): return %.3f, final loss %.4f; "
                   "slow link at 1-2 bits %.0f %%, fast link at 3-8 bits %.0f %%\n",
                   price, (unsigned long)seed, ret[price], loss[price],
                   100 * s_share(seen[price][0], 1, 2), 100 * s_share(seen[price][1], 3, 8));
            mq_policy_destroy(&p);
            mq_policy_destroy(&g);
        }
        cr_expect_gt(ret[1], best_ret, "seed %lu: return %.3f, best fixed (%d bits) %.3f",
                     (unsigned long)seed, ret[1], best, best_ret);
        cr_expect_lt(loss[1], best_loss, "seed %lu: final loss %.4f, best fixed %.4f",
                     (unsigned long)seed, loss[1], best_loss);
        cr_expect_gt(ret[1], ret[0], "seed %lu: return with the price %.3f, without %.3f",
                     (unsigned long)seed, ret[1], ret[0]);
        cr_expect_gt(s_share(seen[1][0], 1, 2), 0.75, "seed %lu: the slow link at 1-2 bits",
                     (unsigned long)seed);
        /* a change of link takes a decision a step to follow (a fast stretch is 8 decisions) */
        cr_expect_gt(s_share(seen[1][1], 3, 8), 0.5, "seed %lu: the fast link at 3-8 bits",
                     (unsigned long)seed);
    }
}

/* ---- the agent ---------------------------------------------------------------------- */

typedef struct {
    mq_agent_config_t cfg;
    zactor_t *actor;
    zsock_t *client;
} s_agent_t;

/* An in-process agent running POLICY with STATE, and a client connected to it. */
static s_agent_t *s_agent(const char *policy, const char *state)
{
    s_agent_t *a = calloc(1, sizeof *a);
    cr_assert(a);
    cr_assert_eq(mq_agent_config_default(&a->cfg), 0);
    snprintf(a->cfg.bind, sizeof a->cfg.bind, "tcp://127.0.0.1:*");
    snprintf(a->cfg.policy, sizeof a->cfg.policy, "%s", policy);
    snprintf(a->cfg.state, sizeof a->cfg.state, "%s", state);
    a->cfg.http.port = 0;
    a->actor = zactor_new(mq_agent_actor, &a->cfg);
    cr_assert(a->actor);
    cr_assert_eq(a->cfg.start_status, 0, "%s", a->cfg.start_error);
    zstr_send(a->actor, "PORT");
    char *port = zstr_recv(a->actor);
    a->client = zsock_new(ZMQ_DEALER);
    cr_assert(a->client);
    mq_wire_prepare(a->client, 0, MQ_WIRE_MAX_CONTROL_MSG);
    zsock_set_rcvtimeo(a->client, 3000);
    cr_assert_eq(zsock_connect(a->client, "tcp://127.0.0.1:%s", port), 0);
    zstr_free(&port);
    return a;
}

static void s_agent_stop(s_agent_t **a)
{
    zsock_destroy(&(*a)->client);
    zactor_destroy(&(*a)->actor);
    free(*a);
    *a = NULL;
}

/* OBSERVE iterations FROM..TO-1 of a run whose loss falls; the status of the last reply. */
static mq_status_msg_t s_agent_feed(s_agent_t *a, uint64_t from, uint64_t to)
{
    mq_msg_t *m = calloc(1, sizeof *m);
    cr_assert(m);
    mq_status_msg_t st = {0};
    for (uint64_t i = from; i < to; i++) {
        mq_msg_init(m, MQ_MSG_OBSERVE);
        m->iter = i;
        m->observe = (mq_obs_msg_t){.loss = 2.0 / (1 + 0.05 * (double)i),
                                .iter_ms = 100,
                                .progress = (double)i / 40.0,
                                .bits = 2};
        cr_assert_eq(mq_wire_send(a->client, m, NULL, 0), 0);
        mq_drop_t drop;
        cr_assert_eq(mq_wire_recv(a->client, m, &drop), 0, "no decision for %lu",
                     (unsigned long)i);
        cr_assert_eq(m->type, MQ_MSG_DECISION);
        st = m->decision;
        mq_msg_reset(m);
    }
    free(m);
    return st;
}

static void s_agent_load(const char *state, mq_policy_t **cur, mq_policy_t **stash)
{
    mq_agent_counters_t c;
    cr_assert_eq(mq_agent_state_load(state, cur, stash, &c), 0, "%s", mq_err_last());
}

/* Iteration 0 after others: the learned policy starts a new episode (no new policy, no
 * PATH.run-* file), its return saved; then --policy learned:epsilon=0 takes over the table
 * and keeps the trained policy aside. */
Test(rl_learned, agent_starts_episodes_and_deploys_the_table, .timeout = 30)
{
    char dir[64] = "/tmp/mqgrad-learned-test-XXXXXX", state[128], pattern[160];
    cr_assert(mkdtemp(dir));
    snprintf(state, sizeof state, "%s/agent.state", dir);
    s_agent_t *a = s_agent("learned:every=0", state);
    mq_status_msg_t st = s_agent_feed(a, 0, 40);
    cr_expect_eq(st.step, 8);
    st = s_agent_feed(a, 0, 10); /* a new run */
    cr_expect_eq(st.step, 2, "the episode's own steps");
    cr_expect_eq(st.iter, 9);
    cr_expect_eq(st.observations, 50, "the agent counts every observation");
    s_agent_stop(&a);
    snprintf(pattern, sizeof pattern, "%s.run-*", state);
    glob_t g;
    cr_expect_eq(glob(pattern, 0, NULL, &g), GLOB_NOMATCH, "a new episode is not a new run");
    globfree(&g);

    mq_policy_t *cur = NULL, *stash = NULL;
    s_agent_load(state, &cur, &stash);
    cr_expect_str_eq(cur->spec, "learned:every=0");
    const double *r;
    cr_assert_eq(mq_policy_returns(cur, &r), 1, "the first episode's return was saved");
    /* smoothed from 2 at 0.1 per iteration toward 2 / (1 + 0.05 i): S_39 well below 2 */
    cr_expect(r[0] > 20 && r[0] < 100, "return %g", r[0]);
    size_t ncells = (size_t)s_ln(cur)->nstates * MQ_RL_LEARNED_ACTIONS;
    double *trained = malloc(ncells * sizeof(double));
    memcpy(trained, s_ln(cur)->q, ncells * sizeof(double));
    mq_policy_destroy(&cur);
    mq_policy_destroy(&stash);

    a = s_agent("learned:every=0,epsilon=0", state);
    s_agent_stop(&a);
    s_agent_load(state, &cur, &stash);
    cr_expect_str_eq(cur->spec, "learned:every=0,epsilon=0");
    cr_expect_eq(memcmp(s_ln(cur)->q, trained, ncells * sizeof(double)), 0,
                 "the deployed spec took the trained table");
    cr_expect_eq(s_ln(cur)->episodes, 1);
    cr_assert_not_null(stash, "the trained policy is kept aside");
    cr_expect_str_eq(stash->spec, "learned:every=0");
    mq_policy_destroy(&cur);
    mq_policy_destroy(&stash);
    free(trained);
    unlink(state);
    rmdir(dir);
}
