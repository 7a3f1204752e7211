/* What the policy tests share: observations written inline, making a policy that must
 * exist, and refusing one that must not. */
#ifndef MQGRAD_TEST_POLICY_TEST_H
#define MQGRAD_TEST_POLICY_TEST_H

#include <criterion/criterion.h>
#include <string.h>

#include "mqgrad/rl.h"
#include "mqgrad/util.h"

/* An observation of iteration M with loss L and time MS (a pointer to a compound literal). */
#define OBS(m, l, ms) (&(mq_observation_t){.iter = (m), .loss = (l), .iter_ms = (ms)})

/* mq_policy_new(SPEC, O), failing the test with the error when it gives NULL. */
static inline mq_policy_t *test_policy_new(const char *spec, const mq_policy_opts_t *o)
{
    mq_policy_t *p = mq_policy_new(spec, o);
    cr_assert_not_null(p, "mq_policy_new(%s): %s", spec, mq_err_last());
    return p;
}

/* SPEC must be refused with an error that contains MSG. */
static inline void test_policy_refused(const char *spec, const char *msg)
{
    mq_policy_t *p = mq_policy_new(spec, NULL);
    cr_expect_null(p, "accepted '%s'", spec);
    mq_policy_destroy(&p);
    cr_expect(strstr(mq_err_last(), msg) != NULL, "'%s': error '%s' lacks '%s'", spec,
              mq_err_last(), msg);
}

#endif
