/*
 * philox.h: the random number generator of every backend, written once.
 *
 * Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011): element i of a stream with key `seed` is drawn from counter
 * offset + i alone, so any backend, any thread layout and any split of a tensor
 * draws the same numbers. The CPU backend calls these functions on the host,
 * the CUDA backend in its kernels (MP_PHILOX_FN marks them for both), as
 * kernels/step_rules.h does for the loss scaler's rules.
 */
#ifndef MP_PHILOX_H
#define MP_PHILOX_H

#include <math.h>
#include <stdint.h>
#include "kernels/backend.h"

#ifdef __CUDACC__
#define MP_PHILOX_FN __host__ __device__ static inline
#else
#define MP_PHILOX_FN static inline
#endif

/* four 32-bit outputs for the 128-bit counter (counter, 0) and a 64-bit key */
MP_PHILOX_FN void mp_philox(uint64_t counter, uint64_t key, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
#ifdef __CUDACC__
#pragma unroll
#endif
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* uniform in [0, 1) from the top `bits` bits of x, exactly */
MP_PHILOX_FN float mp_unit_bits(uint32_t x, int bits)
{
    return (float)(x >> (32 - bits)) * (1.0f / (float)(1u << bits));
}

/* the random bits a uniform of dtype dt gets: as many as its significand holds
 * (24 for f32, 11 for f16, 8 for bf16), so rounding to the dtype never gives 1 */
MP_PHILOX_FN int mp_uniform_bits(mp_dtype dt) { return dt == MP_F16 ? 11 : dt == MP_BF16 ? 8 : 24; }

/* element i's uniform and normal (Box-Muller on the first two outputs; 1 - u
 * keeps the log's argument in (0, 1]) */
MP_PHILOX_FN float mp_philox_uniform(uint64_t seed, uint64_t i, int bits)
{
    uint32_t r[4];
    mp_philox(i, seed, r);
    return mp_unit_bits(r[0], bits);
}

MP_PHILOX_FN float mp_philox_normal(uint64_t seed, uint64_t i)
{
    uint32_t r[4];
    mp_philox(i, seed, r);
    float u1 = 1.0f - mp_unit_bits(r[0], 24), u2 = mp_unit_bits(r[1], 24);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}

#endif
