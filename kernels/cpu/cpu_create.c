/*
 * cpu_create.c: casts between dtypes, constant fills, ranges and random numbers.
 *
 * Random numbers come from Philox4x32-10 (Salmon et al., "Parallel random
 * numbers: as easy as 1, 2, 3"), a counter-based generator: element i is a pure
 * function of (seed, offset + i), so threads, backends and resumed runs all draw
 * the same values.
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/philox.h"

/* float -> integer without undefined behaviour: NaN to 0, saturate at the ends
 * (a double, so that f64 values are not rounded to f32 first; an f32 value
 * widens exactly and meets the same bounds) */
static int64_t to_int(double f, int64_t lo, int64_t hi)
{
    if (isnan(f)) return 0;
    if (f <= (float)lo) return lo;
    if (f >= (float)hi) return hi;
    return (int64_t)f;
}

/* n f32 values into float dtype dd at dst+i: an FP8 destination with the
 * cast's saturate flag, the others as cpu_store rounds */
static void store_block(mp_kctx *cx, mp_dtype dd, void *dst, int64_t i, const float *f, int64_t n, int saturate)
{
    if (cpu_is_fp8(dd)) cpu_fp8_encode(dd, (uint8_t *)dst + i, f, n, saturate);
    else cpu_store(cx, dd, dst, i, f, n);
}

/* casts from or to f64: widening is exact; narrowing to f32 rounds to nearest
 * even, to f16/bf16 through f32 (each step to nearest even), as PyTorch casts
 * a double and as Lua numbers become f16; to FP8 through an f32 rounded to odd,
 * so once (cpu_f64_to_f32_odd); to integers truncates and saturates */
static void cast_f64_block(mp_kctx *cx, void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t i, int64_t n,
                           int saturate)
{
    float f[MP_BLOCK];
    if (dd == MP_F64) {
        double *d = (double *)dst + i;
        if (sd == MP_I32) for (int64_t j = 0; j < n; j++) d[j] = ((const int32_t *)src)[i + j];
        else if (sd == MP_U8) for (int64_t j = 0; j < n; j++) d[j] = ((const uint8_t *)src)[i + j];
        else {
            cpu_load(sd, src, i, f, n);
            for (int64_t j = 0; j < n; j++) d[j] = f[j];
        }
        return;
    }
    const double *s = (const double *)src + i;
    if (dd == MP_I32) for (int64_t j = 0; j < n; j++) ((int32_t *)dst)[i + j] = (int32_t)to_int(s[j], INT32_MIN, INT32_MAX);
    else if (dd == MP_U8) for (int64_t j = 0; j < n; j++) ((uint8_t *)dst)[i + j] = (uint8_t)to_int(s[j], 0, 255);
    else if (cpu_is_fp8(dd)) {
        for (int64_t j = 0; j < n; j++) f[j] = cpu_f64_to_f32_odd(s[j]);
        cpu_fp8_encode(dd, (uint8_t *)dst + i, f, n, saturate);
    } else {
        for (int64_t j = 0; j < n; j++) f[j] = (float)s[j];
        cpu_store(cx, dd, dst, i, f, n);
    }
}

static void cast_block(mp_kctx *cx, void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t i, int64_t n,
                       int saturate)
{
    float f[MP_BLOCK];
    if (dd == MP_F64 || sd == MP_F64) { cast_f64_block(cx, dst, dd, src, sd, i, n, saturate); return; }
    if (sd == MP_I32) for (int64_t j = 0; j < n; j++) f[j] = (float)((const int32_t *)src)[i + j];
    else if (sd == MP_U8) for (int64_t j = 0; j < n; j++) f[j] = ((const uint8_t *)src)[i + j];
    else cpu_load(sd, src, i, f, n);

    if (dd == MP_I32 && sd == MP_U8) for (int64_t j = 0; j < n; j++) ((int32_t *)dst)[i + j] = ((const uint8_t *)src)[i + j];
    else if (dd == MP_U8 && sd == MP_I32)   /* saturate, as float -> u8 does */
        for (int64_t j = 0; j < n; j++) {
            int32_t v = ((const int32_t *)src)[i + j];
            ((uint8_t *)dst)[i + j] = v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
        }
    else if (dd == MP_I32) for (int64_t j = 0; j < n; j++) ((int32_t *)dst)[i + j] = (int32_t)to_int(f[j], INT32_MIN, INT32_MAX);
    else if (dd == MP_U8) for (int64_t j = 0; j < n; j++) ((uint8_t *)dst)[i + j] = (uint8_t)to_int(f[j], 0, 255);
    else store_block(cx, dd, dst, i, f, n, saturate);
}

void cpu_cast(mp_kctx *cx, void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n, int saturate)
{
    if (dd == sd) { memcpy(dst, src, (size_t)n * mp_dtype_size(dd)); return; }
    if (dd == MP_F32 && sd == MP_F16) { mp_cpu_f16_to_f32(dst, src, n); return; }
    if (dd == MP_F16 && sd == MP_F32) {
        mp_cpu_f32_to_f16(dst, src, n);
        if (cx && cx->flush.on) cpu_flush_count(&cx->flush, dd, src, dst, n);
        return;
    }
    if (dd == MP_F32 && sd == MP_BF16) { mp_cpu_bf16_to_f32(dst, src, n); return; }
    if (dd == MP_BF16 && sd == MP_F32) {
        mp_cpu_f32_to_bf16(dst, src, n);
        if (cx && cx->flush.on) cpu_flush_count(&cx->flush, dd, src, dst, n);
        return;
    }
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK)
        cast_block(cx, dst, dd, src, sd, i, n - i < MP_BLOCK ? n - i : MP_BLOCK, saturate);
}

void cpu_fill(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, double value)
{
    unsigned char one[8];
    if (dt == MP_F64) {   /* exact, not through f32 */
        memcpy(one, &value, 8);
    } else if (dt == MP_I32) {   /* exact, not through f32 */
        int32_t v = isnan(value) ? 0 : value >= INT32_MAX ? INT32_MAX
                  : value <= INT32_MIN ? INT32_MIN : (int32_t)value;
        memcpy(one, &v, 4);
    } else if (dt == MP_U8) {
        one[0] = isnan(value) || value <= 0 ? 0 : value >= 255 ? 255 : (uint8_t)value;
    } else {
        float f = (float)value;
        cpu_store(cx, dt, one, 0, &f, 1);
    }
    size_t es = mp_dtype_size(dt);
    if (memcmp(one, "\0\0\0\0\0\0\0\0", es) == 0) { memset(dst, 0, (size_t)n * es); return; }
    if (es == 8) {
        uint64_t v;
        memcpy(&v, one, 8);
        for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i] = v;
    } else if (es == 4) {
        uint32_t v;
        memcpy(&v, one, 4);
        for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = v;
    } else if (es == 2) {
        uint16_t v;
        memcpy(&v, one, 2);
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = v;
    } else {
        memset(dst, one[0], (size_t)n);
    }
}

void cpu_arange(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n)
{
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        if (dt == MP_I32) { for (int64_t j = 0; j < len; j++) ((int32_t *)dst)[i + j] = (int32_t)(i + j); continue; }
        if (dt == MP_U8) { for (int64_t j = 0; j < len; j++) ((uint8_t *)dst)[i + j] = (uint8_t)(i + j); continue; }
        if (dt == MP_F64) { for (int64_t j = 0; j < len; j++) ((double *)dst)[i + j] = (double)(i + j); continue; }
        float f[MP_BLOCK];
        for (int64_t j = 0; j < len; j++) f[j] = (float)(i + j);
        cpu_store(cx, dt, dst, i, f, len);
    }
}

/* f64 draws are f32's draws widened (24-bit uniforms, the f32 normal): the
 * same seed gives an f64 tensor equal to the f32 one cast up */
static void random_fill(mp_kctx *cx, int normal, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        float f[MP_BLOCK];
        int bits = mp_uniform_bits(dt);
        for (int64_t j = 0; j < len; j++)
            f[j] = normal ? mp_philox_normal(seed, offset + (uint64_t)(i + j))
                          : mp_philox_uniform(seed, offset + (uint64_t)(i + j), bits);
        cpu_store(cx, dt, dst, i, f, len);
    }
}

void cpu_rand_uniform(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    random_fill(cx, 0, dst, dt, n, seed, offset);
}

void cpu_rand_normal(mp_kctx *cx, void *dst, mp_dtype dt, int64_t n, uint64_t seed, uint64_t offset)
{
    random_fill(cx, 1, dst, dt, n, seed, offset);
}
