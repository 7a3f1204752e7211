/* Tests of `mqgrad report`: the test writes small run directories (2 methods x 2 seeds, values
 * simple enough to check by hand), runs the built mqgrad on them and checks report.md's tables
 * against numbers it computes from the same runs, the PNGs, and the errors on bad input; and,
 * on seeds whose accuracy is a straight line, the plots' data: median, band, where the line
 * stops, markers, one panel per link speed. */
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

#include "report.h"

#include "mqgrad/runlog.h"
#include "mqgrad/util.h"
#include "run_files.h"

#define MQGRAD_BIN MQ_TEST_BIN_DIR "/tools/mqgrad"
#define N_ITERS 8
#define N_EVALS 4 /* every second iteration */
#define N_RUNS 4

typedef struct {
    const char *policy, *dirname;
    int seed;
    double dt; /* seconds per iteration */
    int bits;
    double encode_ms, decode_ms, agent_ms;
    double acc[N_EVALS]; /* at iterations 2, 4, 6, 8 */
} run_spec_t;

/* fixed:4 is twice as fast per iteration as none (fp32). */
static const run_spec_t s_specs[N_RUNS] = {
    {"none", "none-1", 1, 1.0, 32, 0.05, 0.05, 0, {0.50, 0.70, 0.84, 0.86}},
    {"none", "none-2", 2, 1.0, 32, 0.05, 0.05, 0, {0.52, 0.74, 0.86, 0.88}},
    {"fixed:4", "fixed4-1", 1, 0.5, 4, 2.0, 1.0, 0.5, {0.60, 0.80, 0.86, 0.87}},
    {"fixed:4", "fixed4-2", 2, 0.5, 4, 3.0, 1.0, 0.25, {0.62, 0.84, 0.85, 0.88}},
};
static const char *s_methods[] = {"none", "fixed:4"};

static char s_root[64];

/* ---- the runs ------------------------------------------------------------------------ */

static double s_t(const run_spec_t *s, int i)
{
    return s->dt * i;
}
static double s_loss(const run_spec_t *s, int i)
{
    return (2.0 + 0.1 * s->seed) / i;
}
static double s_bytes(const run_spec_t *s)
{
    return 100.0 * s->bits + 50.0 * s->bits;
}


static void s_write_run(const run_spec_t *s)
{
    char dir[256], csv[8192], summary[1024];
    snprintf(dir, sizeof dir, "%s/%s", s_root, s->dirname);
    cr_assert_eq(mq_mkdirs(dir), 0);
    int n = snprintf(csv, sizeof csv,
                     "iter,train_time_s,loss,smoothed_loss,bits,bytes_up,"
                     "bytes_down,compute_ms,encode_ms,wait_ms,decode_ms,"
                     "update_ms,agent_ms,test_acc,test_loss\n");
    for (int i = 1; i <= N_ITERS; i++) {
        n += snprintf(csv + n, sizeof csv - n, "%d,%g,%g,%g,%d,%d,%d,10,%g,20,%g,1,%g,", i,
                      s_t(s, i), s_loss(s, i), s_loss(s, i), s->bits, 100 * s->bits, 50 * s->bits,
                      s->encode_ms, s->decode_ms, s->agent_ms);
        if (i % 2 == 0)
            n += snprintf(csv + n, sizeof csv - n, "%g,%g\n", s->acc[i / 2 - 1],
                          1 - s->acc[i / 2 - 1]);
        else
            n += snprintf(csv + n, sizeof csv - n, ",\n");
    }
    test_write_file(dir, "metrics.csv", csv);
    snprintf(summary, sizeof summary,
             "{\"iterations\":%d,\"train_time_s\":%g,\"final_loss\":%g,\"final_test_acc\":%g,"
             "\"bytes_up\":%d,\"bytes_down\":%d,\"policy\":\"%s\",\"model\":\"paper\","
             "\"dataset\":\"fashion-mnist\",\"workers\":4,\"servers\":2,\"seed\":%d,"
             "\"link_mbps\":80,\"status\":\"completed\"}\n",
             N_ITERS, s_t(s, N_ITERS), s_loss(s, N_ITERS), s->acc[N_EVALS - 1],
             N_ITERS * 100 * s->bits, N_ITERS * 50 * s->bits, s->policy, s->seed);
    test_write_file(dir, "summary.json", summary);
    test_write_file(dir, "config.json", "{}\n");
    test_write_file(dir, "events.jsonl", "");
}

static void s_setup(void)
{
    snprintf(s_root, sizeof s_root, "/tmp/mq_test_report_XXXXXX");
    cr_assert_not_null(mkdtemp(s_root));
    for (int r = 0; r < N_RUNS; r++)
        s_write_run(&s_specs[r]);
}

static int s_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void s_teardown(void)
{
    nftw(s_root, s_rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- running mqgrad ------------------------------------------------------------------ */

/* Runs mqgrad report with ARGS (NULL-terminated), stdout/stderr to files in the root; the
 * exit code. GNUPLOT, if set, becomes MQGRAD_GNUPLOT. */
static int s_report(const char *gnuplot, const char **args)
{
    char out[256], err[256];
    snprintf(out, sizeof out, "%s/stdout", s_root);
    snprintf(err, sizeof err, "%s/stderr", s_root);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        const char *argv[32] = {MQGRAD_BIN, "report"};
        int n = 2;
        for (; *args && n < 31; args++)
            argv[n++] = *args;
        argv[n] = NULL;
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0 || chdir(s_root) < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        if (gnuplot)
            setenv("MQGRAD_GNUPLOT", gnuplot, 1);
        execv(MQGRAD_BIN, (char *const *)argv);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "mqgrad report did not exit normally");
    cr_assert_neq(WEXITSTATUS(status), 127, "cannot run %s", MQGRAD_BIN);
    return WEXITSTATUS(status);
}

static char *s_slurp(const char *name)
{
    char path[512], *data;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", s_root, name);
    cr_assert_eq(mq_read_file(path, &data, &len), 0, "cannot read %s", path);
    return data;
}

static bool s_exists(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", s_root, name);
    return access(path, F_OK) == 0;
}

/* ---- reading report.md --------------------------------------------------------------- */

/* The cells of METHOD's row in the table under the heading starting with HEADING; the
 * method's own cell is cells[0]. Returns the number of cells. */
static int s_row(const char *md, const char *heading, const char *method, char cells[][96])
{
    char want[128];
    snprintf(want, sizeof want, "\n## %s", heading);
    const char *sec = strstr(md, want);
    cr_assert_not_null(sec, "report.md has no section '%s'", heading);
    const char *end = strstr(sec + 1, "\n## ");
    snprintf(want, sizeof want, "\n| %s |", method);
    const char *row = strstr(sec, want);
    cr_assert(row && (!end || row < end), "section '%s' has no row for %s", heading, method);
    row += 2;
    int n = 0;
    while (*row && *row != '\n' && n < 16) {
        size_t len = strcspn(row, "|\n");
        snprintf(cells[n], 96, "%.*s", (int)len, row);
        char *c = cells[n];
        while (*c == ' ')
            memmove(c, c + 1, strlen(c));
        for (size_t l = strlen(c); l && c[l - 1] == ' ';)
            c[--l] = '\0';
        n++;
        row += len;
        if (*row == '|')
            row++;
        if (*row == '\n' || !*row)
            break;
    }
    return n - (cells[n - 1][0] == '\0'); /* the trailing '|' leaves an empty cell */
}

/* "mean ± std" over N values, as the report prints it (sample std). */
static void s_fmt(char *buf, const double *v, int n, int prec)
{
    double mean = 0, sq = 0;
    for (int i = 0; i < n; i++)
        mean += v[i] / n;
    for (int i = 0; i < n; i++)
        sq += (v[i] - mean) * (v[i] - mean);
    if (n == 0)
        snprintf(buf, 96, "N/A");
    else if (n == 1)
        snprintf(buf, 96, "%.*f", prec, mean);
    else
        snprintf(buf, 96, "%.*f ± %.*f", prec, mean, prec, sqrt(sq / (n - 1)));
}

static double s_mean_of(const double *v, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++)
        m += v[i] / n;
    return m;
}

/* ---- expected values, from the specs the runs were written from ------------------------ */

/* Test accuracy (%) of the last evaluation at or before T; false if none. */
static bool s_acc_at(const run_spec_t *s, double t, double *acc)
{
    bool found = false;
    for (int i = 2; i <= N_ITERS; i += 2)
        if (s_t(s, i) <= t) {
            *acc = 100 * s->acc[i / 2 - 1];
            found = true;
        }
    return found;
}

static bool s_time_to(const run_spec_t *s, double target, double *t)
{
    for (int i = 2; i <= N_ITERS; i += 2)
        if (s->acc[i / 2 - 1] >= target) {
            *t = s_t(s, i);
            return true;
        }
    return false;
}

/* The runs of METHOD, in seed order (the specs list them so). */
static int s_runs_of(const char *method, const run_spec_t **out)
{
    int n = 0;
    for (int r = 0; r < N_RUNS; r++)
        if (strcmp(s_specs[r].policy, method) == 0)
            out[n++] = &s_specs[r];
    return n;
}

static void s_check_accuracy_table(const char *md)
{
    double shortest = INFINITY, cps[4];
    for (int r = 0; r < N_RUNS; r++)
        shortest = fmin(shortest, s_t(&s_specs[r], N_ITERS));
    char header[256] = "| method |", cell[96], cells[16][96];
    for (int c = 0; c < 4; c++) {
        cps[c] = shortest * (c + 1) / 4;
        snprintf(header + strlen(header), sizeof header - strlen(header), " %.4g s |", cps[c]);
    }
    cr_expect_not_null(strstr(md, header), "no accuracy header '%s' in report.md", header);
    for (int m = 0; m < 2; m++) {
        const run_spec_t *runs[N_RUNS];
        int nr = s_runs_of(s_methods[m], runs);
        cr_assert_eq(s_row(md, "Test accuracy", s_methods[m], cells), 5);
        for (int c = 0; c < 4; c++) {
            double v[N_RUNS];
            int n = 0;
            for (int r = 0; r < nr; r++)
                n += s_acc_at(runs[r], cps[c], &v[n]);
            s_fmt(cell, v, n, 2);
            if (n > 0 && n < nr)
                snprintf(cell + strlen(cell), 32, " (%d/%d)", n, nr);
            cr_expect_str_eq(cells[1 + c], cell, "%s at %g s", s_methods[m], cps[c]);
        }
    }
    /* By hand: fp32 has no evaluation before 2 s; fixed:4's at exactly 1 s counts. */
    cr_assert_eq(s_row(md, "Test accuracy", "none", cells), 5);
    cr_expect_str_eq(cells[1], "N/A");
    cr_assert_eq(s_row(md, "Test accuracy", "fixed:4", cells), 5);
    cr_expect_str_eq(cells[1], "61.00 ± 1.41");
    cr_expect_str_eq(cells[3], "85.50 ± 0.71");
}

static void s_check_time_table(const char *md)
{
    char cells[16][96], cell[96];
    for (int m = 0; m < 2; m++) {
        const run_spec_t *runs[N_RUNS];
        int nr = s_runs_of(s_methods[m], runs);
        double q[N_RUNS], a[N_RUNS], tot[N_RUNS];
        for (int r = 0; r < nr; r++) {
            double train_s = s_t(runs[r], N_ITERS);
            q[r] = 100 * N_ITERS * (runs[r]->encode_ms + runs[r]->decode_ms) / 1000 / train_s;
            a[r] = 100 * N_ITERS * runs[r]->agent_ms / 1000 / train_s;
            tot[r] = q[r] + a[r];
        }
        cr_assert_eq(s_row(md, "Fraction of training time", s_methods[m], cells), 4);
        s_fmt(cell, q, nr, 2);
        cr_expect_str_eq(cells[1], cell, "%s quantization", s_methods[m]);
        s_fmt(cell, a, nr, 2);
        cr_expect_str_eq(cells[2], cell, "%s agent", s_methods[m]);
        s_fmt(cell, tot, nr, 2);
        cr_expect_str_eq(cells[3], cell, "%s total", s_methods[m]);
    }
}

static void s_check_target_table(const char *md)
{
    char cells[16][96], cell[96];
    double mean[2];
    for (int m = 0; m < 2; m++) {
        const run_spec_t *runs[N_RUNS];
        int nr = s_runs_of(s_methods[m], runs), n = 0;
        double t[N_RUNS];
        for (int r = 0; r < nr; r++)
            n += s_time_to(runs[r], 0.85, &t[n]);
        cr_assert_eq(n, nr, "the specs have every run reach 85%%");
        mean[m] = s_mean_of(t, n);
        cr_assert_eq(s_row(md, "Time to reach 85% test accuracy", s_methods[m], cells), 4);
        s_fmt(cell, t, n, 2);
        cr_expect_str_eq(cells[1], cell, "%s time to 85%%", s_methods[m]);
    }
    /* Ratios to fp32 ("none") and to the best (only) fixed method. */
    for (int m = 0; m < 2; m++) {
        cr_assert_eq(s_row(md, "Time to reach 85% test accuracy", s_methods[m], cells), 4);
        snprintf(cell, sizeof cell, "%.2f", mean[m] / mean[0]);
        cr_expect_str_eq(cells[2], cell, "%s ÷ none", s_methods[m]);
        snprintf(cell, sizeof cell, "%.2f", mean[m] / mean[1]);
        cr_expect_str_eq(cells[3], cell, "%s ÷ fixed:4", s_methods[m]);
    }
    cr_expect_not_null(strstr(md, "÷ best fixed (fixed:4)"));
    /* By hand: fp32 reaches 85% at 8 s and 6 s, fixed:4 at 3 s twice. */
    cr_assert_eq(s_row(md, "Time to reach 85% test accuracy", "none", cells), 4);
    cr_expect_str_eq(cells[1], "7.00 ± 1.41");
    cr_expect_str_eq(cells[3], "2.33");
}

static void s_check_final_table(const char *md)
{
    char cells[16][96], cell[96];
    for (int m = 0; m < 2; m++) {
        const run_spec_t *runs[N_RUNS];
        int nr = s_runs_of(s_methods[m], runs);
        double loss[N_RUNS], acc[N_RUNS], bytes[N_RUNS], iters[N_RUNS];
        for (int r = 0; r < nr; r++) {
            loss[r] = s_loss(runs[r], N_ITERS);
            acc[r] = 100 * runs[r]->acc[N_EVALS - 1];
            bytes[r] = N_ITERS * s_bytes(runs[r]);
            iters[r] = N_ITERS;
        }
        cr_assert_eq(s_row(md, "Final results", s_methods[m], cells), 7);
        snprintf(cell, sizeof cell, "%d", nr);
        cr_expect_str_eq(cells[1], cell);
        s_fmt(cell, loss, nr, 4);
        cr_expect_str_eq(cells[2], cell, "%s final loss", s_methods[m]);
        s_fmt(cell, acc, nr, 2);
        cr_expect_str_eq(cells[3], cell, "%s final accuracy", s_methods[m]);
        s_fmt(cell, bytes, nr, 0);
        cr_expect_str_eq(cells[4], cell, "%s bytes", s_methods[m]);
        s_fmt(cell, iters, nr, 0);
        cr_expect_str_eq(cells[5], cell, "%s iterations", s_methods[m]);
    }
}

static bool s_have_gnuplot(void)
{
    return system("command -v gnuplot >/dev/null 2>&1") == 0;
}

/* ---- tests --------------------------------------------------------------------------- */

TestSuite(report, .init = s_setup, .fini = s_teardown, .timeout = 60);

Test(report, tables_match_the_runs)
{
    const char *args[] = {"--out",  "rep",      "--title",  "test report", "none-1",
                          "none-2", "fixed4-1", "fixed4-2", NULL};
    int rc = s_report(NULL, args);
    char *err = s_slurp("stderr"), *out = s_slurp("stdout");
    cr_assert_eq(rc, 0, "mqgrad report failed: %s", err);
    cr_expect_not_null(strstr(out, "rep/report.md"), "stdout does not say where: %s", out);
    char *md = s_slurp("rep/report.md");
    cr_expect_not_null(strstr(md, "# test report\n"));
    s_check_accuracy_table(md);
    s_check_time_table(md);
    s_check_target_table(md);
    s_check_final_table(md);
    /* fp32 comes before fixed:4 whatever the order of the arguments. */
    cr_expect_lt(strstr(md, "\n| none |"), strstr(md, "\n| fixed:4 |"));
    free(md);
    free(out);
    free(err);
}

Test(report, draws_the_four_plots)
{
    const char *args[] = {"none-1", "none-2", "fixed4-1", "fixed4-2", NULL};
    int rc = s_report(NULL, args);
    char *err = s_slurp("stderr"), *md;
    cr_assert_eq(rc, 0, "mqgrad report failed: %s", err);
    md = s_slurp("report/report.md"); /* the default --out */
    const char *plots[] = {"loss", "accuracy", "bits", "bytes"};
    bool gnuplot = s_have_gnuplot();
    if (!gnuplot)
        cr_log_info("gnuplot is not installed: PNG contents not checked");
    for (int i = 0; i < 4; i++) {
        char name[64], link[96];
        snprintf(link, sizeof link, "(%s.png)", plots[i]);
        cr_expect_not_null(strstr(md, link), "report.md does not link %s.png", plots[i]);
        snprintf(name, sizeof name, "report/%s.gp", plots[i]);
        cr_expect(s_exists(name), "no %s", name);
        if (!gnuplot)
            continue;
        snprintf(name, sizeof name, "report/%s.png", plots[i]);
        char *png = s_slurp(name);
        cr_expect_eq(memcmp(png, "\x89PNG\r\n\x1a\n", 8), 0, "%s is not a PNG", name);
        free(png);
    }
    free(md);
    free(err);
}

Test(report, without_gnuplot_writes_scripts_and_tables)
{
    const char *args[] = {"--out", "rep", "none-1", "fixed4-1", NULL};
    int rc = s_report("/nonexistent/gnuplot", args);
    char *err = s_slurp("stderr");
    cr_assert_eq(rc, 0, "mqgrad report failed: %s", err);
    cr_expect_not_null(strstr(err, "gnuplot not found"), "no warning: %s", err);
    cr_expect(s_exists("rep/report.md"));
    cr_expect(s_exists("rep/loss.gp"));
    cr_expect(s_exists("rep/data/loss_fixed-4.dat"));
    cr_expect(!s_exists("rep/loss.png"));
    free(err);
}

Test(report, garbled_metrics_names_file_and_line)
{
    /* Line 4 is iteration 3: a letter in its loss column. */
    char path[256];
    snprintf(path, sizeof path, "%s/fixed4-2", s_root);
    test_write_file(path, "metrics.csv",
            "iter,train_time_s,loss,smoothed_loss,bits,bytes_up,bytes_down,compute_ms,"
            "encode_ms,wait_ms,decode_ms,update_ms,agent_ms,test_acc,test_loss\n"
            "1,0.5,2,2,4,400,200,10,2,20,1,1,0.5,,\n"
            "2,1,1,1,4,400,200,10,2,20,1,1,0.5,0.6,0.4\n"
            "3,1.5,zero,1,4,400,200,10,2,20,1,1,0.5,,\n");
    const char *args[] = {"--out", "rep", "none-1", "fixed4-2", NULL};
    int rc = s_report(NULL, args);
    char *err = s_slurp("stderr");
    cr_expect_eq(rc, 2);
    cr_expect_not_null(strstr(err, "fixed4-2/metrics.csv:4"), "error does not name it: %s", err);
    cr_expect(!s_exists("rep/report.md"));
    free(err);
}

/* metrics.csv is read by column name: the header runlog writes now (workers last), the older
 * one without workers (the runs of s_setup), and one reordered with a column it does not know.
 * A column it needs, missing, is named. */
Test(report, metrics_columns_are_read_by_name)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s/now", s_root);
    mq_runlog_t *log = mq_runlog_new(dir, "{}");
    cr_assert_not_null(log, "%s", mq_err_last());
    for (int i = 1; i <= 3; i++) {
        mq_metrics_row_t row = {.iter = (uint64_t)i, .train_time_s = i, .loss = 1.0 / i,
                                .smoothed_loss = 1.0 / i, .bits = 4, .bytes_up = 10,
                                .bytes_down = 5, .workers = (uint32_t)i + 1, .evaluated = i == 2,
                                .test_acc = 0.75, .test_loss = 0.5};
        cr_assert_eq(mq_runlog_row(log, &row), 0, "%s", mq_err_last());
    }
    mq_summary_t sum = {.iterations = 3, .final_test_acc = NAN, .final_sparsity = NAN,
                        .final_loss = NAN, .policy = "fixed:4", .seed = 1, .status = "completed"};
    cr_assert_eq(mq_runlog_summary(log, &sum), 0, "%s", mq_err_last());
    mq_runlog_destroy(&log);
    mq_rep_run_t run;
    cr_assert_eq(mq_rep_load_run(dir, &run), 0, "%s", mq_err_last());
    cr_expect_eq(run.n_rows, 3);
    cr_expect_eq(run.rows[2].workers, 4);
    cr_expect(run.rows[1].evaluated && run.rows[1].acc == 0.75 && run.rows[1].test_loss == 0.5);
    cr_expect(!run.rows[2].evaluated && run.rows[2].bytes == 15 && run.rows[2].bits == 4);
    cr_expect_eq(run.final_acc, 0.75, "the last evaluation: %g", run.final_acc);
    mq_rep_run_free(&run);

    snprintf(dir, sizeof dir, "%s/none-1", s_root);
    cr_assert_eq(mq_rep_load_run(dir, &run), 0, "%s", mq_err_last());
    cr_expect_eq(run.n_rows, N_ITERS);
    cr_expect_eq(run.rows[0].workers, 0, "a run from before the column: workers unknown");
    mq_rep_run_free(&run);

    snprintf(dir, sizeof dir, "%s/fixed4-1", s_root);
    test_write_file(dir, "metrics.csv",
                    "later,test_loss,test_acc,workers,agent_ms,update_ms,decode_ms,wait_ms,"
                    "encode_ms,compute_ms,bytes_down,bytes_up,bits,smoothed_loss,loss,"
                    "train_time_s,iter\n"
                    "x,,,2,0.5,1,1,20,2,10,200,400,4,2,2,0.5,1\n"
                    "y,0.4,0.6,2,0.5,1,1,20,2,10,200,400,4,1,1,1,2\n");
    cr_assert_eq(mq_rep_load_run(dir, &run), 0, "%s", mq_err_last());
    cr_expect(run.n_rows == 2 && run.rows[1].iter == 2 && run.rows[1].t == 1 &&
              run.rows[1].acc == 0.6 && run.rows[1].test_loss == 0.4 &&
              run.rows[1].bytes == 600 && run.rows[1].compute_ms == 10 &&
              run.rows[1].agent_ms == 0.5 && run.rows[1].workers == 2);
    mq_rep_run_free(&run);

    test_write_file(dir, "metrics.csv",
                    "iter,train_time_s,loss,smoothed_loss,bits,bytes_up,bytes_down,compute_ms,"
                    "encode_ms,decode_ms,update_ms,agent_ms,test_acc,test_loss,workers\n"
                    "1,0.5,2,2,4,400,200,10,2,1,1,0.5,,,2\n");
    cr_expect_eq(mq_rep_load_run(dir, &run), -1);
    cr_expect(strstr(mq_err_last(), "fixed4-1/metrics.csv:1: no column 'wait_ms'"), "%s",
              mq_err_last());
    test_write_file(dir, "metrics.csv", MQ_METRICS_HEADER "\n"
                                        "1,0.5,2,2,4,400,200,10,2,20,1,1,0.5,,,2.5,0,0,0\n");
    cr_expect_eq(mq_rep_load_run(dir, &run), -1);
    cr_expect(strstr(mq_err_last(), "metrics.csv:2: column workers"), "%s", mq_err_last());
    test_write_file(dir, "metrics.csv", MQ_METRICS_HEADER "\n"
                                        "1,0.5,2,2,4,400,200,10,2,20,1,1,0.5,,\n");
    cr_expect_eq(mq_rep_load_run(dir, &run), -1);
    cr_expect(strstr(mq_err_last(), "metrics.csv:2: 15 columns, the header has 19"), "%s",
              mq_err_last());
}

Test(report, missing_summary_is_named)
{
    char path[256];
    snprintf(path, sizeof path, "%s/none-2/summary.json", s_root);
    cr_assert_eq(unlink(path), 0);
    const char *args[] = {"none-1", "none-2", NULL};
    int rc = s_report(NULL, args);
    char *err = s_slurp("stderr");
    cr_expect_eq(rc, 2);
    cr_expect_not_null(strstr(err, "none-2/summary.json"), "error does not name it: %s", err);
    free(err);
}

/* Rewrites run S's summary.json with STATUS_JSON as the "status" member and what follows it
 * (e.g. "\"diverged\",\"divergence_rule\":\"loss\",...") and FINAL_ACC (JSON) as its final
 * accuracy, and its config.json with CONFIG if given. */
static void s_restate(const run_spec_t *s, const char *status_json, const char *final_acc,
                      const char *config)
{
    char dir[256], summary[1024];
    snprintf(dir, sizeof dir, "%s/%s", s_root, s->dirname);
    snprintf(summary, sizeof summary,
             "{\"iterations\":%d,\"train_time_s\":%g,\"final_loss\":%g,\"final_test_acc\":%s,"
             "\"bytes_up\":%d,\"bytes_down\":%d,\"policy\":\"%s\",\"model\":\"paper\","
             "\"dataset\":\"fashion-mnist\",\"workers\":4,\"servers\":2,\"seed\":%d,"
             "\"link_mbps\":80,\"status\":%s}\n",
             N_ITERS, s_t(s, N_ITERS), s_loss(s, N_ITERS), final_acc, N_ITERS * 100 * s->bits,
             N_ITERS * 50 * s->bits, s->policy, s->seed, status_json);
    test_write_file(dir, "summary.json", summary);
    if (config)
        test_write_file(dir, "config.json", config);
}

/* Rewrites run S's summary.json as a diverged run: stopped at iteration ITER by RULE, with
 * FINAL_ACC (JSON: "null", or an evaluation made after the divergence) as its accuracy. */
static void s_diverge(const run_spec_t *s, int iter, const char *rule, const char *final_acc)
{
    char status[512];
    snprintf(status, sizeof status,
             "\"diverged\",\"divergence_rule\":\"%s\",\"divergence_iter\":%d,"
             "\"divergence_detail\":\"smoothed loss 9.24 stayed above 2x the best (2.09) for 20 "
             "iterations\"",
             rule, iter);
    s_restate(s, status, final_acc, NULL);
}

/* A diverged run is shown as diverged and never as its method's accuracy: the method's cells
 * are the other seed's alone, its name says how many diverged, the runs table names the
 * iteration, the rule and the evidence. */
Test(report, diverged_run_is_shown_as_such_and_left_out_of_the_accuracy)
{
    s_diverge(&s_specs[3], 7, "loss", "null");
    const char *args[] = {"--out", "rep", "--target-acc", "0.8", s_specs[0].dirname,
                          s_specs[1].dirname, s_specs[2].dirname, s_specs[3].dirname, NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *md = s_slurp("rep/report.md");
    char cells[16][96];
    const char *name = "fixed:4 — 1 of 2 diverged";
    cr_expect(strstr(md, "1 of the 4 runs diverged"), "the report says so up front:\n%s", md);
    int n = s_row(md, "Final results", name, cells);
    cr_assert_eq(n, 7, "%s", md);
    /* Only seed 1 (fixed4-1: final accuracy 87 %, loss 2.1/8) counts: no mean ± std. */
    cr_expect_str_eq(cells[1], "2", "both seeds are the method's");
    cr_expect_str_eq(cells[2], "0.2625", "final loss of the live run only");
    cr_expect_str_eq(cells[3], "87.00", "final accuracy of the live run only: %s", cells[3]);
    /* Checkpoints 1..4 s (the shortest run that did not diverge is fixed4-1, 4 s). */
    cr_assert_eq(s_row(md, "Test accuracy", name, cells), 5, "%s", md);
    cr_expect_str_eq(cells[1], "60.00");
    cr_expect_str_eq(cells[4], "87.00");
    s_row(md, "Time to reach 80", name, cells);
    cr_expect_str_eq(cells[1], "2.00", "seed 1 alone, at 80 %% from 2 s (iteration 4)");
    /* A fixed:K with a diverged run is no reference for the others. */
    cr_expect(strstr(md, "÷ best fixed (none reached it without a diverged run)"), "%s", md);
    cr_expect(strstr(md, "| fixed:4 | 2 | 8 | 4.00 | **diverged** at iteration 7 (loss rule) | "
                         "diverged: smoothed loss 9.24 stayed above 2x the best (2.09) for 20 "
                         "iterations |"),
              "the runs table names the divergence:\n%s", md);
    cr_expect(strstr(md, "| fixed:4 | 1 | 8 | 4.00 | 87.00 | completed |"), "%s", md);
    /* fp32 is untouched. */
    cr_assert_eq(s_row(md, "Final results", "none", cells), 7);
    cr_expect_str_eq(cells[3], "87.00 ± 1.41");
    free(md);
}

/* When every run of a method diverged, no cell of it holds a number, even an evaluation made
 * after the divergence; the plots still draw it, marked in the legend. */
Test(report, method_whose_runs_all_diverged_has_no_accuracy)
{
    s_diverge(&s_specs[2], 5, "nonfinite", "0.1");
    s_diverge(&s_specs[3], 7, "accuracy", "0.1");
    const char *args[] = {"--out", "rep", s_specs[0].dirname, s_specs[1].dirname,
                          s_specs[2].dirname, s_specs[3].dirname, NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *md = s_slurp("rep/report.md");
    char cells[16][96];
    const char *name = "fixed:4 — 2 of 2 diverged";
    cr_assert_eq(s_row(md, "Final results", name, cells), 7, "%s", md);
    cr_expect_str_eq(cells[2], "—");
    cr_expect_str_eq(cells[3], "diverged (2/2) at iterations 5, 7");
    cr_assert_eq(s_row(md, "Test accuracy", name, cells), 5);
    for (int c = 1; c <= 4; c++)
        cr_expect_str_eq(cells[c], "diverged", "checkpoint %d", c);
    cr_assert_eq(s_row(md, "Time to reach 85", name, cells), 4);
    cr_expect_str_eq(cells[1], "diverged (2/2) at iterations 5, 7");
    cr_expect_str_eq(cells[2], "—");
    cr_expect(strstr(md, "÷ best fixed (none reached it without a diverged run)"), "%s", md);
    /* Not the 10 % its summary.json measured after the divergence. */
    cr_expect(strstr(md, "| fixed:4 | 1 | 8 | 4.00 | **diverged** at iteration 5 (nonfinite "
                         "rule) |"),
              "%s", md);
    /* Default checkpoints come from the runs that did not diverge (fp32: 8 s). */
    cr_expect(strstr(md, "| method | 2 s | 4 s | 6 s | 8 s |"), "%s", md);
    char *gp = s_slurp("rep/accuracy.gp");
    cr_expect(strstr(gp, "title 'fixed:4 (2 seeds, 2 diverged)'"), "%s", gp);
    cr_expect(strstr(gp, "title 'none (2 seeds)'"), "%s", gp);
    free(gp);
    free(md);
}

static void s_config(const run_spec_t *s, const char *config)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", s_root, s->dirname);
    test_write_file(dir, "config.json", config);
}

#define S_CONFIG(bucket, stoch, ef)                                                                \
    "{\"model\":\"paper\",\"codec\":\"uniform\",\"bucket\":" #bucket                              \
    ",\"stochastic\":" #stoch ",\"error_feedback\":" #ef ",\"seed\":1}\n"

/* The same policy with bucket 0 and bucket 512 makes two methods; the paper-exact one is
 * named, the other keeps the plain policy; they sit together, plain first. */
Test(report, paper_exact_and_bucketed_runs_are_two_methods)
{
    s_config(&s_specs[2], S_CONFIG(0, false, false));
    s_config(&s_specs[3], S_CONFIG(512, false, false));
    const char *args[] = {"--out", "rep", s_specs[3].dirname, s_specs[2].dirname,
                          s_specs[0].dirname, NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *md = s_slurp("rep/report.md");
    char cells[16][96];
    cr_assert_eq(s_row(md, "Final results", "fixed:4 (paper-exact codec)", cells), 7, "%s", md);
    cr_expect_str_eq(cells[1], "1", "one seed in the paper-exact group");
    cr_expect_str_eq(cells[3], "87.00", "fixed4-1's own accuracy");
    cr_assert_eq(s_row(md, "Final results", "fixed:4", cells), 7);
    cr_expect_str_eq(cells[1], "1", "one seed in the bucketed group");
    cr_expect_str_eq(cells[3], "88.00", "fixed4-2's own accuracy");
    cr_expect(strstr(md, "3 runs of 3 methods"), "%s", md);
    cr_expect(strstr(md, "(codec uniform, bucket 512, nearest rounding, no error feedback)"),
              "the report says what the plain names used:\n%s", md);
    cr_expect(strstr(md, "\"paper-exact codec\" is the paper's: one range per tensor slice, "
                         "nearest rounding"),
              "%s", md);
    const char *runs = strstr(md, "## Runs");
    cr_assert_not_null(runs, "%s", md);
    const char *none = strstr(runs, "\n| none |"), *plain = strstr(runs, "\n| fixed:4 |"),
               *exact = strstr(runs, "\n| fixed:4 (paper-exact codec) |");
    cr_expect(none && plain && exact && none < plain && plain < exact, "order:\n%s", md);
    free(md);
}

/* The plain name is the setting most runs share, whatever it is; other settings name how
 * they differ from it; runs whose config.json predates the codec fields still load. */
Test(report, common_setting_keeps_the_plain_name)
{
    s_config(&s_specs[2], S_CONFIG(128, false, false));
    s_config(&s_specs[3], S_CONFIG(128, false, false));
    const char *args[] = {"--out", "rep", s_specs[2].dirname, s_specs[3].dirname, NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *md = s_slurp("rep/report.md");
    char cells[16][96];
    cr_assert_eq(s_row(md, "Final results", "fixed:4", cells), 7, "%s", md);
    cr_expect_str_eq(cells[1], "2", "one method of two seeds");
    cr_expect(strstr(md, "(codec uniform, bucket 128, nearest rounding"), "%s", md);
    free(md);

    /* One run at 512 and one at 128 with stochastic rounding and error feedback: a tie goes to
     * the cluster's default (512), the other names its differences. */
    s_config(&s_specs[3], S_CONFIG(512, false, false));
    s_config(&s_specs[2], S_CONFIG(128, true, true));
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    md = s_slurp("rep/report.md");
    cr_expect(strstr(md, "| fixed:4 (bucket 128, stochastic, error feedback) | 1 |"), "%s", md);
    cr_expect(strstr(md, "| fixed:4 | 1 |"), "%s", md);
    free(md);

    /* An older config.json (no codec fields) loads under the plain policy. */
    s_config(&s_specs[2], "{\"model\":\"paper\",\"seed\":1}\n");
    s_config(&s_specs[3], "{\"model\":\"paper\",\"seed\":2}\n");
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    md = s_slurp("rep/report.md");
    cr_assert_eq(s_row(md, "Final results", "fixed:4", cells), 7, "%s", md);
    cr_expect_str_eq(cells[1], "2");
    free(md);
}

Test(report, bad_codec_field_names_the_file)
{
    s_config(&s_specs[2], "{\"bucket\":\"per tensor\"}\n");
    const char *args[] = {"--out", "rep", s_specs[2].dirname, NULL};
    cr_expect_eq(s_report("/nonexistent-gnuplot", args), 2);
    char *err = s_slurp("stderr");
    cr_expect(strstr(err, "fixed4-1/config.json: \"bucket\""), "%s", err);
    free(err);
}

/* ---- the plots' curves ----------------------------------------------------------------- */

/* Writes run directory DIRNAME: POLICY, SEED, at LINK Mbit/s, N iterations at times T[i] with
 * test accuracy ACC[i] (NaN: not evaluated at that iteration). */
static void s_write_curve(const char *dirname, const char *policy, int seed, double link, int n,
                          const double *t, const double *acc)
{
    char dir[256], summary[1024];
    size_t cap = 256 + (size_t)n * 128, len;
    char *csv = malloc(cap);
    cr_assert_not_null(csv);
    snprintf(dir, sizeof dir, "%s/%s", s_root, dirname);
    cr_assert_eq(mq_mkdirs(dir), 0);
    len = (size_t)snprintf(csv, cap, "iter,train_time_s,loss,smoothed_loss,bits,bytes_up,"
                                     "bytes_down,compute_ms,encode_ms,wait_ms,decode_ms,"
                                     "update_ms,agent_ms,test_acc,test_loss\n");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(csv + len, cap - len, "%d,%.10g,%g,%g,2,100,100,10,1,20,1,1,0,",
                                i + 1, t[i], 2.0 / (i + 1), 2.0 / (i + 1));
        if (isnan(acc[i]))
            len += (size_t)snprintf(csv + len, cap - len, ",\n");
        else
            len += (size_t)snprintf(csv + len, cap - len, "%.10g,%.10g\n", acc[i], 1 - acc[i]);
    }
    test_write_file(dir, "metrics.csv", csv);
    snprintf(summary, sizeof summary,
             "{\"iterations\":%d,\"train_time_s\":%.10g,\"policy\":\"%s\",\"seed\":%d,"
             "\"link_mbps\":%g,\"status\":\"completed\"}\n",
             n, t[n - 1], policy, seed, link);
    test_write_file(dir, "summary.json", summary);
    free(csv);
}

typedef struct {
    double t, median, q25, q75;
    int seeds;
} dat_row_t;

/* Reads data file NAME (under the root): block 0, "time median q25 q75 seeds", into ROWS, and
 * block 1, the method's points, into MARKS ([time, value]); the number of rows. */
static int s_read_dat(const char *name, dat_row_t *rows, int max, double (*marks)[2],
                      int *n_marks)
{
    char *text = s_slurp(name), *save = NULL;
    int n = 0, block = 0;
    *n_marks = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            if (strstr(line, "# block 1"))
                block = 1;
            continue;
        }
        if (block == 0 && n < max) {
            dat_row_t *r = &rows[n];
            cr_assert_eq(sscanf(line, "%lf %lf %lf %lf %d", &r->t, &r->median, &r->q25, &r->q75,
                                &r->seeds),
                         5, "%s: bad row '%s'", name, line);
            n++;
        } else if (block == 1 && *n_marks < 16) {
            cr_assert_eq(sscanf(line, "%lf %lf", &marks[*n_marks][0], &marks[*n_marks][1]), 2,
                         "%s: bad point '%s'", name, line);
            (*n_marks)++;
        }
    }
    free(text);
    return n;
}

/* How many times NEEDLE occurs in TEXT. */
static int s_count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* The row of ROWS at time T, or NULL. */
static const dat_row_t *s_row_at(const dat_row_t *rows, int n, double t)
{
    for (int i = 0; i < n; i++)
        if (fabs(rows[i].t - t) < 1e-9)
            return &rows[i];
    return NULL;
}

/* The row of data file NAME (under the root) at time T, which must be there. */
static dat_row_t s_dat_at(const char *name, double t)
{
    dat_row_t rows[512];
    double marks[16][2];
    int n_marks, n = s_read_dat(name, rows, 512, marks, &n_marks);
    const dat_row_t *r = s_row_at(rows, n, t);
    cr_assert_not_null(r, "%s: no row at %g", name, t);
    return *r;
}


/* Three seeds of one method at 1.0, 1.1 and 1.25 s per iteration, evaluated at every one of
 * 20 iterations; accuracy (%) 20 + 2t, 30 + 2t and 10 + 2t: the median is seed 1's, the
 * quartiles 15 + 2t and 25 + 2t, exactly (the interpolation of a straight line). */
#define CURVE_N 20
static const double s_dt[3] = {1.0, 1.1, 1.25}, s_base[3] = {0.20, 0.30, 0.10};

static void s_write_three_seeds(const char *policy, const char *prefix, double link)
{
    for (int s = 0; s < 3; s++) {
        double t[CURVE_N], acc[CURVE_N];
        char dirname[64];
        for (int i = 0; i < CURVE_N; i++) {
            t[i] = s_dt[s] * (i + 1);
            acc[i] = s_base[s] + 0.02 * t[i];
        }
        snprintf(dirname, sizeof dirname, "%s-%d", prefix, s + 1);
        s_write_curve(dirname, policy, s + 1, link, CURVE_N, t, acc);
    }
}

/* The median over seeds on the common grid; the line only where all three seeds have a value
 * (1.25 s, the last first point, to 20 s, the first last point: no jump where a seed stops);
 * the band wherever two do. */
Test(report, curve_is_the_median_where_all_seeds_have_a_value)
{
    s_write_three_seeds("fixed:2", "three", 80);
    const char *args[] = {"--out", "rep", "three-1", "three-2", "three-3", NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    dat_row_t rows[512];
    double marks[16][2];
    int n_marks, n = s_read_dat("rep/data/accuracy_fixed-2.dat", rows, 512, marks, &n_marks);
    cr_assert_gt(n, 190, "the grid: 200 steps over 0..25 s, from the first seed's start");
    cr_expect_eq(n_marks, 0, "20 points per seed: a line, no markers");
    /* A grid point (25 s * 80 / 200) in the middle, and where the line starts and stops. */
    const dat_row_t *mid = s_row_at(rows, n, 10.0), *first = s_row_at(rows, n, 1.25),
                    *last = s_row_at(rows, n, 20.0);
    cr_assert(mid && first && last, "rows at 10, 1.25 and 20 s");
    cr_expect_float_eq(mid->median, 40.0, 1e-6);
    cr_expect_float_eq(mid->q25, 35.0, 1e-6);
    cr_expect_float_eq(mid->q75, 45.0, 1e-6);
    cr_expect_eq(mid->seeds, 3);
    cr_expect_float_eq(first->median, 22.5, 1e-6);
    cr_expect_float_eq(last->median, 60.0, 1e-6);
    int with_line = 0;
    for (int i = 0; i < n; i++) {
        const dat_row_t *r = &rows[i];
        bool inside = r->t >= 1.25 - 1e-9 && r->t <= 20.0 + 1e-9;
        cr_expect_eq(!isnan(r->median), inside, "median at %g s: %g", r->t, r->median);
        if (!isnan(r->median)) {
            cr_expect_float_eq(r->median, 20 + 2 * r->t, 1e-6, "at %g s", r->t);
            with_line++;
        }
        if (r->seeds == 3) {
            cr_expect_float_eq(r->q25, 15 + 2 * r->t, 1e-6, "at %g s", r->t);
            cr_expect_float_eq(r->q75, 25 + 2 * r->t, 1e-6, "at %g s", r->t);
        }
        cr_expect_eq(!isnan(r->q25), r->seeds >= 2, "band at %g s with %d seeds", r->t,
                     r->seeds);
        cr_expect(r->t >= 1.0 - 1e-9 && r->t <= 25.0 + 1e-9, "a row at %g s, outside the seeds",
                  r->t);
    }
    cr_expect_gt(with_line, 140);
    /* Past 20 s two seeds, then one: band, then nothing. */
    const dat_row_t *r21 = s_row_at(rows, n, 21.0), *r23 = s_row_at(rows, n, 23.0);
    cr_assert(r21 && r23);
    cr_expect_eq(r21->seeds, 2);
    cr_expect_float_eq(r21->q25, 52.0 + 0.25 * 20, 1e-6);
    cr_expect_eq(r23->seeds, 1);
    cr_expect(isnan(r23->q25) && isnan(r23->median));
    char *gp = s_slurp("rep/accuracy.gp");
    cr_expect(strstr(gp, "'data/accuracy_fixed-2.dat' index 0 using 1:2 with lines lt 1"), "%s",
              gp);
    cr_expect(strstr(gp, "'data/accuracy_fixed-2.dat' index 0 using 1:3:4 with filledcurves"));
    cr_expect(!strstr(gp, "index 1"), "no markers on a method with many points:\n%s", gp);
    cr_expect(strstr(gp, "25..75 % of seeds"), "the key says what the band is:\n%s", gp);
    free(gp);
    char *md = s_slurp("rep/report.md");
    cr_expect(strstr(md, "only where all of the method's seeds have a value"), "%s", md);
    free(md);
}

/* fp32 on a slow link: 3 iterations per seed and one evaluation, at the end. Its loss is a
 * line with its 3 points marked; its accuracy, one point per seed at times that never
 * overlap, is their median point. Both still show, beside a method with many points. */
Test(report, method_with_few_points_is_drawn_with_markers)
{
    s_write_three_seeds("fixed:2", "three", 80);
    for (int s = 0; s < 3; s++) {
        double dt = 10 + s, t[3] = {dt, 2 * dt, 3 * dt}, acc[3] = {NAN, NAN, 0.3 + 0.1 * s};
        char dirname[32];
        snprintf(dirname, sizeof dirname, "fp32-%d", s + 1);
        s_write_curve(dirname, "none", s + 1, 80, 3, t, acc);
    }
    const char *args[] = {"--out", "rep", "three-1", "three-2", "three-3",
                          "fp32-1", "fp32-2", "fp32-3", NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    dat_row_t rows[512];
    double marks[16][2];
    int n_marks, n = s_read_dat("rep/data/loss_none.dat", rows, 512, marks, &n_marks);
    cr_assert_gt(n, 0);
    /* The k-th points at their median time (11, 22, 33 s), the first and last moved onto the
     * line's ends (12 and 30 s: where all three seeds have a loss). */
    cr_assert_eq(n_marks, 3, "one marker per iteration");
    cr_expect_float_eq(marks[0][0], 12.0, 1e-9);
    cr_expect_float_eq(marks[1][0], 22.0, 1e-9);
    cr_expect_float_eq(marks[2][0], 30.0, 1e-9);
    /* Loss 2/iteration: at 22 s the seeds are at iterations 2.2, 2 and 1.83. */
    const dat_row_t *r22 = s_row_at(rows, n, 22.0);
    cr_assert_not_null(r22, "the marker's time is a row of the line");
    cr_expect_float_eq(marks[1][1], r22->median, 1e-9);
    cr_expect_float_eq(marks[1][1], 1.0, 1e-6, "the median: seed 2, at its 2nd iteration");
    n = s_read_dat("rep/data/accuracy_none.dat", rows, 512, marks, &n_marks);
    for (int i = 0; i < n; i++)
        cr_expect(isnan(rows[i].median), "the seeds never overlap: no median at %g s",
                  rows[i].t);
    cr_assert_eq(n_marks, 1);
    cr_expect_float_eq(marks[0][0], 33.0, 1e-9);
    cr_expect_float_eq(marks[0][1], 40.0, 1e-6);
    char *gp = s_slurp("rep/loss.gp");
    cr_expect(strstr(gp, "'data/loss_none.dat' index 0 using 1:2 with lines lt 1"), "%s", gp);
    cr_expect(strstr(gp, "'data/loss_none.dat' index 1 using 1:2 with points lt 1"), "%s", gp);
    cr_expect(strstr(gp, "with linespoints lt 1 title 'none (3 seeds)'"), "%s", gp);
    cr_expect(strstr(gp, "with lines lt 2 title 'fixed:2 (3 seeds)'"), "%s", gp);
    free(gp);
    gp = s_slurp("rep/accuracy.gp");
    cr_expect(strstr(gp, "'data/accuracy_none.dat' index 1 using 1:2 with linespoints lt 1"),
              "%s", gp);
    free(gp);
}

/* Runs at two link speeds: one panel each, titled with the speed, in one PNG; a method's
 * curve at each speed is over that speed's runs only. One speed: one panel. */
Test(report, link_speeds_get_a_panel_each)
{
    s_write_three_seeds("fixed:2", "slow", 80);
    s_write_three_seeds("fixed:2", "fast", 1000);
    const char *args[] = {"--out", "rep", "slow-1", "slow-2", "slow-3",
                          "fast-1", "fast-2", "fast-3", NULL};
    cr_assert_eq(s_report(NULL, args), 0);
    char *gp = s_slurp("rep/accuracy.gp");
    cr_expect(strstr(gp, "set multiplot"), "%s", gp);
    const char *slow = strstr(gp, "set title '80 Mbit/s'"),
               *fast = strstr(gp, "set title '1000 Mbit/s'");
    cr_expect(slow && fast && slow < fast, "a panel per link speed, slowest first:\n%s", gp);
    cr_expect(strstr(gp, "'data/accuracy_fixed-2_80mbit.dat' index 0 using 1:2 with lines"));
    cr_expect(strstr(gp, "'data/accuracy_fixed-2_1000mbit.dat' index 0 using 1:2 with lines"));
    cr_expect_eq(s_count(gp, "\nplot "), 3, "two panels and the key:\n%s", gp);
    cr_expect(strstr(gp, "title 'fixed:2 (3 seeds)'"), "seeds per panel in the key:\n%s", gp);
    free(gp);
    dat_row_t mid = s_dat_at("rep/data/accuracy_fixed-2_1000mbit.dat", 10.0);
    cr_expect_eq(mid.seeds, 3, "the 1000 Mbit/s runs alone");
    cr_expect_float_eq(mid.median, 40.0, 1e-6);
    char *md = s_slurp("rep/report.md");
    cr_expect(strstr(md, "one panel per link speed (80 Mbit/s, 1000 Mbit/s)"), "%s", md);
    free(md);
    if (s_have_gnuplot()) {
        char *png = s_slurp("rep/accuracy.png");
        cr_expect_eq(memcmp(png, "\x89PNG\r\n\x1a\n", 8), 0);
        free(png);
    }

    const char *one[] = {"--out", "rep1", "slow-1", "slow-2", "slow-3", NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", one), 0);
    gp = s_slurp("rep1/accuracy.gp");
    cr_expect_eq(s_count(gp, "\nplot "), 2, "one panel and the key:\n%s", gp);
    cr_expect(strstr(gp, "set title '80 Mbit/s'"), "%s", gp);
    cr_expect(strstr(gp, "'data/accuracy_fixed-2.dat'"), "no speed in the file name:\n%s", gp);
    free(gp);
    md = s_slurp("rep1/report.md");
    cr_expect(!strstr(md, "one panel per link speed"), "%s", md);
    free(md);
}

/* Runs under a link schedule (config.json's "link"; summary.json's link_mbps is 0) are not
 * runs without emulation, and runs under two schedules are two conditions: each gets a panel
 * of its own, titled with its schedule, and a comparison of its own. */
Test(report, runs_under_a_link_schedule_are_not_shown_as_unemulated)
{
    s_write_three_seeds("fixed:2", "none", 0);
    s_write_three_seeds("fixed:2", "wave", 0);
    s_write_three_seeds("fixed:2", "fall", 0);
    for (int s = 1; s <= 3; s++) {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/wave-%d", s_root, s);
        test_write_file(dir, "config.json", "{\"link_mbps\":0,\"link\":\"80@0,10000@30/60\"}\n");
        snprintf(dir, sizeof dir, "%s/fall-%d", s_root, s);
        test_write_file(dir, "config.json",
                        "{\"link_mbps\":0,\"link\":\"10000@0,80@20;worker:0='x\"}\n");
    }
    const char *args[] = {"--out", "repl", "none-1", "none-2", "none-3", "wave-1", "wave-2",
                          "wave-3", "fall-1", "fall-2", "fall-3", NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *gp = s_slurp("repl/accuracy.gp");
    cr_expect(strstr(gp, "set title 'no link emulation'"), "%s", gp);
    cr_expect(strstr(gp, "set title 'link 80@0,10000@30/60'"), "%s", gp);
    cr_expect(strstr(gp, "set title 'link 10000@0,80@20;worker:0=''x'"),
              "a quote in a run's file stays inside the title:\n%s", gp);
    cr_expect(strstr(gp, "'data/accuracy_fixed-2_link-schedule-1.dat'"), "%s", gp);
    cr_expect(strstr(gp, "'data/accuracy_fixed-2_link-schedule-2.dat'"), "%s", gp);
    free(gp);
    dat_row_t mid = s_dat_at("repl/data/accuracy_fixed-2_link-schedule-1.dat", 10.0);
    cr_expect_eq(mid.seeds, 3, "the first schedule's runs alone");
    mid = s_dat_at("repl/data/accuracy_fixed-2_link-schedule-2.dat", 10.0);
    cr_expect_eq(mid.seeds, 3, "the second schedule's runs alone");
    char *md = s_slurp("repl/report.md");
    cr_expect(strstr(md, "### link 80@0,10000@30/60") && strstr(md, "### link 10000@0,80@20"),
              "a comparison per schedule:\n%s", md);
    free(md);
}

/* ---- the headline: against the best fixed setting, paired by seed ------------------------ */

/* Seed S's run of POLICY that reaches 85 % at exactly SCALE x T_s (T = 10, 12, 11, 9, 13 s):
 * 20 evaluations, 0.085 per step to 0.85 at the 10th, then 0.860, 0.861, ..., 0.869: the mean
 * of the last five is 0.867. */
static void s_write_headline_run(const char *policy, int s, double scale)
{
    static const double T[5] = {10, 12, 11, 9, 13};
    double t[20], acc[20];
    for (int i = 0; i < 20; i++) {
        t[i] = scale * T[s - 1] * (i + 1) / 10.0;
        acc[i] = i < 10 ? 0.085 * (i + 1) : 0.860 + 0.001 * (i - 10);
    }
    char dirname[64];
    snprintf(dirname, sizeof dirname, "h-%s-%d", policy, s);
    for (char *c = dirname; *c; c++)
        *c = *c == ':' ? '-' : *c;
    s_write_curve(dirname, policy, s, 80, 20, t, acc);
}

/* The row of METHOD in headline.gp's ytics ('NAME' ROW), -1 if absent. */
static int s_gp_row(const char *gp, const char *method)
{
    char key[96];
    snprintf(key, sizeof key, "'%s' ", method);
    const char *at = strstr(gp, key);
    int row = -1;
    if (at)
        sscanf(at + strlen(key), "%d", &row);
    return row;
}

Test(report, the_headline_pairs_seeds_against_the_best_fixed_setting)
{
    static const double adaptive[5] = {0.5, 1, 2, 1, 1}; /* geometric mean 1, spread */
    const char *args[32] = {"--out", "reph"};
    int n = 2;
    static char names[20][64];
    const char *policies[4] = {"fixed:2", "fixed:4", "mqgrad", "adaptive"};
    for (int p = 0; p < 4; p++)
        for (int s = 1; s <= 5; s++) {
            double scale = p == 0 ? 1 : p == 1 ? 1.5 : p == 2 ? 0.8 : adaptive[s - 1];
            s_write_headline_run(policies[p], s, scale);
            snprintf(names[p * 5 + s - 1], 64, "h-%s-%d", policies[p], s);
            for (char *c = names[p * 5 + s - 1]; *c; c++)
                *c = *c == ':' ? '-' : *c;
            args[n++] = names[p * 5 + s - 1];
        }
    args[n] = NULL;
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *md = s_slurp("reph/report.md");
    const char *head = strstr(md, "## Against the best fixed setting, paired by seed");
    cr_assert(head && head < strstr(md, "## Runs"), "the headline comes first:\n%s", md);
    cr_expect(strstr(md, "Condition: 80 Mbit/s. Best fixed setting in hindsight: **fixed:2** "
                         "(time to 85 %: 10.9 s"),
              "fixed:2 is the fastest fixed setting (geometric mean of 10, 12, 11, 9, 13):\n%s",
              md);
    char cells[16][96];
    cr_assert_eq(s_row(md, "Against the best fixed setting, paired by seed", "mqgrad", cells), 6);
    cr_expect_str_eq(cells[1], "5 of 5");
    cr_expect_str_eq(cells[2], "0.80 [0.80, 0.80]", "0.8x on every seed: no spread");
    cr_expect_str_eq(cells[3], "86.70", "the mean of the last 5 evaluations, not the last one");
    cr_expect_str_eq(cells[4], "+0.00 [+0.00, +0.00]");
    cr_assert_eq(s_row(md, "Against the best fixed setting, paired by seed", "fixed:4", cells), 6);
    cr_expect_str_eq(cells[2], "1.50 [1.50, 1.50]");
    cr_assert_eq(s_row(md, "Against the best fixed setting, paired by seed", "adaptive", cells),
                 6);
    double mean, lo, hi;
    cr_assert_eq(sscanf(cells[2], "%lf [%lf, %lf]", &mean, &lo, &hi), 3, "%s", cells[2]);
    cr_expect_float_eq(mean, 1.0, 1e-9, "geometric mean of 0.5, 1, 2, 1, 1");
    cr_expect(lo < 1 && hi > 1 && lo >= 0.5 && hi <= 2, "a spread interval: %s", cells[2]);
    free(md);
    /* the headline figure: a row per method, its ratio and interval as in the table, colour by
     * method (the line types of every plot), and the best named in the panel's title */
    char *gp = s_slurp("reph/headline.gp");
    cr_expect(strstr(gp, "set output 'headline.png'"), "%s", gp);
    cr_expect(strstr(gp, "80 Mbit/s — best fixed: fixed:2, 10.9 s to 85 %'"), "%s", gp);
    int r2 = s_gp_row(gp, "fixed:2"), r4 = s_gp_row(gp, "fixed:4"), rm = s_gp_row(gp, "mqgrad"),
        ra = s_gp_row(gp, "adaptive");
    cr_expect(r2 >= 0 && r4 >= 0 && rm >= 0 && ra >= 0 && r2 != r4 && r4 != rm && rm != ra &&
                  ra != r2 && ra != r4 && rm != r2,
              "a row each: %d %d %d %d\n%s", r2, r4, rm, ra, gp);
    char row[96];
    snprintf(row, sizeof row, "\n0.8 %d 0.8 0.8 ", s_gp_row(gp, "mqgrad"));
    cr_expect(strstr(gp, row), "mqgrad at 0.8 [0.8, 0.8] (%s):\n%s", row, gp);
    snprintf(row, sizeof row, "\n1.5 %d 1.5 1.5 ", s_gp_row(gp, "fixed:4"));
    cr_expect(strstr(gp, row), "fixed:4 at 1.5 (%s):\n%s", row, gp);
    free(gp);
}

/* A method's point in the headline figure says what it leaves out: fixed:2 reached the target
 * in one seed and diverged in the others; drawn from that one seed, the note beside it says
 * so (a reader would take it for the fastest). */
Test(report, the_headline_figure_notes_diverged_seeds_beside_a_point)
{
    const char *args[16] = {"--out", "repd"};
    int n = 2;
    static char names[6][64];
    for (int s = 1; s <= 3; s++) {
        s_write_headline_run("fixed:3", s, 1);
        s_write_headline_run("fixed:2", s, 0.8);
        snprintf(names[s - 1], 64, "h-fixed-3-%d", s);
        snprintf(names[2 + s], 64, "h-fixed-2-%d", s);
    }
    for (int s = 2; s <= 3; s++) { /* fixed:2 diverged in seeds 2 and 3 */
        char dir[256];
        snprintf(dir, sizeof dir, "%s/h-fixed-2-%d", s_root, s);
        char summary[512];
        snprintf(summary, sizeof summary,
                 "{\"iterations\":20,\"train_time_s\":10,\"policy\":\"fixed:2\",\"seed\":%d,"
                 "\"link_mbps\":80,\"status\":\"diverged\",\"divergence_rule\":\"loss\","
                 "\"divergence_iter\":12}\n",
                 s);
        test_write_file(dir, "summary.json", summary);
    }
    for (int i = 0; i < 6; i++)
        args[n++] = names[i];
    args[n] = NULL;
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *gp = s_slurp("repd/headline.gp");
    int row = s_gp_row(gp, "fixed:2");
    cr_assert_geq(row, 0, "fixed:2 has a row:\n%s", gp);
    char label[96];
    snprintf(label, sizeof label, "set label 'diverged in 2 of 3 seeds; one seed' at first ");
    const char *at = strstr(gp, label);
    cr_expect(at, "the note beside fixed:2's point:\n%s", gp);
    char row_text[32];
    snprintf(row_text, sizeof row_text, ", first %d left", row);
    cr_expect(at && strstr(at, row_text) && strstr(at, row_text) < strchr(at, '\n'),
              "on fixed:2's row %d:\n%s", row, gp);
    free(gp);
}

/* Runs with another update rule are another comparison: one table per codec setting and rule,
 * each with its own best fixed setting; fp32 joins the table of its rule. */
Test(report, the_headline_keeps_update_rules_apart)
{
    static const struct {
        const char *policy, *rule;
        double scale;
    } runs[] = {{"fixed:2", "sgd", 1},          {"mqgrad", "sgd", 0.8},
                {"none", "sgd", 3},             {"fixed:2", "momentum:0.9", 0.5},
                {"mqgrad", "momentum:0.9", 0.6}};
    const char *args[32] = {"--out", "repr"};
    int n = 2;
    for (size_t i = 0; i < 5; i++)
        for (int s = 1; s <= 3; s++) {
            char dirname[64], dir[300], cfg[256];
            snprintf(dirname, sizeof dirname, "r%zu-%d", i, s);
            double t[20], acc[20];
            for (int k = 0; k < 20; k++) {
                t[k] = runs[i].scale * (9 + s) * (k + 1) / 10.0;
                acc[k] = k < 10 ? 0.085 * (k + 1) : 0.860 + 0.001 * (k - 10);
            }
            s_write_curve(dirname, runs[i].policy, s, 80, 20, t, acc);
            snprintf(dir, sizeof dir, "%s/%s", s_root, dirname);
            snprintf(cfg, sizeof cfg,
                     "{\"codec\":\"uniform\",\"bucket\":512,\"stochastic\":false,"
                     "\"error_feedback\":false,\"optimizer\":\"%s\"}\n",
                     runs[i].rule);
            test_write_file(dir, "config.json", cfg);
            args[n++] = strdup(dirname);
        }
    args[n] = NULL;
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *md = s_slurp("repr/report.md");
    const char *sgd = strstr(md, "\n### codec uniform, bucket 512, nearest rounding, no error "
                                 "feedback, sgd\n"),
               *mom = strstr(md, "\n### codec uniform, bucket 512, nearest rounding, no error "
                                 "feedback, momentum:0.9\n");
    cr_assert(sgd && mom, "a table per update rule:\n%s", md);
    const char *first = sgd < mom ? sgd : mom, *second = sgd < mom ? mom : sgd;
    const char *end = strstr(second, "\n## ");
    char sgd_part[8192], mom_part[8192];
    snprintf(sgd_part, sizeof sgd_part, "%.*s",
             (int)((sgd == first ? second : end) - sgd), sgd);
    snprintf(mom_part, sizeof mom_part, "%.*s",
             (int)((mom == first ? second : end) - mom), mom);
    cr_expect(strstr(sgd_part, "| **fixed:2** |"), "%s", sgd_part);
    cr_expect(strstr(sgd_part, "| mqgrad | 3 of 3 | 0.80 [0.80, 0.80] |"), "%s", sgd_part);
    cr_expect(strstr(sgd_part, "| none | 3 of 3 | 3.00 [3.00, 3.00] |"), "%s", sgd_part);
    cr_expect(strstr(mom_part, "| **fixed:2 (momentum:0.9)** |"), "%s", mom_part);
    cr_expect(strstr(mom_part, "| mqgrad (momentum:0.9) | 3 of 3 | 1.20 [1.20, 1.20] |"), "%s",
              mom_part);
    cr_expect(!strstr(mom_part, "| none |"), "fp32 (sgd) in the momentum table:\n%s", mom_part);
    free(md);
    for (int i = 2; i < n; i++)
        free((char *)args[i]);
}

/* Accuracy is drawn against the iteration too (x: iterations, not seconds), and a codec that
 * takes no bit-width (top-k here) has no line in the bits plot, where fixed:2 has one. */
Test(report, accuracy_against_iterations_and_no_bits_for_a_codec_without_them)
{
    s_write_three_seeds("fixed:2", "it", 80);
    s_write_three_seeds("fixed:2", "tk", 80); /* becomes top-k below */
    for (int s = 1; s <= 3; s++) {
        char dir[256];
        snprintf(dir, sizeof dir, "%s/it-%d", s_root, s);
        test_write_file(dir, "config.json",
                        "{\"codec\":\"uniform\",\"codec_spec\":\"uniform:bucket=512\","
                        "\"bucket\":512,\"stochastic\":false,\"error_feedback\":false}\n");
        snprintf(dir, sizeof dir, "%s/tk-%d", s_root, s);
        test_write_file(dir, "config.json",
                        "{\"codec\":\"topk\",\"codec_spec\":\"topk:ratio=0.01\","
                        "\"bucket\":0,\"stochastic\":false,\"error_feedback\":false}\n");
    }
    const char *args[] = {"--out", "repi", "it-1", "it-2", "it-3", "tk-1", "tk-2", "tk-3", NULL};
    cr_assert_eq(s_report("/nonexistent-gnuplot", args), 0);
    char *gp = s_slurp("repi/accuracy_iter.gp");
    cr_expect(strstr(gp, "set xlabel 'iteration'"), "%s", gp);
    free(gp);
    /* seed k evaluates at iterations 1..20 whatever its pace: at iteration 10 the three seeds
     * are at 20 + 2t, 30 + 2t, 10 + 2t % with t = 10 s x 1.0, 1.1, 1.25: 40, 52, 35 */
    dat_row_t mid = s_dat_at("repi/data/accuracy_iter_fixed-2.dat", 10.0);
    cr_expect_eq(mid.seeds, 3);
    cr_expect_float_eq(mid.median, 40.0, 1e-6, "the median at iteration 10");
    gp = s_slurp("repi/bits.gp");
    cr_expect(strstr(gp, "'data/bits_fixed-2.dat'"), "%s", gp);
    cr_expect(!strstr(gp, "topk"), "a codec without a bit-width in the bits plot:\n%s", gp);
    free(gp);
    char *md = s_slurp("repi/report.md");
    cr_expect(strstr(md, "![test accuracy vs iteration](accuracy_iter.png)"), "%s", md);
    free(md);
}

/* Welch's test against hand computations: {1,2,3} vs {4,5,6} has t = -3.674, df = 4 and a
 * two-sided p of 0.0213; t = 4.303 at 2 df and t = 12.706 at 1 df are the 5 % points. */
Test(report, welch_test_matches_the_t_distribution)
{
    double t, df;
    double p = mq_rep_welch((double[]){1, 2, 3}, 3, (double[]){4, 5, 6}, 3, &t, &df);
    cr_expect_float_eq(t, -3.6742, 1e-3, "t = %g", t);
    cr_expect_float_eq(df, 4, 1e-9, "df = %g", df);
    cr_expect_float_eq(p, 0.02131, 2e-4, "p = %g", p);
    /* unequal variances: {0, 2} vs {10, 10.5, 11, 11.5}: t chosen so that df is not whole */
    p = mq_rep_welch((double[]){0, 2}, 2, (double[]){10, 10.5, 11, 11.5}, 4, &t, &df);
    cr_expect(df > 1 && df < 2, "Welch-Satterthwaite df = %g", df);
    cr_expect(p > 0 && p < 0.1, "p = %g", p);
    /* the 5 % points of Student's t: two pairs of equal spread (df 2), then one without
     * spread (df 1) */
    double x = 4.303 * sqrt(2);
    p = mq_rep_welch((double[]){x - 1, x + 1}, 2, (double[]){-1, 1}, 2, &t, &df);
    cr_expect_float_eq(df, 2, 1e-9);
    cr_expect_float_eq(p, 0.05, 5e-4, "t = 4.303 at 2 df: p = %g", p);
    p = mq_rep_welch((double[]){12.706 - 1, 12.706 + 1}, 2, (double[]){0, 0}, 2, &t, &df);
    cr_expect_float_eq(df, 1, 1e-9);
    cr_expect_float_eq(p, 0.05, 5e-4, "t = 12.706 at 1 df: p = %g", p);
    cr_expect_float_eq(mq_rep_welch((double[]){-1, 1}, 2, (double[]){-1, 1}, 2, &t, &df), 1, 1e-9,
                       "equal means: p = 1");
    cr_expect(isnan(mq_rep_welch((double[]){1}, 1, (double[]){1, 2}, 2, &t, &df)),
              "one value: no test");
}
