/*
 * block_gemm_bf16.c: small bf16 products with f32 accumulation
 * (block_gemm_bf16.h). The AVX512-BF16 path keeps a tile of C in registers, as
 * block_gemm.c does: up to 4 rows x 64 columns (8 rows x 32 columns when C is
 * that narrow, so that 16 accumulators hide vdpbf16ps's latency); per pair of k
 * it loads up to four 16-lane vectors of B's pair words, broadcasts one pair word
 * of op(A) per row and does one vdpbf16ps per accumulator. The last vector of a
 * row is masked, so no size needs padding beyond k's pair.
 *
 * The portable path, for processors without AVX512-BF16 and for tests, does the
 * instruction's arithmetic element by element in the same order (odd k of each
 * pair first, fused, subnormal inputs read as zero, subnormal sums flushed), and
 * the AVX2 + FMA path does it eight columns at a time over a tile of rows, so
 * all three paths agree bit for bit; test_block_gemm_bf16.c checks each the
 * processor has against the portable one.
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/block_gemm_bf16.h"
#include "kernels/cpu/cpu.h"

/* bf16 bits to f32, a subnormal (and zero) read as a zero of its sign */
static inline float daz(uint16_t h)
{
    uint32_t u = (uint32_t)(h & ((h & 0x7f80u) ? 0xffffu : 0x8000u)) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* a subnormal f32 flushed to a zero of its sign */
static inline float ftz(float x) { return fabsf(x) < 0x1p-126f ? copysignf(0.0f, x) : x; }

/* The clones: MP_SIMD's "avx2" clone has no FMA, so its fmaf was a call into
 * libm per product (a fifth of a bf16 GPT step on an AVX2 processor, the row
 * loop not vectorised around it); x86-64-v3's (AVX2 + FMA) has it inline, the loop vectorised.
 * fmaf is the one correctly rounded fused product either way: the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ROW_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "avx512f")))
#else
#define ROW_CLONES MP_SIMD
#endif

/* one row of C (i) over columns j0..j0+nc-1, at most 64 */
ROW_CLONES static void row_portable(int at, int64_t i, int64_t j0, int64_t nc, int64_t kp, float alpha,
                                 const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c)
{
    float acc[64];
    for (int64_t j = 0; j < nc; j++) acc[j] = 0.0f;
    for (int64_t p = 0; p < kp; p++) {
        const uint16_t *ap = at ? a + 2 * (p * lda + i) : a + i * lda + 2 * p, *bp = b + 2 * (p * ldb + j0);
        float a0 = daz(ap[0]), a1 = daz(ap[1]);
        for (int64_t j = 0; j < nc; j++) {
            float s = ftz(fmaf(a1, daz(bp[2 * j + 1]), acc[j]));
            acc[j] = ftz(fmaf(a0, daz(bp[2 * j]), s));
        }
    }
    for (int64_t j = 0; j < nc; j++) {
        float x = alpha * acc[j];
        c[j] = beta != 0.0f ? fmaf(beta, c[j], x) : x;
    }
}

static void block_gemm_bf16_portable(int at, int64_t m, int64_t n, int64_t kp, float alpha, const uint16_t *a,
                                     int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j0 = 0; j0 < n; j0 += 64)
            row_portable(at, i, j0, n - j0 < 64 ? n - j0 : 64, kp, alpha, a, lda, b, ldb, beta, c + i * ldc + j0);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define BF16_FN __attribute__((target("avx512f,avx512bf16")))

/* one tile: RB rows (up to 8) x NV vectors of 16 columns, the last masked */
static inline __attribute__((always_inline)) BF16_FN void tile(int at, int rb, int nv, __mmask16 last, int64_t kp,
                                                               float alpha, const uint16_t *a, int64_t lda,
                                                               const uint16_t *b, int64_t ldb, float beta, float *c,
                                                               int64_t ldc)
{
    __m512 acc[8][4];
    __m512i bv[4];
    for (int r = 0; r < rb; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; p++) {
        const uint16_t *bp = b + 2 * p * ldb;
        for (int v = 0; v < nv; v++)
            bv[v] = v == nv - 1 ? _mm512_maskz_loadu_epi32(last, bp + 32 * v) : _mm512_loadu_si512(bp + 32 * v);
        for (int r = 0; r < rb; r++) {
            uint32_t w;
            memcpy(&w, at ? a + 2 * (p * lda + r) : a + r * lda + 2 * p, sizeof w);
            __m512i av = _mm512_set1_epi32((int)w);
            for (int v = 0; v < nv; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)av, (__m512bh)bv[v]);
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
    case (AT) * 32 + ((RB) - 1) * 4 + (NV) - 1: tile(AT, RB, NV, last, kp, alpha, ap, lda, b + 2 * j0, ldb, beta, cp, ldc); break
#define TILES4(AT, RB) TILE(AT, RB, 1); TILE(AT, RB, 2); TILE(AT, RB, 3); TILE(AT, RB, 4)
#define TILES2(AT, RB) TILE(AT, RB, 1); TILE(AT, RB, 2)
#define TILES(AT) TILES4(AT, 1); TILES4(AT, 2); TILES4(AT, 3); TILES4(AT, 4); \
                  TILES2(AT, 5); TILES2(AT, 6); TILES2(AT, 7); TILES2(AT, 8)

BF16_FN static void block_gemm_bf16_avx512(int at, int64_t m, int64_t n, int64_t kp, float alpha, const uint16_t *a,
                                           int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                                           int64_t ldc)
{
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
        int64_t nc = n - j0 < 64 ? n - j0 : 64;
        int nv = (int)((nc + 15) / 16), rows = nv <= 2 ? 8 : 4;
        __mmask16 last = (__mmask16)(0xffffu >> (16 * nv - nc));
        for (int64_t i0 = 0; i0 < m; i0 += rows) {
            int rb = m - i0 < rows ? (int)(m - i0) : rows;
            const uint16_t *ap = at ? a + 2 * i0 : a + i0 * lda;
            float *cp = c + i0 * ldc + j0;
            switch ((at ? 32 : 0) + (rb - 1) * 4 + nv - 1) {
                TILES(0);
                TILES(1);
            }
        }
    }
}

static int has_avx512bf16(void) { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }

/* AVX2 + FMA: the portable path's operations, eight columns to a register,
 * on a tile of up to 4 rows x 2 vectors of C (8 accumulators): each pair of
 * B's words, widened once (a shift into the high half of an f32), serves every
 * row of the tile, and A's tile is widened once into a small f32 buffer for all
 * column panels, where the portable row loop read and widened B again for
 * every row (its compiled clone spent a third of a bf16 GPT step there).
 *
 * The subnormal rules cost nothing inside the loop: it runs with MXCSR.DAZ set
 * (FTZ clear), so every FMA reads a subnormal input as a zero of its sign. That
 * is daz() for the widened bf16 operands (a bf16 subnormal widens to an f32
 * subnormal, a normal to a normal), and ftz() for the running sums: a sum that
 * falls under 2^-126 is produced as the portable path's fmaf produces it (one
 * rounding, gradual underflow) and read as a zero of its sign by the next FMA,
 * where the portable path flushed it first; the last one is flushed explicitly
 * (an exponent-field mask) before the epilogue. MXCSR is set and restored
 * around a call that does only the products (sums_daz, not inlined, so no
 * other floating-point work moves into or out of the DAZ stretch), and the
 * alpha / beta epilogue runs after the restore, as the portable path's does
 * (a subnormal C or alpha sum is used as it is). Each fused product is
 * _mm256_fmadd_ps, fmaf's one rounding: the same bits as the portable path
 * (test_block_gemm_bf16.c, sums crossing 2^-126 included). */
#define AVX2_FN __attribute__((target("avx2,fma")))
#define KPC 128   /* pairs of k per pass over a tile (A's widened tile: 4 x 2 KPC floats) */
#define NBC 256   /* columns of C per block */
#define RGC 16    /* rows of C per group: the sums' buffer, RGC x NBC floats, goes under DAZ and back once */

/* x with its magnitude dropped where its exponent field is 0 */
static inline __attribute__((always_inline)) AVX2_FN __m256 zero_tiny(__m256 x)
{
    __m256i xi = _mm256_castps_si256(x);
    __m256i z = _mm256_cmpeq_epi32(_mm256_and_si256(xi, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_and_si256(z, _mm256_set1_epi32(0x7fffffff)), xi));
}

/* one tile under DAZ: RB rows (up to 4) x NV vectors of 8 columns (up to 2),
 * the last loaded under mask `last` where partial (part; masked stores are
 * slow on AMD, masked loads less so); the sums start from s (cont)
 * or zero and go back to s (row r at s + r NBC), flushed. aw: A's tile widened,
 * A(r, 2p) and A(r, 2p + 1) at aw[r rs + p ps] and the float after it */
static inline __attribute__((always_inline)) AVX2_FN void tile8(int rb, int nv, int part, __m256i last, int64_t kp, int cont,
                                                                const float *aw, int64_t rs, int64_t ps,
                                                                const uint16_t *b, int64_t ldb, float *s)
{
    __m256 acc[4][2], be[2], bo[2];
    for (int r = 0; r < rb; r++)
        for (int v = 0; v < nv; v++)
            acc[r][v] = cont ? _mm256_loadu_ps(s + r * NBC + 8 * v) : _mm256_setzero_ps();   /* s is NBC wide */
    for (int64_t p = 0; p < kp; p++) {
        const uint16_t *bp = b + 2 * p * ldb;
        for (int v = 0; v < nv; v++) {
            __m256i w = v == nv - 1 && part ? _mm256_maskload_epi32((const int *)(bp + 16 * v), last)
                                            : _mm256_loadu_si256((const __m256i *)(bp + 16 * v));
            be[v] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
            bo[v] = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u)));
        }
        for (int r = 0; r < rb; r++) {
            const float *ar = aw + r * rs + p * ps;
            __m256 a0 = _mm256_broadcast_ss(ar), a1 = _mm256_broadcast_ss(ar + 1);
            for (int v = 0; v < nv; v++) acc[r][v] = _mm256_fmadd_ps(a0, be[v], _mm256_fmadd_ps(a1, bo[v], acc[r][v]));
        }
    }
    for (int r = 0; r < rb; r++)
        for (int v = 0; v < nv; v++)
            _mm256_storeu_ps(s + r * NBC + 8 * v, zero_tiny(acc[r][v]));   /* past nb: unread */
}

#define TILE8(RB, NV) \
    case ((RB) - 1) * 2 + (NV) - 1: tile8(RB, NV, part, last, kp, cont, aw, rs, ps, b + 2 * j0, ldb, s + j0); break

/* the sums of rows 0..rb-1 of op(A) (pairs p0..p0+kp-1) against columns
 * 0..nb-1 of B, into s, under DAZ (the caller sets it) */
AVX2_FN __attribute__((noinline)) static void sums_daz(int at, int rb, int64_t nb, int64_t p0, int64_t kp, int cont,
                                                       const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb,
                                                       float *s)
{
    /* A's tile widened, in the order it lies: a row's pairs one after another
     * (at 0), or the tile's rows side by side for each pair (at 1) */
    float aw[8 * KPC];
    int64_t rs = at ? 2 : 2 * KPC, ps = at ? 8 : 2;
    for (int64_t o = 0; o < (at ? kp : rb); o++) {
        const uint16_t *src = at ? a + 2 * (p0 + o) * lda : a + o * lda + 2 * p0;
        float *dst = at ? aw + o * ps : aw + o * rs;
        int64_t len = at ? 2 * rb : 2 * kp, q = 0;
        for (; q + 8 <= len; q += 8)
            _mm256_storeu_ps(dst + q, _mm256_castsi256_ps(_mm256_slli_epi32(
                                          _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + q))), 16)));
        for (; q < len; q++) {
            uint32_t u = (uint32_t)src[q] << 16;
            memcpy(dst + q, &u, 4);
        }
    }
    b += 2 * p0 * ldb;
    for (int64_t j0 = 0; j0 < nb; j0 += 16) {
        int64_t nc = nb - j0 < 16 ? nb - j0 : 16;
        int nv = (int)((nc + 7) / 8), tail = (int)(nc - 8 * (nv - 1)), part = tail < 8;
        __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        switch ((rb - 1) * 2 + nv - 1) {
            TILE8(1, 1); TILE8(1, 2); TILE8(2, 1); TILE8(2, 2);
            TILE8(3, 1); TILE8(3, 2); TILE8(4, 1); TILE8(4, 2);
        }
    }
}

AVX2_FN static void block_gemm_bf16_avx2(int at, int64_t m, int64_t n, int64_t kp, float alpha, const uint16_t *a,
                                         int64_t lda, const uint16_t *b, int64_t ldb, float beta, float *c,
                                         int64_t ldc)
{
    float s[RGC * NBC];
    unsigned csr = _mm_getcsr(), daz = (csr | 0x0040u) & ~0x8000u;   /* DAZ on, FTZ off */
    __m256 al = _mm256_set1_ps(alpha), bt = _mm256_set1_ps(beta);
    for (int64_t g0 = 0; g0 < m; g0 += RGC) {   /* a group of rows: its sums under DAZ, then its epilogue */
        int64_t rg = m - g0 < RGC ? m - g0 : RGC;
        for (int64_t jb = 0; jb < n; jb += NBC) {
            int64_t nb = n - jb < NBC ? n - jb : NBC;
            _mm_setcsr(daz);
            for (int64_t i0 = g0; i0 < g0 + rg; i0 += 4) {
                int rb = g0 + rg - i0 < 4 ? (int)(g0 + rg - i0) : 4;
                const uint16_t *ap = at ? a + 2 * i0 : a + i0 * lda;
                for (int64_t p0 = 0; p0 < kp || p0 == 0; p0 += KPC)
                    sums_daz(at, rb, nb, p0, kp - p0 < KPC ? kp - p0 : KPC, p0 > 0, ap, lda, b + 2 * jb, ldb,
                             s + (i0 - g0) * NBC);
            }
            _mm_setcsr(csr);
            __asm__ __volatile__("" ::: "memory");   /* the epilogue reads s after the restore */
            for (int64_t r = 0; r < rg; r++) {
                float *cr = c + (g0 + r) * ldc + jb;
                const float *sr = s + r * NBC;
                int64_t j = 0;
                for (; j + 8 <= nb; j += 8) {
                    __m256 x = _mm256_mul_ps(al, _mm256_loadu_ps(sr + j));
                    if (beta != 0.0f) x = _mm256_fmadd_ps(bt, _mm256_loadu_ps(cr + j), x);
                    _mm256_storeu_ps(cr + j, x);
                }
                for (; j < nb; j++) {
                    float x = alpha * sr[j];
                    cr[j] = beta != 0.0f ? fmaf(beta, cr[j], x) : x;
                }
            }
        }
    }
}

static int has_avx2_fma(void) { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
#define block_gemm_bf16_avx512 block_gemm_bf16_portable
#define block_gemm_bf16_avx2 block_gemm_bf16_portable
static int has_avx512bf16(void) { return 0; }
static int has_avx2_fma(void) { return 0; }
#endif

typedef void (*gemm_fn)(int, int64_t, int64_t, int64_t, float, const uint16_t *, int64_t, const uint16_t *, int64_t,
                        float, float *, int64_t);
static const struct { const char *name; gemm_fn fn; int (*has)(void); } paths[] = {
    { "avx512bf16", block_gemm_bf16_avx512, has_avx512bf16 },
    { "avx2", block_gemm_bf16_avx2, has_avx2_fma },
    { "portable", block_gemm_bf16_portable, NULL },
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

void cpu_block_gemm_bf16(int at, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda,
                         const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return;
    paths[pick()].fn(at, m, n, (k + 1) / 2, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char *cpu_block_gemm_bf16_path(void) { return paths[pick()].name; }

int cpu_block_gemm_bf16_use(const char *path)
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

/* ---- packing ---- */

MP_SIMD void cpu_bf16_pack_rows(uint16_t *dst, int64_t ldd, const uint16_t *x, int64_t ldx, int64_t rows,
                                int64_t cols)
{
    for (int64_t p = 0; 2 * p < rows; p++) {
        const uint16_t *r0 = x + 2 * p * ldx, *r1 = r0 + ldx;
        uint16_t *d = dst + 2 * p * ldd;
        if (2 * p + 1 < rows)
            for (int64_t j = 0; j < cols; j++) d[2 * j] = r0[j], d[2 * j + 1] = r1[j];
        else
            for (int64_t j = 0; j < cols; j++) d[2 * j] = r0[j], d[2 * j + 1] = 0;
    }
}

void cpu_bf16_pack_cols(uint16_t *dst, int64_t ldd, const uint16_t *x, int64_t ldx, int64_t rows, int64_t cols)
{
    int64_t whole = cols / 2;
    for (int64_t j = 0; j < rows; j++) {   /* 32-bit words of row j become column j of dst */
        const uint16_t *xr = x + j * ldx;
        for (int64_t p = 0; p < whole; p++) {
            uint32_t w;
            memcpy(&w, xr + 2 * p, sizeof w);
            memcpy(dst + 2 * (p * ldd + j), &w, sizeof w);
        }
        if (cols & 1) dst[2 * (whole * ldd + j)] = xr[cols - 1], dst[2 * (whole * ldd + j) + 1] = 0;
    }
}
