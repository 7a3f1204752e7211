/* Helpers the fuzz targets share: a private scratch directory on tmpfs for the readers that
 * take a path, whole-file writes, and splitting an input into strings or length-prefixed
 * frames. */
#ifndef MQGRAD_FUZZ_UTIL_H
#define MQGRAD_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* A directory of this process under /dev/shm (or $TMPDIR, or /tmp, when there is no
 * /dev/shm), made on the first call and removed with its files at exit. Aborts if it cannot
 * be made: a target that cannot write its file would fuzz nothing. */
const char *mq_fuzz_dir(void);
/* DIR/NAME into BUF (aborts if it does not fit). */
void mq_fuzz_path(const char *name, char *buf, size_t len);
/* Writes DATA[0..LEN) to PATH, replacing it (aborts on failure). */
void mq_fuzz_write(const char *path, const void *data, size_t len);

/* Cuts DATA[0..LEN) at NUL bytes into at most MAX NUL-terminated strings copied into one
 * malloc'd block (*BLOCK, to free); returns how many. An input without a final NUL still
 * ends its last string. */
int mq_fuzz_strings(const uint8_t *data, size_t len, char **out, int max, char **block);

/* The frame format of the wire and codec targets: a little-endian u16 length, then that
 * many bytes (fewer when the input ends first). Reads the next frame at *P (before END) into
 * *FRAME, *FLEN and advances *P; 0 when the input is used up. */
int mq_fuzz_frame(const uint8_t **p, const uint8_t *end, const uint8_t **frame, size_t *flen);

/* Reports a broken promise of the code under test and aborts (a crash libFuzzer records).
 * The message goes to the stderr the process started with, which -close_fd_mask=2 keeps for
 * this alone. */
void mq_fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* Little-endian reads that return 0 past END. */
uint32_t mq_fuzz_u32(const uint8_t *p, const uint8_t *end);

#endif
