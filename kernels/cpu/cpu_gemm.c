/*
 * cpu_gemm.c: matrix products through OpenBLAS sgemm. f16/bf16 operands are
 * widened to f32 scratch, multiplied with f32 accumulation and rounded once into
 * the output: the numerics of a GPU GEMM with CUBLAS_COMPUTE_32F. f64 goes
 * through dgemm as it is.
 *
 * cpu_gemm_wide is the same f16 product with an operand the engine has
 * already widened (an autocast weight, widened once per version of its values
 * instead of in every forward and backward GEMM that reads it: 1.6 MB of f32
 * written and read again per use for the MLP's 784x512 weight). The widened
 * values are the ones widen() would write, and they meet the same sgemm or
 * oneDNN call with the same shapes, so C is bit-identical to cpu_gemm's.
 */
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
                   void *c, int64_t sc);

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
    return gemm_16(cx, dt, ta, tb, batch, m, n, k, alpha, a, 0, sa, b, 0, sb, beta, c, sc);
}

/* f16/bf16: each operand widened whole (once; a broadcast operand, stride 0,
 * once for every item) unless it comes widened (wa, wb: f32 already), one
 * f32 product per batch item, C rounded once */
static int gemm_16(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                   float alpha, const void *a, int wa, int64_t sa, const void *b, int wb, int64_t sb, float beta,
                   void *c, int64_t sc)
{
    int64_t na = (sa ? batch : 1) * m * k, nb = (sb ? batch : 1) * k * n, nc = m * n;
    const float *fa = wa ? a : cpu_scratch(cx, 0, (size_t)na * 4), *fb = wb ? b : cpu_scratch(cx, 1, (size_t)nb * 4);
    float *fc = cpu_scratch(cx, 2, (size_t)nc * 4);
    if (!fa || !fb || !fc) return -1;
    if (!wa) widen(dt, a, (float *)fa, na);
    if (!wb) widen(dt, b, (float *)fb, nb);
    size_t es = mp_dtype_size(dt);
    for (int64_t i = 0; i < batch; i++) {
        void *ci = (char *)c + (size_t)(i * sc) * es;
        if (beta != 0.0f) widen(dt, ci, fc, nc);
        const float *ai = fa + (sa ? i * m * k : 0), *bi = fb + (sb ? i * k * n : 0);
        if (cpu_gemm_dnnl(cx, MP_F32, ta, tb, 1, m, n, k, alpha, ai, 0, bi, 0, beta, fc, m * n) != 0)
            sgemm(ta, tb, m, n, k, alpha, ai, bi, beta, fc);
        narrow_to(cx, dt, fc, ci, nc);
    }
    return 0;
}

/* the backend's gemm_wide: f16 only (supports says so), the dtype whose
 * product cpu_gemm widens whole; bf16 goes to oneDNN's own bf16 kernels there,
 * so a widened bf16 operand is declined rather than summed another way */
int cpu_gemm_wide(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                  float alpha, const void *a, int wa, int64_t sa, const void *b, int wb, int64_t sb, float beta,
                  void *c, int64_t sc)
{
    if (dt != MP_F16) return 1;
    return gemm_16(cx, dt, ta, tb, batch, m, n, k, alpha, a, wa, sa, b, wb, sb, beta, c, sc);
}
