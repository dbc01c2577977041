/*
 * test_emu.cu: the emulated CUDA device's own tests (Criterion). Compiled as
 * the backend's kernels are (the host compiler, tests/emu/emu_device.h) and
 * linked with the emulator, so that what it promises is tested on kernels
 * written to break it: barriers some threads never reach, warp operations
 * with missing lanes, races and reads of unwritten shared memory under the
 * comparison of thread orders, launch limits, host pointers handed to a
 * kernel, copies in the wrong direction, work that runs only when the host
 * waits, WMMA fragments (a GEMM through the tensor-core API, a divergent or
 * partial warp's call), stream capture (a graph's launches run its kernels
 * and cuBLAS calls again; what a capture refuses), and the library shims' checks and models (cuBLAS's leading
 * dimensions and split-K, cuBLASLt's bias epilogue, argument checks and
 * split-K and FP8 rules, cuDNN's math types and non-deterministic
 * algorithms, NCCL with one rank).
 */
#include <criterion/criterion.h>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>
#include <string.h>
#include <string>
#include <vector>
#include <mma.h>
#include "tests/emu/emu.h"
extern "C" {
#include "kernels/half.h"
}

extern "C" void mp_emu_clear_fault(void);

/* ---- helpers ---- */

static std::string text(cudaError_t e) { return cudaGetErrorString(e); }

/* the error the next synchronisation reports, then the context cleared for the next test */
static cudaError_t sync_error(std::string *why)
{
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (why) *why = text(e);
    mp_emu_clear_fault();
    return e;
}

static void *dev(size_t n)
{
    void *p = NULL;
    cr_assert_eq(cudaMalloc(&p, n), cudaSuccess);
    return p;
}

static std::vector<int> fetch(const int *d, size_t n)
{
    std::vector<int> h(n);
    cr_assert_eq(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

#define CONTAINS(s, sub) cr_assert(std::string(s).find(sub) != std::string::npos, "'%s' lacks '%s'", (s).c_str(), sub)

/* ---- kernels written to break the emulator's promises ---- */

__global__ void k_skip_barrier(int *out)
{
    if (threadIdx.x == 5) return;   /* thread 5 never reaches the barrier */
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_two_barriers(int *out)
{
    if (threadIdx.x < 16) __syncthreads();
    else __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_half_warp_shfl(int *out)
{
    if (threadIdx.x >= 16) return;   /* lanes 16..31 leave; the mask still names them */
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_barrier_against_warp(int *out)
{
    if (threadIdx.x < 16) __syncthreads();                                /* half the warp waits at the barrier */
    else out[threadIdx.x] = __shfl_sync(0xffffffffu, 1, 0);               /* and the other half for it here */
}

__global__ void k_race(int *out)
{
    __shared__ int last;
    last = threadIdx.x;   /* every thread writes: which one wins depends on the order */
    __syncthreads();
    out[threadIdx.x] = last;
}

__global__ void k_unwritten_shared(float *out)
{
    __shared__ float s[64];
    if (threadIdx.x < 32) s[threadIdx.x] = 1.0f;   /* half of it written */
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

__global__ void k_float_atomics(float *sum, const float *x, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(sum, x[i]);
}

/* every warp operation, each lane's results in out[lane * 12 ...] */
__global__ void k_warp_ops(int *out)
{
    const unsigned lane = threadIdx.x & 31, full = __activemask();
    const int lanes = __popc(full);   /* 32, or the 8 of the last warp */
    int v = (int)lane + 1, sum = v;
    for (int o = lanes / 2; o > 0; o >>= 1) sum += __shfl_down_sync(full, sum, o, lanes);   /* within the warp's lanes */
    int bfly = v;
    for (int o = 1; o < lanes; o <<= 1) bfly += __shfl_xor_sync(full, bfly, o, lanes);
    int *r = out + threadIdx.x * 12;
    r[0] = (int)full;
    r[1] = sum;                                                     /* lane 0: the warp's sum */
    r[2] = bfly;                                                    /* every lane: the warp's sum */
    r[3] = __shfl_sync(full, v, 3);                                 /* lane 3's value */
    r[4] = __shfl_up_sync(full, v, 1);                              /* the lane below's (lane 0: its own) */
    r[5] = (int)__ballot_sync(full, lane % 3 == 0);
    r[6] = (int)__match_any_sync(full, lane % 4);
    r[7] = (int)__reduce_add_sync(full, lane);
    r[8] = __reduce_min_sync(full, 100 - (int)lane);
    r[9] = (int)__reduce_max_sync(full, lane * 7u % 32u);
    r[10] = __any_sync(full, lane == 9);
    r[11] = __all_sync(full, lane < 40);
    __syncwarp(full);
}

__global__ void k_dynamic_shared(int *out, int n)
{
    MP_DYNAMIC_SHARED(int, s);
    for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
        long t = 0;
        for (int i = 0; i < n; i++) t += s[i];
        out[0] = (int)t;
    }
}

__global__ void k_copy(int *dst, const int *src, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

__global__ void k_fill(int *dst, int v, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = v;
}

static void setup(void)
{
    mp_emu::config_mut().racecheck = false;
    mp_emu::config_mut().order = 0;
    mp_emu_clear_fault();
}

TestSuite(emu, .init = setup);

/* ---- barriers and warps ---- */

Test(emu, a_barrier_that_a_thread_never_reaches_is_an_error_naming_the_kernel)
{
    int *out = (int *)dev(256 * sizeof(int));
    MP_LAUNCH(2, 64, 0, NULL, k_skip_barrier, out);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);   /* a launch error would come now; this one comes as it runs */
    std::string why;
    cr_assert_eq(sync_error(&why), cudaErrorLaunchFailure);
    CONTAINS(why, "k_skip_barrier");
    CONTAINS(why, "__syncthreads at");
    CONTAINS(why, "not reached by 1 threads that exited (thread 5");
    cr_assert_eq(cudaMemset(out, 0, 4), cudaSuccess, "the context is usable again");
    cudaFree(out);
}

Test(emu, threads_at_different_barriers_are_an_error)
{
    int *out = (int *)dev(64 * sizeof(int));
    MP_LAUNCH(1, 64, 0, NULL, k_two_barriers, out);
    std::string why;
    cr_assert_eq(sync_error(&why), cudaErrorLaunchFailure);
    CONTAINS(why, "threads wait at different barriers");
    CONTAINS(why, "16 at __syncthreads");
    CONTAINS(why, "48 at __syncthreads");
    cudaFree(out);
}

Test(emu, a_shuffle_that_reads_a_lane_that_left_is_an_error)
{
    int *out = (int *)dev(32 * sizeof(int));
    MP_LAUNCH(1, 32, 0, NULL, k_half_warp_shfl, out);
    std::string why;
    cr_assert_eq(sync_error(&why), cudaErrorLaunchFailure);
    CONTAINS(why, "__shfl_down_sync at");
    CONTAINS(why, "lane 15 reads lane 16, which is not among the lanes taking part");
    cudaFree(out);
}

/* lanes that exited, or do not exist, take no part; the rest still meet */
__global__ void k_ballot_after_exits(int *out)
{
    if (threadIdx.x % 3 == 0) return;
    out[threadIdx.x] = (int)__ballot_sync(0xffffffffu, 1);
    __syncwarp();
}

/* __shfl_xor_sync with width 16: lane 20 xor 16 reads lane 4, in the group before */
__global__ void k_xor_width(int *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 16, 16);
}

Test(emu, exited_and_absent_lanes_take_no_part_and_xor_may_read_an_earlier_group)
{
    int *out = (int *)dev(40 * sizeof(int));
    MP_LAUNCH(1, 40, 0, NULL, k_ballot_after_exits, out);
    std::vector<int> r = fetch(out, 40);
    unsigned w0 = 0, w1 = 0;
    for (int t = 0; t < 40; t++)
        if (t % 3) (t < 32 ? w0 : w1) |= 1u << (t % 32);
    for (int t = 0; t < 40; t++)
        if (t % 3) cr_assert_eq((unsigned)r[t], t < 32 ? w0 : w1, "thread %d", t);
    MP_LAUNCH(1, 32, 0, NULL, k_xor_width, out);
    r = fetch(out, 32);
    for (int t = 0; t < 32; t++) cr_assert_eq(r[t], t >= 16 ? t ^ 16 : t, "thread %d", t);
    cudaFree(out);
}

Test(emu, a_deadlock_is_reported_not_a_hang)
{
    int *out = (int *)dev(32 * sizeof(int));
    MP_LAUNCH(1, 32, 0, NULL, k_barrier_against_warp, out);
    std::string why;
    cr_assert_eq(sync_error(&why), cudaErrorLaunchTimeout);
    CONTAINS(why, "k_barrier_against_warp");
    CONTAINS(why, "deadlock");
    cudaFree(out);
}

Test(emu, warp_operations_give_what_the_cuda_manual_says)
{
    for (int order = 0; order < 3; order++) {
        mp_emu::config_mut().order = order;
        int *out = (int *)dev(40 * 12 * sizeof(int));
        MP_LAUNCH(1, 40, 0, NULL, k_warp_ops, out);   /* warp 1 has 8 lanes */
        std::vector<int> r = fetch(out, 40 * 12);
        for (int t = 0; t < 40; t++) {
            const int lane = t % 32, lanes = t < 32 ? 32 : 8;
            const unsigned full = lanes == 32 ? 0xffffffffu : 0xffu;
            const int *x = &r[(size_t)t * 12];
            int total = lanes * (lanes + 1) / 2, ballot = 0, match = 0, mx = 0;
            for (int j = 0; j < lanes; j++) {
                ballot |= (j % 3 == 0) << j, match |= (j % 4 == lane % 4) << j;
                mx = j * 7 % 32 > mx ? j * 7 % 32 : mx;
            }
            cr_assert_eq((unsigned)x[0], full, "activemask, thread %d", t);
            if (lane == 0) cr_assert_eq(x[1], total, "shfl_down sum, thread %d", t);
            cr_assert_eq(x[2], total, "butterfly sum, thread %d", t);
            cr_assert_eq(x[3], 4, "shfl from lane 3, thread %d", t);
            cr_assert_eq(x[4], lane ? lane : 1, "shfl_up, thread %d", t);
            cr_assert_eq(x[5], ballot, "ballot, thread %d", t);
            cr_assert_eq(x[6], match, "match_any, thread %d", t);
            cr_assert_eq(x[7], lanes * (lanes - 1) / 2, "reduce_add, thread %d", t);
            cr_assert_eq(x[8], 100 - (lanes - 1), "reduce_min, thread %d", t);
            cr_assert_eq(x[9], mx, "reduce_max, thread %d", t);
            cr_assert_eq(x[10], lanes > 9, "any, thread %d", t);
            cr_assert_eq(x[11], 1, "all, thread %d", t);
        }
        cudaFree(out);
    }
}

/* ---- WMMA ---- */

/* d{m, n} = scale * (c0 + a b): a{m, k} row-major, b given as b^T{n, k} (col-major
 * as matrix_b), c0{m, n} column-major (an accumulator loaded with ldm m); a warp
 * per 16 x 16 tile of d, the scale through the fragment's elements */
template <class T>
__global__ void k_wmma_gemm(float *d, const T *a, const T *bt, const float *c0, int m, int n, int k, float scale)
{
    using namespace nvcuda;
    const int w = (int)threadIdx.x / 32, ti = w / (n / 16), tj = w % (n / 16);
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, c0 + tj * 16 * m + ti * 16, (unsigned)m, wmma::mem_col_major);
    for (int p = 0; p < k; p += 16) {
        wmma::load_matrix_sync(fa, a + ti * 16 * k + p, (unsigned)k);
        wmma::load_matrix_sync(fb, bt + tj * 16 * k + p, (unsigned)k);
        wmma::mma_sync(acc, fa, fb, acc);
    }
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= scale;
    wmma::store_matrix_sync(d + ti * 16 * n + tj * 16, acc, (unsigned)n, wmma::mem_row_major);
}

/* the product against a double one: exactly (values on a 1/8 grid: every f32 sum
 * exact) or within the f32 bound (k + 1) 2^-24 sum |terms| (random values) */
template <class T> static void wmma_gemm_case(bool grid)
{
    const int m = 32, n = 48, k = 64;
    std::vector<uint16_t> a(m * k), bt(n * k);
    std::vector<float> c0(m * n);
    uint64_t s = 0x1234567u + (uint64_t)grid;
    auto draw = [&]() {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        double u = (double)(s >> 11) / 9007199254740992.0 * 4 - 2;
        return grid ? floor(u * 8) / 8 : u;
    };
    const bool f16 = std::is_same<T, __half>::value;
    auto to16 = [&](double v) { return f16 ? mp_f32_to_f16((float)v) : mp_f32_to_bf16((float)v); };
    auto of16 = [&](uint16_t v) { return (double)(f16 ? mp_f16_to_f32(v) : mp_bf16_to_f32(v)); };
    for (auto &v : a) v = to16(draw());
    for (auto &v : bt) v = to16(draw());
    for (auto &v : c0) v = (float)draw();
    T *da = (T *)dev(a.size() * 2), *db = (T *)dev(bt.size() * 2);
    float *dc = (float *)dev(c0.size() * 4), *dd = (float *)dev(c0.size() * 4);
    cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(db, bt.data(), bt.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c0.data(), c0.size() * 4, cudaMemcpyHostToDevice);
    MP_LAUNCH(1, 32 * (m / 16) * (n / 16), 0, NULL, k_wmma_gemm<T>, dd, da, db, dc, m, n, k, 0.5f);
    std::vector<float> d(m * n);
    cr_assert_eq(cudaMemcpy(d.data(), dd, d.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double want = c0[(size_t)j * m + i], mag = fabs(want);
            for (int p = 0; p < k; p++) {
                double t = of16(a[(size_t)i * k + p]) * of16(bt[(size_t)j * k + p]);
                want += t, mag += fabs(t);
            }
            double got = d[(size_t)i * n + j], tol = grid ? 0 : 0.5 * (k + 1) * mag * 0x1p-24;
            cr_assert(fabs(got - 0.5 * want) <= tol, "%s d[%d][%d] = %.9g, want %.9g (within %.3g)",
                      grid ? "grid" : "random", i, j, got, 0.5 * want, tol);
        }
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

Test(emu, wmma_fragments_multiply_as_a_gemm_with_f32_sums)
{
    mp_emu::config_mut().racecheck = true;
    for (int grid = 1; grid >= 0; grid--) {
        wmma_gemm_case<__half>(grid);
        wmma_gemm_case<__nv_bfloat16>(grid);
    }
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
}

/* half of the warp at one mma_sync, half at another: they never meet */
__global__ void k_wmma_divergent(float *out, const __half *a)
{
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(fa, 1.0f);
    wmma::fill_fragment(fb, 1.0f);
    wmma::fill_fragment(acc, 0.0f);
    if (threadIdx.x < 16) wmma::mma_sync(acc, fa, fb, acc);
    else wmma::mma_sync(acc, fa, fb, acc);
    wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

/* lane 20 leaves before the load; or the leading dimension is not 16 bytes' worth */
__global__ void k_wmma_bad_load(const __half *a, int exit_lane, unsigned ldm)
{
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    if ((int)threadIdx.x == exit_lane) return;
    wmma::load_matrix_sync(fa, a, ldm);
}

Test(emu, a_wmma_call_that_the_warp_does_not_make_together_is_an_error)
{
    float *out = (float *)dev(256 * sizeof(float));
    __half *a = (__half *)dev(512 * sizeof(__half));
    MP_LAUNCH(1, 32, 0, NULL, k_wmma_divergent, out, a);
    std::string why;
    cr_assert_eq(sync_error(&why), cudaErrorLaunchTimeout);
    CONTAINS(why, "deadlock");
    CONTAINS(why, "16 at wmma::mma_sync");
    MP_LAUNCH(1, 32, 0, NULL, k_wmma_bad_load, a, 20, 16u);
    cr_assert_eq(sync_error(&why), cudaErrorLaunchFailure);
    CONTAINS(why, "wmma::load_matrix_sync at");
    CONTAINS(why, "lane 20 has exited: every lane of the warp must call it");
    MP_LAUNCH(1, 32, 0, NULL, k_wmma_bad_load, a, -1, 12u);
    cr_assert_eq(sync_error(&why), cudaErrorLaunchFailure);
    CONTAINS(why, "ldm 12 is not a multiple of 8 elements");
    MP_LAUNCH(1, 48, 0, NULL, k_wmma_bad_load, a, -1, 16u);
    cr_assert_eq(sync_error(&why), cudaErrorLaunchFailure);
    CONTAINS(why, "does not exist (the block's last warp is partial)");
    cudaFree(out), cudaFree(a);
}

/* ---- thread orders ---- */

Test(emu, a_race_on_shared_memory_is_found_by_comparing_thread_orders)
{
    mp_emu::config_mut().racecheck = true;
    int *out = (int *)dev(64 * sizeof(int));
    MP_LAUNCH(1, 64, 0, NULL, k_race, out);
    cudaDeviceSynchronize();
    cudaError_t e = cudaGetLastError();
    std::string why = text(e);
    cr_assert_eq(e, cudaErrorLaunchFailure);
    CONTAINS(why, "k_race gives different results with threads run forward and in reverse");
    CONTAINS(why, "pointer argument 1");
    cudaFree(out);
}

Test(emu, a_read_of_unwritten_shared_memory_is_found_too)
{
    mp_emu::config_mut().racecheck = true;
    float *out = (float *)dev(64 * sizeof(float));
    MP_LAUNCH(1, 64, 0, NULL, k_unwritten_shared, out);
    cudaDeviceSynchronize();
    std::string why = text(cudaGetLastError());
    CONTAINS(why, "k_unwritten_shared gives different results");
    CONTAINS(why, "a read of shared memory that no thread wrote");
    /* the first run's poison: 0xFF bytes, a NaN */
    float h[64];
    mp_emu::config_mut().racecheck = false;
    MP_LAUNCH(1, 64, 0, NULL, k_unwritten_shared, out);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    cr_assert(h[0] == 1.0f && h[63] != h[63]);
    cudaFree(out);
}

Test(emu, float_atomics_may_differ_between_orders_only_where_the_launch_says_so)
{
    mp_emu::config_mut().racecheck = true;
    const int n = 1000;
    std::vector<float> x(n);
    for (int i = 0; i < n; i++) x[i] = (i % 2 ? 1.0f : -1.0f) * (1.0f + (float)i * 1e-3f) * (i % 7 ? 1e-4f : 1e4f);
    float *dx = (float *)dev(n * sizeof(float)), *sum = (float *)dev(sizeof(float));
    cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(sum, 0, sizeof(float));
    MP_LAUNCH(1, 256, 0, NULL, k_float_atomics, sum, dx, n);
    cudaDeviceSynchronize();
    std::string why = text(cudaGetLastError());
    CONTAINS(why, "k_float_atomics gives different results");
    long before = mp_emu::counters().order_diffs_allowed;
    cudaMemset(sum, 0, sizeof(float));
    MP_LAUNCH_UNORDERED(1, 256, 0, NULL, k_float_atomics, sum, dx, n);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    cr_assert_eq(mp_emu::counters().order_diffs_allowed, before + 1);
    cudaFree(dx), cudaFree(sum);
}

/* ---- launches ---- */

Test(emu, the_launch_limits_are_errors)
{
    int *out = (int *)dev(4096 * sizeof(int));
    MP_LAUNCH(1, 1025, 0, NULL, k_fill, out, 1, 4);
    cudaError_t e = cudaGetLastError();
    cr_assert_eq(e, cudaErrorInvalidConfiguration);
    CONTAINS(text(e), "a block of (1025,1,1) threads");
    MP_LAUNCH(dim3(1, 65536), 32, 0, NULL, k_fill, out, 1, 4);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
    MP_LAUNCH(1, dim3(8, 8, 65), 0, NULL, k_fill, out, 1, 4);
    cr_assert_eq(cudaGetLastError(), cudaErrorInvalidConfiguration);
    /* 48 KiB of shared memory unless the kernel opted in */
    MP_LAUNCH(1, 128, 64 << 10, NULL, k_dynamic_shared, out, 16 << 10);
    e = cudaGetLastError();
    cr_assert_eq(e, cudaErrorInvalidValue);
    CONTAINS(text(e), "without cudaFuncAttributeMaxDynamicSharedMemorySize");
    cr_assert_eq(cudaFuncSetAttribute((const void *)k_dynamic_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10),
                 cudaSuccess);
    MP_LAUNCH(1, 128, 64 << 10, NULL, k_dynamic_shared, out, 16 << 10);
    cr_assert_eq(cudaGetLastError(), cudaSuccess);
    cr_assert_eq(fetch(out, 1)[0], (16 << 10) * ((16 << 10) - 1) / 2);
    MP_LAUNCH(1, 128, 80 << 10, NULL, k_dynamic_shared, out, 20 << 10);   /* more than the opt-in set */
    e = cudaGetLastError();
    cr_assert_eq(e, cudaErrorInvalidValue);
    CONTAINS(text(e), "over the 65536 that cudaFuncAttributeMaxDynamicSharedMemorySize set");
    cudaFree(out);
}

Test(emu, a_kernel_handed_a_host_pointer_is_an_illegal_address_naming_the_argument)
{
    int host[16];
    int *out = (int *)dev(16 * sizeof(int));
    MP_LAUNCH(1, 16, 0, NULL, k_copy, out, host, 16);
    cudaError_t e = cudaGetLastError();
    cr_assert_eq(e, cudaErrorIllegalAddress);
    CONTAINS(text(e), "kernel tests/emu/test_emu.cu");
    CONTAINS(text(e), "argument 2 is");
    CONTAINS(text(e), "host memory");
    cr_assert_eq(cudaMemset(out, 0, 4), cudaErrorIllegalAddress, "sticky: every later call fails");
    mp_emu_clear_fault();
    cudaFree(out);
}

/* ---- memory and copies ---- */

Test(emu, copies_check_their_direction_and_bounds)
{
    int host[8] = {0};
    int *d = (int *)dev(8 * sizeof(int));
    cudaError_t e = cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyDeviceToHost, NULL);
    cr_assert_eq(e, cudaErrorInvalidValue);
    CONTAINS(text(e), "cudaMemcpyAsync with cudaMemcpyDeviceToHost");
    e = cudaMemcpyAsync(d, host, 2 * sizeof host, cudaMemcpyHostToDevice, NULL);
    cr_assert_eq(e, cudaErrorInvalidValue);
    CONTAINS(text(e), "run past the end of its allocation");
    cr_assert_eq(cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyHostToDevice, NULL), cudaSuccess);
    cr_assert_eq(cudaFree(host), cudaErrorInvalidValue);
    cudaGetLastError();
    cudaFree(d);
}

Test(emu, new_device_memory_holds_garbage_not_zeros)
{
    int *d = (int *)dev(64);
    cr_assert_eq(fetch(d, 16)[3], -1);
    cudaFree(d);
}

/* ---- streams ---- */

Test(emu, work_runs_when_the_host_waits_so_a_pinned_buffer_reused_too_soon_shows)
{
    int *pin = NULL, *d = (int *)dev(sizeof(int));
    cudaHostAlloc((void **)&pin, sizeof(int), cudaHostAllocDefault);
    cudaStream_t s;
    cudaStreamCreate(&s);
    *pin = 1;
    cudaMemcpyAsync(d, pin, sizeof(int), cudaMemcpyHostToDevice, s);
    *pin = 2;   /* overwritten before the copy ran: a GPU might have read either */
    cudaStreamSynchronize(s);
    cr_assert_eq(fetch(d, 1)[0], 2);
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    *pin = 3;
    cudaMemcpyAsync(d, pin, sizeof(int), cudaMemcpyHostToDevice, s);
    cudaEventRecord(ev, s);
    cudaEventSynchronize(ev);   /* the copy has read the buffer */
    *pin = 4;
    cr_assert_eq(fetch(d, 1)[0], 3);
    cudaEventDestroy(ev), cudaStreamDestroy(s), cudaFreeHost(pin), cudaFree(d);
}

Test(emu, a_second_stream_that_misses_its_event_wait_reads_stale_data)
{
    const int n = 64;
    int *a = (int *)dev(n * sizeof(int)), *b = (int *)dev(n * sizeof(int));
    cudaStream_t main_s, side;
    cudaStreamCreate(&main_s), cudaStreamCreate(&side);
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    for (int wait = 0; wait <= 1; wait++) {
        MP_LAUNCH(1, 64, 0, main_s, k_fill, a, 0, n);
        cudaDeviceSynchronize();
        MP_LAUNCH(1, 64, 0, main_s, k_fill, a, 7, n);   /* the producer */
        cudaEventRecord(ev, main_s);
        if (wait) cudaStreamWaitEvent(side, ev, 0);
        MP_LAUNCH(1, 64, 0, side, k_copy, b, a, n);      /* the consumer */
        cudaDeviceSynchronize();
        cr_assert_eq(fetch(b, 1)[0], wait ? 7 : 0, "with%s the wait", wait ? "" : "out");
    }
    cudaEventDestroy(ev), cudaStreamDestroy(side), cudaStreamDestroy(main_s), cudaFree(a), cudaFree(b);
}

/* ---- stream capture and graphs ---- */

extern "C" void mp_emu_stats(mp_emu::stats *out);

Test(emu, a_capture_records_kernels_and_cublas_calls_and_each_graph_launch_runs_them_again)
{
    const int n = 64;
    int *a = (int *)dev(n * sizeof(int)), *b = (int *)dev(n * sizeof(int));
    float *x = (float *)dev(4), *y = (float *)dev(4), *z = (float *)dev(4);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    cublasSetStream(h, s);
    MP_LAUNCH(1, 64, 0, s, k_fill, b, 1, n);
    cudaStreamSynchronize(s);
    mp_emu::stats st0;
    mp_emu_stats(&st0);
    cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaStreamCaptureStatus cs;
    cr_assert_eq(cudaStreamIsCapturing(s, &cs), cudaSuccess);
    cr_assert_eq(cs, cudaStreamCaptureStatusActive);
    MP_LAUNCH(1, 64, 0, s, k_copy, b, a, n);   /* b = a, at each launch of the graph */
    float one = 1, zero = 0;
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, x, CUDA_R_32F, 1, y, CUDA_R_32F, 1, &zero, z,
                              CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), CUBLAS_STATUS_SUCCESS);
    cudaGraph_t g;
    cr_assert_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
    size_t nodes = 0;
    cr_assert_eq(cudaGraphGetNodes(g, NULL, &nodes), cudaSuccess);
    cr_assert_eq(nodes, 2);
    cudaGraphExec_t ge;
    cr_assert_eq(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    cudaGraphDestroy(g);   /* the executable copy stands alone */
    cudaDeviceSynchronize();
    mp_emu::stats st1;
    mp_emu_stats(&st1);
    cr_assert_eq(st1.kernel_runs, st0.kernel_runs, "the capture ran nothing");
    cr_assert_eq(fetch(b, 1)[0], 1);
    for (int v = 7; v <= 9; v += 2) {
        MP_LAUNCH(1, 64, 0, s, k_fill, a, v, n);
        float fx = (float)v, fy = 2;
        cudaMemcpy(x, &fx, 4, cudaMemcpyHostToDevice), cudaMemcpy(y, &fy, 4, cudaMemcpyHostToDevice);
        cr_assert_eq(cudaGraphLaunch(ge, s), cudaSuccess);
        cudaStreamSynchronize(s);
        cr_assert_eq(fetch(b, n)[n - 1], v, "the kernel node reads a at the launch");
        float fz = 0;
        cudaMemcpy(&fz, z, 4, cudaMemcpyDeviceToHost);
        cr_assert_eq(fz, 2.0f * v, "the cuBLAS node computes at the launch");
    }
    cr_assert_eq(cudaGraphExecDestroy(ge), cudaSuccess);
    mp_emu_stats(&st1);
    cr_assert_eq(st1.live_graphs, st0.live_graphs);
    cublasDestroy(h), cudaStreamDestroy(s), cudaFree(a), cudaFree(b), cudaFree(x), cudaFree(y), cudaFree(z);
}

Test(emu, a_capture_refuses_what_a_gpu_refuses_and_is_then_invalidated)
{
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int *a = (int *)dev(64 * sizeof(int));
    /* cudaMalloc in a thread-local capture: refused, the capture gives no graph */
    cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    MP_LAUNCH(1, 64, 0, s, k_fill, a, 3, 64);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 256);
    cr_assert_eq(e, cudaErrorStreamCaptureUnsupported);
    CONTAINS(text(e), "cudaMalloc");
    cudaGetLastError();
    cudaStreamCaptureStatus cs;
    cudaStreamIsCapturing(s, &cs);
    cr_assert_eq(cs, cudaStreamCaptureStatusInvalidated);
    cudaGraph_t g = (cudaGraph_t)1;
    cr_assert_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cr_assert_null(g);
    cudaGetLastError();
    /* with the thread's mode relaxed it is allowed, and the capture goes on */
    cr_assert_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    cr_assert_eq(cudaMalloc(&p, 256), cudaSuccess);
    cudaThreadExchangeStreamCaptureMode(&m);
    cr_assert_eq(m, cudaStreamCaptureModeRelaxed);
    /* a wait for the capturing stream, in any mode, and a pageable copy on it */
    int host = 0;
    cr_assert_eq(cudaMemcpyAsync(&host, a, 4, cudaMemcpyDeviceToHost, s), cudaErrorStreamCaptureUnsupported);
    cr_assert_eq(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    cr_assert_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
    /* nothing of it ran, and the device goes on */
    MP_LAUNCH(1, 64, 0, s, k_fill, a, 5, 64);
    cr_assert_eq(cudaStreamSynchronize(s), cudaSuccess);
    cr_assert_eq(fetch(a, 1)[0], 5);
    cudaFree(p), cudaFree(a), cudaStreamDestroy(s);
}

/* ---- cuBLAS ---- */

/* column-major C {m, n} = op(A) op(B), naively, in double */
static std::vector<float> naive(bool ta, bool tb, int m, int n, int k, const std::vector<float> &A, int lda,
                                const std::vector<float> &B, int ldb)
{
    std::vector<float> C((size_t)m * n);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int l = 0; l < k; l++) s += (double)A[ta ? l + i * lda : i + l * lda] * B[tb ? j + l * ldb : l + j * ldb];
            C[(size_t)i + (size_t)j * m] = (float)s;
        }
    return C;
}

Test(emu, cublas_reads_column_major_operands_through_their_leading_dimensions)
{
    cublasHandle_t h;
    cr_assert_eq(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    const int m = 5, n = 3, k = 4;
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t >> 1;
        int lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1;
        std::vector<float> A((size_t)lda * (ta ? m : k)), B((size_t)ldb * (tb ? k : n));
        for (size_t i = 0; i < A.size(); i++) A[i] = (float)((i * 7) % 11) - 5;
        for (size_t i = 0; i < B.size(); i++) B[i] = (float)((i * 5) % 13) - 6;
        float *dA = (float *)dev(A.size() * 4), *dB = (float *)dev(B.size() * 4), *dC = (float *)dev((size_t)m * n * 4);
        cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
        float one = 1, zero = 0;
        cr_assert_eq(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, dA,
                                  CUDA_R_32F, lda, dB, CUDA_R_32F, ldb, &zero, dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
        std::vector<float> C((size_t)m * n), want = naive(ta, tb, m, n, k, A, lda, B, ldb);
        cudaMemcpy(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < C.size(); i++) cr_assert_eq(C[i], want[i], "ta %d tb %d element %zu", ta, tb, i);
        cudaFree(dA), cudaFree(dB), cudaFree(dC);
    }
    cublasDestroy(h);
}

Test(emu, cublas_refuses_a_leading_dimension_below_the_rows_naming_it)
{
    cublasHandle_t h;
    cublasCreate(&h);
    float *d = (float *)dev(64 * 4), one = 1, zero = 0;
    cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_32F, 3, d, CUDA_R_32F, 4,
                                    &zero, d + 32, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cr_assert_eq(s, CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "lda 3 < max(1, m) = 4");
    s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_32F, 4, 16, d, CUDA_R_32F, 4,
                                   16, &zero, d + 32, CUDA_R_32F, 4, 0, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cr_assert_eq(s, CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "overlap");
    cudaFree(d);
    cublasDestroy(h);
}

/* f16 C over k = 4096: within an ulp of f32 accumulation with reductions in
 * the compute type; several ulps apart when the handle allows 16-bit ones */
static int worst_ulps(cublasHandle_t h)
{
    const int m = 8, n = 8, k = 4096;
    std::vector<uint16_t> A((size_t)m * k), B((size_t)k * n);
    std::vector<float> Af(A.size()), Bf(B.size());
    for (size_t i = 0; i < A.size(); i++) A[i] = mp_f32_to_f16((float)((i * 37) % 201) / 100.0f - 1.0f), Af[i] = mp_f16_to_f32(A[i]);
    for (size_t i = 0; i < B.size(); i++) B[i] = mp_f32_to_f16((float)((i * 53) % 199) / 100.0f - 1.0f), Bf[i] = mp_f16_to_f32(B[i]);
    void *dA = dev(A.size() * 2), *dB = dev(B.size() * 2), *dC = dev((size_t)m * n * 2);
    cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
    float one = 1, zero = 0;
    cr_assert_eq(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16F, m, dB, CUDA_R_16F, k, &zero, dC,
                              CUDA_R_16F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_SUCCESS);
    std::vector<uint16_t> C((size_t)m * n);
    cudaMemcpy(C.data(), dC, C.size() * 2, cudaMemcpyDeviceToHost);
    std::vector<float> want = naive(false, false, m, n, k, Af, m, Bf, k);
    auto ordered = [](uint16_t b) { return b & 0x8000 ? -(int)(b & 0x7fff) : (int)b; };
    int worst = 0;
    for (size_t i = 0; i < C.size(); i++) {
        int d = ordered(mp_f32_to_f16(want[i])) - ordered(C[i]);
        if (d < 0) d = -d;
        if (d > worst) worst = d;
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    return worst;
}

Test(emu, cublas_models_split_k_in_16_bits_unless_the_handle_disallows_it)
{
    cublasHandle_t h;
    cublasCreate(&h);
    int loose = worst_ulps(h);
    cublasSetMathMode(h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    int strict = worst_ulps(h);
    cr_assert(loose >= 2, "reduced-precision reduction: %d ulps at worst", loose);
    cr_assert(strict <= 1, "f32 reduction: %d ulps at worst", strict);
    cublasDestroy(h);
}

/* ---- cuBLASLt ---- */

/* D {m, n} = op(A) op(B) + bias {m} (column-major, f16) through cuBLASLt, A
 * transposed ({k, m} stored) as cuda_gemm_lt.cu's weights; the preference's
 * reduction mask and workspace as given; the worst distance in ulps from
 * the f32 sums plus the bias rounded once */
struct lt_case {
    int m, n, k;
    cublasLtHandle_t h;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    std::vector<uint16_t> A, B, bias;
    void *dA, *dB, *dD, *dbias, *ws;
    lt_case(int m_, int n_, int k_) : m(m_), n(n_), k(k_)
    {
        cr_assert_eq(cublasLtCreate(&h), CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
        int32_t t = CUBLAS_OP_T;
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        cr_assert_eq(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), CUBLAS_STATUS_SUCCESS);
        cr_assert_eq(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                     CUBLAS_STATUS_SUCCESS);
        cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, k, m, k), cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, k, n, k);
        cublasLtMatrixLayoutCreate(&ld, CUDA_R_16F, m, n, m);
        A.resize((size_t)k * m), B.resize((size_t)k * n), bias.resize(m);
        for (size_t i = 0; i < A.size(); i++) A[i] = mp_f32_to_f16((float)((i * 37) % 201) / 100.0f - 1.0f);
        for (size_t i = 0; i < B.size(); i++) B[i] = mp_f32_to_f16((float)((i * 53) % 199) / 100.0f - 1.0f);
        for (int i = 0; i < m; i++) bias[i] = mp_f32_to_f16((float)(i % 7) - 3.0f);
        dA = dev(A.size() * 2), dB = dev(B.size() * 2), dD = dev((size_t)m * n * 2), dbias = dev((size_t)m * 2);
        ws = dev(1 << 22);
        cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dbias, bias.data(), bias.size() * 2, cudaMemcpyHostToDevice);
        set_bias(dbias);
    }
    void set_bias(const void *p)
    {
        cr_assert_eq(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p, sizeof p),
                     CUBLAS_STATUS_SUCCESS);
    }
    cublasStatus_t heuristic(uint32_t mask, uint64_t ws_bytes, cublasLtMatmulAlgo_t *algo, size_t *need)
    {
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulPreferenceCreate(&pref);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask);
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes);
        cublasLtMatmulHeuristicResult_t r;
        int found = 0;
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &r, &found);
        cublasLtMatmulPreferenceDestroy(pref);
        if (s == CUBLAS_STATUS_SUCCESS) {
            cr_assert_eq(found, 1);
            *algo = r.algo, *need = r.workspaceSize;
        }
        return s;
    }
    cublasStatus_t run(const cublasLtMatmulAlgo_t *algo, const void *a, void *d, size_t ws_bytes)
    {
        float one = 1, zero = 0;
        return cublasLtMatmul(h, op, &one, a, la, dB, lb, &zero, d, ld, d, ld, algo, ws, ws_bytes, 0);
    }
    int worst_ulps()
    {
        std::vector<uint16_t> D((size_t)m * n);
        cudaMemcpy(D.data(), dD, D.size() * 2, cudaMemcpyDeviceToHost);
        auto ordered = [](uint16_t b) { return b & 0x8000 ? -(int)(b & 0x7fff) : (int)b; };
        int worst = 0;
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double s = mp_f16_to_f32(bias[i]);
                for (int l = 0; l < k; l++)
                    s += (double)mp_f16_to_f32(A[(size_t)l + (size_t)i * k]) * mp_f16_to_f32(B[(size_t)l + (size_t)j * k]);
                int d = ordered(mp_f32_to_f16((float)s)) - ordered(D[(size_t)i + (size_t)j * m]);
                worst = d < 0 ? (-d > worst ? -d : worst) : (d > worst ? d : worst);
            }
        return worst;
    }
    ~lt_case()
    {
        cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dbias), cudaFree(ws);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op), cublasLtDestroy(h);
    }
};

Test(emu, cublaslt_adds_the_bias_before_the_one_rounding_and_models_split_k_as_the_preference_allows)
{
    lt_case c(8, 8, 4096);
    cublasLtMatmulAlgo_t algo;
    size_t need;
    /* every reduction scheme allowed (the default) with room for partials: 16-bit ones */
    cr_assert_eq(c.heuristic(CUBLASLT_REDUCTION_SCHEME_MASK, 1 << 22, &algo, &need), CUBLAS_STATUS_SUCCESS);
    cr_assert(need > 0);
    cr_assert_eq(c.run(&algo, c.dA, c.dD, 1 << 22), CUBLAS_STATUS_SUCCESS);
    int loose = c.worst_ulps();
    cr_assert(loose >= 2, "16-bit reduction: %d ulps at worst", loose);
    /* f32 reductions only (cuda_gemm_lt.cu's mask) */
    cr_assert_eq(c.heuristic(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, 1 << 22, &algo, &need), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(c.run(&algo, c.dA, c.dD, 1 << 22), CUBLAS_STATUS_SUCCESS);
    int strict = c.worst_ulps();
    cr_assert(strict <= 1, "f32 reduction: %d ulps at worst", strict);
}

Test(emu, cublaslt_refuses_what_its_manual_does_not_allow_naming_it)
{
    lt_case c(6, 5, 16);
    cublasLtMatmulAlgo_t algo;
    size_t need;
    cr_assert_eq(c.heuristic(CUBLASLT_REDUCTION_SCHEME_MASK, 0, &algo, &need), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(c.run(&algo, c.dA, c.dD, 0), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(sync_error(NULL), cudaSuccess);
    cr_assert(c.worst_ulps() <= 1);
    /* an attribute of the wrong size */
    int64_t wide = CUBLAS_OP_T;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide),
                 CUBLAS_STATUS_INVALID_VALUE);
    /* A one element in: less aligned than the algo (256 bytes by default) assumes */
    cr_assert_eq(c.run(&algo, (char *)c.dA + 2, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "MIN_ALIGNMENT_A");
    /* the bias NULL, then a bias less aligned than the one the heuristic saw */
    c.set_bias(NULL);
    cr_assert_eq(c.run(&algo, c.dA, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "BIAS_POINTER");
    c.set_bias((char *)c.dbias + 2);
    cr_assert_eq(c.run(&algo, c.dA, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "the bias");
    c.set_bias(c.dbias);
    /* the algo of another problem */
    lt_case other(6, 5, 17);
    cublasLtMatmulAlgo_t algo2;
    cr_assert_eq(other.heuristic(CUBLASLT_REDUCTION_SCHEME_MASK, 0, &algo2, &need), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(c.run(&algo2, c.dA, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "another problem");
    /* op(A) and op(B) that do not chain (k 16 against 17) */
    cublasLtMatrixLayout_t l17;
    cublasLtMatrixLayoutCreate(&l17, CUDA_R_16F, 17, 5, 17);
    float one = 1, zero = 0;
    cr_assert_eq(cublasLtMatmul(c.h, c.op, &one, c.dA, c.la, c.dB, l17, &zero, c.dD, c.ld, c.dD, c.ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "not {m, k}, {k, n}, {m, n}");
    /* in place with another leading dimension for C */
    cublasLtMatrixLayout_t lc;
    cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, 6, 5, 7);
    cr_assert_eq(cublasLtMatmul(c.h, c.op, &one, c.dA, c.la, c.dB, c.lb, &zero, c.dD, lc, c.dD, c.ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "in place");
    /* a leading dimension below the rows */
    cublasLtMatrixLayout_t thin;
    cublasLtMatrixLayoutCreate(&thin, CUDA_R_16F, 6, 5, 5);
    cr_assert_eq(cublasLtMatmul(c.h, c.op, &one, c.dA, c.la, c.dB, c.lb, &zero, c.dD, thin, c.dD, thin, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "ld 5 < rows 6");
    /* a workspace that is not 256-byte aligned */
    cr_assert_eq(cublasLtMatmul(c.h, c.op, &one, c.dA, c.la, c.dB, c.lb, &zero, c.dD, c.ld, c.dD, c.ld, &algo,
                                (char *)c.ws + 16, 1024, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "256-byte aligned");
    /* an epilogue not emulated */
    uint32_t gelu = CUBLASLT_EPILOGUE_GELU_BIAS;
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &gelu, sizeof gelu);
    cr_assert_eq(c.run(NULL, c.dA, c.dD, 0), CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatrixLayoutDestroy(l17), cublasLtMatrixLayoutDestroy(lc), cublasLtMatrixLayoutDestroy(thin);
}

/* GELU_AUX_BIAS (cuda_gemm_lt.cu's gemm_bias_gelu): the f32 sums plus the
 * bias rounded once into the aux matrix, and D the tanh-form GELU of the
 * unrounded sums rounded once; the manual's aux rules refused */
Test(emu, cublaslt_gelu_aux_bias_writes_the_pre_activation_and_its_gelu)
{
    lt_case c(16, 5, 24);
    uint32_t epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                 CUBLAS_STATUS_SUCCESS);
    void *aux = dev((size_t)16 * 5 * 2), *small = dev((size_t)16 * 4 * 2);
    int64_t ld = 16;
    cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld),
                 CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulAlgo_t algo;
    size_t need;
    cr_assert_eq(c.heuristic(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, 0, &algo, &need), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(c.run(&algo, c.dA, c.dD, 0), CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(sync_error(NULL), cudaSuccess);
    std::vector<uint16_t> D(16 * 5), P(16 * 5);
    cudaMemcpy(D.data(), c.dD, D.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(P.data(), aux, P.size() * 2, cudaMemcpyDeviceToHost);
    auto ordered = [](uint16_t b) { return b & 0x8000 ? -(int)(b & 0x7fff) : (int)b; };
    int worst_pre = 0, worst_y = 0, differs = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 5; j++) {
            double s = mp_f16_to_f32(c.bias[i]);
            for (int l = 0; l < 24; l++)
                s += (double)mp_f16_to_f32(c.A[(size_t)l + (size_t)i * 24]) * mp_f16_to_f32(c.B[(size_t)l + (size_t)j * 24]);
            double y = 0.5 * s * (1.0 + tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
            int dp = abs(ordered(mp_f32_to_f16((float)s)) - ordered(P[(size_t)i + (size_t)j * 16]));
            int dy = abs(ordered(mp_f32_to_f16((float)y)) - ordered(D[(size_t)i + (size_t)j * 16]));
            worst_pre = dp > worst_pre ? dp : worst_pre, worst_y = dy > worst_y ? dy : worst_y;
            differs += D[(size_t)i + (size_t)j * 16] != P[(size_t)i + (size_t)j * 16];
        }
    cr_assert(worst_pre <= 1, "the pre-activation: %d ulps at worst", worst_pre);
    cr_assert(worst_y <= 1, "its GELU: %d ulps at worst", worst_y);
    cr_assert(differs > 40, "D is the GELU, not the pre-activation (%d of 80 differ)", differs);
    /* an aux ld not divisible by 8, then one below D's rows */
    ld = 20;
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    cr_assert_eq(c.run(NULL, c.dA, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "AUX_LD 20");
    ld = 8;
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    cr_assert_eq(c.run(NULL, c.dA, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "divisible by 8");
    ld = 16;
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
    /* an aux type other than D's */
    int32_t f32 = CUDA_R_32F, unset = -1;
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &f32, sizeof f32);
    cr_assert_eq(c.run(NULL, c.dA, c.dD, 0), CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &unset, sizeof unset);
    /* an aux matrix past its allocation, then none */
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &small, sizeof small);
    cr_assert_eq(c.run(NULL, c.dA, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "the aux matrix spans");
    void *none = NULL;
    cublasLtMatmulDescSetAttribute(c.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &none, sizeof none);
    cr_assert_eq(c.run(NULL, c.dA, c.dD, 0), CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "EPILOGUE_AUX_POINTER");
    cudaFree(aux), cudaFree(small);
}

/* BGRADB (cuda_gemm_lt.cu's gemm_wgrad_bias): D {6, 5} = x {6, 16} g'^T with
 * g' stored {5, 16} (TRANSB T), and the sums of op(B)'s columns over k = 16
 * written to the bias pointer; what the manual does not allow refused */
Test(emu, cublaslt_bgradb_writes_the_bias_gradient_of_b)
{
    const int m = 6, n = 5, k = 16;
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t t = CUBLAS_OP_T;
    uint32_t epi = CUBLASLT_EPILOGUE_BGRADB;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &t, sizeof t);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
                 CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, m, k, m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, n, k, n);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_16F, m, n, m);
    std::vector<uint16_t> X(m * k), G(n * k), D(m * n), DB(n);
    for (int i = 0; i < m * k; i++) X[i] = mp_f32_to_f16((float)((i * 37) % 201) / 100.0f - 1.0f);
    for (int i = 0; i < n * k; i++) G[i] = mp_f32_to_f16((float)((i * 53) % 199) / 100.0f - 1.0f);
    void *dX = dev(X.size() * 2), *dG = dev(G.size() * 2), *dD = dev(D.size() * 2), *dDB = dev(DB.size() * 2);
    void *dsmall = dev(4 * 2);
    cudaMemcpy(dX, X.data(), X.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dG, G.data(), G.size() * 2, cudaMemcpyHostToDevice);
    cr_assert_eq(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dDB, sizeof dDB),
                 CUBLAS_STATUS_SUCCESS);
    float one = 1, zero = 0;
    cr_assert_eq(cublasLtMatmul(h, op, &one, dX, la, dG, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_SUCCESS);
    cr_assert_eq(sync_error(NULL), cudaSuccess);
    cudaMemcpy(D.data(), dD, D.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(DB.data(), dDB, DB.size() * 2, cudaMemcpyDeviceToHost);
    auto ordered = [](uint16_t b) { return b & 0x8000 ? -(int)(b & 0x7fff) : (int)b; };
    for (int q = 0; q < n; q++) {
        double sb = 0;
        for (int l = 0; l < k; l++) sb += mp_f16_to_f32(G[q + l * n]);
        cr_assert(abs(ordered(mp_f32_to_f16((float)sb)) - ordered(DB[q])) <= 1, "db[%d]: %g vs %g", q, sb,
                  mp_f16_to_f32(DB[q]));
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++) s += (double)mp_f16_to_f32(X[i + l * m]) * mp_f16_to_f32(G[q + l * n]);
            cr_assert(abs(ordered(mp_f32_to_f16((float)s)) - ordered(D[i + q * m])) <= 1, "D(%d,%d)", i, q);
        }
    }
    /* the bias gradient: not device memory, too short for D's 5 columns, of another type */
    void *none = NULL;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &none, sizeof none);
    cr_assert_eq(cublasLtMatmul(h, op, &one, dX, la, dG, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "BGRADB: the bias gradient");
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dsmall, sizeof dsmall);
    cr_assert_eq(cublasLtMatmul(h, op, &one, dX, la, dG, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_INVALID_VALUE);
    CONTAINS(text(cudaErrorInvalidValue), "runs past");
    int32_t f32 = CUDA_R_32F;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dDB, sizeof dDB);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &f32, sizeof f32);
    cr_assert_eq(cublasLtMatmul(h, op, &one, dX, la, dG, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    cudaFree(dX), cudaFree(dG), cudaFree(dD), cudaFree(dDB), cudaFree(dsmall);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op), cublasLtDestroy(h);
}

/* FP8 (cuda_fp8_gemm.cu's calls): the TN form with A and B scale pointers
 * and AMAX_D; what the manual does not allow is refused */
Test(emu, cublaslt_fp8_takes_the_tn_form_with_scale_and_amax_pointers)
{
    const int m = 16, n = 8, k = 32;
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    uint8_t *dA = (uint8_t *)dev(m * k), *dB = (uint8_t *)dev(n * k);
    float *dD = (float *)dev(m * n * 4), *dS = (float *)dev(3 * 4);
    std::vector<uint8_t> a(m * k, 0x38), b(n * k, 0x40);   /* e4m3 1.0 and 2.0 */
    float sc[3] = {0.5f, 3.0f, 0.0f};
    cudaMemcpy(dA, a.data(), a.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dB, b.data(), b.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dS, sc, sizeof sc, cudaMemcpyHostToDevice);
    cublasLtMatmulDesc_t op;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
    const float *pa = dS, *pb = dS + 1, *pm = dS + 2;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof pa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof pb);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, &pm, sizeof pm);
    cublasLtMatrixLayout_t la, lb, ld, l5a, l5b;
    cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    cublasLtMatrixLayoutCreate(&l5a, CUDA_R_8F_E5M2, k, m, k);
    cublasLtMatrixLayoutCreate(&l5b, CUDA_R_8F_E5M2, k, n, k);
    float one = 1, zero = 0;
    cr_assert_eq(cublasLtMatmul(h, op, &one, dA, la, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_SUCCESS);
    std::vector<float> d(m * n);
    cudaMemcpy(d.data(), dD, d.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(sc, dS, sizeof sc, cudaMemcpyDeviceToHost);
    for (float v : d) cr_assert_eq(v, 96.0f, "32 (1 x 2) x 0.5 x 3: %g", v);
    cr_assert_eq(sc[2], 96.0f, "AMAX_D");
    /* two e5m2 operands; then the NN form */
    cr_assert_eq(cublasLtMatmul(h, op, &one, dA, l5a, dB, l5b, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &nn, sizeof nn);
    cublasLtMatrixLayout_t lan;
    cublasLtMatrixLayoutCreate(&lan, CUDA_R_8F_E4M3, m, k, m);
    cr_assert_eq(cublasLtMatmul(h, op, &one, dA, lan, dB, lb, &zero, dD, ld, dD, ld, NULL, NULL, 0, 0),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    cr_assert_eq(sync_error(NULL), cudaSuccess);
    cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatrixLayoutDestroy(l5a), cublasLtMatrixLayoutDestroy(l5b), cublasLtMatrixLayoutDestroy(lan);
    cublasLtMatmulDescDestroy(op), cublasLtDestroy(h);
    cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dS);
}

/* ---- cuDNN ---- */

struct conv {
    cudnnHandle_t h;
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t c;
    float *dx, *dw, *dy;
    void *ws;
    conv(cudnnMathType_t math)
    {
        cudnnCreate(&h);
        cudnnCreateTensorDescriptor(&x), cudnnCreateTensorDescriptor(&y);
        cudnnCreateFilterDescriptor(&w), cudnnCreateConvolutionDescriptor(&c);
        cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 6, 3, 8, 8);
        cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, 3, 3, 3);
        cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 6, 4, 8, 8);
        cudnnSetConvolution2dDescriptor(c, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
        cudnnSetConvolutionMathType(c, math);
        dx = (float *)dev(6 * 3 * 64 * 4), dw = (float *)dev(4 * 27 * 4), dy = (float *)dev(6 * 4 * 64 * 4);
        ws = dev(1 << 20);
        std::vector<float> v(6 * 4 * 64);
        for (size_t i = 0; i < v.size(); i++) v[i] = 1.0f + (float)((i * 31) % 97) * 1.1e-3f;
        cudaMemcpy(dx, v.data(), 6 * 3 * 64 * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dw, v.data(), 4 * 27 * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dy, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    }
    std::vector<float> forward(cudnnConvolutionFwdAlgo_t a)
    {
        float one = 1, zero = 0;
        cr_assert_eq(cudnnConvolutionForward(h, &one, x, dx, w, dw, c, a, NULL, 0, &zero, y, dy), CUDNN_STATUS_SUCCESS);
        std::vector<float> out(6 * 4 * 64);
        cudaMemcpy(out.data(), dy, out.size() * 4, cudaMemcpyDeviceToHost);
        return out;
    }
    std::vector<float> filter_grad(cudnnConvolutionBwdFilterAlgo_t a)
    {
        float one = 1, zero = 0;
        cr_assert_eq(cudnnConvolutionBackwardFilter(h, &one, x, dx, y, dy, c, a, ws, 1 << 20, &zero, w, dw),
                     CUDNN_STATUS_SUCCESS);
        std::vector<float> out(4 * 27);
        cudaMemcpy(out.data(), dw, out.size() * 4, cudaMemcpyDeviceToHost);
        return out;
    }
    ~conv()
    {
        cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(ws);
        cudnnDestroyTensorDescriptor(x), cudnnDestroyTensorDescriptor(y);
        cudnnDestroyFilterDescriptor(w), cudnnDestroyConvolutionDescriptor(c);
        cudnnDestroy(h);
    }
};

Test(emu, cudnn_labels_fma_only_float_algorithms_default_math_and_lets_default_math_use_tf32)
{
    conv k(CUDNN_FMA_MATH);
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int n = 0;
    cr_assert_eq(cudnnGetConvolutionForwardAlgorithm_v7(k.h, k.x, k.w, k.c, k.y, 8, &n, perf), CUDNN_STATUS_SUCCESS);
    cr_assert(n > 0);
    for (int i = 0; i < n; i++) cr_assert_neq(perf[i].mathType, CUDNN_FMA_MATH, "results are labelled DEFAULT_MATH");
    std::vector<float> fma = k.forward(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
    cudnnSetConvolutionMathType(k.c, CUDNN_DEFAULT_MATH);
    std::vector<float> tf32 = k.forward(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
    int differ = 0;
    for (size_t i = 0; i < fma.size(); i++) differ += fma[i] != tf32[i];
    cr_assert(differ > 0, "DEFAULT_MATH on float data rounds the operands to TF32");
}

Test(emu, cudnn_non_deterministic_algorithms_change_their_last_bits_and_deterministic_ones_do_not)
{
    conv k(CUDNN_FMA_MATH);
    std::vector<float> a = k.filter_grad(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0), b = k.filter_grad(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0);
    std::vector<float> c = k.filter_grad(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1), d = k.filter_grad(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
    cr_assert(a != b, "ALGO_0 sums its parts in an order that changes");
    cr_assert(c == d, "ALGO_1 is deterministic");
}

Test(emu, cudnn_checks_the_workspace_and_the_output_dims)
{
    conv k(CUDNN_FMA_MATH);
    float one = 1, zero = 0;
    cudnnStatus_t s = cudnnConvolutionForward(k.h, &one, k.x, k.dx, k.w, k.dw, k.c, CUDNN_CONVOLUTION_FWD_ALGO_GEMM, NULL,
                                              0, &zero, k.y, k.dy);
    cr_assert_eq(s, CUDNN_STATUS_BAD_PARAM);
    CONTAINS(std::string(cudnnGetErrorString(s)), "bytes of workspace, 0 given");
    cudnnSetTensor4dDescriptor(k.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 6, 4, 7, 8);
    s = cudnnConvolutionForward(k.h, &one, k.x, k.dx, k.w, k.dw, k.c, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0,
                                &zero, k.y, k.dy);
    cr_assert_eq(s, CUDNN_STATUS_BAD_PARAM);
    CONTAINS(std::string(cudnnGetErrorString(s)), "this convolution gives {6,4,8,8}");
}

/* ---- NCCL ---- */

Test(emu, nccl_with_one_rank_keeps_the_data_and_checks_its_arguments)
{
    ncclUniqueId id;
    ncclComm_t comm;
    cr_assert_eq(ncclGetUniqueId(&id), ncclSuccess);
    cr_assert_eq(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
    uint16_t h[4] = {mp_f32_to_f16(1.5f), mp_f32_to_f16(-2.0f), mp_f32_to_f16(3.25f), mp_f32_to_f16(1e-5f)}, back[4];
    void *d = dev(sizeof h);
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    for (int op = ncclSum; op <= ncclAvg; op++) cr_assert_eq(ncclAllReduce(d, d, 4, ncclFloat16, (ncclRedOp_t)op, comm, NULL), ncclSuccess);
    cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost);
    cr_assert(memcmp(h, back, sizeof h) == 0);
    int host[4];
    cr_assert_eq(ncclAllReduce(host, host, 4, ncclInt32, ncclSum, comm, NULL), ncclInvalidArgument);
    CONTAINS(std::string(ncclGetErrorString(ncclInvalidArgument)), "not inside device memory");
    cr_assert_eq(ncclCommDestroy(comm), ncclSuccess);
    cr_assert_eq(ncclCommDestroy(comm), ncclInvalidArgument);
    cudaFree(d);
}
