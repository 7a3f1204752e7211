/* Internals of `mqgrad report`, shared by its files: the runs as loaded from their directories
 * (report_load.c), their grouping into methods and the statistics over seeds (report_stats.c),
 * the plots (report_plot.c) and the Markdown tables (report_md.c). */
#ifndef MQGRAD_REPORT_H
#define MQGRAD_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* One metrics.csv row. The *_ms are the per-iteration worker means, as written by the run. */
typedef struct {
    uint64_t iter;
    double t; /* train_time_s */
    double loss, smoothed;
    int bits;
    double bytes; /* bytes_up + bytes_down of this iteration */
    double compute_ms, encode_ms, wait_ms, decode_ms, update_ms, agent_ms;
    bool evaluated;
    double acc, test_loss;
    uint32_t workers; /* whose pushes the iteration aggregated; 0 in runs from before the column */
} mq_rep_row_t;

/* A run's codec settings, from its config.json. KNOWN is false for fp32 runs and for runs
 * written before config.json had these fields: their method is the plain policy. */
typedef struct {
    bool known;
    char kind[16]; /* the codec's name: "uniform", "qsgd", "topk", ... */
    char spec[96]; /* its whole spec ("topk:ratio=0.01"); "" in runs from before it was kept */
    char optimizer[64]; /* the update rule ("sgd" when not recorded) */
    long bucket;   /* uniform: values per range; 0 = one range per tensor slice */
    bool stochastic, error_feedback;
} mq_rep_codec_t;

/* One run directory. The final values come from summary.json when it has them and from the
 * last metrics rows otherwise (a killed run may leave a summary that lags its metrics). */
typedef struct {
    char *dir;
    char policy[64];
    mq_rep_codec_t codec;
    /* The method the run is grouped under: the policy, plus the codec settings that set it
     * apart from the report's other runs, e.g. "mqgrad (paper-exact codec)" (set by
     * mq_rep_group, report_stats.c, which states the rule). */
    char method[128];
    uint64_t seed;
    double link_mbps; /* the emulated link speed; 0 = no emulation, NaN = not recorded,
                       * -K: the K-th distinct schedule of the report's runs (mq_rep_group) */
    char link[512];   /* config.json's "link", the schedule ("" without one) */
    char status[32];
    bool diverged;     /* status "diverged": never counted as the method's accuracy */
    char div_rule[16]; /* the rule that fired, the iteration and the evidence */
    uint64_t div_iter;
    char div_detail[256];
    uint64_t iterations;
    double final_loss;
    double final_acc; /* NaN if never evaluated, or only before the run diverged */
    double final_sparsity; /* parameters exactly zero at the last evaluation; NaN if unknown */
    double total_bytes;
    mq_rep_row_t *rows;
    size_t n_rows;
} mq_rep_run_t;

typedef struct {
    char name[128];
    char policy[64];
    mq_rep_run_t **runs;
    size_t n_runs;
    size_t n_diverged; /* of runs */
} mq_rep_method_t;

typedef struct {
    mq_rep_run_t *runs;
    size_t n_runs;
    mq_rep_method_t *methods; /* in display order: none, fixed:K by K, others, mqgrad last */
    size_t n_methods;
    /* The codec of the methods named by their policy alone, in words (empty if no run has a
     * known codec), e.g. "one range per 512 values, nearest rounding, no error feedback". */
    char common_codec[128];
} mq_rep_set_t;

/* ---- report_load.c ------------------------------------------------------------------ */
/* Reads DIR/summary.json, DIR/metrics.csv and, when present, DIR/config.json (the codec
 * settings) into RUN; RUN->method is the plain policy until mq_rep_group names it. -1 with
 * a message naming the file and the line on anything missing or malformed. */
int mq_rep_load_run(const char *dir, mq_rep_run_t *run);
void mq_rep_run_free(mq_rep_run_t *run);

/* ---- report_stats.c ----------------------------------------------------------------- */
/* Names each run's method (the policy and its codec settings, against the setting most runs
 * share: SET->common_codec) and groups SET's runs by method into SET->methods; numbers the
 * link schedules (runs under the same one share a condition, -K, K from 1 in order of first
 * appearance). -1 on allocation failure. */
int mq_rep_group(mq_rep_set_t *set);
/* Whether C is the paper's codec: uniform (TensorFlow's MIN_COMBINED), one range per tensor
 * slice, nearest rounding, no error feedback. */
bool mq_rep_paper_exact(const mq_rep_codec_t *c);
void mq_rep_set_free(mq_rep_set_t *set);

/* Training time of a run: train_time_s of its last row. */
double mq_rep_run_time(const mq_rep_run_t *run);
/* Test accuracy of the last evaluation at or before time T; false if there is none. */
bool mq_rep_acc_at(const mq_rep_run_t *run, double t, double *acc);
/* Training time of the first evaluation with test_acc >= TARGET; false if never reached. */
bool mq_rep_time_to(const mq_rep_run_t *run, double target, double *t);
/* Percent of the training time spent in encode + decode and in the agent; false if the run
 * has no training time. */
bool mq_rep_fractions(const mq_rep_run_t *run, double *quant_pct, double *agent_pct);

/* Mean and sample standard deviation (n - 1; 0 when N is 1) of the N finite values in V. */
void mq_rep_mean_std(const double *v, size_t n, double *mean, double *std);
/* Welch's t-test of mean(A) = mean(B) with unequal variances: the two-sided p-value, with the
 * statistic in *T and the Welch-Satterthwaite degrees of freedom in *DF. NaN when either side
 * has fewer than 2 values. */
double mq_rep_welch(const double *a, size_t na, const double *b, size_t nb, double *t, double *df);

/* Value of series METRIC of RUN at time T, interpolated from its rows: false where the run
 * has no value (before its first or after its last point). */
/* MQ_REP_ACC_ITER: test accuracy against the iteration (the other metrics: against time). */
typedef enum {
    MQ_REP_LOSS,
    MQ_REP_ACC,
    MQ_REP_BITS,
    MQ_REP_BYTES,
    MQ_REP_ACC_ITER
} mq_rep_metric_t;
typedef struct mq_rep_series_t mq_rep_series_t;
mq_rep_series_t *mq_rep_series_new(const mq_rep_run_t *run, mq_rep_metric_t metric);
void mq_rep_series_destroy(mq_rep_series_t **self_p);
bool mq_rep_series_at(const mq_rep_series_t *s, double t, double *v);

/* A method's curve over its seeds, for one plot: every seed resampled on a common time grid
 * (linear interpolation, each seed only inside its own first..last point), the median over
 * seeds as the line, the 25..75 % quantiles as the band. */
#define MQ_REP_GRID 200      /* uniform steps over the plot's time range */
#define MQ_REP_FEW_POINTS 10 /* a method with at most this many points per seed gets markers */
typedef struct {
    double t;
    double median;   /* NaN where the line is not drawn */
    double q25, q75; /* NaN where fewer than 2 seeds have a value */
    size_t seeds;    /* seeds with a value at t */
} mq_rep_cpoint_t;

typedef struct {
    mq_rep_cpoint_t *rows; /* by time; none if no seed has a point */
    size_t n_rows;
    /* The method's own points: for each k, the k-th point of its seeds (the same iteration,
     * or the same evaluation) at their median time; on the line when the seeds overlap. */
    double *mark_t, *mark_v;
    size_t n_marks;
    size_t seeds;    /* the seeds drawn: those that did not diverge (all, if every one did) */
    size_t left_out; /* diverged seeds left out because others did not diverge */
    bool sparse;     /* at most MQ_REP_FEW_POINTS points per seed: draw the markers */
    bool disjoint;   /* no time where all seeds have a value: the line joins the markers */
    double from, to; /* where rows have a median; NaN if disjoint */
} mq_rep_curve_t;

/* The curve of METRIC over RUNS (one method's runs at one link speed) on the grid of
 * MQ_REP_GRID steps over [0, T_END], plus every seed's first and last time and the markers'
 * times. -1 on allocation failure. Free with mq_rep_curve_free (also after a failure). */
int mq_rep_curve(mq_rep_run_t *const *runs, size_t n_runs, mq_rep_metric_t metric, double t_end,
                 mq_rep_curve_t *c);
void mq_rep_curve_free(mq_rep_curve_t *c);
/* The Q-quantile (0..1) of the N sorted values in V, interpolated between neighbours
 * (the usual "type 7": the median of 3 is the middle one, of 2 their mean). */
double mq_rep_quantile(const double *v, size_t n, double q);
/* The median of the N values in V (reordered: sorted). */
double mq_rep_median(double *v, size_t n);

/* The mean test accuracy of RUN's last K evaluations (fewer if it has fewer) into *ACC, and
 * how many it took; 0 (and NaN) without any. The endpoint that one evaluation's swing does not
 * decide. */
size_t mq_rep_endpoint(const mq_rep_run_t *run, size_t k, double *acc);
/* A 95 % interval of the mean of the N values in V by the percentile bootstrap: B resamples of
 * the N values drawn with replacement from a generator seeded with SEED (the same numbers give
 * the same interval), into *LO and *HI. N = 1: the value itself. */
void mq_rep_bootstrap_mean(const double *v, size_t n, size_t b, uint64_t seed, double *lo,
                           double *hi);

/* Whether two runs' codec settings are one comparison's (kind, bucket, rounding, error
 * feedback, update rule; a codec other than uniform by its whole spec). */
bool mq_rep_same_setting(const mq_rep_codec_t *a, const mq_rep_codec_t *b);
/* C's settings in words, e.g. "codec uniform, bucket 512, nearest rounding, no error
 * feedback, sgd". */
void mq_rep_setting_name(const mq_rep_codec_t *c, char *buf, size_t len);

/* ---- report_plot.c ------------------------------------------------------------------ */
typedef enum { MQ_REP_PLOTS_DRAWN, MQ_REP_PLOTS_NO_GNUPLOT } mq_rep_plots_t;
typedef struct mq_rep_cmp mq_rep_cmp_t; /* report_cmp.c, below */
/* Writes OUT/data/<plot>_<method>.dat (<plot>_<method>_<link>mbit.dat when the runs span
 * several link speeds: one panel each) and OUT/<plot>.gp for the plots, and the headline
 * figure OUT/headline.gp (each comparison of CMP[0..N_CMP), from mq_rep_compare with TARGET:
 * each method's time to it over the best fixed setting's, with its interval) when some
 * comparison has a best fixed setting (*HEADLINE), and runs gnuplot in OUT (program from
 * MQGRAD_GNUPLOT, default "gnuplot" on PATH). *STATE says whether the PNGs were drawn. -1 if
 * a file cannot be written or gnuplot fails. */
int mq_rep_plots(const mq_rep_set_t *set, const char *out, const char *title,
                 const mq_rep_cmp_t *cmp, size_t n_cmp, double target, mq_rep_plots_t *state,
                 bool *headline);
/* The plots: their number, plot I's file name and what it draws ("test accuracy vs
 * iteration"), and whether it has any data (accuracy needs evaluations). */
#define MQ_REP_N_PLOTS 5
const char *mq_rep_plot_name(int i);
const char *mq_rep_plot_caption(int i);
/* Runs gnuplot (MQGRAD_GNUPLOT, else found on PATH) on SCRIPT inside DIR: 0 drawn, 1 no
 * gnuplot here, -1 with an error when it failed. */
int mq_rep_gnuplot(const char *dir, const char *script);
bool mq_rep_plot_has_data(const mq_rep_set_t *set, int i);

/* ---- report_cmp.c: conditions, and each method against the best fixed setting -------- */

/* The distinct conditions of SET's runs: link schedules first (in the order mq_rep_group
 * numbered them), then link speeds ascending, "not recorded" (NaN) last, into LINKS (room for
 * SET->n_runs); their number. One panel each in every plot. */
size_t mq_rep_links(const mq_rep_set_t *set, double *links);
/* Whether two runs' link speeds are the same panel's (NaN matches NaN). */
bool mq_rep_same_link(double a, double b);
/* A condition in words, a panel's title: "80 Mbit/s", "no link emulation", "link
 * 80@0,10000@10/20" (a schedule of SET's runs). */
void mq_rep_link_name(const mq_rep_set_t *set, double mbps, char *buf, size_t len);

#define MQ_REP_BOOT 10000 /* bootstrap resamples of every interval over seeds */

/* One method in one comparison, seed by seed against the best fixed setting's run. */
typedef struct {
    size_t method;   /* SET->methods[method] */
    size_t runs;     /* its runs in this condition */
    size_t paired;   /* of them, not diverged and with a run of the best's seed */
    size_t diverged, late; /* diverged; paired but one of the two never at the target */
    size_t n_ratio;  /* seeds with a time ratio: time to target / the best's with that seed */
    double ratio, ratio_lo, ratio_hi; /* their geometric mean, 95 % bootstrap interval */
    size_t n_acc;    /* runs with an endpoint: the mean of their last K evaluations */
    double acc;      /* the endpoints' mean, in % */
    size_t n_dacc;   /* seeds with both endpoints */
    double dacc, dacc_lo, dacc_hi; /* the paired difference to the best's, points, interval */
} mq_rep_vs_t;

/* One comparison: a condition (a link speed or schedule) and a codec setting with its update
 * rule. Methods with another rule or setting are never in one comparison; fp32 joins those of
 * its rule. */
struct mq_rep_cmp {
    double link;
    char setting[160];  /* the setting's name, or "codec settings not recorded" */
    size_t n_settings;  /* comparisons at this link: the setting is worth naming when > 1 */
    size_t n_fixed;     /* fixed:K methods in it */
    /* the best fixed setting in hindsight: of the fixed:K methods whose every seed reached the
     * target without diverging, the lowest geometric mean time to it (BEST_T, s) */
    bool has_best;
    size_t best;
    double best_t;
    mq_rep_vs_t *vs;    /* the methods in it, in method order (none without a best) */
    size_t n_vs;
};

/* Every comparison of SET, by link (as mq_rep_links orders them) then setting, into *OUT (free
 * with mq_rep_compare_free), their number in *N. TARGET: the accuracy of the time to target;
 * LAST_K: the endpoint's evaluations. -1 on allocation failure. */
int mq_rep_compare(const mq_rep_set_t *set, double target, size_t last_k, mq_rep_cmp_t **out,
                   size_t *n);
void mq_rep_compare_free(mq_rep_cmp_t *c, size_t n);

/* ---- report_md.c -------------------------------------------------------------------- */
typedef struct {
    const char *title;
    const double *checkpoints;
    size_t n_checkpoints;
    double target_acc;
    size_t last_k; /* the endpoint: the mean of each run's last K evaluations */
    bool plots_drawn;
    bool headline_drawn; /* headline.png: some comparison has a best fixed setting */
    const mq_rep_cmp_t *cmp; /* the comparisons (mq_rep_compare with target_acc, last_k) */
    size_t n_cmp;
} mq_rep_md_opts_t;
/* Writes the whole report.md to F. */
void mq_rep_markdown(FILE *f, const mq_rep_set_t *set, const mq_rep_md_opts_t *o);

#endif
