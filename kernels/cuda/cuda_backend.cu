/*
 * cuda_backend.cu: the CUDA backend's table, its memory and its errors.
 *
 * This file is built into build/mp/cuda.so, which the engine loads at run time
 * (engine/tensor.c) and asks for the table through mp_cuda_backend_init. On a
 * machine without a driver or a GPU that returns NULL and the engine runs on the
 * CPU alone, so one build serves both kinds of machine.
 *
 * Memory comes from a caching allocator: freed blocks go to a free list keyed by
 * their rounded size and are reused by the next allocation of that size, since
 * cudaMalloc and cudaFree are slow and synchronise the device. Every kernel and
 * copy runs on one stream, so a block reused after a free is ordered after the
 * kernels that used it. When cudaMalloc fails the cache is released and the
 * allocation tried once more; the engine then reports "out of memory" (after a
 * garbage collection and its own retry).
 */
#include <stdio.h>
#include <string.h>
#include <unordered_map>
#include <vector>
#include "kernels/cuda/cuda.h"

cudaStream_t mp_cuda_stream;

/* ---- the sticky error ---- */

static char error_msg[256];
static bool has_error;

void mp_cuda_note(cudaError_t e, const char *what)
{
    if (e == cudaSuccess || has_error) return;
    snprintf(error_msg, sizeof error_msg, "CUDA error in %s: %s", what, cudaGetErrorString(e));
    has_error = true;
}

/* the first error since the last call (launch errors, and faults that surfaced) */
static const char *cuda_error(void)
{
    mp_cuda_note(cudaGetLastError(), "a kernel");
    if (!has_error) return NULL;
    has_error = false;
    return error_msg;
}

/* ---- caching allocator ---- */

static std::unordered_map<size_t, std::vector<void *>> free_blocks;

/* sizes round up so that similar requests share a free list: 512 bytes below
 * 1 MiB, 2 MiB above */
static size_t rounded(size_t n)
{
    size_t q = n < ((size_t)1 << 20) ? 512 : (size_t)2 << 20;
    return (n + q - 1) / q * q;
}

static void release_cache(void)
{
    cudaStreamSynchronize(mp_cuda_stream);
    for (auto &kv : free_blocks)
        for (void *p : kv.second) cudaFree(p);
    free_blocks.clear();
}

static void *cuda_alloc(size_t nbytes)
{
    size_t n = rounded(nbytes ? nbytes : 1);
    auto it = free_blocks.find(n);
    if (it != free_blocks.end() && !it->second.empty()) {
        void *p = it->second.back();
        it->second.pop_back();
        return p;
    }
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess) {
        cudaGetLastError();   /* an allocation failure is reported as out of memory, not as a sticky error */
        release_cache();
        if (cudaMalloc(&p, n) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
    }
    return p;
}

static void cuda_free(void *p, size_t nbytes)
{
    if (p) free_blocks[rounded(nbytes ? nbytes : 1)].push_back(p);
}

static void cuda_zero(void *p, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, mp_cuda_stream), "zero");
}

static void cuda_copy(void *dst, const void *src, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, mp_cuda_stream), "copy");
}

/* the host side waits: the caller reads the bytes next */
static void cuda_to_host(void *dst, const void *src, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, mp_cuda_stream), "copy to host");
    MP_CUDA_CHECK(cudaStreamSynchronize(mp_cuda_stream), "copy to host");
}

/* synchronous too: the host buffer may be freed as soon as this returns */
static void cuda_from_host(void *dst, const void *src, size_t nbytes)
{
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, mp_cuda_stream), "copy from host");
    MP_CUDA_CHECK(cudaStreamSynchronize(mp_cuda_stream), "copy from host");
}

static void cuda_synchronize(void)
{
    MP_CUDA_CHECK(cudaStreamSynchronize(mp_cuda_stream), "synchronize");
}

static mp_backend table;

extern "C" const mp_backend *mp_cuda_backend_init(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
        cudaGetLastError();
        return NULL;
    }
    if (cudaStreamCreateWithFlags(&mp_cuda_stream, cudaStreamNonBlocking) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    table.name = "cuda";
    table.alloc = cuda_alloc;
    table.free = cuda_free;
    table.zero = cuda_zero;
    table.copy = cuda_copy;
    table.to_host = cuda_to_host;
    table.from_host = cuda_from_host;
    table.error = cuda_error;
    table.synchronize = cuda_synchronize;
    table.cast = mp_cuda_cast;
    table.fill = mp_cuda_fill;
    table.arange = mp_cuda_arange;
    table.rand_uniform = mp_cuda_rand_uniform;
    table.rand_normal = mp_cuda_rand_normal;
    table.binary = mp_cuda_binary;
    table.unary = mp_cuda_unary;
    table.unary_grad = mp_cuda_unary_grad;
    table.reduce = mp_cuda_reduce;
    table.put_along = mp_cuda_put_along;
    table.where = mp_cuda_where;
    table.softmax = mp_cuda_softmax;
    table.softmax_grad = mp_cuda_softmax_grad;
    table.cross_entropy = mp_cuda_cross_entropy;
    table.cross_entropy_grad = mp_cuda_cross_entropy_grad;
    table.layer_norm = mp_cuda_layer_norm;
    table.layer_norm_grad = mp_cuda_layer_norm_grad;
    table.unscale = mp_cuda_unscale;
    table.flush_counter = NULL;   /* backward flush counting is CPU telemetry for now */
    table.optim_step = mp_cuda_optim_step;
    table.gemm = mp_cuda_gemm;
    table.permute = mp_cuda_permute;
    table.gather = mp_cuda_gather;
    table.scatter_add = mp_cuda_scatter_add;
    table.narrow = mp_cuda_narrow;
    table.narrow_put = mp_cuda_narrow_put;
    return &table;
}
