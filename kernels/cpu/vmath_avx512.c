/* vmath_avx512.c: the AVX-512 path of vmath.h (built with -mavx512f -mfma) */
#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>
#include <sleef.h>
#define VM_ISA avx512f
#define VM_W 16
#define VM_LOAD _mm512_loadu_ps
#define VM_STORE _mm512_storeu_ps
#define VM_FN(name) Sleef_##name##f16_u10avx512f
#include "kernels/cpu/vmath_isa.h"
#endif
