/* Saving and restoring a policy bit-exactly. Layout (little-endian, fixed width, doubles
 * as their IEEE-754 bits):
 *   header  "MQPOLICY" | u32 version | u64 payload length | u32 CRC-32 of bytes 0..19 + payload
 *   payload (versions 2 and 3) spec, options, rng, counters, smoothing, window,
 *           u32 length + the policy's own section (its ops->save), history
 *   payload (version 1, still read) u32 kind (1 mqgrad, 2 fixed, 3 adaptive, 4 schedule),
 *           spec, options, i32 fixed's K, rng, ..., window, [mqgrad's section], history
 * Version 2 names the policy by its spec alone and frames the policy's section with its
 * length, so a policy's bytes are its own file's business and the framing checks it read
 * exactly them. The policy is rebuilt from the saved spec (its own options, fixed's K)
 * and the saved options, then the state is read into it. Every size in the payload is
 * checked against the options and what is left of the buffer, so a corrupt or foreign
 * buffer is refused with a message instead of being trusted. Version 3 is version 2 with
 * more in some policies' sections (learned's price feature); a section's restore reads the
 * version from its reader (mq_rl_reader_t.version), so what an older one lacks gets the
 * value that reproduces it. */
#include "rl_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MQ_RL_MAGIC "MQPOLICY"
#define MQ_RL_VERSION 3u
#define MQ_RL_VERSION_OLDEST 1u
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

void mq_rl_put(mq_rl_writer_t *w, const void *src, size_t n)
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

void mq_rl_put_u64(mq_rl_writer_t *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    mq_rl_put(w, b, 8);
}

void mq_rl_put_u32(mq_rl_writer_t *w, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    mq_rl_put(w, b, 4);
}

void mq_rl_put_i32(mq_rl_writer_t *w, int v)
{
    mq_rl_put_u32(w, (uint32_t)v);
}

void mq_rl_put_f64(mq_rl_writer_t *w, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    mq_rl_put_u64(w, u);
}

void mq_rl_put_f64s(mq_rl_writer_t *w, const double *v, size_t n)
{
    mq_rl_put_u32(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        mq_rl_put_f64(w, v[i]);
}

/* ---- reader ------------------------------------------------------------------------ */

const uint8_t *mq_rl_take(mq_rl_reader_t *r, size_t n, const char *what)
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

uint64_t mq_rl_get_u64(mq_rl_reader_t *r, const char *what)
{
    const uint8_t *b = mq_rl_take(r, 8, what);
    uint64_t v = 0;
    for (int i = 0; b && i < 8; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

uint32_t mq_rl_get_u32(mq_rl_reader_t *r, const char *what)
{
    const uint8_t *b = mq_rl_take(r, 4, what);
    uint32_t v = 0;
    for (int i = 0; b && i < 4; i++)
        v |= (uint32_t)b[i] << (8 * i);
    return v;
}

int mq_rl_get_i32(mq_rl_reader_t *r, const char *what)
{
    return (int)mq_rl_get_u32(r, what);
}

double mq_rl_get_f64(mq_rl_reader_t *r, const char *what)
{
    uint64_t u = mq_rl_get_u64(r, what);
    double v;
    memcpy(&v, &u, 8);
    return v;
}

/* An array of doubles whose stored count must be EXPECT. */
int mq_rl_get_f64s(mq_rl_reader_t *r, double *v, size_t expect, const char *what)
{
    uint32_t n = mq_rl_get_u32(r, what);
    if (r->fail)
        return 0; /* reported as a truncation by the caller */
    if (n != expect) {
        mq_err_set("policy state is inconsistent: %s has %u values, the options need %zu", what, n,
                   expect);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        v[i] = mq_rl_get_f64(r, what);
    return 0;
}

/* ---- save -------------------------------------------------------------------------- */

static void s_put_opts(mq_rl_writer_t *w, const mq_policy_opts_t *o)
{
    mq_rl_put_i32(w, o->T);
    mq_rl_put_f64(w, o->alpha);
    mq_rl_put_f64(w, o->epsilon);
    mq_rl_put_f64(w, o->eta);
    mq_rl_put_f64(w, o->discount);
    mq_rl_put_f64(w, o->gamma);
    mq_rl_put_i32(w, o->min_bits);
    mq_rl_put_i32(w, o->max_bits);
    mq_rl_put_i32(w, o->start_bits);
    mq_rl_put_i32(w, o->hidden);
    mq_rl_put_f64(w, o->tau);
    mq_rl_put_u64(w, o->seed);
    mq_rl_put_u32(w, o->literal_eq3 ? 1 : 0);
}

static void s_put_state(mq_rl_writer_t *w, const mq_policy_t *p)
{
    const mq_rl_window_t *win = &p->win;
    for (int i = 0; i < 4; i++)
        mq_rl_put_u64(w, p->rng.s[i]);
    mq_rl_put_i32(w, p->bits);
    mq_rl_put_u64(w, p->step);
    mq_rl_put_u64(w, p->last_iter);
    mq_rl_put_u64(w, p->observations);
    mq_rl_put_f64(w, p->last_reward);
    mq_rl_put_u32(w, p->have_carry);
    mq_rl_put_f64(w, p->carry);
    mq_rl_put_u32(w, p->have_scale);
    mq_rl_put_f64(w, p->scale);
    mq_rl_put_u32(w, win->open);
    mq_rl_put_u64(w, win->index);
    mq_rl_put_i32(w, win->filled);
    mq_rl_put_u32(w, win->count);
    mq_rl_put_f64(w, win->time_ms);
    mq_rl_put_u32(w, win->time_n);
    mq_rl_put_f64(w, win->range_sum);
    mq_rl_put_f64(w, win->sq_sum);
    mq_rl_put_u32(w, win->range_n);
    mq_rl_put_u32(w, win->sq_n);
    mq_rl_put_f64s(w, win->lbar, (size_t)p->o.T);
}

/* The policy's own section, framed by its length (patched once it is written). */
static void s_put_section(mq_rl_writer_t *w, const mq_policy_t *p)
{
    size_t at = w->len;
    mq_rl_put_u32(w, 0);
    if (p->ops->save)
        p->ops->save(p, w);
    if (w->oom)
        return;
    uint32_t n = (uint32_t)(w->len - at - 4);
    for (int i = 0; i < 4; i++)
        w->buf[at + i] = (uint8_t)(n >> (8 * i));
}

/* Contract: *BUF gets a malloc'd buffer of *LEN bytes holding everything P needs to go on
 * exactly as it would have (the caller frees it); 0, or -1 with a message. The same state
 * always gives the same bytes. Always the current version. */
int mq_policy_save(const mq_policy_t *p, uint8_t **buf, size_t *len)
{
    /* reserve the common part and the history up front (the history dominates a long run;
     * a policy's section may grow the buffer) */
    size_t guess = 1024 + 16 * (size_t)p->o.T + 32 * p->nhist;
    mq_rl_writer_t w = {.buf = malloc(guess), .cap = guess};
    w.oom = w.buf == NULL;
    mq_rl_put(&w, MQ_RL_MAGIC, 8);
    mq_rl_put_u32(&w, MQ_RL_VERSION);
    mq_rl_put_u64(&w, 0); /* payload length, patched below */
    mq_rl_put_u32(&w, 0); /* CRC, patched below */
    uint32_t sl = (uint32_t)strlen(p->spec);
    mq_rl_put_u32(&w, sl);
    mq_rl_put(&w, p->spec, sl);
    s_put_opts(&w, &p->o);
    s_put_state(&w, p);
    s_put_section(&w, p);
    mq_rl_put_u64(&w, p->nhist);
    for (size_t i = 0; i < p->nhist; i++) {
        const mq_decision_t *d = &p->hist[i];
        mq_rl_put_u64(&w, d->step);
        mq_rl_put_u64(&w, d->iter);
        mq_rl_put_i32(&w, d->bits);
        mq_rl_put_i32(&w, d->action);
        mq_rl_put_f64(&w, d->reward);
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

/* Magic, version, length and checksum, in that order: each failure says which. *VERSION
 * gets the version (1 to 3). */
static int s_check_header(const uint8_t *buf, size_t len, uint32_t *version_out)
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
    if (version < MQ_RL_VERSION_OLDEST || version > MQ_RL_VERSION) {
        mq_err_set("policy state version %u is not supported (this build reads versions "
                   "%u..%u)",
                   version, MQ_RL_VERSION_OLDEST, MQ_RL_VERSION);
        return -1;
    }
    *version_out = version;
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

static void s_get_opts(mq_rl_reader_t *r, mq_policy_opts_t *o)
{
    mq_policy_opts_default(o);
    o->T = mq_rl_get_i32(r, "options");
    o->alpha = mq_rl_get_f64(r, "options");
    o->epsilon = mq_rl_get_f64(r, "options");
    o->eta = mq_rl_get_f64(r, "options");
    o->discount = mq_rl_get_f64(r, "options");
    o->gamma = mq_rl_get_f64(r, "options");
    o->min_bits = mq_rl_get_i32(r, "options");
    o->max_bits = mq_rl_get_i32(r, "options");
    o->start_bits = mq_rl_get_i32(r, "options");
    o->hidden = mq_rl_get_i32(r, "options");
    o->tau = mq_rl_get_f64(r, "options");
    o->seed = mq_rl_get_u64(r, "options");
    o->literal_eq3 = mq_rl_get_u32(r, "options") != 0;
}

/* The common state; version 1 has fixed's K first, which the spec gives as well. */
static int s_get_state(mq_rl_reader_t *r, mq_policy_t *p, uint32_t version)
{
    mq_rl_window_t *w = &p->win;
    if (version == 1)
        (void)mq_rl_get_i32(r, "state");
    for (int i = 0; i < 4; i++)
        p->rng.s[i] = mq_rl_get_u64(r, "rng");
    p->bits = mq_rl_get_i32(r, "state");
    p->step = mq_rl_get_u64(r, "state");
    p->last_iter = mq_rl_get_u64(r, "state");
    p->observations = mq_rl_get_u64(r, "state");
    p->last_reward = mq_rl_get_f64(r, "state");
    p->have_carry = mq_rl_get_u32(r, "state") != 0;
    p->carry = mq_rl_get_f64(r, "state");
    p->have_scale = mq_rl_get_u32(r, "state") != 0;
    p->scale = mq_rl_get_f64(r, "state");
    w->open = mq_rl_get_u32(r, "window") != 0;
    w->index = mq_rl_get_u64(r, "window");
    w->filled = mq_rl_get_i32(r, "window");
    w->count = mq_rl_get_u32(r, "window");
    w->time_ms = mq_rl_get_f64(r, "window");
    w->time_n = mq_rl_get_u32(r, "window");
    w->range_sum = mq_rl_get_f64(r, "window");
    w->sq_sum = mq_rl_get_f64(r, "window");
    w->range_n = mq_rl_get_u32(r, "window");
    w->sq_n = mq_rl_get_u32(r, "window");
    return mq_rl_get_f64s(r, w->lbar, (size_t)p->o.T, "window losses");
}

/* The policy's own section: framed by its length from version 2, which it must fill exactly;
 * in version 1 only mqgrad had one, unframed, which its restore reads as it is. */
static int s_get_section(mq_rl_reader_t *r, mq_policy_t *p, uint32_t version)
{
    const mq_policy_ops_t *ops = p->ops;
    if (r->fail)
        return 0; /* reported as a truncation by the caller */
    if (version == 1) {
        mq_rl_reader_t sub = {.buf = r->buf + r->pos, .len = r->len - r->pos, .version = 1};
        if (ops->restore && ops->restore(p, &sub) != 0)
            return -1;
        r->pos += sub.pos;
        r->fail = sub.fail;
        return 0;
    }
    uint32_t n = mq_rl_get_u32(r, "policy section");
    const uint8_t *at = mq_rl_take(r, n, "policy section");
    if (!at)
        return 0; /* reported as a truncation by the caller */
    mq_rl_reader_t sub = {.buf = at, .len = n, .version = version};
    if (ops->restore && ops->restore(p, &sub) != 0)
        return -1;
    if (sub.fail) {
        mq_err_set("policy state is inconsistent: %s's section ends inside the %s", ops->name,
                   sub.fail);
        return -1;
    }
    if (sub.pos != n) {
        mq_err_set("policy state is inconsistent: %zu bytes left in %s's section", n - sub.pos,
                   ops->name);
        return -1;
    }
    return 0;
}

static int s_get_history(mq_rl_reader_t *r, mq_policy_t *p)
{
    uint64_t n = mq_rl_get_u64(r, "history");
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
        d.step = mq_rl_get_u64(r, "history");
        d.iter = mq_rl_get_u64(r, "history");
        d.bits = mq_rl_get_i32(r, "history");
        d.action = mq_rl_get_i32(r, "history");
        d.reward = mq_rl_get_f64(r, "history");
        if (mq_rl_history_push(p, &d) != 0)
            return -1;
    }
    return 0;
}

/* Values the code relies on (indices, ranges) must make sense even with a good checksum;
 * the policy's own ones were checked by its restore. */
static int s_check_values(const mq_policy_t *p)
{
    const mq_policy_opts_t *o = &p->o;
    const char *bad = NULL;
    if (p->bits < 1 || p->bits > 8)
        bad = "current bits outside 1..8";
    else if (p->win.filled < 0 || p->win.filled > o->T)
        bad = "window fill outside 0..T";
    else if (p->win.open && p->win.count == 0)
        bad = "an open window without observations";
    else if (p->win.open &&
             (p->observations == 0 || p->win.index != p->last_iter / (uint64_t)o->T ||
              p->win.filled > (int)(p->last_iter % (uint64_t)o->T) + 1))
        bad = "an open window that does not hold the last iteration";
    else if (p->win.time_n > p->win.count || p->win.range_n > p->win.count ||
             p->win.sq_n > p->win.count)
        bad = "window statistics counted more often than observations";
    else if (p->nhist != p->step)
        bad = "history length differs from the step count";
    if (bad) {
        mq_err_set("policy state is inconsistent: %s", bad);
        return -1;
    }
    return 0;
}

/* Version 1 named the policy by number as well as by its spec: they must agree. */
static int s_check_kind(uint32_t kind, const char *spec)
{
    static const char *const names[] = {"mqgrad", "fixed", "adaptive", "schedule"};
    size_t n = strcspn(spec, ":");
    if (kind < 1 || kind > 4 || strlen(names[kind - 1]) != n ||
        strncmp(names[kind - 1], spec, n) != 0) {
        mq_err_set("policy state is inconsistent: unknown policy kind %u for spec '%s'", kind,
                   spec);
        return -1;
    }
    return 0;
}

/* Reads the payload (header already checked) into a new policy. */
static mq_policy_t *s_read_payload(mq_rl_reader_t *r, uint32_t version)
{
    uint32_t kind = version == 1 ? mq_rl_get_u32(r, "kind") : 0;
    uint32_t sl = mq_rl_get_u32(r, "spec");
    if (!r->fail && sl >= MQ_RL_MAX_SPEC) {
        mq_err_set("policy state is inconsistent: spec longer than %d bytes", MQ_RL_MAX_SPEC - 1);
        return NULL;
    }
    const uint8_t *at = mq_rl_take(r, sl, "spec");
    mq_policy_opts_t o;
    s_get_opts(r, &o);
    if (r->fail) {
        mq_err_set("policy state is inconsistent: the payload ends inside the %s", r->fail);
        return NULL;
    }
    char spec[MQ_RL_MAX_SPEC];
    memcpy(spec, at, sl);
    spec[sl] = '\0';
    if (version == 1 && s_check_kind(kind, spec) != 0)
        return NULL;
    if (mq_rl_validate_opts(&o) != 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mq_err_last());
        mq_err_set("policy state holds invalid options: %s", msg);
        return NULL;
    }
    mq_policy_t *p = mq_rl_build(spec, &o, true);
    if (!p) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", mq_err_last());
        mq_err_set("policy state holds a spec this build refuses: %s", msg);
        return NULL;
    }
    if (s_get_state(r, p, version) != 0 || s_get_section(r, p, version) != 0 ||
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

/* Contract: rebuilds the policy saved in BUF[0..LEN) by this version or an older one still
 * read; the result continues exactly as the saved one would have. NULL with a message
 * saying what is wrong (truncated, bad magic, unsupported version, checksum mismatch,
 * inconsistent sizes or values, a spec this build refuses). */
mq_policy_t *mq_policy_restore(const uint8_t *buf, size_t len)
{
    uint32_t version;
    if (s_check_header(buf, len, &version) != 0)
        return NULL;
    mq_rl_reader_t r = {.buf = buf + MQ_RL_HEADER, .len = len - MQ_RL_HEADER, .version = version};
    return s_read_payload(&r, version);
}
