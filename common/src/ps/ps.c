/* Shard plans, zero-copy send buffers, link emulation and endpoint advertising: the pieces
 * the scheduler, servers and workers share without knowing protobuf. */
#include "mqgrad/ps.h"

#include <arpa/inet.h>
#include <math.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mqgrad/util.h"

int mq_shard_plan(const mq_model_t *m, uint32_t nservers, uint64_t threshold, bool fp32,
                  mq_shard_t *shards)
{
    uint64_t n = mq_model_nparams(m);
    if (nservers == 0 || nservers > MQ_WIRE_MAX_SERVERS || nservers > n) {
        mq_err_set("cannot cut %llu parameters into %u shards", (unsigned long long)n,
                   nservers);
        return -1;
    }
    for (uint32_t s = 0; s < nservers; s++) {
        mq_shard_t *sh = &shards[s];
        sh->begin = n * s / nservers;
        sh->end = n * (s + 1) / nservers;
        sh->nsegs = 0;
        for (size_t t = 0; t < mq_model_ntensors(m); t++) {
            const mq_tensor_view_t *v = mq_model_tensor(m, t);
            uint64_t lo = v->offset > sh->begin ? v->offset : sh->begin;
            uint64_t hi = v->offset + v->count < sh->end ? v->offset + v->count : sh->end;
            if (lo >= hi)
                continue;
            if (sh->nsegs == MQ_WIRE_MAX_TENSORS) {
                mq_err_set("shard %u would need more than %d segments", s,
                           MQ_WIRE_MAX_TENSORS);
                return -1;
            }
            sh->segs[sh->nsegs++] = (mq_segment_t){
                .tensor = (uint32_t)t,
                .name = v->name,
                .offset = lo - v->offset,
                .count = hi - lo,
                .flat = lo,
                .quantized = !fp32 && v->count >= threshold,
            };
        }
    }
    return 0;
}

mq_codec_t mq_segment_codec(const mq_segment_t *seg, int bits, const mq_run_config_t *cfg)
{
    if (!seg->quantized || bits >= 32)
        return (mq_codec_t){.kind = MQ_CODEC_NONE, .bits = 32};
    return (mq_codec_t){.kind = MQ_CODEC_UNIFORM,
                        .bits = bits,
                        .bucket = cfg->bucket,
                        .stochastic = cfg->stochastic};
}

int mq_shard_check(const mq_shard_t *shard, const mq_msg_t *msg, int bits,
                   const mq_run_config_t *cfg)
{
    if (msg->ntensors != shard->nsegs) {
        mq_err_set("%u tensors, shard has %u segments", msg->ntensors, shard->nsegs);
        return -1;
    }
    for (uint32_t i = 0; i < shard->nsegs; i++) {
        const mq_segment_t *s = &shard->segs[i];
        const mq_tensor_hdr_t *h = &msg->tensors[i];
        mq_codec_t want = mq_segment_codec(s, bits, cfg);
        if (strcmp(h->name, s->name) != 0 || h->offset != s->offset || h->count != s->count) {
            mq_err_set("tensor %u is %s[%llu+%llu], expected %s[%llu+%llu]", i, h->name,
                       (unsigned long long)h->offset, (unsigned long long)h->count, s->name,
                       (unsigned long long)s->offset, (unsigned long long)s->count);
            return -1;
        }
        if (h->codec.kind != want.kind || h->codec.bits != want.bits ||
            h->codec.bucket != want.bucket || h->codec.stochastic != want.stochastic) {
            mq_err_set("tensor %s: codec kind %d bits %d bucket %u, expected %d/%d/%u", h->name,
                       h->codec.kind, h->codec.bits, h->codec.bucket, want.kind, want.bits,
                       want.bucket);
            return -1;
        }
    }
    return 0;
}

/* ---- send buffers ------------------------------------------------------------------ */

static void s_sendbuf_unref(void *data, void *hint)
{
    (void)data;
    mq_sendbuf_t *buf = hint;
    atomic_fetch_sub_explicit(&buf->refs, 1, memory_order_release);
}

int mq_sendbuf_acquire(mq_sendbuf_t *buf, size_t need, int timeout_ms)
{
    double deadline = mq_now_s() + timeout_ms / 1000.0;
    while (atomic_load_explicit(&buf->refs, memory_order_acquire) > 0) {
        if (mq_now_s() > deadline) {
            mq_err_set("a send buffer is still in use by ZeroMQ after %d ms", timeout_ms);
            return -1;
        }
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    if (need > buf->cap) {
        /* Grows only when the bit width rises: a handful of times per run. */
        uint8_t *bigger = realloc(buf->data, need);
        if (!bigger) {
            mq_err_set("out of memory for a %zu-byte send buffer", need);
            return -1;
        }
        buf->data = bigger;
        buf->cap = need;
    }
    return 0;
}

mq_payload_t mq_sendbuf_payload(mq_sendbuf_t *buf, const void *data, size_t len)
{
    atomic_fetch_add_explicit(&buf->refs, 1, memory_order_relaxed);
    return (mq_payload_t){
        .data = data ? data : buf->data, .len = len, .free_fn = s_sendbuf_unref, .hint = buf};
}

void mq_sendbuf_release(mq_sendbuf_t *buf)
{
    if (!buf)
        return;
    mq_sendbuf_acquire(buf, 0, 5000);
    free(buf->data);
    buf->data = NULL;
    buf->cap = 0;
}

/* ---- link emulation ---------------------------------------------------------------- */

void mq_link_init(mq_link_t *link, double mbps)
{
    memset(link, 0, sizeof *link);
    double rate = mbps > 0 ? mbps * 1e6 / 8.0 : 0;
    link->egress.bytes_per_s = rate;
    link->ingress.bytes_per_s = rate;
}

bool mq_link_enabled(const mq_link_t *link)
{
    return link->egress.bytes_per_s > 0;
}

static void s_sleep_until(double t)
{
    double now = mq_now_s();
    if (t <= now)
        return;
    double d = t - now;
    struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

void mq_link_egress(mq_link_t *link, size_t bytes)
{
    link->bytes_out += bytes;
    mq_bucket_t *b = &link->egress;
    if (b->bytes_per_s <= 0)
        return;
    double now = mq_now_s();
    /* A sender woken late (preempted, overslept) has not lost link time it was owed. */
    double start = fmax(b->next_free, now - b->overslept);
    b->next_free = start + (double)bytes / b->bytes_per_s;
    s_sleep_until(b->next_free);
    b->overslept = fmax(0, mq_now_s() - b->next_free);
}

void mq_link_ingress(mq_link_t *link, size_t bytes)
{
    link->bytes_in += bytes;
    mq_bucket_t *b = &link->ingress;
    if (b->bytes_per_s <= 0)
        return;
    double now = mq_now_s();
    double dur = (double)bytes / b->bytes_per_s;
    /* The message streamed in during the last `dur` seconds unless the link was busy. */
    double start = b->next_free > now - dur ? b->next_free : now - dur;
    b->next_free = start + dur;
    s_sleep_until(b->next_free);
}

/* ---- endpoints --------------------------------------------------------------------- */

int mq_bind(zsock_t *sock, const char *endpoint, int *port)
{
    if (zsock_bind(sock, "%s", endpoint) < 0) {
        mq_err_set("cannot bind '%s': %s", endpoint, zmq_strerror(zmq_errno()));
        return -1;
    }
    char *last = zsock_last_endpoint(sock);
    const char *colon = last ? strrchr(last, ':') : NULL;
    *port = colon ? atoi(colon + 1) : 0;
    zstr_free(&last);
    return 0;
}

int mq_advertise_endpoint(const char *bound, char *out, size_t len)
{
    const char *colon = strrchr(bound, ':');
    if (strncmp(bound, "tcp://", 6) != 0 || !colon || colon < bound + 6) {
        snprintf(out, len, "%s", bound);
        return 0;
    }
    char host[256];
    snprintf(host, sizeof host, "%.*s", (int)(colon - (bound + 6)), bound + 6);
    if (strcmp(host, "*") != 0 && strcmp(host, "0.0.0.0") != 0) {
        snprintf(out, len, "%s", bound);
        return 0;
    }
    char name[256], addr[64] = "127.0.0.1";
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (gethostname(name, sizeof name) == 0 && getaddrinfo(name, NULL, &hints, &res) == 0) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            struct sockaddr_in *sin = (struct sockaddr_in *)ai->ai_addr;
            inet_ntop(AF_INET, &sin->sin_addr, addr, sizeof addr);
            if (strncmp(addr, "127.", 4) != 0)
                break;
        }
        freeaddrinfo(res);
    }
    if (snprintf(out, len, "tcp://%s%s", addr, colon) >= (int)len) {
        mq_err_set("endpoint too long");
        return -1;
    }
    return 0;
}
