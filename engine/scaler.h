/*
 * scaler.h: the loss scaler (DESIGN.md section 6).
 *
 * It holds the scale (an f32, as PyTorch's GradScaler keeps it), the policy
 * with its counters, and what the current step found. unscale is one pass over
 * an optimizer's gradient arena (unscale, inf/NaN check, amax, optional
 * telemetry per parameter); step applies the optimizer only when every
 * gradient is finite, so a skipped step leaves master weights and optimizer
 * state untouched; update moves the scale by the built-in policy's rule. A
 * policy written in Lua is MP_POLICY_EXTERNAL: the binding calls it and hands
 * the engine the new scale with mp_scaler_set_scale.
 */
#ifndef MP_SCALER_H
#define MP_SCALER_H

#include "engine/optim.h"

typedef enum {
    MP_POLICY_STATIC, MP_POLICY_NONE, MP_POLICY_DYNAMIC, MP_POLICY_HYSTERESIS, MP_POLICY_AMAX,
    MP_POLICY_EXTERNAL
} mp_policy_kind;

typedef struct {
    mp_policy_kind kind;
    double init, growth, backoff, min, max;   /* min/max: 0 means unbounded */
    int64_t interval;                         /* dynamic: growth interval; hysteresis: window */
    int hysteresis;                           /* hysteresis: overflows tolerated before a backoff */
    bool error_at_min;                        /* hysteresis: on_min = "error" */
    int history;                              /* amax: steps of history */
    double margin;                            /* amax: powers of two below f16's max */
} mp_policy;

typedef enum { MP_SKIP_NONE, MP_SKIP_OVERFLOW, MP_SKIP_NAN, MP_SKIP_FORWARD } mp_skip_reason;

#define MP_AMAX_HISTORY_MAX 1024
#define MP_SCALER_MAX_OPTIMS 16

typedef struct mp_scaler {
    float scale;
    mp_policy policy;
    int64_t tracker;                 /* dynamic: clean steps in a row; hysteresis: iteration */
    int64_t last_overflow;           /* hysteresis: iteration of the last overflow */
    int hyst_left;                   /* hysteresis: overflows left before a backoff */
    bool warned_at_min;
    float amax_hist[MP_AMAX_HISTORY_MAX];
    int amax_count, amax_pos;
    bool has_pending;
    float pending;                   /* set_policy: the next step's scale */

    /* the current step */
    bool in_step;                    /* between the first scale() and update() */
    bool unscaled, loss_nonfinite, found_inf;
    float stats_scale;               /* the scale the statistics were measured at */
    mp_skip_reason reason;
    int first_bad;                   /* index of the first parameter with a non-finite gradient, or -1 */
    /* the optimizers unscaled this step, and whether each found inf/NaN (a step may
     * drive several optimizers, each skipped only for its own gradients) */
    int nopt;
    const struct mp_optim *opts[MP_SCALER_MAX_OPTIMS];
    bool opt_bad[MP_SCALER_MAX_OPTIMS];
    mp_grad_stats total;             /* over all gradients, scaled values */
    bool telemetry;
    int nstats;
    mp_grad_stats *per_param;        /* telemetry: one per parameter of the last unscaled optimizer */

    int64_t steps, skipped;
} mp_scaler;

int mp_policy_check(const mp_policy *p);
mp_scaler *mp_scaler_new(const mp_policy *p);
void mp_scaler_free(mp_scaler *s);
/* replace the policy; its initial scale applies from the next step */
int mp_scaler_set_policy(mp_scaler *s, const mp_policy *p, double init);
/* loss * scale as an autograd op; notes whether the loss itself was finite */
mp_tensor *mp_scaler_scale(mp_scaler *s, mp_tensor *loss);
/* unscale the optimizer's gradients once per step; -1 if already done */
int mp_scaler_unscale(mp_scaler *s, mp_optim *o);
/* unscale if not yet done; then the optimizer step unless something was not
 * finite. *applied says which. */
int mp_scaler_step(mp_scaler *s, mp_optim *o, bool *applied);
/* the built-in policy's rule; ends the step */
int mp_scaler_update(mp_scaler *s);
/* an external policy's decision (finite and > 0), or a forced scale; ends the step */
int mp_scaler_set_scale(mp_scaler *s, double scale);
const char *mp_skip_reason_name(mp_skip_reason r);

#endif
