/*
 * block_cache.h: the caching allocator both backends put in front of their
 * system allocator (CPU: posix_memalign; CUDA: cudaMalloc).
 *
 * A training step allocates the same sizes every step. Freed blocks go to a
 * free list per size class and the next request of that class takes one back,
 * so a warm step asks the system for nothing: no cudaMalloc (slow, and
 * cudaFree waits for the device), and on the CPU no page faults for fresh
 * mmap'ed blocks and no glibc heap that keeps growing while the engine's own
 * bytes stay flat.
 *
 * Size classes: 64 bytes and below share one class; above, four classes per
 * power of two (2^e < n <= 2^(e+1) rounds up to a multiple of 2^(e-2)), so a
 * block wastes at most a quarter of its size. When the system refuses, the
 * whole cache is given back and the request tried once more.
 *
 * Bound: what the cache holds from the system (blocks in use plus free ones)
 * stays within twice the peak of the bytes in use. A request no free block
 * serves first gives back free blocks of the classes used least recently until
 * it fits. Twice, not once: the classes of a training step need their most
 * blocks at different moments of the step, so the free lists that serve a warm
 * step can together hold more than its peak, and cutting them would make every
 * step ask the system again. A loop whose sizes keep changing thus holds at
 * most twice what it ever used at once (glibc, by contrast, may keep every
 * freed block).
 *
 * Written once for both backends as plain C (kernels/step_rules.h is shared the
 * same way). Not thread-safe: the engine allocates from one thread.
 */
#ifndef MP_BLOCK_CACHE_H
#define MP_BLOCK_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define MP_CACHE_MIN 64
#define MP_CACHE_CLASSES 229   /* 64 bytes, then 4 classes per power of two up to 2^63 */

typedef struct {
    void **p;
    int n, cap;
    uint64_t used;   /* the tick of the class's last request or return */
} mp_cache_list;

typedef struct {
    void *(*sys_alloc)(size_t nbytes);     /* NULL on failure */
    void (*sys_free)(void *p, size_t nbytes);
    mp_cache_list list[MP_CACHE_CLASSES];
    size_t cached;                         /* bytes in the free lists */
    size_t held;                           /* bytes taken from the system and not given back */
    size_t peak;                           /* the most bytes in use (held - cached) at once */
    uint64_t tick;                         /* requests and returns so far */
    int64_t sys_allocs;                    /* calls to sys_alloc */
} mp_block_cache;

/* the class of a request and the size of its blocks; -1 past the largest class */
static inline int mp_cache_class(size_t n, size_t *size)
{
    if (n <= MP_CACHE_MIN) return *size = MP_CACHE_MIN, 0;
    int e = 63 - __builtin_clzll((unsigned long long)(n - 1));   /* 2^e < n <= 2^(e+1), e >= 6 */
    if (e > 62) return -1;
    size_t k = (n + ((size_t)1 << (e - 2)) - 1) >> (e - 2);      /* 5..8 quarters */
    *size = k << (e - 2);
    return 1 + 4 * (e - 6) + (int)(k - 5);
}

/* the size of the blocks of class i */
static inline size_t mp_cache_size(int i)
{
    if (i == 0) return MP_CACHE_MIN;
    int e = 6 + (i - 1) / 4;
    return (size_t)(5 + (i - 1) % 4) << (e - 2);
}

/* every free block back to the system */
static inline void mp_cache_release(mp_block_cache *c)
{
    for (int i = 0; i < MP_CACHE_CLASSES; i++) {
        mp_cache_list *l = &c->list[i];
        size_t size = mp_cache_size(i);
        while (l->n) c->sys_free(l->p[--l->n], size), c->held -= size;
        free(l->p);
        l->p = NULL;
        l->cap = 0;
    }
    c->cached = 0;
}

/* free blocks back to the system, of the classes used least recently first,
 * until at most `keep` bytes are held */
static inline void mp_cache_trim(mp_block_cache *c, size_t keep)
{
    while (c->cached && c->held > keep) {
        int old = -1;
        for (int i = 0; i < MP_CACHE_CLASSES; i++)
            if (c->list[i].n && (old < 0 || c->list[i].used < c->list[old].used)) old = i;
        mp_cache_list *l = &c->list[old];
        size_t size = mp_cache_size(old);
        while (l->n && c->held > keep) c->sys_free(l->p[--l->n], size), c->held -= size, c->cached -= size;
    }
}

static inline void *mp_cache_alloc(mp_block_cache *c, size_t nbytes)
{
    size_t size;
    int k = mp_cache_class(nbytes, &size);
    if (k < 0) return NULL;
    mp_cache_list *l = &c->list[k];
    size_t live = c->held - c->cached + size;
    if (live > c->peak) c->peak = live;
    l->used = ++c->tick;
    if (l->n) {
        c->cached -= size;
        return l->p[--l->n];
    }
    if (c->held + size > 2 * c->peak) mp_cache_trim(c, 2 * c->peak - size);   /* peak >= size */
    c->sys_allocs++;
    void *p = c->sys_alloc(size);
    if (!p && c->cached) {
        mp_cache_release(c);
        c->sys_allocs++;
        p = c->sys_alloc(size);
    }
    if (p) c->held += size;
    return p;
}

static inline void mp_cache_free(mp_block_cache *c, void *p, size_t nbytes)
{
    size_t size;
    int k = mp_cache_class(nbytes, &size);
    if (!p || k < 0) return;
    mp_cache_list *l = &c->list[k];
    l->used = ++c->tick;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        void **q = (void **)realloc(l->p, sizeof *q * (size_t)cap);
        if (!q) {   /* no room to remember it: give it back */
            c->sys_free(p, size);
            c->held -= size;
            return;
        }
        l->p = q;
        l->cap = cap;
    }
    l->p[l->n++] = p;
    c->cached += size;
}

#endif
