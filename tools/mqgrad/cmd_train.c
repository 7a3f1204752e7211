/* mqgrad train: the single-process reference trainer. Plain synchronous SGD of the paper's
 * network (or the small one) on one machine, no network, no quantization; it writes the same
 * run directory as the cluster so the two can be compared point by point. */
#include <getopt.h>
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
#include "mqgrad/util.h"
#include "mqgrad/watch.h"

typedef struct {
    const char *model, *dataset, *data_dir, *run_dir;
    long batch, iterations, eval_every, eval_limit, threads;
    double lr, l2, epochs, time_budget;
    unsigned long long seed;
    bool quiet;
    char run_dir_buf[256];
} s_opts_t;

typedef struct {
    s_opts_t *o;
    mq_dataset_t *train, *test;
    mq_model_t *model;
    mq_batcher_t *batcher;
    mq_runlog_t *log;
    float *x, *test_x;
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

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: mqgrad train [FLAGS]\n"
        "Trains the MQGrad paper's CNN in one process (plain fp32 SGD, no network): the\n"
        "reference the cluster is compared with. Every flag defaults to its MQGRAD_* variable.\n\n"
        "  --model paper|small     network (MQGRAD_MODEL, default paper)\n"
        "  --dataset NAME          fashion-mnist, mnist or cifar10 (MQGRAD_DATASET, default\n"
        "                          fashion-mnist)\n"
        "  --data-dir DIR          dataset files (MQGRAD_DATA_DIR, default\n"
        "                          /usr/share/datasets/NAME)\n"
        "  --batch N               examples per step (MQGRAD_BATCH, default 32)\n"
        "  --lr X                  learning rate (MQGRAD_LR, default 0.05)\n"
        "  --l2 X                  L2 coefficient on fc1.w and fc2.w: loss += X/2 * ||w||^2\n"
        "                          (MQGRAD_L2, default 0.0001)\n"
        "  --iterations N          stop after N steps (MQGRAD_ITERATIONS)\n"
        "  --epochs E              stop after E passes over the training set, may be\n"
        "                          fractional (MQGRAD_EPOCHS; default 1 if no limit is given)\n"
        "  --time-budget S         stop after S seconds of training (MQGRAD_TIME_BUDGET);\n"
        "                          with several limits the first reached wins\n"
        "  --eval-every N          evaluate every N steps, 0 = only at the end\n"
        "                          (MQGRAD_EVAL_EVERY, default 0)\n"
        "  --eval-limit N          evaluate on the first N test images (MQGRAD_EVAL_LIMIT,\n"
        "                          default all)\n"
        "  --seed N                initialization and shuffling seed (MQGRAD_SEED, default 1)\n"
        "  --threads N             OpenBLAS threads, 0 = all cores (MQGRAD_THREADS, default 0)\n"
        "  --run-dir DIR           where to write the run (MQGRAD_RUN_DIR, default\n"
        "                          runs/train-<UTC time>)\n"
        "  --quiet                 no progress lines\n"
        "  --help                  this text\n");
}

/* Parses one numeric option value into its field; -1 with an error naming the flag. */
static int s_set(s_opts_t *o, const char *flag, const char *v)
{
    double d;
    long l;
    if (!strcmp(flag, "batch"))
        return mq_parse_long("--batch", v, 1, 65536, &o->batch);
    if (!strcmp(flag, "iterations"))
        return mq_parse_long("--iterations", v, 1, 1000000000L, &o->iterations);
    if (!strcmp(flag, "eval-every"))
        return mq_parse_long("--eval-every", v, 0, 1000000000L, &o->eval_every);
    if (!strcmp(flag, "eval-limit"))
        return mq_parse_long("--eval-limit", v, 1, 100000000L, &o->eval_limit);
    if (!strcmp(flag, "threads"))
        return mq_parse_long("--threads", v, 0, 256, &o->threads);
    if (!strcmp(flag, "lr"))
        return mq_parse_double("--lr", v, 1e-9, 100, &o->lr);
    if (!strcmp(flag, "l2"))
        return mq_parse_double("--l2", v, 0, 10, &o->l2);
    if (!strcmp(flag, "epochs"))
        return mq_parse_double("--epochs", v, 1e-6, 1e6, &o->epochs);
    if (!strcmp(flag, "time-budget"))
        return mq_parse_double("--time-budget", v, 1e-3, 1e9, &o->time_budget);
    if (!strcmp(flag, "seed")) {
        if (mq_parse_double("--seed", v, 0, 9e15, &d) < 0 || d != floor(d)) {
            mq_err_set("--seed: '%s' is not a non-negative integer", v);
            return -1;
        }
        o->seed = (unsigned long long)d;
        return 0;
    }
    (void)l;
    mq_err_set("unknown option --%s", flag);
    return -1;
}

static const char *s_numeric[] = {"batch", "iterations", "eval-every", "eval-limit", "threads",
                                  "lr", "l2", "epochs", "time-budget", "seed", NULL};

/* Fills O from MQGRAD_* variables, then from the flags. 0 ok, 1 help shown, -1 error. */
static int s_parse(s_opts_t *o, int argc, char **argv)
{
    *o = (s_opts_t){.batch = 32, .lr = 0.05, .l2 = 1e-4, .seed = 1, .eval_limit = 100000000L};
    o->model = mq_env_str("MQGRAD_MODEL", "paper");
    o->dataset = mq_env_str("MQGRAD_DATASET", "fashion-mnist");
    o->data_dir = mq_env_str("MQGRAD_DATA_DIR", NULL);
    o->run_dir = mq_env_str("MQGRAD_RUN_DIR", NULL);
    for (int i = 0; s_numeric[i]; i++) {
        char var[64], *p;
        snprintf(var, sizeof var, "MQGRAD_%s", s_numeric[i]);
        for (p = var; *p; p++)
            *p = *p == '-' ? '_' : (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
        const char *v = mq_env_str(var, NULL);
        if (v && s_set(o, s_numeric[i], v) < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", mq_err_last());
            mq_err_set("%s (from %s)", msg, var);
            return -1;
        }
    }
    static const struct option opts[] = {
        {"model", 1, 0, 'm'},      {"dataset", 1, 0, 'd'}, {"data-dir", 1, 0, 'D'},
        {"run-dir", 1, 0, 'r'},    {"quiet", 0, 0, 'q'},   {"help", 0, 0, 'h'},
        {"batch", 1, 0, 'n'},      {"iterations", 1, 0, 'n'}, {"eval-every", 1, 0, 'n'},
        {"eval-limit", 1, 0, 'n'}, {"threads", 1, 0, 'n'}, {"lr", 1, 0, 'n'},
        {"l2", 1, 0, 'n'},         {"epochs", 1, 0, 'n'},  {"time-budget", 1, 0, 'n'},
        {"seed", 1, 0, 'n'},       {0, 0, 0, 0}};
    opterr = 0;
    optind = 1;
    int c, idx = 0;
    while ((c = getopt_long(argc, argv, ":", opts, &idx)) != -1) {
        if (c == 'm') o->model = optarg;
        else if (c == 'd') o->dataset = optarg;
        else if (c == 'D') o->data_dir = optarg;
        else if (c == 'r') o->run_dir = optarg;
        else if (c == 'q') o->quiet = true;
        else if (c == 'h') return 1;
        else if (c == 'n') {
            if (s_set(o, opts[idx].name, optarg) < 0)
                return -1;
        } else if (c == ':') {
            mq_err_set("option %s needs a value", argv[optind - 1]);
            return -1;
        } else {
            mq_err_set("unknown option '%s'", argv[optind - 1]);
            return -1;
        }
    }
    if (optind < argc) {
        mq_err_set("unexpected argument '%s'", argv[optind]);
        return -1;
    }
    if (strcmp(o->model, "paper") && strcmp(o->model, "small")) {
        mq_err_set("--model: '%s' is not paper or small", o->model);
        return -1;
    }
    /* A data set that is not there fails now, with how to get it, not after the run began. */
    o->data_dir = mq_dataset_dir(o->dataset, o->data_dir);
    if (mq_dataset_check(o->dataset, o->data_dir) != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("--dataset %s: %s", o->dataset, why);
        return -1;
    }
    if (!o->iterations && !o->epochs && !o->time_budget)
        o->epochs = 1;
    if (!o->run_dir) {
        char ts[32];
        time_t now = time(NULL);
        strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", gmtime(&now));
        snprintf(o->run_dir_buf, sizeof o->run_dir_buf, "runs/train-%s", ts);
        o->run_dir = o->run_dir_buf;
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
             "%llu, \"threads\": %ld, \"policy\": \"none\", \"workers\": 1, \"servers\": 0, "
             "\"smoothing\": \"ema 0.9\"}",
             model, ds, dir, o->batch, o->lr, o->l2, o->iterations, o->epochs, o->time_budget,
             o->eval_every, o->eval_limit, o->seed, o->threads);
}

/* Loads the data, builds the model and the run directory. 2 on a usage/data error. */
static int s_setup(s_run_t *r)
{
    s_opts_t *o = r->o;
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
    r->test_x = malloc(sizeof(float) * r->test->n * ch * 784);
    if (!r->x || !r->y || !r->test_x) {
        fprintf(stderr, "mqgrad train: out of memory\n");
        return 1;
    }
    mq_dataset_export28(r->test, r->test_x);
    double per_epoch = floor((double)r->train->n / o->batch);
    r->max_iter = UINT64_MAX;
    if (o->epochs)
        r->max_iter = (uint64_t)ceil(o->epochs * per_epoch);
    if (o->iterations && (uint64_t)o->iterations < r->max_iter)
        r->max_iter = (uint64_t)o->iterations;
    char cfg[4096];
    s_config_json(o, cfg, sizeof cfg);
    r->log = mq_runlog_new(o->run_dir, cfg);
    if (!r->log) {
        fprintf(stderr, "mqgrad train: %s\n", mq_err_last());
        return 2;
    }
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
    mq_model_eval(r->model, r->test_x, r->test->labels, r->test_n, &ls, &correct);
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
    if (rc == 1) {
        s_help(stdout);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "mqgrad train: %s\n(mqgrad train --help lists the flags)\n",
                mq_err_last());
        return 2;
    }
    s_run_t r = {.o = &o};
    mq_summary_t sum = {.final_test_acc = NAN, .final_sparsity = NAN, .final_loss = NAN, .policy = "none",
                        .model = o.model, .dataset = o.dataset, .workers = 1,
                        .seed = o.seed, .status = "failed"};
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
    }
    mq_runlog_destroy(&r.log);
    mq_batcher_destroy(&r.batcher);
    mq_model_destroy(&r.model);
    mq_dataset_destroy(&r.train);
    mq_dataset_destroy(&r.test);
    free(r.x);
    free(r.y);
    free(r.test_x);
    return rc;
}
