/* vmath_sse2.c: the SSE2 path of vmath.h, for any x86-64 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <sleef.h>
#define VM_ISA sse2
#define VM_W 4
#define VM_LOAD _mm_loadu_ps
#define VM_STORE _mm_storeu_ps
#define VM_FN(name) Sleef_##name##f4_u10sse2
#include "kernels/cpu/vmath_isa.h"
#endif
