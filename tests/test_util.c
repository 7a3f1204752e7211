/* Tests of the small helpers of mqgrad/util.h that no other test reaches through a caller. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "mqgrad/util.h"

Test(util, median_sorts_in_place_and_takes_the_middle)
{
    double odd[] = {3.0, -1.0, 7.5, 2.0, 2.0};
    cr_expect_eq(mq_median(odd, 5), 2.0);
    const double sorted[] = {-1.0, 2.0, 2.0, 3.0, 7.5};
    for (int i = 0; i < 5; i++)
        cr_expect_eq(odd[i], sorted[i], "value %d: %g, expected %g", i, odd[i], sorted[i]);
    double even[] = {10.0, 4.0, 1.0, 6.0};
    cr_expect_eq(mq_median(even, 4), 5.0, "the mean of the middle two");
    cr_expect_eq(even[0], 1.0);
    cr_expect_eq(even[3], 10.0);
    double one[] = {-0.25};
    cr_expect_eq(mq_median(one, 1), -0.25);
    cr_expect(isnan(mq_median(NULL, 0)), "no values: NaN");
}

/* A writer that dies mid-write leaves PATH.tmp.PID.N behind: the sweep removes the ones of
 * processes that are gone and leaves a live writer's; the atomic write never opens a name
 * that is already there (a link planted at it is not followed). */
Test(util, temporary_files_of_dead_writers_are_swept_and_never_reused)
{
    char dir[] = "/tmp/mq_test_tmp_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    pid_t dead = fork();
    cr_assert_geq(dead, 0);
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    char stale[256], live[256], other[256], user[256], stale2[256];
    snprintf(stale, sizeof stale, "%s/summary.json.tmp.%d.0", dir, (int)dead);
    snprintf(live, sizeof live, "%s/summary.json.tmp.%d.0", dir, (int)getppid());
    snprintf(other, sizeof other, "%s/notes.tmp.txt", dir);
    snprintf(user, sizeof user, "%s/draft.tmp.%d", dir, (int)dead); /* not one of ours */
    snprintf(stale2, sizeof stale2, "%s/agent.state.tmp.%d.3", dir, (int)dead);
    const char *files[] = {stale, live, other, user, stale2};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(mq_write_file_atomic(files[i], "x", 1), 0, "%s", mq_err_last());
    /* With a base, only that file's temporaries go. */
    cr_expect_eq(mq_tmp_sweep(dir, "agent.state"), 1);
    cr_expect_neq(access(stale2, F_OK), 0, "the state file's dead temporary was left");
    cr_expect_eq(access(stale, F_OK), 0, "another file's temporary went with a base given");
    cr_expect_eq(mq_tmp_sweep(dir, NULL), 1);
    cr_expect_neq(access(stale, F_OK), 0, "a dead writer's file was left");
    cr_expect_eq(access(live, F_OK), 0, "a live writer's file was removed");
    cr_expect_eq(access(other, F_OK), 0, "a file that is no temporary one was removed");
    cr_expect_eq(access(user, F_OK), 0, "a name not made by the atomic write was removed");
    /* A link planted at the next write's temporary name is refused, not followed. */
    char target[256], planted[256];
    snprintf(target, sizeof target, "%s/victim", dir);
    cr_assert_eq(mq_write_file_atomic(target, "v", 1), 0);
    for (unsigned n = 0; n < 100; n++) { /* whatever this process's count has reached */
        snprintf(planted, sizeof planted, "%s/out.tmp.%d.%u", dir, (int)getpid(), n);
        cr_assert_eq(symlink(target, planted), 0);
    }
    char out[256];
    snprintf(out, sizeof out, "%s/out", dir);
    cr_expect_eq(mq_write_file_atomic(out, "new", 3), -1, "a planted link was written through");
    char *v;
    size_t len;
    cr_assert_eq(mq_read_file(target, &v, &len), 0);
    cr_expect(len == 1 && v[0] == 'v', "the link's target was changed");
    free(v);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}
