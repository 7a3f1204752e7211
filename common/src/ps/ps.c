/* Shard plans, zero-copy send buffers, links and their clocks, and endpoint advertising: the pieces
 * the scheduler, servers and workers share without knowing protobuf. */
#include "mqgrad/ps.h"

#include <arpa/inet.h>
#include <assert.h>
#include <ctype.h>
#include <errno.h>
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
    if (nservers == 0 || nservers > n) {
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

mq_codec_t mq_segment_codec(const mq_segment_t *seg, int bits, const mq_codec_t *base)
{
    if (!seg->quantized)
        return mq_codec_none();
    return mq_codec_with_bits(base, bits);
}

static bool s_bits_ok(const mq_codec_ops_t *ops, int bits)
{
    if (ops && ops->max_bits > 0)
        return bits >= ops->min_bits && bits <= ops->max_bits;
    return bits >= MQ_QUANT_MIN_BITS && bits <= MQ_QUANT_MAX_BITS;
}

bool mq_bits_ok(const mq_codec_t *base, int bits)
{
    return s_bits_ok(mq_codec_ops(base), bits);
}

int mq_widths_at(const mq_widths_t *w, uint32_t tensor)
{
    return tensor < w->n ? w->per[tensor] : w->bits;
}

bool mq_widths_equal(const mq_widths_t *a, const mq_widths_t *b)
{
    return a->bits == b->bits && a->n == b->n && memcmp(a->per, b->per, a->n) == 0;
}

int mq_widths_read(mq_widths_t *w, const mq_codec_ops_t *ops, bool fp32, int bits,
                   const uint32_t *list, uint32_t n, uint32_t ntensors)
{
    if (fp32 ? bits != 32 : !s_bits_ok(ops, bits)) {
        mq_err_set("level %d is not one the run's codec takes", bits);
        return -1;
    }
    if (n != 0 && (n != ntensors || n > MQ_WIRE_MAX_TENSORS)) {
        mq_err_set("%u per-tensor levels for a layout of %u tensors", n, ntensors);
        return -1;
    }
    w->bits = bits;
    w->n = n;
    for (uint32_t t = 0; t < n; t++) {
        if (fp32 ? list[t] != 32 : !s_bits_ok(ops, (int)list[t])) {
            mq_err_set("tensor %u's level %u is not one the run's codec takes", t, list[t]);
            return -1;
        }
        w->per[t] = (uint8_t)list[t];
    }
    return 0;
}

void mq_widths_write(const mq_widths_t *w, uint32_t *list, uint32_t *n)
{
    for (uint32_t t = 0; t < w->n; t++)
        list[t] = w->per[t];
    *n = w->n;
}

/* C, whose table is OPS, at level BITS (mq_codec_with_bits without the lookup): none at 32,
 * unchanged for a codec that takes no level. */
static mq_codec_t s_at_level(const mq_codec_t *c, const mq_codec_ops_t *ops, int bits)
{
    mq_codec_t at = bits >= 32 ? mq_codec_none() : *c;
    if (bits < 32 && ops->max_bits > 0)
        at.bits = bits;
    return at;
}

int mq_shard_check(const mq_shard_t *shard, const mq_msg_t *msg, const mq_widths_t *w,
                   const mq_codec_t *run, const mq_codec_ops_t *ops)
{
    if (msg->ntensors != shard->nsegs) {
        mq_err_set("%u tensors, shard has %u segments", msg->ntensors, shard->nsegs);
        return -1;
    }
    const mq_codec_t none = mq_codec_none();
    for (uint32_t i = 0; i < shard->nsegs; i++) {
        const mq_segment_t *s = &shard->segs[i];
        const mq_tensor_hdr_t *h = &msg->tensors[i];
        mq_codec_t want = s->quantized ? s_at_level(run, ops, mq_widths_at(w, s->tensor)) : none;
        if (strcmp(h->name, s->name) != 0 || h->offset != s->offset || h->count != s->count) {
            mq_err_set("tensor %u is %s[%llu+%llu], expected %s[%llu+%llu]", i, h->name,
                       (unsigned long long)h->offset, (unsigned long long)h->count, s->name,
                       (unsigned long long)s->offset, (unsigned long long)s->count);
            return -1;
        }
        char why[2 * MQ_CODEC_MAX_SPEC + 32];
        if (!mq_codec_check(&h->codec, &want, ops, why, sizeof why)) {
            mq_err_set("tensor %s: %s", h->name, why);
            return -1;
        }
    }
    return 0;
}

/* ---- the segment recipes ----------------------------------------------------------- */

#define S_BUF_TIMEOUT_MS 5000

int mq_seg_coder_init(mq_seg_coder_t *coder, const mq_segment_t *seg, const mq_codec_t *c)
{
    mq_codec_t codec = seg->quantized ? *c : mq_codec_none();
    const mq_codec_ops_t *ops = mq_codec_resolve(&codec, seg->count);
    if (!ops)
        return -1;
    coder->codec = codec;
    coder->ops = ops;
    return 0;
}

int mq_ps_encode_segment(const mq_segment_t *seg, mq_seg_coder_t *coder, int bits,
                         const float *values, mq_sendbuf_t *ref, float *residual, float *clear,
                         mq_rng_t *rng, float lr, mq_tensor_hdr_t *h, mq_payload_t *out,
                         mq_codec_stats_t *stats)
{
    const mq_codec_ops_t *ops = coder->ops;
    mq_codec_t c = coder->codec;
    assert(ops); /* mq_seg_coder_init */
    if (residual && residual != values) {
        mq_err_set("%s: error feedback runs in place (the residual must be the values)", seg->name);
        return -1;
    }
    if (clear && (clear != values || residual)) {
        mq_err_set("%s: only the values themselves are cleared, and not a residual", seg->name);
        return -1;
    }
    if (ops->max_bits > 0 && bits < 32 && (bits < ops->min_bits || bits > ops->max_bits)) {
        mq_err_set("codec %s: %d bits (expected %d..%d)", ops->name, bits, ops->min_bits,
                   ops->max_bits);
        return -1;
    }
    snprintf(h->name, sizeof h->name, "%s", seg->name);
    h->offset = seg->offset;
    h->count = seg->count;
    c = s_at_level(&c, ops, bits);
    h->codec = c;
    if (c.id == MQ_CODEC_ID_none) { /* straight from the caller's floats, no copy */
        if (stats)
            stats->sq = 0.0; /* fp32 segments are not what the norms watch */
        *out = mq_sendbuf_payload(ref, values, seg->count * sizeof(float));
        return 0;
    }
    size_t need = ops->max_size(&c, seg->count), len;
    size_t nstate = ops->state_floats ? ops->state_floats(&c, seg->count) : 0;
    if (mq_sendbuf_acquire(&coder->buf, need, S_BUF_TIMEOUT_MS) != 0)
        return -1;
    if (nstate > coder->nstate) { /* once per segment and codec, not per iteration */
        float *st = realloc(coder->state, nstate * sizeof *st);
        if (!st) {
            mq_err_set("out of memory for %zu floats of codec state", nstate);
            return -1;
        }
        memset(st + coder->nstate, 0, (nstate - coder->nstate) * sizeof *st);
        coder->state = st;
        coder->nstate = nstate;
    }
    assert(rng || !ops->stochastic || !ops->stochastic(&c));
    mq_codec_ctx_t ctx = {.rng = rng, .state = coder->state, .lr = lr, .clear = clear};
    bool ef = residual && nstate == 0; /* else the codec keeps its own residual */
    if (mq_codec_encode_resolved(ops, &c, ef ? NULL : values, ef ? residual : NULL, seg->count,
                                 &ctx, coder->buf.data, &len, stats) != 0)
        return -1;
    h->payload_len = len;
    *out = mq_sendbuf_payload(&coder->buf, NULL, len);
    return 0;
}

void mq_seg_coder_release(mq_seg_coder_t *coder)
{
    if (!coder)
        return;
    mq_sendbuf_release(&coder->buf);
    free(coder->state);
    coder->state = NULL;
    coder->nstate = 0;
}

void mq_ps_apply(const mq_optim_t *o, const mq_codec_t *c, const uint8_t *payload, size_t len,
                 float *w, size_t n, float *scratch, float *state, float lr, uint64_t t,
                 mq_codec_stats_t *stats)
{
    if (mq_optim_is_sgd(o)) {
        mq_codec_decode_valid(c, payload, len, w, n, -lr, true, stats);
        return;
    }
    mq_codec_decode_valid(c, payload, len, scratch, n, 1.0f, false, stats);
    o->ops->apply(o, w, scratch, state, n, lr, t);
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

/* ---- link schedules ------------------------------------------------------------------ */

#define S_MAX_PARTS 16

typedef struct {
    int role; /* 0: every node, 1: workers, 2: servers */
    int rank; /* -1: every rank of the role */
    mq_link_rate_t rate;
} s_part_t;

static int s_spec_err(char *err, size_t len, const char *part, const char *why)
{
    if (err && len)
        snprintf(err, len, "link schedule part '%s': %s", part, why);
    return -1;
}

/* A number from *P to the next delimiter; the rest of the text from there in *P. */
static bool s_spec_num(const char **p, double *v)
{
    char *end;
    if (!isdigit((unsigned char)**p) && **p != '.')
        return false;
    *v = strtod(*p, &end);
    if (end == *p || !isfinite(*v))
        return false;
    *p = end;
    return true;
}

/* SCHEDULE (ps.h) in TEXT, of the part PART (for messages). */
static int s_spec_schedule(const char *text, const char *part, mq_link_rate_t *r, char *err,
                           size_t len)
{
    memset(r, 0, sizeof *r);
    const char *p = text;
    double period = 0;
    for (;;) {
        double mbps, at = 0;
        if (!s_spec_num(&p, &mbps))
            return s_spec_err(err, len, part, "expected a rate in Mbit/s");
        if (*p == '@') {
            p++;
            if (!s_spec_num(&p, &at))
                return s_spec_err(err, len, part, "expected a time in seconds after '@'");
        } else if (r->n > 0) {
            return s_spec_err(err, len, part, "every step after the first needs @SECONDS");
        }
        if (r->n == MQ_LINK_MAX_STEPS)
            return s_spec_err(err, len, part, "more than 16 steps");
        if (r->n == 0 && at != 0)
            return s_spec_err(err, len, part, "the first step must start at 0");
        if (r->n > 0 && at < r->step[r->n - 1].at + 1e-3)
            return s_spec_err(err, len, part,
                              "each step's time must be after the one before (by 1 ms or more)");
        if (at > 1e7)
            return s_spec_err(err, len, part, "a time must be at most 10000000 s");
        if (mbps == 0 && (r->n > 0 || *p != '\0'))
            return s_spec_err(err, len, part, "a rate of 0 (no emulation) must stand alone");
        if (mbps != 0 && (mbps < 1e-3 || mbps > 1e6))
            return s_spec_err(err, len, part, "a rate must be in [0.001, 1000000] Mbit/s");
        if (mbps == 0)
            return 0; /* no emulation: n = 0 */
        r->step[r->n++] = (mq_link_step_t){.at = at, .bytes_per_s = mbps * 1e6 / 8.0};
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '/') {
            p++;
            if (!s_spec_num(&p, &period) || *p != '\0')
                return s_spec_err(err, len, part, "expected a period in seconds after '/'");
            if (period < r->step[r->n - 1].at + 1e-3 || period > 1e7)
                return s_spec_err(err, len, part, "the period must be after the last step (by 1 "
                                                  "ms or more) and at most 10000000 s");
            if (r->n < 2)
                return s_spec_err(err, len, part, "a period repeats two steps or more");
        }
        if (*p != '\0')
            return s_spec_err(err, len, part, "unexpected text after a step");
        r->period = period;
        return 0;
    }
}

/* Every part of SPEC into PARTS (*N of them). */
static int s_spec_parse(const char *spec, s_part_t *parts, int *n, char *err, size_t len)
{
    *n = 0;
    if (!spec || !*spec)
        return s_spec_err(err, len, "", "empty");
    if (strlen(spec) >= MQ_LINK_MAX_SPEC)
        return s_spec_err(err, len, "", "longer than 255 characters");
    char buf[MQ_LINK_MAX_SPEC];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *part = strtok_r(buf, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
        if (*n == S_MAX_PARTS)
            return s_spec_err(err, len, part, "more than 16 parts");
        s_part_t *pt = &parts[*n];
        pt->role = 0;
        pt->rank = -1;
        const char *sched = part;
        char *eq = strchr(part, '=');
        if (eq) {
            *eq = '\0';
            sched = eq + 1;
            char *colon = strchr(part, ':');
            if (colon)
                *colon = '\0';
            if (strcmp(part, "worker") == 0)
                pt->role = 1;
            else if (strcmp(part, "server") == 0)
                pt->role = 2;
            else
                return s_spec_err(err, len, part, "expected worker, server, worker:RANK or "
                                                  "server:RANK before '='");
            if (colon) {
                char *end;
                errno = 0;
                long r = strtol(colon + 1, &end, 10);
                if (end == colon + 1 || *end || errno || r < 0 || r > 1000000)
                    return s_spec_err(err, len, colon + 1, "expected a rank (0, 1, ...)");
                pt->rank = (int)r;
                *colon = ':';
            }
            *eq = '=';
        }
        if (s_spec_schedule(sched, part, &pt->rate, err, len) != 0)
            return -1;
        for (int k = 0; k < *n; k++)
            if (parts[k].role == pt->role && parts[k].rank == pt->rank)
                return s_spec_err(err, len, part, "names the same nodes as an earlier part");
        (*n)++;
    }
    if (*n == 0)
        return s_spec_err(err, len, spec, "no schedule");
    return 0;
}

int mq_link_spec_check(const char *spec, char *err, size_t len)
{
    s_part_t parts[S_MAX_PARTS];
    int n;
    return s_spec_parse(spec, parts, &n, err, len);
}

int mq_link_rate_for(const char *spec, const char *role, int rank, mq_link_rate_t *out,
                     char *err, size_t len)
{
    s_part_t parts[S_MAX_PARTS];
    int n;
    if (s_spec_parse(spec, parts, &n, err, len) != 0)
        return -1;
    int want = strcmp(role, "worker") == 0 ? 1 : strcmp(role, "server") == 0 ? 2 : 0;
    const s_part_t *best = NULL;
    int best_score = -1;
    for (int k = 0; k < n; k++) {
        const s_part_t *p = &parts[k];
        int score = p->role == 0 ? 0 : p->role != want ? -1 : p->rank < 0 ? 1 : p->rank == rank ? 2 : -1;
        if (score > best_score)
            best = p, best_score = score;
    }
    if (best)
        *out = best->rate;
    else
        mq_link_rate_const(out, 0);
    return 0;
}

void mq_link_rate_const(mq_link_rate_t *out, double mbps)
{
    memset(out, 0, sizeof *out);
    if (mbps > 0)
        out->step[out->n++] = (mq_link_step_t){.at = 0, .bytes_per_s = mbps * 1e6 / 8.0};
}

/* The step in force at T (*I) and the start of T's period (*BASE; 0 without a period). */
static void s_locate(const mq_link_rate_t *r, double t, uint32_t *i, double *base)
{
    double w = t;
    *base = 0;
    if (r->period > 0) {
        *base = floor(t / r->period) * r->period;
        w = t - *base;
    }
    uint32_t k = 0;
    while (k + 1 < r->n && r->step[k + 1].at <= w)
        k++;
    *i = k;
}

/* The end of step I of the period starting at BASE. */
static double s_step_end(const mq_link_rate_t *r, uint32_t i, double base)
{
    if (i + 1 < r->n)
        return base + r->step[i + 1].at;
    return r->period > 0 ? base + r->period : INFINITY;
}

/* The bytes one period carries. */
static double s_period_bytes(const mq_link_rate_t *r)
{
    double b = 0;
    for (uint32_t i = 0; i < r->n; i++)
        b += (s_step_end(r, i, 0) - r->step[i].at) * r->step[i].bytes_per_s;
    return b;
}

double mq_link_rate_mbps(const mq_link_rate_t *r, double t)
{
    if (r->n == 0)
        return 0;
    uint32_t i;
    double base;
    s_locate(r, t, &i, &base);
    return r->step[i].bytes_per_s * 8.0 / 1e6;
}

double mq_link_rate_finish(const mq_link_rate_t *r, double t, double bytes)
{
    if (r->n == 0 || bytes <= 0)
        return t;
    if (r->n == 1)
        return t + bytes / r->step[0].bytes_per_s;
    uint32_t i;
    double base;
    s_locate(r, t, &i, &base);
    /* At most a period's steps, whole periods at once, then less than a period's bytes; only a
     * time so large that a step is lost in its rounding gets further: the mean rate then. */
    for (uint32_t guard = 0; guard < 3 * r->n + 3; guard++) {
        double end = s_step_end(r, i, base), rate = r->step[i].bytes_per_s;
        if (bytes <= (end - t) * rate)
            return t + bytes / rate;
        bytes -= (end - t) * rate;
        t = end;
        if (++i == r->n) { /* a new period: whole periods at once */
            i = 0;
            base += r->period;
            double per = s_period_bytes(r), k = floor(bytes / per);
            if (k >= 1) {
                base += k * r->period;
                t += k * r->period;
                bytes -= k * per;
            }
        }
    }
    return t + bytes * r->period / s_period_bytes(r);
}

double mq_link_rate_start(const mq_link_rate_t *r, double t, double bytes)
{
    if (r->n == 0 || bytes <= 0)
        return t;
    if (r->n == 1)
        return t - bytes / r->step[0].bytes_per_s;
    uint32_t i;
    double base;
    s_locate(r, t, &i, &base);
    for (uint32_t guard = 0; guard < 3 * r->n + 3; guard++) { /* as mq_link_rate_finish */
        double from = i == 0 && r->period <= 0 ? -INFINITY : base + r->step[i].at;
        double rate = r->step[i].bytes_per_s;
        if (bytes <= (t - from) * rate)
            return t - bytes / rate;
        bytes -= (t - from) * rate;
        t = from;
        if (i-- == 0) { /* the period before: whole periods at once */
            i = r->n - 1;
            base -= r->period;
            double per = s_period_bytes(r), k = floor(bytes / per);
            if (k >= 1) {
                base -= k * r->period;
                t -= k * r->period;
                bytes -= k * per;
            }
        }
    }
    return t - bytes * r->period / s_period_bytes(r);
}

/* ---- links and clocks ---------------------------------------------------------------- */

void mq_link_init_rate(mq_link_t *link, const mq_link_rate_t *rate, bool simulated)
{
    memset(link, 0, sizeof *link);
    link->rate = *rate;
    link->simulated = simulated;
    link->cpu_mark = simulated ? mq_thread_cpu_s() : 0;
    link->origin = simulated ? 0 : mq_now_s();
}

void mq_link_init(mq_link_t *link, double mbps, bool simulated)
{
    mq_link_rate_t r;
    mq_link_rate_const(&r, mbps);
    mq_link_init_rate(link, &r, simulated);
}

int mq_link_setup(mq_link_t *link, const mq_run_config_t *r, const char *role, uint32_t rank)
{
    mq_link_rate_t rate;
    char err[256];
    if (!r->link[0])
        mq_link_rate_const(&rate, r->link_mbps);
    else if (mq_link_rate_for(r->link, role, (int)rank, &rate, err, sizeof err) != 0) {
        mq_err_set("the run's %s", err);
        return -1;
    }
    mq_link_init_rate(link, &rate, r->simulated_clock);
    return 0;
}

void mq_link_anchor(mq_link_t *link, double run_time)
{
    if (!link->simulated)
        link->origin = mq_now_s() - run_time;
}

bool mq_link_enabled(const mq_link_t *link)
{
    return link->rate.n > 0;
}

double mq_link_mbps_now(mq_link_t *link)
{
    return mq_link_rate_mbps(&link->rate, mq_link_now(link) - link->origin);
}

double mq_link_now(mq_link_t *link)
{
    if (!link->simulated)
        return mq_now_s();
    return link->sim_now + (mq_thread_cpu_s() - link->cpu_mark);
}

/* Simulated: the node's time is T from now on. */
static void s_set(mq_link_t *link, double t)
{
    link->sim_now = t;
    link->cpu_mark = mq_thread_cpu_s();
}

/* The real clock's buckets run on mq_now_s() (CLOCK_MONOTONIC), which starts at each host's
 * boot; a stamp that travels (mq_link_egress_async) is on the wall clock (CLOCK_REALTIME),
 * which hosts share to within NTP's milliseconds. This is the wall clock less the monotonic
 * one, now. */
static double s_wall_offset(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 - mq_now_s();
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

/* Whether a message of DUR seconds on the link, stamped LOCAL on this host's monotonic clock
 * (which reads NOW), can be taken at its stamp: its last byte leaves at most the
 * other shards of its sender's push ahead of it (one per server), plus a second for hosts' clocks
 * that disagree. A stamp past that (or over an hour old) comes from a clock not synchronised with
 * this one, or from a bad peer: the message is taken as arriving now, and no receiver sleeps for
 * it. */
#define S_SHARDS_AHEAD 64 /* shards of one push whose bytes may queue before a message's */
static bool s_stamp_trusted(double local, double dur, double now)
{
    return local - now <= S_SHARDS_AHEAD * dur + 1.0 && now - local <= 3600.0;
}

/* The ingress model: a message of BYTES whose last byte left at STAMP streamed in during the
 * `dur` seconds before it, unless the link was still busy; returns when it is all in. */
static double s_ingress_at(mq_link_t *link, size_t bytes, double stamp)
{
    if (!mq_link_enabled(link))
        return stamp;
    mq_bucket_t *b = &link->ingress;
    const mq_link_rate_t *r = &link->rate;
    double o = link->origin, from = o + mq_link_rate_start(r, stamp - o, (double)bytes);
    b->next_free = o + mq_link_rate_finish(r, fmax(b->next_free, from) - o, (double)bytes);
    return b->next_free;
}

/* Both sends: BYTES queue on the egress behind the bytes before it; returns when their last
 * byte leaves, on the node's clock (now, without a rate). A sender woken late from its last
 * sleep (preempted, overslept) has not lost link time it was owed: the credit is used once. */
static double s_egress_queue(mq_link_t *link, size_t bytes)
{
    link->bytes_out += bytes;
    mq_bucket_t *b = &link->egress;
    double now = mq_link_now(link), o = link->origin;
    if (!mq_link_enabled(link))
        return now;
    double start = fmax(b->next_free, now - b->overslept);
    b->next_free = o + mq_link_rate_finish(&link->rate, start - o, (double)bytes);
    b->overslept = 0;
    return b->next_free;
}

double mq_link_egress(mq_link_t *link, size_t bytes)
{
    double done = s_egress_queue(link, bytes);
    if (link->simulated) {
        s_set(link, done); /* the sender is blocked until its last byte is out */
        return done;
    }
    if (!mq_link_enabled(link))
        return 0;
    s_sleep_until(done);
    link->egress.overslept = fmax(0, mq_now_s() - done);
    return 0;
}

double mq_link_egress_async(mq_link_t *link, size_t bytes)
{
    double done = s_egress_queue(link, bytes); /* the node's time stays: the sender goes on */
    if (link->simulated)
        return done;
    return mq_link_enabled(link) ? done + s_wall_offset() : 0;
}

void mq_link_arrive(mq_link_t *link, size_t bytes, double stamp)
{
    link->bytes_in += bytes;
    if (!link->simulated) {
        if (!mq_link_enabled(link))
            return;
        double now = mq_now_s(), at = now, local = stamp - s_wall_offset();
        double dur = mq_link_rate_finish(&link->rate, now - link->origin, (double)bytes) -
                     (now - link->origin);
        if (stamp <= 0) /* a blocking send: its last byte left as it was taken */
            ;
        else if (s_stamp_trusted(local, dur, now))
            at = local;
        else if (!link->untrusted++)
            mq_warn("link emulation: a message stamped %.3f s from this host's clock, more than "
                    "its sender could have queued (are the hosts' clocks synchronised?): taken "
                    "as arriving now; further ones are not reported",
                    local - now);
        s_sleep_until(s_ingress_at(link, bytes, at));
        return;
    }
    if (link->npending == MQ_LINK_MAX_PENDING)
        mq_link_settle(link); /* more than a round can hold: charge what is in so far */
    link->pending[link->npending] = (mq_arrival_t){
        .stamp = stamp, .cpu = mq_thread_cpu_s(), .bytes = bytes, .seq = link->npending};
    link->npending++;
}

static int s_by_stamp(const void *a, const void *b)
{
    const mq_arrival_t *x = a, *y = b;
    if (x->stamp != y->stamp)
        return x->stamp < y->stamp ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

double mq_link_settle(mq_link_t *link)
{
    if (!link->simulated)
        return mq_now_s();
    uint32_t n = link->npending;
    if (n == 0)
        return mq_link_now(link);
    mq_arrival_t *p = link->pending;
    double cpu_now = mq_thread_cpu_s();
    /* The node's own work before the first message, then each message's share of the CPU:
     * from its taking to the next one's (in the order they were taken). */
    double t = link->sim_now + (p[0].cpu - link->cpu_mark);
    for (uint32_t i = 0; i < n; i++)
        p[i].cpu = (i + 1 < n ? p[i + 1].cpu : cpu_now) - p[i].cpu;
    qsort(p, n, sizeof *p, s_by_stamp); /* ties in the order taken */
    for (uint32_t i = 0; i < n; i++)
        t = fmax(t, s_ingress_at(link, p[i].bytes, p[i].stamp)) + p[i].cpu;
    link->npending = 0;
    link->sim_now = t;
    link->cpu_mark = cpu_now;
    return t;
}

void mq_link_sync(mq_link_t *link, double stamp)
{
    if (link->simulated)
        s_set(link, fmax(mq_link_now(link), stamp));
}

double mq_link_pause(mq_link_t *link)
{
    link->paused = mq_link_now(link);
    return link->paused;
}

void mq_link_resume(mq_link_t *link)
{
    if (link->simulated)
        s_set(link, link->paused);
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
