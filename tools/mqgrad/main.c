/* mqgrad: the command line front door. Dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mqgrad/nn.h"

const mq_cmd_t mq_cmds[] = {
    {"local", mq_cmd_local, "run a whole cluster as processes on this machine", true},
    {"train", mq_cmd_train, "train in one process, no network (the reference)", true},
    {"report", mq_cmd_report, "plots and paper-style tables from run directories", false},
    {"experiment", mq_cmd_experiment, "every method x seed on a local cluster, then the report",
     true},
    {"summary", mq_cmd_summary, "what a finished run did, in a few lines", false},
    {"top", mq_cmd_top, "a live view of a training run, from the scheduler's /metrics", false},
    {"bits", mq_cmd_bits, "the agent's current bit-width", false},
    {"status", mq_cmd_status, "the agent's policy, bits, MDP step, reward, Q-values", false},
    {"policy", mq_cmd_policy, "swap the agent's policy (policy set SPEC) or show it", false},
    {"probe", mq_cmd_probe, "exit 0 if an mqgrad service answers PING (healthchecks)", false},
    {"keygen", mq_cmd_keygen, "make a cluster's CURVE keys (SECURITY.md)", false},
    {NULL, NULL, NULL, false},
};

static void s_usage(FILE *out)
{
    fprintf(out, "usage: mqgrad COMMAND [FLAGS]   (mqgrad COMMAND --help for its flags)\n\n");
    for (const mq_cmd_t *c = mq_cmds; c->name; c++)
        fprintf(out, "  %-10s %s\n", c->name, c->summary);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        s_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        s_usage(stdout);
        return 0;
    }
    for (const mq_cmd_t *c = mq_cmds; c->name; c++)
        if (strcmp(argv[1], c->name) == 0) {
            if (c->trains)
                mq_nn_pick_blas_core(argv);
            return c->fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "mqgrad: unknown command '%s'\n\n", argv[1]);
    s_usage(stderr);
    return 2;
}
