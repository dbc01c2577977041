/*
 * test_fp8_cuda.c: the CUDA FP8 GEMM (kernels/cuda/cuda_fp8_gemm.c: cuBLASLt
 * in the TN form with its scale pointers, the 128-chunks of tile and block
 * scales promoted by a kernel) against the CPU's (kernels/cpu/cpu_fp8_gemm.c),
 * on the emulated device (MP_CUDA_BACKEND, as make test runs it): its
 * cuBLASLt sums FP8 products in f32, in another order than the CPU: both
 * within the f32 bound of the exact product, element by element. FAST_ACCUM,
 * which the emulated cuBLASLt answers with the CPU's 14-bit accumulator model,
 * must give the CPU model's bits. A GPU's tensor cores sum FP8 products with
 * fewer bits even in the precise mode, by a rule NVIDIA does not document: on
 * a GPU (MP_CUDA_BACKEND unset) the FP8 tensor-core tests skip (MX, bf16
 * through cuBLAS, still runs), and the parity harness's "fp8 gemm" cases
 * (make gpu-check) hold the hardware to measured bounds.
 */
#define _GNU_SOURCE   /* dladdr */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "engine/device.h"
#include "kernels/cpu/cpu_fp8.h"

typedef int (*fp8_gemm_fn)(mp_kctx *, int64_t, int64_t, int64_t, const mp_fp8_operand *, const mp_fp8_operand *, int,
                           mp_dtype, void *);

static const mp_backend *be;
static fp8_gemm_fn gemm;

/* the loaded CUDA backend's shared object (the emulated device's, or
 * build/mp/cuda.so on a GPU), found from one of its table's functions */
static void *backend_so(void)
{
    Dl_info info;
    if (!be || !dladdr((void *)be->synchronize, &info) || !info.dli_fname) return NULL;
    return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
}

static void setup(void)
{
    be = mp_backend_of(MP_CUDA);
    void *h = backend_so();
    gemm = h ? (fp8_gemm_fn)dlsym(h, "mp_cuda_fp8_gemm") : NULL;
}

TestSuite(fp8_cuda, .init = setup);

static void *up(const void *p, size_t n)
{
    void *d = be->alloc(be->ctx, n);
    cr_assert_not_null(d);
    be->from_host(be->ctx, d, p, n);
    return d;
}

static uint8_t *codes(int64_t n, mp_fp8_format fmt, unsigned seed)
{
    uint8_t *q = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        do q[i] = (uint8_t)rand_r(&seed); while (!isfinite(mp_fp8_to_f32(q[i], fmt)));
    }
    return q;
}

static float *scales(mp_fp8_gran g, int64_t rows, int64_t k, unsigned seed)
{
    int64_t n = mp_fp8_nscales(g, rows, k);
    float *d = malloc(sizeof *d * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = 0.05f + (float)(rand_r(&seed) % 3000) / 1000.0f;
    return d;
}

/* C on both backends (dtype out); the CPU with its 14-bit accumulator where
 * model (then bit for bit), else f32 sums (within the f32 bound) */
static void compare_as(int64_t m, int64_t n, int64_t k, mp_fp8_gran ga, mp_fp8_gran gb, mp_fp8_format fa,
                       mp_fp8_format fb, int fast, int model, mp_dtype out)
{
    if (!gemm) cr_skip_test("no CUDA backend (no GPU, MP_CUDA_BACKEND unset)");
    if (!getenv("MP_CUDA_BACKEND")) cr_skip_test("a GPU: its FP8 sums are the hardware's (tests/parity's fp8 gemm cases)");
    uint8_t *qa = codes(m * k, fa, 1), *qb = codes(n * k, fb, 2);
    float *sa = scales(ga, m, k, 3), *sb = scales(gb, n, k, 4);
    size_t nsa = sizeof(float) * (size_t)mp_fp8_nscales(ga, m, k), nsb = sizeof(float) * (size_t)mp_fp8_nscales(gb, n, k);
    mp_fp8_operand ha = {qa, fa, ga, sa}, hb = {qb, fb, gb, sb};
    mp_fp8_operand da = {up(qa, (size_t)(m * k)), fa, ga, up(sa, nsa)}, db = {up(qb, (size_t)(n * k)), fb, gb, up(sb, nsb)};
    size_t es = mp_dtype_size(out), nc = (size_t)(m * n);
    void *dc = be->alloc(be->ctx, es * nc), *hc = malloc(es * nc), *cc = malloc(es * nc);
    cr_assert_eq(gemm(be->ctx, m, n, k, &da, &db, fast, out, dc), 0, "the CUDA FP8 GEMM declined");
    be->to_host(be->ctx, hc, dc, es * nc);
    const char *err = be->error ? be->error(be->ctx) : NULL;
    cr_assert_null(err, "%s", err);
    cr_assert_eq(cpu_fp8_gemm(mp_backend_of(MP_CPU)->ctx, m, n, k, &ha, &hb, model ? 14 : 0, 0, out, cc), 0);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            size_t e = (size_t)(i * n + j);
            float x = out == MP_F32 ? ((float *)hc)[e] : mp_bf16_to_f32(((uint16_t *)hc)[e]);
            float y = out == MP_F32 ? ((float *)cc)[e] : mp_bf16_to_f32(((uint16_t *)cc)[e]);
            if (model) {
                cr_assert_eq(x, y, "fast accumulation at (%ld, %ld): %.9g vs the model's %.9g", (long)i, (long)j, x, y);
                continue;
            }
            double mag = 0;
            for (int64_t q = 0; q < k; q++) {
                int64_t ca = q / 128;
                double s = (ga == MP_FP8_TENSOR ? sa[0] : ga == MP_FP8_TILE ? sa[i * ((k + 127) / 128) + ca]
                                                                           : sa[i / 128 * ((k + 127) / 128) + ca]) *
                           (gb == MP_FP8_TENSOR ? sb[0] : gb == MP_FP8_TILE ? sb[j * ((k + 127) / 128) + ca]
                                                                           : sb[j / 128 * ((k + 127) / 128) + ca]);
                mag += fabs(mp_fp8_to_f32(qa[i * k + q], fa) * (double)mp_fp8_to_f32(qb[j * k + q], fb) * s);
            }
            /* two f32 sums of the same terms, each within (k + c) 2^-24 mag
             * of the exact one; a bf16 C: one bf16 ulp apart at most */
            double bound = out == MP_F32 ? 2.0 * (double)(k + 2 * (k / 128) + 4) * 0x1p-24 * mag
                                         : fmax(fabs((double)y) * 0x1p-7, 0x1p-24 * mag * (double)k);
            cr_assert_leq(fabs((double)x - y), bound, "(%ld, %ld): %.9g vs %.9g", (long)i, (long)j, x, y);
        }
    be->free(be->ctx, (void *)da.q, (size_t)(m * k)), be->free(be->ctx, (void *)db.q, (size_t)(n * k));
    be->free(be->ctx, (void *)da.scales, nsa), be->free(be->ctx, (void *)db.scales, nsb), be->free(be->ctx, dc, es * nc);
    free(qa), free(qb), free(sa), free(sb), free(hc), free(cc);
}

static void compare(int64_t m, int64_t n, int64_t k, mp_fp8_gran ga, mp_fp8_gran gb, mp_fp8_format fb, int fast,
                    mp_dtype out)
{
    compare_as(m, n, k, ga, gb, MP_FP8_E4M3, fb, fast, fast, out);
}

Test(fp8_cuda, tensor_scales) { compare(40, 36, 384, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E4M3, 0, MP_F32); }
Test(fp8_cuda, tensor_e5m2_bf16_out) { compare(24, 50, 256, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E5M2, 0, MP_BF16); }
Test(fp8_cuda, tile_by_block) { compare(33, 140, 400, MP_FP8_TILE, MP_FP8_BLOCK, MP_FP8_E4M3, 0, MP_F32); }
Test(fp8_cuda, tile_by_block_bf16_out) { compare(20, 30, 272, MP_FP8_TILE, MP_FP8_BLOCK, MP_FP8_E4M3, 0, MP_BF16); }
Test(fp8_cuda, fast_accum_is_the_model) { compare(16, 24, 2048, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E4M3, 1, MP_F32); }

/* two MX operands: the CUDA side decodes them to bf16 with their powers of
 * two and runs cuBLAS's bf16 GEMM; the CPU folds or chunks. Both f32 sums of
 * the same exact products: within the f32 bound. E8M0 bytes within lo..hi. */
static void compare_mx(int64_t m, int64_t n, int64_t k, mp_fp8_format fa, mp_fp8_format fb, int lo, int hi,
                       mp_dtype out)
{
    if (!gemm) cr_skip_test("no CUDA backend (no GPU, MP_CUDA_BACKEND unset)");
    int64_t nb = (k + 31) / 32;
    uint8_t *qa = codes(m * k, fa, 5), *qb = codes(n * k, fb, 6);
    uint8_t *ea = malloc((size_t)(m * nb)), *eb = malloc((size_t)(n * nb));
    /* block c's exponent in a: a base from lo..hi per c, +-2 per row; in b its
     * mirror 254 - base, +-2: the products stay near 1 however wide the scales */
    unsigned seed = 9;
    int *base = malloc(sizeof *base * (size_t)nb);
    for (int64_t c = 0; c < nb; c++) base[c] = lo + 2 + rand_r(&seed) % (hi - lo - 3);
    for (int64_t i = 0; i < m * nb; i++) ea[i] = (uint8_t)(base[i % nb] + rand_r(&seed) % 5 - 2);
    for (int64_t i = 0; i < n * nb; i++) eb[i] = (uint8_t)(254 - base[i % nb] + rand_r(&seed) % 5 - 2);
    free(base);
    mp_fp8_operand ha = {qa, fa, MP_FP8_MX, ea}, hb = {qb, fb, MP_FP8_MX, eb};
    mp_fp8_operand da = {up(qa, (size_t)(m * k)), fa, MP_FP8_MX, up(ea, (size_t)(m * nb))};
    mp_fp8_operand db = {up(qb, (size_t)(n * k)), fb, MP_FP8_MX, up(eb, (size_t)(n * nb))};
    size_t es = mp_dtype_size(out), nc = (size_t)(m * n);
    void *dc = be->alloc(be->ctx, es * nc), *hc = malloc(es * nc), *cc = malloc(es * nc);
    cr_assert_eq(gemm(be->ctx, m, n, k, &da, &db, 0, out, dc), 0, "the CUDA MX GEMM declined");
    be->to_host(be->ctx, hc, dc, es * nc);
    const char *err = be->error ? be->error(be->ctx) : NULL;
    cr_assert_null(err, "%s", err);
    cr_assert_eq(cpu_fp8_gemm(mp_backend_of(MP_CPU)->ctx, m, n, k, &ha, &hb, 0, 0, out, cc), 0);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            size_t e = (size_t)(i * n + j);
            float x = out == MP_F32 ? ((float *)hc)[e] : mp_bf16_to_f32(((uint16_t *)hc)[e]);
            float y = out == MP_F32 ? ((float *)cc)[e] : mp_bf16_to_f32(((uint16_t *)cc)[e]);
            double mag = 0, exact = 0;
            for (int64_t q = 0; q < k; q++) {
                double t = ldexp(mp_fp8_to_f32(qa[i * k + q], fa), ea[i * nb + q / 32] - 127) *
                           ldexp(mp_fp8_to_f32(qb[j * k + q], fb), eb[j * nb + q / 32] - 127);
                mag += fabs(t), exact += t;
            }
            double bound = out == MP_F32 ? 2.0 * (double)(k + 2 * nb + 4) * 0x1p-24 * mag
                                         : fmax(fabs((double)y) * 0x1p-7, 0x1p-24 * mag * (double)k);
            cr_assert_leq(fabs((double)x - y), bound, "(%ld, %ld): %.9g vs %.9g", (long)i, (long)j, x, y);
            if (out == MP_F32)
                cr_assert_leq(fabs((double)x - exact), (double)(k + 4) * 0x1p-24 * mag, "(%ld, %ld) against the "
                              "exact sum %.17g: %.9g", (long)i, (long)j, exact, x);
        }
    be->free(be->ctx, (void *)da.q, (size_t)(m * k)), be->free(be->ctx, (void *)db.q, (size_t)(n * k));
    be->free(be->ctx, (void *)da.scales, (size_t)(m * nb)), be->free(be->ctx, (void *)db.scales, (size_t)(n * nb));
    be->free(be->ctx, dc, es * nc);
    free(qa), free(qb), free(ea), free(eb), free(hc), free(cc);
}

Test(fp8_cuda, mx) { compare_mx(40, 36, 384, MP_FP8_E4M3, MP_FP8_E4M3, 117, 137, MP_F32); }
Test(fp8_cuda, mx_e5m2_both_bf16_out_odd_k) { compare_mx(17, 30, 200, MP_FP8_E5M2, MP_FP8_E5M2, 120, 134, MP_BF16); }
/* block exponents 2^-100 .. 2^100 (the CPU cuts k into its 32-blocks there;
 * the CUDA side's bf16 values stay normal) */
Test(fp8_cuda, mx_wide_scales) { compare_mx(9, 12, 96, MP_FP8_E4M3, MP_FP8_E5M2, 27, 227, MP_F32); }

/* what cuBLASLt declines (the emulated one by the H200's rules: k not a
 * multiple of 16, two e5m2 operands, D's rows not 16 bytes) runs as
 * decoded_gemm: bf16 codes, cuBLAS's bf16 GEMM, f32 sums whatever fast says */
Test(fp8_cuda, declined_k_not_16) { compare(8, 8, 24, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E4M3, 0, MP_F32); }
Test(fp8_cuda, declined_two_e5m2) {
    compare_as(9, 16, 64, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E5M2, MP_FP8_E5M2, 0, 0, MP_BF16);
}
Test(fp8_cuda, declined_rows_f32) { compare(6, 5, 256, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E4M3, 0, MP_F32); }
Test(fp8_cuda, declined_rows_tile_by_block) {
    compare(150, 130, 208, MP_FP8_TILE, MP_FP8_BLOCK, MP_FP8_E4M3, 0, MP_F32);
}
Test(fp8_cuda, declined_rows_bf16) { compare(7, 12, 48, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E4M3, 0, MP_BF16); }
Test(fp8_cuda, declined_fast_sums_in_f32) {
    compare_as(16, 5, 2048, MP_FP8_TENSOR, MP_FP8_TENSOR, MP_FP8_E4M3, MP_FP8_E4M3, 1, 0, MP_F32);
}

/* MX multiplies with MX only: declined otherwise (the engine says so first) */
Test(fp8_cuda, declines_mx_with_another)
{
    if (!gemm) cr_skip_test("no CUDA backend (no GPU, MP_CUDA_BACKEND unset)");
    uint8_t q[40 * 32] = {0}, e8[40] = {127};
    float one = 1;
    void *dq = up(q, sizeof q), *ds = up(&one, 4), *de = up(e8, sizeof e8), *dc = be->alloc(be->ctx, 4 * 64);
    mp_fp8_operand t = {dq, MP_FP8_E4M3, MP_FP8_TENSOR, ds}, mx = {dq, MP_FP8_E4M3, MP_FP8_MX, de};
    cr_assert_eq(gemm(be->ctx, 8, 8, 32, &mx, &t, 0, MP_F32, dc), 1, "MX with a tensor scale");
    cr_assert_eq(gemm(be->ctx, 8, 8, 32, &t, &mx, 0, MP_F32, dc), 1, "a tensor scale with MX");
    const char *err = be->error ? be->error(be->ctx) : NULL;
    cr_assert_null(err, "%s", err);
    be->free(be->ctx, dq, sizeof q), be->free(be->ctx, ds, 4), be->free(be->ctx, de, sizeof e8);
    be->free(be->ctx, dc, 4 * 64);
}

typedef int (*fp8_quant_fn)(mp_kctx *, mp_dtype, const void *, int64_t, int64_t, mp_fp8_format, mp_fp8_gran,
                            const float *, uint8_t *, void *, unsigned long long *);

/* the same codes, scales and statistics as the CPU's, byte for byte */
static void quant_same(mp_dtype dt, int64_t rows, int64_t k, mp_fp8_format fmt, mp_fp8_gran g, float given)
{
    void *h = backend_so();
    fp8_quant_fn quant = h ? (fp8_quant_fn)dlsym(h, "mp_cuda_fp8_quantize") : NULL;
    if (!quant) cr_skip_test("no CUDA backend (no GPU, MP_CUDA_BACKEND unset)");
    int64_t n = rows * k, ns = mp_fp8_nscales(g, rows, k);
    size_t es = mp_dtype_size(dt), ss = g == MP_FP8_MX ? 1 : 4;
    unsigned seed = (unsigned)(rows * 31 + k);
    char *x = malloc(es * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        /* normal-ish over many binades, with zeros, tiny values and some past e4m3's range */
        float v = (float)ldexp((double)rand_r(&seed) / RAND_MAX - 0.5, rand_r(&seed) % 40 - 30);
        if (i % 97 == 0) v = 0;
        if (given > 0 && i % 89 == 0) v = 1000.0f / given;
        if (dt == MP_F32) ((float *)x)[i] = v;
        else ((uint16_t *)x)[i] = dt == MP_F16 ? mp_f32_to_f16(v) : mp_f32_to_bf16(v);
    }
    uint8_t *qc = malloc((size_t)n), *qg = malloc((size_t)n);
    char *sc = malloc(ss * (size_t)ns), *sg = malloc(ss * (size_t)ns);
    mp_fp8_stats st;
    cr_assert_eq(cpu_fp8_quantize(mp_backend_of(MP_CPU)->ctx, dt, x, rows, k, fmt, g, given > 0 ? &given : NULL, qc,
                                  sc, &st), 0);
    void *dx = up(x, es * (size_t)n), *dg = given > 0 ? up(&given, 4) : NULL, *dq = be->alloc(be->ctx, (size_t)n);
    void *ds = be->alloc(be->ctx, ss * (size_t)ns), *dst = be->alloc(be->ctx, 32);
    cr_assert_eq(quant(be->ctx, dt, dx, rows, k, fmt, g, dg, dq, ds, dst), 0);
    unsigned long long w[4];
    be->to_host(be->ctx, qg, dq, (size_t)n);
    be->to_host(be->ctx, sg, ds, ss * (size_t)ns);
    be->to_host(be->ctx, w, dst, sizeof w);
    const char *err = be->error ? be->error(be->ctx) : NULL;
    cr_assert_null(err, "%s", err);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(qg[i], qc[i], "code %ld: %#x vs the CPU's %#x", (long)i, qg[i], qc[i]);
    cr_assert_eq(memcmp(sg, sc, ss * (size_t)ns), 0, "the scales differ");
    float amax;
    uint32_t bits = (uint32_t)w[0];
    memcpy(&amax, &bits, 4);
    cr_assert_eq(amax, st.amax);
    cr_assert_eq((int64_t)w[1], st.saturated);
    cr_assert_eq((int64_t)w[2], st.flushed);
    float f[2];   /* word 3: the counts as f32, made on the device for a device tensor */
    memcpy(f, &w[3], sizeof f);
    cr_assert_eq(f[0], (float)st.saturated);
    cr_assert_eq(f[1], (float)st.flushed);
    cr_assert(st.flushed > 0, "the test has flushed values (tiny ones)");
    cr_assert(g != MP_FP8_TENSOR || given <= 0 || st.saturated > 0, "the test puts saturated values in");
    be->free(be->ctx, dx, es * (size_t)n), be->free(be->ctx, dq, (size_t)n), be->free(be->ctx, ds, ss * (size_t)ns);
    be->free(be->ctx, dst, 32);
    if (dg) be->free(be->ctx, dg, 4);
    free(x), free(qc), free(qg), free(sc), free(sg);
}

Test(fp8_cuda, quantize_tensor) { quant_same(MP_F32, 50, 300, MP_FP8_E4M3, MP_FP8_TENSOR, 0); }
Test(fp8_cuda, quantize_given_scale) { quant_same(MP_BF16, 20, 200, MP_FP8_E4M3, MP_FP8_TENSOR, 3.0f); }
Test(fp8_cuda, quantize_tiles) { quant_same(MP_F16, 9, 300, MP_FP8_E4M3, MP_FP8_TILE, 0); }
Test(fp8_cuda, quantize_blocks) { quant_same(MP_F32, 130, 260, MP_FP8_E5M2, MP_FP8_BLOCK, 0); }
Test(fp8_cuda, quantize_mx) { quant_same(MP_BF16, 7, 200, MP_FP8_E4M3, MP_FP8_MX, 0); }
