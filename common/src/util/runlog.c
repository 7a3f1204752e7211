/* The run directory (DESIGN section 8): config.json, metrics.csv, events.jsonl and
 * summary.json, written the same way by `mqgrad train` and by the scheduler. Rows and events
 * are flushed as written; config and summary are replaced atomically. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/runlog.h"
#include "mqgrad/util.h"

struct mq_runlog_t {
    char dir[4096];
    FILE *metrics, *events;
    double t0;
};

static int s_path(const mq_runlog_t *r, const char *name, char *buf, size_t len)
{
    if ((size_t)snprintf(buf, len, "%s/%s", r->dir, name) >= len) {
        mq_err_set("run directory path too long: %s", r->dir);
        return -1;
    }
    return 0;
}

static FILE *s_open(const mq_runlog_t *r, const char *name)
{
    char path[4200];
    if (s_path(r, name, path, sizeof path) < 0)
        return NULL;
    FILE *f = fopen(path, "w");
    if (!f)
        mq_err_set("cannot write %s: %m", path);
    return f;
}

mq_runlog_t *mq_runlog_new(const char *dir, const char *config_json)
{
    mq_runlog_t *r = calloc(1, sizeof *r);
    if (!r) {
        mq_err_set("out of memory");
        return NULL;
    }
    if (snprintf(r->dir, sizeof r->dir, "%s", dir) >= (int)sizeof r->dir) {
        mq_err_set("run directory path too long: %s", dir);
        goto err;
    }
    r->t0 = mq_now_s();
    char path[4200];
    if (mq_mkdirs(dir) < 0 || s_path(r, "config.json", path, sizeof path) < 0)
        goto err;
    const char *cfg = config_json ? config_json : "{}";
    size_t len = strlen(cfg);
    char *text = malloc(len + 2);
    if (!text)
        goto err;
    memcpy(text, cfg, len);
    memcpy(text + len, "\n", 2);
    int rc = mq_write_file_atomic(path, text, len + 1);
    free(text);
    if (rc < 0 || !(r->metrics = s_open(r, "metrics.csv")) || !(r->events = s_open(r, "events.jsonl")))
        goto err;
    fprintf(r->metrics, "%s\n", MQ_METRICS_HEADER);
    fflush(r->metrics);
    return r;
err:
    mq_runlog_destroy(&r);
    return NULL;
}

void mq_runlog_destroy(mq_runlog_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_runlog_t *r = *self_p;
    if (r->metrics)
        fclose(r->metrics);
    if (r->events)
        fclose(r->events);
    free(r);
    *self_p = NULL;
}

const char *mq_runlog_dir(const mq_runlog_t *r)
{
    return r->dir;
}

int mq_runlog_row(mq_runlog_t *r, const mq_metrics_row_t *w)
{
    fprintf(r->metrics, "%llu,%.4f,%.6g,%.6g,%d,%llu,%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,",
            (unsigned long long)w->iter, w->train_time_s, w->loss, w->smoothed_loss, w->bits,
            (unsigned long long)w->bytes_up, (unsigned long long)w->bytes_down, w->compute_ms,
            w->encode_ms, w->wait_ms, w->decode_ms, w->update_ms, w->agent_ms);
    if (w->evaluated)
        fprintf(r->metrics, "%.6f,%.6g\n", w->test_acc, w->test_loss);
    else
        fputs(",\n", r->metrics);
    if (fflush(r->metrics) != 0 || ferror(r->metrics)) {
        mq_err_set("cannot write %s/metrics.csv: %m", r->dir);
        return -1;
    }
    return 0;
}

int mq_runlog_event(mq_runlog_t *r, uint64_t iter, const char *event, const char *fields_json)
{
    char ev[512];
    mq_json_escape(event, ev, sizeof ev);
    fprintf(r->events, "{\"t\":%.3f,\"iter\":%llu,\"event\":\"%s\"%s%s}\n", mq_now_s() - r->t0,
            (unsigned long long)iter, ev, fields_json && *fields_json ? "," : "",
            fields_json ? fields_json : "");
    if (fflush(r->events) != 0 || ferror(r->events)) {
        mq_err_set("cannot write %s/events.jsonl: %m", r->dir);
        return -1;
    }
    return 0;
}

/* A JSON number, or null for NaN and infinities (which JSON cannot hold). */
static void s_num(char *buf, size_t len, double v)
{
    if (isfinite(v))
        snprintf(buf, len, "%.9g", v);
    else
        snprintf(buf, len, "null");
}

int mq_runlog_summary(mq_runlog_t *r, const mq_summary_t *s)
{
    char pol[256], model[256], ds[256], st[64], loss[32], acc[32], sparsity[32], link[32],
        text[3072];
    char div[1024] = "", rule[64], detail[768];
    if (s->divergence_rule) {
        mq_json_escape(s->divergence_rule, rule, sizeof rule);
        mq_json_escape(s->divergence_detail ? s->divergence_detail : "", detail, sizeof detail);
        snprintf(div, sizeof div,
                 ",\n  \"divergence_rule\": \"%s\",\n  \"divergence_iter\": %llu,\n"
                 "  \"divergence_detail\": \"%s\"",
                 rule, (unsigned long long)s->divergence_iter, detail);
    }
    mq_json_escape(s->policy ? s->policy : "", pol, sizeof pol);
    mq_json_escape(s->model ? s->model : "", model, sizeof model);
    mq_json_escape(s->dataset ? s->dataset : "", ds, sizeof ds);
    mq_json_escape(s->status ? s->status : "", st, sizeof st);
    s_num(loss, sizeof loss, s->final_loss);
    s_num(acc, sizeof acc, s->final_test_acc);
    s_num(sparsity, sizeof sparsity, s->final_sparsity);
    s_num(link, sizeof link, s->link_mbps);
    int n = snprintf(text, sizeof text,
                     "{\n  \"iterations\": %llu,\n  \"train_time_s\": %.4f,\n"
                     "  \"final_loss\": %s,\n  \"final_test_acc\": %s,\n"
                     "  \"final_sparsity\": %s,\n"
                     "  \"bytes_up\": %llu,\n  \"bytes_down\": %llu,\n  \"policy\": \"%s\",\n"
                     "  \"model\": \"%s\",\n  \"dataset\": \"%s\",\n  \"workers\": %d,\n"
                     "  \"servers\": %d,\n  \"seed\": %llu,\n  \"link_mbps\": %s,\n"
                     "  \"clock\": \"%s\",\n  \"wall_time_s\": %.4f,\n"
                     "  \"status\": \"%s\"%s\n}\n",
                     (unsigned long long)s->iterations, s->train_time_s, loss, acc, sparsity,
                     (unsigned long long)s->bytes_up, (unsigned long long)s->bytes_down, pol,
                     model, ds, s->workers, s->servers, (unsigned long long)s->seed, link,
                     s->clock && strcmp(s->clock, "simulated") == 0 ? "simulated" : "real",
                     s->wall_time_s, st, div);
    if (n < 0 || (size_t)n >= sizeof text) {
        mq_err_set("summary of %s does not fit in %zu bytes", r->dir, sizeof text);
        return -1;
    }
    char path[4200];
    if (s_path(r, "summary.json", path, sizeof path) < 0)
        return -1;
    return mq_write_file_atomic(path, text, (size_t)n);
}

void mq_json_escape(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    if (len == 0)
        return;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char tmp[8];
        const char *rep = NULL;
        if (c == '"')
            rep = "\\\"";
        else if (c == '\\')
            rep = "\\\\";
        else if (c == '\n')
            rep = "\\n";
        else if (c == '\t')
            rep = "\\t";
        else if (c == '\r')
            rep = "\\r";
        else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            rep = tmp;
        }
        size_t need = rep ? strlen(rep) : 1;
        if (o + need >= len)
            break;
        if (rep)
            memcpy(buf + o, rep, need);
        else
            buf[o] = (char)c;
        o += need;
    }
    buf[o] = '\0';
}
