/* A service's metrics, rendered in Prometheus' text format (version 0.0.4) by the HTTP face
 * (mqgrad/http.h). A registry holds families (a name, its help text, its type) and their
 * series (one label set each); a service registers the series it updates once, at setup or
 * the first time a label value (a worker's rank, say) appears, and keeps the handles, so an
 * update in the training loop is a lock, an add and an unlock: no lookup, no allocation.
 *
 * Names follow Prometheus' conventions: mqgrad_<role>_<what>_<unit>, counters end in _total,
 * base units (seconds, bytes, ratios in [0,1]). Every registry also carries
 * mqgrad_build_info{role,version} = 1 and process_start_time_seconds.
 *
 * Thread safety: updates and rendering take the registry's mutex; the HTTP thread renders
 * while the service's own thread updates. */
#ifndef MQGRAD_METRICS_H
#define MQGRAD_METRICS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mq_metrics_t mq_metrics_t;
typedef struct mq_metric_t mq_metric_t;

/* Most bucket bounds a histogram may have (+Inf is implied). */
#define MQ_METRICS_MAX_BOUNDS 24
/* Longest label set, as written between the braces. */
#define MQ_METRICS_LABELS_MAX 192

/* Bucket bounds, in seconds, for the times of a training step's phases and of an iteration:
 * 1 ms to 2 min, about three per decade. */
extern const double mq_metrics_seconds_bounds[];
extern const size_t mq_metrics_seconds_nbounds;

/* A registry for a service of ROLE ("scheduler", "server", "worker", "agent"). NULL on
 * out-of-memory. */
mq_metrics_t *mq_metrics_new(const char *role);
void mq_metrics_destroy(mq_metrics_t **self_p);

/* The series NAME{LABELS} of a counter, a gauge or a histogram, registered on first use (the
 * family takes HELP and, for a histogram, the NBOUNDS increasing BOUNDS, from its first
 * series). LABELS is what goes between the braces, e.g. "rank=\"3\",phase=\"compute\"" (values
 * escaped with mq_metrics_escape where they are not the caller's own words), or NULL/"" for
 * none. The same NAME and LABELS give the same series again. Allocates: not for a per-message
 * path. NULL (error set, mqgrad/util.h) for a name or labels that are not valid, a name
 * registered before as another type, a name of the registry's own (mqgrad_build_info and the
 * process_* series, whatever the labels), or out-of-memory; updates and renders ignore NULL, so a
 * service can go on without a series it could not make. */
mq_metric_t *mq_metrics_counter(mq_metrics_t *self, const char *name, const char *help,
                                const char *labels);
mq_metric_t *mq_metrics_gauge(mq_metrics_t *self, const char *name, const char *help,
                              const char *labels);
mq_metric_t *mq_metrics_histogram(mq_metrics_t *self, const char *name, const char *help,
                                  const char *labels, const double *bounds, size_t nbounds);

/* Counter: adds V (ignored unless V >= 0: a counter never goes down). */
void mq_metric_add(mq_metric_t *m, double v);
/* Gauge: sets V (NaN allowed: "no value yet"). Counter: sets the total to V when V is not
 * below it (for totals kept elsewhere, such as the drop counts). */
void mq_metric_set(mq_metric_t *m, double v);
/* Histogram: counts one observation V. */
void mq_metric_observe(mq_metric_t *m, double v);
/* Gives the series another label set (an info metric whose value changed, such as the
 * agent's policy). -1 for labels that are not valid. */
int mq_metric_relabel(mq_metric_t *m, const char *labels);
/* The current value (a histogram's count). For tests. */
double mq_metric_value(mq_metric_t *m);

/* Writes S into DST (at most CAP bytes, NUL included) as a label value: backslash, double
 * quote and newline escaped. Returns DST. */
char *mq_metrics_escape(char *dst, size_t cap, const char *s);

/* Renders every family into BUF (at most CAP bytes, NUL-terminated when CAP > 0) and returns
 * the length the whole text needs, as snprintf does: call again with more room when it is >=
 * CAP. */
size_t mq_metrics_render(mq_metrics_t *self, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
