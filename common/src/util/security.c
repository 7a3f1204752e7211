/* CURVE keys by role, the process's ZAP handler and the refused-handshake watch
 * (mqgrad/security.h, SECURITY.md). */
#include "mqgrad/security.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mqgrad/util.h"

#define S_MAX_WATCH 4

static const char *const s_role_names[MQ_KEY_COUNT_] = {"none",  "scheduler", "server",
                                                        "worker", "agent",     "operator"};

const char *mq_key_role_name(mq_key_role_t r)
{
    return r >= 0 && r < MQ_KEY_COUNT_ ? s_role_names[r] : "?";
}

static mq_key_role_t s_role_parse(const char *name)
{
    for (int r = 1; r < MQ_KEY_COUNT_; r++) {
        size_t n = strlen(s_role_names[r]);
        if (strncmp(name, s_role_names[r], n) == 0 && (name[n] == 0 || name[n] == '-'))
            return (mq_key_role_t)r;
    }
    return MQ_KEY_NONE;
}

typedef struct {
    mq_key_role_t role;
    char name[64];
    char public_txt[41];
} s_key_t;

struct mq_sec {
    bool enabled;
    mq_key_role_t self;
    s_key_t *keys; /* the keyring: as many as it holds */
    int nkeys, capkeys;
    zcert_t *cert; /* this program's */
    zactor_t *watch[S_MAX_WATCH];
    zsock_t *served[S_MAX_WATCH]; /* the socket each watch reads the monitor of */
    int nwatch;
    bool open;    /* serve any key (services check roles) */
    bool joined;  /* holds a share of the process's ZAP handler */
    _Atomic uint64_t refused;
};

/* ---- the process's ZAP handler ------------------------------------------------------- */

static pthread_mutex_t s_auth_lock = PTHREAD_MUTEX_INITIALIZER;
static zactor_t *s_auth;
static int s_auth_users;
static char (*s_auth_keys)[41]; /* the keyring it serves (s_auth_join's) */
static int s_auth_nkeys;
static bool s_auth_open;

static bool s_auth_has(const char *public_txt)
{
    for (int i = 0; i < s_auth_nkeys; i++)
        if (strcmp(s_auth_keys[i], public_txt) == 0)
            return true;
    return false;
}

/* The ZAP handler of a process that serves any key (mqgrad-agent --open-query): zauth's
 * "allow any" leaves the User-Id empty, so a known key could not be told from a stranger's;
 * this one lets every CURVE client in and names each by its public key (RFC 27). */
static void s_open_zap_actor(zsock_t *pipe, void *args)
{
    (void)args;
    zsock_t *rep = zsock_new_rep("inproc://zeromq.zap.01");
    zsock_signal(pipe, 0);
    zpoller_t *poller = rep ? zpoller_new(pipe, rep, NULL) : NULL;
    while (poller && zpoller_wait(poller, -1) == rep) {
        zmsg_t *req = zmsg_recv(rep);
        if (!req)
            break;
        char *version = zmsg_popstr(req), *id = zmsg_popstr(req);
        free(zmsg_popstr(req)); /* domain */
        free(zmsg_popstr(req)); /* address */
        free(zmsg_popstr(req)); /* routing id */
        char *mechanism = zmsg_popstr(req);
        zframe_t *key = zmsg_pop(req);
        char user[41] = "";
        bool ok = mechanism && strcmp(mechanism, "CURVE") == 0 && key && zframe_size(key) == 32;
        if (ok)
            zmq_z85_encode(user, zframe_data(key), 32);
        zstr_sendx(rep, version ? version : "1.0", id ? id : "", ok ? "200" : "400",
                   ok ? "OK" : "CURVE only", user, "", NULL);
        free(version);
        free(id);
        free(mechanism);
        zframe_destroy(&key);
        zmsg_destroy(&req);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&rep);
}

/* Starts the process's ZAP handler: zauth with S's public keys, or with OPEN the handler
 * above; a later user must want the same (one process serves one keyring, one way). */
static int s_auth_join(mq_sec_t *s, bool open)
{
    pthread_mutex_lock(&s_auth_lock);
    int rc = 0;
    if (!s_auth) { /* the handler starts with this keyring: room for every key of it */
        free(s_auth_keys);
        if (!(s_auth_keys = calloc(s->nkeys ? (size_t)s->nkeys : 1, sizeof *s_auth_keys))) {
            pthread_mutex_unlock(&s_auth_lock);
            return mq_err_set("out of memory for %d keys", s->nkeys), -1;
        }
    }
    if (!s_auth && open) {
        s_auth_nkeys = 0;
        for (int i = 0; i < s->nkeys; i++)
            snprintf(s_auth_keys[s_auth_nkeys++], 41, "%s", s->keys[i].public_txt);
        if (!(s_auth = zactor_new(s_open_zap_actor, NULL)))
            rc = (mq_err_set("cannot start the authentication handler"), -1);
        s_auth_open = rc == 0;
    } else if (!s_auth) {
        zcertstore_t *store = zcertstore_new(NULL);
        s_auth_nkeys = 0;
        for (int i = 0; store && i < s->nkeys; i++) {
            uint8_t pub[32], sec[32] = {0};
            zmq_z85_decode(pub, s->keys[i].public_txt);
            zcert_t *c = zcert_new_from(pub, sec);
            zcert_set_meta(c, "role", "%s", mq_key_role_name(s->keys[i].role));
            zcert_set_meta(c, "name", "%s", s->keys[i].name);
            if (zcertstore_lookup(store, s->keys[i].public_txt))
                zcert_destroy(&c);
            else
                zcertstore_insert(store, &c);
            snprintf(s_auth_keys[s_auth_nkeys++], 41, "%s", s->keys[i].public_txt);
        }
        s_auth = store ? zactor_new(zauth, store) : NULL;
        if (!s_auth) {
            mq_err_set("cannot start the authentication handler");
            rc = -1;
        }
    } else {
        for (int i = 0; i < s->nkeys; i++)
            if (!s_auth_has(s->keys[i].public_txt)) {
                mq_err_set("this process already serves another keyring (key '%s' is new)",
                           s->keys[i].name);
                rc = -1;
            }
    }
    if (rc == 0 && open != s_auth_open)
        rc = (mq_err_set("a process serves either the cluster's keys only or any key (open)"),
              -1);
    if (rc == 0)
        s_auth_users++;
    pthread_mutex_unlock(&s_auth_lock);
    return rc;
}

static void s_auth_leave(void)
{
    pthread_mutex_lock(&s_auth_lock);
    if (--s_auth_users == 0) {
        zactor_destroy(&s_auth);
        s_auth_open = false;
        s_auth_nkeys = 0;
        free(s_auth_keys);
        s_auth_keys = NULL;
    }
    pthread_mutex_unlock(&s_auth_lock);
}

/* ---- loading keys -------------------------------------------------------------------- */

static bool s_is_z85_key(const char *txt)
{
    uint8_t bin[32];
    return txt && strlen(txt) == 40 && zmq_z85_decode(bin, txt) != NULL;
}

static bool s_has_secret(zcert_t *c)
{
    static const uint8_t zero[32] = {0};
    return memcmp(zcert_secret_key(c), zero, 32) != 0;
}

static int s_add_key(mq_sec_t *s, mq_key_role_t role, const char *name, const char *public_txt)
{
    if (role == MQ_KEY_NONE) {
        mq_err_set("key '%s': no role (scheduler, server, worker, agent or operator)", name);
        return -1;
    }
    if (!s_is_z85_key(public_txt)) {
        mq_err_set("key '%s': not a CURVE public key (40 Z85 characters)", name);
        return -1;
    }
    for (int i = 0; i < s->nkeys; i++)
        if (strcmp(s->keys[i].public_txt, public_txt) == 0)
            return 0;
    if (s->nkeys == s->capkeys) {
        int cap = s->capkeys ? 2 * s->capkeys : 16;
        s_key_t *more = realloc(s->keys, (size_t)cap * sizeof *more);
        if (!more) {
            mq_err_set("out of memory for %d keys", cap);
            return -1;
        }
        s->keys = more;
        s->capkeys = cap;
    }
    s_key_t *k = &s->keys[s->nkeys++];
    k->role = role;
    snprintf(k->name, sizeof k->name, "%s", name);
    snprintf(k->public_txt, sizeof k->public_txt, "%s", public_txt);
    return 0;
}

static bool s_ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n > t && strcmp(s + n - t, tail) == 0;
}

/* Every DIR/<name>.key: its role from the certificate's metadata, else from the name. */
static int s_load_dir(mq_sec_t *s, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        mq_err_set("keys directory '%s': %s", dir, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (!s_ends_with(e->d_name, ".key"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        zcert_t *c = zcert_load(path);
        if (!c) {
            mq_err_set("key file '%s' is not a certificate", path);
            rc = -1;
            break;
        }
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strlen(e->d_name) - 4), e->d_name);
        const char *meta = zcert_meta(c, "role");
        mq_key_role_t role = s_role_parse(meta ? meta : name);
        rc = s_add_key(s, role, name, zcert_public_txt(c));
        if (rc != 0)
            mq_err_set("key file '%s': %s", path, mq_err_last());
        zcert_destroy(&c);
    }
    closedir(d);
    return rc;
}

/* MQGRAD_PUBLIC_KEYS: "role:Z85,role:Z85,..." (role as in a key's name: operator-ana). */
static int s_load_env_list(mq_sec_t *s, const char *list)
{
    char *buf = strdup(list);
    if (!buf) {
        mq_err_set("MQGRAD_PUBLIC_KEYS: out of memory");
        return -1;
    }
    char *save = NULL;
    int rc = 0;
    for (char *item = strtok_r(buf, ", \n", &save); rc == 0 && item;
         item = strtok_r(NULL, ", \n", &save)) {
        char *colon = strchr(item, ':');
        if (!colon) {
            mq_err_set("MQGRAD_PUBLIC_KEYS: '%s' is not role:KEY", item);
            rc = -1;
            break;
        }
        *colon = 0;
        if (s_add_key(s, s_role_parse(item), item, colon + 1) != 0) {
            mq_err_set("MQGRAD_PUBLIC_KEYS: %s", mq_err_last());
            rc = -1;
        }
    }
    free(buf);
    return rc;
}

static zcert_t *s_load_own(const mq_sec_config_t *c, mq_key_role_t self)
{
    const char *env = getenv("MQGRAD_SECRET_KEY");
    if (c->key[0]) {
        if (access(c->key, R_OK) != 0) {
            mq_err_set("secret key file '%s': %s", c->key, strerror(errno));
            return NULL;
        }
        zcert_t *cert = zcert_load(c->key);
        if (!cert || !s_has_secret(cert)) {
            zcert_destroy(&cert);
            mq_err_set("'%s' holds no secret key (give the .key_secret file)", c->key);
        }
        return cert;
    }
    if (env && *env) {
        char pub[41];
        uint8_t pb[32], sb[32];
        if (!s_is_z85_key(env) || zmq_curve_public(pub, env) != 0) {
            mq_err_set("MQGRAD_SECRET_KEY is not a CURVE secret key (40 Z85 characters)");
            return NULL;
        }
        zmq_z85_decode(pb, pub);
        zmq_z85_decode(sb, env);
        return zcert_new_from(pb, sb);
    }
    if (c->keys[0]) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.key_secret", c->keys, mq_key_role_name(self));
        if (access(path, R_OK) == 0) {
            zcert_t *cert = zcert_load(path);
            if (cert && s_has_secret(cert))
                return cert;
            zcert_destroy(&cert);
            mq_err_set("'%s' holds no secret key", path);
            return NULL;
        }
    }
    if (self == MQ_KEY_OPERATOR)
        return zcert_new(); /* a throw-away key: only open services take it */
    mq_err_set("no secret key for this %s: give --key FILE (MQGRAD_KEY), MQGRAD_SECRET_KEY, or "
               "--keys DIR holding %s.key_secret (mqgrad keygen DIR makes them)",
               mq_key_role_name(self), mq_key_role_name(self));
    return NULL;
}

static const s_key_t *s_find(const mq_sec_t *s, const char *public_txt)
{
    for (int i = 0; i < s->nkeys; i++)
        if (strcmp(s->keys[i].public_txt, public_txt) == 0)
            return &s->keys[i];
    return NULL;
}

static const char s_no_keys[] =
    "no keys: give --keys DIR (MQGRAD_KEYS; make them with `mqgrad keygen DIR`), or "
    "--insecure to run with no authentication at all";

int mq_sec_config_check(const mq_sec_config_t *c, const char *prog)
{
    const char *env = getenv("MQGRAD_PUBLIC_KEYS");
    if (c->insecure || c->keys[0] || (env && *env))
        return 0;
    mq_err_set("%s", s_no_keys);
    if (!prog)
        return -1;
    fprintf(stderr, "%s: %s\n", prog, s_no_keys);
    return 2;
}

mq_sec_t *mq_sec_open(const mq_sec_config_t *c, mq_key_role_t self)
{
    mq_sec_t *s = calloc(1, sizeof *s);
    if (!s) {
        mq_err_set("out of memory");
        return NULL;
    }
    s->self = self;
    if (c->insecure) {
        if (self != MQ_KEY_OPERATOR) /* a service: say it where its operators look */
            mq_warn("SECURITY IS OFF (--insecure): no authentication and no encryption; anyone "
                    "who reaches this %s's ports can take part in the run or read its traffic",
                    mq_key_role_name(self));
        return s;
    }
    s->enabled = true;
    const char *env = getenv("MQGRAD_PUBLIC_KEYS");
    if ((c->keys[0] && s_load_dir(s, c->keys) != 0) ||
        (env && *env && s_load_env_list(s, env) != 0))
        goto fail;
    if (s->nkeys == 0) {
        if (c->keys[0])
            mq_err_set("keys directory '%s' holds no public key (*.key)", c->keys);
        else
            mq_err_set("%s", s_no_keys);
        goto fail;
    }
    if (!(s->cert = s_load_own(c, self)))
        goto fail;
    const s_key_t *mine = s_find(s, zcert_public_txt(s->cert));
    if (self != MQ_KEY_OPERATOR && (!mine || mine->role != self)) {
        mq_err_set("this program's key is not the keyring's %s key", mq_key_role_name(self));
        goto fail;
    }
    s->open = c->open;
    return s;
fail:
    zcert_destroy(&s->cert);
    free(s);
    return NULL;
}

void mq_sec_close(mq_sec_t **sp)
{
    mq_sec_t *s = *sp;
    if (!s)
        return;
    for (int i = 0; i < s->nwatch; i++)
        zactor_destroy(&s->watch[i]);
    if (s->joined)
        s_auth_leave();
    zcert_destroy(&s->cert);
    free(s->keys);
    free(s);
    *sp = NULL;
}

bool mq_sec_enabled(const mq_sec_t *s)
{
    return s && s->enabled;
}

/* ---- sockets ------------------------------------------------------------------------- */

typedef struct {
    char endpoint[64];
    char what[64];
    _Atomic uint64_t *refused;
} s_watch_args_t;

/* Reads SOCK's monitor: each failed handshake is a refused peer (counted; logged the first
 * time and then at every power of two, so a scan cannot flood the log). */
static void s_watch_actor(zsock_t *pipe, void *args)
{
    s_watch_args_t a = *(s_watch_args_t *)args;
    free(args);
    zsock_t *mon = zsock_new_pair(a.endpoint);
    zsock_signal(pipe, 0);
    if (!mon) {
        zsock_wait(pipe);
        return;
    }
    zpoller_t *poller = zpoller_new(pipe, mon, NULL);
    while (true) {
        void *which = zpoller_wait(poller, -1);
        if (which != mon)
            break; /* $TERM or interrupted */
        zmsg_t *m = zmsg_recv(mon);
        zframe_t *f = m ? zmsg_first(m) : NULL;
        if (f && zframe_size(f) == 6) {
            uint16_t event;
            uint32_t value;
            memcpy(&event, zframe_data(f), 2);
            memcpy(&value, zframe_data(f) + 2, 4);
            uint64_t n = atomic_fetch_add(a.refused, 1) + 1;
            if ((n & (n - 1)) == 0)
                mq_warn("%s refused a peer (%" PRIu64 " so far): %s", a.what, n,
                        event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                            ? "its key is not in the cluster's keyring"
                        : value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
                            ? "its handshake does not decrypt (a wrong server key?)"
                            : "it does not speak CURVE (no key, or --insecure)");
        }
        zmsg_destroy(&m);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&mon);
}

int mq_sec_serve(mq_sec_t *s, zsock_t *sock, const char *what)
{
    if (!s->enabled)
        return 0;
    if (s->nwatch == S_MAX_WATCH) {
        mq_err_set("more than %d served sockets", S_MAX_WATCH);
        return -1;
    }
    if (!s->joined) { /* the ZAP handler, before the socket can take a peer */
        if (s_auth_join(s, s->open) != 0)
            return -1;
        s->joined = true;
    }
    zcert_apply(s->cert, sock);
    zsock_set_curve_server(sock, 1);
    zsock_set_zap_domain(sock, "mqgrad");
    int on = 1; /* without a ZAP handler, refuse rather than let everyone in (libzmq >= 4.3) */
    zmq_setsockopt(zsock_resolve(sock), 93 /* ZMQ_ZAP_ENFORCE_DOMAIN */, &on, sizeof on);
    s_watch_args_t *a = calloc(1, sizeof *a);
    if (!a) {
        mq_err_set("out of memory");
        return -1;
    }
    static _Atomic unsigned seq;
    snprintf(a->endpoint, sizeof a->endpoint, "inproc://mqgrad-sec-%d-%u", (int)getpid(),
             atomic_fetch_add(&seq, 1));
    snprintf(a->what, sizeof a->what, "%s", what);
    a->refused = &s->refused;
    if (zmq_socket_monitor(zsock_resolve(sock), a->endpoint,
                           ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0) {
        mq_err_set("cannot watch %s: %s", what, zmq_strerror(errno));
        free(a);
        return -1;
    }
    if (!(s->watch[s->nwatch] = zactor_new(s_watch_actor, a))) {
        zmq_socket_monitor(zsock_resolve(sock), NULL, 0);
        free(a);
        mq_err_set("cannot start the watch of %s", what);
        return -1;
    }
    s->served[s->nwatch++] = sock;
    return 0;
}

void mq_sec_unserve(mq_sec_t *s, zsock_t *sock)
{
    for (int i = 0; s && sock && i < s->nwatch; i++)
        if (s->served[i] == sock) {
            /* The monitor first: its events go nowhere once it is stopped. */
            zmq_socket_monitor(zsock_resolve(sock), NULL, 0);
            zactor_destroy(&s->watch[i]);
            s->nwatch--;
            s->watch[i] = s->watch[s->nwatch];
            s->served[i] = s->served[s->nwatch];
            return;
        }
}

int mq_sec_client(mq_sec_t *s, zsock_t *sock, mq_key_role_t server)
{
    if (!s->enabled)
        return 0;
    for (int i = 0; i < s->nkeys; i++)
        if (s->keys[i].role == server) {
            zcert_apply(s->cert, sock);
            zsock_set_curve_serverkey(sock, s->keys[i].public_txt);
            return 0;
        }
    mq_err_set("the keyring holds no %s key", mq_key_role_name(server));
    return -1;
}

mq_key_role_t mq_sec_role(const mq_sec_t *s, const mq_msg_t *msg)
{
    if (!s || !s->enabled || !msg->user_id[0])
        return MQ_KEY_NONE;
    const s_key_t *k = s_find(s, msg->user_id);
    return k ? k->role : MQ_KEY_NONE;
}

bool mq_sec_allows(const mq_sec_t *s, const mq_msg_t *msg, unsigned roles)
{
    if (!s || !s->enabled)
        return true;
    return (roles & MQ_KEYS(mq_sec_role(s, msg))) != 0;
}

uint64_t mq_sec_refused(const mq_sec_t *s)
{
    return s ? atomic_load(&s->refused) : 0;
}

void mq_sec_send_drops(zsock_t *pipe, const mq_drops_t *d, const mq_sec_t *s)
{
    char buf[512];
    mq_drops_format(d, buf, sizeof buf);
    size_t len = strlen(buf);
    snprintf(buf + len, sizeof buf - len, " refused=%llu",
             (unsigned long long)mq_sec_refused(s));
    zstr_send(pipe, buf);
}

/* ---- keygen -------------------------------------------------------------------------- */

static int s_keygen_one(const char *dir, const char *name, mq_key_role_t role)
{
    char path[1024], secret[1100];
    snprintf(path, sizeof path, "%s/%s.key", dir, name);
    snprintf(secret, sizeof secret, "%s_secret", path);
    if (access(path, F_OK) == 0 || access(secret, F_OK) == 0) {
        mq_err_set("'%s' exists: keys are never overwritten (remove it first)", path);
        return -1;
    }
    zcert_t *c = zcert_new();
    if (!c) {
        mq_err_set("cannot make a key");
        return -1;
    }
    zcert_set_meta(c, "role", "%s", mq_key_role_name(role));
    zcert_set_meta(c, "name", "%s", name);
    mode_t old = umask(077);
    int rc = zcert_save_secret(c, secret);
    umask(old);
    if (rc == 0)
        rc = zcert_save_public(c, path);
    zcert_destroy(&c);
    if (rc != 0 || chmod(secret, 0600) != 0) {
        mq_err_set("cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int mq_sec_keygen(const char *dir, const char *operator_name)
{
    if (mq_mkdirs(dir) != 0)
        return -1;
    if (operator_name) {
        char name[64];
        for (const char *p = operator_name; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_')) {
                mq_err_set("operator name '%s': use a-z, 0-9 and _", operator_name);
                return -1;
            }
        if (!*operator_name || strlen(operator_name) > 40) {
            mq_err_set("operator name: 1 to 40 characters");
            return -1;
        }
        snprintf(name, sizeof name, "operator-%s", operator_name);
        return s_keygen_one(dir, name, MQ_KEY_OPERATOR);
    }
    for (int r = 1; r < MQ_KEY_COUNT_; r++)
        if (s_keygen_one(dir, s_role_names[r], (mq_key_role_t)r) != 0)
            return -1;
    return 0;
}

/* ---- tokens -------------------------------------------------------------------------- */

void mq_token_make(const uint8_t run_key[MQ_RUN_KEY_LEN], mq_role_t role, uint32_t rank,
                   uint32_t term, uint8_t token[MQ_TOKEN_LEN])
{
    uint8_t in[21] = "mqgrad-token"; /* then the role, the rank's four bytes, the term's */
    in[12] = (uint8_t)role;
    for (int i = 0; i < 4; i++) {
        in[13 + i] = (uint8_t)(rank >> (8 * i));
        in[17 + i] = (uint8_t)(term >> (8 * i));
    }
    crypto_generichash(token, MQ_TOKEN_LEN, in, sizeof in, run_key, MQ_RUN_KEY_LEN);
}

/* LEN random bytes (WHAT names them should libsodium fail to start). */
static void s_random(void *buf, size_t len, const char *what)
{
    if (sodium_init() < 0)
        mq_warn("libsodium did not initialise; random %s from its fallback", what);
    randombytes_buf(buf, len);
}

void mq_run_key_new(uint8_t run_key[MQ_RUN_KEY_LEN])
{
    s_random(run_key, MQ_RUN_KEY_LEN, "run key");
}

uint64_t mq_incarnation_new(void)
{
    uint64_t v = 0;
    while (v == 0)
        s_random(&v, sizeof v, "incarnation");
    return v;
}

bool mq_token_equal(const uint8_t *a, const uint8_t *b)
{
    return sodium_memcmp(a, b, MQ_TOKEN_LEN) == 0;
}
