/* Running `mqgrad local` from a test: spawn it (2 workers, 2 servers, one BLAS thread each,
 * quiet), wait for it with a deadline, and read what it left in the run directory. */
#ifndef MQGRAD_TEST_LOCAL_RUN_H
#define MQGRAD_TEST_LOCAL_RUN_H

#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mqgrad/util.h"

#define MQGRAD MQ_TEST_BIN_DIR "/tools/mqgrad"

__attribute__((noinline, unused)) static char *test_slurp(const char *dir, const char *name)
{
    char path[512], *data;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(mq_read_file(path, &data, &len), 0, "%s", mq_err_last());
    return data;
}

/* Starts `mqgrad COMMAND` with FIXED then ARGS (both NULL-terminated), 2 workers, 2 servers,
 * one BLAS thread each, its standard output to /dev/null. */
static inline pid_t test_spawn_mqgrad(const char *command, const char *const *fixed,
                                      const char *const *args)
{
    const char *argv[80] = {"mqgrad", command, "--workers", "2", "--servers", "2", "--threads",
                            "1"};
    int n = 8;
    while (*fixed && n < 40)
        argv[n++] = *fixed++;
    while (*args && n < 79)
        argv[n++] = *args++;
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execv(MQGRAD, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Starts `mqgrad local` with ARGS (NULL-terminated, after "local") into run directory DIR,
 * quiet. */
static inline pid_t test_spawn_args(const char *dir, const char *const *args)
{
    const char *fixed[] = {"--run-dir", dir, "--quiet", NULL};
    return test_spawn_mqgrad("local", fixed, args);
}

/* Waits for PID up to TIMEOUT_S seconds; returns its exit code (kills it on timeout). */
static inline int test_wait(pid_t pid, int timeout_s)
{
    int status;
    for (int i = 0; i < timeout_s * 10; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(100000);
    }
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    cr_assert_fail("mqgrad local did not finish within %d s", timeout_s);
    return -1;
}

/* The value of numeric field NAME in a summary.json or a JSON line (NAN when absent). */
static inline double test_json_num(const char *json, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *p = strstr(json, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

/* Removes DIR and everything under it (a test's scratch run directory); false, with a
 * warning, if that failed. */
static inline bool test_rmtree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) == 0)
        return true;
    cr_log_warn("could not remove %s", dir);
    return false;
}

#endif
