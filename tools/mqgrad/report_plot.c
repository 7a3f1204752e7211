/* The plots of `mqgrad report`: each method's curve over its seeds (report_stats.c: median
 * line, 25..75 % band, markers where the method has few points), one panel per link speed,
 * written as data files plus one gnuplot script per plot, then drawn by gnuplot into PNGs.
 * Without gnuplot the data and scripts remain. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mqgrad/quant.h"
#include "mqgrad/util.h"
#include "report.h"

#define S_N_PLOTS MQ_REP_N_PLOTS
#define S_PANEL_W 640 /* pixels of one panel */
#define S_PANEL_H 460
#define S_TITLE_H 40 /* the plot's title above the panels */
#define S_KEY_LINE 21 /* one key entry */

typedef struct {
    const char *name;
    mq_rep_metric_t metric;
    const char *ylabel;
    double yscale;
    const char *extra; /* more gnuplot settings */
    const char *xlabel, *caption;
} s_plot_t;

#define S_TIME "training time (s)"
static const s_plot_t s_plots[S_N_PLOTS] = {
    {"loss", MQ_REP_LOSS, "smoothed training loss", 1, "", S_TIME, "loss vs training time"},
    {"accuracy", MQ_REP_ACC, "test accuracy (%)", 100, "", S_TIME,
     "test accuracy vs training time"},
    {"bits", MQ_REP_BITS, "gradient bits (32 = fp32)", 1,
     "set logscale y 2\nset yrange [0.9:40]\nset ytics (1, 2, 4, 8, 16, 32)\n", S_TIME,
     "bits vs training time"},
    {"bytes", MQ_REP_BYTES, "cumulative bytes sent and received, all workers (MB)", 1e-6, "",
     S_TIME, "bytes vs training time"},
    {"accuracy_iter", MQ_REP_ACC_ITER, "test accuracy (%)", 100, "", "iteration",
     "test accuracy vs iteration"},
};

/* Whether M's runs have a bit-width to draw: fp32 (32) and codecs that take a level do; a
 * codec without one (top-k, DGC, sign, ...) has a column of no meaning. */
static bool s_has_bits(const mq_rep_method_t *m)
{
    const mq_rep_run_t *run = m->n_runs ? m->runs[0] : NULL;
    mq_codec_t c;
    if (!run || strcmp(run->policy, "none") == 0 || !run->codec.known || !run->codec.spec[0] ||
        mq_codec_parse(run->codec.spec, &c) != 0)
        return true;
    const mq_codec_ops_t *ops = mq_codec_ops(&c);
    return !ops || ops->max_bits > 0;
}

const char *mq_rep_plot_name(int i)
{
    return s_plots[i].name;
}

const char *mq_rep_plot_caption(int i)
{
    return s_plots[i].caption;
}

bool mq_rep_plot_has_data(const mq_rep_set_t *set, int i)
{
    if (s_plots[i].metric == MQ_REP_BITS) {
        for (size_t k = 0; k < set->n_methods; k++)
            if (s_has_bits(&set->methods[k]))
                return true;
        return false;
    }
    if (s_plots[i].metric != MQ_REP_ACC && s_plots[i].metric != MQ_REP_ACC_ITER)
        return set->n_runs > 0;
    for (size_t k = 0; k < set->n_methods; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        for (size_t r = 0; r < m->n_runs; r++) {
            const mq_rep_run_t *run = m->runs[r];
            if (run->diverged && m->n_diverged < m->n_runs)
                continue; /* not drawn (mq_rep_curve) */
            for (size_t j = 0; j < run->n_rows; j++)
                if (run->rows[j].evaluated)
                    return true;
        }
    }
    return false;
}

/* ---- link speeds: one panel each ------------------------------------------------------ */

/* Closes F, written as PATH: -1 with an error if any write or the close failed. */
static int s_close(FILE *f, const char *path)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        mq_err_set("%s: write failed", path);
        return -1;
    }
    return 0;
}

/* ---- data files --------------------------------------------------------------------- */

/* File-name form of a method name: "fixed:4" -> "fixed-4". */
static void s_slug(const char *name, char *buf, size_t len)
{
    size_t n = 0;
    for (; *name && n + 1 < len; name++)
        buf[n++] = (isalnum((unsigned char)*name) || *name == '.') ? *name : '-';
    buf[n] = '\0';
}

/* "data/accuracy_fixed-4.dat", or "data/accuracy_fixed-4_80mbit.dat" when the plot has a
 * panel per link speed. */
static void s_dat_name(const s_plot_t *p, const mq_rep_method_t *m, double link, bool panels,
                       char *buf, size_t len)
{
    char slug[128], suffix[48] = "";
    s_slug(m->name, slug, sizeof slug);
    if (panels && isnan(link))
        snprintf(suffix, sizeof suffix, "_link-unknown");
    else if (panels && link < 0)
        snprintf(suffix, sizeof suffix, "_link-schedule-%g", -link);
    else if (panels && link == 0)
        snprintf(suffix, sizeof suffix, "_no-link");
    else if (panels)
        snprintf(suffix, sizeof suffix, "_%gmbit", link);
    snprintf(buf, len, "data/%s_%s%s.dat", p->name, slug, suffix);
}

/* What a panel's script needs to know of a method's data file. */
typedef struct {
    size_t n_runs; /* the method's runs at this link speed (0: no data file) */
    bool band;     /* block 0 has a band somewhere (two seeds overlap) */
    bool line;     /* block 0 has a median somewhere */
    bool marks;    /* block 1, the method's points, is there and drawn: few points per seed */
    bool joined;   /* the seeds never overlap: block 1 is the line */
} s_drawn_t;

static bool s_drawn(const s_drawn_t *d)
{
    return d->band || d->line || d->marks;
}

/* One plot's panels: the link speeds, and what each method has at each (D[link * n_methods +
 * method]). */
typedef struct {
    const mq_rep_set_t *set;
    const s_plot_t *p;
    const double *links;
    size_t n_links;
    s_drawn_t *d;
} s_fig_t;

static void s_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, " %.9g", v);
    else
        fputs(" NaN", f); /* gnuplot leaves a gap there */
}

static void s_dat_body(FILE *f, const mq_rep_curve_t *c, const s_plot_t *p)
{
    if (c->disjoint)
        fprintf(f, "# No time where all %zu seeds have a value: the line joins the points of "
                   "block 1.\n", c->seeds);
    else if (c->seeds)
        fprintf(f, "# The line: where all %zu seeds have a value, %.9g .. %.9g s.\n", c->seeds,
                c->from, c->to);
    fprintf(f, "# %s median q25 q75 seeds (NaN: not drawn; the band needs 2 seeds)\n",
            p->metric == MQ_REP_ACC_ITER ? "iteration" : "time_s");
    for (size_t i = 0; i < c->n_rows; i++) {
        const mq_rep_cpoint_t *r = &c->rows[i];
        fprintf(f, "%.9g", r->t);
        s_num(f, r->median * p->yscale);
        s_num(f, r->q25 * p->yscale);
        s_num(f, r->q75 * p->yscale);
        fprintf(f, " %zu\n", r->seeds);
    }
    if (c->n_marks == 0)
        return;
    fprintf(f, "\n\n# block 1: the method's points, the k-th of every seed at their median "
               "time: time_s value\n");
    for (size_t i = 0; i < c->n_marks; i++) {
        fprintf(f, "%.9g", c->mark_t[i]);
        s_num(f, c->mark_v[i] * p->yscale);
        fputc('\n', f);
    }
}

/* Writes OUT/NAME, the curve of RUNS (method M's runs at one link speed) for plot P. */
static int s_write_dat(const mq_rep_method_t *m, mq_rep_run_t *const *runs, size_t n_runs,
                       const s_plot_t *p, double t_end, const char *link, const char *out,
                       const char *name, s_drawn_t *d)
{
    char path[4096];
    mq_rep_curve_t c;
    snprintf(path, sizeof path, "%s/%s", out, name);
    if (mq_rep_curve(runs, n_runs, p->metric, t_end, &c) < 0) {
        mq_rep_curve_free(&c);
        return -1;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        mq_err_set("%s: cannot write: %s", path, strerror(errno));
        mq_rep_curve_free(&c);
        return -1;
    }
    fprintf(f, "# %s of method %s at %s: %zu seed%s", p->name, m->name, link, c.seeds,
            c.seeds == 1 ? "" : "s");
    if (c.left_out)
        fprintf(f, " (%zu more diverged: left out)", c.left_out);
    fprintf(f, "; median over seeds, band 25..75 %% of seeds\n");
    s_dat_body(f, &c, p);
    *d = (s_drawn_t){.n_runs = n_runs,
                     .marks = c.n_marks > 0 && (c.sparse || c.disjoint),
                     .joined = c.disjoint && c.n_marks > 0};
    for (size_t i = 0; i < c.n_rows; i++) {
        d->line |= isfinite(c.rows[i].median);
        d->band |= isfinite(c.rows[i].q25);
    }
    mq_rep_curve_free(&c);
    if (s_close(f, path) != 0)
        return -1;
    return 0;
}

/* ---- the script --------------------------------------------------------------------- */

/* One line type per method, the same in every plot and panel: ten colours, then the same
 * colours dashed, then dash-dotted, so that 30 methods stay apart; a point type each for the
 * methods drawn with their points. */
static const char *const s_colours[] = {"#000000", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                        "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
static const char *const s_dashes[] = {"solid", "(14,6)", "(12,5,3,5)"};
static const int s_points[] = {7, 5, 9, 11, 13, 15, 6, 4, 8, 10};
#define S_N_COLOURS (sizeof s_colours / sizeof *s_colours)

static void s_linetypes(FILE *f, size_t n)
{
    for (size_t k = 0; k < n; k++)
        fprintf(f, "set linetype %zu lc rgb '%s' lw 2 dt %s pt %d ps 1.3\n", k + 1,
                s_colours[k % S_N_COLOURS], s_dashes[k / S_N_COLOURS % 3],
                s_points[(k + k / S_N_COLOURS) % S_N_COLOURS]);
}

/* TEXT as a gnuplot single-quoted string body (a quote is doubled). */
static void s_gp_quote(FILE *f, const char *text)
{
    for (; *text; text++) {
        if (*text == '\'')
            fputs("''", f);
        else
            fputc(iscntrl((unsigned char)*text) ? ' ' : *text, f);
    }
}

/* Method K's key entry: its name, its seeds (in each panel, if they differ), and how many
 * diverged (left out of its curves when others did not; drawn, and so marked, when all
 * did). Its length in characters. */
static size_t s_legend(FILE *f, const s_fig_t *g, size_t k)
{
    const mq_rep_method_t *m = &g->set->methods[k];
    char text[512];
    size_t first = 0, n = 0, nm = g->set->n_methods;
    bool same = true;
    for (size_t l = 0; l < g->n_links; l++) {
        size_t c = g->d[l * nm + k].n_runs;
        first = first ? first : c;
        same &= c == 0 || c == first;
    }
    n += (size_t)snprintf(text, sizeof text, "%s (", m->name);
    for (size_t l = 0; l < g->n_links && !same; l++)
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%zu", l ? " / " : "",
                              g->d[l * nm + k].n_runs);
    if (same)
        n += (size_t)snprintf(text + n, sizeof text - n, "%zu", first);
    n += (size_t)snprintf(text + n, sizeof text - n, " seed%s", same && first == 1 ? "" : "s");
    if (m->n_diverged == m->n_runs)
        snprintf(text + n, sizeof text - n, ", %zu diverged)", m->n_diverged);
    else if (m->n_diverged)
        snprintf(text + n, sizeof text - n, ", %zu diverged, not drawn)", m->n_diverged);
    else
        snprintf(text + n, sizeof text - n, ")");
    if (f)
        s_gp_quote(f, text);
    return strlen(text);
}

/* The plot elements of method K in one panel: band, line, points. */
static void s_panel_method(FILE *f, const char *name, size_t k, const s_drawn_t *d,
                           const char **sep)
{
    const char *next = ", \\\n     ";
    if (d->band) {
        fprintf(f, "%s'%s' index 0 using 1:3:4 with filledcurves lc %zu notitle", *sep, name,
                k + 1);
        *sep = next;
    }
    if (d->line) {
        fprintf(f, "%s'%s' index 0 using 1:2 with lines lt %zu notitle", *sep, name, k + 1);
        *sep = next;
    }
    if (d->marks) {
        fprintf(f, "%s'%s' index 1 using 1:2 with %s lt %zu notitle", *sep, name,
                d->joined ? "linespoints" : "points", k + 1);
        *sep = next;
    }
}

/* The key, beside the panels so that it never covers data: what the line and the band are,
 * then every method once, with its points if some panel draws them, or "no data" if none
 * draws it at all (a method never evaluated has no accuracy). */
static void s_key(FILE *f, const s_fig_t *g, double x0)
{
    size_t nm = g->set->n_methods;
    fprintf(f, "\n# The key, beside the panels.\n"
               "set origin %.4f, 0\nset size %.4f, 1\nset lmargin 0\nset tmargin 4\n"
               "unset title\nunset xlabel\nunset ylabel\nunset grid\nunset border\nunset tics\n"
               "unset logscale\nset xrange [0:1]\nset yrange [0:1]\n"
               "set key inside left top Left reverse samplen 4 spacing 1.2 width 2\n",
            x0, 1 - x0);
    fputs("plot 2 with lines lw 2 lc rgb '#606060' title 'line: median over seeds', \\\n"
          "     2 with filledcurves y1=3 fc rgb '#606060' title "
          "'band: 25..75 % of seeds (where 2 or more)'",
          f);
    for (size_t k = 0; k < nm; k++) {
        bool runs = false, drawn = false, points = false;
        for (size_t l = 0; l < g->n_links; l++) {
            const s_drawn_t *d = &g->d[l * nm + k];
            runs |= d->n_runs > 0;
            drawn |= s_drawn(d);
            points |= d->marks;
        }
        if (!runs)
            continue;
        fprintf(f, ", \\\n     2 with %s lt %zu title '", points ? "linespoints" : "lines",
                k + 1);
        s_legend(f, g, k);
        fputs(drawn ? "'" : ": no data'", f);
    }
    fputs("\n", f);
}

/* The figure's size in pixels: panels two abreast, the key to their right (as wide as its
 * longest entry, as tall as its entries). */
static void s_layout(const s_fig_t *g, size_t n_panels, int *cols, int *w, int *h)
{
    size_t longest = 42; /* the band's entry */
    for (size_t k = 0; k < g->set->n_methods; k++) {
        size_t len = s_legend(NULL, g, k) + 9; /* ": no data" */
        longest = len > longest ? len : longest;
    }
    *cols = n_panels > 1 ? 2 : 1;
    int rows = (int)(n_panels + (size_t)*cols - 1) / *cols;
    int key_w = (int)fmin(fmax(90 + 7.0 * (double)longest, 320), 760);
    *w = *cols * S_PANEL_W + key_w;
    *h = (int)fmax(rows * S_PANEL_H, S_KEY_LINE * (double)(g->set->n_methods + 6)) + S_TITLE_H;
}

static void s_gp_header(FILE *f, const s_plot_t *p, const char *title, int w, int h, size_t nm)
{
    fprintf(f,
            "# Written by mqgrad report: %s, one panel per link speed, one line "
            "per\n# method: the median over its seeds where all of them have a value (so it "
            "never jumps\n# where a seed starts or stops); the band: 25..75 %% of the seeds, "
            "where at least 2 have\n# a value; markers on methods with at most %d points per "
            "seed. The numbers are in\n# data/. Run it in this directory: gnuplot %s.gp\n",
            p->caption, MQ_REP_FEW_POINTS, p->name);
    fprintf(f,
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
            "    set terminal pngcairo size %d,%d noenhanced font ',10'\n"
            "} else {\n    set terminal png truecolor size %d,%d noenhanced\n}\n",
            w, h, w, h);
    fprintf(f, "set output '%s.png'\n", p->name);
    s_linetypes(f, nm);
    /* Lighter bands when there are many to overlap. */
    fprintf(f, "set style fill transparent solid %.2f noborder\nset multiplot title '",
            nm > 6 ? 0.12 : 0.2);
    s_gp_quote(f, title);
    fprintf(f, ": %s'\nunset key\nset grid\nset xlabel '%s'\nset ylabel '%s'\n"
               "set xrange [0:*]\n%s",
            p->caption, p->xlabel, p->ylabel, p->extra);
}

/* Whether link L of G has anything to draw: it gets a panel. */
static bool s_panel(const s_fig_t *g, size_t l)
{
    for (size_t k = 0; k < g->set->n_methods; k++)
        if (s_drawn(&g->d[l * g->set->n_methods + k]))
            return true;
    return false;
}

static int s_write_gp(const s_fig_t *g, const char *out, const char *title)
{
    const mq_rep_set_t *set = g->set;
    size_t nm = set->n_methods, n_panels = 0;
    char path[4096], name[512], link[600];
    for (size_t l = 0; l < g->n_links; l++)
        n_panels += s_panel(g, l);
    int cols, w, h, i = 0;
    s_layout(g, n_panels, &cols, &w, &h);
    snprintf(path, sizeof path, "%s/%s.gp", out, g->p->name);
    FILE *f = fopen(path, "w");
    if (!f) {
        mq_err_set("%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    s_gp_header(f, g->p, title, w, h, nm);
    for (size_t l = 0; l < g->n_links; l++) {
        if (!s_panel(g, l))
            continue;
        int r = i / cols, c = i % cols;
        i++;
        mq_rep_link_name(set, g->links[l], link, sizeof link);
        fprintf(f, "\nset origin %.4f, %.4f\nset size %.4f, %.4f\nset title '",
                (double)(c * S_PANEL_W) / w, (double)(h - S_TITLE_H - (r + 1) * S_PANEL_H) / h,
                (double)S_PANEL_W / w, (double)S_PANEL_H / h);
        s_gp_quote(f, link); /* a schedule comes from a run's config.json */
        fputs("'\n", f);
        const char *sep = "plot ";
        for (size_t k = 0; k < nm; k++) {
            if (!s_drawn(&g->d[l * nm + k]))
                continue;
            s_dat_name(g->p, &set->methods[k], g->links[l], g->n_links > 1, name, sizeof name);
            s_panel_method(f, name, k, &g->d[l * nm + k], &sep);
        }
        fputs("\n", f);
    }
    s_key(f, g, (double)(cols * S_PANEL_W) / w);
    fputs("unset multiplot\n", f);
    if (s_close(f, path) != 0)
        return -1;
    return 0;
}

/* The gnuplot program, or NULL if it cannot be found. */
static const char *s_find_gnuplot(char *buf, size_t len)
{
    const char *prog = mq_env_str("MQGRAD_GNUPLOT", "gnuplot");
    if (strchr(prog, '/'))
        return access(prog, X_OK) == 0 ? prog : NULL;
    const char *path = mq_env_str("PATH", "/usr/bin:/bin");
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(buf, len, "%.*s/%s", (int)n, path, prog);
        if (n && access(buf, X_OK) == 0)
            return buf;
        path += n + (path[n] == ':');
    }
    return NULL;
}

static int s_run_gnuplot(const char *prog, const char *out, const char *script)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        mq_err_set("fork: %s", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        if (chdir(out) == 0)
            execl(prog, prog, script, (char *)NULL);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            mq_err_set("waitpid: %s", strerror(errno));
            return -1;
        }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        mq_err_set("%s %s (in %s) failed with status %d", prog, script, out,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    return 0;
}

/* Contract: see report.h. */
int mq_rep_gnuplot(const char *dir, const char *script)
{
    char buf[4096];
    const char *prog = s_find_gnuplot(buf, sizeof buf);
    return prog ? s_run_gnuplot(prog, dir, script) : 1;
}

/* The runs of method M at link speed LINK, into RUNS; their number. */
static size_t s_runs_at(const mq_rep_method_t *m, double link, mq_rep_run_t **runs)
{
    size_t n = 0;
    for (size_t r = 0; r < m->n_runs; r++)
        if (mq_rep_same_link(m->runs[r]->link_mbps, link))
            runs[n++] = m->runs[r];
    return n;
}

/* The end of a panel's x axis for plot P: the longest run at LINK, in time or iterations. */
static double s_panel_end(const mq_rep_set_t *set, const s_plot_t *p, double link)
{
    double end = 0;
    for (size_t i = 0; i < set->n_runs; i++) {
        const mq_rep_run_t *run = &set->runs[i];
        if (!mq_rep_same_link(run->link_mbps, link))
            continue;
        end = fmax(end, p->metric != MQ_REP_ACC_ITER ? mq_rep_run_time(run)
                        : run->n_rows                 ? (double)run->rows[run->n_rows - 1].iter
                                                      : 0);
    }
    return end;
}


/* The data files of figure G, into OUT/data; false in *ANY if no method has a value. */
static int s_write_data(s_fig_t *g, const char *out, mq_rep_run_t **runs, bool *any)
{
    const mq_rep_set_t *set = g->set;
    char name[512], link[600];
    *any = false;
    for (size_t l = 0; l < g->n_links; l++) {
        double t_end = s_panel_end(set, g->p, g->links[l]);
        mq_rep_link_name(set, g->links[l], link, sizeof link);
        for (size_t k = 0; k < set->n_methods; k++) {
            const mq_rep_method_t *m = &set->methods[k];
            size_t n = s_runs_at(m, g->links[l], runs);
            s_drawn_t *d = &g->d[l * set->n_methods + k];
            if (n == 0 || (g->p->metric == MQ_REP_BITS && !s_has_bits(m)))
                continue;
            s_dat_name(g->p, m, g->links[l], g->n_links > 1, name, sizeof name);
            if (s_write_dat(m, runs, n, g->p, t_end, link, out, name, d) < 0)
                return -1;
            *any |= s_drawn(d);
        }
    }
    return 0;
}

/* Data files and script of plot P; draws it when PROG is set. */
static int s_one_plot(const mq_rep_set_t *set, const s_plot_t *p, const double *links,
                      size_t n_links, const char *out, const char *title, const char *prog)
{
    char script[64];
    s_fig_t g = {.set = set, .p = p, .links = links, .n_links = n_links};
    g.d = calloc(n_links * set->n_methods + 1, sizeof *g.d);
    mq_rep_run_t **runs = calloc(set->n_runs + 1, sizeof *runs);
    bool any = false;
    int rc = -1;
    if (!g.d || !runs)
        mq_err_set("out of memory");
    else if (s_write_data(&g, out, runs, &any) == 0)
        rc = any ? s_write_gp(&g, out, title) : 0; /* e.g. no evaluation in any run */
    free(g.d);
    free(runs);
    if (rc < 0 || !any || !prog)
        return rc;
    snprintf(script, sizeof script, "%s.gp", p->name);
    return s_run_gnuplot(prog, out, script);
}

/* ---- the headline figure ------------------------------------------------------------ */

#define S_HL_W 960
#define S_HL_ROW 30   /* pixels per method */
#define S_HL_PANEL 90 /* a panel's title, axis and labels */

/* Comparison C's x range: every interval and 1, with room on both sides (log scale). */
static void s_hl_range(const mq_rep_cmp_t *c, double *lo, double *hi)
{
    *lo = *hi = 1;
    for (size_t i = 0; i < c->n_vs; i++) {
        const mq_rep_vs_t *v = &c->vs[i];
        if (!v->n_ratio)
            continue;
        *lo = fmin(*lo, v->ratio_lo);
        /* room for the note beside the point (s_hl_panel) */
        *hi = fmax(*hi, v->ratio_hi * (v->diverged || v->late || v->n_ratio == 1 ? 1.9 : 1));
    }
    *lo /= 1.25;
    *hi *= 1.25;
}

/* Comparison C's panel, at the figure's height fraction Y0..Y0+H. */
static void s_hl_panel(FILE *f, const mq_rep_set_t *set, const mq_rep_cmp_t *c, double target,
                       double y0, double h)
{
    char link[600], why[128];
    double lo, hi;
    s_hl_range(c, &lo, &hi);
    mq_rep_link_name(set, c->link, link, sizeof link);
    fprintf(f, "\nset origin 0, %.4f\nset size 1, %.4f\nunset label\nset title '", y0, h);
    s_gp_quote(f, link);
    if (c->n_settings > 1) {
        fputs(" — ", f);
        s_gp_quote(f, c->setting);
    }
    fputs(" — best fixed: ", f);
    s_gp_quote(f, set->methods[c->best].name);
    fprintf(f, ", %.1f s to %g %%'\nset xrange [%g:%g]\nset yrange [%zu.5:-0.5]\nset ytics (",
            c->best_t, 100 * target, lo, hi, c->n_vs - 1);
    for (size_t i = 0; i < c->n_vs; i++) {
        fprintf(f, "%s'", i ? ", " : "");
        s_gp_quote(f, set->methods[c->vs[i].method].name);
        fprintf(f, "' %zu", i);
    }
    fputs(")\n", f);
    /* what a row's point leaves out, beside it (or where it would be, without one) */
    for (size_t i = 0; i < c->n_vs; i++) {
        const mq_rep_vs_t *v = &c->vs[i];
        size_t w = 0;
        why[0] = '\0';
        if (v->diverged)
            w += (size_t)snprintf(why + w, sizeof why - w, "diverged in %zu of %zu seeds",
                                  v->diverged, v->runs);
        if (v->late && w < sizeof why)
            w += (size_t)snprintf(why + w, sizeof why - w, "%snever at %g %% in %zu",
                                  w ? ", " : "", 100 * target, v->late);
        if (v->n_ratio == 1 && w < sizeof why)
            w += (size_t)snprintf(why + w, sizeof why - w, "%sone seed", w ? "; " : "");
        if (!v->n_ratio && !w)
            snprintf(why, sizeof why, "no seed paired with the best's");
        if (why[0])
            fprintf(f, "set label '%s' at first %g, first %zu left tc rgb '#606060'\n", why,
                    v->n_ratio ? v->ratio_hi * 1.04 : lo * 1.05, i);
    }
    fputs("plot 1/0 notitle", f); /* a panel without any ratio still draws its axes */
    bool any = false;
    for (size_t i = 0; i < c->n_vs; i++)
        any |= c->vs[i].n_ratio > 0;
    if (any)
        fputs(", '-' using 1:2:3:4:5 with xerrorbars lc variable pt 7 ps 1.4 notitle", f);
    fputc('\n', f);
    for (size_t i = 0; any && i < c->n_vs; i++) {
        const mq_rep_vs_t *v = &c->vs[i];
        if (v->n_ratio)
            fprintf(f, "%.6g %zu %.6g %.6g %zu\n", v->ratio, i, v->ratio_lo, v->ratio_hi,
                    v->method + 1);
    }
    if (any)
        fputs("e\n", f);
}

/* OUT/headline.gp: one panel per comparison with a best fixed setting (*ANY: at least one),
 * a row per method: its time ratio's geometric mean over seeds with the 95 % interval. */
static int s_headline_plot(const mq_rep_set_t *set, const char *out, const char *title,
                           const mq_rep_cmp_t *cmp, size_t nc, double target, bool *any)
{
    size_t rows = 0, panels = 0, longest = 20;
    *any = false;
    for (size_t i = 0; i < nc; i++)
        if (cmp[i].has_best) {
            rows += cmp[i].n_vs, panels++;
            for (size_t k = 0; k < cmp[i].n_vs; k++) {
                size_t len = strlen(set->methods[cmp[i].vs[k].method].name);
                longest = len > longest ? len : longest;
            }
        }
    if (panels == 0)
        return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/headline.gp", out);
    FILE *f = fopen(path, "w");
    if (!f) {
        mq_err_set("%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    int h = S_TITLE_H + (int)(panels * S_HL_PANEL + rows * S_HL_ROW);
    int w = S_HL_W + 7 * (int)longest; /* the methods' names at the left, whole */
    fprintf(f,
            "# Written by mqgrad report: per condition and codec setting, each method's time to "
            "%g %%\n# divided by the best fixed setting's with the same seed: the geometric "
            "mean over seeds\n# and its 95 %% bootstrap interval (report.md's table). Run it in "
            "this directory:\n# gnuplot headline.gp\n",
            100 * target);
    fprintf(f,
            "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
            "    set terminal pngcairo size %d,%d noenhanced font ',10'\n"
            "} else {\n    set terminal png truecolor size %d,%d noenhanced\n}\n"
            "set output 'headline.png'\n",
            w, h, w, h);
    s_linetypes(f, set->n_methods);
    fputs("set multiplot title '", f);
    s_gp_quote(f, title);
    fprintf(f, ": time to %g %%, against the best fixed setting'\nunset key\nset grid xtics\n"
               "set logscale x 2\nset lmargin %zu\nset rmargin 4\n"
               "set xtics (0.25, 0.33, 0.5, 0.67, 0.8, 1, 1.25, 1.5, 2, 3, 4, 6, 8, 16)\n"
               "set arrow 1 from 1, graph 0 to 1, graph 1 nohead lc rgb '#606060' dt 2\n"
               "set xlabel 'time to %g %% ÷ the best fixed setting''s, same seed (below 1: "
               "faster; 95 %% interval over seeds)'\n",
            100 * target, longest + 3, 100 * target);
    double y = 1 - (double)S_TITLE_H / h;
    for (size_t i = 0; i < nc; i++) {
        if (!cmp[i].has_best)
            continue;
        double ph = (double)(S_HL_PANEL + cmp[i].n_vs * S_HL_ROW) / h;
        y -= ph;
        s_hl_panel(f, set, &cmp[i], target, y, ph);
    }
    fputs("unset multiplot\n", f);
    if (s_close(f, path) != 0)
        return -1;
    *any = true;
    return 0;
}

int mq_rep_plots(const mq_rep_set_t *set, const char *out, const char *title,
                 const mq_rep_cmp_t *cmp, size_t n_cmp, double target, mq_rep_plots_t *state,
                 bool *headline)
{
    char data[4096], buf[4096];
    snprintf(data, sizeof data, "%s/data", out);
    if (mq_mkdirs(data) < 0)
        return -1;
    const char *prog = s_find_gnuplot(buf, sizeof buf);
    *state = prog ? MQ_REP_PLOTS_DRAWN : MQ_REP_PLOTS_NO_GNUPLOT;
    if (!prog)
        fprintf(stderr,
                "mqgrad report: warning: gnuplot not found ('%s'; set MQGRAD_GNUPLOT to its "
                "path): no PNGs drawn; the data and the gnuplot scripts are in %s (draw them "
                "with: cd %s && for f in *.gp; do gnuplot $f; done)\n",
                mq_env_str("MQGRAD_GNUPLOT", "gnuplot"), out, out);
    double *links = calloc(set->n_runs + 1, sizeof *links);
    if (!links) {
        mq_err_set("out of memory");
        return -1;
    }
    size_t n_links = mq_rep_links(set, links);
    int rc = 0;
    for (int i = 0; i < S_N_PLOTS && rc == 0; i++)
        rc = s_one_plot(set, &s_plots[i], links, n_links, out, title, prog);
    free(links);
    if (rc == 0)
        rc = s_headline_plot(set, out, title, cmp, n_cmp, target, headline);
    if (rc == 0 && *headline && prog)
        rc = s_run_gnuplot(prog, out, "headline.gp");
    return rc;
}
