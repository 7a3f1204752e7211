/* Seeded Gaussian test vectors, shared by the codec tests. */
#ifndef MQGRAD_TEST_GAUSS_H
#define MQGRAD_TEST_GAUSS_H

#include <criterion/criterion.h>
#include <stdlib.h>

#include "mqgrad/util.h"

/* n values mean + sigma * N(0, 1) from seed SEED (malloc'd; never NULL, even for n = 0). */
static inline float *test_gaussian(size_t n, uint64_t seed, float sigma, float mean)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    float *x = malloc((n ? n : 1) * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(mean + sigma * mq_rng_normal(&rng));
    return x;
}

#endif
