/*
 * mpi_comm.c: kernels/comm.h over MPI (Open MPI from Debian's packages).
 * Built with mpicc into build/mp/mpi.so, which the engine loads at
 * mp.dist.init() under mpirun; nothing else in mpengine links MPI.
 *
 * Errors come back as return codes (MPI_ERRORS_RETURN on the world) with
 * MPI's own message, not as MPI's default abort. Counts above INT_MAX (MPI's
 * int counts) go in chunks.
 *
 * The rendezvous (agree, gather) is MPI's nonblocking collective polled with
 * MPI_Test against a deadline: MPI's blocking calls cannot be timed out, and
 * a rank that never comes would hold the others for ever. While it polls, a
 * rank serves the side channel (a duplicate of the world, point to point):
 * roll calls, answered with its record, and other ranks' notices that they
 * gave up. Nothing is sent on it unless a deadline passes.
 */
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <mpi.h>
#include "kernels/comm.h"

static mp_comm comm;
static char err[MPI_MAX_ERROR_STRING + 1200];   /* room for another rank's notice */
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
    if (dt == MP_U8) return MPI_UINT8_T;
    if (dt == MP_F64) return MPI_DOUBLE;
    return MPI_FLOAT;
}

static size_t size_of(mp_dtype dt) { return mp_dtype_size(dt); }

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

/* ---- the rendezvous ---- */

enum { TAG_QUERY = 1, TAG_HERE = 2, TAG_NOTICE = 3 };
#define ROLL_CALL_S 1.0   /* how long a roll call waits for answers: waiting ranks answer within a few ms */
#define NOTICE_MAX 1024

static MPI_Comm side;                   /* roll calls, answers, notices */
static int64_t seq;                     /* rendezvous so far: a roll call names the one it is for */
static bool abandoned;                  /* a rendezvous timed out: its request is still MPI's */
/* agree's and gather's buffers: after an abandoned wait MPI may still write
 * them, so they live here, never on a stack, and are never freed */
static int64_t red_in[2 * MP_COMM_MAXREC], red_out[2 * MP_COMM_MAXREC], gath_in[MP_COMM_MAXREC];
static int64_t *gath;                   /* size * MP_COMM_MAXREC */
static char notice_out[NOTICE_MAX];
static struct {                         /* the roll call in progress: where answers go */
    int64_t id;
    int n;
    int64_t *all;
    unsigned char *here;
} roll;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* between two polls: nothing for the first 2 ms, as MPI's blocking calls
 * spin (the other ranks are usually a few microseconds away, and a yield on
 * a busy machine gives the core away for a whole time slice); then yield the
 * core until 50 ms; then sleep a millisecond (a long wait, where 1 ms is
 * nothing, and a rank waiting for minutes should not hold a core) */
static void pause_after(double waited)
{
    if (waited < 0.002) return;
    if (waited < 0.05) sched_yield();
    else nanosleep(&(struct timespec){0, 1000000}, NULL);
}

/* every message waiting on the side channel: a roll call is answered with
 * rec, an answer to this rank's roll call is kept, a notice is returned */
static int serve(const int64_t *rec, int n)
{
    for (;;) {
        int flag = 0, rc;
        MPI_Status st;
        if ((rc = MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, side, &flag, &st)) != MPI_SUCCESS) return fail(rc, "MPI_Iprobe");
        if (!flag) return 0;
        int src = st.MPI_SOURCE;
        if (st.MPI_TAG == TAG_QUERY) {
            int64_t id, reply[1 + MP_COMM_MAXREC];
            if ((rc = MPI_Recv(&id, 1, MPI_INT64_T, src, TAG_QUERY, side, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                return fail(rc, "MPI_Recv");
            reply[0] = id;
            memcpy(reply + 1, rec, sizeof *rec * (size_t)n);
            /* small: MPI sends it eagerly, and the asking rank is polling */
            if ((rc = MPI_Send(reply, 1 + n, MPI_INT64_T, src, TAG_HERE, side)) != MPI_SUCCESS) return fail(rc, "MPI_Send");
        } else if (st.MPI_TAG == TAG_HERE) {
            int64_t reply[1 + MP_COMM_MAXREC];
            int count = 0;
            MPI_Get_count(&st, MPI_INT64_T, &count);
            if ((rc = MPI_Recv(reply, 1 + MP_COMM_MAXREC, MPI_INT64_T, src, TAG_HERE, side, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                return fail(rc, "MPI_Recv");
            if (roll.all && reply[0] == roll.id && count == 1 + roll.n) {   /* else an answer to an older roll call */
                roll.here[src] = 1;
                memcpy(roll.all + (size_t)src * (size_t)roll.n, reply + 1, sizeof *reply * (size_t)roll.n);
            }
        } else {
            char words[NOTICE_MAX];
            if ((rc = MPI_Recv(words, NOTICE_MAX, MPI_CHAR, src, st.MPI_TAG, side, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
                return fail(rc, "MPI_Recv");
            words[NOTICE_MAX - 1] = 0;
            snprintf(err, sizeof err, "%s", words);
            return MP_COMM_NOTICE;
        }
    }
}

/* the deadline passed: ask every other rank where it is, and listen for a
 * second; the rendezvous itself may still complete meanwhile (a rank that
 * arrived just late), which ends the wait as if nothing happened */
static int roll_call(MPI_Request *req, const int64_t *rec, int n, int64_t *all, unsigned char *here)
{
    /* the id each query carries: MPI may read it after this call, so a
     * fresh one each time (a roll call or two in a job) */
    int64_t *id = malloc(sizeof *id);
    if (!id) return snprintf(err, sizeof err, "out of memory for a roll call"), -1;
    *id = seq;
    memset(here, 0, (size_t)comm.size);
    here[comm.rank] = 1;
    memcpy(all + (size_t)comm.rank * (size_t)n, rec, sizeof *rec * (size_t)n);
    roll.id = seq, roll.n = n, roll.all = all, roll.here = here;
    for (int r = 0; r < comm.size; r++) {
        MPI_Request q;
        if (r != comm.rank && MPI_Isend(id, 1, MPI_INT64_T, r, TAG_QUERY, side, &q) == MPI_SUCCESS) MPI_Request_free(&q);
    }
    int rc = MP_COMM_TIMEOUT;
    for (double end = now() + ROLL_CALL_S; now() < end;) {
        int done = 0, r2 = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (r2 != MPI_SUCCESS) { rc = fail(r2, "MPI_Test"); break; }
        if (done) { rc = 0; break; }
        if ((r2 = serve(rec, n))) { rc = r2; break; }
        pause_after(1);
    }
    roll.all = NULL;
    if (rc) abandoned = true;
    return rc;
}

static int wait_for(MPI_Request *req, const int64_t *rec, int n, double timeout, int64_t *all, unsigned char *here)
{
    double start = now();
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return abandoned = true, fail(rc, "MPI_Test");
        /* done or not, a notice counts: a rank that gave up may have sent its
         * part of this rendezvous before it did, and then takes no part in
         * what follows it */
        if ((rc = serve(rec, n))) return abandoned = !done, rc;
        if (done) return 0;
        double waited = now() - start;
        if (waited >= timeout) return roll_call(req, rec, n, all, here);
        pause_after(waited);
    }
}

static int refuse(void) { return snprintf(err, sizeof err, "an earlier rendezvous was abandoned: MPI takes no more"), -1; }

static int c_agree(const int64_t *rec, int64_t *out, int n, double timeout, int64_t *all, unsigned char *here)
{
    if (abandoned) return refuse();
    seq++;
    for (int i = 0; i < n; i++) red_in[i] = rec[i], red_in[n + i] = -rec[i];   /* the max of -x: the min of x */
    MPI_Request req;
    int rc = MPI_Iallreduce(red_in, red_out, 2 * n, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Iallreduce");
    if ((rc = wait_for(&req, rec, n, timeout, all, here))) return rc;
    for (int i = 0; i < n; i++) out[i] = red_out[i], out[n + i] = -red_out[n + i];
    return 0;
}

static int c_gather(const int64_t *rec, int64_t *all, int n, double timeout, int64_t *roll_all, unsigned char *here)
{
    if (abandoned) return refuse();
    seq++;
    memcpy(gath_in, rec, sizeof *rec * (size_t)n);
    MPI_Request req;
    int rc = MPI_Iallgather(gath_in, n, MPI_INT64_T, gath, n, MPI_INT64_T, MPI_COMM_WORLD, &req);
    if (rc != MPI_SUCCESS) return fail(rc, "MPI_Iallgather");
    if ((rc = wait_for(&req, rec, n, timeout, roll_all, here))) return rc;
    memcpy(all, gath, sizeof *all * (size_t)n * (size_t)comm.size);
    return 0;
}

static void c_give_up(const char *why)
{
    snprintf(notice_out, sizeof notice_out, "%s", why);
    for (int r = 0; r < comm.size; r++) {
        MPI_Request q;
        if (r != comm.rank &&
            MPI_Isend(notice_out, (int)strlen(notice_out) + 1, MPI_CHAR, r, TAG_NOTICE, side, &q) == MPI_SUCCESS)
            MPI_Request_free(&q);
    }
    abandoned = true;
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
    /* the rendezvous's side channel and gather's buffer */
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &side);
    if (rc != MPI_SUCCESS) {
        fail(rc, "MPI_Comm_dup");
        snprintf(why, cap, "%s", err);
        return NULL;
    }
    MPI_Comm_set_errhandler(side, MPI_ERRORS_RETURN);
    if (!(gath = malloc(sizeof *gath * MP_COMM_MAXREC * (size_t)comm.size))) {
        snprintf(why, cap, "out of memory for the rendezvous");
        return NULL;
    }
    int len = 0;
    MPI_Get_library_version(lib_name, &len);
    char *nl = strpbrk(lib_name, ",\n");   /* "Open MPI v4.1.4, package: ..." -> the first part */
    if (nl) *nl = 0;
    comm.name = lib_name;
    comm.all_reduce = c_all_reduce;
    comm.broadcast = c_broadcast;
    comm.all_gather = c_all_gather;
    comm.agree = c_agree;
    comm.gather = c_gather;
    comm.give_up = c_give_up;
    comm.finalize = c_finalize;
    comm.abort = c_abort;
    comm.error = c_error;
    return &comm;
}
