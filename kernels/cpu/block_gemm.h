/*
 * block_gemm.h: the small f32 products inside blocked kernels (attention's
 * 64 x 64 x Dh blocks, one head per thread). At these sizes a BLAS call spends
 * more on its set-up, packing and beta pass than on the multiply-adds; this
 * kernel keeps a 4-row x 64-column tile of C in registers and streams A and B
 * from where they lie. Each element of C is one fused sum over k in order (the
 * same bits on every thread count, and on AVX-512 and AVX2 processors alike).
 * Processors with neither go to cblas_sgemm.
 */
#ifndef MP_BLOCK_GEMM_H
#define MP_BLOCK_GEMM_H

#include <stdint.h>

/* C{m,n} (ldc) = alpha * op(A) B + beta * C, all row-major. B is {k,n} (ldb);
 * op(A) is A{m,k} (lda) when at = 0, or A^T where A is {k,m} (lda) when at = 1.
 * beta = 0 writes C without reading it. */
void cpu_block_gemm(int at, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* the path in use, "avx512", "avx2" or "blas"; cpu_block_gemm_use picks one (tests):
 * 0, or -1 when this processor lacks it; NULL goes back to the best */
const char *cpu_block_gemm_path(void);
int cpu_block_gemm_use(const char *path);

#endif
