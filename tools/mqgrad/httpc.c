/* The HTTP GET client of `mqgrad top`. Every wait is a poll() against one deadline, so a
 * scheduler that accepts and then says nothing costs one timeout, never a hang. */
#include "httpc.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mqgrad/util.h"

/* Metrics are a few kilobytes; this only stops a wrong URL from filling memory. */
#define S_MAX_BODY (8u << 20)
#define S_MAX_HEAD (64u << 10)

static bool s_url_char_ok(char c)
{
    return (unsigned char)c > ' ' && c != 0x7f;
}

int mq_httpc_url_parse(const char *url, const char *bare_port, const char *default_path,
                       mq_httpc_url_t *u)
{
    memset(u, 0, sizeof *u);
    const char *p = url, *port = bare_port;
    if (strncasecmp(p, "http://", 7) == 0) {
        p += 7;
        port = "80";
    } else if (strstr(p, "://")) {
        mq_err_set("'%s': only http:// URLs (no TLS here; tunnel or proxy the port for that)",
                   url);
        return -1;
    }
    for (const char *c = url; *c; c++)
        if (!s_url_char_ok(*c)) {
            mq_err_set("'%s': a URL has no spaces or control characters", url);
            return -1;
        }
    const char *host = p, *host_end;
    if (*p == '[') {
        host = p + 1;
        host_end = strchr(host, ']');
        if (!host_end) {
            mq_err_set("'%s': '[' without ']' around an IPv6 address", url);
            return -1;
        }
        p = host_end + 1;
    } else {
        host_end = p + strcspn(p, ":/?#");
        p = host_end;
    }
    size_t hn = (size_t)(host_end - host);
    if (hn == 0 || hn >= sizeof u->host) {
        mq_err_set("'%s': %s host name", url, hn ? "too long a" : "no");
        return -1;
    }
    if (strchr(url, '@') && strchr(url, '@') < p) {
        mq_err_set("'%s': no user name or password in the URL (use --http-token-file)", url);
        return -1;
    }
    memcpy(u->host, host, hn);
    if (*p == ':') {
        p++;
        size_t pn = strspn(p, "0123456789");
        long v = pn && pn < 6 ? strtol(p, NULL, 10) : 0;
        if (v < 1 || v > 65535 || (p[pn] && p[pn] != '/' && p[pn] != '?' && p[pn] != '#')) {
            mq_err_set("'%s': the port is not a number in 1-65535", url);
            return -1;
        }
        snprintf(u->port, sizeof u->port, "%ld", v);
        p += pn;
    } else if (*p && *p != '/' && *p != '?' && *p != '#') {
        mq_err_set("'%s': unexpected '%c' after the host", url, *p);
        return -1;
    } else {
        snprintf(u->port, sizeof u->port, "%s", port);
    }
    size_t path_len = strcspn(p, "#"); /* a fragment is never sent */
    if (path_len == 0 || (path_len == 1 && *p == '/'))
        snprintf(u->path, sizeof u->path, "%s", default_path);
    else if (*p == '?')
        snprintf(u->path, sizeof u->path, "%s%.*s", default_path, (int)path_len, p);
    else if (path_len < sizeof u->path)
        snprintf(u->path, sizeof u->path, "%.*s", (int)path_len, p);
    else {
        mq_err_set("'%s': the path is too long", url);
        return -1;
    }
    bool v6 = strchr(u->host, ':') != NULL;
    snprintf(u->where, sizeof u->where, "%s%s%s:%s", v6 ? "[" : "", u->host, v6 ? "]" : "",
             u->port);
    return 0;
}

/* Waits until FD is ready for EVENTS or DEADLINE (mq_now_us) passes. 1 ready, 0 timed out,
 * -1 cancelled or failed (with an error). */
static int s_wait(int fd, short events, int64_t deadline, const volatile sig_atomic_t *cancel)
{
    for (;;) {
        int64_t left = deadline - mq_now_us();
        if (left <= 0)
            return 0;
        struct pollfd pfd = {.fd = fd, .events = events};
        int n = poll(&pfd, 1, (int)((left + 999) / 1000));
        if (n > 0)
            return 1;
        if (n == 0)
            continue; /* rounding: the loop sees the deadline */
        if (errno != EINTR) {
            mq_err_set("poll: %s", strerror(errno));
            return -1;
        }
        if (cancel && *cancel) {
            mq_err_set("interrupted");
            return -1;
        }
    }
}

/* Tries every address of U in turn until one accepts, within the deadline. */
static int s_connect(const mq_httpc_url_t *u, long timeout_ms, int64_t deadline,
                     const volatile sig_atomic_t *cancel)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(u->host, u->port, &hints, &res);
    if (rc != 0) {
        mq_err_set("cannot resolve '%s': %s", u->host,
                   rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return -1;
    }
    int fd = -1, err = 0;
    bool timed_out = false;
    for (struct addrinfo *a = res; a && fd < 0 && !timed_out; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        err = errno;
        if (err == EINPROGRESS) {
            int w = s_wait(fd, POLLOUT, deadline, cancel);
            socklen_t len = sizeof err;
            if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
                break;
            if (w == 0)
                timed_out = true;
            if (w < 0) {
                close(fd);
                freeaddrinfo(res);
                return -1;
            }
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0)
        return fd;
    if (timed_out)
        mq_err_set("no answer from %s within %ld ms", u->where, timeout_ms);
    else if (err == ECONNREFUSED)
        mq_err_set("connection refused by %s", u->where);
    else
        mq_err_set("cannot connect to %s: %s", u->where, strerror(err));
    return -1;
}

static int s_send_all(int fd, const char *buf, size_t n, const mq_httpc_url_t *u,
                      long timeout_ms, int64_t deadline, const volatile sig_atomic_t *cancel)
{
    while (n > 0) {
        ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
        if (w > 0) {
            buf += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            mq_err_set("sending the request to %s: %s", u->where, strerror(errno));
            return -1;
        }
        int r = s_wait(fd, POLLOUT, deadline, cancel);
        if (r <= 0) {
            if (r == 0)
                mq_err_set("no answer from %s within %ld ms", u->where, timeout_ms);
            return -1;
        }
    }
    return 0;
}

/* Walks a chunked body of N bytes at BUF: 1 complete, 0 more to come, -1 malformed. With
 * DECODE it also moves the data to the front of BUF (*OUT its length); without, it only
 * looks. */
static int s_dechunk(char *buf, size_t n, bool decode, size_t *out)
{
    size_t r = 0, w = 0;
    for (;;) {
        char *eol = memchr(buf + r, '\n', n - r);
        if (!eol)
            return 0;
        char *e;
        unsigned long long size = strtoull(buf + r, &e, 16);
        if (e == buf + r || (*e != ';' && *e != '\r' && *e != '\n') || size > S_MAX_BODY)
            return -1;
        r = (size_t)(eol - buf) + 1;
        if (size == 0) {
            /* Trailer lines up to an empty one. */
            for (;;) {
                char *t = memchr(buf + r, '\n', n - r);
                if (!t)
                    return 0;
                bool empty = t == buf + r || (t == buf + r + 1 && buf[r] == '\r');
                r = (size_t)(t - buf) + 1;
                if (empty) {
                    if (decode)
                        *out = w;
                    return 1;
                }
            }
        }
        if (n - r < size + 1)
            return 0;
        if (decode)
            memmove(buf + w, buf + r, size);
        w += size;
        r += size;
        if (buf[r] == '\r') {
            if (n - r < 2)
                return 0;
            r++;
        }
        if (buf[r] != '\n')
            return -1;
        r++;
    }
}

typedef struct {
    int status;
    char reason[64];
    size_t head_len; /* header bytes including the empty line */
    bool chunked;
    bool has_length;
    unsigned long long length;
} s_head_t;

/* Parses the header once it is all in BUF[0..N). 1 parsed, 0 incomplete, -1 not HTTP. */
static int s_head(const char *buf, size_t n, s_head_t *h)
{
    if (n >= 5 && strncmp(buf, "HTTP/", 5) != 0)
        return -1;
    const char *end = NULL;
    for (const char *p = buf; (p = memchr(p, '\n', (size_t)(buf + n - p))); p++) {
        if (p + 1 < buf + n && p[1] == '\n') {
            end = p + 2;
            break;
        }
        if (p + 2 < buf + n && p[1] == '\r' && p[2] == '\n') {
            end = p + 3;
            break;
        }
    }
    if (!end)
        return 0;
    memset(h, 0, sizeof *h);
    h->head_len = (size_t)(end - buf);
    int at = 0;
    if (sscanf(buf, "HTTP/%*d.%*d %3d%n", &h->status, &at) != 1 || h->status < 100)
        return -1;
    const char *reason = buf + at;
    while (*reason == ' ')
        reason++;
    size_t rn = strcspn(reason, "\r\n");
    snprintf(h->reason, sizeof h->reason, "%.*s", (int)(rn < 63 ? rn : 63), reason);
    for (char *c = h->reason; *c; c++) /* it ends up on a terminal */
        if ((unsigned char)*c < ' ' || *c == 0x7f)
            *c = '?';
    for (const char *line = (const char *)memchr(buf, '\n', h->head_len) + 1; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        size_t len = (size_t)(eol - line);
        if (len > 15 && strncasecmp(line, "content-length:", 15) == 0) {
            h->has_length = true;
            h->length = strtoull(line + 15, NULL, 10);
        } else if (len > 18 && strncasecmp(line, "transfer-encoding:", 18) == 0) {
            for (const char *c = line + 18; c + 7 <= eol; c++)
                if (strncasecmp(c, "chunked", 7) == 0)
                    h->chunked = true;
        }
        line = eol + 1;
    }
    return 1;
}

/* Why a status other than 200 came back, in the terms of this tool. */
static void s_status_error(const s_head_t *h, const mq_httpc_url_t *u, const char *token)
{
    const char *hint = "";
    if (h->status == 401 || h->status == 403)
        hint = token ? " (the bearer token was refused)"
                     : " (it wants a bearer token: --http-token-file or MQGRAD_HTTP_TOKEN)";
    else if (h->status == 404)
        hint = " (is this the scheduler's --http-port?)";
    mq_err_set("HTTP %d %s for %s from %s%s", h->status, h->reason, u->path, u->where, hint);
}

int mq_httpc_get(const mq_httpc_url_t *u, const char *token, long timeout_ms,
                 const volatile sig_atomic_t *cancel, char **body, size_t *len, int *status)
{
    *body = NULL;
    *len = 0;
    *status = 0;
    int64_t deadline = mq_now_us() + (int64_t)timeout_ms * 1000;
    int fd = s_connect(u, timeout_ms, deadline, cancel);
    if (fd < 0)
        return -1;
    bool v6 = strchr(u->host, ':') != NULL;
    char req[2048];
    int rn = snprintf(req, sizeof req,
                      "GET %s HTTP/1.1\r\nHost: %s%s%s:%s\r\nUser-Agent: mqgrad-top\r\n"
                      "Accept: text/plain\r\nConnection: close\r\n%s%s%s\r\n",
                      u->path, v6 ? "[" : "", u->host, v6 ? "]" : "", u->port,
                      token ? "Authorization: Bearer " : "", token ? token : "",
                      token ? "\r\n" : "");
    if (rn < 0 || (size_t)rn >= sizeof req) {
        mq_err_set("the request to %s does not fit in %zu bytes (token too long?)", u->where,
                   sizeof req);
        close(fd);
        return -1;
    }
    if (s_send_all(fd, req, (size_t)rn, u, timeout_ms, deadline, cancel) != 0) {
        close(fd);
        return -1;
    }
    size_t cap = 16384, n = 0;
    char *buf = malloc(cap);
    s_head_t h = {0};
    int have_head = 0, done = 0;
    while (buf && !done) {
        if (n + 1 >= cap) {
            if (cap > S_MAX_BODY + S_MAX_HEAD) {
                mq_err_set("the answer from %s is larger than %u MiB (is this /metrics?)",
                           u->where, S_MAX_BODY >> 20);
                goto fail;
            }
            char *b = realloc(buf, cap * 2);
            if (!b) {
                mq_err_set("out of memory reading the answer from %s", u->where);
                goto fail;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int w = s_wait(fd, POLLIN, deadline, cancel);
            if (w == 0)
                mq_err_set("no %s from %s within %ld ms", have_head ? "complete answer" : "answer",
                           u->where, timeout_ms);
            if (w <= 0)
                goto fail;
            continue;
        }
        if (r < 0) {
            mq_err_set("reading from %s: %s", u->where, strerror(errno));
            goto fail;
        }
        n += (size_t)r;
        buf[n] = '\0'; /* the header is parsed as a string */
        bool closed = r == 0;
        if (!have_head) {
            have_head = s_head(buf, n, &h);
            if (have_head < 0) {
                mq_err_set("%s did not answer in HTTP (is that its --http-port?)", u->where);
                goto fail;
            }
            if (have_head)
                *status = h.status;
            if (have_head && h.status != 200) {
                s_status_error(&h, u, token);
                goto fail;
            }
            if (!have_head && (closed || n > S_MAX_HEAD)) {
                mq_err_set(closed ? "%s closed the connection before a whole HTTP header"
                                  : "%s sent an HTTP header over 64 KiB",
                           u->where);
                goto fail;
            }
        }
        if (!have_head)
            continue;
        size_t got = n - h.head_len;
        if (h.chunked) {
            int c = s_dechunk(buf + h.head_len, got, false, NULL);
            if (c < 0) {
                mq_err_set("%s sent a malformed chunked body", u->where);
                goto fail;
            }
            done = c;
        } else if (h.has_length) {
            if (h.length > S_MAX_BODY) {
                mq_err_set("the answer from %s is larger than %u MiB (is this /metrics?)",
                           u->where, S_MAX_BODY >> 20);
                goto fail;
            }
            done = got >= h.length;
        }
        if (!done && closed) {
            if (h.chunked || h.has_length) {
                mq_err_set("%s closed the connection %s", u->where,
                           h.chunked ? "inside a chunked body" : "before the whole body");
                goto fail;
            }
            done = 1; /* no length: the body ends with the connection */
        }
    }
    close(fd);
    if (!buf) {
        mq_err_set("out of memory reading the answer from %s", u->where);
        return -1;
    }
    size_t body_len = n - h.head_len;
    if (h.chunked)
        s_dechunk(buf + h.head_len, body_len, true, &body_len);
    else if (h.has_length)
        body_len = (size_t)h.length;
    memmove(buf, buf + h.head_len, body_len);
    buf[body_len] = '\0';
    *body = buf;
    *len = body_len;
    return 0;
fail:
    close(fd);
    free(buf);
    return -1;
}
