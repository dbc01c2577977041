/*
 * dist.c: mp.dist: the world and its collectives, and one bucket of a
 * data-parallel average (engine/dist.h; the buckets are engine/dist_dp.c's).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/dist.h"
#include "engine/dist_agree.h"
#include "engine/ops.h"
#include "engine/error.h"
#include "kernels/comm.h"

/* this process's place in the world, and what carries its collectives */
static struct {
    bool inited, finalized, device_self;
    int rank, size, local_rank, local_size;
    const mp_comm *comm;                 /* NULL: a world of one, MPI not loaded */
    bool joined[MP_NDEVICES];            /* a device backend's group is made */
    char name[300];
} world = {.size = 1, .local_size = 1};

static const char *launcher_size(void)
{
    const char *v = getenv("OMPI_COMM_WORLD_SIZE");   /* Open MPI's mpirun */
    if (!v) v = getenv("PMI_SIZE");                    /* MPICH's Hydra, Slurm's PMI */
    return v;
}

/* a script that ends (its last line, os.exit, a caught error) without
 * mp.dist.finalize() still leaves the world the same way: a rank waiting for
 * it in a collective learns that it left. A host calls this before it exits
 * (mpengine does); the atexit hook is the fallback for one that does not, and
 * it comes late: handlers run in the reverse order of their registration, so
 * every C++ static made after mp.dist.init (oneDNN's JIT GEMM kernels, which
 * the emulated device's queued matmuls run through when the device leaves;
 * likely too, unchecked without a GPU, the CUDA runtime's own teardown when
 * its first call came after init) is gone by then */
void mp_dist_finalize_at_exit(void)
{
    if (!world.comm || world.finalized) return;
    mp_clear_error();
    if (mp_dist_finalize() == 0) return;
    fprintf(stderr, "mp.dist.finalize at exit: %s\n", mp_error());
    fflush(stderr);
    if (!world.finalized) world.comm->abort(1);   /* MPI cannot finalize (a rank may never come): end the job */
}

int mp_dist_init(bool device_self)
{
    if (world.finalized) return mp_fail(MP_EINVAL, "mp.dist was finalized; MPI cannot start again in this process");
    if (world.inited) return 0;
    if (launcher_size()) {
        char why[1024];
        void *h = mp_module_open("mpi.so", "MP_MPI_COMM", why, sizeof why);
        if (!h) return mp_fail(MP_EINVAL, "started by a launcher (mpirun) but MPI cannot be loaded: %s", why);
        mp_comm_init_fn init = (mp_comm_init_fn)dlsym(h, "mp_mpi_comm_init");
        if (!init) return mp_fail(MP_EINVAL, "mpi.so has no mp_mpi_comm_init: %s", dlerror());
        why[0] = 0;
        const mp_comm *c = init(why, sizeof why);
        if (!c) return mp_fail(MP_EINVAL, "MPI did not start: %s", why);
        if (mp_dist_agree_begin(c)) return -1;
        world.comm = c;
        world.rank = c->rank, world.size = c->size, world.local_rank = c->local_rank, world.local_size = c->local_size;
        snprintf(world.name, sizeof world.name, "%s", c->name);
        atexit(mp_dist_finalize_at_exit);
    } else {
        snprintf(world.name, sizeof world.name, "a world of one (no launcher: MPI not loaded)");
    }
    world.device_self = device_self;
    world.inited = true;
    return 0;
}

bool mp_dist_initialized(void) { return world.inited && !world.finalized; }
int mp_dist_rank(void) { return world.rank; }
int mp_dist_size(void) { return world.size; }
int mp_dist_local_rank(void) { return world.local_rank; }
int mp_dist_local_size(void) { return world.local_size; }
const char *mp_dist_backend(void) { return world.inited ? world.name : "not started"; }

static const mp_backend *device_coll(mp_device dev);

bool mp_dist_spans(mp_device dev)
{
    if (!mp_dist_initialized()) return false;
    return world.size > 1 || (world.device_self && device_coll(dev));
}

static int ready(void)
{
    if (world.finalized) return mp_fail(MP_EINVAL, "mp.dist was finalized");
    if (!world.inited) return mp_fail(MP_EINVAL, "call mp.dist.init() first");
    return 0;
}

static int comm_fail(void) { return mp_fail(MP_EDEVICE, "%s", world.comm->error()); }

/* the device backend's group, made at its first collective: rank 0's bytes to everyone */
static int join(mp_device dev, const mp_backend *be)
{
    if (world.joined[dev]) return 0;
    unsigned char id[512];
    char why[512] = "";
    int n = 0;
    if (world.rank == 0 && (n = be->coll_id(be->ctx, id, sizeof id, why, sizeof why)) < 0) n = -1;
    if (world.comm) {   /* the id's length (or -1: rank 0 failed) first, so every rank stops together */
        int32_t len = n;
        if (world.comm->broadcast(&len, sizeof len, 0)) return comm_fail();
        if (len < 0) return mp_fail(MP_EDEVICE, "%s: the group could not be made on rank 0%s%s", be->name,
                                    why[0] ? ": " : "", why);
        n = len;
        if (world.comm->broadcast(id, n, 0)) return comm_fail();
    } else if (n < 0) {
        return mp_fail(MP_EDEVICE, "%s: %s", be->name, why);
    }
    if (be->coll_join(be->ctx, id, (size_t)n, world.rank, world.size, why, sizeof why))
        return mp_fail(MP_EDEVICE, "%s: %s", be->name, why);
    world.joined[dev] = true;
    return 0;
}

/* the device's collectives, or NULL when its memory is staged through the host */
static const mp_backend *device_coll(mp_device dev)
{
    const mp_backend *be = dev == MP_CPU ? NULL : mp_backend_of(dev);
    return be && be->coll_all_reduce && be->coll_id && be->coll_join ? be : NULL;
}

/* n values at p reduced over the world, after the rendezvous */
static int reduce_raw(mp_device dev, void *p, int64_t n, mp_dtype dt, mp_coll_op op)
{
    if (!mp_dist_spans(dev) || n == 0) return 0;
    const mp_backend *be = device_coll(dev);
    if (be) {
        if (join(dev, be)) return -1;
        be->coll_all_reduce(be->ctx, dt, p, n, op);
        return mp_device_error(dev);
    }
    if (!world.comm) return 0;   /* device_self without device collectives: nothing to do */
    if (dev == MP_CPU) return world.comm->all_reduce(p, n, dt, op) ? comm_fail() : 0;
    size_t bytes = (size_t)n * mp_dtype_size(dt);
    void *h = malloc(bytes);
    if (!h) return mp_fail(MP_EOOM, "out of memory staging %zu bytes for MPI", bytes);
    const mp_backend *d = mp_backend_of(dev);
    int rc = mp_host_read(dev, h, p, bytes);
    if (!rc && world.comm->all_reduce(h, n, dt, op)) rc = comm_fail();
    if (!rc) d->from_host(d->ctx, p, h, bytes), rc = mp_device_error(dev);
    free(h);
    return rc;
}

int mp_dist_reduce_raw(mp_device dev, void *p, int64_t n, mp_dtype dt, mp_coll_op op)
{
    if (!mp_dist_spans(dev) || n == 0) return 0;
    if (mp_dist_agree(MP_DK_FINDINGS, op, dt, dev, 1, &n)) return -1;
    return reduce_raw(dev, p, n, dt, op);
}

/* ---- the public collectives ---- */

/* Every rank must call the same collective with the same shape, dtype, op
 * or root (MPI and NCCL read or write out of bounds, or wait for ever,
 * otherwise): the rendezvous compares them first (engine/dist_agree.h). */
static int agree(mp_dist_kind k, int64_t arg, const mp_tensor *t)
{
    return mp_dist_agree(k, arg, t->dtype, t->dev, t->ndim, t->shape);
}

/* the tensor's bytes in host memory as f32, f64 or i32 (MPI's types): t itself
 * on the CPU, else a copy; written back by put_back */
static mp_tensor *host_copy(mp_tensor *t)
{
    mp_dtype wide = t->dtype == MP_I32 || t->dtype == MP_F64 ? t->dtype : MP_F32;
    if (t->dev == MP_CPU && t->dtype == wide) return mp_retain(t);
    return mp_to_raw(t, wide, MP_CPU);
}

static int put_back(mp_tensor *t, mp_tensor *h)
{
    if (h == t) return 0;
    mp_tensor *c = mp_to_raw(h, t->dtype, t->dev);
    if (!c) return -1;
    MP_K(t, copy, mp_data(t), mp_data(c), mp_nbytes(t));
    mp_release(c);
    return t->dev != MP_CPU ? mp_device_error(t->dev) : 0;
}

int mp_dist_all_reduce(mp_tensor *t, mp_dist_op op)
{
    if (ready()) return -1;
    if ((unsigned)op > MP_DIST_MIN) return mp_fail(MP_EINVAL, "unknown op %d", (int)op);
    /* the checks of the tensor itself come after the rendezvous: a rank whose
     * tensor differs learns it there with the others, and ranks that agree
     * on a tensor refused here all refuse it (none is left waiting) */
    if (agree(MP_DK_ALL_REDUCE, op, t)) return -1;
    if (t->dtype == MP_U8) return mp_fail(MP_EINVAL, "t is u8: reduce f32, f16, bf16 or i32 tensors");
    if (t->dtype == MP_I32 && op == MP_DIST_MEAN)
        return mp_fail(MP_EINVAL, "\"mean\" of an i32 tensor (reduce with \"sum\" and divide as you need)");
    if (!mp_dist_spans(t->dev)) return 0;
    mp_coll_op cop = op == MP_DIST_MAX ? MP_COLL_MAX : op == MP_DIST_MIN ? MP_COLL_MIN : MP_COLL_SUM;
    int rc;
    if (device_coll(t->dev)) {
        rc = reduce_raw(t->dev, mp_data(t), t->numel, t->dtype, cop);
    } else {
        mp_tensor *h = host_copy(t);
        if (!h) return -1;
        rc = world.comm && world.comm->all_reduce(mp_data(h), h->numel, h->dtype, cop) ? comm_fail() : 0;
        if (!rc && op == MP_DIST_MEAN && h != t) {
            MP_K(h, unary, MP_MULS, h->dtype, mp_data(h), mp_data(h), h->numel, 1.0 / world.size);
            op = MP_DIST_SUM;   /* divided already, before the rounding to t's dtype */
        }
        if (!rc) rc = put_back(t, h);
        mp_release(h);
    }
    if (!rc && op == MP_DIST_MEAN) MP_K(t, unary, MP_MULS, t->dtype, mp_data(t), mp_data(t), t->numel, 1.0 / world.size);
    t->st->version++;
    return rc || t->dev == MP_CPU ? rc : mp_device_error(t->dev);
}

int mp_dist_broadcast(mp_tensor *t, int root)
{
    if (ready()) return -1;
    if (root < 0 || root >= world.size)
        return mp_fail(MP_EINVAL, "root %d is not a rank (0..%d)", root, world.size - 1);
    if (agree(MP_DK_BROADCAST, root, t)) return -1;
    if (!mp_dist_spans(t->dev)) return 0;
    const mp_backend *be = device_coll(t->dev);
    int rc = 0;
    if (be) {
        if (join(t->dev, be)) return -1;
        be->coll_broadcast(be->ctx, mp_data(t), mp_nbytes(t), root);
        rc = mp_device_error(t->dev);
    } else if (world.comm) {
        mp_tensor *h = t->dev == MP_CPU ? mp_retain(t) : mp_to_raw(t, t->dtype, MP_CPU);
        if (!h) return -1;
        rc = world.comm->broadcast(mp_data(h), (int64_t)mp_nbytes(h), root) ? comm_fail() : put_back(t, h);
        mp_release(h);
    }
    t->st->version++;
    return rc;
}

mp_tensor *mp_dist_all_gather(mp_tensor *t)
{
    if (ready()) return NULL;
    if (agree(MP_DK_ALL_GATHER, 0, t)) return NULL;   /* first, as in mp_dist_all_reduce */
    if (t->ndim == MP_MAXDIM) return mp_fail(MP_EINVAL, "t has %d dims: no room for the ranks' dim", MP_MAXDIM), NULL;
    int64_t shape[MP_MAXDIM];
    shape[0] = world.size;
    memcpy(shape + 1, t->shape, sizeof *shape * (size_t)t->ndim);
    mp_tensor *out = mp_empty(t->dtype, t->dev, t->ndim + 1, shape);
    if (!out) return NULL;
    size_t nb = mp_nbytes(t);
    const mp_backend *be = mp_dist_spans(t->dev) ? device_coll(t->dev) : NULL;
    int rc = 0;
    if (be) {
        rc = join(t->dev, be);
        if (!rc) be->coll_all_gather(be->ctx, mp_data(t), mp_data(out), nb), rc = mp_device_error(t->dev);
    } else if (!world.comm) {
        MP_K(t, copy, mp_data(out), mp_data(t), nb);
    } else {
        mp_tensor *h = t->dev == MP_CPU ? mp_retain(t) : mp_to_raw(t, t->dtype, MP_CPU);
        mp_tensor *ho = !h ? NULL : t->dev == MP_CPU ? mp_retain(out) : mp_empty(t->dtype, MP_CPU, t->ndim + 1, shape);
        rc = !ho ? -1 : world.comm->all_gather(mp_data(h), mp_data(ho), (int64_t)nb) ? comm_fail() : put_back(out, ho);
        mp_release(h);
        mp_release(ho);
    }
    if (rc) mp_release(out), out = NULL;
    return out;
}

/* the rendezvous is a barrier: no rank's completes before every rank's part is in */
int mp_dist_barrier(void)
{
    if (ready()) return -1;
    return mp_dist_agree(MP_DK_BARRIER, 0, MP_F32, MP_CPU, 0, NULL);
}

int mp_dist_finalize(void)
{
    if (!world.inited || world.finalized) return 0;
    if (mp_dist_broken())
        return mp_fail(MP_EDEVICE, "MPI cannot finalize after a collective failed (%s): the job ends (MPI_Abort) when "
                       "this process exits", mp_dist_broken());
    /* the others learn that this rank leaves: one waiting in a collective gets
     * an error naming it, not a wait without end (after a rank left, which
     * every rank saw, there is nothing to say) */
    char left[1100] = "";
    if (!mp_dist_left() && world.comm && mp_dist_agree(MP_DK_FINALIZE, 0, MP_F32, MP_CPU, 0, NULL)) {
        if (mp_dist_broken()) return -1;   /* another rank gave up meanwhile */
        snprintf(left, sizeof left, "%s", mp_error());
    }
    for (int d = 1; d < MP_NDEVICES; d++) {
        const mp_backend *be = world.joined[d] ? mp_backend_of((mp_device)d) : NULL;
        if (be && be->coll_leave) be->coll_leave(be->ctx);
        world.joined[d] = false;
    }
    world.finalized = true;
    if (world.comm && world.comm->finalize()) return comm_fail();
    return left[0] ? mp_fail(MP_EINVAL, "%s", left) : 0;
}

void mp_dist_abort(int code)
{
    if (!world.comm || world.finalized || world.size == 1) return;
    /* every rank saw a rank leave, in the same rendezvous: each fails or goes
     * on by itself, and none waits for another; MPI finalizes as usual, and
     * each rank's own error is printed in full before the job ends */
    if (mp_dist_left()) {
        mp_dist_finalize();
        return;
    }
    world.comm->abort(code);
}

/* ---- one bucket of a data-parallel gradient average (engine/dist_dp.c) ---- */

int mp_dist_reduce_bucket(mp_device dev, float *g, int64_t n, bool side)
{
    if (!mp_dist_spans(dev) || n == 0) return 0;
    if (mp_dist_agree(MP_DK_GRADS, MP_DIST_MEAN, MP_F32, dev, 1, &n)) return -1;
    const mp_backend *be = device_coll(dev);
    if (be) {   /* the sum and / size in one pass (NCCL's average) */
        if (join(dev, be)) return -1;
        if (side && be->coll_fork) be->coll_fork(be->ctx);
        be->coll_all_reduce(be->ctx, MP_F32, g, n, MP_COLL_AVG);
        return mp_device_error(dev);
    }
    if (reduce_raw(dev, g, n, MP_F32, MP_COLL_SUM)) return -1;
    const mp_backend *d = mp_backend_of(dev);   /* / size while the bucket is in cache */
    if (world.size > 1) d->unary(d->ctx, MP_MULS, MP_F32, g, g, n, 1.0 / world.size);
    return dev == MP_CPU ? 0 : mp_device_error(dev);
}

void mp_dist_reduce_done(mp_device dev)
{
    const mp_backend *be = device_coll(dev);
    if (be && be->coll_merge && world.joined[dev]) be->coll_merge(be->ctx);
}
