/*
 * optim_kinds.h: what an optimizer kind is (its hyperparameters and its
 * description), below the optimizers themselves (engine/optim.h), so that the
 * table of descriptions (engine/optim_kinds.c) needs nothing of them.
 */
#ifndef MP_OPTIM_KINDS_H
#define MP_OPTIM_KINDS_H

#include <stdbool.h>
#include "kernels/backend.h"   /* mp_optim_kind, MP_NOPTIM_KINDS */

typedef struct {
    mp_optim_kind kind;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
    bool nesterov;
} mp_optim_config;

/* An optimizer kind, described once (engine/optim_kinds.c), as mp_op describes
 * an op: the engine asks the description, never compares kinds, so a new kind
 * is one more entry there and one case in each backend's optim_step. */
typedef enum {
    MP_RULE_SGD,    /* momentum, dampening, nesterov: the hyperparameters checked */
    MP_RULE_ADAM    /* betas and eps */
} mp_optim_rule;
typedef struct {
    const char *name;              /* the binding's name ("adam") */
    const char *title;             /* in messages ("mp.optim.Adam") */
    mp_optim_rule rule;
    int nstates;                   /* f32 state arenas the step keeps (state1, state2) */
    bool states_need_momentum;     /* made only when a group has momentum != 0 (SGD's buffer) */
    bool lr_required;              /* no default lr: defaults.lr is NaN, refused as "lr is required" */
    mp_optim_config defaults;      /* PyTorch's */
} mp_optim_desc;
extern const mp_optim_desc mp_optim_kinds[MP_NOPTIM_KINDS];

#endif
