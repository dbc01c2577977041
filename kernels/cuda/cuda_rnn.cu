/*
 * cuda_rnn.cu: the fused LSTM and GRU cells (kernels/backend.h: lstm_cell,
 * gru_cell and their grads), one thread per (row, unit), the formulas of
 * kernels/cpu/cpu_rnn.c: f32 inside, one rounding per output, the backward
 * recomputing the activations from the saved pre-activations.
 */
#include "kernels/cuda/cuda.h"

/* the sigmoid of cuda_elementwise.cu and the CPU: e <= 1 either way */
static __device__ __forceinline__ float rnn_sig(float x)
{
    float t = expf(-fabsf(x));
    return (x < 0.0f ? t : 1.0f) / (1.0f + t);
}

template <class T>
__global__ void k_lstm(void *hc, const void *gates, const void *cp, int64_t b, int64_t h, unsigned long long *flush)
{
    mp_tally t(flush);
    MP_FOR(k, b * h) {
        int64_t r = k / h, j = k - r * h, g0 = r * 4 * h + j;
        float i = rnn_sig(mp_get<T>(gates, g0)), f = rnn_sig(mp_get<T>(gates, g0 + h));
        float g = tanhf(mp_get<T>(gates, g0 + 2 * h)), o = rnn_sig(mp_get<T>(gates, g0 + 3 * h));
        float c = f * mp_get<T>(cp, k) + i * g;
        mp_put<T>(hc, k, o * tanhf(c), t);
        mp_put<T>(hc, b * h + k, c, t);
    }
    t.commit();
}

template <class T>
__global__ void k_lstm_grad(void *dgates, void *dcp, const void *dhc, const void *gates, const void *cp, int64_t b,
                            int64_t h, unsigned long long *flush)
{
    mp_tally t(flush);
    MP_FOR(k, b * h) {
        int64_t r = k / h, j = k - r * h, g0 = r * 4 * h + j;
        float i = rnn_sig(mp_get<T>(gates, g0)), f = rnn_sig(mp_get<T>(gates, g0 + h));
        float g = tanhf(mp_get<T>(gates, g0 + 2 * h)), o = rnn_sig(mp_get<T>(gates, g0 + 3 * h));
        float c0 = mp_get<T>(cp, k), tc = tanhf(f * c0 + i * g);
        float dh = mp_get<T>(dhc, k), d = mp_get<T>(dhc, b * h + k) + dh * o * (1.0f - tc * tc);
        mp_put<T>(dgates, g0, d * g * i * (1.0f - i), t);
        mp_put<T>(dgates, g0 + h, d * c0 * f * (1.0f - f), t);
        mp_put<T>(dgates, g0 + 2 * h, d * i * (1.0f - g * g), t);
        mp_put<T>(dgates, g0 + 3 * h, dh * tc * o * (1.0f - o), t);
        mp_put<T>(dcp, k, d * f, t);
    }
    t.commit();
}

template <class T>
__global__ void k_gru(void *hy, const void *gi, const void *gh, const void *hp, int64_t b, int64_t h,
                      unsigned long long *flush)
{
    mp_tally t(flush);
    MP_FOR(k, b * h) {
        int64_t r = k / h, j = k - r * h, g0 = r * 3 * h + j;
        float rr = rnn_sig(mp_get<T>(gi, g0) + mp_get<T>(gh, g0));
        float z = rnn_sig(mp_get<T>(gi, g0 + h) + mp_get<T>(gh, g0 + h));
        float n = tanhf(mp_get<T>(gi, g0 + 2 * h) + rr * mp_get<T>(gh, g0 + 2 * h));
        mp_put<T>(hy, k, (1.0f - z) * n + z * mp_get<T>(hp, k), t);
    }
    t.commit();
}

template <class T>
__global__ void k_gru_grad(void *dgi, void *dgh, void *dhp, const void *dhy, const void *gi, const void *gh,
                           const void *hp, int64_t b, int64_t h, unsigned long long *flush)
{
    mp_tally t(flush);
    MP_FOR(k, b * h) {
        int64_t r = k / h, j = k - r * h, g0 = r * 3 * h + j;
        float rr = rnn_sig(mp_get<T>(gi, g0) + mp_get<T>(gh, g0));
        float z = rnn_sig(mp_get<T>(gi, g0 + h) + mp_get<T>(gh, g0 + h));
        float en = mp_get<T>(gh, g0 + 2 * h), n = tanhf(mp_get<T>(gi, g0 + 2 * h) + rr * en);
        float g = mp_get<T>(dhy, k);
        float dn = g * (1.0f - z) * (1.0f - n * n), dz = g * (mp_get<T>(hp, k) - n) * z * (1.0f - z);
        float dr = dn * en * rr * (1.0f - rr);
        mp_put<T>(dgi, g0, dr, t), mp_put<T>(dgi, g0 + h, dz, t), mp_put<T>(dgi, g0 + 2 * h, dn, t);
        mp_put<T>(dgh, g0, dr, t), mp_put<T>(dgh, g0 + h, dz, t), mp_put<T>(dgh, g0 + 2 * h, dn * rr, t);
        mp_put<T>(dhp, k, g * z, t);
    }
    t.commit();
}

void mp_cuda_lstm_cell(mp_kctx *cx, mp_dtype dt, void *hc, const void *gates, const void *c_prev, int64_t b, int64_t h)
{
    if (b * h <= 0) return;
    MP_BY_FLOAT(dt, T, MP_LAUNCH(mp_blocks(b * h), MP_THREADS, 0, cx->stream, k_lstm<T>, hc, gates, c_prev, b, h,
                                 cx->flush));
    MP_LAUNCHED("lstm_cell");
}

void mp_cuda_lstm_cell_grad(mp_kctx *cx, mp_dtype dt, void *dgates, void *dc_prev, const void *dhc, const void *gates,
                            const void *c_prev, int64_t b, int64_t h)
{
    if (b * h <= 0) return;
    MP_BY_FLOAT(dt, T, MP_LAUNCH(mp_blocks(b * h), MP_THREADS, 0, cx->stream, k_lstm_grad<T>, dgates, dc_prev, dhc,
                                 gates, c_prev, b, h, cx->flush));
    MP_LAUNCHED("lstm_cell_grad");
}

void mp_cuda_gru_cell(mp_kctx *cx, mp_dtype dt, void *hy, const void *gi, const void *gh, const void *h_prev, int64_t b,
                      int64_t h)
{
    if (b * h <= 0) return;
    MP_BY_FLOAT(dt, T, MP_LAUNCH(mp_blocks(b * h), MP_THREADS, 0, cx->stream, k_gru<T>, hy, gi, gh, h_prev, b, h,
                                 cx->flush));
    MP_LAUNCHED("gru_cell");
}

void mp_cuda_gru_cell_grad(mp_kctx *cx, mp_dtype dt, void *dgi, void *dgh, void *dh_prev, const void *dhy,
                           const void *gi, const void *gh, const void *h_prev, int64_t b, int64_t h)
{
    if (b * h <= 0) return;
    MP_BY_FLOAT(dt, T, MP_LAUNCH(mp_blocks(b * h), MP_THREADS, 0, cx->stream, k_gru_grad<T>, dgi, dgh, dh_prev, dhy,
                                 gi, gh, h_prev, b, h, cx->flush));
    MP_LAUNCHED("gru_cell_grad");
}
