/* vmath_avx2.c: the AVX2 + FMA path of vmath.h (built with -mavx2 -mfma) */
#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>
#include <sleef.h>
#define VM_ISA avx2
#define VM_W 8
#define VM_LOAD _mm256_loadu_ps
#define VM_STORE _mm256_storeu_ps
#define VM_FN(name) Sleef_##name##f8_u10avx2
#include "kernels/cpu/vmath_isa.h"
#endif
