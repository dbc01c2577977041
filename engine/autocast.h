/*
 * autocast.h: automatic mixed precision for ops (docs/DESIGN.md section 6).
 *
 * Inside an autocast region each op looks up its class by name (the defaults
 * are the classes in the ops' own descriptions, engine/op.h):
 *   low     (matmul, linear): float inputs are cast to the region's dtype (f16/bf16);
 *   f32     (softmax, log_softmax, cross_entropy, mse_loss, layer_norm, sum, mean,
 *            exp, log, pow): float inputs are cast to f32;
 *   promote (add, sub, mul, div, cat, where): the widest input dtype, which is what
 *            these ops do anyway.
 * Ops of no class run in their inputs' dtypes. The classes can be changed and
 * extended by name (mp.amp.register). A leaf that requires grad (an FP32 master
 * weight) is cast at most once per region: the cast is cached, and it is an
 * autograd op whose backward accumulates the low-precision gradient into the
 * leaf's FP32 .grad. The cache grows with the weights a region casts.
 *
 * The regions and the cache are this thread's (engine/state.h); they are
 * inactive while a backward pass runs (its ops run in their own dtypes), but
 * for those a custom Function's backward enters (mp_autocast_enter_state).
 * mp_apply reaches autocast through its argument hook, which the first region
 * entered installs (engine/op.h).
 */
#ifndef MP_AUTOCAST_H
#define MP_AUTOCAST_H

#include "engine/op.h"   /* mp_op, mp_ac_class */

/* enter a region (dtype MP_F16/MP_BF16, or enabled=false to switch autocast off
 * inside an outer region); returns a token for mp_autocast_exit; -1 with an
 * error past MP_AUTOCAST_MAX_DEPTH (engine/state.h) regions */
int mp_autocast_enter(bool enabled, mp_dtype dt);
void mp_autocast_exit(int token);
bool mp_autocast_active(mp_dtype *dt);

/* The state ops see now, and a region that brings it back later even inside a
 * backward pass: a custom Function's backward runs with the autocast state its
 * forward had (PyTorch's custom_fwd/custom_bwd; lua/lfunction.c). Regions
 * entered inside such a region are in force in the backward too. */
typedef struct { bool on; mp_dtype dt; } mp_autocast_state;
mp_autocast_state mp_autocast_now(void);
int mp_autocast_enter_state(mp_autocast_state st);   /* a token for mp_autocast_exit, or -1 */
/* while suppressed, every region is inactive whatever a script enters (the FP32
 * rerun of mp.amp.diagnose); returns the previous setting */
bool mp_autocast_suppress(bool on);

int mp_autocast_register(const char *op, mp_ac_class c);
mp_ac_class mp_autocast_class(const char *op);
/* the registered names and classes, for listing: i from 0; NULL past the end */
const char *mp_autocast_entry(int i, mp_ac_class *c);

/* the input op should use under the current region: a new reference (t itself
 * when nothing changes); NULL with an error on failure (mp_apply's argument hook) */
mp_tensor *mp_autocast_arg(const mp_op *op, mp_tensor *t);

#endif
