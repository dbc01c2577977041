/*
 * anomaly.h: anomaly mode (PyTorch's torch.autograd.detect_anomaly).
 *
 * While it is on, every node recorded keeps where its forward ran, as the
 * provider the binding installed says (engine/graph.c: new_node; the engine
 * knows no Lua, the binding reads the Lua line), and the backward walk checks
 * what each node gives (engine/backward.c: run_node): the first node whose
 * backward turns a finite incoming gradient into an inf or NaN gradient for
 * one of its inputs stops the backward with an error naming the op and that
 * line. Off, nothing of this runs: a node records no line and the walk checks
 * nothing. The mode is per thread (engine/state.h), as grad mode is.
 */
#ifndef MP_ANOMALY_H
#define MP_ANOMALY_H

#include "engine/graph.h"

bool mp_set_detect_anomaly(bool on);      /* returns the previous mode */
bool mp_anomaly_enabled(void);
/* where(ctx) is asked at each node recorded in the mode: a malloc'd string
 * the node then owns, or NULL when unknown. NULL where: none recorded */
void mp_anomaly_where(char *(*where)(void *ctx), void *ctx);

/* x's backward gave gin[0..nin-1] (NULL entries: no gradient) from gout: -1
 * with the error above when gout is finite and one of gin is not; else 0 */
int mp_anomaly_check(const mp_node *x, mp_tensor *gout, mp_tensor *const *gin);

#endif
