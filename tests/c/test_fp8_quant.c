/*
 * test_fp8_quant.c: the FP8 quantizer (kernels/cpu/cpu_fp8_quant.c) against
 * references written from its contract in double: the amax, each group's
 * scale (FP8_MAX / amax; the OCP MX rule for E8M0 scales), every code as the
 * reference conversion of x times the group's multiplier, the round trip's
 * error bound, and the saturation and flush counts of a given scale.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu_fp8.h"
#include "kernels/cpu/cpu_fp8_seg.h"
#include "kernels/half.h"

static mp_kctx *cx(void) { return mp_cpu_backend.ctx; }

/* n normal-ish values over many binades: a sum of uniforms times 2^(-8..4) */
static float *rand_x(int64_t n, unsigned seed)
{
    float *x = malloc(sizeof *x * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        double u = 0;
        for (int j = 0; j < 4; j++) u += (double)rand_r(&seed) / RAND_MAX - 0.5;
        x[i] = (float)ldexp(u, rand_r(&seed) % 13 - 8);
    }
    return x;
}

static float amax_of(const float *x, int64_t r0, int64_t r1, int64_t j0, int64_t j1, int64_t k)
{
    float a = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = j0; j < j1; j++) a = fmaxf(a, fabsf(x[r * k + j]));
    return a;
}

/* the group's codes are the reference conversion of x times its multiplier */
static void check_group(const float *x, const uint8_t *q, int64_t r0, int64_t r1, int64_t j0, int64_t j1, int64_t k,
                        float s, mp_fp8_format fmt)
{
    for (int64_t r = r0; r < r1; r++)
        for (int64_t j = j0; j < j1; j++)
            cr_assert_eq(q[r * k + j], mp_f32_to_fp8(x[r * k + j] * s, fmt, 1), "code (%ld, %ld)", (long)r, (long)j);
}

Test(fp8_quant, tensor_scale_and_round_trip)
{
    int64_t rows = 70, k = 1000, n = rows * k;   /* past MP_PAR_MIN_MEM: threads */
    float *x = rand_x(n, 7), d;
    uint8_t *q = malloc((size_t)n);
    mp_fp8_stats st;
    cr_assert_eq(cpu_fp8_quantize(cx(), MP_F32, x, rows, k, MP_FP8_E4M3, MP_FP8_TENSOR, NULL, q, &d, &st), 0);
    float amax = amax_of(x, 0, rows, 0, k, k), s = 448.0f / amax;
    cr_assert_eq(st.amax, amax);
    cr_assert_eq(d, 1.0f / s);
    cr_assert_eq(st.saturated, 0);
    check_group(x, q, 0, rows, 0, k, k, s, MP_FP8_E4M3);
    int64_t flushed = 0;
    for (int64_t i = 0; i < n; i++) {
        /* e4m3 keeps 3 bits: half an ulp is 2^-4 relative; below its normals
         * (2^-6) the step is 2^-9 absolute, in units of the scaled value */
        double v = mp_e4m3_to_f32(q[i]) * (double)d, e = fabs(v - x[i]);
        double bound = fmax(ldexp(fabs(x[i]), -4), ldexp(1.0, -10) * d) * (1 + 1e-6);
        cr_assert_leq(e, bound, "element %ld: %g -> %g", (long)i, x[i], v);
        flushed += x[i] != 0 && (q[i] & 0x7f) == 0;
        if (fabsf(x[i]) == amax) cr_assert_eq(q[i] & 0x7f, 0x7e, "amax -> 448");
    }
    cr_assert_eq(st.flushed, flushed);
    free(x), free(q);
}

Test(fp8_quant, given_scale_counts)
{
    /* scale 2: 300 -> 600 saturates; -224 -> -448 does not; 2^-12 -> 2^-11
     * flushes; 2^-11 -> 2^-10 is the tie to even at zero (flushed); 1.5 2^-11
     * -> 1.5 2^-10 rounds up to 2^-9; 0 is not a flush */
    float x[] = {300, -224, 0x1p-12f, 0x1p-11f, 0x1.8p-11f, 0, -1e6f, 1};
    uint8_t q[8];
    float s = 2, d;
    mp_fp8_stats st;
    cr_assert_eq(cpu_fp8_quantize(cx(), MP_F32, x, 2, 4, MP_FP8_E4M3, MP_FP8_TENSOR, &s, q, &d, &st), 0);
    cr_assert_eq(d, 0.5f);
    cr_assert_eq(st.amax, 1e6f);
    cr_assert_eq(st.saturated, 2);
    cr_assert_eq(st.flushed, 2);
    cr_assert_eq(q[0], 0x7e);
    cr_assert_eq(q[1], 0xfe);
    cr_assert_eq(q[4], 0x01);
    cr_assert_eq(q[6], 0xfe);
    x[7] = NAN;
    cr_assert_eq(cpu_fp8_quantize(cx(), MP_F32, x, 2, 4, MP_FP8_E5M2, MP_FP8_TENSOR, &s, q, &d, &st), 0);
    cr_assert(isnan(st.amax), "a NaN input makes the amax NaN");
    cr_assert_eq(q[7], 0x7f);
    cr_assert_eq(st.saturated, 1, "e5m2 holds 600, and -2e6 saturates: %ld", (long)st.saturated);
}

Test(fp8_quant, e5m2_saturation)
{
    /* saturated: what rounds past 57344 (1.11b 2^15). 61440, the midpoint to
     * 2^16, ties to the even 2^16 and saturates; 61000 rounds down to 57344
     * and does not (it is above the largest value, not past it) */
    float x[] = {1e5f, -7e4f, 61440, 61000}, s = 1, d;
    uint8_t q[4];
    mp_fp8_stats st;
    cpu_fp8_quantize(cx(), MP_F32, x, 1, 4, MP_FP8_E5M2, MP_FP8_TENSOR, &s, q, &d, &st);
    cr_assert_eq(st.saturated, 3);
    cr_assert_eq(q[3], 0x7b);
    cr_assert_eq(q[0], 0x7b);
    cr_assert_eq(q[1], 0xfb);
    cr_assert_eq(q[2], 0x7b);
}

/* tiles and blocks: each group's scale from its own amax */
static void check_tiled(mp_fp8_gran g, mp_dtype dt, int64_t rows, int64_t k, mp_fp8_format fmt)
{
    float *x = rand_x(rows * k, (unsigned)(rows + k));
    x[5] = 0;   /* keep a zero in */
    void *in = x;
    uint16_t *h = NULL;
    if (dt != MP_F32) {   /* the values as f16/bf16, x their exact widening */
        h = malloc(2 * (size_t)(rows * k));
        for (int64_t i = 0; i < rows * k; i++) {
            h[i] = dt == MP_F16 ? mp_f32_to_f16(x[i]) : mp_f32_to_bf16(x[i]);
            x[i] = dt == MP_F16 ? mp_f16_to_f32(h[i]) : mp_bf16_to_f32(h[i]);
        }
        in = h;
    }
    int64_t ns = mp_fp8_nscales(g, rows, k), nk = (k + 127) / 128;
    float *d = malloc(sizeof *d * (size_t)ns);
    uint8_t *q = malloc((size_t)(rows * k));
    mp_fp8_stats st;
    cr_assert_eq(cpu_fp8_quantize(cx(), dt, in, rows, k, fmt, g, NULL, q, d, &st), 0);
    cr_assert_eq(st.amax, amax_of(x, 0, rows, 0, k, k));
    float fmax = mp_fp8_to_f32(fmt.maxcode, fmt);
    int64_t rb = g == MP_FP8_BLOCK ? 128 : 1;
    for (int64_t r0 = 0, bi = 0; r0 < rows; r0 += rb)
        for (int64_t j0 = 0; j0 < k; j0 += 128, bi++) {
            int64_t r1 = r0 + rb < rows ? r0 + rb : rows, j1 = j0 + 128 < k ? j0 + 128 : k;
            float a = amax_of(x, r0, r1, j0, j1, k), s = a > 0 ? fmax / a : 1;
            cr_assert_eq(bi, g == MP_FP8_BLOCK ? r0 / 128 * nk + j0 / 128 : r0 * nk + j0 / 128);
            cr_assert_eq(d[bi], 1.0f / s, "group %ld", (long)bi);
            check_group(x, q, r0, r1, j0, j1, k, s, fmt);
        }
    free(x), free(h), free(d), free(q);
}

Test(fp8_quant, tiles) { check_tiled(MP_FP8_TILE, MP_F32, 5, 300, MP_FP8_E4M3); }
Test(fp8_quant, tiles_bf16_e5m2) { check_tiled(MP_FP8_TILE, MP_BF16, 260, 257, MP_FP8_E5M2); }
Test(fp8_quant, blocks) { check_tiled(MP_FP8_BLOCK, MP_F32, 130, 260, MP_FP8_E4M3); }
Test(fp8_quant, blocks_f16) { check_tiled(MP_FP8_BLOCK, MP_F16, 300, 400, MP_FP8_E4M3); }

Test(fp8_quant, mx_scale_rule)
{
    /* one row of 5 blocks of 32 (the last 8 long): the block amax A gives
     * X = 2^(floor(log2 A) - emax); emax 8 for e4m3, 15 for e5m2 */
    float amax[] = {1.0f, 448.0f, 500.0f, 0.0f, 0x1p-140f};
    int64_t k = 4 * 32 + 8;
    float x[136];
    for (int b = 0; b < 5; b++)
        for (int j = 0; j < 32 && b * 32 + j < k; j++) x[b * 32 + j] = amax[b] * (j % 3 == 0 ? -1.0f : 0.375f);
    for (int f = 0; f < 2; f++) {
        mp_fp8_format fmt = f ? MP_FP8_E5M2 : MP_FP8_E4M3;
        int emax = f ? 15 : 8;
        uint8_t q[136], e8[5];
        mp_fp8_stats st;
        cr_assert_eq(cpu_fp8_quantize(cx(), MP_F32, x, 1, k, fmt, MP_FP8_MX, NULL, q, e8, &st), 0);
        for (int b = 0; b < 5; b++) {
            int e = amax[b] == 0 ? 0 : (int)floor(log2((double)amax[b])) - emax;
            e = e < -127 ? -127 : e;
            cr_assert_eq(e8[b], e + 127, "%s block %d: %d vs %d", f ? "e5m2" : "e4m3", b, e8[b], e + 127);
            for (int j = 0; j < 32 && b * 32 + j < k; j++)
                cr_assert_eq(q[b * 32 + j], mp_f32_to_fp8(ldexpf(x[b * 32 + j], -e), fmt, 1));
        }
        /* 500 = 1.95 2^8 becomes 1.95 2^emax, past the largest value
         * (1.75 2^emax) in both formats: the rule saturates the 11 elements
         * of block 2 that hold -500 */
        cr_assert_eq(st.saturated, 11);
        cr_assert_eq(st.amax, 500.0f);
    }
    x[40] = NAN;
    uint8_t q[136], e8[5];
    mp_fp8_stats st;
    cpu_fp8_quantize(cx(), MP_F32, x, 1, k, MP_FP8_E4M3, MP_FP8_MX, NULL, q, e8, &st);
    cr_assert_eq(e8[1], 0xff, "a block holding a NaN has a NaN scale");
    cr_assert(isnan(st.amax));
}

Test(fp8_quant, nscales)
{
    cr_assert_eq(mp_fp8_nscales(MP_FP8_TENSOR, 300, 300), 1);
    cr_assert_eq(mp_fp8_nscales(MP_FP8_TILE, 3, 257), 9);
    cr_assert_eq(mp_fp8_nscales(MP_FP8_BLOCK, 129, 256), 4);
    cr_assert_eq(mp_fp8_nscales(MP_FP8_MX, 2, 33), 4);
}

Test(fp8_quant, entry_words)
{
    /* the backend entry's four words: the amax's bits, the two counts, and
     * word 3 the counts as f32 {saturated, flushed} (what a device tensor of
     * them is copied from) */
    float x[] = {300, -224, 0x1p-12f, 0x1p-11f, 0x1.8p-11f, 0, -1e6f, 1}, s = 2, d;
    uint8_t q[8];
    unsigned long long w[4];
    memset(w, 0xff, sizeof w);
    cr_assert_eq(cpu_fp8_quantize_entry(cx(), MP_F32, x, 2, 4, MP_E4M3, MP_FP8_TENSOR, &s, q, &d, w), 0);
    float amax, f[2];
    uint32_t bits = (uint32_t)w[0];
    memcpy(&amax, &bits, 4);
    memcpy(f, &w[3], sizeof f);
    cr_assert_eq(amax, 1e6f);
    cr_assert_eq(w[1], 2);
    cr_assert_eq(w[2], 2);
    cr_assert_eq(f[0], 2.0f);
    cr_assert_eq(f[1], 2.0f);
}

/* The quantizer's fast loops (cpu_fp8_seg.c: portable and, where the CPU has
 * it, AVX-512) against the reference loop on a dense sample of f32 patterns:
 * both signs, every exponent (f32 subnormals, zeros, inf, NaNs included), all
 * 256 values of the top eight mantissa bits (which hold every rounding
 * boundary of both formats: the halfway points of e4m3/e5m2 normals and
 * subnormals, the subnormal edges, the largest finite values and the points
 * past them) and low bits at and beside those boundaries; five multipliers,
 * segments of lengths that leave vector tails. Codes byte for byte; amax, NaN
 * flag and counts per segment. scripts/bench/fp8_quant_exhaustive.c walks all
 * 2^32 patterns. */
Test(fp8_quant, fast_paths_match_reference, .timeout = 120)
{
    static const uint32_t low[] = {0, 1, 2, 0x3fff, 0x4000, 0x4001, 0x7ffe, 0x7fff,
                                   0x1234, 0x5a5a, 0x0f0f, 0x6001, 0x2000, 0x7000, 0x0800, 0x0100};
    static const float mult[] = {1.0f, 0.75f, 3.0f, 0x1p-20f, 0x1p40f};
    static const int64_t lens[] = {4096, 1, 15, 17, 127, 33, 128, 4000};
    const int64_t n = 2 * 256 * 256 * 16;
    float *x = malloc(sizeof *x * (size_t)n);
    uint8_t *qr = malloc((size_t)n), *qp = malloc((size_t)n);
    int64_t i = 0;
    for (uint32_t sg = 0; sg < 2; sg++)
        for (uint32_t e = 0; e < 256; e++)
            for (uint32_t top = 0; top < 256; top++)
                for (int l = 0; l < 16; l++, i++) {
                    uint32_t u = sg << 31 | e << 23 | top << 15 | low[l];
                    memcpy(&x[i], &u, 4);
                }
    int np;
    const cpu_fp8_seg_path *paths = cpu_fp8_seg_paths(&np);
    cr_assert_geq(np, 2, "at least the reference and the portable loop");
    cr_assert_str_eq(paths[0].name, "reference");
    cr_assert_eq(cpu_fp8_seg_best(), &paths[np - 1], "the quantizer takes the last path");
    mp_fp8_format fmts[2] = {MP_FP8_E4M3, MP_FP8_E5M2};
    for (int p = 1; p < np; p++)
        for (int f = 0; f < 2; f++)
            for (int m = 0; m < 5; m++) {
                int64_t segs = 0, sat = 0, flu = 0, nan = 0;
                for (int64_t off = 0, li = 0; off < n; off += lens[li % 8], li++) {
                    int64_t len = n - off < lens[li % 8] ? n - off : lens[li % 8];
                    cpu_fp8_seen a = {0}, b = {0};
                    paths[0].amax(x + off, len, &a);
                    paths[0].codes(x + off, len, mult[m], fmts[f], qr + off, &a);
                    paths[p].amax(x + off, len, &b);
                    paths[p].codes(x + off, len, mult[m], fmts[f], qp + off, &b);
                    cr_assert_eq(mp_f32_bits(a.amax), mp_f32_bits(b.amax), "%s amax at %ld", paths[p].name, (long)off);
                    cr_assert_eq(a.nan, b.nan, "%s NaN flag at %ld", paths[p].name, (long)off);
                    cr_assert_eq(a.saturated, b.saturated, "%s saturated at %ld", paths[p].name, (long)off);
                    cr_assert_eq(a.flushed, b.flushed, "%s flushed at %ld", paths[p].name, (long)off);
                    segs++, sat += a.saturated, flu += a.flushed, nan += a.nan;
                }
                for (int64_t j = 0; j < n; j++)
                    cr_assert_eq(qr[j], qp[j], "%s fmt %d x %g: pattern 0x%08x: 0x%02x, reference 0x%02x",
                                 paths[p].name, f, mult[m], mp_f32_bits(x[j]), qp[j], qr[j]);
                /* the sample reaches what it is meant to: saturations, flushes, NaNs */
                cr_assert_gt(sat, 0);
                cr_assert_gt(flu, 0);
                cr_assert_gt(nan, 0);
                cr_assert_gt(segs, 1000);
            }
    free(x), free(qr), free(qp);
}
