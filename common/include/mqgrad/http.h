/* Every service's HTTP face (libmicrohttpd, on a thread of its own): GET /metrics (the
 * service's mqgrad/metrics.h registry, in Prometheus' text format), GET /healthz, and any
 * routes the service adds (the agent's /bits). /metrics and the added routes may ask for a
 * bearer token; /healthz never does, so probes need no secret.
 *
 * The flags are the same on every service: --http-port, --http-bind, --http-token and
 * --http-token-file (MQ_HTTP_FLAGS), read into an mq_http_cfg_t. */
#ifndef MQGRAD_HTTP_H
#define MQGRAD_HTTP_H

#include <czmq.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "mqgrad/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A port that asks for any free one (tests; read it back with mq_http_port). */
#define MQ_HTTP_ANY_PORT (-1)

/* The ports the container deployments use (compose, swarm, Kubernetes). */
#define MQ_HTTP_PORT_SCHEDULER 8000
#define MQ_HTTP_PORT_SERVER 8100
#define MQ_HTTP_PORT_AGENT 8200
#define MQ_HTTP_PORT_WORKER 8300

typedef struct {
    long port;              /* 0 = no HTTP, MQ_HTTP_ANY_PORT = any free port */
    char bind[64];          /* an IP address, "*" = every interface */
    char token[256];        /* bearer token, "" = none (resolved by mq_http_cfg_resolve) */
    char token_file[PATH_MAX]; /* where to read the token from: its first line */
} mq_http_cfg_t;

/* The four flag table entries (mqgrad/service.h) for CFG, an mq_http_cfg_t pointer; the
 * port's default is what CFG holds before parsing. */
#define MQ_HTTP_FLAGS(cfg)                                                                      \
    {"http-port", "MQGRAD_HTTP_PORT", MQ_FLAG_LONG, &(cfg)->port, 0, 0, 65535,                  \
     "port for /metrics and /healthz, 0 = no HTTP"},                                           \
        {"http-bind", "MQGRAD_HTTP_BIND", MQ_FLAG_STR, (cfg)->bind, sizeof (cfg)->bind, 0, 0,  \
         "HTTP address (this host only by default), * = every interface"},                         \
        {"http-token", "MQGRAD_HTTP_TOKEN", MQ_FLAG_STR, (cfg)->token, sizeof (cfg)->token, 1, \
         0, "/metrics needs 'Authorization: Bearer TOKEN' (/healthz stays open)"},              \
    {                                                                                           \
        "http-token-file", "MQGRAD_HTTP_TOKEN_FILE", MQ_FLAG_STR, (cfg)->token_file,           \
            sizeof (cfg)->token_file, 1, 0, "the token is this file's first line"               \
    }

/* Defaults: PORT, on 127.0.0.1 (this host only), no token. */
void mq_http_cfg_init(mq_http_cfg_t *cfg, long port);
/* After parsing: reads the token file (if one is named) and checks the token (1 to 255
 * printable characters, no spaces). Returns 0, or -1 with a specific error. */
int mq_http_cfg_resolve(mq_http_cfg_t *cfg);

/* A route's body: written into BUF (at most CAP bytes) on the HTTP thread; returns the
 * length the whole body needs, as snprintf does (it is called again with more room). */
typedef size_t(mq_http_render_fn)(void *arg, char *buf, size_t cap);

typedef struct {
    const char *path;         /* "/bits" */
    const char *content_type; /* "application/json" */
    mq_http_render_fn *render;
    void *arg;
} mq_http_route_t;

typedef struct mq_http_t mq_http_t;

/* Serves CFG's port (which must not be 0) with METRICS at /metrics (may be NULL: then 404)
 * and the NROUTES ROUTES (copied). NULL with an error when the address is not valid or the
 * port cannot be bound. */
mq_http_t *mq_http_new(const mq_http_cfg_t *cfg, mq_metrics_t *metrics,
                       const mq_http_route_t *routes, size_t nroutes);
/* Stops the HTTP thread (waits for it), frees SELF and NULLs *SELF_P. */
void mq_http_destroy(mq_http_t **self_p);
/* The bound port (the chosen one for MQ_HTTP_ANY_PORT); 0 for NULL. */
int mq_http_port(const mq_http_t *self);

/* A service's start: resolves CFG's token and, when CFG's port is not 0, makes a registry
 * for ROLE (*METRICS) and serves it (*HTTP); both stay NULL with the port 0. Returns 0, or
 * the exit code after printing a specific error: 2 for a bad token (a bad flag), 1 when the
 * port cannot be served. Made before the service's actor starts, they outlive its restarts
 * (a node that registers again keeps its counters). */
int mq_http_open_service(const char *role, mq_http_cfg_t *cfg, mq_metrics_t **metrics,
                         mq_http_t **http);
/* A service's main once its flags are read: mq_http_open_service, then mq_service_run of
 * ACTOR_FN(ARGS) (whose configuration holds *METRICS), then the HTTP and the registry go.
 * Returns the exit code. */
int mq_http_run_service(const char *role, mq_http_cfg_t *cfg, mq_metrics_t **metrics,
                        zactor_fn *actor_fn, void *args);

#ifdef __cplusplus
}
#endif
#endif
