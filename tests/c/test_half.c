/*
 * test_half.c: the f16/bf16 <-> f32 conversions (kernels/half.h and
 * kernels/cpu/convert.c).
 *
 * Three things are held against each other: the portable code, the F16C bulk
 * paths (8 and, with AVX-512F, 16 wide), and the hardware instructions called
 * here directly; and all of them
 * against answers this file works out on its own from the definition of the
 * formats (values in double, nearest by distance, ties to the even encoding).
 * The portable code is the engine's definition on machines without F16C, so
 * it has to agree with the hardware on every input, NaNs included.
 *
 * Each check counts its mismatches and asserts once, naming the first, so a
 * broken rounding rule reads as one clear failure rather than thousands.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/convert.h"
#include "kernels/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_X86 1
#endif

/* ---- helpers ----------------------------------------------------------- */

static uint32_t bits(float f) { return mp_f32_bits(f); }
static float from_bits(uint32_t u) { return mp_bits_f32(u); }

static uint64_t rng = 0x243f6a8885a308d3ull;  /* fixed seed: failures repeat */
static uint64_t next_u64(void)
{
    /* splitmix64 */
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int f16_isnan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static int bf16_isnan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* The value of a finite f16 from the definition. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1.0 + m / 1024.0, e - 15);
    return h & 0x8000 ? -v : v;
}

/* The value of a finite bf16 from the definition. */
static double bf16_value(uint16_t h)
{
    int e = (h >> 7) & 0xff, m = h & 0x7f;
    double v = e == 0 ? ldexp(m, -133) : ldexp(1.0 + m / 128.0, e - 127);
    return h & 0x8000 ? -v : v;
}

/* The nearest of two adjacent encodings lo < hi of one sign to x, whose
 * magnitude lies between their values vlo and vhi; a tie goes to the one with
 * an even last bit. */
static uint16_t nearest_even(double ax, uint16_t lo, double vlo, uint16_t hi, double vhi)
{
    double dlo = ax - vlo, dhi = vhi - ax;
    if (dlo != dhi)
        return dlo < dhi ? lo : hi;
    return (lo & 1) ? hi : lo;
}

/* The hardware, called directly (not through convert.c), one value at a time
 * through the vector forms of the instructions. */
#ifdef HAVE_X86
__attribute__((target("f16c"))) static uint16_t hw_to_f16(float f)
{
    __m128i h = _mm_cvtps_ph(_mm_set1_ps(f), _MM_FROUND_TO_NEAREST_INT);
    return (uint16_t)_mm_extract_epi16(h, 0);
}

__attribute__((target("f16c"))) static float hw_from_f16(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* asked of cpuid here, not the way convert.c asks, so that the dispatch
 * test compares two answers */
static int have_hw(void)
{
    unsigned a, b, c, d;
    __builtin_cpu_init();
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) &&
           __builtin_cpu_supports("avx2");
}
#else
static uint16_t hw_to_f16(float f) { return mp_f32_to_f16(f); }
static float hw_from_f16(uint16_t h) { return mp_f16_to_f32(h); }
static int have_hw(void) { return 0; }
#endif

/* Skip a test that needs F16C on a processor without it, saying so. */
#define NEED_F16C()                                                                 \
    do {                                                                            \
        if (!have_hw())                                                             \
            cr_skip_test("this processor has no F16C");                             \
    } while (0)

/* Convert xs[0..n) to f16 every way there is (scalar function, portable bulk
 * path, F16C bulk path, the instruction) and compare each with want[], or
 * when want is NULL with the scalar function; returns the mismatches and
 * names the first in `first`. */
static int64_t check_to_f16(const float *xs, const uint16_t *want, int64_t n, char *first,
                            size_t len)
{
    uint16_t *port = malloc(n * sizeof *port), *f16c = malloc(n * sizeof *f16c);
    uint16_t *wide = malloc(n * sizeof *wide);
    cr_assert(port && f16c && wide);
    mp_cpu_f32_to_f16_portable(port, xs, n);
    mp_cpu_f32_to_f16_f16c(f16c, xs, n);
    if (mp_cpu_has_avx512_f16c())
        mp_cpu_f32_to_f16_avx512(wide, xs, n);
    else
        memcpy(wide, f16c, n * sizeof *wide);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t s = mp_f32_to_f16(xs[i]), w = want ? want[i] : s, h = hw_to_f16(xs[i]);
        if (s != w || port[i] != w || f16c[i] != w || wide[i] != w || h != w) {
            if (!bad++)
                snprintf(first, len,
                         "f32 %a (0x%08x): want 0x%04x, scalar 0x%04x, portable 0x%04x, "
                         "f16c 0x%04x, avx512 0x%04x, instruction 0x%04x",
                         xs[i], bits(xs[i]), w, s, port[i], f16c[i], wide[i], h);
        }
    }
    free(port);
    free(f16c);
    free(wide);
    return bad;
}

/* ---- f16 -> f32 -------------------------------------------------------- */

Test(f16, every_f16_to_f32_matches_definition_and_hardware)
{
    NEED_F16C();
    static uint16_t all[65536];
    static float port[65536], f16c[65536], wide[65536];
    for (int i = 0; i < 65536; i++)
        all[i] = (uint16_t)i;
    mp_cpu_f16_to_f32_portable(port, all, 65536);
    mp_cpu_f16_to_f32_f16c(f16c, all, 65536);
    if (mp_cpu_has_avx512_f16c())
        mp_cpu_f16_to_f32_avx512(wide, all, 65536);
    else
        memcpy(wide, f16c, sizeof wide);

    int bad = 0;
    char first[256] = "";
    for (int i = 0; i < 65536; i++) {
        uint16_t h = all[i];
        uint32_t want;
        if (f16_isnan(h))   /* quiet, sign kept, payload moved to the top */
            want = (uint32_t)(h & 0x8000) << 16 | 0x7fc00000u | (uint32_t)(h & 0x3ff) << 13;
        else if ((h & 0x7fff) == 0x7c00)
            want = bits(h & 0x8000 ? -INFINITY : INFINITY);
        else
            want = bits((float)f16_value(h));   /* exact: f32 holds every f16 */
        uint32_t s = bits(mp_f16_to_f32(h)), hw = bits(hw_from_f16(h));
        if (s != want || bits(port[i]) != want || bits(f16c[i]) != want || bits(wide[i]) != want ||
            hw != want) {
            if (!bad++)
                snprintf(first, sizeof first,
                         "f16 0x%04x: want 0x%08x, scalar 0x%08x, portable 0x%08x, "
                         "f16c 0x%08x, avx512 0x%08x, instruction 0x%08x",
                         h, want, s, bits(port[i]), bits(f16c[i]), bits(wide[i]), hw);
        }
    }
    cr_assert_eq(bad, 0, "%d of 65536 f16 values convert wrongly; first: %s", bad, first);
}

Test(f16, every_f16_round_trips)
{
    for (int i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i, back = mp_f32_to_f16(mp_f16_to_f32(h));
        /* a NaN comes back a NaN with its sign and payload, made quiet */
        uint16_t want = f16_isnan(h) ? (uint16_t)(h | 0x200) : h;
        if (back != want)
            cr_assert_fail("f16 0x%04x comes back as 0x%04x, want 0x%04x", h, back, want);
    }
}

/* ---- f32 -> f16 -------------------------------------------------------- */

/* Every rounding boundary of f16: for each pair of adjacent encodings of
 * either sign (zero and the subnormals included, and the last step from 65504
 * to 65536 where the upper neighbour encodes inf) the f32s at the midpoint and
 * one ulp either side of it, plus the lower value itself and its neighbours.
 * The expected answer comes from distances in double. */
Test(f16, every_rounding_boundary)
{
    NEED_F16C();
    enum { PER = 6 };
    int64_t n = 2 * 0x7c00 * PER;
    float *xs = malloc(n * sizeof *xs);
    uint16_t *want = malloc(n * sizeof *want);
    cr_assert(xs && want);

    int64_t k = 0;
    for (int sign = 0; sign < 2; sign++) {
        for (uint16_t lo = 0; lo < 0x7c00; lo++) {
            uint16_t hi = lo + 1;   /* 0x7c00 for the last: inf, as if 65536 */
            double vlo = f16_value(lo), vhi = hi == 0x7c00 ? 65536.0 : f16_value(hi);
            double mid = (vlo + vhi) / 2;
            float fmid = (float)mid, flo = (float)vlo;
            cr_assert_eq((double)fmid, mid, "midpoint above f16 0x%04x is not an f32", lo);
            float pts[PER] = {fmid, nextafterf(fmid, 0), nextafterf(fmid, INFINITY),
                              flo, nextafterf(flo, INFINITY),
                              lo ? nextafterf(flo, 0) : flo};
            for (int j = 0; j < PER; j++) {
                float x = pts[j];
                double ax = x;
                uint16_t w;
                if (ax < vlo)   /* just below lo: between lo-1 and lo */
                    w = nearest_even(ax, lo - 1, f16_value(lo - 1), lo, vlo);
                else
                    w = nearest_even(ax, lo, vlo, hi, vhi);
                xs[k] = sign ? -x : x;
                want[k] = sign ? (uint16_t)(w | 0x8000) : w;
                k++;
            }
        }
    }
    cr_assert_eq(k, n);
    char first[256] = "";
    int64_t bad = check_to_f16(xs, want, n, first, sizeof first);
    cr_assert_eq(bad, 0, "%lld of %lld boundary values round wrongly; first: %s",
                 (long long)bad, (long long)n, first);
    free(xs);
    free(want);
}

/* A random f32 drawn from one of several families, so that each kind of
 * input is well represented: raw bits, the f16 range, near its edges, NaNs
 * with payloads, infinities, f32 subnormals. */
static float random_f32(void)
{
    uint64_t r = next_u64();
    uint32_t lo = (uint32_t)r, sign = (uint32_t)(r >> 32) & 0x80000000u;
    switch ((r >> 33) % 8) {
    case 0:
    case 1:
        return from_bits(lo);                                   /* any bits */
    case 2:
    case 3:                                     /* exponent of a normal f16 */
        return from_bits(sign | (uint32_t)(113 + (r >> 40) % 30) << 23 | (lo & 0x7fffff));
    case 4:                                     /* f16 subnormals and just past */
        return from_bits(sign | (uint32_t)(100 + (r >> 40) % 14) << 23 | (lo & 0x7fffff));
    case 5:                                     /* NaN, any payload */
        return from_bits(sign | 0x7f800000u | ((lo & 0x7fffff) ? lo & 0x7fffff : 1));
    case 6:                                     /* f32 subnormals, zero, inf */
        return from_bits(sign | ((r >> 40) % 16 == 0 ? 0x7f800000u : lo & 0x7fffff));
    default:                                    /* near 65504..65536 */
        return from_bits(sign | (0x477fe000u + (lo & 0x3fff)));
    }
}

Test(f16, random_f32_bit_patterns_portable_equals_f16c)
{
    NEED_F16C();
    int64_t n = 4 << 20;
    float *xs = malloc(n * sizeof *xs);
    cr_assert(xs);
    for (int64_t i = 0; i < n; i++)
        xs[i] = random_f32();
    char first[256] = "";
    int64_t bad = check_to_f16(xs, NULL, n, first, sizeof first);
    cr_assert_eq(bad, 0, "%lld of %lld random f32s differ; first: %s", (long long)bad,
                 (long long)n, first);
    free(xs);
}

/* Every f32 whose exponent matters, all 2^23 mantissas of each: exponents
 * 101 to 144 (from below half the least f16 subnormal to past the overflow
 * to inf), 255 (inf and every NaN payload), and a few from either end, where
 * every value must become a signed zero or inf. That is 1.7e8 per sign rather
 * than all 4.3e9 f32s, at a fifth of the time and with no class of input
 * missed. */
Test(f16, every_f32_of_relevant_exponents_portable_equals_f16c, .timeout = 120)
{
    NEED_F16C();
    enum { SLICE = 1 << 23 };
    float *xs = malloc(SLICE * sizeof *xs);
    uint16_t *a = malloc(SLICE * sizeof *a), *b = malloc(SLICE * sizeof *b);
    cr_assert(xs && a && b);
    /* different fills, so an element that neither path writes still differs */
    memset(a, 0x00, SLICE * sizeof *a);
    memset(b, 0xff, SLICE * sizeof *b);
    int exps[64], ne = 0;
    for (int e = 101; e <= 144; e++)
        exps[ne++] = e;
    static const int ends[] = {0, 1, 64, 99, 100, 145, 200, 253, 254, 255};
    for (size_t j = 0; j < sizeof ends / sizeof *ends; j++)
        exps[ne++] = ends[j];

    for (uint32_t sign = 0; sign < 2; sign++) {
        for (int k = 0; k < ne; k++) {
            uint32_t base = sign << 31 | (uint32_t)exps[k] << 23;
            #pragma omp parallel for
            for (uint32_t i = 0; i < SLICE; i++)
                xs[i] = from_bits(base | i);
            mp_cpu_f32_to_f16_portable(a, xs, SLICE);
            mp_cpu_f32_to_f16_f16c(b, xs, SLICE);
            if (memcmp(a, b, SLICE * sizeof *a) != 0) {
                uint32_t i = 0;
                while (a[i] == b[i])
                    i++;
                cr_assert_fail("f32 0x%08x: portable 0x%04x, f16c 0x%04x", base | i, a[i],
                               b[i]);
            }
            if (!mp_cpu_has_avx512_f16c())
                continue;
            memset(b, 0xff, SLICE * sizeof *b);
            mp_cpu_f32_to_f16_avx512(b, xs, SLICE);
            if (memcmp(a, b, SLICE * sizeof *a) != 0) {
                uint32_t i = 0;
                while (a[i] == b[i])
                    i++;
                cr_assert_fail("f32 0x%08x: portable 0x%04x, avx512 0x%04x", base | i, a[i],
                               b[i]);
            }
        }
    }
    free(xs);
    free(a);
    free(b);
}

Test(f16, specific_values)
{
    struct { float x; uint16_t want; } cases[] = {
        {65504.0f, 0x7bff},                     /* largest f16 */
        {65519.99f, 0x7bff},                    /* below the midpoint to 65536 */
        {65520.0f, 0x7c00},                     /* the midpoint: ties to inf */
        {-65520.0f, 0xfc00},
        {65536.0f, 0x7c00},
        {FLT_MAX, 0x7c00},
        {INFINITY, 0x7c00},
        {-INFINITY, 0xfc00},
        {1.0f, 0x3c00},
        {-2.0f, 0xc000},
        {0x1p-14f, 0x0400},                     /* least normal */
        {0x1p-24f, 0x0001},                     /* least subnormal */
        {0x1p-25f, 0x0000},                     /* tie: to 0, the even one */
        {0x1.000002p-25f, 0x0001},              /* just above the tie */
        {0x3p-25f, 0x0002},                     /* tie between 1 and 2: to 2 */
        {0x5p-25f, 0x0002},                     /* tie between 2 and 3: to 2 */
        {1e-8f, 0x0000},
        {-1e-8f, 0x8000},                       /* sign survives underflow */
        {0x1p-149f, 0x0000},                    /* least f32 subnormal */
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {1.0f + 0x1p-11f, 0x3c00},              /* tie at 1: to even */
        {1.0f + 0x3p-11f, 0x3c02},              /* tie above odd 0x3c01: up */
        {from_bits(0x7f800001u), 0x7e00},       /* NaN, payload only in low bits */
        {from_bits(0xffc00000u), 0xfe00},       /* negative quiet NaN */
        {from_bits(0x7fbfe000u), 0x7fff},       /* signalling, payload kept */
        {from_bits(0x7fc02000u), 0x7e01},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = mp_f32_to_f16(cases[i].x);
        cr_expect_eq(got, cases[i].want, "f32 %a (0x%08x) -> 0x%04x, want 0x%04x",
                     cases[i].x, bits(cases[i].x), got, cases[i].want);
        if (have_hw())
            cr_expect_eq(hw_to_f16(cases[i].x), cases[i].want,
                         "instruction disagrees on f32 0x%08x", bits(cases[i].x));
    }

    struct { uint16_t h; uint32_t want; } back[] = {
        {0x0001, 0x33800000u},                  /* 2^-24 */
        {0x03ff, 0x387fc000u},                  /* largest subnormal */
        {0x7bff, 0x477fe000u},                  /* 65504 */
        {0x8000, 0x80000000u},                  /* -0.0 */
        {0x7c00, 0x7f800000u},
        {0x7c01, 0x7fc02000u},                  /* signalling NaN made quiet */
        {0xfd00, 0xffe00000u},
    };
    for (size_t i = 0; i < sizeof back / sizeof *back; i++) {
        uint32_t got = bits(mp_f16_to_f32(back[i].h));
        cr_expect_eq(got, back[i].want, "f16 0x%04x -> 0x%08x, want 0x%08x", back[i].h, got,
                     back[i].want);
    }
}

/* ---- bf16 -------------------------------------------------------------- */

Test(bf16, every_bf16_to_f32_and_back)
{
    int bad = 0;
    char first[160] = "";
    for (int i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = mp_bf16_to_f32(h);
        uint16_t back = mp_f32_to_bf16(f);
        int ok;
        if (bf16_isnan(h))  /* the same NaN, made quiet */
            ok = isnan(f) && back == (h | 0x40);
        else if ((h & 0x7fff) == 0x7f80)
            ok = isinf(f) && (f < 0) == !!(h & 0x8000) && back == h;
        else    /* exact, from the definition, and back bit for bit */
            ok = (double)f == bf16_value(h) && !signbit(f) == !signbit(bf16_value(h)) &&
                 back == h;
        if (!ok && !bad++)
            snprintf(first, sizeof first, "bf16 0x%04x -> f32 0x%08x -> bf16 0x%04x", h,
                     bits(f), back);
    }
    cr_assert_eq(bad, 0, "%d of 65536 bf16 values fail; first: %s", bad, first);
}

/* As for f16: each midpoint between adjacent bf16s (the last step being to
 * 2^128, encoded as inf) and its f32 neighbours, against distances in double. */
Test(bf16, every_rounding_boundary)
{
    enum { PER = 3 };
    int64_t n = 2 * 0x7f80 * PER;
    float *xs = malloc(n * sizeof *xs);
    uint16_t *want = malloc(n * sizeof *want), *bulk = malloc(n * sizeof *bulk);
    cr_assert(xs && want && bulk);
    int64_t k = 0;
    for (int sign = 0; sign < 2; sign++) {
        for (uint16_t lo = 0; lo < 0x7f80; lo++) {
            uint16_t hi = lo + 1;
            double vlo = bf16_value(lo), vhi = hi == 0x7f80 ? ldexp(1, 128) : bf16_value(hi);
            double mid = (vlo + vhi) / 2;
            float fmid = (float)mid;
            cr_assert_eq((double)fmid, mid, "midpoint above bf16 0x%04x is not an f32", lo);
            float pts[PER] = {fmid, nextafterf(fmid, 0), nextafterf(fmid, INFINITY)};
            for (int j = 0; j < PER; j++) {
                uint16_t w = nearest_even(pts[j], lo, vlo, hi, vhi);
                xs[k] = sign ? -pts[j] : pts[j];
                want[k++] = sign ? (uint16_t)(w | 0x8000) : w;
            }
        }
    }
    mp_cpu_f32_to_bf16(bulk, xs, n);
    int64_t bad = 0;
    char first[160] = "";
    for (int64_t i = 0; i < n; i++) {
        uint16_t s = mp_f32_to_bf16(xs[i]);
        if ((s != want[i] || bulk[i] != want[i]) && !bad++)
            snprintf(first, sizeof first, "f32 %a (0x%08x): want 0x%04x, scalar 0x%04x, "
                     "bulk 0x%04x", xs[i], bits(xs[i]), want[i], s, bulk[i]);
    }
    cr_assert_eq(bad, 0, "%lld of %lld values round wrongly; first: %s", (long long)bad,
                 (long long)n, first);
    free(xs);
    free(want);
    free(bulk);
}

Test(bf16, specific_values)
{
    struct { uint32_t x; uint16_t want; } cases[] = {
        {0x3f800000u, 0x3f80},                  /* 1.0 */
        {0x3f808000u, 0x3f80},                  /* tie: to even */
        {0x3f818000u, 0x3f82},                  /* tie above odd: up */
        {0x3f808001u, 0x3f81},
        {0x7f7f7fffu, 0x7f7f},                  /* just below the last midpoint */
        {0x7f7f8000u, 0x7f80},                  /* the last midpoint: ties to inf */
        {0x7f7fffffu, 0x7f80},                  /* FLT_MAX */
        {0x7f800000u, 0x7f80},                  /* inf */
        {0xff800000u, 0xff80},
        {0x7f800001u, 0x7fc0},                  /* NaN, payload only in low bits */
        {0xff810000u, 0xffc1},                  /* signalling, payload kept */
        {0x7fc00000u, 0x7fc0},
        {0x00000001u, 0x0000},                  /* least f32 subnormal */
        {0x00018000u, 0x0002},                  /* subnormal tie above odd: up */
        {0x80000000u, 0x8000},                  /* -0.0 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uint16_t got = mp_f32_to_bf16(from_bits(cases[i].x)), bulk;
        mp_cpu_f32_to_bf16(&bulk, (float[]){from_bits(cases[i].x)}, 1);
        cr_expect_eq(got, cases[i].want, "f32 0x%08x -> 0x%04x, want 0x%04x", cases[i].x,
                     got, cases[i].want);
        cr_expect_eq(bulk, cases[i].want, "bulk: f32 0x%08x -> 0x%04x", cases[i].x, bulk);
    }
    /* 3.4e38 lies above the largest bf16 midpoint (about 3.3961e38) */
    cr_expect_eq(mp_f32_to_bf16(3.4e38f), 0x7f80);
    cr_expect_eq(mp_f32_to_bf16(-3.4e38f), 0xff80);
    cr_expect_eq(mp_f32_to_bf16(3.3e38f), 0x7f78);
}

/* ---- bulk entry points ------------------------------------------------- */

static const int64_t lengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 1000, 100003};
enum { GUARD = 8, MAXLEN = 100003 };

/* Run one bulk f32->16-bit conversion on xs (at offset off, to try unaligned
 * pointers) and compare with the scalar function, and check that nothing
 * around the output was written. */
static void check_down(const char *name, void (*bulk)(uint16_t *, const float *, int64_t),
                       uint16_t (*scalar)(float), const float *xs)
{
    static uint16_t out[MAXLEN + 2 * GUARD + 1];
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        for (int off = 0; off < 2; off++) {
            int64_t n = lengths[li];
            memset(out, 0xa5, sizeof out);
            bulk(out + GUARD + off, xs + off, n);
            for (int64_t i = 0; i < (int64_t)(sizeof out / sizeof *out); i++) {
                int64_t j = i - GUARD - off;
                uint16_t want = j >= 0 && j < n ? scalar(xs[off + j]) : 0xa5a5;
                if (out[i] != want)
                    cr_assert_fail("%s n=%lld offset %d: element %lld is 0x%04x, want 0x%04x",
                                   name, (long long)n, off, (long long)j, out[i], want);
            }
        }
    }
}

/* The same for the 16-bit -> f32 direction, comparing bits. */
static void check_up(const char *name, void (*bulk)(float *, const uint16_t *, int64_t),
                     float (*scalar)(uint16_t), const uint16_t *hs)
{
    static float out[MAXLEN + 2 * GUARD + 1];
    const uint32_t fill = 0xa5a5a5a5u;
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        for (int off = 0; off < 2; off++) {
            int64_t n = lengths[li];
            for (size_t i = 0; i < sizeof out / sizeof *out; i++)
                out[i] = from_bits(fill);
            bulk(out + GUARD + off, hs + off, n);
            for (int64_t i = 0; i < (int64_t)(sizeof out / sizeof *out); i++) {
                int64_t j = i - GUARD - off;
                uint32_t want = j >= 0 && j < n ? bits(scalar(hs[off + j])) : fill;
                if (bits(out[i]) != want)
                    cr_assert_fail("%s n=%lld offset %d: element %lld is 0x%08x, want 0x%08x",
                                   name, (long long)n, off, (long long)j, bits(out[i]), want);
            }
        }
    }
}

static float xs_bulk[MAXLEN + 1];
static uint16_t hs_bulk[MAXLEN + 1];

static void fill_bulk_inputs(void)
{
    for (int64_t i = 0; i <= MAXLEN; i++) {
        xs_bulk[i] = random_f32();
        hs_bulk[i] = (uint16_t)next_u64();
    }
}

TestSuite(bulk, .init = fill_bulk_inputs);

Test(bulk, f16_entry_points_match_scalar)
{
    check_down("mp_cpu_f32_to_f16", mp_cpu_f32_to_f16, mp_f32_to_f16, xs_bulk);
    check_down("mp_cpu_f32_to_f16_portable", mp_cpu_f32_to_f16_portable, mp_f32_to_f16,
               xs_bulk);
    check_up("mp_cpu_f16_to_f32", mp_cpu_f16_to_f32, mp_f16_to_f32, hs_bulk);
    check_up("mp_cpu_f16_to_f32_portable", mp_cpu_f16_to_f32_portable, mp_f16_to_f32,
             hs_bulk);
    if (mp_cpu_has_f16c()) {
        check_down("mp_cpu_f32_to_f16_f16c", mp_cpu_f32_to_f16_f16c, mp_f32_to_f16, xs_bulk);
        check_up("mp_cpu_f16_to_f32_f16c", mp_cpu_f16_to_f32_f16c, mp_f16_to_f32, hs_bulk);
    }
    if (mp_cpu_has_avx512_f16c()) {   /* tails of 8..31 and of 0..7 after the 32-wide loop */
        check_down("mp_cpu_f32_to_f16_avx512", mp_cpu_f32_to_f16_avx512, mp_f32_to_f16, xs_bulk);
        check_up("mp_cpu_f16_to_f32_avx512", mp_cpu_f16_to_f32_avx512, mp_f16_to_f32, hs_bulk);
    }
}

Test(bulk, bf16_entry_points_match_scalar)
{
    check_down("mp_cpu_f32_to_bf16", mp_cpu_f32_to_bf16, mp_f32_to_bf16, xs_bulk);
    check_up("mp_cpu_bf16_to_f32", mp_cpu_bf16_to_f32, mp_bf16_to_f32, hs_bulk);
}

/* Outputs of 16 MiB and more take the streaming-store branch of the F16C
 * path, with its aligning head; one element of offset makes the head run. */
Test(bulk, large_arrays_match_portable)
{
    NEED_F16C();
    const int64_t n = ((int64_t)1 << 23) + 13;     /* 32 MiB of f32, 16 MiB of f16 */
    float *xs = malloc((n + 1) * sizeof *xs), *fa = malloc((n + 1) * sizeof *fa),
          *fb = malloc((n + 1) * sizeof *fb);
    uint16_t *ha = malloc((n + 1) * sizeof *ha), *hb = malloc((n + 1) * sizeof *hb);
    cr_assert(xs && fa && fb && ha && hb);
    for (int64_t i = 0; i <= n; i++)
        xs[i] = random_f32();
    for (int off = 0; off < 2; off++) {
        memset(ha, 0x00, (n + 1) * sizeof *ha);
        memset(hb, 0xff, (n + 1) * sizeof *hb);
        mp_cpu_f32_to_f16_portable(ha + off, xs + off, n);
        mp_cpu_f32_to_f16_f16c(hb + off, xs + off, n);
        cr_assert_eq(memcmp(ha + off, hb + off, n * sizeof *ha), 0,
                     "f32->f16 differs, offset %d", off);
        memset(fa, 0x00, (n + 1) * sizeof *fa);
        memset(fb, 0xff, (n + 1) * sizeof *fb);
        mp_cpu_f16_to_f32_portable(fa + off, hb + off, n);
        mp_cpu_f16_to_f32_f16c(fb + off, hb + off, n);
        cr_assert_eq(memcmp(fa + off, fb + off, n * sizeof *fa), 0,
                     "f16->f32 differs, offset %d", off);
        if (!mp_cpu_has_avx512_f16c())
            continue;
        memset(hb, 0xff, (n + 1) * sizeof *hb);
        mp_cpu_f32_to_f16_avx512(hb + off, xs + off, n);
        cr_assert_eq(memcmp(ha + off, hb + off, n * sizeof *ha), 0,
                     "f32->f16 (avx512) differs, offset %d", off);
        memset(fb, 0xff, (n + 1) * sizeof *fb);
        mp_cpu_f16_to_f32_avx512(fb + off, hb + off, n);
        cr_assert_eq(memcmp(fa + off, fb + off, n * sizeof *fa), 0,
                     "f16->f32 (avx512) differs, offset %d", off);
    }
    free(xs);
    free(fa);
    free(fb);
    free(ha);
    free(hb);
}

Test(bulk, zero_length_touches_nothing)
{
    /* n == 0 must not dereference anything, not even a null pointer */
    mp_cpu_f16_to_f32(NULL, NULL, 0);
    mp_cpu_f32_to_f16(NULL, NULL, 0);
    mp_cpu_f16_to_f32_portable(NULL, NULL, 0);
    mp_cpu_f32_to_f16_portable(NULL, NULL, 0);
    mp_cpu_bf16_to_f32(NULL, NULL, 0);
    mp_cpu_f32_to_bf16(NULL, NULL, 0);
    if (mp_cpu_has_f16c()) {
        mp_cpu_f16_to_f32_f16c(NULL, NULL, 0);
        mp_cpu_f32_to_f16_f16c(NULL, NULL, 0);
    }
    if (mp_cpu_has_avx512_f16c()) {
        mp_cpu_f16_to_f32_avx512(NULL, NULL, 0);
        mp_cpu_f32_to_f16_avx512(NULL, NULL, 0);
    }
}

Test(bulk, dispatch_reports_the_processor)
{
    cr_assert_eq(mp_cpu_has_f16c(), have_hw());
    cr_assert_eq(mp_cpu_has_f16c(), mp_cpu_has_f16c());   /* cached, stable */
}

/* The bulk bf16 paths (AVX-512 where the processor has it, the C loops
 * otherwise) against the scalar definition on 4 M random f32 bit patterns,
 * NaNs with every payload among them, in lengths that leave tails */
Test(bf16, bulk_paths_match_the_scalar_functions)
{
    int64_t n = (1 << 22) + 13;
    float *xs = malloc(sizeof(float) * (size_t)n), *back = malloc(sizeof(float) * (size_t)n);
    float *back2 = malloc(sizeof(float) * (size_t)n);
    uint16_t *bulk = malloc(2 * (size_t)n), *port = malloc(2 * (size_t)n);
    uint32_t st = 12345;
    for (int64_t i = 0; i < n; i++) {
        st = st * 1664525u + 1013904223u;
        uint32_t u = st ^ (uint32_t)(i * 2654435761u);
        memcpy(&xs[i], &u, 4);
    }
    mp_cpu_f32_to_bf16(bulk, xs, n);
    mp_cpu_f32_to_bf16_portable(port, xs, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += bulk[i] != mp_f32_to_bf16(xs[i]) || port[i] != bulk[i];
    cr_assert_eq(bad, 0, "%lld of %lld f32 -> bf16 differ", (long long)bad, (long long)n);
    mp_cpu_bf16_to_f32(back, bulk, n);
    mp_cpu_bf16_to_f32_portable(back2, bulk, n);
    for (int64_t i = 0; i < n; i++) {
        float s = mp_bf16_to_f32(bulk[i]);
        bad += memcmp(&back[i], &s, 4) != 0 || memcmp(&back2[i], &s, 4) != 0;
    }
    cr_assert_eq(bad, 0, "%lld of %lld bf16 -> f32 differ", (long long)bad, (long long)n);
    free(xs), free(back), free(back2), free(bulk), free(port);
}

/* The AVX2 bf16 paths (the entry points' on processors without AVX-512)
 * against the scalar definition on every bf16 and against the C loops on
 * every f32 bit pattern (every rounding tie and boundary, every NaN payload,
 * both signs), each chunk at an odd offset so that tails of 1..15 run too */
Test(bf16, avx2_paths_match_on_every_bf16_and_every_f32, .timeout = 120)
{
    if (!mp_cpu_has_avx2()) cr_skip_test("no AVX2");
    enum { CHUNK = 1 << 20 };
    static float xs[CHUNK + 7], wide[65536 + 7];
    static uint16_t got[CHUNK + 7], want[CHUNK + 7], hs[65536 + 7];
    for (int off = 0; off < 2; off++) {
        for (uint32_t h = 0; h < 65536; h++) hs[off + h] = (uint16_t)h;
        mp_cpu_bf16_to_f32_avx2(wide + off, hs + off, 65536 - off);
        for (uint32_t h = 0; h < 65536 - (uint32_t)off; h++) {
            float s = mp_bf16_to_f32(hs[off + h]);
            cr_assert(!memcmp(&wide[off + h], &s, 4), "bf16 0x%04x widened to 0x%08x, want 0x%08x", hs[off + h],
                      bits(wide[off + h]), bits(s));
        }
    }
    int64_t bad = 0;
    uint32_t first = 0;
    for (uint64_t base = 0; base < ((uint64_t)1 << 32); base += CHUNK) {
        int off = (int)(base >> 20) % 7;   /* misaligned by 0..6 elements */
        int64_t n = CHUNK - (base >> 20) % 16;
        for (int64_t i = 0; i < CHUNK; i++) xs[off + i] = from_bits((uint32_t)(base + (uint64_t)i));
        mp_cpu_f32_to_bf16_avx2(got + off, xs + off, n);
        mp_cpu_f32_to_bf16_portable(want + off, xs + off, n);
        for (int64_t i = 0; i < n; i++)
            if (got[off + i] != want[off + i] && !bad++) first = (uint32_t)(base + (uint64_t)i);
        /* the chunk's last values, past n, one at a time through the scalar path */
        mp_cpu_f32_to_bf16_avx2(got + off + n, xs + off + n, CHUNK - n);
        for (int64_t i = n; i < CHUNK; i++)
            if (got[off + i] != mp_f32_to_bf16(xs[off + i]) && !bad++) first = (uint32_t)(base + (uint64_t)i);
    }
    cr_assert_eq(bad, 0, "%lld f32 round differently on AVX2 than in the C loop; first 0x%08x (C: 0x%04x)",
                 (long long)bad, first, mp_f32_to_bf16(from_bits(first)));
}

/* The one-pass forms the f16 and bf16 steps use (the working copy with its widening,
 * a weight gradient rounded and added into f32): against the scalar rounding
 * and widening, element by element, at every length of the bulk checks and
 * one element off alignment; nothing outside [0, n) written. */
/* the scalar rounding and widening of f16 (bf = 0) or bf16 (bf = 1) */
static uint16_t round_to(int bf, float f) { return bf ? mp_f32_to_bf16(f) : mp_f32_to_f16(f); }
static float widen_from(int bf, uint16_t h) { return bf ? mp_bf16_to_f32(h) : mp_f16_to_f32(h); }

static void check_widened(const char *name, int bf, void (*fn)(uint16_t *, float *, const float *, int64_t))
{
    static uint16_t lo[MAXLEN + 2 * GUARD + 1];
    static float wide[MAXLEN + 2 * GUARD + 1];
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        for (int off = 0; off < 2; off++) {
            int64_t n = lengths[li];
            memset(lo, 0xa5, sizeof lo);
            memset(wide, 0xa5, sizeof wide);
            fn(lo + GUARD + off, wide + GUARD + off, xs_bulk + off, n);
            for (int64_t i = 0; i < (int64_t)(sizeof lo / sizeof *lo); i++) {
                int64_t j = i - GUARD - off;
                int in = j >= 0 && j < n;
                uint16_t h = in ? round_to(bf, xs_bulk[off + j]) : 0xa5a5;
                uint32_t w = in ? bits(widen_from(bf, h)) : 0xa5a5a5a5u;
                if (lo[i] != h || bits(wide[i]) != w)
                    cr_assert_fail("%s n=%lld offset %d: element %lld is 0x%04x / 0x%08x, want 0x%04x / 0x%08x",
                                   name, (long long)n, off, (long long)j, lo[i], bits(wide[i]), h, w);
            }
        }
    }
}

static void check_round_add(const char *name, int bf, void (*fn)(float *, const float *, int64_t))
{
    static float acc[MAXLEN + 2 * GUARD + 1];
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        for (int off = 0; off < 2; off++) {
            int64_t n = lengths[li];
            for (size_t i = 0; i < sizeof acc / sizeof *acc; i++)   /* any f32 (hs_bulk's bits spread) */
                acc[i] = from_bits((uint32_t)hs_bulk[i % MAXLEN] * 0x10001u);
            fn(acc + GUARD + off, xs_bulk + off, n);
            for (int64_t i = 0; i < (int64_t)(sizeof acc / sizeof *acc); i++) {
                int64_t j = i - GUARD - off;
                float a = from_bits((uint32_t)hs_bulk[i % MAXLEN] * 0x10001u);
                float want = j >= 0 && j < n ? a + widen_from(bf, round_to(bf, xs_bulk[off + j])) : a;
                /* NaN + NaN: which payload survives is the add's operand order, not the rounding's */
                int both_nan = isnan(want) && isnan(acc[i]) && isnan(a);
                if (bits(acc[i]) != bits(want) && !both_nan)
                    cr_assert_fail("%s n=%lld offset %d: element %lld is 0x%08x, want 0x%08x", name, (long long)n,
                                   off, (long long)j, bits(acc[i]), bits(want));
            }
        }
    }
}

Test(bulk, f16_widened_and_round_add_match_scalar)
{
    check_widened("mp_cpu_f32_to_f16_widened", 0, mp_cpu_f32_to_f16_widened);
    check_widened("mp_cpu_f32_to_f16_widened_portable", 0, mp_cpu_f32_to_f16_widened_portable);
    check_round_add("mp_cpu_f16_round_add", 0, mp_cpu_f16_round_add);
    check_round_add("mp_cpu_f16_round_add_portable", 0, mp_cpu_f16_round_add_portable);
}

Test(bulk, bf16_widened_and_round_add_match_scalar)
{
    check_widened("mp_cpu_f32_to_bf16_widened", 1, mp_cpu_f32_to_bf16_widened);
    check_widened("mp_cpu_f32_to_bf16_widened_portable", 1, mp_cpu_f32_to_bf16_widened_portable);
    check_round_add("mp_cpu_bf16_round_add", 1, mp_cpu_bf16_round_add);
    check_round_add("mp_cpu_bf16_round_add_portable", 1, mp_cpu_bf16_round_add_portable);
}
