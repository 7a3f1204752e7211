/* Tests of the sparse codecs: `sparse` (the exact reply format: round trips, the smallest
 * layout, the documented wire bytes, refusal of bad payloads without damage), `topk` (exactly
 * the k largest, residual conservation, exact selection whatever the data), `dgc` (density
 * near the ratio, momentum correction and masking, clipping) and `sdagc` (density in the
 * paper's range, learning-rate revision, at least one value), and what they share: payload
 * bounds, stats, accumulation, replies and specs. Every random draw is seeded. */

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/quant.h"
#include "gauss.h"

/* The layout tags of the sparse payload, as documented (common/src/quant/sparse_fmt.h). */
enum { S_DENSE = 0, S_DELTA = 1, S_BITMAP = 2 };

/* ---- helpers ------------------------------------------------------------------------ */

static float *s_normal(size_t n, uint64_t seed, float sigma)
{
    return test_gaussian(n, seed, sigma, 0.0f);
}

/* x with only a fraction DENSITY of its values kept (the others 0). */
static float *s_sparse_vec(size_t n, uint64_t seed, double density)
{
    float *x = s_normal(n, seed, 1.0f);
    mq_rng_t rng;
    mq_rng_seed(&rng, seed + 1000);
    for (size_t i = 0; i < n; i++)
        if (mq_rng_double(&rng) >= density)
            x[i] = 0.0f;
    return x;
}

static mq_codec_t s_parse(const char *spec)
{
    mq_codec_t c;
    cr_assert_eq(mq_codec_parse(spec, &c), 0, "%s: %s", spec, mq_err_last());
    return c;
}

static float *s_zeros(size_t n)
{
    float *x = calloc(n ? n : 1, sizeof *x);
    cr_assert(x);
    return x;
}

/* Encodes x with C (STATE and RNG as given, lr LR) into a fresh buffer of exactly
 * mq_codec_payload_size bytes; returns it, its length in *LEN. */
static uint8_t *s_encode(const mq_codec_t *c, const float *x, size_t n, float *state,
                         mq_rng_t *rng, float lr, size_t *len, mq_codec_stats_t *st)
{
    size_t cap = mq_codec_payload_size(c, n);
    uint8_t *buf = malloc(cap ? cap : 1);
    cr_assert(buf);
    mq_codec_ctx_t ctx = {.rng = rng, .state = state, .lr = lr};
    cr_assert_eq(mq_codec_encode_ctx(c, x, n, &ctx, buf, cap, len, st), 0, "%s", mq_err_last());
    cr_assert_leq(*len, cap);
    return buf;
}

static float *s_decode(const mq_codec_t *c, const uint8_t *p, size_t len, size_t n)
{
    float *y = malloc(n * sizeof *y);
    cr_assert(y);
    cr_assert_eq(mq_codec_decode(c, p, len, y, n, 1.0f, false, NULL), 0, "%s", mq_err_last());
    return y;
}

/* What one encode of G sends (as s_encode), decoded. */
static float *s_sent(const mq_codec_t *c, const float *g, size_t n, float *state, mq_rng_t *rng,
                     float lr)
{
    size_t len;
    uint8_t *p = s_encode(c, g, n, state, rng, lr, &len, NULL);
    float *x = s_decode(c, p, len, n);
    free(p);
    return x;
}

static size_t s_nonzeros(const float *x, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += x[i] != 0.0f;
    return k;
}

static uint32_t s_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void s_put_u32(uint8_t *p, uint32_t u)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(u >> (8 * i));
}

static size_t s_leb_len(size_t g)
{
    size_t l = 1;
    for (; g >= 128; g >>= 7)
        l++;
    return l;
}

/* The delta layout's size for x, from the format's description. */
static size_t s_delta_size(const float *x, size_t n)
{
    size_t k = 0, g = 0, prev = 0;
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) {
            g += s_leb_len(i - prev);
            prev = i;
            k++;
        }
    return 8 + 4 * k + g;
}

/* a == b to float rounding (one fused or unfused multiply-add apart). */
static bool s_close(float a, float b)
{
    return fabsf(a - b) <= 1e-6f * (fabsf(b) + 1e-30f);
}

static double s_sq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

static double s_norm(const float *x, size_t n)
{
    return sqrt(s_sq(x, n));
}

/* ---- sparse: round trips and layouts ----------------------------------------------- */

Test(codec_sparse, roundtrip_is_exact_at_every_density)
{
    const size_t n = 100003; /* not a multiple of 8: the last values go one by one */
    static const double dens[] = {0, 0.0005, 0.01, 0.05, 0.118, 0.2, 0.6, 0.98, 1};
    mq_codec_t c = s_parse("sparse");
    for (size_t d = 0; d < sizeof dens / sizeof dens[0]; d++) {
        float *x = s_sparse_vec(n, 10 + d, dens[d]);
        if (n > 5) {
            x[n - 1] = 7.5f; /* the last value, alone after the last block of eight */
            x[3] = -0.0f;    /* decodes to +0: the sign of a zero is not kept */
        }
        float *y = s_sent(&c, x, n, NULL, NULL, 0);
        x[3] = 0.0f;
        cr_assert_arr_eq(x, y, n * sizeof *x, "density %g: decode differs", dens[d]);
        free(x);
        free(y);
    }
}

Test(codec_sparse, each_payload_takes_the_smallest_layout)
{
    const size_t n = 200000;
    static const double dens[] = {0, 0.001, 0.01, 0.04, 0.12, 0.121, 0.125, 0.3, 0.969, 1};
    mq_codec_t c = s_parse("sparse");
    for (size_t d = 0; d < sizeof dens / sizeof dens[0]; d++) {
        float *x = s_sparse_vec(n, 30 + d, dens[d]);
        size_t k = s_nonzeros(x, n), len;
        size_t dense = 4 + 4 * n, map = 8 + 4 * k + (n + 7) / 8, delta = s_delta_size(x, n);
        size_t best = dense < map ? dense : map;
        best = delta < best ? delta : best;
        uint8_t *p = s_encode(&c, x, n, NULL, NULL, 0, &len, NULL);
        cr_assert_eq(len, best, "density %g (k %zu): %zu bytes, the smallest layout is %zu",
                     dens[d], k, len, best);
        uint32_t tag = s_u32(p);
        cr_assert(tag == S_DENSE ? len == dense : tag == S_BITMAP ? len == map : len == delta,
                  "density %g: tag %u does not match the length", dens[d], tag);
        if (tag != S_DENSE)
            cr_assert_eq(s_u32(p + 4), k, "density %g: count %u, expected %zu", dens[d],
                         s_u32(p + 4), k);
        if (dens[d] == 0.01) /* where sparsification runs: well under (index, value) pairs */
            cr_assert_lt((double)len, 0.7 * (double)(8 + 8 * k), "1%%: %zu bytes", len);
        free(p);
        free(x);
    }
}

Test(codec_sparse, wire_bytes_match_the_documented_layout)
{
    mq_codec_t c = s_parse("sparse");
    float x[300] = {0};
    x[0] = 1.0f, x[3] = -2.0f, x[130] = 0.5f, x[299] = 3.0f;
    uint8_t p[4 + 4 * 300];
    size_t len;
    cr_assert_eq(mq_codec_encode(&c, x, 300, p, sizeof p, &len, NULL, NULL), 0);
    /* tag 1, count 4, the values, then gaps 0, 3, 127, 169 as LEB128 */
    static const uint8_t gaps[] = {0x00, 0x03, 0x7f, 0xa9, 0x01};
    cr_assert_eq(len, 8 + 16 + sizeof gaps);
    cr_assert_eq(s_u32(p), S_DELTA);
    cr_assert_eq(s_u32(p + 4), 4);
    float vals[4];
    memcpy(vals, p + 8, 16); /* little-endian f32: this host's order on x86 */
    cr_assert(vals[0] == 1.0f && vals[1] == -2.0f && vals[2] == 0.5f && vals[3] == 3.0f);
    cr_assert_arr_eq(p + 24, gaps, sizeof gaps);

    /* Half of 16 values set: the bitmap, bit i%8 of byte i/8. */
    float h[16] = {0};
    for (int i = 0; i < 16; i += 2)
        h[i + (i / 8)] = (float)(i + 1); /* indices 0, 2, 4, 6, 9, 11, 13, 15 */
    cr_assert_eq(mq_codec_encode(&c, h, 16, p, sizeof p, &len, NULL, NULL), 0);
    cr_assert_eq(s_u32(p), S_BITMAP);
    cr_assert_eq(len, 8 + 32 + 2);
    cr_assert(p[40] == 0x55 && p[41] == 0xaa, "map %02x %02x", p[40], p[41]);

    /* All set: plain floats after the tag. */
    float d[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(mq_codec_encode(&c, d, 5, p, sizeof p, &len, NULL, NULL), 0);
    cr_assert_eq(s_u32(p), S_DENSE);
    cr_assert_eq(len, 4 + 20);
    cr_assert_arr_eq(p + 4, d, 20);
}

/* ZeroMQ frames promise no alignment. */
Test(codec_sparse, payloads_at_odd_addresses_decode_the_same)
{
    const size_t n = 5001;
    mq_codec_t c = s_parse("sparse");
    static const double dens[] = {0.01, 0.3, 1};
    for (size_t d = 0; d < 3; d++) {
        float *x = s_sparse_vec(n, 50 + d, dens[d]), *y = s_zeros(n);
        size_t cap = mq_codec_payload_size(&c, n), len;
        uint8_t *raw = malloc(cap + 1);
        cr_assert_eq(mq_codec_encode(&c, x, n, raw + 1, cap, &len, NULL, NULL), 0);
        cr_assert_eq(mq_codec_decode(&c, raw + 1, len, y, n, 1.0f, false, NULL), 0, "%s",
                     mq_err_last());
        cr_assert_arr_eq(x, y, n * sizeof *x);
        free(raw), free(x), free(y);
    }
}

Test(codec_sparse, encode_refuses_nan_and_infinity_naming_the_index)
{
    mq_codec_t c = s_parse("sparse");
    float x[40] = {0};
    uint8_t p[4 + 160];
    size_t len;
    x[5] = 1.0f;
    x[33] = NAN;
    cr_assert_eq(mq_codec_encode(&c, x, 40, p, sizeof p, &len, NULL, NULL), -1);
    cr_assert(strstr(mq_err_last(), "value 33 of 40 is NaN"), "%s", mq_err_last());
    x[33] = 0.0f;
    x[39] = -INFINITY;
    cr_assert_eq(mq_codec_encode(&c, x, 40, p, sizeof p, &len, NULL, NULL), -1);
    cr_assert(strstr(mq_err_last(), "value 39 of 40 is infinite"), "%s", mq_err_last());
}

/* ---- sparse: bad payloads ------------------------------------------------------------
 * A decode that fails must leave the destination as it was: a server sums pushes into it. */

typedef struct {
    const char *what, *expect;
    size_t len;        /* 0: the good payload's length */
    size_t at;         /* byte to overwrite */
    int nbytes;        /* how many of VAL's bytes (0: none) */
    uint32_t val;
} s_bad_t;

static void s_check_refused(const mq_codec_t *c, const uint8_t *good, size_t good_len, size_t n,
                            const s_bad_t *b)
{
    size_t cap = mq_codec_payload_size(c, n);
    uint8_t *q = calloc(cap + 8, 1);
    memcpy(q, good, good_len);
    for (int i = 0; i < b->nbytes; i++)
        q[b->at + (size_t)i] = (uint8_t)(b->val >> (8 * i));
    float *sum = malloc(n * sizeof *sum), *before = malloc(n * sizeof *sum);
    for (size_t i = 0; i < n; i++)
        sum[i] = before[i] = (float)i;
    size_t len = b->len ? b->len : good_len;
    cr_assert_eq(mq_codec_decode(c, q, len, sum, n, 1.0f, true, NULL), -1, "%s: accepted",
                 b->what);
    cr_assert(strstr(mq_err_last(), b->expect), "%s: message '%s' lacks '%s'", b->what,
              mq_err_last(), b->expect);
    cr_assert_arr_eq(sum, before, n * sizeof *sum, "%s: the running sum changed", b->what);
    cr_assert_eq(mq_codec_decode(c, q, len, sum, n, 1.0f, false, NULL), -1);
    cr_assert_arr_eq(sum, before, n * sizeof *sum, "%s: dst changed", b->what);
    free(q), free(sum), free(before);
}

Test(codec_sparse, decode_refuses_bad_delta_payloads_and_keeps_the_running_sum)
{
    const size_t n = 1000;
    mq_codec_t c = s_parse("sparse");
    float x[1000] = {0};
    x[2] = 1.0f, x[5] = 2.0f, x[400] = 3.0f; /* gaps 2, 3, 395 (2 bytes) */
    uint8_t good[4 + 4000];
    size_t len;
    cr_assert_eq(mq_codec_encode(&c, x, n, good, sizeof good, &len, NULL, NULL), 0);
    cr_assert_eq(s_u32(good), S_DELTA);
    cr_assert_eq(len, 8 + 12 + 4);
    const size_t g0 = 20; /* first gap byte */
    const s_bad_t bad[] = {
        {"no tag", "no layout tag", 3, 0, 0, 0},
        {"short header", "8-byte header", 6, 0, 0, 0},
        {"truncated in the values", "count inconsistent", 14, 0, 0, 0},
        {"truncated in a gap", "ends inside index 2", len - 1, 0, 0, 0},
        {"trailing byte", "after the last of 3 indices", len + 1, 0, 0, 0},
        {"count too large", "count inconsistent", 0, 4, 4, 4},
        {"count smaller than the gaps", "index 1 of 2", 0, 4, 4, 2},
        {"count beyond n", "count 5000 is more than the 1000 values", 0, 4, 4, 5000},
        {"index out of range", "index 2 of 3 is 1004, out of range", 0, g0 + 2, 2, 0x07e7},
        {"indices not increasing", "repeats index 2", 0, g0 + 1, 1, 0},
        {"NaN value", "value 1 of 3 is not finite", 0, 12, 4, 0x7fc00000},
        {"infinite value", "value 2 of 3 is not finite", 0, 16, 4, 0xff800000},
        {"unknown tag", "unknown layout tag 7", 0, 0, 4, 7},
        {"redundant gap byte", "redundant byte", 0, g0 + 1, 2, 0x0083},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        s_check_refused(&c, good, len, n, &bad[i]);
    /* Too long for any payload of n values: the interface refuses it before the codec. */
    s_bad_t huge = {"longer than max_size", "at most", 4 + 4 * n + 1, 0, 0, 0};
    s_check_refused(&c, good, len, n, &huge);
    /* A gap over 32 bits: five bytes, the last above 0x0f. */
    uint8_t q[40] = {0};
    s_put_u32(q, S_DELTA);
    s_put_u32(q + 4, 1);
    memset(q + 12, 0xff, 4);
    q[16] = 0x1f;
    float sum[1000] = {0};
    cr_assert_eq(mq_codec_decode(&c, q, 17, sum, n, 1.0f, true, NULL), -1);
    cr_assert(strstr(mq_err_last(), "longer than 32 bits"), "%s", mq_err_last());
}

Test(codec_sparse, decode_refuses_bad_bitmap_and_dense_payloads)
{
    const size_t n = 21; /* a map of 3 bytes, 3 bits of padding */
    mq_codec_t c = s_parse("sparse");
    float x[21] = {0};
    for (size_t i = 0; i < n; i += 3)
        x[i] = (float)(i + 1); /* 7 of 21: the map */
    uint8_t good[4 + 84];
    size_t len;
    cr_assert_eq(mq_codec_encode(&c, x, n, good, sizeof good, &len, NULL, NULL), 0);
    cr_assert_eq(s_u32(good), S_BITMAP);
    cr_assert_eq(len, 8 + 28 + 3);
    const size_t map = 36;
    const s_bad_t bad[] = {
        {"map truncated", "count inconsistent", len - 1, 0, 0, 0},
        {"map too long", "count inconsistent", len + 1, 0, 0, 0},
        {"one bit too many", "marks 8 indices but the count says 7", 0, map, 1, 0x4b},
        {"padding bit set", "past the 21 values", 0, map + 2, 1, 0x84},
        {"NaN value", "value 6 of 7 is not finite", 0, 32, 4, 0x7f800001},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        s_check_refused(&c, good, len, n, &bad[i]);

    float d[5] = {1, 2, 3, 4, 5};
    cr_assert_eq(mq_codec_encode(&c, d, 5, good, sizeof good, &len, NULL, NULL), 0);
    cr_assert_eq(s_u32(good), S_DENSE);
    const s_bad_t dense[] = {
        {"dense truncated", "dense payload of 23 bytes for 5 values", 23, 0, 0, 0},
        {"dense NaN", "value 4 of 5 is not finite", 0, 20, 4, 0x7fc00000},
    };
    for (size_t i = 0; i < 2; i++)
        s_check_refused(&c, good, len, 5, &dense[i]);
}

/* Payloads built valid, then most of them damaged at one random byte: each is refused, or
 * decodes to finite values without writing outside dst (a guard value past it would show). */
Test(codec_sparse, damaged_payloads_are_refused_or_decode_to_finite_values)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, 99);
    mq_codec_t c = s_parse("sparse");
    float x[201], y[201];
    uint8_t p[4 + 4 * 200];
    int decoded = 0, refused = 0;
    for (int trial = 0; trial < 4000; trial++) {
        size_t n = 1 + mq_rng_below(&rng, 200), len;
        double density = mq_rng_double(&rng);
        for (size_t i = 0; i < n; i++)
            x[i] = mq_rng_double(&rng) < density ? (float)mq_rng_normal(&rng) : 0.0f;
        cr_assert_eq(mq_codec_encode(&c, x, n, p, sizeof p, &len, NULL, NULL), 0);
        if (trial % 4) {
            size_t at = mq_rng_below(&rng, len);
            p[at] = (uint8_t)mq_rng_next(&rng);
        }
        y[n] = 42.0f;
        if (mq_codec_decode(&c, p, len, y, n, 1.0f, false, NULL) < 0) {
            refused++;
            continue;
        }
        decoded++;
        for (size_t i = 0; i < n; i++)
            cr_assert(isfinite(y[i]), "trial %d: value %zu is %g", trial, i, y[i]);
        cr_assert_eq(y[n], 42.0f, "trial %d: a write past the %zu values", trial, n);
    }
    cr_assert(decoded > 1000 && refused > 500, "%d decoded, %d refused", decoded, refused);
}

/* ---- sparse: the server's use ----------------------------------------------------------- */

Test(codec_sparse, accumulate_adds_scale_times_the_values)
{
    const size_t n = 20011;
    mq_codec_t c = s_parse("sparse");
    static const double dens[] = {0.01, 0.3, 1};
    for (size_t d = 0; d < 3; d++) {
        float *x = s_sparse_vec(n, 70 + d, dens[d]), *acc = s_normal(n, 80 + d, 1.0f);
        float *want = malloc(n * sizeof *want), *y = malloc(n * sizeof *y);
        for (size_t i = 0; i < n; i++)
            want[i] = acc[i] + 0.25f * x[i];
        size_t len;
        uint8_t *p = s_encode(&c, x, n, NULL, NULL, 0, &len, NULL);
        cr_assert_eq(mq_codec_decode(&c, p, len, acc, n, 0.25f, true, NULL), 0);
        for (size_t i = 0; i < n; i++)
            cr_assert(s_close(acc[i], want[i]), "density %g, value %zu: %g, expected %g", dens[d],
                      i, acc[i], want[i]);
        memset(y, 0x7f, n * sizeof *y); /* non-accumulating decode overwrites everything */
        cr_assert_eq(mq_codec_decode(&c, p, len, y, n, -2.0f, false, NULL), 0);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(y[i], -2.0f * x[i], "density %g, value %zu: %g", dens[d], i, y[i]);
        free(p), free(x), free(acc), free(want), free(y);
    }
}

/* Encode and decode both report the sum of squares of the decoded values. */
Test(codec_sparse, stats_are_the_decoded_sum_of_squares)
{
    const size_t n = 30000;
    mq_codec_t c = s_parse("sparse");
    static const double dens[] = {0, 0.01, 0.3, 1};
    for (size_t d = 0; d < 4; d++) {
        float *x = s_sparse_vec(n, 90 + d, dens[d]), *y = s_zeros(n);
        size_t len;
        mq_codec_stats_t enc = {-1}, dec = {-1};
        uint8_t *p = s_encode(&c, x, n, NULL, NULL, 0, &len, &enc);
        cr_assert_eq(mq_codec_decode(&c, p, len, y, n, 3.0f, true, &dec), 0);
        cr_assert_eq(enc.sq, dec.sq, "density %g: encode says %.17g, decode %.17g", dens[d],
                     enc.sq, dec.sq);
        double want = s_sq(x, n);
        cr_assert(fabs(dec.sq - want) <= 1e-12 * want, "density %g: %.17g vs %.17g", dens[d],
                  dec.sq, want);
        free(p), free(x), free(y);
    }
}

/* The server's round: P top-k pushes summed with scale 1/P, the mean re-encoded with the
 * reply codec and decoded by a worker: the worker gets the mean exactly. */
Test(codec_sparse, the_reply_carries_the_mean_of_topk_pushes_exactly)
{
    const size_t n = 50000, P = 4;
    mq_codec_t c = s_parse("topk:ratio=0.01"), r = mq_codec_reply(&c);
    cr_assert_eq(r.id, MQ_CODEC_ID_sparse);
    cr_assert_eq(mq_codec_validate(&r), 0);
    float *mean = s_zeros(n);
    for (size_t w = 0; w < P; w++) {
        float *g = s_normal(n, 200 + w, 1.0f), *state = s_zeros(n);
        size_t len;
        uint8_t *p = s_encode(&c, g, n, state, NULL, 0.1f, &len, NULL);
        cr_assert_eq(mq_codec_decode(&c, p, len, mean, n, 1.0f / (float)P, true, NULL), 0);
        free(p), free(g), free(state);
    }
    size_t k = s_nonzeros(mean, n);
    cr_assert(k > 500 * 3 && k <= 500 * P, "union of %zu", k);
    float *got = s_sent(&r, mean, n, NULL, NULL, 0);
    cr_assert_arr_eq(got, mean, n * sizeof *got);
    free(got);
    free(mean);
}

Test(codec_sparse, spec_is_the_name_alone)
{
    mq_codec_t c = s_parse("sparse");
    char buf[64];
    mq_codec_format(&c, buf, sizeof buf);
    cr_assert_str_eq(buf, "sparse");
    cr_assert_eq(c.bits, 0);
    cr_assert_eq(mq_codec_parse("sparse:4", &c), -1);
    cr_assert(strstr(mq_err_last(), "takes no options (got '4')"), "%s", mq_err_last());
    cr_assert_eq(mq_codec_parse("sparse:ratio=0.1", &c), -1);
    mq_codec_t bad = {.id = MQ_CODEC_ID_sparse, .param = {0, 1}};
    cr_assert_eq(mq_codec_validate(&bad), -1);
    cr_assert(strstr(mq_err_last(), "parameter word 1"), "%s", mq_err_last());
    cr_assert_eq(mq_codec_state_floats(&c, 100), 0);
}

/* ---- what every sparse codec shares -------------------------------------------------- */

static const char *s_specs[] = {
    "sparse", "topk", "topk:ratio=0.2", "dgc", "dgc:ratio=0.05:sample=1", "sdagc",
    "sdagc:momentum=0:c=1",
};
/* Parameters are indices into s_specs: a test may run in a fresh process of the binary,
 * where a pointer taken in another would not be valid. */
static int s_spec_idx[] = {0, 1, 2, 3, 4, 5, 6};
#define S_NSPECS (sizeof s_spec_idx / sizeof s_spec_idx[0])

ParameterizedTestParameters(codec_sparse, payloads_stay_within_max_size_and_validate)
{
    return cr_make_param_array(int, s_spec_idx, S_NSPECS);
}

/* Over a few iterations on several lengths: every payload fits max_size, passes validation,
 * decodes to finite values, reports the decoded sum of squares both ways, and accumulates. */
ParameterizedTest(int *idx, codec_sparse, payloads_stay_within_max_size_and_validate)
{
    const char **spec = &s_specs[*idx];
    static const size_t ns[] = {1, 2, 7, 8, 9, 100, 1001, 40000};
    mq_codec_t c = s_parse(*spec);
    mq_rng_t rng;
    mq_rng_seed(&rng, 5);
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        size_t n = ns[t];
        float *state = s_zeros(mq_codec_state_floats(&c, n) + 1);
        for (int it = 0; it < 3; it++) {
            float *g = s_normal(n, 300 + 10 * t + (size_t)it, 0.1f), *y = s_normal(n, 7, 1.0f);
            float *before = malloc(n * sizeof *before);
            memcpy(before, y, n * sizeof *y);
            size_t len;
            mq_codec_stats_t enc = {-1}, dec = {-1};
            uint8_t *p = s_encode(&c, g, n, state, &rng, 0.1f, &len, &enc);
            cr_assert_leq(len, mq_codec_payload_size(&c, n), "%s n=%zu", *spec, n);
            cr_assert_eq(mq_codec_validate_payload(&c, p, len, n), 0, "%s n=%zu: %s", *spec, n,
                         mq_err_last());
            cr_assert_eq(mq_codec_decode(&c, p, len, y, n, 0.5f, true, &dec), 0);
            cr_assert_eq(enc.sq, dec.sq, "%s n=%zu", *spec, n);
            float *x = s_decode(&c, p, len, n);
            double sq = s_sq(x, n);
            cr_assert(fabs(sq - dec.sq) <= 1e-12 * sq, "%s n=%zu: %g vs %g", *spec, n, sq, dec.sq);
            cr_assert(c.id == MQ_CODEC_ID_sparse || s_nonzeros(x, n) >= 1, "%s n=%zu: nothing sent",
                      *spec, n);
            for (size_t i = 0; i < n; i++) {
                cr_assert(isfinite(x[i]));
                cr_assert(s_close(y[i], before[i] + 0.5f * x[i]), "%s n=%zu value %zu", *spec, n,
                          i);
            }
            free(p), free(g), free(x), free(y), free(before);
        }
        free(state);
    }
}

ParameterizedTestParameters(codec_sparse, sparsifiers_reply_with_the_sparse_codec)
{
    return cr_make_param_array(int, s_spec_idx, S_NSPECS);
}

ParameterizedTest(int *idx, codec_sparse, sparsifiers_reply_with_the_sparse_codec)
{
    const char **spec = &s_specs[*idx];
    mq_codec_t c = s_parse(*spec), r = mq_codec_reply(&c);
    cr_assert_eq(r.id, MQ_CODEC_ID_sparse, "%s replies with codec %u", *spec, r.id);
    cr_assert(mq_codec_equal(&r, &(mq_codec_t){.id = MQ_CODEC_ID_sparse}), "%s", *spec);
    /* Every codec's payloads are sparse payloads: the reply codec decodes them too. */
    const size_t n = 3000;
    float *g = s_normal(n, 3, 1.0f), *state = s_zeros(mq_codec_state_floats(&c, n) + 1);
    mq_rng_t rng;
    mq_rng_seed(&rng, 1);
    size_t len;
    uint8_t *p = s_encode(&c, g, n, state, &rng, 0.1f, &len, NULL);
    float *a = s_decode(&c, p, len, n), *b = s_decode(&r, p, len, n);
    cr_assert_arr_eq(a, b, n * sizeof *a);
    free(p), free(a), free(b), free(g), free(state);
}

Test(codec_sparse, empty_tensor_is_an_empty_payload)
{
    for (size_t s = 0; s < sizeof s_specs / sizeof s_specs[0]; s++) {
        mq_codec_t c = s_parse(s_specs[s]);
        size_t len = 5;
        uint8_t p[8];
        mq_rng_t rng;
        mq_rng_seed(&rng, 1);
        mq_codec_ctx_t ctx = {.rng = &rng};
        cr_assert_eq(mq_codec_encode_ctx(&c, NULL, 0, &ctx, p, sizeof p, &len, NULL), 0, "%s: %s",
                     s_specs[s], mq_err_last());
        cr_assert_eq(len, 0);
        cr_assert_eq(mq_codec_decode(&c, p, 0, NULL, 0, 1.0f, true, NULL), 0);
    }
}

/* ---- topk ----------------------------------------------------------------------------- */

/* Checks that the decoded X holds exactly K values of V, the K largest in magnitude. */
static void s_assert_top_k(const float *v, const float *x, size_t n, size_t k)
{
    size_t sent = 0;
    float min_sent = INFINITY, max_kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != 0.0f) {
            cr_assert_eq(x[i], v[i], "value %zu sent as %g, was %g", i, x[i], v[i]);
            min_sent = fminf(min_sent, fabsf(v[i]));
            sent++;
        } else {
            max_kept = fmaxf(max_kept, fabsf(v[i]));
        }
    }
    cr_assert_eq(sent, k, "%zu values sent, expected %zu", sent, k);
    cr_assert_geq(min_sent, max_kept, "a kept |%g| beats a sent |%g|", max_kept, min_sent);
}

/* A first encode of G with C (a zero residual, no generator) sends exactly its K largest. */
static void s_check_top_k(const mq_codec_t *c, const float *g, size_t n, size_t k)
{
    float *r = s_zeros(mq_codec_state_floats(c, n)), *x = s_sent(c, g, n, r, NULL, 0);
    s_assert_top_k(g, x, n, k);
    free(r);
    free(x);
}

/* How many values a first encode of G with C (zero state, lr 0.1) sends. */
static size_t s_first_sent(const mq_codec_t *c, const float *g, size_t n, mq_rng_t *rng)
{
    float *state = s_zeros(mq_codec_state_floats(c, n)), *x = s_sent(c, g, n, state, rng, 0.1f);
    size_t k = s_nonzeros(x, n);
    free(state);
    free(x);
    return k;
}

/* Over ITERS encodes of fresh Gaussian gradients (seeds SEED, SEED + 1, ...) with lr LR,
 * decode(payload) + new residual == old residual + g, value by value, exactly: a sent value
 * leaves 0 behind and an unsent one stays whole. The residual is C's state from float HDR
 * on (C keeps no momentum); with TOP_K > 0 each payload holds exactly the TOP_K largest of
 * residual + g. Returns how many values were sent in all. */
static size_t s_check_residual_keeps(const mq_codec_t *c, size_t n, int iters, uint64_t seed,
                                     mq_rng_t *rng, float lr, size_t hdr, size_t top_k)
{
    cr_assert_eq(mq_codec_state_floats(c, n), hdr + n);
    float *state = s_zeros(hdr + n), *r = state + hdr, *want = malloc(n * sizeof *want);
    size_t total = 0;
    for (int it = 0; it < iters; it++) {
        float *g = s_normal(n, seed + (uint64_t)it, 1.0f);
        for (size_t i = 0; i < n; i++)
            want[i] = r[i] + g[i];
        float *x = s_sent(c, g, n, state, rng, lr);
        if (top_k)
            s_assert_top_k(want, x, n, top_k);
        for (size_t i = 0; i < n; i++)
            cr_assert_eq(x[i] + r[i], want[i], "iteration %d value %zu: %g + %g != %g", it, i,
                         x[i], r[i], want[i]);
        total += s_nonzeros(x, n);
        free(g);
        free(x);
    }
    free(state);
    free(want);
    return total;
}

/* An encode of G with STATE (SF floats, lr LR) is refused with a message containing WHY, and
 * the state is left as it was. */
static void s_check_refused_keeps_state(const mq_codec_t *c, const float *g, size_t n,
                                        float *state, size_t sf, float lr, const char *why)
{
    float *before = malloc(sf * sizeof *before);
    size_t cap = mq_codec_payload_size(c, n), len;
    uint8_t *p = malloc(cap);
    cr_assert(before && p);
    memcpy(before, state, sf * sizeof *state);
    mq_codec_ctx_t ctx = {.state = state, .lr = lr};
    cr_assert_eq(mq_codec_encode_ctx(c, g, n, &ctx, p, cap, &len, NULL), -1, "%s accepted", why);
    cr_assert(strstr(mq_err_last(), why), "%s", mq_err_last());
    cr_assert_arr_eq(state, before, sf * sizeof *state, "a refused encode changed the state");
    free(before);
    free(p);
}

/* Each SPECS[i][0] formats as SPECS[i][1], which parses back to the same codec. */
static void s_check_specs(const char *const (*specs)[2], size_t count)
{
    for (size_t i = 0; i < count; i++) {
        mq_codec_t c = s_parse(specs[i][0]), back;
        char buf[MQ_CODEC_MAX_SPEC];
        mq_codec_format(&c, buf, sizeof buf);
        cr_assert_str_eq(buf, specs[i][1], "'%s' formats as '%s'", specs[i][0], buf);
        back = s_parse(buf);
        cr_assert(mq_codec_equal(&c, &back), "'%s' does not read back", buf);
    }
}

/* Each BAD[i][0] is refused with a message containing BAD[i][1] and the usage USAGE, and the
 * output is left as it was. */
static void s_check_bad_specs(const char *const (*bad)[2], size_t count, const char *usage)
{
    for (size_t i = 0; i < count; i++) {
        mq_codec_t c = mq_codec_none();
        cr_assert_eq(mq_codec_parse(bad[i][0], &c), -1, "'%s' was accepted", bad[i][0]);
        cr_assert(strstr(mq_err_last(), bad[i][1]), "'%s': message '%s' lacks '%s'", bad[i][0],
                  mq_err_last(), bad[i][1]);
        cr_assert(strstr(mq_err_last(), usage), "%s", mq_err_last());
        cr_assert_eq(c.id, MQ_CODEC_ID_none, "'%s': output changed on failure", bad[i][0]);
    }
}

Test(codec_topk, sends_exactly_the_k_largest)
{
    static const size_t ns[] = {1, 5, 100, 10007, 300000};
    static const char *specs[] = {"topk", "topk:ratio=0.001", "topk:ratio=0.3", "topk:ratio=1"};
    for (size_t s = 0; s < 4; s++)
        for (size_t t = 0; t < 5; t++) {
            mq_codec_t c = s_parse(specs[s]);
            size_t n = ns[t];
            float *g = s_normal(n, 400 + t, 1.0f);
            double kr = (double)mq_codec_param_f(&c, 0) * (double)n;
            double want = ceil(kr - kr * 0x1p-23); /* R * n, R a float */
            s_check_top_k(&c, g, n, want < 1 ? 1 : (size_t)want);
            free(g);
        }
}

Test(codec_topk, k_is_ceil_of_ratio_times_n)
{
    static const struct {
        const char *spec;
        size_t n, k;
    } cases[] = {
        {"topk:ratio=0.1", 1000, 100}, {"topk:ratio=0.1", 1001, 101}, {"topk", 50, 1},
        {"topk:ratio=0.01", 3200000 / 32, 1000}, {"topk:ratio=0.3", 10, 3},
        {"topk:ratio=0.7", 10, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mq_codec_t c = s_parse(cases[i].spec);
        size_t n = cases[i].n;
        float *g = s_normal(n, 450 + i, 1.0f), *r = s_zeros(n), *x = s_sent(&c, g, n, r, NULL, 0);
        cr_assert_eq(s_nonzeros(x, n), cases[i].k, "%s on %zu values: %zu sent, expected %zu",
                     cases[i].spec, n, s_nonzeros(x, n), cases[i].k);
        free(g), free(r), free(x);
    }
}

/* decode(payload) + new residual == old residual + g, value by value: a sent value leaves 0
 * behind and an unsent one stays whole, so it holds exactly, not just to rounding. */
Test(codec_topk, residual_keeps_what_was_not_sent)
{
    mq_codec_t c = s_parse("topk:ratio=0.005");
    s_check_residual_keeps(&c, 20000, 25, 500, NULL, 0, 0, 100);
}

/* Ties at the k-th magnitude go to the lowest indices, and exactly k are sent. */
Test(codec_topk, ties_go_to_the_lowest_indices)
{
    const size_t n = 1000;
    mq_codec_t c = s_parse("topk:ratio=0.05"); /* k = 50 */
    float *g = malloc(n * sizeof *g), *r = s_zeros(n);
    for (size_t i = 0; i < n; i++)
        g[i] = i % 2 ? 1.0f : -1.0f; /* every magnitude equal */
    g[900] = 2.0f;
    float *x = s_sent(&c, g, n, r, NULL, 0);
    cr_assert_eq(s_nonzeros(x, n), 50);
    cr_assert_eq(x[900], 2.0f);
    for (size_t i = 0; i < 49; i++)
        cr_assert_eq(x[i], g[i], "value %zu not sent", i);
    cr_assert_eq(x[49], 0.0f);
    free(g), free(r), free(x);
}

/* Selection is exact whatever the data: large values placed where a strided sample looks,
 * or away from it, heavy tails, few nonzeros. */
Test(codec_topk, selection_is_exact_on_adversarial_data)
{
    const size_t n = 100000;
    mq_codec_t c = s_parse("topk:ratio=0.02"); /* k = 2000 */
    for (int kind = 0; kind < 5; kind++) {
        float *g = s_normal(n, 600 + (size_t)kind, 1.0f);
        mq_rng_t rng;
        mq_rng_seed(&rng, 601);
        for (size_t i = 0; i < n; i++) {
            if (kind == 0) /* large on every 8th value: a stride's positions */
                g[i] = i % 8 == 4 ? 100.0f + g[i] : g[i] * 1e-3f;
            else if (kind == 1) /* large everywhere but every 8th */
                g[i] = i % 8 != 4 ? g[i] : g[i] * 1e3f;
            else if (kind == 2) /* Cauchy-like tails */
                g[i] = g[i] / (float)(mq_rng_double(&rng) + 1e-6);
            else if (kind == 3) /* only 1500 nonzeros: fewer than k */
                g[i] = i % 66 == 0 && i / 66 < 1500 ? g[i] : 0.0f;
            else /* two magnitudes */
                g[i] = i % 3 ? 1.0f : 3.0f;
        }
        s_check_top_k(&c, g, n, kind == 3 ? s_nonzeros(g, n) : 2000);
        free(g);
    }
}

/* Every k of every short length, on values with many ties (the few-values paths). */
Test(codec_topk, selection_is_exact_for_every_small_length)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, 650);
    for (size_t n = 1; n <= 40; n++)
        for (size_t k = 1; k <= n; k++) {
            char spec[64];
            snprintf(spec, sizeof spec, "topk:ratio=%.9g", ((double)k - 0.5) / (double)n);
            mq_codec_t c = s_parse(spec);
            float g[40], r[40] = {0};
            for (size_t i = 0; i < n; i++) /* 0, +-1, +-2, +-3: ties and zeros */
                g[i] = (float)((int)mq_rng_below(&rng, 7) - 3);
            size_t nz = s_nonzeros(g, n);
            float *x = s_sent(&c, g, n, r, NULL, 0);
            s_assert_top_k(g, x, n, k < nz ? k : nz);
            for (size_t i = 0, taken = 0; i < n; i++) { /* ties: the lowest indices */
                float t = 0;
                for (size_t j = 0; j < n; j++)
                    t = x[j] != 0.0f && (t == 0 || fabsf(x[j]) < t) ? fabsf(x[j]) : t;
                if (fabsf(g[i]) == t && t > 0) {
                    if (x[i] == 0.0f)
                        taken = SIZE_MAX; /* a tie left out: none after it may be sent */
                    else
                        cr_assert_neq(taken, SIZE_MAX, "n %zu k %zu: tie %zu sent after a skip",
                                      n, k, i);
                }
            }
            free(x);
        }
}

Test(codec_topk, refuses_non_finite_input_and_keeps_the_residual)
{
    const size_t n = 1000;
    mq_codec_t c = s_parse("topk");
    float *g = s_normal(n, 700, 1.0f), *r = s_normal(n, 701, 1.0f);
    g[777] = NAN;
    s_check_refused_keeps_state(&c, g, n, r, n, 0, "value 777 of 1000");
    g[777] = 3e38f, r[777] = 3e38f; /* finite each, their sum is not */
    s_check_refused_keeps_state(&c, g, n, r, n, 0, "gradient + residual at value 777");
    uint8_t p[4 + 4000];
    size_t len;
    mq_codec_ctx_t ctx = {.state = NULL};
    g[777] = 0;
    cr_assert_eq(mq_codec_encode_ctx(&c, g, n, &ctx, p, sizeof p, &len, NULL), -1);
    cr_assert(strstr(mq_err_last(), "needs its state (1000 floats)"), "%s", mq_err_last());
    free(g);
    free(r);
}

Test(codec_topk, spec_parse_and_format_round_trip)
{
    static const char *const specs[][2] = {
        {"topk", "topk"},
        {"topk:ratio=0.01", "topk"},
        {"topk:ratio=0.001", "topk:ratio=0.001"},
        {"topk:ratio=1", "topk:ratio=1"},
        {"topk:ratio=0.0123456789", "topk:ratio=0.012345679"},
        {"topk:ratio=1e-5", "topk:ratio=1e-05"},
    };
    s_check_specs(specs, sizeof specs / sizeof specs[0]);
    mq_codec_t c = s_parse("topk");
    cr_assert_eq(mq_codec_state_floats(&c, 1234), 1234);
    cr_assert_eq(mq_codec_payload_size(&c, 1000), 4004);
}

Test(codec_topk, bad_specs_are_refused_with_a_reason)
{
    static const char *const bad[][2] = {
        {"topk:ratio=0", "ratio=0 is out of range (expected 0 < ratio <= 1)"},
        {"topk:ratio=1.5", "not a number in 0..1"},
        {"topk:ratio=-0.1", "not a number in 0..1"},
        {"topk:ratio=abc", "ratio"},
        {"topk:ratio=", "ratio"},
        {"topk:ratio=nan", "ratio"},
        {"topk:rate=0.1", "unknown option 'rate=0.1' (expected ratio=)"},
        {"topk:4", "unknown option '4'"},
        {"topk:ratio=1e-50", "out of range"},
    };
    s_check_bad_specs(bad, sizeof bad / sizeof bad[0], "usage: topk[:ratio=R]");
    /* Parameter words from the network are checked too. */
    mq_codec_t c = s_parse("topk");
    mq_codec_set_param_f(&c, 0, NAN);
    cr_assert_eq(mq_codec_validate(&c), -1);
    cr_assert(strstr(mq_err_last(), "ratio is nan"), "%s", mq_err_last());
    c = s_parse("topk");
    c.param[3] = 1;
    cr_assert_eq(mq_codec_validate(&c), -1);
    cr_assert(strstr(mq_err_last(), "parameter word 3 is set"), "%s", mq_err_last());
    cr_assert_eq(mq_codec_payload_size(&c, 10), 0);
}

/* ---- dgc -------------------------------------------------------------------------------- */

/* Over fresh Gaussian gradients the count sent is near ratio * n: the sample's estimate
 * (about 32 sampled values above the threshold: ~14% noise a step, no bias), and never far
 * above (the exact selection caps it at 1.3x). */
Test(codec_dgc, sends_close_to_the_wanted_density)
{
    const size_t n = 200000;
    static const char *specs[] = {"dgc:ratio=0.01", "dgc", "dgc:ratio=0.05:sample=0.02"};
    static const double ratio[] = {0.01, 0.001, 0.05};
    for (size_t s = 0; s < 3; s++) {
        mq_codec_t c = s_parse(specs[s]);
        double want = ratio[s] * (double)n, total = 0;
        for (int seed = 0; seed < 16; seed++) {
            mq_rng_t rng;
            mq_rng_seed(&rng, 800 + (uint64_t)seed);
            float *g = s_normal(n, 810 + (size_t)seed, 1.0f);
            double k = (double)s_first_sent(&c, g, n, &rng);
            cr_assert(k >= 0.5 * want && k <= 1.3 * want, "%s seed %d: %g sent, want %g", specs[s],
                      seed, k, want);
            total += k;
            free(g);
        }
        cr_assert(fabs(total / 16 - want) <= 0.15 * want, "%s: %g sent on average, want %g",
                  specs[s], total / 16, want);
    }
    /* sample=1: the threshold is exact, as topk's */
    mq_codec_t c = s_parse("dgc:ratio=0.01:sample=1:momentum=0");
    float *g = s_normal(n, 820, 1.0f);
    s_check_top_k(&c, g, n, 2000);
    free(g);
}

/* u = m u + g; v = v + u; what is sent is cleared from both (momentum factor masking), the
 * rest carries over, and decode + new v == old v + new u. */
Test(codec_dgc, momentum_correction_and_factor_masking)
{
    const size_t n = 5000;
    const float m = 0.9f;
    mq_codec_t c = s_parse("dgc:ratio=0.02");
    cr_assert_eq(mq_codec_state_floats(&c, n), 2 * n);
    float *state = s_zeros(2 * n), *v = state, *u = state + n;
    float *pu = s_zeros(n), *pv = s_zeros(n);
    mq_rng_t rng;
    mq_rng_seed(&rng, 830);
    for (int it = 0; it < 6; it++) {
        float *g = s_normal(n, 840 + (size_t)it, 1.0f);
        memcpy(pu, u, n * sizeof *u);
        memcpy(pv, v, n * sizeof *v);
        float *x = s_sent(&c, g, n, state, &rng, 0.1f);
        size_t sent = 0;
        for (size_t i = 0; i < n; i++) {
            float nu = m * pu[i] + g[i], nv = pv[i] + nu;
            if (x[i] != 0.0f) {
                sent++;
                cr_assert(u[i] == 0.0f && v[i] == 0.0f, "it %d value %zu: sent, not masked", it, i);
                cr_assert_float_eq(x[i], nv, 1e-5f * fabsf(nv), "it %d value %zu", it, i);
            } else {
                cr_assert_float_eq(u[i], nu, 1e-5f * (1 + fabsf(nu)), "it %d value %zu", it, i);
                cr_assert_float_eq(v[i], nv, 1e-5f * (1 + fabsf(nv)), "it %d value %zu", it, i);
            }
        }
        cr_assert(sent > 50 && sent < 130, "it %d: %zu sent of 100 wanted", it, sent);
        free(g);
        free(x);
    }
    free(state), free(pu), free(pv);
}

/* Without momentum dgc is top-k with a sampled threshold: residual conservation holds
 * exactly, as topk's. */
Test(codec_dgc, without_momentum_the_residual_keeps_what_was_not_sent)
{
    mq_codec_t c = s_parse("dgc:ratio=0.01:momentum=0");
    mq_rng_t rng;
    mq_rng_seed(&rng, 850);
    s_check_residual_keeps(&c, 20000, 10, 860, &rng, 0.1f, 0, 0);
}

/* clip=C: the gradient that enters the state has norm C at most. */
Test(codec_dgc, clipping_bounds_the_gradient_norm)
{
    const size_t n = 10000;
    static const char *specs[] = {"dgc:clip=1:momentum=0", "dgc:clip=1", "dgc:clip=1000"};
    for (size_t s = 0; s < 3; s++) {
        mq_codec_t c = s_parse(specs[s]);
        float *g = s_normal(n, 870, 1.0f); /* norm ~100 */
        float *state = s_zeros(mq_codec_state_floats(&c, n));
        mq_rng_t rng;
        mq_rng_seed(&rng, 871);
        float *x = s_sent(&c, g, n, state, &rng, 0.1f);
        for (size_t i = 0; i < n; i++) /* what entered: sent + kept */
            x[i] += state[i];
        double want = s == 2 ? s_norm(g, n) : 1.0;
        cr_assert(fabs(s_norm(x, n) - want) <= 1e-5 * want, "%s: norm %g, want %g", specs[s],
                  s_norm(x, n), want);
        for (size_t i = 0; i < n; i++) /* the direction is kept */
            cr_assert(fabsf(x[i] - g[i] * (float)(want / s_norm(g, n))) <= 1e-6f);
        free(g), free(state), free(x);
    }
}

Test(codec_dgc, is_reproducible_from_the_seed_and_needs_a_generator)
{
    const size_t n = 50000;
    mq_codec_t c = s_parse("dgc:ratio=0.01"); /* a sample of 3200 of the 50000 */
    float *g = s_normal(n, 880, 1.0f);
    uint8_t *p[3];
    size_t len[3];
    for (int t = 0; t < 3; t++) {
        mq_rng_t rng;
        mq_rng_seed(&rng, t < 2 ? 881 : 882);
        float *state = s_zeros(2 * n);
        p[t] = s_encode(&c, g, n, state, &rng, 0.1f, &len[t], NULL);
        free(state);
    }
    cr_assert_eq(len[0], len[1]);
    cr_assert_arr_eq(p[0], p[1], len[0], "the same seed gave another payload");
    cr_assert(len[0] != len[2] || memcmp(p[0], p[2], len[0]) != 0, "the seed is not used");
    float *state = s_zeros(2 * n);
    uint8_t *buf = malloc(4 + 4 * n);
    size_t l;
    mq_codec_ctx_t ctx = {.state = state};
    cr_assert_eq(mq_codec_encode_ctx(&c, g, n, &ctx, buf, 4 + 4 * n, &l, NULL), -1);
    cr_assert(strstr(mq_err_last(), "random generator"), "%s", mq_err_last());
    mq_codec_t exact = s_parse("dgc:sample=1"); /* no sample: no generator needed */
    cr_assert_eq(mq_codec_encode_ctx(&exact, g, n, &ctx, buf, 4 + 4 * n, &l, NULL), 0, "%s",
                 mq_err_last());
    for (int t = 0; t < 3; t++)
        free(p[t]);
    free(buf), free(g), free(state);
}

Test(codec_dgc, refuses_non_finite_gradients_and_resets_an_overflowed_state)
{
    const size_t n = 1000;
    mq_codec_t c = s_parse("dgc:sample=1");
    float *g = s_normal(n, 890, 1.0f), *state = s_normal(2 * n, 891, 1.0f);
    g[10] = INFINITY;
    s_check_refused_keeps_state(&c, g, n, state, 2 * n, 0, "value 10 of 1000 is infinite");
    g[10] = 3e38f, state[10] = 3e38f; /* finite, but v + u overflows */
    uint8_t p[4 + 4000];
    size_t len;
    mq_codec_ctx_t ctx = {.state = state};
    cr_assert_eq(mq_codec_encode_ctx(&c, g, n, &ctx, p, sizeof p, &len, NULL), -1);
    cr_assert(strstr(mq_err_last(), "overflowed at value 10"), "%s", mq_err_last());
    cr_assert_eq(s_nonzeros(state, 2 * n), 0, "the diverged state was not reset");
    free(g);
    free(state);
}

Test(codec_dgc, spec_parse_and_format_round_trip)
{
    static const char *const specs[][2] = {
        {"dgc", "dgc"},
        {"dgc:ratio=0.001:momentum=0.9:clip=0:sample=0.01", "dgc"},
        {"dgc:sample=0.05:ratio=0.01", "dgc:ratio=0.01:sample=0.05"},
        {"dgc:momentum=0:clip=2.5", "dgc:momentum=0:clip=2.5"},
        {"dgc:clip=-0", "dgc"},
    };
    s_check_specs(specs, sizeof specs / sizeof specs[0]);
    static const char *const bad[][2] = {
        {"dgc:momentum=1", "momentum=1 is out of range (expected 0 <= momentum < 1)"},
        {"dgc:sample=0", "sample=0 is out of range"},
        {"dgc:clip=-1", "clip"},
        {"dgc:ratio=2", "ratio"},
        {"dgc:warmup=1", "unknown option 'warmup=1' (expected ratio=, momentum=, clip=, sample=)"},
        {"dgc:3", "unknown option '3'"},
    };
    s_check_bad_specs(bad, sizeof bad / sizeof bad[0], "usage: dgc[");
}

/* ---- sdagc ------------------------------------------------------------------------------- */

/* On fresh Gaussian gradients the default threshold (3.29 sigma) sends the Gaussian tail,
 * ~0.1%: an element ratio inside the paper's 433x-2021x; 3.05 and 3.48 sigma give its ends. */
Test(codec_sdagc, sends_the_gaussian_tail_in_the_papers_range)
{
    const size_t n = 1000000;
    static const char *specs[] = {"sdagc", "sdagc:c=3.05", "sdagc:c=3.48", "sdagc:momentum=0"};
    static const double tail[] = {0.001002, 0.002288, 0.000501, 0.001002}; /* 2(1 - Phi(c)) */
    float *g = s_normal(n, 900, 0.01f);
    for (size_t s = 0; s < 4; s++) {
        mq_codec_t c = s_parse(specs[s]);
        double k = (double)s_first_sent(&c, g, n, NULL), want = tail[s] * (double)n;
        cr_assert(fabs(k - want) <= 0.12 * want, "%s: %g sent, want %g", specs[s], k, want);
        if (s == 0)
            cr_assert(n / k >= 433 && n / k <= 2021, "element ratio %gx", n / k);
    }
    free(g);
}

/* The update the server applies is lr * sent: when lr changes, the unsent residual and the
 * momentum are rescaled by lr_old / lr_new so they keep the size they were meant to have. */
Test(codec_sdagc, learning_rate_revision_rescales_the_residual)
{
    const size_t n = 4000;
    static const char *specs[] = {"sdagc:momentum=0", "sdagc", "sdagc:revise=0"};
    for (size_t s = 0; s < 3; s++) {
        mq_codec_t c = s_parse(specs[s]);
        size_t sf = mq_codec_state_floats(&c, n);
        float m = mq_codec_param_f(&c, 1);
        cr_assert_eq(sf, 4 + (m > 0 ? 2 : 1) * n);
        float *state = s_zeros(sf), *g = s_normal(n, 910, 1.0f), *zero = s_zeros(n);
        float *r = state + 4, *u = m > 0 ? r + n : NULL;
        free(s_sent(&c, g, n, state, NULL, 0.1f));
        cr_assert_eq(state[0], 0.1f, "%s: lr not kept in the header", specs[s]);
        float *r1 = malloc(n * sizeof *r1), *u1 = s_zeros(n);
        memcpy(r1, r, n * sizeof *r);
        if (u)
            memcpy(u1, u, n * sizeof *u);
        /* lr halves, no new gradient: the residual doubles (none if revision is off) */
        float q = s == 2 ? 1.0f : 2.0f;
        float *x = s_sent(&c, zero, n, state, NULL, 0.05f);
        cr_assert_eq(state[0], 0.05f);
        for (size_t i = 0; i < n; i++) {
            float nu = m * (q * u1[i]), nr = q * r1[i] + nu;
            if (x[i] != 0.0f) {
                cr_assert_float_eq(x[i], nr, 1e-6f * (1 + fabsf(nr)), "%s value %zu", specs[s], i);
                continue;
            }
            cr_assert_float_eq(r[i], nr, 1e-6f * (1 + fabsf(nr)), "%s value %zu: %g, want %g",
                               specs[s], i, r[i], nr);
            if (u)
                cr_assert_float_eq(u[i], nu, 1e-6f * (1 + fabsf(nu)), "%s value %zu", specs[s], i);
        }
        /* lr unknown (0): no revision, the header keeps the last known lr */
        memcpy(r1, r, n * sizeof *r);
        free(x);
        x = s_sent(&c, zero, n, state, NULL, 0.0f);
        cr_assert_eq(state[0], 0.05f);
        if (!u)
            for (size_t i = 0; i < n; i++)
                cr_assert(x[i] != 0.0f || r[i] == r1[i], "%s value %zu rescaled", specs[s], i);
        free(x), free(state), free(g), free(zero), free(r1), free(u1);
    }
}

/* A short segment never has a value beyond 3.29 sigma: the largest goes anyway. */
Test(codec_sdagc, always_sends_at_least_the_largest_value)
{
    mq_codec_t c = s_parse("sdagc:momentum=0");
    float g[5] = {0.1f, -0.4f, 0.2f, 0.3f, -0.1f}, state[4 + 5] = {0};
    float *x = s_sent(&c, g, 5, state, NULL, 0.1f);
    cr_assert_eq(s_nonzeros(x, 5), 1);
    cr_assert_eq(x[1], -0.4f);
    cr_assert_eq(state[4 + 1], 0.0f);
    cr_assert_eq(state[4 + 3], 0.3f);
    free(x);
    /* All zero: nothing to send. */
    float z[5] = {0};
    cr_assert_eq(s_first_sent(&c, z, 5, NULL), 0);
}

/* Residual accumulation without momentum: decode + new r == old r + g, to rounding (exactly,
 * as nothing is rescaled at a constant lr). */
Test(codec_sdagc, residual_accumulates_what_was_not_sent)
{
    mq_codec_t c = s_parse("sdagc:momentum=0");
    size_t total = s_check_residual_keeps(&c, 30000, 12, 920, NULL, 0.1f, 4, 0);
    cr_assert_gt(total, 12 * 10, "%zu sent in 12 steps", total);
}

Test(codec_sdagc, clipping_bounds_the_norm_and_masking_clears_the_momentum)
{
    const size_t n = 10000;
    mq_codec_t c = s_parse("sdagc:clip=2:c=2");
    float *g = s_normal(n, 930, 1.0f), *state = s_zeros(4 + 2 * n);
    float *r = state + 4, *u = r + n, *x = s_sent(&c, g, n, state, NULL, 0.1f);
    size_t sent = 0;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != 0.0f) {
            sent++;
            cr_assert(r[i] == 0.0f && u[i] == 0.0f, "value %zu sent but not masked", i);
        }
        x[i] += r[i]; /* first step: u = r = clipped g */
    }
    cr_assert(sent > 300 && sent < 600, "%zu sent at 2 sigma", sent);
    cr_assert(fabs(s_norm(x, n) - 2.0) <= 2e-5, "norm %g", s_norm(x, n));
    free(g), free(state), free(x);
}

Test(codec_sdagc, refuses_non_finite_gradients_without_touching_the_state)
{
    const size_t n = 100;
    mq_codec_t c = s_parse("sdagc");
    float *g = s_normal(n, 940, 1.0f), *state = s_normal(4 + 2 * n, 941, 1.0f);
    g[99] = NAN;
    s_check_refused_keeps_state(&c, g, n, state, 4 + 2 * n, 0.5f,
                                "sdagc encode: value 99 of 100 is NaN");
    free(g);
    free(state);
}

Test(codec_sdagc, spec_parse_and_format_round_trip)
{
    static const char *const specs[][2] = {
        {"sdagc", "sdagc"},
        {"sdagc:c=3.29:momentum=0.9:clip=0:revise=1", "sdagc"},
        {"sdagc:revise=0:c=3.05", "sdagc:c=3.05:revise=0"},
        {"sdagc:momentum=0:clip=0.5", "sdagc:momentum=0:clip=0.5"},
    };
    s_check_specs(specs, sizeof specs / sizeof specs[0]);
    static const char *const bad[][2] = {
        {"sdagc:c=0", "c=0 is out of range (expected 0 < c <= 100)"},
        {"sdagc:c=101", "not a number in 0..100"},
        {"sdagc:revise=0.5", "revise=0.5 is out of range (expected revise = 0..1)"},
        {"sdagc:revise=2", "revise"},
        {"sdagc:momentum=1", "momentum"},
        {"sdagc:clip=inf", "clip"},
        {"sdagc:sigma=3", "unknown option 'sigma=3' (expected c=, momentum=, clip=, revise=)"},
        {"sdagc:3", "unknown option '3'"},
    };
    s_check_bad_specs(bad, sizeof bad / sizeof bad[0], "usage: sdagc[");
}
