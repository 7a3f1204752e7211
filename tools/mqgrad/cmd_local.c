/* `mqgrad local`: starts the agent, the scheduler, S servers and N workers as separate
 * processes over TCP loopback, shows the scheduler's progress, and stops every child when the
 * run ends, when a service fails, or on Ctrl-C. A worker that dies is started again (bounded)
 * and joins the run, which goes on without it meanwhile. Each child's log goes to RUN/logs/
 * (a restarted worker's is appended to). */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "local.h"
#include "run_summary.h"
#include "agent.h"
#include "scheduler.h"
#include "server.h"
#include "mqgrad/worker.h"
#include "mqgrad/data.h"
#include "mqgrad/runlog.h"
#include "mqgrad/service.h"
#include "mqgrad/watch.h"
#include "mqgrad/optim.h"
#include "mqgrad/quant.h"
#include "mqgrad/rl.h"
#include "mqgrad/security.h"
#include "mqgrad/util.h"
#include "mqgrad/wire.h"

/* The source tree this mqgrad was built from (its python/ is --worker-exec's package): set by
 * tools/CMakeLists.txt; a build of this file without it (the fuzz targets) names none. */
#ifndef MQGRAD_SOURCE_DIR
#define MQGRAD_SOURCE_DIR ""
#endif

typedef struct {
    pid_t pid;
    char name[32];
    char log[PATH_MAX];
    bool done;
    int code;
    long worker;  /* its number for a worker, -1 for the others */
    long server;  /* its number for a server, -1 for the others */
    long restarts; /* times it was started again */
    int http;      /* its /metrics port, 0 for none */
    char last[256]; /* the last line of its log when it last died */
    long log_start; /* its log's size when it was last started */
} s_child_t;

static volatile sig_atomic_t s_stop_signal;

static void s_on_signal(int sig)
{
    s_stop_signal = sig;
}

static int s_parse(mq_local_opts_t *o, int argc, char **argv);

/* --resume DIR: the run's own flags (DIR/local.args, one per line, written when it started)
 * with the run directory set to DIR. */
static int s_parse_resumed(mq_local_opts_t *o, const char *dir)
{
    char path[PATH_MAX], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/local.args", dir);
    if (mq_read_file(path, &text, &len) != 0) {
        fprintf(stderr, "mqgrad local: --resume %s: %s (was the run started by mqgrad local?)\n",
                dir, mq_err_last());
        return 2;
    }
    char *argv[128] = {"local"};
    int n = 1;
    bool servers = false;
    for (char *save, *line = strtok_r(text, "\n", &save); line && n < 123;
         line = strtok_r(NULL, "\n", &save)) {
        servers |= strncmp(line, "--servers", 9) == 0;
        argv[n++] = line;
    }
    /* Runs started before the server count was written down had the old default, 2. */
    if (!servers)
        argv[n++] = "--servers=2";
    char resume_dir[512];
    snprintf(resume_dir, sizeof resume_dir, "%s", dir);
    argv[n++] = "--run-dir";
    argv[n++] = resume_dir;
    argv[n] = NULL;
    int rc = s_parse(o, n, argv);
    free(text);
    if (rc == 0 && o->resume[0]) {
        fprintf(stderr, "mqgrad local: %s/local.args itself asks for --resume\n", dir);
        return 2;
    }
    if (rc == 0)
        snprintf(o->resume, sizeof o->resume, "%s", resume_dir);
    return rc;
}

int mq_local_parse(mq_local_opts_t *o, int argc, char **argv)
{
    int rc = s_parse(o, argc, argv);
    if (rc != 0 || !o->resume[0])
        return rc;
    if (argc != 3 && !(argc == 2 && strncmp(argv[1], "--resume=", 9) == 0)) {
        fprintf(stderr, "mqgrad local: --resume takes no other flags (the run's own are used)\n");
        return 2;
    }
    char dir[512];
    snprintf(dir, sizeof dir, "%s", o->resume);
    return s_parse_resumed(o, dir);
}

static int s_parse(mq_local_opts_t *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->workers = 2;
    o->servers = 0; /* as many as workers (below) */
    o->restarts = 3;
    strcpy(o->policy, "mqgrad");
    char policies[256];
    mq_policy_names(policies, sizeof policies - 24, " | ");
    strcat(policies, " | none (fp32, no agent)");
    const mq_flag_t flags[] = {
        {"workers", "MQGRAD_WORKERS", MQ_FLAG_LONG, &o->workers, 0, 1, MQ_FLAG_MAX_WORKERS,
         "worker processes"},
        {"servers", "MQGRAD_SERVERS", MQ_FLAG_LONG, &o->servers, 0, 1, MQ_FLAG_MAX_SERVERS,
         "server processes (default: one per worker, up to 16)"},
        {"min-workers", NULL, MQ_FLAG_STR, o->min_workers, sizeof o->min_workers, 1, 0,
         "below this many workers the run pauses (1)"},
        {"heartbeat-timeout", NULL, MQ_FLAG_STR, o->heartbeat_timeout,
         sizeof o->heartbeat_timeout, 1, 0, "seconds of silence after which a node is lost (5)"},
        {"restarts", NULL, MQ_FLAG_LONG, &o->restarts, 0, 0, 1000,
         "times a worker that dies is started again to rejoin (3)"},
        {"resume", NULL, MQ_FLAG_STR, o->resume, sizeof o->resume, 1, 0,
         "continue the interrupted run in this directory from its last checkpoint, with the "
         "flags it was started with"},
        {"checkpoint-every", NULL, MQ_FLAG_STR, o->checkpoint_every, sizeof o->checkpoint_every,
         1, 0, "iterations between checkpoints (100; 0 = none)"},
        {"stragglers", NULL, MQ_FLAG_STR, o->stragglers, sizeof o->stragglers, 1, 0,
         "wait | deadline:SECONDS | first:N (wait)"},
        {"policy", "MQGRAD_POLICY", MQ_FLAG_STR, o->policy, sizeof o->policy, 1, 0,
         policies},
        {"run-dir", "MQGRAD_RUN_DIR", MQ_FLAG_STR, o->run_dir, sizeof o->run_dir, 0, 0,
         "run directory (default runs/local-<time>)"},
        {"bin-dir", "MQGRAD_BIN_DIR", MQ_FLAG_STR, o->bin_dir, sizeof o->bin_dir, 0, 0,
         "directory of the mqgrad-* executables (default: found beside mqgrad)"},
        {"model", NULL, MQ_FLAG_STR, o->model, sizeof o->model, 1, 0,
         "paper | small | external (the workers' own: the default with --worker-exec)"},
        {"worker-exec", "MQGRAD_WORKER_EXEC", MQ_FLAG_STR, o->worker_exec,
         sizeof o->worker_exec, 1, 0,
         "run this command (sh -c) as each worker: a program on libmqgrad, e.g. 'python3 "
         "examples/torch/paper_cnn.py'; its flags come as MQGRAD_* variables (MQGRAD_SCHEDULER, "
         "MQGRAD_KEYS, MQGRAD_DATA_DIR, MQGRAD_THREADS, ...), with PYTHONPATH and MQGRAD_LIB "
         "naming this build's Python package and library"},
        {"dataset", NULL, MQ_FLAG_STR, o->dataset, sizeof o->dataset, 1, 0,
         "fashion-mnist | mnist | cifar10 (fashion-mnist)"},
        {"iterations", NULL, MQ_FLAG_STR, o->iterations, sizeof o->iterations, 1, 0,
         "iterations to train (200; 0 = until --time-budget)"},
        {"time-budget", NULL, MQ_FLAG_STR, o->time_budget, sizeof o->time_budget, 1, 0,
         "seconds of training, evaluation excluded (none)"},
        {"eval-every", NULL, MQ_FLAG_STR, o->eval_every, sizeof o->eval_every, 1, 0,
         "evaluate every N iterations (100; 0 = at the end only)"},
        {"eval-limit", NULL, MQ_FLAG_STR, o->eval_limit, sizeof o->eval_limit, 1, 0,
         "test examples per evaluation (0 = all)"},
        {"final-eval-limit", NULL, MQ_FLAG_STR, o->final_eval_limit, sizeof o->final_eval_limit,
         1, 0, "test examples for the last evaluation (0 = all)"},
        {"batch", NULL, MQ_FLAG_STR, o->batch, sizeof o->batch, 1, 0,
         "examples per worker and iteration (32)"},
        {"lr", NULL, MQ_FLAG_STR, o->lr, sizeof o->lr, 1, 0, "learning rate (0.01)"},
        {"lr-decay", NULL, MQ_FLAG_STR, o->lr_decay, sizeof o->lr_decay, 1, 0,
         "decay lr linearly to 0 over this last fraction of the run (0 = constant)"},
        {"seed", NULL, MQ_FLAG_STR, o->seed, sizeof o->seed, 1, 0, "the run's seed (1)"},
        {"link-mbps", NULL, MQ_FLAG_STR, o->link_mbps, sizeof o->link_mbps, 1, 0,
         "emulated NIC speed per node, Mbit/s (0 = none)"},
        {"link", NULL, MQ_FLAG_STR, o->link, sizeof o->link, 1, 0,
         "emulated NICs' rates over time, per role or rank, instead of --link-mbps: "
         "'80@0,10000@30/60' (square wave), '1000;worker:0=80' (docs/operations.md)"},
        {"clock", NULL, MQ_FLAG_STR, o->clock, sizeof o->clock, 1, 0,
         "real (links sleep; default) | simulated (link time computed from bytes, compute "
         "charged as CPU time: nodes behave like separate machines)"},
        {"codec", NULL, MQ_FLAG_STR, o->codec, sizeof o->codec, 1, 0,
         "codec of the big tensors, e.g. qsgd, topk:ratio=0.01 (default uniform; "
         "mqgrad-scheduler --help lists them)"},
        {"optimizer", NULL, MQ_FLAG_STR, o->optimizer, sizeof o->optimizer, 1, 0,
         "update rule, e.g. momentum, qrda:l1=1e-6 (default sgd)"},
        {"bucket", NULL, MQ_FLAG_STR, o->bucket, sizeof o->bucket, 1, 0,
         "uniform: values per range (default 512; 0 = the paper-exact codec)"},
        {"threshold", NULL, MQ_FLAG_STR, o->threshold, sizeof o->threshold, 1, 0,
         "tensors smaller than this travel as fp32 (100000)"},
        {"stochastic", NULL, MQ_FLAG_BOOL, &o->stochastic, 0, 0, 0, "stochastic rounding"},
        {"error-feedback", NULL, MQ_FLAG_BOOL, &o->error_feedback, 0, 0, 0,
         "accumulate quantization residuals on the workers"},
        {"agent-args", NULL, MQ_FLAG_STR, o->agent_args, sizeof o->agent_args, 0, 0,
         "extra agent flags, space separated (e.g. \"--epsilon 0.05\")"},
        {"data-dir", NULL, MQ_FLAG_STR, o->data_dir, sizeof o->data_dir, 1, 0,
         "the data set's folder (default /usr/share/datasets/NAME)"},
        {"threads", NULL, MQ_FLAG_STR, o->threads, sizeof o->threads, 1, 0,
         "OpenBLAS threads per worker (0 = OpenBLAS's default)"},
        {"diverge-factor", NULL, MQ_FLAG_STR, o->diverge_factor, sizeof o->diverge_factor, 1, 0,
         "diverged when the smoothed loss stays above this x its best (2; 0 = off)"},
        {"diverge-patience", NULL, MQ_FLAG_STR, o->diverge_patience, sizeof o->diverge_patience, 1,
         0, "... for this many iterations (15)"},
        {"learn-within", NULL, MQ_FLAG_STR, o->learn_within, sizeof o->learn_within, 1, 0,
         "a run this long (iterations) that ends at chance accuracy, or under 2x chance with "
         "its loss not 5% down, did not learn: diverged (50; 0 = off)"},
        {"on-divergence", NULL, MQ_FLAG_STR, o->on_divergence, sizeof o->on_divergence, 1, 0,
         "stop | continue (stop)"},
        {"guard-spike", NULL, MQ_FLAG_STR, o->guard_spike, sizeof o->guard_spike, 1, 0,
         "raise the bits when a loss exceeds this x the smoothed loss (1.5; 0 = off)"},
        {"guard-iters", NULL, MQ_FLAG_STR, o->guard_iters, sizeof o->guard_iters, 1, 0,
         "iterations the raised bits hold (10)"},
        {"guard-bits", NULL, MQ_FLAG_STR, o->guard_bits, sizeof o->guard_bits, 1, 0,
         "bits the guard adds (2)"},
        {"progress-every", NULL, MQ_FLAG_STR, o->progress_every, sizeof o->progress_every, 1, 0,
         "seconds between progress lines (2)"},
        {"quiet", NULL, MQ_FLAG_BOOL, &o->quiet, 0, 0, 0, "no progress lines"},
        {"http-port", NULL, MQ_FLAG_LONG, &o->http_port, 0, 0, 65535,
         "serve the scheduler's /metrics here, and every other service's on a free port, "
         "listed in RUN/prometheus-targets.json (0: no metrics)"},
        {"insecure", "MQGRAD_INSECURE", MQ_FLAG_BOOL, &o->insecure, 0, 0, 0,
         "no keys, no encryption (default: throw-away keys in RUN/keys for this run)"},
        {0},
    };
    char *args[argc + 1]; /* messages start with the command's name */
    memcpy(args, argv, sizeof(char *) * (size_t)argc);
    args[0] = "mqgrad local";
    args[argc] = NULL;
    int rc = mq_flags_parse(flags, argc, args,
                            "usage: mqgrad local [flags]\n"
                            "Runs agent, scheduler, servers and workers as processes on this "
                            "machine.\nEvery flag is checked, with the rules of the service "
                            "it goes to (mqgrad-scheduler --help and\nmqgrad-worker --help "
                            "give their ranges), before anything starts.",
                            NULL, 0, NULL);
    /* The codec, the update rule, the clock and every other forwarded value are the
     * services' to check: mq_local_check runs their parsers before anything starts. */
    struct stat st;
    if (rc == 0 && o->bin_dir[0] && (stat(o->bin_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "mqgrad local: --bin-dir %s: not a directory\n", o->bin_dir);
        rc = 2;
    }
    if (rc == 0 && !o->run_dir[0])
        mq_default_run_dir("local", o->run_dir, sizeof o->run_dir);
    /* One server per worker: each worker's host then carries 1/N of the model's aggregation
     * in and out besides its own push and pull, so no NIC carries more than 2x the model per
     * iteration whatever N is (docs/operations.md, "Topology"). With 2 servers for N workers, each
     * server's NIC carries N/2 model copies each way. */
    if (rc == 0 && o->servers == 0)
        o->servers = o->workers < 16 ? o->workers : 16;
    return rc;
}

/* A TCP port nobody listens on right now (the OS picks it). */
static int s_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* The folder of this executable into DIR. */
static void s_self_dir(char *dir, size_t len)
{
    char self[PATH_MAX] = "";
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(dir, len, "%s", dirname(self));
}

/* Finds the executable NAME in a folder of PATH into OUT: 0, or -1. */
static int s_on_path(const char *name, char *out, size_t len)
{
    const char *path = getenv("PATH");
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path ? path : "/usr/local/bin:/usr/bin:/bin");
    for (char *save, *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save))
        if (snprintf(out, len, "%s/%s", d, name) < (int)len && access(out, X_OK) == 0)
            return 0;
    return -1;
}

/* Finds mqgrad-NAME: in --bin-dir, beside this executable, in ../services (build tree), on
 * PATH. */
static int s_find_exe(const mq_local_opts_t *o, const char *name, char *out, size_t len)
{
    char dir[PATH_MAX], build[PATH_MAX + 16], exe[64];
    s_self_dir(dir, sizeof dir);
    snprintf(build, sizeof build, "%s/../services", dir);
    const char *dirs[] = {o->bin_dir, dir, build};
    for (int i = 0; i < 3; i++) {
        if (!dirs[i][0])
            continue;
        if (snprintf(out, len, "%s/mqgrad-%s", dirs[i], name) >= (int)len)
            continue;
        if (access(out, X_OK) == 0)
            return 0;
    }
    snprintf(exe, sizeof exe, "mqgrad-%s", name);
    if (s_on_path(exe, out, len) == 0)
        return 0;
    mq_err_set("cannot find the executable mqgrad-%s (use --bin-dir)", name);
    return -1;
}
/* An argument vector that owns its strings: built once, then checked by the service's own
 * parser in this process (s_preflight) or handed to execv (s_spawn). */
typedef struct {
    char *v[128];
    int n;
    char buf[8192];
    size_t used;
    bool full; /* an argument did not fit: the vector is refused, never cut */
    char *env[32]; /* NAME=VALUE set in the child before it starts (s_exec_worker) */
    int nenv;
} s_args_t;

static void s_arg(s_args_t *a, const char *s)
{
    size_t len = strlen(s) + 1;
    if (a->full || a->n + 1 >= (int)(sizeof a->v / sizeof a->v[0]) ||
        a->used + len > sizeof a->buf) {
        a->full = true;
        return;
    }
    a->v[a->n++] = memcpy(a->buf + a->used, s, len);
    a->v[a->n] = NULL;
    a->used += len;
}

static void s_args_init(s_args_t *a, const char *exe)
{
    a->n = 0;
    a->nenv = 0;
    a->used = 0;
    a->full = false;
    a->v[0] = NULL;
    s_arg(a, exe);
}

/* Appends "--flag value" when value is non-empty. */
static void s_fwd(s_args_t *a, const char *flag, const char *value)
{
    if (value && value[0]) {
        s_arg(a, flag);
        s_arg(a, value);
    }
}

static int s_spawn(s_child_t *c, const s_args_t *a, const char *logdir, bool show)
{
    snprintf(c->log, sizeof c->log, "%s/%s.log", logdir, c->name);
    int fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        mq_err_set("%s: %s", c->log, strerror(errno));
        return -1;
    }
    c->log_start = lseek(fd, 0, SEEK_END);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd);
        mq_err_set("fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        setpgid(0, 0); /* Ctrl-C reaches us; we stop the children in order */
        dup2(fd, STDERR_FILENO);
        if (!show)
            dup2(fd, STDOUT_FILENO);
        for (int i = 0; i < a->nenv; i++)
            putenv(a->env[i]);
        execv(a->v[0], a->v);
        fprintf(stderr, "exec %s: %s\n", a->v[0], strerror(errno));
        _exit(127);
    }
    close(fd);
    c->pid = pid;
    return 0;
}

/* "--http-port P --http-bind 127.0.0.1" for child C (the scheduler's P is --http-port, the
 * others' a free one), or "--http-port 0" without metrics: the variables a user's shell may
 * hold (MQGRAD_HTTP_PORT) must not give every process the same port. */
static void s_http_flags(const mq_local_opts_t *o, s_child_t *c, bool sched, s_args_t *a)
{
    char port[16];
    c->http = o->http_port == 0 ? 0 : sched ? (int)o->http_port : s_free_port();
    if (c->http < 0)
        c->http = 0;
    snprintf(port, sizeof port, "%d", c->http);
    s_fwd(a, "--http-port", port);
    if (c->http)
        s_fwd(a, "--http-bind", "127.0.0.1");
}

/* The services' security settings are this run's own (s_keys), not the caller's shell's. */
static void s_clear_key_env(void)
{
    unsetenv("MQGRAD_KEY");
    unsetenv("MQGRAD_SECRET_KEY");
    unsetenv("MQGRAD_PUBLIC_KEYS");
    unsetenv("MQGRAD_KEYS");
}

enum { S_AGENT, S_SCHEDULER, S_SERVER, S_WORKER, S_ROLES };
static const char *const s_role_names[S_ROLES] = {"agent", "scheduler", "server", "worker"};

typedef struct {
    s_child_t *kids; /* the agent, the scheduler, the servers and the workers */
    int n, cap;
    int sched, agent; /* indexes, -1 if none */
    bool with_agent;  /* the run has an agent (a policy, and a codec with levels) */
    char exe[S_ROLES][PATH_MAX];
    char pythonpath[PATH_MAX], libpath[PATH_MAX]; /* this build's, for --worker-exec */
    char sched_ep[64], agent_ep[64];
    int http_port;    /* the agent's HTTP port */
    /* The scheduler's settings as it will read them (s_preflight): what a summary written
     * here says of a run that ended before the scheduler wrote one. */
    mq_scheduler_config_t sched_cfg;
} s_cluster_t;

/* RUN/prometheus-targets.json: every service's /metrics, in Prometheus' file discovery
 * format (file_sd_configs), written again whenever a process (re)starts on a new port. */
static void s_write_targets(const mq_local_opts_t *o, const s_cluster_t *cl)
{
    if (!o->http_port)
        return;
    size_t cap = (size_t)cl->n * 160 + 8, len = 0;
    char *text = malloc(cap), path[PATH_MAX];
    if (!text) {
        mq_warn("prometheus-targets.json: out of memory");
        return;
    }
    len += (size_t)snprintf(text + len, sizeof text - len, "[");
    for (int i = 0, k = 0; i < cl->n && len < cap; i++) {
        const s_child_t *c = &cl->kids[i];
        if (!c->http)
            continue;
        const char *role = i == cl->agent ? "agent" : i == cl->sched ? "scheduler"
                           : c->worker >= 0   ? "worker"
                                              : "server";
        len += (size_t)snprintf(text + len, cap - len,
                                "%s\n  {\"targets\": [\"127.0.0.1:%d\"], \"labels\": "
                                "{\"role\": \"%s\", \"process\": \"%s\"}}",
                                k++ ? "," : "", c->http, role, c->name);
    }
    if (len < cap)
        len += (size_t)snprintf(text + len, cap - len, "\n]\n");
    snprintf(path, sizeof path, "%s/prometheus-targets.json", o->run_dir);
    if (len >= cap || mq_write_file_atomic(path, text, len) != 0)
        mq_warn("%s: %s", path, len >= cap ? "too many targets" : mq_err_last());
    free(text);
}

static s_child_t *s_new_child(s_cluster_t *cl, const char *fmt, long i)
{
    assert(cl->n < cl->cap); /* s_plan made room for every process of the run */
    s_child_t *c = &cl->kids[cl->n++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, fmt, i);
    c->worker = -1;
    c->server = -1;
    return c;
}

/* Whether the run's codec takes no bit-width (top-k, sign, ...): then no agent runs, as it
 * would have nothing to decide. */
static bool s_levelless(const mq_local_opts_t *o)
{
    mq_codec_t c;
    if (!o->codec[0] || mq_codec_parse(o->codec, &c) != 0)
        return false; /* a bad spec is the scheduler's to refuse, with its message */
    return c.id != MQ_CODEC_ID_none && mq_codec_ops(&c)->max_bits == 0;
}

/* Every service of the run gets its keys from the environment: the run's own throw-away
 * keys in RUN/keys (made once; a resumed run keeps them), or --insecure. A key of the
 * user's own (MQGRAD_KEY) is not the services' to take. */
static int s_keys(const mq_local_opts_t *o, char *keys, size_t len)
{
    s_clear_key_env();
    keys[0] = '\0';
    if (o->insecure) {
        setenv("MQGRAD_INSECURE", "1", 1);
        unsetenv("MQGRAD_KEYS");
        return 0;
    }
    unsetenv("MQGRAD_INSECURE");
    char probe[PATH_MAX];
    snprintf(keys, len, "%s/keys", o->run_dir);
    snprintf(probe, sizeof probe, "%s/agent.key", keys);
    if (access(probe, F_OK) != 0 && mq_sec_keygen(keys, NULL) != 0)
        return -1;
    setenv("MQGRAD_KEYS", keys, 1);
    return 0;
}
/* The executables and the ports: everything a child's flags name that is not an option. */
static int s_plan(const mq_local_opts_t *o, s_cluster_t *cl)
{
    cl->cap = (int)(o->workers + o->servers + 2); /* the caller freed the last plan's */
    if (!(cl->kids = calloc((size_t)cl->cap, sizeof *cl->kids))) {
        mq_err_set("out of memory for %d processes", cl->cap);
        return -1;
    }
    for (int r = 0; r < S_ROLES; r++)
        if (s_find_exe(o, s_role_names[r], cl->exe[r], sizeof cl->exe[r]) != 0)
            return -1;
    /* the Python package and libmqgrad of this build tree, when there is one (an installed
     * mqgrad has them where Python and the loader look) */
    char dir[PATH_MAX - 32];
    s_self_dir(dir, sizeof dir);
    snprintf(cl->libpath, sizeof cl->libpath, "%s/../common/libmqgrad.so", dir);
    if (access(cl->libpath, R_OK) != 0)
        cl->libpath[0] = '\0';
    snprintf(cl->pythonpath, sizeof cl->pythonpath, "%s/python", MQGRAD_SOURCE_DIR);
    if (!MQGRAD_SOURCE_DIR[0] || access(cl->pythonpath, R_OK) != 0)
        cl->pythonpath[0] = '\0';
    int sport = s_free_port(), aport = s_free_port(), hport = s_free_port();
    if (sport < 0 || aport < 0 || hport < 0) {
        mq_err_set("no free TCP port on 127.0.0.1: %s", strerror(errno));
        return -1;
    }
    snprintf(cl->sched_ep, sizeof cl->sched_ep, "tcp://127.0.0.1:%d", sport);
    snprintf(cl->agent_ep, sizeof cl->agent_ep, "tcp://127.0.0.1:%d", aport);
    cl->http_port = hport;
    cl->with_agent = strcmp(o->policy, "none") != 0 && !s_levelless(o);
    return 0;
}

static void s_agent_args(const mq_local_opts_t *o, const s_cluster_t *cl, s_args_t *a)
{
    char http[16], state[PATH_MAX + 16], extra[sizeof o->agent_args];
    s_args_init(a, cl->exe[S_AGENT]);
    snprintf(http, sizeof http, "%d", cl->http_port);
    snprintf(state, sizeof state, "%s/agent.state", o->run_dir);
    s_fwd(a, "--bind", cl->agent_ep);
    s_fwd(a, "--http-port", http);
    s_fwd(a, "--http-bind", "127.0.0.1");
    s_fwd(a, "--policy", o->policy);
    s_fwd(a, "--state", state);
    snprintf(extra, sizeof extra, "%s", o->agent_args);
    for (char *save, *t = strtok_r(extra, " ", &save); t; t = strtok_r(NULL, " ", &save))
        s_arg(a, t);
}

static void s_scheduler_args(const mq_local_opts_t *o, const s_cluster_t *cl, s_child_t *c,
                             s_args_t *a)
{
    char w[24], s[24], bits[8] = "2";
    snprintf(w, sizeof w, "%ld", o->workers);
    snprintf(s, sizeof s, "%ld", o->servers);
    bool fp32 = strcmp(o->policy, "none") == 0;
    if (strncmp(o->policy, "fixed:", 6) == 0) /* start at K, not at the agent's n_0 */
        snprintf(bits, sizeof bits, "%.2s", o->policy + 6);
    s_args_init(a, cl->exe[S_SCHEDULER]);
    s_fwd(a, "--bind", cl->sched_ep);
    s_fwd(a, "--workers", w);
    s_fwd(a, "--servers", s);
    s_fwd(a, "--run-dir", o->run_dir);
    s_fwd(a, "--bits", bits);
    if (fp32)
        s_fwd(a, "--codec", "none");
    else if (cl->with_agent)
        s_fwd(a, "--agent", cl->agent_ep);
    s_fwd(a, "--model", o->model[0] ? o->model : o->worker_exec[0] ? "external" : NULL);
    s_fwd(a, "--dataset", o->dataset);
    s_fwd(a, "--iterations", o->iterations);
    s_fwd(a, "--time-budget", o->time_budget);
    s_fwd(a, "--eval-every", o->eval_every);
    s_fwd(a, "--eval-limit", o->eval_limit);
    s_fwd(a, "--final-eval-limit", o->final_eval_limit);
    s_fwd(a, "--diverge-factor", o->diverge_factor);
    s_fwd(a, "--diverge-patience", o->diverge_patience);
    s_fwd(a, "--learn-within", o->learn_within);
    s_fwd(a, "--on-divergence", o->on_divergence);
    s_fwd(a, "--guard-spike", o->guard_spike);
    s_fwd(a, "--guard-iters", o->guard_iters);
    s_fwd(a, "--guard-bits", o->guard_bits);
    s_fwd(a, "--batch", o->batch);
    s_fwd(a, "--lr", o->lr);
    s_fwd(a, "--lr-decay", o->lr_decay);
    s_fwd(a, "--seed", o->seed);
    s_fwd(a, "--link-mbps", o->link_mbps);
    s_fwd(a, "--link", o->link);
    s_fwd(a, "--clock", o->clock);
    if (!fp32)
        s_fwd(a, "--codec", o->codec);
    s_fwd(a, "--optimizer", o->optimizer);
    s_fwd(a, "--bucket", o->bucket);
    s_fwd(a, "--threshold", o->threshold);
    if (o->stochastic)
        s_arg(a, "--stochastic");
    if (o->error_feedback)
        s_arg(a, "--error-feedback");
    s_fwd(a, "--progress-every", o->quiet ? "0" : o->progress_every);
    s_fwd(a, "--min-workers", o->min_workers);
    s_fwd(a, "--heartbeat-timeout", o->heartbeat_timeout);
    s_fwd(a, "--checkpoint-every", o->checkpoint_every);
    s_fwd(a, "--stragglers", o->stragglers);
    if (o->resume[0])
        s_arg(a, "--resume");
    s_http_flags(o, c, true, a);
}

/* Servers keep their checkpoints in RUN/checkpoints. */
static void s_server_args(const mq_local_opts_t *o, const s_cluster_t *cl, s_child_t *c,
                          s_args_t *a)
{
    char ckpt[PATH_MAX];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints", o->run_dir);
    s_args_init(a, cl->exe[S_SERVER]);
    s_fwd(a, "--scheduler", cl->sched_ep);
    s_fwd(a, "--bind", "tcp://127.0.0.1:*");
    s_fwd(a, "--checkpoint-dir", ckpt);
    s_http_flags(o, c, false, a);
}

static void s_worker_args(const mq_local_opts_t *o, const s_cluster_t *cl, s_child_t *c,
                          s_args_t *a)
{
    s_args_init(a, cl->exe[S_WORKER]);
    s_fwd(a, "--scheduler", cl->sched_ep);
    s_fwd(a, "--data-dir", o->data_dir);
    s_fwd(a, "--threads", o->threads);
    s_http_flags(o, c, false, a);
}

/* A NAME=VALUE for the child's environment, its bytes in A's buffer. */
static void s_env(s_args_t *a, const char *name, const char *value)
{
    size_t len = strlen(name) + strlen(value) + 2;
    if (a->nenv >= (int)(sizeof a->env / sizeof a->env[0]) || a->used + len > sizeof a->buf) {
        a->full = true;
        return;
    }
    a->env[a->nenv] = a->buf + a->used;
    snprintf(a->env[a->nenv++], len, "%s=%s", name, value);
    a->used += len;
}

/* --worker-exec: the worker's flags (s_worker_args, checked by the preflight) become the
 * MQGRAD_* variables libmqgrad reads them from (every worker flag has one: "--data-dir" is
 * MQGRAD_DATA_DIR), and the command runs under sh -c "exec ...". */
static void s_exec_worker(const mq_local_opts_t *o, const s_cluster_t *cl, s_args_t *a)
{
    static s_args_t flags;
    flags = *a;
    s_args_init(a, "/bin/sh");
    for (int i = 1; i + 1 < flags.n; i += 2) {
        char name[64] = "MQGRAD_";
        size_t k = 7;
        for (const char *f = flags.v[i] + 2; *f && k + 1 < sizeof name; f++)
            name[k++] = *f == '-' ? '_' : (char)toupper((unsigned char)*f);
        name[k] = '\0';
        s_env(a, name, flags.v[i + 1]);
    }
    if (cl->pythonpath[0]) {
        const char *old = getenv("PYTHONPATH");
        char path[PATH_MAX + 512];
        snprintf(path, sizeof path, "%s%s%s", cl->pythonpath, old && old[0] ? ":" : "",
                 old ? old : "");
        s_env(a, "PYTHONPATH", path);
    }
    if (cl->libpath[0])
        s_env(a, "MQGRAD_LIB", cl->libpath);
    if (o->threads[0]) { /* the BLAS a PyTorch calls has pools of its own: as many threads */
        s_env(a, "OPENBLAS_NUM_THREADS", o->threads);
        s_env(a, "OMP_NUM_THREADS", o->threads);
    }
    /* exec: the program is the child itself, so the signals mqgrad local sends (SIGTERM to
     * stop, SIGKILL) reach it, not a shell that would die and leave it behind */
    char cmd[sizeof o->worker_exec + 8];
    snprintf(cmd, sizeof cmd, "exec %s", o->worker_exec);
    s_arg(a, "-c");
    s_arg(a, cmd);
}

/* Whether --worker-exec's program (its first word) can be run: a path that is executable or
 * a file, or a name found on PATH. */
static int s_check_exec(const char *cmd)
{
    char word[PATH_MAX];
    size_t n = strcspn(cmd + strspn(cmd, " \t"), " \t");
    snprintf(word, sizeof word, "%.*s", (int)n, cmd + strspn(cmd, " \t"));
    if (!word[0] || strchr(word, '/'))
        return word[0] && access(word, R_OK) == 0 ? 0 : -1;
    char full[PATH_MAX];
    return s_on_path(word, full, sizeof full);
}

/* Every flag each child will be started with, checked here by that service's own parser
 * (the code the child runs on them) before anything starts or is written: a value a child
 * would refuse is refused now, with exit 2 and the service's words naming the flag. The
 * keys are checked as insecure: they are this run's own, made after this check. The data
 * set's files are looked for where the workers will look. */
static int s_preflight(const mq_local_opts_t *o, s_cluster_t *cl)
{
    static s_args_t a;
    s_child_t scratch = {0};
    int rc = 0;
    s_clear_key_env();
    setenv("MQGRAD_INSECURE", "1", 1);
    if (cl->with_agent) {
        static mq_agent_config_t ac;
        s_agent_args(o, cl, &a);
        a.v[0] = "mqgrad local";
        if (!a.full && mq_agent_config_parse(&ac, a.n, a.v) != 0) {
            if (o->agent_args[0])
                fprintf(stderr, "mqgrad local: (the agent's flags: --policy and --agent-args "
                                "'%s')\n", o->agent_args);
            rc = 2;
        }
    }
    if (rc == 0) {
        s_scheduler_args(o, cl, &scratch, &a);
        a.v[0] = "mqgrad local";
        rc = a.full ? 2 : mq_scheduler_config_parse(&cl->sched_cfg, a.n, a.v);
    }
    if (rc == 0) {
        static mq_server_config_t sc;
        s_server_args(o, cl, &scratch, &a);
        a.v[0] = "mqgrad local";
        rc = a.full ? 2 : mq_server_config_parse(&sc, a.n, a.v);
    }
    static mq_worker_config_t wc;
    if (rc == 0) {
        s_worker_args(o, cl, &scratch, &a);
        a.v[0] = "mqgrad local";
        rc = a.full ? 2 : mq_worker_config_parse(&wc, a.n, a.v);
    }
    if (rc == 0 && o->worker_exec[0]) {
        s_exec_worker(o, cl, &a);
        if (s_check_exec(o->worker_exec) != 0) {
            fprintf(stderr, "mqgrad local: --worker-exec '%s': its program is not found (not a "
                            "file, nor a command on PATH)\n", o->worker_exec);
            rc = 2;
        }
    }
    if (a.full)
        fprintf(stderr, "mqgrad local: too many flags or values too long for one service\n");
    if (rc == 0 && mq_dataset_check(cl->sched_cfg.dataset, wc.data_dir) != 0) {
        fprintf(stderr, "mqgrad local: --dataset %s: %s\n", cl->sched_cfg.dataset,
                mq_err_last());
        rc = 2;
    }
    unsetenv("MQGRAD_INSECURE");
    return rc == 1 ? 2 : rc; /* 1 would be --help, which no forwarded flag is */
}

int mq_local_check(const mq_local_opts_t *o)
{
    static s_cluster_t cl;
    free(cl.kids);
    memset(&cl, 0, sizeof cl);
    if (s_plan(o, &cl) != 0) {
        fprintf(stderr, "mqgrad local: %s\n", mq_err_last());
        return 2;
    }
    return s_preflight(o, &cl);
}

static int s_start_scheduler(const mq_local_opts_t *o, s_cluster_t *cl, const char *logdir)
{
    static s_args_t a;
    cl->sched = cl->n;
    s_child_t *c = s_new_child(cl, "scheduler", 0);
    s_scheduler_args(o, cl, c, &a);
    return s_spawn(c, &a, logdir, true);
}

/* Starts C (a worker, a server or the agent) with its role's flags, anew or again. */
static int s_spawn_node(const mq_local_opts_t *o, s_cluster_t *cl, s_child_t *c,
                        const char *logdir)
{
    static s_args_t a;
    if (c->worker >= 0) {
        s_worker_args(o, cl, c, &a);
        if (o->worker_exec[0])
            s_exec_worker(o, cl, &a);
    } else if (c->server >= 0) {
        s_server_args(o, cl, c, &a);
    } else { /* the agent */
        s_agent_args(o, cl, &a);
        c->http = o->http_port ? cl->http_port : 0;
    }
    c->done = false;
    c->code = 0;
    int rc = s_spawn(c, &a, logdir, false);
    s_write_targets(o, cl);
    return rc;
}

static int s_start_agent(const mq_local_opts_t *o, s_cluster_t *cl, const char *logdir)
{
    cl->agent = cl->n;
    return s_spawn_node(o, cl, s_new_child(cl, "agent", 0), logdir);
}

/* The agent C died (the run goes on without it, by design): it is started again, at most
 * --restarts times, on a new HTTP port (a port picked free may be taken by another program
 * before the agent binds it); not one that refused its configuration. 0 if it was. */
static int s_restart_agent(const mq_local_opts_t *o, s_cluster_t *cl, s_child_t *c)
{
    char logdir[PATH_MAX];
    if (c->code == 2 || c->restarts >= o->restarts)
        return -1;
    int hport = s_free_port();
    if (hport > 0)
        cl->http_port = hport;
    snprintf(logdir, sizeof logdir, "%s/logs", o->run_dir);
    c->restarts++;
    return s_spawn_node(o, cl, c, logdir);
}

static int s_start_nodes(const mq_local_opts_t *o, s_cluster_t *cl, const char *logdir)
{
    for (long i = 0; i < o->servers; i++) {
        s_child_t *c = s_new_child(cl, "server-%ld", i);
        c->server = i;
        if (s_spawn_node(o, cl, c, logdir) != 0)
            return -1;
    }
    for (long i = 0; i < o->workers; i++) {
        s_child_t *c = s_new_child(cl, "worker-%ld", i);
        c->worker = i;
        if (s_spawn_node(o, cl, c, logdir) != 0)
            return -1;
    }
    return 0;
}

/* Reaps exited children without blocking; returns the index of one that exited, or -1. */
static int s_reap(s_cluster_t *cl)
{
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0)
        return -1;
    for (int i = 0; i < cl->n; i++)
        if (cl->kids[i].pid == pid) {
            cl->kids[i].done = true;
            cl->kids[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            return i;
        }
    return -1;
}

/* Sends SIG to every running child, then waits up to GRACE seconds before SIGKILL. */
static void s_stop_all(s_cluster_t *cl, int sig, double grace)
{
    for (int i = 0; i < cl->n; i++)
        if (!cl->kids[i].done && cl->kids[i].pid > 0)
            kill(cl->kids[i].pid, sig);
    double end = mq_now_s() + grace;
    for (;;) {
        while (s_reap(cl) >= 0)
            ;
        bool left = false;
        for (int i = 0; i < cl->n; i++)
            left |= !cl->kids[i].done && cl->kids[i].pid > 0;
        if (!left)
            return;
        if (mq_now_s() > end)
            break;
        usleep(50000);
    }
    for (int i = 0; i < cl->n; i++)
        if (!cl->kids[i].done && cl->kids[i].pid > 0) {
            fprintf(stderr, "mqgrad local: %s did not stop within %.0f s; killing it\n",
                    cl->kids[i].name, grace);
            kill(cl->kids[i].pid, SIGKILL);
            waitpid(cl->kids[i].pid, NULL, 0);
            cl->kids[i].done = true;
            cl->kids[i].code = 128 + SIGKILL;
        }
}

static void s_show_tail(const s_child_t *c)
{
    char *data;
    size_t len;
    if (mq_read_file(c->log, &data, &len) != 0)
        return;
    const char *p = data + len;
    for (int lines = 0; p > data && lines < 11; p--)
        lines += p[-1] == '\n';
    fprintf(stderr, "--- last lines of %s ---\n%s", c->log, p);
    free(data);
}
/* The last line of C's log that says something: what a process that died last said. SETUP,
 * when not NULL, tells whether it died before it was ready (its setup failed: no "ready:"
 * line since it was last started). */
static void s_last_line(const s_child_t *c, char *buf, size_t len, bool *setup)
{
    char *data;
    size_t n;
    buf[0] = '\0';
    if (setup)
        *setup = true;
    if (mq_read_file(c->log, &data, &n) != 0)
        return;
    if (setup && c->log_start >= 0 && (size_t)c->log_start < n)
        *setup = !strstr(data + c->log_start, "] ready: ");
    while (n > 0 && (data[n - 1] == '\n' || data[n - 1] == ' '))
        n--;
    size_t start = n;
    while (start > 0 && data[start - 1] != '\n')
        start--;
    const char *line = data + start, *tag = strstr(line, "] ");
    /* The log's prefix ("E 12:00:00.000 [worker 3] ") differs from death to death: the
     * message alone tells whether a node failed the same way again. */
    if (n - start > 16 && line[1] == ' ' && line[4] == ':' && line[15] == '[' && tag &&
        tag < data + n)
        line = tag + 2;
    snprintf(buf, len, "%.*s", (int)(data + n - line), line);
    free(data);
}

/* What the run achieved, in a few lines (mqgrad summary RUN_DIR prints the same); for a run
 * that ended before the scheduler wrote its files, the status and reason that summary.json
 * holds. */
static void s_print_summary(const mq_local_opts_t *o, const char *status, const char *reason)
{
    char config[PATH_MAX];
    snprintf(config, sizeof config, "%s/config.json", o->run_dir);
    fflush(stdout);
    if (access(config, F_OK) != 0 && status)
        printf("run %s before it started: %s\nfiles: %s/{summary.json,logs/}\n",
               strcmp(status, "failed") == 0 ? "FAILED" : status, reason, o->run_dir);
    else if (mq_run_summary_print(o->run_dir, stdout) != 0)
        fprintf(stderr, "mqgrad local: no summary: %s\n", mq_err_last());
    fflush(stdout);
}

/* Writes STATUS and REASON into RUN/summary.json, keeping what the scheduler's summary says
 * of the run, or from the run's settings when it wrote none. OVERRIDE false keeps a summary
 * the scheduler wrote as it is (its own status and reason are closer to the cause). */
static void s_end_summary(const mq_local_opts_t *o, const s_cluster_t *cl, const char *status,
                          const char *reason, bool override)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/summary.json", o->run_dir);
    if (!override && access(path, F_OK) == 0)
        return;
    const mq_scheduler_config_t *c = &cl->sched_cfg;
    mq_summary_t s = {
        .final_loss = NAN, .final_test_acc = NAN, .final_sparsity = NAN,
        .policy = o->policy, .model = c->model, .dataset = c->dataset,
        .workers = (int)c->workers, .servers = (int)c->servers, .seed = (uint64_t)c->seed,
        .link_mbps = c->link_mbps, .clock = c->clock,
    };
    if (mq_summary_set_status(o->run_dir, status, reason, &s) != 0)
        fprintf(stderr, "mqgrad local: %s\n", mq_err_last());
}

/* The --resume hint, only where it helps: the run has a checkpoint to go back to, and did
 * not fail on its configuration (which would fail again). */
static void s_resume_hint(const mq_local_opts_t *o, bool config_failure)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/checkpoint.json", o->run_dir);
    if (!config_failure && access(path, F_OK) == 0)
        fprintf(stderr, "mqgrad local: mqgrad local --resume %s continues the run from its "
                        "last checkpoint\n", o->run_dir);
}

/* Ends the run as failed, for REASON (C is the process it is about, or NULL): its last log
 * lines, every service stopped, summary.json saying why. Returns 1. */
static int s_fail_run(const mq_local_opts_t *o, s_cluster_t *cl, const s_child_t *c,
                      const char *reason, bool config_failure)
{
    fprintf(stderr, "mqgrad local: %s; stopping the cluster\n", reason);
    if (c)
        s_show_tail(c);
    s_stop_all(cl, SIGTERM, 10);
    s_end_summary(o, cl, "failed", reason, true);
    s_print_summary(o, "failed", reason);
    fprintf(stderr, "mqgrad local: the run failed: %s\n", reason);
    s_resume_hint(o, config_failure);
    return 1;
}

typedef enum { S_GOES_ON, S_FAILS_CONFIG, S_FAILS } s_verdict_t;

/* A worker or server died (not on the run's STOP): the scheduler takes a worker out of the
 * run, or takes the run back to its checkpoint for a server; the node is started again, at
 * most --restarts times, and joins. Not restarted: a node the scheduler refused (exit 4), one
 * that refused its configuration (exit 2) or failed its setup the same way as the last time
 * (a restart will not mend either). The run cannot go on after a configuration refused,
 * without a server that is not restarted (unless the scheduler refused it: its shard is
 * another's), or with no worker left to join it: then REASON says why. */
static s_verdict_t s_node_died(const mq_local_opts_t *o, s_cluster_t *cl, s_child_t *c,
                               char *reason, size_t len)
{
    char logdir[PATH_MAX], last[sizeof c->last];
    snprintf(logdir, sizeof logdir, "%s/logs", o->run_dir);
    bool setup;
    s_last_line(c, last, sizeof last, &setup);
    bool again = c->code != MQ_EXIT_REFUSED && c->code != 2 && c->restarts < o->restarts &&
                 !(setup && c->restarts > 0 && strcmp(last, c->last) == 0);
    if (c->code == MQ_EXIT_REFUSED)
        snprintf(reason, len, "%s was refused by the scheduler: %s", c->name, last);
    else if (c->code == 2)
        snprintf(reason, len, "%s refused its configuration (exit 2): %s", c->name, last);
    else if (!again && c->restarts < o->restarts)
        snprintf(reason, len, "%s failed its setup the same way %s: %s", c->name,
                 c->restarts > 1 ? "each time" : "twice", last);
    else if (!again)
        snprintf(reason, len, "%s died (code %d) after %ld restarts (--restarts): %s", c->name,
                 c->code, c->restarts, last);
    snprintf(c->last, sizeof c->last, "%s", last);
    if (again) {
        c->restarts++;
        fprintf(stderr, "mqgrad local: %s died (code %d); %s; it is started again (%ld/%ld)\n",
                c->name, c->code,
                c->worker >= 0 ? "the run goes on without it"
                               : "the run goes back to its last checkpoint",
                c->restarts, o->restarts);
        if (s_spawn_node(o, cl, c, logdir) == 0)
            return S_GOES_ON;
        snprintf(reason, len, "cannot restart %s: %s", c->name, mq_err_last());
        return S_FAILS;
    }
    if (c->code == 2)
        return S_FAILS_CONFIG; /* every node of a role gets the same configuration */
    fprintf(stderr, "mqgrad local: %s; not restarted\n", reason);
    if (c->server >= 0) /* refused: its shard is another's; else the run cannot go on */
        return c->code == MQ_EXIT_REFUSED ? S_GOES_ON : S_FAILS;
    for (int i = 0; i < cl->n; i++)
        if (cl->kids[i].worker >= 0 && !cl->kids[i].done)
            return S_GOES_ON;
    char why[1200];
    snprintf(why, sizeof why, "no worker can join the run: %s", reason);
    snprintf(reason, len, "%.*s", (int)len - 1, why);
    return S_FAILS;
}

/* Watches the children until the scheduler finishes, one fails, or a signal comes. */
static int s_watch(const mq_local_opts_t *o, s_cluster_t *cl)
{
    char reason[1024];
    while (!s_stop_signal) {
        int i = s_reap(cl);
        if (i < 0) {
            usleep(50000);
            continue;
        }
        s_child_t *c = &cl->kids[i];
        if (i == cl->sched && (c->code == 0 || c->code == MQ_EXIT_DIVERGED)) {
            s_stop_all(cl, SIGTERM, 20); /* nodes already stop on the scheduler's word */
            s_print_summary(o, NULL, NULL);
            return c->code;
        }
        if (i == cl->agent) { /* by design the run goes on without its agent */
            int code = c->code;
            if (code != 0 && s_restart_agent(o, cl, c) == 0)
                fprintf(stderr, "mqgrad local: the agent exited (code %d); it is started again "
                                "(%ld/%ld), training goes on meanwhile\n",
                        code, c->restarts, o->restarts);
            else
                fprintf(stderr, "mqgrad local: the agent exited (code %d); training goes on "
                                "with the last bit-width\n", code);
            continue;
        }
        if (c->code == 0 && i != cl->sched)
            continue; /* a node that got STOP a moment before the scheduler exits */
        if (c->worker >= 0 || c->server >= 0) {
            s_verdict_t v = s_node_died(o, cl, c, reason, sizeof reason);
            if (v == S_GOES_ON)
                continue;
            return s_fail_run(o, cl, c, reason, v == S_FAILS_CONFIG);
        }
        char last[256];
        s_last_line(c, last, sizeof last, NULL);
        fprintf(stderr, "mqgrad local: %s (pid %d) failed with exit code %d; stopping the "
                        "cluster\n", c->name, (int)c->pid, c->code);
        s_show_tail(c);
        s_stop_all(cl, SIGTERM, 10);
        snprintf(reason, sizeof reason, "the %s exited with code %d: %s", c->name, c->code,
                 last);
        s_end_summary(o, cl, "failed", reason, false); /* the scheduler's own, if it wrote one */
        s_print_summary(o, "failed", reason);
        s_resume_hint(o, c->code == 2);
        return 1;
    }
    fprintf(stderr, "\nmqgrad local: interrupted; stopping every service\n");
    s_stop_all(cl, SIGTERM, 10);
    int unclean = 0;
    for (int i = 0; i < cl->n; i++)
        if (cl->kids[i].code != 0) {
            fprintf(stderr, "mqgrad local: %s exited with code %d\n", cl->kids[i].name,
                    cl->kids[i].code);
            unclean++;
        }
    snprintf(reason, sizeof reason, "stopped by %s", strsignal(s_stop_signal));
    s_end_summary(o, cl, "interrupted", reason, false);
    s_print_summary(o, "interrupted", reason);
    s_resume_hint(o, false);
    return unclean ? 1 : 130;
}

/* Remembers the flags the run was started with, so --resume can start it the same way. */
static int s_save_args(const mq_local_opts_t *o, int argc, char **argv)
{
    char path[PATH_MAX], text[8192];
    size_t off = 0;
    snprintf(path, sizeof path, "%s/local.args", o->run_dir);
    for (int i = 1; i < argc && off < sizeof text; i++) {
        if (strcmp(argv[i], "--run-dir") == 0 && i + 1 < argc) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--run-dir=", 10) == 0)
            continue;
        if (strcmp(argv[i], "--servers") == 0 && i + 1 < argc) { /* written below */
            i++;
            continue;
        }
        if (strncmp(argv[i], "--servers=", 10) == 0)
            continue;
        off += (size_t)snprintf(text + off, sizeof text - off, "%s\n", argv[i]);
    }
    /* The count this run was started with, whatever the default is when it resumes. */
    if (off < sizeof text)
        off += (size_t)snprintf(text + off, sizeof text - off, "--servers=%ld\n", o->servers);
    if (off >= sizeof text) {
        mq_err_set("too many flags to remember");
        return -1;
    }
    return mq_write_file_atomic(path, text, off);
}
int mq_local_run(const mq_local_opts_t *o, int argc, char **argv)
{
    char logdir[PATH_MAX], config[PATH_MAX];
    snprintf(logdir, sizeof logdir, "%s/logs", o->run_dir);
    snprintf(config, sizeof config, "%s/config.json", o->run_dir);
    if (!o->resume[0] && access(config, F_OK) == 0) {
        fprintf(stderr, "mqgrad local: %s already holds a run; pick another --run-dir, or "
                        "continue it with mqgrad local --resume %s\n", o->run_dir, o->run_dir);
        return 2;
    }
    static s_cluster_t cl;
    free(cl.kids);
    memset(&cl, 0, sizeof cl);
    cl.agent = cl.sched = -1;
    if (s_plan(o, &cl) != 0) {
        fprintf(stderr, "mqgrad local: %s\n", mq_err_last());
        return 2;
    }
    int rc = s_preflight(o, &cl);
    if (rc != 0)
        return rc;
    if (mq_mkdirs(logdir) != 0 || (!o->resume[0] && argv && s_save_args(o, argc, argv) != 0)) {
        fprintf(stderr, "mqgrad local: --run-dir %s: %s\n", o->run_dir, mq_err_last());
        return 2;
    }
    struct sigaction sa = {.sa_handler = s_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    s_stop_signal = 0;
    char keys[PATH_MAX];
    if (s_keys(o, keys, sizeof keys) != 0) {
        fprintf(stderr, "mqgrad local: keys: %s\n", mq_err_last());
        return 2;
    }
    if ((cl.with_agent && s_start_agent(o, &cl, logdir) != 0) ||
        s_start_scheduler(o, &cl, logdir) != 0 || s_start_nodes(o, &cl, logdir) != 0) {
        char reason[512];
        snprintf(reason, sizeof reason, "cannot start the services: %s", mq_err_last());
        return s_fail_run(o, &cl, NULL, reason, false);
    }
    if (!o->quiet) {
        printf("mqgrad local: %ld workers, %ld servers, %s %s; logs in %s\n", o->workers,
               o->servers, cl.with_agent ? "policy" : "codec",
               cl.with_agent ? o->policy : o->codec, logdir);
        if (cl.with_agent)
            printf("  ask the agent: %s%s%smqgrad bits%s --agent %s   or   curl -s "
                   "localhost:%d/bits\n",
                   keys[0] ? "MQGRAD_KEYS=" : "", keys, keys[0] ? " " : "",
                   keys[0] ? "" : " --insecure", cl.agent_ep, cl.http_port);
        if (o->http_port)
            printf("  metrics: http://127.0.0.1:%ld/metrics (every service's in "
                   "%s/prometheus-targets.json)   live view: mqgrad top --scheduler "
                   "127.0.0.1:%ld\n",
                   o->http_port, o->run_dir, o->http_port);
        fflush(stdout);
    }
    return s_watch(o, &cl);
}

int mq_cmd_local(int argc, char **argv)
{
    mq_local_opts_t o;
    int rc = mq_local_parse(&o, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    return mq_local_run(&o, argc, argv);
}
