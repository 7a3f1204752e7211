/* A round's close without sockets (scheduler_internal.h, "the round in flight"): which
 * servers hold which pushes, when the round commits, which stragglers it leaves out, when it
 * is done. The actor feeds what arrives and carries out what comes back. */
#include <stdlib.h>
#include <string.h>

#include "mqgrad/wire.h"
#include "scheduler_internal.h"

int mq_round_init(mq_round_t *r, uint32_t max_workers, uint32_t servers)
{
    memset(r, 0, sizeof *r);
    r->max_workers = max_workers;
    r->servers = servers;
    r->words = (max_workers + 63) / 64;
    size_t w = max_workers ? max_workers : 1, s = servers ? servers : 1;
    r->members = calloc(w, sizeof *r->members);
    r->got = calloc(w, sizeof *r->got);
    r->in = calloc(w, sizeof *r->in);
    r->left = calloc(w, sizeof *r->left);
    r->have = calloc(s, sizeof *r->have);
    r->held = calloc(s * (r->words ? r->words : 1), sizeof *r->held);
    if (r->members && r->got && r->in && r->left && r->have && r->held)
        return 0;
    mq_round_destroy(r);
    return -1;
}

void mq_round_destroy(mq_round_t *r)
{
    free(r->members), free(r->got), free(r->in), free(r->left), free(r->have), free(r->held);
    r->members = r->in = r->left = NULL;
    r->got = r->have = NULL;
    r->held = NULL;
}

void mq_round_begin(mq_round_t *r, bool evaluate)
{
    r->evaluate = evaluate;
    r->committed = false;
    r->deadline_passed = false;
    r->nreports = 0;
    memset(r->have, 0, r->servers * sizeof *r->have);
    memset(r->held, 0, (size_t)r->servers * r->words * sizeof *r->held);
    memset(r->got, 0, r->max_workers * sizeof *r->got);
}

static void s_out_clear(mq_round_t *r, mq_round_out_t *out)
{
    out->actions = 0;
    out->nleft = 0;
    out->left = r->left;
}

/* Whether server S holds the push of RANK. */
static bool s_held(const mq_round_t *r, uint32_t s, uint32_t rank)
{
    return (r->held[(size_t)s * r->words + rank / 64] >> (rank % 64)) & 1;
}

/* Every server has every member's push: the round commits. */
static void s_maybe_commit(mq_round_t *r, uint32_t nservers, mq_round_out_t *out)
{
    if (r->committed || r->nmembers == 0)
        return;
    for (uint32_t s = 0; s < nservers && s < r->servers; s++)
        if (!r->have[s])
            return;
    r->committed = true;
    out->actions |= MQ_RD_COMMIT;
}

/* Under first:N once N members' pushes are at every server, under deadline:S once S seconds
 * are over and some are: the round goes on with those members (a new view of it). An
 * evaluated round waits for every member (the test set is split between them). */
static void s_try_cut(mq_round_t *r, uint32_t nservers, mq_round_out_t *out)
{
    if (r->committed || r->policy == MQ_STRAGGLERS_WAIT || r->evaluate ||
        (r->policy == MQ_STRAGGLERS_DEADLINE && !r->deadline_passed))
        return;
    uint32_t *in = r->in, nin = 0;
    for (uint32_t k = 0; k < r->nmembers; k++) {
        uint32_t rank = r->members[k];
        bool everywhere = true;
        for (uint32_t s = 0; s < nservers && s < r->servers && everywhere; s++)
            everywhere = s_held(r, s, rank);
        if (everywhere)
            in[nin++] = rank;
    }
    uint32_t need = r->policy == MQ_STRAGGLERS_FIRST ? (uint32_t)r->value : 1;
    if (nin < need || nin == r->nmembers)
        return;
    for (uint32_t k = 0, j = 0; k < r->nmembers; k++) /* the cut: members not in IN */
        if (j < nin && in[j] == r->members[k])
            j++;
        else
            r->left[out->nleft++] = r->members[k];
    memcpy(r->members, in, nin * sizeof *in);
    r->nmembers = nin;
    r->view++;
    memset(r->have, 0, r->servers * sizeof *r->have);
    out->actions |= MQ_RD_VIEW;
}

/* After the commit only reports are missing: under first:N once N are in, under deadline:S
 * once S seconds are over, the round is done without the others (their workers apply the
 * round's reply when they wake, and stay in step). */
static void s_try_close(mq_round_t *r, mq_round_out_t *out)
{
    if (!r->committed || r->evaluate || r->policy == MQ_STRAGGLERS_WAIT || r->nreports == 0 ||
        r->nreports >= r->nmembers)
        return;
    if (r->policy == MQ_STRAGGLERS_DEADLINE ? !r->deadline_passed
                                            : r->nreports < (uint32_t)r->value)
        return;
    for (uint32_t k = 0; k < r->nmembers; k++)
        if (!r->got[r->members[k]])
            r->left[out->nleft++] = r->members[k];
    out->actions |= MQ_RD_DONE;
}

void mq_round_have(mq_round_t *r, uint32_t shard, uint32_t view, uint32_t nservers,
                   mq_round_out_t *out)
{
    s_out_clear(r, out);
    if (shard >= r->servers || view != r->view)
        return; /* for a member set since cut: the new one's HAVE follows */
    r->have[shard] = true;
    s_maybe_commit(r, nservers, out);
}

void mq_round_progress(mq_round_t *r, uint32_t shard, const uint32_t *ranks, uint32_t n,
                       uint32_t nservers, mq_round_out_t *out)
{
    s_out_clear(r, out);
    if (shard >= r->servers)
        return;
    for (uint32_t k = 0; k < n; k++)
        if (ranks[k] < r->max_workers)
            r->held[(size_t)shard * r->words + ranks[k] / 64] |= 1ULL << (ranks[k] % 64);
    s_try_cut(r, nservers, out);
}

void mq_round_report(mq_round_t *r, uint32_t rank, mq_round_out_t *out)
{
    s_out_clear(r, out);
    if (rank >= r->max_workers || r->got[rank] ||
        mq_member_index(r->members, r->nmembers, rank) < 0)
        return;
    r->got[rank] = true;
    if (++r->nreports == r->nmembers)
        out->actions |= MQ_RD_DONE;
    else
        s_try_close(r, out);
}

mq_drop_t mq_round_report_check(const mq_round_t *r, bool running, uint64_t iter, bool cut,
                                uint64_t msg_iter, uint32_t rank, const char **why)
{
    bool member = mq_member_index(r->members, r->nmembers, rank) >= 0;
    if (msg_iter < iter)
        return *why = "report for a round that closed without it", MQ_DROP_LATE;
    if (running && msg_iter == iter && cut && !member)
        return *why = "report of a straggler cut from the round", MQ_DROP_LATE;
    if (!running || msg_iter != iter || !member)
        return *why = "report for another iteration, or from a worker not in it", MQ_DROP_ITER;
    if (rank >= r->max_workers || r->got[rank])
        return *why = "second report", MQ_DROP_DUPLICATE;
    return MQ_DROP_NONE;
}

void mq_round_sum(mq_report_t *sum, const mq_report_t *r, uint32_t ntensors)
{
    sum->loss += r->loss;
    sum->grad_sqmean += r->grad_sqmean;
    sum->grad_range += r->grad_range;
    sum->compute_ms += r->compute_ms;
    sum->encode_ms += r->encode_ms;
    sum->wait_ms += r->wait_ms;
    sum->decode_ms += r->decode_ms;
    sum->update_ms += r->update_ms;
    sum->bytes_up += r->bytes_up;
    sum->bytes_down += r->bytes_down;
    sum->nonfinite += r->nonfinite;
    sum->loss_nonfinite |= r->loss_nonfinite;
    sum->grad_sq += r->grad_sq;
    sum->sent_sq += r->sent_sq;
    sum->update_sq += r->update_sq;
    if (r->n_tensor_err == ntensors && ntensors <= MQ_WIRE_MAX_TENSORS) {
        for (uint32_t t = 0; t < ntensors; t++)
            sum->tensor_err[t] += r->tensor_err[t];
        sum->n_tensor_err = ntensors;
    }
    if (r->evaluated) {
        sum->eval_correct += r->eval_correct;
        sum->eval_total += r->eval_total;
        sum->eval_loss_sum += r->eval_loss_sum;
        /* every worker holds the same parameters: any one's count is the model's */
        sum->zero_params = r->zero_params;
        sum->params = r->params;
        sum->eval_ms = r->eval_ms > sum->eval_ms ? r->eval_ms : sum->eval_ms;
    }
}

void mq_round_deadline(mq_round_t *r, uint32_t nservers, mq_round_out_t *out)
{
    s_out_clear(r, out);
    r->deadline_passed = true;
    s_try_cut(r, nservers, out);
    if (!out->actions)
        s_try_close(r, out);
}

void mq_round_lose(mq_round_t *r, uint32_t rank, mq_round_out_t *out)
{
    s_out_clear(r, out);
    int k = mq_member_index(r->members, r->nmembers, rank);
    if (k < 0 || rank >= r->max_workers || r->got[rank])
        return; /* not in the round, or its push is in every shard's aggregate already */
    memmove(&r->members[k], &r->members[k + 1],
            (r->nmembers - (uint32_t)k - 1) * sizeof *r->members);
    r->nmembers--;
    if (r->committed) { /* every server has its push: the round stands, without its report */
        if (r->nmembers > 0 && r->nreports == r->nmembers)
            out->actions |= MQ_RD_DONE;
        return;
    }
    r->view++;
    memset(r->have, 0, r->servers * sizeof *r->have);
    out->actions |= MQ_RD_VIEW;
    if (r->nmembers == 0)
        out->actions |= MQ_RD_AGAIN;
}

/* ---- the round's clock ------------------------------------------------------------------ */

void mq_rclock_begin(mq_round_clock_t *c, double now, double train_time)
{
    c->t_issued = now;
    c->sim_issued = c->sim_done = c->simulated ? train_time : 0;
    c->cut = 0;
    c->slowest_rank = 0;
    c->slowest_ms = 0;
}

void mq_rclock_report(mq_round_clock_t *c, uint32_t rank, double now, double sim_time)
{
    double took_ms = c->simulated ? (sim_time - c->sim_issued) * 1e3 : (now - c->t_issued) * 1e3;
    if (!c->cut && took_ms >= c->slowest_ms) {
        c->slowest_ms = took_ms;
        c->slowest_rank = rank;
    }
    if (sim_time > c->sim_done)
        c->sim_done = sim_time;
}

void mq_rclock_cut(mq_round_clock_t *c, uint32_t first, uint32_t n, double now)
{
    if (!c->cut) {
        c->slowest_rank = first;
        c->slowest_ms = c->simulated ? 0 : (now - c->t_issued) * 1e3;
        c->cut_rounds++;
    }
    c->cut += n;
    c->cut_total += n;
}

double mq_rclock_iter_ms(const mq_round_clock_t *c, double now, double eval_ms)
{
    return c->simulated ? (c->sim_done - c->sim_issued) * 1e3 : (now - c->t_issued) * 1e3 - eval_ms;
}
