/*
 * vmath.c: picks the vmath.h path for this processor once, and the libm
 * fallback for other architectures (see vmath.h).
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/vmath.h"

typedef void (*vm_fn)(float *, const float *, int64_t);
typedef struct { const char *isa; vm_fn exp, log, tanh, erf, sin, cos; } vm_path;

#define VM_LIBM(name, f)                                                       \
    static void name##_libm(float *y, const float *x, int64_t n)                \
    {                                                                          \
        for (int64_t j = 0; j < n; j++) y[j] = f(x[j]);                        \
    }
VM_LIBM(exp, expf)
VM_LIBM(log, logf)
VM_LIBM(tanh, tanhf)
VM_LIBM(erf, erff)
VM_LIBM(sin, sinf)
VM_LIBM(cos, cosf)

#if defined(__x86_64__) && defined(__GNUC__)
#define VM_DECLARE(isa)                                                        \
    void cpu_vexp_##isa(float *, const float *, int64_t);                      \
    void cpu_vlog_##isa(float *, const float *, int64_t);                      \
    void cpu_vtanh_##isa(float *, const float *, int64_t);                     \
    void cpu_verf_##isa(float *, const float *, int64_t);                      \
    void cpu_vsin_##isa(float *, const float *, int64_t);                      \
    void cpu_vcos_##isa(float *, const float *, int64_t);
VM_DECLARE(avx512f)
VM_DECLARE(avx2)
VM_DECLARE(sse2)
#define VM_PATH(isa) { #isa, cpu_vexp_##isa, cpu_vlog_##isa, cpu_vtanh_##isa, cpu_verf_##isa, cpu_vsin_##isa, cpu_vcos_##isa }
static const vm_path paths[] = { VM_PATH(avx512f), VM_PATH(avx2), VM_PATH(sse2),
                                 { "libm", exp_libm, log_libm, tanh_libm, erf_libm, sin_libm, cos_libm } };

static int has(const char *isa)
{
    __builtin_cpu_init();
    if (!strcmp(isa, "avx512f")) return __builtin_cpu_supports("avx512f");
    if (!strcmp(isa, "avx2")) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return 1;
}
#else
static const vm_path paths[] = { { "libm", exp_libm, log_libm, tanh_libm, erf_libm, sin_libm, cos_libm } };
static int has(const char *isa) { return 1; }
#endif

#define NPATHS (int)(sizeof paths / sizeof paths[0])
/* the chosen path's index; -1 until the first call. Every thread that races
 * to choose chooses the same, so a relaxed store is enough. */
static int chosen = -1;

static const vm_path *path(void)
{
    int i = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (i < 0) {
        for (i = 0; i < NPATHS - 1 && !has(paths[i].isa); i++) {}
        __atomic_store_n(&chosen, i, __ATOMIC_RELAXED);
    }
    return &paths[i];
}

void cpu_vexp(float *y, const float *x, int64_t n) { path()->exp(y, x, n); }
void cpu_vlog(float *y, const float *x, int64_t n) { path()->log(y, x, n); }
void cpu_vtanh(float *y, const float *x, int64_t n) { path()->tanh(y, x, n); }
void cpu_verf(float *y, const float *x, int64_t n) { path()->erf(y, x, n); }
void cpu_vsin(float *y, const float *x, int64_t n) { path()->sin(y, x, n); }
void cpu_vcos(float *y, const float *x, int64_t n) { path()->cos(y, x, n); }
const char *cpu_vmath_isa(void) { return path()->isa; }

int cpu_vmath_use(const char *isa)
{
    if (!isa) { __atomic_store_n(&chosen, -1, __ATOMIC_RELAXED); path(); return 0; }
    for (int i = 0; i < NPATHS; i++)
        if (!strcmp(paths[i].isa, isa) && has(isa)) { __atomic_store_n(&chosen, i, __ATOMIC_RELAXED); return 0; }
    return -1;
}
