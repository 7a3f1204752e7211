/* Every compression method of the comparison runs on the real cluster (separate processes over
 * TCP loopback, Fashion-MNIST) through `mqgrad experiment`, and learns: each run completes and
 * ends well above chance (10 %) on the small model and on the paper's model. The l1 rules
 * (QCMD/QRDA adagrad) also leave a sparse model. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"
#include "local_run.h"

/* Every preset of tools/mqgrad/methods.c. */
static const char *const s_methods[] = {"qsgd",   "dqsgd",  "terngrad", "topk", "dgc",
                                        "efsign", "onebit", "qcmd",     "qrda", "sdagc"};
#define S_NMETHODS (sizeof s_methods / sizeof s_methods[0])

/* Runs the experiment with ARGS (after the methods, seeds and out flags) into DIR. */
static void s_experiment(const char *dir, const char *const *args, int timeout_s)
{
    char methods[256] = "";
    for (size_t i = 0; i < S_NMETHODS; i++)
        snprintf(methods + strlen(methods), sizeof methods - strlen(methods), "%s%s",
                 i ? "," : "", s_methods[i]);
    const char *fixed[] = {"--methods", methods, "--seeds", "1", "--out", dir, NULL};
    pid_t pid = test_spawn_mqgrad("experiment", fixed, args);
    cr_assert_eq(test_wait(pid, timeout_s), 0, "mqgrad experiment failed");
}

/* Each method's run in DIR completed with at least MIN_ACC; returns the accuracies. */
static void s_check_runs(const char *dir, double min_acc)
{
    for (size_t i = 0; i < S_NMETHODS; i++) {
        char run[512];
        snprintf(run, sizeof run, "%s/%s-seed1", dir, s_methods[i]);
        char *summary = test_slurp(run, "summary.json");
        double acc = test_json_num(summary, "final_test_acc");
        double sparsity = test_json_num(summary, "final_sparsity");
        double bytes = test_json_num(summary, "bytes_up");
        cr_log_info("%-9s acc %.3f  sparsity %.4f  up %.1f MB", s_methods[i], acc, sparsity,
                    bytes / 1e6);
        cr_expect(strstr(summary, "\"status\": \"completed\""), "%s: %s", s_methods[i], summary);
        cr_expect(acc >= min_acc, "%s learned only %.1f %% (chance is 10 %%)", s_methods[i],
                  100 * acc);
        if (strcmp(s_methods[i], "qcmd") == 0 || strcmp(s_methods[i], "qrda") == 0)
            cr_expect(sparsity > 0.01, "%s: the l1 rule left %.2f %% zeros", s_methods[i],
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
    s_experiment(dir, args, 850);
    s_check_runs(dir, 0.60);
    test_rmtree(dir);
}

Test(methods, every_method_learns_on_the_paper_model, .timeout = 1500)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-methods-paper-%d", (int)getpid());
    const char *args[] = {"--model", "paper", "--iterations", "100", "--eval-every", "0",
                          "--eval-limit", "1000", NULL};
    s_experiment(dir, args, 1450);
    s_check_runs(dir, 0.50);
    test_rmtree(dir);
}
