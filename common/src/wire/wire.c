/* Wire module: packs and unpacks mq_msg_t as a protobuf Meta frame plus raw payload frames,
 * sends payloads without copying, and validates everything it receives. The only file that
 * includes the generated protobuf-c header. */
#include "mqgrad/wire.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "mqgrad.pb-c.h"
#include "mqgrad/util.h"

/* ---- what the generated code needs (mqgrad_msgs.inc) -------------------------------------- */

/* BYTES rounded up to the alignment of any entry. */
static size_t s_gen_round(size_t bytes)
{
    return (bytes + 15) & ~(size_t)15;
}

/* NEED bytes of MSG's storage for its body's [grow] fields: its small room, or its heap block
 * grown (at least doubled) when that is too small; NULL when it cannot grow. */
static unsigned char *s_gen_room(mq_msg_t *msg, size_t need)
{
    if (need <= sizeof msg->room_small_)
        return msg->room_small_;
    if (need > msg->room_cap_) {
        size_t cap = need > 2 * msg->room_cap_ ? need : 2 * msg->room_cap_;
        unsigned char *bigger = realloc(msg->room_, cap);
        if (!bigger)
            return NULL;
        msg->room_ = bigger;
        msg->room_cap_ = cap;
    }
    return msg->room_;
}

/* N pointers for a [grow] string field being sent, from this thread's scratch (pointers the
 * packer holds until the message is packed); NULL when it cannot grow. */
static _Thread_local char **s_strv;
static _Thread_local size_t s_strv_cap;
static char **s_gen_strv(size_t n)
{
    if (n > s_strv_cap) {
        char **bigger = realloc(s_strv, n * sizeof *bigger);
        if (!bigger)
            return NULL;
        s_strv = bigger;
        s_strv_cap = n;
    }
    return s_strv;
}

/* mq_run_config_to_pb, mq_report_from_pb, ...: generated from the proto (proto/gen_c.py) */
#include "mqgrad_msgs.inc"

/* Meta frames are small; anything bigger than this is garbage or an attack. Unpacked, a
 * frame's lists may take four times its bytes (a 1-byte varint, a 4-byte integer). */
#define S_MAX_META MQ_WIRE_MAX_META
#define S_ARENA_SIZE (4 * S_MAX_META + 256 * 1024)

/* ---- names ------------------------------------------------------------------------ */

const char *mq_msg_type_name(mq_msg_type_t t)
{
#define S_NAME(id, name, member) name,
    static const char *names[] = {"unknown", MQ_MSG_TYPES(S_NAME)};
#undef S_NAME
    return (t >= 0 && t < MQ_MSG_COUNT_) ? names[t] : "invalid";
}

/* ---- message lifecycle -------------------------------------------------------------- */

void mq_msg_init(mq_msg_t *msg, mq_msg_type_t type)
{
    mq_msg_reset(msg);
    /* Keep the peer: replies go back to whoever sent the request. */
    uint8_t peer[MQ_WIRE_MAX_PEER];
    size_t peer_len = msg->peer_len;
    memcpy(peer, msg->peer, peer_len);
    memset(msg, 0, offsetof(mq_msg_t, welcome));
    memset(&msg->welcome, 0, s_body_size(type)); /* the body of this type, not the largest */
    memset(&msg->ntensors, 0, offsetof(mq_msg_t, frames_) - offsetof(mq_msg_t, ntensors));
    msg->layout.n = 0;
    memcpy(msg->peer, peer, peer_len);
    msg->peer_len = peer_len;
    msg->type = type;
}

void mq_msg_reset(mq_msg_t *msg)
{
    for (uint32_t i = 0; i < msg->nframes_; i++)
        zmq_msg_close(&msg->frames_[i]);
    msg->nframes_ = 0;
    for (uint32_t i = 0; i < MQ_WIRE_MAX_TENSORS; i++) {
        msg->payload[i] = NULL;
        msg->payload_len[i] = 0;
    }
}

int mq_msg_copy(mq_msg_t *dst, const mq_msg_t *src)
{
    if (dst == src)
        return 0;
    memcpy(dst, src, offsetof(mq_msg_t, frames_));
    for (uint32_t i = 0; i < MQ_WIRE_MAX_TENSORS; i++) {
        dst->payload[i] = NULL;
        dst->payload_len[i] = 0;
    }
    dst->nframes_ = 0;
    if (s_body_own(dst) != 0) { /* its lists still point at SRC's: none at all instead */
        mq_msg_init(dst, MQ_MSG_UNKNOWN);
        mq_err_set("no memory to keep a message's lists");
        return -1;
    }
    return 0;
}

void mq_msg_free(mq_msg_t *msg)
{
    mq_msg_reset(msg);
    free(msg->room_);
    msg->room_ = NULL;
    msg->room_cap_ = 0;
}

uint32_t mq_msg_take_frames(mq_msg_t *msg, zmq_msg_t *dst)
{
    uint32_t n = msg->nframes_;
    for (uint32_t i = 0; i < n; i++) {
        zmq_msg_init(&dst[i]);
        zmq_msg_move(&dst[i], &msg->frames_[i]);
        zmq_msg_close(&msg->frames_[i]);
        msg->payload[i] = NULL;
        msg->payload_len[i] = 0;
    }
    msg->nframes_ = 0;
    return n;
}

void mq_wire_prepare(zsock_t *sock, int linger_ms, int64_t max_msg)
{
    void *h = zsock_resolve(sock);
    zmq_setsockopt(h, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    zsock_set_linger(sock, linger_ms);
    zsock_set_sndtimeo(sock, 10000);
    if (zsock_type(sock) == ZMQ_ROUTER)
        zsock_set_router_mandatory(sock, 1);
}

/* ---- packing ------------------------------------------------------------------------ */

/* Packs MSG's Meta into a per-thread buffer that grows as needed (rarely: Meta is small). */
static _Thread_local uint64_t s_run_id;
static _Thread_local bool s_has_token;
static _Thread_local uint8_t s_token[MQ_TOKEN_LEN];
static _Thread_local uint32_t s_term;
static _Thread_local uint8_t *s_pack_buf;
static _Thread_local size_t s_pack_cap;

static int s_pack_meta(mq_msg_t *msg, uint8_t **out, size_t *out_len)
{
    Mqgrad__Meta meta = MQGRAD__META__INIT;
    s_body_pbx body;
    Mqgrad__TensorHeader th[MQ_WIRE_MAX_TENSORS];
    Mqgrad__TensorHeader *thp[MQ_WIRE_MAX_TENSORS];
    Mqgrad__TensorHeader lh[MQ_LAYOUT_MAX];
    Mqgrad__TensorHeader *lhp[MQ_LAYOUT_MAX];
    uint8_t params[MQ_WIRE_MAX_TENSORS][4 * MQ_CODEC_NPARAMS];

    meta.version = MQ_WIRE_VERSION;
    meta.iter = msg->iter;
    meta.rank = msg->rank;
    meta.incarnation = msg->incarnation;
    meta.role = (Mqgrad__Role)msg->role;
    meta.sim_time = msg->sim_time;
    meta.run_id = msg->run_id ? msg->run_id : s_run_id;
    if (s_body_to_pb(msg, &body, &meta) != 0)
        return -1;
    if (msg->layout.n > MQ_LAYOUT_MAX) {
        mq_err_set("a layout of %u tensors (at most %d)", msg->layout.n, MQ_LAYOUT_MAX);
        return -1;
    }
    for (uint32_t i = 0; i < msg->layout.n; i++) {
        mqgrad__tensor_header__init(&lh[i]);
        lh[i].name = (char *)msg->layout.t[i].name;
        lh[i].count = msg->layout.t[i].count;
        lhp[i] = &lh[i];
    }
    meta.n_layout = msg->layout.n;
    meta.layout = lhp;
    if (msg->has_token || s_has_token) {
        meta.token.data = msg->has_token ? msg->token : s_token;
        meta.token.len = MQ_TOKEN_LEN;
        meta.term = msg->has_token ? msg->term : s_term;
    }
    if (msg->ntensors > MQ_WIRE_MAX_TENSORS) {
        mq_err_set("too many tensors (%u)", msg->ntensors);
        return -1;
    }
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        const mq_tensor_hdr_t *h = &msg->tensors[i];
        mqgrad__tensor_header__init(&th[i]);
        th[i].name = (char *)h->name;
        th[i].offset = h->offset;
        th[i].count = h->count;
        th[i].codec = h->codec.id;
        th[i].bits = h->codec.id == MQ_CODEC_ID_none ? 0 : (uint32_t)h->codec.bits;
        /* the parameter words up to the last one set, little-endian */
        size_t np = MQ_CODEC_NPARAMS;
        while (np > 0 && h->codec.param[np - 1] == 0)
            np--;
        for (size_t k = 0; k < np; k++)
            for (int b = 0; b < 4; b++)
                params[i][4 * k + (size_t)b] = (uint8_t)(h->codec.param[k] >> (8 * b));
        th[i].params = (ProtobufCBinaryData){.len = 4 * np, .data = params[i]};
        th[i].payload_len = h->payload_len;
        thp[i] = &th[i];
    }
    meta.n_tensors = msg->ntensors;
    meta.tensors = thp;

    size_t need = mqgrad__meta__get_packed_size(&meta);
    if (need > s_pack_cap) {
        uint8_t *bigger = realloc(s_pack_buf, need);
        if (!bigger) {
            mq_err_set("out of memory packing a %zu-byte meta", need);
            return -1;
        }
        s_pack_buf = bigger;
        s_pack_cap = need;
    }
    *out_len = mqgrad__meta__pack(&meta, s_pack_buf);
    *out = s_pack_buf;
    return 0;
}

/* ---- sending ------------------------------------------------------------------------ */

static void s_payload_msg(zmq_msg_t *zm, const mq_payload_t *p)
{
    if (p->free_fn && p->len > 0) {
        zmq_msg_init_data(zm, (void *)p->data, p->len, p->free_fn, p->hint);
    } else {
        zmq_msg_init_size(zm, p->len);
        if (p->len)
            memcpy(zmq_msg_data(zm), p->data, p->len);
        if (p->free_fn)
            p->free_fn((void *)p->data, p->hint);
    }
}

/* Builds the meta and payload zmq messages. Fills frames[0] with the meta. */
static int s_build(mq_msg_t *msg, const mq_payload_t *payloads, size_t np, zmq_msg_t *frames)
{
    uint8_t *meta;
    size_t meta_len;
    if (np != msg->ntensors) {
        mq_err_set("%s: %zu payloads for %u tensor headers", mq_msg_type_name(msg->type), np,
                   msg->ntensors);
        goto err;
    }
    for (size_t i = 0; i < np; i++)
        msg->tensors[i].payload_len = payloads[i].len;
    if (s_pack_meta(msg, &meta, &meta_len) != 0)
        goto err;
    zmq_msg_init_size(&frames[0], meta_len);
    memcpy(zmq_msg_data(&frames[0]), meta, meta_len);
    msg->wire_bytes = meta_len;
    for (size_t i = 0; i < np; i++) {
        s_payload_msg(&frames[1 + i], &payloads[i]);
        msg->wire_bytes += payloads[i].len;
    }
    return 0;
err:
    for (size_t i = 0; i < np; i++)
        if (payloads[i].free_fn)
            payloads[i].free_fn((void *)payloads[i].data, payloads[i].hint);
    return -1;
}

/* Sends NF frames (after an optional routing id); closes every frame whatever happens. On
 * failure errno is the failed send's. */
static int s_send_frames(void *h, const uint8_t *peer, size_t peer_len, zmq_msg_t *frames,
                         size_t nf, int flags)
{
    size_t i = 0;
    int rc = 0, err = 0;
    if (peer_len > 0 && zmq_send(h, peer, peer_len, ZMQ_SNDMORE | flags) < 0) {
        err = errno;
        mq_err_set("cannot route to peer: %s", zmq_strerror(err));
        rc = -1;
    }
    for (; rc == 0 && i < nf; i++) {
        if (zmq_msg_send(&frames[i], h, (i + 1 < nf ? ZMQ_SNDMORE : 0) | flags) < 0) {
            err = errno;
            mq_err_set("send failed: %s", zmq_strerror(err));
            rc = -1;
            zmq_msg_close(&frames[i]);
        }
    }
    for (; i < nf; i++)
        zmq_msg_close(&frames[i]);
    if (rc != 0)
        errno = err;
    return rc;
}

int mq_wire_send(zsock_t *sock, mq_msg_t *msg, const mq_payload_t *payloads, size_t npayloads)
{
    zmq_msg_t frames[MQ_WIRE_MAX_TENSORS + 1];
    if (s_build(msg, payloads, npayloads, frames) != 0)
        return -1;
    bool router = zsock_type(sock) == ZMQ_ROUTER;
    return s_send_frames(zsock_resolve(sock), msg->peer, router ? msg->peer_len : 0, frames,
                         npayloads + 1, 0);
}

int mq_wire_reply(zsock_t *sock, mq_msg_t *msg, mq_drops_t *drops)
{
    return mq_wire_reply_payloads(sock, msg, NULL, 0, drops);
}

int mq_wire_reply_payloads(zsock_t *sock, mq_msg_t *msg, const mq_payload_t *payloads,
                           size_t npayloads, mq_drops_t *drops)
{
    zmq_msg_t frames[MQ_WIRE_MAX_TENSORS + 1];
    if (s_build(msg, payloads, npayloads, frames) != 0)
        return -1;
    bool router = zsock_type(sock) == ZMQ_ROUTER;
    /* Once a message's first frame is queued ZeroMQ takes the rest: no half message. */
    if (s_send_frames(zsock_resolve(sock), msg->peer, router ? msg->peer_len : 0, frames,
                      npayloads + 1, ZMQ_DONTWAIT) == 0)
        return 0;
    int err = errno;
    if (drops && (err == EAGAIN || err == EHOSTUNREACH))
        mq_drops_note(drops, MQ_DROP_UNREAD, msg->peer, msg->peer_len,
                      err == EAGAIN ? "a reply its peer does not read (its queue is full)"
                                    : "a reply to a peer that is gone");
    errno = err;
    return -1;
}

/* ---- receiving ---------------------------------------------------------------------- */

bool mq_wire_take(zsock_t *sock, mq_msg_t *msg, mq_drops_t *drops, const void *from,
                  size_t from_len)
{
    mq_drop_t drop;
    if (mq_wire_recv(sock, msg, &drop) == 0)
        return true;
    if (drop != MQ_DROP_NONE)
        mq_drops_note(drops, drop, from ? from : msg->peer, from ? from_len : msg->peer_len,
                      mq_err_last());
    return false;
}

typedef struct {
    uint8_t mem[S_ARENA_SIZE];
    size_t used;
} s_arena_t;

static void *s_arena_alloc(void *data, size_t size)
{
    s_arena_t *a = data;
    size = (size + 15) & ~(size_t)15;
    if (size > sizeof a->mem - a->used)
        return NULL;
    void *p = a->mem + a->used;
    a->used += size;
    return p;
}

static void s_arena_free(void *data, void *ptr)
{
    (void)data;
    (void)ptr; /* released all at once when the arena is reset */
}

/* Checks one tensor header against its payload frame: the codec is registered with valid
 * parameters, the length is the header's and within the codec's bound, and the codec accepts
 * the payload (the one validation a payload gets). */
static mq_drop_t s_check_tensor(const Mqgrad__TensorHeader *t, size_t frame_len,
                                mq_tensor_hdr_t *out, const uint8_t *data)
{
    /* s_gen_str (mqgrad_msgs.inc): control characters as '?', an overlong name refused */
    if (!s_gen_str(out->name, sizeof out->name, t->name, "TensorHeader.name"))
        return MQ_DROP_LAYOUT;
    out->offset = t->offset;
    out->count = t->count;
    out->payload_len = t->payload_len;
    memset(&out->codec, 0, sizeof out->codec);
    out->codec.id = t->codec;
    out->codec.bits = t->codec == MQ_CODEC_ID_none ? 32 : (int)(t->bits > 64 ? 64 : t->bits);
    if (t->count > (1ULL << 32) || t->offset > (1ULL << 40)) {
        mq_err_set("tensor '%s': count %llu or offset %llu out of range", out->name,
                   (unsigned long long)t->count, (unsigned long long)t->offset);
        return MQ_DROP_TOO_MANY;
    }
    if (t->params.len % 4 != 0 || t->params.len > 4 * MQ_CODEC_NPARAMS) {
        mq_err_set("tensor '%s': codec parameter block of %zu bytes (expected a multiple of 4, "
                   "at most %d)",
                   out->name, t->params.len, 4 * MQ_CODEC_NPARAMS);
        return MQ_DROP_CODEC;
    }
    for (size_t k = 0; k < t->params.len / 4; k++) {
        const uint8_t *p = t->params.data + 4 * k;
        out->codec.param[k] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24;
    }
    if (mq_codec_validate(&out->codec) != 0)
        return MQ_DROP_CODEC;
    if (t->payload_len != frame_len) {
        mq_err_set("tensor '%s': payload is %zu bytes, header says %llu", out->name, frame_len,
                   (unsigned long long)t->payload_len);
        return MQ_DROP_LENGTH;
    }
    /* One validation, the codec's (its size rule first); a refusal is a length drop when the
     * size was what it refused. */
    if (mq_codec_validate_payload(&out->codec, data, frame_len, t->count) != 0) {
        char why[256];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("tensor '%s': %s", out->name, why);
        return mq_codec_size_ok(&out->codec, frame_len, t->count) ? MQ_DROP_PAYLOAD
                                                                   : MQ_DROP_LENGTH;
    }
    return MQ_DROP_NONE;
}

/* Converts an unpacked Meta into MSG and validates the payload frames against it. */
static mq_drop_t s_from_pb(const Mqgrad__Meta *meta, mq_msg_t *msg)
{
    if (meta->version != MQ_WIRE_VERSION) {
        mq_err_set("protocol version %u, expected %u", meta->version, MQ_WIRE_VERSION);
        return MQ_DROP_VERSION;
    }
    if (meta->n_tensors > MQ_WIRE_MAX_TENSORS) {
        mq_err_set("%zu tensors exceed the limit of %d", meta->n_tensors, MQ_WIRE_MAX_TENSORS);
        return MQ_DROP_TOO_MANY;
    }
    if (meta->n_tensors != msg->nframes_) {
        mq_err_set("%zu tensor headers but %u payload frames", meta->n_tensors, msg->nframes_);
        return MQ_DROP_FRAMES;
    }
    mq_drop_t d = s_body_from_pb(meta, msg);
    if (d != MQ_DROP_NONE) {
        if (msg->type != MQ_MSG_UNKNOWN && d != MQ_DROP_TYPE) {
            char why[256];
            snprintf(why, sizeof why, "%s", mq_err_last());
            mq_err_set("%s: %s", mq_msg_type_name(msg->type), why);
        }
        return d;
    }
    msg->iter = meta->iter;
    msg->rank = meta->rank;
    msg->incarnation = meta->incarnation;
    msg->role = meta->role == MQGRAD__ROLE__ROLE_WORKER   ? MQ_ROLE_WORKER
                : meta->role == MQGRAD__ROLE__ROLE_SERVER ? MQ_ROLE_SERVER
                                                          : MQ_ROLE_NONE;
    msg->sim_time = meta->sim_time;
    msg->run_id = meta->run_id;
    if (!isfinite(msg->sim_time) || msg->sim_time < 0) {
        mq_err_set("%s: simulated time %g is not a time of the run", mq_msg_type_name(msg->type),
                   msg->sim_time);
        return MQ_DROP_NONFINITE;
    }
    if (msg->type == MQ_MSG_ITERATE && msg->iterate.run_time < 0) {
        mq_err_set("iterate: run time %g before the run's start", msg->iterate.run_time);
        return MQ_DROP_NONFINITE;
    }
    if (meta->n_layout > MQ_LAYOUT_MAX) {
        mq_err_set("a layout of %zu tensors (at most %d)", meta->n_layout, MQ_LAYOUT_MAX);
        return MQ_DROP_TOO_MANY;
    }
    msg->layout.n = (uint32_t)meta->n_layout;
    for (size_t i = 0; i < meta->n_layout; i++) {
        const Mqgrad__TensorHeader *t = meta->layout[i];
        if (!s_gen_str(msg->layout.t[i].name, sizeof msg->layout.t[i].name, t->name,
                       "Meta.layout's name"))
            return MQ_DROP_LAYOUT;
        msg->layout.t[i].count = t->count;
    }
    if (msg->layout.n > 0 && mq_layout_check(&msg->layout) != 0)
        return MQ_DROP_LAYOUT;
    if (meta->token.len != 0 && meta->token.len != MQ_TOKEN_LEN) {
        mq_err_set("token of %zu bytes (%d expected)", meta->token.len, MQ_TOKEN_LEN);
        return MQ_DROP_GARBAGE;
    }
    msg->has_token = meta->token.len == MQ_TOKEN_LEN;
    msg->term = meta->term;
    if (msg->has_token)
        memcpy(msg->token, meta->token.data, MQ_TOKEN_LEN);
    msg->ntensors = (uint32_t)meta->n_tensors;
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        const uint8_t *data = zmq_msg_data(&msg->frames_[i]);
        size_t len = zmq_msg_size(&msg->frames_[i]);
        d = s_check_tensor(meta->tensors[i], len, &msg->tensors[i], data);
        if (d != MQ_DROP_NONE)
            return d;
        msg->payload[i] = data;
        msg->payload_len[i] = len;
    }
    return MQ_DROP_NONE;
}

/* Receives the remaining frames of a message; extra ones beyond the limit are drained. */
static mq_drop_t s_recv_payloads(void *h, mq_msg_t *msg, bool more)
{
    mq_drop_t drop = MQ_DROP_NONE;
    while (more) {
        zmq_msg_t *f = msg->nframes_ < MQ_WIRE_MAX_TENSORS ? &msg->frames_[msg->nframes_] : NULL;
        zmq_msg_t sink;
        zmq_msg_t *dst = f ? f : &sink;
        zmq_msg_init(dst);
        if (zmq_msg_recv(dst, h, 0) < 0) {
            zmq_msg_close(dst);
            mq_err_set("receive failed mid-message: %s", zmq_strerror(errno));
            return MQ_DROP_FRAMES;
        }
        more = zmq_msg_more(dst);
        msg->wire_bytes += zmq_msg_size(dst);
        if (f) {
            msg->nframes_++;
        } else {
            zmq_msg_close(&sink);
            mq_err_set("more than %d payload frames", MQ_WIRE_MAX_TENSORS);
            drop = MQ_DROP_TOO_MANY;
        }
    }
    return drop;
}

static _Thread_local s_arena_t *s_arena;

void mq_wire_set_run_id(uint64_t run_id)
{
    s_run_id = run_id;
}

uint64_t mq_wire_run_id(void)
{
    return s_run_id;
}

void mq_wire_set_token(const uint8_t *token, uint32_t term)
{
    s_has_token = token != NULL;
    s_term = token ? term : 0;
    if (token)
        memcpy(s_token, token, MQ_TOKEN_LEN);
}

void mq_wire_thread_cleanup(void)
{
    free(s_arena);
    s_arena = NULL;
    free(s_strv);
    s_strv = NULL;
    s_strv_cap = 0;
    free(s_pack_buf);
    s_pack_buf = NULL;
    s_pack_cap = 0;
}

int mq_wire_recv(zsock_t *sock, mq_msg_t *msg, mq_drop_t *drop)
{
    s_arena_t *arena = s_arena;
    void *h = zsock_resolve(sock);
    mq_msg_init(msg, MQ_MSG_UNKNOWN);
    msg->peer_len = 0;
    *drop = MQ_DROP_NONE;
    zmq_msg_t first;
    zmq_msg_init(&first);
    if (zmq_msg_recv(&first, h, 0) < 0) {
        int e = errno;
        zmq_msg_close(&first);
        mq_err_set("receive: %s", zmq_strerror(e));
        errno = e;
        return -1;
    }
    bool more = zmq_msg_more(&first);
    if (zsock_type(sock) == ZMQ_ROUTER) {
        msg->peer_len = zmq_msg_size(&first) > MQ_WIRE_MAX_PEER ? MQ_WIRE_MAX_PEER
                                                                : zmq_msg_size(&first);
        memcpy(msg->peer, zmq_msg_data(&first), msg->peer_len);
        zmq_msg_close(&first);
        zmq_msg_init(&first);
        if (!more || zmq_msg_recv(&first, h, 0) < 0) {
            zmq_msg_close(&first);
            mq_err_set("routed message without a body");
            *drop = MQ_DROP_FRAMES;
            return -1;
        }
        more = zmq_msg_more(&first);
    }
    msg->wire_bytes = zmq_msg_size(&first);
    const char *uid = zmq_msg_gets(&first, "User-Id"); /* set by the CURVE handshake */
    if (uid)
        snprintf(msg->user_id, sizeof msg->user_id, "%s", uid);
    mq_drop_t d = s_recv_payloads(h, msg, more);
    if (d == MQ_DROP_NONE && zmq_msg_size(&first) > S_MAX_META) {
        mq_err_set("meta frame of %zu bytes (limit %d)", zmq_msg_size(&first), (int)S_MAX_META);
        d = MQ_DROP_TOO_MANY;
    }
    Mqgrad__Meta *meta = NULL;
    if (d == MQ_DROP_NONE) {
        if (!arena && !(arena = s_arena = malloc(sizeof *arena))) {
            mq_err_set("out of memory");
            d = MQ_DROP_GARBAGE;
        } else {
            arena->used = 0;
            ProtobufCAllocator alloc = {s_arena_alloc, s_arena_free, arena};
            meta = mqgrad__meta__unpack(&alloc, zmq_msg_size(&first), zmq_msg_data(&first));
            if (!meta) {
                mq_err_set("meta frame (%zu bytes) does not parse", zmq_msg_size(&first));
                d = MQ_DROP_GARBAGE;
            }
        }
    }
    if (d == MQ_DROP_NONE)
        d = s_from_pb(meta, msg); /* arena memory needs no free_unpacked */
    zmq_msg_close(&first);
    if (d != MQ_DROP_NONE) {
        mq_msg_reset(msg);
        *drop = d;
        return -1;
    }
    return 0;
}
