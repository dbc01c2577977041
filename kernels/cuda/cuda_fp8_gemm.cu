/*
 * cuda_fp8_gemm.cu: the scaled FP8 GEMM through cuBLASLt (sm_89 / sm_90),
 * the CUDA side of kernels/cpu/cpu_fp8_gemm.c, on raw codes
 * (kernels/fp8_scaled.h): row-major C {m, n} = (A dequantized)(B
 * dequantized)^T, A {m, k}, B {n, k}.
 *
 * Layout. cuBLASLt's FP8 matmuls take only the "TN" form: op(A) = A^T with A
 * stored column-major {k, m'} and op(B) = B as stored {k, n'}, so both
 * operands are read along k, which is how the quantizer writes them. Read
 * column-major, our row-major C is D {n, m} (ld n) = op(A') B' with Lt's A'
 * our B (stored {k, n} column-major, ld k, TRANSA = T) and Lt's B' our A
 * ({k, m}, ld k, TRANSB = N). Lt's A scale is thus our B's and its B scale our A's. FP8
 * needs 16-byte aligned pointers and leading dimensions (k a multiple of 16),
 * and at most one e5m2 operand; what Lt refuses is declined (1) and the
 * engine reports it.
 *
 * Scales. Per tensor: the two decode scales go to CUBLASLT_MATMUL_DESC_A/B_
 * SCALE_POINTER (device f32), which Lt multiplies into the f32 sums before
 * the one rounding to C's dtype (f32, bf16, f16). Tile and block scales
 * (they change every 128 of k) are what Lt cannot take on sm_90: k is cut
 * into its 128-chunks, each chunk's product goes unscaled to an f32 scratch
 * T, and promote_k adds T (sa(i, c) sb(j, c)) into an f32 total - the CPU's
 * arithmetic (cpu_fp8_gemm.c) with cuBLASLt's order of the f32 sums inside a
 * chunk; the total is rounded once into C.
 *
 * MX (two MX operands; the engine refuses MX with another granularity).
 * sm_90 has no MX tensor cores, so mx_gemm is ours: each operand decoded to
 * bf16 with its E8M0 power of two applied, then cuBLAS's bf16 GEMM with f32
 * sums into an f32 C (rounded once into C's dtype) - the CPU's folded MX
 * path (cpu_fp8_gemm.c) with cuBLAS's order of the f32 sums. The decoding
 * is exact (e4m3 / e5m2 significands fit bf16's 8 bits, a power of two only
 * moves the exponent) while every scaled element is a bf16 normal number:
 * block exponents 2^-117..2^119 for e4m3 (2^-9 .. 448 times them), 2^-110 ..
 * 2^112 for e5m2; past those an element rounds to a bf16 subnormal, zero or
 * infinity (the CPU stays exact there: it cuts k into the 32-blocks). A NaN
 * scale (0xff) makes its block NaN. fast_accum changes nothing here: f32 sums.
 *
 * Accumulation. fast_accum = 0 asks Lt for its precise FP8 accumulation
 * (CUBLASLT_MATMUL_DESC_FAST_ACCUM 0: partial sums promoted to f32), 1 lets
 * the tensor cores keep their own limited-precision sums (what DeepSeek-V3
 * measured); the hardware's exact rule is not documented, so only the CPU's
 * modelled accumulator is a model anyone can check bit for bit. Even the
 * precise mode is not f32 sums on the tensor cores: an H200 gave an rms
 * error of about 2^-13 of the outputs against the CPU's f32 sums (the parity
 * harness's "fp8 gemm" cases, which state the bound).
 *
 * What Lt declines. Its FP8 kernels want every matrix 16-byte aligned, D's
 * rows (our n times C's element size) and leading dimension included: on the
 * H200, n = 136 ran and n = 5 or 130 with an f32 C were declined. Such a
 * product (or any other Lt refuses, or Lt missing) runs as decoded_gemm: the
 * codes decoded to bf16 (exact: every e4m3 and e5m2 value is a bf16 value)
 * and cuBLAS's bf16 GEMM with f32 sums, per tensor or per 128-chunk, scaled
 * and promoted by promote_k as above - the CPU's arithmetic, with f32 sums
 * whatever fast_accum says, at bf16 tensor-core speed.
 *
 * No plan cache yet: a descriptor, three layouts and a heuristic per call
 * (host work of some microseconds).
 */
#include <cublasLt.h>
#include <limits.h>
#include "kernels/cuda/cuda.h"
extern "C" {
#include "kernels/fp8_scaled.h"
}

static cudaDataType lt_out(mp_dtype dt)
{
    return dt == MP_F16 ? CUDA_R_16F : dt == MP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static cudaDataType lt_fp8(mp_fp8_format f) { return f.mbits == 2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

/* one Lt call: D {n, m} (ld n, type out) = sB sA op(B') op(A') over len of k
 * from the codes at a, b (ld k); sa, sb device scales or NULL (1) */
static cublasStatus_t lt_call(mp_kctx *cx, cublasLtHandle_t h, int64_t m, int64_t n, int64_t len, int64_t k,
                              const uint8_t *a, mp_fp8_format fa, const float *sa, const uint8_t *b, mp_fp8_format fb,
                              const float *sb, int fast_accum, mp_dtype out, void *d)
{
    const int32_t opa = CUBLAS_OP_T, opb = CUBLAS_OP_N;
    const int8_t fast = fast_accum ? 1 : 0;
    uintptr_t u = 256 | (uintptr_t)a | (uintptr_t)b | (uintptr_t)d;
    const uint32_t al = (uint32_t)(u & -u);   /* the largest power of two up to 256 dividing all three */
    size_t ws_bytes;
    bool tf32;
    void *ws = mp_cuda_gemm_workspace(cx, &ws_bytes, &tf32);
    const uint64_t ws64 = ws_bytes;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t r;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
#define LT_TRY(call) \
    if (st == CUBLAS_STATUS_SUCCESS) st = (call)
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
    /* Lt's A is our B: its scale is B's */
    if (sb) LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sb, sizeof sb));
    if (sa) LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof sa));
    LT_TRY(cublasLtMatrixLayoutCreate(&la, lt_fp8(fb), (uint64_t)len, (uint64_t)n, k));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, lt_fp8(fa), (uint64_t)len, (uint64_t)m, k));
    LT_TRY(cublasLtMatrixLayoutCreate(&ld, lt_out(out), (uint64_t)n, (uint64_t)m, n));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws64, sizeof ws64));
    /* a chunk's operands start 128 bytes into their rows: the heuristic is told */
    for (int i = 0; i < 4; i++)
        LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, (cublasLtMatmulPreferenceAttributes_t)(
                                                        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i),
                                                    &al, sizeof al));
    LT_TRY(cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &r, &found));
    if (st == CUBLAS_STATUS_SUCCESS && found < 1) st = CUBLAS_STATUS_NOT_SUPPORTED;
    const float one = 1.0f, zero = 0.0f;
    LT_TRY(cublasLtMatmul(h, op, &one, b, la, a, lb, &zero, d, ld, d, ld, &r.algo, ws, ws_bytes, cx->stream));
#undef LT_TRY
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}

/* the decode scale of row r in chunk c (tensor: one; tile: per row; block: per 128 rows) */
static __device__ __forceinline__ float scale_of(int g, const float *s, int64_t r, int64_t c, int64_t nk)
{
    return g == MP_FP8_TENSOR ? s[0] : g == MP_FP8_TILE ? s[r * nk + c] : s[r / MP_FP8_BLOCK_ROWS * nk + c];
}

/* acc {m, n} = (first ? 0 : acc) + t (sa(i) sb(j)), the CPU's promotion */
static __global__ void promote_k(float *acc, const float *t, int64_t m, int64_t n, int first, int ga, const float *sa,
                                 int gb, const float *sb, int64_t c, int64_t nk)
{
    MP_FOR(e, m * n) {
        const int64_t i = e / n, j = e % n;
        const float s = scale_of(ga, sa, i, c, nk) * scale_of(gb, sb, j, c, nk);
        acc[e] = (first ? 0.0f : acc[e]) + t[e] * s;
    }
}

static __global__ void round_k(mp_dtype dt, void *out, const float *acc, int64_t n, unsigned long long *fc)
{
    mp_tally tl(fc);
    MP_FOR(i, n) mp_stc(dt, out, i, acc[i], tl);
    tl.commit();
}

/* x {rows, k} MX-scaled -> bf16 {rows, k}: each code's value times its
 * block's 2^(b - 127), rounded to bf16 (exact in bf16's normal range) */
static __global__ void mx_decode_k(const uint8_t *q, mp_fp8_format fmt, const uint8_t *e8, int64_t rows, int64_t k,
                                   uint16_t *out)
{
    const int64_t nb = (k + MP_FP8_MX_K - 1) / MP_FP8_MX_K;
    MP_FOR(i, rows * k) {
        const int64_t r = i / k, j = i % k;
        const uint8_t b = e8[r * nb + j / MP_FP8_MX_K];
        const float v = b == 0xff ? __int_as_float(0x7fc00000) : mp_fp8_to_f32(q[i], fmt) * ldexpf(1.0f, (int)b - 127);
        out[i] = mp_f32_to_bf16(v);
    }
}

/* two MX operands (the head): decoded to bf16, cuBLAS's bf16 GEMM into f32 */
static int mx_gemm(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a, const mp_fp8_operand *b,
                   mp_dtype out, void *c)
{
    cublasHandle_t h = mp_cuda_blas_handle(cx);
    if (!h) return 0;   /* noted */
    const size_t la = (2 * (size_t)(m * k) + 255) & ~(size_t)255, lb = (2 * (size_t)(n * k) + 255) & ~(size_t)255;
    const int64_t mn = m * n;
    char *s = (char *)mp_cuda_scratch(cx, la + lb + (out == MP_F32 ? 0 : sizeof(float) * (size_t)mn));
    if (!s) return -1;
    uint16_t *da = (uint16_t *)s, *db = (uint16_t *)(s + la);
    float *acc = out == MP_F32 ? (float *)c : (float *)(s + la + lb);
    MP_LAUNCH(mp_blocks(m * k), MP_THREADS, 0, cx->stream, mx_decode_k, a->q, a->fmt, (const uint8_t *)a->scales, m,
              k, da);
    MP_LAUNCH(mp_blocks(n * k), MP_THREADS, 0, cx->stream, mx_decode_k, b->q, b->fmt, (const uint8_t *)b->scales, n,
              k, db);
    MP_LAUNCHED("fp8_gemm: mx decode");
    /* row-major C {m, n} = A B^T is column-major C^T {n, m} = B' A'^T: B read
     * transposed from its {k, n} column-major storage (ld k), A as stored (ld k) */
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, db, CUDA_R_16BF,
                                     (int)k, da, CUDA_R_16BF, (int)k, &zero, acc, CUDA_R_32F, (int)n,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        mp_cuda_note(cx, mp_cuda_blas_error(st), "fp8_gemm: mx: cublasGemmEx");
        return 0;
    }
    if (out != MP_F32) {
        MP_LAUNCH(mp_blocks(mn), MP_THREADS, 0, cx->stream, round_k, out, c, (const float *)acc, mn, cx->flush);
        MP_LAUNCHED("fp8_gemm: round");
    }
    return 0;
}

/* FP8 codes -> bf16, exactly (every e4m3 / e5m2 value, NaN and the
 * infinities included, is a bf16 value) */
static __global__ void fp8_decode_k(const uint8_t *q, mp_fp8_format fmt, int64_t n, uint16_t *out)
{
    MP_FOR(i, n) out[i] = mp_f32_to_bf16(mp_fp8_to_f32(q[i], fmt));
}

/* a product Lt declines (the head): both operands decoded to bf16, cuBLAS's
 * bf16 GEMM into f32 over the whole of k (two tensor scales) or each
 * 128-chunk, promote_k applying the scales, one rounding into C */
static int decoded_gemm(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a,
                        const mp_fp8_operand *b, mp_dtype out, void *c)
{
    cublasHandle_t h = mp_cuda_blas_handle(cx);
    if (!h) return 0;   /* noted */
    const bool whole = a->g == MP_FP8_TENSOR && b->g == MP_FP8_TENSOR;
    const int64_t step = whole ? k : MP_FP8_TILE_K, nk = (k + step - 1) / step, mn = m * n;
    const size_t la = (2 * (size_t)(m * k) + 255) & ~(size_t)255, lb = (2 * (size_t)(n * k) + 255) & ~(size_t)255,
                 lt = (sizeof(float) * (size_t)mn + 255) & ~(size_t)255;
    char *s = (char *)mp_cuda_scratch(cx, la + lb + lt + (out == MP_F32 ? 0 : sizeof(float) * (size_t)mn));
    if (!s) return -1;
    uint16_t *da = (uint16_t *)s, *db = (uint16_t *)(s + la);
    float *t = (float *)(s + la + lb), *acc = out == MP_F32 ? (float *)c : (float *)(s + la + lb + lt);
    MP_LAUNCH(mp_blocks(m * k), MP_THREADS, 0, cx->stream, fp8_decode_k, a->q, a->fmt, m * k, da);
    MP_LAUNCH(mp_blocks(n * k), MP_THREADS, 0, cx->stream, fp8_decode_k, b->q, b->fmt, n * k, db);
    MP_LAUNCHED("fp8_gemm: decode");
    const float one = 1.0f, zero = 0.0f;
    for (int64_t ch = 0; ch < nk; ch++) {
        const int64_t j0 = ch * step, len = k - j0 < step ? k - j0 : step;
        /* as mx_gemm: column-major T^T {n, m} = B' A'^T over the chunk's columns of k */
        cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)len, &one, db + j0,
                                         CUDA_R_16BF, (int)k, da + j0, CUDA_R_16BF, (int)k, &zero, t, CUDA_R_32F,
                                         (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) {
            mp_cuda_note(cx, mp_cuda_blas_error(st), "fp8_gemm: decoded: cublasGemmEx");
            return 0;
        }
        MP_LAUNCH(mp_blocks(mn), MP_THREADS, 0, cx->stream, promote_k, acc, (const float *)t, m, n, ch == 0, (int)a->g,
                  (const float *)a->scales, (int)b->g, (const float *)b->scales, ch, nk);
        MP_LAUNCHED("fp8_gemm: promote");
    }
    if (out != MP_F32) {
        MP_LAUNCH(mp_blocks(mn), MP_THREADS, 0, cx->stream, round_k, out, c, (const float *)acc, mn, cx->flush);
        MP_LAUNCHED("fp8_gemm: round");
    }
    return 0;
}

/* 0 done, 1 declined (MX with another granularity, a size past int32), -1
 * out of memory; what Lt declines runs as decoded_gemm; any other failure is
 * noted as the sticky error */
extern "C" int mp_cuda_fp8_gemm(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a,
                                const mp_fp8_operand *b, int fast_accum, mp_dtype out, void *c)
{
    if (m <= 0 || n <= 0) return 0;
    if (k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX) return 1;
    if (a->g == MP_FP8_MX || b->g == MP_FP8_MX)
        return a->g == MP_FP8_MX && b->g == MP_FP8_MX ? mx_gemm(cx, m, n, k, a, b, out, c) : 1;
    cublasLtHandle_t h = mp_cuda_lt_handle(cx);
    if (!h) return decoded_gemm(cx, m, n, k, a, b, out, c);
    cublasStatus_t st;
    if (a->g == MP_FP8_TENSOR && b->g == MP_FP8_TENSOR) {
        st = lt_call(cx, h, m, n, k, k, a->q, a->fmt, (const float *)a->scales, b->q, b->fmt,
                     (const float *)b->scales, fast_accum, out, c);
    } else {
        const int64_t nk = (k + MP_FP8_TILE_K - 1) / MP_FP8_TILE_K, mn = m * n;
        float *t = (float *)mp_cuda_scratch(cx, sizeof(float) * (size_t)(out == MP_F32 ? mn : 2 * mn));
        if (!t) return -1;
        float *acc = out == MP_F32 ? (float *)c : t + mn;
        st = CUBLAS_STATUS_SUCCESS;
        for (int64_t ch = 0; ch < nk && st == CUBLAS_STATUS_SUCCESS; ch++) {
            const int64_t j0 = ch * MP_FP8_TILE_K, len = k - j0 < MP_FP8_TILE_K ? k - j0 : MP_FP8_TILE_K;
            st = lt_call(cx, h, m, n, len, k, a->q + j0, a->fmt, NULL, b->q + j0, b->fmt, NULL, fast_accum, MP_F32, t);
            if (st != CUBLAS_STATUS_SUCCESS) break;
            MP_LAUNCH(mp_blocks(mn), MP_THREADS, 0, cx->stream, promote_k, acc, (const float *)t, m, n, ch == 0,
                      (int)a->g, (const float *)a->scales, (int)b->g, (const float *)b->scales, ch, nk);
            MP_LAUNCHED("fp8_gemm: promote");
        }
        if (st == CUBLAS_STATUS_SUCCESS && out != MP_F32) {
            MP_LAUNCH(mp_blocks(mn), MP_THREADS, 0, cx->stream, round_k, out, c, (const float *)acc, mn, cx->flush);
            MP_LAUNCHED("fp8_gemm: round");
        }
    }
    /* declined before anything ran (the heuristic found no kernel), or at a
     * later chunk (a shorter last one): the whole product again, decoded */
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH || st == CUBLAS_STATUS_INVALID_VALUE)
        return decoded_gemm(cx, m, n, k, a, b, out, c);
    if (st != CUBLAS_STATUS_SUCCESS) mp_cuda_note(cx, mp_cuda_blas_error(st), "fp8_gemm: cublasLtMatmul");
    return 0;
}

/* the backend's fp8_gemm (kernels/backend.h): the modelled accumulator is the
 * CPU's alone (declined); fast is cuBLASLt's FAST_ACCUM (MX: f32 sums) */
int mp_cuda_fp8_gemm_entry(mp_kctx *cx, int64_t m, int64_t n, int64_t k, const mp_fp8_operand *a,
                           const mp_fp8_operand *b, int acc_bits, int64_t promote_every, int acc_round, int fast,
                           mp_dtype out, void *c)
{
    if (acc_bits) return 1;
    return mp_cuda_fp8_gemm(cx, m, n, k, a, b, fast, out, c);
}
