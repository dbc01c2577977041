/*
 * data_vocab.h: bytes into character-level token ids (mp.data.text): the
 * vocabulary of a text and each byte's id in it.
 */
#ifndef MP_DATA_VOCAB_H
#define MP_DATA_VOCAB_H

#include "engine/tensor.h"

/* The distinct bytes of p[0..n) in increasing order into vocab; their count. */
int mp_byte_vocab(const unsigned char *p, int64_t n, unsigned char vocab[256]);

/* p[0..n) (n >= 1) as a 1-d i32 CPU tensor of ids: each byte's index in vocab
 * (nvocab distinct bytes). A byte not in vocab fails, naming it and its offset. */
mp_tensor *mp_byte_ids(const unsigned char *p, int64_t n, const unsigned char *vocab, int nvocab);

#endif
