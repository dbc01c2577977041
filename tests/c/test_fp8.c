/*
 * test_fp8.c: the FP8 dtypes' conversions (kernels/fp8.h, the CPU's bulk
 * casts in cpu_fp8_cast.c / cpu_create.c) against references that share no
 * code with them.
 *
 * - Every one of the 256 codes of e4m3 and e5m2 decodes to the value of its
 *   fields (ldexp of mantissa and exponent, NaN and inf by the OCP rules),
 *   through the scalar decoder and the bulk casts to f32, f16 and bf16 (which
 *   hold every FP8 value exactly).
 * - A dense sample of f32 bit patterns (every 4096th, 2^20 of them, and 512
 *   patterns around each boundary: the largest finite values, the overflow
 *   midpoints 464 and 61440, the smallest subnormals and their halves, the
 *   smallest normals, zero, inf, NaN, both signs) in both modes and both
 *   formats against:
 *     - a reference computed in double: the nearest of the format's values
 *       (ties to the even code), with one value past the largest finite one
 *       whose choice is the overflow (its code is NaN or inf);
 *     - the CUDA toolkit's own host conversion __nv_cvt_float_to_fp8
 *       (cuda_fp8.h, plain C), when the toolkit's headers were found at
 *       build time (Makefile: MP_CUDA_FP8_REF); the test is skipped without
 *       them. scripts/bench/fp8_exhaustive.c walks all 2^32 patterns.
 *   The scalar conversion and the CPU's bulk cast (its tail and block paths)
 *   both.
 * - Every f16 and bf16 pattern cast in bulk equals the scalar conversion of
 *   its widened value (one rounding); f64 values crafted to lie just off an
 *   FP8 midpoint that an f32 would round onto round once, as the double
 *   reference says (the f32 on the way is rounded to odd).
 * - FP8 -> FP8 (e4m3 <-> e5m2) in bulk is the scalar decode then encode.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/fp8.h"
#include "kernels/half.h"
#ifdef MP_CUDA_FP8_REF
#include <cuda_fp8.h>
#endif

extern const mp_backend mp_cpu_backend;

typedef struct { const char *name; mp_dtype dt; mp_fp8_format f; int mbits, bias; double max, next; } fmt8;
/* next: the value past the largest finite one, where overflow begins (its
 * code, maxcode + 1, is NaN for e4m3 and inf for e5m2) */
static const fmt8 FORMATS[2] = {
    {"e4m3", MP_E4M3, MP_FP8_E4M3, 3, 7, 448.0, 480.0},
    {"e5m2", MP_E5M2, MP_FP8_E5M2, 2, 15, 57344.0, 65536.0},
};

/* ---- the field-by-field value of a code ---- */
static double field_value(const fmt8 *F, unsigned c, int *nan, int *inf)
{
    int s = c >> 7, e = (c >> F->mbits) & ((1 << (7 - F->mbits)) - 1), m = c & ((1 << F->mbits) - 1);
    int emax = (1 << (7 - F->mbits)) - 1;
    *nan = *inf = 0;
    if (F->mbits == 3 && e == emax && m == 7) *nan = 1;                 /* E4M3FN: S.1111.111 only */
    if (F->mbits == 2 && e == emax) { if (m) *nan = 1; else *inf = 1; }  /* E5M2: IEEE */
    double v = e == 0 ? ldexp(m, 1 - F->bias - F->mbits) : ldexp((1 << F->mbits) + m, e - F->bias - F->mbits);
    if (*inf) v = INFINITY;
    return s ? -v : v;
}

/* ---- the reference rounding, in double ---- */
static uint8_t ref_round(const fmt8 *F, double d, int saturate)
{
    if (isnan(d)) return 0x7f;
    uint8_t sign = signbit(d) ? 0x80 : 0;
    double a = fabs(d);
    uint8_t maxcode = F->f.maxcode;
    if (a >= F->next) return sign | (saturate ? maxcode : F->f.overflow);   /* inf too */
    /* the largest code whose value is <= a, among 0..maxcode and the virtual next */
    int lo = 0, nan, inf;
    for (int c = 0; c <= maxcode; c++)
        if (field_value(F, (unsigned)c, &nan, &inf) <= a) lo = c;
    double vlo = field_value(F, (unsigned)lo, &nan, &inf);
    double vhi = lo == maxcode ? F->next : field_value(F, (unsigned)lo + 1, &nan, &inf);
    int hi = lo + 1;
    int pick = a - vlo < vhi - a ? lo : a - vlo > vhi - a ? hi : (lo & 1 ? hi : lo);
    if (a == vlo) pick = lo;
    if (pick > maxcode) return sign | (saturate ? maxcode : F->f.overflow);
    return (uint8_t)(sign | pick);
}

/* a faster ref_round for many inputs: the codes' values sorted once */
static double vals[2][128];
static void make_vals(void)
{
    int nan, inf;
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < 128; c++) vals[k][c] = field_value(&FORMATS[k], (unsigned)c, &nan, &inf);
}
static uint8_t ref_round_fast(int k, double d, int saturate)
{
    const fmt8 *F = &FORMATS[k];
    if (isnan(d)) return 0x7f;
    uint8_t sign = signbit(d) ? 0x80 : 0;
    double a = fabs(d);
    if (a >= F->next) return sign | (saturate ? F->f.maxcode : F->f.overflow);
    int lo = 0, hi = F->f.maxcode;   /* vals[lo] <= a: the last such */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (vals[k][mid] <= a) lo = mid; else hi = mid - 1;
    }
    double vlo = vals[k][lo], vhi = lo == F->f.maxcode ? F->next : vals[k][lo + 1];
    int pick = a == vlo ? lo : a - vlo < vhi - a ? lo : a - vlo > vhi - a ? lo + 1 : (lo & 1 ? lo + 1 : lo);
    if (pick > F->f.maxcode) return sign | (saturate ? F->f.maxcode : F->f.overflow);
    return (uint8_t)(sign | pick);
}

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- the sample of f32 patterns ---- */
static uint32_t *sample(size_t *n)
{
    static const float centres[] = {448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f, 0x1p-9f, 0x1p-10f, 0x1p-16f,
                                    0x1p-17f, 0x1p-6f, 0x1p-14f, 1.0f, 1.0625f, 0.0f, 1e-30f};
    size_t cap = ((size_t)1 << 20) + 64 * 2 * 512 + 16, k = 0;
    uint32_t *p = malloc(cap * sizeof *p);
    for (uint64_t u = 0; u < ((uint64_t)1 << 32); u += 4096) p[k++] = (uint32_t)u;
    for (size_t c = 0; c < sizeof centres / sizeof *centres; c++)
        for (int s = 0; s < 2; s++)
            for (int d = -256; d < 256; d++) {
                uint32_t b = mp_f32_bits(centres[c]) + (uint32_t)d;
                if (centres[c] == 0.0f && d < 0) continue;
                p[k++] = b | (s ? 0x80000000u : 0);
            }
    static const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fffffffu,
                                        0x00000001u, 0x80000001u, 0x007fffffu, 0x7f7fffffu, 0xff7fffffu};
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) p[k++] = specials[i];
    *n = k;
    return p;
}

static void cast(void *dst, mp_dtype dd, const void *src, mp_dtype sd, int64_t n, int saturate)
{
    mp_cpu_backend.cast(mp_cpu_backend.ctx, dst, dd, src, sd, n, saturate);
}

Test(fp8, every_code_decodes_to_its_fields)
{
    for (int k = 0; k < 2; k++) {
        const fmt8 *F = &FORMATS[k];
        uint8_t codes[256];
        float f32[256];
        uint16_t h[256], b[256];
        for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
        cast(f32, MP_F32, codes, F->dt, 256, 0);
        cast(h, MP_F16, codes, F->dt, 256, 0);
        cast(b, MP_BF16, codes, F->dt, 256, 0);
        for (int c = 0; c < 256; c++) {
            int nan, inf;
            double want = field_value(F, (unsigned)c, &nan, &inf);
            float got[4] = {mp_fp8_to_f32((uint8_t)c, F->f), f32[c], mp_f16_to_f32(h[c]), mp_bf16_to_f32(b[c])};
            for (int w = 0; w < 4; w++) {
                if (nan) {
                    cr_assert(isnan(got[w]), "%s code 0x%02x path %d: %g, expected NaN", F->name, c, w, got[w]);
                    cr_assert_eq(!!signbit(got[w]), c >> 7, "%s 0x%02x path %d: NaN's sign", F->name, c, w);
                } else {
                    cr_assert((double)got[w] == want && !!signbit(got[w]) == (c >> 7),
                              "%s code 0x%02x path %d: %a, expected %a", F->name, c, w, got[w], want);
                }
            }
        }
        /* the codes' count of each kind, so that the field reading itself is pinned */
        int nans = 0, infs = 0;
        for (int c = 0; c < 256; c++) {
            int nan, inf;
            field_value(F, (unsigned)c, &nan, &inf);
            nans += nan, infs += inf;
        }
        cr_assert_eq(nans, k == 0 ? 2 : 6, "%s: NaN codes", F->name);
        cr_assert_eq(infs, k == 0 ? 0 : 2, "%s: inf codes", F->name);
        int nan, inf;
        cr_assert_eq(field_value(F, F->f.maxcode, &nan, &inf), F->max, "%s: the largest finite value", F->name);
    }
}

Test(fp8, reference_rounding_spot_values)
{
    /* the double reference itself, on values whose answer is known by hand */
    const fmt8 *E4 = &FORMATS[0], *E5 = &FORMATS[1];
    cr_assert_eq(ref_round(E4, 464.0, 0), 0x7e);          /* the midpoint to 480: ties to even 448 */
    cr_assert_eq(ref_round(E4, 464.0001, 0), 0x7f);       /* past it: NaN */
    cr_assert_eq(ref_round(E4, 464.0001, 1), 0x7e);
    cr_assert_eq(ref_round(E4, -1e9, 1), 0xfe);
    cr_assert_eq(ref_round(E4, INFINITY, 0), 0x7f);
    cr_assert_eq(ref_round(E4, -INFINITY, 0), 0xff);
    cr_assert_eq(ref_round(E5, 61440.0, 0), 0x7c);        /* midpoint: ties to even, 2^16, inf */
    cr_assert_eq(ref_round(E5, 61439.0, 0), 0x7b);
    cr_assert_eq(ref_round(E5, -61440.0, 1), 0xfb);
    cr_assert_eq(ref_round(E4, 0x1p-10, 0), 0x00);        /* half the smallest subnormal: to even, zero */
    cr_assert_eq(ref_round(E4, 0x1.8p-10, 0), 0x01);
    cr_assert_eq(ref_round(E4, -0x1p-11, 0), 0x80);       /* signed zero */
    cr_assert_eq(ref_round(E5, 0x1p-17, 0), 0x00);
    cr_assert_eq(ref_round(E5, 0x1.000001p-17, 0), 0x01);
    cr_assert_eq(ref_round(E4, 1.0625, 0), 0x38);         /* 1 + half an ulp: to even, 1.0 */
    cr_assert_eq(ref_round(E4, 1.1875, 0), 0x3a);         /* 1.125 + half: to even, 1.25 */
    cr_assert_eq(ref_round(E4, NAN, 0), 0x7f);
}

/* scalar and bulk conversions of the sample against a reference function */
static void check_sample(uint8_t (*ref)(int k, float f, int sat), const char *what)
{
    size_t n;
    uint32_t *p = sample(&n);
    uint8_t *bulk = malloc(n);
    long bad = 0;
    for (int k = 0; k < 2; k++)
        for (int sat = 0; sat < 2; sat++) {
            cast(bulk, FORMATS[k].dt, p, MP_F32, (int64_t)n, sat);
            for (size_t i = 0; i < n; i++) {
                float f = bits_f32(p[i]);
                uint8_t want = ref(k, f, sat), one = mp_f32_to_fp8(f, FORMATS[k].f, sat);
                if ((one != want || bulk[i] != want) && bad++ < 8)
                    cr_log_error("%s %s sat=%d f32 0x%08x: scalar 0x%02x, bulk 0x%02x, %s 0x%02x", FORMATS[k].name,
                                 what, sat, p[i], one, bulk[i], what, want);
            }
        }
    free(bulk);
    free(p);
    cr_assert_eq(bad, 0, "%ld of the sample's conversions differ from %s", bad, what);
}

static uint8_t by_double(int k, float f, int sat) { return ref_round_fast(k, (double)f, sat); }

Test(fp8, dense_sample_against_the_double_reference)
{
    make_vals();
    /* the fast reference against the plain one on a stride of the sample */
    size_t n;
    uint32_t *p = sample(&n);
    for (size_t i = 0; i < n; i += 97)
        for (int k = 0; k < 2; k++)
            cr_assert_eq(ref_round_fast(k, bits_f32(p[i]), 0), ref_round(&FORMATS[k], bits_f32(p[i]), 0));
    free(p);
    check_sample(by_double, "the double reference");
}

#ifdef MP_CUDA_FP8_REF
static uint8_t by_cuda(int k, float f, int sat)
{
    return __nv_cvt_float_to_fp8(f, sat ? __NV_SATFINITE : __NV_NOSAT, k ? __NV_E5M2 : __NV_E4M3);
}
#endif

Test(fp8, dense_sample_against_cuda_fp8_host_code)
{
#ifdef MP_CUDA_FP8_REF
    check_sample(by_cuda, "cuda_fp8.h");
    /* and the toolkit's decode of every code */
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < 256; c++) {
            __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, k ? __NV_E5M2 : __NV_E4M3);
            float want = mp_f16_to_f32(h.x), got = mp_fp8_to_f32((uint8_t)c, FORMATS[k].f);
            cr_assert((isnan(want) && isnan(got)) || mp_f32_bits(want) == mp_f32_bits(got),
                      "%s 0x%02x: cuda %a, fp8.h %a", FORMATS[k].name, c, want, got);
        }
#else
    cr_skip_test("the CUDA toolkit's cuda_fp8.h was not found at build time");
#endif
}

Test(fp8, every_f16_and_bf16_pattern_rounds_once)
{
    uint16_t src[65536];
    uint8_t out[65536];
    for (int i = 0; i < 65536; i++) src[i] = (uint16_t)i;
    for (int lowbf = 0; lowbf < 2; lowbf++)
        for (int k = 0; k < 2; k++)
            for (int sat = 0; sat < 2; sat++) {
                cast(out, FORMATS[k].dt, src, lowbf ? MP_BF16 : MP_F16, 65536, sat);
                for (int i = 0; i < 65536; i++) {
                    float f = lowbf ? mp_bf16_to_f32(src[i]) : mp_f16_to_f32(src[i]);
                    uint8_t want = mp_f32_to_fp8(f, FORMATS[k].f, sat);
                    cr_assert_eq(out[i], want, "%s -> %s sat=%d pattern 0x%04x: 0x%02x, expected 0x%02x",
                                 lowbf ? "bf16" : "f16", FORMATS[k].name, sat, i, out[i], want);
                }
            }
}

Test(fp8, f64_rounds_once)
{
    make_vals();
    /* each FP8 midpoint plus or minus a little less than half an f32 ulp:
     * an f32 rounded to nearest lands on the midpoint, and would round again */
    double d[4 * 2 * 128 + 8];
    int n = 0;
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < FORMATS[k].f.maxcode; c++) {
            double mid = (vals[k][c] + vals[k][c + 1]) / 2, ulp = mid * 0x1p-24;
            d[n++] = mid + ulp * 0.25, d[n++] = mid - ulp * 0.25;
            d[n++] = -(mid + ulp * 0.25), d[n++] = mid;
        }
    d[n++] = 464.0 + 1e-9, d[n++] = 61440.0 - 1e-9, d[n++] = 1e300, d[n++] = -1e-300, d[n++] = NAN;
    uint8_t out[sizeof d / sizeof *d];
    for (int k = 0; k < 2; k++)
        for (int sat = 0; sat < 2; sat++) {
            cast(out, FORMATS[k].dt, d, MP_F64, n, sat);
            for (int i = 0; i < n; i++) {
                uint8_t want = ref_round_fast(k, d[i], sat);
                cr_assert_eq(out[i], want, "f64 %a -> %s sat=%d: 0x%02x, expected 0x%02x", d[i], FORMATS[k].name,
                             sat, out[i], want);
            }
        }
}

Test(fp8, fp8_to_fp8_and_back_to_integers)
{
    uint8_t codes[256], out[256];
    int32_t ints[256];
    for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
    for (int k = 0; k < 2; k++)
        for (int sat = 0; sat < 2; sat++) {
            const fmt8 *S = &FORMATS[k], *D = &FORMATS[1 - k];
            cast(out, D->dt, codes, S->dt, 256, sat);
            for (int c = 0; c < 256; c++) {
                uint8_t want = mp_f32_to_fp8(mp_fp8_to_f32((uint8_t)c, S->f), D->f, sat);
                cr_assert_eq(out[c], want, "%s 0x%02x -> %s sat=%d", S->name, c, D->name, sat);
            }
            cast(ints, MP_I32, codes, S->dt, 256, 0);
            for (int c = 0; c < 256; c++) {
                float v = mp_fp8_to_f32((uint8_t)c, S->f);
                int32_t want = isnan(v) ? 0 : isinf(v) ? (v > 0 ? INT32_MAX : INT32_MIN) : (int32_t)v;
                cr_assert_eq(ints[c], want, "%s 0x%02x -> i32: %d, expected %d", S->name, c, ints[c], want);
            }
        }
}
