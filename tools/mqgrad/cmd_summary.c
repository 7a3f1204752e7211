/* mqgrad summary RUN_DIR: the few lines a user reads when a run ends (contract in
 * run_summary.h). config.json and summary.json go through the run files' JSON reader
 * (json.h); metrics.csv is read by column name, so columns appended later do not break it. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "mqgrad/nn.h"
#include "csv.h"
#include "mqgrad/util.h"
#include "json.h"
#include "run_summary.h"

#define S_TEST_SET 10000  /* test images of fashion-mnist, mnist and cifar10 */
#define S_FP32 32         /* the bits column of an fp32 iteration */
#define S_MAX_LISTED 8    /* more bit-width runs than this: the first few, the last, shares */
#define S_SHOWN 4

/* Number KEY, from A or else from B: 1 found, 0 absent (or null), -1 (message set) when it is
 * not a number in [LO, HI]. */
static int s_jnum(const mq_json_t *a, const mq_json_t *b, const char *key, double lo, double hi,
                  double *out)
{
    const mq_json_t *o = a;
    const mq_json_field_t *f = mq_json_get(a, key);
    if ((!f || f->kind == MQ_JSON_NULL) && b)
        f = mq_json_get(o = b, key);
    if (!f || f->kind == MQ_JSON_NULL)
        return 0;
    if (f->kind != MQ_JSON_NUM || f->num < lo || f->num > hi) {
        mq_err_set("%s: \"%s\" must be a number in [%g, %g]", o->path, key, lo, hi);
        return -1;
    }
    *out = f->num;
    return 1;
}

/* String KEY, from A or else from B, into BUF: 1 found, 0 absent, -1 when not a string. */
static int s_jtext(const mq_json_t *a, const mq_json_t *b, const char *key, char *buf, size_t len)
{
    const mq_json_t *o = a;
    const mq_json_field_t *f = mq_json_get(a, key);
    if (!f && b)
        f = mq_json_get(o = b, key);
    if (!f)
        return 0;
    if (f->kind != MQ_JSON_STR) {
        mq_err_set("%s: \"%s\" must be a string", o->path, key);
        return -1;
    }
    size_t n = strnlen(f->str, len - 1); /* a longer value is cut to what BUF holds */
    memcpy(buf, f->str, n);
    buf[n] = '\0';
    return 1;
}

/* ---- the run ------------------------------------------------------------------------- */

typedef struct {
    int bits;
    uint64_t first, last;
} s_span_t;

typedef struct {
    /* from metrics.csv */
    size_t rows;
    uint64_t last_iter;
    double t_last, bytes;
    double t_bits[S_FP32 + 1];     /* training time spent at each bit-width */
    size_t n_bits[S_FP32 + 1];     /* iterations at each bit-width */
    s_span_t *spans;               /* runs of equal bits */
    size_t n_spans, cap_spans;
    bool evaluated;                /* the last evaluated row: */
    double acc;
    uint64_t acc_iter;
    /* from config.json, else summary.json */
    char status[32], policy[64], model[32], dataset[32], rule[32], detail[512];
    char reason[512]; /* why a run that did not complete ended; "" when it does not say */
    char clock[16]; /* "real", "simulated"; "" when the run does not say */
    double iterations, train_time, workers, servers, link_mbps, div_iter;
    double wall_time; /* -1 when the run does not say */
    double params;    /* the model's parameters, 0 when the run does not say */
    double eval_limit, final_eval_limit; /* -1 when absent */
} s_run_t;

static int s_load_json(const char *cfg_path, const char *sum_path, s_run_t *r)
{
    mq_json_t cfg = {0}, sum = {0};
    int rc = -1;
    if (mq_json_load(cfg_path, &cfg) < 0 || mq_json_load(sum_path, &sum) < 0)
        goto done;
    if (s_jtext(&sum, NULL, "status", r->status, sizeof r->status) <= 0) {
        mq_err_set("%s: no \"status\" string (completed, interrupted, failed, diverged)",
                   sum_path);
        goto done;
    }
    snprintf(r->policy, sizeof r->policy, "?");
    r->eval_limit = r->final_eval_limit = -1;
    r->wall_time = -1;
    if (s_jtext(&sum, &cfg, "policy", r->policy, sizeof r->policy) < 0 ||
        s_jtext(&cfg, &sum, "model", r->model, sizeof r->model) < 0 ||
        s_jtext(&cfg, &sum, "dataset", r->dataset, sizeof r->dataset) < 0 ||
        s_jnum(&cfg, &sum, "link_mbps", 0, 1e9, &r->link_mbps) < 0 ||
        s_jnum(&cfg, NULL, "eval_limit", 0, 1e12, &r->eval_limit) < 0 ||
        s_jnum(&cfg, NULL, "final_eval_limit", 0, 1e12, &r->final_eval_limit) < 0 ||
        s_jnum(&sum, NULL, "iterations", 0, 1e15, &r->iterations) < 0 ||
        s_jnum(&sum, NULL, "train_time_s", 0, 1e12, &r->train_time) < 0 ||
        s_jtext(&sum, &cfg, "clock", r->clock, sizeof r->clock) < 0 ||
        s_jtext(&sum, NULL, "reason", r->reason, sizeof r->reason) < 0 ||
        s_jnum(&sum, NULL, "wall_time_s", 0, 1e12, &r->wall_time) < 0 ||
        s_jnum(&sum, NULL, "params", 1, 1e15, &r->params) < 0)
        goto done;
    int w = s_jnum(&cfg, &sum, "workers", 1, 1e6, &r->workers);
    int s = w < 0 ? -1 : s_jnum(&cfg, &sum, "servers", 0, 1e6, &r->servers);
    if (s <= 0) {
        if (s == 0)
            mq_err_set("%s: no \"%s\" (nor in %s)", cfg_path, w ? "servers" : "workers",
                       sum_path);
        goto done;
    }
    if (strcmp(r->status, "diverged") == 0 &&
        (s_jtext(&sum, NULL, "divergence_rule", r->rule, sizeof r->rule) < 0 ||
         s_jtext(&sum, NULL, "divergence_detail", r->detail, sizeof r->detail) < 0 ||
         s_jnum(&sum, NULL, "divergence_iter", 0, 1e15, &r->div_iter) < 0))
        goto done;
    rc = 0;
done:
    mq_json_free(&cfg);
    mq_json_free(&sum);
    return rc;
}

/* ---- metrics.csv, by column name ----------------------------------------------------- */

enum { S_ITER, S_TIME, S_BITS, S_UP, S_DOWN, S_ACC, S_NCOLS };

static const struct {
    const char *name;
    double lo, hi;
    bool integral;
} s_cols[S_NCOLS] = {
    [S_ITER] = {"iter", 0, 1e15, true},           [S_TIME] = {"train_time_s", 0, 1e12, false},
    [S_BITS] = {"bits", 1, S_FP32, true},         [S_UP] = {"bytes_up", 0, 1e18, true},
    [S_DOWN] = {"bytes_down", 0, 1e18, true},
    [S_ACC] = {"test_acc", 0, 1, false},
};

typedef struct {
    const char *path;
    int line;
    int ncols;       /* in the header */
    int at[S_NCOLS]; /* where each column we read sits */
    char **cells;
} s_csv_t;

static int s_csv_header(s_csv_t *c, char *line)
{
    if (mq_csv_header(c->path, line, &c->cells, &c->ncols) != 0)
        return -1;
    for (int k = 0; k < S_NCOLS; k++) {
        c->at[k] = mq_csv_find(c->cells, c->ncols, s_cols[k].name);
        if (c->at[k] < 0) {
            mq_err_set("%s:1: no column '%s' in the header", c->path, s_cols[k].name);
            return -1;
        }
    }
    return 0;
}

static int s_cell(const s_csv_t *c, int k, double *out)
{
    const char *s = c->cells[c->at[k]];
    char *end = NULL;
    errno = 0;
    double v = *s ? strtod(s, &end) : NAN;
    if (!*s || *end || errno == ERANGE || !isfinite(v) || v < s_cols[k].lo ||
        v > s_cols[k].hi || (s_cols[k].integral && v != floor(v))) {
        mq_err_set("%s:%d: column %s: '%s' is not %s in [%g, %g]", c->path, c->line,
                   s_cols[k].name, s, s_cols[k].integral ? "an integer" : "a number",
                   s_cols[k].lo, s_cols[k].hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int s_add_span(s_run_t *r, int bits, uint64_t iter)
{
    if (r->n_spans && r->spans[r->n_spans - 1].bits == bits) {
        r->spans[r->n_spans - 1].last = iter;
        return 0;
    }
    if (r->n_spans == r->cap_spans) {
        size_t cap = r->cap_spans ? 2 * r->cap_spans : 16;
        s_span_t *s = realloc(r->spans, cap * sizeof *s);
        if (!s) {
            mq_err_set("out of memory");
            return -1;
        }
        r->spans = s;
        r->cap_spans = cap;
    }
    r->spans[r->n_spans++] = (s_span_t){bits, iter, iter};
    return 0;
}

/* One row (already split into C->cells) into the run's totals. */
static int s_row(const s_csv_t *c, s_run_t *r)
{
    double v[S_NCOLS] = {0};
    bool evaluated = c->cells[c->at[S_ACC]][0] != '\0';
    for (int k = 0; k < S_NCOLS; k++)
        if ((k != S_ACC || evaluated) && s_cell(c, k, &v[k]) < 0)
            return -1;
    uint64_t iter = (uint64_t)v[S_ITER];
    if (r->rows && (iter <= r->last_iter || v[S_TIME] < r->t_last)) {
        mq_err_set("%s:%d: iter and train_time_s must increase from row to row", c->path,
                   c->line);
        return -1;
    }
    int bits = (int)v[S_BITS];
    if (s_add_span(r, bits, iter) < 0)
        return -1;
    r->t_bits[bits] += v[S_TIME] - r->t_last;
    r->n_bits[bits]++;
    r->bytes += v[S_UP] + v[S_DOWN];
    if (evaluated) {
        r->evaluated = true;
        r->acc = v[S_ACC];
        r->acc_iter = iter;
    }
    r->rows++;
    r->last_iter = iter;
    r->t_last = v[S_TIME];
    return 0;
}

/* Field K of a CSV line as an iteration number (-1 if it is not one). */
static double s_field_iter(const char *line, int k)
{
    for (; k > 0 && line; k--)
        if ((line = strchr(line, ',')))
            line++;
    if (!line)
        return -1;
    char *end;
    double v = strtod(line, &end);
    return end == line ? -1 : v;
}

/* A resumed run goes on from an earlier iteration than its last row: a row that a later row
 * goes back to or before was lost with the restart. KEEP[i] says whether LINES[i] stands. */
static void s_superseded(char **lines, size_t n, int iter_col, bool *keep)
{
    double lowest_after = INFINITY;
    for (size_t i = n; i-- > 0;) {
        double it = s_field_iter(lines[i], iter_col);
        keep[i] = it < 0 || it < lowest_after;
        if (it >= 0 && it < lowest_after)
            lowest_after = it;
    }
}

/* A last line without its newline and short of columns is a row a killed run was still
 * writing: it is left out. Any other bad line is an error naming the file and the line. */
static int s_load_metrics(const char *path, s_run_t *r)
{
    char *text;
    size_t len;
    if (mq_read_file(path, &text, &len) < 0)
        return -1;
    s_csv_t c = {.path = path};
    int rc = -1;
    char **lines = NULL;
    bool *keep = NULL;
    bool *last_cut = NULL;
    size_t nlines = 0;
    if (strlen(text) != len) {
        mq_err_set("%s: contains a NUL byte", path);
        goto done;
    }
    size_t cap = 1;
    for (const char *p = text; (p = strchr(p, '\n')); p++)
        cap++;
    lines = calloc(cap, sizeof *lines);
    keep = calloc(cap, sizeof *keep);
    last_cut = calloc(cap, sizeof *last_cut);
    if (!lines || !keep || !last_cut) {
        mq_err_set("%s: out of memory", path);
        goto done;
    }
    for (char *line = text, *next; *line; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? (*nl = '\0', nl + 1) : line + strlen(line);
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r')
            line[--n] = '\0';
        if (++c.line == 1) {
            if (s_csv_header(&c, line) < 0)
                goto done;
            continue;
        }
        last_cut[nlines] = !nl;
        lines[nlines++] = line;
    }
    if (c.line == 0) {
        mq_err_set("%s: empty (expected the header line)", path);
        goto done;
    }
    s_superseded(lines, nlines, c.at[S_ITER], keep);
    for (size_t i = 0; i < nlines; i++) {
        c.line = (int)i + 2;
        char *line = lines[i];
        if (!*line)
            continue;
        int got = mq_csv_split(line, c.cells, c.ncols);
        if (got < c.ncols && last_cut[i])
            break;
        if (got != c.ncols) {
            mq_err_set("%s:%d: %d columns, the header has %d", path, c.line, got, c.ncols);
            goto done;
        }
        if (keep[i] && s_row(&c, r) < 0)
            goto done;
    }
    rc = 0;
done:
    free(lines);
    free(keep);
    free(last_cut);
    free(c.cells);
    free(text);
    return rc;
}

/* ---- the lines ------------------------------------------------------------------------ */

static void s_fmt_bytes(double b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    int u = 0;
    while (b >= 1000 && u < 5) {
        b /= 1000;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

static void s_fmt_secs(double s, char *buf, size_t len)
{
    int n = snprintf(buf, len, s < 100 ? "%.1f s" : "%.0f s", s);
    if (n > 0 && (size_t)n < len && s >= 3600)
        snprintf(buf + n, len - (size_t)n, " (%.1f h)", s / 3600);
    else if (n > 0 && (size_t)n < len && s >= 180)
        snprintf(buf + n, len - (size_t)n, " (%.1f min)", s / 60);
}

static void s_fmt_ratio(double x, char *buf, size_t len)
{
    snprintf(buf, len, x >= 100 ? "%.0f×" : "%.1f×", x);
}

static bool s_all_fp32(const s_run_t *r)
{
    return r->n_spans == 1 && r->spans[0].bits == S_FP32;
}

/* "test accuracy 87.9% on 10000 test images[ at iteration N]": the last evaluation. The final
 * evaluation (the last row) may use its own, larger test set. */
static void s_acc_text(const s_run_t *r, char *buf, size_t len)
{
    if (!r->evaluated) {
        snprintf(buf, len, "no test evaluation");
        return;
    }
    bool final = r->acc_iter == r->last_iter;
    double limit = final && r->final_eval_limit >= 0 ? r->final_eval_limit : r->eval_limit;
    bool known = strcmp(r->dataset, "fashion-mnist") == 0 || strcmp(r->dataset, "mnist") == 0 ||
                 strcmp(r->dataset, "cifar10") == 0;
    char images[48] = "", at[48] = "";
    if (limit == 0 && !known)
        snprintf(images, sizeof images, " on the whole test set");
    else if (limit >= 0)
        snprintf(images, sizeof images, " on %.0f test images",
                 known && (limit == 0 || limit > S_TEST_SET) ? S_TEST_SET : limit);
    if (!final)
        snprintf(at, sizeof at, " at iteration %llu", (unsigned long long)r->acc_iter);
    snprintf(buf, len, "test accuracy %.1f%%%s%s", r->acc * 100, images, at);
}

static const char *s_rule_words(const char *rule)
{
    if (strcmp(rule, "nonfinite") == 0)
        return "the loss or the gradient became NaN or infinite";
    if (strcmp(rule, "loss") == 0)
        return "the training loss blew up";
    if (strcmp(rule, "accuracy") == 0)
        return "test accuracy fell back to chance";
    if (strcmp(rule, "chance") == 0)
        return "the run ended at chance";
    if (strcmp(rule, "flat") == 0)
        return "the training loss stayed where it began";
    return rule[0] ? rule : "no rule recorded";
}

static const char *s_status_words(const char *status)
{
    if (strcmp(status, "interrupted") == 0)
        return "interrupted (stopped before its end)";
    if (strcmp(status, "failed") == 0)
        return "FAILED (a process stopped; see its log)";
    if (strcmp(status, "running") == 0)
        return "not finished (still running, or killed)";
    return status;
}

/* One line, or two for a divergence (what happened first, then the numbers). The accuracy is
 * the last evaluation's; one before the end is marked with its iteration. */
static void s_print_outcome(FILE *out, const s_run_t *r)
{
    char acc[160], t[48];
    s_acc_text(r, acc, sizeof acc);
    s_fmt_secs(r->train_time, t, sizeof t);
    unsigned long long it = (unsigned long long)r->iterations;
    bool diverged = strcmp(r->status, "diverged") == 0;
    if (diverged) {
        fprintf(out, "run DIVERGED at iteration %llu: %s", (unsigned long long)r->div_iter,
                s_rule_words(r->rule));
        if (r->detail[0])
            fprintf(out, " (%s)", r->detail);
        fputs("\n  ", out);
    } else if (r->reason[0]) {
        fprintf(out, "run %s: %s\n  ",
                strcmp(r->status, "failed") == 0 ? "FAILED" : r->status, r->reason);
    } else {
        fprintf(out, "run %s: ", s_status_words(r->status));
    }
    if (!diverged && r->evaluated && r->acc_iter == r->last_iter) {
        fprintf(out, "%s after %llu iterations, %s of training\n", acc, it, t);
        return;
    }
    const char *when = !diverged || !r->evaluated  ? ""
                       : r->acc_iter < r->div_iter ? ", before it diverged"
                       : r->acc_iter > r->div_iter ? ", after it diverged"
                                                   : "";
    fprintf(out, "%llu iterations, %s of training; %s%s%s\n", it, t,
            r->evaluated ? "last " : "", acc, when);
}

static void s_width(int bits, char *buf, size_t len)
{
    if (bits == S_FP32)
        snprintf(buf, len, "fp32");
    else
        snprintf(buf, len, "%d", bits);
}

static void s_span_text(const s_span_t *s, bool first, char *buf, size_t len)
{
    char w[8];
    s_width(s->bits, w, sizeof w);
    if (s->first == s->last)
        snprintf(buf, len, "%s (%s%llu)", w, first ? "it " : "", (unsigned long long)s->first);
    else
        snprintf(buf, len, "%s (%s%llu-%llu)", w, first ? "it " : "",
                 (unsigned long long)s->first, (unsigned long long)s->last);
}

/* Each width's share of the training time (of the iterations if no time was recorded). */
static void s_print_shares(FILE *out, const s_run_t *r)
{
    double total = 0;
    for (int b = 1; b <= S_FP32; b++)
        total += r->t_bits[b];
    bool by_time = total > 0;
    fprintf(out, "  share of %s:", by_time ? "training time" : "iterations");
    const char *sep = " ";
    for (int b = 1; b <= S_FP32; b++) {
        if (!r->n_bits[b])
            continue;
        double pct = 100 * (by_time ? r->t_bits[b] / total : (double)r->n_bits[b] / r->rows);
        char w[8];
        s_width(b, w, sizeof w);
        if (pct > 0 && pct < 0.5)
            fprintf(out, "%s%s: <1%%", sep, w);
        else
            fprintf(out, "%s%s: %.0f%%", sep, w, pct);
        sep = ", ";
    }
    fputc('\n', out);
}

static void s_print_bits(FILE *out, const s_run_t *r)
{
    if (!r->rows) {
        fprintf(out, "bits: no iteration recorded\n");
        return;
    }
    if (s_all_fp32(r)) {
        fprintf(out, "bits: fp32 (no quantization)\n");
        return;
    }
    fprintf(out, "bits (policy %s): ", r->policy);
    bool all = r->n_spans <= S_MAX_LISTED;
    for (size_t i = 0; i < r->n_spans; i++) {
        if (!all && i == S_SHOWN) {
            fputs(" → …", out);
            i = r->n_spans - 1;
        }
        char s[80];
        s_span_text(&r->spans[i], i == 0, s, sizeof s);
        fprintf(out, "%s%s", i ? " → " : "", s);
    }
    if (all) {
        fputc('\n', out);
        return;
    }
    fprintf(out, "; %zu changes\n", r->n_spans - 1);
    s_print_shares(out, r);
}

/* A per-tensor policy's levels, as the scheduler's last "widths" event in RUN_DIR gave them
 * (nothing for a run without one). */
static void s_print_widths(FILE *out, const char *run_dir)
{
    static const char event[] = "\"event\":\"widths\"", key[] = "\"widths\":\"",
                      iter[] = "\"iter\":";
    char path[4200], *ev;
    size_t len;
    snprintf(path, sizeof path, "%s/events.jsonl", run_dir);
    if (mq_read_file(path, &ev, &len) != 0)
        return;
    const char *last = NULL;
    for (const char *p = strstr(ev, event); p; p = strstr(p + 1, event))
        last = p;
    const char *line = last, *w = last ? strstr(last, key) : NULL;
    while (line && line > ev && line[-1] != '\n')
        line--;
    const char *at = line ? strstr(line, iter) : NULL;
    size_t n = w ? strcspn(w + strlen(key), "\"\n") : 0;
    if (n && at && at < w)
        fprintf(out,
                "  per tensor, in the model's order (the last choice, at iteration %lld): %.*s\n",
                strtoll(at + strlen(iter), NULL, 10), (int)n, w + strlen(key));
    free(ev);
}

static void s_print_bytes(FILE *out, const s_run_t *r, double fp32_iter, const char *why)
{
    char sent[32], fp[32], ratio[32];
    s_fmt_bytes(r->bytes, sent, sizeof sent);
    if (r->servers == 0) {
        fprintf(out, "sent nothing: one process, no parameter servers\n");
    } else if (s_all_fp32(r)) {
        fprintf(out, "sent %s, all in fp32 (no quantization)\n", sent);
    } else if (!r->rows) {
        fprintf(out, "sent %s\n", sent);
    } else if (fp32_iter <= 0) {
        fprintf(out, "sent %s (no fp32 comparison: %s)\n", sent, why);
    } else {
        double fp32 = fp32_iter * (double)r->rows;
        s_fmt_bytes(fp32, fp, sizeof fp);
        if (r->bytes <= 0) {
            fprintf(out, "sent %s; fp32 would have sent ≈ %s\n", sent, fp);
            return;
        }
        double x = fp32 / r->bytes;
        s_fmt_ratio(x >= 1 ? x : 1 / x, ratio, sizeof ratio);
        if (fabs(x - 1) < 0.05)
            fprintf(out, "sent %s, about as much as fp32", sent);
        else
            fprintf(out, "sent %s, %s %s than fp32", sent, ratio, x >= 1 ? "less" : "more");
        fprintf(out, " (≈ %s for the same %zu iterations)\n", fp, r->rows);
    }
}

/* fp32 on the same links, estimated: this run's measured training time, with the link time of
 * the bytes it sent replaced by that of fp32's, both from the link model: every byte of a
 * push and of an aggregate goes through the busier of a worker's NIC (its P bytes) and a
 * server's (W x P / S bytes), at the link rate. Everything but the link (compute, codecs,
 * servers, waiting) is kept as measured, so the estimate errs on fp32's side (fp32 skips the
 * codecs). */
static void s_print_time(FILE *out, const s_run_t *r, double param_bytes, const char *why)
{
    char t[128], est_s[48], ratio[32], wall[48];
    s_fmt_secs(r->train_time, t, sizeof t);
    if (strcmp(r->clock, "simulated") == 0) { /* its seconds are not the ones the user waited */
        s_fmt_secs(r->wall_time, wall, sizeof wall);
        size_t n = strlen(t);
        if (r->wall_time >= 0)
            snprintf(t + n, sizeof t - n, " (simulated clock; %s of wall time)", wall);
        else
            snprintf(t + n, sizeof t - n, " (simulated clock)");
    }
    if (r->servers == 0 || s_all_fp32(r) || !r->rows) {
        fprintf(out, "time: %s of training%s\n", t,
                r->servers > 0 && s_all_fp32(r) ? " in fp32 (this run is the baseline)" : "");
        return;
    }
    if (r->link_mbps <= 0) {
        fprintf(out, "time: %s of training; no link emulated (loopback): fp32 time not "
                     "estimated\n", t);
        return;
    }
    if (param_bytes <= 0) {
        fprintf(out, "time: %s of training; fp32 time not estimated (%s)\n", t, why);
        return;
    }
    double rate = r->link_mbps * 1e6 / 8;
    double share = fmax(1.0, r->workers / r->servers); /* busiest NIC vs a worker's */
    double fp32_per_worker = (double)r->rows * 2 * param_bytes, sent_per_worker = r->bytes / r->workers;
    double est = r->train_time + share * (fp32_per_worker - sent_per_worker) / rate;
    s_fmt_secs(est, est_s, sizeof est_s);
    fprintf(out, "time: %s of training; fp32 on the same %g Mbit/s links ≈ %s", t,
            r->link_mbps, est_s);
    if (r->train_time > 0) {
        double x = est / r->train_time;
        s_fmt_ratio(x >= 1 ? x : 1 / x, ratio, sizeof ratio);
        fprintf(out, ", %s %s", ratio, x >= 1 ? "longer" : "shorter");
    }
    fprintf(out, " (estimate: this run's time with fp32's bytes on the link model)\n");
}

static void s_print_files(FILE *out, const char *dir)
{
    static const char *const names[] = {"summary.json", "metrics.csv", "events.jsonl",
                                        "config.json", "logs/"};
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    fprintf(out, "files: %.*s/{", (int)n, dir);
    const char *sep = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%.*s/%s", (int)n, dir, names[i]);
        if (stat(path, &st) == 0) {
            fprintf(out, "%s%s", sep, names[i]);
            sep = ",";
        }
    }
    fputs("}\n", out);
}

/* 4 x the model's parameter count, the fp32 gradient one worker sends; 0 (and WHY) if the
 * model is unknown. Runs say it in summary.json; for those before that, building the model
 * is the one exact count; its arrays are calloc'ed and
 * never touched, so it costs little. */
static double s_param_bytes(const s_run_t *r, char *why, size_t len)
{
    if (r->params > 0) /* the run says (a model of the workers' own has no other source) */
        return 4.0 * r->params;
    mq_model_t *m = mq_model_new(r->model, strcmp(r->dataset, "cifar10") == 0 ? 3 : 1, 1, 0);
    if (!m) {
        snprintf(why, len, "%s", mq_err_last());
        return 0;
    }
    double bytes = 4.0 * (double)mq_model_nparams(m);
    mq_model_destroy(&m);
    return bytes;
}

int mq_run_summary_print(const char *run_dir, FILE *out)
{
    char cfg[4200], sum[4200], met[4200], why[256] = "";
    snprintf(cfg, sizeof cfg, "%s/config.json", run_dir);
    snprintf(sum, sizeof sum, "%s/summary.json", run_dir);
    snprintf(met, sizeof met, "%s/metrics.csv", run_dir);
    s_run_t *r = calloc(1, sizeof *r);
    if (!r) {
        mq_err_set("out of memory");
        return -1;
    }
    int rc = -1;
    if (s_load_json(cfg, sum, r) < 0 || s_load_metrics(met, r) < 0)
        goto done;
    /* A killed run's summary may lag its metrics. */
    r->iterations = fmax(r->iterations, (double)r->rows);
    r->train_time = fmax(r->train_time, r->t_last);
    double param_bytes = 0;
    if (r->servers > 0 && r->rows && !s_all_fp32(r))
        param_bytes = s_param_bytes(r, why, sizeof why);
    /* Every worker pushes P bytes up and gets P bytes back (headers neglected). */
    double fp32_iter = r->workers * param_bytes * 2;
    s_print_outcome(out, r);
    s_print_bits(out, r);
    s_print_widths(out, run_dir);
    s_print_bytes(out, r, fp32_iter, why);
    s_print_time(out, r, param_bytes, why);
    s_print_files(out, run_dir);
    fflush(out);
    rc = 0;
done:
    free(r->spans);
    free(r);
    return rc;
}

/* ---- the command ---------------------------------------------------------------------- */

static void s_usage(FILE *f)
{
    fprintf(f, "usage: mqgrad summary RUN_DIR\n\n"
               "What a finished (or diverged, or interrupted) run did, in a few lines: outcome\n"
               "and test accuracy, bit-widths over time, bytes and time against fp32 (the time\n"
               "an estimate: the run's own time with fp32's bytes on the link model), where the\n"
               "files are.\n"
               "Exit 2 when RUN_DIR is not a run directory or one of its files is malformed.\n");
}

int mq_cmd_summary(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        s_usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-' || !argv[1][0]) {
        fprintf(stderr, "mqgrad summary: %s\n\n",
                argc < 2 ? "which run? give its directory"
                         : argc > 2 ? "one run directory at a time" : "expected a run directory");
        s_usage(stderr);
        return 2;
    }
    struct stat st;
    int err = stat(argv[1], &st) != 0 ? errno : 0;
    if (err || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "mqgrad summary: %s: not a run directory (%s)\n", argv[1],
                err ? strerror(err) : "not a directory");
        return 2;
    }
    if (mq_run_summary_print(argv[1], stdout) < 0) {
        fprintf(stderr, "mqgrad summary: %s\n", mq_err_last());
        return 2;
    }
    return 0;
}
