/*
 * capture.c: opening, closing, replaying and freeing graphs of device work
 * (capture.h), through the backend's graph_* entries. The engine keeps only
 * which device captures; the recording, the graph and its memory pool are
 * the backend's (kernels/cuda/cuda_graph.cu).
 *
 * Random numbers: the capture's draws are counted apart from the stream
 * (ops_create.c mp_rng_reserve), which the capture leaves where it was; each
 * replay hands the backend the stream's (seed, offset) of its time, the base
 * of the graph's draws, and moves the stream on by the capture's count: a
 * replay draws what the eager step would draw at that point, and a seed set
 * between replays is honoured (PyTorch's CUDAGraph.replay: seed_extragraph,
 * offset_extragraph, wholegraph_increment).
 */
#include <stdlib.h>
#include "engine/capture.h"
#include "engine/capture_guard.h"
#include "engine/device.h"
#include "engine/error.h"
#include "engine/ops.h"   /* the random stream */

struct mp_capture {
    mp_device dev;
    void *g;             /* the backend's graph */
    uint64_t rng_used;   /* the counters of the random stream each replay draws */
};

static const mp_backend *open_be;   /* the backend capturing, NULL when none is */
static mp_device open_dev;

int mp_capture_begin(mp_device d)
{
    if (open_be) return mp_fail(MP_EINVAL, "a capture is open already (one at a time; mp.cuda.graph cannot nest)");
    if (mp_device_check(d)) return -1;
    const mp_backend *be = mp_backend_of(d);
    if (!be->graph_begin || !be->graph_end || !be->graph_replay || !be->graph_free)
        return mp_fail(MP_EDEVICE, "the %s backend cannot capture graphs", mp_device_name(d));
    /* an error of work queued before belongs to that work, not to the capture */
    if (mp_device_error(d)) return -1;
    char why[512] = "";
    if (be->graph_begin(be->ctx, why, sizeof why)) return mp_fail(MP_EDEVICE, "cannot begin a capture: %s", why);
    open_be = be, open_dev = d;
    mp_capture_mark(true);
    mp_rng_capture_begin();
    return 0;
}

mp_capture *mp_capture_end(bool abort)
{
    const mp_backend *be = open_be;
    if (!be) return mp_fail(MP_EINVAL, "no capture is open"), NULL;
    open_be = NULL;
    mp_capture_mark(false);
    uint64_t rng_used = mp_rng_capture_end();
    char why[512] = "";
    void *g = be->graph_end(be->ctx, abort, why, sizeof why);
    if (!g) return abort ? NULL : (mp_fail(MP_EDEVICE, "the capture failed: %s", why), NULL);
    mp_capture *c = malloc(sizeof *c);
    if (!c) {
        be->graph_free(be->ctx, g);
        return mp_fail(MP_EOOM, "out of memory keeping a graph"), NULL;
    }
    *c = (mp_capture){open_dev, g, rng_used};
    return c;
}

int mp_capture_replay(mp_capture *c)
{
    if (open_be) return mp_fail(MP_EINVAL, "cannot replay a graph while a capture is open");
    const mp_backend *be = mp_backend_of(c->dev);
    char why[512] = "";
    uint64_t seed, offset;
    mp_rng_get(&seed, &offset);
    if (be->graph_replay(be->ctx, c->g, seed, offset, why, sizeof why))
        return mp_fail(MP_EDEVICE, "replay failed: %s", why);
    mp_rng_set(seed, offset + c->rng_used);   /* queued: its draws are taken */
    return mp_device_error(c->dev);
}

void mp_capture_free(mp_capture *c)
{
    if (!c) return;
    const mp_backend *be = mp_backend_of(c->dev);
    be->graph_free(be->ctx, c->g);
    free(c);
}

size_t mp_capture_bytes(mp_device d)
{
    const mp_backend *be = mp_backend_loaded(d);
    return be && be->graph_bytes ? be->graph_bytes(be->ctx) : 0;
}
