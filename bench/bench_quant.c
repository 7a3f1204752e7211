/* Gradient codec micro-benchmark: for each codec, how fast encode, decode, the server's
 * decode-and-accumulate and error feedback (from a residual array of its own, and in place as
 * a worker runs it) run compared with memcpy of the same fp32 buffer in the same run
 * (machines here are shared and noisy, so only ratios are results; every timed run follows
 * a memcpy, and each ratio is the best of those memcpys over the best of the runs), what
 * the payload weighs, and how much it distorts a Gaussian gradient:
 * ||decode(encode(x)) - x||^2 / ||x||^2. The default rows are the uniform
 * codec's settings MQGrad uses, then every registered codec (mq_codec_all) at a
 * representative spec, taken through its operations table only: its name, 4 bits clamped to
 * the level range it takes, and the same with :bucket=512 where its options accept that.
 * Stochastic codecs get a generator, stateful ones their state (zeroed before every encode,
 * so a row measures a first iteration). Then what asking for mq_codec_stats_t costs: encode
 * and decode with stats against the same calls without, alternated so both see the same
 * machine. Then PyTorch's per-tensor 8-bit quantization on the same size, run by
 * bench/torch_quant.py under /usr/bin/python3 (Debian's python3-torch), against uniform:8.
 * Times are this thread's CPU time, best of R: on a box shared with other jobs, wall time
 * mostly measures the scheduler.
 *
 *   bench_quant [--n VALUES] [--reps R] [--codec SPEC]...
 *               [--kernels c|sse2|avx2|avx512|avx512w] [--torch 0|1] [--rounds N]
 *
 * (defaults: 16777216 values, the MQGrad paper's FC layer; 7 reps; the fastest kernels; torch
 * on; 1 round). With N rounds the floors and the codec table are measured N times and a last
 * table gives each ratio's median and range over the rounds. The stats table has the --codec
 * rows when given, else s_stats_codecs; its differences are a few percent, so give it more
 * reps (31) on a busy machine. A row whose codec fails prints the error and the run exits 1
 * after the tables. */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/src/quant/quant_internal.h" /* mq_quant_use_kernels */
#include "mqgrad/quant.h"
#include "mqgrad/service.h"

#ifndef MQ_BENCH_DIR
#define MQ_BENCH_DIR "bench"
#endif
#define S_PYTHON "/usr/bin/python3" /* Debian's torch is importable by this one only */

/* The stats table's default rows: the bit-widths MQGrad picks, one range and buckets. */
static const char *s_stats_codecs[] = {
    "uniform:2",           "uniform:4",           "uniform:8",
    "uniform:2:bucket=512", "uniform:4:bucket=512", "uniform:8:bucket=512",
};

static const char *s_default_codecs[] = {
    "none",
    "uniform:1",
    "uniform:2",
    "uniform:3",
    "uniform:4",
    "uniform:6",
    "uniform:8",
    "uniform:2:bucket=512",
    "uniform:4:bucket=512",
    "uniform:8:bucket=512",
    "uniform:4:bucket=64",
    "uniform:2:stochastic",
    "uniform:4:stochastic",
    "uniform:8:stochastic",
    "uniform:2:stochastic:bucket=512",
    "uniform:4:stochastic:bucket=512",
    "uniform:8:stochastic:bucket=512",
};

#define S_MAX_ROUNDS 1000 /* --rounds */

/* One row a registered codec, plus its bucketed form: room for every registry. */
#define S_MAX_ROWS 96

typedef struct {
    size_t n;
    int reps;
    float *x, *y, *residual;
    uint8_t *buf;
    size_t cap;   /* bytes at buf */
    size_t len;   /* the last encode's payload size */
    float *state; /* a stateful codec's state (grown as needed) */
    size_t state_n;
    mq_rng_t rng;
} s_bench_t;

/* Room for C's payload and state; -1 if out of memory. */
static int s_reserve(s_bench_t *b, const mq_codec_t *c)
{
    size_t cap = mq_codec_payload_size(c, b->n), sn = mq_codec_state_floats(c, b->n);
    if (cap > b->cap) {
        uint8_t *p = realloc(b->buf, cap);
        if (!p)
            return -1;
        b->buf = p, b->cap = cap;
    }
    if (sn > b->state_n) {
        float *p = realloc(b->state, sn * sizeof *p);
        if (!p)
            return -1;
        b->state = p, b->state_n = sn;
    }
    return 0;
}

static double s_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef enum {
    S_MEMCPY,
    S_ENCODE,
    S_DECODE,
    S_DECODE_ACC,
    S_ENCODE_EF,
    S_ENCODE_EF_INPLACE,
    S_SCAN,
    S_ADD
} s_op_t;

/* One run of one operation, in CPU seconds (-1 on error); STATS as the codec calls take.
 * An encode writes b->buf (b->cap bytes) and leaves its size in b->len, which the decodes
 * read; a stateful codec's state is zeroed first, untimed. */
static double s_once(s_bench_t *b, const mq_codec_t *c, s_op_t op, mq_codec_stats_t *stats)
{
    size_t out = 0, sn = op == S_ENCODE ? mq_codec_state_floats(c, b->n) : 0;
    mq_codec_ctx_t ctx = {.rng = &b->rng, .state = sn ? b->state : NULL};
    if (sn)
        memset(b->state, 0, sn * sizeof *b->state);
    int rc = 0;
    double t0 = s_cpu_s();
    switch (op) {
    case S_MEMCPY:
        memcpy(b->y, b->x, b->n * sizeof *b->x);
        break;
    case S_ENCODE:
        rc = mq_codec_encode_ctx(c, b->x, b->n, &ctx, b->buf, b->cap, &out, stats);
        break;
    case S_DECODE:
        rc = mq_codec_decode(c, b->buf, b->len, b->y, b->n, 1.0f, false, stats);
        break;
    case S_DECODE_ACC:
        rc = mq_codec_decode(c, b->buf, b->len, b->y, b->n, 0.25f, true, stats);
        break;
    case S_ENCODE_EF:
        rc = mq_codec_encode_ef(c, b->x, b->residual, b->n, b->buf, b->cap, &out, &b->rng, stats);
        break;
    case S_ENCODE_EF_INPLACE: /* the residual holds the sums (s_run put the gradient there) */
        rc = mq_codec_encode_ef_inplace(c, b->residual, b->n, b->buf, b->cap, &out, &b->rng, stats);
        break;
    case S_SCAN: { /* the range pass of an encode with bucket=0 */
        float lo, hi;
        mq_quant_kernels()->minmax(b->x, b->n, &lo, &hi);
        break;
    }
    case S_ADD: /* error feedback's memory traffic: residual += gradient */
        mq_quant_kernels()->add(b->residual, b->x, b->n);
        break;
    }
    double t = s_cpu_s() - t0;
    if (rc < 0)
        return -1;
    if (op == S_ENCODE || op == S_ENCODE_EF || op == S_ENCODE_EF_INPLACE)
        b->len = out;
    return t;
}

/* Best of REPS runs of one operation, in CPU seconds (the least disturbed run), each run
 * right after a memcpy of the buffer, whose best time goes to *COPY: the memory bandwidth
 * this machine's neighbours leave drifts over seconds, and a ratio of runs taken side by side
 * drifts far less than one of runs taken a second apart. In place, the residual is given the
 * gradient's values before that memcpy (which then pushes them out of the caches): what a
 * worker's model leaves there, with no residual of residuals shrinking run after run. */
static int s_run(s_bench_t *b, const mq_codec_t *c, s_op_t op, double *best, double *copy)
{
    *best = *copy = INFINITY;
    for (int r = 0; r < b->reps; r++) {
        if (op == S_ENCODE_EF_INPLACE)
            memcpy(b->residual, b->x, b->n * sizeof *b->x);
        double tc = s_once(b, NULL, S_MEMCPY, NULL), t = s_once(b, c, op, NULL);
        if (t < 0)
            return -1;
        *best = t < *best ? t : *best;
        *copy = tc < *copy ? tc : *copy;
    }
    return 0;
}

/* Best of REPS runs of OP without and with stats, alternated so that a change in the load
 * of the machine hits both. */
static int s_run_pair(s_bench_t *b, const mq_codec_t *c, s_op_t op, double best[2],
                      mq_codec_stats_t *stats)
{
    best[0] = best[1] = INFINITY;
    for (int r = 0; r < b->reps; r++)
        for (int with = 0; with < 2; with++) {
            double t = s_once(b, c, op, with ? stats : NULL);
            if (t < 0)
                return -1;
            if (t < best[with])
                best[with] = t;
        }
    return 0;
}

/* One row of the stats table: time with stats / time without for encode and decode, and
 * what the stats say (decoded sum of squares / the input's). */
static int s_stats_row(s_bench_t *b, const char *spec, double norm)
{
    mq_codec_t c;
    double enc[2], dec[2];
    mq_codec_stats_t st;
    if (mq_codec_parse(spec, &c) < 0 || s_reserve(b, &c) < 0 ||
        s_run_pair(b, &c, S_ENCODE, enc, &st) < 0 || s_run_pair(b, &c, S_DECODE, dec, &st) < 0) {
        printf("%-32s failed: %s\n", spec, mq_err_last());
        return 1;
    }
    printf("%-32s %9.1f %9.3f %+8.1f%% %9.3f %+8.1f%% %11.3f\n", spec, 1e3 * enc[0],
           enc[1] / enc[0], 100 * (enc[1] / enc[0] - 1), dec[1] / dec[0],
           100 * (dec[1] / dec[0] - 1), st.sq / norm);
    fflush(stdout);
    return 0;
}

static int s_stats_table(s_bench_t *b, const char **codecs, size_t ncodecs)
{
    double norm = 0;
    for (size_t i = 0; i < b->n; i++)
        norm += (double)b->x[i] * b->x[i];
    printf("\nstats (mq_codec_stats_t): time with / time without, best of %d each, alternated\n",
           b->reps);
    printf("%-32s %9s %9s %9s %9s %9s %11s\n", "codec", "enc_ms", "enc_ratio", "enc_cost",
           "dec_ratio", "dec_cost", "sq/sum_x^2");
    int failed = 0;
    for (size_t k = 0; k < ncodecs; k++)
        failed += s_stats_row(b, codecs[k], norm);
    return failed;
}

/* A row's speeds in one round, as multiples of memcpy's (ef, ef_in: NAN for a codec that keeps
 * its own state; ef_add: enc_ef over the add pass timed in the same round; ef_in: error
 * feedback in place, mq_codec_encode_ef_inplace, as a worker runs it). */
enum { S_COL_ENC, S_COL_DEC, S_COL_ACC, S_COL_EF, S_COL_EF_ADD, S_COL_EF_IN, S_NCOLS };
/* A round's floors: the read-only pass and the add pass, as multiples of memcpy's. */
enum { S_FLOOR_READ, S_FLOOR_ADD, S_NFLOORS };

/* One table row: payload, compression, distortion, and speeds as multiples of memcpy's,
 * which go to SPEED (S_NCOLS values; the add pass's ratio ADD gives the last). A codec that
 * fails gets its error in the row and 1 back; -1 is for the run's own errors. */
static int s_codec_row(s_bench_t *b, const char *spec, double add, double *speed)
{
    mq_codec_t c;
    double t_enc, t_dec, t_acc, t_ef = 0, t_in = 0, c_enc, c_dec, c_acc, c_ef = 0, c_in = 0;
    for (int k = 0; k < S_NCOLS; k++)
        speed[k] = NAN; /* a row that fails has no speeds */
    if (mq_codec_parse(spec, &c) == 0 && s_reserve(b, &c) < 0) {
        fprintf(stderr, "bench_quant: %s: out of memory\n", spec);
        return -1;
    }
    if (mq_codec_parse(spec, &c) < 0 || s_run(b, &c, S_ENCODE, &t_enc, &c_enc) < 0 ||
        s_run(b, &c, S_DECODE, &t_dec, &c_dec) < 0) {
        printf("%-32s failed: %s\n", spec, mq_err_last());
        fflush(stdout);
        return 1;
    }
    double err = 0, norm = 0; /* b->y holds the last decode of b->x */
    for (size_t i = 0; i < b->n; i++) {
        err += ((double)b->x[i] - b->y[i]) * ((double)b->x[i] - b->y[i]);
        norm += (double)b->x[i] * b->x[i];
    }
    size_t len = b->len;
    if (s_run(b, &c, S_DECODE_ACC, &t_acc, &c_acc) < 0) {
        printf("%-32s failed: %s\n", spec, mq_err_last());
        return 1;
    }
    /* Error feedback around the codec, for the stateless ones (the others keep their own) */
    bool ef = mq_codec_state_floats(&c, b->n) == 0;
    if (ef) {
        memset(b->residual, 0, b->n * sizeof *b->residual);
        if (s_run(b, &c, S_ENCODE_EF, &t_ef, &c_ef) < 0 ||
            s_run(b, &c, S_ENCODE_EF_INPLACE, &t_in, &c_in) < 0) {
            printf("%-32s failed: %s\n", spec, mq_err_last());
            return 1;
        }
    }
    speed[S_COL_ENC] = c_enc / t_enc;
    speed[S_COL_DEC] = c_dec / t_dec;
    speed[S_COL_ACC] = c_acc / t_acc;
    speed[S_COL_EF] = ef ? c_ef / t_ef : NAN;
    speed[S_COL_EF_ADD] = speed[S_COL_EF] / add;
    speed[S_COL_EF_IN] = ef ? c_in / t_in : NAN;
    char ef_col[32] = "        -         -";
    if (ef)
        snprintf(ef_col, sizeof ef_col, "%9.3f %9.3f", speed[S_COL_EF], speed[S_COL_EF_IN]);
    double t_copy = fmin(fmin(c_enc, c_dec), ef ? fmin(fmin(c_acc, c_ef), c_in) : c_acc);
    printf("%-32s %12zu %7.1fx %10.3e %9.3f %9.3f %9.3f %s %9.2f\n", spec, len,
           4.0 * (double)b->n / (double)len, err / norm, speed[S_COL_ENC], speed[S_COL_DEC],
           speed[S_COL_ACC], ef_col, 4e-9 * (double)b->n / t_copy);
    fflush(stdout);
    return 0;
}

/* Adds SPEC to the row list unless a row already has the same codec. */
static void s_add_row(const char **rows, size_t *nrows, char (*store)[MQ_CODEC_MAX_SPEC],
                      size_t *nstore, const char *spec)
{
    mq_codec_t c, r;
    if (mq_codec_parse(spec, &c) < 0 || *nrows == S_MAX_ROWS || *nstore == S_MAX_ROWS)
        return;
    for (size_t i = 0; i < *nrows; i++)
        if (mq_codec_parse(rows[i], &r) == 0 && mq_codec_equal(&r, &c))
            return;
    snprintf(store[*nstore], MQ_CODEC_MAX_SPEC, "%s", spec);
    rows[(*nrows)++] = store[(*nstore)++];
}

/* The default rows: MQGrad's uniform settings, then each registered codec at 4 bits (or the
 * nearest level it takes; none if it takes none) with its default options, and bucketed by
 * 512 when that is one of its options. */
static size_t s_default_rows(const char **rows, char (*store)[MQ_CODEC_MAX_SPEC])
{
    size_t nrows = 0, nstore = 0, ncodecs;
    for (size_t i = 0; i < sizeof s_default_codecs / sizeof *s_default_codecs; i++)
        rows[nrows++] = s_default_codecs[i];
    const mq_codec_ops_t *const *all = mq_codec_all(&ncodecs);
    for (size_t k = 0; k < ncodecs; k++) {
        const mq_codec_ops_t *ops = all[k];
        char spec[MQ_CODEC_MAX_SPEC], bucketed[MQ_CODEC_MAX_SPEC + 16];
        if (ops->max_bits > 0) {
            int bits = 4 < ops->min_bits ? ops->min_bits : 4 > ops->max_bits ? ops->max_bits : 4;
            snprintf(spec, sizeof spec, "%s:%d", ops->name, bits);
        } else {
            snprintf(spec, sizeof spec, "%s", ops->name);
        }
        s_add_row(rows, &nrows, store, &nstore, spec);
        snprintf(bucketed, sizeof bucketed, "%s:bucket=512", spec);
        s_add_row(rows, &nrows, store, &nstore, bucketed);
    }
    return nrows;
}

/* Reads NAME's number from torch_quant.py's one-line JSON; -1 if it is not there. */
static double s_json_num(const char *json, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *p = strstr(json, key);
    return p ? strtod(p + strlen(key), NULL) : -1.0;
}

/* PyTorch's quantize_per_tensor / dequantize against our uniform:8 encode / decode, both
 * timed in this run on the same number of values. Torch times its own input; the ratios
 * compare GB/s of fp32 input. */
static int s_torch_rows(s_bench_t *b)
{
    char cmd[512], json[1024] = "";
    snprintf(cmd, sizeof cmd, "%s %s/torch_quant.py --n %zu --reps %d 2>&1", S_PYTHON, MQ_BENCH_DIR,
             b->n, b->reps);
    FILE *f = popen(cmd, "r");
    if (f) {
        if (!fgets(json, sizeof json, f))
            json[0] = 0;
        pclose(f);
    }
    double tq = s_json_num(json, "quantize_gbps"), tdq = s_json_num(json, "dequantize_gbps");
    double trq = s_json_num(json, "range_quantize_gbps");
    if (!strstr(json, "\"available\": true") || tq <= 0 || tdq <= 0) {
        json[strcspn(json, "\n")] = 0;
        printf("torch not available: skipped (%s: %s)\n", cmd, json[0] ? json : "no output");
        return 0;
    }
    mq_codec_t c = {.id = MQ_CODEC_ID_uniform, .bits = 8};
    double t_copy, c_dec, t_enc, t_dec;
    if (s_reserve(b, &c) < 0 || s_run(b, &c, S_ENCODE, &t_enc, &t_copy) < 0 ||
        s_run(b, &c, S_DECODE, &t_dec, &c_dec) < 0) {
        fprintf(stderr, "bench_quant: uniform:8: %s\n", mq_err_last());
        return -1;
    }
    double gb = 4e-9 * (double)b->n, enc = gb / t_enc, dec = gb / t_dec;
    t_copy = fmin(t_copy, c_dec);
    char ver[32] = "?";
    const char *v = strstr(json, "\"torch\": \"");
    if (v)
        snprintf(ver, sizeof ver, "%.*s", (int)strcspn(v + 10, "\""), v + 10);
    printf("\ntorch %s quint8, 1 thread, %zu values (GB/s of fp32 input; memcpy %.2f GB/s here)\n",
           ver, b->n, gb / t_copy);
    printf("  uniform:8 encode %.2f / torch.quantize_per_tensor %.2f  = %.2fx\n", enc, tq,
           enc / tq);
    if (trq > 0)
        printf("  uniform:8 encode %.2f / torch.aminmax + quantize_per_tensor %.2f  = %.2fx\n", enc,
               trq, enc / trq);
    printf("  uniform:8 decode %.2f / torch .dequantize() %.2f  = %.2fx\n", dec, tdq, dec / tdq);
    return 0;
}

/* One round: the floors (the read-only and add passes) and the codec table. Its ratios go
 * to OUT: the S_NFLOORS floors, then S_NCOLS speeds a row. The number of rows that failed
 * back, or -1 on the run's own errors. */
static int s_round(s_bench_t *b, const char **codecs, size_t ncodecs, double *out)
{
    double *floors = out;
    /* The floor under a bucket=0 encode: its range needs a read of the whole tensor before
     * any code can be written, then quantizing reads it again (it no longer fits a cache). */
    double t_read, c_read, t_add, c_add;
    if (s_run(b, NULL, S_SCAN, &t_read, &c_read) < 0)
        return -1;
    printf("bench_quant: %zu values (%.1f MB fp32), best of %d (thread CPU time), %s kernels; "
           "speeds are multiples of memcpy of the fp32 buffer, each run right after one "
           "(%.2f GB/s at the start)\n",
           b->n, 4e-6 * (double)b->n, b->reps, mq_quant_kernels()->name,
           4e-9 * (double)b->n / c_read);
    printf("read-only pass (the range scan) %.2f GB/s = %.3fx memcpy: an encode with bucket=0 "
           "reads the tensor twice, which past the caches keeps it under about %.2fx here\n",
           4e-9 * (double)b->n / t_read, c_read / t_read, c_read / (2 * t_read));
    /* The floor under any enc_ef with an fp32 residual: the gradient and the residual are
     * read and the residual written, 12 bytes a value where memcpy moves 8. */
    if (s_run(b, NULL, S_ADD, &t_add, &c_add) < 0)
        return -1;
    memset(b->residual, 0, b->n * sizeof *b->residual);
    printf("add pass (residual += gradient: error feedback's traffic) %.3fx memcpy: enc_ef "
           "cannot pass it, nor, with bucket=0, about %.2fx (a read-only range pass first)\n",
           c_add / t_add, 1.0 / (2 * t_read / c_read + t_add / c_add));
    printf("%-32s %12s %8s %10s %9s %9s %9s %9s %9s %9s\n", "codec", "payload_B", "smaller",
           "distortion", "encode", "decode", "dec+acc", "enc_ef", "ef_inpl", "cpy_GB/s");
    floors[S_FLOOR_READ] = c_read / t_read;
    floors[S_FLOOR_ADD] = c_add / t_add;
    int failed = 0;
    for (size_t k = 0; k < ncodecs; k++) {
        int rc = s_codec_row(b, codecs[k], floors[S_FLOOR_ADD], floors + S_NFLOORS + k * S_NCOLS);
        if (rc < 0)
            return -1;
        failed += rc;
    }
    return failed;
}

/* "median (min-max)" of the N values at V with stride STRIDE, NaNs left out ("-" if all are),
 * into OUT. */
static void s_spread(const double *v, size_t n, size_t stride, char *out, size_t len)
{
    double w[S_MAX_ROUNDS];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (!isnan(v[i * stride]))
            w[m++] = v[i * stride];
    if (m == 0) {
        snprintf(out, len, "-");
        return;
    }
    double med = mq_median(w, m);
    snprintf(out, len, "%.3f (%.3f-%.3f)", med, w[0], w[m - 1]);
}

/* The rounds' ratios (laid out as s_round leaves them) as medians and ranges: on a machine
 * whose memory bandwidth drifts by 10-20 % from one minute to the next, the median of many
 * paired rounds is the figure to compare, and enc_ef / add pass (both timed in the same
 * round) drifts less than either. */
static void s_summary(const char **codecs, size_t ncodecs, const double *speed, size_t nrounds)
{
    const size_t stride = ncodecs * S_NCOLS + S_NFLOORS;
    char cell[S_NCOLS][48];
    s_spread(speed + S_FLOOR_READ, nrounds, stride, cell[0], sizeof cell[0]);
    s_spread(speed + S_FLOOR_ADD, nrounds, stride, cell[1], sizeof cell[1]);
    printf("\nover %zu rounds, medians (min-max) of each round's ratio: read-only pass %s, "
           "add pass %s\n",
           nrounds, cell[0], cell[1]);
    printf("%-32s %-20s %-20s %-20s %-20s %-20s %-20s\n", "codec", "encode", "decode", "dec+acc",
           "enc_ef", "enc_ef/add_pass", "ef_inpl");
    for (size_t k = 0; k < ncodecs; k++) {
        for (int col = 0; col < S_NCOLS; col++)
            s_spread(speed + S_NFLOORS + k * S_NCOLS + col, nrounds, stride, cell[col],
                     sizeof cell[col]);
        if (strcmp(cell[S_COL_ENC], "-") == 0) { /* every row that runs has an encode */
            printf("%-32s failed\n", codecs[k]);
            continue;
        }
        printf("%-32s %-20s %-20s %-20s %-20s %-20s %-20s\n", codecs[k], cell[S_COL_ENC],
               cell[S_COL_DEC], cell[S_COL_ACC], cell[S_COL_EF], cell[S_COL_EF_ADD],
               cell[S_COL_EF_IN]);
    }
    fflush(stdout);
}

/* Moves every --codec SPEC (or --codec=SPEC) of ARGV to GIVEN, up to MAX of them, and the
 * other arguments to REST for mq_flags_parse, whose table holds one value a flag where
 * --codec is given once a row. A last --codec without its value stays in REST, so that the
 * parser names it. -1 past MAX. */
static int s_take_codecs(int argc, char **argv, const char **given, size_t max, size_t *ngiven,
                         char **rest, int *nrest)
{
    *ngiven = 0;
    rest[0] = argv[0];
    *nrest = 1;
    for (int i = 1; i < argc; i++) {
        const char *spec = NULL;
        if (strcmp(argv[i], "--codec") == 0 && i + 1 < argc)
            spec = argv[++i];
        else if (strncmp(argv[i], "--codec=", 8) == 0)
            spec = argv[i] + 8;
        if (!spec) {
            rest[(*nrest)++] = argv[i];
            continue;
        }
        if (*ngiven == max)
            return -1;
        given[(*ngiven)++] = spec;
    }
    rest[*nrest] = NULL;
    return 0;
}

int main(int argc, char **argv)
{
    long n = 16777216, reps = 7, torch = 1, rounds = 1;
    char kernels[16] = "";
    char codec[MQ_CODEC_MAX_SPEC] = ""; /* for --help: s_take_codecs takes --codec out first */
    const mq_flag_t flags[] = {
        {"n", NULL, MQ_FLAG_LONG, &n, 0, 1, 1L << 30,
         "values in the tensor (the default: the MQGrad paper's FC layer)"},
        {"reps", NULL, MQ_FLAG_LONG, &reps, 0, 1, 1000, "runs of each operation; the best counts"},
        {"codec", NULL, MQ_FLAG_STR, codec, sizeof codec, 0, 0,
         "SPEC: a row of the table; given once a row (not given: every registered codec)"},
        {"kernels", NULL, MQ_FLAG_STR, kernels, sizeof kernels, 1, 0,
         "c, sse2, avx2, avx512 or avx512w (not given: the fastest this CPU runs)"},
        {"torch", NULL, MQ_FLAG_LONG, &torch, 0, 0, 1, "0 skips the PyTorch rows"},
        {"rounds", NULL, MQ_FLAG_LONG, &rounds, 0, 1, S_MAX_ROUNDS,
         "times the floors and the codec table are measured; more than 1 adds the medians"},
        {0},
    };
    const char *given[64], *rows[S_MAX_ROWS + 32];
    static char store[S_MAX_ROWS][MQ_CODEC_MAX_SPEC];
    const char **codecs = given;
    size_t ncodecs = 0;
    char *rest[argc + 1];
    int nrest = 0;
    const size_t max_given = sizeof given / sizeof given[0];
    argv[0] = "bench_quant"; /* the parser's messages name the program as the others here do */
    if (s_take_codecs(argc, argv, given, max_given, &ncodecs, rest, &nrest) < 0) {
        fprintf(stderr, "bench_quant: too many --codec flags (at most %zu)\n", max_given);
        return 2;
    }
    int parsed = mq_flags_parse(flags, nrest, rest,
                                "usage: bench_quant [--n VALUES] [--reps R] [--codec SPEC]...\n"
                                "                   [--kernels c|sse2|avx2|avx512|avx512w] "
                                "[--torch 0|1] [--rounds N]",
                                NULL, 0, NULL);
    if (parsed != 0)
        return parsed == 1 ? 0 : parsed;
    if (kernels[0] && mq_quant_use_kernels(kernels) < 0) {
        fprintf(stderr, "bench_quant: --kernels: %s\n", mq_err_last());
        return 2;
    }
    bool defaults = ncodecs == 0;
    if (defaults) {
        codecs = rows;
        ncodecs = s_default_rows(rows, store);
    }

    s_bench_t b = {.n = (size_t)n, .reps = (int)reps};
    b.x = malloc(b.n * sizeof *b.x);
    b.y = malloc(b.n * sizeof *b.y);
    b.residual = calloc(b.n, sizeof *b.residual);
    b.cap = 4 * b.n + 64;
    b.buf = malloc(b.cap);
    if (!b.x || !b.y || !b.residual || !b.buf) {
        fprintf(stderr, "bench_quant: out of memory for %ld values\n", n);
        return 1;
    }
    mq_rng_seed(&b.rng, 1);
    for (size_t i = 0; i < b.n; i++) /* a gradient-like scale; touches every page, too */
        b.x[i] = (float)(1e-3 * mq_rng_normal(&b.rng));
    memset(b.y, 0, b.n * sizeof *b.y);

    const size_t nrounds = (size_t)rounds;
    double *speed = malloc(nrounds * (ncodecs * S_NCOLS + S_NFLOORS) * sizeof *speed);
    if (!speed) {
        fprintf(stderr, "bench_quant: out of memory for %zu rounds\n", nrounds);
        return 1;
    }
    int rc = 0, failed = 0;
    for (size_t r = 0; r < nrounds && rc >= 0; r++) {
        if (nrounds > 1)
            printf("%sround %zu of %zu\n", r ? "\n" : "", r + 1, nrounds);
        rc = s_round(&b, codecs, ncodecs, speed + r * (ncodecs * S_NCOLS + S_NFLOORS));
        if (r == 0 && rc > 0) /* a codec that fails, fails every round */
            failed = rc;
    }
    if (rc >= 0 && nrounds > 1)
        s_summary(codecs, ncodecs, speed, nrounds);
    free(speed);
    if (rc >= 0)
        failed += defaults ? s_stats_table(&b, s_stats_codecs,
                                           sizeof s_stats_codecs / sizeof *s_stats_codecs)
                           : s_stats_table(&b, codecs, ncodecs);
    if (rc >= 0 && torch)
        rc = s_torch_rows(&b);
    if (failed)
        fprintf(stderr, "bench_quant: %d codec row%s failed (see the table)\n", failed,
                failed > 1 ? "s" : "");
    free(b.x);
    free(b.y);
    free(b.residual);
    free(b.buf);
    free(b.state);
    return rc < 0 || failed ? 1 : 0;
}
