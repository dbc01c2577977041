/*
 * block_gemm_bf16.h: the small products of blocked kernels with bf16 operands
 * and f32 accumulation (attention's 64 x 64 x Dh blocks in bf16), the bf16
 * sibling of block_gemm.h. The operands are read in pairs along k, as
 * AVX512-BF16's vdpbf16ps wants them: one 32-bit word holds the bf16 values of
 * k = 2p and 2p + 1. B is packed once (a key block's keys or values serve every
 * query block); A is read in place where its pairs already lie in its rows.
 *
 * Every element of C is one f32 sum over the pairs in order p = 0, 1, ..., and
 * within a pair the odd k first: acc = fma(a[2p+1], b[2p+1], acc), then
 * acc = fma(a[2p], b[2p], acc), each rounded to nearest even, with bf16
 * subnormal inputs read as zero and f32 subnormal sums flushed to zero, which is
 * what vdpbf16ps does (checked bit for bit on random and tiny values). The
 * AVX2 and portable paths do exactly these operations, so every path gives the
 * same bits, on every thread count. Against the exact sum of the same bf16 values,
 * |C - alpha sum a b| <= |alpha| ((k + 2) 2^-24 sum |a b| + k 2^-126) (+ the
 * beta term's rounding) when no operand is a bf16 subnormal (those count as 0).
 */
#ifndef MP_BLOCK_GEMM_BF16_H
#define MP_BLOCK_GEMM_BF16_H

#include <stdint.h>

/* C{m,n} (ldc) = alpha * op(A) B + beta * C, bf16 operands as bit patterns,
 * C f32 row-major; beta = 0 writes C without reading it. kp = (k + 1) / 2 pairs.
 * B: pair (p, j), the values B(2p, j) and B(2p + 1, j), at b + 2 (p ldb + j).
 * op(A) = A{m,k} when at = 0: A(i, q) at a + i lda + q (lda even, rows as they lie);
 *         A^T when at = 1, its pairs packed as B's: A(i, 2p + h) at a + 2 (p lda + i) + h.
 * When k is odd the missing second half of the last pair (B(k, j), A(i, k))
 * must be there and be zero (the packers below write it). */
void cpu_block_gemm_bf16(int at, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda,
                         const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Pairs from X{rows, cols} (ldx) along its rows: pair (p, j) = (X(2p, j), X(2p+1, j)),
 * at dst + 2 (p ldd + j); a zero for row `rows` when rows is odd. The B operand
 * of X as the {k, n} factor, or A^T of X{k, m} (at = 1). */
void cpu_bf16_pack_rows(uint16_t *dst, int64_t ldd, const uint16_t *x, int64_t ldx, int64_t rows, int64_t cols);

/* Pairs from X{rows, cols} (ldx) along its columns, transposed: pair (p, j) =
 * (X(j, 2p), X(j, 2p+1)) at dst + 2 (p ldd + j); a zero for column `cols` when
 * cols is odd. The B operand of X^T (keys for the scores). */
void cpu_bf16_pack_cols(uint16_t *dst, int64_t ldd, const uint16_t *x, int64_t ldx, int64_t rows, int64_t cols);

/* the path in use, "avx512bf16", "avx2" (AVX2 + FMA) or "portable";
 * cpu_block_gemm_bf16_use picks one
 * (tests): 0, or -1 when this processor lacks it; NULL goes back to the best */
const char *cpu_block_gemm_bf16_path(void);
int cpu_block_gemm_bf16_use(const char *path);

#endif
