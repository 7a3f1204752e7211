/* fuzz_runfiles: the run directory's files that are read back.
 *   checkpoint.json  the scheduler's resume point (services/scheduler/resume.c,
 *                    mq_sched_ckpt_read), and summary.json's status (mq_sched_run_finished)
 *   metrics.csv      a resumed run's last iteration and header check (common/src/util/runlog.c,
 *                    mq_runlog_last_iter, mq_runlog_append)
 *   config.json, summary.json, metrics.csv
 *                    `mqgrad report` and `mqgrad summary` (tools/mqgrad/report_load.c and
 *                    cmd_summary.c over json.c and csv.c): mq_rep_load_run with the report's
 *                    statistics on what it loaded, and mq_run_summary_print
 *   local.args       `mqgrad local --resume DIR` (tools/mqgrad/cmd_local.c, mq_local_parse)
 * Input: byte 0 says which files exist (bit k for the k-th of MQ_FUZZ_RUN_FILES), then their
 * contents in that order, each ended by a NUL byte (a missing one reads as empty). The files
 * are written to a tmpfs directory and every reader is run on it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "gen_seeds.h"
#include "local.h"
#include "mqgrad/runlog.h"
#include "report.h"
#include "run_summary.h"
#include "scheduler_internal.h"

static FILE *s_null;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    s_null = fopen("/dev/null", "w");
    if (!s_null)
        abort();
    mq_fuzz_dir();
    return 0;
}

static void s_report(const char *dir)
{
    mq_rep_run_t run;
    if (mq_rep_load_run(dir, &run) != 0)
        return;
    double t = mq_rep_run_time(&run), acc, q, a;
    volatile double sink = t;
    if (mq_rep_acc_at(&run, t, &acc))
        sink += acc;
    if (mq_rep_time_to(&run, 0.5, &acc))
        sink += acc;
    if (mq_rep_fractions(&run, &q, &a))
        sink += q + a;
    for (int m = MQ_REP_LOSS; m <= MQ_REP_BYTES; m++) {
        mq_rep_series_t *s = mq_rep_series_new(&run, (mq_rep_metric_t)m);
        double v;
        for (int k = 0; s && k <= 4; k++)
            if (mq_rep_series_at(s, t * k / 4, &v))
                sink += v;
        mq_rep_series_destroy(&s);
    }
    (void)sink;
    mq_rep_run_free(&run);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const names[] = MQ_FUZZ_RUN_FILES;
    if (size < 1)
        return 0;
    const char *dir = mq_fuzz_dir();
    char *block, *part[MQ_FUZZ_NRUN_FILES] = {0}, path[512];
    int n = mq_fuzz_strings(data + 1, size - 1, part, MQ_FUZZ_NRUN_FILES, &block);
    for (int k = 0; k < MQ_FUZZ_NRUN_FILES; k++) {
        mq_fuzz_path(names[k], path, sizeof path);
        if (data[0] & (1u << k)) {
            const char *text = k < n ? part[k] : "";
            mq_fuzz_write(path, text, strlen(text));
        } else {
            unlink(path);
        }
    }
    mq_fuzz_path("events.jsonl", path, sizeof path);
    unlink(path);
    free(block);

    mq_sched_ckpt_t ck;
    if (mq_sched_ckpt_read(dir, &ck) == 0 &&
        (ck.iter < 1 || ck.servers < 1 || ck.lineage == 0 || strlen(ck.model) >= sizeof ck.model ||
         strlen(ck.policy) >= sizeof ck.policy))
        mq_fuzz_fail("fuzz_runfiles: checkpoint.json read with iter %llu, servers %u, lineage "
                     "%llx", (unsigned long long)ck.iter, ck.servers,
                     (unsigned long long)ck.lineage);
    volatile int sink = mq_sched_run_exists(dir) + mq_sched_run_finished(dir);
    uint64_t iter;
    sink += mq_runlog_last_iter(dir, &iter);
    mq_runlog_t *log = mq_runlog_append(dir);
    mq_runlog_destroy(&log);
    s_report(dir);
    sink += mq_run_summary_print(dir, s_null);
    mq_local_opts_t opts;
    char resume[600];
    snprintf(resume, sizeof resume, "--resume=%s", dir);
    char *argv[] = {"local", resume, NULL};
    sink += mq_local_parse(&opts, 2, argv);
    (void)sink;
    return 0;
}
