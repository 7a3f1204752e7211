/* The parameter-server layer without a network: the shard plan, the segment codecs and checks,
 * the segment recipes (encode for sending, apply an aggregate) and the key/value module a
 * server aggregates with. Fake workers encode real pushes for a real (small) model's shards;
 * every round is recomputed by hand (decode, mean, reply encode, apply) and compared bit for
 * bit with what the module sends and what its master copy holds. */

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mqgrad/kv.h"
#include "mqgrad/nn.h"
#include "mqgrad/ps.h"
#include "mqgrad/quant.h"

#define S_THRESHOLD 1000 /* on the small model: conv2.w, fc1.w and fc2.w are quantized */
#define S_P 3            /* fake workers */
#define S_LR 0.05f

static mq_model_t *s_model(void)
{
    mq_model_t *m = mq_model_new("small", 1, 1, 0.0f);
    cr_assert(m, "%s", mq_err_last());
    mq_model_init(m, 1);
    return m;
}

static mq_codec_t s_parse(const char *spec)
{
    mq_codec_t c;
    cr_assert_eq(mq_codec_parse(spec, &c), 0, "%s: %s", spec, mq_err_last());
    return c;
}

static mq_optim_t s_optim(const char *spec)
{
    mq_optim_t o;
    cr_assert_eq(mq_optim_parse(spec, &o), 0, "%s: %s", spec, mq_err_last());
    return o;
}

static void s_normal(float *x, size_t n, uint64_t seed)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(0.01 * mq_rng_normal(&rng));
}

static bool s_same_floats(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* ---- the shard plan -------------------------------------------------------------------- */

Test(ps, shard_plan_cuts_equal_contiguous_shards_along_tensor_boundaries)
{
    mq_model_t *m = s_model();
    size_t n = mq_model_nparams(m);
    static mq_shard_t shards[300];
    const uint32_t counts[] = {1, 2, 3, 5, 7, 64, 300}; /* as many servers as a run has */
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        uint32_t S = counts[k];
        cr_assert_eq(mq_shard_plan(m, S, S_THRESHOLD, false, shards), 0, "%s", mq_err_last());
        uint64_t at = 0;
        for (uint32_t s = 0; s < S; s++) {
            const mq_shard_t *sh = &shards[s];
            cr_assert_eq(sh->begin, at, "S=%u: shard %u starts at %llu, not %llu", S, s,
                         (unsigned long long)sh->begin, (unsigned long long)at);
            uint64_t size = sh->end - sh->begin;
            cr_assert(size == n / S || size == n / S + 1, "S=%u: shard %u holds %llu", S, s,
                      (unsigned long long)size);
            uint64_t flat = sh->begin;
            for (uint32_t i = 0; i < sh->nsegs; i++) {
                const mq_segment_t *seg = &sh->segs[i];
                const mq_tensor_view_t *v = mq_model_tensor(m, seg->tensor);
                cr_assert_eq(seg->flat, flat, "S=%u shard %u: segment %u leaves a gap", S, s, i);
                cr_assert_gt(seg->count, 0);
                cr_assert_str_eq(seg->name, v->name);
                cr_assert_eq(seg->flat, v->offset + seg->offset);
                cr_assert_leq(seg->offset + seg->count, v->count, "%s overflows its tensor",
                              seg->name);
                cr_assert_eq(seg->quantized, v->count >= S_THRESHOLD, "%s", seg->name);
                flat += seg->count;
            }
            cr_assert_eq(flat, sh->end, "S=%u: shard %u's segments stop short", S, s);
            at = sh->end;
        }
        cr_assert_eq(at, n, "S=%u: the shards cover %llu of %zu", S, (unsigned long long)at, n);
    }
    mq_model_destroy(&m);
}

Test(ps, shard_plan_quantizes_by_threshold_and_never_in_fp32)
{
    mq_model_t *m = s_model();
    mq_shard_t sh;
    cr_assert_eq(mq_shard_plan(m, 1, 0, false, &sh), 0);
    for (uint32_t i = 0; i < sh.nsegs; i++)
        cr_assert(sh.segs[i].quantized, "threshold 0: %s travels as fp32", sh.segs[i].name);
    cr_assert_eq(mq_shard_plan(m, 1, 0, true, &sh), 0);
    for (uint32_t i = 0; i < sh.nsegs; i++)
        cr_assert(!sh.segs[i].quantized, "fp32 run: %s is quantized", sh.segs[i].name);
    cr_assert_eq(mq_shard_plan(m, 1, mq_model_nparams(m) + 1, false, &sh), 0);
    for (uint32_t i = 0; i < sh.nsegs; i++)
        cr_assert(!sh.segs[i].quantized, "%s is above no threshold", sh.segs[i].name);
    /* the paper's default: only tensors of 100k elements or more; the small model has none */
    cr_assert_eq(mq_shard_plan(m, 1, 100000, false, &sh), 0);
    for (uint32_t i = 0; i < sh.nsegs; i++)
        cr_assert(!sh.segs[i].quantized);
    mq_model_destroy(&m);
}

/* No servers, or more servers than parameters (each shard holds one at least). */
Test(ps, shard_plan_refuses_no_servers_and_too_many)
{
    mq_model_t *m = s_model();
    static mq_shard_t shards[1];
    cr_assert_eq(mq_shard_plan(m, 0, S_THRESHOLD, false, shards), -1);
    cr_assert(strstr(mq_err_last(), "0 shards"), "%s", mq_err_last());
    cr_assert_eq(mq_shard_plan(m, (uint32_t)mq_model_nparams(m) + 1, S_THRESHOLD, false, shards),
                 -1);
    cr_assert(strstr(mq_err_last(), "shards"), "%s", mq_err_last());
    cr_assert_eq(mq_shard_plan(m, UINT32_MAX, S_THRESHOLD, false, shards), -1);
    mq_model_destroy(&m);
}

/* ---- segment codecs and checks ---------------------------------------------------------- */

Test(ps, a_segment_travels_in_the_run_codec_only_when_quantized)
{
    mq_codec_t uni = s_parse("uniform:bucket=256");
    mq_segment_t q = {.name = "fc1.w", .count = 100, .quantized = true};
    mq_segment_t f = {.name = "fc1.b", .count = 100, .quantized = false};
    mq_codec_t c = mq_segment_codec(&q, 3, &uni);
    cr_assert_eq(c.id, MQ_CODEC_ID_uniform);
    cr_assert_eq(c.bits, 3);
    cr_assert_eq(c.param[0], uni.param[0], "the level must not change the options");
    cr_assert_eq(mq_segment_codec(&f, 3, &uni).id, MQ_CODEC_ID_none);
    cr_assert_eq(mq_segment_codec(&q, 32, &uni).id, MQ_CODEC_ID_none, "32 bits is fp32");
    mq_codec_t topk = s_parse("topk:ratio=0.05");
    mq_codec_t t = mq_segment_codec(&q, 5, &topk);
    cr_assert(mq_codec_equal(&t, &topk), "a codec without a level ignores the bits");
}

Test(ps, bits_are_checked_against_the_codec_level_range)
{
    mq_codec_t uni = s_parse("uniform"), qsgd = s_parse("qsgd"), topk = s_parse("topk");
    for (int b = -1; b <= 10; b++) {
        bool in = b >= MQ_QUANT_MIN_BITS && b <= MQ_QUANT_MAX_BITS;
        cr_assert_eq(mq_bits_ok(&uni, b), in, "uniform at %d bits", b);
        cr_assert_eq(mq_bits_ok(&qsgd, b), b >= 2 && b <= MQ_QUANT_MAX_BITS, "qsgd at %d", b);
        /* a codec without a level takes any controller level (then ignores it) */
        cr_assert_eq(mq_bits_ok(&topk, b), in, "topk at %d bits", b);
    }
}

/* Headers as a message from the shard's segments would carry them, in CODEC at BITS (or its
 * reply codec). */
static void s_headers(mq_msg_t *msg, const mq_shard_t *sh, int bits, const mq_codec_t *base,
                      bool reply)
{
    mq_msg_init(msg, reply ? MQ_MSG_AGGREGATE : MQ_MSG_PUSH);
    msg->ntensors = sh->nsegs;
    for (uint32_t i = 0; i < sh->nsegs; i++) {
        mq_tensor_hdr_t *h = &msg->tensors[i];
        snprintf(h->name, sizeof h->name, "%s", sh->segs[i].name);
        h->offset = sh->segs[i].offset;
        h->count = sh->segs[i].count;
        h->codec = mq_segment_codec(&sh->segs[i], bits, base);
        if (reply)
            h->codec = mq_codec_reply(&h->codec);
    }
}

/* mq_shard_check against BASE's push, or with REPLY the servers' answer, as a worker and a
 * server resolve them once a run. */
static int s_check(const mq_shard_t *sh, const mq_msg_t *msg, const mq_widths_t *w,
                   const mq_codec_t *base, bool reply)
{
    mq_codec_t run = reply ? mq_codec_reply(base) : *base;
    return mq_shard_check(sh, msg, w, &run, mq_codec_ops(&run));
}

Test(ps, shard_check_tells_a_push_from_a_reply_and_a_wrong_layout)
{
    mq_model_t *m = s_model();
    mq_shard_t shards[2];
    cr_assert_eq(mq_shard_plan(m, 2, S_THRESHOLD, false, shards), 0);
    const mq_shard_t *sh = &shards[1];
    mq_msg_t *msg = calloc(1, sizeof *msg);
    cr_assert(msg);
    mq_codec_t topk = s_parse("topk:ratio=0.05"), uni = s_parse("uniform");

    s_headers(msg, sh, 4, &topk, false);
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(4), &topk, false), 0, "%s", mq_err_last());
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(4), &topk, true), -1,
                 "a topk push is not a reply");
    cr_assert(strstr(mq_err_last(), "sparse"), "%s", mq_err_last());
    mq_msg_reset(msg);
    s_headers(msg, sh, 4, &topk, true);
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(4), &topk, true), 0, "%s", mq_err_last());
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(4), &topk, false), -1,
                 "a sparse reply is not a push");
    mq_msg_reset(msg);

    /* uniform replies in its own codec: one set of headers passes both ways */
    s_headers(msg, sh, 3, &uni, false);
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(3), &uni, false), 0, "%s", mq_err_last());
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(3), &uni, true), 0, "%s", mq_err_last());
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(4), &uni, false), -1,
                 "pushed at 3 bits, checked at 4");
    /* a mismatch names both codecs, from the tables in hand (an unknown one by its id) */
    cr_assert(strstr(mq_err_last(), ": codec uniform:3, expected uniform:4"), "%s",
              mq_err_last());
    uint32_t q = 0;
    while (q < sh->nsegs && !sh->segs[q].quantized)
        q++;
    cr_assert_lt(q, sh->nsegs, "the shard has a quantized segment");
    msg->tensors[q].codec.id = 200;
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(3), &uni, false), -1);
    cr_assert(strstr(mq_err_last(), ": codec of id 200, expected uniform:3"), "%s",
              mq_err_last());
    msg->tensors[q].codec = mq_codec_none();
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(3), &uni, false), -1);
    cr_assert(strstr(mq_err_last(), ": codec none, expected uniform:3"), "%s", mq_err_last());
    msg->tensors[q].codec = mq_codec_with_bits(&uni, 3);
    msg->tensors[0].offset++;
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(3), &uni, false), -1);
    cr_assert(strstr(mq_err_last(), sh->segs[0].name), "%s", mq_err_last());
    msg->tensors[0].offset--;
    msg->ntensors--;
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(3), &uni, false), -1, "a segment is missing");
    msg->ntensors++;
    snprintf(msg->tensors[1].name, sizeof msg->tensors[1].name, "other");
    cr_assert_eq(s_check(sh, msg, MQ_WIDTHS(3), &uni, false), -1, "a segment is misnamed");
    mq_msg_reset(msg);
    free(msg);
    mq_model_destroy(&m);
}

/* Per-tensor levels: read from a message's list (each one the codec takes, one per tensor of
 * the layout, or none), and each segment checked at its own tensor's level. */
Test(ps, per_tensor_levels_are_read_checked_and_used_per_segment)
{
    mq_model_t *m = s_model();
    uint32_t nt = (uint32_t)mq_model_ntensors(m);
    mq_codec_t uni = s_parse("uniform"), qsgd = s_parse("qsgd");
    mq_widths_t w;
    uint32_t list[MQ_WIRE_MAX_TENSORS];
    for (uint32_t t = 0; t < nt; t++)
        list[t] = 1 + t % 8;
    cr_assert_eq(mq_widths_read(&w, mq_codec_ops(&uni), false, 4,
                                list, nt, nt), 0, "%s", mq_err_last());
    cr_expect_eq(w.bits, 4);
    for (uint32_t t = 0; t < nt; t++)
        cr_expect_eq(mq_widths_at(&w, t), (int)list[t]);
    cr_expect_eq(mq_widths_at(MQ_WIDTHS(5), 3), 5, "no list: every tensor at bits");
    uint32_t back[MQ_WIRE_MAX_TENSORS], nback;
    mq_widths_write(&w, back, &nback);
    cr_expect_eq(nback, nt);
    cr_expect_arr_eq(back, list, nt * sizeof list[0]);
    cr_expect_eq(mq_widths_read(&w, mq_codec_ops(&uni), false, 4,
                                list, nt - 1, nt), -1, "one short");
    cr_expect(strstr(mq_err_last(), "layout"), "%s", mq_err_last());
    cr_expect_eq(mq_widths_read(&w, mq_codec_ops(&qsgd), false, 4,
                                list, nt, nt), -1, "qsgd takes no 1 bit");
    cr_expect(strstr(mq_err_last(), "tensor 0"), "%s", mq_err_last());
    list[1] = 33;
    cr_expect_eq(mq_widths_read(&w, mq_codec_ops(&uni), false, 4, list, nt, nt), -1, "33 bits");
    list[1] = 2;
    cr_expect_eq(mq_widths_read(&w, mq_codec_ops(&uni), false, 9, list, 0, nt), -1, "9 bits");
    cr_expect_eq(mq_widths_read(&w, mq_codec_ops(&uni), true, 32,
                                list, nt, nt), -1, "fp32: 32 only");
    cr_assert_eq(mq_widths_read(&w, mq_codec_ops(&uni), false, 4,
                                list, nt, nt), 0, "%s", mq_err_last());

    /* a push whose segments go at their tensors' levels passes at those, not at a uniform 4 */
    mq_shard_t shards[2];
    cr_assert_eq(mq_shard_plan(m, 2, 1, false, shards), 0);
    mq_msg_t *msg = calloc(1, sizeof *msg);
    cr_assert(msg);
    bool mixed = false;
    for (uint32_t s = 0; s < 2; s++) {
        const mq_shard_t *sh = &shards[s];
        s_headers(msg, sh, 4, &uni, false);
        for (uint32_t i = 0; i < sh->nsegs; i++) {
            msg->tensors[i].codec =
                mq_segment_codec(&sh->segs[i], mq_widths_at(&w, sh->segs[i].tensor), &uni);
            mixed |= sh->segs[i].quantized && mq_widths_at(&w, sh->segs[i].tensor) != 4;
        }
        cr_expect_eq(s_check(sh, msg, &w, &uni, false), 0, "%s", mq_err_last());
        cr_expect_eq(s_check(sh, msg, MQ_WIDTHS(4), &uni, false), -1);
        mq_msg_reset(msg);
    }
    cr_expect(mixed, "the levels differ from 4 somewhere");
    cr_expect(!mq_widths_equal(&w, MQ_WIDTHS(4)));
    free(msg);
    mq_model_destroy(&m);
}

/* ---- the segment recipes --------------------------------------------------------------- */

Test(ps, an_fp32_segment_is_sent_from_the_callers_floats_without_a_copy)
{
    float values[300];
    s_normal(values, 300, 3);
    mq_segment_t seg = {.name = "fc3.w", .offset = 20, .count = 300, .flat = 1000};
    mq_codec_t none = mq_codec_none();
    mq_seg_coder_t coder = {0};
    mq_sendbuf_t ref = {0};
    mq_tensor_hdr_t h;
    mq_payload_t out;
    mq_codec_stats_t st = {.sq = 7};
    cr_assert_eq(mq_seg_coder_init(&coder, &seg, &none), 0, "%s", mq_err_last());
    cr_assert_eq(mq_ps_encode_segment(&seg, &coder, 32, values, &ref, NULL, NULL, NULL, S_LR,
                                      &h, &out, &st),
                 0);
    cr_assert_eq(out.data, (const void *)values, "the payload must point into the floats");
    cr_assert_eq(out.len, sizeof values);
    cr_assert_eq(atomic_load(&ref.refs), 1, "the message holds the caller's floats");
    cr_assert_null(coder.buf.data, "no buffer for fp32");
    cr_assert_null(coder.state);
    cr_assert_str_eq(h.name, "fc3.w");
    cr_assert_eq(h.offset, 20);
    cr_assert_eq(h.count, 300);
    cr_assert_eq(h.codec.id, MQ_CODEC_ID_none);
    cr_assert_eq(st.sq, 0.0);
    out.free_fn((void *)out.data, out.hint);
    cr_assert_eq(atomic_load(&ref.refs), 0, "ZeroMQ's release drops the reference");
    /* error feedback runs in place: a residual array apart from the values is refused */
    float other[300] = {0};
    cr_assert_eq(
        mq_ps_encode_segment(&seg, &coder, 32, values, &ref, other, NULL, NULL, S_LR, &h, &out,
                             NULL),
        -1);
    cr_assert(strstr(mq_err_last(), "in place"), "%s", mq_err_last());
    cr_assert_eq(atomic_load(&ref.refs), 0, "nothing was sent");
    mq_seg_coder_release(&coder);
    mq_sendbuf_release(&ref);
}

/* A coder resolves its codec once; each round's level is checked against the codec's range,
 * 32 sends the values whole, and a bad run codec is refused when the plan is made. */
Test(ps, a_segment_coder_takes_the_levels_its_codec_takes)
{
    float values[256];
    for (int i = 0; i < 256; i++)
        values[i] = (float)i / 64.0f - 2.0f;
    mq_segment_t seg = {.name = "fc2.w", .count = 256, .quantized = true};
    mq_codec_t uni = s_parse("uniform:bucket=64");
    mq_seg_coder_t coder = {0};
    mq_sendbuf_t ref = {0};
    mq_tensor_hdr_t h;
    mq_payload_t out;
    mq_rng_t rng;
    mq_rng_seed(&rng, 9);
    cr_assert_eq(mq_seg_coder_init(&coder, &seg, &uni), 0, "%s", mq_err_last());
    for (int bits = 1; bits <= 8; bits++) {
        cr_assert_eq(mq_ps_encode_segment(&seg, &coder, bits, values, &ref, NULL, NULL, &rng,
                                          S_LR, &h, &out, NULL),
                     0, "%s", mq_err_last());
        mq_codec_t want = mq_codec_with_bits(&uni, bits);
        cr_assert(mq_codec_equal(&h.codec, &want), "%d bits: header codec", bits);
        cr_assert_eq(out.len, mq_codec_payload_size(&want, 256));
        out.free_fn((void *)out.data, out.hint);
    }
    static const int bad_levels[] = {-1, 0, 9, 31};
    for (size_t k = 0; k < sizeof bad_levels / sizeof bad_levels[0]; k++) {
        int b = bad_levels[k];
        cr_assert_eq(mq_ps_encode_segment(&seg, &coder, b, values, &ref, NULL, NULL, &rng, S_LR,
                                          &h, &out, NULL),
                     -1, "level %d", b);
        cr_assert(strstr(mq_err_last(), "bits (expected 1..8)"), "%s", mq_err_last());
    }
    cr_assert_eq(mq_ps_encode_segment(&seg, &coder, 32, values, &ref, NULL, NULL, &rng, S_LR, &h,
                                      &out, NULL),
                 0, "%s", mq_err_last());
    cr_assert_eq(h.codec.id, MQ_CODEC_ID_none, "32 bits is fp32");
    cr_assert_eq(out.data, (const void *)values);
    out.free_fn((void *)out.data, out.hint);
    mq_seg_coder_release(&coder);
    mq_codec_t bad = uni;
    bad.param[1] = 7; /* a stochastic flag that is neither 0 nor 1 */
    mq_seg_coder_t fresh = {0};
    cr_assert_eq(mq_seg_coder_init(&fresh, &seg, &bad), -1);
    cr_assert(strstr(mq_err_last(), "stochastic flag"), "%s", mq_err_last());
    cr_assert_null(fresh.ops, "a refused codec leaves the coder unresolved");
    mq_sendbuf_release(&ref);
}

Test(ps, a_quantized_segment_reuses_its_buffer_and_state)
{
    enum { N = 4000 };
    float *g = malloc(N * sizeof *g), *dec = malloc(N * sizeof *dec);
    cr_assert(g && dec);
    mq_segment_t seg = {.name = "fc1.w", .count = N, .quantized = true};
    mq_codec_t topk = s_parse("topk:ratio=0.01");
    mq_seg_coder_t coder = {0};
    mq_sendbuf_t ref = {0};
    mq_rng_t rng;
    mq_rng_seed(&rng, 5);
    const void *buf0 = NULL;
    const float *state0 = NULL;
    cr_assert_eq(mq_seg_coder_init(&coder, &seg, &topk), 0, "%s", mq_err_last());
    for (int it = 0; it < 3; it++) {
        s_normal(g, N, 10 + (uint64_t)it);
        mq_tensor_hdr_t h;
        mq_payload_t out;
        cr_assert_eq(mq_ps_encode_segment(&seg, &coder, 4, g, &ref, NULL, NULL, &rng, S_LR, &h,
                                          &out, NULL),
                     0, "%s", mq_err_last());
        cr_assert_eq(out.data, (const void *)coder.buf.data, "the payload is the coder's buffer");
        cr_assert_eq(h.payload_len, out.len);
        cr_assert(mq_codec_equal(&h.codec, &topk));
        cr_assert_eq(coder.nstate, mq_codec_state_floats(&topk, N));
        if (it == 0) {
            buf0 = coder.buf.data;
            state0 = coder.state;
        } else {
            cr_assert_eq((const void *)coder.buf.data, buf0, "iteration %d: a new buffer", it);
            cr_assert_eq(coder.state, state0, "iteration %d: new state", it);
        }
        /* what was not sent stays in the residual: decode + residual carries all of g */
        cr_assert_eq(mq_codec_decode(&topk, out.data, out.len, dec, N, 1.0f, false, NULL), 0);
        size_t sent = 0;
        for (size_t i = 0; i < N; i++)
            sent += dec[i] != 0;
        cr_assert_eq(sent, N / 100, "topk:0.01 of %d sends %zu", N, sent);
        out.free_fn((void *)out.data, out.hint);
    }
    cr_assert_eq(atomic_load(&ref.refs), 0, "no fp32 payload was made");
    mq_seg_coder_release(&coder);
    cr_assert_null(coder.state);
    mq_seg_coder_release(&coder); /* safe twice */
    mq_sendbuf_release(&ref);
    free(g), free(dec);
}

/* One payload of N values in codec C (fresh state). */
static uint8_t *s_payload(const mq_codec_t *c, const float *x, size_t n, size_t *len)
{
    size_t cap = mq_codec_payload_size(c, n), ns = mq_codec_state_floats(c, n);
    uint8_t *p = malloc(cap);
    float *state = ns ? calloc(ns, sizeof *state) : NULL;
    mq_rng_t rng;
    mq_rng_seed(&rng, 77);
    mq_codec_ctx_t ctx = {.rng = &rng, .state = state, .lr = S_LR};
    cr_assert(p && (!ns || state));
    cr_assert_eq(mq_codec_encode_ctx(c, x, n, &ctx, p, cap, len, NULL), 0, "%s", mq_err_last());
    free(state);
    return p;
}

Test(ps, sgd_applies_fused_as_decode_then_step)
{
    enum { N = 3000 };
    const char *specs[] = {"none", "sparse", "uniform:4", "uniform:2:bucket=64"};
    mq_optim_t sgd = s_optim("sgd");
    float *x = malloc(N * sizeof *x), *w0 = malloc(N * sizeof *w0), *fused = malloc(N * 4),
          *g = malloc(N * 4), *hand = malloc(N * 4);
    cr_assert(x && w0 && fused && g && hand);
    s_normal(w0, N, 1);
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        mq_codec_t c = s_parse(specs[k]);
        s_normal(x, N, 2);
        if (c.id == MQ_CODEC_ID_sparse)
            for (size_t i = 0; i < N; i++)
                x[i] = i % 7 ? 0.0f : x[i];
        size_t len;
        uint8_t *p = s_payload(&c, x, N, &len);
        memcpy(fused, w0, N * sizeof *w0);
        memcpy(hand, w0, N * sizeof *w0);
        mq_codec_stats_t st;
        mq_ps_apply(&sgd, &c, p, len, fused, N, NULL, NULL, S_LR, 1, &st);
        cr_assert_eq(mq_codec_decode(&c, p, len, g, N, 1.0f, false, NULL), 0);
        double sq = 0;
        for (size_t i = 0; i < N; i++) {
            hand[i] -= S_LR * g[i];
            sq += (double)g[i] * g[i];
        }
        cr_assert_float_eq(st.sq, sq, 1e-6 * sq, "%s: the statistics of the update", specs[k]);
        if (c.id == MQ_CODEC_ID_uniform) { /* lr is folded into the ranges: one rounding apart */
            for (size_t i = 0; i < N; i++)
                cr_assert_float_eq(fused[i], hand[i], 1e-6f * (fabsf(hand[i]) + 1e-3f),
                                   "%s at %zu", specs[k], i);
        } else {
            cr_assert(s_same_floats(fused, hand, N), "%s: fused differs from decode + step",
                      specs[k]);
        }
        free(p);
    }
    free(x), free(w0), free(fused), free(g), free(hand);
}

Test(ps, another_rule_gets_the_decoded_aggregate_and_keeps_its_state)
{
    enum { N = 2000 };
    mq_optim_t mom = s_optim("momentum:m=0.9");
    mq_codec_t c = s_parse("uniform:3");
    cr_assert_eq(mq_optim_state_floats(&mom, N), N);
    float *w = malloc(N * 4), *hand = malloc(N * 4), *u = calloc(N, 4), *hu = calloc(N, 4),
          *scratch = malloc(N * 4), *g = malloc(N * 4), *x = malloc(N * 4);
    cr_assert(w && hand && u && hu && scratch && g && x);
    s_normal(w, N, 4);
    memcpy(hand, w, N * 4);
    for (uint64_t t = 1; t <= 3; t++) {
        s_normal(x, N, 40 + t);
        size_t len;
        uint8_t *p = s_payload(&c, x, N, &len);
        mq_ps_apply(&mom, &c, p, len, w, N, scratch, u, S_LR, t, NULL);
        cr_assert_eq(mq_codec_decode(&c, p, len, g, N, 1.0f, false, NULL), 0);
        for (size_t i = 0; i < N; i++) { /* heavy ball: u = m u + g, w -= lr u */
            hu[i] = 0.9f * hu[i] + g[i];
            hand[i] -= S_LR * hu[i];
        }
        cr_assert(s_same_floats(u, hu, N), "step %llu: the momentum", (unsigned long long)t);
        cr_assert(s_same_floats(w, hand, N), "step %llu: the parameters", (unsigned long long)t);
        free(p);
    }
    free(w), free(hand), free(u), free(hu), free(scratch), free(g), free(x);
}

/* ---- the key/value module -------------------------------------------------------------- */

/* A fake worker: its gradient over the whole vector, and what mq_ps_encode_segment made of
 * the server's segments. */
typedef struct {
    float *g;
    mq_seg_coder_t coders[MQ_WIRE_MAX_TENSORS];
    mq_sendbuf_t ref;
    mq_rng_t rng;
    mq_tensor_hdr_t hdrs[MQ_WIRE_MAX_TENSORS];
    mq_payload_t out[MQ_WIRE_MAX_TENSORS];
    const uint8_t *data[MQ_WIRE_MAX_TENSORS];
    size_t len[MQ_WIRE_MAX_TENSORS];
} s_worker_t;

/* A server computed by hand: its own reply generator and state, its own master copy. */
typedef struct {
    mq_rng_t rng;
    float *state[MQ_WIRE_MAX_TENSORS];
    uint8_t *reply[MQ_WIRE_MAX_TENSORS];
    size_t len[MQ_WIRE_MAX_TENSORS];
    float *w;
    float *opt; /* the update rule's state over the whole vector */
} s_hand_t;

typedef struct {
    mq_model_t *model;
    mq_kv_config_t cfg;
    mq_kv_t *kv;
    const mq_shard_t *shard;
    s_worker_t workers[S_P];
    s_hand_t hand;
    mq_tensor_hdr_t hdrs[MQ_WIRE_MAX_TENSORS];
    mq_payload_t out[MQ_WIRE_MAX_TENSORS];
} s_bench_t;

static void s_bench_init(s_bench_t *b, const char *codec, const char *optim)
{
    memset(b, 0, sizeof *b);
    b->model = s_model();
    b->cfg = (mq_kv_config_t){
        .servers = 2,
        .rank = 1,
        .workers = S_P,
        .threshold = S_THRESHOLD,
        .codec = s_parse(codec),
        .optim = s_optim(optim),
        .rng_seed = 4242,
    };
    size_t n = mq_model_nparams(b->model);
    for (int r = 0; r < S_P; r++) {
        b->workers[r].g = malloc(n * sizeof(float));
        cr_assert(b->workers[r].g);
        mq_rng_seed(&b->workers[r].rng, 100 + (uint64_t)r);
    }
    b->hand.w = malloc(n * sizeof(float));
    b->hand.opt = calloc(mq_optim_state_floats(&b->cfg.optim, n) + 1, sizeof(float));
    cr_assert(b->hand.w && b->hand.opt);
    memcpy(b->hand.w, mq_model_params(b->model), n * sizeof(float));
    mq_rng_seed(&b->hand.rng, b->cfg.rng_seed);
}

static void s_bench_start(s_bench_t *b)
{
    b->kv = mq_kv_new(b->model, &b->cfg);
    cr_assert(b->kv, "%s", mq_err_last());
    b->shard = mq_kv_shard(b->kv);
}

static void s_hand_free(s_hand_t *h)
{
    for (int i = 0; i < MQ_WIRE_MAX_TENSORS; i++) {
        free(h->reply[i]);
        h->reply[i] = NULL;
    }
}

static void s_bench_fini(s_bench_t *b)
{
    mq_kv_destroy(&b->kv);
    mq_kv_destroy(&b->kv);
    for (int r = 0; r < S_P; r++) {
        for (int i = 0; i < MQ_WIRE_MAX_TENSORS; i++)
            mq_seg_coder_release(&b->workers[r].coders[i]);
        mq_sendbuf_release(&b->workers[r].ref);
        free(b->workers[r].g);
    }
    s_hand_free(&b->hand);
    for (int i = 0; i < MQ_WIRE_MAX_TENSORS; i++)
        free(b->hand.state[i]);
    free(b->hand.w);
    free(b->hand.opt);
    mq_model_destroy(&b->model);
}

/* Worker R's push of iteration IT at BITS: a fresh gradient, each segment encoded as a worker
 * encodes it. */
static void s_encode_push(s_bench_t *b, int r, uint64_t it, int bits)
{
    s_worker_t *w = &b->workers[r];
    s_normal(w->g, mq_model_nparams(b->model), 1000 * it + (uint64_t)r);
    for (uint32_t i = 0; i < b->shard->nsegs; i++) {
        const mq_segment_t *seg = &b->shard->segs[i];
        if (!w->coders[i].ops) /* resolved once, as a worker's plan does */
            cr_assert_eq(mq_seg_coder_init(&w->coders[i], seg, &b->cfg.codec), 0, "%s",
                         mq_err_last());
        cr_assert_eq(mq_ps_encode_segment(seg, &w->coders[i], bits, w->g + seg->flat, &w->ref,
                                          NULL, NULL, &w->rng, S_LR, &w->hdrs[i], &w->out[i], NULL),
                     0, "%s", mq_err_last());
        w->data[i] = w->out[i].data;
        w->len[i] = w->out[i].len;
    }
}

static void s_drop_push(s_bench_t *b, int r)
{
    for (uint32_t i = 0; i < b->shard->nsegs; i++)
        b->workers[r].out[i].free_fn((void *)b->workers[r].out[i].data, b->workers[r].out[i].hint);
}

static void s_drop_reply(s_bench_t *b)
{
    for (uint32_t i = 0; i < b->shard->nsegs; i++)
        b->out[i].free_fn((void *)b->out[i].data, b->out[i].hint);
}

/* Round IT by hand: per segment, each push decoded on its own (scale 1/P for the mean, 1 for
 * the sum) and added up in rank order, the result encoded with the reply codec from the hand
 * server's generator and state, and that reply decoded and given to the update rule's own
 * step (w -= lr g for sgd) on the hand master copy. */
static void s_hand_round(s_bench_t *b, uint64_t it, int bits, bool sum)
{
    s_hand_t *h = &b->hand;
    s_hand_free(h);
    mq_rng_seed(&h->rng, mq_kv_round_seed(b->cfg.rng_seed, it)); /* as the module does */
    for (uint32_t i = 0; i < b->shard->nsegs; i++) {
        const mq_segment_t *seg = &b->shard->segs[i];
        size_t n = seg->count;
        mq_codec_t push = mq_segment_codec(seg, bits, &b->cfg.codec);
        mq_codec_t reply = mq_codec_reply(&push);
        float *agg = malloc(n * 4), *t = malloc(n * 4);
        cr_assert(agg && t);
        for (int r = 0; r < S_P; r++) {
            s_worker_t *w = &b->workers[r];
            cr_assert_eq(mq_codec_decode(&push, w->data[i], w->len[i], t, n,
                                         sum ? 1.0f : 1.0f / S_P, false, NULL), 0);
            for (size_t j = 0; j < n; j++)
                agg[j] = r == 0 ? t[j] : agg[j] + t[j];
        }
        size_t ns = mq_codec_state_floats(&reply, n);
        if (ns && !h->state[i]) {
            h->state[i] = calloc(ns, sizeof(float));
            cr_assert(h->state[i]);
        }
        size_t cap = reply.id == MQ_CODEC_ID_none ? n * 4 : mq_codec_payload_size(&reply, n);
        h->reply[i] = malloc(cap);
        cr_assert(h->reply[i]);
        if (reply.id == MQ_CODEC_ID_none) {
            memcpy(h->reply[i], agg, n * 4);
            h->len[i] = n * 4;
        } else {
            mq_codec_ctx_t ctx = {.rng = &h->rng, .state = h->state[i], .lr = S_LR};
            cr_assert_eq(mq_codec_encode_ctx(&reply, agg, n, &ctx, h->reply[i], cap, &h->len[i],
                                             NULL), 0, "%s", mq_err_last());
        }
        cr_assert_eq(mq_codec_decode(&reply, h->reply[i], h->len[i], t, n, 1.0f, false, NULL), 0);
        size_t per = mq_optim_state_floats(&b->cfg.optim, 1);
        b->cfg.optim.ops->apply(&b->cfg.optim, h->w + seg->flat, t, h->opt + per * seg->flat, n,
                                S_LR, it + 1);
        free(agg), free(t);
    }
}

/* The module's replies are the hand server's bytes, their headers say the reply codec, and
 * the master copy is the hand copy, exactly but for the lr folded into the ranges when sgd
 * applies a uniform reply fused; nothing outside the shard moved. */
static void s_check_round(s_bench_t *b, int bits, const float *w_before)
{
    const float *w = mq_model_params(b->model);
    for (uint32_t i = 0; i < b->shard->nsegs; i++) {
        const mq_segment_t *seg = &b->shard->segs[i];
        mq_codec_t push = mq_segment_codec(seg, bits, &b->cfg.codec);
        mq_codec_t reply = mq_codec_reply(&push);
        cr_assert(mq_codec_equal(&b->hdrs[i].codec, &reply), "%s: header codec", seg->name);
        cr_assert_str_eq(b->hdrs[i].name, seg->name);
        cr_assert_eq(b->hdrs[i].offset, seg->offset);
        cr_assert_eq(b->hdrs[i].count, seg->count);
        cr_assert_eq(b->out[i].len, b->hand.len[i], "%s: reply of %zu bytes, by hand %zu",
                     seg->name, b->out[i].len, b->hand.len[i]);
        cr_assert(memcmp(b->out[i].data, b->hand.reply[i], b->out[i].len) == 0,
                  "%s: the reply differs from the hand round", seg->name);
        for (size_t j = seg->flat; j < seg->flat + seg->count; j++) {
            if (reply.id == MQ_CODEC_ID_uniform && mq_optim_is_sgd(&b->cfg.optim))
                cr_assert_float_eq(w[j], b->hand.w[j], 1e-6f * (fabsf(w[j]) + 1e-3f),
                                   "%s: master copy at %zu", seg->name, j);
            else
                cr_assert(w[j] == b->hand.w[j], "%s: master copy at %zu", seg->name, j);
        }
    }
    size_t n = mq_model_nparams(b->model);
    cr_assert(s_same_floats(w, w_before, b->shard->begin), "the master copy moved before");
    cr_assert(s_same_floats(w + b->shard->end, w_before + b->shard->end, n - b->shard->end),
              "the master copy moved after the shard");
}

/* One round: pushes in ORDER (ranks), the module's reply, the hand round, the comparison. */
static void s_round(s_bench_t *b, uint64_t it, int bits, const int order[S_P], bool sum)
{
    size_t n = mq_model_nparams(b->model);
    float *before = malloc(n * sizeof *before);
    cr_assert(before);
    memcpy(before, mq_model_params(b->model), n * sizeof *before);
    for (int r = 0; r < S_P; r++)
        s_encode_push(b, r, it, bits);
    for (int k = 0; k < S_P; k++) {
        int r = order[k];
        cr_assert_eq(mq_kv_pending(b->kv), (uint32_t)k);
        int rc = mq_kv_push(b->kv, it, (uint32_t)r, MQ_WIDTHS(bits), S_LR, b->workers[r].data,
                            b->workers[r].len, b->shard->nsegs);
        cr_assert_eq(rc, k == S_P - 1, "push %d (rank %d): %d, %s", k, r, rc, mq_err_last());
        cr_assert(mq_kv_has(b->kv, (uint32_t)r));
    }
    cr_assert_eq(mq_kv_complete(b->kv, b->hdrs, b->out), 0, "%s", mq_err_last());
    cr_assert_eq(mq_kv_iter(b->kv), it + 1);
    cr_assert_eq(mq_kv_pending(b->kv), 0);
    s_hand_round(b, it, bits, sum);
    s_check_round(b, bits, before);
    for (int r = 0; r < S_P; r++)
        s_drop_push(b, r);
    free(before);
}

static const int s_in_order[S_P] = {0, 1, 2}, s_shuffled[S_P] = {2, 0, 1};

static bool s_has(const mq_shard_t *sh, bool quantized)
{
    for (uint32_t i = 0; i < sh->nsegs; i++)
        if (sh->segs[i].quantized == quantized)
            return true;
    return false;
}

Test(ps, kv_uniform_replies_the_requantized_mean_and_the_master_copy_takes_it)
{
    s_bench_t b;
    s_bench_init(&b, "uniform:bucket=128:stochastic", "sgd");
    s_bench_start(&b);
    cr_assert(s_has(b.shard, true) && s_has(b.shard, false), "want both kinds of segments");
    const void *first[MQ_WIRE_MAX_TENSORS];
    for (uint64_t it = 0; it < 3; it++) {
        s_round(&b, it, 3, it == 1 ? s_shuffled : s_in_order, false);
        for (uint32_t i = 0; i < b.shard->nsegs; i++) { /* nothing allocated per round */
            if (it == 0)
                first[i] = b.out[i].data;
            cr_assert_eq(b.out[i].data, first[i], "round %llu: segment %u moved",
                         (unsigned long long)it, i);
        }
        s_drop_reply(&b);
    }
    s_bench_fini(&b);
}

Test(ps, kv_topk_replies_the_exact_mean_in_the_sparse_codec)
{
    s_bench_t b;
    s_bench_init(&b, "topk:ratio=0.05", "sgd");
    s_bench_start(&b);
    for (uint64_t it = 0; it < 2; it++) {
        s_round(&b, it, 4, s_in_order, false);
        for (uint32_t i = 0; i < b.shard->nsegs; i++) {
            const mq_segment_t *seg = &b.shard->segs[i];
            uint32_t want = seg->quantized ? MQ_CODEC_ID_sparse : MQ_CODEC_ID_none;
            cr_assert_eq(b.hdrs[i].codec.id, want, "%s: reply codec", seg->name);
            if (!seg->quantized)
                continue;
            /* the union of three top-5% pushes, scaled: more nonzeros than any push */
            float *dec = malloc(seg->count * 4);
            cr_assert_eq(mq_codec_decode(&b.hdrs[i].codec, b.out[i].data, b.out[i].len, dec,
                                         seg->count, 1.0f, false, NULL), 0);
            size_t nz = 0;
            for (size_t j = 0; j < seg->count; j++)
                nz += dec[j] != 0;
            cr_assert_gt(nz, (size_t)ceil(0.05 * seg->count), "%s: %zu nonzeros", seg->name, nz);
            free(dec);
        }
        s_drop_reply(&b);
    }
    s_bench_fini(&b);
}

Test(ps, kv_sign_keeps_a_server_residual_across_rounds)
{
    s_bench_t b;
    s_bench_init(&b, "sign", "sgd");
    s_bench_start(&b);
    /* round 0 leaves a residual; round 1's reply is the hand round only if it is used */
    for (uint64_t it = 0; it < 3; it++) {
        s_round(&b, it, 2, s_in_order, false);
        s_drop_reply(&b);
    }
    for (uint32_t i = 0; i < b.shard->nsegs; i++) {
        if (!b.shard->segs[i].quantized)
            continue;
        size_t n = b.shard->segs[i].count;
        double e = 0;
        for (size_t j = 0; j < n; j++)
            e += fabsf(b.hand.state[i][j]);
        cr_assert_gt(e, 0, "%s: the server's residual is empty", b.shard->segs[i].name);
    }
    s_bench_fini(&b);
}

Test(ps, kv_master_copy_runs_the_update_rule_on_the_reply)
{
    /* momentum keeps state; qrda also counts the updates (t from 1) */
    const char *rules[] = {"momentum:m=0.9", "qrda:l1=1e-4"};
    for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++) {
        s_bench_t b;
        s_bench_init(&b, "uniform:bucket=64", rules[k]);
        s_bench_start(&b);
        for (uint64_t it = 0; it < 3; it++) {
            s_round(&b, it, 4, s_shuffled, false);
            s_drop_reply(&b);
        }
        s_bench_fini(&b);
    }
}

Test(ps, kv_arrival_order_does_not_change_the_reply_or_the_master_copy)
{
    s_bench_t a, b;
    s_bench_init(&a, "uniform:stochastic", "momentum:m=0.9");
    s_bench_init(&b, "uniform:stochastic", "momentum:m=0.9");
    s_bench_start(&a);
    s_bench_start(&b);
    const int reverse[S_P] = {2, 1, 0};
    for (uint64_t it = 0; it < 2; it++) {
        for (int r = 0; r < S_P; r++) {
            s_encode_push(&a, r, it, 5);
            s_encode_push(&b, r, it, 5);
        }
        for (int k = 0; k < S_P; k++) {
            int ra = s_in_order[k], rb = reverse[k];
            mq_kv_push(a.kv, it, (uint32_t)ra, MQ_WIDTHS(5), S_LR, a.workers[ra].data,
                       a.workers[ra].len,
                       a.shard->nsegs);
            mq_kv_push(b.kv, it, (uint32_t)rb, MQ_WIDTHS(5), S_LR, b.workers[rb].data,
                       b.workers[rb].len,
                       b.shard->nsegs);
        }
        cr_assert_eq(mq_kv_complete(a.kv, a.hdrs, a.out), 0, "%s", mq_err_last());
        cr_assert_eq(mq_kv_complete(b.kv, b.hdrs, b.out), 0, "%s", mq_err_last());
        for (uint32_t i = 0; i < a.shard->nsegs; i++) {
            cr_assert_eq(a.out[i].len, b.out[i].len);
            cr_assert(memcmp(a.out[i].data, b.out[i].data, a.out[i].len) == 0,
                      "round %llu, %s: the reply depends on arrival order",
                      (unsigned long long)it, a.shard->segs[i].name);
        }
        cr_assert(s_same_floats(mq_model_params(a.model), mq_model_params(b.model),
                                mq_model_nparams(a.model)),
                  "round %llu: the master copies differ", (unsigned long long)it);
        s_drop_reply(&a), s_drop_reply(&b);
        for (int r = 0; r < S_P; r++)
            s_drop_push(&a, r), s_drop_push(&b, r);
    }
    s_bench_fini(&a);
    s_bench_fini(&b);
}

/* ---- the seams -------------------------------------------------------------------------- */

typedef struct {
    const s_bench_t *b;
    int calls;
    bool fail;
    bool poison;
} s_probe_t;

/* A handler that takes the sum instead of the mean, and checks that rank r's pointer is
 * worker r's payload whatever the arrival order. */
static int s_sum(void *arg, const mq_kv_pushes_t *in, float *dst)
{
    s_probe_t *p = arg;
    uint32_t i = (uint32_t)(in->seg - p->b->shard->segs);
    cr_assert_lt(i, p->b->shard->nsegs, "the segment is not the shard's");
    cr_assert_eq(in->npush, S_P);
    cr_assert_float_eq(in->lr, S_LR, 0);
    for (uint32_t r = 0; r < in->npush; r++) {
        cr_assert_eq(in->data[r], p->b->workers[r].data[i], "segment %u: slot %u is not rank %u",
                     i, r, r);
        mq_codec_decode_valid(&in->codec, in->data[r], in->len[r], dst, in->seg->count, 1.0f,
                              r > 0, NULL);
    }
    p->calls++;
    if (p->poison)
        dst[in->seg->count / 2] = NAN;
    if (p->fail) {
        mq_err_set("probe refuses %s", in->seg->name);
        return -1;
    }
    return 0;
}

Test(ps, kv_aggregate_handler_can_be_replaced_by_a_sum)
{
    s_bench_t b;
    s_probe_t probe = {.b = &b};
    s_bench_init(&b, "uniform:stochastic", "sgd");
    b.cfg.aggregate = s_sum;
    b.cfg.aggregate_arg = &probe;
    s_bench_start(&b);
    s_round(&b, 0, 4, s_shuffled, true);
    cr_assert_eq(probe.calls, (int)b.shard->nsegs, "the handler runs once per segment");
    /* an fp32 segment's reply is the sum itself: P times the mean's size */
    for (uint32_t i = 0; i < b.shard->nsegs; i++) {
        const mq_segment_t *seg = &b.shard->segs[i];
        if (seg->quantized)
            continue;
        const float *got = b.out[i].data;
        for (size_t j = 0; j < seg->count; j++) {
            float s = 0;
            for (int r = 0; r < S_P; r++)
                s = r == 0 ? b.workers[r].g[seg->flat + j] : s + b.workers[r].g[seg->flat + j];
            cr_assert(got[j] == s, "%s at %zu: %g, the sum is %g", seg->name, j, got[j], s);
        }
    }
    s_drop_reply(&b);
    for (int r = 0; r < S_P; r++)
        s_drop_push(&b, r);
    s_bench_fini(&b);
}

Test(ps, kv_a_failing_or_non_finite_handler_fails_the_round_and_keeps_it_open)
{
    s_bench_t b;
    s_probe_t probe = {.b = &b};
    s_bench_init(&b, "uniform", "sgd");
    b.cfg.aggregate = s_sum;
    b.cfg.aggregate_arg = &probe;
    s_bench_start(&b);
    for (int r = 0; r < S_P; r++) {
        s_encode_push(&b, r, 0, 4);
        mq_kv_push(b.kv, 0, (uint32_t)r, MQ_WIDTHS(4), S_LR, b.workers[r].data, b.workers[r].len,
                   b.shard->nsegs);
    }
    probe.fail = true;
    cr_assert_eq(mq_kv_complete(b.kv, b.hdrs, b.out), -1);
    cr_assert(strstr(mq_err_last(), "probe refuses"), "%s", mq_err_last());
    cr_assert_eq(mq_kv_pending(b.kv), S_P, "the round must stay open");
    cr_assert_eq(mq_kv_iter(b.kv), 0);
    probe.fail = false;
    probe.poison = true;
    cr_assert_eq(mq_kv_complete(b.kv, b.hdrs, b.out), -1);
    cr_assert(strstr(mq_err_last(), "non-finite"), "%s", mq_err_last());
    probe.poison = false;
    cr_assert_eq(mq_kv_complete(b.kv, b.hdrs, b.out), 0, "%s", mq_err_last());
    s_drop_reply(&b);
    for (int r = 0; r < S_P; r++)
        s_drop_push(&b, r);
    s_bench_fini(&b); /* would wait 5 s on a reference a failed round left behind */
}

Test(ps, kv_refuses_pushes_that_do_not_belong_to_the_round)
{
    s_bench_t b;
    s_bench_init(&b, "uniform", "sgd");
    s_bench_start(&b);
    for (int r = 0; r < S_P; r++)
        s_encode_push(&b, r, 0, 4);
    const uint8_t *const *d = b.workers[0].data;
    const size_t *l = b.workers[0].len;
    uint32_t n = b.shard->nsegs;
    cr_assert_eq(mq_kv_push(b.kv, 1, 0, MQ_WIDTHS(4), S_LR, d, l, n), -1, "a future iteration");
    cr_assert_eq(mq_kv_push(b.kv, 0, S_P, MQ_WIDTHS(4), S_LR, d, l, n), -1, "an unknown rank");
    cr_assert_eq(mq_kv_push(b.kv, 0, 0, MQ_WIDTHS(4), S_LR, d, l, n - 1), -1, "a segment short");
    cr_assert_eq(mq_kv_complete(b.kv, b.hdrs, b.out), -1, "no push is in");
    cr_assert_eq(mq_kv_pending(b.kv), 0);
    cr_assert_eq(mq_kv_push(b.kv, 0, 0, MQ_WIDTHS(4), S_LR, d, l, n), 0, "%s", mq_err_last());
    cr_assert_eq(mq_kv_widths(b.kv)->bits, 4);
    cr_assert_eq(mq_kv_push(b.kv, 0, 0, MQ_WIDTHS(4), S_LR, d, l, n), -1,
                 "a second push from rank 0");
    d = b.workers[1].data, l = b.workers[1].len;
    cr_assert_eq(mq_kv_push(b.kv, 0, 1, MQ_WIDTHS(5), S_LR, d, l, n), -1, "another level");
    cr_assert_eq(mq_kv_push(b.kv, 0, 1, MQ_WIDTHS(4), 2 * S_LR, d, l, n), -1,
                 "another learning rate");
    cr_assert_eq(mq_kv_pending(b.kv), 1, "a refused push must leave nothing behind");
    cr_assert(!mq_kv_has(b.kv, 1));
    for (int r = 0; r < S_P; r++)
        s_drop_push(&b, r);
    s_bench_fini(&b);
}

/* A slicer that gives whole tensors to servers in turn: shards neither contiguous nor equal. */
static int s_by_tensor(const mq_model_t *m, uint32_t nservers, uint64_t threshold, bool fp32,
                       mq_shard_t *shards)
{
    for (uint32_t s = 0; s < nservers; s++)
        shards[s] = (mq_shard_t){.begin = UINT64_MAX, .end = 0};
    for (size_t t = 0; t < mq_model_ntensors(m); t++) {
        const mq_tensor_view_t *v = mq_model_tensor(m, t);
        mq_shard_t *sh = &shards[t % nservers];
        sh->segs[sh->nsegs++] = (mq_segment_t){.tensor = (uint32_t)t, .name = v->name,
                                               .count = v->count, .flat = v->offset,
                                               .quantized = !fp32 && v->count >= threshold};
        sh->begin = v->offset < sh->begin ? v->offset : sh->begin;
        sh->end = v->offset + v->count > sh->end ? v->offset + v->count : sh->end;
    }
    return 0;
}

/* A slicer whose segment runs past its tensor's end. */
static int s_overflowing(const mq_model_t *m, uint32_t nservers, uint64_t threshold, bool fp32,
                         mq_shard_t *shards)
{
    int rc = mq_shard_plan(m, nservers, threshold, fp32, shards);
    shards[0].segs[0].count++;
    return rc;
}

Test(ps, kv_slicer_can_be_replaced_and_a_bad_plan_is_refused)
{
    s_bench_t b;
    s_bench_init(&b, "uniform", "sgd");
    b.cfg.slicer = s_by_tensor;
    b.cfg.rank = 0; /* the weights: some quantized, some not */
    s_bench_start(&b);
    size_t ntensors = mq_model_ntensors(b.model);
    cr_assert_eq(b.shard->nsegs, ntensors / 2, "server 0 of 2 holds every other tensor");
    for (uint32_t i = 0; i < b.shard->nsegs; i++)
        cr_assert_eq(b.shard->segs[i].tensor, 2 * i);
    cr_assert(s_has(b.shard, true) && s_has(b.shard, false));
    size_t n = mq_model_nparams(b.model);
    float *before = malloc(n * 4);
    memcpy(before, mq_model_params(b.model), n * 4);
    for (int r = 0; r < S_P; r++) {
        s_encode_push(&b, r, 0, 6);
        mq_kv_push(b.kv, 0, (uint32_t)r, MQ_WIDTHS(6), S_LR, b.workers[r].data, b.workers[r].len,
                   b.shard->nsegs);
    }
    cr_assert_eq(mq_kv_complete(b.kv, b.hdrs, b.out), 0, "%s", mq_err_last());
    s_hand_round(&b, 0, 6, false);
    const float *w = mq_model_params(b.model);
    for (size_t t = 0; t < ntensors; t++) { /* the held tensors moved, and only they */
        const mq_tensor_view_t *v = mq_model_tensor(b.model, t);
        for (size_t j = v->offset; j < v->offset + v->count; j++) {
            if (t % 2 == 1)
                cr_assert(w[j] == before[j], "%s is server 1's", v->name);
            else
                cr_assert_float_eq(w[j], b.hand.w[j], 1e-6f * (fabsf(w[j]) + 1e-3f), "%s at %zu",
                                   v->name, j);
        }
    }
    s_drop_reply(&b);
    for (int r = 0; r < S_P; r++)
        s_drop_push(&b, r);
    free(before);
    s_bench_fini(&b);

    mq_model_t *m = s_model();
    mq_kv_config_t cfg = {.servers = 2, .rank = 0, .workers = 2, .threshold = S_THRESHOLD,
                          .codec = s_parse("uniform"), .optim = s_optim("sgd"),
                          .slicer = s_overflowing};
    cr_assert_null(mq_kv_new(m, &cfg), "a segment past its tensor");
    cr_assert(strstr(mq_err_last(), "not a range of one tensor"), "%s", mq_err_last());
    cfg.slicer = NULL;
    cfg.rank = 2;
    cr_assert_null(mq_kv_new(m, &cfg), "shard 2 of 2");
    cfg.rank = 0;
    cfg.workers = 0;
    cr_assert_null(mq_kv_new(m, &cfg), "no workers");
    mq_model_destroy(&m);
}

/* ---- the worker half, wired by hand to the server half ----------------------------------- */

#define S_SERVERS 2

/* A worker: its replica of the model, its half of the module, its gradient and its pushes. */
typedef struct {
    mq_model_t *model;
    mq_kv_worker_t *kw;
    float *g;     /* the model's gradient buffer, where the module finds it */
    float *fresh; /* this iteration's gradient, put there as the model would */
    mq_tensor_hdr_t hdrs[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    mq_payload_t out[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    const uint8_t *data[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    size_t len[S_SERVERS][MQ_WIRE_MAX_TENSORS];
} s_replica_t;

/* P workers and S_SERVERS servers, each server with its own master copy; no sockets. */
typedef struct {
    uint32_t P;
    bool ef;
    s_replica_t w[S_P];
    mq_model_t *master[S_SERVERS];
    mq_kv_t *kv[S_SERVERS];
    mq_tensor_hdr_t hdrs[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    mq_payload_t out[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    const uint8_t *data[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    size_t len[S_SERVERS][MQ_WIRE_MAX_TENSORS];
} s_cluster_t;

static mq_kv_worker_config_t s_worker_cfg(uint32_t rank, uint32_t P, const char *codec,
                                          const char *optim)
{
    return (mq_kv_worker_config_t){
        .servers = S_SERVERS,
        .rank = rank,
        .workers = P,
        .threshold = S_THRESHOLD,
        .codec = s_parse(codec),
        .optim = s_optim(optim),
        .rng_seed = 7 * 1000003ULL + rank + 1,
    };
}

static void s_cluster_init(s_cluster_t *c, uint32_t P, const char *codec, const char *optim,
                           bool ef, mq_kv_slicer_fn *slicer)
{
    memset(c, 0, sizeof *c);
    c->P = P;
    c->ef = ef;
    for (uint32_t s = 0; s < S_SERVERS; s++) {
        c->master[s] = s_model();
        mq_kv_config_t cfg = {.servers = S_SERVERS, .rank = s, .workers = P,
                              .threshold = S_THRESHOLD, .codec = s_parse(codec),
                              .optim = s_optim(optim), .rng_seed = 4242 + s, .slicer = slicer};
        c->kv[s] = mq_kv_new(c->master[s], &cfg);
        cr_assert(c->kv[s], "%s", mq_err_last());
    }
    for (uint32_t r = 0; r < P; r++) {
        s_replica_t *w = &c->w[r];
        w->model = s_model();
        w->g = mq_model_grads(w->model);
        w->fresh = malloc(mq_model_nparams(w->model) * sizeof(float));
        cr_assert(w->fresh);
        mq_kv_worker_config_t cfg = s_worker_cfg(r, P, codec, optim);
        cfg.error_feedback = ef;
        cfg.slicer = slicer;
        w->kw = mq_kv_worker_new(w->model, &cfg);
        cr_assert(w->kw, "%s", mq_err_last());
    }
}

static void s_cluster_fini(s_cluster_t *c)
{
    for (uint32_t r = 0; r < c->P; r++) {
        mq_kv_worker_destroy(&c->w[r].kw);
        mq_kv_worker_destroy(&c->w[r].kw);
        free(c->w[r].fresh);
        mq_model_destroy(&c->w[r].model);
    }
    for (uint32_t s = 0; s < S_SERVERS; s++) {
        mq_kv_destroy(&c->kv[s]);
        mq_model_destroy(&c->master[s]);
    }
}

/* GRAD into the gradient buffer G as the model of a worker with error feedback (EF) puts it
 * there: added onto the residual of the quantized segments, over the rest. */
static void s_put_gradient(const mq_kv_worker_t *kw, const float *grad, float *g, bool ef)
{
    for (uint32_t s = 0; s < S_SERVERS; s++)
        for (uint32_t i = 0; i < mq_kv_worker_shard(kw, s)->nsegs; i++) {
            const mq_segment_t *seg = &mq_kv_worker_shard(kw, s)->segs[i];
            for (size_t j = seg->flat; j < seg->flat + seg->count; j++)
                g[j] = ef && seg->quantized ? g[j] + grad[j] : grad[j];
        }
}

static void s_drop(mq_payload_t *out, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        out[i].free_fn((void *)out[i].data, out[i].hint);
}

/* One iteration: every worker encodes a fresh gradient for every shard, each server takes
 * the pushes in rank order and replies, every worker applies every reply. */
static void s_cluster_iter(s_cluster_t *c, uint64_t it, int bits)
{
    size_t n = mq_model_nparams(c->master[0]);
    for (uint32_t r = 0; r < c->P; r++) {
        s_replica_t *w = &c->w[r];
        cr_assert_eq(mq_kv_worker_wait(w->kw, 1000), 0, "%s", mq_err_last());
        s_normal(w->fresh, n, 1000 * it + r + 7);
        s_put_gradient(w->kw, w->fresh, w->g, c->ef);
        for (uint32_t s = 0; s < S_SERVERS; s++) {
            cr_assert_eq(mq_kv_worker_encode(w->kw, s, w->g, MQ_WIDTHS(bits), S_LR, w->hdrs[s],
                                             w->out[s],
                                             NULL, NULL),
                         0, "%s", mq_err_last());
            for (uint32_t i = 0; i < mq_kv_worker_shard(w->kw, s)->nsegs; i++) {
                w->data[s][i] = w->out[s][i].data;
                w->len[s][i] = w->out[s][i].len;
            }
        }
    }
    for (uint32_t s = 0; s < S_SERVERS; s++) {
        uint32_t nsegs = mq_kv_shard(c->kv[s])->nsegs;
        for (uint32_t r = 0; r < c->P; r++) {
            int rc = mq_kv_push(c->kv[s], it, r, MQ_WIDTHS(bits), S_LR, c->w[r].data[s],
                                c->w[r].len[s],
                                mq_kv_worker_shard(c->w[r].kw, s)->nsegs);
            cr_assert_eq(rc, r == c->P - 1, "push of rank %u: %d, %s", r, rc, mq_err_last());
        }
        cr_assert_eq(mq_kv_complete(c->kv[s], c->hdrs[s], c->out[s]), 0, "%s", mq_err_last());
        for (uint32_t i = 0; i < nsegs; i++) {
            c->data[s][i] = c->out[s][i].data;
            c->len[s][i] = c->out[s][i].len;
        }
        for (uint32_t r = 0; r < c->P; r++)
            s_drop(c->w[r].out[s], nsegs);
    }
    for (uint32_t r = 0; r < c->P; r++)
        for (uint32_t s = 0; s < S_SERVERS; s++)
            mq_kv_worker_apply(c->w[r].kw, s, it, S_LR, c->hdrs[s], c->data[s], c->len[s],
                               NULL);
    for (uint32_t s = 0; s < S_SERVERS; s++)
        s_drop(c->out[s], mq_kv_shard(c->kv[s])->nsegs);
}

/* Every replica holds the same parameters, and each shard of them is its server's master
 * copy, bit for bit. */
static void s_cluster_check(const s_cluster_t *c, const float *w0)
{
    size_t n = mq_model_nparams(c->master[0]);
    const float *w = mq_model_params(c->w[0].model);
    cr_assert(!s_same_floats(w, w0, n), "the parameters did not move");
    for (uint32_t r = 1; r < c->P; r++)
        cr_assert(s_same_floats(mq_model_params(c->w[r].model), w, n),
                  "worker %u's parameters differ from worker 0's", r);
    for (uint32_t s = 0; s < S_SERVERS; s++) {
        const mq_shard_t *sh = mq_kv_shard(c->kv[s]);
        const float *m = mq_model_params(c->master[s]);
        for (uint32_t i = 0; i < sh->nsegs; i++)
            cr_assert(s_same_floats(w + sh->segs[i].flat, m + sh->segs[i].flat,
                                    sh->segs[i].count),
                      "%s differs from server %u's master copy", sh->segs[i].name, s);
    }
}

static void s_cluster_run(uint32_t P, const char *codec, int bits, const char *optim, bool ef,
                          mq_kv_slicer_fn *slicer)
{
    s_cluster_t c;
    s_cluster_init(&c, P, codec, optim, ef, slicer);
    size_t n = mq_model_nparams(c.master[0]);
    float *w0 = malloc(n * sizeof *w0);
    cr_assert(w0);
    memcpy(w0, mq_model_params(c.w[0].model), n * sizeof *w0);
    for (uint64_t it = 0; it < 3; it++) {
        s_cluster_iter(&c, it, bits);
        s_cluster_check(&c, w0);
    }
    free(w0);
    s_cluster_fini(&c);
}

Test(ps, kv_worker_uniform_keeps_every_replica_equal_to_the_master_copies)
{
    s_cluster_run(3, "uniform:bucket=128:stochastic", 4, "sgd", true, NULL);
}

Test(ps, kv_worker_topk_keeps_every_replica_equal_to_the_master_copies)
{
    s_cluster_run(2, "topk:ratio=0.05", 4, "momentum:m=0.9", false, NULL);
}

Test(ps, kv_worker_sign_keeps_every_replica_equal_to_the_master_copies)
{
    s_cluster_run(3, "sign", 2, "sgd", false, NULL);
}

Test(ps, kv_worker_sends_fp32_segments_from_the_gradient_without_a_copy)
{
    mq_model_t *m = s_model();
    size_t n = mq_model_nparams(m);
    float *g = malloc(n * sizeof *g);
    cr_assert(g);
    s_normal(g, n, 5);
    mq_kv_worker_config_t cfg = s_worker_cfg(1, 2, "uniform", "sgd");
    cfg.fp32 = true;
    mq_kv_worker_t *kw = mq_kv_worker_new(m, &cfg);
    cr_assert(kw, "%s", mq_err_last());
    cr_assert_null(mq_kv_worker_residual(kw), "no residual without error feedback");
    mq_tensor_hdr_t hdrs[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    mq_payload_t out[S_SERVERS][MQ_WIRE_MAX_TENSORS];
    double sq = 0;
    for (uint32_t s = 0; s < S_SERVERS; s++) {
        const mq_shard_t *sh = mq_kv_worker_shard(kw, s);
        cr_assert_eq(mq_kv_worker_encode(kw, s, g, MQ_WIDTHS(32), S_LR, hdrs[s], out[s], &sq,
                                         NULL), 0, "%s",
                     mq_err_last());
        for (uint32_t i = 0; i < sh->nsegs; i++) {
            const mq_segment_t *seg = &sh->segs[i];
            cr_assert(!seg->quantized);
            cr_assert_eq(hdrs[s][i].codec.id, MQ_CODEC_ID_none);
            cr_assert_eq(hdrs[s][i].count, seg->count);
            cr_assert_eq(out[s][i].data, (const void *)(g + seg->flat), "%s was copied",
                         seg->name);
            cr_assert_eq(out[s][i].len, seg->count * sizeof(float));
        }
    }
    cr_assert(sq == 0.0, "fp32 segments are not counted in the sent norm");
    cr_assert_neq(mq_kv_worker_wait(kw, 20), 0, "the gradient is still being sent");
    s_drop(out[0], mq_kv_worker_shard(kw, 0)->nsegs);
    cr_assert_neq(mq_kv_worker_wait(kw, 20), 0, "shard 1 still points into the gradient");
    s_drop(out[1], mq_kv_worker_shard(kw, 1)->nsegs);
    cr_assert_eq(mq_kv_worker_wait(kw, 20), 0, "%s", mq_err_last());
    mq_kv_worker_destroy(&kw);
    free(g);
    mq_model_destroy(&m);
}

/* Whether the values of SEG in G are all +0. */
static bool s_zero(const float *g, const mq_segment_t *seg)
{
    for (size_t j = seg->flat; j < seg->flat + seg->count; j++)
        if (g[j] != 0.0f || signbit(g[j]))
            return false;
    return true;
}

/* Clearing, for a model whose backward adds onto its gradient (autograd): a quantized segment
 * is zero once encoded, an fp32 one (its push points into the gradient) once sent and waited
 * for, a residual (error feedback) is kept, and a round in which a shard was not encoded (the
 * worker missed it) is zeroed whole by the wait. The payloads are those of a worker that does
 * not clear. */
static void s_check_clearing(bool ef)
{
    mq_model_t *m = s_model(), *m2 = s_model();
    size_t n = mq_model_nparams(m);
    float *buf = mq_model_grads(m), *ref = mq_model_grads(m2);
    mq_kv_worker_config_t cfg = s_worker_cfg(0, 2, "uniform", "sgd");
    cfg.error_feedback = ef;
    mq_kv_worker_t *kw = mq_kv_worker_new(m, &cfg), *plain = mq_kv_worker_new(m2, &cfg);
    cr_assert(kw && plain, "%s", mq_err_last());
    mq_kv_worker_set_clear(kw, true);
    for (size_t j = 0; j < n; j++)
        buf[j] = 7.0f, ref[j] = 0.0f;
    cr_assert_eq(mq_kv_worker_wait(kw, 1000), 0, "%s", mq_err_last());
    for (uint32_t s = 0; s < S_SERVERS; s++)
        for (uint32_t i = 0; i < mq_kv_worker_shard(kw, s)->nsegs; i++) {
            const mq_segment_t *seg = &mq_kv_worker_shard(kw, s)->segs[i];
            cr_assert(s_zero(buf, seg) || (ef && seg->quantized),
                      "%s: not zeroed before the first round", seg->name);
        }
    memset(buf, 0, n * sizeof *buf); /* error feedback's residual starts at zero */
    mq_tensor_hdr_t hdrs[MQ_WIRE_MAX_TENSORS], want_h[MQ_WIRE_MAX_TENSORS];
    mq_payload_t out[MQ_WIRE_MAX_TENSORS], want[MQ_WIRE_MAX_TENSORS];
    float *g = malloc(n * sizeof *g);
    cr_assert(g);
    for (int round = 0; round < 3; round++) {
        s_normal(g, n, 70 + round);
        for (size_t j = 0; j < n; j++) /* the backward adds onto what is there */
            buf[j] += g[j], ref[j] += g[j];
        mq_kv_worker_round(kw, (uint64_t)round), mq_kv_worker_round(plain, (uint64_t)round);
        /* round 1 sends shard 1 whole (32 bits); round 2 misses shard 1 */
        for (uint32_t s = 0; s < (round == 2 ? 1u : S_SERVERS); s++) {
            const mq_shard_t *sh = mq_kv_worker_shard(kw, s);
            int bits = round == 1 && s == 1 ? 32 : 3;
            cr_assert_eq(mq_kv_worker_encode(kw, s, buf, MQ_WIDTHS(bits), S_LR, hdrs, out, NULL,
                                             NULL),
                         0, "%s", mq_err_last());
            cr_assert_eq(mq_kv_worker_encode(plain, s, ref, MQ_WIDTHS(bits), S_LR, want_h,
                                             want, NULL, NULL),
                         0, "%s", mq_err_last());
            for (uint32_t i = 0; i < sh->nsegs; i++) {
                const mq_segment_t *seg = &sh->segs[i];
                bool fp32 = hdrs[i].codec.id == MQ_CODEC_ID_none;
                cr_assert(out[i].len == want[i].len &&
                              memcmp(out[i].data, want[i].data, out[i].len) == 0,
                          "round %d, %s: clearing changed the push", round, seg->name);
                if (ef && seg->quantized && !fp32)
                    cr_assert(!s_zero(buf, seg), "round %d, %s: the residual was cleared",
                              round, seg->name);
                else if (!fp32)
                    cr_assert(s_zero(buf, seg), "round %d, %s: not zero once encoded", round,
                              seg->name);
                else
                    cr_assert(!s_zero(buf, seg), "round %d, %s: zeroed while it is being sent",
                              round, seg->name);
            }
            s_drop(out, sh->nsegs), s_drop(want, sh->nsegs);
        }
        cr_assert_eq(mq_kv_worker_wait(kw, 1000), 0, "%s", mq_err_last());
        cr_assert_eq(mq_kv_worker_wait(plain, 1000), 0, "%s", mq_err_last());
        for (uint32_t s = 0; s < S_SERVERS; s++)
            for (uint32_t i = 0; i < mq_kv_worker_shard(kw, s)->nsegs; i++) {
                const mq_segment_t *seg = &mq_kv_worker_shard(kw, s)->segs[i];
                if (ef && seg->quantized) /* the residual, as a worker that does not clear */
                    cr_assert(memcmp(buf + seg->flat, ref + seg->flat,
                                     seg->count * sizeof *buf) == 0,
                              "round %d, %s: the residual differs", round, seg->name);
                else
                    cr_assert(s_zero(buf, seg), "round %d, %s: not zero for the next round",
                              round, seg->name);
                if (!(ef && seg->quantized)) /* what a model that writes its gradient sees */
                    memset(ref + seg->flat, 0, seg->count * sizeof *ref);
            }
    }
    mq_kv_worker_destroy(&kw), mq_kv_worker_destroy(&plain);
    free(g);
    mq_model_destroy(&m), mq_model_destroy(&m2);
}

Test(ps, kv_worker_clearing_leaves_a_zero_gradient_for_a_model_that_adds_onto_it)
{
    s_check_clearing(false);
}

Test(ps, kv_worker_clearing_keeps_error_feedbacks_residual)
{
    s_check_clearing(true);
}

/* Error feedback by hand: v = g + r, the push is Q(v), and r becomes v - Q(v) (the decoded
 * push subtracted from v), kept in place in the model's gradient buffer, which the module has
 * zeroed there and set to accumulate; fp32 segments are written over. A level of 32 bits
 * sends the sums whole, and their residual is zero for the next gradient. */
Test(ps, kv_worker_error_feedback_carries_what_the_push_left_out)
{
    mq_model_t *m = s_model();
    size_t n = mq_model_nparams(m);
    float *g = malloc(n * sizeof *g), *r = calloc(n, sizeof *r), *t = malloc(n * sizeof *t);
    float *buf = mq_model_grads(m);
    cr_assert(g && r && t);
    for (size_t j = 0; j < n; j++)
        buf[j] = 1.0f; /* an earlier gradient */
    mq_kv_worker_config_t cfg = s_worker_cfg(0, 2, "uniform", "sgd");
    cfg.error_feedback = true;
    mq_kv_worker_t *kw = mq_kv_worker_new(m, &cfg);
    cr_assert(kw, "%s", mq_err_last());
    const float *res = mq_kv_worker_residual(kw);
    cr_assert_eq(res, buf, "the residual is in the model's gradient buffer");
    mq_tensor_hdr_t hdrs[MQ_WIRE_MAX_TENSORS];
    mq_payload_t out[MQ_WIRE_MAX_TENSORS];
    cr_assert_eq(mq_kv_worker_encode(kw, 0, g, MQ_WIDTHS(3), S_LR, hdrs, out, NULL, NULL), -1,
                 "another array than the model's gradient");
    for (uint64_t it = 0; it < 4; it++) {
        int bits = it == 2 ? 32 : 3;
        cr_assert_eq(mq_kv_worker_wait(kw, 1000), 0, "%s", mq_err_last());
        for (uint32_t s = 0; s < S_SERVERS; s++)
            for (uint32_t i = 0; i < mq_kv_worker_shard(kw, s)->nsegs; i++) {
                const mq_segment_t *seg = &mq_kv_worker_shard(kw, s)->segs[i];
                for (size_t j = seg->flat; j < seg->flat + seg->count; j++)
                    cr_assert(!seg->quantized || res[j] == r[j],
                              "iteration %llu, %s: the residual before the gradient is not the "
                              "last v - Q(v)",
                              (unsigned long long)it, seg->name);
            }
        s_normal(g, n, 50 + it);
        s_put_gradient(kw, g, buf, true);
        double sq = 0, hand_sq = 0;
        for (uint32_t s = 0; s < S_SERVERS; s++) {
            const mq_shard_t *sh = mq_kv_worker_shard(kw, s);
            cr_assert_eq(mq_kv_worker_encode(kw, s, buf, MQ_WIDTHS(bits), S_LR, hdrs, out, &sq,
                                             NULL), 0, "%s",
                         mq_err_last());
            for (uint32_t i = 0; i < sh->nsegs; i++) {
                const mq_segment_t *seg = &sh->segs[i];
                if (!seg->quantized)
                    continue;
                float *v = r + seg->flat;
                for (size_t j = 0; j < seg->count; j++)
                    v[j] = g[seg->flat + j] + v[j];
                if (bits == 32) { /* sent whole: nothing left out */
                    cr_assert_eq(hdrs[i].codec.id, MQ_CODEC_ID_none);
                    memset(v, 0, seg->count * sizeof *v);
                    continue;
                }
                cr_assert_eq(mq_codec_decode(&hdrs[i].codec, out[i].data, out[i].len, v,
                                             seg->count, -1.0f, true, NULL),
                             0, "%s", mq_err_last());
                cr_assert_eq(mq_codec_decode(&hdrs[i].codec, out[i].data, out[i].len,
                                             t + seg->flat, seg->count, 1.0f, false, NULL),
                             0);
                for (size_t j = 0; j < seg->count; j++)
                    hand_sq += (double)t[seg->flat + j] * t[seg->flat + j];
                for (size_t j = 0; j < seg->count; j++)
                    cr_assert(res[seg->flat + j] == v[j],
                              "iteration %llu, %s: the residual is not v - Q(v)",
                              (unsigned long long)it, seg->name);
            }
            s_drop(out, sh->nsegs);
        }
        cr_assert_float_eq(sq, hand_sq, 1e-6 * hand_sq + 1e-300, "sent norm %g, by hand %g", sq,
                           hand_sq);
    }
    bool moved = false;
    for (size_t j = 0; j < n && !moved; j++)
        moved = r[j] != 0;
    cr_assert(moved, "a 3-bit push left nothing out");
    mq_kv_worker_destroy(&kw);
    free(g), free(r), free(t);
    mq_model_destroy(&m);
}

/* The module sets the model to add exactly the quantized tensors' gradients onto their
 * residual (a real step, twice on the same batch: those tensors hold about twice the
 * gradient, the others the gradient bit for bit), and back to writing them over when it is
 * destroyed. */
Test(ps, kv_worker_error_feedback_makes_the_model_accumulate_its_quantized_tensors)
{
    mq_model_t *m = s_model();
    size_t n = mq_model_nparams(m);
    float x[784], *once = malloc(n * sizeof *once);
    uint8_t y[1] = {3};
    for (int i = 0; i < 784; i++)
        x[i] = (float)((i * 37) % 101) / 101 - 0.5f;
    mq_model_grad(m, x, y, 1);
    memcpy(once, mq_model_grads(m), n * sizeof *once);
    mq_kv_worker_config_t cfg = s_worker_cfg(0, 2, "uniform", "sgd");
    cfg.error_feedback = true;
    mq_kv_worker_t *kw = mq_kv_worker_new(m, &cfg);
    cr_assert(kw, "%s", mq_err_last());
    mq_model_grad(m, x, y, 1);
    mq_model_grad(m, x, y, 1);
    const float *g = mq_model_grads(m);
    size_t nq = 0;
    for (uint32_t s = 0; s < S_SERVERS; s++)
        for (uint32_t i = 0; i < mq_kv_worker_shard(kw, s)->nsegs; i++) {
            const mq_segment_t *seg = &mq_kv_worker_shard(kw, s)->segs[i];
            nq += seg->quantized;
            for (size_t j = seg->flat; j < seg->flat + seg->count; j++)
                if (seg->quantized)
                    cr_assert_float_eq(g[j], 2 * once[j], 1e-5 * fabsf(once[j]) + 1e-12,
                                       "%s: %g is not twice %g", seg->name, g[j], once[j]);
                else
                    cr_assert(memcmp(&g[j], &once[j], sizeof *g) == 0, "%s was not written over",
                              seg->name);
        }
    cr_assert_gt(nq, 0, "the plan quantizes something");
    mq_kv_worker_destroy(&kw);
    mq_model_grad(m, x, y, 1);
    cr_assert(memcmp(mq_model_grads(m), once, n * sizeof *once) == 0,
              "once the module is gone the model writes its gradients over again");
    free(once);
    mq_model_destroy(&m);
}

Test(ps, kv_worker_cuts_with_the_servers_slicer)
{
    mq_model_t *m = s_model();
    mq_kv_worker_config_t cfg = s_worker_cfg(0, 2, "uniform", "sgd");
    cfg.slicer = s_by_tensor;
    mq_kv_worker_t *kw = mq_kv_worker_new(m, &cfg);
    cr_assert(kw, "%s", mq_err_last());
    for (uint32_t s = 0; s < S_SERVERS; s++) {
        mq_kv_config_t sc = {.servers = S_SERVERS, .rank = s, .workers = 2,
                             .threshold = S_THRESHOLD, .codec = s_parse("uniform"),
                             .optim = s_optim("sgd"), .slicer = s_by_tensor};
        mq_kv_t *kv = mq_kv_new(m, &sc);
        cr_assert(kv, "%s", mq_err_last());
        const mq_shard_t *a = mq_kv_worker_shard(kw, s), *b = mq_kv_shard(kv);
        cr_assert_eq(a->nsegs, b->nsegs);
        for (uint32_t i = 0; i < a->nsegs; i++) {
            cr_assert_eq(a->segs[i].tensor, b->segs[i].tensor);
            cr_assert_eq(a->segs[i].tensor % S_SERVERS, s, "whole tensors in turn");
            cr_assert_eq(a->segs[i].flat, b->segs[i].flat);
            cr_assert_eq(a->segs[i].count, b->segs[i].count);
            cr_assert_eq(a->segs[i].quantized, b->segs[i].quantized);
        }
        mq_kv_destroy(&kv);
    }
    mq_kv_worker_destroy(&kw);
    s_cluster_run(2, "uniform:stochastic", 6, "sgd", false, s_by_tensor);

    cfg.slicer = s_overflowing;
    cr_assert_null(mq_kv_worker_new(m, &cfg), "a segment past its tensor");
    cr_assert(strstr(mq_err_last(), "not a range of one tensor"), "%s", mq_err_last());
    cfg.slicer = NULL;
    cfg.rank = 2;
    cr_assert_null(mq_kv_worker_new(m, &cfg), "rank 2 of 2");
    mq_model_destroy(&m);
}
