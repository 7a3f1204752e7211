/* Shard checkpoints: a server's master copy and its update rule's state at the start of an
 * iteration, in one file per (run lineage, shard, iteration) under a checkpoint directory:
 *
 *   shard-<shard>-<lineage as 16 hex digits>-<iteration>.ckpt
 *
 * A file is a fixed header (magic "MQCKPT01", the fields of mq_ckpt_meta_t, the value counts),
 * the values (float32, shard-local order), the state values, and an FNV-1a 64 checksum of all
 * that. It is written whole to a temporary file, fsynced and renamed, so a crash leaves either
 * the old set of files or the new one. The two newest checkpoints of a shard are kept (the
 * scheduler may not have recorded the newest as consistent yet); older ones are removed.
 * A file that is missing, cut, corrupt or of another run, shard, model or update rule is
 * refused with the reason, and never overwritten. */
#ifndef MQGRAD_CHECKPOINT_H
#define MQGRAD_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t lineage;   /* the run's first id */
    uint64_t iter;      /* the iteration the values are the start of */
    uint32_t shard, servers;
    char model[16];
    char optimizer[64];
} mq_ckpt_meta_t;

/* DIR/shard-...ckpt for META into BUF. */
void mq_ckpt_path(const char *dir, const mq_ckpt_meta_t *meta, char *buf, size_t len);

/* Writes PARAMS[0..N) and STATE[0..NSTATE) as META's checkpoint in DIR (created if needed),
 * then removes the shard's checkpoints older than the previous one and than KEEP (the run's
 * last consistent checkpoint, which a failed save elsewhere may leave the only one to go
 * back to; 0: none). Returns 0, or -1 with an error naming the file. */
int mq_ckpt_write(const char *dir, const mq_ckpt_meta_t *meta, const float *params, size_t n,
                  const float *state, size_t nstate, uint64_t keep);

/* Reads WANT's checkpoint from DIR into PARAMS[0..N) and STATE[0..NSTATE), checking that every
 * field and both counts are WANT's and that the checksum holds. Returns 0, or -1 with an error
 * that names the file and what is wrong (nothing is written to PARAMS or STATE then... except
 * on a checksum failure, found after reading: the caller must not use them). */
int mq_ckpt_read(const char *dir, const mq_ckpt_meta_t *want, float *params, size_t n,
                 float *state, size_t nstate);

#ifdef __cplusplus
}
#endif
#endif
