/*
 * fp8_exhaustive.c: every f32 bit pattern (2^32) converted to e4m3 and e5m2,
 * saturating and not, by
 *   - kernels/fp8.h's scalar mp_f32_to_fp8, against the CUDA toolkit's own
 *     host implementation __nv_cvt_float_to_fp8 (cuda_fp8.h / cuda_fp8.hpp;
 *     compiled in when `make bench` finds the toolkit's headers, else that
 *     column is skipped and said so), and
 *   - the CPU backend's bulk cast (cpu_cast: the encode loop of
 *     kernels/cpu/cpu_fp8_cast.c), against the scalar conversion,
 * and every one of the 256 codes decoded by both against the toolkit's
 * __nv_cvt_fp8_to_halfraw. Too long for `make test` (which checks a dense
 * sample: tests/c/test_fp8.c, and ml_dtypes' not-saturating casts:
 * tests/reference/fp8_ml_dtypes.py); a benchmark-like program instead.
 *
 *   make bench            (builds build/bench/fp8_exhaustive)
 *   build/bench/fp8_exhaustive [--stride N]
 *
 * --stride N: every Nth pattern only (a quick look; default 1, all of them).
 * Prints the count of differences per format, mode and comparison, the first
 * few differences, the bulk cast's speed (f32 -> FP8, millions of elements a
 * second on this thread count), and exits 1 on any difference. On 2 cores of
 * the development machine the whole walk took 217 s (niced, shared).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "scripts/bench/bench_clock.h"
#include "kernels/backend.h"
#include "kernels/fp8.h"
#include "kernels/half.h"
#ifdef MP_CUDA_FP8_REF
#include <cuda_fp8.h>
#endif

extern const mp_backend mp_cpu_backend;

#define CHUNK ((int64_t)1 << 20)

static const struct { const char *name; mp_dtype dt; mp_fp8_format f; } FMT[2] = {
    {"e4m3", MP_E4M3, MP_FP8_E4M3}, {"e5m2", MP_E5M2, MP_FP8_E5M2},
};

int main(int argc, char **argv)
{
    uint64_t stride = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stride") == 0 && i + 1 < argc) stride = strtoull(argv[++i], NULL, 0);
        else { fprintf(stderr, "usage: fp8_exhaustive [--stride N]\n"); return 2; }
    }
    if (stride < 1) stride = 1;
#ifdef MP_CUDA_FP8_REF
    const int have_cuda = 1;
#else
    const int have_cuda = 0;
    printf("fp8_exhaustive: cuda_fp8.h was not found at build time: the CUDA column is skipped\n");
#endif
    long diff_cuda[2][2] = {{0}}, diff_bulk[2][2] = {{0}}, shown = 0;
    double bulk_s = 0;
    int64_t bulk_n = 0;
    uint64_t total = ((uint64_t)1 << 32) / stride;
    float *x = malloc(CHUNK * sizeof *x);
    uint8_t *out = malloc(CHUNK);
    double t0 = now();
    for (uint64_t base = 0; base < total; base += CHUNK) {
        int64_t n = total - base < (uint64_t)CHUNK ? (int64_t)(total - base) : CHUNK;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)((base + (uint64_t)i) * stride);
            memcpy(&x[i], &u, 4);
        }
        for (int k = 0; k < 2; k++)
            for (int sat = 0; sat < 2; sat++) {
                double b0 = now();
                mp_cpu_backend.cast(mp_cpu_backend.ctx, out, FMT[k].dt, x, MP_F32, n, sat);
                bulk_s += now() - b0, bulk_n += n;
                long dc = 0, db = 0;
                #pragma omp parallel for reduction(+ : dc, db) schedule(static)
                for (int64_t i = 0; i < n; i++) {
                    uint8_t mine = mp_f32_to_fp8(x[i], FMT[k].f, sat);
                    db += out[i] != mine;
#ifdef MP_CUDA_FP8_REF
                    uint8_t cuda = __nv_cvt_float_to_fp8(x[i], sat ? __NV_SATFINITE : __NV_NOSAT,
                                                         k ? __NV_E5M2 : __NV_E4M3);
                    dc += cuda != mine;
#endif
                }
                diff_cuda[k][sat] += dc, diff_bulk[k][sat] += db;
                for (int64_t i = 0; (dc || db) && i < n && shown < 10; i++) {
                    uint8_t mine = mp_f32_to_fp8(x[i], FMT[k].f, sat);
                    int cuda = -1;
#ifdef MP_CUDA_FP8_REF
                    cuda = __nv_cvt_float_to_fp8(x[i], sat ? __NV_SATFINITE : __NV_NOSAT, k ? __NV_E5M2 : __NV_E4M3);
#endif
                    if (mine != out[i] || (cuda >= 0 && cuda != mine))
                        printf("  f32 0x%08x -> %s sat=%d: fp8.h 0x%02x, bulk 0x%02x, cuda %d\n", mp_f32_bits(x[i]),
                               FMT[k].name, sat, mine, out[i], cuda), shown++;
                }
            }
    }
    long dec = 0;
    for (int k = 0; k < 2; k++) {
        uint8_t codes[256];
        float f[256];
        for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
        mp_cpu_backend.cast(mp_cpu_backend.ctx, f, MP_F32, codes, FMT[k].dt, 256, 0);
        for (int c = 0; c < 256; c++) {
            float s = mp_fp8_to_f32((uint8_t)c, FMT[k].f);
            int same = mp_f32_bits(s) == mp_f32_bits(f[c]);
#ifdef MP_CUDA_FP8_REF
            __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, k ? __NV_E5M2 : __NV_E4M3);
            float r = mp_f16_to_f32(h.x);
            same &= (r != r && s != s) || mp_f32_bits(r) == mp_f32_bits(s);
#endif
            dec += !same;
        }
    }
    double secs = now() - t0;
    long bad = dec;
    printf("fp8_exhaustive: %llu f32 patterns (stride %llu), %d threads, %.1f s\n", (unsigned long long)total,
           (unsigned long long)stride, omp_get_max_threads(), secs);
    for (int k = 0; k < 2; k++)
        for (int sat = 0; sat < 2; sat++) {
            char c[32];
            snprintf(c, sizeof c, have_cuda ? "%ld differences" : "skipped", diff_cuda[k][sat]);
            printf("  %s %-14s  fp8.h vs cuda_fp8.hpp: %-16s  bulk cast vs fp8.h: %ld differences\n", FMT[k].name,
                   sat ? "saturating" : "not saturating", c, diff_bulk[k][sat]);
            bad += diff_cuda[k][sat] + diff_bulk[k][sat];
        }
    printf("  the 256 codes of each format decoded (bulk, fp8.h%s): %ld differences\n",
           have_cuda ? ", cuda_fp8.hpp" : "", dec);
    printf("  bulk cast f32 -> fp8: %.0f M elements/s\n", bulk_s > 0 ? bulk_n / bulk_s / 1e6 : 0.0);
    printf("fp8_exhaustive: %s\n", bad ? "DIFFERENCES FOUND" : "no differences");
    free(x);
    free(out);
    return bad ? 1 : 0;
}
