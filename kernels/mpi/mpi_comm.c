/*
 * mpi_comm.c: kernels/comm.h over MPI (Open MPI from Debian's packages).
 * Built with mpicc into build/mp/mpi.so, which the engine loads at
 * mp.dist.init() under mpirun; nothing else in mpengine links MPI.
 *
 * Errors come back as return codes (MPI_ERRORS_RETURN on the world) with
 * MPI's own message, not as MPI's default abort. Counts above INT_MAX (MPI's
 * int counts) go in chunks.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mpi.h>
#include "kernels/comm.h"

static mp_comm comm;
static char err[MPI_MAX_ERROR_STRING + 128];
static char lib_name[MPI_MAX_LIBRARY_VERSION_STRING + 1];

static int fail(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    snprintf(err, sizeof err, "%s: %s", what, msg);
    return -1;
}

static const char *c_error(void) { return err; }

static MPI_Datatype type_of(mp_dtype dt)
{
    if (dt == MP_I32) return MPI_INT32_T;
    if (dt == (mp_dtype)MP_COMM_F64) return MPI_DOUBLE;
    if (dt == MP_U8) return MPI_UINT8_T;
    return MPI_FLOAT;
}

static size_t size_of(mp_dtype dt) { return dt == (mp_dtype)MP_COMM_F64 ? 8 : mp_dtype_size(dt); }

static MPI_Op op_of(mp_coll_op op) { return op == MP_COLL_MAX ? MPI_MAX : op == MP_COLL_MIN ? MPI_MIN : MPI_SUM; }

static int c_all_reduce(void *buf, int64_t n, mp_dtype dt, mp_coll_op op)
{
    for (int64_t done = 0; done < n;) {
        int k = n - done > INT_MAX ? INT_MAX : (int)(n - done);
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)done * size_of(dt), k, type_of(dt), op_of(op),
                               MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return fail(rc, "MPI_Allreduce");
        done += k;
    }
    return 0;
}

static int c_broadcast(void *buf, int64_t nbytes, int root)
{
    for (int64_t done = 0; done < nbytes;) {
        int k = nbytes - done > INT_MAX ? INT_MAX : (int)(nbytes - done);
        int rc = MPI_Bcast((char *)buf + done, k, MPI_BYTE, root, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return fail(rc, "MPI_Bcast");
        done += k;
    }
    return 0;
}

static int c_all_gather(const void *send, void *recv, int64_t nbytes)
{
    if (nbytes > INT_MAX) {   /* one broadcast per rank: each chunked */
        for (int r = 0; r < comm.size; r++) {
            char *dst = (char *)recv + (size_t)r * (size_t)nbytes;
            if (r == comm.rank) memcpy(dst, send, (size_t)nbytes);
            if (c_broadcast(dst, nbytes, r)) return -1;
        }
        return 0;
    }
    int rc = MPI_Allgather(send, (int)nbytes, MPI_BYTE, recv, (int)nbytes, MPI_BYTE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Allgather");
}

static int c_barrier(void)
{
    int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Barrier");
}

static int c_finalize(void)
{
    int done = 0;
    MPI_Finalized(&done);
    if (done) return 0;
    int rc = MPI_Finalize();
    return rc == MPI_SUCCESS ? 0 : fail(rc, "MPI_Finalize");
}

static void c_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

const mp_comm *mp_mpi_comm_init(char *why, size_t cap)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided, rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            fail(rc, "MPI_Init_thread");
            snprintf(why, cap, "%s", err);
            return NULL;
        }
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &comm.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &comm.size);
    MPI_Comm local;   /* the processes that share this machine's memory */
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, comm.rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_rank(local, &comm.local_rank);
        MPI_Comm_size(local, &comm.local_size);
        MPI_Comm_free(&local);
    } else {
        comm.local_rank = comm.rank, comm.local_size = comm.size;
    }
    int len = 0;
    MPI_Get_library_version(lib_name, &len);
    char *nl = strpbrk(lib_name, ",\n");   /* "Open MPI v4.1.4, package: ..." -> the first part */
    if (nl) *nl = 0;
    comm.name = lib_name;
    comm.all_reduce = c_all_reduce;
    comm.broadcast = c_broadcast;
    comm.all_gather = c_all_gather;
    comm.barrier = c_barrier;
    comm.finalize = c_finalize;
    comm.abort = c_abort;
    comm.error = c_error;
    return &comm;
}
