/*
 * device.c: the devices' names; which backend serves a device (the CPU's
 * linked in, CUDA's loaded from a shared object at first use), whether a device
 * is available and why not, its errors, synchronizing, and the host's reads of
 * its memory, counted with the backend's own counters of waits.
 */
#define _GNU_SOURCE   /* dladdr */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dlfcn.h>
#include "engine/capture_guard.h"
#include "engine/device.h"
#include "engine/error.h"

static const char *device_names[] = {"cpu", "cuda"};
_Static_assert(sizeof device_names / sizeof *device_names == MP_NDEVICES, "a name for every device");

const char *mp_device_name(mp_device d) { return (unsigned)d < MP_NDEVICES ? device_names[d] : "?"; }

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

const mp_backend *mp_backend_loaded(mp_device d)
{
    return (unsigned)d < MP_NDEVICES ? backends[d] : NULL;
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

int mp_device_synchronize(mp_device d)
{
    if (mp_capture_refuse("synchronize", "it waits for the device, which a capture never does")) return -1;
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
    const mp_backend *be = mp_backend_loaded(d);
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
    if (d != MP_CPU && mp_capture_refuse("read device memory on the host (item(), totable(), printing, a state read)",
                                         "it waits for the device, and a replay would not read it again"))
        return memset(dst, 0, nbytes), -1;
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
