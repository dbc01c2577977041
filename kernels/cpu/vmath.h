/*
 * vmath.h: f32 exp, log, tanh, erf, sin and cos over arrays, vectorised.
 *
 * The elementwise and row kernels call these instead of libm's scalar expf,
 * tanhf and erff (which were most of a GELU or softmax pass). The vector
 * code is SLEEF's (Debian's libsleef, the library PyTorch's CPU kernels use),
 * whose "u10" functions are documented to 1.0 ulp in f32; tests/c/test_vmath.c
 * measures every path against double-precision libm on 2^24 spread inputs and
 * holds them to <= 1 ulp, well inside the 2 ulp this project promises.
 *
 * The processor is asked once which path to take: AVX-512, AVX2 + FMA, or
 * SSE2 (every x86-64); the AVX-512 and AVX2 paths give the same bits. Other
 * architectures use libm. y may alias x.
 */
#ifndef MP_KERNELS_CPU_VMATH_H
#define MP_KERNELS_CPU_VMATH_H

#include <stdint.h>

void cpu_vexp(float *y, const float *x, int64_t n);
void cpu_vlog(float *y, const float *x, int64_t n);
void cpu_vtanh(float *y, const float *x, int64_t n);
void cpu_verf(float *y, const float *x, int64_t n);
void cpu_vsin(float *y, const float *x, int64_t n);
void cpu_vcos(float *y, const float *x, int64_t n);

/* the path in use: "avx512f", "avx2", "sse2" or "libm" */
const char *cpu_vmath_isa(void);
/* for tests and benchmarks: use the named path if this processor has it
 * (NULL: the best one); returns 0, or -1 and changes nothing */
int cpu_vmath_use(const char *isa);

#endif
