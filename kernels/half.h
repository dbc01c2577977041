/*
 * half.h: scalar f16/bf16 <-> f32 conversion, header only.
 *
 * These are the reference conversions of the engine: every other path (the
 * F16C bulk path in kernels/cpu/convert.c, a GPU kernel) must give the same
 * bits for every input. They are plain integer C, so the answer does not
 * depend on the processor, the compiler flags or the FPU state (rounding
 * mode, flush-to-zero, denormals-are-zero).
 *
 * f16 is IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
 *   f32 -> f16 rounds to nearest, ties to even. Subnormals are kept. A value
 *   whose magnitude is >= 65520 (the midpoint between 65504, the largest f16,
 *   and 65536) becomes inf. NaN stays NaN exactly as the x86 F16C instruction
 *   vcvtps2ph makes it: sign kept, quiet bit (0x200) set, the top 9 payload
 *   bits below the f32 quiet bit kept:  sign | 0x7e00 | (f32 mantissa >> 13).
 *   f16 -> f32 is exact. NaN comes out as vcvtph2ps makes it: sign kept,
 *   payload shifted up, quiet bit set.
 *
 * bf16 is the top half of an f32: 1 sign, 8 exponent, 7 mantissa bits.
 *   f32 -> bf16 rounds to nearest, ties to even, on the low 16 bits; inf stays
 *   inf, finite values past the largest bf16 midpoint become inf, subnormals are
 *   kept, NaN is quieted (0x0040) with sign and top payload bits kept.
 *   bf16 -> f32 is exact (a shift); it does not touch NaNs.
 */
#ifndef MP_HALF_H
#define MP_HALF_H

#include <stdint.h>
#include <string.h>

/* usable from CUDA device code too, where memcpy of 4 bytes is fine */
#ifdef __CUDACC__
#define MP_HALF_FN static inline __host__ __device__
#else
#define MP_HALF_FN static inline
#endif

MP_HALF_FN uint32_t mp_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

MP_HALF_FN float mp_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

MP_HALF_FN uint16_t mp_f32_to_f16(float f)
{
    uint32_t x = mp_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;

    if (ax > 0x7f800000u)                       /* NaN: quiet, keep top payload */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u)                      /* >= 65520 (and inf): inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax >= 0x38800000u) {                    /* >= 2^-14: a normal f16 */
        /* Rebias the exponent from 127 to 15 in place; then add just under half
         * an f16 ulp, plus one if the kept lsb is odd, so that a tie rounds to
         * even. A carry out of the mantissa bumps the exponent, as it should,
         * and cannot reach inf because values >= 65520 were caught above. */
        uint32_t r = ax - ((uint32_t)(127 - 15) << 23);
        r += 0xfffu + ((r >> 13) & 1);
        return (uint16_t)(sign | (r >> 13));
    }
    if (ax <= 0x33000000u)                      /* <= 2^-25, half the least */
        return sign;                            /* subnormal: ties to 0 (even) */

    /* A subnormal f16 counts units of 2^-24. The f32 here is normal with biased
     * exponent e in [102, 112], value m * 2^(e-150) with the implicit bit in m,
     * so the answer is m / 2^(126-e), rounded to nearest even. A round up
     * from 0x3ff gives 0x400, the least normal, which is again right. */
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;                   /* 14..24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

MP_HALF_FN float mp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f;
    uint32_t m = h & 0x3ff;

    if (e == 0x1f)                              /* inf, or NaN made quiet */
        return mp_bits_f32(sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0));
    if (e == 0) {
        if (m == 0)
            return mp_bits_f32(sign);
        /* subnormal m * 2^-24: normalise so the leading 1 becomes implicit */
        e = 113;                                /* 2^-14 == 2^(113-127) */
        while (!(m & 0x400)) {
            m <<= 1;
            e--;
        }
        m &= 0x3ff;
    } else {
        e += 127 - 15;
    }
    return mp_bits_f32(sign | (e << 23) | (m << 13));
}

MP_HALF_FN uint16_t mp_f32_to_bf16(float f)
{
    uint32_t x = mp_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)        /* NaN: quiet, keep sign */
        return (uint16_t)((x >> 16) | 0x0040);
    /* round to nearest even on the low 16 bits; a carry may reach inf, which
     * is the right answer past the largest bf16 midpoint, and inf is unchanged
     * because its low half is zero */
    x += 0x7fffu + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

MP_HALF_FN float mp_bf16_to_f32(uint16_t h)
{
    return mp_bits_f32((uint32_t)h << 16);
}

#endif
