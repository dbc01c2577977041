/*
 * fuzz_input.h: what the libFuzzer targets share. The engine's loaders take a
 * path, so each input is written to a private file first (in /dev/shm when it
 * exists: no disk), and the CPU memory limit is small so that a header claiming
 * gigabytes is refused quickly instead of being allocated.
 */
#ifndef MP_FUZZ_INPUT_H
#define MP_FUZZ_INPUT_H

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include "engine/tensor.h"
#include "engine/memory.h"

/* the engine's allocations, at most: large enough for every tensor the drivers
 * build on purpose, small enough that a hostile size (nn.Conv2d(65504, 4096, 3))
 * fails at once instead of filling 170 MB of random weights under ASan, which
 * took 10-15 s a call and made libFuzzer report the unit as slow */
#define FUZZ_MEMORY_LIMIT ((size_t)64 << 20)

static inline const char *fuzz_path(const char *ext)
{
    static char path[128];
    if (!*path) {
        const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(path, sizeof path, "%s/mpengine-fuzz-%d%s", dir, (int)getpid(), ext);
        mp_set_memory_limit(MP_CPU, FUZZ_MEMORY_LIMIT);
    }
    return path;
}

/* the input as a file; its path */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *ext)
{
    const char *path = fuzz_path(ext);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
    return path;
}

#endif
