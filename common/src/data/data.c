/* Dataset loaders: IDX (Fashion-MNIST, MNIST; gzip or plain, read through zlib which passes
 * plain files through) and the CIFAR-10 binary format. Pixels are kept as the files' bytes
 * (a quarter of the memory of floats: 55 MB for Fashion-MNIST, not 220 MB in every worker) and
 * normalized as batches are made (mq_pixel); every error names the file and what is wrong. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "mqgrad/data.h"
#include "mqgrad/util.h"

#define IDX_MAX_ITEMS 10000000u
#define CIFAR_RECORD 3073
#define CIFAR_TRAIN_FILES 5

static const char *const s_idx_files[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                          "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte",
                                          NULL};
static const char *const s_cifar_files[] = {"data_batch_1.bin", "data_batch_2.bin",
                                            "data_batch_3.bin", "data_batch_4.bin",
                                            "data_batch_5.bin", "test_batch.bin",
                                            NULL};

static bool s_known(const char *kind)
{
    return kind && (!strcmp(kind, "fashion-mnist") || !strcmp(kind, "mnist") ||
                    !strcmp(kind, "cifar10"));
}

const char *mq_dataset_default_dir(const char *kind)
{
    if (!s_known(kind))
        return NULL;
    return !strcmp(kind, "fashion-mnist") ? MQ_DEFAULT_DATA_DIR
           : !strcmp(kind, "mnist")       ? "/usr/share/datasets/mnist"
                                          : "/usr/share/datasets/cifar10";
}

const char *mq_dataset_dir(const char *kind, const char *dir)
{
    if (dir && *dir)
        return dir;
    const char *d = mq_dataset_default_dir(kind);
    return d ? d : MQ_DEFAULT_DATA_DIR;
}

/* How to get KIND's files into DIR, for an error about a missing one. */
static const char *s_how_to_get(const char *kind)
{
    if (!strcmp(kind, "fashion-mnist"))
        return "install Debian's package (apt-get install dataset-fashion-mnist), which puts "
               "them in " MQ_DEFAULT_DATA_DIR ", or give --data-dir";
    if (!strcmp(kind, "mnist"))
        return "no Debian package ships MNIST: put its four IDX files "
               "(train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
               "t10k-labels-idx1-ubyte; each plain or .gz, as the MNIST site serves them) in "
               "/usr/share/datasets/mnist, or in a folder given with --data-dir";
    return "no Debian package ships CIFAR-10: extract its binary version "
           "(cifar-10-binary.tar.gz: data_batch_1.bin .. data_batch_5.bin and test_batch.bin, "
           "each plain or .gz) into /usr/share/datasets/cifar10, or into a folder given with "
           "--data-dir";
}

/* The missing-file error: which file, where it was looked for, and how to get it. */
static void s_missing(const char *kind, const char *dir, const char *base, int err)
{
    mq_err_set("%s/%s[.gz]: cannot open: %s; %s", dir, base, strerror(err),
               s_how_to_get(kind));
}

int mq_dataset_check(const char *kind, const char *dir)
{
    if (!s_known(kind)) {
        mq_err_set("unknown dataset '%s' (expected fashion-mnist, mnist or cifar10)",
                   kind ? kind : "(null)");
        return -1;
    }
    dir = mq_dataset_dir(kind, dir);
    const char *const *files = !strcmp(kind, "cifar10") ? s_cifar_files : s_idx_files;
    for (; *files; files++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, *files);
        if (access(path, R_OK) == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s.gz", dir, *files);
        if (access(path, R_OK) != 0) {
            s_missing(kind, dir, *files, errno);
            return -1;
        }
    }
    return 0;
}

/* Opens DIR/BASE, else DIR/BASE.gz; PATH receives the name used (or tried, on failure). A
 * file that is not there gets KIND's how-to-get-it in the error. */
static gzFile s_open(const char *kind, const char *dir, const char *base, char *path,
                     size_t len)
{
    snprintf(path, len, "%s/%s", dir, base);
    gzFile f = gzopen(path, "rb");
    if (f)
        return f;
    snprintf(path, len, "%s/%s.gz", dir, base);
    f = gzopen(path, "rb");
    if (!f && (errno == ENOENT || errno == 0))
        s_missing(kind, dir, base, ENOENT);
    else if (!f)
        mq_err_set("%s/%s[.gz]: cannot open: %s", dir, base, strerror(errno));
    return f;
}

/* Reads exactly LEN bytes; -1 with an error naming PATH and WHAT if the file ends early. */
static int s_read(gzFile f, const char *path, const char *what, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        unsigned chunk = len - got > (1u << 30) ? (1u << 30) : (unsigned)(len - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            mq_err_set("%s: corrupt compressed data while reading %s: %s", path, what, msg);
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got < len) {
        mq_err_set("%s: truncated: %s needs %zu bytes, the file has %zu", path, what, len, got);
        return -1;
    }
    return 0;
}

/* After the promised content the file must end; anything more is a size mismatch. */
static int s_expect_end(gzFile f, const char *path)
{
    char extra[64];
    int r = gzread(f, extra, sizeof extra);
    if (r > 0) {
        mq_err_set("%s: size mismatch: more bytes than the header's count promises", path);
        return -1;
    }
    if (r < 0) {
        int zerr;
        mq_err_set("%s: corrupt compressed data: %s", path, gzerror(f, &zerr));
        return -1;
    }
    return 0;
}

static uint32_t s_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Maps the plain IDX images file PATH, whose header promised LEN pixel bytes, into D. */
static int s_idx_map(const char *path, size_t len, mq_dataset_t *d)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        mq_err_set("%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if ((size_t)st.st_size != 16 + len) {
        close(fd);
        if ((size_t)st.st_size < 16 + len)
            mq_err_set("%s: truncated: the pixels need %zu bytes, the file has %zu", path, len,
                       (size_t)st.st_size - 16);
        else
            mq_err_set("%s: size mismatch: more bytes than the header's count promises", path);
        return -1;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        mq_err_set("%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    d->map = map, d->map_len = (size_t)st.st_size;
    d->pixels = (uint8_t *)map + 16;
    return 0;
}

/* An IDX images file: magic 0x00000803, count, 28, 28, then count*784 pixel bytes. */
static int s_idx_images(const char *kind, const char *dir, const char *base, mq_dataset_t *d)
{
    char path[4096];
    unsigned char hdr[16];
    gzFile f = s_open(kind, dir, base, path, sizeof path);
    if (!f)
        return -1;
    if (s_read(f, path, "the 16-byte header", hdr, sizeof hdr) < 0)
        goto err;
    if (s_be32(hdr) != 0x803) {
        mq_err_set("%s: wrong magic 0x%08x (expected 0x00000803, IDX unsigned-byte images)",
                   path, s_be32(hdr));
        goto err;
    }
    uint32_t n = s_be32(hdr + 4), h = s_be32(hdr + 8), w = s_be32(hdr + 12);
    if (n == 0 || n > IDX_MAX_ITEMS || h != 28 || w != 28) {
        mq_err_set("%s: bad header: %u images of %ux%u (expected 1..%u images of 28x28)", path,
                   n, h, w, IDX_MAX_ITEMS);
        goto err;
    }
    size_t len = (size_t)n * 784;
    d->n = (int)n, d->c = 1, d->h = 28, d->w = 28, d->crop = false;
    if (gzdirect(f)) { /* plain: mapped, its pages shared by every process that loads it */
        gzclose(f);
        return s_idx_map(path, len, d);
    }
    d->pixels = malloc(len);
    if (!d->pixels) {
        mq_err_set("%s: out of memory for %u images", path, n);
        goto err;
    }
    if (s_read(f, path, "the pixels", d->pixels, len) < 0 || s_expect_end(f, path) < 0)
        goto err;
    gzclose(f);
    return 0;
err:
    gzclose(f);
    return -1;
}

/* An IDX labels file: magic 0x00000801, count, then count label bytes, each 0..9; the count
 * must match the images'. */
static int s_idx_labels(const char *kind, const char *dir, const char *base, mq_dataset_t *d)
{
    char path[4096];
    unsigned char hdr[8];
    gzFile f = s_open(kind, dir, base, path, sizeof path);
    if (!f)
        return -1;
    if (s_read(f, path, "the 8-byte header", hdr, sizeof hdr) < 0)
        goto err;
    if (s_be32(hdr) != 0x801) {
        mq_err_set("%s: wrong magic 0x%08x (expected 0x00000801, IDX unsigned-byte labels)",
                   path, s_be32(hdr));
        goto err;
    }
    uint32_t n = s_be32(hdr + 4);
    if (n != (uint32_t)d->n) {
        mq_err_set("%s: size mismatch: %u labels for %d images", path, n, d->n);
        goto err;
    }
    d->labels = malloc(n);
    if (!d->labels) {
        mq_err_set("%s: out of memory", path);
        goto err;
    }
    if (s_read(f, path, "the labels", d->labels, n) < 0 || s_expect_end(f, path) < 0)
        goto err;
    for (uint32_t i = 0; i < n; i++)
        if (d->labels[i] > 9) {
            mq_err_set("%s: label %u of example %u out of range 0..9", path, d->labels[i], i);
            goto err;
        }
    gzclose(f);
    return 0;
err:
    gzclose(f);
    return -1;
}

/* Appends the records of one CIFAR-10 binary file (label byte + 3x32x32 pixels each). */
static int s_cifar_file(const char *kind, const char *dir, const char *base, mq_dataset_t *d)
{
    char path[4096];
    gzFile f = s_open(kind, dir, base, path, sizeof path);
    if (!f)
        return -1;
    unsigned char rec[CIFAR_RECORD];
    for (int i = 0;; i++) {
        int r = gzread(f, rec, sizeof rec);
        if (r == 0 && i > 0)
            break;
        if (r != (int)sizeof rec) {
            int zerr;
            if (r < 0)
                mq_err_set("%s: corrupt compressed data: %s", path, gzerror(f, &zerr));
            else
                mq_err_set("%s: truncated: record %d has %d of %d bytes (the size must be a "
                           "multiple of %d)", path, i, r, CIFAR_RECORD, CIFAR_RECORD);
            gzclose(f);
            return -1;
        }
        if (rec[0] > 9) {
            mq_err_set("%s: label %u of record %d out of range 0..9", path, rec[0], i);
            gzclose(f);
            return -1;
        }
        if (d->n % 1024 == 0) {
            size_t cap = (size_t)d->n + 1024;
            uint8_t *im = realloc(d->pixels, cap * 3072);
            uint8_t *lb = im ? realloc(d->labels, cap) : NULL;
            if (im)
                d->pixels = im;
            if (!im || !lb) {
                mq_err_set("%s: out of memory", path);
                gzclose(f);
                return -1;
            }
            d->labels = lb;
        }
        d->labels[d->n] = rec[0];
        memcpy(d->pixels + (size_t)d->n * 3072, rec + 1, 3072);
        d->n++;
    }
    gzclose(f);
    return 0;
}

mq_dataset_t *mq_dataset_load(const char *kind, const char *dir, bool train)
{
    mq_dataset_t *d = calloc(1, sizeof *d);
    if (!d) {
        mq_err_set("out of memory");
        return NULL;
    }
    dir = mq_dataset_dir(kind, dir);
    if (kind && (strcmp(kind, "fashion-mnist") == 0 || strcmp(kind, "mnist") == 0)) {
        const char *pre = train ? "train" : "t10k";
        char img[64], lab[64];
        snprintf(img, sizeof img, "%s-images-idx3-ubyte", pre);
        snprintf(lab, sizeof lab, "%s-labels-idx1-ubyte", pre);
        if (s_idx_images(kind, dir, img, d) < 0 || s_idx_labels(kind, dir, lab, d) < 0)
            goto err;
    } else if (kind && strcmp(kind, "cifar10") == 0) {
        d->c = 3, d->h = 32, d->w = 32, d->crop = true;
        for (int i = 1; i <= (train ? CIFAR_TRAIN_FILES : 1); i++) {
            char base[64];
            if (train)
                snprintf(base, sizeof base, "data_batch_%d.bin", i);
            else
                snprintf(base, sizeof base, "test_batch.bin");
            if (s_cifar_file(kind, dir, base, d) < 0)
                goto err;
        }
    } else {
        mq_err_set("unknown dataset '%s' (expected fashion-mnist, mnist or cifar10)",
                   kind ? kind : "(null)");
        goto err;
    }
    return d;
err:
    mq_dataset_destroy(&d);
    return NULL;
}

void mq_dataset_destroy(mq_dataset_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    if ((*self_p)->map)
        munmap((*self_p)->map, (*self_p)->map_len);
    else
        free((*self_p)->pixels);
    free((*self_p)->labels);
    free(*self_p);
    *self_p = NULL;
}

int mq_dataset_channels(const mq_dataset_t *d)
{
    return d->c;
}
