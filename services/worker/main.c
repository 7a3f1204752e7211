/* mqgrad-worker: flags and environment → the worker actor → wait until it is done or a signal. */
#include "mqgrad/worker.h"

#include "mqgrad/nn.h"
#include "mqgrad/service.h"

int main(int argc, char **argv)
{
    mq_nn_pick_blas_core(argv); /* may run this program again: first */
    mq_service_block_signals(); /* before any thread: see service.h */
    static mq_worker_config_t cfg;
    int rc = mq_worker_config_parse(&cfg, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    return mq_http_run_service("worker", &cfg.http, &cfg.metrics, mq_worker_actor, &cfg);
}
