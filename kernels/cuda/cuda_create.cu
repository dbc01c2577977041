/*
 * cuda_create.cu: casts between dtypes, constant fills, ranges and random
 * numbers on the GPU, the CUDA twins of kernels/cpu/cpu_create.c.
 *
 * - cast: the same dtype is a device copy; anything else widens each element
 *   to f32 (exact for u8, f16, bf16; what the CPU does for i32) and stores it
 *   with mp_st, which saturates integers and maps NaN to 0 as the CPU does.
 * - fill: integer values are converted from the double on the host, exactly as
 *   cpu_fill does; float values are rounded to f32 first, then to the dtype.
 * - rand_uniform, rand_normal: Philox4x32-10 with counter offset + i and key
 *   seed, so element i is the same value on every backend (the normal values
 *   agree up to the rounding of logf, cosf and sqrtf).
 */
#include "kernels/cuda/cuda.h"

/* ---- cast ---- */

static __global__ void cast_k(void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n)
{
    MP_FOR(i, n) mp_st(dd, dst, i, mp_ld(sd, src, i));
}

void mp_cuda_cast(void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n)
{
    if (n <= 0) return;
    if (dd == sd) {
        MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * mp_dtype_size(dd), cudaMemcpyDeviceToDevice,
                                      mp_cuda_stream), "cast (copy)");
        return;
    }
    cast_k<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(dst, dd, src, sd, n);
    MP_LAUNCHED("cast");
}

/* ---- fill and arange ---- */

/* integer dtypes store iv as is; float dtypes round f */
static __global__ void fill_k(void *dst, mp_dtype dt, int64_t n, float f, int32_t iv)
{
    MP_FOR(i, n) {
        if (dt == MP_I32) ((int32_t *)dst)[i] = iv;
        else if (dt == MP_U8) ((uint8_t *)dst)[i] = (uint8_t)iv;
        else mp_st(dt, dst, i, f);
    }
}

void mp_cuda_fill(void *dst, mp_dtype dt, int64_t n, double value)
{
    if (n <= 0) return;
    int32_t iv = 0;
    if (dt == MP_I32)   /* exact, not through f32 */
        iv = isnan(value) ? 0 : value >= INT32_MAX ? INT32_MAX : value <= INT32_MIN ? INT32_MIN : (int32_t)value;
    else if (dt == MP_U8)
        iv = isnan(value) || value <= 0 ? 0 : value >= 255 ? 255 : (int32_t)value;
    fill_k<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(dst, dt, n, (float)value, iv);
    MP_LAUNCHED("fill");
}

/* integers wrap as the CPU's casts of the index do */
static __global__ void arange_k(void *dst, mp_dtype dt, int64_t n)
{
    MP_FOR(i, n) {
        if (dt == MP_I32) ((int32_t *)dst)[i] = (int32_t)i;
        else if (dt == MP_U8) ((uint8_t *)dst)[i] = (uint8_t)i;
        else mp_st(dt, dst, i, (float)i);
    }
}

void mp_cuda_arange(void *dst, mp_dtype dt, int64_t n)
{
    if (n <= 0) return;
    arange_k<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(dst, dt, n);
    MP_LAUNCHED("arange");
}

/* ---- random numbers ---- */

/* Philox4x32-10: four 32-bit outputs for the counter (counter, 0) and a 64-bit key */
static __device__ __forceinline__ void philox(uint64_t counter, uint64_t key, uint32_t out[4])
{
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1, c3 = (uint32_t)p0, c0 = n0, c2 = n2;
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* uniform in [0, 1) from the top `bits` bits of x: exact, as on the CPU */
static __device__ __forceinline__ float unit_bits(uint32_t x, int bits)
{
    return (float)(x >> (32 - bits)) * (1.0f / (float)(1u << bits));
}

/* uniform: as many random bits as the dtype's significand holds (24 for f32,
 * 11 for f16, 8 for bf16), so rounding to the dtype never gives 1 */
static __global__ void rand_uniform_k(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    int bits = dt == MP_F16 ? 11 : dt == MP_BF16 ? 8 : 24;
    MP_FOR(i, n) {
        uint32_t r[4];
        philox(offset + (uint64_t)i, seed, r);
        mp_st(dt, dst, i, unit_bits(r[0], bits));
    }
}

/* Box-Muller; 1 - u keeps the log's argument in (0, 1] */
static __global__ void rand_normal_k(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    MP_FOR(i, n) {
        uint32_t r[4];
        philox(offset + (uint64_t)i, seed, r);
        float u1 = 1.0f - unit_bits(r[0], 24), u2 = unit_bits(r[1], 24);
        mp_st(dt, dst, i, sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2));
    }
}

void mp_cuda_rand_uniform(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    if (n <= 0) return;
    rand_uniform_k<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(dst, dt, n, seed, offset);
    MP_LAUNCHED("rand_uniform");
}

void mp_cuda_rand_normal(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    if (n <= 0) return;
    rand_normal_k<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(dst, dt, n, seed, offset);
    MP_LAUNCHED("rand_normal");
}
