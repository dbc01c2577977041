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
 */
#ifndef MP_COMM_H
#define MP_COMM_H

#include "kernels/backend.h"

typedef struct mp_comm {
    const char *name;                 /* the library and its version, for messages */
    int rank, size;                   /* in the world (MPI_COMM_WORLD) */
    int local_rank, local_size;       /* among the processes of this machine */
    /* in place over n elements of dt (f32, i32, or f64 given as MP_NDTYPES) */
    int (*all_reduce)(void *buf, int64_t n, mp_dtype dt, mp_coll_op op);
    int (*broadcast)(void *buf, int64_t nbytes, int root);
    /* each process's nbytes of send at recv + rank * nbytes */
    int (*all_gather)(const void *send, void *recv, int64_t nbytes);
    int (*barrier)(void);
    int (*finalize)(void);
    /* end every process of the job now (a script failed on this one) */
    void (*abort)(int code);
    const char *(*error)(void);
} mp_comm;

/* the f64 "dtype" of all_reduce: host doubles (the engine's own small vectors) */
#define MP_COMM_F64 MP_NDTYPES

/* NULL with the reason in why when MPI cannot start */
typedef const mp_comm *(*mp_comm_init_fn)(char *why, size_t cap);

#endif
