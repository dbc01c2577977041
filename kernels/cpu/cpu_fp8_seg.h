/*
 * cpu_fp8_seg.h: the inner loops of the CPU FP8 quantizer (cpu_fp8_quant.c)
 * over f32 values already in memory: a segment's amax, and its codes (x times
 * a multiplier, saturating) with the saturation and flush counts.
 *
 * Three paths give the same bits for every input: the reference (one
 * mp_f32_to_fp8 of kernels/fp8.h an element, with its branches), a
 * branch-free portable loop in plain C that the compiler may vectorise, and
 * AVX-512 intrinsics (chosen at run time where the CPU has avx512f and
 * avx512bw, as convert.c chooses its bf16 paths). The scalar conversion was
 * a third of an FP8 char-GPT step; tests/c/test_fp8_quant.c and
 * scripts/bench/fp8_exhaustive.c hold every path to the reference.
 */
#ifndef MP_CPU_FP8_SEG_H
#define MP_CPU_FP8_SEG_H

#include <stdint.h>
#include "kernels/fp8.h"

/* what a segment's pass has seen: the largest |x| that is not NaN (0 for
 * none), whether a NaN was met, the codes that saturated (a value that rounds
 * past the largest finite one, an infinity) and those flushed (x finite and
 * not zero, its code a zero) */
typedef struct {
    float amax;
    int nan;
    int64_t saturated, flushed;
} cpu_fp8_seen;

typedef struct {
    const char *name;   /* "reference", "portable", "avx512" */
    /* folds the amax and NaN of x[0..n) into s */
    void (*amax)(const float *x, int64_t n, cpu_fp8_seen *s);
    /* q[i] = the saturating code of x[i] * sc; adds the counts to s */
    void (*codes)(const float *x, int64_t n, float sc, mp_fp8_format fmt, uint8_t *q, cpu_fp8_seen *s);
} cpu_fp8_seg_path;

/* the paths this CPU can run, the reference first; *n their count */
const cpu_fp8_seg_path *cpu_fp8_seg_paths(int *n);
/* the fastest of them (the quantizer's) */
const cpu_fp8_seg_path *cpu_fp8_seg_best(void);

#endif
