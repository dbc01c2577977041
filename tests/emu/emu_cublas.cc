/*
 * emu_cublas.cc: the cuBLAS calls of kernels/cuda/cuda_gemm.cu on the emulated
 * device.
 *
 * Arguments are checked as cuBLAS's manual states them (cublasGemmEx and
 * cublasGemmStridedBatchedEx): the handle, m, n, k and the batch not negative,
 * the operations N, T or C, the leading dimensions at least the rows of what
 * is stored (column-major: lda >= m for an untransposed A, >= k transposed;
 * ldb >= k or n; ldc >= m), the (A, B, C, compute) types one of the
 * combinations the manual lists, alpha and beta on the host in host pointer
 * mode, the matrices in device memory and inside their allocations, the
 * workspace 256-byte aligned device memory. Two things the manual leaves
 * undefined are refused too: strided C items that overlap (the items would
 * race), and a matrix outside device memory.
 *
 * The product is then queued on the handle's stream and computed from the
 * column-major operands exactly as described (each item gathered through its
 * leading dimension and transpose into a dense row-major matrix, multiplied by
 * the CPU backend's gemm, scattered back through ldc), so a wrong transpose or
 * leading dimension gives wrong numbers here too. What cuBLAS may do that
 * changes numbers is modelled: with TF32 allowed (CUBLAS_TF32_TENSOR_OP_MATH,
 * CUBLAS_COMPUTE_32F_FAST_TF32) f32 operands are rounded to TF32 first; and
 * unless the handle's math mode has CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_
 * REDUCTION, a 16-bit output with k > 1024 is computed as cuBLAS's split-K
 * may: partial products over runs of 1024 of k, each rounded to the output
 * type, added together in the output type.
 */
#include <stdio.h>
#include <string.h>
#include <set>
#include <vector>
#include <cublas_v2.h>
#include "tests/emu/emu.h"
#include "tests/emu/emu_values.h"

struct cublasContext {
    cudaStream_t stream;
    void *ws;
    size_t ws_size;
    cublasMath_t math;
    cublasPointerMode_t ptr_mode;
};

using namespace mp_emu;

static std::set<cublasContext *> &handles = *new std::set<cublasContext *>;   /* never destroyed: see emu_runtime.cc */

#define SPLIT_K 1024

/* a refused cuBLAS or cuBLASLt call (lib names which): the backend reports a
 * status as the nearest CUDA error (cuda_gemm.cu, cuda_gemm_lt.cu), and that
 * error's text carries this one */
cublasStatus_t mp_emu::blas_refused(const char *lib, cublasStatus_t s, const char *call, const char *fmt, va_list ap)
{
    char b[800];
    vsnprintf(b, sizeof b, fmt, ap);
    cudaError_t e = s == CUBLAS_STATUS_NOT_SUPPORTED ? cudaErrorNotSupported
                    : s == CUBLAS_STATUS_NOT_INITIALIZED ? cudaErrorInitializationError
                    : s == CUBLAS_STATUS_EXECUTION_FAILED ? cudaErrorLaunchFailure : cudaErrorInvalidValue;
    describe(e, "%s (emulated %s: %s: %s)", cudaGetErrorString_std(e), lib, call, b);
    return s;
}

static cublasStatus_t bad(cublasStatus_t s, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cublasStatus_t bad(cublasStatus_t s, const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s = blas_refused("cuBLAS", s, call, fmt, ap);
    va_end(ap);
    return s;
}

static bool alive(cublasHandle_t h) { return h && handles.count(h); }

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    cublasContext *c = new cublasContext();
    c->stream = NULL, c->ws = NULL, c->ws_size = 0, c->math = CUBLAS_DEFAULT_MATH, c->ptr_mode = CUBLAS_POINTER_MODE_HOST;
    handles.insert(c);
    counters().live_blas++;
    *h = c;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasDestroy", "not a live handle");
    sync_stream(h->stream);
    handles.erase(h);
    delete h;
    counters().live_blas--;
    return CUBLAS_STATUS_SUCCESS;
}

/* the manual: "cublasSetStream() unconditionally resets the cuBLAS library
 * workspace back to the default workspace pool" */
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream", "not a live handle");
    if (!stream_valid(s)) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetStream", "stream %p is not live", (void *)s);
    h->stream = s, h->ws = NULL, h->ws_size = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t h, cudaStream_t *s)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetStream", "not a live handle");
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetWorkspace", "not a live handle");
    region r;
    if (ws && (!find_region(ws, &r) || !(r.kind & MEM_DEVICE)))
        return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "the workspace %p is not device memory", ws);
    if (((uintptr_t)ws & 255) != 0)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "the workspace %p is not 256-byte aligned", ws);
    if (ws && bytes > r.size - (size_t)((char *)ws - r.base))
        return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetWorkspace", "%zu bytes run past the end of the allocation", bytes);
    h->ws = ws, h->ws_size = ws ? bytes : 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetMathMode", "not a live handle");
    int base = (int)m & 0xf, flags = (int)m & ~0xf;
    if (base > 4 && base != 8) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode", "mode %d", (int)m);
    if (flags & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetMathMode", "flags 0x%x", flags);
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *m)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetMathMode", "not a live handle");
    *m = h->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t h, cublasPointerMode_t mode)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetPointerMode", "not a live handle");
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasSetPointerMode", "mode %d", (int)mode);
    h->ptr_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    default: return "unknown error";
    }
}

}  // extern "C"

/* ---- the product ---- */

static mp_dtype dtype_of(cudaDataType t) { return t == CUDA_R_16F ? MP_F16 : t == CUDA_R_16BF ? MP_BF16 : MP_F32; }

struct gemm_job {
    bool ta, tb;
    int64_t m, n, k, lda, ldb, ldc, batch;
    long long sa, sb, sc;
    const char *A, *B;
    char *C;
    mp_dtype at, ct;
    float alpha, beta;
    bool tf32, split;
};

/* one item: op(A) {m, k} and op(B) {k, n} gathered row-major (f32, or the
 * operands' dtype when the CPU's gemm takes it), C through ldc */
static bool gemm_item(const gemm_job &j, int64_t it)
{
    const int64_t m = j.m, n = j.n, k = j.k;
    const size_t ea = mp_dtype_size(j.at), ec = mp_dtype_size(j.ct);
    const char *A = j.A + (size_t)(it * j.sa) * ea, *B = j.B + (size_t)(it * j.sb) * ea;
    char *C = j.C + (size_t)(it * j.sc) * ec;
    /* the CPU's gemm in the operands' dtype when C has it too (the backend's own
     * numerics: one rounding), else f32 on widened operands */
    const bool native = j.at == j.ct && !j.tf32 && !j.split;
    const mp_dtype dt = native ? j.at : MP_F32;
    const size_t es = mp_dtype_size(dt);
    std::vector<char> a((size_t)(m * k) * es + 1), b((size_t)(k * n) * es + 1), c((size_t)(m * n) * es + 1);
    for (int64_t i = 0; i < m; i++)
        for (int64_t l = 0; l < k; l++) {
            int64_t src = j.ta ? l + i * j.lda : i + l * j.lda;
            if (native) memcpy(&a[(size_t)(i * k + l) * es], A + (size_t)src * ea, es);
            else ((float *)a.data())[i * k + l] = j.tf32 ? tf32(load_f32(j.at, A, (size_t)src)) : load_f32(j.at, A, (size_t)src);
        }
    for (int64_t l = 0; l < k; l++)
        for (int64_t q = 0; q < n; q++) {
            int64_t src = j.tb ? q + l * j.ldb : l + q * j.ldb;
            if (native) memcpy(&b[(size_t)(l * n + q) * es], B + (size_t)src * ea, es);
            else ((float *)b.data())[l * n + q] = j.tf32 ? tf32(load_f32(j.at, B, (size_t)src)) : load_f32(j.at, B, (size_t)src);
        }
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < n; q++) {
            if (native) memcpy(&c[(size_t)(i * n + q) * es], C + (size_t)(i + q * j.ldc) * ec, es);
            else ((float *)c.data())[i * n + q] = load_f32(j.ct, C, (size_t)(i + q * j.ldc));
        }
    const mp_backend &cpu = mp_cpu_backend;
    if (!j.split) {
        if (cpu.gemm(cpu.ctx, dt, 0, 0, 1, m, n, k, j.alpha, a.data(), 0, b.data(), 0, j.beta, c.data(), 0) != 0)
            return false;
    } else {
        /* split-K with a reduction in the output type: partials over runs of
         * SPLIT_K of k, each rounded to the output type and added in it */
        std::vector<float> part((size_t)(m * n)), acc((size_t)(m * n), 0.0f), as((size_t)(m * SPLIT_K) + 1),
            bs((size_t)(SPLIT_K * n) + 1);
        for (int64_t l0 = 0; l0 < k; l0 += SPLIT_K) {
            int64_t len = k - l0 < SPLIT_K ? k - l0 : SPLIT_K;
            for (int64_t i = 0; i < m; i++)
                memcpy(&as[(size_t)(i * len)], (float *)a.data() + i * k + l0, sizeof(float) * (size_t)len);
            memcpy(bs.data(), (float *)b.data() + l0 * n, sizeof(float) * (size_t)(len * n));
            if (cpu.gemm(cpu.ctx, MP_F32, 0, 0, 1, m, n, len, 1.0f, as.data(), 0, bs.data(), 0, 0.0f, part.data(), 0) != 0)
                return false;
            for (size_t e = 0; e < part.size(); e++)
                acc[e] = l0 == 0 ? round_to(j.ct, part[e]) : round_to(j.ct, acc[e] + round_to(j.ct, part[e]));
        }
        float *cf = (float *)c.data();
        for (size_t e = 0; e < acc.size(); e++) cf[e] = j.alpha * acc[e] + (j.beta != 0.0f ? j.beta * cf[e] : 0.0f);
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < n; q++) {
            if (native) memcpy(C + (size_t)(i + q * j.ldc) * ec, &c[(size_t)(i * n + q) * es], es);
            else store_f32(j.ct, C, (size_t)(i + q * j.ldc), ((float *)c.data())[i * n + q]);
        }
    return true;
}

bool mp_emu::queue_product(cudaStream_t s, const char *what, std::function<bool()> fn)
{
    return enqueue(s, what, std::move(fn));
}

/* the elements an item of a column-major {rows, cols} matrix spans, and the batch */
static bool matrix_ok(const char *call, const char *name, const void *p, size_t es, int64_t rows, int64_t cols,
                      int64_t ld, long long stride, int64_t batch, bool written)
{
    if (rows == 0 || cols == 0 || batch == 0) return true;
    region r;
    if (!find_region(p, &r) || !(r.kind & (MEM_DEVICE | MEM_SYMBOL))) {
        bad(CUBLAS_STATUS_INVALID_VALUE, call, "%s %p is not device memory", name, p);
        return false;
    }
    if (stride < 0) {
        bad(CUBLAS_STATUS_INVALID_VALUE, call, "stride%s %lld is negative", name, stride);
        return false;
    }
    const uint64_t span = (uint64_t)stride * (uint64_t)(batch - 1) + (uint64_t)ld * (uint64_t)(cols - 1) + (uint64_t)rows;
    const uint64_t room = (r.size - (size_t)((const char *)p - r.base)) / es;
    if (span > room) {
        bad(CUBLAS_STATUS_INVALID_VALUE, call, "%s spans %llu elements (ld %lld, stride %lld, batch %lld) but its "
            "allocation has %llu from %p", name, (unsigned long long)span, (long long)ld, stride, (long long)batch,
            (unsigned long long)room, p);
        return false;
    }
    if (written && batch > 1 && (uint64_t)stride < (uint64_t)ld * (uint64_t)(cols - 1) + (uint64_t)rows) {
        bad(CUBLAS_STATUS_INVALID_VALUE, call, "the %lld items of %s overlap (stride %lld, each spans %llu elements): "
            "they would race", (long long)batch, name, stride,
            (unsigned long long)((uint64_t)ld * (uint64_t)(cols - 1) + (uint64_t)rows));
        return false;
    }
    return true;
}

static bool op_ok(cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T || o == CUBLAS_OP_C; }

static cublasStatus_t gemm(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                           int64_t n, int64_t k, const void *alpha, const void *A, cudaDataType At, int64_t lda,
                           long long sa, const void *B, cudaDataType Bt, int64_t ldb, long long sb, const void *beta,
                           void *C, cudaDataType Ct, int64_t ldc, long long sc, int64_t batch,
                           cublasComputeType_t compute)
{
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
    if (m < 0 || n < 0 || k < 0 || batch < 0)
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "m %lld, n %lld, k %lld, batch %lld: none may be negative",
                   (long long)m, (long long)n, (long long)k, (long long)batch);
    if (!op_ok(ta) || !op_ok(tb)) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "transa %d, transb %d", (int)ta, (int)tb);
    const bool tra = ta != CUBLAS_OP_N, trb = tb != CUBLAS_OP_N;
    const int64_t ar = tra ? k : m, br = trb ? n : k;
    if (lda < (ar > 1 ? ar : 1))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "lda %lld < max(1, %s) = %lld (A is %s)", (long long)lda,
                   tra ? "k" : "m", (long long)(ar > 1 ? ar : 1), tra ? "transposed" : "not transposed");
    if (ldb < (br > 1 ? br : 1))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "ldb %lld < max(1, %s) = %lld (B is %s)", (long long)ldb,
                   trb ? "n" : "k", (long long)(br > 1 ? br : 1), trb ? "transposed" : "not transposed");
    if (ldc < (m > 1 ? m : 1))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "ldc %lld < max(1, m) = %lld", (long long)ldc,
                   (long long)(m > 1 ? m : 1));
    const bool c32 = compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
                     compute == CUBLAS_COMPUTE_32F_FAST_TF32 || compute == CUBLAS_COMPUTE_32F_FAST_16F ||
                     compute == CUBLAS_COMPUTE_32F_FAST_16BF;
    const bool types = At == Bt && ((At == CUDA_R_16F && (Ct == CUDA_R_16F || Ct == CUDA_R_32F)) ||
                                    (At == CUDA_R_16BF && (Ct == CUDA_R_16BF || Ct == CUDA_R_32F)) ||
                                    (At == CUDA_R_32F && Ct == CUDA_R_32F));
    if (!c32 || !types)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "types A %d, B %d, C %d with compute type %d: not among the "
                   "f32-compute combinations of the manual (the only ones emulated)", (int)At, (int)Bt, (int)Ct,
                   (int)compute);
    if (h->ptr_mode != CUBLAS_POINTER_MODE_HOST)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "device pointer mode is not emulated");
    region ra, rb;
    if (!alpha || !beta || (find_region(alpha, &ra) && (ra.kind & (MEM_DEVICE | MEM_SYMBOL))) ||
        (find_region(beta, &rb) && (rb.kind & (MEM_DEVICE | MEM_SYMBOL))))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "alpha %p and beta %p must be host memory in host pointer mode",
                   alpha, beta);
    const mp_dtype at = dtype_of(At), ct = dtype_of(Ct);
    const size_t ea = mp_dtype_size(at), ec = mp_dtype_size(ct);
    if (!matrix_ok(call, "A", A, ea, ar, tra ? m : k, lda, sa, k ? batch : 0, false) ||
        !matrix_ok(call, "B", B, ea, br, trb ? k : n, ldb, sb, k ? batch : 0, false) ||
        !matrix_ok(call, "C", C, ec, m, n, ldc, sc, batch, true))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    gemm_job j = {tra, trb, m, n, k, lda, ldb, ldc, batch, sa, sb, sc, (const char *)A, (const char *)B, (char *)C, at,
                  ct, *(const float *)alpha, *(const float *)beta, false, false};
    const int base = (int)h->math & 0xf;
    j.tf32 = at == MP_F32 && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                              (base == CUBLAS_TF32_TENSOR_OP_MATH && compute == CUBLAS_COMPUTE_32F));
    j.split = ct != MP_F32 && k > SPLIT_K && !((int)h->math & CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
    /* queued, or recorded as a graph node when the stream is capturing (a capture the stream
     * invalidated takes nothing: an execution failure, as cuBLAS reports a refused launch) */
    bool queued = queue_product(h->stream, "cublasGemm", [j] {
        for (int64_t it = 0; it < j.batch; it++)
            if (!gemm_item(j, it)) {
                sticky(cudaErrorLaunchFailure, "unspecified launch failure (emulated cuBLAS: the CPU gemm found no "
                       "working memory)");
                return false;
            }
        return true;
    });
    if (!queued && sticky_error() == cudaSuccess)
        return bad(CUBLAS_STATUS_EXECUTION_FAILED, call, "its stream's capture was invalidated by an earlier call");
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" {

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType At, int lda,
                                          long long sa, const void *B, cudaDataType Bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType Ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    return gemm("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, At, lda, sa, B, Bt, ldb, sb, beta, C, Ct,
                ldc, sc, batch, compute);
}

cublasStatus_t cublasGemmStridedBatchedEx_64(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                                             int64_t n, int64_t k, const void *alpha, const void *A, cudaDataType At,
                                             int64_t lda, long long sa, const void *B, cudaDataType Bt, int64_t ldb,
                                             long long sb, const void *beta, void *C, cudaDataType Ct, int64_t ldc,
                                             long long sc, int64_t batch, cublasComputeType_t compute,
                                             cublasGemmAlgo_t algo)
{
    return gemm("cublasGemmStridedBatchedEx_64", h, ta, tb, m, n, k, alpha, A, At, lda, sa, B, Bt, ldb, sb, beta, C, Ct,
                ldc, sc, batch, compute);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType At, int lda, const void *B, cudaDataType Bt,
                            int ldb, const void *beta, void *C, cudaDataType Ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    return gemm("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, At, lda, 0, B, Bt, ldb, 0, beta, C, Ct, ldc, 0, 1, compute);
}

}  // extern "C"
