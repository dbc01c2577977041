/*
 * state.h: the engine's per-thread state, all of it in one place.
 *
 * What changes how the next op runs, and is not an argument of it, lives here:
 * grad mode (mp.no_grad), the sequence counters that order the graph's nodes
 * and mark a backward walk's visits, autocast's regions and its cast cache,
 * and the op-by-op record of mp.amp.diagnose. It is per thread (_Thread_local,
 * as the error message of engine/error.c): a thread's ops see the modes that
 * thread set, as PyTorch's grad mode and autocast are per thread. The engine
 * itself runs on one thread (OpenMP's workers run kernels, which see none of
 * this); a second thread that drives the engine starts with grad on, no
 * autocast region and nothing observed.
 *
 * Process-wide state stays with its owner and says so: the op registry
 * (engine/op.c), the backward listeners (engine/backward.h), the telemetry of
 * flushes, whose counts live in the devices' backends (engine/flush_count.c),
 * and the world of engine/dist.c.
 *
 * Only the files that own a part write it (graph.c, backward.c, autocast.c,
 * observe.c); everyone else goes through their functions.
 */
#ifndef MP_STATE_H
#define MP_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include "engine/tensor.h"

#define MP_AUTOCAST_MAX_DEPTH 64   /* nested regions; a deeper one is refused with an error */

/* one cast autocast made of a master weight in a region: (src, its dtype) -> cast */
typedef struct {
    mp_tensor *src, *cast;         /* both retained */
    uint64_t version;              /* src's storage version when it was cast */
} mp_cast_entry;

typedef struct mp_observed mp_observed;   /* engine/observe.h */

typedef struct {
    /* grad mode: ops record nodes only when it is on */
    bool grad_enabled;
    /* the next node's sequence number (backward runs nodes in decreasing order),
     * and the next backward walk's mark */
    uint64_t next_seq, next_visit;
    /* a backward pass is running (engine/backward.c): the ops its backward
     * functions run are its machinery, so autocast's regions are inactive and
     * the op-by-op record keeps only the gradients the nodes give */
    bool in_backward;
    struct {
        int depth;                 /* regions open */
        /* backward: the region is in force inside a backward pass too (a custom
         * Function's backward, run in its forward's state: engine/autocast.h) */
        struct { bool on, backward; mp_dtype dt; } stack[MP_AUTOCAST_MAX_DEPTH];
        bool suppressed;           /* every region inactive (the FP32 rerun of mp.amp.diagnose) */
        mp_cast_entry *cache;      /* alive for the outermost region; grows */
        int ncache, cache_cap;
    } autocast;
    struct {
        bool on;                   /* keeping every op's output and every node's input gradients */
        mp_observed *list;
        int n, cap;
    } observe;
} mp_state;

/* this thread's state (made on first use: grad on, counters at 1, the rest empty) */
mp_state *mp_state_get(void);

#endif
