/*
 * scaler.c: loss scaling: scale, unscale + check, skip, and the built-in
 * policies' rules (PyTorch GradScaler, DeepSpeed DynamicLossScaler, amax).
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "engine/scaler.h"
#include "engine/ops.h"
#include "engine/error.h"

#define F16_MAX 65504.0

const char *mp_skip_reason_name(mp_skip_reason r)
{
    static const char *names[] = {"none", "overflow", "nan", "forward"};
    return (unsigned)r < 4 ? names[r] : "?";
}

static bool positive(double x) { return x > 0 && isfinite(x); }

int mp_policy_check(const mp_policy *p)
{
    if (!positive(p->init) || p->init > 3.4028234663852886e38)
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

static void reset_policy_state(mp_scaler *s)
{
    s->tracker = 0;
    s->last_overflow = -1;
    s->hyst_left = s->policy.hysteresis;
    s->warned_at_min = false;
    s->amax_count = s->amax_pos = 0;
}

mp_scaler *mp_scaler_new(const mp_policy *p)
{
    if (mp_policy_check(p)) return NULL;
    mp_scaler *s = calloc(1, sizeof *s);
    if (!s) return mp_fail(MP_EOOM, "out of memory"), NULL;
    s->policy = *p;
    s->scale = p->kind == MP_POLICY_NONE ? 1.0f : (float)p->init;
    s->first_bad = -1;
    reset_policy_state(s);
    return s;
}

void mp_scaler_free(mp_scaler *s)
{
    if (!s) return;
    free(s->per_param);
    free(s);
}

int mp_scaler_set_policy(mp_scaler *s, const mp_policy *p, double init)
{
    mp_policy q = *p;
    q.init = init;
    if (mp_policy_check(&q)) return -1;
    s->policy = q;
    reset_policy_state(s);
    s->has_pending = true;
    s->pending = p->kind == MP_POLICY_NONE ? 1.0f : (float)init;
    return 0;
}

static void begin_step(mp_scaler *s)
{
    if (s->has_pending) s->scale = s->pending, s->has_pending = false;
    s->unscaled = s->loss_nonfinite = s->found_inf = false;
    s->nopt = 0;
    s->reason = MP_SKIP_NONE;
    s->first_bad = -1;
    memset(&s->total, 0, sizeof s->total);
}

mp_tensor *mp_scaler_scale(mp_scaler *s, mp_tensor *loss)
{
    /* several scale() calls in one step (gradient accumulation) share its findings */
    if (!s->in_step) begin_step(s);
    s->in_step = true;
    /* a loss that is already inf/NaN is a forward problem no scale can cure */
    double v;
    for (int64_t i = 0; i < loss->numel && !s->loss_nonfinite; i++) {
        if (mp_read_f64(loss, i, 1, &v)) return NULL;
        if (!isfinite(v)) s->loss_nonfinite = true;
    }
    if (s->policy.kind == MP_POLICY_NONE) return mp_retain(loss);
    return mp_binary_scalar(MP_MUL, loss, s->scale, 0);
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

int mp_scaler_unscale(mp_scaler *s, mp_optim *o)
{
    if (optim_index(s, o) >= 0)
        return mp_fail(MP_EINVAL, "unscale was already called for this optimizer in this step "
                                  "(call update() to end the step first)");
    if (s->nopt == MP_SCALER_MAX_OPTIMS)
        return mp_fail(MP_EINVAL, "one step drives at most %d optimizers", MP_SCALER_MAX_OPTIMS);
    /* .grad tensors a script replaced count too: bring them into the arena first */
    if (mp_optim_sync_grads(o)) return -1;
    const mp_backend *be = mp_be(o->grads);
    float inv = s->policy.kind == MP_POLICY_NONE ? 1.0f : 1.0f / s->scale;
    if (s->nopt == 0) memset(&s->total, 0, sizeof s->total);   /* totals cover every optimizer of the step */
    mp_grad_stats mine = {0};
    s->stats_scale = s->policy.kind == MP_POLICY_NONE ? 1.0f : s->scale;
    if (s->telemetry) {
        if (s->nstats != o->n) {
            mp_grad_stats *p = realloc(s->per_param, sizeof *p * (size_t)o->n);
            if (!p) return mp_fail(MP_EOOM, "out of memory for telemetry");
            s->per_param = p;
            s->nstats = o->n;
        }
        for (int i = 0; i < o->n; i++) {
            mp_grad_stats *st = &s->per_param[i];
            memset(st, 0, sizeof *st);
            be->unscale((float *)mp_data(o->grads) + o->offsets[i], o->params[i]->numel, inv, 1, st);
            s->total.n += st->n, s->total.nan += st->nan, s->total.inf += st->inf;
            s->total.zeros += st->zeros, s->total.underflow += st->underflow, s->total.overflow += st->overflow;
            if (st->amax > s->total.amax) s->total.amax = st->amax;
            for (int b = 0; b < MP_HIST_BINS; b++) s->total.hist[b] += st->hist[b];
            mine.nan += st->nan, mine.inf += st->inf;   /* this optimizer's own findings */
        }
    } else {
        be->unscale(mp_data(o->grads), o->numel, inv, 0, &mine);
        s->total.n += mine.n, s->total.nan += mine.nan, s->total.inf += mine.inf;
        if (mine.amax > s->total.amax) s->total.amax = mine.amax;
    }
    bool bad = mine.nan + mine.inf > 0;
    s->opts[s->nopt] = o;
    s->opt_bad[s->nopt++] = bad;
    bool any = s->total.nan + s->total.inf > 0;
    s->found_inf = any || s->loss_nonfinite;
    s->reason = s->loss_nonfinite ? MP_SKIP_FORWARD : s->total.nan ? MP_SKIP_NAN : any ? MP_SKIP_OVERFLOW : MP_SKIP_NONE;
    if (bad && s->first_bad < 0) s->first_bad = first_nonfinite(o);
    s->unscaled = true;
    return 0;
}

int mp_scaler_step(mp_scaler *s, mp_optim *o, bool *applied)
{
    int k = optim_index(s, o);
    if (k < 0) {
        if (mp_scaler_unscale(s, o)) return -1;
        k = s->nopt - 1;
    }
    s->steps++;
    bool skip = s->loss_nonfinite || s->opt_bad[k];
    *applied = !skip;
    if (skip) {
        s->skipped++;
        return 0;
    }
    return mp_optim_step(o);
}

static float clamp_scale(const mp_policy *p, double x)
{
    if (p->min > 0 && x < p->min) x = p->min;
    if (p->max > 0 && x > p->max) x = p->max;
    return (float)x;
}

static void end_step(mp_scaler *s)
{
    s->unscaled = false;
    s->in_step = false;
    s->nopt = 0;
}

/* DeepSpeed's DynamicLossScaler.update_scale with separate growth/backoff factors */
static int hysteresis_rule(mp_scaler *s)
{
    const mp_policy *p = &s->policy;
    int64_t it = s->tracker;
    if (s->found_inf) {
        if (s->hyst_left <= 1) {
            double floor = p->min > 0 ? p->min : 0;
            if (floor > 0 && s->scale <= floor) {
                if (p->error_at_min)
                    return mp_fail(MP_EINVAL, "loss scale already at its minimum %g and the gradients still "
                                              "overflow (on_min = \"error\")", floor);
                if (!s->warned_at_min) {
                    fprintf(stderr, "mpengine: warning: loss scale at its minimum %g and gradients still overflow\n", floor);
                    s->warned_at_min = true;
                }
            }
            double next = s->scale * p->backoff;
            s->scale = (float)(floor > 0 && next < floor ? floor : next);
        } else {
            s->hyst_left--;
        }
        s->last_overflow = it;
    } else if ((it - s->last_overflow) % p->interval == 0) {
        s->hyst_left = p->hysteresis;
        double next = s->scale * p->growth;
        if (isfinite((float)next)) s->scale = clamp_scale(p, next);
    }
    s->tracker = it + 1;
    return 0;
}

static void amax_rule(mp_scaler *s)
{
    const mp_policy *p = &s->policy;
    if (s->found_inf) {
        s->scale = clamp_scale(p, s->scale * p->backoff);
        return;
    }
    float amax = s->total.amax / s->stats_scale;   /* the true gradient's largest magnitude */
    s->amax_hist[s->amax_pos] = amax;
    s->amax_pos = (s->amax_pos + 1) % p->history;
    if (s->amax_count < p->history) s->amax_count++;
    float m = 0;
    for (int i = 0; i < s->amax_count; i++) m = s->amax_hist[i] > m ? s->amax_hist[i] : m;
    if (m > 0) {
        double e = floor(log2(F16_MAX / m) - p->margin);
        if (e > 127) e = 127;
        if (e < -126) e = -126;
        s->scale = clamp_scale(p, ldexp(1.0, (int)e));
    }
}

int mp_scaler_update(mp_scaler *s)
{
    const mp_policy *p = &s->policy;
    switch (p->kind) {
    case MP_POLICY_STATIC: case MP_POLICY_NONE: case MP_POLICY_EXTERNAL: break;
    case MP_POLICY_DYNAMIC:   /* torch._amp_update_scale_ */
        if (s->found_inf) {
            s->scale = clamp_scale(p, s->scale * p->backoff);
            s->tracker = 0;
        } else if (s->tracker + 1 == p->interval) {
            float next = (float)(s->scale * p->growth);
            if (isfinite(next)) s->scale = clamp_scale(p, next);
            s->tracker = 0;
        } else {
            s->tracker++;
        }
        break;
    case MP_POLICY_HYSTERESIS:
        if (hysteresis_rule(s)) { end_step(s); return -1; }
        break;
    case MP_POLICY_AMAX: amax_rule(s); break;
    }
    end_step(s);
    return 0;
}

int mp_scaler_set_scale(mp_scaler *s, double scale)
{
    if (!(scale > 0) || !isfinite((float)scale))
        return mp_fail(MP_EINVAL, "the new scale must be a finite f32 number > 0 (got %g)", scale);
    s->scale = (float)scale;
    end_step(s);
    return 0;
}
