/*
 * test_optim_kinds.c: every optimizer kind is described (engine/optim.h:
 * mp_optim_kinds), in the place of its kind, and the engine's defaults and
 * state come from the description.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include "engine/optim.h"

Test(optim_kinds, every_kind_is_described_in_its_place)
{
    for (int k = 0; k < MP_NOPTIM_KINDS; k++) {
        const mp_optim_desc *d = &mp_optim_kinds[k];
        cr_assert(d->name && d->name[0] && d->title && d->title[0], "kind %d is not described", k);
        cr_assert_eq((int)d->defaults.kind, k, "%s: its defaults are another kind's", d->name);
        cr_assert(d->nstates >= 0 && d->nstates <= MP_OPTIM_MAX_STATES, "%s: %d states (the optimizer has %d arenas)",
                  d->name, d->nstates, MP_OPTIM_MAX_STATES);
        for (int i = 0; i < d->nstates; i++) cr_assert(d->state_names[i], "%s: state %d has no name", d->name, i + 1);
        cr_assert_eq(isnan(d->defaults.lr), d->lr_required, "%s: a NaN lr is what 'lr is required' means", d->name);
        cr_assert_eq((int)mp_optim_defaults((mp_optim_kind)k).kind, k);
        for (int j = 0; j < k; j++) cr_assert(strcmp(mp_optim_kinds[j].name, d->name), "%s twice", d->name);
    }
}

/* PyTorch's defaults, as the engine has always given them */
Test(optim_kinds, defaults_are_pytorchs)
{
    mp_optim_config s = mp_optim_defaults(MP_SGD), a = mp_optim_defaults(MP_ADAM), w = mp_optim_defaults(MP_ADAMW);
    cr_assert(isnan(s.lr));
    cr_assert_eq(a.lr, 1e-3);
    cr_assert(a.beta1 == 0.9 && a.beta2 == 0.999 && a.eps == 1e-8 && a.weight_decay == 0.0);
    cr_assert(w.lr == 1e-3 && w.weight_decay == 0.01 && w.beta1 == 0.9);
    cr_assert_eq(mp_optim_kinds[MP_SGD].rule, MP_RULE_SGD);
    cr_assert_eq(mp_optim_kinds[MP_ADAMW].rule, MP_RULE_ADAM);
    mp_optim_config r = mp_optim_defaults(MP_RMSPROP), g = mp_optim_defaults(MP_ADAGRAD);
    cr_assert(r.lr == 1e-2 && r.alpha == 0.99 && r.eps == 1e-8 && r.weight_decay == 0 && r.momentum == 0 && !r.centered);
    cr_assert(g.lr == 1e-2 && g.lr_decay == 0 && g.weight_decay == 0 && g.initial_accumulator_value == 0 && g.eps == 1e-10);
}
