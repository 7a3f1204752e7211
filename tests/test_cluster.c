/* The whole cluster in one process: the scheduler, servers and workers run as their real
 * actors over TCP loopback. Checks what a user relies on: the cluster computes what the
 * one-process reference computes, replicas and master copies stay identical, quantized runs
 * learn, and bad messages are counted and dropped while good peers keep being served. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "harness.h"
#include "http_test.h"
#include "mqgrad/data.h"
#include "mqgrad/nn.h"
#include "mqgrad/node.h"
#include "mqgrad/util.h"
#include "mqgrad/wire.h"

/* The one-process reference: batch W*B from the same batcher, plain SGD. */
static float *s_reference(int W, int B, int iters, float lr, uint64_t seed, size_t *n)
{
    mq_dataset_t *d = mq_dataset_load("fashion-mnist", MQ_DEFAULT_DATA_DIR, true);
    cr_assert_not_null(d, "%s", mq_err_last());
    mq_model_t *m = mq_model_new("small", 1, W * B, 1e-4f);
    mq_model_init(m, seed);
    mq_batcher_t *b = mq_batcher_new(d, 0, 1, W * B, seed, true);
    float *x = malloc(sizeof(float) * W * B * 784);
    uint8_t *y = malloc(W * B);
    for (int i = 0; i < iters; i++) {
        mq_batcher_next(b, x, y);
        mq_model_grad(m, x, y, W * B);
        mq_sgd_update(mq_model_params(m), mq_model_grads(m), mq_model_nparams(m), lr);
    }
    *n = mq_model_nparams(m);
    float *w = malloc(sizeof(float) * *n);
    memcpy(w, mq_model_params(m), sizeof(float) * *n);
    free(x);
    free(y);
    mq_batcher_destroy(&b);
    mq_model_destroy(&m);
    mq_dataset_destroy(&d);
    return w;
}

Test(cluster, fp32_matches_reference_and_replicas_agree, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_WARN);
    cluster_t c;
    char *extra[] = {"--model", "small", "--codec", "none", "--iterations", "12", "--batch", "16",
                     "--lr", "0.05", "--seed", "7", "--l2", "1e-4", "--eval-every", "0", NULL};
    cluster_start_core(&c, 2, 2, "fp32", extra);
    cluster_start_workers(&c);
    cr_assert_eq(cluster_wait(&c, 150), 0, "the run did not complete");
    cluster_stop(&c);

    size_t n0, n1, nref;
    char path[300];
    snprintf(path, sizeof path, "%s/worker-0.bin", c.dir);
    float *w0 = s_read_floats(path, &n0);
    snprintf(path, sizeof path, "%s/worker-1.bin", c.dir);
    float *w1 = s_read_floats(path, &n1);
    cr_assert_eq(n0, n1);
    cr_assert(memcmp(w0, w1, n0 * sizeof(float)) == 0, "worker replicas differ");
    size_t off = 0;
    for (int s = 0; s < 2; s++) {
        size_t ns;
        snprintf(path, sizeof path, "%s/server-%d.bin", c.dir, s);
        float *m = s_read_floats(path, &ns);
        cr_assert(off + ns <= n0);
        cr_assert(memcmp(m, w0 + off, ns * sizeof(float)) == 0,
                  "server %d's master copy differs from the workers' parameters", s);
        off += ns;
        free(m);
    }
    cr_assert_eq(off, n0, "the shards do not cover the parameters");

    float *ref = s_reference(2, 16, 12, 0.05f, 7, &nref);
    cr_assert_eq(nref, n0);
    double maxdiff = 0, maxabs = 0;
    for (size_t i = 0; i < n0; i++) {
        maxdiff = fmax(maxdiff, fabs((double)w0[i] - ref[i]));
        maxabs = fmax(maxabs, fabs((double)ref[i]));
    }
    cr_log_info("max |cluster - reference| = %g (max |w| = %g)", maxdiff, maxabs);
    cr_assert_lt(maxdiff, 1e-4 * maxabs, "cluster and reference diverge: %g", maxdiff);
    free(ref);
    free(w0);
    free(w1);
}

/* Mean of the loss column over rows [lo, hi). */
static double s_mean_loss(const char *dir, int lo, int hi)
{
    char path[400], line[1024];
    snprintf(path, sizeof path, "%s/run/metrics.csv", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s missing", path);
    double sum = 0;
    int row = -1, n = 0;
    while (fgets(line, sizeof line, f)) {
        if (row >= lo && row < hi) {
            char *p = strchr(strchr(line, ',') + 1, ',') + 1;
            sum += atof(p);
            n++;
        }
        row++;
    }
    fclose(f);
    cr_assert_eq(n, hi - lo, "metrics.csv has %d rows in [%d,%d)", n, lo, hi);
    return sum / n;
}

ParameterizedTestParameters(cluster, quantized_runs_learn)
{
    static int bits[] = {2, 8};
    return cr_make_param_array(int, bits, 2);
}

ParameterizedTest(int *bits, cluster, quantized_runs_learn, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_WARN);
    cluster_t c;
    char b[8], name[16];
    snprintf(b, sizeof b, "%d", *bits);
    snprintf(name, sizeof name, "q%d", *bits);
    /* A low threshold so the small model's big layers are quantized, as the paper's are. */
    char *extra[] = {"--model", "small", "--bits", b, "--threshold", "1000", "--iterations", "80",
                     "--batch", "32", "--lr", "0.05", "--eval-every", "0", NULL};
    cluster_start_core(&c, 2, 2, name, extra);
    cluster_start_workers(&c);
    cr_assert_eq(cluster_wait(&c, 150), 0);
    cluster_stop(&c);
    double first = s_mean_loss(c.dir, 0, 10), last = s_mean_loss(c.dir, 70, 80);
    cr_log_info("%d bits: loss %.4f -> %.4f", *bits, first, last);
    cr_assert_lt(last, 0.8 * first, "%d-bit run did not learn: %.4f -> %.4f", *bits, first, last);
}

/* ---- the agent in a live cluster ------------------------------------------------------ */


static zactor_t *s_agent_start(mq_agent_config_t *cfg, const char *endpoint, const char *state,
                               const char *policy)
{
    char *argv[] = {"agent", "--bind", (char *)endpoint, "--http-port", "0", "--policy",
                    (char *)policy, "--state", (char *)state, NULL};
    test_keys();
    cr_assert_eq(mq_agent_config_parse(cfg, 9, argv), 0, "%s", mq_err_last());
    zactor_t *a = zactor_new(mq_agent_actor, cfg);
    cr_assert_eq(cfg->start_status, 0, "agent did not start: %s", cfg->start_error);
    return a;
}

/* One request to the agent; returns the reply (caller resets it). */
static void s_agent_ask(const char *endpoint, mq_msg_type_t type, const char *text,
                        mq_msg_t *reply)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    mq_wire_prepare(s, 500, MQ_WIRE_MAX_CONTROL_MSG);
    test_sec_client(s, "operator", MQ_KEY_AGENT);
    zsock_set_rcvtimeo(s, 3000);
    cr_assert_eq(zsock_connect(s, "%s", endpoint), 0);
    memset(reply, 0, sizeof *reply);
    mq_msg_init(reply, type);
    if (type == MQ_MSG_POLICY_SET)
        snprintf(reply->policy_set.policy, sizeof reply->policy_set.policy, "%s", text);
    cr_assert_eq(mq_wire_send(s, reply, NULL, 0), 0);
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(s, reply, &drop), 0, "the agent did not answer");
    zsock_destroy(&s);
}

Test(cluster, agent_swaps_and_restarts_while_training, .timeout = 240)
{
    mq_log_set_level(MQ_LOG_ERROR);
    char endpoint[64], state[128];
    int port = 20000 + (int)(getpid() % 20000);
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    snprintf(state, sizeof state, "/tmp/mqgrad-agent-%d.state", (int)getpid());
    unlink(state);
    static mq_agent_config_t acfg, acfg2;
    zactor_t *agent = s_agent_start(&acfg, endpoint, state, "mqgrad");

    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "400", "--threshold", "1000",
                     "--eval-every", "0", "--agent", endpoint, NULL};
    cluster_start_core(&c, 2, 1, "agent", extra);
    cluster_start_workers(&c);

    char run[300];
    snprintf(run, sizeof run, "%s/run", c.dir);
    mq_msg_t reply;
    mq_test_wait_rows(run, 60, 75);
    s_agent_ask(endpoint, MQ_MSG_POLICY_SET, "fixed:4", &reply);
    cr_assert_eq(reply.type, MQ_MSG_STATUS, "swap refused: %s", reply.error.reason);
    mq_test_wait_rows(run, 100, 75);
    s_agent_ask(endpoint, MQ_MSG_POLICY_SET, "mqgrad", &reply);
    cr_assert_eq(reply.type, MQ_MSG_STATUS);
    mq_test_wait_rows(run, 140, 75);
    s_agent_ask(endpoint, MQ_MSG_QUERY, NULL, &reply);
    uint64_t step_before = reply.status.step;
    cr_assert_gt(step_before, 0);

    char *text = malloc(1 << 16);
    cr_assert(mq_metrics_render(c.sched_metrics, text, 1 << 16) > 0);
    cr_assert_eq(test_metric_sample(text, "mqgrad_scheduler_agent_fallbacks_total "), 0.0, "%s",
                 text);
    zactor_destroy(&agent); /* the agent goes away mid-run */
    int rows = mq_test_rows(run);
    mq_test_wait_rows(run, rows + 30, 75); /* training goes on without it */
    /* what an operator's dashboard sees: the scheduler counts the iterations it went on with
     * no answer from the agent */
    cr_assert(mq_metrics_render(c.sched_metrics, text, 1 << 16) > 0);
    double fell_back = test_metric_sample(text, "mqgrad_scheduler_agent_fallbacks_total ");
    cr_assert_geq(fell_back, 1.0, "no fallback counted: %s", text);
    free(text);
    agent = s_agent_start(&acfg2, endpoint, state, "mqgrad");
    s_agent_ask(endpoint, MQ_MSG_QUERY, NULL, &reply);
    cr_assert_geq(reply.status.step, step_before, "the restarted agent lost its state");

    cr_assert_eq(cluster_wait(&c, 200), 0, "the run did not complete");
    cluster_stop(&c);
    zactor_destroy(&agent);

    char path[400], *events;
    size_t len;
    snprintf(path, sizeof path, "%s/run/events.jsonl", c.dir);
    cr_assert_eq(mq_read_file(path, &events, &len), 0);
    cr_expect(strstr(events, "\"from\":\"mqgrad\",\"to\":\"fixed:4\""), "%s", events);
    cr_expect(strstr(events, "\"from\":\"fixed:4\",\"to\":\"mqgrad\""), "%s", events);
    cr_expect(strstr(events, "agent_fallback"), "%s", events);
    cr_expect(strstr(events, "agent_back"), "%s", events);
    free(events);
    unlink(state);
}

/* A REGISTER nothing answers (lost, or sent as the scheduler took the run back to its
 * checkpoint) goes again after MQ_REGISTER_RETRY_S, on a new connection, with the same
 * incarnation, so a scheduler that holds it already moves the node there (the next test).
 * Before, the node waited out its whole peer timeout and left (a restarted server did, and
 * the run failed). */
Test(cluster, an_unanswered_registration_goes_again_on_a_new_connection, .timeout = 60)
{
    mq_log_set_level(MQ_LOG_ERROR);
    zsock_t *sched = zsock_new(ZMQ_ROUTER); /* hears, never answers */
    int port = zsock_bind(sched, "tcp://127.0.0.1:*");
    cr_assert(port > 0);
    zsock_set_rcvtimeo(sched, 20000);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    mq_server_config_t cfg;
    char *sargv[] = {"server",     "--scheduler", endpoint, "--bind", "tcp://127.0.0.1:*",
                     "--insecure", NULL};
    cr_assert_eq(mq_server_config_parse(&cfg, s_argc(sargv), sargv), 0);
    mq_metrics_t *metrics = cfg.metrics = mq_metrics_new("server");
    zactor_t *server = zactor_new(mq_server_actor, &cfg);
    mq_msg_t first = {0}, again = {0};
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(sched, &first, &drop), 0, "no REGISTER: %s", mq_err_last());
    double t0 = mq_now_s();
    cr_assert_eq(first.type, MQ_MSG_REGISTER);
    cr_assert_eq(mq_wire_recv(sched, &again, &drop), 0, "the REGISTER did not go again");
    double waited = mq_now_s() - t0;
    cr_expect_eq(again.type, MQ_MSG_REGISTER);
    cr_expect_eq(again.incarnation, first.incarnation,
                 "a new incarnation would hold a second "
                 "place at a scheduler that had the first");
    cr_expect(again.peer_len != first.peer_len ||
                  memcmp(again.peer, first.peer, first.peer_len) != 0,
              "the same connection");
    cr_expect(waited >= MQ_REGISTER_RETRY_S - 1.5 && waited <= MQ_REGISTER_RETRY_S + 3.0,
              "went again after %.1f s", waited);
    mq_msg_reset(&first);
    mq_msg_reset(&again);
    zactor_destroy(&server);
    zsock_destroy(&sched);
    mq_metrics_destroy(&metrics);
}

/* A new connection to the scheduler at ENDPOINT, with a worker's key, that sends a worker's
 * REGISTER as INCARNATION's try ATTEMPT; replies wait at most RCVTIMEO_MS. */
static zsock_t *s_register_try(const char *endpoint, uint64_t incarnation, uint32_t attempt,
                               int rcvtimeo_ms)
{
    zsock_t *conn = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(conn);
    mq_wire_prepare(conn, 0, MQ_WIRE_MAX_MSG);
    zsock_set_rcvtimeo(conn, rcvtimeo_ms);
    test_sec_client(conn, "worker", MQ_KEY_SCHEDULER);
    cr_assert_eq(zsock_connect(conn, "%s", endpoint), 0);
    mq_msg_t m;
    memset(&m, 0, sizeof m);
    mq_msg_init(&m, MQ_MSG_REGISTER);
    m.role = MQ_ROLE_WORKER;
    m.incarnation = incarnation;
    m.register_.attempt = attempt;
    cr_assert_eq(mq_wire_send(conn, &m, NULL, 0), 0);
    return conn;
}

/* A REGISTER sent again on a new connection (a node that heard nothing on its first: the
 * scheduler's answers there were lost) is answered on the new one: here the first connection
 * registers a worker, completing the cluster, and is closed; the same incarnation on a second
 * connection gets the WELCOME, then the heartbeats. Before, the scheduler took it as a repeat
 * and went on answering the closed connection, so the node could never join. */
Test(cluster, a_registration_sent_again_is_answered_on_its_new_connection, .timeout = 60)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "5", "--eval-every", "0", NULL};
    cluster_start_core(&c, 1, 1, "again", extra);
    zsock_t *conn[2];
    mq_msg_t m;
    mq_drop_t drop;
    for (int k = 0; k < 2; k++) {
        conn[k] = s_register_try(c.endpoint, 0x5eed, (uint32_t)k, 10000);
        if (k == 0) { /* the first WELCOME comes, and is left unread with its connection */
            zclock_sleep(1000);
            zsock_destroy(&conn[0]);
        }
    }
    cr_assert_eq(mq_wire_recv(conn[1], &m, &drop), 0, "no answer on the new connection: %s",
                 mq_err_last());
    cr_expect_eq(m.type, MQ_MSG_WELCOME, "got %s", mq_msg_type_name(m.type));
    cr_expect_eq(m.rank, 0);
    mq_msg_reset(&m);
    cr_assert_eq(mq_wire_recv(conn[1], &m, &drop), 0, "no heartbeat on the new connection");
    cr_expect_eq(m.type, MQ_MSG_HEARTBEAT, "got %s", mq_msg_type_name(m.type));
    mq_msg_reset(&m);
    zsock_destroy(&conn[1]);
    cluster_stop(&c);
}

/* A node's REGISTER tries on their connections may reach the scheduler in any order (its
 * ROUTER takes its connections in turn): a late earlier try must not take the answers back to
 * a connection the node has closed. Here the second try (attempt 1) registers first; the
 * first (attempt 0) comes after it on its own connection; the heartbeats go on reaching the
 * second, and the first hears nothing. Before, the late try moved the answers to it, and a
 * server so registered heard nothing more and ended as "scheduler gone". */
Test(cluster, a_late_earlier_registration_does_not_take_the_answers_back, .timeout = 60)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "5", "--eval-every", "0", NULL};
    cluster_start_core(&c, 1, 1, "late", extra);
    zsock_t *conn[2];
    mq_msg_t m;
    mq_drop_t drop;
    for (int k = 1; k >= 0; k--) {
        conn[k] = s_register_try(c.endpoint, 0x1a7e, (uint32_t)k, k ? 10000 : 3000);
        if (k == 1) {
            cr_assert_eq(mq_wire_recv(conn[1], &m, &drop), 0, "no WELCOME: %s", mq_err_last());
            cr_expect_eq(m.type, MQ_MSG_WELCOME, "got %s", mq_msg_type_name(m.type));
            mq_msg_reset(&m);
        }
    }
    /* the scheduler beats every tick: over 3 s the second connection hears it again and again,
     * the first not at all */
    int beats = 0;
    double until = mq_now_s() + 3;
    zsock_set_rcvtimeo(conn[1], 500);
    while (mq_now_s() < until)
        if (mq_wire_recv(conn[1], &m, &drop) == 0) {
            beats += m.type == MQ_MSG_HEARTBEAT;
            mq_msg_reset(&m);
        }
    cr_expect_gt(beats, 1, "the node's latest connection heard %d heartbeats in 3 s", beats);
    cr_expect_neq(mq_wire_recv(conn[0], &m, &drop), 0, "the earlier try's connection got %s",
                  mq_msg_type_name(m.type));
    for (int k = 0; k < 2; k++)
        zsock_destroy(&conn[k]);
    cluster_stop(&c);
}

/* Servers that ask for a shard (--shard: a StatefulSet's pod index, whose volume holds that
 * shard's checkpoints) get it whatever order they register in; their metrics say which. */
Test(cluster, servers_get_the_shards_they_ask_for, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_WARN);
    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "5", "--eval-every", "0", NULL};
    cluster_start_sched(&c, 1, 2, "shards", extra);
    mq_metrics_t *metrics[2];
    for (int i = 0; i < 2; i++) { /* the first to register asks for shard 1 */
        char shard[8];
        snprintf(shard, sizeof shard, "%d", 1 - i);
        char *sargv[] = {"server", "--scheduler", c.endpoint, "--bind", "tcp://127.0.0.1:*",
                         "--shard", shard, NULL};
        cr_assert_eq(mq_server_config_parse(&c.svcfg[i], s_argc(sargv), sargv), 0);
        c.svcfg[i].metrics = metrics[i] = mq_metrics_new("server");
        c.servers[i] = zactor_new(mq_server_actor, &c.svcfg[i]);
        zclock_sleep(300); /* registered before the next one starts */
    }
    cluster_start_workers(&c);
    cr_assert_eq(cluster_wait(&c, 150), 0, "the run did not complete");
    for (int i = 0; i < 2; i++) {
        mq_metric_t *m = mq_metrics_gauge(metrics[i], "mqgrad_server_shard", NULL, NULL);
        cr_assert_float_eq(mq_metric_value(m), 1 - i, 0, "server %d holds shard %g", i,
                           mq_metric_value(m));
        cr_assert_gt(mq_metric_value(mq_metrics_counter(metrics[i], "mqgrad_server_rounds_total",
                                                        NULL, NULL)),
                     4);
    }
    cluster_stop(&c);
    for (int i = 0; i < 2; i++)
        mq_metrics_destroy(&metrics[i]);
}

/* A worker whose loop is wedged while its heartbeat thread goes on (here: a test socket that
 * registers, says READY and heartbeats, but never pushes nor reports) looks alive. When a
 * round's other members have reported and it has not within --iter-timeout, it is taken out
 * of the run like a lost worker, and the run completes with the others; before, the whole
 * run failed at the timeout. */
Test(cluster, a_worker_stuck_but_heartbeating_is_taken_out, .timeout = 180)
{
    mq_log_set_level(MQ_LOG_ERROR);
    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "60", "--eval-every", "0",
                     "--iter-timeout", "2", NULL};
    cluster_start_core(&c, 3, 1, "stuck", extra);
    c.W = 2; /* the third member is the stuck one below */
    cluster_start_workers(&c);
    static mq_msg_t m, welcome;
    zsock_t *s = test_stand_in(c.endpoint, 77, &welcome);
    mq_drop_t drop;
    /* READY, then heartbeats and nothing else, as a wedged worker's thread would send. */
    mq_msg_type_t say = MQ_MSG_READY;
    int code = -1;
    for (int64_t end = zclock_mono() + 120000; code < 0 && zclock_mono() < end;) {
        test_stand_in_msg(&m, say, &welcome, 77);
        mq_wire_send(s, &m, NULL, 0);
        say = MQ_MSG_HEARTBEAT;
        while (mq_wire_recv(s, &m, &drop) == 0) /* ITERATE and the rest: not acted on */
            mq_msg_reset(&m);
        code = s_wait_done(c.sched, 300);
    }
    cr_expect_eq(code, 0, "the run did not complete with the stuck worker taken out");
    for (int i = 0; i < c.S; i++)
        cr_expect_eq(s_wait_done(c.servers[i], 10000), 0, "server %d did not stop cleanly", i);
    for (int i = 0; i < c.W; i++)
        cr_expect_eq(s_wait_done(c.workers[i], 10000), 0, "worker %d did not stop cleanly", i);
    char path[400], *events;
    size_t len;
    snprintf(path, sizeof path, "%s/run/events.jsonl", c.dir);
    cr_assert_eq(mq_read_file(path, &events, &len), 0, "%s", mq_err_last());
    cr_expect(strstr(events, "\"worker_lost\"") && strstr(events, "iter-timeout"),
              "the stuck worker was not taken out:\n%s", events);
    free(events);
    mq_msg_reset(&welcome);
    zsock_destroy(&s);
    cluster_stop(&c);
}
