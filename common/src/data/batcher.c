/* The batcher: seeded per-epoch permutations cut into global batches of batch*nparts, each
 * worker taking its rank's slice, and 28x28 crops (random for training, centre for test).
 * Everything random is a function of (seed, epoch, position), never of the partition, so P
 * workers with batch B see exactly what one process sees with batch B*P. */
#include <stdlib.h>
#include <string.h>

#include "mqgrad/data.h"
#include "mqgrad/util.h"

struct mq_batcher_t {
    const mq_dataset_t *d;
    int rank, nparts, batch;
    uint64_t seed;
    bool train;
    uint64_t steps_per_epoch; /* full global batches per epoch; the remainder is skipped */
    uint64_t epoch, pos;      /* pos: global batch within the epoch */
    int32_t *perm;
};

static uint64_t s_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Fisher-Yates over 0..n-1 from a generator seeded with (seed, epoch). */
void mq_epoch_perm(uint64_t seed, uint64_t epoch, int32_t *perm, int n)
{
    mq_rng_t rng;
    mq_rng_seed(&rng, s_mix(seed) ^ s_mix(epoch + 0x5eed));
    for (int i = 0; i < n; i++)
        perm[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)mq_rng_below(&rng, (uint64_t)i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void s_shuffle(mq_batcher_t *b)
{
    mq_epoch_perm(b->seed, b->epoch, b->perm, b->d->n);
}

/* Contract (beyond data.h): NULL with an error if rank is not in 0..nparts-1, batch < 1, or
 * the dataset holds fewer than one global batch. */
mq_batcher_t *mq_batcher_new(const mq_dataset_t *d, int rank, int nparts, int batch,
                             uint64_t seed, bool train)
{
    if (nparts < 1 || rank < 0 || rank >= nparts || batch < 1) {
        mq_err_set("batcher: bad partition rank %d of %d with batch %d", rank, nparts, batch);
        return NULL;
    }
    if ((int64_t)batch * nparts > d->n) {
        mq_err_set("batcher: a global batch of %lld exceeds the %d examples",
                   (long long)batch * nparts, d->n);
        return NULL;
    }
    mq_batcher_t *b = calloc(1, sizeof *b);
    if (b)
        b->perm = malloc(sizeof(int32_t) * d->n);
    if (!b || !b->perm) {
        free(b);
        mq_err_set("out of memory");
        return NULL;
    }
    *b = (mq_batcher_t){d, rank, nparts, batch, seed, train,
                        (uint64_t)d->n / ((uint64_t)batch * nparts), 0, 0, b->perm};
    s_shuffle(b);
    return b;
}

void mq_batcher_destroy(mq_batcher_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->perm);
    free(*self_p);
    *self_p = NULL;
}

void mq_batcher_seek(mq_batcher_t *b, uint64_t step)
{
    uint64_t epoch = step / b->steps_per_epoch;
    b->pos = step % b->steps_per_epoch;
    if (epoch != b->epoch) {
        b->epoch = epoch;
        s_shuffle(b);
    }
}

/* Writes example I as a 28x28 crop at (oy, ox), normalized, into dst. */
static void s_crop(const mq_dataset_t *d, int i, int oy, int ox, float *dst)
{
    const size_t plane = (size_t)d->h * d->w;
    const uint8_t *src = d->pixels + (size_t)i * d->c * plane;
    for (int c = 0; c < d->c; c++)
        for (int r = 0; r < 28; r++) {
            const uint8_t *row = src + c * plane + (size_t)(r + oy) * d->w + ox;
            float *out = dst + ((size_t)c * 28 + r) * 28;
            for (int k = 0; k < 28; k++)
                out[k] = mq_pixel(row[k]);
        }
}

void mq_batcher_next(mq_batcher_t *b, float *x, uint8_t *y)
{
    const mq_dataset_t *d = b->d;
    const uint64_t gb = (uint64_t)b->batch * b->nparts;
    for (int k = 0; k < b->batch; k++) {
        uint64_t slot = b->pos * gb + (uint64_t)b->rank * b->batch + k;
        int i = b->perm[slot];
        int oy = (d->h - 28) / 2, ox = (d->w - 28) / 2;
        if (d->crop && b->train) {
            uint64_t r = s_mix(s_mix(b->seed ^ 0xc0ffee) ^ s_mix(b->epoch * gb * 4096 + slot));
            oy = (int)(r % (uint64_t)(d->h - 27));
            ox = (int)((r >> 32) % (uint64_t)(d->w - 27));
        }
        s_crop(d, i, oy, ox, x + (size_t)k * d->c * 784);
        y[k] = d->labels[i];
    }
    if (++b->pos == b->steps_per_epoch)
        mq_batcher_seek(b, (b->epoch + 1) * b->steps_per_epoch);
}

void mq_batcher_take(mq_batcher_t *b, uint64_t pos, float *x, uint8_t *y)
{
    const mq_dataset_t *d = b->d;
    const uint64_t n = (uint64_t)d->n;
    for (int k = 0; k < b->batch; k++, pos++) {
        uint64_t epoch = pos / n;
        if (epoch != b->epoch) { /* at most once per batch: positions only grow within it */
            b->epoch = epoch;
            s_shuffle(b);
        }
        int i = b->perm[pos % n];
        int oy = (d->h - 28) / 2, ox = (d->w - 28) / 2;
        if (d->crop && b->train) {
            uint64_t r = s_mix(s_mix(b->seed ^ 0xc0ffee) ^ s_mix(pos));
            oy = (int)(r % (uint64_t)(d->h - 27));
            ox = (int)((r >> 32) % (uint64_t)(d->w - 27));
        }
        s_crop(d, i, oy, ox, x + (size_t)k * d->c * 784);
        y[k] = d->labels[i];
    }
}

void mq_dataset_export28(const mq_dataset_t *d, int lo, int n, float *x)
{
    for (int i = 0; i < n; i++)
        s_crop(d, lo + i, (d->h - 28) / 2, (d->w - 28) / 2, x + (size_t)i * d->c * 784);
}
