/*
 * scaler.h: the loss scaler (docs/DESIGN.md section 6).
 *
 * It holds the scale (an f32, as PyTorch's GradScaler keeps it), the policy
 * with its counters, and what the current step found. unscale is one pass over
 * an optimizer's gradient arena (unscale, inf/NaN check, amax, optional
 * telemetry per parameter); step applies the optimizer only when every
 * gradient is finite, so a skipped step leaves master weights and optimizer
 * state untouched; update moves the scale by the built-in policy's rule. A
 * policy written in Lua is MP_POLICY_EXTERNAL: the binding calls it and hands
 * the engine the new scale with mp_scaler_set_scale.
 *
 * The scale and everything a step finds live in the backend's memory
 * (mp_scale_state): on a GPU, scale(), unscale, the skip and update with a
 * built-in policy never wait for the device. The host copy is refreshed only
 * when a script asks (stats, get_scale, a Lua policy, step() with sync).
 *
 * The policy simulator (mp.amp.replay) is engine/scaler_sim.h; a trace's
 * snapshots without a wait are engine/scaler_trace.h.
 */
#ifndef MP_SCALER_H
#define MP_SCALER_H

#include "engine/optim.h"

/* mp_policy, mp_policy_kind and mp_scale_state are in kernels/backend.h: the
 * kernels read and write the state in the backend's memory */
typedef enum { MP_SKIP_NONE, MP_SKIP_OVERFLOW, MP_SKIP_NAN, MP_SKIP_FORWARD } mp_skip_reason;

typedef struct mp_scaler {
    mp_policy policy;
    mp_scale_state h;                /* the host's copy of the state */
    mp_tensor *state;                /* the state in the backend's memory (u8 bytes); NULL until first used */
    bool h_fresh;                    /* h equals the backend's copy */
    bool sync;                       /* step() reads its decision back (one wait for the device) */
    bool has_pending;
    float pending;                   /* set_policy: the next step's scale */
    bool printed_min_warning;

    /* the current step (host bookkeeping: no data) */
    bool in_step;                    /* between the first scale() and update() */
    bool unscaled;
    int nopt;                        /* optimizers unscaled this step, each in its own slot */
    const struct mp_optim *opts[MP_SCALER_MAX_OPTIMS];
    int first_bad;                   /* sync: index of the first parameter with a non-finite gradient, or -1 */
    bool shared;                     /* data parallel: this step's findings were reduced over the ranks */
    bool telemetry;
    int nstats;
    mp_tensor *tel;                  /* telemetry: one mp_grad_stats per parameter, backend memory */
    mp_tensor *seg;                  /* the parameters' offsets in the arena (n + 1 int64), backend memory */
    int64_t *seg_host;               /* their host copy */
    mp_grad_stats *per_param;        /* their host copy, filled by mp_scaler_per_param */
    struct mp_trace_snap *snap;      /* a trace's snapshots on an asynchronous backend (two, in turn) */
    int snap_next;
    /* lets the snapshots go, set with them by engine/scaler_trace.c: the scaler
     * calls it when it is freed and when its state moves to another device,
     * without knowing what a snapshot holds */
    void (*snap_free)(struct mp_scaler *s);
    mp_scale_state pulled;           /* the backend's state as read, before it becomes h (a failed read zeroes it, not h) */
} mp_scaler;

/* The built-in policies' defaults, PyTorch's GradScaler's (dynamic) and
 * DeepSpeed's (hysteresis) where they have one; the floor of a policy whose
 * scale moves is MP_MIN_SCALE for dynamic and 1 for the others. The binding
 * starts from these and changes only what a script gives; it keeps no default
 * of its own. */
#define MP_MIN_SCALE 1.1754943508222875e-38   /* 2^-126, the smallest normal f32 */
mp_policy mp_policy_defaults(mp_policy_kind kind);
/* every value of a policy in range (the one check: constructors, set_policy, GradScaler) */
int mp_policy_check(const mp_policy *p);
/* a loss scale the engine accepts: finite as an f32, and > 0 */
bool mp_scale_ok(double v);
/* a policy's counters at its start: growth tracker 0, its full hysteresis, an
 * empty amax history, the floor warning re-armed (a new scaler, set_policy, a
 * simulator) */
void mp_policy_state_reset(mp_scale_state *h, const mp_policy *p);
mp_scaler *mp_scaler_new(const mp_policy *p);
void mp_scaler_free(mp_scaler *s);
/* Replace the policy. scale: the scale it starts from, or NULL to keep the
 * current one (and a scale an earlier swap left for the next step);
 * policy.none() always runs at 1. Outside a step the scale applies at once,
 * inside one (between scale() and update()) from the next step. The new policy
 * starts fresh: growth tracker 0, its full hysteresis, an empty amax history,
 * its floor warning re-armed; steps and skipped counts go on. An explicit
 * scale below the policy's min is refused. */
int mp_scaler_set_policy(mp_scaler *s, const mp_policy *p, const double *scale);
/* loss * scale as an autograd op; notes (on the device) whether the loss itself was finite */
mp_tensor *mp_scaler_scale(mp_scaler *s, mp_tensor *loss);
/* unscale the optimizer's gradients once per step; -1 if already done */
int mp_scaler_unscale(mp_scaler *s, mp_optim *o);
/* unscale if not yet done; then the optimizer step, which the kernels skip when
 * something was not finite. *applied: 1 applied, 0 skipped, or -1 unknown (no
 * sync: the decision stayed on the device) */
int mp_scaler_step(mp_scaler *s, mp_optim *o, int *applied);
/* data parallel (engine/dist.h): what this step found so far (inf/NaN, a bad
 * loss, the amax) made the same on every rank, with max over the ranks, on
 * the device; a no-op in a world of one. step and update call it before they
 * decide; a Lua policy's update calls it before it reads the findings. Every
 * rank must call it at the same point (it is a collective). */
int mp_scaler_share(mp_scaler *s);
/* the built-in policy's rule; ends the step */
int mp_scaler_update(mp_scaler *s);
/* an external policy's decision (finite and > 0), or a forced scale; ends the step */
int mp_scaler_set_scale(mp_scaler *s, double scale);

/* the state as it is now (waits for the device when it is not on the host
 * yet); NULL with the device's error when that read fails */
const mp_scale_state *mp_scaler_read(mp_scaler *s);
/* write back a state changed through mp_scaler_read's copy */
int mp_scaler_write(mp_scaler *s);
/* what a checkpoint holds of the state (GradScaler:state_dict), as numbers to be
 * checked: mp_scaler_restore refuses, naming the field, a scale that is not
 * mp_scale_ok, a counter that is not a whole number in range, a history entry
 * that is not finite and >= 0, and leaves the state as it was */
typedef struct {
    double scale, tracker, last_overflow, hysteresis_left, steps, skipped, amax_pos;
    bool warned_at_min;
    int amax_count;
    double amax_hist[MP_AMAX_HISTORY_MAX];
} mp_scaler_saved;
int mp_scaler_restore(mp_scaler *s, const mp_scaler_saved *v);
/* step() reads its decision back (one wait for the device), or leaves it there */
void mp_scaler_set_sync(mp_scaler *s, bool on);
/* per-parameter statistics at each unscale */
void mp_scaler_set_telemetry(mp_scaler *s, bool on);
/* what the state says about the step */
mp_skip_reason mp_scaler_reason(const mp_scale_state *h);
void mp_scaler_total(const mp_scale_state *h, mp_grad_stats *total);
/* telemetry: the per-parameter statistics of the last unscale (NULL when none;
 * NULL and *n = -1 when reading them failed) */
const mp_grad_stats *mp_scaler_per_param(mp_scaler *s, int *n);
const char *mp_skip_reason_name(mp_skip_reason r);

#endif
