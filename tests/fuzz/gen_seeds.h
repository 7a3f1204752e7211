/* What the seed generator (gen_corpus.c) and the targets agree on: the shard checkpoint the
 * seeds hold, and the order of the run files in a fuzz_runfiles input. */
#ifndef MQGRAD_FUZZ_GEN_SEEDS_H
#define MQGRAD_FUZZ_GEN_SEEDS_H

#include <stdio.h>
#include <string.h>

#include "mqgrad/checkpoint.h"

#define MQ_FUZZ_SEED_CKPT_N 48
#define MQ_FUZZ_SEED_CKPT_NSTATE 48

static inline void mq_fuzz_seed_ckpt_meta(mq_ckpt_meta_t *m)
{
    memset(m, 0, sizeof *m);
    m->lineage = 0x5eed00000000c0deULL;
    m->iter = 200;
    m->shard = 1;
    m->servers = 2;
    snprintf(m->model, sizeof m->model, "small");
    snprintf(m->optimizer, sizeof m->optimizer, "momentum");
}

/* fuzz_runfiles: byte 0 says which of these files exist (bit k: the k-th), the rest of the
 * input is their contents in this order, each ended by a NUL byte. */
#define MQ_FUZZ_RUN_FILES                                                                      \
    { "config.json", "summary.json", "metrics.csv", "checkpoint.json", "local.args" }
#define MQ_FUZZ_NRUN_FILES 5

#endif
