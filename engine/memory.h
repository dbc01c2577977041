/*
 * memory.h: the bytes per device.
 *
 * The bytes the tensors alive hold (in use, peak, the limit past which an
 * allocation is refused) and what the backend's caching allocator holds
 * besides. The binding paces Lua's garbage collector by these bytes.
 */
#ifndef MP_MEMORY_H
#define MP_MEMORY_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"   /* mp_device */

typedef struct {
    size_t in_use, peak, limit;    /* bytes of the tensors alive */
    size_t cached;                 /* bytes the backend's caching allocator holds in free blocks */
    int64_t allocs;                /* storages alive */
} mp_memstats;

mp_memstats mp_memory(mp_device d);
void mp_reset_peak_memory(mp_device d);   /* peak = in_use (torch.cuda.reset_peak_memory_stats) */
void mp_set_memory_limit(mp_device d, size_t bytes);
/* give the blocks the device's caching allocator holds back to the system */
void mp_release_cache(mp_device d);
/* the end of a window of the program's allocations: the device's caching
 * allocator gives back the free blocks no request took through it and the
 * window before (kernels/block_cache.h mp_cache_mark). The Lua binding marks one
 * at each collection it paces, so its windows are periods of the program. */
void mp_mark_cache(mp_device d);

/* A storage's bytes, for engine/tensor.c. admit: 0 when nbytes more stay
 * within d's limit (the cache's free blocks given back first when with them
 * they would not), else -1 with the out-of-memory error. allocated / freed:
 * count a storage in or out. */
int mp_memory_admit(mp_device d, size_t nbytes);
void mp_memory_allocated(mp_device d, size_t nbytes);
void mp_memory_freed(mp_device d, size_t nbytes);

#endif
