/* mqgrad-scheduler: flags and environment → the scheduler actor → wait until it is done or a signal. */
#include "scheduler.h"

#include "mqgrad/service.h"

int main(int argc, char **argv)
{
    mq_service_block_signals(); /* before any thread: see service.h */
    static mq_scheduler_config_t cfg;
    int rc = mq_scheduler_config_parse(&cfg, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    return mq_http_run_service("scheduler", &cfg.http, &cfg.metrics, mq_scheduler_actor, &cfg);
}
