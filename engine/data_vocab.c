/*
 * data_vocab.c: bytes as token ids, for mp.data.text's character-level
 * vocabulary. The vocabulary is the distinct bytes of a text in increasing
 * order; a byte's id is its index there. One pass marks the bytes present,
 * one more maps each byte through a 256-entry table: the ids of a text cost
 * four bytes per byte, the i32 tensor mp.data.windows cuts batches from.
 */
#include <string.h>
#include "engine/data_vocab.h"
#include "engine/error.h"

int mp_byte_vocab(const unsigned char *p, int64_t n, unsigned char vocab[256])
{
    unsigned char seen[256] = {0};
    for (int64_t i = 0; i < n; i++) seen[p[i]] = 1;
    int k = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b]) vocab[k++] = (unsigned char)b;
    return k;
}

mp_tensor *mp_byte_ids(const unsigned char *p, int64_t n, const unsigned char *vocab, int nvocab)
{
    if (n < 1) return mp_fail(MP_EINVAL, "no bytes to encode (the text is empty)"), NULL;
    if (nvocab < 1 || nvocab > 256)
        return mp_fail(MP_EINVAL, "a vocabulary has 1 to 256 bytes (got %d)", nvocab), NULL;
    int id[256];
    for (int b = 0; b < 256; b++) id[b] = -1;
    for (int k = 0; k < nvocab; k++) {
        if (id[vocab[k]] >= 0) return mp_fail(MP_EINVAL, "the vocabulary repeats byte %d", vocab[k]), NULL;
        id[vocab[k]] = k;
    }
    for (int64_t i = 0; i < n; i++)   /* checked before the tensor exists: nothing to undo */
        if (id[p[i]] < 0)
            return mp_fail(MP_EINVAL, "byte %d (at offset %lld) is not in the vocabulary", p[i], (long long)i), NULL;
    mp_tensor *t = mp_empty(MP_I32, MP_CPU, 1, &n);
    if (!t) return NULL;
    int32_t *out = mp_data(t);
    for (int64_t i = 0; i < n; i++) out[i] = id[p[i]];
    return t;
}
