/* mqgrad train: the single-process reference trainer. Plain synchronous SGD of the paper's
 * network (or the small one) on one machine, no network, no quantization; it writes the same
 * run directory as the cluster so the two can be compared point by point. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "mqgrad/data.h"
#include "mqgrad/nn.h"
#include "mqgrad/runlog.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/watch.h"

typedef struct {
    char model[16], dataset[16], data_dir[512], run_dir[512];
    long batch, iterations, eval_every, eval_limit, threads, seed;
    double lr, l2, epochs, time_budget;
    bool quiet;
} s_opts_t;

typedef struct {
    s_opts_t *o;
    mq_dataset_t *train, *test;
    mq_model_t *model;
    mq_batcher_t *batcher;
    mq_runlog_t *log;
    float *x;
    uint8_t *y;
    int test_n;
    uint64_t max_iter; /* from --iterations or --epochs; UINT64_MAX if only a time budget */
    double last_print, last_train; /* the previous progress line */
    uint64_t last_it;
    mq_watch_t watch; /* the same divergence rules as the cluster; no bits, so no guard */
} s_run_t;

static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

/* Fills O from MQGRAD_* variables, then from the flags: one table (mqgrad/service.h) gives
 * the parsing, the variables, --help and each value's check. 0 ok, 1 help shown, 2 after a
 * message naming the bad flag or value. */
static int s_parse(s_opts_t *o, int argc, char **argv)
{
    *o = (s_opts_t){.batch = 32, .lr = 0.05, .l2 = 1e-4, .seed = 1, .eval_limit = 100000000L};
    snprintf(o->model, sizeof o->model, "paper");
    snprintf(o->dataset, sizeof o->dataset, "fashion-mnist");
    const mq_flag_t flags[] = {
        {"model", "MQGRAD_MODEL", MQ_FLAG_STR, o->model, sizeof o->model, 1, 0,
         "network: paper | small"},
        {"dataset", "MQGRAD_DATASET", MQ_FLAG_STR, o->dataset, sizeof o->dataset, 1, 0,
         "fashion-mnist | mnist | cifar10"},
        {"data-dir", "MQGRAD_DATA_DIR", MQ_FLAG_STR, o->data_dir, sizeof o->data_dir, 1, 0,
         "dataset files (default /usr/share/datasets/NAME)"},
        {"batch", "MQGRAD_BATCH", MQ_FLAG_LONG, &o->batch, 0, 1, 65536, "examples per step"},
        {"lr", "MQGRAD_LR", MQ_FLAG_DOUBLE, &o->lr, 0, 1e-9, 100, "learning rate"},
        {"l2", "MQGRAD_L2", MQ_FLAG_DOUBLE, &o->l2, 0, 0, 10,
         "L2 coefficient on fc1.w and fc2.w: loss += X/2 * ||w||^2"},
        {"iterations", "MQGRAD_ITERATIONS", MQ_FLAG_LONG, &o->iterations, 0, 1, 1e9,
         "stop after N steps (0: no such limit)"},
        {"epochs", "MQGRAD_EPOCHS", MQ_FLAG_DOUBLE, &o->epochs, 0, 1e-6, 1e6,
         "stop after E passes over the training set, may be fractional (1 if no limit is "
         "given)"},
        {"time-budget", "MQGRAD_TIME_BUDGET", MQ_FLAG_DOUBLE, &o->time_budget, 0, 1e-3, 1e9,
         "stop after S seconds of training; with several limits the first reached wins"},
        {"eval-every", "MQGRAD_EVAL_EVERY", MQ_FLAG_LONG, &o->eval_every, 0, 0, 1e9,
         "evaluate every N steps, 0 = only at the end"},
        {"eval-limit", "MQGRAD_EVAL_LIMIT", MQ_FLAG_LONG, &o->eval_limit, 0, 1, 1e8,
         "evaluate on the first N test images"},
        {"seed", "MQGRAD_SEED", MQ_FLAG_LONG, &o->seed, 0, 0, 9e15,
         "initialization and shuffling seed"},
        {"threads", "MQGRAD_THREADS", MQ_FLAG_LONG, &o->threads, 0, 0, 256,
         "OpenBLAS threads, 0 = all cores"},
        {"run-dir", "MQGRAD_RUN_DIR", MQ_FLAG_STR, o->run_dir, sizeof o->run_dir, 1, 0,
         "where to write the run (default runs/train-<UTC time>)"},
        {"quiet", NULL, MQ_FLAG_BOOL, &o->quiet, 0, 0, 0, "no progress lines"},
        {0},
    };
    char *args[argc + 1]; /* messages start with the command's name */
    memcpy(args, argv, sizeof(char *) * (size_t)argc);
    args[0] = "mqgrad train";
    args[argc] = NULL;
    int rc = mq_flags_parse(flags, argc, args,
                            "usage: mqgrad train [flags]\n"
                            "Trains the MQGrad paper's CNN in one process (plain fp32 SGD, no "
                            "network): the reference the cluster is compared with.",
                            NULL, 0, NULL);
    if (rc != 0)
        return rc;
    if (strcmp(o->model, "paper") && strcmp(o->model, "small")) {
        fprintf(stderr, "mqgrad train: --model '%s' is not paper or small\n", o->model);
        return 2;
    }
    /* A data set that is not there fails now, with how to get it, not after the run began. */
    if (!o->data_dir[0] && mq_dataset_default_dir(o->dataset))
        snprintf(o->data_dir, sizeof o->data_dir, "%s", mq_dataset_default_dir(o->dataset));
    if (mq_dataset_check(o->dataset, o->data_dir) != 0) {
        fprintf(stderr, "mqgrad train: --dataset %s: %s\n", o->dataset, mq_err_last());
        return 2;
    }
    if (!o->iterations && !o->epochs && !o->time_budget)
        o->epochs = 1;
    if (!o->run_dir[0]) {
        char ts[32];
        time_t now = time(NULL);
        strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", gmtime(&now));
        snprintf(o->run_dir, sizeof o->run_dir, "runs/train-%s", ts);
    }
    return 0;
}

/* The run's settings as one JSON object, for config.json. */
static void s_config_json(const s_opts_t *o, char *buf, size_t len)
{
    char model[128], ds[128], dir[1024];
    mq_json_escape(o->model, model, sizeof model);
    mq_json_escape(o->dataset, ds, sizeof ds);
    mq_json_escape(o->data_dir, dir, sizeof dir);
    snprintf(buf, len,
             "{\"command\": \"train\", \"model\": \"%s\", \"dataset\": \"%s\", \"data_dir\": "
             "\"%s\", \"batch\": %ld, \"lr\": %g, \"l2\": %g, \"iterations\": %ld, \"epochs\": "
             "%g, \"time_budget_s\": %g, \"eval_every\": %ld, \"eval_limit\": %ld, \"seed\": "
             "%ld, \"threads\": %ld, \"policy\": \"none\", \"workers\": 1, \"servers\": 0, "
             "\"smoothing\": \"ema 0.9\"}",
             model, ds, dir, o->batch, o->lr, o->l2, o->iterations, o->epochs, o->time_budget,
             o->eval_every, o->eval_limit, o->seed, o->threads);
}

/* Makes the run directory, loads the data, builds the model. 2 on a usage/data error. */
static int s_setup(s_run_t *r)
{
    s_opts_t *o = r->o;
    /* The run directory first: a --run-dir that cannot be made is refused before seconds of
     * loading (the data set's files were checked while parsing). */
    char cfg[4096];
    s_config_json(o, cfg, sizeof cfg);
    r->log = mq_runlog_new(o->run_dir, cfg);
    if (!r->log) {
        fprintf(stderr, "mqgrad train: --run-dir %s: %s\n", o->run_dir, mq_err_last());
        return 2;
    }
    r->train = mq_dataset_load(o->dataset, o->data_dir, true);
    r->test = r->train ? mq_dataset_load(o->dataset, o->data_dir, false) : NULL;
    if (!r->test) {
        fprintf(stderr, "mqgrad train: %s\n", mq_err_last());
        return 2;
    }
    int ch = mq_dataset_channels(r->train);
    r->batcher = mq_batcher_new(r->train, 0, 1, (int)o->batch, o->seed, true);
    r->model = r->batcher ? mq_model_new(o->model, ch, (int)o->batch, (float)o->l2) : NULL;
    if (!r->model) {
        fprintf(stderr, "mqgrad train: %s\n", mq_err_last());
        return 2;
    }
    mq_nn_set_threads((int)o->threads);
    mq_model_init(r->model, o->seed);
    r->test_n = r->test->n < o->eval_limit ? r->test->n : (int)o->eval_limit;
    r->x = malloc(sizeof(float) * o->batch * ch * 784);
    r->y = malloc(o->batch);
    if (!r->x || !r->y) {
        fprintf(stderr, "mqgrad train: out of memory\n");
        return 1;
    }
    double per_epoch = floor((double)r->train->n / o->batch);
    r->max_iter = UINT64_MAX;
    if (o->epochs)
        r->max_iter = (uint64_t)ceil(o->epochs * per_epoch);
    if (o->iterations && (uint64_t)o->iterations < r->max_iter)
        r->max_iter = (uint64_t)o->iterations;
    return 0;
}

static void s_fmt_dur(double s, char *buf, size_t len)
{
    if (!isfinite(s) || s < 0)
        snprintf(buf, len, "?");
    else if (s >= 3600)
        snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else
        snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

/* Evaluates on the first test_n test images into ROW and logs an "eval" event. */
static void s_evaluate(s_run_t *r, mq_metrics_row_t *row)
{
    double ls = 0;
    long correct = 0;
    mq_model_eval_data(r->model, r->test, 0, r->test_n, r->x, (int)r->o->batch, &ls, &correct);
    row->evaluated = true;
    row->test_acc = (double)correct / r->test_n;
    row->test_loss = ls / r->test_n;
    char f[128];
    snprintf(f, sizeof f, "\"test_acc\":%.6f,\"test_loss\":%.6g", row->test_acc, row->test_loss);
    mq_runlog_event(r->log, row->iter, "eval", f);
}

/* One progress line: rates over the interval since the previous line; time left from the
 * iteration limit or the time budget, whichever comes first. */
static void s_progress(s_run_t *r, const mq_metrics_row_t *row)
{
    const s_opts_t *o = r->o;
    double rate = (row->iter - r->last_it) / (row->train_time_s - r->last_train + 1e-12);
    double left = INFINITY;
    if (r->max_iter != UINT64_MAX)
        left = (r->max_iter - row->iter) / rate;
    if (o->time_budget && o->time_budget - row->train_time_s < left)
        left = o->time_budget - row->train_time_s;
    char ls[32], accs[32] = "";
    s_fmt_dur(left, ls, sizeof ls);
    if (row->evaluated)
        snprintf(accs, sizeof accs, "  test_acc %.2f%%", 100 * row->test_acc);
    printf("iter %7llu  loss %.4f (avg %.4f)%s  %.1f it/s  %.0f img/s  left %s\n",
           (unsigned long long)row->iter, row->loss, row->smoothed_loss, accs, rate,
           rate * o->batch, ls);
    fflush(stdout);
    r->last_print = mq_now_s(), r->last_it = row->iter, r->last_train = row->train_time_s;
}

/* Training loop; returns the exit code. Evaluation time is kept out of train_time_s. */
static int s_loop(s_run_t *r, mq_summary_t *sum)
{
    s_opts_t *o = r->o;
    mq_model_t *m = r->model;
    double train_s = 0, acc = NAN;
    uint64_t it = 0;
    mq_watch_t *watch = &r->watch; /* outlives the loop: the summary points into it */
    mq_watch_init(watch, NULL);
    r->last_print = mq_now_s();
    while (it < r->max_iter && !s_stop && !(o->time_budget && train_s >= o->time_budget)) {
        double t0 = mq_now_s();
        mq_batcher_next(r->batcher, r->x, r->y);
        double t1 = mq_now_s();
        float loss = mq_model_grad(m, r->x, r->y, (int)o->batch);
        double t2 = mq_now_s();
        mq_sgd_update(mq_model_params(m), mq_model_grads(m), mq_model_nparams(m), (float)o->lr);
        double t3 = mq_now_s();
        train_s += t3 - t0;
        it++;
        bool diverged = mq_watch_loss(watch, it, loss, 0, 32, NULL);
        mq_metrics_row_t row = {.iter = it, .train_time_s = train_s, .loss = loss,
                                .smoothed_loss = watch->smoothed, .bits = 32,
                                .compute_ms = (t2 - t1) * 1e3, .update_ms = (t3 - t2) * 1e3,
                                .workers = 1};
        bool last = it >= r->max_iter || s_stop || (o->time_budget && train_s >= o->time_budget);
        if (!diverged && ((o->eval_every && it % o->eval_every == 0) || last)) {
            s_evaluate(r, &row);
            acc = row.test_acc;
            diverged = mq_watch_accuracy(watch, it, acc) ||
                       (last && !s_stop && mq_watch_final(watch, it, acc));
        }
        if (mq_runlog_row(r->log, &row) < 0) {
            fprintf(stderr, "mqgrad train: %s\n", mq_err_last());
            return 1;
        }
        *sum = (mq_summary_t){.iterations = it,
                              .train_time_s = train_s,
                              .final_loss = loss,
                              .final_test_acc = acc,
                              .final_sparsity = NAN,
                              .policy = "none",
                              .model = o->model,
                              .dataset = o->dataset,
                              .workers = 1,
                              .seed = o->seed,
                              .clock = "real",
                              .wall_time_s = train_s,
                              .status = "running"};
        if (diverged) {
            fprintf(stderr, "mqgrad train: DIVERGED at iteration %llu: %s%s\n",
                    (unsigned long long)it, watch->detail, watch->at_end ? "" : "; lower --lr");
            char fields[600], detail[512];
            mq_json_escape(watch->detail, detail, sizeof detail);
            snprintf(fields, sizeof fields, "\"rule\":\"%s\",\"detail\":\"%s\"", watch->rule,
                     detail);
            mq_runlog_event(r->log, it, "diverged", fields);
            sum->final_test_acc = row.evaluated ? acc : NAN;
            sum->status = "diverged";
            sum->divergence_rule = watch->rule;
            sum->divergence_iter = it;
            sum->divergence_detail = watch->detail;
            mq_runlog_summary(r->log, sum);
            return MQ_EXIT_DIVERGED;
        }
        if (row.evaluated)
            mq_runlog_summary(r->log, sum);
        if (!o->quiet && (mq_now_s() - r->last_print >= 2 || row.evaluated || last))
            s_progress(r, &row);
    }
    sum->status = s_stop ? "interrupted" : "completed";
    return 0;
}

int mq_cmd_train(int argc, char **argv)
{
    s_opts_t o;
    int rc = s_parse(&o, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    s_run_t r = {.o = &o};
    mq_summary_t sum = {.final_test_acc = NAN, .final_sparsity = NAN, .final_loss = NAN, .policy = "none",
                        .model = o.model, .dataset = o.dataset, .workers = 1,
                        .seed = (uint64_t)o.seed, .status = "failed"};
    rc = s_setup(&r);
    if (rc == 0) {
        if (!o.quiet)
            printf("mqgrad train: model %s (%zu parameters), %s: %d train / %d test images, "
                   "batch %ld, lr %g, run dir %s\n",
                   o.model, mq_model_nparams(r.model), o.dataset, r.train->n, r.test_n,
                   o.batch, o.lr, mq_runlog_dir(r.log));
        signal(SIGINT, s_on_signal);
        signal(SIGTERM, s_on_signal);
        mq_runlog_event(r.log, 0, "start", NULL);
        rc = s_loop(&r, &sum);
        mq_runlog_event(r.log, sum.iterations, "end", NULL);
        if (mq_runlog_summary(r.log, &sum) < 0) { /* the run's result would be lost unsaid */
            fprintf(stderr, "mqgrad train: %s\n", mq_err_last());
            if (rc == 0)
                rc = 1;
        }
        if (!o.quiet && rc == 0)
            printf("done: %llu iterations, %.1f s training, final loss %.4f, test accuracy "
                   "%.2f%% (%s)\n",
                   (unsigned long long)sum.iterations, sum.train_time_s, sum.final_loss,
                   100 * sum.final_test_acc, sum.status);
    } else if (r.log) { /* the directory was made: it says the run failed, and why is above */
        mq_runlog_event(r.log, 0, "end", NULL);
        (void)mq_runlog_summary(r.log, &sum);
    }
    mq_runlog_destroy(&r.log);
    mq_batcher_destroy(&r.batcher);
    mq_model_destroy(&r.model);
    mq_dataset_destroy(&r.train);
    mq_dataset_destroy(&r.test);
    free(r.x);
    free(r.y);
    return rc;
}
