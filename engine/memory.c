/*
 * memory.c: the bytes the engine's storages hold per device, against a limit
 * (with the peak), and the backend's cached blocks.
 */
#include <stdint.h>
#include <unistd.h>
#include "engine/memory.h"
#include "engine/device.h"     /* mp_backend_loaded, mp_device_name */
#include "engine/error.h"

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
    const mp_backend *be = mp_backend_loaded(d);
    m.cached = be && be->cached ? be->cached(be->ctx) : 0;
    return m;
}

void mp_release_cache(mp_device d)
{
    const mp_backend *be = mp_backend_loaded(d);
    if (be && be->release_cache) be->release_cache(be->ctx);
}

void mp_mark_cache(mp_device d)
{
    const mp_backend *be = mp_backend_loaded(d);
    if (be && be->mark_cache) be->mark_cache(be->ctx);
}

void mp_set_memory_limit(mp_device d, size_t bytes) { stats[d].limit = bytes; }
void mp_reset_peak_memory(mp_device d) { stats[d].peak = stats[d].in_use; }

int mp_memory_admit(mp_device d, size_t nbytes)
{
    const mp_backend *be = mp_backend_loaded(d);
    mp_memstats *s = &stats[d];
    if (s->limit == 0) s->limit = default_limit(d);
    if (nbytes > s->limit || s->in_use > s->limit - nbytes)
        return mp_fail(MP_EOOM, "out of memory: cannot allocate %zu bytes on %s (%zu in use, limit %zu)",
                       nbytes, mp_device_name(d), s->in_use, s->limit);
    /* what the cache holds counts against the limit too: give it back first */
    if (be->cached && s->in_use + nbytes + be->cached(be->ctx) > s->limit) be->release_cache(be->ctx);
    return 0;
}

void mp_memory_allocated(mp_device d, size_t nbytes)
{
    mp_memstats *s = &stats[d];
    s->in_use += nbytes;
    s->allocs++;
    if (s->in_use > s->peak) s->peak = s->in_use;
}

void mp_memory_freed(mp_device d, size_t nbytes)
{
    stats[d].in_use -= nbytes;
    stats[d].allocs--;
}
