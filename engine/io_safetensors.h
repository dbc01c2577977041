/*
 * io_safetensors.h: safetensors files (docs/DESIGN.md section 8), the checkpoint format.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"key": "value", ...}} padded with spaces to a multiple of 8,
 * then the raw little-endian bytes of every tensor, back to back.
 *
 * Saving is atomic: the bytes go to a temporary file in the target's directory,
 * which is fsynced and renamed over the target, so a failure at any point leaves
 * an existing file as it was. Loading never executes anything and checks every
 * size against the file before it reads: a malformed file is an error naming
 * the path and the problem, never a crash or an out-of-bounds read.
 *
 * The engine knows only flat lists of named tensors and string metadata; the
 * Lua binding (lua/lio.c) records nested Lua tables in the metadata.
 */
#ifndef MP_IO_SAFETENSORS_H
#define MP_IO_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include "engine/tensor.h"

/* What a safetensors file holds. Names and metadata are NUL-terminated UTF-8;
 * tensors are on the CPU, in the order of their data in the file. */
typedef struct mp_stfile {
    int ntensors;
    char **names;
    mp_tensor **tensors;
    int nmeta;
    char **meta_keys;
    char **meta_values;
} mp_stfile;

/* Write n tensors (any device: others are copied to the host one at a time)
 * under the given names, plus nmeta metadata pairs, to path. Names must be
 * distinct, valid UTF-8 and not "__metadata__". Returns 0, or -1 + mp_error()
 * with the target untouched and no temporary file left behind. */
int mp_st_save(const char *path, int n, const char *const *names, mp_tensor *const *tensors,
               int nmeta, const char *const *keys, const char *const *values);

/* The temporary files that saves to path left when they were interrupted
 * (killed before their rename): `<path>.tmp-XXXXXX` files no running save holds
 * a lock on, and with before_start only those last written before the engine
 * was loaded into this process. Calls each(file) for every one and, with
 * remove, deletes it. Returns how many there were (removed, with remove), or
 * -1 + mp_error(). mp_st_save runs this with remove before it writes (any
 * age: the path is its own), mp_st_load with remove and before_start. */
int mp_st_stale_temps(const char *path, bool remove, bool before_start, void (*each)(const char *file, void *ud),
                      void *ud);

/* Read a whole file; NULL + mp_error() (naming path) when it cannot be read or
 * is not a well-formed safetensors file of supported dtypes. */
mp_stfile *mp_st_load(const char *path);

/* Free a loaded file; tensors set to NULL (taken over by the caller) are skipped. */
void mp_st_free(mp_stfile *f);

/* The metadata value stored under key, or NULL. */
const char *mp_st_meta(const mp_stfile *f, const char *key);

/* true when s[0..len) is well-formed UTF-8 without NUL bytes (JSON readers such
 * as Python's safetensors reject anything else in a header) */
bool mp_utf8_valid(const char *s, size_t len);

/* Tests only: make the next save fail with ENOSPC once it has written `after`
 * bytes to its temporary file (-1, the default, never fails). */
void mp_st_fail_after(long long after);

#endif
