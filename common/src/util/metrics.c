/* The metrics registry (mqgrad/metrics.h). Families keep their registration order, series
 * theirs, so a scrape reads the same way every time. */
#include "mqgrad/metrics.h"
#include "mqgrad/util.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifndef MQGRAD_VERSION
#define MQGRAD_VERSION "unknown"
#endif

typedef enum { S_COUNTER, S_GAUGE, S_HISTOGRAM } s_kind_t;

typedef struct s_family_t s_family_t;

struct mq_metric_t {
    s_family_t *family;
    char labels[MQ_METRICS_LABELS_MAX];
    double value;                             /* counter, gauge; a histogram's sum */
    double count;                             /* histogram: observations */
    double buckets[MQ_METRICS_MAX_BOUNDS + 1]; /* histogram: per bucket, not cumulative */
};

struct s_family_t {
    mq_metrics_t *registry;
    char name[96];
    char help[200];
    s_kind_t kind;
    double bounds[MQ_METRICS_MAX_BOUNDS];
    size_t nbounds;
    mq_metric_t **series;
    size_t nseries, capseries;
    bool own; /* the registry's (build info, the process's): no caller may write into it */
};

struct mq_metrics_t {
    pthread_mutex_t lock;
    s_family_t **families;
    size_t nfamilies, capfamilies;
    mq_metric_t *cpu, *rss; /* the process's, read as the registry is rendered */
    bool sealed;            /* its own families are made: they are reserved from now on */
};

const double mq_metrics_seconds_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                            0.25,  0.5,    1,     2.5,  5,     10,   30,
                                            60,    120};
const size_t mq_metrics_seconds_nbounds =
    sizeof mq_metrics_seconds_bounds / sizeof mq_metrics_seconds_bounds[0];

/* ---- validation --------------------------------------------------------------------- */

static bool s_name_ok(const char *s)
{
    if (!s || !*s || strlen(s) >= sizeof((s_family_t *)0)->name)
        return false;
    for (const char *p = s; *p; p++) {
        bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == ':';
        if (!alpha && !(p > s && *p >= '0' && *p <= '9'))
            return false;
    }
    return true;
}

/* name="value"(,name="value")*, values escaped; what Prometheus' parser accepts. */
static bool s_labels_ok(const char *s)
{
    if (!s || !*s)
        return true;
    if (strlen(s) >= MQ_METRICS_LABELS_MAX)
        return false;
    const char *p = s;
    for (;;) {
        const char *n = p;
        while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
               (p > n && *p >= '0' && *p <= '9'))
            p++;
        if (p == n || *p++ != '=' || *p++ != '"')
            return false;
        while (*p && *p != '"') {
            if (*p == '\n')
                return false;
            if (*p == '\\') {
                p++;
                if (*p != '\\' && *p != '"' && *p != 'n')
                    return false;
            }
            p++;
        }
        if (*p++ != '"')
            return false;
        if (!*p)
            return true;
        if (*p++ != ',')
            return false;
    }
}

/* ---- registration ------------------------------------------------------------------- */

static bool s_grow(void *arr_p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t ncap = *cap ? *cap * 2 : 8;
    void *p = realloc(*(void **)arr_p, ncap * elem);
    if (!p)
        return false;
    *(void **)arr_p = p;
    *cap = ncap;
    return true;
}

static mq_metric_t *s_register(mq_metrics_t *self, s_kind_t kind, const char *name,
                               const char *help, const char *labels, const double *bounds,
                               size_t nbounds)
{
    if (!self)
        return NULL;
    if (!s_name_ok(name))
        return mq_err_set("metric name '%s' is not valid", name ? name : "(null)"), NULL;
    if (!s_labels_ok(labels))
        return mq_err_set("metric %s: labels '%s' are not valid", name, labels), NULL;
    if (kind == S_HISTOGRAM) {
        bool ok = nbounds > 0 && nbounds <= MQ_METRICS_MAX_BOUNDS;
        for (size_t i = 1; ok && i < nbounds; i++)
            ok = bounds[i] > bounds[i - 1];
        if (!ok)
            return mq_err_set("metric %s: 1 to %d increasing bucket bounds", name,
                              MQ_METRICS_MAX_BOUNDS), NULL;
    }
    const char *lab = labels ? labels : "";
    mq_metric_t *m = NULL;
    pthread_mutex_lock(&self->lock);
    s_family_t *f = NULL;
    for (size_t i = 0; i < self->nfamilies && !f; i++)
        if (strcmp(self->families[i]->name, name) == 0)
            f = self->families[i];
    if (f && f->own && self->sealed) {
        mq_err_set("metric %s is the registry's own (every service's): not to be written",
                   name);
        goto out;
    }
    if (f && f->kind != kind) {
        mq_err_set("metric %s was registered before as another type", name);
        goto out;
    }
    if (!f) {
        if (!s_grow(&self->families, &self->capfamilies, self->nfamilies, sizeof *self->families) ||
            !(f = calloc(1, sizeof *f))) {
            mq_err_set("out of memory");
            goto out;
        }
        f->registry = self;
        f->kind = kind;
        f->own = !self->sealed;
        snprintf(f->name, sizeof f->name, "%s", name);
        snprintf(f->help, sizeof f->help, "%s", help ? help : "");
        for (char *p = f->help; *p; p++) /* HELP is one line */
            if (*p == '\n')
                *p = ' ';
        if (kind == S_HISTOGRAM) {
            memcpy(f->bounds, bounds, nbounds * sizeof *bounds);
            f->nbounds = nbounds;
        }
        self->families[self->nfamilies++] = f;
    }
    for (size_t i = 0; i < f->nseries; i++)
        if (strcmp(f->series[i]->labels, lab) == 0) {
            m = f->series[i];
            goto out;
        }
    if (!s_grow(&f->series, &f->capseries, f->nseries, sizeof *f->series) ||
        !(m = calloc(1, sizeof *m))) {
        mq_err_set("out of memory");
        goto out;
    }
    m->family = f;
    snprintf(m->labels, sizeof m->labels, "%s", lab);
    f->series[f->nseries++] = m;
out:
    pthread_mutex_unlock(&self->lock);
    return m;
}

mq_metric_t *mq_metrics_counter(mq_metrics_t *self, const char *name, const char *help,
                                const char *labels)
{
    return s_register(self, S_COUNTER, name, help, labels, NULL, 0);
}

mq_metric_t *mq_metrics_gauge(mq_metrics_t *self, const char *name, const char *help,
                              const char *labels)
{
    return s_register(self, S_GAUGE, name, help, labels, NULL, 0);
}

mq_metric_t *mq_metrics_histogram(mq_metrics_t *self, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t nbounds)
{
    return s_register(self, S_HISTOGRAM, name, help, labels, bounds, nbounds);
}

mq_metrics_t *mq_metrics_new(const char *role)
{
    mq_metrics_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    pthread_mutex_init(&self->lock, NULL);
    char labels[MQ_METRICS_LABELS_MAX], esc[64];
    snprintf(labels, sizeof labels, "role=\"%s\",version=\"%s\"",
             mq_metrics_escape(esc, sizeof esc, role ? role : ""), MQGRAD_VERSION);
    mq_metric_set(mq_metrics_gauge(self, "mqgrad_build_info",
                                   "The service's role and mqgrad version (value 1).", labels),
                  1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    mq_metric_set(mq_metrics_gauge(self, "process_start_time_seconds",
                                   "Start time of the process since the Unix epoch, seconds.",
                                   NULL),
                  (double)ts.tv_sec + ts.tv_nsec * 1e-9);
    self->cpu = mq_metrics_counter(self, "process_cpu_seconds_total",
                                   "User and system CPU time of the process, seconds.", NULL);
    self->rss = mq_metrics_gauge(self, "process_resident_memory_bytes",
                                 "Resident memory of the process, bytes.", NULL);
    self->sealed = true;
    return self;
}

/* The process's CPU time and resident memory, into their series. */
static void s_process(mq_metrics_t *self)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        mq_metric_set(self->cpu, (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
                                     (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6);
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages, resident;
    if (f && fscanf(f, "%lu %lu", &pages, &resident) == 2)
        mq_metric_set(self->rss, (double)resident * (double)sysconf(_SC_PAGESIZE));
    if (f)
        fclose(f);
}

void mq_metrics_destroy(mq_metrics_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_metrics_t *self = *self_p;
    for (size_t i = 0; i < self->nfamilies; i++) {
        s_family_t *f = self->families[i];
        for (size_t j = 0; j < f->nseries; j++)
            free(f->series[j]);
        free(f->series);
        free(f);
    }
    free(self->families);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

/* ---- updates ------------------------------------------------------------------------ */

void mq_metric_add(mq_metric_t *m, double v)
{
    if (!m || !(v >= 0)) /* NaN too */
        return;
    pthread_mutex_t *lock = &m->family->registry->lock;
    pthread_mutex_lock(lock);
    m->value += v;
    pthread_mutex_unlock(lock);
}

void mq_metric_set(mq_metric_t *m, double v)
{
    if (!m)
        return;
    pthread_mutex_t *lock = &m->family->registry->lock;
    pthread_mutex_lock(lock);
    if (m->family->kind == S_GAUGE || (m->family->kind == S_COUNTER && v >= m->value))
        m->value = v;
    pthread_mutex_unlock(lock);
}

void mq_metric_observe(mq_metric_t *m, double v)
{
    if (!m || m->family->kind != S_HISTOGRAM || isnan(v))
        return;
    const s_family_t *f = m->family;
    size_t b = 0;
    while (b < f->nbounds && v > f->bounds[b])
        b++;
    pthread_mutex_t *lock = &f->registry->lock;
    pthread_mutex_lock(lock);
    m->buckets[b] += 1;
    m->count += 1;
    m->value += v;
    pthread_mutex_unlock(lock);
}

int mq_metric_relabel(mq_metric_t *m, const char *labels)
{
    if (!m)
        return -1;
    if (!s_labels_ok(labels))
        return mq_err_set("metric %s: labels '%s' are not valid", m->family->name, labels), -1;
    pthread_mutex_t *lock = &m->family->registry->lock;
    pthread_mutex_lock(lock);
    snprintf(m->labels, sizeof m->labels, "%s", labels ? labels : "");
    pthread_mutex_unlock(lock);
    return 0;
}

double mq_metric_value(mq_metric_t *m)
{
    if (!m)
        return NAN;
    pthread_mutex_t *lock = &m->family->registry->lock;
    pthread_mutex_lock(lock);
    double v = m->family->kind == S_HISTOGRAM ? m->count : m->value;
    pthread_mutex_unlock(lock);
    return v;
}

char *mq_metrics_escape(char *dst, size_t cap, const char *s)
{
    size_t n = 0;
    if (!cap)
        return dst;
    for (; s && *s; s++) {
        const char *rep = *s == '\\' ? "\\\\" : *s == '"' ? "\\\"" : *s == '\n' ? "\\n" : NULL;
        size_t k = rep ? 2 : 1;
        if (n + k >= cap)
            break;
        if (rep)
            memcpy(dst + n, rep, 2);
        else
            dst[n] = *s;
        n += k;
    }
    dst[n] = '\0';
    return dst;
}

/* ---- rendering ---------------------------------------------------------------------- */

/* Prometheus writes NaN and the infinities as NaN, +Inf, -Inf. */
static void s_num(mq_text_t *o, double v)
{
    if (isnan(v))
        mq_text_printf(o, "NaN");
    else if (isinf(v))
        mq_text_printf(o, "%sInf", v > 0 ? "+" : "-");
    else
        mq_text_printf(o, "%.17g", v);
}

/* NAME{LABELS[,EXTRA]} VALUE */
static void s_sample(mq_text_t *o, const char *name, const char *suffix, const char *labels,
                     const char *extra, double v)
{
    mq_text_printf(o, "%s%s", name, suffix);
    if (*labels || extra)
        mq_text_printf(o, "{%s%s%s}", labels, *labels && extra ? "," : "", extra ? extra : "");
    mq_text_printf(o, " ");
    s_num(o, v);
    mq_text_printf(o, "\n");
}

size_t mq_metrics_render(mq_metrics_t *self, char *buf, size_t cap)
{
    mq_text_t o = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    if (!self)
        return 0;
    s_process(self);
    static const char *const types[] = {"counter", "gauge", "histogram"};
    pthread_mutex_lock(&self->lock);
    for (size_t i = 0; i < self->nfamilies; i++) {
        const s_family_t *f = self->families[i];
        mq_text_printf(&o, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, types[f->kind]);
        for (size_t j = 0; j < f->nseries; j++) {
            const mq_metric_t *m = f->series[j];
            if (f->kind != S_HISTOGRAM) {
                s_sample(&o, f->name, "", m->labels, NULL, m->value);
                continue;
            }
            double cum = 0;
            char le[48];
            for (size_t b = 0; b <= f->nbounds; b++) {
                cum += m->buckets[b];
                if (b < f->nbounds)
                    snprintf(le, sizeof le, "le=\"%.15g\"", f->bounds[b]);
                else
                    snprintf(le, sizeof le, "le=\"+Inf\"");
                s_sample(&o, f->name, "_bucket", m->labels, le, cum);
            }
            s_sample(&o, f->name, "_sum", m->labels, NULL, m->value);
            s_sample(&o, f->name, "_count", m->labels, NULL, m->count);
        }
    }
    pthread_mutex_unlock(&self->lock);
    return o.len;
}
