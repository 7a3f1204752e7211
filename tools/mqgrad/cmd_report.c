/* mqgrad report RUN_DIR...: reads finished (or interrupted, or diverged) run directories,
 * groups them by method (the summary's "policy", plus config.json's codec settings where they
 * differ from the setting most runs share) and writes plots and the paper's tables (section
 * 4.2) into an output directory. Exit 2 on bad flags or an unreadable run, 1 if writing fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "report.h"

#define S_MAX_CHECKPOINTS 32

typedef struct {
    char out[512], title[256];
    double checkpoints[S_MAX_CHECKPOINTS];
    size_t n_checkpoints;
    double target_acc;
    long last_k;
    char **runs;
    int n_runs;
} s_opts_t;

static int s_parse_checkpoints(const char *list, s_opts_t *o)
{
    char item[64];
    o->n_checkpoints = 0;
    for (const char *p = list;; p++) {
        size_t n = strcspn(p, ",");
        if (o->n_checkpoints == S_MAX_CHECKPOINTS || n >= sizeof item) {
            mq_err_set("--checkpoints: at most %d times, each a number", S_MAX_CHECKPOINTS);
            return -1;
        }
        snprintf(item, sizeof item, "%.*s", (int)n, p);
        if (mq_parse_double("--checkpoints", item, 1e-9, 1e12,
                            &o->checkpoints[o->n_checkpoints++]) < 0)
            return -1;
        p += n;
        if (!*p)
            return 0;
    }
}

/* One flag table (mqgrad/service.h) and the run directories as positionals. 0 ok, 1 --help
 * printed, 2 after a message naming the bad flag or value. */
static int s_parse_args(int argc, char **argv, s_opts_t *o)
{
    *o = (s_opts_t){.out = "report", .title = "mqgrad report", .target_acc = 0.85, .last_k = 5};
    char checkpoints[512] = "";
    o->runs = calloc((size_t)argc + 1, sizeof *o->runs);
    if (!o->runs) {
        fprintf(stderr, "mqgrad report: out of memory\n");
        return 2;
    }
    const mq_flag_t flags[] = {
        {"out", NULL, MQ_FLAG_STR, o->out, sizeof o->out, 1, 0, "output directory"},
        {"checkpoints", NULL, MQ_FLAG_STR, checkpoints, sizeof checkpoints, 1, 0,
         "training times in seconds for the accuracy table, T1,T2,... (default: 25,50,75,100% "
         "of the shortest run)"},
        {"target-acc", NULL, MQ_FLAG_DOUBLE, &o->target_acc, 0, 0, 1,
         "test accuracy for the time-to-target table"},
        {"last", NULL, MQ_FLAG_LONG, &o->last_k, 0, 1, 1000,
         "the final accuracy: the mean of each run's last N evaluations"},
        {"title", NULL, MQ_FLAG_STR, o->title, sizeof o->title, 0, 0,
         "heading of the report and the plots"},
        {0},
    };
    char *args[argc + 1];
    memcpy(args, argv, sizeof(char *) * (size_t)argc);
    args[0] = "mqgrad report";
    args[argc] = NULL;
    int rc = mq_flags_parse(
        flags, argc, args,
        "usage: mqgrad report [flags] RUN_DIR...\n\n"
        "Reads each run's summary.json, metrics.csv and config.json, groups the runs by\n"
        "method and writes loss/accuracy/bits/bytes-vs-time PNGs (gnuplot) and report.md\n"
        "with the tables. A method is the run's policy, plus its codec settings where they\n"
        "differ from the setting most runs share (\"mqgrad (paper-exact codec)\": one range\n"
        "per tensor slice, nearest rounding). A run that diverged is listed as such and\n"
        "counts in none of its method's accuracies.\n"
        "Environment: MQGRAD_GNUPLOT, the gnuplot program (default: gnuplot on PATH).",
        o->runs, argc, &o->n_runs);
    if (rc != 0)
        return rc;
    if (checkpoints[0] && s_parse_checkpoints(checkpoints, o) < 0) {
        fprintf(stderr, "mqgrad report: %s\n", mq_err_last());
        return 2;
    }
    if (o->n_runs == 0) {
        fprintf(stderr, "mqgrad report: no run directories given (see --help)\n");
        return 2;
    }
    return 0;
}

static int s_load(const s_opts_t *o, mq_rep_set_t *set)
{
    *set = (mq_rep_set_t){0};
    set->runs = calloc((size_t)o->n_runs, sizeof *set->runs);
    if (!set->runs) {
        mq_err_set("out of memory");
        return -1;
    }
    for (int i = 0; i < o->n_runs; i++) {
        if (mq_rep_load_run(o->runs[i], &set->runs[i]) < 0)
            return -1;
        set->n_runs++;
    }
    if (mq_rep_group(set) < 0)
        return -1;
    /* The same method and seed twice on the same link (runs at other link speeds are other
     * panels, not repeats). */
    for (size_t k = 0; k < set->n_methods; k++)
        for (size_t r = 1; r < set->methods[k].n_runs; r++) {
            const mq_rep_run_t *b = set->methods[k].runs[r], *a = NULL;
            for (size_t q = 0; q < r && !a; q++) {
                const mq_rep_run_t *c = set->methods[k].runs[q];
                if (c->seed == b->seed && mq_rep_same_link(c->link_mbps, b->link_mbps))
                    a = c;
            }
            if (a)
                fprintf(stderr,
                        "mqgrad report: warning: %s and %s are both %s with seed %llu; both "
                        "count as seeds\n",
                        a->dir, b->dir, a->method, (unsigned long long)a->seed);
        }
    return 0;
}

/* Default checkpoints: 25, 50, 75 and 100% of the shortest run's training time. */
static void s_default_checkpoints(const mq_rep_set_t *set, s_opts_t *o)
{
    double shortest = INFINITY, any = INFINITY;
    for (size_t i = 0; i < set->n_runs; i++) { /* a run cut short by divergence sets no limit */
        any = fmin(any, mq_rep_run_time(&set->runs[i]));
        if (!set->runs[i].diverged)
            shortest = fmin(shortest, mq_rep_run_time(&set->runs[i]));
    }
    if (isinf(shortest))
        shortest = any;
    o->n_checkpoints = 4;
    for (int c = 0; c < 4; c++)
        o->checkpoints[c] = shortest * (c + 1) / 4.0;
}

static int s_write_markdown(const mq_rep_set_t *set, const s_opts_t *o, bool drawn,
                            bool headline, const mq_rep_cmp_t *cmp, size_t n_cmp, char *path,
                            size_t len)
{
    snprintf(path, len, "%s/report.md", o->out);
    FILE *f = fopen(path, "w");
    if (!f) {
        mq_err_set("%s: cannot write", path);
        return -1;
    }
    mq_rep_md_opts_t mo = {.title = o->title,
                           .checkpoints = o->checkpoints,
                           .n_checkpoints = o->n_checkpoints,
                           .target_acc = o->target_acc,
                           .last_k = (size_t)o->last_k,
                           .plots_drawn = drawn,
                           .headline_drawn = headline,
                           .cmp = cmp,
                           .n_cmp = n_cmp};
    mq_rep_markdown(f, set, &mo);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        mq_err_set("%s: write failed", path);
        return -1;
    }
    return 0;
}

static void s_print_written(const mq_rep_set_t *set, const s_opts_t *o, const char *md, bool drawn,
                            bool headline)
{
    printf("mqgrad report: %zu runs, %zu methods:", set->n_runs, set->n_methods);
    for (size_t k = 0; k < set->n_methods; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        printf(" %s (%zu", m->name, m->n_runs);
        if (m->n_diverged)
            printf(", %zu diverged", m->n_diverged);
        printf(")");
    }
    printf("\n  tables: %s\n", md);
    for (int i = 0; i < MQ_REP_N_PLOTS; i++)
        if (mq_rep_plot_has_data(set, i)) {
            const char *name = mq_rep_plot_name(i);
            if (drawn)
                printf("  plot:   %s/%s.png\n", o->out, name);
            else
                printf("  script: %s/%s.gp (not drawn)\n", o->out, name);
        }
    if (headline)
        printf("  %s %s/headline.%s\n", drawn ? "plot:  " : "script:", o->out,
               drawn ? "png" : "gp (not drawn)");
    printf("  data:   %s/data/\n", o->out);
}

int mq_cmd_report(int argc, char **argv)
{
    s_opts_t o;
    mq_rep_set_t set = {0};
    mq_rep_cmp_t *cmp = NULL;
    size_t n_cmp = 0;
    int rc = s_parse_args(argc, argv, &o);
    if (rc != 0) {
        free(o.runs);
        return rc == 1 ? 0 : rc;
    }
    rc = 2;
    if (s_load(&o, &set) < 0) {
        fprintf(stderr, "mqgrad report: %s\n", mq_err_last());
        goto done;
    }
    if (o.n_checkpoints == 0)
        s_default_checkpoints(&set, &o);
    rc = 1;
    mq_rep_plots_t plots = MQ_REP_PLOTS_NO_GNUPLOT;
    char md[4096];
    if (mq_mkdirs(o.out) < 0) {
        fprintf(stderr, "mqgrad report: %s\n", mq_err_last());
        goto done;
    }
    /* The comparisons once, for the tables and the headline figure alike. */
    if (mq_rep_compare(&set, o.target_acc, (size_t)o.last_k, &cmp, &n_cmp) != 0) {
        fprintf(stderr, "mqgrad report: %s\n", mq_err_last());
        goto done;
    }
    /* A plot that fails to draw still leaves the tables written. */
    bool headline = false;
    int plot_rc = mq_rep_plots(&set, o.out, o.title, cmp, n_cmp, o.target_acc, &plots,
                               &headline);
    if (plot_rc < 0)
        fprintf(stderr, "mqgrad report: plots: %s\n", mq_err_last());
    bool drawn = plot_rc == 0 && plots == MQ_REP_PLOTS_DRAWN;
    if (s_write_markdown(&set, &o, drawn, headline, cmp, n_cmp, md, sizeof md) < 0) {
        fprintf(stderr, "mqgrad report: %s\n", mq_err_last());
        goto done;
    }
    s_print_written(&set, &o, md, drawn, headline);
    rc = plot_rc < 0 ? 1 : 0;
done:
    mq_rep_compare_free(cmp, n_cmp);
    mq_rep_set_free(&set);
    free(o.runs);
    return rc;
}
