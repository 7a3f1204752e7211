/* The policy interface: spec strings and options, the window of T observations with the
 * smoothing of equation (1), and the dispatch of each window's close to the policy that
 * decides the next bits. The learning itself is in sarsa.c, the baselines in baselines.c. */
#include "rl_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* adaptive's tau: the quantization noise may add at most 5% to mean(g^2) (a 13 dB
 * signal-to-noise ratio). With range/rms = r the rule picks K = ceil(log2(r / sqrt(12 tau)
 * + 1)): a Gaussian gradient of 7M values (range about 11 rms) gets 4 bits, a heavy-tailed
 * one (range about 50 rms) 7 bits, so the rule spans the paper's 2..8 range. */
#define MQ_RL_DEFAULT_TAU 0.05

void mq_policy_opts_default(mq_policy_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->T = 5;
    o->alpha = 0.01;
    o->epsilon = 0.1;
    o->eta = 0.1;
    o->discount = 0.9;
    o->gamma = 300;
    o->min_bits = 2;
    o->max_bits = 8;
    o->start_bits = 2;
    o->hidden = 10;
    o->tau = MQ_RL_DEFAULT_TAU;
    o->seed = 1;
    o->literal_eq3 = false;
}

int mq_rl_validate_opts(const mq_policy_opts_t *o)
{
    if (o->T < 2 || o->T > MQ_RL_MAX_T)
        mq_err_set("policy option T (iterations per MDP step) must be in 2..%d, got %d",
                   MQ_RL_MAX_T, o->T);
    else if (!(o->alpha > 0 && o->alpha <= 1))
        mq_err_set("policy option alpha (loss smoothing) must be in (0, 1], got %g", o->alpha);
    else if (!(o->epsilon >= 0 && o->epsilon <= 1))
        mq_err_set("policy option epsilon must be in [0, 1], got %g", o->epsilon);
    else if (!(o->eta > 0 && isfinite(o->eta)))
        mq_err_set("policy option eta (SARSA learning rate) must be > 0, got %g", o->eta);
    else if (!(o->discount >= 0 && o->discount <= 1))
        mq_err_set("policy option discount must be in [0, 1], got %g", o->discount);
    else if (!(o->gamma > 0 && isfinite(o->gamma)))
        mq_err_set("policy option gamma (reward scale) must be > 0, got %g", o->gamma);
    else if (o->min_bits < 1 || o->min_bits > 8 || o->max_bits < 1 || o->max_bits > 8)
        mq_err_set("policy bit range %d..%d must lie within 1..8", o->min_bits, o->max_bits);
    else if (o->min_bits > o->max_bits)
        mq_err_set("policy min bits %d is above max bits %d", o->min_bits, o->max_bits);
    else if (o->start_bits < o->min_bits || o->start_bits > o->max_bits)
        mq_err_set("policy start bits %d is outside the range %d..%d", o->start_bits, o->min_bits,
                   o->max_bits);
    else if (o->hidden < 1 || o->hidden > MQ_RL_MAX_HIDDEN)
        mq_err_set("policy option hidden (Q-network width) must be in 1..%d, got %d",
                   MQ_RL_MAX_HIDDEN, o->hidden);
    else if (!(o->tau > 0 && isfinite(o->tau)))
        mq_err_set("policy option tau (adaptive noise threshold) must be > 0, got %g", o->tau);
    else
        return 0;
    return -1;
}

/* One "key=value" of a spec's parameter list into O. */
static int s_set_param(mq_policy_opts_t *o, const char *key, const char *val)
{
    long l;
    double *d = NULL;
    int *i = NULL;
    long lo = 0, hi = 0;
    if (strcmp(key, "alpha") == 0)
        d = &o->alpha;
    else if (strcmp(key, "epsilon") == 0)
        d = &o->epsilon;
    else if (strcmp(key, "eta") == 0)
        d = &o->eta;
    else if (strcmp(key, "discount") == 0)
        d = &o->discount;
    else if (strcmp(key, "gamma") == 0)
        d = &o->gamma;
    else if (strcmp(key, "tau") == 0)
        d = &o->tau;
    else if (strcmp(key, "T") == 0)
        i = &o->T, lo = 2, hi = MQ_RL_MAX_T;
    else if (strcmp(key, "min") == 0)
        i = &o->min_bits, lo = 1, hi = 8;
    else if (strcmp(key, "max") == 0)
        i = &o->max_bits, lo = 1, hi = 8;
    else if (strcmp(key, "start") == 0)
        i = &o->start_bits, lo = 1, hi = 8;
    else if (strcmp(key, "hidden") == 0)
        i = &o->hidden, lo = 1, hi = MQ_RL_MAX_HIDDEN;
    if (d)
        return mq_parse_double(key, val, -1e300, 1e300, d);
    if (i) {
        if (mq_parse_long(key, val, lo, hi, &l) != 0)
            return -1;
        *i = (int)l;
        return 0;
    }
    if (strcmp(key, "seed") == 0 || strcmp(key, "literal_eq3") == 0) {
        char *end;
        errno = 0;
        unsigned long long u = strtoull(val, &end, 10);
        if (!*val || *end || errno || val[0] == '-' || (key[0] == 'l' && u > 1)) {
            mq_err_set("%s: '%s' is not %s", key, val,
                       key[0] == 's' ? "an unsigned integer" : "0 or 1");
            return -1;
        }
        if (key[0] == 's')
            o->seed = (uint64_t)u;
        else
            o->literal_eq3 = u != 0;
        return 0;
    }
    mq_err_set("unknown policy parameter '%s' (expected T, alpha, epsilon, eta, discount, "
               "gamma, min, max, start, hidden, tau, seed or literal_eq3)",
               key);
    return -1;
}

/* Splits "name[:args]" into a kind, fixed's K and overridden options. */
static int s_parse_spec(const char *spec, mq_policy_kind_t *kind, int *fixed, mq_policy_opts_t *o)
{
    char buf[64];
    if (!spec || !*spec) {
        mq_err_set("empty policy spec (expected mqgrad, fixed:K, adaptive or schedule)");
        return -1;
    }
    if (strlen(spec) >= sizeof buf) {
        mq_err_set("policy spec '%.20s...' is too long (at most 63 characters)", spec);
        return -1;
    }
    strcpy(buf, spec);
    char *args = strchr(buf, ':');
    if (args)
        *args++ = '\0';
    if (strcmp(buf, "mqgrad") == 0)
        *kind = MQ_POLICY_MQGRAD;
    else if (strcmp(buf, "fixed") == 0)
        *kind = MQ_POLICY_FIXED;
    else if (strcmp(buf, "adaptive") == 0)
        *kind = MQ_POLICY_ADAPTIVE;
    else if (strcmp(buf, "schedule") == 0)
        *kind = MQ_POLICY_SCHEDULE;
    else {
        mq_err_set("unknown policy '%s' in spec '%s' (expected mqgrad, fixed:K, adaptive or "
                   "schedule)",
                   buf, spec);
        return -1;
    }
    if (*kind == MQ_POLICY_FIXED && (!args || !*args)) {
        mq_err_set("policy 'fixed' needs a bit width: fixed:K with K in 1..8");
        return -1;
    }
    bool first = true;
    for (char *tok = args ? strtok(args, ",") : NULL; tok; tok = strtok(NULL, ","), first = false) {
        char *eq = strchr(tok, '=');
        if (*kind == MQ_POLICY_FIXED && first && !eq) {
            long k;
            if (mq_parse_long("fixed:K bit width", tok, 1, 8, &k) != 0)
                return -1;
            *fixed = (int)k;
            continue;
        }
        if (!eq) {
            mq_err_set("policy spec '%s': '%s' is not key=value", spec, tok);
            return -1;
        }
        *eq = '\0';
        if (s_set_param(o, tok, eq + 1) != 0)
            return -1;
    }
    return 0;
}

mq_policy_t *mq_rl_alloc(mq_policy_kind_t kind, const mq_policy_opts_t *o)
{
    mq_policy_t *p = calloc(1, sizeof *p);
    if (!p)
        goto err;
    p->kind = kind;
    p->o = *o;
    p->last_reward = NAN;
    mq_rng_seed(&p->rng, o->seed);
    p->win.lbar = calloc((size_t)o->T, sizeof(double));
    if (!p->win.lbar)
        goto err;
    if (kind == MQ_POLICY_MQGRAD) {
        p->x = calloc((size_t)o->T, sizeof(double));
        if (!p->x || mq_rl_qnet_alloc(&p->net, o->T, o->hidden, o->max_bits - o->min_bits + 1) != 0)
            goto err;
    }
    return p;
err:
    mq_policy_destroy(&p);
    mq_err_set("out of memory for a policy");
    return NULL;
}

/* Contract: SPEC names the policy (see rl.h), OPTS gives the options (NULL: defaults);
 * spec parameters override OPTS. Returns an owned policy whose first window runs at
 * start_bits (mqgrad, adaptive), K (fixed) or min_bits (schedule); NULL with a message
 * naming the bad spec part or option. */
mq_policy_t *mq_policy_new(const char *spec, const mq_policy_opts_t *opts)
{
    mq_policy_opts_t o;
    if (opts)
        o = *opts;
    else
        mq_policy_opts_default(&o);
    mq_policy_kind_t kind;
    int fixed = 0;
    if (s_parse_spec(spec, &kind, &fixed, &o) != 0 || mq_rl_validate_opts(&o) != 0)
        return NULL;
    mq_policy_t *p = mq_rl_alloc(kind, &o);
    if (!p)
        return NULL;
    snprintf(p->spec, sizeof p->spec, "%s", spec);
    p->fixed_bits = fixed;
    if (kind == MQ_POLICY_MQGRAD)
        mq_rl_qnet_init(&p->net, &p->rng);
    p->bits = kind == MQ_POLICY_FIXED      ? fixed
              : kind == MQ_POLICY_SCHEDULE ? o.min_bits
                                           : o.start_bits;
    return p;
}

/* Contract: frees *SELF_P and sets it to NULL; safe on NULL and twice. */
void mq_policy_destroy(mq_policy_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_policy_t *p = *self_p;
    free(p->win.lbar);
    free(p->x);
    mq_rl_qnet_free(&p->net);
    free(p->hist);
    free(p);
    *self_p = NULL;
}

int mq_rl_history_push(mq_policy_t *p, const mq_decision_t *d)
{
    if (p->nhist == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        mq_decision_t *h = realloc(p->hist, cap * sizeof *h);
        if (!h) {
            mq_err_set("out of memory for the decision history (%zu entries)", cap);
            return -1;
        }
        p->hist = h;
        p->cap = cap;
    }
    p->hist[p->nhist++] = *d;
    return 0;
}

/* Fills window positions filled..upto-1 with the held smoothed loss (nothing is known of
 * the losses of missed iterations, so the smoothed series stays flat across them). */
static void s_fill_to(mq_policy_t *p, int upto, double value)
{
    while (p->win.filled < upto)
        p->win.lbar[p->win.filled++] = value;
}

/* Adds OBS at position POS of the open window: equation (1) continues from the carry (the
 * previous smoothed value, across windows); the very first loss of the run seeds the carry,
 * so its smoothed value is the loss itself. A non-finite loss holds the smoothed value. */
static void s_window_add(mq_policy_t *p, const mq_observation_t *obs, int pos)
{
    mq_rl_window_t *w = &p->win;
    if (isfinite(obs->loss)) {
        if (!p->have_carry) {
            p->carry = obs->loss;
            p->have_carry = true;
        }
        s_fill_to(p, pos, p->carry);
        p->carry = p->o.alpha * obs->loss + (1 - p->o.alpha) * p->carry;
        w->lbar[w->filled++] = p->carry;
    } else if (p->have_carry) {
        s_fill_to(p, pos + 1, p->carry);
    }
    w->count++;
    if (isfinite(obs->iter_ms) && obs->iter_ms >= 0) {
        w->time_ms += obs->iter_ms;
        w->time_n++;
    }
    if (isfinite(obs->grad_range) && obs->grad_range >= 0) {
        w->range_sum += obs->grad_range;
        w->range_n++;
    }
    if (isfinite(obs->grad_sqmean) && obs->grad_sqmean >= 0) {
        w->sq_sum += obs->grad_sqmean;
        w->sq_n++;
    }
}

/* The network's input: the window's smoothed losses divided by the run's first smoothed
 * loss (the paper is silent; this keeps the inputs near 1 whatever the loss's units and
 * tells the net how far training has come, which is what should drive the bits). */
static void s_features(mq_policy_t *p, double *x)
{
    if (!p->have_scale && p->have_carry) {
        double s = fabs(p->win.lbar[0]);
        p->scale = s > 1e-12 && isfinite(s) ? s : 1.0;
        p->have_scale = true;
    }
    double s = p->have_scale ? p->scale : 1.0;
    for (int i = 0; i < p->o.T; i++)
        x[i] = p->win.lbar[i] / s;
}

/* Closes the open window: completes the smoothed series, computes the reward of
 * equation (2) over it (c = the timed iterations' sum scaled to T iterations) and asks
 * the policy for the next bits. OBS is the observation that triggered the close. */
static int s_close_window(mq_policy_t *p, const mq_observation_t *obs)
{
    mq_rl_window_t *w = &p->win;
    const mq_policy_opts_t *o = &p->o;
    s_fill_to(p, o->T, p->have_carry ? p->carry : 0.0);
    w->open = false;
    double c = w->time_n ? w->time_ms * (double)o->T / (double)w->time_n : 0;
    double r = mq_rl_reward(mq_rl_slope(w->lbar, o->T), o->gamma, c);
    int before = p->bits;
    mq_decision_t d = {.step = p->step, .iter = obs->iter, .reward = r};
    if (p->kind == MQ_POLICY_MQGRAD) {
        double x[MQ_RL_MAX_T];
        s_features(p, x);
        if (mq_rl_mqgrad_decide(p, x, r) != 0)
            return -1;
        d.action = p->action;
    } else {
        if (p->kind == MQ_POLICY_ADAPTIVE && w->range_n > 0 && w->sq_n > 0)
            p->bits =
                mq_rl_adaptive_bits(o, w->range_sum / w->range_n, w->sq_sum / w->sq_n, p->bits);
        else if (p->kind == MQ_POLICY_SCHEDULE)
            p->bits = mq_rl_schedule_bits(o, obs);
        d.action = p->bits - before;
    }
    d.bits = p->bits;
    p->last_reward = r;
    p->step++;
    return mq_rl_history_push(p, &d);
}

/* Contract: see rl.h. Window w holds iterations w*T .. w*T+T-1 and closes with its last
 * one. A missed iteration inside a window leaves the smoothed loss flat over it; if the
 * closing iteration itself is missed, the window closes when the first observation of a
 * later window arrives (so a decision is late, never lost); a window with no observation
 * makes no decision (steps count decisions, so t may fall behind floor(m/T)). */
int mq_policy_observe(mq_policy_t *p, const mq_observation_t *obs)
{
    if (!p || !obs) {
        mq_err_set("mq_policy_observe: NULL %s", p ? "observation" : "policy");
        return -1;
    }
    if (p->observations > 0 && obs->iter <= p->last_iter)
        return p->bits;
    uint64_t T = (uint64_t)p->o.T, wi = obs->iter / T;
    int pos = (int)(obs->iter % T);
    if (p->win.open && p->win.index != wi && s_close_window(p, obs) != 0)
        mq_warn("rl: decision failed: %s", mq_err_last());
    if (!p->win.open) {
        mq_rl_window_t *w = &p->win;
        *w = (mq_rl_window_t){.open = true, .index = wi, .lbar = w->lbar};
    }
    s_window_add(p, obs, pos);
    p->last_iter = obs->iter;
    p->observations++;
    if (pos == p->o.T - 1 && s_close_window(p, obs) != 0)
        mq_warn("rl: decision failed: %s", mq_err_last());
    return p->bits;
}

/* Contract: fills ST from P (never fails). q_values: the Q-network's outputs for the
 * current state s_t, one per width min..max, NaN before the first decision and for the
 * policies that have no Q-function. */
void mq_policy_status(const mq_policy_t *p, mq_policy_status_t *st)
{
    memset(st, 0, sizeof *st);
    snprintf(st->spec, sizeof st->spec, "%s", p->spec);
    st->bits = p->bits;
    st->step = p->step;
    st->iter = p->last_iter;
    st->observations = p->observations;
    st->last_reward = p->last_reward;
    st->nq = p->o.max_bits - p->o.min_bits + 1;
    for (int j = 0; j < st->nq; j++)
        st->q_values[j] = NAN;
    if (p->kind == MQ_POLICY_MQGRAD && p->have_state)
        mq_rl_qnet_forward(&p->net, p->x, NULL, st->q_values);
}

/* Contract: *OUT points into P (valid until the next observe/destroy); returns the count. */
size_t mq_policy_history(const mq_policy_t *p, const mq_decision_t **out)
{
    *out = p->hist;
    return p->nhist;
}
