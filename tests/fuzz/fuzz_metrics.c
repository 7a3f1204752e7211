/* fuzz_metrics: the text every service's /metrics writes and what reads it from the network.
 *   0 scrape      the input as a scrape body through `mqgrad top`'s reader
 *                 (mq_promtext_parse, tools/mqgrad/promtext.c); every sample it keeps must be
 *                 found again by its name and labels
 *   1 round trip  NUL-separated strings, three at a time: a metric name, a label set and a
 *                 value, registered as a gauge (common/src/util/metrics.c); the text of what
 *                 the registry accepts must read back with no bad line, every series there
 *                 with its labels and its value, bit for bit
 *   2 url         the input as `mqgrad top --scheduler` (mq_httpc_url_parse)
 * Input: byte 0 picks one (modulo 3), the rest is the input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "httpc.h"
#include "mqgrad/metrics.h"
#include "promtext.h"

#define S_MAX_STRINGS 48

static void s_scrape(const uint8_t *data, size_t len)
{
    mq_promtext_t p;
    if (mq_promtext_parse((const char *)data, len, &p) == 0)
        for (size_t i = 0; i < p.n; i++) {
            const mq_promtext_sample_t *s = &p.samples[i];
            const mq_promtext_sample_t *f = mq_promtext_find(&p, s->name, NULL);
            if (!f)
                mq_fuzz_fail("sample %zu (%s) not found by its name", i, s->name);
            for (int k = 0; k < s->nlabels; k++)
                if (!mq_promtext_label(s, s->labels[k].name))
                    mq_fuzz_fail("sample %zu: label %s not found", i, s->labels[k].name);
        }
    mq_promtext_free(&p);
}

/* The labels of S as the registry writes them: name="escaped value",... */
static void s_labels_text(const mq_promtext_sample_t *s, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; k < s->nlabels && n < cap; k++) {
        char esc[MQ_METRICS_LABELS_MAX];
        mq_metrics_escape(esc, sizeof esc, s->labels[k].value);
        n += (size_t)snprintf(buf + n, cap - n, "%s%s=\"%s\"", k ? "," : "", s->labels[k].name,
                              esc);
    }
}

static bool s_same(double a, double b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0 || (a == 0 && b == 0);
}

static void s_round_trip(const uint8_t *data, size_t len)
{
    char *str[S_MAX_STRINGS], *block;
    int n = mq_fuzz_strings(data, len, str, S_MAX_STRINGS, &block);
    mq_metrics_t *m = mq_metrics_new("fuzz");
    struct {
        const char *name, *labels;
        double v;
    } kept[S_MAX_STRINGS / 3];
    int nkept = 0;
    for (int i = 0; i + 2 < n; i += 3) {
        mq_metric_t *g = mq_metrics_gauge(m, str[i], "fuzzed", str[i + 1]);
        if (!g)
            continue;
        double v = strtod(str[i + 2], NULL);
        mq_metric_set(g, v);
        int k = 0; /* the same series again: the last value wins */
        while (k < nkept && !(strcmp(kept[k].name, str[i]) == 0 &&
                              strcmp(kept[k].labels, str[i + 1]) == 0))
            k++;
        kept[k].name = str[i];
        kept[k].labels = str[i + 1];
        kept[k].v = v;
        nkept += k == nkept;
    }
    /* with room to spare: the process's CPU time and memory, read as the registry renders,
     * may take a digit more the second time */
    size_t need = mq_metrics_render(m, NULL, 0);
    char *text = malloc(need + 64);
    if (!text)
        mq_fuzz_fail("out of memory");
    size_t got = mq_metrics_render(m, text, need + 64);
    if (got >= need + 64 || got + 64 < need)
        mq_fuzz_fail("the text's length went from %zu to %zu between two renders", need, got);
    need = got;
    mq_promtext_t p;
    if (mq_promtext_parse(text, need, &p) != 0)
        mq_fuzz_fail("out of memory");
    if (p.bad)
        mq_fuzz_fail("the registry wrote a line its reader refuses: line %d, %s:\n%s", p.bad_line,
                     p.bad_why, text);
    for (int k = 0; k < nkept; k++) {
        bool found = false;
        for (size_t i = 0; i < p.n && !found; i++) {
            char labels[MQ_METRICS_LABELS_MAX * 2];
            s_labels_text(&p.samples[i], labels, sizeof labels);
            found = strcmp(p.samples[i].name, kept[k].name) == 0 &&
                    strcmp(labels, kept[k].labels) == 0;
            if (found && !s_same(p.samples[i].value, kept[k].v))
                mq_fuzz_fail("%s{%s}: wrote %.17g, read %.17g", kept[k].name, kept[k].labels,
                             kept[k].v, p.samples[i].value);
        }
        if (!found)
            mq_fuzz_fail("%s{%s} is not in the text:\n%s", kept[k].name, kept[k].labels, text);
    }
    mq_promtext_free(&p);
    free(text);
    mq_metrics_destroy(&m);
    free(block);
}

static void s_url(const uint8_t *data, size_t len)
{
    char url[2048];
    size_t n = len < sizeof url - 1 ? len : sizeof url - 1;
    memcpy(url, data, n);
    url[n] = '\0';
    mq_httpc_url_t u;
    mq_httpc_url_parse(url, "8000", "/metrics", &u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    if (len == 0)
        return 0;
    switch (data[0] % 3) {
    case 0:
        s_scrape(data + 1, len - 1);
        break;
    case 1:
        s_round_trip(data + 1, len - 1);
        break;
    default:
        s_url(data + 1, len - 1);
    }
    return 0;
}
