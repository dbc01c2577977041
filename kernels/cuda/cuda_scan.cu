/*
 * cuda_scan.cu: inclusive prefix sums (cumsum) along the middle axis of an
 * {outer, n, inner} view, forwards or from the end (cumsum's backward).
 *
 * A thread owns a column and walks it in order with a double accumulator,
 * rounding each output once, exactly as kernels/cpu/cpu_scan.c does, so both
 * backends give the same bits and every run the same. Columns are the
 * parallelism; a single very long column runs on one thread (a cumsum over a
 * sequence of a few thousand values is microseconds; a block-wide parallel scan
 * would be the next step for rows of millions). Roundings to f16/bf16 are
 * tallied for flush counting.
 */
#include "kernels/cuda/cuda.h"

namespace {

__global__ void k_scan(mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner,
                       int reverse, unsigned long long *fc)
{
    mp_tally t(fc);
    MP_FOR(q, outer * inner) {
        int64_t base = q / inner * n * inner + q % inner;
        double s = 0;
        for (int64_t k = 0; k < n; k++) {
            int64_t at = base + (reverse ? n - 1 - k : k) * inner;
            s += (double)mp_ld(dt, a, at);
            if (dt == MP_F32) ((float *)out)[at] = (float)s;
            else mp_stc(dt, out, at, (float)s, t);   /* f16, bf16 (the engine scans floats; no f64 here) */
        }
    }
    t.commit();
}

} /* namespace */

void mp_cuda_scan(mp_kctx *cx, mp_dtype dt, void *out, const void *a, int64_t outer, int64_t n, int64_t inner,
                  int reverse)
{
    if (outer * inner <= 0 || n <= 0) return;
    MP_LAUNCH(mp_blocks(outer * inner), MP_THREADS, 0, cx->stream, k_scan, dt, out, a, outer, n, inner, reverse,
              cx->flush);
    MP_LAUNCHED("scan");
}
