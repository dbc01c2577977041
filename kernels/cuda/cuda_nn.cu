/*
 * cuda_nn.cu: the row-wise kernels of neural networks: softmax and log-softmax
 * over the middle axis of {outer, n, inner} and their gradient, cross-entropy
 * fused with log-softmax (the probabilities are never stored) and its gradient,
 * and layer norm and its gradient.
 *
 * Call each of the rows a column (for softmax one per (outer, inner) pair, with
 * stride inner). A block owns a tile of columns, and the threads of a column
 * walk its values, reading them again on each pass (rows may be far too long
 * for shared memory); row sums accumulate in double and meet in a
 * shared-memory tree in a fixed order. Values are computed in f32 and rounded
 * once, as on the CPU (kernels/cpu/cpu_nn.c).
 *
 * Layer norm's weight and bias gradients are column sums over the rows, done
 * deterministically in two passes: blocks sum runs of rows into a fixed buffer
 * of partials (safe because this backend runs every kernel on the one stream),
 * then one thread per column adds its partials in order.
 */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_tile.h"

/* the partial weight sums of layer_norm_grad */
#define LN_PARTS (1 << 19)
__device__ double mp_cuda_ln_parts[LN_PARTS];

namespace {


struct Sum { __device__ double operator()(double a, double b) const { return a + b; } };
struct Max { __device__ double operator()(double a, double b) const { return b > a ? b : a; } };

/* where a thread is: its column q (live when q < cols) and the column's base
 * and stride in an {outer, n, inner} view */
struct Col {
    int tx, ty;
    int64_t q, base, stride;
    bool live;
};

__device__ Col col_at(Tile t, int64_t b, int64_t cols, int64_t n, int64_t inner)
{
    Col c;
    tile_pos(t, c.tx, c.ty);
    c.q = b * t.txn + c.tx;
    c.live = c.q < cols;
    c.base = c.q / inner * n * inner + c.q % inner;
    c.stride = inner;
    return c;
}

#define COL_FOR(j, c, t, n) for (int64_t j = (c).ty; (c).live && j < (n); j += (t).tyn)

/* log(sum(exp(x - max))) + max of the column, as the CPU's logsumexp: NaN never
 * wins the max, and an infinite max is the result */
__device__ float col_lse(mp_dtype dt, const void *x, Tile t, Col c, int64_t n, double *sh)
{
    float m = -INFINITY;
    COL_FOR(j, c, t, n) {
        float v = mp_ld(dt, x, c.base + j * c.stride);
        m = v > m ? v : m;
    }
    m = (float)tile_reduce(t, c.tx, c.ty, (double)m, sh, Max{});
    double s = 0;
    COL_FOR(j, c, t, n) s += expf(mp_ld(dt, x, c.base + j * c.stride) - m);
    s = tile_reduce(t, c.tx, c.ty, s, sh, Sum{});
    return isinf(m) ? m : m + (float)log(s);
}

/* ---- softmax ---- */

__global__ void k_softmax(mp_dtype dt, void *y, const void *x, int64_t cols, int64_t n, int64_t inner, Tile t,
                          int lg)
{
    __shared__ double sh[MP_THREADS];
    for (int64_t b = blockIdx.x; b < (cols + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, cols, n, inner);
        float lse = col_lse(dt, x, t, c, n, sh);
        COL_FOR(j, c, t, n) {
            int64_t k = c.base + j * c.stride;
            float v = mp_ld(dt, x, k);
            mp_st(dt, y, k, lg ? v - lse : expf(v - lse));
        }
    }
}

/* log: gx = g - softmax * sum(g); else gx = y * (g - sum(g * y)) */
__global__ void k_softmax_grad(mp_dtype dt, void *gx, const void *gy, const void *y, int64_t cols, int64_t n,
                               int64_t inner, Tile t, int lg)
{
    __shared__ double sh[MP_THREADS];
    for (int64_t b = blockIdx.x; b < (cols + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, cols, n, inner);
        double s = 0;
        COL_FOR(j, c, t, n) {
            int64_t k = c.base + j * c.stride;
            float g = mp_ld(dt, gy, k);
            s += lg ? (double)g : (double)g * mp_ld(dt, y, k);
        }
        float sf = (float)tile_reduce(t, c.tx, c.ty, s, sh, Sum{});
        COL_FOR(j, c, t, n) {
            int64_t k = c.base + j * c.stride;
            float g = mp_ld(dt, gy, k), p = mp_ld(dt, y, k);
            mp_st(dt, gx, k, lg ? g - expf(p) * sf : p * (g - sf));
        }
    }
}

/* ---- cross-entropy ---- */

__global__ void k_cross_entropy(mp_dtype dt, float *loss, float *lse, const void *x, const int32_t *target,
                                int64_t rows, int64_t classes, Tile t)
{
    __shared__ double sh[MP_THREADS];
    for (int64_t b = blockIdx.x; b < (rows + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, rows, classes, 1);
        float l = col_lse(dt, x, t, c, classes, sh);
        if (c.live && c.ty == 0) {
            lse[c.q] = l;
            loss[c.q] = l - mp_ld(dt, x, c.base + target[c.q]);
        }
    }
}

/* gx = softmax(x) * scale[r], less scale[r] at the target */
__global__ void k_cross_entropy_grad(mp_dtype dt, void *gx, const void *x, const float *lse, const int32_t *target,
                                     const float *scale, int64_t rows, int64_t classes)
{
    MP_FOR(e, rows * classes) {
        int64_t r = e / classes;
        float v = expf(mp_ld(dt, x, e) - lse[r]) * scale[r];
        if (e % classes == target[r]) v -= scale[r];
        mp_st(dt, gx, e, v);
    }
}

/* ---- layer norm ---- */

__global__ void k_layer_norm(mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                             const void *bias, int64_t rows, int64_t n, float eps, Tile t)
{
    __shared__ double sh[MP_THREADS];
    for (int64_t b = blockIdx.x; b < (rows + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, rows, n, 1);
        double s = 0, ss = 0;
        COL_FOR(j, c, t, n) s += mp_ld(dt, x, c.base + j);
        float m = (float)(tile_reduce(t, c.tx, c.ty, s, sh, Sum{}) / (double)n);
        COL_FOR(j, c, t, n) {
            float d = mp_ld(dt, x, c.base + j) - m;
            ss += (double)d * d;
        }
        float rs = 1.0f / sqrtf((float)(tile_reduce(t, c.tx, c.ty, ss, sh, Sum{}) / (double)n) + eps);
        COL_FOR(j, c, t, n) {
            float wj = w ? mp_ld(dt, w, j) : 1.0f, bj = bias ? mp_ld(dt, bias, j) : 0.0f;
            mp_st(dt, y, c.base + j, (mp_ld(dt, x, c.base + j) - m) * rs * wj + bj);
        }
        if (c.live && c.ty == 0) mean[c.q] = m, rstd[c.q] = rs;
    }
}

/* gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)) */
__global__ void k_layer_norm_gx(mp_dtype dt, void *gx, const void *gy, const void *x, const float *mean,
                                const float *rstd, const void *w, int64_t rows, int64_t n, Tile t)
{
    __shared__ double sh[MP_THREADS];
    for (int64_t b = blockIdx.x; b < (rows + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, rows, n, 1);
        float mq = c.live ? mean[c.q] : 0.0f, rq = c.live ? rstd[c.q] : 0.0f;
        double a = 0, cc = 0;
        COL_FOR(j, c, t, n) {
            float gw = mp_ld(dt, gy, c.base + j) * (w ? mp_ld(dt, w, j) : 1.0f);
            float xh = (mp_ld(dt, x, c.base + j) - mq) * rq;
            a += gw, cc += (double)gw * xh;
        }
        float ma = (float)(tile_reduce(t, c.tx, c.ty, a, sh, Sum{}) / (double)n);
        float mc = (float)(tile_reduce(t, c.tx, c.ty, cc, sh, Sum{}) / (double)n);
        COL_FOR(j, c, t, n) {
            float gw = mp_ld(dt, gy, c.base + j) * (w ? mp_ld(dt, w, j) : 1.0f);
            float xh = (mp_ld(dt, x, c.base + j) - mq) * rq;
            mp_st(dt, gx, c.base + j, rq * (gw - ma - xh * mc));
        }
    }
}

/* sums of g*xhat (gw) and g (gb) down columns j of {rows, n}, over chunk c of the
 * rows ([c*len, (c+1)*len)), for block b = (tile of 32 columns, chunk c), 8 threads
 * a column; with one chunk they are the results, else partials at parts[c*n + j]
 * and parts[(chunks + c)*n + j] */
__global__ void k_layer_norm_wb(mp_dtype dt, float *gw, float *gb, double *parts, const void *gy, const void *x,
                                const float *mean, const float *rstd, int64_t rows, int64_t n, int64_t chunks)
{
    __shared__ double sh[MP_THREADS];
    Tile t = {32, MP_THREADS / 32, 0};
    int tx, ty;
    tile_pos(t, tx, ty);
    int64_t tiles = (n + 31) / 32, len = (rows + chunks - 1) / chunks;
    for (int64_t b = blockIdx.x; b < tiles * chunks; b += gridDim.x) {
        int64_t j = b / chunks * 32 + tx, c = b % chunks, hi = (c + 1) * len < rows ? (c + 1) * len : rows;
        double sw = 0, sb = 0;
        for (int64_t r = c * len + ty; j < n && r < hi; r += t.tyn) {
            float g = mp_ld(dt, gy, r * n + j), xh = (mp_ld(dt, x, r * n + j) - mean[r]) * rstd[r];
            sw += g * xh, sb += g;
        }
        sw = tile_reduce(t, tx, ty, sw, sh, Sum{});
        sb = tile_reduce(t, tx, ty, sb, sh, Sum{});
        if (ty != 0 || j >= n) continue;
        if (chunks > 1) {
            parts[c * n + j] = sw, parts[(chunks + c) * n + j] = sb;
            continue;
        }
        if (gw) gw[j] = (float)sw;
        if (gb) gb[j] = (float)sb;
    }
}

/* the second pass: each column adds its chunks partials in order */
__global__ void k_layer_norm_wb_sum(float *gw, float *gb, const double *parts, int64_t n, int64_t chunks)
{
    MP_FOR(j, n) {
        double sw = 0, sb = 0;
        for (int64_t c = 0; c < chunks; c++) sw += parts[c * n + j], sb += parts[(chunks + c) * n + j];
        if (gw) gw[j] = (float)sw;
        if (gb) gb[j] = (float)sb;
    }
}

/* row chunks for the weight sums when few column tiles would leave the GPU idle:
 * about 1024 blocks in all, at least 64 rows a chunk, partials fitting the buffer */
int64_t ln_chunks(int64_t rows, int64_t n)
{
    int64_t tiles = (n + 31) / 32, c = (1024 + tiles - 1) / tiles;
    if (c > rows / 64) c = rows / 64;
    if (c > LN_PARTS / (2 * n)) c = LN_PARTS / (2 * n);
    return c < 2 ? 1 : c;
}

void layer_norm_wb(mp_dtype dt, float *gw, float *gb, const void *gy, const void *x, const float *mean,
                   const float *rstd, int64_t rows, int64_t n)
{
    int64_t chunks = ln_chunks(rows, n);
    double *parts = NULL;
    if (chunks > 1) {
        MP_CUDA_CHECK(cudaGetSymbolAddress((void **)&parts, mp_cuda_ln_parts), "layer_norm_grad (partials buffer)");
        if (!parts) chunks = 1;
    }
    k_layer_norm_wb<<<grid_for((n + 31) / 32 * chunks), MP_THREADS, 0, mp_cuda_stream>>>(dt, gw, gb, parts, gy, x,
                                                                                        mean, rstd, rows, n, chunks);
    MP_LAUNCHED("layer_norm_grad (weight sums)");
    if (chunks == 1) return;
    k_layer_norm_wb_sum<<<mp_blocks(n), MP_THREADS, 0, mp_cuda_stream>>>(gw, gb, parts, n, chunks);
    MP_LAUNCHED("layer_norm_grad (weight sums, combine)");
}

} /* namespace */

void mp_cuda_softmax(mp_dtype dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner, int log)
{
    int64_t cols = outer * inner;
    if (cols <= 0 || n <= 0) return;
    Tile t = tile_for(n, inner);
    k_softmax<<<grid_for((cols + t.txn - 1) / t.txn), MP_THREADS, 0, mp_cuda_stream>>>(dt, y, x, cols, n, inner, t,
                                                                                     log);
    MP_LAUNCHED("softmax");
}

void mp_cuda_softmax_grad(mp_dtype dt, void *gx, const void *gy, const void *y, int64_t outer, int64_t n,
                          int64_t inner, int log)
{
    int64_t cols = outer * inner;
    if (cols <= 0 || n <= 0) return;
    Tile t = tile_for(n, inner);
    k_softmax_grad<<<grid_for((cols + t.txn - 1) / t.txn), MP_THREADS, 0, mp_cuda_stream>>>(dt, gx, gy, y, cols, n,
                                                                                          inner, t, log);
    MP_LAUNCHED("softmax_grad");
}

void mp_cuda_cross_entropy(mp_dtype dt, float *loss, float *lse, const void *x, const int32_t *target,
                           int64_t rows, int64_t classes)
{
    if (rows <= 0 || classes <= 0) return;
    Tile t = tile_for(classes, 1);
    k_cross_entropy<<<grid_for((rows + t.txn - 1) / t.txn), MP_THREADS, 0, mp_cuda_stream>>>(dt, loss, lse, x,
                                                                                           target, rows, classes, t);
    MP_LAUNCHED("cross_entropy");
}

void mp_cuda_cross_entropy_grad(mp_dtype dt, void *gx, const void *x, const float *lse, const int32_t *target,
                                const float *scale, int64_t rows, int64_t classes)
{
    if (rows * classes <= 0) return;
    k_cross_entropy_grad<<<mp_blocks(rows * classes), MP_THREADS, 0, mp_cuda_stream>>>(dt, gx, x, lse, target, scale,
                                                                                     rows, classes);
    MP_LAUNCHED("cross_entropy_grad");
}

void mp_cuda_layer_norm(mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                        const void *b, int64_t rows, int64_t n, float eps)
{
    if (rows <= 0) return;
    Tile t = tile_for(n, 1);
    k_layer_norm<<<grid_for((rows + t.txn - 1) / t.txn), MP_THREADS, 0, mp_cuda_stream>>>(dt, y, mean, rstd, x, w, b,
                                                                                         rows, n, eps, t);
    MP_LAUNCHED("layer_norm");
}

void mp_cuda_layer_norm_grad(mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                             const float *mean, const float *rstd, const void *w, int64_t rows, int64_t n)
{
    if (n <= 0) return;
    if (rows > 0) {
        Tile t = tile_for(n, 1);
        k_layer_norm_gx<<<grid_for((rows + t.txn - 1) / t.txn), MP_THREADS, 0, mp_cuda_stream>>>(
            dt, gx, gy, x, mean, rstd, w, rows, n, t);
        MP_LAUNCHED("layer_norm_grad");
    }
    if (gw || gb) layer_norm_wb(dt, gw, gb, gy, x, mean, rstd, rows, n);
}
