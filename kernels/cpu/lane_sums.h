/*
 * lane_sums.h: sums of f32 rows in double over 8 lanes, each lane in order and
 * the lanes added in order at the end: loops the compiler vectorises (a single
 * double accumulator is a chain of dependent adds), with the same bits on every
 * machine, clone and thread count. Shared by layer norm, batch norm and
 * attention's backward.
 */
#ifndef MP_LANE_SUMS_H
#define MP_LANE_SUMS_H

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
#define MP_ROWS 4

MP_SIMD static inline void lane_sum_rows(const float *r, int64_t stride, int64_t n, double *out)
{
    double acc[MP_ROWS][MP_LANES] = {{0}};
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES)
        for (int k = 0; k < MP_ROWS; k++)
            for (int l = 0; l < MP_LANES; l++) acc[k][l] += r[k * stride + j + l];
    for (; j < n; j++)
        for (int k = 0; k < MP_ROWS; k++) acc[k][j % MP_LANES] += r[k * stride + j];
    for (int k = 0; k < MP_ROWS; k++) {
        double s = 0;
        for (int l = 0; l < MP_LANES; l++) s += acc[k][l];
        out[k] = s;
    }
}

MP_SIMD static inline void lane_sumsq_dev_rows(const float *r, int64_t stride, int64_t n, const float *m, double *out)
{
    double acc[MP_ROWS][MP_LANES] = {{0}};
    int64_t j = 0;
    for (; j + MP_LANES <= n; j += MP_LANES)
        for (int k = 0; k < MP_ROWS; k++)
            for (int l = 0; l < MP_LANES; l++) { double d = r[k * stride + j + l] - m[k]; acc[k][l] += d * d; }
    for (; j < n; j++)
        for (int k = 0; k < MP_ROWS; k++) { double d = r[k * stride + j] - m[k]; acc[k][j % MP_LANES] += d * d; }
    for (int k = 0; k < MP_ROWS; k++) {
        double s = 0;
        for (int l = 0; l < MP_LANES; l++) s += acc[k][l];
        out[k] = s;
    }
}

#endif
