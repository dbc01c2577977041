/*
 * cpu_fp8.h: scaled FP8 on the CPU, on raw byte codes (kernels/fp8.h's
 * conversions): quantizing a matrix to e4m3/e5m2 codes with its scales
 * (cpu_fp8_quant.c), and the product of two quantized matrices
 * (cpu_fp8_gemm.c), with f32 accumulation or a modelled limited-precision
 * accumulator.
 *
 * The operands, scales and granularities: kernels/fp8_scaled.h.
 */
#ifndef MP_CPU_FP8_H
#define MP_CPU_FP8_H

#include <stdint.h>
#include "kernels/cpu/cpu.h"
#include "kernels/fp8_scaled.h"

/* X {rows, k} of dtype dt (f32, f16, bf16) -> codes q {rows, k} and decode
 * scales (f32 for tensor, tile, block; E8M0 bytes for mx), saturating: a value
 * past the largest finite one becomes it. given_scale (tensor granularity
 * only; NULL otherwise): the quantization multiplier s to use (delayed
 * scaling), d = 1 / s; else s comes from the amax of each group: FP8_MAX /
 * amax (1 when amax is 0 or not finite, FLT_MAX where the division
 * overflows), and for mx the OCP rule X = 2^(floor(log2 amax) - emax), emax
 * the element format's largest exponent (8 e4m3, 15 e5m2), clamped to
 * 2^-127..2^127 (1 for an all-zero block, where any scale is right; NaN
 * for a block holding a NaN or an infinity).
 * The tensor granularity without a given scale reads X twice (its amax must
 * be known before its first element is scaled); every other form reads each
 * group once, its amax and its codes from the same pass. 0, or -1 when out
 * of memory. */
int cpu_fp8_quantize(mp_kctx *cx, mp_dtype dt, const void *x, int64_t rows, int64_t k, mp_fp8_format fmt,
                     mp_fp8_gran g, const float *given_scale, uint8_t *q, void *scales, mp_fp8_stats *st);

/* C {m, n} (dtype out: f32, bf16, f16) = (A dequantized) (B dequantized)^T,
 * A {m, k}, B {n, k}, rounded once into C.
 * acc_bits == 0: each product of two decoded values is exact in f32 and the
 *   products are summed in f32 (the bf16 GEMM of the decoded codes); where a
 *   scale changes along k (tile, block), k is cut into those chunks and each
 *   chunk's f32 sum times its two scales is added to an f32 total.
 * acc_bits in 1..23: the modelled accumulator of cpu_fp8_gemm.c's head, with
 *   promotion every promote_every products (0: never), partial sums rounded to
 *   nearest even (cpu_fp8_gemm_round: or truncated); tile and block scales
 *   need promote_every dividing 128, so that no interval straddles two scales.
 * 0, -1 out of memory, -2 bad arguments (the engine checks them first). */
int cpu_fp8_gemm(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a, const mp_fp8_operand *b,
                 int acc_bits, int64_t promote_every, mp_dtype out, void *c);
/* the same, the modelled accumulator's partial sums rounded as rnd says
 * (cpu_fp8_gemm: MP_FP8_ACC_NEAREST) */
int cpu_fp8_gemm_round(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a,
                       const mp_fp8_operand *b, int acc_bits, int64_t promote_every, mp_fp8_acc_round rnd,
                       mp_dtype out, void *c);

/* the model's rounding: hi + lo (an exact sum split as by two-sum, |lo| at
 * most half an ulp of hi) rounded to nearest even to a significand of
 * acc_bits + 1 bits (acc_bits after the leading one, as f32 has 23) */
double mp_fp8_round_acc(double hi, double lo, int acc_bits);
/* the same value rounded toward zero (truncated) to acc_bits + 1 bits */
double mp_fp8_trunc_acc(double hi, double lo, int acc_bits);

/* the backend's entries (kernels/backend.h: fp8_quantize, fp8_gemm) */
mp_be_fp8_quantize_fn cpu_fp8_quantize_entry;
mp_be_fp8_gemm_fn cpu_fp8_gemm_entry;

#endif
