/* Small shared helpers: error messages for callers, logging with a level filter, clocks,
 * environment-backed defaults and a seedable random generator whose state can be saved. */
#ifndef MQGRAD_UTIL_H
#define MQGRAD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors -------------------------------------------------------------------------
 * A function that fails returns -1 (or NULL) and leaves a message with mq_err_set; the
 * caller reads it with mq_err_last. The message is per thread. */
void mq_err_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *mq_err_last(void);

/* ---- logging ------------------------------------------------------------------------
 * Every line says which service and rank it comes from; the level filter comes from
 * MQGRAD_LOG_LEVEL (error, warn, info, debug; default info) or mq_log_set_level. */
typedef enum { MQ_LOG_ERROR = 0, MQ_LOG_WARN, MQ_LOG_INFO, MQ_LOG_DEBUG } mq_log_level_t;
void mq_log_set_level(mq_log_level_t level);
int mq_log_parse_level(const char *name, mq_log_level_t *out);
/* Sets this thread's tag ("server 1", "worker 3") printed on each of its lines. */
void mq_log_set_tag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void mq_log(mq_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define mq_error(...) mq_log(MQ_LOG_ERROR, __VA_ARGS__)
#define mq_warn(...) mq_log(MQ_LOG_WARN, __VA_ARGS__)
#define mq_info(...) mq_log(MQ_LOG_INFO, __VA_ARGS__)
#define mq_debug(...) mq_log(MQ_LOG_DEBUG, __VA_ARGS__)

/* ---- clocks -------------------------------------------------------------------------*/
/* Monotonic time in seconds / microseconds since an arbitrary origin. */
double mq_now_s(void);
/* CPU time the calling thread has used, seconds. */
double mq_thread_cpu_s(void);
int64_t mq_now_us(void);

/* ---- environment defaults -----------------------------------------------------------
 * The value of environment variable NAME if set and non-empty, else DEF. */
const char *mq_env_str(const char *name, const char *def);

/* Strict number parsing for flags and variables: the whole string must be a number in
 * [lo, hi]. On failure sets an error naming WHAT and returns -1. */
int mq_parse_long(const char *what, const char *s, long lo, long hi, long *out);
int mq_parse_double(const char *what, const char *s, double lo, double hi, double *out);

/* ---- random numbers -----------------------------------------------------------------
 * xoshiro256** seeded through splitmix64: fast, good quality, and its whole state is the
 * four public words below, so it can be saved and restored bit-exactly. */
typedef struct {
    uint64_t s[4];
} mq_rng_t;

void mq_rng_seed(mq_rng_t *rng, uint64_t seed);
uint64_t mq_rng_next(mq_rng_t *rng);
/* Uniform in [0, 1) with 24 (float) or 53 (double) random bits. */
float mq_rng_float(mq_rng_t *rng);
double mq_rng_double(mq_rng_t *rng);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t mq_rng_below(mq_rng_t *rng, uint64_t n);
/* Standard normal (Box-Muller). */
double mq_rng_normal(mq_rng_t *rng);

/* ---- statistics ---------------------------------------------------------------------
 * Sorts the N values at V ascending, in place, and returns their median (the mean of the
 * middle two when N is even; NaN when N is 0): v[0] and v[n - 1] are then the least and the
 * greatest. */
double mq_median(double *v, size_t n);

/* ---- files --------------------------------------------------------------------------
 * Writes LEN bytes to PATH atomically: a temporary file beside it, fsync, rename, fsync of
 * the directory. Either the old or the new content survives a crash. */
int mq_write_file_atomic(const char *path, const void *data, size_t len);
/* The same for a file made of N parts (DATA[k], LEN[k]) written one after another, so a big
 * file needs no buffer of its own. */
int mq_write_parts_atomic(const char *path, const void *const *data, const size_t *len, int n);
/* Removes the temporary files (NAME.tmp.PID.N, as mq_write_parts_atomic names them) that
 * writers which died left in DIR: those whose process is gone. BASE, when not NULL, limits it
 * to NAME = BASE (a directory that is not the project's own, say the one of an agent's state
 * file). Returns how many it removed (0 when DIR cannot be read). */
int mq_tmp_sweep(const char *dir, const char *base);
/* Reads a whole file into a malloc'd buffer (NUL-terminated, length without the NUL). */
int mq_read_file(const char *path, char **data, size_t *len);
/* The default run directory for a KIND of run: "runs/KIND-YYYYmmdd-HHMMSS" (UTC). */
void mq_default_run_dir(const char *kind, char *buf, size_t len);
/* mkdir -p. */
int mq_mkdirs(const char *path);

/* ---- text ---------------------------------------------------------------------------
 * A bounded appender, as snprintf: writes what fits into BUF[0..CAP) (NUL-terminated when
 * CAP > 0) and counts in LEN what the whole text needs, so a caller whose buffer was too
 * small knows how much to give next time. */
typedef struct {
    char *buf;
    size_t cap, len;
} mq_text_t;
void mq_text_printf(mq_text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends "  USAGE HELP\n" (USAGE padded to WIDTH) to BUF[*W..LEN), keeping *W at the end of
 * what fits and BUF terminated: one line of a --help list built from a plug-in table. */
void mq_help_line(char *buf, size_t len, size_t *w, int width, const char *usage,
                  const char *help);

#ifdef __cplusplus
}
#endif
#endif
