/*
 * cuda_tile.h: how the row kernels (cuda_layout.cu, cuda_nn.cu) lay a block of
 * MP_THREADS threads over a tile of {n, inner} columns, and how a column reduces.
 */
#ifndef MP_CUDA_TILE_H
#define MP_CUDA_TILE_H

#include "kernels/cuda/cuda.h"

namespace {

/* ---- tiles: how MP_THREADS threads cover a tile of columns ---- */

/* txn columns side by side, tyn threads along each (both powers of two, product
 * MP_THREADS); jfast puts a column's threads in adjacent lanes (contiguous rows,
 * inner == 1), otherwise adjacent lanes take adjacent columns (adjacent in memory) */
struct Tile { int txn, tyn, jfast; };

inline int pow2_at_least(int64_t v, int cap)
{
    int p = 1;
    while (p < v && p < cap) p <<= 1;
    return p;
}

inline Tile tile_for(int64_t n, int64_t inner)
{
    Tile t;
    int cols = pow2_at_least(inner, 32);
    t.tyn = pow2_at_least(n, MP_THREADS / cols);
    t.txn = MP_THREADS / t.tyn;
    t.jfast = inner == 1;
    return t;
}

inline unsigned grid_for(int64_t blocks)
{
    return (unsigned)(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

__device__ void tile_pos(Tile t, int &tx, int &ty)
{
    int id = threadIdx.x;
    if (t.jfast) tx = id / t.tyn, ty = id % t.tyn;
    else tx = id % t.txn, ty = id / t.txn;
}

/* combines the tyn values of each column in a fixed tree; every thread of the
 * block must call it, and each gets its column's result */
template <class T, class F>
__device__ T tile_reduce(Tile t, int tx, int ty, T v, T *sh, F f)
{
    int me = ty * t.txn + tx;
    sh[me] = v;
    __syncthreads();
    for (int s = t.tyn >> 1; s > 0; s >>= 1) {
        if (ty < s) sh[me] = f(sh[me], sh[me + s * t.txn]);
        __syncthreads();
    }
    T r = sh[tx];
    __syncthreads();
    return r;
}

}  // namespace

#endif
