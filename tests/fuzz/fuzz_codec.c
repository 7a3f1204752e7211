/* fuzz_codec: every registered codec's decode side (mq_codec_all), as a service meets it: the
 * codec of a tensor header (id, level, parameter words) checked with mq_codec_validate, the
 * payload's size and content with mq_codec_validate_payload, then mq_codec_decode_valid.
 *
 * Input: a 32-byte header, then the payload.
 *   [0] codec (index into mq_codec_all, modulo their number)
 *   [1] level (bits; none always gets 32, as the wire gives it)
 *   [2] flags: 1 = also re-encode what was decoded            [3] unused
 *   [4..8) n, the tensor's values (little-endian, modulo S_MAX_N + 1)
 *   [8..32) the six parameter words (little-endian)
 * Checked besides the sanitizers: a codec that validates formats to a spec that parses back
 * to the same codec; a refused payload is refused by mq_codec_decode too; an accepted one
 * decodes to finite values; and (flag 1) encoding those values gives a payload the codec's
 * own validation accepts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "mqgrad/quant.h"
#include "mqgrad/util.h"

#define S_HEADER 32
#define S_MAX_N 65536

static float s_dst[S_MAX_N], s_state[2 * S_MAX_N + 64];
static uint8_t s_enc[16 * S_MAX_N + 4096];

static void s_fail(const char *what, const mq_codec_t *c, size_t n, size_t len)
{
    char spec[MQ_CODEC_MAX_SPEC];
    mq_codec_format(c, spec, sizeof spec);
    mq_fuzz_fail("fuzz_codec: %s (codec %s, id %u, bits %d, params %08x %08x %08x %08x %08x "
                 "%08x, n %zu, payload %zu bytes): %s",
                 what, spec, (unsigned)c->id, c->bits, c->param[0], c->param[1], c->param[2],
                 c->param[3], c->param[4], c->param[5], n, len, mq_err_last());
}

/* A valid codec's spec reads back as the same codec (the scheduler hands the run's codec to
 * the nodes as a spec). */
static void s_check_spec(const mq_codec_t *c)
{
    char spec[MQ_CODEC_MAX_SPEC];
    mq_codec_t back;
    mq_codec_format(c, spec, sizeof spec);
    if (mq_codec_parse(spec, &back) != 0)
        s_fail("the spec of a valid codec does not parse", c, 0, 0);
    if (!mq_codec_equal(c, &back))
        s_fail("the spec of a valid codec parses to another codec", c, 0, 0);
}

/* What was decoded, encoded again, must be a payload the codec accepts. */
static void s_reencode(const mq_codec_t *c, size_t n)
{
    size_t need = mq_codec_payload_size(c, n), nstate = mq_codec_state_floats(c, n), len = 0;
    if (need > sizeof s_enc || nstate > sizeof s_state / sizeof *s_state)
        return;
    mq_rng_t rng;
    mq_rng_seed(&rng, 1);
    memset(s_state, 0, nstate * sizeof *s_state);
    mq_codec_ctx_t ctx = {.rng = &rng, .state = nstate ? s_state : NULL, .lr = 0.1f};
    if (mq_codec_encode_ctx(c, s_dst, n, &ctx, s_enc, sizeof s_enc, &len, NULL) != 0)
        return; /* e.g. values too large for the codec's arithmetic: refused, not written */
    if (len > need)
        s_fail("an encode wrote more than the codec's bound", c, n, len);
    if (mq_codec_validate_payload(c, s_enc, len, n) != 0)
        s_fail("the codec refuses its own encoding of a decoded payload", c, n, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < S_HEADER)
        return 0;
    size_t ncodecs;
    const mq_codec_ops_t *const *all = mq_codec_all(&ncodecs);
    const uint8_t *end = data + size;
    mq_codec_t c = {.id = all[data[0] % ncodecs]->id, .bits = data[1]};
    if (c.id == MQ_CODEC_ID_none)
        c.bits = 32; /* as the wire sets it */
    size_t n = mq_fuzz_u32(data + 4, end) % (S_MAX_N + 1);
    for (int k = 0; k < MQ_CODEC_NPARAMS; k++)
        c.param[k] = mq_fuzz_u32(data + 8 + 4 * k, end);
    const uint8_t *payload = data + S_HEADER;
    size_t len = size - S_HEADER;
    if (mq_codec_validate(&c) != 0) {
        if (mq_codec_validate_payload(&c, payload, len, n) == 0)
            s_fail("a payload of an invalid codec was accepted", &c, n, len);
        return 0;
    }
    s_check_spec(&c);
    /* the wire's order: the size rule, then the codec's own validation */
    bool size_ok = mq_codec_size_ok(&c, len, n);
    if (mq_codec_validate_payload(&c, payload, len, n) != 0) {
        if (mq_codec_decode(&c, payload, len, s_dst, n, 1.0f, false, NULL) == 0)
            s_fail("mq_codec_decode accepted a payload validation refuses", &c, n, len);
        return 0;
    }
    if (!size_ok)
        s_fail("a payload of a refused size was accepted", &c, n, len);
    mq_codec_stats_t st = {0};
    mq_codec_decode_valid(&c, payload, len, s_dst, n, 1.0f, false, &st);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(s_dst[i]))
            s_fail("a valid payload decodes to a non-finite value", &c, n, len);
    if (!isfinite(st.sq) || st.sq < 0)
        s_fail("a valid payload's sum of squares is not a finite non-negative number", &c, n,
               len);
    if (data[2] & 1)
        s_reencode(&c, n);
    mq_codec_decode_valid(&c, payload, len, s_dst, n, -0.25f, true, NULL);
    return 0;
}
