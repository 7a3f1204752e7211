/* Bit-width policies behind one interface: the MQGrad SARSA agent (paper section 3.3,
 * Algorithm 2), fixed:K, adaptive (Oland & Raj as the paper describes them), schedule,
 * DQ-SGD (Yan et al., eqs. 18/20) and learned (tabular Q-learning across runs). No sockets
 * here: a policy sees one observation per training iteration and says which bit width the
 * next iterations use. Each policy is a plug-in of the rl module (common/src/rl/registry.c
 * lists them); mq_policy_help prints them. */
#ifndef MQGRAD_RL_H
#define MQGRAD_RL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Tensors of a layout a per-tensor policy can set (nn.h's MQ_LAYOUT_MAX). */
#define MQ_POLICY_MAX_TENSORS 128

/* What the scheduler tells the agent about one finished iteration. */
typedef struct {
    uint64_t iter;       /* m */
    double loss;         /* global loss L^m (mean over workers) */
    double iter_ms;      /* wall time of iteration m, milliseconds (excluding evaluation) */
    double grad_sqmean;  /* mean of g^2 over the quantized tensors (mean over workers) */
    double grad_range;   /* mean over workers of (max - min) of the quantized tensors */
    uint64_t total_iters;/* planned iterations of the run (0 = unknown), for schedule */
    double progress;     /* fraction of the run's budget used, 0..1, for schedule */
    /* What a controller needs to see a blow-up coming (the scheduler's watch, mqgrad/watch.h):
     * the loss against its smoothing (a spike is loss / loss_smoothed well above 1), non-finite
     * values, and the gradient's norm before quantization against what the workers sent and
     * what the servers' re-quantized aggregate decoded to (over the quantized tensors). */
    int bits;            /* bits iteration `iter` used (the guard may have raised them) */
    double loss_smoothed; /* the smoothed loss before this iteration */
    uint64_t nonfinite;  /* non-finite loss and gradient values the workers reported */
    double grad_norm;    /* |g| before quantization (RMS over workers) */
    double sent_norm;    /* |Q(g)| as pushed (RMS over workers) */
    double update_norm;  /* |g^| of the applied aggregate */
    bool guard;          /* the scheduler's spike guard held the bits up */
    double comm_ms;      /* of iter_ms, the time from the push to the last aggregate applied
                          * (mean over workers; 0: not measured): what the bits cost */
    /* The quantized tensors, for a per-tensor policy (NTENSORS 0: not reported): entry k is
     * tensor TENSOR_INDEX[k] of the run's layout of LAYOUT_TENSORS, TENSOR_COUNT[k] values
     * sent at TENSOR_BITS[k] with squared quantization error TENSOR_ERR[k] (mean over the
     * workers). The arrays are the caller's, read during mq_policy_observe only. */
    uint32_t ntensors, layout_tensors;
    const uint64_t *tensor_count;
    const uint32_t *tensor_bits, *tensor_index;
    const double *tensor_err;
} mq_observation_t;

/* Every hyper-parameter of the paper, with the paper's values as defaults
 * (mq_policy_opts_default). */
typedef struct {
    int T;               /* iterations per MDP step (5) */
    double alpha;        /* loss smoothing, equation (1) (0.01) */
    double epsilon;      /* epsilon-greedy (0.1) */
    double eta;          /* SARSA learning rate (0.1) */
    double discount;     /* SARSA discount delta (0.9) */
    double gamma;        /* reward scale, equation (2) (300) */
    int min_bits;        /* 2 */
    int max_bits;        /* 8 */
    int start_bits;      /* n_0 (2) */
    int hidden;          /* Q-network hidden units (10) */
    double tau;          /* adaptive: noise threshold relative to mean(g^2) */
    uint64_t seed;       /* weights init and exploration */
    bool literal_eq3;    /* mqgrad: false (default) = bits never decrease: n_t is at least the
                          * bits just used, so an exploratory +1 is kept; true = equation (3)
                          * as printed: an exploratory +1 lasts one window */
} mq_policy_opts_t;

void mq_policy_opts_default(mq_policy_opts_t *o);

typedef struct mq_policy_t mq_policy_t;

/* Makes a policy from SPEC: a registered policy's name ("mqgrad", "fixed:K", "adaptive",
 * "schedule", "dqsgd", "learned", ...; mq_policy_help lists them), optionally followed by
 * ":key=value,..." giving the policy's own options (e.g. dqsgd's k, alpha, bits) or
 * overriding OPTS (keys T, alpha, epsilon, eta, discount, gamma, min, max, start, hidden,
 * tau, seed, literal_eq3; a policy's own key wins over a common one of the same name), e.g.
 * "mqgrad:T=10,epsilon=0.05". OPTS NULL means the defaults. NULL with an error on a bad
 * spec or options. */
mq_policy_t *mq_policy_new(const char *spec, const mq_policy_opts_t *opts);
void mq_policy_destroy(mq_policy_t **self_p);

/* Feeds one observation (iterations arrive in order; a repeated or older iteration is
 * ignored and returns the current bits, until mq_policy_new_episode starts a new run).
 * Returns the bit width to use from iteration obs->iter + 1 on, or -1 with an error if P or
 * OBS is NULL. A step (MDP step, history entry) happens when a window of T observations is
 * complete; most policies decide only then and answer the current bits between steps, a
 * policy deciding on its own clock (dqsgd each iteration, learned every S seconds of
 * training) may change the bits at any observation. */
int mq_policy_observe(mq_policy_t *p, const mq_observation_t *obs);

/* What a query shows. q_values has one entry per bit width min..max (NaN where the policy
 * has none). */
typedef struct {
    char spec[64];
    int bits;
    uint64_t step;        /* MDP steps (closed windows, history entries) taken */
    uint64_t iter;        /* last observed iteration */
    uint64_t observations;
    double last_reward;   /* NaN before the first */
    int nq;
    double q_values[16];
    char detail[128];     /* the policy's own state in one line ("" if it has none) */
    uint32_t nwidths;     /* a per-tensor policy's levels, one per tensor of the layout */
    uint8_t widths[MQ_POLICY_MAX_TENSORS]; /* (0: bits for every tensor) */
} mq_policy_status_t;
void mq_policy_status(const mq_policy_t *p, mq_policy_status_t *st);

/* Serializes the whole state (spec, options, weights, MDP state, rng, decision history) to a
 * malloc'd buffer; mq_policy_restore rebuilds a policy from it, bit-exactly. A corrupt or
 * incompatible buffer gives NULL and an error saying what is wrong. */
int mq_policy_save(const mq_policy_t *p, uint8_t **buf, size_t *len);
mq_policy_t *mq_policy_restore(const uint8_t *buf, size_t len);

/* The decision history: one entry per MDP step (closed window). */
typedef struct {
    uint64_t step, iter;
    int bits;
    int action; /* mqgrad: a_t (0 keep, 1 up); the others: bits minus the previous entry's */
    double reward;
} mq_decision_t;
size_t mq_policy_history(const mq_policy_t *p, const mq_decision_t **out);

/* Starts a new episode: the next observation belongs to a new training run, and its
 * iterations count from 0 again (without this, a restored policy ignores iterations not
 * newer than the last it saw). What every policy resets: the window and the smoothing of
 * equation (1) (carry, scale), the last iteration, the observation and step counts, the
 * decision history (it describes one run) and the bits, back to the width the policy
 * starts with (start bits; fixed's K; schedule's min). The random generator goes on. What
 * each policy keeps:
 *   learned   its Q-table and visit counts; the closed episode's return is recorded (when
 *             it made a decision), the episode counted, and epsilon decays with the count;
 *   mqgrad    its Q-network; the MDP state s_t is dropped, so the next window's decision is
 *             a first one (no SARSA update joins the last run's last step to the new run);
 *   dqsgd     nothing: k is calibrated again on the new run's first norm (unless k or t was
 *             given) and its counters start over, as a fresh dqsgd would;
 *   fixed, adaptive, schedule: nothing of their own.
 * 0, or -1 with an error (P NULL). */
int mq_policy_new_episode(mq_policy_t *p);

/* True if P learns across runs (learned): the agent then starts a new episode when the
 * iterations start over, where for the others it starts a new policy. */
bool mq_policy_episodic(const mq_policy_t *p);

/* The returns (sums of rewards) of P's last closed episodes, oldest first, at most 1024:
 * *OUT points into P (valid until its next new episode, restore or destroy). 0 (and *OUT
 * NULL) for a policy without episodes. */
size_t mq_policy_returns(const mq_policy_t *p, const double **out);

/* P takes over what FROM, the same policy under another spec (e.g. "learned" trained, then
 * "learned:epsilon=0" deployed), learned across episodes: learned's table, visit counts,
 * episode count and returns. 0, or -1 with an error and P unchanged: another policy, one
 * that learns nothing across runs, or options that give another table (bit range, buckets). */
int mq_policy_adopt(mq_policy_t *p, const mq_policy_t *from);

/* The registered policies for a --help text: one line each, "  USAGE  HELP\n", in
 * registry order, NUL-terminated and cut at LEN. */
void mq_policy_help(char *buf, size_t len);
/* The policies' short spec forms joined by SEP ("mqgrad | fixed:K | adaptive | ..." with
 * SEP " | "), for a one-line flag description; NUL-terminated and cut at LEN. */
void mq_policy_names(char *buf, size_t len, const char *sep);

/* ---- per-layer bit-widths under an error budget (L-GreCo) --------------------------------
 * L-GreCo (Alimohammadi et al., "L-GreCo: layerwise-adaptive gradient compression") picks
 * each layer's compression by dynamic programming so that the total error stays within a
 * budget. Here layer l has N[l] values and an error coefficient E[l]: at b bits its squared
 * quantization error is E[l] / (2^b - 1)^2 (rounding to nearest within a range of width r
 * errs by r/(2^b - 1) at most and has variance r^2 / (12 (2^b - 1)^2), so for the uniform codec
 * E[l] = sum over the layer's ranges of count * r^2 / 12). mq_alloc_bits chooses b[l] in
 * [LO, HI] minimising the bits sent, sum N[l] b[l], subject to sum E[l] / (2^b[l] - 1)^2 <=
 * BUDGET: the errors are counted in STEPS units of BUDGET / STEPS, each rounded up, so the
 * answer always keeps the budget and costs no more than the best that keeps a budget smaller
 * by L units. Returns 0 with the widths in BITS, or -1 with an error (no widths keep the
 * budget even at HI bits everywhere, or bad arguments: L in 1..4096, 1 <= LO <= HI <= 16,
 * STEPS in 1..1000000, finite non-negative N and E). */
int mq_alloc_bits(const double *n, const double *e, size_t l, int lo, int hi, double budget,
                  size_t steps, int *bits);
/* The squared error of BITS under the model above: sum E[l] / (2^bits[l] - 1)^2. */
double mq_alloc_error(const double *e, size_t l, const int *bits);

#ifdef __cplusplus
}
#endif
#endif
