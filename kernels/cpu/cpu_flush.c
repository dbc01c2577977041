/*
 * cpu_flush.c: flush counting on the CPU (cpu_flush.h), on the counters the
 * CPU context holds.
 */
#include <math.h>
#include <string.h>
#include "kernels/cpu/cpu_flush.h"

void cpu_flush_count(cpu_flush *f, mp_dtype dt, const float *src, const uint16_t *dst, int64_t n)
{
    int64_t zero = 0, inf = 0;
    uint16_t inf_bits = dt == MP_F16 ? 0x7c00 : 0x7f80;
    for (int64_t j = 0; j < n; j++) {
        uint16_t mag = dst[j] & 0x7fff;
        zero += mag == 0 && src[j] != 0.0f;
        inf += mag == inf_bits && isfinite(src[j]);
    }
    int64_t *c = f->counts[f->at];
    #pragma omp atomic
    c[0] += n;
    #pragma omp atomic
    c[1] += zero;
    #pragma omp atomic
    c[2] += inf;
}

void cpu_flush_select(cpu_flush *f, int slot)
{
    f->on = slot >= 0 && slot < MP_FLUSH_SLOTS;
    if (f->on) f->at = slot;
}

void cpu_flush_take(cpu_flush *f, int64_t (*counts)[3], bool clear)
{
    if (counts) memcpy(counts, f->counts, sizeof f->counts);
    if (clear) memset(f->counts, 0, sizeof f->counts);
}
