/* What the rl module's files share and the tests may look into: the policy plug-in interface
 * (mq_policy_ops_t, one table per policy, listed in registry.c), the policy object, the
 * window of observations, the byte writer and reader of saved states, and the small numeric
 * pieces (smoothing, slope, reward, epsilon-greedy, CRC32) exposed so they can be checked
 * against hand computations. */
#ifndef MQGRAD_RL_INTERNAL_H
#define MQGRAD_RL_INTERNAL_H

#include "mqgrad/rl.h"
#include "mqgrad/util.h"

#define MQ_RL_MAX_T 4096
#define MQ_RL_MAX_HIDDEN 256
#define MQ_RL_MAX_SPEC 64

/* ---- saved-state bytes (persist.c): little-endian, fixed width, doubles as IEEE bits ---- */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    bool oom; /* a growth failed: everything after it is dropped, the save fails */
} mq_rl_writer_t;

typedef struct {
    const uint8_t *buf;
    size_t len, pos;
    const char *fail; /* the first field that did not fit (then every get returns 0) */
    uint32_t version; /* of the saved state (persist.c): what a policy's section holds */
} mq_rl_reader_t;

void mq_rl_put(mq_rl_writer_t *w, const void *src, size_t n);
void mq_rl_put_u32(mq_rl_writer_t *w, uint32_t v);
void mq_rl_put_i32(mq_rl_writer_t *w, int v);
void mq_rl_put_u64(mq_rl_writer_t *w, uint64_t v);
void mq_rl_put_f64(mq_rl_writer_t *w, double v);
/* A count, then the values. */
void mq_rl_put_f64s(mq_rl_writer_t *w, const double *v, size_t n);

const uint8_t *mq_rl_take(mq_rl_reader_t *r, size_t n, const char *what);
uint32_t mq_rl_get_u32(mq_rl_reader_t *r, const char *what);
int mq_rl_get_i32(mq_rl_reader_t *r, const char *what);
uint64_t mq_rl_get_u64(mq_rl_reader_t *r, const char *what);
double mq_rl_get_f64(mq_rl_reader_t *r, const char *what);
/* An array whose stored count must be EXPECT: -1 with an error if it is not (a truncation
 * is left in r->fail for the caller). */
int mq_rl_get_f64s(mq_rl_reader_t *r, double *v, size_t expect, const char *what);

/* ---- the plug-in interface --------------------------------------------------------- */

/* One policy. Every hook but the strings may be NULL. The common code (policy.c) owns the
 * spec, the options of mq_policy_opts_t, the window of T observations with its smoothed
 * losses and reward, the decision history and the saved-state framing; a policy adds its
 * own options, its own data (P->priv, SIZE bytes, zeroed) and its decisions.
 *
 * Life of a policy: option (each spec parameter, own first) -> the common options are
 * checked -> init -> for each observation: the window takes it, observe, and when the window
 * closes, decide (one history entry per close) -> fini. A restored policy is built the same
 * way from its saved spec and options, then restore reads what save wrote. A new episode
 * (mq_policy_new_episode, a new training run) resets the common per-run state and calls
 * episode; what a policy learned stays.
 *
 * Adding a policy: a file p_<name>.c defining `const mq_policy_ops_t mq_policy_<name>_ops`
 * and one line in registry.c; the tests of the registry then run it too. */
typedef struct mq_policy_ops {
    const char *name;  /* spec name (also how a saved state names its policy) */
    const char *usage; /* spec syntax, e.g. "fixed:K"; the part before '[' is its short form */
    const char *help;  /* one line: what it does, whose method */
    const char *keys;  /* its own spec keys, named in errors (NULL: only the common ones) */
    size_t size;       /* bytes of P->priv (0: none) */
    /* Takes the INDEX-th spec parameter if it is the policy's own: KEY=VAL, or a bare KEY
     * with VAL NULL. 0 taken, -1 bad value (error set), 1 not its own (the common keys are
     * tried next, so a policy may give a common key its own meaning). */
    int (*option)(mq_policy_t *p, int index, const char *key, const char *val);
    /* After the options, P->o final and valid: checks the policy's own options against
     * them, allocates what P->priv points to, sets P->bits to the first width (without
     * init: start_bits). -1 with an error. */
    int (*init)(mq_policy_t *p);
    /* Frees what init allocated (not P->priv itself). */
    void (*fini)(mq_policy_t *p);
    /* Each new observation, after the window took it and before the window closes: may set
     * P->bits (a policy deciding every iteration). -1 with an error. */
    int (*observe)(mq_policy_t *p, const mq_observation_t *obs);
    /* The window closed (OBS closed it, R is its reward of equation (2)): may set P->bits,
     * and fills D->action (0 when left alone). -1 with an error. */
    int (*decide)(mq_policy_t *p, const mq_observation_t *obs, double r, mq_decision_t *d);
    /* Its own state (and resolved own options) after the common part of a saved state;
     * restore reads exactly that back (the framing checks it) and refuses values the code
     * could not use (-1 with an error). */
    void (*save)(const mq_policy_t *p, mq_rl_writer_t *w);
    int (*restore)(mq_policy_t *p, mq_rl_reader_t *r);
    /* Its part of a status: Q-values, the detail line. */
    void (*status)(const mq_policy_t *p, mq_policy_status_t *st);
    /* mq_policy_new_episode, after the common part was reset (window, smoothing, counters,
     * history, P->bits back to the first width): closes the previous episode and readies the
     * next, keeping what the policy learned. -1 with an error. */
    int (*episode)(mq_policy_t *p);
    /* The returns of the episodes closed so far, oldest first (NULL: none kept). */
    size_t (*returns)(const mq_policy_t *p, const double **out);
    /* P (new, same policy) takes over what FROM learned across episodes; -1 with an error
     * and P unchanged when their options make that impossible. NULL: nothing to take. */
    int (*adopt)(mq_policy_t *p, const mq_policy_t *from);
    /* It learns across runs: the agent starts a new episode, not a new policy, when the
     * iterations start over (mq_policy_episodic). */
    bool episodic;
} mq_policy_ops_t;

/* The registry (registry.c): the policy named NAME, or NULL; all of them, in listing order. */
const mq_policy_ops_t *mq_rl_policy_by_name(const char *name);
const mq_policy_ops_t *const *mq_rl_policies(size_t *n);

/* ---- the policy object ------------------------------------------------------------- */

/* The observations of the current window (iterations index*T .. index*T + T-1). lbar holds
 * the smoothed losses of equation (1) for positions 0..filled-1; positions not yet seen are
 * filled when a later one arrives or the window closes. After a close the values stay until
 * the next window opens, so a test (or a status page) can read them. */
typedef struct {
    bool open;
    uint64_t index;
    int filled;
    uint32_t count;
    double time_ms; /* sum of the time_n finite iteration times */
    uint32_t time_n;
    double range_sum, sq_sum;
    uint32_t range_n, sq_n;
    double *lbar;
} mq_rl_window_t;

struct mq_policy_t {
    const mq_policy_ops_t *ops;
    void *priv; /* the policy's own data, ops->size bytes */
    char spec[MQ_RL_MAX_SPEC];
    mq_policy_opts_t o;
    mq_rng_t rng;
    int bits;       /* bits in use now */
    int first_bits; /* the width init chose: each episode starts there */
    uint64_t step, last_iter, observations;
    double last_reward;
    bool have_carry; /* carry: last smoothed loss, seeds the next value of eq. (1) */
    double carry;
    bool have_scale; /* scale: the run's first smoothed loss, divides the features */
    double scale;
    mq_rl_window_t win;
    /* decision history */
    mq_decision_t *hist;
    size_t nhist, cap;
};

/* Builds the policy SPEC names on top of OPTS: its own options from the spec, the common
 * ones overriding OPTS unless SAVED (a restore: OPTS are already the final ones), then
 * init. NULL with an error naming the bad part. policy.c; used by mq_policy_new and
 * mq_policy_restore. */
mq_policy_t *mq_rl_build(const char *spec, const mq_policy_opts_t *opts, bool saved);
/* Checks every common option; -1 with a message naming the bad one. */
int mq_rl_validate_opts(const mq_policy_opts_t *o);
/* Appends one decision to the history; -1 on allocation failure. */
int mq_rl_history_push(mq_policy_t *p, const mq_decision_t *d);
/* The closed window's smoothed losses divided by the run's first smoothed loss, x[0..T). */
void mq_rl_features(mq_policy_t *p, double *x);

/* Least-squares slope of y[0..n-1] against 1..n (n >= 2). */
double mq_rl_slope(const double *y, int n);
/* Equation (2): -beta * gamma / c, with c (milliseconds) clamped to at least 1 ms. */
double mq_rl_reward(double beta, double gamma, double c_ms);
/* The paper's epsilon-greedy on two actions: the greedy one (a = 1 only if Q1 > Q0) with
 * probability 1 - EPS, the other with EPS; only a = 0 when CAN_UP is false. */
int mq_rl_egreedy(mq_rng_t *rng, double eps, double q0, double q1, bool can_up);

/* ---- mqgrad (p_mqgrad.c, the learning in sarsa.c) ----------------------------------- */

/* One layer of ReLU units between the T smoothed losses and one linear output per bit
 * width min..max. Row-major: w1[h * in + i], w2[j * hidden + h]. */
typedef struct {
    int in, hidden, out;
    double *w1, *b1, *w2, *b2;
} mq_rl_qnet_t;

/* mqgrad's own data (P->priv). */
typedef struct {
    mq_rl_qnet_t net;
    bool have_state; /* s_t exists (after the first decision) */
    int n;           /* n_t */
    int action;      /* a_t */
    double *x;       /* network input of s_t */
} mq_rl_mqgrad_t;

int mq_rl_qnet_alloc(mq_rl_qnet_t *net, int in, int hidden, int out);
void mq_rl_qnet_free(mq_rl_qnet_t *net);
void mq_rl_qnet_init(mq_rl_qnet_t *net, mq_rng_t *rng);
/* Forward pass: q[out]; z[hidden] (pre-activations) may be NULL. */
void mq_rl_qnet_forward(const mq_rl_qnet_t *net, const double *x, double *z, double *q);
/* v <- v + step * dQ_j(x)/dv, the gradient taken with the weights before the change. */
void mq_rl_qnet_step(mq_rl_qnet_t *net, const double *x, int j, double step);
/* One MDP step of mqgrad on the closed window whose network input is X and whose reward is
 * R; sets p->bits for the next window (sarsa.c). */
int mq_rl_mqgrad_decide(mq_policy_t *p, const double *x, double r);

/* ---- the baselines' rules (p_adaptive.c, p_schedule.c) ------------------------------ */

int mq_rl_adaptive_bits(const mq_policy_opts_t *o, double range, double sqmean, int current);
int mq_rl_schedule_bits(const mq_policy_opts_t *o, const mq_observation_t *obs);

/* ---- dqsgd (p_dqsgd.c) ---------------------------------------------------------------- */

/* dqsgd's own options and state (P->priv), exposed for the tests. */
typedef struct {
    double k;            /* the rule's constant (eq. 18's k, eq. 20's t); 0 until calibrated */
    double alpha;        /* eq. 18's alpha; 1 = eq. 20 */
    int target;          /* bits= of the calibration (0 when k was given) */
    bool k_given;        /* k or t came from the spec */
    uint64_t decided;    /* decisions taken (observations with a usable norm) */
    uint64_t low, high;  /* decisions clamped up to min / down to max */
    uint64_t skipped;    /* observations without a usable norm (bits kept) */
    uint64_t no_horizon; /* decisions with alpha < 1 but no known N (factor taken as 1) */
    double last_real;    /* the last unrounded B_n (NaN before the first) */
    double bits_sum;     /* sum of the decided (clamped) widths, for their mean */
    int recorded;        /* the bits of the last history entry (for its action) */
} mq_rl_dqsgd_t;

/* The levels s_n = 2^(B_n - 1) - 1 of eq. 18 for the norm G of iteration N of NN, constant
 * K: K * ALPHA^((NN - N)/2) * G, the exponent taken as 0 from N = NN on and the factor as 1
 * when NN is 0 (unknown). */
double mq_rl_dqsgd_levels(double k, double alpha, uint64_t n, uint64_t nn, double g);
/* The smallest width B >= 1 whose 2^(B-1) - 1 levels reach S (to a relative 1e-9, so that
 * an S computed as exactly 2^(B-1) - 1 gets B), at most 64. */
int mq_rl_dqsgd_width(double s);

/* ---- learned (p_learned.c) ------------------------------------------------------------ */

#define MQ_RL_MAX_RETURNS 1024
#define MQ_RL_LEARNED_ACTIONS 3 /* bits -1, keep, +1 */

/* learned's own options and state (P->priv), exposed for the tests. The table holds
 * Q(s, a) at q[s * 3 + a], a = 0 down, 1 keep, 2 up; s = ((bits - min) * nprog + progress)
 * * ntrend + trend) * nqerr + qerr. */
typedef struct {
    /* own options */
    double every;      /* seconds of training time per decision; 0 = every T iterations */
    double smooth;     /* loss smoothing per iteration, as eq. (1)'s alpha */
    double gain;       /* reward scale (100: percent of the episode's first smoothed loss) */
    double discount;   /* Q-learning's discount */
    double decay;      /* epsilon = floor + (epsilon - floor) * decay^episodes */
    double floor;      /* epsilon's floor */
    bool frozen;       /* greedy, no learning (also when epsilon is 0) */
    int nprog, ntrend, nqerr, nprice; /* buckets of each feature (1: feature off) */
    unsigned given;    /* the own options the spec gave (one bit each), for the defaults */
    /* what it learned, kept across episodes */
    int nstates;
    double *q;
    uint32_t *visits;
    uint64_t episodes; /* episodes closed (with at least one decision) */
    uint64_t updates;  /* Q-learning updates, all episodes */
    size_t nret;       /* returns kept, the last MQ_RL_MAX_RETURNS episodes */
    double returns[MQ_RL_MAX_RETURNS];
    /* this episode */
    bool have_loss;
    double sm, s0, s_prev; /* smoothed loss now, the episode's first, at the last decision */
    double ret;            /* sum of this episode's rewards */
    double ms;             /* the open interval: timed milliseconds, observations, timed ones */
    uint32_t its, timed;
    double qerr_sum;       /* relative quantization error | |Q(g)| - |g| | / |g|, summed */
    uint32_t qerr_n;
    double comm_ms, comm_of; /* the communication time and the iteration time it is part of,
                              * summed over the observations that measured both */
    double progress;       /* the last known fraction of the run's budget used */
    int trend, qbucket, pbucket; /* features of the last closed interval */
    bool have_sa;          /* s, a: the state and action of the open interval */
    int s, a;
    uint64_t decisions;    /* this episode */
    double last_r;         /* the last reward (NaN before the first) */
    int recorded;          /* the bits of the last history entry (for its action) */
} mq_rl_learned_t;

/* The epsilon learned explores with now (0 when frozen). */
double mq_rl_learned_epsilon(const mq_policy_t *p);

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32) continuing from CRC (start with 0). */
uint32_t mq_rl_crc32(uint32_t crc, const uint8_t *buf, size_t len);

#endif
