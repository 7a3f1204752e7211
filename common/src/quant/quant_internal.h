/* Shared between the quant module's files only (not installed, not part of the public API):
 * the uniform codec's kernels and the finiteness scan every codec uses on its input. */
#ifndef MQGRAD_QUANT_INTERNAL_H
#define MQGRAD_QUANT_INTERNAL_H

#include <string.h>

#include "mqgrad/quant.h"

/* Four-lane vectors (GCC/Clang extensions) for the loops GCC's -O2 will not vectorize on its
 * own: at -O2 it keeps array accumulators in memory and skips selects and widenings. */
typedef float mq_v4f_t __attribute__((vector_size(16)));
typedef int32_t mq_v4i_t __attribute__((vector_size(16)));

static inline mq_v4f_t mq_v4f_load(const float *p)
{
    mq_v4f_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline mq_v4f_t mq_v4f_set1(float x)
{
    return (mq_v4f_t){x, x, x, x};
}

/* Lane-wise m ? a : b for a mask m of all-ones / all-zeros lanes. */
static inline mq_v4f_t mq_v4f_select(mq_v4i_t m, mq_v4f_t a, mq_v4f_t b)
{
    return (mq_v4f_t)(((mq_v4i_t)a & m) | ((mq_v4i_t)b & ~m));
}

/* Largest tensor the codecs accept: keeps n*32 bits and 8*nbuckets inside size_t. */
#define MQ_QUANT_MAX_N (SIZE_MAX / 64)

/* Index of the first value of x[0..n) that is NaN or infinite, or n if all are finite.
 * The common all-finite case is one branch-free (vectorizable) pass. */
size_t mq_quant_first_nonfinite(const float *x, size_t n);

/* Same for a + b element-wise (the error-feedback input), without storing the sum. */
size_t mq_quant_first_nonfinite_sum(const float *a, const float *b, size_t n);

/* The uniform codec. The caller (codec.c) has validated C, checked that dst holds
 * mq_codec_payload_size(c, n) bytes, that rng is set when c->stochastic, and that n > 0.
 * Encode fails only on non-finite input (error names the index); decode only on a bad
 * range header, and then before writing to dst. */
int mq_quant_uniform_encode(const mq_codec_t *c, const float *src, size_t n, uint8_t *dst,
                            mq_rng_t *rng);
int mq_quant_uniform_decode(const mq_codec_t *c, const uint8_t *src, float *dst, size_t n,
                            float scale, bool accumulate);

#endif
