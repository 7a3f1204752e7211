/* The `uniform` codec: min-max linear quantization to K bits with a range per bucket, codes
 * packed densely least-significant-bit first (payload layout in mqgrad/quant.h).
 * Work goes in chunks of S_CHUNK values, a multiple of 8: eight K-bit codes are exactly K
 * bytes, so every chunk starts on a byte of the code stream whatever K and the bucket size
 * are. A chunk is quantized into one byte per code (a loop the compiler vectorizes), then
 * packed eight codes at a time through a 64-bit word. */

#include <float.h>
#include <math.h>
#include <string.h>

#include "quant_internal.h"

#define S_CHUNK 2048 /* values per pass: codes and noise stay in L1 */
#define S_BLOCK 16   /* inner loop length the vectorizer sees */

/* ---- range header: float32 little-endian, written byte by byte (host-order free) ---- */

static void s_put_f32(uint8_t *p, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(u >> (8 * i));
}

static float s_get_f32(const uint8_t *p)
{
    uint32_t u = 0;
    for (int i = 0; i < 4; i++)
        u |= (uint32_t)p[i] << (8 * i);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

/* ---- finiteness --------------------------------------------------------------------
 * v - v is +0 for every finite v and NaN for NaN and the infinities, so summing it flags a
 * bad value without a branch per element; only then do we look for the index. */

static bool s_lanes_zero(mq_v4f_t v)
{
    return v[0] == 0.0f && v[1] == 0.0f && v[2] == 0.0f && v[3] == 0.0f;
}

size_t mq_quant_first_nonfinite(const float *x, size_t n)
{
    mq_v4f_t acc0 = mq_v4f_set1(0), acc1 = acc0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        mq_v4f_t a = mq_v4f_load(x + i), b = mq_v4f_load(x + i + 4);
        acc0 += a - a;
        acc1 += b - b;
    }
    float tail = 0.0f;
    for (size_t k = i; k < n; k++)
        tail += x[k] - x[k];
    if (tail == 0.0f && s_lanes_zero(acc0 + acc1))
        return n;
    for (i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return i;
    return n; /* unreachable: some value made the sum NaN */
}

size_t mq_quant_first_nonfinite_sum(const float *a, const float *b, size_t n)
{
    mq_v4f_t acc0 = mq_v4f_set1(0), acc1 = acc0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        mq_v4f_t u = mq_v4f_load(a + i) + mq_v4f_load(b + i);
        mq_v4f_t v = mq_v4f_load(a + i + 4) + mq_v4f_load(b + i + 4);
        acc0 += u - u;
        acc1 += v - v;
    }
    float tail = 0.0f;
    for (size_t k = i; k < n; k++) {
        float v = a[k] + b[k];
        tail += v - v;
    }
    if (tail == 0.0f && s_lanes_zero(acc0 + acc1))
        return n;
    for (i = 0; i < n; i++)
        if (!isfinite(a[i] + b[i]))
            return i;
    return n;
}

/* ---- encoding ------------------------------------------------------------------------*/

/* Min and max of x[0..n), n > 0. Returns -1 (and the first bad index) if a value is not
 * finite: NaN would otherwise slip through the comparisons unseen. */
static int s_minmax(const float *x, size_t n, float *lo, float *hi, size_t *bad)
{
    mq_v4f_t mn0 = mq_v4f_set1(x[0]), mn1 = mn0, mx0 = mn0, mx1 = mn0;
    mq_v4f_t ck0 = mq_v4f_set1(0), ck1 = ck0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        mq_v4f_t a = mq_v4f_load(x + i), b = mq_v4f_load(x + i + 4);
        mn0 = mq_v4f_select(a < mn0, a, mn0);
        mn1 = mq_v4f_select(b < mn1, b, mn1);
        mx0 = mq_v4f_select(a > mx0, a, mx0);
        mx1 = mq_v4f_select(b > mx1, b, mx1);
        ck0 += a - a;
        ck1 += b - b;
    }
    mn0 = mq_v4f_select(mn1 < mn0, mn1, mn0);
    mx0 = mq_v4f_select(mx1 > mx0, mx1, mx0);
    float l = mn0[0], h = mx0[0], c = 0.0f;
    for (int j = 1; j < 4; j++) {
        l = mn0[j] < l ? mn0[j] : l;
        h = mx0[j] > h ? mx0[j] : h;
    }
    for (; i < n; i++) {
        l = x[i] < l ? x[i] : l;
        h = x[i] > h ? x[i] : h;
        c += x[i] - x[i];
    }
    if (c != 0.0f || !s_lanes_zero(ck0 + ck1) || !isfinite(x[0])) {
        *bad = mq_quant_first_nonfinite(x, n);
        return -1;
    }
    *lo = l;
    *hi = h;
    return 0;
}

/* Per-bucket constants for quantizing. Buckets whose range or inverse step does not fit
 * a float (|values| near FLT_MAX, or a range in the denormals) take a double path so the
 * float path never meets an infinity. */
typedef struct {
    float lo, inv;
    double lo_d, inv_d;
    bool constant, wide;
} s_qparams_t;

static s_qparams_t s_qparams(float lo, float hi, unsigned levels)
{
    s_qparams_t p = {.lo = lo, .lo_d = lo};
    double range = (double)hi - (double)lo;
    if (range == 0.0) {
        p.constant = true;
        return p;
    }
    p.inv_d = levels / range;
    p.wide = range > FLT_MAX || p.inv_d > FLT_MAX;
    p.inv = p.wide ? 0.0f : (float)p.inv_d;
    return p;
}

/* Codes for x[0..n) of one bucket. NOISE is NULL for round-to-nearest, else n uniforms in
 * [0, 1): floor(y + u) rounds y up with probability frac(y), so the decoded value is
 * unbiased (up to the float rounding of y + u: at 8 bits y < 256 keeps 15 bits of u, a bias
 * below 2^-16 of a step). y >= 0 because x >= lo, so truncation is floor; the clamp catches
 * y a hair above levels from rounding in (x - lo) * inv. */
static void s_quantize(const float *x, size_t n, const s_qparams_t *p, unsigned levels,
                       const float *noise, uint8_t *q)
{
    if (p->constant) {
        memset(q, 0, n);
        return;
    }
    const int top = (int)levels;
    if (p->wide) {
        for (size_t i = 0; i < n; i++) {
            double y = ((double)x[i] - p->lo_d) * p->inv_d + (noise ? noise[i] : 0.5);
            int k = (int)y;
            q[i] = (uint8_t)(k > top ? top : k);
        }
        return;
    }
    /* Fixed-size inner blocks: GCC's -O2 cost model vectorizes only known trip counts. */
    const float lo = p->lo, inv = p->inv;
    size_t i = 0;
    if (noise) {
        for (; i + S_BLOCK <= n; i += S_BLOCK)
            for (int j = 0; j < S_BLOCK; j++) {
                int k = (int)((x[i + j] - lo) * inv + noise[i + j]);
                q[i + j] = (uint8_t)(k > top ? top : k);
            }
        for (; i < n; i++) {
            int k = (int)((x[i] - lo) * inv + noise[i]);
            q[i] = (uint8_t)(k > top ? top : k);
        }
    } else {
        for (; i + S_BLOCK <= n; i += S_BLOCK)
            for (int j = 0; j < S_BLOCK; j++) {
                int k = (int)((x[i + j] - lo) * inv + 0.5f);
                q[i + j] = (uint8_t)(k > top ? top : k);
            }
        for (; i < n; i++) {
            int k = (int)((x[i] - lo) * inv + 0.5f);
            q[i] = (uint8_t)(k > top ? top : k);
        }
    }
}

/* Rounding noise: four xoshiro128** generators side by side in one vector register, seeded
 * from the caller's generator at each encode. A scalar xoshiro256** step per value or two
 * was most of the cost of stochastic rounding; this gives four values in about as many
 * instructions, and the payload still depends only on the caller's seed. */
typedef uint32_t s_v4u_t __attribute__((vector_size(16)));

typedef struct {
    s_v4u_t s[4];
} s_noise_t;

static s_v4u_t s_rotl(s_v4u_t x, int k)
{
    return (x << k) | (x >> (32 - k));
}

static void s_noise_seed(s_noise_t *g, mq_rng_t *rng)
{
    for (int w = 0; w < 4; w++)
        for (int lane = 0; lane < 4; lane += 2) {
            uint64_t r = mq_rng_next(rng);
            g->s[w][lane] = (uint32_t)r;
            g->s[w][lane + 1] = (uint32_t)(r >> 32);
        }
    for (int lane = 0; lane < 4; lane++) /* an all-zero state would stay zero */
        if (!(g->s[0][lane] | g->s[1][lane] | g->s[2][lane] | g->s[3][lane]))
            g->s[0][lane] = 0x9e3779b9u;
}

/* One step of the four generators: four 32-bit outputs. The multiplications by 5 and 9 are
 * shifts and adds: baseline x86-64 has no 32-bit lane multiply (pmulld is SSE4.1). */
static s_v4u_t s_noise_next(s_noise_t *g)
{
    s_v4u_t x = (g->s[1] << 2) + g->s[1];
    x = s_rotl(x, 7);
    s_v4u_t r = (x << 3) + x, t = g->s[1] << 9;
    g->s[2] ^= g->s[0];
    g->s[3] ^= g->s[1];
    g->s[1] ^= g->s[2];
    g->s[0] ^= g->s[3];
    g->s[2] ^= t;
    g->s[3] = s_rotl(g->s[3], 11);
    return r;
}

/* n uniforms in [0, 1) with 24 random bits each. */
static void s_noise(s_noise_t *g, float *u, size_t n)
{
    const mq_v4f_t unit = mq_v4f_set1(0x1.0p-24f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        mq_v4f_t v = __builtin_convertvector((mq_v4i_t)(s_noise_next(g) >> 8), mq_v4f_t) * unit;
        memcpy(u + i, &v, sizeof v);
    }
    if (i < n) {
        s_v4u_t r = s_noise_next(g) >> 8;
        for (int j = 0; i < n; i++, j++)
            u[i] = (float)r[j] * 0x1.0p-24f;
    }
}

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

#define S_LANES16 0x00ff00ff00ff00ffull
#define S_LANES32 0x0000ffff0000ffffull

/* Eight codes (one per byte of w, each < 2^K) merged into 8K bits: pairs, then quads, then
 * the two halves, so 9 word operations instead of 8 shifts and ors per code. */
static inline __attribute__((always_inline)) uint64_t s_merge8(uint64_t w, const int K)
{
    w = (w & S_LANES16) | ((w >> 8) & S_LANES16) << K;
    w = (w & S_LANES32) | ((w >> 16) & S_LANES32) << (2 * K);
    return (w & 0xffffffffull) | (w >> 32) << (4 * K);
}

/* The inverse: 8K bits back into one code per byte. */
static inline __attribute__((always_inline)) uint64_t s_split8(uint64_t w, const int K)
{
    const uint64_t m4 = (1ull << (4 * K)) - 1, m2 = (1ull << (2 * K)) - 1, m1 = (1ull << K) - 1;
    w = (w & m4) | ((w >> (4 * K)) & m4) << 32;
    w = (w & (m2 * 0x100000001ull)) | ((w >> (2 * K)) & (m2 * 0x100000001ull)) << 16;
    return (w & (m1 * 0x0001000100010001ull)) | ((w >> K) & (m1 * 0x0001000100010001ull)) << 8;
}

/* Packs codes q[0..n) (each < 2^K) into ceil(n*K/8) bytes at dst. AVAIL is how many bytes
 * of the payload start at dst: while 8 remain, a group stores a whole word and the next
 * group overwrites the spill. K is a constant at every call site (see s_pack). */
static inline __attribute__((always_inline)) void s_pack_k(const uint8_t *q, size_t n, uint8_t *dst,
                                                           size_t avail, const int K)
{
    size_t g = 0;
    for (; g + 8 <= n && avail >= 8; g += 8, dst += K, avail -= K)
        s_store64(dst, s_merge8(s_load64(q + g), K));
    for (; g < n; g += 8) {
        size_t rest = n - g < 8 ? n - g : 8;
        uint64_t w = 0;
        for (size_t j = 0; j < rest; j++)
            w |= (uint64_t)q[g + j] << (j * K);
        size_t nbytes = (rest * K + 7) / 8;
        for (size_t b = 0; b < nbytes; b++)
            dst[b] = (uint8_t)(w >> (8 * b));
        dst += K;
    }
}

static void s_pack(const uint8_t *q, size_t n, uint8_t *dst, size_t avail, int K)
{
    switch (K) {
    case 1:
        s_pack_k(q, n, dst, avail, 1);
        break;
    case 2:
        s_pack_k(q, n, dst, avail, 2);
        break;
    case 3:
        s_pack_k(q, n, dst, avail, 3);
        break;
    case 4:
        s_pack_k(q, n, dst, avail, 4);
        break;
    case 5:
        s_pack_k(q, n, dst, avail, 5);
        break;
    case 6:
        s_pack_k(q, n, dst, avail, 6);
        break;
    case 7:
        s_pack_k(q, n, dst, avail, 7);
        break;
    default:
        memcpy(dst, q, n);
        break; /* K = 8: one byte per code */
    }
}
int mq_quant_uniform_encode(const mq_codec_t *c, const float *src, size_t n, uint8_t *dst,
                            mq_rng_t *rng)
{
    const int K = c->bits;
    const unsigned levels = (1u << K) - 1;
    const size_t B = c->bucket ? c->bucket : n;
    const size_t nb = (n + B - 1) / B;
    uint8_t *codes = dst + 8 * nb;
    const size_t code_bytes = (n / 8) * (size_t)K + ((n % 8) * (size_t)K + 7) / 8;
    uint8_t q[S_CHUNK];
    float noise[S_CHUNK];
    size_t next_bucket = 0; /* buckets get their range when first reached: still in cache */
    s_qparams_t p = {0};
    s_noise_t gen;
    if (c->stochastic)
        s_noise_seed(&gen, rng);

    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t len = n - start < S_CHUNK ? n - start : S_CHUNK;
        if (c->stochastic)
            s_noise(&gen, noise, len);
        for (size_t i = start; i < start + len;) {
            size_t b = i / B;
            size_t b_end = (b + 1) * B < n ? (b + 1) * B : n;
            size_t seg_end = b_end < start + len ? b_end : start + len;
            if (b == next_bucket) {
                float lo, hi;
                size_t bad;
                if (s_minmax(src + b * B, b_end - b * B, &lo, &hi, &bad) < 0) {
                    size_t at = b * B + bad;
                    mq_err_set("uniform:%d encode: value %zu of %zu is %s (expected finite "
                               "numbers)",
                               K, at, n, isnan(src[at]) ? "NaN" : "infinite");
                    return -1;
                }
                s_put_f32(dst + 8 * b, lo);
                s_put_f32(dst + 8 * b + 4, hi);
                p = s_qparams(lo, hi, levels);
                next_bucket++;
            }
            s_quantize(src + i, seg_end - i, &p, levels, c->stochastic ? noise + (i - start) : NULL,
                       q + (i - start));
            i = seg_end;
        }
        size_t at = start / 8 * (size_t)K;
        s_pack(q, len, codes + at, code_bytes - at, K);
    }
    return 0;
}

/* ---- decoding ------------------------------------------------------------------------*/

/* Codes q[0..n) from the packed stream at src (AVAIL bytes of payload from src on). */
static inline __attribute__((always_inline)) void s_unpack_k(const uint8_t *src, size_t n,
                                                             size_t avail, uint8_t *q, const int K)
{
    const uint64_t mask = (1u << K) - 1;
    size_t g = 0;
    for (; g + 8 <= n && avail >= 8; g += 8, src += K, avail -= K)
        s_store64(q + g, s_split8(s_load64(src), K));
    for (; g < n; g += 8) {
        size_t rest = n - g < 8 ? n - g : 8;
        size_t nbytes = (rest * K + 7) / 8;
        uint64_t w = 0;
        for (size_t b = 0; b < nbytes; b++)
            w |= (uint64_t)src[b] << (8 * b);
        for (size_t j = 0; j < rest; j++)
            q[g + j] = (uint8_t)((w >> (j * K)) & mask);
        src += K;
    }
}

static void s_unpack(const uint8_t *src, size_t n, size_t avail, uint8_t *q, int K)
{
    switch (K) {
    case 1:
        s_unpack_k(src, n, avail, q, 1);
        break;
    case 2:
        s_unpack_k(src, n, avail, q, 2);
        break;
    case 3:
        s_unpack_k(src, n, avail, q, 3);
        break;
    case 4:
        s_unpack_k(src, n, avail, q, 4);
        break;
    case 5:
        s_unpack_k(src, n, avail, q, 5);
        break;
    case 6:
        s_unpack_k(src, n, avail, q, 6);
        break;
    case 7:
        s_unpack_k(src, n, avail, q, 7);
        break;
    default:
        memcpy(q, src, n);
        break;
    }
}

/* The vector body of s_dequantize: at -O2 GCC vectorizes neither the byte-to-float widening nor the
 * top-code select, and a branch on a 1-bit code is a coin flip for the predictor. Four values per
 * step, no branches. */
static void s_dequantize_v4(const uint8_t *q, size_t nv, float a, float b, float top,
                            unsigned levels, bool acc, float *dst)
{
    const mq_v4f_t va = {a, a, a, a}, vb = {b, b, b, b};
    const mq_v4i_t vtop = (mq_v4i_t)(mq_v4f_t){top, top, top, top};
    const mq_v4i_t vlev = {(int32_t)levels, (int32_t)levels, (int32_t)levels, (int32_t)levels};
    for (size_t k = 0; k < nv; k++, q += 4, dst += 4) {
        mq_v4i_t qi = {q[0], q[1], q[2], q[3]};
        mq_v4f_t v = va + __builtin_convertvector(qi, mq_v4f_t) * vb;
        mq_v4i_t m = qi == vlev;
        mq_v4f_t r = (mq_v4f_t)(((mq_v4i_t)v & ~m) | (vtop & m));
        if (acc) {
            mq_v4f_t d;
            memcpy(&d, dst, sizeof d);
            r += d;
        }
        memcpy(dst, &r, sizeof r);
    }
}

/* dst[i] (+)= scale * (lo + q[i] * step) for one bucket segment. The top code decodes to
 * scale * hi exactly, the bottom one to scale * lo, so a 1-bit bucket gives back its two
 * extremes bit for bit. A range wider than FLT_MAX goes through doubles. */
static void s_dequantize(const uint8_t *q, size_t n, float lo, float hi, unsigned levels,
                         float scale, bool acc, float *dst)
{
    double range = (double)hi - (double)lo;
    if (range > FLT_MAX) {
        double step = range / levels;
        for (size_t i = 0; i < n; i++) {
            float v = (float)(scale * ((double)lo + q[i] * step));
            dst[i] = acc ? dst[i] + v : v;
        }
        return;
    }
    const float a = scale * lo, top = scale * hi;
    const float b = (float)((double)scale * (range / levels));
    size_t i = 0;
    s_dequantize_v4(q, n / 4, a, b, top, levels, acc, dst);
    for (i = n / 4 * 4; i < n; i++) {
        float v = q[i] == levels ? top : a + (float)q[i] * b;
        dst[i] = acc ? dst[i] + v : v;
    }
}

int mq_quant_uniform_decode(const mq_codec_t *c, const uint8_t *src, float *dst, size_t n,
                            float scale, bool accumulate)
{
    const int K = c->bits;
    const unsigned levels = (1u << K) - 1;
    const size_t B = c->bucket ? c->bucket : n;
    const size_t nb = (n + B - 1) / B;

    /* Every range is checked before anything is written, so a bad payload leaves dst (and a
     * server's running sum) as it was. */
    for (size_t b = 0; b < nb; b++) {
        float lo = s_get_f32(src + 8 * b), hi = s_get_f32(src + 8 * b + 4);
        if (!isfinite(lo) || !isfinite(hi) || lo > hi) {
            mq_err_set("uniform:%d decode: bucket %zu of %zu has range [%g, %g] (expected "
                       "finite min <= max)",
                       K, b, nb, (double)lo, (double)hi);
            return -1;
        }
    }

    const uint8_t *codes = src + 8 * nb;
    const size_t code_bytes = (n / 8) * (size_t)K + ((n % 8) * (size_t)K + 7) / 8;
    uint8_t q[S_CHUNK];
    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t len = n - start < S_CHUNK ? n - start : S_CHUNK;
        size_t at = start / 8 * (size_t)K;
        s_unpack(codes + at, len, code_bytes - at, q, K);
        for (size_t i = start; i < start + len;) {
            size_t b = i / B;
            size_t b_end = (b + 1) * B < n ? (b + 1) * B : n;
            size_t seg_end = b_end < start + len ? b_end : start + len;
            float lo = s_get_f32(src + 8 * b), hi = s_get_f32(src + 8 * b + 4);
            s_dequantize(q + (i - start), seg_end - i, lo, hi, levels, scale, accumulate, dst + i);
            i = seg_end;
        }
    }
    return 0;
}
