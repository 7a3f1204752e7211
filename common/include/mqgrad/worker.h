/* mqgrad-worker: a model replica and a slice of the data. Per iteration it computes the
 * gradient, quantizes it, pushes one shard to each server, applies the averaged update the
 * servers send back and reports to the scheduler. Everything about the run comes from the
 * scheduler's WELCOME, so replicas need no configuration of their own. */
#ifndef MQGRAD_WORKER_H
#define MQGRAD_WORKER_H

#include <czmq.h>

#include "mqgrad/wire.h"

#include "mqgrad/http.h"
#include "mqgrad/nn.h"
#include "mqgrad/security.h"

/* A libmqgrad worker's model (mqgrad/mqgrad.h): the actor computes nothing itself. It
 * registers with LAYOUT, starts from INIT (nparams floats, or NULL: zeros) when the scheduler
 * names it the run's first worker, pulls the servers' values before its first round, and
 * hands every round to the library's caller through its pipe:
 *
 *   actor -> caller  "WELCOME" <mq_worker_welcome_t>   set up; the model's arrays
 *                    "STEP" <mqgrad_step_t>            compute this round (after "NEXT")
 *                    "APPLIED" <0|1>                   the aggregates are applied (1), or the
 *                                                      round closed without this worker (0)
 *                    "DONE <code>"                     the actor is over (mqgrad/service.h)
 *   caller -> actor  "NEXT" [<u8 zero>]                waiting for a round; ZERO 1: hand it
 *                                                      over with the gradient zero but for
 *                                                      the residuals (mqgrad_zero_grads)
 *                    "PUSH" <double loss>              the gradient is in place
 *                    "EVAL" <u64 correct, u64 total, double loss_sum>
 *
 * Between "STEP" and "PUSH" the caller owns the arrays; otherwise the actor may write them. */
typedef struct {
    mq_layout_t layout;
    const float *init;
} mq_worker_ext_t;

typedef struct {
    float *params, *grads;
    size_t nparams;
    bool accumulate[MQ_LAYOUT_MAX];
    uint32_t rank;
    mq_run_config_t run;
} mq_worker_welcome_t;

typedef struct {
    char scheduler[256];  /* endpoint of the scheduler */
    char data_dir[512];   /* where the dataset files are */
    long threads;         /* OpenBLAS threads, 0 = its default */
    double peer_timeout;  /* seconds without a word from the scheduler before giving up */
    double iter_timeout;  /* seconds to wait for the servers' replies */
    char dump[512];       /* if set, write the final parameters here (tests) */
    mq_sec_config_t sec;  /* keys (mqgrad/security.h) */
    mq_http_cfg_t http;   /* /metrics (mqgrad/http.h) */
    mq_metrics_t *metrics; /* the registry main serves, or NULL: no metrics */
    const mq_worker_ext_t *ext; /* a libmqgrad worker's model, or NULL: the built-in ones */
} mq_worker_config_t;

/* Fills CFG from defaults, MQGRAD_* variables and ARGV. Returns 0, 1 (help printed) or 2
 * (bad flag, message printed). */
int mq_worker_config_parse(mq_worker_config_t *cfg, int argc, char **argv);

/* The worker as a CZMQ actor; ARGS is a mq_worker_config_t that must outlive it. Reports
 * "DONE <code>" on its pipe when the run is over (0) or it gave up (1). */
void mq_worker_actor(zsock_t *pipe, void *args);

#endif
