/* The Prometheus text format reader: the text is copied once, and every name and label
 * value is cut out of the copy in place (an unescaped value is never longer than its
 * escaped form), so a parse makes three allocations whatever the size. */
#include "promtext.h"

#include <errno.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/util.h"

/* A line being read: P is the next character, END one past its last. */
typedef struct {
    char *p, *end;
    const char *why; /* set on the first error */
} s_line_t;

static bool s_blank(char c)
{
    return c == ' ' || c == '\t';
}

static bool s_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool s_digit(char c)
{
    return c >= '0' && c <= '9';
}

static void s_skip_blanks(s_line_t *l)
{
    while (l->p < l->end && s_blank(*l->p))
        l->p++;
}

/* A metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) or, when METRIC is false, a label name (no
 * colons). Returns its start and leaves l->p after it, or NULL. */
static char *s_name(s_line_t *l, bool metric)
{
    char *start = l->p;
    while (l->p < l->end) {
        char c = *l->p;
        bool ok = s_alpha(c) || (metric && c == ':') || (l->p > start && s_digit(c));
        if (!ok)
            break;
        l->p++;
    }
    if (l->p == start) {
        l->why = metric ? "no metric name" : "no label name";
        return NULL;
    }
    return start;
}

/* A quoted label value at l->p (the opening quote), unescaped in place and terminated.
 * Returns its start, or NULL. */
static char *s_quoted(s_line_t *l)
{
    if (l->p >= l->end || *l->p != '"') {
        l->why = "label value not quoted";
        return NULL;
    }
    char *r = ++l->p, *w = r, *start = r;
    for (; r < l->end; r++) {
        char c = *r;
        if (c == '"') {
            *w = '\0';
            l->p = r + 1;
            return start;
        }
        if (c == '\0') {
            l->why = "NUL byte in a label value";
            return NULL;
        }
        if (c == '\\') {
            if (++r >= l->end)
                break;
            if (*r == 'n') {
                c = '\n';
            } else if (*r == '\\' || *r == '"') {
                c = *r;
            } else {
                l->why = "unknown escape in a label value (only \\\\, \\\" and \\n)";
                return NULL;
            }
        }
        *w++ = c;
    }
    l->why = "label value not closed";
    return NULL;
}

static int s_grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 64;
    while (n < need)
        n *= 2;
    void *a = realloc(*arr, n * size);
    if (!a) {
        mq_err_set("out of memory reading metrics (%zu entries)", n);
        return -1;
    }
    *arr = a;
    *cap = n;
    return 0;
}

/* {name="value",...} after the metric name, labels appended to P. Returns 0, -1 for a
 * malformed list (l->why), -2 out of memory. */
static int s_labels(s_line_t *l, mq_promtext_t *p, int *count)
{
    l->p++; /* '{' */
    for (;;) {
        s_skip_blanks(l);
        if (l->p < l->end && *l->p == '}') {
            l->p++;
            return 0;
        }
        char *name = s_name(l, false);
        if (!name)
            return -1;
        char *name_end = l->p;
        s_skip_blanks(l);
        if (l->p >= l->end || *l->p != '=') {
            l->why = "no '=' after a label name";
            return -1;
        }
        l->p++;
        *name_end = '\0'; /* after the checks: it may have been the '=' */
        s_skip_blanks(l);
        char *value = s_quoted(l);
        if (!value)
            return -1;
        if (s_grow((void **)&p->labels, &p->label_cap, p->nlabels + 1, sizeof *p->labels) != 0)
            return -2;
        p->labels[p->nlabels++] = (mq_promtext_label_t){name, value};
        (*count)++;
        s_skip_blanks(l);
        if (l->p < l->end && *l->p == ',') {
            l->p++;
            continue;
        }
        if (l->p < l->end && *l->p == '}') {
            l->p++;
            return 0;
        }
        l->why = "expected ',' or '}' after a label";
        return -1;
    }
}

/* The next blank-separated token, terminated in place: its end is a blank, or the line's
 * '\r', '\n' or the buffer's final NUL, none of which is needed any more. */
static char *s_token(s_line_t *l)
{
    s_skip_blanks(l);
    char *start = l->p;
    while (l->p < l->end && !s_blank(*l->p))
        l->p++;
    if (l->p == start)
        return NULL;
    *l->p = '\0';
    if (l->p < l->end)
        l->p++;
    return start;
}

/* strtod in the C locale: a service's "0.5" must not read as 0 under a locale whose decimal
 * point is a comma. */
static double s_strtod(const char *s, char **end)
{
    static locale_t c_locale;
    if (!c_locale)
        c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    return c_locale ? strtod_l(s, end, c_locale) : strtod(s, end);
}

/* One sample line. Returns 0, -1 malformed (l->why), -2 out of memory. */
static int s_sample(s_line_t *l, mq_promtext_t *p)
{
    mq_promtext_sample_t s = {0};
    char *name = s_name(l, true);
    if (!name)
        return -1;
    char *name_end = l->p;
    if (l->p < l->end && *l->p == '{') {
        int rc = s_labels(l, p, &s.nlabels);
        if (rc != 0)
            return rc;
    } else if (l->p < l->end && s_blank(*l->p)) {
        l->p++;
    } else if (l->p < l->end) {
        l->why = "invalid character in the metric name";
        return -1;
    }
    *name_end = '\0'; /* only now: it was the '{' or the blank after the name */
    s.name = name;
    char *value = s_token(l);
    if (!value) {
        l->why = "no value";
        return -1;
    }
    char *e;
    s.value = s_strtod(value, &e);
    if (e == value || *e) {
        l->why = "value is not a number";
        return -1;
    }
    char *ts = s_token(l);
    if (ts) {
        errno = 0;
        long long t = strtoll(ts, &e, 10);
        if (e == ts || *e || errno) {
            l->why = "timestamp is not an integer (milliseconds)";
            return -1;
        }
        s.has_timestamp = true;
        s.timestamp_ms = t;
    }
    s_skip_blanks(l);
    if (l->p < l->end) {
        l->why = "text after the timestamp";
        return -1;
    }
    if (s_grow((void **)&p->samples, &p->cap, p->n + 1, sizeof *p->samples) != 0)
        return -2;
    p->samples[p->n++] = s;
    return 0;
}

int mq_promtext_parse(const char *text, size_t len, mq_promtext_t *p)
{
    memset(p, 0, sizeof *p);
    p->buf = malloc(len + 1);
    if (!p->buf) {
        mq_err_set("out of memory reading %zu bytes of metrics", len);
        return -1;
    }
    memcpy(p->buf, text, len);
    p->buf[len] = '\0';
    char *at = p->buf, *stop = p->buf + len;
    for (int lineno = 1; at < stop; lineno++) {
        char *nl = memchr(at, '\n', (size_t)(stop - at));
        s_line_t l = {at, nl ? nl : stop, NULL};
        at = nl ? nl + 1 : stop;
        if (l.end > l.p && l.end[-1] == '\r')
            l.end--;
        s_skip_blanks(&l);
        if (l.p == l.end || *l.p == '#')
            continue;
        size_t nl_before = p->nlabels;
        int rc = s_sample(&l, p);
        if (rc == -2)
            return -1;
        if (rc == -1) {
            p->nlabels = nl_before; /* the bad line's labels go */
            if (p->bad++ == 0) {
                p->bad_line = lineno;
                snprintf(p->bad_why, sizeof p->bad_why, "%s", l.why);
            }
        }
    }
    /* Labels were appended sample by sample; point each sample at its own now that the
     * array no longer moves. */
    size_t off = 0;
    for (size_t i = 0; i < p->n; i++) {
        p->samples[i].labels = p->samples[i].nlabels ? p->labels + off : NULL;
        off += (size_t)p->samples[i].nlabels;
    }
    return 0;
}

void mq_promtext_free(mq_promtext_t *p)
{
    free(p->buf);
    free(p->samples);
    free(p->labels);
    memset(p, 0, sizeof *p);
}

const char *mq_promtext_label(const mq_promtext_sample_t *s, const char *name)
{
    for (int i = 0; i < s->nlabels; i++)
        if (strcmp(s->labels[i].name, name) == 0)
            return s->labels[i].value;
    return NULL;
}

const mq_promtext_sample_t *mq_promtext_find(const mq_promtext_t *p, const char *name, ...)
{
    for (size_t i = 0; i < p->n; i++) {
        const mq_promtext_sample_t *s = &p->samples[i];
        if (strcmp(s->name, name) != 0)
            continue;
        bool match = true;
        va_list ap;
        va_start(ap, name);
        for (const char *k; match && (k = va_arg(ap, const char *));) {
            const char *v = va_arg(ap, const char *);
            const char *have = mq_promtext_label(s, k);
            match = have && v && strcmp(have, v) == 0;
        }
        va_end(ap);
        if (match)
            return s;
    }
    return NULL;
}
