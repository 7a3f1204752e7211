/* The wire: mqgrad messages as multipart ZeroMQ messages (a packed protobuf Meta frame, then
 * one raw payload frame per tensor header). This is the only module that knows protobuf;
 * services see the plain C struct mq_msg_t.
 *
 * Receiving validates everything that can be checked without knowing the receiver's state:
 * protocol version, message type, frame count against the tensor headers, each payload's
 * length against its header, its codec (registered, parameters and level valid) and the
 * codec's own validation of the payload (mq_codec_validate_payload: sizes, headers, indices,
 * finite values), done here once so receivers decode with mq_codec_decode_valid. State-dependent checks (is the rank registered, is
 * the iteration current, is the shard ours) belong to the service, which counts drops by
 * reason through mq_drops_t. */
#ifndef MQGRAD_WIRE_H
#define MQGRAD_WIRE_H

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mqgrad/metrics.h"
#include "mqgrad/nn.h"
#include "mqgrad/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MQ_WIRE_VERSION 2
/* Payload frames in a message, and so segments in a shard: a model of MQ_LAYOUT_MAX tensors
 * fits in one shard. */
#define MQ_WIRE_MAX_TENSORS MQ_LAYOUT_MAX
#define MQ_WIRE_MAX_SERVERS 64
#define MQ_WIRE_MAX_PEER 256
#define MQ_WIRE_MAX_TEXT 256
#define MQ_WIRE_MAX_Q 16
#define MQ_WIRE_MAX_WORKERS 256 /* worker ranks a run can hold */
/* Largest message any socket accepts (ZMQ_MAXMSGSIZE): the paper model's fp32 gradient is
 * 64 MB, so 256 MB leaves room while refusing absurd frames. */
#define MQ_WIRE_MAX_MSG (256LL << 20)
/* Largest message a control socket (the scheduler's, the agent's, a node's link to the
 * scheduler) takes: a Meta frame and nothing else. */
#define MQ_WIRE_MAX_CONTROL_MSG (128LL << 10)
/* A node's token for the run (proto/mqgrad.proto Meta.token) and the servers' run key. */
#define MQ_TOKEN_LEN 16
#define MQ_RUN_KEY_LEN 32

/* Every message type once: X(ID, name), in the order and with the names of
 * proto/mqgrad.proto's MsgType (wire.c checks each value against the generated enum when it
 * compiles, so the two cannot drift apart). The enum and mq_msg_type_name come from it. */
#define MQ_MSG_TYPES(X)                                                                     \
    X(REGISTER, "register") X(WELCOME, "welcome") X(ITERATE, "iterate") X(PUSH, "push")      \
    X(AGGREGATE, "aggregate") X(REPORT, "report") X(OBSERVE, "observe")                      \
    X(DECISION, "decision") X(QUERY, "query") X(STATUS, "status")                            \
    X(POLICY_SET, "policy-set") X(PING, "ping") X(PONG, "pong") X(STOP, "stop")              \
    X(ERROR, "error") X(HEARTBEAT, "heartbeat") X(READY, "ready") X(HAVE, "have")           \
    X(COMMIT, "commit") X(PULL, "pull") X(PARAMS, "params") X(LEAVE, "leave")               \
    X(SAVED, "saved") X(PROGRESS, "progress") X(SEED, "seed")

typedef enum {
    MQ_MSG_UNKNOWN = 0,
#define MQ_MSG_ENUM_(id, name) MQ_MSG_##id,
    MQ_MSG_TYPES(MQ_MSG_ENUM_)
#undef MQ_MSG_ENUM_
    MQ_MSG_COUNT_
} mq_msg_type_t;

const char *mq_msg_type_name(mq_msg_type_t t);

typedef enum { MQ_ROLE_NONE = 0, MQ_ROLE_WORKER = 1, MQ_ROLE_SERVER = 2 } mq_role_t;

/* Why a message was dropped. Wire-level reasons come from mq_wire_recv; the rest are the
 * services' own checks. */
typedef enum {
    MQ_DROP_NONE = 0,
    MQ_DROP_GARBAGE,        /* Meta does not parse */
    MQ_DROP_VERSION,        /* protocol version mismatch */
    MQ_DROP_TYPE,           /* unknown type, or a type this service does not take */
    MQ_DROP_FRAMES,         /* frame count differs from the tensor headers */
    MQ_DROP_LENGTH,         /* payload length differs from its header or exceeds the codec's bound */
    MQ_DROP_CODEC,          /* unknown codec, bits out of range, bad parameters */
    MQ_DROP_NONFINITE,      /* NaN/Inf in a scalar field */
    MQ_DROP_RANK,           /* rank not registered, or not this peer's */
    MQ_DROP_ITER,           /* stale or future iteration */
    MQ_DROP_SHARD,          /* shard index out of range or not ours */
    MQ_DROP_LAYOUT,         /* tensor slices do not match the shard's layout */
    MQ_DROP_DUPLICATE,      /* a second copy of something already counted */
    MQ_DROP_TOO_MANY,       /* more tensors, servers or bytes than the limits */
    MQ_DROP_PAYLOAD,        /* the codec refused the payload (header, index, non-finite value) */
    MQ_DROP_RUN,            /* a message of another run (its run id is not ours) */
    MQ_DROP_LATE,           /* a straggler's push or report for an iteration already closed */
    MQ_DROP_AUTH,           /* the sender's key or token does not allow it (SECURITY.md) */
    MQ_DROP_UNREAD,         /* a reply its peer did not take: its queue was full (mq_wire_reply) */
    MQ_DROP_COUNT_
} mq_drop_t;

const char *mq_drop_name(mq_drop_t r);

#define MQ_LINK_MAX_SPEC 256 /* a link schedule SPEC's bytes, with its NUL (mqgrad/ps.h) */

typedef struct {
    char name[MQ_LAYOUT_NAME];
    uint64_t offset, count;
    mq_codec_t codec;
    uint64_t payload_len;
} mq_tensor_hdr_t;

/* The run's configuration (WELCOME), a worker's report, the scheduler's observation and the
 * agent's status: plain C structs generated from proto/mqgrad.proto (proto/gen_c.py), where
 * each field is documented. */
#include "mqgrad_msgs.h"

/* A payload to send. With free_fn set, the bytes are sent without copying and free_fn(data,
 * hint) runs (on a ZeroMQ I/O thread) once ZeroMQ no longer needs them; without it they are
 * copied into the message. */
typedef void(mq_free_fn)(void *data, void *hint);
typedef struct {
    const void *data;
    size_t len;
    mq_free_fn *free_fn;
    void *hint;
} mq_payload_t;

/* One message: header fields plus, after a receive, the payload frames. Only the fields of
 * the message's type are meaningful. Reuse one per socket: mq_msg_reset releases frames. */
typedef struct {
    mq_msg_type_t type;
    uint8_t peer[MQ_WIRE_MAX_PEER]; /* ROUTER routing id (received from / to send to) */
    size_t peer_len;
    uint64_t iter;
    uint32_t rank, shard;
    uint64_t incarnation;
    mq_role_t role;
    char endpoint[MQ_WIRE_MAX_TEXT];
    uint32_t nservers;
    char servers[MQ_WIRE_MAX_SERVERS][MQ_WIRE_MAX_TEXT];
    mq_run_config_t config;
    uint32_t bits;
    float lr;
    bool evaluate;
    uint32_t eval_limit; /* ITERATE: test examples for this evaluation (0 = all) */
    double sim_time;     /* simulated clock: the sender's time (s) when the message left */
    double run_time;     /* ITERATE: the run's training time (s) as the scheduler issued it */
    /* membership (proto/mqgrad.proto): ITERATE's, HAVE's and COMMIT's member set in rank
     * order (the wire refuses an unsorted or repeated one), its version, the data position */
    uint32_t nmembers;
    uint32_t members[MQ_WIRE_MAX_WORKERS];
    uint32_t view;
    uint64_t cursor;
    uint64_t run_id;     /* 0 when sent: the sending thread's (mq_wire_set_run_id) */
    bool checkpoint;     /* ITERATE to servers: write the shard checkpoint first */
    uint64_t keep_from;  /* ... and keep the one of this iteration (the last consistent) */
    bool retry;          /* ERROR: the node may register again */
    bool seed;           /* WELCOME to a worker: it gives the servers their values (SEED) */
    /* ownership (SECURITY.md): the sender's token (0 when sent: the thread's, see
     * mq_wire_set_token), WELCOME to servers: the run key */
    bool has_token;
    uint8_t token[MQ_TOKEN_LEN];
    uint32_t term; /* the token's term (mqgrad/security.h); 0 when sent: the thread's */
    uint32_t member_terms[MQ_WIRE_MAX_WORKERS]; /* ITERATE: each member's term */
    bool has_run_key;
    uint8_t run_key[MQ_RUN_KEY_LEN];
    /* received over CURVE: the sender's public key (Z85), "" otherwise (mqgrad/security.h) */
    char user_id[41];
    mq_report_t report;
    mq_obs_msg_t obs;
    mq_status_msg_t status;
    char text[MQ_WIRE_MAX_TEXT];
    uint32_t ntensors;
    mq_tensor_hdr_t tensors[MQ_WIRE_MAX_TENSORS];
    /* received payloads (valid until mq_msg_reset or the next receive) */
    const uint8_t *payload[MQ_WIRE_MAX_TENSORS];
    size_t payload_len[MQ_WIRE_MAX_TENSORS];
    size_t wire_bytes; /* bytes of all frames, as received or sent */
    zmq_msg_t frames_[MQ_WIRE_MAX_TENSORS];
    uint32_t nframes_;
    /* REGISTER from a libmqgrad worker: its model's layout; WELCOME: the run's (nn.h). After
     * the fields mq_msg_init clears, which empties it (n = 0) without clearing its 9 KB on
     * every message sent; copies of the header fields do not take it. */
    mq_layout_t layout;
} mq_msg_t;

/* Zeroes the header fields of MSG for a new message of TYPE (keeps nothing of the last). */
void mq_msg_init(mq_msg_t *msg, mq_msg_type_t type);
/* Releases received payload frames. Safe to call twice. */
void mq_msg_reset(mq_msg_t *msg);

/* Sets the socket options every mqgrad socket gets: ZMQ_MAXMSGSIZE (MAX_MSG bytes: a control
 * socket takes MQ_WIRE_MAX_CONTROL_MSG, one that carries gradients MQ_WIRE_MAX_MSG), linger,
 * and for ROUTER sockets ZMQ_ROUTER_MANDATORY (an unroutable send fails instead of
 * vanishing). */
void mq_wire_prepare(zsock_t *sock, int linger_ms, int64_t max_msg);

/* Sends MSG with NPAYLOADS payloads (one per msg->tensors entry; ntensors must equal
 * npayloads). On a ROUTER socket msg->peer is the destination. Returns 0, or -1 with an
 * error (e.g. unroutable peer); when ZeroMQ refused the send, errno is its reason (EAGAIN:
 * no peer took it within the socket's send timeout). The payloads' free functions run
 * whatever happens. */
int mq_wire_send(zsock_t *sock, mq_msg_t *msg, const mq_payload_t *payloads, size_t npayloads);

/* Receives one message into MSG (non-blocking if the socket has a receive timeout or
 * nothing is ready: returns -1 with *drop = MQ_DROP_NONE and errno EAGAIN). On success 0.
 * A message that fails validation is consumed whole and gives -1 with *drop set to the
 * reason and an error describing it; msg->peer then says who sent it when known. */
int mq_wire_recv(zsock_t *sock, mq_msg_t *msg, mq_drop_t *drop);

/* The run id this thread stamps on every message it sends with run_id 0 (a node sets it
 * once WELCOME names the run; the scheduler when it starts one). */
void mq_wire_set_run_id(uint64_t run_id);
uint64_t mq_wire_run_id(void);
/* The token this thread stamps on every message it sends without one (NULL: none). */
void mq_wire_set_token(const uint8_t *token, uint32_t term);

/* Index of RANK in the member set MEMBERS[0..N) (rank order), or -1 if it is not a member. */
int mq_member_index(const uint32_t *members, uint32_t n, uint32_t rank);
/* The same in MSG's member set. */
int mq_msg_member_index(const mq_msg_t *msg, uint32_t rank);

/* Frees this thread's receive arena and pack buffer; actors call it before they end. */
void mq_wire_thread_cleanup(void);

/* Drop accounting: counts per reason; logs the first drop for each (peer, reason) pair
 * only, so a misbehaving peer cannot flood the log. */
typedef struct {
    uint64_t count[MQ_DROP_COUNT_];
    uint64_t seen_[64]; /* hashes of (peer, reason) already logged */
    size_t nseen_;
} mq_drops_t;
void mq_drops_note(mq_drops_t *d, mq_drop_t reason, const uint8_t *peer, size_t peer_len,
                   const char *detail);
uint64_t mq_drops_total(const mq_drops_t *d);
/* "garbage=0 version=1 ..." for every reason, for logs, metrics and tests. */
void mq_drops_format(const mq_drops_t *d, char *buf, size_t len);
/* Sends MSG, a reply without payloads (PONG, ERROR, STATUS, ...), to the peer it answers
 * without waiting: a peer whose queue is full (it does not read) or that is gone loses the
 * reply, counted in DROPS as MQ_DROP_UNREAD (when DROPS is not NULL), so no peer can stall
 * the service that answers it. Returns 0, or -1 with errno (EAGAIN, EHOSTUNREACH). */
int mq_wire_reply(zsock_t *sock, mq_msg_t *msg, mq_drops_t *drops);
/* The same with payloads (their free functions run whatever happens, as mq_wire_send's). */
int mq_wire_reply_payloads(zsock_t *sock, mq_msg_t *msg, const mq_payload_t *payloads,
                           size_t npayloads, mq_drops_t *drops);

/* Receives one message into MSG, as every service's handler does: true when there is one;
 * false when there is none (EAGAIN) or it failed validation, then counted in DROPS under
 * its sender (FROM[0..FROM_LEN), or the message's peer when FROM is NULL) and its reason. */
bool mq_wire_take(zsock_t *sock, mq_msg_t *msg, mq_drops_t *drops, const void *from,
                  size_t from_len);

/* The counter NAME{reason=...} of every reason in M, into OUT (all NULL without M). */
void mq_drops_series(mq_metrics_t *m, const char *name, mq_metric_t *out[MQ_DROP_COUNT_]);
/* Sets those counters to COUNT (an mq_drops_t's count, or a copy of it). */
void mq_drops_publish(mq_metric_t *const out[MQ_DROP_COUNT_], const uint64_t count[MQ_DROP_COUNT_]);

#ifdef __cplusplus
}
#endif
#endif
