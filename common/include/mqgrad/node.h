/* What a server and a worker share: the link to the scheduler (register, ready, heartbeats,
 * giving up when it goes silent) and the actor's pipe (PORT, DROPS, $TERM). */
#ifndef MQGRAD_NODE_H
#define MQGRAD_NODE_H

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

#include "mqgrad/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    zsock_t *pipe;       /* the actor's pipe */
    zsock_t *sched;      /* DEALER to the scheduler */
    char endpoint[256];  /* the scheduler's */
    mq_role_t role;
    uint64_t incarnation;
    double last_heard, peer_timeout;
    bool finished;       /* DONE was reported; the node only waits for $TERM */
    int port;            /* what PORT answers (a bound data port, or 0) */
    mq_drops_t drops;
    mq_msg_t msg;        /* for register / ready */
} mq_node_t;

/* Connects to the scheduler at ENDPOINT and registers as ROLE (a server gives the endpoint
 * workers should use in ADVERTISE, a worker NULL). Returns 0, or -1 with an error. */
int mq_node_open(mq_node_t *n, zsock_t *pipe, const char *endpoint, mq_role_t role,
                 const char *advertise, double peer_timeout);
void mq_node_close(mq_node_t *n);

/* Tells the scheduler this node (of RANK) is set up. */
int mq_node_ready(mq_node_t *n, uint32_t rank);

/* Receives one message from the scheduler into MSG. Heartbeats, refusals (which end the
 * node) and bad messages are handled here; returns 0 only for a message the service must
 * act on (WELCOME, ITERATE, STOP), -1 otherwise. */
int mq_node_recv(mq_node_t *n, mq_msg_t *msg);

/* Reports the end of the service once: code 0 (run over) or 1 after logging WHAT and the
 * last error. */
void mq_node_finish(mq_node_t *n, int code, const char *what);

/* Ends the node if the scheduler has been silent for longer than the peer timeout. */
void mq_node_check_peer(mq_node_t *n);

/* zloop reader for the actor pipe (ARG is the mq_node_t): "PORT" → port, "DROPS" →
 * mq_drops_format, "$TERM" → ends the loop. */
int mq_node_on_pipe(zloop_t *loop, zsock_t *pipe, void *arg);

#ifdef __cplusplus
}
#endif
#endif
