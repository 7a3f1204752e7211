/* The run directory (DESIGN section 8): config.json, metrics.csv, events.jsonl and
 * summary.json, written the same way by `mqgrad train` and by the scheduler. Rows and events
 * go straight to their files, one write(2) a line on an O_APPEND descriptor: nothing waits in
 * a buffer to fail later, so a full disk fails the very call that wrote, and the files are
 * never truncated. config.json and summary.json are replaced atomically. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mqgrad/runlog.h"
#include "mqgrad/util.h"

struct mq_runlog_t {
    char dir[4096];
    int metrics, events; /* O_APPEND descriptors, -1 when not open */
    double t0;
};

/* The files that make a directory a run: mq_runlog_new never writes over one of them. */
static const char *const s_run_files[] = {"config.json", "metrics.csv", "events.jsonl",
                                          "summary.json"};

static int s_path(const mq_runlog_t *r, const char *name, char *buf, size_t len)
{
    if ((size_t)snprintf(buf, len, "%s/%s", r->dir, name) >= len) {
        mq_err_set("run directory path too long: %s", r->dir);
        return -1;
    }
    return 0;
}

static mq_runlog_t *s_alloc(const char *dir)
{
    mq_runlog_t *r = calloc(1, sizeof *r);
    if (!r) {
        mq_err_set("out of memory");
        return NULL;
    }
    r->metrics = r->events = -1;
    r->t0 = mq_now_s();
    if (snprintf(r->dir, sizeof r->dir, "%s", dir) >= (int)sizeof r->dir) {
        mq_err_set("run directory path too long: %s", dir);
        free(r);
        return NULL;
    }
    return r;
}

/* Opens NAME in the run directory for appending into *FD, with FLAGS added (O_CREAT,
 * O_EXCL); O_TRUNC is never among them. */
static int s_open(mq_runlog_t *r, const char *name, int flags, int *fd)
{
    char path[4200];
    if (s_path(r, name, path, sizeof path) < 0)
        return -1;
    *fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC | flags, 0644);
    if (*fd >= 0)
        return 0;
    if (errno == EEXIST)
        mq_err_set("run directory %s already holds a run (%s); pick another directory or "
                   "resume it", r->dir, name);
    else
        mq_err_set("cannot open %s: %s", path, strerror(errno));
    return -1;
}

/* Writes LEN bytes of TEXT to FD (NAME's), all of them or -1 with the system's reason. */
static int s_write(const mq_runlog_t *r, int fd, const char *name, const char *text, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, text, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            mq_err_set("cannot write %s/%s: %s", r->dir, name,
                       n < 0 ? strerror(errno) : "the write wrote nothing");
            return -1;
        }
        text += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Formats one line and appends it to FD with a single write, so readers (tail -f, a resumed
 * run's check) never see half of one unless the disk filled up in the middle of it. */
static int s_appendf(const mq_runlog_t *r, int fd, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int s_appendf(const mq_runlog_t *r, int fd, const char *name, const char *fmt, ...)
{
    char small[1024], *text = small;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n >= sizeof small && (text = malloc((size_t)n + 1)))
        vsnprintf(text, (size_t)n + 1, fmt, again);
    va_end(again);
    if (n < 0 || !text) {
        mq_err_set("cannot write %s/%s: %s", r->dir, name, n < 0 ? "bad format" : "out of memory");
        return -1;
    }
    int rc = s_write(r, fd, name, text, (size_t)n);
    if (text != small)
        free(text);
    return rc;
}

/* -1 with the refusal if the directory holds any file of a run. */
static int s_refuse_a_run(const mq_runlog_t *r)
{
    for (size_t i = 0; i < sizeof s_run_files / sizeof *s_run_files; i++) {
        char path[4200];
        struct stat st;
        if (s_path(r, s_run_files[i], path, sizeof path) < 0)
            return -1;
        if (lstat(path, &st) == 0) {
            mq_err_set("run directory %s already holds a run (%s); pick another directory or "
                       "resume it", r->dir, s_run_files[i]);
            return -1;
        }
    }
    return 0;
}

static int s_write_config(const mq_runlog_t *r, const char *config_json)
{
    char path[4200];
    if (s_path(r, "config.json", path, sizeof path) < 0)
        return -1;
    const char *cfg = config_json ? config_json : "{}";
    size_t len = strlen(cfg);
    char *text = malloc(len + 2);
    if (!text) {
        mq_err_set("out of memory");
        return -1;
    }
    memcpy(text, cfg, len);
    memcpy(text + len, "\n", 2);
    int rc = mq_write_file_atomic(path, text, len + 1);
    free(text);
    return rc;
}

/* metrics.csv is created first and exclusively (O_EXCL): it claims the directory, so two runs
 * started on one directory cannot both write it. config.json comes last, so a directory with
 * a config.json has metrics.csv and its header: what mq_runlog_append checks. On failure the
 * files this call created are removed, so the directory can be used again. */
mq_runlog_t *mq_runlog_new(const char *dir, const char *config_json)
{
    mq_runlog_t *r = s_alloc(dir);
    bool made_metrics = false, made_events = false;
    if (!r || mq_mkdirs(dir) < 0 || s_refuse_a_run(r) < 0)
        goto err;
    if (s_open(r, "metrics.csv", O_CREAT | O_EXCL, &r->metrics) < 0)
        goto err;
    made_metrics = true;
    if (s_appendf(r, r->metrics, "metrics.csv", "%s\n", MQ_METRICS_HEADER) < 0 ||
        s_open(r, "events.jsonl", O_CREAT | O_EXCL, &r->events) < 0)
        goto err;
    made_events = true;
    if (s_write_config(r, config_json) < 0)
        goto err;
    return r;
err:
    if (r) {
        char path[4200];
        if (made_metrics && s_path(r, "metrics.csv", path, sizeof path) == 0)
            unlink(path);
        if (made_events && s_path(r, "events.jsonl", path, sizeof path) == 0)
            unlink(path);
    }
    mq_runlog_destroy(&r);
    return NULL;
}

/* A run is continued only with the columns it was started with, and only after a complete
 * row: a row appended to a cut one would merge with it. */
static int s_check_metrics(const mq_runlog_t *r)
{
    char path[4200], line[sizeof MQ_METRICS_HEADER + 1]; /* the header, its newline, a NUL */
    if (s_path(r, "metrics.csv", path, sizeof path) < 0)
        return -1;
    FILE *f = fopen(path, "r");
    if (!f) {
        mq_err_set("cannot resume the run in %s: cannot read %s: %s", r->dir, path,
                   strerror(errno));
        return -1;
    }
    int rc = -1;
    if (!fgets(line, sizeof line, f) || strcmp(line, MQ_METRICS_HEADER "\n") != 0)
        mq_err_set("cannot resume the run in %s: the first line of %s is not the header "
                   "'%s' (the run was written with other columns)", r->dir, path,
                   MQ_METRICS_HEADER);
    else if (fseek(f, -1, SEEK_END) != 0 || fgetc(f) != '\n')
        mq_err_set("cannot resume the run in %s: %s does not end with a newline (its last row "
                   "was cut short); remove that partial row first", r->dir, path);
    else
        rc = 0;
    fclose(f);
    return rc;
}

mq_runlog_t *mq_runlog_append(const char *dir)
{
    mq_runlog_t *r = s_alloc(dir);
    char path[4200];
    if (!r || s_path(r, "config.json", path, sizeof path) < 0)
        goto err;
    if (access(path, F_OK) != 0) {
        mq_err_set("cannot resume the run in %s: no config.json there (%s)", dir,
                   strerror(errno));
        goto err;
    }
    if (s_check_metrics(r) < 0 || s_open(r, "metrics.csv", 0, &r->metrics) < 0 ||
        s_open(r, "events.jsonl", O_CREAT, &r->events) < 0)
        goto err;
    return r;
err:
    mq_runlog_destroy(&r);
    return NULL;
}

/* Reads only the file's tail: our rows are a few hundred bytes, far below S_TAIL. */
#define S_TAIL 4096

int mq_runlog_last_iter(const char *dir, uint64_t *iter)
{
    char path[4200], buf[S_TAIL + 1];
    if ((size_t)snprintf(path, sizeof path, "%s/metrics.csv", dir) >= sizeof path) {
        mq_err_set("run directory path too long: %s", dir);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        mq_err_set("cannot read %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    off_t off = st.st_size > S_TAIL ? st.st_size - S_TAIL : 0;
    ssize_t n = pread(fd, buf, (size_t)(st.st_size - off), off);
    int err = errno;
    close(fd);
    if (n < 0) {
        mq_err_set("cannot read %s: %s", path, strerror(err));
        return -1;
    }
    buf[n] = '\0';
    /* The last complete line (a cut row after it is not one), and where it starts. */
    char *end = memrchr(buf, '\n', (size_t)n);
    char *start = end ? memrchr(buf, '\n', (size_t)(end - buf)) : NULL;
    if (!start && off == 0)
        return 1; /* no complete line, or the header alone */
    if (!start) {
        mq_err_set("%s: last line longer than %d bytes", path, S_TAIL);
        return -1;
    }
    *end = '\0';
    char *p;
    errno = 0;
    unsigned long long v = strtoull(++start, &p, 10);
    if (p == start || *p != ',' || *start == '-' || errno == ERANGE) {
        mq_err_set("%s: the last row does not start with an iteration: '%.40s'", path, start);
        return -1;
    }
    *iter = v;
    return 0;
}

void mq_runlog_destroy(mq_runlog_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    mq_runlog_t *r = *self_p;
    if (r->metrics >= 0)
        close(r->metrics);
    if (r->events >= 0)
        close(r->events);
    free(r);
    *self_p = NULL;
}

const char *mq_runlog_dir(const mq_runlog_t *r)
{
    return r->dir;
}

int mq_runlog_row(mq_runlog_t *r, const mq_metrics_row_t *w)
{
    char test[64] = ","; /* test_acc and test_loss: both empty unless evaluated */
    if (w->evaluated)
        snprintf(test, sizeof test, "%.6f,%.6g", w->test_acc, w->test_loss);
    return s_appendf(r, r->metrics, "metrics.csv",
                     "%llu,%.4f,%.6g,%.6g,%d,%llu,%llu,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%s,%" PRIu32
                     ",%" PRIu32 ",%" PRIu32 ",%.3f\n",
                     (unsigned long long)w->iter, w->train_time_s, w->loss, w->smoothed_loss,
                     w->bits, (unsigned long long)w->bytes_up, (unsigned long long)w->bytes_down,
                     w->compute_ms, w->encode_ms, w->wait_ms, w->decode_ms, w->update_ms,
                     w->agent_ms, test, w->workers, w->stragglers, w->slowest_rank,
                     w->slowest_ms);
}

int mq_runlog_event(mq_runlog_t *r, uint64_t iter, const char *event, const char *fields_json)
{
    char ev[512];
    mq_json_escape(event, ev, sizeof ev);
    return s_appendf(r, r->events, "events.jsonl",
                     "{\"t\":%.3f,\"iter\":%llu,\"event\":\"%s\"%s%s}\n", mq_now_s() - r->t0,
                     (unsigned long long)iter, ev, fields_json && *fields_json ? "," : "",
                     fields_json ? fields_json : "");
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
    return mq_summary_write(r->dir, s);
}

/* The summary's text: one member a line, "status" after every number and name, then the
 * divergence and the reason when there are some (mq_summary_set_status relies on this). */
static int s_summary_text(const mq_summary_t *s, char *text, size_t size)
{
    char pol[256], model[256], ds[256], st[64], loss[32], acc[32], sparsity[32], link[32];
    char why[1200] = "", reason[1100];
    if (s->reason && *s->reason) {
        mq_json_escape(s->reason, reason, sizeof reason);
        snprintf(why, sizeof why, ",\n  \"reason\": \"%s\"", reason);
    }
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
    char params[48] = "";
    if (s->params > 0)
        snprintf(params, sizeof params, "\n  \"params\": %llu,", (unsigned long long)s->params);
    int n = snprintf(text, size,
                     "{\n  \"iterations\": %llu,\n  \"train_time_s\": %.4f,\n"
                     "  \"final_loss\": %s,\n  \"final_test_acc\": %s,\n"
                     "  \"final_sparsity\": %s,\n"
                     "  \"bytes_up\": %llu,\n  \"bytes_down\": %llu,\n  \"policy\": \"%s\",\n"
                     "  \"model\": \"%s\",%s\n  \"dataset\": \"%s\",\n  \"workers\": %d,\n"
                     "  \"servers\": %d,\n  \"seed\": %llu,\n  \"link_mbps\": %s,\n"
                     "  \"clock\": \"%s\",\n  \"wall_time_s\": %.4f,\n"
                     "  \"status\": \"%s\"%s%s\n}\n",
                     (unsigned long long)s->iterations, s->train_time_s, loss, acc, sparsity,
                     (unsigned long long)s->bytes_up, (unsigned long long)s->bytes_down, pol,
                     model, params, ds, s->workers, s->servers, (unsigned long long)s->seed, link,
                     s->clock && strcmp(s->clock, "simulated") == 0 ? "simulated" : "real",
                     s->wall_time_s, st, div, why);
    return n < 0 || (size_t)n >= size ? -1 : n;
}

static int s_write_summary(const char *path, const char *text, size_t n)
{
    if (mq_write_file_atomic(path, text, n) < 0) {
        char why[512]; /* mq_err_last's buffer is the one mq_err_set writes */
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("cannot write %s: %s", path, why);
        return -1;
    }
    return 0;
}

int mq_summary_write(const char *dir, const mq_summary_t *s)
{
    char text[4400], path[4200];
    int n = s_summary_text(s, text, sizeof text);
    if (n < 0) {
        mq_err_set("summary of %s does not fit in %zu bytes", dir, sizeof text);
        return -1;
    }
    if (snprintf(path, sizeof path, "%s/summary.json", dir) >= (int)sizeof path) {
        mq_err_set("%s: path too long", dir);
        return -1;
    }
    return s_write_summary(path, text, (size_t)n);
}

int mq_summary_set_status(const char *dir, const char *status, const char *reason,
                          const mq_summary_t *fallback)
{
    char path[4200], st[64], why[1100], *old = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/summary.json", dir);
    /* The writer's layout (s_summary_text): the status on a line of its own, after it only
     * the divergence members and the reason, then "}". */
    char *at = mq_read_file(path, &old, &len) == 0 ? strstr(old, "\n  \"status\": \"") : NULL;
    char *line_end = at ? strchr(at + 1, '\n') : NULL;
    if (!line_end || len < 3 || strcmp(old + len - 3, "\n}\n") != 0) {
        free(old);
        mq_summary_t s = *fallback;
        s.status = status;
        s.reason = reason;
        return mq_summary_write(dir, &s);
    }
    char *reason_at = strstr(line_end, "\n  \"reason\": ");
    const char *div = line_end, *div_end = reason_at ? reason_at : old + len - 3;
    if (div_end > div && div_end[-1] == ',')
        div_end--; /* the comma before the old reason */
    bool has_reason = reason && *reason;
    mq_json_escape(status, st, sizeof st);
    mq_json_escape(has_reason ? reason : "", why, sizeof why);
    char text[8192];
    int n = snprintf(text, sizeof text, "%.*s\n  \"status\": \"%s\"%s%.*s%s%s%s\n}\n",
                     (int)(at - old), old, st, div_end > div ? "," : "", (int)(div_end - div),
                     div, has_reason ? ",\n  \"reason\": \"" : "", why, has_reason ? "\"" : "");
    free(old);
    if (n < 0 || (size_t)n >= sizeof text) {
        mq_err_set("summary of %s does not fit in %zu bytes", dir, sizeof text);
        return -1;
    }
    return s_write_summary(path, text, (size_t)n);
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
