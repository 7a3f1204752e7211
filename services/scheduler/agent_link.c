/* The scheduler's link to the agent as a state machine without sockets (scheduler_internal.h):
 * the table below is the whole of its behaviour; the actor sends, runs the timer and goes on
 * as the actions say. */
#include <stdio.h>

#include "mqgrad/quant.h"
#include "mqgrad/util.h"
#include "scheduler_internal.h"

typedef struct {
    mq_al_state_t next;
    unsigned actions;
    bool valid; /* false: the event cannot happen in this state (a bug in the caller) */
} s_cell_t;

#define S_CELL(state, acts) {MQ_AL_##state, (acts), true}
#define S_NONE {0, 0, false}

/* state x event -> next state, actions. */
static const s_cell_t s_table[MQ_AL_NSTATES][MQ_AL_NEVENTS] = {
    [MQ_AL_ANSWERING] =
        {
            [MQ_AL_OBSERVED] = S_CELL(WAITING, MQ_AL_WAIT),
            [MQ_AL_OBSERVED_LAST] = S_CELL(ANSWERING, MQ_AL_NEXT),
            [MQ_AL_UNREACHABLE] = S_CELL(SILENT, MQ_AL_MISSED | MQ_AL_LOST | MQ_AL_NEXT),
            [MQ_AL_DECISION_DUE] = S_CELL(ANSWERING, MQ_AL_TAKE),
            [MQ_AL_DECISION] = S_CELL(ANSWERING, MQ_AL_TAKE),
            [MQ_AL_DEADLINE] = S_CELL(ANSWERING, 0), /* a timer already ended */
            [MQ_AL_RESET] = S_CELL(ANSWERING, 0),
        },
    [MQ_AL_WAITING] =
        {
            [MQ_AL_OBSERVED] = S_NONE, /* one observation awaits its decision at a time */
            [MQ_AL_OBSERVED_LAST] = S_NONE,
            [MQ_AL_UNREACHABLE] = S_NONE,
            [MQ_AL_DECISION_DUE] = S_CELL(ANSWERING, MQ_AL_TAKE | MQ_AL_CANCEL | MQ_AL_NEXT),
            [MQ_AL_DECISION] = S_CELL(WAITING, MQ_AL_TAKE), /* an older one: still waiting */
            [MQ_AL_DEADLINE] = S_CELL(SILENT, MQ_AL_MISSED | MQ_AL_LOST | MQ_AL_NEXT),
            [MQ_AL_RESET] = S_CELL(ANSWERING, MQ_AL_CANCEL),
        },
    [MQ_AL_SILENT] =
        {
            [MQ_AL_OBSERVED] = S_CELL(SILENT, MQ_AL_NEXT), /* told, not waited for */
            [MQ_AL_OBSERVED_LAST] = S_CELL(SILENT, MQ_AL_NEXT),
            [MQ_AL_UNREACHABLE] = S_CELL(SILENT, MQ_AL_MISSED | MQ_AL_NEXT),
            [MQ_AL_DECISION_DUE] = S_CELL(ANSWERING, MQ_AL_TAKE | MQ_AL_BACK),
            [MQ_AL_DECISION] = S_CELL(ANSWERING, MQ_AL_TAKE | MQ_AL_BACK),
            [MQ_AL_DEADLINE] = S_CELL(SILENT, 0),
            [MQ_AL_RESET] = S_CELL(SILENT, 0),
        },
};

static const char *const s_states[MQ_AL_NSTATES] = {"answering", "waiting", "silent"};
static const char *const s_events[MQ_AL_NEVENTS] = {
    "observed", "observed-last", "unreachable", "decision-due", "decision", "deadline", "reset"};

const char *mq_al_state_name(mq_al_state_t s)
{
    return (unsigned)s < MQ_AL_NSTATES ? s_states[s] : "?";
}

const char *mq_al_event_name(mq_al_event_t e)
{
    return (unsigned)e < MQ_AL_NEVENTS ? s_events[e] : "?";
}

int mq_al_step(mq_al_state_t *state, mq_al_event_t event, unsigned *actions)
{
    *actions = 0;
    if ((unsigned)*state >= MQ_AL_NSTATES || (unsigned)event >= MQ_AL_NEVENTS ||
        !s_table[*state][event].valid) {
        mq_err_set("agent link: no %s event in state %s", mq_al_event_name(event),
                   mq_al_state_name(*state));
        return -1;
    }
    const s_cell_t *c = &s_table[*state][event];
    *state = c->next;
    *actions = c->actions;
    return 0;
}

mq_drop_t mq_al_decision(const mq_status_msg_t *d, uint32_t layout_tensors, mq_widths_t *out,
                         const char **why)
{
    if (d->bits < MQ_QUANT_MIN_BITS || d->bits > MQ_QUANT_MAX_BITS)
        return *why = "decision with bits out of range", MQ_DROP_CODEC;
    if (d->n_widths && d->n_widths != layout_tensors)
        return *why = "decision with per-tensor levels for another layout", MQ_DROP_LAYOUT;
    out->bits = (int)d->bits;
    out->n = d->n_widths;
    for (uint32_t t = 0; t < d->n_widths; t++) {
        if (d->widths[t] < MQ_QUANT_MIN_BITS || d->widths[t] > MQ_QUANT_MAX_BITS)
            return *why = "decision with a tensor's level out of range", MQ_DROP_CODEC;
        out->per[t] = (uint8_t)d->widths[t];
    }
    return MQ_DROP_NONE;
}

void mq_al_observation(const mq_al_round_t *r, mq_obs_msg_t *o)
{
    const mq_report_t *s = r->sum;
    double W = r->nreports; /* the reports in hand */
    double grad, sent, update;
    mq_rec_norms(s, r->nreports, &grad, &sent, &update);
    *o = (mq_obs_msg_t){
        .loss = s->loss / W,
        .loss_smoothed = r->smoothed_before,
        .nonfinite = s->nonfinite,
        .grad_norm = grad,
        .sent_norm = sent,
        .update_norm = update,
        .guard = r->used_bits != r->bits && !r->fp32,
        .iter_ms = r->iter_ms,
        .comm_ms = s->wait_ms / W,
        .grad_sqmean = s->grad_sqmean / W,
        .grad_range = s->grad_range / W,
        .total_iters = r->total_iters,
        .progress = r->progress,
        .bits = (uint32_t)r->used_bits,
        .fallbacks = r->fallbacks,
    };
    /* Per tensor, only from reports of the run's layout, and only the quantized tensors. */
    const mq_layout_t *l = r->layout;
    if (r->fp32 || !l || s->n_tensor_err != l->n)
        return;
    uint32_t k = 0;
    for (uint32_t t = 0; t < l->n && k < MQ_WIRE_MAX_TENSORS; t++) {
        if (l->t[t].count < r->quant_threshold)
            continue;
        o->tensor_count[k] = l->t[t].count;
        o->tensor_bits[k] = (uint32_t)mq_widths_at(r->widths, t);
        o->tensor_err[k] = s->tensor_err[t] / W;
        o->tensor_index[k++] = t;
    }
    o->n_tensor_count = o->n_tensor_bits = o->n_tensor_err = o->n_tensor_index = k;
    o->tensors = l->n;
}

/* BITS within the range of levels of the codec OPS. */
static int s_within(const mq_codec_ops_t *ops, int bits)
{
    if (ops->max_bits <= 0) /* a codec without levels takes the bits as they are */
        return bits;
    return bits < ops->min_bits ? ops->min_bits : bits > ops->max_bits ? ops->max_bits : bits;
}

void mq_al_levels(const mq_watch_t *watch, uint64_t iter, int bits, const mq_widths_t *widths,
                  const mq_codec_ops_t *ops, mq_widths_t *used)
{
    if (!ops) {
        *used = (mq_widths_t){.bits = 32};
        return;
    }
    used->bits = s_within(ops, mq_watch_bits(watch, iter, bits));
    used->n = widths->n;
    for (uint32_t t = 0; t < used->n; t++)
        used->per[t] = (uint8_t)s_within(ops, mq_watch_bits(watch, iter, widths->per[t]));
}
