/* The learned policy: a small tabular Q-learning controller of the bits that learns across
 * training runs. Its table lives in the saved state, so it is trained over many short runs
 * (episodes, mq_policy_new_episode) and then deployed greedy (epsilon=0 or frozen) or with
 * little exploration. Beside the paper-exact mqgrad (bits only go up, one run), not instead.
 *
 *  - Decisions at a fixed amount of training time: every `every=` seconds (5) of the
 *    iterations' own times (obs->iter_ms; a simulated clock's milliseconds work the same),
 *    and at the first loss of each episode. With `every=0`, or when no observation of an
 *    interval carried a time (a positive, finite iter_ms), every T observations instead.
 *    A fixed time per decision makes the return of a run with a time budget its loss
 *    decrease within the budget, which is the objective: the lowest loss at the deadline.
 *  - Reward of an interval: gain * (S_before - S_after) / S_0, where S is the loss smoothed
 *    per iteration as equation (1) with its own `smooth=` (0.1: the paper's 0.01 lags about
 *    100 iterations, several decisions), S_0 the episode's first smoothed loss (its first
 *    loss), so rewards are scale-free, and gain=100 (percent of the first loss). The
 *    episode's last, partial interval is rewarded when the episode closes, so the return
 *    (sum of rewards) is exactly gain * (S_0 - S_end) / S_0.
 *  - Actions: bits -1, keep, +1 within min..max (the common options; min=1 allowed); a move
 *    past the range is not offered.
 *  - State: the current bits; the run's progress (obs->progress, else (iter+1)/total_iters,
 *    else 0) in `progress=` (4) equal buckets; the trend of the last interval, loss risen or
 *    not (`trend=0` drops it); the mean relative quantization error
 *    | |Q(g)| - |g| | / |g| of the last interval (obs->sent_norm against obs->grad_norm) in
 *    three buckets, below 1 %, below 10 %, above (`qerr=0` drops it). Uniform quantization
 *    of a Gaussian bucket adds about 3/(2^B - 1)^2 to the energy: about 15 % at 2 bits, 3 %
 *    at 3, under 1 % from 4, so the buckets tell a coarse code from a fine one whatever the
 *    width is called, and move when the gradient's shape does; the price of the bits, the
 *    share of the last interval's training time spent from the push to the last aggregate
 *    applied (obs->comm_ms against obs->iter_ms), in three buckets, below 1/3, below 2/3,
 *    above (`price=0` drops it). With the bits it was measured at, the share tells a link on
 *    which a bit costs next to nothing from one on which it costs most of the iteration, and
 *    it moves when the link does (a link schedule, `--link`). At most 8 * 10 * 2 * 3 * 3
 *    states.
 *  - Learning: Q-learning (off-policy, so the greedy policy deployed is the one learned
 *    while exploring): Q(s,a) += lr [r + discount max_a' Q(s',a') - Q(s,a)], with
 *    lr = max(eta, 1/n(s,a)), n the visits: the first visit takes the target whole (no bias
 *    toward the zero start), later ones average until the rate reaches eta (the common
 *    option, 0.1). The episode's last update is terminal (no bootstrap). `discount=` is
 *    learned's own key (0.3), not the common one (0.9, mqgrad's): the state does not hold
 *    the loss, and within a progress bucket the bits a run is at correlate with how far it
 *    has come, so with a long horizon the values of the states an action leads to (reached
 *    with more or less loss left to lose) swamp what the action itself gains. In the
 *    simulated run of tests/test_rl_learned.c, 300 episodes with discount 0.9 end greedy at
 *    a final loss of 0.335, worse than the best fixed width (0.320); 0 to 0.5 end at
 *    0.296-0.297 (the best schedule found there: 0.289).
 *  - Exploration: epsilon-greedy, a uniform valid action with probability
 *    floor + (epsilon - floor) * decay^episodes (episodes closed so far, saved with the
 *    table; decay 0.97, floor min(0.01, epsilon)). Greedy ties keep the bits. epsilon=0, or
 *    the key `frozen`, deploys it: greedy, no updates, and a state no episode visited read
 *    as the nearest visited one of the same bits and progress (s_values); returns are still
 *    recorded.
 *  - Episodes: a new episode (the agent starts one when iteration 0 comes again) closes the
 *    last: its partial interval is rewarded and learned from, its return recorded (the last
 *    1024 are kept and saved), the count raised. The table and visits stay.
 *  - History: as for every policy, one entry per window of T iterations (its action is the
 *    change of bits since the previous entry, its reward equation (2)'s); the decisions
 *    themselves are counted in the status line, whose last reward is learned's own. */
#include "rl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_ACT MQ_RL_LEARNED_ACTIONS
#define S_MAX_PROG 10

/* bits of mq_rl_learned_t.given */
enum {
    S_EVERY = 1u << 0,
    S_SMOOTH = 1u << 1,
    S_GAIN = 1u << 2,
    S_DECAY = 1u << 3,
    S_FLOOR = 1u << 4,
    S_PROG = 1u << 5,
    S_TREND = 1u << 6,
    S_QERR = 1u << 7,
    S_DISC = 1u << 8,
    S_PRICE = 1u << 9,
};

/* ---- options ------------------------------------------------------------------------- */

static int s_option_double(mq_rl_learned_t *m, const char *key, const char *val)
{
    static const struct {
        const char *key, *what;
        unsigned bit;
        double lo, hi;
        bool open_lo; /* the low end excluded */
    } keys[] = {
        {"every", "learned option every (seconds of training per decision; 0 = every T "
                  "iterations)",
         S_EVERY, 0, 1e6, false},
        {"smooth", "learned option smooth (loss smoothing per iteration)", S_SMOOTH, 0, 1, true},
        {"gain", "learned option gain (reward scale)", S_GAIN, 0, 1e9, true},
        {"decay", "learned option decay (epsilon's factor per episode)", S_DECAY, 0, 1, true},
        {"floor", "learned option floor (epsilon's floor)", S_FLOOR, 0, 1, false},
        {"discount", "learned option discount", S_DISC, 0, 1, false},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (strcmp(key, keys[i].key) != 0)
            continue;
        double v;
        if (mq_parse_double(keys[i].what, val, keys[i].lo, keys[i].hi, &v) != 0)
            return -1;
        if (keys[i].open_lo && !(v > keys[i].lo)) {
            mq_err_set("%s must be > %g, got %s", keys[i].what, keys[i].lo, val);
            return -1;
        }
        double *dst[] = {&m->every, &m->smooth, &m->gain, &m->decay, &m->floor, &m->discount};
        *dst[i] = v;
        m->given |= keys[i].bit;
        return 0;
    }
    return 1;
}

static int s_option(mq_policy_t *p, int index, const char *key, const char *val)
{
    mq_rl_learned_t *m = p->priv;
    long v;
    if (strcmp(key, "frozen") == 0) {
        if (val && mq_parse_long("learned option frozen", val, 0, 1, &v) != 0)
            return -1;
        m->frozen = val ? v != 0 : true;
        return 0;
    }
    if (!val)
        return 1;
    if (strcmp(key, "progress") == 0) {
        if (mq_parse_long("learned option progress (buckets of the run's progress)", val, 1,
                          S_MAX_PROG, &v) != 0)
            return -1;
        m->nprog = (int)v;
        m->given |= S_PROG;
        return 0;
    }
    static const struct {
        const char *key, *what;
        unsigned bit;
        int on; /* buckets when on */
    } features[] = {
        {"trend", "learned option trend (the loss trend feature, 0 or 1)", S_TREND, 2},
        {"qerr", "learned option qerr (the quantization error feature, 0 or 1)", S_QERR, 3},
        {"price", "learned option price (the communication share feature, 0 or 1)", S_PRICE,
         3},
    };
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++) {
        if (strcmp(key, features[i].key) != 0)
            continue;
        if (mq_parse_long(features[i].what, val, 0, 1, &v) != 0)
            return -1;
        int *dst[] = {&m->ntrend, &m->nqerr, &m->nprice};
        *dst[i] = v ? features[i].on : 1;
        m->given |= features[i].bit;
        return 0;
    }
    return s_option_double(m, key, val);
}

static int s_alloc_table(mq_rl_learned_t *m)
{
    size_t n = (size_t)m->nstates * S_ACT;
    free(m->q);
    free(m->visits);
    m->q = calloc(n, sizeof *m->q);
    m->visits = calloc(n, sizeof *m->visits);
    if (!m->q || !m->visits) {
        mq_err_set("out of memory for a %d-state table", m->nstates);
        return -1;
    }
    return 0;
}

static int s_states(const mq_policy_t *p, const mq_rl_learned_t *m)
{
    return (p->o.max_bits - p->o.min_bits + 1) * m->nprog * m->ntrend * m->nqerr * m->nprice;
}

/* Clears what belongs to one episode. */
static void s_episode_reset(mq_policy_t *p, mq_rl_learned_t *m)
{
    m->have_loss = false;
    m->sm = m->s0 = m->s_prev = m->ret = 0;
    m->ms = m->qerr_sum = m->comm_ms = m->comm_of = m->progress = 0;
    m->its = m->timed = m->qerr_n = 0;
    m->trend = m->ntrend - 1; /* "not risen" until an interval says otherwise */
    m->qbucket = m->pbucket = 0;
    m->have_sa = false;
    m->s = m->a = 0;
    m->decisions = 0;
    m->last_r = NAN;
    m->recorded = p->bits;
}

static int s_init(mq_policy_t *p)
{
    mq_rl_learned_t *m = p->priv;
    double eps = p->o.epsilon;
    if (!(m->given & S_EVERY))
        m->every = 5;
    if (!(m->given & S_SMOOTH))
        m->smooth = 0.1;
    if (!(m->given & S_GAIN))
        m->gain = 100;
    if (!(m->given & S_DECAY))
        m->decay = 0.97;
    if (!(m->given & S_DISC))
        m->discount = 0.3;
    if (!(m->given & S_PROG))
        m->nprog = 4;
    if (!(m->given & S_TREND))
        m->ntrend = 2;
    if (!(m->given & S_QERR))
        m->nqerr = 3;
    if (!(m->given & S_PRICE))
        m->nprice = 3;
    if (!(m->given & S_FLOOR))
        m->floor = eps < 0.01 ? eps : 0.01;
    else if (m->floor > eps && eps > 0 && !m->frozen) {
        mq_err_set("learned: epsilon's floor %g is above epsilon %g (epsilon decays from "
                   "epsilon down to floor)",
                   m->floor, eps);
        return -1;
    }
    m->nstates = s_states(p, m);
    if (s_alloc_table(m) != 0)
        return -1;
    s_episode_reset(p, m);
    return 0;
}

static void s_fini(mq_policy_t *p)
{
    mq_rl_learned_t *m = p->priv;
    free(m->q);
    free(m->visits);
    m->q = NULL;
    m->visits = NULL;
}

/* ---- the table ------------------------------------------------------------------------ */

double mq_rl_learned_epsilon(const mq_policy_t *p)
{
    const mq_rl_learned_t *m = p->priv;
    double e = p->o.epsilon;
    if (m->frozen || !(e > 0))
        return 0;
    double f = m->floor < e ? m->floor : e;
    return f + (e - f) * pow(m->decay, (double)m->episodes);
}

static bool s_learning(const mq_policy_t *p)
{
    const mq_rl_learned_t *m = p->priv;
    return !m->frozen && p->o.epsilon > 0;
}

/* The width a state was taken at. */
static int s_state_bits(const mq_policy_t *p, const mq_rl_learned_t *m, int s)
{
    return p->o.min_bits + s / (m->nprog * m->ntrend * m->nqerr * m->nprice);
}

/* The actions open at state S: down only above min, up only below max. */
static void s_open(const mq_policy_t *p, const mq_rl_learned_t *m, int s, bool ok[S_ACT])
{
    int b = s_state_bits(p, m, s);
    ok[0] = b > p->o.min_bits;
    ok[1] = true;
    ok[2] = b < p->o.max_bits;
}

/* The best open action at S by the values Q (S's row, or a stand-in's of the same bits);
 * ties keep the bits. */
static int s_best(const mq_policy_t *p, const mq_rl_learned_t *m, int s, const double *q)
{
    bool ok[S_ACT];
    s_open(p, m, s, ok);
    int best = 1;
    for (int a = 0; a < S_ACT; a += 2)
        if (ok[a] && q[a] > q[best])
            best = a;
    return best;
}

/* The best open action at S by its own values: what the learning target bootstraps on. */
static int s_greedy(const mq_policy_t *p, const mq_rl_learned_t *m, int s)
{
    return s_best(p, m, s, m->q + (size_t)s * S_ACT);
}

/* The state of BASE (bits and progress: bits * nprog + progress bucket) with the trend,
 * quantization error and price buckets T, Q, R: the table's one layout. */
static int s_index(const mq_rl_learned_t *m, int base, int t, int q, int r)
{
    return ((base * m->ntrend + t) * m->nqerr + q) * m->nprice + r;
}

static bool s_visited(const mq_rl_learned_t *m, int s)
{
    for (int a = 0; a < S_ACT; a++)
        if (m->visits[(size_t)s * S_ACT + (size_t)a])
            return true;
    return false;
}

/* The values a deployed (frozen) table decides a state S by: S's own, or, for a state no
 * episode ever visited, those of the nearest visited state with the same bits and progress
 * (the fewest bucket steps of trend, quantization error and price between them; the first in
 * table order on a tie). A frozen table meets states its training never did (a link that is
 * fast where training's was slow), and cannot learn them; all-zero values would keep the
 * bits whatever they are, which at 2 bits of the paper-exact codec is a divergence. While
 * learning, an unvisited state is tried instead. */
static const double *s_values(const mq_rl_learned_t *m, int s)
{
    if (s_visited(m, s))
        return m->q + (size_t)s * S_ACT;
    int pr = s % m->nprice, rest = s / m->nprice;
    int qb = rest % m->nqerr;
    rest /= m->nqerr;
    int tr = rest % m->ntrend, base = rest / m->ntrend; /* base: bits and progress */
    int best = s, best_d = 1 << 30;
    for (int t = 0; t < m->ntrend; t++)
        for (int q = 0; q < m->nqerr; q++)
            for (int r = 0; r < m->nprice; r++) {
                int c = s_index(m, base, t, q, r);
                int d = abs(t - tr) + abs(q - qb) + abs(r - pr);
                if (d < best_d && s_visited(m, c))
                    best = c, best_d = d;
            }
    return m->q + (size_t)best * S_ACT;
}

static int s_choose(mq_policy_t *p, const mq_rl_learned_t *m, int s)
{
    double eps = mq_rl_learned_epsilon(p);
    if (eps > 0 && mq_rng_double(&p->rng) < eps) {
        bool ok[S_ACT];
        s_open(p, m, s, ok);
        int pick = (int)mq_rng_below(&p->rng, (uint64_t)(ok[0] + ok[1] + ok[2]));
        for (int a = 0; a < S_ACT; a++)
            if (ok[a] && pick-- == 0)
                return a;
    }
    return s_learning(p) ? s_greedy(p, m, s) : s_best(p, m, s, s_values(m, s));
}

/* Q-learning on the open interval's (s, a) with reward R, toward state S2 (or terminal,
 * S2 < 0). */
static void s_update(mq_policy_t *p, mq_rl_learned_t *m, double r, int s2)
{
    double target = r;
    if (s2 >= 0)
        target += m->discount * m->q[(size_t)s2 * S_ACT + (size_t)s_greedy(p, m, s2)];
    if (!isfinite(target)) {
        mq_warn("rl: learned update skipped: non-finite target (reward %g)", r);
        return;
    }
    size_t k = (size_t)m->s * S_ACT + (size_t)m->a;
    if (m->visits[k] < UINT32_MAX)
        m->visits[k]++;
    double lr = 1.0 / m->visits[k];
    if (lr < p->o.eta)
        lr = p->o.eta < 1 ? p->o.eta : 1;
    m->q[k] += lr * (target - m->q[k]);
    m->updates++;
}

/* ---- observations and decisions ------------------------------------------------------ */

/* The state of now: bits, progress, the closed interval's trend, quantization error and
 * price. */
static int s_state(const mq_policy_t *p, const mq_rl_learned_t *m)
{
    int pb = (int)floor(m->progress * m->nprog);
    pb = pb < 0 ? 0 : pb >= m->nprog ? m->nprog - 1 : pb;
    int b = p->bits - p->o.min_bits;
    return s_index(m, b * m->nprog + pb, m->trend, m->qbucket, m->pbucket);
}

/* The interval just closed: its features, its reward and update, then the next action. */
static int s_decide_now(mq_policy_t *p, mq_rl_learned_t *m)
{
    double r = NAN;
    if (m->have_sa) {
        r = m->gain * (m->s_prev - m->sm) / m->s0;
        if (m->ntrend == 2)
            m->trend = m->sm > m->s_prev ? 0 : 1;
    }
    if (m->nqerr == 3 && m->qerr_n > 0) {
        double e = m->qerr_sum / m->qerr_n;
        m->qbucket = e < 0.01 ? 0 : e < 0.1 ? 1 : 2;
    }
    if (m->nprice == 3 && m->comm_of > 0) {
        double share = m->comm_ms / m->comm_of;
        m->pbucket = share < 1.0 / 3 ? 0 : share < 2.0 / 3 ? 1 : 2;
    }
    int s = s_state(p, m);
    if (m->have_sa) {
        m->ret += r;
        m->last_r = r;
        if (s_learning(p))
            s_update(p, m, r, s);
    }
    int a = s_choose(p, m, s);
    p->bits += a - 1;
    m->s = s;
    m->a = a;
    m->have_sa = true;
    m->s_prev = m->sm;
    m->ms = m->qerr_sum = m->comm_ms = m->comm_of = 0;
    m->its = m->timed = m->qerr_n = 0;
    m->decisions++;
    return 0;
}

static int s_observe(mq_policy_t *p, const mq_observation_t *obs)
{
    mq_rl_learned_t *m = p->priv;
    if (isfinite(obs->loss)) {
        if (!m->have_loss) {
            m->sm = m->s_prev = obs->loss;
            m->s0 = fabs(obs->loss) > 1e-12 ? fabs(obs->loss) : 1.0;
            m->have_loss = true;
        } else {
            m->sm = m->smooth * obs->loss + (1 - m->smooth) * m->sm;
        }
    }
    m->its++;
    if (isfinite(obs->iter_ms) && obs->iter_ms > 0) { /* 0: no time measured */
        m->ms += obs->iter_ms;
        m->timed++;
        if (isfinite(obs->comm_ms) && obs->comm_ms > 0) {
            m->comm_ms += fmin(obs->comm_ms, obs->iter_ms);
            m->comm_of += obs->iter_ms;
        }
    }
    if (isfinite(obs->grad_norm) && obs->grad_norm > 0 && isfinite(obs->sent_norm) &&
        obs->sent_norm >= 0) {
        m->qerr_sum += fabs(obs->sent_norm - obs->grad_norm) / obs->grad_norm;
        m->qerr_n++;
    }
    if (isfinite(obs->progress) && obs->progress > 0)
        m->progress = fmin(obs->progress, 1.0);
    else if (obs->total_iters > 0)
        m->progress = fmin(((double)obs->iter + 1.0) / (double)obs->total_iters, 1.0);
    if (!m->have_loss)
        return 0; /* nothing to measure a reward against yet */
    bool by_iters = m->every == 0 || m->timed == 0;
    if (!m->have_sa || (m->every > 0 && m->ms >= m->every * 1000.0) ||
        (by_iters && m->its >= (uint32_t)p->o.T))
        return s_decide_now(p, m);
    return 0;
}

/* A window's history entry: the change of bits since the previous entry. */
static int s_decide(mq_policy_t *p, const mq_observation_t *obs, double r, mq_decision_t *d)
{
    mq_rl_learned_t *m = p->priv;
    d->action = p->bits - m->recorded;
    m->recorded = p->bits;
    return 0;
}

/* ---- episodes -------------------------------------------------------------------------- */

static void s_push_return(mq_rl_learned_t *m, double ret)
{
    if (m->nret == MQ_RL_MAX_RETURNS) {
        memmove(m->returns, m->returns + 1, (MQ_RL_MAX_RETURNS - 1) * sizeof(double));
        m->nret--;
    }
    m->returns[m->nret++] = ret;
}

/* The last episode's partial interval is its last reward, learned as terminal; an episode
 * that never decided (no finite loss) is not counted. */
static int s_episode(mq_policy_t *p)
{
    mq_rl_learned_t *m = p->priv;
    if (m->have_sa) {
        if (m->its > 0) {
            double r = m->gain * (m->s_prev - m->sm) / m->s0;
            m->ret += r;
            if (s_learning(p))
                s_update(p, m, r, -1);
        }
        s_push_return(m, m->ret);
        m->episodes++;
    }
    s_episode_reset(p, m);
    return 0;
}

static size_t s_returns(const mq_policy_t *p, const double **out)
{
    const mq_rl_learned_t *m = p->priv;
    *out = m->nret ? m->returns : NULL;
    return m->nret;
}

static int s_adopt(mq_policy_t *p, const mq_policy_t *from)
{
    mq_rl_learned_t *m = p->priv;
    const mq_rl_learned_t *f = from->priv;
    if (p->o.min_bits != from->o.min_bits || p->o.max_bits != from->o.max_bits ||
        m->nprog != f->nprog || m->ntrend != f->ntrend || m->nqerr != f->nqerr ||
        m->nprice != f->nprice) {
        mq_err_set("learned: %s's table does not fit %s (bits %d..%d, progress/trend/qerr/"
                   "price buckets %d/%d/%d/%d against bits %d..%d, %d/%d/%d/%d; a table trained "
                   "before the price feature needs price=0)",
                   from->spec, p->spec, from->o.min_bits, from->o.max_bits, f->nprog, f->ntrend,
                   f->nqerr, f->nprice, p->o.min_bits, p->o.max_bits, m->nprog, m->ntrend,
                   m->nqerr, m->nprice);
        return -1;
    }
    size_t n = (size_t)m->nstates * S_ACT;
    memcpy(m->q, f->q, n * sizeof *m->q);
    memcpy(m->visits, f->visits, n * sizeof *m->visits);
    m->episodes = f->episodes;
    m->updates = f->updates;
    m->nret = f->nret;
    memcpy(m->returns, f->returns, f->nret * sizeof(double));
    return 0;
}

/* ---- saved state ----------------------------------------------------------------------- */

/* Resolved own options, the table, the episodes, the open episode. */
static void s_save(const mq_policy_t *p, mq_rl_writer_t *w)
{
    const mq_rl_learned_t *m = p->priv;
    mq_rl_put_f64(w, m->every);
    mq_rl_put_f64(w, m->smooth);
    mq_rl_put_f64(w, m->gain);
    mq_rl_put_f64(w, m->decay);
    mq_rl_put_f64(w, m->floor);
    mq_rl_put_f64(w, m->discount);
    mq_rl_put_u32(w, m->frozen);
    mq_rl_put_i32(w, m->nprog);
    mq_rl_put_i32(w, m->ntrend);
    mq_rl_put_i32(w, m->nqerr);
    mq_rl_put_i32(w, m->nprice);
    size_t n = (size_t)m->nstates * S_ACT;
    mq_rl_put_f64s(w, m->q, n);
    mq_rl_put_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        mq_rl_put_u32(w, m->visits[i]);
    mq_rl_put_u64(w, m->episodes);
    mq_rl_put_u64(w, m->updates);
    mq_rl_put_f64s(w, m->returns, m->nret);
    mq_rl_put_u32(w, m->have_loss);
    mq_rl_put_f64(w, m->sm);
    mq_rl_put_f64(w, m->s0);
    mq_rl_put_f64(w, m->s_prev);
    mq_rl_put_f64(w, m->ret);
    mq_rl_put_f64(w, m->ms);
    mq_rl_put_u32(w, m->its);
    mq_rl_put_u32(w, m->timed);
    mq_rl_put_f64(w, m->qerr_sum);
    mq_rl_put_u32(w, m->qerr_n);
    mq_rl_put_f64(w, m->progress);
    mq_rl_put_i32(w, m->trend);
    mq_rl_put_i32(w, m->qbucket);
    mq_rl_put_u32(w, m->have_sa);
    mq_rl_put_i32(w, m->s);
    mq_rl_put_i32(w, m->a);
    mq_rl_put_u64(w, m->decisions);
    mq_rl_put_f64(w, m->last_r);
    mq_rl_put_i32(w, m->recorded);
    mq_rl_put_f64(w, m->comm_ms);
    mq_rl_put_f64(w, m->comm_of);
    mq_rl_put_i32(w, m->pbucket);
}

/* The own options: the saved ones win over the spec's (a default may have changed since),
 * and the table takes their shape. */
static int s_get_options(mq_policy_t *p, mq_rl_learned_t *m, mq_rl_reader_t *r)
{
    m->every = mq_rl_get_f64(r, "learned options");
    m->smooth = mq_rl_get_f64(r, "learned options");
    m->gain = mq_rl_get_f64(r, "learned options");
    m->decay = mq_rl_get_f64(r, "learned options");
    m->floor = mq_rl_get_f64(r, "learned options");
    m->discount = mq_rl_get_f64(r, "learned options");
    m->frozen = mq_rl_get_u32(r, "learned options") != 0;
    int np = mq_rl_get_i32(r, "learned options"), nt = mq_rl_get_i32(r, "learned options");
    int nq = mq_rl_get_i32(r, "learned options");
    /* before version 3 there was no price feature: one bucket reproduces those tables */
    int npr = r->version >= 3 ? mq_rl_get_i32(r, "learned options") : 1;
    if (r->fail)
        return 0;
    const char *bad = NULL;
    if (!(m->every >= 0 && m->every <= 1e6))
        bad = "every outside 0..1e6 s";
    else if (!(m->smooth > 0 && m->smooth <= 1))
        bad = "smooth outside (0, 1]";
    else if (!(m->gain > 0 && isfinite(m->gain)))
        bad = "gain not a positive number";
    else if (!(m->decay > 0 && m->decay <= 1) || !(m->floor >= 0 && m->floor <= 1))
        bad = "epsilon's decay or floor outside (0, 1]";
    else if (!(m->discount >= 0 && m->discount <= 1))
        bad = "discount outside [0, 1]";
    else if (np < 1 || np > S_MAX_PROG || nt < 1 || nt > 2 || (nq != 1 && nq != 3) ||
             (npr != 1 && npr != 3))
        bad = "feature buckets out of range";
    if (bad) {
        mq_err_set("policy state is inconsistent: learned %s", bad);
        return -1;
    }
    if (np != m->nprog || nt != m->ntrend || nq != m->nqerr || npr != m->nprice) {
        m->nprog = np;
        m->ntrend = nt;
        m->nqerr = nq;
        m->nprice = npr;
        m->nstates = s_states(p, m);
        if (s_alloc_table(m) != 0)
            return -1;
    }
    return 0;
}

static int s_get_table(mq_rl_learned_t *m, mq_rl_reader_t *r)
{
    size_t n = (size_t)m->nstates * S_ACT;
    if (mq_rl_get_f64s(r, m->q, n, "learned table") != 0)
        return -1;
    uint32_t nv = mq_rl_get_u32(r, "learned visits");
    if (!r->fail && nv != n) {
        mq_err_set("policy state is inconsistent: learned visits has %u values, the table %zu",
                   nv, n);
        return -1;
    }
    for (size_t i = 0; i < n && !r->fail; i++)
        m->visits[i] = mq_rl_get_u32(r, "learned visits");
    m->episodes = mq_rl_get_u64(r, "learned episodes");
    m->updates = mq_rl_get_u64(r, "learned episodes");
    uint32_t nr = mq_rl_get_u32(r, "learned returns");
    if (!r->fail && nr > MQ_RL_MAX_RETURNS) {
        mq_err_set("policy state is inconsistent: learned keeps %u returns, at most %d", nr,
                   MQ_RL_MAX_RETURNS);
        return -1;
    }
    m->nret = r->fail ? 0 : nr;
    for (size_t i = 0; i < m->nret; i++)
        m->returns[i] = mq_rl_get_f64(r, "learned returns");
    return 0;
}

static void s_get_episode(mq_rl_learned_t *m, mq_rl_reader_t *r)
{
    const char *what = "learned episode";
    m->have_loss = mq_rl_get_u32(r, what) != 0;
    m->sm = mq_rl_get_f64(r, what);
    m->s0 = mq_rl_get_f64(r, what);
    m->s_prev = mq_rl_get_f64(r, what);
    m->ret = mq_rl_get_f64(r, what);
    m->ms = mq_rl_get_f64(r, what);
    m->its = mq_rl_get_u32(r, what);
    m->timed = mq_rl_get_u32(r, what);
    m->qerr_sum = mq_rl_get_f64(r, what);
    m->qerr_n = mq_rl_get_u32(r, what);
    m->progress = mq_rl_get_f64(r, what);
    m->trend = mq_rl_get_i32(r, what);
    m->qbucket = mq_rl_get_i32(r, what);
    m->have_sa = mq_rl_get_u32(r, what) != 0;
    m->s = mq_rl_get_i32(r, what);
    m->a = mq_rl_get_i32(r, what);
    m->decisions = mq_rl_get_u64(r, what);
    m->last_r = mq_rl_get_f64(r, what);
    m->recorded = mq_rl_get_i32(r, what);
    if (r->version >= 3) {
        m->comm_ms = mq_rl_get_f64(r, what);
        m->comm_of = mq_rl_get_f64(r, what);
        m->pbucket = mq_rl_get_i32(r, what);
    } else {
        m->comm_ms = m->comm_of = 0;
        m->pbucket = 0;
    }
}

static int s_restore(mq_policy_t *p, mq_rl_reader_t *r)
{
    mq_rl_learned_t *m = p->priv;
    if (s_get_options(p, m, r) != 0 || (!r->fail && s_get_table(m, r) != 0))
        return -1;
    s_get_episode(m, r);
    if (r->fail)
        return 0;
    const char *bad = NULL;
    if (m->have_loss && !(m->s0 > 0 && isfinite(m->s0) && isfinite(m->sm)))
        bad = "first smoothed loss not a positive number";
    else if (m->trend < 0 || m->trend >= m->ntrend || m->qbucket < 0 ||
             m->qbucket >= m->nqerr || m->pbucket < 0 || m->pbucket >= m->nprice)
        bad = "features outside their buckets";
    else if (m->have_sa && (m->s < 0 || m->s >= m->nstates || m->a < 0 || m->a >= S_ACT))
        bad = "state or action outside the table";
    else if (m->have_sa && !m->have_loss)
        bad = "a decision without a loss";
    else if (m->timed > m->its || m->qerr_n > m->its)
        bad = "interval statistics counted more often than observations";
    else if (!(m->comm_ms >= 0 && m->comm_ms <= m->comm_of && m->comm_of <= m->ms))
        bad = "communication time outside the interval's time";
    else if (m->recorded < 1 || m->recorded > 8)
        bad = "recorded bits outside 1..8";
    else if (p->bits < p->o.min_bits || p->bits > p->o.max_bits)
        bad = "current bits outside its min..max (the table has no state for them)";
    if (bad) {
        mq_err_set("policy state is inconsistent: learned %s", bad);
        return -1;
    }
    return 0;
}

/* ---- status ------------------------------------------------------------------------------ */

/* The values of the last decision's state, at the width each action leads to; the last
 * reward is learned's own (the window's of equation (2) stays in the history). */
static void s_status(const mq_policy_t *p, mq_policy_status_t *st)
{
    const mq_rl_learned_t *m = p->priv;
    st->last_reward = m->last_r;
    if (m->have_sa) {
        int b = s_state_bits(p, m, m->s);
        for (int a = 0; a < S_ACT; a++) {
            int j = b + a - 1 - p->o.min_bits;
            if (j >= 0 && j < st->nq)
                st->q_values[j] = m->q[(size_t)m->s * S_ACT + (size_t)a];
        }
    }
    snprintf(st->detail, sizeof st->detail,
             "episode %llu eps=%.3g%s decisions=%llu return=%.4g last-return=%.4g "
             "updates=%llu",
             (unsigned long long)m->episodes, mq_rl_learned_epsilon(p),
             s_learning(p) ? "" : " (frozen)", (unsigned long long)m->decisions, m->ret,
             m->nret ? m->returns[m->nret - 1] : NAN, (unsigned long long)m->updates);
}

const mq_policy_ops_t mq_policy_learned_ops = {
    .name = "learned",
    .usage = "learned[:every=S,frozen]",
    .help = "Q-learning of bits -1/keep/+1 every S s (5) of training, across runs",
    .keys = "every, smooth, gain, discount, decay, floor, frozen, progress, trend, qerr, price",
    .size = sizeof(mq_rl_learned_t),
    .option = s_option,
    .init = s_init,
    .fini = s_fini,
    .observe = s_observe,
    .decide = s_decide,
    .save = s_save,
    .restore = s_restore,
    .status = s_status,
    .episode = s_episode,
    .returns = s_returns,
    .adopt = s_adopt,
    .episodic = true,
};
