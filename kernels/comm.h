/*
 * comm.h: the contract between the engine and the library that starts and
 * connects processes (Open MPI), for mp.dist (engine/dist.c).
 *
 * The library lives in its own shared object, build/mp/mpi.so
 * (kernels/mpi/mpi_comm.c, built with mpicc next to mp/core.so), which the
 * engine loads only when a script calls mp.dist.init() under a launcher
 * (mpirun): a program that never does has no run-time dependency on MPI, as
 * a CPU-only machine has none on CUDA. The object exports one symbol,
 * mp_mpi_comm_init, which initialises MPI and returns the table below.
 *
 * Host memory only: a device's tensors go through its backend's coll_*
 * entries (NCCL on CUDA), or are staged through host memory by the engine.
 * Like a kernel, an entry trusts its caller (the engine checked dtype, sizes
 * and root) and returns 0, or -1 with MPI's message in the object's error().
 *
 * The rendezvous. Before every collective the engine makes the ranks agree on
 * what they are about to do (agree: a record of n int64 values, reduced with
 * max and min). It is the one wait that can be long (a rank still computing,
 * one that left, one that never comes), so it is nonblocking underneath and
 * polled against a deadline; the data collectives after it are MPI's
 * blocking ones (faster than the nonblocking ones here), which by then every
 * rank has reached. While a rank waits in agree or gather it answers the
 * others' roll calls on a side channel (a communicator of its own) with its
 * record. A rank whose deadline passes calls the roll (about a second:
 * who answers has arrived, or waits elsewhere, and says where), and what
 * stays silent has not arrived.
 */
#ifndef MP_COMM_H
#define MP_COMM_H

#include <stdint.h>
#include "kernels/backend.h"

/* the most int64 values in a rendezvous record */
#define MP_COMM_MAXREC 32

/* agree's and gather's results besides 0 and -1 */
enum {
    MP_COMM_TIMEOUT = 1,   /* the deadline passed: here[r] = 1 for the ranks that answered the roll
                              call (their records at all + r * n); the rendezvous is abandoned and
                              this object must not be asked for another */
    MP_COMM_NOTICE = 2,    /* another rank gave up (give_up): its words in error() */
};

typedef struct mp_comm {
    const char *name;                 /* the library and its version, for messages */
    int rank, size;                   /* in the world (MPI_COMM_WORLD) */
    int local_rank, local_size;       /* among the processes of this machine */
    /* in place over n elements of dt (f32 or i32) */
    int (*all_reduce)(void *buf, int64_t n, mp_dtype dt, mp_coll_op op);
    int (*broadcast)(void *buf, int64_t nbytes, int root);
    /* each process's nbytes of send at recv + rank * nbytes */
    int (*all_gather)(const void *send, void *recv, int64_t nbytes);
    /* the rendezvous: rec's n values (n <= MP_COMM_MAXREC); out[i] their
     * largest over the world, out[n + i] their smallest. Waits at most
     * timeout seconds (INFINITY: as long as it takes); all (size * n) and
     * here (size) are for MP_COMM_TIMEOUT's roll call */
    int (*agree)(const int64_t *rec, int64_t *out, int n, double timeout, int64_t *all, unsigned char *here);
    /* every rank's record at all + r * n (after a disagreement, to name the
     * ranks); returns as agree, the roll call's answers in roll/here */
    int (*gather)(const int64_t *rec, int64_t *all, int n, double timeout, int64_t *roll, unsigned char *here);
    /* this rank stops waiting for good: every other rank's next (or current)
     * agree or gather returns MP_COMM_NOTICE with why */
    void (*give_up)(const char *why);
    int (*finalize)(void);
    /* end every process of the job now (a script failed on this one) */
    void (*abort)(int code);
    const char *(*error)(void);
} mp_comm;

/* NULL with the reason in why when MPI cannot start */
typedef const mp_comm *(*mp_comm_init_fn)(char *why, size_t cap);

#endif
