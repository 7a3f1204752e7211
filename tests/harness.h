/* A whole cluster in one test process: the real scheduler, server and worker actors over
 * TCP loopback, with helpers to start, wait for and stop them. Shared by the cluster tests. */
#ifndef MQGRAD_TEST_HARNESS_H
#define MQGRAD_TEST_HARNESS_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas_as_programs.h"
#include "local_run.h"
#include "mqgrad/util.h"
#include "scheduler.h"
#include "sec_test.h"
#include "server.h"
#include "mqgrad/worker.h"

#define MAXN 4

typedef struct {
    mq_scheduler_config_t scfg;
    mq_server_config_t svcfg[MAXN];
    mq_worker_config_t wcfg[MAXN];
    zactor_t *sched, *servers[MAXN], *workers[MAXN];
    mq_metrics_t *sched_metrics; /* the scheduler's registry, what its /metrics would serve */
    int W, S;
    char dir[256];
    char endpoint[64];
} cluster_t;

static inline int s_argc(char **argv)
{
    int n = 0;
    while (argv[n])
        n++;
    return n;
}

/* Starts the scheduler with EXTRA flags (NULL-terminated) for W workers and S servers,
 * which the caller starts. */
static inline void cluster_start_sched(cluster_t *c, int W, int S, const char *name, char **extra)
{
    memset(c, 0, sizeof *c);
    test_keys();
    c->W = W;
    c->S = S;
    snprintf(c->dir, sizeof c->dir, "/tmp/mqgrad-test-%d-%s", (int)getpid(), name);
    /* A directory left by an earlier process with the same pid must not be read as ours. */
    cr_assert(test_rmtree(c->dir), "cannot remove %s", c->dir);
    char w[8], s[8], rd[300];
    snprintf(w, sizeof w, "%d", W);
    snprintf(s, sizeof s, "%d", S);
    snprintf(rd, sizeof rd, "%s/run", c->dir);
    char *argv[64] = {"scheduler", "--bind", "tcp://127.0.0.1:*", "--workers", w, "--servers", s,
                      "--run-dir", rd, "--progress-every", "0", "--start-timeout", "60"};
    int n = s_argc(argv);
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    cr_assert_eq(mq_scheduler_config_parse(&c->scfg, n, argv), 0);
    c->sched_metrics = mq_metrics_new("scheduler");
    c->scfg.metrics = c->sched_metrics;
    c->sched = zactor_new(mq_scheduler_actor, &c->scfg);
    zstr_send(c->sched, "PORT");
    char *port = zstr_recv(c->sched);
    snprintf(c->endpoint, sizeof c->endpoint, "tcp://127.0.0.1:%s", port);
    zstr_free(&port);
}

/* Starts the scheduler with EXTRA flags (NULL-terminated) and S servers; workers later. */
static inline void cluster_start_core(cluster_t *c, int W, int S, const char *name, char **extra)
{
    cluster_start_sched(c, W, S, name, extra);
    for (int i = 0; i < S; i++) {
        char dump[300], shard[8];
        snprintf(dump, sizeof dump, "%s/server-%d.bin", c->dir, i);
        snprintf(shard, sizeof shard, "%d", i);
        /* Server I asks for shard I, so server-I.bin is shard I's master copy: without it
         * the shards go in registration order, which a loaded machine may swap. */
        char *sargv[] = {"server", "--scheduler", c->endpoint, "--bind", "tcp://127.0.0.1:*",
                         "--shard", shard, NULL};
        cr_assert_eq(mq_server_config_parse(&c->svcfg[i], s_argc(sargv), sargv), 0);
        snprintf(c->svcfg[i].dump, sizeof c->svcfg[i].dump, "%s", dump);
        c->servers[i] = zactor_new(mq_server_actor, &c->svcfg[i]);
    }
}

/* The endpoint server I of C listens on. */
static inline void cluster_server_endpoint(cluster_t *c, int i, char *buf, size_t len)
{
    zstr_send(c->servers[i], "PORT");
    char *port = zstr_recv(c->servers[i]);
    snprintf(buf, len, "tcp://127.0.0.1:%s", port);
    zstr_free(&port);
}

/* The id of the run in RUN (its start event in events.jsonl). */
static inline uint64_t cluster_run_id(const char *run)
{
    char path[400], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/events.jsonl", run);
    cr_assert_eq(mq_read_file(path, &text, &len), 0, "%s", mq_err_last());
    const char *p = strstr(text, "\"run_id\":\"");
    cr_assert_not_null(p, "no run id in %s", path);
    uint64_t id = strtoull(p + 10, NULL, 16);
    free(text);
    return id;
}

static inline void cluster_start_workers(cluster_t *c)
{
    for (int i = 0; i < c->W; i++) {
        char *wargv[] = {"worker", "--scheduler", c->endpoint, "--threads", "1", NULL};
        cr_assert_eq(mq_worker_config_parse(&c->wcfg[i], s_argc(wargv), wargv), 0);
        snprintf(c->wcfg[i].dump, sizeof c->wcfg[i].dump, "%s/worker-%d.bin", c->dir, i);
        c->workers[i] = zactor_new(mq_worker_actor, &c->wcfg[i]);
    }
}

/* Waits for an actor's "DONE <code>"; returns the code or -1 on timeout. */
static inline int s_wait_done(zactor_t *a, int timeout_ms)
{
    zpoller_t *p = zpoller_new(zactor_sock(a), NULL);
    int code = -1;
    int64_t end = zclock_mono() + timeout_ms;
    while (code < 0 && zclock_mono() < end) {
        void *which = zpoller_wait(p, 100);
        if (!which)
            continue;
        char *msg = zstr_recv(which);
        if (msg && strncmp(msg, "DONE ", 5) == 0)
            code = atoi(msg + 5);
        zstr_free(&msg);
    }
    zpoller_destroy(&p);
    return code;
}

static inline int cluster_wait(cluster_t *c, int timeout_s)
{
    int code = s_wait_done(c->sched, timeout_s * 1000);
    for (int i = 0; i < c->S; i++)
        cr_expect_eq(s_wait_done(c->servers[i], 10000), 0, "server %d did not stop cleanly", i);
    for (int i = 0; i < c->W; i++)
        cr_expect_eq(s_wait_done(c->workers[i], 10000), 0, "worker %d did not stop cleanly", i);
    return code;
}

/* A worker played by the test (an insider, or a worker wedged behind a live heartbeat): a
 * DEALER with the workers' key that registers at ENDPOINT as INCARNATION and takes the
 * WELCOME (its rank, the run's id, its token, the servers) into *WELCOME. */
static inline zsock_t *test_stand_in(const char *endpoint, uint64_t incarnation,
                                     mq_msg_t *welcome)
{
    zsock_t *s = zsock_new(ZMQ_DEALER);
    cr_assert_not_null(s);
    mq_wire_prepare(s, 0, MQ_WIRE_MAX_MSG);
    zsock_set_rcvtimeo(s, 200);
    test_sec_client(s, "worker", MQ_KEY_SCHEDULER);
    cr_assert_eq(zsock_connect(s, "%s", endpoint), 0);
    static mq_msg_t m;
    mq_msg_init(&m, MQ_MSG_REGISTER);
    m.role = MQ_ROLE_WORKER;
    m.incarnation = incarnation;
    cr_assert_eq(mq_wire_send(s, &m, NULL, 0), 0);
    memset(welcome, 0, sizeof *welcome);
    mq_drop_t drop;
    for (int i = 0; i < 100 && welcome->type != MQ_MSG_WELCOME; i++)
        mq_wire_recv(s, welcome, &drop);
    cr_assert_eq(welcome->type, MQ_MSG_WELCOME, "the stand-in worker was not welcomed");
    return s;
}

/* MSG as the stand-in's message of TYPE: its role, rank, incarnation, run id and token. */
static inline void test_stand_in_msg(mq_msg_t *msg, mq_msg_type_t type, const mq_msg_t *welcome,
                                     uint64_t incarnation)
{
    mq_msg_init(msg, type);
    msg->role = MQ_ROLE_WORKER;
    msg->rank = welcome->welcome.rank;
    msg->incarnation = incarnation;
    msg->run_id = welcome->run_id;
    msg->has_token = welcome->welcome.has_token;
    memcpy(msg->token, welcome->welcome.token, MQ_TOKEN_LEN);
    msg->term = welcome->welcome.term;
}

static inline void cluster_stop(cluster_t *c)
{
    for (int i = 0; i < c->W; i++)
        zactor_destroy(&c->workers[i]);
    for (int i = 0; i < c->S; i++)
        zactor_destroy(&c->servers[i]);
    zactor_destroy(&c->sched);
    mq_metrics_destroy(&c->sched_metrics);
}

static inline float *s_read_floats(const char *path, size_t *n)
{
    char *data;
    size_t len;
    cr_assert_eq(mq_read_file(path, &data, &len), 0, "%s", mq_err_last());
    *n = len / sizeof(float);
    return (float *)data;
}

/* Rows in RUN_DIR/metrics.csv so far (header not counted; -1 if there is none yet). */
static inline int mq_test_rows(const char *run_dir)
{
    char path[512], line[1024];
    snprintf(path, sizeof path, "%s/metrics.csv", run_dir);
    FILE *f = fopen(path, "r");
    int n = -1;
    while (f && fgets(line, sizeof line, f))
        n++;
    if (f)
        fclose(f);
    return n;
}

/* Waits (at most TIMEOUT_S) until RUN_DIR/metrics.csv has ROWS rows; fails the test if not. */
static inline void mq_test_wait_rows(const char *run_dir, int rows, int timeout_s)
{
    for (int i = 0; i < timeout_s * 20 && mq_test_rows(run_dir) < rows; i++)
        zclock_sleep(50);
    cr_assert_geq(mq_test_rows(run_dir), rows, "%s: the run stalled before iteration %d",
                  run_dir, rows);
}

#endif
