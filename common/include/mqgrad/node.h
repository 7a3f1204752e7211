/* What a server and a worker share: the link to the scheduler (register, ready, heartbeats
 * both ways, giving up when it goes silent, the run id). Their actor's pipe is the service
 * skeleton's (mqgrad/service.h).
 *
 * Heartbeats to the scheduler come from a thread of their own (with its own socket), so a
 * worker deep in a gradient still says it is alive; the scheduler takes a node that is
 * silent for its --heartbeat-timeout as lost. */
#ifndef MQGRAD_NODE_H
#define MQGRAD_NODE_H

#include <czmq.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "mqgrad/security.h"
#include "mqgrad/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Milliseconds between a node's heartbeats to the scheduler. */
#define MQ_HEARTBEAT_MS 500
/* A node that has heard nothing from the scheduler this long after its REGISTER sends it again
 * on a new connection: the scheduler answers a registration at once and sends heartbeats to
 * every node it holds every second, so the REGISTER, or the connection it went on, was lost. */
#define MQ_REGISTER_RETRY_S 5.0

typedef struct {
    zsock_t *pipe;       /* the actor's pipe */
    zsock_t *sched;      /* DEALER to the scheduler */
    char endpoint[256];  /* the scheduler's */
    mq_role_t role;
    uint64_t incarnation;
    double last_heard, peer_timeout;
    bool heard;        /* anything from the scheduler since REGISTER */
    double registered; /* when REGISTER last went */
    zloop_t *loop;     /* mq_node_listen's: the reader of sched */
    zloop_reader_fn *on_sched;
    void *on_sched_arg;
    bool finished;       /* DONE was reported; the node only waits for $TERM */
    mq_drops_t drops;
    mq_msg_t msg;        /* for register / ready */
    uint64_t run_id;     /* the run WELCOME named (0 before) */
    uint32_t rank;
    zactor_t *beat;      /* the heartbeat thread, from WELCOME on */
    mq_sec_t *sec;       /* the node's keys (mqgrad/security.h); outlives the node */
    bool has_token;
    uint8_t token[MQ_TOKEN_LEN]; /* WELCOME's: on every message to the scheduler */
    uint32_t term;               /* the token's (mqgrad/security.h) */
    const mq_layout_t *layout; /* a libmqgrad worker's REGISTER: its model's layout; set
                                * before mq_node_open (NULL: none) */
    uint32_t prefer_shard; /* a server's REGISTER: 1 + the shard it asks for, 0 = any; set
                            * before mq_node_open */
    /* A worker's loop stores 1 + the iteration it last pushed; the heartbeat thread sends it,
     * so the scheduler tells a wedged loop from a live one (the thread beats either way). */
    _Atomic uint64_t pushed;
} mq_node_t;

/* Connects to the scheduler at ENDPOINT (with SEC's keys) and registers as ROLE (a server
 * gives the endpoint workers should use in ADVERTISE, a worker NULL). Returns 0, or -1 with
 * an error. */
int mq_node_open(mq_node_t *n, zsock_t *pipe, const char *endpoint, mq_role_t role,
                 const char *advertise, double peer_timeout, mq_sec_t *sec);
void mq_node_close(mq_node_t *n);

/* WELCOME named the run, this node's rank and its token: every message this thread sends
 * from now on carries the run id and the token, and heartbeats start (from LOOP, which also
 * hears a refusal from the heartbeat thread). Returns 0, or -1 with an error. */
int mq_node_welcomed(mq_node_t *n, zloop_t *loop, const mq_msg_t *welcome);

/* Tells the scheduler this node (of RANK) is set up. */
int mq_node_ready(mq_node_t *n, uint32_t rank);

/* A worker that goes on its own (SIGTERM) tells the scheduler, which takes it out of the run
 * at once instead of after the heartbeat timeout. */
void mq_node_leave(mq_node_t *n);

/* Receives one message from the scheduler into MSG. Heartbeats, refusals (which end the
 * node with MQ_EXIT_REFUSED), messages of another run (the same) and bad messages are
 * handled here; returns 0 only for a message the service must act on (WELCOME, ITERATE,
 * COMMIT, STOP), -1 otherwise. */
int mq_node_recv(mq_node_t *n, mq_msg_t *msg);

/* Reports the end of the service once: code 0 (run over) or 1 after logging WHAT and the
 * last error. */
void mq_node_finish(mq_node_t *n, int code, const char *what);

/* Reads the scheduler's messages in LOOP with FN (ARG): the node can then connect again. */
int mq_node_listen(mq_node_t *n, zloop_t *loop, zloop_reader_fn *fn, void *arg);

/* Ends the node if the scheduler has been silent for longer than the peer timeout; before
 * then, sends a REGISTER nothing has answered again, on a new connection, every
 * MQ_REGISTER_RETRY_S (the same incarnation: a scheduler that holds the registration answers
 * the node on its new connection from then on). Every second, from the service's tick. */
void mq_node_check_peer(mq_node_t *n);


#ifdef __cplusplus
}
#endif
#endif
