/*
 * device.h: which backend serves a device, and talking to it.
 *
 * The CPU backend is linked in; the CUDA backend is a shared object loaded the
 * first time a CUDA tensor is asked for (launcher variables pick the process's
 * GPU first). A device without a usable backend says why. Errors of work
 * queued on an asynchronous device come back through mp_device_error, and
 * every read of a backend's memory by the host goes through mp_host_read,
 * which counts it.
 */
#ifndef MP_DEVICE_H
#define MP_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"   /* mp_device, mp_backend */

const char *mp_device_name(mp_device d);
int mp_device_parse(const char *name, mp_device *out);      /* -1 if unknown */

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

/* Waiting for the device, counted: the engine notes every time it reads values
 * from a backend's memory on the host (item(), a scaler or optimizer state read,
 * indices checked on the host), on any device; an asynchronous backend counts
 * its own copies to the host, waits and device allocations (c[0..2], zeros
 * where it has none). A training step on a GPU should show none of them. */
void mp_note_host_read(void);
int64_t mp_host_reads(void);
void mp_device_counters(mp_device d, int64_t c[3]);
/* nbytes of device memory into host memory, counted as a host read; -1 with
 * the device's error (and dst zeroed) when the device reports one */
int mp_host_read(mp_device d, void *dst, const void *src, size_t nbytes);

#endif
