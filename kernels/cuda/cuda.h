/*
 * cuda.h: what the CUDA kernel files share.
 *
 * - Loading and storing every dtype as f32: f16/bf16 in, f32 compute, one
 *   rounding out, the same numerics as the CPU backend (docs/DESIGN.md section 3);
 *   by a runtime dtype (mp_ld, mp_st) or, in templated kernels, a compile-time
 *   one (mp_ty, mp_get, mp_put), and 16 bytes at a time (mp_ldv, mp_stv).
 * - Flush counting at every rounding to f16/bf16 (mp_tally, mp_stc).
 * - Launch sizes and a grid-stride loop.
 * - The backend's context (struct mp_kctx): the stream every kernel and copy
 *   runs on, the cuBLAS handle, scratch, the sticky error and the rest.
 * - The sticky error: a kernel launch cannot return an error to its caller, so
 *   each file notes the first CUDA error and the engine collects it after the op.
 *
 * Each .cu file defines the kernels behind some entries of the mp_backend table
 * (kernels/backend.h); cuda_backend.cu assembles the table. Nothing here knows
 * about the engine.
 */
#ifndef MP_CUDA_H
#define MP_CUDA_H

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include <utility>   /* std::forward, for mp_launch */

extern "C" {
#include "kernels/backend.h"
#include "kernels/block_cache.h"
}
#include "kernels/fp8.h"   /* FP8's reference conversions, host and device (MP_HALF_FN) */

/* ---- launches ----
 * Every kernel launch is MP_LAUNCH(grid, block, shared bytes, stream, kernel,
 * arguments...): with nvcc, kernel<<<grid, block, shared, stream>>>(arguments)
 * through mp_launch. Compiled for the emulated device (tests/emu, -DMP_EMU),
 * tests/emu/emu_device.h defines these first and the emulator's scheduler runs
 * the kernel. MP_LAUNCH_UNORDERED marks a launch whose floating-point atomics
 * let the order of its threads change the last bits of a sum (scatter_add with
 * a repeated index, attention's dk and dv: docs/ARCHITECTURE.md); the
 * emulator's comparison of thread orders allows those differences only there.
 * MP_DYNAMIC_SHARED declares a kernel's dynamic shared memory, MP_DEVICE_GLOBAL
 * a __device__ variable. */
#ifndef MP_EMU
template <class... P, class... A>
static inline void mp_launch(dim3 grid, dim3 block, size_t shared, cudaStream_t stream, void (*kernel)(P...),
                             A &&...args)
{
    kernel<<<grid, block, shared, stream>>>(std::forward<A>(args)...);
}
#define MP_LAUNCH(grid, block, shared, stream, ...) mp_launch(grid, block, shared, stream, __VA_ARGS__)
#define MP_LAUNCH_UNORDERED(grid, block, shared, stream, ...) mp_launch(grid, block, shared, stream, __VA_ARGS__)
#define MP_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#define MP_DEVICE_GLOBAL __device__
#endif

/* ---- the backend's context (backend.h) ----
 * Everything the CUDA backend keeps between calls lives here, in one object
 * that every entry takes first (cx): no kernel file keeps state of its own.
 * The one instance is the device's (cuda_backend.cu). Outside it, the only
 * mutable state is the device's own: __device__ counters that kernels update
 * (mp_flush_totals, the index check's first bad position), documented where
 * they are defined. */
#define MP_CUDA_STAGE_SLOTS 4
struct mp_cuda_graphs;   /* cuda_graph.cu */
struct mp_kctx {
    cudaStream_t stream;              /* every kernel and copy runs on it, in order */
    mp_block_cache cache;             /* device memory (kernels/block_cache.h) */
    int64_t n_to_host, n_waits, n_mallocs;   /* the counters entry */
    char error_msg[512];              /* the sticky error: the first since the engine last asked */
    bool has_error;
    /* copies from the host through pinned staging buffers (cuda_backend.cu) */
    char *stage_buf[MP_CUDA_STAGE_SLOTS];
    cudaEvent_t stage_event[MP_CUDA_STAGE_SLOTS];
    bool stage_busy[MP_CUDA_STAGE_SLOTS];
    int stage_next, stage_state;      /* state 0: not tried yet, 1: ready, -1: unavailable */
    /* flush counting: flush points at the counting slot's three device totals
     * while counting, else NULL; flush_dev at slot 0 */
    unsigned long long *flush, *flush_dev;
    int flush_at;
    int64_t flush_host[MP_FLUSH_SLOTS][3];
    /* cuBLAS: the handle, bound to stream, and its workspace (cuda_gemm.cu) */
    cublasHandle_t blas;
    cudaStream_t blas_stream;
    bool blas_bound;
    void *blas_ws;
    /* cuBLASLt: the handle and the plans per shape of gemm_bias (cuda_gemm_lt.cu) */
    void *blaslt;
    /* scratch device memory for a kernel's partial results, from the cache,
     * grown on demand and kept (mp_cuda_scratch) */
    void *scratch;
    size_t scratch_cap;
    /* the index checks' fault record in mapped host memory (cuda_check.cu) */
    void *fault_host, *fault_dev;
    /* room for what comes next, owned here when it comes: a cuDNN handle and its
     * plan cache (per shape), and an NCCL communicator on this stream */
    void *cudnn, *cudnn_plans, *nccl;
    /* NCCL's second stream (cuda_nccl.cu): data-parallel buckets reduced while
     * backward goes on, each after an event of the main stream */
    cudaStream_t coll_stream;
    cudaEvent_t coll_event;
    bool coll_on_side;
    /* CUDA graphs (cuda_graph.cu): the capture open, the live graphs' pools
     * and which blocks they own; NULL until the first capture */
    struct mp_cuda_graphs *graphs;
};

/* remember the first error since the engine last asked */
void mp_cuda_note(mp_kctx *cx, cudaError_t e, const char *what);
#define MP_CUDA_CHECK(call, what) mp_cuda_note(cx, (call), (what))
#define MP_LAUNCHED(what) mp_cuda_note(cx, cudaGetLastError(), (what))

/* cudaMalloc, and a wait for the stream, counted for the counters entry
 * (cuda_backend.cu): a file that allocates device memory or waits for the
 * device goes through these */
cudaError_t mp_cuda_malloc(mp_kctx *cx, void **p, size_t nbytes);
cudaError_t mp_cuda_wait(mp_kctx *cx);
/* nbytes of the context's scratch device memory (0 bytes too), or NULL when
 * there is no memory for it */
void *mp_cuda_scratch(mp_kctx *cx, size_t nbytes);
/* every device block of the backend's: from the caching allocator, or while
 * a graph is captured from the graph's pool; a block a live graph owns goes
 * back to its pool (cuda_graph.cu). NULL when memory runs out. */
void *mp_cuda_alloc(mp_kctx *cx, size_t nbytes);
void mp_cuda_free(mp_kctx *cx, void *p, size_t nbytes);
/* whether a graph is being captured (nothing may wait for the device then) */
bool mp_cuda_capturing(const mp_kctx *cx);
/* a block the cache gives back to the system during a capture, when
 * cudaFree may not be called: freed when the capture ends */
void mp_cuda_defer_free(mp_kctx *cx, void *p);
/* Random numbers in a captured graph (backend.h graph_replay): a kernel of the
 * capture cannot keep the (seed, offset) it was launched with, each replay
 * draws at the generator state of its own time. The open graph keeps a device
 * pair {seed, base offset} that graph_replay rewrites before each launch (a
 * kernel of its own, queued, by value: no copy from host memory); a random
 * kernel of the capture is given that pair and its offset relative to the
 * capture's start, and reads the pair when it runs (mp_rng_from).
 * mp_cuda_rng_pair: the pair a random launch passes, NULL for an eager one
 * (graph false); -1 (the error noted as `what`'s) when graph is asked with no
 * capture open or no device memory for the pair (taken at the first draw). */
int mp_cuda_rng_pair(mp_kctx *cx, bool graph, const uint64_t **pair, const char *what);
/* in a kernel: the seed and the absolute offset of a draw given pair */
__device__ __forceinline__ void mp_rng_from(const uint64_t *pair, uint64_t &seed, uint64_t &offset)
{
    if (pair) seed = pair[0], offset += pair[1];
}

#define MP_THREADS 256

static inline unsigned mp_blocks(int64_t n)
{
    int64_t b = (n + MP_THREADS - 1) / MP_THREADS;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* grid-stride loop over [0, n) */
#define MP_FOR(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* f32 -> integer as every backend converts: truncation toward zero, saturating,
 * NaN -> 0 */
__host__ __device__ __forceinline__ int32_t mp_f2i32(float v)
{
    return isnan(v) ? 0 : v >= 2147483647.0f ? INT32_MAX : v <= -2147483648.0f ? INT32_MIN : (int32_t)v;
}

__host__ __device__ __forceinline__ uint8_t mp_f2u8(float v)
{
    return isnan(v) || v <= 0.0f ? 0 : v >= 255.0f ? 255 : (uint8_t)v;
}

__device__ __forceinline__ float mp_ld(mp_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case MP_F32: return ((const float *)p)[i];
    case MP_F16: return __half2float(((const __half *)p)[i]);
    case MP_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case MP_I32: return (float)((const int32_t *)p)[i];
    case MP_U8: return (float)((const uint8_t *)p)[i];
    case MP_F64: return (float)((const double *)p)[i];   /* not reached: no f64 on CUDA (cuda_supports) */
    case MP_E4M3: return mp_fp8_to_f32(((const uint8_t *)p)[i], MP_FP8_E4M3);
    case MP_E5M2: return mp_fp8_to_f32(((const uint8_t *)p)[i], MP_FP8_E5M2);
    }
    return 0.0f;   /* not a dtype */
}

/* f32 -> dtype: round to nearest even for f16/bf16 and FP8 (FP8 not
 * saturating, as PyTorch's .to(); a cast chooses, mp_cuda_cast); integers
 * saturate, NaN -> 0 */
__device__ __forceinline__ void mp_st(mp_dtype dt, void *p, int64_t i, float v)
{
    switch (dt) {
    case MP_F32: ((float *)p)[i] = v; break;
    case MP_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case MP_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case MP_I32: ((int32_t *)p)[i] = mp_f2i32(v); break;
    case MP_U8: ((uint8_t *)p)[i] = mp_f2u8(v); break;
    case MP_F64: ((double *)p)[i] = v; break;   /* not reached: no f64 on CUDA (cuda_supports) */
    case MP_E4M3: ((uint8_t *)p)[i] = mp_f32_to_fp8(v, MP_FP8_E4M3, 0); break;
    case MP_E5M2: ((uint8_t *)p)[i] = mp_f32_to_fp8(v, MP_FP8_E5M2, 0); break;
    }
}

/* ---- dtypes known at compile time ----
 * mp_ty<T> gives, for the element type T of a dtype, its size S, its storage
 * word W, and the conversions between its bits (or a T, of) and f32 that
 * mp_ld and mp_st make (the same intrinsics, so the same results bit for bit). low: the f32 ->
 * T rounding is one that flush counting counts (f16, bf16); INF: T's inf bits. */
template <class T> struct mp_ty;
template <> struct mp_ty<float> {
    typedef uint32_t W;
    static constexpr int S = 4;
    static constexpr bool low = false;
    static __device__ __forceinline__ float tof(uint32_t b) { return __uint_as_float(b); }
    static __device__ __forceinline__ float of(float v) { return v; }
    static __device__ __forceinline__ uint32_t bits(float v) { return __float_as_uint(v); }
};
template <> struct mp_ty<__half> {
    typedef uint16_t W;
    static constexpr int S = 2;
    static constexpr bool low = true;
    static constexpr uint32_t INF = 0x7c00;
    static __device__ __forceinline__ float tof(uint32_t b) { return __half2float(__ushort_as_half((unsigned short)b)); }
    static __device__ __forceinline__ float of(__half v) { return __half2float(v); }
    static __device__ __forceinline__ uint32_t bits(float v) { return __half_as_ushort(__float2half_rn(v)); }
};
template <> struct mp_ty<__nv_bfloat16> {
    typedef uint16_t W;
    static constexpr int S = 2;
    static constexpr bool low = true;
    static constexpr uint32_t INF = 0x7f80;
    static __device__ __forceinline__ float tof(uint32_t b)
    {
        return __bfloat162float(__ushort_as_bfloat16((unsigned short)b));
    }
    static __device__ __forceinline__ float of(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ uint32_t bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};
template <> struct mp_ty<int32_t> {
    typedef uint32_t W;
    static constexpr int S = 4;
    static constexpr bool low = false;
    static __device__ __forceinline__ float tof(uint32_t b) { return (float)(int32_t)b; }
    static __device__ __forceinline__ float of(int32_t v) { return (float)v; }
    static __device__ __forceinline__ uint32_t bits(float v) { return (uint32_t)mp_f2i32(v); }
};
template <> struct mp_ty<uint8_t> {
    typedef uint8_t W;
    static constexpr int S = 1;
    static constexpr bool low = false;
    static __device__ __forceinline__ float tof(uint32_t b) { return (float)b; }
    static __device__ __forceinline__ float of(uint8_t v) { return (float)v; }
    static __device__ __forceinline__ uint32_t bits(float v) { return mp_f2u8(v); }
};

/* the unsigned word of S bytes */
template <int S> struct mp_word;
template <> struct mp_word<4> { typedef uint32_t W; };
template <> struct mp_word<2> { typedef uint16_t W; };
template <> struct mp_word<1> { typedef uint8_t W; };

/* runs the statements with NAME the element type of dt (MP_BY_FLOAT: f32, f16
 * and bf16 only; other dtypes run nothing). Like every switch over a dtype in
 * the kernels, no default: a new dtype is a compile error (-Wswitch) here. */
#define MP_BY_DTYPE(dt, NAME, ...)                                                  \
    switch (dt) {                                                                   \
    case MP_F32: { typedef float NAME; __VA_ARGS__; } break;                        \
    case MP_F16: { typedef __half NAME; __VA_ARGS__; } break;                       \
    case MP_BF16: { typedef __nv_bfloat16 NAME; __VA_ARGS__; } break;               \
    case MP_I32: { typedef int32_t NAME; __VA_ARGS__; } break;                      \
    case MP_U8: { typedef uint8_t NAME; __VA_ARGS__; } break;                       \
    case MP_F64: break;   /* no f64 tensors on CUDA (cuda_supports) */              \
    case MP_E4M3:         /* data only: casts convert FP8 on their own path */      \
    case MP_E5M2: break;                                                            \
    }
#define MP_BY_FLOAT(dt, NAME, ...)                                                  \
    switch (dt) {                                                                   \
    case MP_F32: { typedef float NAME; __VA_ARGS__; } break;                        \
    case MP_F16: { typedef __half NAME; __VA_ARGS__; } break;                       \
    case MP_BF16: { typedef __nv_bfloat16 NAME; __VA_ARGS__; } break;               \
    case MP_I32:                                                                    \
    case MP_U8:                                                                     \
    case MP_E4M3:         /* data only: the engine gives FP8 to no op that computes */ \
    case MP_E5M2:                                                                   \
    case MP_F64: break;   /* no f64 tensors on CUDA (cuda_supports) */              \
    }

/* ---- flush counting (backend.h: flush_slot, flush_read) ----
 * While the engine counts, cx->flush points at the counting slot's three
 * device counters (values rounded to f16/bf16, nonzero values that became
 * zero, finite values that became inf); otherwise it is NULL. Launches that
 * round to f16/bf16 pass it to the kernel; each thread tallies in registers
 * and adds its warp's totals once, at the end of the kernel (commit, which
 * every thread that noted must reach). With counting off the cost is one
 * uniform branch per rounding. */
/* roundings made on the host (fill computes its one value there) */
void mp_cuda_flush_host(mp_kctx *cx, int64_t n, int64_t zero, int64_t inf);

struct mp_tally {
    unsigned long long *to;
    unsigned n, zero, inf;
    __device__ __forceinline__ explicit mp_tally(unsigned long long *p) : to(p), n(0), zero(0), inf(0) {}
    /* v: the f32 value, b: the bits it rounded to (as a T) */
    template <class T> __device__ __forceinline__ void note(float v, uint32_t b)
    {
        if constexpr (mp_ty<T>::low) {
            if (to) {
                uint32_t mag = b & 0x7fffu;
                n++;
                zero += mag == 0 && v != 0.0f;
                inf += mag == mp_ty<T>::INF && isfinite(v);
            }
        }
    }
    __device__ __forceinline__ void commit()
    {
        if (!to) return;
        unsigned mask = __activemask();
        unsigned a = __reduce_add_sync(mask, n), z = __reduce_add_sync(mask, zero), f = __reduce_add_sync(mask, inf);
        if ((int)(threadIdx.x & 31) == __ffs(mask) - 1) {
            if (a) atomicAdd(to, (unsigned long long)a);
            if (z) atomicAdd(to + 1, (unsigned long long)z);
            if (f) atomicAdd(to + 2, (unsigned long long)f);
        }
    }
};

/* mp_st that tallies its rounding */
__device__ __forceinline__ void mp_stc(mp_dtype dt, void *p, int64_t i, float v, mp_tally &t)
{
    if (dt == MP_F16) {
        uint32_t b = mp_ty<__half>::bits(v);
        ((uint16_t *)p)[i] = (uint16_t)b;
        t.note<__half>(v, b);
    } else if (dt == MP_BF16) {
        uint32_t b = mp_ty<__nv_bfloat16>::bits(v);
        ((uint16_t *)p)[i] = (uint16_t)b;
        t.note<__nv_bfloat16>(v, b);
    } else {
        mp_st(dt, p, i, v);
    }
}

/* element i of a T array as f32, and f32 stored into one (tallied) */
template <class T> __device__ __forceinline__ float mp_get(const void *p, int64_t i)
{
    return mp_ty<T>::tof(((const typename mp_ty<T>::W *)p)[i]);
}
template <class T> __device__ __forceinline__ void mp_put(void *p, int64_t i, float v, mp_tally &t)
{
    uint32_t b = mp_ty<T>::bits(v);
    ((typename mp_ty<T>::W *)p)[i] = (typename mp_ty<T>::W)b;
    t.note<T>(v, b);
}

/* ---- 128-bit loads and stores ----
 * G elements of S bytes at p (G*S a multiple of 4 bytes, p aligned to G*S up
 * to 16): moved as uint4 (G*S >= 16), uint2 (8 bytes) or one word (4 bytes),
 * and split into (or assembled from) the elements' bits, little-endian as the
 * GPU stores them. A kernel takes the 128-bit path only when every pointer it
 * moves this way is 16-byte aligned (mp_al16), and otherwise its one-element
 * path, which converts with the same functions: the two give the same bits. */
inline bool mp_al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <int NWD> __device__ __forceinline__ void mp_ldwords(const void *p, uint32_t (&w)[NWD])
{
    if constexpr (NWD % 4 == 0) {
#pragma unroll
        for (int j = 0; j < NWD / 4; j++) {
            uint4 u = ((const uint4 *)p)[j];
            w[4 * j] = u.x, w[4 * j + 1] = u.y, w[4 * j + 2] = u.z, w[4 * j + 3] = u.w;
        }
    } else if constexpr (NWD == 2) {
        uint2 u = *(const uint2 *)p;
        w[0] = u.x, w[1] = u.y;
    } else {
        static_assert(NWD == 1, "loads of 4, 8 or a multiple of 16 bytes");
        w[0] = *(const uint32_t *)p;
    }
}

template <int NWD> __device__ __forceinline__ void mp_stwords(void *p, const uint32_t (&w)[NWD])
{
    if constexpr (NWD % 4 == 0) {
#pragma unroll
        for (int j = 0; j < NWD / 4; j++) ((uint4 *)p)[j] = make_uint4(w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]);
    } else if constexpr (NWD == 2) {
        *(uint2 *)p = make_uint2(w[0], w[1]);
    } else {
        static_assert(NWD == 1, "stores of 4, 8 or a multiple of 16 bytes");
        *(uint32_t *)p = w[0];
    }
}

/* the bits of G elements of S bytes each */
template <int S, int G> __device__ __forceinline__ void mp_ldbits(const void *p, uint32_t (&b)[G])
{
    static_assert((S == 1 || S == 2 || S == 4) && G * S % 4 == 0, "whole words of 1, 2 or 4-byte elements");
    constexpr int PER = 4 / S, NWD = G * S / 4;
    uint32_t w[NWD];
    mp_ldwords<NWD>(p, w);
#pragma unroll
    for (int k = 0; k < G; k++) {
        if constexpr (S == 4) b[k] = w[k];
        else b[k] = (w[k / PER] >> (8 * S * (k % PER))) & ((1u << (8 * S)) - 1u);
    }
}

template <int S, int G> __device__ __forceinline__ void mp_stbits(void *p, const uint32_t (&b)[G])
{
    static_assert((S == 1 || S == 2 || S == 4) && G * S % 4 == 0, "whole words of 1, 2 or 4-byte elements");
    constexpr int PER = 4 / S, NWD = G * S / 4;
    uint32_t w[NWD];
#pragma unroll
    for (int j = 0; j < NWD; j++) w[j] = 0;
#pragma unroll
    for (int k = 0; k < G; k++) {
        if constexpr (S == 4) w[k] = b[k];
        else w[k / PER] |= (b[k] & ((1u << (8 * S)) - 1u)) << (8 * S * (k % PER));
    }
    mp_stwords<NWD>(p, w);
}

/* G elements of type T as f32, and G f32 values rounded into T (tallied) */
template <class T, int G> __device__ __forceinline__ void mp_ldv(const void *p, float (&f)[G])
{
    uint32_t b[G];
    mp_ldbits<mp_ty<T>::S, G>(p, b);
#pragma unroll
    for (int k = 0; k < G; k++) f[k] = mp_ty<T>::tof(b[k]);
}

template <class T, int G> __device__ __forceinline__ void mp_stv(void *p, const float (&f)[G], mp_tally &t)
{
    uint32_t b[G];
#pragma unroll
    for (int k = 0; k < G; k++) {
        b[k] = mp_ty<T>::bits(f[k]);
        t.note<T>(f[k], b[k]);
    }
    mp_stbits<mp_ty<T>::S, G>(p, b);
}

/* the entries each .cu file provides, declared by their types (mp_be_<entry>_fn):
 * the signatures are written once, in kernels/backend.h */
mp_be_cast_fn mp_cuda_cast;
mp_be_fill_fn mp_cuda_fill;
mp_be_arange_fn mp_cuda_arange;
mp_be_rand_uniform_fn mp_cuda_rand_uniform;
mp_be_rand_normal_fn mp_cuda_rand_normal;
mp_be_binary_fn mp_cuda_binary;
mp_be_unary_fn mp_cuda_unary;
mp_be_unary_grad_fn mp_cuda_unary_grad;
mp_be_clamp_fn mp_cuda_clamp;
mp_be_where_fn mp_cuda_where;
mp_be_reduce_fn mp_cuda_reduce;
mp_be_put_along_fn mp_cuda_put_along;
mp_be_scan_fn mp_cuda_scan;   /* cuda_scan.cu */
mp_be_permute_fn mp_cuda_permute;
mp_be_narrow_fn mp_cuda_narrow;
mp_be_narrow_put_fn mp_cuda_narrow_put;
mp_be_narrow_pad_fn mp_cuda_narrow_pad;
mp_be_gather_fn mp_cuda_gather;
mp_be_scatter_add_fn mp_cuda_scatter_add;
mp_be_gemm_fn mp_cuda_gemm;
mp_be_gemm_bias_fn mp_cuda_gemm_bias;   /* cuda_gemm_lt.cu */
mp_be_gemm_bias_gelu_fn mp_cuda_gemm_bias_gelu;   /* cuda_gemm_lt.cu */
mp_be_gemm_wgrad_bias_fn mp_cuda_gemm_wgrad_bias;   /* cuda_gemm_lt.cu */
/* the context's cuBLASLt handle (made on first use), NULL when Lt cannot be
 * had (cuda_gemm_lt.cu) */
struct cublasLtContext *mp_cuda_lt_handle(mp_kctx *cx);
mp_be_fp8_quantize_fn mp_cuda_fp8_quantize_entry;   /* cuda_fp8_quant.cu */
mp_be_fp8_gemm_fn mp_cuda_fp8_gemm_entry;           /* cuda_fp8_gemm.cu */
/* cuda_gemm.cu: a cuBLAS status as the nearest CUDA error; the cuBLAS handle's
 * workspace (made with the handle on first use; NULL and 0 bytes when there is
 * none), which cuBLASLt's calls on the same stream share, and whether the
 * handle lets f32 products use TF32 */
cudaError_t mp_cuda_blas_error(cublasStatus_t s);
void *mp_cuda_gemm_workspace(mp_kctx *cx, size_t *bytes, bool *tf32);
/* the context's cuBLAS handle on cx->stream (f32 sums: no reduced-precision
 * reductions), NULL with the error noted when it cannot be made */
cublasHandle_t mp_cuda_blas_handle(mp_kctx *cx);
mp_be_softmax_fn mp_cuda_softmax;
mp_be_softmax_grad_fn mp_cuda_softmax_grad;
mp_be_cross_entropy_fn mp_cuda_cross_entropy;
mp_be_cross_entropy_grad_fn mp_cuda_cross_entropy_grad;
mp_be_layer_norm_fn mp_cuda_layer_norm;
mp_be_layer_norm_grad_fn mp_cuda_layer_norm_grad;
/* cuda_conv.cu: convolution through cuDNN; cuda_pool.cu, cuda_batch_norm.cu: own kernels */
mp_be_conv2d_fn mp_cuda_conv2d;
mp_be_conv2d_grad_fn mp_cuda_conv2d_grad;
mp_be_max_pool2d_fn mp_cuda_max_pool2d;
mp_be_max_pool2d_grad_fn mp_cuda_max_pool2d_grad;
mp_be_avg_pool2d_fn mp_cuda_avg_pool2d;
mp_be_avg_pool2d_grad_fn mp_cuda_avg_pool2d_grad;
mp_be_batch_norm_fn mp_cuda_batch_norm;
mp_be_batch_norm_grad_fn mp_cuda_batch_norm_grad;

/* cuda_sort.cu: topk and sort */
mp_be_topk_fn mp_cuda_topk;

/* cuda_nccl.cu: collectives across processes over NCCL (loaded when first used) */
mp_be_coll_id_fn mp_cuda_coll_id;
mp_be_coll_join_fn mp_cuda_coll_join;
mp_be_coll_all_reduce_fn mp_cuda_coll_all_reduce;
mp_be_coll_broadcast_fn mp_cuda_coll_broadcast;
mp_be_coll_all_gather_fn mp_cuda_coll_all_gather;
mp_be_coll_leave_fn mp_cuda_coll_leave;
mp_be_coll_fork_fn mp_cuda_coll_fork;
mp_be_coll_merge_fn mp_cuda_coll_merge;

/* cuda_attention.cu: fused attention (no t x t scores in memory) */
mp_be_attention_fn mp_cuda_attention;
mp_be_attention_grad_fn mp_cuda_attention_grad;
/* cuda_flash.cu: its tensor-core kernels for f16/bf16 with head dims 64 and 128 */
bool mp_cuda_flash_takes(mp_dtype dt, int64_t d);
mp_be_attention_fn mp_cuda_flash_attention;
mp_be_attention_grad_fn mp_cuda_flash_attention_grad;
/* cuda_rnn.cu: the fused LSTM and GRU cells */
mp_be_lstm_cell_fn mp_cuda_lstm_cell;
mp_be_lstm_cell_grad_fn mp_cuda_lstm_cell_grad;
mp_be_gru_cell_fn mp_cuda_gru_cell;
mp_be_gru_cell_grad_fn mp_cuda_gru_cell_grad;
/* cuda_check.cu: device-side index checks; the fault they record, taken once
 * (formatted into msg) by the backend's error entry */
mp_be_check_indices_fn mp_cuda_check_indices;
bool mp_cuda_check_init(mp_kctx *cx);
bool mp_cuda_fault_take(mp_kctx *cx, char *msg, size_t cap);
/* cuda_graph.cu: a step captured as a CUDA graph */
mp_be_graph_begin_fn mp_cuda_graph_begin;
mp_be_graph_end_fn mp_cuda_graph_end;
mp_be_graph_replay_fn mp_cuda_graph_replay;
mp_be_graph_free_fn mp_cuda_graph_free;
mp_be_graph_bytes_fn mp_cuda_graph_bytes;
/* cuda_optim.cu: the loss scaler and the optimizers, on state in device memory */
mp_be_scale_loss_fn mp_cuda_scale_loss;
mp_be_unscale_fn mp_cuda_unscale;
mp_be_scale_rule_fn mp_cuda_scale_rule;
mp_be_optim_count_fn mp_cuda_optim_count;
mp_be_optim_step_fn mp_cuda_optim_step;

#endif
