/* `mqgrad experiment`: the paper's comparison (section 4.2) on this machine. Runs the same
 * local cluster once per method and seed (only the policy and the seed change), resumes an
 * interrupted experiment by skipping finished runs (completed or diverged: both are results),
 * then writes the report of all runs. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "cli.h"
#include "local.h"
#include "methods.h"
#include "mqgrad/rl.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/watch.h"
#include "report.h"

#define S_MAX_METHODS 16
#define S_MAX_SEEDS 32
#define S_ME "mqgrad experiment"

typedef struct {
    char methods[512], seeds[256], out[480], target_acc[24], checkpoints[256];
    char train_agent[24], agent_state[480];
    long episodes; /* --train-agent N; 0 = an experiment */
    mq_local_opts_t base;
    char method[S_MAX_METHODS][64];
    int n_methods;
    long seed[S_MAX_SEEDS];
    int n_seeds;
} s_opts_t;

/* One planned run. */
typedef struct {
    const char *method;
    long seed;
    char dir[512];
    enum { S_PENDING, S_DONE, S_FAILED } state;
    bool diverged; /* done, and diverged: a result, never a failure */
} s_run_t;

static volatile sig_atomic_t s_interrupted;

static void s_on_signal(int sig)
{
    (void)sig;
    s_interrupted = 1;
}

static void s_catch_signals(void)
{
    struct sigaction sa = {.sa_handler = s_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

#define S_EVAL_EVERY 5 /* rounds between evaluations, unless --eval-every */

static const char s_usage[] =
    "usage: mqgrad experiment [--methods LIST] [--seeds LIST] [--out DIR] [mqgrad local flags]\n"
    "Runs the same local cluster once per method and seed (only the method and the seed\n"
    "change) into OUT/<method>-seed<seed>, skipping runs that already completed or diverged\n"
    "(so an interrupted experiment resumes), then writes the report of all runs into\n"
    "OUT/report. A diverged run is a result (reported as such, exit 0), not a failure.\n"
    "A method is a policy (`mqgrad policy set --help` lists them; none = fp32), a preset\n"
    "below, or POLICY@CODEC[/OPTIMIZER] (fixed:3@qsgd:bucket=512, fixed:2@thresh/qrda:l1=1e-6).\n"
    "A method may end with \"+exact\" (mqgrad+exact, fixed:2+exact): the same policy with\n"
    "the paper-exact codec: one range per tensor slice, nearest rounding (--bucket 0, no\n"
    "--stochastic, no --error-feedback); none+exact is refused (fp32 has no codec).\n"
    "Every `mqgrad local` flag is accepted except --policy, --seed and --run-dir.\n"
    "Seeds: 1,2,3,4,5 unless --seeds. Every run evaluates every 5 rounds unless --eval-every\n"
    "(time to a target is read off the evaluations; their time is not training time).\n"
    "fixed:K methods run without the spike guard (a fixed\n"
    "baseline's bits do not move) unless --guard-spike is given, for every method.\n"
    "\n"
    "Training an agent across runs: --train-agent N runs N episodes of one learning\n"
    "policy (e.g. --methods learned) into OUT/episode-<k>-seed<s>, taking the --seeds in\n"
    "turn, every episode continuing one agent state, OUT/agent.state; it writes the agent's\n"
    "return per episode to OUT/returns.csv and OUT/returns.png (its learning curve), and\n"
    "resumes where it stopped. --agent-state FILE starts every run's agent from a copy of\n"
    "FILE (FILE itself is never written): deploy a trained agent on held-out seeds with\n"
    "--methods learned:epsilon=0 --agent-state OUT/agent.state --seeds 1,2,3.\n\n"
    "presets:\n";

/* Moves this command's own flags from ARGV into MINE, the rest (local's flags) into REST;
 * both keep argv[0]. */
static void s_split_args(int argc, char **argv, char **mine, int *nm, char **rest, int *nr)
{
    static const char *const own[] = {"--methods",     "--seeds",       "--out",
                                      "--target-acc",  "--checkpoints", "--train-agent",
                                      "--agent-state"};
    mine[0] = rest[0] = S_ME;
    *nm = *nr = 1;
    for (int i = 1; i < argc; i++) {
        bool is_mine = false;
        for (size_t k = 0; k < sizeof own / sizeof own[0] && !is_mine; k++) {
            size_t n = strlen(own[k]);
            if (strncmp(argv[i], own[k], n) == 0 && (argv[i][n] == '\0' || argv[i][n] == '='))
                is_mine = true;
        }
        if (!is_mine) {
            rest[(*nr)++] = argv[i];
            continue;
        }
        mine[(*nm)++] = argv[i];
        if (!strchr(argv[i], '=') && i + 1 < argc)
            mine[(*nm)++] = argv[++i];
    }
    mine[*nm] = rest[*nr] = NULL;
}

/* Splits LIST into method specs. A piece with '=' and no ':' continues the previous spec
 * ("mqgrad:epsilon=0.05,T=10"). Each spec must be "none" or a policy the agent accepts. */
static int s_parse_methods(s_opts_t *o)
{
    char copy[sizeof o->methods];
    snprintf(copy, sizeof copy, "%s", o->methods);
    o->n_methods = 0;
    for (char *save, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_methods > 0 && strchr(t, '=') && !strchr(t, ':')) {
            char *prev = o->method[o->n_methods - 1];
            size_t len = strlen(prev);
            snprintf(prev + len, sizeof o->method[0] - len, ",%s", t);
            continue;
        }
        if (o->n_methods == S_MAX_METHODS) {
            mq_err_set("--methods: at most %d methods", S_MAX_METHODS);
            return -1;
        }
        snprintf(o->method[o->n_methods++], sizeof o->method[0], "%s", t);
    }
    if (o->n_methods == 0) {
        mq_err_set("--methods: no method given");
        return -1;
    }
    for (int i = 0; i < o->n_methods; i++) {
        for (int j = 0; j < i; j++)
            if (strcmp(o->method[i], o->method[j]) == 0) {
                mq_err_set("--methods: '%s' is listed twice", o->method[i]);
                return -1;
            }
        mq_method_t m;
        if (mq_method_resolve(o->method[i], &m) != 0) {
            char why[300];
            snprintf(why, sizeof why, "%s", mq_err_last());
            mq_err_set("--methods: %s", why);
            return -1;
        }
    }
    return 0;
}

static int s_parse_seeds(s_opts_t *o)
{
    char copy[sizeof o->seeds];
    snprintf(copy, sizeof copy, "%s", o->seeds);
    o->n_seeds = 0;
    for (char *save, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_seeds == S_MAX_SEEDS) {
            mq_err_set("--seeds: at most %d seeds", S_MAX_SEEDS);
            return -1;
        }
        if (mq_parse_long("--seeds", t, 0, 1L << 62, &o->seed[o->n_seeds]) < 0)
            return -1;
        for (int j = 0; j < o->n_seeds; j++)
            if (o->seed[j] == o->seed[o->n_seeds]) {
                mq_err_set("--seeds: seed %s is listed twice", t);
                return -1;
            }
        o->n_seeds++;
    }
    if (o->n_seeds == 0) {
        mq_err_set("--seeds: no seed given");
        return -1;
    }
    return 0;
}

/* The numeric local flags are forwarded as text; check them now, not an hour into the run. */
static int s_check_local(const mq_local_opts_t *b, int nr, char **rest)
{
    static const char *const per_run[] = {"--policy", "--seed", "--run-dir"};
    for (int i = 1; i < nr; i++)
        for (size_t k = 0; k < 3; k++) {
            size_t n = strlen(per_run[k]);
            if (strncmp(rest[i], per_run[k], n) == 0 && (!rest[i][n] || rest[i][n] == '=')) {
                mq_err_set("%s is set per run by the experiment (use --methods, --seeds, --out)",
                           per_run[k]);
                return -1;
            }
        }
    const struct {
        const char *name, *value;
        double lo, hi;
    } nums[] = {{"--iterations", b->iterations, 0, 1e9}, {"--time-budget", b->time_budget, 0, 1e7},
                {"--eval-every", b->eval_every, 0, 1e9}, {"--eval-limit", b->eval_limit, 0, 1e7},
                {"--batch", b->batch, 1, 4096},          {"--lr", b->lr, 1e-9, 100},
                {"--lr-decay", b->lr_decay, 0, 1},
                {"--link-mbps", b->link_mbps, 0, 1e6},   {"--bucket", b->bucket, 0, 1e9},
                {"--threshold", b->threshold, 0, 1e12},  {"--threads", b->threads, 0, 256}};
    double v;
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (nums[i].value[0] &&
            mq_parse_double(nums[i].name, nums[i].value, nums[i].lo, nums[i].hi, &v) < 0)
            return -1;
    if (!b->iterations[0] && !b->time_budget[0]) {
        mq_err_set("give --iterations or --time-budget (every run needs an end)");
        return -1;
    }
    return 0;
}

/* --train-agent and --agent-state: a number of episodes, one method whose policy learns
 * across runs, a state file that exists and is an agent's. */
static int s_check_training(s_opts_t *o)
{
    if (o->agent_state[0] && access(o->agent_state, R_OK) != 0) {
        mq_err_set("--agent-state %s: %s", o->agent_state, strerror(errno));
        return -1;
    }
    if (!o->train_agent[0])
        return 0;
    if (mq_parse_long("--train-agent", o->train_agent, 1, 100000, &o->episodes) < 0)
        return -1;
    if (strlen(o->out) > 400) {
        mq_err_set("--out: at most 400 characters with --train-agent");
        return -1;
    }
    if (o->n_methods != 1) {
        mq_err_set("--train-agent trains one method, not %d (give --methods learned, or "
                   "learned:OPTIONS)",
                   o->n_methods);
        return -1;
    }
    mq_method_t m;
    if (mq_method_resolve(o->method[0], &m) != 0)
        return -1;
    mq_policy_t *p = mq_policy_new(m.policy, NULL);
    bool episodic = p && mq_policy_episodic(p);
    mq_policy_destroy(&p);
    if (!episodic) {
        mq_err_set("--train-agent: policy '%s' does not learn across runs (learned does)",
                   m.policy);
        return -1;
    }
    return 0;
}

/* 0 ok, 1 help printed, 2 bad usage (message printed). */
static int s_parse(s_opts_t *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    strcpy(o->methods, "mqgrad,mqgrad+exact,fixed:2,fixed:4,fixed:8,adaptive,schedule,none");
    strcpy(o->seeds, "1,2,3,4,5"); /* paired intervals need seeds: 3 tell little apart */
    strcpy(o->out, "experiment");
    const mq_flag_t flags[] = {
        {"methods", NULL, MQ_FLAG_STR, o->methods, sizeof o->methods, 0, 0,
         "comma-separated methods (above); METHOD+exact: "
         "the paper-exact codec: one range per tensor slice, nearest rounding"},
        {"seeds", NULL, MQ_FLAG_STR, o->seeds, sizeof o->seeds, 0, 0, "comma-separated seeds"},
        {"out", NULL, MQ_FLAG_STR, o->out, sizeof o->out, 0, 0, "experiment directory"},
        {"target-acc", NULL, MQ_FLAG_STR, o->target_acc, sizeof o->target_acc, 0, 0,
         "report: accuracy for the time-to-target table (default 0.85)"},
        {"checkpoints", NULL, MQ_FLAG_STR, o->checkpoints, sizeof o->checkpoints, 0, 0,
         "report: times (s) of the accuracy table (default 25..100% of the shortest run)"},
        {"train-agent", NULL, MQ_FLAG_STR, o->train_agent, sizeof o->train_agent, 0, 0,
         "N: train one learning policy over N runs (episodes), see above"},
        {"agent-state", NULL, MQ_FLAG_STR, o->agent_state, sizeof o->agent_state, 0, 0,
         "every run's agent starts from a copy of this state file"},
        {0},
    };
    char usage[sizeof s_usage + 2048];
    snprintf(usage, sizeof usage, "%s", s_usage);
    mq_method_help(usage + strlen(usage), sizeof usage - strlen(usage));
    char *mine[argc + 2], *rest[argc + 2];
    int nm, nr;
    s_split_args(argc, argv, mine, &nm, rest, &nr);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            mq_flags_usage(flags, usage, stdout);
            char *help[] = {"mqgrad local", "--help", NULL};
            printf("\nand the flags of `mqgrad local`:\n");
            mq_local_parse(&o->base, 2, help);
            return 1;
        }
    int rc = mq_flags_parse(flags, nm, mine, usage, NULL, 0, NULL);
    if (rc == 0)
        rc = mq_local_parse(&o->base, nr, rest);
    if (rc != 0)
        return rc;
    if (!o->base.eval_every[0]) /* the scheduler's own default (100) hides when a run got there */
        snprintf(o->base.eval_every, sizeof o->base.eval_every, "%d", S_EVAL_EVERY);
    double v;
    if (s_parse_methods(o) < 0 || s_parse_seeds(o) < 0 || s_check_local(&o->base, nr, rest) < 0 ||
        (o->target_acc[0] && mq_parse_double("--target-acc", o->target_acc, 0, 1, &v) < 0) ||
        s_check_training(o) < 0 || !o->out[0]) {
        fprintf(stderr, "%s: %s\n", S_ME, o->out[0] ? mq_err_last() : "--out: empty");
        return 2;
    }
    return 0;
}

/* Seed-major order, with fp32 first so the regime is known before the other runs. */
static s_run_t *s_plan(const s_opts_t *o, int *n)
{
    s_run_t *runs = calloc((size_t)(o->n_methods * o->n_seeds), sizeof *runs);
    if (!runs)
        return NULL;
    *n = 0;
    for (int s = 0; s < o->n_seeds; s++)
        for (int pass = 0; pass < 2; pass++)
            for (int m = 0; m < o->n_methods; m++) {
                bool fp32 = strcmp(o->method[m], "none") == 0;
                if (fp32 != (pass == 0))
                    continue;
                s_run_t *r = &runs[(*n)++];
                r->method = o->method[m];
                r->seed = o->seed[s];
                int len =
                    snprintf(r->dir, sizeof r->dir, "%s/%s-seed%ld", o->out, r->method, r->seed);
                for (char *p = r->dir + strlen(o->out) + 1; p < r->dir + len; p++)
                    if (*p == ':' || *p == ',' || *p == '=' || *p == '/')
                        *p = '-';
            }
    return runs;
}

/* Whether DIR holds a finished run: its summary says it completed, or that it diverged (a
 * result too, which running again would only repeat). Its final values in RUN if so (the
 * caller frees RUN). */
static bool s_finished(const char *dir, mq_rep_run_t *run)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/summary.json", dir);
    if (access(path, F_OK) != 0 || mq_rep_load_run(dir, run) < 0)
        return false;
    if (strcmp(run->status, "completed") == 0 || run->diverged)
        return true;
    mq_rep_run_free(run);
    return false;
}

/* An unfinished run directory is kept beside the new one (its agent state would otherwise be
 * resumed by the new run's agent). */
static int s_set_aside(const char *dir)
{
    if (access(dir, F_OK) != 0)
        return 0;
    char to[PATH_MAX];
    snprintf(to, sizeof to, "%s.incomplete-%ld", dir, (long)time(NULL));
    if (rename(dir, to) != 0) {
        mq_err_set("cannot move the unfinished run %s aside: %s", dir, strerror(errno));
        return -1;
    }
    printf("  (an unfinished %s was moved to %s)\n", dir, to);
    return 0;
}

/* The agent's exploration follows the run's seed too. */
static int s_agent_args(mq_local_opts_t *lo, long seed)
{
    char user[sizeof lo->agent_args];
    memcpy(user, lo->agent_args, sizeof user);
    if ((size_t)snprintf(lo->agent_args, sizeof lo->agent_args, "--seed %ld %s", seed, user) >=
        sizeof lo->agent_args) {
        mq_err_set("--agent-args is too long");
        return -1;
    }
    return 0;
}

/* Copies FROM to TO (atomically: TO is whole or untouched). */
static int s_copy_file(const char *from, const char *to)
{
    char *data;
    size_t len;
    if (mq_read_file(from, &data, &len) != 0)
        return -1;
    int rc = mq_write_file_atomic(to, data, len);
    free(data);
    return rc;
}

/* Runs one cluster with its chatter (summary, scheduler lines) in DIR/logs/local.log; its
 * agent starts from a copy of STATE when given (NULL: a new agent). */
/* The flags of `mqgrad local` for run R: the experiment's, with R's method and seed. -1 with
 * an error when the method is unknown. */
static int s_run_opts(const s_opts_t *o, const s_run_t *r, mq_local_opts_t *out)
{
    mq_local_opts_t lo = o->base;
    mq_method_t m;
    if (mq_method_resolve(r->method, &m) != 0)
        return -1;
    if (m.exact) {
        snprintf(lo.bucket, sizeof lo.bucket, "0");
        lo.stochastic = lo.error_feedback = false;
    }
    if (m.codec[0]) {
        snprintf(lo.codec, sizeof lo.codec, "%s", m.codec);
        if (strncmp(m.codec, "uniform", 7) != 0) /* uniform's shorthands do not apply */
            lo.bucket[0] = 0, lo.stochastic = false;
    }
    if (m.optimizer[0])
        snprintf(lo.optimizer, sizeof lo.optimizer, "%s", m.optimizer);
    snprintf(lo.policy, sizeof lo.policy, "%s", m.policy);
    /* A fixed baseline is fixed: the spike guard would raise its bits and make it another
     * method. It runs without the guard unless --guard-spike is given for every method. */
    if (strncmp(m.policy, "fixed:", 6) == 0 && !o->base.guard_spike[0])
        snprintf(lo.guard_spike, sizeof lo.guard_spike, "0");
    snprintf(lo.run_dir, sizeof lo.run_dir, "%s", r->dir);
    snprintf(lo.seed, sizeof lo.seed, "%ld", r->seed);
    lo.quiet = true;
    *out = lo;
    return 0;
}

/* Every run's flags, checked as `mqgrad local` checks them, before the first run starts. */
static int s_check_runs(const s_opts_t *o, const s_run_t *runs, int n)
{
    for (int i = 0; i < n; i++) {
        mq_local_opts_t lo;
        if (s_run_opts(o, &runs[i], &lo) != 0) {
            fprintf(stderr, "%s: %s\n", S_ME, mq_err_last());
            return 2;
        }
        if (mq_local_check(&lo) != 0) {
            fprintf(stderr, "%s: method %s would be refused (above); nothing was started\n",
                    S_ME, runs[i].method);
            return 2;
        }
    }
    return 0;
}

static int s_run_cluster(const s_opts_t *o, const s_run_t *r, const char *state)
{
    mq_local_opts_t lo;
    if (s_run_opts(o, r, &lo) != 0) { /* checked before the first run started */
        fprintf(stderr, "%s: %s\n", S_ME, mq_err_last());
        return 1;
    }
    char logdir[PATH_MAX], log[PATH_MAX + 16];
    snprintf(logdir, sizeof logdir, "%s/logs", r->dir);
    snprintf(log, sizeof log, "%s/local.log", logdir);
    char run_state[PATH_MAX];
    snprintf(run_state, sizeof run_state, "%s/agent.state", r->dir); /* where local puts it */
    if (s_agent_args(&lo, r->seed) < 0 || s_set_aside(r->dir) < 0 || mq_mkdirs(logdir) < 0 ||
        (state && s_copy_file(state, run_state) < 0)) {
        fprintf(stderr, "%s: %s\n", S_ME, mq_err_last());
        return 1;
    }
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0 && saved >= 0) {
        dup2(fd, STDOUT_FILENO);
        close(fd);
    }
    int rc = mq_local_run(&lo, 0, NULL);
    fflush(stdout);
    if (saved >= 0) {
        dup2(saved, STDOUT_FILENO);
        close(saved);
    }
    s_catch_signals(); /* mq_local_run installed its own handler */
    return rc;
}

static void s_fmt_duration(char *buf, size_t len, double s)
{
    if (s < 90)
        snprintf(buf, len, "%.0f s", s);
    else if (s < 5400)
        snprintf(buf, len, "%.0f min", s / 60);
    else
        snprintf(buf, len, "%.1f h", s / 3600);
}

static void s_fmt_result(char *buf, size_t len, const mq_rep_run_t *run)
{
    if (run->diverged)
        snprintf(buf, len, "DIVERGED at iteration %llu (%s rule)",
                 (unsigned long long)run->div_iter, run->div_rule);
    else if (isnan(run->final_acc))
        snprintf(buf, len, "loss %.4f, test accuracy N/A", run->final_loss);
    else
        snprintf(buf, len, "loss %.4f, test accuracy %.2f%%", run->final_loss,
                 100 * run->final_acc);
}

/* fp32's communication vs computation per iteration, worker means: communication is the push
 * (encode_ms: fp32 encodes nothing, so this is sending through the emulated link) plus the
 * wait for the servers' replies (wait_ms); computation is the forward/backward (compute_ms). */
static void s_print_regime(const s_run_t *r)
{
    mq_rep_run_t run;
    if (mq_rep_load_run(r->dir, &run) < 0) {
        fprintf(stderr, "%s: regime: %s\n", S_ME, mq_err_last());
        return;
    }
    double push = 0, wait = 0, compute = 0;
    for (size_t i = 0; i < run.n_rows; i++) {
        push += run.rows[i].encode_ms / (double)run.n_rows;
        wait += run.rows[i].wait_ms / (double)run.n_rows;
        compute += run.rows[i].compute_ms / (double)run.n_rows;
    }
    if (run.n_rows > 0 && compute > 0)
        printf("fp32 communication/computation ratio: %.2f (per iteration: communication %.0f ms "
               "= push %.0f + wait %.0f; computation %.0f ms; mean of %zu iterations of %s)\n",
               (push + wait) / compute, push + wait, push, wait, compute, run.n_rows, r->dir);
    mq_rep_run_free(&run);
    fflush(stdout);
}

/* The progress line of run K of N, or its failure. */
static void s_after_run(s_run_t *r, int k, int n, int rc, double elapsed, double left)
{
    mq_rep_run_t run;
    char res[160] = "", dur[32], eta[48] = "";
    s_fmt_duration(dur, sizeof dur, elapsed);
    if (left >= 0) {
        char l[32];
        s_fmt_duration(l, sizeof l, left);
        snprintf(eta, sizeof eta, "; about %s left", left > 0 ? l : "0 s");
    }
    /* mqgrad local's exit 3 says the run diverged; its summary.json must say so too. */
    if ((rc == 0 || rc == MQ_EXIT_DIVERGED) && s_finished(r->dir, &run)) {
        r->state = S_DONE;
        r->diverged = run.diverged;
        s_fmt_result(res, sizeof res, &run);
        mq_rep_run_free(&run);
        printf("[%d/%d] %s seed %ld: %s, %s%s\n", k, n, r->method, r->seed, res, dur, eta);
    } else {
        r->state = S_FAILED;
        printf("[%d/%d] %s seed %ld: FAILED (exit %d%s; logs in %s/logs), %s%s\n", k, n,
               r->method, r->seed, rc,
               rc == MQ_EXIT_DIVERGED ? ": diverged, but its summary.json does not say so" : "",
               r->dir, dur, eta);
    }
    fflush(stdout);
}

/* Runs every pending run; returns 130 if interrupted, else 0. */
static int s_run_all(const s_opts_t *o, s_run_t *runs, int n)
{
    int pending = 0, executed = 0;
    double spent = 0;
    bool regime_shown = false;
    for (int i = 0; i < n; i++) {
        mq_rep_run_t run;
        if (s_finished(runs[i].dir, &run)) {
            runs[i].state = S_DONE;
            mq_rep_run_free(&run);
        } else
            pending++;
    }
    printf("%s: %d methods x %d seeds = %d runs in %s (%d already done)\n", S_ME, o->n_methods,
           o->n_seeds, n, o->out, n - pending);
    fflush(stdout);
    for (int i = 0; i < n && !s_interrupted; i++) {
        s_run_t *r = &runs[i];
        if (r->state == S_DONE) {
            mq_rep_run_t run;
            char res[160] = "";
            if (s_finished(r->dir, &run)) {
                r->diverged = run.diverged;
                s_fmt_result(res, sizeof res, &run);
                mq_rep_run_free(&run);
            }
            printf("[%d/%d] %s seed %ld: already done (%s), skipped\n", i + 1, n, r->method,
                   r->seed, res);
        } else {
            double t0 = mq_now_s();
            int rc = s_run_cluster(o, r, o->agent_state[0] ? o->agent_state : NULL);
            if (rc == 130 || s_interrupted)
                return 130;
            double dt = mq_now_s() - t0;
            spent += dt;
            executed++;
            s_after_run(r, i + 1, n, rc, dt, spent / executed * (pending - executed));
        }
        if (!regime_shown && strcmp(r->method, "none") == 0 && r->state == S_DONE) {
            s_print_regime(r);
            regime_shown = true;
        }
    }
    return s_interrupted ? 130 : 0;
}

/* The report of the completed runs, by the report command itself. */
static int s_report(const s_opts_t *o, const s_run_t *runs, int n)
{
    char out[PATH_MAX], title[512];
    snprintf(out, sizeof out, "%s/report", o->out);
    const mq_local_opts_t *b = &o->base;
    snprintf(title, sizeof title, "mqgrad experiment: %s model, %ld workers, %ld servers, link %s",
             b->model[0] ? b->model : "default", b->workers, b->servers,
             b->link[0] ? b->link : b->link_mbps[0] ? b->link_mbps : "unlimited");
    if (b->link_mbps[0] && !b->link[0])
        strncat(title, " Mbit/s", sizeof title - strlen(title) - 1);
    if (strcmp(b->clock, "simulated") == 0)
        strncat(title, ", simulated clock", sizeof title - strlen(title) - 1);
    char *argv[n + 12];
    int k = 0;
    argv[k++] = "report";
    argv[k++] = "--out";
    argv[k++] = out;
    argv[k++] = "--title";
    argv[k++] = title;
    if (o->target_acc[0]) {
        argv[k++] = "--target-acc";
        argv[k++] = (char *)o->target_acc;
    }
    if (o->checkpoints[0]) {
        argv[k++] = "--checkpoints";
        argv[k++] = (char *)o->checkpoints;
    }
    int done = 0;
    for (int i = 0; i < n; i++)
        if (runs[i].state == S_DONE) {
            argv[k++] = (char *)runs[i].dir;
            done++;
        }
    argv[k] = NULL;
    if (done == 0) {
        fprintf(stderr, "%s: no run completed; no report\n", S_ME);
        return 1;
    }
    int rc = mq_cmd_report(k, argv);
    if (rc == 0)
        printf("%s: report in %s/report.md\n", S_ME, out);
    return rc;
}

/* ---- training an agent across runs ----------------------------------------------------- */

/* OUT/returns.csv (one row per finished episode) and its plot OUT/returns.png. Returns
 * differ more between seeds than between neighbouring episodes, so each round of episodes
 * (one per seed) also gets its mean, comparable from round to round. */
static void s_learning_curve(const s_opts_t *o)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/returns.csv", o->out);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", S_ME, path, strerror(errno));
        return;
    }
    fprintf(f, "episode,seed,return,round_mean,final_test_acc,final_loss,iterations,"
               "train_time_s\n");
    double round_sum = 0;
    int round_n = 0;
    for (long e = 0; e < o->episodes; e++) {
        long seed = o->seed[e % o->n_seeds];
        char dir[PATH_MAX], mark[PATH_MAX + 16], *text, mean[32] = "";
        size_t len;
        snprintf(dir, sizeof dir, "%.400s/episode-%04ld-seed%ld", o->out, e + 1, seed);
        snprintf(mark, sizeof mark, "%s/episode.done", dir);
        mq_rep_run_t run;
        if (e % o->n_seeds == 0)
            round_sum = 0, round_n = 0;
        if (mq_read_file(mark, &text, &len) != 0)
            continue;
        double ret = strtod(text, NULL);
        free(text);
        if (mq_rep_load_run(dir, &run) < 0)
            continue;
        round_sum += ret;
        if (++round_n == o->n_seeds)
            snprintf(mean, sizeof mean, "%.6g", round_sum / round_n);
        fprintf(f, "%ld,%ld,%.6g,%s,%.6g,%.6g,%llu,%.3f\n", e + 1, seed, ret, mean,
                run.final_acc, run.final_loss, (unsigned long long)run.iterations,
                mq_rep_run_time(&run));
        mq_rep_run_free(&run);
    }
    if (fclose(f) != 0)
        fprintf(stderr, "%s: %s: write failed\n", S_ME, path);
    snprintf(path, sizeof path, "%s/returns.gp", o->out);
    f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "set terminal pngcairo size 900,520 noenhanced\nset output 'returns.png'\n"
               "set datafile separator ','\nset datafile missing ''\n"
               "set key below\nset grid\nset xlabel 'episode (training run)'\n"
               "set ylabel 'return (loss decrease, %% of the first loss)'\n"
               "set title 'agent %s: return per episode, %d seeds in turn'\n"
               "plot 'returns.csv' every ::1 using 1:3 with points pt 7 ps 0.8 "
               "title 'return of the episode', "
               "'' every ::1 using 1:4 with linespoints lw 2 pt 5 title 'mean of the round "
               "(one episode per seed)'\n",
               o->method[0], o->n_seeds);
    fclose(f);
    if (mq_rep_gnuplot(o->out, "returns.gp") < 0)
        fprintf(stderr, "%s: learning curve: %s\n", S_ME, mq_err_last());
}

/* --train-agent: o->episodes runs of the one method, on the seeds in turn, all continuing
 * the agent state OUT/agent.state. After a run the state its agent left becomes that state
 * and the episode is closed in it (mq_agent_state_end_episode: the return is recorded);
 * OUT/episode-<k>-seed<s>/episode.done then holds the return, and a resumed training skips
 * the episode. A failed run leaves the state as it was (it taught nothing) and is counted. */
static int s_train(const s_opts_t *o)
{
    char state[PATH_MAX];
    snprintf(state, sizeof state, "%s/agent.state", o->out);
    if (o->agent_state[0] && access(state, F_OK) != 0 && s_copy_file(o->agent_state, state) < 0) {
        fprintf(stderr, "%s: %s\n", S_ME, mq_err_last());
        return 1;
    }
    printf("%s: training %s over %ld episodes in %s, agent state %s\n", S_ME, o->method[0],
           o->episodes, o->out, state);
    fflush(stdout);
    int failed = 0, executed = 0;
    double spent = 0;
    for (long e = 0; e < o->episodes && !s_interrupted; e++) {
        s_run_t r = {.method = o->method[0], .seed = o->seed[e % o->n_seeds]};
        if ((size_t)snprintf(r.dir, sizeof r.dir, "%.400s/episode-%04ld-seed%ld", o->out, e + 1,
                             r.seed) >= sizeof r.dir) {
            fprintf(stderr, "%s: --out is too long\n", S_ME);
            return 2;
        }
        char mark[PATH_MAX], ran[PATH_MAX], line[64];
        snprintf(mark, sizeof mark, "%s/episode.done", r.dir);
        snprintf(ran, sizeof ran, "%s/agent.state", r.dir);
        if (access(mark, F_OK) == 0) {
            printf("[%ld/%ld] episode already done, skipped\n", e + 1, o->episodes);
            continue;
        }
        mq_rep_run_t run;
        if (s_finished(r.dir, &run)) { /* ran, but stopped before its episode was closed */
            mq_rep_run_free(&run);
        } else {
            double t0 = mq_now_s();
            int rc = s_run_cluster(o, &r, access(state, F_OK) == 0 ? state : NULL);
            if (rc == 130 || s_interrupted)
                return 130;
            spent += mq_now_s() - t0;
            executed++;
            s_after_run(&r, (int)e + 1, (int)o->episodes, rc, mq_now_s() - t0,
                        spent / executed * (double)(o->episodes - e - 1));
            if (r.state != S_DONE) {
                failed++;
                continue;
            }
        }
        double *ret = NULL;
        size_t k = 0;
        if (s_copy_file(ran, state) < 0 || mq_agent_state_end_episode(state, &ret, &k) < 0) {
            fprintf(stderr, "%s: episode %ld: %s\n", S_ME, e + 1, mq_err_last());
            return 1;
        }
        double last = k ? ret[k - 1] : NAN;
        free(ret);
        int n = snprintf(line, sizeof line, "%.9g\n", last);
        if (mq_write_file_atomic(mark, line, (size_t)n) != 0) {
            fprintf(stderr, "%s: %s\n", S_ME, mq_err_last());
            return 1;
        }
        printf("    return %.3f (the agent's episode %zu)\n", last, k);
        fflush(stdout);
    }
    if (s_interrupted)
        return 130;
    s_learning_curve(o);
    printf("%s: learning curve in %s/returns.csv and returns.png; the trained agent is %s\n",
           S_ME, o->out, state);
    if (failed)
        fprintf(stderr, "%s: %d of %ld episodes failed (see their logs)\n", S_ME, failed,
                o->episodes);
    return failed ? 1 : 0;
}

int mq_cmd_experiment(int argc, char **argv)
{
    static s_opts_t o;
    int rc = s_parse(&o, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : 2;
    int n = 0;
    s_run_t *runs = s_plan(&o, &n);
    if (!runs) {
        fprintf(stderr, "%s: out of memory\n", S_ME);
        return 1;
    }
    /* One run a method is enough: seeds change no flag's validity. */
    if (s_check_runs(&o, runs, n < o.n_methods ? n : o.n_methods) != 0) {
        free(runs);
        return 2;
    }
    if (mq_mkdirs(o.out) < 0) {
        fprintf(stderr, "%s: %s\n", S_ME, mq_err_last());
        free(runs);
        return 2;
    }
    s_interrupted = 0;
    s_catch_signals();
    if (o.episodes > 0) {
        free(runs);
        rc = s_train(&o);
        if (rc == 130)
            printf("\n%s: interrupted; run the same command again to resume (finished "
                   "episodes are kept)\n",
                   S_ME);
        return rc;
    }
    rc = s_run_all(&o, runs, n);
    if (rc == 130) {
        printf("\n%s: interrupted; run the same command again to resume (finished runs are "
               "kept)\n",
               S_ME);
        free(runs);
        return 130;
    }
    int failed = 0, diverged = 0;
    for (int i = 0; i < n; i++) {
        failed += runs[i].state == S_FAILED;
        diverged += runs[i].state == S_DONE && runs[i].diverged;
    }
    rc = s_report(&o, runs, n);
    if (diverged)
        printf("%s: %d of %d runs diverged (results, shown as such in the report; not run "
               "again)\n",
               S_ME, diverged, n);
    if (failed)
        fprintf(stderr, "%s: %d of %d runs failed (see their logs); the report has the others\n",
                S_ME, failed, n);
    free(runs);
    return rc != 0 || failed ? 1 : 0;
}
