/* The common part of every policy: spec strings and the common options, the window of T
 * observations with the smoothing of equation (1) and the reward of equation (2), the
 * history, and the calls into the policy's operations table (rl_internal.h) at each
 * observation and each window's close. The policies are the p_*.c files. */
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
    return 1;
}

/* "mqgrad, fixed:K, adaptive, schedule or dqsgd": the registry's short forms, for errors. */
static void s_expected(char *buf, size_t len)
{
    char names[256];
    mq_policy_names(names, sizeof names, ", ");
    char *last = strrchr(names, ',');
    if (last)
        snprintf(buf, len, "%.*s or%s", (int)(last - names), names, last + 1);
    else
        snprintf(buf, len, "%s", names);
}

/* One spec parameter (INDEX-th, KEY=VAL or a bare KEY with VAL NULL): the policy's own
 * first, then the common ones into O. */
static int s_param(mq_policy_t *p, mq_policy_opts_t *o, const char *spec, int index,
                   const char *key, const char *val)
{
    const mq_policy_ops_t *ops = p->ops;
    int rc = ops->option ? ops->option(p, index, key, val) : 1;
    if (rc <= 0)
        return rc;
    if (!val) {
        mq_err_set("policy spec '%s': '%s' is not key=value", spec, key);
        return -1;
    }
    rc = s_set_param(o, key, val);
    if (rc <= 0)
        return rc;
    if (ops->keys)
        mq_err_set("unknown policy parameter '%s' (%s takes %s, and T, alpha, epsilon, eta, "
                   "discount, gamma, min, max, start, hidden, tau, seed or literal_eq3)",
                   key, ops->name, ops->keys);
    else
        mq_err_set("unknown policy parameter '%s' (expected T, alpha, epsilon, eta, discount, "
                   "gamma, min, max, start, hidden, tau, seed or literal_eq3)",
                   key);
    return -1;
}

/* The spec's parameters, ARGS (a writable copy of what follows the ':', or NULL): own
 * options into P, common ones into O. */
static int s_parse_params(mq_policy_t *p, mq_policy_opts_t *o, const char *spec, char *args)
{
    int index = 0;
    char *save = NULL;
    for (char *tok = args ? strtok_r(args, ",", &save) : NULL; tok;
         tok = strtok_r(NULL, ",", &save), index++) {
        char *eq = strchr(tok, '=');
        if (eq)
            *eq = '\0';
        if (s_param(p, o, spec, index, tok, eq ? eq + 1 : NULL) != 0)
            return -1;
    }
    return 0;
}

/* Finds SPEC's policy and copies SPEC into BUF, cut at the ':' (*ARGS: what follows it). */
static const mq_policy_ops_t *s_lookup(const char *spec, char *buf, size_t len, char **args)
{
    char expected[256];
    s_expected(expected, sizeof expected);
    if (!spec || !*spec) {
        mq_err_set("empty policy spec (expected %s)", expected);
        return NULL;
    }
    if (strlen(spec) >= len) {
        mq_err_set("policy spec '%.20s...' is too long (at most %zu characters)", spec, len - 1);
        return NULL;
    }
    strcpy(buf, spec);
    *args = strchr(buf, ':');
    if (*args)
        *(*args)++ = '\0';
    const mq_policy_ops_t *ops = mq_rl_policy_by_name(buf);
    if (!ops)
        mq_err_set("unknown policy '%s' in spec '%s' (expected %s)", buf, spec, expected);
    return ops;
}

/* Contract: see rl_internal.h. The policy's own data is allocated before the options are
 * parsed, so that an option hook may write into P->priv; the window's buffer after them (its
 * size is T). */
mq_policy_t *mq_rl_build(const char *spec, const mq_policy_opts_t *opts, bool saved)
{
    char buf[MQ_RL_MAX_SPEC], *args;
    const mq_policy_ops_t *ops = s_lookup(spec, buf, sizeof buf, &args);
    if (!ops)
        return NULL;
    mq_policy_t *p = calloc(1, sizeof *p);
    if (!p || (ops->size && !(p->priv = calloc(1, ops->size)))) {
        free(p);
        mq_err_set("out of memory for a policy");
        return NULL;
    }
    p->ops = ops;
    p->o = *opts;
    p->last_reward = NAN;
    snprintf(p->spec, sizeof p->spec, "%s", spec);
    mq_policy_opts_t scratch = *opts; /* a restore's options are final: overrides go here */
    if (s_parse_params(p, saved ? &scratch : &p->o, spec, args) != 0 ||
        mq_rl_validate_opts(&p->o) != 0)
        goto err;
    mq_rng_seed(&p->rng, p->o.seed);
    p->bits = p->o.start_bits;
    p->win.lbar = calloc((size_t)p->o.T, sizeof(double));
    if (!p->win.lbar) {
        mq_err_set("out of memory for a policy");
        goto err;
    }
    if (ops->init && ops->init(p) != 0)
        goto err;
    p->first_bits = p->bits;
    return p;
err:
    mq_policy_destroy(&p);
    return NULL;
}

/* Contract: SPEC names the policy (see rl.h), OPTS gives the options (NULL: defaults);
 * spec parameters override OPTS. Returns an owned policy whose first window runs at the
 * width its init chose (start_bits for mqgrad, adaptive and dqsgd, K for fixed, min_bits
 * for schedule); NULL with a message naming the bad spec part or option. */
mq_policy_t *mq_policy_new(const char *spec, const mq_policy_opts_t *opts)
{
    mq_policy_opts_t o;
    if (opts)
        o = *opts;
    else
        mq_policy_opts_default(&o);
    return mq_rl_build(spec, &o, false);
}

/* Contract: frees *SELF_P and sets it to NULL; safe on NULL and twice. */
void mq_policy_destroy(mq_policy_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_policy_t *p = *self_p;
    if (p->ops && p->ops->fini && p->priv)
        p->ops->fini(p);
    free(p->priv);
    free(p->win.lbar);
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

/* The window's smoothed losses divided by the run's first smoothed loss (mqgrad's network
 * input: the paper is silent; this keeps the inputs near 1 whatever the loss's units and
 * tells the net how far training has come, which is what should drive the bits). */
void mq_rl_features(mq_policy_t *p, double *x)
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
 * equation (2) over it (c = the timed iterations' sum scaled to T iterations), asks the
 * policy for the next bits and records the step. OBS is the observation that triggered the
 * close. */
static int s_close_window(mq_policy_t *p, const mq_observation_t *obs)
{
    mq_rl_window_t *w = &p->win;
    const mq_policy_opts_t *o = &p->o;
    s_fill_to(p, o->T, p->have_carry ? p->carry : 0.0);
    w->open = false;
    double c = w->time_n ? w->time_ms * (double)o->T / (double)w->time_n : 0;
    double r = mq_rl_reward(mq_rl_slope(w->lbar, o->T), o->gamma, c);
    mq_decision_t d = {.step = p->step, .iter = obs->iter, .reward = r};
    if (p->ops->decide && p->ops->decide(p, obs, r, &d) != 0)
        return -1;
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
        mq_warn("rl: %s decision failed: %s", p->ops->name, mq_err_last());
    if (!p->win.open) {
        mq_rl_window_t *w = &p->win;
        *w = (mq_rl_window_t){.open = true, .index = wi, .lbar = w->lbar};
    }
    s_window_add(p, obs, pos);
    p->last_iter = obs->iter;
    p->observations++;
    if (p->ops->observe && p->ops->observe(p, obs) != 0)
        mq_warn("rl: %s decision failed: %s", p->ops->name, mq_err_last());
    if (pos == p->o.T - 1 && s_close_window(p, obs) != 0)
        mq_warn("rl: %s decision failed: %s", p->ops->name, mq_err_last());
    return p->bits;
}

/* Contract: fills ST from P (never fails). q_values: NaN unless the policy has a
 * Q-function (mqgrad: its outputs for s_t, one per width min..max, after the first
 * decision); detail: the policy's own line, "" if it has none. */
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
    if (p->ops->status)
        p->ops->status(p, st);
}

/* Contract: *OUT points into P (valid until the next observe/destroy); returns the count. */
size_t mq_policy_history(const mq_policy_t *p, const mq_decision_t **out)
{
    *out = p->hist;
    return p->nhist;
}

/* Contract: see rl.h. The common reset comes first, so the policy's hook sees the new
 * episode's bits and counters and its own data still as the last episode left them. */
int mq_policy_new_episode(mq_policy_t *p)
{
    if (!p) {
        mq_err_set("mq_policy_new_episode: NULL policy");
        return -1;
    }
    mq_rl_window_t *w = &p->win;
    memset(w->lbar, 0, (size_t)p->o.T * sizeof(double));
    *w = (mq_rl_window_t){.lbar = w->lbar};
    p->have_carry = p->have_scale = false;
    p->carry = p->scale = 0;
    p->last_iter = p->observations = p->step = 0;
    p->last_reward = NAN;
    p->nhist = 0;
    p->bits = p->first_bits;
    return p->ops->episode ? p->ops->episode(p) : 0;
}

/* Contract: see rl.h. */
bool mq_policy_episodic(const mq_policy_t *p)
{
    return p && p->ops->episodic;
}

/* Contract: see rl.h. */
size_t mq_policy_returns(const mq_policy_t *p, const double **out)
{
    *out = NULL;
    return p && p->ops->returns ? p->ops->returns(p, out) : 0;
}

/* Contract: see rl.h. */
int mq_policy_adopt(mq_policy_t *p, const mq_policy_t *from)
{
    if (!p || !from) {
        mq_err_set("mq_policy_adopt: NULL policy");
        return -1;
    }
    if (p->ops != from->ops) {
        mq_err_set("policy %s cannot take over what %s learned", p->spec, from->spec);
        return -1;
    }
    if (!p->ops->adopt) {
        mq_err_set("policy %s learns nothing across runs to take over", p->ops->name);
        return -1;
    }
    return p->ops->adopt(p, from);
}
