/* fuzz_agent_state: the agent's state file as the agent reads it at start
 * (services/agent/agent_state.c, mq_agent_state_load: framing, counters, CRC) and the policy
 * states inside it (common/src/rl/persist.c, mq_policy_restore: header, options, window,
 * each policy's own section, history, the value checks).
 *
 * An input starting with "MQPOLICY" is one saved policy; any other is a whole state file.
 * Both checksums (the file's CRC-32 and each policy's) are recomputed over the input before
 * it is read, so mutations reach the fields behind them; the input is also read as it is,
 * checksums included. The file goes through the real loader (a file in a tmpfs directory).
 * A state that loads is then used as the agent uses one: status, history, observations, a
 * new episode, adopt; and packed again, which must read back and pack to the same bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "agent_internal.h"
#include "fuzz_util.h"
#include "mqgrad/rl.h"

#define S_HEADER 48 /* agent_state.c: magic, format, flags, four counters */
#define S_POLICY_HEADER 24 /* persist.c: magic, version, payload length, CRC */

static char s_path[512];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    mq_fuzz_path("agent.state", s_path, sizeof s_path);
    mq_policy_t *cur = NULL, *stash = NULL;
    mq_agent_counters_t c;
    if (mq_agent_state_load(s_path, &cur, &stash, &c) != 1)
        mq_fuzz_fail("fuzz_agent_state: a missing state file is not \"new\"");
    return 0;
}

static uint64_t s_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void s_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Sets the CRC of the saved policy at B[0..LEN) to what its bytes give. */
static void s_fix_policy(uint8_t *b, size_t len)
{
    if (len < S_POLICY_HEADER || memcmp(b, "MQPOLICY", 8) != 0)
        return;
    uint64_t pl = s_le(b + 12, 8);
    if (pl > len - S_POLICY_HEADER)
        pl = len - S_POLICY_HEADER;
    uLong crc = crc32(0L, b, 20);
    crc = crc32(crc, b + S_POLICY_HEADER, (uInt)pl);
    s_put32(b + 20, (uint32_t)crc);
}

/* Sets every checksum of the state file B[0..LEN): each policy's, then the file's. */
static void s_fix_state(uint8_t *b, size_t len)
{
    if (len < S_HEADER + 4)
        return;
    uint8_t *p = b + S_HEADER, *end = b + len - 4;
    for (int k = 0; k < 2 && end - p >= 8; k++) {
        uint64_t n = s_le(p, 8);
        size_t left = (size_t)(end - p - 8);
        s_fix_policy(p + 8, n < left ? (size_t)n : left);
        if (n > left)
            break;
        p += 8 + n;
    }
    s_put32(b + len - 4, (uint32_t)crc32(0L, b, (uInt)(len - 4)));
}

/* Packs and restores twice: the second pack must equal the first. */
static void s_roundtrip(const mq_policy_t *cur, const mq_policy_t *stash,
                        const mq_agent_counters_t *c)
{
    uint8_t *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    mq_policy_t *cur2 = NULL, *stash2 = NULL;
    mq_agent_counters_t c2;
    if (mq_agent_state_pack(cur, stash, c, &a, &la) != 0)
        mq_fuzz_fail("fuzz_agent_state: a loaded state does not pack: %s", mq_err_last());
    if (mq_agent_state_unpack(a, la, &cur2, &stash2, &c2) != 0) {
        mq_fuzz_fail("fuzz_agent_state: a loaded state packs to one that does not load: %s",
                     mq_err_last());
    }
    if (mq_agent_state_pack(cur2, stash2, &c2, &b, &lb) != 0)
        mq_fuzz_fail("fuzz_agent_state: a reloaded state does not pack: %s", mq_err_last());
    if (la != lb || memcmp(a, b, la) != 0) {
        mq_fuzz_fail("fuzz_agent_state: pack(restore(pack(state))) differs from pack(state) "
                     "(%zu and %zu bytes)", la, lb);
    }
    free(a);
    free(b);
    mq_policy_destroy(&cur2);
    mq_policy_destroy(&stash2);
}

/* What the agent does with a restored policy: reads its status and history, feeds it
 * observations after its last iteration, starts an episode, lets a fresh one adopt it. */
static void s_use(mq_policy_t *p)
{
    mq_policy_status_t st;
    mq_policy_status(p, &st);
    const mq_decision_t *hist;
    const double *ret;
    volatile size_t sink = mq_policy_history(p, &hist) + mq_policy_returns(p, &ret);
    for (int i = 0; i < 12; i++) {
        mq_observation_t o = {
            .iter = st.iter + 1 + (uint64_t)i,
            .loss = 2.0 / (1.0 + i),
            .iter_ms = 100 + i,
            .grad_sqmean = 1e-4,
            .grad_range = 0.1,
            .total_iters = 1000,
            .progress = 0.01 * i,
            .bits = st.bits,
            .loss_smoothed = 2.0,
            .grad_norm = 1.0,
            .sent_norm = 1.1,
            .update_norm = 0.9,
        };
        int bits = mq_policy_observe(p, &o);
        if (bits < 1 || bits > 32) {
            mq_fuzz_fail("fuzz_agent_state: a restored policy answered %d bits: %s", bits,
                         mq_err_last());
        }
    }
    mq_policy_status(p, &st);
    if (mq_policy_episodic(p)) {
        mq_policy_t *fresh = mq_policy_new(st.spec, NULL);
        if (fresh) {
            sink += (size_t)mq_policy_adopt(fresh, p);
            mq_policy_destroy(&fresh);
        }
    }
    sink += (size_t)mq_policy_new_episode(p);
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mq_policy_t *cur = NULL, *stash = NULL;
    mq_agent_counters_t c;
    /* as it is: the checksums refuse almost everything, and must not crash doing so */
    if (mq_agent_state_unpack(data, size, &cur, &stash, &c) == 0) {
        mq_policy_destroy(&cur);
        mq_policy_destroy(&stash);
    }
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        abort();
    memcpy(buf, data, size);
    if (size >= 8 && memcmp(buf, "MQPOLICY", 8) == 0) {
        s_fix_policy(buf, size);
        cur = mq_policy_restore(buf, size);
        free(buf);
        if (!cur)
            return 0;
        c = (mq_agent_counters_t){0};
        s_roundtrip(cur, NULL, &c);
        s_use(cur);
        mq_policy_destroy(&cur);
        return 0;
    }
    s_fix_state(buf, size);
    mq_fuzz_write(s_path, buf, size);
    free(buf);
    if (mq_agent_state_load(s_path, &cur, &stash, &c) != 0)
        return 0;
    s_roundtrip(cur, stash, &c);
    s_use(cur);
    if (stash)
        s_use(stash);
    mq_policy_destroy(&cur);
    mq_policy_destroy(&stash);
    return 0;
}
