/* The round's record (scheduler_internal.h): a closed round's row, the run's totals, the
 * divergence watch's verdict and the summary's figures. Without files or sockets: the actor
 * writes the row, says the events and ends the run as it is told. */
#include <math.h>
#include <string.h>

#include "scheduler_internal.h"

void mq_rec_init(mq_totals_t *t)
{
    *t = (mq_totals_t){
        .last_loss = NAN, .last_acc = NAN, .last_sparsity = NAN, .acc_iter = -1};
}

void mq_rec_norms(const mq_report_t *sum, uint32_t nreports, double *grad, double *sent,
                  double *update)
{
    double W = nreports; /* the reports in hand: all members', unless some were late */
    *grad = sqrt(sum->grad_sq / W);
    *sent = sqrt(sum->sent_sq / W);
    *update = sqrt(sum->update_sq / W);
}

unsigned mq_rec_round(mq_totals_t *t, mq_watch_t *w, bool stop_on_divergence,
                      const mq_rec_round_t *in, const mq_report_t *s, mq_rec_out_t *out)
{
    double W = in->nreports;
    double loss = s->loss_nonfinite ? NAN : s->loss / W;
    unsigned actions = 0;
    bool spike = false;
    out->smoothed_before = w->smoothed;
    if (mq_watch_loss(w, in->iter, loss, s->nonfinite, in->bits, &spike))
        actions |= MQ_REC_DIVERGED | (stop_on_divergence ? MQ_REC_STOP : 0);
    else if (spike)
        actions |= MQ_REC_GUARD;
    t->last_loss = loss;
    t->bytes_up += s->bytes_up;
    t->bytes_down += s->bytes_down;
    mq_metrics_row_t *row = &out->row;
    *row = (mq_metrics_row_t){
        .iter = in->iter,
        .train_time_s = in->train_time_s,
        .loss = loss,
        .smoothed_loss = w->smoothed,
        .bits = in->bits,
        .bytes_up = s->bytes_up,
        .bytes_down = s->bytes_down,
        .compute_ms = s->compute_ms / W,
        .encode_ms = s->encode_ms / W,
        .wait_ms = s->wait_ms / W,
        .decode_ms = s->decode_ms / W,
        .update_ms = s->update_ms / W,
        .agent_ms = in->agent_ms,
        .evaluated = in->evaluated && s->eval_total > 0,
        .workers = in->nmembers,
        .stragglers = in->cut,
        .slowest_rank = in->slowest_rank,
        .slowest_ms = in->slowest_ms,
    };
    if (row->evaluated) {
        row->test_acc = (double)s->eval_correct / (double)s->eval_total;
        row->test_loss = s->eval_loss_sum / (double)s->eval_total;
        t->last_acc = row->test_acc;
        t->last_sparsity = s->params ? (double)s->zero_params / (double)s->params : NAN;
        t->acc_iter = (double)in->iter;
        /* a run told to stop is not judged again on the same round */
        if (!(actions & MQ_REC_STOP) && mq_watch_accuracy(w, in->iter, row->test_acc))
            actions |= MQ_REC_DIVERGED | (stop_on_divergence ? MQ_REC_STOP : 0);
    }
    return actions;
}

bool mq_rec_final(const mq_totals_t *t, mq_watch_t *w, uint64_t iters)
{
    /* the last round is always evaluated (horizon.c): one that was not, or was evaluated
     * before a rollback took the run back, is not the run's end */
    return iters > 0 && t->acc_iter == (double)(iters - 1) &&
           mq_watch_final(w, iters, t->last_acc);
}

void mq_rec_summary(const mq_totals_t *t, const mq_watch_t *w, mq_summary_t *s)
{
    s->final_loss = t->last_loss;
    s->final_test_acc = t->last_acc;
    s->final_sparsity = t->last_sparsity;
    s->bytes_up = t->bytes_up;
    s->bytes_down = t->bytes_down;
    if (w->diverged) {
        s->divergence_rule = w->rule;
        s->divergence_iter = w->div_iter;
        s->divergence_detail = w->detail;
        /* an accuracy measured before the run diverged is not what it ended with */
        if (t->acc_iter < (double)w->div_iter)
            s->final_test_acc = NAN;
    }
}

void mq_rec_save(const mq_totals_t *t, const mq_watch_t *w, mq_sched_ckpt_t *c)
{
    c->bytes_up = t->bytes_up;
    c->bytes_down = t->bytes_down;
    c->last_acc = t->last_acc;
    c->acc_iter = t->acc_iter < 0 ? NAN : t->acc_iter;
    c->last_loss = t->last_loss;
    c->last_sparsity = t->last_sparsity;
    c->smoothed = w->smoothed;
    c->best = isinf(w->best) ? NAN : w->best; /* JSON has no infinity */
    c->best_acc = w->best_acc < 0 ? NAN : w->best_acc;
    c->first_loss = w->first;
    c->seen = w->seen;
}

void mq_rec_load(mq_totals_t *t, mq_watch_t *w, const mq_sched_ckpt_t *c)
{
    t->bytes_up = c->bytes_up;
    t->bytes_down = c->bytes_down;
    t->last_acc = c->last_acc;
    t->acc_iter = isnan(c->acc_iter) ? -1 : c->acc_iter;
    t->last_loss = c->last_loss;
    t->last_sparsity = c->last_sparsity;
    w->smoothed = c->smoothed;
    w->best = isnan(c->best) ? INFINITY : c->best;
    w->best_acc = isnan(c->best_acc) ? -1 : c->best_acc;
    w->first = c->first_loss;
    w->seen = c->seen;
}
