/* Tests of the end-of-run summary (`mqgrad summary`, also printed by `mqgrad local`): the test
 * writes small run directories, prints their summary into memory and checks the lines a user
 * reads against numbers it computes by hand: accuracy and test images, the run-length bits,
 * the byte ratio and the fp32 time estimate from the link model; then divergence, malformed
 * files and the command's exit codes. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mqgrad/runlog.h"
#include "mqgrad/util.h"
#include "run_files.h"
#include "run_summary.h"

#define MQGRAD_BIN MQ_TEST_BIN_DIR "/tools/mqgrad"
#define N 10

static char s_root[64];

static void s_setup(void)
{
    snprintf(s_root, sizeof s_root, "/tmp/mq_test_summary_XXXXXX");
    cr_assert_not_null(mkdtemp(s_root));
}

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void s_teardown(void)
{
    nftw(s_root, s_rm, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(summary, .init = s_setup, .fini = s_teardown, .timeout = 60);

/* ---- writing run directories ------------------------------------------------------- */


static void s_dir(const char *name, char *dir, size_t len)
{
    snprintf(dir, len, "%s/%s", s_root, name);
    cr_assert_eq(mq_mkdirs(dir), 0);
}

typedef struct {
    const char *model, *status, *policy;
    int workers, servers;
    double link_mbps;
    int n;             /* rows, iterations 0..n-1 */
    const int *bits;   /* per row */
    double dt;         /* seconds per iteration, if T is NULL */
    const double *t;   /* cumulative train_time_s per row */
    int eval_at[2];    /* evaluated iterations (-1 = none) */
    double acc[2];
    const char *summary_extra; /* appended to summary.json's members */
} run_t;

/* Every row moves 1e6 x bits bytes each way and measures compute 100, decode 5, update 1 ms. */
static void s_write_run(const char *dir, const run_t *r)
{
    char cfg[1024], sum[2048], *csv;
    size_t len;
    FILE *m = open_memstream(&csv, &len);
    fprintf(m, "iter,train_time_s,loss,smoothed_loss,bits,bytes_up,bytes_down,compute_ms,"
               "encode_ms,wait_ms,decode_ms,update_ms,agent_ms,test_acc,test_loss\n");
    double t = 0;
    for (int i = 0; i < r->n; i++) {
        t = r->t ? r->t[i] : r->dt * (i + 1);
        fprintf(m, "%d,%.4f,1.5,1.5,%d,%d,%d,100,20,30,5,1,0.1,", i, t, r->bits[i],
                1000000 * r->bits[i], 1000000 * r->bits[i]);
        int e = i == r->eval_at[0] ? 0 : i == r->eval_at[1] ? 1 : -1;
        if (e >= 0)
            fprintf(m, "%.6f,0.4\n", r->acc[e]);
        else
            fprintf(m, ",\n");
    }
    fclose(m);
    test_write_file(dir, "metrics.csv", csv);
    free(csv);
    snprintf(cfg, sizeof cfg,
             "{\"model\":\"%s\",\"dataset\":\"fashion-mnist\",\"workers\":%d,\"servers\":%d,"
             "\"batch\":32,\"lr\":0.01,\"iterations\":%d,\"eval_limit\":500,\"agent\":\"\","
             "\"codec\":\"uniform\",\"bucket\":0,\"stochastic\":false,\"error_feedback\":false,"
             "\"quant_threshold\":100000,\"link_mbps\":%g,\"seed\":1,\"final_eval_limit\":2000}\n",
             r->model, r->workers, r->servers, r->n, r->link_mbps);
    test_write_file(dir, "config.json", cfg);
    snprintf(sum, sizeof sum,
             "{\n  \"iterations\": %d,\n  \"train_time_s\": %g,\n  \"final_loss\": 1.5,\n"
             "  \"final_test_acc\": null,\n  \"bytes_up\": 0,\n  \"bytes_down\": 0,\n"
             "  \"policy\": \"%s\",\n  \"model\": \"%s\",\n  \"dataset\": \"fashion-mnist\",\n"
             "  \"workers\": %d,\n  \"servers\": %d,\n  \"seed\": 1,\n  \"link_mbps\": %g,\n"
             "  \"status\": \"%s\"%s\n}\n",
             r->n, t, r->policy, r->model, r->workers, r->servers, r->link_mbps, r->status,
             r->summary_extra ? r->summary_extra : "");
    test_write_file(dir, "summary.json", sum);
    test_write_file(dir, "events.jsonl", "{\"t\":0.000,\"iter\":0,\"event\":\"start\"}\n");
}

/* 2 bits for iterations 0-2, 3 for 3-6, 4 for 7-9. */
static const int s_bits3[N] = {2, 2, 2, 3, 3, 3, 3, 4, 4, 4};

/* The paper run: 4 workers, 2 servers, 80 Mbit/s, 5 s per iteration, evaluated at 4 and 9. */
static run_t s_paper_run(void)
{
    return (run_t){.model = "paper", .status = "completed", .policy = "mqgrad", .workers = 4,
                   .servers = 2, .link_mbps = 80, .n = N, .bits = s_bits3, .dt = 5,
                   .eval_at = {4, 9}, .acc = {0.5, 0.8771}};
}

/* ---- reading the summary ------------------------------------------------------------- */

/* The summary of DIR as text (malloc'd); *RC gets the function's return value. */
static char *s_summary(const char *dir, int *rc)
{
    char *text;
    size_t len;
    FILE *m = open_memstream(&text, &len);
    cr_assert_not_null(m);
    *rc = mq_run_summary_print(dir, m);
    fclose(m);
    return text;
}

/* Line K (0-based) of TEXT into BUF. */
static const char *s_line(const char *text, int k, char *buf, size_t len)
{
    for (; k > 0 && text; k--)
        if ((text = strchr(text, '\n')))
            text++;
    cr_assert(text && *text, "the summary has no line %d", k);
    snprintf(buf, len, "%.*s", (int)strcspn(text, "\n"), text);
    return buf;
}

static int s_lines(const char *text)
{
    int n = 0;
    for (const char *p = text; (p = strchr(p, '\n')); p++)
        n++;
    return n;
}

/* The paper's CNN on one input channel, from its layer shapes (docs/architecture.md, "The model"). */
static double s_paper_params(void)
{
    return (5.0 * 5 * 1 * 64 + 64) + (5.0 * 5 * 64 * 64 + 64) + (64.0 * 7 * 7 * 2304 + 2304) +
           (2304.0 * 3840 + 3840) + (3840.0 * 10 + 10);
}

/* ---- the lines ----------------------------------------------------------------------- */

Test(summary, completed_run_reads_in_five_lines)
{
    char dir[256], line[1024], want[1024];
    s_dir("paper", dir, sizeof dir);
    run_t run = s_paper_run();
    s_write_run(dir, &run);
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    cr_assert_eq(s_lines(text), 5, "five lines expected:\n%s", text);

    /* The last evaluation is the final one: its test set is final_eval_limit. */
    cr_assert_str_eq(s_line(text, 0, line, sizeof line),
                     "run completed: test accuracy 87.7% on 2000 test images after 10 "
                     "iterations, 50.0 s of training");
    cr_assert_str_eq(s_line(text, 1, line, sizeof line),
                     "bits (policy mqgrad): 2 (it 0-2) → 3 (3-6) → 4 (7-9)");

    /* fp32: every worker sends P = 4 x params bytes up and receives P back, each iteration. */
    double P = 4 * s_paper_params();
    cr_assert_eq(P, 4.0 * 16221386);
    double fp32 = N * 4 * P * 2, sent = 2e6 * (2 * 3 + 3 * 4 + 4 * 3);
    snprintf(want, sizeof want,
             "sent %.1f MB, %.1f× less than fp32 (≈ %.1f GB for the same 10 iterations)",
             sent / 1e6, fp32 / sent, fp32 / 1e9);
    cr_assert_str_eq(s_line(text, 2, line, sizeof line), want);
    cr_assert_str_eq(line, "sent 60.0 MB, 86.5× less than fp32 (≈ 5.2 GB for the same 10 "
                           "iterations)");

    /* The run's time with its link time replaced by fp32's: a server's NIC carries
     * W x P / S = 2P each way, twice a worker's, so every byte per worker counts twice. */
    double rate = 80e6 / 8, share = 4.0 / 2;
    double est = 50 + share * (N * 2 * P - sent / 4) / rate;
    snprintf(want, sizeof want,
             "time: 50.0 s of training; fp32 on the same 80 Mbit/s links ≈ %.0f s (%.1f min), "
             "%.1f× longer (estimate: this run's time with fp32's bytes on the link model)",
             est, est / 60, est / 50);
    cr_assert_str_eq(s_line(text, 3, line, sizeof line), want);
    cr_assert(strstr(line, "≈ 307 s (5.1 min), 6.1× longer"), "%s", line);

    snprintf(want, sizeof want, "files: %s/{summary.json,metrics.csv,events.jsonl,config.json}",
             dir);
    cr_assert_str_eq(s_line(text, 4, line, sizeof line), want);
    free(text);
}

/* Workers' NICs are the bottleneck when servers outnumber workers; the small model's count
 * comes from its layer shapes too; no link means no time estimate. */
Test(summary, small_model_worker_bound_and_loopback)
{
    char dir[256], line[1024], want[1024];
    s_dir("small", dir, sizeof dir);
    run_t run = s_paper_run();
    run.model = "small";
    run.workers = 1;
    run.servers = 4;
    run.link_mbps = 1;
    run.dt = 1;
    s_write_run(dir, &run);
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    double P = 4.0 * ((5 * 5 * 1 * 8 + 8) + (5 * 5 * 8 * 16 + 16) + (16 * 7 * 7 * 64 + 64) +
                      (64 * 32 + 32) + (32 * 10 + 10));
    /* One worker, four servers: the worker's NIC is the busier one (share 1). This made-up
     * run sent more than fp32 would have, so fp32 comes out shorter. */
    double rate = 1e6 / 8, est = 10 + (N * 2 * P - 2e6 * (2 * 3 + 3 * 4 + 4 * 3)) / rate;
    cr_assert_lt(est, 10);
    snprintf(want, sizeof want, "fp32 on the same 1 Mbit/s links ≈ %.1f s, %.1f× shorter", est,
             10 / est);
    cr_assert(strstr(s_line(text, 3, line, sizeof line), want), "%s\nwanted: %s", line, want);
    free(text);

    run.link_mbps = 0;
    s_write_run(dir, &run);
    text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(s_line(text, 3, line, sizeof line),
                     "time: 10.0 s of training; no link emulated (loopback): fp32 time not "
                     "estimated");
    free(text);
}

/* More than eight runs of equal bits: the first four, the last, and each width's share of the
 * training time (a 2-bit iteration takes 2 s here, a 5-bit one 5 s). */
Test(summary, many_bit_changes_give_shares_of_time)
{
    char dir[256], line[1024];
    s_dir("many", dir, sizeof dir);
    static const int pattern[10] = {2, 3, 2, 3, 4, 3, 4, 5, 4, 5};
    int bits[20];
    double t[20], sum = 0;
    for (int i = 0; i < 20; i++) {
        bits[i] = pattern[i / 2];
        t[i] = sum += bits[i];
    }
    run_t run = s_paper_run();
    run.policy = "adaptive";
    run.n = 20;
    run.bits = bits;
    run.t = t;
    run.eval_at[1] = 19;
    s_write_run(dir, &run);
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    cr_assert_str_eq(s_line(text, 1, line, sizeof line),
                     "bits (policy adaptive): 2 (it 0-1) → 3 (2-3) → 2 (4-5) → 3 (6-7) → … → "
                     "5 (18-19); 9 changes");
    /* 2 bits: 4 x 2 s, 3: 6 x 3 s, 4: 6 x 4 s, 5: 4 x 5 s, of 70 s. */
    cr_assert_eq(sum, 70);
    cr_assert_str_eq(s_line(text, 2, line, sizeof line),
                     "  share of training time: 2: 11%, 3: 26%, 4: 34%, 5: 29%");
    cr_assert(strstr(s_line(text, 0, line, sizeof line), "70.0 s of training"), "%s", line);
    free(text);
}

Test(summary, fp32_run_says_so)
{
    char dir[256], line[1024];
    s_dir("fp32", dir, sizeof dir);
    int bits[N];
    for (int i = 0; i < N; i++)
        bits[i] = 32;
    run_t run = s_paper_run();
    run.policy = "none";
    run.bits = bits;
    s_write_run(dir, &run);
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    cr_assert_str_eq(s_line(text, 1, line, sizeof line), "bits: fp32 (no quantization)");
    cr_assert_str_eq(s_line(text, 2, line, sizeof line),
                     "sent 640.0 MB, all in fp32 (no quantization)");
    cr_assert_str_eq(s_line(text, 3, line, sizeof line),
                     "time: 50.0 s of training in fp32 (this run is the baseline)");
    free(text);
}

/* `mqgrad train` leaves a run with one worker and no servers: nothing travels. */
Test(summary, one_process_run_sent_nothing)
{
    char dir[256], line[1024];
    s_dir("train", dir, sizeof dir);
    int bits[N];
    for (int i = 0; i < N; i++)
        bits[i] = 32;
    run_t run = s_paper_run();
    run.policy = "none";
    run.workers = 1;
    run.servers = 0;
    run.link_mbps = 0;
    run.bits = bits;
    s_write_run(dir, &run);
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    cr_assert_str_eq(s_line(text, 2, line, sizeof line),
                     "sent nothing: one process, no parameter servers");
    cr_assert_str_eq(s_line(text, 3, line, sizeof line), "time: 50.0 s of training");
    free(text);
}

/* A diverged run says so first, in words, with the evidence; the accuracy it shows was
 * measured before the divergence and says so. */
Test(summary, diverged_run_says_so_first)
{
    char dir[256], line[1024];
    s_dir("diverged", dir, sizeof dir);
    run_t run = s_paper_run();
    run.status = "diverged";
    run.eval_at[1] = -1;
    run.summary_extra = ",\n  \"divergence_rule\": \"loss\",\n  \"divergence_iter\": 7,\n"
                        "  \"divergence_detail\": \"the smoothed training loss stayed above 2 x "
                        "its best (0.5) for 15 iterations; now 3.1\"";
    s_write_run(dir, &run);
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    cr_assert_str_eq(s_line(text, 0, line, sizeof line),
                     "run DIVERGED at iteration 7: the training loss blew up (the smoothed "
                     "training loss stayed above 2 x its best (0.5) for 15 iterations; now 3.1)");
    /* Iteration 4 was not the final evaluation: eval_limit (500) images. */
    cr_assert_str_eq(s_line(text, 1, line, sizeof line),
                     "  10 iterations, 50.0 s of training; last test accuracy 50.0% on 500 test "
                     "images at iteration 4, before it diverged");
    cr_assert(strstr(s_line(text, 2, line, sizeof line), "bits (policy mqgrad): 2 (it 0-2)"));
    free(text);
}

/* Columns are found by name: reordered ones and columns appended later are fine. A last row
 * cut short by a killed run is left out. */
Test(summary, columns_by_name_and_a_cut_last_row)
{
    char dir[256], line[1024];
    s_dir("reorder", dir, sizeof dir);
    run_t run = s_paper_run();
    s_write_run(dir, &run);
    test_write_file(dir, "metrics.csv",
            "bits,iter,train_time_s,bytes_down,bytes_up,compute_ms,decode_ms,update_ms,test_acc,"
            "later\n"
            "2,0,1.5,100,100,10,0,0,,7\n"
            "2,1,3.0,100,100,10,0,0,0.25,7\n"
            "3,2,4.5,100,100,10,0,0,,7\n"
            "3,3");
    test_write_file(dir, "summary.json", "{\"status\":\"interrupted\",\"policy\":\"fixed:2\"}");
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    cr_assert_str_eq(s_line(text, 0, line, sizeof line),
                     "run interrupted (stopped before its end): 3 iterations, 4.5 s of "
                     "training; last test accuracy 25.0% on 500 test images at iteration 1");
    cr_assert_str_eq(s_line(text, 1, line, sizeof line),
                     "bits (policy fixed:2): 2 (it 0-1) → 3 (2)");
    free(text);
}

/* The header runlog writes now ends in workers, which older runs lack: the same run with and
 * without that column reads the same. */
Test(summary, the_workers_column_and_runs_from_before_it_read_the_same)
{
    char dir[256], path[512], *old_csv, *now_csv;
    size_t len;
    s_dir("workers", dir, sizeof dir);
    run_t run = s_paper_run();
    s_write_run(dir, &run);
    int rc;
    char *before = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    cr_assert_eq(mq_read_file(path, &old_csv, &len), 0);
    FILE *m = open_memstream(&now_csv, &len);
    for (char *save, *line = strtok_r(old_csv, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save))
        fprintf(m, "%s,%s\n", line,
                line == old_csv ? "workers,stragglers,slowest_rank,slowest_ms" : "4,0,2,120.5");
    fclose(m);
    cr_assert(strncmp(now_csv, MQ_METRICS_HEADER "\n", strlen(MQ_METRICS_HEADER) + 1) == 0,
              "%.300s", now_csv);
    test_write_file(dir, "metrics.csv", now_csv);
    char *after = s_summary(dir, &rc);
    cr_assert_eq(rc, 0, "%s", mq_err_last());
    cr_expect_str_eq(after, before);
    free(old_csv), free(now_csv), free(before), free(after);
}

/* ---- errors -------------------------------------------------------------------------- */

static void s_expect_error(const char *dir, const char *needle1, const char *needle2)
{
    int rc;
    char *text = s_summary(dir, &rc);
    cr_assert_eq(rc, -1, "a bad run directory must fail");
    cr_assert_str_empty(text, "nothing is printed on an error");
    const char *err = mq_err_last();
    cr_assert(strstr(err, needle1) && strstr(err, needle2), "error '%s' should name '%s' and '%s'",
              err, needle1, needle2);
    free(text);
}

Test(summary, missing_and_malformed_files_are_named)
{
    char dir[256], path[512];
    s_dir("bad", dir, sizeof dir);
    run_t run = s_paper_run();

    s_write_run(dir, &run);
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(unlink(path), 0);
    s_expect_error(dir, "config.json", "cannot open");

    s_write_run(dir, &run);
    test_write_file(dir, "summary.json", "{\n  \"status\": \"completed\",\n  \"iterations\": }\n");
    s_expect_error(dir, "summary.json:3", "expected a value");

    s_write_run(dir, &run);
    test_write_file(dir, "summary.json", "{\"iterations\": 10}");
    s_expect_error(dir, "summary.json", "\"status\"");

    s_write_run(dir, &run);
    test_write_file(dir, "metrics.csv", "iter,train_time_s,bits,bytes_up,bytes_down,compute_ms,"
                                "decode_ms,update_ms,test_acc\n"
                                "0,1,2,10,10,1,1,1,\n"
                                "1,2,x,10,10,1,1,1,\n");
    s_expect_error(dir, "metrics.csv:3", "column bits");

    test_write_file(dir, "metrics.csv", "iter,train_time_s,bytes_up,bytes_down\n0,1,10,10\n");
    s_expect_error(dir, "metrics.csv:1", "no column 'bits'");

    test_write_file(dir, "metrics.csv", "iter,train_time_s,bits,bytes_up,bytes_down,compute_ms,"
                                "decode_ms,update_ms,test_acc\n"
                                "0,1,2,10,10,1,1,1\n"
                                "1,2,2,10,10,1,1,1,\n");
    s_expect_error(dir, "metrics.csv:2", "8 columns, the header has 9");
}

/* ---- the command --------------------------------------------------------------------- */

/* Runs mqgrad summary ARG (NULL: no argument); its exit code, stdout and stderr in files. */
static int s_cmd(const char *arg, char **out, char **err)
{
    char po[256], pe[256];
    snprintf(po, sizeof po, "%s/stdout", s_root);
    snprintf(pe, sizeof pe, "%s/stderr", s_root);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        execl(MQGRAD_BIN, MQGRAD_BIN, "summary", arg, (char *)NULL);
        _exit(127);
    }
    int status;
    size_t len;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status));
    cr_assert_neq(WEXITSTATUS(status), 127, "cannot run %s", MQGRAD_BIN);
    cr_assert_eq(mq_read_file(po, out, &len), 0);
    cr_assert_eq(mq_read_file(pe, err, &len), 0);
    return WEXITSTATUS(status);
}

Test(summary, command_exit_codes)
{
    char dir[256], empty[256], *out, *err;
    cr_assert_eq(s_cmd(NULL, &out, &err), 2);
    cr_assert(strstr(err, "which run? give its directory") && strstr(err, "usage: mqgrad summary"),
              "%s", err);
    free(out);
    free(err);

    cr_assert_eq(s_cmd("/nonexistent/run", &out, &err), 2);
    cr_assert(strstr(err, "/nonexistent/run: not a run directory"), "%s", err);
    free(out);
    free(err);

    s_dir("empty", empty, sizeof empty);
    cr_assert_eq(s_cmd(empty, &out, &err), 2);
    cr_assert(strstr(err, "config.json: cannot open"), "%s", err);
    free(out);
    free(err);

    s_dir("ok", dir, sizeof dir);
    run_t run = s_paper_run();
    s_write_run(dir, &run);
    cr_assert_eq(s_cmd(dir, &out, &err), 0, "%s", err);
    cr_assert(strstr(out, "run completed: test accuracy 87.7%"), "%s", out);
    free(out);
    free(err);
}
