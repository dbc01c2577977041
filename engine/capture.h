/*
 * capture.h: a step's device work captured once as a graph and replayed
 * (mp.cuda.graph; the backend's graph_* entries, kernels/backend.h).
 *
 * Between mp_capture_begin and mp_capture_end the ops of the program run as
 * usual on the host (shapes, autograd, the optimizer's bookkeeping) but the
 * work they queue on the device is recorded, not run, and the device memory
 * they take comes from the graph's own pool: those blocks stay the graph's
 * until it is freed, so every replay writes the same addresses the captured
 * kernels point at, and the tensors made in the capture (the loss, new
 * gradients) are what each replay rewrites. What cannot be recorded is
 * refused with an error naming it (mp_capture_refuse, capture_guard.h): anything that waits
 * for the device or reads its memory on the host, a copy of host memory (the
 * replay would copy whatever the buffer then holds), an op on a CPU tensor or
 * a random draw on the CPU (it would run once, now), setting the seed (the
 * replays would not). Random draws on the device are recorded: each replay
 * draws what the eager step would draw at the random stream's position when
 * the replay is queued, and moves the stream on as that step would; the
 * capture itself leaves the stream where it was (capture.c).
 * One capture at a time, on one device.
 */
#ifndef MP_CAPTURE_H
#define MP_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include "engine/capture_guard.h"   /* mp_capturing, mp_capture_refuse */
#include "kernels/backend.h"         /* mp_device */

typedef struct mp_capture mp_capture;

/* 0, or -1 with the error: the device unavailable, its backend unable to
 * capture, a capture already open, an error the device had before */
int mp_capture_begin(mp_device d);
/* the graph, ready to replay; NULL with the error when the capture failed or
 * recorded no device work. abort: drop the capture (NULL, no error). Either
 * way the capture is closed and what failed leaves no memory reserved. */
mp_capture *mp_capture_end(bool abort);
/* queues the graph's work again on its device (0, or -1 with the error) */
int mp_capture_replay(mp_capture *g);
/* the graph and its pool go: its free blocks back to the device's cache,
 * blocks that tensors still hold go there when those are freed */
void mp_capture_free(mp_capture *g);
/* the bytes the device's live graphs hold in their pools (in use or free) */
size_t mp_capture_bytes(mp_device d);

#endif
