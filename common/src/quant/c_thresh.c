/* The `thresh` codec: an unbiased dead-zone threshold quantizer, for QCMD/QRDA adagrad. Values
 * at or above a threshold tau in magnitude travel exactly; a smaller one becomes tau*sign(g)
 * with probability |g|/tau, else 0. The payload lists the nonzeros sparsely, or densely when
 * that is smaller.
 *
 * Method: Xu, Wangni, Zhang, Ye, Wu, Zhao, "Quantized Adaptive Subgradient Algorithms and
 * Their Applications" (arXiv 2208.05631, 2022) quantize gradients with "a threshold
 * quantization strategy with a relatively small error"; the quantizer itself is not public
 * (docs/seed-methods.md section 2). This is our reconstruction: the unbiased dead-zone
 * quantizer of Wangni, Wang, Liu, Zhang, "Gradient Sparsification for Communication-
 * Efficient Distributed Optimization", NeurIPS 2018 (Wangni being a co-author of both):
 *
 *     Q(g)_i = g_i                          if |g_i| >= tau
 *            = tau * sign(g_i)  w.p. |g_i|/tau, else 0   otherwise
 *
 * E[Q(g)_i] = g_i, and the variance of a small value is |g_i| (tau - |g_i|) <= tau^2 / 4.
 *
 * Spec: thresh[:tau=T | :k=K]. No bit-width. Stochastic: needs ctx->rng.
 * Parameter words: param[0] = T as float bits (0: not given); param[1] = K as float bits (0:
 * the default 2); one of them at most; the others are 0. tau = T when given, else
 * tau = K * RMS(g) = K * sqrt(sum g_i^2 / n) over the segment.
 * State: none.
 * Payload (at most 12 + 4n bytes):
 *     [0, 4)   tau, little-endian float32;
 *     [4, 12)  a little-endian u64: bits 0-61 = E, the number of exact values; bits 62-63 =
 *              the format: 0 sparse, 1 dense, 2 raw;
 *     then, sparse: one LEB128 varint per nonzero, in index order, (gap << 2) | code, gap =
 *              index - (previous index + 1) (the first: the index itself), code 1 = +tau,
 *              2 = -tau, 3 = the next exact value; shortest form;
 *           dense: ceil(n/4) bytes of 2-bit codes, value i at bits 2(i%4) of byte i/4, code 0
 *              = 0 and 1..3 as above; unused high bits 0;
 *     and the E exact values as float32, in index order, ending the payload (sparse, dense);
 *           raw (E = 0): the n decoded values as float32.
 *
 * Choices:
 * - The default K = 2. For a Gaussian gradient it sends about 4.6% of the values exactly and
 *   34% as +-tau: 39% nonzero, about 3.5 bits a value in the dense format, and a variance
 *   of 0.64 ||g||^2 (K = 1: 63% nonzero, 12 bits a value, 0.12; K = 3: 27%, 2.1 bits, 1.4).
 *   Real gradients are heavier-tailed (a Laplace one: 33% nonzero, 0.56), so the payload is
 *   sparser still. The bound tau^2/4 a value is K^2/4 ||g||^2 / n = ||g||^2 / n at K = 2.
 * - g_i = 0 always gives 0, also when tau = 0 (a zero gradient): a nonzero g_i is then exact.
 * - The randomness: eight xoshiro128** streams side by side, seeded from ctx->rng at each
 *   encode; value i takes lane i % 8 of step i / 8. A payload depends only on that seed,
 *   and a copy of the streams replays the draws when the raw format has to be written.
 *   u_i has 23 bits; Q sends tau*sign(g_i) iff u_i * tau < |g_i| (a bias below 2^-23 of
 *   tau).
 * - The format is whichever is smallest for this payload: sparse (1 byte a nonzero for gaps
 *   below 32), dense (2 bits a value) or raw (when almost every value is exact; ties go to
 *   dense). The encode writes the dense form into dst and counts its nonzeros; when they
 *   are fewer than the dense bytes it measures the sparse list (a step per 32 codes) and,
 *   if shorter, converts in place; raw replays the draws. max_size = 12 + 4n is the raw
 *   size, which no payload exceeds.
 * - Reply: the same codec. The server's mean of P such vectors has up to P times as many
 *   nonzeros with arbitrary values; an exact sparse reply would grow with P, while
 *   re-thresholding it with the server's own random generator (tau from the mean's RMS, or
 *   T) keeps the reply as small as a push and keeps it unbiased: E[Q(mean)] = mean, whose
 *   expectation is the mean gradient. The price is a second variance term of at most
 *   tau'^2/4 a value. (QCMD/QRDA's server may also reply with its sparse model; that is an
 *   optimizer's choice, not the codec's.) */

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant_internal.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define S_TAU(c) ((c)->param[0])
#define S_K(c) ((c)->param[1])
#define S_DEFAULT_K 2.0f
#define S_K_MIN 0.01f
#define S_K_MAX 100.0f
#define S_HDR 12
#define S_CHUNK 1024 /* codes computed at a time; a multiple of 8 */
#define S_E_MASK ((UINT64_C(1) << 62) - 1)

enum { S_SPARSE = 0, S_DENSE = 1, S_RAW = 2 };

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    (void)c;
    return n ? S_HDR + 4 * n : 0;
}

/* ---- the random decisions --------------------------------------------------------------
 * Eight xoshiro128** generators side by side (two vectors of four 32-bit lanes), seeded from
 * ctx->rng at each encode. Value i takes lane i % 8 of step i / 8, so the payload depends
 * only on that seed, a prefix of a segment draws what the segment draws, and a copy of the
 * state replays the draws. The multiplications by 5 and 9 are shifts and adds: SSE2 has no
 * 32-bit lane multiply. */

typedef struct {
    mq_v4u_t s[2][4];
} s_gen_t;

static void s_gen_seed(s_gen_t *g, mq_rng_t *rng)
{
    for (int v = 0; v < 2; v++) {
        for (int w = 0; w < 4; w++) {
            uint64_t a = mq_rng_next(rng), b = mq_rng_next(rng);
            g->s[v][w] = (mq_v4u_t){(uint32_t)a, (uint32_t)(a >> 32), (uint32_t)b,
                                    (uint32_t)(b >> 32)};
        }
        for (int l = 0; l < 4; l++) /* an all-zero state would stay zero */
            if (!(g->s[v][0][l] | g->s[v][1][l] | g->s[v][2][l] | g->s[v][3][l]))
                g->s[v][0][l] = 0x9e3779b9u;
    }
}

static inline mq_v4u_t s_rotl(mq_v4u_t x, int k)
{
    return x << k | x >> (32 - k);
}

static inline mq_v4u_t s_gen_next(mq_v4u_t *s)
{
    mq_v4u_t x = s_rotl(s[1] + (s[1] << 2), 7); /* rotl(s1 * 5, 7) */
    mq_v4u_t r = x + (x << 3);                  /* * 9 */
    mq_v4u_t t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 11);
    return r;
}

/* The sign bits of four lanes of -1 / 0 as a 4-bit number. */
static inline unsigned s_mask4(mq_v4i_t m)
{
#if defined(__SSE2__)
    return (unsigned)_mm_movemask_ps((__m128)m);
#else
    return (m[0] & 1u) | (m[1] & 2u) | (m[2] & 4u) | (m[3] & 8u);
#endif
}

/* Bit k of x (8 bits) to bit 2k. */
static inline unsigned s_spread8(unsigned x)
{
    x = (x | x << 4) & 0x0f0fu;
    x = (x | x << 2) & 0x3333u;
    return (x | x << 1) & 0x5555u;
}

/* Codes of four values from four random words: 3 if |g| >= tau (and g != 0), else 1 (+tau)
 * or 2 (-tau) if u * tau < |g|, u = the word's high 23 bits / 2^23, else 0. *BIT0 and *BIT1
 * get the codes' low and high bits, a bit per value. */
static inline void s_code4(const float *g, mq_v4u_t h, mq_v4f_t vt, unsigned *bit0,
                           unsigned *bit1)
{
    const mq_v4i_t abs = {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX};
    const mq_v4f_t zero = mq_v4f_set1(0.0f), one = mq_v4f_set1(1.0f);
    mq_v4f_t u = (mq_v4f_t)((h >> 9) | 0x3f800000u) - one; /* 1.m - 1 */
    mq_v4f_t gv = mq_v4f_load(g);
    mq_v4f_t a = (mq_v4f_t)((mq_v4i_t)gv & abs);
    mq_v4i_t ex = (a >= vt) & (a > zero);
    mq_v4i_t st = (u * vt < a) & ~ex;
    mq_v4i_t neg = gv < zero;
    *bit0 = s_mask4(ex | (st & ~neg));
    *bit1 = s_mask4(ex | (st & neg));
}

/* The codes of eight values, the next step of the generators, as two bytes of dense codes. */
static inline void s_code8(const float *g, s_gen_t *gen, mq_v4f_t vt, uint8_t *out)
{
    unsigned lo0, lo1, hi0, hi1;
    s_code4(g, s_gen_next(gen->s[0]), vt, &lo0, &lo1);
    s_code4(g + 4, s_gen_next(gen->s[1]), vt, &hi0, &hi1);
    unsigned w = s_spread8(lo0 | hi0 << 4) | s_spread8(lo1 | hi1 << 4) << 1;
    out[0] = (uint8_t)w;
    out[1] = (uint8_t)(w >> 8);
}

/* The dense codes of the next m values of a segment, g[0..m), into packed[0..ceil(m/4)) (m
 * a multiple of 8 except at the segment's end): 0 zero, 1 +tau, 2 -tau, 3 exact. */
static void s_codes(const float *g, size_t m, float tau, s_gen_t *gen, uint8_t *packed)
{
    const mq_v4f_t vt = mq_v4f_set1(tau);
    size_t j = 0;
    for (; j + 8 <= m; j += 8)
        s_code8(g + j, gen, vt, packed + j / 4);
    if (j < m) { /* the segment's last values, padded with zeros (code 0) */
        float tail[8] = {0};
        uint8_t two[2];
        memcpy(tail, g + j, (m - j) * sizeof *g);
        s_code8(tail, gen, vt, two);
        memcpy(packed + j / 4, two, (m - j + 3) / 4);
    }
}

/* Eight bytes of codes as a little-endian word; zeros past AVAIL. Bit b of the word is bit
 * b % 8 of byte b / 8: the code of value b / 2 of the word. */
static inline uint64_t s_le64(const uint8_t *p, size_t avail)
{
    uint64_t w = 0;
    memcpy(&w, p, avail < 8 ? avail : 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w); /* the bytes copied sit at the top: now at the bottom */
#endif
    return w;
}

#define S_LOWS UINT64_C(0x5555555555555555) /* the low bit of each code */

/* ---- varints --------------------------------------------------------------------------- */

/* Bytes of the varint of v, without a loop: ceil(bits / 7), at least 1. */
static inline size_t s_varint_len(uint64_t v)
{
    return ((size_t)(64 - __builtin_clzll(v | 1)) + 6) / 7;
}

static uint8_t *s_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Reads one varint from [*p, end); false if it is cut short, wider than 64 bits or not in
 * its shortest form (a payload this codec never writes). */
static bool s_get_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p == end)
            return false;
        uint8_t b = *(*p)++;
        if (shift == 63 && b > 1)
            return false;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return b != 0 || shift == 0;
        }
    }
    return false;
}

/* ---- encode ---------------------------------------------------------------------------- */

/* Nonzero codes and exact (code 3) codes among D bytes of dense codes, eight bytes a word:
 * each code's two bits meet at its low bit (mask 0x55..), never across codes. */
static void s_count_codes(const uint8_t *codes, size_t D, size_t *nnz, size_t *ex)
{
    const uint64_t lows = UINT64_C(0x5555555555555555);
    size_t a = 0, b = 0, q = 0;
    for (; q + 8 <= D; q += 8) {
        uint64_t w;
        memcpy(&w, codes + q, 8); /* byte order does not change the counts */
        a += mq_quant_popcount64((w | w >> 1) & lows);
        b += mq_quant_popcount64(w & w >> 1 & lows);
    }
    for (; q < D; q++) {
        uint64_t w = codes[q];
        a += mq_quant_popcount64((w | w >> 1) & lows);
        b += mq_quant_popcount64(w & w >> 1 & lows);
    }
    *nnz = a;
    *ex = b;
}

/* Sum of squares of g[0..n) in double: float lanes per block of 512, blocks in double. Not
 * finite if a value is not, or (|g| > 1.8e19) if a square overflows: the caller tells them
 * apart. */
static double s_sum_sq(const float *g, size_t n)
{
    double total = 0.0;
    size_t i = 0;
    while (i + 8 <= n) {
        size_t end = n - i > 512 ? i + 512 : n;
        mq_v4f_t a0 = mq_v4f_set1(0.0f), a1 = a0;
        for (; i + 8 <= end; i += 8) {
            mq_v4f_t x0 = mq_v4f_load(g + i), x1 = mq_v4f_load(g + i + 4);
            a0 += x0 * x0;
            a1 += x1 * x1;
        }
        mq_v4f_t a = a0 + a1;
        total += ((double)a[0] + a[1]) + ((double)a[2] + a[3]);
    }
    for (; i < n; i++)
        total += (double)g[i] * g[i];
    return total;
}

/* tau for G, or -1 with an error naming the first value that is not finite. */
static int s_tau(const mq_codec_t *c, const float *g, size_t n, float *tau)
{
    if (S_TAU(c)) {
        *tau = mq_codec_param_f(c, 0);
        return mq_quant_check_finite("thresh encode", g, n);
    }
    double ss = s_sum_sq(g, n);
    if (!isfinite(ss)) {
        if (mq_quant_check_finite("thresh encode", g, n) < 0)
            return -1;
        ss = mq_quant_sum_sq(g, n); /* huge but finite values: squares in double */
    }
    double t = (S_K(c) ? mq_codec_param_f(c, 1) : S_DEFAULT_K) * sqrt(ss / (double)n);
    *tau = t > FLT_MAX ? FLT_MAX : (float)t;
    return 0;
}

typedef struct {
    size_t E, nnz; /* exact values, nonzero values */
} s_counts_t;

/* Writes the dense codes at dst + S_HDR and the exact values after them (those that fit in
 * max_size), and counts them. */
static s_counts_t s_write_dense(const float *src, size_t n, float tau, s_gen_t *gen, uint8_t *dst)
{
    const size_t D = (n + 3) / 4, room = (4 * n - D) / 4;
    uint8_t *exact = dst + S_HDR + D;
    s_counts_t k = {0, 0};
    for (size_t at = 0; at < n; at += S_CHUNK) {
        size_t m = n - at < S_CHUNK ? n - at : S_CHUNK, nb = (m + 3) / 4, nnz, ex;
        uint8_t *packed = dst + S_HDR + at / 4;
        s_codes(src + at, m, tau, gen, packed);
        s_count_codes(packed, nb, &nnz, &ex);
        k.nnz += nnz;
        for (size_t q = 0; ex && q < nb; q += 8) { /* exact values are rare */
            uint64_t x = s_le64(packed + q, nb - q);
            for (uint64_t m3 = x & x >> 1 & S_LOWS; m3; m3 &= m3 - 1) {
                size_t i = at + 4 * q + (size_t)__builtin_ctzll(m3) / 2;
                if (k.E < room)
                    mq_put_f32(exact + 4 * k.E, src[i]);
                k.E++;
            }
        }
    }
    return k;
}

/* Bytes of the sparse list of D bytes of dense codes holding NNZ nonzero codes: a byte per
 * token, plus the extra bytes of long gaps. Tokens' lengths depend on their gaps only, and
 * in a word of 32 codes only the first nonzero one can have a gap of 32 or more (a token of
 * more than one byte): one step a word, none a code. */
static size_t s_sparse_len(const uint8_t *codes, size_t D, size_t nnz)
{
    size_t extra = 0, next = 0;
    for (size_t q = 0; q < D; q += 8) {
        uint64_t x = s_le64(codes + q, D - q), m = (x | x >> 1) & S_LOWS;
        if (!m)
            continue;
        size_t first = 4 * q + (size_t)__builtin_ctzll(m) / 2;
        extra += s_varint_len((uint64_t)(first - next) << 2 | 3) - 1;
        next = 4 * q + (size_t)(63 - __builtin_clzll(m)) / 2 + 1;
    }
    return nnz + extra;
}

/* Writes the sparse list of D bytes of dense codes at w. */
static void s_sparse_write(const uint8_t *codes, size_t D, uint8_t *w)
{
    size_t next = 0;
    for (size_t q = 0; q < D; q += 8) {
        uint64_t x = s_le64(codes + q, D - q);
        for (uint64_t m = (x | x >> 1) & S_LOWS; m; m &= m - 1) {
            unsigned b = (unsigned)__builtin_ctzll(m);
            size_t i = 4 * q + b / 2;
            w = s_put_varint(w, (uint64_t)(i - next) << 2 | ((x >> b) & 3));
            next = i + 1;
        }
    }
}

/* Rewrites a dense payload's codes as the sparse list, in place. The codes first move to the
 * end of the max_size buffer: the list (V < D bytes) then never reaches the codes still to
 * read, nor the exact values at S_HDR + D. That room exists: V < D means E <= V < D, and
 * 2D + 4E <= 6D - 4 <= 4n for every n >= 1. The exact values then follow the list (V
 * bytes). */
static void s_dense_to_sparse(uint8_t *dst, size_t n, size_t E, size_t V)
{
    const size_t D = (n + 3) / 4;
    uint8_t *codes = dst + S_HDR + 4 * n - D;
    memmove(codes, dst + S_HDR, D);
    s_sparse_write(codes, D, dst + S_HDR);
    memmove(dst + S_HDR + V, dst + S_HDR + D, 4 * E);
}

/* The decoded values themselves, when nearly all are exact. */
static void s_write_raw(const float *src, size_t n, float tau, s_gen_t *gen, uint8_t *dst)
{
    uint8_t packed[S_CHUNK / 4];
    for (size_t at = 0; at < n; at += S_CHUNK) {
        size_t m = n - at < S_CHUNK ? n - at : S_CHUNK;
        s_codes(src + at, m, tau, gen, packed);
        for (size_t j = 0; j < m; j++) {
            unsigned c = (packed[j >> 2] >> (2 * (j & 3))) & 3;
            float v = c == 0 ? 0.0f : c == 1 ? tau : c == 2 ? -tau : src[at + j];
            mq_put_f32(dst + S_HDR + 4 * (at + j), v);
        }
    }
}

static void s_put_header(uint8_t *dst, float tau, size_t E, unsigned format)
{
    uint64_t w = (uint64_t)E | (uint64_t)format << 62;
    mq_put_f32(dst, tau);
    mq_put_u32(dst + 4, (uint32_t)w);
    mq_put_u32(dst + 8, (uint32_t)(w >> 32));
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *out_len, mq_codec_stats_t *stats)
{
    float tau;
    if (s_tau(c, src, n, &tau) < 0)
        return -1;
    const size_t D = (n + 3) / 4;
    s_gen_t gen, replay;
    s_gen_seed(&gen, ctx->rng);
    replay = gen;

    s_counts_t k = s_write_dense(src, n, tau, &gen, dst);
    if (D + 4 * k.E > 4 * n) { /* the dense form would not fit: nearly every value is exact */
        s_write_raw(src, n, tau, &replay, dst);
        s_put_header(dst, tau, 0, S_RAW);
        *out_len = S_HDR + 4 * n;
        if (stats)
            stats->sq = mq_quant_sq_f32(dst + S_HDR, n);
        return 0;
    }
    /* The sparse list takes at least a byte a nonzero: count it only when it may be smaller. */
    size_t V = k.nnz < D ? s_sparse_len(dst + S_HDR, D, k.nnz) : D;
    if (V < D) {
        s_dense_to_sparse(dst, n, k.E, V);
        s_put_header(dst, tau, k.E, S_SPARSE);
        *out_len = S_HDR + V + 4 * k.E;
    } else {
        s_put_header(dst, tau, k.E, S_DENSE);
        *out_len = S_HDR + D + 4 * k.E;
    }
    if (stats)
        stats->sq = mq_quant_sq_f32(dst + *out_len - 4 * k.E, k.E) +
                    (double)(k.nnz - k.E) * tau * tau;
    return 0;
}

/* ---- validate -------------------------------------------------------------------------- */

/* Exact values must be what the encode keeps: finite, nonzero, at least tau in magnitude
 * (RAW: or 0). */
static int s_check_values(const uint8_t *p, size_t m, float tau, bool raw)
{
    for (size_t i = 0; i < m; i++) {
        float v = mq_get_f32(p + 4 * i);
        if (!isfinite(v) || (v == 0.0f ? !raw : fabsf(v) < tau)) {
            mq_err_set("thresh decode: %svalue %zu of %zu is %g (expected a finite number%s "
                       "of magnitude >= tau = %g)",
                       raw ? "" : "exact ", i, m, (double)v, raw ? " that is 0 or" : "",
                       (double)tau);
            return -1;
        }
    }
    return 0;
}

static int s_validate_dense(const uint8_t *src, size_t len, size_t n, uint64_t E, float tau)
{
    const size_t D = (n + 3) / 4;
    if (E > n || len != S_HDR + D + 4 * E) {
        mq_err_set("thresh decode: dense payload of %zu bytes with %llu exact values for %zu "
                   "values (expected %zu bytes)",
                   len, (unsigned long long)E, n, E > n ? 0 : S_HDR + D + 4 * (size_t)E);
        return -1;
    }
    const uint8_t *codes = src + S_HDR;
    size_t nnz, ex;
    s_count_codes(codes, D, &nnz, &ex);
    if (n % 4 && codes[D - 1] >> (2 * (n % 4))) {
        mq_err_set("thresh decode: codes after value %zu are set (expected 0)", n - 1);
        return -1;
    }
    if (ex != E) {
        mq_err_set("thresh decode: %zu exact codes but %llu exact values", ex,
                   (unsigned long long)E);
        return -1;
    }
    if (nnz > ex && tau == 0.0f) {
        mq_err_set("thresh decode: +-tau codes with tau = 0");
        return -1;
    }
    return s_check_values(src + len - 4 * E, E, tau, false);
}

static int s_validate_sparse(const uint8_t *src, size_t len, size_t n, uint64_t E, float tau)
{
    if (E > (len - S_HDR) / 4) {
        mq_err_set("thresh decode: %llu exact values do not fit in a payload of %zu bytes",
                   (unsigned long long)E, len);
        return -1;
    }
    const uint8_t *p = src + S_HDR, *end = src + len - 4 * E;
    size_t next = 0, nnz = 0, ex = 0;
    while (p < end) {
        uint64_t t;
        size_t at = (size_t)(p - src);
        if (!s_get_varint(&p, end, &t)) {
            mq_err_set("thresh decode: entry %zu at byte %zu is not a valid varint (cut short, "
                       "too wide or not in shortest form)",
                       nnz, at);
            return -1;
        }
        if ((t & 3) == 0 || t >> 2 >= n - next) {
            mq_err_set("thresh decode: entry %zu has %s (expected a code 1..3 and an index "
                       "below %zu, after the previous one)",
                       nnz, (t & 3) == 0 ? "code 0" : "an index out of range", n);
            return -1;
        }
        next += (size_t)(t >> 2) + 1;
        nnz++;
        ex += (t & 3) == 3;
    }
    if (ex != E) {
        mq_err_set("thresh decode: %zu exact entries but %llu exact values", ex,
                   (unsigned long long)E);
        return -1;
    }
    if (nnz > ex && tau == 0.0f) {
        mq_err_set("thresh decode: +-tau entries with tau = 0");
        return -1;
    }
    return s_check_values(end, E, tau, false);
}

static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    if (len < S_HDR) {
        mq_err_set("thresh decode: payload of %zu bytes is shorter than its %d-byte header", len,
                   S_HDR);
        return -1;
    }
    float tau = mq_get_f32(src);
    if (!isfinite(tau) || !(tau >= 0.0f)) {
        mq_err_set("thresh decode: threshold %g (expected a finite number >= 0)", (double)tau);
        return -1;
    }
    if (S_TAU(c) && tau != mq_codec_param_f(c, 0)) {
        mq_err_set("thresh decode: threshold %g (expected the spec's tau = %g)", (double)tau,
                   (double)mq_codec_param_f(c, 0));
        return -1;
    }
    uint64_t w = mq_get_u32(src + 4) | (uint64_t)mq_get_u32(src + 8) << 32;
    uint64_t E = w & S_E_MASK;
    switch ((unsigned)(w >> 62)) {
    case S_SPARSE:
        return s_validate_sparse(src, len, n, E, tau);
    case S_DENSE:
        return s_validate_dense(src, len, n, E, tau);
    case S_RAW:
        if (E != 0 || len != S_HDR + 4 * n) {
            mq_err_set("thresh decode: raw payload of %zu bytes with %llu exact values for %zu "
                       "values (expected %zu bytes and 0)",
                       len, (unsigned long long)E, n, S_HDR + 4 * n);
            return -1;
        }
        return s_check_values(src + S_HDR, n, tau, true);
    default:
        mq_err_set("thresh decode: unknown payload format 3 (expected 0 sparse, 1 dense, 2 raw)");
        return -1;
    }
}

/* ---- decode ---------------------------------------------------------------------------- */

static void s_decode_sparse(const uint8_t *src, size_t len, float *dst, size_t n, float scale,
                            bool acc, size_t E, float tau, mq_codec_stats_t *stats)
{
    const uint8_t *p = src + S_HDR, *end = src + len - 4 * E, *exact = end;
    const float vt = scale * tau;
    size_t next = 0, nnz = 0, j = 0;
    if (!acc)
        memset(dst, 0, n * sizeof *dst);
    while (p < end) {
        uint64_t t = 0;
        s_get_varint(&p, end, &t); /* validated */
        size_t i = next + (size_t)(t >> 2);
        unsigned code = t & 3;
        float v = code == 1 ? vt : code == 2 ? -vt : scale * mq_get_f32(exact + 4 * j++);
        dst[i] = acc ? dst[i] + v : v;
        next = i + 1;
        nnz++;
    }
    if (stats)
        stats->sq = mq_quant_sq_f32(exact, E) + (double)(nnz - E) * tau * tau;
}

static void s_decode_dense(const uint8_t *src, float *dst, size_t n, float scale, bool acc,
                           size_t E, float tau, mq_codec_stats_t *stats)
{
    const size_t D = (n + 3) / 4;
    const uint8_t *codes = src + S_HDR, *exact = src + S_HDR + D;
    const float lut[4] = {0.0f, scale * tau, -(scale * tau), 0.0f};
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned code = (codes[i >> 2] >> (2 * (i & 3))) & 3;
        float v = code == 3 ? scale * mq_get_f32(exact + 4 * j++) : lut[code];
        dst[i] = acc ? dst[i] + v : v;
    }
    if (stats) {
        size_t nnz, ex;
        s_count_codes(codes, D, &nnz, &ex);
        stats->sq = mq_quant_sq_f32(exact, E) + (double)(nnz - E) * tau * tau;
    }
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool acc, mq_codec_stats_t *stats)
{
    (void)c;
    const float tau = mq_get_f32(src);
    const uint64_t w = mq_get_u32(src + 4) | (uint64_t)mq_get_u32(src + 8) << 32;
    const size_t E = (size_t)(w & S_E_MASK);
    switch ((unsigned)(w >> 62)) {
    case S_SPARSE:
        s_decode_sparse(src, len, dst, n, scale, acc, E, tau, stats);
        return;
    case S_DENSE:
        s_decode_dense(src, dst, n, scale, acc, E, tau, stats);
        return;
    default: /* raw */
        mq_quant_decode_f32(src + S_HDR, dst, n, scale, acc);
        if (stats)
            stats->sq = mq_quant_sq_f32(src + S_HDR, n);
    }
}

/* ---- spec ------------------------------------------------------------------------------ */

/* ":KEY=V" with the fewest significant digits (6 to 9) that read back to V. */
static void s_format_float(char *buf, size_t len, const char *key, float v)
{
    char tmp[32];
    mq_quant_format_float(tmp, sizeof tmp, v, 6);
    snprintf(buf, len, ":%s=%s", key, tmp);
}

static int s_option(mq_codec_t *c, const char *opt)
{
    float v;
    if (strncmp(opt, "tau=", 4) == 0) {
        if (S_K(c)) {
            mq_err_set("tau=T and k=K exclude each other (give one)");
            return -1;
        }
        if (mq_quant_opt_float("thresh", "tau", opt + 4, FLT_MIN, FLT_MAX, &v) < 0)
            return -1;
        mq_codec_set_param_f(c, 0, v);
        return 0;
    }
    if (strncmp(opt, "k=", 2) == 0) {
        if (S_TAU(c)) {
            mq_err_set("tau=T and k=K exclude each other (give one)");
            return -1;
        }
        if (mq_quant_opt_float("thresh", "k", opt + 2, S_K_MIN, S_K_MAX, &v) < 0)
            return -1;
        c->param[1] = 0; /* the default is written as no word, so "k=2" equals "thresh" */
        if (v != S_DEFAULT_K)
            mq_codec_set_param_f(c, 1, v);
        return 0;
    }
    mq_err_set("unknown option '%s' (expected tau=T or k=K)", opt);
    return -1;
}

static void s_format(const mq_codec_t *c, char *buf, size_t len)
{
    if (S_TAU(c))
        s_format_float(buf, len, "tau", mq_codec_param_f(c, 0));
    else if (S_K(c))
        s_format_float(buf, len, "k", mq_codec_param_f(c, 1));
    else if (len)
        buf[0] = 0;
}

static int s_check(const mq_codec_t *c)
{
    if (S_TAU(c) && S_K(c)) {
        mq_err_set("codec thresh: both tau and k are set (expected one)");
        return -1;
    }
    float tau = mq_codec_param_f(c, 0), k = mq_codec_param_f(c, 1);
    if (S_TAU(c) && !(tau >= FLT_MIN && tau <= FLT_MAX)) {
        mq_err_set("codec thresh: tau %g (expected a finite number > 0)", (double)tau);
        return -1;
    }
    /* s_option writes the default k as no word: a word holding it is not a spec's */
    if (S_K(c) && (!(k >= S_K_MIN && k <= S_K_MAX) || k == S_DEFAULT_K)) {
        mq_err_set("codec thresh: k %g (expected %g..%g; the default %g as no word)", (double)k,
                   (double)S_K_MIN, (double)S_K_MAX, (double)S_DEFAULT_K);
        return -1;
    }
    return mq_quant_check_unused(c, 2);
}

const mq_codec_ops_t mq_codec_thresh_ops = {
    .name = "thresh",
    .id = MQ_CODEC_ID_thresh,
    .usage = "thresh[:tau=T|:k=K]",
    .help = "dead zone: |g|>=tau exact, else tau*sign w.p. |g|/tau; tau=K*RMS, K=2 (QCMD/QRDA)",
    .unbiased = true,
    .exact_size = false,
    .option = s_option,
    .format = s_format,
    .check = s_check,
    .max_size = s_max_size,
    .stochastic = mq_quant_always_stochastic,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
};
