/*
 * data_perm.c: the order of a data loader's epoch.
 *
 * A shuffled epoch is a Fisher-Yates shuffle of 0..n-1 driven by xoshiro256**
 * (Blackman and Vigna), its state filled from the seed by splitmix64 as its
 * authors recommend. Each swap partner is drawn without modulo bias by
 * Lemire's multiply-and-reject method. Everything is fixed-width integer
 * arithmetic, so a seed gives the same permutation on every machine, compiler
 * and thread count: seeded runs are bit-reproducible.
 *
 * The shuffle is sequential by nature; at 60000 examples it takes well under a
 * millisecond, nothing next to one training step.
 */
#include "engine/data_perm.h"
#include "engine/error.h"
#include "engine/ops.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

typedef struct { uint64_t s[4]; } xoshiro;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(xoshiro *g)
{
    uint64_t *s = g->s, r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0], s[3] ^= s[1], s[1] ^= s[2], s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* uniform in [0, bound), bound <= 2^32: Lemire, "Fast random integer
 * generation in an interval" (2019), rejecting the few biased products */
static uint32_t bounded(xoshiro *g, uint32_t bound)
{
    uint64_t m = (xoshiro_next(g) >> 32) * bound;
    if ((uint32_t)m < bound) {
        uint32_t floor = (uint32_t)(-bound) % bound;
        while ((uint32_t)m < floor) m = (xoshiro_next(g) >> 32) * bound;
    }
    return (uint32_t)(m >> 32);
}

mp_tensor *mp_randperm(int64_t n, uint64_t seed)
{
    if (n < 1 || n > INT32_MAX)
        return mp_fail(MP_EINVAL, "n must lie in [1, %d] (got %lld)", INT32_MAX, (long long)n), NULL;
    mp_tensor *t = mp_empty(MP_I32, MP_CPU, 1, &n);
    if (!t) return NULL;
    xoshiro g;
    uint64_t x = seed;
    /* splitmix64 is a bijection of its counter, so at most one of the four
     * words is zero and xoshiro never sees its forbidden all-zero state */
    for (int i = 0; i < 4; i++) g.s[i] = splitmix64(&x);
    int32_t *p = mp_data(t);
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)i;
    /* Durstenfeld's form: position i takes a uniform pick among 0..i */
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t j = bounded(&g, (uint32_t)i + 1);
        int32_t tmp = p[i];
        p[i] = p[j], p[j] = tmp;
    }
    return t;
}

uint64_t mp_draw_seed(void)
{
    uint64_t seed, offset;
    mp_rng_get(&seed, &offset);
    mp_rng_set(seed, offset + 2);
    uint64_t x = offset;
    x = seed ^ splitmix64(&x);
    return splitmix64(&x);
}
