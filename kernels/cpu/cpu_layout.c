/*
 * cpu_layout.c: copies that change layout: dim permutation (transpose) and
 * narrowing a middle dim. Both move whole elements as bytes, so they serve
 * every dtype.
 */
#include <string.h>
#include "kernels/cpu/cpu.h"

void cpu_permute(mp_dtype dt, void *out, const void *in, int ndim, const int64_t *shape, const int *perm)
{
    size_t es = mp_dtype_size(dt);
    int64_t istride[MP_MAXDIM], oshape[MP_MAXDIM], ostride_in[MP_MAXDIM], total = 1;
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) istride[d] = s, s *= shape[d];
    for (int d = 0; d < ndim; d++) {
        oshape[d] = shape[perm[d]];
        ostride_in[d] = istride[perm[d]];   /* input stride when stepping output dim d */
        total *= oshape[d];
    }
    int64_t last = oshape[ndim - 1], ls = ostride_in[ndim - 1], rows = total / last;
    #pragma omp parallel for if (total >= MP_PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = 0, q = r;
        for (int d = ndim - 2; d >= 0; d--) {
            src += (q % oshape[d]) * ostride_in[d];
            q /= oshape[d];
        }
        char *o = (char *)out + (size_t)(r * last) * es;
        const char *i = (const char *)in;
        switch (es) {
        case 4: for (int64_t j = 0; j < last; j++) ((uint32_t *)o)[j] = ((const uint32_t *)i)[src + j * ls]; break;
        case 2: for (int64_t j = 0; j < last; j++) ((uint16_t *)o)[j] = ((const uint16_t *)i)[src + j * ls]; break;
        default: for (int64_t j = 0; j < last; j++) ((uint8_t *)o)[j] = ((const uint8_t *)i)[src + j * ls];
        }
    }
}

void cpu_narrow(mp_dtype dt, void *out, const void *in, int64_t outer, int64_t n,
                int64_t start, int64_t len, int64_t inner)
{
    size_t es = mp_dtype_size(dt), row = (size_t)(len * inner) * es;
    #pragma omp parallel for if (outer * len * inner >= MP_PAR_MIN) schedule(static)
    for (int64_t o = 0; o < outer; o++)
        memcpy((char *)out + (size_t)o * row,
               (const char *)in + (size_t)((o * n + start) * inner) * es, row);
}
