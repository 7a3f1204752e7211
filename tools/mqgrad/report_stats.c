/* Statistics of `mqgrad report`: grouping runs into methods, per-run quantities (accuracy at a
 * time, time to a target accuracy, time fractions), mean and spread over seeds, the
 * interpolation of a run's series onto a common time grid, and a method's curve over its seeds
 * (median and quartiles) for the plots. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/util.h"
#include "report.h"

/* ---- methods ------------------------------------------------------------------------ */

#define S_DEFAULT_BUCKET 512 /* the cluster's default (services/scheduler, MQ_DEFAULT_BUCKET) */

static bool s_codec_eq(const mq_rep_codec_t *a, const mq_rep_codec_t *b)
{
    return strcmp(a->kind, b->kind) == 0 && a->bucket == b->bucket &&
           a->stochastic == b->stochastic && a->error_feedback == b->error_feedback &&
           strcmp(a->optimizer, b->optimizer) == 0 &&
           (strcmp(a->kind, "uniform") == 0 || strcmp(a->spec, b->spec) == 0);
}

bool mq_rep_paper_exact(const mq_rep_codec_t *c)
{
    return c->known && strcmp(c->kind, "uniform") == 0 && c->bucket == 0 && !c->stochastic &&
           !c->error_feedback;
}

/* How many runs of SET that take part in the vote for the common setting have codec C. */
static size_t s_votes(const mq_rep_set_t *set, const mq_rep_codec_t *c)
{
    size_t n = 0;
    for (size_t i = 0; i < set->n_runs; i++) {
        const mq_rep_codec_t *r = &set->runs[i].codec;
        n += r->known && !mq_rep_paper_exact(r) && s_codec_eq(r, c);
    }
    return n;
}

/* The codec most runs share, the paper-exact ones aside; a tie goes to the cluster's default,
 * then to the earliest run. False if no run votes. */
static bool s_common(const mq_rep_set_t *set, mq_rep_codec_t *common)
{
    *common = (mq_rep_codec_t){
        .known = true, .kind = "uniform", .optimizer = "sgd", .bucket = S_DEFAULT_BUCKET};
    size_t best = s_votes(set, common);
    for (size_t i = 0; i < set->n_runs; i++) {
        const mq_rep_codec_t *c = &set->runs[i].codec;
        size_t n = c->known && !mq_rep_paper_exact(c) ? s_votes(set, c) : 0;
        if (n > best) {
            best = n;
            *common = *c;
        }
    }
    return best > 0;
}

/* Appends ", PART" (or PART first) to BUF, clipped to LEN. */
static void s_part(char *buf, size_t len, const char *part)
{
    size_t at = strlen(buf);
    snprintf(buf + at, len - at, "%s%s", at ? ", " : "", part);
}

/* The settings of C that differ from REF (all of them if REF is NULL), e.g. "bucket 128,
 * stochastic". */
static void s_describe(const mq_rep_codec_t *c, const mq_rep_codec_t *ref, char *buf, size_t len)
{
    char part[128];
    buf[0] = '\0';
    bool uniform = strcmp(c->kind, "uniform") == 0;
    if (!ref || strcmp(c->kind, ref->kind) != 0 || (!uniform && strcmp(c->spec, ref->spec))) {
        snprintf(part, sizeof part, "codec %s", uniform || !c->spec[0] ? c->kind : c->spec);
        s_part(buf, len, part);
    }
    if (ref && strcmp(c->optimizer, ref->optimizer) != 0) {
        snprintf(part, sizeof part, "%s", c->optimizer);
        s_part(buf, len, part);
    }
    if (!uniform) {
        if (ref && c->error_feedback != ref->error_feedback)
            s_part(buf, len, c->error_feedback ? "error feedback" : "no error feedback");
        return;
    }
    if (!ref || c->bucket != ref->bucket) {
        if (c->bucket)
            snprintf(part, sizeof part, "bucket %ld", c->bucket);
        s_part(buf, len, c->bucket ? part : "one range per tensor");
    }
    if (!ref || c->stochastic != ref->stochastic)
        s_part(buf, len, c->stochastic ? "stochastic" : "nearest rounding");
    if (!ref || c->error_feedback != ref->error_feedback)
        s_part(buf, len, c->error_feedback ? "error feedback" : "no error feedback");
}

bool mq_rep_same_setting(const mq_rep_codec_t *a, const mq_rep_codec_t *b)
{
    return s_codec_eq(a, b);
}

void mq_rep_setting_name(const mq_rep_codec_t *c, char *buf, size_t len)
{
    s_describe(c, NULL, buf, len);
    s_part(buf, len, c->optimizer[0] ? c->optimizer : "sgd");
}

/* The rule for a run's method, so that the same policy with other codec settings is never
 * merged: fp32 runs and runs whose codec is unknown (older config.json) keep the plain policy;
 * the paper-exact codec is always named ("mqgrad (paper-exact codec)"), whatever the other
 * runs did; a run with the common setting keeps the plain policy; any other run names how its
 * setting differs from the common one ("fixed:2 (bucket 128, stochastic)"). */
static void s_name_methods(mq_rep_set_t *set)
{
    mq_rep_codec_t common;
    char diff[96];
    bool any = s_common(set, &common);
    set->common_codec[0] = '\0';
    if (any)
        s_describe(&common, NULL, set->common_codec, sizeof set->common_codec);
    for (size_t i = 0; i < set->n_runs; i++) {
        mq_rep_run_t *run = &set->runs[i];
        const mq_rep_codec_t *c = &run->codec;
        diff[0] = '\0';
        if (mq_rep_paper_exact(c))
            snprintf(diff, sizeof diff, "paper-exact codec");
        else if (c->known && !(any && s_codec_eq(c, &common)) &&
                 !(c->spec[0] && strncmp(run->policy, c->spec, strlen(c->spec)) == 0))
            s_describe(c, &common, diff, sizeof diff); /* a codec-named run says it all */
        if (diff[0])
            snprintf(run->method, sizeof run->method, "%.63s (%.60s)", run->policy, diff);
        else
            snprintf(run->method, sizeof run->method, "%.63s", run->policy);
    }
}

/* Display order: fp32 first, fixed bit-widths by width, other methods by name, mqgrad last
 * (the order of the paper's tables); a codec variant ("fixed:2 (paper-exact codec)") sits
 * right after its policy. */
static int s_rank(const char *policy, long *k)
{
    *k = 0;
    if (strcmp(policy, "none") == 0)
        return 0;
    if (strncmp(policy, "fixed:", 6) == 0) {
        *k = strtol(policy + 6, NULL, 10);
        return 1;
    }
    return strcmp(policy, "mqgrad") == 0 || strncmp(policy, "mqgrad:", 7) == 0 ? 3 : 2;
}

static int s_cmp_methods(const void *a, const void *b)
{
    const mq_rep_method_t *x = a, *y = b;
    long kx, ky;
    int rx = s_rank(x->policy, &kx), ry = s_rank(y->policy, &ky);
    if (rx != ry)
        return rx - ry;
    if (kx != ky)
        return kx < ky ? -1 : 1;
    int by_policy = strcmp(x->policy, y->policy);
    return by_policy ? by_policy : strcmp(x->name, y->name);
}

static int s_cmp_runs(const void *a, const void *b)
{
    const mq_rep_run_t *x = *(mq_rep_run_t *const *)a, *y = *(mq_rep_run_t *const *)b;
    return x->seed < y->seed ? -1 : x->seed > y->seed;
}

/* Each distinct schedule its own condition: -1, -2, ... in order of first appearance. */
static void s_number_schedules(mq_rep_set_t *set)
{
    int k = 0;
    for (size_t i = 0; i < set->n_runs; i++) {
        mq_rep_run_t *run = &set->runs[i];
        if (!run->link[0])
            continue;
        size_t j = 0;
        while (j < i && strcmp(set->runs[j].link, run->link) != 0)
            j++;
        run->link_mbps = j < i ? set->runs[j].link_mbps : -(double)++k;
    }
}

int mq_rep_group(mq_rep_set_t *set)
{
    s_number_schedules(set);
    s_name_methods(set);
    set->methods = calloc(set->n_runs, sizeof *set->methods);
    if (!set->methods) {
        mq_err_set("out of memory");
        return -1;
    }
    set->n_methods = 0;
    for (size_t i = 0; i < set->n_runs; i++) {
        mq_rep_run_t *run = &set->runs[i];
        mq_rep_method_t *m = NULL;
        for (size_t k = 0; k < set->n_methods && !m; k++)
            if (strcmp(set->methods[k].name, run->method) == 0)
                m = &set->methods[k];
        if (!m) {
            m = &set->methods[set->n_methods++];
            snprintf(m->name, sizeof m->name, "%s", run->method);
            snprintf(m->policy, sizeof m->policy, "%s", run->policy);
            m->runs = calloc(set->n_runs, sizeof *m->runs);
            if (!m->runs) {
                mq_err_set("out of memory");
                return -1;
            }
        }
        m->runs[m->n_runs++] = run;
        m->n_diverged += run->diverged;
    }
    qsort(set->methods, set->n_methods, sizeof *set->methods, s_cmp_methods);
    for (size_t k = 0; k < set->n_methods; k++)
        qsort(set->methods[k].runs, set->methods[k].n_runs, sizeof(mq_rep_run_t *), s_cmp_runs);
    return 0;
}

void mq_rep_set_free(mq_rep_set_t *set)
{
    for (size_t k = 0; k < set->n_methods; k++)
        free(set->methods[k].runs);
    free(set->methods);
    for (size_t i = 0; i < set->n_runs; i++)
        mq_rep_run_free(&set->runs[i]);
    free(set->runs);
    *set = (mq_rep_set_t){0};
}

double mq_rep_run_time(const mq_rep_run_t *run)
{
    return run->n_rows ? run->rows[run->n_rows - 1].t : 0;
}

bool mq_rep_acc_at(const mq_rep_run_t *run, double t, double *acc)
{
    /* A checkpoint typed as "12.5" must catch an evaluation logged at 12.5000000001. */
    double limit = t + 1e-9 * fmax(1.0, fabs(t));
    bool found = false;
    for (size_t i = 0; i < run->n_rows && run->rows[i].t <= limit; i++)
        if (run->rows[i].evaluated) {
            *acc = run->rows[i].acc;
            found = true;
        }
    return found;
}

bool mq_rep_time_to(const mq_rep_run_t *run, double target, double *t)
{
    for (size_t i = 0; i < run->n_rows; i++)
        if (run->rows[i].evaluated && run->rows[i].acc >= target) {
            *t = run->rows[i].t;
            return true;
        }
    return false;
}

bool mq_rep_fractions(const mq_rep_run_t *run, double *quant_pct, double *agent_pct)
{
    double total = mq_rep_run_time(run), quant_ms = 0, agent_ms = 0;
    if (!(total > 0))
        return false;
    for (size_t i = 0; i < run->n_rows; i++) {
        quant_ms += run->rows[i].encode_ms + run->rows[i].decode_ms;
        agent_ms += run->rows[i].agent_ms;
    }
    *quant_pct = 100.0 * quant_ms / 1000.0 / total;
    *agent_pct = 100.0 * agent_ms / 1000.0 / total;
    return true;
}

void mq_rep_mean_std(const double *v, size_t n, double *mean, double *std)
{
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    *mean = n ? sum / (double)n : NAN;
    for (size_t i = 0; i < n; i++)
        sq += (v[i] - *mean) * (v[i] - *mean);
    *std = n > 1 ? sqrt(sq / (double)(n - 1)) : 0;
}

/* One term NUM of a continued fraction, by the modified Lentz method: updates the running
 * D and C (kept away from zero by TINY) and returns the factor the value is multiplied by. */
static double s_lentz(double num, double *d, double *c)
{
    const double tiny = 1e-300;
    *d = 1 + num * *d;
    *c = 1 + num / *c;
    *d = fabs(*d) < tiny ? 1 / tiny : 1 / *d;
    *c = fabs(*c) < tiny ? tiny : *c;
    return *d * *c;
}

/* The regularized incomplete beta function I_x(a, b) by its continued fraction, on the side of
 * x where it converges fast. */
static double s_ibeta(double x, double a, double b)
{
    if (x <= 0)
        return 0;
    if (x >= 1)
        return 1;
    if (x > (a + 1) / (a + b + 2))
        return 1 - s_ibeta(1 - x, b, a);
    double front = exp(a * log(x) + b * log1p(-x) - (lgamma(a) + lgamma(b) - lgamma(a + b))) / a;
    double c = 1, d = 1 - (a + b) * x / (a + 1); /* the first term starts D; C stays 1 */
    d = fabs(d) < 1e-300 ? 1e300 : 1 / d;
    double h = d;
    for (int m = 1; m <= 300; m++) {
        /* the even term m (b - m) x / ((a + 2m - 1)(a + 2m)), then the odd one */
        h *= s_lentz(m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), &d, &c);
        double step = s_lentz(-(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)), &d, &c);
        h *= step;
        if (fabs(step - 1) < 1e-12)
            break;
    }
    return front * h;
}

double mq_rep_welch(const double *a, size_t na, const double *b, size_t nb, double *t, double *df)
{
    double ma, sa, mb, sb;
    *t = *df = NAN;
    if (na < 2 || nb < 2)
        return NAN;
    mq_rep_mean_std(a, na, &ma, &sa);
    mq_rep_mean_std(b, nb, &mb, &sb);
    double va = sa * sa / (double)na, vb = sb * sb / (double)nb;
    if (!(va + vb > 0))
        return ma == mb ? 1 : 0; /* no spread at all: equal, or certainly apart */
    *t = (ma - mb) / sqrt(va + vb);
    *df = (va + vb) * (va + vb) /
          (va * va / (double)(na - 1) + vb * vb / (double)(nb - 1));
    return s_ibeta(*df / (*df + *t * *t), *df / 2, 0.5);
}

/* ---- series ------------------------------------------------------------------------- */

struct mq_rep_series_t {
    double *x, *y;
    size_t n;
    bool step; /* hold the last value (bits) rather than interpolate */
};

mq_rep_series_t *mq_rep_series_new(const mq_rep_run_t *run, mq_rep_metric_t metric)
{
    mq_rep_series_t *s = calloc(1, sizeof *s);
    if (s) {
        s->x = malloc((run->n_rows + 1) * sizeof *s->x);
        s->y = malloc((run->n_rows + 1) * sizeof *s->y);
    }
    if (!s || !s->x || !s->y) {
        mq_rep_series_destroy(&s);
        mq_err_set("out of memory");
        return NULL;
    }
    s->step = metric == MQ_REP_BITS;
    double cum = 0;
    if (metric == MQ_REP_BYTES) { /* nothing is sent before training starts */
        s->x[0] = 0;
        s->y[s->n++] = 0;
    }
    for (size_t i = 0; i < run->n_rows; i++) {
        const mq_rep_row_t *r = &run->rows[i];
        if (metric == MQ_REP_ACC && !r->evaluated)
            continue;
        cum += r->bytes;
        if (metric == MQ_REP_ACC_ITER && !r->evaluated)
            continue;
        s->x[s->n] = metric == MQ_REP_ACC_ITER ? (double)r->iter : r->t;
        s->y[s->n++] = metric == MQ_REP_LOSS   ? r->smoothed
                       : metric == MQ_REP_ACC || metric == MQ_REP_ACC_ITER ? r->acc
                       : metric == MQ_REP_BITS ? r->bits
                                               : cum;
    }
    return s;
}

void mq_rep_series_destroy(mq_rep_series_t **self_p)
{
    if (!*self_p)
        return;
    free((*self_p)->x);
    free((*self_p)->y);
    free(*self_p);
    *self_p = NULL;
}

bool mq_rep_series_at(const mq_rep_series_t *s, double t, double *v)
{
    if (s->n == 0 || t < s->x[0] || t > s->x[s->n - 1])
        return false;
    size_t lo = 0, hi = s->n - 1; /* invariant: x[lo] <= t <= x[hi] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->x[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    if (s->x[hi] <= t) /* t at the last point, or equal times */
        lo = hi;
    double dx = s->x[hi] - s->x[lo];
    if (s->step || lo == hi || dx <= 0)
        *v = s->y[lo];
    else
        *v = s->y[lo] + (s->y[hi] - s->y[lo]) * (t - s->x[lo]) / dx;
    return true;
}

/* ---- curves over seeds -------------------------------------------------------------- */

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double mq_rep_quantile(const double *v, size_t n, double q)
{
    if (n == 0)
        return NAN;
    double h = q * (double)(n - 1);
    size_t lo = (size_t)h;
    if (lo + 1 >= n)
        return v[n - 1];
    return v[lo] + (h - (double)lo) * (v[lo + 1] - v[lo]);
}

size_t mq_rep_endpoint(const mq_rep_run_t *run, size_t k, double *acc)
{
    double sum = 0;
    size_t n = 0;
    for (size_t i = run->n_rows; i-- > 0 && n < k;)
        if (run->rows[i].evaluated && !isnan(run->rows[i].acc)) {
            sum += run->rows[i].acc;
            n++;
        }
    *acc = n ? sum / (double)n : NAN;
    return n;
}

void mq_rep_bootstrap_mean(const double *v, size_t n, size_t b, uint64_t seed, double *lo,
                           double *hi)
{
    *lo = *hi = n ? v[0] : NAN;
    if (n < 2 || b == 0)
        return;
    double *means = malloc(b * sizeof *means);
    if (!means) {
        *lo = *hi = NAN;
        return;
    }
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1; /* xorshift64*: any fixed stream will do */
    for (size_t i = 0; i < b; i++) {
        double sum = 0;
        for (size_t j = 0; j < n; j++) {
            x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
            sum += v[(x * 0x2545f4914f6cdd1dULL >> 11) % n];
        }
        means[i] = sum / (double)n;
    }
    qsort(means, b, sizeof *means, s_cmp_double);
    *lo = mq_rep_quantile(means, b, 0.025);
    *hi = mq_rep_quantile(means, b, 0.975);
    free(means);
}

double mq_rep_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, s_cmp_double);
    return mq_rep_quantile(v, n, 0.5);
}

static int s_cmp_time(const void *a, const void *b)
{
    const mq_rep_cpoint_t *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

void mq_rep_curve_free(mq_rep_curve_t *c)
{
    free(c->rows);
    free(c->mark_t);
    free(c->mark_v);
    *c = (mq_rep_curve_t){0};
}

/* The grid of curve C: MQ_REP_GRID steps over [0, T_END], every seed's first and last time
 * (so that the line and the band start and stop exactly there) and the markers' times (so
 * that the line passes through them), within the seeds' span; sorted, without repeats. */
static int s_grid(mq_rep_series_t *const *s, size_t n, double t_end, mq_rep_curve_t *c)
{
    double lo = INFINITY, hi = -INFINITY;
    for (size_t r = 0; r < n; r++) {
        lo = fmin(lo, s[r]->x[0]);
        hi = fmax(hi, s[r]->x[s[r]->n - 1]);
    }
    if (!(t_end > 0))
        t_end = hi;
    c->rows = calloc(MQ_REP_GRID + 1 + 2 * n + c->n_marks, sizeof *c->rows);
    if (!c->rows)
        return -1;
    size_t k = 0;
    for (int g = 0; g <= MQ_REP_GRID; g++) {
        double t = t_end * g / MQ_REP_GRID;
        if (t >= lo && t <= hi)
            c->rows[k++].t = t;
    }
    for (size_t r = 0; r < n; r++) {
        c->rows[k++].t = s[r]->x[0];
        c->rows[k++].t = s[r]->x[s[r]->n - 1];
    }
    for (size_t i = 0; i < c->n_marks; i++)
        c->rows[k++].t = c->mark_t[i];
    qsort(c->rows, k, sizeof *c->rows, s_cmp_time);
    c->n_rows = 0;
    for (size_t i = 0; i < k; i++)
        if (c->n_rows == 0 || c->rows[i].t > c->rows[c->n_rows - 1].t)
            c->rows[c->n_rows++].t = c->rows[i].t;
    return 0;
}

/* The values of the N seeds at T into V (finite ones only); their number. */
static size_t s_values_at(mq_rep_series_t *const *s, size_t n, double t, double *v)
{
    size_t k = 0;
    for (size_t r = 0; r < n; r++)
        if (mq_rep_series_at(s[r], t, &v[k]) && isfinite(v[k]))
            k++;
    return k;
}

/* C's markers: for each k, the k-th points of the seeds that have one, at the median of their
 * times. Where the seeds overlap the marker sits on the line (its time clamped into the
 * line's range, so the first and last markers mark where the line starts and stops); where
 * they do not, its value is the median of the k-th values, and the markers are the line. */
static int s_marks(mq_rep_series_t *const *s, size_t n, mq_rep_curve_t *c, double *vt,
                   double *vv)
{
    size_t most = 0;
    for (size_t r = 0; r < n; r++)
        most = s[r]->n > most ? s[r]->n : most;
    c->sparse = most <= MQ_REP_FEW_POINTS;
    if (!c->sparse && !c->disjoint)
        return 0;
    c->mark_t = malloc(most * sizeof *c->mark_t);
    c->mark_v = malloc(most * sizeof *c->mark_v);
    if (!c->mark_t || !c->mark_v)
        return -1;
    for (size_t k = 0; k < most; k++) {
        size_t m = 0, mv = 0;
        for (size_t r = 0; r < n; r++)
            if (k < s[r]->n) {
                vt[m++] = s[r]->x[k];
                if (isfinite(s[r]->y[k]))
                    vv[mv++] = s[r]->y[k];
            }
        double t = mq_rep_median(vt, m), v;
        if (c->disjoint) {
            if (mv == 0)
                continue;
            v = mq_rep_median(vv, mv);
        } else {
            t = fmin(fmax(t, c->from), c->to);
            size_t got = s_values_at(s, n, t, vv);
            if (got < n)
                continue;
            v = mq_rep_median(vv, got);
        }
        if (c->n_marks && t <= c->mark_t[c->n_marks - 1])
            continue; /* clamped onto the previous one */
        c->mark_t[c->n_marks] = t;
        c->mark_v[c->n_marks++] = v;
    }
    return 0;
}

/* Fills C's rows and markers from the N series S (each with at least one point). The line is
 * drawn only where all N seeds have a value, from the latest first point to the earliest last
 * one: there the median is over the same seeds at every time, so it never jumps where a seed
 * starts or stops (a mean over whichever seeds remain did, at every run's end). The band
 * shows the rest, wherever at least two seeds overlap. */
static int s_fill(mq_rep_series_t *const *s, size_t n, double t_end, mq_rep_curve_t *c)
{
    double *v = malloc(2 * n * sizeof *v);
    int rc = -1;
    c->from = -INFINITY;
    c->to = INFINITY;
    for (size_t r = 0; r < n; r++) {
        c->from = fmax(c->from, s[r]->x[0]);
        c->to = fmin(c->to, s[r]->x[s[r]->n - 1]);
    }
    c->disjoint = c->from > c->to;
    if (c->disjoint)
        c->from = c->to = NAN;
    if (!v || s_marks(s, n, c, v, v + n) < 0 || s_grid(s, n, t_end, c) < 0)
        goto done;
    for (size_t i = 0; i < c->n_rows; i++) {
        mq_rep_cpoint_t *p = &c->rows[i];
        p->seeds = s_values_at(s, n, p->t, v);
        qsort(v, p->seeds, sizeof *v, s_cmp_double);
        bool line = !c->disjoint && p->seeds == n && p->t >= c->from && p->t <= c->to;
        p->median = line ? mq_rep_quantile(v, n, 0.5) : NAN;
        p->q25 = p->seeds >= 2 ? mq_rep_quantile(v, p->seeds, 0.25) : NAN;
        p->q75 = p->seeds >= 2 ? mq_rep_quantile(v, p->seeds, 0.75) : NAN;
    }
    rc = 0;
done:
    free(v);
    return rc;
}

int mq_rep_curve(mq_rep_run_t *const *runs, size_t n_runs, mq_rep_metric_t metric, double t_end,
                 mq_rep_curve_t *c)
{
    *c = (mq_rep_curve_t){.from = NAN, .to = NAN};
    mq_rep_series_t **s = calloc(n_runs ? n_runs : 1, sizeof *s);
    size_t live = 0, n = 0;
    int rc = -1;
    if (!s)
        goto done;
    for (size_t r = 0; r < n_runs; r++)
        live += !runs[r]->diverged;
    /* A diverged run's curve is not its method's (its loss may be 1e10): it is left out, unless
     * every run diverged, when the curves are all there is. */
    for (size_t r = 0; r < n_runs; r++) {
        if (live && runs[r]->diverged) {
            c->left_out++;
            continue;
        }
        if (!(s[n] = mq_rep_series_new(runs[r], metric)))
            goto done;
        if (s[n]->n > 0) /* a seed never evaluated has no accuracy curve to take part in */
            n++;
        else
            mq_rep_series_destroy(&s[n]);
    }
    c->seeds = n;
    rc = n ? s_fill(s, n, t_end, c) : 0;
done:
    if (rc < 0)
        mq_err_set("out of memory");
    for (size_t r = 0; s && r < n_runs; r++)
        mq_rep_series_destroy(&s[r]);
    free(s);
    return rc;
}
