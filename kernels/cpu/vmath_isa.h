/*
 * vmath_isa.h: the body of one vmath path, included by vmath_avx512.c,
 * vmath_avx2.c and vmath_sse2.c, each compiled for its instruction set with
 * VM_ISA (the suffix), VM_W (lanes), VM_T (vector type), VM_LOAD/VM_STORE and
 * VM_FN(name) (the SLEEF function of that name) defined. Whole vectors go
 * straight through; the tail of fewer than VM_W values goes through a padded
 * local copy, so no lane reads or writes past the arrays.
 */
#include <stdint.h>
#include <string.h>

#define VM_CAT2(a, b) a##_##b
#define VM_CAT(a, b) VM_CAT2(a, b)

#define VM_DEFINE(name)                                                             \
    void VM_CAT(cpu_v##name, VM_ISA)(float *y, const float *x, int64_t n)            \
    {                                                                               \
        int64_t j = 0;                                                              \
        for (; j + VM_W <= n; j += VM_W) VM_STORE(y + j, VM_FN(name)(VM_LOAD(x + j))); \
        if (j < n) {                                                                \
            float t[VM_W] = { 0 };                                                  \
            memcpy(t, x + j, sizeof(float) * (size_t)(n - j));                      \
            VM_STORE(t, VM_FN(name)(VM_LOAD(t)));                                   \
            memcpy(y + j, t, sizeof(float) * (size_t)(n - j));                      \
        }                                                                           \
    }

VM_DEFINE(exp)
VM_DEFINE(log)
VM_DEFINE(tanh)
VM_DEFINE(erf)
VM_DEFINE(sin)
VM_DEFINE(cos)
