/* Tests of the run directory writer: the four files exist, parse (JSON through python3's json
 * module when it is installed), hold what was written, and survive odd strings and NaN; a
 * previous run is never written over and can be continued; a full disk fails the write. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "mqgrad/data.h"
#include "mqgrad/runlog.h"
#include "mqgrad/util.h"

static char s_dir[64];

static void s_mkdir(void)
{
    strcpy(s_dir, "/tmp/mq_test_runlog_XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
}

static void s_rmdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    cr_expect_eq(system(cmd), 0);
}

static char *s_read(const char *sub, const char *name)
{
    char path[256], *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/%s/%s", s_dir, sub, name);
    cr_assert_eq(mq_read_file(path, &text, &len), 0, "%s: %s", path, mq_err_last());
    return text;
}

/* 0 if python3 parses every line (JSONL) or the whole file (JSON); skips if no python3. */
static void s_expect_json(const char *sub, const char *name, bool lines)
{
    if (system("python3 -c pass >/dev/null 2>&1") != 0)
        return;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "python3 -c 'import json,sys; t=open(sys.argv[1]).read(); "
             "[json.loads(l) for l in t.splitlines()] if %s else json.loads(t)' '%s/%s/%s'",
             lines ? "True" : "False", s_dir, sub, name);
    cr_expect_eq(system(cmd), 0, "%s does not parse as JSON", name);
}

TestSuite(runlog, .init = s_mkdir, .fini = s_rmdir);

Test(runlog, writes_the_four_files)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/a/b/run", s_dir);
    mq_runlog_t *r = mq_runlog_new(dir, "{\"model\": \"small\"}");
    cr_assert_not_null(r, "%s", mq_err_last());
    cr_expect_str_eq(mq_runlog_dir(r), dir);
    mq_metrics_row_t row = {.iter = 1, .train_time_s = 0.5, .loss = 2.3, .smoothed_loss = 2.3,
                            .bits = 32, .compute_ms = 4, .workers = 3};
    cr_expect_eq(mq_runlog_row(r, &row), 0);
    row.iter = 2, row.evaluated = true, row.test_acc = 0.25, row.test_loss = 2.1;
    row.bytes_up = 1234567890123ull;
    cr_expect_eq(mq_runlog_row(r, &row), 0);
    cr_expect_eq(mq_runlog_event(r, 2, "eval", "\"test_acc\":0.25"), 0);
    cr_expect_eq(mq_runlog_event(r, 3, "odd \"name\"\n", NULL), 0);
    mq_summary_t s = {.iterations = 2, .train_time_s = 1, .final_loss = 2.1,
                      .final_test_acc = NAN, .policy = "none", .model = "small",
                      .dataset = "fashion-mnist", .workers = 1, .seed = 7,
                      .status = "completed"};
    cr_expect_eq(mq_runlog_summary(r, &s), 0);
    mq_runlog_destroy(&r);
    cr_expect_null(r);

    char *cfg = s_read("a/b/run", "config.json");
    cr_expect_str_eq(cfg, "{\"model\": \"small\"}\n");
    char *csv = s_read("a/b/run", "metrics.csv");
    char *line1 = strchr(csv, '\n') + 1, *line2 = strchr(line1, '\n') + 1;
    cr_expect(strncmp(csv, MQ_METRICS_HEADER "\n", strlen(MQ_METRICS_HEADER) + 1) == 0);
    cr_expect(strncmp(line1, "1,0.5000,2.3,2.3,32,0,0,", 24) == 0, "row 1: %.60s", line1);
    cr_expect(strstr(line1, ",,,3,0,0,0.000\n") == line2 - 15,
              "row 1 has empty test_acc and test_loss, then 3 workers: %.100s", line1);
    cr_expect(strstr(line2, ",1234567890123,") != NULL);
    cr_expect(strstr(line2, ",0.250000,2.1,3,") != NULL, "row 2: %s", line2);
    cr_expect(strstr(MQ_METRICS_HEADER,
                     ",test_acc,test_loss,workers,stragglers,slowest_rank,slowest_ms") != NULL &&
                  strlen(strstr(MQ_METRICS_HEADER, ",slowest_ms")) == strlen(",slowest_ms"),
              "columns are only appended: %s", MQ_METRICS_HEADER);
    for (char *p = csv; *p; p = strchr(p, '\n') + 1) {
        int commas = 0;
        for (char *q = p; *q != '\n'; q++)
            commas += *q == ',';
        cr_expect_eq(commas, 18, "every line has 19 columns");
    }
    char *sum = s_read("a/b/run", "summary.json");
    cr_expect(strstr(sum, "\"final_test_acc\": null") != NULL, "NaN is null: %s", sum);
    cr_expect(strstr(sum, "\"policy\": \"none\"") != NULL);
    s_expect_json("a/b/run", "summary.json", false);
    s_expect_json("a/b/run", "events.jsonl", true);
    s_expect_json("a/b/run", "config.json", false);
    free(cfg), free(csv), free(sum);
}

Test(runlog, json_escape_escapes_and_truncates)
{
    char buf[32];
    mq_json_escape("a\"b\\c\n\x01", buf, sizeof buf);
    cr_expect_str_eq(buf, "a\\\"b\\\\c\\n\\u0001");
    char small[5];
    mq_json_escape("abc\"def", small, sizeof small);
    cr_expect_str_eq(small, "abc", "never cuts an escape in half");
}

Test(runlog, unwritable_directory_fails_with_a_message)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/file", s_dir);
    FILE *f = fopen(dir, "w");
    fclose(f);
    strcat(dir, "/run");
    cr_expect_null(mq_runlog_new(dir, "{}"));
    cr_expect(strlen(mq_err_last()) > 0);
}

/* mqgrad train writes its run directory through runlog: check the files a user would read. */
Test(runlog, mqgrad_train_leaves_a_complete_run_directory, .timeout = 120)
{
    char bin[512], cmd[1400];
    snprintf(bin, sizeof bin, "%s/tools/mqgrad", MQ_TEST_BIN_DIR);
    if (access(bin, X_OK) != 0)
        cr_skip_test("%s not built", bin);
    if (access(MQ_DEFAULT_DATA_DIR "/train-images-idx3-ubyte.gz", R_OK) != 0)
        cr_skip_test("Fashion-MNIST not installed");
    snprintf(cmd, sizeof cmd,
             "%s train --model small --iterations 20 --eval-every 10 --eval-limit 200 "
             "--threads 1 --quiet --run-dir %s/train >/dev/null", bin, s_dir);
    cr_assert_eq(system(cmd), 0);
    char *csv = s_read("train", "metrics.csv"), *sum = s_read("train", "summary.json");
    int rows = 0;
    for (char *p = csv; (p = strchr(p, '\n')); p++)
        rows++;
    cr_expect_eq(rows, 21, "header + one row per iteration");
    cr_expect(strstr(csv, "\n20,") != NULL);
    cr_expect(strncmp(csv, MQ_METRICS_HEADER "\n", strlen(MQ_METRICS_HEADER) + 1) == 0);
    cr_expect(strcmp(csv + strlen(csv) - 13, ",1,0,0,0.000\n") == 0, "one worker: ...%s",
              csv + strlen(csv) - 40);
    cr_expect(strstr(sum, "\"iterations\": 20") && strstr(sum, "\"policy\": \"none\"") &&
              strstr(sum, "\"workers\": 1") && strstr(sum, "\"servers\": 0") &&
              strstr(sum, "\"status\": \"completed\""), "%s", sum);
    s_expect_json("train", "summary.json", false);
    s_expect_json("train", "config.json", false);
    s_expect_json("train", "events.jsonl", true);
    /* The same run directory again: refused, the first run's files untouched. */
    char *before = s_read("train", "metrics.csv");
    snprintf(cmd, sizeof cmd, "%s train --model small --iterations 5 --threads 1 --quiet "
             "--run-dir %s/train >/dev/null 2>&1", bin, s_dir);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2, "a run directory in use exits 2");
    char *after = s_read("train", "metrics.csv");
    cr_expect_str_eq(after, before, "the first run's metrics.csv was changed");
    free(csv), free(sum), free(before), free(after);
    snprintf(cmd, sizeof cmd, "%s train --batch 0 2>/dev/null", bin);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2, "a bad flag exits 2");
    snprintf(cmd, sizeof cmd, "%s train --data-dir %s/none --run-dir %s/r 2>/dev/null", bin,
             s_dir, s_dir);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2, "a missing dataset exits 2");
}

/* ---- a run directory is never written over; a run can be continued ----------------------- */

static const char *const s_files[] = {"config.json", "metrics.csv", "events.jsonl",
                                      "summary.json"};

/* A finished run in S_DIR/SUB: rows 1..N (2 evaluated), two events, a summary. */
static void s_run(const char *sub, int n)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s", s_dir, sub);
    mq_runlog_t *r = mq_runlog_new(dir, "{\"model\": \"small\"}");
    cr_assert_not_null(r, "%s", mq_err_last());
    cr_assert_eq(mq_runlog_event(r, 0, "start", NULL), 0, "%s", mq_err_last());
    for (int i = 1; i <= n; i++) {
        mq_metrics_row_t row = {.iter = (uint64_t)i, .train_time_s = i, .loss = 1.0 / i,
                                .smoothed_loss = 1.0 / i, .bits = 4, .workers = 2,
                                .evaluated = i == 2, .test_acc = 0.5, .test_loss = 0.9};
        cr_assert_eq(mq_runlog_row(r, &row), 0, "%s", mq_err_last());
    }
    mq_summary_t sum = {.iterations = (uint64_t)n, .final_test_acc = NAN, .final_sparsity = NAN,
                        .policy = "fixed:4", .status = "completed"};
    cr_assert_eq(mq_runlog_summary(r, &sum), 0, "%s", mq_err_last());
    cr_assert_eq(mq_runlog_event(r, (uint64_t)n, "end", NULL), 0, "%s", mq_err_last());
    mq_runlog_destroy(&r);
}

static void s_write(const char *sub, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s/%s", s_dir, sub, name);
    cr_assert_eq(mq_write_file_atomic(path, text, strlen(text)), 0, "%s", mq_err_last());
}

Test(runlog, new_refuses_a_directory_holding_a_run_and_leaves_it_as_it_was)
{
    char dir[128], *before[4], *after[4];
    s_run("old", 3);
    snprintf(dir, sizeof dir, "%s/old", s_dir);
    for (int i = 0; i < 4; i++)
        before[i] = s_read("old", s_files[i]);
    cr_expect_null(mq_runlog_new(dir, "{\"model\": \"other\"}"));
    const char *err = mq_err_last();
    cr_expect(strstr(err, dir) && strstr(err, "already holds a run (config.json)"), "%s", err);
    for (int i = 0; i < 4; i++) {
        after[i] = s_read("old", s_files[i]);
        cr_expect_str_eq(after[i], before[i], "%s was changed", s_files[i]);
        free(before[i]), free(after[i]);
    }
    /* Any one file of a run is enough to refuse: a run killed early, or only a summary. */
    for (int i = 0; i < 4; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "one-%d", i);
        snprintf(dir, sizeof dir, "%s/%s", s_dir, sub);
        cr_assert_eq(mq_mkdirs(dir), 0);
        s_write(sub, s_files[i], "kept\n");
        cr_expect_null(mq_runlog_new(dir, "{}"), "%s alone was not refused", s_files[i]);
        cr_expect(strstr(mq_err_last(), s_files[i]), "%s", mq_err_last());
        char *text = s_read(sub, s_files[i]);
        cr_expect_str_eq(text, "kept\n");
        free(text);
    }
    /* An empty directory, or one holding only other files, is fine. */
    snprintf(dir, sizeof dir, "%s/other", s_dir);
    cr_assert_eq(mq_mkdirs(dir), 0);
    s_write("other", "notes.txt", "mine\n");
    mq_runlog_t *r = mq_runlog_new(dir, "{}");
    cr_expect_not_null(r, "%s", mq_err_last());
    mq_runlog_destroy(&r);
    snprintf(dir, sizeof dir, "%s/empty", s_dir);
    cr_assert_eq(mq_mkdirs(dir), 0);
    r = mq_runlog_new(dir, "{}");
    cr_expect_not_null(r, "%s", mq_err_last());
    mq_runlog_destroy(&r);
}

Test(runlog, append_continues_a_run_after_its_rows)
{
    char dir[128];
    uint64_t last = 0;
    s_run("run", 3);
    snprintf(dir, sizeof dir, "%s/run", s_dir);
    char *csv = s_read("run", "metrics.csv"), *events = s_read("run", "events.jsonl");
    char *cfg = s_read("run", "config.json");
    cr_expect_eq(mq_runlog_last_iter(dir, &last), 0, "%s", mq_err_last());
    cr_expect_eq(last, 3);

    mq_runlog_t *r = mq_runlog_append(dir);
    cr_assert_not_null(r, "%s", mq_err_last());
    mq_metrics_row_t row = {.iter = 4, .train_time_s = 4, .loss = 0.2, .smoothed_loss = 0.25,
                            .bits = 8, .workers = 1};
    cr_expect_eq(mq_runlog_row(r, &row), 0, "%s", mq_err_last());
    cr_expect_eq(mq_runlog_event(r, 4, "resumed", NULL), 0, "%s", mq_err_last());
    mq_runlog_destroy(&r);

    char *csv2 = s_read("run", "metrics.csv"), *events2 = s_read("run", "events.jsonl");
    char *cfg2 = s_read("run", "config.json");
    cr_expect(strncmp(csv2, csv, strlen(csv)) == 0, "the old rows are not all there:\n%s", csv2);
    cr_expect_str_eq(csv2 + strlen(csv), "4,4.0000,0.2,0.25,8,0,0,0.000,0.000,0.000,0.000,0.000,"
                                         "0.000,,,1,0,0,0.000\n");
    cr_expect(strncmp(events2, events, strlen(events)) == 0, "%s", events2);
    cr_expect(strstr(events2 + strlen(events), "\"iter\":4,\"event\":\"resumed\"}\n"), "%s",
              events2);
    cr_expect_str_eq(cfg2, cfg, "config.json is left as it was");
    cr_expect_eq(mq_runlog_last_iter(dir, &last), 0, "%s", mq_err_last());
    cr_expect_eq(last, 4);
    s_expect_json("run", "events.jsonl", true);
    free(csv), free(events), free(cfg), free(csv2), free(events2), free(cfg2);
}

Test(runlog, last_iter_of_a_run_without_rows_or_with_a_cut_row)
{
    char dir[128];
    uint64_t last = 77;
    snprintf(dir, sizeof dir, "%s/fresh", s_dir);
    mq_runlog_t *r = mq_runlog_new(dir, "{}");
    cr_assert_not_null(r, "%s", mq_err_last());
    mq_runlog_destroy(&r);
    cr_expect_eq(mq_runlog_last_iter(dir, &last), 1, "the header alone: no row yet");
    cr_expect_eq(last, 77);
    s_write("fresh", "metrics.csv", MQ_METRICS_HEADER "\n0,1\n1,2\n2,3");
    cr_expect_eq(mq_runlog_last_iter(dir, &last), 0, "%s", mq_err_last());
    cr_expect_eq(last, 1, "a cut last row is not a row");
    snprintf(dir, sizeof dir, "%s/none", s_dir);
    cr_expect_eq(mq_runlog_last_iter(dir, &last), -1);
    cr_expect(strstr(mq_err_last(), "metrics.csv"), "%s", mq_err_last());
}

Test(runlog, append_refuses_what_is_not_a_run_it_can_continue)
{
    char dir[128];
    /* No config.json: not a run. */
    snprintf(dir, sizeof dir, "%s/noconfig", s_dir);
    cr_assert_eq(mq_mkdirs(dir), 0);
    s_write("noconfig", "metrics.csv", MQ_METRICS_HEADER "\n");
    cr_expect_null(mq_runlog_append(dir));
    cr_expect(strstr(mq_err_last(), "config.json"), "%s", mq_err_last());
    snprintf(dir, sizeof dir, "%s/nothing", s_dir);
    cr_expect_null(mq_runlog_append(dir));
    cr_expect(access(dir, F_OK) != 0, "a missing directory is not made");

    /* A run from before the workers column: rows appended now would not line up. */
    const char *old = "iter,train_time_s,loss,smoothed_loss,bits,bytes_up,bytes_down,compute_ms,"
                      "encode_ms,wait_ms,decode_ms,update_ms,agent_ms,test_acc,test_loss\n"
                      "1,0.5,2,2,4,400,200,10,2,20,1,1,0.5,,\n";
    snprintf(dir, sizeof dir, "%s/older", s_dir);
    cr_assert_eq(mq_mkdirs(dir), 0);
    s_write("older", "config.json", "{}\n");
    s_write("older", "metrics.csv", old);
    cr_expect_null(mq_runlog_append(dir));
    const char *err = mq_err_last();
    cr_expect(strstr(err, "metrics.csv") && strstr(err, "header") &&
              strstr(err, MQ_METRICS_HEADER), "%s", err);
    char *text = s_read("older", "metrics.csv");
    cr_expect_str_eq(text, old);
    free(text);

    /* A last row cut short: the next row would be glued to it. */
    snprintf(dir, sizeof dir, "%s/cut", s_dir);
    cr_assert_eq(mq_mkdirs(dir), 0);
    s_write("cut", "config.json", "{}\n");
    s_write("cut", "metrics.csv", MQ_METRICS_HEADER "\n1,0.5,2");
    cr_expect_null(mq_runlog_append(dir));
    cr_expect(strstr(mq_err_last(), "newline"), "%s", mq_err_last());
}

/* The descriptor this process holds on DIR/NAME now writes to /dev/full, as if the disk had
 * filled up under the run. */
static void s_fill_disk(const char *dir, const char *name)
{
    char path[256], want[PATH_MAX], link[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_not_null(realpath(path, want), "%s", path);
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d, "no /proc/self/fd");
    int found = -1;
    for (struct dirent *e; found < 0 && (e = readdir(d));) {
        ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (n > 0 && (link[n] = '\0', strcmp(link, want) == 0))
            found = atoi(e->d_name);
    }
    closedir(d);
    cr_assert_geq(found, 0, "no descriptor open on %s", want);
    int full = open("/dev/full", O_WRONLY);
    cr_assert_geq(full, 0);
    cr_assert_eq(dup2(full, found), found);
    close(full);
}

Test(runlog, a_full_disk_fails_the_write_with_the_file_and_the_reason)
{
    char dir[128], want_m[64], want_e[64];
    snprintf(dir, sizeof dir, "%s/full", s_dir);
    snprintf(want_m, sizeof want_m, "metrics.csv: %s", strerror(ENOSPC));
    snprintf(want_e, sizeof want_e, "events.jsonl: %s", strerror(ENOSPC));
    mq_runlog_t *r = mq_runlog_new(dir, "{}");
    cr_assert_not_null(r, "%s", mq_err_last());
    mq_metrics_row_t row = {.iter = 1, .bits = 4, .workers = 2};
    cr_expect_eq(mq_runlog_row(r, &row), 0, "%s", mq_err_last());
    s_fill_disk(dir, "metrics.csv");
    s_fill_disk(dir, "events.jsonl");
    row.iter = 2;
    cr_expect_eq(mq_runlog_row(r, &row), -1, "a row on a full disk must fail");
    cr_expect(strstr(mq_err_last(), want_m), "'%s' should say '%s'", mq_err_last(), want_m);
    cr_expect_eq(mq_runlog_row(r, &row), -1, "and the next one too");
    cr_expect_eq(mq_runlog_event(r, 2, "eval", NULL), -1, "an event on a full disk must fail");
    cr_expect(strstr(mq_err_last(), want_e), "'%s' should say '%s'", mq_err_last(), want_e);
    mq_runlog_destroy(&r);

    /* A resumed run whose events.jsonl is on the full disk. */
    char path[256];
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(symlink("/dev/full", path), 0);
    r = mq_runlog_append(dir);
    cr_assert_not_null(r, "%s", mq_err_last());
    cr_expect_eq(mq_runlog_event(r, 3, "resumed", NULL), -1);
    cr_expect(strstr(mq_err_last(), want_e), "%s", mq_err_last());
    cr_expect_eq(mq_runlog_row(r, &row), 0, "metrics.csv is on a disk with room: %s",
                 mq_err_last());
    mq_runlog_destroy(&r);
}

Test(runlog, a_summary_that_cannot_be_written_fails)
{
    char dir[128], path[256];
    snprintf(dir, sizeof dir, "%s/nosummary", s_dir);
    mq_runlog_t *r = mq_runlog_new(dir, "{}");
    cr_assert_not_null(r, "%s", mq_err_last());
    snprintf(path, sizeof path, "%s/summary.json", dir);
    cr_assert_eq(mkdir(path, 0755), 0); /* renaming the new summary over it fails */
    mq_summary_t sum = {.final_test_acc = NAN, .final_sparsity = NAN, .status = "completed"};
    cr_expect_eq(mq_runlog_summary(r, &sum), -1);
    cr_expect(strstr(mq_err_last(), "summary.json"), "%s", mq_err_last());
    mq_runlog_destroy(&r);
}

/* A supervisor's word on how a run ended: the status and reason replace the scheduler's,
 * everything else it wrote (the divergence too) stays, and a second word replaces the first
 * reason rather than adding one; with no summary, the fallback is written with them. */
Test(runlog, set_status_keeps_the_summary_and_replaces_status_and_reason)
{
    mq_summary_t s = {.iterations = 7, .final_loss = 1.5, .final_test_acc = NAN,
                      .final_sparsity = NAN, .policy = "fixed:4", .model = "small",
                      .dataset = "fashion-mnist", .workers = 2, .servers = 1, .seed = 3,
                      .status = "interrupted", .divergence_rule = "loss",
                      .divergence_iter = 5, .divergence_detail = "a \"spike\""};
    cr_assert_eq(mq_summary_write(s_dir, &s), 0, "%s", mq_err_last());
    cr_assert_eq(mq_summary_set_status(s_dir, "failed", "worker-0: \"no data\"", &s), 0);
    cr_assert_eq(mq_summary_set_status(s_dir, "failed", "worker-1 died", &s), 0);
    char path[600], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/summary.json", s_dir);
    cr_assert_eq(mq_read_file(path, &text, &len), 0);
    mq_summary_t want = s;
    want.status = "failed";
    want.reason = "worker-1 died";
    char expect[4096];
    cr_assert_eq(mq_summary_write(s_dir, &want), 0);
    char *again;
    cr_assert_eq(mq_read_file(path, &again, &len), 0);
    snprintf(expect, sizeof expect, "%s", again);
    cr_expect_str_eq(text, expect);
    free(text);
    free(again);

    unlink(path); /* no summary: the fallback, with the status and reason */
    s.divergence_rule = NULL;
    cr_assert_eq(mq_summary_set_status(s_dir, "failed", "no worker can join", &s), 0);
    cr_assert_eq(mq_read_file(path, &text, &len), 0);
    cr_expect(strstr(text, "\"status\": \"failed\",\n  \"reason\": \"no worker can join\"\n}"),
              "%s", text);
    cr_expect(strstr(text, "\"iterations\": 7"), "%s", text);
    free(text);
}
