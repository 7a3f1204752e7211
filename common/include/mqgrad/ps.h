/* Parameter-server plumbing shared by the services: how the flat parameter vector is cut into
 * server shards, the segment codec and update recipes workers and servers share (encode a
 * segment for sending, apply an aggregate), reusable zero-copy send buffers, and NIC
 * emulation (token buckets). */
#ifndef MQGRAD_PS_H
#define MQGRAD_PS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mqgrad/nn.h"
#include "mqgrad/optim.h"
#include "mqgrad/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- shard plan ---------------------------------------------------------------------
 * The flat vector [0, N) is cut into S contiguous, equal (to one element) ranges; a shard is
 * the list of its intersections with the model's tensors. A tensor with at least
 * `threshold` elements is quantized (the paper quantizes only the two big FC layers); a
 * segment inherits its tensor's choice, and its range header covers the segment. */
typedef struct {
    uint32_t tensor;  /* index in the model */
    const char *name; /* tensor name */
    uint64_t offset;  /* first element within the tensor */
    uint64_t count;
    uint64_t flat;    /* first element in the flat vector */
    bool quantized;
} mq_segment_t;

typedef struct {
    uint64_t begin, end; /* flat range */
    uint32_t nsegs;
    mq_segment_t segs[MQ_WIRE_MAX_TENSORS];
} mq_shard_t;

/* Fills shards[0..nservers). Fails if a shard would need more than MQ_WIRE_MAX_TENSORS
 * segments or nservers is 0 or larger than the parameter count. */
int mq_shard_plan(const mq_model_t *m, uint32_t nservers, uint64_t threshold, bool fp32,
                  mq_shard_t *shards);

/* The codec a segment's push travels with at BITS (32 = fp32) when the run's codec is BASE:
 * BASE at that level for a quantized segment, none otherwise. */
mq_codec_t mq_segment_codec(const mq_segment_t *seg, int bits, const mq_codec_t *base);

/* Whether BITS is a level an iteration may use with the run's codec BASE: the codec's own
 * range when it takes a level, else any controller level (1..8, then ignored). */
bool mq_bits_ok(const mq_codec_t *base, int bits);

/* ---- a round's levels -----------------------------------------------------------------
 * An iteration's level for every quantized tensor (BITS; 32 = fp32), or, where N > 0, one per
 * tensor of the model's layout (ITERATE's and PUSH's widths: a per-layer policy). */
typedef struct {
    int bits;
    uint32_t n;                       /* 0, or the layout's tensor count */
    uint8_t per[MQ_WIRE_MAX_TENSORS]; /* tensor t's level, t < n */
} mq_widths_t;

/* A uniform level as a pointer argument: mq_kv_push(kv, it, r, MQ_WIDTHS(4), ...). */
#define MQ_WIDTHS(b) (&(const mq_widths_t){.bits = (b)})

/* Tensor T's level under W. */
int mq_widths_at(const mq_widths_t *w, uint32_t tensor);
bool mq_widths_equal(const mq_widths_t *a, const mq_widths_t *b);
/* W from a message's BITS and its N per-tensor levels LIST. Each level must be one the run's
 * codec takes (OPS its table, resolved once a run: mq_bits_ok; 32 for every one under FP32)
 * and N must be 0 or NTENSORS. -1 with an error naming the bad entry otherwise (W then
 * undefined). */
int mq_widths_read(mq_widths_t *w, const mq_codec_ops_t *ops, bool fp32, int bits,
                   const uint32_t *list, uint32_t n, uint32_t ntensors);
/* W's per-tensor levels into LIST (W->n of them) and *N. */
void mq_widths_write(const mq_widths_t *w, uint32_t *list, uint32_t *n);

/* Checks a received message's tensor headers against SHARD's segments and the codec
 * expected at W's levels: RUN, the push's codec or the one servers answer with
 * (mq_codec_reply), whose table OPS the caller resolved once a run. Sets an error and returns
 * -1 on the first mismatch. */
int mq_shard_check(const mq_shard_t *shard, const mq_msg_t *msg, const mq_widths_t *w,
                   const mq_codec_t *run, const mq_codec_ops_t *ops);

/* ---- reusable send buffers ----------------------------------------------------------
 * A buffer that ZeroMQ sends without copying. Each zmq message built on it holds a
 * reference (mq_sendbuf_payload); ZeroMQ drops it from its I/O thread when done. Before
 * refilling, mq_sendbuf_acquire waits (bounded) until no message holds it. */
typedef struct {
    uint8_t *data;
    size_t cap;
    atomic_int refs;
} mq_sendbuf_t;

/* Makes sure BUF holds NEED bytes and no message still uses it; waits at most TIMEOUT_MS.
 * Returns 0, or -1 (error set) on timeout or out of memory. */
int mq_sendbuf_acquire(mq_sendbuf_t *buf, size_t need, int timeout_ms);
/* A payload of LEN bytes of BUF (or of an external pointer DATA held by BUF's count). */
mq_payload_t mq_sendbuf_payload(mq_sendbuf_t *buf, const void *data, size_t len);
void mq_sendbuf_release(mq_sendbuf_t *buf);

/* ---- the segment recipes ------------------------------------------------------------
 * A segment's encoder: its codec, resolved once when the plan is made (mq_seg_coder_init), a
 * reusable send buffer and the codec's state (residuals, momentum), allocated zeroed on first
 * use and kept across iterations. */
typedef struct {
    mq_codec_t codec;          /* the segment's codec, its level set per round */
    const mq_codec_ops_t *ops; /* its table; NULL until mq_seg_coder_init */
    mq_sendbuf_t buf;
    float *state;
    size_t nstate;
} mq_seg_coder_t;

/* Resolves CODER's codec for SEG (mq_codec_resolve): C for a quantized segment (the run's
 * codec, or on a server the codec it replies with, mq_codec_reply), none for the others.
 * Returns 0, or -1 with an error (CODER unchanged). */
int mq_seg_coder_init(mq_seg_coder_t *coder, const mq_segment_t *seg, const mq_codec_t *c);

/* Encodes VALUES (seg->count floats) with CODER's codec at level BITS (32: fp32; a codec that
 * takes no level ignores it) for sending and fills header H and payload OUT. fp32 goes out
 * without a copy, its payload counted on REF; the other codecs encode into CODER's buffer
 * with CODER's state, or with generic error feedback in place when RESIDUAL is VALUES (not
 * NULL; any other array is refused): VALUES hold gradient + residual and are left holding the
 * new residual (mq_codec_encode_ef_inplace). CLEAR, NULL or VALUES (then RESIDUAL NULL):
 * VALUES are zeroed once encoded, but for fp32 (its payload points into them: the caller
 * zeroes them once sent; H's codec says which). RNG and LR as mq_codec_ctx_t. STATS as
 * mq_codec_encode (may be NULL). Returns 0, or -1 with an error (a level the codec does not
 * take among them). */
int mq_ps_encode_segment(const mq_segment_t *seg, mq_seg_coder_t *coder, int bits,
                         const float *values, mq_sendbuf_t *ref, float *residual, float *clear,
                         mq_rng_t *rng, float lr, mq_tensor_hdr_t *h, mq_payload_t *out,
                         mq_codec_stats_t *stats);
void mq_seg_coder_release(mq_seg_coder_t *coder);

/* Applies an aggregate payload (validated by the wire) to W[0..n) under rule O at learning
 * rate LR, update number T (from 1): plain SGD decodes straight into W (w -= lr g^); other
 * rules decode into SCRATCH (n floats) and run with STATE (mq_optim_state_floats(o, n)).
 * STATS as mq_codec_decode. */
void mq_ps_apply(const mq_optim_t *o, const mq_codec_t *c, const uint8_t *payload, size_t len,
                 float *w, size_t n, float *scratch, float *state, float lr, uint64_t t,
                 mq_codec_stats_t *stats);

/* ---- links and clocks ---------------------------------------------------------------
 * A node's NIC: egress and ingress token buckets of RATE megabits per second (0 = off), and
 * the clock the node's time is read on. Senders charge their egress before sending
 * (serialization delay): mq_link_egress waits until the bytes are out, as a blocking send
 * does; mq_link_egress_async queues them behind the bytes before them and returns at once, as
 * a send handed to the NIC does (the pushes from inside the backward pass, which must not
 * stall it). Receivers charge their ingress on arrival, counting the message as having
 * arrived at the sender's pace, so one flow runs at RATE and several flows into one node
 * share it. The same model runs on two clocks:
 *
 *  - real: the buckets sleep as the NIC would and time is mq_now_s(). What a run measures is
 *    what happened, including CPU contention when nodes share cores. A message sent with
 *    mq_link_egress_async carries the wall-clock time (CLOCK_REALTIME, which hosts share) at
 *    which its last byte leaves, and its receiver sleeps until it has streamed in from then.
 *  - simulated: nothing sleeps. A node's time advances by its thread's CPU time (its compute)
 *    and by the time it is blocked on its egress, and jumps forward when it waits for a
 *    message stamped later than its own time (it was idle). A message carries the time its
 *    last byte left the sender (msg->sim_time); the receiver runs the ingress bucket on those
 *    stamps in stamp order when it has all the messages it waits for (mq_link_settle), so
 *    the order in which messages really arrived does not matter. Nodes sharing cores thus
 *    behave like separate machines, and a link of any speed costs no waiting. */
typedef struct {
    double next_free; /* the time at which the link is idle again */
    double overslept; /* real: how late the last egress sleep returned, credited to the next */
} mq_bucket_t;

/* ---- link schedules --------------------------------------------------------------------
 * A node's rate over the run's time: steps of a rate from a time on, repeated every PERIOD
 * seconds when PERIOD > 0, else the last step lasts. The time is the run's training time (the
 * scheduler's train_time_s: evaluations not counted), on either clock. The run's SPEC gives
 * every node its schedule:
 *
 *   SPEC     := PART (';' PART)*
 *   PART     := [WHO '='] SCHEDULE          (no WHO: every node)
 *   WHO      := 'worker' | 'server' | 'worker:' RANK | 'server:' RANK
 *   SCHEDULE := MBPS ['@' SECONDS] (',' MBPS '@' SECONDS)* ['/' PERIOD]
 *
 * A node takes the part naming its rank, else its role's, else the one for every node, else
 * no emulation. The first step starts at 0, times increase and stay below PERIOD, rates are
 * Mbit/s in (0, 1e6]; a lone "0" is no emulation. Examples: "80" (every link 80 Mbit/s);
 * "80@0,10000@30/60" (a square wave: 30 s at 80, 30 s at 10 Gbit/s); "1000@0,300@60,80@120"
 * (a link that degrades); "1000;worker:0=80" (one slow worker); "1000;server=200". */
#define MQ_LINK_MAX_STEPS 16 /* per schedule; MQ_LINK_MAX_SPEC (wire.h) bounds a SPEC */

typedef struct {
    double at;          /* seconds of run time (within the period) */
    double bytes_per_s; /* > 0 */
} mq_link_step_t;

typedef struct {
    mq_link_step_t step[MQ_LINK_MAX_STEPS];
    uint32_t n;    /* 0: no emulation */
    double period; /* 0: the last step lasts */
} mq_link_rate_t;

/* Checks SPEC; on error returns -1 with a message naming the part that is wrong in ERR. */
int mq_link_spec_check(const char *spec, char *err, size_t len);
/* The schedule of the node ROLE ("worker" or "server") of RANK under SPEC. Returns 0, or -1
 * with ERR as mq_link_spec_check. */
int mq_link_rate_for(const char *spec, const char *role, int rank, mq_link_rate_t *out,
                     char *err, size_t len);
/* A schedule of one rate, MBPS (0: no emulation). */
void mq_link_rate_const(mq_link_rate_t *out, double mbps);
/* The rate at run time T, Mbit/s (0: no emulation). */
double mq_link_rate_mbps(const mq_link_rate_t *r, double t);
/* When BYTES that start at run time T have all gone (the rate changing on the way). */
double mq_link_rate_finish(const mq_link_rate_t *r, double t, double bytes);
/* When BYTES that have all gone by run time T started (mq_link_rate_finish backwards). */
double mq_link_rate_start(const mq_link_rate_t *r, double t, double bytes);

/* Messages a simulated link orders by their stamps before it charges them: a server's round
 * of pushes from up to this many workers is timed exactly; past it, a round is charged in
 * parts of this many (each in stamp order). */
#define MQ_LINK_MAX_PENDING 4096

typedef struct {
    double stamp;  /* when the message's last byte left its sender */
    double cpu;    /* this thread's CPU time when the message was taken */
    size_t bytes;
    uint32_t seq;  /* the order it was taken in (ties of stamps keep it) */
} mq_arrival_t;

typedef struct {
    mq_bucket_t egress, ingress;
    mq_link_rate_t rate; /* both directions' */
    double origin;       /* real: mq_now_s() at run time 0 (mq_link_anchor); simulated: 0 */
    uint64_t bytes_out, bytes_in;
    bool simulated;
    double sim_now;  /* simulated: the node's time at cpu_mark */
    double cpu_mark; /* simulated: the thread CPU time when sim_now was set */
    double paused;   /* simulated: the time mq_link_pause took */
    uint32_t untrusted; /* real: stamps taken as "now", too far from this host's clock */
    mq_arrival_t pending[MQ_LINK_MAX_PENDING]; /* simulated: taken since the last settle */
    uint32_t npending;
} mq_link_t;

/* A link of MBPS (0 = unlimited) on the real or the simulated clock; its time starts at 0
 * (simulated) and it must be used from one thread only (the CPU time is that thread's). */
void mq_link_init(mq_link_t *link, double mbps, bool simulated);
/* The same with a schedule (mq_link_rate_for). */
void mq_link_init_rate(mq_link_t *link, const mq_link_rate_t *rate, bool simulated);
/* The link of the node ROLE ("worker", "server") of RANK in the run R: its schedule from
 * R->link, else R->link_mbps. Returns 0, or -1 with an error (a bad schedule). */
int mq_link_setup(mq_link_t *link, const mq_run_config_t *r, const char *role, uint32_t rank);
/* The run's time is RUN_TIME now (ITERATE carries it): on the real clock, the schedule's time
 * follows from it (the simulated clock's time is the run's time already). */
void mq_link_anchor(mq_link_t *link, double run_time);
/* The rate now, Mbit/s (0: no emulation). */
double mq_link_mbps_now(mq_link_t *link);
bool mq_link_enabled(const mq_link_t *link);
/* The node's time now, seconds: mq_now_s() on the real clock. */
double mq_link_now(mq_link_t *link);
/* BYTES leave: sleeps as the NIC would (real), or advances the node's time past the
 * serialization (simulated). Returns the time the last byte left: the stamp to send (0 on
 * the real clock, where the receiver takes the message as its last byte leaving now). */
double mq_link_egress(mq_link_t *link, size_t bytes);
/* BYTES are handed to the NIC, behind any bytes before them, and the sender goes on: nothing
 * sleeps and the node's time does not move. Returns the time their last byte leaves (real:
 * the wall clock's; 0 without a rate): the stamp to send. */
double mq_link_egress_async(mq_link_t *link, size_t bytes);
/* A message of BYTES stamped STAMP was taken. Real: sleeps until it has streamed in, from
 * STAMP if it has one (mq_link_egress_async; a stamp further ahead of this host's clock than
 * its sender could have queued bytes, or over an hour old, is taken as "now" and warned about
 * once), else from now.
 * Simulated: noted, to be charged by mq_link_settle, as is the CPU time spent on it until the
 * next message is taken or the settle (up to MQ_LINK_MAX_PENDING between settles; beyond, the
 * oldest is settled at once). */
void mq_link_arrive(mq_link_t *link, size_t bytes, double stamp);
/* Every message waited for is in: runs the ingress on them in stamp order, the node idle
 * until each arrived and busy for the CPU time spent on it; returns the node's time after
 * (real: mq_now_s()). */
double mq_link_settle(mq_link_t *link);
/* A control message (no link charge) stamped STAMP was taken: the node's time is at least
 * STAMP. */
void mq_link_sync(mq_link_t *link, double stamp);
/* Work between pause and resume is not the run's time (evaluation): simulated, the node's
 * time after resume is what pause returned; real, nothing changes (the scheduler subtracts
 * the reported evaluation time). */
double mq_link_pause(mq_link_t *link);
void mq_link_resume(mq_link_t *link);

/* ---- endpoints ----------------------------------------------------------------------*/
/* Binds SOCK to ENDPOINT (CZMQ syntax: "tcp://HOST:PORT", port "*" or 0 for any free one) and
 * stores the port actually bound in *PORT. Returns 0, or -1 with an error. */
int mq_bind(zsock_t *sock, const char *endpoint, int *port);

/* The endpoint peers should use to reach a socket bound at BOUND: a wildcard host ("*" or
 * 0.0.0.0) is replaced by this host's address (from its hostname, as containers resolve it),
 * or 127.0.0.1 when that fails; any other endpoint is returned as it is. */
int mq_advertise_endpoint(const char *bound, char *out, size_t len);

#ifdef __cplusplus
}
#endif
#endif
