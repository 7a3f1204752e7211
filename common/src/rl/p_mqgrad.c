/* The mqgrad policy (the MQGrad paper's SARSA agent) as a plug-in: its Q-network and MDP
 * state, one decision per closed window of T iterations. The learning is in sarsa.c. */
#include "rl_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int s_init(mq_policy_t *p)
{
    mq_rl_mqgrad_t *m = p->priv;
    const mq_policy_opts_t *o = &p->o;
    m->x = calloc((size_t)o->T, sizeof(double));
    if (!m->x) {
        mq_err_set("out of memory for a policy");
        return -1;
    }
    if (mq_rl_qnet_alloc(&m->net, o->T, o->hidden, o->max_bits - o->min_bits + 1) != 0)
        return -1;
    mq_rl_qnet_init(&m->net, &p->rng);
    return 0;
}

static void s_fini(mq_policy_t *p)
{
    mq_rl_mqgrad_t *m = p->priv;
    free(m->x);
    m->x = NULL;
    mq_rl_qnet_free(&m->net);
}

static int s_decide(mq_policy_t *p, const mq_observation_t *obs, double r, mq_decision_t *d)
{
    double x[MQ_RL_MAX_T];
    mq_rl_features(p, x);
    if (mq_rl_mqgrad_decide(p, x, r) != 0)
        return -1;
    d->action = ((mq_rl_mqgrad_t *)p->priv)->action;
    return 0;
}

/* The layout of version 1 states, kept as it was: MDP state, s_t's input, the network. */
static void s_save(const mq_policy_t *p, mq_rl_writer_t *w)
{
    const mq_rl_mqgrad_t *m = p->priv;
    const mq_rl_qnet_t *net = &m->net;
    mq_rl_put_u32(w, m->have_state);
    mq_rl_put_i32(w, m->n);
    mq_rl_put_i32(w, m->action);
    mq_rl_put_f64s(w, m->x, (size_t)p->o.T);
    mq_rl_put_i32(w, net->in);
    mq_rl_put_i32(w, net->hidden);
    mq_rl_put_i32(w, net->out);
    mq_rl_put_f64s(w, net->w1, (size_t)net->hidden * net->in);
    mq_rl_put_f64s(w, net->b1, (size_t)net->hidden);
    mq_rl_put_f64s(w, net->w2, (size_t)net->out * net->hidden);
    mq_rl_put_f64s(w, net->b2, (size_t)net->out);
}

static int s_restore(mq_policy_t *p, mq_rl_reader_t *r)
{
    mq_rl_mqgrad_t *m = p->priv;
    mq_rl_qnet_t *net = &m->net;
    const mq_policy_opts_t *o = &p->o;
    m->have_state = mq_rl_get_u32(r, "MDP state") != 0;
    m->n = mq_rl_get_i32(r, "MDP state");
    m->action = mq_rl_get_i32(r, "MDP state");
    if (mq_rl_get_f64s(r, m->x, (size_t)o->T, "state input") != 0)
        return -1;
    int in = mq_rl_get_i32(r, "network"), hidden = mq_rl_get_i32(r, "network");
    int out = mq_rl_get_i32(r, "network");
    if (!r->fail && (in != net->in || hidden != net->hidden || out != net->out)) {
        mq_err_set("policy state is inconsistent: a %d-%d-%d network, the options need %d-%d-%d",
                   in, hidden, out, net->in, net->hidden, net->out);
        return -1;
    }
    if (mq_rl_get_f64s(r, net->w1, (size_t)net->hidden * net->in, "network w1") != 0 ||
        mq_rl_get_f64s(r, net->b1, (size_t)net->hidden, "network b1") != 0 ||
        mq_rl_get_f64s(r, net->w2, (size_t)net->out * net->hidden, "network w2") != 0 ||
        mq_rl_get_f64s(r, net->b2, (size_t)net->out, "network b2") != 0)
        return -1;
    if (!r->fail && m->have_state &&
        (m->n < o->min_bits || m->n > o->max_bits || m->action < 0 || m->action > 1 ||
         m->n + m->action > o->max_bits)) {
        mq_err_set("policy state is inconsistent: MDP state n_t/a_t outside the bit range");
        return -1;
    }
    return 0;
}

/* A new run: the network stays; s_t goes, so the next window's decision is a first one
 * (the new run's first state does not follow from the last run's last action). */
static int s_episode(mq_policy_t *p)
{
    mq_rl_mqgrad_t *m = p->priv;
    m->have_state = false;
    m->n = m->action = 0;
    memset(m->x, 0, (size_t)p->o.T * sizeof(double));
    return 0;
}

/* The Q-values of s_t once there is one. */
static void s_status(const mq_policy_t *p, mq_policy_status_t *st)
{
    const mq_rl_mqgrad_t *m = p->priv;
    if (m->have_state)
        mq_rl_qnet_forward(&m->net, m->x, NULL, st->q_values);
}

const mq_policy_ops_t mq_policy_mqgrad_ops = {
    .name = "mqgrad",
    .usage = "mqgrad",
    .help = "MQGrad's SARSA agent: a bit more or keep, per window of T iterations",
    .size = sizeof(mq_rl_mqgrad_t),
    .init = s_init,
    .fini = s_fini,
    .decide = s_decide,
    .save = s_save,
    .restore = s_restore,
    .status = s_status,
    .episode = s_episode,
};
