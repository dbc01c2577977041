/*
 * cuda_clamp.cu: clamp and its gradient (kernels/backend.h, the clamp entry),
 * as kernels/cpu/cpu_clamp.c: f16/bf16 widen to f32, the bounds round to f32,
 * and NaN fails every comparison (a NaN input passes through, its gradient is
 * zero). One element a thread: a memory-bound op, as the fallback paths of
 * the unary kernels.
 */
#include "kernels/cuda/cuda.h"

static __global__ void clamp_k(mp_dtype dt, void *out, const void *x, int64_t n, float lo, float hi,
                               unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) {
        float v = mp_ld(dt, x, i);
        if (v < lo) v = lo;
        if (v > hi) v = hi;
        mp_stc(dt, out, i, v, t);
    }
    t.commit();
}

static __global__ void clamp_grad_k(mp_dtype dt, void *out, const void *x, const void *g, int64_t n, float lo,
                                    float hi, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(i, n) {
        float v = mp_ld(dt, x, i);
        mp_stc(dt, out, i, v >= lo && v <= hi ? mp_ld(dt, g, i) : 0.0f, t);
    }
    t.commit();
}

void mp_cuda_clamp(mp_kctx *cx, mp_dtype dt, void *out, const void *x, const void *g, int64_t n, double lo, double hi)
{
    if (n <= 0) return;
    if (g) MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, clamp_grad_k, dt, out, x, g, n, (float)lo, (float)hi,
                     cx->flush);
    else MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, clamp_k, dt, out, x, n, (float)lo, (float)hi, cx->flush);
    MP_LAUNCHED("clamp");
}
