/* What the rl module's files share and the tests may look into: the policy object, the
 * Q-network, the window of observations, and the small numeric pieces (smoothing, slope,
 * reward, epsilon-greedy, CRC32) exposed so they can be checked against hand computations. */
#ifndef MQGRAD_RL_INTERNAL_H
#define MQGRAD_RL_INTERNAL_H

#include "mqgrad/rl.h"
#include "mqgrad/util.h"

#define MQ_RL_MAX_T 4096
#define MQ_RL_MAX_HIDDEN 256

typedef enum {
    MQ_POLICY_MQGRAD = 1,
    MQ_POLICY_FIXED = 2,
    MQ_POLICY_ADAPTIVE = 3,
    MQ_POLICY_SCHEDULE = 4,
} mq_policy_kind_t;

/* One layer of ReLU units between the T smoothed losses and one linear output per bit
 * width min..max. Row-major: w1[h * in + i], w2[j * hidden + h]. */
typedef struct {
    int in, hidden, out;
    double *w1, *b1, *w2, *b2;
} mq_rl_qnet_t;

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
    mq_policy_kind_t kind;
    char spec[64];
    mq_policy_opts_t o;
    int fixed_bits;
    mq_rng_t rng;
    int bits; /* bits in use now (window being observed) */
    uint64_t step, last_iter, observations;
    double last_reward;
    bool have_carry; /* carry: last smoothed loss, seeds the next value of eq. (1) */
    double carry;
    bool have_scale; /* scale: the run's first smoothed loss, divides the net's inputs */
    double scale;
    mq_rl_window_t win;
    /* mqgrad only */
    mq_rl_qnet_t net;
    bool have_state; /* s_t exists (after the first decision) */
    int n;           /* n_t */
    int action;      /* a_t */
    double *x;       /* network input of s_t */
    /* decision history */
    mq_decision_t *hist;
    size_t nhist, cap;
};

/* Allocates a policy of KIND with validated options O (buffers sized by O, weights zero,
 * no observations). policy.c; used by mq_policy_new and mq_policy_restore. */
mq_policy_t *mq_rl_alloc(mq_policy_kind_t kind, const mq_policy_opts_t *o);
/* Checks every option; -1 with a message naming the bad one. */
int mq_rl_validate_opts(const mq_policy_opts_t *o);
/* Appends one decision to the history; -1 on allocation failure. */
int mq_rl_history_push(mq_policy_t *p, const mq_decision_t *d);

/* Least-squares slope of y[0..n-1] against 1..n (n >= 2). */
double mq_rl_slope(const double *y, int n);
/* Equation (2): -beta * gamma / c, with c (milliseconds) clamped to at least 1 ms. */
double mq_rl_reward(double beta, double gamma, double c_ms);
/* The paper's epsilon-greedy on two actions: the greedy one (a = 1 only if Q1 > Q0) with
 * probability 1 - EPS, the other with EPS; only a = 0 when CAN_UP is false. */
int mq_rl_egreedy(mq_rng_t *rng, double eps, double q0, double q1, bool can_up);

/* Q-network (sarsa.c). */
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
/* The baselines' choice for the next window (baselines.c). */
int mq_rl_adaptive_bits(const mq_policy_opts_t *o, double range, double sqmean, int current);
int mq_rl_schedule_bits(const mq_policy_opts_t *o, const mq_observation_t *obs);

/* CRC-32 (IEEE 802.3, reflected, as zlib's crc32) continuing from CRC (start with 0). */
uint32_t mq_rl_crc32(uint32_t crc, const uint8_t *buf, size_t len);

#endif
