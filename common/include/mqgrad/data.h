/* Datasets: IDX files (Fashion-MNIST, MNIST; gzip or plain) and the CIFAR-10 binary format,
 * and a batcher that partitions them over P workers with seeded per-epoch shuffles. */
#ifndef MQGRAD_DATA_H
#define MQGRAD_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MQ_DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

/* Where KIND's files are looked for when no directory is given: /usr/share/datasets/KIND
 * (Debian's dataset-fashion-mnist installs Fashion-MNIST there). NULL for an unknown KIND. */
const char *mq_dataset_default_dir(const char *kind);
/* DIR, or KIND's default directory when DIR is NULL or empty. */
const char *mq_dataset_dir(const char *kind, const char *dir);
/* Whether every file KIND needs is in DIR (plain or .gz), without reading them: -1 with an
 * error naming the first missing file and how to get the data set (the Debian package, or
 * the files and layout to put in DIR) otherwise. A seconds-long load finds truncated or
 * corrupt files; this finds a data set that is not there, before anything starts. */
int mq_dataset_check(const char *kind, const char *dir);

typedef struct {
    int n;            /* examples */
    int c, h, w;      /* stored image shape (CIFAR-10: 3 x 32 x 32; IDX: 1 x 28 x 28) */
    uint8_t *pixels;  /* n x c x h x w, the files' bytes; batches hold mq_pixel of each */
    uint8_t *labels;  /* n labels in 0..9 */
    bool crop;        /* images are larger than 28x28 and get cropped to it */
    void *map;        /* a plain IDX images file mapped read-only (pixels point into it), so
                       * that the workers of one machine share one copy; NULL: pixels are
                       * the dataset's own memory */
    size_t map_len;
} mq_dataset_t;

/* Loads the training or test split of KIND ("fashion-mnist", "mnist" or "cifar10") from DIR
 * (NULL or empty: KIND's default directory). A plain (not gzip) IDX images file is mapped, not
 * read: every process of a machine that loads it shares its pages.
 * IDX: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; CIFAR-10: data_batch_{1..5}.bin
 * and test_batch.bin. A missing, truncated or corrupt file gives NULL and an error naming the
 * file and what is wrong (wrong magic, size mismatch, label out of range, ...); a file that
 * is not there, how to get the data set (as mq_dataset_check). */
mq_dataset_t *mq_dataset_load(const char *kind, const char *dir, bool train);
void mq_dataset_destroy(mq_dataset_t **self_p);

/* A pixel as the batches hold it: scaled to [0, 1], then normalized to [-1, 1] by
 * (x - 0.5) / 0.5. */
static inline float mq_pixel(uint8_t v)
{
    return ((float)v / 255.0f - 0.5f) / 0.5f;
}

/* Channels of the 28x28 images the batcher produces. */
int mq_dataset_channels(const mq_dataset_t *d);

/* Walks a dataset in global batches of batch*nparts examples: each epoch is a permutation
 * drawn from (seed, epoch); global batch k is examples perm[k*B*P .. (k+1)*B*P) and the
 * worker of rank r takes the r-th slice of B. So P workers with batch B see exactly the
 * examples one process sees with batch B*P. Crops (random for training, centre for test)
 * apply when the stored images are larger than 28x28. */
typedef struct mq_batcher_t mq_batcher_t;
mq_batcher_t *mq_batcher_new(const mq_dataset_t *d, int rank, int nparts, int batch,
                             uint64_t seed, bool train);
void mq_batcher_destroy(mq_batcher_t **self_p);
/* Positions the batcher at global step K (for a worker that joins late). */
void mq_batcher_seek(mq_batcher_t *b, uint64_t step);
/* Fills x (batch x C x 28 x 28) and y with the next batch. */
void mq_batcher_next(mq_batcher_t *b, float *x, uint8_t *y);
/* Fills x and y with the batch at the run's data position POS (examples from the run's
 * start): example p is perm_e[p mod n] of epoch e = p / n, so consecutive positions walk each
 * epoch's permutation once and a batch may run into the next epoch. The cluster hands each
 * worker its position (member j of k at cursor c takes c + j*batch), so however workers come
 * and go no example is skipped or seen twice within an epoch, except a batch whose worker
 * died with it. The partition given to mq_batcher_new is not used here. */
void mq_batcher_take(mq_batcher_t *b, uint64_t pos, float *x, uint8_t *y);
/* Writes examples LO .. LO+N as 28x28 images (centre crop if needed) into x (N x C x 28 x 28):
 * an evaluation takes the test set a batch at a time, in the buffer its training batches use. */
void mq_dataset_export28(const mq_dataset_t *d, int lo, int n, float *x);

/* The run's order of epoch EPOCH over N examples (run seed SEED): PERM[0..N) is a seeded
 * permutation, the one the batcher takes position epoch*N + k from (perm[k]). */
void mq_epoch_perm(uint64_t seed, uint64_t epoch, int32_t *perm, int n);

#ifdef __cplusplus
}
#endif
#endif
