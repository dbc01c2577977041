/*
 * data_idx.c: the IDX reader (the format of MNIST and Fashion-MNIST).
 *
 * Layout: two zero bytes, a type byte, a dims byte, one big-endian u32 size per
 * dim, then the elements in big-endian row-major order. zlib's gzread reads
 * gzip files and raw files alike, so one path serves both.
 *
 * The file is untrusted. The header is checked before anything is sized from
 * it (sizes positive, their product within MP_IDX_MAX_BYTES, computed without
 * overflow), and even a header within that limit does not buy an allocation of
 * its claimed size: the payload is read into a buffer that grows only as bytes
 * actually arrive, so a short file fails with "truncated" after using memory
 * proportional to its real contents. Only a complete payload is copied into a
 * tensor, byte-swapped and widened on the way. After the payload the reader
 * asks for one more byte: extra data means the header lied, and for gzip this
 * read also makes zlib check the stream's CRC and length trailer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "engine/data_idx.h"
#include "engine/error.h"

/* the element types of the format, and what each becomes */
typedef struct {
    unsigned char code;
    const char *name;
    int size;            /* bytes per element in the file */
    int dtype;           /* mp_dtype of the tensor, or -1 when rejected */
} idx_type;

static const idx_type TYPES[] = {
    {0x08, "u8", 1, MP_U8},  {0x09, "i8", 1, MP_I32},  {0x0B, "i16", 2, MP_I32},
    {0x0C, "i32", 4, MP_I32}, {0x0D, "f32", 4, MP_F32}, {0x0E, "f64", 8, -1},
};

typedef struct {
    const idx_type *type;
    int ndim;
    int64_t shape[MP_MAXDIM];
    int64_t numel;
    int64_t nbytes;      /* payload bytes in the file */
} idx_header;

/* gzerror's message without the "path: " zlib puts in front of it */
static const char *zmsg(const char *msg, const char *path)
{
    size_t n = strlen(path);
    return strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0 ? msg + n + 2 : msg;
}

/* gzread's int-sized reads, looped; *got counts what arrived. Returns 0 when
 * all n bytes arrived or the input ended early (the caller compares *got), -1
 * with a message when the stream is corrupt or the read failed. */
static int read_bytes(gzFile gz, const char *path, void *buf, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n) {
        size_t want = n - *got;
        if (want > (1u << 30)) want = 1u << 30;
        errno = 0;
        int r = gzread(gz, (char *)buf + *got, (unsigned)want);
        if (r > 0) { *got += (size_t)r; continue; }
        int zerr;
        const char *msg = zmsg(gzerror(gz, &zerr), path);
        if (zerr == Z_DATA_ERROR) return mp_fail(MP_EINVAL, "%s: gzip data corrupt (%s)", path, msg);
        if (zerr == Z_MEM_ERROR) return mp_fail(MP_EOOM, "%s: out of memory while decompressing", path);
        if (zerr == Z_ERRNO)
            return mp_fail(MP_EINVAL, "%s: cannot read: %s", path, errno ? strerror(errno) : "read error");
        if (r < 0) return mp_fail(MP_EINVAL, "%s: cannot read: %s", path, msg);
        return 0;   /* end of input (Z_OK) or a gzip stream cut short (Z_BUF_ERROR) */
    }
    return 0;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* exactly n bytes, or "truncated" naming what was being read */
static int read_exact(gzFile gz, const char *path, void *buf, size_t n, const char *what)
{
    size_t got;
    if (read_bytes(gz, path, buf, n, &got)) return -1;
    if (got < n)
        return mp_fail(MP_EINVAL, "%s: truncated: expected %zu %s bytes, got %zu", path, n, what, got);
    return 0;
}

static int read_header(gzFile gz, const char *path, idx_header *h)
{
    unsigned char m[4], s[4 * MP_MAXDIM];
    if (read_exact(gz, path, m, 4, "header")) return -1;
    if (m[0] != 0 || m[1] != 0)
        return mp_fail(MP_EINVAL, "%s: bad magic: expected 00 00 <type> <dims>, got %02x %02x %02x %02x "
                       "(not an IDX file)", path, m[0], m[1], m[2], m[3]);
    h->type = NULL;
    for (size_t i = 0; i < sizeof TYPES / sizeof *TYPES; i++)
        if (TYPES[i].code == m[2]) h->type = &TYPES[i];
    if (!h->type)
        return mp_fail(MP_EINVAL, "%s: bad type byte 0x%02x (IDX types are 08 u8, 09 i8, 0B i16, "
                       "0C i32, 0D f32, 0E f64)", path, m[2]);
    if (h->type->dtype < 0)
        return mp_fail(MP_EINVAL, "%s: unsupported IDX type %s (mpengine reads u8, i8, i16, i32 "
                       "and f32)", path, h->type->name);
    h->ndim = m[3];
    if (h->ndim < 1 || h->ndim > MP_MAXDIM)
        return mp_fail(MP_EINVAL, "%s: bad number of dims %d (expected 1 to %d)", path, h->ndim, MP_MAXDIM);
    if (read_exact(gz, path, s, 4 * (size_t)h->ndim, "header")) return -1;
    /* the product is checked against the limit before each step: no overflow */
    int64_t limit = MP_IDX_MAX_BYTES / h->type->size;
    for (int d = 0; d < h->ndim; d++) h->shape[d] = be32(s + 4 * d);   /* all of them: the message shows them */
    h->numel = 1;
    for (int d = 0; d < h->ndim; d++) {
        if (h->shape[d] == 0)
            return mp_fail(MP_EINVAL, "%s: dim %d has size 0 (sizes must be positive)", path, d + 1);
        if (h->shape[d] > limit / h->numel) {
            char buf[128];
            return mp_fail(MP_EINVAL, "%s: dims too large: %s %s exceeds the limit of %lld bytes", path,
                           mp_shape_str(h->ndim, h->shape, buf, sizeof buf), h->type->name,
                           (long long)MP_IDX_MAX_BYTES);
        }
        h->numel *= h->shape[d];
    }
    h->nbytes = h->numel * h->type->size;
    return 0;
}

/* The payload, in a malloc'd buffer that doubles as data arrives, so memory
 * follows the file's real length rather than the header's claim. */
static unsigned char *read_payload(gzFile gz, const char *path, const idx_header *h)
{
    size_t want = (size_t)h->nbytes, cap = want < (1u << 20) ? want : (1u << 20), have = 0;
    unsigned char *buf = malloc(cap);
    if (!buf) return mp_fail(MP_EOOM, "%s: out of memory reading %zu bytes", path, cap), NULL;
    for (;;) {
        size_t got;
        if (read_bytes(gz, path, buf + have, cap - have, &got)) goto fail;
        have += got;
        if (have < cap) {
            mp_fail(MP_EINVAL, "%s: truncated: expected %zu data bytes, got %zu", path, want, have);
            goto fail;
        }
        if (have == want) return buf;
        size_t ncap = cap * 2 < want ? cap * 2 : want;
        unsigned char *nb = realloc(buf, ncap);
        if (!nb) { mp_fail(MP_EOOM, "%s: out of memory reading %zu bytes", path, ncap); goto fail; }
        buf = nb, cap = ncap;
    }
fail:
    free(buf);
    return NULL;
}

/* nothing may follow the payload; for gzip this read also verifies the trailer */
static int check_end(gzFile gz, const char *path, const idx_header *h)
{
    unsigned char extra[1];
    size_t got;
    if (read_bytes(gz, path, extra, 1, &got)) return -1;
    if (got)
        return mp_fail(MP_EINVAL, "%s: extra bytes after the %lld data bytes the header declares", path,
                       (long long)h->nbytes);
    int zerr;
    gzerror(gz, &zerr);
    if (zerr == Z_BUF_ERROR)
        return mp_fail(MP_EINVAL, "%s: truncated: the gzip stream ends before its trailer", path);
    return 0;
}

/* big-endian file elements into the tensor's native dtype */
static void convert(void *dst, const unsigned char *src, const idx_header *h)
{
    int64_t n = h->numel;
    int32_t *i32 = dst;
    switch (h->type->code) {
    case 0x08: memcpy(dst, src, (size_t)n); break;
    case 0x09: for (int64_t i = 0; i < n; i++) i32[i] = (int8_t)src[i]; break;
    case 0x0B: for (int64_t i = 0; i < n; i++) i32[i] = (int16_t)(src[2 * i] << 8 | src[2 * i + 1]); break;
    default:   /* i32 and f32: swap the bytes of each 32-bit word */
        for (int64_t i = 0; i < n; i++) {
            uint32_t w = be32(src + 4 * i);
            memcpy((char *)dst + 4 * i, &w, 4);
        }
    }
}

mp_tensor *mp_read_idx(const char *path)
{
    if (!path || !*path) return mp_fail(MP_EINVAL, "path must be a non-empty string"), NULL;
    errno = 0;
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return mp_fail(MP_EINVAL, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory"), NULL;
    gzbuffer(gz, 1u << 18);   /* fewer, larger reads of the compressed file */
    idx_header h;
    unsigned char *buf = NULL;
    mp_tensor *t = NULL;
    if (read_header(gz, path, &h) == 0 && (buf = read_payload(gz, path, &h)) && check_end(gz, path, &h) == 0) {
        t = mp_empty((mp_dtype)h.type->dtype, MP_CPU, h.ndim, h.shape);
        if (t) convert(mp_data(t), buf, &h);
    }
    free(buf);
    gzclose(gz);
    return t;
}
