/*
 * block_cache.h: the caching allocator both backends put in front of their
 * system allocator (CPU: posix_memalign, mmap from 128 KiB; CUDA: cudaMalloc).
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
 * block wastes at most a quarter of its size. A request whose class has no
 * free block takes one of the next four classes (at most twice its size)
 * before asking the system: sizes that vary a little (the last batch of an
 * epoch, a loop of scattered sizes) reuse what is there. Such a block is lent:
 * a table by address sends it back to its own class when it is returned. When
 * the system refuses, the whole cache is given back and the request tried once
 * more.
 *
 * Bound, in two parts:
 * - What the cache holds from the system (blocks in use plus free ones) stays
 *   within twice the peak of the bytes in use: a request no free block serves
 *   first gives back free blocks of the classes used least recently until it
 *   fits. Twice, not once: the classes of a training step need their most
 *   blocks at different moments of the step, so the free lists that serve a
 *   warm step can together hold more than its peak, and cutting them would make
 *   every step ask the system again.
 * - Idle blocks go back. The program marks the ends of windows of its
 *   allocations (mp_cache_mark; the Lua binding at the collections it paces,
 *   which in a training loop fall at the same step of every period); a mark
 *   that ends a window of requests totalling at least what the cache holds
 *   gives back every free block no request took through that window and the
 *   one before. What a warm step takes, it takes in every window, so a training
 *   loop keeps all it needs; what an earlier phase left (warm-up, another
 *   batch size, an evaluation, a loop of scattered sizes) goes back within two
 *   windows instead of staying until mp.empty_cache().
 * In a loop of scattered sizes (4 bytes to 16 MiB, 50 tensors kept) the cache
 * held 1.5-2.3x the bytes kept, 2 MiB once a loop of one size followed
 * (tests/lua/memory_spec.lua); glibc, by contrast, may keep every freed block.
 *
 * Written once for both backends as plain C (kernels/step_rules.h is shared the
 * same way). Not thread-safe: the engine allocates from one thread.
 */
#ifndef MP_BLOCK_CACHE_H
#define MP_BLOCK_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MP_CACHE_MIN 64
#define MP_CACHE_CLASSES 229   /* 64 bytes, then 4 classes per power of two up to 2^63 */

typedef struct {
    void **p;        /* the free blocks, p[0] freed longest ago (requests take from the end) */
    int n, cap;
    int low;         /* the fewest free blocks since the last mark: p[0..low-1] went unused */
    int idle;        /* how many of p[0..] also went unused through the window before */
    uint64_t used;   /* the tick of the class's last request or return */
} mp_cache_list;

typedef struct { void *p; int k; } mp_cache_lent;   /* a block in use and its own class */

typedef struct {
    void *(*sys_alloc)(size_t nbytes);     /* NULL on failure */
    void (*sys_free)(void *p, size_t nbytes);
    mp_cache_list list[MP_CACHE_CLASSES];
    size_t cached;                         /* bytes in the free lists */
    size_t held;                           /* bytes taken from the system and not given back */
    size_t peak;                           /* the most bytes in use (held - cached) at once */
    uint64_t tick;                         /* requests and returns so far */
    int64_t sys_allocs;                    /* calls to sys_alloc */
    size_t window;                         /* bytes requested since the last mark */
    /* blocks in use that a smaller class borrowed (their own class by address;
     * open addressing, linear probing, a power of two long) */
    mp_cache_lent *lent;
    size_t nlent, caplent;
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

/* ---- the blocks lent to smaller classes ---- */

static inline size_t mp_cache_slot(const void *p, size_t cap)
{
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

/* remember that p, of class k, serves a smaller class; -1 when there is no room */
static inline int mp_cache_lend(mp_block_cache *c, void *p, int k)
{
    if (2 * (c->nlent + 1) > c->caplent) {
        size_t cap = c->caplent ? 2 * c->caplent : 64;
        mp_cache_lent *t = (mp_cache_lent *)calloc(cap, sizeof *t);
        if (!t) return -1;
        for (size_t i = 0; i < c->caplent; i++)
            if (c->lent[i].p) {
                size_t j = mp_cache_slot(c->lent[i].p, cap);
                while (t[j].p) j = (j + 1) & (cap - 1);
                t[j] = c->lent[i];
            }
        free(c->lent);
        c->lent = t;
        c->caplent = cap;
    }
    size_t j = mp_cache_slot(p, c->caplent);
    while (c->lent[j].p) j = (j + 1) & (c->caplent - 1);
    c->lent[j].p = p;
    c->lent[j].k = k;
    c->nlent++;
    return 0;
}

/* the class of a returned block that was lent, forgetting it; -1 when it was not */
static inline int mp_cache_unlend(mp_block_cache *c, void *p)
{
    if (!c->nlent) return -1;
    size_t mask = c->caplent - 1, j = mp_cache_slot(p, c->caplent);
    while (c->lent[j].p && c->lent[j].p != p) j = (j + 1) & mask;
    if (!c->lent[j].p) return -1;
    int k = c->lent[j].k;
    /* delete by shifting back the entries of the run after it that probed past j */
    for (size_t i = (j + 1) & mask; c->lent[i].p; i = (i + 1) & mask) {
        size_t h = mp_cache_slot(c->lent[i].p, c->caplent);
        if (((i - h) & mask) >= ((i - j) & mask)) c->lent[j] = c->lent[i], j = i;
    }
    c->lent[j].p = NULL;
    c->nlent--;
    return k;
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
        l->cap = l->low = l->idle = 0;
    }
    c->cached = 0;
    if (!c->nlent) free(c->lent), c->lent = NULL, c->caplent = 0;   /* nothing lent: its table goes too */
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
        if (l->n < l->low) l->low = l->n;
    }
}

/* The end of a window of the program's allocations (the binding marks one at
 * each of its paced collections, engine/memory.h mp_mark_cache): the blocks
 * that no request took through this window and the one before go back. The
 * windows of a training loop are whole periods of its allocations, so what a
 * warm step takes is taken in every window and stays; two windows, not one,
 * so that a period that once took less (a collection Lua ran on its own) gives
 * back nothing the next one needs. */
static inline void mp_cache_mark(mp_block_cache *c)
{
    if (c->window < c->held) return;
    c->window = 0;
    for (int i = 0; i < MP_CACHE_CLASSES; i++) {
        mp_cache_list *l = &c->list[i];
        int r = l->low < l->idle ? l->low : l->idle;   /* p[0..r-1]: unused through both */
        if (r) {
            size_t size = mp_cache_size(i);
            for (int j = 0; j < r; j++) c->sys_free(l->p[j], size);
            memmove(l->p, l->p + r, sizeof *l->p * (size_t)(l->n - r));
            l->n -= r;
            c->held -= (size_t)r * size;
            c->cached -= (size_t)r * size;
        }
        l->idle = l->low - r;
        l->low = l->n;
    }
}

/* a free block of class k, or failing that of one of the next classes up to
 * twice its size (lent: remembered, so that it goes back to its own class) */
#define MP_CACHE_LEND_CLASSES 4

static inline void *mp_cache_take(mp_block_cache *c, int k, size_t *size)
{
    for (int j = k; j <= k + MP_CACHE_LEND_CLASSES && j < MP_CACHE_CLASSES; j++) {
        mp_cache_list *l = &c->list[j];
        if (!l->n) continue;
        if (j > k && mp_cache_lend(c, l->p[l->n - 1], j)) return NULL;
        void *p = l->p[--l->n];
        if (l->n < l->low) l->low = l->n;
        l->used = ++c->tick;
        *size = mp_cache_size(j);
        c->cached -= *size;
        return p;
    }
    return NULL;
}

static inline void *mp_cache_alloc(mp_block_cache *c, size_t nbytes)
{
    size_t size;
    int k = mp_cache_class(nbytes, &size);
    if (k < 0) return NULL;
    c->list[k].used = ++c->tick;
    c->window += size;
    size_t got = size;
    void *p = mp_cache_take(c, k, &got);
    if (!p) {
        if (c->held + size > 2 * c->peak) {   /* the bound: free blocks of the classes used least recently go first */
            size_t keep = 2 * (c->peak > c->held - c->cached + size ? c->peak : c->held - c->cached + size);
            if (c->held + size > keep) mp_cache_trim(c, keep - size);
        }
        c->sys_allocs++;
        p = c->sys_alloc(size);
        if (!p && c->cached) {
            mp_cache_release(c);
            c->sys_allocs++;
            p = c->sys_alloc(size);
        }
        if (!p) return NULL;
        c->held += size;
    }
    if (c->held - c->cached > c->peak) c->peak = c->held - c->cached;
    return p;
}

static inline void mp_cache_free(mp_block_cache *c, void *p, size_t nbytes)
{
    size_t size;
    int k = mp_cache_class(nbytes, &size);
    if (!p || k < 0) return;
    int lent = mp_cache_unlend(c, p);
    if (lent >= 0) k = lent, size = mp_cache_size(k);
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
