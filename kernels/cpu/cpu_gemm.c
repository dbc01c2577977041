/*
 * cpu_gemm.c: matrix products through OpenBLAS sgemm. f16/bf16 operands are
 * widened to f32 scratch, multiplied with f32 accumulation and rounded once into
 * the output: the numerics of a GPU GEMM with CUBLAS_COMPUTE_32F. f64 goes
 * through dgemm as it is.
 *
 * cpu_gemm_wide is the same f16 product (bf16 too where oneDNN has no bf16
 * kernels, so that cpu_gemm widens bf16 whole as well) with an operand the engine has
 * already widened (an autocast weight, widened once per version of its values
 * instead of in every forward and backward GEMM that reads it: 1.6 MB of f32
 * written and read again per use for the MLP's 784x512 weight). The widened
 * values are the ones widen() would write, and they meet the same sgemm or
 * oneDNN call with the same shapes, so C is bit-identical to cpu_gemm's.
 * Its two epilogues (kernels/backend.h gemm_wide) save the f16 step a pass
 * each: a bias written into the f32 sums before the product (in place of the
 * engine filling C with it and the product widening C back: a pass over C,
 * and one over C in f16 the next), and a weight gradient added into its f32
 * .grad block by block as it is rounded (in place of C written in f16 and
 * read back by add_widened: 4 bytes an element less to move, one pass less).
 */
#include <string.h>
#include <cblas.h>
#include "kernels/cpu/cpu.h"

static void sgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float *a, const float *b, float beta, float *c)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, ta ? (blasint)m : (blasint)k,
                b, tb ? (blasint)k : (blasint)n, beta, c, (blasint)n);
}

static void dgemm(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                  const double *a, const double *b, double beta, double *c)
{
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (blasint)m, (blasint)n, (blasint)k, alpha, a, ta ? (blasint)m : (blasint)k,
                b, tb ? (blasint)k : (blasint)n, beta, c, (blasint)n);
}

/* one call over the whole operand: convert.c splits it over threads past its
 * threshold (2^18), and takes the 16-wide F16C form (the 16K-element pieces
 * this was cut into before ran on one thread below 2^20 elements) */
static void widen(mp_dtype dt, const void *src, float *dst, int64_t n)
{
    cpu_load(dt, src, 0, dst, n);
}

static void narrow_to(mp_kctx *cx, mp_dtype dt, const float *src, void *dst, int64_t n)
{
    #pragma omp parallel for if (n > MP_PAR_MIN_MEM) schedule(static)
    for (int64_t i = 0; i < n; i += 16 * MP_BLOCK) {
        int64_t len = n - i < 16 * MP_BLOCK ? n - i : 16 * MP_BLOCK;
        cpu_store(cx, dt, dst, i, src + i, len);
    }
}

static int gemm_16(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                   float alpha, const void *a, int wa, int64_t sa, const void *b, int wb, int64_t sb, float beta,
                   void *c, int64_t sc, const void *bias, float *acc);

int cpu_gemm(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
             float alpha, const void *a, int64_t sa, const void *b, int64_t sb,
             float beta, void *c, int64_t sc)
{
    if (dt == MP_F64) {   /* BLAS's own f64 product: no widening, no rounding */
        for (int64_t i = 0; i < batch; i++)
            dgemm(ta, tb, m, n, k, alpha, (const double *)a + i * sa, (const double *)b + i * sb,
                  beta, (double *)c + i * sc);
        return 0;
    }
    /* f32 and bf16: oneDNN's kernels where it has them (cpu_gemm_dnnl.c) */
    if ((dt == MP_F32 || dt == MP_BF16) && k > 0 &&
        cpu_gemm_dnnl(cx, dt, ta, tb, batch, m, n, k, alpha, a, sa, b, sb, beta, c, sc) == 0)
        return 0;
    if (dt == MP_F32) {   /* what oneDNN declined */
        for (int64_t i = 0; i < batch; i++)
            sgemm(ta, tb, m, n, k, alpha, (const float *)a + i * sa, (const float *)b + i * sb,
                  beta, (float *)c + i * sc);
        return 0;
    }
    return gemm_16(cx, dt, ta, tb, batch, m, n, k, alpha, a, 0, sa, b, 0, sb, beta, c, sc, NULL, NULL);
}

/* every row of fc{m,n} = 0 + bias widened: the f32 values that C filled with
 * binary's 0 + bias in dt (exact there: a -0 becomes +0 either way) widens to */
static void fill_bias(mp_dtype dt, const void *bias, float *fc, int64_t m, int64_t n)
{
    float row[MP_BLOCK];
    for (int64_t j = 0; j < n; j += MP_BLOCK) {
        int64_t len = n - j < MP_BLOCK ? n - j : MP_BLOCK;
        cpu_load(dt, bias, j, row, len);
        for (int64_t q = 0; q < len; q++) row[q] = 0.0f + row[q];
        for (int64_t r = 0; r < m; r++) memcpy(fc + r * n + j, row, (size_t)len * sizeof *row);
    }
}

MP_SIMD static void add_f32(float *restrict acc, const float *restrict y, int64_t n)
{
    for (int64_t q = 0; q < n; q++) acc[q] = acc[q] + y[q];
}

/* acc{n} += fc rounded to dt and widened, block by block through L1: the
 * rounding is narrow_to's (cpu_store, flushes counted as there) and the add
 * cpu_add_widened's f32 add, so acc gets the bits of C written then added;
 * with no flushes to count all three go in registers (convert.h
 * mp_cpu_f16_round_add, mp_cpu_bf16_round_add) in pieces of 16 blocks, as
 * narrow_to splits */
static void add_rounded(mp_kctx *cx, mp_dtype dt, const float *fc, float *acc, int64_t n)
{
    if ((dt == MP_F16 || dt == MP_BF16) && !cx->flush.on) {   /* nothing to count: one pass in registers, the same bits */
        void (*round_add)(float *, const float *, int64_t) = dt == MP_F16 ? mp_cpu_f16_round_add : mp_cpu_bf16_round_add;
        #pragma omp parallel for if (n > MP_PAR_MIN_MEM) schedule(static)
        for (int64_t i = 0; i < n; i += 16 * MP_BLOCK)
            round_add(acc + i, fc + i, n - i < 16 * MP_BLOCK ? n - i : 16 * MP_BLOCK);
        return;
    }
    #pragma omp parallel for if (n > MP_PAR_MIN_MEM) schedule(static)
    for (int64_t i = 0; i < n; i += MP_BLOCK) {
        int64_t len = n - i < MP_BLOCK ? n - i : MP_BLOCK;
        uint16_t low[MP_BLOCK];
        float y[MP_BLOCK];
        cpu_store(cx, dt, low, 0, fc + i, len);
        cpu_load(dt, low, 0, y, len);
        add_f32(acc + i, y, len);
    }
}

/* f16/bf16: each operand widened whole (once; a broadcast operand, stride 0,
 * once for every item) unless it comes widened (wa, wb: f32 already), one
 * f32 product per batch item, C rounded once; with bias or acc (batch 1), the
 * epilogues of gemm_wide */
static int gemm_16(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                   float alpha, const void *a, int wa, int64_t sa, const void *b, int wb, int64_t sb, float beta,
                   void *c, int64_t sc, const void *bias, float *acc)
{
    int64_t na = (sa ? batch : 1) * m * k, nb = (sb ? batch : 1) * k * n, nc = m * n;
    const float *fa = wa ? a : cpu_scratch(cx, 0, (size_t)na * 4), *fb = wb ? b : cpu_scratch(cx, 1, (size_t)nb * 4);
    float *fc = cpu_scratch(cx, 2, (size_t)nc * 4);
    if (!fa || !fb || !fc) return -1;
    if (!wa) widen(dt, a, (float *)fa, na);
    if (!wb) widen(dt, b, (float *)fb, nb);
    if (bias) beta = 1.0f;   /* the sums start from the bias as they would from C filled with it */
    size_t es = mp_dtype_size(dt);
    for (int64_t i = 0; i < batch; i++) {
        void *ci = acc ? NULL : (char *)c + (size_t)(i * sc) * es;
        if (bias) fill_bias(dt, bias, fc, m, n);
        else if (beta != 0.0f) widen(dt, ci, fc, nc);
        const float *ai = fa + (sa ? i * m * k : 0), *bi = fb + (sb ? i * k * n : 0);
        if (cpu_gemm_dnnl(cx, MP_F32, ta, tb, 1, m, n, k, alpha, ai, 0, bi, 0, beta, fc, m * n) != 0)
            sgemm(ta, tb, m, n, k, alpha, ai, bi, beta, fc);
        if (acc) add_rounded(cx, dt, fc, acc, nc);
        else narrow_to(cx, dt, fc, ci, nc);
    }
    return 0;
}

/* the backend's gemm_wide: the dtypes of cpu_gemm_widens (cpu_gemm_dnnl.c;
 * supports says so) */
int cpu_gemm_wide(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                  float alpha, const void *a, int wa, int64_t sa, const void *b, int wb, int64_t sb, float beta,
                  void *c, int64_t sc, const void *bias, float *acc)
{
    /* while flushes are counted, the bias goes the engine's way, whose fill of C
     * in dt is counted as a store like any other */
    if (!cpu_gemm_widens(dt) || ((bias || acc) && batch != 1) || (bias && cx->flush.on)) return 1;
    return gemm_16(cx, dt, ta, tb, batch, m, n, k, alpha, a, wa, sa, b, wb, sb, beta, c, sc, bias, acc);
}
