/* The run's phases: one table of what each event makes of each phase, and the deadlines of
 * the phases that wait on nodes (scheduler_internal.h). */
#include "scheduler_internal.h"

#include "mqgrad/util.h"

#define S_NO -1

/* The table of scheduler_internal.h, row by row. */
#define REG MQ_PH_REGISTERING
#define PREP MQ_PH_PREPARING
#define RUN MQ_PH_RUNNING
#define WAIT MQ_PH_WAIT_AGENT
#define PAUSE MQ_PH_PAUSED
#define DONE MQ_PH_DONE
static const int s_table[MQ_PH_COUNT_][MQ_PE_COUNT_] = {
    /*           COMPLETE  ISSUE  SHORT  ASK_AGENT  ROLL_BACK  FINISH */
    [REG] = {PREP, S_NO, S_NO, S_NO, REG, DONE},
    [PREP] = {S_NO, RUN, PAUSE, S_NO, REG, DONE},
    [RUN] = {S_NO, RUN, PAUSE, WAIT, REG, DONE},
    [WAIT] = {S_NO, RUN, PAUSE, S_NO, REG, DONE},
    [PAUSE] = {S_NO, RUN, PAUSE, S_NO, REG, DONE},
    [DONE] = {S_NO, S_NO, S_NO, S_NO, S_NO, S_NO},
};
#undef REG
#undef PREP
#undef RUN
#undef WAIT
#undef PAUSE
#undef DONE

static const char *const s_phase_names[MQ_PH_COUNT_] = {
    "registering", "preparing", "running", "waiting for the agent", "paused", "done"};
static const char *const s_event_names[MQ_PE_COUNT_] = {
    "cluster complete", "issue", "too few workers", "ask the agent", "roll back", "finish"};

void mq_ph_init(mq_phases_t *ph, double now)
{
    *ph = (mq_phases_t){.phase = MQ_PH_REGISTERING, .t_registering = now};
}

int mq_ph_next(mq_phase_t from, mq_phase_event_t event)
{
    if ((unsigned)from >= MQ_PH_COUNT_ || (unsigned)event >= MQ_PE_COUNT_)
        return S_NO;
    return s_table[from][event];
}

int mq_ph_go(mq_phases_t *ph, mq_phase_event_t event, double now)
{
    int to = mq_ph_next(ph->phase, event);
    if (to == S_NO)
        return mq_err_set("scheduler: '%s' while %s", (unsigned)event < MQ_PE_COUNT_
                                                           ? s_event_names[event]
                                                           : "an unknown event",
                          mq_ph_name(ph->phase)),
               -1;
    mq_phase_t from = ph->phase;
    if (to == MQ_PH_REGISTERING)
        ph->t_registering = now;
    if (to == MQ_PH_PAUSED && from != MQ_PH_PAUSED)
        ph->t_paused = now;
    ph->phase = (mq_phase_t)to;
    return (int)from;
}

mq_ph_due_t mq_ph_due(const mq_phases_t *ph, const mq_scheduler_config_t *c, double now,
                      double t_issued)
{
    switch (ph->phase) {
    case MQ_PH_REGISTERING:
    case MQ_PH_PREPARING:
        return now - ph->t_registering > c->start_timeout ? MQ_PD_START : MQ_PD_NONE;
    case MQ_PH_RUNNING:
        return now - t_issued > c->iter_timeout ? MQ_PD_ROUND : MQ_PD_NONE;
    case MQ_PH_PAUSED:
        return now - ph->t_paused > c->pause_timeout ? MQ_PD_PAUSE : MQ_PD_NONE;
    default:
        return MQ_PD_NONE; /* the agent has its own deadline (agent_link.c); done is done */
    }
}

const char *mq_ph_name(mq_phase_t phase)
{
    return (unsigned)phase < MQ_PH_COUNT_ ? s_phase_names[phase] : "unknown";
}
