/* mqgrad-agent: flags → the agent actor, on the service skeleton → until SIGINT/SIGTERM
 * (the actor then saves the state). Exit 0 on a signal, 1 if the agent could not start or
 * ended by itself, 2 on bad flags or an unusable state file. */
#include "agent.h"
#include "mqgrad/service.h"

int main(int argc, char **argv)
{
    mq_service_block_signals(); /* before any thread: see service.h */
    static mq_agent_config_t cfg;
    int rc = mq_agent_config_parse(&cfg, argc, argv);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (cfg.log_level >= 0)
        mq_log_set_level((mq_log_level_t)cfg.log_level);
    mq_log_set_tag("agent");
    if (!cfg.state[0])
        mq_info("no --state file: the learned state is not persisted");
    cfg.announce = true;
    rc = mq_service_run(mq_agent_actor, &cfg);
    if (rc == 0)
        mq_info("stopped by a signal");
    return rc;
}
