/*
 * cpu_elementwise_lowp.c: the cheap elementwise ops of a bf16/f16 network
 * (ReLU and its gradient, a scalar's add/multiply/..., add/sub/mul/div of
 * two contiguous tensors) fused in AVX-512 registers: sixteen values loaded,
 * widened, computed in f32 and rounded back in registers, with no f32 block in
 * memory between. cpu_elementwise.c's general path widens each block into an
 * f32 buffer and rounds it back (cpu_load/cpu_store): for an op of one f32
 * instruction those two memory passes were the op's whole cost (bf16_to_f32
 * and f32_to_bf16 were 15% and 7% of a 1-thread bf16 ResNet step).
 *
 * Same bits as the general path: each result is the same single f32 operation
 * on the same exactly widened inputs, rounded once by the same steps
 * (convert_avx512.h's for bf16, which convert.c's bulk loops are built from;
 * vcvtph2ps/vcvtps2ph, round to nearest even, for f16, the instructions of
 * convert.c's AVX-512 f16 path). The comparisons are written as the C of
 * cpu_elementwise.c reads: ReLU is x < 0 ? 0 : x (so -0 stays -0 and a NaN
 * passes), its gradient x > 0 ? g : 0 (0 at x = ±0 and at a NaN x).
 * tests/c/test_elementwise_lowp.c compares both paths on random and special
 * values (±0, subnormals, inf, NaN, rounding ties, every bf16) and lengths
 * with tails.
 *
 * GELU's table lookups (cpu_elementwise.c's gelu_tables) are done here with
 * AVX-512 gathers: the forward's stored outputs, the gradient's product with
 * the stored slope in registers (no f32 block of g in memory between).
 *
 * An f32 tensor added to, subtracted from or multiplied by an f16/bf16 one
 * (the residual stream and a bf16 branch under autocast) widens the low
 * operand here in registers (cpu_binary_mixed) instead of a cast pass into
 * an f32 tensor first: the same exact widening and the same f32 op.
 *
 * The register steps (widen, round, loads and stores with tails) are
 * lowp_regs.h's, shared with batch norm's 16-bit passes
 * (cpu_batch_norm_lowp.c); cpu_lowp_usable() says where both run.
 *
 * Each entry returns 1 when it did the op, 0 when it declines and the caller
 * takes the general path: another dtype or op, strided or broadcast operands
 * beyond a scalar, a processor without AVX-512BW (or without AVX-512F's f16
 * conversions, for f16), flush counting on (cpu_store counts each rounding),
 * or the fused paths switched off (cpu_lowp_fused_enable(0), for tests).
 */
#include <string.h>
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/lowp_regs.h"

static int fused_on = 1;

int cpu_lowp_fused_enable(int on)
{
    int was = fused_on;
    fused_on = on;
    return was;
}

#ifdef MP_HAVE_AVX512_CONVERT

/* elements a thread takes at a time when an op is split over threads */
#define CHUNK 4096

static int usable(mp_kctx *cx, mp_dtype dt)
{
    if (!fused_on || (cx && cx->flush.on)) return 0;
    if (dt == MP_BF16) return mp_cpu_has_avx512bw();
    if (dt == MP_F16) return mp_cpu_has_avx512bw() && mp_cpu_has_avx512_f16c();
    return 0;
}

int cpu_lowp_usable(mp_kctx *cx, mp_dtype dt) { return usable(cx, dt); }

/* ---- unary ------------------------------------------------------------- */

static int unary_op(mp_unop op)
{
    return op == MP_RELU || op == MP_NEG || op == MP_ADDS || op == MP_MULS || op == MP_RSUBS || op == MP_DIVS;
}

/* the f32 forms of un_f32 (cpu_elementwise.c) for the ops unary_op takes */
LOWP_FN static inline __m512 un16(mp_unop op, __m512 x, __m512 p)
{
    const __m512 zero = _mm512_setzero_ps();
    switch (op) {
    case MP_RELU: return _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), zero);
    case MP_NEG: return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
    case MP_ADDS: return _mm512_add_ps(x, p);
    case MP_MULS: return _mm512_mul_ps(x, p);
    case MP_RSUBS: return _mm512_sub_ps(p, x);
    case MP_DIVS: return _mm512_div_ps(x, p);
    default: return x;   /* not reached: unary_op() */
    }
}

LOWP_INLINE void unary_run(int f16, mp_unop op, uint16_t *o, const uint16_t *a, int64_t n, float ps)
{
    __m512 p = _mm512_set1_ps(ps);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) store16(f16, o + j, un16(op, load16(f16, a + j), p));
    if (j < n) store_tail(f16, o + j, un16(op, load_tail(f16, a + j, n - j), p), n - j);
}

/* one function per dtype and op: the dtype and op constants inlined */
#define SPECIALISE(NAME, RUN, PARAMS, ARGS)                                    \
    LOWP_FN static void NAME##_bf16 PARAMS { RUN(0, ARGS); }                      \
    LOWP_FN static void NAME##_f16 PARAMS { RUN(1, ARGS); }
#define UN_ARGS(OP) OP, o, a, n, ps
SPECIALISE(relu, unary_run, (uint16_t *o, const uint16_t *a, int64_t n, float ps), UN_ARGS(MP_RELU))
SPECIALISE(neg, unary_run, (uint16_t *o, const uint16_t *a, int64_t n, float ps), UN_ARGS(MP_NEG))
SPECIALISE(adds, unary_run, (uint16_t *o, const uint16_t *a, int64_t n, float ps), UN_ARGS(MP_ADDS))
SPECIALISE(muls, unary_run, (uint16_t *o, const uint16_t *a, int64_t n, float ps), UN_ARGS(MP_MULS))
SPECIALISE(rsubs, unary_run, (uint16_t *o, const uint16_t *a, int64_t n, float ps), UN_ARGS(MP_RSUBS))
SPECIALISE(divs, unary_run, (uint16_t *o, const uint16_t *a, int64_t n, float ps), UN_ARGS(MP_DIVS))

typedef void (*un_fn)(uint16_t *o, const uint16_t *a, int64_t n, float ps);

static un_fn un_pick(mp_unop op, int f16)
{
    switch (op) {
    case MP_RELU: return f16 ? relu_f16 : relu_bf16;
    case MP_NEG: return f16 ? neg_f16 : neg_bf16;
    case MP_ADDS: return f16 ? adds_f16 : adds_bf16;
    case MP_MULS: return f16 ? muls_f16 : muls_bf16;
    case MP_RSUBS: return f16 ? rsubs_f16 : rsubs_bf16;
    case MP_DIVS: return f16 ? divs_f16 : divs_bf16;
    default: return NULL;
    }
}

int cpu_unary_lowp(mp_kctx *cx, mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p)
{
    if (!unary_op(op) || !usable(cx, dt)) return 0;
    un_fn run = un_pick(op, dt == MP_F16);
    float ps = (float)p;
    #pragma omp parallel for if (n >= MP_PAR_MIN_MEM) schedule(static)
    for (int64_t i = 0; i < n; i += CHUNK)
        run((uint16_t *)out + i, (const uint16_t *)a + i, n - i < CHUNK ? n - i : CHUNK, ps);
    return 1;
}

/* ---- unary gradients ---------------------------------------------------- */

static int grad_op(mp_unop op)
{
    return op == MP_RELU || op == MP_NEG || op == MP_ADDS || op == MP_MULS || op == MP_RSUBS || op == MP_DIVS;
}

/* grad_f32's forms (cpu_elementwise.c) for the ops grad_op takes */
LOWP_FN static inline __m512 grad16(mp_unop op, __m512 g, __m512 x, __m512 p)
{
    switch (op) {
    case MP_RELU: return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), g);
    case MP_NEG: case MP_RSUBS:
        return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32(INT32_MIN)));
    case MP_ADDS: return g;
    case MP_MULS: return _mm512_mul_ps(g, p);
    case MP_DIVS: return _mm512_div_ps(g, p);
    default: return g;   /* not reached: grad_op() */
    }
}

LOWP_INLINE void grad_run(int f16, mp_unop op, uint16_t *o, const uint16_t *g, const uint16_t *x, int64_t n,
                             float ps)
{
    __m512 p = _mm512_set1_ps(ps), zero = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        store16(f16, o + j, grad16(op, load16(f16, g + j), x ? load16(f16, x + j) : zero, p));
    if (j < n)
        store_tail(f16, o + j, grad16(op, load_tail(f16, g + j, n - j), x ? load_tail(f16, x + j, n - j) : zero, p),
                   n - j);
}

#define GR_ARGS(OP) OP, o, g, x, n, ps
#define GR_PARAMS (uint16_t *o, const uint16_t *g, const uint16_t *x, int64_t n, float ps)
SPECIALISE(relu_grad, grad_run, GR_PARAMS, GR_ARGS(MP_RELU))
SPECIALISE(neg_grad, grad_run, GR_PARAMS, GR_ARGS(MP_NEG))
SPECIALISE(muls_grad, grad_run, GR_PARAMS, GR_ARGS(MP_MULS))
SPECIALISE(divs_grad, grad_run, GR_PARAMS, GR_ARGS(MP_DIVS))
SPECIALISE(adds_grad, grad_run, GR_PARAMS, GR_ARGS(MP_ADDS))

typedef void (*gr_fn) GR_PARAMS;

static gr_fn gr_pick(mp_unop op, int f16)
{
    switch (op) {
    case MP_RELU: return f16 ? relu_grad_f16 : relu_grad_bf16;
    case MP_NEG: case MP_RSUBS: return f16 ? neg_grad_f16 : neg_grad_bf16;
    case MP_MULS: return f16 ? muls_grad_f16 : muls_grad_bf16;
    case MP_DIVS: return f16 ? divs_grad_f16 : divs_grad_bf16;
    case MP_ADDS: return f16 ? adds_grad_f16 : adds_grad_bf16;
    default: return NULL;
    }
}

int cpu_unary_grad_lowp(mp_kctx *cx, mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x,
                        int64_t n, double p)
{
    if (!grad_op(op) || (op == MP_RELU && !x) || !usable(cx, dt)) return 0;
    gr_fn run = gr_pick(op, dt == MP_F16);
    float ps = (float)p;
    const uint16_t *xs = op == MP_RELU ? x : NULL;
    #pragma omp parallel for if (n >= MP_PAR_MIN_MEM) schedule(static)
    for (int64_t i = 0; i < n; i += CHUNK)
        run((uint16_t *)gin + i, (const uint16_t *)gout + i, xs ? xs + i : NULL, n - i < CHUNK ? n - i : CHUNK, ps);
    return 1;
}

/* ---- GELU through its tables --------------------------------------------- */

/* cpu_elementwise.c's gelu_tables hold every 16-bit input's rounded GELU and
 * its f32 slope; these are its two lookups with the gathers in registers. The
 * forward's table has one padding entry past 65535 (a 32-bit gather at the
 * last index reads it) and returns the same stored values; the gradient is
 * the same single product g * slope(x), rounded once as cpu_store rounds. */
LOWP_INLINE void gelu_fwd_run(uint16_t *o, const uint16_t *a, int64_t n, const uint16_t *table)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512i idx = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(a + j)));
        __m512i v = _mm512_i32gather_epi32(idx, (const void *)table, 2);
        _mm256_storeu_si256((__m256i *)(o + j), _mm512_cvtepi32_epi16(v));
    }
    for (; j < n; j++) o[j] = table[a[j]];
}

LOWP_INLINE void gelu_grad_run(int f16, uint16_t *o, const uint16_t *g, const uint16_t *x, int64_t n,
                               const float *slope)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512i idx = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + j)));
        store16(f16, o + j, _mm512_mul_ps(load16(f16, g + j), _mm512_i32gather_ps(idx, slope, 4)));
    }
    if (j < n) {
        uint16_t t[16] = {0};   /* index 0 for the lanes past the tail: read, not stored */
        memcpy(t, x + j, sizeof(uint16_t) * (size_t)(n - j));
        __m512i idx = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)t));
        store_tail(f16, o + j, _mm512_mul_ps(load_tail(f16, g + j, n - j), _mm512_i32gather_ps(idx, slope, 4)),
                   n - j);
    }
}

LOWP_FN static void gelu_fwd(uint16_t *o, const uint16_t *a, int64_t n, const uint16_t *table)
{
    gelu_fwd_run(o, a, n, table);
}
LOWP_FN static void gelu_grad_bf16(uint16_t *o, const uint16_t *g, const uint16_t *x, int64_t n, const float *slope)
{
    gelu_grad_run(0, o, g, x, n, slope);
}
LOWP_FN static void gelu_grad_f16(uint16_t *o, const uint16_t *g, const uint16_t *x, int64_t n, const float *slope)
{
    gelu_grad_run(1, o, g, x, n, slope);
}

int cpu_lowp_gelu(mp_kctx *cx, mp_dtype dt, uint16_t *out, const uint16_t *a, int64_t n, const uint16_t *table)
{
    if (!usable(cx, dt)) return 0;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += CHUNK) gelu_fwd(out + i, a + i, n - i < CHUNK ? n - i : CHUNK, table);
    return 1;
}

int cpu_lowp_gelu_grad(mp_kctx *cx, mp_dtype dt, uint16_t *gin, const uint16_t *gout, const uint16_t *x, int64_t n,
                       const float *slope)
{
    if (!usable(cx, dt)) return 0;
    void (*run)(uint16_t *, const uint16_t *, const uint16_t *, int64_t, const float *) =
        dt == MP_F16 ? gelu_grad_f16 : gelu_grad_bf16;
    #pragma omp parallel for if (n >= MP_PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i += CHUNK) run(gin + i, gout + i, x + i, n - i < CHUNK ? n - i : CHUNK, slope);
    return 1;
}

/* ---- binary ------------------------------------------------------------- */

LOWP_FN static inline __m512 bin16(mp_binop op, __m512 x, __m512 y)
{
    switch (op) {
    case MP_ADD: return _mm512_add_ps(x, y);
    case MP_SUB: return _mm512_sub_ps(x, y);
    case MP_MUL: return _mm512_mul_ps(x, y);
    case MP_DIV: return _mm512_div_ps(x, y);
    default: return x;   /* not reached: cpu_binary_lowp takes these four */
    }
}

/* ia, ib: 1 for a run, 0 for one value (a scalar operand) */
LOWP_INLINE void binary_run(int f16, mp_binop op, uint16_t *o, const uint16_t *a, int64_t ia, const uint16_t *b,
                               int64_t ib, int64_t n)
{
    __m512 sa = widen(f16, _mm256_set1_epi16((short)a[0])), sb = widen(f16, _mm256_set1_epi16((short)b[0]));
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        store16(f16, o + j, bin16(op, ia ? load16(f16, a + j) : sa, ib ? load16(f16, b + j) : sb));
    if (j < n)
        store_tail(f16, o + j,
                   bin16(op, ia ? load_tail(f16, a + j, n - j) : sa, ib ? load_tail(f16, b + j, n - j) : sb), n - j);
}

#define BIN_ARGS(OP) OP, o, a, ia, b, ib, n
#define BIN_PARAMS (uint16_t *o, const uint16_t *a, int64_t ia, const uint16_t *b, int64_t ib, int64_t n)
SPECIALISE(add, binary_run, BIN_PARAMS, BIN_ARGS(MP_ADD))
SPECIALISE(sub, binary_run, BIN_PARAMS, BIN_ARGS(MP_SUB))
SPECIALISE(mul, binary_run, BIN_PARAMS, BIN_ARGS(MP_MUL))
SPECIALISE(div, binary_run, BIN_PARAMS, BIN_ARGS(MP_DIV))

typedef void (*bin_fn) BIN_PARAMS;

static bin_fn bin_pick(mp_binop op, int f16)
{
    switch (op) {
    case MP_ADD: return f16 ? add_f16 : add_bf16;
    case MP_SUB: return f16 ? sub_f16 : sub_bf16;
    case MP_MUL: return f16 ? mul_f16 : mul_bf16;
    case MP_DIV: return f16 ? div_f16 : div_bf16;
    default: return NULL;
    }
}

int cpu_binary_lowp(mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b,
                    const mp_bcast *bc0)
{
    if ((op != MP_ADD && op != MP_SUB && op != MP_MUL && op != MP_DIV) || !usable(cx, dt)) return 0;
    mp_bcast bc;
    if (mp_bcast_coalesce(bc0, &bc) != 1) return 0;
    int64_t n = bc.shape[0], ia = bc.sa[0], ib = bc.sb[0];
    if ((ia != 0 && ia != 1) || (ib != 0 && ib != 1) || (ia == 0 && ib == 0)) return 0;
    bin_fn run = bin_pick(op, dt == MP_F16);
    const uint16_t *pa = a, *pb = b;
    #pragma omp parallel for if (n >= MP_PAR_MIN_MEM) schedule(static)
    for (int64_t i = 0; i < n; i += CHUNK)
        run((uint16_t *)out + i, pa + i * ia, ia, pb + i * ib, ib, n - i < CHUNK ? n - i : CHUNK);
    return 1;
}

/* ---- f32 with f16/bf16 ------------------------------------------------------ */

/* a op b, one of them f32 and the other widened here (lowa: a is the low
 * one), written as f32: the op bin16 makes on the cast's values */
LOWP_INLINE void mixed_run(int f16, mp_binop op, int lowa, float *o, const void *a, const void *b, int64_t n)
{
    const uint16_t *lo = lowa ? a : b;
    const float *hi = lowa ? b : a;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 l = load16(f16, lo + j), h = _mm512_loadu_ps(hi + j);
        _mm512_storeu_ps(o + j, lowa ? bin16(op, l, h) : bin16(op, h, l));
    }
    if (j < n) {
        float t[16] = {0};
        memcpy(t, hi + j, sizeof(float) * (size_t)(n - j));
        __m512 l = load_tail(f16, lo + j, n - j), h = _mm512_loadu_ps(t);
        _mm512_storeu_ps(t, lowa ? bin16(op, l, h) : bin16(op, h, l));
        memcpy(o + j, t, sizeof(float) * (size_t)(n - j));
    }
}

#define MIXED_PARAMS (float *o, const void *a, const void *b, int64_t n)
#define MIXED(NAME, F16, OP, LOWA) \
    LOWP_FN static void NAME MIXED_PARAMS { mixed_run(F16, OP, LOWA, o, a, b, n); }
MIXED(madd_bf16_b, 0, MP_ADD, 0) MIXED(madd_bf16_a, 0, MP_ADD, 1)
MIXED(madd_f16_b, 1, MP_ADD, 0) MIXED(madd_f16_a, 1, MP_ADD, 1)
MIXED(msub_bf16_b, 0, MP_SUB, 0) MIXED(msub_bf16_a, 0, MP_SUB, 1)
MIXED(msub_f16_b, 1, MP_SUB, 0) MIXED(msub_f16_a, 1, MP_SUB, 1)
MIXED(mmul_bf16_b, 0, MP_MUL, 0) MIXED(mmul_bf16_a, 0, MP_MUL, 1)
MIXED(mmul_f16_b, 1, MP_MUL, 0) MIXED(mmul_f16_a, 1, MP_MUL, 1)

typedef void (*mixed_fn) MIXED_PARAMS;

int cpu_binary_mixed(mp_kctx *cx, mp_binop op, float *out, const void *a, mp_dtype da, const void *b, mp_dtype db,
                     int64_t n)
{
    int lowa = da != MP_F32;
    mp_dtype low = lowa ? da : db;
    if ((lowa ? db : da) != MP_F32 || (low != MP_BF16 && low != MP_F16) || !usable(NULL, low)) return 1;
    static const mixed_fn pick[3][2][2] = {   /* [op][f16][lowa] */
        { { madd_bf16_b, madd_bf16_a }, { madd_f16_b, madd_f16_a } },
        { { msub_bf16_b, msub_bf16_a }, { msub_f16_b, msub_f16_a } },
        { { mmul_bf16_b, mmul_bf16_a }, { mmul_f16_b, mmul_f16_a } },
    };
    int k = op == MP_ADD ? 0 : op == MP_SUB ? 1 : op == MP_MUL ? 2 : -1;
    if (k < 0) return 1;
    mixed_fn run = pick[k][low == MP_F16][lowa];
    size_t ea = lowa ? 2 : 4, eb = lowa ? 4 : 2;
    #pragma omp parallel for if (n >= MP_PAR_MIN_MEM) schedule(static)
    for (int64_t i = 0; i < n; i += CHUNK)
        run(out + i, (const char *)a + (size_t)i * ea, (const char *)b + (size_t)i * eb, n - i < CHUNK ? n - i : CHUNK);
    return 0;
}

/* cpu_binary_lowp's add on one run, on the calling thread (cpu_add_serial) */
int cpu_lowp_add_serial(mp_kctx *cx, mp_dtype dt, void *out, const void *a, const void *b, int64_t ib, int64_t n)
{
    if (!usable(cx, dt)) return 0;
    (dt == MP_F16 ? add_f16 : add_bf16)(out, a, 1, b, ib, n);
    return 1;
}

#else   /* no AVX-512 intrinsics: every op takes the general path */

int cpu_lowp_usable(mp_kctx *cx, mp_dtype dt) { return 0; }


int cpu_unary_lowp(mp_kctx *cx, mp_unop op, mp_dtype dt, void *out, const void *a, int64_t n, double p)
{
    return 0;
}

int cpu_lowp_gelu(mp_kctx *cx, mp_dtype dt, uint16_t *out, const uint16_t *a, int64_t n, const uint16_t *table)
{
    return 0;
}

int cpu_lowp_gelu_grad(mp_kctx *cx, mp_dtype dt, uint16_t *gin, const uint16_t *gout, const uint16_t *x, int64_t n,
                       const float *slope)
{
    return 0;
}

int cpu_unary_grad_lowp(mp_kctx *cx, mp_unop op, mp_dtype dt, void *gin, const void *gout, const void *x,
                        int64_t n, double p)
{
    return 0;
}

int cpu_binary_lowp(mp_kctx *cx, mp_binop op, mp_dtype dt, void *out, const void *a, const void *b,
                    const mp_bcast *bc0)
{
    return 0;
}

int cpu_lowp_add_serial(mp_kctx *cx, mp_dtype dt, void *out, const void *a, const void *b, int64_t ib, int64_t n)
{
    return 0;
}

int cpu_binary_mixed(mp_kctx *cx, mp_binop op, float *out, const void *a, mp_dtype da, const void *b, mp_dtype db,
                     int64_t n)
{
    return 1;
}

#endif
