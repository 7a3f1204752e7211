/* Tests every registered codec through the operations table alone, as the services use it:
 * specs round-trip, payloads stay within the declared bound, the codec refuses what it did
 * not write (truncation, random corruption, non-finite input) without touching the output,
 * decode-accumulate and the statistics agree with a plain decode, unbiased codecs are
 * unbiased, and a server's decode-average-reply round works. A new codec gets these checks
 * by its registry line; its own file of tests covers what is particular to it. */

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/quant.h"

#define S_N 5000

/* A representative codec for OPS: its defaults at a middle level when it takes one. */
static mq_codec_t s_codec(const mq_codec_ops_t *ops)
{
    char spec[64];
    if (ops->max_bits > 0)
        snprintf(spec, sizeof spec, "%s:%d", ops->name,
                 ops->min_bits > 4 ? ops->min_bits : (ops->max_bits < 4 ? ops->max_bits : 4));
    else
        snprintf(spec, sizeof spec, "%s", ops->name);
    mq_codec_t c;
    cr_assert_eq(mq_codec_parse(spec, &c), 0, "%s: %s", spec, mq_err_last());
    return c;
}

static void s_normal(float *x, size_t n, uint64_t seed)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(0.01 * mq_rng_normal(&rng));
}

/* One encode of x with fresh state; returns the payload (malloc'd) and its length. */
static uint8_t *s_encode(const mq_codec_t *c, const float *x, size_t n, uint64_t seed,
                         size_t *len)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    size_t ns = mq_codec_state_floats(c, n);
    float *state = ns ? calloc(ns, sizeof *state) : NULL;
    size_t cap = mq_codec_payload_size(c, n);
    uint8_t *buf = malloc(cap + 16);
    cr_assert(buf && (!ns || state));
    mq_codec_ctx_t ctx = {.rng = &rng, .state = state, .lr = 0.01f};
    cr_assert_eq(mq_codec_encode_ctx(c, x, n, &ctx, buf, cap, len, NULL), 0, "%s",
                 mq_err_last());
    free(state);
    return buf;
}

Test(codecs, every_codec_is_registered_once_with_a_usage_and_help)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    cr_assert_geq(n, 11);
    for (size_t i = 0; i < n; i++) {
        cr_assert(all[i]->name && all[i]->usage && all[i]->help && all[i]->max_size &&
                      all[i]->encode && all[i]->validate && all[i]->decode,
                  "codec %zu lacks a field", i);
        cr_assert_eq(mq_codec_lookup(all[i]->id), all[i]);
        cr_assert_eq(mq_codec_by_name(all[i]->name), all[i]);
        cr_assert_null(strstr(all[i]->help, "not built"), "%s is a placeholder", all[i]->name);
        for (size_t j = 0; j < i; j++)
            cr_assert(all[j]->id != all[i]->id && strcmp(all[j]->name, all[i]->name) != 0);
    }
    char help[4096];
    mq_codec_help(help, sizeof help);
    for (size_t i = 0; i < n; i++)
        cr_assert(strstr(help, all[i]->usage), "help lacks %s", all[i]->name);
}

Test(codecs, specs_round_trip_and_unknown_names_are_refused)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    for (size_t i = 0; i < n; i++) {
        mq_codec_t c = s_codec(all[i]), back;
        char spec[MQ_CODEC_MAX_SPEC];
        mq_codec_format(&c, spec, sizeof spec);
        cr_assert_eq(mq_codec_parse(spec, &back), 0, "%s: %s", spec, mq_err_last());
        cr_assert(mq_codec_equal(&c, &back), "%s does not parse back to itself", spec);
    }
    mq_codec_t c;
    cr_assert_eq(mq_codec_parse("zstd:3", &c), -1);
    cr_assert(strstr(mq_err_last(), "unknown codec 'zstd'") && strstr(mq_err_last(), "topk"),
              "%s", mq_err_last());
}

Test(codecs, payloads_decode_within_bound_with_matching_stats_and_accumulate)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    static const size_t sizes[] = {1, 7, 64, S_N};
    float *x = malloc(S_N * sizeof *x), *y = malloc(S_N * sizeof *y), *z = malloc(S_N * sizeof *z);
    for (size_t i = 0; i < n; i++) {
        mq_codec_t c = s_codec(all[i]);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t m = sizes[k], len;
            s_normal(x, m, 11 + k);
            uint8_t *p = s_encode(&c, x, m, 5, &len);
            size_t max = mq_codec_payload_size(&c, m);
            cr_assert_leq(len, max, "%s n=%zu: %zu bytes > bound %zu", all[i]->name, m, len, max);
            if (all[i]->exact_size)
                cr_assert_eq(len, max, "%s n=%zu", all[i]->name, m);
            mq_codec_stats_t st;
            cr_assert_eq(mq_codec_decode(&c, p, len, y, m, 1.0f, false, &st), 0, "%s n=%zu: %s",
                         all[i]->name, m, mq_err_last());
            double sq = 0;
            for (size_t j = 0; j < m; j++) {
                cr_assert(isfinite(y[j]));
                sq += (double)y[j] * y[j];
            }
            cr_assert(fabs(st.sq - sq) <= 1e-4 * sq + 1e-12, "%s n=%zu: stats %g, decoded %g",
                      all[i]->name, m, st.sq, sq);
            for (size_t j = 0; j < m; j++)
                z[j] = 1.0f;
            cr_assert_eq(mq_codec_decode(&c, p, len, z, m, 0.5f, true, NULL), 0);
            for (size_t j = 0; j < m; j++)
                cr_assert(fabsf(z[j] - (1.0f + 0.5f * y[j])) <= 1e-6f,
                          "%s: accumulate differs at %zu", all[i]->name, j);
            free(p);
        }
    }
    free(x), free(y), free(z);
}

/* A caller whose next values add onto the array (ctx.clear): the payload is the one the encode
 * writes without clearing, bit for bit, and the values are zero after it, for every codec and
 * for the uniform codec's per-tensor range and its stochastic rounding across its chunks. */
static void s_check_clear(const mq_codec_t *c, const char *name)
{
    static const size_t sizes[] = {1, 7, 2048, 3 * 2048 + 5};
    size_t big = sizes[3];
    float *x = malloc(big * sizeof *x), *v = malloc(big * sizeof *v);
    cr_assert(x && v);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t m = sizes[k], len, len2;
        s_normal(x, m, 40 + k);
        memcpy(v, x, m * sizeof *v);
        uint8_t *want = s_encode(c, x, m, 9, &len);
        mq_rng_t rng;
        mq_rng_seed(&rng, 9);
        size_t ns = mq_codec_state_floats(c, m), cap = mq_codec_payload_size(c, m);
        float *state = ns ? calloc(ns, sizeof *state) : NULL;
        uint8_t *got = malloc(cap + 16);
        cr_assert(got && (!ns || state));
        mq_codec_ctx_t ctx = {.rng = &rng, .state = state, .lr = 0.01f, .clear = v};
        cr_assert_eq(mq_codec_encode_ctx(c, v, m, &ctx, got, cap, &len2, NULL), 0, "%s: %s",
                     name, mq_err_last());
        cr_assert_eq(len2, len, "%s n=%zu: %zu bytes, %zu without clearing", name, m, len2, len);
        cr_assert(memcmp(got, want, len) == 0, "%s n=%zu: clearing changed the payload", name, m);
        for (size_t j = 0; j < m; j++)
            cr_assert(v[j] == 0.0f && !signbit(v[j]), "%s n=%zu: value %zu is %g after the encode",
                      name, m, j, v[j]);
        free(state), free(got), free(want);
    }
    free(x), free(v);
}

Test(codecs, clearing_leaves_zeros_and_the_same_payload)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    for (size_t i = 0; i < n; i++) {
        mq_codec_t c = s_codec(all[i]);
        s_check_clear(&c, all[i]->name);
    }
    static const char *const more[] = {"uniform:2:bucket=0", "uniform:3:stochastic",
                                       "uniform:8:bucket=100", "uniform:1"};
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        mq_codec_t c;
        cr_assert_eq(mq_codec_parse(more[i], &c), 0, "%s: %s", more[i], mq_err_last());
        s_check_clear(&c, more[i]);
    }
}

Test(codecs, bad_payloads_are_refused_and_leave_the_output_alone)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    float *x = malloc(S_N * sizeof *x), *y = malloc(S_N * sizeof *y);
    mq_rng_t rng;
    mq_rng_seed(&rng, 99);
    s_normal(x, S_N, 3);
    for (size_t i = 0; i < n; i++) {
        mq_codec_t c = s_codec(all[i]);
        size_t len;
        uint8_t *p = s_encode(&c, x, S_N, 7, &len);
        for (size_t j = 0; j < S_N; j++)
            y[j] = 42.0f;
        cr_assert_eq(mq_codec_decode(&c, p, len - 1, y, S_N, 1.0f, true, NULL), -1,
                     "%s: a truncated payload was accepted", all[i]->name);
        cr_assert_eq(mq_codec_decode(&c, p, 0, y, S_N, 1.0f, true, NULL), -1,
                     "%s: an empty payload was accepted", all[i]->name);
        /* Random corruption: refused, or decoded to finite values; never a crash. */
        uint8_t *bad = malloc(len);
        int refused = 0;
        for (int t = 0; t < 300; t++) {
            memcpy(bad, p, len);
            for (int f = 0; f < 1 + t % 4; f++)
                bad[mq_rng_below(&rng, len)] ^= (uint8_t)(1u << mq_rng_below(&rng, 8));
            if (mq_codec_decode(&c, bad, len, y, S_N, 1.0f, false, NULL) != 0) {
                refused++;
                continue;
            }
            for (size_t j = 0; j < S_N; j++)
                cr_assert(isfinite(y[j]), "%s: corrupted payload decoded to %g", all[i]->name,
                          (double)y[j]);
        }
        for (size_t j = 0; j < S_N; j++)
            y[j] = 42.0f;
        memset(bad, 0xff, len); /* NaN headers and values, out-of-range indices */
        if (mq_codec_decode(&c, bad, len, y, S_N, 1.0f, true, NULL) == 0)
            for (size_t j = 0; j < S_N; j++)
                cr_assert(isfinite(y[j]));
        else
            for (size_t j = 0; j < S_N; j++)
                cr_assert_eq(y[j], 42.0f, "%s: a refused payload changed the output",
                             all[i]->name);
        cr_log_info("%s: %d of 300 corrupted payloads refused", all[i]->name, refused);
        free(bad);
        free(p);
    }
    free(x), free(y);
}

Test(codecs, non_finite_input_is_refused_by_every_codec)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    float x[300];
    s_normal(x, 300, 1);
    x[123] = NAN;
    for (size_t i = 0; i < n; i++) {
        mq_codec_t c = s_codec(all[i]);
        mq_rng_t rng;
        mq_rng_seed(&rng, 1);
        size_t ns = mq_codec_state_floats(&c, 300), len;
        float *state = ns ? calloc(ns, sizeof *state) : NULL;
        uint8_t *buf = malloc(mq_codec_payload_size(&c, 300));
        mq_codec_ctx_t ctx = {.rng = &rng, .state = state, .lr = 0.01f};
        cr_assert_eq(
            mq_codec_encode_ctx(&c, x, 300, &ctx, buf, mq_codec_payload_size(&c, 300), &len, NULL),
            -1, "%s encoded a NaN", all[i]->name);
        cr_assert(strstr(mq_err_last(), "123"), "%s: '%s' does not name the index",
                  all[i]->name, mq_err_last());
        for (size_t j = 0; j < ns; j++)
            cr_assert(isfinite(state[j]), "%s: state damaged by a refused input", all[i]->name);
        free(state);
        free(buf);
    }
}

Test(codecs, unbiased_codecs_average_to_the_input)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    enum { M = 200, T = 400 };
    float x[M], y[M];
    double sum[M], sum2[M];
    s_normal(x, M, 8);
    for (size_t i = 0; i < n; i++) {
        if (!all[i]->unbiased)
            continue;
        mq_codec_t c = s_codec(all[i]);
        memset(sum, 0, sizeof sum), memset(sum2, 0, sizeof sum2);
        for (int t = 0; t < T; t++) {
            size_t len;
            uint8_t *p = s_encode(&c, x, M, 1000 + (uint64_t)t, &len);
            cr_assert_eq(mq_codec_decode(&c, p, len, y, M, 1.0f, false, NULL), 0);
            for (int j = 0; j < M; j++)
                sum[j] += y[j], sum2[j] += (double)y[j] * y[j];
            free(p);
        }
        /* The mean error of each coordinate in units of its standard error (a coordinate
         * that came out the same in every trial says nothing: a rare level may never have
         * been drawn), and the summed error against its own standard error. */
        double z2 = 0, total = 0, total_var = 0;
        int free_coords = 0;
        for (int j = 0; j < M; j++) {
            double mean = sum[j] / T, var = sum2[j] / T - mean * mean;
            total += mean - x[j];
            if (var <= 1e-20)
                continue;
            total_var += var / T;
            double z = (mean - x[j]) / sqrt(var / T);
            z2 += z * z;
            free_coords++;
        }
        cr_assert(fabs(total) <= 6 * sqrt(total_var) + 1e-6, "%s: summed bias %g (sd %g)",
                  all[i]->name, total, sqrt(total_var));
        /* chi-square with free_coords degrees of freedom: mean k, sd sqrt(2k) */
        cr_assert(z2 <= free_coords + 6 * sqrt(2.0 * free_coords) + 10,
                  "%s: biased (chi2 %.1f over %d coordinates)", all[i]->name, z2, free_coords);
    }
}

Test(codecs, a_server_round_averages_and_replies_in_the_reply_codec)
{
    size_t n;
    const mq_codec_ops_t *const *all = mq_codec_all(&n);
    enum { P = 3 };
    float *g = malloc(S_N * sizeof *g), *mean = malloc(S_N * sizeof *mean),
          *w = malloc(S_N * sizeof *w);
    for (size_t i = 0; i < n; i++) {
        mq_codec_t c = s_codec(all[i]);
        for (int r = 0; r < P; r++) {
            size_t len;
            s_normal(g, S_N, 50 + (uint64_t)r);
            uint8_t *p = s_encode(&c, g, S_N, 60 + (uint64_t)r, &len);
            cr_assert_eq(mq_codec_decode(&c, p, len, mean, S_N, 1.0f / P, r > 0, NULL), 0);
            free(p);
        }
        mq_codec_t reply = mq_codec_reply(&c);
        cr_assert_eq(mq_codec_validate(&reply), 0, "%s: reply codec invalid", all[i]->name);
        size_t len;
        uint8_t *p = s_encode(&reply, mean, S_N, 70, &len);
        cr_assert_eq(mq_codec_decode(&reply, p, len, w, S_N, 1.0f, false, NULL), 0, "%s: %s",
                     all[i]->name, mq_err_last());
        double err = 0, ref = 0;
        for (size_t j = 0; j < S_N; j++)
            err += (double)(w[j] - mean[j]) * (w[j] - mean[j]), ref += (double)mean[j] * mean[j];
        cr_log_info("%s: reply %s, %zu bytes, relative error %.3g", all[i]->name,
                    mq_codec_ops(&reply)->name, len, ref > 0 ? err / ref : 0.0);
        if (reply.id == MQ_CODEC_ID_sparse || reply.id == MQ_CODEC_ID_none)
            cr_assert(err <= 1e-12 * (ref + 1), "%s: the exact reply is not exact", all[i]->name);
        free(p);
    }
    free(g), free(mean), free(w);
}

/* The ladder (c_ladder.c): each level is its rung's codec, and its one residual carries what
 * a level did not send to the next, whatever the family: the sum of what was sent plus the
 * residual is the sum of the gradients, over a walk up and down the levels. */
Test(codecs, the_ladder_sends_each_level_in_its_family_and_loses_nothing_between_levels)
{
    enum { N = 4096 };
    static float x[N], y[N], res[N];
    static double sent[N], given[N];
    static const int walk[] = {1, 2, 3, 4, 5, 6, 7, 1, 4, 2, 8};
    static const size_t bound[9] = {0, 0, 0, N / 8 + 64, N / 4 + 64, 3 * N / 8 + 64,
                                    N / 2 + 64, N + 64, 4 * N}; /* the uniform rungs' codes */
    mq_codec_t base;
    cr_assert_eq(mq_codec_parse("ladder", &base), 0, "%s", mq_err_last());
    cr_assert_eq(mq_codec_state_floats(&base, N), N, "one residual for every rung");
    for (size_t s = 0; s < sizeof walk / sizeof walk[0]; s++) {
        mq_codec_t c = mq_codec_with_bits(&base, walk[s]);
        s_normal(x, N, 100 + s);
        size_t cap = mq_codec_payload_size(&c, N), len;
        uint8_t *p = malloc(cap);
        mq_codec_ctx_t ctx = {.state = res, .lr = 0.01f};
        cr_assert_eq(mq_codec_encode_ctx(&c, x, N, &ctx, p, cap, &len, NULL), 0, "level %d: %s",
                     walk[s], mq_err_last());
        cr_assert_eq(mq_codec_decode(&c, p, len, y, N, 1.0f, false, NULL), 0, "level %d: %s",
                     walk[s], mq_err_last());
        size_t nonzero = 0;
        for (size_t i = 0; i < N; i++) {
            sent[i] += y[i];
            given[i] += x[i];
            nonzero += y[i] != 0.0f;
        }
        if (walk[s] == 1) /* top-k of 0.1 %: k = ceil(0.001 n) */
            cr_expect_eq(nonzero, 5, "level 1 sent %zu values", nonzero);
        else if (walk[s] == 2)
            cr_expect_eq(nonzero, 41, "level 2 sent %zu values", nonzero);
        else
            cr_expect_leq(len, bound[walk[s]], "level %d: %zu bytes", walk[s], len);
        if (walk[s] == 8) /* fp32 sends everything held back */
            for (size_t i = 0; i < N; i++)
                cr_assert_eq(res[i], 0.0f, "fp32 left %g at %zu", (double)res[i], i);
        for (size_t i = 0; i < N; i++)
            cr_assert(fabs(sent[i] + res[i] - given[i]) <= 1e-4 * (1 + fabs(given[i])),
                      "level %d, value %zu: sent %g + residual %g, given %g", walk[s], i,
                      sent[i], (double)res[i], given[i]);
        free(p);
    }
    /* servers answer a sparse level's mean exactly (its indices' union) and a dense one in
     * the rung's codec; the answer keeps no state */
    mq_codec_t reply = mq_codec_reply(&base);
    cr_expect_eq(mq_codec_state_floats(&reply, N), 0);
    for (int l = 1; l <= 8; l++) {
        mq_codec_t r = mq_codec_with_bits(&reply, l);
        for (size_t i = 0; i < N; i++)
            x[i] = i % 97 == 0 ? (float)i : 0.0f; /* a union of sparse pushes */
        size_t cap = mq_codec_payload_size(&r, N), len;
        uint8_t *p = malloc(cap);
        cr_assert_eq(mq_codec_encode_ctx(&r, x, N, &(mq_codec_ctx_t){0}, p, cap, &len, NULL), 0,
                     "reply at %d: %s", l, mq_err_last());
        cr_assert_eq(mq_codec_decode(&r, p, len, y, N, 1.0f, false, NULL), 0);
        if (l <= 2 || l == 8)
            for (size_t i = 0; i < N; i++)
                cr_assert_eq(y[i], x[i], "reply at %d differs at %zu", l, i);
        free(p);
    }
    char spec[MQ_CODEC_MAX_SPEC];
    mq_codec_format(&reply, spec, sizeof spec);
    cr_expect_str_eq(spec, "ladder:reply");
}
