/*
 * dist.h: processes that train together (mp.dist, DESIGN.md section 11).
 *
 * One process per GPU (or per CPU share), started by mpirun. mp_dist_init
 * finds the world in the launcher's environment and loads MPI
 * (kernels/comm.h) only then: a process started without a launcher is a world
 * of one, where every collective leaves its tensor as it is, and MPI is never
 * loaded. CPU tensors go through MPI; a device's tensors through its
 * backend's collectives (NCCL on CUDA, on the backend's stream, its group
 * named by bytes rank 0 makes and MPI broadcasts), or, on a backend without
 * them, through host memory and MPI.
 *
 * Data parallel training: an optimizer attached with mp_dist_attach starts
 * from rank 0's parameters, and after every backward its gradient arena is
 * averaged over the world in buckets (mp_dist_after_backward, called by
 * mp_backward), so every rank steps with the same gradients. The loss
 * scaler takes one decision for all ranks: what each rank found (inf/NaN, a
 * bad loss, the amax) is reduced with max before the skip and the update
 * (engine/scaler.c).
 */
#ifndef MP_DIST_H
#define MP_DIST_H

#include "engine/tensor.h"
#include "engine/optim.h"

typedef enum { MP_DIST_SUM, MP_DIST_MEAN, MP_DIST_MAX, MP_DIST_MIN } mp_dist_op;

/* Start (once; again is a no-op). device_self: in a world of one, a device's
 * tensors still go through its backend's collectives (NCCL with one rank),
 * to check that path on a machine with one GPU. */
int mp_dist_init(bool device_self);
bool mp_dist_initialized(void);
int mp_dist_rank(void);
int mp_dist_size(void);
int mp_dist_local_rank(void);
int mp_dist_local_size(void);
/* what carries the collectives: "Open MPI v4.1.4", or "a world of one" */
const char *mp_dist_backend(void);
/* whether collectives on dev's memory do anything (a world of more than one,
 * or device_self on a device) */
bool mp_dist_spans(mp_device dev);

/* in place on every rank; every rank passes the same shape and dtype (checked) */
int mp_dist_all_reduce(mp_tensor *t, mp_dist_op op);
int mp_dist_broadcast(mp_tensor *t, int root);
/* a new tensor {size, t's shape...}: rank r's t at index r */
mp_tensor *mp_dist_all_gather(mp_tensor *t);
int mp_dist_barrier(void);
int mp_dist_finalize(void);
/* end the whole job at once: a script failed on this rank, and the others
 * would wait for it forever in their next collective (no-op without MPI) */
void mp_dist_abort(int code);

/* n values of dt (f32) in dev's memory, reduced in place over the world
 * without the argument check: the engine's own (the scaler's findings) */
int mp_dist_reduce_raw(mp_device dev, void *p, int64_t n, mp_dtype dt, mp_coll_op op);

/* Data parallel: broadcast o's parameters from rank 0 and average its
 * gradients after each backward, in buckets of bucket_bytes */
int mp_dist_attach(mp_optim *o, int64_t bucket_bytes);
void mp_dist_detach(mp_optim *o);
int mp_dist_reduce_grads(mp_optim *o);
/* mp_backward's last act: every attached optimizer's gradients averaged
 * (unless inside no_sync: gradient accumulation's earlier micro-batches) */
int mp_dist_after_backward(void);
/* no_sync depth: > 0 leaves gradients local (they are averaged at the first
 * backward outside, which averages everything accumulated so far) */
void mp_dist_no_sync(int delta);

#endif
