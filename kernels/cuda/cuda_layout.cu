/*
 * cuda_layout.cu: reductions over the middle axis of an {outer, n, inner} view
 * (sum, mean, max, argmax, min, argmin), max's backward (put_along), and the copies that
 * change layout: permute, narrow, narrow_put, narrow_pad (narrow's gradient),
 * gather and scatter_add.
 *
 * Reductions: call each of the outer*inner outputs a column. A block owns a tile
 * of columns, and the threads of a column split its n values; their partial
 * results meet in a shared-memory tree, always in the same order, so results are
 * reproducible. Values are widened to double (exact for every dtype, i32
 * included) and sums accumulate in double and round once, as on the CPU. max
 * and min propagate NaN; argmax and argmin take the first maximum or minimum,
 * NaN winning either way.
 * When there are few columns and long ones, each column is split over several
 * blocks and a second kernel combines their partials, which wait in a fixed
 * buffer: safe because this backend runs every kernel on the one stream.
 *
 * The copies move whole elements as 1, 2 or 4-byte words, so they serve every
 * dtype (narrow_pad: words of up to 16 bytes, see there). scatter_add adds with
 * atomics (see there).
 *
 * Indices (gather, scatter_add, put_along) outside [0, n) are left out: gather
 * writes zeros for them, the others skip them, so a bad index never reads or
 * writes out of bounds; check_indices (cuda_check.cu) reports it later.
 * Roundings to f16/bf16 (reduction outputs, scatter_add's sums) are tallied
 * for flush counting as on the CPU.
 */
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_tile.h"

/* the partials of split reductions: at most MP_PARTS Accs ({double, int64}, 16
 * bytes each), in the context's scratch */
#define MP_PARTS (1 << 16)

namespace {


/* ---- reductions ---- */

struct Acc { double v; int64_t at; };   /* a sum, or a maximum and where it is */

__device__ __forceinline__ double ld_d(mp_dtype dt, const void *p, int64_t i)
{
    return dt == MP_I32 ? (double)((const int32_t *)p)[i] : (double)mp_ld(dt, p, i);
}

/* NaN beats every value (the largest for max, the smallest for min); equal
 * values go to the first index */
__device__ __forceinline__ bool beats(Acc a, Acc b, bool lo)
{
    if (isnan(a.v) || isnan(b.v)) return isnan(a.v) && (!isnan(b.v) || a.at < b.at);
    return (lo ? a.v < b.v : a.v > b.v) || (a.v == b.v && a.at < b.at);
}

struct Combine {
    bool sum, lo;   /* lo: min and argmin */
    __device__ Acc operator()(Acc a, Acc b) const
    {
        if (sum) return Acc{a.v + b.v, 0};
        return beats(b, a, lo) ? b : a;
    }
    __device__ Acc identity() const
    {
        return sum ? Acc{0.0, 0} : Acc{lo ? INFINITY : -INFINITY, INT64_MAX};
    }
};

__device__ __forceinline__ Combine combine_for(mp_redop op)
{
    return Combine{op == MP_SUM || op == MP_MEAN, op == MP_MIN || op == MP_ARGMIN};
}

/* one output, rounded as the CPU's reduction rounds it */
__device__ void red_store(mp_redop op, mp_dtype dt, void *out, int64_t q, Acc r, int64_t n, mp_tally &t)
{
    if (op == MP_ARGMAX || op == MP_ARGMIN) { ((int32_t *)out)[q] = (int32_t)r.at; return; }
    double v = op == MP_MEAN ? r.v / (double)n : r.v;
    switch (dt) {
    case MP_F32: ((float *)out)[q] = (float)v; break;
    case MP_I32: ((int32_t *)out)[q] = (int32_t)(uint32_t)(int64_t)v; break;
    case MP_U8: ((uint8_t *)out)[q] = (uint8_t)(int64_t)v; break;
    case MP_F16:
    case MP_BF16: mp_stc(dt, out, q, (float)v, t); break;
    case MP_F64: ((double *)out)[q] = v; break;   /* not reached: no f64 on CUDA (cuda_supports) */
    case MP_E4M3:   /* not reached: the engine gives FP8 to no op that computes */
    case MP_E5M2: mp_stc(dt, out, q, (float)v, t); break;
    }
}

/* block b reduces chunk b % chunks of tile b / chunks (chunk c: values
 * [c*len, (c+1)*len)); with one chunk it writes the result, else its partial
 * to parts[q * chunks + c] */
__global__ void k_reduce(mp_redop op, mp_dtype dt, void *out, const void *a, int64_t cols, int64_t n,
                         int64_t inner, Tile t, int64_t chunks, Acc *parts, unsigned long long *fc)
{
    __shared__ Acc sh[MP_THREADS];
    mp_tally tl(fc);
    int tx, ty;
    tile_pos(t, tx, ty);
    Combine f = combine_for(op);
    int64_t tiles = (cols + t.txn - 1) / t.txn, len = (n + chunks - 1) / chunks;
    for (int64_t b = blockIdx.x; b < tiles * chunks; b += gridDim.x) {
        int64_t q = b / chunks * t.txn + tx, c = b % chunks;
        int64_t hi = (c + 1) * len < n ? (c + 1) * len : n;
        Acc r = f.identity();
        if (q < cols) {
            int64_t base = q / inner * n * inner + q % inner;
            for (int64_t j = c * len + ty; j < hi; j += t.tyn) r = f(r, Acc{ld_d(dt, a, base + j * inner), j});
        }
        r = tile_reduce(t, tx, ty, r, sh, f);
        if (ty == 0 && q < cols) {
            if (chunks == 1) red_store(op, dt, out, q, r, n, tl);
            else parts[q * chunks + c] = r;
        }
    }
    tl.commit();
}

/* the second pass: column q's chunks partials, in a fixed tree */
__global__ void k_reduce_parts(mp_redop op, mp_dtype dt, void *out, const Acc *parts, int64_t cols,
                               int64_t chunks, int64_t n, Tile t, unsigned long long *fc)
{
    __shared__ Acc sh[MP_THREADS];
    mp_tally tl(fc);
    int tx, ty;
    tile_pos(t, tx, ty);
    Combine f = combine_for(op);
    int64_t tiles = (cols + t.txn - 1) / t.txn;
    for (int64_t b = blockIdx.x; b < tiles; b += gridDim.x) {
        int64_t q = b * t.txn + tx;
        Acc r = f.identity();
        if (q < cols)
            for (int64_t c = ty; c < chunks; c += t.tyn) r = f(r, parts[q * chunks + c]);
        r = tile_reduce(t, tx, ty, r, sh, f);
        if (ty == 0 && q < cols) red_store(op, dt, out, q, r, n, tl);
    }
    tl.commit();
}

/* blocks per tile when few tiles would leave the GPU idle: about 1024 blocks in
 * all, at least 2048 values a chunk, and the partials fitting the buffer */
int64_t chunks_for(int64_t tiles, int64_t cols, int64_t n)
{
    int64_t c = (1024 + tiles - 1) / tiles;
    if (c > n / 2048) c = n / 2048;
    if (c > MP_PARTS / cols) c = MP_PARTS / cols;
    return c < 2 ? 1 : c;
}

/* ---- copies ---- */

/* runs the statement with W the unsigned word of dt's size */
#define BY_WORD(dt, ...)                                              \
    switch (mp_dtype_size(dt)) {                                      \
    case 4: { typedef uint32_t W; __VA_ARGS__; } break;               \
    case 2: { typedef uint16_t W; __VA_ARGS__; } break;               \
    default: { typedef uint8_t W; __VA_ARGS__; } break;               \
    }

template <class W>
__global__ void k_put_along(W *out, const W *src, const int32_t *idx, int64_t outer, int64_t n, int64_t inner)
{
    MP_FOR(q, outer * inner) {
        int32_t j = idx[q];
        if (j >= 0 && j < n) out[(q / inner * n + j) * inner + q % inner] = src[q];
    }
}

/* dims of the output with, for each, the input's stride when stepping it */
struct Perm { int nd; int64_t shape[MP_MAXDIM], stride[MP_MAXDIM]; };

template <class W>
__global__ void k_permute(W *out, const W *in, Perm p, int64_t total)
{
    MP_FOR(e, total) {
        int64_t src = 0, q = e;
        for (int d = p.nd - 1; d >= 0; d--) {
            src += q % p.shape[d] * p.stride[d];
            q /= p.shape[d];
        }
        out[e] = in[src];
    }
}

/* drops size-1 dims and merges neighbours that are contiguous in the input too */
Perm perm_plan(int ndim, const int64_t *shape, const int *perm, int64_t *total)
{
    int64_t istride[MP_MAXDIM], s = 1;
    for (int d = ndim - 1; d >= 0; d--) istride[d] = s, s *= shape[d];
    Perm p;
    p.nd = 0, *total = s;
    for (int d = 0; d < ndim; d++) {
        int64_t sz = shape[perm[d]], st = istride[perm[d]];
        if (sz == 1) continue;
        if (p.nd && p.stride[p.nd - 1] == st * sz) {
            p.shape[p.nd - 1] *= sz, p.stride[p.nd - 1] = st;
            continue;
        }
        p.shape[p.nd] = sz, p.stride[p.nd] = st, p.nd++;
    }
    return p;
}

/* rows of `width` words from src (row pitch sp) to dst (row pitch dp) */
template <class W>
__global__ void k_rows(W *dst, int64_t dp, const W *src, int64_t sp, int64_t rows, int64_t width)
{
    MP_FOR(e, rows * width) dst[e / width * dp + e % width] = src[e / width * sp + e % width];
}

template <class W>
__global__ void k_gather(W *out, const W *in, const int32_t *idx, int64_t nidx, int64_t outer, int64_t n,
                         int64_t inner)
{
    MP_FOR(e, outer * nidx * inner) {
        int64_t i = e % inner, r = e / inner;
        int32_t j = idx[r % nidx];
        out[e] = j >= 0 && j < n ? in[(r / nidx * n + j) * inner + i] : (W)0;
    }
}

/* float dtypes and i32: one atomicAdd per source element (f32, __half,
 * __nv_bfloat16 or int), each rounding as the CPU's in-order loop does; with a
 * repeated index the order of the adds, so the last bit of f32/f16/bf16 sums,
 * can vary from run to run (i32 sums are exact).
 * Flush counting (f16/bf16): the atomic returns the old value; the f32 sum of
 * two f16 (or bf16) values rounds to the same f16 (bf16) as the hardware's
 * correctly rounded add (f32 carries more than 2p+2 bits, p the narrow
 * type's), so the f32 sum and its rounding are what the CPU's count sees. */
template <class T>
__global__ void k_scatter_atomic(T *out, const T *src, const int32_t *idx, int64_t nidx, int64_t outer,
                                 int64_t n, int64_t inner, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(e, outer * nidx * inner) {
        int64_t i = e % inner, r = e / inner;
        int32_t j = idx[r % nidx];
        if (j < 0 || j >= n) continue;
        T *p = out + (r / nidx * n + j) * inner + i;
        if constexpr (mp_ty<T>::low) {
            if (fc) {
                T s = src[e], old = atomicAdd(p, s);
                float sum = __fadd_rn(mp_ty<T>::of(old), mp_ty<T>::of(s));
                t.note<T>(sum, mp_ty<T>::bits(sum));
                continue;
            }
        }
        atomicAdd(p, src[e]);
    }
    t.commit();
}

/* u8 (no byte atomics): a thread owns column (o, i) of out and adds its sources
 * in index order, wrapping */
__global__ void k_scatter_u8(uint8_t *out, const uint8_t *src, const int32_t *idx, int64_t nidx, int64_t outer,
                             int64_t n, int64_t inner)
{
    MP_FOR(c, outer * inner) {
        int64_t o = c / inner, i = c % inner;
        for (int64_t j = 0; j < nidx; j++) {
            int32_t k = idx[j];
            if (k >= 0 && k < n) out[(o * n + k) * inner + i] += src[(o * nidx + j) * inner + i];
        }
    }
}

/* ---- narrow's gradient (narrow_pad) ----
 * The output is outer rows of `row` units; the slice is the units [lo, lo + w)
 * of each row, fed by the source's rows of w units. A unit u of row r = u / row
 * is inside when j = u - r row - lo < w, compared unsigned: a unit before the
 * slice wraps to a j past it. One division per unit, in 32 bits wherever the
 * units fit (pad_index), as the broadcasts of cuda_elementwise.cu. */

/* I: uint32_t when the units of out (so of in) are fewer than 2^31 (the
 * grid-stride steps cannot wrap then), else uint64_t */
#define PAD_FOR(I, u, n) for (I u = (I)blockIdx.x * blockDim.x + threadIdx.x; u < (n); u += (I)gridDim.x * blockDim.x)

/* add 0: every unit of out written once, zero or the source's; U a word of
 * 1 to 16 bytes (uint4: 16), so any dtype's bytes */
template <class U, class I>
__global__ void k_narrow_pad(U *out, const U *in, I total, I row, I lo, I w)
{
    PAD_FOR(I, u, total) {
        I r = u / row, j = u - r * row - lo;
        if (j < w) out[u] = in[r * w + j];
        else out[u] = U{};   /* all-zero bits: +0 in every dtype */
    }
}

/* add 1, a float dtype T, one element a unit: out + in inside the slice,
 * out + 0 outside, each the f32 add and rounding binary's add makes (and
 * tallies). Outside, out + 0 is out itself but for -0 (+0 after) and NaN
 * payloads, so a unit is written there only when its bits change: the bits
 * of writing every one, without writing what the add leaves as it was. */
template <class T, class I>
__global__ void k_narrow_pad_add(void *out, const void *in, I total, I row, I lo, I w, unsigned long long *fc)
{
    typedef typename mp_ty<T>::W W;
    mp_tally t(fc);
    PAD_FOR(I, u, total) {
        I r = u / row, j = u - r * row - lo;
        bool inside = j < w;
        uint32_t old = ((const W *)out)[u];
        float v = mp_ty<T>::tof(old) + (inside ? mp_get<T>(in, (int64_t)(r * w + j)) : 0.0f);
        uint32_t b = mp_ty<T>::bits(v);
        t.note<T>(v, b);
        if (inside || b != old) ((W *)out)[u] = (W)b;
    }
    t.commit();
}

/* the same 16 bytes at a time: a unit is G = 16 / sizeof(T) elements (row, lo
 * and w multiples of G, out and in 16-byte aligned: a unit never straddles the
 * slice's edge or a row's end), each element as k_narrow_pad_add's */
template <class T, class I>
__global__ void k_narrow_pad_add_vec(void *out, const void *in, I total, I row, I lo, I w, unsigned long long *fc)
{
    constexpr int S = mp_ty<T>::S, G = 16 / S;
    mp_tally t(fc);
    PAD_FOR(I, u, total) {
        I r = u / row, j = u - r * row - lo;
        bool inside = j < w, changed = inside;
        uint32_t o[G], b[G];
        float y[G];
        mp_ldbits<S, G>((const char *)out + (int64_t)u * 16, o);
        if (inside) mp_ldv<T, G>((const char *)in + (int64_t)(r * w + j) * 16, y);
        else for (int k = 0; k < G; k++) y[k] = 0.0f;
#pragma unroll
        for (int k = 0; k < G; k++) {
            float v = mp_ty<T>::tof(o[k]) + y[k];
            b[k] = mp_ty<T>::bits(v);
            t.note<T>(v, b[k]);
            changed |= b[k] != o[k];
        }
        if (changed) mp_stbits<S, G>((char *)out + (int64_t)u * 16, b);
    }
    t.commit();
}

/* add 1, i32 and u8: out + 0 is out, so only the slice's elements, each added
 * wrapping (W unsigned) as the CPU's integer add; total = outer * w */
template <class W, class I>
__global__ void k_narrow_pad_add_int(W *out, const W *in, I total, I row, I lo, I w)
{
    PAD_FOR(I, e, total) {
        I r = e / w;
        out[r * row + lo + (e - r * w)] += in[e];
    }
}

} /* namespace */

void mp_cuda_reduce(mp_kctx *cx, mp_redop op, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner)
{
    int64_t cols = outer * inner;
    if (cols <= 0) return;
    Tile t = tile_for(n, inner);
    int64_t tiles = (cols + t.txn - 1) / t.txn, chunks = chunks_for(tiles, cols, n);
    Acc *parts = NULL;
    if (chunks > 1) {
        /* without scratch, one pass: slower, still summed in double */
        parts = (Acc *)mp_cuda_scratch(cx, sizeof(Acc) * (size_t)(chunks * cols));
        if (!parts) chunks = 1;
    }
    MP_LAUNCH(grid_for(tiles * chunks), MP_THREADS, 0, cx->stream, k_reduce, op, dt, out, a, cols, n, inner, t, chunks,
              parts, cx->flush);
    MP_LAUNCHED("reduce");
    if (chunks == 1) return;
    Tile t2 = tile_for(chunks, 1);
    MP_LAUNCH(grid_for((cols + t2.txn - 1) / t2.txn), MP_THREADS, 0, cx->stream, k_reduce_parts, op, dt, out, parts,
              cols, chunks, n, t2, cx->flush);
    MP_LAUNCHED("reduce (combine)");
}

void mp_cuda_put_along(mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx, int64_t outer, int64_t n,
                       int64_t inner)
{
    if (outer * inner <= 0) return;
    BY_WORD(dt, MP_LAUNCH(mp_blocks(outer * inner), MP_THREADS, 0, cx->stream, k_put_along<W>, (W *)out,
                          (const W *)src, idx, outer, n, inner));
    MP_LAUNCHED("put_along");
}

void mp_cuda_permute(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int ndim, const int64_t *shape, const int *perm)
{
    int64_t total;
    Perm p = perm_plan(ndim, shape, perm, &total);
    if (total <= 0) return;
    BY_WORD(dt, MP_LAUNCH(mp_blocks(total), MP_THREADS, 0, cx->stream, k_permute<W>, (W *)out, (const W *)in, p,
                          total));
    MP_LAUNCHED("permute");
}

void mp_cuda_narrow(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n, int64_t start, int64_t len,
                    int64_t inner)
{
    int64_t w = len * inner;
    if (outer * w <= 0) return;
    BY_WORD(dt, MP_LAUNCH(mp_blocks(outer * w), MP_THREADS, 0, cx->stream, k_rows<W>, (W *)out, w,
                          (const W *)in + start * inner, n * inner, outer, w));
    MP_LAUNCHED("narrow");
}

void mp_cuda_narrow_put(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n, int64_t start,
                        int64_t len, int64_t inner)
{
    int64_t w = len * inner;
    if (outer * w <= 0) return;
    BY_WORD(dt, MP_LAUNCH(mp_blocks(outer * w), MP_THREADS, 0, cx->stream, k_rows<W>, (W *)out + start * inner,
                          n * inner, (const W *)in, w, outer, w));
    MP_LAUNCHED("narrow_put");
}

/* the widest word of 16, 8, 4, 2 or 1 bytes that divides a row, the slice's
 * start and width (in bytes) and both addresses */
static int pad_word(size_t row, size_t lo, size_t w, const void *out, const void *in)
{
    uintptr_t all = (uintptr_t)row | (uintptr_t)lo | (uintptr_t)w | (uintptr_t)out | (uintptr_t)in;
    int b = 16;
    while (b > 1 && (all & (uintptr_t)(b - 1))) b /= 2;
    return b;
}

/* narrow's gradient (backend.h narrow_pad): one kernel. add 0 moves bytes, so
 * every dtype, in the widest word the shape and addresses allow (uint4 for
 * GPT's q, k, v: rows of 3C, a slice of C). add 1 computes: f32, f16 and bf16
 * as binary's add (16 bytes at a time where row, start and width are whole
 * vectors), i32 and u8 wrapping; FP8 (no op computes in it) and f64 (none on
 * CUDA) are left as they are. */
void mp_cuda_narrow_pad(mp_kctx *cx, mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n, int64_t start,
                        int64_t len, int64_t inner, int add)
{
    const int64_t row = n * inner, lo = start * inner, w = len * inner, total = outer * row;
    if (total <= 0) return;
    const size_t es = mp_dtype_size(dt);
    const bool narrow = total < ((int64_t)1 << 31);
    cudaStream_t s = cx->stream;
    if (!add) {
        /* es divides a row, the start, the width and both addresses, so the
         * word b is at least an element */
        const int b = pad_word((size_t)row * es, (size_t)lo * es, (size_t)w * es, out, in);
        const int64_t ur = row * (int64_t)es / b, ul = lo * (int64_t)es / b, uw = w * (int64_t)es / b, units = outer * ur;
#define PAD(U)                                                                                                    \
    do {                                                                                                          \
        if (narrow)                                                                                               \
            MP_LAUNCH(mp_blocks(units), MP_THREADS, 0, s, k_narrow_pad<U, uint32_t>, (U *)out, (const U *)in,      \
                      (uint32_t)units, (uint32_t)ur, (uint32_t)ul, (uint32_t)uw);                                 \
        else                                                                                                      \
            MP_LAUNCH(mp_blocks(units), MP_THREADS, 0, s, k_narrow_pad<U, uint64_t>, (U *)out, (const U *)in,      \
                      (uint64_t)units, (uint64_t)ur, (uint64_t)ul, (uint64_t)uw);                                 \
    } while (0)
        switch (b) {
        case 16: PAD(uint4); break;
        case 8: PAD(uint2); break;
        case 4: PAD(uint32_t); break;
        case 2: PAD(uint16_t); break;
        default: PAD(uint8_t); break;
        }
#undef PAD
        MP_LAUNCHED("narrow_pad");
        return;
    }
    if (dt == MP_I32 || dt == MP_U8) {   /* the slice's elements only */
        const int64_t cnt = outer * w;
        if (cnt <= 0) return;
        BY_WORD(dt, if (narrow) MP_LAUNCH(mp_blocks(cnt), MP_THREADS, 0, s, k_narrow_pad_add_int<W, uint32_t>, (W *)out,
                                          (const W *)in, (uint32_t)cnt, (uint32_t)row, (uint32_t)lo, (uint32_t)w);
                    else MP_LAUNCH(mp_blocks(cnt), MP_THREADS, 0, s, k_narrow_pad_add_int<W, uint64_t>, (W *)out,
                                   (const W *)in, (uint64_t)cnt, (uint64_t)row, (uint64_t)lo, (uint64_t)w));
        MP_LAUNCHED("narrow_pad (add)");
        return;
    }
    unsigned long long *fc = cx->flush;
#define PAD_ADD(K, units, ...)                                                                                    \
    do {                                                                                                          \
        if (narrow) MP_LAUNCH(mp_blocks(units), MP_THREADS, 0, s, K<__VA_ARGS__, uint32_t>, out, in, (uint32_t)(units), \
                              (uint32_t)ur, (uint32_t)ul, (uint32_t)uw, fc);                                     \
        else MP_LAUNCH(mp_blocks(units), MP_THREADS, 0, s, K<__VA_ARGS__, uint64_t>, out, in, (uint64_t)(units),  \
                       (uint64_t)ur, (uint64_t)ul, (uint64_t)uw, fc);                                            \
    } while (0)
    const int64_t g = 16 / (int64_t)es;   /* elements a vector (f32, f16, bf16; MP_BY_FLOAT runs nothing else) */
    if (row % g == 0 && lo % g == 0 && w % g == 0 && mp_al16(out) && mp_al16(in)) {
        const int64_t ur = row / g, ul = lo / g, uw = w / g;
        MP_BY_FLOAT(dt, T, PAD_ADD(k_narrow_pad_add_vec, outer * ur, T));
    } else {
        const int64_t ur = row, ul = lo, uw = w;
        MP_BY_FLOAT(dt, T, PAD_ADD(k_narrow_pad_add, total, T));
    }
#undef PAD_ADD
    MP_LAUNCHED("narrow_pad (add)");
}

void mp_cuda_gather(mp_kctx *cx, mp_dtype dt, void *out, const void *in, const int32_t *idx, int64_t nidx, int64_t outer,
                    int64_t n, int64_t inner)
{
    int64_t total = outer * nidx * inner;
    if (total <= 0) return;
    BY_WORD(dt, MP_LAUNCH(mp_blocks(total), MP_THREADS, 0, cx->stream, k_gather<W>, (W *)out, (const W *)in, idx,
                          nidx, outer, n, inner));
    MP_LAUNCHED("gather");
}

void mp_cuda_scatter_add(mp_kctx *cx, mp_dtype dt, void *out, const void *src, const int32_t *idx, int64_t nidx,
                         int64_t outer, int64_t n, int64_t inner)
{
    int64_t total = outer * nidx * inner;
    if (total <= 0) return;
    unsigned g = mp_blocks(total);
    cudaStream_t s = cx->stream;
    unsigned long long *fc = cx->flush;
    /* f32, f16 and bf16 sums with a repeated index depend on the order of the
     * atomics: the launches say so (MP_LAUNCH_UNORDERED) */
#define SCATTER(T)                                                                                           \
    MP_LAUNCH_UNORDERED(g, MP_THREADS, 0, s, k_scatter_atomic<T>, (T *)out, (const T *)src, idx, nidx, outer, n, \
                        inner, fc)
    switch (dt) {
    case MP_F32: SCATTER(float); break;
    case MP_F16: SCATTER(__half); break;
    case MP_BF16: SCATTER(__nv_bfloat16); break;
    case MP_I32: SCATTER(int); break;
    case MP_U8:
        MP_LAUNCH(mp_blocks(outer * inner), MP_THREADS, 0, s, k_scatter_u8, (uint8_t *)out, (const uint8_t *)src, idx,
                  nidx, outer, n, inner);
        break;
    case MP_F64: break;   /* no f64 tensors on CUDA (cuda_supports) */
    case MP_E4M3:         /* not reached: the engine gives FP8 to no op that computes */
    case MP_E5M2: break;
    }
#undef SCATTER
    MP_LAUNCHED("scatter_add");
}
