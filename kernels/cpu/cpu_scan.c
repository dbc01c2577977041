/*
 * cpu_scan.c: inclusive prefix sums (cumsum) along the middle axis of an
 * {outer, n, inner} view, forwards or from the end (cumsum's backward). Each
 * column runs in order in a double accumulator and every output rounds once
 * into dt, so the bits depend on the values alone; the CUDA kernel
 * (kernels/cuda/cuda_scan.cu) walks a column the same way and gives the same.
 */
#include "kernels/cpu/cpu.h"

/* value v rounded once into element i of dt */
static void put(mp_kctx *cx, mp_dtype dt, void *p, int64_t i, double v)
{
    float f = (float)v;
    switch (dt) {
    case MP_F32: ((float *)p)[i] = f; break;
    case MP_F64: ((double *)p)[i] = v; break;
    case MP_E4M3:   /* (not reached: the engine gives FP8 to no op that computes) */
    case MP_E5M2:
    case MP_F16:
    case MP_BF16: cpu_store(cx, dt, p, i, &f, 1); break;
    case MP_I32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(int64_t)v; break;   /* not reached: the engine scans floats */
    case MP_U8: ((uint8_t *)p)[i] = (uint8_t)(int64_t)v; break;
    }
}

void cpu_scan(mp_kctx *cx, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner, int reverse)
{
    int64_t cols = outer * inner;
    #pragma omp parallel for if (cols * n >= MP_PAR_MIN) schedule(static)
    for (int64_t q = 0; q < cols; q++) {
        int64_t base = q / inner * n * inner + q % inner;
        double s = 0;
        for (int64_t k = 0; k < n; k++) {
            int64_t at = base + (reverse ? n - 1 - k : k) * inner;
            s += cpu_get_f64(dt, a, at);
            put(cx, dt, out, at, s);
        }
    }
}
