/* The inbox every service reads its sockets through (mqgrad/inbox.h). */
#include "mqgrad/inbox.h"

void mq_inbox_handle(mq_inbox_t *in, zsock_t *sock)
{
    mq_msg_t *msg = in->msg;
    const void *from = in->from ? in->from : msg->peer;
    size_t from_len = in->from ? in->from_len : msg->peer_len;
    const char *why = NULL;
    mq_drop_t refused = in->refuse ? in->refuse(in->self, msg, &why) : MQ_DROP_NONE;
    if (refused != MQ_DROP_NONE) {
        mq_drops_note(in->drops, refused, from, from_len, why);
    } else if (mq_dispatch(in->on, in->self, msg)) {
        /* handled */
    } else if (msg->type == MQ_MSG_PING) { /* every service answers it */
        mq_msg_init(msg, MQ_MSG_PONG);
        mq_wire_reply(sock, msg, in->drops);
    } else {
        mq_drops_note(in->drops, MQ_DROP_TYPE, from, from_len, mq_msg_type_name(msg->type));
        if (in->unhandled)
            in->unhandled(in->self, msg);
    }
    mq_msg_reset(msg);
}

int mq_inbox_read(zloop_t *loop, zsock_t *sock, void *inbox)
{
    (void)loop;
    mq_inbox_t *in = inbox;
    if (mq_wire_take(sock, in->msg, in->drops, in->from, in->from_len))
        mq_inbox_handle(in, sock);
    if (in->after)
        in->after(in->self);
    return 0;
}
