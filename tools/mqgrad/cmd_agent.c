/* mqgrad bits | status | policy: ask a running mqgrad-agent over ZeroMQ (QUERY and
 * POLICY_SET, answered by STATUS or ERROR). mqgrad probe: is any mqgrad service alive
 * (PING → PONG)? Each request is one DEALER round trip with a deadline. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "cli.h"
#include "mqgrad/service.h"

typedef struct {
    char agent[256];
    bool json;
    long timeout_ms;
    char *pos[2];
    int npos;
    mq_sec_config_t sec;
    mq_key_role_t service; /* probe: the role of the service asked (its key) */
} s_opts_t;

/* Parses the flags every request takes (one table, mqgrad/service.h: --agent, --json where
 * JSON_OK, --timeout, the keys, --service for probe) and up to MAX_POS positionals. Returns
 * 0, 1 after printing USAGE and the flags for --help, or 2 after a message on bad usage. */
static int s_parse(int argc, char **argv, s_opts_t *o, int max_pos, bool json_ok, const char *usage)
{
    memset(o, 0, sizeof *o);
    snprintf(o->agent, sizeof o->agent, "%s", MQ_AGENT_DEFAULT_ENDPOINT);
    o->timeout_ms = 2000;
    o->service = MQ_KEY_AGENT;
    char service[16] = "agent", cmd[32], text[2300];
    snprintf(cmd, sizeof cmd, "mqgrad %s", argv[0]);
    snprintf(text, sizeof text, "usage: %s\nKeys: SECURITY.md; without --key, "
             "KEYS/operator.key_secret, else a throw-away key that only an --open-query agent "
             "answers.", usage);
    /* probe (no JSON) asks any service at its positional endpoint: --service, no --agent */
    bool probe = !json_ok;
    const mq_flag_t sec[] = {MQ_SEC_FLAGS(&o->sec)};
    mq_flag_t flags[8];
    int n = 0;
    if (!probe)
        flags[n++] = (mq_flag_t){"agent", "MQGRAD_AGENT", MQ_FLAG_STR, o->agent,
                                 sizeof o->agent, 1, 0, "the agent's ZeroMQ endpoint"};
    flags[n++] = (mq_flag_t){"timeout", NULL, MQ_FLAG_LONG, &o->timeout_ms, 0, 1, 3600000,
                             "milliseconds to wait for the answer"};
    for (size_t i = 0; i < sizeof sec / sizeof sec[0]; i++)
        flags[n++] = sec[i];
    if (!probe)
        flags[n++] = (mq_flag_t){"json", NULL, MQ_FLAG_BOOL, &o->json, 0, 0, 0,
                                 "the answer as JSON"};
    else
        flags[n++] = (mq_flag_t){"service", NULL, MQ_FLAG_STR, service, sizeof service, 1, 0,
                                 "the role of the service asked: agent | scheduler | server"};
    flags[n] = (mq_flag_t){0};
    char *args[argc + 1];
    memcpy(args, argv, sizeof(char *) * (size_t)argc);
    args[0] = cmd;
    args[argc] = NULL;
    int rc = mq_flags_parse(flags, argc, args, text, o->pos, max_pos, &o->npos);
    if (rc != 0)
        return rc;
    o->service = strcmp(service, "agent") == 0       ? MQ_KEY_AGENT
                 : strcmp(service, "scheduler") == 0 ? MQ_KEY_SCHEDULER
                 : strcmp(service, "server") == 0    ? MQ_KEY_SERVER
                                                     : MQ_KEY_NONE;
    if (o->service == MQ_KEY_NONE) {
        fprintf(stderr, "%s: --service '%s': agent, scheduler or server\n", cmd, service);
        return 2;
    }
    if (mq_sec_config_check(&o->sec, NULL) != 0) {
        fprintf(stderr, "%s: %s\n", cmd, mq_err_last());
        return 2;
    }
    return 0;
}

/* One request/reply with the service of O at ENDPOINT within O's timeout. Returns 0 with
 * REPLY filled (an ERROR reply included), or -1 with an error. */
static int s_request(const s_opts_t *o, const char *endpoint, mq_msg_type_t type,
                     const char *text, mq_msg_t *reply)
{
    long timeout_ms = o->timeout_ms;
    mq_sec_t *sec = mq_sec_open(&o->sec, MQ_KEY_OPERATOR);
    if (!sec)
        return -1;
    zsock_t *sock = zsock_new(ZMQ_DEALER);
    if (!sock || mq_sec_client(sec, sock, o->service) != 0) {
        if (!sock)
            mq_err_set("cannot create a socket");
        zsock_destroy(&sock);
        mq_sec_close(&sec);
        return -1;
    }
    mq_wire_prepare(sock, 0, MQ_WIRE_MAX_CONTROL_MSG);
    zsock_set_rcvtimeo(sock, (int)timeout_ms);
    zsock_set_sndtimeo(sock, (int)timeout_ms);
    int rc = -1;
    if (zsock_connect(sock, "%s", endpoint) != 0) {
        mq_err_set("'%s' is not a valid endpoint (expected e.g. tcp://host:7200)", endpoint);
        goto done;
    }
    mq_msg_init(reply, type);
    if (text) /* a POLICY_SET's policy */
        snprintf(reply->policy_set.policy, sizeof reply->policy_set.policy, "%s", text);
    /* A request no connection took within the timeout (EAGAIN) is answered as one that got
     * no reply: with a refused handshake (wrong or missing keys) either can happen, depending
     * on timing, and both mean the same to the user. */
    errno = 0;
    if (mq_wire_send(sock, reply, NULL, 0) != 0) {
        if (errno == EAGAIN)
            goto no_answer;
        goto done;
    }
    int64_t deadline = mq_now_us() + timeout_ms * 1000;
    mq_drop_t drop;
    while (mq_now_us() < deadline) {
        if (mq_wire_recv(sock, reply, &drop) == 0) {
            rc = 0;
            goto done;
        }
        if (drop == MQ_DROP_NONE)
            break; /* timed out (or interrupted) */
    }
no_answer:
    mq_err_set("no answer from %s within %ld ms (is the service running there%s?)", endpoint,
               timeout_ms,
               mq_sec_enabled(sec) ? ", and are these its cluster's keys" : ", without keys");
done:
    zsock_destroy(&sock);
    mq_sec_close(&sec);
    return rc;
}

/* Asks the agent; on success REPLY is a STATUS. Prints the reason and returns 1 if not. */
static int s_ask(const s_opts_t *o, const char *cmd, mq_msg_type_t type, const char *text,
                 mq_msg_t *reply)
{
    if (s_request(o, o->agent, type, text, reply) != 0) {
        fprintf(stderr, "mqgrad %s: %s\n", cmd, mq_err_last());
        return 1;
    }
    if (reply->type == MQ_MSG_ERROR) {
        fprintf(stderr, "mqgrad %s: the agent answered: %s\n", cmd, reply->error.reason);
        return 1;
    }
    if (reply->type != MQ_MSG_STATUS) {
        fprintf(stderr, "mqgrad %s: unexpected %s reply from %s\n", cmd,
                mq_msg_type_name(reply->type), o->agent);
        return 1;
    }
    return 0;
}

static void s_print_json(const mq_status_msg_t *st)
{
    char buf[4096];
    mq_agent_status_json(st, buf, sizeof buf);
    printf("%s\n", buf);
}

static void s_print_status(const mq_status_msg_t *st)
{
    printf("policy        %s\n", st->policy);
    printf("bits          %u\n", st->bits);
    if (st->n_widths) { /* a per-tensor policy: each tensor's level, in the layout's order */
        printf("per tensor   ");
        for (uint32_t t = 0; t < st->n_widths; t++)
            printf("%s%u", t ? "," : " ", st->widths[t]);
        printf("\n");
    }
    printf("MDP step      %llu\n", (unsigned long long)st->step);
    printf("iteration     %llu\n", (unsigned long long)st->iter);
    if (isnan(st->last_reward))
        printf("last reward   none yet\n");
    else
        printf("last reward   %.6g\n", st->last_reward);
    printf("observations  %llu\n", (unsigned long long)st->observations);
    printf("decisions     %llu\n", (unsigned long long)st->decisions);
    printf("fallbacks     %llu\n", (unsigned long long)st->fallbacks);
    bool any = false;
    for (uint32_t i = 0; i < st->n_q_values; i++)
        any |= !isnan(st->q_values[i]);
    if (!any) {
        printf("Q-values      none (no Q-function in this policy, or no decision yet)\n");
        return;
    }
    printf("Q-values\n");
    for (uint32_t i = 0; i < st->n_q_values; i++) {
        uint32_t b = st->min_bits + i;
        printf("  %u bits  %12.6g%s\n", b, st->q_values[i], b == st->bits ? "   <- current" : "");
    }
}

static void s_print_bits(const mq_status_msg_t *st)
{
    printf("%u\n", st->bits);
}

/* bits and status: one QUERY, printed as JSON with --json, else by PRINT. */
static int s_query(int argc, char **argv, const char *what, const char *usage,
                   void (*print)(const mq_status_msg_t *))
{
    s_opts_t o;
    int rc = s_parse(argc, argv, &o, 0, true, usage);
    if (rc)
        return rc == 1 ? 0 : rc;
    mq_msg_t *m = calloc(1, sizeof *m);
    if (!m || s_ask(&o, what, MQ_MSG_QUERY, NULL, m) != 0) {
        free(m);
        return 1;
    }
    if (o.json)
        s_print_json(&m->status);
    else
        print(&m->status);
    mq_msg_reset(m);
    free(m);
    return 0;
}

int mq_cmd_bits(int argc, char **argv)
{
    return s_query(argc, argv, "bits",
                   "mqgrad bits [--agent ENDPOINT] [--json] [--timeout MS]\n"
                   "Prints the agent's current bit-width (MQGRAD_AGENT, default " MQ_AGENT_DEFAULT_ENDPOINT
                   ").",
                   s_print_bits);
}

int mq_cmd_status(int argc, char **argv)
{
    return s_query(argc, argv, "status",
                   "mqgrad status [--agent ENDPOINT] [--json] [--timeout MS]\n"
                   "Shows the agent's policy, bits, MDP step, iteration, last reward, "
                   "Q-values.",
                   s_print_status);
}

int mq_cmd_policy(int argc, char **argv)
{
    static const char *head =
        "mqgrad policy set SPEC [--agent ENDPOINT] [--json] [--timeout MS]\n"
        "       mqgrad policy get [--agent ENDPOINT] [--timeout MS]\n"
        "SPEC: a policy below, optionally :key=value,...; swapping back to the mqgrad spec\n"
        "last swapped away from resumes its learned state.\n\npolicies:\n";
    char usage[2048];
    snprintf(usage, sizeof usage, "%s", head);
    mq_policy_help(usage + strlen(usage), sizeof usage - strlen(usage));
    s_opts_t o;
    int rc = s_parse(argc, argv, &o, 2, true, usage);
    if (rc)
        return rc == 1 ? 0 : rc;
    bool set = o.npos == 2 && strcmp(o.pos[0], "set") == 0;
    bool get = o.npos == 1 && strcmp(o.pos[0], "get") == 0;
    if (!set && !get) {
        fprintf(stderr, "mqgrad policy: expected 'set SPEC' or 'get'\nusage: %s\n", usage);
        return 2;
    }
    mq_msg_t *m = calloc(1, sizeof *m);
    if (!m || s_ask(&o, set ? "policy set" : "policy get", set ? MQ_MSG_POLICY_SET : MQ_MSG_QUERY,
                    set ? o.pos[1] : NULL, m) != 0) {
        free(m);
        return 1;
    }
    if (get && !o.json)
        printf("%s\n", m->status.policy);
    else if (o.json)
        s_print_json(&m->status);
    else
        s_print_status(&m->status);
    mq_msg_reset(m);
    free(m);
    return 0;
}

int mq_cmd_probe(int argc, char **argv)
{
    static const char *usage = "mqgrad probe ENDPOINT [--service agent|scheduler|server] "
                               "[--timeout MS]\n"
                               "Exit 0 if the mqgrad service at ENDPOINT (an agent unless "
                               "--service says) answers PING within the timeout (2000 ms), "
                               "else 1.";
    s_opts_t o;
    int rc = s_parse(argc, argv, &o, 1, false, usage);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (o.npos != 1) {
        fprintf(stderr, "mqgrad probe: which endpoint? (e.g. tcp://127.0.0.1:7200)\nusage: %s\n",
                usage);
        return 2;
    }
    mq_msg_t *m = calloc(1, sizeof *m);
    int64_t t0 = mq_now_us();
    if (!m || s_request(&o, o.pos[0], MQ_MSG_PING, NULL, m) != 0) {
        fprintf(stderr, "mqgrad probe: %s\n", m ? mq_err_last() : "out of memory");
        free(m);
        return 1;
    }
    rc = m->type == MQ_MSG_PONG ? 0 : 1;
    if (rc == 0)
        printf("%s: pong in %.2f ms\n", o.pos[0], (double)(mq_now_us() - t0) / 1000.0);
    else
        fprintf(stderr, "mqgrad probe: %s answered %s, not pong\n", o.pos[0],
                mq_msg_type_name(m->type));
    mq_msg_reset(m);
    free(m);
    return rc;
}
