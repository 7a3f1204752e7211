/* Tests of the two unbiased stochastic codecs, qsgd (QSGD's norm-scaled levels) and terngrad
 * (TernGrad's scaled ternary): the error against the papers' variance bounds, unbiasedness
 * over many seeds, exact payload sizes and layouts, specs, refusal of bad specs and bad
 * payloads without touching the output, accumulation, and the decoded sum of squares. */

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/quant.h"
#include "gauss.h"
/* For mq_quant_use_kernels: payloads must not depend on the instruction set. */
#include "../common/src/quant/quant_internal.h"

static int s_qsgd_bits[] = {2, 3, 4, 5, 6, 7, 8};

static float *s_normal(size_t n, uint64_t seed, float sigma)
{
    return test_gaussian(n, seed, sigma, 0.0f);
}

static mq_codec_t s_parse(const char *spec)
{
    mq_codec_t c;
    cr_assert_eq(mq_codec_parse(spec, &c), 0, "%s: %s", spec, mq_err_last());
    return c;
}

/* Encodes x with C and generator seed SEED into a fresh buffer (*len bytes). */
static uint8_t *s_encode(const mq_codec_t *c, const float *x, size_t n, uint64_t seed,
                         size_t *len, mq_codec_stats_t *st)
{
    size_t cap = mq_codec_payload_size(c, n);
    uint8_t *buf = malloc(cap + 8);
    cr_assert(buf);
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    cr_assert_eq(mq_codec_encode(c, x, n, buf, cap, len, &rng, st), 0, "%s", mq_err_last());
    return buf;
}

/* decode(encode(x)) into out with seed SEED; returns the payload size. */
static size_t s_roundtrip(const mq_codec_t *c, const float *x, size_t n, uint64_t seed, float *out)
{
    size_t len;
    uint8_t *buf = s_encode(c, x, n, seed, &len, NULL);
    cr_assert_eq(mq_codec_decode(c, buf, len, out, n, 1.0f, false, NULL), 0, "%s", mq_err_last());
    free(buf);
    return len;
}

static double s_sq_dist(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return s;
}

static double s_sum_sq(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

static size_t s_nbuckets(size_t n, size_t bucket)
{
    return bucket ? (n + bucket - 1) / bucket : 1;
}

/* Spec parses, formats to CANON, and CANON parses back to an equal codec. */
static void s_spec_roundtrip(const char *spec, const char *canon)
{
    mq_codec_t c = s_parse(spec), back;
    char buf[MQ_CODEC_MAX_SPEC];
    mq_codec_format(&c, buf, sizeof buf);
    cr_assert_str_eq(buf, canon, "%s formats as %s", spec, buf);
    cr_assert_eq(mq_codec_parse(buf, &back), 0, "%s: %s", buf, mq_err_last());
    cr_assert(mq_codec_equal(&c, &back), "%s does not parse back to itself", buf);
}

/* SPEC is refused, with an error that mentions WHY, and OUT is left as it was. */
static void s_spec_refused(const char *spec, const char *why)
{
    mq_codec_t out = {.id = 77, .bits = 5}, before = out;
    cr_assert_eq(mq_codec_parse(spec, &out), -1, "'%s' was accepted", spec);
    cr_assert(strstr(mq_err_last(), why), "'%s': error '%s' does not mention '%s'", spec,
              mq_err_last(), why);
    cr_assert(mq_codec_equal(&out, &before), "'%s' changed the output", spec);
}

/* A refused payload leaves dst exactly as it was and names WHY. */
static void s_payload_refused(const mq_codec_t *c, const uint8_t *buf, size_t len, size_t n,
                              const char *why)
{
    float *dst = malloc((n + 1) * sizeof *dst);
    cr_assert(dst);
    for (size_t i = 0; i < n; i++)
        dst[i] = 7.0f + (float)i;
    cr_assert_eq(mq_codec_decode(c, buf, len, dst, n, 1.0f, true, NULL), -1,
                 "a bad payload (%s) was accepted", why);
    cr_assert(strstr(mq_err_last(), why), "error '%s' does not mention '%s'", mq_err_last(), why);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(dst[i], 7.0f + (float)i, "dst[%zu] changed on a refused payload", i);
    free(dst);
}

/* Decode-and-accumulate with SCALE gives dst0 + SCALE * (the plain decode), and the stats of
 * both decodes are the encoder's, whatever the scale. */
static void s_check_accumulate(const mq_codec_t *c, size_t n, float scale)
{
    float *x = s_normal(n, 5, 0.01f), *y0 = s_normal(n, 6, 1.0f), *plain = malloc(n * 4),
          *acc = malloc(n * 4);
    cr_assert(plain && acc);
    size_t len;
    mq_codec_stats_t se, sp, sa;
    uint8_t *buf = s_encode(c, x, n, 9, &len, &se);
    cr_assert_eq(mq_codec_decode(c, buf, len, plain, n, 1.0f, false, &sp), 0);
    memcpy(acc, y0, n * 4);
    cr_assert_eq(mq_codec_decode(c, buf, len, acc, n, scale, true, &sa), 0);
    for (size_t i = 0; i < n; i++) {
        float want = y0[i] + scale * plain[i];
        cr_assert(fabsf(acc[i] - want) <= 1e-6f * (fabsf(y0[i]) + fabsf(scale * plain[i])),
                  "value %zu: %g + %g * %g gave %g", i, (double)y0[i], (double)scale,
                  (double)plain[i], (double)acc[i]);
    }
    cr_assert_eq(sp.sq, se.sq, "decode's sum of squares %.17g differs from encode's %.17g",
                 sp.sq, se.sq);
    cr_assert_eq(sa.sq, se.sq, "the decode scale changed the sum of squares");
    free(x), free(y0), free(plain), free(acc), free(buf);
}

/* stats.sq is the sum of the squares of the decoded values (to float rounding). */
static void s_check_stats(const mq_codec_t *c, const float *x, size_t n)
{
    float *out = malloc(n * sizeof *out);
    cr_assert(out);
    size_t len;
    mq_codec_stats_t se, sd;
    uint8_t *buf = s_encode(c, x, n, 3, &len, &se);
    cr_assert_eq(mq_codec_decode(c, buf, len, out, n, 2.5f, false, &sd), 0);
    double want = s_sum_sq(out, n) / (2.5 * 2.5);
    cr_assert(fabs(se.sq - want) <= 1e-6 * want, "stats.sq %.9g, decoded values give %.9g",
              se.sq, want);
    cr_assert_eq(sd.sq, se.sq);
    free(out), free(buf);
}

/* An encode of x[0..n) with C is refused with a message containing WHY. */
static void s_encode_refused(const mq_codec_t *c, const float *x, size_t n, const char *why)
{
    size_t cap = mq_codec_payload_size(c, n), len;
    uint8_t *buf = malloc(cap);
    mq_rng_t rng;
    mq_rng_seed(&rng, 1);
    cr_assert(buf);
    cr_assert_eq(mq_codec_encode(c, x, n, buf, cap, &len, &rng, NULL), -1, "%s: accepted", why);
    cr_assert(strstr(mq_err_last(), why), "%s", mq_err_last());
    free(buf);
}

/* Encodes X, 64 values set here, with SPEC (buckets of 32): a zero bucket, then one of
 * denormals (norm ~1e-44); decodes them into OUT and checks that the zero bucket decodes to
 * +0 and the stats are finite. Returns the payload. */
static uint8_t *s_zero_and_denormal(const char *spec, float *x, float *out)
{
    mq_codec_t c = s_parse(spec);
    for (size_t i = 0; i < 64; i++)
        x[i] = i < 32 ? 0.0f : (i % 2 ? 1 : -1) * 1e-45f * (float)(i - 31);
    mq_codec_stats_t st;
    size_t len;
    uint8_t *buf = s_encode(&c, x, 64, 1, &len, &st);
    cr_assert_eq(mq_codec_decode(&c, buf, len, out, 64, 1.0f, false, NULL), 0);
    for (size_t i = 0; i < 32; i++)
        cr_assert(out[i] == 0.0f && !signbit(out[i]), "%s: zero bucket value %zu: %g", spec, i,
                  (double)out[i]);
    cr_assert(isfinite(st.sq));
    return buf;
}

/* C's payload for n values (of X) is exactly WANT bytes: the size it declares, what an
 * encode writes, and the only length it validates. */
static void s_check_exact_size(const mq_codec_t *c, const float *x, size_t n, size_t want)
{
    size_t len;
    cr_assert_eq(mq_codec_payload_size(c, n), want, "K=%d n=%zu bucket=%u", c->bits, n,
                 c->param[0]);
    uint8_t *buf = s_encode(c, x, n, 1, &len, NULL);
    cr_assert_eq(len, want, "K=%d n=%zu bucket=%u: %zu bytes", c->bits, n, c->param[0], len);
    cr_assert_eq(mq_codec_validate_payload(c, buf, len, n), 0, "%s", mq_err_last());
    cr_assert_eq(mq_codec_validate_payload(c, buf, len - 1, n), -1);
    cr_assert_eq(mq_codec_validate_payload(c, buf, len + 1, n), -1);
    free(buf);
}

/* The same seed gives the same payload whichever kernels run (c, sse2, avx2), and another
 * seed a different one. */
static void s_check_kernels_agree(const mq_codec_t *c, size_t n)
{
    static const char *kernels[] = {"c", "sse2", "avx2"};
    float *x = s_normal(n, 21, 0.5f);
    size_t len0, len;
    uint8_t *ref = NULL;
    for (size_t k = 0; k < 3; k++) {
        if (mq_quant_use_kernels(kernels[k]) < 0)
            continue;
        uint8_t *buf = s_encode(c, x, n, 4, &len, NULL);
        if (!ref) {
            ref = buf, len0 = len;
            continue;
        }
        cr_assert(len == len0 && memcmp(buf, ref, len) == 0, "%s kernels wrote another payload",
                  kernels[k]);
        free(buf);
    }
    mq_quant_use_kernels(NULL);
    uint8_t *other = s_encode(c, x, n, 5, &len, NULL);
    cr_assert(memcmp(other, ref, len) != 0, "two seeds gave the same payload");
    free(x), free(ref), free(other);
}

/* ---- qsgd ---------------------------------------------------------------------------------*/

/* The exact E||Q(x) - x||^2 of QSGD at K bits: step^2 p (1 - p) a value, p the fractional
 * part of |x_i| s / norm, norm each bucket's (rounded to float as the codec sends it). */
static double s_qsgd_variance(const float *x, size_t n, size_t bucket, int K, double *bound)
{
    const double s = (1 << (K - 1)) - 1;
    const size_t B = bucket ? bucket : n;
    double var = 0;
    *bound = 0;
    for (size_t b0 = 0; b0 < n; b0 += B) {
        size_t d = n - b0 < B ? n - b0 : B;
        double ss = s_sum_sq(x + b0, d), norm = (float)sqrt(ss);
        for (size_t i = b0; i < b0 + d; i++) {
            double y = fabs(x[i]) * s / norm, p = y - floor(y);
            var += (norm / s) * (norm / s) * p * (1 - p);
        }
        *bound += fmin(d / (s * s), sqrt((double)d) / s) * ss; /* the paper's Lemma 3.1 */
    }
    return var;
}

Test(codec_qsgd, table_declares_two_to_eight_bits_unbiased_exact_and_stochastic)
{
    const mq_codec_ops_t *ops = mq_codec_lookup(MQ_CODEC_ID_qsgd);
    cr_assert(ops && ops == mq_codec_by_name("qsgd"));
    cr_assert(ops->min_bits == 2 && ops->max_bits == 8);
    cr_assert(ops->unbiased && ops->exact_size);
    mq_codec_t c = s_parse("qsgd:4");
    cr_assert(ops->stochastic && ops->stochastic(&c));
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t buf[64];
    size_t len;
    cr_assert_eq(mq_codec_encode(&c, x, 8, buf, sizeof buf, &len, NULL, NULL), -1);
    cr_assert(strstr(mq_err_last(), "random generator"), "%s", mq_err_last());
}

Test(codec_qsgd, specs_format_and_parse_back)
{
    s_spec_roundtrip("qsgd:2", "qsgd:2");
    s_spec_roundtrip("qsgd:8", "qsgd:8");
    s_spec_roundtrip("qsgd:4:bucket=512", "qsgd:4:bucket=512");
    s_spec_roundtrip("qsgd:3:bucket=0", "qsgd:3");
    s_spec_roundtrip("qsgd:bucket=64", "qsgd:bucket=64"); /* the level left to the controller */
    mq_codec_t c = s_parse("qsgd:5:bucket=7");
    cr_assert(c.id == MQ_CODEC_ID_qsgd && c.bits == 5 && c.param[0] == 7);
    for (int i = 1; i < MQ_CODEC_NPARAMS; i++)
        cr_assert_eq(c.param[i], 0);
    cr_assert_eq(mq_codec_validate_base(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd}), 0);
}

Test(codec_qsgd, bad_specs_and_parameters_are_refused_with_a_reason)
{
    s_spec_refused("qsgd:1", "2..8");
    s_spec_refused("qsgd:9", "2..8");
    s_spec_refused("qsgd:4x", "qsgd");
    s_spec_refused("qsgd:4:bucket=-1", "bucket");
    s_spec_refused("qsgd:4:bucket=", "bucket");
    s_spec_refused("qsgd:4:bucket=99999999999", "bucket");
    s_spec_refused("qsgd:4:fast", "unknown option 'fast'");
    s_spec_refused("qsgd:4:clip=2", "unknown option 'clip=2'");
    mq_codec_t c = s_parse("qsgd:4");
    c.param[2] = 1; /* e.g. from the network */
    cr_assert_eq(mq_codec_validate(&c), -1);
    cr_assert(strstr(mq_err_last(), "parameter word 2"), "%s", mq_err_last());
    cr_assert_eq(mq_codec_payload_size(&c, 100), 0);
    c = (mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 1};
    cr_assert_eq(mq_codec_validate(&c), -1);
}

Test(codec_qsgd, payload_is_exactly_the_norms_and_the_packed_codes)
{
    static const size_t ns[] = {1, 7, 8, 9, 15, 16, 17, 100, 2048, 2049, 5003};
    static const uint32_t buckets[] = {0, 1, 7, 512};
    float *x = s_normal(5003, 1, 1.0f);
    for (int K = 2; K <= 8; K++)
        for (size_t bi = 0; bi < 4; bi++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                size_t n = ns[k];
                mq_codec_t c = {.id = MQ_CODEC_ID_qsgd, .bits = K, .param = {buckets[bi]}};
                s_check_exact_size(&c, x, n,
                                   4 * s_nbuckets(n, buckets[bi]) + (n * (size_t)K + 7) / 8);
            }
    free(x);
}

/* The bytes as the file comment describes them: norms, then codes l | sign << (K-1). */
Test(codec_qsgd, wire_bytes_match_the_documented_layout)
{
    /* Exact levels: with norm 5 and s = 1 (K = 2), |x| = 5 is level 1 for certain, 0 is 0. */
    const float x[5] = {0.0f, -5.0f, 0.0f, 0.0f, 0.0f};
    mq_codec_t c = s_parse("qsgd:2");
    size_t len;
    uint8_t *buf = s_encode(&c, x, 5, 1, &len, NULL);
    cr_assert_eq(len, 4 + 2);
    cr_assert_eq(mq_get_f32(buf), 5.0f);
    cr_assert_eq(buf[4], 3 << 2, "codes byte 0 is 0x%02x", buf[4]); /* value 1: level 1, minus */
    cr_assert_eq(buf[5], 0);
    free(buf);
    /* K = 3 (s = 3), one value a bucket: |x| = norm, level s for certain. */
    const float y[2] = {3.0f, -4.0f};
    c = s_parse("qsgd:3:bucket=1");
    buf = s_encode(&c, y, 2, 1, &len, NULL);
    cr_assert_eq(len, 8 + 1);
    cr_assert(mq_get_f32(buf) == 3.0f && mq_get_f32(buf + 4) == 4.0f);
    cr_assert_eq(buf[8], 3 | (3 | 4) << 3, "codes 0x%02x", buf[8]);
    free(buf);
}

ParameterizedTestParameters(codec_qsgd, error_matches_the_exact_variance_within_the_papers_bound)
{
    return cr_make_param_array(int, s_qsgd_bits, sizeof s_qsgd_bits / sizeof s_qsgd_bits[0]);
}

/* Over R seeds the mean squared error equals QSGD's exact variance (within 5 standard errors)
 * and stays below the paper's bound min(d/s^2, sqrt(d)/s) ||v||^2 per bucket. */
ParameterizedTest(int *bits, codec_qsgd, error_matches_the_exact_variance_within_the_papers_bound)
{
    enum { N = 4096, R = 40 };
    static const uint32_t buckets[] = {0, 512, 100};
    float *x = s_normal(N, 11, 0.02f), *out = malloc(N * sizeof *out);
    cr_assert(out);
    for (size_t bi = 0; bi < 3; bi++) {
        mq_codec_t c = {.id = MQ_CODEC_ID_qsgd, .bits = *bits, .param = {buckets[bi]}};
        double bound, var = s_qsgd_variance(x, N, buckets[bi], *bits, &bound);
        double sum = 0, sum2 = 0;
        for (int r = 0; r < R; r++) {
            s_roundtrip(&c, x, N, 100 + (uint64_t)r, out);
            double e = s_sq_dist(out, x, N);
            sum += e, sum2 += e * e;
        }
        double mean = sum / R, sd = sqrt(fmax(sum2 / R - mean * mean, 0));
        cr_assert(var <= bound && mean <= bound,
                  "K=%d bucket=%u: mean squared error %g (variance %g) above the bound %g", *bits,
                  buckets[bi], mean, var, bound);
        cr_assert(fabs(mean - var) <= 5 * sd / sqrt(R) + 1e-4 * var,
                  "K=%d bucket=%u: mean squared error %g, QSGD's variance is %g (sd %g)", *bits,
                  buckets[bi], mean, var, sd);
    }
    free(x), free(out);
}

/* Per coordinate, the mean over R seeds is within 5 standard errors of x_i (plus three
 * draws' worth of a step, for coordinates rarely rounded up), and so is the total. */
static void s_check_unbiased(const mq_codec_t *c, const float *x, size_t n, int R,
                             double (*var_of)(const float *, size_t, size_t, const mq_codec_t *,
                                              double *))
{
    double *mean = calloc(n, sizeof *mean), *var = calloc(n, sizeof *var),
           *step = calloc(n, sizeof *step);
    float *out = malloc(n * sizeof *out);
    cr_assert(mean && var && step && out);
    for (size_t i = 0; i < n; i++)
        var[i] = var_of(x, n, i, c, &step[i]);
    for (int r = 0; r < R; r++) {
        s_roundtrip(c, x, n, 7000 + (uint64_t)r, out);
        for (size_t i = 0; i < n; i++)
            mean[i] += out[i] / (double)R;
    }
    double tot = 0, tot_var = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = 5 * sqrt(var[i] / R) + 3 * step[i] / R;
        cr_assert(fabs(mean[i] - x[i]) <= tol, "value %zu: mean of %d draws %.9g, x = %.9g (tol %g)",
                  i, R, mean[i], (double)x[i], tol);
        tot += mean[i] - x[i], tot_var += var[i] / R;
    }
    cr_assert(fabs(tot) <= 5 * sqrt(tot_var) + 1e-6, "summed bias %g (sd %g)", tot,
              sqrt(tot_var));
    free(mean), free(var), free(step), free(out);
}

static double s_qsgd_var_i(const float *x, size_t n, size_t i, const mq_codec_t *c, double *step)
{
    const double s = (1 << (c->bits - 1)) - 1;
    size_t B = c->param[0] ? c->param[0] : n, b0 = i / B * B, d = n - b0 < B ? n - b0 : B;
    double norm = (float)sqrt(s_sum_sq(x + b0, d)), y = fabs(x[i]) * s / norm, p = y - floor(y);
    *step = norm / s;
    return *step * *step * p * (1 - p);
}

Test(codec_qsgd, unbiased_over_many_seeds)
{
    float *x = s_normal(256, 12, 0.3f);
    x[10] = 0.0f;
    x[11] = -0.0f;
    s_check_unbiased(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 2}, x, 256, 3000, s_qsgd_var_i);
    s_check_unbiased(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 4, .param = {32}}, x, 256, 3000,
                     s_qsgd_var_i);
    s_check_unbiased(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 8, .param = {100}}, x, 256, 3000,
                     s_qsgd_var_i);
    free(x);
}

/* Headers are the buckets' 2-norms; decoded values are +-l * norm / s with l <= s. */
Test(codec_qsgd, values_are_signed_levels_of_each_buckets_norm)
{
    enum { N = 1000, BK = 64 };
    float *x = s_normal(N, 13, 0.1f), out[N];
    mq_codec_t c = {.id = MQ_CODEC_ID_qsgd, .bits = 3, .param = {BK}};
    size_t len;
    uint8_t *buf = s_encode(&c, x, N, 2, &len, NULL);
    cr_assert_eq(mq_codec_decode(&c, buf, len, out, N, 1.0f, false, NULL), 0);
    for (size_t b = 0; b < s_nbuckets(N, BK); b++) {
        size_t d = N - b * BK < BK ? N - b * BK : BK;
        double norm = sqrt(s_sum_sq(x + b * BK, d));
        float sent = mq_get_f32(buf + 4 * b);
        cr_assert(fabs(sent - norm) <= 1e-6 * norm, "bucket %zu: norm %g, sent %g", b, norm,
                  (double)sent);
        for (size_t i = b * BK; i < b * BK + d; i++) {
            double l = fabs(out[i]) / (sent / 3.0);
            cr_assert(fabs(l - round(l)) < 1e-5 && round(l) <= 3, "value %zu: %g is not a level",
                      i, (double)out[i]);
            cr_assert(out[i] == 0.0f || (out[i] < 0) == (x[i] < 0), "value %zu changed sign", i);
            cr_assert(!signbit(out[i]) || out[i] != 0.0f, "value %zu decodes to -0", i);
        }
    }
    free(x), free(buf);
}

Test(codec_qsgd, bad_payloads_are_refused_and_leave_dst_untouched)
{
    enum { N = 300 };
    float *x = s_normal(N, 14, 1.0f);
    mq_codec_t c = s_parse("qsgd:4:bucket=100");
    size_t len;
    uint8_t *buf = s_encode(&c, x, N, 1, &len, NULL);
    s_payload_refused(&c, buf, len - 1, N, "exactly");
    s_payload_refused(&c, buf, len + 1, N, "exactly");
    static const float bad[] = {NAN, -1.0f, INFINITY, -INFINITY, -0.0f};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        uint8_t *copy = malloc(len);
        memcpy(copy, buf, len);
        mq_put_f32(copy + 4 * 2, bad[k]);
        s_payload_refused(&c, copy, len, N, "bucket 2 of 3 has norm");
        free(copy);
    }
    /* Every code is a valid sign and level (B-1 bits hold exactly 0..s): any code bytes with
     * valid norms decode, within +-norm. */
    mq_rng_t rng;
    mq_rng_seed(&rng, 8);
    for (size_t i = 12; i < len; i++)
        buf[i] = (uint8_t)mq_rng_next(&rng);
    float out[N];
    cr_assert_eq(mq_codec_decode(&c, buf, len, out, N, 1.0f, false, NULL), 0, "%s",
                 mq_err_last());
    for (size_t i = 0; i < N; i++)
        cr_assert(fabsf(out[i]) <= mq_get_f32(buf + 4 * (i / 100)) * 1.000001f);
    free(x), free(buf);
}

Test(codec_qsgd, accumulate_adds_scale_times_the_decoded_values)
{
    s_check_accumulate(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 4}, 5001, 0.5f);
    s_check_accumulate(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 8, .param = {512}}, 5001, -0.3f);
    s_check_accumulate(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 2, .param = {7}}, 100, 0.25f);
}

Test(codec_qsgd, stats_are_the_decoded_sum_of_squares)
{
    float *x = s_normal(10007, 15, 0.01f);
    for (int K = 2; K <= 8; K++) {
        s_check_stats(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = K}, x, 10007);
        s_check_stats(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = K, .param = {333}}, x, 10007);
    }
    free(x);
}

Test(codec_qsgd, payload_depends_on_the_seed_not_the_kernels)
{
    s_check_kernels_agree(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 3, .param = {100}}, 5000);
    s_check_kernels_agree(&(mq_codec_t){.id = MQ_CODEC_ID_qsgd, .bits = 8}, 5000);
}

Test(codec_qsgd, refuses_non_finite_input_and_norms_beyond_float)
{
    float *x = s_normal(1000, 16, 1.0f);
    mq_codec_t c = s_parse("qsgd:4:bucket=100");
    x[537] = NAN;
    s_encode_refused(&c, x, 1000, "value 537 of 1000 is NaN");
    x[537] = -INFINITY;
    s_encode_refused(&c, x, 1000, "value 537 of 1000 is infinite");
    x[537] = 3e38f, x[538] = -3e38f; /* finite, but their 2-norm is not a float */
    s_encode_refused(&c, x, 1000, "beyond float32");
    free(x);
}

Test(codec_qsgd, zero_and_denormal_buckets_decode_finite)
{
    enum { N = 64 };
    float x[N], out[N];
    uint8_t *buf = s_zero_and_denormal("qsgd:8:bucket=32", x, out);
    float norm = mq_get_f32(buf + 4);
    cr_assert(norm > 0);
    for (size_t i = 32; i < N; i++)
        cr_assert(isfinite(out[i]) && fabsf(out[i]) <= norm, "value %zu: %g", i, (double)out[i]);
    free(buf);
}

/* ---- terngrad -----------------------------------------------------------------------------*/

Test(codec_terngrad, table_declares_no_level_unbiased_exact_and_stochastic)
{
    const mq_codec_ops_t *ops = mq_codec_lookup(MQ_CODEC_ID_terngrad);
    cr_assert(ops && ops == mq_codec_by_name("terngrad"));
    cr_assert(ops->min_bits == 0 && ops->max_bits == 0);
    cr_assert(ops->unbiased && ops->exact_size);
    mq_codec_t c = s_parse("terngrad");
    cr_assert(ops->stochastic && ops->stochastic(&c));
    mq_codec_t w = mq_codec_with_bits(&c, 4); /* the controller's level does not apply */
    cr_assert(mq_codec_equal(&w, &c));
}

Test(codec_terngrad, specs_format_and_parse_back)
{
    s_spec_roundtrip("terngrad", "terngrad");
    s_spec_roundtrip("terngrad:bucket=512", "terngrad:bucket=512");
    s_spec_roundtrip("terngrad:clip=2.5", "terngrad:clip=2.5");
    s_spec_roundtrip("terngrad:clip=2.5:bucket=64", "terngrad:bucket=64:clip=2.5");
    s_spec_roundtrip("terngrad:clip=0", "terngrad");
    s_spec_roundtrip("terngrad:clip=0.1", "terngrad:clip=0.1");
    s_spec_roundtrip("terngrad:clip=3.14159274", "terngrad:clip=3.1415927");
    mq_codec_t c = s_parse("terngrad:bucket=7:clip=2.5");
    cr_assert(c.id == MQ_CODEC_ID_terngrad && c.bits == 0 && c.param[0] == 7);
    cr_assert_eq(mq_codec_param_f(&c, 1), 2.5f);
}

Test(codec_terngrad, bad_specs_and_parameters_are_refused_with_a_reason)
{
    s_spec_refused("terngrad:2", "no bit-width");
    s_spec_refused("terngrad:clip=-1", "clip");
    s_spec_refused("terngrad:clip=abc", "clip");
    s_spec_refused("terngrad:clip=nan", "clip");
    s_spec_refused("terngrad:clip=1e9", "clip");
    s_spec_refused("terngrad:bucket=-3", "bucket");
    s_spec_refused("terngrad:fast", "unknown option 'fast'");
    mq_codec_t c = s_parse("terngrad");
    static const float bad[] = {NAN, -0.0f, -2.5f, INFINITY, 1e30f};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mq_codec_set_param_f(&c, 1, bad[k]); /* e.g. from the network */
        cr_assert_eq(mq_codec_validate(&c), -1, "clip %g accepted", (double)bad[k]);
        cr_assert(strstr(mq_err_last(), "clip"), "%s", mq_err_last());
    }
    c = s_parse("terngrad");
    c.param[3] = 9;
    cr_assert_eq(mq_codec_validate(&c), -1);
    cr_assert(strstr(mq_err_last(), "parameter word 3"), "%s", mq_err_last());
}

Test(codec_terngrad, payload_is_exactly_the_scales_and_two_bits_a_value)
{
    static const size_t ns[] = {1, 3, 4, 5, 8, 17, 2048, 2049, 5003};
    static const uint32_t buckets[] = {0, 1, 7, 512};
    float *x = s_normal(5003, 1, 1.0f);
    for (size_t bi = 0; bi < 4; bi++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            mq_codec_t c = {.id = MQ_CODEC_ID_terngrad, .param = {buckets[bi]}};
            s_check_exact_size(&c, x, ns[k], 4 * s_nbuckets(ns[k], buckets[bi]) + (ns[k] + 3) / 4);
        }
    free(x);
}

/* Scales are the buckets' max |v|; every value decodes to 0 or +-scale with its own sign,
 * and the largest value of a bucket is always sent whole. */
Test(codec_terngrad, values_are_zero_or_the_signed_bucket_maximum)
{
    enum { N = 1000, BK = 64 };
    float *x = s_normal(N, 17, 0.1f), out[N];
    mq_codec_t c = {.id = MQ_CODEC_ID_terngrad, .param = {BK}};
    for (uint64_t seed = 1; seed <= 5; seed++) {
        size_t len;
        uint8_t *buf = s_encode(&c, x, N, seed, &len, NULL);
        cr_assert_eq(len, 4 * 16 + 250);
        cr_assert_eq(mq_codec_decode(&c, buf, len, out, N, 1.0f, false, NULL), 0);
        for (size_t b = 0; b < 16; b++) {
            size_t d = N - b * BK < BK ? N - b * BK : BK, arg = b * BK;
            for (size_t i = b * BK; i < b * BK + d; i++)
                arg = fabsf(x[i]) > fabsf(x[arg]) ? i : arg;
            float s = mq_get_f32(buf + 4 * b);
            cr_assert_eq(s, fabsf(x[arg]), "bucket %zu: scale %g, max %g", b, (double)s,
                         (double)fabsf(x[arg]));
            cr_assert_eq(out[arg], x[arg], "bucket %zu's largest value was not kept", b);
            for (size_t i = b * BK; i < b * BK + d; i++)
                cr_assert(out[i] == 0.0f || out[i] == (x[i] < 0 ? -s : s), "value %zu: %g", i,
                          (double)out[i]);
        }
        free(buf);
    }
    free(x);
}

static double s_tern_var_i(const float *x, size_t n, size_t i, const mq_codec_t *c, double *step)
{
    size_t B = c->param[0] ? c->param[0] : n, b0 = i / B * B, d = n - b0 < B ? n - b0 : B;
    double s = 0;
    for (size_t k = b0; k < b0 + d; k++)
        s = fmax(s, fabs(x[k]));
    *step = s;
    return s * fabs(x[i]) - (double)x[i] * x[i]; /* s^2 p (1 - p), p = |x| / s */
}

Test(codec_terngrad, unbiased_over_many_seeds_with_the_papers_variance)
{
    enum { N = 256, R = 3000 };
    float *x = s_normal(N, 18, 0.3f);
    x[10] = 0.0f;
    s_check_unbiased(&(mq_codec_t){.id = MQ_CODEC_ID_terngrad}, x, N, R, s_tern_var_i);
    mq_codec_t c = {.id = MQ_CODEC_ID_terngrad, .param = {50}};
    s_check_unbiased(&c, x, N, R, s_tern_var_i);
    /* E||Q(v) - v||^2 = sum s_t |v_i| - v_i^2 */
    double var = 0, sum = 0, step;
    float out[N];
    for (size_t i = 0; i < N; i++)
        var += s_tern_var_i(x, N, i, &c, &step);
    for (int r = 0; r < 200; r++) {
        s_roundtrip(&c, x, N, 500 + (uint64_t)r, out);
        sum += s_sq_dist(out, x, N) / 200;
    }
    cr_assert(fabs(sum - var) <= 0.05 * var, "mean squared error %g, TernGrad's variance %g", sum,
              var);
    free(x);
}

/* clip=C: scales are C * rms of the bucket (when below its max), values beyond are sent as
 * +-scale, and the estimate is unbiased for the clipped gradient. */
Test(codec_terngrad, clip_bounds_the_scale_at_c_sigma)
{
    enum { N = 512, R = 2000 };
    float *x = s_normal(N, 19, 1.0f), out[N];
    x[3] = 40.0f, x[300] = -25.0f; /* outliers */
    mq_codec_t c = s_parse("terngrad:bucket=256:clip=2.5");
    size_t len;
    uint8_t *buf = s_encode(&c, x, N, 1, &len, NULL);
    double clipped[N], scale[2];
    for (size_t b = 0; b < 2; b++) {
        double thr = 2.5 * sqrt(s_sum_sq(x + 256 * b, 256) / 256);
        float s = mq_get_f32(buf + 4 * b);
        scale[b] = s;
        cr_assert(s >= thr && s <= thr * (1 + 1e-6), "bucket %zu: scale %g, 2.5 sigma = %g", b,
                  (double)s, thr);
        for (size_t i = 256 * b; i < 256 * (b + 1); i++)
            clipped[i] = fmin(fabs(x[i]), s) * (x[i] < 0 ? -1 : 1);
    }
    free(buf);
    double mean[N] = {0};
    for (int r = 0; r < R; r++) {
        s_roundtrip(&c, x, N, 900 + (uint64_t)r, out);
        for (size_t i = 0; i < N; i++)
            mean[i] += out[i] / (double)R;
    }
    for (size_t i = 0; i < N; i++) {
        double sc = fabs(clipped[i]), st = scale[i / 256];
        double tol = 5 * sqrt((st * sc - sc * sc) / R) + 3 * st / R;
        cr_assert(fabs(mean[i] - clipped[i]) <= tol, "value %zu: mean %g, clipped %g", i, mean[i],
                  clipped[i]);
    }
    cr_assert(fabs(mean[3] - 40.0) > 30, "the outlier was not clipped");
    /* A bucket of one value, or of equal values, has sigma = |v|: at C >= 1 it is sent as it
     * is, below at C * |v|, never clipped to nothing. */
    const float one[4] = {0.5f, 0.5f, -2.0f, 0.75f};
    c = s_parse("terngrad:bucket=2:clip=2.5");
    s_roundtrip(&c, one, 4, 1, out);
    cr_assert(out[0] == 0.5f && out[1] == 0.5f && out[2] == -2.0f, "%g %g %g", (double)out[0],
              (double)out[1], (double)out[2]);
    c = s_parse("terngrad:bucket=1:clip=0.5");
    s_roundtrip(&c, one, 4, 1, out);
    cr_assert(out[0] == 0.25f && out[1] == 0.25f && out[2] == -1.0f && out[3] == 0.375f,
              "%g %g %g %g", (double)out[0], (double)out[1], (double)out[2], (double)out[3]);
    free(x);
}

Test(codec_terngrad, bad_payloads_are_refused_and_leave_dst_untouched)
{
    enum { N = 301 };
    float *x = s_normal(N, 20, 1.0f);
    mq_codec_t c = s_parse("terngrad:bucket=100");
    size_t len;
    uint8_t *buf = s_encode(&c, x, N, 1, &len, NULL);
    cr_assert_eq(len, 16 + 76);
    s_payload_refused(&c, buf, len - 1, N, "exactly");
    s_payload_refused(&c, buf, len + 1, N, "exactly");
    uint8_t *copy = malloc(len);
    static const float bad[] = {NAN, -1.0f, INFINITY, -0.0f};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        memcpy(copy, buf, len);
        mq_put_f32(copy + 4 * 3, bad[k]);
        s_payload_refused(&c, copy, len, N, "bucket 3 of 4 has scale");
    }
    static const size_t at[] = {0, 1, 150, 255, 256, 299, 300};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        char why[64];
        memcpy(copy, buf, len);
        copy[16 + at[k] / 4] |= (uint8_t)(3u << (2 * (at[k] % 4)));
        snprintf(why, sizeof why, "value %zu of %d has code 3", at[k], N);
        s_payload_refused(&c, copy, len, N, why);
    }
    memcpy(copy, buf, len);
    copy[len - 1] |= 0xfc; /* the unused fields of the last byte are not codes */
    float out[N];
    cr_assert_eq(mq_codec_decode(&c, copy, len, out, N, 1.0f, false, NULL), 0, "%s",
                 mq_err_last());
    free(x), free(buf), free(copy);
}

Test(codec_terngrad, accumulate_adds_scale_times_the_decoded_values)
{
    s_check_accumulate(&(mq_codec_t){.id = MQ_CODEC_ID_terngrad}, 5001, 0.5f);
    s_check_accumulate(&(mq_codec_t){.id = MQ_CODEC_ID_terngrad, .param = {512}}, 5001, -0.3f);
    mq_codec_t c = s_parse("terngrad:bucket=7:clip=2.5");
    s_check_accumulate(&c, 100, 0.25f);
}

Test(codec_terngrad, stats_are_the_decoded_sum_of_squares)
{
    float *x = s_normal(10007, 21, 0.01f);
    s_check_stats(&(mq_codec_t){.id = MQ_CODEC_ID_terngrad}, x, 10007);
    s_check_stats(&(mq_codec_t){.id = MQ_CODEC_ID_terngrad, .param = {333}}, x, 10007);
    mq_codec_t c = s_parse("terngrad:bucket=64:clip=2.5");
    s_check_stats(&c, x, 10007);
    free(x);
}

Test(codec_terngrad, payload_depends_on_the_seed_not_the_kernels)
{
    s_check_kernels_agree(&(mq_codec_t){.id = MQ_CODEC_ID_terngrad, .param = {100}}, 5000);
    s_check_kernels_agree(&(mq_codec_t){.id = MQ_CODEC_ID_terngrad}, 5000);
}

Test(codec_terngrad, refuses_non_finite_input)
{
    float *x = s_normal(1000, 22, 1.0f);
    mq_codec_t c = s_parse("terngrad:bucket=100:clip=2.5");
    x[999] = NAN;
    s_encode_refused(&c, x, 1000, "value 999 of 1000 is NaN");
    x[999] = 1.0f, x[0] = INFINITY;
    s_encode_refused(&c, x, 1000, "value 0 of 1000 is infinite");
    free(x);
}

Test(codec_terngrad, zero_and_denormal_buckets_decode_finite)
{
    enum { N = 64 };
    float x[N], out[N];
    uint8_t *buf = s_zero_and_denormal("terngrad:bucket=32", x, out);
    float s = mq_get_f32(buf + 4);
    cr_assert_eq(s, 1e-45f * 32.0f);
    for (size_t i = 32; i < N; i++)
        cr_assert(out[i] == 0.0f || fabsf(out[i]) == s, "value %zu: %g", i, (double)out[i]);
    cr_assert_eq(out[N - 1], x[N - 1], "the bucket's largest value was not kept");
    free(buf);
}
