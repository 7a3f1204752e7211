/* The front door: every flag of `mqgrad local` and of the four services, given a bad value
 * (out of range, not a number, NaN, empty, not a switch's word, a path that is not there),
 * exits 2 before its 5 s deadline naming the flag, starts no process and leaves no run
 * directory (a refusal never waits on work: no wall-clock bound tighter than that). The
 * flags are read from each program's --help, so a flag added later is tried too: one with no
 * bad value known here fails the test until it gets one. A worker whose setup fails the same
 * way each time ends the run within 10 s, with the cause in the last lines and in
 * summary.json. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <czmq.h>

#include "local_run.h"
#include "mqgrad/util.h"

#define S_SERVICES MQ_TEST_BIN_DIR "/services"

typedef struct {
    int code;
    double secs;
    char out[16384]; /* standard output and error together */
} s_result_t;

/* Runs ARGV (NULL-terminated) with its output captured, killed after TIMEOUT_S. */
static void s_run(const char *const *argv, int timeout_s, s_result_t *r)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/mqgrad-front-%d.out", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
    double t0 = mq_now_s();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        setpgid(0, 0);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    bool done = false;
    while (!done && mq_now_s() - t0 < timeout_s) {
        done = waitpid(pid, &status, WNOHANG) == pid;
        if (!done)
            usleep(5000);
    }
    r->secs = mq_now_s() - t0;
    if (!done) {
        kill(-pid, SIGKILL);
        waitpid(pid, &status, 0);
        r->code = -1;
    } else {
        r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    ssize_t n = pread(fd, r->out, sizeof r->out - 1, 0);
    r->out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
}

/* ---- the flags a program's --help lists, with what each takes ------------------------- */

typedef enum { S_TEXT, S_INTEGER, S_NUMBER, S_SWITCH } s_kind_t;

typedef struct {
    char name[48];
    s_kind_t kind;
    double lo, hi;
    bool not_empty; /* a text that must not be empty (a secret) */
} s_flag_t;

/* Reads "  --NAME  help [default] (an integer in LO..HI)" lines of PROGRAM --help. */
static int s_flags_of(const char *program, const char *sub, s_flag_t *flags, int max)
{
    const char *argv[] = {program, sub ? sub : "--help", sub ? "--help" : NULL, NULL};
    s_result_t *r = malloc(sizeof *r);
    s_run(argv, 10, r);
    cr_assert_eq(r->code, 0, "%s --help: exit %d\n%s", program, r->code, r->out);
    int n = 0;
    for (char *save, *line = strtok_r(r->out, "\n", &save); line && n < max;
         line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "  --", 4) != 0)
            continue;
        s_flag_t *f = &flags[n];
        memset(f, 0, sizeof *f);
        if (sscanf(line + 4, "%47[a-zA-Z0-9-]", f->name) != 1 || !strcmp(f->name, "help"))
            continue;
        const char *t;
        if ((t = strstr(line, "(an integer from ")))
            f->kind = S_INTEGER, sscanf(t, "(an integer from %lf to %lf)", &f->lo, &f->hi);
        else if ((t = strstr(line, "(a number from ")))
            f->kind = S_NUMBER, sscanf(t, "(a number from %lf to %lf)", &f->lo, &f->hi);
        else if (strstr(line, "(a switch)"))
            f->kind = S_SWITCH;
        else if (strstr(line, "(not empty)"))
            f->not_empty = true;
        n++;
    }
    free(r);
    return n;
}

static const s_flag_t *s_find(const s_flag_t *flags, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(flags[i].name, name))
            return &flags[i];
    return NULL;
}

/* Bad values for a flag of kind F into VALS (each "--name=value", or "--name" alone for a
 * switch's bad word): out of range both ways, not a number, NaN, empty. */
static int s_bad_values(const s_flag_t *f, char vals[][96])
{
    int n = 0;
    switch (f->kind) {
    case S_INTEGER:
        snprintf(vals[n++], 96, "--%s=%.0f", f->name, f->lo - 1);
        /* hi + 1 is hi itself in a double past 2^53: twice hi is out of range there too */
        snprintf(vals[n++], 96, "--%s=%.0f", f->name, f->hi > 1e15 ? f->hi * 2 : f->hi + 1);
        snprintf(vals[n++], 96, "--%s=1.5", f->name);
        snprintf(vals[n++], 96, "--%s=abc", f->name);
        snprintf(vals[n++], 96, "--%s=", f->name);
        break;
    case S_NUMBER:
        snprintf(vals[n++], 96, "--%s=%g", f->name, f->lo > 0 ? f->lo / 2 : f->lo - 1);
        snprintf(vals[n++], 96, "--%s=%g", f->name, f->hi * 2 + 1);
        snprintf(vals[n++], 96, "--%s=nan", f->name);
        snprintf(vals[n++], 96, "--%s=abc", f->name);
        snprintf(vals[n++], 96, "--%s=", f->name);
        break;
    case S_SWITCH:
        snprintf(vals[n++], 96, "--%s=maybe", f->name);
        break;
    case S_TEXT:
        if (f->not_empty)
            snprintf(vals[n++], 96, "--%s=", f->name);
        break;
    }
    return n;
}

/* Text flags: values each program must refuse. A flag that takes any text (an endpoint is
 * checked when it is bound, a file when it is written) is listed with NULL, and why. */
typedef struct {
    const char *program; /* "local", "scheduler", "server", "worker" */
    const char *flag;
    const char *value;
} s_text_case_t;

static const s_text_case_t s_text_cases[] = {
    {"local", "policy", "fixed:99"},
    {"local", "policy", "bogus"},
    {"local", "policy", ""},
    {"local", "codec", "foo"},
    {"local", "codec", "topk:ratio=2"},
    {"local", "optimizer", "adam"},
    {"local", "clock", "sundial"},
    {"local", "link", "80@0,8@0"},
    {"local", "link", "80;gpu=8"},
    {"local", "model", "resnet"},
    {"local", "dataset", "imagenet"},
    {"local", "dataset", "mnist"}, /* not installed: how to get it */
    {"local", "stragglers", "first:0"},
    {"local", "stragglers", "sometimes"},
    {"local", "on-divergence", "maybe"},
    {"local", "agent-args", "--epsilon 7"},
    {"local", "data-dir", "/nonexistent/mqgrad-data"},
    {"local", "bin-dir", "/nonexistent/mqgrad-bin"},
    {"local", "resume", "/nonexistent/mqgrad-run"},
    {"local", "run-dir", "/proc/mqgrad-cannot-be-made"},
    {"local", "worker-exec", "/nonexistent/mqgrad-worker-program --flag"},
    {"local", "worker-exec", "mqgrad-no-such-command"},
    {"train", "model", "resnet"},
    {"train", "dataset", "imagenet"},
    {"train", "dataset", "mnist"},
    {"train", "data-dir", "/nonexistent/mqgrad-data"},
    {"train", "run-dir", "/proc/mqgrad-cannot-be-made"},
    {"scheduler", "codec", "foo"},
    {"scheduler", "optimizer", "adam"},
    {"scheduler", "stragglers", "deadline:0"},
    {"scheduler", "clock", "sundial"},
    {"scheduler", "link", "80@5"},
    {"scheduler", "link", "worker:x=80"},
    {"scheduler", "model", "resnet"},
    {"scheduler", "dataset", "imagenet"},
    {"scheduler", "on-divergence", "maybe"},
    /* Any text: an endpoint is checked when it is bound or connected, a path when it is
     * used; a secret file, a token file and a key directory by the security checks of
     * test_security and test_http. */
    {"scheduler", "agent", NULL},
    {"scheduler", "run-dir", NULL},
    {"server", "scheduler", NULL},
    {"server", "advertise", NULL},
    {"server", "dump", NULL},
    {"server", "checkpoint-dir", NULL},
    {"agent", "policy", "bogus"},
    {"agent", "policy", "fixed:99"},
    {"agent", "policy", "mqgrad:T=1"},
    {"agent", "log-level", "loud"},
    {"agent", "state", NULL}, /* a path: read or made when the agent starts */
    {"worker", "scheduler", NULL},
    {"worker", "data-dir", NULL}, /* the data set is the scheduler's to name: checked on WELCOME */
    {"worker", "dump", NULL},
    {"*", "keys", NULL},
    {"*", "key", NULL},
    {"*", "secret-key", NULL},
    {"*", "public-keys", NULL},
    {"*", "http-bind", NULL},
    {"*", "bind", NULL},
    {"*", "http-token-file", NULL},
};

/* Whether PROGRAM's text flag FLAG has cases here (1), is known to take any text (0), or is
 * not known at all (-1). */
static int s_text_known(const char *program, const char *flag)
{
    int known = -1;
    for (size_t i = 0; i < sizeof s_text_cases / sizeof s_text_cases[0]; i++) {
        const s_text_case_t *c = &s_text_cases[i];
        if ((strcmp(c->program, program) && strcmp(c->program, "*")) || strcmp(c->flag, flag))
            continue;
        known = c->value ? 1 : (known < 0 ? 0 : known);
    }
    return known;
}

/* Runs one bad case: exit 2 within its 5 s deadline, the flag named in the output, no run
 * directory, no process started (MARKS stays empty). Returns false, with the failure logged,
 * otherwise. */
static bool s_try(const char *program, const char *const *argv, const char *flag,
                  const char *run_dir, const char *marks, int *failures)
{
    s_result_t *r = malloc(sizeof *r);
    s_run(argv, 5, r);
    char named[64];
    snprintf(named, sizeof named, "--%s", flag);
    struct stat st;
    bool dir_left = run_dir && stat(run_dir, &st) == 0;
    bool started = false;
    DIR *d = marks ? opendir(marks) : NULL;
    for (struct dirent *e; d && (e = readdir(d));)
        started |= e->d_name[0] != '.';
    if (d)
        closedir(d);
    char args[512] = "";
    for (int i = 1; argv[i]; i++)
        snprintf(args + strlen(args), sizeof args - strlen(args), " '%s'", argv[i]);
    bool ok = r->code == 2 && strstr(r->out, named) && !dir_left && !started;
    if (!ok) {
        cr_log_error("%s%s: exit %d in %.2f s%s%s%s\n%s", program, args, r->code, r->secs,
                     strstr(r->out, named) ? "" : ", the flag not named",
                     dir_left ? ", left its run directory" : "",
                     started ? ", started a process" : "", r->out);
        (*failures)++;
    }
    free(r);
    if (dir_left)
        test_rmtree(run_dir);
    if (started) { /* the next case starts from no marks */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -f '%s'/*", marks);
        cr_assert_eq(system(cmd), 0);
    }
    return ok;
}

/* ---- mqgrad local ----------------------------------------------------------------------- */

/* A bin dir of stand-ins for the four services, each leaving a mark that it was started. */
static void s_fake_bin(const char *bin, const char *marks)
{
    cr_assert_eq(mq_mkdirs(bin), 0, "%s", mq_err_last());
    cr_assert_eq(mq_mkdirs(marks), 0, "%s", mq_err_last());
    const char *roles[] = {"agent", "scheduler", "server", "worker"};
    for (int i = 0; i < 4; i++) {
        char path[256], text[512];
        snprintf(path, sizeof path, "%s/mqgrad-%s", bin, roles[i]);
        int n = snprintf(text, sizeof text, "#!/bin/sh\ntouch '%s/%s'\nexit 0\n", marks, roles[i]);
        cr_assert_eq(mq_write_file_atomic(path, text, (size_t)n), 0);
        chmod(path, 0755);
    }
}

Test(front_door, every_flag_of_mqgrad_local_refuses_a_bad_value_at_once, .timeout = 300)
{
    char base[128], bin[160], marks[160], run[160];
    snprintf(base, sizeof base, "/tmp/mqgrad-front-%d", (int)getpid());
    snprintf(bin, sizeof bin, "%s/bin", base);
    snprintf(marks, sizeof marks, "%s/marks", base);
    snprintf(run, sizeof run, "%s/run", base);
    s_fake_bin(bin, marks);

    static s_flag_t local[128], sched[128], worker[64];
    int nl = s_flags_of(MQGRAD, "local", local, 128);
    int ns = s_flags_of(S_SERVICES "/mqgrad-scheduler", NULL, sched, 128);
    int nw = s_flags_of(S_SERVICES "/mqgrad-worker", NULL, worker, 64);
    cr_assert_gt(nl, 30, "mqgrad local --help lists %d flags", nl);

    /* The stand-ins are found and started when the flags are good: what "started nothing"
     * is checked against. */
    {
        const char *argv[] = {MQGRAD, "local", "--bin-dir", bin, "--run-dir", run,
                              "--iterations", "5", "--insecure", NULL};
        s_result_t *r = malloc(sizeof *r);
        s_run(argv, 30, r);
        char mark[200];
        snprintf(mark, sizeof mark, "%s/scheduler", marks);
        cr_assert_eq(access(mark, F_OK), 0, "the stand-in scheduler was not started:\n%s",
                     r->out);
        free(r);
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'/*", run, marks);
        cr_assert_eq(system(cmd), 0);
    }

    int failures = 0, cases = 0;
    for (int i = 0; i < nl; i++) {
        s_flag_t f = local[i];
        if (f.kind == S_TEXT) { /* forwarded: it takes what the service that gets it takes */
            const s_flag_t *g = s_find(sched, ns, f.name);
            if (!g || g->kind == S_TEXT)
                g = s_find(worker, nw, f.name);
            if (g && g->kind != S_TEXT)
                f = *g;
        }
        char vals[8][96];
        int nv = s_bad_values(&f, vals);
        const char *texts[8];
        int nt = 0;
        if (f.kind == S_TEXT) {
            int known = s_text_known("local", f.name);
            cr_expect_eq(known, 1, "mqgrad local --%s: no bad value known (add one to "
                                   "s_text_cases)", f.name);
            for (size_t k = 0; k < sizeof s_text_cases / sizeof s_text_cases[0] && nt < 8; k++)
                if (!strcmp(s_text_cases[k].program, "local") &&
                    !strcmp(s_text_cases[k].flag, f.name) && s_text_cases[k].value)
                    texts[nt++] = s_text_cases[k].value;
        }
        for (int v = 0; v < nv + nt; v++) {
            char given[1100];
            if (v < nv)
                snprintf(given, sizeof given, "%s", vals[v]);
            else
                snprintf(given, sizeof given, "--%s=%s", f.name, texts[v - nv]);
            const char *argv[] = {MQGRAD, "local", "--bin-dir", bin, "--run-dir", run,
                                  "--iterations", "5", given, NULL};
            if (!strcmp(f.name, "bin-dir")) /* the stand-ins would not be used */
                argv[2] = "--quiet", argv[3] = "--quiet";
            if (!strcmp(f.name, "run-dir"))
                argv[4] = "--quiet", argv[5] = "--quiet";
            if (!strcmp(f.name, "resume")) /* --resume takes no other flag */
                argv[2] = given, argv[3] = NULL;
            const char *dir = !strcmp(f.name, "run-dir") ? "/proc/mqgrad-cannot-be-made" : run;
            s_try("mqgrad local", argv, f.name, dir, marks, &failures);
            cases++;
        }
    }
    cr_log_info("mqgrad local: %d flags, %d bad values tried", nl, cases);
    cr_assert_eq(failures, 0, "%d of %d bad values of mqgrad local were not refused at once "
                              "(above)", failures, cases);
    test_rmtree(base);
}

/* ---- the services ----------------------------------------------------------------------- */

static void s_service_flags(const char *role)
{
    char exe[256], run[128];
    snprintf(exe, sizeof exe, S_SERVICES "/mqgrad-%s", role);
    snprintf(run, sizeof run, "/tmp/mqgrad-front-%s-%d", role, (int)getpid());
    static s_flag_t flags[128];
    int n = s_flags_of(exe, NULL, flags, 128);
    cr_assert_gt(n, 5, "%s --help lists %d flags", exe, n);
    int failures = 0, cases = 0;
    for (int i = 0; i < n; i++) {
        const s_flag_t *f = &flags[i];
        char vals[8][96];
        int nv = s_bad_values(f, vals);
        if (f->kind == S_TEXT && !f->not_empty) {
            int known = s_text_known(role, f->name);
            cr_expect_neq(known, -1, "mqgrad-%s --%s: no bad value known (add one to "
                                     "s_text_cases, or say it takes any text)", role, f->name);
            for (size_t k = 0; k < sizeof s_text_cases / sizeof s_text_cases[0] && nv < 8; k++)
                if (!strcmp(s_text_cases[k].program, role) &&
                    !strcmp(s_text_cases[k].flag, f->name) && s_text_cases[k].value)
                    snprintf(vals[nv++], 96, "--%.40s=%.50s", f->name, s_text_cases[k].value);
        }
        for (int v = 0; v < nv; v++) {
            /* Insecure and without HTTP, so that only the flag under test can be wrong. */
            const char *argv[8];
            int a = 0;
            argv[a++] = exe;
            if (strcmp(f->name, "insecure") != 0)
                argv[a++] = "--insecure";
            if (strcmp(f->name, "http-port") != 0)
                argv[a++] = "--http-port", argv[a++] = "0";
            if (!strcmp(role, "scheduler"))
                argv[a++] = "--run-dir", argv[a++] = run;
            argv[a++] = vals[v];
            argv[a] = NULL;
            s_try(exe, argv, f->name, run, NULL, &failures);
            cases++;
        }
    }
    cr_log_info("mqgrad-%s: %d flags, %d bad values tried", role, n, cases);
    cr_assert_eq(failures, 0, "%d of %d bad values of mqgrad-%s were not refused at once "
                              "(above)", failures, cases, role);
}

Test(front_door, every_flag_of_the_scheduler_refuses_a_bad_value, .timeout = 300)
{
    s_service_flags("scheduler");
}

Test(front_door, every_flag_of_the_server_refuses_a_bad_value, .timeout = 120)
{
    s_service_flags("server");
}

Test(front_door, every_flag_of_the_worker_refuses_a_bad_value, .timeout = 120)
{
    s_service_flags("worker");
}

Test(front_door, every_flag_of_the_agent_refuses_a_bad_value, .timeout = 120)
{
    s_service_flags("agent");
}

/* mqgrad train: the same table-driven flags; a bad one writes no run directory. */
Test(front_door, every_flag_of_mqgrad_train_refuses_a_bad_value, .timeout = 120)
{
    char run[128];
    snprintf(run, sizeof run, "/tmp/mqgrad-front-train-%d", (int)getpid());
    static s_flag_t flags[64];
    int n = s_flags_of(MQGRAD, "train", flags, 64);
    cr_assert_gt(n, 10, "mqgrad train --help lists %d flags", n);
    int failures = 0, cases = 0;
    for (int i = 0; i < n; i++) {
        const s_flag_t *f = &flags[i];
        char vals[8][96];
        int nv = s_bad_values(f, vals);
        if (f->kind == S_TEXT)
            for (size_t k = 0; k < sizeof s_text_cases / sizeof s_text_cases[0] && nv < 8; k++)
                if (!strcmp(s_text_cases[k].program, "train") &&
                    !strcmp(s_text_cases[k].flag, f->name) && s_text_cases[k].value)
                    snprintf(vals[nv++], 96, "--%.40s=%.50s", f->name, s_text_cases[k].value);
        cr_expect_gt(nv, 0, "mqgrad train --%s: no bad value known", f->name);
        for (int v = 0; v < nv; v++) {
            const char *argv[] = {MQGRAD, "train", "--run-dir", run, "--iterations", "1",
                                  vals[v], NULL};
            s_try("mqgrad train", argv, f->name, run, NULL, &failures);
            cases++;
        }
    }
    cr_assert_eq(failures, 0, "%d of %d bad values of mqgrad train were not refused at once "
                              "(above)", failures, cases);
}

/* ---- failures after the start ------------------------------------------------------------- */

/* A data directory whose files are there but broken passes the check before the start; every
 * worker then fails its setup with the same error. The run ends within 10 s, failed, with the
 * error in its last lines and in summary.json, and no --resume hint (there is no checkpoint). */
Test(front_door, a_worker_that_fails_its_setup_the_same_way_ends_the_run, .timeout = 120)
{
    char base[128], data[160], run[160];
    snprintf(base, sizeof base, "/tmp/mqgrad-front-setup-%d", (int)getpid());
    snprintf(data, sizeof data, "%s/data", base);
    snprintf(run, sizeof run, "%s/run", base);
    cr_assert_eq(mq_mkdirs(data), 0);
    const char *files[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int i = 0; i < 4; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", data, files[i]);
        cr_assert_eq(mq_write_file_atomic(path, "junk\n", 5), 0);
    }
    const char *argv[] = {MQGRAD, "local", "--run-dir", run, "--data-dir", data,
                          "--iterations", "5", "--threads", "1", "--insecure", NULL};
    s_result_t *r = malloc(sizeof *r);
    s_run(argv, 60, r);
    cr_assert_eq(r->code, 1, "exit %d after %.1f s:\n%s", r->code, r->secs, r->out);
    cr_expect_lt(r->secs, 10.0, "the run took %.1f s to fail:\n%s", r->secs, r->out);
    const char *tail = r->out + strlen(r->out);
    for (int lines = 0; tail > r->out && lines < 4; tail--)
        lines += tail[-1] == '\n';
    cr_expect(strstr(tail, "truncated") && strstr(tail, data),
              "the cause is not in the last lines:\n%s", tail);
    cr_expect(!strstr(r->out, "--resume"), "a --resume hint for a run with no checkpoint:\n%s",
              r->out);
    char *summary = test_slurp(run, "summary.json");
    cr_expect(strstr(summary, "\"status\": \"failed\""), "%s", summary);
    cr_expect(strstr(summary, "\"reason\": \"no worker can join the run") &&
                  strstr(summary, "truncated"),
              "%s", summary);
    free(summary);
    free(r);
    test_rmtree(base);
}

/* A service that cannot start (its port is taken) exits 1, "a failure", and says why: 2 is a
 * bad flag's (service.h), and nothing was wrong with the flags. */
Test(front_door, a_service_whose_port_is_taken_exits_1_and_says_so, .timeout = 120)
{
    zsock_t *taken = zsock_new(ZMQ_ROUTER);
    cr_assert_not_null(taken);
    int port = zsock_bind(taken, "tcp://127.0.0.1:*");
    cr_assert_gt(port, 0);
    char bind[64], run[128];
    snprintf(bind, sizeof bind, "tcp://127.0.0.1:%d", port);
    snprintf(run, sizeof run, "/tmp/mqgrad-front-taken-%d", (int)getpid());
    const char *sched[] = {S_SERVICES "/mqgrad-scheduler", "--bind", bind, "--run-dir", run,
                           "--insecure", "--http-port", "0", NULL};
    const char *server[] = {S_SERVICES "/mqgrad-server", "--bind", bind, "--scheduler",
                            "tcp://127.0.0.1:1", "--insecure", "--http-port", "0", NULL};
    const char *agent[] = {S_SERVICES "/mqgrad-agent", "--bind", bind, "--insecure",
                           "--http-port", "0", NULL};
    const char *const *programs[] = {sched, server, agent};
    s_result_t *r = malloc(sizeof *r);
    for (int i = 0; i < 3; i++) {
        s_run(programs[i], 30, r);
        cr_expect_eq(r->code, 1, "%s: exit %d:\n%s", programs[i][0], r->code, r->out);
        cr_expect(strstr(r->out, bind) || strstr(r->out, "in use"),
                  "%s does not say which port it could not take:\n%s", programs[i][0], r->out);
    }
    free(r);
    zsock_destroy(&taken);
    test_rmtree(run);
}
