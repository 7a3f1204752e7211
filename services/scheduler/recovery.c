/* Recovery (scheduler_internal.h): what the scheduler does about a round past its timeout
 * and about a lost server. Without sockets or files: the actor gives what it knows (the
 * round, the members' heartbeats, the checkpoint it read) and carries out the answer. */
#include "scheduler_internal.h"

#include <stdio.h>

uint32_t mq_rc_stuck(const mq_round_t *r, const mq_membership_t *mb, uint64_t iter,
                     uint32_t *stuck)
{
    uint32_t n = 0;
    bool moved = false;
    for (uint32_t k = 0; k < r->nmembers; k++) {
        uint32_t rank = r->members[k];
        /* reported, or its loop pushed this round (its heartbeat says 1 + the iteration) */
        bool pushed = r->got[rank] || mb->workers[rank].pushed > iter;
        moved |= pushed;
        if (!pushed)
            stuck[n++] = rank;
    }
    return moved ? n : 0; /* nobody moved: the round, not some workers, is what is wrong */
}

mq_rc_plan_t mq_rc_unreadable(uint64_t bad, uint64_t consistent, int prev_rc, uint64_t prev_iter)
{
    mq_rc_plan_t p = {.action = MQ_RC_FAIL};
    if (bad != consistent) { /* a word on a checkpoint already fallen back from */
        p.action = MQ_RC_IGNORE;
        return p;
    }
    if (prev_rc < 0)
        snprintf(p.why, sizeof p.why, "the checkpoint before it cannot be read");
    else if (prev_rc == 1 || prev_iter >= bad)
        snprintf(p.why, sizeof p.why, "there is no consistent checkpoint before iteration %llu "
                                      "to go back to", (unsigned long long)bad);
    else {
        p.action = MQ_RC_ROLLBACK;
        p.from_checkpoint = true;
        p.from = prev_iter;
        p.lost = bad - prev_iter;
    }
    return p;
}

mq_rc_plan_t mq_rc_server_lost(long checkpoint_every, int read_rc, uint64_t ckpt_iter,
                               uint64_t iter)
{
    mq_rc_plan_t p = {.action = MQ_RC_FAIL};
    if (checkpoint_every <= 0) {
        snprintf(p.why, sizeof p.why, "without checkpoints (--checkpoint-every 0) the run "
                                      "cannot go on without its shard");
        return p;
    }
    if (read_rc < 0) {
        snprintf(p.why, sizeof p.why, "its last checkpoint cannot be read");
        return p;
    }
    p.action = MQ_RC_ROLLBACK;
    p.from_checkpoint = read_rc == 0;
    p.from = p.from_checkpoint ? ckpt_iter : 0;
    p.lost = iter > p.from ? iter - p.from : 0;
    return p;
}
