/* The scheduler link and actor pipe that servers and workers share. */
#include "mqgrad/node.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mqgrad/service.h"
#include "mqgrad/util.h"

int mq_node_open(mq_node_t *n, zsock_t *pipe, const char *endpoint, mq_role_t role,
                 const char *advertise, double peer_timeout)
{
    n->pipe = pipe;
    n->role = role;
    n->peer_timeout = peer_timeout;
    n->last_heard = mq_now_s();
    n->incarnation = (uint64_t)zclock_time() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)n;
    snprintf(n->endpoint, sizeof n->endpoint, "%s", endpoint);
    n->sched = zsock_new(ZMQ_DEALER);
    if (!n->sched) {
        mq_err_set("cannot create a socket");
        return -1;
    }
    mq_wire_prepare(n->sched, 2000);
    if (zsock_connect(n->sched, "%s", endpoint) != 0) {
        mq_err_set("cannot connect to the scheduler at '%s'", endpoint);
        return -1;
    }
    mq_msg_init(&n->msg, MQ_MSG_REGISTER);
    n->msg.role = role;
    n->msg.incarnation = n->incarnation;
    snprintf(n->msg.endpoint, sizeof n->msg.endpoint, "%s", advertise ? advertise : "");
    return mq_wire_send(n->sched, &n->msg, NULL, 0);
}

void mq_node_close(mq_node_t *n)
{
    zsock_destroy(&n->sched);
    mq_msg_reset(&n->msg);
}

int mq_node_ready(mq_node_t *n, uint32_t rank)
{
    mq_msg_init(&n->msg, MQ_MSG_READY);
    n->msg.role = n->role;
    n->msg.rank = rank;
    return mq_wire_send(n->sched, &n->msg, NULL, 0);
}

void mq_node_finish(mq_node_t *n, int code, const char *what)
{
    if (code != 0)
        mq_error("%s: %s", what, mq_err_last());
    if (!n->finished) {
        n->finished = true;
        mq_service_done(n->pipe, code);
    }
}

int mq_node_recv(mq_node_t *n, mq_msg_t *msg)
{
    mq_drop_t drop;
    if (mq_wire_recv(n->sched, msg, &drop) != 0) {
        if (drop != MQ_DROP_NONE)
            mq_drops_note(&n->drops, drop, (const uint8_t *)"sched", 5, mq_err_last());
        return -1;
    }
    n->last_heard = mq_now_s();
    if (n->finished || msg->type == MQ_MSG_HEARTBEAT)
        goto ignore;
    switch (msg->type) {
    case MQ_MSG_WELCOME:
    case MQ_MSG_ITERATE:
    case MQ_MSG_STOP:
        return 0;
    case MQ_MSG_ERROR:
        mq_err_set("the scheduler refused us: %s", msg->text);
        mq_node_finish(n, 1, "register");
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
    double silent = mq_now_s() - n->last_heard;
    if (!n->finished && silent > n->peer_timeout) {
        mq_err_set("no word from the scheduler at %s for %.0f s", n->endpoint, silent);
        mq_node_finish(n, 1, "scheduler gone");
    }
}

int mq_node_on_pipe(zloop_t *loop, zsock_t *pipe, void *arg)
{
    mq_node_t *n = arg;
    char *cmd = zstr_recv(pipe);
    int rc = 0;
    if (!cmd || streq(cmd, "$TERM")) {
        rc = -1;
    } else if (streq(cmd, "PORT")) {
        zstr_sendf(pipe, "%d", n->port);
    } else if (streq(cmd, "DROPS")) {
        char buf[512];
        mq_drops_format(&n->drops, buf, sizeof buf);
        zstr_send(pipe, buf);
    }
    zstr_free(&cmd);
    return rc;
}
