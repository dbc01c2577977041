/*
 * scaler_trace.h: a trace's snapshots of a scaler (engine/scaler_trace.c).
 */
#ifndef MP_SCALER_TRACE_H
#define MP_SCALER_TRACE_H

#include "engine/scaler.h"

/* A trace's per-step view without a wait (asynchronous backends): the state,
 * the per-parameter statistics and the loss (a one-element float tensor, or
 * NULL) copied to host memory in the stream's order, read a step later when the
 * copies have long passed. mp_scaler_snapshot_async: whether the backend can
 * (else the trace reads at once). snapshot: 0, or -1 (the older snapshot must
 * be taken first, or memory ran out). take: the snapshot before the latest
 * (with latest_too, else the latest itself when it is the only one) after its
 * copies are done (a wait only if they are not): 0, 1 when there is none, -1 on
 * a device error. The pointers stay valid until the next snapshot. */
bool mp_scaler_snapshot_async(const mp_scaler *s);
int mp_scaler_snapshot(mp_scaler *s, mp_tensor *loss);
int mp_scaler_snapshot_take(mp_scaler *s, bool latest_too, const mp_scale_state **h, const mp_grad_stats **pp,
                            int *n, double *loss);

#endif
