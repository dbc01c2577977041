/*
 * block_gemm.c: small f32 products with C's tile in AVX-512 registers
 * (block_gemm.h). C is cut into tiles of up to 4 rows x 64 columns: per k step
 * a tile loads up to four 16-lane vectors of B's row, broadcasts one element of
 * op(A) per row and does up to 16 fused multiply-adds; the last vector of a row
 * is masked, so no size needs padding. The tile shape is a compile-time
 * constant in each of the 32 specialisations, so the accumulators stay in
 * registers. An AVX2 + FMA path does the same in 8-lane registers; BLAS is
 * the last resort.
 */
#include <cblas.h>
#include <string.h>
#include "kernels/cpu/block_gemm.h"

static void block_gemm_blas(int at, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                            const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, at ? CblasTrans : CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)k,
                alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f")))
#define ROWS 4
#define VECS 4   /* 16-lane vectors per tile row: 64 columns */

/* one tile: RB rows (i0 + 0..RB-1) x NV vectors of columns, the last masked */
static inline __attribute__((always_inline)) AVX512 void tile(int at, int rb, int nv, __mmask16 last, int64_t k,
                                                              float alpha, const float *a, int64_t lda,
                                                              const float *b, int64_t ldb, float beta, float *c,
                                                              int64_t ldc)
{
    __m512 acc[ROWS][VECS], bv[VECS];
    for (int r = 0; r < rb; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * ldb;
        for (int v = 0; v < nv; v++)
            bv[v] = v == nv - 1 ? _mm512_maskz_loadu_ps(last, bp + 16 * v) : _mm512_loadu_ps(bp + 16 * v);
        for (int r = 0; r < rb; r++) {
            __m512 av = _mm512_set1_ps(at ? a[p * lda + r] : a[r * lda + p]);
            for (int v = 0; v < nv; v++) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
    for (int r = 0; r < rb; r++)
        for (int v = 0; v < nv; v++) {
            float *cp = c + r * ldc + 16 * v;
            __mmask16 mk = v == nv - 1 ? last : (__mmask16)0xffff;
            __m512 x = _mm512_mul_ps(al, acc[r][v]);
            if (beta != 0.0f) x = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(mk, cp), x);
            _mm512_mask_storeu_ps(cp, mk, x);
        }
}

#define TILE(AT, RB, NV) \
    case (AT) * 16 + ((RB) - 1) * 4 + (NV) - 1: tile(AT, RB, NV, last, k, alpha, ap, lda, b + j0, ldb, beta, cp, ldc); break
#define TILES_NV(AT, RB) TILE(AT, RB, 1); TILE(AT, RB, 2); TILE(AT, RB, 3); TILE(AT, RB, 4)
#define TILES(AT) TILES_NV(AT, 1); TILES_NV(AT, 2); TILES_NV(AT, 3); TILES_NV(AT, 4)

AVX512 static void block_gemm_avx512(int at, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    for (int64_t j0 = 0; j0 < n; j0 += 16 * VECS) {
        int64_t nc = n - j0 < 16 * VECS ? n - j0 : 16 * VECS;
        int nv = (int)((nc + 15) / 16);
        __mmask16 last = (__mmask16)(0xffffu >> (16 * nv - nc));
        for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
            int rb = m - i0 < ROWS ? (int)(m - i0) : ROWS;
            const float *ap = at ? a + i0 : a + i0 * lda;
            float *cp = c + i0 * ldc + j0;
            switch ((at ? 16 : 0) + (rb - 1) * 4 + nv - 1) {
                TILES(0);
                TILES(1);
            }
        }
    }
}

static int has_avx512(void) { return __builtin_cpu_supports("avx512f"); }

/* AVX2 + FMA: the same sums in 8-lane registers, tiles of up to 4 rows x 2
 * vectors (8 accumulators: as many as an FMA's latency times its rate on two
 * ports keeps busy), the last vector masked. Each element of C is the same
 * one fused sum in k order, alpha and beta applied the same way, so the bits
 * are the AVX-512 path's (test_block_gemm.c holds both to that sum). Before
 * it, processors without AVX-512 went to cblas_sgemm, whose set-up, packing
 * and beta pass cost more than these blocks' products (6% of an f32 GPT step
 * on a Zen 3, of which the multiply-adds were two thirds). */
#define AVX2_FN __attribute__((target("avx2,fma")))

static inline __attribute__((always_inline)) AVX2_FN void tile8(int at, int rb, int nv, int part, __m256i last, int64_t k,
                                                                float alpha, const float *a, int64_t lda,
                                                                const float *b, int64_t ldb, float beta, float *c,
                                                                int64_t ldc)
{
    __m256 acc[ROWS][2], bv[2];
    for (int r = 0; r < rb; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        const float *bp = b + p * ldb;
        for (int v = 0; v < nv; v++)
            bv[v] = v == nv - 1 && part ? _mm256_maskload_ps(bp + 8 * v, last) : _mm256_loadu_ps(bp + 8 * v);
        for (int r = 0; r < rb; r++) {
            __m256 av = _mm256_broadcast_ss(at ? a + p * lda + r : a + r * lda + p);
            for (int v = 0; v < nv; v++) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m256 al = _mm256_set1_ps(alpha), be = _mm256_set1_ps(beta);
    for (int r = 0; r < rb; r++)
        for (int v = 0; v < nv; v++) {
            float *cp = c + r * ldc + 8 * v;
            __m256 x = _mm256_mul_ps(al, acc[r][v]);
            if (v == nv - 1 && part) {   /* masked: slow stores on AMD, so only where C ends */
                if (beta != 0.0f) x = _mm256_fmadd_ps(be, _mm256_maskload_ps(cp, last), x);
                _mm256_maskstore_ps(cp, last, x);
            } else {
                if (beta != 0.0f) x = _mm256_fmadd_ps(be, _mm256_loadu_ps(cp), x);
                _mm256_storeu_ps(cp, x);
            }
        }
}

#define TILE8(AT, RB, NV) \
    case (AT) * 8 + ((RB) - 1) * 2 + (NV) - 1: tile8(AT, RB, NV, part, last, k, alpha, ap, lda, b + j0, ldb, beta, cp, ldc); break
#define TILES8(AT) TILE8(AT, 1, 1); TILE8(AT, 1, 2); TILE8(AT, 2, 1); TILE8(AT, 2, 2); \
                   TILE8(AT, 3, 1); TILE8(AT, 3, 2); TILE8(AT, 4, 1); TILE8(AT, 4, 2)

AVX2_FN static void block_gemm_avx2(int at, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        int64_t nc = n - j0 < 16 ? n - j0 : 16;
        int nv = (int)((nc + 7) / 8), tail = (int)(nc - 8 * (nv - 1)), part = tail < 8;
        __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (int64_t i0 = 0; i0 < m; i0 += ROWS) {
            int rb = m - i0 < ROWS ? (int)(m - i0) : ROWS;
            const float *ap = at ? a + i0 : a + i0 * lda;
            float *cp = c + i0 * ldc + j0;
            switch ((at ? 8 : 0) + (rb - 1) * 2 + nv - 1) {
                TILES8(0);
                TILES8(1);
            }
        }
    }
}

static int has_avx2_fma(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
#define block_gemm_avx512 block_gemm_blas
#define block_gemm_avx2 block_gemm_blas
static int has_avx512(void) { return 0; }
static int has_avx2_fma(void) { return 0; }
#endif

typedef void (*gemm_fn)(int, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                        float, float *, int64_t);
static const struct { const char *name; gemm_fn fn; int (*has)(void); } paths[] = {
    { "avx512", block_gemm_avx512, has_avx512 },
    { "avx2", block_gemm_avx2, has_avx2_fma },
    { "blas", block_gemm_blas, NULL },
};
#define NPATHS ((int)(sizeof paths / sizeof *paths))
/* the chosen path; -1 until the first call (every racing thread chooses the same) */
static int chosen = -1;

static int pick(void)
{
    int i = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (i < 0) {   /* the first path the processor has */
        for (i = 0; paths[i].has && !paths[i].has(); i++) {}
        __atomic_store_n(&chosen, i, __ATOMIC_RELAXED);
    }
    return i;
}

void cpu_block_gemm(int at, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    paths[pick()].fn(at, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char *cpu_block_gemm_path(void) { return paths[pick()].name; }

int cpu_block_gemm_use(const char *path)
{
    if (!path) { __atomic_store_n(&chosen, -1, __ATOMIC_RELAXED); pick(); return 0; }
    for (int i = 0; i < NPATHS; i++)
        if (!strcmp(paths[i].name, path)) {
            if (paths[i].has && !paths[i].has()) return -1;   /* this processor lacks it */
            __atomic_store_n(&chosen, i, __ATOMIC_RELAXED);
            return 0;
        }
    return -1;
}
