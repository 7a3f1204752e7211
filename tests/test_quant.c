/* Tests of the gradient codecs (common/quant): specs, exact payload sizes and wire bytes,
 * quantization error bounds per bit-width, stochastic rounding's unbiasedness, error
 * feedback, server-side accumulation, and refusal of bad input without damage. */

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gauss.h"
#include "mqgrad/quant.h"
/* For mq_quant_use_kernels: the tests compare the codec's instruction-set builds. */
#include "../common/src/quant/quant_internal.h"

static int s_all_bits[] = {1, 2, 3, 4, 5, 6, 7, 8};

static float *s_normal(size_t n, uint64_t seed, float sigma)
{
    return test_gaussian(n, seed, sigma, 0.0f);
}

/* A gradient with the awkward values: both zeros, repeated extremes, a constant run, a
 * bucket spanning nearly the whole float range. */
static float *s_awkward(size_t n, uint64_t seed)
{
    float *x = s_normal(n, seed, 0.01f);
    for (size_t i = 0; i < n; i += 97)
        x[i] = (i / 97) % 2 ? 0.0f : -0.0f;
    for (size_t i = 40; i < n && i < 60; i++)
        x[i] = 0.25f;
    if (n > 3000) {
        x[2000] = 3e38f;
        x[2001] = -3e38f;
    }
    return x;
}

/* Encodes and decodes x with C; returns the payload length. */
static size_t s_roundtrip(const mq_codec_t *c, const float *x, size_t n, float *out, mq_rng_t *rng)
{
    size_t cap = mq_codec_payload_size(c, n), len = 0;
    uint8_t *buf = malloc(cap + 1);
    cr_assert(buf);
    cr_assert_eq(mq_codec_encode(c, x, n, buf, cap, &len, rng, NULL), 0, "%s", mq_err_last());
    cr_assert_eq(mq_codec_decode(c, buf, len, out, n, 1.0f, false, NULL), 0, "%s", mq_err_last());
    free(buf);
    return len;
}

static void s_bucket_range(const float *x, size_t n, float *lo, float *hi)
{
    *lo = *hi = x[0];
    for (size_t i = 1; i < n; i++) {
        *lo = fminf(*lo, x[i]);
        *hi = fmaxf(*hi, x[i]);
    }
}

static double s_rms_error(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / (double)n);
}

/* ---- specs ----------------------------------------------------------------------------*/

Test(quant, spec_parse_format_roundtrip)
{
    static const char *specs[][2] = {
        {"none", "none"},
        {"uniform:1", "uniform:1"},
        {"uniform:8", "uniform:8"},
        {"uniform:4:bucket=512", "uniform:4:bucket=512"},
        {"uniform:4:stochastic", "uniform:4:stochastic"},
        {"uniform:3:stochastic:bucket=64", "uniform:3:bucket=64:stochastic"},
        {"uniform:2:bucket=0", "uniform:2"},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        mq_codec_t c, back;
        char buf[64];
        cr_assert_eq(mq_codec_parse(specs[i][0], &c), 0, "%s: %s", specs[i][0], mq_err_last());
        cr_assert_eq(mq_codec_validate(&c), 0);
        mq_codec_format(&c, buf, sizeof buf);
        cr_assert_str_eq(buf, specs[i][1]);
        cr_assert_eq(mq_codec_parse(buf, &back), 0);
        cr_assert(back.id == c.id && back.param[0] == c.param[0] &&
                      back.param[1] == c.param[1] &&
                      (c.id == MQ_CODEC_ID_none || back.bits == c.bits),
                  "%s does not parse back to itself", buf);
    }
    mq_codec_t c;
    cr_assert_eq(mq_codec_parse("uniform:5:bucket=7", &c), 0);
    cr_assert(c.id == MQ_CODEC_ID_uniform && c.bits == 5 && c.param[0] == 7 && !c.param[1]);
}

Test(quant, spec_parse_rejects_bad_specs_with_a_reason)
{
    static const char *bad[][2] = {
        {"", "empty"},
        {"uniform:0", "1..8"},
        {"uniform:9", "1..8"},
        {"uniform:4x", "not an integer"},
        {"uniform:4:bucket=-1", "bucket"},
        {"uniform:4:bucket=", "bucket"},
        {"uniform:4:bucket=99999999999", "bucket"},
        {"uniform:4:fast", "unknown option 'fast'"},
        {"uniform:4:stochastic:stochastic", "twice"},
        {"uniform::4", "empty field"},
        {"uniform:4:", "empty field"},
        {":uniform:4", "empty field"},
        {"none:4", "no options"},
        {"fp16", "unknown codec 'fp16'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mq_codec_t c = mq_codec_uniform(6, 11, false);
        cr_assert_eq(mq_codec_parse(bad[i][0], &c), -1, "'%s' was accepted", bad[i][0]);
        cr_assert(strstr(mq_err_last(), bad[i][1]), "'%s': message '%s' lacks '%s'", bad[i][0],
                  mq_err_last(), bad[i][1]);
        cr_assert(c.id == MQ_CODEC_ID_uniform && c.bits == 6 && c.param[0] == 11,
                  "'%s': output changed on failure", bad[i][0]);
    }
    cr_assert_eq(mq_codec_parse(NULL, &(mq_codec_t){0}), -1);
}

Test(quant, validate_rejects_out_of_range_codecs)
{
    cr_assert_eq(mq_codec_validate((mq_codec_t[]){mq_codec_uniform(0, 0, false)}), -1);
    cr_assert_eq(mq_codec_validate((mq_codec_t[]){mq_codec_uniform(9, 0, false)}), -1);
    cr_assert(strstr(mq_err_last(), "9 bits"));
    cr_assert_eq(mq_codec_validate(&(mq_codec_t){.id = 77, .bits = 4}), -1);
    cr_assert_eq(mq_codec_validate((mq_codec_t[]){mq_codec_none()}), 0);
    float x[4] = {1, 2, 3, 4}, y[4];
    uint8_t buf[64];
    size_t len;
    mq_codec_t bad = mq_codec_uniform(12, 0, false);
    cr_assert_eq(mq_codec_encode(&bad, x, 4, buf, sizeof buf, &len, NULL, NULL), -1);
    cr_assert_eq(mq_codec_decode(&bad, buf, 8, y, 4, 1.0f, false, NULL), -1);
}

/* ---- wire size and bytes ----------------------------------------------------------------*/

ParameterizedTestParameters(quant, payload_is_exactly_header_plus_packed_bits)
{
    return cr_make_param_array(int, s_all_bits, sizeof s_all_bits / sizeof s_all_bits[0]);
}

ParameterizedTest(int *bits, quant, payload_is_exactly_header_plus_packed_bits)
{
    static const size_t ns[] = {0, 1, 7, 8, 9, 100, 2047, 2048, 2049, 5003};
    static const uint32_t buckets[] = {0, 1, 3, 8, 64, 1000, 100000};
    float *x = s_normal(5003, 7, 1.0f);
    uint8_t *buf = malloc(8 * 5003 + 5003 + 16);
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++) {
            size_t n = ns[a];
            mq_codec_t c = mq_codec_uniform(*bits, buckets[b], false);
            size_t nb = n == 0 ? 0 : buckets[b] == 0 ? 1 : (n + buckets[b] - 1) / buckets[b];
            size_t want = 8 * nb + (n * (size_t)*bits + 7) / 8;
            cr_assert_eq(mq_codec_nbuckets(&c, n), nb);
            cr_assert_eq(mq_codec_payload_size(&c, n), want, "n=%zu bucket=%u", n, buckets[b]);
            memset(buf, 0xA5, want + 16);
            size_t len = 99;
            cr_assert_eq(mq_codec_encode(&c, x, n, buf, want, &len, NULL, NULL), 0, "%s",
                         mq_err_last());
            cr_assert_eq(len, want);
            for (size_t g = want; g < want + 16; g++)
                cr_assert_eq(buf[g], 0xA5, "byte %zu past the payload was written", g);
            if (want > 0) {
                cr_assert_eq(mq_codec_encode(&c, x, n, buf, want - 1, &len, NULL, NULL), -1);
                cr_assert(strstr(mq_err_last(), "need"), "%s", mq_err_last());
            }
        }
    free(buf);
    free(x);
}

Test(quant, wire_bytes_match_the_documented_layout)
{
    /* 4 values, 2 bits, one range [0, 3]: codes 0,1,2,3 packed LSB first = 0b11100100. */
    mq_codec_t c = mq_codec_uniform(2, 0, false);
    float x[] = {0, 1, 2, 3};
    uint8_t buf[32];
    size_t len;
    cr_assert_eq(mq_codec_encode(&c, x, 4, buf, sizeof buf, &len, NULL, NULL), 0);
    static const uint8_t want[] = {0, 0, 0, 0, 0, 0, 0x40, 0x40, 0xE4};
    cr_assert_eq(len, sizeof want);
    cr_assert_arr_eq(buf, want, sizeof want);

    /* Buckets of 3, 3 bits: codes 0,7,2 | 0,0 run on across the bucket boundary with no
     * padding: 15 bits in 2 bytes after ranges [0,7] and [10,10]. */
    mq_codec_t c3 = mq_codec_uniform(3, 3, false);
    float y[] = {0, 7, 2, 10, 10};
    cr_assert_eq(mq_codec_encode(&c3, y, 5, buf, sizeof buf, &len, NULL, NULL), 0);
    static const uint8_t want3[] = {0, 0,    0,    0, 0, 0,    0xE0, 0x40, 0,
                                    0, 0x20, 0x41, 0, 0, 0x20, 0x41, 0xB8, 0x00};
    cr_assert_eq(len, sizeof want3);
    cr_assert_arr_eq(buf, want3, sizeof want3);

    /* none: float32 little-endian. */
    mq_codec_t none = mq_codec_none();
    float one[] = {1.0f, -2.0f};
    cr_assert_eq(mq_codec_encode(&none, one, 2, buf, sizeof buf, &len, NULL, NULL), 0);
    static const uint8_t want_none[] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0};
    cr_assert_eq(len, 8);
    cr_assert_arr_eq(buf, want_none, 8);
}

/* ---- accuracy ---------------------------------------------------------------------------*/

ParameterizedTestParameters(quant, error_is_at_most_half_a_step_and_extremes_are_exact)
{
    return cr_make_param_array(int, s_all_bits, sizeof s_all_bits / sizeof s_all_bits[0]);
}

ParameterizedTest(int *bits, quant, error_is_at_most_half_a_step_and_extremes_are_exact)
{
    static const uint32_t buckets[] = {0, 1, 7, 256, 3000};
    const size_t n = 5003;
    float *x = s_normal(n, 11 + (uint64_t)*bits, 0.01f), *y = malloc(n * sizeof *y);
    const unsigned levels = (1u << *bits) - 1;
    for (size_t k = 0; k < sizeof buckets / sizeof buckets[0]; k++) {
        mq_codec_t c = mq_codec_uniform(*bits, buckets[k], false);
        s_roundtrip(&c, x, n, y, NULL);
        size_t B = buckets[k] ? buckets[k] : n;
        for (size_t b0 = 0; b0 < n; b0 += B) {
            size_t len = b0 + B <= n ? B : n - b0;
            float lo, hi;
            s_bucket_range(x + b0, len, &lo, &hi);
            double step = ((double)hi - lo) / levels;
            for (size_t i = b0; i < b0 + len; i++) {
                cr_assert_leq(fabs((double)x[i] - y[i]), step / 2 + 1e-6 * fabsf(hi - lo),
                              "bits %d bucket %u value %zu: %g decoded as %g (step %g)", *bits,
                              buckets[k], i, x[i], y[i], step);
                cr_assert(y[i] >= lo && y[i] <= hi, "decoded value outside its bucket range");
                if (x[i] == lo || x[i] == hi)
                    cr_assert_eq(y[i], x[i], "bucket extreme %g decoded as %g", x[i], y[i]);
            }
        }
    }
    free(x);
    free(y);
}

Test(quant, each_extra_bit_roughly_halves_the_error)
{
    const size_t n = 20000;
    float *x = s_normal(n, 3, 1.0f), *y = malloc(n * sizeof *y);
    double prev = INFINITY;
    for (int k = 1; k <= 8; k++) {
        mq_codec_t c = mq_codec_uniform(k, 0, false);
        size_t len = s_roundtrip(&c, x, n, y, NULL);
        cr_assert_eq(len, 8 + (n * k + 7) / 8);
        double err = s_rms_error(x, y, n);
        if (k >= 3)
            cr_assert(prev / err > 1.6 && prev / err < 2.6,
                      "%d bits: error %g, %d bits: %g (ratio %g)", k - 1, prev, k, err, prev / err);
        else
            cr_assert_lt(err, prev);
        prev = err;
    }
    free(x);
    free(y);
}

Test(quant, buckets_keep_small_gradients_from_being_flattened)
{
    /* Half of the tensor is 1000x smaller than the other half (a layer next to a bigger one):
     * one range for all rounds the small half to a couple of levels; buckets do not. */
    const size_t n = 4096;
    float *x = s_normal(n, 5, 1.0f), *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n / 2; i++)
        x[i] *= 1e-3f;
    mq_codec_t one = mq_codec_uniform(4, 0, false);
    mq_codec_t bucketed = mq_codec_uniform(4, 512, false);
    s_roundtrip(&one, x, n, y, NULL);
    double err_one = s_rms_error(x, y, n / 2);
    s_roundtrip(&bucketed, x, n, y, NULL);
    double err_b = s_rms_error(x, y, n / 2);
    cr_assert_lt(err_b * 100, err_one, "bucketed error %g vs single range %g", err_b, err_one);
    free(x);
    free(y);
}

Test(quant, constant_and_single_value_buckets_decode_exactly)
{
    float x[1000];
    for (int i = 0; i < 1000; i++)
        x[i] = i < 500 ? 0.125f : -3.5e-20f;
    float y[1000];
    for (int k = 1; k <= 8; k++) {
        mq_codec_t c = mq_codec_uniform(k, 500, false);
        s_roundtrip(&c, x, 1000, y, NULL);
        cr_assert_arr_eq(y, x, sizeof x, "%d bits", k);
        mq_codec_t c1 = mq_codec_uniform(k, 1, false);
        float *z = s_normal(1000, 9, 3.0f);
        s_roundtrip(&c1, z, 1000, y, NULL);
        cr_assert_arr_eq(y, z, 1000 * sizeof *z, "bucket=1 is lossless");
        free(z);
    }
}

Test(quant, ranges_near_float_max_stay_finite)
{
    float x[] = {-FLT_MAX, FLT_MAX, 0.0f, 1e38f, -2e38f, 1.0f, FLT_MAX / 3};
    float y[7];
    for (int k = 1; k <= 8; k++) {
        mq_codec_t c = mq_codec_uniform(k, 0, false);
        s_roundtrip(&c, x, 7, y, NULL);
        double step = 2.0 * FLT_MAX / ((1u << k) - 1);
        for (int i = 0; i < 7; i++) {
            cr_assert(isfinite(y[i]), "%d bits: value %d decoded to %g", k, i, y[i]);
            cr_assert_leq(fabs((double)x[i] - y[i]), step / 2 * (1 + 1e-6));
        }
        cr_assert_eq(y[0], -FLT_MAX);
        cr_assert_eq(y[1], FLT_MAX);
    }
    /* A range in the denormals: the step would overflow a float. */
    float t[] = {1e-45f, 0.0f, 2e-45f};
    mq_codec_t c = mq_codec_uniform(8, 0, false);
    s_roundtrip(&c, t, 3, y, NULL);
    cr_assert(y[0] >= 0 && y[0] <= 2e-45f && y[1] == 0.0f && y[2] == t[2]);
}

Test(quant, none_is_lossless)
{
    const size_t n = 1001;
    float *x = s_normal(n, 13, 1e-7f), *y = malloc(n * sizeof *y);
    x[0] = FLT_MAX;
    x[1] = -0.0f;
    x[2] = FLT_TRUE_MIN;
    mq_codec_t c = mq_codec_none();
    cr_assert_eq(s_roundtrip(&c, x, n, y, NULL), 4 * n);
    cr_assert_arr_eq(y, x, n * sizeof *x);
    free(x);
    free(y);
}

/* ---- stochastic rounding -----------------------------------------------------------------*/

Test(quant, stochastic_rounding_is_unbiased_where_nearest_is_not)
{
    const size_t n = 64;
    const int reps = 4000;
    mq_rng_t rng;
    mq_rng_seed(&rng, 42);
    float x[64], y[64];
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(2 * mq_rng_double(&rng) - 1);
    x[0] = -1.0f; /* pin the range so the step is known */
    x[1] = 1.0f;
    mq_codec_t c = mq_codec_uniform(2, 0, true);
    double step = 2.0 / 3.0;
    double sum[64] = {0};
    for (int r = 0; r < reps; r++) {
        s_roundtrip(&c, x, n, y, &rng);
        for (size_t i = 0; i < n; i++) {
            cr_assert_lt(fabs((double)x[i] - y[i]), step * (1 + 1e-6),
                         "value %zu: %g decoded to %g, not a neighbouring level", i, x[i], y[i]);
            sum[i] += y[i];
        }
    }
    /* Each decode is within step of x, so its standard deviation is at most step/2. */
    double tol = 5 * (step / 2) / sqrt(reps), worst_nearest = 0;
    mq_codec_t det = mq_codec_uniform(2, 0, false);
    s_roundtrip(&det, x, n, y, NULL);
    for (size_t i = 0; i < n; i++) {
        cr_assert_lt(fabs(sum[i] / reps - x[i]), tol, "value %zu: mean %g, true %g", i,
                     sum[i] / reps, x[i]);
        worst_nearest = fmax(worst_nearest, fabs((double)y[i] - x[i]));
    }
    cr_assert_gt(worst_nearest, 5 * tol, "the data should show nearest rounding's bias");
}

Test(quant, stochastic_rounding_is_reproducible_from_the_seed)
{
    const size_t n = 3000;
    float *x = s_normal(n, 17, 1.0f);
    mq_codec_t c = mq_codec_uniform(3, 100, true);
    size_t cap = mq_codec_payload_size(&c, n), la, lb;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    mq_rng_t r1, r2;
    mq_rng_seed(&r1, 5);
    mq_rng_seed(&r2, 5);
    cr_assert_eq(mq_codec_encode(&c, x, n, a, cap, &la, &r1, NULL), 0);
    cr_assert_eq(mq_codec_encode(&c, x, n, b, cap, &lb, &r2, NULL), 0);
    cr_assert_arr_eq(a, b, cap);
    mq_rng_seed(&r2, 6);
    cr_assert_eq(mq_codec_encode(&c, x, n, b, cap, &lb, &r2, NULL), 0);
    cr_assert_neq(memcmp(a, b, cap), 0, "another seed should round differently");
    cr_assert_eq(mq_codec_encode(&c, x, n, b, cap, &lb, NULL, NULL), -1);
    cr_assert(strstr(mq_err_last(), "random generator"), "%s", mq_err_last());
    free(a);
    free(b);
    free(x);
}

/* ---- bad input -----------------------------------------------------------------------------*/

Test(quant, encode_refuses_nan_and_infinity_naming_the_index)
{
    const size_t n = 5000;
    float *x = s_normal(n, 19, 1.0f);
    static const char *specs[] = {"none", "uniform:4", "uniform:2:bucket=100",
                                  "uniform:8:stochastic"};
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const size_t where[] = {0, 5, 4321, 4999};
    uint8_t *buf = malloc(4 * n);
    mq_rng_t rng;
    mq_rng_seed(&rng, 1);
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
        for (size_t b = 0; b < 3; b++)
            for (size_t w = 0; w < 4; w++) {
                mq_codec_t c;
                cr_assert_eq(mq_codec_parse(specs[s], &c), 0);
                float keep = x[where[w]];
                x[where[w]] = bad[b];
                size_t len = 77;
                cr_assert_eq(mq_codec_encode(&c, x, n, buf, 4 * n, &len, &rng, NULL), -1,
                             "%s accepted %g at %zu", specs[s], bad[b], where[w]);
                char idx[32];
                snprintf(idx, sizeof idx, "value %zu ", where[w]);
                cr_assert(strstr(mq_err_last(), idx), "%s: '%s' lacks '%s'", specs[s],
                          mq_err_last(), idx);
                cr_assert_eq(len, 77, "out_len set on failure");
                x[where[w]] = keep;
            }
    free(buf);
    free(x);
}

/* A decode that fails must leave the destination as it was: a server sums pushes into it. */
Test(quant, decode_refuses_bad_payloads_and_keeps_the_running_sum)
{
    const size_t n = 300;
    float *x = s_normal(n, 23, 1.0f), sum[300], before[300];
    for (size_t i = 0; i < n; i++)
        sum[i] = before[i] = (float)i;
    mq_codec_t c = mq_codec_uniform(5, 64, false);
    size_t cap = mq_codec_payload_size(&c, n), len;
    uint8_t *p = malloc(cap + 1);
    cr_assert_eq(mq_codec_encode(&c, x, n, p, cap, &len, NULL, NULL), 0);

    cr_assert_eq(mq_codec_decode(&c, p, len - 1, sum, n, 1.0f, true, NULL), -1);
    cr_assert(strstr(mq_err_last(), "expected exactly"), "%s", mq_err_last());
    cr_assert_eq(mq_codec_decode(&c, p, len + 1, sum, n, 1.0f, true, NULL), -1);
    cr_assert_eq(mq_codec_decode(&c, p, len, sum, n + 1, 1.0f, true, NULL), -1);
    cr_assert_eq(mq_codec_decode(&c, p, len, sum, n, NAN, true, NULL), -1);

    static const float bad_ranges[][2] = {{NAN, 1}, {0, INFINITY}, {-INFINITY, 0}, {2, 1}};
    for (size_t k = 0; k < 4; k++) {
        uint8_t *q = malloc(cap);
        memcpy(q, p, cap);
        memcpy(q + 8 * 4, bad_ranges[k], 8); /* the last of the 5 buckets */
        cr_assert_eq(mq_codec_decode(&c, q, len, sum, n, 1.0f, true, NULL), -1);
        cr_assert(strstr(mq_err_last(), "bucket 4 of 5"), "%s", mq_err_last());
        free(q);
    }
    cr_assert_arr_eq(sum, before, sizeof sum, "a refused payload changed the running sum");

    /* none: a NaN hidden in the middle of an fp32 payload. */
    mq_codec_t none = mq_codec_none();
    uint8_t *f = malloc(4 * n);
    cr_assert_eq(mq_codec_encode(&none, x, n, f, 4 * n, &len, NULL, NULL), 0);
    float nan = NAN;
    memcpy(f + 4 * 150, &nan, 4);
    cr_assert_eq(mq_codec_decode(&none, f, len, sum, n, 1.0f, true, NULL), -1);
    cr_assert(strstr(mq_err_last(), "value 150"), "%s", mq_err_last());
    cr_assert_arr_eq(sum, before, sizeof sum);
    free(f);
    free(p);
    free(x);
}

/* ZeroMQ frames promise no alignment: payloads at an odd address decode the same. */
Test(quant, payloads_at_odd_addresses_decode_the_same)
{
    const size_t n = 1027;
    float *x = s_normal(n, 41, 1.0f), *y = malloc(n * sizeof *y), *z = malloc(n * sizeof *z);
    static const char *specs[] = {"none", "uniform:3:bucket=100", "uniform:8"};
    for (size_t s = 0; s < 3; s++) {
        mq_codec_t c;
        cr_assert_eq(mq_codec_parse(specs[s], &c), 0);
        size_t cap = mq_codec_payload_size(&c, n), len;
        uint8_t *raw = malloc(cap + 1);
        cr_assert_eq(mq_codec_encode(&c, x, n, raw + 1, cap, &len, NULL, NULL), 0);
        cr_assert_eq(mq_codec_decode(&c, raw + 1, len, y, n, 0.5f, false, NULL), 0);
        uint8_t *aligned = malloc(cap);
        memcpy(aligned, raw + 1, cap);
        cr_assert_eq(mq_codec_decode(&c, aligned, len, z, n, 0.5f, false, NULL), 0);
        cr_assert_arr_eq(y, z, n * sizeof *y, "%s", specs[s]);
        if (c.id == MQ_CODEC_ID_none) { /* a NaN in the last, odd-sized group */
            float inf = -INFINITY;
            memcpy(raw + 1 + 4 * (n - 1), &inf, 4);
            cr_assert_eq(mq_codec_decode(&c, raw + 1, len, y, n, 1.0f, true, NULL), -1);
            cr_assert(strstr(mq_err_last(), "value 1026"), "%s", mq_err_last());
        }
        free(raw);
        free(aligned);
    }
    free(x);
    free(y);
    free(z);
}

Test(quant, random_payloads_are_refused_or_decode_inside_their_ranges)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, 99);
    float y[257];
    uint8_t p[8 * 257 + 257];
    for (int trial = 0; trial < 3000; trial++) {
        mq_codec_t c = mq_codec_uniform(1 + (int)mq_rng_below(&rng, 8), (uint32_t)mq_rng_below(&rng, 40), false);
        size_t n = 1 + mq_rng_below(&rng, 257), len = mq_codec_payload_size(&c, n);
        for (size_t i = 0; i < len; i++)
            p[i] = (uint8_t)mq_rng_next(&rng);
        if (trial % 2) /* half with plausible ranges, so the codes get decoded too */
            for (size_t b = 0; b < mq_codec_nbuckets(&c, n); b++) {
                float r[2] = {(float)-mq_rng_double(&rng), (float)mq_rng_double(&rng)};
                memcpy(p + 8 * b, r, 8);
            }
        if (mq_codec_decode(&c, p, len, y, n, 1.0f, false, NULL) < 0)
            continue;
        size_t B = c.param[0] ? c.param[0] : n;
        for (size_t i = 0; i < n; i++) {
            float r[2];
            memcpy(r, p + 8 * (i / B), 8);
            cr_assert(isfinite(y[i]) && y[i] >= r[0] && y[i] <= r[1],
                      "trial %d value %zu: %g outside [%g, %g]", trial, i, y[i], r[0], r[1]);
        }
    }
}

Test(quant, empty_tensor_is_an_empty_payload)
{
    mq_codec_t c = mq_codec_uniform(3, 4, false);
    size_t len = 5;
    cr_assert_eq(mq_codec_payload_size(&c, 0), 0);
    cr_assert_eq(mq_codec_encode(&c, NULL, 0, NULL, 0, &len, NULL, NULL), 0, "%s", mq_err_last());
    cr_assert_eq(len, 0);
    cr_assert_eq(mq_codec_decode(&c, NULL, 0, NULL, 0, 1.0f, true, NULL), 0);
    cr_assert_eq(mq_codec_decode(&c, NULL, 1, NULL, 0, 1.0f, true, NULL), -1);
}

/* ---- server and worker use ------------------------------------------------------------------*/

Test(quant, accumulate_with_scale_averages_pushes_in_place)
{
    const size_t n = 4100, P = 3;
    static const char *specs[] = {"none", "uniform:3", "uniform:6:bucket=500"};
    for (size_t s = 0; s < 3; s++) {
        mq_codec_t c;
        cr_assert_eq(mq_codec_parse(specs[s], &c), 0);
        size_t cap = mq_codec_payload_size(&c, n);
        float *mean = calloc(n, sizeof *mean), *want = calloc(n, sizeof *want);
        float *one = malloc(n * sizeof *one);
        for (size_t w = 0; w < P; w++) {
            float *g = s_normal(n, 100 + w, 1.0f + (float)w);
            uint8_t *p = malloc(cap);
            size_t len;
            cr_assert_eq(mq_codec_encode(&c, g, n, p, cap, &len, NULL, NULL), 0);
            cr_assert_eq(mq_codec_decode(&c, p, len, mean, n, 1.0f / P, true, NULL), 0);
            cr_assert_eq(mq_codec_decode(&c, p, len, one, n, 2.0f, false, NULL), 0);
            for (size_t i = 0; i < n; i++)
                want[i] += one[i] / 2 / P;
            free(p);
            free(g);
        }
        for (size_t i = 0; i < n; i++)
            cr_assert_leq(fabsf(mean[i] - want[i]), 1e-5f * (1 + fabsf(want[i])),
                          "%s value %zu: %g vs %g", specs[s], i, mean[i], want[i]);
        free(mean);
        free(want);
        free(one);
    }
}

/* Runs T steps of error feedback on the same gradient G; returns the rms error of the mean
 * of what was sent, and the rms residual at the end in *res_rms. */
static double s_ef_run(const mq_codec_t *c, const float *g, size_t n, int T, double *res_rms)
{
    float *res = calloc(n, sizeof *res), *sent = calloc(n, sizeof *sent);
    size_t cap = mq_codec_payload_size(c, n), len;
    uint8_t *p = malloc(cap);
    for (int t = 0; t < T; t++) {
        cr_assert_eq(mq_codec_encode_ef(c, g, res, n, p, cap, &len, NULL, NULL), 0, "%s",
                     mq_err_last());
        cr_assert_eq(mq_codec_decode(c, p, len, sent, n, 1.0f, true, NULL), 0);
    }
    double err = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        err += ((double)sent[i] / T - g[i]) * ((double)sent[i] / T - g[i]);
        r += (double)res[i] * res[i];
    }
    *res_rms = sqrt(r / n);
    free(res);
    free(sent);
    free(p);
    return sqrt(err / n);
}

Test(quant, error_feedback_keeps_what_quantization_dropped)
{
    const size_t n = 2000;
    float *g = s_normal(n, 31, 1.0f), *res = calloc(n, sizeof *res);
    float *dec = malloc(n * sizeof *dec), *v = malloc(n * sizeof *v);
    mq_codec_t c = mq_codec_uniform(2, 128, false);
    size_t cap = mq_codec_payload_size(&c, n), len;
    uint8_t *p = malloc(cap);

    /* One step: the residual is exactly what the receiver did not get. */
    for (size_t i = 0; i < n; i++)
        res[i] = (float)(i % 7) * 0.01f;
    for (size_t i = 0; i < n; i++)
        v[i] = g[i] + res[i];
    cr_assert_eq(mq_codec_encode_ef(&c, g, res, n, p, cap, &len, NULL, NULL), 0, "%s",
                 mq_err_last());
    cr_assert_eq(mq_codec_decode(&c, p, len, dec, n, 1.0f, false, NULL), 0);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(res[i], v[i] - dec[i], "value %zu", i);

    /* Many steps of the same gradient: sent = T*g - residual, so with a bounded residual the
     * mean of what was sent converges to the gradient, where plain quantization stays off. */
    for (int k = 1; k <= 8; k++) {
        mq_codec_t ck = mq_codec_uniform(k, 128, false);
        s_roundtrip(&ck, g, n, dec, NULL);
        double plain = s_rms_error(g, dec, n), r10, r200;
        s_ef_run(&ck, g, n, 10, &r10);
        double err = s_ef_run(&ck, g, n, 200, &r200);
        cr_assert_lt(err * (k == 1 ? 5 : 50), plain,
                     "%d bits: mean sent error %g with "
                     "feedback, %g without",
                     k, err, plain);
        if (k >= 2) /* 1 bit: the residual creeps up before it levels off */
            cr_assert_lt(r200, 2 * r10 + 1e-6, "%d bits: residual grew from %g to %g", k, r10,
                         r200);
    }
    for (int k = 2; k <= 8; k += 3) {
        mq_codec_t cs = mq_codec_uniform(k, 0, true);
        mq_rng_t rng;
        mq_rng_seed(&rng, 8);
        memset(res, 0, n * sizeof *res);
        uint8_t *ps = malloc(mq_codec_payload_size(&cs, n));
        for (int t = 0; t < 300; t++)
            cr_assert_eq(
                mq_codec_encode_ef(&cs, g, res, n, ps, mq_codec_payload_size(&cs, n), &len, &rng,
                                   NULL),
                0,
                "%d bits "
                "stochastic, step %d: %s",
                k, t, mq_err_last());
        free(ps);
    }
    /* 1-bit stochastic rounding would make the residual diverge (its range can double each
     * step): feedback at 1 bit rounds to nearest instead, so a run that reaches 1 bit goes on. */
    mq_codec_t c1s = mq_codec_uniform(1, 0, true);
    mq_codec_t c1d = mq_codec_uniform(1, 0, false);
    float *res_d = calloc(n, sizeof *res_d);
    uint8_t *pd = malloc(cap);
    size_t len_d;
    mq_rng_t rng;
    mq_rng_seed(&rng, 8);
    memset(res, 0, n * sizeof *res);
    for (int t = 0; t < 300; t++) {
        cr_assert_eq(mq_codec_encode_ef(&c1s, g, res, n, p, cap, &len, &rng, NULL), 0,
                     "step %d: %s", t, mq_err_last());
        cr_assert_eq(mq_codec_encode_ef(&c1d, g, res_d, n, pd, cap, &len_d, NULL, NULL), 0);
        cr_assert_arr_eq(p, pd, len, "step %d: 1-bit feedback should round to nearest", t);
    }
    free(res_d);
    free(pd);

    /* A bad argument leaves the residual as it was; a sum that is not finite resets it. */
    memcpy(v, res, n * sizeof *res);
    cr_assert_eq(mq_codec_encode_ef(&c, g, res, n, p, cap - 1, &len, NULL, NULL), -1);
    cr_assert_arr_eq(res, v, n * sizeof *res);
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += res[i] != 0.0f;
    cr_assert_gt(nonzero, n / 2, "the residual before the failed step should be in use");
    g[1234] = NAN;
    cr_assert_eq(mq_codec_encode_ef(&c, g, res, n, p, cap, &len, NULL, NULL), -1);
    cr_assert(strstr(mq_err_last(), "value 1234"), "%s", mq_err_last());
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(res[i], 0.0f, "value %zu of the residual was not reset", i);
    g[1234] = 0;

    /* With the lossless codec the residual is always zero. */
    mq_codec_t none = mq_codec_none();
    uint8_t *f = malloc(4 * n);
    cr_assert_eq(mq_codec_encode_ef(&none, g, res, n, f, 4 * n, &len, NULL, NULL), 0);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(res[i], 0.0f);
    free(f);
    free(p);
    free(g);
    free(res);
    free(dec);
    free(v);
}

/* ---- statistics ---------------------------------------------------------------------------*/

static double s_sum_sq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

/* Encodes x with stats, decodes with stats (plain and scaled-accumulating), and checks that
 * both give the sum of squares of the decoded values: decode rounds each value to float,
 * hence the relative 1e-6. */
static void s_check_stats(const mq_codec_t *c, const float *x, size_t n, float *y)
{
    char spec[64];
    mq_codec_format(c, spec, sizeof spec);
    size_t cap = mq_codec_payload_size(c, n), len;
    uint8_t *p = malloc(cap + 1);
    mq_rng_t rng;
    mq_rng_seed(&rng, 5);
    mq_codec_stats_t enc = {-1}, dec = {-1}, acc = {-1};
    cr_assert_eq(mq_codec_encode(c, x, n, p, cap, &len, &rng, &enc), 0, "%s", mq_err_last());
    cr_assert_eq(mq_codec_decode(c, p, len, y, n, 1.0f, false, &dec), 0, "%s", mq_err_last());
    double ref = s_sum_sq(y, n);
    cr_assert_leq(fabs(enc.sq - ref), 1e-6 * ref, "%s n=%zu: encode stats %.9g, decoded %.9g",
                  spec, n, enc.sq, ref);
    cr_assert_eq(dec.sq, enc.sq, "%s n=%zu: decode stats %.17g, encode %.17g", spec, n, dec.sq,
                 enc.sq);
    cr_assert_eq(mq_codec_decode(c, p, len, y, n, -0.25f, true, &acc), 0);
    cr_assert_eq(acc.sq, enc.sq, "%s: stats are of the payload, not of scale * x^", spec);
    free(p);
}

ParameterizedTestParameters(quant, stats_are_the_sum_of_squares_of_the_decoded_values)
{
    return cr_make_param_array(int, s_all_bits, sizeof s_all_bits / sizeof s_all_bits[0]);
}

ParameterizedTest(int *bits, quant, stats_are_the_sum_of_squares_of_the_decoded_values)
{
    static const size_t ns[] = {1, 13, 1001, 4099, 20003};
    static const uint32_t buckets[] = {0, 1, 7, 64, 100, 512, 3000};
    const size_t nmax = 20003;
    float *gauss = s_normal(nmax, 61, 0.01f), *odd = s_awkward(nmax, 62);
    float *top = malloc(nmax * sizeof *top), *y = malloc(nmax * sizeof *y);
    for (size_t i = 0; i < nmax; i += 3) /* off-centre buckets: lo and the levels all > 0 */
        gauss[i] = 0.05f + fabsf(gauss[i]);
    for (size_t i = 0; i < nmax; i++) /* nearly every code the largest: the sums' worst case */
        top[i] = i % 1000 == 999 ? -1.0f : 1.0f;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++)
            for (int st = 0; st < 2; st++) {
                mq_codec_t c = mq_codec_uniform(*bits, buckets[b], st);
                s_check_stats(&c, gauss, ns[a], y);
                s_check_stats(&c, odd, ns[a], y); /* zeros, constant runs, a range near 2^128 */
                s_check_stats(&c, top, ns[a], y);
            }
    free(gauss);
    free(odd);
    free(top);
    free(y);
}

/* What the stats are for: one range over a million small values and a few large ones puts
 * the small values on a level far from zero at 2 bits; the decoded norm is then many times
 * the true one, and stats show it without a decode. Buckets confine the damage to the
 * buckets that hold the large values. */
Test(quant, stats_show_a_norm_blown_up_by_quantization)
{
    const size_t n = 1 << 20;
    float *x = s_normal(n, 71, 1e-3f);
    for (size_t i = 0; i < n; i += n / 4)
        x[i] = i % 2 ? -1.0f : 1.0f;
    x[1] = -1.0f;
    uint8_t *p = malloc(4 * n);
    size_t len;
    double truth = s_sum_sq(x, n);
    mq_codec_stats_t one, bucketed;
    mq_codec_t c = mq_codec_uniform(2, 0, false);
    cr_assert_eq(mq_codec_encode(&c, x, n, p, 4 * n, &len, NULL, &one), 0);
    c.param[0] = 512;
    cr_assert_eq(mq_codec_encode(&c, x, n, p, 4 * n, &len, NULL, &bucketed), 0);
    cr_assert_gt(one.sq, 1000 * truth, "one range: %g vs true %g", one.sq, truth);
    cr_assert_lt(bucketed.sq * 100, one.sq, "bucket=512: %g, one range %g", bucketed.sq, one.sq);
    free(x);
    free(p);
}

Test(quant, stats_of_constant_buckets_are_exact)
{
    float x[1000];
    for (int i = 0; i < 1000; i++)
        x[i] = i < 500 ? 0.125f : -3.5e-20f;
    uint8_t p[8 * 2 + 1000];
    float y[1000];
    size_t len;
    for (int k = 1; k <= 8; k++) {
        mq_codec_t c = mq_codec_uniform(k, 500, false);
        mq_codec_stats_t enc, dec;
        cr_assert_eq(mq_codec_encode(&c, x, 1000, p, sizeof p, &len, NULL, &enc), 0);
        double want = 500 * (0.125 * 0.125) + 500 * (3.5e-20 * 3.5e-20);
        cr_assert_leq(fabs(enc.sq - want), 1e-15 * want);
        /* Every code of a constant bucket decodes to its value, whatever a sender put there. */
        memset(p + 16, 0xff, len - 16);
        cr_assert_eq(mq_codec_decode(&c, p, len, y, 1000, 1.0f, false, &dec), 0);
        cr_assert_arr_eq(y, x, sizeof x, "%d bits", k);
        cr_assert_eq(dec.sq, enc.sq, "%d bits: %.17g vs %.17g", k, dec.sq, enc.sq);
    }
}

Test(quant, stats_of_none_are_the_sum_of_squares)
{
    const size_t n = 1003;
    float *x = s_normal(n, 13, 2.0f), *y = malloc(n * sizeof *y);
    uint8_t *p = malloc(4 * n + 1);
    size_t len;
    mq_codec_t c = mq_codec_none();
    mq_codec_stats_t enc, dec;
    cr_assert_eq(mq_codec_encode(&c, x, n, p, 4 * n, &len, NULL, &enc), 0);
    double want = s_sum_sq(x, n);
    cr_assert_leq(fabs(enc.sq - want), 1e-12 * want, "%.17g vs %.17g", enc.sq, want);
    memmove(p + 1, p, len); /* a frame at an odd address */
    cr_assert_eq(mq_codec_decode(&c, p + 1, len, y, n, 3.0f, false, &dec), 0);
    cr_assert_eq(dec.sq, enc.sq);
    free(x);
    free(y);
    free(p);
}

/* Kernel sets this build and CPU can run, at most S_NSETS; "c" (portable) first. */
#define S_NSETS 5
static size_t s_kernel_sets(const char **names);
static unsigned s_code_at(const uint8_t *codes, size_t i, int K);

/* The generic error feedback, spelled out: v = g + r, encode v, then r = v - decode (a decode
 * with scale -1 into v, as mq_codec_encode_ef does for a codec without encode_ef). Returns
 * the encode's rc; on success the payload is in P, its size in *LEN, the new residual in R
 * and the stats in *ST. */
static int s_ef_reference(const mq_codec_t *c, const float *g, float *r, size_t n, uint8_t *p,
                          size_t cap, size_t *len, mq_rng_t *rng, mq_codec_stats_t *st)
{
    mq_codec_t eff = *c; /* 1-bit feedback rounds to nearest */
    if (c->bits == 1)
        eff.param[1] = 0;
    float *v = malloc((n + 1) * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = g[i] + r[i];
    int rc = mq_codec_encode(&eff, v, n, p, cap, len, rng, st);
    if (rc == 0) {
        cr_assert_eq(mq_codec_decode(&eff, p, *len, v, n, -1.0f, true, NULL), 0);
        memcpy(r, v, n * sizeof *r);
    }
    free(v);
    return rc;
}

/* STEPS encodes with error feedback of XS[0], XS[1], ... from the same residual (R_SCALE times
 * a small pattern) and generator seed, the generic path's into P0 and R0 under kernel set
 * REF, the codec's own into P1 and R1 under kernel set KS (in place when INPLACE: each
 * gradient added to R1 first, as a worker's model does, then mq_codec_encode_ef_inplace): rc,
 * residual, payload and stats must be the same bit for bit at every step. WHAT names the case
 * in a failure. */
static void s_ef_steps_match(const mq_codec_t *c, const float *const *xs, int steps, size_t n,
                             float r_scale, uint64_t seed, const char *ref, const char *ks,
                             bool inplace, float *r0, float *r1, uint8_t *p0, uint8_t *p1,
                             const char *what)
{
    size_t cap = mq_codec_payload_size(c, n);
    for (size_t i = 0; i < n; i++)
        r0[i] = r1[i] = (float)((int)(i % 13) - 6) * r_scale;
    mq_rng_t rng0, rng1;
    mq_rng_seed(&rng0, seed);
    mq_rng_seed(&rng1, seed);
    for (int t = 0; t < steps; t++) {
        size_t l0 = 0, l1 = 0;
        mq_codec_stats_t s0 = {-1}, s1 = {-2};
        memset(p0, 0xa5, cap);
        memset(p1, 0x5a, cap);
        cr_assert_eq(mq_quant_use_kernels(ref), 0);
        int rc0 = s_ef_reference(c, xs[t], r0, n, p0, cap, &l0, &rng0, &s0);
        cr_assert_eq(mq_quant_use_kernels(ks), 0);
        int rc1;
        if (inplace) {
            for (size_t i = 0; i < n; i++)
                r1[i] += xs[t][i];
            rc1 = mq_codec_encode_ef_inplace(c, r1, n, p1, cap, &l1, &rng1, &s1);
        } else {
            rc1 = mq_codec_encode_ef(c, xs[t], r1, n, p1, cap, &l1, &rng1, &s1);
        }
        cr_assert_eq(rc1, rc0, "%s step %d: rc %d, generic %d (%s)", what, t, rc1, rc0,
                     mq_err_last());
        cr_assert_arr_eq(r1, r0, n * sizeof *r0, "%s step %d: residual differs", what, t);
        if (rc0 < 0)
            break;
        cr_assert_eq(l1, l0);
        cr_assert_arr_eq(p1, p0, l0, "%s step %d: payload differs", what, t);
        cr_assert(s1.sq == s0.sq, "%s step %d: stats %.17g vs %.17g", what, t, s1.sq, s0.sq);
    }
    mq_quant_use_kernels(NULL);
}

/* uniform's fused encode_ef gives the generic path's payload, residual and stats bit for bit,
 * over a few steps, with every kernel set, from two arrays and in place: one range per tensor
 * and buckets (a multiple of 16, where stochastic noise is drawn inside the quantize kernel,
 * and others; smaller and larger than the walk's chunks, whose last run scans the next
 * bucket's range), both roundings, short and odd lengths. */
Test(quant, fused_error_feedback_matches_the_generic_path, .timeout = 120)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    static const size_t ns[] = {1, 5, 7, 8, 33, 511, 513, 2047, 2049, 5003, 8195};
    static const uint32_t buckets[] = {0, 512, 100, 7, 3000}; /* 3000: across chunks */
    const size_t nmax = 8195;
    float *g = s_awkward(nmax, 41), *g2 = s_normal(nmax, 42, 0.02f);
    float *r0 = malloc(nmax * sizeof *r0), *r1 = malloc(nmax * sizeof *r1);
    uint8_t *p0 = malloc(3 * nmax + 64), *p1 = malloc(3 * nmax + 64);
    const float *xs[] = {g, g2, g};
    for (size_t k = 0; k < nk; k++)
        for (int bits = 1; bits <= 8; bits++)
            for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
                for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++)
                    for (int st = 0; st < 4; st++) {
                        mq_codec_t c = mq_codec_uniform(bits, buckets[b], st & 1);
                        char spec[64], what[128];
                        mq_codec_format(&c, spec, sizeof spec);
                        snprintf(what, sizeof what, "%s %s n=%zu%s", names[k], spec, ns[a],
                                 st & 2 ? " in place" : "");
                        s_ef_steps_match(&c, xs, 3, ns[a], 1e-4f, 5, names[k], names[k], st & 2, r0,
                                         r1, p0, p1, what);
                    }
    free(g);
    free(g2);
    free(r0);
    free(r1);
    free(p0);
    free(p1);
}

/* Each bucket of 64 of the payload P (uniform, BITS bits) gave its largest value of V (a
 * gradient: with a zero residual, also the largest sum) the top code. */
static void s_assert_tops(const uint8_t *p, const float *v, size_t n, int bits, const char *set,
                          const char *what, float scale)
{
    for (size_t b = 0; b < n / 64; b++) {
        size_t at = b * 64;
        for (size_t i = b * 64; i < b * 64 + 64; i++)
            at = v[i] > v[at] ? i : at;
        cr_assert_eq(s_code_at(p + 8 * (n / 64), at, bits), (1u << bits) - 1,
                     "%s uniform:%d scale %g: %s: bucket %zu's largest is not the top", set, bits,
                     (double)scale, what, b);
    }
}

/* Rounding to nearest, the encode and error feedback may skip the clamp to the top code
 * (quantize's and quantize_ef's contracts: every value, or sum, lies in its bucket's range);
 * each bucket reaches its top code at its largest value and must never pass it, at every
 * bit-width and at range scales from near the smallest normal float to near the largest that
 * still takes the float path. Every kernel set gives the portable kernels' payload (encode)
 * and the generic path's payload and residual (error feedback). */
Test(quant, encode_and_error_feedback_reach_the_top_code_and_never_pass_it_at_any_scale)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    static const float scales[] = {1e-36f, 3e-21f, 1e-3f, 1.0f, 7e19f, 1e37f};
    const size_t n = 8192; /* 128 buckets of 64: 128 ranges per scale */
    float *unit = s_normal(n, 71, 1.0f), *g = malloc(n * sizeof *g);
    float *r0 = malloc(n * sizeof *r0), *r1 = malloc(n * sizeof *r1);
    uint8_t *p0 = malloc(n + 8 * n), *p1 = malloc(n + 8 * n), *pc = malloc(n + 8 * n);
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++) {
        for (size_t i = 0; i < n; i++)
            g[i] = unit[i] * scales[si];
        for (int bits = 1; bits <= 8; bits++) {
            mq_codec_t c = mq_codec_uniform(bits, 64, false);
            size_t cap = mq_codec_payload_size(&c, n), lc = 0;
            /* the plain encode: the portable kernels' payload, which every set must give */
            cr_assert_eq(mq_quant_use_kernels("c"), 0);
            cr_assert_eq(mq_codec_encode(&c, g, n, pc, cap, &lc, NULL, NULL), 0, "%s",
                         mq_err_last());
            for (size_t k = 0; k < nk; k++) {
                size_t l0 = 0, l1 = 0;
                cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
                cr_assert_eq(mq_codec_encode(&c, g, n, p1, cap, &l1, NULL, NULL), 0, "%s",
                             mq_err_last());
                cr_assert_eq(l1, lc);
                cr_assert_arr_eq(p1, pc, lc, "%s uniform:%d scale %g: encode differs from c",
                                 names[k], bits, (double)scales[si]);
                s_assert_tops(p1, g, n, bits, names[k], "encode", scales[si]);
                memset(r0, 0, n * sizeof *r0);
                memset(r1, 0, n * sizeof *r1);
                cr_assert_eq(s_ef_reference(&c, g, r0, n, p0, cap, &l0, NULL, NULL), 0);
                cr_assert_eq(mq_codec_encode_ef(&c, g, r1, n, p1, cap, &l1, NULL, NULL), 0, "%s",
                             mq_err_last());
                cr_assert_eq(l1, l0);
                cr_assert_arr_eq(p1, p0, l0, "%s uniform:%d scale %g: payload differs", names[k],
                                 bits, (double)scales[si]);
                cr_assert_arr_eq(r1, r0, n * sizeof *r0, "%s uniform:%d scale %g: residual differs",
                                 names[k], bits, (double)scales[si]);
                s_assert_tops(p1, g, n, bits, names[k], "error feedback", scales[si]);
            }
            mq_quant_use_kernels(NULL);
        }
    }
    free(unit);
    free(g);
    free(r0);
    free(r1);
    free(p0);
    free(p1);
    free(pc);
}

/* A sum that is not finite, wherever it is (in the first bucket, past earlier buckets' stores,
 * in the last value), fails the encode naming it and resets the residual, fused (uniform,
 * every kernel set) or generic (qsgd), from two arrays or in place (kind 3). */
Test(quant, error_feedback_refuses_non_finite_sums_and_resets_the_residual)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    const size_t n = 5003;
    float *g = s_normal(n, 43, 0.01f), *r = malloc(n * sizeof *r);
    uint8_t *p = malloc(n + 8 * n);
    static const char *specs[] = {"uniform:4", "uniform:2:bucket=512", "uniform:8:stochastic",
                                  "uniform:4:stochastic:bucket=512", "qsgd:4:bucket=512"};
    const size_t where[] = {0, 31, 2048, 5002};
    for (size_t k = 0; k < nk; k++)
        for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++)
            for (size_t w = 0; w < sizeof where / sizeof where[0]; w++)
                for (int kind = 0; kind < 4; kind++) {
                    mq_codec_t c;
                    cr_assert_eq(mq_codec_parse(specs[s], &c), 0);
                    cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
                    for (size_t i = 0; i < n; i++)
                        r[i] = (float)i * 1e-7f;
                    float gi = g[where[w]];
                    if (kind == 0)
                        r[where[w]] = NAN;
                    else if (kind == 1)
                        g[where[w]] = -INFINITY;
                    else if (kind == 2) /* both finite, the sum is not */
                        g[where[w]] = 3e38f, r[where[w]] = 3e38f;
                    else
                        r[where[w]] = INFINITY;
                    mq_rng_t rng;
                    mq_rng_seed(&rng, 1);
                    size_t len;
                    int rc =
                        kind == 3
                            ? mq_codec_encode_ef_inplace(&c, r, n, p, n + 8 * n, &len, &rng, NULL)
                            : mq_codec_encode_ef(&c, g, r, n, p, n + 8 * n, &len, &rng, NULL);
                    g[where[w]] = gi;
                    mq_quant_use_kernels(NULL);
                    cr_assert_eq(rc, -1, "%s %s kind %d at %zu accepted", names[k], specs[s], kind,
                                 where[w]);
                    char idx[64];
                    snprintf(idx, sizeof idx, "value %zu of", where[w]);
                    cr_assert(strstr(mq_err_last(), idx), "%s: '%s'", names[k], mq_err_last());
                    for (size_t i = 0; i < n; i++)
                        cr_assert_eq(r[i], 0.0f, "%s %s kind %d at %zu: residual %zu not reset",
                                     names[k], specs[s], kind, where[w], i);
                }
    free(g);
    free(r);
    free(p);
}

/* Error feedback in place gives what it gives from two arrays, payload, residual and stats
 * bit for bit, for every registered codec without a residual of its own (the generic path's
 * codecs among them), at 4 bits or the nearest level each takes, over three steps. */
Test(quant, error_feedback_in_place_matches_two_arrays_for_every_stateless_codec)
{
    const size_t n = 3001;
    float *g = s_normal(n, 23, 0.01f), *r2 = calloc(n, sizeof *r2), *r1 = calloc(n, sizeof *r1);
    size_t ncodecs, tried = 0;
    const mq_codec_ops_t *const *all = mq_codec_all(&ncodecs);
    for (size_t k = 0; k < ncodecs; k++) {
        const mq_codec_ops_t *ops = all[k];
        char spec[MQ_CODEC_MAX_SPEC];
        int bits = 4 < ops->min_bits ? ops->min_bits : 4 > ops->max_bits ? ops->max_bits : 4;
        if (ops->max_bits > 0)
            snprintf(spec, sizeof spec, "%s:%d", ops->name, bits);
        else
            snprintf(spec, sizeof spec, "%s", ops->name);
        mq_codec_t c;
        cr_assert_eq(mq_codec_parse(spec, &c), 0, "%s: %s", spec, mq_err_last());
        if (mq_codec_state_floats(&c, n) > 0 || c.id == MQ_CODEC_ID_none)
            continue;
        tried++;
        size_t cap = mq_codec_payload_size(&c, n), l1 = 0, l2 = 0;
        uint8_t *p1 = malloc(cap), *p2 = malloc(cap);
        memset(r1, 0, n * sizeof *r1);
        memset(r2, 0, n * sizeof *r2);
        mq_rng_t rng1, rng2;
        mq_rng_seed(&rng1, 4);
        mq_rng_seed(&rng2, 4);
        for (int t = 0; t < 3; t++) {
            mq_codec_stats_t s1 = {-1}, s2 = {-2};
            cr_assert_eq(mq_codec_encode_ef(&c, g, r2, n, p2, cap, &l2, &rng2, &s2), 0, "%s: %s",
                         spec, mq_err_last());
            for (size_t i = 0; i < n; i++)
                r1[i] += g[i];
            cr_assert_eq(mq_codec_encode_ef_inplace(&c, r1, n, p1, cap, &l1, &rng1, &s1), 0,
                         "%s: %s", spec, mq_err_last());
            cr_assert_eq(l1, l2, "%s step %d", spec, t);
            cr_assert_arr_eq(p1, p2, l1, "%s step %d: payload differs", spec, t);
            cr_assert_arr_eq(r1, r2, n * sizeof *r1, "%s step %d: residual differs", spec, t);
            cr_assert(s1.sq == s2.sq, "%s step %d: stats differ", spec, t);
        }
        free(p1);
        free(p2);
    }
    cr_assert_geq(tried, 3, "only %zu stateless codecs", tried);
    free(g);
    free(r1);
    free(r2);
}

Test(quant, stats_of_error_feedback_are_those_of_the_payload_sent)
{
    const size_t n = 3001;
    float *g = s_normal(n, 17, 0.01f), *res = calloc(n, sizeof *res), *y = malloc(n * sizeof *y);
    mq_codec_t c = mq_codec_uniform(2, 100, false);
    size_t cap = mq_codec_payload_size(&c, n), len;
    uint8_t *p = malloc(cap);
    for (int t = 0; t < 5; t++) {
        mq_codec_stats_t st = {-1};
        cr_assert_eq(mq_codec_encode_ef(&c, g, res, n, p, cap, &len, NULL, &st), 0);
        cr_assert_eq(mq_codec_decode(&c, p, len, y, n, 1.0f, false, NULL), 0);
        double want = s_sum_sq(y, n);
        cr_assert_leq(fabs(st.sq - want), 1e-6 * want, "step %d: %g vs %g", t, st.sq, want);
    }
    free(g);
    free(res);
    free(y);
    free(p);
}

Test(quant, stats_are_untouched_on_error_and_zero_when_empty)
{
    float x[] = {1.0f, NAN, 2.0f};
    uint8_t p[64];
    float y[3];
    size_t len;
    mq_codec_t c = mq_codec_uniform(4, 0, false);
    mq_codec_stats_t st = {42.0};
    cr_assert_eq(mq_codec_encode(&c, x, 3, p, sizeof p, &len, NULL, &st), -1);
    cr_assert_eq(st.sq, 42.0);
    x[1] = 0.5f;
    cr_assert_eq(mq_codec_encode(&c, x, 3, p, sizeof p, &len, NULL, NULL), 0);
    p[0] = 0xff; /* min becomes NaN */
    p[1] = 0xff;
    p[2] = 0xff;
    p[3] = 0xff;
    cr_assert_eq(mq_codec_decode(&c, p, len, y, 3, 1.0f, false, &st), -1);
    cr_assert_eq(st.sq, 42.0);
    cr_assert_eq(mq_codec_encode(&c, NULL, 0, NULL, 0, &len, NULL, &st), 0);
    cr_assert_eq(st.sq, 0.0);
    st.sq = 42.0;
    cr_assert_eq(mq_codec_decode(&c, NULL, 0, NULL, 0, 1.0f, false, &st), 0);
    cr_assert_eq(st.sq, 0.0);
}

/* ---- one payload whatever the CPU -----------------------------------------------------------*/

/* Kernel sets this build and CPU can run; "c" (portable) first, the reference. */
static size_t s_kernel_sets(const char **names)
{
    static const char *all[S_NSETS] = {"c", "sse2", "avx2", "avx512", "avx512w"};
    size_t k = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (mq_quant_use_kernels(all[i]) == 0)
            names[k++] = all[i];
    mq_quant_use_kernels(NULL);
    return k;
}

/* Encodes and decodes (plain, with scale, accumulating) with kernel set NAME; the stats of
 * the encode go to sq[0], of the plain decode to sq[1]. */
static void s_codec_run(const char *name, const mq_codec_t *c, const float *x, size_t n,
                        uint8_t *payload, float *plain, float *sum, double sq[2])
{
    cr_assert_eq(mq_quant_use_kernels(name), 0, "%s", mq_err_last());
    size_t cap = mq_codec_payload_size(c, n), len;
    mq_rng_t rng;
    mq_rng_seed(&rng, 77);
    mq_codec_stats_t enc, dec;
    cr_assert_eq(mq_codec_encode(c, x, n, payload, cap, &len, &rng, &enc), 0, "%s",
                 mq_err_last());
    cr_assert_eq(mq_codec_decode(c, payload, len, plain, n, 0.3f, false, &dec), 0, "%s",
                 mq_err_last());
    for (size_t i = 0; i < n; i++)
        sum[i] = (float)i * 1e-3f;
    cr_assert_eq(mq_codec_decode(c, payload, len, sum, n, -0.7f, true, NULL), 0, "%s",
                 mq_err_last());
    mq_quant_use_kernels(NULL);
    sq[0] = enc.sq;
    sq[1] = dec.sq;
}

Test(quant, every_kernel_set_writes_and_decodes_the_same_bits)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    static const size_t ns[] = {1, 31, 33, 100, 2047, 5003, 20011};
    static const uint32_t buckets[] = {0, 1, 7, 64, 100, 512, 3000};
    const size_t nmax = 20011;
    float *x = s_awkward(nmax, 23);
    uint8_t *p0 = malloc(nmax + 8 * nmax), *p1 = malloc(nmax + 8 * nmax);
    float *d0 = malloc(nmax * sizeof *d0), *d1 = malloc(nmax * sizeof *d1);
    float *s0 = malloc(nmax * sizeof *s0), *s1 = malloc(nmax * sizeof *s1);
    for (int bits = 1; bits <= 8; bits++)
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++)
                for (int st = 0; st < 2; st++) {
                    mq_codec_t c = mq_codec_uniform(bits, buckets[b], st);
                    size_t n = ns[a], cap = mq_codec_payload_size(&c, n);
                    double q0[2], q1[2];
                    s_codec_run(names[0], &c, x, n, p0, d0, s0, q0);
                    for (size_t k = 1; k < nk; k++) {
                        s_codec_run(names[k], &c, x, n, p1, d1, s1, q1);
                        char spec[64];
                        mq_codec_format(&c, spec, sizeof spec);
                        cr_assert_arr_eq(p0, p1, cap, "%s n=%zu: %s payload differs from c", spec,
                                         n, names[k]);
                        cr_assert_arr_eq(d0, d1, n * sizeof *d0, "%s n=%zu: %s decode differs",
                                         spec, n, names[k]);
                        cr_assert_arr_eq(s0, s1, n * sizeof *s0, "%s n=%zu: %s accumulate differs",
                                         spec, n, names[k]);
                        cr_assert(q0[0] == q1[0] && q0[1] == q1[1],
                                  "%s n=%zu: %s stats %.17g %.17g, c %.17g %.17g", spec, n,
                                  names[k], q1[0], q1[1], q0[0], q0[1]);
                    }
                }
    free(x);
    free(p0);
    free(p1);
    free(d0);
    free(d1);
    free(s0);
    free(s1);
}

/* A long tensor's range scan (one range per tensor) may walk parts of it side by side: an
 * extreme or a NaN is found wherever it lies, at the first, middle or last value of each
 * quarter, in the steps of the rest after them and in the last few values, with every
 * kernel set. */
Test(quant, a_long_tensors_range_is_found_wherever_its_extremes_lie, .timeout = 120)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    /* quarters of n / 4 rounded down to whole steps of 32 (kernels_x86.h): 65536 each, then
     * a rest of 101 values */
    const size_t n = 4 * 65536 + 101, q = 65536;
    float *x = s_normal(n, 31, 0.01f);
    size_t where[16], nw = 0;
    for (size_t k = 0; k < 4; k++) {
        where[nw++] = k * q;
        where[nw++] = k * q + q / 2 + 7;
        where[nw++] = k * q + q - 1;
    }
    where[nw++] = 4 * q;      /* the rest: a step of 32 */
    where[nw++] = 4 * q + 97; /* the rest's rest */
    where[nw++] = n - 1;
    mq_codec_t c = mq_codec_uniform(8, 0, false);
    const size_t cap = mq_codec_payload_size(&c, n);
    uint8_t *p = malloc(cap);
    for (size_t k = 0; k < nk; k++) {
        cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
        for (size_t w = 0; w < nw; w++) {
            const float keep = x[where[w]];
            const float probe[] = {5.0f, -5.0f, NAN};
            for (int v = 0; v < 3; v++) {
                x[where[w]] = probe[v];
                size_t len = 0;
                int rc = mq_codec_encode(&c, x, n, p, cap, &len, NULL, NULL);
                if (v == 2) {
                    char idx[32];
                    snprintf(idx, sizeof idx, "value %zu ", where[w]);
                    cr_assert(rc == -1 && strstr(mq_err_last(), idx),
                              "%s: a NaN at %zu: rc %d, '%s'", names[k], where[w], rc,
                              mq_err_last());
                } else {
                    cr_assert_eq(rc, 0, "%s", mq_err_last());
                    float lo = mq_get_f32(p), hi = mq_get_f32(p + 4);
                    cr_assert(v == 0 ? hi == 5.0f && lo > -1.0f : lo == -5.0f && hi < 1.0f,
                              "%s: %g at %zu gave the range [%g, %g]", names[k], probe[v], where[w],
                              lo, hi);
                }
            }
            x[where[w]] = keep;
        }
    }
    mq_quant_use_kernels(NULL);
    free(p);
    free(x);
}

/* Codes q[0..n) of K bits packed least significant bit first, one bit at a time. */
static void s_pack_reference(const uint8_t *q, size_t n, int K, uint8_t *dst)
{
    memset(dst, 0, (n * (size_t)K + 7) / 8);
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < K; b++)
            if ((q[i] >> b) & 1u) {
                size_t bit = i * (size_t)K + (size_t)b;
                dst[bit / 8] |= (uint8_t)(1u << (bit % 8));
            }
}

/* Code I of the payload's code stream (bits [I*K, I*K+K), least significant bit first). */
static unsigned s_code_at(const uint8_t *codes, size_t i, int K)
{
    unsigned v = 0;
    for (int b = 0; b < K; b++) {
        size_t bit = i * (size_t)K + (size_t)b;
        v |= (unsigned)((codes[bit / 8] >> (bit % 8)) & 1u) << b;
    }
    return v;
}

/* Tensors of several chunks, where the kernels pack the codes as they quantize: the payload
 * is the documented layout, each code worked out here one value at a time from the bucket's
 * range (q = trunc(min((x - lo) * inv + 0.5, levels)), inv = levels / (hi - lo)) and read
 * back bit by bit, for every kernel set; so the kernels that pack as they go agree with the
 * format, not only with each other. Lengths end on a short last chunk, and on one too short
 * for the chunk before it to be packed in the kernels (they may write 8 bytes past). */
Test(quant, codes_packed_while_quantizing_are_the_documented_stream, .timeout = 120)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    static const size_t ns[] = {4097, 6144, 8195, 8232};
    static const uint32_t buckets[] = {0, 64, 96, 512, 100};
    const size_t nmax = 8232;
    float *x = s_normal(nmax, 61, 0.01f);
    for (size_t i = 0; i < nmax; i += 211)
        x[i] = 0.0f;
    for (size_t i = 640; i < 704; i++) /* a constant bucket at 64 */
        x[i] = 0.5f;
    uint8_t *p = malloc(nmax + 8 * nmax);
    for (size_t k = 0; k < nk; k++)
        for (int K = 1; K <= 7; K++)
            for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
                for (size_t bi = 0; bi < sizeof buckets / sizeof buckets[0]; bi++) {
                    const size_t n = ns[a];
                    mq_codec_t c = mq_codec_uniform(K, buckets[bi], false);
                    const size_t cap = mq_codec_payload_size(&c, n), len = cap;
                    const size_t B = buckets[bi] ? buckets[bi] : n, nb = (n + B - 1) / B;
                    size_t out = 0;
                    cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
                    memset(p, 0xa5, cap);
                    cr_assert_eq(mq_codec_encode(&c, x, n, p, cap, &out, NULL, NULL), 0);
                    mq_quant_use_kernels(NULL);
                    cr_assert_eq(out, len);
                    const unsigned levels = (1u << K) - 1;
                    for (size_t b = 0; b < nb; b++) {
                        size_t b0 = b * B, b1 = b0 + B < n ? b0 + B : n;
                        float lo = x[b0], hi = x[b0];
                        for (size_t i = b0; i < b1; i++) {
                            lo = x[i] < lo ? x[i] : lo;
                            hi = x[i] > hi ? x[i] : hi;
                        }
                        lo += 0.0f;
                        hi += 0.0f;
                        float hlo, hhi;
                        memcpy(&hlo, p + 8 * b, 4);
                        memcpy(&hhi, p + 8 * b + 4, 4);
                        cr_assert(hlo == lo && hhi == hi, "%s K=%d n=%zu B=%zu: bucket %zu range",
                                  names[k], K, n, B, b);
                        const float inv = (float)(levels / ((double)hi - (double)lo));
                        for (size_t i = b0; i < b1; i++) {
                            unsigned want = 0;
                            if (hi != lo) {
                                float y = (x[i] - lo) * inv + 0.5f;
                                want = (unsigned)(int)(y < (float)levels ? y : (float)levels);
                            }
                            unsigned got = s_code_at(p + 8 * nb, i, K);
                            cr_assert_eq(got, want, "%s K=%d n=%zu B=%zu: code %zu is %u, not %u",
                                         names[k], K, n, B, i, got, want);
                        }
                    }
                }
    free(x);
    free(p);
}

/* The kernels' PK (codes packed as they go): the bytes codes are the same with it as without,
 * and PK holds what pack() makes of them, for the plain, stochastic and error-feedback
 * kernels of every set, at each K below 8. */
Test(quant, kernels_pack_as_they_go_as_pack_does)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    static const size_t ns[] = {32, 96, 512, 2048};
    const size_t nmax = 2048;
    float *x = s_normal(nmax, 62, 0.01f), *g = s_normal(nmax, 63, 0.01f);
    float *r0 = malloc(nmax * sizeof *r0), *r1 = malloc(nmax * sizeof *r1);
    uint8_t q0[2048], q1[2048], want[2048 + 8], pk[2048 + 8];
    for (size_t k = 0; k < nk; k++) {
        cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
        const mq_quant_kernels_t *kn = mq_quant_kernels();
        for (int K = 1; K <= 7; K++)
            for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
                for (int op = 0; op < 4; op++) {
                    const size_t n = ns[a], bytes = n / 8 * (size_t)K;
                    const unsigned levels = (1u << K) - 1;
                    const float lo = -0.05f, top = (float)levels, inv = top / 0.1f;
                    const mq_quant_deq_t d = {-lo, -0.1f / top, 0.05f, levels};
                    mq_quant_noise_t gen0, gen1;
                    mq_rng_t rng;
                    mq_rng_seed(&rng, 9);
                    mq_quant_noise_seed(&gen0, &rng);
                    gen1 = gen0;
                    for (size_t i = 0; i < n; i++)
                        r0[i] = r1[i] = (float)((int)(i % 7) - 3) * 1e-3f;
                    memset(pk, 0x5a, sizeof pk);
                    float nlo, nhi;
                    switch (op) {
                    case 0:
                        kn->quantize(x, n, lo, inv, top, NULL, q0, NULL);
                        kn->quantize(x, n, lo, inv, top, NULL, q1, pk);
                        break;
                    case 1:
                        kn->quantize_noise(x, n, lo, inv, top, &gen0, q0, NULL);
                        kn->quantize_noise(x, n, lo, inv, top, &gen1, q1, pk);
                        break;
                    case 2:
                        kn->quantize_ef(g, r0, n, lo, inv, top, &d, NULL, q0, NULL);
                        kn->quantize_ef(g, r1, n, lo, inv, top, &d, NULL, q1, pk);
                        break;
                    default:
                        kn->quantize_ef_scan(g, r0, n, lo, inv, top, &d, &gen0, q0, NULL, x, x, n,
                                             &nlo, &nhi);
                        kn->quantize_ef_scan(g, r1, n, lo, inv, top, &d, &gen1, q1, pk, x, x, n,
                                             &nlo, &nhi);
                        break;
                    }
                    cr_assert_arr_eq(q1, q0, n, "%s K=%d n=%zu op %d: codes differ with PK",
                                     names[k], K, n, op);
                    cr_assert_arr_eq(r1, r0, n * sizeof *r0, "%s K=%d n=%zu op %d: residual",
                                     names[k], K, n, op);
                    s_pack_reference(q0, n, K, want);
                    cr_assert_arr_eq(pk, want, bytes, "%s K=%d n=%zu op %d: PK is not pack's",
                                     names[k], K, n, op);
                    for (size_t i = bytes + 8; i < sizeof pk; i++)
                        cr_assert_eq(pk[i], 0x5a, "%s K=%d n=%zu op %d: PK written past +8",
                                     names[k], K, n, op);
                }
        mq_quant_use_kernels(NULL);
    }
    free(x);
    free(g);
    free(r0);
    free(r1);
}

/* Decodes of 16 MB and more use streaming stores; the output must be the same at any
 * alignment of dst, and the same as the portable code's. */
Test(quant, large_decodes_match_at_every_alignment, .timeout = 60)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    const size_t n = (16u << 20) / sizeof(float) + 1001;
    float *x = s_normal(n, 29, 1.0f);
    float *ref = malloc(n * sizeof *ref), *out = malloc((n + 16) * sizeof *out);
    static const char *specs[] = {"uniform:3", "uniform:8:bucket=100", "uniform:4:bucket=1000"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        mq_codec_t c;
        cr_assert_eq(mq_codec_parse(specs[s], &c), 0);
        size_t cap = mq_codec_payload_size(&c, n), len;
        uint8_t *p = malloc(cap);
        cr_assert_eq(mq_codec_encode(&c, x, n, p, cap, &len, NULL, NULL), 0);
        cr_assert_eq(mq_quant_use_kernels("c"), 0);
        cr_assert_eq(mq_codec_decode(&c, p, len, ref, n, 1.0f, false, NULL), 0);
        for (size_t k = 0; k < nk; k++)
            for (size_t off = 0; off < 16; off += 5) {
                cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
                cr_assert_eq(mq_codec_decode(&c, p, len, out + off, n, 1.0f, false, NULL), 0);
                cr_assert_arr_eq(out + off, ref, n * sizeof *ref, "%s %s dst+%zu", specs[s],
                                 names[k], off);
            }
        mq_quant_use_kernels(NULL);
        free(p);
    }
    free(x);
    free(ref);
    free(out);
}

/* Error feedback on 16 MB and more streams its 8-bit codes to the payload when it rounds to
 * nearest (stochastic rounding and 4 bits store theirs as they come, beside it): payload,
 * residual and stats must be the generic path's at any alignment of the payload, with every
 * kernel set, for bucket sizes that put the codes on and off a cache line's start, over two
 * steps; and a sum that is not finite near the end fails the encode as on a small tensor. */
Test(quant, large_error_feedback_matches_the_generic_path_at_every_alignment, .timeout = 120)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    const size_t n = (16u << 20) / sizeof(float) + 1001;
    float *g = s_normal(n, 31, 0.05f), *r0 = malloc(n * sizeof *r0), *r1 = malloc(n * sizeof *r1);
    static const char *specs[] = {"uniform:8:bucket=512", "uniform:8:bucket=100",
                                  "uniform:8:bucket=512:stochastic", "uniform:4:bucket=512"};
    const float *xs[] = {g, g};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        mq_codec_t c;
        cr_assert_eq(mq_codec_parse(specs[s], &c), 0);
        size_t cap = mq_codec_payload_size(&c, n);
        uint8_t *p0 = malloc(cap), *buf = malloc(cap + 64);
        for (size_t k = 0; k < nk; k++)
            for (size_t off = 0; off < 64; off += 37) {
                char what[128];
                snprintf(what, sizeof what, "%s %s payload+%zu%s", specs[s], names[k], off,
                         off & 1 ? " in place" : "");
                s_ef_steps_match(&c, xs, 2, n, 1e-3f, 9, "c", names[k], off & 1, r0, r1, p0,
                                 buf + off, what);
            }
        /* a sum that is not finite near the end, after most codes are streamed, still fails
         * the encode, naming the value, and resets the residual */
        const size_t bad = n - 5;
        for (size_t k = 0; k < nk; k++) {
            for (size_t i = 0; i < n; i++)
                r1[i] = 1e-3f;
            r1[bad] = INFINITY;
            mq_rng_t rng;
            mq_rng_seed(&rng, 9);
            size_t len;
            cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
            cr_assert_eq(mq_codec_encode_ef(&c, g, r1, n, buf, cap, &len, &rng, NULL), -1,
                         "%s %s: a sum of infinity accepted", specs[s], names[k]);
            mq_quant_use_kernels(NULL);
            char idx[64];
            snprintf(idx, sizeof idx, "value %zu of", bad);
            cr_assert(strstr(mq_err_last(), idx), "%s %s: '%s'", specs[s], names[k], mq_err_last());
            for (size_t i = 0; i < n; i++)
                cr_assert_eq(r1[i], 0.0f, "%s %s: residual %zu not reset", specs[s], names[k], i);
        }
        free(p0);
        free(buf);
    }
    free(g);
    free(r0);
    free(r1);
}

Test(quant, every_kernel_set_refuses_nan_and_infinity)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    const size_t n = 3001;
    float *x = s_normal(n, 31, 1.0f);
    uint8_t *buf = malloc(2 * n + 8 * n);
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const size_t where[] = {0, 7, 8, 33, 1500, 2999, 3000};
    static const char *specs[] = {"uniform:4", "uniform:8:bucket=64", "uniform:2:bucket=1000"};
    for (size_t k = 0; k < nk; k++)
        for (size_t s = 0; s < 3; s++)
            for (size_t b = 0; b < 3; b++)
                for (size_t w = 0; w < sizeof where / sizeof where[0]; w++) {
                    mq_codec_t c;
                    cr_assert_eq(mq_codec_parse(specs[s], &c), 0);
                    cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
                    float keep = x[where[w]];
                    x[where[w]] = bad[b];
                    size_t len;
                    int rc = mq_codec_encode(&c, x, n, buf, 2 * n + 8 * n, &len, NULL, NULL);
                    x[where[w]] = keep;
                    mq_quant_use_kernels(NULL);
                    cr_assert_eq(rc, -1, "%s %s accepted %g at %zu", names[k], specs[s], bad[b],
                                 where[w]);
                    char idx[32];
                    snprintf(idx, sizeof idx, "value %zu ", where[w]);
                    cr_assert(strstr(mq_err_last(), idx), "%s: '%s'", names[k], mq_err_last());
                }
    free(buf);
    free(x);
}

/* Stochastic rounding at 8 bits can take a bucket's largest value past the top code: with a
 * range whose (hi - lo) * inv rounds to 255 + 2^-16, the largest noise (1 - 2^-16) makes y
 * exactly 256, which a byte would wrap to code 0. Every kernel that draws or takes noise must
 * clamp it to 255: here with a generator whose first step gives the largest noise in all
 * lanes (its state solved from the output function, r = rotl(s1 * 5, 7) * 9), and a noise
 * array of it. */
Test(quant, the_largest_noise_never_takes_a_code_past_the_top)
{
    const char *names[S_NSETS];
    size_t nk = s_kernel_sets(names);
    enum { N = 64 };
    const float lo = 0.0f, top = 255.0f;
    float hi = 1.0f, inv = 255.0f;
    while (hi * inv <= top) { /* a range with hi * inv just above 255 after rounding */
        hi = nextafterf(hi, 2.0f);
        inv = (float)(255.0 / (double)hi);
    }
    cr_assert(hi < 1.01f && hi * inv + (1.0f - 0x1.0p-16f) >= 256.0f, "no such range found");
    /* s1 with rotl(s1 * 5, 7) * 9 = 0xffffffff: the inverses of 9 and 5 modulo 2^32 */
    uint32_t x9 = 0xffffffffu * 0x38e38e39u, s1 = ((x9 >> 7) | (x9 << 25)) * 0xcccccccdu;
    cr_assert_eq(((s1 * 5) << 7 | (s1 * 5) >> 25) * 9u, 0xffffffffu);
    const mq_quant_deq_t d = {-lo, -(hi - lo) / top, -hi, 255};
    float x[N], g[N], r[N], u[N];
    uint8_t q[N];
    for (size_t i = 0; i < N; i++) {
        x[i] = g[i] = hi;
        u[i] = 1.0f - 0x1.0p-16f;
    }
    for (size_t k = 0; k < nk; k++) {
        cr_assert_eq(mq_quant_use_kernels(names[k]), 0);
        const mq_quant_kernels_t *kn = mq_quant_kernels();
        for (int op = 0; op < 4; op++) {
            mq_quant_noise_t gen;
            for (int lane = 0; lane < 8; lane++) {
                gen.s[0][lane] = gen.s[2][lane] = gen.s[3][lane] = 1u + (uint32_t)lane;
                gen.s[1][lane] = s1;
            }
            memset(r, 0, sizeof r);
            memset(q, 0x11, sizeof q);
            float nlo, nhi;
            switch (op) {
            case 0:
                kn->quantize(x, N, lo, inv, top, u, q, NULL);
                break;
            case 1:
                kn->quantize_noise(x, N, lo, inv, top, &gen, q, NULL);
                break;
            case 2:
                kn->quantize_ef(g, r, N, lo, inv, top, &d, &gen, q, NULL);
                break;
            default:
                kn->quantize_ef_scan(g, r, N, lo, inv, top, &d, &gen, q, NULL, x, x, N, &nlo, &nhi);
                break;
            }
            for (size_t i = 0; i < N; i++)
                cr_assert_eq(q[i], 255, "%s op %d: value %zu (the top) got code %u", names[k], op,
                             i, q[i]);
            if (op >= 2)
                for (size_t i = 0; i < N; i++)
                    cr_assert_eq(r[i], 0.0f, "%s op %d: residual %zu is %g, not 0", names[k], op, i,
                                 (double)r[i]);
        }
        mq_quant_use_kernels(NULL);
    }
}
