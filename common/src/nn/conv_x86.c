/* The float model's convolution loops for x86: col2im, im2col and max-pooling's forward, with
 * AVX-512 or AVX2 as mq_fc_kind() says.
 *
 * col2im: a plane of an image shifted by one tap of the 5x5 kernel is the plane at an offset,
 * with the positions whose pixel falls outside it left out. The portable loop adds a row of
 * w values at a time (14 or 28), about 720 000 short loops a step for conv2; here a plane is
 * 13 vectors of 16 (AVX-512, masked) or 25 of 8 (AVX2). The sums are the portable loop's bit
 * for bit: each tap's values are added in the same order (channel, tap row, tap column,
 * image). With AVX-512 this makes conv2's col2im faster than the portable loop on one thread
 * (bench/README.md, bench_nn). im2col, a copy, done the same way plane by plane, was no faster
 * than the portable loop's memcpy of each row; what made it faster is taking a tap's row over
 * the whole batch at once, with streaming stores (s_im2col, s_im2col_avx2). mq_conv_fast()
 * says whether the col2im loops are used. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "nn_internal.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "x86_avx2.h"
#define AVX512 __attribute__((target("avx512f")))

enum { PAD = MQ_KSIZE / 2, MAX_CHUNKS = 64 }; /* planes up to 64 x 16 values (28 x 28: 49) */

/* Whether the position in row R, column C of an h x w plane reads a pixel inside it for tap
 * (ki, kj). */
static inline bool s_reads_pixel(int h, int w, int ki, int kj, int r, int c)
{
    const int sh = r + ki - PAD, sw = c + kj - PAD;
    return sh >= 0 && sh < h && sw >= 0 && sw < w;
}

/* col2im's sums start at +0.0: the n x c planes of x. */
static void s_zero_planes(float *x, int n, int c, int hw, size_t sn, size_t sc)
{
    for (int ni = 0; ni < n; ni++)
        for (int ci = 0; ci < c; ci++)
            memset(x + ni * sn + ci * sc, 0, sizeof(float) * hw);
}

/* For tap (ki, kj) of h x w planes laid one after another: which of positions 0..LEN read a
 * pixel inside their plane (position i is position i mod h*w of a plane), 16 positions a mask;
 * positions from LEN on read none. LEN = h*w: one plane (col2im); a multiple of both h*w and 16:
 * the masks of a whole batch, which repeat with that period (im2col). Returns the masks'
 * count. */
static int s_masks(int h, int w, int ki, int kj, int len, __mmask16 *m)
{
    const int chunks = (len + 15) / 16;
    if (chunks > MAX_CHUNKS)
        return -1;
    memset(m, 0, sizeof(__mmask16) * chunks);
    /* (r, c): position i's row and column in its plane, walked without dividing (this runs
     * on every call, 25 x 784 positions for conv2's im2col) */
    for (int i = 0, r = 0, c = 0; i < len; i++) {
        if (s_reads_pixel(h, w, ki, kj, r, c))
            m[i / 16] |= (__mmask16)(1u << (i % 16));
        if (++c == w) {
            c = 0;
            r = r + 1 == h ? 0 : r + 1;
        }
    }
    return chunks;
}

/* The plane's pointer moved by OFF values, as an integer: the lanes written there are inside
 * the plane, but the vector's first lane may not be. */
static inline float *s_at(const float *p, long off)
{
    return (float *)((uintptr_t)p + (uintptr_t)(off * (long)sizeof(float)));
}

AVX512 static void s_col2im(const float *col, size_t ld, int n, int c, int h, int w, size_t sn,
                            size_t sc, float *x)
{
    const int hw = h * w;
    __mmask16 m[MQ_KSIZE * MQ_KSIZE][MAX_CHUNKS];
    int chunks = 0;
    for (int t = 0; t < MQ_KSIZE * MQ_KSIZE; t++)
        chunks = s_masks(h, w, t / MQ_KSIZE, t % MQ_KSIZE, h * w, m[t]);
    s_zero_planes(x, n, c, hw, sn, sc);
    for (int ci = 0; ci < c; ci++)
        for (int t = 0; t < MQ_KSIZE * MQ_KSIZE; t++) {
            const int ki = t / MQ_KSIZE, kj = t % MQ_KSIZE;
            const long off = (long)(ki - PAD) * w + (kj - PAD);
            const float *row = col + (size_t)(ci * MQ_KSIZE * MQ_KSIZE + t) * ld;
            for (int ni = 0; ni < n; ni++) {
                const float *src = row + (size_t)ni * hw;
                float *dst = x + ni * sn + ci * sc;
                /* dst[i + off] += src[i] where position i reads a pixel: the mask of
                 * positions i is the tap's own, applied to both sides */
                for (int k = 0; k < chunks; k++) {
                    const __mmask16 mk = m[t][k];
                    float *d = s_at(dst, off + 16 * k);
                    __m512 v = _mm512_maskz_loadu_ps(mk, src + 16 * k);
                    _mm512_mask_storeu_ps(d, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, d), v));
                }
            }
        }
}

/* im2col where an image's plane is contiguous and the images follow one another (sn == h*w:
 * conv2's CNHW activations, conv1's one-channel input). Then the row of tap (ki, kj) over the
 * whole batch is col[i] = x[i + off] where position i mod h*w reads a pixel, and +0.0
 * elsewhere: one masked load and one full store for 16 values, the masks repeating every
 * PERIOD vectors. The portable loop copies rows of w values (about 720 000 memcpy calls of 14
 * values a step for conv2). The columns (40 MB for conv2) go to memory with streaming stores
 * when the rows are 64-byte aligned: without them each line was read before being written
 * over. On an Intel Xeon (family 6, model 207) this loop beat the memcpy loop with ordinary
 * stores already, and by far more with streaming ones (bench/README.md, bench_nn, "On an Intel
 * Xeon of family 6 model 207, a third time"). */
AVX512 static void s_im2col(const float *x, int n, int c, int h, int w, size_t sc, float *col,
                            size_t ld, int period)
{
    const int hw = h * w;
    const size_t total = (size_t)n * hw, full = total / 16;
    const __mmask16 tail = (__mmask16)((1u << (total % 16)) - 1);
    const bool stream = (uintptr_t)col % 64 == 0 && ld % 16 == 0;
    __mmask16 m[MQ_KSIZE * MQ_KSIZE][MAX_CHUNKS];
    for (int t = 0; t < MQ_KSIZE * MQ_KSIZE; t++)
        s_masks(h, w, t / MQ_KSIZE, t % MQ_KSIZE, 16 * period, m[t]);
    for (int ci = 0; ci < c; ci++)
        for (int t = 0; t < MQ_KSIZE * MQ_KSIZE; t++) {
            const long off = (long)(t / MQ_KSIZE - PAD) * w + (t % MQ_KSIZE - PAD);
            const float *src = x + ci * sc;
            float *row = col + (size_t)(ci * MQ_KSIZE * MQ_KSIZE + t) * ld;
            size_t v = 0;
            for (int k = 0; v < full; v++) {
                const __m512 a = _mm512_maskz_loadu_ps(m[t][k], s_at(src, off + 16 * (long)v));
                if (stream)
                    _mm512_stream_ps(row + 16 * v, a);
                else
                    _mm512_storeu_ps(row + 16 * v, a);
                k = k + 1 == period ? 0 : k + 1;
            }
            if (tail)
                _mm512_mask_storeu_ps(
                    row + 16 * v, tail,
                    _mm512_maskz_loadu_ps(m[t][v % period] & tail, s_at(src, off + 16 * (long)v)));
        }
    _mm_sfence(); /* the streamed columns are seen before whatever the caller signals next */
}

/* Vectors [*k0, *k1) of 8 values among the first FULL, read at an offset OFF in an array of
 * LEN values, that lie inside it: 8k + off >= 0 and 8k + 8 + off <= len. */
static void s_inside(long off, long len, long full, long *k0, long *k1)
{
    *k0 = off < 0 ? (-off + 7) / 8 : 0;
    if (*k0 > full)
        *k0 = full;
    const long k = (len - off) / 8;
    *k1 = k > full ? full : k < *k0 ? *k0 : k;
}

/* Eight floats to P, streamed to memory or stored. */
MQ_AVX2 static inline void s_put8(float *p, __m256 a, bool stream)
{
    if (stream)
        _mm256_stream_ps(p, a);
    else
        _mm256_storeu_ps(p, a);
}

/* im2col as s_im2col with AVX2, eight positions a vector, each stored whole. A vector that
 * lies inside the channel's n planes is a plain load with its lanes whose pixel is outside
 * their plane cleared (AND with the lane mask: +0.0); one that starts before them or ends past
 * them (the first and last few of a tap) is a masked load (VMASKMOVPS), which reads only the
 * lanes it keeps. Taps outermost, so that a tap's lane masks, widened from s_masks' bits once
 * (2 * PERIOD vectors of 8, at most 4 KB), serve every channel. On a Zen 3 masked loads
 * throughout already beat the memcpy loop, and plain loads with the lane mask, as here, beat
 * them (bench/README.md, "On a Zen 3 again (2026-11-29): im2col with AVX2"). */
MQ_AVX2 static void s_im2col_avx2(const float *x, int n, int c, int h, int w, size_t sc, float *col,
                                  size_t ld, int period)
{
    const size_t total = (size_t)n * h * w, full = total / 8;
    const int rest = (int)(total % 8), vecs = 2 * period;
    const bool stream = (uintptr_t)col % 32 == 0 && ld % 8 == 0;
    __mmask16 m[MAX_CHUNKS];
    __m256i lanes[2 * MAX_CHUNKS];
    for (int t = 0; t < MQ_KSIZE * MQ_KSIZE; t++) {
        const long off = (long)(t / MQ_KSIZE - PAD) * w + (t % MQ_KSIZE - PAD);
        s_masks(h, w, t / MQ_KSIZE, t % MQ_KSIZE, 16 * period, m);
        for (int k = 0; k < vecs; k++)
            lanes[k] = mq_bits8(m[k / 2] >> (8 * (k % 2)));
        long in0, in1; /* the vectors inside the channel's planes */
        s_inside(off, (long)total, (long)full, &in0, &in1);
        const size_t v0 = (size_t)in0, v1 = (size_t)in1;
        for (int ci = 0; ci < c; ci++) {
            const float *src = x + ci * sc;
            float *row = col + (size_t)(ci * MQ_KSIZE * MQ_KSIZE + t) * ld;
            size_t v = 0;
            int k = 0;
            for (; v < full; v++, k = k + 1 == vecs ? 0 : k + 1) {
                const long at = off + 8 * (long)v;
                s_put8(row + 8 * v,
                       v >= v0 && v < v1
                           ? _mm256_and_ps(_mm256_loadu_ps(src + at), _mm256_castsi256_ps(lanes[k]))
                           : _mm256_maskload_ps(s_at(src, at), lanes[k]),
                       stream);
            }
            if (rest) {
                const __m256i in = _mm256_and_si256(lanes[k], mq_lanes8(rest));
                float last[8];
                _mm256_storeu_ps(last, _mm256_maskload_ps(s_at(src, off + 8 * (long)v), in));
                memcpy(row + 8 * v, last, sizeof(float) * rest);
            }
        }
    }
    _mm_sfence();
}

/* The same with AVX2, eight positions a vector and no masked stores (slow on AMD's cores):
 * a lane whose pixel lies outside the plane adds +0.0, which leaves every sum as it was (the
 * sums start at +0.0 and so are never -0.0, the one value that x + 0 changes). The positions
 * of a tap whose vector would reach past either end of the plane (where another thread's
 * channel may lie) go one by one, from a list. Planes up to AVX2_W_MAX wide (mq_conv_fast),
 * which bounds that list. */
enum {
    AVX2_W_MAX = 32,
    ONE_MAX = 4 * AVX2_W_MAX + 32, /* such positions of a tap: at most 4w + 26 */
};

typedef struct {
    long off;                   /* where position 0's pixel is */
    int k0, k1;                 /* vectors k0..k1 lie inside the plane on both sides */
    int none;                   /* positions in ONE */
    uint8_t on[MAX_CHUNKS * 2]; /* vector k's lanes that read a pixel */
    int16_t one[ONE_MAX];       /* the other positions that read a pixel */
} s_tap_t;

static void s_tap(int h, int w, int ki, int kj, s_tap_t *t)
{
    const int hw = h * w, full = hw / 8;
    t->off = (long)(ki - PAD) * w + (kj - PAD);
    long k0, k1;
    s_inside(t->off, hw, full, &k0, &k1);
    t->k0 = (int)k0, t->k1 = (int)k1;
    t->none = 0;
    memset(t->on, 0, sizeof t->on);
    for (int i = 0; i < hw; i++) {
        if (!s_reads_pixel(h, w, ki, kj, i / w, i % w))
            continue;
        if (i >= 8 * t->k0 && i < 8 * t->k1)
            t->on[i / 8] |= (uint8_t)(1u << (i % 8));
        else
            t->one[t->none++] = (int16_t)i;
    }
}

MQ_AVX2 static void s_col2im_avx2(const float *col, size_t ld, int n, int c, int h, int w,
                                  size_t sn, size_t sc, float *x)
{
    const int hw = h * w;
    s_tap_t taps[MQ_KSIZE * MQ_KSIZE];
    for (int t = 0; t < MQ_KSIZE * MQ_KSIZE; t++)
        s_tap(h, w, t / MQ_KSIZE, t % MQ_KSIZE, &taps[t]);
    s_zero_planes(x, n, c, hw, sn, sc);
    for (int ci = 0; ci < c; ci++)
        for (int t = 0; t < MQ_KSIZE * MQ_KSIZE; t++) {
            const s_tap_t *tp = &taps[t];
            const float *row = col + (size_t)(ci * MQ_KSIZE * MQ_KSIZE + t) * ld;
            for (int ni = 0; ni < n; ni++) {
                const float *src = row + (size_t)ni * hw;
                float *dst = x + ni * sn + ci * sc;
                for (int k = tp->k0; k < tp->k1; k++) {
                    if (!tp->on[k])
                        continue;
                    const __m256i on = mq_bits8(tp->on[k]);
                    float *d = dst + tp->off + 8 * k;
                    const __m256 v =
                        _mm256_and_ps(_mm256_castsi256_ps(on), _mm256_loadu_ps(src + 8 * k));
                    _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), v));
                }
                for (int j = 0; j < tp->none; j++)
                    dst[tp->one[j] + tp->off] += src[tp->one[j]];
            }
        }
}

/* Max-pooling, 3x3 windows at stride 2 (mq_pool_forward), for planes up to 32 wide: an output
 * row's (up to 16) windows at once. Each input row is two masked vectors, and the windows'
 * columns 2j, 2j+1 and 2j+2 are three permutations of them; the windows' cells are visited
 * in the portable loop's order (row, then column) with its strict, ordered comparison, so the
 * maxima and the positions taken (the first of equal values) are its own. The portable loop
 * compares nine values one at a time, each a branch the data decides. */
AVX512 static void s_pool_forward(const float *x, int planes, int h, int w, float *y, int32_t *arg)
{
    const int ho = mq_pool_out(h), wo = mq_pool_out(w);
    const __mmask16 out = (__mmask16)((1u << wo) - 1),
                    lo = (__mmask16)(w >= 16 ? 0xffffu : (1u << w) - 1),
                    hi = (__mmask16)(w <= 16 ? 0 : (1u << (w - 16)) - 1);
    __m512i pick[3], cols[3];
    __mmask16 ok[3];
    for (int dc = 0; dc < 3; dc++) {
        int32_t at[16];
        ok[dc] = 0;
        for (int j = 0; j < 16; j++) {
            at[j] = (2 * j + dc) & 31;
            if (j < wo && 2 * j + dc < w)
                ok[dc] |= (__mmask16)(1u << j);
        }
        pick[dc] = _mm512_loadu_si512(at);
        cols[dc] = pick[dc];
    }
    for (int p = 0; p < planes; p++) {
        const float *xp = x + (size_t)p * h * w;
        float *yp = y + (size_t)p * ho * wo;
        int32_t *ap = arg + (size_t)p * ho * wo;
        for (int i = 0; i < ho; i++) {
            const int r0 = 2 * i, r1 = r0 + 3 < h ? r0 + 3 : h;
            __m512 best = _mm512_setzero_ps();
            __m512i where = _mm512_setzero_si512();
            for (int r = r0; r < r1; r++) {
                const float *row = xp + (size_t)r * w;
                const __m512 a = _mm512_maskz_loadu_ps(lo, row),
                             b = _mm512_maskz_loadu_ps(hi, row + 16);
                const __m512i base = _mm512_set1_epi32(r * w);
                for (int dc = 0; dc < 3; dc++) {
                    const __m512 v = _mm512_permutex2var_ps(a, pick[dc], b);
                    if (r == r0 && dc == 0) { /* the window's first cell */
                        best = v;
                        where = _mm512_add_epi32(base, cols[0]);
                        continue;
                    }
                    const __mmask16 gt = _mm512_mask_cmp_ps_mask(ok[dc], v, best, _CMP_GT_OQ);
                    best = _mm512_mask_mov_ps(best, gt, v);
                    where = _mm512_mask_mov_epi32(where, gt, _mm512_add_epi32(base, cols[dc]));
                }
            }
            _mm512_mask_storeu_ps(yp + i * wo, out, best);
            _mm512_mask_storeu_epi32(ap + i * wo, out, where);
        }
    }
}

/* Lanes 0, 2, 4, 6 of A then of B (ODD: 1, 3, 5, 7): eight columns 2 apart. */
MQ_AVX2 static inline __m256 s_evens(__m256 a, __m256 b, bool odd)
{
    const __m256 e = odd ? _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))
                         : _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
}

/* The same with AVX2, eight windows a vector, two vectors a row. A window's columns 2j, 2j+1
 * and 2j+2 of input row r are the even and odd lanes of the row's 16 values from 2j0 and the
 * even lanes of those from 2j0+2; the visit order, the comparison and the positions are the
 * AVX-512 loop's. The row is written through a small buffer (a masked store is slow on
 * AMD's cores). */
MQ_AVX2 static void s_pool_forward_avx2(const float *x, int planes, int h, int w, float *y,
                                        int32_t *arg)
{
    const int ho = mq_pool_out(h), wo = mq_pool_out(w);
    __m256 ok[2][3];
    __m256i cols[2][3];
    for (int q = 0; q < 2; q++)
        for (int dc = 0; dc < 3; dc++) {
            int32_t at[8], on[8];
            for (int l = 0; l < 8; l++) {
                const int j = 8 * q + l;
                at[l] = 2 * j + dc;
                on[l] = j < wo && 2 * j + dc < w ? -1 : 0;
            }
            cols[q][dc] = _mm256_loadu_si256((const __m256i *)at);
            ok[q][dc] = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)on));
        }
    const int nq = wo > 8 ? 2 : 1;
    float yb[16];
    int32_t ab[16];
    for (int p = 0; p < planes; p++) {
        const float *xp = x + (size_t)p * h * w;
        for (int i = 0; i < ho; i++) {
            const int r0 = 2 * i, r1 = r0 + 3 < h ? r0 + 3 : h;
            for (int q = 0; q < nq; q++) {
                const int c0 = 16 * q;
                __m256 best = _mm256_setzero_ps();
                __m256i where = _mm256_setzero_si256();
                for (int r = r0; r < r1; r++) {
                    const float *row = xp + (size_t)r * w + c0;
                    const int left = w - c0;
                    const __m256 a = mq_load8(row, left), b = mq_load8(row + 8, left - 8),
                                 a2 = mq_load8(row + 2, left - 2),
                                 b2 = mq_load8(row + 10, left - 10);
                    const __m256 v[3] = {s_evens(a, b, false), s_evens(a, b, true),
                                         s_evens(a2, b2, false)};
                    const __m256i base = _mm256_set1_epi32(r * w);
                    for (int dc = 0; dc < 3; dc++) {
                        const __m256i pos = _mm256_add_epi32(base, cols[q][dc]);
                        if (r == r0 && dc == 0) { /* the window's first cell */
                            best = v[0];
                            where = pos;
                            continue;
                        }
                        const __m256 gt =
                            _mm256_and_ps(ok[q][dc], _mm256_cmp_ps(v[dc], best, _CMP_GT_OQ));
                        best = _mm256_blendv_ps(best, v[dc], gt);
                        where = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(where),
                                                                     _mm256_castsi256_ps(pos), gt));
                    }
                }
                _mm256_storeu_ps(yb + 8 * q, best);
                _mm256_storeu_si256((__m256i *)(ab + 8 * q), where);
            }
            memcpy(y + ((size_t)p * ho + i) * wo, yb, sizeof(float) * wo);
            memcpy(arg + ((size_t)p * ho + i) * wo, ab, sizeof(int32_t) * wo);
        }
    }
}
#endif

bool mq_conv_fast_pool(const float *x, int planes, int h, int w, float *y, int32_t *arg)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (w > 32)
        return false;
    switch (mq_fc_kind()) {
    case MQ_FC_AVX512:
        s_pool_forward(x, planes, h, w, y, arg);
        return true;
    case MQ_FC_AVX2:
        s_pool_forward_avx2(x, planes, h, w, y, arg);
        return true;
    case MQ_FC_BLAS:
        break;
    }
    return false;
#else
    (void)x, (void)planes, (void)h, (void)w, (void)y, (void)arg;
    return false;
#endif
}

bool mq_conv_fast(int h, int w)
{
#if defined(__x86_64__) && defined(__GNUC__)
    switch (mq_fc_kind()) {
    case MQ_FC_AVX512:
        return (h * w + 15) / 16 <= MAX_CHUNKS;
    case MQ_FC_AVX2:
        return (h * w + 15) / 16 <= MAX_CHUNKS && w <= AVX2_W_MAX;
    case MQ_FC_BLAS:
        break;
    }
    return false;
#else
    (void)h, (void)w;
    return false;
#endif
}

bool mq_conv_fast_im2col(const float *x, int n, int c, int h, int w, size_t sn, size_t sc,
                         float *col, size_t ld)
{
#if defined(__x86_64__) && defined(__GNUC__)
    /* the masks repeat every lcm(hw, 16) values: hw / gcd(hw, 16) vectors */
    const int hw = h * w, low = hw & -hw, period = hw / (low < 16 ? low : 16);
    if (mq_fc_kind() == MQ_FC_BLAS || sn != (size_t)hw || period > MAX_CHUNKS)
        return false;
    if (mq_fc_kind() == MQ_FC_AVX512)
        s_im2col(x, n, c, h, w, sc, col, ld, period);
    else
        s_im2col_avx2(x, n, c, h, w, sc, col, ld, period);
    return true;
#else
    (void)x, (void)n, (void)c, (void)h, (void)w, (void)sn, (void)sc, (void)col, (void)ld;
    return false;
#endif
}

void mq_conv_fast_col2im(const float *col, size_t ld, int n, int c, int h, int w, size_t sn,
                         size_t sc, float *x)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (mq_fc_kind() == MQ_FC_AVX512)
        s_col2im(col, ld, n, c, h, w, sn, sc, x);
    else
        s_col2im_avx2(col, ld, n, c, h, w, sn, sc, x);
#else
    (void)col, (void)ld, (void)n, (void)c, (void)h, (void)w, (void)sn, (void)sc, (void)x;
#endif
}
