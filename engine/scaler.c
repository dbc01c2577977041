/*
 * scaler.c: loss scaling: scale, unscale + check, skip, and the built-in
 * policies' rules (PyTorch GradScaler, DeepSpeed DynamicLossScaler, amax).
 * The policy simulator is engine/scaler_sim.c, a trace's snapshots
 * engine/scaler_trace.c.
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "engine/scaler.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"
#include "engine/dist.h"
#include "kernels/step_rules.h"

const char *mp_skip_reason_name(mp_skip_reason r)
{
    static const char *names[] = {"none", "overflow", "nan", "forward"};
    return (unsigned)r < 4 ? names[r] : "?";
}

bool mp_scale_ok(double v) { return v > 0 && v <= 3.4028234663852886e38; }   /* NaN fails both */

mp_policy mp_policy_defaults(mp_policy_kind kind)
{
    mp_policy p = {.kind = kind, .init = 65536, .growth = 2, .backoff = 0.5, .hysteresis = 2, .history = 16, .margin = 1};
    switch (kind) {
    case MP_POLICY_DYNAMIC: p.interval = 2000, p.min = MP_MIN_SCALE; break;
    case MP_POLICY_HYSTERESIS: p.interval = 1000, p.min = 1; break;
    case MP_POLICY_AMAX: p.min = 1, p.max = 16777216; break;
    case MP_POLICY_NONE: p.init = 1; break;
    case MP_POLICY_EXTERNAL: p.min = MP_MIN_SCALE; break;
    case MP_POLICY_STATIC: break;
    }
    return p;
}

int mp_policy_check(const mp_policy *p)
{
    if (!mp_scale_ok(p->init))
        return mp_fail(MP_EINVAL, "init must be a finite f32 number > 0 (got %g)", p->init);
    if (p->kind == MP_POLICY_DYNAMIC || p->kind == MP_POLICY_HYSTERESIS || p->kind == MP_POLICY_AMAX) {
        if (p->kind != MP_POLICY_AMAX && !(p->growth > 1 && isfinite(p->growth)))
            return mp_fail(MP_EINVAL, "growth must be > 1 (got %g)", p->growth);
        if (!(p->backoff > 0 && p->backoff < 1)) return mp_fail(MP_EINVAL, "backoff must be in (0, 1) (got %g)", p->backoff);
        if (p->min < 0 || p->max < 0 || (p->min && p->max && p->min > p->max))
            return mp_fail(MP_EINVAL, "min and max must be >= 0 with min <= max (got %g and %g)", p->min, p->max);
    }
    if ((p->kind == MP_POLICY_DYNAMIC || p->kind == MP_POLICY_HYSTERESIS) && p->interval < 1)
        return mp_fail(MP_EINVAL, "%s must be a positive integer (got %lld)",
                       p->kind == MP_POLICY_DYNAMIC ? "interval" : "window", (long long)p->interval);
    if (p->kind == MP_POLICY_HYSTERESIS && p->hysteresis < 1)
        return mp_fail(MP_EINVAL, "hysteresis must be a positive integer (got %d)", p->hysteresis);
    if (p->kind == MP_POLICY_AMAX && (p->history < 1 || p->history > MP_AMAX_HISTORY_MAX))
        return mp_fail(MP_EINVAL, "history must be in 1..%d (got %d)", MP_AMAX_HISTORY_MAX, p->history);
    if (p->kind == MP_POLICY_AMAX && !(p->margin >= 0 && isfinite(p->margin)))
        return mp_fail(MP_EINVAL, "margin must be >= 0 (got %g)", p->margin);
    return 0;
}

void mp_policy_state_reset(mp_scale_state *h, const mp_policy *p)
{
    h->tracker = 0;
    h->last_overflow = -1;
    h->hyst_left = p->hysteresis;
    h->warned_at_min = 0;
    h->at_min = 0;
    h->amax_count = h->amax_pos = 0;
}

mp_scaler *mp_scaler_new(const mp_policy *p)
{
    if (mp_policy_check(p)) return NULL;
    mp_scaler *s = calloc(1, sizeof *s);
    if (!s) return mp_fail(MP_EOOM, "out of memory"), NULL;
    s->policy = *p;
    s->h.scale = s->h.stats_scale = p->kind == MP_POLICY_NONE ? 1.0f : (float)p->init;
    mp_policy_state_reset(&s->h, p);
    s->h_fresh = true;
    s->sync = true;
    s->first_bad = -1;
    return s;
}

void mp_scaler_free(mp_scaler *s)
{
    if (!s) return;
    if (s->snap_free) s->snap_free(s);
    mp_release(s->state);
    mp_release(s->tel);
    mp_release(s->seg);
    free(s->per_param);
    free(s->seg_host);
    free(s);
}

static mp_scale_state *dev_state(mp_scaler *s) { return mp_data(s->state); }

/* the policy's floor was reached with gradients still overflowing: said once */
static void warn_at_min(mp_scaler *s, bool warned)
{
    if (!warned || s->printed_min_warning) return;
    fprintf(stderr, "mpengine: warning: loss scale at its minimum %g and gradients still overflow: "
                    "such steps are skipped (the policy's on_min = \"error\" raises instead)\n", s->policy.min);
    s->printed_min_warning = true;
}

/* the host copy from the backend's (a wait for the device on a GPU); on a
 * device error the host copy stays as it was */
static int pull(mp_scaler *s)
{
    if (!s->state || s->h_fresh) return 0;
    if (mp_host_read(s->state->dev, &s->pulled, dev_state(s), sizeof s->pulled)) return -1;
    s->h = s->pulled;
    s->h_fresh = true;
    warn_at_min(s, s->h.warned_at_min);
    return 0;
}

static void push(mp_scaler *s)
{
    if (s->state) MP_K(s->state, from_host, dev_state(s), &s->h, sizeof s->h);
    s->h_fresh = true;
}

/* the state on device dev: allocated at first use, moved when the step's tensors move */
static int place(mp_scaler *s, mp_device dev)
{
    if (s->state && s->state->dev == dev) return 0;
    if (pull(s)) return -1;
    if (s->snap_free) s->snap_free(s);   /* a trace's snapshots belong to the old device's memory (their lines are lost) */
    int64_t bytes = (int64_t)sizeof(mp_scale_state);
    mp_tensor *t = mp_empty(MP_U8, dev, 1, &bytes);
    if (!t) return -1;
    mp_release(s->state);
    s->state = t;
    push(s);
    return 0;
}

static void rule(mp_scaler *s, mp_scale_op op, int arg, float value)
{
    MP_K(s->state, scale_rule, op, dev_state(s), &s->policy, arg, value);
    s->h_fresh = false;
}

const mp_scale_state *mp_scaler_read(mp_scaler *s)
{
    return pull(s) ? NULL : &s->h;
}

int mp_scaler_write(mp_scaler *s)
{
    s->has_pending = false;
    push(s);
    return 0;
}

mp_skip_reason mp_scaler_reason(const mp_scale_state *h)
{
    if (h->loss_bad) return MP_SKIP_FORWARD;
    bool inf = false;
    for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++) {
        if (h->slot[k].nan) return MP_SKIP_NAN;
        inf = inf || h->slot[k].inf;
    }
    return inf ? MP_SKIP_OVERFLOW : MP_SKIP_NONE;
}

void mp_scaler_total(const mp_scale_state *h, mp_grad_stats *t)
{
    memset(t, 0, sizeof *t);
    for (int k = 0; k < MP_SCALER_MAX_OPTIMS; k++) mp_grad_stats_add(t, &h->slot[k]);
}

const mp_grad_stats *mp_scaler_per_param(mp_scaler *s, int *n)
{
    *n = 0;
    if (!s->tel || !s->per_param) return NULL;
    if (mp_host_read(s->tel->dev, s->per_param, mp_data(s->tel), sizeof *s->per_param * (size_t)s->nstats))
        return *n = -1, NULL;
    *n = s->nstats;
    return s->per_param;
}

int mp_scaler_set_policy(mp_scaler *s, const mp_policy *p, const double *scale)
{
    mp_policy q = *p;
    if (scale) q.init = *scale;
    if (mp_policy_check(&q)) return -1;
    if (scale && q.kind != MP_POLICY_NONE && q.min > 0 && *scale < q.min)
        return mp_fail(MP_EINVAL, "scale %g is below the policy's min %g", *scale, q.min);
    if (pull(s)) return -1;
    s->policy = q;
    mp_policy_state_reset(&s->h, &q);
    s->printed_min_warning = false;   /* a new floor: its warning may come once more */
    /* policy.none() runs at 1 whatever was asked; a kept scale stays as it is,
     * with any scale an earlier swap left for the next step */
    if (q.kind == MP_POLICY_NONE || scale) {
        float v = q.kind == MP_POLICY_NONE ? 1.0f : (float)*scale;
        if (s->in_step) s->has_pending = true, s->pending = v;   /* this step keeps the scale it ran at */
        else s->h.scale = v, s->has_pending = false;
    }
    push(s);
    return 0;
}

static int begin_step(mp_scaler *s, mp_device dev)
{
    if (place(s, dev)) return -1;
    if (s->in_step) return 0;
    if (s->has_pending) rule(s, MP_SCALE_SET, 0, s->pending), s->has_pending = false;
    rule(s, MP_SCALE_BEGIN, 0, 0);
    s->shared = false;
    s->unscaled = false;
    s->nopt = 0;
    s->first_bad = -1;
    s->in_step = true;
    return 0;
}

/* g * scale, the scale read by the kernel from the state st (on the device:
 * no wait for it) */
static mp_tensor *times_scale(mp_tensor *g, mp_tensor *st)
{
    mp_tensor *r = mp_empty(g->dtype, g->dev, g->ndim, g->shape);
    if (r) MP_K(r, scale_loss, g->dtype, mp_data(r), mp_data(g), g->numel, mp_data(st), 0);
    return r;
}

/* times_scale as an op on g, for a backward that builds a graph (create_graph:
 * the gradient penalty differentiates scale(loss)'s gradient): linear, its
 * own backward. extra: the state. */
static mp_tensor *scale_grad_fwd(mp_op_ctx *c)
{
    mp_tensor *st = (mp_tensor *)c->extra, *o = times_scale(c->in[0], st);
    if (o && mp_keep(c, 0, st)) mp_release(o), o = NULL;
    return o;
}

static int scale_backward(mp_node *n, mp_tensor *g, mp_tensor **gin);
static const mp_op scale_grad_op = {.name = "scale_backward", .nin = 1, .forward = scale_grad_fwd,
                                    .backward = scale_backward, .double_backward = true};
MP_OP_REGISTER(scale_grad_op);

/* out = loss * scale: the gradient is g * scale, recorded when grad mode is on */
static int scale_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_op_ctx c = {.extra = n->saved[0]};
    gin[0] = mp_grad_enabled() ? mp_apply(&scale_grad_op, &c, 1, &g) : times_scale(g, n->saved[0]);
    return gin[0] ? 0 : -1;
}

static mp_tensor *scale_fwd(mp_op_ctx *c)
{
    mp_scaler *s = (mp_scaler *)c->extra;
    mp_tensor *loss = c->in[0], *o = mp_empty(loss->dtype, loss->dev, loss->ndim, loss->shape);
    if (!o) return NULL;
    MP_K(o, scale_loss, loss->dtype, mp_data(o), mp_data(loss), loss->numel, dev_state(s), 1);
    s->h_fresh = false;
    s->shared = false;
    if (mp_keep(c, 0, s->state)) mp_release(o), o = NULL;
    return o;
}

static const mp_op scale_op = {.name = "scale", .nin = 1, .forward = scale_fwd, .backward = scale_backward,
                               .double_backward = true};
MP_OP_REGISTER(scale_op);

mp_tensor *mp_scaler_scale(mp_scaler *s, mp_tensor *loss)
{
    if (!mp_is_float(loss->dtype))
        return mp_fail(MP_EINVAL, "the loss must be a float tensor (got %s)", mp_dtype_name(loss->dtype)), NULL;
    /* several scale() calls in one step (gradient accumulation) share its findings */
    if (begin_step(s, loss->dev)) return NULL;
    const mp_backend *be = mp_be(loss);
    /* a loss that is already inf/NaN is a forward problem no scale can cure */
    if (s->policy.kind == MP_POLICY_NONE) {
        be->scale_loss(be->ctx, loss->dtype, NULL, mp_data(loss), loss->numel, dev_state(s), 1);
        s->h_fresh = false;
        s->shared = false;
        return mp_retain(loss);
    }
    mp_op_ctx c = {.extra = s};
    return mp_apply(&scale_op, &c, 1, &loss);
}

/* first parameter whose (unscaled) gradient holds inf or NaN */
static int first_nonfinite(mp_optim *o)
{
    /* only after a non-finite value was found: a device arena is copied to the host */
    mp_tensor *h = mp_to_raw(o->grads, MP_F32, MP_CPU);
    if (!h) return -1;
    const float *g = mp_data(h);
    int found = -1;
    for (int i = 0; i < o->n && found < 0; i++) {
        int64_t a = o->offsets[i], b = a + o->params[i]->numel;
        for (int64_t j = a; j < b; j++)
            if (!isfinite(g[j])) { found = i; break; }
    }
    mp_release(h);
    return found;
}

static int optim_index(const mp_scaler *s, const mp_optim *o)
{
    for (int i = 0; i < s->nopt; i++)
        if (s->opts[i] == o) return i;
    return -1;
}

/* room for per-parameter telemetry in the backend's memory, zeroed, and the
 * parameters' offsets in the arena there (seg: n + 1 of them), written each
 * step (a copy to the device without a wait: no need to know whether the
 * optimizer is the one they were written for) */
static int telemetry_room(mp_scaler *s, mp_optim *o)
{
    int64_t bytes = (int64_t)(sizeof(mp_grad_stats) * (size_t)o->n);
    int64_t seg_bytes = (int64_t)(sizeof(int64_t) * ((size_t)o->n + 1));
    if (!s->tel || s->nstats != o->n || s->tel->dev != o->grads->dev) {
        mp_grad_stats *p = realloc(s->per_param, sizeof *p * (size_t)o->n);
        if (!p) return mp_fail(MP_EOOM, "out of memory for telemetry");
        s->per_param = p;
        int64_t *h = realloc(s->seg_host, (size_t)seg_bytes);
        if (!h) return mp_fail(MP_EOOM, "out of memory for telemetry");
        s->seg_host = h;
        mp_tensor *t = mp_empty(MP_U8, o->grads->dev, 1, &bytes);
        mp_tensor *g = t ? mp_empty(MP_U8, o->grads->dev, 1, &seg_bytes) : NULL;
        if (!g) return mp_release(t), -1;
        mp_release(s->tel);
        mp_release(s->seg);
        s->tel = t;
        s->seg = g;
        s->nstats = o->n;
    }
    for (int i = 0; i < o->n; i++) s->seg_host[i] = o->offsets[i];
    s->seg_host[o->n] = o->numel;
    const mp_backend *be = mp_be(s->tel);
    be->zero(be->ctx, mp_data(s->tel), (size_t)bytes);
    be->from_host(be->ctx, mp_data(s->seg), s->seg_host, (size_t)seg_bytes);
    return 0;
}

int mp_scaler_unscale(mp_scaler *s, mp_optim *o)
{
    if (optim_index(s, o) >= 0)
        return mp_fail(MP_EINVAL, "unscale was already called for this optimizer in this step "
                                  "(call update() to end the step first)");
    if (s->nopt == MP_SCALER_MAX_OPTIMS)
        return mp_fail(MP_EINVAL, "one step drives at most %d optimizers", MP_SCALER_MAX_OPTIMS);
    if (begin_step(s, o->grads->dev)) return -1;
    /* .grad tensors a script replaced count too: bring them into the arena first */
    if (mp_optim_sync_grads(o)) return -1;
    const mp_backend *be = mp_be(o->grads);
    int slot = s->nopt;
    float *g = mp_data(o->grads);
    if (s->telemetry) {   /* one pass over the arena, with statistics per parameter */
        if (telemetry_room(s, o)) return -1;
        be->unscale(be->ctx, g, o->numel, dev_state(s), slot, mp_data(s->tel), mp_data(s->seg), o->n);
    } else {
        be->unscale(be->ctx, g, o->numel, dev_state(s), slot, NULL, NULL, 0);
    }
    s->h_fresh = false;
    s->opts[s->nopt++] = o;
    s->unscaled = true;
    s->shared = false;
    return 0;
}

int mp_scaler_share(mp_scaler *s)
{
    if (!s->state || s->shared || !mp_dist_spans(s->state->dev)) return 0;
    rule(s, MP_SCALE_EXPORT, 0, 0);
    mp_scale_state *d = dev_state(s);   /* device memory: only its address is taken */
    if (mp_dist_reduce_raw(s->state->dev, d->found, 1 + 3 * MP_SCALER_MAX_OPTIMS, MP_F32, MP_COLL_MAX)) return -1;
    rule(s, MP_SCALE_IMPORT, 0, 0);
    s->shared = true;
    return 0;
}

int mp_scaler_step(mp_scaler *s, mp_optim *o, int *applied)
{
    int k = optim_index(s, o);
    if (k < 0) {
        if (mp_scaler_unscale(s, o)) return -1;
        k = s->nopt - 1;
    }
    if (mp_scaler_share(s)) return -1;   /* data parallel: every rank decides alike */
    rule(s, MP_SCALE_DECIDE, k, 0);
    const int32_t *skip = &dev_state(s)->skip;
    if (mp_optim_step_if(o, skip)) return -1;
    *applied = -1;
    if (!s->sync) return o->values->dev != MP_CPU ? mp_device_error(o->values->dev) : 0;   /* mp_checked */
    if (pull(s)) return -1;
    *applied = !s->h.skip;
    if (s->h.skip && s->first_bad < 0 && mp_slot_bad(&s->h, k)) s->first_bad = first_nonfinite(o);
    return 0;
}

static void end_step(mp_scaler *s)
{
    s->unscaled = false;
    s->in_step = false;
    s->nopt = 0;
}

/* After an update: a policy at its floor that still overflows fails at once
 * with on_min = "error" (one read, a wait on a GPU). The warning of on_min =
 * "warn" comes at once on the CPU, whose state is host memory, and on a GPU at
 * the next read (every step with sync on: the step's outcome is read). */
static int floor_outcome(mp_scaler *s)
{
    if (s->state->dev == MP_CPU) warn_at_min(s, dev_state(s)->warned_at_min);
    if (s->policy.error_at_min) {
        if (pull(s)) return end_step(s), -1;
        if (s->h.at_min == 2) {
            end_step(s);
            return mp_fail(MP_EINVAL, "loss scale already at its minimum %g and the gradients still "
                                      "overflow (on_min = \"error\")", s->policy.min);
        }
    }
    end_step(s);
    return 0;
}

int mp_scaler_update(mp_scaler *s)
{
    if (!s->state && place(s, MP_CPU)) return -1;   /* an update before any step */
    if (mp_scaler_share(s)) return -1;
    rule(s, MP_SCALE_UPDATE, 0, 0);
    return floor_outcome(s);
}

int mp_scaler_set_scale(mp_scaler *s, double scale)
{
    if (!mp_scale_ok(scale))
        return mp_fail(MP_EINVAL, "the new scale must be a finite f32 number > 0 (got %g)", scale);
    if (!s->state) {
        s->h.scale = (float)scale;
        end_step(s);
        return 0;
    }
    rule(s, MP_SCALE_SET, 1, (float)scale);
    return floor_outcome(s);
}

void mp_scaler_set_sync(mp_scaler *s, bool on) { s->sync = on; }
void mp_scaler_set_telemetry(mp_scaler *s, bool on) { s->telemetry = on; }

/* a whole number in [lo, 9e15] (range first: converting inf or NaN is undefined) */
static bool whole(double v, double lo) { return v >= lo && v <= 9.0e15 && v == (double)(int64_t)v; }

int mp_scaler_restore(mp_scaler *s, const mp_scaler_saved *v)
{
    if (!mp_scale_ok(v->scale)) return mp_fail(MP_EINVAL, "scale must be a finite number > 0 (got %g)", v->scale);
    static const char *names[6] = {"tracker", "last_overflow", "hysteresis_left", "steps", "skipped", "amax_pos"};
    const double f[6] = {v->tracker, v->last_overflow, v->hysteresis_left, v->steps, v->skipped, v->amax_pos};
    for (int i = 0; i < 6; i++)
        if (!whole(f[i], -1)) return mp_fail(MP_EINVAL, "%s must be a whole number (got %f)", names[i], f[i]);
    int hlen = s->policy.history > 0 ? s->policy.history : 1;
    if (v->amax_count < 0 || v->amax_count > hlen || v->amax_pos < 0 || v->amax_pos >= hlen ||
        v->hysteresis_left < 0 || v->hysteresis_left > 1e9)
        return mp_fail(MP_EINVAL, "amax history, its position or the hysteresis counter out of range");
    for (int i = 0; i < v->amax_count; i++)
        if (!(v->amax_hist[i] >= 0) || !isfinite((float)v->amax_hist[i]))
            return mp_fail(MP_EINVAL, "amax_history[%d] must be a finite number >= 0", i + 1);
    mp_scale_state *h = (mp_scale_state *)mp_scaler_read(s);
    if (!h) return -1;
    h->scale = (float)v->scale;
    h->tracker = (int64_t)v->tracker;
    h->last_overflow = (int64_t)v->last_overflow;
    h->hyst_left = (int)v->hysteresis_left;
    h->steps = (int64_t)v->steps;
    h->skipped = (int64_t)v->skipped;
    h->warned_at_min = v->warned_at_min;
    s->printed_min_warning = v->warned_at_min;
    h->amax_count = v->amax_count;
    for (int i = 0; i < v->amax_count; i++) h->amax_hist[i] = (float)v->amax_hist[i];
    h->amax_pos = (int)v->amax_pos;
    return mp_scaler_write(s);
}
