/* Who may talk to whom (SECURITY.md), against live services over TCP: a peer with no key, an
 * unknown key, or a client that expects another server's key never gets a message through
 * (the refusal is counted); a known key may only send what its role may (REGISTER from node
 * keys, POLICY_SET from operator keys, OBSERVE from the scheduler's key); a worker's push is
 * taken only from the holder of its rank's token. The CLI and the agent's HTTP side too. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "agent.h"
#include "harness.h"
#include "http_test.h"
#include "local_run.h"
#include "mqgrad/nn.h"
#include "mqgrad/ps.h"
#include "mqgrad/security.h"
#include "mqgrad/wire.h"
#include "sec_test.h"

#define S_CLI MQ_TEST_BIN_DIR "/tools/mqgrad"
#define S_SCHED MQ_TEST_BIN_DIR "/services/mqgrad-scheduler"

typedef enum { S_NO_KEY, S_UNKNOWN_KEY, S_WRONG_SERVER_KEY } s_bad_t;

/* A socket to ENDPOINT that cannot get through: no CURVE, a key of another cluster, or a
 * known key that expects another server key than SERVER's. */
static zsock_t *s_bad_dealer(const char *endpoint, s_bad_t how, mq_key_role_t server)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(s);
    mq_wire_prepare(s, 0, MQ_WIRE_MAX_CONTROL_MSG);
    zsock_set_rcvtimeo(s, 1500);
    if (how == S_UNKNOWN_KEY) {
        test_sec_client(s, "operator", server); /* the real server key... */
        zcert_t *stranger = zcert_new();        /* ...and a key of no cluster */
        zcert_apply(stranger, s);
        zcert_destroy(&stranger);
    } else if (how == S_WRONG_SERVER_KEY) {
        test_sec_client(s, "operator", server == MQ_KEY_AGENT ? MQ_KEY_SCHEDULER : MQ_KEY_AGENT);
    }
    cr_assert_eq(zsock_connect(s, "%s", endpoint), 0);
    return s;
}

static zsock_t *s_dealer(const char *endpoint, const char *as, mq_key_role_t server)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(s);
    mq_wire_prepare(s, 0, MQ_WIRE_MAX_MSG);
    zsock_set_rcvtimeo(s, 5000);
    test_sec_client(s, as, server);
    cr_assert_eq(zsock_connect(s, "%s", endpoint), 0);
    return s;
}

/* Sends a message of TYPE (ROLE, TEXT) on S; with WANT_REPLY the reply, else asserts that
 * none comes within the socket's receive timeout. */
static bool s_send_recv(zsock_t *s, mq_msg_type_t type, mq_role_t role, const char *text,
                        mq_msg_t *reply)
{
    memset(reply, 0, sizeof *reply);
    mq_msg_init(reply, type);
    reply->role = role;
    if (type == MQ_MSG_POLICY_SET)
        snprintf(reply->policy_set.policy, sizeof reply->policy_set.policy, "%s", text);
    mq_wire_send(s, reply, NULL, 0); /* a socket that never connects queues it */
    mq_drop_t drop;
    return mq_wire_recv(s, reply, &drop) == 0;
}

/* The count after "NAME=" in the DROPS answer of ACTOR. */
static long s_drops(zactor_t *actor, const char *name)
{
    zstr_send(actor, "DROPS");
    char *d = zstr_recv(actor);
    char key[32];
    snprintf(key, sizeof key, " %s=", name);
    const char *p = strstr(d, key);
    if (!p && strncmp(d, key + 1, strlen(key) - 1) == 0)
        p = d - 1;
    cr_assert_not_null(p, "no %s in '%s'", name, d);
    long n = atol(p + strlen(key));
    zstr_free(&d);
    return n;
}

/* The data socket of the stand-in worker WELCOME made (test_stand_in), connected to server
 * 0: a worker's is known there by its rank's token, as its routing id. */
static zsock_t *s_data_socket(const mq_msg_t *welcome)
{
    zsock_t *d = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(d);
    mq_wire_prepare(d, 0, MQ_WIRE_MAX_MSG);
    zmq_setsockopt(zsock_resolve(d), ZMQ_ROUTING_ID, welcome->welcome.token, MQ_TOKEN_LEN);
    test_sec_client(d, "worker", MQ_KEY_SERVER);
    cr_assert_eq(zsock_connect(d, "%s", welcome->welcome.servers[0]), 0);
    return d;
}

/* Waits until ACTOR's count NAME reaches AT_LEAST (a refused handshake is counted from the
 * watch thread, a moment after the client gave up). */
static long s_drops_reach(zactor_t *actor, const char *name, long at_least)
{
    long n = 0;
    for (int i = 0; i < 50 && (n = s_drops(actor, name)) < at_least; i++)
        zclock_sleep(100);
    return n;
}

/* Every kind of bad peer sends TYPE (as ROLE) to the service of role SERVER at ENDPOINT:
 * none is answered, and the service (ACTOR) counts each refused handshake. */
static void s_bad_peers_refused(const char *endpoint, mq_key_role_t server, zactor_t *actor,
                                mq_msg_type_t type, mq_role_t role)
{
    mq_msg_t m;
    for (int how = S_NO_KEY; how <= S_WRONG_SERVER_KEY; how++) {
        zsock_t *s = s_bad_dealer(endpoint, (s_bad_t)how, server);
        cr_expect_not(s_send_recv(s, type, role, NULL, &m),
                      "a peer with bad keys (%d) got an answer: %s", how, mq_msg_type_name(m.type));
        zsock_destroy(&s);
        cr_expect_geq(s_drops_reach(actor, "refused", how + 1), how + 1,
                      "refused handshake %d not counted", how);
    }
}

Test(security, the_scheduler_takes_registrations_only_from_node_keys, .timeout = 120)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "20", "--eval-every", "0", NULL};
    cluster_start_core(&c, 1, 1, "sec-sched", extra);
    s_bad_peers_refused(c.endpoint, MQ_KEY_SCHEDULER, c.sched, MQ_MSG_REGISTER, MQ_ROLE_WORKER);
    mq_msg_t m;
    /* Known keys of the wrong role are told why, and take no rank. */
    const char *wrong[] = {"operator", "server", "agent"};
    for (int i = 0; i < 3; i++) {
        zsock_t *s = s_dealer(c.endpoint, wrong[i], MQ_KEY_SCHEDULER);
        cr_assert(s_send_recv(s, MQ_MSG_REGISTER, MQ_ROLE_WORKER, NULL, &m), "no answer");
        cr_expect_eq(m.type, MQ_MSG_ERROR, "a %s key registered as a worker", wrong[i]);
        cr_expect(strstr(m.error.reason, "workers' key"), "%s", m.error.reason);
        mq_msg_reset(&m);
        zsock_destroy(&s);
    }
    cr_expect_eq(s_drops(c.sched, "auth"), 3);
    /* The workers' key registers (and gets its rank's token). */
    zsock_t *s = s_dealer(c.endpoint, "worker", MQ_KEY_SCHEDULER);
    mq_msg_init(&m, MQ_MSG_REGISTER);
    m.role = MQ_ROLE_WORKER;
    m.incarnation = 42;
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(s, &m, &drop), 0, "no welcome for the workers' key");
    cr_expect_eq(m.type, MQ_MSG_WELCOME);
    cr_expect(m.welcome.has_token, "a welcome without the rank's token");
    cr_expect_not(m.welcome.has_run_key, "a worker was given the run key");
    mq_msg_reset(&m);
    zsock_destroy(&s);
    cluster_stop(&c);
}

/* RUN's summary.json says it learned: a final accuracy well above chance (0.1). */
static void s_expect_learned(const char *run)
{
    char path[400], *text;
    size_t tlen;
    snprintf(path, sizeof path, "%s/summary.json", run);
    cr_assert_eq(mq_read_file(path, &text, &tlen), 0, "%s", mq_err_last());
    double acc = test_json_num(text, "final_test_acc");
    free(text);
    cr_expect_gt(acc, 0.5, "the run did not learn: %.3f (chance is 0.1)", acc);
}

Test(security, servers_take_pushes_only_from_the_holder_of_the_rank, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    /* trains for 20 s whatever the machine's speed: the checks below take about 6 s */
    char *extra[] = {"--model", "small", "--time-budget", "20", "--eval-every", "0",
                     "--final-eval-limit", "1000", NULL};
    cluster_start_core(&c, 2, 1, "sec-push", extra);
    char server_ep[64], run[300];
    cluster_server_endpoint(&c, 0, server_ep, sizeof server_ep);
    cluster_start_workers(&c);
    snprintf(run, sizeof run, "%s/run", c.dir);
    mq_test_wait_rows(run, 2, 60);
    uint64_t run_id = cluster_run_id(run);
    s_bad_peers_refused(server_ep, MQ_KEY_SERVER, c.servers[0], MQ_MSG_PING, MQ_ROLE_NONE);
    mq_msg_t m;
    /* The operator's key may ping, not push; the workers' key without a token may not push
     * for rank 0 either, even named like a worker (a guessed token). */
    zsock_t *op = s_dealer(server_ep, "operator", MQ_KEY_SERVER);
    cr_assert(s_send_recv(op, MQ_MSG_PING, MQ_ROLE_NONE, NULL, &m), "no pong for the operator");
    cr_expect_eq(m.type, MQ_MSG_PONG);
    mq_msg_reset(&m);
    zsock_t *ins = zsock_new(ZMQ_DEALER);
    mq_wire_prepare(ins, 0, MQ_WIRE_MAX_MSG);
    uint8_t guess[MQ_TOKEN_LEN];
    memset(guess, 0x5a, sizeof guess);
    zmq_setsockopt(zsock_resolve(ins), ZMQ_ROUTING_ID, guess, sizeof guess);
    test_sec_client(ins, "worker", MQ_KEY_SERVER);
    cr_assert_eq(zsock_connect(ins, "%s", server_ep), 0);
    zsock_t *senders[2] = {op, ins};
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 3; k++) { /* rank 0's pushes and a pull */
            mq_msg_init(&m, k < 2 ? MQ_MSG_PUSH : MQ_MSG_PULL);
            m.rank = 0;
            if (k < 2)
                m.push = (mq_push_t){.shard = 0, .bits = 32, .lr = 0.1f};
            else
                m.pull.shard = 0;
            m.run_id = run_id;
            cr_assert_eq(mq_wire_send(senders[i], &m, NULL, 0), 0);
        }
    }
    cr_expect_eq(cluster_wait(&c, 150), 0, "the run did not complete");
    long auth = s_drops(c.servers[0], "auth");
    cr_expect_geq(auth, 2, "pushes without the rank's token were not refused (auth=%ld)", auth);
    s_expect_learned(run);
    zsock_destroy(&op);
    zsock_destroy(&ins);
    cluster_stop(&c);
}

/* Waits (at most 60 s) until RUN/events.jsonl holds TEXT N times. */
static void s_wait_events(const char *run, const char *text, int n)
{
    char path[400], *data = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/events.jsonl", run);
    int seen = 0;
    for (int i = 0; i < 600 && seen < n; i++) {
        free(data);
        data = NULL;
        zclock_sleep(100);
        seen = 0;
        if (mq_read_file(path, &data, &len) == 0)
            for (const char *p = data; (p = strstr(p, text)); p++)
                seen++;
    }
    free(data);
    cr_assert_geq(seen, n, "%s: %d of %d '%s' events", path, seen, n, text);
}

/* A rank's token is revoked when the rank changes hands: an insider holds a rank, leaves, and
 * a worker that joins later takes that rank in a new term; the insider replays its token at the
 * scheduler (a heartbeat) and at the server (pushes and a pull, its data socket named by the
 * old token, once claiming the new term). Every replay is refused and counted; the run trains
 * on with the new holder. */
Test(security, a_token_is_revoked_when_its_rank_changes_hands, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--time-budget", "15", "--eval-every", "0",
                     "--final-eval-limit", "1000", NULL};
    cluster_start_core(&c, 2, 1, "revoke", extra);
    c.W = 1;
    cluster_start_workers(&c);
    static mq_msg_t m, old;
    zsock_t *s = test_stand_in(c.endpoint, 41, &old);
    cr_assert_eq(old.welcome.term, 1, "the insider holds its rank in the rank's first term");
    test_stand_in_msg(&m, MQ_MSG_READY, &old, 41);
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    test_stand_in_msg(&m, MQ_MSG_LEAVE, &old, 41);
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    char run[300];
    snprintf(run, sizeof run, "%s/run", c.dir);
    s_wait_events(run, "\"worker_lost\"", 1);
    /* a worker joins late and takes the free rank, in its second term */
    char *wargv[] = {"worker", "--scheduler", c.endpoint, "--threads", "1", NULL};
    cr_assert_eq(mq_worker_config_parse(&c.wcfg[1], 5, wargv), 0);
    c.workers[1] = zactor_new(mq_worker_actor, &c.wcfg[1]);
    c.W = 2;
    s_wait_events(run, "\"ready\"", 1); /* the run starts with it */
    mq_test_wait_rows(run, 3, 60);
    long sched_auth = s_drops(c.sched, "auth"), server_auth = s_drops(c.servers[0], "auth");

    /* at the scheduler: a heartbeat with the old token */
    test_stand_in_msg(&m, MQ_MSG_HEARTBEAT, &old, 41);
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    cr_expect_geq(s_drops_reach(c.sched, "auth", sched_auth + 1), sched_auth + 1,
                  "the scheduler took a heartbeat with a revoked token");

    /* at the server: the old token names the data socket; pushes and a pull for the rank in
     * the old term, and one claiming the new term with the old term's token */
    zsock_t *d = s_data_socket(&old);
    zsock_set_sndtimeo(d, 1000);
    for (int k = 0; k < 4; k++) {
        test_stand_in_msg(&m, k < 3 ? MQ_MSG_PUSH : MQ_MSG_PULL, &old, 41);
        if (k < 3)
            m.push = (mq_push_t){.shard = 0, .bits = 32, .lr = 0.1f};
        else
            m.pull.shard = 0;
        m.term = k == 2 ? 2 : 1;
        cr_assert_eq(mq_wire_send(d, &m, NULL, 0), 0);
    }
    cr_expect_geq(s_drops_reach(c.servers[0], "auth", server_auth + 4), server_auth + 4,
                  "the server took a push or a pull with a revoked token");
    cr_expect_eq(cluster_wait(&c, 120), 0, "the run did not complete");
    s_expect_learned(run);
    zsock_destroy(&d);
    zsock_destroy(&s);
    cluster_stop(&c);
}

/* A member that pushes its shard twice in one round: the second push is counted as a
 * duplicate and dropped, and the first, held by the server until the round closes, is what
 * the round aggregates: the member gets the round's reply, the run goes on and learns. */
Test(security, a_second_push_in_a_round_is_dropped_and_the_first_kept, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--codec", "none", "--iterations", "200",
                     "--eval-every", "0", "--final-eval-limit", "1000", NULL};
    cluster_start_core(&c, 2, 1, "dup", extra);
    c.W = 1;
    cluster_start_workers(&c);
    static mq_msg_t m, wel, it;
    zsock_t *s = test_stand_in(c.endpoint, 51, &wel);
    test_stand_in_msg(&m, MQ_MSG_READY, &wel, 51);
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    mq_drop_t drop;
    memset(&it, 0, sizeof it);
    for (int i = 0; i < 300 && it.type != MQ_MSG_ITERATE; i++) /* 200 ms each */
        mq_wire_recv(s, &it, &drop);
    cr_assert_eq(it.type, MQ_MSG_ITERATE, "the stand-in member was given no round");

    /* its push: the server's one shard of the small model, every segment in fp32 */
    const mq_run_config_t *r = &wel.welcome.config;
    mq_model_t *model = mq_model_new("small", 1, 1, 0);
    cr_assert_not_null(model);
    mq_shard_t shard;
    cr_assert_eq(mq_shard_plan(model, 1, r->quant_threshold, true, &shard), 0);
    float *zeros = calloc(mq_model_nparams(model), sizeof(float));
    mq_payload_t payloads[MQ_WIRE_MAX_TENSORS];
    test_stand_in_msg(&m, MQ_MSG_PUSH, &wel, 51);
    m.iter = it.iter;
    m.push = (mq_push_t){.shard = 0, .bits = 32, .lr = it.iterate.lr};
    m.ntensors = shard.nsegs;
    for (uint32_t i = 0; i < shard.nsegs; i++) {
        const mq_segment_t *seg = &shard.segs[i];
        snprintf(m.tensors[i].name, sizeof m.tensors[i].name, "%s", seg->name);
        m.tensors[i].offset = seg->offset;
        m.tensors[i].count = seg->count;
        m.tensors[i].codec = mq_codec_none();
        payloads[i] = (mq_payload_t){.data = zeros, .len = seg->count * sizeof(float)};
    }
    zsock_t *d = s_data_socket(&wel);
    zsock_set_sndtimeo(d, 1000);
    zsock_set_rcvtimeo(d, 200);
    long dup = s_drops(c.servers[0], "duplicate");
    for (int k = 0; k < 2; k++)
        cr_assert_eq(mq_wire_send(d, &m, payloads, shard.nsegs), 0, "%s", mq_err_last());
    cr_expect_eq(s_drops_reach(c.servers[0], "duplicate", dup + 1), dup + 1,
                 "the second push was not counted as a duplicate");

    /* the round closes over the first push: its reply comes, whole */
    static mq_msg_t agg;
    memset(&agg, 0, sizeof agg);
    for (int i = 0; i < 300 && agg.type != MQ_MSG_AGGREGATE; i++)
        mq_wire_recv(d, &agg, &drop);
    cr_assert_eq(agg.type, MQ_MSG_AGGREGATE, "no reply to the member's first push");
    cr_expect_eq(agg.iter, it.iter);
    cr_expect_eq(agg.ntensors, shard.nsegs);
    mq_msg_reset(&agg);

    test_stand_in_msg(&m, MQ_MSG_LEAVE, &wel, 51); /* the real worker finishes the run */
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    char run[300];
    snprintf(run, sizeof run, "%s/run", c.dir);
    cr_expect_eq(cluster_wait(&c, 150), 0, "the run did not complete");
    s_expect_learned(run);
    free(zeros);
    mq_model_destroy(&model);
    zsock_destroy(&d);
    zsock_destroy(&s);
    cluster_stop(&c);
}

/* An in-process agent serving fixed:3 with the tests' keys; OPEN: QUERY from any key. */
static zactor_t *s_agent(mq_agent_config_t *cfg, bool open, char *endpoint, size_t len)
{
    test_keys();
    cr_assert_eq(mq_agent_config_default(cfg), 0, "%s", mq_err_last());
    snprintf(cfg->bind, sizeof cfg->bind, "tcp://127.0.0.1:*");
    snprintf(cfg->policy, sizeof cfg->policy, "fixed:3");
    cfg->http.port = MQ_HTTP_ANY_PORT;
    snprintf(cfg->http.token, sizeof cfg->http.token, "s3cret-token");
    cfg->sec.open = open;
    zactor_t *a = zactor_new(mq_agent_actor, cfg);
    cr_assert_eq(cfg->start_status, 0, "%s", cfg->start_error);
    zstr_send(a, "PORT");
    char *port = zstr_recv(a);
    snprintf(endpoint, len, "tcp://127.0.0.1:%s", port);
    zstr_free(&port);
    return a;
}

static mq_msg_t *s_ask(zsock_t *s, mq_msg_type_t type, const char *text)
{
    mq_msg_t *m = calloc(1, sizeof *m);
    cr_assert(s_send_recv(s, type, MQ_ROLE_NONE, text, m), "no answer to %s",
              mq_msg_type_name(type));
    return m;
}

Test(security, the_agent_takes_policy_only_from_operators_and_observe_only_from_the_scheduler,
     .timeout = 60)
{
    static mq_agent_config_t cfg;
    char ep[64];
    zactor_t *agent = s_agent(&cfg, false, ep, sizeof ep);
    s_bad_peers_refused(ep, MQ_KEY_AGENT, agent, MQ_MSG_QUERY, MQ_ROLE_NONE);
    zsock_t *worker = s_dealer(ep, "worker", MQ_KEY_AGENT);
    mq_msg_t *r = s_ask(worker, MQ_MSG_POLICY_SET, "fixed:7");
    cr_expect_eq(r->type, MQ_MSG_ERROR, "a worker key set the policy");
    cr_expect(strstr(r->error.reason, "operator"), "%s", r->error.reason);
    free(r);
    r = s_ask(worker, MQ_MSG_OBSERVE, NULL);
    cr_expect_eq(r->type, MQ_MSG_ERROR, "a worker key steered the agent");
    free(r);
    r = s_ask(worker, MQ_MSG_QUERY, NULL); /* a cluster key may ask */
    cr_expect_eq(r->type, MQ_MSG_STATUS);
    cr_expect_str_eq(r->status.policy, "fixed:3");
    free(r);
    zsock_t *sched = s_dealer(ep, "scheduler", MQ_KEY_AGENT);
    r = s_ask(sched, MQ_MSG_OBSERVE, NULL);
    cr_expect_eq(r->type, MQ_MSG_DECISION, "the scheduler's OBSERVE got %s",
                 mq_msg_type_name(r->type));
    cr_expect_eq(r->decision.bits, 3);
    free(r);
    zsock_t *op = s_dealer(ep, "operator", MQ_KEY_AGENT);
    r = s_ask(op, MQ_MSG_POLICY_SET, "fixed:5");
    cr_expect_eq(r->type, MQ_MSG_STATUS, "the operator could not set the policy: %s", r->error.reason);
    cr_expect_str_eq(r->status.policy, "fixed:5");
    free(r);
    cr_expect_eq(s_drops(agent, "auth"), 2);
    zsock_destroy(&worker);
    zsock_destroy(&sched);
    zsock_destroy(&op);

    /* HTTP: /bits and /metrics need the bearer token, /healthz does not. */
    zstr_send(agent, "HTTP-PORT");
    char *hp = zstr_recv(agent);
    int http = atoi(hp);
    zstr_free(&hp);
    char body[8192];
    cr_expect_eq(test_http(http, NULL, "GET", "/bits", body, sizeof body), 401);
    cr_expect_eq(test_http(http, "wrong", "GET", "/metrics", body, sizeof body), 401);
    cr_expect_eq(test_http(http, "s3cret-token", "GET", "/bits", body, sizeof body), 200);
    cr_expect(strstr(body, "\"bits\":5"), "%s", body);
    cr_expect_eq(test_http(http, "s3cret-token", "GET", "/metrics", body, sizeof body), 200);
    cr_expect_eq(test_http(http, NULL, "GET", "/healthz", body, sizeof body), 200);
    cr_expect_eq(test_http(http, "s3cret-token", "POST", "/bits", body, sizeof body), 405);
    zactor_destroy(&agent);
}

Test(security, an_open_agent_answers_any_key_but_takes_policy_only_from_operators,
     .timeout = 30)
{
    static mq_agent_config_t cfg;
    char ep[64];
    zactor_t *agent = s_agent(&cfg, true, ep, sizeof ep);
    zsock_t *s = s_bad_dealer(ep, S_UNKNOWN_KEY, MQ_KEY_AGENT);
    zsock_set_rcvtimeo(s, 5000);
    mq_msg_t *r = s_ask(s, MQ_MSG_QUERY, NULL);
    cr_expect_eq(r->type, MQ_MSG_STATUS, "an open agent did not answer QUERY");
    free(r);
    r = s_ask(s, MQ_MSG_POLICY_SET, "fixed:6");
    cr_expect_eq(r->type, MQ_MSG_ERROR, "an unknown key set the policy of an open agent");
    free(r);
    zsock_destroy(&s);
    zsock_t *op = s_dealer(ep, "operator", MQ_KEY_AGENT);
    r = s_ask(op, MQ_MSG_POLICY_SET, "fixed:6");
    cr_expect_eq(r->type, MQ_MSG_STATUS, "the operator could not set the policy: %s", r->error.reason);
    free(r);
    zsock_destroy(&op);
    zactor_destroy(&agent);
}

/* Runs CMD; returns its exit status, OUT its output (stdout and stderr). */
static int s_run(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(security, the_command_line_sets_the_policy_with_an_operator_key_only, .timeout = 60)
{
    static mq_agent_config_t cfg;
    char ep[64], cmd[1024], out[4096];
    zactor_t *agent = s_agent(&cfg, false, ep, sizeof ep);
    const char *keys = test_keys();
    snprintf(cmd, sizeof cmd, S_CLI " policy set fixed:4 --agent %s --keys %s 2>&1", ep, keys);
    cr_expect_eq(s_run(cmd, out, sizeof out), 0, "%s", out);
    snprintf(cmd, sizeof cmd,
             S_CLI " policy set fixed:6 --agent %s --keys %s --key %s/worker.key_secret 2>&1", ep,
             keys, keys);
    cr_expect_eq(s_run(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "operator"), "%s", out);
    snprintf(cmd, sizeof cmd, S_CLI " bits --agent %s --insecure --timeout 1000 2>&1", ep);
    cr_expect_eq(s_run(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "no answer"), "%s", out);
    snprintf(cmd, sizeof cmd, "env -u MQGRAD_KEYS " S_CLI " bits --agent %s 2>&1", ep);
    cr_expect_eq(s_run(cmd, out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "mqgrad keygen"), "%s", out);
    snprintf(cmd, sizeof cmd, S_CLI " bits --agent %s --keys %s 2>&1", ep, keys);
    cr_expect_eq(s_run(cmd, out, sizeof out), 0, "%s", out);
    cr_expect_eq(atoi(out), 4, "%s", out);
    /* The same keys from variables alone: the public ones as role:Z85, the secret as Z85. */
    char path[600];
    snprintf(path, sizeof path, "%s/operator.key_secret", keys);
    zcert_t *op = zcert_load(path);
    snprintf(path, sizeof path, "%s/agent.key", keys);
    zcert_t *ag = zcert_load(path);
    cr_assert(op && ag);
    snprintf(cmd, sizeof cmd,
             "env -u MQGRAD_KEYS MQGRAD_PUBLIC_KEYS='agent:%s,operator:%s' "
             "MQGRAD_SECRET_KEY='%s' " S_CLI " policy set fixed:7 --agent %s 2>&1",
             zcert_public_txt(ag), zcert_public_txt(op), zcert_secret_txt(op), ep);
    cr_expect_eq(s_run(cmd, out, sizeof out), 0, "keys from variables: %s", out);
    zcert_destroy(&op);
    zcert_destroy(&ag);
    zactor_destroy(&agent);

    /* A service without keys refuses to start, and says how to give them. */
    snprintf(cmd, sizeof cmd, "env -u MQGRAD_KEYS " S_SCHED " --workers 1 --servers 1 2>&1");
    cr_expect_eq(s_run(cmd, out, sizeof out), 2, "%s", out);
    cr_expect(strstr(out, "--insecure") && strstr(out, "mqgrad keygen"), "%s", out);
    /* keygen never overwrites a key. */
    snprintf(cmd, sizeof cmd, S_CLI " keygen %s 2>&1", keys);
    cr_expect_eq(s_run(cmd, out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "never overwritten"), "%s", out);
}

/* A served socket taken down must not take the process's I/O with it. Once its watch is
 * gone, a refused handshake on the socket (a closed socket lingers, and its handshakes fail
 * when the ZAP handler goes) would be an event that libzmq's I/O thread sends to a monitor
 * no one reads: it blocks there, and every socket of the process stops (seen as a restarted
 * server whose registrations reached the scheduler only when it gave up, 60 s later).
 * mq_sec_unserve stops the monitor first: refused peers afterwards are neither counted nor
 * stall anything, and a plain TCP pair of the same process still talks. */
Test(security, a_socket_unserved_leaves_the_process_io_free, .timeout = 60)
{
    mq_sec_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.keys, sizeof c.keys, "%s", test_keys());
    mq_sec_t *sec = mq_sec_open(&c, MQ_KEY_SCHEDULER);
    cr_assert_not_null(sec, "%s", mq_err_last());
    zsock_t *served = zsock_new(ZMQ_ROUTER);
    cr_assert_not_null(served);
    mq_wire_prepare(served, 2000, MQ_WIRE_MAX_CONTROL_MSG);
    cr_assert_eq(mq_sec_serve(sec, served, "the test's socket"), 0, "%s", mq_err_last());
    int port = zsock_bind(served, "tcp://127.0.0.1:*");
    cr_assert_gt(port, 0);
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    mq_msg_t m;
    zsock_t *bad = s_bad_dealer(ep, S_NO_KEY, MQ_KEY_SCHEDULER);
    cr_expect_not(s_send_recv(bad, MQ_MSG_PING, MQ_ROLE_WORKER, NULL, &m));
    zsock_destroy(&bad);
    long n = 0; /* a refused DEALER retries: one or more */
    for (int i = 0; i < 50 && (n = (long)mq_sec_refused(sec)) < 1; i++)
        zclock_sleep(100);
    cr_assert_geq(n, 1, "the watch counts a refused peer while the socket is served");

    mq_sec_unserve(sec, served);
    long before = (long)mq_sec_refused(sec);
    for (int how = S_NO_KEY; how <= S_WRONG_SERVER_KEY; how++) {
        bad = s_bad_dealer(ep, (s_bad_t)how, MQ_KEY_SCHEDULER);
        cr_expect_not(s_send_recv(bad, MQ_MSG_PING, MQ_ROLE_WORKER, NULL, &m));
        zsock_destroy(&bad);
    }
    /* The I/O thread is free: a fresh TCP pair of this process exchanges a message. */
    zsock_t *a = zsock_new(ZMQ_PAIR), *b = zsock_new(ZMQ_PAIR);
    cr_assert(a && b);
    int pport = zsock_bind(a, "tcp://127.0.0.1:*");
    cr_assert_gt(pport, 0);
    cr_assert_eq(zsock_connect(b, "tcp://127.0.0.1:%d", pport), 0);
    zsock_set_sndtimeo(b, 3000);
    zsock_set_rcvtimeo(a, 3000);
    cr_assert_eq(zstr_send(b, "still here"), 0);
    char *got = zstr_recv(a);
    cr_expect(got && strcmp(got, "still here") == 0,
              "a TCP pair of the process is stuck after the served socket was unserved");
    zstr_free(&got);
    cr_expect_eq((long)mq_sec_refused(sec), before, "refused peers counted after unserve");
    zsock_destroy(&a);
    zsock_destroy(&b);
    zsock_destroy(&served);
    mq_sec_close(&sec);
}

/* A keyring holds as many keys as the cluster has: with 300 operators' keys beside the
 * roles', the last one's client is let in and known as an operator. */
Test(security, a_keyring_holds_as_many_keys_as_the_cluster_has, .timeout = 120)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-test-manykeys-%d", (int)getpid());
    test_rmtree(dir);
    cr_assert_eq(mq_sec_keygen(dir, NULL), 0, "%s", mq_err_last());
    for (int i = 0; i < 300; i++) {
        char name[16];
        snprintf(name, sizeof name, "op%03d", i);
        cr_assert_eq(mq_sec_keygen(dir, name), 0, "%s", mq_err_last());
    }
    mq_sec_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.keys, sizeof c.keys, "%s", dir);
    mq_sec_t *sec = mq_sec_open(&c, MQ_KEY_SCHEDULER);
    cr_assert_not_null(sec, "%s", mq_err_last());
    zsock_t *served = zsock_new(ZMQ_ROUTER);
    cr_assert_not_null(served);
    mq_wire_prepare(served, 0, MQ_WIRE_MAX_CONTROL_MSG);
    zsock_set_rcvtimeo(served, 5000);
    cr_assert_eq(mq_sec_serve(sec, served, "the test's socket"), 0, "%s", mq_err_last());
    int port = zsock_bind(served, "tcp://127.0.0.1:*");
    cr_assert_gt(port, 0);
    zsock_t *client = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(client);
    mq_wire_prepare(client, 0, MQ_WIRE_MAX_CONTROL_MSG);
    test_sec_client_from(client, dir, "operator-op299", MQ_KEY_SCHEDULER);
    cr_assert_eq(zsock_connect(client, "tcp://127.0.0.1:%d", port), 0);
    static mq_msg_t m;
    mq_msg_init(&m, MQ_MSG_PING);
    cr_assert_eq(mq_wire_send(client, &m, NULL, 0), 0, "%s", mq_err_last());
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(served, &m, &drop), 0, "the 300th operator was not let in");
    cr_expect_eq(mq_sec_role(sec, &m), MQ_KEY_OPERATOR);
    mq_msg_reset(&m);
    zsock_destroy(&client);
    mq_sec_unserve(sec, served);
    zsock_destroy(&served);
    mq_sec_close(&sec);
    test_rmtree(dir);
}

/* A peer that asks and never reads its answers (a PING flood from a cluster key whose socket
 * takes no reply) fills the scheduler's queue towards it. Replies to a peer wait for no one:
 * the ones it cannot take are dropped and counted ("unread"), and the run goes on; before,
 * each PONG waited the socket's send timeout, the scheduler stopped hearing the nodes, lost
 * them and rolled back. The run must complete with no node lost. */
Test(security, a_peer_that_does_not_read_its_replies_stalls_no_service, .timeout = 240)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    /* Long enough (about 15 s on 2 cores) that the flood falls inside the run. */
    char *extra[] = {"--model", "small", "--iterations", "1000", "--eval-every", "0",
                     "--heartbeat-timeout", "3", NULL};
    cluster_start_core(&c, 2, 1, "flood", extra);
    cluster_start_workers(&c);
    zsock_t *flood = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(flood);
    mq_wire_prepare(flood, 0, MQ_WIRE_MAX_MSG);
    zsock_set_sndtimeo(flood, 0); /* the flood never waits either */
    zsock_set_rcvhwm(flood, 1);   /* and takes next to nothing */
    test_sec_client(flood, "worker", MQ_KEY_SCHEDULER);
    cr_assert_eq(zsock_connect(flood, "%s", c.endpoint), 0);
    mq_msg_t m;
    memset(&m, 0, sizeof m);
    long sent = 0;
    for (int64_t end = zclock_mono() + 8000; zclock_mono() < end;) {
        mq_msg_init(&m, MQ_MSG_PING);
        if (mq_wire_send(flood, &m, NULL, 0) == 0)
            sent++;
        else
            zclock_sleep(1);
    }
    long unread = s_drops(c.sched, "unread");
    int code = cluster_wait(&c, 200);
    zsock_destroy(&flood);
    cr_expect_eq(code, 0, "the run did not complete (%ld pings sent)", sent);
    char path[400], *events;
    size_t len;
    snprintf(path, sizeof path, "%s/run/events.jsonl", c.dir);
    cr_assert_eq(mq_read_file(path, &events, &len), 0, "%s", mq_err_last());
    cr_expect_null(strstr(events, "_lost\""), "a node was lost during the flood:\n%s", events);
    cr_expect_null(strstr(events, "\"rollback\""), "the run rolled back:\n%s", events);
    free(events);
    cr_expect_gt(unread, 0, "%ld pings and no unread reply counted", sent);
    cr_log_info("%ld pings sent, %ld pongs not taken", sent, unread);
    cluster_stop(&c);
}

/* SAVED and PROGRESS are the servers' words on a shard (its checkpoint written or not, the
 * pushes it holds): from any other peer, even one holding a cluster key, they are dropped
 * and counted, and the run completes as if they had never been sent. */
Test(security, only_a_shards_server_speaks_for_it, .timeout = 120)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--time-budget", "6", "--eval-every", "0",
                     "--stragglers", "first:1", NULL};
    cluster_start_core(&c, 2, 1, "forge", extra);
    cluster_start_workers(&c);
    char run[300];
    snprintf(run, sizeof run, "%s/run", c.dir);
    mq_test_wait_rows(run, 1, 60); /* the forger knows the run's id, as an insider would */
    uint64_t run_id = cluster_run_id(run);
    zsock_t *s = s_dealer(c.endpoint, "worker", MQ_KEY_SCHEDULER);
    const mq_msg_type_t forged[] = {MQ_MSG_SAVED, MQ_MSG_PROGRESS, MQ_MSG_HAVE};
    mq_msg_t m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 3; i++) {
        mq_msg_init(&m, forged[i]);
        m.run_id = run_id;
        m.iter = 1;
        if (forged[i] == MQ_MSG_SAVED) {
            m.saved.shard = 0;
            snprintf(m.saved.error, sizeof m.saved.error, "disk full");
        } else { /* PROGRESS and HAVE share their body's type */
            m.have.shard = 0;
        }
        cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    }
    long shard = 0;
    for (int i = 0; i < 50 && (shard = s_drops(c.sched, "shard")) < 3; i++)
        zclock_sleep(100);
    cr_expect_eq(shard, 3, "forged server messages were not dropped (shard=%ld)", shard);
    int code = cluster_wait(&c, 100);
    cr_expect_eq(code, 0, "the run did not complete");
    zsock_destroy(&s);
    cluster_stop(&c);
}

/* Resident memory of process PID, MB. */
static double s_rss_mb(pid_t pid)
{
    char path[64];
    long pages = 0, rss = 0;
    snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
    FILE *f = fopen(path, "r");
    if (f && fscanf(f, "%ld %ld", &pages, &rss) != 2)
        rss = 0;
    if (f)
        fclose(f);
    return (double)rss * (double)sysconf(_SC_PAGESIZE) / 1e6;
}

/* A worker (here an insider's socket holding a rank and its token) that sends PULL after
 * PULL and reads none of the replies: every reply of an iteration shares one copy of the
 * shard, and a reply its peer cannot take is dropped, so the server's memory does not grow
 * with the PULLs (before, each PULL copied the whole shard: a few dozen unread ones of the
 * paper model pass a 1 GiB container limit). The server runs as its own process, so its
 * memory is its own. */
Test(security, unread_pulls_cannot_grow_a_servers_memory, .timeout = 300)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    /* Two workers, one of them the insider, which never pushes: iteration 0 stays open, and
     * every PULL for it is served. */
    /* the paper model's worker under the sanitizers, on cores that other tests share, can
     * take more than the harness's minute to register and set up */
    char *extra[] = {"--model", "paper", "--iterations", "5", "--eval-every", "0",
                     "--iter-timeout", "120", "--start-timeout", "180", NULL};
    cluster_start_sched(&c, 2, 1, "pulls", extra);
    pid_t server = fork();
    cr_assert_geq(server, 0);
    if (server == 0) {
        freopen("/dev/null", "w", stderr);
        execl(MQ_TEST_BIN_DIR "/services/mqgrad-server", "mqgrad-server", "--scheduler",
              c.endpoint, "--bind", "tcp://127.0.0.1:*", "--http-port", "0", NULL);
        _exit(127);
    }
    c.W = 1;
    cluster_start_workers(&c);
    static mq_msg_t m, welcome;
    zsock_t *s = test_stand_in(c.endpoint, 5, &welcome);
    test_stand_in_msg(&m, MQ_MSG_READY, &welcome, 5);
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    zsock_t *d = zsock_new(ZMQ_DEALER);
    mq_wire_prepare(d, 0, MQ_WIRE_MAX_MSG);
    zsock_set_sndtimeo(d, 0);
    zsock_set_rcvhwm(d, 1);
    /* a worker's data socket is known by its rank's token, as its routing id */
    zmq_setsockopt(zsock_resolve(d), ZMQ_ROUTING_ID, welcome.welcome.token, MQ_TOKEN_LEN);
    test_sec_client(d, "worker", MQ_KEY_SERVER);
    cr_assert_eq(zsock_connect(d, "%s", welcome.welcome.servers[0]), 0);
    /* the run is up (every member ready), waiting at iteration 0 for the insider's push */
    char events[400], *text = NULL;
    size_t len;
    snprintf(events, sizeof events, "%s/run/events.jsonl", c.dir);
    for (int i = 0; i < 1800 && !(text && strstr(text, "\"ready\"")); i++) {
        free(text);
        text = NULL;
        zclock_sleep(100);
        mq_read_file(events, &text, &len);
    }
    cr_assert(text && strstr(text, "\"ready\""), "the run did not start");
    free(text);
    zclock_sleep(1000);
    double before = s_rss_mb(server), peak = before;
    long sent = 0;
    for (int64_t end = zclock_mono() + 6000; zclock_mono() < end && sent < 2000;) {
        test_stand_in_msg(&m, MQ_MSG_PULL, &welcome, 5);
        if (mq_wire_send(d, &m, NULL, 0) == 0)
            sent++;
        else
            zclock_sleep(1);
        if (sent % 50 == 0 && s_rss_mb(server) > peak)
            peak = s_rss_mb(server);
    }
    for (int i = 0; i < 20; i++, zclock_sleep(100))
        if (s_rss_mb(server) > peak)
            peak = s_rss_mb(server);
    /* the paper model's master copy: 4 bytes a parameter, one server holds them all */
    double copy = (double)mq_model_count("paper", 1) * 4 / 1e6;
    cr_log_info("%ld pulls unread: the server grew by %.0f MB at most (one copy: %.0f MB)",
                sent, peak - before, copy);
    cr_expect_gt(sent, 100, "only %ld pulls went out", sent);
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer holds freed memory in quarantine (256 MB by default) and pads every
     * block: no bound on resident memory holds under it. The flood still runs here, for the
     * memory errors it could show. */
    cr_log_info("under AddressSanitizer: the memory bound is not checked");
#else
    /* At most: the snapshot, and CURVE's encrypted copy of the one reply in flight with its
     * encoder's buffer; however many PULLs came (before the shared snapshot every PULL made a
     * copy of its own, until the send timeout stalled the server). */
    cr_expect_lt(peak - before, 4 * copy, "%ld unread pulls grew the server by %.0f MB",
                 sent, peak - before);
#endif
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    zsock_destroy(&d);
    zsock_destroy(&s);
    mq_msg_reset(&welcome);
    zactor_destroy(&c.workers[0]);
    zactor_destroy(&c.sched);
    mq_metrics_destroy(&c.sched_metrics);
}
