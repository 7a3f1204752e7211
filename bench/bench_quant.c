/* Gradient codec micro-benchmark: for each codec, how fast encode, decode and the server's
 * decode-and-accumulate run compared with memcpy of the same fp32 buffer in the same run
 * (machines here are shared and noisy, so only ratios are results), what the payload weighs,
 * and how much it distorts a Gaussian gradient. Times are this thread's CPU time, best of R:
 * on a box shared with other jobs, wall time mostly measures the scheduler.
 *
 *   bench_quant [--n VALUES] [--reps R] [--codec SPEC]...      (defaults: 4194304, 7) */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mqgrad/quant.h"

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
    "uniform:4:stochastic:bucket=512",
};

typedef struct {
    size_t n;
    int reps;
    float *x, *y, *residual;
    uint8_t *buf;
    mq_rng_t rng;
} s_bench_t;

static double s_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best of REPS runs of one operation, in CPU seconds: the least disturbed run. */
typedef enum { S_MEMCPY, S_ENCODE, S_DECODE, S_DECODE_ACC, S_ENCODE_EF } s_op_t;

static int s_run(s_bench_t *b, const mq_codec_t *c, s_op_t op, size_t len, double *best)
{
    *best = INFINITY;
    for (int r = 0; r < b->reps; r++) {
        size_t out = 0;
        int rc = 0;
        double t0 = s_cpu_s();
        switch (op) {
        case S_MEMCPY:
            memcpy(b->y, b->x, b->n * sizeof *b->x);
            break;
        case S_ENCODE:
            rc = mq_codec_encode(c, b->x, b->n, b->buf, len, &out, &b->rng);
            break;
        case S_DECODE:
            rc = mq_codec_decode(c, b->buf, len, b->y, b->n, 1.0f, false);
            break;
        case S_DECODE_ACC:
            rc = mq_codec_decode(c, b->buf, len, b->y, b->n, 0.25f, true);
            break;
        case S_ENCODE_EF:
            rc = mq_codec_encode_ef(c, b->x, b->residual, b->n, b->buf, len, &out, &b->rng);
            break;
        }
        double t = s_cpu_s() - t0;
        if (rc < 0) {
            fprintf(stderr, "bench_quant: %s\n", mq_err_last());
            return -1;
        }
        if (t < *best)
            *best = t;
    }
    return 0;
}

/* One table row: payload, compression, error, and speeds as multiples of memcpy's. */
static int s_codec_row(s_bench_t *b, const char *spec, double t_copy)
{
    mq_codec_t c;
    if (mq_codec_parse(spec, &c) < 0) {
        fprintf(stderr, "bench_quant: %s\n", mq_err_last());
        return -1;
    }
    size_t len = mq_codec_payload_size(&c, b->n);
    double t_enc, t_dec, t_acc, t_ef;
    if (s_run(b, &c, S_ENCODE, len, &t_enc) < 0 || s_run(b, &c, S_DECODE, len, &t_dec) < 0)
        return -1;
    double err = 0, norm = 0; /* b->y holds the last decode of b->x */
    for (size_t i = 0; i < b->n; i++) {
        err += ((double)b->x[i] - b->y[i]) * ((double)b->x[i] - b->y[i]);
        norm += (double)b->x[i] * b->x[i];
    }
    if (s_run(b, &c, S_DECODE_ACC, len, &t_acc) < 0)
        return -1;
    memset(b->residual, 0, b->n * sizeof *b->residual);
    if (s_run(b, &c, S_ENCODE_EF, len, &t_ef) < 0)
        return -1;
    printf("%-32s %12zu %7.1fx %9.2e %9.3f %9.3f %9.3f %9.3f\n", spec, len,
           4.0 * (double)b->n / (double)len, sqrt(err / norm), t_copy / t_enc, t_copy / t_dec,
           t_copy / t_acc, t_copy / t_ef);
    return 0;
}

static int s_usage(const char *msg)
{
    fprintf(stderr,
            "bench_quant: %s\nusage: bench_quant [--n VALUES] [--reps R] "
            "[--codec SPEC]...\n",
            msg);
    return 2;
}

int main(int argc, char **argv)
{
    long n = 4194304, reps = 7;
    const char *given[64];
    const char **codecs = given;
    size_t ncodecs = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            return s_usage("every flag takes a value");
        if (strcmp(argv[i], "--n") == 0) {
            if (mq_parse_long("--n", argv[++i], 1, 1L << 30, &n) < 0)
                return s_usage(mq_err_last());
        } else if (strcmp(argv[i], "--reps") == 0) {
            if (mq_parse_long("--reps", argv[++i], 1, 1000, &reps) < 0)
                return s_usage(mq_err_last());
        } else if (strcmp(argv[i], "--codec") == 0) {
            if (ncodecs == sizeof given / sizeof given[0])
                return s_usage("too many --codec flags");
            given[ncodecs++] = argv[++i];
        } else {
            return s_usage("unknown flag");
        }
    }
    if (ncodecs == 0) {
        codecs = s_default_codecs;
        ncodecs = sizeof s_default_codecs / sizeof s_default_codecs[0];
    }

    s_bench_t b = {.n = (size_t)n, .reps = (int)reps};
    b.x = malloc(b.n * sizeof *b.x);
    b.y = malloc(b.n * sizeof *b.y);
    b.residual = calloc(b.n, sizeof *b.residual);
    b.buf = malloc(4 * b.n + 64);
    if (!b.x || !b.y || !b.residual || !b.buf) {
        fprintf(stderr, "bench_quant: out of memory for %ld values\n", n);
        return 1;
    }
    mq_rng_seed(&b.rng, 1);
    for (size_t i = 0; i < b.n; i++) /* a gradient-like scale; touches every page, too */
        b.x[i] = (float)(1e-3 * mq_rng_normal(&b.rng));
    memset(b.y, 0, b.n * sizeof *b.y);

    double t_copy;
    if (s_run(&b, NULL, S_MEMCPY, 0, &t_copy) < 0)
        return 1;
    printf("bench_quant: %zu values (%.1f MB fp32), best of %d (thread CPU time); speeds are "
           "multiples of memcpy of the fp32 buffer in this run (%.2f GB/s here)\n",
           b.n, 4e-6 * (double)b.n, b.reps, 4e-9 * (double)b.n / t_copy);
    printf("%-32s %12s %8s %9s %9s %9s %9s %9s\n", "codec", "payload_B", "smaller", "rel_err",
           "encode", "decode", "dec+acc", "enc_ef");
    int rc = 0;
    for (size_t k = 0; k < ncodecs && rc == 0; k++)
        rc = s_codec_row(&b, codecs[k], t_copy);
    free(b.x);
    free(b.y);
    free(b.residual);
    free(b.buf);
    return rc ? 1 : 0;
}
