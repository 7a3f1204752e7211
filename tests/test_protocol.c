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
    msg.push.shard = shard;
    msg.push.bits = 32;
    msg.push.lr = 0.1f;
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
    /* field 1 (version), then an empty body: field 112 (PING) or 99 (no type's) */
    const uint8_t wrong_version[] = {0x08, MQ_WIRE_VERSION - 1, 0x82, 0x07, 0x00};
    const uint8_t unknown_type[] = {0x08, MQ_WIRE_VERSION, 0x9a, 0x06, 0x00};
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
    const uint8_t bare_report[] = {0x08, MQ_WIRE_VERSION, 0xd2, 0x06, 0x00}; /* field 106 */
    s_raw(stranger, bare_report, sizeof bare_report); /* a REPORT of no run, no role */
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

/* A PAIR socket pair on inproc://NAME: *A sends, *B receives. */
static void s_pair(const char *name, zsock_t **a, zsock_t **b)
{
    *a = zsock_new_pair(NULL);
    *b = zsock_new_pair(NULL);
    cr_assert(*a && *b);
    cr_assert_eq(zsock_bind(*a, "inproc://%s", name), 0);
    cr_assert_eq(zsock_connect(*b, "inproc://%s", name), 0);
}

/* Sends M from A (as it is packed, unchecked) and expects B's wire to refuse it for WANT,
 * saying WHY. */
static void s_expect_refused(zsock_t *a, zsock_t *b, mq_msg_t *m, mq_drop_t want, const char *why)
{
    cr_assert_eq(mq_wire_send(a, m, NULL, 0), 0, "%s", mq_err_last());
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(b, m, &drop), -1, "a %s the wire should refuse was taken",
                 mq_msg_type_name(m->type));
    cr_expect_eq(drop, want, "dropped as %s, not %s", mq_drop_name(drop), mq_drop_name(want));
    cr_expect(strstr(mq_err_last(), why), "'%s' does not say '%s'", mq_err_last(), why);
}

/* What a peer writes in a message's strings reaches logs and files: a newline or an escape
 * sequence arrives as '?', so no peer forges a log line or drives the operator's terminal. */
Test(protocol, control_characters_in_received_strings_become_question_marks)
{
    zsock_t *a, *b;
    s_pair("mq-test-strings", &a, &b);
    static mq_msg_t m;
    mq_msg_init(&m, MQ_MSG_ERROR);
    snprintf(m.error.reason, sizeof m.error.reason,
             "refused\nE 00:00:00.000 [scheduler] forged\x1b[2J\x7f!");
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_expect_str_eq(m.error.reason, "refused?E 00:00:00.000 [scheduler] forged?[2J?!");
    mq_msg_init(&m, MQ_MSG_REGISTER);
    snprintf(m.register_.endpoint, sizeof m.register_.endpoint, "tcp://x\r\n");
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_expect_str_eq(m.register_.endpoint, "tcp://x??");
    mq_msg_reset(&m);
    zsock_destroy(&b);
    zsock_destroy(&a);
}

/* The nested messages' readers are generated from the proto (proto/gen_c.py): a non-finite
 * number is refused naming its field, and a field the proto marks [any] (the agent's reward
 * before its first one) passes as it is. */
Test(protocol, a_non_finite_field_is_refused_by_name)
{
    zsock_t *a, *b;
    s_pair("mq-test-finite", &a, &b);
    static mq_msg_t m;
    mq_drop_t drop;
    mq_msg_init(&m, MQ_MSG_REPORT);
    m.report.loss = 2.0;
    m.report.update_sq = NAN;
    s_expect_refused(a, b, &m, MQ_DROP_NONFINITE, "Report.update_sq is not finite");
    mq_msg_init(&m, MQ_MSG_OBSERVE);
    m.observe.grad_norm = INFINITY;
    s_expect_refused(a, b, &m, MQ_DROP_NONFINITE, "Observation.grad_norm is not finite");

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

/* What the generated readers check besides numbers (proto/mqgrad.proto's annotations): a
 * rank set in strictly increasing order, one term per member, a required field, a string no
 * longer than its C array, and a body of a type this side knows. Each is refused with the
 * field named, and the next good message is taken. */
Test(protocol, the_generated_readers_refuse_malformed_bodies_by_field)
{
    zsock_t *a, *b;
    s_pair("mq-test-bodies", &a, &b);
    static mq_msg_t m;
    mq_drop_t drop;
    mq_msg_init(&m, MQ_MSG_ITERATE); /* members out of order */
    uint32_t unordered[] = {0, 2, 1}, ordered[] = {0, 1, 2}, terms[] = {1, 1};
    m.iterate = (mq_iterate_t){.bits = 4, .lr = 0.1f, .n_members = 3, .members = unordered};
    s_expect_refused(a, b, &m, MQ_DROP_RANK, "Iterate.members: not in strictly increasing order");
    mq_msg_init(&m, MQ_MSG_ITERATE); /* two terms for three members */
    m.iterate = (mq_iterate_t){.bits = 4, .lr = 0.1f, .n_members = 3, .members = ordered,
                               .n_member_terms = 2, .member_terms = terms};
    s_expect_refused(a, b, &m, MQ_DROP_RANK, "Iterate.member_terms: 2 entries for 3 members");
    mq_msg_init(&m, MQ_MSG_OBSERVE); /* per-tensor measurements that do not pair up */
    m.observe = (mq_obs_msg_t){.n_tensor_count = 2, .tensor_count = {1000, 2000},
                               .n_tensor_bits = 1, .tensor_bits = {3}};
    s_expect_refused(a, b, &m, MQ_DROP_LAYOUT,
                     "Observation.tensor_bits: 1 entries for 2 tensor_count");
    mq_msg_init(&m, MQ_MSG_WELCOME); /* no token: a welcome the node cannot use */
    m.welcome.rank = 1;
    s_expect_refused(a, b, &m, MQ_DROP_GARBAGE, "welcome: Welcome.token is missing");

    /* A POLICY_SET whose policy (300 bytes) would not fit mq_policy_set_t's array: packed by
     * hand, since no C sender can write it. Meta: version (field 1), then policy_set (field
     * 111, length-delimited) holding field 1, the string. */
    uint8_t raw[320];
    size_t n = 0;
    raw[n++] = 0x08, raw[n++] = MQ_WIRE_VERSION;
    raw[n++] = 0xfa, raw[n++] = 0x06;             /* field 111, wire type 2 */
    raw[n++] = 0xaf, raw[n++] = 0x02;             /* 303 bytes follow */
    raw[n++] = 0x0a, raw[n++] = 0xac, raw[n++] = 0x02; /* field 1: 300 bytes */
    memset(raw + n, 'x', 300);
    n += 300;
    zframe_t *f = zframe_new(raw, n);
    cr_assert_eq(zframe_send(&f, a, 0), 0);
    cr_assert_eq(mq_wire_recv(b, &m, &drop), -1);
    cr_expect_eq(drop, MQ_DROP_TOO_MANY);
    cr_expect(strstr(mq_err_last(), "PolicySet.policy: 300 bytes, at most 255"), "%s",
              mq_err_last());

    const uint8_t unknown[] = {0x08, MQ_WIRE_VERSION, 0x9a, 0x06, 0x00}; /* body field 99 */
    f = zframe_new(unknown, sizeof unknown);
    cr_assert_eq(zframe_send(&f, a, 0), 0);
    cr_assert_eq(mq_wire_recv(b, &m, &drop), -1);
    cr_expect_eq(drop, MQ_DROP_TYPE);

    mq_msg_init(&m, MQ_MSG_POLICY_SET); /* and the next good one is taken */
    snprintf(m.policy_set.policy, sizeof m.policy_set.policy, "fixed:4");
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_expect_eq(m.type, MQ_MSG_POLICY_SET);
    cr_expect_str_eq(m.policy_set.policy, "fixed:4");
    mq_msg_reset(&m);
    zsock_destroy(&b);
    zsock_destroy(&a);
}

/* A run's lists are as long as the run: a member set of 20,000 workers with their terms, and
 * 300 servers' endpoints, arrive whole (past the message's own small room, in the storage it
 * grows); a copy (a worker's ITERATE that waits its turn) owns its lists, whatever the
 * original takes next; a worker's ITERATE names its place without the set; a set longer than
 * the meta frame's limit is refused, and the next message is taken. */
Test(protocol, member_sets_and_server_lists_are_as_long_as_the_run)
{
    zsock_t *a, *b;
    s_pair("mq-test-long", &a, &b);
    mq_wire_prepare(b, 0, MQ_WIRE_MAX_CONTROL_MSG);
    static mq_msg_t m, kept;
    static uint32_t ranks[20000], terms[20000];
    for (uint32_t k = 0; k < 20000; k++)
        ranks[k] = 3 * k + 1, terms[k] = k % 7 + 1;
    mq_msg_init(&m, MQ_MSG_ITERATE);
    m.iterate = (mq_iterate_t){.bits = 4, .lr = 0.1f, .n_members = 20000, .members = ranks,
                               .n_member_terms = 20000, .member_terms = terms, .view = 2};
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_assert_eq(m.iterate.n_members, 20000);
    cr_assert_eq(m.iterate.n_member_terms, 20000);
    cr_assert_neq(m.iterate.members, ranks, "received into the message's storage");
    for (uint32_t k = 0; k < 20000; k++) {
        cr_assert_eq(m.iterate.members[k], 3 * k + 1, "member %u", k);
        cr_assert_eq(m.iterate.member_terms[k], k % 7 + 1, "term %u", k);
    }
    cr_assert_eq(mq_msg_copy(&kept, &m), 0);

    static char endpoints[300][MQ_WIRE_MAX_TEXT];
    for (int s = 0; s < 300; s++)
        snprintf(endpoints[s], sizeof endpoints[s], "tcp://10.0.%d.%d:7100", s / 250, s % 250);
    mq_msg_init(&m, MQ_MSG_WELCOME);
    m.welcome.rank = 299;
    m.welcome.has_token = true;
    m.welcome.n_servers = 300;
    m.welcome.servers = endpoints;
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_assert_eq(m.welcome.n_servers, 300);
    cr_expect_str_eq(m.welcome.servers[0], "tcp://10.0.0.0:7100");
    cr_expect_str_eq(m.welcome.servers[299], "tcp://10.0.1.49:7100");
    /* the copy kept its own lists while the original took the welcome */
    cr_expect_eq(kept.iterate.n_members, 20000);
    cr_expect_eq(kept.iterate.members[19999], 3 * 19999 + 1);
    cr_expect_eq(kept.iterate.member_terms[19999], 19999 % 7 + 1);

    mq_msg_init(&m, MQ_MSG_ITERATE); /* to a worker: its place, not the set */
    m.iterate = (mq_iterate_t){.bits = 4, .lr = 0.1f, .member = 41, .nmembers = 20000};
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_expect_eq(m.iterate.n_members, 0);
    cr_expect_eq(m.iterate.member, 41);
    cr_expect_eq(m.iterate.nmembers, 20000);

    static uint32_t many[120000];
    for (uint32_t k = 0; k < 120000; k++)
        many[k] = 100000 + k; /* 3 bytes each: past the 256 KB meta frame */
    mq_msg_init(&m, MQ_MSG_COMMIT);
    m.commit = (mq_members_t){.view = 1, .n_members = 120000, .members = many};
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), -1, "a set past the meta frame's limit was taken");
    mq_msg_init(&m, MQ_MSG_COMMIT);
    m.commit = (mq_members_t){.view = 1, .n_members = 3, .members = ranks};
    cr_assert_eq(mq_wire_send(a, &m, NULL, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_wire_recv(b, &m, &drop), 0, "%s", mq_err_last());
    cr_expect_eq(m.commit.n_members, 3);
    cr_expect_eq(m.commit.members[2], 7);
    mq_msg_free(&m);
    mq_msg_free(&kept);
    zsock_destroy(&b);
    zsock_destroy(&a);
}
