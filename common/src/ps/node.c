/* The scheduler link and actor pipe that servers and workers share. */
#include "mqgrad/node.h"

#include <stdio.h>
#include <string.h>

#include "mqgrad/service.h"
#include "mqgrad/util.h"

/* A DEALER to the scheduler at n->endpoint, with the node's keys; NULL with an error. */
static zsock_t *s_sched_socket(mq_node_t *n)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    if (!s) {
        mq_err_set("cannot create a socket");
        return NULL;
    }
    mq_wire_prepare(s, 2000, MQ_WIRE_MAX_CONTROL_MSG);
    if (mq_sec_client(n->sec, s, MQ_KEY_SCHEDULER) != 0) {
        zsock_destroy(&s);
        return NULL;
    }
    if (zsock_connect(s, "%s", n->endpoint) != 0) {
        mq_err_set("cannot connect to the scheduler at '%s'", n->endpoint);
        zsock_destroy(&s);
        return NULL;
    }
    return s;
}

int mq_node_open(mq_node_t *n, zsock_t *pipe, const char *endpoint, mq_role_t role,
                 const char *advertise, double peer_timeout, mq_sec_t *sec)
{
    n->pipe = pipe;
    n->sec = sec;
    n->role = role;
    n->peer_timeout = peer_timeout;
    n->last_heard = n->registered = mq_now_s();
    n->heard = false;
    n->loop = NULL;
    n->incarnation = mq_incarnation_new();
    snprintf(n->endpoint, sizeof n->endpoint, "%s", endpoint);
    n->sched = s_sched_socket(n);
    if (!n->sched)
        return -1;
    mq_msg_init(&n->msg, MQ_MSG_REGISTER);
    n->msg.role = role;
    n->msg.incarnation = n->incarnation;
    n->msg.register_.prefer_shard = n->prefer_shard;
    snprintf(n->msg.register_.endpoint, sizeof n->msg.register_.endpoint, "%s",
             advertise ? advertise : "");
    if (n->layout)
        n->msg.layout = *n->layout;
    return mq_wire_send(n->sched, &n->msg, NULL, 0);
}

int mq_node_listen(mq_node_t *n, zloop_t *loop, zloop_reader_fn *fn, void *arg)
{
    n->loop = loop;
    n->on_sched = fn;
    n->on_sched_arg = arg;
    return zloop_reader(loop, n->sched, fn, arg);
}

/* The REGISTER again, on a new connection (see mq_node_check_peer): a guard against a
 * registration lost on the way. The case that prompted it, a restarted server whose
 * REGISTER went unanswered for the whole peer timeout, was this process's own I/O thread
 * blocked on a security monitor no one read (mq_sec_unserve), which no new connection
 * could get past. */
static void s_register_again(mq_node_t *n, double silent)
{
    zsock_t *s = s_sched_socket(n);
    if (!s) {
        mq_warn("cannot register with the scheduler again: %s", mq_err_last());
        return;
    }
    mq_warn("no answer from the scheduler at %s to this node's registration for %.0f s: "
            "sending it again on a new connection",
            n->endpoint, silent);
    zloop_reader_end(n->loop, n->sched);
    zsock_destroy(&n->sched);
    n->sched = s;
    n->msg.register_.attempt++;
    if (zloop_reader(n->loop, n->sched, n->on_sched, n->on_sched_arg) != 0)
        mq_warn("cannot read the scheduler's new connection");
    mq_wire_send(n->sched, &n->msg, NULL, 0); /* a full queue drops it: the next try goes */
}

/* ---- the heartbeat thread ---------------------------------------------------------------- */

typedef struct {
    char endpoint[256];
    mq_role_t role;
    uint32_t rank;
    uint64_t incarnation, run_id;
    mq_sec_t *sec;
    bool has_token;
    uint8_t token[MQ_TOKEN_LEN];
    uint32_t term;
    _Atomic uint64_t *pushed; /* the node's loop's progress (mq_node_t.pushed) */
} s_beat_args_t;

/* Sends HEARTBEAT every MQ_HEARTBEAT_MS on its own socket until $TERM; a refusal from the
 * scheduler (it took this node out of the run) goes up the pipe as "REFUSED <why>". */
static void s_beat_actor(zsock_t *pipe, void *args)
{
    s_beat_args_t a = *(s_beat_args_t *)args;
    free(args);
    zsock_t *sock = zsock_new(ZMQ_DEALER);
    mq_msg_t *msg = calloc(1, sizeof *msg);
    zsock_signal(pipe, 0);
    if (!sock || !msg || mq_sec_client(a.sec, sock, MQ_KEY_SCHEDULER) != 0 ||
        zsock_connect(sock, "%s", a.endpoint) != 0) {
        zsock_destroy(&sock);
        free(msg);
        zsock_wait(pipe); /* nothing to do but wait for $TERM */
        return;
    }
    mq_wire_prepare(sock, 0, MQ_WIRE_MAX_CONTROL_MSG);
    zsock_set_sndtimeo(sock, 0);
    mq_wire_set_run_id(a.run_id);
    mq_wire_set_token(a.has_token ? a.token : NULL, a.term);
    zpoller_t *poller = zpoller_new(pipe, sock, NULL);
    int64_t next = zclock_mono();
    bool refused = false;
    while (true) {
        int64_t now = zclock_mono();
        if (now >= next) {
            mq_msg_init(msg, MQ_MSG_HEARTBEAT);
            msg->role = a.role;
            msg->rank = a.rank;
            msg->incarnation = a.incarnation;
            msg->heartbeat.pushed = atomic_load_explicit(a.pushed, memory_order_relaxed);
            mq_wire_send(sock, msg, NULL, 0); /* a full queue drops it: the next one goes */
            next = now + MQ_HEARTBEAT_MS;
        }
        void *which = zpoller_wait(poller, (int)(next - now));
        if (which == pipe) {
            char *cmd = zstr_recv(pipe);
            bool term = !cmd || streq(cmd, "$TERM");
            zstr_free(&cmd);
            if (term)
                break;
        } else if (which == sock) {
            mq_drop_t drop;
            if (mq_wire_recv(sock, msg, &drop) == 0 && msg->type == MQ_MSG_ERROR && !refused) {
                refused = true; /* once: the node ends on it */
                zstr_sendf(pipe, "REFUSED %d %s", msg->error.retry ? 1 : 0, msg->error.reason);
            }
            mq_msg_reset(msg);
        } else if (zpoller_terminated(poller)) {
            break;
        }
    }
    zpoller_destroy(&poller);
    zsock_destroy(&sock);
    mq_msg_reset(msg);
    free(msg);
    mq_wire_thread_cleanup();
}

/* The node registers again from a clean state (mq_service_run starts it afresh). */
static void s_rejoin(mq_node_t *n)
{
    if (!n->finished) {
        n->finished = true;
        mq_service_done(n->pipe, MQ_EXIT_REJOIN);
    }
}

static int s_on_beat(zloop_t *loop, zsock_t *sock, void *arg)
{
    mq_node_t *n = arg;
    char *text = zstr_recv(sock);
    if (text && strncmp(text, "REFUSED ", 8) == 0 && strlen(text) > 10 && !n->finished) {
        bool retry = text[8] == '1';
        mq_warn("the scheduler does not count this node in its run: %s%s", text + 10,
                retry ? "; registering again" : "");
        if (retry) {
            s_rejoin(n);
        } else {
            mq_err_set("%s", text + 10);
            mq_node_finish(n, MQ_EXIT_REFUSED, "refused");
        }
    }
    zstr_free(&text);
    return 0;
}

int mq_node_welcomed(mq_node_t *n, zloop_t *loop, const mq_msg_t *welcome)
{
    n->rank = welcome->welcome.rank;
    n->run_id = welcome->run_id;
    n->has_token = welcome->welcome.has_token;
    memcpy(n->token, welcome->welcome.token, MQ_TOKEN_LEN);
    n->term = welcome->welcome.term;
    mq_wire_set_run_id(n->run_id);
    mq_wire_set_token(n->has_token ? n->token : NULL, n->term);
    s_beat_args_t *a = calloc(1, sizeof *a);
    if (!a) {
        mq_err_set("out of memory");
        return -1;
    }
    *a = (s_beat_args_t){.role = n->role, .rank = n->rank, .incarnation = n->incarnation,
                         .run_id = n->run_id, .sec = n->sec, .has_token = n->has_token,
                         .term = n->term, .pushed = &n->pushed};
    memcpy(a->token, n->token, MQ_TOKEN_LEN);
    snprintf(a->endpoint, sizeof a->endpoint, "%s", n->endpoint);
    n->beat = zactor_new(s_beat_actor, a);
    if (!n->beat) {
        free(a);
        mq_err_set("cannot start the heartbeat thread");
        return -1;
    }
    return zloop_reader(loop, zactor_sock(n->beat), s_on_beat, n);
}

void mq_node_close(mq_node_t *n)
{
    zactor_destroy(&n->beat);
    zsock_destroy(&n->sched);
    mq_msg_reset(&n->msg);
}

int mq_node_ready(mq_node_t *n, uint32_t rank)
{
    mq_msg_init(&n->msg, MQ_MSG_READY);
    n->msg.role = n->role;
    n->msg.rank = rank;
    n->msg.incarnation = n->incarnation;
    return mq_wire_send(n->sched, &n->msg, NULL, 0);
}

void mq_node_leave(mq_node_t *n)
{
    if (!n->sched || !n->run_id || n->finished)
        return;
    mq_msg_init(&n->msg, MQ_MSG_LEAVE);
    n->msg.role = n->role;
    n->msg.rank = n->rank;
    n->msg.incarnation = n->incarnation;
    mq_wire_send(n->sched, &n->msg, NULL, 0); /* the socket's linger delivers it */
}

void mq_node_finish(mq_node_t *n, int code, const char *what)
{
    if (code != 0)
        mq_error("%s: %s", what, mq_err_last());
    if (!n->finished) {
        n->finished = true;
        if (code != 0) {
            char why[600];
            snprintf(why, sizeof why, "%s: %s", what ? what : "failed", mq_err_last());
            mq_service_done_why(n->pipe, code, why);
        } else {
            mq_service_done(n->pipe, code);
        }
    }
}

int mq_node_recv(mq_node_t *n, mq_msg_t *msg)
{
    if (!mq_wire_take(n->sched, msg, &n->drops, "sched", 5))
        return -1;
    if (n->run_id && msg->run_id != n->run_id && msg->type != MQ_MSG_ERROR) {
        /* A scheduler that runs another run now (it was restarted): this node's state
         * belongs to the old one. */
        mq_warn("the scheduler at %s now runs run %016llx; this node belonged to run %016llx: "
                "registering again", n->endpoint, (unsigned long long)msg->run_id,
                (unsigned long long)n->run_id);
        s_rejoin(n);
        goto ignore;
    }
    n->last_heard = mq_now_s();
    n->heard = true;
    if (n->finished || msg->type == MQ_MSG_HEARTBEAT)
        goto ignore;
    switch (msg->type) {
    case MQ_MSG_WELCOME:
    case MQ_MSG_ITERATE:
    case MQ_MSG_COMMIT:
    case MQ_MSG_STOP:
        return 0;
    case MQ_MSG_ERROR:
        if (msg->error.retry) {
            mq_warn("the scheduler does not count this node in its run: %s; registering again",
                    msg->error.reason);
            s_rejoin(n);
        } else {
            mq_err_set("the scheduler refused us: %s", msg->error.reason);
            mq_node_finish(n, MQ_EXIT_REFUSED, "register");
        }
        break;
    default:
        mq_drops_note(&n->drops, MQ_DROP_TYPE, (const uint8_t *)"sched", 5,
                      mq_msg_type_name(msg->type));
    }
ignore:
    mq_msg_reset(msg);
    return -1;
}

void mq_node_check_peer(mq_node_t *n)
{
    double now = mq_now_s(), silent = now - n->last_heard;
    if (!n->finished && !n->heard && n->loop && n->msg.type == MQ_MSG_REGISTER &&
        now - n->registered >= MQ_REGISTER_RETRY_S && silent <= n->peer_timeout) {
        n->registered = now;
        s_register_again(n, silent);
    }
    if (!n->finished && silent > n->peer_timeout) {
        mq_err_set("no word from the scheduler at %s for %.0f s", n->endpoint, silent);
        mq_node_finish(n, 1, "scheduler gone");
    }
}
