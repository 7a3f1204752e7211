/* bench_nn: training-step throughput of the paper model (batch 32, forward + backward + SGD)
 * on 1 and 2 OpenBLAS threads, beside PyTorch running the same network (bench/torch_cnn.py)
 * and beside a large square cblas_sgemm, all measured in the same run. The results are the
 * ratios (ours / torch, step FLOP rate / sgemm peak); bare rates are printed as context. */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "mqgrad/nn.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"

#define BATCH 32

/* FLOPs of one training step of the paper model (C = 1): 2*m*n*k per matrix product; the
 * convolutions and FC layers run one product forward, one for the weight gradient and one for
 * the input gradient (none for conv1, whose input is the data). Element-wise work ignored. */
static double s_step_flops(void)
{
    const double n = BATCH;
    double conv1 = 2 * n * 784 * 25 * 64 * 2;
    double conv2 = 2 * n * 196 * 1600 * 64 * 3;
    double fc = 2 * n * (3136.0 * 2304 + 2304.0 * 3840 + 3840.0 * 10) * 3;
    return conv1 + conv2 + fc;
}

/* Best GFLOP/s of seven N x N x N sgemms after one to warm up (the best of three moved by
 * 15 % from run to run on a shared 2-core VM, and a low peak flatters the ratios). */
static double s_sgemm_peak(int n)
{
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n),
          *c = malloc(sizeof(float) * n * n);
    for (int i = 0; i < n * n; i++)
        a[i] = (float)(i % 17) / 17, b[i] = (float)(i % 13) / 13;
    double best = 0;
    for (int r = 0; r < 8; r++) {
        double t0 = mq_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double g = 2.0 * n * n * n / (mq_now_s() - t0) / 1e9;
        if (r > 0 && g > best) /* the first run warms up the threads and caches */
            best = g;
    }
    free(a), free(b), free(c);
    return best;
}

/* Best images/s over ROUNDS rounds of STEPS training steps of the paper model. */
static double s_ours(mq_model_t *m, int steps, int rounds)
{
    float *x = malloc(sizeof(float) * BATCH * 784);
    uint8_t y[BATCH];
    mq_rng_t rng;
    mq_rng_seed(&rng, 1);
    for (int i = 0; i < BATCH * 784; i++)
        x[i] = mq_rng_float(&rng) * 2 - 1;
    for (int i = 0; i < BATCH; i++)
        y[i] = (uint8_t)(i % 10);
    double best = 0;
    mq_model_grad(m, x, y, BATCH); /* warm-up */
    for (int r = 0; r < rounds; r++) {
        double t0 = mq_now_s();
        for (int s = 0; s < steps; s++) {
            mq_model_grad(m, x, y, BATCH);
            mq_sgd_update(mq_model_params(m), mq_model_grads(m), mq_model_nparams(m), 0.01f);
        }
        double ips = BATCH * steps / (mq_now_s() - t0);
        best = ips > best ? ips : best;
    }
    free(x);
    return best;
}

/* images/s of bench/torch_cnn.py at THREADS threads, or 0 (with a message) if it cannot run. */
static double s_torch(const char *script, int threads, int steps)
{
    char cmd[1200], line[256];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' --threads %d --batch %d --steps %d 2>&1",
             script, threads, BATCH, steps);
    FILE *p = popen(cmd, "r");
    double ips = 0;
    if (!p)
        return 0;
    while (fgets(line, sizeof line, p))
        if (sscanf(line, "images_per_s %lf", &ips) != 1)
            fprintf(stderr, "  torch: %s", line);
    int rc = pclose(p);
    if (rc != 0 || ips <= 0) {
        printf("  torch: skipped (%s exited with status %d; is python3-torch installed?)\n",
               script, rc);
        return 0;
    }
    return ips;
}

/* --layers: STEPS profiled steps at each thread count, each stage timed on its own in every
 * step; per stage the median and the least over the steps, in ms, and the median's share of
 * the median step, the SGD update (what a server does, timed here for scale) as the last row.
 * On a shared machine a stage's mean carries every step some neighbour slowed; the median
 * and the least of each stage compare across builds far better (bench/README.md). */
static void s_layers(mq_model_t *m, int steps)
{
    float *x = malloc(sizeof(float) * BATCH * 784);
    uint8_t y[BATCH];
    /* per step: the stages, then the update, then the whole step */
    const int cols = MQ_NN_NSTAGES + 2;
    double *t = malloc(sizeof(double) * (size_t)steps * cols),
           *col = malloc(sizeof(double) * steps);
    if (!x || !t || !col) {
        fprintf(stderr, "bench_nn: out of memory for %d steps\n", steps);
        exit(1);
    }
    for (int i = 0; i < BATCH * 784; i++)
        x[i] = (float)(i % 17) / 17 - 0.5f;
    for (int i = 0; i < BATCH; i++)
        y[i] = (uint8_t)(i % 10);
    for (int th = 1; th <= 2; th++) {
        mq_nn_set_threads(th);
        mq_model_grad(m, x, y, BATCH); /* warm-up */
        for (int s = 0; s < steps; s++) {
            double *row = t + (size_t)s * cols;
            memset(row, 0, sizeof(double) * cols);
            mq_model_profile(m, row);
            double t0 = mq_now_s();
            mq_model_grad(m, x, y, BATCH);
            mq_model_profile(m, NULL);
            double u0 = mq_now_s();
            mq_sgd_update(mq_model_params(m), mq_model_grads(m), mq_model_nparams(m), 1e-4f);
            double t1 = mq_now_s();
            row[MQ_NN_NSTAGES] = t1 - u0;
            row[MQ_NN_NSTAGES + 1] = t1 - t0;
        }
        double med[MQ_NN_NSTAGES + 2], least[MQ_NN_NSTAGES + 2];
        for (int c = 0; c < cols; c++) {
            for (int s = 0; s < steps; s++)
                col[s] = t[(size_t)s * cols + c];
            med[c] = mq_median(col, (size_t)steps);
            least[c] = col[0];
        }
        const double step = med[MQ_NN_NSTAGES + 1];
        printf("threads %d: a step %.1f ms (median of %d; least %.1f), of which (ms, median and "
               "least; median's share of the median step):\n",
               th, step * 1e3, steps, least[MQ_NN_NSTAGES + 1] * 1e3);
        for (int i = 0; i <= MQ_NN_NSTAGES; i++)
            if (med[i] > 0) /* a stage the model has not: zero in every step */
                printf("  %-22s %7.2f %7.2f  %5.1f %%\n",
                       i < MQ_NN_NSTAGES ? mq_nn_stage_name(i) : "sgd update", med[i] * 1e3,
                       least[i] * 1e3, 100 * med[i] / step);
    }
    free(x);
    free(t);
    free(col);
}

int main(int argc, char **argv)
{
    mq_nn_pick_blas_core(argv); /* the kernels the services would use */
    argv[0] = "bench_nn";       /* the parser's messages name the program as the others here do */
    bool layers = false;
    int torch = 1;
    const mq_flag_t flags[] = {
        {"layers", NULL, MQ_FLAG_BOOL, &layers, 0, 0, 0,
         "the step profiled stage by stage at 1 and 2 threads (each stage's median and least "
         "over the steps, ms)"},
        {"torch", NULL, MQ_FLAG_INT, &torch, 0, 0, 1, "0 skips the PyTorch comparison"},
        {0},
    };
    char *pos[1];
    int npos = 0;
    int rc = mq_flags_parse(flags, argc, argv,
                            "usage: bench_nn [--layers] [--torch 0|1] [STEPS]\n"
                            "  STEPS  training steps per timed round (default 5; --layers: 20)",
                            pos, 1, &npos);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    long steps = 0; /* not given: the mode's own default, below */
    if (npos == 1 && mq_parse_long("STEPS", pos[0], 1, 100000, &steps) < 0) {
        fprintf(stderr, "bench_nn: %s (see --help)\n", mq_err_last());
        return 2;
    }
    if (layers) {
        mq_model_t *m = mq_model_new("paper", 1, BATCH, 1e-4f);
        if (!m) {
            fprintf(stderr, "bench_nn: %s\n", mq_err_last());
            return 1;
        }
        mq_model_init(m, 1);
        s_layers(m, steps > 0 ? (int)steps : 20);
        mq_model_destroy(&m);
        return 0;
    }
    if (steps == 0)
        steps = 5;
    char here[1024], script[1200];
    snprintf(here, sizeof here, "%s", __FILE__);
    snprintf(script, sizeof script, "%s/torch_cnn.py", dirname(here));
    const char *env = mq_env_str("MQGRAD_TORCH_SCRIPT", script);
    bool have_torch = torch && access(env, R_OK) == 0 && access("/usr/bin/python3", X_OK) == 0;
    if (torch && !have_torch)
        printf("torch comparison skipped: %s or /usr/bin/python3 not found\n", env);
    mq_model_t *m = mq_model_new("paper", 1, BATCH, 1e-4f);
    if (!m) {
        fprintf(stderr, "bench_nn: %s\n", mq_err_last());
        return 1;
    }
    mq_model_init(m, 1);
    double flops = s_step_flops();
    printf("paper model, batch %d, %.2f GFLOP per training step, %ld steps per round\n", BATCH,
           flops / 1e9, steps);
    for (int t = 1; t <= 2; t++) {
        mq_nn_set_threads(t);
        double peak = s_sgemm_peak(2048);
        double ours = s_ours(m, (int)steps, 2);
        double torch = have_torch ? s_torch(env, t, (int)steps) : 0;
        double ours2 = s_ours(m, (int)steps, 1); /* again after torch: the load may have changed */
        ours = ours2 > ours ? ours2 : ours;
        double gflops = ours / BATCH * flops / 1e9;
        printf("threads %d: mqgrad %.1f img/s = %.1f GFLOP/s = %.2f of sgemm peak (%.1f GFLOP/s)",
               t, ours, gflops, gflops / peak, peak);
        if (torch > 0)
            printf("; torch %.1f img/s; ratio mqgrad/torch %.2f\n", torch, ours / torch);
        else
            printf("\n");
        fflush(stdout);
    }
    mq_model_destroy(&m);
    return 0;
}
