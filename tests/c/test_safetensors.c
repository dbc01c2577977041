/*
 * test_safetensors.c: engine/io_safetensors.c, the checkpoint file format.
 *
 * Round trips are checked bit for bit in every dtype, with the bit patterns a
 * float conversion would disturb (NaN payloads, signalling NaNs, infinities,
 * subnormals, negative zero). Each malformed-file case is built here byte by
 * byte and must fail with a message naming the file and the problem; a sweep
 * of truncated and corrupted files checks that no input crashes the loader
 * (run the binary under valgrind to see that none reads out of bounds).
 * Atomicity is checked with the engine's injected write failure: a save that
 * fails at any byte leaves the old file as it was and no temporary behind.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/io_safetensors.h"
#include "engine/error.h"

/* ---- a scratch directory per test ---------------------------------------- */

static char dir[64];

static void make_dir(void)
{
    strcpy(dir, "/tmp/mp_st_test_XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp failed");
}

static int count_entries(const char *d)
{
    DIR *dp = opendir(d);
    int n = 0;
    for (struct dirent *e; dp && (e = readdir(dp));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (dp) closedir(dp);
    return n;
}

static void remove_dir(void)
{
    DIR *dp = opendir(dir);
    char p[512];
    for (struct dirent *e; dp && (e = readdir(dp));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (rmdir(p)) unlink(p);
    }
    if (dp) closedir(dp);
    rmdir(dir);
}

TestSuite(st, .init = make_dir, .fini = remove_dir);

static const char *file(const char *name)
{
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* ---- tensors with exact bit patterns -------------------------------------- */

static mp_tensor *from_bits(mp_dtype dt, int nd, const int64_t *shape, const void *bits)
{
    mp_tensor *t = mp_empty(dt, MP_CPU, nd, shape);
    cr_assert(t, "%s", mp_error());
    memcpy(mp_data(t), bits, mp_nbytes(t));
    return t;
}

static const uint32_t F32_BITS[] = {
    0x00000000, 0x80000000, 0x3f800000, 0xbfc00000, 0x7f7fffff, 0x00000001, 0x807fffff,
    0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7fc00001, 0x7f800001 /* signalling */, 0x3dcccccd,
};
static const uint16_t F16_BITS[] = {
    0x0000, 0x8000, 0x3c00, 0x7bff, 0x0001, 0x03ff, 0x8001, 0x0400, 0x7c00, 0xfc00,
    0x7e00, 0xfe00, 0x7c01 /* signalling */, 0x7fff, 0x2e66, 0xabcd,
};
static const uint16_t BF16_BITS[] = {
    0x0000, 0x8000, 0x3f80, 0x7f7f, 0x0001, 0x007f, 0x8001, 0x0080, 0x7f80, 0xff80,
    0x7fc0, 0xffc0, 0x7f81 /* signalling */, 0x7fff, 0x3dcd, 0xc2f7,
};
static const int32_t I32_BITS[] = {0, 1, -1, 2147483647, -2147483647 - 1, 123456789, -42, 65536};

typedef struct { const char *name; mp_tensor *t; } named;

/* one tensor of each dtype in several shapes, a scalar among them */
static int make_all(named *out)
{
    static uint8_t u8[256];
    for (int i = 0; i < 256; i++) u8[i] = (uint8_t)i;
    int64_t s14[1] = {14}, s44[2] = {4, 4}, s8[1] = {8}, s2x2x2x2[4] = {2, 2, 2, 2}, s4x8x8[3] = {4, 8, 8};
    out[0] = (named){"f32", from_bits(MP_F32, 1, s14, F32_BITS)};
    out[1] = (named){"layer.f16", from_bits(MP_F16, 2, s44, F16_BITS)};
    out[2] = (named){"bf16 \"quoted\"\n", from_bits(MP_BF16, 4, s2x2x2x2, BF16_BITS)};
    out[3] = (named){"i32", from_bits(MP_I32, 1, s8, I32_BITS)};
    out[4] = (named){"u8/all", from_bits(MP_U8, 3, s4x8x8, u8)};
    out[5] = (named){"scalar", from_bits(MP_F32, 0, NULL, &F32_BITS[11])};
    out[6] = (named){"ünïcødé ✓", from_bits(MP_BF16, 0, NULL, &BF16_BITS[12])};
    return 7;
}

static int save_named(const char *path, const named *v, int n, int nmeta, const char *const *k,
                      const char *const *val)
{
    const char *names[16];
    mp_tensor *ts[16];
    for (int i = 0; i < n; i++) names[i] = v[i].name, ts[i] = v[i].t;
    return mp_st_save(path, n, names, ts, nmeta, k, val);
}

static const named *find(const named *v, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name)) return &v[i];
    return NULL;
}

static void release_all(named *v, int n)
{
    for (int i = 0; i < n; i++) mp_release(v[i].t);
}

/* ---- round trips ----------------------------------------------------------- */

Test(st, round_trip_every_dtype_bit_for_bit)
{
    named v[16];
    int n = make_all(v);
    const char *path = file("all.safetensors");
    cr_assert_eq(save_named(path, v, n, 0, NULL, NULL), 0, "%s", mp_error());
    mp_stfile *f = mp_st_load(path);
    cr_assert(f, "%s", mp_error());
    cr_assert_eq(f->ntensors, n);
    cr_assert_eq(f->nmeta, 0);
    for (int i = 0; i < f->ntensors; i++) {
        const named *want = find(v, n, f->names[i]);
        cr_assert(want, "unexpected tensor '%s'", f->names[i]);
        mp_tensor *a = want->t, *b = f->tensors[i];
        cr_assert_eq(b->dtype, a->dtype, "%s", want->name);
        cr_assert_eq(b->dev, MP_CPU);
        cr_assert_eq(b->ndim, a->ndim, "%s", want->name);
        for (int d = 0; d < a->ndim; d++) cr_assert_eq(b->shape[d], a->shape[d]);
        cr_assert_eq(memcmp(mp_data(a), mp_data(b), mp_nbytes(a)), 0, "bits of %s differ", want->name);
    }
    mp_st_free(f);
    release_all(v, n);
}

Test(st, data_lies_in_the_order_given_after_an_aligned_header)
{
    named v[16];
    int n = make_all(v);
    const char *path = file("layout.safetensors");
    cr_assert_eq(save_named(path, v, n, 0, NULL, NULL), 0, "%s", mp_error());
    size_t len;
    unsigned char *b = slurp(path, &len);
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | b[i];
    cr_assert_eq(h % 8, 0, "header length %llu is not a multiple of 8", (unsigned long long)h);
    cr_assert_eq(b[8], '{');
    size_t at = 8 + h;
    for (int i = 0; i < n; i++) {
        cr_assert(at + mp_nbytes(v[i].t) <= len);
        cr_assert_eq(memcmp(b + at, mp_data(v[i].t), mp_nbytes(v[i].t)), 0, "%s", v[i].name);
        at += mp_nbytes(v[i].t);
    }
    cr_assert_eq(at, len);
    free(b);
    release_all(v, n);
}

Test(st, metadata_round_trips)
{
    const char *keys[] = {"format", "step", "quote\"and\\back", "multi\nline", "unicode ✓ ü", "empty", ""};
    const char *vals[] = {"pt", "12345", "va\"l\\ue", "a\nb\tc", "日本語", "", "empty key"};
    int64_t s1[1] = {1};
    uint32_t one = 0x3f800000;
    named v[1] = {{"w", from_bits(MP_F32, 1, s1, &one)}};
    const char *path = file("meta.safetensors");
    cr_assert_eq(save_named(path, v, 1, 7, keys, vals), 0, "%s", mp_error());
    mp_stfile *f = mp_st_load(path);
    cr_assert(f, "%s", mp_error());
    cr_assert_eq(f->nmeta, 7);
    for (int i = 0; i < 7; i++) {
        const char *got = mp_st_meta(f, keys[i]);
        cr_assert(got, "metadata key '%s' missing", keys[i]);
        cr_assert_str_eq(got, vals[i]);
    }
    cr_assert_null(mp_st_meta(f, "absent"));
    mp_st_free(f);
    release_all(v, 1);
}

Test(st, an_empty_file_of_no_tensors_round_trips)
{
    const char *path = file("empty.safetensors");
    cr_assert_eq(mp_st_save(path, 0, NULL, NULL, 0, NULL, NULL), 0, "%s", mp_error());
    mp_stfile *f = mp_st_load(path);
    cr_assert(f, "%s", mp_error());
    cr_assert_eq(f->ntensors, 0);
    cr_assert_eq(f->nmeta, 0);
    mp_st_free(f);
}

Test(st, utf8_validation_matches_the_standard)
{
    const char *good[] = {"", "ascii", "\xc3\xbc", "\xe2\x9c\x93", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf", "\xed\x9f\xbf"};
    const char *bad[] = {"\xff", "\xc0\x80" /* overlong NUL */, "\xc3", "\xe2\x9c", "\xed\xa0\x80" /* surrogate */,
                         "\xf4\x90\x80\x80" /* past U+10FFFF */, "\xe0\x80\xaf" /* overlong */, "\x80", "a\xc3("};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        cr_assert(mp_utf8_valid(good[i], strlen(good[i])), "good[%zu] rejected", i);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert(!mp_utf8_valid(bad[i], strlen(bad[i])), "bad[%zu] accepted", i);
    cr_assert(!mp_utf8_valid("a\0b", 3), "a NUL byte accepted");
}

/* ---- save: arguments, file system errors, atomicity ------------------------ */

static void save_fails(const char *path, int n, const char *const *names, mp_tensor *const *ts, const char *frag)
{
    cr_assert_eq(mp_st_save(path, n, names, ts, 0, NULL, NULL), -1, "save of %s succeeded", path);
    cr_assert(strstr(mp_error(), frag), "message '%s' lacks '%s'", mp_error(), frag);
    cr_assert(strstr(mp_error(), path), "message '%s' does not name %s", mp_error(), path);
}

Test(st, save_rejects_bad_names)
{
    int64_t s1[1] = {1};
    uint32_t one = 0x3f800000;
    mp_tensor *t = from_bits(MP_F32, 1, s1, &one);
    mp_tensor *ts[2] = {t, t};
    const char *dup[2] = {"a", "a"}, *meta[1] = {"__metadata__"}, *bad[1] = {"bad \xff name"};
    save_fails(file("x"), 2, dup, ts, "tensor name 'a' is used twice");
    save_fails(file("x"), 1, meta, ts, "'__metadata__' cannot name a tensor");
    save_fails(file("x"), 1, bad, ts, "not valid UTF-8");
    cr_assert_eq(count_entries(dir), 0, "a rejected save wrote something");
    mp_release(t);
}

Test(st, save_into_a_missing_directory_names_the_path)
{
    int64_t s1[1] = {1};
    uint32_t one = 0x3f800000;
    mp_tensor *t = from_bits(MP_F32, 1, s1, &one);
    const char *names[1] = {"w"};
    save_fails(file("no/such/dir/x.safetensors"), 1, names, &t, "No such file or directory");
    mkdir(file("sub"), 0755);
    save_fails(file("sub"), 1, names, &t, "is a directory");
    cr_assert_eq(count_entries(dir), 1);
    mp_release(t);
}

Test(st, failed_save_leaves_the_old_file_and_no_temporary)
{
    named v[16];
    int n = make_all(v);
    const char *path = file("ckpt.safetensors");
    cr_assert_eq(save_named(path, v, 2, 0, NULL, NULL), 0, "%s", mp_error());
    chmod(path, 0640);
    size_t old_len, new_len, full;
    unsigned char *old = slurp(path, &old_len);
    cr_assert_eq(save_named(file("full"), v, n, 0, NULL, NULL), 0, "%s", mp_error());
    free(slurp(file("full"), &full));
    unlink(file("full"));
    /* fail in the length, in the header, in the data, at the last byte */
    long long at[] = {0, 3, 8, 40, (long long)full / 2, (long long)full * 3 / 4, (long long)full - 1};
    for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
        mp_st_fail_after(at[k]);
        cr_assert_eq(save_named(path, v, n, 0, NULL, NULL), -1, "save failing at byte %lld succeeded", at[k]);
        cr_assert(strstr(mp_error(), "No space left on device"), "%s", mp_error());
        cr_assert(strstr(mp_error(), "left unchanged"), "%s", mp_error());
        unsigned char *now = slurp(path, &new_len);
        cr_assert(new_len == old_len && memcmp(now, old, old_len) == 0, "old file changed (fail at %lld)", at[k]);
        free(now);
        cr_assert_eq(count_entries(dir), 1, "a temporary file was left behind (fail at %lld)", at[k]);
    }
    /* the hook is one-shot: the next save goes through and keeps the file's mode */
    cr_assert_eq(save_named(path, v, n, 0, NULL, NULL), 0, "%s", mp_error());
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0640);
    mp_stfile *f = mp_st_load(path);
    cr_assert(f, "%s", mp_error());
    cr_assert_eq(f->ntensors, n);
    mp_st_free(f);
    free(old);
    release_all(v, n);
}

Test(st, failed_first_save_leaves_nothing)
{
    named v[16];
    int n = make_all(v);
    mp_st_fail_after(100);
    cr_assert_eq(save_named(file("new.safetensors"), v, n, 0, NULL, NULL), -1);
    cr_assert_eq(count_entries(dir), 0);
    release_all(v, n);
}

/* ---- malformed files, built byte by byte ------------------------------------ */

/* an 8-byte little-endian length, then the header text, then `data` zero bytes */
static void write_file(const char *path, uint64_t hlen, const char *hdr, size_t data)
{
    size_t n = strlen(hdr);
    unsigned char *b = calloc(1, 8 + n + data + 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, hdr, n);
    spit(path, b, 8 + n + data);
    free(b);
}

static void load_fails(const char *path, const char *frag)
{
    mp_clear_error();
    mp_stfile *f = mp_st_load(path);
    cr_assert_null(f, "loading %s succeeded (expected '%s')", path, frag);
    cr_assert(strstr(mp_error(), frag), "message '%s' lacks '%s'", mp_error(), frag);
    cr_assert(strstr(mp_error(), path), "message '%s' does not name %s", mp_error(), path);
}

/* a file with header text hdr (its real length) and `data` bytes must fail with frag */
static void header_fails(const char *hdr, size_t data, const char *frag)
{
    const char *path = file("bad.safetensors");
    write_file(path, strlen(hdr), hdr, data);
    load_fails(path, frag);
}

static void header_loads(const char *hdr, size_t data)
{
    const char *path = file("good.safetensors");
    write_file(path, strlen(hdr), hdr, data);
    mp_stfile *f = mp_st_load(path);
    cr_assert(f, "%s", mp_error());
    mp_st_free(f);
}

Test(st, load_rejects_a_missing_file_and_a_directory)
{
    load_fails(file("absent.safetensors"), "cannot open: No such file or directory");
    mkdir(file("d"), 0755);
    load_fails(file("d"), "not a regular file");
}

Test(st, load_rejects_files_shorter_than_8_bytes)
{
    for (size_t n = 0; n < 8; n++) {
        spit(file("short"), "\x02\0\0\0\0\0\0", n);
        load_fails(file("short"), "too short for a safetensors file");
    }
}

Test(st, load_rejects_a_header_length_past_the_end)
{
    write_file(file("a"), 100, "{}", 0);
    load_fails(file("a"), "header length 100 runs past the end of the file");
    write_file(file("b"), UINT64_MAX, "{}", 0);
    load_fails(file("b"), "runs past the end of the file");
    write_file(file("c"), 3, "{}", 0);      /* one byte short */
    load_fails(file("c"), "header length 3 runs past");
}

Test(st, load_says_a_text_file_is_not_a_safetensors_file)
{
    const char *text = "just some text, more than eight bytes\n";
    spit(file("t.txt"), text, strlen(text));
    load_fails(file("t.txt"), "not a safetensors file (bad header)");
    spit(file("bin"), "\x01\x02\x03\x04\x05\x06\x07\x08\x00\x01", 10);   /* no '{' after the length */
    load_fails(file("bin"), "not a safetensors file (bad header)");
}

Test(st, load_rejects_an_absurdly_large_header_length)
{
    /* a sparse file big enough that the length fits inside it */
    const char *path = file("huge");
    write_file(path, 200000000, "{}", 0);
    cr_assert_eq(truncate(path, 200000016), 0);
    load_fails(path, "header length 200000000 is too large");
}

Test(st, load_rejects_invalid_json)
{
    header_fails("{\"a\": ", 0, "invalid JSON in the header");
    header_fails("{\"a\": {\"dtype\": \"F32\",}}", 0, "invalid JSON in the header");
    header_fails("", 0, "invalid JSON in the header");
    header_fails("{} x", 0, "trailing bytes");
}

Test(st, header_padding_and_nul_handling)
{
    header_loads("{}      ", 0);
    /* a NUL inside the header is not whitespace */
    const char *path = file("nul");
    write_file(path, 4, "{}", 0);   /* the header's last two bytes are the NUL padding of write_file */
    load_fails(path, "runs past the end");
    unsigned char b[8 + 4] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' '};
    spit(path, b, sizeof b);
    load_fails(path, "trailing bytes");
}

Test(st, load_rejects_a_header_that_is_not_an_object)
{
    header_fails("[1, 2]  ", 0, "the header is not a JSON object");
    header_fails("\"text\"", 0, "the header is not a JSON object");
    header_fails("42", 0, "the header is not a JSON object");
    header_fails("null", 0, "the header is not a JSON object");
}

Test(st, load_rejects_entries_missing_a_field)
{
    header_fails("{\"x\": 5}", 0, "entry for tensor 'x' is not an object");
    header_fails("{\"x\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "tensor 'x' has no dtype");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "tensor 'x' has no shape");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "tensor 'x' has no data_offsets");
    header_fails("{\"x\": {\"DTYPE\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "has no dtype");
}

Test(st, load_rejects_fields_of_the_wrong_json_type)
{
    header_fails("{\"x\": {\"dtype\": 5, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "dtype of tensor 'x' is not a string");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4, "shape of tensor 'x' is not an array");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [\"1\"], \"data_offsets\": [0, 4]}}", 4, "not a non-negative integer");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": 4}}", 4, "not a pair of non-negative integers");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4, "not a pair of non-negative integers");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 4, "not a pair");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", \"4\"]}}", 4, "not a pair");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0.5, 4]}}", 4, "not a pair");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4, "not a pair");
}

Test(st, load_rejects_unknown_dtypes)
{
    const char *bad[] = {"U16", "I8", "BOOL", "f32", "f64", "i64", "F8_E4M3FNUZ", "F8_E8M0", "f8_e4m3", ""};
    char hdr[200], frag[80];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(hdr, sizeof hdr, "{\"x\": {\"dtype\": \"%s\", \"shape\": [1], \"data_offsets\": [0, 8]}}", bad[i]);
        snprintf(frag, sizeof frag, "unsupported dtype %s for tensor 'x'", bad[i]);
        header_fails(hdr, 8, frag);
    }
}

/* header text and raw data bytes into a file */
static void write_with_data(const char *path, const char *hdr, const unsigned char *data, size_t n)
{
    size_t h = strlen(hdr);
    unsigned char *b = malloc(8 + h + n);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, hdr, h);
    memcpy(b + 8 + h, data, n);
    spit(path, b, 8 + h + n);
    free(b);
}

/* PyTorch writes integer tensors (a batch norm's num_batches_tracked) as I64:
 * read into i32 when every value fits, refused with the value otherwise */
Test(st, load_reads_i64_into_i32_and_refuses_what_does_not_fit)
{
    const int64_t vals[3] = {7, -2147483648LL, 2147483647LL};
    unsigned char data[24];
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 8; b++) data[8 * i + b] = (unsigned char)((uint64_t)vals[i] >> (8 * b));
    const char *path = file("i64.safetensors");
    write_with_data(path, "{\"n\": {\"dtype\": \"I64\", \"shape\": [3], \"data_offsets\": [0, 24]}}", data, 24);
    mp_stfile *f = mp_st_load(path);
    cr_assert_not_null(f, "%s", mp_error());
    cr_assert_eq(f->ntensors, 1);
    cr_assert_eq(f->tensors[0]->dtype, MP_I32);
    const int32_t *v = mp_data(f->tensors[0]);
    cr_assert(v[0] == 7 && v[1] == INT32_MIN && v[2] == INT32_MAX);
    mp_st_free(f);
    data[8 + 4] = 0xff, data[8 + 5] = 0xff, data[8 + 6] = 0xff, data[8 + 7] = 0xfe;   /* a large negative value */
    write_with_data(path, "{\"n\": {\"dtype\": \"I64\", \"shape\": [3], \"data_offsets\": [0, 24]}}", data, 24);
    load_fails(path, "outside i32's range");
    header_fails("{\"n\": {\"dtype\": \"I64\", \"shape\": [3], \"data_offsets\": [0, 12]}}", 12, "takes 24 bytes");
}

Test(st, load_rejects_bad_shapes)
{
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
                 "shape of tensor 'x' has an entry that is not a non-negative integer");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4, "not a non-negative integer");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [true], \"data_offsets\": [0, 4]}}", 4, "not a non-negative integer");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1e300], \"data_offsets\": [0, 4]}}", 4, "not a non-negative integer");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [[1]], \"data_offsets\": [0, 4]}}", 4, "not a non-negative integer");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [2, 0], \"data_offsets\": [0, 0]}}", 0, "zero-sized dim");
    header_fails("{\"x\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 1]}}", 1,
                 "tensor 'x' has 9 dims (at most 8 supported)");
    /* 2^52 * 2^52 * 4 bytes overflows 64 bits */
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [4503599627370496, 4503599627370496], \"data_offsets\": [0, 4]}}",
                 4, "shape of tensor 'x' is too large");
}

Test(st, load_rejects_offsets_out_of_order)
{
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8,
                 "data_offsets [8, 4] of tensor 'x' are out of order");
}

Test(st, load_rejects_overlapping_offsets)
{
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 12,
                 "tensors 'a' and 'b' overlap");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "overlap");
}

Test(st, load_rejects_offsets_leaving_the_data_section)
{
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4,
                 "data_offsets [0, 8] of tensor 'x' leave the data section (4 bytes)");
    header_fails("{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [9007199254740991, 9007199254740992]}}", 4,
                 "leave the data section");
}

Test(st, load_rejects_offsets_that_do_not_cover_the_data)
{
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8,
                 "data bytes [0, 4) belong to no tensor");
    header_fails("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}", 12,
                 "data bytes [4, 8) belong to no tensor");
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8,
                 "data bytes [4, 8) at the end of the file belong to no tensor");
    header_fails("{}", 3, "data bytes [0, 3) at the end");
}

Test(st, load_rejects_a_shape_that_disagrees_with_its_offsets)
{
    header_fails("{\"x\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8,
                 "tensor 'x' of shape {3} and dtype F32 takes 12 bytes but data_offsets [0, 8] span 8");
    header_fails("{\"x\": {\"dtype\": \"BF16\", \"shape\": [], \"data_offsets\": [0, 4]}}", 4, "takes 2 bytes");
}

Test(st, load_rejects_bad_metadata_and_duplicates)
{
    header_fails("{\"__metadata__\": [1]}", 0, "__metadata__ is not an object");
    header_fails("{\"__metadata__\": {\"step\": 5}}", 0, "__metadata__ value for 'step' is not a string");
    header_fails("{\"__metadata__\": {}, \"__metadata__\": {}}", 0, "__metadata__ occurs twice");
    header_fails("{\"__metadata__\": {\"a\": \"1\", \"a\": \"2\"}}", 0, "__metadata__ key 'a' occurs twice");
    header_fails("{\"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]},"
                 " \"x\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}", 2,
                 "tensor 'x' occurs twice in the header");
}

Test(st, load_accepts_what_the_format_allows)
{
    /* extra fields ignored, any key order, data in an order other than the header's */
    header_loads("{\"b\": {\"data_offsets\": [4, 6], \"shape\": [2], \"dtype\": \"U8\", \"extra\": 1},"
                 " \"a\": {\"dtype\": \"I32\", \"shape\": [], \"data_offsets\": [0, 4]},"
                 " \"__metadata__\": {\"format\": \"pt\"}}   ", 6);
    header_loads("{}", 0);
}

/* Every prefix of a valid file, and the file with each header byte replaced,
 * must load or fail cleanly: under valgrind this shows there is no bad read. */
Test(st, truncated_and_corrupted_files_never_crash)
{
    named v[16];
    int n = make_all(v);
    const char *good = file("good.safetensors"), *bad = file("bad.safetensors");
    cr_assert_eq(save_named(good, v, 3, 0, NULL, NULL), 0, "%s", mp_error());
    size_t len;
    unsigned char *b = slurp(good, &len);
    for (size_t k = 0; k < len; k++) {
        spit(bad, b, k);
        load_fails(bad, "'");
    }
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | b[i];
    const unsigned char subst[] = {0, '"', '}', ']', '9', '-', ' ', 0xff};
    int loaded = 0;
    for (size_t k = 0; k < 8 + h; k++) {
        for (size_t s = 0; s < sizeof subst; s++) {
            unsigned char keep = b[k];
            b[k] = subst[s];
            spit(bad, b, len);
            b[k] = keep;
            mp_stfile *f = mp_st_load(bad);
            loaded += f != NULL;
            mp_st_free(f);
        }
    }
    cr_assert(loaded > 0 && loaded < (int)(8 + h) * 8, "%d corrupted files loaded", loaded);
    free(b);
    release_all(v, n);
}
