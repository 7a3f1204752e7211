/* The `ladder` codec: one level (1..8) picks one of eight settings from three codec families
 * whose costs differ, so that a controller of the level chooses among families, not only
 * among bit-widths:
 *
 *   level  setting                               payload for n values
 *     1    top-k, k = 0.1 % of the values         sparse (index gaps, values), error feedback
 *     2    top-k, k = 1 %                         sparse, error feedback
 *     3    uniform, 1 bit, a range per 512        n/8 + 8 n/512 bytes, error feedback
 *     4-7  uniform, 2, 3, 4, 8 bits               K n/8 + 8 n/512 bytes, error feedback
 *     8    fp32                                   4 n bytes, exact
 *
 * With a range per 512 values, 2 to 8 uniform bits learn alike per iteration: a bit-width
 * controller then has nothing to trade. Whether the families trade accuracy for bytes is a
 * question of the model and the run; what was measured is in docs/results.md ("Choosing among
 * codecs: the ladder").
 *
 * Spec: ladder (no options; `ladder:reply` is what servers answer with, below). Parameter
 * words: 0 = the reply flag; the others 0.
 * State (n floats, zero at the start): one residual for every rung, what was not sent yet.
 * Top-k keeps it as its own (Stich et al., "Sparsified SGD with Memory", NeurIPS 2018);
 * the uniform and fp32 rungs send gradient + residual and keep what their codes missed
 * (error feedback; Karimireddy et al., "Error Feedback Fixes SignSGD", ICML 2019). So
 * nothing is lost when the level changes: what a sparse rung held back goes with the next
 * denser one.
 * Payload: the rung's own codec's payload, checked and decoded by that codec.
 * Reply: the mean of sparse pushes is the union of their indices, which only an exact
 * sparse vector holds (the `sparse` codec, as top-k's servers answer); a uniform or fp32
 * rung's mean goes back in the rung's own codec. `ladder:reply` at the round's level names
 * that; it keeps no state. */

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "quant_internal.h"
#include "sparse_fmt.h"

#define S_LEVELS 8
#define S_REPLY(c) ((c)->param[0])

typedef struct {
    const mq_codec_ops_t *ops;
    mq_codec_t c;
} s_rung_t;

static s_rung_t s_push[S_LEVELS + 1], s_reply[S_LEVELS + 1]; /* by level, 1..8 */
static pthread_once_t s_once = PTHREAD_ONCE_INIT;

static void s_rung(int level, const mq_codec_ops_t *ops, mq_codec_t c)
{
    s_push[level] = (s_rung_t){.ops = ops, .c = c};
    mq_codec_t r = c;
    if (ops->reply)
        ops->reply(&c, &r);
    s_reply[level] = (s_rung_t){.ops = mq_codec_lookup(r.id), .c = r};
}

#define MQ_CODEC_DEF(name, id) extern const mq_codec_ops_t mq_codec_##name##_ops;
#include "mqgrad/codecs.def"
#undef MQ_CODEC_DEF

static void s_build(void)
{
    static const char *const sparse[2] = {"topk:ratio=0.001", "topk:ratio=0.01"};
    for (int l = 1; l <= 2; l++) {
        mq_codec_t t = {0};
        int rc = mq_codec_parse(sparse[l - 1], &t);
        assert(rc == 0 && "a spec of this file parses");
        (void)rc;
        s_rung(l, &mq_codec_topk_ops, t);
    }
    static const int bits[5] = {1, 2, 3, 4, 8};
    for (int l = 3; l <= 7; l++)
        s_rung(l, &mq_codec_uniform_ops, mq_codec_uniform(bits[l - 3], 512, false));
    s_rung(8, &mq_codec_none_ops, mq_codec_none());
}

/* C's rung: its level's push setting, or the reply to it. */
static const s_rung_t *s_at(const mq_codec_t *c)
{
    pthread_once(&s_once, s_build);
    int l = c->bits >= 1 && c->bits <= S_LEVELS ? c->bits : S_LEVELS;
    return S_REPLY(c) ? &s_reply[l] : &s_push[l];
}

static int s_option(mq_codec_t *c, const char *opt)
{
    if (strcmp(opt, "reply") == 0) {
        S_REPLY(c) = 1;
        return 0;
    }
    mq_err_set("unknown option '%s' (ladder takes none)", opt);
    return -1;
}

static void s_format(const mq_codec_t *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s", S_REPLY(c) ? ":reply" : "");
}

static int s_check(const mq_codec_t *c)
{
    if (S_REPLY(c) > 1) {
        mq_err_set("codec ladder: reply flag %u (expected 0 or 1)", (unsigned)S_REPLY(c));
        return -1;
    }
    return mq_quant_check_unused(c, 1);
}

/* Without a level (a run's codec before its first round), the largest of any level. */
static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    if (c->bits >= 1 && c->bits <= S_LEVELS) {
        const s_rung_t *r = s_at(c);
        return r->ops->max_size(&r->c, n);
    }
    size_t most = 0;
    for (int l = 1; l <= S_LEVELS; l++) {
        mq_codec_t at = *c;
        at.bits = l;
        size_t m = s_max_size(&at, n);
        most = m > most ? m : most;
    }
    return most;
}

static size_t s_state_floats(const mq_codec_t *c, size_t n)
{
    return S_REPLY(c) ? 0 : n;
}

static bool s_stochastic(const mq_codec_t *c)
{
    const s_rung_t *r = s_at(c);
    return r->ops->stochastic && r->ops->stochastic(&r->c);
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *len, mq_codec_stats_t *stats)
{
    const s_rung_t *r = s_at(c);
    if (S_REPLY(c) || r->ops->state_floats) /* a reply, or top-k with its residual as state */
        return mq_codec_encode_resolved(r->ops, &r->c, src, NULL, n, ctx, dst, len, stats);
    /* a stateless rung: error feedback around it, the state as the residual */
    mq_codec_ctx_t plain = {.rng = ctx->rng, .lr = ctx->lr};
    return mq_codec_encode_resolved(r->ops, &r->c, src, ctx->state, n, &plain, dst, len, stats);
}

static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    const s_rung_t *r = s_at(c);
    /* the interface holds a payload to the ladder's bound; a rung of one size, to that size */
    if (r->ops->exact_size && len != r->ops->max_size(&r->c, n)) {
        mq_err_set("ladder:%d (%s): payload of %zu bytes for %zu values (expected %zu)",
                   c->bits, r->ops->name, len, n, r->ops->max_size(&r->c, n));
        return -1;
    }
    return r->ops->validate(&r->c, src, len, n);
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    const s_rung_t *r = s_at(c);
    r->ops->decode(&r->c, src, len, dst, n, scale, acc, stats);
}

static void s_reply_of(const mq_codec_t *c, mq_codec_t *out)
{
    *out = *c;
    S_REPLY(out) = 1;
}

const mq_codec_ops_t mq_codec_ladder_ops = {
    .name = "ladder",
    .id = MQ_CODEC_ID_ladder,
    .usage = "ladder",
    .help = "level 1-8: top-k 0.1 %/1 %, uniform 1/2/3/4/8 bits, fp32 (error feedback)",
    .min_bits = 1,
    .max_bits = S_LEVELS,
    .unbiased = false,
    .exact_size = false,
    .option = s_option,
    .format = s_format,
    .check = s_check,
    .max_size = s_max_size,
    .state_floats = s_state_floats,
    .stochastic = s_stochastic,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
    .reply = s_reply_of,
};
