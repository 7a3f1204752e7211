/* Drop accounting: why messages were dropped, counted per reason, logged once per peer and
 * reason so a misbehaving peer cannot flood the log; and a member set's lookup. What the wire
 * refuses and what a service refuses land here alike. */
#include <stdio.h>

#include "mqgrad/util.h"
#include "mqgrad/wire.h"

const char *mq_drop_name(mq_drop_t r)
{
    static const char *names[] = {"none",      "garbage", "version",   "type",   "frames",
                                  "length",    "codec",   "nonfinite", "rank",   "iter",
                                  "shard",     "layout",  "duplicate", "too_many",
                                  "payload",   "run",     "late",      "auth",
                                  "unread"};
    return (r >= 0 && r < MQ_DROP_COUNT_) ? names[r] : "invalid";
}

int mq_member_index(const uint32_t *members, uint32_t n, uint32_t rank)
{
    uint32_t lo = 0, hi = n; /* sorted: the wire checked it */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (members[mid] < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && members[lo] == rank ? (int)lo : -1;
}

void mq_drops_note(mq_drops_t *d, mq_drop_t reason, const uint8_t *peer, size_t peer_len,
                   const char *detail)
{
    if (reason <= MQ_DROP_NONE || reason >= MQ_DROP_COUNT_)
        return;
    d->count[reason]++;
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)reason;
    for (size_t i = 0; i < peer_len; i++)
        h = (h ^ peer[i]) * 1099511628211ULL;
    for (size_t i = 0; i < d->nseen_; i++)
        if (d->seen_[i] == h)
            return;
    if (d->nseen_ < sizeof d->seen_ / sizeof d->seen_[0])
        d->seen_[d->nseen_++] = h;
    mq_warn("dropped a message (%s): %s%s", mq_drop_name(reason), detail ? detail : "",
            d->nseen_ == sizeof d->seen_ / sizeof d->seen_[0] ? " (further new drops not logged)"
                                                               : "");
}

void mq_drops_format(const mq_drops_t *d, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 1; i < MQ_DROP_COUNT_ && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s=%llu", i > 1 ? " " : "",
                                mq_drop_name((mq_drop_t)i), (unsigned long long)d->count[i]);
}

void mq_drops_series(mq_metrics_t *m, const char *name, mq_metric_t *out[MQ_DROP_COUNT_])
{
    out[MQ_DROP_NONE] = NULL;
    for (int r = MQ_DROP_NONE + 1; r < MQ_DROP_COUNT_; r++) {
        char labels[64];
        snprintf(labels, sizeof labels, "reason=\"%s\"", mq_drop_name((mq_drop_t)r));
        out[r] = mq_metrics_counter(m, name, "Messages dropped, by reason.", labels);
    }
}

void mq_drops_publish(mq_metric_t *const out[MQ_DROP_COUNT_], const uint64_t count[MQ_DROP_COUNT_])
{
    for (int r = MQ_DROP_NONE + 1; r < MQ_DROP_COUNT_; r++)
        mq_metric_set(out[r], (double)count[r]);
}

uint64_t mq_drops_total(const mq_drops_t *d)
{
    uint64_t t = 0;
    for (int i = 1; i < MQ_DROP_COUNT_; i++)
        t += d->count[i];
    return t;
}
