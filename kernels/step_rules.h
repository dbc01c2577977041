/*
 * step_rules.h: the small scalar rules that run once per training step, on the
 * state the kernels keep in the backend's memory: the loss scaler's state
 * operations (the built-in policies' update rules: PyTorch's GradScaler,
 * DeepSpeed's DynamicLossScaler, amax) and Adam's bias corrections.
 *
 * Written once for both backends: the CPU backend calls these functions on host
 * memory, the CUDA backend on one device thread (MP_HD marks them for both), so
 * the CPU and the GPU take the same decisions bit for bit and a step with a
 * built-in policy never has to bring a value back to the host.
 */
#ifndef MP_STEP_RULES_H
#define MP_STEP_RULES_H

#include <math.h>
#include "kernels/backend.h"

#ifdef __CUDACC__
#define MP_HD __host__ __device__ static inline
#else
#define MP_HD static inline
#endif

#define MP_F16_MAX 65504.0

/* add one set of gradient statistics into another (amax: the larger) */
MP_HD void mp_grad_stats_add(mp_grad_stats *to, const mp_grad_stats *s)
{
    to->n += s->n, to->nan += s->nan, to->inf += s->inf;
    to->zeros += s->zeros, to->underflow += s->underflow, to->overflow += s->overflow;
    if (s->amax > to->amax) to->amax = s->amax;
    for (int b = 0; b < MP_HIST_BINS; b++) to->hist[b] += s->hist[b];
}

/* any inf/NaN among the gradients an optimizer unscaled this step */
MP_HD bool mp_slot_bad(const mp_scale_state *s, int k) { return s->slot[k].nan + s->slot[k].inf > 0; }

/* the step found something not finite: the loss, or any optimizer's gradients */
MP_HD bool mp_scale_found_inf(const mp_scale_state *s)
{
    bool any = s->loss_bad != 0;
    for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++) any = any || mp_slot_bad(s, k);
    return any;
}

MP_HD float mp_clamp_scale(const mp_policy *p, double x)
{
    if (p->min > 0 && x < p->min) x = p->min;
    if (p->max > 0 && x > p->max) x = p->max;
    return (float)x;
}

/* A policy at its floor whose gradients still overflow: the scale cannot go
 * lower, and every later step would be skipped in silence. Records at_min: 2
 * with on_min = "error" (the host raises; the update is not made), else 1 the
 * first time (the host warns once). Returns true when the update must stop. */
MP_HD bool mp_floor_reached(mp_scale_state *s, const mp_policy *p, bool found_inf)
{
    if (!found_inf || !(p->min > 0) || (double)s->scale > p->min) return false;
    if (p->error_at_min) { s->at_min = 2; return true; }
    if (!s->warned_at_min) s->at_min = 1, s->warned_at_min = 1;
    return false;
}

/* DeepSpeed's DynamicLossScaler.update_scale with separate growth/backoff
 * factors; at its floor it records at_min (the host warns, or with on_min =
 * "error" raises and the scale stays) */
MP_HD void mp_rule_hysteresis(mp_scale_state *s, const mp_policy *p, bool found_inf)
{
    int64_t it = s->tracker;
    if (found_inf) {
        if (s->hyst_left <= 1) {
            double floor_ = p->min > 0 ? p->min : 0;
            if (floor_ > 0 && s->scale <= floor_) {
                if (p->error_at_min) { s->at_min = 2; return; }
                if (!s->warned_at_min) s->at_min = 1, s->warned_at_min = 1;
            }
            double next = (double)s->scale * p->backoff;
            s->scale = (float)(floor_ > 0 && next < floor_ ? floor_ : next);
        } else {
            s->hyst_left--;
        }
        s->last_overflow = it;
    } else if ((it - s->last_overflow) % p->interval == 0) {
        s->hyst_left = p->hysteresis;
        double next = (double)s->scale * p->growth;
        if (isfinite((float)next)) s->scale = mp_clamp_scale(p, next);
    }
    s->tracker = it + 1;
}

/* the largest true gradient magnitude of the last `history` clean steps sets the
 * scale to the power of two that puts it `margin` octaves below f16's max */
MP_HD void mp_rule_amax(mp_scale_state *s, const mp_policy *p, bool found_inf)
{
    if (found_inf) {
        s->scale = mp_clamp_scale(p, (double)s->scale * p->backoff);
        return;
    }
    float scaled = 0;
    for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++) scaled = s->slot[k].amax > scaled ? s->slot[k].amax : scaled;
    float amax = scaled / s->stats_scale;
    s->amax_hist[s->amax_pos] = amax;
    s->amax_pos = (s->amax_pos + 1) % p->history;
    if (s->amax_count < p->history) s->amax_count++;
    float m = 0;
    for (int i = 0; i < s->amax_count; i++) m = s->amax_hist[i] > m ? s->amax_hist[i] : m;
    if (m > 0) {
        double e = floor(log2(MP_F16_MAX / m) - p->margin);
        if (e > 127) e = 127;
        if (e < -126) e = -126;
        s->scale = mp_clamp_scale(p, ldexp(1.0, (int)e));
    }
}

MP_HD void mp_scale_apply(mp_scale_op op, mp_scale_state *s, const mp_policy *p, int arg, float value)
{
    switch (op) {
    case MP_SCALE_BEGIN:
        s->loss_bad = s->skip = s->at_min = 0;
        s->stats_scale = s->scale;
        for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++) {
            mp_grad_stats *g = &s->slot[k];
            g->n = g->nan = g->inf = g->zeros = g->underflow = g->overflow = 0;
            g->amax = 0;
            for (int b = 0; b < MP_HIST_BINS; b++) g->hist[b] = 0;
        }
        break;
    case MP_SCALE_DECIDE:
        s->skip = s->loss_bad || mp_slot_bad(s, arg);
        s->steps++;
        s->skipped += s->skip;
        if (s->skip) s->last_skip = s->loss_bad ? 3 : s->slot[arg].nan ? 2 : 1;   /* as mp_skip_reason */
        break;
    case MP_SCALE_UPDATE: {
        bool found = mp_scale_found_inf(s);
        if (p->kind != MP_POLICY_HYSTERESIS && mp_floor_reached(s, p, found)) break;
        switch (p->kind) {
        case MP_POLICY_DYNAMIC:   /* torch._amp_update_scale_ */
            if (found) {
                s->scale = mp_clamp_scale(p, (double)s->scale * p->backoff);
                s->tracker = 0;
            } else if (s->tracker + 1 == p->interval) {
                float next = (float)((double)s->scale * p->growth);
                if (isfinite(next)) s->scale = mp_clamp_scale(p, next);
                s->tracker = 0;
            } else {
                s->tracker++;
            }
            break;
        case MP_POLICY_HYSTERESIS: mp_rule_hysteresis(s, p, found); break;
        case MP_POLICY_AMAX: mp_rule_amax(s, p, found); break;
        case MP_POLICY_STATIC:
        case MP_POLICY_NONE: break;       /* the scale stays */
        case MP_POLICY_EXTERNAL: break;   /* the host sets it */
        }
        break;
    }
    case MP_SCALE_SET:   /* arg 1: a Lua policy's result, or the script's: the floor holds for it too */
        if (arg && mp_floor_reached(s, p, mp_scale_found_inf(s))) break;
        s->scale = p->min > 0 && (double)value < p->min ? (float)p->min : value;
        break;
    case MP_SCALE_EXPORT:
        s->found[0] = s->loss_bad ? 1.0f : 0.0f;
        for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++) {
            s->found[1 + 3 * k] = s->slot[k].nan > 0 ? 1.0f : 0.0f;
            s->found[2 + 3 * k] = s->slot[k].inf > 0 ? 1.0f : 0.0f;
            s->found[3 + 3 * k] = s->slot[k].amax;
        }
        break;
    case MP_SCALE_IMPORT:   /* another rank's finding counts as one here; this rank's counts stay */
        s->loss_bad = s->loss_bad || s->found[0] > 0;
        for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++) {
            mp_grad_stats *g = &s->slot[k];
            if (g->nan == 0 && s->found[1 + 3 * k] > 0) g->nan = 1;
            if (g->inf == 0 && s->found[2 + 3 * k] > 0) g->inf = 1;
            if (s->found[3 + 3 * k] > g->amax) g->amax = s->found[3 + 3 * k];
        }
        break;
    }
}

/* Adam's bias corrections at a step count, in double as PyTorch computes them in
 * Python, rounded once: lr / (1 - beta1^step) and sqrt(1 - beta2^step) */
MP_HD void mp_adam_bias(const mp_optim_args *a, int64_t step, float *step_size, float *bc2_sqrt)
{
    double bc1 = 1 - pow(a->beta1_d, (double)step), bc2 = 1 - pow(a->beta2_d, (double)step);
    *step_size = (float)(a->lr_d / bc1);
    *bc2_sqrt = (float)sqrt(bc2);
}

/* Adagrad's lr at a step count, in double as PyTorch computes it in Python,
 * rounded once: lr / (1 + (step - 1) * lr_decay) */
MP_HD float mp_adagrad_clr(const mp_optim_args *a, int64_t step)
{
    return (float)(a->lr_d / (1 + (double)(step - 1) * a->lr_decay_d));
}

#endif
