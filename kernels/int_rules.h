/*
 * int_rules.h: elementwise arithmetic on integer tensors (i32, u8), written
 * once for both backends, as kernels/step_rules.h is. Computed in 64 bits and
 * wrapped by the caller's store (multiplication through unsigned, so that an
 * overflow wraps as the store does instead of being undefined). The engine lets
 * only these ops reach an integer kernel: division and the transcendental
 * functions of integers are computed in f32 (engine/ops_math.c).
 */
#ifndef MP_INT_RULES_H
#define MP_INT_RULES_H

#include <stdint.h>
#include "kernels/backend.h"

#ifdef __CUDACC__
#define MP_INT_FN __host__ __device__ static inline
#else
#define MP_INT_FN static inline
#endif

/* x^y as PyTorch's integer pow: by squaring, wrapping as multiplication does; a
 * negative y gives 1 for x = 1, +-1 for x = -1 and 0 otherwise (the integer part
 * of 1/x^-y) */
MP_INT_FN int64_t mp_ipow(int64_t x, int64_t y)
{
    if (y < 0) return x == 1 ? 1 : x == -1 ? (y % 2 ? -1 : 1) : 0;
    uint64_t r = 1, b = (uint64_t)x;
    for (; y; y >>= 1, b *= b)
        if (y & 1) r *= b;
    return (int64_t)r;
}

MP_INT_FN int64_t mp_bin_int(mp_binop op, int64_t x, int64_t y)
{
    switch (op) {
    case MP_ADD: return x + y;
    case MP_SUB: return x - y;
    case MP_MUL: return (int64_t)((uint64_t)x * (uint64_t)y);
    case MP_POWT: return mp_ipow(x, y);
    case MP_DIV: case MP_GT: case MP_LT: case MP_GE: case MP_LE: case MP_EQ: case MP_NE:
        break;   /* not integer arithmetic: division and comparisons take other paths */
    }
    return 0;
}

/* neg, abs, relu and the integral scalars (p) of mul, add, rsub and pow (p >= 0) */
MP_INT_FN int64_t mp_un_int(mp_unop op, int64_t x, int64_t p)
{
    switch (op) {
    case MP_NEG: return -x;
    case MP_ABS: return x < 0 ? -x : x;
    case MP_RELU: return x < 0 ? 0 : x;
    case MP_MULS: return (int64_t)((uint64_t)x * (uint64_t)p);
    case MP_ADDS: return x + p;
    case MP_RSUBS: return p - x;
    case MP_POW: return mp_ipow(x, p);
    case MP_EXP: case MP_LOG: case MP_SQRT: case MP_DIVS: case MP_RDIVS: case MP_TANH:
    case MP_SIGMOID: case MP_GELU: case MP_DROPMASK: case MP_SILU: case MP_SIN: case MP_COS:
        break;   /* float maths: the engine runs none of them on integers */
    }
    return 0;
}

#endif
