/* fuzz_idx.c: the IDX reader (engine/data_idx.c, raw or gzip) on any bytes */
#include <stdlib.h>
#include "tests/fuzz/fuzz_input.h"
#include "engine/data_idx.h"
#include "engine/error.h"
#include "engine/ops.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mp_tensor *t = mp_read_idx(fuzz_file(data, size, ".idx"));
    if (!t) {
        if (!mp_error() || !*mp_error()) abort();
        mp_clear_error();
        return 0;
    }
    double v;
    if (t->numel > 0 && mp_read_f64(t, t->numel - 1, 1, &v)) abort();
    mp_release(t);
    return 0;
}
