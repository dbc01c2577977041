/*
 * optim_kinds.c: the description of each optimizer kind (engine/optim_kinds.h:
 * mp_optim_desc), one table indexed by mp_optim_kind.
 */
#include <math.h>
#include "engine/optim_kinds.h"

/* PyTorch's defaults; SGD's configs carry Adam's betas and eps too (unused there) */
#define BETAS_EPS .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8

const mp_optim_desc mp_optim_kinds[] = {
    [MP_SGD] = {.name = "sgd", .title = "mp.optim.SGD", .rule = MP_RULE_SGD, .nstates = 1,
                .states_need_momentum = true, .lr_required = true, .state_names = {"momentum_buffer"},
                .defaults = {.kind = MP_SGD, .lr = NAN, BETAS_EPS}},
    [MP_ADAM] = {.name = "adam", .title = "mp.optim.Adam", .rule = MP_RULE_ADAM, .nstates = 2,
                 .state_names = {"exp_avg", "exp_avg_sq"},
                 .defaults = {.kind = MP_ADAM, .lr = 1e-3, BETAS_EPS}},
    [MP_ADAMW] = {.name = "adamw", .title = "mp.optim.AdamW", .rule = MP_RULE_ADAM, .nstates = 2,
                  .state_names = {"exp_avg", "exp_avg_sq"},
                  .defaults = {.kind = MP_ADAMW, .lr = 1e-3, BETAS_EPS, .weight_decay = 0.01}},
    /* square_avg always; momentum_buffer with momentum, grad_avg when centered (torch/optim/rmsprop.py) */
    [MP_RMSPROP] = {.name = "rmsprop", .title = "mp.optim.RMSprop", .rule = MP_RULE_RMSPROP, .nstates = 3,
                    .state_names = {"square_avg", "momentum_buffer", "grad_avg"},
                    .state_need = {MP_STATE_ALWAYS, MP_STATE_MOMENTUM, MP_STATE_CENTERED},
                    .defaults = {.kind = MP_RMSPROP, .lr = 1e-2, .alpha = 0.99, .eps = 1e-8}},
    /* sum, from initial_accumulator_value (torch/optim/adagrad.py) */
    [MP_ADAGRAD] = {.name = "adagrad", .title = "mp.optim.Adagrad", .rule = MP_RULE_ADAGRAD, .nstates = 1,
                    .state_names = {"sum"}, .state_init = 1,
                    .defaults = {.kind = MP_ADAGRAD, .lr = 1e-2, .eps = 1e-10}},
};
/* every kind described: the table's length is the kinds' count (a kind left
 * out of the middle would be a zeroed entry: tests/c/test_optim_kinds.c) */
_Static_assert(sizeof mp_optim_kinds / sizeof mp_optim_kinds[0] == MP_NOPTIM_KINDS,
               "mp_optim_kinds describes every mp_optim_kind");
