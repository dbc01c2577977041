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
    double alpha;                       /* RMSprop's smoothing constant */
    double lr_decay, initial_accumulator_value;   /* Adagrad's */
    bool centered;                      /* RMSprop: normalise by the variance's estimate */
} mp_optim_config;

/* An optimizer kind, described once (engine/optim_kinds.c), as mp_op describes
 * an op: the engine asks the description, never compares kinds, so a new kind
 * is one more entry there and one case in each backend's optim_step. */
typedef enum {
    MP_RULE_SGD,    /* momentum, dampening, nesterov: the hyperparameters checked */
    MP_RULE_ADAM,   /* betas and eps */
    MP_RULE_RMSPROP,   /* alpha, eps, momentum, centered */
    MP_RULE_ADAGRAD    /* lr_decay, initial_accumulator_value, eps */
} mp_optim_rule;
/* when a state arena is made: always, or only when some group needs it */
typedef enum {
    MP_STATE_ALWAYS,
    MP_STATE_MOMENTUM,   /* a group has momentum != 0 */
    MP_STATE_CENTERED    /* a group is centered */
} mp_state_need;
#define MP_OPTIM_MAX_STATES 3
typedef struct {
    const char *name;              /* the binding's name ("adam") */
    const char *title;             /* in messages ("mp.optim.Adam") */
    mp_optim_rule rule;
    int nstates;                   /* f32 state arenas the step keeps (state1, state2, state3) */
    bool states_need_momentum;     /* every state made only when a group has momentum != 0 (SGD's buffer) */
    /* each state's name in state_dict (PyTorch's) and, unless states_need_momentum,
     * when it is made */
    const char *state_names[MP_OPTIM_MAX_STATES];
    mp_state_need state_need[MP_OPTIM_MAX_STATES];
    double state_init;             /* nonzero: states start at the group's initial_accumulator_value (Adagrad) */
    bool lr_required;              /* no default lr: defaults.lr is NaN, refused as "lr is required" */
    mp_optim_config defaults;      /* PyTorch's */
} mp_optim_desc;
extern const mp_optim_desc mp_optim_kinds[MP_NOPTIM_KINDS];

#endif
