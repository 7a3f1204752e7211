/* report.md of `mqgrad report`: the Markdown tables of the paper's section 4.2, computed from
 * the loaded runs (accuracy at time checkpoints, Tables 1-2; time in quantization and in the
 * agent, Table 3), plus time to a target accuracy, final results and the plots' links. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/util.h"
#include "report.h"

#define S_CELL 160
#define S_NAME 200 /* a method's name (up to 127) and how many of its runs diverged */

/* "mean ± std" of V*SCALE over the N values that exist, "(n/total)" when some seeds lack
 * one, "N/A" when none has. */
static const char *s_stat(char *buf, const double *v, size_t n, size_t total, double scale,
                          int prec)
{
    double mean, std, tmp[n ? n : 1];
    for (size_t i = 0; i < n; i++)
        tmp[i] = v[i] * scale;
    if (n == 0)
        return "N/A";
    mq_rep_mean_std(tmp, n, &mean, &std);
    int len = n > 1 ? snprintf(buf, S_CELL, "%.*f ± %.*f", prec, mean, prec, std)
                    : snprintf(buf, S_CELL, "%.*f", prec, mean);
    if (n < total)
        snprintf(buf + len, S_CELL - (size_t)len, " (%zu/%zu)", n, total);
    return buf;
}

/* A table header; columns from LEFT_FROM on hold text and are left-aligned. */
static void s_header(FILE *f, const char *first, const char *const *cols, size_t n,
                     size_t left_from)
{
    fprintf(f, "| %s |", first);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %s |", cols[i]);
    fprintf(f, "\n|---|");
    for (size_t i = 0; i < n; i++)
        fprintf(f, i < left_from ? "---:|" : "---|");
    fputc('\n', f);
}

/* The method's name, with how many of its runs diverged: those never count in its accuracy
 * columns (they would show an accuracy it does not have). */
static const char *s_name(char *buf, const mq_rep_method_t *m)
{
    if (m->n_diverged == 0)
        return m->name;
    snprintf(buf, S_NAME, "%s — %zu of %zu diverged", m->name, m->n_diverged, m->n_runs);
    return buf;
}

/* The runs of M that count in its accuracy columns: those that did not diverge. */
static size_t s_live(const mq_rep_method_t *m)
{
    return m->n_runs - m->n_diverged;
}

/* "diverged (3/3) at iterations 78, 91, 85": the cell of a method whose runs all diverged. */
static const char *s_all_diverged(char *buf, const mq_rep_method_t *m)
{
    size_t n = (size_t)snprintf(buf, S_CELL, "diverged (%zu/%zu) at iteration%s", m->n_diverged,
                                m->n_runs, m->n_diverged > 1 ? "s" : "");
    const char *sep = " ";
    for (size_t r = 0; r < m->n_runs; r++) {
        if (!m->runs[r]->diverged)
            continue;
        if (n + 32 > S_CELL) { /* room for ", ..." but not for another number */
            snprintf(buf + n, S_CELL - n, ", ...");
            break;
        }
        n += (size_t)snprintf(buf + n, S_CELL - n, "%s%llu", sep,
                              (unsigned long long)m->runs[r]->div_iter);
        sep = ", ";
    }
    return buf;
}

/* TEXT for a table cell: '|' escaped, line breaks as spaces. */
static void s_cell_text(char *buf, size_t len, const char *text)
{
    size_t n = 0;
    for (; *text && n + 2 < len; text++) {
        if (*text == '|')
            buf[n++] = '\\';
        buf[n++] = *text == '\n' || *text == '\r' ? ' ' : *text;
    }
    buf[n] = '\0';
}

/* A run's final accuracy (%), or its divergence in place of one. */
static void s_run_acc(char *buf, size_t len, const mq_rep_run_t *run)
{
    if (run->diverged)
        snprintf(buf, len, "**diverged** at iteration %llu (%s rule)",
                 (unsigned long long)run->div_iter, run->div_rule);
    else if (isnan(run->final_acc))
        snprintf(buf, len, "N/A");
    else
        snprintf(buf, len, "%.2f", 100 * run->final_acc);
}

static void s_runs(FILE *f, const mq_rep_set_t *set)
{
    static const char *const cols[] = {
        "seed", "iterations", "train time (s)", "final test accuracy (%)", "status", "directory"};
    fprintf(f, "## Runs\n\n");
    s_header(f, "method", cols, 6, 4);
    for (size_t k = 0; k < set->n_methods; k++)
        for (size_t r = 0; r < set->methods[k].n_runs; r++) {
            const mq_rep_run_t *run = set->methods[k].runs[r];
            char acc[S_CELL], status[320];
            s_run_acc(acc, sizeof acc, run);
            s_cell_text(status, sizeof status, run->status);
            if (run->diverged && run->div_detail[0]) {
                size_t n = strlen(status);
                snprintf(status + n, sizeof status - n, ": ");
                s_cell_text(status + n + 2, sizeof status - n - 2, run->div_detail);
            }
            fprintf(f, "| %s | %llu | %llu | %.2f | %s | %s | `%s` |\n", run->method,
                    (unsigned long long)run->seed, (unsigned long long)run->iterations,
                    mq_rep_run_time(run), acc, status, run->dir);
        }
    fputc('\n', f);
}

/* The plots' panels, when the runs span several link speeds: "(80 Mbit/s, 1000 Mbit/s)". */
static void s_panels(FILE *f, const mq_rep_set_t *set)
{
    double links[set->n_runs + 1];
    char name[600];
    size_t n = mq_rep_links(set, links);
    if (n < 2)
        return;
    fprintf(f, "The runs span %zu link speeds: each plot has one panel per link speed (", n);
    for (size_t i = 0; i < n; i++) {
        mq_rep_link_name(set, links[i], name, sizeof name);
        fprintf(f, "%s%s", i ? ", " : "", name);
    }
    fprintf(f, "), with the same line style for a method in every panel; the tables below "
               "pool each method's runs over all link speeds.\n\n");
}

static void s_plots(FILE *f, const mq_rep_set_t *set, bool drawn)
{
    fprintf(f,
            "## Plots\n\nOne line per method: the median over its seeds on a common time grid, "
            "each seed interpolated linearly between its points and only inside its own first "
            "to last point. The line is drawn only where all of the method's seeds have a "
            "value, from the latest first point to the earliest last one: the median is then "
            "over the same seeds at every time, and does not jump where a seed starts or "
            "stops. The light band is the 25..75 %% range of the seeds, wherever at least two "
            "have a value. A method with at most %d points per seed (fp32 on a slow link) "
            "also shows its points: its seeds' k-th points at their median time; if its "
            "seeds never overlap in time, these points are its line. Runs that diverged are "
            "left out of their method's curves unless all of its runs did.\n\n",
            MQ_REP_FEW_POINTS);
    s_panels(f, set);
    if (!drawn)
        fprintf(f, "_The PNGs were not drawn (gnuplot was not found or failed); draw them in this "
                   "directory with `gnuplot NAME.gp`._\n\n");
    for (int i = 0; i < MQ_REP_N_PLOTS; i++) {
        const char *name = mq_rep_plot_name(i);
        if (mq_rep_plot_has_data(set, i))
            fprintf(f, "![%s](%s.png)\n\n", mq_rep_plot_caption(i), name);
        else
            fprintf(f, "_No %s plot: no run has its data._\n\n", mq_rep_plot_caption(i));
    }
    fprintf(f, "The bits plot leaves out the methods whose codec takes no bit-width (top-k, "
               "DGC, sign, ...).\n\n");
}

/* Tables 1-2: test accuracy (%) at each checkpoint. */
static void s_acc_table(FILE *f, const mq_rep_set_t *set, const mq_rep_md_opts_t *o)
{
    char cols[o->n_checkpoints][32], buf[S_CELL];
    const char *names[o->n_checkpoints];
    fprintf(f, "## Test accuracy (%%) at training-time checkpoints\n\n");
    for (size_t c = 0; c < o->n_checkpoints; c++) {
        snprintf(cols[c], sizeof cols[c], "%.4g s", o->checkpoints[c]);
        names[c] = cols[c];
    }
    s_header(f, "method", names, o->n_checkpoints, o->n_checkpoints);
    for (size_t k = 0; k < set->n_methods; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        char name[S_NAME];
        fprintf(f, "| %s |", s_name(name, m));
        for (size_t c = 0; c < o->n_checkpoints; c++) {
            double v[m->n_runs];
            size_t n = 0;
            for (size_t r = 0; r < m->n_runs; r++)
                if (!m->runs[r]->diverged)
                    n += mq_rep_acc_at(m->runs[r], o->checkpoints[c], &v[n]);
            fprintf(f, " %s |", s_live(m) ? s_stat(buf, v, n, s_live(m), 100, 2) : "diverged");
        }
        fputc('\n', f);
    }
    fprintf(f, "\nThe last evaluation at or before each time, mean ± sample standard deviation "
               "over seeds. N/A: no run of the method had been evaluated by then; (k/n): only k "
               "of its n seeds had. Runs that diverged are left out of their method's numbers "
               "(diverged: all of them did).\n\n");
}

/* Table 3: fraction of the training time in quantization/de-quantization and in the agent. */
static void s_time_table(FILE *f, const mq_rep_set_t *set)
{
    static const char *const cols[] = {"quantization + de-quantization", "agent", "total"};
    char b0[S_CELL], b1[S_CELL], b2[S_CELL];
    fprintf(f, "## Fraction of training time in quantization and in the agent (%%)\n\n");
    s_header(f, "method", cols, 3, 3);
    for (size_t k = 0; k < set->n_methods; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        double q[m->n_runs], a[m->n_runs], t[m->n_runs];
        size_t n = 0;
        for (size_t r = 0; r < m->n_runs; r++)
            if (mq_rep_fractions(m->runs[r], &q[n], &a[n])) {
                t[n] = q[n] + a[n];
                n++;
            }
        fprintf(f, "| %s | %s | %s | %s |\n", m->name, s_stat(b0, q, n, m->n_runs, 1, 2),
                s_stat(b1, a, n, m->n_runs, 1, 2), s_stat(b2, t, n, m->n_runs, 1, 2));
    }
    fprintf(f, "\nΣ(encode_ms + decode_ms) and Σ agent_ms over all iterations, divided by the "
               "training time (train_time_s of the last iteration); mean ± std over seeds.\n\n");
}

/* Times to TARGET of the seeds that reach it (into V, N of them) and their mean; false if no
 * seed does. */
static bool s_time_to(const mq_rep_method_t *m, double target, double *v, size_t *n, double *mean)
{
    double std;
    *n = 0;
    for (size_t r = 0; r < m->n_runs; r++)
        if (!m->runs[r]->diverged)
            *n += mq_rep_time_to(m->runs[r], target, &v[*n]);
    mq_rep_mean_std(v, *n, mean, &std);
    return *n > 0;
}

static const char *s_ratio(char *buf, bool ok, double t, bool ref_ok, double ref)
{
    if (!ok)
        return "not reached";
    if (!ref_ok || !(ref > 0))
        return "—";
    snprintf(buf, S_CELL, "%.2f", t / ref);
    return buf;
}

/* The reference rows of the time-to-target table: fp32 (*NONE) and the fastest fixed:K
 * (*BEST) among those with no diverged run (a mean that hides failed runs is no reference);
 * NM where there is none. OK and MEAN are each method's time to TARGET. */
static void s_target_refs(const mq_rep_set_t *set, const bool *ok, const double *mean,
                          size_t *none, size_t *best, const char **why)
{
    size_t nm = set->n_methods, n_fixed = 0, n_unsafe = 0;
    *none = *best = nm;
    for (size_t k = 0; k < nm; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        if (strcmp(m->policy, "none") == 0)
            *none = k;
        if (strncmp(m->policy, "fixed:", 6) != 0)
            continue;
        n_fixed++;
        n_unsafe += m->n_diverged > 0;
        if (ok[k] && m->n_diverged == 0 && (*best == nm || mean[k] < mean[*best]))
            *best = k;
    }
    *why = *best < nm  ? set->methods[*best].name
           : n_unsafe  ? "none reached it without a diverged run"
           : n_fixed   ? "none reached"
                       : "no fixed:K runs";
}

static void s_target_table(FILE *f, const mq_rep_set_t *set, double target)
{
    size_t nm = set->n_methods, best, none, n;
    const char *best_name;
    double mean[nm], v[set->n_runs];
    bool ok[nm];
    for (size_t k = 0; k < nm; k++)
        ok[k] = s_time_to(&set->methods[k], target, v, &n, &mean[k]);
    s_target_refs(set, ok, mean, &none, &best, &best_name);
    char c0[S_CELL], c1[S_CELL], c2[S_NAME], b[S_CELL];
    snprintf(c1, sizeof c1, "÷ none (fp32)%s", none == nm ? ": no runs" : "");
    snprintf(c2, sizeof c2, "÷ best fixed (%s)", best_name);
    const char *cols[] = {"time (s)", c1, c2};
    bool none_ok = none < nm && ok[none];
    fprintf(f, "## Time to reach %g%% test accuracy\n\n", 100 * target);
    s_header(f, "method", cols, 3, 3);
    for (size_t k = 0; k < nm; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        char name[S_NAME];
        s_time_to(m, target, v, &n, &mean[k]);
        fprintf(f, "| %s | ", s_name(name, m));
        if (s_live(m) == 0) {
            fprintf(f, "%s | — | — |\n", s_all_diverged(c0, m));
            continue;
        }
        fprintf(f, "%s | ", ok[k] ? s_stat(c0, v, n, s_live(m), 1, 2) : "not reached");
        fprintf(f, "%s | ", s_ratio(b, ok[k], mean[k], none_ok, none_ok ? mean[none] : 0));
        fprintf(f, "%s |\n", s_ratio(b, ok[k], mean[k], best < nm, best < nm ? mean[best] : 0));
    }
    fprintf(f, "\nTraining time of the first evaluation at or above the target, mean over the "
               "seeds that reach it ((k/n): only k of n seeds do); runs that diverged are left "
               "out, and a fixed:K method with a diverged run is never the best fixed one. "
               "Ratios are of these means, below 1 is faster.\n\n");
}

static void s_final_table(FILE *f, const mq_rep_set_t *set)
{
    static const char *const cols[] = {"seeds", "final loss", "final test accuracy (%)",
                                       "total bytes (up + down)", "iterations",
                                       "model zeros (%)"};
    char b0[S_CELL], b1[S_CELL], b2[S_CELL], b3[S_CELL], b4[S_CELL];
    fprintf(f, "## Final results\n\n");
    s_header(f, "method", cols, 6, 6);
    for (size_t k = 0; k < set->n_methods; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        double loss[m->n_runs], acc[m->n_runs], bytes[m->n_runs], iters[m->n_runs],
            zeros[m->n_runs];
        size_t nl = 0, na = 0, nz = 0;
        for (size_t r = 0; r < m->n_runs; r++) {
            const mq_rep_run_t *run = m->runs[r];
            if (isfinite(run->final_loss) && !run->diverged)
                loss[nl++] = run->final_loss;
            if (!isnan(run->final_acc) && !run->diverged)
                acc[na++] = run->final_acc;
            if (!isnan(run->final_sparsity) && !run->diverged)
                zeros[nz++] = run->final_sparsity;
            bytes[r] = run->total_bytes;
            iters[r] = (double)run->iterations;
        }
        char name[S_NAME];
        bool live = s_live(m) > 0;
        fprintf(f, "| %s | %zu | %s | %s | %s | %s | %s |\n", s_name(name, m), m->n_runs,
                live ? s_stat(b0, loss, nl, s_live(m), 1, 4) : "—",
                live ? s_stat(b1, acc, na, s_live(m), 100, 2) : s_all_diverged(b1, m),
                s_stat(b2, bytes, m->n_runs, m->n_runs, 1, 0),
                s_stat(b3, iters, m->n_runs, m->n_runs, 1, 0),
                nz ? s_stat(b4, zeros, nz, nz, 100, 2) : "—");
    }
    fprintf(f, "\nFrom each run's summary.json (its last metrics rows where the summary lacks a "
               "value); mean ± std over seeds. Loss and accuracy leave out the runs that "
               "diverged (the Runs table gives each one's iteration and rule); bytes and "
               "iterations count them. Model zeros: the parameters exactly zero at the last "
               "evaluation (the sparse model the l1 rules aim at; — for runs that did not "
               "record it).\n\n");
}

/* The final accuracies (%) of M's runs that did not diverge, into V; their number. */
static size_t s_final_accs(const mq_rep_method_t *m, double *v)
{
    size_t n = 0;
    for (size_t r = 0; r < m->n_runs; r++)
        if (!m->runs[r]->diverged && !isnan(m->runs[r]->final_acc))
            v[n++] = 100 * m->runs[r]->final_acc;
    return n;
}

/* Final accuracy against the best fixed width in hindsight (the fixed:K with the highest
 * mean and no diverged run): the difference of means and Welch's test, so that a reader sees
 * which differences the seeds can tell apart. */
static void s_versus_table(FILE *f, const mq_rep_set_t *set)
{
    size_t nm = set->n_methods, best = nm;
    double best_mean = -INFINITY, bv[set->n_runs + 1], v[set->n_runs + 1], mean, std;
    for (size_t k = 0; k < nm; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        size_t n = s_final_accs(m, v);
        if (strncmp(m->policy, "fixed:", 6) != 0 || m->n_diverged > 0 || n == 0)
            continue;
        mq_rep_mean_std(v, n, &mean, &std);
        if (mean > best_mean)
            best_mean = mean, best = k;
    }
    if (best == nm)
        return;
    size_t nb = s_final_accs(&set->methods[best], bv);
    static const char *const cols[] = {"Δ final accuracy (points)", "t", "df", "p"};
    fprintf(f, "## Against the best fixed width: %s\n\n", set->methods[best].name);
    s_header(f, "method", cols, 4, 4);
    for (size_t k = 0; k < nm; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        size_t n = s_final_accs(m, v);
        if (k == best || n == 0)
            continue;
        double t, df, p = mq_rep_welch(v, n, bv, nb, &t, &df);
        mq_rep_mean_std(v, n, &mean, &std);
        char name[S_NAME];
        fprintf(f, "| %s | %+.2f |", s_name(name, m), mean - best_mean);
        if (isnan(p))
            fprintf(f, " — | — | — |\n");
        else if (isnan(t))
            fprintf(f, " — | — | %s |\n", p > 0.5 ? "1 (no spread)" : "0 (no spread)");
        else
            fprintf(f, " %.2f | %.1f | %.3f%s |\n", t, df, p, p < 0.05 ? " *" : "");
    }
    fprintf(f, "\nThe best fixed width in hindsight is the fixed:K with the highest mean final "
               "accuracy and no diverged run. Δ: mean final accuracy minus its; t, df, p: "
               "Welch's two-sided t-test over the seeds (runs that diverged left out), * where "
               "p < 0.05. With three seeds only large differences are told apart, and no "
               "correction is made for comparing many methods.\n\n");
}

/* ---- the headline: each method against the best fixed setting, paired by seed ----------- */

/* The median number of iterations between evaluations over the runs at LINK (0: none). */
static double s_eval_spacing(const mq_rep_set_t *set, double link)
{
    size_t cap = 0, n = 0;
    for (size_t i = 0; i < set->n_runs; i++)
        cap += set->runs[i].n_rows;
    double *gaps = malloc((cap + 1) * sizeof *gaps), spacing = 0;
    if (!gaps)
        return 0;
    for (size_t i = 0; i < set->n_runs; i++) {
        const mq_rep_run_t *run = &set->runs[i];
        if (!mq_rep_same_link(run->link_mbps, link))
            continue;
        uint64_t last = 0;
        bool seen = false;
        for (size_t j = 0; j < run->n_rows; j++)
            if (run->rows[j].evaluated) {
                if (seen)
                    gaps[n++] = (double)(run->rows[j].iter - last);
                last = run->rows[j].iter, seen = true;
            }
    }
    if (n)
        spacing = mq_rep_median(gaps, n);
    free(gaps);
    return spacing;
}

/* "0.82 [0.75, 0.90]" from N seeds' MEAN and interval LO..HI, "—" without any. */
static const char *s_interval(char *buf, size_t n, double mean, double lo, double hi,
                              const char *fmt)
{
    if (n == 0)
        return "—";
    char a[32], b[32], c[32];
    snprintf(a, sizeof a, fmt, mean);
    snprintf(b, sizeof b, fmt, lo);
    snprintf(c, sizeof c, fmt, hi);
    snprintf(buf, S_CELL, n > 1 ? "%s [%s, %s]" : "%s (one seed)", a, b, c);
    return buf;
}

/* One comparison's table. */
static void s_headline_rows(FILE *f, const mq_rep_set_t *set, const mq_rep_cmp_t *c)
{
    static const char *const cols[] = {"seeds paired", "time to target ÷ best fixed [95 % CI]",
                                       "final accuracy (%)", "Δ accuracy (points) [95 % CI]",
                                       "left out"};
    s_header(f, "method", cols, 5, 4);
    for (size_t i = 0; i < c->n_vs; i++) {
        const mq_rep_vs_t *v = &c->vs[i];
        const mq_rep_method_t *m = &set->methods[v->method];
        bool best = v->method == c->best;
        char name[S_NAME], c0[S_CELL], c1[S_CELL], c2[S_CELL], why[S_CELL] = "";
        size_t w = 0;
        if (v->diverged)
            w += (size_t)snprintf(why + w, sizeof why - w, "%zu diverged", v->diverged);
        if (v->late)
            w += (size_t)snprintf(why + w, sizeof why - w, "%s%zu never at the target",
                                  w ? ", " : "", v->late);
        if (v->runs - v->diverged > v->paired)
            snprintf(why + w, sizeof why - w, "%s%zu without a paired seed", w ? ", " : "",
                     v->runs - v->diverged - v->paired);
        snprintf(c1, sizeof c1, v->n_acc ? "%.2f" : "—", v->acc);
        fprintf(f, "| %s%s%s | %zu of %zu | %s | %s | %s | %s |\n", best ? "**" : "",
                s_name(name, m), best ? "**" : "", v->paired, v->runs,
                s_interval(c0, v->n_ratio, v->ratio, v->ratio_lo, v->ratio_hi, "%.2f"), c1,
                s_interval(c2, v->n_dacc, v->dacc, v->dacc_lo, v->dacc_hi, "%+.2f"),
                why[0] ? why : "—");
    }
    fputc('\n', f);
}

/* The table the comparison stands on: per condition (link) and codec setting with its update
 * rule, each method's time to the target over the best fixed setting's, seed by seed, and its
 * final accuracy as the mean of its last K evaluations, with 95 % intervals over seeds. */
static void s_headline(FILE *f, const mq_rep_set_t *set, const mq_rep_md_opts_t *o)
{
    double links[set->n_runs + 1];
    size_t nl = mq_rep_links(set, links), nc = o->n_cmp;
    const mq_rep_cmp_t *cmp = o->cmp;
    fprintf(f, "## Against the best fixed setting, paired by seed\n\n");
    if (o->plots_drawn && o->headline_drawn)
        fprintf(f, "![time to %g %% against the best fixed setting](headline.png)\n\n",
                100 * o->target_acc);
    for (size_t i = 0; i < nc; i++) {
        const mq_rep_cmp_t *c = &cmp[i];
        char lname[600];
        mq_rep_link_name(set, c->link, lname, sizeof lname);
        if (nl > 1 || c->n_settings > 1)
            fprintf(f, "### %s%s%s\n\n", nl > 1 ? lname : "",
                    nl > 1 && c->n_settings > 1 ? " — " : "",
                    c->n_settings > 1 ? c->setting : "");
        if (!c->has_best)
            fprintf(f, "_No reference: %s._\n\n",
                    c->n_fixed ? "no fixed setting reached the target in every seed without "
                                 "diverging"
                               : "no fixed:K runs here");
        else {
            fprintf(f, "%s%s%sBest fixed setting in hindsight: **%s** (time to %g %%: %.1f s, "
                       "geometric mean over its seeds).\n\n",
                    nl == 1 ? "Condition: " : "", nl == 1 ? lname : "", nl == 1 ? ". " : "",
                    set->methods[c->best].name, 100 * o->target_acc, c->best_t);
            s_headline_rows(f, set, c);
        }
        double spacing;
        if ((i + 1 == nc || !mq_rep_same_link(cmp[i + 1].link, c->link)) &&
            (spacing = s_eval_spacing(set, c->link)) > 5)
            fprintf(f, "_Evaluations every %g iterations (median): a time to target is read "
                       "at the first evaluation past it, so ratios closer than that spacing "
                       "are not told apart; `--eval-every 5` or less resolves them._\n\n",
                    spacing);
    }
    fprintf(f,
            "One table per condition (link) and codec setting with its update rule: methods "
            "with another update rule or codec setting are never in one table (fp32 joins the "
            "tables of its update rule). Best fixed in hindsight: of that table's fixed:K "
            "methods whose every seed reached %g %% without diverging, the one with the lowest "
            "geometric mean time to it. Time ratio: the geometric mean over seeds of this "
            "method's time to the target divided by the best fixed setting's with the same "
            "seed (below 1 is faster). Final accuracy: each run's mean over its last %zu "
            "evaluations, averaged over seeds; Δ: that endpoint minus the same seed's of the "
            "best fixed setting. Intervals: 95 %% percentile bootstrap over seeds (%d "
            "resamples, fixed seed). Left out: seeds that diverged, never reached the target "
            "(no ratio), or have no run of the best fixed setting to pair with.\n\n",
            100 * o->target_acc, o->last_k, MQ_REP_BOOT);
}

/* Mean per-iteration worker times: shows the regime (wait vs compute). */
static void s_iter_table(FILE *f, const mq_rep_set_t *set)
{
    static const char *const cols[] = {"compute", "encode", "wait", "decode", "update", "agent"};
    fprintf(f, "## Mean time per iteration (ms)\n\n");
    s_header(f, "method", cols, 6, 6);
    for (size_t k = 0; k < set->n_methods; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        double sum[6] = {0};
        for (size_t r = 0; r < m->n_runs; r++) {
            const mq_rep_run_t *run = m->runs[r];
            for (size_t i = 0; i < run->n_rows; i++) {
                const mq_rep_row_t *w = &run->rows[i];
                double ms[6] = {w->compute_ms, w->encode_ms, w->wait_ms,
                                w->decode_ms,  w->update_ms, w->agent_ms};
                for (int c = 0; c < 6; c++)
                    sum[c] += ms[c] / (double)run->n_rows / (double)m->n_runs;
            }
        }
        fprintf(f, "| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", m->name, sum[0], sum[1],
                sum[2], sum[3], sum[4], sum[5]);
    }
    fprintf(f, "\nWorker means per iteration, averaged over iterations and seeds; agent is the "
               "time the scheduler waited for the agent.\n\n");
}

/* What a method's name means: its codec, and how diverged runs are counted. */
static void s_intro(FILE *f, const mq_rep_set_t *set)
{
    size_t diverged = 0, exact = 0;
    for (size_t i = 0; i < set->n_runs; i++) {
        diverged += set->runs[i].diverged;
        exact += mq_rep_paper_exact(&set->runs[i].codec);
    }
    if (set->common_codec[0])
        fprintf(f,
                "Codec: a method named by its policy alone used the setting most runs share "
                "(%s); a setting in parentheses is where the method's runs differ from it.",
                set->common_codec);
    if (exact)
        fprintf(f, "%s\"paper-exact codec\" is the paper's: one range per tensor slice, nearest "
                   "rounding, no error feedback.",
                set->common_codec[0] ? " " : "Codec: ");
    if (exact || set->common_codec[0])
        fprintf(f, "\n\n");
    if (diverged)
        fprintf(f,
                "%zu of the %zu runs diverged: each is listed below with the iteration and the "
                "rule that stopped it, and counts in no accuracy, time to target or final loss; "
                "its method's name says how many of its runs diverged.\n\n",
                diverged, set->n_runs);
}

void mq_rep_markdown(FILE *f, const mq_rep_set_t *set, const mq_rep_md_opts_t *o)
{
    fprintf(f, "# %s\n\n", o->title);
    fprintf(f,
            "%zu runs of %zu methods, written by `mqgrad report`. Numbers are computed from "
            "the runs' metrics.csv and summary.json; ± is the sample standard deviation over "
            "seeds.\n\n",
            set->n_runs, set->n_methods);
    s_intro(f, set);
    s_headline(f, set, o);
    s_runs(f, set);
    s_plots(f, set, o->plots_drawn);
    s_acc_table(f, set, o);
    s_time_table(f, set);
    s_target_table(f, set, o->target_acc);
    s_final_table(f, set);
    s_versus_table(f, set);
    s_iter_table(f, set);
}
