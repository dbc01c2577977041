/*
 * cuda_gather.cu: gather and scatter along one dim (PyTorch's gather,
 * scatter, scatter_add; backend.h: mp_along_args), the same results as the
 * CPU's kernels (kernels/cpu/cpu_gather.c) bit for bit.
 *
 * gather: a thread per index element. scatter: a thread per line (the index's
 * elements that differ only along dim, which all address one line of x, and no
 * two lines the same one), walking its line in index order: a repeated index
 * keeps the last value and sums add in the CPU's order, with no atomics, so
 * scatter_add is deterministic here (unlike index_select's backward, which
 * sums with atomics: cuda_layout.cu). Integers wrap; f16/bf16 widen to f32 and
 * round at each add, tallied for flush counting.
 *
 * Indices outside [0, n) are left out (gather writes zeros for them), so a bad
 * index never reads or writes out of bounds; check_indices (cuda_check.cu)
 * reports it later.
 */
#include "kernels/cuda/cuda.h"

mp_be_gather_along_fn mp_cuda_gather_along;
mp_be_scatter_along_fn mp_cuda_scatter_along;

namespace {

/* x's offset of line (o, i): o numbers the index's coordinates before dim, i those after it */
__device__ int64_t line_base(const mp_along_args &a, int64_t o, int64_t i)
{
    int64_t off = 0;
    for (int d = a.ndim - 1; d > a.dim; d--) {
        off += i % a.shape[d] * a.xs[d];
        i /= a.shape[d];
    }
    for (int d = a.dim - 1; d >= 0; d--) {
        off += o % a.shape[d] * a.xs[d];
        o /= a.shape[d];
    }
    return off;
}

/* the index as {outer, m, inner} around dim */
void split(const mp_along_args *a, int64_t *outer, int64_t *m, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (d < a->dim) *outer *= a->shape[d];
        if (d > a->dim) *inner *= a->shape[d];
    }
    *m = a->shape[a->dim];
}

template <class W>
__global__ void k_gather_along(W *out, const W *x, const int32_t *idx, mp_along_args a, int64_t m, int64_t inner,
                               int64_t total)
{
    MP_FOR(p, total) {
        int64_t i = p % inner, o = p / inner / m;
        int32_t j = idx[p];
        out[p] = j >= 0 && j < a.n ? x[line_base(a, o, i) + j * a.xs[a.dim]] : (W)0;
    }
}

template <class W>
__global__ void k_scatter_set(W *x, const W *src, const int32_t *idx, mp_along_args a, int64_t m, int64_t inner,
                              int64_t lines)
{
    MP_FOR(l, lines) {
        int64_t o = l / inner, i = l % inner, base = line_base(a, o, i);
        for (int64_t j = 0; j < m; j++) {
            int64_t p = (o * m + j) * inner + i;
            int32_t k = idx[p];
            if (k >= 0 && k < a.n) x[base + k * a.xs[a.dim]] = src[p];
        }
    }
}

__global__ void k_scatter_add(mp_dtype dt, void *x, const void *src, const int32_t *idx, mp_along_args a, int64_t m,
                              int64_t inner, int64_t lines, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(l, lines) {
        int64_t o = l / inner, i = l % inner, base = line_base(a, o, i);
        for (int64_t j = 0; j < m; j++) {
            int64_t p = (o * m + j) * inner + i;
            int32_t k = idx[p];
            if (k < 0 || k >= a.n) continue;
            int64_t s = base + k * a.xs[a.dim];
            switch (dt) {
            case MP_I32: ((uint32_t *)x)[s] += ((const uint32_t *)src)[p]; break;   /* wraps */
            case MP_U8: ((uint8_t *)x)[s] += ((const uint8_t *)src)[p]; break;
            case MP_F32: ((float *)x)[s] = __fadd_rn(((float *)x)[s], ((const float *)src)[p]); break;
            case MP_F16:
            case MP_BF16: mp_stc(dt, x, s, __fadd_rn(mp_ld(dt, x, s), mp_ld(dt, src, p)), t); break;
            case MP_F64: break;   /* not reached: no f64 on CUDA (cuda_supports) */
            case MP_E4M3:         /* not reached: the engine gives FP8 to no op that computes */
            case MP_E5M2: break;
            }
        }
    }
    t.commit();
}

/* runs the statement with W the unsigned word of dt's size */
#define BY_WORD(dt, ...)                                              \
    switch (mp_dtype_size(dt)) {                                      \
    case 4: { typedef uint32_t W; __VA_ARGS__; } break;               \
    case 2: { typedef uint16_t W; __VA_ARGS__; } break;               \
    default: { typedef uint8_t W; __VA_ARGS__; } break;               \
    }

} /* namespace */

void mp_cuda_gather_along(mp_kctx *cx, mp_dtype dt, void *out, const void *x, const int32_t *idx, const mp_along_args *a)
{
    int64_t outer, m, inner;
    split(a, &outer, &m, &inner);
    int64_t total = outer * m * inner;
    if (total <= 0) return;
    BY_WORD(dt, MP_LAUNCH(mp_blocks(total), MP_THREADS, 0, cx->stream, k_gather_along<W>, (W *)out, (const W *)x, idx,
                          *a, m, inner, total));
    MP_LAUNCHED("gather_along");
}

void mp_cuda_scatter_along(mp_kctx *cx, mp_dtype dt, void *x, const void *src, const int32_t *idx, const mp_along_args *a,
                           int add)
{
    int64_t outer, m, inner;
    split(a, &outer, &m, &inner);
    int64_t lines = outer * inner;
    if (lines <= 0 || m <= 0) return;
    if (add) {
        MP_LAUNCH(mp_blocks(lines), MP_THREADS, 0, cx->stream, k_scatter_add, dt, x, src, idx, *a, m, inner, lines,
                  cx->flush);
    } else {
        BY_WORD(dt, MP_LAUNCH(mp_blocks(lines), MP_THREADS, 0, cx->stream, k_scatter_set<W>, (W *)x, (const W *)src,
                              idx, *a, m, inner, lines));
    }
    MP_LAUNCHED("scatter_along");
}
