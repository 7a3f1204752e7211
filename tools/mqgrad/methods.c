/* The experiment's method presets: each compression method of the comparison as the policy,
 * codec and update rule that run it on this parameter server. The papers behind each codec
 * and rule are named in their files (common/src/quant/c_*.c, common/src/ps/optim.c). */
#include "methods.h"

#include <stdio.h>
#include <string.h>

#include "mqgrad/optim.h"
#include "mqgrad/quant.h"
#include "mqgrad/rl.h"
#include "mqgrad/util.h"

typedef struct {
    const char *name, *policy, *codec, *optimizer, *help;
} s_preset_t;

/* A codec that takes no bit-width runs without an agent; its policy is never asked. */
static const s_preset_t s_presets[] = {
    {"qsgd", "fixed:4", "qsgd:bucket=512", "", "QSGD, 4 bits (sign + 7 levels), a norm per 512"},
    {"dqsgd", "dqsgd", "qsgd:bucket=512", "", "DQ-SGD: the QSGD levels chosen each iteration"},
    {"terngrad", "fixed:2", "terngrad", "", "TernGrad: scaled stochastic ternary"},
    {"topk", "fixed:2", "topk", "", "top-k (1%) with a residual, sparse union sent back"},
    {"dgc", "fixed:2", "dgc", "", "DGC: top-k with momentum correction and masking"},
    {"efsign", "fixed:2", "sign", "", "EF-signSGD: scaled sign with error feedback"},
    {"onebit", "fixed:2", "onebit", "", "1-bit SGD: two means per bucket, error feedback"},
    {"qcmd", "fixed:2", "thresh", "qcmd", "QCMD adagrad: threshold quantizer, l1 mirror descent"},
    {"qrda", "fixed:2", "thresh", "qrda", "QRDA adagrad: threshold quantizer, l1 dual averaging"},
    {"sdagc", "fixed:2", "sdagc", "", "SDAGC: per-layer std threshold, residual, momentum"},
};
#define S_NPRESETS (sizeof s_presets / sizeof s_presets[0])

void mq_method_help(char *buf, size_t len)
{
    size_t w = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < S_NPRESETS; i++)
        mq_help_line(buf, len, &w, 10, s_presets[i].name, s_presets[i].help);
}

static int s_check(const mq_method_t *m, const char *method)
{
    char why[256];
    mq_codec_t c;
    mq_optim_t o;
    if (m->codec[0] && mq_codec_parse(m->codec, &c) != 0)
        goto bad;
    if (m->optimizer[0] && mq_optim_parse(m->optimizer, &o) != 0)
        goto bad;
    if (m->exact && m->codec[0] && c.id != MQ_CODEC_ID_uniform) {
        mq_err_set("'%s': +exact is the paper-exact uniform codec, not %s", method, m->codec);
        return -1;
    }
    if (strcmp(m->policy, "none") == 0) {
        if (m->exact || m->codec[0]) {
            mq_err_set("'%s': fp32 (none) has no codec", method);
            return -1;
        }
        return 0;
    }
    mq_policy_opts_t po;
    mq_policy_opts_default(&po);
    mq_policy_t *p = mq_policy_new(m->policy, &po);
    if (!p)
        goto bad;
    mq_policy_destroy(&p);
    return 0;
bad:
    snprintf(why, sizeof why, "%s", mq_err_last());
    mq_err_set("method '%s': %s", method, why);
    return -1;
}

int mq_method_resolve(const char *method, mq_method_t *out)
{
    char buf[256];
    mq_method_t m;
    memset(&m, 0, sizeof m);
    if (strlen(method) >= sizeof buf) {
        mq_err_set("method '%.32s...' is too long", method);
        return -1;
    }
    strcpy(buf, method);
    size_t n = strlen(buf), k = strlen("+exact");
    if (n > k && strcmp(buf + n - k, "+exact") == 0) {
        m.exact = true;
        buf[n - k] = 0;
    }
    for (size_t i = 0; i < S_NPRESETS; i++)
        if (strcmp(buf, s_presets[i].name) == 0) {
            snprintf(m.policy, sizeof m.policy, "%s", s_presets[i].policy);
            snprintf(m.codec, sizeof m.codec, "%s", s_presets[i].codec);
            snprintf(m.optimizer, sizeof m.optimizer, "%s", s_presets[i].optimizer);
            goto check;
        }
    char *slash = strchr(buf, '/'), *at = strchr(buf, '@');
    if (slash) {
        *slash = 0;
        snprintf(m.optimizer, sizeof m.optimizer, "%s", slash + 1);
    }
    if (at) {
        *at = 0;
        snprintf(m.codec, sizeof m.codec, "%s", at + 1);
    }
    snprintf(m.policy, sizeof m.policy, "%s", buf);
    if (!m.policy[0]) {
        mq_err_set("method '%s': no policy before '@'", method);
        return -1;
    }
check:
    if (s_check(&m, method) != 0)
        return -1;
    *out = m;
    return 0;
}
