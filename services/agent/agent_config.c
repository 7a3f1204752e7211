/* The agent's flags: every setting is a flag, the deployment-facing ones with an MQGRAD_*
 * environment variable as default (twelve-factor). Bad values are refused with a message
 * naming the flag or variable; nothing is guessed. */
#include "agent.h"
#include "mqgrad/http.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Flags that take no value. */
static bool s_is_switch(const char *name)
{
    return strcmp(name, "fresh") == 0 || strcmp(name, "help") == 0 ||
           strcmp(name, "insecure") == 0 || strcmp(name, "open-query") == 0;
}

static int s_set_bool(const char *what, const char *val, bool *out)
{
    if (!strcmp(val, "1") || !strcmp(val, "true") || !strcmp(val, "yes"))
        *out = true;
    else if (!strcmp(val, "0") || !strcmp(val, "false") || !strcmp(val, "no"))
        *out = false;
    else
        return mq_err_set("%s: '%s' is not a boolean (true/false/1/0)", what, val), -1;
    return 0;
}

static int s_set_int(const char *what, const char *val, long lo, long hi, int *out)
{
    long v;
    if (mq_parse_long(what, val, lo, hi, &v) != 0)
        return -1;
    *out = (int)v;
    return 0;
}

static int s_copy(const char *what, const char *val, char *dst, size_t cap)
{
    if (strlen(val) >= cap) {
        mq_err_set("%s: value is too long (at most %zu characters)", what, cap - 1);
        return -1;
    }
    memcpy(dst, val, strlen(val) + 1);
    return 0;
}

/* The bearer token, or the file whose first line it is (a Docker secret, say): read and
 * checked once every setting is in (s_check), as every service's (mqgrad/http.h). */
static int s_set_token(mq_agent_config_t *cfg, const char *what, const char *val, bool file)
{
    if (!*val)
        return mq_err_set("%s: the %s must not be empty", what, file ? "file name" : "token"),
               -1;
    return file ? s_copy(what, val, cfg->http.token_file, sizeof cfg->http.token_file)
                : s_copy(what, val, cfg->http.token, sizeof cfg->http.token);
}

/* The SARSA / baseline options (see mq_policy_opts_t). */
static int s_set_opt(mq_policy_opts_t *o, const char *name, const char *what, const char *val,
                     bool *start_given)
{
    double *d = NULL, hi = 1;
    if (strcmp(name, "alpha") == 0)
        d = &o->alpha;
    else if (strcmp(name, "epsilon") == 0)
        d = &o->epsilon;
    else if (strcmp(name, "eta") == 0)
        d = &o->eta, hi = 1e6;
    else if (strcmp(name, "discount") == 0)
        d = &o->discount;
    else if (strcmp(name, "gamma") == 0)
        d = &o->gamma, hi = 1e12;
    else if (strcmp(name, "tau") == 0)
        d = &o->tau, hi = 1e6;
    if (d) /* zero where the policy needs > 0 is refused by its own check, by name */
        return mq_parse_double(what, val, 0, hi, d);
    if (strcmp(name, "T") == 0)
        return s_set_int(what, val, 2, 4096, &o->T);
    if (strcmp(name, "min-bits") == 0)
        return s_set_int(what, val, 1, 8, &o->min_bits);
    if (strcmp(name, "max-bits") == 0)
        return s_set_int(what, val, 1, 8, &o->max_bits);
    if (strcmp(name, "hidden") == 0)
        return s_set_int(what, val, 1, 256, &o->hidden);
    if (strcmp(name, "start-bits") == 0) {
        *start_given = true;
        return s_set_int(what, val, 1, 8, &o->start_bits);
    }
    mq_err_set("unknown flag '--%s' (see --help)", name);
    return -1;
}

/* Applies one setting NAME=VAL; WHAT names its origin (a flag or a variable) for errors. */
static int s_apply(mq_agent_config_t *cfg, const char *name, const char *what, const char *val,
                   bool *start_given)
{
    if (strcmp(name, "bind") == 0)
        return s_copy(what, val, cfg->bind, sizeof cfg->bind);
    if (strcmp(name, "http-port") == 0)
        return mq_parse_long(what, val, 0, 65535, &cfg->http.port);
    if (strcmp(name, "http-bind") == 0)
        return s_copy(what, val, cfg->http.bind, sizeof cfg->http.bind);
    if (strcmp(name, "http-token-file") == 0 || strcmp(name, "http-token") == 0)
        return s_set_token(cfg, what, val, strcmp(name, "http-token-file") == 0);
    if (strcmp(name, "keys") == 0)
        return s_copy(what, val, cfg->sec.keys, sizeof cfg->sec.keys);
    if (strcmp(name, "key") == 0)
        return s_copy(what, val, cfg->sec.key, sizeof cfg->sec.key);
    if (strcmp(name, "insecure") == 0)
        return s_set_bool(what, val, &cfg->sec.insecure);
    if (strcmp(name, "open-query") == 0)
        return s_set_bool(what, val, &cfg->sec.open);
    if (strcmp(name, "policy") == 0)
        return s_copy(what, val, cfg->policy, sizeof cfg->policy);
    if (strcmp(name, "state") == 0)
        return s_copy(what, val, cfg->state, sizeof cfg->state);
    if (strcmp(name, "fresh") == 0)
        return s_set_bool(what, val, &cfg->fresh);
    if (strcmp(name, "seed") == 0) {
        long v;
        if (mq_parse_long(what, val, 0, __LONG_MAX__, &v) != 0)
            return -1;
        cfg->opts.seed = (uint64_t)v;
        return 0;
    }
    if (strcmp(name, "log-level") == 0) {
        mq_log_level_t lv;
        if (mq_log_parse_level(val, &lv) != 0) {
            char why[256];
            snprintf(why, sizeof why, "%s", mq_err_last());
            mq_err_set("%s: %s", what, why);
            return -1;
        }
        cfg->log_level = (int)lv;
        return 0;
    }
    return s_set_opt(&cfg->opts, name, what, val, start_given);
}

/* Contract: see agent.h. */
int mq_agent_config_default(mq_agent_config_t *cfg)
{
    static const char *env[][2] = {{"bind", "MQGRAD_AGENT_BIND"},
                                   {"http-port", "MQGRAD_HTTP_PORT"},
                                   {"http-bind", "MQGRAD_HTTP_BIND"},
                                   {"http-token", "MQGRAD_HTTP_TOKEN"},
                                   {"http-token-file", "MQGRAD_HTTP_TOKEN_FILE"},
                                   {"keys", "MQGRAD_KEYS"},
                                   {"key", "MQGRAD_KEY"},
                                   {"insecure", "MQGRAD_INSECURE"},
                                   {"open-query", "MQGRAD_OPEN_QUERY"},
                                   {"policy", "MQGRAD_POLICY"},
                                   {"state", "MQGRAD_STATE_FILE"},
                                   {"seed", "MQGRAD_SEED"}};
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->bind, sizeof cfg->bind, "%s", MQ_AGENT_DEFAULT_BIND);
    mq_http_cfg_init(&cfg->http, MQ_AGENT_DEFAULT_HTTP_PORT);
    snprintf(cfg->policy, sizeof cfg->policy, "mqgrad");
    cfg->log_level = -1;
    mq_policy_opts_default(&cfg->opts);
    bool unused = false;
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++) {
        const char *v = mq_env_str(env[i][1], NULL);
        if (v && s_apply(cfg, env[i][0], env[i][1], v, &unused) != 0)
            return -1;
    }
    return 0;
}

/* Checks what single flags cannot: the bit range, and the policy spec (by building it). */
static int s_check(mq_agent_config_t *cfg, bool start_given)
{
    if (mq_http_cfg_resolve(&cfg->http) != 0)
        return -1;
    mq_policy_opts_t *o = &cfg->opts;
    if (o->min_bits > o->max_bits) {
        mq_err_set("--min-bits %d is above --max-bits %d", o->min_bits, o->max_bits);
        return -1;
    }
    if (!start_given) /* the default start (2) follows the range when only the range is set */
        o->start_bits = o->start_bits < o->min_bits   ? o->min_bits
                        : o->start_bits > o->max_bits ? o->max_bits
                                                      : o->start_bits;
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
int mq_agent_config_parse(mq_agent_config_t *cfg, int argc, char **argv)
{
    if (mq_agent_config_default(cfg) != 0)
        return -1;
    bool start_given = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || !arg[2]) {
            mq_err_set("unexpected argument '%s' (flags start with --; see --help)", arg);
            return -1;
        }
        char name[64];
        const char *eq = strchr(arg, '='), *val;
        size_t n = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (n >= sizeof name) {
            mq_err_set("unknown flag '%s' (see --help)", arg);
            return -1;
        }
        memcpy(name, arg + 2, n);
        name[n] = '\0';
        if (strcmp(name, "help") == 0 || strcmp(name, "h") == 0)
            return 1;
        if (s_is_switch(name)) {
            val = eq ? eq + 1 : "1"; /* --fresh=false is a word to check, not a yes */
        } else if (eq) {
            val = eq + 1;
        } else if (i + 1 < argc) {
            val = argv[++i];
        } else {
            mq_err_set("flag '--%s' needs a value", name);
            return -1;
        }
        char what[80];
        snprintf(what, sizeof what, "--%s", name);
        if (s_apply(cfg, name, what, val, &start_given) != 0)
            return -1;
    }
    return s_check(cfg, start_given);
}

void mq_agent_usage(FILE *out)
{
    mq_policy_opts_t d;
    mq_policy_opts_default(&d);
    fprintf(out,
            "usage: mqgrad-agent [FLAGS]\n"
            "The bit-width policy service: OBSERVE/QUERY/POLICY_SET/PING over ZeroMQ, GET "
            "/bits, /metrics, /healthz over HTTP.\n\n"
            "  --bind ENDPOINT     ZeroMQ endpoint to bind (MQGRAD_AGENT_BIND, %s)\n"
            "  --http-port PORT    HTTP port, 0 = no HTTP (MQGRAD_HTTP_PORT, %d)\n"
            "  --http-bind ADDR    HTTP address, * = every interface (MQGRAD_HTTP_BIND, *)\n"
            "  --http-token-file F /bits and /metrics need 'Authorization: Bearer <F's first\n"
            "                      line>' (MQGRAD_HTTP_TOKEN_FILE, or the token in\n"
            "                      MQGRAD_HTTP_TOKEN; /healthz stays open)\n"
            "  --keys DIR          the cluster's public keys (MQGRAD_KEYS; mqgrad keygen DIR)\n"
            "  --key FILE          the agent's secret key (MQGRAD_KEY; KEYS/agent.key_secret)\n"
            "  --open-query        QUERY and PING from any key, not only the cluster's\n"
            "                      (MQGRAD_OPEN_QUERY; POLICY_SET still needs an operator key)\n"
            "  --insecure          no authentication, no encryption (MQGRAD_INSECURE)\n"
            "  --policy SPEC       one of the policies listed below, optionally with\n"
            "                      :key=value,... (MQGRAD_POLICY, mqgrad)\n"
            "  --state PATH        state file, written after every decision and swap and\n"
            "                      resumed at start (MQGRAD_STATE_FILE; default: none)\n"
            "  --fresh             if the state file is corrupt or incompatible, move it to\n"
            "                      PATH.corrupt-<unix time> and start anew instead of refusing\n"
            "                      (a valid file is always resumed)\n"
            "  --seed N            weights and exploration seed (MQGRAD_SEED, %llu)\n"
            "  --T N               iterations per MDP step (%d)\n"
            "  --alpha X           loss smoothing, equation (1) (%g)\n"
            "  --epsilon X         epsilon-greedy exploration (%g)\n"
            "  --eta X             SARSA learning rate (%g)\n"
            "  --discount X        SARSA discount (%g)\n"
            "  --gamma X           reward scale, equation (2) (%g)\n"
            "  --min-bits N        smallest bit-width (%d)\n"
            "  --max-bits N        largest bit-width (%d)\n"
            "  --start-bits N      first bit-width of a new policy (%d, or --min-bits)\n"
            "  --hidden N          Q-network hidden units (%d)\n"
            "  --tau X             adaptive: noise threshold relative to mean(g^2) (%g)\n"
            "  --log-level LEVEL   error | warn | info | debug (MQGRAD_LOG_LEVEL, info)\n"
            "  --help              this text\n",
            MQ_AGENT_DEFAULT_BIND, MQ_AGENT_DEFAULT_HTTP_PORT, (unsigned long long)d.seed, d.T,
            d.alpha, d.epsilon, d.eta, d.discount, d.gamma, d.min_bits, d.max_bits, d.start_bits,
            d.hidden, d.tau);
    char policies[2048];
    mq_policy_help(policies, sizeof policies);
    fprintf(out,
            "\npolicies (SPEC); each also takes :key=value of T, alpha, epsilon, eta, discount,\n"
            "gamma, min, max, start, hidden, tau, seed, literal_eq3 (its own key wins):\n%s",
            policies);
}
