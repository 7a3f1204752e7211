/* The scheduler's checkpoint file and the run directory questions of a resume. The file is
 * JSON for people; it is read back by key, and every key must be there (but first_loss, which
 * older files lack) and be a number (null stands for NaN). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqgrad/runlog.h"
#include "mqgrad/util.h"
#include "scheduler_internal.h"

static void s_num(char *buf, size_t len, double v)
{
    if (isfinite(v))
        snprintf(buf, len, "%.17g", v);
    else
        snprintf(buf, len, "null");
}

int mq_sched_ckpt_write(const char *run_dir, const mq_sched_ckpt_t *c)
{
    char acc[32], acc_iter[32], loss[32], sparsity[32], smoothed[32], best[32], best_acc[32],
        first[32];
    s_num(acc, sizeof acc, c->last_acc);
    s_num(acc_iter, sizeof acc_iter, c->acc_iter);
    s_num(loss, sizeof loss, c->last_loss);
    s_num(sparsity, sizeof sparsity, c->last_sparsity);
    s_num(smoothed, sizeof smoothed, c->smoothed);
    s_num(best, sizeof best, c->best);
    s_num(best_acc, sizeof best_acc, c->best_acc);
    s_num(first, sizeof first, c->first_loss);
    char policy[160], model[40];
    mq_json_escape(c->policy, policy, sizeof policy);
    mq_json_escape(c->model, model, sizeof model);
    char text[2048], path[600];
    int n = snprintf(
        text, sizeof text,
        "{\n  \"iter\": %" PRIu64 ",\n  \"cursor\": %" PRIu64 ",\n  \"lineage\": \"%016" PRIx64
        "\",\n  \"servers\": %u,\n  \"model\": \"%s\",\n  \"bits\": %d,\n"
        "  \"train_time_s\": %.17g,\n  \"wall_time_s\": %.17g,\n  \"bytes_up\": %" PRIu64
        ",\n  \"bytes_down\": %" PRIu64 ",\n  \"fallbacks\": %" PRIu64 ",\n"
        "  \"last_acc\": %s,\n  \"acc_iter\": %s,\n  \"last_loss\": %s,\n  \"last_sparsity\": %s,\n"
        "  \"smoothed_loss\": %s,\n  \"best_loss\": %s,\n  \"best_acc\": %s,\n"
        "  \"first_loss\": %s,\n  \"seen\": %" PRIu64 ",\n  \"policy\": \"%s\"\n}\n",
        c->iter, c->cursor, c->lineage, c->servers, model, c->bits, c->train_time_s, c->wall_time_s,
        c->bytes_up, c->bytes_down, c->fallbacks, acc, acc_iter, loss, sparsity, smoothed, best,
        best_acc, first, c->seen, policy);
    if (n < 0 || (size_t)n >= sizeof text ||
        (size_t)snprintf(path, sizeof path, "%s/checkpoint.json", run_dir) >= sizeof path) {
        mq_err_set("checkpoint.json: too long");
        return -1;
    }
    return mq_write_file_atomic(path, text, (size_t)n);
}

/* The value after "KEY": in TEXT: a number (or null = NaN) into *V. */
static int s_get(const char *text, const char *key, double *v)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(text, pat);
    if (!p) {
        mq_err_set("checkpoint.json has no \"%s\"", key);
        return -1;
    }
    p += strlen(pat);
    while (*p == ' ')
        p++;
    if (strncmp(p, "null", 4) == 0) {
        *v = NAN;
        return 0;
    }
    char *end;
    *v = strtod(p, &end);
    if (end == p) {
        mq_err_set("checkpoint.json: \"%s\" is not a number", key);
        return -1;
    }
    return 0;
}

/* Whether V is a count below LIMIT (converting any other double to an integer is undefined). */
static bool s_count(double v, double limit)
{
    return v >= 0 && v < limit;
}

/* The string value of "KEY" into BUF. */
static int s_get_str(const char *text, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": \"", key);
    const char *p = strstr(text, pat);
    const char *end = p ? strchr(p + strlen(pat), '"') : NULL;
    if (!end) {
        mq_err_set("checkpoint.json has no string \"%s\"", key);
        return -1;
    }
    p += strlen(pat);
    snprintf(buf, len, "%.*s", (int)(end - p), p);
    return 0;
}

static int s_read(const char *run_dir, const char *name, mq_sched_ckpt_t *c);

int mq_sched_ckpt_read(const char *run_dir, mq_sched_ckpt_t *c)
{
    return s_read(run_dir, "checkpoint.json", c);
}

int mq_sched_ckpt_read_prev(const char *run_dir, mq_sched_ckpt_t *c)
{
    return s_read(run_dir, "checkpoint-prev.json", c);
}

int mq_sched_ckpt_keep_prev(const char *run_dir)
{
    char path[600], prev[600], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/checkpoint.json", run_dir);
    snprintf(prev, sizeof prev, "%s/checkpoint-prev.json", run_dir);
    if (access(path, F_OK) != 0)
        return 0;
    if (mq_read_file(path, &text, &len) != 0)
        return -1;
    int rc = mq_write_file_atomic(prev, text, len);
    free(text);
    return rc;
}

int mq_sched_ckpt_fall_back(const char *run_dir, uint64_t bad_iter)
{
    char path[600], prev[600], aside[700];
    snprintf(path, sizeof path, "%s/checkpoint.json", run_dir);
    snprintf(prev, sizeof prev, "%s/checkpoint-prev.json", run_dir);
    snprintf(aside, sizeof aside, "%s/checkpoint-unreadable-%" PRIu64 ".json", run_dir, bad_iter);
    if (rename(path, aside) != 0 || rename(prev, path) != 0) {
        mq_err_set("going back to %s: %s", prev, strerror(errno));
        return -1;
    }
    return 0;
}

static int s_read(const char *run_dir, const char *name, mq_sched_ckpt_t *c)
{
    char path[600], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", run_dir, name);
    if (access(path, F_OK) != 0)
        return 1;
    if (mq_read_file(path, &text, &len) != 0)
        return -1;
    memset(c, 0, sizeof *c);
    double iter, cursor, servers, bits, up, down, fallbacks, seen;
    char lineage[40];
    int rc = -1;
    if (s_get(text, "iter", &iter) || s_get(text, "cursor", &cursor) ||
        s_get(text, "servers", &servers) || s_get(text, "bits", &bits) ||
        s_get(text, "train_time_s", &c->train_time_s) ||
        s_get(text, "wall_time_s", &c->wall_time_s) || s_get(text, "bytes_up", &up) ||
        s_get(text, "bytes_down", &down) || s_get(text, "fallbacks", &fallbacks) ||
        s_get(text, "last_acc", &c->last_acc) || s_get(text, "acc_iter", &c->acc_iter) ||
        s_get(text, "last_loss", &c->last_loss) ||
        s_get(text, "last_sparsity", &c->last_sparsity) ||
        s_get(text, "smoothed_loss", &c->smoothed) || s_get(text, "best_loss", &c->best) ||
        s_get(text, "best_acc", &c->best_acc) || s_get(text, "seen", &seen) ||
        s_get_str(text, "lineage", lineage, sizeof lineage) ||
        s_get_str(text, "model", c->model, sizeof c->model) ||
        s_get_str(text, "policy", c->policy, sizeof c->policy))
        goto out;
    /* Written since 2026-11-29 (the flat rule): a checkpoint from before has none, and its run
     * goes on without that rule. */
    if (!strstr(text, "\"first_loss\":"))
        c->first_loss = NAN;
    else if (s_get(text, "first_loss", &c->first_loss))
        goto out;
    if (!(iter >= 1) || !s_count(iter, 0x1p64) || !s_count(cursor, 0x1p64) ||
        !(servers >= 1) || !s_count(servers, 0x1p32) || !(bits >= 1) || !(bits <= 32) ||
        !s_count(up, 0x1p64) || !s_count(down, 0x1p64) || !s_count(fallbacks, 0x1p64) ||
        !s_count(seen, 0x1p64) || !isfinite(c->train_time_s) || !isfinite(c->wall_time_s)) {
        mq_err_set("%s: values out of range (iter %g, servers %g, bits %g)", path, iter,
                   servers, bits);
        goto out;
    }
    c->iter = (uint64_t)iter;
    c->cursor = (uint64_t)cursor;
    c->servers = (uint32_t)servers;
    c->bits = (int)bits;
    c->bytes_up = (uint64_t)up;
    c->bytes_down = (uint64_t)down;
    c->fallbacks = (uint64_t)fallbacks;
    c->seen = (uint64_t)seen;
    c->lineage = strtoull(lineage, NULL, 16);
    if (!c->lineage) {
        mq_err_set("%s: no run lineage", path);
        goto out;
    }
    rc = 0;
out:
    if (rc != 0) {
        char why[300];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("cannot resume from %s: %s (the file is left as it is)", path, why);
    }
    free(text);
    return rc;
}

bool mq_sched_run_exists(const char *run_dir)
{
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", run_dir);
    return access(path, F_OK) == 0;
}

bool mq_sched_run_finished(const char *run_dir)
{
    char path[600], *text;
    size_t len;
    snprintf(path, sizeof path, "%s/summary.json", run_dir);
    if (mq_read_file(path, &text, &len) != 0)
        return false;
    const char *p = strstr(text, "\"status\"");
    bool over = p && (strstr(p, "\"completed\"") || strstr(p, "\"diverged\""));
    free(text);
    return over;
}

int mq_sched_next_dir(const char *dir, char *out, size_t len)
{
    for (int k = 2; k < 10000; k++) {
        if ((size_t)snprintf(out, len, "%s-%d", dir, k) >= len)
            break;
        if (!mq_sched_run_exists(out))
            return 0;
    }
    mq_err_set("no free run directory beside %s", dir);
    return -1;
}

int mq_sched_open_run(const mq_scheduler_config_t *c, char *run_dir, size_t len,
                      mq_sched_opened_t *out)
{
    memset(out, 0, sizeof *out);
    char json[2048];
    mq_sched_config_json(c, json, sizeof json);
    int swept = mq_tmp_sweep(run_dir, NULL);
    if (swept > 0)
        mq_info("removed %d temporary files that writers which died left in %s", swept,
                run_dir);
    if (c->resume && mq_sched_run_exists(run_dir) && mq_sched_run_finished(run_dir)) {
        char next[512];
        if (mq_sched_next_dir(c->run_dir, next, sizeof next) != 0)
            return -1;
        mq_info("the run in %s is over; --resume starts a new one in %s", run_dir, next);
        snprintf(run_dir, len, "%s", next);
    }
    if (!c->resume || !mq_sched_run_exists(run_dir)) {
        out->log = mq_runlog_new(run_dir, json);
        return out->log ? 0 : -1;
    }
    int rc = mq_sched_ckpt_read(run_dir, &out->ckpt);
    if (rc < 0)
        return -1;
    if (rc == 0 && (out->ckpt.servers != (uint32_t)c->servers ||
                    strcmp(out->ckpt.model, c->model) != 0)) {
        mq_err_set("%s/checkpoint.json is of a run with %u servers and model %s; this "
                   "scheduler has %ld and %s (refused, left as it is)",
                   run_dir, out->ckpt.servers, out->ckpt.model, c->servers, c->model);
        return -1;
    }
    uint64_t last = 0;
    bool has_rows = mq_runlog_last_iter(run_dir, &last) == 0;
    out->log = mq_runlog_append(run_dir);
    if (!out->log)
        return -1;
    out->resumed = true;
    out->has_ckpt = rc == 0;
    uint64_t from = out->has_ckpt ? out->ckpt.iter : 0;
    out->lost = has_rows && last + 1 > from ? last + 1 - from : 0;
    return 0;
}
