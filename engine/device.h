/*
 * device.h: which backend serves a device, and talking to it.
 *
 * The CPU backend is linked in; the CUDA backend is a shared object loaded the
 * first time a CUDA tensor is asked for (launcher variables pick the process's
 * GPU first). A device without a usable backend says why. Errors of work
 * queued on an asynchronous device come back through mp_device_error, and
 * every read of a backend's memory by the host goes through mp_host_read.
 */
#ifndef MP_DEVICE_H
#define MP_DEVICE_H

#include <stddef.h>
#include "kernels/backend.h"   /* mp_device, mp_backend */

/* NULL when the device has no usable backend on this machine */
const mp_backend *mp_backend_of(mp_device d);
/* the backend if one was loaded, without trying to load it (statistics, the
 * cache, errors: asking them never loads the CUDA backend) */
const mp_backend *mp_backend_loaded(mp_device d);
/* why not (NULL when it is available): no driver, which library failed to load, ... */
const char *mp_device_why_not(mp_device d);
/* dlopen a shared object of mpengine's (cuda.so, mpi.so): the path in the
 * environment variable env when set, else next to the engine's own object;
 * NULL with the reason in why */
void *mp_module_open(const char *file, const char *env, char *why, size_t cap);
int mp_device_check(mp_device d);                           /* -1 + error if unavailable */
/* -1 + the backend's message when work queued on d failed (asynchronous backends) */
int mp_device_error(mp_device d);
int mp_device_synchronize(mp_device d);

/* nbytes of device memory into host memory, counted as a host read
 * (engine/memory.h); -1 with the device's error (and dst zeroed) when the
 * device reports one */
int mp_host_read(mp_device d, void *dst, const void *src, size_t nbytes);

#endif
