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
                .states_need_momentum = true, .lr_required = true,
                .defaults = {.kind = MP_SGD, .lr = NAN, BETAS_EPS}},
    [MP_ADAM] = {.name = "adam", .title = "mp.optim.Adam", .rule = MP_RULE_ADAM, .nstates = 2,
                 .defaults = {.kind = MP_ADAM, .lr = 1e-3, BETAS_EPS}},
    [MP_ADAMW] = {.name = "adamw", .title = "mp.optim.AdamW", .rule = MP_RULE_ADAM, .nstates = 2,
                  .defaults = {.kind = MP_ADAMW, .lr = 1e-3, BETAS_EPS, .weight_decay = 0.01}},
};
/* every kind described: the table's length is the kinds' count (a kind left
 * out of the middle would be a zeroed entry: tests/c/test_optim_kinds.c) */
_Static_assert(sizeof mp_optim_kinds / sizeof mp_optim_kinds[0] == MP_NOPTIM_KINDS,
               "mp_optim_kinds describes every mp_optim_kind");
