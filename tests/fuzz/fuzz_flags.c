/* fuzz_flags: what turns a command line and the environment into a configuration.
 *   0 mqgrad-scheduler  mq_scheduler_config_parse (services/scheduler/config.c, through
 *                       mq_flags_parse of common/src/util/service.c), then what the scheduler
 *                       derives from it: the run configuration, config.json, the lr schedule
 *   1 mqgrad-server     mq_server_config_parse
 *   2 mqgrad-worker     mq_worker_config_parse
 *   3 mqgrad-agent      mq_agent_config_parse (services/agent/agent_config.c; builds the
 *                       policy spec with common/src/rl's registry)
 *   4 mqgrad local      mq_local_parse (tools/mqgrad/cmd_local.c)
 *   5 specs             each string as a codec spec (mq_codec_parse), a policy spec
 *                       (mq_policy_new), an update rule (mq_optim_parse), a link schedule
 *                       (mq_link_spec_check, mq_link_rate_for), an experiment method
 *                       (mq_method_resolve), a straggler policy and a log level
 *   6 numbers           each string through mq_parse_long and mq_parse_double
 * Input: byte 0 picks one (modulo 7); the rest is cut at NUL bytes into strings. A string
 * "MQGRAD_NAME=VALUE" sets that environment variable for this input (unset after it); the
 * others are the arguments after argv[0]. Checked besides the sanitizers: a codec or update
 * rule spec that parses formats to one that parses to the same. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "fuzz_util.h"
#include "local.h"
#include "methods.h"
#include "mqgrad/optim.h"
#include "mqgrad/ps.h"
#include "mqgrad/quant.h"
#include "mqgrad/rl.h"
#include "mqgrad/util.h"
#include "scheduler.h"
#include "scheduler_internal.h"
#include "server.h"
#include "mqgrad/worker.h"

#define S_MAX_ARGS 64

/* A link schedule that parses: every node's schedule carries bytes forward and back to where
 * they started (mq_link_rate_finish, mq_link_rate_start). */
static void s_link(const char *spec)
{
    char err[256];
    if (mq_link_spec_check(spec, err, sizeof err) != 0)
        return;
    static const char *const roles[] = {"worker", "server"};
    for (int k = 0; k < 4; k++) {
        mq_link_rate_t r;
        if (mq_link_rate_for(spec, roles[k % 2], k / 2, &r, err, sizeof err) != 0)
            mq_fuzz_fail("fuzz_flags: link '%s' checks but does not resolve: %s", spec, err);
        for (double t = 0; t < 100; t += 7.3) {
            double bytes = 1e3 + t * 1e5, end = mq_link_rate_finish(&r, t, bytes);
            double back = mq_link_rate_start(&r, end, bytes);
            if (!(end >= t) || fabs(back - t) > 1e-6 * (1 + fabs(end)))
                mq_fuzz_fail("fuzz_flags: link '%s': %g bytes from %g end at %g, which go back "
                             "to %g",
                             spec, bytes, t, end, back);
        }
    }
}

static void s_specs(char *const *s, int n)
{
    for (int i = 0; i < n; i++) {
        mq_codec_t c, back;
        if (mq_codec_parse(s[i], &c) == 0) {
            char spec[MQ_CODEC_MAX_SPEC];
            mq_codec_format(&c, spec, sizeof spec);
            if (mq_codec_parse(spec, &back) != 0 || !mq_codec_equal(&c, &back)) {
                mq_fuzz_fail("fuzz_flags: codec '%s' formats to '%s', which %s", s[i], spec,
                             mq_codec_parse(spec, &back) ? "does not parse" : "differs");
            }
        }
        mq_optim_t o, o2;
        if (mq_optim_parse(s[i], &o) == 0) {
            char a[256], b[256];
            mq_optim_format(&o, a, sizeof a);
            if (mq_optim_parse(a, &o2) != 0) {
                mq_fuzz_fail("fuzz_flags: rule '%s' formats to '%s', which does not parse: %s",
                             s[i], a, mq_err_last());
            }
            mq_optim_format(&o2, b, sizeof b);
            if (strcmp(a, b) != 0) {
                mq_fuzz_fail("fuzz_flags: rule '%s' formats to '%s', then to '%s'", s[i], a, b);
            }
        }
        mq_policy_t *p = mq_policy_new(s[i], NULL);
        if (p) {
            mq_policy_status_t st;
            mq_policy_status(p, &st);
            mq_policy_destroy(&p);
        }
        s_link(s[i]);
        mq_method_t m;
        volatile int sink = mq_method_resolve(s[i], &m);
        mq_stragglers_t kind;
        double v;
        mq_log_level_t lv;
        sink += mq_sched_stragglers(s[i], &kind, &v) + mq_log_parse_level(s[i], &lv);
        (void)sink;
    }
}

static void s_numbers(char *const *s, int n)
{
    static const long lo[] = {0, 1, -1, -1000000000L, 0};
    static const long hi[] = {1, 4096, 1L << 62, 1000000000L, __LONG_MAX__};
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 5; k++) {
            long l;
            double d;
            if (mq_parse_long("fuzz", s[i], lo[k], hi[k], &l) == 0 && (l < lo[k] || l > hi[k]))
                mq_fuzz_fail("fuzz_flags: '%s' parsed to %ld outside %ld..%ld", s[i], l, lo[k],
                             hi[k]);
            if (mq_parse_double("fuzz", s[i], (double)lo[k], (double)hi[k], &d) == 0 &&
                !(d >= (double)lo[k] && d <= (double)hi[k]))
                mq_fuzz_fail("fuzz_flags: '%s' parsed to %g outside %ld..%ld", s[i], d, lo[k],
                             hi[k]);
        }
}

static void s_scheduler(int argc, char **argv)
{
    static mq_scheduler_config_t cfg;
    if (mq_scheduler_config_parse(&cfg, argc, argv) != 0)
        return;
    mq_run_config_t run;
    mq_sched_run_config(&cfg, &run);
    char json[2048]; /* the scheduler's buffer (scheduler.c, s_open_run) */
    if (mq_sched_config_json(&cfg, json, sizeof json) != 0) {
        mq_fuzz_fail("fuzz_flags: config.json does not fit the scheduler's %zu bytes",
                     sizeof json);
    }
    volatile double lr = mq_sched_lr(&cfg, 0) + mq_sched_lr(&cfg, 0.99) + mq_sched_lr(&cfg, 1);
    (void)lr;
    mq_codec_t c;
    if (mq_codec_parse(run.codec, &c) != 0) {
        mq_fuzz_fail("fuzz_flags: the scheduler hands its nodes codec '%s', which they refuse: %s",
                     run.codec, mq_err_last());
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *block, *s[S_MAX_ARGS], *argv[S_MAX_ARGS + 2], *env[S_MAX_ARGS];
    int n = mq_fuzz_strings(data + 1, size - 1, s, S_MAX_ARGS, &block), argc = 1, nenv = 0;
    argv[0] = "fuzz";
    for (int i = 0; i < n; i++) {
        char *eq = strchr(s[i], '=');
        if (strncmp(s[i], "MQGRAD_", 7) == 0 && eq) {
            *eq = '\0';
            setenv(s[i], eq + 1, 1);
            env[nenv++] = s[i];
        } else {
            argv[argc++] = s[i];
        }
    }
    argv[argc] = NULL;
    switch (data[0] % 7) {
    case 0:
        s_scheduler(argc, argv);
        break;
    case 1: {
        static mq_server_config_t cfg;
        mq_server_config_parse(&cfg, argc, argv);
        break;
    }
    case 2: {
        static mq_worker_config_t cfg;
        mq_worker_config_parse(&cfg, argc, argv);
        break;
    }
    case 3: {
        static mq_agent_config_t cfg;
        mq_agent_config_parse(&cfg, argc, argv);
        break;
    }
    case 4: {
        static mq_local_opts_t o;
        mq_local_parse(&o, argc, argv);
        break;
    }
    case 5:
        s_specs(argv + 1, argc - 1);
        break;
    default:
        s_numbers(argv + 1, argc - 1);
        break;
    }
    for (int i = 0; i < nenv; i++)
        unsetenv(env[i]);
    free(block);
    return 0;
}
