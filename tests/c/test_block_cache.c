/*
 * test_block_cache.c: the caching allocator both backends share
 * (kernels/block_cache.h), over a system allocator of this file's that
 * remembers every block it gave and checks that each comes back once, with the
 * size it was given with: a block lent to a smaller class and returned under
 * the smaller size would show up here.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/block_cache.h"

/* ---- the system: a table of the blocks out ---- */

#define SYS_MAX 4096
static struct { void *p; size_t n; } sys[SYS_MAX];
static int sys_out, sys_frees;
static size_t sys_bytes;

static void *sys_alloc(size_t n)
{
    for (int i = 0; i < SYS_MAX; i++)
        if (!sys[i].p) {
            sys[i].p = malloc(n);
            sys[i].n = n;
            sys_out++, sys_bytes += n;
            return sys[i].p;
        }
    return NULL;
}

static void sys_free(void *p, size_t n)
{
    for (int i = 0; i < SYS_MAX; i++)
        if (sys[i].p == p) {
            cr_assert_eq(sys[i].n, n, "block %p given with %zu bytes came back with %zu", p, sys[i].n, n);
            free(p);
            sys[i].p = NULL;
            sys_out--, sys_frees++, sys_bytes -= n;
            return;
        }
    cr_assert_fail("sys_free of %p, which the system never gave", p);
}

static mp_block_cache cache;

static void setup(void)
{
    cache = (mp_block_cache){.sys_alloc = sys_alloc, .sys_free = sys_free};
    sys_out = sys_frees = 0;
    sys_bytes = 0;
}

static void teardown(void)
{
    mp_cache_release(&cache);
    free(cache.lent);
    cr_expect_eq(sys_out, 0, "%d blocks never went back to the system", sys_out);
}

TestSuite(block_cache, .init = setup, .fini = teardown);

static size_t class_size(size_t n)
{
    size_t s;
    cr_assert_geq(mp_cache_class(n, &s), 0);
    return s;
}

/* ---- reuse ---- */

Test(block_cache, a_freed_block_serves_the_next_request_of_its_class)
{
    void *a = mp_cache_alloc(&cache, 1000);
    mp_cache_free(&cache, a, 1000);
    cr_assert_eq(cache.cached, class_size(1000));
    void *b = mp_cache_alloc(&cache, 1010);   /* 1000 and 1010 share the class of 1024 */
    cr_assert_eq(a, b);
    cr_assert_eq(cache.sys_allocs, 1);
    cr_assert_eq(cache.cached, 0);
    mp_cache_free(&cache, b, 1010);
}

Test(block_cache, a_request_takes_a_free_block_up_to_twice_its_class_and_it_goes_back_to_its_own)
{
    void *big = mp_cache_alloc(&cache, 2048);
    mp_cache_free(&cache, big, 2048);
    /* 1100 bytes: class 1280; 2048 is three classes up */
    void *p = mp_cache_alloc(&cache, 1100);
    cr_assert_eq(p, big, "the free 2048-byte block serves 1100 bytes");
    cr_assert_eq(cache.sys_allocs, 1);
    cr_assert_eq(cache.held - cache.cached, 2048, "the block counts with its own size while in use");
    mp_cache_free(&cache, p, 1100);   /* returned under the request's size */
    cr_assert_eq(cache.cached, 2048);
    void *q = mp_cache_alloc(&cache, 2048);   /* back in its own class */
    cr_assert_eq(q, big);
    cr_assert_eq(cache.sys_allocs, 1);
    mp_cache_free(&cache, q, 2048);
}

Test(block_cache, no_block_more_than_twice_the_class_is_lent)
{
    /* 1024 bytes: class 1024; 2560 is five classes up (not lent), 2048 four (lent) */
    void *b2560 = mp_cache_alloc(&cache, 2560);
    mp_cache_free(&cache, b2560, 2560);
    void *p = mp_cache_alloc(&cache, 1024);
    cr_assert_neq(p, b2560);
    cr_assert_eq(cache.sys_allocs, 2);
    mp_cache_free(&cache, p, 1024);
    mp_cache_release(&cache);
    void *b2048 = mp_cache_alloc(&cache, 2048);
    mp_cache_free(&cache, b2048, 2048);
    void *r = mp_cache_alloc(&cache, 1024);
    cr_assert_eq(r, b2048);
    cr_assert_eq(cache.sys_allocs, 3);
    mp_cache_free(&cache, r, 1024);
    cr_assert_eq(cache.list[mp_cache_class(2048, &(size_t){0})].n, 1, "back in the class of 2048");
}

/* thousands of blocks in use at once, most of them lent, returned in another
 * order: every one reaches the system with its own size (sys_free checks) */
Test(block_cache, lent_blocks_are_remembered_through_many_returns)
{
    enum { N = 3000 };
    static void *p[N];
    static size_t n[N];
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 4; round++) {
        /* free blocks of 4097..8192 bytes, then requests of half that: each
         * takes one of them once its own class has none */
        for (int i = 0; i < N; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            n[i] = 4097 + x % 4096;
            p[i] = mp_cache_alloc(&cache, n[i]);
            cr_assert(p[i]);
        }
        for (int i = 0; i < N; i++) mp_cache_free(&cache, p[i], n[i]);
        for (int i = 0; i < N; i++) {
            n[i] = (n[i] + 1) / 2;
            p[i] = mp_cache_alloc(&cache, n[i]);
            cr_assert(p[i]);
        }
        cr_assert_gt(cache.nlent, N / 2, "round %d lent only %zu blocks", round, cache.nlent);
        for (int i = 0; i < N; i++) {   /* a shuffled order */
            int j = (int)((uint64_t)i * 2654435761u % N);
            if (p[j]) mp_cache_free(&cache, p[j], n[j]), p[j] = NULL;
        }
        for (int i = 0; i < N; i++)
            if (p[i]) mp_cache_free(&cache, p[i], n[i]), p[i] = NULL;
        cr_assert_eq(cache.nlent, 0, "round %d: %zu lent blocks not returned", round, cache.nlent);
        cr_assert_eq(cache.cached, cache.held);
        cr_assert_eq(cache.held, sys_bytes);
    }
}

/* ---- the bound ---- */

Test(block_cache, holds_at_most_twice_the_peak_in_use)
{
    enum { SLOTS = 40 };
    void *p[SLOTS] = {0};
    size_t n[SLOTS] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int k = (int)(x % SLOTS);
        if (p[k]) mp_cache_free(&cache, p[k], n[k]);
        n[k] = (size_t)1 << (6 + (x >> 8) % 14);   /* 64 B .. 512 KiB, a class each power */
        n[k] += (x >> 20) % n[k];
        p[k] = mp_cache_alloc(&cache, n[k]);
        cr_assert(p[k]);
        cr_assert_leq(cache.held, 2 * cache.peak, "step %d: %zu held, peak %zu", i, cache.held, cache.peak);
        cr_assert_eq(cache.held, sys_bytes);
    }
    for (int k = 0; k < SLOTS; k++)
        if (p[k]) mp_cache_free(&cache, p[k], n[k]);
}

/* ---- windows ---- */

/* one period of a training-like loop: blocks of several classes taken and
 * given back in an order that needs each class's most at different moments */
static void period(void)
{
    void *a[4], *b[3], *c;
    for (int i = 0; i < 4; i++) a[i] = mp_cache_alloc(&cache, 4096);
    for (int i = 0; i < 3; i++) b[i] = mp_cache_alloc(&cache, 65536);
    for (int i = 0; i < 4; i++) mp_cache_free(&cache, a[i], 4096);
    c = mp_cache_alloc(&cache, 300000);
    for (int i = 0; i < 3; i++) mp_cache_free(&cache, b[i], 65536);
    mp_cache_free(&cache, c, 300000);
}

Test(block_cache, a_mark_gives_back_what_went_unused_through_two_windows_and_nothing_a_period_takes)
{
    /* surplus of a warm-up: two blocks of a class the loop never asks for
     * again (1 MiB: more than twice any of the period's, so never lent) */
    void *w[2];
    for (int i = 0; i < 2; i++) w[i] = mp_cache_alloc(&cache, 1 << 20);
    for (int i = 0; i < 2; i++) mp_cache_free(&cache, w[i], 1 << 20);
    for (int i = 0; i < 8; i++) period();
    int64_t warm = cache.sys_allocs;
    mp_cache_mark(&cache);   /* the warm-up's window */
    for (int i = 0; i < 8; i++) period();
    mp_cache_mark(&cache);   /* a window the surplus went unused through */
    cr_assert_eq(sys_frees, 0, "one idle window gives back nothing");
    for (int i = 0; i < 8; i++) period();
    mp_cache_mark(&cache);   /* the second: it goes */
    cr_assert_eq(sys_frees, 2, "the two idle blocks go back");
    cr_assert_eq(cache.held, 4 * class_size(4096) + 3 * class_size(65536) + class_size(300000));
    for (int w2 = 0; w2 < 10; w2++) {
        for (int i = 0; i < 8; i++) period();
        mp_cache_mark(&cache);
    }
    cr_assert_eq(cache.sys_allocs, warm, "a warm period asks the system for nothing");
    cr_assert_eq(sys_frees, 2, "and nothing it takes goes back");
}

static void small_requests(int k)
{
    for (int i = 0; i < k; i++) {
        void *s = mp_cache_alloc(&cache, 1000);
        mp_cache_free(&cache, s, 1000);
    }
}

Test(block_cache, a_window_ends_only_after_requests_of_as_many_bytes_as_are_held)
{
    void *big = mp_cache_alloc(&cache, 1 << 20);
    mp_cache_free(&cache, big, 1 << 20);
    mp_cache_mark(&cache);   /* 1 MiB requested, 1 MiB held: a window ends */
    for (int i = 0; i < 3; i++) {   /* a few small requests: no window ends */
        small_requests(1);
        mp_cache_mark(&cache);
    }
    cr_assert_eq(sys_frees, 0, "windows of a few small requests gave back the idle MiB");
    small_requests(1100);
    mp_cache_mark(&cache);   /* 1.1 MiB requested: the MiB went unused through one window */
    cr_assert_eq(sys_frees, 0);
    small_requests(1100);
    mp_cache_mark(&cache);   /* and through two */
    cr_assert_eq(sys_frees, 1);
    cr_assert_eq(cache.held, class_size(1000));
}

Test(block_cache, release_gives_back_every_free_block)
{
    void *a = mp_cache_alloc(&cache, 5000), *b = mp_cache_alloc(&cache, 70000);
    mp_cache_free(&cache, a, 5000);
    mp_cache_release(&cache);
    cr_assert_eq(cache.cached, 0);
    cr_assert_eq(cache.held, class_size(70000));
    cr_assert_eq(sys_out, 1);
    mp_cache_free(&cache, b, 70000);
}
