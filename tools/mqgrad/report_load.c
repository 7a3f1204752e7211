/* Loads one run directory for `mqgrad report`: summary.json and config.json through the run
 * files' JSON reader (json.h), and a strict reader for metrics.csv: its columns found by name
 * in its header (runlog.h's, or an older run's without the columns added since; columns this
 * reader does not know are skipped), then as many numeric cells a row as the header has
 * columns. Every error names the file and the line. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqgrad/runlog.h"
#include "csv.h"
#include "mqgrad/util.h"
#include "json.h"
#include "report.h"

/* ---- summary.json and config.json ---------------------------------------------------- */

/* The divergence fields of a diverged run's summary (older runs may lack them). */
static void s_load_divergence(const mq_json_t *j, mq_rep_run_t *run)
{
    run->diverged = strcmp(run->status, "diverged") == 0;
    const mq_json_field_t *f = mq_json_get(j, "divergence_rule");
    snprintf(run->div_rule, sizeof run->div_rule, "%.15s",
             f && f->kind == MQ_JSON_STR ? f->str : "?");
    if ((f = mq_json_get(j, "divergence_iter")) && f->kind == MQ_JSON_NUM && f->num >= 0 &&
        f->num < 0x1p64) /* converting a larger one is undefined */
        run->div_iter = (uint64_t)f->num;
    f = mq_json_get(j, "divergence_detail");
    snprintf(run->div_detail, sizeof run->div_detail, "%.255s",
             f && f->kind == MQ_JSON_STR ? f->str : "");
}

/* Takes the run's identity (policy, seed, status) and any final values from summary.json;
 * final values it lacks are left NaN for the metrics to fill in. */
static int s_load_summary(const char *path, mq_rep_run_t *run)
{
    mq_json_t json, *j = &json;
    int rc = -1;
    if (mq_json_load(path, j) < 0)
        goto done;
    const mq_json_field_t *policy = mq_json_get(j, "policy"), *seed = mq_json_get(j, "seed");
    if (!policy || policy->kind != MQ_JSON_STR || !policy->str[0]) {
        mq_err_set("%s: no \"policy\" string (the method of the run)", path);
        goto done;
    }
    if (!seed || seed->kind != MQ_JSON_NUM || seed->num < 0 || seed->num != floor(seed->num) ||
        seed->num > 9007199254740992.0) {
        mq_err_set("%s: no \"seed\" (a non-negative integer)", path);
        goto done;
    }
    if (strlen(policy->str) >= sizeof run->policy) {
        mq_err_set("%s: \"policy\" longer than %zu characters", path, sizeof run->policy - 1);
        goto done;
    }
    snprintf(run->policy, sizeof run->policy, "%.63s", policy->str);
    snprintf(run->method, sizeof run->method, "%.63s", policy->str);
    run->seed = (uint64_t)seed->num;
    const mq_json_field_t *f = mq_json_get(j, "status");
    snprintf(run->status, sizeof run->status, "%.31s", f && f->kind == MQ_JSON_STR ? f->str : "?");
    s_load_divergence(j, run);
    if ((f = mq_json_get(j, "iterations")) && f->kind == MQ_JSON_NUM && f->num >= 0 &&
        f->num < 0x1p64)
        run->iterations = (uint64_t)f->num;
    if ((f = mq_json_get(j, "final_loss")) && f->kind == MQ_JSON_NUM)
        run->final_loss = f->num;
    if ((f = mq_json_get(j, "final_test_acc")) && f->kind == MQ_JSON_NUM)
        run->final_acc = f->num;
    if ((f = mq_json_get(j, "final_sparsity")) && f->kind == MQ_JSON_NUM)
        run->final_sparsity = f->num;
    if ((f = mq_json_get(j, "link_mbps")) && f->kind == MQ_JSON_NUM && f->num >= 0)
        run->link_mbps = f->num;
    const mq_json_field_t *up = mq_json_get(j, "bytes_up"), *down = mq_json_get(j, "bytes_down");
    if (up && down && up->kind == MQ_JSON_NUM && down->kind == MQ_JSON_NUM)
        run->total_bytes = up->num + down->num;
    rc = 0;
done:
    mq_json_free(j);
    return rc;
}

/* The codec settings of config.json (codec, bucket, stochastic, error_feedback), and its
 * link speed when summary.json had none. An fp32 run has no codec; a run without
 * config.json, or with one from before these fields, has them unknown (and is shown under its
 * plain policy). An fp32 run's config.json gives only its link. */
static int s_load_config(const char *dir, mq_rep_run_t *run)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    run->codec = (mq_rep_codec_t){.known = false};
    bool fp32 = strcmp(run->policy, "none") == 0;
    if (access(path, F_OK) != 0)
        return 0;
    mq_json_t json, *j = &json;
    int rc = -1;
    if (mq_json_load(path, j) < 0)
        goto done;
    const mq_json_field_t *link = mq_json_get(j, "link_mbps");
    if (isnan(run->link_mbps) && link && link->kind == MQ_JSON_NUM && link->num >= 0)
        run->link_mbps = link->num;
    const mq_json_field_t *sched = mq_json_get(j, "link");
    if (sched && sched->kind == MQ_JSON_STR && sched->str[0]) {
        run->link_mbps = -1; /* its rates change or differ per node: no one speed */
        snprintf(run->link, sizeof run->link, "%s", sched->str);
    }
    const mq_json_field_t *sp = mq_json_get(j, "codec_spec"), *op = mq_json_get(j, "optimizer");
    snprintf(run->codec.optimizer, sizeof run->codec.optimizer, "%.63s",
             op && op->kind == MQ_JSON_STR ? op->str : "sgd"); /* fp32's rule too */
    if (fp32) {
        rc = 0;
        goto done;
    }
    const mq_json_field_t *b = mq_json_get(j, "bucket"), *k = mq_json_get(j, "codec");
    const mq_json_field_t *st = mq_json_get(j, "stochastic");
    const mq_json_field_t *ef = mq_json_get(j, "error_feedback");
    if (b && (b->kind != MQ_JSON_NUM || b->num < 0 || b->num != floor(b->num) || b->num > 1e12)) {
        mq_err_set("%s: \"bucket\" is not an integer >= 0 (values per range)", path);
        goto done;
    }
    if ((st && st->kind != MQ_JSON_BOOL) || (ef && ef->kind != MQ_JSON_BOOL)) {
        mq_err_set("%s: \"%s\" is not true or false", path,
                   st && st->kind != MQ_JSON_BOOL ? "stochastic" : "error_feedback");
        goto done;
    }
    run->codec.known = b != NULL;
    run->codec.bucket = b ? (long)b->num : 0;
    run->codec.stochastic = st && st->num != 0;
    run->codec.error_feedback = ef && ef->num != 0;
    snprintf(run->codec.kind, sizeof run->codec.kind, "%.15s",
             k && k->kind == MQ_JSON_STR ? k->str : "uniform");
    snprintf(run->codec.spec, sizeof run->codec.spec, "%.95s",
             sp && sp->kind == MQ_JSON_STR ? sp->str : "");
    rc = 0;
done:
    mq_json_free(j);
    return rc;
}

/* ---- metrics.csv -------------------------------------------------------------------- */

/* The columns read, by name: columns are only ever appended to runlog.h's header, so a run
 * from before one was added lacks it (optional here) and one written after this reader was
 * has columns it skips. */
enum {
    C_ITER, C_TIME, C_LOSS, C_SMOOTHED, C_BITS, C_UP, C_DOWN, C_COMPUTE, C_ENCODE, C_WAIT,
    C_DECODE, C_UPDATE, C_AGENT, C_ACC, C_TEST_LOSS, C_WORKERS, S_NCOLS
};

static const struct {
    const char *name;
    bool optional; /* added later: older runs lack it */
    bool any;      /* any number, nan included (the losses); else finite and >= 0 */
    bool integral;
} s_cols[S_NCOLS] = {
    [C_ITER] = {.name = "iter", .integral = true},
    [C_TIME] = {.name = "train_time_s"},
    [C_LOSS] = {.name = "loss", .any = true},
    [C_SMOOTHED] = {.name = "smoothed_loss", .any = true},
    [C_BITS] = {.name = "bits", .integral = true},
    [C_UP] = {.name = "bytes_up", .integral = true},
    [C_DOWN] = {.name = "bytes_down", .integral = true},
    [C_COMPUTE] = {.name = "compute_ms"},
    [C_ENCODE] = {.name = "encode_ms"},
    [C_WAIT] = {.name = "wait_ms"},
    [C_DECODE] = {.name = "decode_ms"},
    [C_UPDATE] = {.name = "update_ms"},
    [C_AGENT] = {.name = "agent_ms"},
    [C_ACC] = {.name = "test_acc"},
    [C_TEST_LOSS] = {.name = "test_loss", .any = true},
    [C_WORKERS] = {.name = "workers", .optional = true, .integral = true},
};

typedef struct {
    const char *path;
    int line;
    int ncols;       /* in the header */
    int at[S_NCOLS]; /* where each column sits in a row; -1 if the run has none */
    char **cells;    /* NCOLS of them, the current line's */
} s_csv_t;

static int s_header(s_csv_t *c, char *line)
{
    if (mq_csv_header(c->path, line, &c->cells, &c->ncols) != 0)
        return -1;
    for (int k = 0; k < S_NCOLS; k++) {
        c->at[k] = mq_csv_find(c->cells, c->ncols, s_cols[k].name);
        if (c->at[k] < 0 && !s_cols[k].optional) {
            mq_err_set("%s:1: no column '%s' in the header (expected the columns '%s')",
                       c->path, s_cols[k].name, MQ_METRICS_HEADER);
            return -1;
        }
    }
    return 0;
}

/* Column K of the current row: a finite number >= 0 (loss columns may be any number, nan
 * included). */
static int s_cell(const s_csv_t *c, int k, double *out)
{
    const char *s = c->cells[c->at[k]];
    char *end;
    errno = 0;
    double v = *s ? strtod(s, &end) : 0;
    if (!*s || *end || errno == ERANGE || (!s_cols[k].any && (!isfinite(v) || v < 0))) {
        mq_err_set("%s:%d: column %s: '%s' is not a %s", c->path, c->line, s_cols[k].name, s,
                   s_cols[k].any ? "number" : "finite number >= 0");
        return -1;
    }
    if (s_cols[k].integral && v != floor(v)) {
        mq_err_set("%s:%d: column %s: '%s' is not an integer", c->path, c->line,
                   s_cols[k].name, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Parses the current row into ROWS[*N_ROWS] and counts it (the rows a restart repeats are
 * dropped first). */
static int s_parse_row(s_csv_t *c, char *line, mq_rep_row_t *rows, size_t *n_rows)
{
    double v[S_NCOLS] = {0};
    int got = mq_csv_split(line, c->cells, c->ncols);
    if (got != c->ncols) {
        mq_err_set("%s:%d: %d columns, the header has %d", c->path, c->line, got, c->ncols);
        return -1;
    }
    bool evaluated = c->cells[c->at[C_ACC]][0] != '\0';
    if (evaluated != (c->cells[c->at[C_TEST_LOSS]][0] != '\0')) {
        mq_err_set("%s:%d: test_acc and test_loss must both be set or both empty", c->path,
                   c->line);
        return -1;
    }
    for (int k = 0; k < S_NCOLS; k++)
        if (c->at[k] >= 0 && (evaluated || (k != C_ACC && k != C_TEST_LOSS)) &&
            s_cell(c, k, &v[k]) < 0)
            return -1;
    bool bad_bits = v[C_BITS] < 1 || v[C_BITS] > 32, bad_workers = v[C_WORKERS] > UINT32_MAX;
    bool bad_iter = !(v[C_ITER] < 0x1p64); /* it becomes an integer */
    if (bad_bits || bad_workers || bad_iter || (evaluated && v[C_ACC] > 1)) {
        mq_err_set("%s:%d: %s out of range (iter < 2^64, bits 1..32, test_acc 0..1, workers < "
                   "2^32)", c->path, c->line,
                   bad_iter ? "iter" : bad_bits ? "bits" : bad_workers ? "workers" : "test_acc");
        return -1;
    }
    /* A run resumed from a checkpoint goes on from an earlier iteration than its last row:
     * the rows it repeats were lost with the restart, and give way to the new ones. */
    while (*n_rows > 0 && rows[*n_rows - 1].iter >= v[C_ITER])
        (*n_rows)--;
    const mq_rep_row_t *prev = *n_rows ? &rows[*n_rows - 1] : NULL;
    if (prev && v[C_TIME] < prev->t) {
        mq_err_set("%s:%d: train_time_s must not decrease from row to row", c->path, c->line);
        return -1;
    }
    mq_rep_row_t *r = &rows[*n_rows];
    *r = (mq_rep_row_t){.iter = (uint64_t)v[C_ITER],
                        .t = v[C_TIME],
                        .loss = v[C_LOSS],
                        .smoothed = v[C_SMOOTHED],
                        .bits = (int)v[C_BITS],
                        .bytes = v[C_UP] + v[C_DOWN],
                        .compute_ms = v[C_COMPUTE],
                        .encode_ms = v[C_ENCODE],
                        .wait_ms = v[C_WAIT],
                        .decode_ms = v[C_DECODE],
                        .update_ms = v[C_UPDATE],
                        .agent_ms = v[C_AGENT],
                        .evaluated = evaluated,
                        .acc = evaluated ? v[C_ACC] : NAN,
                        .test_loss = evaluated ? v[C_TEST_LOSS] : NAN,
                        .workers = (uint32_t)v[C_WORKERS]};
    (*n_rows)++;
    return 0;
}

/* Counts lines to size the row array: one row per newline, plus a last unterminated line. */
static size_t s_count_lines(const char *text)
{
    size_t n = 1;
    for (const char *p = text; (p = strchr(p, '\n')); p++)
        n++;
    return n;
}

static int s_load_metrics(const char *path, mq_rep_run_t *run)
{
    char *text;
    size_t len;
    if (mq_read_file(path, &text, &len) < 0)
        return -1;
    s_csv_t c = {.path = path};
    int rc = -1;
    run->rows = calloc(s_count_lines(text), sizeof *run->rows);
    if (!run->rows) {
        mq_err_set("%s: out of memory", path);
        goto done;
    }
    if (strlen(text) != len) {
        mq_err_set("%s: contains a NUL byte", path);
        goto done;
    }
    for (char *line = text, *next; *line; line = next) {
        c.line++;
        next = strchr(line, '\n');
        next = next ? (*next = '\0', next + 1) : line + strlen(line);
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r')
            line[n - 1] = '\0';
        if (c.line == 1) {
            if (s_header(&c, line) < 0)
                goto done;
            continue;
        }
        if (s_parse_row(&c, line, run->rows, &run->n_rows) < 0)
            goto done;
    }
    if (c.line == 0)
        mq_err_set("%s:1: empty file (expected the header '%s')", path, MQ_METRICS_HEADER);
    else if (run->n_rows == 0)
        mq_err_set("%s:2: no rows after the header: the run recorded no iteration", path);
    else
        rc = 0;
done:
    free(c.cells);
    free(text);
    return rc;
}

/* Final values the summary did not give, from the metrics. */
static void s_fill_finals(mq_rep_run_t *run)
{
    const mq_rep_row_t *last = &run->rows[run->n_rows - 1];
    if (run->iterations == 0)
        run->iterations = last->iter;
    if (isnan(run->final_loss))
        run->final_loss = last->loss;
    if (isnan(run->final_acc) && !run->diverged) /* not an accuracy from before it diverged */
        for (size_t i = run->n_rows; i-- > 0;)
            if (run->rows[i].evaluated) {
                run->final_acc = run->rows[i].acc;
                break;
            }
    if (isnan(run->total_bytes)) {
        run->total_bytes = 0;
        for (size_t i = 0; i < run->n_rows; i++)
            run->total_bytes += run->rows[i].bytes;
    }
}

int mq_rep_load_run(const char *dir, mq_rep_run_t *run)
{
    *run = (mq_rep_run_t){
        .final_loss = NAN, .final_acc = NAN, .final_sparsity = NAN, .total_bytes = NAN,
        .link_mbps = NAN};
    size_t n = strlen(dir) + 32;
    char *path = malloc(n);
    run->dir = strdup(dir);
    if (!path || !run->dir) {
        free(path);
        mq_err_set("out of memory");
        return -1;
    }
    snprintf(path, n, "%s/summary.json", dir);
    int rc = s_load_summary(path, run);
    if (rc == 0) {
        snprintf(path, n, "%s/metrics.csv", dir);
        rc = s_load_metrics(path, run);
    }
    if (rc == 0)
        rc = s_load_config(dir, run);
    free(path);
    if (rc < 0) {
        mq_rep_run_free(run);
        return -1;
    }
    s_fill_finals(run);
    return 0;
}

void mq_rep_run_free(mq_rep_run_t *run)
{
    free(run->dir);
    free(run->rows);
    run->dir = NULL;
    run->rows = NULL;
    run->n_rows = 0;
}
