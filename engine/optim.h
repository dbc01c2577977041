/*
 * optim.h: optimizers over flat arenas.
 *
 * Creating an optimizer packs its parameters once: their values move into one
 * contiguous f32 arena and their gradients into a second one, and each
 * parameter tensor keeps its identity (the same header, so every Lua reference
 * stays valid) while becoming a view into the arena. A step is then one fused
 * pass over contiguous memory (docs/DESIGN.md section 4), with PyTorch's update
 * formulas in PyTorch's order of floating-point operations.
 */
#ifndef MP_OPTIM_H
#define MP_OPTIM_H

#include "engine/tensor.h"

#include "engine/optim_kinds.h"

/* Parameter groups (PyTorch's param_groups): the parameters are packed group by
 * group, so group g is the arena range of parameters first[g] .. first[g+1]-1,
 * stepped with its own hyperparameters (one kernel pass per group). One group
 * is the plain optimizer. The kind and the step count are the optimizer's. */
typedef struct mp_optim {
    mp_optim_config cfg;           /* group 0's hyperparameters (the plain optimizer's) */
    int ngroups;
    mp_optim_config *group;        /* every group's, group[0] == cfg */
    int *first;                    /* ngroups + 1 parameter indices */
    int n;
    mp_tensor **params;            /* retained, in the order given */
    int64_t *offsets;              /* each parameter's first element in the arenas */
    mp_tensor *values, *grads;     /* f32 {numel} arenas */
    mp_tensor *state1, *state2;    /* momentum / exp_avg and exp_avg_sq, NULL until needed */
    mp_tensor *state3;             /* RMSprop's grad_avg (centered), NULL until needed */
    mp_tensor *counter;            /* the step count: one int64 in the backend's memory */
    int64_t numel;
    /* called first by mp_optim_free: whoever attached itself to the optimizer
     * (data parallel, engine/dist_dp.c) lets go of it; the optimizer knows no
     * more of it. NULL: nobody */
    void (*on_free)(struct mp_optim *o);
} mp_optim;

/* replace o's hyperparameters after the check; o unchanged on failure: every
 * group's (mp_optim_set_config) or group g's */
int mp_optim_set_config(struct mp_optim *o, const mp_optim_config *c);
int mp_optim_set_group(struct mp_optim *o, int g, const mp_optim_config *c);
mp_optim *mp_optim_new(const mp_optim_config *cfg, int n, mp_tensor *const *params);
/* ngroups groups: group g's config cfgs[g] and its counts[g] parameters, the
 * parameters in params group after group (n = sum of counts) */
mp_optim *mp_optim_new_groups(int ngroups, const mp_optim_config *cfgs, const int *counts, int n,
                              mp_tensor *const *params);
void mp_optim_free(mp_optim *o);
/* PyTorch's defaults for each kind (mp_optim_kinds[kind].defaults): Adam/AdamW:
 * lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0 and 0.01; SGD has no
 * default lr: NaN, which the check refuses as "lr is required". The binding
 * starts from these. */
mp_optim_config mp_optim_defaults(mp_optim_kind kind);
int mp_optim_check_config(const mp_optim_config *cfg);
/* one update of every parameter from the gradient arena */
int mp_optim_step(mp_optim *o);
/* the same, left out by the kernels (parameters, state and step count as they
 * were) when *skip (an int32 in the arena's backend memory) is set */
int mp_optim_step_if(mp_optim *o, const int32_t *skip);
/* the step count (read from the backend's memory: a wait on a GPU); -1 with
 * the device's error when that read fails */
int mp_optim_get_step(mp_optim *o, int64_t *step);
void mp_optim_set_step(mp_optim *o, int64_t step);
/* copy any .grad a script replaced into the arena, making it a view again */
int mp_optim_sync_grads(mp_optim *o);
/* zero the gradient arena and make every .grad a view into it again */
int mp_optim_zero_grad(mp_optim *o);
/* the view of an arena that belongs to parameter i (state arenas: NULL until created) */
mp_tensor *mp_optim_view(mp_optim *o, mp_tensor *arena, int i);
int mp_optim_ensure_state(mp_optim *o);
/* state arena k (0-based) is needed by the hyperparameters now (an arena once made
 * stays when they change: momentum set back to 0 keeps the buffer) */
bool mp_optim_state_wanted(const mp_optim *o, int k);

/* total 2-norm of the gradients of n tensors; scale them so it is at most max_norm */
int mp_clip_grad_norm(int n, mp_tensor *const *params, double max_norm, double *total);
/* clamp the gradients of n tensors in place into [-clip_value, clip_value] (NaN stays NaN) */
int mp_clip_grad_value(int n, mp_tensor *const *params, double clip_value);

#endif
