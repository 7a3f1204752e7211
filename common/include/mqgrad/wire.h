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

#define MQ_WIRE_VERSION 4
/* Payload frames in a message, and so segments in a shard: a model of MQ_LAYOUT_MAX tensors
 * fits in one shard. */
#define MQ_WIRE_MAX_TENSORS MQ_LAYOUT_MAX
#define MQ_WIRE_MAX_PEER 256
#define MQ_WIRE_MAX_TEXT 256
#define MQ_WIRE_MAX_Q 16
/* The largest values of the flags that size a run (--workers, --max-workers, --servers, a
 * server's --shard): bounds against typos, not capacities. Every array of a service is as
 * large as its run's value, and nothing else bounds a run but memory and MQ_WIRE_MAX_META
 * (about 50,000 workers; bench/README.md, "scale.sh", says what grows with them). */
#define MQ_FLAG_MAX_WORKERS 1000000
#define MQ_FLAG_MAX_SERVERS 65536
/* Largest message any socket accepts (ZMQ_MAXMSGSIZE): the paper model's fp32 gradient is
 * 64 MB, so 256 MB leaves room while refusing absurd frames. */
#define MQ_WIRE_MAX_MSG (256LL << 20)
/* Largest message a control socket (the scheduler's, the agent's, a node's link to the
 * scheduler) takes: a Meta frame and nothing else, and the largest Meta frame any socket
 * takes. The one bound on a member set (a rank and a term take 2-6 bytes): about 50,000
 * workers, a run far past what one scheduler serves (bench/README.md, "scale.sh"). */
#define MQ_WIRE_MAX_CONTROL_MSG (256LL << 10)
#define MQ_WIRE_MAX_META MQ_WIRE_MAX_CONTROL_MSG
/* A node's token for the run (proto/mqgrad.proto Meta.token) and the servers' run key. */
#define MQ_TOKEN_LEN 16
#define MQ_RUN_KEY_LEN 32
#define MQ_LINK_MAX_SPEC 256 /* a link schedule SPEC's bytes, with its NUL (mqgrad/ps.h) */

/* The run's configuration, the message bodies (one per type) and the list of message types
 * (MQ_MSG_TYPES: Meta's oneof body) are generated from proto/mqgrad.proto by proto/gen_c.py,
 * where each field is documented: a field added there touches its writer and its reader,
 * nothing else. */
#include "mqgrad_msgs.h"

typedef enum {
    MQ_MSG_UNKNOWN = 0,
#define MQ_MSG_ENUM_(id, name, member) MQ_MSG_##id,
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


typedef struct {
    char name[MQ_LAYOUT_NAME];
    uint64_t offset, count;
    mq_codec_t codec;
    uint64_t payload_len;
} mq_tensor_hdr_t;


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

/* One message: the envelope (who sends it about which iteration), the body of its type and,
 * after a receive, the payload frames. Only the body of the message's type is meaningful
 * (msg->iterate for an ITERATE, ...). Reuse one per socket: mq_msg_reset releases frames. */
typedef struct mq_msg {
    mq_msg_type_t type;
    uint8_t peer[MQ_WIRE_MAX_PEER]; /* ROUTER routing id (received from / to send to) */
    size_t peer_len;
    /* the envelope (proto/mqgrad.proto's Meta) */
    uint64_t iter;        /* the iteration the message is about */
    uint32_t rank;        /* the sender's rank in its role */
    uint64_t incarnation; /* the sending process */
    mq_role_t role;       /* the sender's role */
    double sim_time;      /* simulated clock: the sender's time (s) when the message left */
    uint64_t run_id;      /* 0 when sent: the sending thread's (mq_wire_set_run_id) */
    /* ownership (SECURITY.md): the sender's token (0 when sent: the thread's, see
     * mq_wire_set_token) and its term */
    bool has_token;
    uint8_t token[MQ_TOKEN_LEN];
    uint32_t term;
    /* received over CURVE: the sender's public key (Z85), "" otherwise (mqgrad/security.h) */
    char user_id[41];
    /* the body: one member per type (mqgrad_msgs.h), all at the same place */
    union {
        MQ_MSG_BODY_MEMBERS
    };
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
    /* The entries of the body's [grow] fields (proto/gen_c.py: the member sets, the servers'
     * endpoints), received or copied: in room_small_, or past its size in a heap block kept
     * for the next ones (room_, freed by mq_msg_free). Not cleared by mq_msg_init. */
    unsigned char *room_;
    size_t room_cap_;
    _Alignas(16) unsigned char room_small_[4096];
} mq_msg_t;

/* Zeroes the envelope of MSG and the body of TYPE for a new message of TYPE (keeps nothing
 * of the last but the peer, so a reply goes back to whoever sent the request). */
void mq_msg_init(mq_msg_t *msg, mq_msg_type_t type);
/* Releases received payload frames. Safe to call twice. */
void mq_msg_reset(mq_msg_t *msg);
/* Releases the frames and the storage a message of more entries than room_small_ holds
 * left (a service's messages, when it ends). MSG stays usable. */
void mq_msg_free(mq_msg_t *msg);

/* Copies SRC's envelope, body (its [grow] fields' entries into DST's own storage) and tensor
 * headers into DST, without payload frames (DST's payload pointers are NULL): for a message
 * kept past the next receive (an ITERATE that waits its turn). DST must hold no frames.
 * 0, or -1 (error set) when DST's storage cannot grow to SRC's entries. */
int mq_msg_copy(mq_msg_t *dst, const mq_msg_t *src);
/* Moves MSG's received payload frames into DST[0..n), n returned: the caller keeps the bytes
 * past the next receive without copying them, and closes each with zmq_msg_close. MSG's
 * payload pointers are NULL afterwards. */
uint32_t mq_msg_take_frames(mq_msg_t *msg, zmq_msg_t *dst);

/* Calls ON's handler for MSG's type with SELF, the message and its body; false when ON has
 * none for that type (the caller counts it as MQ_DROP_TYPE, or answers). */
bool mq_dispatch(const mq_handlers_t *on, void *self, mq_msg_t *msg);

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
