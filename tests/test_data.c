/* Tests of the data module: IDX and CIFAR-10 loaders on small files written here (good ones,
 * plain and gzip, and corrupt ones, whose errors must name the file and the fault), and the
 * batcher's partition, epoch and seek properties. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <zlib.h>

#include "mqgrad/data.h"
#include "mqgrad/util.h"

static char s_dir[64];

static void s_mkdir(void)
{
    strcpy(s_dir, "/tmp/mq_test_data_XXXXXX");
    cr_assert_not_null(mkdtemp(s_dir));
}

static void s_rmdir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    cr_expect_eq(system(cmd), 0);
}

static void s_write(const char *name, const unsigned char *data, size_t len, bool gz)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s%s", s_dir, name, gz ? ".gz" : "");
    if (gz) {
        gzFile f = gzopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(gzwrite(f, data, (unsigned)len), (int)len);
        gzclose(f);
    } else {
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(data, 1, len, f), len);
        fclose(f);
    }
}

static void s_be32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24, p[1] = v >> 16, p[2] = v >> 8, p[3] = v;
}

/* Writes PREFIX-images-idx3-ubyte and PREFIX-labels-idx1-ubyte with N images (pixel i of
 * image k = (k + i) % 256, label k % 10), then applies the requested corruption. */
static void s_write_idx(const char *prefix, int n, bool gz, uint32_t img_magic, int drop_bytes,
                        int nlabels, int bad_label_at)
{
    size_t ilen = 16 + (size_t)n * 784, llen = 8 + (size_t)nlabels;
    unsigned char *img = malloc(ilen), *lab = malloc(llen);
    s_be32(img, img_magic), s_be32(img + 4, n), s_be32(img + 8, 28), s_be32(img + 12, 28);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 784; i++)
            img[16 + k * 784 + i] = (unsigned char)((k + i) % 256);
    s_be32(lab, 0x801), s_be32(lab + 4, nlabels);
    for (int k = 0; k < nlabels; k++)
        lab[8 + k] = (unsigned char)(k % 10);
    if (bad_label_at >= 0)
        lab[8 + bad_label_at] = 12;
    char name[128];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", prefix);
    s_write(name, img, ilen - drop_bytes, gz);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", prefix);
    s_write(name, lab, llen, gz);
    free(img), free(lab);
}

static void s_expect_error(const char *kind, bool train, const char *file, const char *what)
{
    mq_dataset_t *d = mq_dataset_load(kind, s_dir, train);
    cr_expect_null(d, "loading must fail");
    mq_dataset_destroy(&d);
    cr_expect(strstr(mq_err_last(), file) != NULL, "error names %s: %s", file, mq_err_last());
    cr_expect(strstr(mq_err_last(), what) != NULL, "error says '%s': %s", what, mq_err_last());
}

TestSuite(data, .init = s_mkdir, .fini = s_rmdir);

Test(data, idx_plain_and_gzip_load_with_normalized_pixels)
{
    for (int gz = 0; gz <= 1; gz++) {
        s_write_idx(gz ? "train" : "t10k", 5, gz, 0x803, 0, 5, -1);
        mq_dataset_t *d = mq_dataset_load("fashion-mnist", s_dir, gz);
        cr_assert_not_null(d, "%s", mq_err_last());
        cr_expect_eq(d->n, 5);
        cr_expect_eq(mq_dataset_channels(d), 1);
        cr_expect(!d->crop);
        cr_expect_eq(d->labels[3], 3);
        float x[5 * 784];
        mq_dataset_export28(d, 0, 5, x);
        cr_expect_float_eq(x[0], -1.0f, 1e-6, "pixel 0 -> -1");
        cr_expect_float_eq(x[255], 1.0f, 1e-6, "pixel 255 -> +1");
        cr_expect_float_eq(x[784 * 2 + 1], (3 / 255.0f - 0.5f) / 0.5f, 1e-6);
        mq_dataset_export28(d, 2, 1, x);
        cr_expect_float_eq(x[1], (3 / 255.0f - 0.5f) / 0.5f, 1e-6, "from example 2 on");
        mq_dataset_destroy(&d);
        cr_expect_null(d);
    }
}

/* A plain images file is mapped (every worker of a machine shares its pages), a gzip one read:
 * the same images either way; a plain file longer than its header says is refused as a gzip
 * one is. */
Test(data, plain_idx_is_mapped_and_equals_the_gzip_one)
{
    mq_dataset_t *d[2];
    float x[2][3 * 784];
    for (int gz = 0; gz <= 1; gz++) {
        s_write_idx("train", 3, gz, 0x803, 0, 3, -1);
        d[gz] = mq_dataset_load("mnist", s_dir, true);
        cr_assert_not_null(d[gz], "%s", mq_err_last());
        mq_dataset_export28(d[gz], 0, 3, x[gz]);
        char path[512];
        snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", s_dir);
        unlink(path); /* the gzip pass must not find the plain file first */
    }
    cr_expect_not_null(d[0]->map, "the plain file is mapped");
    cr_expect_null(d[1]->map, "the gzip file is read");
    cr_expect(memcmp(x[0], x[1], sizeof x[0]) == 0, "the same images");
    cr_expect_float_eq(x[0][784 + 5], mq_pixel(6), 1e-9, "pixel 5 of image 1 is byte 6");
    mq_dataset_destroy(&d[0]), mq_dataset_destroy(&d[1]);

    char path[512];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", s_dir);
    unlink(path);
    s_write_idx("train", 3, false, 0x803, 0, 3, -1);
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte", s_dir);
    FILE *f = fopen(path, "ab");
    cr_assert_not_null(f);
    fputs("extra", f);
    fclose(f);
    s_expect_error("mnist", true, "train-images-idx3-ubyte", "size mismatch");
}

Test(data, idx_wrong_magic_is_named)
{
    s_write_idx("train", 4, true, 0x801, 0, 4, -1);
    s_expect_error("mnist", true, "train-images-idx3-ubyte.gz", "wrong magic");
}

Test(data, idx_truncated_is_named)
{
    s_write_idx("t10k", 4, false, 0x803, 100, 4, -1);
    s_expect_error("mnist", false, "t10k-images-idx3-ubyte", "truncated");
}

Test(data, idx_label_out_of_range_is_named)
{
    s_write_idx("t10k", 4, true, 0x803, 0, 4, 2);
    s_expect_error("fashion-mnist", false, "t10k-labels-idx1-ubyte.gz", "out of range");
}

Test(data, idx_count_mismatch_is_named)
{
    s_write_idx("t10k", 4, false, 0x803, 0, 3, -1);
    s_expect_error("fashion-mnist", false, "t10k-labels-idx1-ubyte", "mismatch");
}

Test(data, missing_files_and_unknown_kinds_are_named)
{
    s_expect_error("fashion-mnist", true, "train-images-idx3-ubyte", "cannot open");
    s_expect_error("svhn", true, "svhn", "unknown dataset");
}

/* CIFAR-10 records: label byte then 3x32x32 pixels; record k has label k % 10. */
static void s_write_cifar(const char *name, int n, int drop_bytes, int bad_label_at)
{
    size_t len = (size_t)n * 3073;
    unsigned char *b = calloc(1, len);
    for (int k = 0; k < n; k++) {
        b[k * 3073] = (unsigned char)(k == bad_label_at ? 10 : k % 10);
        for (int i = 0; i < 3072; i++)
            b[k * 3073 + 1 + i] = (unsigned char)(i % 1024 / 32 + i % 32); /* row + column */
    }
    s_write(name, b, len - drop_bytes, false);
    free(b);
}

Test(data, cifar_loads_all_batches_and_crops_the_centre)
{
    for (int i = 1; i <= 5; i++) {
        char name[32];
        snprintf(name, sizeof name, "data_batch_%d.bin", i);
        s_write_cifar(name, 3, 0, -1);
    }
    mq_dataset_t *d = mq_dataset_load("cifar10", s_dir, true);
    cr_assert_not_null(d, "%s", mq_err_last());
    cr_expect_eq(d->n, 15);
    cr_expect_eq(mq_dataset_channels(d), 3);
    cr_expect(d->crop && d->h == 32 && d->w == 32);
    cr_expect_eq(d->labels[4], 1);
    float *x = malloc(sizeof(float) * 15 * 3 * 784);
    mq_dataset_export28(d, 0, 15, x);
    /* The centre crop starts at row 2, column 2: its first pixel is 2 + 2 = 4. */
    cr_expect_float_eq(x[0], (4 / 255.0f - 0.5f) / 0.5f, 1e-6);
    cr_expect_float_eq(x[784 + 27], ((2 + 29) / 255.0f - 0.5f) / 0.5f, 1e-6);
    free(x);
    mq_dataset_destroy(&d);
}

Test(data, cifar_truncated_and_bad_labels_are_named)
{
    s_write_cifar("test_batch.bin", 3, 10, -1);
    s_expect_error("cifar10", false, "test_batch.bin", "truncated");
    s_write_cifar("test_batch.bin", 3, 0, 1);
    s_expect_error("cifar10", false, "test_batch.bin", "out of range");
}

/* ---- batcher -------------------------------------------------------------------------- */

/* A synthetic dataset of N <= 255 examples: with SIDE 28 every pixel of example k is k (the
 * label is k mod 10); with SIDE 32 the images get cropped, and pixels vary with (index, row,
 * column), so that two different crops differ. */
static mq_dataset_t *s_synthetic(int n, int side)
{
    mq_dataset_t *d = calloc(1, sizeof *d);
    *d = (mq_dataset_t){.n = n, .c = 1, .h = side, .w = side,
                        .pixels = malloc((size_t)n * side * side), .labels = malloc(n),
                        .crop = side > 28};
    for (int k = 0; k < n; k++) {
        d->labels[k] = (uint8_t)(k % 10);
        for (int i = 0; i < side * side; i++)
            d->pixels[(size_t)k * side * side + i] =
                (uint8_t)(side > 28 ? k * 5 + i / side * 7 + i % side * 3 : k);
    }
    return d;
}

/* The example of a SIDE 28 synthetic image from its first pixel, as the batch holds it. */
static int s_example(const float *x)
{
    return (int)lroundf((x[0] * 0.5f + 0.5f) * 255.0f);
}

static void s_partition_check(int side)
{
    mq_dataset_t *d = s_synthetic(40, side);
    const int B = 3, P = 2, steps = 15; /* 6 global batches per epoch: crosses 2 epochs */
    mq_batcher_t *one = mq_batcher_new(d, 0, 1, B * P, 9, true);
    mq_batcher_t *w[2] = {mq_batcher_new(d, 0, P, B, 9, true), mq_batcher_new(d, 1, P, B, 9, true)};
    cr_assert(one && w[0] && w[1]);
    float xo[6 * 784], xw[6 * 784];
    uint8_t yo[6], yw[6];
    for (int s = 0; s < steps; s++) {
        mq_batcher_next(one, xo, yo);
        for (int r = 0; r < P; r++)
            mq_batcher_next(w[r], xw + r * B * 784, yw + r * B);
        cr_expect(memcmp(xo, xw, sizeof xo) == 0, "step %d: P=2,B=3 differs from P=1,B=6", s);
        cr_expect(memcmp(yo, yw, sizeof yo) == 0);
    }
    mq_batcher_destroy(&one), mq_batcher_destroy(&w[0]), mq_batcher_destroy(&w[1]);
    mq_dataset_destroy(&d);
}

Test(data, two_workers_see_what_one_process_sees)
{
    s_partition_check(28);
    s_partition_check(32); /* random crops too */
}

Test(data, epochs_are_permutations_and_differ)
{
    mq_dataset_t *d = s_synthetic(40, 28);
    mq_batcher_t *b = mq_batcher_new(d, 0, 1, 8, 3, true);
    float x[8 * 784];
    uint8_t y[8];
    int first[40], seen[40];
    for (int e = 0; e < 2; e++) {
        memset(seen, 0, sizeof seen);
        int same = 0;
        for (int s = 0; s < 5; s++) {
            mq_batcher_next(b, x, y);
            for (int i = 0; i < 8; i++) {
                int k = s_example(x + i * 784);
                seen[k]++;
                if (e == 0)
                    first[s * 8 + i] = k;
                else
                    same += first[s * 8 + i] == k;
            }
        }
        for (int k = 0; k < 40; k++)
            cr_expect_eq(seen[k], 1, "epoch %d: example %d seen %d times", e, k, seen[k]);
        if (e == 1)
            cr_expect_lt(same, 20, "epoch 2 repeats epoch 1's order (%d of 40 equal)", same);
    }
    mq_batcher_destroy(&b);
    mq_dataset_destroy(&d);
}

Test(data, seek_positions_a_late_joiner)
{
    mq_dataset_t *d = s_synthetic(40, 32);
    mq_batcher_t *a = mq_batcher_new(d, 1, 2, 4, 7, true), *b = mq_batcher_new(d, 1, 2, 4, 7, true);
    float xa[4 * 784], xb[4 * 784];
    uint8_t ya[4], yb[4];
    for (int s = 0; s < 13; s++)
        mq_batcher_next(a, xa, ya);
    mq_batcher_seek(b, 12);
    mq_batcher_next(b, xb, yb);
    cr_expect(memcmp(xa, xb, sizeof xa) == 0, "seek(12) then next = the 13th batch");
    cr_expect_null(mq_batcher_new(d, 2, 2, 4, 7, true), "rank out of range");
    cr_expect_null(mq_batcher_new(d, 0, 4, 11, 7, true), "global batch larger than the data");
    mq_batcher_destroy(&a), mq_batcher_destroy(&b);
    mq_dataset_destroy(&d);
}

/* The cluster's sampling: positions handed out by the scheduler (member j of k at cursor c
 * takes c + j*B), with the membership changing every few rounds, still walk each epoch's
 * permutation once: every example once per epoch, none skipped, a batch may straddle two. */
Test(data, positions_cover_each_epoch_once_however_members_change)
{
    const int n = 50, B = 3;
    mq_dataset_t *d = s_synthetic(n, 28);
    mq_batcher_t *b = mq_batcher_new(d, 0, 1, B, 5, true);
    cr_assert_not_null(b);
    float x[3 * 784];
    uint8_t y[3];
    int seen[3][50] = {{0}};
    const int members[] = {2, 3, 1, 4, 2, 5, 3, 1, 2, 4}; /* workers in each round */
    uint64_t cursor = 0;
    for (int round = 0; cursor + 4 * B <= 3 * (uint64_t)n; round++) {
        int k = members[round % 10];
        for (int j = 0; j < k; j++) { /* in any order: positions, not calls, decide */
            uint64_t pos = cursor + (uint64_t)(k - 1 - j) * B;
            if (pos + B > 3 * (uint64_t)n)
                continue;
            mq_batcher_take(b, pos, x, y);
            for (int i = 0; i < B; i++) {
                int e = (int)((pos + (uint64_t)i) / (uint64_t)n);
                int ex = s_example(x + i * 784);
                cr_assert(ex >= 0 && ex < n);
                cr_expect_eq(y[i], ex % 10, "the label travels with its image");
                seen[e][ex]++;
            }
        }
        cursor += (uint64_t)k * B;
    }
    for (int e = 0; e < 2; e++) /* the first two epochs were walked whole */
        for (int ex = 0; ex < n; ex++)
            cr_expect_eq(seen[e][ex], 1, "epoch %d: example %d seen %d times", e, ex,
                         seen[e][ex]);
    mq_batcher_destroy(&b);
    mq_dataset_destroy(&d);
}
