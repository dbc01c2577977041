/*
 * tensor.c: tensor headers, refcounted storage, per-device byte accounting.
 */
#define _GNU_SOURCE   /* dladdr */
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <dlfcn.h>
#include "engine/tensor.h"
#include "engine/error.h"

/* tables indexed by an enum are sized by their entries and checked against
 * the enum's count: a new dtype or device without its name does not compile */
static const char *dtype_names[] = {"f32", "f16", "bf16", "i32", "u8"};
_Static_assert(sizeof dtype_names / sizeof *dtype_names == MP_NDTYPES, "a name for every dtype");
static const struct { const char *alias; mp_dtype t; } dtype_aliases[] = {
    {"float32", MP_F32}, {"float", MP_F32}, {"float16", MP_F16}, {"half", MP_F16},
    {"bfloat16", MP_BF16}, {"int32", MP_I32}, {"int", MP_I32}, {"uint8", MP_U8},
    {"byte", MP_U8},
};
static const char *device_names[] = {"cpu", "cuda"};
_Static_assert(sizeof device_names / sizeof *device_names == MP_NDEVICES, "a name for every device");

const char *mp_dtype_name(mp_dtype t) { return (unsigned)t < MP_NDTYPES ? dtype_names[t] : "?"; }
const char *mp_device_name(mp_device d) { return (unsigned)d < MP_NDEVICES ? device_names[d] : "?"; }
bool mp_is_float(mp_dtype t)
{
    switch (t) {   /* no default: a new dtype must say */
    case MP_F32: case MP_F16: case MP_BF16: return true;
    case MP_I32: case MP_U8: case MP_NDTYPES: break;
    }
    return false;
}

/* the whole numbers an integer dtype holds */
static void int_range(mp_dtype dt, double *lo, double *hi)
{
    *lo = dt == MP_U8 ? 0 : -2147483648.0;
    *hi = dt == MP_U8 ? 255 : 2147483647.0;
}

bool mp_value_fits(mp_dtype dt, double v)
{
    if (mp_is_float(dt)) return true;
    double lo, hi;
    int_range(dt, &lo, &hi);
    return v >= lo && v <= hi && v == floor(v);   /* NaN fails the range */
}

int mp_check_value(mp_dtype dt, double v)
{
    if (mp_value_fits(dt, v)) return 0;
    double lo, hi;
    int_range(dt, &lo, &hi);
    return mp_fail(MP_EINVAL, "value %.17g does not fit a %s tensor (whole numbers in %.0f..%.0f)", v,
                   mp_dtype_name(dt), lo, hi);
}

int mp_dtype_parse(const char *name, mp_dtype *out)
{
    for (int i = 0; i < MP_NDTYPES; i++)
        if (strcmp(name, dtype_names[i]) == 0) return *out = i, 0;
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof *dtype_aliases; i++)
        if (strcmp(name, dtype_aliases[i].alias) == 0) return *out = dtype_aliases[i].t, 0;
    return mp_fail(MP_EINVAL, "unknown dtype '%s' (expected f32, f16, bf16, i32 or u8)", name);
}

int mp_device_parse(const char *name, mp_device *out)
{
    for (int i = 0; i < MP_NDEVICES; i++)
        if (strcmp(name, device_names[i]) == 0) return *out = i, 0;
    return mp_fail(MP_EINVAL, "unknown device '%s' (expected cpu or cuda)", name);
}

/* The CUDA backend is a shared object (build/mp/cuda.so, installed next to
 * mp/core.so) that is loaded the first time a CUDA tensor is asked for. Its init
 * returns NULL on a machine without a driver or a GPU, and so does a failed
 * load (no cuBLAS, no file): the engine then runs on the CPU alone, and
 * cuda_why says why, for mp.cuda.is_available() and the error of t:cuda(). */
static const mp_backend *backends[MP_NDEVICES] = {&mp_cpu_backend, NULL};
static bool cuda_tried;
static char cuda_why[1024];

void *mp_module_open(const char *file, const char *env_name, char *why, size_t cap)
{
    const char *env = getenv(env_name);
    if (env && *env) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        if (!h) snprintf(why, cap, "cannot load %s=%.400s: %.500s", env_name, env, dlerror());
        return h;
    }
    Dl_info info;
    if (!dladdr((void *)&mp_backend_of, &info) || !info.dli_fname) {
        snprintf(why, cap, "cannot tell where the engine was loaded from, to find %s", file);
        return NULL;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", info.dli_fname);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    /* next to mp/core.so; build/mpengine -> build/mp; a test in build/tests -> build/mp;
     * PREFIX/bin -> PREFIX/lib/lua/5.4/mp */
    static const char *rel[] = {"/", "/mp/", "/../mp/", "/../lib/lua/5.4/mp/"};
    snprintf(why, cap, "no %s next to %.600s (it is built where its toolchain is, or set %s)", file, dir, env_name);
    for (size_t i = 0; i < sizeof rel / sizeof *rel; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s%s%s", dir, rel[i], file);
        if (access(path, F_OK) != 0) continue;
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        snprintf(why, cap, "cannot load %.500s: %.400s", path, dlerror());
        return NULL;
    }
    return NULL;
}

/* dlopen's reason, or that of the first place tried that exists */
static void *open_cuda(void)
{
    void *h = mp_module_open("cuda.so", "MP_CUDA_BACKEND", cuda_why, sizeof cuda_why);
    if (!h && strncmp(cuda_why, "no cuda.so", 10) == 0) {
        char tmp[sizeof cuda_why];
        snprintf(tmp, sizeof tmp, "%s", cuda_why);
        snprintf(cuda_why, sizeof cuda_why, "the CUDA backend was not built or installed: %.900s", tmp);
    }
    return h;
}

static const mp_backend *load_cuda(void)
{
    if (getenv("MP_NO_CUDA"))
        return snprintf(cuda_why, sizeof cuda_why, "MP_NO_CUDA is set"), NULL;
    /* no NVIDIA driver: skip loading cuBLAS (about 100 ms at every start) */
    bool driver = access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0;
    if (!driver && !getenv("MP_CUDA_BACKEND"))
        return snprintf(cuda_why, sizeof cuda_why, "no NVIDIA driver on this machine "
                        "(no /dev/nvidiactl, no /proc/driver/nvidia/version)"), NULL;
    void *h = open_cuda();
    if (!h) return NULL;
    /* one GPU per process of a launcher's job (mp.dist): the process's rank on
     * this machine picks it, before CUDA starts (MP_CUDA_DEVICE, if set, wins) */
    static const char *local_rank_vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof local_rank_vars / sizeof *local_rank_vars && !getenv("MP_CUDA_DEVICE"); i++) {
        const char *v = getenv(local_rank_vars[i]);
        if (v && *v) setenv("MP_CUDA_DEVICE", v, 0);
    }
    const mp_backend *(*init)(char *, size_t) = (const mp_backend *(*)(char *, size_t))dlsym(h, "mp_cuda_backend_init");
    if (!init) return snprintf(cuda_why, sizeof cuda_why, "the CUDA backend has no mp_cuda_backend_init: %s", dlerror()), NULL;
    cuda_why[0] = 0;
    const mp_backend *be = init(cuda_why, sizeof cuda_why);
    if (!be && !cuda_why[0]) snprintf(cuda_why, sizeof cuda_why, "the CUDA backend found no usable GPU");
    return be;
}

const mp_backend *mp_backend_of(mp_device d)
{
    if (d == MP_CUDA && !cuda_tried) {
        cuda_tried = true;
        backends[MP_CUDA] = load_cuda();
    }
    return (unsigned)d < MP_NDEVICES ? backends[d] : NULL;
}

const char *mp_device_why_not(mp_device d)
{
    if (mp_backend_of(d)) return NULL;
    return d == MP_CUDA && cuda_why[0] ? cuda_why : "no backend for it";
}

int mp_device_error(mp_device d)
{
    const mp_backend *be = (unsigned)d < MP_NDEVICES ? backends[d] : NULL;
    const char *e = be && be->error ? be->error(be->ctx) : NULL;
    return e ? mp_fail(MP_EDEVICE, "%s", e) : 0;
}

mp_tensor *mp_checked(mp_tensor *t)
{
    if (t && t->dev != MP_CPU && mp_device_error(t->dev)) {
        mp_release(t);
        return NULL;
    }
    return t;
}

int mp_device_synchronize(mp_device d)
{
    const mp_backend *be = mp_backend_of(d);
    if (!be) return mp_device_check(d);
    if (be->synchronize) be->synchronize(be->ctx);
    return mp_device_error(d);
}

static int64_t host_reads;
void mp_note_host_read(void) { host_reads++; }
int64_t mp_host_reads(void) { return host_reads; }

void mp_device_counters(mp_device d, int64_t c[3])
{
    const mp_backend *be = (unsigned)d < MP_NDEVICES ? backends[d] : NULL;
    c[0] = c[1] = c[2] = 0;
    if (be && be->counters) be->counters(be->ctx, c);
}

int mp_device_check(mp_device d)
{
    if (mp_backend_of(d)) return 0;
    return mp_fail(MP_EDEVICE, "device '%s' is not available on this machine: %s", mp_device_name(d),
                   mp_device_why_not(d));
}

/* Every read of a backend's memory by the host: counted, and checked for the
 * backend's error before the bytes are used, since a copy after a fault on an
 * asynchronous device delivers nothing. On failure dst is zeroed, never left
 * as whatever the buffer held. */
int mp_host_read(mp_device d, void *dst, const void *src, size_t nbytes)
{
    mp_note_host_read();
    const mp_backend *be = mp_backend_of(d);
    if (d == MP_CPU) {
        memcpy(dst, src, nbytes);
        return 0;
    }
    if (!be) return memset(dst, 0, nbytes), mp_device_check(d);
    be->to_host(be->ctx, dst, src, nbytes);
    if (mp_device_error(d)) return memset(dst, 0, nbytes), -1;
    return 0;
}

/* ---- byte accounting ---- */

static mp_memstats stats[MP_NDEVICES];

static size_t default_limit(mp_device d)
{
    if (d != MP_CPU) return SIZE_MAX;
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psize <= 0) return SIZE_MAX;
    /* refuse clearly rather than let the kernel's OOM killer end the process */
    return (size_t)pages * (size_t)psize / 10 * 9;
}

mp_memstats mp_memory(mp_device d)
{
    if (stats[d].limit == 0) stats[d].limit = default_limit(d);
    mp_memstats m = stats[d];
    const mp_backend *be = backends[d];
    m.cached = be && be->cached ? be->cached(be->ctx) : 0;
    return m;
}

void mp_release_cache(mp_device d)
{
    const mp_backend *be = backends[d];
    if (be && be->release_cache) be->release_cache(be->ctx);
}

void mp_mark_cache(mp_device d)
{
    const mp_backend *be = backends[d];
    if (be && be->mark_cache) be->mark_cache(be->ctx);
}

void mp_set_memory_limit(mp_device d, size_t bytes) { stats[d].limit = bytes; }
void mp_reset_peak_memory(mp_device d) { stats[d].peak = stats[d].in_use; }

static mp_storage *storage_new(mp_device dev, size_t nbytes)
{
    const mp_backend *be = mp_backend_of(dev);
    if (!be) return mp_device_check(dev), NULL;
    mp_memstats *s = &stats[dev];
    if (s->limit == 0) s->limit = default_limit(dev);
    if (nbytes > s->limit || s->in_use > s->limit - nbytes) {
        mp_fail(MP_EOOM, "out of memory: cannot allocate %zu bytes on %s (%zu in use, limit %zu)",
                nbytes, mp_device_name(dev), s->in_use, s->limit);
        return NULL;
    }
    /* what the cache holds counts against the limit too: give it back first */
    if (be->cached && s->in_use + nbytes + be->cached(be->ctx) > s->limit) be->release_cache(be->ctx);
    mp_storage *st = malloc(sizeof *st);
    void *data = st ? be->alloc(be->ctx, nbytes ? nbytes : 1) : NULL;
    if (!data) {
        free(st);
        mp_fail(MP_EOOM, "out of memory: cannot allocate %zu bytes on %s", nbytes, mp_device_name(dev));
        return NULL;
    }
    *st = (mp_storage){.refs = 1, .dev = dev, .nbytes = nbytes, .data = data};
    s->in_use += nbytes;
    s->allocs++;
    if (s->in_use > s->peak) s->peak = s->in_use;
    return st;
}

void mp_storage_release(mp_storage *st)
{
    if (--st->refs > 0) return;
    mp_release(st->lowp);
    mp_backend_of(st->dev)->free(mp_backend_of(st->dev)->ctx, st->data, st->nbytes);
    stats[st->dev].in_use -= st->nbytes;
    stats[st->dev].allocs--;
    free(st);
}

/* ---- shapes ---- */

int mp_check_shape(int ndim, const int64_t *shape, int64_t *numel)
{
    if (ndim < 0 || ndim > MP_MAXDIM)
        return mp_fail(MP_EINVAL, "a tensor has at most %d dims (got %d)", MP_MAXDIM, ndim);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0)
            return mp_fail(MP_EINVAL, "size of dim %d must be positive (got %lld)", i + 1,
                           (long long)shape[i]);
        if (n > INT64_MAX / 16 / shape[i])
            return mp_fail(MP_EOOM, "out of memory: shape too large to allocate");
        n *= shape[i];
    }
    if (numel) *numel = n;
    return 0;
}

int mp_same_shape(const mp_tensor *a, const mp_tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *mp_shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t k = (size_t)snprintf(buf, len, "{");
    for (int i = 0; i < ndim && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (k < len) snprintf(buf + k, len - k, "}");
    return buf;
}

/* ---- tensors ---- */

static mp_tensor *header(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape, int64_t numel)
{
    mp_tensor *t = calloc(1, sizeof *t);
    if (!t) return mp_fail(MP_EOOM, "out of memory"), NULL;
    t->refs = 1;
    t->dtype = dt;
    t->dev = dev;
    t->ndim = ndim;
    if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * ndim);
    t->numel = numel;
    return t;
}

mp_tensor *mp_empty(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape)
{
    int64_t n;
    if ((unsigned)dt >= MP_NDTYPES) return mp_fail(MP_EINVAL, "bad dtype"), NULL;
    if (mp_check_shape(ndim, shape, &n) || mp_device_check(dev)) return NULL;
    mp_storage *st = storage_new(dev, (size_t)n * mp_dtype_size(dt));
    if (!st) return NULL;
    mp_tensor *t = header(dt, dev, ndim, shape, n);
    if (!t) return mp_storage_release(st), NULL;
    t->st = st;
    return t;
}

mp_tensor *mp_view(mp_tensor *src, int ndim, const int64_t *shape, int64_t offset)
{
    int64_t n;
    if (mp_check_shape(ndim, shape, &n)) return NULL;
    if (offset < 0 || (size_t)(offset + n) * mp_dtype_size(src->dtype) > src->st->nbytes)
        return mp_fail(MP_EINVAL, "view out of bounds of its storage"), NULL;
    mp_tensor *t = header(src->dtype, src->dev, ndim, shape, n);
    if (!t) return NULL;
    t->offset = offset;
    t->st = src->st;
    t->st->refs++;
    t->quant = src->quant;   /* a view of quantized values is quantized alike */
    if (t->quant.scales) mp_retain(t->quant.scales);
    return t;
}

mp_tensor *mp_retain(mp_tensor *t)
{
    t->refs++;
    return t;
}

void mp_release(mp_tensor *t)
{
    if (!t || --t->refs > 0) return;
    mp_release(t->grad);
    if (t->grad_fn) {
        mp_node_head *node = (mp_node_head *)t->grad_fn;   /* a node begins with its head */
        node->release(node);
    }
    mp_release(t->quant.scales);
    mp_storage_release(t->st);
    free(t);
}
