/* Saving and restoring a policy bit-exactly. Layout (little-endian, fixed width, doubles
 * as their IEEE-754 bits):
 *   header  "MQPOLICY" | u32 version | u64 payload length | u32 CRC-32 of bytes 0..19 + payload
 *   payload kind, spec, options, counters, rng, smoothing, window, [mqgrad: MDP state and
 *           weights], history
 * Every size in the payload is checked against the options and what is left of the buffer,
 * so a corrupt or foreign buffer is refused with a message instead of being trusted. */
#include "rl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MQ_RL_MAGIC "MQPOLICY"
#define MQ_RL_VERSION 1u
#define MQ_RL_HEADER 24

/* Byte-at-a-time with a table built on the stack: 2048 shifts per call, no shared state,
 * about eight times faster than bit-at-a-time on a large history. */
uint32_t mq_rl_crc32(uint32_t crc, const uint8_t *buf, size_t len)
{
    uint32_t table[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        table[i] = c;
    }
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = (crc >> 8) ^ table[(crc ^ buf[i]) & 0xFFu];
    return ~crc;
}

/* ---- writer ------------------------------------------------------------------------ */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    bool oom;
} s_writer_t;

static void s_put(s_writer_t *w, const void *src, size_t n)
{
    if (w->oom)
        return;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 1024;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b) {
            w->oom = true;
            return;
        }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, src, n);
    w->len += n;
}

static void s_put_u64(s_writer_t *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    s_put(w, b, 8);
}

static void s_put_u32(s_writer_t *w, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    s_put(w, b, 4);
}

static void s_put_i32(s_writer_t *w, int v)
{
    s_put_u32(w, (uint32_t)v);
}

static void s_put_f64(s_writer_t *w, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    s_put_u64(w, u);
}

static void s_put_f64s(s_writer_t *w, const double *v, size_t n)
{
    s_put_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        s_put_f64(w, v[i]);
}

/* ---- reader ------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *buf;
    size_t len, pos;
    const char *fail; /* first field that did not fit */
} s_reader_t;

static const uint8_t *s_take(s_reader_t *r, size_t n, const char *what)
{
    if (r->fail)
        return NULL;
    if (r->len - r->pos < n) {
        r->fail = what;
        return NULL;
    }
    const uint8_t *p = r->buf + r->pos;
    r->pos += n;
    return p;
}

static uint64_t s_get_u64(s_reader_t *r, const char *what)
{
    const uint8_t *b = s_take(r, 8, what);
    uint64_t v = 0;
    for (int i = 0; b && i < 8; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static uint32_t s_get_u32(s_reader_t *r, const char *what)
{
    const uint8_t *b = s_take(r, 4, what);
    uint32_t v = 0;
    for (int i = 0; b && i < 4; i++)
        v |= (uint32_t)b[i] << (8 * i);
    return v;
}

static int s_get_i32(s_reader_t *r, const char *what)
{
    return (int)s_get_u32(r, what);
}

static double s_get_f64(s_reader_t *r, const char *what)
{
    uint64_t u = s_get_u64(r, what);
    double v;
    memcpy(&v, &u, 8);
    return v;
}

/* An array of doubles whose stored count must be EXPECT. */
static int s_get_f64s(s_reader_t *r, double *v, size_t expect, const char *what)
{
    uint32_t n = s_get_u32(r, what);
    if (r->fail)
        return 0; /* reported as a truncation by the caller */
    if (n != expect) {
        mq_err_set("policy state is inconsistent: %s has %u values, the options need %zu", what, n,
                   expect);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = s_get_f64(r, what);
    return 0;
}

/* ---- save -------------------------------------------------------------------------- */

static void s_put_opts(s_writer_t *w, const mq_policy_opts_t *o)
{
    s_put_i32(w, o->T);
    s_put_f64(w, o->alpha);
    s_put_f64(w, o->epsilon);
    s_put_f64(w, o->eta);
    s_put_f64(w, o->discount);
    s_put_f64(w, o->gamma);
    s_put_i32(w, o->min_bits);
    s_put_i32(w, o->max_bits);
    s_put_i32(w, o->start_bits);
    s_put_i32(w, o->hidden);
    s_put_f64(w, o->tau);
    s_put_u64(w, o->seed);
    s_put_u32(w, o->literal_eq3 ? 1 : 0);
}

static void s_put_state(s_writer_t *w, const mq_policy_t *p)
{
    const mq_rl_window_t *win = &p->win;
    s_put_i32(w, p->fixed_bits);
    for (int i = 0; i < 4; i++)
        s_put_u64(w, p->rng.s[i]);
    s_put_i32(w, p->bits);
    s_put_u64(w, p->step);
    s_put_u64(w, p->last_iter);
    s_put_u64(w, p->observations);
    s_put_f64(w, p->last_reward);
    s_put_u32(w, p->have_carry);
    s_put_f64(w, p->carry);
    s_put_u32(w, p->have_scale);
    s_put_f64(w, p->scale);
    s_put_u32(w, win->open);
    s_put_u64(w, win->index);
    s_put_i32(w, win->filled);
    s_put_u32(w, win->count);
    s_put_f64(w, win->time_ms);
    s_put_u32(w, win->time_n);
    s_put_f64(w, win->range_sum);
    s_put_f64(w, win->sq_sum);
    s_put_u32(w, win->range_n);
    s_put_u32(w, win->sq_n);
    s_put_f64s(w, win->lbar, (size_t)p->o.T);
}

static void s_put_mqgrad(s_writer_t *w, const mq_policy_t *p)
{
    const mq_rl_qnet_t *net = &p->net;
    s_put_u32(w, p->have_state);
    s_put_i32(w, p->n);
    s_put_i32(w, p->action);
    s_put_f64s(w, p->x, (size_t)p->o.T);
    s_put_i32(w, net->in);
    s_put_i32(w, net->hidden);
    s_put_i32(w, net->out);
    s_put_f64s(w, net->w1, (size_t)net->hidden * net->in);
    s_put_f64s(w, net->b1, (size_t)net->hidden);
    s_put_f64s(w, net->w2, (size_t)net->out * net->hidden);
    s_put_f64s(w, net->b2, (size_t)net->out);
}

/* Contract: *BUF gets a malloc'd buffer of *LEN bytes holding everything P needs to go on
 * exactly as it would have (the caller frees it); 0, or -1 with a message. The same state
 * always gives the same bytes. */
int mq_policy_save(const mq_policy_t *p, uint8_t **buf, size_t *len)
{
    /* reserve the whole size up front: the history dominates and is known */
    size_t guess = 1024 + 16 * (size_t)p->o.T +
                   8 * ((size_t)p->net.hidden * (p->net.in + p->net.out + 1) + p->net.out) +
                   32 * p->nhist;
    s_writer_t w = {.buf = malloc(guess), .cap = guess};
    w.oom = w.buf == NULL;
    s_put(&w, MQ_RL_MAGIC, 8);
    s_put_u32(&w, MQ_RL_VERSION);
    s_put_u64(&w, 0); /* payload length, patched below */
    s_put_u32(&w, 0); /* CRC, patched below */
    s_put_u32(&w, (uint32_t)p->kind);
    uint32_t sl = (uint32_t)strlen(p->spec);
    s_put_u32(&w, sl);
    s_put(&w, p->spec, sl);
    s_put_opts(&w, &p->o);
    s_put_state(&w, p);
    if (p->kind == MQ_POLICY_MQGRAD)
        s_put_mqgrad(&w, p);
    s_put_u64(&w, p->nhist);
    for (size_t i = 0; i < p->nhist; i++) {
        const mq_decision_t *d = &p->hist[i];
        s_put_u64(&w, d->step);
        s_put_u64(&w, d->iter);
        s_put_i32(&w, d->bits);
        s_put_i32(&w, d->action);
        s_put_f64(&w, d->reward);
    }
    if (w.oom) {
        free(w.buf);
        mq_err_set("out of memory saving the policy state");
        return -1;
    }
    uint64_t pl = w.len - MQ_RL_HEADER;
    for (int i = 0; i < 8; i++)
        w.buf[12 + i] = (uint8_t)(pl >> (8 * i));
    uint32_t crc = mq_rl_crc32(0, w.buf, 20);
    crc = mq_rl_crc32(crc, w.buf + MQ_RL_HEADER, (size_t)pl);
    for (int i = 0; i < 4; i++)
        w.buf[20 + i] = (uint8_t)(crc >> (8 * i));
    *buf = w.buf;
    *len = w.len;
    return 0;
}

/* ---- restore ----------------------------------------------------------------------- */

static uint64_t s_le(const uint8_t *b, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* Magic, version, length and checksum, in that order: each failure says which. */
static int s_check_header(const uint8_t *buf, size_t len)
{
    if (!buf || len < MQ_RL_HEADER) {
        mq_err_set("policy state is truncated: %zu bytes, shorter than the %d-byte header", len,
                   MQ_RL_HEADER);
        return -1;
    }
    if (memcmp(buf, MQ_RL_MAGIC, 8) != 0) {
        mq_err_set("not a policy state: bad magic (expected \"%s\")", MQ_RL_MAGIC);
        return -1;
    }
    uint32_t version = (uint32_t)s_le(buf + 8, 4);
    if (version != MQ_RL_VERSION) {
        mq_err_set("policy state version %u is not supported (this build reads version %u)",
                   version, MQ_RL_VERSION);
        return -1;
    }
    uint64_t pl = s_le(buf + 12, 8);
    if (pl > len - MQ_RL_HEADER) {
        mq_err_set("policy state is truncated: the header promises %llu payload bytes, %zu are "
                   "present",
                   (unsigned long long)pl, len - MQ_RL_HEADER);
        return -1;
    }
    if (pl < len - MQ_RL_HEADER) {
        mq_err_set("policy state has %zu unexpected bytes after its payload",
                   len - MQ_RL_HEADER - (size_t)pl);
        return -1;
    }
    uint32_t stored = (uint32_t)s_le(buf + 20, 4);
    uint32_t crc = mq_rl_crc32(mq_rl_crc32(0, buf, 20), buf + MQ_RL_HEADER, (size_t)pl);
    if (crc != stored) {
        mq_err_set("policy state checksum mismatch (stored %08x, computed %08x): the data is "
                   "corrupt",
                   stored, crc);
        return -1;
    }
    return 0;
}

static void s_get_opts(s_reader_t *r, mq_policy_opts_t *o)
{
    mq_policy_opts_default(o);
    o->T = s_get_i32(r, "options");
    o->alpha = s_get_f64(r, "options");
    o->epsilon = s_get_f64(r, "options");
    o->eta = s_get_f64(r, "options");
    o->discount = s_get_f64(r, "options");
    o->gamma = s_get_f64(r, "options");
    o->min_bits = s_get_i32(r, "options");
    o->max_bits = s_get_i32(r, "options");
    o->start_bits = s_get_i32(r, "options");
    o->hidden = s_get_i32(r, "options");
    o->tau = s_get_f64(r, "options");
    o->seed = s_get_u64(r, "options");
    o->literal_eq3 = s_get_u32(r, "options") != 0;
}

static int s_get_state(s_reader_t *r, mq_policy_t *p)
{
    mq_rl_window_t *w = &p->win;
    p->fixed_bits = s_get_i32(r, "state");
    for (int i = 0; i < 4; i++)
        p->rng.s[i] = s_get_u64(r, "rng");
    p->bits = s_get_i32(r, "state");
    p->step = s_get_u64(r, "state");
    p->last_iter = s_get_u64(r, "state");
    p->observations = s_get_u64(r, "state");
    p->last_reward = s_get_f64(r, "state");
    p->have_carry = s_get_u32(r, "state") != 0;
    p->carry = s_get_f64(r, "state");
    p->have_scale = s_get_u32(r, "state") != 0;
    p->scale = s_get_f64(r, "state");
    w->open = s_get_u32(r, "window") != 0;
    w->index = s_get_u64(r, "window");
    w->filled = s_get_i32(r, "window");
    w->count = s_get_u32(r, "window");
    w->time_ms = s_get_f64(r, "window");
    w->time_n = s_get_u32(r, "window");
    w->range_sum = s_get_f64(r, "window");
    w->sq_sum = s_get_f64(r, "window");
    w->range_n = s_get_u32(r, "window");
    w->sq_n = s_get_u32(r, "window");
    return s_get_f64s(r, w->lbar, (size_t)p->o.T, "window losses");
}

static int s_get_mqgrad(s_reader_t *r, mq_policy_t *p)
{
    mq_rl_qnet_t *net = &p->net;
    p->have_state = s_get_u32(r, "MDP state") != 0;
    p->n = s_get_i32(r, "MDP state");
    p->action = s_get_i32(r, "MDP state");
    if (s_get_f64s(r, p->x, (size_t)p->o.T, "state input") != 0)
        return -1;
    int in = s_get_i32(r, "network"), hidden = s_get_i32(r, "network");
    int out = s_get_i32(r, "network");
    if (!r->fail && (in != net->in || hidden != net->hidden || out != net->out)) {
        mq_err_set("policy state is inconsistent: a %d-%d-%d network, the options need %d-%d-%d",
                   in, hidden, out, net->in, net->hidden, net->out);
        return -1;
    }
    if (s_get_f64s(r, net->w1, (size_t)net->hidden * net->in, "network w1") != 0 ||
        s_get_f64s(r, net->b1, (size_t)net->hidden, "network b1") != 0 ||
        s_get_f64s(r, net->w2, (size_t)net->out * net->hidden, "network w2") != 0 ||
        s_get_f64s(r, net->b2, (size_t)net->out, "network b2") != 0)
        return -1;
    return 0;
}

static int s_get_history(s_reader_t *r, mq_policy_t *p)
{
    uint64_t n = s_get_u64(r, "history");
    if (r->fail)
        return 0;
    if (n > (r->len - r->pos) / 32) {
        mq_err_set("policy state is inconsistent: %llu history entries announced, room for %zu",
                   (unsigned long long)n, (r->len - r->pos) / 32);
        return -1;
    }
    if (n > 0) {
        p->hist = malloc((size_t)n * sizeof *p->hist);
        if (!p->hist) {
            mq_err_set("out of memory for %llu history entries", (unsigned long long)n);
            return -1;
        }
        p->cap = (size_t)n;
    }
    for (uint64_t i = 0; i < n; i++) {
        mq_decision_t d;
        d.step = s_get_u64(r, "history");
        d.iter = s_get_u64(r, "history");
        d.bits = s_get_i32(r, "history");
        d.action = s_get_i32(r, "history");
        d.reward = s_get_f64(r, "history");
        if (mq_rl_history_push(p, &d) != 0)
            return -1;
    }
    return 0;
}

/* Values the code relies on (indices, ranges) must make sense even with a good checksum. */
static int s_check_values(const mq_policy_t *p)
{
    const mq_policy_opts_t *o = &p->o;
    const char *bad = NULL;
    if (p->bits < 1 || p->bits > 8)
        bad = "current bits outside 1..8";
    else if (p->kind == MQ_POLICY_FIXED && (p->fixed_bits < 1 || p->fixed_bits > 8))
        bad = "fixed:K with K outside 1..8";
    else if (p->win.filled < 0 || p->win.filled > o->T)
        bad = "window fill outside 0..T";
    else if (p->win.open && p->win.count == 0)
        bad = "an open window without observations";
    else if (p->win.time_n > p->win.count || p->win.range_n > p->win.count ||
             p->win.sq_n > p->win.count)
        bad = "window statistics counted more often than observations";
    else if (p->kind == MQ_POLICY_MQGRAD && p->have_state &&
             (p->n < o->min_bits || p->n > o->max_bits || p->action < 0 || p->action > 1 ||
              p->n + p->action > o->max_bits))
        bad = "MDP state n_t/a_t outside the bit range";
    else if (p->nhist != p->step)
        bad = "history length differs from the step count";
    if (bad) {
        mq_err_set("policy state is inconsistent: %s", bad);
        return -1;
    }
    return 0;
}

/* Reads the payload (header already checked) into a new policy. */
static mq_policy_t *s_read_payload(s_reader_t *r)
{
    uint32_t kind = s_get_u32(r, "kind"), sl = s_get_u32(r, "spec");
    if (!r->fail && (kind < MQ_POLICY_MQGRAD || kind > MQ_POLICY_SCHEDULE || sl >= 64)) {
        mq_err_set("policy state is inconsistent: %s",
                   sl >= 64 ? "spec longer than 63 bytes" : "unknown policy kind");
        return NULL;
    }
    const uint8_t *spec = s_take(r, sl, "spec");
    mq_policy_opts_t o;
    s_get_opts(r, &o);
    if (r->fail) {
        mq_err_set("policy state is inconsistent: the payload ends inside the %s", r->fail);
        return NULL;
    }
    if (mq_rl_validate_opts(&o) != 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mq_err_last());
        mq_err_set("policy state holds invalid options: %s", msg);
        return NULL;
    }
    mq_policy_t *p = mq_rl_alloc((mq_policy_kind_t)kind, &o);
    if (!p)
        return NULL;
    memcpy(p->spec, spec, sl);
    p->spec[sl] = '\0';
    if (s_get_state(r, p) != 0 || (p->kind == MQ_POLICY_MQGRAD && s_get_mqgrad(r, p) != 0) ||
        s_get_history(r, p) != 0)
        goto err;
    if (r->fail) {
        mq_err_set("policy state is inconsistent: the payload ends inside the %s", r->fail);
        goto err;
    }
    if (r->pos != r->len) {
        mq_err_set("policy state is inconsistent: %zu bytes left after the history",
                   r->len - r->pos);
        goto err;
    }
    if (s_check_values(p) != 0)
        goto err;
    return p;
err:
    mq_policy_destroy(&p);
    return NULL;
}

/* Contract: rebuilds the policy saved in BUF[0..LEN); the result continues exactly as the
 * saved one would have. NULL with a message saying what is wrong (truncated, bad magic,
 * unsupported version, checksum mismatch, inconsistent sizes or values). */
mq_policy_t *mq_policy_restore(const uint8_t *buf, size_t len)
{
    if (s_check_header(buf, len) != 0)
        return NULL;
    s_reader_t r = {.buf = buf + MQ_RL_HEADER, .len = len - MQ_RL_HEADER};
    return s_read_payload(&r);
}
