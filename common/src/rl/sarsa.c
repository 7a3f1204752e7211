/* The MQGrad agent proper (paper section 3.3, Algorithm 2, DESIGN section 6): the small
 * Q-network, the reward of equation (2), epsilon-greedy, the transition of equation (3)
 * and the SARSA update. Its operations table is in p_mqgrad.c, the window bookkeeping that
 * feeds it in policy.c. */
#include "rl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mq_rl_qnet_alloc(mq_rl_qnet_t *net, int in, int hidden, int out)
{
    memset(net, 0, sizeof *net);
    net->in = in;
    net->hidden = hidden;
    net->out = out;
    net->w1 = calloc((size_t)hidden * (size_t)in, sizeof(double));
    net->b1 = calloc((size_t)hidden, sizeof(double));
    net->w2 = calloc((size_t)out * (size_t)hidden, sizeof(double));
    net->b2 = calloc((size_t)out, sizeof(double));
    if (!net->w1 || !net->b1 || !net->w2 || !net->b2) {
        mq_rl_qnet_free(net);
        mq_err_set("out of memory for a %d-%d-%d Q-network", in, hidden, out);
        return -1;
    }
    return 0;
}

void mq_rl_qnet_free(mq_rl_qnet_t *net)
{
    free(net->w1);
    free(net->b1);
    free(net->w2);
    free(net->b2);
    net->w1 = net->b1 = net->w2 = net->b2 = NULL;
}

/* He initialisation for the ReLU layer, 1/sqrt(fan-in) for the linear one, zero biases:
 * the Q-values start of order one and the seeded generator makes them reproducible. */
void mq_rl_qnet_init(mq_rl_qnet_t *net, mq_rng_t *rng)
{
    double s1 = sqrt(2.0 / net->in), s2 = sqrt(1.0 / net->hidden);
    for (int k = 0; k < net->hidden * net->in; k++)
        net->w1[k] = s1 * mq_rng_normal(rng);
    for (int k = 0; k < net->out * net->hidden; k++)
        net->w2[k] = s2 * mq_rng_normal(rng);
    memset(net->b1, 0, (size_t)net->hidden * sizeof(double));
    memset(net->b2, 0, (size_t)net->out * sizeof(double));
}

void mq_rl_qnet_forward(const mq_rl_qnet_t *net, const double *x, double *z, double *q)
{
    double act[MQ_RL_MAX_HIDDEN];
    for (int h = 0; h < net->hidden; h++) {
        double s = net->b1[h];
        const double *w = net->w1 + (size_t)h * net->in;
        for (int i = 0; i < net->in; i++)
            s += w[i] * x[i];
        if (z)
            z[h] = s;
        act[h] = s > 0 ? s : 0;
    }
    for (int j = 0; j < net->out; j++) {
        double s = net->b2[j];
        const double *w = net->w2 + (size_t)j * net->hidden;
        for (int h = 0; h < net->hidden; h++)
            s += w[h] * act[h];
        q[j] = s;
    }
}

/* Semi-gradient step on output J only: dQ_j/dw2[j][h] = act_h, dQ_j/db2[j] = 1,
 * dQ_j/dw1[h][i] = w2[j][h] * [z_h > 0] * x_i, dQ_j/db1[h] = w2[j][h] * [z_h > 0]. The first
 * layer's gradient uses w2 before it moves, as backpropagation does. */
void mq_rl_qnet_step(mq_rl_qnet_t *net, const double *x, int j, double step)
{
    double z[MQ_RL_MAX_HIDDEN], q[16];
    mq_rl_qnet_forward(net, x, z, q);
    double *w2 = net->w2 + (size_t)j * net->hidden;
    for (int h = 0; h < net->hidden; h++) {
        if (z[h] <= 0)
            continue;
        double g = step * w2[h];
        double *w1 = net->w1 + (size_t)h * net->in;
        for (int i = 0; i < net->in; i++)
            w1[i] += g * x[i];
        net->b1[h] += g;
        w2[h] += step * z[h];
    }
    net->b2[j] += step;
}

double mq_rl_slope(const double *y, int n)
{
    /* beta = sum (i - mean_i)(y_i - mean_y) / sum (i - mean_i)^2, i = 1..n */
    double mi = (n + 1) / 2.0, my = 0;
    for (int i = 0; i < n; i++)
        my += y[i];
    my /= n;
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        double d = (i + 1) - mi;
        num += d * (y[i] - my);
        den += d * d;
    }
    return den > 0 ? num / den : 0;
}

double mq_rl_reward(double beta, double gamma, double c_ms)
{
    /* The paper counts whole milliseconds (c in Z+): never divide by less than one. */
    if (!(c_ms >= 1.0))
        c_ms = 1.0;
    return -beta * gamma / c_ms;
}

int mq_rl_egreedy(mq_rng_t *rng, double eps, double q0, double q1, bool can_up)
{
    if (!can_up)
        return 0;
    int greedy = q1 > q0 ? 1 : 0;
    return mq_rng_double(rng) < eps ? 1 - greedy : greedy;
}

/* The first decision: s_0 = [n_0, Lbar_0], no reward to learn from yet. */
static int s_first(mq_policy_t *p, mq_rl_mqgrad_t *m, const double *x)
{
    const mq_policy_opts_t *o = &p->o;
    double q[16];
    mq_rl_qnet_forward(&m->net, x, NULL, q);
    int n = o->start_bits, k = n - o->min_bits;
    m->n = n;
    m->action =
        mq_rl_egreedy(&p->rng, o->epsilon, q[k], n < o->max_bits ? q[k + 1] : 0, n < o->max_bits);
    memcpy(m->x, x, (size_t)o->T * sizeof(double));
    m->have_state = true;
    p->bits = m->n + m->action;
    return 0;
}

/* Algorithm 2 at step t >= 1, in the paper's order, every Q evaluated with the weights
 * before this step's update:
 *   1. n_t = n_{t-1} + argmax_a Q(s_{t-1}, a) (equation 3; ties keep, as the paper's
 *      "if Q(s,0) >= Q(s,1) keep"); unless literal_eq3, n_t is raised to the bits of the
 *      window just closed, so an exploratory +1 is not taken back and bits never decrease;
 *   2. r_{t-1} (given, equation 2 on the window just closed);
 *   3. a_t epsilon-greedy on Q(s_t, .);
 *   4. v += eta [r_{t-1} + delta Q(s_t, a_t) - Q(s_{t-1}, a_{t-1})] dQ(s_{t-1}, a_{t-1})/dv;
 *   5. bits for the next window = n_t + a_t (a_t = 1 only below max). */
int mq_rl_mqgrad_decide(mq_policy_t *p, const double *x, double r)
{
    mq_rl_mqgrad_t *m = p->priv;
    if (!m->have_state)
        return s_first(p, m, x);
    const mq_policy_opts_t *o = &p->o;
    double qp[16], qc[16];
    mq_rl_qnet_forward(&m->net, m->x, NULL, qp);
    int kp = m->n - o->min_bits;
    bool up = m->n < o->max_bits && qp[kp + 1] > qp[kp];
    int n = m->n + (up ? 1 : 0);
    if (!o->literal_eq3 && n < p->bits)
        n = p->bits;
    if (n > o->max_bits)
        n = o->max_bits;
    mq_rl_qnet_forward(&m->net, x, NULL, qc);
    int kc = n - o->min_bits;
    int a = mq_rl_egreedy(&p->rng, o->epsilon, qc[kc], n < o->max_bits ? qc[kc + 1] : 0,
                          n < o->max_bits);
    double td = r + o->discount * qc[kc + a] - qp[kp + m->action];
    double step = o->eta * td;
    if (isfinite(step))
        mq_rl_qnet_step(&m->net, m->x, kp + m->action, step);
    else
        mq_warn("rl: SARSA update skipped: non-finite TD error (reward %g)", r);
    m->n = n;
    m->action = a;
    memcpy(m->x, x, (size_t)o->T * sizeof(double));
    p->bits = n + a;
    return 0;
}
