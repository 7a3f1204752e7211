/* Writes the seed corpus of every fuzz target from the project's own encoders and writers:
 *   gen_corpus OUT_DIR     -> OUT_DIR/<target>/<seed>
 * Wire messages are sent with mq_wire_send and captured as the frames a ROUTER receives;
 * codec payloads come from mq_codec_encode_ctx; agent states from mq_agent_state_pack and
 * mq_policy_save (and the version 1 states the tests keep); shard checkpoints from
 * mq_ckpt_write; run files from mq_runlog_*, mq_sched_config_json and mq_sched_ckpt_write.
 * Everything is seeded, so a run writes the same files. tests/fuzz/gen_corpus.sh runs it. */
#include <czmq.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../rl_v1_fixtures.h"
#include "agent_internal.h"
#include "gen_seeds.h"
#include "mqgrad/checkpoint.h"
#include "mqgrad/quant.h"
#include "mqgrad/rl.h"
#include "mqgrad/runlog.h"
#include "mqgrad/util.h"
#include "mqgrad/wire.h"
#include "scheduler.h"
#include "scheduler_internal.h"

static const char *s_out;
static int s_count;

static void s_die(const char *what)
{
    fprintf(stderr, "gen_corpus: %s: %s\n", what, mq_err_last());
    exit(1);
}

static void s_seed(const char *target, const char *name, const void *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", s_out, target);
    if (mq_mkdirs(path) != 0)
        s_die(path);
    snprintf(path, sizeof path, "%s/%s/%s", s_out, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "gen_corpus: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    s_count++;
}

/* Gradient-like values: mostly small, a few large, some exact zeros (every ZEROS-th). */
static void s_values(float *x, size_t n, uint64_t seed, int zeros)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(0.01 * mq_rng_normal(&rng));
        if (i % 97 == 3)
            x[i] *= 40.0f;
        if (zeros > 1 && i % (size_t)zeros != 0)
            x[i] = 0.0f;
    }
}

/* Encodes N values with codec C into a malloc'd payload. */
static uint8_t *s_encode(const mq_codec_t *c, size_t n, uint64_t seed, size_t *len)
{
    float *x = malloc(n * sizeof *x), *state = calloc(mq_codec_state_floats(c, n) + 1, 4);
    size_t cap = mq_codec_payload_size(c, n) + 16;
    uint8_t *buf = malloc(cap);
    if (!x || !state || !buf)
        s_die("out of memory");
    s_values(x, n, seed, c->id == MQ_CODEC_ID_sparse ? 10 : 0);
    mq_rng_t rng;
    mq_rng_seed(&rng, seed + 1);
    mq_codec_ctx_t ctx = {.rng = &rng, .state = state, .lr = 0.05f};
    if (mq_codec_encode_ctx(c, x, n, &ctx, buf, cap, len, NULL) != 0)
        s_die("encode");
    free(x);
    free(state);
    return buf;
}

/* ---- fuzz_codec --------------------------------------------------------------------- */

static const char *const s_specs[] = {
    "none",          "uniform:1",        "uniform:2",      "uniform:4",
    "uniform:8:bucket=0", "uniform:3:bucket=64:stochastic", "qsgd:2", "qsgd:4:bucket=128",
    "terngrad",      "terngrad:bucket=64:clip=2.5", "topk:ratio=0.01", "topk:ratio=0.5",
    "dgc",           "dgc:ratio=0.1:momentum=0.9", "sign",  "sign:bucket=64",
    "onebit",        "onebit:bucket=32", "thresh",         "thresh:k=2",
    "sdagc",         "sdagc:revise=0",   "sparse",
};

/* The codec of SPEC at a level (those that take one and were given none get 4). */
static int s_codec(const char *spec, mq_codec_t *c)
{
    if (mq_codec_parse(spec, c) != 0) {
        fprintf(stderr, "gen_corpus: skipping codec '%s': %s\n", spec, mq_err_last());
        return -1;
    }
    const mq_codec_ops_t *ops = mq_codec_ops(c);
    if (ops->max_bits > 0 && c->bits == 0)
        *c = mq_codec_with_bits(c, ops->min_bits > 4 ? ops->min_bits : 4);
    return 0;
}

static void s_codec_seeds(void)
{
    static const size_t ns[] = {5, 300};
    size_t ncodecs;
    const mq_codec_ops_t *const *all = mq_codec_all(&ncodecs);
    for (size_t s = 0; s < sizeof s_specs / sizeof *s_specs; s++) {
        mq_codec_t c;
        if (s_codec(s_specs[s], &c) != 0)
            continue;
        size_t index = 0;
        while (index < ncodecs && all[index]->id != c.id)
            index++;
        for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
            size_t n = ns[k], len;
            uint8_t *payload = s_encode(&c, n, 100 + s * 10 + k, &len);
            uint8_t *in = calloc(1, 32 + len);
            if (!in)
                s_die("out of memory");
            in[0] = (uint8_t)index;
            in[1] = (uint8_t)c.bits;
            in[2] = 1; /* re-encode */
            for (int b = 0; b < 4; b++)
                in[4 + b] = (uint8_t)(n >> (8 * b));
            for (int w = 0; w < MQ_CODEC_NPARAMS; w++)
                for (int b = 0; b < 4; b++)
                    in[8 + 4 * w + b] = (uint8_t)(c.param[w] >> (8 * b));
            memcpy(in + 32, payload, len);
            char name[160], spec[MQ_CODEC_MAX_SPEC];
            mq_codec_format(&c, spec, sizeof spec);
            for (char *p = spec; *p; p++)
                *p = *p == ':' || *p == '=' ? '-' : *p;
            snprintf(name, sizeof name, "%s-n%zu", spec, n);
            s_seed("fuzz_codec", name, in, 32 + len);
            free(in);
            free(payload);
        }
    }
}

/* Codecs the fuzzer found valid whose spec read back as another codec (fixed since). */
static void s_codec_regressions(void)
{
    static const struct {
        const char *name;
        uint32_t id, param[MQ_CODEC_NPARAMS];
    } cases[] = {
        {"regress-none-param-word", MQ_CODEC_ID_none, {0, 0, 0, 0, 0xfa00, 0}},
        {"regress-dgc-clip-minus-zero", MQ_CODEC_ID_dgc,
         {0x3dcccccd, 0x3f666666, 0x80000000, 0x3c23d70a, 0, 0}},
        {"regress-sdagc-clip-above-spec", MQ_CODEC_ID_sdagc,
         {0x40528f5c, 0x3f666666, 0x7a000031, 0x3f800000, 0, 0}},
        {"regress-thresh-default-k-word", MQ_CODEC_ID_thresh, {0, 0x40000000, 0, 0, 0, 0}},
    };
    size_t ncodecs;
    const mq_codec_ops_t *const *all = mq_codec_all(&ncodecs);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint8_t in[32] = {0};
        while (in[0] < ncodecs && all[in[0]]->id != cases[i].id)
            in[0]++;
        in[2] = 1;
        in[4] = 5; /* n = 5, no payload */
        for (int w = 0; w < MQ_CODEC_NPARAMS; w++)
            for (int b = 0; b < 4; b++)
                in[8 + 4 * w + b] = (uint8_t)(cases[i].param[w] >> (8 * b));
        s_seed("fuzz_codec", cases[i].name, in, sizeof in);
    }
}

/* ---- fuzz_wire ---------------------------------------------------------------------- */

static zsock_t *s_router, *s_dealer;

/* Sends MSG (with the payloads) and writes what the ROUTER receives, without the routing
 * id, in fuzz_wire's framing. */
static void s_wire(const char *name, mq_msg_t *msg, const mq_payload_t *p, size_t np)
{
    if (mq_wire_send(s_dealer, msg, p, np) != 0)
        s_die(name);
    void *h = zsock_resolve(s_router);
    size_t cap = 1 << 20, len = 0;
    uint8_t *out = malloc(cap);
    bool more = true, first = true;
    while (more) {
        zmq_msg_t f;
        zmq_msg_init(&f);
        if (zmq_msg_recv(&f, h, 0) < 0)
            s_die("receive");
        more = zmq_msg_more(&f);
        size_t n = zmq_msg_size(&f);
        if (!first) {
            if (n > 65535 || len + 2 + n > cap)
                s_die("a frame too large for the seed format");
            out[len++] = (uint8_t)n;
            out[len++] = (uint8_t)(n >> 8);
            memcpy(out + len, zmq_msg_data(&f), n);
            len += n;
        }
        first = false;
        zmq_msg_close(&f);
    }
    s_seed("fuzz_wire", name, out, len);
    free(out);
}

/* A member set of N ranks (1, 3, 5, ...) into SET and *NSET. */
/* A set of N ranks (1, 3, 5, ...) in SET's own array (room for 8), which LIST points at. */
static void s_members(uint32_t *set, uint32_t **list, uint32_t *nset, uint32_t n)
{
    *nset = n;
    for (uint32_t i = 0; i < n; i++)
        set[i] = 2 * i + 1;
    *list = set;
}

/* One message of every type, and a PUSH per codec. */
static void s_wire_seeds(void)
{
    s_router = zsock_new(ZMQ_ROUTER);
    s_dealer = zsock_new(ZMQ_DEALER);
    mq_wire_prepare(s_router, 0, MQ_WIRE_MAX_MSG);
    mq_wire_prepare(s_dealer, 0, MQ_WIRE_MAX_MSG);
    zsock_set_rcvtimeo(s_router, 2000);
    if (zsock_bind(s_router, "%s", "inproc://gen-corpus") != 0 ||
        zsock_connect(s_dealer, "%s", "inproc://gen-corpus") != 0)
        s_die("inproc pair");
    mq_wire_set_run_id(0x1234abcd5678ef00ULL);
    static mq_msg_t m;
    for (int t = MQ_MSG_REGISTER; t < MQ_MSG_COUNT_; t++) {
        mq_msg_init(&m, (mq_msg_type_t)t);
        m.iter = 41;
        m.rank = 1;
        m.incarnation = 7;
        switch ((mq_msg_type_t)t) {
        case MQ_MSG_REGISTER:
            m.role = MQ_ROLE_SERVER;
            snprintf(m.register_.endpoint, sizeof m.register_.endpoint, "tcp://127.0.0.1:7101");
            m.register_.prefer_shard = 2;
            break;
        case MQ_MSG_WELCOME: {
            static mq_scheduler_config_t cfg;
            char *argv[] = {"gen", "--servers", "2", "--workers", "3", "--codec", "uniform",
                            "--optimizer", "momentum", "--run-dir", "/nonexistent", NULL};
            if (mq_scheduler_config_parse(&cfg, 11, argv) != 0)
                s_die("scheduler flags");
            mq_welcome_t *w = &m.welcome;
            mq_sched_run_config(&cfg, &w->config);
            w->rank = 1;
            w->has_token = true;
            memset(w->token, 0x5a, sizeof w->token);
            w->term = 1;
            static char servers[2][MQ_WIRE_MAX_TEXT] = {"tcp://127.0.0.1:7100",
                                                        "tcp://127.0.0.1:7101"};
            w->n_servers = 2;
            w->servers = servers;
            break;
        }
        case MQ_MSG_ITERATE: {
            mq_iterate_t *it = &m.iterate;
            *it = (mq_iterate_t){.bits = 4, .lr = 0.05f, .evaluate = true, .eval_limit = 1000,
                                 .view = 1, .cursor = 4096, .checkpoint = true, .keep_from = 20,
                                 .run_time = 31.5};
            m.sim_time = 12.5;
            static uint32_t members[8], terms[8];
            s_members(members, &it->members, &it->n_members, 4);
            s_members(terms, &it->member_terms, &it->n_member_terms, 4);
            it->member = 1; /* and a worker's own place in it, as the scheduler sends it */
            it->nmembers = 4;
            break;
        }
        case MQ_MSG_HAVE:
        case MQ_MSG_COMMIT:
        case MQ_MSG_PROGRESS: /* one body type, one place: m.have is m.commit and m.progress */
            m.have.shard = 1;
            m.have.view = 2;
            m.sim_time = 12.5;
            static uint32_t have[8];
            s_members(have, &m.have.members, &m.have.n_members, 4);
            break;
        case MQ_MSG_REPORT:
            m.report = (mq_report_t){.loss = 1.25, .grad_sqmean = 1e-4, .grad_range = 0.5,
                                     .compute_ms = 80, .encode_ms = 3, .wait_ms = 20,
                                     .decode_ms = 2, .update_ms = 1, .bytes_up = 123456,
                                     .bytes_down = 234567, .evaluated = true,
                                     .eval_correct = 870, .eval_total = 1000,
                                     .eval_loss_sum = 400, .eval_ms = 300, .grad_sq = 3,
                                     .sent_sq = 3.1, .update_sq = 2.9, .zero_params = 10,
                                     .params = 56074};
            break;
        case MQ_MSG_OBSERVE:
            m.observe = (mq_obs_msg_t){.loss = 1.1, .iter_ms = 210, .grad_sqmean = 1e-4,
                                       .grad_range = 0.4, .total_iters = 1000, .progress = 0.04,
                                       .bits = 4, .loss_smoothed = 1.2, .grad_norm = 2,
                                       .sent_norm = 2.1, .update_norm = 1.9};
            break;
        case MQ_MSG_STATUS:
        case MQ_MSG_DECISION: /* the same body type: one member for both */
            m.status = (mq_status_msg_t){.bits = 5, .step = 8, .iter = 41, .observations = 42,
                                         .last_reward = -3.5, .n_q_values = 7, .decisions = 8,
                                         .min_bits = 2};
            snprintf(m.status.policy, sizeof m.status.policy, "mqgrad");
            for (int q = 0; q < 7; q++)
                m.status.q_values[q] = -1.0 - q;
            break;
        case MQ_MSG_POLICY_SET:
            snprintf(m.policy_set.policy, sizeof m.policy_set.policy, "fixed:4");
            break;
        case MQ_MSG_ERROR:
        case MQ_MSG_STOP: {
            mq_reason_t *r = t == MQ_MSG_ERROR ? &m.error : &m.stop;
            snprintf(r->reason, sizeof r->reason, "rank taken");
            r->retry = t == MQ_MSG_ERROR;
            break;
        }
        case MQ_MSG_SAVED:
            m.saved.shard = 1;
            snprintf(m.saved.error, sizeof m.saved.error, "disk full");
            break;
        case MQ_MSG_HEARTBEAT:
            m.heartbeat.pushed = 41;
            break;
        case MQ_MSG_PUSH:
            m.push = (mq_push_t){.shard = 1, .bits = 4, .lr = 0.05f};
            break;
        case MQ_MSG_AGGREGATE:
        case MQ_MSG_PULL:
        case MQ_MSG_PARAMS:
        case MQ_MSG_SEED: /* one body type, one place */
            m.aggregate.shard = 1;
            break;
        default:
            break;
        }
        char name[64];
        snprintf(name, sizeof name, "%s", mq_msg_type_name((mq_msg_type_t)t));
        s_wire(name, &m, NULL, 0);
    }
    /* pushes, aggregates and params with payloads */
    for (size_t s = 0; s < sizeof s_specs / sizeof *s_specs; s++) {
        mq_codec_t c;
        if (s_codec(s_specs[s], &c) != 0)
            continue;
        mq_msg_init(&m, s % 2 ? MQ_MSG_AGGREGATE : MQ_MSG_PUSH);
        m.iter = 41;
        m.rank = 1;
        if (m.type == MQ_MSG_PUSH)
            m.push = (mq_push_t){.shard = 0, .bits = (uint32_t)c.bits, .lr = 0.05f};
        else
            m.aggregate.shard = 0;
        m.ntensors = 2;
        size_t len[2];
        uint8_t *buf[2];
        mq_codec_t codecs[2] = {c, mq_codec_none()};
        size_t count[2] = {200, 10};
        const char *names[2] = {"fc1.w", "fc1.b"};
        mq_payload_t p[2];
        for (int k = 0; k < 2; k++) {
            buf[k] = s_encode(&codecs[k], count[k], 7 + s + (size_t)k, &len[k]);
            snprintf(m.tensors[k].name, sizeof m.tensors[k].name, "%s", names[k]);
            m.tensors[k].offset = 100 * (uint64_t)k;
            m.tensors[k].count = count[k];
            m.tensors[k].codec = codecs[k];
            p[k] = (mq_payload_t){.data = buf[k], .len = len[k]};
        }
        char name[160], spec[MQ_CODEC_MAX_SPEC];
        mq_codec_format(&c, spec, sizeof spec);
        for (char *q = spec; *q; q++)
            *q = *q == ':' || *q == '=' ? '-' : *q;
        snprintf(name, sizeof name, "%s-%s", mq_msg_type_name(m.type), spec);
        s_wire(name, &m, p, 2);
        free(buf[0]);
        free(buf[1]);
    }
    zsock_destroy(&s_dealer);
    zsock_destroy(&s_router);
    mq_wire_thread_cleanup();
}

/* ---- fuzz_agent_state --------------------------------------------------------------- */

static mq_policy_t *s_policy(const char *spec, int observations)
{
    mq_policy_t *p = mq_policy_new(spec, NULL);
    if (!p)
        s_die(spec);
    for (int m = 0; m < observations; m++) {
        mq_observation_t o = {.iter = (uint64_t)m, .loss = 2.0 / (1 + 0.1 * m),
                              .iter_ms = 10 + m % 3, .grad_sqmean = 1, .grad_range = 10,
                              .total_iters = 100, .progress = m / 100.0, .bits = 4,
                              .loss_smoothed = 2.0 / (1 + 0.1 * m), .grad_norm = 1,
                              .sent_norm = 1.05, .update_norm = 0.95};
        if (mq_policy_observe(p, &o) < 0)
            s_die(spec);
    }
    return p;
}

static void s_name(char *buf, size_t len, const char *prefix, const char *spec, int obs)
{
    snprintf(buf, len, "%s-%s-%d", prefix, spec, obs);
    for (char *p = buf; *p; p++)
        *p = *p == ':' || *p == '=' || *p == ',' ? '-' : *p;
}

static void s_agent_seeds(void)
{
    static const char *const specs[] = {"mqgrad", "mqgrad:T=2,hidden=2,max=4", "fixed:4",
                                        "adaptive", "schedule", "dqsgd", "dqsgd:bits=4",
                                        "learned", "learned:every=1"};
    static const int obs[] = {0, 23};
    for (size_t s = 0; s < sizeof specs / sizeof *specs; s++)
        for (size_t k = 0; k < sizeof obs / sizeof *obs; k++) {
            mq_policy_t *p = s_policy(specs[s], obs[k]);
            if (k == 1 && mq_policy_episodic(p)) { /* a closed episode: returns kept */
                mq_policy_new_episode(p);
                for (int m = 0; m < 9; m++) {
                    mq_observation_t o = {.iter = (uint64_t)m, .loss = 1.0, .iter_ms = 12,
                                          .bits = 4, .grad_norm = 1, .sent_norm = 1};
                    mq_policy_observe(p, &o);
                }
            }
            mq_agent_counters_t c = {.decisions = 3, .observations = (uint64_t)obs[k],
                                     .swaps = 1, .fallbacks = 2};
            uint8_t *buf;
            size_t len;
            char name[128];
            if (mq_agent_state_pack(p, NULL, &c, &buf, &len) != 0)
                s_die("pack");
            s_name(name, sizeof name, "state", specs[s], obs[k]);
            s_seed("fuzz_agent_state", name, buf, len);
            free(buf);
            if (mq_policy_save(p, &buf, &len) != 0)
                s_die("save");
            s_name(name, sizeof name, "policy", specs[s], obs[k]);
            s_seed("fuzz_agent_state", name, buf, len);
            free(buf);
            mq_policy_destroy(&p);
        }
    /* a swapped-to policy with the mqgrad one stashed */
    mq_policy_t *cur = s_policy("fixed:6", 5), *stash = s_policy("mqgrad", 12);
    mq_agent_counters_t c = {.decisions = 9, .observations = 17, .swaps = 2};
    uint8_t *buf;
    size_t len;
    if (mq_agent_state_pack(cur, stash, &c, &buf, &len) != 0)
        s_die("pack");
    s_seed("fuzz_agent_state", "state-fixed-with-stash", buf, len);
    free(buf);
    mq_policy_destroy(&cur);
    mq_policy_destroy(&stash);
    /* the version 1 states the tests keep */
    s_seed("fuzz_agent_state", "policy-v1-mqgrad", s_v1_mqgrad, sizeof s_v1_mqgrad);
    s_seed("fuzz_agent_state", "policy-v1-fixed", s_v1_fixed, sizeof s_v1_fixed);
}

/* ---- fuzz_ckpt ---------------------------------------------------------------------- */

static void s_copy_file(const char *path, const char *target, const char *name)
{
    char *data;
    size_t len;
    if (mq_read_file(path, &data, &len) != 0)
        s_die(path);
    s_seed(target, name, data, len);
    free(data);
}

static void s_ckpt_seeds(const char *tmp)
{
    float params[MQ_FUZZ_SEED_CKPT_N], state[MQ_FUZZ_SEED_CKPT_NSTATE];
    s_values(params, MQ_FUZZ_SEED_CKPT_N, 5, 0);
    s_values(state, MQ_FUZZ_SEED_CKPT_NSTATE, 6, 0);
    mq_ckpt_meta_t m;
    mq_fuzz_seed_ckpt_meta(&m);
    char path[1024];
    if (mq_ckpt_write(tmp, &m, params, MQ_FUZZ_SEED_CKPT_N, state,
                      MQ_FUZZ_SEED_CKPT_NSTATE, 0) != 0)
        s_die("checkpoint");
    mq_ckpt_path(tmp, &m, path, sizeof path);
    s_copy_file(path, "fuzz_ckpt", "momentum-48-48");
    /* plain SGD keeps no state; another shard and size (read by its own header's values) */
    m.shard = 0;
    m.iter = 300;
    snprintf(m.optimizer, sizeof m.optimizer, "sgd");
    if (mq_ckpt_write(tmp, &m, params, 16, NULL, 0, 0) != 0)
        s_die("checkpoint");
    mq_ckpt_path(tmp, &m, path, sizeof path);
    s_copy_file(path, "fuzz_ckpt", "sgd-16-0");
}

/* ---- fuzz_runfiles ------------------------------------------------------------------ */

/* Packs DIR's run files as a fuzz_runfiles input. */
static void s_pack_run(const char *dir, const char *name)
{
    static const char *const names[] = MQ_FUZZ_RUN_FILES;
    size_t cap = 1 << 20, len = 1;
    uint8_t *out = calloc(1, cap);
    for (int k = 0; k < MQ_FUZZ_NRUN_FILES; k++) {
        char path[1024], *data = NULL;
        size_t n = 0;
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        if (access(path, F_OK) == 0) {
            if (mq_read_file(path, &data, &n) != 0)
                s_die(path);
            out[0] |= (uint8_t)(1u << k);
        }
        if (len + n + 1 > cap)
            s_die("run files too large");
        if (n)
            memcpy(out + len, data, n);
        len += n;
        out[len++] = 0;
        free(data);
    }
    s_seed("fuzz_runfiles", name, out, len);
    free(out);
}

static void s_run(const char *tmp, const char *name, const char *policy, bool diverged,
                  bool checkpoint)
{
    char dir[1024], cmd[1100];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    static mq_scheduler_config_t cfg;
    bool fp32 = strcmp(policy, "none") == 0;
    char *argv[] = {"gen", "--model", "small", "--iterations", "40", "--eval-every", "10",
                    "--codec", fp32 ? "none" : "uniform", "--run-dir", dir, NULL};
    if (mq_scheduler_config_parse(&cfg, 11, argv) != 0)
        s_die("scheduler flags");
    char json[2048];
    if (mq_sched_config_json(&cfg, json, sizeof json) != 0)
        s_die("config.json");
    mq_runlog_t *log = mq_runlog_new(dir, json);
    if (!log)
        s_die(dir);
    int rows = diverged ? 25 : 40;
    for (int i = 1; i <= rows; i++) {
        mq_metrics_row_t r = {.iter = (uint64_t)i, .train_time_s = 0.2 * i,
                              .loss = 2.0 / (1 + 0.1 * i), .smoothed_loss = 2.1 / (1 + 0.1 * i),
                              .bits = fp32 ? 32 : 2 + i / 10, .bytes_up = 100000,
                              .bytes_down = 100000, .compute_ms = 80, .encode_ms = 3,
                              .wait_ms = 12, .decode_ms = 2, .update_ms = 1, .agent_ms = 0.5,
                              .evaluated = i % 10 == 0, .test_acc = 0.5 + i / 100.0,
                              .test_loss = 1.0, .workers = 2, .stragglers = i == 7,
                              .slowest_rank = 1, .slowest_ms = 95};
        if (mq_runlog_row(log, &r) != 0)
            s_die("row");
    }
    mq_summary_t s = {.iterations = (uint64_t)rows, .train_time_s = 0.2 * rows,
                      .final_loss = 0.5, .final_test_acc = diverged ? NAN : 0.9,
                      .final_sparsity = 0.01, .bytes_up = 4000000, .bytes_down = 4000000,
                      .policy = policy, .model = "small", .dataset = "fashion-mnist",
                      .workers = 2, .servers = 2, .seed = 1, .link_mbps = 3000,
                      .clock = "real", .wall_time_s = 9.5,
                      .status = diverged ? "diverged" : "completed"};
    if (diverged) {
        s.divergence_rule = "loss";
        s.divergence_iter = 25;
        s.divergence_detail = "smoothed loss 9.1 above 2 x its best 0.8 for 20 iterations";
    }
    if (mq_runlog_summary(log, &s) != 0)
        s_die("summary");
    mq_runlog_destroy(&log);
    if (checkpoint) {
        mq_sched_ckpt_t ck = {.iter = 30, .cursor = 1920, .lineage = 0x5eed00000000c0deULL,
                              .servers = 2, .bits = 5, .train_time_s = 6, .wall_time_s = 7,
                              .bytes_up = 3000000, .bytes_down = 3000000, .fallbacks = 1,
                              .last_acc = 0.8, .acc_iter = 30, .last_loss = 0.6,
                              .last_sparsity = NAN, .smoothed = 0.62, .best = 0.6,
                              .best_acc = 0.8, .seen = 30};
        snprintf(ck.model, sizeof ck.model, "small");
        snprintf(ck.policy, sizeof ck.policy, "%s", policy);
        if (mq_sched_ckpt_write(dir, &ck) != 0)
            s_die("checkpoint.json");
        char args[1024];
        snprintf(args, sizeof args, "%s/local.args", dir);
        const char *text = "--workers\n2\n--servers\n2\n--model\nsmall\n--iterations\n40\n"
                           "--policy\nfixed:4\n--codec\nuniform\n--checkpoint-every\n10\n";
        if (mq_write_file_atomic(args, text, strlen(text)) != 0)
            s_die(args);
    }
    s_pack_run(dir, name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        s_die(cmd);
}

/* checkpoint.json with numbers no integer field holds (resume.c cast them unchecked). */
static void s_runfiles_regression(void)
{
    static const char ck[] =
        "{\n  \"iter\": 1e300,\n  \"cursor\": 1920,\n  \"lineage\": \"5eed00000000c0de\",\n"
        "  \"servers\": 2,\n  \"model\": \"small\",\n  \"bits\": 4,\n"
        "  \"train_time_s\": 1,\n  \"wall_time_s\": 1,\n  \"bytes_up\": null,\n"
        "  \"bytes_down\": 1e40,\n  \"fallbacks\": 0,\n  \"last_acc\": null,\n"
        "  \"acc_iter\": null,\n  \"last_loss\": null,\n  \"last_sparsity\": null,\n"
        "  \"smoothed_loss\": null,\n  \"best_loss\": null,\n  \"best_acc\": null,\n"
        "  \"seen\": 0,\n  \"policy\": \"mqgrad\"\n}\n";
    uint8_t in[sizeof ck + 8] = {1u << 3}; /* checkpoint.json alone, after three empty files */
    memcpy(in + 4, ck, sizeof ck); /* its NUL ends it */
    s_seed("fuzz_runfiles", "regress-checkpoint-out-of-range", in, 4 + sizeof ck);
}

static void s_runfiles_seeds(const char *tmp)
{
    s_runfiles_regression();
    s_run(tmp, "completed-mqgrad", "mqgrad", false, true);
    s_run(tmp, "diverged-fixed", "fixed:2", true, false);
    s_run(tmp, "completed-fp32", "none", false, true);
}

/* ---- fuzz_flags --------------------------------------------------------------------- */

/* One input: SELECTOR, then the strings, each ended by NUL. */
static void s_flags(const char *name, int selector, const char *const *args)
{
    uint8_t out[4096];
    size_t len = 0;
    out[len++] = (uint8_t)selector;
    for (; *args; args++) {
        size_t n = strlen(*args) + 1;
        if (len + n > sizeof out)
            s_die("flags seed too long");
        memcpy(out + len, *args, n);
        len += n;
    }
    s_seed("fuzz_flags", name, out, len);
}

static void s_flags_seeds(void)
{
    s_flags("scheduler", 0,
            (const char *const[]){"--workers", "4", "--servers", "2", "--model", "small",
                                  "--codec", "uniform", "--bucket", "512", "--stochastic",
                                  "--iterations", "1000", "--eval-every", "100", "--lr=0.05",
                                  "--lr-decay", "0.3", "--stragglers", "deadline:0.5",
                                  "--agent", "tcp://127.0.0.1:7200", "--link-mbps", "3000",
                                  "--clock", "simulated", "MQGRAD_SEED=7",
                                  "MQGRAD_INSECURE=1", NULL});
    s_flags("scheduler-env", 0,
            (const char *const[]){"MQGRAD_CODEC=qsgd:4", "MQGRAD_OPTIMIZER=momentum:m=0.9",
                                  "MQGRAD_TIME_BUDGET=600", "MQGRAD_MAX_WORKERS=8",
                                  "--stragglers=first:3", "--guard-spike", "1.5", "--resume",
                                  "--error-feedback=false", "MQGRAD_INSECURE=true", NULL});
    s_flags("scheduler-help", 0, (const char *const[]){"--help", NULL});
    s_flags("server", 1,
            (const char *const[]){"--scheduler", "tcp://127.0.0.1:7000", "--bind",
                                  "tcp://*:7100", "--checkpoint-dir", "/var/lib/mqgrad",
                                  "MQGRAD_PEER_TIMEOUT=30", "MQGRAD_INSECURE=1", NULL});
    s_flags("worker", 2,
            (const char *const[]){"--threads", "2", "--data-dir",
                                  "/usr/share/datasets/fashion-mnist", "--iter-timeout=60",
                                  "MQGRAD_SCHEDULER=tcp://sched:7000", "MQGRAD_INSECURE=1",
                                  NULL});
    s_flags("agent", 3,
            (const char *const[]){"--policy", "mqgrad:T=10,epsilon=0.05", "--min-bits", "2",
                                  "--max-bits", "8", "--state", "/var/lib/agent.state",
                                  "--fresh", "--gamma=300", "--http-port", "0",
                                  "MQGRAD_INSECURE=1", NULL});
    s_flags("agent-env", 3,
            (const char *const[]){"MQGRAD_POLICY=learned:every=2", "MQGRAD_SEED=3", "--T",
                                  "8", "--log-level", "debug", "MQGRAD_INSECURE=1", NULL});
    s_flags("local", 4,
            (const char *const[]){"--workers", "4", "--servers", "2", "--policy", "fixed:4",
                                  "--codec", "topk:ratio=0.01", "--optimizer", "momentum",
                                  "--iterations", "100", "--clock", "simulated",
                                  "--agent-args", "--epsilon 0.05", "--quiet", NULL});
    s_flags("specs", 5,
            (const char *const[]){"uniform:4:bucket=512", "qsgd:3", "topk:ratio=0.01",
                                  "dgc:ratio=0.1:momentum=0.9:clip=1", "thresh:tau=0.5",
                                  "sdagc:c=2:revise=1", "terngrad:clip=2.5", "mqgrad",
                                  "fixed:4", "dqsgd:k=3,alpha=0.9", "learned:every=2,frozen",
                                  "schedule", "adaptive:tau=0.2", "momentum:m=0.9",
                                  "qrda:l1=1e-6,delta=1e-8,scale=1", "adagrad",
                                  "mqgrad+exact", "fixed:2@qsgd/momentum", "deadline:0.5",
                                  "first:3", "wait", "warn", NULL});
    s_flags("numbers", 6,
            (const char *const[]){"0", "-1", "1e308", "0x10", "9223372036854775807", "nan",
                                  "inf", " 5", "5 ", "1e-9", "-0", "4096", NULL});
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_corpus OUT_DIR\n");
        return 2;
    }
    s_out = argv[1];
    zsys_handler_set(NULL);
    mq_log_set_level(MQ_LOG_ERROR);
    setenv("MQGRAD_INSECURE", "1", 1); /* the scheduler's flags ask for keys otherwise */
    char tmp[] = "/tmp/mqgrad-gen-corpus-XXXXXX";
    if (!mkdtemp(tmp))
        s_die("mkdtemp");
    s_codec_seeds();
    s_codec_regressions();
    s_wire_seeds();
    s_agent_seeds();
    s_ckpt_seeds(tmp);
    s_runfiles_seeds(tmp);
    s_flags_seeds();
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        s_die(cmd);
    printf("gen_corpus: %d seeds in %s\n", s_count, s_out);
    return 0;
}
