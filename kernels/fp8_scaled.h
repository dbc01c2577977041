/*
 * fp8_scaled.h: what both backends' scaled FP8 kernels share (CPU:
 * kernels/cpu/cpu_fp8.h; CUDA: kernels/cuda/cuda_fp8_gemm.cu): the scale
 * granularities, a quantized operand, a quantization's statistics.
 *
 * A quantized operand X {rows, k} (row-major, k the reduction axis, as a GEMM
 * reads both its operands in the "TN" layout) is its codes q {rows, k} and its
 * decode scales d: X(i, j) ~ fp8_to_f32(q(i, j)) * d(group of (i, j)). The
 * groups, and d's layout (nk(g) = ceil(k / g)):
 *   MP_FP8_TENSOR  one scale (f32)
 *   MP_FP8_TILE    1 x 128 tiles along k: d {rows, nk(128)} (f32)
 *   MP_FP8_BLOCK   128 x 128 blocks: d {ceil(rows / 128), nk(128)} (f32)
 *   MP_FP8_MX      OCP MX blocks of 32 along k: E8M0 bytes {rows, nk(32)},
 *                  byte b meaning 2^(b - 127), 0xff NaN
 * d is the decode scale: what multiplies the codes' values back to X, and
 * what a GEMM applies to its accumulators (cuBLASLt's A/B scale pointers
 * take the same number). A quantizer multiplies X by s and stores d = 1 / s.
 */
#ifndef MP_FP8_SCALED_H
#define MP_FP8_SCALED_H

#include <stdint.h>
#include "kernels/fp8.h"

typedef enum { MP_FP8_TENSOR, MP_FP8_TILE, MP_FP8_BLOCK, MP_FP8_MX } mp_fp8_gran;

/* how the modelled accumulator (kernels/cpu/cpu_fp8_gemm.c) rounds its
 * partial sums: to nearest even, or toward zero (truncation) */
typedef enum { MP_FP8_ACC_NEAREST, MP_FP8_ACC_TRUNCATE } mp_fp8_acc_round;

#define MP_FP8_TILE_K 128   /* tile and block length along k (DeepSeek-V3's) */
#define MP_FP8_BLOCK_ROWS 128
#define MP_FP8_MX_K 32      /* OCP MX block */

/* the number of decode scales of a {rows, k} operand quantized with g */
static inline int64_t mp_fp8_nscales(mp_fp8_gran g, int64_t rows, int64_t k)
{
    int64_t nk = (k + MP_FP8_TILE_K - 1) / MP_FP8_TILE_K;
    switch (g) {
    case MP_FP8_TENSOR: return 1;
    case MP_FP8_TILE: return rows * nk;
    case MP_FP8_BLOCK: return (rows + MP_FP8_BLOCK_ROWS - 1) / MP_FP8_BLOCK_ROWS * nk;
    case MP_FP8_MX: return rows * ((k + MP_FP8_MX_K - 1) / MP_FP8_MX_K);
    }
    return 0;
}

/* what a quantization saw: the input's amax (NaN when any input was NaN),
 * the elements whose scaled value x s rounds past the format's largest finite
 * value (they were saturated to it; an infinity too), and the nonzero finite
 * inputs whose code is a zero (flushed) */
typedef struct {
    float amax;
    int64_t saturated, flushed;
} mp_fp8_stats;

/* a quantized operand {rows, k}: its codes, format, granularity and scales
 * (float *, or E8M0 bytes for mx), all on the backend's device */
typedef struct {
    const uint8_t *q;
    mp_fp8_format fmt;
    mp_fp8_gran g;
    const void *scales;
} mp_fp8_operand;

#endif
