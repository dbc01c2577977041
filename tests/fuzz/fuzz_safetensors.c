/* fuzz_safetensors.c: the safetensors loader (engine/io_safetensors.c) on any
 * bytes: it loads a file or says why not, and every tensor it returns can be
 * read whole. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tests/fuzz/fuzz_input.h"
#include "engine/io_safetensors.h"
#include "engine/error.h"
#include "engine/ops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mp_stfile *f = mp_st_load(fuzz_file(data, size, ".safetensors"));
    if (!f) {
        if (!mp_error() || !*mp_error()) abort();   /* a refusal always says why */
        mp_clear_error();
        return 0;
    }
    for (int i = 0; i < f->ntensors; i++) {
        mp_tensor *t = f->tensors[i];
        double v[64];
        int64_t n = t->numel < 64 ? t->numel : 64;
        if (n > 0 && mp_read_f64(t, t->numel - n, n, v)) {   /* the last values must be there */
            fprintf(stderr, "fuzz_safetensors: tensor '%s' loaded but not readable: %s\n", f->names[i], mp_error());
            abort();
        }
    }
    for (int i = 0; i < f->nmeta; i++)
        if (!mp_utf8_valid(f->meta_values[i], strlen(f->meta_values[i]))) abort();
    mp_st_free(f);
    return 0;
}
