/* The agent's state file: the current policy, the stashed mqgrad policy (so swapping back
 * resumes what it learned) and the agent's counters, framed with a magic, a format version
 * and a CRC so that a damaged or foreign file is recognized and refused, never half-read. */
#include "agent_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define S_MAGIC "MQAGENT"
#define S_FORMAT 1
#define S_FLAG_STASH 1u
#define S_HEADER (8 + 4 + 4 + 4 * 8)

static void s_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void s_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t s_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t s_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Contract: see agent_internal.h. */
int mq_agent_state_pack(const mq_policy_t *cur, const mq_policy_t *stash,
                        const mq_agent_counters_t *c, uint8_t **buf, size_t *len)
{
    uint8_t *pc = NULL, *ps = NULL, *out = NULL;
    size_t lc = 0, ls = 0;
    if (mq_policy_save(cur, &pc, &lc) != 0)
        goto err;
    if (stash && mq_policy_save(stash, &ps, &ls) != 0)
        goto err;
    size_t total = S_HEADER + 8 + lc + (stash ? 8 + ls : 0) + 4;
    out = malloc(total);
    if (!out) {
        mq_err_set("out of memory for a %zu-byte agent state", total);
        goto err;
    }
    uint8_t *p = out;
    memcpy(p, S_MAGIC, 8);
    s_put32(p + 8, S_FORMAT);
    s_put32(p + 12, stash ? S_FLAG_STASH : 0);
    s_put64(p + 16, c->decisions);
    s_put64(p + 24, c->observations);
    s_put64(p + 32, c->swaps);
    s_put64(p + 40, c->fallbacks);
    p += S_HEADER;
    s_put64(p, lc);
    memcpy(p + 8, pc, lc);
    p += 8 + lc;
    if (stash) {
        s_put64(p, ls);
        memcpy(p + 8, ps, ls);
        p += 8 + ls;
    }
    s_put32(p, (uint32_t)crc32(0L, out, (uInt)(p - out)));
    free(pc);
    free(ps);
    *buf = out;
    *len = total;
    return 0;
err:
    free(pc);
    free(ps);
    free(out);
    return -1;
}

/* Reads one length-prefixed policy at *P (END bounds it) and advances *P. */
static mq_policy_t *s_unpack_policy(const uint8_t **p, const uint8_t *end, const char *what)
{
    if (end - *p < 8) {
        mq_err_set("truncated before the %s policy", what);
        return NULL;
    }
    uint64_t n = s_get64(*p);
    if (n > (uint64_t)(end - *p - 8)) {
        mq_err_set("the %s policy claims %llu bytes, only %td are left", what,
                   (unsigned long long)n, end - *p - 8);
        return NULL;
    }
    mq_policy_t *pol = mq_policy_restore(*p + 8, (size_t)n);
    if (!pol) {
        char why[512];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("the %s policy cannot be restored: %s", what, why);
        return NULL;
    }
    *p += 8 + n;
    return pol;
}

/* Contract: see agent_internal.h. */
int mq_agent_state_unpack(const uint8_t *buf, size_t len, mq_policy_t **cur, mq_policy_t **stash,
                          mq_agent_counters_t *c)
{
    mq_policy_t *pc = NULL, *ps = NULL;
    if (len < S_HEADER + 4 || memcmp(buf, S_MAGIC, 8) != 0) {
        mq_err_set("not an mqgrad agent state file (%s)",
                   len < S_HEADER + 4 ? "too short" : "wrong magic bytes");
        return -1;
    }
    uint32_t format = s_get32(buf + 8), flags = s_get32(buf + 12);
    if (format != S_FORMAT) {
        mq_err_set("state format version %u, this agent reads version %u", format, S_FORMAT);
        return -1;
    }
    uint32_t want = s_get32(buf + len - 4);
    uint32_t have = (uint32_t)crc32(0L, buf, (uInt)(len - 4));
    if (want != have) {
        mq_err_set("checksum mismatch (file damaged or truncated): stored %08x, computed %08x",
                   want, have);
        return -1;
    }
    const uint8_t *p = buf + S_HEADER, *end = buf + len - 4;
    if (!(pc = s_unpack_policy(&p, end, "current")))
        return -1;
    if ((flags & S_FLAG_STASH) && !(ps = s_unpack_policy(&p, end, "stashed mqgrad")))
        goto err;
    if (p != end) {
        mq_err_set("%td unexpected bytes after the policies", end - p);
        goto err;
    }
    c->decisions = s_get64(buf + 16);
    c->observations = s_get64(buf + 24);
    c->swaps = s_get64(buf + 32);
    c->fallbacks = s_get64(buf + 40);
    *cur = pc;
    *stash = ps;
    return 0;
err:
    mq_policy_destroy(&pc);
    mq_policy_destroy(&ps);
    return -1;
}

/* Contract: see agent_internal.h. */
int mq_agent_state_load(const char *path, mq_policy_t **cur, mq_policy_t **stash,
                        mq_agent_counters_t *c)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT)
            return 1;
        mq_err_set("state file %s: %s", path, strerror(errno));
        return -1;
    }
    char *data;
    size_t len;
    if (mq_read_file(path, &data, &len) != 0) {
        char why[600];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("state file %s cannot be read: %s", path, why);
        return -1;
    }
    int rc = mq_agent_state_unpack((const uint8_t *)data, len, cur, stash, c);
    free(data);
    if (rc != 0) {
        char why[600];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("state file %s is unusable: %s", path, why);
        return -1;
    }
    return 0;
}

/* Contract: see agent.h. */
int mq_agent_state_end_episode(const char *path, double **returns, size_t *n)
{
    mq_policy_t *cur = NULL, *stash = NULL;
    mq_agent_counters_t c;
    *returns = NULL, *n = 0;
    int rc = mq_agent_state_load(path, &cur, &stash, &c);
    if (rc != 0) {
        if (rc == 1)
            mq_err_set("state file %s does not exist", path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    rc = 0;
    if (mq_policy_episodic(cur)) {
        const double *r;
        rc = mq_policy_new_episode(cur);
        size_t k = rc == 0 ? mq_policy_returns(cur, &r) : 0;
        if (rc == 0 && k > 0 && !(*returns = malloc(k * sizeof **returns))) {
            mq_err_set("out of memory");
            rc = -1;
        }
        if (rc == 0 && k > 0) {
            memcpy(*returns, r, k * sizeof **returns);
            *n = k;
        }
        if (rc == 0 && (mq_agent_state_pack(cur, stash, &c, &buf, &len) != 0 ||
                        mq_write_file_atomic(path, buf, len) != 0)) {
            char why[600];
            snprintf(why, sizeof why, "%s", mq_err_last());
            mq_err_set("state file %s: %s", path, why);
            rc = -1;
        }
    }
    if (rc != 0) {
        free(*returns);
        *returns = NULL, *n = 0;
    }
    free(buf);
    mq_policy_destroy(&cur);
    mq_policy_destroy(&stash);
    return rc;
}

/* ---- background saver ---------------------------------------------------------------- */

static void s_write(const char *path, zmsg_t *msg, bool *failing)
{
    zframe_t *f = zmsg_first(msg);
    int64_t t0 = mq_now_us();
    if (mq_write_file_atomic(path, zframe_data(f), zframe_size(f)) != 0) {
        if (!*failing)
            mq_error("cannot save the state: %s (learning goes on; retried at the next "
                     "decision)",
                     mq_err_last());
        *failing = true;
        return;
    }
    if (*failing)
        mq_info("state file %s written again", path);
    *failing = false;
    mq_debug("state saved: %zu bytes in %.2f ms", zframe_size(f),
             (double)(mq_now_us() - t0) / 1000.0);
}

/* The saver actor: writes each state it is given, in order; when several wait, only the
 * newest is written. $TERM writes what is pending first, so nothing given is lost. */
static void s_saver(zsock_t *pipe, void *args)
{
    const char *path = args;
    mq_log_set_tag("agent");
    zsock_signal(pipe, 0);
    zmsg_t *latest = NULL;
    bool failing = false;
    for (;;) {
        zmsg_t *m = zmsg_recv(pipe);
        if (!m)
            break;
        char *cmd = zmsg_popstr(m);
        bool state = cmd && streq(cmd, "STATE") && zmsg_size(m) == 1;
        zstr_free(&cmd);
        if (!state) {
            zmsg_destroy(&m);
            break; /* $TERM */
        }
        zmsg_destroy(&latest);
        latest = m;
        if (zsock_events(pipe) & ZMQ_POLLIN)
            continue; /* a newer state is already waiting */
        s_write(path, latest, &failing);
        zmsg_destroy(&latest);
    }
    if (latest)
        s_write(path, latest, &failing);
    zmsg_destroy(&latest);
}

/* Contract: see agent_internal.h. */
zactor_t *mq_agent_saver_new(const char *path)
{
    zactor_t *a = zactor_new(s_saver, (void *)path);
    if (!a)
        mq_err_set("cannot start the state saver thread");
    return a;
}

/* Contract: see agent_internal.h. */
void mq_agent_saver_put(zactor_t *saver, uint8_t *buf, size_t len)
{
    zmsg_t *m = zmsg_new();
    zmsg_addstr(m, "STATE");
    zmsg_addmem(m, buf, len);
    free(buf);
    if (zmsg_send(&m, saver) != 0) {
        mq_error("cannot hand the state to the saver thread");
        zmsg_destroy(&m);
    }
}
