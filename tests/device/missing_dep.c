/*
 * missing_dep.c: a stand-in for a CUDA backend that cannot load because a
 * library it was linked against is missing (as build/mp/cuda.so is without
 * cuBLAS): built against libmp_gone.so, which the Makefile then removes.
 * tests/lua/device_spec.lua checks that mp.cuda.is_available() names it.
 */
#include <stddef.h>

int mp_gone(void);

const void *mp_cuda_backend_init(char *why, size_t cap)
{
    (void)why, (void)cap;
    (void)mp_gone();   /* the reference that needs the missing library */
    return NULL;
}
