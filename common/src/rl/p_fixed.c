/* The fixed:K policy: the same K bits every iteration, the paper's fixed-width baselines.
 * Its windows still close (reward and history), so its runs read like the others'. */
#include "rl_internal.h"

typedef struct {
    int k; /* 0 until the spec gives it */
} s_fixed_t;

/* K is the spec's first parameter, bare: "fixed:4". */
static int s_option(mq_policy_t *p, int index, const char *key, const char *val)
{
    if (index != 0 || val)
        return 1;
    long k;
    if (mq_parse_long("fixed:K bit width", key, 1, 8, &k) != 0)
        return -1;
    ((s_fixed_t *)p->priv)->k = (int)k;
    return 0;
}

static int s_init(mq_policy_t *p)
{
    const s_fixed_t *f = p->priv;
    if (f->k == 0) {
        mq_err_set("policy 'fixed' needs a bit width: fixed:K with K in 1..8");
        return -1;
    }
    p->bits = f->k;
    return 0;
}

const mq_policy_ops_t mq_policy_fixed_ops = {
    .name = "fixed",
    .usage = "fixed:K",
    .help = "K bits (1..8) every iteration: the fixed-width baselines",
    .size = sizeof(s_fixed_t),
    .option = s_option,
    .init = s_init,
};
