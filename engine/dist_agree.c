/*
 * dist_agree.c: the ranks' rendezvous before each collective
 * (engine/dist_agree.h): what each rank calls as a record, the reduction
 * that compares them, and the words when they differ, when a rank has left,
 * when one does not come.
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/dist_agree.h"
#include "engine/error.h"

/* a record: what one rank calls */
enum { R_KIND, R_ARG, R_DTYPE, R_DEV, R_NDIM, R_DIMS, REC_N = R_DIMS + MP_MAXDIM };
_Static_assert(REC_N <= MP_COMM_MAXREC, "a record fits the rendezvous");

#define MSG 1024

static struct {
    const mp_comm *comm;
    double timeout;
    int64_t *all, *roll;       /* size * REC_N: every rank's record (a disagreement), a roll call's answers */
    unsigned char *here;       /* size: who answered the roll call */
    char left[MSG], broken[MSG];
} A = {.timeout = MP_DIST_TIMEOUT_DEFAULT};

int mp_dist_set_timeout(double seconds)
{
    if (!(seconds > 0)) return mp_fail(MP_EINVAL, "the timeout must be a number of seconds > 0 (got %g)", seconds);
    A.timeout = seconds;
    return 0;
}

double mp_dist_timeout(void) { return A.timeout; }
const char *mp_dist_left(void) { return A.left[0] ? A.left : NULL; }
const char *mp_dist_broken(void) { return A.broken[0] ? A.broken : NULL; }

int mp_dist_agree_begin(const mp_comm *c)
{
    size_t n = (size_t)c->size;
    if (!(A.all = malloc(sizeof *A.all * REC_N * n)) || !(A.roll = malloc(sizeof *A.roll * REC_N * n)) ||
        !(A.here = malloc(n))) {
        free(A.all), free(A.roll), A.all = A.roll = NULL;
        return mp_fail(MP_EOOM, "out of memory for the ranks' rendezvous");
    }
    A.comm = c;
    return 0;
}

/* ---- words ---- */

static const char *op_name(int64_t op)
{
    static const char *names[] = {"sum", "mean", "max", "min"};
    return op >= 0 && op < 4 ? names[op] : "?";
}

/* "all_reduce (sum) of f32 {2,4} on cpu" */
static const char *describe(const int64_t *r, char *buf, size_t cap)
{
    char sh[200];
    int nd = r[R_NDIM] < 0 ? 0 : r[R_NDIM] > MP_MAXDIM ? MP_MAXDIM : (int)r[R_NDIM];
    mp_shape_str(nd, r + R_DIMS, sh, sizeof sh);
    const char *dt = mp_dtype_name((mp_dtype)r[R_DTYPE]), *dev = mp_device_name((mp_device)r[R_DEV]);
    long long arg = (long long)r[R_ARG];
    switch (r[R_KIND]) {
    case MP_DK_ALL_REDUCE: snprintf(buf, cap, "all_reduce (%s) of %s %s on %s", op_name(arg), dt, sh, dev); break;
    case MP_DK_BROADCAST: snprintf(buf, cap, "broadcast (root %lld) of %s %s on %s", arg, dt, sh, dev); break;
    case MP_DK_ALL_GATHER: snprintf(buf, cap, "all_gather of %s %s on %s", dt, sh, dev); break;
    case MP_DK_BARRIER: snprintf(buf, cap, "barrier"); break;
    case MP_DK_FINALIZE: snprintf(buf, cap, "finalize"); break;
    case MP_DK_GRADS: snprintf(buf, cap, "the gradient average (a bucket of %s %s on %s)", dt, sh, dev); break;
    case MP_DK_FINDINGS: snprintf(buf, cap, "the loss scaler's findings (%s %s on %s)", dt, sh, dev); break;
    case MP_DK_ATTACH:
        snprintf(buf, cap, "a data-parallel optimizer's start (%lld parameters in %lld buckets)", (long long)r[R_DIMS], arg);
        break;
    default: snprintf(buf, cap, "an unknown collective (%lld)", (long long)r[R_KIND]);
    }
    return buf;
}

/* the first field the ranks differ in, as the error names it (lo/hi: each field's min and max) */
static const char *what_differs(const int64_t *hi, const int64_t *lo)
{
    int k = (int)hi[R_KIND];
    if (hi[R_KIND] != lo[R_KIND]) return "the collective";
    if (k == MP_DK_ATTACH)
        return hi[R_DIMS] != lo[R_DIMS] ? "the number of parameters" : "the number of buckets";
    if (hi[R_DEV] != lo[R_DEV]) return "the tensor's device";
    if (hi[R_DTYPE] != lo[R_DTYPE]) return "the tensor's dtype";
    for (int i = R_NDIM; i < REC_N; i++)
        if (hi[i] != lo[i]) return k == MP_DK_GRADS ? "the bucket's size" : "the tensor's shape";
    return k == MP_DK_ALL_REDUCE ? "the op" : k == MP_DK_BROADCAST ? "the root" : "the arguments";
}

/* "rank 1", "ranks 0, 2", "ranks 0, 2, 3, 5 and 12 more" */
static void ranks_str(char *buf, size_t cap, const int *ranks, int n)
{
    size_t k = (size_t)snprintf(buf, cap, n == 1 ? "rank" : "ranks");
    for (int i = 0; i < n && i < 4 && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s %d", i ? "," : "", ranks[i]);
    if (n > 4 && k < cap) snprintf(buf + k, cap - k, " and %d more", n - 4);
}

static size_t add(char *buf, size_t k, const char *fmt, const char *a, const char *b)
{
    if (k < MSG) k += (size_t)snprintf(buf + k, MSG - k, fmt, a, b);
    return k;
}

/* the ranks grouped by what they call ("rank 0 calls X; rank 1 calls Y"),
 * from every rank's record at all; skip: a kind left out (finalize, said
 * already); verb: "calls"/"call" or "waits in"/"wait in" */
static size_t groups(char *buf, size_t k, const int64_t *all, int size, int skip, const char *one, const char *many)
{
    int *ranks = malloc(sizeof *ranks * (size_t)size);
    char *done = calloc((size_t)size, 1);
    if (!ranks || !done) {
        free(ranks), free(done);
        return add(buf, k, "%s%s", "; (out of memory naming the ranks)", "");
    }
    int shown = 0;
    for (int r = 0; r < size; r++) {
        const int64_t *rec = all + (size_t)r * REC_N;
        if (done[r] || rec[R_KIND] == skip) continue;
        int n = 0;
        for (int s = r; s < size; s++)
            if (!done[s] && memcmp(rec, all + (size_t)s * REC_N, sizeof *rec * REC_N) == 0) ranks[n++] = s, done[s] = 1;
        char who[96], what[300];
        ranks_str(who, sizeof who, ranks, n);
        if (shown++ == 4) {
            k = add(buf, k, "%s%s", "; and others", "");
            break;
        }
        k = add(buf, k, shown > 1 ? "; %s %s" : "%s %s", who, n == 1 ? one : many);
        k = add(buf, k, " %s%s", describe(rec, what, sizeof what), "");
    }
    free(ranks), free(done);
    return k;
}

/* ---- the outcomes ---- */

/* the ranks' records differ (every rank got the same max and min, so every
 * rank is here, in the same words) */
static int disagree(const int64_t *hi, const int64_t *lo)
{
    const mp_comm *c = A.comm;
    char msg[MSG];
    int *gone = malloc(sizeof *gone * (size_t)c->size), n = 0;
    if (!gone) return mp_fail(MP_EOOM, "out of memory naming the ranks");
    for (int r = 0; r < c->size; r++)
        if (A.all[(size_t)r * REC_N + R_KIND] == MP_DK_FINALIZE) gone[n++] = r;
    size_t k = 0;
    if (n) {   /* some finalize while the others wait in a collective: none can run after */
        char who[96];
        ranks_str(who, sizeof who, gone, n);
        k = add(msg, k, "%s finalized while %s", who, "");
        groups(msg, k, A.all, c->size, MP_DK_FINALIZE, "waits in", "wait in");
        snprintf(A.left, sizeof A.left, "%s", msg);
    } else {
        k = add(msg, k, "the ranks disagree on %s: %s", what_differs(hi, lo), "");
        groups(msg, k, A.all, c->size, -1, "calls", "call");
    }
    free(gone);
    return mp_fail(MP_EINVAL, "%s", msg);
}

/* this rank's deadline passed: name who did not arrive, tell the others, and
 * keep the world broken */
static int timed_out(const int64_t *rec, double limit)
{
    const mp_comm *c = A.comm;
    char mine[300], msg[MSG];
    int *absent = calloc((size_t)c->size, sizeof *absent), n = 0;
    if (!absent) return mp_fail(MP_EOOM, "out of memory naming the ranks");
    bool elsewhere = false;   /* ranks that answered from another rendezvous than this one */
    for (int r = 0; r < c->size; r++) {
        int64_t *their = A.roll + (size_t)r * REC_N;
        if (!A.here[r]) absent[n++] = r;
        if (!A.here[r] || memcmp(their, rec, sizeof *rec * REC_N) == 0) their[R_KIND] = -1;   /* not named below */
        else elsewhere = true;
    }
    char who[96];
    ranks_str(who, sizeof who, absent, n);
    size_t k = (size_t)snprintf(msg, sizeof msg, "rank %d timed out after %g s waiting in %s: ", c->rank, limit,
                                describe(rec, mine, sizeof mine));
    k = add(msg, k, "%s%s", n ? who : "every rank answered, but the rendezvous did not complete", n ? " did not arrive" : "");
    if (elsewhere) groups(msg, add(msg, k, "%s%s", "; ", ""), A.roll, c->size, -1, "waits in", "wait in");
    free(absent);
    c->give_up(msg);
    snprintf(A.broken, sizeof A.broken, "%s", msg);
    return mp_fail(MP_EDEVICE, "%s (mp.dist.init{timeout = seconds})", msg);
}

static int failed(int rc, const int64_t *rec, double limit)
{
    if (rc == MP_COMM_TIMEOUT) return timed_out(rec, limit);
    /* another rank gave up (its words), or MPI failed mid-rendezvous: either way a
     * rank may be left in it, and no collective can trust the world again */
    snprintf(A.broken, sizeof A.broken, "%s", A.comm->error());
    return mp_fail(MP_EDEVICE, "%s", A.broken);
}

int mp_dist_agree(mp_dist_kind k, int64_t arg, mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    const mp_comm *c = A.comm;
    if (!c || c->size == 1) return 0;
    if (A.broken[0]) return mp_fail(MP_EDEVICE, "no collective can run any more: %s", A.broken);
    if (A.left[0]) return mp_fail(MP_EINVAL, "no collective can run any more: %s", A.left);
    int64_t rec[REC_N] = {[R_KIND] = k, [R_ARG] = arg, [R_DTYPE] = dt, [R_DEV] = dev, [R_NDIM] = ndim};
    for (int i = 0; i < ndim && i < MP_MAXDIM; i++) rec[R_DIMS + i] = shape[i];
    /* finalize waits as MPI_Finalize would: for every rank's next rendezvous,
     * however long it computes before it */
    double limit = k == MP_DK_FINALIZE ? INFINITY : A.timeout;
    int64_t out[2 * REC_N];
    int rc = c->agree(rec, out, REC_N, limit, A.roll, A.here);
    if (rc) return failed(rc, rec, limit);
    if (memcmp(out, out + REC_N, sizeof rec) == 0) return 0;
    if ((rc = c->gather(rec, A.all, REC_N, limit, A.roll, A.here))) return failed(rc, rec, limit);
    return disagree(out, out + REC_N);
}
