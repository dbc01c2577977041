/*
 * cpu_gather.c: gather and scatter along one dim (PyTorch's gather, scatter,
 * scatter_add; backend.h: mp_along_args). The index is walked line by line: a
 * line is the index's elements that differ only along dim, and all of them
 * address one line of x, so a line's base offset in x is worked out once.
 * gather moves whole elements as bytes (every dtype); scatter with add sums
 * in the dtype's own arithmetic (integers wrap, f16/bf16 widen to f32 and
 * round at each add, counted for flush counting as cpu_store counts).
 */
#include <string.h>
#include "kernels/cpu/cpu.h"

mp_be_gather_along_fn cpu_gather_along;
mp_be_scatter_along_fn cpu_scatter_along;

/* x's offset of line (o, i): o numbers the index's coordinates before dim, i
 * those after it */
static int64_t line_base(const mp_along_args *a, int64_t o, int64_t i)
{
    int64_t off = 0;
    for (int d = a->ndim - 1; d > a->dim; d--) {
        off += i % a->shape[d] * a->xs[d];
        i /= a->shape[d];
    }
    for (int d = a->dim - 1; d >= 0; d--) {
        off += o % a->shape[d] * a->xs[d];
        o /= a->shape[d];
    }
    return off;
}

/* the index as {outer, m, inner} around dim */
static void split(const mp_along_args *a, int64_t *outer, int64_t *m, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (d < a->dim) *outer *= a->shape[d];
        if (d > a->dim) *inner *= a->shape[d];
    }
    *m = a->shape[a->dim];
}

void cpu_gather_along(mp_kctx *cx, mp_dtype dt, void *out, const void *x, const int32_t *idx, const mp_along_args *a)
{
    (void)cx;
    size_t es = mp_dtype_size(dt);
    int64_t outer, m, inner, step = a->xs[a->dim];
    split(a, &outer, &m, &inner);
    #pragma omp parallel for if (outer * m * inner >= MP_PAR_MIN) schedule(static)
    for (int64_t l = 0; l < outer * inner; l++) {
        int64_t o = l / inner, i = l % inner, base = line_base(a, o, i);
        for (int64_t j = 0; j < m; j++) {
            int64_t p = (o * m + j) * inner + i, s = base + idx[p] * step;
            switch (es) {
            case 8: ((uint64_t *)out)[p] = ((const uint64_t *)x)[s]; break;
            case 4: ((uint32_t *)out)[p] = ((const uint32_t *)x)[s]; break;
            case 2: ((uint16_t *)out)[p] = ((const uint16_t *)x)[s]; break;
            default: memcpy((char *)out + (size_t)p * es, (const char *)x + (size_t)s * es, es);
            }
        }
    }
}

/* one add of src's element p into x's element s, in dt's arithmetic */
static void add_one(mp_kctx *cx, mp_dtype dt, void *x, int64_t s, const void *src, int64_t p)
{
    switch (dt) {
    case MP_F32: ((float *)x)[s] += ((const float *)src)[p]; break;
    case MP_F64: ((double *)x)[s] += ((const double *)src)[p]; break;
    case MP_I32: ((uint32_t *)x)[s] += ((const uint32_t *)src)[p]; break;   /* a wrap, not signed overflow */
    case MP_U8: ((uint8_t *)x)[s] += ((const uint8_t *)src)[p]; break;
    case MP_E4M3:   /* (not reached: the engine gives FP8 to no op that computes) */
    case MP_E5M2:
    case MP_F16:
    case MP_BF16: {
        float v, w;
        cpu_load(dt, x, s, &v, 1);
        cpu_load(dt, src, p, &w, 1);
        v += w;
        cpu_store(cx, dt, x, s, &v, 1);
    }
    }
}

/* in index order, on one thread: a repeated index keeps the last value, and
 * sums add in a fixed order (the flush counts are not shared across threads) */
void cpu_scatter_along(mp_kctx *cx, mp_dtype dt, void *x, const void *src, const int32_t *idx, const mp_along_args *a,
                       int add)
{
    size_t es = mp_dtype_size(dt);
    int64_t outer, m, inner, step = a->xs[a->dim];
    split(a, &outer, &m, &inner);
    for (int64_t l = 0; l < outer * inner; l++) {
        int64_t o = l / inner, i = l % inner, base = line_base(a, o, i);
        for (int64_t j = 0; j < m; j++) {
            int64_t p = (o * m + j) * inner + i, s = base + idx[p] * step;
            if (add) add_one(cx, dt, x, s, src, p);
            else memcpy((char *)x + (size_t)s * es, (const char *)src + (size_t)p * es, es);
        }
    }
}
