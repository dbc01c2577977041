/*
 * observe.h: watching a step op by op (mp.amp.diagnose). While on, mp_apply
 * hands every op's output (its output hook), and the backward pass every
 * gradient a node gives its inputs (in the node's dtype, before any cast back:
 * a backward listener), to mp_observe, which keeps them (retained) in order
 * with the op's name. mp_observe_stop hands the list over. The list is this
 * thread's, as autocast's state is (engine/state.h).
 */
#ifndef MP_OBSERVE_H
#define MP_OBSERVE_H

#include <stdbool.h>
#include "engine/tensor.h"

typedef struct mp_observed {
    const char *op;      /* the op's name (static: the description's) */
    bool backward;       /* a gradient from the op's backward */
    int input;           /* backward: which input the gradient is for */
    mp_tensor *t;        /* retained */
} mp_observed;

/* start keeping (a list left from before is released); 0, or -1 when already on */
int mp_observe_start(void);
/* stop; *out (malloc'd, the caller frees it and releases each t) and *n; NULL when empty */
void mp_observe_stop(mp_observed **out, int *n);
bool mp_observing(void);
/* keep t as the next entry (nothing when off; a failed allocation stops
 * keeping). While a backward pass runs, only gradients (backward true) are
 * kept: the ops it runs inside backward functions (clones, casts back, sums)
 * are its machinery, not the model's. */
void mp_observe(const char *op, bool backward, int input, mp_tensor *t);

#endif
