/* What the agent's files share: the counters that survive restarts, the state file format,
 * and the HTTP server that reads a snapshot of the agent (never the policy itself). */
#ifndef MQGRAD_AGENT_INTERNAL_H
#define MQGRAD_AGENT_INTERNAL_H

#include "agent.h"

/* Counters of the agent as a whole (a policy swap does not reset them); saved in the state
 * file. fallbacks is the scheduler's own count, as it last reported it. */
typedef struct {
    uint64_t decisions, observations, swaps, fallbacks;
} mq_agent_counters_t;

/* Everything the HTTP thread shows, copied under a mutex after every change. */
typedef struct {
    mq_status_msg_t status;
    uint64_t swaps;
    uint64_t drops[MQ_DROP_COUNT_];
} mq_agent_snapshot_t;

/* ---- state file (agent_state.c) ------------------------------------------------------
 * Layout, little-endian: magic "MQAGENT\0", u32 format version, u32 flags (bit 0: a stashed
 * mqgrad policy follows), u64 decisions, observations, swaps, fallbacks, u64 length + bytes
 * of the current policy (mq_policy_save), [u64 length + bytes of the stashed policy], u32
 * CRC-32 of everything before it. */

/* Serializes CUR (required), STASH (may be NULL) and C into a malloc'd buffer. 0 or -1. */
int mq_agent_state_pack(const mq_policy_t *cur, const mq_policy_t *stash,
                        const mq_agent_counters_t *c, uint8_t **buf, size_t *len);
/* Rebuilds what mq_agent_state_pack wrote. Returns 0 with owned *CUR and *STASH (NULL if
 * none), or -1 with an error saying what is wrong (nothing allocated). */
int mq_agent_state_unpack(const uint8_t *buf, size_t len, mq_policy_t **cur, mq_policy_t **stash,
                          mq_agent_counters_t *c);
/* Reads PATH: 1 if it does not exist (nothing set), 0 when restored, -1 with an error
 * naming the file and the problem when it exists but cannot be used. */
int mq_agent_state_load(const char *path, mq_policy_t **cur, mq_policy_t **stash,
                        mq_agent_counters_t *c);

/* A thread that writes the state file off the request path (fsync takes milliseconds): it
 * writes what it is given in order, only the newest when it falls behind, and writes what
 * is pending before it ends (zactor_destroy). PATH must outlive it. */
zactor_t *mq_agent_saver_new(const char *path);
/* Hands BUF (LEN bytes, from mq_agent_state_pack) to the saver; frees BUF. */
void mq_agent_saver_put(zactor_t *saver, uint8_t *buf, size_t len);

/* ---- HTTP (agent_http.c, on mqgrad/http.h) -------------------------------------------- */
typedef struct mq_agent_http_t mq_agent_http_t;

/* Serves CFG (mqgrad/http.h: address, port, resolved token) on its own thread: /metrics,
 * /healthz and /bits, an empty snapshot until the first publish. NULL with an error on
 * failure. */
mq_agent_http_t *mq_agent_http_new(const mq_http_cfg_t *cfg);
void mq_agent_http_destroy(mq_agent_http_t **self_p);
int mq_agent_http_port(const mq_agent_http_t *self);
/* Replaces the snapshot the HTTP thread serves (copied under the mutex). */
void mq_agent_http_publish(mq_agent_http_t *self, const mq_agent_snapshot_t *snap);

#endif
