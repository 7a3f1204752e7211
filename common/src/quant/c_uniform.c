/* The `uniform` codec: min-max linear quantization to K bits with a range per bucket, MQGrad's
 * quantizer. Spec: uniform[:K][:bucket=B][:stochastic]. Parameter words: 0 = B (values per
 * range, 0 = one range for the whole tensor slice, the paper's), 1 = stochastic (0 or 1).
 *
 * Payload layout (little-endian), for n values, nb = ceil(n / B) buckets, K bits:
 *
 *     nb x { float32 min, float32 max }          the range header, 8*nb bytes
 *     ceil(n*K/8) bytes of codes                 value i uses bits [i*K, i*K+K) of the
 *                                                code stream, least significant bit first
 *
 * Codes are packed across bucket boundaries, so there is no padding anywhere: the payload is
 * exactly 8*nb + ceil(n*K/8) bytes. Quantization follows TensorFlow's Quantize with
 * MIN_COMBINED (the MQGrad paper uses it): q = round((x - min) * (2^K - 1) / (max - min)),
 * x^ = min + q * (max - min) / (2^K - 1); a constant bucket decodes exactly. Stochastic
 * rounding rounds up with probability equal to the fractional part, which makes x^ unbiased.
 *
 * This file walks buckets and chunks; the loops over values are in kernels.c. Work goes in
 * chunks of S_CHUNK values, a multiple of 8: eight K-bit codes are exactly K bytes, so every
 * chunk starts on a byte of the code stream whatever K and the bucket size are. A chunk is
 * quantized into one byte per code while it is in L1 (the statistics read those), and packed:
 * by the kernels as they go where its runs are whole steps of 32 values (s_chunk_pk), else in
 * a pass after it, which is arithmetic with no loads beside it. With bucket = 0 the range
 * needs a first pass over the whole tensor (read only); with buckets, each bucket's range is
 * taken when the walk reaches it, so its values are still cached. Error feedback has its own
 * walk (s_encode_ef): one kernel per bucket run adds, quantizes and stores the new residual,
 * and a bucket's last run scans the range of src + residual of the next bucket in the same
 * loop, so that the next bucket's loads from memory overlap this one's arithmetic.
 * Stochastic noise is drawn inside the quantize kernels where the bucket runs allow
 * (s_noise_inline); the generator steps, and so the payloads, are those of drawing each
 * chunk's noise into an array first. */

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "quant_internal.h"

#define S_BUCKET(c) ((c)->param[0])
#define S_STOCHASTIC(c) ((c)->param[1] != 0)

#define S_AT(p, i) ((p) ? (p) + (i) : NULL) /* an array that may be absent, from I on */
#define S_CHUNK 2048 /* values per pass: codes and noise stay in L1 */
_Static_assert(S_CHUNK <= MQ_QUANT_SUMS_MAX, "a chunk's code sums must fit code_sums' lanes");

#define S_FLUSH 128 /* values decoded between two flushes of streamed lines (decode) */

/* ---- statistics ----------------------------------------------------------------------
 * The sum of squares of a bucket segment's decoded values, from the integer sums of its
 * codes while they are in cache. With x^ = lo + q * step and step = (hi - lo) / levels,
 * sum x^2 = n*lo^2 + 2*lo*step*sum(q) + step^2*sum(q^2). The top code decodes to hi, which
 * is lo + levels * step in exact arithmetic, so it needs no term (nor count) of its own; a
 * constant bucket has step 0 and gives n*lo^2 whatever its codes say. The integer sums are
 * exact, so this is the sum of the exact x^ to double rounding. Decode rounds each x^ to
 * float (with step rounded to float first), so a sum taken over its output differs by about
 * float precision (at most 2e-7 relative on the tests' gradients). */

static double s_sq_of_codes(const mq_quant_kernels_t *kn, const uint8_t *q, size_t n, int K,
                            float lo, float hi)
{
    double dlo = lo, range = (double)hi - dlo;
    if (range == 0.0)
        return (double)n * dlo * dlo;
    mq_quant_sums_t t = kn->code_sums(q, n, K);
    double step = range / (double)((1u << K) - 1);
    /* the sums are below 2^31: signed conversions, which x86-64 does in one instruction */
    return (double)n * dlo * dlo +
           step * (2.0 * dlo * (double)(int64_t)t.sum + step * (double)(int64_t)t.sum_sq);
}

/* The same for values [start, start + len) of an n-value tensor, a chunk whose codes are
 * q[0..len), bucket by bucket, the ranges read from the payload's header HDR. Run after the
 * chunk is quantized or dequantized: its codes are then in L1. */
static double s_sq_of_chunk(const mq_quant_kernels_t *kn, const mq_codec_t *c, size_t n,
                            const uint8_t *hdr, const uint8_t *q, size_t start, size_t len)
{
    const size_t B = mq_quant_bucket_len(S_BUCKET(c), n);
    double sq = 0.0;
    for (size_t i = start; i < start + len;) {
        size_t seg_end = mq_quant_run_end(i, B, n, start + len);
        const uint8_t *r = hdr + 8 * (i / B);
        sq += s_sq_of_codes(kn, q + (i - start), seg_end - i, c->bits, mq_get_f32(r),
                            mq_get_f32(r + 4));
        i = seg_end;
    }
    return sq;
}

/* The end of an encode chunk of LEN codes from START (one byte each in OUT): their decoded
 * sum of squares if WANT_SQ (else 0), and, below 8 bits, the codes packed into CODES unless
 * the kernels PACKED them as they went. */
static double s_chunk_done(const mq_quant_kernels_t *kn, const mq_codec_t *c, size_t n,
                           const uint8_t *hdr, const uint8_t *out, size_t start, size_t len,
                           bool want_sq, uint8_t *codes, size_t code_bytes, bool packed)
{
    double sq = want_sq ? s_sq_of_chunk(kn, c, n, hdr, out, start, len) : 0.0;
    if (c->bits < 8 && !packed) {
        size_t at = start / 8 * (size_t)c->bits;
        kn->pack(out, len, codes + at, code_bytes - at, c->bits);
    }
    return sq;
}

/* ---- encoding ------------------------------------------------------------------------*/

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
 * [0, 1) on a grid of 2^-16: floor(y + u) rounds y up with probability frac(y) to within
 * 2^-16, so the decoded value is unbiased up to 2^-16 of a step (plus the float rounding of
 * y + u: at 8 bits y < 256 keeps 16 bits of u, the same order). y >= 0 because x >= lo, so
 * truncation is floor; the clamp catches y + u at levels + 1 when rounding in (x - lo) * inv
 * leaves y a hair above levels (rounding to nearest it cannot act, and the kernels may skip it:
 * quantize's contract, quant_internal.h). */
static void s_quantize(const mq_quant_kernels_t *kn, const float *x, size_t n, const s_qparams_t *p,
                       unsigned levels, const float *noise, uint8_t *q, uint8_t *pk)
{
    if (p->constant || p->wide) {
        if (p->constant) {
            memset(q, 0, n);
        } else {
            const int top = (int)levels;
            for (size_t i = 0; i < n; i++) {
                double y = ((double)x[i] - p->lo_d) * p->inv_d + (noise ? noise[i] : 0.5);
                int k = (int)y;
                q[i] = (uint8_t)(k > top ? top : k);
            }
        }
        if (pk) {
            const int K = mq_quant_bits_of(levels);
            kn->pack(q, n, pk, mq_quant_code_bytes(n, K), K);
        }
        return;
    }
    kn->quantize(x, n, p->lo, p->inv, (float)levels, noise, q, pk);
}

/* Stochastic codes with the noise drawn from GEN as the kernel goes (quantize_noise), for a
 * run of values that starts on a 16-value step of the generator. A constant or wide bucket
 * draws its noise into SCRATCH (n floats) instead: the generator takes the same steps either
 * way, so the codes are those of noise() for the whole chunk followed by s_quantize. */
static void s_quantize_gen(const mq_quant_kernels_t *kn, const float *x, size_t n,
                           const s_qparams_t *p, unsigned levels, mq_quant_noise_t *gen,
                           float *scratch, uint8_t *q, uint8_t *pk)
{
    if (p->constant || p->wide) {
        kn->noise(gen, scratch, n);
        s_quantize(kn, x, n, p, levels, scratch, q, pk);
        return;
    }
    kn->quantize_noise(x, n, p->lo, p->inv, (float)levels, gen, q, pk);
}

/* Where the kernels pack the codes of the chunk [start, start + len) as they go (their PK),
 * or NULL for a pack pass after it: they can where every run of the chunk is whole steps of
 * 32 values (buckets a multiple of 32, or one range) and at least 8 bytes of the payload's
 * codes follow the chunk's (a kernel may write that far past its own). */
static uint8_t *s_chunk_pk(int K, size_t B, size_t nb, size_t start, size_t len, uint8_t *codes,
                           size_t code_bytes)
{
    if (K >= 8 || (B % 32 != 0 && nb != 1) || len % 32 != 0 ||
        (start + len) / 8 * (size_t)K + 8 > code_bytes)
        return NULL;
    return codes + start / 8 * (size_t)K;
}

/* Whether a stochastic encode can draw the noise inside the quantize kernel: every bucket
 * run of a chunk must start on a 16-value step (chunks do), so B a multiple of 16 or one
 * bucket for the whole tensor. Otherwise the chunk's noise is drawn first, into an array. */
static bool s_noise_inline(size_t B, size_t nb)
{
    return B % 16 == 0 || nb == 1;
}

/* Range of bucket b (values x[0..n)) into the header and *p; -1 with an error on a value
 * that is not finite. A zero extreme is stored as +0 whichever zero the scan met first, so
 * the header does not depend on the kernels' lane order. */
static int s_bucket_range(const mq_quant_kernels_t *kn, const mq_codec_t *c, const float *x,
                          size_t n, size_t at, size_t total, uint8_t *hdr, s_qparams_t *p)
{
    float lo, hi;
    if (!kn->minmax(x, n, &lo, &hi)) {
        size_t bad = at + mq_quant_first_nonfinite(x, n);
        mq_err_set("uniform:%d encode: value %zu of %zu is %s (expected finite numbers)", c->bits,
                   bad, total, isnan(x[bad - at]) ? "NaN" : "infinite");
        return -1;
    }
    lo += 0.0f;
    hi += 0.0f;
    mq_put_f32(hdr, lo);
    mq_put_f32(hdr + 4, hi);
    *p = s_qparams(lo, hi, (1u << c->bits) - 1);
    return 0;
}

static size_t s_max_size(const mq_codec_t *c, size_t n)
{
    return 8 * mq_quant_nbuckets(S_BUCKET(c), n) + mq_quant_code_bytes(n, c->bits);
}

static int s_encode(const mq_codec_t *c, const float *src, size_t n, const mq_codec_ctx_t *ctx,
                    uint8_t *dst, size_t *out_len, mq_codec_stats_t *stats)
{
    mq_rng_t *rng = ctx->rng;
    *out_len = s_max_size(c, n);
    const mq_quant_kernels_t *kn = mq_quant_kernels();
    const int K = c->bits;
    const unsigned levels = (1u << K) - 1;
    const size_t B = mq_quant_bucket_len(S_BUCKET(c), n), nb = mq_quant_nbuckets(S_BUCKET(c), n);
    uint8_t *codes = dst + 8 * nb;
    const size_t code_bytes = mq_quant_code_bytes(n, K);
    uint8_t q[S_CHUNK];
    float noise[S_CHUNK];
    size_t next_bucket = 0; /* buckets get their range when first reached: still in cache */
    s_qparams_t p = {0};
    double sq = 0.0;
    mq_quant_noise_t gen;
    const bool inline_noise = S_STOCHASTIC(c) && s_noise_inline(B, nb);
    if (S_STOCHASTIC(c))
        mq_quant_noise_seed(&gen, rng);

    /* The codes are stored with ordinary stores: streaming them (staged per chunk) was
     * measured no faster. This walk is bound by its arithmetic (from memory it runs at the
     * rate it runs at on a cached tensor), where error feedback, bound by its traffic,
     * streams its 8-bit codes (s_encode_ef). */
    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t len = n - start < S_CHUNK ? n - start : S_CHUNK;
        uint8_t *out = K == 8 ? codes + start : q; /* 8-bit codes need no packing */
        uint8_t *pk = s_chunk_pk(K, B, nb, start, len, codes, code_bytes);
        if (S_STOCHASTIC(c) && !inline_noise)
            kn->noise(&gen, noise, len);
        for (size_t i = start; i < start + len;) {
            size_t b = i / B, seg_end = mq_quant_run_end(i, B, n, start + len);
            if (b == next_bucket) {
                size_t b0 = b * B, d = mq_quant_run_end(b0, B, n, n) - b0;
                if (s_bucket_range(kn, c, src + b0, d, b0, n, dst + 8 * b, &p) < 0)
                    return -1;
                next_bucket++;
            }
            uint8_t *pki = pk ? pk + (i - start) / 8 * (size_t)K : NULL;
            if (inline_noise)
                s_quantize_gen(kn, src + i, seg_end - i, &p, levels, &gen, noise, out + (i - start),
                               pki);
            else
                s_quantize(kn, src + i, seg_end - i, &p, levels,
                           S_STOCHASTIC(c) ? noise + (i - start) : NULL, out + (i - start), pki);
            i = seg_end;
        }
        sq += s_chunk_done(kn, c, n, dst, out, start, len, stats != NULL, codes, code_bytes,
                           pk != NULL);
        /* Read for the last time (a bucket's range scans ahead, never back): zeroed while
         * in cache, for a caller whose next gradient adds onto the array. */
        if (ctx->clear)
            memset(ctx->clear + start, 0, len * sizeof *ctx->clear);
    }
    if (stats)
        stats->sq = sq;
    return 0;
}

/* How one bucket decodes: dst[i] (+)= scale * (lo + q[i] * step). The top code decodes to
 * scale * hi exactly, the bottom one to scale * lo, so a 1-bit bucket gives back its two
 * extremes bit for bit. A range wider than FLT_MAX goes through doubles. */
typedef struct {
    mq_quant_deq_t d;
    bool wide;
    double lo, step, scale;
} s_deq_t;

static s_deq_t s_deq_params(float lo, float hi, unsigned levels, float scale)
{
    double range = (double)hi - (double)lo;
    s_deq_t p = {.wide = range > FLT_MAX, .lo = lo, .step = range / levels, .scale = scale};
    p.d = (mq_quant_deq_t){
        .a = scale * lo,
        .b = (float)((double)scale * (range / levels)),
        .top = scale * hi,
        .levels = levels,
    };
    return p;
}

static void s_dequantize(const mq_quant_kernels_t *kn, const s_deq_t *p, const uint8_t *q, size_t n,
                         bool acc, bool stream, float *dst)
{
    if (p->wide) {
        for (size_t i = 0; i < n; i++) {
            float v = (float)(p->scale * (p->lo + q[i] * p->step));
            dst[i] = acc ? dst[i] + v : v;
        }
    } else if (stream) {
        kn->dequantize_stream(q, n, &p->d, dst);
    } else {
        kn->dequantize(q, n, &p->d, acc, dst);
    }
}

/* A sum src + residual (residual alone with SRC NULL) that is not finite: the generic path's
 * error (mq_codec_encode_ef then resets the residual), after the fence that any codes streamed
 * so far need. */
static int s_ef_failed(const float *src, const float *res, size_t n, int K)
{
    mq_quant_stream_fence();
    if ((src ? mq_quant_check_finite_sum("codec encode", src, res, n)
             : mq_quant_check_finite("codec encode", res, n)) == 0)
        mq_err_set("uniform:%d encode: a sum is not finite", K); /* not reached */
    return -1;
}

/* Error feedback in the codec's own walk (ops->encode_ef): v = src + residual is encoded and
 * residual becomes v - decode(payload), bit for bit what the generic path (add, encode, then
 * decode with scale -1 accumulating into the residual) leaves, in one pass where the values
 * have a range per bucket. A bucket's range (of src + residual, read only) is scanned while
 * the previous bucket's last run is quantized (quantize_ef_scan), so the bucket is still cached
 * when its run kernel (quantize_ef) adds, quantizes and stores v minus the code's value as the
 * residual: each value is loaded from memory and stored to it once, and the loads from memory
 * run beside arithmetic instead of between it (measured: bench/README.md). With one range for the
 * tensor that range is a pass of its own. A sum that is not finite may be met after earlier
 * buckets' residuals are stored: the encode fails and mq_codec_encode_ef resets the residual
 * (quant.h), which keeping it as it was would have cost a read-only pass over both arrays on every
 * encode. With SRC NULL (in place) residual holds v: one array is read and written. */
static int s_encode_ef(const mq_codec_t *c, const float *src, float *res, size_t n,
                       const mq_codec_ctx_t *ctx, uint8_t *dst, size_t *out_len,
                       mq_codec_stats_t *stats)
{
    *out_len = s_max_size(c, n);
    const mq_quant_kernels_t *kn = mq_quant_kernels();
    const int K = c->bits;
    const unsigned levels = (1u << K) - 1;
    const size_t B = mq_quant_bucket_len(S_BUCKET(c), n), nb = mq_quant_nbuckets(S_BUCKET(c), n);
    uint8_t *codes = dst + 8 * nb;
    const size_t code_bytes = mq_quant_code_bytes(n, K);
    uint8_t q[S_CHUNK];
    float noise[S_CHUNK];
    mq_quant_noise_t gen;
    const bool inline_noise = S_STOCHASTIC(c) && s_noise_inline(B, nb);
    if (S_STOCHASTIC(c))
        mq_quant_noise_seed(&gen, ctx->rng);
    size_t cur = SIZE_MAX; /* the bucket whose constants p and dp hold; buckets come in order */
    s_qparams_t p = {0};
    s_deq_t dp = {0};
    bool scanned = false; /* the range of bucket cur + 1 is in next_lo, next_hi */
    float next_lo = 0.0f, next_hi = 0.0f;
    double sq = 0.0;
    size_t b = 0, b_end = B < n ? B : n; /* the bucket the walk is in, and where it ends */
    /* A large tensor's 8-bit codes are staged in q per chunk and streamed to the payload:
     * the walk's own 12 bytes a value push the payload's first lines out of the cache long
     * before it is sent, and the codes' read for ownership is a byte a value of the 14 it
     * moves (measured: bench/README.md). Codes below 8 bits are packed as they go; staging
     * them to stream measured no faster at 2 and 4 bits. Stochastic rounding is bound by its
     * noise, not its traffic: staging made it slower (bench/README.md), so it stores its codes
     * as they come. */
    const bool stream = K == 8 && !S_STOCHASTIC(c) && mq_quant_streams(n);
    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t len = n - start < S_CHUNK ? n - start : S_CHUNK;
        uint8_t *out = K == 8 && !stream ? codes + start : q;
        uint8_t *pk = s_chunk_pk(K, B, nb, start, len, codes, code_bytes);
        if (S_STOCHASTIC(c) && !inline_noise)
            kn->noise(&gen, noise, len);
        for (size_t i = start; i < start + len;) {
            if (i == b_end) { /* runs end at buckets' and chunks' ends: no division needed */
                b++;
                b_end = n - b_end > B ? b_end + B : n;
            }
            size_t seg_end = b_end < start + len ? b_end : start + len, m = seg_end - i;
            if (b != cur) {
                size_t b0 = b * B, d = b + 1 < nb ? B : n - b0;
                float lo = next_lo, hi = next_hi;
                if (!scanned && !(src ? kn->minmax_sum(src + b0, res + b0, d, &lo, &hi)
                                      : kn->minmax(res + b0, d, &lo, &hi)))
                    return s_ef_failed(src, res, n, K);
                scanned = false;
                lo += 0.0f; /* +0 whichever zero the scan met (s_bucket_range) */
                hi += 0.0f;
                mq_put_f32(dst + 8 * b, lo);
                mq_put_f32(dst + 8 * b + 4, hi);
                p = s_qparams(lo, hi, levels);
                dp = s_deq_params(lo, hi, levels, -1.0f);
                cur = b;
            }
            uint8_t *qi = out + (i - start);
            uint8_t *pki = pk ? pk + (i - start) / 8 * (size_t)K : NULL;
            mq_quant_noise_t *gi = inline_noise ? &gen : NULL;
            size_t next = (b + 1) * B; /* where bucket b + 1 starts */
            if (!p.constant && !p.wide && !dp.wide && (inline_noise || !S_STOCHASTIC(c))) {
                if (seg_end == next && b + 1 < nb) { /* the bucket's last run: scan the next */
                    size_t d = b + 2 < nb ? B : n - next;
                    const float *na = src ? src + next : res + next;
                    const float *nb = src ? res + next : NULL;
                    if (!kn->quantize_ef_scan(S_AT(src, i), res + i, m, p.lo, p.inv, (float)levels,
                                              &dp.d, gi, qi, pki, na, nb, d, &next_lo, &next_hi))
                        return s_ef_failed(src, res, n, K);
                    scanned = true;
                } else {
                    kn->quantize_ef(S_AT(src, i), res + i, m, p.lo, p.inv, (float)levels, &dp.d, gi,
                                    qi, pki);
                }
            } else { /* the same three steps one after the other */
                if (src)
                    kn->add(res + i, src + i, m);
                if (inline_noise)
                    s_quantize_gen(kn, res + i, m, &p, levels, &gen, noise, qi, pki);
                else
                    s_quantize(kn, res + i, m, &p, levels,
                               S_STOCHASTIC(c) ? noise + (i - start) : NULL, qi, pki);
                s_dequantize(kn, &dp, qi, m, true, false, res + i);
            }
            i = seg_end;
        }
        sq += s_chunk_done(kn, c, n, dst, out, start, len, stats != NULL, codes, code_bytes,
                           pk != NULL);
        if (stream)
            kn->stream(codes + start, q, len);
    }
    if (stream)
        mq_quant_stream_fence();
    if (stats)
        stats->sq = sq;
    return 0;
}

/* ---- decoding ------------------------------------------------------------------------*/

/* Streams out[flushed, upto) to dst, stopping at the last cache-line boundary of dst unless
 * upto is the chunk's end (LEN); returns the new flushed mark. */
static size_t s_flush(const mq_quant_kernels_t *kn, float *dst, const float *out, size_t flushed,
                      size_t upto, size_t len)
{
    if (upto < len) {
        uintptr_t base = (uintptr_t)dst, end = ((uintptr_t)(dst + upto)) & ~(uintptr_t)63;
        upto = end > base ? (size_t)(end - base) / sizeof(float) : 0;
    }
    if (upto > flushed)
        kn->stream(dst + flushed, out + flushed, (upto - flushed) * sizeof *dst);
    return upto > flushed ? upto : flushed;
}

/* Every range is checked before anything is written, so a bad payload leaves dst (and a
 * server's running sum) as it was. */
static int s_check_ranges(const uint8_t *src, size_t nb, int K)
{
    for (size_t b = 0; b < nb; b++) {
        float lo = mq_get_f32(src + 8 * b), hi = mq_get_f32(src + 8 * b + 4);
        if (!isfinite(lo) || !isfinite(hi) || lo > hi) {
            mq_err_set("uniform:%d decode: bucket %zu of %zu has range [%g, %g] (expected "
                       "finite min <= max)",
                       K, b, nb, (double)lo, (double)hi);
            return -1;
        }
    }
    return 0;
}

static int s_validate(const mq_codec_t *c, const uint8_t *src, size_t len, size_t n)
{
    (void)len; /* exact_size: the interface has checked it */
    return s_check_ranges(src, mq_quant_nbuckets(S_BUCKET(c), n), c->bits);
}

static void s_decode(const mq_codec_t *c, const uint8_t *src, size_t len, float *dst, size_t n,
                     float scale, bool accumulate, mq_codec_stats_t *stats)
{
    (void)len;
    const mq_quant_kernels_t *kn = mq_quant_kernels();
    const int K = c->bits;
    const unsigned levels = (1u << K) - 1;
    const size_t B = mq_quant_bucket_len(S_BUCKET(c), n);
    double sq = 0.0;
    const uint8_t *codes = src + 8 * mq_quant_nbuckets(S_BUCKET(c), n);
    const size_t code_bytes = mq_quant_code_bytes(n, K);
    const bool stream = !accumulate && mq_quant_streams(n);
    uint8_t buf[S_CHUNK];
    float out[S_CHUNK]; /* when streaming, a chunk is decoded here, then stored in one go */
    for (size_t start = 0; start < n; start += S_CHUNK) {
        size_t len = n - start < S_CHUNK ? n - start : S_CHUNK;
        const uint8_t *q = codes + start; /* 8-bit codes are read in place */
        if (K < 8) {
            size_t at = start / 8 * (size_t)K;
            kn->unpack(codes + at, len, code_bytes - at, buf, K);
            q = buf;
        }
        /* A chunk of one bucket streams straight to dst. One of several is decoded into
         * OUT a few lines at a time, each whole line streamed as soon as it is complete: no
         * line gets both kinds of store, and memory stays busy while decoding goes on. */
        bool whole = stream && start / B == (start + len - 1) / B;
        float *to = stream && !whole ? out : dst + start;
        size_t flushed = 0;
        for (size_t i = start; i < start + len;) {
            size_t b = i / B, seg_end = mq_quant_run_end(i, B, n, start + len);
            s_deq_t p =
                s_deq_params(mq_get_f32(src + 8 * b), mq_get_f32(src + 8 * b + 4), levels, scale);
            if (!stream || whole) {
                s_dequantize(kn, &p, q + (i - start), seg_end - i, accumulate, whole,
                             to + (i - start));
                i = seg_end;
                continue;
            }
            for (size_t e; i < seg_end; i = e) {
                e = seg_end - i > S_FLUSH ? i + S_FLUSH : seg_end;
                s_dequantize(kn, &p, q + (i - start), e - i, false, false, out + (i - start));
                flushed = s_flush(kn, dst + start, out, flushed, e - start, len);
            }
        }
        if (stats)
            sq += s_sq_of_chunk(kn, c, n, src, q, start, len);
    }
    if (stream)
        mq_quant_stream_fence();
    if (stats)
        stats->sq = sq;
}

/* ---- spec ------------------------------------------------------------------------------ */

static int s_option(mq_codec_t *c, const char *opt)
{
    if (strncmp(opt, "bucket=", 7) == 0)
        return mq_quant_bucket_option(c, opt);
    if (strcmp(opt, "stochastic") == 0) {
        c->param[1] = 1;
        return 0;
    }
    mq_err_set("unknown option '%s' (expected bucket=N or stochastic)", opt);
    return -1;
}

static void s_format(const mq_codec_t *c, char *buf, size_t len)
{
    int w = S_BUCKET(c) ? snprintf(buf, len, ":bucket=%u", (unsigned)S_BUCKET(c)) : 0;
    if (w >= 0 && (size_t)w < len)
        snprintf(buf + w, len - (size_t)w, "%s", S_STOCHASTIC(c) ? ":stochastic" : "");
}

static int s_check(const mq_codec_t *c)
{
    if (c->param[1] > 1) {
        mq_err_set("codec uniform: stochastic flag %u (expected 0 or 1)", (unsigned)c->param[1]);
        return -1;
    }
    return mq_quant_check_unused(c, 2);
}

static bool s_stochastic(const mq_codec_t *c)
{
    return S_STOCHASTIC(c);
}

const mq_codec_ops_t mq_codec_uniform_ops = {
    .name = "uniform",
    .id = MQ_CODEC_ID_uniform,
    .usage = "uniform[:K][:bucket=B][:stochastic]",
    .help = "min-max linear, K bits, a range per B values (0: per tensor, MQGrad's)",
    .min_bits = MQ_QUANT_MIN_BITS,
    .max_bits = MQ_QUANT_MAX_BITS,
    .unbiased = false, /* only with :stochastic */
    .exact_size = true,
    .clears = true,
    .option = s_option,
    .format = s_format,
    .check = s_check,
    .max_size = s_max_size,
    .stochastic = s_stochastic,
    .encode = s_encode,
    .validate = s_validate,
    .decode = s_decode,
    .encode_ef = s_encode_ef,
};
