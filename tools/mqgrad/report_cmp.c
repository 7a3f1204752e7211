/* The comparison against the best fixed setting of `mqgrad report`: per condition (a link
 * speed or schedule) and codec setting with its update rule, each method's time to the target
 * over the best fixed setting's, paired by seed, and its endpoint, with bootstrap intervals
 * over seeds. report.md's headline tables and headline.png both draw from it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/util.h"
#include "report.h"

/* ---- conditions ------------------------------------------------------------------- */

bool mq_rep_same_link(double a, double b)
{
    return (isnan(a) && isnan(b)) || a == b;
}

static int s_cmp_link(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    if (isnan(x) || isnan(y))
        return isnan(x) - isnan(y); /* not recorded: last */
    if (x < 0 && y < 0) /* schedules first, in the order they were numbered */
        return x > y ? -1 : x < y;
    return x < y ? -1 : x > y;
}

size_t mq_rep_links(const mq_rep_set_t *set, double *links)
{
    size_t n = 0;
    for (size_t i = 0; i < set->n_runs; i++) {
        size_t k = 0;
        while (k < n && !mq_rep_same_link(links[k], set->runs[i].link_mbps))
            k++;
        if (k == n)
            links[n++] = set->runs[i].link_mbps;
    }
    qsort(links, n, sizeof *links, s_cmp_link);
    return n;
}

void mq_rep_link_name(const mq_rep_set_t *set, double mbps, char *buf, size_t len)
{
    const char *spec = NULL;
    for (size_t i = 0; mbps < 0 && i < set->n_runs && !spec; i++)
        if (set->runs[i].link_mbps == mbps)
            spec = set->runs[i].link;
    if (isnan(mbps))
        snprintf(buf, len, "link speed not recorded");
    else if (mbps < 0)
        snprintf(buf, len, "link %s", spec && spec[0] ? spec : "schedule (--link)");
    else if (mbps == 0)
        snprintf(buf, len, "no link emulation");
    else
        snprintf(buf, len, "%g Mbit/s", mbps);
}

/* ---- comparisons ------------------------------------------------------------------ */

/* M's run at LINK with SEED, or NULL. */
static const mq_rep_run_t *s_run_of(const mq_rep_method_t *m, double link, uint64_t seed)
{
    for (size_t r = 0; r < m->n_runs; r++)
        if (m->runs[r]->seed == seed && mq_rep_same_link(m->runs[r]->link_mbps, link))
            return m->runs[r];
    return NULL;
}

/* The geometric mean time to TARGET of M's runs at LINK, if every one of them reached it
 * without diverging (else false: no reference). */
static bool s_all_reach(const mq_rep_method_t *m, double link, double target, double *geo)
{
    double sum = 0;
    size_t n = 0;
    for (size_t r = 0; r < m->n_runs; r++) {
        const mq_rep_run_t *run = m->runs[r];
        double t;
        if (!mq_rep_same_link(run->link_mbps, link))
            continue;
        if (run->diverged || !mq_rep_time_to(run, target, &t) || !(t > 0))
            return false;
        sum += log(t);
        n++;
    }
    *geo = n ? exp(sum / (double)n) : NAN;
    return n > 0;
}

/* M's first run at LINK, or NULL. */
static const mq_rep_run_t *s_first_at(const mq_rep_method_t *m, double link)
{
    for (size_t r = 0; r < m->n_runs; r++)
        if (mq_rep_same_link(m->runs[r]->link_mbps, link))
            return m->runs[r];
    return NULL;
}

/* The comparisons at LINK: one per codec setting and update rule among the quantized methods
 * (a controller chooses among the fixed widths of its own setting), fp32 joining those of its
 * update rule; runs of unknown settings (config.json from before them) make one of their
 * own. Their representatives into REPS, their number. */
static size_t s_settings(const mq_rep_set_t *set, double link, const mq_rep_codec_t **reps)
{
    size_t n = 0;
    bool unknown = false;
    for (size_t k = 0; k < set->n_methods; k++) {
        const mq_rep_run_t *run = s_first_at(&set->methods[k], link);
        if (!run || strcmp(run->policy, "none") == 0)
            continue;
        if (!run->codec.known) {
            unknown = true;
            continue;
        }
        size_t i = 0;
        while (i < n && !(reps[i] && mq_rep_same_setting(reps[i], &run->codec)))
            i++;
        if (i == n)
            reps[n++] = &run->codec;
    }
    if (unknown || n == 0)
        reps[n++] = NULL; /* the methods whose setting is not known, and fp32 alone */
    return n;
}

/* Whether method M takes part in the comparison of setting REP (NULL: unknown) at LINK. */
static bool s_in_setting(const mq_rep_method_t *m, double link, const mq_rep_codec_t *rep)
{
    const mq_rep_run_t *run = s_first_at(m, link);
    if (!run)
        return false;
    if (strcmp(run->policy, "none") == 0) /* fp32: with the comparisons of its update rule */
        return !rep || strcmp(run->codec.optimizer[0] ? run->codec.optimizer : "sgd",
                              rep->optimizer) == 0;
    return rep ? run->codec.known && mq_rep_same_setting(rep, &run->codec) : !run->codec.known;
}

/* The mean of the N values V and its 95 % bootstrap interval (of the geometric mean when
 * GEO: V are logs). */
static void s_interval(const double *v, size_t n, bool geo, double *mean, double *lo,
                       double *hi)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m += v[i] / (double)n;
    mq_rep_bootstrap_mean(v, n, MQ_REP_BOOT, 1, lo, hi);
    *mean = n ? m : NAN;
    if (geo)
        *mean = exp(*mean), *lo = exp(*lo), *hi = exp(*hi);
}

/* Method M (index K) at LINK against the best fixed setting B, seed by seed. */
static void s_versus(const mq_rep_method_t *m, size_t k, const mq_rep_method_t *b, double link,
                     double target, size_t last_k, mq_rep_vs_t *vs)
{
    double lr[m->n_runs + 1], d[m->n_runs + 1], acc[m->n_runs + 1];
    size_t nr = 0, nd = 0, na = 0;
    *vs = (mq_rep_vs_t){.method = k};
    for (size_t r = 0; r < m->n_runs; r++) {
        const mq_rep_run_t *run = m->runs[r], *ref;
        if (!mq_rep_same_link(run->link_mbps, link))
            continue;
        vs->runs++;
        if (run->diverged) {
            vs->diverged++;
            continue;
        }
        double ea, eb, ta, tb;
        if (mq_rep_endpoint(run, last_k, &ea))
            acc[na++] = 100 * ea;
        if (!(ref = s_run_of(b, link, run->seed)))
            continue;
        vs->paired++;
        if (mq_rep_time_to(run, target, &ta) && mq_rep_time_to(ref, target, &tb) && ta > 0 &&
            tb > 0)
            lr[nr++] = log(ta / tb);
        else
            vs->late++;
        if (mq_rep_endpoint(ref, last_k, &eb) && !isnan(ea))
            d[nd++] = 100 * (ea - eb);
    }
    double std;
    vs->n_ratio = nr, vs->n_acc = na, vs->n_dacc = nd;
    s_interval(lr, nr, true, &vs->ratio, &vs->ratio_lo, &vs->ratio_hi);
    mq_rep_mean_std(acc, na, &vs->acc, &std);
    s_interval(d, nd, false, &vs->dacc, &vs->dacc_lo, &vs->dacc_hi);
}

/* Comparison C (its link and setting REP set): the best fixed setting and every method. */
static int s_compare_one(const mq_rep_set_t *set, const mq_rep_codec_t *rep, double target,
                         size_t last_k, mq_rep_cmp_t *c)
{
    size_t nm = set->n_methods;
    bool in[nm + 1];
    double best_t = INFINITY, t;
    c->best = nm;
    for (size_t k = 0; k < nm; k++) {
        const mq_rep_method_t *m = &set->methods[k];
        in[k] = s_in_setting(m, c->link, rep);
        if (!in[k] || strncmp(m->policy, "fixed:", 6) != 0)
            continue;
        c->n_fixed++;
        if (s_all_reach(m, c->link, target, &t) && t < best_t)
            c->best = k, best_t = t;
    }
    c->has_best = c->best < nm;
    c->best_t = c->has_best ? best_t : NAN;
    if (!c->has_best)
        return 0;
    c->vs = calloc(nm + 1, sizeof *c->vs);
    if (!c->vs) {
        mq_err_set("out of memory");
        return -1;
    }
    for (size_t k = 0; k < nm; k++) {
        if (!in[k])
            continue;
        s_versus(&set->methods[k], k, &set->methods[c->best], c->link, target, last_k,
                 &c->vs[c->n_vs]);
        if (c->vs[c->n_vs].runs > 0)
            c->n_vs++;
    }
    return 0;
}

int mq_rep_compare(const mq_rep_set_t *set, double target, size_t last_k, mq_rep_cmp_t **out,
                   size_t *n_out)
{
    double *links = calloc(set->n_runs + 1, sizeof *links);
    const mq_rep_codec_t **reps = calloc(set->n_methods + 1, sizeof *reps);
    size_t nl = links ? mq_rep_links(set, links) : 0, n = 0;
    /* at most one comparison per link and method, plus the unknown settings' */
    mq_rep_cmp_t *c = calloc(nl * (set->n_methods + 1) + 1, sizeof *c);
    int rc = -1;
    if (!links || !reps || !c) {
        mq_err_set("out of memory");
        goto done;
    }
    for (size_t l = 0; l < nl; l++) {
        size_t ns = s_settings(set, links[l], reps);
        for (size_t g = 0; g < ns; g++, n++) {
            c[n] = (mq_rep_cmp_t){.link = links[l], .n_settings = ns};
            if (reps[g])
                mq_rep_setting_name(reps[g], c[n].setting, sizeof c[n].setting);
            else
                snprintf(c[n].setting, sizeof c[n].setting, "codec settings not recorded");
            if (s_compare_one(set, reps[g], target, last_k, &c[n]) != 0) {
                n++;
                goto done;
            }
        }
    }
    rc = 0;
done:
    free(links);
    free(reps);
    if (rc != 0) {
        mq_rep_compare_free(c, n);
        c = NULL, n = 0;
    }
    *out = c;
    *n_out = n;
    return rc;
}

void mq_rep_compare_free(mq_rep_cmp_t *c, size_t n)
{
    for (size_t i = 0; c && i < n; i++)
        free(c[i].vs);
    free(c);
}
