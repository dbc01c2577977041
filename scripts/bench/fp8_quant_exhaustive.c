/*
 * fp8_quant_exhaustive.c: the quantizer's fast loops (kernels/cpu/cpu_fp8_seg.c:
 * the branch-free portable loop and, where the CPU has it, AVX-512) against
 * its reference loop (kernels/fp8.h's mp_f32_to_fp8 an element) on every f32
 * bit pattern (2^32), e4m3 and e5m2, for each multiplier asked for: the codes
 * byte for byte, and per chunk of 4096 patterns the amax, the NaN flag and
 * the saturated and flushed counts. Too long for `make test` (which checks a
 * dense sample of boundaries: tests/c/test_fp8_quant.c); a benchmark-like
 * program instead.
 *
 *   make bench            (builds build/bench/fp8_quant_exhaustive)
 *   build/bench/fp8_quant_exhaustive [--stride N] [--scales 1,0.5,...]
 *
 * --stride N: every Nth pattern only (default 1: all of them); --scales: the
 * multipliers (default 1, 0.75, 3, 2^-20, 2^40). Prints the differences per
 * path, format and multiplier, the first few, each path's speed (M elements/s
 * on one thread), and exits 1 on any difference.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "scripts/bench/bench_clock.h"
#include "kernels/cpu/cpu_fp8_seg.h"
#include "kernels/half.h"

#define CHUNK 4096
#define MAXS 16

static const struct { const char *name; mp_fp8_format f; } FMT[2] = {{"e4m3", MP_FP8_E4M3}, {"e5m2", MP_FP8_E5M2}};

int main(int argc, char **argv)
{
    uint64_t stride = 1;
    float scales[MAXS] = {1.0f, 0.75f, 3.0f, 0x1p-20f, 0x1p40f};
    int ns = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--stride") == 0 && i + 1 < argc) stride = strtoull(argv[++i], NULL, 0);
        else if (strcmp(argv[i], "--scales") == 0 && i + 1 < argc) {
            char *p = argv[++i];
            for (ns = 0; ns < MAXS && *p; ns++) {
                scales[ns] = strtof(p, &p);
                if (*p == ',') p++;
            }
        } else {
            fprintf(stderr, "usage: fp8_quant_exhaustive [--stride N] [--scales a,b,...]\n");
            return 2;
        }
    }
    if (stride < 1) stride = 1;
    int np;
    const cpu_fp8_seg_path *paths = cpu_fp8_seg_paths(&np);
    uint64_t total = ((uint64_t)1 << 32) / stride;
    long diff[4][2][MAXS] = {{{0}}}, shown = 0;
    double secs[4] = {0};
    double t0 = now();
    #pragma omp parallel
    {
        float x[CHUNK];
        uint8_t qr[CHUNK], qp[CHUNK];
        double my_secs[4] = {0};
        #pragma omp for schedule(dynamic, 64)
        for (uint64_t base = 0; base < total; base += CHUNK) {
            int64_t n = total - base < CHUNK ? (int64_t)(total - base) : CHUNK;
            for (int64_t i = 0; i < n; i++) {
                uint32_t u = (uint32_t)((base + (uint64_t)i) * stride);
                memcpy(&x[i], &u, 4);
            }
            for (int k = 0; k < 2; k++)
                for (int s = 0; s < ns; s++) {
                    cpu_fp8_seen ref = {0};
                    double b0 = now();
                    paths[0].amax(x, n, &ref);
                    paths[0].codes(x, n, scales[s], FMT[k].f, qr, &ref);
                    my_secs[0] += now() - b0;
                    for (int p = 1; p < np; p++) {
                        cpu_fp8_seen got = {0};
                        b0 = now();
                        paths[p].amax(x, n, &got);
                        paths[p].codes(x, n, scales[s], FMT[k].f, qp, &got);
                        my_secs[p] += now() - b0;
                        long d = memcmp(&ref.amax, &got.amax, 4) != 0 || ref.nan != got.nan ||
                                 ref.saturated != got.saturated || ref.flushed != got.flushed;
                        for (int64_t i = 0; i < n; i++) d += qr[i] != qp[i];
                        if (d) {
                            #pragma omp critical
                            {
                                diff[p][k][s] += d;
                                for (int64_t i = 0; i < n && shown < 10; i++)
                                    if (qr[i] != qp[i])
                                        printf("  %s %s x 0x%08x * %g: reference 0x%02x, got 0x%02x\n", paths[p].name,
                                               FMT[k].name, mp_f32_bits(x[i]), scales[s], qr[i], qp[i]), shown++;
                                if (shown < 10)
                                    printf("  %s %s chunk at 0x%08llx * %g: amax %a/%a nan %d/%d sat %lld/%lld "
                                           "flushed %lld/%lld\n", paths[p].name, FMT[k].name,
                                           (unsigned long long)(base * stride), scales[s], ref.amax, got.amax,
                                           ref.nan, got.nan, (long long)ref.saturated, (long long)got.saturated,
                                           (long long)ref.flushed, (long long)got.flushed), shown++;
                            }
                        }
                    }
                }
        }
        #pragma omp critical
        for (int p = 0; p < np; p++) secs[p] += my_secs[p];
    }
    long bad = 0;
    printf("fp8_quant_exhaustive: %llu f32 patterns (stride %llu), %d multipliers, %.1f s\n",
           (unsigned long long)total, (unsigned long long)stride, ns, now() - t0);
    for (int p = 1; p < np; p++)
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < ns; s++) {
                printf("  %-9s %s x %-12g vs reference: %ld differences\n", paths[p].name, FMT[k].name, scales[s],
                       diff[p][k][s]);
                bad += diff[p][k][s];
            }
    for (int p = 0; p < np; p++)
        printf("  %-9s amax + codes: %.0f M elements/s a thread\n", paths[p].name,
               secs[p] > 0 ? 2.0 * ns * (double)total / secs[p] / 1e6 : 0.0);
    printf("fp8_quant_exhaustive: %s\n", bad ? "DIFFERENCES FOUND" : "no differences");
    return bad ? 1 : 0;
}
