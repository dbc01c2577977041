/*
 * scaler_sim.c: a built-in policy's rule on host memory, with no model and no
 * device (mp.amp.replay): the scaler's state and rules (kernels/step_rules.h)
 * run step by step on the findings a trace recorded.
 */
#include <stdlib.h>
#include "engine/scaler_sim.h"
#include "engine/error.h"
#include "kernels/step_rules.h"

struct mp_policy_sim {
    mp_policy p;
    mp_scale_state h;
};

mp_policy_sim *mp_policy_sim_new(const mp_policy *p, double init)
{
    if (mp_policy_check(p)) return NULL;
    if (!mp_scale_ok(init)) return mp_fail(MP_EINVAL, "init must be a finite f32 number > 0 (got %g)", init), NULL;
    mp_policy_sim *m = calloc(1, sizeof *m);
    if (!m) return mp_fail(MP_EOOM, "out of memory"), NULL;
    m->p = *p;
    m->h.scale = m->h.stats_scale = p->kind == MP_POLICY_NONE ? 1.0f : (float)init;
    mp_policy_state_reset(&m->h, p);
    return m;
}

void mp_policy_sim_free(mp_policy_sim *m) { free(m); }

float mp_policy_sim_scale(const mp_policy_sim *m) { return m->h.scale; }

float mp_policy_sim_step(mp_policy_sim *m, mp_skip_reason found, double amax, int *at_min)
{
    mp_scale_state *h = &m->h;
    mp_scale_apply(MP_SCALE_BEGIN, h, &m->p, 0, 0);
    h->loss_bad = found == MP_SKIP_FORWARD;
    h->slot[0].n = 1;
    h->slot[0].nan = found == MP_SKIP_NAN;
    h->slot[0].inf = found == MP_SKIP_OVERFLOW;
    h->slot[0].amax = found == MP_SKIP_NONE && amax > 0 ? (float)(amax * h->scale) : 0.0f;
    mp_scale_apply(MP_SCALE_DECIDE, h, &m->p, 0, 0);
    mp_scale_apply(MP_SCALE_UPDATE, h, &m->p, 0, 0);
    if (at_min) *at_min = h->at_min;
    return h->scale;
}
