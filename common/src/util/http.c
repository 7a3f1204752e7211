/* Every service's HTTP face (mqgrad/http.h). libmicrohttpd runs its own polling thread; the
 * handlers only render (the registry locks itself, routes lock what they read). */
#include "mqgrad/http.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_MAX_ROUTES 8
#define S_PER_CLIENT 8 /* connections one address may hold at once */

struct mq_http_t {
    struct MHD_Daemon *daemon;
    int port;
    char token[256];
    mq_metrics_t *metrics;
    mq_http_route_t routes[S_MAX_ROUTES];
    size_t nroutes;
};

void mq_http_cfg_init(mq_http_cfg_t *cfg, long port)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->port = port;
    /* This host only, unless told otherwise: the containers' image says "*" (deploy/). */
    snprintf(cfg->bind, sizeof cfg->bind, "127.0.0.1");
}

int mq_http_cfg_resolve(mq_http_cfg_t *cfg)
{
    char *data = NULL;
    size_t len = 0;
    const char *what = "--http-token";
    if (cfg->token_file[0]) {
        what = "--http-token-file";
        if (mq_read_file(cfg->token_file, &data, &len) != 0)
            return mq_err_set("%s: cannot read '%s': %s", what, cfg->token_file,
                              strerror(errno)), -1;
    }
    const char *t = data ? data : cfg->token;
    size_t n = data ? strcspn(t, "\r\n") : strlen(t);
    int rc = 0;
    if (data && n == 0)
        rc = (mq_err_set("%s: '%s' has an empty first line", what, cfg->token_file), -1);
    if (rc == 0 && n >= sizeof cfg->token)
        rc = (mq_err_set("%s: the token must be 1 to %zu characters", what,
                         sizeof cfg->token - 1), -1);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (t[i] <= ' ' || t[i] > '~')
            rc = (mq_err_set("%s: the token must be printable ASCII without spaces", what), -1);
    if (rc == 0 && data)
        snprintf(cfg->token, sizeof cfg->token, "%.*s", (int)n, t);
    free(data);
    return rc;
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
    return body ? s_reply(c, code, "text/plain; charset=utf-8", body, strlen(body)) : MHD_NO;
}

/* Renders into a malloc'd buffer, growing it until the body fits; one byte is left spare. */
static char *s_render(mq_http_render_fn *fn, void *arg, size_t *len)
{
    size_t cap = 16384;
    for (;;) {
        char *buf = malloc(cap);
        if (!buf)
            return NULL;
        *len = fn(arg, buf, cap);
        if (*len + 1 < cap)
            return buf;
        free(buf);
        cap = *len + 64;
    }
}

static size_t s_render_metrics(void *arg, char *buf, size_t cap)
{
    return mq_metrics_render(arg, buf, cap);
}

/* "Authorization: Bearer <token>", compared in constant time. */
static bool s_authorized(const mq_http_t *self, struct MHD_Connection *c)
{
    if (!self->token[0])
        return true;
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
    (void)version, (void)upload_data, (void)upload_size, (void)con_cls;
    mq_http_t *self = cls;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return s_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: use GET\n");
    if (strcmp(url, "/healthz") == 0)
        return s_text(c, MHD_HTTP_OK, "ok\n");
    mq_http_render_fn *fn = NULL;
    void *arg = NULL;
    const char *type = NULL;
    if (self->metrics && strcmp(url, "/metrics") == 0) {
        fn = s_render_metrics;
        arg = self->metrics;
        type = "text/plain; version=0.0.4; charset=utf-8";
    }
    for (size_t i = 0; !fn && i < self->nroutes; i++)
        if (strcmp(url, self->routes[i].path) == 0) {
            fn = self->routes[i].render;
            arg = self->routes[i].arg;
            type = self->routes[i].content_type;
        }
    if (!fn) {
        char text[256];
        size_t n = (size_t)snprintf(text, sizeof text, "not found: try %s/healthz",
                                    self->metrics ? "/metrics, " : "");
        for (size_t i = 0; i < self->nroutes && n < sizeof text; i++)
            n += (size_t)snprintf(text + n, sizeof text - n, ", %s", self->routes[i].path);
        if (n < sizeof text - 1)
            snprintf(text + n, sizeof text - n, "\n");
        return s_text(c, MHD_HTTP_NOT_FOUND, text);
    }
    if (!s_authorized(self, c))
        return s_unauthorized(c);
    size_t len = 0;
    char *body = s_render(fn, arg, &len);
    if (!body)
        return MHD_NO;
    if (strncmp(type, "application/json", 16) == 0)
        body[len++] = '\n'; /* s_render leaves a spare byte */
    return s_reply(c, MHD_HTTP_OK, type, body, len);
}

mq_http_t *mq_http_new(const mq_http_cfg_t *cfg, mq_metrics_t *metrics,
                       const mq_http_route_t *routes, size_t nroutes)
{
    if (cfg->port == 0 || cfg->port < MQ_HTTP_ANY_PORT || cfg->port > 65535)
        return mq_err_set("HTTP port %ld is not one to serve on", cfg->port), NULL;
    if (nroutes > S_MAX_ROUTES)
        return mq_err_set("at most %d HTTP routes", S_MAX_ROUTES), NULL;
    mq_http_t *self = calloc(1, sizeof *self);
    if (!self)
        return mq_err_set("out of memory"), NULL;
    snprintf(self->token, sizeof self->token, "%s", cfg->token);
    self->metrics = metrics;
    if (nroutes)
        memcpy(self->routes, routes, nroutes * sizeof *routes);
    self->nroutes = nroutes;

    uint16_t want = cfg->port == MQ_HTTP_ANY_PORT ? 0 : (uint16_t)cfg->port;
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons(want)};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons(want)};
    const struct sockaddr *sa = NULL;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
    const char *addr = cfg->bind;
    if (addr[0] && strcmp(addr, "*") != 0) {
        if (inet_pton(AF_INET, addr, &v4.sin_addr) == 1) {
            sa = (const struct sockaddr *)&v4;
        } else if (inet_pton(AF_INET6, addr, &v6.sin6_addr) == 1) {
            sa = (const struct sockaddr *)&v6;
            flags |= MHD_USE_IPv6;
        } else {
            mq_err_set("--http-bind '%s' is not an IP address", addr);
            mq_http_destroy(&self);
            return NULL;
        }
    }
    /* Connections time out after 10 s, at most 64 are served at once and at most
     * S_PER_CLIENT from one address: a scraper that stalls or floods cannot hold the thread or
     * the service's memory, nor crowd out the other clients. */
    self->daemon =
        sa ? MHD_start_daemon(flags, want, NULL, NULL, s_handler, self,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)S_PER_CLIENT,
                              MHD_OPTION_SOCK_ADDR, sa, MHD_OPTION_END)
           : MHD_start_daemon(flags, want, NULL, NULL, s_handler, self,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)S_PER_CLIENT,
                              MHD_OPTION_END);
    if (!self->daemon) {
        mq_err_set("HTTP cannot listen on %s port %ld (in use? try --http-port)",
                   sa ? addr : "every interface,", cfg->port);
        mq_http_destroy(&self);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(self->daemon, MHD_DAEMON_INFO_BIND_PORT);
    self->port = info ? info->port : want;
    return self;
}

void mq_http_destroy(mq_http_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_http_t *self = *self_p;
    if (self->daemon)
        MHD_stop_daemon(self->daemon);
    free(self);
    *self_p = NULL;
}

int mq_http_port(const mq_http_t *self)
{
    return self ? self->port : 0;
}

int mq_http_open_service(const char *role, mq_http_cfg_t *cfg, mq_metrics_t **metrics,
                         mq_http_t **http)
{
    *metrics = NULL;
    *http = NULL;
    if (mq_http_cfg_resolve(cfg) != 0) {
        fprintf(stderr, "mqgrad-%s: %s\n", role, mq_err_last());
        return 2;
    }
    if (cfg->port == 0)
        return 0;
    if (!(*metrics = mq_metrics_new(role)) || !(*http = mq_http_new(cfg, *metrics, NULL, 0))) {
        fprintf(stderr, "mqgrad-%s: %s\n", role, *metrics ? mq_err_last() : "out of memory");
        mq_metrics_destroy(metrics);
        return 1;
    }
    mq_info("metrics: http://%s:%d/metrics", strcmp(cfg->bind, "*") ? cfg->bind : "*",
            mq_http_port(*http));
    return 0;
}

int mq_http_run_service(const char *role, mq_http_cfg_t *cfg, mq_metrics_t **metrics,
                        zactor_fn *actor_fn, void *args)
{
    mq_http_t *http = NULL;
    int rc = mq_http_open_service(role, cfg, metrics, &http);
    if (rc != 0)
        return rc;
    rc = mq_service_run(actor_fn, args);
    mq_http_destroy(&http);
    mq_metrics_destroy(metrics);
    return rc;
}
