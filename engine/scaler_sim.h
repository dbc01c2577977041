/*
 * scaler_sim.h: the policy simulator (engine/scaler_sim.c).
 */
#ifndef MP_SCALER_SIM_H
#define MP_SCALER_SIM_H

#include "engine/scaler.h"     /* mp_policy, mp_skip_reason */

/* A built-in policy's rule on host memory, with no model and no device: what
 * mp.amp.replay runs a built-in candidate through, step by step, with the
 * findings a trace recorded. The same state and the same code
 * (kernels/step_rules.h) as a scaler's, so the candidate equal to the recorded
 * policy takes the recorded decisions. */
typedef struct mp_policy_sim mp_policy_sim;
/* NULL with the policy check's error */
mp_policy_sim *mp_policy_sim_new(const mp_policy *p, double init);
void mp_policy_sim_free(mp_policy_sim *m);
float mp_policy_sim_scale(const mp_policy_sim *m);
/* one step at the current scale: what it found (MP_SKIP_NONE, or why it is
 * skipped) and, when clean, the largest true gradient magnitude; runs the
 * decision and the rule, and returns the scale of the next step.
 * *at_min: the rule hit the policy's floor (1 warn, 2 on_min = "error") */
float mp_policy_sim_step(mp_policy_sim *m, mp_skip_reason found, double amax, int *at_min);

#endif
