/* The policy registry: every bit-width policy this build knows, one line each in
 * policies.def, in the order help texts list them. Adding a policy is its file (defining
 * `const mq_policy_ops_t mq_policy_<name>_ops`, see rl_internal.h) plus its line there: the
 * registry idiom of the codecs (mqgrad/codecs.def) and the update rules (optims.def). */
#include "rl_internal.h"

#include <stdio.h>
#include <string.h>

#define MQ_POLICY_DEF(name) extern const mq_policy_ops_t mq_policy_##name##_ops;
#include "policies.def"
#undef MQ_POLICY_DEF

static const mq_policy_ops_t *const s_policies[] = {
#define MQ_POLICY_DEF(name) &mq_policy_##name##_ops,
#include "policies.def"
#undef MQ_POLICY_DEF
};
#define S_NPOLICIES (sizeof s_policies / sizeof s_policies[0])

const mq_policy_ops_t *const *mq_rl_policies(size_t *n)
{
    *n = S_NPOLICIES;
    return s_policies;
}

const mq_policy_ops_t *mq_rl_policy_by_name(const char *name)
{
    for (size_t i = 0; name && i < S_NPOLICIES; i++)
        if (strcmp(s_policies[i]->name, name) == 0)
            return s_policies[i];
    return NULL;
}

/* Appends to BUF[*W..LEN) what snprintf would, keeping *W at the end of what fits. */
static void s_add(char *buf, size_t len, size_t *w, const char *fmt, const char *a,
                  const char *b)
{
    if (*w >= len)
        return;
    int k = snprintf(buf + *w, len - *w, fmt, a, b);
    if (k < 0)
        return;
    *w = *w + (size_t)k < len ? *w + (size_t)k : len - 1;
}

/* Contract: see rl.h. */
void mq_policy_help(char *buf, size_t len)
{
    size_t w = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < S_NPOLICIES; i++)
        mq_help_line(buf, len, &w, 26, s_policies[i]->usage, s_policies[i]->help);
}

/* Contract: see rl.h. The short form is the usage up to its first '[' (optional part). */
void mq_policy_names(char *buf, size_t len, const char *sep)
{
    size_t w = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < S_NPOLICIES; i++) {
        char name[64];
        const char *u = s_policies[i]->usage;
        size_t n = strcspn(u, "[");
        snprintf(name, sizeof name, "%.*s", (int)n, u);
        s_add(buf, len, &w, "%s%s", i ? sep : "", name);
    }
}
