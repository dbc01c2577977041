/*
 * data.h: reading datasets and ordering them for training.
 *
 * mp_read_idx reads an IDX file (the MNIST format), gzip-compressed or raw,
 * into a CPU tensor. The file is untrusted input: a short, corrupt or lying
 * file fails with a message that names the path and the problem, never with
 * an out-of-bounds access or an allocation sized by the header alone.
 *
 * mp_read_file_bytes reads a text file for mp.data.text: a regular file only,
 * refused by its kind or size before anything is read, into a u8 tensor;
 * mp_byte_vocab and mp_byte_ids turn bytes into character-level token ids.
 *
 * mp_randperm gives the shuffled order of a data loader's epoch. It is a pure
 * function of (n, seed), so a seeded run is bit-reproducible on every machine.
 */
#ifndef MP_DATA_H
#define MP_DATA_H

#include "engine/tensor.h"

/* The largest payload an IDX file may declare (16 GiB): far above any dataset
 * this engine trains on, far below what would overflow a size computation. */
#define MP_IDX_MAX_BYTES ((int64_t)1 << 34)

/* An IDX file as a CPU tensor: type u8 -> u8; i8, i16, i32 -> i32 (exact);
 * f32 -> f32. f64 is rejected (narrowing it silently would lose data). */
mp_tensor *mp_read_idx(const char *path);

/* The bytes of the regular file at path as a 1-d u8 CPU tensor in *out (NULL
 * for an empty file: tensors have no zero sizes). Never blocks in open and never
 * reads more than max_bytes: a directory, FIFO, device or socket fails naming
 * what it is ("path 'p' is a directory, not a regular file"), as does a file of
 * more than max_bytes bytes, by fstat or by what reading it gives. Returns 0, or
 * -1 with the message (data_file.c). */
int mp_read_file_bytes(const char *path, int64_t max_bytes, mp_tensor **out);

/* The distinct bytes of p[0..n) in increasing order into vocab; their count. */
int mp_byte_vocab(const unsigned char *p, int64_t n, unsigned char vocab[256]);

/* p[0..n) (n >= 1) as a 1-d i32 CPU tensor of ids: each byte's index in vocab
 * (nvocab distinct bytes). A byte not in vocab fails, naming it and its offset. */
mp_tensor *mp_byte_ids(const unsigned char *p, int64_t n, const unsigned char *vocab, int nvocab);

/* A uniformly random permutation of 0..n-1 as a 1-d i32 CPU tensor:
 * Fisher-Yates driven by xoshiro256** seeded from `seed` through splitmix64.
 * n must lie in [1, INT32_MAX] (the indices are i32). */
mp_tensor *mp_randperm(int64_t n, uint64_t seed);

/* A 64-bit seed drawn from the engine's global random stream (mp_manual_seed):
 * a hash of the stream's (seed, offset), after which the offset moves on by two
 * 32-bit draws. Deterministic after mp_manual_seed, different on each call, and
 * saved with the generator state in checkpoints. */
uint64_t mp_draw_seed(void);

#endif
