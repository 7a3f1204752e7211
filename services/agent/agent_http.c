/* The agent's HTTP face (mqgrad/http.h): GET /bits (JSON), GET /metrics and GET /healthz.
 * The HTTP thread only ever reads what the actor publishes (the status under a mutex, the
 * series through the registry's); it never touches the policy. */
#include "agent_internal.h"
#include "mqgrad/http.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- rendering ---------------------------------------------------------------------- */

/* A JSON number, or null for what JSON cannot say (NaN, infinities). */
static void s_json_num(mq_text_t *o, double v)
{
    if (isfinite(v))
        mq_text_printf(o, "%.17g", v);
    else
        mq_text_printf(o, "null");
}

/* A JSON string; policy specs are short ASCII, but escape what JSON requires anyway. */
static void s_json_str(mq_text_t *o, const char *s)
{
    mq_text_printf(o, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            mq_text_printf(o, "\\%c", ch);
        else if (ch < 0x20)
            mq_text_printf(o, "\\u%04x", ch);
        else
            mq_text_printf(o, "%c", ch);
    }
    mq_text_printf(o, "\"");
}

/* Contract: see agent.h. */
size_t mq_agent_status_json(const mq_status_msg_t *st, char *buf, size_t cap)
{
    mq_text_t o = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    mq_text_printf(&o, "{\"bits\":%u,\"policy\":", st->bits);
    s_json_str(&o, st->policy);
    mq_text_printf(&o, ",\"step\":%llu,\"iteration\":%llu,\"last_reward\":", (unsigned long long)st->step,
             (unsigned long long)st->iter);
    s_json_num(&o, st->last_reward);
    mq_text_printf(&o, ",\"q_values\":[");
    for (uint32_t i = 0; i < st->n_q_values && i < MQ_WIRE_MAX_Q; i++) {
        mq_text_printf(&o, i ? "," : "");
        s_json_num(&o, st->q_values[i]);
    }
    mq_text_printf(&o, "],\"widths\":[");
    for (uint32_t t = 0; t < st->n_widths && t < MQ_WIRE_MAX_TENSORS; t++)
        mq_text_printf(&o, "%s%u", t ? "," : "", st->widths[t]);
    mq_text_printf(&o, "],\"min_bits\":%u,\"observations\":%llu,\"decisions\":%llu,\"fallbacks\":%llu}",
             st->min_bits, (unsigned long long)st->observations, (unsigned long long)st->decisions,
             (unsigned long long)st->fallbacks);
    return o.len;
}

/* ---- metrics and serving ------------------------------------------------------------ */

/* The agent's series, updated from each snapshot the actor publishes. */
typedef struct {
    mq_metric_t *bits, *policy_info, *step, *iter, *decisions, *observations, *reward,
        *fallbacks, *swaps;
    mq_metric_t *q[MQ_WIRE_MAX_Q * 2]; /* q_value{bits=...} by bit-width; NULL until seen */
    mq_metric_t *drops[MQ_DROP_COUNT_];
} s_series_t;

static void s_series_init(s_series_t *s, mq_metrics_t *m)
{
    s->bits = mq_metrics_gauge(m, "mqgrad_agent_bits", "Bit-width the agent asks for now.", NULL);
    s->policy_info = mq_metrics_gauge(m, "mqgrad_agent_policy_info",
                                      "The active policy spec (value 1).", "policy=\"\"");
    s->step = mq_metrics_gauge(m, "mqgrad_agent_step", "MDP steps taken by the active policy.",
                               NULL);
    s->iter = mq_metrics_gauge(m, "mqgrad_agent_iteration", "Last observed training iteration.",
                               NULL);
    s->decisions = mq_metrics_counter(m, "mqgrad_agent_decisions_total",
                                      "Decisions (MDP steps) taken, over all policies.", NULL);
    s->observations = mq_metrics_counter(m, "mqgrad_agent_observations_total",
                                         "Training iterations observed, over all policies.", NULL);
    s->reward = mq_metrics_gauge(m, "mqgrad_agent_last_reward", "Reward of the last decision.",
                                 NULL);
    mq_metric_set(s->reward, NAN);
    s->fallbacks = mq_metrics_counter(m, "mqgrad_agent_fallbacks_total",
                                      "Decisions the scheduler went on without (as it last "
                                      "reported).",
                                      NULL);
    s->swaps = mq_metrics_counter(m, "mqgrad_agent_policy_swaps_total", "Policy swaps.", NULL);
    mq_drops_series(m, "mqgrad_agent_dropped_messages_total", s->drops);
}

static void s_series_update(s_series_t *s, mq_metrics_t *m, const mq_agent_snapshot_t *snap)
{
    const mq_status_msg_t *st = &snap->status;
    char labels[MQ_METRICS_LABELS_MAX], esc[MQ_METRICS_LABELS_MAX - 16];
    snprintf(labels, sizeof labels, "policy=\"%s\"", mq_metrics_escape(esc, sizeof esc, st->policy));
    mq_metric_relabel(s->policy_info, labels);
    mq_metric_set(s->policy_info, 1);
    mq_metric_set(s->bits, st->bits);
    mq_metric_set(s->step, (double)st->step);
    mq_metric_set(s->iter, (double)st->iter);
    mq_metric_set(s->decisions, (double)st->decisions);
    mq_metric_set(s->observations, (double)st->observations);
    mq_metric_set(s->reward, st->last_reward);
    mq_metric_set(s->fallbacks, (double)st->fallbacks);
    mq_metric_set(s->swaps, (double)snap->swaps);
    /* every bit-width seen so far: the current policy's Q-values, NaN for the others */
    for (uint32_t b = 1; b < MQ_WIRE_MAX_Q * 2; b++) {
        bool cur = b >= st->min_bits && b - st->min_bits < st->n_q_values && st->n_q_values <= MQ_WIRE_MAX_Q;
        if (!s->q[b - 1] && cur) {
            snprintf(labels, sizeof labels, "bits=\"%u\"", b);
            s->q[b - 1] = mq_metrics_gauge(m, "mqgrad_agent_q_value",
                                           "Q-value of each bit-width in the current state "
                                           "(NaN where the policy has none).",
                                           labels);
        }
        mq_metric_set(s->q[b - 1], cur ? st->q_values[b - st->min_bits] : NAN);
    }
    mq_drops_publish(s->drops, snap->drops);
}

struct mq_agent_http_t {
    mq_http_t *http;
    mq_metrics_t *metrics;
    s_series_t series;
    pthread_mutex_t lock; /* status */
    mq_status_msg_t status;
};

static size_t s_render_bits(void *arg, char *buf, size_t cap)
{
    mq_agent_http_t *self = arg;
    pthread_mutex_lock(&self->lock);
    size_t n = mq_agent_status_json(&self->status, buf, cap);
    pthread_mutex_unlock(&self->lock);
    return n;
}

/* Contract: see agent_internal.h. */
mq_agent_http_t *mq_agent_http_new(const mq_http_cfg_t *cfg)
{
    mq_agent_http_t *self = calloc(1, sizeof *self);
    if (!self) {
        mq_err_set("out of memory");
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    self->status.last_reward = NAN;
    if (!(self->metrics = mq_metrics_new("agent"))) {
        mq_err_set("out of memory");
        mq_agent_http_destroy(&self);
        return NULL;
    }
    s_series_init(&self->series, self->metrics);
    mq_http_route_t bits = {"/bits", "application/json", s_render_bits, self};
    if (!(self->http = mq_http_new(cfg, self->metrics, &bits, 1)))
        mq_agent_http_destroy(&self);
    return self;
}

/* Contract: stops the HTTP thread (waits for it), frees SELF and NULLs *SELF_P. */
void mq_agent_http_destroy(mq_agent_http_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_agent_http_t *self = *self_p;
    mq_http_destroy(&self->http);
    mq_metrics_destroy(&self->metrics);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

int mq_agent_http_port(const mq_agent_http_t *self)
{
    return self ? mq_http_port(self->http) : 0;
}

void mq_agent_http_publish(mq_agent_http_t *self, const mq_agent_snapshot_t *snap)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->lock);
    self->status = snap->status;
    pthread_mutex_unlock(&self->lock);
    s_series_update(&self->series, self->metrics, snap);
}
