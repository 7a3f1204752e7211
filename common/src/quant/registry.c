/* The codec registry: every codec this build knows, one line each. Adding a codec is its
 * file (defining `const mq_codec_ops_t mq_codec_<name>_ops`) plus one line here. */

#include <stdio.h>
#include <string.h>

#include "quant_internal.h"

#define MQ_CODEC_DEF(name, id) extern const mq_codec_ops_t mq_codec_##name##_ops;
#include "mqgrad/codecs.def"
#undef MQ_CODEC_DEF

static const mq_codec_ops_t *const s_codecs[] = {
#define MQ_CODEC_DEF(name, id) &mq_codec_##name##_ops,
#include "mqgrad/codecs.def"
#undef MQ_CODEC_DEF
};
#define S_NCODECS (sizeof s_codecs / sizeof s_codecs[0])

const mq_codec_ops_t *const *mq_codec_all(size_t *n)
{
    *n = S_NCODECS;
    return s_codecs;
}

const mq_codec_ops_t *mq_codec_lookup(uint32_t id)
{
    /* The list is in id order, so this is an index in every build that keeps it so; the
     * loop covers one that does not. */
    if (id < S_NCODECS && s_codecs[id]->id == id)
        return s_codecs[id];
    for (size_t i = 0; i < S_NCODECS; i++)
        if (s_codecs[i]->id == id)
            return s_codecs[i];
    return NULL;
}

const mq_codec_ops_t *mq_codec_by_name(const char *name)
{
    for (size_t i = 0; name && i < S_NCODECS; i++)
        if (strcmp(s_codecs[i]->name, name) == 0)
            return s_codecs[i];
    return NULL;
}

void mq_codec_help(char *buf, size_t len)
{
    size_t w = 0;
    if (len)
        buf[0] = '\0';
    for (size_t i = 0; i < S_NCODECS; i++)
        mq_help_line(buf, len, &w, 34, s_codecs[i]->usage, s_codecs[i]->help);
}
