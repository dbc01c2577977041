/*
 * cpu_clamp.c: clamp and its gradient (kernels/backend.h, the clamp entry).
 * f16/bf16 widen to f32 a block at a time; the bounds round to f32 for them
 * and for f32, and stay doubles for f64. The tests are written so that NaN
 * fails every comparison: a NaN input passes through the forward unchanged and
 * gets a zero gradient, as PyTorch's clamp and its backward.
 */
#include <math.h>
#include "kernels/cpu/cpu.h"

static inline float clampf(float v, float lo, float hi)
{
    if (v < lo) v = lo;
    if (v > hi) v = hi;
    return v;
}

void cpu_clamp(mp_kctx *cx, mp_dtype dt, void *out, const void *x, const void *g, int64_t n, double lo, double hi)
{
    if (dt == MP_F64) {
        const double *xs = x, *gs = g;
        double *o = out;
        #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            double v = xs[i];
            if (gs) o[i] = v >= lo && v <= hi ? gs[i] : 0.0;
            else {   /* NaN fails both tests; lo > hi ends at hi */
                if (v < lo) v = lo;
                if (v > hi) v = hi;
                o[i] = v;
            }
        }
        return;
    }
    if (dt != MP_F32 && dt != MP_F16 && dt != MP_BF16) return;   /* the engine passes floats only */
    float flo = (float)lo, fhi = (float)hi;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        float xs[MP_BLOCK], r[MP_BLOCK];
        cpu_load(dt, x, i, xs, len);
        if (g) {
            cpu_load(dt, g, i, r, len);
            for (int64_t j = 0; j < len; j++) r[j] = xs[j] >= flo && xs[j] <= fhi ? r[j] : 0.0f;
        } else {
            for (int64_t j = 0; j < len; j++) r[j] = clampf(xs[j], flo, fhi);
        }
        cpu_store(cx, dt, out, i, r, len);
    }
}
