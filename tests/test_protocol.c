/* Bad messages against live services: garbage, a wrong version, an unknown type, an
 * unregistered rank, a future iteration, a shard out of range, payloads shorter or longer
 * than their header, non-finite values, pushes for a rank the sender does not hold. Each must
 * be counted under its reason and dropped, and the service must go on serving its good peers
 * (the run completes). The sender holds the workers' key (an insider, SECURITY.md) but no
 * rank's token, so what claims a rank is refused as "auth" once the message is otherwise
 * well-formed. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "harness.h"
#include "mqgrad/wire.h"

/* A socket to ENDPOINT (a service of role SERVER) with the key of AS. */
static zsock_t *s_dealer(const char *endpoint, const char *as, mq_key_role_t server)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(s);
    mq_wire_prepare(s, 1000, MQ_WIRE_MAX_MSG);
    test_sec_client(s, as, server);
    zsock_set_rcvtimeo(s, 3000);
    cr_assert_eq(zsock_connect(s, "%s", endpoint), 0);
    return s;
}

static void s_raw(zsock_t *s, const void *data, size_t len)
{
    zframe_t *f = zframe_new(data, len);
    cr_assert_eq(zframe_send(&f, s, 0), 0);
}

static uint64_t s_run_id; /* the run under test's id (events.jsonl "start") */

/* A push of COUNT fp32 values whose payload has LEN bytes (a mismatch is the point). */
static void s_push(zsock_t *s, uint64_t iter, uint32_t rank, uint32_t shard, uint64_t count,
                   size_t len, float fill)
{
    static float data[64];
    for (int i = 0; i < 64; i++)
        data[i] = fill;
    mq_msg_t msg;
    memset(&msg, 0, sizeof msg);
    mq_msg_init(&msg, MQ_MSG_PUSH);
    msg.iter = iter;
    msg.rank = rank;
    msg.shard = shard;
    msg.bits = 32;
    msg.lr = 0.1f;
    msg.run_id = s_run_id;
    msg.ntensors = 1;
    snprintf(msg.tensors[0].name, sizeof msg.tensors[0].name, "conv1.w");
    msg.tensors[0].count = count;
    msg.tensors[0].codec = mq_codec_none();
    mq_payload_t p = {.data = data, .len = len};
    cr_assert_eq(mq_wire_send(s, &msg, &p, 1), 0);
}

/* PING answered with PONG: the service still serves (an ERROR that answered a refused
 * message may come first). */
static void s_ping_ok(zsock_t *s)
{
    mq_msg_t msg;
    memset(&msg, 0, sizeof msg);
    mq_msg_init(&msg, MQ_MSG_PING);
    cr_assert_eq(mq_wire_send(s, &msg, NULL, 0), 0);
    mq_drop_t drop;
    do
        cr_assert_eq(mq_wire_recv(s, &msg, &drop), 0, "no answer to a ping after bad messages");
    while (msg.type == MQ_MSG_ERROR);
    cr_assert_eq(msg.type, MQ_MSG_PONG);
    mq_msg_reset(&msg);
}

static long s_count(const char *drops, const char *reason)
{
    char key[32];
    snprintf(key, sizeof key, "%s=", reason);
    const char *p = strstr(drops, key);
    cr_assert_not_null(p, "no %s in '%s'", reason, drops);
    return atol(p + strlen(key));
}

Test(protocol, bad_messages_are_counted_and_dropped, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "150", "--bits", "4",
                     "--threshold", "1000", "--eval-every", "0", NULL};
    cluster_start_core(&c, 2, 1, "proto", extra);
    char server_ep[64], run[300];
    cluster_server_endpoint(&c, 0, server_ep, sizeof server_ep);
    cluster_start_workers(&c);
    snprintf(run, sizeof run, "%s/run", c.dir);
    mq_test_wait_rows(run, 2, 30);
    s_run_id = cluster_run_id(run);

    zsock_t *evil = s_dealer(server_ep, "worker", MQ_KEY_SERVER);
    const uint8_t wrong_version[] = {0x08, 0x01, 0x10, 0x0c}; /* version 1 (old), PING */
    const uint8_t unknown_type[] = {0x08, 0x02, 0x10, 0x63};  /* version 2, type 99 */
    s_raw(evil, "garbage!", 8);
    s_raw(evil, wrong_version, sizeof wrong_version);
    s_raw(evil, unknown_type, sizeof unknown_type);
    s_push(evil, 0, 99, 0, 10, 40, 1.0f);        /* unregistered rank */
    s_push(evil, 1000000, 0, 0, 10, 40, 1.0f);   /* rank 0's, not this peer's: auth */
    s_push(evil, 0, 0, 5, 10, 40, 1.0f);         /* shard out of range */
    s_push(evil, 0, 0, 0, 10, 39, 1.0f);         /* payload shorter than its header */
    s_push(evil, 0, 0, 0, 10, 44, 1.0f);         /* payload longer than its header */
    s_push(evil, 0, 0, 0, 10, 40, NAN);          /* non-finite values: the wire refuses them */
    s_run_id ^= 1;
    s_push(evil, 0, 0, 0, 10, 40, 1.0f);         /* a push of another run */
    s_ping_ok(evil);

    zsock_t *stranger = s_dealer(c.endpoint, "worker", MQ_KEY_SCHEDULER);
    mq_msg_t report;
    memset(&report, 0, sizeof report);
    uint64_t real = s_run_id ^ 1; /* the run's id (s_run_id was made another's above) */
    mq_msg_init(&report, MQ_MSG_REPORT); /* for worker 0 of another run: told to go */
    report.role = MQ_ROLE_WORKER;
    report.run_id = real ^ 1;
    cr_assert_eq(mq_wire_send(stranger, &report, NULL, 0), 0);
    mq_msg_init(&report, MQ_MSG_REPORT); /* for worker 0 of this run, without its token */
    report.role = MQ_ROLE_WORKER;
    report.run_id = real;
    cr_assert_eq(mq_wire_send(stranger, &report, NULL, 0), 0);
    s_raw(stranger, "\x08\x02\x10\x06\x20\x00", 6); /* a REPORT of no run, no role */
    s_raw(stranger, "junk", 4);
    s_ping_ok(stranger);

    cr_assert_eq(cluster_wait(&c, 150), 0, "the run did not complete after bad messages");
    zstr_send(c.servers[0], "DROPS");
    char *drops = zstr_recv(c.servers[0]);
    cr_log_info("server drops: %s", drops);
    cr_expect_eq(s_count(drops, "garbage"), 1);
    cr_expect_eq(s_count(drops, "version"), 1);
    cr_expect_eq(s_count(drops, "type"), 1);
    cr_expect_eq(s_count(drops, "rank"), 1);
    cr_expect_eq(s_count(drops, "shard"), 1);
    cr_expect_eq(s_count(drops, "length"), 2);
    cr_expect_eq(s_count(drops, "payload"), 1);
    cr_expect_eq(s_count(drops, "auth"), 1);
    cr_expect_eq(s_count(drops, "run"), 1);
    zstr_free(&drops);
    zstr_send(c.sched, "DROPS");
    drops = zstr_recv(c.sched);
    cr_log_info("scheduler drops: %s", drops);
    cr_expect_eq(s_count(drops, "run"), 2);
    cr_expect_eq(s_count(drops, "auth"), 1);
    cr_expect_eq(s_count(drops, "garbage"), 1);
    zstr_free(&drops);
    zsock_destroy(&evil);
    zsock_destroy(&stranger);
    cluster_stop(&c);
}

/* What a peer writes in a message's strings reaches logs and files: a newline or an escape
 * sequence arrives as '?', so no peer forges a log line or drives the operator's terminal. */
Test(protocol, control_characters_in_received_strings_become_question_marks)
{
    zsock_t *a = zsock_new_pair("@inproc://mq-test-strings");
    zsock_t *b = zsock_new_pair(">inproc://mq-test-strings");
    cr_assert(a && b);
    static mq_msg_t m;
    mq_msg_init(&m, MQ_MSG_ERROR);
    snprintf(m.text, sizeof m.text, "refused\nE 00:00:00.000 [scheduler] forged\x1b[2J\x7f!");
    snprintf(m.endpoint, sizeof m.endpoint, "tcp://x\r\n");
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_expect_str_eq(m.text, "refused?E 00:00:00.000 [scheduler] forged?[2J?!");
    cr_expect_str_eq(m.endpoint, "tcp://x??");
    mq_msg_reset(&m);
    zsock_destroy(&b);
    zsock_destroy(&a);
}

/* The nested messages' readers are generated from the proto (proto/gen_c.py): a non-finite
 * number is refused naming its field, and a field the proto marks [any] (the agent's reward
 * before its first one) passes as it is. */
Test(protocol, a_non_finite_field_is_refused_by_name)
{
    zsock_t *a = zsock_new_pair("@inproc://mq-test-finite");
    zsock_t *b = zsock_new_pair(">inproc://mq-test-finite");
    cr_assert(a && b);
    static mq_msg_t m;
    mq_drop_t drop;
    mq_msg_init(&m, MQ_MSG_REPORT);
    m.report.loss = 2.0;
    m.report.update_sq = NAN;
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), -1);
    cr_expect_eq(drop, MQ_DROP_NONFINITE);
    cr_expect(strstr(mq_err_last(), "Report.update_sq is not finite"), "%s", mq_err_last());

    mq_msg_init(&m, MQ_MSG_OBSERVE);
    m.obs.grad_norm = INFINITY;
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), -1);
    cr_expect_eq(drop, MQ_DROP_NONFINITE);
    cr_expect(strstr(mq_err_last(), "Observation.grad_norm"), "%s", mq_err_last());

    mq_msg_init(&m, MQ_MSG_STATUS);
    snprintf(m.status.policy, sizeof m.status.policy, "sarsa");
    m.status.last_reward = NAN;
    m.status.n_q_values = 2;
    m.status.q_values[0] = 1.5;
    m.status.q_values[1] = NAN;
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_expect(isnan(m.status.last_reward));
    cr_expect_eq(m.status.n_q_values, 2);
    cr_expect_eq(m.status.q_values[0], 1.5);
    cr_expect_str_eq(m.status.policy, "sarsa");
    mq_msg_reset(&m);
    zsock_destroy(&b);
    zsock_destroy(&a);
}
