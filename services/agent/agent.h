/* mqgrad-agent: the bit-width policy as a service. A zactor that answers OBSERVE (from the
 * scheduler), QUERY, POLICY_SET and PING on a ROUTER socket, keeps its learned state in a
 * file, and serves GET /bits, /metrics and /healthz over HTTP (libmicrohttpd). */
#ifndef MQGRAD_AGENT_H
#define MQGRAD_AGENT_H

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mqgrad/http.h"
#include "mqgrad/rl.h"
#include "mqgrad/security.h"
#include "mqgrad/util.h"
#include "mqgrad/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MQ_AGENT_DEFAULT_BIND "tcp://*:7200"
#define MQ_AGENT_DEFAULT_ENDPOINT "tcp://127.0.0.1:7200"
#define MQ_AGENT_DEFAULT_HTTP_PORT 8200

/* What the agent runs with (flags, with MQGRAD_* environment defaults), plus the outcome
 * of its start, written by the actor before its start handshake. */
typedef struct {
    char bind[256];        /* ZMQ endpoint to bind (MQGRAD_AGENT_BIND) */
    mq_http_cfg_t http;    /* every service's HTTP settings (mqgrad/http.h, MQGRAD_HTTP_*); port
                            * 0 = no HTTP, MQ_HTTP_ANY_PORT = any free one (in-process tests:
                            * read it back with the pipe command HTTP-PORT) */
    mq_sec_config_t sec;   /* keys (mqgrad/security.h); sec.open: QUERY/PING from any key */
    char policy[64];       /* policy spec (MQGRAD_POLICY) */
    char state[1024];      /* state file, "" = no persistence (MQGRAD_STATE_FILE) */
    bool fresh;            /* move a corrupt state file aside instead of refusing to start */
    mq_policy_opts_t opts; /* options of every policy the agent builds */
    int log_level;         /* -1 = MQGRAD_LOG_LEVEL or info, else an mq_log_level_t */
    bool announce;         /* print "agent ready: <start_info>" on stdout once started */
    /* Outcome of the start, valid once zactor_new has returned: 0 ready; 1 could not start
     * (bind, HTTP port, state file not writable); 2 refused (corrupt or incompatible state
     * file, bad policy). start_error says why; start_info describes a successful start. */
    int start_status;
    char start_error[1200];
    char start_info[4096];
} mq_agent_config_t;

/* Fills CFG with the defaults, taken from the environment where a variable is set.
 * Returns 0, or -1 with an error naming the variable whose value is bad. */
int mq_agent_config_default(mq_agent_config_t *cfg);

/* Contract: fills CFG from the environment defaults and then ARGV (argv[0] is the program
 * name; flags as "--name value" or "--name=value"), from one flag table as every service
 * (mqgrad/service.h). Returns 0 to run, 1 if --help was printed, 2 after printing a message
 * naming the bad flag or value (the exit code to use). The policy spec is checked by
 * building it once. */
int mq_agent_config_parse(mq_agent_config_t *cfg, int argc, char **argv);

/* The agent as a CZMQ actor on the service skeleton (mqgrad/service.h): zactor_new
 * (mq_agent_actor, cfg) with CFG a mq_agent_config_t * that must outlive the actor. Before
 * zactor_new returns, the actor has restored the state file, built the policy, bound the
 * ROUTER socket and the HTTP server, and written start_status / start_error / start_info
 * into CFG; a failed start also reports "DONE <start_status> <why>" on the pipe. Pipe
 * commands: "$TERM" (saves the state if it changed, then ends), "PORT" (the bound ZMQ port
 * as a string), "HTTP-PORT" (the HTTP port, "0" without HTTP) and "DROPS" (the
 * dropped-message counts, mq_drops_format). */
void mq_agent_actor(zsock_t *pipe, void *args);

/* Renders a status (as in a STATUS or DECISION reply) as the JSON object served at
 * GET /bits and printed by `mqgrad bits --json`: bits, policy, step, iteration,
 * last_reward, q_values (from min_bits up), min_bits, observations, decisions, fallbacks;
 * NaN and infinities as null. Returns the length written (truncated output is still valid
 * NUL-terminated text, but then the return is >= CAP). */
size_t mq_agent_status_json(const mq_status_msg_t *st, char *buf, size_t cap);

/* Ends the episode (run) of the agent state file PATH, between runs: an episodic policy
 * ("learned") records the run's return, and the file is rewritten atomically, so the next
 * run starts a new episode with what was learned. *RETURNS (malloc'd, the caller frees) and
 * *N: the returns of every episode so far (N = 0 and the file unchanged for a policy without
 * episodes). 0, or -1 with an error naming the file. */
int mq_agent_state_end_episode(const char *path, double **returns, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
