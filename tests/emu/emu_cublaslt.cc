/*
 * emu_cublaslt.cc: the cuBLASLt calls of kernels/cuda/cuda_gemm_lt.cu on the
 * emulated device: handles, matmul descriptors, matrix layouts, preferences,
 * the heuristic and cublasLtMatmul.
 *
 * Arguments are checked as cuBLASLt's manual states them: a descriptor
 * attribute's size must match its storage (else INVALID_VALUE); op(A) is
 * {m, k}, op(B) {k, n}, C and D {m, n} with the same type, rows, columns and
 * order, and C == D (in place) only with the same layout (leading dimension
 * too); a column-major leading dimension at least the rows; TRANSC only N; the
 * (A, B, C/D, compute, scale) types one of the manual's f32-compute
 * combinations; the bias vector (CUBLASLT_EPILOGUE_BIAS) of D's rows, of D's
 * type (the BIAS_DATA_TYPE default, -1, or that type), in device memory; the
 * GELU_AUX_BIAS epilogue's auxiliary matrix (the pre-activation) of D's
 * shape and type (AUX_DATA_TYPE unset, -1, or D's type), its AUX_LD at least
 * D's rows and divisible by 8, as the manual states, inside its device
 * allocation; the
 * workspace 256-byte aligned device memory of at least what the algo needs;
 * alpha and beta on the host in host pointer mode; every matrix inside its
 * allocation. What is not emulated (other epilogues, orders, batches, pointer
 * modes) is refused as NOT_SUPPORTED, naming it.
 *
 * The heuristic returns one algo that remembers the problem it was found for
 * (types, shapes, transposes, epilogue), the alignment it assumes for A, B, C,
 * D (the preference's minimum alignments, 256 bytes by default) and for the
 * bias (its pointer's alignment in the descriptor at that time, as the manual
 * says the heuristic reads it), and how it splits k. cublasLtMatmul refuses an
 * algo found for another problem, a pointer less aligned than the algo
 * assumes, and a workspace smaller than the algo needs (INVALID_VALUE: the
 * manual's "parameters in conflict"; what the real library does with a
 * misaligned pointer is not documented, so refusing it is the strict choice).
 *
 * Split-K is modelled as the preference allows it (its REDUCTION_SCHEME_MASK,
 * all schemes by default): for k > 1024, partial products over runs of 1024
 * of k, reduced in the output type (OUTPUT_TYPE, or INPLACE: each partial
 * rounded to D's type and added in it, when D is 16-bit and the workspace
 * allows), else in f32 (COMPUTE_TYPE, when the workspace holds the partials;
 * computed in the CPU's order, since only the order of the f32 sums changes).
 * A backend that does not restrict the mask gets several roundings on long-k
 * 16-bit products, as cuBLASLt may give it.
 *
 * The product is queued on the call's stream through queue_product, the
 * queueing of cuBLAS's own products (emu_cublas.cc), and computed from the
 * column-major operands through their leading dimensions and transposes with
 * the CPU backend's gemm: the bias is added to the f32 sums before the one
 * rounding (a C holding the bias rows, accumulated with beta 1: the engine's
 * CPU arithmetic for a linear layer), so a wrong layout gives wrong numbers.
 * GELU_AUX_BIAS: the f32 sums plus the bias are rounded to D's type into the
 * auxiliary matrix, and D is the CPU backend's f32 GELU of the unrounded sums
 * in its tanh form (taken as cuBLASLt's), rounded once. BGRADB: the bias
 * pointer receives the sums of op(B)'s columns over k (D's columns' count of
 * them, the bias type unset or D's), summed in double and rounded to f32 and
 * then D's type, a model of cuBLASLt's f32 reduction, whose order is not
 * documented.
 *
 * FP8 (e4m3 / e5m2 A and B): the manual's rules for sm_89 / sm_90 are checked
 * (check_fp8: the TN form only, not two e5m2, leading dimensions of 16, f32 /
 * bf16 / f16 C = D whose rows and leading dimension span multiples of 16
 * bytes), the A and B scale pointers and AMAX_D are honoured, and
 * the product is the CPU's FP8 GEMM (run_fp8), FAST_ACCUM answered with its
 * modelled 14-bit accumulator.
 */
#include <stdio.h>
#include <string.h>
#include <set>
#include <vector>
#include <cublasLt.h>
#include "tests/emu/emu.h"
#include "tests/emu/emu_values.h"
extern "C" {
#include "kernels/cpu/cpu_fp8.h"
}

using namespace mp_emu;

#define SPLIT_K 1024
#define ALGO_MAGIC 0x454d554c54414c47ull   /* "EMULTALG" */

struct cublasLtContext {
    int unused;
};

namespace {

struct desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t pointer_mode, transa, transb, transc;
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type;
    int64_t bias_stride;
    const void *scale_a, *scale_b, *scale_d, *amax_d;   /* FP8: device f32 pointers, NULL unset */
    int8_t fast_accum;
    void *aux;           /* GELU_AUX_BIAS: the pre-activation's matrix */
    int64_t aux_ld;
    int32_t aux_type;    /* -1: D's */
};

struct layout {
    cudaDataType_t type;
    int32_t order, batch;
    uint64_t rows, cols;
    int64_t ld, stride;
};

struct pref {
    uint32_t search;
    uint64_t max_ws;
    uint32_t reduction_mask;
    uint32_t align[4];   /* A, B, C, D */
};

/* what an algo remembers (cublasLtMatmulAlgo_t's 8 words) */
struct algo_words {
    uint64_t magic, problem, scheme, ws, align_abcd, align_bias, unused[2];
};
static_assert(sizeof(algo_words) == sizeof(cublasLtMatmulAlgo_t), "an algo is 8 words");

std::set<const void *> &live = *new std::set<const void *>;   /* never destroyed: see emu_runtime.cc */

static cublasStatus_t bad(cublasStatus_t s, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static cublasStatus_t bad(cublasStatus_t s, const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s = blas_refused("cuBLASLt", s, call, fmt, ap);
    va_end(ap);
    return s;
}

template <class T> T *make()
{
    T *p = new T();
    live.insert(p);
    return p;
}
template <class T> bool drop(T *p)
{
    if (!p || !live.count(p)) return false;
    live.erase(p);
    delete p;
    return true;
}
bool alive(const void *p) { return p && live.count(p); }

/* an attribute's value, its size checked as the manual says (buf NULL or the
 * size not the attribute's: INVALID_VALUE) */
template <class T> bool take(const char *call, int attr, const void *buf, size_t size, T *out)
{
    if (!buf || size != sizeof(T)) {
        bad(CUBLAS_STATUS_INVALID_VALUE, call, "attribute %d takes %zu bytes (got %zu%s)", attr, sizeof(T), size,
            buf ? "" : ", buf NULL");
        return false;
    }
    memcpy(out, buf, sizeof(T));
    return true;
}

uint32_t alignment_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    uint32_t a = 1;
    while (a < 256 && !(u & a)) a <<= 1;
    return a;
}

bool type_ok(cudaDataType_t t) { return t == CUDA_R_16F || t == CUDA_R_16BF || t == CUDA_R_32F; }
bool fp8_type(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
mp_dtype dtype_of(cudaDataType_t t) { return t == CUDA_R_16F ? MP_F16 : t == CUDA_R_16BF ? MP_BF16 : MP_F32; }
size_t elem_size(cudaDataType_t t) { return fp8_type(t) ? 1 : mp_dtype_size(dtype_of(t)); }

/* the problem a call describes, checked: m, n, k and the types */
struct problem {
    bool ta, tb;
    int64_t m, n, k;
    mp_dtype at, dt;
    bool bias, tf32, gelu;         /* gelu: GELU_AUX_BIAS */
    bool bgradb;                   /* BGRADB: the bias gradient of op(B) written to the bias pointer */
    bool fp8, fast_accum;          /* FP8 A and B (the TN form), FAST_ACCUM */
    mp_fp8_format fa, fb;
    uint64_t signature;
};

/* the manual's FP8 rules (sm_89 / sm_90): A and B FP8, not both e5m2, the TN
 * form only (TRANSA T, TRANSB N), leading dimensions of A and B multiples of
 * 16 bytes, f32 compute and scale, C and D f32 / bf16 / f16 of one type (FP8
 * D, beta != 0 with FP8 and the other epilogues are not emulated), and every
 * matrix 16-byte aligned, D's rows and leading dimension included (what an
 * H200 did: 136 rows of f32 or bf16 ran, 5 or 130 rows of f32 were declined) */
cublasStatus_t check_fp8(const char *call, const desc *op, const layout *A, const layout *B, const layout *C,
                         const layout *D, problem *p)
{
    if (!fp8_type(A->type) || !fp8_type(B->type) || (A->type == CUDA_R_8F_E5M2 && B->type == CUDA_R_8F_E5M2))
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8: A type %d and B type %d must both be FP8, not both e5m2",
                   (int)A->type, (int)B->type);
    if (op->transa != CUBLAS_OP_T || op->transb != CUBLAS_OP_N)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8 takes only the TN form (TRANSA T, TRANSB N); got %d, %d",
                   (int)op->transa, (int)op->transb);
    if (A->ld % 16 || B->ld % 16)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8: lda %lld and ldb %lld must be multiples of 16",
                   (long long)A->ld, (long long)B->ld);
    if (op->compute != CUBLAS_COMPUTE_32F || op->scale != CUDA_R_32F)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8: compute %d and scale type %d must be 32F", (int)op->compute,
                   (int)op->scale);
    if (!type_ok(D->type) || C->type != D->type)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8: C %d and D %d must be one of f32, bf16, f16 (FP8 D is not "
                   "emulated)", (int)C->type, (int)D->type);
    if ((D->rows * elem_size(D->type)) % 16 || ((uint64_t)D->ld * elem_size(D->type)) % 16)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8: D's %llu rows and leading dimension %lld of type %d must "
                   "span multiples of 16 bytes", (unsigned long long)D->rows, (long long)D->ld, (int)D->type);
    if (op->epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8: epilogue %u is not emulated", op->epilogue);
    if (op->scale_d)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8: a D scale pointer (for an FP8 D) is not emulated");
    p->fa = A->type == CUDA_R_8F_E5M2 ? MP_FP8_E5M2 : MP_FP8_E4M3;
    p->fb = B->type == CUDA_R_8F_E5M2 ? MP_FP8_E5M2 : MP_FP8_E4M3;
    p->fast_accum = op->fast_accum != 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_problem(const char *call, const desc *op, const layout *A, const layout *B, const layout *C,
                             const layout *D, problem *p)
{
    if (!alive(op)) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "not a live matmul descriptor");
    if (!alive(A) || !alive(B) || !alive(C) || !alive(D))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "a matrix layout (A %p, B %p, C %p, D %p) is not live",
                   (const void *)A, (const void *)B, (const void *)C, (const void *)D);
    const layout *ls[4] = {A, B, C, D};
    const char *names = "ABCD";
    for (int i = 0; i < 4; i++) {
        const layout *l = ls[i];
        if (l->order != CUBLASLT_ORDER_COL)
            return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "%c: order %d is not emulated (column-major only)", names[i],
                       (int)l->order);
        if (l->batch != 1)
            return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "%c: batch count %d is not emulated (1 only)", names[i],
                       (int)l->batch);
        if (l->rows > INT32_MAX || l->cols > INT32_MAX)
            return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "%c: {%llu, %llu} is past int32", names[i],
                       (unsigned long long)l->rows, (unsigned long long)l->cols);
        if (l->ld < 1 || (uint64_t)l->ld < l->rows)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "%c: ld %lld < rows %llu (column-major: columns would overlap)",
                       names[i], (long long)l->ld, (unsigned long long)l->rows);
        if (!type_ok(l->type) && !(i < 2 && fp8_type(l->type)))
            return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "%c: type %d is not emulated", names[i], (int)l->type);
    }
    if (op->transc != CUBLAS_OP_N) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "TRANSC %d: only N", (int)op->transc);
    for (int32_t t : {op->transa, op->transb})
        if (t != CUBLAS_OP_N && t != CUBLAS_OP_T && t != CUBLAS_OP_C)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "TRANSA %d, TRANSB %d", (int)op->transa, (int)op->transb);
    if (op->pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "pointer mode %d is not emulated (host only)", (int)op->pointer_mode);
    p->ta = op->transa != CUBLAS_OP_N, p->tb = op->transb != CUBLAS_OP_N;
    const int64_t m = (int64_t)(p->ta ? A->cols : A->rows), k = (int64_t)(p->ta ? A->rows : A->cols);
    const int64_t kb = (int64_t)(p->tb ? B->cols : B->rows), n = (int64_t)(p->tb ? B->rows : B->cols);
    if (k != kb || (int64_t)D->rows != m || (int64_t)D->cols != n)
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "op(A) {%lld, %lld}, op(B) {%lld, %lld}, D {%llu, %llu}: "
                   "not {m, k}, {k, n}, {m, n}", (long long)m, (long long)k, (long long)kb, (long long)n,
                   (unsigned long long)D->rows, (unsigned long long)D->cols);
    if (C->rows != D->rows || C->cols != D->cols || C->type != D->type)
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "C {%llu, %llu} type %d and D {%llu, %llu} type %d differ",
                   (unsigned long long)C->rows, (unsigned long long)C->cols, (int)C->type,
                   (unsigned long long)D->rows, (unsigned long long)D->cols, (int)D->type);
    const cublasComputeType_t ct = op->compute;
    p->fp8 = fp8_type(A->type) || fp8_type(B->type);
    if (p->fp8) {
        cublasStatus_t s = check_fp8(call, op, A, B, C, D, p);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    const bool c32 = ct == CUBLAS_COMPUTE_32F || ct == CUBLAS_COMPUTE_32F_PEDANTIC || ct == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                     ct == CUBLAS_COMPUTE_32F_FAST_16F || ct == CUBLAS_COMPUTE_32F_FAST_16BF;
    const cudaDataType_t at = A->type, dt = D->type;
    const bool types = p->fp8 || (A->type == B->type && ((at == CUDA_R_16F && (dt == CUDA_R_16F || dt == CUDA_R_32F)) ||
                                              (at == CUDA_R_16BF && (dt == CUDA_R_16BF || dt == CUDA_R_32F)) ||
                                              (at == CUDA_R_32F && dt == CUDA_R_32F)));
    if (!c32 || op->scale != CUDA_R_32F || !types)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "types A %d, B %d, C/D %d, compute %d, scale %d: not among the "
                   "f32-compute combinations of the manual (the only ones emulated)", (int)A->type, (int)B->type,
                   (int)dt, (int)ct, (int)op->scale);
    const uint32_t epi = op->epilogue;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_BIAS && epi != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
        epi != CUBLASLT_EPILOGUE_BGRADB)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "epilogue %u is not emulated (DEFAULT, BIAS, GELU_AUX_BIAS and "
                   "BGRADB only)", epi);
    p->bgradb = epi == CUBLASLT_EPILOGUE_BGRADB;
    if (p->bgradb && op->bias_type != -1 && op->bias_type != (int32_t)dt)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "BGRADB: bias type %d: the bias gradient has D's type %d here",
                   (int)op->bias_type, (int)dt);
    p->bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    p->gelu = epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    if (p->gelu && (op->aux_ld < (int64_t)D->rows || op->aux_ld % 8))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "GELU_AUX_BIAS: AUX_LD %lld must be at least D's %llu rows and "
                   "divisible by 8", (long long)op->aux_ld, (unsigned long long)D->rows);
    if (p->gelu && op->aux_type != -1 && op->aux_type != (int32_t)dt)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "GELU_AUX_BIAS: aux type %d: the aux matrix has D's type %d here",
                   (int)op->aux_type, (int)dt);
    if (p->bias && op->bias_type != -1 && op->bias_type != (int32_t)dt)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "bias type %d: the bias has D's type %d here", (int)op->bias_type,
                   (int)dt);
    p->m = m, p->n = n, p->k = k, p->at = dtype_of(at), p->dt = dtype_of(dt);
    p->tf32 = at == CUDA_R_32F && ct == CUBLAS_COMPUTE_32F_FAST_TF32;
    if (p->fp8) p->at = MP_U8;   /* one byte a code; run_fp8 reads them */
    uint64_t s = 1469598103934665603ull;
    for (uint64_t v : {(uint64_t)m, (uint64_t)n, (uint64_t)k, (uint64_t)p->ta, (uint64_t)p->tb, (uint64_t)at,
                       (uint64_t)B->type, (uint64_t)dt, (uint64_t)ct, (uint64_t)epi, (uint64_t)op->fast_accum})
        s = (s ^ v) * 1099511628211ull;
    p->signature = s;
    return CUBLAS_STATUS_SUCCESS;
}

/* a column-major {rows, cols} matrix with leading dimension ld inside its allocation, in device memory */
bool matrix_ok(const char *call, const char *name, const void *p, const layout *l)
{
    if (l->rows == 0 || l->cols == 0) return true;
    region r;
    if (!find_region(p, &r) || !(r.kind & (MEM_DEVICE | MEM_SYMBOL))) {
        bad(CUBLAS_STATUS_INVALID_VALUE, call, "%s %p is not device memory", name, p);
        return false;
    }
    const size_t es = elem_size(l->type);
    const uint64_t span = (uint64_t)l->ld * (l->cols - 1) + l->rows;
    const uint64_t room = (r.size - (size_t)((const char *)p - r.base)) / es;
    if (span > room) {
        bad(CUBLAS_STATUS_INVALID_VALUE, call, "%s spans %llu elements (ld %lld) but its allocation has %llu from %p",
            name, (unsigned long long)span, (long long)l->ld, (unsigned long long)room, p);
        return false;
    }
    return true;
}

/* the queued product: op(A) and op(B) gathered row-major, C through its ld,
 * the CPU's gemm, D written through its ld */
struct lt_job {
    problem p;
    const char *A, *B, *C, *bias;
    char *D;
    int64_t lda, ldb, ldc, ldd;
    float alpha, beta;
    uint64_t scheme;   /* 0: one pass; else how the runs of SPLIT_K are reduced */
    char *aux;         /* GELU_AUX_BIAS's pre-activation, ld ldaux */
    int64_t ldaux;
};

bool run_job(const lt_job &j)
{
    const int64_t m = j.p.m, n = j.p.n, k = j.p.k;
    const mp_dtype at = j.p.at, dt = j.p.dt;
    const size_t ea = mp_dtype_size(at), ed = mp_dtype_size(dt);
    /* in the operands' dtype when D has it and nothing changes the numbers
     * (the CPU's own one-rounding gemm), else f32 on widened operands */
    /* a split reduced in f32 (COMPUTE_TYPE) only orders the f32 sums another
     * way: computed in the CPU's order, as emu_cublas.cc does when reductions
     * in 16 bits are disallowed; reductions in D's type change the numbers */
    const bool split16 = j.scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE || j.scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE;
    const bool native = at == dt && !j.p.tf32 && !split16 && (j.beta == 0.0f || !j.p.bias) && !j.p.gelu;
    const mp_dtype wt = native ? at : MP_F32;
    const size_t es = mp_dtype_size(wt);
    std::vector<char> a((size_t)(m * k) * es + 1), b((size_t)(k * n) * es + 1), c((size_t)(m * n) * es + 1);
    auto get = [&](const char *base, int64_t src, char *dst) {
        if (native) memcpy(dst, base + (size_t)src * ea, es);
        else {
            float v = load_f32(at, base, (size_t)src);
            *(float *)dst = j.p.tf32 ? tf32(v) : v;
        }
    };
    for (int64_t i = 0; i < m; i++)
        for (int64_t l = 0; l < k; l++) get(j.A, j.p.ta ? l + i * j.lda : i + l * j.lda, &a[(size_t)(i * k + l) * es]);
    for (int64_t l = 0; l < k; l++)
        for (int64_t q = 0; q < n; q++) get(j.B, j.p.tb ? q + l * j.ldb : l + q * j.ldb, &b[(size_t)(l * n + q) * es]);
    /* C's start: beta C (+ the bias, in f32), or the bias rows alone with beta
     * 1 for the CPU's gemm to add the products to before its one rounding */
    float beta = j.beta;
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < n; q++) {
            char *dst = &c[(size_t)(i * n + q) * es];
            if (native && j.p.bias) memcpy(dst, j.bias + (size_t)i * ed, es);
            else if (native && j.beta != 0.0f) memcpy(dst, j.C + (size_t)(i + q * j.ldc) * ed, es);
            else if (native) memset(dst, 0, es);   /* beta 0: C is not read (it may be anything) */
            else {
                float v = j.beta != 0.0f ? j.beta * load_f32(dt, j.C, (size_t)(i + q * j.ldc)) : 0.0f;
                *(float *)dst = j.p.bias ? v + load_f32(dt, j.bias, (size_t)i) : v;
            }
        }
    if (j.p.bias || !native) beta = (j.p.bias || j.beta != 0.0f) ? 1.0f : 0.0f;
    const mp_backend &cpu = mp_cpu_backend;
    if (!split16) {
        if (cpu.gemm(cpu.ctx, wt, 0, 0, 1, m, n, k, j.alpha, a.data(), 0, b.data(), 0, beta, c.data(), 0) != 0)
            return false;
    } else {
        /* split-K: f32 partials over runs of SPLIT_K of k, each rounded to D's
         * type and added in it */
        std::vector<float> part((size_t)(m * n)), acc((size_t)(m * n), 0.0f), as((size_t)(m * SPLIT_K) + 1),
            bs((size_t)(SPLIT_K * n) + 1);
        for (int64_t l0 = 0; l0 < k; l0 += SPLIT_K) {
            const int64_t len = k - l0 < SPLIT_K ? k - l0 : SPLIT_K;
            for (int64_t i = 0; i < m; i++)
                memcpy(&as[(size_t)(i * len)], (float *)a.data() + i * k + l0, sizeof(float) * (size_t)len);
            memcpy(bs.data(), (float *)b.data() + l0 * n, sizeof(float) * (size_t)(len * n));
            if (cpu.gemm(cpu.ctx, MP_F32, 0, 0, 1, m, n, len, 1.0f, as.data(), 0, bs.data(), 0, 0.0f, part.data(), 0) != 0)
                return false;
            for (size_t e = 0; e < part.size(); e++)
                acc[e] = l0 == 0 ? round_to(dt, part[e]) : round_to(dt, acc[e] + round_to(dt, part[e]));
        }
        float *cf = (float *)c.data();
        for (size_t e = 0; e < acc.size(); e++) cf[e] = j.alpha * acc[e] + (beta != 0.0f ? beta * cf[e] : 0.0f);
    }
    if (j.p.bgradb)   /* op(B)'s column sums over k into the bias pointer */
        for (int64_t q = 0; q < n; q++) {
            double sum = 0;
            for (int64_t l = 0; l < k; l++) sum += load_f32(wt, b.data(), (size_t)(l * n + q));
            store_f32(dt, (char *)j.bias, (size_t)q, (float)sum);
        }
    if (j.p.gelu) {   /* the f32 pre-activations rounded into aux, their GELU (f32, the tanh form) into D */
        std::vector<float> y((size_t)(m * n));
        cpu.unary(cpu.ctx, MP_GELU, MP_F32, y.data(), c.data(), m * n, 1.0);
        for (int64_t i = 0; i < m; i++)
            for (int64_t q = 0; q < n; q++) {
                store_f32(dt, j.aux, (size_t)(i + q * j.ldaux), ((const float *)c.data())[i * n + q]);
                store_f32(dt, j.D, (size_t)(i + q * j.ldd), y[(size_t)(i * n + q)]);
            }
        return true;
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < n; q++) {
            const char *src = &c[(size_t)(i * n + q) * es];
            if (native) memcpy(j.D + (size_t)(i + q * j.ldd) * ed, src, es);
            else store_f32(dt, j.D, (size_t)(i + q * j.ldd), *(const float *)src);
        }
    return true;
}

/* an FP8 product: D = alpha (sA sB) op(A) op(B) by the CPU's FP8 GEMM
 * (kernels/cpu/cpu_fp8_gemm.c): the codes decoded exactly, f32 sums, the
 * scales (read when the product runs, as the device would) applied to the
 * sums, rounded once into D. FAST_ACCUM 1 is answered with the CPU's model of
 * a limited accumulator, 14 bits without promotion: a stand-in for the
 * tensor cores' undocumented sums, not a copy of them. AMAX_D: the largest
 * |D| (f32) written to its pointer. */
bool run_fp8(const lt_job &j, const desc &op)
{
    const int64_t m = j.p.m, n = j.p.n, k = j.p.k;
    std::vector<uint8_t> a((size_t)(m * k) + 1), b((size_t)(n * k) + 1);
    for (int64_t i = 0; i < m; i++) memcpy(&a[(size_t)(i * k)], j.A + i * j.lda, (size_t)k);
    for (int64_t q = 0; q < n; q++) memcpy(&b[(size_t)(q * k)], j.B + q * j.ldb, (size_t)k);
    const float sa = op.scale_a ? *(const float *)op.scale_a : 1.0f, sb = op.scale_b ? *(const float *)op.scale_b : 1.0f;
    mp_fp8_operand oa = {a.data(), j.p.fa, MP_FP8_TENSOR, &sa}, ob = {b.data(), j.p.fb, MP_FP8_TENSOR, &sb};
    std::vector<float> c((size_t)(m * n));
    if (cpu_fp8_gemm(mp_cpu_backend.ctx, m, n, k, &oa, &ob, j.p.fast_accum ? 14 : 0, 0, MP_F32, c.data()) != 0)
        return false;
    float amax = 0.0f;
    for (int64_t i = 0; i < m; i++)
        for (int64_t q = 0; q < n; q++) {
            float v = c[(size_t)(i * n + q)];
            if (j.alpha != 1.0f) v *= j.alpha;
            amax = fabsf(v) > amax || v != v ? fabsf(v) : amax;
            store_f32(j.p.dt, j.D, (size_t)(i + q * j.ldd), v);
        }
    if (op.amax_d) *(float *)op.amax_d = amax;
    return true;
}

/* how an algo for p under preference pr splits k, and the workspace that takes */
void choose_split(const problem &p, const pref &pr, uint64_t *scheme, uint64_t *ws)
{
    *scheme = 0, *ws = 0;
    if (p.k <= SPLIT_K || p.fp8) return;   /* FP8: one pass (its promotion is the model's business) */
    const uint64_t runs = (uint64_t)((p.k + SPLIT_K - 1) / SPLIT_K), mn = (uint64_t)(p.m * p.n);
    const bool narrow = p.dt != MP_F32;
    const uint64_t out_ws = runs * mn * mp_dtype_size(p.dt), f32_ws = runs * mn * 4, counters = 4096;
    if (narrow && (pr.reduction_mask & CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE) && pr.max_ws >= out_ws)
        *scheme = CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE, *ws = out_ws;
    else if (narrow && (pr.reduction_mask & CUBLASLT_REDUCTION_SCHEME_INPLACE) && pr.max_ws >= counters)
        *scheme = CUBLASLT_REDUCTION_SCHEME_INPLACE, *ws = counters;
    else if ((pr.reduction_mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) && pr.max_ws >= f32_ws)
        *scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, *ws = f32_ws;
}

const pref default_pref = {CUBLASLT_SEARCH_BEST_FIT, 0, CUBLASLT_REDUCTION_SCHEME_MASK, {256, 256, 256, 256}};

}  // namespace

/* ---- the API ---- */

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    if (!h) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "NULL handle pointer");
    *h = make<cublasLtContext>();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    if (!drop(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, "cublasLtDestroy", "not a live handle");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale)
{
    if (!d) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "NULL descriptor pointer");
    desc *o = make<desc>();
    o->compute = compute, o->scale = scale, o->pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    o->transa = o->transb = o->transc = CUBLAS_OP_N, o->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    o->bias = NULL, o->bias_type = -1, o->bias_stride = 0;
    o->scale_a = o->scale_b = o->scale_d = o->amax_d = NULL, o->fast_accum = 0;
    o->aux = NULL, o->aux_ld = 0, o->aux_type = -1;
    *d = (cublasLtMatmulDesc_t)o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    if (!drop((desc *)d)) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescDestroy", "not a live descriptor");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    static const char *call = "cublasLtMatmulDescSetAttribute";
    desc *o = (desc *)d;
    if (!alive(o)) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "not a live descriptor");
    bool ok;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: {
        int32_t v;
        if ((ok = take(call, attr, buf, size, &v))) o->compute = (cublasComputeType_t)v;
        break;
    }
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: {
        int32_t v;
        if ((ok = take(call, attr, buf, size, &v))) o->scale = (cudaDataType_t)v;
        break;
    }
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: ok = take(call, attr, buf, size, &o->pointer_mode); break;
    case CUBLASLT_MATMUL_DESC_TRANSA: ok = take(call, attr, buf, size, &o->transa); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: ok = take(call, attr, buf, size, &o->transb); break;
    case CUBLASLT_MATMUL_DESC_TRANSC: ok = take(call, attr, buf, size, &o->transc); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = take(call, attr, buf, size, &o->epilogue); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = take(call, attr, buf, size, &o->bias); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = take(call, attr, buf, size, &o->bias_type); break;
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: ok = take(call, attr, buf, size, &o->bias_stride); break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: ok = take(call, attr, buf, size, &o->scale_a); break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: ok = take(call, attr, buf, size, &o->scale_b); break;
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: ok = take(call, attr, buf, size, &o->scale_d); break;
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: ok = take(call, attr, buf, size, &o->amax_d); break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: ok = take(call, attr, buf, size, &o->fast_accum); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: ok = take(call, attr, buf, size, &o->aux); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: ok = take(call, attr, buf, size, &o->aux_ld); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: ok = take(call, attr, buf, size, &o->aux_type); break;
    default: return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "attribute %d is not emulated", (int)attr);
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld)
{
    if (!l) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate", "NULL layout pointer");
    layout *o = make<layout>();
    o->type = type, o->order = CUBLASLT_ORDER_COL, o->batch = 1, o->rows = rows, o->cols = cols, o->ld = ld, o->stride = 0;
    *l = (cublasLtMatrixLayout_t)o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    if (!drop((layout *)l)) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutDestroy", "not a live layout");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t size)
{
    static const char *call = "cublasLtMatrixLayoutSetAttribute";
    layout *o = (layout *)l;
    if (!alive(o)) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "not a live layout");
    bool ok;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: {
        uint32_t v;
        if ((ok = take(call, attr, buf, size, &v))) o->type = (cudaDataType_t)v;
        break;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ok = take(call, attr, buf, size, &o->order); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: ok = take(call, attr, buf, size, &o->rows); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: ok = take(call, attr, buf, size, &o->cols); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: ok = take(call, attr, buf, size, &o->ld); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: ok = take(call, attr, buf, size, &o->batch); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: ok = take(call, attr, buf, size, &o->stride); break;
    default: return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "attribute %d is not emulated", (int)attr);
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    if (!p) return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "NULL preference pointer");
    pref *o = make<pref>();
    *o = default_pref;
    *p = (cublasLtMatmulPreference_t)o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    if (!drop((pref *)p))
        return bad(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceDestroy", "not a live preference");
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size)
{
    static const char *call = "cublasLtMatmulPreferenceSetAttribute";
    pref *o = (pref *)p;
    if (!alive(o)) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "not a live preference");
    bool ok;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: ok = take(call, attr, buf, size, &o->search); break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: ok = take(call, attr, buf, size, &o->max_ws); break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: ok = take(call, attr, buf, size, &o->reduction_mask); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: ok = take(call, attr, buf, size, &o->align[0]); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: ok = take(call, attr, buf, size, &o->align[1]); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: ok = take(call, attr, buf, size, &o->align[2]); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: ok = take(call, attr, buf, size, &o->align[3]); break;
    default: return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "attribute %d is not emulated", (int)attr);
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t p, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    static const char *call = "cublasLtMatmulAlgoGetHeuristic";
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
    if (requested <= 0 || !results || !returned)
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "requestedAlgoCount %d (must be > 0), results %p, returned %p",
                   requested, (void *)results, (void *)returned);
    if (!alive(p)) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "not a live preference");
    const pref &pr = *(const pref *)p;
    if (pr.search != CUBLASLT_SEARCH_BEST_FIT)
        return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "search mode %u is not emulated", pr.search);
    problem pb;
    cublasStatus_t s = check_problem(call, (const desc *)d, (const layout *)A, (const layout *)B, (const layout *)C,
                                     (const layout *)D, &pb);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    algo_words w = {};
    w.magic = ALGO_MAGIC, w.problem = pb.signature;
    choose_split(pb, pr, &w.scheme, &w.ws);
    for (int i = 0; i < 4; i++) {
        uint32_t a = pr.align[i];
        if (a == 0 || (a & (a - 1)) || a > 256)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "minimum alignment %u of %c is not a power of two up to 256",
                       a, "ABCD"[i]);
        w.align_abcd |= (uint64_t)a << (16 * i);
    }
    const desc *op = (const desc *)d;
    w.align_bias = pb.bias || pb.bgradb ? (op->bias ? alignment_of(op->bias) : 256) : 1;
    memset(&results[0], 0, sizeof results[0]);
    memcpy(&results[0].algo, &w, sizeof w);
    results[0].workspaceSize = w.ws;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_size, cudaStream_t stream)
{
    static const char *call = "cublasLtMatmul";
    if (!alive(h)) return bad(CUBLAS_STATUS_NOT_INITIALIZED, call, "not a live handle");
    const desc *op = (const desc *)d;
    const layout *la = (const layout *)Ad, *lb = (const layout *)Bd, *lc = (const layout *)Cd, *ld = (const layout *)Dd;
    problem pb;
    cublasStatus_t s = check_problem(call, op, la, lb, lc, ld, &pb);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
    if (!stream_valid(stream)) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "stream %p is not live", (void *)stream);
    region ra, rb;
    if (!alpha || !beta || (find_region(alpha, &ra) && (ra.kind & (MEM_DEVICE | MEM_SYMBOL))) ||
        (find_region(beta, &rb) && (rb.kind & (MEM_DEVICE | MEM_SYMBOL))))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "alpha %p and beta %p must be host memory in host pointer mode",
                   alpha, beta);
    /* in place: C == D with C's layout D's; out of place the leading dimensions may differ */
    if (C == D && (lc->ld != ld->ld || lc->order != ld->order))
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "C == D (in place) with ldc %lld and ldd %lld: the layouts must "
                   "be the same", (long long)lc->ld, (long long)ld->ld);
    algo_words w;
    if (algo) {
        memcpy(&w, algo, sizeof w);
        if (w.magic != ALGO_MAGIC) return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the algo is not one the heuristic gave");
        if (w.problem != pb.signature)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the algo was found for another problem (shape, types, "
                       "transposes or epilogue)");
    } else {   /* the manual: an implicit heuristic with the default preference (no workspace) */
        w = {};
        w.magic = ALGO_MAGIC, w.problem = pb.signature, w.align_abcd = 0x0100010001000100ull;
        w.align_bias = (pb.bias || pb.bgradb) && op->bias ? alignment_of(op->bias) : 1;
        choose_split(pb, default_pref, &w.scheme, &w.ws);
    }
    if (ws_size < w.ws)
        return bad(CUBLAS_STATUS_INVALID_VALUE, call, "workspace of %zu bytes; the algo needs %llu", ws_size,
                   (unsigned long long)w.ws);
    if (ws_size) {
        region r;
        if (!ws || !find_region(ws, &r) || !(r.kind & MEM_DEVICE))
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the workspace %p is not device memory", ws);
        if ((uintptr_t)ws & 255)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the workspace %p is not 256-byte aligned", ws);
        if (ws_size > r.size - (size_t)((char *)ws - r.base))
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "a workspace of %zu bytes runs past its allocation", ws_size);
    }
    const void *ptrs[4] = {A, B, C, D};
    for (int i = 0; i < 4; i++) {
        const uint32_t need = (uint32_t)(w.align_abcd >> (16 * i)) & 0xffff;
        if (alignment_of(ptrs[i]) < need)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "%c %p is %u-byte aligned; the algo assumes %u (the "
                       "preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)", "ABCD"[i], ptrs[i],
                       alignment_of(ptrs[i]), need, "ABCD"[i]);
    }
    if (!matrix_ok(call, "A", A, la) || !matrix_ok(call, "B", B, lb) || !matrix_ok(call, "D", D, ld))
        return CUBLAS_STATUS_INVALID_VALUE;
    const float a = *(const float *)alpha, b = *(const float *)beta;
    if (b != 0.0f && !matrix_ok(call, "C", C, lc)) return CUBLAS_STATUS_INVALID_VALUE;
    if (pb.bias) {
        region r;
        const size_t es = mp_dtype_size(pb.dt);
        if (!op->bias || !find_region(op->bias, &r) || !(r.kind & (MEM_DEVICE | MEM_SYMBOL)))
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the bias %p (CUBLASLT_MATMUL_DESC_BIAS_POINTER) is not "
                       "device memory", op->bias);
        if ((size_t)pb.m > (r.size - (size_t)((const char *)op->bias - r.base)) / es)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the bias of D's %lld rows runs past its allocation",
                       (long long)pb.m);
        if (alignment_of(op->bias) < w.align_bias)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the bias %p is %u-byte aligned; the algo was found for a "
                       "bias pointer aligned to %u", op->bias, alignment_of(op->bias), (unsigned)w.align_bias);
    }
    if (pb.bgradb) {   /* n values of D's type, written */
        region r;
        const size_t es = mp_dtype_size(pb.dt);
        if (!op->bias || !find_region(op->bias, &r) || !(r.kind & MEM_DEVICE))
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "BGRADB: the bias gradient %p (CUBLASLT_MATMUL_DESC_BIAS_POINTER) "
                       "is not device memory", op->bias);
        if ((size_t)pb.n > (r.size - (size_t)((const char *)op->bias - r.base)) / es)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "BGRADB: the bias gradient of D's %lld columns runs past its "
                       "allocation", (long long)pb.n);
        if (alignment_of(op->bias) < w.align_bias)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the bias %p is %u-byte aligned; the algo was found for a "
                       "bias pointer aligned to %u", op->bias, alignment_of(op->bias), (unsigned)w.align_bias);
    }
    if (pb.gelu) {   /* D's shape and type through AUX_LD, in device memory */
        layout la_aux = *ld;
        la_aux.ld = op->aux_ld;
        if (!op->aux)
            return bad(CUBLAS_STATUS_INVALID_VALUE, call, "GELU_AUX_BIAS without an EPILOGUE_AUX_POINTER");
        if (!matrix_ok(call, "the aux matrix", op->aux, &la_aux)) return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (pb.fp8) {
        if (b != 0.0f) return bad(CUBLAS_STATUS_NOT_SUPPORTED, call, "FP8 with beta %g: only beta 0 is emulated", b);
        const void *fp[3] = {op->scale_a, op->scale_b, op->amax_d};
        for (int i = 0; i < 3; i++) {
            region r;
            if (fp[i] && (!find_region(fp[i], &r) || !(r.kind & (MEM_DEVICE | MEM_SYMBOL)) ||
                          (size_t)((const char *)fp[i] - r.base) + 4 > r.size))
                return bad(CUBLAS_STATUS_INVALID_VALUE, call, "the %s pointer %p is not an f32 in device memory",
                           i == 0 ? "A scale" : i == 1 ? "B scale" : "amax D", fp[i]);
        }
    }
    if (pb.m == 0 || pb.n == 0) return CUBLAS_STATUS_SUCCESS;
    lt_job j = {pb, (const char *)A, (const char *)B, (const char *)C, (const char *)op->bias, (char *)D, la->ld, lb->ld,
                lc->ld, ld->ld, a, b, w.scheme, (char *)op->aux, op->aux_ld};
    /* queued, or recorded as a graph node when the stream is capturing, as cublasGemmEx's */
    const desc opv = *op;   /* its pointers as they are now: the descriptor may change before the product runs */
    bool queued = queue_product(stream, "cublasLtMatmul", [j, opv] {
        if (j.p.fp8 ? run_fp8(j, opv) : run_job(j)) return true;
        sticky(cudaErrorLaunchFailure, "unspecified launch failure (emulated cuBLASLt: the CPU gemm found no "
               "working memory)");
        return false;
    });
    if (!queued && sticky_error() == cudaSuccess)
        return bad(CUBLAS_STATUS_EXECUTION_FAILED, call, "its stream's capture was invalidated by an earlier call");
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }

}  // extern "C"
