/*
 * data_perm.h: the shuffled order of a data loader's epoch. It is a pure
 * function of (n, seed), so a seeded run is bit-reproducible on every machine;
 * the seed of an unseeded loader is drawn from the engine's random stream.
 */
#ifndef MP_DATA_PERM_H
#define MP_DATA_PERM_H

#include "engine/tensor.h"

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
