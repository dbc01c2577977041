/*
 * emu_device.h: the CUDA device language for the host compiler, so that the
 * backend's own .cu files (kernels/cuda) compile with g++ into the emulated
 * CUDA device (build/tests/emu_cuda.so). The Makefile force-includes it
 * (-include) before each .cu file, with -DMP_EMU.
 *
 * What it provides, and how:
 * - The qualifiers: __global__, __device__ and __host__ mean nothing on the
 *   host; a __shared__ variable is a static in the section mp_emu_shared, one
 *   instance for the block that runs (blocks run one at a time), filled with
 *   poison bytes before each block (emu_sched.cc) so that a read of shared
 *   memory no thread wrote shows; MP_DEVICE_GLOBAL (a __device__ variable)
 *   puts it in the section mp_emu_device, which the emulator treats as device
 *   memory (it snapshots it when it compares thread orders).
 * - threadIdx, blockIdx, blockDim and gridDim: the running CUDA thread's, read
 *   from the scheduler (each CUDA thread is a fiber: emu_fiber.cc).
 * - Everything that makes threads meet: __syncthreads and the warp operations
 *   (__shfl_*_sync, __ballot_sync, __any/__all_sync, __match_any_sync,
 *   __reduce_*_sync, __activemask, __syncwarp) suspend the calling fiber until
 *   the threads they name have all arrived, and report a deadlock instead of
 *   hanging when they cannot (emu_sched.cc). Each takes the source line it
 *   stands on, which names it in reports.
 * - WMMA (nvcuda::wmma, <mma.h>): m16n16k16 fragments of f16/bf16 with f32
 *   accumulators; load_matrix_sync, store_matrix_sync and mma_sync are warp
 *   collectives that meet as the warp operations do, computed for the whole
 *   warp at once when all 32 lanes have arrived (emu_wmma.cc, below).
 * - Atomics (integers, f32, f64, f16, bf16): one fiber runs at a time, so a
 *   read-modify-write is atomic; floating-point adds are counted, since their
 *   order is the one thing the thread orders may change legitimately.
 * - The intrinsics the kernels use: bit casts, the _rn arithmetic (plain
 *   operations: the emulated build has -ffp-contract=off, so nothing fuses),
 *   __ffs/__popc/__clz, min/max, fences (nothing to order: one fiber at a time).
 * - MP_LAUNCH (kernels/cuda/cuda.h) hands a kernel and its arguments to the
 *   emulator (mp_emu::launch below) instead of <<<...>>>.
 * The real CUDA headers are used for everything they define on the host: the
 * runtime's types and declarations (emu_runtime.cc defines the functions),
 * __half and __nv_bfloat16 with their host conversions, the vector types.
 */
#ifndef MP_EMU_DEVICE_H
#define MP_EMU_DEVICE_H

#undef __host__
#undef __device__
#undef __global__
#undef __shared__
#define __host__
#define __device__
#define __global__
#define __shared__ static __attribute__((section("mp_emu_shared")))
#define MP_DEVICE_GLOBAL __attribute__((section("mp_emu_device")))
#define __restrict__ __restrict
#undef __launch_bounds__
#define __launch_bounds__(...)   /* a register budget for ptxas: nothing to the emulator */

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace mp_emu {

/* the CUDA thread that runs (emu_sched.cc) */
struct thread_state;
extern thread_state *cur;
extern uint3 cur_tid;
extern uint3 block_idx, block_dim, grid_dim;
extern unsigned long long float_atomics;   /* floating-point atomic adds since the launch began */

/* ---- barriers and warp operations (emu_sched.cc) ---- */
enum warp_op {
    W_SHFL, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ANY, W_ALL, W_MATCH_ANY,
    W_REDUCE_ADD, W_REDUCE_MIN, W_REDUCE_MAX, W_REDUCE_AND, W_REDUCE_OR, W_REDUCE_XOR, W_ACTIVEMASK, W_SYNCWARP,
    W_WMMA_LOAD, W_WMMA_STORE, W_WMMA_MMA   /* the WMMA collectives (below): the operand is a wmma_call */
};
void syncthreads(const char *file, int line);
/* val: the operand's bits (size bytes, sign-extended for signed reductions);
 * the result's bits come back */
uint64_t warp(const char *file, int line, warp_op op, unsigned mask, uint64_t val, int size, bool is_signed, int arg,
              int width);
void *dynamic_shared();

template <class T> inline uint64_t bits_of(T v)
{
    static_assert(sizeof(T) <= 8, "warp operations move at most 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> inline T of_bits(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
template <class T> inline T shfl(const char *f, int l, warp_op op, unsigned mask, T v, int arg, int width = 32)
{
    return of_bits<T>(warp(f, l, op, mask, bits_of(v), (int)sizeof(T), false, arg, width));
}
template <class T> inline T reduce(const char *f, int l, warp_op op, unsigned mask, T v)
{
    static_assert(std::is_integral<T>::value && sizeof(T) == 4, "__reduce_*_sync takes int or unsigned");
    uint64_t b = std::is_signed<T>::value ? (uint64_t)(int64_t)v : (uint64_t)(uint32_t)v;
    return (T)warp(f, l, op, mask, b, 4, std::is_signed<T>::value, 0, 32);
}

/* ---- launches (emu_sched.cc) ---- */
struct site {
    const char *file;
    int line;
    const char *text;    /* the kernel and its arguments, as written */
    bool unordered;      /* MP_LAUNCH_UNORDERED: float atomics may reorder its sums */
};
struct launch_desc {
    const site *at;
    const void *kernel;
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
};
/* checks the configuration and the pointer arguments (ptrs[i] is argument
 * argi[i]); false: refused, with the error set */
bool launch_check(const launch_desc &d, const void *const *ptrs, const int *argi, int nptr);
/* queues body (runs one CUDA thread) on d.stream */
void launch_queue(const launch_desc &d, const void *const *ptrs, int nptr, std::shared_ptr<void> keep,
                  void (*body)(void *), void *arg);

template <class Tup, class K> struct launch_box {
    K kernel;
    Tup args;
    static void run(void *p)
    {
        launch_box *b = (launch_box *)p;
        Tup a = b->args;   /* each CUDA thread has its own copy of the parameters */
        std::apply(b->kernel, a);
    }
};

template <class T> inline void note_pointer(const T &v, int i, const void **ptrs, int *argi, int &n)
{
    if constexpr (std::is_pointer<T>::value) ptrs[n] = (const void *)v, argi[n] = i, n++;
}

template <class... P, class... A>
void launch(const site &at, dim3 grid, dim3 block, size_t shared, cudaStream_t stream, void (*k)(P...), A &&...a)
{
    typedef std::tuple<std::decay_t<P>...> Tup;
    typedef launch_box<Tup, void (*)(P...)> Box;
    /* the arguments converted to the parameters' types now, as a launch does */
    auto box = std::make_shared<Box>(Box{k, Tup(static_cast<std::decay_t<P>>(std::forward<A>(a))...)});
    const void *ptrs[sizeof...(P) + 1];
    int argi[sizeof...(P) + 1], n = 0;
    std::apply([&](const auto &...v) {
        int i = 0;
        (note_pointer(v, ++i, ptrs, argi, n), ...);
    }, box->args);
    launch_desc d = {&at, (const void *)k, grid, block, shared, stream};
    if (!launch_check(d, ptrs, argi, n)) return;
    launch_queue(d, ptrs, n, box, &Box::run, box.get());
}

}  // namespace mp_emu

#define MP_LAUNCH(grid, block, shared, stream, ...)                                                   \
    do {                                                                                              \
        static const mp_emu::site mp_emu_at_ = {__FILE__, __LINE__, #__VA_ARGS__, false};              \
        mp_emu::launch(mp_emu_at_, grid, block, shared, stream, __VA_ARGS__);                         \
    } while (0)
#define MP_LAUNCH_UNORDERED(grid, block, shared, stream, ...)                                         \
    do {                                                                                              \
        static const mp_emu::site mp_emu_at_ = {__FILE__, __LINE__, #__VA_ARGS__, true};               \
        mp_emu::launch(mp_emu_at_, grid, block, shared, stream, __VA_ARGS__);                         \
    } while (0)
#define MP_DYNAMIC_SHARED(T, name) T *name = (T *)mp_emu::dynamic_shared()

/* ---- the built-in variables ---- */
#define threadIdx (mp_emu::cur_tid)
#define blockIdx (mp_emu::block_idx)
#define blockDim (mp_emu::block_dim)
#define gridDim (mp_emu::grid_dim)
static constexpr int warpSize = 32;

#define __syncthreads() mp_emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ((void)mp_emu::warp(__FILE__, __LINE__, mp_emu::W_SYNCWARP, mp_emu_full_mask_(__VA_ARGS__), 0, 0, false, 0, 32))
static inline unsigned mp_emu_full_mask_(unsigned m = 0xffffffffu) { return m; }
#define __activemask() ((unsigned)mp_emu::warp(__FILE__, __LINE__, mp_emu::W_ACTIVEMASK, 0, 0, 0, false, 0, 32))
#define __shfl_sync(m, v, ...) mp_emu::shfl(__FILE__, __LINE__, mp_emu::W_SHFL, m, v, __VA_ARGS__)
#define __shfl_up_sync(m, v, ...) mp_emu::shfl(__FILE__, __LINE__, mp_emu::W_SHFL_UP, m, v, __VA_ARGS__)
#define __shfl_down_sync(m, v, ...) mp_emu::shfl(__FILE__, __LINE__, mp_emu::W_SHFL_DOWN, m, v, __VA_ARGS__)
#define __shfl_xor_sync(m, v, ...) mp_emu::shfl(__FILE__, __LINE__, mp_emu::W_SHFL_XOR, m, v, __VA_ARGS__)
#define __ballot_sync(m, p) ((unsigned)mp_emu::warp(__FILE__, __LINE__, mp_emu::W_BALLOT, m, (p) != 0, 4, false, 0, 32))
#define __any_sync(m, p) ((int)mp_emu::warp(__FILE__, __LINE__, mp_emu::W_ANY, m, (p) != 0, 4, false, 0, 32))
#define __all_sync(m, p) ((int)mp_emu::warp(__FILE__, __LINE__, mp_emu::W_ALL, m, (p) != 0, 4, false, 0, 32))
#define __match_any_sync(m, v) \
    ((unsigned)mp_emu::warp(__FILE__, __LINE__, mp_emu::W_MATCH_ANY, m, mp_emu::bits_of(v), (int)sizeof(v), false, 0, 32))
#define __reduce_add_sync(m, v) mp_emu::reduce(__FILE__, __LINE__, mp_emu::W_REDUCE_ADD, m, v)
#define __reduce_min_sync(m, v) mp_emu::reduce(__FILE__, __LINE__, mp_emu::W_REDUCE_MIN, m, v)
#define __reduce_max_sync(m, v) mp_emu::reduce(__FILE__, __LINE__, mp_emu::W_REDUCE_MAX, m, v)
#define __reduce_and_sync(m, v) mp_emu::reduce(__FILE__, __LINE__, mp_emu::W_REDUCE_AND, m, v)
#define __reduce_or_sync(m, v) mp_emu::reduce(__FILE__, __LINE__, mp_emu::W_REDUCE_OR, m, v)
#define __reduce_xor_sync(m, v) mp_emu::reduce(__FILE__, __LINE__, mp_emu::W_REDUCE_XOR, m, v)

/* one fiber runs at a time: fences only keep the compiler from moving accesses */
static inline void __threadfence(void) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_system(void) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

/* ---- intrinsics ---- */
static inline float __uint_as_float(unsigned int u) { return mp_emu::of_bits<float>(u); }
static inline unsigned int __float_as_uint(float f) { return (unsigned int)mp_emu::bits_of(f); }
static inline float __int_as_float(int u) { return mp_emu::of_bits<float>((uint32_t)u); }
static inline int __float_as_int(float f) { return (int)(uint32_t)mp_emu::bits_of(f); }
static inline double __longlong_as_double(long long v) { return mp_emu::of_bits<double>((uint64_t)v); }
static inline long long __double_as_longlong(double v) { return (long long)mp_emu::bits_of(v); }
/* _rn: round to nearest even, never contracted (-ffp-contract=off) */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline int __ffs(int v) { return __builtin_ffs(v); }
static inline int __ffsll(long long v) { return __builtin_ffsll(v); }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
static inline int __clz(int v) { return v ? __builtin_clz((unsigned)v) : 32; }
static inline int __clzll(long long v) { return v ? __builtin_clzll((unsigned long long)v) : 64; }
static inline unsigned __brev(unsigned v)
{
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((v >> i) & 1u) << (31 - i);
    return r;
}

/* CUDA's min and max: overloads for each type, as in its math headers */
#define MP_EMU_MINMAX(T)                                   \
    static inline T min(T a, T b) { return a < b ? a : b; } \
    static inline T max(T a, T b) { return a > b ? a : b; }
MP_EMU_MINMAX(int)
MP_EMU_MINMAX(unsigned int)
MP_EMU_MINMAX(long)
MP_EMU_MINMAX(unsigned long)
MP_EMU_MINMAX(long long)
MP_EMU_MINMAX(unsigned long long)
#undef MP_EMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* ---- atomics: one fiber at a time, so each is a plain read-modify-write ---- */
/* add and sub wrap, as the hardware's do: in the unsigned type (no signed overflow) */
#define MP_EMU_ATOMIC_INT(T)                                                         \
    static inline T atomicAdd(T *p, T v)                                             \
    { T o = *p; *p = (T)((std::make_unsigned_t<T>)o + (std::make_unsigned_t<T>)v); return o; } \
    static inline T atomicSub(T *p, T v)                                             \
    { T o = *p; *p = (T)((std::make_unsigned_t<T>)o - (std::make_unsigned_t<T>)v); return o; } \
    static inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }  \
    static inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }  \
    static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }            \
    static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }         \
    static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }          \
    static inline T atomicXor(T *p, T v) { T o = *p; *p = o ^ v; return o; }         \
    static inline T atomicCAS(T *p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
MP_EMU_ATOMIC_INT(int)
MP_EMU_ATOMIC_INT(unsigned int)
MP_EMU_ATOMIC_INT(unsigned long long)
MP_EMU_ATOMIC_INT(long long)
#undef MP_EMU_ATOMIC_INT
static inline float atomicAdd(float *p, float v)
{
    mp_emu::float_atomics++;
    float o = *p;
    *p = o + v;
    return o;
}
static inline double atomicAdd(double *p, double v)
{
    mp_emu::float_atomics++;
    double o = *p;
    *p = o + v;
    return o;
}
/* f16 and bf16 adds round the exact sum once, as the hardware's do (the f32
 * sum of two such values rounds to the same result: f32 has more than 2p + 2
 * bits) */
static inline __half atomicAdd(__half *p, __half v)
{
    mp_emu::float_atomics++;
    __half o = *p;
    *p = __float2half_rn(__half2float(o) + __half2float(v));
    return o;
}
static inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v)
{
    mp_emu::float_atomics++;
    __nv_bfloat16 o = *p;
    *p = __float2bfloat16_rn(__bfloat162float(o) + __bfloat162float(v));
    return o;
}
static inline float atomicExch(float *p, float v)
{
    float o = *p;
    *p = v;
    return o;
}


/* ---- WMMA (nvcuda::wmma): the tensor-core fragments of the CUDA C++ API ----
 * Only what the backend uses: m16n16k16, matrix_a / matrix_b of __half or
 * __nv_bfloat16 (row or column major), float accumulators. A fragment's layout
 * across the lanes is unspecified by CUDA, so the emulator picks its own: lane
 * l holds elements l*8 .. l*8+7 of the 16 x 16 tile in row-major order (row =
 * index / 16; for matrix_a rows are M, for matrix_b rows are K). It is NOT the
 * hardware's (where num_elements is 16 for an f16 operand, some elements held
 * twice): a kernel may touch frag.x[i] only for what does not depend on the
 * layout (scaling, conversion, a fill), as CUDA allows.
 * load_matrix_sync, store_matrix_sync and mma_sync are warp collectives: each
 * lane stops at the call (a warp operation of emu_sched.cc, named by its line)
 * and the whole warp's call is carried out at once when all 32 lanes stand at
 * the same one (emu_wmma.cc): a lane that exited is a fault, lanes at
 * different calls a deadlock that names them. Every lane must pass the same
 * pointer, ldm and layout; the pointer 32-byte aligned and ldm a multiple of
 * 16 bytes, as the CUDA manual requires. fill_fragment is each lane's own. */
namespace mp_emu {
enum wmma_use { WMMA_A, WMMA_B, WMMA_ACC };
enum wmma_elem { WMMA_F16, WMMA_BF16, WMMA_F32 };
struct wmma_frag {
    int use, elem, col_major;   /* col_major: for matrix_a/b, the fragment's layout */
    void *x;                    /* the lane's num_elements elements */
};
struct wmma_call {
    wmma_frag f[4];             /* load/store: f[0]; mma: d, a, b, c */
    void *mem;                  /* load/store: the tile's first element */
    unsigned ldm;
    int mem_col_major;          /* load/store of an accumulator: the memory layout */
};
/* the lanes' calls of one collective, computed for all; NULL, or why it is a fault */
const char *wmma_run(warp_op op, wmma_call *const *lanes);
template <class T> struct wmma_elem_of;
template <> struct wmma_elem_of<__half> { static const int v = WMMA_F16; };
template <> struct wmma_elem_of<__nv_bfloat16> { static const int v = WMMA_BF16; };
template <> struct wmma_elem_of<float> { static const int v = WMMA_F32; };
}  // namespace mp_emu

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> class fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulated device has the m16n16k16 WMMA shape only");
    static_assert(std::is_same<Use, accumulator>::value ? std::is_same<T, float>::value && std::is_void<Layout>::value
                                                         : (std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value) &&
                                                               !std::is_void<Layout>::value,
                  "the emulated device has f16/bf16 operand fragments with a layout and float accumulators only");
public:
    enum { num_elements = 8 };   /* the emulator's: 256 elements over 32 lanes (the hardware's differ) */
    typedef T element_type;
    typedef T storage_element_type;
    T x[num_elements];
    mp_emu::wmma_frag desc()
    {
        int use = std::is_same<Use, matrix_a>::value ? mp_emu::WMMA_A
                  : std::is_same<Use, matrix_b>::value ? mp_emu::WMMA_B : mp_emu::WMMA_ACC;
        return {use, mp_emu::wmma_elem_of<T>::v, std::is_same<Layout, col_major>::value, (void *)x};
    }
};

template <class Use, class T, class L, class V> inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, const V &v)
{
    for (int i = 0; i < f.num_elements; i++) f.x[i] = (T)v;
}

namespace detail {
inline void collective(mp_emu::warp_op op, mp_emu::wmma_call &c, const char *file, int line)
{
    (void)mp_emu::warp(file, line, op, 0xffffffffu, (uint64_t)(uintptr_t)&c, 8, false, 0, 32);
}
}  // namespace detail

template <class Use, class T, class L>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator's load names the memory layout");
    mp_emu::wmma_call c = {{f.desc()}, (void *)p, ldm, 0};
    detail::collective(mp_emu::W_WMMA_LOAD, c, file, line);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t l,
                             const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    mp_emu::wmma_call c = {{f.desc()}, (void *)p, ldm, l == mem_col_major};
    detail::collective(mp_emu::W_WMMA_LOAD, c, file, line);
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t l,
                              const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    mp_emu::wmma_call c = {{const_cast<fragment<accumulator, 16, 16, 16, float> &>(f).desc()}, (void *)p, ldm,
                           l == mem_col_major};
    detail::collective(mp_emu::W_WMMA_STORE, c, file, line);
}
template <class T, class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                     const fragment<matrix_b, 16, 16, 16, T, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c,
                     bool satf = false, const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    static_assert(std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value, "f16 or bf16 operands");
    if (satf) {   /* saturation is for f16 accumulators, which the emulator does not have */
        fprintf(stderr, "mp-emu: wmma::mma_sync at %s:%d with satf: not emulated\n", file, line);
        abort();
    }
    mp_emu::wmma_call k = {{d.desc(), const_cast<fragment<matrix_a, 16, 16, 16, T, LA> &>(a).desc(),
                            const_cast<fragment<matrix_b, 16, 16, 16, T, LB> &>(b).desc(),
                            const_cast<fragment<accumulator, 16, 16, 16, float> &>(c).desc()},
                           NULL, 0, 0};
    detail::collective(mp_emu::W_WMMA_MMA, k, file, line);
}
}  // namespace wmma
}  // namespace nvcuda

#endif
