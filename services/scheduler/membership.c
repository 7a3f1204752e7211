/* Who holds each rank, and in what state: the scheduler's membership without sockets (the
 * state-by-event table is in scheduler_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scheduler_internal.h"

int mq_mb_init(mq_membership_t *mb, uint32_t max_workers, uint32_t want_servers)
{
    memset(mb, 0, sizeof *mb);
    mb->max_workers = max_workers;
    mb->want_servers = want_servers;
    size_t w = max_workers ? max_workers : 1, s = want_servers ? want_servers : 1;
    mb->workers = calloc(w, sizeof *mb->workers);
    mb->servers = calloc(s, sizeof *mb->servers);
    mb->worker_term = calloc(w, sizeof *mb->worker_term);
    mb->server_term = calloc(s, sizeof *mb->server_term);
    if (mb->workers && mb->servers && mb->worker_term && mb->server_term)
        return 0;
    mq_mb_destroy(mb);
    return -1;
}

void mq_mb_destroy(mq_membership_t *mb)
{
    free(mb->workers), free(mb->servers), free(mb->worker_term), free(mb->server_term);
    mb->workers = mb->servers = NULL;
    mb->worker_term = mb->server_term = NULL;
}

bool mq_mb_from_peer(const mq_mb_node_t *n, const mq_msg_t *msg)
{
    return n->peer_len == msg->peer_len && memcmp(n->peer, msg->peer, msg->peer_len) == 0;
}

static void s_answer_at(mq_mb_node_t *n, const mq_msg_t *msg)
{
    memcpy(n->peer, msg->peer, msg->peer_len);
    n->peer_len = msg->peer_len;
    n->attempt = msg->register_.attempt;
}

/* A ROUTER takes its connections' messages in turn, not in the order they were sent: a
 * node's earlier try can arrive after a later one, on a connection the node has closed. */
int mq_mb_again(mq_membership_t *mb, const mq_msg_t *msg, mq_mb_reg_out_t *out)
{
    mq_mb_node_t *n = NULL;
    for (uint32_t i = 0; !n && i < mb->max_workers; i++)
        if (mb->workers[i].state != MQ_MB_FREE && mb->workers[i].incarnation == msg->incarnation)
            n = &mb->workers[i], out->worker = true, out->rank = i;
    for (uint32_t i = 0; !n && i < mb->nservers; i++)
        if (mb->servers[i].incarnation == msg->incarnation)
            n = &mb->servers[i], out->worker = false, out->rank = i;
    if (!n)
        return -1;
    out->why = NULL;
    out->retry = false;
    if (mq_mb_from_peer(n, msg) || msg->register_.attempt < n->attempt)
        return MQ_MB_SAME;
    s_answer_at(n, msg);
    return MQ_MB_MOVED;
}

static mq_mb_reg_t s_refuse(mq_mb_reg_out_t *out, const char *why, bool retry)
{
    out->why = why;
    out->retry = retry;
    return MQ_MB_REFUSED;
}

mq_mb_reg_t mq_mb_take(mq_membership_t *mb, const mq_msg_t *msg, bool registering, double now,
                       mq_mb_reg_out_t *out)
{
    static _Thread_local char why[128];
    out->worker = msg->role == MQ_ROLE_WORKER;
    out->rank = 0;
    if (msg->role != MQ_ROLE_WORKER && msg->role != MQ_ROLE_SERVER)
        return s_refuse(out, "unknown role", false);
    mq_mb_node_t *n;
    if (out->worker) {
        uint32_t r = 0;
        while (r < mb->max_workers && mb->workers[r].state != MQ_MB_FREE)
            r++;
        if (r == mb->max_workers) {
            snprintf(why, sizeof why, "all %u worker ranks are taken (--max-workers)",
                     mb->max_workers);
            return s_refuse(out, why, false);
        }
        n = &mb->workers[r];
        out->rank = r;
        mb->worker_term[r]++; /* a new holder: a new term, and the last holder's token is void */
    } else {
        /* A server that restarted before its silence was noticed: once it is, the run goes
         * back to its checkpoint and takes servers again. */
        if (!registering)
            return s_refuse(out, "the run's servers are all up; a restarted server is taken "
                                 "back once its old self is found lost", true);
        if (mb->nservers >= mb->want_servers)
            return s_refuse(out, "enough servers already", false);
        if (!msg->register_.endpoint[0])
            return s_refuse(out, "a server must give its endpoint", false);
        out->rank = mb->nservers++;
        n = &mb->servers[out->rank];
        mb->server_term[out->rank]++;
    }
    memset(n, 0, sizeof *n);
    s_answer_at(n, msg);
    n->incarnation = msg->incarnation;
    uint32_t prefer = msg->register_.prefer_shard;
    n->prefer = out->worker || prefer == 0 ? -1 : (int)prefer - 1;
    n->state = MQ_MB_SETUP;
    n->last_heard = now;
    snprintf(n->endpoint, sizeof n->endpoint, "%s", msg->register_.endpoint);
    out->why = NULL;
    out->retry = false;
    return MQ_MB_TAKEN;
}

mq_mb_node_t *mq_mb_node(mq_membership_t *mb, mq_role_t role, uint32_t rank, uint64_t incarnation)
{
    mq_mb_node_t *n = NULL;
    if (role == MQ_ROLE_WORKER && rank < mb->max_workers)
        n = &mb->workers[rank];
    else if (role == MQ_ROLE_SERVER && rank < mb->nservers)
        n = &mb->servers[rank];
    return n && n->state != MQ_MB_FREE && n->incarnation == incarnation ? n : NULL;
}

bool mq_mb_ready(mq_membership_t *mb, const mq_msg_t *msg, double now)
{
    mq_role_t role = msg->role == MQ_ROLE_WORKER ? MQ_ROLE_WORKER : MQ_ROLE_SERVER;
    mq_mb_node_t *n = mq_mb_node(mb, role, msg->rank, msg->incarnation);
    if (!n || n->state != MQ_MB_SETUP || !mq_mb_from_peer(n, msg))
        return false;
    n->state = MQ_MB_READY;
    n->last_heard = now;
    return true;
}

uint32_t mq_mb_count(const mq_membership_t *mb, mq_mb_state_t state)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < mb->max_workers; i++)
        n += state == MQ_MB_FREE ? mb->workers[i].state != MQ_MB_FREE
                                 : mb->workers[i].state == state;
    return n;
}

bool mq_mb_all_ready(const mq_membership_t *mb, uint32_t workers)
{
    for (uint32_t s = 0; s < mb->nservers; s++)
        if (mb->servers[s].state != MQ_MB_READY)
            return false;
    return mq_mb_count(mb, MQ_MB_READY) >= workers;
}

void mq_mb_form_round(mq_membership_t *mb, uint32_t *members, uint32_t *n, uint32_t *joined,
                      uint32_t *n_joined)
{
    *n = *n_joined = 0;
    for (uint32_t r = 0; r < mb->max_workers; r++) {
        mq_mb_node_t *w = &mb->workers[r];
        if (w->state == MQ_MB_READY) {
            w->state = MQ_MB_ACTIVE;
            joined[(*n_joined)++] = r;
        }
        if (w->state == MQ_MB_ACTIVE)
            members[(*n)++] = r;
    }
}

void mq_mb_start(mq_membership_t *mb)
{
    for (uint32_t s = 0; s < mb->nservers; s++)
        mb->servers[s].state = MQ_MB_ACTIVE;
    for (uint32_t r = 0; r < mb->max_workers; r++)
        if (mb->workers[r].state == MQ_MB_READY)
            mb->workers[r].state = MQ_MB_ACTIVE;
}

bool mq_mb_lose(mq_membership_t *mb, uint32_t rank)
{
    if (rank >= mb->max_workers)
        return false;
    mq_mb_node_t *w = &mb->workers[rank];
    bool member = w->state == MQ_MB_ACTIVE;
    w->state = MQ_MB_FREE;
    w->incarnation = 0;
    w->attempt = 0;
    w->pushed = 0;
    return member;
}

int mq_mb_silent(const mq_membership_t *mb, double now, double limit, uint32_t *silent_workers,
                 uint32_t *n)
{
    *n = 0;
    for (uint32_t r = 0; r < mb->max_workers; r++) {
        const mq_mb_node_t *w = &mb->workers[r];
        if (w->state != MQ_MB_FREE && now - w->last_heard > limit)
            silent_workers[(*n)++] = r;
    }
    for (uint32_t i = 0; i < mb->nservers; i++)
        if (now - mb->servers[i].last_heard > limit)
            return (int)i;
    return -1;
}

void mq_mb_place_servers(mq_membership_t *mb)
{
    for (uint32_t i = 0; i < mb->nservers; i++) {
        for (uint32_t hops = 0; hops < mb->nservers; hops++) {
            int want = mb->servers[i].prefer;
            if (want < 0 || (uint32_t)want == i || (uint32_t)want >= mb->nservers ||
                mb->servers[want].prefer == want)
                break;
            mq_mb_node_t t = mb->servers[want]; /* swap: the other one tries again from here */
            mb->servers[want] = mb->servers[i];
            mb->servers[i] = t;
        }
    }
}

void mq_mb_forget(mq_membership_t *mb)
{
    memset(mb->workers, 0, mb->max_workers * sizeof *mb->workers);
    memset(mb->servers, 0, mb->want_servers * sizeof *mb->servers);
    mb->nservers = 0;
}

const char *mq_mb_state_name(mq_mb_state_t s)
{
    static const char *const names[] = {"free", "setup", "ready", "active"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

const char *mq_mb_refusal(const mq_membership_t *mb, const mq_sec_t *sec,
                          const uint8_t run_key[MQ_RUN_KEY_LEN], uint64_t run_id,
                          const mq_msg_t *msg)
{
    if (msg->type == MQ_MSG_PING)
        return mq_sec_allows(sec, msg, MQ_KEYS_KNOWN) ? NULL : "a ping from an unknown key";
    if (msg->role != MQ_ROLE_SERVER && msg->role != MQ_ROLE_WORKER)
        return msg->type == MQ_MSG_REGISTER || mq_sec_allows(sec, msg, MQ_KEYS_NODE)
                   ? NULL
                   : "a message from a key that is no node's";
    bool server = msg->role == MQ_ROLE_SERVER;
    if (!mq_sec_allows(sec, msg, MQ_KEYS(server ? MQ_KEY_SERVER : MQ_KEY_WORKER)))
        return server ? "a server's message from a key that is not the servers' key"
                      : "a worker's message from a key that is not the workers' key";
    if (msg->type == MQ_MSG_REGISTER || msg->run_id != run_id)
        return NULL; /* a node of another run is told to register again (the actor) */
    uint32_t term = 0; /* the rank's current term: an older one's token is revoked */
    if (server && msg->rank < mb->want_servers)
        term = mb->server_term[msg->rank];
    else if (!server && msg->rank < mb->max_workers)
        term = mb->worker_term[msg->rank];
    uint8_t token[MQ_TOKEN_LEN];
    mq_token_make(run_key, msg->role, msg->rank, term, token);
    if (term == 0 || !msg->has_token || msg->term != term || !mq_token_equal(token, msg->token))
        return "a message without its rank's token (of its current term)";
    return NULL;
}

uint32_t mq_mb_seeder(const mq_membership_t *mb, uint32_t seeder)
{
    if (seeder < mb->max_workers && mb->workers[seeder].state != MQ_MB_FREE)
        return seeder;
    for (uint32_t r = 0; r < mb->max_workers; r++)
        if (mb->workers[r].state != MQ_MB_FREE)
            return r;
    return seeder;
}

void mq_mb_welcome(mq_membership_t *mb, mq_mb_node_t *node, uint32_t rank,
                   const mq_mb_run_t *run, double now, char (*endpoints)[MQ_WIRE_MAX_TEXT],
                   mq_msg_t *out)
{
    bool server = node >= mb->servers && node < mb->servers + mb->want_servers;
    node->last_heard = now;
    mq_msg_init(out, MQ_MSG_WELCOME);
    mq_welcome_t *w = &out->welcome;
    w->config = *run->config;
    out->run_id = run->run_id;
    w->rank = rank;
    w->n_servers = mb->nservers;
    for (uint32_t s = 0; s < mb->nservers; s++)
        memcpy(endpoints[s], mb->servers[s].endpoint, MQ_WIRE_MAX_TEXT);
    w->servers = endpoints;
    if (run->layout) { /* the servers build the model from it; workers check theirs */
        out->layout = *run->layout;
        w->seed = !server && rank == run->seeder && run->config->resume_iter == 0;
    }
    w->has_token = true;
    w->term = server ? mb->server_term[rank] : mb->worker_term[rank];
    mq_token_make(run->run_key, server ? MQ_ROLE_SERVER : MQ_ROLE_WORKER, rank, w->term,
                  w->token);
    if (server) {
        w->has_run_key = true;
        memcpy(w->run_key, run->run_key, MQ_RUN_KEY_LEN);
    }
}
