/* libmqgrad (mqgrad/mqgrad.h): a model the cluster does not know, computed by the library's
 * caller, trains on real services over real sockets. The model here is softmax regression on
 * Fashion-MNIST, written in the test: two workers of the library (threads) join a run of the
 * workers' own model (--model external), take their examples from mqgrad_examples, evaluate
 * when asked, and must end well above chance with every replica equal to the servers' master
 * copies. A layout that is not the run's, and bad tensors, are refused with what differs. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "local_run.h"
#include "mqgrad/data.h"
#include "mqgrad/mqgrad.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"

#define S_IN 784
#define S_CLASSES 10

static const mq_dataset_t *s_train, *s_test;
static float *s_train_x, *s_test_x; /* their images as the model takes them */

typedef struct {
    const char *endpoint;
    int code;          /* mqgrad_leave's */
    int rounds, evals; /* rounds computed, evaluations given */
    bool early;        /* tell the library what is final before the push (mqgrad_ready) */
    int readies;       /* rounds that did */
    int late_ms;       /* then wait this long before the push: the aggregates come first */
    int moved;         /* rounds whose parameters changed before their push */
    double losses[64]; /* the loss pushed in round i */
    char error[512];
    float *final;      /* the replica's parameters once the run is over */
    size_t n;
} s_worker_t;

/* Softmax regression: the loss of the batch and, added into G (w: 784x10, then b: 10), its
 * mean gradient. */
static double s_grad(const float *p, float *g, const int64_t *idx, int batch)
{
    const float *w = p, *b = p + S_IN * S_CLASSES;
    float *gw = g, *gb = g + S_IN * S_CLASSES;
    double loss = 0;
    for (int k = 0; k < batch; k++) {
        const float *x = s_train_x + (size_t)idx[k] * S_IN;
        int y = s_train->labels[idx[k]];
        double z[S_CLASSES], mx = -INFINITY, sum = 0;
        for (int c = 0; c < S_CLASSES; c++) {
            z[c] = b[c];
            for (int i = 0; i < S_IN; i++)
                z[c] += (double)x[i] * w[i * S_CLASSES + c];
            mx = fmax(mx, z[c]);
        }
        for (int c = 0; c < S_CLASSES; c++)
            sum += exp(z[c] - mx);
        loss += log(sum) + mx - z[y];
        for (int c = 0; c < S_CLASSES; c++) {
            double d = (exp(z[c] - mx) / sum - (c == y)) / batch;
            gb[c] += (float)d;
            for (int i = 0; i < S_IN; i++)
                gw[i * S_CLASSES + c] += (float)(d * x[i]);
        }
    }
    return loss / batch;
}

static void s_eval(const float *p, int lo, int hi, uint64_t *correct, double *loss_sum)
{
    const float *w = p, *b = p + S_IN * S_CLASSES;
    for (int k = lo; k < hi; k++) {
        const float *x = s_test_x + (size_t)k * S_IN;
        double z[S_CLASSES], mx = -INFINITY, sum = 0;
        int best = 0;
        for (int c = 0; c < S_CLASSES; c++) {
            z[c] = b[c];
            for (int i = 0; i < S_IN; i++)
                z[c] += (double)x[i] * w[i * S_CLASSES + c];
            if (z[c] > z[best])
                best = c;
            mx = fmax(mx, z[c]);
        }
        for (int c = 0; c < S_CLASSES; c++)
            sum += exp(z[c] - mx);
        *loss_sum += log(sum) + mx - z[s_test->labels[k]];
        *correct += best == s_test->labels[k];
    }
}

static void *s_worker(void *arg)
{
    s_worker_t *me = arg;
    const mqgrad_tensor_t tensors[] = {{"fc.w", S_IN * S_CLASSES}, {"fc.b", S_CLASSES}};
    float *init = calloc(S_IN * S_CLASSES + S_CLASSES, sizeof(float));
    char *argv[] = {"worker", "--scheduler", (char *)me->endpoint, NULL};
    mqgrad_t *w = mqgrad_join(3, argv, tensors, 2, init);
    free(init);
    if (!w) {
        snprintf(me->error, sizeof me->error, "%s", mqgrad_error(NULL));
        me->code = -1;
        return NULL;
    }
    const mqgrad_run_t *run = mqgrad_run(w);
    int64_t *idx = malloc(run->batch * sizeof *idx);
    size_t np = mqgrad_nparams(w);
    float *before = me->late_ms ? malloc(np * sizeof(float)) : NULL;
    mqgrad_step_t st;
    int rc;
    while ((rc = mqgrad_next(w, &st)) == 1) {
        float *g = mqgrad_grads(w);
        for (size_t t = 0; t < 2; t++) /* zero unless error feedback keeps a residual there */
            if (!mqgrad_accumulates(w, t))
                memset(g + (t ? S_IN * S_CLASSES : 0), 0,
                       (t ? S_CLASSES : S_IN * S_CLASSES) * sizeof(float));
        mqgrad_examples(w, (uint64_t)s_train->n, st.cursor + (uint64_t)st.member * run->batch,
                        run->batch, idx);
        double loss = s_grad(mqgrad_params(w), g, idx, (int)run->batch);
        if (me->early) { /* the bias's values are final, then all: shards go before the push */
            bool all = me->late_ms || st.iter % 2;
            if (before)
                memcpy(before, mqgrad_params(w), np * sizeof(float));
            if (mqgrad_ready(w, S_IN * S_CLASSES) != 0 || (all && mqgrad_ready(w, 0)))
                break;
            me->readies++;
            if (before) { /* every shard is out: the servers answer while we wait */
                zclock_sleep(me->late_ms);
                me->moved += memcmp(before, mqgrad_params(w), np * sizeof(float)) != 0;
            }
        }
        if (st.iter < sizeof me->losses / sizeof me->losses[0])
            me->losses[st.iter] = loss;
        if (mqgrad_push(w, loss) != 0)
            break;
        me->rounds++;
        if (st.evaluate) {
            int total = st.eval_limit && (int)st.eval_limit < s_test->n ? (int)st.eval_limit
                                                                       : s_test->n;
            int lo = (int)((int64_t)total * st.member / st.members);
            int hi = (int)((int64_t)total * (st.member + 1) / st.members);
            uint64_t correct = 0;
            double loss_sum = 0;
            s_eval(mqgrad_params(w), lo, hi, &correct, &loss_sum);
            if (mqgrad_evaluated(w, correct, (uint64_t)(hi - lo), loss_sum) != 0)
                break;
            me->evals++;
        }
    }
    if (rc != 0)
        snprintf(me->error, sizeof me->error, "%s", mqgrad_error(w));
    else if (me->early && (mqgrad_ready(w, 0) != -1 || !strstr(mqgrad_error(w), "no round")))
        snprintf(me->error, sizeof me->error, "mqgrad_ready outside a round: '%s'",
                 mqgrad_error(w));
    me->n = mqgrad_nparams(w);
    me->final = malloc(me->n * sizeof(float));
    memcpy(me->final, mqgrad_params(w), me->n * sizeof(float));
    free(idx);
    free(before);
    me->code = mqgrad_leave(&w);
    return NULL;
}

static void s_load(void)
{
    static mq_dataset_t *train, *test;
    if (!train) {
        train = mq_dataset_load("fashion-mnist", NULL, true);
        test = mq_dataset_load("fashion-mnist", NULL, false);
        cr_assert(train && test, "Fashion-MNIST: %s", mq_err_last());
        s_train_x = malloc(sizeof(float) * S_IN * (size_t)train->n);
        s_test_x = malloc(sizeof(float) * S_IN * (size_t)test->n);
        cr_assert(s_train_x && s_test_x);
        mq_dataset_export28(train, 0, train->n, s_train_x);
        mq_dataset_export28(test, 0, test->n, s_test_x);
    }
    s_train = train, s_test = test;
}

Test(libmqgrad, workers_own_model_trains, .timeout = 300)
{
    s_load();
    cluster_t c;
    char *extra[] = {"--model", "external", "--iterations", "300", "--batch", "32", "--lr",
                     "0.05", "--eval-every", "100", "--eval-limit", "2000", "--final-eval-limit",
                     "10000", "--bits", "4", "--threshold", "1000", NULL};
    cluster_start_core(&c, 2, 2, "lib", extra);
    /* worker 0 says what is final before each push (mqgrad_ready): its shards go early */
    s_worker_t ws[2] = {{.endpoint = c.endpoint, .early = true}, {.endpoint = c.endpoint}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, s_worker, &ws[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    int code = s_wait_done(c.sched, 60000);
    for (int i = 0; i < c.S; i++)
        cr_expect_eq(s_wait_done(c.servers[i], 10000), 0, "server %d did not stop cleanly", i);
    cluster_stop(&c);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ws[i].code, 0, "worker %d: exit %d: %s", i, ws[i].code, ws[i].error);
        cr_expect_str_empty(ws[i].error, "worker %d: %s", i, ws[i].error);
        cr_expect_eq(ws[i].rounds, 300, "worker %d computed %d rounds", i, ws[i].rounds);
        cr_expect_geq(ws[i].evals, 3, "worker %d gave %d evaluations", i, ws[i].evals);
    }
    cr_expect_eq(ws[0].readies, 300, "worker 0 readied %d rounds early", ws[0].readies);
    cr_assert_eq(code, 0, "the run did not complete");

    char path[400], *summary;
    size_t len;
    snprintf(path, sizeof path, "%s/run/summary.json", c.dir);
    cr_assert_eq(mq_read_file(path, &summary, &len), 0, "%s", mq_err_last());
    double acc = test_json_num(summary, "final_test_acc");
    /* softmax regression on Fashion-MNIST: chance is 0.10, 300 rounds of 64 reach about 0.78 */
    cr_assert_gt(acc, 0.70, "final accuracy %.3f: %s", acc, summary);
    cr_expect(strstr(summary, "\"external\""), "%s", summary);
    free(summary);

    /* every replica equals the servers' master copies, element for element */
    size_t off = 0;
    for (int s = 0; s < c.S; s++) {
        size_t n;
        snprintf(path, sizeof path, "%s/server-%d.bin", c.dir, s);
        float *master = s_read_floats(path, &n);
        cr_assert_leq(off + n, ws[0].n);
        for (int i = 0; i < 2; i++)
            cr_assert_eq(memcmp(master, ws[i].final + off, n * sizeof(float)), 0,
                         "worker %d's replica differs from server %d's master copy", i, s);
        off += n;
        free(master);
    }
    cr_assert_eq(off, ws[0].n, "the shards hold %zu of %zu parameters", off, ws[0].n);
    for (int i = 0; i < 2; i++)
        free(ws[i].final);
    test_rmtree(c.dir);
}

/* A caller whose shards all went early (mqgrad_ready from 0) and who pushes late, after the
 * servers have answered: its parameters change only inside mqgrad_push, as mqgrad.h says,
 * and every round's report carries the loss it pushed (the run's metrics.csv shows it). */
Test(libmqgrad, early_shards_answered_before_the_push, .timeout = 120)
{
    s_load();
    cluster_t c;
    char *extra[] = {"--model", "external", "--iterations", "30", "--batch", "32", "--lr",
                     "0.05", "--eval-every", "0", "--final-eval-limit", "1000", "--bits", "4",
                     "--threshold", "1000", NULL};
    cluster_start_core(&c, 1, 1, "late", extra);
    s_worker_t *me = calloc(1, sizeof *me);
    *me = (s_worker_t){.endpoint = c.endpoint, .early = true, .late_ms = 50};
    pthread_t th;
    pthread_create(&th, NULL, s_worker, me);
    pthread_join(th, NULL);
    int code = s_wait_done(c.sched, 60000);
    cr_expect_eq(s_wait_done(c.servers[0], 10000), 0, "the server did not stop cleanly");
    cluster_stop(&c);
    cr_assert_eq(me->code, 0, "worker: exit %d: %s", me->code, me->error);
    cr_assert_eq(code, 0, "the run did not complete");
    cr_expect_eq(me->rounds, 30, "%d rounds", me->rounds);
    cr_expect_eq(me->moved, 0, "the parameters changed before the push in %d of 30 rounds",
                 me->moved);

    char path[400], *csv;
    size_t len;
    snprintf(path, sizeof path, "%s/run/metrics.csv", c.dir);
    cr_assert_eq(mq_read_file(path, &csv, &len), 0, "%s", mq_err_last());
    int rows = 0;
    for (char *line = strchr(csv, '\n'); line && line[1]; line = strchr(line + 1, '\n')) {
        unsigned long long iter;
        double t, loss;
        cr_assert_eq(sscanf(line + 1, "%llu,%lf,%lf,", &iter, &t, &loss), 3, "%s", line + 1);
        cr_assert_lt(iter, 30);
        cr_expect_leq(fabs(loss - me->losses[iter]), 1e-5 * me->losses[iter],
                      "round %llu reported loss %g, the worker pushed %g", iter, loss,
                      me->losses[iter]);
        rows++;
    }
    cr_expect_eq(rows, 30, "metrics.csv has %d rows", rows);
    free(csv);
    free(me->final);
    free(me);
    test_rmtree(c.dir);
}

/* A worker whose model is not the run's is refused at once, told the first tensor that
 * differs; so is mqgrad-worker in a run of the workers' own model. */
Test(libmqgrad, layout_mismatch_refused, .timeout = 120)
{
    cluster_t c;
    char *extra[] = {"--model", "small", "--iterations", "5", "--eval-every", "0", NULL};
    cluster_start_core(&c, 1, 1, "mismatch", extra);
    mq_layout_t small;
    cr_assert_eq(mq_model_layout_of("small", 1, &small), 0);
    mqgrad_tensor_t t[MQ_LAYOUT_MAX];
    for (uint32_t i = 0; i < small.n; i++)
        t[i] = (mqgrad_tensor_t){small.t[i].name, small.t[i].count};
    t[4].count += 1; /* fc1.w one element too many */
    char *argv[] = {"worker", "--scheduler", c.endpoint, "--peer-timeout", "20", NULL};
    mqgrad_t *w = mqgrad_join(5, argv, t, small.n, NULL);
    cr_assert_null(w);
    cr_assert(strstr(mqgrad_error(NULL),
                     "refused this worker: register: the scheduler refused us: the model differs "
                     "from the run's (built-in small): tensor 4 'fc1.w' has 50177 elements, the "
                     "run's has 50176"),
              "%s", mqgrad_error(NULL));
    mqgrad_tensor_t renamed[2] = {{"conv1.weight", small.t[0].count}, {"b", 1}};
    w = mqgrad_join(5, argv, renamed, 2, NULL);
    cr_assert_null(w);
    cr_assert(strstr(mqgrad_error(NULL), "tensor 0 is 'conv1.weight', the run's is 'conv1.w'"),
              "%s", mqgrad_error(NULL));
    cluster_stop(&c);
    test_rmtree(c.dir);
}

/* mqgrad-worker computes the built-in models only: a run of the workers' own model refuses it
 * with the reason, and it is not restarted (exit code MQ_EXIT_REFUSED). */
Test(libmqgrad, builtin_worker_refused_by_external_run, .timeout = 120)
{
    cluster_t c;
    char *extra[] = {"--model", "external", "--iterations", "5", "--eval-every", "0", NULL};
    cluster_start_core(&c, 1, 1, "cworker", extra);
    cluster_start_workers(&c);
    cr_assert_eq(s_wait_done(c.workers[0], 30000), MQ_EXIT_REFUSED);
    cluster_stop(&c);
    test_rmtree(c.dir);
}

/* Tensors the library cannot declare are refused before anything is sent. */
Test(libmqgrad, bad_tensors_refused)
{
    test_keys();
    char *argv[] = {"worker", "--scheduler", "tcp://127.0.0.1:1", "--peer-timeout", "1", NULL};
    char longname[80];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    struct {
        mqgrad_tensor_t t[2];
        size_t n;
        const char *says;
    } cases[] = {
        {{{"a", 0}}, 1, "elements"},
        {{{longname, 4}}, 1, "a name has 1 to 63 bytes"},
        {{{"a", 4}, {"a", 4}}, 2, "both named 'a'"},
        {{{"a b", 4}}, 1, "without spaces"},
        {{{"a", 4}}, 0, "1 to 128 tensors"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mqgrad_t *w = mqgrad_join(5, argv, cases[i].t, cases[i].n, NULL);
        cr_assert_null(w, "case %zu joined", i);
        cr_expect(strstr(mqgrad_error(NULL), cases[i].says), "case %zu: '%s'", i,
                  mqgrad_error(NULL));
    }
    /* a cluster that does not answer: a clear error after the peer timeout, not a hang */
    mqgrad_tensor_t ok = {"a", 4};
    double t0 = mq_now_s();
    cr_assert_null(mqgrad_join(5, argv, &ok, 1, NULL));
    cr_expect(strstr(mqgrad_error(NULL), "tcp://127.0.0.1:1"), "%s", mqgrad_error(NULL));
    cr_expect_lt(mq_now_s() - t0, 30);
}
