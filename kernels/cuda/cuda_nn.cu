/*
 * cuda_nn.cu: the row-wise kernels of neural networks: softmax and log-softmax
 * over the middle axis of {outer, n, inner} and their gradient, cross-entropy
 * fused with log-softmax (the probabilities are never stored) and its gradient,
 * and layer norm and its gradient (RMS norm too: with mean NULL, no centring).
 *
 * Call each of the rows a column (for softmax one per (outer, inner) pair, with
 * stride inner). A block owns a tile of columns, and the threads of a column
 * walk its values, reading them again on each pass (rows may be far too long
 * for shared memory); row sums accumulate in double and meet in a
 * shared-memory tree in a fixed order. Values are computed in f32 and rounded
 * once, as on the CPU (kernels/cpu/cpu_nn.c). Every multiply and add rounds on
 * its own, as the CPU's do (built with -ffp-contract=off): the CUDA backend is
 * compiled with -fmad=false, and the multiply-adds of the online log-sum-exp
 * are also written with __fmul_rn/__fadd_rn, the intrinsics nvcc never fuses.
 *
 * Cross-entropy is one pass over each row's logits with f32 accumulation: every
 * thread of a row keeps a running maximum m and the sum s of exp(x - m) over
 * its values, rescaling s when m grows, and the threads' pairs meet in the
 * shared-memory tree (the online log-sum-exp); lse = m + log(s), loss = lse -
 * x[target], and no probability is written anywhere. The backward is one pass
 * over x: gx = (exp(x - lse) - onehot) * scale, rounded once, as on the CPU.
 * A row's threads take runs of 16 bytes (4 f32, 8 f16/bf16): with a 128-bit
 * load when the rows are 16-byte aligned (x aligned, classes a multiple of the
 * run), element by element otherwise, in the same order, so both give the same
 * result. A target outside [0, classes) gives a NaN loss and no onehot term
 * (check_indices reports it).
 *
 * Every rounding to f16/bf16 is tallied for flush counting (cuda.h).
 *
 * Layer norm reads each row once forward and once backward when the row fits
 * a block's registers (up to LN_CACHE x 256 values: GPT-2's 768, 1024, 2048):
 * each thread keeps its share of the row, and the passes over it (the mean, the
 * variance, the output; the two backward sums, gx) take the values from there,
 * in the order the uncached kernels read them, so the bits are the same.
 * The weight and bias gradients are column sums over the rows, deterministic in
 * two steps: partial sums (double) into a fixed buffer (safe because this
 * backend runs every kernel on the one stream), then one thread per column adds
 * its partials in order. For rows of 256 values or more that fit the
 * registers, the partials are the gx kernel's own (each block's rows, summed as
 * it reads them: the backward reads gy and x once); otherwise a kernel of their
 * own reads gy and x again in chunks of rows. Both orders sum exactly what the
 * CPU sums, in double, and round once to f32.
 */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_tile.h"

/* the partial weight sums of layer_norm_grad */
#define LN_PARTS (1 << 19)   /* doubles of partial sums at most, in the context's scratch */

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
                          int lg, unsigned long long *fc)
{
    __shared__ double sh[MP_THREADS];
    mp_tally tl(fc);
    for (int64_t b = blockIdx.x; b < (cols + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, cols, n, inner);
        float lse = col_lse(dt, x, t, c, n, sh);
        COL_FOR(j, c, t, n) {
            int64_t k = c.base + j * c.stride;
            float v = mp_ld(dt, x, k);
            mp_stc(dt, y, k, lg ? v - lse : expf(v - lse), tl);
        }
    }
    tl.commit();
}

/* log: gx = g - softmax * sum(g); else gx = y * (g - sum(g * y)) */
__global__ void k_softmax_grad(mp_dtype dt, void *gx, const void *gy, const void *y, int64_t cols, int64_t n,
                               int64_t inner, Tile t, int lg, unsigned long long *fc)
{
    __shared__ double sh[MP_THREADS];
    mp_tally tl(fc);
    for (int64_t b = blockIdx.x; b < (cols + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, cols, n, inner);
        double s = 0;
        COL_FOR(j, c, t, n) {
            int64_t k = c.base + j * c.stride;
            float g = mp_ld(dt, gy, k);
            s = __dadd_rn(s, lg ? (double)g : (double)g * mp_ld(dt, y, k));
        }
        float sf = (float)tile_reduce(t, c.tx, c.ty, s, sh, Sum{});
        COL_FOR(j, c, t, n) {
            int64_t k = c.base + j * c.stride;
            float g = mp_ld(dt, gy, k), p = mp_ld(dt, y, k);
            mp_stc(dt, gx, k, lg ? __fsub_rn(g, expf(p) * sf) : p * (g - sf), tl);
        }
    }
    tl.commit();
}

/* ---- cross-entropy ---- */

/* a running log-sum-exp: the largest value m seen (NaN never is) and the sum s
 * of exp(x - m) over the values seen; (-inf, 0) before any */
struct Lse { float m, s; };

/* adds one value: equal values (the infinities included) add exp(0) = 1
 * without computing inf - inf; a NaN makes s NaN */
__device__ __forceinline__ void lse_add(Lse &a, float v)
{
    if (v > a.m) {
        a.s = __fadd_rn(__fmul_rn(a.s, expf(a.m - v)), 1.0f);
        a.m = v;
    } else if (v == a.m) {
        a.s += 1.0f;
    } else {
        a.s += expf(v - a.m);
    }
}

struct LseCombine {
    __device__ Lse operator()(Lse a, Lse b) const
    {
        if (b.m > a.m) { Lse t = a; a = b; b = t; }
        if (b.m == a.m) return Lse{a.m, a.s + b.s};
        return Lse{a.m, __fadd_rn(a.s, __fmul_rn(b.s, expf(b.m - a.m)))};
    }
};

/* run g (G elements from g*G) of a row of n values of type T: one load of G
 * elements when vec (the row aligned to that, n a multiple of G), else element
 * by element, the places past the row's end set to 0 */
template <class T, int G>
__device__ __forceinline__ void row_run(const void *row, int64_t g, int64_t n, int vec, float (&v)[G])
{
    if (vec) {
        mp_ldv<T, G>((const char *)row + g * (G * mp_ty<T>::S), v);
        return;
    }
#pragma unroll
    for (int k = 0; k < G; k++) v[k] = g * G + k < n ? mp_get<T>(row, g * G + k) : 0.0f;
}

/* the tile of rows whose threads each take runs of G */
template <int G>
Tile ce_tile(int64_t classes)
{
    return tile_for((classes + G - 1) / G, 1);
}

/* the forward's runs: 4 elements for every dtype (16-byte loads of f32, 8-byte
 * ones of f16/bf16), so a 16-bit row's log-sum-exp is summed in the order of
 * its f32 cast's, bit for bit: autocast hands cross_entropy 16-bit logits as
 * they are (engine/op.h, widens_itself), and its values stay the cast's */
#define CE_RUN 4

template <class T>
__global__ void k_cross_entropy(float *loss, float *lse, const void *x, const int32_t *target, int64_t rows,
                                int64_t classes, Tile t, int vec)
{
    constexpr int G = CE_RUN;
    __shared__ Lse sh[MP_THREADS];
    const int64_t runs = (classes + G - 1) / G;
    int tx, ty;
    tile_pos(t, tx, ty);
    for (int64_t b = blockIdx.x; b < (rows + t.txn - 1) / t.txn; b += gridDim.x) {
        const int64_t q = b * t.txn + tx;
        const char *row = (const char *)x + (q < rows ? (size_t)q * classes * mp_ty<T>::S : 0);
        Lse a = {-INFINITY, 0.0f};
        if (q < rows)
            for (int64_t g = ty; g < runs; g += t.tyn) {
                float v[G];
                row_run<T, G>(row, g, classes, vec, v);
#pragma unroll
                for (int k = 0; k < G; k++)
                    if (g * G + k < classes) lse_add(a, v[k]);
            }
        a = tile_reduce(t, tx, ty, a, sh, LseCombine{});
        if (q < rows && ty == 0) {
            float l = isinf(a.m) ? a.m : a.m + logf(a.s);
            int32_t tg = target[q];
            lse[q] = l;
            loss[q] = tg >= 0 && tg < classes ? l - mp_get<T>(row, tg) : NAN;
        }
    }
}

/* gx = exp(x - lse[r]) * scale[r], less scale[r] at the target, as the CPU's
 * two roundings (no FMA) */
template <class T>
__global__ void k_cross_entropy_grad(void *gx, const void *x, const float *lse, const int32_t *target,
                                     const float *scale, int64_t rows, int64_t classes, Tile t, int vec,
                                     unsigned long long *fc)
{
    constexpr int G = 16 / mp_ty<T>::S;
    const int64_t runs = (classes + G - 1) / G;
    mp_tally tl(fc);
    int tx, ty;
    tile_pos(t, tx, ty);
    for (int64_t b = blockIdx.x; b < (rows + t.txn - 1) / t.txn; b += gridDim.x) {
        const int64_t q = b * t.txn + tx;
        if (q >= rows) continue;
        const size_t off = (size_t)q * classes * mp_ty<T>::S;
        const char *row = (const char *)x + off;
        char *grow = (char *)gx + off;
        const float l = lse[q], sc = scale[q];
        const int32_t tg = target[q];
        for (int64_t g = ty; g < runs; g += t.tyn) {
            float v[G];
            row_run<T, G>(row, g, classes, vec, v);
#pragma unroll
            for (int k = 0; k < G; k++) {
                float p = __fmul_rn(expf(v[k] - l), sc);
                v[k] = g * G + k == tg ? __fsub_rn(p, sc) : p;
            }
            if (vec) {
                mp_stv<T, G>(grow + g * 16, v, tl);
            } else {
#pragma unroll
                for (int k = 0; k < G; k++)
                    if (g * G + k < classes) mp_put<T>(grow, g * G + k, v[k], tl);
            }
        }
    }
    tl.commit();
}

/* ---- layer norm ---- */

/* A row's values, each thread's share of them (j = ty, ty + tyn, ...): with C
 * (rows of at most LN_CACHE x tyn values) a thread reads its share from memory
 * once into registers and every later pass takes it from there; without, each
 * pass reads it again. The values and their order are the same either way, so
 * both give the same bits. */
#define LN_CACHE 8   /* the unroll count of ROW_EACH below: keep them equal */
#define ROW_EACH(k, j, c, t, n)                                                      \
    _Pragma("unroll 8") for (int k = 0; k < (C ? LN_CACHE : (1 << 30)); k++)        \
        if (int64_t j = (c).ty + (int64_t)k * (t).tyn; !(c).live || j >= (n)) break; \
        else

template <bool C>
__global__ void k_layer_norm(mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                             const void *bias, int64_t rows, int64_t n, float eps, Tile t, unsigned long long *fc)
{
    __shared__ double sh[MP_THREADS];
    mp_tally tl(fc);
    for (int64_t b = blockIdx.x; b < (rows + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, rows, n, 1);
        float xv[C ? LN_CACHE : 1];
        if (C) {
            ROW_EACH(k, j, c, t, n) xv[k] = mp_ld(dt, x, c.base + j);
        }
#define X_AT(k, j) (C ? xv[(k)] : mp_ld(dt, x, c.base + (j)))
        double s = 0, ss = 0;
        float m = 0.0f;   /* no mean: RMS norm, no centring */
        if (mean) {
            ROW_EACH(k, j, c, t, n) s += X_AT(k, j);
            m = (float)(tile_reduce(t, c.tx, c.ty, s, sh, Sum{}) / (double)n);
        }
        ROW_EACH(k, j, c, t, n) {
            float d = X_AT(k, j) - m;
            ss = __dadd_rn(ss, (double)d * d);
        }
        float rs = 1.0f / sqrtf((float)(tile_reduce(t, c.tx, c.ty, ss, sh, Sum{}) / (double)n) + eps);
        ROW_EACH(k, j, c, t, n) {
            float wj = w ? mp_ld(dt, w, j) : 1.0f, bj = bias ? mp_ld(dt, bias, j) : 0.0f;
            mp_stc(dt, y, c.base + j, __fadd_rn((X_AT(k, j) - m) * rs * wj, bj), tl);
        }
#undef X_AT
        if (c.live && c.ty == 0) {
            if (mean) mean[c.q] = m;
            rstd[c.q] = rs;
        }
    }
    tl.commit();
}

/* gx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)); no mean (RMS norm):
 * xhat = x * rstd and no mean(g*w) term. With C, g*w and xhat are kept from the
 * first pass for the second. With parts (C, and a block a row at a time: txn 1),
 * the weight gradient's column sums ride along in the same pass: each thread adds
 * g*xhat and g of its columns over the rows its block takes, in row order, and
 * the block's sums go to parts[blockIdx.x*n + j] and parts[(gridDim.x +
 * blockIdx.x)*n + j] for k_layer_norm_wb_sum to add in block order. */
template <bool C>
__global__ void k_layer_norm_gx(mp_dtype dt, void *gx, const void *gy, const void *x, const float *mean,
                                const float *rstd, const void *w, int64_t rows, int64_t n, Tile t,
                                double *parts, unsigned long long *fc)
{
    __shared__ double sh[MP_THREADS];
    mp_tally tl(fc);
    double swv[C ? LN_CACHE : 1] = {}, sbv[C ? LN_CACHE : 1] = {};
    for (int64_t b = blockIdx.x; b < (rows + t.txn - 1) / t.txn; b += gridDim.x) {
        Col c = col_at(t, b, rows, n, 1);
        float mq = c.live && mean ? mean[c.q] : 0.0f, rq = c.live ? rstd[c.q] : 0.0f;
        float gwv[C ? LN_CACHE : 1], xhv[C ? LN_CACHE : 1];
        double a = 0, cc = 0;
        ROW_EACH(k, j, c, t, n) {
            float g = mp_ld(dt, gy, c.base + j);
            float gw = __fmul_rn(g, w ? mp_ld(dt, w, j) : 1.0f);
            float xh = (mp_ld(dt, x, c.base + j) - mq) * rq;
            if (C) {
                gwv[k] = gw, xhv[k] = xh;
                if (parts) swv[k] = __dadd_rn(swv[k], (double)__fmul_rn(g, xh)), sbv[k] = __dadd_rn(sbv[k], (double)g);
            }
            a += gw, cc = __dadd_rn(cc, (double)gw * xh);
        }
        float ma = (float)(tile_reduce(t, c.tx, c.ty, a, sh, Sum{}) / (double)n);
        if (!mean) ma = 0.0f;
        float mc = (float)(tile_reduce(t, c.tx, c.ty, cc, sh, Sum{}) / (double)n);
        ROW_EACH(k, j, c, t, n) {
            float gw = C ? gwv[k] : __fmul_rn(mp_ld(dt, gy, c.base + j), w ? mp_ld(dt, w, j) : 1.0f);
            float xh = C ? xhv[k] : (mp_ld(dt, x, c.base + j) - mq) * rq;
            mp_stc(dt, gx, c.base + j, rq * __fsub_rn(__fsub_rn(gw, ma), __fmul_rn(xh, mc)), tl);
        }
    }
    if (C && parts) {   /* txn 1: every thread's columns are j = ty + k tyn, whatever rows the block took */
#pragma unroll
        for (int k = 0; k < LN_CACHE; k++) {
            int64_t j = threadIdx.x + (int64_t)k * t.tyn;
            if (j >= n) break;
            parts[(int64_t)blockIdx.x * n + j] = swv[k];
            parts[((int64_t)gridDim.x + blockIdx.x) * n + j] = sbv[k];
        }
    }
    tl.commit();
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
            float m = mean ? mean[r] : 0.0f;   /* no mean: RMS norm */
            float g = mp_ld(dt, gy, r * n + j), xh = (mp_ld(dt, x, r * n + j) - m) * rstd[r];
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

void layer_norm_wb(mp_kctx *cx, mp_dtype dt, float *gw, float *gb, const void *gy, const void *x, const float *mean,
                   const float *rstd, int64_t rows, int64_t n)
{
    int64_t chunks = ln_chunks(rows, n);
    double *parts = NULL;
    if (chunks > 1) {
        /* without scratch, one pass: slower, still summed in double */
        parts = (double *)mp_cuda_scratch(cx, sizeof(double) * (size_t)(2 * chunks * n));
        if (!parts) chunks = 1;
    }
    MP_LAUNCH(grid_for((n + 31) / 32 * chunks), MP_THREADS, 0, cx->stream, k_layer_norm_wb, dt, gw, gb, parts, gy, x,
              mean, rstd, rows, n, chunks);
    MP_LAUNCHED("layer_norm_grad (weight sums)");
    if (chunks == 1) return;
    MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, k_layer_norm_wb_sum, gw, gb, parts, n, chunks);
    MP_LAUNCHED("layer_norm_grad (weight sums, combine)");
}

} /* namespace */

int mp_cuda_softmax(mp_kctx *cx, mp_dtype dt, void *y, const void *x, int64_t outer, int64_t n, int64_t inner, int log)
{
    int64_t cols = outer * inner;
    if (cols <= 0 || n <= 0) return 0;
    Tile t = tile_for(n, inner);
    MP_LAUNCH(grid_for((cols + t.txn - 1) / t.txn), MP_THREADS, 0, cx->stream, k_softmax, dt, y, x, cols, n, inner, t,
              log, cx->flush);
    MP_LAUNCHED("softmax");
    return 0;
}

int mp_cuda_softmax_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *gy, const void *y, int64_t outer, int64_t n,
                          int64_t inner, int log)
{
    int64_t cols = outer * inner;
    if (cols <= 0 || n <= 0) return 0;
    Tile t = tile_for(n, inner);
    MP_LAUNCH(grid_for((cols + t.txn - 1) / t.txn), MP_THREADS, 0, cx->stream, k_softmax_grad, dt, gx, gy, y, cols, n,
              inner, t, log, cx->flush);
    MP_LAUNCHED("softmax_grad");
    return 0;
}

int mp_cuda_cross_entropy(mp_kctx *cx, mp_dtype dt, float *loss, float *lse, const void *x, const int32_t *target,
                           int64_t rows, int64_t classes)
{
    if (rows <= 0 || classes <= 0) return 0;
    const int vec = ((uintptr_t)x % (CE_RUN * mp_dtype_size(dt))) == 0 && classes % CE_RUN == 0;
    MP_BY_FLOAT(dt, T, {
        Tile t = ce_tile<CE_RUN>(classes);
        MP_LAUNCH(grid_for((rows + t.txn - 1) / t.txn), MP_THREADS, 0, cx->stream, k_cross_entropy<T>, loss, lse, x,
                  target, rows, classes, t, vec);
    });
    MP_LAUNCHED("cross_entropy");
    return 0;
}

int mp_cuda_cross_entropy_grad(mp_kctx *cx, mp_dtype dt, void *gx, const void *x, const float *lse, const int32_t *target,
                                const float *scale, int64_t rows, int64_t classes)
{
    if (rows <= 0 || classes <= 0) return 0;
    const int64_t run = 16 / (int64_t)mp_dtype_size(dt);
    const int vec = mp_al16(x) && mp_al16(gx) && classes % run == 0;
    MP_BY_FLOAT(dt, T, {
        Tile t = ce_tile<16 / mp_ty<T>::S>(classes);
        MP_LAUNCH(grid_for((rows + t.txn - 1) / t.txn), MP_THREADS, 0, cx->stream, k_cross_entropy_grad<T>, gx, x, lse,
                  target, scale, rows, classes, t, vec, cx->flush);
    });
    MP_LAUNCHED("cross_entropy_grad");
    return 0;
}

int mp_cuda_layer_norm(mp_kctx *cx, mp_dtype dt, void *y, float *mean, float *rstd, const void *x, const void *w,
                        const void *b, int64_t rows, int64_t n, float eps)
{
    if (rows <= 0) return 0;
    Tile t = tile_for(n, 1);
    if (n <= (int64_t)LN_CACHE * t.tyn)
        MP_LAUNCH(grid_for((rows + t.txn - 1) / t.txn), MP_THREADS, 0, cx->stream, k_layer_norm<true>, dt, y, mean, rstd,
                  x, w, b, rows, n, eps, t, cx->flush);
    else
        MP_LAUNCH(grid_for((rows + t.txn - 1) / t.txn), MP_THREADS, 0, cx->stream, k_layer_norm<false>, dt, y, mean, rstd,
                  x, w, b, rows, n, eps, t, cx->flush);
    MP_LAUNCHED("layer_norm");
    return 0;
}

int mp_cuda_layer_norm_grad(mp_kctx *cx, mp_dtype dt, void *gx, float *gw, float *gb, const void *gy, const void *x,
                             const float *mean, const float *rstd, const void *w, int64_t rows, int64_t n)
{
    if (n <= 0) return 0;
    if (rows > 0) {
        Tile t = tile_for(n, 1);
        unsigned grid = grid_for((rows + t.txn - 1) / t.txn);
        double *parts = NULL;
        if (n <= (int64_t)LN_CACHE * t.tyn) {
            /* the weight sums in the same pass, when a block takes a row at a time:
             * as many blocks as the partials buffer holds (a function of rows and n,
             * so the bits do not depend on the device) */
            int64_t most = LN_PARTS / (2 * n);
            if ((gw || gb) && t.txn == 1 && most >= 1) {
                unsigned g = grid < most ? grid : (unsigned)most;
                parts = (double *)mp_cuda_scratch(cx, sizeof(double) * (size_t)(2 * (int64_t)g * n));
                if (parts) grid = g;
            }
            MP_LAUNCH(grid, MP_THREADS, 0, cx->stream, k_layer_norm_gx<true>, dt, gx, gy, x, mean, rstd, w, rows, n, t,
                      parts, cx->flush);
        } else {
            MP_LAUNCH(grid, MP_THREADS, 0, cx->stream, k_layer_norm_gx<false>, dt, gx, gy, x, mean, rstd, w, rows, n, t,
                      parts, cx->flush);
        }
        MP_LAUNCHED("layer_norm_grad");
        if (parts) {
            MP_LAUNCH(mp_blocks(n), MP_THREADS, 0, cx->stream, k_layer_norm_wb_sum, gw, gb, parts, n, (int64_t)grid);
            MP_LAUNCHED("layer_norm_grad (weight sums of the fused pass, combine)");
            return 0;
        }
    }
    if (gw || gb) layer_norm_wb(cx, dt, gw, gb, gy, x, mean, rstd, rows, n);
    return 0;
}
