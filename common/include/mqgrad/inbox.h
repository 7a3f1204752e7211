/* How every message reaches a service: an inbox on a socket. Its zloop reader takes one
 * message (mq_wire_take: a message the wire refuses is counted in DROPS and dropped), asks
 * the service whether the sender may send it (REFUSE), answers PING itself unless the
 * service handles PING, hands the message to the service's handler for its type
 * (mq_dispatch: the handler gets the body of its type), counts a type no handler takes as
 * MQ_DROP_TYPE, and releases the frames. A service declares its handlers as a table:
 *
 *     static const mq_handlers_t s_on_data = {.push = s_on_push, .pull = s_on_pull};
 *     self->data_in = (mq_inbox_t){.on = &s_on_data, .self = self, .msg = &self->in,
 *                                  .drops = &self->drops};
 *     zloop_reader(loop, self->data, mq_inbox_read, &self->data_in);
 */
#ifndef MQGRAD_INBOX_H
#define MQGRAD_INBOX_H

#include <czmq.h>

#include "mqgrad/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const mq_handlers_t *on; /* the handlers, by message type */
    void *self;              /* their first argument (and the hooks') */
    mq_msg_t *msg;           /* the message each read fills (reused) */
    mq_drops_t *drops;       /* where drops are counted */
    /* drops are counted under this name (FROM_LEN bytes); NULL: the sender's routing id */
    const void *from;
    size_t from_len;
    /* Who may send what: MQ_DROP_NONE takes MSG; another reason drops it, counted with *WHY
     * (the hook may answer the sender first). NULL: every sender may. */
    mq_drop_t (*refuse)(void *self, mq_msg_t *msg, const char **why);
    /* After a type no handler takes was counted: the service may answer (NULL: nothing). */
    void (*unhandled)(void *self, mq_msg_t *msg);
    /* After every read, whatever became of it (NULL: nothing). */
    void (*after)(void *self);
} mq_inbox_t;

/* zloop reader: one message from SOCK through the inbox INBOX (an mq_inbox_t). Returns 0. */
int mq_inbox_read(zloop_t *loop, zsock_t *sock, void *inbox);

/* The same for a message already taken (mq_node_recv's): refusal, PING, dispatch, drop. */
void mq_inbox_handle(mq_inbox_t *in, zsock_t *sock);

#ifdef __cplusplus
}
#endif
#endif
