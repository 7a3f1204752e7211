/* libmqgrad (mqgrad/mqgrad.h): the worker actor (worker.c) run for a caller that computes
 * the rounds itself. The caller's thread and the actor talk over the actor's pipe (the
 * protocol is in mqgrad/worker.h); every wait on it has a deadline. */
#include "mqgrad/mqgrad.h"

#include <czmq.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/data.h"
#include "mqgrad/http.h"
#include "mqgrad/service.h"
#include "mqgrad/util.h"
#include "mqgrad/worker.h"

_Static_assert(MQGRAD_NAME_MAX + 1 == MQ_LAYOUT_NAME, "a name's bound is the layout's");
_Static_assert(MQGRAD_TENSORS_MAX == MQ_LAYOUT_MAX, "a model's tensors are the layout's");

struct mqgrad {
    mq_worker_config_t cfg;
    mq_worker_ext_t ext;
    float *init;
    zactor_t *actor;
    mq_http_t *http; /* /metrics, with --http-port */
    mq_worker_welcome_t welcome;
    mqgrad_run_t run;
    int code;       /* the actor's DONE code, -1 while it runs */
    bool evaluate;  /* the last round asks for an evaluation not yet given */
    bool in_round;  /* between a STEP and its APPLIED */
    bool asked;     /* the round in progress asks for an evaluation */
    bool zero_grads; /* mqgrad_zero_grads */
    int32_t *perm;  /* mqgrad_examples: the permutation of epoch perm_epoch over perm_n */
    uint64_t perm_epoch, perm_n;
    char error[512];
    char why[480]; /* the actor's last words ("DONE <code> <why>") */
};

static _Thread_local char s_join_error[512];
static _Thread_local int s_join_code; /* the exit code a failed join means */

static int s_fail(mqgrad_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_fail(mqgrad_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w ? w->error : s_join_error, sizeof s_join_error, fmt, ap);
    va_end(ap);
    return -1;
}

/* Waits at most TIMEOUT_S for the actor's next word; CMD and its body (into BODY, LEN bytes
 * exactly). Returns 1 for the awaited command, 0 when the actor is over (w->code set), or -1
 * (w->error) on silence or a word out of turn. */
static int s_await(mqgrad_t *w, const char *want, void *body, size_t len, double timeout_s)
{
    zsock_t *pipe = zactor_sock(w->actor);
    double deadline = mq_now_s() + timeout_s;
    for (;;) {
        double left = deadline - mq_now_s();
        if (left <= 0)
            return s_fail(w, "no word from the worker for %.0f s (waiting for %s)", timeout_s,
                          want);
        zsock_set_rcvtimeo(pipe, (int)fmin(left * 1e3 + 1, 1000));
        zmsg_t *m = zmsg_recv(pipe);
        if (!m && errno == EINTR) /* a signal for the caller: it decides (Ctrl-C, SIGTERM) */
            return s_fail(w, "interrupted by a signal (waiting for %s)", want);
        if (!m)
            continue; /* a slice of the wait passed */
        char *cmd = zmsg_popstr(m);
        zframe_t *f = zmsg_first(m);
        int rc = -1;
        if (cmd && strncmp(cmd, "DONE ", 5) == 0) {
            char *why = strchr(cmd + 5, ' ');
            w->code = atoi(cmd + 5);
            snprintf(w->why, sizeof w->why, "%s", why ? why + 1 : "");
            rc = 0;
        } else if (cmd && streq(cmd, want) && f && zframe_size(f) == len) {
            memcpy(body, zframe_data(f), len);
            rc = 1;
        } else {
            s_fail(w, "the worker said '%s' while %s was awaited", cmd ? cmd : "", want);
        }
        zstr_free(&cmd);
        zmsg_destroy(&m);
        if (rc == 0) {
            const char *why = w->code == MQ_EXIT_REFUSED ? "the scheduler refused this worker"
                              : w->code == MQ_EXIT_REJOIN
                                  ? "the scheduler started its run again: join again"
                              : w->code == 0 ? "the run is over"
                                             : "the worker failed";
            if (w->why[0])
                s_fail(w, "%s: %.400s", why, w->why);
            else
                s_fail(w, "%s", why);
        }
        return rc;
    }
}

static int s_tell(mqgrad_t *w, const char *cmd, const void *body, size_t len)
{
    zmsg_t *m = zmsg_new();
    zmsg_addstr(m, cmd);
    if (body)
        zmsg_addmem(m, body, len);
    if (zmsg_send(&m, zactor_sock(w->actor)) != 0)
        return s_fail(w, "cannot reach the worker (%s)", cmd);
    return 0;
}

static int s_layout(mqgrad_t *w, const mqgrad_tensor_t *tensors, size_t n)
{
    if (!tensors || n < 1 || n > MQGRAD_TENSORS_MAX)
        return s_fail(NULL, "a model has 1 to %d tensors, got %zu", MQGRAD_TENSORS_MAX, n);
    w->ext.layout.n = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        if (!tensors[i].name || strlen(tensors[i].name) > MQGRAD_NAME_MAX)
            return s_fail(NULL, "tensor %zu: a name has 1 to %d bytes", i, MQGRAD_NAME_MAX);
        snprintf(w->ext.layout.t[i].name, MQ_LAYOUT_NAME, "%s", tensors[i].name);
        w->ext.layout.t[i].count = tensors[i].count;
    }
    if (mq_layout_check(&w->ext.layout) != 0)
        return s_fail(NULL, "%s", mq_err_last());
    return 0;
}

mqgrad_t *mqgrad_join(int argc, char **argv, const mqgrad_tensor_t *tensors, size_t n,
                      const float *init)
{
    s_join_error[0] = 0;
    s_join_code = 1;
    /* before anything that may start CZMQ: it must install no signal handler of its own */
    zsys_handler_set(NULL);
    mqgrad_t *w = calloc(1, sizeof *w);
    if (!w) {
        s_fail(NULL, "out of memory");
        return NULL;
    }
    w->code = -1;
    char *none[] = {"mqgrad", NULL};
    if (s_layout(w, tensors, n) != 0)
        goto fail;
    if (mq_worker_config_parse(&w->cfg, argc > 0 ? argc : 1, argc > 0 ? argv : none) != 0) {
        s_fail(NULL, "bad worker flags or MQGRAD_* variables (the message above says which)");
        goto fail;
    }
    if (init) {
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++)
            total += tensors[i].count;
        w->init = malloc(total * sizeof(float));
        if (!w->init) {
            s_fail(NULL, "out of memory for %llu starting values", (unsigned long long)total);
            goto fail;
        }
        memcpy(w->init, init, total * sizeof(float));
        for (uint64_t i = 0; i < total; i++)
            if (!isfinite(w->init[i])) {
                s_fail(NULL, "starting value %llu is not finite", (unsigned long long)i);
                goto fail;
            }
    }
    w->ext.init = w->init;
    w->cfg.ext = &w->ext;
    /* The caller's process keeps its signals: CZMQ installs no handler, and the threads the
     * library starts (the actor, ZeroMQ's, the heartbeat's) block SIGINT and SIGTERM, so the
     * caller's thread takes them (Python's KeyboardInterrupt, a handler that leaves). */
    if (mq_http_open_service("worker", &w->cfg.http, &w->cfg.metrics, &w->http) != 0) {
        s_fail(NULL, "cannot serve /metrics on --http-port %ld (the message above says why)",
               w->cfg.http.port);
        goto fail;
    }
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, &old);
    w->actor = zactor_new(mq_worker_actor, &w->cfg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!w->actor) {
        s_fail(NULL, "cannot start the worker thread");
        goto fail;
    }
    if (s_await(w, "WELCOME", &w->welcome, sizeof w->welcome, w->cfg.peer_timeout) != 1) {
        snprintf(s_join_error, sizeof s_join_error, "joining the cluster at %.180s: %.300s",
                 w->cfg.scheduler, w->error);
        s_join_code = w->code == MQ_EXIT_REFUSED ? MQ_EXIT_REFUSED : 1;
        goto fail;
    }
    const mq_run_config_t *r = &w->welcome.run;
    w->run = (mqgrad_run_t){.rank = w->welcome.rank,
                            .workers = r->workers,
                            .servers = r->servers,
                            .batch = r->batch,
                            .seed = r->seed,
                            .threshold = r->quant_threshold,
                            .l2 = r->l2};
    snprintf(w->run.model, sizeof w->run.model, "%s", r->model);
    snprintf(w->run.dataset, sizeof w->run.dataset, "%s", r->dataset);
    snprintf(w->run.codec, sizeof w->run.codec, "%s", r->fp32 ? "none" : r->codec);
    snprintf(w->run.optimizer, sizeof w->run.optimizer, "%s", r->optimizer);
    return w;
fail:
    mqgrad_leave(&w);
    return NULL;
}

const mqgrad_run_t *mqgrad_run(const mqgrad_t *w)
{
    return &w->run;
}

size_t mqgrad_nparams(const mqgrad_t *w)
{
    return w->welcome.nparams;
}

float *mqgrad_params(mqgrad_t *w)
{
    return w->welcome.params;
}

float *mqgrad_grads(mqgrad_t *w)
{
    return w->welcome.grads;
}

int mqgrad_accumulates(const mqgrad_t *w, size_t tensor)
{
    return tensor < w->ext.layout.n && w->welcome.accumulate[tensor];
}

int mqgrad_zero_grads(mqgrad_t *w, int on)
{
    w->error[0] = 0;
    if (w->in_round)
        return s_fail(w, "round in progress: the gradient is the caller's until mqgrad_push");
    w->zero_grads = on != 0;
    return 0;
}

int mqgrad_next(mqgrad_t *w, mqgrad_step_t *step)
{
    w->error[0] = 0;
    if (w->code >= 0)
        return w->code == 0 ? 0 : s_fail(w, "the worker is over (exit code %d)", w->code);
    if (w->in_round)
        return s_fail(w, "round in progress: call mqgrad_push first");
    if (w->evaluate)
        return s_fail(w, "the last round asked for an evaluation: call mqgrad_evaluated first");
    uint8_t zero = w->zero_grads;
    if (s_tell(w, "NEXT", &zero, sizeof zero) != 0)
        return -1;
    /* rounds come as fast as the slowest member computes; the scheduler's silence is what the
     * peer timeout bounds, and the worker itself gives up then (DONE) */
    int rc;
    do
        rc = s_await(w, "STEP", step, sizeof *step, 3600);
    while (rc < 0 && w->code < 0 && strncmp(w->error, "no word", 7) == 0);
    if (rc == 1) {
        w->in_round = true;
        w->asked = step->evaluate != 0;
        return 1;
    }
    return rc == 0 && w->code == 0 ? 0 : -1;
}

int mqgrad_ready(mqgrad_t *w, size_t from)
{
    w->error[0] = 0;
    if (!w->in_round)
        return s_fail(w, "no round: mqgrad_ready goes between mqgrad_next and mqgrad_push");
    if (from > w->welcome.nparams)
        return s_fail(w, "mqgrad_ready(%zu): the model has %zu parameters", from,
                      w->welcome.nparams);
    uint64_t f = from;
    return s_tell(w, "READY", &f, sizeof f);
}

int mqgrad_push(mqgrad_t *w, double loss)
{
    w->error[0] = 0;
    if (!w->in_round)
        return s_fail(w, "no round to push: call mqgrad_next first");
    if (s_tell(w, "PUSH", &loss, sizeof loss) != 0)
        return -1;
    int applied = 0;
    int rc = s_await(w, "APPLIED", &applied, sizeof applied, w->cfg.iter_timeout + 60);
    w->in_round = false;
    if (rc != 1)
        return -1;
    if (!applied) {
        mq_warn("the round closed without this worker: its gradient was not applied");
        return 0;
    }
    w->evaluate = w->asked; /* the round's report waits for the caller's evaluation */
    return 0;
}

int mqgrad_evaluated(mqgrad_t *w, uint64_t correct, uint64_t total, double loss_sum)
{
    w->error[0] = 0;
    if (!w->evaluate)
        return s_fail(w, "no evaluation was asked for (step.evaluate) or it was given already");
    if (correct > total || !isfinite(loss_sum) || loss_sum < 0)
        return s_fail(w, "an evaluation of %llu right of %llu with loss sum %g is not one",
                      (unsigned long long)correct, (unsigned long long)total, loss_sum);
    struct {
        uint64_t correct, total;
        double loss_sum;
    } e = {correct, total, loss_sum};
    w->evaluate = false;
    return s_tell(w, "EVAL", &e, sizeof e);
}

int mqgrad_examples(mqgrad_t *w, uint64_t size, uint64_t pos, size_t n, int64_t *out)
{
    if (size == 0 || size > INT32_MAX)
        return s_fail(w, "a training set has 1 to %d examples, not %llu", INT32_MAX,
                      (unsigned long long)size);
    for (size_t k = 0; k < n; k++, pos++) {
        uint64_t epoch = pos / size;
        if (!w->perm || w->perm_n != size || w->perm_epoch != epoch) {
            if (w->perm_n != size) {
                free(w->perm);
                w->perm = malloc(size * sizeof *w->perm);
                w->perm_n = w->perm ? size : 0;
                if (!w->perm)
                    return s_fail(w, "out of memory for an epoch of %llu examples",
                                  (unsigned long long)size);
            }
            mq_epoch_perm(w->welcome.run.seed, epoch, w->perm, (int)size);
            w->perm_epoch = epoch;
        }
        out[k] = w->perm[pos % size];
    }
    return 0;
}

const char *mqgrad_error(const mqgrad_t *w)
{
    return w ? w->error : s_join_error;
}

int mqgrad_join_code(void)
{
    return s_join_code;
}

int mqgrad_leave(mqgrad_t **w_p)
{
    if (!w_p || !*w_p)
        return 0;
    mqgrad_t *w = *w_p;
    /* $TERM: the actor tells the scheduler it leaves unless the run is over (mq_node_leave) */
    zactor_destroy(&w->actor);
    mq_http_destroy(&w->http);
    mq_metrics_destroy(&w->cfg.metrics);
    /* left on its own (the run goes on without it) is no failure; a failed join is */
    int code = w->code >= 0 ? w->code : w->welcome.params ? 0 : 1;
    free(w->init);
    free(w->perm);
    free(w);
    *w_p = NULL;
    return code;
}
