/* Every compression method of the comparison runs on the real cluster (separate processes over
 * TCP loopback, Fashion-MNIST) through `mqgrad experiment`, and learns: each run completes and
 * ends well above chance (10 %) on the small model and on the paper's model. The l1 rules
 * (QCMD/QRDA adagrad) also leave a sparse model. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"
#include "local_run.h"

/* Every preset of tools/mqgrad/methods.c. */
static const char *const s_methods[] = {"qsgd",   "dqsgd",  "terngrad", "topk", "dgc",
                                        "efsign", "onebit", "qcmd",     "qrda", "sdagc"};
#define S_NMETHODS (sizeof s_methods / sizeof s_methods[0])

/* On the paper's model, by default, one method of each family the small model's test cannot
 * tell apart from the others on big tensors: unbiased levels (qsgd), sparsification (topk),
 * signs with error feedback (efsign), an l1 update rule on the servers (qrda). The uniform
 * codec is the default job's (test_local). MQGRAD_TEST_EXTENDED=1 runs every method. Sixty
 * iterations are enough for each to leave chance far behind; the test asserts learning, the
 * comparison of methods is docs/results.md's. */
static const char *const s_paper_methods[] = {"qsgd", "topk", "efsign", "qrda"};
#define S_NPAPER (sizeof s_paper_methods / sizeof s_paper_methods[0])

static bool s_extended(void)
{
    const char *e = getenv("MQGRAD_TEST_EXTENDED");
    return e && *e && strcmp(e, "0") != 0;
}

/* Runs the experiment of the N METHODS with ARGS (after the methods, seeds and out flags)
 * into DIR. */
static void s_experiment(const char *dir, const char *const *list, size_t n,
                         const char *const *args, int timeout_s)
{
    char methods[256] = "";
    for (size_t i = 0; i < n; i++)
        snprintf(methods + strlen(methods), sizeof methods - strlen(methods), "%s%s",
                 i ? "," : "", list[i]);
    const char *fixed[] = {"--methods", methods, "--seeds", "1", "--out", dir, NULL};
    pid_t pid = test_spawn_mqgrad("experiment", fixed, args);
    cr_assert_eq(test_wait(pid, timeout_s), 0, "mqgrad experiment failed");
}

/* Each of the N METHODS' runs in DIR completed with at least MIN_ACC. */
static void s_check_runs(const char *dir, const char *const *list, size_t n, double min_acc)
{
    for (size_t i = 0; i < n; i++) {
        char run[512];
        snprintf(run, sizeof run, "%s/%s-seed1", dir, list[i]);
        char *summary = test_slurp(run, "summary.json");
        double acc = test_json_num(summary, "final_test_acc");
        double sparsity = test_json_num(summary, "final_sparsity");
        double bytes = test_json_num(summary, "bytes_up");
        cr_log_info("%-9s acc %.3f  sparsity %.4f  up %.1f MB", list[i], acc, sparsity,
                    bytes / 1e6);
        cr_expect(strstr(summary, "\"status\": \"completed\""), "%s: %s", list[i], summary);
        cr_expect(acc >= min_acc, "%s learned only %.1f %% (chance is 10 %%)", list[i],
                  100 * acc);
        if (strcmp(list[i], "qcmd") == 0 || strcmp(list[i], "qrda") == 0)
            cr_expect(sparsity > 0.01, "%s: the l1 rule left %.2f %% zeros", list[i],
                      100 * sparsity);
        free(summary);
    }
}

Test(methods, every_method_learns_on_the_small_model, .timeout = 900)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-methods-small-%d", (int)getpid());
    const char *args[] = {"--model",      "small", "--iterations", "300", "--eval-every", "0",
                          "--eval-limit", "2000",  "--threshold",  "1000", NULL};
    s_experiment(dir, s_methods, S_NMETHODS, args, 850);
    s_check_runs(dir, s_methods, S_NMETHODS, 0.60);
    test_rmtree(dir);
}

Test(methods, every_method_learns_on_the_paper_model, .timeout = 1500)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-methods-paper-%d", (int)getpid());
    const char *args[] = {"--model", "paper", "--iterations", "60", "--eval-every", "0",
                          "--eval-limit", "1000", NULL};
    const char *const *list = s_extended() ? s_methods : s_paper_methods;
    size_t n = s_extended() ? S_NMETHODS : S_NPAPER;
    s_experiment(dir, list, n, args, 1450);
    s_check_runs(dir, list, n, 0.50);
    test_rmtree(dir);
}

/* Per-tensor levels, end to end: lgreco (a per-layer policy) sends the workers one level per
 * tensor; they push each tensor at its own, the servers take the pushes and reply at those
 * levels (a level that disagreed would be dropped, and the round would never close), and the
 * model learns. On the paper's model with every tensor of 1000 values or more quantized, the
 * convolutions' errors per value are far above the big FC layer's: the levels differ. */
/* No node of the run in DIR logged a dropped message (LOGS: their names under logs/). */
static void s_expect_no_drops(const char *dir, const char *const *logs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "logs/%s.log", logs[i]);
        char *log = test_slurp(dir, name);
        cr_expect_null(strstr(log, "dropped a message"), "%s: %s", logs[i],
                       strstr(log, "dropped a message"));
        free(log);
    }
}

Test(methods, per_tensor_levels_reach_the_wire_and_learn, .timeout = 300)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-methods-widths-%d", (int)getpid());
    const char *args[] = {"--model",      "paper",  "--policy",     "lgreco:bits=3,min=1",
                          "--threshold",  "1000",   "--iterations", "60",
                          "--eval-every", "0",      "--eval-limit", "2000",
                          "--clock",      "simulated", "--link-mbps", "1000", NULL};
    cr_assert_eq(test_wait(test_spawn_args(dir, args), 280), 0);
    char *summary = test_slurp(dir, "summary.json"), *events = test_slurp(dir, "events.jsonl");
    cr_expect(strstr(summary, "\"status\": \"completed\""), "%s", summary);
    double acc = test_json_num(summary, "final_test_acc");
    cr_expect(acc >= 0.5, "learned only %.1f %% (chance is 10 %%)", 100 * acc);
    /* the last levels the agent chose: not all the same */
    const char *last = NULL;
    for (const char *p = strstr(events, "\"widths\":\""); p; p = strstr(p + 1, "\"widths\":\""))
        last = p + strlen("\"widths\":\"");
    cr_assert_not_null(last, "no per-tensor levels were chosen:\n%s", events);
    int lo = 99, hi = 0, n = 0;
    for (const char *p = last; *p && *p != '"'; n++) {
        int b = (int)strtol(p, (char **)&p, 10);
        lo = b < lo ? b : lo;
        hi = b > hi ? b : hi;
        p += *p == ',';
    }
    cr_expect_eq(n, 10, "one level per tensor of the paper's model: %.60s", last);
    cr_expect_lt(lo, hi, "every tensor at %d bits: %.60s", lo, last);
    /* and no node dropped a message over them */
    static const char *const logs[] = {"server-0", "server-1", "worker-0", "worker-1",
                                       "scheduler"};
    s_expect_no_drops(dir, logs, sizeof logs / sizeof logs[0]);
    free(summary);
    free(events);
    test_rmtree(dir);
}

/* The ladder codec's levels are three families (top-k, uniform K bits, fp32): a run whose
 * level climbs 1 to 8 sends each level in its family over real sockets, pays more bytes at
 * each level up, drops nothing, and learns. */
Test(methods, the_ladder_codec_climbs_every_level_over_the_wire_and_learns, .timeout = 300)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-methods-ladder-%d", (int)getpid());
    const char *args[] = {"--model",      "small",
                          "--codec",      "ladder",
                          "--policy",     "schedule:min=1,max=8",
                          "--threshold",  "1000",
                          "--iterations", "160",
                          "--eval-every", "0",
                          "--final-eval-limit", "2000",
                          NULL};
    cr_assert_eq(test_wait(test_spawn_args(dir, args), 280), 0);
    char *summary = test_slurp(dir, "summary.json"), *csv = test_slurp(dir, "metrics.csv");
    cr_expect(strstr(summary, "\"status\": \"completed\""), "%s", summary);
    double acc = test_json_num(summary, "final_test_acc");
    cr_expect(acc >= 0.5, "learned only %.1f %% (chance is 10 %%)", 100 * acc);
    /* metrics.csv: iter,train_time_s,loss,smoothed_loss,bits,bytes_up,... */
    double bytes[9] = {0};
    int rounds[9] = {0};
    for (const char *line = strchr(csv, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        unsigned long long it, up;
        double t, loss, sm;
        int bits;
        cr_assert_eq(sscanf(line + 1, "%llu,%lf,%lf,%lf,%d,%llu,", &it, &t, &loss, &sm, &bits,
                            &up), 6, "%.80s", line + 1);
        cr_assert(bits >= 1 && bits <= 8, "iteration %llu at level %d", it, bits);
        bytes[bits] += (double)up;
        rounds[bits]++;
    }
    for (int l = 1; l <= 8; l++) {
        cr_assert_gt(rounds[l], 0, "level %d never used", l);
        if (l > 1)
            cr_expect_gt(bytes[l] / rounds[l], bytes[l - 1] / rounds[l - 1],
                         "level %d sent %.0f bytes a round, level %d %.0f", l,
                         bytes[l] / rounds[l], l - 1, bytes[l - 1] / rounds[l - 1]);
    }
    static const char *const logs[] = {"server-0", "worker-0", "worker-1", "scheduler"};
    s_expect_no_drops(dir, logs, sizeof logs / sizeof logs[0]);
    free(summary);
    free(csv);
    test_rmtree(dir);
}
