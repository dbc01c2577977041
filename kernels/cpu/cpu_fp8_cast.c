/*
 * cpu_fp8_cast.c: the CPU's bulk FP8 (e4m3, e5m2) conversions, for casts and
 * for cpu_load / cpu_store. Every result is kernels/fp8.h's, bit for bit:
 * decoding reads a table of the 256 codes' f32 values made by mp_fp8_to_f32;
 * encoding calls mp_f32_to_fp8 on each element (plain integer code that the
 * compiler inlines; a cast is a memory pass, and FP8 casts are rare enough
 * that a vector encoder is not worth its second copy of the rounding rules).
 */
#include <math.h>
#include <pthread.h>
#include "kernels/cpu/cpu_fp8_cast.h"
#include "kernels/fp8.h"

static float lut[2][256];   /* [0]: e4m3, [1]: e5m2 */
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void lut_make(void)
{
    for (int c = 0; c < 256; c++) {
        lut[0][c] = mp_fp8_to_f32((uint8_t)c, MP_FP8_E4M3);
        lut[1][c] = mp_fp8_to_f32((uint8_t)c, MP_FP8_E5M2);
    }
}

void cpu_fp8_decode(mp_dtype dt, const uint8_t *src, float *dst, int64_t n)
{
    pthread_once(&lut_once, lut_make);
    const float *t = lut[dt == MP_E5M2];
    for (int64_t j = 0; j < n; j++) dst[j] = t[src[j]];
}

void cpu_fp8_encode(mp_dtype dt, uint8_t *dst, const float *src, int64_t n, int saturate)
{
    if (dt == MP_E5M2)
        for (int64_t j = 0; j < n; j++) dst[j] = mp_f32_to_fp8(src[j], MP_FP8_E5M2, saturate);
    else
        for (int64_t j = 0; j < n; j++) dst[j] = mp_f32_to_fp8(src[j], MP_FP8_E4M3, saturate);
}

/* f64 -> f32 rounded to odd: truncated toward zero, with the last bit set when
 * anything was dropped. An f32 so made rounds to a format of at most 22
 * significant bits exactly as the double itself would (24 >= 2p + 2), so f64
 * -> f32 -> fp8 rounds once, where a nearest-even f32 could round twice. */
float cpu_f64_to_f32_odd(double d)
{
    float f = (float)d;
    if (!(f == f) || (double)f == d || f - f != 0.0f) {
        /* NaN, exact, or f32's range left (inf, which every FP8 overflows alike) */
        return f;
    }
    uint32_t b = mp_f32_bits(f);
    if (fabs((double)f) > fabs(d)) b -= 1;   /* rounded away from zero: one step back (same sign) */
    return mp_bits_f32(b | 1u);
}
