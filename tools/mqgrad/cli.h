/* The mqgrad command line: one file per subcommand, each an mq_cmd_<name> taking the
 * arguments after the subcommand name (argv[0] is the subcommand). Exit codes: 0 success,
 * 1 failure while running, 2 bad usage (flags, files, values). */
#ifndef MQGRAD_CLI_H
#define MQGRAD_CLI_H

#include <stdbool.h>

typedef int(mq_cmd_fn)(int argc, char **argv);

typedef struct {
    const char *name;
    mq_cmd_fn *fn;
    const char *summary;
    bool trains; /* runs the model here, or starts workers and servers that inherit the
                  * OpenBLAS kernels chosen for it (mq_nn_pick_blas_core) */
} mq_cmd_t;

/* The table, defined in main.c; ends with a NULL name. */
extern const mq_cmd_t mq_cmds[];

int mq_cmd_train(int argc, char **argv);
int mq_cmd_local(int argc, char **argv);
int mq_cmd_report(int argc, char **argv);
int mq_cmd_experiment(int argc, char **argv);
int mq_cmd_summary(int argc, char **argv);
int mq_cmd_top(int argc, char **argv);
int mq_cmd_bits(int argc, char **argv);
int mq_cmd_status(int argc, char **argv);
int mq_cmd_policy(int argc, char **argv);
int mq_cmd_probe(int argc, char **argv);
int mq_cmd_keygen(int argc, char **argv);

#endif
