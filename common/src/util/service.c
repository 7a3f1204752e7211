/* Flags with environment defaults, the skeleton every service's actor runs on, and the
 * run-until-done-or-signal loop of service mains. */
#include "mqgrad/service.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mqgrad/util.h"
#include "mqgrad/wire.h"

static int s_set(const mq_flag_t *f, const char *value, const char *origin)
{
    char what[160];
    snprintf(what, sizeof what, "%s --%s", origin, f->name);
    switch (f->kind) {
    case MQ_FLAG_STR:
        if (f->lo >= 1 && !*value) { /* a secret, say: "" would silently turn it off */
            mq_err_set("%s: the value must not be empty", what);
            return -1;
        }
        if (strlen(value) >= f->len) {
            mq_err_set("%s: value longer than %zu characters", what, f->len - 1);
            return -1;
        }
        strcpy((char *)f->dst, value);
        return 0;
    case MQ_FLAG_LONG:
        return mq_parse_long(what, value, (long)f->lo, (long)f->hi, (long *)f->dst);
    case MQ_FLAG_INT: {
        long v;
        if (mq_parse_long(what, value, (long)f->lo, (long)f->hi, &v) != 0)
            return -1;
        *(int *)f->dst = (int)v; /* the range is an int's: the table's LO and HI */
        return 0;
    }
    case MQ_FLAG_DOUBLE:
        return mq_parse_double(what, value, f->lo, f->hi, (double *)f->dst);
    case MQ_FLAG_BOOL:
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes"))
            *(bool *)f->dst = true;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no"))
            *(bool *)f->dst = false;
        else {
            mq_err_set("%s: '%s' is not a boolean (true/false/1/0)", what, value);
            return -1;
        }
        return 0;
    }
    return -1;
}

void mq_flags_usage(const mq_flag_t *flags, const char *usage, FILE *out)
{
    fprintf(out, "%s\n\nflags:\n", usage);
    for (const mq_flag_t *f = flags; f->name; f++) {
        char def[96] = "";
        switch (f->kind) {
        case MQ_FLAG_STR:
            snprintf(def, sizeof def, "%s", (const char *)f->dst);
            break;
        case MQ_FLAG_LONG:
            snprintf(def, sizeof def, "%ld", *(long *)f->dst);
            break;
        case MQ_FLAG_INT:
            snprintf(def, sizeof def, "%d", *(int *)f->dst);
            break;
        case MQ_FLAG_DOUBLE:
            snprintf(def, sizeof def, "%g", *(double *)f->dst);
            break;
        case MQ_FLAG_BOOL:
            snprintf(def, sizeof def, "%s", *(bool *)f->dst ? "true" : "false");
            break;
        }
        /* What the flag takes, in the words its errors use: a test of every flag reads it. */
        char takes[80] = "";
        if (f->kind == MQ_FLAG_LONG || f->kind == MQ_FLAG_INT)
            snprintf(takes, sizeof takes, " (an integer from %ld to %ld)", (long)f->lo,
                     (long)f->hi);
        else if (f->kind == MQ_FLAG_DOUBLE)
            snprintf(takes, sizeof takes, " (a number from %g to %g)", f->lo, f->hi);
        else if (f->kind == MQ_FLAG_BOOL)
            snprintf(takes, sizeof takes, " (a switch)");
        else if (f->lo >= 1)
            snprintf(takes, sizeof takes, " (not empty)");
        fprintf(out, "  --%-18s %s [%s%s%s]%s\n", f->name, f->help ? f->help : "", def,
                f->env ? ", $" : "", f->env ? f->env : "", takes);
    }
}

static const mq_flag_t *s_find(const mq_flag_t *flags, const char *name, size_t n)
{
    for (const mq_flag_t *f = flags; f->name; f++)
        if (strlen(f->name) == n && strncmp(f->name, name, n) == 0)
            return f;
    return NULL;
}

int mq_flags_parse(const mq_flag_t *flags, int argc, char **argv, const char *usage,
                   char **positional, int maxpos, int *npos)
{
    if (npos)
        *npos = 0;
    for (const mq_flag_t *f = flags; f->name; f++) {
        const char *v = f->env ? getenv(f->env) : NULL;
        if (v && *v && s_set(f, v, f->env) != 0) {
            fprintf(stderr, "%s: %s\n", argv[0], mq_err_last());
            return 2;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            mq_flags_usage(flags, usage, stdout);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (positional && npos && *npos < maxpos) {
                positional[(*npos)++] = argv[i];
                continue;
            }
            fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", argv[0], a);
            return 2;
        }
        const char *eq = strchr(a + 2, '=');
        size_t n = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        const mq_flag_t *f = s_find(flags, a + 2, n);
        if (!f) {
            fprintf(stderr, "%s: unknown flag '%.*s' (see --help)\n", argv[0], (int)n + 2, a);
            return 2;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value && f->kind == MQ_FLAG_BOOL)
            value = "true";
        if (!value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: flag --%s needs a value\n", argv[0], f->name);
                return 2;
            }
            value = argv[++i];
        }
        if (s_set(f, value, "flag") != 0) {
            fprintf(stderr, "%s: %s\n", argv[0], mq_err_last());
            return 2;
        }
    }
    return 0;
}

/* ---- the actor skeleton ------------------------------------------------------------- */

typedef struct {
    mq_service_t svc;
    const mq_service_ops_t *ops;
    bool termed; /* $TERM came, or the pipe closed */
} s_actor_t;

/* PORT, DROPS and $TERM; 1 for a command that is not one of them. */
static int s_common_command(s_actor_t *a, const char *cmd)
{
    static const mq_drops_t none;
    if (!cmd || streq(cmd, "$TERM"))
        return a->termed = true, -1;
    if (streq(cmd, "PORT"))
        zstr_sendf(a->svc.pipe, "%d", a->svc.port);
    else if (streq(cmd, "DROPS"))
        mq_sec_send_drops(a->svc.pipe, a->svc.drops ? a->svc.drops : &none, a->svc.sec);
    else
        return 1;
    return 0;
}

static int s_on_pipe(zloop_t *loop, zsock_t *pipe, void *arg)
{
    s_actor_t *a = arg;
    zmsg_t *m = zmsg_recv(pipe);
    char *cmd = m ? zmsg_popstr(m) : NULL;
    int rc = s_common_command(a, cmd);
    if (rc < 0 && a->ops->term)
        a->ops->term(a->svc.self);
    else if (rc == 1 && a->ops->command)
        rc = a->ops->command(a->svc.self, cmd, m);
    else if (rc == 1) {
        mq_warn("unknown pipe command '%s' ignored", cmd);
        rc = 0;
    }
    zstr_free(&cmd);
    zmsg_destroy(&m);
    return rc;
}

static int s_on_tick(zloop_t *loop, int timer_id, void *arg)
{
    s_actor_t *a = arg;
    a->ops->tick(a->svc.self);
    return 0;
}

void mq_service_actor(zsock_t *pipe, const mq_service_ops_t *ops, void *cfg)
{
    mq_log_set_tag(ops->name);
    s_actor_t a = {.svc = {.pipe = pipe, .cfg = cfg}, .ops = ops};
    int code = 1;
    a.svc.self = calloc(1, ops->size);
    a.svc.loop = a.svc.self ? zloop_new() : NULL;
    if (!a.svc.loop)
        mq_err_set("out of memory");
    else {
        zloop_set_nonstop(a.svc.loop, true); /* $TERM ends it, not a signal: see service.h */
        zloop_reader(a.svc.loop, pipe, s_on_pipe, &a);
        code = ops->start(a.svc.self, &a.svc);
    }
    zsock_signal(pipe, 0);
    if (code == 0) {
        if (ops->tick)
            zloop_timer(a.svc.loop, 1000, 0, s_on_tick, &a);
        zloop_start(a.svc.loop);
        if (!a.termed) {
            mq_err_set("the service's loop ended by itself");
            mq_error("%s", mq_err_last());
            code = 1;
        }
    } else
        mq_error("cannot start: %s", mq_err_last());
    if (code != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_service_done_why(pipe, code, why);
    }
    while (!a.termed) { /* the owner's $TERM; PORT and DROPS answered meanwhile */
        char *cmd = zstr_recv(pipe);
        s_common_command(&a, cmd);
        zstr_free(&cmd);
    }
    if (a.svc.self)
        ops->stop(a.svc.self);
    zloop_destroy(&a.svc.loop);
    free(a.svc.self);
    mq_wire_thread_cleanup();
}

void mq_service_done(zsock_t *pipe, int code)
{
    zstr_sendf(pipe, "DONE %d", code);
}

void mq_service_done_why(zsock_t *pipe, int code, const char *why)
{
    zstr_sendf(pipe, "DONE %d %s", code, why);
}

static void s_stop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

static volatile sig_atomic_t s_signalled;

static void s_on_signal(int sig)
{
    (void)sig;
    s_signalled = 1;
}

/* Threads started before main (OpenBLAS's pool) keep the signals unblocked: one of them may
 * take a signal, and then only this flag is set. Every thread started later has them blocked,
 * so no wait in the service's own threads is ever interrupted. */
void mq_service_block_signals(void)
{
    zsys_handler_set(NULL);
    struct sigaction sa = {.sa_handler = s_on_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigset_t set;
    s_stop_signals(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

bool mq_service_signalled(void)
{
    sigset_t set;
    s_stop_signals(&set);
    struct timespec zero = {0, 0};
    if (sigtimedwait(&set, NULL, &zero) > 0)
        s_signalled = 1;
    return s_signalled != 0;
}

int mq_service_run(zactor_fn *actor_fn, void *args)
{
    mq_service_block_signals(); /* idempotent; mains call it first */
    const char *l = getenv("MQGRAD_LINGER");
    bool linger = l && *l && strcmp(l, "0") != 0;
    int code = MQ_EXIT_REJOIN;
    while (code == MQ_EXIT_REJOIN && !mq_service_signalled()) {
        zactor_t *actor = zactor_new(actor_fn, args);
        if (!actor) {
            mq_error("cannot start the service thread");
            return 1;
        }
        code = 0;
        bool lingering = false;
        zpoller_t *poller = zpoller_new(zactor_sock(actor), NULL);
        while (!mq_service_signalled()) {
            void *which = zpoller_wait(poller, 200);
            if (which) {
                char *msg = zstr_recv(which);
                if (msg && strncmp(msg, "DONE ", 5) == 0) {
                    code = atoi(msg + 5);
                    zstr_free(&msg);
                    if (code != 0 || !linger)
                        break;
                    if (!lingering)
                        mq_info("the run is over; staying up until SIGTERM (MQGRAD_LINGER)");
                    lingering = true; /* the actor goes on answering probes, refusing joins */
                    continue;
                }
                zstr_free(&msg);
            }
        }
        zpoller_destroy(&poller);
        zactor_destroy(&actor);
        if (code == MQ_EXIT_REJOIN) {
            mq_info("registering with the scheduler again, from a clean state");
            zclock_sleep(500);
        }
    }
    return code == MQ_EXIT_REJOIN ? 0 : code;
}
