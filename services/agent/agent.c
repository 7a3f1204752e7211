/* The agent actor: a zloop over its pipe and one ROUTER socket. It feeds OBSERVE messages
 * to the active policy and answers with the bits, answers QUERY, POLICY_SET and PING,
 * saves its state after every decision and swap, and publishes a snapshot for HTTP. */
#include "agent_internal.h"

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mqgrad/inbox.h"
#include "mqgrad/service.h"

typedef struct {
    mq_agent_config_t *cfg;
    zsock_t *pipe, *router;
    zloop_t *loop;
    int port;
    mq_agent_http_t *http;
    mq_policy_t *policy;     /* the active policy */
    mq_policy_t *stash;      /* the last mqgrad or learned policy swapped away from, or NULL */
    int min_bits;            /* of the active policy: the bit-width of its first Q-value */
    mq_policy_status_t last; /* the active policy's status after the last change */
    uint64_t iter;           /* last observed iteration, whatever the policy */
    mq_agent_counters_t n;
    mq_drops_t drops;
    mq_msg_t *msg;
    mq_inbox_t in;      /* the router's */
    char refusal[128]; /* why it refused a message */
    bool dirty;      /* observations not saved yet (saved at the next decision) */
    bool warned_old; /* an out-of-order iteration was reported */
    zactor_t *saver; /* writes the state file (NULL without one) */
    mq_sec_t *sec;
} s_agent_t;

/* ---- policies ----------------------------------------------------------------------- */

/* SPEC names policy NAME (with or without options). */
static bool s_is(const char *spec, const char *name)
{
    size_t n = strlen(name);
    return strncmp(spec, name, n) == 0 && (spec[n] == '\0' || spec[n] == ':');
}

/* A policy whose learned state is kept aside when it is swapped away from. */
static bool s_keeps_learning(const char *spec)
{
    return s_is(spec, "mqgrad") || s_is(spec, "learned");
}

/* The bit range a spec will have: OPTS's, overridden by "min=" / "max=" in the spec. */
static void s_spec_range(const char *spec, const mq_policy_opts_t *opts, int *lo, int *hi)
{
    *lo = opts->min_bits;
    *hi = opts->max_bits;
    const char *args = strchr(spec, ':');
    for (const char *p = args; p && *p; p = strchr(p + 1, ',')) {
        const char *tok = p + 1;
        if (strncmp(tok, "min=", 4) == 0)
            *lo = atoi(tok + 4);
        else if (strncmp(tok, "max=", 4) == 0)
            *hi = atoi(tok + 4);
    }
}

/* Builds SPEC with the agent's options, starting at KEEP_BITS clamped into the policy's
 * range, so that a swap does not throw away bits already reached (a spec's own "start="
 * still wins). NULL with an error on a bad spec. */
static mq_policy_t *s_policy_new(s_agent_t *self, const char *spec, int keep_bits)
{
    mq_policy_opts_t o = self->cfg->opts;
    int lo, hi;
    s_spec_range(spec, &o, &lo, &hi);
    o.start_bits = keep_bits < lo ? lo : keep_bits > hi ? hi : keep_bits;
    return mq_policy_new(spec, &o);
}

static void s_activate(s_agent_t *self, mq_policy_t *p)
{
    int hi;
    self->policy = p;
    mq_policy_status(p, &self->last);
    s_spec_range(self->last.spec, &self->cfg->opts, &self->min_bits, &hi);
}

/* Makes SPEC the active policy. Swapping back to the mqgrad (or learned) spec that was
 * swapped away from resumes it (weights, MDP state, bits); any other spec is built new,
 * starting at the current bits, and a new learned spec takes over the table of the learned
 * policy swapped away from or kept aside (e.g. "learned" trained, "learned:epsilon=0"
 * deployed). The mqgrad or learned policy swapped away from is kept aside (one at a time). */
static int s_swap(s_agent_t *self, const char *spec)
{
    if (strcmp(spec, self->last.spec) == 0) {
        mq_info("policy %s is already active", spec);
        return 0;
    }
    mq_policy_t *next = NULL, *old = self->policy;
    bool resumed = false;
    if (self->stash && s_keeps_learning(spec)) {
        mq_policy_status_t ss;
        mq_policy_status(self->stash, &ss);
        resumed = strcmp(ss.spec, spec) == 0;
    }
    if (resumed) {
        next = self->stash;
        self->stash = NULL;
    } else if (!(next = s_policy_new(self, spec, self->last.bits))) {
        return -1;
    }
    mq_policy_status_t before = self->last;
    const mq_policy_t *from = mq_policy_episodic(old) ? old : self->stash;
    bool adopted = false;
    if (!resumed && mq_policy_episodic(next) && mq_policy_episodic(from)) {
        adopted = mq_policy_adopt(next, from) == 0;
        if (!adopted)
            mq_warn("policy %s starts with an empty table: %s", spec, mq_err_last());
    }
    if (s_keeps_learning(before.spec)) {
        mq_policy_destroy(&self->stash);
        self->stash = old;
    } else {
        mq_policy_destroy(&old);
    }
    s_activate(self, next);
    self->n.swaps++;
    mq_info("policy swap: %s (%d bits, step %llu) -> %s (%d bits, %s)", before.spec, before.bits,
            (unsigned long long)before.step, self->last.spec, self->last.bits,
            resumed ? "learned state resumed" : adopted ? "new, with the learned table" : "new");
    return 0;
}

/* ---- state -------------------------------------------------------------------------- */

static void s_fill_status(const s_agent_t *self, mq_status_msg_t *s)
{
    const mq_policy_status_t *st = &self->last;
    memset(s, 0, sizeof *s);
    snprintf(s->policy, sizeof s->policy, "%s", st->spec);
    s->bits = (uint32_t)st->bits;
    s->step = st->step;
    s->iter = st->iter > self->iter ? st->iter : self->iter;
    s->observations = self->n.observations;
    s->last_reward = st->last_reward;
    s->n_q_values = st->nq < 0 ? 0 : st->nq > MQ_WIRE_MAX_Q ? MQ_WIRE_MAX_Q : (uint32_t)st->nq;
    for (uint32_t i = 0; i < s->n_q_values; i++)
        s->q_values[i] = st->q_values[i];
    s->decisions = self->n.decisions;
    s->fallbacks = self->n.fallbacks;
    s->min_bits = (uint32_t)self->min_bits;
    s->n_widths = st->nwidths > MQ_WIRE_MAX_TENSORS ? 0 : st->nwidths;
    for (uint32_t t = 0; t < s->n_widths; t++)
        s->widths[t] = st->widths[t];
}

static void s_publish(s_agent_t *self)
{
    if (!self->http)
        return;
    mq_agent_snapshot_t snap;
    s_fill_status(self, &snap.status);
    snap.swaps = self->n.swaps;
    memcpy(snap.drops, self->drops.count, sizeof snap.drops);
    mq_agent_http_publish(self->http, &snap);
}

/* Saves the state (if there is a state file): packed here, written by the saver thread so
 * that fsync never delays a reply; before the saver exists (at start) written here, so an
 * unwritable path is found at once. A failing write is logged, never fatal. */
static int s_save(s_agent_t *self)
{
    if (!self->cfg->state[0])
        return 0;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (mq_agent_state_pack(self->policy, self->stash, &self->n, &buf, &len) != 0) {
        mq_error("cannot pack the state: %s", mq_err_last());
        return -1;
    }
    self->dirty = false;
    if (self->saver) {
        mq_agent_saver_put(self->saver, buf, len);
        return 0;
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", self->cfg->state);
    int rc = mq_mkdirs(dirname(dir)); /* a state volume may come up empty */
    if (rc == 0)
        rc = mq_write_file_atomic(self->cfg->state, buf, len);
    free(buf);
    if (rc != 0) {
        char why[800];
        snprintf(why, sizeof why, "%s", mq_err_last());
        mq_err_set("the state file cannot be written: %s", why);
    }
    return rc;
}

/* Loads the state file into SELF. Returns 0 (restored or no file: *WHAT says which), or
 * -1 when the file is unusable and --fresh was not given (the file is left untouched). */
static int s_load(s_agent_t *self, char *what, size_t cap)
{
    mq_agent_config_t *cfg = self->cfg;
    mq_policy_t *cur = NULL, *stash = NULL;
    /* Only the state file's own: its folder may be anyone's (the working directory). */
    char dir[sizeof cfg->state], name[sizeof cfg->state];
    snprintf(dir, sizeof dir, "%s", cfg->state);
    snprintf(name, sizeof name, "%s", cfg->state);
    int swept = mq_tmp_sweep(dirname(dir), basename(name));
    if (swept > 0)
        mq_info("removed %d temporary files that writers which died left beside %s", swept,
                cfg->state);
    int rc = mq_agent_state_load(cfg->state, &cur, &stash, &self->n);
    if (rc == 1) {
        snprintf(what, cap, "new");
        return 0;
    }
    if (rc == 0) {
        s_activate(self, cur);
        self->stash = stash;
        self->iter = self->last.iter;
        snprintf(what, cap, "resumed at step %llu, %llu observations",
                 (unsigned long long)self->last.step, (unsigned long long)self->n.observations);
        return 0;
    }
    char why[1000];
    snprintf(why, sizeof why, "%s", mq_err_last());
    memset(&self->n, 0, sizeof self->n);
    if (!cfg->fresh) {
        mq_err_set("%s; refusing to start (the file is left as it is: move it away, or start "
                   "with --fresh to set it aside and begin anew)",
                   why);
        return -1;
    }
    char aside[1100];
    snprintf(aside, sizeof aside, "%s.corrupt-%lld", cfg->state, (long long)time(NULL));
    if (rename(cfg->state, aside) != 0) {
        mq_err_set("%s; --fresh: cannot move it to %s: %s", why, aside, strerror(errno));
        return -1;
    }
    mq_warn("%s; --fresh: moved it to %s and starting anew", why, aside);
    snprintf(what, cap, "new; the unusable file was moved to %s", aside);
    return 0;
}

/* Restores the state, then makes --policy the active policy (a restored policy with another
 * spec is swapped away from, so a restored mqgrad or learned keeps its learned state aside,
 * and a learned --policy takes over a restored learned table).
 * Returns 0, or 2 with cfg->start_error set. */
static int s_setup_policy(s_agent_t *self, char *what, size_t cap)
{
    mq_agent_config_t *cfg = self->cfg;
    snprintf(what, cap, "none (no persistence)");
    if (cfg->state[0] && s_load(self, what, cap) != 0)
        return 2;
    if (!self->policy) {
        mq_policy_t *p = s_policy_new(self, cfg->policy, cfg->opts.start_bits);
        if (!p)
            return 2;
        s_activate(self, p);
    } else if (strcmp(self->last.spec, cfg->policy) != 0) {
        mq_info("the state file's policy is %s, --policy asks for %s: %s wins", self->last.spec,
                cfg->policy, cfg->policy);
        if (s_swap(self, cfg->policy) != 0)
            return 2;
    }
    return 0;
}

/* ---- requests ----------------------------------------------------------------------- */

static void s_send(s_agent_t *self)
{
    if (mq_wire_reply(self->router, self->msg, &self->drops) != 0) {
        mq_debug("reply %s not sent: %s", mq_msg_type_name(self->msg->type), mq_err_last());
        s_publish(self);
    }
}

static void s_reply_error(s_agent_t *self, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void s_reply_error(s_agent_t *self, const char *fmt, ...)
{
    char text[MQ_WIRE_MAX_TEXT];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    mq_msg_init(self->msg, MQ_MSG_ERROR);
    snprintf(self->msg->error.reason, sizeof self->msg->error.reason, "%s", text);
    s_send(self);
}

static void s_reply_status(s_agent_t *self, mq_msg_type_t type, uint64_t iter)
{
    mq_msg_init(self->msg, type);
    self->msg->iter = iter;
    s_fill_status(self, type == MQ_MSG_DECISION ? &self->msg->decision : &self->msg->status);
    s_send(self);
}

/* A new run: the iterations start again from the first window while the agent has seen
 * later ones. The learned state belongs to the old run: it is kept beside the state file
 * (PATH.run-<unix time>) and the policy starts anew with the same spec. */
static void s_new_run(s_agent_t *self, uint64_t iter)
{
    mq_policy_t *fresh = s_policy_new(self, self->last.spec, self->cfg->opts.start_bits);
    if (!fresh) {
        mq_warn("a new run, but policy %s cannot be rebuilt: %s", self->last.spec, mq_err_last());
        return;
    }
    char aside[1100] = "";
    uint8_t *buf = NULL;
    size_t len = 0;
    if (self->cfg->state[0] &&
        mq_agent_state_pack(self->policy, self->stash, &self->n, &buf, &len) == 0) {
        snprintf(aside, sizeof aside, "%s.run-%lld", self->cfg->state, (long long)time(NULL));
        if (mq_write_file_atomic(aside, buf, len) != 0)
            snprintf(aside, sizeof aside, "nowhere (%s)", mq_err_last());
    }
    free(buf);
    mq_warn("iteration %llu after %llu: a new run; policy %s starts anew%s%s",
            (unsigned long long)iter, (unsigned long long)self->iter, self->last.spec,
            aside[0] ? ", the previous run's state is kept in " : "", aside);
    mq_policy_destroy(&self->policy);
    mq_policy_destroy(&self->stash);
    s_activate(self, fresh);
    self->iter = 0;
    self->warned_old = false;
}

/* A policy that learns across runs sees iteration 0 again: a new episode of the same policy.
 * It closes the last one (its return recorded, what it learned kept); saved at once. */
static void s_new_episode(s_agent_t *self)
{
    uint64_t last = self->iter;
    if (mq_policy_new_episode(self->policy) != 0) {
        mq_warn("a new episode of %s failed: %s", self->last.spec, mq_err_last());
        return;
    }
    mq_policy_status(self->policy, &self->last);
    self->iter = 0;
    self->warned_old = false;
    mq_info("iteration 0 after %llu: a new episode of %s (%s)", (unsigned long long)last,
            self->last.spec, self->last.detail);
    s_save(self);
}

/* Iterations arrive in order. Iteration 0 after others starts a new episode of a policy
 * that learns across runs; for the others, one from the first window after later ones
 * starts a new run; any other step back is ignored by the policy (a scheduler resuming from
 * a checkpoint repeats iterations already seen), which is said once. */
static void s_check_order(s_agent_t *self, uint64_t iter)
{
    if (self->n.observations == 0 || self->last.observations == 0 || iter > self->iter) {
        self->warned_old = false;
        return;
    }
    if (iter == 0 && mq_policy_episodic(self->policy)) {
        s_new_episode(self);
    } else if (iter < (uint64_t)self->cfg->opts.T &&
               self->iter >= (uint64_t)self->cfg->opts.T) {
        s_new_run(self, iter);
    } else if (!self->warned_old) {
        mq_warn("iteration %llu is not after the last observed (%llu): ignored, as are the "
                "next ones until training passes it",
                (unsigned long long)iter, (unsigned long long)self->iter);
        self->warned_old = true;
    }
}

/* OBSERVE: one finished iteration. The reply goes out before anything slow (the save). */
static void s_on_observe(void *arg, mq_msg_t *msg, const mq_obs_msg_t *obs)
{
    s_agent_t *self = arg;
    mq_observation_t o = {.iter = msg->iter,
                          .loss = obs->loss,
                          .iter_ms = obs->iter_ms,
                          .grad_sqmean = obs->grad_sqmean,
                          .grad_range = obs->grad_range,
                          .total_iters = obs->total_iters,
                          .progress = obs->progress,
                          .bits = (int)obs->bits,
                          .loss_smoothed = obs->loss_smoothed,
                          .nonfinite = obs->nonfinite,
                          .grad_norm = obs->grad_norm,
                          .sent_norm = obs->sent_norm,
                          .update_norm = obs->update_norm,
                          .guard = obs->guard,
                          .comm_ms = obs->comm_ms,
                          .ntensors = obs->n_tensor_count,
                          .layout_tensors = obs->tensors,
                          .tensor_count = obs->tensor_count,
                          .tensor_bits = obs->tensor_bits,
                          .tensor_index = obs->tensor_index,
                          .tensor_err = obs->tensor_err};
    s_check_order(self, o.iter);
    if (mq_policy_observe(self->policy, &o) < 0) {
        s_reply_error(self, "observation of iteration %llu failed: %s", (unsigned long long)o.iter,
                      mq_err_last());
        return;
    }
    mq_policy_status_t st;
    mq_policy_status(self->policy, &st);
    uint64_t steps = st.step - self->last.step;
    self->n.decisions += steps;
    self->n.observations += st.observations - self->last.observations;
    self->n.fallbacks = obs->fallbacks;
    if (st.observations != self->last.observations)
        self->dirty = true;
    if (o.iter > self->iter)
        self->iter = o.iter;
    self->last = st;
    s_reply_status(self, MQ_MSG_DECISION, o.iter);
    s_publish(self);
    if (steps > 0) {
        mq_info("decision %llu at iteration %llu: %d bits (reward %.4g)%s%s",
                (unsigned long long)st.step, (unsigned long long)o.iter, st.bits, st.last_reward,
                st.detail[0] ? "; " : "", st.detail);
        s_save(self);
    }
}

static void s_on_policy_set(void *arg, mq_msg_t *msg, const mq_policy_set_t *set)
{
    s_agent_t *self = arg;
    char spec[MQ_WIRE_MAX_TEXT];
    snprintf(spec, sizeof spec, "%s", set->policy);
    if (s_swap(self, spec) != 0) {
        mq_warn("policy swap to '%s' refused: %s", spec, mq_err_last());
        s_reply_error(self, "policy '%s' refused: %s", spec, mq_err_last());
        return;
    }
    s_reply_status(self, MQ_MSG_STATUS, self->iter);
    s_publish(self);
    s_save(self);
}

/* Who may send what (SECURITY.md): the scheduler observes, operators set the policy, any
 * cluster key (any key at all with --open-query) asks. A refused sender is told why. */
static mq_drop_t s_refusal(void *arg, mq_msg_t *m, const char **why)
{
    s_agent_t *self = arg;
    unsigned may = m->type == MQ_MSG_OBSERVE      ? MQ_KEYS(MQ_KEY_SCHEDULER)
                   : m->type == MQ_MSG_POLICY_SET ? MQ_KEYS(MQ_KEY_OPERATOR)
                   : self->cfg->sec.open          ? MQ_KEYS_ANY
                                                  : MQ_KEYS_KNOWN;
    if (mq_sec_allows(self->sec, m, may))
        return MQ_DROP_NONE;
    snprintf(self->refusal, sizeof self->refusal, "%s needs %s key; this one is %s",
             mq_msg_type_name(m->type),
             m->type == MQ_MSG_OBSERVE      ? "the scheduler's"
             : m->type == MQ_MSG_POLICY_SET ? "an operator"
                                            : "a cluster",
             mq_sec_role(self->sec, m) ? mq_key_role_name(mq_sec_role(self->sec, m))
                                       : "not the cluster's");
    s_reply_error(self, "refused: %s", self->refusal);
    *why = self->refusal;
    return MQ_DROP_AUTH;
}

static void s_on_query(void *arg, mq_msg_t *msg)
{
    s_agent_t *self = arg;
    s_reply_status(self, MQ_MSG_STATUS, self->iter);
}

/* A type the agent does not take: the sender is told. */
static void s_unhandled(void *arg, mq_msg_t *m)
{
    s_reply_error(arg, "mqgrad-agent does not take %s messages", mq_msg_type_name(m->type));
}

static void s_after(void *arg)
{
    s_publish(arg);
}

static const mq_handlers_t s_handlers = {
    .observe = s_on_observe, .query = s_on_query, .policy_set = s_on_policy_set};

/* "HTTP-PORT": the HTTP port, "0" without HTTP (PORT, DROPS and $TERM are the skeleton's). */
static int s_command(void *arg, const char *cmd, zmsg_t *rest)
{
    s_agent_t *self = arg;
    if (streq(cmd, "HTTP-PORT"))
        zstr_sendf(self->pipe, "%d", mq_agent_http_port(self->http));
    else
        mq_warn("unknown pipe command '%s' ignored", cmd);
    return 0;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static void s_stop(void *arg)
{
    s_agent_t *self = arg;
    if (self->dirty)
        s_save(self);
    zactor_destroy(&self->saver); /* writes what is pending first */
    mq_agent_http_destroy(&self->http);
    mq_sec_unserve(self->sec, self->router);
    zsock_destroy(&self->router);
    mq_sec_close(&self->sec); /* after its socket */
    mq_policy_destroy(&self->policy);
    mq_policy_destroy(&self->stash);
    if (self->msg)
        mq_msg_reset(self->msg);
    free(self->msg);
}

/* Opens the sockets and the HTTP server; 0, or 1 with an error. */
static int s_open(s_agent_t *self)
{
    mq_agent_config_t *cfg = self->cfg;
    self->router = zsock_new(ZMQ_ROUTER);
    if (!self->router) {
        mq_err_set("cannot create the ROUTER socket");
        return 1;
    }
    mq_wire_prepare(self->router, 0, MQ_WIRE_MAX_CONTROL_MSG);
    zsock_set_sndtimeo(self->router, 0); /* a stuck client never stalls the agent */
    if (!(self->sec = mq_sec_open(&cfg->sec, MQ_KEY_AGENT)) ||
        mq_sec_serve(self->sec, self->router, "the agent") != 0)
        return 1;
    self->port = zsock_bind(self->router, "%s", cfg->bind);
    if (self->port < 0) {
        mq_err_set("cannot bind %s: %s", cfg->bind, zmq_strerror(zmq_errno()));
        return 1;
    }
    if (cfg->http.port != 0 && !(self->http = mq_agent_http_new(&cfg->http)))
        return 1;
    self->in = (mq_inbox_t){.on = &s_handlers, .self = self, .msg = self->msg,
                            .drops = &self->drops, .refuse = s_refusal,
                            .unhandled = s_unhandled, .after = s_after};
    zloop_reader(self->loop, self->router, mq_inbox_read, &self->in);
    return 0;
}

/* Restores the state, builds the policy, opens the sockets and writes the state once (so
 * an unwritable state path is found now, not at the first decision). 0, 1 or 2. */
static int s_start(s_agent_t *self)
{
    mq_agent_config_t *cfg = self->cfg;
    char what[2048];
    int rc = s_setup_policy(self, what, sizeof what);
    if (rc == 0)
        rc = s_open(self);
    if (rc == 0 && cfg->state[0] && s_save(self) != 0)
        rc = 1;
    if (rc == 0 && cfg->state[0] && !(self->saver = mq_agent_saver_new(cfg->state)))
        rc = 1;
    if (rc != 0)
        return rc;
    char http[32];
    snprintf(http, sizeof http, self->http ? ":%d" : "off", mq_agent_http_port(self->http));
    snprintf(cfg->start_info, sizeof cfg->start_info,
             "zmq %s (port %d), http %s, policy %s (%d bits), state %s%s%s%s", cfg->bind,
             self->port, http, self->last.spec, self->last.bits, cfg->state[0] ? cfg->state : "",
             cfg->state[0] ? " (" : "", what, cfg->state[0] ? ")" : "");
    return 0;
}

/* The skeleton's start: the outcome goes into the config as well (agent.h). */
static int s_start_service(void *arg, mq_service_t *svc)
{
    s_agent_t *self = arg;
    mq_agent_config_t *cfg = svc->cfg;
    cfg->start_error[0] = cfg->start_info[0] = '\0';
    self->cfg = cfg;
    self->pipe = svc->pipe;
    self->loop = svc->loop;
    svc->drops = &self->drops;
    self->msg = calloc(1, sizeof *self->msg);
    int rc = self->msg ? s_start(self) : (mq_err_set("out of memory"), 1);
    svc->port = self->port;
    svc->sec = self->sec;
    cfg->start_status = rc;
    if (rc != 0) {
        snprintf(cfg->start_error, sizeof cfg->start_error, "%s", mq_err_last());
        return rc;
    }
    s_publish(self);
    if (cfg->announce) { /* the program's: "agent ready" on stdout, for whoever waits on it */
        printf("agent ready: %s\n", cfg->start_info);
        fflush(stdout);
    } else
        mq_debug("ready: %s", cfg->start_info);
    return 0;
}

static const mq_service_ops_t s_ops = {.name = "agent",
                                       .size = sizeof(s_agent_t),
                                       .start = s_start_service,
                                       .command = s_command,
                                       .stop = s_stop};

/* Contract: see agent.h. */
void mq_agent_actor(zsock_t *pipe, void *args)
{
    mq_service_actor(pipe, &s_ops, args);
}
