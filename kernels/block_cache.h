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
} mp_cache_list;

typedef struct {
    void *(*sys_alloc)(size_t nbytes);     /* NULL on failure */
    void (*sys_free)(void *p, size_t nbytes);
    mp_cache_list list[MP_CACHE_CLASSES];
    size_t cached;                         /* bytes in the free lists */
    size_t held;                           /* bytes taken from the system and not given back */
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

static inline void *mp_cache_alloc(mp_block_cache *c, size_t nbytes)
{
    size_t size;
    int k = mp_cache_class(nbytes, &size);
    if (k < 0) return NULL;
    mp_cache_list *l = &c->list[k];
    if (l->n) {
        c->cached -= size;
        return l->p[--l->n];
    }
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
