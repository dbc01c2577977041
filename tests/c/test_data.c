/*
 * test_data.c: the IDX reader and the loader's permutation.
 *
 * Every IDX file here is written by the test itself (raw with stdio, gzip with
 * zlib's gzwrite) under a private temporary directory, with headers packed
 * big-endian by hand, so the reader is checked against the format as written
 * down rather than against itself. The corrupt cases are the ways a download
 * or a disk goes wrong: cut short, wrong file, flipped bytes, and a header
 * that lies about its size. Each must fail with a message that names the path
 * and the problem, never crash: run under valgrind with --no-fork to check
 * for out-of-bounds access too.
 *
 * The loader's permutation is here too: a permutation, uniform, reproducible,
 * and pinned to known values.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include "engine/data_idx.h"
#include "engine/data_perm.h"
#include "engine/error.h"
#include "engine/ops.h"
#include "engine/memory.h"

/* ---- writing test files ---- */

#define SCRATCH_PREFIX "mp_test_data"
#include "tests/c/scratch_dir.h"

TestSuite(idx, .init = make_dir, .fini = remove_dir);

static const char *path_of(const char *name)
{
    static char p[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* header bytes: 00 00 type ndim, then big-endian u32 sizes; returns its length */
static size_t header(unsigned char *h, int type, int ndim, const uint32_t *dims)
{
    h[0] = 0, h[1] = 0, h[2] = (unsigned char)type, h[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++)
        for (int b = 0; b < 4; b++) h[4 + 4 * d + b] = (unsigned char)(dims[d] >> (24 - 8 * b));
    return 4 + 4 * (size_t)ndim;
}

static void write_bytes(const char *path, int gz, const void *a, size_t na, const void *b, size_t nb)
{
    if (gz) {
        gzFile f = gzopen(path, "wb");
        cr_assert(f);
        if (na) cr_assert_eq(gzwrite(f, a, (unsigned)na), (int)na);
        if (nb) cr_assert_eq(gzwrite(f, b, (unsigned)nb), (int)nb);
        cr_assert_eq(gzclose(f), Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        cr_assert(f);
        cr_assert_eq(fwrite(a, 1, na, f), na);
        if (nb) cr_assert_eq(fwrite(b, 1, nb, f), nb);
        cr_assert_eq(fclose(f), 0);
    }
}

static void write_idx(const char *path, int gz, int type, int ndim, const uint32_t *dims,
                      const void *payload, size_t n)
{
    unsigned char h[4 + 4 * 255];
    write_bytes(path, gz, h, header(h, type, ndim, dims), payload, n);
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*n);
    cr_assert_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* the reader must fail, with a message holding `want` and the path */
static void expect_fail(const char *path, const char *want)
{
    mp_clear_error();
    mp_tensor *t = mp_read_idx(path);
    cr_assert_null(t, "%s: expected failure '%s'", path, want);
    cr_assert(strstr(mp_error(), want), "message '%s' lacks '%s'", mp_error(), want);
    cr_assert(strstr(mp_error(), path), "message '%s' lacks the path", mp_error());
}

/* ---- round trips ---- */

static void check_u8(int gz)
{
    const char *p = path_of(gz ? "u8.idx.gz" : "u8.idx");
    uint32_t dims[3] = {5, 3, 4};
    unsigned char v[60];
    for (int i = 0; i < 60; i++) v[i] = (unsigned char)(i * 37 + 11);
    write_idx(p, gz, 0x08, 3, dims, v, sizeof v);
    mp_tensor *t = mp_read_idx(p);
    cr_assert(t, "%s", mp_error());
    cr_assert_eq(t->dtype, MP_U8);
    cr_assert_eq(t->dev, MP_CPU);
    cr_assert_eq(t->ndim, 3);
    cr_assert(t->shape[0] == 5 && t->shape[1] == 3 && t->shape[2] == 4);
    cr_assert_arr_eq(mp_data(t), v, sizeof v);
    mp_release(t);
}

Test(idx, u8_raw_round_trip) { check_u8(0); }
Test(idx, u8_gzip_round_trip) { check_u8(1); }

Test(idx, i32_is_byte_swapped)
{
    const char *p = path_of("i32.gz");
    int32_t want[4] = {1, -2, 0x12345678, INT32_MIN};
    unsigned char be[16];
    for (int i = 0; i < 4; i++)
        for (int b = 0; b < 4; b++) be[4 * i + b] = (unsigned char)((uint32_t)want[i] >> (24 - 8 * b));
    uint32_t dims[2] = {2, 2};
    write_idx(p, 1, 0x0C, 2, dims, be, sizeof be);
    mp_tensor *t = mp_read_idx(p);
    cr_assert(t, "%s", mp_error());
    cr_assert_eq(t->dtype, MP_I32);
    cr_assert_arr_eq(mp_data(t), want, sizeof want);
    mp_release(t);
}

Test(idx, f32_is_byte_swapped)
{
    const char *p = path_of("f32.idx");
    float want[3] = {-1.5f, 3.25e-5f, 1e30f};
    unsigned char be[12];
    for (int i = 0; i < 3; i++) {
        uint32_t w;
        memcpy(&w, &want[i], 4);
        for (int b = 0; b < 4; b++) be[4 * i + b] = (unsigned char)(w >> (24 - 8 * b));
    }
    uint32_t dims[1] = {3};
    write_idx(p, 0, 0x0D, 1, dims, be, sizeof be);
    mp_tensor *t = mp_read_idx(p);
    cr_assert(t, "%s", mp_error());
    cr_assert_eq(t->dtype, MP_F32);
    cr_assert_arr_eq(mp_data(t), want, sizeof want);
    mp_release(t);
}

Test(idx, i8_and_i16_widen_to_i32)
{
    const char *p8 = path_of("i8.idx"), *p16 = path_of("i16.idx");
    uint32_t dims[1] = {3};
    unsigned char v8[3] = {0x7F, 0x80, 0xFF}, v16[6] = {0x7F, 0xFF, 0x80, 0x00, 0xFF, 0xFE};
    write_idx(p8, 0, 0x09, 1, dims, v8, 3);
    write_idx(p16, 1, 0x0B, 1, dims, v16, 6);
    int32_t w8[3] = {127, -128, -1}, w16[3] = {32767, -32768, -2};
    mp_tensor *a = mp_read_idx(p8), *b = mp_read_idx(p16);
    cr_assert(a && b, "%s", mp_error());
    cr_assert(a->dtype == MP_I32 && b->dtype == MP_I32);
    cr_assert_arr_eq(mp_data(a), w8, sizeof w8);
    cr_assert_arr_eq(mp_data(b), w16, sizeof w16);
    mp_release(a);
    mp_release(b);
}

/* a payload larger than the reader's first 1 MiB buffer, so it must grow */
Test(idx, large_gzip_payload_round_trips)
{
    const char *p = path_of("big.gz");
    uint32_t dims[2] = {3000, 1000};
    size_t n = 3000000;
    unsigned char *v = malloc(n);
    uint64_t x = 1;
    for (size_t i = 0; i < n; i++) x = x * 6364136223846793005ULL + 1, v[i] = (unsigned char)(x >> 56);
    write_idx(p, 1, 0x08, 2, dims, v, n);
    mp_tensor *t = mp_read_idx(p);
    cr_assert(t, "%s", mp_error());
    cr_assert_eq(memcmp(mp_data(t), v, n), 0);
    mp_release(t);
    free(v);
}

/* ---- missing, truncated, corrupt, lying ---- */

Test(idx, missing_file)
{
    expect_fail(path_of("nope.gz"), "cannot open: No such file or directory");
}

Test(idx, empty_path)
{
    cr_assert_null(mp_read_idx(""));
    cr_assert(strstr(mp_error(), "path"));
}

Test(idx, directory_is_not_a_file)
{
    expect_fail(dir, "cannot read");
}

Test(idx, empty_file)
{
    const char *p = path_of("empty");
    write_bytes(p, 0, "", 0, NULL, 0);
    expect_fail(p, "truncated: expected 4 header bytes, got 0");
}

Test(idx, truncated_header)
{
    const char *p = path_of("th.gz");
    unsigned char h[16];
    uint32_t dims[3] = {60000, 28, 28};
    header(h, 0x08, 3, dims);
    write_bytes(p, 1, h, 10, NULL, 0);   /* the sizes cut after 6 of 12 bytes */
    expect_fail(p, "truncated: expected 12 header bytes, got 6");
}

/* the example of the brief, exactly: a full-size header over 1000 bytes */
static void truncated_data(int gz)
{
    const char *p = path_of(gz ? "td.gz" : "td");
    uint32_t dims[3] = {60000, 28, 28};
    unsigned char v[1000] = {0};
    write_idx(p, gz, 0x08, 3, dims, v, sizeof v);
    expect_fail(p, "truncated: expected 47040000 data bytes, got 1000");
    char want[256];
    snprintf(want, sizeof want, "%s: truncated: expected 47040000 data bytes, got 1000", p);
    cr_assert_str_eq(mp_error(), want);
}

Test(idx, truncated_data_raw) { truncated_data(0); }
Test(idx, truncated_data_gzip) { truncated_data(1); }

Test(idx, truncated_gzip_stream)
{
    const char *p = path_of("cut.gz");
    uint32_t dims[1] = {100000};
    unsigned char *v = malloc(100000);
    for (uint32_t i = 0; i < 100000; i++) v[i] = (unsigned char)(i * i >> 7);   /* unsigned: i * i passes 2^31 */
    write_idx(p, 1, 0x08, 1, dims, v, 100000);
    free(v);
    size_t n;
    unsigned char *b = slurp(p, &n);
    write_bytes(p, 0, b, n / 2, NULL, 0);   /* half the compressed file */
    free(b);
    expect_fail(p, "truncated");
}

Test(idx, gzip_missing_trailer)
{
    const char *p = path_of("notrailer.gz");
    uint32_t dims[1] = {10};
    write_idx(p, 1, 0x08, 1, dims, "0123456789", 10);
    size_t n;
    unsigned char *b = slurp(p, &n);
    write_bytes(p, 0, b, n - 8, NULL, 0);   /* drop CRC32 and ISIZE */
    free(b);
    expect_fail(p, "truncated: the gzip stream ends before its trailer");
}

Test(idx, bad_magic)
{
    const char *p = path_of("magic");
    write_bytes(p, 0, "PK\3\4 not an idx file", 20, NULL, 0);
    expect_fail(p, "bad magic");
}

Test(idx, bad_type_byte)
{
    const char *p = path_of("type");
    uint32_t dims[1] = {1};
    write_idx(p, 0, 0x07, 1, dims, "x", 1);
    expect_fail(p, "bad type byte 0x07");
}

Test(idx, f64_is_rejected_clearly)
{
    const char *p = path_of("f64");
    uint32_t dims[1] = {1};
    write_idx(p, 0, 0x0E, 1, dims, "\0\0\0\0\0\0\0\0", 8);
    expect_fail(p, "unsupported IDX type f64");
}

Test(idx, bad_number_of_dims)
{
    const char *p0 = path_of("dims0"), *p9 = path_of("dims9");
    uint32_t dims[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    write_idx(p0, 0, 0x08, 0, dims, "x", 1);
    write_idx(p9, 0, 0x08, 9, dims, "x", 1);
    expect_fail(p0, "bad number of dims 0");
    expect_fail(p9, "bad number of dims 9");
}

Test(idx, zero_size_dim)
{
    const char *p = path_of("zero");
    uint32_t dims[2] = {4, 0};
    write_idx(p, 0, 0x08, 2, dims, NULL, 0);
    expect_fail(p, "dim 2 has size 0");
}

/* 2^40 elements: rejected from the header, before any allocation */
Test(idx, header_claiming_2_to_the_40_elements)
{
    const char *p = path_of("huge.gz");
    uint32_t dims[3] = {65536, 65536, 256};
    write_idx(p, 1, 0x08, 3, dims, "abc", 3);
    expect_fail(p, "dims too large: {65536,65536,256} u8");
}

/* sizes whose product overflows 64 bits */
Test(idx, overflowing_product)
{
    const char *p = path_of("overflow");
    uint32_t dims[8];
    for (int i = 0; i < 8; i++) dims[i] = 0xFFFFFFFFu;
    write_idx(p, 0, 0x0C, 8, dims, "abcd", 4);
    expect_fail(p, "dims too large: {4294967295,4294967295,4294967295,4294967295,4294967295,"
                   "4294967295,4294967295,4294967295} i32 exceeds the limit of 17179869184 bytes");
}

/* a header within the limit (8 GiB of f32) over a tiny file: the reader
 * grows its buffer only as data arrives, so this fails fast and small */
Test(idx, lying_header_within_limit)
{
    const char *p = path_of("liar.gz");
    uint32_t dims[2] = {65536, 32768};
    write_idx(p, 1, 0x0D, 2, dims, "abcdefgh", 8);
    mp_memstats before = mp_memory(MP_CPU);
    expect_fail(p, "truncated: expected 8589934592 data bytes, got 8");
    cr_assert_eq(mp_memory(MP_CPU).in_use, before.in_use);
}

Test(idx, extra_bytes_after_data)
{
    const char *p = path_of("extra");
    uint32_t dims[1] = {3};
    write_idx(p, 0, 0x08, 1, dims, "abcd", 4);
    expect_fail(p, "extra bytes after the 3 data bytes");
}

/* deflate data overwritten in the middle */
Test(idx, corrupt_gzip_stream)
{
    const char *p = path_of("corrupt.gz");
    uint32_t dims[1] = {50000};
    unsigned char *v = malloc(50000);
    for (int i = 0; i < 50000; i++) v[i] = (unsigned char)((i % 251) ^ (i >> 9));
    write_idx(p, 1, 0x08, 1, dims, v, 50000);
    free(v);
    size_t n;
    unsigned char *b = slurp(p, &n);
    for (size_t i = n / 3; i < n / 3 + 16; i++) b[i] ^= 0xA5;
    write_bytes(p, 0, b, n, NULL, 0);
    free(b);
    expect_fail(p, "gzip data corrupt");
}

/* payload intact, CRC32 in the trailer wrong */
Test(idx, gzip_crc_mismatch)
{
    const char *p = path_of("crc.gz");
    uint32_t dims[1] = {10};
    write_idx(p, 1, 0x08, 1, dims, "0123456789", 10);
    size_t n;
    unsigned char *b = slurp(p, &n);
    b[n - 8] ^= 1;
    write_bytes(p, 0, b, n, NULL, 0);
    free(b);
    expect_fail(p, "gzip data corrupt (incorrect data check)");
}

/* ---- permutations ---- */

static int is_permutation(const mp_tensor *t, int64_t n)
{
    const int32_t *p = mp_data(t);
    char *seen = calloc((size_t)n, 1);
    int ok = t->dtype == MP_I32 && t->ndim == 1 && t->numel == n;
    for (int64_t i = 0; ok && i < n; i++) {
        ok = p[i] >= 0 && p[i] < n && !seen[p[i]];
        if (ok) seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

Test(perm, is_a_permutation_and_reproducible)
{
    mp_tensor *a = mp_randperm(60000, 42), *b = mp_randperm(60000, 42), *c = mp_randperm(60000, 43);
    cr_assert(a && b && c, "%s", mp_error());
    cr_assert(is_permutation(a, 60000) && is_permutation(c, 60000));
    cr_assert_eq(memcmp(mp_data(a), mp_data(b), 60000 * 4), 0);
    cr_assert_neq(memcmp(mp_data(a), mp_data(c), 60000 * 4), 0);
    mp_release(a);
    mp_release(b);
    mp_release(c);
}

/* pinned values: a change of generator, seeding or shuffle shows up here,
 * because it would silently change every seeded run's order */
Test(perm, pinned_values)
{
    mp_tensor *t = mp_randperm(10, 42);
    cr_assert(t);
    int32_t want[10] = {9, 1, 4, 2, 8, 7, 6, 5, 3, 0};   /* also from a Python model of the code */
    cr_assert_arr_eq(mp_data(t), want, sizeof want);
    mp_release(t);
}

/* each of the 6 orders of 3 elements about equally often over 60000 seeds
 * (expected 10000 each, standard deviation about 91: 6 sigma bounds) */
Test(perm, uniform_over_small_n)
{
    int count[6] = {0};
    for (uint64_t s = 0; s < 60000; s++) {
        mp_tensor *t = mp_randperm(3, s);
        const int32_t *p = mp_data(t);
        count[p[0] * 2 + (p[1] > p[2])]++;
        mp_release(t);
    }
    for (int i = 0; i < 6; i++) cr_assert(count[i] > 9450 && count[i] < 10550, "order %d: %d", i, count[i]);
}

Test(perm, bad_sizes)
{
    mp_tensor *one = mp_randperm(1, 5);
    cr_assert(one && ((int32_t *)mp_data(one))[0] == 0);
    mp_release(one);
    cr_assert_null(mp_randperm(0, 1));
    cr_assert(strstr(mp_error(), "n must lie in [1, 2147483647] (got 0)"), "%s", mp_error());
    cr_assert_null(mp_randperm((int64_t)INT32_MAX + 1, 1));
}

Test(perm, draw_seed_follows_manual_seed)
{
    uint64_t s, o0, o1;
    mp_manual_seed(7);
    uint64_t a = mp_draw_seed(), b = mp_draw_seed();
    mp_rng_get(&s, &o1);
    mp_manual_seed(7);
    mp_rng_get(&s, &o0);
    cr_assert_neq(a, b);
    cr_assert_eq(o1 - o0, 4, "two draws move the stream by two counters each");
    cr_assert_eq(mp_draw_seed(), a);
    cr_assert_eq(mp_draw_seed(), b);
    mp_manual_seed(8);
    cr_assert_neq(mp_draw_seed(), a);
}

