/* mqgrad-server: owns one shard of the flat parameter vector. When every worker's push for an
 * iteration is in, it averages them (in rank order, so results do not depend on arrival
 * order), re-quantizes the mean with the iteration's bits (the paper's Algorithm 1, step 54),
 * applies it to its master copy exactly as the workers will, and sends it to every worker. */
#ifndef MQGRAD_SERVER_H
#define MQGRAD_SERVER_H

#include <czmq.h>

#include "mqgrad/http.h"
#include "mqgrad/security.h"

typedef struct {
    char scheduler[256]; /* endpoint of the scheduler */
    char bind[256];      /* where workers push, e.g. tcp://(*):7100 */
    char advertise[256]; /* endpoint workers use; default: bind with this host's address */
    double peer_timeout; /* seconds without a word from the scheduler before giving up */
    char dump[512];      /* if set, write the final master shard here (tests) */
    char checkpoint_dir[512]; /* shard checkpoints go here (mqgrad/checkpoint.h); empty = none */
    long shard;               /* the shard to ask for (a StatefulSet's pod index), -1 = any */
    mq_sec_config_t sec;      /* keys (mqgrad/security.h) */
    mq_http_cfg_t http;       /* /metrics (mqgrad/http.h) */
    mq_metrics_t *metrics;    /* the registry main serves, or NULL: no metrics */
} mq_server_config_t;

/* Fills CFG from defaults, MQGRAD_* variables and ARGV. Returns 0, 1 (help) or 2 (bad). */
int mq_server_config_parse(mq_server_config_t *cfg, int argc, char **argv);

/* The server as a CZMQ actor; ARGS is a mq_server_config_t that outlives it. Pipe commands:
 * "PORT" → the bound port as a string; $TERM. Reports "DONE <code>" when the run is over. */
void mq_server_actor(zsock_t *pipe, void *args);

#endif
