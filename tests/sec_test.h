/* The tests' cluster keys (SECURITY.md): every service a test starts in-process reads them
 * from MQGRAD_KEYS, as a deployment would; test_keys() makes a set once per test process
 * when none is given. test_sec_client() puts a test's own socket on CURVE with one role's
 * key, to play that role (or an insider holding it) against live services. */
#ifndef MQGRAD_TEST_SEC_H
#define MQGRAD_TEST_SEC_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mqgrad/security.h"
#include "mqgrad/util.h"

static inline const char *test_keys(void)
{
    const char *keys = getenv("MQGRAD_KEYS");
    if (keys && *keys)
        return keys;
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/mqgrad-test-keys-%d", (int)getpid());
    char probe[160];
    snprintf(probe, sizeof probe, "%s/agent.key", dir);
    if (access(probe, F_OK) != 0)
        cr_assert_eq(mq_sec_keygen(dir, NULL), 0, "%s", mq_err_last());
    setenv("MQGRAD_KEYS", dir, 1);
    return getenv("MQGRAD_KEYS");
}

/* SOCK speaks CURVE with the key of AS ("worker", "operator", ...) from DIR (NULL: the
 * tests' keys) to a service of role SERVER. */
static inline void test_sec_client_from(zsock_t *sock, const char *dir, const char *as,
                                        mq_key_role_t server)
{
    mq_sec_config_t c;
    memset(&c, 0, sizeof c);
    snprintf(c.keys, sizeof c.keys, "%.400s", dir ? dir : test_keys());
    snprintf(c.key, sizeof c.key, "%.400s/%.40s.key_secret", c.keys, as);
    mq_sec_t *sec = mq_sec_open(&c, MQ_KEY_OPERATOR);
    cr_assert_not_null(sec, "%s", mq_err_last());
    cr_assert_eq(mq_sec_client(sec, sock, server), 0, "%s", mq_err_last());
    mq_sec_close(&sec); /* the socket holds its own copy of the keys */
}

static inline void test_sec_client(zsock_t *sock, const char *as, mq_key_role_t server)
{
    test_sec_client_from(sock, NULL, as, server);
}

#endif
