/*
 * test_data_text.c: what mp.data.text stands on: reading a file's bytes
 * (engine/data_file.c) and turning bytes into ids (engine/data_vocab.c).
 *
 * The reader must refuse every kind of file that is not a regular file by
 * its kind, without blocking (a FIFO nobody writes: the test has a timeout),
 * and never hold more than max_bytes, whatever fstat says (procfs says 0).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include "engine/data_file.h"
#include "engine/data_vocab.h"
#include "engine/error.h"
#include "engine/ops.h"

#define SCRATCH_PREFIX "mp_test_text"
#include "tests/c/scratch_dir.h"

TestSuite(file, .init = make_dir, .fini = remove_dir, .timeout = 20);

static const char *path_of(const char *name)
{
    static char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static const char *write_file(const char *name, const void *bytes, size_t n)
{
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    return p;
}

/* the reader must fail with a message holding `want` */
static void expect_fail(const char *path, int64_t max_bytes, const char *want)
{
    mp_tensor *t = (mp_tensor *)1;
    mp_clear_error();
    cr_assert_eq(mp_read_file_bytes(path, max_bytes, &t), -1, "%s: expected failure '%s'", path, want);
    cr_assert_null(t);
    cr_assert(strstr(mp_error(), want), "message '%s' lacks '%s'", mp_error(), want);
}

Test(file, reads_every_byte)
{
    unsigned char v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (unsigned char)(i * 37 + 11);
    const char *p = write_file("bytes.bin", v, sizeof v);
    mp_tensor *t;
    cr_assert_eq(mp_read_file_bytes(p, 1000, &t), 0, "%s", mp_error());
    cr_assert(t && t->dtype == MP_U8 && t->dev == MP_CPU && t->ndim == 1 && t->numel == 1000);
    cr_assert_arr_eq(mp_data(t), v, sizeof v);
    mp_release(t);
}

Test(file, empty_file_gives_no_tensor)
{
    mp_tensor *t = (mp_tensor *)1;
    cr_assert_eq(mp_read_file_bytes(write_file("empty", "", 0), 10, &t), 0, "%s", mp_error());
    cr_assert_null(t);
}

Test(file, larger_than_max_bytes)
{
    char v[1000] = {0};
    const char *p = write_file("k.bin", v, sizeof v);
    char want[256];
    snprintf(want, sizeof want, "path '%s' has 1000 bytes, more than max_bytes = 999", p);
    expect_fail(p, 999, want);
}

Test(file, directory)
{
    char want[128];
    snprintf(want, sizeof want, "path '%s' is a directory, not a regular file", dir);
    expect_fail(dir, 100, want);
}

Test(file, character_devices)
{
    expect_fail("/dev/null", 100, "path '/dev/null' is a character device, not a regular file");
    expect_fail("/dev/zero", 100, "path '/dev/zero' is a character device, not a regular file");
}

/* open(O_RDONLY) on a FIFO waits for a writer: the suite's timeout catches that */
Test(file, fifo_does_not_block)
{
    const char *p = path_of("fifo");
    cr_assert_eq(mkfifo(p, 0600), 0);
    expect_fail(p, 100, "is a FIFO (named pipe), not a regular file");
}

Test(file, socket)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert(s >= 0);
    cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    expect_fail(a.sun_path, 100, "is a socket, not a regular file");
    close(s);
}

Test(file, missing_file_and_bad_arguments)
{
    expect_fail(path_of("none"), 100, "No such file or directory");
    expect_fail("", 100, "path must be a non-empty string");
    expect_fail(write_file("x", "ab", 2), 0, "max_bytes must be positive (got 0)");
}

/* procfs files are regular with st_size 0: what reading gives counts, and is bounded */
Test(file, more_than_fstat_says)
{
    struct stat st;
    cr_assert_eq(stat("/proc/self/maps", &st), 0);
    cr_assert_eq(st.st_size, 0);
    mp_tensor *t;
    cr_assert_eq(mp_read_file_bytes("/proc/self/maps", 1 << 24, &t), 0, "%s", mp_error());
    cr_assert(t && t->numel > 100);
    cr_assert_neq(memchr(mp_data(t), '\n', (size_t)t->numel), NULL);
    mp_release(t);
    expect_fail("/proc/self/maps", 64, "path '/proc/self/maps' has more than max_bytes = 64 bytes");
}

Test(vocab, distinct_bytes_in_order_and_their_ids)
{
    const unsigned char *s = (const unsigned char *)"banana\n";
    unsigned char v[256];
    int n = mp_byte_vocab(s, 7, v);
    cr_assert_eq(n, 4);
    cr_assert_arr_eq(v, ((unsigned char[]){'\n', 'a', 'b', 'n'}), 4);
    mp_tensor *t = mp_byte_ids(s, 7, v, n);
    cr_assert(t && t->dtype == MP_I32 && t->numel == 7, "%s", mp_error());
    cr_assert_arr_eq(mp_data(t), ((int32_t[]){2, 1, 3, 1, 3, 1, 0}), 7 * sizeof(int32_t));
    mp_release(t);
}

Test(vocab, every_byte)
{
    unsigned char s[512], v[256];
    for (int i = 0; i < 512; i++) s[i] = (unsigned char)(255 - i % 256);
    cr_assert_eq(mp_byte_vocab(s, 512, v), 256);
    mp_tensor *t = mp_byte_ids(s, 512, v, 256);
    cr_assert(t);
    for (int i = 0; i < 512; i++) cr_assert_eq(((int32_t *)mp_data(t))[i], 255 - i % 256);
    mp_release(t);
}

Test(vocab, refusals)
{
    const unsigned char *v = (const unsigned char *)"ab";
    cr_assert_null(mp_byte_ids((const unsigned char *)"abx", 3, v, 2));
    cr_assert(strstr(mp_error(), "byte 120 (at offset 2) is not in the vocabulary"), "%s", mp_error());
    cr_assert_null(mp_byte_ids(v, 0, v, 2));
    cr_assert(strstr(mp_error(), "no bytes to encode"), "%s", mp_error());
    cr_assert_null(mp_byte_ids(v, 2, (const unsigned char *)"aa", 2));
    cr_assert(strstr(mp_error(), "the vocabulary repeats byte 97"), "%s", mp_error());
    cr_assert_null(mp_byte_ids(v, 2, v, 0));
}
