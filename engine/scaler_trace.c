/*
 * scaler_trace.c: a trace's per-step snapshots of a scaler on an asynchronous
 * backend: the state, the per-parameter statistics and the loss copied to
 * pinned host memory in the stream's order, two in turn, each read a step
 * later without a wait.
 */
#include <math.h>
#include <stdlib.h>
#include "engine/scaler_trace.h"
#include "engine/ops.h"        /* mp_to_raw */
#include "engine/error.h"

struct mp_trace_snap {
    bool used, has_loss;
    void *mark;
    mp_scale_state *h;         /* host memory from the backend's host_alloc */
    mp_grad_stats *pp;
    float *loss;
    int n, cap;                /* statistics taken, and room for */
};

static const mp_backend *snap_backend(const mp_scaler *s) { return s->state ? mp_be(s->state) : NULL; }

bool mp_scaler_snapshot_async(const mp_scaler *s)
{
    const mp_backend *be = snap_backend(s);
    return be && be->host_alloc && be->host_free && be->to_host_async && be->mark && be->mark_wait;
}

static void snap_free(mp_scaler *s)
{
    const mp_backend *be = snap_backend(s);
    if (!s->snap) return;
    for (int i = 0; i < 2; i++) {
        struct mp_trace_snap *sn = &s->snap[i];
        if (be && sn->mark) be->mark_wait(be->ctx, sn->mark);
        if (be && sn->h) be->host_free(be->ctx, sn->h, sizeof *sn->h);
        if (be && sn->pp) be->host_free(be->ctx, sn->pp, sizeof *sn->pp * (size_t)sn->cap);
        if (be && sn->loss) be->host_free(be->ctx, sn->loss, sizeof *sn->loss);
    }
    free(s->snap);
    s->snap = NULL;
}

int mp_scaler_snapshot(mp_scaler *s, mp_tensor *loss)
{
    if (!mp_scaler_snapshot_async(s)) return mp_fail(MP_EINVAL, "this device reads its state at once (no snapshots)");
    const mp_backend *be = snap_backend(s);
    if (!s->snap && !(s->snap = calloc(2, sizeof *s->snap))) return mp_fail(MP_EOOM, "out of memory");
    s->snap_free = snap_free;
    struct mp_trace_snap *sn = &s->snap[s->snap_next];
    if (sn->used) return mp_fail(MP_EINVAL, "the snapshot before last was not taken");
    int n = s->tel ? s->nstats : 0;
    if (!sn->h && !(sn->h = be->host_alloc(be->ctx, sizeof *sn->h))) return mp_fail(MP_EOOM, "out of pinned memory");
    if (!sn->loss && !(sn->loss = be->host_alloc(be->ctx, sizeof *sn->loss)))
        return mp_fail(MP_EOOM, "out of pinned memory");
    if (n > sn->cap) {
        if (sn->pp) be->host_free(be->ctx, sn->pp, sizeof *sn->pp * (size_t)sn->cap);
        sn->cap = 0;
        if (!(sn->pp = be->host_alloc(be->ctx, sizeof *sn->pp * (size_t)n))) return mp_fail(MP_EOOM, "out of pinned memory");
        sn->cap = n;
    }
    be->to_host_async(be->ctx, sn->h, mp_data(s->state), sizeof *sn->h);
    if (n) be->to_host_async(be->ctx, sn->pp, mp_data(s->tel), sizeof *sn->pp * (size_t)n);
    sn->has_loss = false;
    if (loss) {
        if (loss->numel != 1 || loss->dev != s->state->dev)
            return mp_fail(MP_EINVAL, "the loss must be one value on the scaler's device");
        mp_tensor *l = mp_to_raw(loss, MP_F32, loss->dev);
        if (!l) return -1;
        be->to_host_async(be->ctx, sn->loss, mp_data(l), sizeof *sn->loss);
        mp_release(l);   /* the stream orders the copy before any reuse of its block */
        sn->has_loss = true;
    }
    sn->n = n;
    sn->mark = be->mark(be->ctx);
    if (!sn->mark) return mp_fail(MP_EOOM, "cannot mark the stream");
    sn->used = true;
    s->snap_next ^= 1;
    return 0;
}

int mp_scaler_snapshot_take(mp_scaler *s, bool latest_too, const mp_scale_state **h, const mp_grad_stats **pp,
                            int *n, double *loss)
{
    if (!s->snap) return 1;
    struct mp_trace_snap *sn = &s->snap[s->snap_next];   /* the older one, when used */
    if (!sn->used && latest_too) sn = &s->snap[s->snap_next ^ 1];
    if (!sn->used) return 1;
    const mp_backend *be = snap_backend(s);
    be->mark_wait(be->ctx, sn->mark);
    sn->mark = NULL;
    sn->used = false;
    const char *e = be->error ? be->error(be->ctx) : NULL;
    if (e) return mp_fail(MP_EDEVICE, "%s", e);
    *h = sn->h, *pp = sn->pp, *n = sn->n;
    *loss = sn->has_loss ? (double)*sn->loss : NAN;
    return 0;
}
