/* Errors, logging, clocks, environment defaults, number parsing and files: the little
 * things every module needs, kept free of sockets and of the model. */
#include "mqgrad/util.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char s_err[512];
static _Thread_local char s_tag[64] = "mqgrad";
static int s_level = -1;

void mq_err_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_err, sizeof s_err, fmt, ap);
    va_end(ap);
}

const char *mq_err_last(void)
{
    return s_err[0] ? s_err : "unknown error";
}

int mq_log_parse_level(const char *name, mq_log_level_t *out)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (mq_log_level_t)i;
            return 0;
        }
    mq_err_set("log level '%s' is not one of error, warn, info, debug", name);
    return -1;
}

void mq_log_set_level(mq_log_level_t level)
{
    s_level = (int)level;
}

void mq_log_set_tag(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_tag, sizeof s_tag, fmt, ap);
    va_end(ap);
}

static int s_current_level(void)
{
    if (s_level < 0) {
        mq_log_level_t lv = MQ_LOG_INFO;
        const char *env = getenv("MQGRAD_LOG_LEVEL");
        if (env && *env && mq_log_parse_level(env, &lv) != 0)
            fprintf(stderr, "mqgrad: MQGRAD_LOG_LEVEL=%s ignored (use error|warn|info|debug)\n",
                    env);
        s_level = (int)lv;
    }
    return s_level;
}

void mq_log(mq_log_level_t level, const char *fmt, ...)
{
    if ((int)level > s_current_level())
        return;
    static const char *tags[] = {"E", "W", "I", "D"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    /* One fprintf per line so lines from several threads do not interleave. */
    fprintf(stderr, "%s %02d:%02d:%02d.%03ld [%s] %s\n", tags[level], tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000000, s_tag, line);
}

double mq_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double mq_thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int64_t mq_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

const char *mq_env_str(const char *name, const char *def)
{
    const char *v = getenv(name);
    return (v && *v) ? v : def;
}

int mq_parse_long(const char *what, const char *s, long lo, long hi, long *out)
{
    if (!s || !*s) {
        mq_err_set("%s: empty value (expected an integer in %ld..%ld)", what, lo, hi);
        return -1;
    }
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) {
        mq_err_set("%s: '%s' is not an integer in %ld..%ld", what, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int mq_parse_double(const char *what, const char *s, double lo, double hi, double *out)
{
    if (!s || !*s) {
        mq_err_set("%s: empty value (expected a number in %g..%g)", what, lo, hi);
        return -1;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) {
        mq_err_set("%s: '%s' is not a number in %g..%g", what, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static uint64_t s_splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void mq_rng_seed(mq_rng_t *rng, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        rng->s[i] = s_splitmix(&x);
}

static inline uint64_t s_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t mq_rng_next(mq_rng_t *rng)
{
    uint64_t *s = rng->s;
    uint64_t result = s_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return result;
}

float mq_rng_float(mq_rng_t *rng)
{
    return (float)(mq_rng_next(rng) >> 40) * 0x1.0p-24f;
}

double mq_rng_double(mq_rng_t *rng)
{
    return (double)(mq_rng_next(rng) >> 11) * 0x1.0p-53;
}

uint64_t mq_rng_below(mq_rng_t *rng, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = mq_rng_next(rng);
    while (x >= limit);
    return x % n;
}

double mq_rng_normal(mq_rng_t *rng)
{
    double u1 = mq_rng_double(rng), u2 = mq_rng_double(rng);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double mq_median(double *v, size_t n)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, s_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int mq_write_parts_atomic(const char *path, const void *const *data, const size_t *len, int n)
{
    /* PATH.tmp.PID.N: a name no other writer uses (N counts this process's writes, so two
     * threads never share one), created new (O_EXCL: never a file or link already there). */
    static atomic_uint seq;
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d.%u", path, (int)getpid(),
                 atomic_fetch_add(&seq, 1)) >= (int)sizeof tmp) {
        mq_err_set("%s: path too long", path);
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        mq_err_set("%s: cannot create: %s", tmp, strerror(errno));
        return -1;
    }
    for (int k = 0; k < n; k++) {
        const char *p = data[k];
        size_t left = len[k];
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                mq_err_set("%s: write failed: %s", tmp, w < 0 ? strerror(errno) : "no progress");
                close(fd);
                unlink(tmp);
                return -1;
            }
            p += w;
            left -= (size_t)w;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        mq_err_set("%s: fsync failed: %s", tmp, strerror(errno));
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        mq_err_set("%s: rename failed: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int mq_write_file_atomic(const char *path, const void *data, size_t len)
{
    return mq_write_parts_atomic(path, &data, &len, 1);
}

int mq_read_file(const char *path, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        mq_err_set("%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1)
            break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf || bad) {
        free(buf);
        mq_err_set("%s: read failed", path);
        return -1;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

void mq_default_run_dir(const char *kind, char *buf, size_t len)
{
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(buf, len, "runs/%s-%s", kind, stamp);
}

int mq_mkdirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) {
        mq_err_set("%s: path too long", path);
        return -1;
    }
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
            mq_err_set("%s: cannot create directory: %s", buf, strerror(errno));
            return -1;
        }
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) {
        mq_err_set("%s: cannot create directory: %s", buf, strerror(errno));
        return -1;
    }
    return 0;
}

void mq_help_line(char *buf, size_t len, size_t *w, int width, const char *usage,
                  const char *help)
{
    if (len == 0 || *w >= len)
        return;
    if (*w == 0)
        buf[0] = '\0';
    int k = snprintf(buf + *w, len - *w, "  %-*s %s\n", width, usage, help);
    if (k < 0)
        return;
    *w = *w + (size_t)k < len ? *w + (size_t)k : len - 1;
}

void mq_text_printf(mq_text_t *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = t->len < t->cap ? t->cap - t->len : 0;
    int n = vsnprintf(room ? t->buf + t->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        t->len += (size_t)n;
}

int mq_tmp_sweep(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int removed = 0;
    size_t blen = base ? strlen(base) : 0;
    for (struct dirent *e; (e = readdir(d));) {
        /* Only the names mq_write_parts_atomic makes: NAME.tmp.PID.N, NAME BASE when given. */
        if (base && (strncmp(e->d_name, base, blen) != 0 ||
                     strncmp(e->d_name + blen, ".tmp.", 5) != 0))
            continue;
        const char *t = base ? e->d_name + blen : strstr(e->d_name, ".tmp.");
        char *end, *end2;
        long pid = t ? strtol(t + 5, &end, 10) : 0;
        if (pid <= 0 || end == t + 5 || *end != '.' || end[1] < '0' || end[1] > '9')
            continue;
        strtoul(end + 1, &end2, 10);
        if (*end2 != '\0' || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* its writer may still be at work */
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path &&
            unlink(path) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
