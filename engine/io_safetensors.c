/*
 * io_safetensors.c: reading and writing safetensors files (see io.h).
 *
 * The JSON header is parsed and printed by cJSON (Debian's libcjson-dev); the
 * data is read and written with stdio. Loading validates the whole header
 * against the file's size before it allocates or reads any tensor, so every
 * read stays inside the file. Saving writes a temporary file next to the
 * target and renames it over the target only once it is complete and synced.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>      /* cJSON_ParseWithLengthOpts, cJSON_PrintUnformatted */
#include "engine/io_safetensors.h"
#include "engine/error.h"
#include "engine/ops.h"       /* mp_to, for tensors on another device */

/* safetensors' own limit: a larger header is a corrupt or hostile file */
#define MAX_HEADER (100u * 1000u * 1000u)
/* JSON numbers are doubles: integers beyond 2^53 would not be exact */
#define MAX_JSON_INT 9007199254740992.0

static const struct { const char *name; mp_dtype dt; } st_dtypes[] = {
    {"F32", MP_F32}, {"F16", MP_F16}, {"BF16", MP_BF16}, {"I32", MP_I32}, {"U8", MP_U8}, {"F64", MP_F64},
    {"F8_E4M3", MP_E4M3}, {"F8_E5M2", MP_E5M2},   /* OCP FP8: PyTorch's float8_e4m3fn, float8_e5m2 */
};

static const char *st_dtype_name(mp_dtype dt)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (st_dtypes[i].dt == dt) return st_dtypes[i].name;
    return NULL;
}

static int st_dtype_parse(const char *name, mp_dtype *out)
{
    for (size_t i = 0; i < sizeof st_dtypes / sizeof *st_dtypes; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return *out = st_dtypes[i].dt, 0;
    return -1;
}

/* mp_fail with the path in front: every file error names the file */
__attribute__((format(printf, 2, 3)))
static int fail_at(const char *path, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return mp_fail(MP_EINVAL, "'%s': %s", path, buf);
}

bool mp_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < len;) {
        unsigned c = s[i], cp, min;
        size_t n;
        if (c == 0) return false;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) n = 1, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) n = 2, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) n = 3, min = 0x10000;
        else return false;
        if (len - i <= n) return false;            /* truncated sequence */
        cp = c & (0x3Fu >> n);
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        /* overlong forms, UTF-16 surrogates and code points past U+10FFFF */
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n + 1;
    }
    return true;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* a name that occurs twice in names[0..n), or NULL */
static const char *find_duplicate(const char *const *names, int n)
{
    if (n < 2) return NULL;
    const char **s = malloc(sizeof *s * (size_t)n);
    if (!s) return NULL;   /* only a diagnostic: the caller's other checks still run */
    memcpy(s, names, sizeof *s * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_str);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (strcmp(s[i - 1], s[i]) == 0) dup = s[i];
    free(s);
    return dup;
}

/* =================================================================== writing */

static long long fail_after = -1;

void mp_st_fail_after(long long after) { fail_after = after; }

typedef struct {
    FILE *f;
    unsigned long long written;
    long long fail_after;    /* the test hook, captured for this save */
} writer;

static int write_bytes(writer *w, const void *p, size_t n)
{
    if (w->fail_after >= 0 && w->written + n > (unsigned long long)w->fail_after) {
        size_t part = (size_t)((unsigned long long)w->fail_after - w->written);
        fwrite(p, 1, part, w->f);
        w->written += part;
        errno = ENOSPC;
        return -1;
    }
    if (n && fwrite(p, 1, n, w->f) != n) return -1;
    w->written += n;
    return 0;
}

static int check_save_args(const char *path, int n, const char *const *names, mp_tensor *const *tensors,
                           int nmeta, const char *const *keys, const char *const *values)
{
    if (n < 0 || nmeta < 0) return fail_at(path, "negative count of tensors or metadata");
    for (int i = 0; i < n; i++) {
        if (!names[i] || !mp_utf8_valid(names[i], strlen(names[i])))
            return fail_at(path, "tensor name %d is not valid UTF-8", i + 1);
        if (strcmp(names[i], "__metadata__") == 0)
            return fail_at(path, "'__metadata__' cannot name a tensor");
        if (!tensors[i] || !st_dtype_name(tensors[i]->dtype))
            return fail_at(path, "tensor '%s' is missing or has no safetensors dtype", names[i]);
    }
    for (int i = 0; i < nmeta; i++)
        if (!keys[i] || !values[i] || !mp_utf8_valid(keys[i], strlen(keys[i])) ||
            !mp_utf8_valid(values[i], strlen(values[i])))
            return fail_at(path, "metadata entry %d is not valid UTF-8", i + 1);
    const char *dup = find_duplicate(names, n);
    if (dup) return fail_at(path, "tensor name '%s' is used twice", dup);
    dup = find_duplicate(keys, nmeta);
    if (dup) return fail_at(path, "metadata key '%s' is used twice", dup);
    return 0;
}

/* "[2,3]" as a raw JSON value: cJSON prints large doubles with exponents, and
 * readers that want unsigned integers (Rust's serde) refuse "1e+15" */
static cJSON *int_array(int n, const unsigned long long *v)
{
    char buf[MP_MAXDIM * 24 + 4];
    size_t k = 0;
    buf[k++] = '[';
    for (int i = 0; i < n; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, i ? ",%llu" : "%llu", v[i]);
    snprintf(buf + k, sizeof buf - k, "]");
    return cJSON_CreateRaw(buf);
}

static bool add_tensor_entry(cJSON *root, const char *name, const mp_tensor *t, unsigned long long *offset)
{
    unsigned long long shape[MP_MAXDIM], offs[2] = {*offset, *offset + mp_nbytes(t)};
    for (int d = 0; d < t->ndim; d++) shape[d] = (unsigned long long)t->shape[d];
    *offset = offs[1];
    cJSON *e = cJSON_CreateObject();
    if (!e || !cJSON_AddItemToObject(root, name, e)) return cJSON_Delete(e), false;
    return cJSON_AddStringToObject(e, "dtype", st_dtype_name(t->dtype)) &&
           cJSON_AddItemToObject(e, "shape", int_array(t->ndim, shape)) &&
           cJSON_AddItemToObject(e, "data_offsets", int_array(2, offs));
}

/* The header text padded with spaces to a multiple of 8 (so that the data
 * starts aligned, as safetensors does); NULL when out of memory. */
static char *build_header(int n, const char *const *names, mp_tensor *const *tensors, int nmeta,
                          const char *const *keys, const char *const *values, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    if (ok && nmeta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (int i = 0; ok && i < nmeta; i++) ok = cJSON_AddStringToObject(m, keys[i], values[i]) != NULL;
    }
    unsigned long long offset = 0;
    for (int i = 0; ok && i < n; i++) ok = add_tensor_entry(root, names[i], tensors[i], &offset);
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return NULL;
    size_t k = strlen(text), padded = (k + 7) / 8 * 8;
    char *out = realloc(text, padded + 1);
    if (!out) return free(text), NULL;
    memset(out + k, ' ', padded - k);
    out[padded] = 0;
    *len = padded;
    return out;
}

/* one tensor's bytes; a tensor on another device is copied to the host first */
static int write_tensor(writer *w, mp_tensor *t)
{
    if (t->dev == MP_CPU) return write_bytes(w, mp_data(t), mp_nbytes(t));
    if (mp_device_check(t->dev)) return -2;
    mp_tensor *h = mp_to(t, t->dtype, MP_CPU);
    if (!h) return -2;
    int rc = write_bytes(w, mp_data(h), mp_nbytes(h));
    mp_release(h);
    return rc;
}

/* the permissions a new file would get (the umask applied), or the target's */
static mode_t file_mode(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0) return st.st_mode & 07777;
    mode_t mask = umask(0);   /* umask can only be read by setting it */
    umask(mask);
    return 0666 & ~mask;
}

/* Make the rename durable. The checkpoint is complete and in place by now;
 * some file systems refuse to fsync a directory, which loses nothing more. */
static void fsync_dir(const char *path)
{
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

/* A save writes `<path>.tmp-XXXXXX` (mkstemp's six characters) and renames it
 * over path. A process killed before the rename leaves that file behind. The
 * writer holds an exclusive flock on its temporary file while it writes, and
 * the kernel drops the lock when the process dies; so a temporary file nobody
 * holds a lock on belongs to an interrupted save, and one that is locked to a
 * save still running (in this process or another), which is left alone. */
static bool is_temp_of(const char *name, const char *base, size_t blen)
{
    if (strncmp(name, base, blen) || strncmp(name + blen, ".tmp-", 5) || strlen(name + blen) != 11) return false;
    for (const char *c = name + blen + 5; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))) return false;
    return true;
}

/* When the engine was loaded into this process (the program's start for
 * build/mpengine, `require "mp"` for lua5.4), to the nanosecond: a temporary
 * file last written before it cannot belong to a save of this process, and
 * /proc's start time is only good to a second, as are the mtimes it would be
 * compared with. */
static struct timespec engine_loaded;
__attribute__((constructor)) static void note_load_time(void) { clock_gettime(CLOCK_REALTIME, &engine_loaded); }

static bool written_before_load(const struct stat *st)
{
    return st->st_mtim.tv_sec < engine_loaded.tv_sec ||
           (st->st_mtim.tv_sec == engine_loaded.tv_sec && st->st_mtim.tv_nsec < engine_loaded.tv_nsec);
}

int mp_st_stale_temps(const char *path, bool remove, bool before_start, void (*each)(const char *file, void *ud), void *ud)
{
    if (!path || !*path) return mp_fail(MP_EINVAL, "path must be a non-empty string");
    char *dcopy = strdup(path), *bcopy = strdup(path);
    if (!dcopy || !bcopy) return free(dcopy), free(bcopy), mp_fail(MP_EOOM, "out of memory");
    const char *dir = dirname(dcopy), *base = basename(bcopy);
    size_t blen = strlen(base), dlen = strlen(dir);
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        free(dcopy), free(bcopy);
        return e == ENOENT ? 0 : mp_fail(MP_EINVAL, "'%s': cannot list its directory: %s", path, strerror(e));
    }
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (!is_temp_of(ent->d_name, base, blen)) continue;
        char *file = malloc(dlen + strlen(ent->d_name) + 2);
        if (!file) continue;
        sprintf(file, "%s/%s", dir, ent->d_name);
        int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        bool old_enough = !before_start || (fd >= 0 && fstat(fd, &st) == 0 && written_before_load(&st));
        if (fd >= 0 && old_enough && flock(fd, LOCK_EX | LOCK_NB) == 0) {   /* no writer holds it: stale */
            if (each) each(file, ud);
            if (!remove || unlink(file) == 0) n++;
        }
        if (fd >= 0) close(fd);
        free(file);
    }
    closedir(d);
    free(dcopy), free(bcopy);
    return n;
}

/* header length, header, then every tensor's bytes, then flush and fsync */
static int write_file(writer *w, const char *hdr, size_t hlen, int n, mp_tensor *const *tensors)
{
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((unsigned long long)hlen >> (8 * i));
    if (write_bytes(w, len8, 8) || write_bytes(w, hdr, hlen)) return -1;
    for (int i = 0; i < n; i++) {
        int rc = write_tensor(w, tensors[i]);
        if (rc) return rc;
    }
    if (fflush(w->f) || fsync(fileno(w->f))) return -1;
    return 0;
}

int mp_st_save(const char *path, int n, const char *const *names, mp_tensor *const *tensors,
               int nmeta, const char *const *keys, const char *const *values)
{
    long long hook = fail_after;
    fail_after = -1;
    if (check_save_args(path, n, names, tensors, nmeta, keys, values)) return -1;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return fail_at(path, "is a directory");

    size_t hlen;
    char *hdr = build_header(n, names, tensors, nmeta, keys, values, &hlen);
    if (!hdr) return mp_fail(MP_EOOM, "'%s': out of memory building the header", path);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return free(hdr), mp_fail(MP_EOOM, "'%s': out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp-XXXXXX", 12);

    mp_st_stale_temps(path, true, false, NULL, NULL);   /* what an interrupted save to this path left */
    int fd = mkstemp(tmp);
    if (fd >= 0) flock(fd, LOCK_EX);             /* ours while we write: see mp_st_stale_temps */
    if (fd < 0) {
        int e = errno;
        free(hdr), free(tmp);
        return fail_at(path, "cannot create a file there: %s", strerror(e));
    }
    writer w = {fdopen(fd, "wb"), 0, hook};
    int rc = w.f ? 0 : -1;
    if (!rc && fchmod(fd, file_mode(path))) rc = -1;
    if (!rc) rc = write_file(&w, hdr, hlen, n, tensors);
    int e = errno;
    int closed = w.f ? fclose(w.f) : close(fd);
    if (closed && !rc) rc = -1, e = errno;
    if (!rc && rename(tmp, path)) rc = -1, e = errno;
    free(hdr);
    if (rc) {
        char why[400];
        /* -2: the engine already said why (a device copy failed), maybe out of
         * memory, which the binding answers with a collection and a retry */
        mp_errcode code = rc == -2 ? mp_errcode_last() : MP_EINVAL;
        snprintf(why, sizeof why, "%s", rc == -2 ? mp_error() : strerror(e));
        unlink(tmp);
        free(tmp);
        return mp_fail(code, "'%s': write failed, file left unchanged: %s", path, why);
    }
    free(tmp);
    fsync_dir(path);
    return 0;
}

/* =================================================================== reading */

typedef struct {
    const char *name;          /* points into the parsed header */
    mp_dtype dt;
    int i64;                   /* stored as I64 (PyTorch's integer tensors), loaded as i32 */
    int ndim;
    int64_t shape[MP_MAXDIM];
    unsigned long long begin, end;
} st_entry;

static int read_exact(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n ? 0 : -1; }

/* Given an impossible header length: is the file still shaped like a
 * safetensors file (a truncated or damaged one, whose errors say what is
 * wrong with it), or something else? A text file's first 8 bytes read as a
 * huge length (every one a text byte), and any other file rarely has its JSON
 * object's '{' right after them; such files are "not a safetensors file". The
 * stream is left just after the length. */
static bool looks_like_safetensors(FILE *f, const unsigned char len8[8], unsigned long long fsize)
{
    bool text = true;
    for (int i = 0; i < 8; i++) text = text && ((len8[i] >= 0x20 && len8[i] < 0x7f) || len8[i] == '\t' || len8[i] == '\n' || len8[i] == '\r');
    if (text) return false;
    if (fsize == 8) return true;
    int c = getc(f);
    if (c != EOF) ungetc(c, f);
    return c == '{';
}

/* The header text (NUL-terminated, *hlen bytes) after checking its length
 * against the file; NULL + error otherwise. */
static char *read_header(FILE *f, const char *path, unsigned long long fsize, size_t *hlen)
{
    unsigned char len8[8];
    if (fsize < 8) return fail_at(path, "too short for a safetensors file (%llu bytes; the header length alone takes 8)", fsize), NULL;
    if (read_exact(f, len8, 8)) return fail_at(path, "cannot read the header length: %s", strerror(errno)), NULL;
    unsigned long long n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    if ((n > fsize - 8 || n > MAX_HEADER) && !looks_like_safetensors(f, len8, fsize))
        return fail_at(path, "not a safetensors file (bad header)"), NULL;
    if (n > fsize - 8)
        return fail_at(path, "header length %llu runs past the end of the file (%llu bytes after the length)", n, fsize - 8), NULL;
    if (n > MAX_HEADER) return fail_at(path, "header length %llu is too large (at most %u)", n, MAX_HEADER), NULL;
    char *hdr = malloc((size_t)n + 1);
    if (!hdr) return mp_fail(MP_EOOM, "'%s': out of memory for a %llu-byte header", path, n), NULL;
    if (read_exact(f, hdr, (size_t)n)) {
        free(hdr);
        return fail_at(path, "cannot read the header: %s", strerror(errno)), NULL;
    }
    hdr[n] = 0;
    *hlen = (size_t)n;
    return hdr;
}

/* the byte offset of a \u0000 escape in the JSON text, or -1: cJSON decodes
 * it into a NUL that ends the C string, so a name "a\u0000b" would silently
 * become "a" (and two such names could collide) */
static long nul_escape_at(const char *hdr, size_t hlen)
{
    bool in_string = false;
    for (size_t i = 0; i < hlen; i++) {
        if (hdr[i] == '"') in_string = !in_string;
        else if (in_string && hdr[i] == '\\') {
            if (i + 5 < hlen && hdr[i + 1] == 'u' && memcmp(hdr + i + 2, "0000", 4) == 0) return (long)i;
            i++;   /* the escaped character: \" does not end the string */
        }
    }
    return -1;
}

static cJSON *parse_header(const char *hdr, size_t hlen, const char *path)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= hdr && end <= hdr + hlen ? (size_t)(end - hdr) : 0;
        return fail_at(path, "invalid JSON in the header (near byte %zu)", at), NULL;
    }
    for (const char *p = end; p < hdr + hlen; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            return fail_at(path, "invalid JSON in the header (trailing bytes at byte %zu)", (size_t)(p - hdr)), NULL;
        }
    /* JSON is UTF-8 (RFC 8259), and Python's safetensors refuses a header that is
     * not; cJSON would pass the bytes of a name or a metadata value through */
    if (!mp_utf8_valid(hdr, hlen)) {
        cJSON_Delete(root);
        return fail_at(path, "the header is not valid UTF-8 text"), NULL;
    }
    long nul = nul_escape_at(hdr, hlen);
    if (nul >= 0) {
        cJSON_Delete(root);
        return fail_at(path, "the header holds a \\u0000 escape at byte %ld (a NUL in a name or value; they cannot hold one)",
                       nul), NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail_at(path, "the header is not a JSON object"), NULL;
    }
    return root;
}

/* a JSON number that is a non-negative integer exactly representable */
static bool json_uint(const cJSON *v, unsigned long long *out)
{
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d != floor(d) || d > MAX_JSON_INT) return false;
    *out = (unsigned long long)d;
    return true;
}

static int parse_shape(const cJSON *shape, const char *path, st_entry *e)
{
    if (!cJSON_IsArray(shape)) return fail_at(path, "shape of tensor '%s' is not an array", e->name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > MP_MAXDIM) return fail_at(path, "tensor '%s' has %d dims (at most %d supported)", e->name, nd, MP_MAXDIM);
    e->ndim = 0;
    for (const cJSON *s = shape->child; s; s = s->next) {
        unsigned long long v;
        if (!json_uint(s, &v))
            return fail_at(path, "shape of tensor '%s' has an entry that is not a non-negative integer", e->name);
        if (v == 0) return fail_at(path, "tensor '%s' has a zero-sized dim (not supported)", e->name);
        e->shape[e->ndim++] = (int64_t)v;
    }
    return 0;
}

static int parse_offsets(const cJSON *offs, const char *path, st_entry *e)
{
    const cJSON *b = cJSON_IsArray(offs) ? offs->child : NULL;
    const cJSON *x = b ? b->next : NULL;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(b, &e->begin) || !json_uint(x, &e->end))
        return fail_at(path, "data_offsets of tensor '%s' is not a pair of non-negative integers", e->name);
    if (e->begin > e->end)
        return fail_at(path, "data_offsets [%llu, %llu] of tensor '%s' are out of order", e->begin, e->end, e->name);
    return 0;
}

/* checks that the shape's bytes equal the span of the offsets */
static int check_size(const char *path, const st_entry *e)
{
    unsigned long long bytes = e->i64 ? 8 : mp_dtype_size(e->dt);
    for (int d = 0; d < e->ndim; d++) {
        if ((unsigned long long)e->shape[d] > ~0ull / bytes)
            return fail_at(path, "shape of tensor '%s' is too large", e->name);
        bytes *= (unsigned long long)e->shape[d];
    }
    char sh[MP_MAXDIM * 24];
    if (bytes != e->end - e->begin)
        return fail_at(path, "tensor '%s' of shape %s and dtype %s takes %llu bytes but data_offsets [%llu, %llu] span %llu",
                       e->name, mp_shape_str(e->ndim, e->shape, sh, sizeof sh), e->i64 ? "I64" : st_dtype_name(e->dt), bytes,
                       e->begin, e->end, e->end - e->begin);
    return 0;
}

static int parse_entry(const cJSON *item, const char *path, st_entry *e)
{
    e->name = item->string;
    if (!cJSON_IsObject(item)) return fail_at(path, "entry for tensor '%s' is not an object", e->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!dt || !shape || !offs)
        return fail_at(path, "tensor '%s' has no %s", e->name, !dt ? "dtype" : !shape ? "shape" : "data_offsets");
    if (!cJSON_IsString(dt)) return fail_at(path, "dtype of tensor '%s' is not a string", e->name);
    /* I64: PyTorch's integer tensors (a batch norm's num_batches_tracked), read
     * into i32 when every value fits */
    e->i64 = strcmp(dt->valuestring, "I64") == 0;
    if (e->i64) e->dt = MP_I32;
    else if (st_dtype_parse(dt->valuestring, &e->dt))
        return fail_at(path, "unsupported dtype %.40s for tensor '%s' (supported: F32, F16, BF16, F64, I32, I64 read "
                       "as i32, U8, F8_E4M3, F8_E5M2)", dt->valuestring, e->name);
    if (parse_shape(shape, path, e) || parse_offsets(offs, path, e)) return -1;
    return check_size(path, e);
}

static int cmp_begin(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* sorted by offset, the tensors must tile [0, datasize) exactly */
static int check_layout(st_entry *e, int n, unsigned long long datasize, const char *path)
{
    qsort(e, (size_t)n, sizeof *e, cmp_begin);
    unsigned long long at = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].end > datasize)
            return fail_at(path, "data_offsets [%llu, %llu] of tensor '%s' leave the data section (%llu bytes)",
                           e[i].begin, e[i].end, e[i].name, datasize);
        if (e[i].begin < at)
            return fail_at(path, "tensors '%s' and '%s' overlap (data_offsets [%llu, %llu] and [%llu, %llu])",
                           e[i - 1].name, e[i].name, e[i - 1].begin, e[i - 1].end, e[i].begin, e[i].end);
        if (e[i].begin > at)
            return fail_at(path, "data bytes [%llu, %llu) belong to no tensor (before tensor '%s')", at, e[i].begin, e[i].name);
        at = e[i].end;
    }
    if (at != datasize)
        return fail_at(path, "data bytes [%llu, %llu) at the end of the file belong to no tensor", at, datasize);
    return 0;
}

static int parse_metadata(const cJSON *m, const char *path, mp_stfile *out)
{
    if (!cJSON_IsObject(m)) return fail_at(path, "__metadata__ is not an object");
    int n = cJSON_GetArraySize(m);
    out->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    out->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!out->meta_keys || !out->meta_values) return mp_fail(MP_EOOM, "'%s': out of memory", path);
    for (const cJSON *v = m->child; v; v = v->next) {
        if (!cJSON_IsString(v)) return fail_at(path, "__metadata__ value for '%s' is not a string", v->string);
        int i = out->nmeta;
        out->meta_keys[i] = strdup(v->string);
        out->meta_values[i] = strdup(v->valuestring);
        out->nmeta++;
        if (!out->meta_keys[i] || !out->meta_values[i]) return mp_fail(MP_EOOM, "'%s': out of memory", path);
    }
    const char *dup = find_duplicate((const char *const *)out->meta_keys, out->nmeta);
    if (dup) return fail_at(path, "__metadata__ key '%s' occurs twice", dup);
    return 0;
}

/* every tensor entry checked, then the layout; fills e[0..*n) sorted by offset */
static int parse_entries(const cJSON *root, const char *path, unsigned long long datasize, st_entry *e, int *n,
                         mp_stfile *out)
{
    *n = 0;
    for (const cJSON *item = root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            if (out->meta_keys) return fail_at(path, "__metadata__ occurs twice");
            if (parse_metadata(item, path, out)) return -1;
        } else if (parse_entry(item, path, &e[(*n)++])) {
            return -1;
        }
    }
    const char **names = malloc(sizeof *names * ((size_t)*n + 1));
    if (!names) return mp_fail(MP_EOOM, "'%s': out of memory", path);
    for (int i = 0; i < *n; i++) names[i] = e[i].name;
    const char *dup = find_duplicate(names, *n);
    int rc = dup ? fail_at(path, "tensor '%s' occurs twice in the header", dup) : 0;
    free(names);
    return rc ? rc : check_layout(e, *n, datasize, path);
}

/* n little-endian I64 values into i32, each checked to fit */
static int read_i64(FILE *f, const char *path, const st_entry *e, int32_t *dst, int64_t n)
{
    unsigned char buf[8 * 512];
    for (int64_t i = 0; i < n;) {
        int64_t k = n - i < 512 ? n - i : 512;
        if (read_exact(f, buf, (size_t)(8 * k)))
            return fail_at(path, "cannot read tensor '%s' (%s)", e->name,
                           ferror(f) ? strerror(errno) : "the file ended early; did it change while being read?");
        for (int64_t j = 0; j < k; j++, i++) {
            uint64_t u = 0;
            for (int b = 7; b >= 0; b--) u = u << 8 | buf[8 * j + b];
            int64_t v = (int64_t)u;
            if (v < INT32_MIN || v > INT32_MAX)
                return fail_at(path, "tensor '%s' (I64) holds %lld at position %lld, outside i32's range", e->name,
                               (long long)v, (long long)i);
            dst[i] = (int32_t)v;
        }
    }
    return 0;
}

/* the tensors' bytes, in file order; the file sits just past the header */
static int read_tensors(FILE *f, const char *path, const st_entry *e, int n, mp_stfile *out)
{
    out->names = calloc((size_t)n + 1, sizeof(char *));
    out->tensors = calloc((size_t)n + 1, sizeof(mp_tensor *));
    if (!out->names || !out->tensors) return mp_fail(MP_EOOM, "'%s': out of memory", path);
    for (int i = 0; i < n; i++) {
        out->names[i] = strdup(e[i].name);
        out->tensors[i] = mp_empty(e[i].dt, MP_CPU, e[i].ndim, e[i].shape);
        out->ntensors++;
        if (!out->names[i]) return mp_fail(MP_EOOM, "'%s': out of memory", path);
        if (!out->tensors[i]) return -1;
        if (e[i].i64) {
            if (read_i64(f, path, &e[i], mp_data(out->tensors[i]), out->tensors[i]->numel)) return -1;
        } else if (read_exact(f, mp_data(out->tensors[i]), mp_nbytes(out->tensors[i]))) {
            return fail_at(path, "cannot read tensor '%s' (%s)", e[i].name,
                           ferror(f) ? strerror(errno) : "the file ended early; did it change while being read?");
        }
    }
    return 0;
}

/* O_NONBLOCK so that a FIFO given by mistake is refused instead of waited on */
static FILE *open_regular(const char *path, unsigned long long *size)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return fail_at(path, "cannot open: %s", strerror(errno)), NULL;
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail_at(path, "not a regular file"), NULL;
    }
    FILE *f = fcntl(fd, F_SETFL, 0) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        int e = errno;
        close(fd);
        return fail_at(path, "cannot open: %s", strerror(e)), NULL;
    }
    *size = (unsigned long long)st.st_size;
    return f;
}

mp_stfile *mp_st_load(const char *path)
{
    /* what interrupted saves to this path left, from before this process
     * loaded the engine (a save running now holds its lock, or is younger) */
    if (mp_st_stale_temps(path, true, true, NULL, NULL) < 0) mp_clear_error();
    unsigned long long fsize;
    FILE *f = open_regular(path, &fsize);
    if (!f) return NULL;
    size_t hlen = 0;
    char *hdr = read_header(f, path, fsize, &hlen);
    cJSON *root = hdr ? parse_header(hdr, hlen, path) : NULL;
    mp_stfile *out = root ? calloc(1, sizeof *out) : NULL;
    if (root && !out) mp_fail(MP_EOOM, "'%s': out of memory", path);
    st_entry *e = out ? calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *e) : NULL;
    if (out && !e) mp_fail(MP_EOOM, "'%s': out of memory", path);
    int n = 0;
    int rc = e ? parse_entries(root, path, fsize - 8 - hlen, e, &n, out) : -1;
    if (!rc) rc = read_tensors(f, path, e, n, out);
    free(e);
    cJSON_Delete(root);
    free(hdr);
    fclose(f);
    if (rc) {
        mp_st_free(out);
        return NULL;
    }
    return out;
}

void mp_st_free(mp_stfile *f)
{
    if (!f) return;
    for (int i = 0; i < f->ntensors; i++) {
        free(f->names[i]);
        mp_release(f->tensors[i]);
    }
    for (int i = 0; i < f->nmeta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->names);
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f);
}

const char *mp_st_meta(const mp_stfile *f, const char *key)
{
    for (int i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}
