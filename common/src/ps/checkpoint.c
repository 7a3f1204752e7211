/* Shard checkpoint files (mqgrad/checkpoint.h). */
#include "mqgrad/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqgrad/util.h"

#define S_MAGIC "MQCKPT01"

typedef struct {
    char magic[8];
    uint64_t lineage, iter;
    uint32_t shard, servers;
    char model[16];
    char optimizer[64];
    uint64_t n, nstate;
} s_header_t;

static uint64_t s_fnv(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

#define S_FNV_INIT 1469598103934665603ULL

void mq_ckpt_path(const char *dir, const mq_ckpt_meta_t *m, char *buf, size_t len)
{
    snprintf(buf, len, "%s/shard-%u-%016" PRIx64 "-%" PRIu64 ".ckpt", dir, m->shard, m->lineage,
             m->iter);
}

static void s_header(const mq_ckpt_meta_t *m, size_t n, size_t nstate, s_header_t *h)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, S_MAGIC, 8);
    h->lineage = m->lineage;
    h->iter = m->iter;
    h->shard = m->shard;
    h->servers = m->servers;
    snprintf(h->model, sizeof h->model, "%s", m->model);
    snprintf(h->optimizer, sizeof h->optimizer, "%s", m->optimizer);
    h->n = n;
    h->nstate = nstate;
}

/* Removes the shard's checkpoints of this lineage older than KEEP_FROM. */
static void s_prune(const char *dir, const mq_ckpt_meta_t *m, uint64_t keep_from)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "shard-%u-%016" PRIx64 "-", m->shard, m->lineage);
    size_t plen = strlen(prefix);
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        char *end;
        unsigned long long it = strtoull(e->d_name + plen, &end, 10);
        if (strcmp(end, ".ckpt") != 0 || it >= keep_from)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
}

/* The newest checkpoint of this shard and lineage before ITER (0 if none). */
static uint64_t s_previous(const char *dir, const mq_ckpt_meta_t *m)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "shard-%u-%016" PRIx64 "-", m->shard, m->lineage);
    size_t plen = strlen(prefix);
    uint64_t best = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        char *end;
        unsigned long long it = strtoull(e->d_name + plen, &end, 10);
        if (strcmp(end, ".ckpt") == 0 && it < m->iter && it > best)
            best = it;
    }
    closedir(d);
    return best;
}

int mq_ckpt_write(const char *dir, const mq_ckpt_meta_t *m, const float *params, size_t n,
                  const float *state, size_t nstate, uint64_t keep)
{
    if (mq_mkdirs(dir) != 0)
        return -1;
    s_header_t h;
    s_header(m, n, nstate, &h);
    uint64_t sum = s_fnv(S_FNV_INIT, &h, sizeof h);
    sum = s_fnv(sum, params, n * sizeof(float));
    if (nstate)
        sum = s_fnv(sum, state, nstate * sizeof(float));
    const void *parts[4] = {&h, params, state, &sum};
    size_t lens[4] = {sizeof h, n * sizeof(float), nstate * sizeof(float), sizeof sum};
    char path[4096];
    mq_ckpt_path(dir, m, path, sizeof path);
    if (mq_write_parts_atomic(path, parts, lens, 4) != 0)
        return -1;
    uint64_t prev = s_previous(dir, m), from = prev ? prev : m->iter;
    s_prune(dir, m, keep && keep < from ? keep : from);
    return 0;
}

static int s_mismatch(const char *path, const char *what)
{
    mq_err_set("checkpoint %s is not this run's: %s differs (refused, left as it is)", path,
               what);
    return -1;
}

int mq_ckpt_read(const char *dir, const mq_ckpt_meta_t *want, float *params, size_t n,
                 float *state, size_t nstate)
{
    char path[4096];
    mq_ckpt_path(dir, want, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        mq_err_set("checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    s_header_t h, w;
    s_header(want, n, nstate, &w);
    int rc = -1;
    if (fread(&h, sizeof h, 1, f) != 1) {
        mq_err_set("checkpoint %s is cut short (no complete header)", path);
        goto out;
    }
    if (memcmp(h.magic, S_MAGIC, 8) != 0) {
        mq_err_set("checkpoint %s is not a shard checkpoint (bad magic)", path);
        goto out;
    }
    if (h.lineage != w.lineage || h.iter != w.iter || h.shard != w.shard) {
        rc = s_mismatch(path, "the run, the iteration or the shard");
        goto out;
    }
    if (h.servers != w.servers) {
        rc = s_mismatch(path, "the number of servers");
        goto out;
    }
    if (memcmp(h.model, w.model, sizeof h.model) != 0 || h.n != w.n) {
        rc = s_mismatch(path, "the model or the shard's size");
        goto out;
    }
    if (memcmp(h.optimizer, w.optimizer, sizeof h.optimizer) != 0 || h.nstate != w.nstate) {
        rc = s_mismatch(path, "the update rule");
        goto out;
    }
    uint64_t sum = s_fnv(S_FNV_INIT, &h, sizeof h), stored;
    if (fread(params, sizeof(float), n, f) != n ||
        (nstate && fread(state, sizeof(float), nstate, f) != nstate) ||
        fread(&stored, sizeof stored, 1, f) != 1) {
        mq_err_set("checkpoint %s is cut short", path);
        goto out;
    }
    sum = s_fnv(sum, params, n * sizeof(float));
    if (nstate)
        sum = s_fnv(sum, state, nstate * sizeof(float));
    if (sum != stored || fgetc(f) != EOF) {
        mq_err_set("checkpoint %s is corrupt (checksum mismatch or trailing bytes)", path);
        goto out;
    }
    rc = 0;
out:
    fclose(f);
    return rc;
}
