/*
 * data_file.c: the bytes of a regular file, for mp.data.text.
 *
 * The path is untrusted: it may name a directory, a FIFO that nobody writes, a
 * device that never ends (/dev/zero) or a file far larger than memory. So the
 * file's kind and size are checked before a byte is read: stat() first, so
 * that open() never runs on a FIFO or a device (opening either can block or
 * have side effects), then open() with O_NONBLOCK (a FIFO swapped in between
 * cannot block it) and fstat() on the descriptor, which is what the reads use.
 * Anything but a regular file is refused by its kind; a file over max_bytes
 * is refused by its size.
 *
 * The bytes go straight into a u8 tensor of the size fstat reports, so a
 * file costs one byte of memory per byte. A regular file may still hold more
 * than fstat said (procfs reports 0; a log may grow while it is read): reading
 * goes on while bytes arrive, the tensor doubling, and stops with an error
 * once there are more than max_bytes. Memory is bounded by max_bytes whatever
 * the file does.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/data_file.h"
#include "engine/error.h"

/* what a file that is not a regular file is, for the message */
static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

static int check_file(const char *path, const struct stat *st, int64_t max_bytes)
{
    if (!S_ISREG(st->st_mode)) {
        const char *k = file_kind(st->st_mode);
        if (strncmp(k, "not ", 4) == 0) return mp_fail(MP_EINVAL, "path '%s' is %s", path, k);
        return mp_fail(MP_EINVAL, "path '%s' is %s, not a regular file", path, k);
    }
    if ((int64_t)st->st_size > max_bytes)
        return mp_fail(MP_EINVAL, "path '%s' has %lld bytes, more than max_bytes = %lld", path,
                       (long long)st->st_size, (long long)max_bytes);
    return 0;
}

/* read(2) until n bytes have arrived or the file ends; *got counts them */
static int read_upto(int fd, const char *path, unsigned char *buf, int64_t n, int64_t *got)
{
    *got = 0;
    while (*got < n) {
        size_t want = n - *got > (1 << 30) ? (size_t)1 << 30 : (size_t)(n - *got);
        ssize_t r = read(fd, buf + *got, want);
        if (r > 0) { *got += r; continue; }
        if (r == 0) return 0;
        if (errno == EINTR) continue;
        return mp_fail(MP_EINVAL, "cannot read path '%s': %s", path, strerror(errno));
    }
    return 0;
}

/* a u8 tensor holding the first n bytes of t (n <= t's size) */
static mp_tensor *resized(mp_tensor *t, int64_t have, int64_t n)
{
    mp_tensor *r = mp_empty(MP_U8, MP_CPU, 1, &n);
    if (r) memcpy(mp_data(r), mp_data(t), (size_t)have);
    return r;
}

/* everything the descriptor gives, starting with room for `size` bytes */
static int read_all(int fd, const char *path, int64_t size, int64_t max_bytes, mp_tensor **out)
{
    int64_t cap = size > 0 ? size : 4096, have = 0;
    if (cap > max_bytes) cap = max_bytes;
    mp_tensor *t = mp_empty(MP_U8, MP_CPU, 1, &cap);
    if (!t) return -1;
    for (;;) {
        int64_t got;
        unsigned char more;
        if (read_upto(fd, path, (unsigned char *)mp_data(t) + have, cap - have, &got)) goto fail;
        have += got;
        if (have < cap) break;                                   /* the end of the file */
        if (read_upto(fd, path, &more, 1, &got)) goto fail;     /* more than fstat said? */
        if (!got) break;
        if (have >= max_bytes) {
            mp_fail(MP_EINVAL, "path '%s' has more than max_bytes = %lld bytes", path, (long long)max_bytes);
            goto fail;
        }
        int64_t ncap = cap <= max_bytes / 2 ? cap * 2 : max_bytes;
        mp_tensor *n = resized(t, have, ncap);
        if (!n) goto fail;
        mp_release(t);
        t = n, cap = ncap;
        ((unsigned char *)mp_data(t))[have++] = more;
    }
    if (have == 0) { mp_release(t); *out = NULL; return 0; }
    if (have < cap) {   /* the file was shorter than fstat said, or grew by less than the doubling */
        mp_tensor *n = resized(t, have, have);
        if (!n) goto fail;
        mp_release(t);
        t = n;
    }
    *out = t;
    return 0;
fail:
    mp_release(t);
    return -1;
}

int mp_read_file_bytes(const char *path, int64_t max_bytes, mp_tensor **out)
{
    *out = NULL;
    if (!path || !*path) return mp_fail(MP_EINVAL, "path must be a non-empty string");
    if (max_bytes < 1) return mp_fail(MP_EINVAL, "max_bytes must be positive (got %lld)", (long long)max_bytes);
    struct stat st;
    if (stat(path, &st) != 0) return mp_fail(MP_EINVAL, "cannot open path '%s': %s", path, strerror(errno));
    if (check_file(path, &st, max_bytes)) return -1;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return mp_fail(MP_EINVAL, "cannot open path '%s': %s", path, strerror(errno));
    int rc = fstat(fd, &st) != 0 ? mp_fail(MP_EINVAL, "cannot read path '%s': %s", path, strerror(errno))
           : check_file(path, &st, max_bytes) ? -1   /* replaced since the stat above */
           : read_all(fd, path, (int64_t)st.st_size, max_bytes, out);
    close(fd);
    return rc;
}
