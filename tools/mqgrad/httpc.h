/* A small HTTP/1.1 client for `mqgrad top`: one GET over a plain TCP connection with one
 * deadline for connect, request and response (Connection: close; the body delimited by
 * Content-Length, chunked transfer coding or the close). No TLS: put the services' HTTP
 * behind a tunnel or a proxy for that. */
#ifndef MQGRAD_CLI_HTTPC_H
#define MQGRAD_CLI_HTTPC_H

#include <signal.h>
#include <stddef.h>

typedef struct {
    char host[256]; /* an IPv6 literal without its brackets */
    char port[8];
    char path[1024];
    char where[300]; /* host:port as the messages name it ([v6]:port) */
} mq_httpc_url_t;

/* Reads http://HOST[:PORT][/PATH] (port 80 when absent) or a bare HOST[:PORT][/PATH] (port
 * BARE_PORT when absent); an empty path or "/" becomes DEFAULT_PATH. -1 with an error for
 * another scheme or a malformed URL. */
int mq_httpc_url_parse(const char *url, const char *bare_port, const char *default_path,
                       mq_httpc_url_t *u);

/* GET U, with "Authorization: Bearer TOKEN" when TOKEN is not NULL, all within TIMEOUT_MS
 * (name resolution aside). Returns 0 with *BODY (malloc'd, NUL-terminated, free it) and
 * *LEN on a 200 answer; -1 with an error otherwise (a refused connection, a timeout, another
 * status: "HTTP 401 Unauthorized ..."). *STATUS is the answer's HTTP status, 0 when there
 * was none. A signal interrupts the wait only when CANCEL is given and set. */
int mq_httpc_get(const mq_httpc_url_t *u, const char *token, long timeout_ms,
                 const volatile sig_atomic_t *cancel, char **body, size_t *len, int *status);

#endif
