/*
 * cuda_gemm_lt.cu: the backend's gemm_bias, a linear layer's product with its
 * bias in cuBLASLt's epilogue (CUBLASLT_EPILOGUE_BIAS), in one pass over the
 * output: without it the engine fills y with the bias (a broadcast add) and
 * the GEMM re-reads y with beta = 1. And gemm_bias_gelu, linear_gelu's
 * product with the bias and GELU in the epilogue (CUBLASLT_EPILOGUE_GELU_AUX_
 * BIAS): D = GELU(sum + bias) and the pre-activation sum + bias written as the
 * auxiliary matrix (the backward's input), both in one pass, where the engine
 * otherwise runs gemm_bias and then a GELU kernel reading the product back.
 * cuBLASLt's GELU is taken as the tanh approximation (the form PyTorch routes
 * to this epilogue); the erf form is declined, and so is an output width n not
 * a multiple of 8 (the manual: the aux ld, n here, must be divisible by 8).
 * And gemm_wgrad_bias, linear's weight gradient dw{n,k} = g{m,n}^T x{m,k}
 * with the bias gradient (g's column sums) in the epilogue (CUBLASLT_EPILOGUE_
 * BGRADB): column-major, D{k,n} (ld k) = x' {k,m} (ld k, as stored) times
 * op(g') with g' the stored {n,m} (ld n) transposed, so the sums over the
 * GEMM's k (the rows m) of op(B)'s columns are db{n}, D's columns; without it
 * a reduce reads g again.
 *
 * Row-major C{m,n} = A{m,k} @ B{n,k}^T + bias{n}. Read column-major (as
 * cuda_gemm.cu explains), that is D{n,m} = op(B') op(A') + bias broadcast over
 * D's columns, with B' the stored {k,n} weights (ld k) transposed, A' the
 * stored {k,m} inputs (ld k) as they are, D {n,m} with ld n: the bias has D's
 * rows, as cuBLASLt's BIAS epilogue wants it.
 *
 * Numerics: f16/bf16/f32 operands, CUBLAS_COMPUTE_32F (f32 accumulation; f32
 * operands without TF32 unless the cuBLAS handle's math mode allows it, as
 * cuda_gemm.cu's products), the bias (of C's dtype, widened exactly) added to
 * the f32 sums and the result rounded once: the contract of kernels/backend.h
 * and the CPU's arithmetic. The preference allows only split-K reductions in
 * the compute type (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE): the default also
 * allows partial sums kept and added in a 16-bit output type, several
 * roundings on a long k (the cuBLAS handle's DISALLOW_REDUCED_PRECISION_
 * REDUCTION, for Lt).
 *
 * What is made once: the Lt handle (per context), and per shape a plan: the
 * matmul descriptor, the three layouts and the heuristic's algo, for the
 * dtype, m, n, k, compute type and the alignment of the pointers (the
 * heuristic is told it: an algo chosen for 256-byte aligned operands may not
 * run on a view that is only 2-byte aligned). Plans live in a small table in
 * the context, the least recently used replaced. Per call only the bias
 * pointer is set on the descriptor. The workspace is cuBLAS's (cuda_gemm.cu):
 * both run on cx->stream, one after the other.
 *
 * Declining (1: the engine's fill + gemm): when Lt has no handle, no algo for
 * the shape, refuses the call as not supported, or a dimension is past int32,
 * and k == 0 (the CPU declines it too). Any other failure of a call is noted
 * as the sticky error, as cuda_gemm.cu does.
 */
#include <cublasLt.h>
#include <limits.h>
#include "kernels/cuda/cuda.h"

#define LT_PLANS 32

typedef struct {
    bool used, declined;
    uint64_t last;   /* when last used, for replacement */
    uint32_t epi;    /* CUBLASLT_EPILOGUE_BIAS, _GELU_AUX_BIAS or _BGRADB */
    mp_dtype dt;
    int64_t m, n, k;
    unsigned align;
    cublasComputeType_t compute;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    size_t ws;
} lt_plan;

typedef struct {
    cublasLtHandle_t h;
    bool failed;   /* no handle: every call declines */
    uint64_t tick;
    lt_plan plans[LT_PLANS];
} lt_state;

static cudaDataType lt_type(mp_dtype dt)
{
    return dt == MP_F16 ? CUDA_R_16F : dt == MP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* the largest power of two up to 256 dividing every address */
static unsigned alignment(const void *const *p, int n)
{
    uintptr_t u = 256;
    for (int i = 0; i < n; i++) u |= (uintptr_t)p[i];
    return (unsigned)(u & -u);
}

static void plan_free(lt_plan *p)
{
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

/* the descriptor, layouts and algo for a shape (see the head); declined when
 * Lt refuses any of it or finds no algo */
static void plan_make(lt_plan *p, cublasLtHandle_t h, const void *bias, const void *aux, size_t ws_bytes)
{
    const cudaDataType t = lt_type(p->dt);
    const bool wgrad = p->epi == CUBLASLT_EPILOGUE_BGRADB;
    const int32_t opa = wgrad ? CUBLAS_OP_N : CUBLAS_OP_T, opb = wgrad ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint32_t epi = p->epi, reduce = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, al = p->align;
    const int32_t bias_type = (int32_t)t, aux_type = (int32_t)t;
    const int64_t aux_ld = p->n;   /* the pre-activation as D: {n, m}, ld n */
    const uint64_t ws = ws_bytes;
    cublasLtMatmulPreference_t pref = NULL;
    int found = 0;
    cublasLtMatmulHeuristicResult_t r;
    bool ok = cublasLtMatmulDescCreate(&p->op, p->compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa) == 0 &&
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb) == 0 &&
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) == 0 &&
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                             sizeof bias_type) == 0 &&
              /* the heuristic reads the bias pointer's alignment from here */
              cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) == 0 &&
              (epi != CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
               (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) == 0 &&
                cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld) == 0 &&
                cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                                               sizeof aux_type) == 0)) &&
              /* A' = B {k,n}, B' = A {k,m}, C = D {n,m}, column-major; BGRADB: A' = x {k,m},
               * B' = g {n,m}, D {k,n} */
              (wgrad ? cublasLtMatrixLayoutCreate(&p->la, t, (uint64_t)p->k, (uint64_t)p->m, p->k) == 0 &&
                       cublasLtMatrixLayoutCreate(&p->lb, t, (uint64_t)p->n, (uint64_t)p->m, p->n) == 0 &&
                       cublasLtMatrixLayoutCreate(&p->lc, t, (uint64_t)p->k, (uint64_t)p->n, p->k) == 0
                     : cublasLtMatrixLayoutCreate(&p->la, t, (uint64_t)p->k, (uint64_t)p->n, p->k) == 0 &&
                       cublasLtMatrixLayoutCreate(&p->lb, t, (uint64_t)p->k, (uint64_t)p->m, p->k) == 0 &&
                       cublasLtMatrixLayoutCreate(&p->lc, t, (uint64_t)p->n, (uint64_t)p->m, p->n) == 0) &&
              cublasLtMatmulPreferenceCreate(&pref) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduce,
                                                   sizeof reduce) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al) == 0 &&
              cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al) == 0 &&
              cublasLtMatmulAlgoGetHeuristic(h, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &r, &found) == 0 &&
              found > 0 && r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws_bytes;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ok) p->algo = r.algo, p->ws = r.workspaceSize;
    p->declined = !ok;
}

/* the plan for a shape, made when it is new (the least recently used one replaced) */
static lt_plan *plan_for(lt_state *s, uint32_t epi, mp_dtype dt, int64_t m, int64_t n, int64_t k, unsigned align,
                         cublasComputeType_t compute, const void *bias, const void *aux, size_t ws_bytes)
{
    lt_plan *victim = &s->plans[0];
    s->tick++;
    for (int i = 0; i < LT_PLANS; i++) {
        lt_plan *p = &s->plans[i];
        if (p->used && p->epi == epi && p->dt == dt && p->m == m && p->n == n && p->k == k && p->align == align && p->compute == compute) {
            p->last = s->tick;
            return p;
        }
        if (!p->used || (victim->used && p->last < victim->last)) victim = p;
    }
    plan_free(victim);
    victim->used = true, victim->last = s->tick, victim->epi = epi;
    victim->dt = dt, victim->m = m, victim->n = n, victim->k = k, victim->align = align, victim->compute = compute;
    plan_make(victim, s->h, bias, aux, ws_bytes);
    return victim;
}

/* the context's Lt state (cx->blaslt), its handle made on first use; NULL when
 * Lt cannot be had (then every call declines) */
static lt_state *lt_of(mp_kctx *cx)
{
    lt_state *s = (lt_state *)cx->blaslt;
    if (!s) {
        s = (lt_state *)calloc(1, sizeof *s);
        if (!s) return NULL;
        s->failed = cublasLtCreate(&s->h) != CUBLAS_STATUS_SUCCESS;
        cx->blaslt = s;
    }
    return s->failed ? NULL : s;
}

/* the context's Lt handle, for the other files that call Lt (cuda_fp8_gemm.cu) */
cublasLtHandle_t mp_cuda_lt_handle(mp_kctx *cx)
{
    lt_state *s = lt_of(cx);
    return s ? s->h : NULL;
}

/* D = epilogue(A B^T + bias) through the plan for epi (aux: GELU_AUX_BIAS's
 * pre-activation, else NULL); 0 done, 1 declined */
static int lt_bias_run(mp_kctx *cx, uint32_t epi, const char *what, mp_dtype dt, int64_t m, int64_t n, int64_t k,
                       const void *a, const void *b, const void *bias, void *c, void *aux)
{
    if (k <= 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX || (dt != MP_F32 && dt != MP_F16 && dt != MP_BF16)) return 1;
    lt_state *s = lt_of(cx);
    if (!s) return 1;
    size_t ws_bytes;
    bool tf32;
    void *ws = mp_cuda_gemm_workspace(cx, &ws_bytes, &tf32);
    const cublasComputeType_t compute = dt == MP_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const void *ptrs[5] = {a, b, bias, c, aux};
    lt_plan *p = plan_for(s, epi, dt, m, n, k, alignment(ptrs, aux ? 5 : 4), compute, bias, aux, ws_bytes);
    if (p->declined) return 1;
    if (cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) !=
            CUBLAS_STATUS_SUCCESS ||
        (aux && cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux) !=
                    CUBLAS_STATUS_SUCCESS)) {
        p->declined = true;
        return 1;
    }
    const float one = 1.0f, zero = 0.0f;
    /* A' is b, B' is a (BGRADB: x and g) */
    cublasStatus_t st = cublasLtMatmul(s->h, p->op, &one, b, p->la, a, p->lb, &zero, c, p->lc, c, p->lc, &p->algo, ws,
                                       ws_bytes, cx->stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_ARCH_MISMATCH) {
        p->declined = true;   /* this shape goes the engine's way from now on */
        return 1;
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
        char where[64];
        snprintf(where, sizeof where, "%s: cublasLtMatmul", what);
        mp_cuda_note(cx, mp_cuda_blas_error(st), where);
        return 0;
    }
    return 0;
}

int mp_cuda_gemm_bias(mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                      const void *bias, void *c)
{
    if (m <= 0 || n <= 0) return 0;   /* nothing to write */
    int rc = lt_bias_run(cx, CUBLASLT_EPILOGUE_BIAS, "gemm_bias", dt, m, n, k, a, b, bias, c, NULL);
    if (rc == 0) MP_LAUNCHED("gemm_bias");
    return rc;
}

int mp_cuda_gemm_bias_gelu(mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                           const void *bias, double form, void *c, void *pre)
{
    if (m <= 0 || n <= 0) return 0;   /* nothing to write */
    if (form != 1.0 || n % 8) return 1;   /* the erf form; an aux ld cuBLASLt refuses */
    int rc = lt_bias_run(cx, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "gemm_bias_gelu", dt, m, n, k, a, b, bias, c, pre);
    if (rc == 0) MP_LAUNCHED("gemm_bias_gelu");
    return rc;
}

int mp_cuda_gemm_wgrad_bias(mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *g, const void *x,
                            void *dw, void *db)
{
    if (n <= 0 || k <= 0) return 0;   /* nothing to write */
    /* lt_bias_run's (a, b) are (B', A'): g and x; its bias pointer is where BGRADB writes db */
    int rc = lt_bias_run(cx, CUBLASLT_EPILOGUE_BGRADB, "gemm_wgrad_bias", dt, m, n, k, g, x, db, dw, NULL);
    if (rc == 0) MP_LAUNCHED("gemm_wgrad_bias");
    return rc;
}
