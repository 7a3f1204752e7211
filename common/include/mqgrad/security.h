/* Who may talk to whom (SECURITY.md): CURVE on every socket, keys by role.
 *
 * A cluster's keys are CZMQ certificates (zcert), one per role, made by `mqgrad keygen DIR`:
 *     DIR/<name>.key          the public certificate (metadata: role, name)
 *     DIR/<name>.key_secret   the same with the secret key (mode 0600)
 * for the names scheduler, server, worker, agent and operator (more operators:
 * operator-<who>). Every program reads the public certificates of DIR (--keys,
 * MQGRAD_KEYS; or MQGRAD_PUBLIC_KEYS="role:Z85,role:Z85,...") and its own secret one
 * (--key FILE, MQGRAD_KEY; or MQGRAD_SECRET_KEY=Z85; by default DIR/<its role>.key_secret).
 *
 * A process's CURVE server sockets share one ZAP handler, CZMQ's zauth, holding the public
 * keys: a peer whose key is not among them fails the handshake and never delivers a message
 * (counted and logged by mq_sec_serve's watch). What a known key may do is the services'
 * check: mq_sec_allows with the roles a message type needs (the scheduler takes REGISTER
 * from node keys only, the agent POLICY_SET from operator keys only, ...).
 *
 * --insecure turns all of it off, and says so loudly: every check then passes. */
#ifndef MQGRAD_SECURITY_H
#define MQGRAD_SECURITY_H

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

#include "mqgrad/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MQ_KEY_NONE = 0, /* no key, or one the keyring does not hold */
    MQ_KEY_SCHEDULER,
    MQ_KEY_SERVER,
    MQ_KEY_WORKER,
    MQ_KEY_AGENT,
    MQ_KEY_OPERATOR,
    MQ_KEY_COUNT_
} mq_key_role_t;

/* Masks for mq_sec_allows. */
#define MQ_KEYS(r) (1u << (r))
#define MQ_KEYS_NODE (MQ_KEYS(MQ_KEY_SERVER) | MQ_KEYS(MQ_KEY_WORKER))
#define MQ_KEYS_KNOWN                                                                       \
    (MQ_KEYS(MQ_KEY_SCHEDULER) | MQ_KEYS_NODE | MQ_KEYS(MQ_KEY_AGENT) |                      \
     MQ_KEYS(MQ_KEY_OPERATOR))
#define MQ_KEYS_ANY (MQ_KEYS_KNOWN | MQ_KEYS(MQ_KEY_NONE))

const char *mq_key_role_name(mq_key_role_t r);

typedef struct {
    char keys[512]; /* directory of the cluster's public certificates */
    char key[512];  /* this program's secret certificate */
    bool insecure;  /* no CURVE at all */
    bool open;      /* serve clients of any key (the agent's QUERY/PING; services check roles) */
} mq_sec_config_t;

/* The flag-table entries (mqgrad/service.h) for C, a mq_sec_config_t *. */
#define MQ_SEC_FLAGS(c)                                                                     \
    {"keys", "MQGRAD_KEYS", MQ_FLAG_STR, (c)->keys, sizeof(c)->keys, 0, 0,                   \
     "directory of the cluster's public keys (mqgrad keygen DIR)"},                          \
        {"key", "MQGRAD_KEY", MQ_FLAG_STR, (c)->key, sizeof(c)->key, 0, 0,                   \
         "this program's secret key file (default: KEYS/<role>.key_secret)"},                \
        {"insecure", "MQGRAD_INSECURE", MQ_FLAG_BOOL, &(c)->insecure, 0, 0, 0,               \
         "no authentication, no encryption: anyone who reaches a port takes part"}

/* For flag parsers: 0, or 2 after telling stderr that PROG was given no keys (and how to
 * give them, or --insecure); with PROG NULL, -1 with that error. */
int mq_sec_config_check(const mq_sec_config_t *c, const char *prog);

typedef struct mq_sec mq_sec_t;

/* The security of a program playing SELF (MQ_KEY_OPERATOR for the command line: without an
 * operator key it gets a throw-away one, which only open services take). Loads the keys and
 * starts the process's ZAP handler; with insecure, logs a warning and applies nothing.
 * NULL with an error (no keys given, a file that does not parse, no key of this role). */
mq_sec_t *mq_sec_open(const mq_sec_config_t *c, mq_key_role_t self);
/* Call it after mq_sec_unserve of every served socket: a watch ended while its socket's
 * monitor is on can block the process's I/O (see mq_sec_unserve). */
void mq_sec_close(mq_sec_t **s);
bool mq_sec_enabled(const mq_sec_t *s);

/* Before binding SOCK: serve CURVE with this program's key. Refused handshakes (no key, an
 * unknown key, a client that expects another server key) are counted and logged, WHAT
 * naming the socket. 0, or -1 with an error. */
int mq_sec_serve(mq_sec_t *s, zsock_t *sock, const char *what);
/* Before destroying a socket given to mq_sec_serve: stops its monitor, then its watch. A
 * closed socket lingers, and a handshake that fails meanwhile (its ZAP handler gone with
 * mq_sec_close, say) is an event libzmq's I/O thread sends to the monitor, blocking until
 * someone reads it: with the watch gone first, that thread, and every socket of the process,
 * would wait forever. A socket not served (or S NULL) is left alone. */
void mq_sec_unserve(mq_sec_t *s, zsock_t *sock);
/* Before connecting SOCK to a service of role SERVER: CURVE client with this program's key. */
int mq_sec_client(mq_sec_t *s, zsock_t *sock, mq_key_role_t server);

/* The role of the key MSG came with (MQ_KEY_NONE without CURVE or for an unknown key). */
mq_key_role_t mq_sec_role(const mq_sec_t *s, const mq_msg_t *msg);
/* True if MSG's sender may send it: security is off, or its key's role is in ROLES. */
bool mq_sec_allows(const mq_sec_t *s, const mq_msg_t *msg, unsigned roles);
/* Handshakes refused so far on the sockets S serves. */
uint64_t mq_sec_refused(const mq_sec_t *s);
/* Answers a service's DROPS pipe command on PIPE: D's counts (mq_drops_format), then
 * "refused=N", S's refused handshakes. */
void mq_sec_send_drops(zsock_t *pipe, const mq_drops_t *d, const mq_sec_t *s);

/* Writes a cluster's keys into DIR (created): one certificate per role; OPERATOR, when
 * given, writes only DIR/operator-OPERATOR (another operator of an existing cluster). 0, or
 * -1 with an error; never overwrites a key. */
int mq_sec_keygen(const char *dir, const char *operator_name);

/* Tokens (proto/mqgrad.proto Meta.token): a node's proof, for the run whose scheduler drew
 * RUN_KEY, that it holds rank RANK of role ROLE (MQ_ROLE_WORKER / MQ_ROLE_SERVER) in its
 * TERM: a keyed BLAKE2b of (role, rank, term). A rank's term counts the times the scheduler
 * has given the rank out (1, 2, ...), so the token of a node that left or was lost is not its
 * successor's: the scheduler takes only the current term's, and servers, holding the run key,
 * check a worker's token against the term its messages name, never older than the newest they
 * have seen for that rank (ITERATE's member terms). */
void mq_token_make(const uint8_t run_key[MQ_RUN_KEY_LEN], mq_role_t role, uint32_t rank,
                   uint32_t term, uint8_t token[MQ_TOKEN_LEN]);
/* A fresh random run key. */
void mq_run_key_new(uint8_t run_key[MQ_RUN_KEY_LEN]);
/* A node's incarnation: 64 random bits (never 0), which only the node and the scheduler know
 * (the REGISTER goes encrypted under CURVE), so that a REGISTER sent again with it may move the
 * node to a new connection without letting another holder of its role's key take its rank. */
uint64_t mq_incarnation_new(void);
/* Constant-time comparison of two tokens. */
bool mq_token_equal(const uint8_t *a, const uint8_t *b);

#ifdef __cplusplus
}
#endif
#endif
