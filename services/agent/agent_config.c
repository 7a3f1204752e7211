/* The agent's flags: every setting is a flag, the deployment-facing ones with an MQGRAD_*
 * environment variable as default (twelve-factor), in one table as every service's. Bad
 * values are refused with a message naming the flag or variable; nothing is guessed. */
#include "agent.h"
#include "mqgrad/http.h"
#include "mqgrad/service.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Every flag of the agent in one table (mqgrad/service.h): parsing, the MQGRAD_* defaults,
 * --help and the checks of each value come from it. SEED and LEVEL receive what needs
 * converting after the parse. */
typedef struct {
    long seed;
    char level[16];
} s_extra_t;

static int s_parse(mq_agent_config_t *cfg, s_extra_t *x, int argc, char **argv)
{
    mq_policy_opts_t *o = &cfg->opts;
    char usage[4096], policies[2048];
    mq_policy_help(policies, sizeof policies);
    snprintf(usage, sizeof usage,
             "usage: mqgrad-agent [flags]\n"
             "The bit-width policy service: OBSERVE/QUERY/POLICY_SET/PING over ZeroMQ, GET "
             "/bits, /metrics, /healthz over HTTP.\n\n"
             "policies (--policy SPEC); each also takes :key=value of T, alpha, epsilon, eta, "
             "discount,\ngamma, min, max, start, hidden, tau, seed, literal_eq3 (its own key "
             "wins):\n%s",
             policies);
    const mq_flag_t flags[] = {
        {"bind", "MQGRAD_AGENT_BIND", MQ_FLAG_STR, cfg->bind, sizeof cfg->bind, 1, 0,
         "ZeroMQ endpoint to bind"},
        MQ_HTTP_FLAGS(&cfg->http),
        MQ_SEC_FLAGS(&cfg->sec),
        {"open-query", "MQGRAD_OPEN_QUERY", MQ_FLAG_BOOL, &cfg->sec.open, 0, 0, 0,
         "QUERY and PING from any key, not only the cluster's (POLICY_SET still needs an "
         "operator key)"},
        {"policy", "MQGRAD_POLICY", MQ_FLAG_STR, cfg->policy, sizeof cfg->policy, 1, 0,
         "one of the policies listed above, optionally with :key=value,..."},
        {"state", "MQGRAD_STATE_FILE", MQ_FLAG_STR, cfg->state, sizeof cfg->state, 0, 0,
         "state file, written after every decision and swap and resumed at start (none: no "
         "persistence)"},
        {"fresh", NULL, MQ_FLAG_BOOL, &cfg->fresh, 0, 0, 0,
         "if the state file is corrupt or incompatible, move it to PATH.corrupt-<unix time> "
         "and start anew instead of refusing (a valid file is always resumed)"},
        {"seed", "MQGRAD_SEED", MQ_FLAG_LONG, &x->seed, 0, 0, 9.2e18,
         "weights and exploration seed"},
        {"T", NULL, MQ_FLAG_INT, &o->T, 0, 2, 4096, "iterations per MDP step"},
        {"alpha", NULL, MQ_FLAG_DOUBLE, &o->alpha, 0, 0, 1, "loss smoothing, equation (1)"},
        {"epsilon", NULL, MQ_FLAG_DOUBLE, &o->epsilon, 0, 0, 1, "epsilon-greedy exploration"},
        {"eta", NULL, MQ_FLAG_DOUBLE, &o->eta, 0, 0, 1e6, "SARSA learning rate"},
        {"discount", NULL, MQ_FLAG_DOUBLE, &o->discount, 0, 0, 1, "SARSA discount"},
        {"gamma", NULL, MQ_FLAG_DOUBLE, &o->gamma, 0, 0, 1e12, "reward scale, equation (2)"},
        {"min-bits", NULL, MQ_FLAG_INT, &o->min_bits, 0, 1, 8, "smallest bit-width"},
        {"max-bits", NULL, MQ_FLAG_INT, &o->max_bits, 0, 1, 8, "largest bit-width"},
        {"start-bits", NULL, MQ_FLAG_INT, &o->start_bits, 0, 1, 8,
         "first bit-width of a new policy (0: 2, or --min-bits when that is more)"},
        {"hidden", NULL, MQ_FLAG_INT, &o->hidden, 0, 1, 256, "Q-network hidden units"},
        {"tau", NULL, MQ_FLAG_DOUBLE, &o->tau, 0, 0, 1e6,
         "adaptive: noise threshold relative to mean(g^2)"},
        {"log-level", NULL, MQ_FLAG_STR, x->level, sizeof x->level, 1, 0,
         "error | warn | info | debug (default: MQGRAD_LOG_LEVEL, or info)"},
        {0},
    };
    return mq_flags_parse(flags, argc, argv, usage, NULL, 0, NULL);
}

static void s_defaults(mq_agent_config_t *cfg, s_extra_t *x)
{
    memset(cfg, 0, sizeof *cfg);
    memset(x, 0, sizeof *x);
    snprintf(cfg->bind, sizeof cfg->bind, "%s", MQ_AGENT_DEFAULT_BIND);
    mq_http_cfg_init(&cfg->http, MQ_AGENT_DEFAULT_HTTP_PORT);
    snprintf(cfg->policy, sizeof cfg->policy, "mqgrad");
    cfg->log_level = -1;
    mq_policy_opts_default(&cfg->opts);
    x->seed = (long)cfg->opts.seed;
    cfg->opts.start_bits = 0; /* not given: follows the bit range (s_check) */
}

/* Checks what single flags cannot: the bit range, the keys, and the policy spec (by building
 * it); converts the seed and the log level. -1 with an error naming the flag. */
static int s_check(mq_agent_config_t *cfg, const s_extra_t *x)
{
    mq_policy_opts_t *o = &cfg->opts;
    o->seed = (uint64_t)x->seed;
    if (x->level[0]) {
        mq_log_level_t lv;
        if (mq_log_parse_level(x->level, &lv) != 0) {
            char why[256];
            snprintf(why, sizeof why, "%s", mq_err_last());
            return mq_err_set("--log-level: %s", why), -1;
        }
        cfg->log_level = (int)lv;
    }
    if (mq_http_cfg_resolve(&cfg->http) != 0)
        return -1;
    if (o->min_bits > o->max_bits)
        return mq_err_set("--min-bits %d is above --max-bits %d", o->min_bits, o->max_bits), -1;
    if (o->start_bits == 0) { /* the default start (2) follows the range */
        mq_policy_opts_t d;
        mq_policy_opts_default(&d);
        o->start_bits = d.start_bits < o->min_bits   ? o->min_bits
                        : d.start_bits > o->max_bits ? o->max_bits
                                                     : d.start_bits;
    }
    if (mq_sec_config_check(&cfg->sec, NULL) != 0)
        return -1;
    mq_policy_t *p = mq_policy_new(cfg->policy, o);
    if (!p) {
        char why[512];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("--policy '%s': %s", cfg->policy, why);
        return -1;
    }
    mq_policy_destroy(&p);
    return 0;
}

/* Contract: see agent.h. */
int mq_agent_config_default(mq_agent_config_t *cfg)
{
    s_extra_t x;
    s_defaults(cfg, &x);
    char *argv[] = {"mqgrad-agent", NULL};
    if (s_parse(cfg, &x, 1, argv) != 0)
        return -1; /* the variable's error, as mq_err_last */
    cfg->opts.seed = (uint64_t)x.seed;
    if (cfg->opts.start_bits == 0) {
        mq_policy_opts_t d;
        mq_policy_opts_default(&d);
        cfg->opts.start_bits = d.start_bits;
    }
    return 0;
}

/* Contract: see agent.h. */
int mq_agent_config_parse(mq_agent_config_t *cfg, int argc, char **argv)
{
    s_extra_t x;
    s_defaults(cfg, &x);
    int rc = s_parse(cfg, &x, argc, argv);
    if (rc != 0)
        return rc;
    if (s_check(cfg, &x) != 0) {
        fprintf(stderr, "%s: %s\n", argv[0], mq_err_last());
        return 2;
    }
    return 0;
}
