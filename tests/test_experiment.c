/* `mqgrad experiment` end to end, through the built binary: a tiny experiment (small model,
 * fixed:2 and fp32, one seed) leaves both run directories and a report whose final accuracies
 * are the runs' own; run again it skips what completed or diverged and redoes what did not; a
 * diverged run is a result, not a failure; "+exact" methods run the paper-exact codec; bad
 * flags exit 2 before anything runs. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mqgrad/util.h"
#include "../common/src/rl/rl_internal.h"
#include "agent_internal.h"

#define MQGRAD MQ_TEST_BIN_DIR "/tools/mqgrad"

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes a test's directory once the test passed (a failure keeps it to look at). */
static void s_rmtree(const char *dir)
{
    nftw(dir, s_rm, 16, FTW_DEPTH | FTW_PHYS);
}

static char *s_slurp(const char *path)
{
    char *data;
    size_t len;
    cr_assert_eq(mq_read_file(path, &data, &len), 0, "%s", mq_err_last());
    return data;
}

/* Runs `mqgrad experiment ARGS... --out OUT` with stdout and stderr in LOG; returns its exit
 * code (kills it after TIMEOUT_S). */
static int s_experiment(const char *out, const char *log, int timeout_s, const char *const *args)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        const char *argv[48] = {"mqgrad", "experiment", "--out", out};
        int n = 4;
        for (int i = 0; args[i] && n < 46; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        freopen(log, "w", stdout);
        dup2(fileno(stdout), STDERR_FILENO);
        execv(MQGRAD, (char **)argv);
        _exit(127);
    }
    int status;
    for (int i = 0; i < timeout_s * 10; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(100000);
    }
    kill(pid, SIGINT);
    waitpid(pid, &status, 0);
    cr_assert_fail("mqgrad experiment did not finish within %d s", timeout_s);
    return -1;
}

/* ROOT (/tmp/mqgrad-TAG-<pid>, made), OUT (ROOT/out) and LOG (ROOT/experiment.log). */
static void s_dirs(const char *tag, char root[64], char out[96], char log[128])
{
    snprintf(root, 64, "/tmp/mqgrad-%s-%d", tag, (int)getpid());
    snprintf(out, 96, "%s/out", root);
    snprintf(log, 128, "%s/experiment.log", root);
    cr_assert_eq(mq_mkdirs(root), 0);
}

static const char *s_tiny[] = {"--methods",
                               "fixed:2,none",
                               "--seeds",
                               "1",
                               "--model",
                               "small",
                               "--iterations",
                               "30",
                               "--eval-every",
                               "10",
                               "--eval-limit",
                               "500",
                               "--threshold",
                               "1000",
                               "--workers",
                               "2",
                               "--servers",
                               "1",
                               "--threads",
                               "1",
                               NULL};

/* The number after "KEY": in a summary.json. */
static double s_json_num(const char *json, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(json, pat);
    cr_assert_not_null(p, "no %s in %s", key, json);
    return strtod(p + strlen(pat), NULL);
}

/* Cell COL (0 = method) of the first row of report.md's "## SECTION" table whose first two
 * cells are METHOD and SECOND. */
static void s_cell(const char *md, const char *section, const char *method, const char *second,
                   int col, char *cell, size_t len)
{
    char head[96], row[96];
    snprintf(head, sizeof head, "## %s", section);
    snprintf(row, sizeof row, "\n| %s | %s |", method, second);
    const char *s = strstr(md, head);
    cr_assert_not_null(s, "report.md has no section '%s'", section);
    const char *r = strstr(s, row);
    cr_assert_not_null(r, "no row '%s | %s' under '%s'", method, second, section);
    const char *p = r + 2;
    for (int c = 0; c < col; c++)
        p = strchr(p, '|') + 1;
    size_t n = strcspn(p, "|");
    cr_assert(n < len);
    snprintf(cell, len, "%.*s", (int)n, p);
    char *e = cell + strlen(cell);
    while (e > cell && e[-1] == ' ')
        *--e = '\0';
    memmove(cell, cell + strspn(cell, " "), strlen(cell + strspn(cell, " ")) + 1);
}

/* Rewrites OUT/DIRNAME/summary.json as a run that diverged at iteration ITER. */
static void s_mark_diverged(const char *out, const char *dirname, int iter)
{
    char path[512], tail[256];
    snprintf(path, sizeof path, "%s/%s/summary.json", out, dirname);
    char *text = s_slurp(path);
    char *st = strstr(text, "\"status\": \"completed\"");
    cr_assert_not_null(st, "%s: %s", path, text);
    snprintf(tail, sizeof tail,
             "\"status\": \"diverged\",\n  \"divergence_rule\": \"loss\",\n  "
             "\"divergence_iter\": %d,\n  \"divergence_detail\": \"smoothed loss 9.24 stayed "
             "above 2x the best (2.09) for 20 iterations\"\n}\n",
             iter);
    *st = '\0';
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "%s%s", text, tail);
    fclose(f);
    free(text);
}

static bool s_exists(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* The report's two tables hold the accuracy the run's summary.json gives. */
static void s_check_report_has(const char *out, const char *md, const char *method,
                               const char *dirname)
{
    char path[512], want[32], cell[96];
    snprintf(path, sizeof path, "%s/%s/summary.json", out, dirname);
    char *summary = s_slurp(path);
    cr_expect(strstr(summary, "\"status\": \"completed\""), "%s: %s", path, summary);
    double acc = s_json_num(summary, "final_test_acc");
    cr_assert(isfinite(acc), "%s has no final accuracy", path);
    snprintf(want, sizeof want, "%.2f", 100 * acc);
    s_cell(md, "Runs", method, "1", 4, cell, sizeof cell);
    cr_expect_str_eq(cell, want, "Runs table: %s final accuracy %s, summary.json says %s", method,
                     cell, want);
    s_cell(md, "Final results", method, "1", 3, cell, sizeof cell);
    cr_expect_str_eq(cell, want, "Final results: %s final accuracy %s, summary.json says %s",
                     method, cell, want);
    free(summary);
}

Test(experiment, tiny_experiment_reports_its_runs_and_resumes, .timeout = 300)
{
    char root[64], out[96], log[128];
    s_dirs("exp", root, out, log);
    int code = s_experiment(out, log, 240, s_tiny);
    char *text = s_slurp(log);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, text);
    cr_expect(strstr(text, "[1/2] none seed 1: loss"), "%s", text);
    cr_expect(strstr(text, "[2/2] fixed:2 seed 1: loss"), "%s", text);
    cr_expect(strstr(text, "fp32 communication/computation ratio: "), "%s", text);
    free(text);

    char report[160], md_path[200];
    snprintf(report, sizeof report, "%s/report", out);
    snprintf(md_path, sizeof md_path, "%s/report.md", report);
    char *md = s_slurp(md_path);
    s_check_report_has(out, md, "fixed:2", "fixed-2-seed1");
    s_check_report_has(out, md, "none", "none-seed1");
    free(md);
    if (system("command -v gnuplot >/dev/null 2>&1") == 0)
        for (const char **p =
                 (const char *[]){"loss.png", "accuracy.png", "bits.png", "bytes.png", NULL};
             *p; p++)
            cr_expect(s_exists(report, *p), "%s/%s missing (gnuplot is installed)", report, *p);

    /* Run again: both runs are skipped, their directories untouched. */
    char sum_path[200];
    snprintf(sum_path, sizeof sum_path, "%s/none-seed1/summary.json", out);
    char *before = s_slurp(sum_path);
    code = s_experiment(out, log, 120, s_tiny);
    text = s_slurp(log);
    cr_assert_eq(code, 0, "exit %d on the re-run:\n%s", code, text);
    cr_expect(strstr(text, "[1/2] none seed 1: already done"), "%s", text);
    cr_expect(strstr(text, "[2/2] fixed:2 seed 1: already done"), "%s", text);
    cr_expect(strstr(text, "report in"), "%s", text);
    free(text);
    char *after = s_slurp(sum_path);
    cr_expect_str_eq(after, before, "a skipped run's summary changed");
    free(before);
    free(after);

    /* fixed:2 now reads as diverged (as runlog.c writes it): a result among completed ones. */
    s_mark_diverged(out, "fixed-2-seed1", 21);
    code = s_experiment(out, log, 120, s_tiny);
    text = s_slurp(log);
    cr_assert_eq(code, 0, "a diverged run is not a failure: exit %d\n%s", code, text);
    cr_expect(strstr(text, "[2/2] fixed:2 seed 1: already done (DIVERGED at iteration 21 (loss "
                           "rule)), skipped"),
              "%s", text);
    cr_expect(strstr(text, "1 of 2 runs diverged"), "%s", text);
    cr_expect(!strstr(text, "failed"), "%s", text);
    free(text);
    md = s_slurp(md_path);
    s_check_report_has(out, md, "none", "none-seed1");
    cr_expect(strstr(md, "| fixed:2 | 1 | 30 |"), "%s", md);
    cr_expect(strstr(md, "**diverged** at iteration 21 (loss rule) | diverged: smoothed loss"),
              "the runs table shows it as diverged:\n%s", md);
    cr_expect(strstr(md, "| fixed:2 — 1 of 1 diverged | 1 | — | diverged (1/1) at iteration "
                         "21 |"),
              "the final results give it no accuracy:\n%s", md);
    free(md);
    s_rmtree(root);
}

Test(experiment, unfinished_run_is_redone_and_kept_aside, .timeout = 300)
{
    char root[64], out[96], log[128], sum[200];
    s_dirs("exp-redo", root, out, log);
    const char *args[] = {"--methods",
                          "fixed:4",
                          "--seeds",
                          "7",
                          "--model",
                          "small",
                          "--iterations",
                          "10",
                          "--eval-every",
                          "10",
                          "--eval-limit",
                          "200",
                          "--threshold",
                          "1000",
                          "--workers",
                          "2",
                          "--servers",
                          "1",
                          "--threads",
                          "1",
                          NULL};
    cr_assert_eq(s_experiment(out, log, 120, args), 0);
    /* Make it look like a run that was interrupted. */
    snprintf(sum, sizeof sum, "%s/fixed-4-seed7/summary.json", out);
    FILE *f = fopen(sum, "w");
    cr_assert_not_null(f);
    fputs("{\n  \"iterations\": 3,\n  \"policy\": \"fixed:4\",\n  \"seed\": 7,\n  \"status\": "
          "\"interrupted\"\n}\n",
          f);
    fclose(f);
    int code = s_experiment(out, log, 120, args);
    char *text = s_slurp(log);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, text);
    cr_expect(strstr(text, "[1/1] fixed:4 seed 7: loss"), "the run was not redone:\n%s", text);
    cr_expect(strstr(text, "fixed-4-seed7.incomplete-"), "%s", text);
    free(text);
    char *summary = s_slurp(sum);
    cr_expect(strstr(summary, "\"status\": \"completed\""), "%s", summary);
    cr_expect_eq(s_json_num(summary, "iterations"), 10);
    free(summary);
    s_rmtree(root);
}

Test(experiment, bad_flags_exit_2_before_running, .timeout = 60)
{
    char root[64], out[96], log[128];
    s_dirs("exp-bad", root, out, log);
    const struct {
        const char *args[10], *says;
    } cases[] = {
        {{"--iterations", "5", "--bogus", "1", NULL}, "--bogus"},
        {{"--iterations", "5", "--methods", "fixed:2,fixed:9", NULL}, "fixed:K"},
        {{"--iterations", "5", "--methods", "sarsa", NULL}, "sarsa"},
        {{"--iterations", "5", "--seeds", "1,x", NULL}, "--seeds"},
        {{"--iterations", "5", "--policy", "fixed:2", NULL}, "--policy"},
        {{"--iterations", "5", "--link-mbps", "fast", NULL}, "--link-mbps"},
        {{"--methods", "none", NULL}, "--time-budget"},
        {{"--iterations", "5", "--methods", "mqgrad,none+exact", NULL}, "none+exact"},
        {{"--iterations", "5", "--methods", "fixed:9+exact", NULL}, "fixed:K"},
        {{"--iterations", "5", "--methods", "none+exact", NULL}, "fp32 (none) has no codec"},
        {{"--iterations", "5", "--methods", "fixed:2@topk:ratio=2", NULL}, "ratio"},
        {{"--iterations", "5", "--methods", "fixed:2@zstd", NULL}, "unknown codec 'zstd'"},
        {{"--iterations", "5", "--methods", "fixed:2/adam", NULL}, "unknown rule 'adam'"},
        {{"--iterations", "5", "--codec", "topk:ratio=2", NULL}, "ratio"},
        {{"--iterations", "5", "--optimizer", "qrda:l9=1", NULL}, "not an option of qrda"},
        {{"--iterations", "5", "--train-agent", "3", "--methods", "fixed:2", NULL},
         "does not learn across runs"},
        {{"--iterations", "5", "--train-agent", "3", "--methods", "learned,fixed:2", NULL},
         "trains one method"},
        {{"--iterations", "5", "--train-agent", "0", "--methods", "learned", NULL},
         "--train-agent"},
        {{"--iterations", "5", "--agent-state", "/nonexistent/agent.state", NULL},
         "--agent-state /nonexistent/agent.state"},
        {{"--iterations", "5", "--clock", "sundial", NULL}, "--clock 'sundial'"},
        /* The methods (with +exact) parse: what stops it is the next flag, the seeds. */
        {{"--iterations", "5", "--methods", "mqgrad+exact,fixed:2+exact,fixed:2,none", "--seeds",
          "x", NULL},
         "--seeds"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int code = s_experiment(out, log, 30, cases[i].args);
        char *text = s_slurp(log);
        cr_expect_eq(code, 2, "case %zu (%s): exit %d\n%s", i, cases[i].says, code, text);
        cr_expect(strstr(text, cases[i].says), "case %zu: the message does not name %s:\n%s", i,
                  cases[i].says, text);
        free(text);
        cr_expect(!s_exists(out, "."), "case %zu: created %s", i, out);
    }
    s_rmtree(root);
}

/* The price buckets (learned's communication share) the table at PATH has visits in. */
static int s_price_buckets_seen(const char *path)
{
    mq_policy_t *p = NULL, *stash = NULL;
    mq_agent_counters_t c;
    cr_assert_eq(mq_agent_state_load(path, &p, &stash, &c), 0, "%s", mq_err_last());
    mq_policy_destroy(&stash);
    cr_assert_str_eq(p->ops->name, "learned");
    const mq_rl_learned_t *m = p->priv;
    cr_assert_eq(m->nprice, 3);
    bool seen[3] = {false};
    for (int s = 0; s < m->nstates; s++)
        for (int a = 0; a < MQ_RL_LEARNED_ACTIONS; a++)
            if (m->visits[(size_t)s * MQ_RL_LEARNED_ACTIONS + (size_t)a] > 0)
                seen[s % m->nprice] = true;
    mq_policy_destroy(&p);
    return seen[0] + seen[1] + seen[2];
}

/* --train-agent: episodes continue one agent state (the agent's episode count grows), the
 * learning curve has a row per episode, a re-run skips finished episodes, and a trained agent
 * is deployed frozen on another seed with --agent-state, which is never written. The training
 * runs on a link that changes every second of training (8 and 1000 Mbit/s): the agent sees
 * the price of the bits change (its table has visits at more than one communication share,
 * measured by the workers and passed on by the scheduler). */
Test(experiment, train_agent_learns_across_runs_and_deploys, .timeout = 300)
{
    char root[64], out[96], log[128], dep[96];
    snprintf(root, sizeof root, "/tmp/mqgrad-exp-train-%d", (int)getpid());
    snprintf(out, sizeof out, "%s/train", root);
    snprintf(dep, sizeof dep, "%s/deploy", root);
    snprintf(log, sizeof log, "%s/experiment.log", root);
    cr_assert_eq(mq_mkdirs(root), 0);
    const char *args[] = {"--train-agent", "3",  "--methods", "learned:every=1", "--seeds",
                          "11,12",         "--model", "small", "--workers",       "2",
                          "--servers",     "2",       "--threads", "1",        "--link",
                          "8@0,1000@1/2",  "--clock", "simulated", "--time-budget", "4",
                          "--eval-every",  "0",       NULL};
    int code = s_experiment(out, log, 240, args);
    char *text = s_slurp(log);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, text);
    cr_expect(strstr(text, "return ") && strstr(text, "(the agent's episode 3)"),
              "the third run is the agent's third episode:\n%s", text);
    free(text);
    char path[200];
    snprintf(path, sizeof path, "%s/returns.csv", out);
    char *csv = s_slurp(path);
    int rows = 0;
    for (const char *p = csv; (p = strchr(p, '\n')); p++)
        rows++;
    cr_expect_eq(rows, 4, "a header and one row per episode:\n%s", csv);
    cr_expect(strstr(csv, "\n1,11,") && strstr(csv, "\n2,12,") && strstr(csv, "\n3,11,"),
              "episodes take the seeds in turn:\n%s", csv);
    free(csv);
    cr_expect(s_exists(out, "episode-0003-seed11/summary.json"));

    code = s_experiment(out, log, 60, args);
    text = s_slurp(log);
    cr_assert_eq(code, 0, "exit %d on the re-run:\n%s", code, text);
    cr_expect(strstr(text, "[3/3] episode already done, skipped"), "%s", text);
    free(text);

    snprintf(path, sizeof path, "%s/agent.state", out);
    int buckets = s_price_buckets_seen(path);
    cr_expect_geq(buckets, 2, "the price of the bits seen in %d bucket(s)", buckets);
    char *before = s_slurp(path);
    size_t before_len = 0;
    {
        char *d;
        cr_assert_eq(mq_read_file(path, &d, &before_len), 0);
        free(d);
    }
    const char *dargs[] = {"--methods", "learned:every=1,epsilon=0", "--agent-state", path,
                           "--seeds", "7", "--model", "small", "--workers", "2", "--servers", "2",
                           "--threads", "1", "--link-mbps", "80", "--clock", "simulated",
                           "--time-budget", "4", "--eval-every", "0", NULL};
    code = s_experiment(dep, log, 240, dargs);
    text = s_slurp(log);
    cr_assert_eq(code, 0, "deploy: exit %d:\n%s", code, text);
    free(text);
    char alog[200];
    snprintf(alog, sizeof alog, "%s/learned-every-1-epsilon-0-seed7/logs/agent.log", dep);
    text = s_slurp(alog);
    cr_expect(strstr(text, "resumed at step 0"), "the deployed agent starts from the trained "
                                                 "state:\n%s", text);
    free(text);
    char *d;
    size_t after_len;
    cr_assert_eq(mq_read_file(path, &d, &after_len), 0);
    cr_expect(after_len == before_len && memcmp(d, before, after_len) == 0,
              "--agent-state's file was written");
    free(d);
    free(before);
    s_rmtree(root);
}

/* Time to a target is read off the evaluations: an experiment evaluates every 5 rounds unless
 * told otherwise (the scheduler alone evaluates every 100). */
Test(experiment, runs_evaluate_every_five_rounds_by_default, .timeout = 200)
{
    char root[64], out[96], log[128], path[200];
    s_dirs("exp5", root, out, log);
    const char *args[] = {"--methods", "fixed:4", "--seeds", "1", "--model", "small",
                          "--iterations", "12", "--eval-limit", "200", "--workers", "1",
                          "--servers", "1", "--threads", "1", "--clock", "simulated", NULL};
    int code = s_experiment(out, log, 180, args);
    char *text = s_slurp(log);
    cr_assert_eq(code, 0, "exit %d:\n%s", code, text);
    free(text);
    snprintf(path, sizeof path, "%s/fixed-4-seed1/config.json", out);
    text = s_slurp(path);
    cr_expect(strstr(text, "\"eval_every\":5,"), "%s", text);
    free(text);
    s_rmtree(root);
}

/* --help documents "+exact", and the default methods include mqgrad+exact after mqgrad. */
Test(experiment, help_documents_exact_methods, .timeout = 60)
{
    char root[64], out[96], log[128];
    snprintf(root, sizeof root, "/tmp/mqgrad-exp-help-%d", (int)getpid());
    snprintf(out, sizeof out, "%s/out", root);
    snprintf(log, sizeof log, "%s/help.log", root);
    cr_assert_eq(mq_mkdirs(root), 0);
    int code = s_experiment(out, log, 30, (const char *[]){"--help", NULL});
    char *text = s_slurp(log);
    cr_expect_eq(code, 0, "%s", text);
    cr_expect(strstr(text, "the paper-exact codec: one range per tensor slice, nearest rounding"),
              "%s", text);
    cr_expect(strstr(text, "[mqgrad,mqgrad+exact,fixed:2,"), "default methods:\n%s", text);
    free(text);
    s_rmtree(root);
}

/* A diverged run is a result: the experiment reports it as such, exits 0, does not run it
 * again, and the report does not count it as an accuracy. The "+exact" method runs the same
 * policy with the paper-exact codec (bucket 0 in its config.json). */
Test(experiment, diverged_run_is_a_result_and_exact_methods_run, .timeout = 300)
{
    char root[64], out[96], log[128], path[256];
    s_dirs("exp-div", root, out, log);
    const char *args[] = {"--methods", "fixed:2+exact", "--seeds", "1", "--model", "small",
                          "--iterations", "200", "--eval-every", "50", "--eval-limit", "200",
                          "--threshold", "1000", "--workers", "2", "--servers", "1",
                          "--threads", "1", "--lr", "30", "--bucket", "128", "--stochastic",
                          NULL};
    int code = s_experiment(out, log, 240, args);
    char *text = s_slurp(log);
    cr_assert_eq(code, 0, "a diverged run is not a failure: exit %d\n%s", code, text);
    cr_expect(strstr(text, "[1/1] fixed:2+exact seed 1: DIVERGED at iteration "), "%s", text);
    cr_expect(strstr(text, "1 of 1 runs diverged"), "%s", text);
    cr_expect(!strstr(text, "failed"), "%s", text);
    free(text);
    snprintf(path, sizeof path, "%s/fixed-2+exact-seed1/config.json", out);
    char *config = s_slurp(path);
    cr_expect(strstr(config, "\"bucket\":0,\"stochastic\":false,\"error_feedback\":false"),
              "the +exact run has one range per tensor and nearest rounding, whatever the "
              "flags: %s",
              config);
    cr_expect(strstr(config, "\"guard_spike\":0,"),
              "a fixed baseline runs without the spike guard, which would move its bits: %s",
              config);
    free(config);
    snprintf(path, sizeof path, "%s/report/report.md", out);
    char *md = s_slurp(path);
    cr_expect(strstr(md, "| fixed:2 (paper-exact codec) — 1 of 1 diverged | 1 |"), "%s", md);
    cr_expect(strstr(md, "| — | diverged (1/1) at iteration "), "%s", md);
    free(md);

    code = s_experiment(out, log, 120, args);
    text = s_slurp(log);
    cr_expect_eq(code, 0, "%s", text);
    cr_expect(strstr(text, "already done (DIVERGED at iteration"), "not run again:\n%s", text);
    free(text);
    s_rmtree(root);
}
