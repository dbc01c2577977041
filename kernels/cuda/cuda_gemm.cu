/*
 * cuda_gemm.cu: the backend's matrix product (mp_backend.gemm) through cuBLAS.
 *
 * Batched C = alpha * op(A) @ op(B) + beta * C on row-major operands of one
 * dtype (f32, f16 or bf16), one cublasGemmStridedBatchedEx call with
 * CUBLAS_COMPUTE_32F: f16/bf16 operands are multiplied with f32 accumulation
 * and the output is rounded once, the numerics of cpu_gemm.c.
 *
 * cuBLAS is column-major. A row-major {r, c} matrix is, read column-major, its
 * transpose {c, r} with leading dimension c. So the row-major C = op(A) op(B) is
 * computed as the column-major C^T = op(B)^T op(A)^T: A and B swap places, m and
 * n swap, and each operand keeps its own transpose flag.
 *
 * Two edge cases run item by item, as the CPU's loop: a broadcast C (sC == 0,
 * every item accumulating into one C) and k == 0 (C = beta * C, by a small
 * kernel rather than cuBLAS's reading of an empty product).
 *
 * The handle disallows reduced-precision reductions (CUBLAS_MATH_DISALLOW_
 * REDUCED_PRECISION_REDUCTION): cuBLAS may otherwise split k and add the
 * partial products in the output's f16/bf16, several roundings instead of one.
 *
 * The context's cuBLAS handle, created on first use, runs on cx->stream with a
 * workspace from the context's caching allocator (cublasSetWorkspace), so that
 * cuBLAS never allocates behind the engine's back during a call.
 */
#include <cublas_v2.h>
#include <limits.h>
#include "kernels/cuda/cuda.h"

/* 32 MiB: what NVIDIA recommends for Hopper (sm_90); more than enough elsewhere */
#define GEMM_WORKSPACE ((size_t)32 << 20)


/* a cuBLAS status as the nearest CUDA error, for the sticky error */
cudaError_t mp_cuda_blas_error(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED: return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUBLAS_STATUS_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ARCH_MISMATCH: return cudaErrorNoKernelImageForDevice;
    case CUBLAS_STATUS_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUBLAS_STATUS_EXECUTION_FAILED: return cudaErrorLaunchFailure;
    default: return cudaErrorUnknown;
    }
}

/* the context's handle (cx->blas, made on first use), bound to cx->stream with
 * the context's workspace (cx->blas_ws; NULL: cuBLAS's default); NULL (error
 * noted) when it cannot be made. cx->blas_bound: bound once (NULL is a valid
 * stream) to cx->blas_stream */
static cublasHandle_t get_handle(mp_kctx *cx)
{
    if (!cx->blas) {
        cublasHandle_t h;
        cublasStatus_t s = cublasCreate(&h);
        if (s != CUBLAS_STATUS_SUCCESS) {
            mp_cuda_note(cx, mp_cuda_blas_error(s), "gemm: cublasCreate");
            return NULL;
        }
        /* f32 accumulation and one rounding: without this flag cuBLAS may split
         * k and add the partial sums in the output's 16 bits (f16/bf16), which
         * a weight gradient's k of thousands would show (parity's long-k gemm
         * cases). Tensor cores stay allowed (default math: f16/bf16 inputs,
         * f32 accumulation; no TF32 for f32) */
        cublasStatus_t m = cublasSetMathMode(
            h, (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
        if (m != CUBLAS_STATUS_SUCCESS) {
            cublasDestroy(h);
            mp_cuda_note(cx, mp_cuda_blas_error(m), "gemm: cublasSetMathMode");
            return NULL;
        }
        cx->blas = h;
        cx->blas_bound = false;
        /* A workspace of our own, a block of the context's caching allocator held
         * for the handle's life, is an optimisation, not a requirement: when it
         * cannot be had, cuBLAS falls back to its default one (the allocator
         * clears cudaMalloc's failure, so no later launch check reports it). */
        cx->blas_ws = mp_cache_alloc(&cx->cache, GEMM_WORKSPACE);
    }
    if (!cx->blas_bound || cx->blas_stream != cx->stream) {
        /* cublasSetStream resets the workspace to cuBLAS's default: set ours after it */
        cublasStatus_t s = cublasSetStream(cx->blas, cx->stream);
        if (s == CUBLAS_STATUS_SUCCESS && cx->blas_ws) s = cublasSetWorkspace(cx->blas, cx->blas_ws, GEMM_WORKSPACE);
        if (s != CUBLAS_STATUS_SUCCESS) {
            mp_cuda_note(cx, mp_cuda_blas_error(s), "gemm: cublasSetStream/cublasSetWorkspace");
            return NULL;
        }
        cx->blas_stream = cx->stream;
        cx->blas_bound = true;
    }
    return cx->blas;
}

cublasHandle_t mp_cuda_blas_handle(mp_kctx *cx) { return get_handle(cx); }

void *mp_cuda_gemm_workspace(mp_kctx *cx, size_t *bytes, bool *tf32)
{
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
    cublasHandle_t h = get_handle(cx);
    if (h) cublasGetMathMode(h, &math);
    *tf32 = ((int)math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH;
    *bytes = h && cx->blas_ws ? GEMM_WORKSPACE : 0;
    return *bytes ? cx->blas_ws : NULL;
}

static cudaDataType cuda_type(mp_dtype dt)
{
    return dt == MP_F16 ? CUDA_R_16F : dt == MP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* C = beta * C over n elements (beta == 0 writes zeros, as BLAS): the whole
 * product when k == 0, which is left to no library's reading of the edge case */
__global__ void scale_kernel(mp_dtype dt, void *c, int64_t n, float beta)
{
    MP_FOR(i, n) mp_st(dt, c, i, beta == 0.0f ? 0.0f : beta * mp_ld(dt, c, i));
}

int mp_cuda_gemm(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                 const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c, int64_t sc)
{
    if (batch <= 0 || m <= 0 || n <= 0) return 0;   /* nothing to write */
    if (k <= 0) {   /* every item is C = beta * C, item by item as the CPU (sc == 0: C scaled batch times) */
        const int64_t mn = m * n;
        for (int64_t i = 0; i < batch; i++) {
            void *ci = (char *)c + (size_t)(i * sc) * mp_dtype_size(dt);
            MP_LAUNCH(mp_blocks(mn), MP_THREADS, 0, cx->stream, scale_kernel, dt, ci, mn, beta);
        }
        MP_LAUNCHED("gemm (k == 0)");
        return 0;
    }
    cublasHandle_t h = get_handle(cx);
    if (!h) return -1;

    const cudaDataType t = cuda_type(dt);
    /* column-major C^T {n, m} = op(B)^T {n, k} @ op(A)^T {k, m}:
     *   B is row-major {k, n} (ld n), or {n, k} (ld k) when tb;
     *   A is row-major {m, k} (ld k), or {k, m} (ld m) when ta;
     *   C is row-major {m, n} (ld n).
     * (k >= 1 here, so every leading dimension is >= 1.) */
    const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t ldb = tb ? k : n, lda = ta ? m : k, ldc = n;

    /* Every batch item writing one broadcast C (sc == 0) is, on the CPU, a chain
     * of products each reading the last one's result; a batched call would race
     * on C, so such a call runs item by item (in stream order). */
    int64_t calls = 1, per_call = batch;
    if (sc == 0 && batch > 1) calls = batch, per_call = 1;
    const size_t es = mp_dtype_size(dt);

    const bool fits = m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
                      per_call <= INT_MAX;
    for (int64_t i = 0; i < calls; i++) {
        const char *ai = (const char *)a + (size_t)(i * sa) * es;
        const char *bi = (const char *)b + (size_t)(i * sb) * es;
        cublasStatus_t s;
        if (fits)
            s = cublasGemmStridedBatchedEx(h, opb, opa, (int)n, (int)m, (int)k, &alpha,
                                           bi, t, (int)ldb, (long long)sb,
                                           ai, t, (int)lda, (long long)sa,
                                           &beta, c, t, (int)ldc, (long long)sc,
                                           (int)per_call, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        else
            s = cublasGemmStridedBatchedEx_64(h, opb, opa, n, m, k, &alpha,
                                              bi, t, ldb, (long long)sb,
                                              ai, t, lda, (long long)sa,
                                              &beta, c, t, ldc, (long long)sc,
                                              per_call, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) {
            mp_cuda_note(cx, mp_cuda_blas_error(s), "gemm: cublasGemmStridedBatchedEx");
            return -1;
        }
    }
    MP_LAUNCHED("gemm");
    return 0;
}
