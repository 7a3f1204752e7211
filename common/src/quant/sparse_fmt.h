/* Shared by the sparse codecs' files only (sparse, topk, dgc, sdagc): the sparse payload
 * format and its operations, the passes that pick which values a sparsifying codec sends,
 * and the table-driven spec options they all take. The selection passes (mq_sparse_kth to
 * mq_sparse_top_of) are topk's exact top-k and live in c_topk.c; everything else is in
 * c_sparse.c.
 *
 * ---- the payload ------------------------------------------------------------------------
 * Every payload starts with a little-endian u32 LAYOUT tag; the encoder writes whichever of
 * the three layouts is smallest for the values it sends:
 *
 *   0 dense   tag, then all n values as f32                           4 + 4n bytes
 *   1 delta   tag, u32 k, k f32 values, then k index gaps as LEB128    8 + 4k + G bytes
 *   2 bitmap  tag, u32 k, k f32 values, then ceil(n/8) bytes, bit i    8 + 4k + ceil(n/8)
 *             of the map (byte i/8, bit i%8) set for each sent index
 *
 * The values of delta and bitmap are in increasing index order. Delta gaps: the first is the
 * first index, each next one is the index minus the previous index (so >= 1: the indices are
 * strictly increasing); LEB128 = 7 bits a byte, least significant first, high bit set on
 * every byte but the last, at most 5 bytes, and the last byte of a longer one is not 0 (one
 * encoding per gap). Values are finite; bits of the map past n are 0; a payload's length is
 * exactly what its header says.
 * A value the encoder does not send decodes to +0 (so the sign of a zero is not kept).
 *
 * Why these three (see c_sparse.c): at the densities sparsification runs at (0.1%-5%) the
 * gaps of random indices average 1/density, which LEB128 writes in 1-2 bytes where (index,
 * value) pairs spend 4, so delta is smaller than pairs there (measured: bench/README.md).
 * Past ~12% density an index costs a byte either way and the map's n/8 bytes win; past ~97%
 * plain floats do. max_size is 4n + 4, the dense layout. */
#ifndef MQGRAD_SPARSE_FMT_H
#define MQGRAD_SPARSE_FMT_H

#include <math.h>

#include "quant_internal.h"

enum { MQ_SPARSE_DENSE = 0, MQ_SPARSE_DELTA = 1, MQ_SPARSE_BITMAP = 2 };

#define MQ_SPARSE_HDR 8 /* tag + count of the delta and bitmap layouts */
/* Counts and indices are u32: a sparsifying codec takes at most this many values (the sparse
 * codec itself writes a longer vector in the dense layout). */
#define MQ_SPARSE_MAX_N ((size_t)UINT32_MAX)

static inline size_t mq_sparse_max_size(size_t n)
{
    return 4 + 4 * n;
}

/* The magnitude of x as its bit pattern with the sign cleared: for non-negative floats the
 * integer order is the numeric order, which is what the selections below compare. */
static inline uint32_t mq_sparse_mag(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}

/* Bit t set for each t < 8 with magnitude bits of x[t] above CMP: the scans skip a block of
 * eight in one test and then visit only its marked values, so the branches they take follow
 * the selected values, not every value. */
static inline unsigned mq_sparse_mask8(const float *x, int32_t cmp)
{
    const mq_v4i_t mag = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
    const mq_v4i_t c = {cmp, cmp, cmp, cmp}, lo = {1, 2, 4, 8}, hi = {16, 32, 64, 128};
    mq_v4i_t a, b;
    memcpy(&a, x, sizeof a);
    memcpy(&b, x + 4, sizeof b);
    mq_v4i_t bits = (((a & mag) > c) & lo) | (((b & mag) > c) & hi);
    return (unsigned)(bits[0] | bits[1] | bits[2] | bits[3]);
}

/* ---- payloads ------------------------------------------------------------------------- */

/* The payload operations every sparse codec's table names (C is the codec):
 * mq_sparse_payload_max is its max_size; mq_sparse_validate returns 0 if src[0..len) is a
 * valid sparse payload for n > 0 values, else -1 with an error that starts with the codec's
 * name; mq_sparse_decode does dst[i] (+)= scale * x^_i for a validated payload, and STATS
 * (may be NULL) gets the decoded sum of squares, in the same order as the encoder's. */
size_t mq_sparse_payload_max(const mq_codec_t *c, size_t n);
int mq_sparse_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n);
void mq_sparse_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                      float scale, bool acc, mq_codec_stats_t *stats);

/* ---- selection: which values a sparsifying codec sends --------------------------------
 * A selection sends every value whose magnitude bits exceed THR, plus the first TAKE_EQ (in
 * index order) equal to THR; never a zero. COUNT is how many that is. */
typedef struct {
    uint32_t thr;
    size_t take_eq;
    size_t count;
} mq_sparse_sel_t;

/* The K-th largest (1 <= K <= M) of the magnitude bits a[0..m), by a three-level radix
 * select (11, 11 and 9 bits): O(m), no sort. *ABOVE gets how many are larger. Reorders and
 * overwrites a. */
uint32_t mq_sparse_kth(uint32_t *a, size_t m, size_t k, size_t *above);
/* How many magnitudes of x[0..n) exceed THR; *MAX gets the largest magnitude. */
size_t mq_sparse_count_above(const float *x, size_t n, uint32_t thr, uint32_t *max);

/* Candidates: the values of a vector with magnitude >= LO, their magnitudes in MAGS (the
 * first half of the payload buffer, n/2 u32) and their indices in IDX (its second half); M
 * is how many there are, all kept when M <= CAP. No allocation: the payload buffer is free
 * until the payload is written. MAGS also holds a sample before a gather. */
typedef struct {
    uint32_t *mags, *idx;
    size_t cap, m;
    uint32_t lo;
} mq_sparse_cand_t;

/* Candidates in DST, a payload buffer for n values (mq_sparse_max_size(n) bytes). */
void mq_sparse_cand_init(mq_sparse_cand_t *c, uint8_t *dst, size_t n);
/* Makes the values of x[0..n) with magnitude >= LO the candidates (one read pass). */
void mq_sparse_gather(mq_sparse_cand_t *c, const float *x, size_t n, uint32_t lo);

/* A sample of the magnitudes of x[0..n) into OUT: one value in each of NS strata of
 * floor(n/ns) values, at a uniform random position with RNG, in the middle without
 * (deterministic). Taken in index order, so while x is being computed, chunk by chunk, and
 * without a random access to memory: call mq_sparse_sample_upto(s, x, end) once x[0..end)
 * is final. */
typedef struct {
    mq_rng_t *rng;
    uint32_t *out;
    size_t ns, stride, j, next;
} mq_sparse_sampler_t;

void mq_sparse_sampler_init(mq_sparse_sampler_t *s, mq_rng_t *rng, size_t n, size_t ns,
                            uint32_t *out);
void mq_sparse_sample_upto(mq_sparse_sampler_t *s, const float *x, size_t end);

/* How many values mq_sparse_top wants sampled to find the K largest of N fast: about 64
 * above the k-th, at least 4096, at most n/8 (all of a vector under 8192). */
size_t mq_sparse_top_samples(size_t n, size_t k);
/* The selection that sends exactly the K largest magnitudes of x[0..n) (all its nonzeros if
 * it has fewer), ties at the threshold to the lowest indices. c->mags holds NS sampled
 * magnitudes of x: they give a bound below the k-th largest, the values above it become
 * the candidates and a radix select finishes on those: one read pass over x whatever the
 * sample. When the bound fails (an unlucky sample, or values arranged against its stride),
 * a histogram pass gives one. */
mq_sparse_sel_t mq_sparse_top(const float *x, size_t n, size_t k, mq_sparse_cand_t *c, size_t ns);
/* The selection of the K largest among C's candidates (C->M >= K). */
mq_sparse_sel_t mq_sparse_top_of(mq_sparse_cand_t *c, const float *x, size_t n, size_t k);
/* Writes the payload of the values SEL picks from v[0..n) to dst, in the smallest layout,
 * and zeroes what it sent in v (and in u, when not NULL: momentum factor masking). C (may
 * be NULL) holds candidates that include every value SEL picks: then only they are visited,
 * else all of v is scanned. Returns the payload's length; STATS (may be NULL) gets its sum
 * of squares. */
size_t mq_sparse_emit(float *v, float *u, size_t n, const mq_sparse_sel_t *sel,
                      const mq_sparse_cand_t *c, uint8_t *dst, mq_codec_stats_t *stats);
/* Aligned u32 scratch inside a payload buffer of mq_sparse_max_size(n) bytes: room for n. */
static inline uint32_t *mq_sparse_scratch(uint8_t *dst)
{
    return (uint32_t *)(((uintptr_t)dst + 3) & ~(uintptr_t)3);
}

/* How many of n values a fraction X of them is: ceil(x * n) within float precision of X
 * (ratio=0.1 of 1000 values is 100, not 101), at least 1 and at most n. */
static inline size_t mq_sparse_count(float x, size_t n)
{
    double p = (double)x * (double)n, k = ceil(p - p * 0x1p-23);
    return k < 1.0 ? 1 : k > (double)n ? n : (size_t)k;
}

/* ---- what dgc and sdagc share ----------------------------------------------------------- */

/* Refuses a non-finite gradient (the error names WHO and the index) and sets *SCALE to the
 * factor that clips its L2 norm to CLIP (1 when CLIP is 0 or the norm is within it). */
int mq_sparse_clip_scale(const char *who, const float *g, size_t n, float clip, float *scale);
/* Refuses a segment longer than the sparse format's u32 counts (error names WHO). */
int mq_sparse_check_n(const char *who, size_t n);

/* ---- spec options -----------------------------------------------------------------------
 * A codec's options as a table: each KEY=value is a float kept in parameter word WORD, in
 * [lo, hi] (open at an end when lo_open / hi_open), an integer when INTEGRAL. Unlisted
 * words must be 0. */
typedef struct {
    const char *key;
    int word;
    float def, lo, hi;
    bool lo_open, hi_open, integral;
} mq_sparse_param_t;

typedef struct {
    const char *codec;
    const mq_sparse_param_t *p;
    size_t np;
} mq_sparse_spec_t;

void mq_sparse_defaults(const mq_sparse_spec_t *s, mq_codec_t *c);
int mq_sparse_option(const mq_sparse_spec_t *s, mq_codec_t *c, const char *opt);
/* ":key=value" for each option that is not its default, with the fewest digits that read
 * back to the same float. */
void mq_sparse_format(const mq_sparse_spec_t *s, const mq_codec_t *c, char *buf, size_t len);
int mq_sparse_check(const mq_sparse_spec_t *s, const mq_codec_t *c);
/* The reply of every sparsifying codec: the sparse codec (exact union of the pushes). */
void mq_sparse_reply(const mq_codec_t *c, mq_codec_t *out);

/* What the operations tables of topk, dgc and sdagc have in common. In a codec's file,
 * MQ_SPARSE_SPEC_FUNCTIONS(spec) defines its spec operations (s_defaults, s_option, s_format
 * and s_check) on its options table SPEC, and MQ_SPARSE_SHARED_OPS, in its table, names them
 * with the sparse payload's operations and reply; the file adds name, id, usage, help,
 * state_floats, stochastic (if any) and encode. */
#define MQ_SPARSE_SPEC_FUNCTIONS(spec)                                                         \
    static void s_defaults(mq_codec_t *c)                                                      \
    {                                                                                          \
        mq_sparse_defaults(&(spec), c);                                                        \
    }                                                                                          \
    static int s_option(mq_codec_t *c, const char *opt)                                        \
    {                                                                                          \
        return mq_sparse_option(&(spec), c, opt);                                              \
    }                                                                                          \
    static void s_format(const mq_codec_t *c, char *buf, size_t len)                           \
    {                                                                                          \
        mq_sparse_format(&(spec), c, buf, len);                                                \
    }                                                                                          \
    static int s_check(const mq_codec_t *c)                                                    \
    {                                                                                          \
        return mq_sparse_check(&(spec), c);                                                    \
    }

#define MQ_SPARSE_SHARED_OPS                                                                   \
    .unbiased = false, .exact_size = false, .defaults = s_defaults, .option = s_option,        \
    .format = s_format, .check = s_check, .max_size = mq_sparse_payload_max,                   \
    .validate = mq_sparse_validate, .decode = mq_sparse_decode, .reply = mq_sparse_reply

#endif
