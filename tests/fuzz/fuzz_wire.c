/* fuzz_wire: the receive path every service runs on its sockets, mq_wire_recv (the Meta
 * protobuf frame, the payload frames, the tensor headers, each codec's payload validation).
 *
 * The input is a list of frames, each a little-endian u16 length and its bytes (fuzz_util.h);
 * the first is the Meta frame. They are sent as one multipart message from a DEALER to a
 * ROUTER over inproc (the pair made once), and the ROUTER receives them with mq_wire_recv, as
 * the scheduler and the agent do. A message it accepts is then used as the services use it:
 * each payload decoded with mq_codec_decode_valid, the member set searched, the strings read,
 * WELCOME's codec and update rule parsed. Checked: a refused message is consumed whole (the
 * socket holds nothing after it), an accepted one has as many payloads as tensor headers. */
#include <czmq.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "mqgrad/optim.h"
#include "mqgrad/quant.h"
#include "mqgrad/wire.h"

#define S_MAX_FRAMES 40     /* more than MQ_WIRE_MAX_TENSORS + 1: the overflow path too */
#define S_MAX_DECODE (1u << 20) /* values decoded per tensor (services bound it by layout) */

static zsock_t *s_router, *s_dealer;
static mq_msg_t s_msg;
static mq_drops_t s_drops;
static float *s_dst;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    zsys_handler_set(NULL); /* leave SIGINT to libFuzzer */
    s_router = zsock_new(ZMQ_ROUTER);
    s_dealer = zsock_new(ZMQ_DEALER);
    if (!s_router || !s_dealer)
        abort();
    mq_wire_prepare(s_router, 0, MQ_WIRE_MAX_MSG);
    mq_wire_prepare(s_dealer, 0, MQ_WIRE_MAX_MSG);
    zsock_set_rcvtimeo(s_router, 5000);
    if (zsock_bind(s_router, "%s", "inproc://fuzz-wire") != 0 ||
        zsock_connect(s_dealer, "%s", "inproc://fuzz-wire") != 0)
        abort();
    s_dst = malloc(S_MAX_DECODE * sizeof *s_dst);
    if (!s_dst)
        abort();
    return 0;
}

/* What a service does with an accepted message, enough to touch every field it reads. */
static void s_use(const mq_msg_t *m)
{
    volatile size_t sink = strlen(mq_msg_type_name(m->type));
    const uint32_t *set = NULL;
    uint32_t nset = 0;
    switch (m->type) {
    case MQ_MSG_REGISTER:
        sink += strlen(m->register_.endpoint);
        break;
    case MQ_MSG_WELCOME: {
        const mq_welcome_t *w = &m->welcome;
        sink += strlen(w->config.model) + strlen(w->config.dataset) + strlen(w->config.link);
        for (uint32_t i = 0; i < w->n_servers; i++)
            sink += strlen(w->servers[i]);
        mq_codec_t c;
        mq_optim_t o;
        sink += (size_t)mq_codec_parse(w->config.codec, &c);
        sink += (size_t)mq_optim_parse(w->config.optimizer, &o);
        break;
    }
    case MQ_MSG_ITERATE:
        set = m->iterate.members, nset = m->iterate.n_members;
        break;
    case MQ_MSG_HAVE:
        set = m->have.members, nset = m->have.n_members;
        break;
    case MQ_MSG_COMMIT:
        set = m->commit.members, nset = m->commit.n_members;
        break;
    case MQ_MSG_PROGRESS:
        set = m->progress.members, nset = m->progress.n_members;
        break;
    case MQ_MSG_STATUS:
        sink += strlen(m->status.policy);
        break;
    case MQ_MSG_DECISION:
        sink += strlen(m->decision.policy);
        break;
    case MQ_MSG_POLICY_SET:
        sink += strlen(m->policy_set.policy);
        break;
    case MQ_MSG_ERROR:
        sink += strlen(m->error.reason);
        break;
    case MQ_MSG_STOP:
        sink += strlen(m->stop.reason);
        break;
    case MQ_MSG_SAVED:
        sink += strlen(m->saved.error);
        break;
    default:
        break;
    }
    for (uint32_t i = 0; i < nset; i++)
        if (mq_member_index(set, nset, set[i]) != (int)i)
            mq_fuzz_fail("fuzz_wire: member %u is not found at its place %u", set[i], i);
    if (set)
        sink += (size_t)mq_member_index(set, nset, m->rank);
    for (uint32_t i = 0; i < m->ntensors; i++) {
        const mq_tensor_hdr_t *t = &m->tensors[i];
        sink += strlen(t->name);
        if (!m->payload[i] && m->payload_len[i])
            mq_fuzz_fail("fuzz_wire: tensor %u has %zu bytes and no payload", i,
                         m->payload_len[i]);
        if (t->count > S_MAX_DECODE)
            continue;
        mq_codec_stats_t st;
        mq_codec_decode_valid(&t->codec, m->payload[i], m->payload_len[i], s_dst,
                              (size_t)t->count, 1.0f, false, &st);
        mq_codec_decode_valid(&t->codec, m->payload[i], m->payload_len[i], s_dst,
                              (size_t)t->count, -0.5f, true, NULL);
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size, *frame[S_MAX_FRAMES];
    size_t len[S_MAX_FRAMES];
    int n = 0;
    while (n < S_MAX_FRAMES && mq_fuzz_frame(&p, end, &frame[n], &len[n]))
        n++;
    if (n == 0)
        return 0;
    void *h = zsock_resolve(s_dealer);
    for (int i = 0; i < n; i++)
        if (zmq_send(h, frame[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            mq_fuzz_fail("fuzz_wire: send: %s", zmq_strerror(errno));
    mq_drop_t drop;
    int rc = mq_wire_recv(s_router, &s_msg, &drop);
    if (rc == 0) {
        if (s_msg.ntensors != (uint32_t)n - 1)
            mq_fuzz_fail("fuzz_wire: %u tensors accepted from %d payload frames", s_msg.ntensors,
                         n - 1);
        s_use(&s_msg);
    } else {
        if (drop == MQ_DROP_NONE) /* the message was sent: nothing received is the harness's */
            mq_fuzz_fail("fuzz_wire: receive failed without a drop reason: %s", mq_err_last());
        mq_drops_note(&s_drops, drop, s_msg.peer, s_msg.peer_len, mq_err_last());
    }
    /* A frame really there, not the flag alone: libzmq's ZMQ_EVENTS may say POLLIN with no
     * message behind it (seen once in 2 million runs, not again with the same seed). */
    if (zsock_events(s_router) & ZMQ_POLLIN) {
        zmq_msg_t left;
        zmq_msg_init(&left);
        int got = zmq_msg_recv(&left, zsock_resolve(s_router), ZMQ_DONTWAIT);
        zmq_msg_close(&left);
        if (got >= 0)
            mq_fuzz_fail("fuzz_wire: a message left frames behind for the next receive");
    }
    mq_msg_reset(&s_msg);
    return 0;
}
