/*
 * cpu_optim.c: SGD, Adam, AdamW, RMSprop and Adagrad as one fused pass over flat f32 arrays,
 * element by element in the order of PyTorch's single-tensor implementations
 * (torch/optim/sgd.py, adam.py, adamw.py, rmsprop.py, adagrad.py), so results track PyTorch closely.
 * The hyperparameters are copied to locals and the arrays marked restrict so
 * that the compiler can keep them in registers and vectorise the loops.
 */
#include <math.h>
#include "kernels/cpu/cpu.h"
#include "kernels/step_rules.h"

MP_SIMD static void sgd(float *restrict p, const float *restrict g, float *restrict buf, int64_t n, const mp_optim_args *a,
                        int first)
{
    const float lr = a->lr, wd = a->weight_decay, mom = a->momentum, damp = a->one_minus_dampening;
    const int nesterov = a->nesterov;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float d = g[i];
        if (wd != 0.0f) d = d + wd * p[i];
        if (mom != 0.0f) {
            float b = first ? d : buf[i] * mom + damp * d;
            buf[i] = b;
            d = nesterov ? d + mom * b : b;
        }
        p[i] = p[i] - lr * d;
    }
}

MP_SIMD static void adam(int decoupled, float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                 int64_t n, const mp_optim_args *a, float step_size, float bc2)
{
    const float b1 = a->beta1, b2 = a->beta2, c1 = a->one_minus_beta1, c2 = a->one_minus_beta2;
    const float wd = a->weight_decay, decay = a->decay;
    const float eps = a->eps, step = -step_size;
    if (decoupled) {   /* AdamW: p *= 1 - lr*wd, then the Adam update */
        #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i], pi = p[i] * decay;
            float mi = m[i] * b1 + c1 * gi, vi = v[i] * b2 + c2 * gi * gi;
            m[i] = mi, v[i] = vi;
            p[i] = pi + step * mi / (sqrtf(vi) / bc2 + eps);
        }
    } else {           /* Adam: weight decay as an L2 term in the gradient */
        #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            float gi = g[i] + wd * p[i];
            float mi = m[i] * b1 + c1 * gi, vi = v[i] * b2 + c2 * gi * gi;
            m[i] = mi, v[i] = vi;
            p[i] = p[i] + step * mi / (sqrtf(vi) / bc2 + eps);
        }
    }
}

/* RMSprop: square_avg (sq), momentum_buffer (buf, with momentum) and grad_avg
 * (ga, centered), in torch/optim/rmsprop.py's order: avg = sqrt(sq [- ga^2]) + eps */
MP_SIMD static void rmsprop(float *restrict p, const float *restrict g, float *restrict sq, float *restrict buf,
                            float *restrict ga, int64_t n, const mp_optim_args *a)
{
    const float lr = a->lr, wd = a->weight_decay, mom = a->momentum, al = a->alpha, c = a->one_minus_alpha;
    const float eps = a->eps, nlr = -a->lr;
    const int centered = a->centered;
    (void)lr;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        if (wd != 0.0f) gi = gi + wd * p[i];
        float s = sq[i] * al + c * gi * gi;
        sq[i] = s;
        float avg;
        if (centered) {
            float m = ga[i] * al + c * gi;
            ga[i] = m;
            avg = sqrtf(s + -1.0f * m * m);
        } else {
            avg = sqrtf(s);
        }
        avg = avg + eps;
        if (mom > 0.0f) {
            float b = buf[i] * mom + 1.0f * gi / avg;
            buf[i] = b;
            p[i] = p[i] + nlr * b;
        } else {
            p[i] = p[i] + nlr * gi / avg;
        }
    }
}

/* Adagrad: sum += g^2, p -= clr * g / (sqrt(sum) + eps) (torch/optim/adagrad.py) */
MP_SIMD static void adagrad(float *restrict p, const float *restrict g, float *restrict sum, int64_t n,
                            const mp_optim_args *a, float clr)
{
    const float wd = a->weight_decay, eps = a->eps, nclr = -clr;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i];
        if (wd != 0.0f) gi = gi + wd * p[i];
        float s = sum[i] + 1.0f * gi * gi;
        sum[i] = s;
        p[i] = p[i] + nclr * gi / (sqrtf(s) + eps);
    }
}

void cpu_optim_count(mp_kctx *cx, int64_t *step, const int32_t *skip)
{
    if (!(skip && *skip)) ++*step;
}

void cpu_optim_step(mp_kctx *cx, mp_optim_kind kind, float *p, const float *g, float *s1, float *s2, int64_t n,
                    const mp_optim_args *a, const int64_t *step, const int32_t *skip, void *lowp,
                    mp_dtype lowp_dt)
{
    if (skip && *skip) return;
    float step_size, bc2;
    switch (kind) {   /* no default: a new kind must say its rule here */
    case MP_SGD: sgd(p, g, s1, n, a, *step == 1); break;   /* the first step fills the momentum buffer */
    case MP_ADAM:
    case MP_ADAMW:
        mp_adam_bias(a, *step, &step_size, &bc2);
        adam(kind == MP_ADAMW, p, g, s1, s2, n, a, step_size, bc2);
        break;
    case MP_RMSPROP: rmsprop(p, g, s1, s2, a->s3, n, a); break;
    case MP_ADAGRAD: adagrad(p, g, s1, n, a, mp_adagrad_clr(a, *step)); break;
    }
    /* the working copy: a second pass here (the arrays are small on the CPU);
     * the CUDA kernel writes it in the same pass */
    if (lowp) cpu_cast(cx, lowp, lowp_dt, p, MP_F32, n);
}
