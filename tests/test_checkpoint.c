/* Shard checkpoint files (mqgrad/checkpoint.h): what is written is read back bit for bit;
 * a file of another run, shard, iteration, model or update rule, a cut file and a corrupt one
 * are refused with the reason and left as they are; the two newest are kept. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqgrad/checkpoint.h"
#include "mqgrad/util.h"

#define S_N 1000

static mq_ckpt_meta_t s_meta(uint64_t iter)
{
    mq_ckpt_meta_t m = {.lineage = 0x1234abcd5678ef01ULL, .iter = iter, .shard = 1, .servers = 2};
    snprintf(m.model, sizeof m.model, "small");
    snprintf(m.optimizer, sizeof m.optimizer, "momentum:0.9");
    return m;
}

static void s_dir(char *dir, size_t len, const char *name)
{
    snprintf(dir, len, "/tmp/mqgrad-ckpt-%d-%s", (int)getpid(), name);
}

static void s_fill(float *p, float *st, float seed)
{
    for (int i = 0; i < S_N; i++) {
        p[i] = seed + (float)i * 0.5f;
        st[i] = -seed - (float)i;
    }
}

Test(checkpoint, round_trip_bit_for_bit)
{
    char dir[256];
    s_dir(dir, sizeof dir, "trip");
    static float p[S_N], st[S_N], p2[S_N], st2[S_N];
    s_fill(p, st, 3.25f);
    mq_ckpt_meta_t m = s_meta(100);
    cr_assert_eq(mq_ckpt_write(dir, &m, p, S_N, st, S_N, 0), 0, "%s", mq_err_last());
    cr_assert_eq(mq_ckpt_read(dir, &m, p2, S_N, st2, S_N), 0, "%s", mq_err_last());
    cr_expect_eq(memcmp(p, p2, sizeof p), 0);
    cr_expect_eq(memcmp(st, st2, sizeof st), 0);
}

/* Reading META's file must fail with an error that contains WHAT. */
static void s_refused(const char *dir, const mq_ckpt_meta_t *m, size_t n, size_t nstate,
                      const char *what)
{
    static float p[S_N + 1], st[S_N + 1];
    cr_assert_eq(mq_ckpt_read(dir, m, p, n, st, nstate), -1, "accepted: %s", what);
    cr_expect_not_null(strstr(mq_err_last(), what), "'%s' does not say '%s'", mq_err_last(),
                       what);
}

Test(checkpoint, another_run_shard_model_or_rule_is_refused)
{
    char dir[256];
    s_dir(dir, sizeof dir, "mismatch");
    static float p[S_N], st[S_N];
    s_fill(p, st, 1);
    mq_ckpt_meta_t m = s_meta(200);
    cr_assert_eq(mq_ckpt_write(dir, &m, p, S_N, st, S_N, 0), 0, "%s", mq_err_last());
    mq_ckpt_meta_t other = m;
    other.iter = 300;
    s_refused(dir, &other, S_N, S_N, "No such file");
    /* Files are named by lineage, shard and iteration, so a mismatch of those is a missing
     * file; the fields inside are checked against the name's claims and the rest. */
    char path[512], fake[512];
    mq_ckpt_path(dir, &m, path, sizeof path);
    other = m;
    other.servers = 3;
    s_refused(dir, &other, S_N, S_N, "number of servers");
    other = m;
    snprintf(other.model, sizeof other.model, "paper");
    s_refused(dir, &other, S_N, S_N, "model");
    s_refused(dir, &m, S_N - 1, S_N, "model or the shard's size");
    other = m;
    snprintf(other.optimizer, sizeof other.optimizer, "sgd");
    s_refused(dir, &other, S_N, S_N, "update rule");
    s_refused(dir, &m, S_N, 0, "update rule");
    /* A file renamed to another shard's name says whose it is. */
    other = m;
    other.shard = 0;
    mq_ckpt_path(dir, &other, fake, sizeof fake);
    cr_assert_eq(link(path, fake), 0);
    s_refused(dir, &other, S_N, S_N, "the run, the iteration or the shard");
}

Test(checkpoint, cut_or_corrupt_files_are_refused_and_left_alone)
{
    char dir[256];
    s_dir(dir, sizeof dir, "corrupt");
    static float p[S_N], st[S_N];
    s_fill(p, st, 2);
    mq_ckpt_meta_t m = s_meta(400);
    cr_assert_eq(mq_ckpt_write(dir, &m, p, S_N, st, S_N, 0), 0, "%s", mq_err_last());
    char path[512];
    mq_ckpt_path(dir, &m, path, sizeof path);
    char *data;
    size_t len;
    cr_assert_eq(mq_read_file(path, &data, &len), 0);
    /* one bit flipped in the middle of the values */
    data[len / 2] ^= 0x10;
    cr_assert_eq(mq_write_file_atomic(path, data, len), 0);
    s_refused(dir, &m, S_N, S_N, "corrupt");
    char *after;
    size_t after_len;
    cr_assert_eq(mq_read_file(path, &after, &after_len), 0);
    cr_expect(after_len == len && memcmp(after, data, len) == 0, "a refused file was changed");
    free(after);
    /* cut short */
    cr_assert_eq(mq_write_file_atomic(path, data, len - 100), 0);
    s_refused(dir, &m, S_N, S_N, "cut short");
    cr_assert_eq(mq_write_file_atomic(path, data, 40), 0);
    s_refused(dir, &m, S_N, S_N, "cut short");
    /* not a checkpoint */
    memcpy(data, "NOTCKPT!", 8);
    cr_assert_eq(mq_write_file_atomic(path, data, len), 0);
    s_refused(dir, &m, S_N, S_N, "bad magic");
    free(data);
}

/* Writes the checkpoints of iterations 100, 200, .. 500 into DIR with P and ST, each told
 * KEEP. */
static void s_write_series(const char *dir, float *p, float *st, uint64_t keep)
{
    for (uint64_t it = 100; it <= 500; it += 100) {
        s_fill(p, st, (float)it);
        mq_ckpt_meta_t m = s_meta(it);
        cr_assert_eq(mq_ckpt_write(dir, &m, p, S_N, st, S_N, keep), 0, "%s", mq_err_last());
    }
}

/* Of the checkpoints of iterations 100, 200, .. LAST in DIR, exactly those from FROM on are
 * there. */
static void s_expect_kept_from(const char *dir, uint64_t last, uint64_t from)
{
    for (uint64_t it = 100; it <= last; it += 100) {
        mq_ckpt_meta_t m = s_meta(it);
        char path[512];
        mq_ckpt_path(dir, &m, path, sizeof path);
        bool kept = access(path, F_OK) == 0;
        cr_expect_eq(kept, it >= from, "iteration %llu: kept %d", (unsigned long long)it, kept);
    }
}

Test(checkpoint, the_two_newest_are_kept)
{
    char dir[256];
    s_dir(dir, sizeof dir, "prune");
    static float p[S_N], st[S_N];
    s_write_series(dir, p, st, 0);
    s_expect_kept_from(dir, 500, 400);
    /* another shard's files are not this shard's to remove */
    mq_ckpt_meta_t other = s_meta(100);
    other.shard = 0;
    cr_assert_eq(mq_ckpt_write(dir, &other, p, S_N, st, S_N, 0), 0);
    mq_ckpt_meta_t m = s_meta(600);
    cr_assert_eq(mq_ckpt_write(dir, &m, p, S_N, st, S_N, 0), 0);
    char path[512];
    mq_ckpt_path(dir, &other, path, sizeof path);
    cr_expect_eq(access(path, F_OK), 0, "shard 0's checkpoint was removed by shard 1");
}

/* The run's last consistent checkpoint (checkpoint.json's, named by the scheduler as KEEP)
 * survives pruning: saves that failed on another server since then leave it the only point
 * the run can go back to, however many newer files this shard wrote. */
Test(checkpoint, the_last_consistent_one_is_never_pruned)
{
    char dir[256];
    s_dir(dir, sizeof dir, "keep");
    static float p[S_N], st[S_N];
    s_write_series(dir, p, st, 200);
    s_expect_kept_from(dir, 500, 200);
    /* Once a newer one is consistent, the older ones go as before. */
    mq_ckpt_meta_t m = s_meta(600);
    cr_assert_eq(mq_ckpt_write(dir, &m, p, S_N, st, S_N, 500), 0);
    s_expect_kept_from(dir, 600, 500);
}
