/* The agent's HTTP face (libmicrohttpd, its own polling thread): GET /bits (JSON), GET
 * /metrics (Prometheus text format) and GET /healthz. The HTTP thread only ever reads a
 * snapshot the actor publishes under a mutex; it never touches the policy. */
#include "agent_internal.h"

#include <math.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

struct mq_agent_http_t {
    struct MHD_Daemon *daemon;
    int port;
    char token[256]; /* bearer token for /bits and /metrics; "" = none */
    pthread_mutex_t lock;
    mq_agent_snapshot_t snap;
};

/* ---- rendering ---------------------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t cap, len;
} s_out_t;

static void s_printf(s_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_printf(s_out_t *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* A JSON number, or null for what JSON cannot say (NaN, infinities). */
static void s_json_num(s_out_t *o, double v)
{
    if (isfinite(v))
        s_printf(o, "%.17g", v);
    else
        s_printf(o, "null");
}

/* A JSON string; policy specs are short ASCII, but escape what JSON requires anyway. */
static void s_json_str(s_out_t *o, const char *s)
{
    s_printf(o, "\"");
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            s_printf(o, "\\%c", ch);
        else if (ch < 0x20)
            s_printf(o, "\\u%04x", ch);
        else
            s_printf(o, "%c", ch);
    }
    s_printf(o, "\"");
}

/* Contract: see agent.h. */
size_t mq_agent_status_json(const mq_status_msg_t *st, char *buf, size_t cap)
{
    s_out_t o = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    s_printf(&o, "{\"bits\":%u,\"policy\":", st->bits);
    s_json_str(&o, st->policy);
    s_printf(&o, ",\"step\":%llu,\"iteration\":%llu,\"last_reward\":", (unsigned long long)st->step,
             (unsigned long long)st->iter);
    s_json_num(&o, st->last_reward);
    s_printf(&o, ",\"q_values\":[");
    for (uint32_t i = 0; i < st->nq && i < MQ_WIRE_MAX_Q; i++) {
        s_printf(&o, i ? "," : "");
        s_json_num(&o, st->q_values[i]);
    }
    s_printf(&o, "],\"min_bits\":%u,\"observations\":%llu,\"decisions\":%llu,\"fallbacks\":%llu}",
             st->min_bits, (unsigned long long)st->observations, (unsigned long long)st->decisions,
             (unsigned long long)st->fallbacks);
    return o.len;
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void s_prom_label(s_out_t *o, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            s_printf(o, "\\%c", *s);
        else if (*s == '\n')
            s_printf(o, "\\n");
        else
            s_printf(o, "%c", *s);
    }
}

static void s_prom_head(s_out_t *o, const char *name, const char *type, const char *help)
{
    s_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void s_prom_u64(s_out_t *o, const char *name, const char *type, const char *help, uint64_t v)
{
    s_prom_head(o, name, type, help);
    s_printf(o, "%s %llu\n", name, (unsigned long long)v);
}

/* Prometheus writes NaN and infinities as NaN, +Inf, -Inf. */
static void s_prom_double(s_out_t *o, double v)
{
    if (isnan(v))
        s_printf(o, "NaN\n");
    else if (isinf(v))
        s_printf(o, "%sInf\n", v > 0 ? "+" : "-");
    else
        s_printf(o, "%.17g\n", v);
}

/* Contract: see agent_internal.h. */
size_t mq_agent_metrics_text(const mq_agent_snapshot_t *snap, char *buf, size_t cap)
{
    s_out_t o = {buf, cap, 0};
    const mq_status_msg_t *st = &snap->status;
    if (cap)
        buf[0] = '\0';
    s_prom_u64(&o, "mqgrad_agent_bits", "gauge", "Bit-width the agent asks for now.", st->bits);
    s_prom_head(&o, "mqgrad_agent_policy_info", "gauge", "The active policy spec (value 1).");
    s_printf(&o, "mqgrad_agent_policy_info{policy=\"");
    s_prom_label(&o, st->policy);
    s_printf(&o, "\"} 1\n");
    s_prom_u64(&o, "mqgrad_agent_step", "gauge", "MDP steps taken by the active policy.", st->step);
    s_prom_u64(&o, "mqgrad_agent_iteration", "gauge", "Last observed training iteration.",
               st->iter);
    s_prom_u64(&o, "mqgrad_agent_decisions_total", "counter",
               "Decisions (MDP steps) taken, over all policies.", st->decisions);
    s_prom_u64(&o, "mqgrad_agent_observations_total", "counter",
               "Training iterations observed, over all policies.", st->observations);
    s_prom_head(&o, "mqgrad_agent_last_reward", "gauge", "Reward of the last decision.");
    s_printf(&o, "mqgrad_agent_last_reward ");
    s_prom_double(&o, st->last_reward);
    s_prom_head(&o, "mqgrad_agent_q_value", "gauge",
                "Q-value of each bit-width in the "
                "current state (NaN where the policy has none).");
    for (uint32_t i = 0; i < st->nq && i < MQ_WIRE_MAX_Q; i++) {
        s_printf(&o, "mqgrad_agent_q_value{bits=\"%u\"} ", st->min_bits + i);
        s_prom_double(&o, st->q_values[i]);
    }
    s_prom_u64(&o, "mqgrad_agent_fallbacks_total", "counter",
               "Decisions the scheduler went on without (as it last reported).", st->fallbacks);
    s_prom_u64(&o, "mqgrad_agent_policy_swaps_total", "counter", "Policy swaps.", snap->swaps);
    s_prom_head(&o, "mqgrad_agent_dropped_messages_total", "counter",
                "Messages dropped, by reason.");
    for (int r = MQ_DROP_NONE + 1; r < MQ_DROP_COUNT_; r++)
        s_printf(&o, "mqgrad_agent_dropped_messages_total{reason=\"%s\"} %llu\n",
                 mq_drop_name((mq_drop_t)r), (unsigned long long)snap->drops[r]);
    return o.len;
}

/* ---- serving ------------------------------------------------------------------------ */

static enum MHD_Result s_reply(struct MHD_Connection *c, unsigned code, const char *type,
                               char *body, size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result s_text(struct MHD_Connection *c, unsigned code, const char *text)
{
    char *body = strdup(text);
    return body ? s_reply(c, code, "text/plain", body, strlen(body)) : MHD_NO;
}

/* Renders into a malloc'd buffer, growing it until the text fits. */
static char *s_render(const mq_agent_http_t *self, bool metrics, size_t *len)
{
    size_t cap = 8192;
    for (;;) {
        char *buf = malloc(cap);
        if (!buf)
            return NULL;
        *len = metrics ? mq_agent_metrics_text(&self->snap, buf, cap)
                       : mq_agent_status_json(&self->snap.status, buf, cap);
        if (*len < cap)
            return buf;
        free(buf);
        cap = *len + 64;
    }
}

/* "Authorization: Bearer <token>", compared in constant time. */
static bool s_authorized(const mq_agent_http_t *self, struct MHD_Connection *c)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    size_t n = strlen(self->token);
    if (strlen(h) != n)
        return false;
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(h[i] ^ self->token[i]);
    return diff == 0;
}

static enum MHD_Result s_unauthorized(struct MHD_Connection *c)
{
    static const char text[] = "unauthorized: send Authorization: Bearer <token>\n";
    struct MHD_Response *r =
        MHD_create_response_from_buffer(sizeof text - 1, (void *)text, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain");
    MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, MHD_HTTP_UNAUTHORIZED, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result s_handler(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_size, void **con_cls)
{
    mq_agent_http_t *self = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return s_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: use GET\n");
    bool bits = strcmp(url, "/bits") == 0, metrics = strcmp(url, "/metrics") == 0;
    if (strcmp(url, "/healthz") == 0)
        return s_text(c, MHD_HTTP_OK, "ok\n");
    if (!bits && !metrics)
        return s_text(c, MHD_HTTP_NOT_FOUND, "not found: try /bits, /metrics or /healthz\n");
    if (self->token[0] && !s_authorized(self, c))
        return s_unauthorized(c);
    size_t len = 0;
    pthread_mutex_lock(&self->lock);
    char *body = s_render(self, metrics, &len);
    pthread_mutex_unlock(&self->lock);
    if (!body)
        return MHD_NO;
    if (bits)
        body[len++] = '\n'; /* s_render leaves room: len < cap */
    return s_reply(c, MHD_HTTP_OK,
                   metrics ? "text/plain; version=0.0.4; charset=utf-8" : "application/json", body,
                   len);
}

/* Contract: see agent_internal.h. */
mq_agent_http_t *mq_agent_http_new(const char *addr, int port, const char *token)
{
    mq_agent_http_t *self = calloc(1, sizeof *self);
    if (!self) {
        mq_err_set("out of memory");
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    self->snap.status.last_reward = NAN;
    snprintf(self->token, sizeof self->token, "%s", token ? token : "");
    uint16_t want = port == MQ_AGENT_HTTP_ANY ? 0 : (uint16_t)port;
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons(want)};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons(want)};
    const struct sockaddr *sa = NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    if (addr && *addr && strcmp(addr, "*") != 0) {
        if (inet_pton(AF_INET, addr, &v4.sin_addr) == 1) {
            sa = (const struct sockaddr *)&v4;
        } else if (inet_pton(AF_INET6, addr, &v6.sin6_addr) == 1) {
            sa = (const struct sockaddr *)&v6;
            flags |= MHD_USE_IPv6;
        } else {
            mq_err_set("--http-bind '%s' is not an IP address", addr);
            mq_agent_http_destroy(&self);
            return NULL;
        }
    }
    self->daemon = sa ? MHD_start_daemon(flags, want, NULL, NULL, s_handler, self,
                                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                                         MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_END)
                      : MHD_start_daemon(flags, want, NULL, NULL, s_handler, self,
                                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                                         MHD_OPTION_END);
    if (!self->daemon) {
        mq_err_set("HTTP server cannot listen on %s port %d (in use? try --http-port)",
                   sa ? addr : "every interface,", port);
        mq_agent_http_destroy(&self);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(self->daemon, MHD_DAEMON_INFO_BIND_PORT);
    self->port = info ? info->port : want;
    return self;
}

/* Contract: stops the HTTP thread (waits for it), frees SELF and NULLs *SELF_P. */
void mq_agent_http_destroy(mq_agent_http_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_agent_http_t *self = *self_p;
    if (self->daemon)
        MHD_stop_daemon(self->daemon);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

int mq_agent_http_port(const mq_agent_http_t *self)
{
    return self ? self->port : 0;
}

void mq_agent_http_publish(mq_agent_http_t *self, const mq_agent_snapshot_t *snap)
{
    if (!self)
        return;
    pthread_mutex_lock(&self->lock);
    self->snap = *snap;
    pthread_mutex_unlock(&self->lock);
}
