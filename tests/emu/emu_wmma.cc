/*
 * emu_wmma.cc: the WMMA collectives (nvcuda::wmma, emu_device.h), carried out
 * for a whole warp at once when its 32 lanes stand at the same call
 * (emu_sched.cc releases them here).
 *
 * Each lane's fragment holds 8 elements of the 16 x 16 tile: lane l elements
 * l*8 .. l*8+7 in row-major order (the emulator's layout, not the hardware's;
 * emu_device.h). A load gathers the tile from memory into every lane's part, a
 * store writes every lane's part, mma_sync assembles A, B and C from the 32
 * lanes, computes D and hands each lane its part of D (D may be C itself: the
 * whole D is formed before any lane's part is written).
 *
 * mma_sync's arithmetic: D[i][j] = C[i][j] + sum over k of A[i][k] B[k][j],
 * each product formed in f32 (exact for f16 operands: 11 x 11 significand
 * bits; for bf16 exact unless it leaves f32's range) and added to the f32
 * running sum in the order k = 0, 1, ..., 15 starting from C, every addition
 * rounded to nearest even. The hardware's order (and its internal precision:
 * tensor cores may align the products of a group before adding them) is not
 * specified by CUDA or PTX, so a real GPU can differ from this in the last
 * bits of the f32 sum; kernels must not depend on either (their parity
 * bounds cover any order).
 *
 * Checked as the CUDA manual states the API: every lane passes the same
 * pointer, leading dimension and layout (and fragments of the same kind), the
 * pointer 32-byte (256-bit) aligned, ldm a multiple of 16 bytes' worth of
 * elements.
 */
#include <stdio.h>
#include <string.h>
#include "tests/emu/emu.h"
#include "tests/emu/emu_values.h"

namespace mp_emu {

static char why[300];

static size_t elem_size(int elem) { return elem == WMMA_F32 ? 4 : 2; }

/* element e of a lane's fragment as f32 */
static float get(const wmma_frag &f, int e)
{
    switch (f.elem) {
    case WMMA_F16: return load_f32(MP_F16, f.x, (size_t)e);
    case WMMA_BF16: return load_f32(MP_BF16, f.x, (size_t)e);
    default: return ((const float *)f.x)[e];
    }
}

/* the lanes agree on the fragment (kind, type, layout) of operand i */
static bool same_frag(wmma_call *const *lanes, int i)
{
    const wmma_frag &f = lanes[0]->f[i];
    for (int l = 1; l < 32; l++) {
        const wmma_frag &g = lanes[l]->f[i];
        if (g.use != f.use || g.elem != f.elem || g.col_major != f.col_major) {
            snprintf(why, sizeof why, "lanes 0 and %d pass different fragment types", l);
            return false;
        }
    }
    return true;
}

/* offset in memory (in elements) of tile element (r, c) */
static size_t mem_at(int r, int c, unsigned ldm, bool col_major)
{
    return col_major ? (size_t)c * ldm + (size_t)r : (size_t)r * ldm + (size_t)c;
}

static const char *load_store(wmma_call *const *lanes, bool store)
{
    if (!same_frag(lanes, 0)) return why;
    const wmma_call &c0 = *lanes[0];
    for (int l = 1; l < 32; l++)
        if (lanes[l]->mem != c0.mem || lanes[l]->ldm != c0.ldm || lanes[l]->mem_col_major != c0.mem_col_major) {
            snprintf(why, sizeof why, "lanes 0 and %d pass different pointers, ldm or layouts (%p, %u against %p, %u)",
                     l, c0.mem, c0.ldm, lanes[l]->mem, lanes[l]->ldm);
            return why;
        }
    const wmma_frag &f = c0.f[0];
    const size_t es = elem_size(f.elem);
    if ((uintptr_t)c0.mem % 32) {
        snprintf(why, sizeof why, "the pointer %p is not 32-byte aligned", c0.mem);
        return why;
    }
    if (c0.ldm * es % 16 || c0.ldm < 16) {
        snprintf(why, sizeof why, "ldm %u is not a multiple of %zu elements (16 bytes) of at least 16", c0.ldm, 16 / es);
        return why;
    }
    const bool col = f.use == WMMA_ACC ? c0.mem_col_major != 0 : f.col_major != 0;
    char *mem = (char *)c0.mem;
    for (int l = 0; l < 32; l++) {
        char *x = (char *)lanes[l]->f[0].x;
        for (int e = 0; e < 8; e++) {
            int t = l * 8 + e;
            char *at = mem + mem_at(t / 16, t % 16, c0.ldm, col) * es;
            if (store) memcpy(at, x + e * es, es);
            else memcpy(x + e * es, at, es);
        }
    }
    return NULL;
}

static const char *mma(wmma_call *const *lanes)
{
    for (int i = 0; i < 4; i++)
        if (!same_frag(lanes, i)) return why;
    const wmma_call &c0 = *lanes[0];
    if (c0.f[1].elem != c0.f[2].elem) return "matrix_a and matrix_b differ in type";
    float a[16][16], b[16][16], d[16][16];
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 8; e++) {
            int t = l * 8 + e, r = t / 16, c = t % 16;
            a[r][c] = get(lanes[l]->f[1], e);
            b[r][c] = get(lanes[l]->f[2], e);
            d[r][c] = get(lanes[l]->f[3], e);
        }
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            for (int k = 0; k < 16; k++) d[i][j] += a[i][k] * b[k][j];   /* the product exact, the sum rounded (-ffp-contract=off) */
    for (int l = 0; l < 32; l++)
        for (int e = 0; e < 8; e++) ((float *)lanes[l]->f[0].x)[e] = d[(l * 8 + e) / 16][(l * 8 + e) % 16];
    return NULL;
}

const char *wmma_run(warp_op op, wmma_call *const *lanes)
{
    switch (op) {
    case W_WMMA_LOAD: return load_store(lanes, false);
    case W_WMMA_STORE: return load_store(lanes, true);
    case W_WMMA_MMA: return mma(lanes);
    default: return "not a WMMA collective";
    }
}

}  // namespace mp_emu
