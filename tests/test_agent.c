/* The agent service, started in-process on tcp://127.0.0.1:* as the real actor: the ZeroMQ
 * protocol (PING, OBSERVE, QUERY, POLICY_SET, bad messages), HTTP, the CLI, persistence
 * across restarts (exact resume) and the refusal of a corrupt state file. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <glob.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "http_test.h"

#define S_CLI MQ_TEST_BIN_DIR "/tools/mqgrad"
#define S_AGENT MQ_TEST_BIN_DIR "/services/mqgrad-agent"

extern char **environ;

/* The agent's logic and program, not who may talk to it (test_security's): its services and
 * clients here run without keys. Set before Criterion forks the tests. */
__attribute__((constructor)) static void s_no_keys(void)
{
    setenv("MQGRAD_INSECURE", "1", 1);
}

typedef struct {
    mq_agent_config_t cfg;
    zactor_t *actor;
    int port, http;
} s_agent_t;

/* Starts an agent with POLICY, STATE ("" = none) and HTTP on any free port. */
static s_agent_t *s_start(const char *policy, const char *state, bool fresh)
{
    s_agent_t *a = calloc(1, sizeof *a);
    cr_assert(a);
    cr_assert_eq(mq_agent_config_default(&a->cfg), 0);
    snprintf(a->cfg.bind, sizeof a->cfg.bind, "tcp://127.0.0.1:*");
    snprintf(a->cfg.policy, sizeof a->cfg.policy, "%s", policy);
    snprintf(a->cfg.state, sizeof a->cfg.state, "%s", state);
    a->cfg.http.port = MQ_HTTP_ANY_PORT;
    a->cfg.fresh = fresh;
    a->cfg.opts.seed = 7;
    a->actor = zactor_new(mq_agent_actor, &a->cfg);
    cr_assert(a->actor);
    if (a->cfg.start_status == 0) {
        zstr_send(a->actor, "PORT");
        char *s = zstr_recv(a->actor);
        a->port = atoi(s);
        zstr_free(&s);
        zstr_send(a->actor, "HTTP-PORT");
        s = zstr_recv(a->actor);
        a->http = atoi(s);
        zstr_free(&s);
    }
    return a;
}

static void s_stop(s_agent_t **a)
{
    zactor_destroy(&(*a)->actor);
    free(*a);
    *a = NULL;
}

static zsock_t *s_client(int port)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    cr_assert(s);
    mq_wire_prepare(s, 0, MQ_WIRE_MAX_CONTROL_MSG);
    zsock_set_rcvtimeo(s, 3000);
    cr_assert_eq(zsock_connect(s, "tcp://127.0.0.1:%d", port), 0);
    return s;
}

/* Sends REQ (type and text) and receives the reply into a new message. */
static mq_msg_t *s_ask(zsock_t *s, mq_msg_type_t type, const char *text)
{
    mq_msg_t *m = calloc(1, sizeof *m);
    cr_assert(m);
    mq_msg_init(m, type);
    if (text)
        snprintf(m->policy_set.policy, sizeof m->policy_set.policy, "%s", text);
    cr_assert_eq(mq_wire_send(s, m, NULL, 0), 0);
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(s, m, &drop), 0, "no reply to %s: %s", mq_msg_type_name(type),
                 mq_err_last());
    return m;
}

static double s_loss(uint64_t i)
{
    return 2.3 * exp(-(double)i / 40.0) + 0.05 * sin((double)i);
}

/* OBSERVE iteration I; returns the DECISION (caller frees). */
static mq_msg_t *s_observe(zsock_t *s, uint64_t i)
{
    mq_msg_t *m = calloc(1, sizeof *m);
    cr_assert(m);
    mq_msg_init(m, MQ_MSG_OBSERVE);
    m->iter = i;
    m->observe = (mq_obs_msg_t){.loss = s_loss(i),
                            .iter_ms = 100.0 + (double)(i % 3),
                            .grad_sqmean = 1e-4,
                            .grad_range = 0.05,
                            .total_iters = 1000,
                            .progress = (double)i / 1000.0,
                            .bits = 2,
                            .fallbacks = 3};
    cr_assert_eq(mq_wire_send(s, m, NULL, 0), 0);
    mq_drop_t drop;
    cr_assert_eq(mq_wire_recv(s, m, &drop), 0, "no decision for iteration %llu",
                 (unsigned long long)i);
    cr_assert_eq(m->type, MQ_MSG_DECISION, "got %s", mq_msg_type_name(m->type));
    cr_assert_eq(m->iter, i);
    cr_assert(m->decision.policy[0], "a decision names its policy");
    return m;
}

static int s_observe_bits(zsock_t *s, uint64_t i)
{
    mq_msg_t *m = s_observe(s, i);
    int b = (int)m->decision.bits;
    free(m);
    return b;
}

/* Runs CMD, captures stdout into OUT; returns the exit status. */
static int s_run(const char *cmd, char *out, size_t cap)
{
    FILE *f = popen(cmd, "r");
    cr_assert(f, "cannot run %s", cmd);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void s_tmpdir(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/mqgrad-agent-test-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static uint64_t s_metric(const char *text, const char *name)
{
    const char *p = strstr(text, name);
    cr_assert(p, "metric %s missing from:\n%s", name, text);
    return strtoull(p + strlen(name), NULL, 10);
}

Test(agent, ping_pong, .timeout = 20)
{
    s_agent_t *a = s_start("mqgrad", "", false);
    cr_assert_eq(a->cfg.start_status, 0, "%s", a->cfg.start_error);
    zsock_t *c = s_client(a->port);
    mq_msg_t *m = s_ask(c, MQ_MSG_PING, NULL);
    cr_assert_eq(m->type, MQ_MSG_PONG);
    free(m);
    zsock_destroy(&c);
    s_stop(&a);
}

Test(agent, fixed_policy_always_decides_its_bits, .timeout = 20)
{
    s_agent_t *a = s_start("fixed:4", "", false);
    zsock_t *c = s_client(a->port);
    for (uint64_t i = 0; i < 20; i++)
        cr_assert_eq(s_observe_bits(c, i), 4, "iteration %llu", (unsigned long long)i);
    mq_msg_t *q = s_ask(c, MQ_MSG_QUERY, NULL);
    cr_assert_eq(q->type, MQ_MSG_STATUS);
    cr_assert_str_eq(q->status.policy, "fixed:4");
    cr_assert_eq(q->status.step, 4);
    cr_assert_eq(q->status.observations, 20);
    cr_assert_eq(q->status.decisions, 4);
    cr_assert_eq(q->status.fallbacks, 3);
    free(q);
    zsock_destroy(&c);
    s_stop(&a);
}

Test(agent, mqgrad_bits_stay_in_range_never_decrease_and_query_matches, .timeout = 30)
{
    s_agent_t *a = s_start("mqgrad:epsilon=0.5", "", false);
    zsock_t *c = s_client(a->port);
    int prev = 2;
    mq_msg_t *last = NULL;
    for (uint64_t i = 0; i < 60; i++) {
        free(last);
        last = s_observe(c, i);
        int b = (int)last->decision.bits;
        cr_assert(b >= 2 && b <= 8, "bits %d at iteration %llu", b, (unsigned long long)i);
        cr_assert_geq(b, prev, "bits fell from %d to %d at iteration %llu", prev, b,
                      (unsigned long long)i);
        prev = b;
    }
    cr_assert_gt(prev, 2, "with epsilon 0.5 over 12 decisions the bits should have risen");
    mq_msg_t *q = s_ask(c, MQ_MSG_QUERY, NULL);
    cr_assert_eq(q->status.bits, last->decision.bits);
    cr_assert_eq(q->status.step, 12);
    cr_assert_eq(q->status.iter, 59);
    cr_assert_eq(q->status.n_q_values, 7);
    cr_assert_eq(q->status.min_bits, 2);
    cr_assert_eq(memcmp(q->status.q_values, last->decision.q_values, 7 * sizeof(double)), 0);
    cr_assert(isfinite(q->status.q_values[0]) && isfinite(q->status.last_reward));
    free(q);
    free(last);
    zsock_destroy(&c);
    s_stop(&a);
}

Test(agent, cli_http_and_zmq_report_the_same_bits, .timeout = 30)
{
    s_agent_t *a = s_start("mqgrad:epsilon=0.5", "", false);
    zsock_t *c = s_client(a->port);
    int bits = 0;
    for (uint64_t i = 0; i < 40; i++)
        bits = s_observe_bits(c, i);
    cr_assert(access(S_CLI, X_OK) == 0, "the CLI %s is not built", S_CLI);
    char cmd[512], out[8192], want[64];
    snprintf(cmd, sizeof cmd, S_CLI " bits --agent tcp://127.0.0.1:%d", a->port);
    cr_assert_eq(s_run(cmd, out, sizeof out), 0, "%s", cmd);
    cr_assert_eq(atoi(out), bits, "CLI says %s, decision said %d", out, bits);
    snprintf(cmd, sizeof cmd, S_CLI " status --json --agent tcp://127.0.0.1:%d", a->port);
    cr_assert_eq(s_run(cmd, out, sizeof out), 0);
    snprintf(want, sizeof want, "{\"bits\":%d,\"policy\":\"mqgrad:epsilon=0.5\",\"step\":8,", bits);
    cr_assert_eq(strncmp(out, want, strlen(want)), 0, "status --json: %s", out);
    cr_assert(strstr(out, "\"observations\":40,\"decisions\":8,\"fallbacks\":3}"), "%s", out);
    snprintf(cmd, sizeof cmd, S_CLI " status --agent tcp://127.0.0.1:%d", a->port);
    cr_assert_eq(s_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "MDP step      8\n") && strstr(out, "<- current"), "%s", out);

    char body[16384];
    cr_assert_eq(test_http(a->http, NULL, "GET", "/bits", body, sizeof body), 200);
    cr_assert_eq(strncmp(body, want, strlen(want)), 0, "/bits: %s", body);
    cr_assert_eq(test_http(a->http, NULL, "GET", "/metrics", body, sizeof body), 200);
    cr_assert_eq(s_metric(body, "\nmqgrad_agent_bits "), (uint64_t)bits);
    cr_assert_eq(s_metric(body, "\nmqgrad_agent_decisions_total "), 8);
    cr_assert_eq(s_metric(body, "\nmqgrad_agent_observations_total "), 40);
    cr_assert_eq(s_metric(body, "\nmqgrad_agent_fallbacks_total "), 3);
    cr_assert(strstr(body, "# TYPE mqgrad_agent_bits gauge\n"));
    cr_assert(strstr(body, "# TYPE mqgrad_agent_decisions_total counter\n"));
    cr_assert_eq(test_http(a->http, NULL, "GET", "/healthz", body, sizeof body), 200);
    cr_assert_str_eq(body, "ok\n");
    cr_assert_eq(test_http(a->http, NULL, "GET", "/nope", body, sizeof body), 404);
    cr_assert_eq(test_http(a->http, NULL, "POST", "/bits", body, sizeof body), 405);
    zsock_destroy(&c);
    s_stop(&a);
}

Test(agent, policy_swap_and_back_resumes_learning, .timeout = 30)
{
    s_agent_t *a = s_start("mqgrad:epsilon=0.5", "", false);
    zsock_t *c = s_client(a->port);
    uint64_t i = 0;
    for (; i < 20; i++)
        s_observe_bits(c, i);
    mq_msg_t *before = s_ask(c, MQ_MSG_QUERY, NULL);
    mq_msg_t *m = s_ask(c, MQ_MSG_POLICY_SET, "fixed:4");
    cr_assert_eq(m->type, MQ_MSG_STATUS);
    cr_assert_str_eq(m->status.policy, "fixed:4");
    free(m);
    for (; i < 30; i++)
        cr_assert_eq(s_observe_bits(c, i), 4);
    m = s_ask(c, MQ_MSG_POLICY_SET, "bogus");
    cr_assert_eq(m->type, MQ_MSG_ERROR);
    cr_assert(strstr(m->error.reason, "bogus"), "%s", m->error.reason);
    free(m);
    m = s_ask(c, MQ_MSG_PING, NULL);
    cr_assert_eq(m->type, MQ_MSG_PONG);
    free(m);
    m = s_ask(c, MQ_MSG_POLICY_SET, "mqgrad:epsilon=0.5");
    cr_assert_eq(m->type, MQ_MSG_STATUS);
    cr_assert_eq(m->status.step, before->status.step, "mqgrad did not resume its state");
    cr_assert_eq(m->status.bits, before->status.bits);
    cr_assert_eq(m->status.decisions, 6);
    free(m);
    /* The CLI: a good spec prints the new status, a bad one the agent's error and exit 1. */
    char cmd[512], out[4096], body[16384];
    snprintf(cmd, sizeof cmd, S_CLI " policy set fixed:6 --agent tcp://127.0.0.1:%d", a->port);
    cr_assert_eq(s_run(cmd, out, sizeof out), 0);
    cr_assert(strstr(out, "policy        fixed:6\n"), "%s", out);
    snprintf(cmd, sizeof cmd, S_CLI " policy set nonsense:1 --agent tcp://127.0.0.1:%d 2>&1",
             a->port);
    cr_assert_eq(s_run(cmd, out, sizeof out), 1);
    cr_assert(strstr(out, "nonsense"), "%s", out);
    cr_assert_eq(s_observe_bits(c, i), 6);
    cr_assert_eq(test_http(a->http, NULL, "GET", "/metrics", body, sizeof body), 200);
    cr_assert_eq(s_metric(body, "\nmqgrad_agent_policy_swaps_total "), 3);
    free(before);
    zsock_destroy(&c);
    s_stop(&a);
}

Test(agent, bad_messages_are_counted_drops_and_service_goes_on, .timeout = 20)
{
    s_agent_t *a = s_start("mqgrad", "", false);
    zsock_t *c = s_client(a->port);
    void *h = zsock_resolve(c);
    zmq_send(h, "hello, not protobuf", 19, 0);
    /* field 1 (version) as a one-byte varint, then an empty body: field 112 (PING) or 99 (no
     * type's) */
    const uint8_t wrong_version[] = {0x08, MQ_WIRE_VERSION + 1, 0x82, 0x07, 0x00}; /* a later */
    zmq_send(h, wrong_version, sizeof wrong_version, 0);
    const uint8_t unknown_type[] = {0x08, MQ_WIRE_VERSION, 0x9a, 0x06, 0x00}; /* this one */
    zmq_send(h, unknown_type, sizeof unknown_type, 0);
    mq_msg_t *m = s_ask(c, MQ_MSG_REGISTER, NULL); /* a type the agent does not take */
    cr_assert_eq(m->type, MQ_MSG_ERROR);
    cr_assert(strstr(m->error.reason, "register"), "%s", m->error.reason);
    free(m);
    m = s_ask(c, MQ_MSG_PING, NULL);
    cr_assert_eq(m->type, MQ_MSG_PONG);
    free(m);
    cr_assert_eq(s_observe_bits(c, 0), 2);
    char body[16384];
    cr_assert_eq(test_http(a->http, NULL, "GET", "/metrics", body, sizeof body), 200);
    cr_assert_eq(s_metric(body, "reason=\"garbage\"} "), 1);
    cr_assert_eq(s_metric(body, "reason=\"version\"} "), 1);
    cr_assert_eq(s_metric(body, "reason=\"type\"} "), 2);
    zstr_send(a->actor, "DROPS");
    char *drops = zstr_recv(a->actor);
    cr_assert(strstr(drops, "garbage=1") && strstr(drops, "type=2"), "%s", drops);
    zstr_free(&drops);
    zsock_destroy(&c);
    s_stop(&a);
}

/* Feeds iterations FROM..TO-1 and stores the decisions' bits in OUT[i]. */
static void s_feed(s_agent_t *a, uint64_t from, uint64_t to, int *out)
{
    zsock_t *c = s_client(a->port);
    for (uint64_t i = from; i < to; i++)
        out[i] = s_observe_bits(c, i);
    zsock_destroy(&c);
}

static mq_msg_t *s_query(s_agent_t *a)
{
    zsock_t *c = s_client(a->port);
    mq_msg_t *m = s_ask(c, MQ_MSG_QUERY, NULL);
    zsock_destroy(&c);
    return m;
}

/* Runs 60 iterations with a stop and restart after CUT of them, and 60 without; the
 * decisions, the step and the Q-values must be identical. A stop between decisions saves
 * the partly observed window too. */
static void s_restart_case(uint64_t cut)
{
    char dir[64], state[128];
    s_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/sub/agent.state", dir); /* sub/ does not exist yet */
    int with_restart[60] = {0}, straight[60] = {0};
    s_agent_t *a = s_start("mqgrad:epsilon=0.3", state, false);
    cr_assert_eq(a->cfg.start_status, 0, "%s", a->cfg.start_error);
    s_feed(a, 0, cut, with_restart);
    s_stop(&a);
    a = s_start("mqgrad:epsilon=0.3", state, false);
    cr_assert_eq(a->cfg.start_status, 0, "%s", a->cfg.start_error);
    char want[64];
    snprintf(want, sizeof want, "resumed at step %llu", (unsigned long long)(cut / 5));
    cr_assert(strstr(a->cfg.start_info, want), "%s", a->cfg.start_info);
    mq_msg_t *q = s_query(a);
    cr_assert_eq(q->status.step, cut / 5);
    cr_assert_eq(q->status.observations, cut);
    cr_assert_eq(q->status.iter, cut - 1);
    free(q);
    s_feed(a, cut, 60, with_restart);
    mq_msg_t *qa = s_query(a);
    s_stop(&a);

    s_agent_t *b = s_start("mqgrad:epsilon=0.3", "", false);
    s_feed(b, 0, 60, straight);
    mq_msg_t *qb = s_query(b);
    s_stop(&b);
    for (int i = 0; i < 60; i++)
        cr_assert_eq(with_restart[i], straight[i],
                     "iteration %d: %d bits after a restart, %d "
                     "without",
                     i, with_restart[i], straight[i]);
    cr_assert_eq(qa->status.step, 12);
    cr_assert_eq(qa->status.step, qb->status.step);
    cr_assert_eq(memcmp(qa->status.q_values, qb->status.q_values, 7 * sizeof(double)), 0,
                 "Q-values differ: the weights were not restored bit-exactly");
    cr_assert_eq(memcmp(&qa->status.last_reward, &qb->status.last_reward, sizeof(double)), 0);
    free(qa);
    free(qb);
    unlink(state);
    *strrchr(state, '/') = '\0';
    rmdir(state);
    rmdir(dir);
}

Test(agent, restart_at_a_decision_resumes_exactly, .timeout = 60)
{
    s_restart_case(10);
}

Test(agent, restart_between_decisions_resumes_exactly, .timeout = 60)
{
    s_restart_case(13);
}

Test(agent, requested_policy_wins_over_the_state_file_and_mqgrad_stays_stashed, .timeout = 30)
{
    char dir[64], state[128];
    s_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/agent.state", dir);
    int bits[40];
    s_agent_t *a = s_start("mqgrad", state, false);
    s_feed(a, 0, 20, bits);
    s_stop(&a);
    a = s_start("fixed:5", state, false);
    cr_assert_eq(a->cfg.start_status, 0, "%s", a->cfg.start_error);
    s_feed(a, 20, 25, bits);
    cr_assert_eq(bits[24], 5);
    zsock_t *c = s_client(a->port);
    mq_msg_t *m = s_ask(c, MQ_MSG_POLICY_SET, "mqgrad");
    cr_assert_eq(m->type, MQ_MSG_STATUS);
    cr_assert_eq(m->status.step, 4, "the stashed mqgrad policy should resume at step 4");
    free(m);
    zsock_destroy(&c);
    s_stop(&a);
    unlink(state);
    rmdir(dir);
}

Test(agent, iterations_starting_over_begin_a_new_run, .timeout = 30)
{
    char dir[64], state[128], pattern[160];
    s_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/agent.state", dir);
    int bits[40];
    s_agent_t *a = s_start("mqgrad:epsilon=0.5", state, false);
    s_feed(a, 0, 40, bits);
    mq_msg_t *q = s_query(a);
    cr_assert_eq(q->status.step, 8);
    free(q);
    s_feed(a, 0, 5, bits); /* a new run: iteration 0 again */
    q = s_query(a);
    cr_assert_eq(q->status.step, 1, "the policy did not start anew");
    cr_assert_eq(q->status.iter, 4);
    cr_assert_eq(q->status.decisions, 9);
    free(q);
    s_stop(&a);
    snprintf(pattern, sizeof pattern, "%s.run-*", state);
    glob_t g;
    cr_assert_eq(glob(pattern, 0, NULL, &g), 0, "the previous run's state was not kept");
    unlink(g.gl_pathv[0]);
    globfree(&g);
    unlink(state);
    rmdir(dir);
}

static char *s_slurp(const char *path)
{
    char *data;
    size_t len;
    cr_assert_eq(mq_read_file(path, &data, &len), 0, "%s", mq_err_last());
    return data;
}

Test(agent, corrupt_state_file_is_refused_and_kept_unless_fresh, .timeout = 30)
{
    char dir[64], state[128], pattern[160];
    s_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/agent.state", dir);
    const char *garbage = "this is not an agent state file\n";
    cr_assert_eq(mq_write_file_atomic(state, garbage, strlen(garbage)), 0);
    s_agent_t *a = s_start("mqgrad", state, false);
    cr_assert_eq(a->cfg.start_status, 2);
    cr_assert(strstr(a->cfg.start_error, state), "%s", a->cfg.start_error);
    cr_assert(strstr(a->cfg.start_error, "not an mqgrad agent state file"), "%s",
              a->cfg.start_error);
    s_stop(&a);
    char *now = s_slurp(state);
    cr_assert_str_eq(now, garbage, "the corrupt file was changed");
    free(now);

    a = s_start("mqgrad", state, true);
    cr_assert_eq(a->cfg.start_status, 0, "%s", a->cfg.start_error);
    snprintf(pattern, sizeof pattern, "%s.corrupt-*", state);
    glob_t g;
    cr_assert_eq(glob(pattern, 0, NULL, &g), 0, "no %s", pattern);
    cr_assert_eq(g.gl_pathc, 1);
    now = s_slurp(g.gl_pathv[0]);
    cr_assert_str_eq(now, garbage);
    free(now);
    int bits[5];
    s_feed(a, 0, 5, bits);
    s_stop(&a);
    a = s_start("mqgrad", state, false); /* the fresh state is a good one */
    cr_assert_eq(a->cfg.start_status, 0, "%s", a->cfg.start_error);
    s_stop(&a);
    unlink(g.gl_pathv[0]);
    globfree(&g);
    unlink(state);
    rmdir(dir);
}

Test(agent, probe_exits_0_on_pong_and_1_without_answer, .timeout = 20)
{
    s_agent_t *a = s_start("fixed:3", "", false);
    char cmd[256], out[1024];
    snprintf(cmd, sizeof cmd, S_CLI " probe tcp://127.0.0.1:%d", a->port);
    cr_assert_eq(s_run(cmd, out, sizeof out), 0, "%s", out);
    s_stop(&a);
    snprintf(cmd, sizeof cmd, S_CLI " probe tcp://127.0.0.1:1 --timeout 300 2>&1");
    cr_assert_eq(s_run(cmd, out, sizeof out), 1);
    cr_assert(strstr(out, "no answer"), "%s", out);
    snprintf(cmd, sizeof cmd, S_CLI " bits --agent tcp://127.0.0.1:1 --timeout 300 2>&1");
    cr_assert_eq(s_run(cmd, out, sizeof out), 1);
    cr_assert(strstr(out, "no answer from tcp://127.0.0.1:1 within 300 ms"), "%s", out);
    snprintf(cmd, sizeof cmd, S_CLI " bits --timeout soon 2>&1");
    cr_assert_eq(s_run(cmd, out, sizeof out), 2, "a bad flag value is a usage error");
}

static int s_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Decision latency: OBSERVE -> DECISION round trips over loopback, with a state file (a
 * save after every fifth reply). Prints the median and the 99th percentile. */
Test(agent, decision_latency, .timeout = 60)
{
    char dir[64], state[128];
    s_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/agent.state", dir);
    s_agent_t *a = s_start("mqgrad", state, false);
    zsock_t *c = s_client(a->port);
    enum { N = 1000 };
    static double ms[N];
    for (uint64_t i = 0; i < N; i++) {
        int64_t t0 = mq_now_us();
        free(s_observe(c, i));
        ms[i] = (double)(mq_now_us() - t0) / 1000.0;
    }
    qsort(ms, N, sizeof ms[0], s_cmp_double);
    cr_log_info("OBSERVE->DECISION round trip over %d iterations: median %.3f ms, p99 %.3f "
                "ms, max %.3f ms",
                N, ms[N / 2], ms[N * 99 / 100], ms[N - 1]);
    fprintf(stderr, "decision latency: median %.3f ms, p99 %.3f ms, max %.3f ms (n=%d)\n",
            ms[N / 2], ms[N * 99 / 100], ms[N - 1], N);
    cr_assert_lt(ms[N / 2], 50.0, "median decision latency %.3f ms", ms[N / 2]);
    zsock_destroy(&c);
    s_stop(&a);
    unlink(state);
    rmdir(dir);
}

/* ---- the mqgrad-agent program --------------------------------------------------------- */

/* Starts ARGV (stdout and stderr into one pipe); returns the pid, *FD the pipe. */
static pid_t s_spawn(char *const argv[], int *fd)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    posix_spawn_file_actions_addclose(&fa, p[0]);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), 0, "spawn %s", argv[0]);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    *fd = p[0];
    return pid;
}

/* Reads FD into OUT until it holds UNTIL (NULL: end of file) or 10 s pass. */
static bool s_read_until(int fd, char *out, size_t cap, const char *until)
{
    size_t n = strlen(out);
    int64_t deadline = mq_now_us() + 10 * 1000000;
    while (mq_now_us() < deadline && n + 1 < cap) {
        if (until && strstr(out, until))
            return true;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, out + n, cap - 1 - n);
        if (r <= 0)
            return !until;
        n += (size_t)r;
        out[n] = '\0';
    }
    return until && strstr(out, until);
}

/* Runs the agent program to its end; returns the exit status, OUT its output. */
static int s_agent_exit(char *const argv[], char *out, size_t cap)
{
    int fd;
    pid_t pid = s_spawn(argv, &fd);
    out[0] = '\0';
    s_read_until(fd, out, cap, NULL);
    close(fd);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(agent, program_refuses_bad_flags_with_exit_2, .timeout = 30)
{
    cr_assert(access(S_AGENT, X_OK) == 0, "%s is not built", S_AGENT);
    char out[8192];
    char *help[] = {S_AGENT, "--help", NULL};
    cr_assert_eq(s_agent_exit(help, out, sizeof out), 0);
    cr_assert(strstr(out, "--epsilon"), "%s", out);
    char policies[2048];
    mq_policy_help(policies, sizeof policies);
    cr_assert(strstr(out, policies), "--help lacks the registry's policy list:\n%s", out);
    char *alpha[] = {S_AGENT, "--alpha", "abc", NULL};
    cr_assert_eq(s_agent_exit(alpha, out, sizeof out), 2);
    cr_assert(strstr(out, "--alpha"), "%s", out);
    char *policy[] = {S_AGENT, "--policy=bogus", NULL};
    cr_assert_eq(s_agent_exit(policy, out, sizeof out), 2);
    cr_assert(strstr(out, "bogus"), "%s", out);
    char *unknown[] = {S_AGENT, "--frobnicate", "1", NULL};
    cr_assert_eq(s_agent_exit(unknown, out, sizeof out), 2);
    cr_assert(strstr(out, "--frobnicate"), "%s", out);
    char *range[] = {S_AGENT, "--min-bits", "6", "--max-bits", "3", NULL};
    cr_assert_eq(s_agent_exit(range, out, sizeof out), 2);

    char dir[64], state[128];
    s_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/agent.state", dir);
    cr_assert_eq(mq_write_file_atomic(state, "MQAGENT", 7), 0);
    char *corrupt[] = {S_AGENT,  "--state",           state, "--http-port", "0",
                       "--bind", "tcp://127.0.0.1:*", NULL};
    cr_assert_eq(s_agent_exit(corrupt, out, sizeof out), 2, "%s", out);
    cr_assert(strstr(out, state) && strstr(out, "--fresh"), "%s", out);
    unlink(state);
    rmdir(dir);
}

Test(agent, program_serves_until_sigterm_then_exits_0, .timeout = 60)
{
    char dir[64], state[128], bind[64], out[8192] = "";
    s_tmpdir(dir, sizeof dir);
    snprintf(state, sizeof state, "%s/agent.state", dir);
    pid_t pid = -1;
    int fd = -1, port = 0;
    for (int attempt = 0; attempt < 5 && pid < 0; attempt++) {
        port = 20000 + (int)(mq_now_us() % 30000);
        snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", port);
        char *argv[] = {S_AGENT,   "--bind", bind,       "--http-port", "0",
                        "--state", state,    "--policy", "fixed:3",     NULL};
        pid = s_spawn(argv, &fd);
        out[0] = '\0';
        if (!s_read_until(fd, out, sizeof out, "agent ready:")) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            close(fd);
            pid = -1; /* port taken by someone else? try another */
        }
    }
    cr_assert(pid > 0, "the agent did not start: %s", out);
    cr_assert(strstr(out, "policy fixed:3") && strstr(out, state), "%s", out);
    zsock_t *c = s_client(port);
    cr_assert_eq(s_observe_bits(c, 0), 3);
    zsock_destroy(&c);
    kill(pid, SIGTERM);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    close(fd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    cr_assert_eq(access(state, R_OK), 0, "no state file after a clean stop");
    unlink(state);
    rmdir(dir);
}
