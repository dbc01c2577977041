/*
 * optim.c: packing parameters into arenas, the optimizer step, zero_grad and
 * gradient clipping.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/optim.h"
#include "engine/ops.h"
#include "engine/error.h"

mp_optim_config mp_optim_defaults(mp_optim_kind kind) { return mp_optim_kinds[kind].defaults; }

int mp_optim_check_config(const mp_optim_config *c)
{
    const mp_optim_desc *d = &mp_optim_kinds[c->kind];
    if (isnan(c->lr) && d->lr_required) return mp_fail(MP_EINVAL, "lr is required");
    if (!(c->lr >= 0) || !isfinite(c->lr)) return mp_fail(MP_EINVAL, "lr must be a finite number >= 0 (got %g)", c->lr);
    if (!(c->weight_decay >= 0)) return mp_fail(MP_EINVAL, "weight_decay must be >= 0 (got %g)", c->weight_decay);
    switch (d->rule) {
    case MP_RULE_SGD:
        if (!(c->momentum >= 0)) return mp_fail(MP_EINVAL, "momentum must be >= 0 (got %g)", c->momentum);
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return mp_fail(MP_EINVAL, "nesterov needs a momentum > 0 and dampening 0");
        return 0;
    case MP_RULE_ADAM:
        if (!(c->beta1 >= 0 && c->beta1 < 1)) return mp_fail(MP_EINVAL, "betas[1] must be in [0, 1) (got %g)", c->beta1);
        if (!(c->beta2 >= 0 && c->beta2 < 1)) return mp_fail(MP_EINVAL, "betas[2] must be in [0, 1) (got %g)", c->beta2);
        if (!(c->eps >= 0)) return mp_fail(MP_EINVAL, "eps must be >= 0 (got %g)", c->eps);
        return 0;
    case MP_RULE_RMSPROP:
        if (!(c->alpha >= 0)) return mp_fail(MP_EINVAL, "alpha must be >= 0 (got %g)", c->alpha);
        if (!(c->eps >= 0)) return mp_fail(MP_EINVAL, "eps must be >= 0 (got %g)", c->eps);
        if (!(c->momentum >= 0)) return mp_fail(MP_EINVAL, "momentum must be >= 0 (got %g)", c->momentum);
        return 0;
    case MP_RULE_ADAGRAD:
        if (!(c->lr_decay >= 0)) return mp_fail(MP_EINVAL, "lr_decay must be >= 0 (got %g)", c->lr_decay);
        if (!(c->initial_accumulator_value >= 0))
            return mp_fail(MP_EINVAL, "initial_accumulator_value must be >= 0 (got %g)", c->initial_accumulator_value);
        if (!(c->eps >= 0)) return mp_fail(MP_EINVAL, "eps must be >= 0 (got %g)", c->eps);
        return 0;
    }
    return mp_fail(MP_EINVAL, "unknown optimizer rule %d", (int)d->rule);
}

static int check_params(int n, mp_tensor *const *ps)
{
    if (n < 1) return mp_fail(MP_EINVAL, "the parameter list is empty");
    for (int i = 0; i < n; i++) {
        mp_tensor *p = ps[i];
        if (p->dtype != MP_F32)
            return mp_fail(MP_EINVAL, "parameter %d is %s: optimizers keep f32 master weights "
                                      "(cast the model with :f32())", i + 1, mp_dtype_name(p->dtype));
        if (!p->requires_grad || p->grad_fn)
            return mp_fail(MP_EINVAL, "parameter %d is not a leaf that requires grad", i + 1);
        if (p->dev != ps[0]->dev)
            return mp_fail(MP_EINVAL, "parameters 1 and %d are on different devices", i + 1);
        if (p->st->arena)
            return mp_fail(MP_EINVAL, "parameter %d already belongs to an optimizer", i + 1);
        for (int j = 0; j < i; j++)
            if (ps[j] == p) return mp_fail(MP_EINVAL, "parameter %d appears twice (also at %d)", i + 1, j + 1);
    }
    return 0;
}

mp_tensor *mp_optim_view(mp_optim *o, mp_tensor *arena, int i)
{
    if (!arena) return NULL;
    mp_tensor *p = o->params[i];
    return mp_view(arena, p->ndim, p->shape, o->offsets[i]);
}

/* point p at the arena's storage from element off, keeping p's header */
static void adopt(mp_tensor *p, mp_tensor *arena, int64_t off)
{
    mp_storage *old = p->st;
    p->st = arena->st;
    p->st->refs++;
    p->offset = off;
    mp_storage_release(old);   /* freed unless another view still holds it */
}

mp_optim *mp_optim_new(const mp_optim_config *cfg, int n, mp_tensor *const *ps)
{
    return mp_optim_new_groups(1, cfg, &n, n, ps);
}

mp_optim *mp_optim_new_groups(int ngroups, const mp_optim_config *cfgs, const int *counts, int n,
                              mp_tensor *const *ps)
{
    if (ngroups < 1) return mp_fail(MP_EINVAL, "no parameter groups"), NULL;
    int total = 0;
    for (int g = 0; g < ngroups; g++) {
        if (cfgs[g].kind != cfgs[0].kind) return mp_fail(MP_EINVAL, "the groups' kinds differ"), NULL;
        if (mp_optim_check_config(&cfgs[g])) {
            if (ngroups > 1) {   /* name the group */
                char msg[512];
                snprintf(msg, sizeof msg, "%s", mp_error());
                return mp_fail(MP_EINVAL, "group %d: %s", g + 1, msg), NULL;
            }
            return NULL;
        }
        if (counts[g] < 1 && ngroups > 1) return mp_fail(MP_EINVAL, "group %d has no parameters", g + 1), NULL;
        total += counts[g];
    }
    if (total != n) return mp_fail(MP_EINVAL, "the groups hold %d parameters, the list %d", total, n), NULL;
    if (check_params(n, ps)) return NULL;
    mp_optim *o = calloc(1, sizeof *o);
    if (!o || !(o->params = calloc((size_t)n, sizeof *o->params)) || !(o->offsets = calloc((size_t)n, sizeof *o->offsets)) ||
        !(o->group = calloc((size_t)ngroups, sizeof *o->group)) || !(o->first = calloc((size_t)ngroups + 1, sizeof *o->first))) {
        mp_optim_free(o);
        return mp_fail(MP_EOOM, "out of memory"), NULL;
    }
    o->ngroups = ngroups;
    for (int g = 0; g < ngroups; g++) o->group[g] = cfgs[g], o->first[g + 1] = o->first[g] + counts[g];
    o->cfg = cfgs[0];
    for (int i = 0; i < n; i++) o->offsets[i] = o->numel, o->numel += ps[i]->numel;
    o->values = mp_full(MP_F32, ps[0]->dev, 1, &o->numel, 0);
    o->grads = o->values ? mp_full(MP_F32, ps[0]->dev, 1, &o->numel, 0) : NULL;
    int64_t two = 2;   /* an int64 as two i32 zeros */
    o->counter = o->grads ? mp_full(MP_I32, ps[0]->dev, 1, &two, 0) : NULL;
    if (!o->counter) {
        mp_optim_free(o);
        return NULL;
    }
    const mp_backend *be = mp_be(o->values);
    for (int i = 0; i < n; i++) {   /* nothing can fail from here on */
        mp_tensor *p = ps[i];
        size_t off = (size_t)o->offsets[i] * 4;
        be->copy(be->ctx, (char *)mp_data(o->values) + off, mp_data(p), mp_nbytes(p));
        if (p->grad && p->grad->dtype == MP_F32 && mp_same_shape(p->grad, p))
            be->copy(be->ctx, (char *)mp_data(o->grads) + off, mp_data(p->grad), mp_nbytes(p));
        adopt(p, o->values, o->offsets[i]);
        o->params[i] = mp_retain(p);
    }
    o->values->st->arena = true;
    o->n = n;
    /* .grad becomes a view into the arena, keeping any gradient it already held */
    for (int i = 0; i < n; i++) {
        mp_tensor *v = mp_optim_view(o, o->grads, i);
        if (!v) { mp_optim_free(o); return NULL; }
        mp_release(o->params[i]->grad);
        o->params[i]->grad = v;
    }
    return o;
}

void mp_optim_free(mp_optim *o)
{
    if (!o) return;
    if (o->on_free) o->on_free(o);
    for (int i = 0; i < o->n; i++) mp_release(o->params[i]);
    if (o->values) o->values->st->arena = false;
    mp_release(o->values), mp_release(o->grads), mp_release(o->counter), mp_release(o->state1), mp_release(o->state2);
    mp_release(o->state3);
    free(o->params);
    free(o->offsets);
    free(o->group);
    free(o->first);
    free(o);
}

/* a new state arena: zeros, or each group's initial_accumulator_value (Adagrad) */
static mp_tensor *new_state(mp_optim *o, const mp_optim_desc *d)
{
    mp_tensor *t = mp_full(MP_F32, o->values->dev, 1, &o->numel, d->state_init ? o->group[0].initial_accumulator_value : 0);
    for (int g = 1; t && d->state_init && g < o->ngroups; g++) {
        double v = o->group[g].initial_accumulator_value;
        if (v == o->group[0].initial_accumulator_value) continue;
        int lo = o->first[g], hi = o->first[g + 1];
        int64_t off = o->offsets[lo], len = (hi < o->n ? o->offsets[hi] : o->numel) - off;
        MP_K(t, fill, (float *)mp_data(t) + off, MP_F32, len, v);
    }
    return t;
}

bool mp_optim_state_wanted(const mp_optim *o, int k)
{
    const mp_optim_desc *d = &mp_optim_kinds[o->cfg.kind];
    if (k < 0 || k >= d->nstates) return false;
    mp_state_need need = d->states_need_momentum ? MP_STATE_MOMENTUM : d->state_need[k];
    bool any = need == MP_STATE_ALWAYS;
    for (int g = 0; g < o->ngroups && !any; g++)
        any = need == MP_STATE_MOMENTUM ? o->group[g].momentum != 0 : o->group[g].centered;
    return any;
}

int mp_optim_ensure_state(mp_optim *o)
{
    const mp_optim_desc *d = &mp_optim_kinds[o->cfg.kind];
    mp_tensor **arena[MP_OPTIM_MAX_STATES] = {&o->state1, &o->state2, &o->state3};
    for (int k = 0; k < d->nstates; k++)
        if (mp_optim_state_wanted(o, k) && !*arena[k] && !(*arena[k] = new_state(o, d))) return -1;
    return 0;
}

int mp_optim_zero_grad(mp_optim *o)
{
    MP_K(o->grads, zero, mp_data(o->grads), mp_nbytes(o->grads));
    for (int i = 0; i < o->n; i++) {
        mp_tensor *p = o->params[i];
        if (p->grad && p->grad->st == o->grads->st && p->grad->offset == o->offsets[i]) continue;
        mp_tensor *v = mp_optim_view(o, o->grads, i);   /* .grad was replaced or dropped: a view again */
        if (!v) return -1;
        mp_release(p->grad);
        p->grad = v;
    }
    return 0;
}

int mp_optim_sync_grads(mp_optim *o)
{
    for (int i = 0; i < o->n; i++) {
        mp_tensor *p = o->params[i], *g = p->grad;
        if (!g || (g->st == o->grads->st && g->offset == o->offsets[i])) continue;
        /* a .grad the script replaced: its values go into the arena, and .grad is the view again */
        mp_tensor *c = mp_to_raw(g, MP_F32, o->grads->dev), *v = c ? mp_optim_view(o, o->grads, i) : NULL;
        if (v) MP_K(c, copy, mp_data(v), mp_data(c), mp_nbytes(p));
        mp_release(c);
        if (!v) return -1;
        mp_release(p->grad);
        p->grad = v;
    }
    return 0;
}

int mp_optim_get_step(mp_optim *o, int64_t *step)
{
    return mp_host_read(o->counter->dev, step, mp_data(o->counter), sizeof *step);
}

void mp_optim_set_step(mp_optim *o, int64_t step)
{
    MP_K(o->counter, from_host, mp_data(o->counter), &step, sizeof step);
}

/* the device's errors come back with the step (mp_checked) */
int mp_optim_step(mp_optim *o)
{
    if (mp_optim_step_if(o, NULL)) return -1;
    return o->values->dev != MP_CPU ? mp_device_error(o->values->dev) : 0;
}

/* the kernel's arguments from a group's hyperparameters */
static mp_optim_args args_of(const mp_optim_config *c)
{
    return (mp_optim_args){
        .lr = (float)c->lr, .momentum = (float)c->momentum, .weight_decay = (float)c->weight_decay,
        .beta1 = (float)c->beta1, .beta2 = (float)c->beta2, .eps = (float)c->eps,
        .one_minus_dampening = (float)(1 - c->dampening), .one_minus_beta1 = (float)(1 - c->beta1),
        .one_minus_beta2 = (float)(1 - c->beta2), .decay = (float)(1 - c->lr * c->weight_decay),
        .lr_d = c->lr, .beta1_d = c->beta1, .beta2_d = c->beta2, .nesterov = c->nesterov,
        .alpha = (float)c->alpha, .one_minus_alpha = (float)(1 - c->alpha), .centered = c->centered,
        .lr_decay_d = c->lr_decay,
    };
}

int mp_optim_step_if(mp_optim *o, const int32_t *skip)
{
    if (mp_optim_ensure_state(o) || mp_optim_sync_grads(o)) return -1;
    float *p = mp_data(o->values), *g = mp_data(o->grads);
    float *s1 = o->state1 ? mp_data(o->state1) : NULL, *s2 = o->state2 ? mp_data(o->state2) : NULL;
    float *s3 = o->state3 ? mp_data(o->state3) : NULL;
    int64_t *step = mp_data(o->counter);
    const mp_backend *be = mp_be(o->values);
    /* casts of these parameters made before now are stale, but the working copy
     * for autocast, if current, stays current: the kernel writes it too */
    mp_storage *vs = o->values->st;
    bool mirror = vs->lowp && vs->lowp_version == vs->version;
    char *lp = mirror ? mp_data(vs->lowp) : NULL;
    mp_dtype lpt = mirror ? vs->lowp->dtype : MP_F16;
    size_t les = mp_dtype_size(lpt);
    /* so does the copy's f32 widening that the GEMMs keep (engine/ops_matmul.c),
     * if current: the kernel widens each block it rounds, and the next forward
     * finds it current instead of widening the whole copy again. Where a
     * parameter is left alone (no .grad, a skipped step) both stay as they were. */
    mp_storage *ls = mirror ? vs->lowp->st : NULL;
    bool widen = ls && ls->wide && ls->wide_version == ls->version && ls->wide_dtype == (int)lpt && be->gemm_wide &&
                 (!be->supports || be->supports(be->ctx, "gemm_wide", lpt));
    float *wd = widen ? mp_data(ls->wide) : NULL;
    vs->version++;
    if (mirror) vs->lowp_version = vs->version, ls->version++;   /* the copy is written too */
    if (widen) ls->wide_version = ls->version;
    be->optim_count(be->ctx, step, skip);
    for (int k = 0; k < o->ngroups; k++) {
        mp_optim_args a = args_of(&o->group[k]);
        int lo = o->first[k], hi = o->first[k + 1];
        bool all = true;
        for (int i = lo; i < hi && all; i++) all = o->params[i]->grad != NULL;
        if (all) {   /* the usual case: one pass over the group's range of the arena */
            int64_t off = o->offsets[lo], len = (hi < o->n ? o->offsets[hi] : o->numel) - off;
            a.s3 = s3 ? s3 + off : NULL;
            be->optim_step(be->ctx, o->cfg.kind, p + off, g + off, s1 ? s1 + off : NULL, s2 ? s2 + off : NULL, len, &a,
                           step, skip, lp ? lp + (size_t)off * les : NULL, lpt, wd ? wd + off : NULL);
            continue;
        }
        /* a parameter whose .grad was set to nil is left alone, as PyTorch skips grad None;
         * unlike PyTorch the step count (Adam's bias correction) is shared by all */
        for (int i = lo; i < hi; i++) {
            if (!o->params[i]->grad) continue;
            int64_t off = o->offsets[i];
            a.s3 = s3 ? s3 + off : NULL;
            be->optim_step(be->ctx, o->cfg.kind, p + off, g + off, s1 ? s1 + off : NULL, s2 ? s2 + off : NULL,
                           o->params[i]->numel, &a, step, skip, lp ? lp + (size_t)off * les : NULL, lpt,
                           wd ? wd + off : NULL);
        }
    }
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    int64_t x = (*(mp_tensor *const *)a)->offset, y = (*(mp_tensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

/* the gradients as one contiguous range of one storage (the usual case: the
 * parameters of one optimizer, whose .grad are views into its gradient arena):
 * the first element and the count, or -1. Sorted by offset, each must start
 * where the one before ends: no gap, no overlap, no parameter listed twice. */
static int64_t one_range(int n, mp_tensor *const *ps, int64_t *count)
{
    mp_tensor **g = malloc(sizeof *g * (size_t)(n > 0 ? n : 1));
    if (!g) return -1;   /* the per-tensor path needs no memory of its own */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ps[i]->grad) g[m++] = ps[i]->grad;
    bool ok = m > 0;
    for (int i = 0; ok && i < m; i++) ok = g[i]->dtype == MP_F32 && g[i]->st == g[0]->st;
    if (ok) qsort(g, (size_t)m, sizeof *g, by_offset);
    for (int i = 1; ok && i < m; i++) ok = g[i]->offset == g[i - 1]->offset + g[i - 1]->numel;
    int64_t lo = ok ? g[0]->offset : -1;
    if (ok) *count = g[m - 1]->offset + g[m - 1]->numel - lo;
    free(g);
    return lo;
}

int mp_clip_grad_norm(int n, mp_tensor *const *ps, double max_norm, double *total)
{
    if (!(max_norm > 0)) return mp_fail(MP_EINVAL, "max_norm must be positive (got %g)", max_norm);
    /* the sums of squares add up on the device; the host reads the total once */
    mp_tensor *acc = NULL, *range = NULL;
    int64_t count, lo = one_range(n, ps, &count);
    if (lo >= 0) {   /* one pass over the arena's range instead of one per parameter */
        mp_tensor *g0 = NULL;
        for (int i = 0; i < n && !g0; i++) g0 = ps[i]->grad;
        range = mp_view(g0, 1, &count, lo);
        if (!range) return -1;
    }
    for (int i = 0; i < (range ? 1 : n); i++) {
        mp_tensor *g = range ? range : ps[i]->grad;
        if (!g) continue;
        mp_tensor *g2 = mp_unary(MP_POW, g, 2), *s = g2 ? mp_reduce(MP_SUM, g2, 0, 0) : NULL;
        mp_release(g2);
        mp_tensor *a = !s ? NULL : acc ? mp_binary(MP_ADD, acc, s) : mp_retain(s);
        mp_release(s);
        mp_release(acc);
        acc = a;
        if (!acc) { mp_release(range); return -1; }
    }
    double sq = 0;
    int rc = acc ? mp_read_f64(acc, 0, 1, &sq) : 0;
    mp_release(acc);
    if (rc) { mp_release(range); return -1; }
    *total = sqrt(sq);
    double coef = max_norm / (*total + 1e-6);
    if (coef < 1) {   /* in place, so arena views stay views */
        for (int i = 0; i < (range ? 1 : n); i++) {
            mp_tensor *g = range ? range : ps[i]->grad;
            if (g) MP_K(g, unary, MP_MULS, g->dtype, mp_data(g), mp_data(g), g->numel, coef);
        }
    }
    mp_release(range);
    return 0;
}

/* one gradient clamped in place: where(g > c, c, g), then where(g < -c, -c, g),
 * with the backends' comparisons and where (exact, as torch.clamp; NaN fails
 * both comparisons and stays) */
static int clamp_grad(mp_tensor *g, double c)
{
    int64_t n = g->numel;
    for (int side = 0; side < 2; side++) {
        mp_tensor *bound = mp_full(g->dtype, g->dev, g->ndim, g->shape, side ? -c : c);
        mp_tensor *cond = bound ? mp_binary(side ? MP_LT : MP_GT, g, bound) : NULL;
        if (cond) MP_K(g, where, g->dtype, mp_data(g), mp_data(cond), mp_data(bound), mp_data(g), n);
        mp_release(bound);
        if (!cond) return -1;
        mp_release(cond);
    }
    return 0;
}

int mp_clip_grad_value(int n, mp_tensor *const *ps, double clip_value)
{
    if (!(clip_value >= 0) || !isfinite(clip_value))
        return mp_fail(MP_EINVAL, "clip_value must be a finite number >= 0 (got %g)", clip_value);
    for (int i = 0; i < n; i++) {
        mp_tensor *g = ps[i]->grad;
        if (!g) continue;
        if (clamp_grad(g, clip_value)) return -1;
    }
    return 0;
}

int mp_optim_set_config(mp_optim *o, const mp_optim_config *c)
{
    if (c->kind != o->cfg.kind) return mp_fail(MP_EINVAL, "the optimizer's kind cannot change");
    if (mp_optim_check_config(c)) return -1;
    for (int g = 0; g < o->ngroups; g++) o->group[g] = *c;
    o->cfg = *c;
    return 0;
}

int mp_optim_set_group(mp_optim *o, int g, const mp_optim_config *c)
{
    if (g < 0 || g >= o->ngroups) return mp_fail(MP_EINVAL, "group %d out of range 1..%d", g + 1, o->ngroups);
    if (c->kind != o->cfg.kind) return mp_fail(MP_EINVAL, "the optimizer's kind cannot change");
    if (mp_optim_check_config(c)) return -1;
    o->group[g] = *c;
    if (g == 0) o->cfg = *c;
    return 0;
}
