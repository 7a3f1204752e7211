/* SSE2, AVX2 and AVX-512 builds of the uniform codec's loops (the kernel sets sse2, avx2,
 * avx512 and avx512w); included by kernels.c only, after the portable versions, which finish
 * every loop's leftovers. The AVX2 and AVX-512 functions carry target attributes (the library
 * is built for baseline x86-64) and run only when the CPU has those instructions. No build uses
 * FMA: a fused multiply-add rounds once where the portable code rounds twice, which would
 * change codes and decoded values between machines. An AVX2 function clears the upper register
 * halves before calling SSE code (GCC leaves that out on tail calls), which otherwise stalls
 * every SSE instruction that follows. */

#ifndef MQGRAD_QUANT_KERNELS_X86_H
#define MQGRAD_QUANT_KERNELS_X86_H

#define S_AVX2 __attribute__((target("avx2")))
#define S_INLINE static inline __attribute__((always_inline))

/* Software prefetch 4 KB ahead of the loads of the streaming loops (range scan, quantize,
 * accumulating decode; MQ_QUANT_PREFETCH): the hardware prefetcher stops at each 4 KB page,
 * and with buckets the loads come in short bursts. Measured faster for encode at bucket=512,
 * and more so for decode-and-accumulate (bench/README.md). */
S_INLINE void s_prefetch_line(const float *p)
{
    MQ_QUANT_PREFETCH(p);
}

/* For loops that move 128 bytes a step. */
S_INLINE void s_prefetch_ahead(const float *p)
{
    s_prefetch_line(p);
    s_prefetch_line(p + 16);
}

/* The same into L2 only (T1), for the loops that read two arrays and write one back: error
 * feedback's (and its range scan of the sums) and the add. Measured on a Zen 4 (bench_quant,
 * bench/README.md): error feedback with buckets of 512 and the add got faster with T1, where
 * the loops that read one array got slower with it (the encode with one range most), so they
 * keep T0. */
S_INLINE void s_prefetch_ahead_l2(const float *p)
{
    MQ_QUANT_PREFETCH_TO(p, _MM_HINT_T1);
    MQ_QUANT_PREFETCH_TO(p + 16, _MM_HINT_T1);
}

/* ---- SSE2 ----------------------------------------------------------------------------------*/

/* Smallest / largest lane (extremes are exact whatever the order, but for the sign of a zero,
 * which the caller settles). */
S_INLINE float s_hmin4(__m128 v)
{
    v = _mm_min_ps(v, _mm_shuffle_ps(v, v, 0x4e));
    return _mm_cvtss_f32(_mm_min_ps(v, _mm_shuffle_ps(v, v, 0xb1)));
}

S_INLINE float s_hmax4(__m128 v)
{
    v = _mm_max_ps(v, _mm_shuffle_ps(v, v, 0x4e));
    return _mm_cvtss_f32(_mm_max_ps(v, _mm_shuffle_ps(v, v, 0xb1)));
}

/* minps(a, m) returns m when a is NaN, so a NaN never reaches the extremes: an unordered
 * compare of each pair of vectors catches it (and an infinity shows up as an extreme). */
static bool s_minmax_sse2(const float *x, size_t n, float *lo, float *hi)
{
    __m128 mn0 = _mm_set1_ps(x[0]), mn1 = mn0, mx0 = mn0, mx1 = mn0, bad = _mm_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s_prefetch_line(x + i);
        for (int k = 0; k < 16; k += 8) {
            __m128 a = _mm_loadu_ps(x + i + k), b = _mm_loadu_ps(x + i + k + 4);
            mn0 = _mm_min_ps(a, mn0);
            mn1 = _mm_min_ps(b, mn1);
            mx0 = _mm_max_ps(a, mx0);
            mx1 = _mm_max_ps(b, mx1);
            bad = _mm_or_ps(bad, _mm_cmpunord_ps(a, b));
        }
    }
    float l = x[0], h = x[0];
    bool ok = (i == n || s_minmax_c(x + i, n - i, &l, &h)) && !_mm_movemask_ps(bad);
    float vl = s_hmin4(_mm_min_ps(mn0, mn1)), vh = s_hmax4(_mm_max_ps(mx0, mx1));
    *lo = vl < l ? vl : l;
    *hi = vh > h ? vh : h;
    return ok && *lo - *lo == 0.0f && *hi - *hi == 0.0f;
}

S_INLINE __m128i s_q4_sse2(const float *x, __m128 lo, __m128 inv, __m128 r, __m128 top)
{
    __m128 y = _mm_add_ps(_mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(x), lo), inv), r);
    return _mm_cvttps_epi32(_mm_min_ps(y, top));
}

static void s_pack_sse2(const uint8_t *q, size_t n, uint8_t *dst, size_t avail, int K);
S_PACK_AFTER(sse2)

static void s_quantize_sse2(const float *x, size_t n, float lo, float inv, float top,
                            const float *noise, uint8_t *q, uint8_t *pk)
{
    const __m128 vlo = _mm_set1_ps(lo), vinv = _mm_set1_ps(inv), vtop = _mm_set1_ps(top);
    const __m128 half = _mm_set1_ps(0.5f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s_prefetch_line(x + i);
        __m128 r0 = half, r1 = half, r2 = half, r3 = half;
        if (noise) {
            r0 = _mm_loadu_ps(noise + i);
            r1 = _mm_loadu_ps(noise + i + 4);
            r2 = _mm_loadu_ps(noise + i + 8);
            r3 = _mm_loadu_ps(noise + i + 12);
        }
        __m128i k0 = s_q4_sse2(x + i, vlo, vinv, r0, vtop);
        __m128i k1 = s_q4_sse2(x + i + 4, vlo, vinv, r1, vtop);
        __m128i k2 = s_q4_sse2(x + i + 8, vlo, vinv, r2, vtop);
        __m128i k3 = s_q4_sse2(x + i + 12, vlo, vinv, r3, vtop);
        __m128i b = _mm_packus_epi16(_mm_packs_epi32(k0, k1), _mm_packs_epi32(k2, k3));
        _mm_storeu_si128((__m128i *)(q + i), b);
    }
    s_quantize_c(x + i, n - i, lo, inv, top, noise ? noise + i : NULL, q + i, NULL);
    s_pack_after_sse2(q, n, top, pk);
}

S_INLINE __m128i s_rotl_sse2(__m128i x, int k)
{
    return _mm_or_si128(_mm_slli_epi32(x, k), _mm_srli_epi32(x, 32 - k));
}

/* The eight generators as two four-lane halves; x*5 and x*9 as shifts and adds (SSE2 has
 * no 32-bit lane multiply). */
static void s_noise_sse2(mq_quant_noise_t *g, float *u, size_t n)
{
    __m128i s[4][2];
    for (int w = 0; w < 4; w++)
        for (int h = 0; h < 2; h++)
            s[w][h] = _mm_loadu_si128((const __m128i *)&g->s[w][4 * h]);
    const __m128 unit = _mm_set1_ps(0x1.0p-16f);
    const __m128i low = _mm_set1_epi32(0xffff);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int h = 0; h < 2; h++) {
            __m128i x = _mm_add_epi32(_mm_slli_epi32(s[1][h], 2), s[1][h]);
            x = s_rotl_sse2(x, 7);
            __m128i r = _mm_add_epi32(_mm_slli_epi32(x, 3), x), t = _mm_slli_epi32(s[1][h], 9);
            s[2][h] = _mm_xor_si128(s[2][h], s[0][h]);
            s[3][h] = _mm_xor_si128(s[3][h], s[1][h]);
            s[1][h] = _mm_xor_si128(s[1][h], s[2][h]);
            s[0][h] = _mm_xor_si128(s[0][h], s[3][h]);
            s[2][h] = _mm_xor_si128(s[2][h], t);
            s[3][h] = s_rotl_sse2(s[3][h], 11);
            _mm_storeu_ps(u + i + 4 * h, _mm_mul_ps(_mm_cvtepi32_ps(_mm_and_si128(r, low)), unit));
            _mm_storeu_ps(u + i + 8 + 4 * h,
                          _mm_mul_ps(_mm_cvtepi32_ps(_mm_srli_epi32(r, 16)), unit));
        }
    for (int w = 0; w < 4; w++)
        for (int h = 0; h < 2; h++)
            _mm_storeu_si128((__m128i *)&g->s[w][4 * h], s[w][h]);
    s_noise_c(g, u + i, n - i);
}

/* s_merge8 / s_split8 on each 64-bit lane. */
#define S_MERGE8(P, w, K)                                                                          \
    do {                                                                                           \
        w = P## or (P## and (w, l16), P##slli_epi64(P## and (P##srli_epi64(w, 8), l16), (K)));     \
        w = P## or                                                                                 \
            (P## and (w, l32), P##slli_epi64(P## and (P##srli_epi64(w, 16), l32), 2 * (K)));       \
        w = P## or (P## and (w, l64), P##slli_epi64(P##srli_epi64(w, 32), 4 * (K)));               \
    } while (0)

#define S_SPLIT8(P, w, K)                                                                          \
    do {                                                                                           \
        w = P## or (P## and (w, m4), P##slli_epi64(P## and (P##srli_epi64(w, 4 * (K)), m4), 32));  \
        w = P## or (P## and (w, m2), P##slli_epi64(P## and (P##srli_epi64(w, 2 * (K)), m2), 16));  \
        w = P## or (P## and (w, m1), P##slli_epi64(P## and (P##srli_epi64(w, (K)), m1), 8));       \
    } while (0)

#define s_mm_or _mm_or_si128
#define s_mm_and _mm_and_si128
#define s_mm_slli_epi64 _mm_slli_epi64
#define s_mm_srli_epi64 _mm_srli_epi64

/* Sixteen codes per step: two 8-byte stores, the second K bytes on (the spill of each is
 * overwritten by the next), while 8 bytes of payload remain at the last store. */
S_INLINE void s_pack_sse2_k(const uint8_t *q, size_t n, uint8_t *dst, size_t avail, const int K)
{
    const __m128i l16 = _mm_set1_epi64x((long long)S_L16), l32 = _mm_set1_epi64x((long long)S_L32),
                  l64 = _mm_set1_epi64x(0xffffffffll);
    size_t g = 0;
    for (; g + 16 <= n && avail >= (size_t)K + 8; g += 16, dst += 2 * K, avail -= 2 * (size_t)K) {
        __m128i w = _mm_loadu_si128((const __m128i *)(q + g));
        S_MERGE8(s_mm_, w, K);
        _mm_storel_epi64((__m128i *)dst, w);
        _mm_storel_epi64((__m128i *)(dst + K), _mm_unpackhi_epi64(w, w));
    }
    s_pack_c(q + g, n - g, dst, avail, K);
}

S_INLINE void s_unpack_sse2_k(const uint8_t *src, size_t n, size_t avail, uint8_t *q, const int K)
{
    const __m128i m4 = _mm_set1_epi64x((1ll << (4 * K)) - 1),
                  m2 = _mm_set1_epi64x((long long)(((1ull << (2 * K)) - 1) * 0x100000001ull)),
                  m1 = _mm_set1_epi64x((long long)(((1ull << K) - 1) * 0x0001000100010001ull));
    size_t g = 0;
    for (; g + 16 <= n && avail >= (size_t)K + 8; g += 16, src += 2 * K, avail -= 2 * (size_t)K) {
        __m128i w = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)src),
                                       _mm_loadl_epi64((const __m128i *)(src + K)));
        S_SPLIT8(s_mm_, w, K);
        _mm_storeu_si128((__m128i *)(q + g), w);
    }
    s_unpack_c(src, n - g, avail, q + g, K);
}

/* One function per K so every shift count is an immediate. */
#define S_BY_K(fn, K, ...)                                                                         \
    switch (K) {                                                                                   \
    case 1:                                                                                        \
        fn(__VA_ARGS__, 1);                                                                        \
        break;                                                                                     \
    case 2:                                                                                        \
        fn(__VA_ARGS__, 2);                                                                        \
        break;                                                                                     \
    case 3:                                                                                        \
        fn(__VA_ARGS__, 3);                                                                        \
        break;                                                                                     \
    case 4:                                                                                        \
        fn(__VA_ARGS__, 4);                                                                        \
        break;                                                                                     \
    case 5:                                                                                        \
        fn(__VA_ARGS__, 5);                                                                        \
        break;                                                                                     \
    case 6:                                                                                        \
        fn(__VA_ARGS__, 6);                                                                        \
        break;                                                                                     \
    default:                                                                                       \
        fn(__VA_ARGS__, 7);                                                                        \
        break;                                                                                     \
    }

static void s_pack_sse2(const uint8_t *q, size_t n, uint8_t *dst, size_t avail, int K)
{
    S_BY_K(s_pack_sse2_k, K, q, n, dst, avail)
}

static void s_unpack_sse2(const uint8_t *src, size_t n, size_t avail, uint8_t *q,
                          int K){S_BY_K(s_unpack_sse2_k, K, src, n, avail, q)}

S_INLINE __m128 s_deq4_sse2(__m128i qi, __m128 a, __m128 b, __m128 top, __m128i lev)
{
    __m128 v = _mm_add_ps(a, _mm_mul_ps(_mm_cvtepi32_ps(qi), b));
    __m128 m = _mm_castsi128_ps(_mm_cmpeq_epi32(qi, lev));
    return _mm_or_ps(_mm_and_ps(m, top), _mm_andnot_ps(m, v));
}

/* Where streaming stores may go in the N bytes at ADDR: whole 64-byte lines only. The
 * partial lines at either end are shared with the neighbouring chunks, which write them with
 * ordinary stores too: mixing the two kinds of store in one line is what makes streaming
 * slow. */
static void s_span64(uintptr_t addr, size_t n, size_t *from, size_t *to)
{
    size_t h = (64 - (addr & 63)) & 63;
    *from = h < n ? h : 0;
    *to = h < n ? h + (n - h) / 64 * 64 : 0;
}

/* The same in floats. */
static void s_stream_span(const float *dst, size_t n, size_t *from, size_t *to)
{
    s_span64((uintptr_t)dst, n * sizeof *dst, from, to);
    *from /= sizeof *dst;
    *to /= sizeof *dst;
}

static void s_stream_c(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
}

static void s_stream_sse2(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t from, to;
    s_span64((uintptr_t)d, n, &from, &to);
    memcpy(d, s, from);
    for (size_t i = from; i < to; i += 64)
        for (int k = 0; k < 64; k += 16)
            _mm_stream_si128((__m128i *)(d + i + k), _mm_loadu_si128((const __m128i *)(s + i + k)));
    memcpy(d + to, s + to, n - to);
}

static void s_dequantize_sse2(const uint8_t *q, size_t n, const mq_quant_deq_t *d, bool acc,
                              float *dst)
{
    const __m128 a = _mm_set1_ps(d->a), b = _mm_set1_ps(d->b), top = _mm_set1_ps(d->top);
    const __m128i lev = _mm_set1_epi32((int)d->levels), z = _mm_setzero_si128();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i w = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(q + i)), z);
        __m128 v0 = s_deq4_sse2(_mm_unpacklo_epi16(w, z), a, b, top, lev);
        __m128 v1 = s_deq4_sse2(_mm_unpackhi_epi16(w, z), a, b, top, lev);
        if (acc) {
            s_prefetch_line(dst + i); /* the running sum comes from memory */
            v0 = _mm_add_ps(_mm_loadu_ps(dst + i), v0);
            v1 = _mm_add_ps(_mm_loadu_ps(dst + i + 4), v1);
        }
        _mm_storeu_ps(dst + i, v0);
        _mm_storeu_ps(dst + i + 4, v1);
    }
    s_dequantize_c(q + i, n - i, d, acc, dst + i);
}

/* Decode straight into dst with streaming stores over its whole lines. */
static void s_dequantize_stream_sse2(const uint8_t *q, size_t n, const mq_quant_deq_t *d,
                                     float *dst)
{
    const __m128 a = _mm_set1_ps(d->a), b = _mm_set1_ps(d->b), top = _mm_set1_ps(d->top);
    const __m128i lev = _mm_set1_epi32((int)d->levels), z = _mm_setzero_si128();
    size_t from, to;
    s_stream_span(dst, n, &from, &to);
    s_dequantize_sse2(q, from, d, false, dst);
    for (size_t i = from; i < to; i += 8) {
        __m128i w = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(q + i)), z);
        _mm_stream_ps(dst + i, s_deq4_sse2(_mm_unpacklo_epi16(w, z), a, b, top, lev));
        _mm_stream_ps(dst + i + 4, s_deq4_sse2(_mm_unpackhi_epi16(w, z), a, b, top, lev));
    }
    s_dequantize_sse2(q + to, n - to, d, false, dst + to);
}

/* Lane totals, widened to 64 bits. */
S_INLINE uint64_t s_hsum64_sse2(__m128i v)
{
    uint64_t u[2];
    memcpy(u, &v, sizeof u);
    return u[0] + u[1];
}

S_INLINE uint64_t s_hsum32_sse2(__m128i v)
{
    uint32_t u[4];
    memcpy(u, &v, sizeof u);
    return (uint64_t)u[0] + u[1] + u[2] + u[3];
}

/* psadbw sums the codes; pmaddwd on the even and the odd bytes as 16-bit lanes sums pairs of
 * squares into 32-bit lanes, which MQ_QUANT_SUMS_MAX codes cannot overflow. */
static mq_quant_sums_t s_code_sums_sse2(const uint8_t *q, size_t n, int K)
{
    const __m128i z = _mm_setzero_si128(), low = _mm_set1_epi16(0xff);
    __m128i s = z, s2 = z;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(q + i));
        __m128i even = _mm_and_si128(v, low), odd = _mm_srli_epi16(v, 8);
        s = _mm_add_epi64(s, _mm_sad_epu8(v, z));
        s2 = _mm_add_epi32(s2, _mm_add_epi32(_mm_madd_epi16(even, even), _mm_madd_epi16(odd, odd)));
    }
    mq_quant_sums_t t = s_code_sums_c(q + i, n - i, K);
    t.sum += s_hsum64_sse2(s);
    t.sum_sq += s_hsum32_sse2(s2);
    return t;
}

S_QUANTIZE_NOISE_STAGED(sse2)

/* As s_minmax_sse2, of the sums a[i] + b[i]. */
static bool s_minmax_sum_sse2(const float *a, const float *b, size_t n, float *lo, float *hi)
{
    __m128 mn0 = _mm_set1_ps(a[0] + b[0]), mn1 = mn0, mx0 = mn0, mx1 = mn0;
    __m128 bad = _mm_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128 u = _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i));
        __m128 v = _mm_add_ps(_mm_loadu_ps(a + i + 4), _mm_loadu_ps(b + i + 4));
        mn0 = _mm_min_ps(u, mn0);
        mn1 = _mm_min_ps(v, mn1);
        mx0 = _mm_max_ps(u, mx0);
        mx1 = _mm_max_ps(v, mx1);
        bad = _mm_or_ps(bad, _mm_cmpunord_ps(u, v));
    }
    float l = a[0] + b[0], h = l;
    bool ok = (i == n || s_minmax_sum_c(a + i, b + i, n - i, &l, &h)) && !_mm_movemask_ps(bad);
    float vl = s_hmin4(_mm_min_ps(mn0, mn1)), vh = s_hmax4(_mm_max_ps(mx0, mx1));
    *lo = vl < l ? vl : l;
    *hi = vh > h ? vh : h;
    return ok && *lo - *lo == 0.0f && *hi - *hi == 0.0f;
}

static void s_add_sse2(float *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_storeu_ps(dst + i, _mm_add_ps(_mm_loadu_ps(dst + i), _mm_loadu_ps(src + i)));
        _mm_storeu_ps(dst + i + 4,
                      _mm_add_ps(_mm_loadu_ps(dst + i + 4), _mm_loadu_ps(src + i + 4)));
    }
    s_add_c(dst + i, src + i, n - i);
}

S_QUANTIZE_EF(sse2)
S_QUANTIZE_EF_SCAN(sse2)

static const mq_quant_kernels_t s_kernels_sse2 = {
    "sse2",        s_minmax_sse2,      s_quantize_sse2,         s_noise_sse2,
    s_pack_sse2,   s_unpack_sse2,      s_dequantize_sse2,       s_dequantize_stream_sse2,
    s_stream_sse2, s_code_sums_sse2,   s_quantize_noise_sse2,   s_minmax_sum_sse2,
    s_add_sse2,    s_quantize_ef_sse2, s_quantize_ef_scan_sse2,
};

/* ---- AVX2 ----------------------------------------------------------------------------------*/

/* A range scan of x[i] (b NULL) or of the sums x[i] + b[i], in steps of 32 values: the
 * running extremes, one vector each way (three registers in all, which the error-feedback
 * loop needs for its constants), and the unordered compares that catch a NaN
 * (minps(a, m) returns m when a is NaN, so a NaN never reaches the extremes; an infinity
 * shows up as one). s_minmax_either_avx2 runs one by itself; the error-feedback walk runs the
 * next bucket's inside the loop that quantizes this one. */
typedef struct {
    __m256 mn, mx, bad;
    float first;
} s_scan_avx2_t;

S_AVX2 S_INLINE s_scan_avx2_t s_scan_start_avx2(const float *x, const float *b)
{
    const float first = b ? x[0] + b[0] : x[0];
    const __m256 f = _mm256_set1_ps(first);
    return (s_scan_avx2_t){f, f, _mm256_setzero_ps(), first};
}

S_AVX2 S_INLINE __m256 s_scan_load_avx2(const float *x, const float *b)
{
    __m256 u = _mm256_loadu_ps(x);
    return b ? _mm256_add_ps(u, _mm256_loadu_ps(b)) : u;
}

/* Values x[0..32) (and b[0..32)), prefetching ahead. */
S_AVX2 S_INLINE void s_scan32_avx2(s_scan_avx2_t *t, const float *x, const float *b)
{
    if (b) { /* error feedback's range */
        s_prefetch_ahead_l2(x);
        s_prefetch_ahead_l2(b);
    } else {
        s_prefetch_ahead(x);
    }
    __m256 u = s_scan_load_avx2(x, b), v = s_scan_load_avx2(x + 8, b ? b + 8 : NULL);
    __m256 w = s_scan_load_avx2(x + 16, b ? b + 16 : NULL);
    __m256 z = s_scan_load_avx2(x + 24, b ? b + 24 : NULL);
    t->mn = _mm256_min_ps(_mm256_min_ps(_mm256_min_ps(u, v), _mm256_min_ps(w, z)), t->mn);
    t->mx = _mm256_max_ps(_mm256_max_ps(_mm256_max_ps(u, v), _mm256_max_ps(w, z)), t->mx);
    t->bad = _mm256_or_ps(
        t->bad, _mm256_or_ps(_mm256_cmp_ps(u, v, _CMP_UNORD_Q), _mm256_cmp_ps(w, z, _CMP_UNORD_Q)));
}

/* Scans values [i, n) too, then gives the extremes; false if one is not finite. Leaves the
 * upper register halves clear (it ends in SSE2 code). */
S_AVX2 S_INLINE bool s_scan_end_avx2(s_scan_avx2_t *t, const float *x, const float *b, size_t i,
                                     size_t n, float *lo, float *hi)
{
    for (; i + 32 <= n; i += 32)
        s_scan32_avx2(t, x + i, b ? b + i : NULL);
    __m256 mn = t->mn, mx = t->mx;
    bool ok = !_mm256_movemask_ps(t->bad);
    __m128 mn4 = _mm_min_ps(_mm256_castps256_ps128(mn), _mm256_extractf128_ps(mn, 1));
    __m128 mx4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    float vl = s_hmin4(mn4), vh = s_hmax4(mx4), l = t->first, h = t->first;
    _mm256_zeroupper();
    ok = (i == n || (b ? s_minmax_sum_sse2(x + i, b + i, n - i, &l, &h)
                       : s_minmax_sse2(x + i, n - i, &l, &h))) &&
         ok;
    *lo = vl < l ? vl : l;
    *hi = vh > h ? vh : h;
    return ok && *lo - *lo == 0.0f && *hi - *hi == 0.0f;
}

/* Smallest and largest of x[i] (b NULL) or of the sums x[i] + b[i]; false if one is not
 * finite. Inlined into both callers below with b a constant, so each gets its own loop. */
S_AVX2 S_INLINE bool s_minmax_either_avx2(const float *x, const float *b, size_t n, float *lo,
                                          float *hi)
{
    s_scan_avx2_t t = s_scan_start_avx2(x, b);
    return s_scan_end_avx2(&t, x, b, 0, n, lo, hi);
}

/* A long range scan (one range per tensor, whose encode reads the tensor twice) walks four
 * quarters of it side by side: four streams of loads in flight instead of one, each with its
 * own extremes, merged at the end (the extremes do not depend on the order). Measured on a Zen 3
 * (bench_quant, bench/README.md, "One range per tensor: the range scan in four streams"): the
 * read-only pass and the encode with one range both got faster; two streams gained less, and
 * so did one set of extremes shared by the four (its chain of min and max operations limits
 * it). */
enum { S_SCAN_STREAMS = 4, S_SCAN_SPLIT = 65536 /* values: from here on */ };

S_AVX2 static bool s_minmax_avx2(const float *x, size_t n, float *lo, float *hi)
{
    if (n < S_SCAN_SPLIT)
        return s_minmax_either_avx2(x, NULL, n, lo, hi);
    const size_t q = n / S_SCAN_STREAMS / 32 * 32;
    s_scan_avx2_t t[S_SCAN_STREAMS];
    for (int k = 0; k < S_SCAN_STREAMS; k++)
        t[k] = s_scan_start_avx2(x + k * q, NULL);
    for (size_t i = 0; i < q; i += 32)
        for (int k = 0; k < S_SCAN_STREAMS; k++)
            s_scan32_avx2(&t[k], x + k * q + i, NULL);
    for (int k = 1; k < S_SCAN_STREAMS; k++) {
        t[0].mn = _mm256_min_ps(t[0].mn, t[k].mn);
        t[0].mx = _mm256_max_ps(t[0].mx, t[k].mx);
        t[0].bad = _mm256_or_ps(t[0].bad, t[k].bad);
    }
    return s_scan_end_avx2(&t[0], x, NULL, S_SCAN_STREAMS * q, n, lo, hi); /* and the rest */
}

#define s_mm256_or _mm256_or_si256
#define s_mm256_and _mm256_and_si256
#define s_mm256_slli_epi64 _mm256_slli_epi64
#define s_mm256_srli_epi64 _mm256_srli_epi64

/* Thirty-two codes W (bytes, each below 2^K, K < 8) packed as pack() lays them out: 4K bytes
 * at dst; for K other than 1, 2 and 4 in four 8-byte stores K bytes apart, so up to 8 - K bytes
 * past them are written too (as zeros). The pack kernel's step, and the quantize kernels' where
 * they pack as they go. Code i takes bits iK.. of the little-endian stream: at 1, 2 and 4 bits
 * a byte holds 8/K whole codes, their sum weighted 2^0, 2^K, ..., which multiply-adds form
 * in place before the bytes are gathered. */
/* The first merges of packing codes W (bytes below 2^K, K <= 6) as multiply-adds: pairs
 * q0 + q1 * 2^K in each 16-bit lane, then those pairs' pairs p0 + p1 * 2^2K in each 32-bit
 * lane. */
S_AVX2 S_INLINE __m256i s_pairs_avx2(__m256i w, int K)
{
    return _mm256_maddubs_epi16(w, _mm256_set1_epi16((short)(1 | (1 << (8 + K)))));
}

S_AVX2 S_INLINE __m256i s_quads_avx2(__m256i p, int K)
{
    return _mm256_madd_epi16(p, _mm256_set1_epi32(1 | (1 << (16 + 2 * K))));
}

S_AVX2 S_INLINE void s_pack32_avx2(__m256i w, uint8_t *dst, const int K)
{
    const __m256i l64 = _mm256_set1_epi64x(0xffffffffll);
    if (K == 1) { /* each code's bit to its byte's top: the byte mask is the 32 codes */
        uint32_t m = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(w, 7));
        memcpy(dst, &m, sizeof m);
        return;
    }
    if (K <= 6) {
        w = s_pairs_avx2(w, K);
        if (K == 4) { /* a pair is a byte: each 128-bit half's 8 low bytes, gathered */
            w = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08);
            _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(w));
            return;
        }
        w = s_quads_avx2(w, K);
        if (K == 2) { /* a quad is a byte: each 128-bit half's 4 low bytes, gathered */
            w = _mm256_packus_epi16(_mm256_packs_epi32(w, w), w);
            w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
            _mm_storel_epi64((__m128i *)dst, _mm256_castsi256_si128(w));
            return;
        }
        w = _mm256_or_si256(_mm256_and_si256(w, l64),
                            _mm256_slli_epi64(_mm256_srli_epi64(w, 32), 4 * K));
    } else {
        const __m256i l16 = _mm256_set1_epi64x((long long)S_L16),
                      l32 = _mm256_set1_epi64x((long long)S_L32);
        S_MERGE8(s_mm256_, w, K);
    }
    __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
    _mm_storel_epi64((__m128i *)dst, lo);
    _mm_storel_epi64((__m128i *)(dst + K), _mm_unpackhi_epi64(lo, lo));
    _mm_storel_epi64((__m128i *)(dst + 2 * K), hi);
    _mm_storel_epi64((__m128i *)(dst + 3 * K), _mm_unpackhi_epi64(hi, hi));
}

/* The codes of the eight values V with the offsets R; CLAMP to TOP unless rounding to nearest,
 * where quantize's contract keeps y below levels + 1 (quant_internal.h). The encodes and error
 * feedback's walk take their codes here. */
S_AVX2 S_INLINE __m256i s_q8_avx2(__m256 v, __m256 lo, __m256 inv, __m256 r, __m256 top, bool clamp)
{
    __m256 y = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(v, lo), inv), r);
    return _mm256_cvttps_epi32(clamp ? _mm256_min_ps(y, top) : y);
}

/* The codes of x[0..32) with the offsets r0..r3 (0.5: round to nearest; noise: stochastic,
 * CLAMP true), stored as 32 bytes in order, and packed to K bits at PK as well unless it is
 * NULL; returns the 32 bytes. */
S_AVX2 S_INLINE __m256i s_q32_avx2(const float *x, __m256 lo, __m256 inv, __m256 r0, __m256 r1,
                                   __m256 r2, __m256 r3, __m256 top, bool clamp, __m256i order,
                                   uint8_t *q, uint8_t *pk, int K)
{
    __m256i k0 = s_q8_avx2(_mm256_loadu_ps(x), lo, inv, r0, top, clamp),
            k1 = s_q8_avx2(_mm256_loadu_ps(x + 8), lo, inv, r1, top, clamp);
    __m256i k2 = s_q8_avx2(_mm256_loadu_ps(x + 16), lo, inv, r2, top, clamp),
            k3 = s_q8_avx2(_mm256_loadu_ps(x + 24), lo, inv, r3, top, clamp);
    /* packs work within 128-bit halves: the dwords come out as 0,2,4,6,1,3,5,7 */
    __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(k0, k1), _mm256_packs_epi32(k2, k3));
    b = _mm256_permutevar8x32_epi32(b, order);
    _mm256_storeu_si256((__m256i *)q, b);
    if (pk)
        s_pack32_avx2(b, pk, K);
    return b;
}

/* s_quantize_avx2's loop with the noise drawn beforehand into NOISE, specialized by inlining
 * for PACK (PK used); without noise, or with it drawn in the loop, see S_QUANTIZE_GEN. */
S_AVX2 S_INLINE size_t s_quantize_array_loop_avx2(const float *x, size_t n, float lo, float inv,
                                                  float top, const float *noise, uint8_t *q,
                                                  uint8_t *pk, bool pack)
{
    const __m256 vlo = _mm256_set1_ps(lo), vinv = _mm256_set1_ps(inv), vtop = _mm256_set1_ps(top);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const int K = mq_quant_bits_of((uint32_t)top);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s_prefetch_ahead(x + i);
        s_q32_avx2(x + i, vlo, vinv, _mm256_loadu_ps(noise + i), _mm256_loadu_ps(noise + i + 8),
                   _mm256_loadu_ps(noise + i + 16), _mm256_loadu_ps(noise + i + 24), vtop, true,
                   order, q + i, pack ? pk + i / 8 * (size_t)K : NULL, K);
    }
    return i;
}

S_AVX2 S_INLINE __m256i s_rotl_avx2(__m256i x, int k)
{
    return _mm256_or_si256(_mm256_slli_epi32(x, k), _mm256_srli_epi32(x, 32 - k));
}

/* One step of the eight generators: their 32-bit outputs (s_noise_step_c). */
S_AVX2 S_INLINE __m256i s_noise_step_avx2(__m256i s[4])
{
    __m256i x = _mm256_add_epi32(_mm256_slli_epi32(s[1], 2), s[1]);
    x = s_rotl_avx2(x, 7);
    __m256i r = _mm256_add_epi32(_mm256_slli_epi32(x, 3), x), t = _mm256_slli_epi32(s[1], 9);
    s[2] = _mm256_xor_si256(s[2], s[0]);
    s[3] = _mm256_xor_si256(s[3], s[1]);
    s[1] = _mm256_xor_si256(s[1], s[2]);
    s[0] = _mm256_xor_si256(s[0], s[3]);
    s[2] = _mm256_xor_si256(s[2], t);
    s[3] = s_rotl_avx2(s[3], 11);
    return r;
}

/* The 16 uniforms of one generator step's outputs R, in [0, 1) on a grid of 2^-16: lane j's
 * low half is value j of a group of 16 (*LO), its high half value 8 + j (*HI), as s_noise_c
 * orders them. */
S_AVX2 S_INLINE void s_uniforms16_avx2(__m256i r, __m256 *lo, __m256 *hi)
{
    const __m256 unit = _mm256_set1_ps(0x1.0p-16f);
    *lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(r, _mm256_set1_epi32(0xffff))), unit);
    *hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(r, 16)), unit);
}

/* The eight generators' state G into S (zeros when G is NULL: no noise), and back. */
S_AVX2 S_INLINE void s_gen_load_avx2(const mq_quant_noise_t *g, __m256i s[4])
{
    for (int w = 0; w < 4; w++)
        s[w] = g ? _mm256_loadu_si256((const __m256i *)g->s[w]) : _mm256_setzero_si256();
}

S_AVX2 S_INLINE void s_gen_store_avx2(mq_quant_noise_t *g, const __m256i s[4])
{
    if (g)
        for (int w = 0; w < 4; w++)
            _mm256_storeu_si256((__m256i *)g->s[w], s[w]);
}

S_AVX2 static void s_noise_avx2(mq_quant_noise_t *g, float *u, size_t n)
{
    __m256i s[4];
    s_gen_load_avx2(g, s);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 lo16, hi16;
        s_uniforms16_avx2(s_noise_step_avx2(s), &lo16, &hi16);
        _mm256_storeu_ps(u + i, lo16);
        _mm256_storeu_ps(u + i + 8, hi16);
    }
    s_gen_store_avx2(g, s);
    _mm256_zeroupper();
    s_noise_c(g, u + i, n - i);
}

S_AVX2 S_INLINE void s_pack_avx2_k(const uint8_t *q, size_t n, uint8_t *dst, size_t avail,
                                   const int K)
{
    size_t g = 0;
    for (; g + 32 <= n && avail >= 3 * (size_t)K + 8; g += 32, dst += 4 * K, avail -= 4 * (size_t)K)
        s_pack32_avx2(_mm256_loadu_si256((const __m256i *)(q + g)), dst, K);
    _mm256_zeroupper();
    s_pack_sse2_k(q + g, n - g, dst, avail, K);
}

S_AVX2 S_INLINE void s_unpack_avx2_k(const uint8_t *src, size_t n, size_t avail, uint8_t *q,
                                     const int K)
{
    const __m256i m4 = _mm256_set1_epi64x((1ll << (4 * K)) - 1),
                  m2 = _mm256_set1_epi64x((long long)(((1ull << (2 * K)) - 1) * 0x100000001ull)),
                  m1 = _mm256_set1_epi64x((long long)(((1ull << K) - 1) * 0x0001000100010001ull));
    size_t g = 0;
    for (; g + 32 <= n && avail >= 3 * (size_t)K + 8;
         g += 32, src += 4 * K, avail -= 4 * (size_t)K) {
        __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)src),
                                        _mm_loadl_epi64((const __m128i *)(src + K)));
        __m128i hi = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(src + 2 * K)),
                                        _mm_loadl_epi64((const __m128i *)(src + 3 * K)));
        __m256i w = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
        S_SPLIT8(s_mm256_, w, K);
        _mm256_storeu_si256((__m256i *)(q + g), w);
    }
    _mm256_zeroupper();
    s_unpack_sse2_k(src, n - g, avail, q + g, K);
}

S_AVX2 static void s_pack_avx2(const uint8_t *q, size_t n, uint8_t *dst, size_t avail,
                               int K){S_BY_K(s_pack_avx2_k, K, q, n, dst, avail)}

S_AVX2 static void s_unpack_avx2(const uint8_t *src, size_t n, size_t avail, uint8_t *q,
                                 int K){S_BY_K(s_unpack_avx2_k, K, src, n, avail, q)}

S_AVX2 S_INLINE __m256 s_deq8_avx2(const uint8_t *q, __m256 a, __m256 b, __m256 top, __m256i lev)
{
    __m256i qi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
    __m256 v = _mm256_add_ps(a, _mm256_mul_ps(_mm256_cvtepi32_ps(qi), b));
    return _mm256_blendv_ps(v, top, _mm256_castsi256_ps(_mm256_cmpeq_epi32(qi, lev)));
}

S_AVX2 static void s_dequantize_avx2(const uint8_t *q, size_t n, const mq_quant_deq_t *d, bool acc,
                                     float *dst)
{
    const __m256 a = _mm256_set1_ps(d->a), b = _mm256_set1_ps(d->b), top = _mm256_set1_ps(d->top);
    const __m256i lev = _mm256_set1_epi32((int)d->levels);
    size_t i = 0;
    if (acc)
        for (; i + 16 <= n; i += 16) {
            s_prefetch_line(dst + i); /* the running sum comes from memory */
            __m256 v0 = s_deq8_avx2(q + i, a, b, top, lev);
            __m256 v1 = s_deq8_avx2(q + i + 8, a, b, top, lev);
            _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), v0));
            _mm256_storeu_ps(dst + i + 8, _mm256_add_ps(_mm256_loadu_ps(dst + i + 8), v1));
        }
    else
        for (; i + 16 <= n; i += 16) {
            _mm256_storeu_ps(dst + i, s_deq8_avx2(q + i, a, b, top, lev));
            _mm256_storeu_ps(dst + i + 8, s_deq8_avx2(q + i + 8, a, b, top, lev));
        }
    _mm256_zeroupper();
    s_dequantize_c(q + i, n - i, d, acc, dst + i);
}

S_AVX2 static void s_stream_avx2(void *dst, const void *src, size_t n)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t from, to;
    s_span64((uintptr_t)d, n, &from, &to);
    memcpy(d, s, from);
    for (size_t i = from; i < to; i += 64) {
        _mm256_stream_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
        _mm256_stream_si256((__m256i *)(d + i + 32),
                            _mm256_loadu_si256((const __m256i *)(s + i + 32)));
    }
    _mm256_zeroupper();
    memcpy(d + to, s + to, n - to);
}

S_AVX2 static void s_dequantize_stream_avx2(const uint8_t *q, size_t n, const mq_quant_deq_t *d,
                                            float *dst)
{
    const __m256 a = _mm256_set1_ps(d->a), b = _mm256_set1_ps(d->b), top = _mm256_set1_ps(d->top);
    const __m256i lev = _mm256_set1_epi32((int)d->levels);
    size_t from, to;
    s_stream_span(dst, n, &from, &to);
    s_dequantize_avx2(q, from, d, false, dst);
    for (size_t i = from; i < to; i += 16) {
        _mm256_stream_ps(dst + i, s_deq8_avx2(q + i, a, b, top, lev));
        _mm256_stream_ps(dst + i + 8, s_deq8_avx2(q + i + 8, a, b, top, lev));
    }
    _mm256_zeroupper();
    s_dequantize_avx2(q + to, n - to, d, false, dst + to);
}

/* Rounds of two 32-code steps that 8- and 16-bit lanes add up without overflow, by K - 1:
 * min(255 / L, 32767 / (2 L^2)) with L = 2^K - 1, as a byte lane takes one code <= L a
 * round and a 16-bit lane (signed for pmaddwd) one pair of squares. A table: two divisions
 * per call take about as long as summing a 512-code bucket. */
static const uint8_t s_sums_rounds[7] = {255, 85, 36, 17, 8, 4, 1};

/* Both sums to scalars: the squares' lanes are 32-bit, and their total fits too (n is at
 * most MQ_QUANT_SUMS_MAX). */
S_AVX2 S_INLINE void s_sums_out_avx2(__m256i s, __m256i s2, mq_quant_sums_t *t)
{
    __m128i a = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    __m128i b = _mm_add_epi32(_mm256_castsi256_si128(s2), _mm256_extracti128_si256(s2, 1));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0x4e));
    b = _mm_add_epi32(b, _mm_shuffle_epi32(b, 0xb1));
    t->sum += (uint64_t)_mm_cvtsi128_si64(_mm_add_epi64(a, _mm_unpackhi_epi64(a, a)));
    t->sum_sq += (uint32_t)_mm_cvtsi128_si32(b);
}

/* Codes below 128 (K <= 7) square in pmaddubsw, a pair of squares per 16-bit lane; bytes and
 * 16-bit lanes add up rounds before they are widened: three operations per 32 codes, on two
 * chains so that one add's latency does not set the pace. */
S_AVX2 static void s_code_sums7_avx2(const uint8_t *q, size_t n, int K, __m256i *s, __m256i *s2)
{
    const __m256i z = _mm256_setzero_si256(), ones = _mm256_set1_epi16(1);
    const size_t R = s_sums_rounds[K - 1];
    for (size_t i = 0; i < n;) {
        size_t end = n - i > 64 * R ? i + 64 * R : n;
        __m256i b0 = z, b1 = z, w0 = z, w1 = z;
        for (; i + 64 <= end; i += 64) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(q + i));
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + i + 32));
            b0 = _mm256_add_epi8(b0, u);
            b1 = _mm256_add_epi8(b1, v);
            w0 = _mm256_add_epi16(w0, _mm256_maddubs_epi16(u, u));
            w1 = _mm256_add_epi16(w1, _mm256_maddubs_epi16(v, v));
        }
        if (i < end) { /* the last 32 codes of n: one more round for b0 and w0 at most */
            __m256i u = _mm256_loadu_si256((const __m256i *)(q + i));
            b0 = _mm256_add_epi8(b0, u);
            w0 = _mm256_add_epi16(w0, _mm256_maddubs_epi16(u, u));
            i += 32;
        }
        *s = _mm256_add_epi64(*s, _mm256_add_epi64(_mm256_sad_epu8(b0, z), _mm256_sad_epu8(b1, z)));
        *s2 = _mm256_add_epi32(*s2, _mm256_add_epi32(_mm256_madd_epi16(w0, ones),
                                                     _mm256_madd_epi16(w1, ones)));
    }
}

/* 8-bit codes: the SSE2 way, twice as wide (pmaddubsw would need a signed operand, and
 * q * (q - 128) overflows its 16-bit pairs). */
S_AVX2 static void s_code_sums8_avx2(const uint8_t *q, size_t n, __m256i *s, __m256i *s2)
{
    const __m256i z = _mm256_setzero_si256(), low = _mm256_set1_epi16(0xff);
    for (size_t i = 0; i < n; i += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(q + i));
        __m256i even = _mm256_and_si256(v, low), odd = _mm256_srli_epi16(v, 8);
        *s = _mm256_add_epi64(*s, _mm256_sad_epu8(v, z));
        *s2 = _mm256_add_epi32(*s2, _mm256_add_epi32(_mm256_madd_epi16(even, even),
                                                     _mm256_madd_epi16(odd, odd)));
    }
}

S_AVX2 static mq_quant_sums_t s_code_sums_avx2(const uint8_t *q, size_t n, int K)
{
    __m256i s = _mm256_setzero_si256(), s2 = s;
    size_t whole = n / 32 * 32;
    if (K < 8)
        s_code_sums7_avx2(q, whole, K, &s, &s2);
    else
        s_code_sums8_avx2(q, whole, &s, &s2);
    mq_quant_sums_t t = s_code_sums_c(q + whole, n - whole, K);
    s_sums_out_avx2(s, s2, &t);
    _mm256_zeroupper();
    return t;
}

/* Stochastic quantize with the noise in registers: two generator steps (STEP) give the 32
 * uniforms of a step of s_quantize_avx2 (low halves for values 0-7 and 16-23, high halves for
 * 8-15 and 24-31, as s_noise_c orders them). Writing the noise to an array and reading it back
 * cost a good part of a stochastic encode with buckets of 512 (measured: bench/README.md).
 * For a kernel set of target TARGET whose generator step and 32-code pack are STEP and
 * PACK: s_quantize_gen_loop_<set>, the loop over whole
 * steps of 32 values with the noise drawn (NOISE) or 0.5, specialized by inlining, codes packed
 * to PK as well unless it is NULL, returning how many values it did; quantize_noise; and
 * quantize (the noise, when drawn beforehand into an array, read by s_quantize_array_loop_avx2). */
#define S_QUANTIZE_GEN(set, TARGET, STEP, PACK)                                                    \
    TARGET S_INLINE size_t s_quantize_gen_loop_##set(const float *x, size_t n, float lo,           \
                                                     float inv, float top, bool noise,             \
                                                     __m256i s[4], uint8_t *q, uint8_t *pk)        \
    {                                                                                              \
        const __m256 vlo = _mm256_set1_ps(lo), vinv = _mm256_set1_ps(inv),                         \
                     vtop = _mm256_set1_ps(top), half = _mm256_set1_ps(0.5f);                      \
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);                           \
        const int K = mq_quant_bits_of((uint32_t)top);                                             \
        size_t i = 0;                                                                              \
        for (; i + 32 <= n; i += 32, pk = pk ? pk + 4 * K : NULL) {                                \
            s_prefetch_ahead(x + i);                                                               \
            __m256 r0 = half, r1 = half, r2 = half, r3 = half;                                     \
            if (noise) {                                                                           \
                s_uniforms16_avx2(STEP(s), &r0, &r1);                                              \
                s_uniforms16_avx2(STEP(s), &r2, &r3);                                              \
            }                                                                                      \
            __m256i w =                                                                            \
                s_q32_avx2(x + i, vlo, vinv, r0, r1, r2, r3, vtop, noise, order, q + i, NULL, K);  \
            if (pk)                                                                                \
                PACK(w, pk, K);                                                                    \
        }                                                                                          \
        return i;                                                                                  \
    }                                                                                              \
                                                                                                   \
    TARGET static void s_quantize_noise_##set(const float *x, size_t n, float lo, float inv,       \
                                              float top, mq_quant_noise_t *g, uint8_t *q,          \
                                              uint8_t *pk)                                         \
    {                                                                                              \
        __m256i s[4];                                                                              \
        s_gen_load_avx2(g, s);                                                                     \
        size_t i = pk ? s_quantize_gen_loop_##set(x, n, lo, inv, top, true, s, q, pk)              \
                      : s_quantize_gen_loop_##set(x, n, lo, inv, top, true, s, q, NULL);           \
        s_gen_store_avx2(g, s);                                                                    \
        _mm256_zeroupper();                                                                        \
        if (i < n) /* never with PK */                                                             \
            s_quantize_noise_c(x + i, n - i, lo, inv, top, g, q + i, NULL);                        \
    }                                                                                              \
                                                                                                   \
    TARGET static void s_quantize_##set(const float *x, size_t n, float lo, float inv, float top,  \
                                        const float *noise, uint8_t *q, uint8_t *pk)               \
    {                                                                                              \
        size_t i;                                                                                  \
        if (noise)                                                                                 \
            i = pk ? s_quantize_array_loop_avx2(x, n, lo, inv, top, noise, q, pk, true)            \
                   : s_quantize_array_loop_avx2(x, n, lo, inv, top, noise, q, NULL, false);        \
        else                                                                                       \
            i = pk ? s_quantize_gen_loop_##set(x, n, lo, inv, top, false, NULL, q, pk)             \
                   : s_quantize_gen_loop_##set(x, n, lo, inv, top, false, NULL, q, NULL);          \
        _mm256_zeroupper();                                                                        \
        if (i < n) /* never with PK: n is then a multiple of 32 */                                 \
            s_quantize_sse2(x + i, n - i, lo, inv, top, noise ? noise + i : NULL, q + i, NULL);    \
    }

S_QUANTIZE_GEN(avx2, S_AVX2, s_noise_step_avx2, s_pack32_avx2)

/* As s_minmax_avx2, of the sums a[i] + b[i]. */
S_AVX2 static bool s_minmax_sum_avx2(const float *a, const float *b, size_t n, float *lo,
                                     float *hi)
{
    return s_minmax_either_avx2(a, b, n, lo, hi);
}

S_AVX2 static void s_add_avx2(float *dst, const float *src, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s_prefetch_ahead_l2(dst + i);
        s_prefetch_ahead_l2(src + i);
        for (int k = 0; k < 32; k += 8)
            _mm256_storeu_ps(dst + i + k, _mm256_add_ps(_mm256_loadu_ps(dst + i + k),
                                                        _mm256_loadu_ps(src + i + k)));
    }
    _mm256_zeroupper();
    s_add_sse2(dst + i, src + i, n - i);
}

/* Eight values of error feedback: v = r + g (r itself when G is NULL) stored back into r after its
 * code k is taken (s_q8_avx2 with noise R, clamped with noise only), then r = v + the decoded
 * value, as s_deq8_avx2 computes it at scale -1. With at most eight codes (SMALL) the decoded value
 * is looked up in TBL, which holds s_deq8_avx2's value of each code: one permute in place of five
 * operations. */
S_AVX2 S_INLINE __m256i s_ef8_avx2(const float *g, float *r, __m256 lo, __m256 inv, __m256 rn,
                                   bool gen, __m256 top, __m256 a, __m256 b, __m256 dtop,
                                   __m256i lev, bool small, __m256 tbl)
{
    __m256 v = g ? _mm256_add_ps(_mm256_loadu_ps(r), _mm256_loadu_ps(g)) : _mm256_loadu_ps(r);
    __m256i k = s_q8_avx2(v, lo, inv, rn, top, gen);
    __m256 x;
    if (small) {
        x = _mm256_permutevar8x32_ps(tbl, k);
    } else {
        x = _mm256_add_ps(a, _mm256_mul_ps(_mm256_cvtepi32_ps(k), b));
        x = _mm256_blendv_ps(x, dtop, _mm256_castsi256_ps(_mm256_cmpeq_epi32(k, lev)));
    }
    _mm256_storeu_ps(r, _mm256_add_ps(v, x));
    return k;
}

/* The constants of the fused error-feedback kernels. */
typedef struct {
    __m256 lo, inv, top, a, b, dtop, half, tbl;
    __m256i lev, order;
    bool small; /* at most eight codes: tbl holds their decoded values */
    int K;      /* bits a code */
} s_ef_avx2_t;

S_AVX2 S_INLINE s_ef_avx2_t s_ef_consts_avx2(float lo, float inv, float top,
                                             const mq_quant_deq_t *d)
{
    s_ef_avx2_t c = {
        .lo = _mm256_set1_ps(lo),
        .inv = _mm256_set1_ps(inv),
        .top = _mm256_set1_ps(top),
        .a = _mm256_set1_ps(d->a),
        .b = _mm256_set1_ps(d->b),
        .dtop = _mm256_set1_ps(d->top),
        .half = _mm256_set1_ps(0.5f),
        .lev = _mm256_set1_epi32((int)d->levels),
        .order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
        .small = d->levels < 8,
        .K = mq_quant_bits_of(d->levels),
    };
    /* each code's value by s_deq8_avx2's operations, so the lookup gives the same bits */
    __m256i k = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 x = _mm256_add_ps(c.a, _mm256_mul_ps(_mm256_cvtepi32_ps(k), c.b));
    c.tbl = _mm256_blendv_ps(x, c.dtop, _mm256_castsi256_ps(_mm256_cmpeq_epi32(k, c.lev)));
    return c;
}

/* Thirty-two values of error feedback (the generators S stepped twice when GEN), their codes
 * packed to PK as well unless it is NULL. */
S_AVX2 S_INLINE void s_ef32_avx2(const float *g, float *r, const s_ef_avx2_t *c, bool gen,
                                 bool small, __m256i s[4], uint8_t *q, uint8_t *pk)
{
    __m256 r0 = c->half, r1 = c->half, r2 = c->half, r3 = c->half;
    if (gen) {
        s_uniforms16_avx2(s_noise_step_avx2(s), &r0, &r1);
        s_uniforms16_avx2(s_noise_step_avx2(s), &r2, &r3);
    }
#define S_EF8(o, rn)                                                                               \
    s_ef8_avx2(g ? g + (o) : NULL, r + (o), c->lo, c->inv, rn, gen, c->top, c->a, c->b, c->dtop,   \
               c->lev, small, c->tbl)
    __m256i k0 = S_EF8(0, r0), k1 = S_EF8(8, r1), k2 = S_EF8(16, r2), k3 = S_EF8(24, r3);
#undef S_EF8
    __m256i w = _mm256_packus_epi16(_mm256_packs_epi32(k0, k1), _mm256_packs_epi32(k2, k3));
    w = _mm256_permutevar8x32_epi32(w, c->order);
    _mm256_storeu_si256((__m256i *)q, w);
    if (pk)
        s_pack32_avx2(w, pk, c->K);
}

/* PK past the first I values' codes packed to the bits of LEVELS (I a multiple of 8), or
 * NULL. */
static inline uint8_t *s_pk_at(uint8_t *pk, size_t i, uint32_t levels)
{
    return pk ? pk + i / 8 * (size_t)mq_quant_bits_of(levels) : NULL;
}

/* The error-feedback loop over whole steps of 32 values, specialized by inlining for GEN (noise
 * drawn), SMALL (codes looked up), T (the next bucket's range scanned beside, over
 * na/nb[0..nn)) and G NULL (in place: r holds the sums, and nb is NULL too); codes packed to PK
 * too unless it is NULL (a branch every 32 values that always goes the same way); returns how
 * many values it did. */
S_AVX2 S_INLINE size_t s_ef_loop_avx2(const float *g, float *r, size_t n, const s_ef_avx2_t *c,
                                      bool gen, bool small, __m256i s[4], uint8_t *q, uint8_t *pk,
                                      s_scan_avx2_t *t, const float *na, const float *nb, size_t nn)
{
    size_t i = 0;
    if (t) {
        for (; i + 32 <= n && i + 32 <= nn; i += 32, pk = pk ? pk + 4 * c->K : NULL) {
            s_scan32_avx2(t, na + i, nb ? nb + i : NULL);
            s_ef32_avx2(g ? g + i : NULL, r + i, c, gen, small, s, q + i, pk);
        }
    } else {
        for (; i + 32 <= n; i += 32, pk = pk ? pk + 4 * c->K : NULL) {
            if (g)
                s_prefetch_ahead_l2(g + i);
            s_prefetch_ahead_l2(r + i);
            s_ef32_avx2(g ? g + i : NULL, r + i, c, gen, small, s, q + i, pk);
        }
    }
    return i;
}

/* The generator's state is loaded into registers only when noise is drawn. */
S_AVX2 S_INLINE size_t s_ef_gen_avx2(const float *g, float *r, size_t n, const s_ef_avx2_t *c,
                                     mq_quant_noise_t *gen, uint8_t *q, uint8_t *pk,
                                     s_scan_avx2_t *t, const float *na, const float *nb, size_t nn)
{
    size_t i;
    if (gen) {
        __m256i s[4];
        s_gen_load_avx2(gen, s);
        i = c->small ? s_ef_loop_avx2(g, r, n, c, true, true, s, q, pk, t, na, nb, nn)
                     : s_ef_loop_avx2(g, r, n, c, true, false, s, q, pk, t, na, nb, nn);
        s_gen_store_avx2(gen, s);
    } else {
        i = c->small ? s_ef_loop_avx2(g, r, n, c, false, true, NULL, q, pk, t, na, nb, nn)
                     : s_ef_loop_avx2(g, r, n, c, false, false, NULL, q, pk, t, na, nb, nn);
    }
    return i;
}

/* In place (G NULL) gets loops of its own, with no gradient to load and no sum to form. */
S_AVX2 S_INLINE size_t s_ef_any_avx2(const float *g, float *r, size_t n, const s_ef_avx2_t *c,
                                     mq_quant_noise_t *gen, uint8_t *q, uint8_t *pk,
                                     s_scan_avx2_t *t, const float *na, const float *nb, size_t nn)
{
    return g ? s_ef_gen_avx2(g, r, n, c, gen, q, pk, t, na, nb, nn)
             : s_ef_gen_avx2(NULL, r, n, c, gen, q, pk, t, na, NULL, nn);
}

/* The fused error-feedback kernel: each value is loaded once and stored once, its code
 * packed to a byte as s_quantize_avx2 does (and to K bits when PK is given). */
S_AVX2 static void s_quantize_ef_avx2(const float *g, float *r, size_t n, float lo, float inv,
                                      float top, const mq_quant_deq_t *d, mq_quant_noise_t *gen,
                                      uint8_t *q, uint8_t *pk)
{
    const s_ef_avx2_t c = s_ef_consts_avx2(lo, inv, top, d);
    size_t i = s_ef_any_avx2(g, r, n, &c, gen, q, pk, NULL, NULL, NULL, 0);
    _mm256_zeroupper();
    if (i < n) /* never with PK: n is then a multiple of 32 */
        s_quantize_ef_c(g ? g + i : NULL, r + i, n - i, lo, inv, top, d, gen, q + i, NULL);
}

/* quantize_ef over this bucket's run while the next bucket's range is scanned in the same
 * loop: the next bucket's loads from memory overlap this one's arithmetic, where the two
 * one after the other leave the memory idle during the arithmetic. */
S_AVX2 static bool s_quantize_ef_scan_avx2(const float *g, float *r, size_t n, float lo, float inv,
                                           float top, const mq_quant_deq_t *d,
                                           mq_quant_noise_t *gen, uint8_t *q, uint8_t *pk,
                                           const float *na, const float *nb, size_t nn, float *nlo,
                                           float *nhi)
{
    const s_ef_avx2_t c = s_ef_consts_avx2(lo, inv, top, d);
    s_scan_avx2_t t = s_scan_start_avx2(na, nb);
    size_t i = s_ef_any_avx2(g, r, n, &c, gen, q, pk, &t, na, nb, nn);
    bool ok = s_scan_end_avx2(&t, na, nb, i, nn, nlo, nhi);
    if (i < n)
        s_quantize_ef_avx2(g ? g + i : NULL, r + i, n - i, lo, inv, top, d, gen, q + i,
                           s_pk_at(pk, i, d->levels));
    return ok;
}

static const mq_quant_kernels_t s_kernels_avx2 = {
    "avx2",        s_minmax_avx2,      s_quantize_avx2,         s_noise_avx2,
    s_pack_avx2,   s_unpack_avx2,      s_dequantize_avx2,       s_dequantize_stream_avx2,
    s_stream_avx2, s_code_sums_avx2,   s_quantize_noise_avx2,   s_minmax_sum_avx2,
    s_add_avx2,    s_quantize_ef_avx2, s_quantize_ef_scan_avx2,
};

/* ---- AVX-512: error feedback ------------------------------------------------------------ */

/* Error feedback's walk with 16 values a vector. Bound by its instructions on CPUs with full
 * 512-bit units (measured in bench/README.md), it halves them; the plain and stochastic encodes
 * follow below, and every other loop is the AVX2 one. Bit for bit the AVX2 results: the same
 * operations in the same order a value (no FMA), and the noise from the same eight generators,
 * two steps a 32 values in the same order. Codes become bytes by AVX2's saturating packs; each
 * is in 0..levels already: with v >= lo (lo is the least of the values) y is at least 0, and y
 * stays below levels + 1 by the clamp with noise, by quantize_ef's contract without (a NaN,
 * which fails the encode, packs to 0). */
#define S_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2")))

/* One step of the eight generators, as s_noise_step_avx2 (xoshiro128**): the state update
 * s2 ^= s0, s3 ^= s1, s1 ^= s2, s0 ^= s3, s2 ^= t, s3 = rotl(s3, 11) written as three-way
 * xors of the old words. */
S_AVX512 S_INLINE __m256i s_noise_step_avx512(__m256i s[4])
{
    __m256i x = _mm256_rol_epi32(_mm256_add_epi32(_mm256_slli_epi32(s[1], 2), s[1]), 7);
    __m256i r = _mm256_add_epi32(_mm256_slli_epi32(x, 3), x), t = _mm256_slli_epi32(s[1], 9);
    const __m256i s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
    s[0] = _mm256_ternarylogic_epi32(s0, s3, s1, 0x96); /* 0x96: a ^ b ^ c */
    s[1] = _mm256_ternarylogic_epi32(s1, s2, s0, 0x96);
    s[2] = _mm256_ternarylogic_epi32(s2, s0, t, 0x96);
    s[3] = _mm256_rol_epi32(_mm256_xor_si256(s3, s1), 11);
    return r;
}

/* Thirty-two codes W (bytes in order, each below 2^K, K < 8) packed as pack() lays them out at
 * DST: 2 bits with a narrowing move (one instruction, where AVX2 gathers the bytes with three),
 * other widths as s_pack32_avx2. */
S_AVX512 S_INLINE void s_pack32_avx512(__m256i w, uint8_t *dst, int K)
{
    if (K == 2)
        _mm_storel_epi64((__m128i *)dst, _mm256_cvtepi32_epi8(s_quads_avx2(s_pairs_avx2(w, 2), 2)));
    else
        s_pack32_avx2(w, dst, K);
}

typedef struct {
    __m512 lo, inv, top, a, b, dtop, half, tbl;
    __m512i lev;
    bool small; /* at most 16 codes: tbl holds their decoded values */
    int K;      /* bits a code */
} s_ef_avx512_t;

/* The decoded values of codes K at scale -1, as s_deq8_avx2 computes them. */
S_AVX512 S_INLINE __m512 s_deq16_avx512(const s_ef_avx512_t *c, __m512i k)
{
    __m512 x = _mm512_add_ps(c->a, _mm512_mul_ps(_mm512_cvtepi32_ps(k), c->b));
    return _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(k, c->lev), x, c->dtop);
}

S_AVX512 S_INLINE s_ef_avx512_t s_ef_consts_avx512(float lo, float inv, float top,
                                                   const mq_quant_deq_t *d)
{
    s_ef_avx512_t c = {
        .lo = _mm512_set1_ps(lo),
        .inv = _mm512_set1_ps(inv),
        .top = _mm512_set1_ps(top),
        .a = _mm512_set1_ps(d->a),
        .b = _mm512_set1_ps(d->b),
        .dtop = _mm512_set1_ps(d->top),
        .half = _mm512_set1_ps(0.5f),
        .lev = _mm512_set1_epi32((int)d->levels),
        .small = d->levels < 16,
    };
    c.K = mq_quant_bits_of(d->levels);
    c.tbl =
        s_deq16_avx512(&c, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    return c;
}

/* The codes of the sixteen values V with the offsets R, as s_q8_avx2: CLAMP to TOP with noise
 * only. */
S_AVX512 S_INLINE __m512i s_q16_avx512(__m512 v, __m512 lo, __m512 inv, __m512 r, __m512 top,
                                       bool clamp)
{
    __m512 y = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(v, lo), inv), r);
    return _mm512_cvttps_epi32(clamp ? _mm512_min_ps(y, top) : y);
}

/* Sixteen values of error feedback with noise RN: as s_ef8_avx2 (G NULL: in place), the codes
 * returned as 32-bit lanes, and no clamp when rounding to nearest. With at most 16 codes (SMALL)
 * the decoded value is one permute from the table of them. */
S_AVX512 S_INLINE __m512i s_ef16_avx512(const float *g, float *r, const s_ef_avx512_t *c, __m512 rn,
                                        bool gen, bool small)
{
    __m512 v = g ? _mm512_add_ps(_mm512_loadu_ps(r), _mm512_loadu_ps(g)) : _mm512_loadu_ps(r);
    __m512i k = s_q16_avx512(v, c->lo, c->inv, rn, c->top, gen);
    __m512 x = small ? _mm512_permutexvar_ps(k, c->tbl) : s_deq16_avx512(c, k);
    _mm512_storeu_ps(r, _mm512_add_ps(v, x));
    return k;
}

/* Four vectors of 16 codes (0-255 in 32-bit lanes) as 64 bytes in order: two packs leave
 * each 128-bit lane holding four codes of each vector, which one permute of 32-bit groups
 * puts back in order. */
S_AVX512 S_INLINE __m512i s_codes64_avx512(__m512i k0, __m512i k1, __m512i k2, __m512i k3)
{
    __m512i b = _mm512_packus_epi16(_mm512_packs_epi32(k0, k1), _mm512_packs_epi32(k2, k3));
    return _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), b);
}

/* s_pairs_avx2 and s_quads_avx2 on 64 codes. */
S_AVX512 S_INLINE __m512i s_pairs_avx512(__m512i w, int K)
{
    return _mm512_maddubs_epi16(w, _mm512_set1_epi16((short)(1 | (1 << (8 + K)))));
}

S_AVX512 S_INLINE __m512i s_quads_avx512(__m512i p, int K)
{
    return _mm512_madd_epi16(p, _mm512_set1_epi32(1 | (1 << (16 + 2 * K))));
}

/* 64 byte codes of K < 8 bits packed to DST (8K bytes), as s_pack32_avx2 packs 32: at 1, 2
 * and 4 bits on the whole vector, where a byte holds 8, 4 or 2 codes; else 32 at a time. */
S_AVX512 S_INLINE void s_pack64_avx512(__m512i w, uint8_t *dst, int K)
{
    if (K == 1) {
        uint64_t m = _mm512_movepi8_mask(_mm512_slli_epi16(w, 7));
        memcpy(dst, &m, sizeof m);
    } else if (K == 2) {
        _mm_storeu_si128((__m128i *)dst,
                         _mm512_cvtepi32_epi8(s_quads_avx512(s_pairs_avx512(w, 2), 2)));
    } else if (K == 4) {
        _mm256_storeu_si256((__m256i *)dst, _mm512_cvtepi16_epi8(s_pairs_avx512(w, 4)));
    } else {
        s_pack32_avx2(_mm512_castsi512_si256(w), dst, K);
        s_pack32_avx2(_mm512_extracti64x4_epi64(w, 1), dst + 4 * K, K);
    }
}

/* Two generator steps' 32 uniforms as two vectors of 16: values 0-15 and 16-31. */
S_AVX512 S_INLINE void s_noise32_avx512(__m256i s[4], __m512 *n0, __m512 *n1)
{
    __m256 r0, r1, r2, r3;
    s_uniforms16_avx2(s_noise_step_avx512(s), &r0, &r1);
    s_uniforms16_avx2(s_noise_step_avx512(s), &r2, &r3);
    *n0 = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(r0)), _mm256_castps_pd(r1), 1));
    *n1 = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(r2)), _mm256_castps_pd(r3), 1));
}

/* Sixty-four values of error feedback, their codes stored to Q and packed to PK unless it is
 * NULL. */
S_AVX512 S_INLINE void s_ef64_avx512(const float *g, float *r, const s_ef_avx512_t *c, bool gen,
                                     bool small, __m256i s[4], uint8_t *q, uint8_t *pk)
{
    __m512 n0 = c->half, n1 = c->half, n2 = c->half, n3 = c->half;
    if (gen) {
        s_noise32_avx512(s, &n0, &n1);
        s_noise32_avx512(s, &n2, &n3);
    }
    __m512i k0 = s_ef16_avx512(g, r, c, n0, gen, small);
    __m512i k1 = s_ef16_avx512(g ? g + 16 : NULL, r + 16, c, n1, gen, small);
    __m512i k2 = s_ef16_avx512(g ? g + 32 : NULL, r + 32, c, n2, gen, small);
    __m512i k3 = s_ef16_avx512(g ? g + 48 : NULL, r + 48, c, n3, gen, small);
    __m512i w = s_codes64_avx512(k0, k1, k2, k3);
    _mm512_storeu_si512(q, w);
    if (pk)
        s_pack64_avx512(w, pk, c->K);
}

/* The walk, inlined twice: with a gradient G to add, and in place (G NULL). */
S_AVX512 S_INLINE void s_ef_walk_avx512(const float *g, float *r, size_t n, float lo, float inv,
                                        float top, const mq_quant_deq_t *d, mq_quant_noise_t *gen,
                                        uint8_t *q, uint8_t *pk)
{
    const s_ef_avx512_t c = s_ef_consts_avx512(lo, inv, top, d);
    __m256i s[4];
    s_gen_load_avx2(gen, s);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        if (g) {
            s_prefetch_ahead_l2(g + i);
            s_prefetch_ahead_l2(g + i + 32);
        }
        s_prefetch_ahead_l2(r + i);
        s_prefetch_ahead_l2(r + i + 32);
        s_ef64_avx512(g ? g + i : NULL, r + i, &c, gen != NULL, c.small, s, q + i,
                      s_pk_at(pk, i, d->levels));
    }
    s_gen_store_avx2(gen, s);
    _mm256_zeroupper();
    if (i < n)
        s_quantize_ef_avx2(g ? g + i : NULL, r + i, n - i, lo, inv, top, d, gen, q + i,
                           s_pk_at(pk, i, d->levels));
}

S_AVX512 static void s_quantize_ef_avx512(const float *g, float *r, size_t n, float lo, float inv,
                                          float top, const mq_quant_deq_t *d, mq_quant_noise_t *gen,
                                          uint8_t *q, uint8_t *pk)
{
    if (g)
        s_ef_walk_avx512(g, r, n, lo, inv, top, d, gen, q, pk);
    else
        s_ef_walk_avx512(NULL, r, n, lo, inv, top, d, gen, q, pk);
}

/* Sixteen values of a range scan: na[i] + nb[i], or na[i] alone (NB NULL). */
S_AVX512 S_INLINE __m512 s_scan_load_avx512(const float *na, const float *nb, size_t i)
{
    __m512 u = _mm512_loadu_ps(na + i);
    return nb ? _mm512_add_ps(u, _mm512_loadu_ps(nb + i)) : u;
}

/* The walk and scan, inlined twice: with a gradient G to add, and in place (G and NB NULL). */
S_AVX512 S_INLINE bool s_ef_scan_walk_avx512(const float *g, float *r, size_t n, float lo,
                                             float inv, float top, const mq_quant_deq_t *d,
                                             mq_quant_noise_t *gen, uint8_t *q, uint8_t *pk,
                                             const float *na, const float *nb, size_t nn,
                                             float *nlo, float *nhi)
{
    const s_ef_avx512_t c = s_ef_consts_avx512(lo, inv, top, d);
    __m256i s[4];
    s_gen_load_avx2(gen, s);
    const __m512 f = _mm512_set1_ps(nb ? na[0] + nb[0] : na[0]);
    __m512 mn0 = f, mn1 = f, mx0 = f, mx1 = f;
    __mmask16 bad = 0;
    size_t i = 0;
    for (; i + 64 <= n && i + 64 <= nn; i += 64) {
        s_prefetch_ahead_l2(na + i);
        s_prefetch_ahead_l2(na + i + 32);
        if (nb) {
            s_prefetch_ahead_l2(nb + i);
            s_prefetch_ahead_l2(nb + i + 32);
        }
        __m512 u = s_scan_load_avx512(na, nb, i), v = s_scan_load_avx512(na, nb, i + 16);
        __m512 w = s_scan_load_avx512(na, nb, i + 32), z = s_scan_load_avx512(na, nb, i + 48);
        mn0 = _mm512_min_ps(_mm512_min_ps(u, v), mn0);
        mn1 = _mm512_min_ps(_mm512_min_ps(w, z), mn1);
        mx0 = _mm512_max_ps(_mm512_max_ps(u, v), mx0);
        mx1 = _mm512_max_ps(_mm512_max_ps(w, z), mx1);
        bad |= _mm512_cmp_ps_mask(u, v, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(w, z, _CMP_UNORD_Q);
        s_ef64_avx512(g ? g + i : NULL, r + i, &c, gen != NULL, c.small, s, q + i,
                      s_pk_at(pk, i, d->levels));
    }
    s_gen_store_avx2(gen, s);
    float l = _mm512_reduce_min_ps(_mm512_min_ps(mn0, mn1)),
          h = _mm512_reduce_max_ps(_mm512_max_ps(mx0, mx1));
    _mm256_zeroupper();
    bool ok = !bad;
    if (i < nn) { /* the rest of the next bucket's range */
        float rl, rh;
        ok = (nb ? s_minmax_sum_avx2(na + i, nb + i, nn - i, &rl, &rh)
                 : s_minmax_avx2(na + i, nn - i, &rl, &rh)) &&
             ok;
        l = rl < l ? rl : l;
        h = rh > h ? rh : h;
    }
    *nlo = l;
    *nhi = h;
    if (i < n)
        s_quantize_ef_avx2(g ? g + i : NULL, r + i, n - i, lo, inv, top, d, gen, q + i,
                           s_pk_at(pk, i, d->levels));
    return ok && l - l == 0.0f && h - h == 0.0f;
}

/* As s_quantize_ef_scan_avx2: the next bucket's range (the extremes of na + nb, or of na alone
 * in place, and whether one is NaN) taken 64 values a step in the same loop. */
S_AVX512 static bool s_quantize_ef_scan_avx512(const float *g, float *r, size_t n, float lo,
                                               float inv, float top, const mq_quant_deq_t *d,
                                               mq_quant_noise_t *gen, uint8_t *q, uint8_t *pk,
                                               const float *na, const float *nb, size_t nn,
                                               float *nlo, float *nhi)
{
    return g ? s_ef_scan_walk_avx512(g, r, n, lo, inv, top, d, gen, q, pk, na, nb, nn, nlo, nhi)
             : s_ef_scan_walk_avx512(NULL, r, n, lo, inv, top, d, gen, q, pk, na, NULL, nn, nlo,
                                     nhi);
}

/* ---- AVX-512: the plain and stochastic encodes ---------------------------------------------
 * The AVX2 loops on 256-bit registers, with three things AVX-512 adds to them (VL: its
 * instructions on 256-bit registers, which run at full rate where 512-bit ones take two
 * passes, as on Zen 4): the generator's rotates in one instruction and its xors three ways
 * (s_noise_step_avx512, above), and 2-bit codes gathered with a narrowing move
 * (s_pack32_avx512). The same operations on the same values otherwise: the same codes. */

S_QUANTIZE_GEN(avx512, S_AVX512, s_noise_step_avx512, s_pack32_avx512)

static const mq_quant_kernels_t s_kernels_avx512 = {
    "avx512",      s_minmax_avx2,        s_quantize_avx512,         s_noise_avx2,
    s_pack_avx2,   s_unpack_avx2,        s_dequantize_avx2,         s_dequantize_stream_avx2,
    s_stream_avx2, s_code_sums_avx2,     s_quantize_noise_avx512,   s_minmax_sum_avx2,
    s_add_avx2,    s_quantize_ef_avx512, s_quantize_ef_scan_avx512,
};

/* ---- AVX-512 on 512-bit registers: the avx512w set -----------------------------------------
 * For CPUs that run 512-bit operations at full width (kernels.c chooses it on AMD's Zen 5,
 * whose vector pipes are 512 bits wide): the plain and stochastic encodes take 64 values a
 * step on 512-bit registers, with half the quantize, conversion and gather operations a value
 * of the 256-bit loops above (the generator's steps stay eight lanes wide). Zen 4 runs a
 * 512-bit operation in two halves, and on an Intel Xeon with full-width units (family 6 model
 * 207) a 512-bit quantize measured no faster, likely because its 512-bit operations take two
 * of the three ports 256-bit ones use (bench/README.md); so the avx512 set keeps the 256-bit
 * loops. Error feedback rounding to nearest walks with the AVX2 loop, which measured faster
 * than the 512-bit one on Zen 5 from memory; with noise, with the 512-bit one above. The same
 * operations a value as the AVX2 loops and the noise of the same generator steps in the same
 * order: the same codes. */

/* The 64 uniforms of four generator steps (two steps' 32 as s_quantize_gen_loop draws them,
 * twice) as four vectors in value order: a step's outputs give values 0-7 in their low halves
 * and 8-15 in their high halves (s_noise_c), so two steps side by side give [0-7 | 16-23] and
 * [8-15 | 24-31], and two 128-bit-lane shuffles put them in order. */
S_AVX512 S_INLINE void s_uniforms64_avx512(__m256i s[4], __m512 u[4])
{
    const __m512 unit = _mm512_set1_ps(0x1.0p-16f);
    const __m512i low16 = _mm512_set1_epi32(0xffff);
    for (int h = 0; h < 2; h++) {
        __m256i a = s_noise_step_avx512(s), b = s_noise_step_avx512(s);
        __m512i r = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(r, low16)), unit);
        __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(r, 16)), unit);
        u[2 * h] = _mm512_shuffle_f32x4(lo, hi, 0x44);     /* lanes 0, 1 of each: values 0-15 */
        u[2 * h + 1] = _mm512_shuffle_f32x4(lo, hi, 0xee); /* lanes 2, 3: values 16-31 */
    }
}

/* The quantize loop over whole steps of 64 values, with the noise drawn from S (NOISE) or 0.5,
 * codes stored to Q and packed to PK unless it is NULL; returns how many values it did. */
S_AVX512 S_INLINE size_t s_quantize_loop_avx512w(const float *x, size_t n, float lo, float inv,
                                                 float top, bool noise, __m256i s[4], uint8_t *q,
                                                 uint8_t *pk)
{
    const __m512 vlo = _mm512_set1_ps(lo), vinv = _mm512_set1_ps(inv), vtop = _mm512_set1_ps(top);
    const int K = mq_quant_bits_of((uint32_t)top);
    size_t i = 0;
    for (; i + 64 <= n; i += 64, pk = pk ? pk + 8 * K : NULL) {
        s_prefetch_ahead(x + i);
        s_prefetch_ahead(x + i + 32);
        __m512 u[4];
        if (noise)
            s_uniforms64_avx512(s, u);
        else
            u[0] = u[1] = u[2] = u[3] = _mm512_set1_ps(0.5f);
        __m512i k0 = s_q16_avx512(_mm512_loadu_ps(x + i), vlo, vinv, u[0], vtop, noise);
        __m512i k1 = s_q16_avx512(_mm512_loadu_ps(x + i + 16), vlo, vinv, u[1], vtop, noise);
        __m512i k2 = s_q16_avx512(_mm512_loadu_ps(x + i + 32), vlo, vinv, u[2], vtop, noise);
        __m512i k3 = s_q16_avx512(_mm512_loadu_ps(x + i + 48), vlo, vinv, u[3], vtop, noise);
        __m512i w = s_codes64_avx512(k0, k1, k2, k3);
        _mm512_storeu_si512(q + i, w);
        if (pk)
            s_pack64_avx512(w, pk, K);
    }
    return i;
}

/* A 32-value rest (n is a multiple of 32 when PK is given) goes to the 256-bit loop, whose
 * generator steps follow on. */
S_AVX512 static void s_quantize_noise_avx512w(const float *x, size_t n, float lo, float inv,
                                              float top, mq_quant_noise_t *g, uint8_t *q,
                                              uint8_t *pk)
{
    __m256i s[4];
    s_gen_load_avx2(g, s);
    size_t i = pk ? s_quantize_loop_avx512w(x, n, lo, inv, top, true, s, q, pk)
                  : s_quantize_loop_avx512w(x, n, lo, inv, top, true, s, q, NULL);
    i += s_quantize_gen_loop_avx512(x + i, n - i, lo, inv, top, true, s, q + i,
                                    s_pk_at(pk, i, (uint32_t)top));
    s_gen_store_avx2(g, s);
    _mm256_zeroupper();
    if (i < n) /* never with PK */
        s_quantize_noise_c(x + i, n - i, lo, inv, top, g, q + i, NULL);
}

/* Noise drawn beforehand (NOISE) goes to the avx512 set's loop. */
S_AVX512 static void s_quantize_avx512w(const float *x, size_t n, float lo, float inv, float top,
                                        const float *noise, uint8_t *q, uint8_t *pk)
{
    size_t i = 0;
    if (!noise) {
        i = pk ? s_quantize_loop_avx512w(x, n, lo, inv, top, false, NULL, q, pk)
               : s_quantize_loop_avx512w(x, n, lo, inv, top, false, NULL, q, NULL);
        _mm256_zeroupper();
    }
    if (i < n)
        s_quantize_avx512(x + i, n - i, lo, inv, top, noise, q + i, s_pk_at(pk, i, (uint32_t)top));
}

static void s_quantize_ef_avx512w(const float *g, float *r, size_t n, float lo, float inv,
                                  float top, const mq_quant_deq_t *d, mq_quant_noise_t *gen,
                                  uint8_t *q, uint8_t *pk)
{
    (gen ? s_quantize_ef_avx512 : s_quantize_ef_avx2)(g, r, n, lo, inv, top, d, gen, q, pk);
}

static bool s_quantize_ef_scan_avx512w(const float *g, float *r, size_t n, float lo, float inv,
                                       float top, const mq_quant_deq_t *d, mq_quant_noise_t *gen,
                                       uint8_t *q, uint8_t *pk, const float *na, const float *nb,
                                       size_t nn, float *nlo, float *nhi)
{
    return (gen ? s_quantize_ef_scan_avx512 : s_quantize_ef_scan_avx2)(
        g, r, n, lo, inv, top, d, gen, q, pk, na, nb, nn, nlo, nhi);
}

static const mq_quant_kernels_t s_kernels_avx512w = {
    "avx512w",     s_minmax_avx2,         s_quantize_avx512w,         s_noise_avx2,
    s_pack_avx2,   s_unpack_avx2,         s_dequantize_avx2,          s_dequantize_stream_avx2,
    s_stream_avx2, s_code_sums_avx2,      s_quantize_noise_avx512w,   s_minmax_sum_avx2,
    s_add_avx2,    s_quantize_ef_avx512w, s_quantize_ef_scan_avx512w,
};

#endif
