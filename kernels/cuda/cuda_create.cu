/*
 * cuda_create.cu: casts between dtypes, constant fills, ranges and random
 * numbers on the GPU, the CUDA twins of kernels/cpu/cpu_create.c.
 *
 * - cast: the same dtype is a device copy; anything else widens each element
 *   to f32 (exact for u8, f16, bf16; what the CPU does for i32) and stores it
 *   with mp_st, which saturates integers and maps NaN to 0 as the CPU does.
 *   When both pointers are 16-byte aligned a thread converts 16/s elements at
 *   a time (s: the smaller element size), with 128-bit loads and stores.
 * - fill: the value's bits are computed once on the host, as cpu_fill does
 *   (integers converted from the double, floats rounded to f32 and then to the
 *   dtype, one rounding that flush counting counts once, as the CPU's), then
 *   written as words, 16 bytes at a time where aligned; zero bits and u8 are a
 *   memset.
 * - FP8 (e4m3, e5m2) on either side: one element a thread through f32 with
 *   kernels/fp8.h's conversions, the CPU's bits exactly; saturate picks the
 *   overflow rule of an FP8 destination. (sm_89's cvt.rn.satfinite intrinsics
 *   saturate only, and a cast is a memory pass either way.)
 * - Every rounding to f16/bf16 is tallied for flush counting (cuda.h).
 * - rand_uniform, rand_normal: Philox4x32-10 with counter offset + i and key
 *   seed, so element i is the same value on every backend (the normal values
 *   agree up to the rounding of logf, cosf and sqrtf). Queued inside a capture,
 *   the kernel reads the seed and the base of its offset from the graph's pair
 *   when it runs (cuda.h mp_cuda_rng_pair): each replay draws anew.
 */
#include <string.h>
#include "kernels/cuda/cuda.h"
#include "kernels/philox.h"

/* ---- cast ---- */

static __global__ void cast_k(void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n,
                              unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) mp_stc(dd, dst, i, mp_ld(sd, src, i), t);
    t.commit();
}

/* either dtype FP8: decoded exactly by mp_ld, encoded with the cast's saturate
 * flag. FP8 into f16/bf16 is exact, and goes through kernels/half.h so that a
 * NaN code gives the CPU's NaN bits (the intrinsics give 0x7fff, a canonical
 * NaN of their own) */
static __global__ void cast_fp8_k(void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n, int saturate,
                                  unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) {
        float v = mp_ld(sd, src, i);
        if (dd == MP_E4M3) ((uint8_t *)dst)[i] = mp_f32_to_fp8(v, MP_FP8_E4M3, saturate);
        else if (dd == MP_E5M2) ((uint8_t *)dst)[i] = mp_f32_to_fp8(v, MP_FP8_E5M2, saturate);
        else if (dd == MP_F16) ((uint16_t *)dst)[i] = mp_f32_to_f16(v);
        else if (dd == MP_BF16) ((uint16_t *)dst)[i] = mp_f32_to_bf16(v);
        else mp_stc(dd, dst, i, v, t);
    }
    t.commit();
}

/* the 128-bit path: G = 16/min(size) elements a thread, dst and src 16-byte aligned */
template <class TI, class TO>
static __global__ void cast_vec_k(void *dst, const void *src, int64_t n, unsigned long long *fc)
{
    constexpr int SI = mp_ty<TI>::S, SO = mp_ty<TO>::S, G = 16 / (SI < SO ? SI : SO);
    mp_tally t(fc);
    const int64_t ng = n / G;
    MP_FOR(g, ng) {
        float f[G];
        mp_ldv<TI, G>((const char *)src + g * (G * SI), f);
        mp_stv<TO, G>((char *)dst + g * (G * SO), f, t);
    }
    const int64_t i = ng * G + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) mp_put<TO>(dst, i, mp_get<TI>(src, i), t);
    t.commit();
}

void mp_cuda_cast(mp_kctx *cx, void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n, int saturate)
{
    if (n <= 0) return;
    if (dd == sd) {
        MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * mp_dtype_size(dd), cudaMemcpyDeviceToDevice,
                                      cx->stream), "cast (copy)");
        return;
    }
    if (dd == MP_E4M3 || dd == MP_E5M2 || sd == MP_E4M3 || sd == MP_E5M2) {
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, cast_fp8_k, dst, dd, src, sd, n, saturate, cx->flush);
    } else if (mp_al16(dst) && mp_al16(src)) {
        size_t es = mp_dtype_size(dd) < mp_dtype_size(sd) ? mp_dtype_size(dd) : mp_dtype_size(sd);
        unsigned blocks = mp_blocks(n / (int64_t)(16 / es));
        MP_BY_DTYPE(sd, TI, MP_BY_DTYPE(dd, TO, MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, cast_vec_k<TI, TO>, dst,
                                                          src, n, cx->flush)));
    } else {
        MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, cast_k, dst, dd, src, sd, n, cx->flush);
    }
    MP_LAUNCHED("cast");
}

/* ---- fill and arange ---- */

/* n elements of S bytes set to the bits b: 16 bytes a store from the start when
 * vec (dst 16-byte aligned), then one element a store */
template <int S>
static __global__ void fill_k(void *dst, int64_t n, uint32_t b, int vec)
{
    typedef typename mp_word<S>::W W;
    constexpr int G = 16 / S;
    const uint32_t w = S == 4 ? b : S == 2 ? (b & 0xffffu) * 0x10001u : (b & 0xffu) * 0x01010101u;
    const int64_t ng = vec ? n / G : 0;
    MP_FOR(g, ng) ((uint4 *)dst)[g] = make_uint4(w, w, w, w);
    for (int64_t i = ng * G + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        ((W *)dst)[i] = (W)b;
}

void mp_cuda_fill(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, double value)
{
    if (n <= 0) return;
    uint32_t bits = 0;
    if (dt == MP_I32) {   /* exact, not through f32 */
        int32_t iv = isnan(value) ? 0 : value >= INT32_MAX ? INT32_MAX : value <= INT32_MIN ? INT32_MIN : (int32_t)value;
        bits = (uint32_t)iv;
    } else if (dt == MP_U8) {
        bits = isnan(value) || value <= 0 ? 0 : value >= 255 ? 255 : (uint32_t)value;
    } else if (dt == MP_E4M3 || dt == MP_E5M2) {   /* through f32, not saturating: cpu_fill's cpu_store */
        bits = mp_f32_to_fp8((float)value, dt == MP_E4M3 ? MP_FP8_E4M3 : MP_FP8_E5M2, 0);
    } else {
        float f = (float)value;
        if (dt == MP_F32) {
            memcpy(&bits, &f, 4);
        } else {   /* the one rounding, made here and counted as the CPU counts it */
            bits = dt == MP_F16 ? __half_as_ushort(__float2half_rn(f)) : __bfloat16_as_ushort(__float2bfloat16_rn(f));
            uint32_t mag = bits & 0x7fffu;
            mp_cuda_flush_host(cx, 1, mag == 0 && f != 0.0f, mag == (dt == MP_F16 ? 0x7c00u : 0x7f80u) && isfinite(f));
        }
    }
    size_t es = mp_dtype_size(dt);
    if (bits == 0 || es == 1) {
        MP_CUDA_CHECK(cudaMemsetAsync(dst, (int)(bits & 0xff), (size_t)n * es, cx->stream), "fill");
        return;
    }
    int vec = mp_al16(dst);
    unsigned blocks = mp_blocks(vec ? n / (int64_t)(16 / es) : n);
    if (es == 4) MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, fill_k<4>, dst, n, bits, vec);
    else MP_LAUNCH(blocks, MP_THREADS, 0, cx->stream, fill_k<2>, dst, n, bits, vec);
    MP_LAUNCHED("fill");
}

/* integers wrap as the CPU's casts of the index do */
static __global__ void arange_k(void *dst, mp_dtype dt, int64_t n, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) {
        if (dt == MP_I32) ((int32_t *)dst)[i] = (int32_t)i;
        else if (dt == MP_U8) ((uint8_t *)dst)[i] = (uint8_t)i;
        else mp_stc(dt, dst, i, (float)i, t);
    }
    t.commit();
}

void mp_cuda_arange(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n)
{
    if (n <= 0) return;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, arange_k, dst, dt, n, cx->flush);
    MP_LAUNCHED("arange");
}

/* ---- random numbers ---- */

/* uniform: as many random bits as the dtype's significand holds (24 for f32,
 * 11 for f16, 8 for bf16), so rounding to the dtype never gives 1 */
static __global__ void rand_uniform_k(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset,
                                      const uint64_t *pair, unsigned long long *fc)
{
    mp_rng_from(pair, seed, offset);
    int bits = mp_uniform_bits(dt);
    mp_tally t(fc);
    MP_FOR(i, n) mp_stc(dt, dst, i, mp_philox_uniform(seed, offset + (uint64_t)i, bits), t);
    t.commit();
}

/* Box-Muller; 1 - u keeps the log's argument in (0, 1] */
static __global__ void rand_normal_k(void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset,
                                     const uint64_t *pair, unsigned long long *fc)
{
    mp_rng_from(pair, seed, offset);
    mp_tally t(fc);
    MP_FOR(i, n) mp_stc(dt, dst, i, mp_philox_normal(seed, offset + (uint64_t)i), t);
    t.commit();
}

void mp_cuda_rand_uniform(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    const uint64_t *pair;
    if (n <= 0 || mp_cuda_rng_pair(cx, mp_cuda_capturing(cx), &pair, "rand_uniform (the graph's random state)")) return;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, rand_uniform_k, dst, dt, n, seed, offset, pair, cx->flush);
    MP_LAUNCHED("rand_uniform");
}

void mp_cuda_rand_normal(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    const uint64_t *pair;
    if (n <= 0 || mp_cuda_rng_pair(cx, mp_cuda_capturing(cx), &pair, "rand_normal (the graph's random state)")) return;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, rand_normal_k, dst, dt, n, seed, offset, pair, cx->flush);
    MP_LAUNCHED("rand_normal");
}
