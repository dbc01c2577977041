/*
 * fp8.h: scalar FP8 (OCP e4m3 / e5m2) <-> f32 conversion, header only.
 *
 * The reference conversions of the engine, as kernels/half.h is for f16/bf16:
 * every bulk path (a CPU loop, a CUDA kernel, the emulated device) must give
 * the same bits for every input. Plain integer C: the answer does not depend
 * on the FPU's rounding mode, flush-to-zero or the compiler's flags.
 *
 * e4m3 is OCP's E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no inf;
 *   NaN is S.1111.111 (0x7f / 0xff); the largest finite value is 448 (0x7e);
 *   the smallest subnormal 2^-9.
 * e5m2 is IEEE-like: 1 sign, 5 exponent (bias 15), 2 mantissa bits; inf is
 *   S.11111.00, NaN S.11111.{01,10,11}; the largest finite value is 57344
 *   (0x7b); the smallest subnormal 2^-16. It is the top byte of an f16.
 *
 * f32 -> fp8 rounds to nearest, ties to even, once (f16 and bf16 inputs are
 * widened to f32 first, which is exact, so they too round once). Subnormals of
 * the target are kept; values at or below half the smallest subnormal become
 * a signed zero. Overflow (a finite value that rounds past the largest finite
 * value, or inf):
 *   saturate != 0: the largest finite value with the input's sign;
 *   saturate == 0: e4m3 gives NaN with the input's sign (0x7f | sign), e5m2
 *                  gives inf with the input's sign (0x7c | sign).
 * A NaN input gives 0x7f in both formats whatever its sign and payload. All
 * of this is what the CUDA toolkit's host code __nv_cvt_float_to_fp8 (in
 * cuda_fp8.hpp) returns for every f32 bit pattern; the tests check that.
 *
 * fp8 -> f32 is exact; NaN codes come out as a quiet f32 NaN with their sign.
 */
#ifndef MP_FP8_H
#define MP_FP8_H

#include <stdint.h>
#include "kernels/half.h"

/* the two formats, described by their field widths */
typedef struct {
    int mbits;          /* mantissa bits: 3 (e4m3) or 2 (e5m2) */
    int bias;           /* exponent bias: 7 or 15 */
    uint8_t maxcode;    /* largest finite magnitude's code: 0x7e or 0x7b */
    uint8_t overflow;   /* the code of a non-saturated overflow: NaN 0x7f or inf 0x7c */
} mp_fp8_format;

#define MP_FP8_E4M3 ((mp_fp8_format){3, 7, 0x7e, 0x7f})
#define MP_FP8_E5M2 ((mp_fp8_format){2, 15, 0x7b, 0x7c})

MP_HALF_FN uint8_t mp_f32_to_fp8(float f, mp_fp8_format fmt, int saturate)
{
    uint32_t x = mp_f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    uint32_t ax = x & 0x7fffffffu;
    uint8_t over = saturate ? fmt.maxcode : fmt.overflow;

    if (ax > 0x7f800000u)                       /* NaN: one canonical code */
        return 0x7f;
    if (ax == 0x7f800000u)                      /* inf */
        return (uint8_t)(sign | over);
    int e = (int)(ax >> 23) - 127;              /* unbiased exponent (f32 subnormals: -127) */
    int emin = 1 - fmt.bias;                    /* the smallest normal exponent */
    if (e >= emin) {
        /* normal in the target: round the f32 mantissa to mbits, ties to even;
           a carry out of the mantissa bumps the exponent, as it should */
        int s = 23 - fmt.mbits;
        uint32_t r = ax + ((1u << (s - 1)) - 1u) + ((ax >> s) & 1u);
        uint32_t code = (r >> s) - ((uint32_t)(127 - fmt.bias) << fmt.mbits);
        if (code > fmt.maxcode)
            return (uint8_t)(sign | over);
        return (uint8_t)(sign | code);
    }
    /* below the smallest normal: a count of the smallest subnormal,
       2^(emin - mbits); anything below 2^(emin - mbits - 1) (f32 subnormals
       included) rounds to zero, the midpoint itself to even (zero) */
    if (e < emin - fmt.mbits - 1)
        return sign;
    uint32_t m = (ax & 0x7fffffu) | 0x800000u;  /* value = m * 2^(e - 23) */
    int r = 23 + emin - fmt.mbits - e;          /* 24 - mbits .. 24: bits to drop */
    uint32_t q = m >> r, rem = m & ((1u << r) - 1u), half = 1u << (r - 1);
    if (rem > half || (rem == half && (q & 1u)))
        q++;                                    /* may reach the smallest normal: right */
    return (uint8_t)(sign | q);
}

MP_HALF_FN float mp_fp8_to_f32(uint8_t c, mp_fp8_format fmt)
{
    uint32_t sign = (uint32_t)(c & 0x80) << 24;
    int ebits = 7 - fmt.mbits;
    uint32_t exp = (uint32_t)(c & 0x7f) >> fmt.mbits;
    uint32_t man = c & ((1u << fmt.mbits) - 1u);
    uint32_t emax = (1u << ebits) - 1u;
    if (exp == emax && (c & 0x7f) > fmt.maxcode) {   /* NaN, or e5m2's inf */
        if (fmt.mbits == 2 && man == 0)
            return mp_bits_f32(sign | 0x7f800000u);
        return mp_bits_f32(sign | 0x7fc00000u);
    }
    if (exp == 0) {                             /* zero or subnormal: man * 2^(1 - bias - mbits) */
        if (man == 0)
            return mp_bits_f32(sign);
        /* normalise: the leading one of man becomes the implicit bit */
        int shift = 0;
        while (!(man & (1u << fmt.mbits)))
            man <<= 1, shift++;
        man &= (1u << fmt.mbits) - 1u;
        exp = (uint32_t)(1 - shift);
    }
    uint32_t e32 = exp - (uint32_t)fmt.bias + 127u;
    return mp_bits_f32(sign | (e32 << 23) | (man << (23 - fmt.mbits)));
}

MP_HALF_FN uint8_t mp_f32_to_e4m3(float f, int saturate) { return mp_f32_to_fp8(f, MP_FP8_E4M3, saturate); }
MP_HALF_FN uint8_t mp_f32_to_e5m2(float f, int saturate) { return mp_f32_to_fp8(f, MP_FP8_E5M2, saturate); }
MP_HALF_FN float mp_e4m3_to_f32(uint8_t c) { return mp_fp8_to_f32(c, MP_FP8_E4M3); }
MP_HALF_FN float mp_e5m2_to_f32(uint8_t c) { return mp_fp8_to_f32(c, MP_FP8_E5M2); }

#endif
