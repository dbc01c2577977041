/*
 * dist_agree.h: the ranks' rendezvous before each collective (mp.dist;
 * engine/dist_agree.c), for engine/dist.c and engine/dist_dp.c.
 *
 * Every collective, the engine's own (gradient buckets, the loss scaler's
 * findings) as the public ones, first makes the ranks agree on what they
 * call: its kind, its op or root, and the tensor's dtype, device and full
 * shape. That is one small nonblocking reduction over MPI (kernels/comm.h)
 * with a deadline, so every wait of a collective is here, where it can end:
 *   - the ranks disagree: every rank gets an error naming each side;
 *   - a rank finalizes (mp.dist.finalize, or its process ends) while others
 *     wait: they get an error naming it, and no collective runs after;
 *   - the timeout passes: the ranks that did not arrive are named (a roll
 *     call), the others are told, and the job ends at this process's exit.
 * After the rendezvous every rank has arrived with the same arguments, and
 * the data collective (MPI's blocking one, or NCCL on the device's stream)
 * runs to its end.
 */
#ifndef MP_DIST_AGREE_H
#define MP_DIST_AGREE_H

#include "engine/tensor.h"
#include "kernels/comm.h"

typedef enum {
    MP_DK_ALL_REDUCE, MP_DK_BROADCAST, MP_DK_ALL_GATHER, MP_DK_BARRIER, MP_DK_FINALIZE,
    MP_DK_GRADS,      /* a bucket of a data-parallel gradient average (engine/dist_dp.c) */
    MP_DK_FINDINGS,   /* the loss scaler's findings, reduced with max (engine/scaler.c) */
    MP_DK_ATTACH,     /* an optimizer made data parallel: its parameters and buckets */
    MP_DK_COUNT
} mp_dist_kind;

/* how long a rank waits in a collective for the others to arrive (seconds,
 * > 0; INFINITY: for ever), before it names those that did not and gives up.
 * Generous: a rank may take minutes alone between two collectives (rank 0's
 * evaluation, a checkpoint), and PyTorch's process groups wait 30 minutes. */
#define MP_DIST_TIMEOUT_DEFAULT 1800.0
int mp_dist_set_timeout(double seconds);
double mp_dist_timeout(void);

/* under a launcher, at mp_dist_init: the world's MPI */
int mp_dist_agree_begin(const mp_comm *c);
/* what this rank calls: arg is the op (all_reduce, findings), the root
 * (broadcast) or the number of buckets (attach); 0, or -1 with the message.
 * A world of one agrees with itself. */
int mp_dist_agree(mp_dist_kind k, int64_t arg, mp_dtype dt, mp_device dev, int ndim, const int64_t *shape);
/* why no collective can run any more, or NULL. left: a rank finalized while
 * others waited, and every rank saw it in the same rendezvous (MPI can still
 * finalize). broken: a wait timed out or another rank gave up (a rank may
 * never come: MPI cannot finalize, the job ends with MPI_Abort). */
const char *mp_dist_left(void);
const char *mp_dist_broken(void);

#endif
