/*
 * dist.h: processes that train together (mp.dist, docs/DESIGN.md section 11).
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
 * averaged over the world in buckets (engine/dist_dp.c, a listener of the
 * backward pass), so every rank steps with the same gradients. The loss
 * scaler takes one decision for all ranks: what each rank found (inf/NaN, a
 * bad loss, the amax) is reduced with max before the skip and the update
 * (engine/scaler.c).
 *
 * Every collective begins with the ranks' rendezvous (engine/dist_agree.h):
 * they agree on what they call, or each gets an error naming both sides; a
 * rank that finalizes while others wait ends their wait with an error naming
 * it; and no rank waits longer than the timeout for the others to arrive.
 */
#ifndef MP_DIST_H
#define MP_DIST_H

#include "engine/tensor.h"
#include "engine/optim.h"
#include "engine/dist_agree.h"   /* the rendezvous, and its timeout */

typedef enum { MP_DIST_SUM, MP_DIST_MEAN, MP_DIST_MAX, MP_DIST_MIN } mp_dist_op;

/* Start (once; again is a no-op). device_self: in a world of one, a device's
 * tensors still go through its backend's collectives (NCCL with one rank),
 * to check that path on a machine with one GPU. */
int mp_dist_init(bool device_self);
bool mp_dist_initialized(void);
/* the timeout of a collective: mp_dist_set_timeout, mp_dist_timeout (engine/dist_agree.h) */
int mp_dist_rank(void);
int mp_dist_size(void);
int mp_dist_local_rank(void);
int mp_dist_local_size(void);
/* what carries the collectives: "Open MPI v4.1.4", or "a world of one" */
const char *mp_dist_backend(void);
/* whether collectives on dev's memory do anything (a world of more than one,
 * or device_self on a device) */
bool mp_dist_spans(mp_device dev);

/* in place on every rank; every rank calls the same collective on the same
 * shape, dtype and device, with the same op or root (checked) */
int mp_dist_all_reduce(mp_tensor *t, mp_dist_op op);
int mp_dist_broadcast(mp_tensor *t, int root);
/* a new tensor {size, t's shape...}: rank r's t at index r */
mp_tensor *mp_dist_all_gather(mp_tensor *t);
int mp_dist_barrier(void);
/* leave the world: the others agree on it (a rank waiting in a collective
 * gets an error naming this one, and this one's finalize returns the same),
 * then MPI finalizes. Called at exit when a script did not. After a timeout
 * MPI cannot finalize (a rank may never come): an error, and the job ends at
 * exit (MPI_Abort). */
int mp_dist_finalize(void);
/* what a script's end does when it did not finalize (no-op once finalized, or
 * without MPI): finalize, an error printed on stderr ("mp.dist.finalize at
 * exit: ..."), MPI_Abort when MPI cannot finalize. Also an atexit hook, but a
 * host should call it before it exits: the hook runs after the destructors of
 * every static made since mp.dist.init, which the device's leaving may need */
void mp_dist_finalize_at_exit(void);
/* end the whole job at once: a script failed on this rank, and the others
 * would wait for it in their next collective until the timeout (no-op
 * without MPI). After a rank left, which every rank saw, this rank only
 * finalizes: none is left waiting. */
void mp_dist_abort(int code);

/* n values of dt (f32) in dev's memory, reduced in place over the world:
 * the engine's own (the loss scaler's findings) */
int mp_dist_reduce_raw(mp_device dev, void *p, int64_t n, mp_dtype dt, mp_coll_op op);

/* Data parallel (engine/dist_dp.c): broadcast o's parameters from rank 0,
 * and average its gradients over the ranks at every backward, in buckets of
 * whole parameters of about bucket_bytes, the last parameters' first. During
 * backward a bucket is reduced as soon as every gradient in it is final (and
 * the buckets before it are on their way): on a device whose backend has
 * coll_fork, on a second stream while backward goes on; on the CPU at once
 * (MPI's blocking all-reduce). */
int mp_dist_attach(mp_optim *o, int64_t bucket_bytes);
void mp_dist_detach(mp_optim *o);
/* the whole arena at once (what a backward that could not follow its
 * gradients does at its end; benchmarks) */
int mp_dist_reduce_grads(mp_optim *o);
/* gradient accumulation: no_sync depth > 0 (the earlier micro-batches) leaves
 * gradients local; the next backward outside averages everything accumulated.
 * (dist_dp.c follows each backward as a listener, engine/backward.h: begin,
 * with the nodes it will run in order; after each node's turn; and at the end,
 * which reduces what is left and waits for the second stream, so the average
 * is done when backward returns.) */
void mp_dist_no_sync(int delta);

/* dist.c's pieces for dist_dp.c: n f32 gradients at g averaged over the
 * world (side: on the device's second stream, when it has one); the device's
 * main stream waiting for its second */
int mp_dist_reduce_bucket(mp_device dev, float *g, int64_t n, bool side);
void mp_dist_reduce_done(mp_device dev);

#endif
