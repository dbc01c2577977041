/*
 * data_idx.h: reading an IDX file (the MNIST format), gzip-compressed or raw,
 * into a CPU tensor. The file is untrusted input: a short, corrupt or lying
 * file fails with a message that names the path and the problem, never with
 * an out-of-bounds access or an allocation sized by the header alone.
 */
#ifndef MP_DATA_IDX_H
#define MP_DATA_IDX_H

#include "engine/tensor.h"

/* The largest payload an IDX file may declare (16 GiB): far above any dataset
 * this engine trains on, far below what would overflow a size computation. */
#define MP_IDX_MAX_BYTES ((int64_t)1 << 34)

/* An IDX file as a CPU tensor: type u8 -> u8; i8, i16, i32 -> i32 (exact);
 * f32 -> f32. f64 is rejected (narrowing it silently would lose data). */
mp_tensor *mp_read_idx(const char *path);

#endif
