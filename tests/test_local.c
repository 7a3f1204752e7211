/* `mqgrad local` end to end: real processes over TCP loopback. A short run leaves a complete,
 * consistent run directory (the bytes each iteration sent are what the codec says they must
 * be), and a run whose agent is killed with SIGKILL still finishes on the last bits. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "mqgrad/nn.h"
#include "mqgrad/ps.h"
#include "mqgrad/util.h"

#define MQGRAD MQ_TEST_BIN_DIR "/tools/mqgrad"

static char *s_slurp(const char *dir, const char *name)
{
    char path[512], *data;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(mq_read_file(path, &data, &len), 0, "%s", mq_err_last());
    return data;
}

static pid_t s_spawn_local(const char *dir, const char *iters, const char *policy)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        execl(MQGRAD, "mqgrad", "local", "--model", "small", "--iterations", iters,
              "--eval-every", "20", "--eval-limit", "1000", "--policy", policy, "--threshold",
              "1000", "--workers", "2", "--servers", "2", "--threads", "1", "--run-dir", dir,
              "--quiet", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Waits for PID up to TIMEOUT_S seconds; returns its exit code (kills it on timeout). */
static int s_wait(pid_t pid, int timeout_s)
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

/* Payload bytes one worker pushes per iteration at BITS for the small model, 2 shards. */
static size_t s_payload_per_worker(int bits)
{
    mq_model_t *m = mq_model_new("small", 1, 1, 1e-4f);
    mq_shard_t shards[2];
    cr_assert_eq(mq_shard_plan(m, 2, 1000, false, shards), 0);
    mq_run_config_t cfg = {0};
    size_t total = 0;
    for (int s = 0; s < 2; s++)
        for (uint32_t i = 0; i < shards[s].nsegs; i++) {
            mq_codec_t c = mq_segment_codec(&shards[s].segs[i], bits, &cfg);
            total += mq_codec_payload_size(&c, shards[s].segs[i].count);
        }
    mq_model_destroy(&m);
    return total;
}

Test(local, short_run_leaves_a_consistent_run_directory, .timeout = 240)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-local-%d", (int)getpid());
    int code = s_wait(s_spawn_local(dir, "40", "fixed:4"), 200);
    cr_assert_eq(code, 0, "mqgrad local exited with %d (logs in %s/logs)", code, dir);

    char *summary = s_slurp(dir, "summary.json");
    cr_expect(strstr(summary, "\"status\": \"completed\""), "%s", summary);
    cr_expect(strstr(summary, "\"iterations\": 40"), "%s", summary);
    cr_expect(strstr(summary, "\"policy\": \"fixed:4\""), "%s", summary);
    free(summary);
    char *config = s_slurp(dir, "config.json");
    cr_expect(strstr(config, "\"workers\":2"), "%s", config);
    free(config);
    char *events = s_slurp(dir, "events.jsonl");
    cr_expect(strstr(events, "\"event\":\"stop\""), "%s", events);
    free(events);

    size_t payload = s_payload_per_worker(4);
    char *csv = s_slurp(dir, "metrics.csv"), *save;
    int rows = 0, evaluated = 0;
    for (char *line = strtok_r(csv, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (rows++ == 0)
            continue; /* header */
        long iter, bits;
        unsigned long long up, down;
        double t, loss, sm;
        cr_assert_eq(sscanf(line, "%ld,%lf,%lf,%lf,%ld,%llu,%llu", &iter, &t, &loss, &sm, &bits,
                            &up, &down), 7, "bad row: %s", line);
        cr_expect_eq(iter, rows - 2);
        cr_expect_eq(bits, 4);
        /* Two workers, each: the payloads plus one small Meta frame per shard. */
        cr_expect(up >= 2 * payload && up <= 2 * (payload + 2 * 512),
                  "iteration %ld sent %llu bytes up; the codec says %zu per worker", iter, up,
                  payload);
        cr_expect(down >= 2 * payload && down <= 2 * (payload + 2 * 512));
        const char *last = strrchr(line, ',');
        evaluated += last[-1] != ',';
    }
    cr_expect_eq(rows, 41, "metrics.csv has %d lines", rows);
    cr_expect_eq(evaluated, 2, "evaluated %d times, expected at 20 and 40", evaluated);
    free(csv);
}

/* The pid of the agent process started for run directory DIR. */
static pid_t s_find_agent(const char *dir)
{
    DIR *proc = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (proc && (e = readdir(proc)) && !found) {
        char path[300], cmd[2048];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(cmd, 1, sizeof cmd - 1, f);
        fclose(f);
        for (size_t i = 0; i < n; i++)
            cmd[i] = cmd[i] ? cmd[i] : ' ';
        cmd[n] = '\0';
        if (strstr(cmd, "/mqgrad-agent ") && strstr(cmd, dir))
            found = atoi(e->d_name);
    }
    if (proc)
        closedir(proc);
    return found;
}

Test(local, run_finishes_when_the_agent_is_killed, .timeout = 240)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-killtest-%d", (int)getpid());
    pid_t local = s_spawn_local(dir, "200", "mqgrad");
    mq_test_wait_rows(dir, 30, 120);
    pid_t agent = s_find_agent(dir);
    cr_assert_gt(agent, 0, "no agent process found");
    cr_log_info("killing agent pid %d (local %d)", (int)agent, (int)local);
    cr_assert_eq(kill(agent, SIGKILL), 0);
    int code = s_wait(local, 200);
    cr_assert_eq(code, 0, "mqgrad local exited with %d after the agent died", code);
    char *summary = s_slurp(dir, "summary.json");
    cr_expect(strstr(summary, "\"status\": \"completed\""), "%s", summary);
    cr_expect(strstr(summary, "\"iterations\": 200"), "%s", summary);
    free(summary);
    char *events = s_slurp(dir, "events.jsonl");
    cr_expect(strstr(events, "agent_fallback"), "no fallback recorded: %s", events);
    free(events);
}

Test(local, sigterm_stops_every_service_cleanly, .timeout = 240)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-sigterm-%d", (int)getpid());
    pid_t local = s_spawn_local(dir, "5000", "mqgrad");
    mq_test_wait_rows(dir, 20, 120);
    cr_assert_eq(kill(local, SIGTERM), 0);
    /* 130: interrupted, and every service exited 0 (any other code means one did not). */
    int code = s_wait(local, 60);
    cr_assert_eq(code, 130, "mqgrad local exited with %d on SIGTERM", code);
    char *summary = s_slurp(dir, "summary.json");
    cr_expect(strstr(summary, "\"status\": \"interrupted\""), "%s", summary);
    free(summary);
    char *events = s_slurp(dir, "events.jsonl");
    cr_expect(strstr(events, "\"status\":\"interrupted\""), "%s", events);
    free(events);
}
