/*
 * cpu_rnn.c: the fused LSTM and GRU cells (kernels/backend.h: lstm_cell,
 * gru_cell and their grads). The projections are GEMMs the engine runs before;
 * these kernels do everything after them for one time step in one pass: the
 * gates' activations, the new state, and in the backward every gradient,
 * recomputing the activations from the saved pre-activations (cheaper than
 * keeping them, and the same values bit for bit). f16/bf16 are widened in
 * blocks of CHUNK units, computed in f32 and rounded once, with the vector
 * exp and tanh of vmath.h (the functions of mp.sigmoid and mp.tanh: libm's
 * scalar ones took most of the time); f64 computes in double.
 */
#include <math.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vmath.h"

#define CHUNK 256   /* units per block: a few KB of f32 on the stack */

/* 1 / (1 + e^-x), or e^x / (1 + e^x) for x < 0 (e <= 1 either way): the sigmoid
 * of cpu_elementwise.c and of the CUDA kernels */
static inline double sigd(double x)
{
    double t = exp(-fabs(x));
    return (x < 0.0 ? t : 1.0) / (1.0 + t);
}

/* ---- f64: direct, in double ---- */

static void lstm_f64(double *hc, const double *gates, const double *cp, int64_t b, int64_t h)
{
    for (int64_t r = 0; r < b; r++) {
        const double *g = gates + r * 4 * h;
        for (int64_t j = 0; j < h; j++) {
            double i = sigd(g[j]), f = sigd(g[h + j]), gg = tanh(g[2 * h + j]), o = sigd(g[3 * h + j]);
            double c = f * cp[r * h + j] + i * gg;
            hc[r * h + j] = o * tanh(c);
            hc[b * h + r * h + j] = c;
        }
    }
}

static void lstm_grad_f64(double *dg, double *dcp, const double *dhc, const double *gates, const double *cp, int64_t b,
                          int64_t h)
{
    for (int64_t r = 0; r < b; r++) {
        const double *g = gates + r * 4 * h;
        double *d = dg + r * 4 * h;
        for (int64_t j = 0; j < h; j++) {
            double i = sigd(g[j]), f = sigd(g[h + j]), gg = tanh(g[2 * h + j]), o = sigd(g[3 * h + j]);
            double c0 = cp[r * h + j], tc = tanh(f * c0 + i * gg);
            double dh = dhc[r * h + j], dc = dhc[b * h + r * h + j] + dh * o * (1 - tc * tc);
            d[j] = dc * gg * i * (1 - i);
            d[h + j] = dc * c0 * f * (1 - f);
            d[2 * h + j] = dc * i * (1 - gg * gg);
            d[3 * h + j] = dh * tc * o * (1 - o);
            dcp[r * h + j] = dc * f;
        }
    }
}

static void gru_f64(double *hy, const double *gi, const double *gh, const double *hp, int64_t b, int64_t h)
{
    for (int64_t r = 0; r < b; r++) {
        const double *a = gi + r * 3 * h, *e = gh + r * 3 * h;
        for (int64_t j = 0; j < h; j++) {
            double rr = sigd(a[j] + e[j]), z = sigd(a[h + j] + e[h + j]), n = tanh(a[2 * h + j] + rr * e[2 * h + j]);
            hy[r * h + j] = (1 - z) * n + z * hp[r * h + j];
        }
    }
}

static void gru_grad_f64(double *dgi, double *dgh, double *dhp, const double *dhy, const double *gi, const double *gh,
                         const double *hp, int64_t b, int64_t h)
{
    for (int64_t r = 0; r < b; r++) {
        const double *a = gi + r * 3 * h, *e = gh + r * 3 * h;
        double *da = dgi + r * 3 * h, *de = dgh + r * 3 * h;
        for (int64_t j = 0; j < h; j++) {
            double rr = sigd(a[j] + e[j]), z = sigd(a[h + j] + e[h + j]), n = tanh(a[2 * h + j] + rr * e[2 * h + j]);
            double g = dhy[r * h + j], hpj = hp[r * h + j];
            double dn = g * (1 - z) * (1 - n * n), dz = g * (hpj - n) * z * (1 - z), dr = dn * e[2 * h + j] * rr * (1 - rr);
            da[j] = dr, da[h + j] = dz, da[2 * h + j] = dn;
            de[j] = dr, de[h + j] = dz, de[2 * h + j] = dn * rr;
            dhp[r * h + j] = g * z;
        }
    }
}

/* ---- f32/f16/bf16: blocks of CHUNK units widened to f32 ---- */

/* y = sigmoid(x) over n values, t scratch (y may alias x); mp.sigmoid's formula */
static void vsig(float *y, const float *x, float *t, int64_t n)
{
    for (int64_t j = 0; j < n; j++) t[j] = -fabsf(x[j]);
    cpu_vexp(t, t, n);
    for (int64_t j = 0; j < n; j++) y[j] = (x[j] < 0.0f ? t[j] : 1.0f) / (1.0f + t[j]);
}

/* rows in parallel when the step is large enough to pay for a team */
#define ROWS_PARALLEL(b, h) _Pragma("omp parallel for schedule(static) if ((b) * (h) >= MP_PAR_MIN)")

/* one block of the LSTM's gates: i, f, g, o (pre-activations in, activations
 * out, in place) from row r's units j0 .. j0 + n */
static void lstm_gates(mp_dtype dt, const void *gates, int64_t g0, int64_t h, int64_t n, float *i, float *f, float *g,
                       float *o, float *t)
{
    cpu_load(dt, gates, g0, i, n), cpu_load(dt, gates, g0 + h, f, n);
    cpu_load(dt, gates, g0 + 2 * h, g, n), cpu_load(dt, gates, g0 + 3 * h, o, n);
    vsig(i, i, t, n), vsig(f, f, t, n), vsig(o, o, t, n);
    cpu_vtanh(g, g, n);
}

void cpu_lstm_cell(mp_kctx *cx, mp_dtype dt, void *hc, const void *gates, const void *c_prev, int64_t b, int64_t h)
{
    if (dt == MP_F64) { lstm_f64(hc, gates, c_prev, b, h); return; }
    ROWS_PARALLEL(b, h)
    for (int64_t r = 0; r < b; r++)
        for (int64_t j0 = 0; j0 < h; j0 += CHUNK) {
            int64_t n = h - j0 < CHUNK ? h - j0 : CHUNK;
            float i[CHUNK], f[CHUNK], g[CHUNK], o[CHUNK], c[CHUNK], y[CHUNK], t[CHUNK];
            lstm_gates(dt, gates, r * 4 * h + j0, h, n, i, f, g, o, t);
            cpu_load(dt, c_prev, r * h + j0, c, n);
            for (int64_t j = 0; j < n; j++) c[j] = f[j] * c[j] + i[j] * g[j];
            cpu_vtanh(y, c, n);
            for (int64_t j = 0; j < n; j++) y[j] *= o[j];
            cpu_store(cx, dt, hc, r * h + j0, y, n);
            cpu_store(cx, dt, hc, b * h + r * h + j0, c, n);
        }
}

void cpu_lstm_cell_grad(mp_kctx *cx, mp_dtype dt, void *dgates, void *dc_prev, const void *dhc, const void *gates,
                        const void *c_prev, int64_t b, int64_t h)
{
    if (dt == MP_F64) { lstm_grad_f64(dgates, dc_prev, dhc, gates, c_prev, b, h); return; }
    ROWS_PARALLEL(b, h)
    for (int64_t r = 0; r < b; r++)
        for (int64_t j0 = 0; j0 < h; j0 += CHUNK) {
            int64_t n = h - j0 < CHUNK ? h - j0 : CHUNK, g0 = r * 4 * h + j0;
            float i[CHUNK], f[CHUNK], g[CHUNK], o[CHUNK], c0[CHUNK], tc[CHUNK], dh[CHUNK], dc[CHUNK], t[CHUNK];
            lstm_gates(dt, gates, g0, h, n, i, f, g, o, t);
            cpu_load(dt, c_prev, r * h + j0, c0, n);
            cpu_load(dt, dhc, r * h + j0, dh, n), cpu_load(dt, dhc, b * h + r * h + j0, dc, n);
            for (int64_t j = 0; j < n; j++) tc[j] = f[j] * c0[j] + i[j] * g[j];
            cpu_vtanh(tc, tc, n);
            for (int64_t j = 0; j < n; j++) {   /* in place: each activation becomes its pre-activation's gradient */
                float d = dc[j] + dh[j] * o[j] * (1.0f - tc[j] * tc[j]);
                float di = d * g[j] * i[j] * (1.0f - i[j]), df = d * c0[j] * f[j] * (1.0f - f[j]);
                float dg = d * i[j] * (1.0f - g[j] * g[j]), dout = dh[j] * tc[j] * o[j] * (1.0f - o[j]);
                dc[j] = d * f[j];
                i[j] = di, f[j] = df, g[j] = dg, o[j] = dout;
            }
            cpu_store(cx, dt, dgates, g0, i, n), cpu_store(cx, dt, dgates, g0 + h, f, n);
            cpu_store(cx, dt, dgates, g0 + 2 * h, g, n), cpu_store(cx, dt, dgates, g0 + 3 * h, o, n);
            cpu_store(cx, dt, dc_prev, r * h + j0, dc, n);
        }
}

/* one block of the GRU's gates: r, z (activations) and n, with en the hidden
 * projection's n part (W_hn h + b_hn), for row r's units j0 .. j0 + n */
static void gru_gates(mp_dtype dt, const void *gi, const void *gh, int64_t g0, int64_t h, int64_t n, float *rr,
                      float *z, float *nn, float *en, float *t)
{
    cpu_load(dt, gi, g0, rr, n), cpu_load(dt, gi, g0 + h, z, n), cpu_load(dt, gi, g0 + 2 * h, nn, n);
    cpu_load(dt, gh, g0 + 2 * h, en, n);
    cpu_load(dt, gh, g0, t, n);
    for (int64_t j = 0; j < n; j++) rr[j] += t[j];
    cpu_load(dt, gh, g0 + h, t, n);
    for (int64_t j = 0; j < n; j++) z[j] += t[j];
    vsig(rr, rr, t, n), vsig(z, z, t, n);
    for (int64_t j = 0; j < n; j++) nn[j] += rr[j] * en[j];
    cpu_vtanh(nn, nn, n);
}

void cpu_gru_cell(mp_kctx *cx, mp_dtype dt, void *hy, const void *gi, const void *gh, const void *h_prev, int64_t b,
                  int64_t h)
{
    if (dt == MP_F64) { gru_f64(hy, gi, gh, h_prev, b, h); return; }
    ROWS_PARALLEL(b, h)
    for (int64_t r = 0; r < b; r++)
        for (int64_t j0 = 0; j0 < h; j0 += CHUNK) {
            int64_t n = h - j0 < CHUNK ? h - j0 : CHUNK;
            float rr[CHUNK], z[CHUNK], nn[CHUNK], en[CHUNK], hp[CHUNK], t[CHUNK];
            gru_gates(dt, gi, gh, r * 3 * h + j0, h, n, rr, z, nn, en, t);
            cpu_load(dt, h_prev, r * h + j0, hp, n);
            for (int64_t j = 0; j < n; j++) hp[j] = (1.0f - z[j]) * nn[j] + z[j] * hp[j];
            cpu_store(cx, dt, hy, r * h + j0, hp, n);
        }
}

void cpu_gru_cell_grad(mp_kctx *cx, mp_dtype dt, void *dgi, void *dgh, void *dh_prev, const void *dhy, const void *gi,
                       const void *gh, const void *h_prev, int64_t b, int64_t h)
{
    if (dt == MP_F64) { gru_grad_f64(dgi, dgh, dh_prev, dhy, gi, gh, h_prev, b, h); return; }
    ROWS_PARALLEL(b, h)
    for (int64_t r = 0; r < b; r++)
        for (int64_t j0 = 0; j0 < h; j0 += CHUNK) {
            int64_t n = h - j0 < CHUNK ? h - j0 : CHUNK, g0 = r * 3 * h + j0;
            float rr[CHUNK], z[CHUNK], nn[CHUNK], en[CHUNK], hp[CHUNK], g[CHUNK], t[CHUNK];
            gru_gates(dt, gi, gh, g0, h, n, rr, z, nn, en, t);
            cpu_load(dt, h_prev, r * h + j0, hp, n), cpu_load(dt, dhy, r * h + j0, g, n);
            for (int64_t j = 0; j < n; j++) {   /* in place, as the LSTM's */
                float rj = rr[j], zj = z[j], nj = nn[j], ej = en[j];
                float dn = g[j] * (1.0f - zj) * (1.0f - nj * nj), dz = g[j] * (hp[j] - nj) * zj * (1.0f - zj);
                rr[j] = dn * ej * rj * (1.0f - rj), z[j] = dz, nn[j] = dn, en[j] = dn * rj;
                hp[j] = g[j] * zj;
            }
            cpu_store(cx, dt, dgi, g0, rr, n), cpu_store(cx, dt, dgi, g0 + h, z, n);
            cpu_store(cx, dt, dgi, g0 + 2 * h, nn, n);
            cpu_store(cx, dt, dgh, g0, rr, n), cpu_store(cx, dt, dgh, g0 + h, z, n);
            cpu_store(cx, dt, dgh, g0 + 2 * h, en, n);
            cpu_store(cx, dt, dh_prev, r * h + j0, hp, n);
        }
}
