/*
 * cpu_flush.h: flush counting on the CPU (backend.h: flush_slot, flush_read):
 * what rounding f32 results to f16/bf16 loses, counted per backward op. The
 * state is the CPU context's (struct mp_kctx's flush, kernels/cpu/cpu.h);
 * cpu_store counts through it at every rounding while counting is on.
 */
#ifndef MP_CPU_FLUSH_H
#define MP_CPU_FLUSH_H

#include "kernels/backend.h"

typedef struct {
    bool on;                               /* counting into slot at */
    int at;
    int64_t counts[MP_FLUSH_SLOTS][3];     /* per slot: values rounded, nonzero -> zero, finite -> inf */
} cpu_flush;

/* count n roundings of src into dst (f16 or bf16 bits) into f's slot (thread-safe) */
void cpu_flush_count(cpu_flush *f, mp_dtype dt, const float *src, const uint16_t *dst, int64_t n);
/* count into slot (0 <= slot < MP_FLUSH_SLOTS), or into none (any other) */
void cpu_flush_select(cpu_flush *f, int slot);
/* every slot's totals into counts (when not NULL), then zero them when clear */
void cpu_flush_take(cpu_flush *f, int64_t (*counts)[3], bool clear);

#endif
