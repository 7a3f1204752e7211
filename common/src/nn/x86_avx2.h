/* AVX2 helpers the model's x86 kernels share (fc_x86.c, conv_x86.c). x86-64 with GCC or
 * clang only; each function carries its target, so a file built for baseline x86-64 can call
 * it from its own AVX2 functions. */
#ifndef MQGRAD_NN_X86_AVX2_H
#define MQGRAD_NN_X86_AVX2_H

#include <immintrin.h>

#define MQ_AVX2 __attribute__((target("avx2")))

/* The lanes of a vector of 8 floats that LEFT values fill: all ones there, zero elsewhere
 * (none when LEFT <= 0). */
MQ_AVX2 static inline __m256i mq_lanes8(int left)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The lanes whose bit is set in the low 8 bits of BITS (bit j: lane j): all ones there, zero
 * elsewhere. */
MQ_AVX2 static inline __m256i mq_bits8(unsigned bits)
{
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)(bits & 0xffu)), bit), bit);
}

/* LEFT floats from P (all 8 when LEFT >= 8), the others zero. The masked load (VMASKMOVPS,
 * slow on AMD's cores) only at an edge, where a full load would run past the data. */
MQ_AVX2 static inline __m256 mq_load8(const float *p, int left)
{
    return left >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mq_lanes8(left));
}

#endif
