/* Helpers the fuzz targets share (fuzz_util.h). */
#include "fuzz_util.h"

#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char s_dir[256];
static int s_err_fd = 2;

/* Before libFuzzer closes stderr (-close_fd_mask), keep a descriptor of it. */
__attribute__((constructor)) static void s_keep_stderr(void)
{
    int fd = dup(2);
    if (fd >= 0)
        s_err_fd = fd;
}

void mq_fuzz_fail(const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof msg - 2)
        n = (int)sizeof msg - 2;
    msg[n++] = '\n';
    if (write(s_err_fd, msg, (size_t)n) < 0)
        abort();
    abort();
}

static void s_cleanup(void)
{
    DIR *d = opendir(s_dir);
    if (d) {
        char path[512];
        for (struct dirent *e; (e = readdir(d));) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof path, "%s/%s", s_dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(s_dir);
}

const char *mq_fuzz_dir(void)
{
    if (s_dir[0])
        return s_dir;
    struct stat st;
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : NULL;
    if (!base)
        base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(s_dir, sizeof s_dir, "%s/mqgrad-fuzz-XXXXXX", base);
    if (!mkdtemp(s_dir)) {
        perror("mq_fuzz_dir: mkdtemp");
        abort();
    }
    atexit(s_cleanup);
    return s_dir;
}

void mq_fuzz_path(const char *name, char *buf, size_t len)
{
    if ((size_t)snprintf(buf, len, "%s/%s", mq_fuzz_dir(), name) >= len)
        abort();
}

void mq_fuzz_write(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        abort();
    }
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n <= 0) {
            perror(path);
            abort();
        }
        p += n;
        len -= (size_t)n;
    }
    close(fd);
}

int mq_fuzz_strings(const uint8_t *data, size_t len, char **out, int max, char **block)
{
    *block = malloc(len + 1);
    if (!*block)
        abort();
    memcpy(*block, data, len);
    (*block)[len] = '\0';
    int n = 0;
    size_t i = 0;
    while (i < len && n < max) {
        out[n++] = *block + i;
        i += strlen(*block + i) + 1;
    }
    return n;
}

int mq_fuzz_frame(const uint8_t **p, const uint8_t *end, const uint8_t **frame, size_t *flen)
{
    if (end - *p < 2)
        return 0;
    size_t n = (size_t)(*p)[0] | (size_t)(*p)[1] << 8;
    *p += 2;
    if (n > (size_t)(end - *p))
        n = (size_t)(end - *p);
    *frame = *p;
    *flen = n;
    *p += n;
    return 1;
}

uint32_t mq_fuzz_u32(const uint8_t *p, const uint8_t *end)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        if (p + i < end)
            v |= (uint32_t)p[i] << (8 * i);
    return v;
}
