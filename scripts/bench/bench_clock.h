/*
 * bench_clock.h: what the C benchmarks share: a monotonic clock in seconds and
 * the median of a set of timings (sorted in place).
 */
#ifndef MP_BENCH_CLOCK_H
#define MP_BENCH_CLOCK_H

#include <stdlib.h>
#include <time.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp);
    return t[n / 2];
}

#endif
