/* Tests of the run directory writer: the four files exist, parse (JSON through python3's json
 * module when it is installed), hold what was written, and survive odd strings and NaN. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
                            .bits = 32, .compute_ms = 4};
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
    cr_expect(strstr(line1, ",,\n") == line2 - 3, "row 1 has empty test_acc and test_loss");
    cr_expect(strstr(line2, ",1234567890123,") != NULL);
    cr_expect(strstr(line2, ",0.250000,2.1\n") != NULL, "row 2: %s", line2);
    for (char *p = csv; *p; p = strchr(p, '\n') + 1) {
        int commas = 0;
        for (char *q = p; *q != '\n'; q++)
            commas += *q == ',';
        cr_expect_eq(commas, 14, "every line has 15 columns");
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
    cr_expect(strstr(sum, "\"iterations\": 20") && strstr(sum, "\"policy\": \"none\"") &&
              strstr(sum, "\"workers\": 1") && strstr(sum, "\"servers\": 0") &&
              strstr(sum, "\"status\": \"completed\""), "%s", sum);
    s_expect_json("train", "summary.json", false);
    s_expect_json("train", "config.json", false);
    s_expect_json("train", "events.jsonl", true);
    free(csv), free(sum);
    snprintf(cmd, sizeof cmd, "%s train --batch 0 2>/dev/null", bin);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2, "a bad flag exits 2");
    snprintf(cmd, sizeof cmd, "%s train --data-dir %s/none --run-dir %s/r 2>/dev/null", bin,
             s_dir, s_dir);
    cr_expect_eq(WEXITSTATUS(system(cmd)), 2, "a missing dataset exits 2");
}
