/*
 * cuda_sort.cu: topk and sort (mp_backend.topk) on the GPU: the k largest (or
 * smallest) values of each row, in order, and their positions, in the order of
 * kernels/cpu/cpu_sort.c: NaN above every number, equal values by position.
 *
 * Keys are doubles: exact for every float dtype and for i32, whose values are
 * copied, never converted through f32. A block per row. A row of up to
 * SORT_SHARED values is sorted in shared memory by a bitonic network, padded to a power of two with entries that
 * come after every real one (a position past the row's end). A longer row
 * gives each value its rank by counting the values that come before it: n^2
 * comparisons a row, spread over the block's threads, which suits rows of a
 * few thousand (a sampler's top-k over a vocabulary of 50,000 would want a
 * radix select). The order is total, so both give the CPU's result, with no
 * atomics: the same bits on every run.
 */
#include "kernels/cuda/cuda.h"

#define SORT_SHARED 2048   /* 32 KiB of shared memory: a key and a position each */

namespace {

struct entry {
    double v;
    int32_t i;
};

/* element i of a row of dtype dt as a key: exact for i32 too */
__device__ __forceinline__ double key_at(mp_dtype dt, const void *x, int64_t i)
{
    return dt == MP_I32 ? (double)((const int32_t *)x)[i] : (double)mp_ld(dt, x, i);
}

/* the value at position j of the output, from the key (i32: exact) */
__device__ __forceinline__ void put_value(mp_dtype dt, void *values, int64_t j, double v, mp_tally &tl)
{
    if (dt == MP_I32) ((int32_t *)values)[j] = (int32_t)v;
    else mp_stc(dt, values, j, (float)v, tl);
}

/* a comes before b: the larger first when largest (NaN the largest), the
 * smaller first otherwise (NaN the last), the lower position among equals */
__device__ __forceinline__ bool before(entry a, entry b, int largest)
{
    bool an = isnan(a.v), bn = isnan(b.v);
    if (an != bn) return largest ? an : bn;
    if (!an && a.v != b.v) return largest ? a.v > b.v : a.v < b.v;
    return a.i < b.i;
}

__global__ void k_topk_shared(mp_dtype dt, void *values, int32_t *idx, const void *x, int64_t rows, int64_t n,
                              int64_t k, int largest, int p2, unsigned long long *fc)
{
    __shared__ entry s[SORT_SHARED];
    mp_tally tl(fc);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        for (int j = threadIdx.x; j < p2; j += blockDim.x)
            s[j] = j < n ? entry{key_at(dt, x, r * n + j), j} : entry{largest ? -INFINITY : NAN, (int32_t)j};
        __syncthreads();
        for (int size = 2; size <= p2; size <<= 1)
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int t = threadIdx.x; t < p2 / 2; t += blockDim.x) {
                    int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
                    bool up = (lo & size) == 0;   /* this run in order, or reversed */
                    entry a = s[lo], b = s[hi];
                    if (before(b, a, largest) == up) s[lo] = b, s[hi] = a;
                }
                __syncthreads();
            }
        for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
            put_value(dt, values, r * k + j, s[j].v, tl);
            idx[r * k + j] = s[j].i;
        }
        __syncthreads();   /* s is read before the next row overwrites it */
    }
    tl.commit();
}

__global__ void k_topk_rank(mp_dtype dt, void *values, int32_t *idx, const void *x, int64_t rows, int64_t n,
                            int64_t k, int largest, unsigned long long *fc)
{
    mp_tally tl(fc);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            entry a = {key_at(dt, x, r * n + i), (int32_t)i};
            int64_t rank = 0;
            for (int64_t j = 0; j < n; j++) rank += before(entry{key_at(dt, x, r * n + j), (int32_t)j}, a, largest);
            if (rank < k) {
                put_value(dt, values, r * k + rank, a.v, tl);
                idx[r * k + rank] = (int32_t)i;
            }
        }
    tl.commit();
}

}  // namespace

int mp_cuda_topk(mp_kctx *cx, mp_dtype dt, void *values, int32_t *idx, const void *x, int64_t rows, int64_t n,
                 int64_t k, int largest)
{
    if (rows <= 0 || n <= 0) return 0;
    const unsigned grid = (unsigned)(rows < 65535 ? rows : 65535);
    if (n <= SORT_SHARED) {
        int p2 = 1;
        while (p2 < n) p2 <<= 1;
        MP_LAUNCH(grid, MP_THREADS, 0, cx->stream, k_topk_shared, dt, values, idx, x, rows, n, k, largest, p2,
                  cx->flush);
    } else {
        MP_LAUNCH(grid, MP_THREADS, 0, cx->stream, k_topk_rank, dt, values, idx, x, rows, n, k, largest, cx->flush);
    }
    MP_LAUNCHED("topk");
    return 0;
}
