/* Gradient codecs as plug-ins: one operations table per codec, registered in one place
 * (common/src/quant/registry.c). Nothing here knows about sockets; the wire carries a codec
 * as (id, bits, an opaque parameter block) and its payload as bytes.
 *
 * A codec is described by mq_codec_t: its registry id, the controller's level (`bits`, for
 * the codecs that take one) and up to MQ_CODEC_NPARAMS 32-bit parameter words whose meaning
 * only the codec's own file knows (a float travels as its bit pattern). Specs are strings:
 *
 *     NAME[:K][:OPTION...]       e.g. "uniform:4:bucket=512", "qsgd:3", "topk:ratio=0.01"
 *
 * where K is the level (bits per value) of a codec that takes one; without K the level is
 * left to the controller (0 here, set per iteration by mq_codec_with_bits).
 *
 * Adding a codec: one file, common/src/quant/c_<name>.c, defining
 * `const mq_codec_ops_t mq_codec_<name>_ops`, and one line in mqgrad/codecs.def. Payloads may have any size up to ops->max_size; the codec alone validates its
 * payloads (mq_codec_validate_payload), once per received payload. */
#ifndef MQGRAD_QUANT_H
#define MQGRAD_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mqgrad/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registry ids, MQ_CODEC_ID_<name>, from mqgrad/codecs.def. On the wire: never reused. */
enum {
#define MQ_CODEC_DEF(name, id) MQ_CODEC_ID_##name = id,
#include "mqgrad/codecs.def"
#undef MQ_CODEC_DEF
};

#define MQ_QUANT_MIN_BITS 1
#define MQ_QUANT_MAX_BITS 8
#define MQ_CODEC_NPARAMS 6
#define MQ_CODEC_MAX_SPEC 128

typedef struct {
    uint32_t id;                      /* registry id, as on the wire */
    int bits;                         /* level: 1..8 for codecs that take one, else 0; 32 = none */
    uint32_t param[MQ_CODEC_NPARAMS]; /* the codec's own; unused words are 0 */
} mq_codec_t;

/* What a payload decodes to, for a controller that compares a gradient's norm after
 * quantization with its norm before. Filled by the codec calls that take one. */
typedef struct {
    double sq; /* sum of the squares of the decoded values x^_i, before any decode scale */
} mq_codec_stats_t;

/* What an encode may use besides its input. */
typedef struct {
    mq_rng_t *rng; /* stochastic codecs; NULL for the others */
    float *state;  /* ops->state_floats(c, n) floats, zero at the start of training and kept
                    * between iterations by the caller (residuals, momentum); NULL when the
                    * codec keeps none */
    float lr;      /* the learning rate this iteration's update is applied with (0 = unknown):
                    * codecs that keep a residual across a change of lr rescale it */
    float *clear;  /* NULL, or the encode's SRC itself: the caller's next values add onto the
                    * array (autograd's accumulation), so it wants SRC zero once encoded.
                    * mq_codec_encode_resolved does it; a codec whose ops->clears is set
                    * zeroes each stretch right after reading it, while it is in cache */
} mq_codec_ctx_t;

typedef struct mq_codec_ops {
    const char *name;  /* spec name */
    uint32_t id;       /* MQ_CODEC_* */
    const char *usage; /* spec syntax, e.g. "topk[:ratio=R]" */
    const char *help;  /* one line: what it is, whose method */
    int min_bits, max_bits; /* the level range it takes; 0, 0 = it takes none */
    bool unbiased;     /* E[decode(encode(x))] = x for stateless use (tests check it) */
    bool exact_size;   /* every payload is exactly max_size bytes */
    bool clears;       /* its encode honours ctx->clear (else the values are zeroed after) */
    /* Sets C's parameter words to the defaults (may be NULL: all zero). */
    void (*defaults)(mq_codec_t *c);
    /* Applies one ':'-separated option ("key=value" or a flag) to C; -1 with an error. */
    int (*option)(mq_codec_t *c, const char *opt);
    /* Writes C's options as ":opt..." (what option reads back; "" when all are defaults). */
    void (*format)(const mq_codec_t *c, char *buf, size_t len);
    /* 0 if C's parameter words are valid (they may come from the network), else -1. */
    int (*check)(const mq_codec_t *c);
    /* Largest payload for n values (a bound: the wire refuses anything longer). */
    size_t (*max_size)(const mq_codec_t *c, size_t n);
    /* Floats of encoder state for n values (NULL: stateless). */
    size_t (*state_floats)(const mq_codec_t *c, size_t n);
    /* Whether an encode needs ctx->rng (NULL: never). */
    bool (*stochastic)(const mq_codec_t *c);
    /* Encodes src[0..n), n > 0, into dst (which holds max_size bytes); refuses a non-finite
     * input with an error naming its index. STATS may be NULL. */
    int (*encode)(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                  uint8_t *dst, size_t *len, mq_codec_stats_t *stats);
    /* 0 if src[0..len) is a payload this codec could have written for n > 0 values (length,
     * headers, indices in range, finite values), else -1 with an error. */
    int (*validate)(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n);
    /* dst[i] (+)= scale * x^_i for a validated payload. STATS may be NULL. */
    void (*decode)(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                   float scale, bool acc, mq_codec_stats_t *stats);
    /* The codec a server re-encodes the mean with (NULL: C itself). A method whose mean cannot
     * be written in its own format (the union of sparse pushes) names the one that can. */
    void (*reply)(const mq_codec_t *c, mq_codec_t *out);
    /* Error feedback in the codec's own walk, for a stateless codec (NULL: mq_codec_encode_ef
     * adds, encodes and decodes with scale -1 into the residual, one pass each): encodes
     * v = src + residual, n > 0, into dst and leaves residual = v - decode(dst), bit for bit
     * what that generic path leaves; a v that is not finite fails it with the generic path's
     * error, residual in any state (mq_codec_encode_ef then sets it to zero). SRC NULL: in
     * place, residual holds v already (mq_codec_encode_ef_inplace). The arguments are checked
     * as for encode. */
    int (*encode_ef)(const mq_codec_t *c, const float *src, float *residual, size_t n,
                     const mq_codec_ctx_t *ctx, uint8_t *dst, size_t *len,
                     mq_codec_stats_t *stats);
} mq_codec_ops_t;

/* ---- the registry ------------------------------------------------------------------- */

/* The codec registered under ID, or NULL. */
const mq_codec_ops_t *mq_codec_lookup(uint32_t id);
/* The codec named NAME, or NULL. */
const mq_codec_ops_t *mq_codec_by_name(const char *name);
/* The registered codecs, in id order; *N gets how many. */
const mq_codec_ops_t *const *mq_codec_all(size_t *n);
/* C's operations (NULL for an unknown id). */
static inline const mq_codec_ops_t *mq_codec_ops(const mq_codec_t *c)
{
    return c ? mq_codec_lookup(c->id) : NULL;
}
/* Writes one line per codec, "  usage  help", for a --help text. */
void mq_codec_help(char *buf, size_t len);

/* ---- specs and parameters ------------------------------------------------------------ */

/* Checks that C is a registered codec with valid parameters, and a level in its range (or
 * 0 when it takes none); sets an error otherwise. */
int mq_codec_validate(const mq_codec_t *c);
/* The same, except that a codec taking a level may have none yet (bits 0): a run's codec
 * before the controller's first decision. */
int mq_codec_validate_base(const mq_codec_t *c);
/* Parses SPEC (see above) into *OUT; -1 with an error naming the bad part, OUT untouched. */
int mq_codec_parse(const char *spec, mq_codec_t *out);
/* Writes a spec that mq_codec_parse reads back to an equal codec. */
void mq_codec_format(const mq_codec_t *c, char *buf, size_t len);
/* True if A and B are the same codec with the same level and parameters. */
bool mq_codec_equal(const mq_codec_t *a, const mq_codec_t *b);
/* True if GOT is WANT. Otherwise false, with "codec GOT, expected WANT" in BUF, each written
 * out with OPS (the run's codec's table, resolved once) when it is that codec, as none when it
 * is none, by its id otherwise: a push's check needs no registry lookup, even to say why. */
bool mq_codec_check(const mq_codec_t *got, const mq_codec_t *want, const mq_codec_ops_t *ops,
                    char *buf, size_t len);
/* BASE at level BITS: 32 gives none (fp32); a codec that takes no level ignores BITS. */
mq_codec_t mq_codec_with_bits(const mq_codec_t *base, int bits);
/* What a server re-encodes a mean of C-encoded pushes with. */
mq_codec_t mq_codec_reply(const mq_codec_t *c);
/* Shorthands. */
mq_codec_t mq_codec_none(void);
extern const mq_codec_ops_t mq_codec_none_ops; /* its table */
mq_codec_t mq_codec_uniform(int bits, uint32_t bucket, bool stochastic);
/* The parameter word I of C as a float / set from a float. */
float mq_codec_param_f(const mq_codec_t *c, int i);
void mq_codec_set_param_f(mq_codec_t *c, int i, float v);

/* Largest payload for n values; 0 for an invalid codec. For the codecs with exact_size this
 * is every payload's size. */
size_t mq_codec_payload_size(const mq_codec_t *c, size_t n);
/* The uniform codec's number of ranges for n values (0 for other codecs and n = 0). */
size_t mq_codec_nbuckets(const mq_codec_t *c, size_t n);
/* Floats of encoder state for n values (0 for stateless codecs). */
size_t mq_codec_state_floats(const mq_codec_t *c, size_t n);

/* Index of the first NaN or infinite value of x[0..n), or n when all are finite: one
 * branch-free pass at memory speed (what every encode checks its input with). */
size_t mq_codec_first_nonfinite(const float *x, size_t n);

/* ---- encode ------------------------------------------------------------------------------ */

/* Encodes src[0..n) into dst (cap bytes, at least mq_codec_payload_size); CTX as above (may
 * be NULL for a stateless, deterministic codec). Refuses non-finite input. Returns 0 and the
 * payload's size in *out_len. STATS, when not NULL, is set to the statistics of the values
 * the payload decodes to. */
int mq_codec_encode_ctx(const mq_codec_t *c, const float *src, size_t n,
                        const mq_codec_ctx_t *ctx, uint8_t *dst, size_t cap, size_t *out_len,
                        mq_codec_stats_t *stats);
/* The same for a stateless codec, with RNG for the stochastic ones. */
int mq_codec_encode(const mq_codec_t *c, const float *src, size_t n, uint8_t *dst, size_t cap,
                    size_t *out_len, mq_rng_t *rng, mq_codec_stats_t *stats);

/* Encodes with error feedback around any stateless codec (1-bit SGD style): encodes
 * v = src + residual and leaves residual = v - decode(encode(v)). residual has n values,
 * zero at the start of training. A bad argument fails it with residual as it was; a v that
 * is not finite fails it with residual set to zero: error feedback starts over, as no
 * residual can stand for a payload that is not sent (and keeping the old one would cost
 * every encode a read-only pass over both arrays before the first store). With
 * uniform:1:stochastic it rounds to nearest instead (stochastic 1-bit feedback diverges)
 * and warns once. */
int mq_codec_encode_ef(const mq_codec_t *c, const float *src, float *residual, size_t n,
                       uint8_t *dst, size_t cap, size_t *out_len, mq_rng_t *rng,
                       mq_codec_stats_t *stats);
/* The same where the producer of the gradient has already added it to the residual: V holds
 * gradient + residual, and is left holding the new residual, v - decode(encode(v)) (the same
 * codes and residual as mq_codec_encode_ef with those sums). One read and one write a value,
 * where the two arrays take two reads and a write; a worker's model adds its gradient onto
 * the residual as it computes it (mq_model_set_accumulate). Failures as above. */
int mq_codec_encode_ef_inplace(const mq_codec_t *c, float *v, size_t n, uint8_t *dst, size_t cap,
                               size_t *out_len, mq_rng_t *rng, mq_codec_stats_t *stats);

/* ---- a codec resolved once -------------------------------------------------------------
 * Every entry point above checks its codec and looks its table up by id on each call. A
 * caller that encodes one segment with one codec round after round (a segment's coder)
 * resolves it once, when its plan is made, and each round's encode goes straight to the
 * table. */

/* Checks C as mq_codec_validate_base does, and N values as a size encodes take; returns C's
 * table, or NULL with an error. */
const mq_codec_ops_t *mq_codec_resolve(const mq_codec_t *c, size_t n);
/* The encode behind the entry points above, without their checks: OPS is C's table
 * (mq_codec_resolve), C at a level OPS takes, DST holds ops->max_size(C, N) bytes, CTX has
 * the generator a stochastic codec needs and the state (ops->state_floats) a stateful one
 * needs. RESIDUAL NULL: encodes SRC as mq_codec_encode_ctx; else error feedback as
 * mq_codec_encode_ef (SRC NULL: in place, as mq_codec_encode_ef_inplace), for a codec that
 * keeps no state, with the same failures. Returns 0 and the payload's size in *OUT_LEN, or
 * -1 with an error. */
int mq_codec_encode_resolved(const mq_codec_ops_t *ops, const mq_codec_t *c, const float *src,
                             float *residual, size_t n, const mq_codec_ctx_t *ctx, uint8_t *dst,
                             size_t *out_len, mq_codec_stats_t *stats);

/* ---- decode ------------------------------------------------------------------------------ */

/* Whether LEN bytes is a size C's payloads for n values can have (exactly its size for the
 * exact-size codecs, at most its bound for the others); the first check of the next. */
bool mq_codec_size_ok(const mq_codec_t *c, size_t len, size_t n);
/* 0 if src[0..len) is a valid payload of C for n values, else -1 with an error. */
int mq_codec_validate_payload(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n);
/* Decodes a payload already validated by mq_codec_validate_payload: dst[i] = scale * x^_i,
 * or dst[i] += scale * x^_i when accumulate is true. */
void mq_codec_decode_valid(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst,
                           size_t n, float scale, bool accumulate, mq_codec_stats_t *stats);
/* Validate, then decode: -1 with an error (dst untouched) on a bad payload. */
int mq_codec_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                    float scale, bool accumulate, mq_codec_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
