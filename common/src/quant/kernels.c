/* The uniform codec's inner loops, in kernel sets chosen once at run time: portable C (the
 * reference), SSE2 (the x86-64 baseline), AVX2, and two AVX-512 sets, on 256-bit and on
 * 512-bit registers (kernels_x86.h), when the CPU has them. Every path does the same IEEE
 * single-precision operations in the same order per value, with no FMA, so a payload and its
 * decode are bit-identical whichever path ran; test_quant checks that. The vector loops do the
 * bulk and hand leftovers to the portable code. */

#include <string.h>

#include "quant_internal.h"

#if defined(__x86_64__) && defined(__SSE2__)
#define S_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define S_X86 0
#endif

/* ---- portable reference ------------------------------------------------------------------*/

static bool s_minmax_c(const float *x, size_t n, float *lo, float *hi)
{
    float l = x[0], h = x[0], c = 0.0f;
    for (size_t i = 0; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
        c += x[i] - x[i]; /* +0 for finite values, NaN otherwise */
    }
    *lo = l;
    *hi = h;
    return c == 0.0f && l - l == 0.0f && h - h == 0.0f;
}

static void s_pack_c(const uint8_t *q, size_t n, uint8_t *dst, size_t avail, int K);

/* The codes q[0..n) packed to PK (the kernels' PK: K < 8 bits, K from the top code), when
 * given: the portable and SSE2 builds pack after their loops. */
#define S_PACK_AFTER(suffix)                                                                       \
    static void s_pack_after_##suffix(const uint8_t *q, size_t n, float top, uint8_t *pk)          \
    {                                                                                              \
        if (pk) {                                                                                  \
            const int K = mq_quant_bits_of((uint32_t)top);                                         \
            s_pack_##suffix(q, n, pk, mq_quant_code_bytes(n, K), K);                               \
        }                                                                                          \
    }

S_PACK_AFTER(c)

/* q = trunc(min((x - lo) * inv + r, top)), r = 0.5 (nearest) or a uniform in [0, 1). The
 * float clamp equals clamping the integer: both give top once y >= top. */
static void s_quantize_c(const float *x, size_t n, float lo, float inv, float top,
                         const float *noise, uint8_t *q, uint8_t *pk)
{
    for (size_t i = 0; i < n; i++) {
        float y = (x[i] - lo) * inv + (noise ? noise[i] : 0.5f);
        q[i] = (uint8_t)(int)(y < top ? y : top);
    }
    s_pack_after_c(q, n, top, pk);
}

/* Eight xoshiro128** generators, lane j giving every eighth value. */
static void s_noise_step_c(mq_quant_noise_t *g, uint32_t r[8])
{
    for (int j = 0; j < 8; j++) {
        uint32_t s0 = g->s[0][j], s1 = g->s[1][j], s2 = g->s[2][j], s3 = g->s[3][j];
        uint32_t x = s1 * 5;
        r[j] = ((x << 7) | (x >> 25)) * 9;
        uint32_t t = s1 << 9;
        s2 ^= s0;
        s3 ^= s1;
        s1 ^= s2;
        s0 ^= s3;
        s2 ^= t;
        s3 = (s3 << 11) | (s3 >> 21);
        g->s[0][j] = s0;
        g->s[1][j] = s1;
        g->s[2][j] = s2;
        g->s[3][j] = s3;
    }
}

/* Each 32-bit output gives two 16-bit uniforms: lane j's low half is value j of a group of
 * 16, its high half value 8 + j. Sixteen bits are all stochastic rounding can use at 8 bits
 * (y + u is a float below 256), and half the generator steps are half its cost. */
static void s_noise_c(mq_quant_noise_t *g, float *u, size_t n)
{
    uint32_t r[8];
    for (size_t i = 0; i < n; i += 16) {
        s_noise_step_c(g, r);
        for (size_t j = 0; j < 16 && i + j < n; j++)
            u[i + j] = (float)(int32_t)(j < 8 ? r[j] & 0xffff : r[j - 8] >> 16) * 0x1.0p-16f;
    }
}

/* Stochastic quantize with the noise made as it goes: the same codes as noise() for n
 * values followed by quantize() with them, and the same generator steps (ceil(n / 16)). The
 * portable and SSE2 builds stage the noise a block at a time; AVX2 keeps it in registers. */
#define S_NOISE_BLOCK 256 /* a multiple of 16: every block but the last uses whole steps */

#define S_QUANTIZE_NOISE_STAGED(suffix)                                                            \
    static void s_quantize_noise_##suffix(const float *x, size_t n, float lo, float inv,           \
                                          float top, mq_quant_noise_t *g, uint8_t *q, uint8_t *pk) \
    {                                                                                              \
        float u[S_NOISE_BLOCK];                                                                    \
        for (size_t i = 0; i < n; i += S_NOISE_BLOCK) {                                            \
            size_t m = n - i < S_NOISE_BLOCK ? n - i : S_NOISE_BLOCK;                              \
            s_noise_##suffix(g, u, m);                                                             \
            s_quantize_##suffix(x + i, m, lo, inv, top, u, q + i, NULL);                           \
        }                                                                                          \
        s_pack_after_##suffix(q, n, top, pk);                                                      \
    }

S_QUANTIZE_NOISE_STAGED(c)

/* Min and max of a[i] + b[i] (rounded to float, as the sum an encode would store), n > 0;
 * false if a sum is NaN or infinite. */
static bool s_minmax_sum_c(const float *a, const float *b, size_t n, float *lo, float *hi)
{
    float l = a[0] + b[0], h = l, c = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float v = a[i] + b[i];
        l = v < l ? v : l;
        h = v > h ? v : h;
        c += v - v;
    }
    *lo = l;
    *hi = h;
    return c == 0.0f && l - l == 0.0f && h - h == 0.0f;
}

/* dst[i] += src[i]. */
static void s_add_c(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

static void s_dequantize_c(const uint8_t *q, size_t n, const mq_quant_deq_t *d, bool acc,
                           float *dst);

/* The portable and SSE2 builds compose the three kernels a block at a time (the block stays
 * in L1 between them), then pack; AVX2 fuses them. */
#define S_QUANTIZE_EF(suffix)                                                                      \
    static void s_quantize_ef_##suffix(const float *g, float *r, size_t n, float lo, float inv,    \
                                       float top, const mq_quant_deq_t *d, mq_quant_noise_t *gen,  \
                                       uint8_t *q, uint8_t *pk)                                    \
    {                                                                                              \
        for (size_t i = 0; i < n; i += S_NOISE_BLOCK) {                                            \
            size_t m = n - i < S_NOISE_BLOCK ? n - i : S_NOISE_BLOCK;                              \
            if (g)                                                                                 \
                s_add_##suffix(r + i, g + i, m);                                                   \
            if (gen)                                                                               \
                s_quantize_noise_##suffix(r + i, m, lo, inv, top, gen, q + i, NULL);               \
            else                                                                                   \
                s_quantize_##suffix(r + i, m, lo, inv, top, NULL, q + i, NULL);                    \
            s_dequantize_##suffix(q + i, m, d, true, r + i);                                       \
        }                                                                                          \
        s_pack_after_##suffix(q, n, (float)d->levels, pk);                                         \
    }

S_QUANTIZE_EF(c)

/* The portable and SSE2 builds run the two kernels one after the other; AVX2 interleaves
 * them. */
#define S_QUANTIZE_EF_SCAN(suffix)                                                                 \
    static bool s_quantize_ef_scan_##suffix(                                                       \
        const float *g, float *r, size_t n, float lo, float inv, float top,                        \
        const mq_quant_deq_t *d, mq_quant_noise_t *gen, uint8_t *q, uint8_t *pk, const float *na,  \
        const float *nb, size_t nn, float *nlo, float *nhi)                                        \
    {                                                                                              \
        s_quantize_ef_##suffix(g, r, n, lo, inv, top, d, gen, q, pk);                              \
        return nb ? s_minmax_sum_##suffix(na, nb, nn, nlo, nhi)                                    \
                  : s_minmax_##suffix(na, nn, nlo, nhi);                                           \
    }

S_QUANTIZE_EF_SCAN(c)

/* 64-bit little-endian loads and stores whatever the host order. */
static inline uint64_t s_load64(const uint8_t *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static inline void s_store64(uint8_t *p, uint64_t w)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    memcpy(p, &w, 8);
}

#define S_L16 0x00ff00ff00ff00ffull
#define S_L32 0x0000ffff0000ffffull

/* Eight codes (one per byte, each < 2^K) merged into 8K bits: pairs, quads, halves. */
static inline uint64_t s_merge8(uint64_t w, int K)
{
    w = (w & S_L16) | ((w >> 8) & S_L16) << K;
    w = (w & S_L32) | ((w >> 16) & S_L32) << (2 * K);
    return (w & 0xffffffffull) | (w >> 32) << (4 * K);
}

/* The inverse: 8K bits back into one code per byte. */
static inline uint64_t s_split8(uint64_t w, int K)
{
    const uint64_t m4 = (1ull << (4 * K)) - 1, m2 = ((1ull << (2 * K)) - 1) * 0x100000001ull,
                   m1 = ((1ull << K) - 1) * 0x0001000100010001ull;
    w = (w & m4) | ((w >> (4 * K)) & m4) << 32;
    w = (w & m2) | ((w >> (2 * K)) & m2) << 16;
    return (w & m1) | ((w >> K) & m1) << 8;
}

/* Packs q[0..n) into ceil(n*K/8) bytes at dst, K < 8. AVAIL is how many payload bytes start
 * at dst: while 8 remain a group stores a whole word and the next overwrites the spill. */
static void s_pack_c(const uint8_t *q, size_t n, uint8_t *dst, size_t avail, int K)
{
    size_t g = 0;
    for (; g + 8 <= n && avail >= 8; g += 8, dst += K, avail -= (size_t)K)
        s_store64(dst, s_merge8(s_load64(q + g), K));
    for (; g < n; g += 8, dst += K) {
        size_t rest = n - g < 8 ? n - g : 8;
        uint64_t w = 0;
        for (size_t j = 0; j < rest; j++)
            w |= (uint64_t)q[g + j] << (j * (size_t)K);
        for (size_t b = 0; b < (rest * (size_t)K + 7) / 8; b++)
            dst[b] = (uint8_t)(w >> (8 * b));
    }
}

static void s_unpack_c(const uint8_t *src, size_t n, size_t avail, uint8_t *q, int K)
{
    const uint64_t mask = (1u << K) - 1;
    size_t g = 0;
    for (; g + 8 <= n && avail >= 8; g += 8, src += K, avail -= (size_t)K)
        s_store64(q + g, s_split8(s_load64(src), K));
    for (; g < n; g += 8, src += K) {
        size_t rest = n - g < 8 ? n - g : 8;
        uint64_t w = 0;
        for (size_t b = 0; b < (rest * (size_t)K + 7) / 8; b++)
            w |= (uint64_t)src[b] << (8 * b);
        for (size_t j = 0; j < rest; j++)
            q[g + j] = (uint8_t)((w >> (j * (size_t)K)) & mask);
    }
}

/* dst[i] (+)= q[i] == levels ? top : a + q[i] * b. */
static void s_dequantize_c(const uint8_t *q, size_t n, const mq_quant_deq_t *d, bool acc,
                           float *dst)
{
    for (size_t i = 0; i < n; i++) {
        float v = q[i] == d->levels ? d->top : d->a + (float)q[i] * d->b;
        dst[i] = acc ? dst[i] + v : v;
    }
}

/* Sums of the codes and of their squares (each square < 2^16). */
static mq_quant_sums_t s_code_sums_c(const uint8_t *q, size_t n, int K)
{
    mq_quant_sums_t t = {0, 0};
    for (size_t i = 0; i < n; i++) {
        t.sum += q[i];
        t.sum_sq += (uint32_t)q[i] * q[i];
    }
    return t;
}

static void s_stream_c(void *dst, const void *src, size_t n);

static void s_dequantize_stream_c(const uint8_t *q, size_t n, const mq_quant_deq_t *d, float *dst)
{
    s_dequantize_c(q, n, d, false, dst);
}

static const mq_quant_kernels_t s_kernels_c = {
    "c",        s_minmax_c,      s_quantize_c,         s_noise_c,
    s_pack_c,   s_unpack_c,      s_dequantize_c,       s_dequantize_stream_c,
    s_stream_c, s_code_sums_c,   s_quantize_noise_c,   s_minmax_sum_c,
    s_add_c,    s_quantize_ef_c, s_quantize_ef_scan_c,
};

#if S_X86
#include "kernels_x86.h"
#else
static void s_stream_c(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}
#endif

void mq_quant_stream_fence(void)
{
#if S_X86
    _mm_sfence();
#endif
}

/* ---- dispatch ------------------------------------------------------------------------------*/

static const mq_quant_kernels_t *_Atomic s_active;

#if S_X86
static bool s_have_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2");
}

/* Whether the CPU runs 512-bit operations at full width, where the avx512w set's loops on
 * 512-bit registers pay: AMD's family 26 (Zen 5) and later. Zen 4 (family 25) runs them in two
 * halves, and on an Intel Xeon (family 6 model 207) a 512-bit quantize measured no faster
 * (kernels_x86.h), so other CPUs with AVX-512 get the avx512 set. */
static bool s_full_width_avx512(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541 || d != 0x69746e65 || c != 0x444d4163)
        return false; /* not "AuthenticAMD" */
    __get_cpuid(1, &a, &b, &c, &d);
    unsigned family = (a >> 8) & 0xf;
    if (family == 0xf)
        family += (a >> 20) & 0xff;
    return family >= 26;
}
#endif

static const mq_quant_kernels_t *s_best(void)
{
#if S_X86
    __builtin_cpu_init();
    if (s_have_avx512())
        return s_full_width_avx512() ? &s_kernels_avx512w : &s_kernels_avx512;
    if (__builtin_cpu_supports("avx2"))
        return &s_kernels_avx2;
    return &s_kernels_sse2;
#else
    return &s_kernels_c;
#endif
}

const mq_quant_kernels_t *mq_quant_kernels(void)
{
    const mq_quant_kernels_t *k = s_active;
    if (!k) {
        k = s_best();
        s_active = k;
    }
    return k;
}

int mq_quant_use_kernels(const char *name)
{
    const mq_quant_kernels_t *k = NULL;
    if (!name)
        k = s_best();
    else if (strcmp(name, "c") == 0)
        k = &s_kernels_c;
#if S_X86
    else if (strcmp(name, "sse2") == 0)
        k = &s_kernels_sse2;
    else if (strcmp(name, "avx2") == 0 && (__builtin_cpu_init(), __builtin_cpu_supports("avx2")))
        k = &s_kernels_avx2;
    else if (strcmp(name, "avx512") == 0 && s_have_avx512())
        k = &s_kernels_avx512;
    else if (strcmp(name, "avx512w") == 0 && s_have_avx512())
        k = &s_kernels_avx512w;
#endif
    if (!k) {
        mq_err_set("quant: kernels '%s' are not available here (expected c, sse2, avx2, avx512 "
                   "or avx512w)",
                   name);
        return -1;
    }
    s_active = k;
    return 0;
}
