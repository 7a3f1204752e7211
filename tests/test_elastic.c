/* Failures and elasticity with real processes over TCP: the scheduler, the servers and the
 * workers are the installed executables, and workers are killed with SIGKILL (or stopped
 * with SIGTERM) while the run trains. Each test asserts what a user sees: the run's status,
 * its iteration count and accuracy against an undisturbed run of the same seed, the
 * membership events, and that every replica left equals the servers' master copies. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"

#define S_BIN MQ_TEST_BIN_DIR "/services/mqgrad-"
#define S_ITERS 400
#define S_MAXW 8

typedef struct {
    char dir[256], run[300], endpoint[64], ckpt[300];
    pid_t sched, servers[2], workers[S_MAXW];
    int nworkers; /* started so far */
    int port, W;
    char **extra;
} s_job_t;

static int s_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts S_BIN<NAME> with ARGV (NULL-terminated, argv[0] included), output to LOG, with the
 * tests' cluster keys (MQGRAD_KEYS). */
static pid_t s_spawn(const char *name, char **argv, const char *log)
{
    test_keys();
    char exe[512];
    snprintf(exe, sizeof exe, "%s%s", S_BIN, name);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(exe, argv);
        _exit(127);
    }
    return pid;
}

static void s_start_worker(s_job_t *j)
{
    cr_assert_lt(j->nworkers, S_MAXW);
    char dump[320], log[320];
    snprintf(dump, sizeof dump, "%s/worker-%d.bin", j->dir, j->nworkers);
    snprintf(log, sizeof log, "%s/worker-%d.log", j->dir, j->nworkers);
    char *argv[] = {"mqgrad-worker", "--scheduler", j->endpoint, "--threads", "1", "--dump", dump,
                    NULL};
    j->workers[j->nworkers++] = s_spawn("worker", argv, log);
}

/* The scheduler: the small model, 4 bits, no agent, S_ITERS iterations, a 2 s heartbeat
 * timeout, a checkpoint every 50 iterations, the job's extra flags (and --resume). */
static void s_start_scheduler(s_job_t *j, bool resume)
{
    char bind[64], w[8], iters[16], log[320];
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", j->port);
    snprintf(w, sizeof w, "%d", j->W);
    snprintf(iters, sizeof iters, "%d", S_ITERS);
    snprintf(log, sizeof log, "%s/scheduler.log", j->dir);
    char *argv[48] = {"mqgrad-scheduler", "--bind", bind, "--workers", w, "--servers", "2",
                      "--model", "small", "--iterations", iters, "--bits", "4",
                      "--eval-every", "0", "--final-eval-limit", "0", "--seed", "7",
                      "--heartbeat-timeout", "2", "--checkpoint-every", "50",
                      "--run-dir", j->run, "--progress-every", "0"};
    int n = 0;
    while (argv[n])
        n++;
    for (int i = 0; j->extra && j->extra[i]; i++)
        argv[n++] = j->extra[i];
    if (resume)
        argv[n++] = "--resume";
    argv[n] = NULL;
    j->sched = s_spawn("scheduler", argv, log);
}

/* Server S (0 or 1), with the job's checkpoint directory. */
static void s_start_server(s_job_t *j, int s)
{
    char dump[320], log[320];
    snprintf(dump, sizeof dump, "%s/server-%d.bin", j->dir, s);
    snprintf(log, sizeof log, "%s/server-%d.log", j->dir, s);
    char *sargv[] = {"mqgrad-server", "--scheduler", j->endpoint, "--bind", "tcp://127.0.0.1:*",
                     "--dump", dump, "--checkpoint-dir", j->ckpt, NULL};
    j->servers[s] = s_spawn("server", sargv, log);
}

/* A job's directories and port, nothing started (EXTRA: the scheduler's extra flags). */
static void s_prepare(s_job_t *j, const char *name, int W, char **extra)
{
    memset(j, 0, sizeof *j);
    snprintf(j->dir, sizeof j->dir, "/tmp/mqgrad-elastic-%d-%s", (int)getpid(), name);
    snprintf(j->run, sizeof j->run, "%s/run", j->dir);
    snprintf(j->ckpt, sizeof j->ckpt, "%s/checkpoints", j->dir);
    cr_assert_eq(mq_mkdirs(j->dir), 0);
    j->port = s_free_port();
    j->W = W;
    j->extra = extra;
    snprintf(j->endpoint, sizeof j->endpoint, "tcp://127.0.0.1:%d", j->port);
}

/* The end of a test that got this far: its files go (about 1.5 MB a job). A failed assertion
 * ends a test before this and leaves them for a look; a failed expectation has said what it
 * saw. */
static void s_done(const char *dir)
{
    cr_assert(test_rmtree(dir), "cannot remove %s", dir);
}

/* The scheduler, two servers and the job's W workers. */
static void s_launch(s_job_t *j)
{
    s_start_scheduler(j, false);
    for (int s = 0; s < 2; s++)
        s_start_server(j, s);
    for (int i = 0; i < j->W; i++)
        s_start_worker(j);
}

static void s_start(s_job_t *j, const char *name, int W, char **extra)
{
    s_prepare(j, name, W, extra);
    s_launch(j);
}

/* Waits at most TIMEOUT_S for PID; returns its exit code (128 + signal), or -1 on timeout. */
static int s_wait(pid_t pid, int timeout_s)
{
    for (int i = 0; i < timeout_s * 20; i++) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        zclock_sleep(50);
    }
    return -1;
}

/* Waits for the scheduler's end (it must come), then for every node's. */
static int s_finish(s_job_t *j, int timeout_s)
{
    int code = s_wait(j->sched, timeout_s);
    if (code < 0)
        kill(j->sched, SIGKILL);
    for (int s = 0; s < 2; s++)
        if (s_wait(j->servers[s], 20) < 0)
            kill(j->servers[s], SIGKILL);
    for (int i = 0; i < j->nworkers; i++)
        if (j->workers[i] > 0 && s_wait(j->workers[i], 20) < 0)
            kill(j->workers[i], SIGKILL);
    return code;
}

static void s_kill(s_job_t *j, int i, int sig)
{
    cr_assert_gt(j->workers[i], 0);
    cr_assert_eq(kill(j->workers[i], sig), 0);
    if (sig == SIGKILL) {
        waitpid(j->workers[i], NULL, 0);
        j->workers[i] = -1; /* it leaves no dump */
    }
}

static char *s_slurp(const char *dir, const char *name, size_t *len)
{
    char path[512], *data;
    size_t n;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (mq_read_file(path, &data, &n) != 0)
        return NULL;
    if (len)
        *len = n;
    return data;
}

static double s_summary_num(const s_job_t *j, const char *key)
{
    char *text = s_slurp(j->run, "summary.json", NULL);
    cr_assert_not_null(text, "no summary.json in %s", j->run);
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(text, pat);
    cr_assert_not_null(p, "no %s in the summary", key);
    double v = strtod(p + strlen(pat), NULL);
    free(text);
    return v;
}

static bool s_summary_has(const s_job_t *j, const char *text)
{
    char *s = s_slurp(j->run, "summary.json", NULL);
    cr_assert_not_null(s);
    bool has = strstr(s, text) != NULL;
    free(s);
    return has;
}

/* Occurrences of "event":"NAME" in events.jsonl. */
static int s_events(const s_job_t *j, const char *name)
{
    char *text = s_slurp(j->run, "events.jsonl", NULL);
    cr_assert_not_null(text);
    char pat[64];
    snprintf(pat, sizeof pat, "\"event\":\"%s\"", name);
    int n = 0;
    for (const char *p = text; (p = strstr(p, pat)); p++)
        n++;
    free(text);
    return n;
}

/* Waits at most TIMEOUT_S for the run's first event NAME; whether it came. */
static bool s_wait_event(const s_job_t *j, const char *name, int timeout_s)
{
    for (int i = 0; i < timeout_s * 20 && s_events(j, name) == 0; i++)
        zclock_sleep(50);
    return s_events(j, name) > 0;
}

/* The values of metrics.csv's column NAME, one per row, in a new array of *N. */
static double *s_values(const s_job_t *j, const char *name, int *n)
{
    char *text = s_slurp(j->run, "metrics.csv", NULL);
    cr_assert_not_null(text);
    char *save, *line = strtok_r(text, "\n", &save);
    int col = -1, k = 0;
    for (char *p = line, *end; p; p = end ? end + 1 : NULL, k++) {
        end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == strlen(name) && strncmp(p, name, len) == 0)
            col = k;
    }
    cr_assert_geq(col, 0, "no column %s", name);
    double *v = calloc(S_ITERS * 2 + 16, sizeof *v);
    *n = 0;
    while ((line = strtok_r(NULL, "\n", &save)) && *n < S_ITERS * 2 + 16) {
        const char *p = line;
        for (int c = 0; c < col && p; c++)
            if ((p = strchr(p, ',')))
                p++;
        v[(*n)++] = p ? atof(p) : 0;
    }
    free(text);
    return v;
}

/* Whether some row of metrics.csv has W in its workers column. */
static bool s_saw_workers(const s_job_t *j, int w)
{
    int n;
    double *v = s_values(j, "workers", &n);
    bool saw = false;
    for (int i = 0; i < n; i++)
        saw |= v[i] == w;
    free(v);
    return saw;
}

/* Every replica a live worker left equals every other and the servers' master shards put
 * together (shard 0 first; either server may hold it). Returns how many replicas there were. */
static int s_replicas_agree(const s_job_t *j)
{
    size_t l0 = 0, l1 = 0;
    char *s0 = s_slurp(j->dir, "server-0.bin", &l0), *s1 = s_slurp(j->dir, "server-1.bin", &l1);
    cr_assert(s0 && s1, "a server left no master copy");
    int replicas = 0;
    for (int i = 0; i < j->nworkers; i++) {
        if (j->workers[i] < 0)
            continue;
        char name[32];
        size_t len;
        snprintf(name, sizeof name, "worker-%d.bin", i);
        char *w = s_slurp(j->dir, name, &len);
        cr_assert_not_null(w, "worker %d left no replica", i);
        cr_assert_eq(len, l0 + l1, "worker %d: a replica of %zu bytes, the shards hold %zu", i,
                     len, l0 + l1);
        bool order01 = memcmp(w, s0, l0) == 0 && memcmp(w + l0, s1, l1) == 0;
        bool order10 = memcmp(w, s1, l1) == 0 && memcmp(w + l1, s0, l0) == 0;
        cr_assert(order01 || order10, "worker %d's replica differs from the master copies", i);
        free(w);
        replicas++;
    }
    free(s0);
    free(s1);
    return replicas;
}

/* The undisturbed run's accuracy, once per test program. */
static double s_calm_acc(void)
{
    static double acc = -1;
    if (acc >= 0)
        return acc;
    s_job_t j;
    s_start(&j, "calm", 4, NULL);
    cr_assert_eq(s_finish(&j, 240), 0, "the undisturbed run failed (see %s)", j.dir);
    acc = s_summary_num(&j, "final_test_acc");
    cr_log_info("undisturbed: %.2f%%", acc * 100);
    s_done(j.dir);
    return acc;
}

Test(elastic, sigkill_workers_mid_run_and_a_late_join, .timeout = 600)
{
    double calm = s_calm_acc();
    s_job_t j;
    s_start(&j, "kill", 4, NULL);
    /* Seeded: which workers die is the same every run. */
    mq_rng_t rng;
    mq_rng_seed(&rng, 13);
    int first = (int)mq_rng_below(&rng, 4);
    mq_test_wait_rows(j.run, 80, 120);
    s_kill(&j, first, SIGKILL);
    mq_test_wait_rows(j.run, 160, 120);
    int a = (first + 1) % 4, b = (first + 2) % 4; /* two at once */
    s_kill(&j, a, SIGKILL);
    s_kill(&j, b, SIGKILL);
    mq_test_wait_rows(j.run, 220, 120);
    s_start_worker(&j); /* a new worker joins the running job */
    cr_assert_eq(s_finish(&j, 300), 0, "the run did not complete (see %s)", j.dir);

    cr_expect(s_summary_has(&j, "\"status\": \"completed\""));
    cr_expect_eq(s_summary_num(&j, "iterations"), S_ITERS);
    double acc = s_summary_num(&j, "final_test_acc");
    cr_log_info("three workers killed, one joined: %.2f%% (undisturbed %.2f%%)", acc * 100,
                calm * 100);
    cr_expect_gt(acc, 0.60, "the disturbed run learned nothing: %.3f", acc);
    /* It trains on about 60 % of the undisturbed run's examples (one worker alone for some
     * 90 iterations), on the steep part of the small model's curve: a clean CI run measured
     * 5.4 points below (0.731 vs 0.785); 8 points leaves room for where the kills land. */
    cr_expect_geq(acc, calm - 0.08, "%.3f is more than 8 points below the undisturbed %.3f",
                  acc, calm);
    cr_expect_eq(s_events(&j, "worker_lost"), 3);
    cr_expect_eq(s_events(&j, "worker_joined"), 1);
    cr_expect(s_saw_workers(&j, 4) && s_saw_workers(&j, 3) && s_saw_workers(&j, 1) &&
                  s_saw_workers(&j, 2),
              "metrics.csv's workers column does not show 4, 3, 1 and 2 workers");
    cr_expect_eq(s_replicas_agree(&j), 2, "the survivor and the joiner must both hold replicas");
    s_done(j.dir);
}

Test(elastic, sigterm_leaves_at_once, .timeout = 300)
{
    s_job_t j;
    char *extra[] = {"--heartbeat-timeout", "60", NULL}; /* the leave, not the silence */
    s_start(&j, "term", 3, extra);
    mq_test_wait_rows(j.run, 60, 120);
    double t0 = mq_now_s();
    s_kill(&j, 1, SIGTERM);
    cr_assert_eq(s_wait(j.workers[1], 30), 0, "a stopped worker exits 0");
    j.workers[1] = -1;
    int rows = mq_test_rows(j.run);
    mq_test_wait_rows(j.run, rows + 20, 30); /* the run goes on, well before 60 s */
    cr_expect_lt(mq_now_s() - t0, 50);
    cr_assert_eq(s_finish(&j, 300), 0);
    char *events = s_slurp(j.run, "events.jsonl", NULL);
    cr_expect_not_null(strstr(events, "\"reason\":\"it left (stopped)\""), "%s", events);
    free(events);
    cr_expect_eq(s_replicas_agree(&j), 2);
    s_done(j.dir);
}

Test(elastic, below_min_workers_the_run_pauses_then_resumes, .timeout = 300)
{
    s_job_t j;
    char *extra[] = {"--min-workers", "2", NULL};
    s_start(&j, "pause", 2, extra);
    mq_test_wait_rows(j.run, 50, 120);
    s_kill(&j, 0, SIGKILL);
    cr_assert(s_wait_event(&j, "pause", 10), "one worker of two left: the run must pause");
    int rows = mq_test_rows(j.run);
    zclock_sleep(1500);
    cr_expect_eq(mq_test_rows(j.run), rows, "a paused run must not train");
    s_start_worker(&j);
    cr_assert_eq(s_finish(&j, 300), 0, "the run did not resume and complete");
    cr_expect_eq(s_events(&j, "resume"), 1);
    cr_expect_eq(s_summary_num(&j, "iterations"), S_ITERS);
    cr_expect_eq(s_replicas_agree(&j), 2);
    s_done(j.dir);
}

Test(elastic, refusals_exit_with_their_code_and_runs_are_never_truncated, .timeout = 300)
{
    s_job_t j;
    char *extra[] = {"--max-workers", "2", NULL};
    s_start(&j, "refuse", 2, extra);
    mq_test_wait_rows(j.run, 20, 120);
    s_start_worker(&j); /* a third worker: no rank left */
    cr_expect_eq(s_wait(j.workers[2], 30), MQ_EXIT_REFUSED);
    j.workers[2] = -1;
    cr_assert_eq(s_finish(&j, 300), 0);
    /* A second scheduler on the same run directory refuses it and leaves it as it was. */
    size_t before = 0, after = 0;
    char *m0 = s_slurp(j.run, "metrics.csv", &before);
    char log[320];
    snprintf(log, sizeof log, "%s/again.log", j.dir);
    char bind[64];
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", s_free_port());
    char *argv[] = {"mqgrad-scheduler", "--bind", bind, "--workers", "1", "--run-dir", j.run,
                    "--start-timeout", "5", NULL};
    pid_t again = s_spawn("scheduler", argv, log);
    cr_expect_eq(s_wait(again, 30), 2, "a scheduler must refuse a used directory at once");
    char *said = s_slurp(j.dir, "again.log", NULL);
    cr_expect_not_null(strstr(said, "already holds a run"), "%s", said);
    free(said);
    char *m1 = s_slurp(j.run, "metrics.csv", &after);
    cr_expect(before == after && memcmp(m0, m1, before) == 0, "metrics.csv was changed");
    free(m0);
    free(m1);
    s_done(j.dir);
}

/* The "iterations_lost" of the first EVENT in events.jsonl (-1 if none). */
static long s_lost(const s_job_t *j, const char *event)
{
    char *text = s_slurp(j->run, "events.jsonl", NULL);
    cr_assert_not_null(text);
    char pat[64];
    snprintf(pat, sizeof pat, "\"event\":\"%s\"", event);
    const char *p = strstr(text, pat);
    const char *l = p ? strstr(p, "\"iterations_lost\":") : NULL;
    long lost = l ? atol(l + 18) : -1;
    free(text);
    return lost;
}

/* Kills the scheduler (SCHEDULER) or server 0 with SIGKILL at iteration ~130 and starts it
 * again as a restart policy would; the run must complete, losing at most the checkpoint
 * interval (50, and the iterations in flight), recorded as one EVENT. */
static void s_kill_and_restart(const char *name, bool scheduler, const char *event)
{
    double calm = s_calm_acc();
    s_job_t j;
    s_start(&j, name, 4, NULL);
    mq_test_wait_rows(j.run, 130, 120);
    pid_t victim = scheduler ? j.sched : j.servers[0];
    cr_assert_eq(kill(victim, SIGKILL), 0);
    waitpid(victim, NULL, 0);
    if (scheduler) {
        zclock_sleep(500);
        s_start_scheduler(&j, true); /* the nodes find it and register again */
    } else {
        s_start_server(&j, 0);
    }
    cr_assert_eq(s_finish(&j, 300), 0, "the run did not complete (see %s)", j.dir);
    cr_expect(s_summary_has(&j, "\"status\": \"completed\""));
    cr_expect_eq(s_summary_num(&j, "iterations"), S_ITERS);
    cr_expect_eq(s_events(&j, event), 1);
    long lost = s_lost(&j, event);
    cr_expect(lost >= 0 && lost <= 50 + 30, "%ld iterations lost; the interval is 50", lost);
    double acc = s_summary_num(&j, "final_test_acc");
    cr_log_info("%s killed at iteration ~130: %.2f%%, %ld iterations lost (undisturbed %.2f%%)",
                scheduler ? "the scheduler" : "a server", acc * 100, lost, calm * 100);
    cr_expect_geq(acc, calm - 0.05);
    cr_expect_eq(s_replicas_agree(&j), 4, "every worker (registered again) holds a replica");
    s_done(j.dir);
}

Test(elastic, a_killed_server_takes_the_run_back_to_its_checkpoint, .timeout = 600)
{
    s_kill_and_restart("server", false, "rollback");
}

Test(elastic, a_killed_scheduler_is_restarted_and_resumes, .timeout = 600)
{
    s_kill_and_restart("sched", true, "restart");
}

/* Runs `mqgrad local ARGS...` with its output to LOG; returns its pid. */
static pid_t s_local(const char *log, char **args)
{
    char *argv[40] = {"mqgrad", "local"};
    int n = 2;
    while (*args && n < 39)
        argv[n++] = *args++;
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execv(MQ_TEST_BIN_DIR "/tools/mqgrad", argv);
        _exit(127);
    }
    return pid;
}

/* SIGKILL to PARENT and every process it started, all at once. */
static void s_kill_tree(pid_t parent)
{
    pid_t kids[64];
    int n = 0;
    DIR *d = opendir("/proc");
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d)) && n < 64;) {
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        const char *close = strrchr(buf, ')');
        int ppid = 0;
        if (close && sscanf(close + 2, "%*c %d", &ppid) == 1 && ppid == parent)
            kids[n++] = atoi(e->d_name);
    }
    closedir(d);
    cr_assert_geq(n, 4, "found %d children of mqgrad local", n);
    kill(parent, SIGKILL);
    for (int i = 0; i < n; i++)
        kill(kids[i], SIGKILL);
    waitpid(parent, NULL, 0);
    for (int i = 0; i < n; i++) /* not our children: wait until they are gone */
        for (int k = 0; k < 100 && kill(kids[i], 0) == 0; k++)
            zclock_sleep(50);
}

/* The iteration of RUN's last consistent checkpoint (checkpoint.json), or 0. */
static long s_checkpoint_iter(const char *run)
{
    char *ck = s_slurp(run, "checkpoint.json", NULL);
    const char *p = ck ? strstr(ck, "\"iter\": ") : NULL;
    long at = p ? atol(p + 8) : 0;
    free(ck);
    return at;
}

Test(elastic, everything_killed_then_local_resume, .timeout = 600)
{
    char dir[256], run[300], log[320];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-elastic-%d-all", (int)getpid());
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(log, sizeof log, "%s/local.log", dir);
    cr_assert_eq(mq_mkdirs(dir), 0);
    char *args[] = {"--model", "small", "--workers", "2", "--servers", "2", "--policy",
                    "fixed:4", "--iterations", "400", "--checkpoint-every", "50", "--threads",
                    "1", "--quiet", "--run-dir", run, NULL};
    pid_t local = s_local(log, args);
    mq_test_wait_rows(run, 130, 120);
    /* two consistent checkpoints (50 and 100) before the kill */
    long at = 0;
    for (int i = 0; i < 600 && at < 100; i++, zclock_sleep(100))
        at = s_checkpoint_iter(run);
    cr_assert_geq(at, 100, "no consistent checkpoint at 100 within 60 s");
    s_kill_tree(local);
    at = s_checkpoint_iter(run); /* one more may have come before the kill */
    int rows_before = mq_test_rows(run);

    /* The shard of the checkpoint the run goes on from cannot be read: the server moves it
     * aside as it is, and the run goes back to the checkpoint before it and completes. */
    s_job_t j = {0};
    snprintf(j.run, sizeof j.run, "%s", run);
    char ckdir[320], path[600], aside[640], *orig;
    size_t len;
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", run);
    DIR *d = opendir(ckdir);
    cr_assert_not_null(d, "no checkpoints in %s", ckdir);
    char name[300] = "";
    for (struct dirent *e; (e = readdir(d));) {
        const char *dash = strrchr(e->d_name, '-');
        if (strncmp(e->d_name, "shard-0-", 8) == 0 && dash && atol(dash + 1) == at &&
            strstr(e->d_name, ".ckpt") && !strstr(e->d_name, "unreadable"))
            snprintf(name, sizeof name, "%s", e->d_name);
    }
    closedir(d);
    cr_assert(name[0], "no shard-0 file of iteration %ld in %s", at, ckdir);
    unsigned long best = (unsigned long)at;
    snprintf(path, sizeof path, "%s/%s", ckdir, name);
    snprintf(aside, sizeof aside, "%s.unreadable", path);
    cr_assert_eq(mq_read_file(path, &orig, &len), 0);
    char *bad = malloc(len);
    memcpy(bad, orig, len);
    bad[len / 2] ^= 1;
    cr_assert_eq(mq_write_file_atomic(path, bad, len), 0);
    free(orig);
    char *resume[] = {"--resume", run, NULL};
    pid_t last = s_local(log, resume);
    cr_assert_eq(s_wait(last, 300), 0, "mqgrad local --resume did not complete the run");
    cr_expect(s_summary_has(&j, "\"status\": \"completed\""));
    cr_expect_eq(s_summary_num(&j, "iterations"), 400);
    cr_expect_geq(s_events(&j, "restart"), 1);
    cr_expect_eq(s_events(&j, "checkpoint_unreadable"), 1);
    cr_expect_gt(s_summary_num(&j, "final_test_acc"), 0.6);
    char *now;
    size_t now_len;
    cr_assert_eq(mq_read_file(aside, &now, &now_len), 0, "%s was not moved aside", path);
    cr_expect(now_len == len && memcmp(now, bad, len) == 0, "the unreadable file was changed");
    free(now);
    free(bad);
    char *events = s_slurp(run, "events.jsonl", NULL);
    const char *fell = events ? strstr(events, "\"checkpoint_unreadable\"") : NULL;
    cr_expect(fell && strstr(fell, "corrupt"), "the fall-back does not say why:\n%s", events);
    free(events);
    /* The resumed scheduler kept the watch's first loss (the flat rule's reference) and
     * checkpoints it again. */
    char *ck = s_slurp(run, "checkpoint.json", NULL);
    cr_assert_not_null(ck, "no checkpoint.json in %s", run);
    const char *key = "\"first_loss\": ", *first = strstr(ck, key);
    cr_expect(first && atof(first + strlen(key)) > 1.0, "the first loss was lost on resume:\n%s",
              ck);
    free(ck);
    cr_log_info("killed at row %d, resumed from iteration %lu: %.2f%%", rows_before, best,
                s_summary_num(&j, "final_test_acc") * 100);
    s_done(dir);
}

/* The largest value, and the number of rows above zero, of metrics.csv's column NAME. */
static double s_column(const s_job_t *j, const char *name, int *nonzero)
{
    int n;
    double *v = s_values(j, name, &n), max = 0;
    *nonzero = 0;
    for (int i = 0; i < n; i++) {
        max = v[i] > max ? v[i] : max;
        *nonzero += v[i] > 0;
    }
    free(v);
    return max;
}

Test(elastic, a_deadline_closes_rounds_without_a_stalled_worker, .timeout = 300)
{
    s_job_t j;
    char *extra[] = {"--stragglers", "deadline:0.4", "--heartbeat-timeout", "8", NULL};
    s_start(&j, "deadline", 3, extra);
    mq_test_wait_rows(j.run, 60, 120);
    cr_assert_eq(kill(j.workers[1], SIGSTOP), 0); /* a straggler: alive, silent */
    int rows = mq_test_rows(j.run);
    mq_test_wait_rows(j.run, rows + 3, 30); /* rounds close without it */
    zclock_sleep(1500);
    cr_assert_eq(kill(j.workers[1], SIGCONT), 0);
    cr_assert_eq(s_finish(&j, 300), 0, "the run did not complete (see %s)", j.dir);
    cr_expect_eq(s_summary_num(&j, "iterations"), S_ITERS);
    int cut_rows;
    double most = s_column(&j, "stragglers", &cut_rows);
    cr_log_info("deadline 0.4 s, one worker stopped for ~2 s: %d rounds closed without it",
                cut_rows);
    /* the stalled one, and now and then another that the stall slowed down past 0.4 s */
    cr_expect(cut_rows >= 3 && most >= 1, "%d rows with stragglers, at most %g", cut_rows, most);
    cr_expect_eq(s_events(&j, "worker_lost"), 0, "a straggler is not lost");
    cr_expect_eq(s_replicas_agree(&j), 3, "the straggler is back in step");
    s_done(j.dir);
}

Test(elastic, first_n_of_m_backup_workers, .timeout = 300)
{
    s_job_t j;
    char *extra[] = {"--stragglers", "first:2", NULL};
    s_start(&j, "first", 3, extra);
    cr_assert_eq(s_finish(&j, 300), 0, "the run did not complete (see %s)", j.dir);
    cr_expect_eq(s_summary_num(&j, "iterations"), S_ITERS);
    int cut_rows;
    s_column(&j, "stragglers", &cut_rows);
    int two;
    double workers = s_column(&j, "workers", &two);
    cr_expect(cut_rows == S_ITERS - 1 && workers == 3,
              "every round but the last (evaluated) closes with the first 2 of 3 (%d rows cut, "
              "at most %g workers)", cut_rows, workers);
    cr_expect_gt(s_summary_num(&j, "final_test_acc"), 0.6);
    cr_expect_eq(s_replicas_agree(&j), 3, "the backup worker stays in step");
    s_done(j.dir);
}

Test(elastic, a_cut_off_worker_is_lost_then_comes_back, .timeout = 300)
{
    s_job_t j;
    s_start(&j, "cut", 3, NULL);
    mq_test_wait_rows(j.run, 40, 120);
    /* A network cut, as the scheduler sees it: not a word for longer than the timeout. */
    cr_assert_eq(kill(j.workers[1], SIGSTOP), 0);
    cr_assert(s_wait_event(&j, "worker_lost", 10), "a silent worker must be lost");
    cr_assert_eq(kill(j.workers[1], SIGCONT), 0);
    /* Back, it hears it was taken out, registers again and joins. */
    cr_expect(s_wait_event(&j, "worker_joined", 20), "the worker did not come back");
    cr_assert_eq(s_finish(&j, 300), 0, "the run did not complete (see %s)", j.dir);
    cr_expect_eq(s_summary_num(&j, "iterations"), S_ITERS);
    cr_expect_eq(s_replicas_agree(&j), 3);
    s_done(j.dir);
}

/* A full disk under the run directory fails the run with the reason, never "completed" with
 * rows missing. Needs a small filesystem to fill: a tmpfs, mounted as root (skipped when the
 * test cannot mount one). */
Test(elastic, a_full_disk_fails_the_run_with_the_reason, .timeout = 300)
{
    char mnt[256];
    snprintf(mnt, sizeof mnt, "/tmp/mqgrad-elastic-%d-full", (int)getpid());
    cr_assert_eq(mq_mkdirs(mnt), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=24k mqgrad-test %s 2>/dev/null", mnt);
    if (geteuid() != 0 || system(cmd) != 0) {
        rmdir(mnt);
        cr_skip_test("cannot mount a small tmpfs here (not root, or no CAP_SYS_ADMIN)");
    }
    s_job_t j;
    s_prepare(&j, "fullrun", 2, NULL);
    snprintf(j.run, sizeof j.run, "%s/run", mnt); /* the run directory on the small disk */
    s_launch(&j);
    int code = s_finish(&j, 240);
    snprintf(cmd, sizeof cmd, "umount %s", mnt);
    char *log = s_slurp(j.dir, "scheduler.log", NULL);
    bool said = log && strstr(log, "No space left on device") != NULL;
    int rc = system(cmd);
    (void)rc;
    cr_expect_eq(code, 1, "a run that cannot write its rows must fail (exit %d)", code);
    cr_expect(said, "the log does not give the reason:\n%s", log ? log : "(none)");
    free(log);
    if (rc == 0)
        rmdir(mnt);
    s_done(j.dir);
}
