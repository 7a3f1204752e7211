/* fuzz_ckpt: a server's shard checkpoint file as a restarted server reads it
 * (common/src/ps/checkpoint.c, mq_ckpt_read: header, the run/shard/model/update rule checks,
 * the values, the state values, the checksum, trailing bytes).
 *
 * The input is the file. It is read twice: as the checkpoint of a fixed shard (the one
 * gen_corpus writes, so the seeds pass every check), and as the checkpoint its own header
 * describes (counts bounded by S_MAX_N), so mutations of the counts and names reach the
 * reads behind the header checks. A read that succeeds must have filled the arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "gen_seeds.h"
#include "mqgrad/checkpoint.h"

#define S_HEADER 128 /* checkpoint.c's s_header_t */
#define S_MAX_N (1u << 16)

static float s_params[S_MAX_N], s_state[S_MAX_N];

static uint64_t s_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void s_read(const uint8_t *data, size_t size, const mq_ckpt_meta_t *want, size_t n,
                   size_t nstate)
{
    char path[4096];
    mq_ckpt_path(mq_fuzz_dir(), want, path, sizeof path);
    mq_fuzz_write(path, data, size);
    int rc = mq_ckpt_read(mq_fuzz_dir(), want, s_params, n, s_state, nstate);
    if (rc == 0 && size != S_HEADER + 4 * (n + nstate) + 8) {
        mq_fuzz_fail("fuzz_ckpt: a %zu-byte file was read as %zu + %zu values", size, n,
                     nstate);
    }
    remove(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mq_ckpt_meta_t want;
    mq_fuzz_seed_ckpt_meta(&want);
    s_read(data, size, &want, MQ_FUZZ_SEED_CKPT_N, MQ_FUZZ_SEED_CKPT_NSTATE);
    if (size < S_HEADER)
        return 0;
    /* the checkpoint this header describes */
    uint64_t n = s_le(data + 112, 8), nstate = s_le(data + 120, 8);
    if (n > S_MAX_N || nstate > S_MAX_N)
        return 0;
    memset(&want, 0, sizeof want);
    want.lineage = s_le(data + 8, 8);
    want.iter = s_le(data + 16, 8);
    want.shard = (uint32_t)s_le(data + 24, 4);
    want.servers = (uint32_t)s_le(data + 28, 4);
    snprintf(want.model, sizeof want.model, "%.*s", (int)sizeof want.model - 1,
             (const char *)data + 32);
    snprintf(want.optimizer, sizeof want.optimizer, "%.*s", (int)sizeof want.optimizer - 1,
             (const char *)data + 48);
    s_read(data, size, &want, (size_t)n, (size_t)nstate);
    return 0;
}
