/*
 * lane_sums.h: sums of f32 rows in double over 8 lanes, each lane in order and
 * the lanes added in order at the end: loops the compiler vectorises (a single
 * double accumulator is a chain of dependent adds), with the same bits on every
 * machine, clone and thread count. Shared by layer norm, batch norm and
 * attention's backward.
 */
#ifndef MP_LANE_SUMS_H
#define MP_LANE_SUMS_H

#include <string.h>
#include "kernels/cpu/cpu.h"

#define MP_LANES 8

/* sum of r[j] */
MP_SIMD static inline double lane_sum(const float *r, int64_t n)
{
    double acc[MP_LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES)
        for (int l = 0; l < MP_LANES; l++) acc[l] += r[j + l];
    for (; j < n; j++) acc[j % MP_LANES] += r[j];
    for (int l = 0; l < MP_LANES; l++) s += acc[l];
    return s;
}

/* sum of (r[j] - m)^2, the difference taken in f32 */
MP_SIMD static inline double lane_sumsq_dev(const float *r, int64_t n, float m)
{
    double acc[MP_LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES)
        for (int l = 0; l < MP_LANES; l++) { double d = r[j + l] - m; acc[l] += d * d; }
    for (; j < n; j++) { double d = r[j] - m; acc[j % MP_LANES] += d * d; }
    for (int l = 0; l < MP_LANES; l++) s += acc[l];
    return s;
}

/* sum of x[j] y[j] */
MP_SIMD static inline double lane_dot(const float *x, const float *y, int64_t n)
{
    double acc[MP_LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES)
        for (int l = 0; l < MP_LANES; l++) acc[l] += (double)x[j + l] * y[j + l];
    for (; j < n; j++) acc[j % MP_LANES] += (double)x[j] * y[j];
    for (int l = 0; l < MP_LANES; l++) s += acc[l];
    return s;
}

/* sum of g[j] (x[j] - m), the difference taken in f32 */
MP_SIMD static inline double lane_dot_dev(const float *g, const float *x, int64_t n, float m)
{
    double acc[MP_LANES] = {0}, s = 0;
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES)
        for (int l = 0; l < MP_LANES; l++) acc[l] += (double)g[j + l] * (x[j + l] - m);
    for (; j < n; j++) acc[j % MP_LANES] += (double)g[j] * (x[j] - m);
    for (int l = 0; l < MP_LANES; l++) s += acc[l];
    return s;
}

/* The same sums of MP_ROWS rows at once (row k at r + k * stride), each row's
 * bits those of the one-row function: a row's sum is a chain of n / 8
 * dependent adds, and rows side by side run their chains in parallel (layer
 * norm's rows of 128 were bound by that latency, not by the loads). */
#define MP_ROWS 4   /* the _rows functions below are written out for 4 */

/* the rows' accumulators are named one by one: with a 2-d array GCC gathered
 * scalars across the rows instead of loading each row's 8 lanes */
MP_SIMD static inline void lane_sum_rows(const float *r, int64_t stride, int64_t n, double *out)
{
    const float *r0 = r, *r1 = r + stride, *r2 = r + 2 * stride, *r3 = r + 3 * stride;
    double a0[MP_LANES] = {0}, a1[MP_LANES] = {0}, a2[MP_LANES] = {0}, a3[MP_LANES] = {0};
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES) {
        { float t[MP_LANES]; memcpy(t, r0 + j, sizeof t); for (int l = 0; l < MP_LANES; l++) a0[l] += t[l]; }
        { float t[MP_LANES]; memcpy(t, r1 + j, sizeof t); for (int l = 0; l < MP_LANES; l++) a1[l] += t[l]; }
        { float t[MP_LANES]; memcpy(t, r2 + j, sizeof t); for (int l = 0; l < MP_LANES; l++) a2[l] += t[l]; }
        { float t[MP_LANES]; memcpy(t, r3 + j, sizeof t); for (int l = 0; l < MP_LANES; l++) a3[l] += t[l]; }
    }
    for (; j < n; j++) {
        int l = (int)(j % MP_LANES);
        a0[l] += r0[j], a1[l] += r1[j], a2[l] += r2[j], a3[l] += r3[j];
    }
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int l = 0; l < MP_LANES; l++) s0 += a0[l], s1 += a1[l], s2 += a2[l], s3 += a3[l];
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

/* a[l] += (r[l] - m)^2 over 8 lanes, the difference in f32 */
static inline void sq_dev8(double *a, const float *r, float m)
{
    float t[MP_LANES];
    for (int l = 0; l < MP_LANES; l++) t[l] = r[l] - m;
    for (int l = 0; l < MP_LANES; l++) { double d = t[l]; a[l] += d * d; }
}

MP_SIMD static inline void lane_sumsq_dev_rows(const float *r, int64_t stride, int64_t n, const float *m, double *out)
{
    const float *r0 = r, *r1 = r + stride, *r2 = r + 2 * stride, *r3 = r + 3 * stride;
    float m0 = m[0], m1 = m[1], m2 = m[2], m3 = m[3];
    double a0[MP_LANES] = {0}, a1[MP_LANES] = {0}, a2[MP_LANES] = {0}, a3[MP_LANES] = {0};
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES) {
        sq_dev8(a0, r0 + j, m0);
        sq_dev8(a1, r1 + j, m1);
        sq_dev8(a2, r2 + j, m2);
        sq_dev8(a3, r3 + j, m3);
    }
    for (; j < n; j++) {
        int l = (int)(j % MP_LANES);
        double d0 = r0[j] - m0, d1 = r1[j] - m1, d2 = r2[j] - m2, d3 = r3[j] - m3;
        a0[l] += d0 * d0, a1[l] += d1 * d1, a2[l] += d2 * d2, a3[l] += d3 * d3;
    }
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int l = 0; l < MP_LANES; l++) s0 += a0[l], s1 += a1[l], s2 += a2[l], s3 += a3[l];
    out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

#endif
