/*
 * cpu_optim.c: SGD, Adam, AdamW, RMSprop and Adagrad as one fused pass over flat f32 arrays,
 * element by element in the order of PyTorch's single-tensor implementations
 * (torch/optim/sgd.py, adam.py, adamw.py, rmsprop.py, adagrad.py), so results track PyTorch closely.
 * The hyperparameters are copied to locals and the arrays marked restrict so
 * that the compiler can keep them in registers and vectorise the loops.
 *
 * Under autocast the step also writes the parameters' f16/bf16 working copy
 * (the arena's lowp). It does so block by block inside the same pass: each
 * block of MP_BLOCK updated parameters is rounded into the copy while it is
 * still in L1, instead of a second pass that reads every parameter back from
 * memory (that pass was 3% of the f16 MLP step). The rounding is the cast
 * kernel's (convert.c), so the copy is bit-identical to a cast after the step.
 *
 * Given wide (a working copy's f32 widening, which the engine keeps for
 * the GEMMs: kernels/backend.h gemm_wide), the block's rounded values are
 * widened into it right away, from L1, by the cast kernel's widening: the same
 * bits as the GEMM's own widening of the copy, which the next forward then
 * skips (that pass read the copy back from memory: 157 us of the f16 MLP step).
 * The two are one pass (convert.h mp_cpu_f32_to_f16_widened and
 * mp_cpu_f32_to_bf16_widened: each rounded register widened as it is stored,
 * no reload of the copy).
 */
#include <math.h>
#include "kernels/cpu/cpu.h"
#include "kernels/step_rules.h"

/* the working copy of p[b, e) (NULL lowp: none); inside a parallel region the
 * conversion runs on this thread (blocks are far below convert.c's split) */
static inline void lowp_block(void *lowp, mp_dtype dt, float *wide, const float *p, int64_t b, int64_t e)
{
    if (!lowp) return;
    uint16_t *l = (uint16_t *)lowp + b;
    if (wide) {   /* each rounded register widened as it is stored */
        if (dt == MP_F16) mp_cpu_f32_to_f16_widened(l, wide + b, p + b, e - b);
        else mp_cpu_f32_to_bf16_widened(l, wide + b, p + b, e - b);
        return;
    }
    if (dt == MP_BF16) mp_cpu_f32_to_bf16(l, p + b, e - b);
    else mp_cpu_f32_to_f16(l, p + b, e - b);
}

/* for (i in [0, n)) BODY, as blocks of MP_BLOCK split over threads, each block's
 * working copy written right after it */
#define FOR_BLOCKS(...)                                                          \
    _Pragma("omp parallel for if (n >= MP_PAR_MIN) schedule(static)")            \
    for (int64_t b = 0; b < n; b += MP_BLOCK) {                                   \
        int64_t e = n - b < MP_BLOCK ? n : b + MP_BLOCK;                          \
        for (int64_t i = b; i < e; i++) __VA_ARGS__                               \
        lowp_block(lowp, lowp_dt, wide, p, b, e);                                 \
    }

MP_SIMD static void sgd(float *restrict p, const float *restrict g, float *restrict buf, int64_t n, const mp_optim_args *a,
                        int first, void *restrict lowp, mp_dtype lowp_dt, float *restrict wide)
{
    const float lr = a->lr, wd = a->weight_decay, mom = a->momentum, damp = a->one_minus_dampening;
    const int nesterov = a->nesterov;
    FOR_BLOCKS({
        float d = g[i];
        if (wd != 0.0f) d = d + wd * p[i];
        if (mom != 0.0f) {
            float bm = first ? d : buf[i] * mom + damp * d;
            buf[i] = bm;
            d = nesterov ? d + mom * bm : bm;
        }
        p[i] = p[i] - lr * d;
    })
}

MP_SIMD static void adam(int decoupled, float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                 int64_t n, const mp_optim_args *a, float step_size, float bc2, void *restrict lowp, mp_dtype lowp_dt,
                 float *restrict wide)
{
    const float b1 = a->beta1, b2 = a->beta2, c1 = a->one_minus_beta1, c2 = a->one_minus_beta2;
    const float wd = a->weight_decay, decay = a->decay;
    const float eps = a->eps, step = -step_size;
    if (decoupled) {   /* AdamW: p *= 1 - lr*wd, then the Adam update */
        FOR_BLOCKS({
            float gi = g[i], pi = p[i] * decay;
            float mi = m[i] * b1 + c1 * gi, vi = v[i] * b2 + c2 * gi * gi;
            m[i] = mi, v[i] = vi;
            p[i] = pi + step * mi / (sqrtf(vi) / bc2 + eps);
        })
    } else {           /* Adam: weight decay as an L2 term in the gradient */
        FOR_BLOCKS({
            float gi = g[i] + wd * p[i];
            float mi = m[i] * b1 + c1 * gi, vi = v[i] * b2 + c2 * gi * gi;
            m[i] = mi, v[i] = vi;
            p[i] = p[i] + step * mi / (sqrtf(vi) / bc2 + eps);
        })
    }
}

/* RMSprop: square_avg (sq), momentum_buffer (buf, with momentum) and grad_avg
 * (ga, centered), in torch/optim/rmsprop.py's order: avg = sqrt(sq [- ga^2]) + eps */
MP_SIMD static void rmsprop(float *restrict p, const float *restrict g, float *restrict sq, float *restrict buf,
                            float *restrict ga, int64_t n, const mp_optim_args *a, void *restrict lowp,
                            mp_dtype lowp_dt, float *restrict wide)
{
    const float wd = a->weight_decay, mom = a->momentum, al = a->alpha, c = a->one_minus_alpha;
    const float eps = a->eps, nlr = -a->lr;
    const int centered = a->centered;
    FOR_BLOCKS({
        float gi = g[i];
        if (wd != 0.0f) gi = gi + wd * p[i];
        float s = sq[i] * al + c * gi * gi;
        sq[i] = s;
        float avg;
        if (centered) {
            float mm = ga[i] * al + c * gi;
            ga[i] = mm;
            avg = sqrtf(s + -1.0f * mm * mm);
        } else {
            avg = sqrtf(s);
        }
        avg = avg + eps;
        if (mom > 0.0f) {
            float bm = buf[i] * mom + 1.0f * gi / avg;
            buf[i] = bm;
            p[i] = p[i] + nlr * bm;
        } else {
            p[i] = p[i] + nlr * gi / avg;
        }
    })
}

/* Adagrad: sum += g^2, p -= clr * g / (sqrt(sum) + eps) (torch/optim/adagrad.py) */
MP_SIMD static void adagrad(float *restrict p, const float *restrict g, float *restrict sum, int64_t n,
                            const mp_optim_args *a, float clr, void *restrict lowp, mp_dtype lowp_dt,
                            float *restrict wide)
{
    const float wd = a->weight_decay, eps = a->eps, nclr = -clr;
    FOR_BLOCKS({
        float gi = g[i];
        if (wd != 0.0f) gi = gi + wd * p[i];
        float s = sum[i] + 1.0f * gi * gi;
        sum[i] = s;
        p[i] = p[i] + nclr * gi / (sqrtf(s) + eps);
    })
}

void cpu_optim_count(mp_kctx *cx, int64_t *step, const int32_t *skip)
{
    if (!(skip && *skip)) ++*step;
}

void cpu_optim_step(mp_kctx *cx, mp_optim_kind kind, float *p, const float *g, float *s1, float *s2, int64_t n,
                    const mp_optim_args *a, const int64_t *step, const int32_t *skip, void *lowp,
                    mp_dtype lowp_dt, float *wide)
{
    if (skip && *skip) return;
    /* while flushes are counted (telemetry), the copy goes through the cast
     * kernel after the step, which counts them; otherwise the rule writes it */
    void *fused = lowp && !(cx && cx->flush.on) ? lowp : NULL;
    float *fw = fused ? wide : NULL;
    float step_size, bc2;
    switch (kind) {   /* no default: a new kind must say its rule here */
    case MP_SGD: sgd(p, g, s1, n, a, *step == 1, fused, lowp_dt, fw); break;   /* the first step fills the momentum buffer */
    case MP_ADAM:
    case MP_ADAMW:
        mp_adam_bias(a, *step, &step_size, &bc2);
        adam(kind == MP_ADAMW, p, g, s1, s2, n, a, step_size, bc2, fused, lowp_dt, fw);
        break;
    case MP_RMSPROP: rmsprop(p, g, s1, s2, a->s3, n, a, fused, lowp_dt, fw); break;
    case MP_ADAGRAD: adagrad(p, g, s1, n, a, mp_adagrad_clr(a, *step), fused, lowp_dt, fw); break;
    }
    if (lowp && !fused) {
        cpu_cast(cx, lowp, lowp_dt, p, MP_F32, n, 0);
        if (wide) cpu_cast(cx, wide, MP_F32, lowp, lowp_dt, n, 0);
    }
}
