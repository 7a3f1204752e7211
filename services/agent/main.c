/* mqgrad-agent: flags → the agent actor → wait for SIGINT/SIGTERM → destroy (which saves
 * the state). Exit 0 on a signal, 1 if the agent could not start or ended by itself, 2 on
 * bad flags or an unusable state file. */
#include "agent.h"
#include "mqgrad/service.h"

int main(int argc, char **argv)
{
    mq_service_block_signals(); /* before any thread: see service.h */
    mq_agent_config_t cfg;
    int rc = mq_agent_config_parse(&cfg, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (cfg.log_level >= 0)
        mq_log_set_level((mq_log_level_t)cfg.log_level);
    mq_log_set_tag("agent");
    if (!cfg.state[0])
        mq_info("no --state file: the learned state is not persisted");
    zactor_t *agent = zactor_new(mq_agent_actor, &cfg);
    if (!agent || cfg.start_status != 0) {
        fprintf(stderr, "mqgrad-agent: %s\n", agent ? cfg.start_error : "cannot start");
        zactor_destroy(&agent);
        return cfg.start_status == 2 ? 2 : 1;
    }
    printf("agent ready: %s\n", cfg.start_info);
    fflush(stdout);
    zpoller_t *poller = zpoller_new(agent, NULL);
    bool ended = false;
    while (!mq_service_signalled() && !ended)
        ended = zpoller_wait(poller, 500) == agent; /* the actor only speaks when it ends */
    zpoller_destroy(&poller);
    zactor_destroy(&agent);
    if (ended)
        fprintf(stderr, "mqgrad-agent: the agent ended unexpectedly\n");
    else
        mq_info("stopped by a signal");
    return ended ? 1 : 0;
}
