/* mqgrad-server: flags and environment → the server actor → wait until it is done or a signal. */
#include "server.h"

#include "mqgrad/nn.h"
#include "mqgrad/service.h"

int main(int argc, char **argv)
{
    mq_nn_pick_blas_core(argv); /* may run this program again: first */
    mq_service_block_signals(); /* before any thread: see service.h */
    static mq_server_config_t cfg;
    int rc = mq_server_config_parse(&cfg, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    return mq_http_run_service("server", &cfg.http, &cfg.metrics, mq_server_actor, &cfg);
}
