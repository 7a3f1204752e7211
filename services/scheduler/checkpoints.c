/* The checkpoint in progress (scheduler_internal.h): when one is due, the servers' word on
 * their shards, and which consistent checkpoints the servers must keep. Without sockets or
 * files: the actor snapshots its state, writes checkpoint.json, and says so. */
#include "scheduler_internal.h"

#include <stdlib.h>
#include <string.h>

int mq_cp_init(mq_ckround_t *cp, long every, uint32_t servers)
{
    *cp = (mq_ckround_t){.every = every, .cap = servers};
    cp->saved = calloc(servers ? servers : 1, sizeof *cp->saved);
    return cp->saved ? 0 : -1;
}

void mq_cp_destroy(mq_ckround_t *cp)
{
    free(cp->saved);
    cp->saved = NULL;
}

bool mq_cp_due(mq_ckround_t *cp, uint64_t iter, uint32_t servers)
{
    if (cp->every <= 0 || iter == 0 || iter % (uint64_t)cp->every != 0 ||
        iter == cp->resumed_at || (cp->pending && cp->iter == iter) || servers == 0 ||
        servers > cp->cap)
        return false;
    cp->pending = true;
    cp->iter = iter;
    cp->servers = servers;
    memset(cp->saved, 0, servers * sizeof *cp->saved);
    return true;
}

uint64_t mq_cp_keep_from(const mq_ckround_t *cp)
{
    return cp->before ? cp->before : cp->consistent;
}

mq_cp_action_t mq_cp_saved(mq_ckround_t *cp, uint64_t iter, uint32_t shard, bool ok)
{
    if (!cp->pending || iter != cp->iter || shard >= cp->servers)
        return MQ_CP_IGNORE;
    if (!ok) {
        cp->pending = false;
        bool first = !cp->warned;
        cp->warned = true;
        return first ? MQ_CP_FAILED_FIRST : MQ_CP_FAILED;
    }
    cp->saved[shard] = true;
    for (uint32_t s = 0; s < cp->servers; s++)
        if (!cp->saved[s])
            return MQ_CP_WAIT;
    cp->pending = false;
    return MQ_CP_COMPLETE;
}

void mq_cp_committed(mq_ckround_t *cp)
{
    cp->before = cp->consistent;
    cp->consistent = cp->iter;
}

void mq_cp_restart(mq_ckround_t *cp, uint64_t at, uint64_t before)
{
    cp->pending = false;
    cp->resumed_at = cp->consistent = at;
    cp->before = before < at ? before : 0;
}
