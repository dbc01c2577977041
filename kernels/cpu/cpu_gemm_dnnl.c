/*
 * cpu_gemm_dnnl.c: f32 and bf16 matrix products through oneDNN's matmul
 * (Debian's libdnnl, what PyTorch's CPU bf16 matmul runs on). On a processor
 * with AVX512-BF16 its bf16 kernels multiply bf16 pairs into f32 accumulators
 * (vdpbf16ps) at twice the f32 rate and round the result once into bf16: the
 * numerics of cpu_gemm's widen-sgemm-round path, without the widening copies.
 * Its f32 kernels (AVX-512 JIT) ran the GPT's step 15% faster than OpenBLAS
 * with OPENBLAS_CORETYPE=Haswell, this machine's setting.
 *
 * A plan (primitive) is made once per shape and kept in the CPU context:
 * making one costs ~0.6 ms (oneDNN compiles its kernel), running one costs
 * microseconds. Where oneDNN has only its reference kernel for a shape (no
 * AVX512-BF16 here), or fails in any way, the shape is marked and cpu_gemm
 * takes its own path, so this file only ever makes things faster.
 */
#include <stdlib.h>
#include <string.h>
#include "kernels/cpu/cpu_dnnl.h"

#define PLANS 64   /* a GPT step has ~20 distinct shapes; beyond this, the oldest goes */

typedef struct {
    int dt, odt, ta, tb, bias;   /* odt: C's dtype (f32 C from bf16 operands: cpu_gemm_dnnl_f32out) */
    int64_t batch, m, n, k, sa, sb, sc;
    float alpha, beta;
} plan_key;

typedef struct {
    plan_key key;
    int used;                       /* 1: a plan; -1: oneDNN cannot do this shape well */
    dnnl_primitive_t prim;
    dnnl_memory_desc_t md[4];       /* src, weights, dst, bias */
} plan;

struct cpu_gemm_plans {
    plan plans[PLANS];
    int next;                       /* the slot the next new plan takes */
};

/* tests turn oneDNN off to reach the paths that stand in for it */
static int dnnl_enabled = 1;
int cpu_dnnl_enable(int on)
{
    int was = dnnl_enabled;
    dnnl_enabled = on;
    return was;
}

struct cpu_dnnl *cpu_dnnl_of(mp_kctx *cx)
{
    if (!dnnl_enabled) return NULL;
    if (!cx->dnnl && !(cx->dnnl = calloc(1, sizeof *cx->dnnl))) return NULL;
    struct cpu_dnnl *d = cx->dnnl;
    if (d->state == 0) {
        d->state = dnnl_engine_create(&d->engine, dnnl_cpu, 0) == dnnl_success &&
                   dnnl_stream_create(&d->stream, d->engine, dnnl_stream_default_flags) == dnnl_success ? 1 : -1;
    }
    return d->state == 1 ? d : NULL;
}

/* whether oneDNN multiplies bf16 on this processor with kernels of its own:
 * its bf16 GEMMs need AVX512-core (vdpbf16ps where there is AVX512-BF16,
 * emulated without), and below that it offers only reference kernels, which
 * cpu_gemm_dnnl declines shape by shape; cpu_gemm then widens the operands
 * whole, as it does for f16 (cpu_gemm.c gemm_16) */
int cpu_gemm_dnnl_has_bf16(void)
{
    static int has = -1;
    if (has < 0) {
        dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
        has = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core;
    }
    return has;
}

/* the dtypes whose product cpu_gemm widens whole: f16 always; bf16 where
 * oneDNN has no bf16 kernels of its own (below AVX512-core: AVX2 processors).
 * Where it has them, bf16 goes to them, so a widened bf16 operand is declined
 * there (cpu_gemm_wide) rather than summed another way. Here, beside the
 * question it turns on, so that cpu_supports asks it without reaching into
 * cpu_gemm.c (whose scratch comes from the backend, which includes
 * cpu_supports' file: a circle). */
int cpu_gemm_widens(mp_dtype dt) { return dt == MP_F16 || (dt == MP_BF16 && !cpu_gemm_dnnl_has_bf16()); }

/* the engine with the GEMM's plans */
static struct cpu_dnnl *dnnl_of(mp_kctx *cx)
{
    struct cpu_dnnl *d = cpu_dnnl_of(cx);
    if (d && !d->gemm && !(d->gemm = calloc(1, sizeof *d->gemm))) return NULL;
    return d;
}

/* a row-major {rows, cols} operand of every batch item (or one shared, stride
 * 0), stored transposed when t */
static int desc(dnnl_memory_desc_t *md, dnnl_data_type_t dt, int64_t batch, int64_t stride, int64_t rows, int64_t cols, int t)
{
    int nd = batch == 1 ? 2 : 3, o = nd - 2;
    dnnl_dims_t dims = {0}, strides = {0};
    if (nd == 3) dims[0] = stride ? batch : 1, strides[0] = stride ? stride : rows * cols;
    dims[o] = rows, dims[o + 1] = cols;
    strides[o] = t ? 1 : cols, strides[o + 1] = t ? rows : 1;
    return dnnl_memory_desc_init_by_strides(md, nd, dims, dt, strides) != dnnl_success;
}

static int make_plan(struct cpu_dnnl *d, plan *p)
{
    const plan_key *k = &p->key;
    dnnl_matmul_desc_t mm;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    const char *impl = "";
    int ok = !desc(&p->md[0], k->dt, k->batch, k->sa, k->m, k->k, k->ta) && !desc(&p->md[1], k->dt, k->batch, k->sb, k->k, k->n, k->tb) &&
             !desc(&p->md[2], k->odt, k->batch, k->m * k->n, k->m, k->n, 0) &&
             (!k->bias || !desc(&p->md[3], k->dt, 1, 0, 1, k->n, 0)) &&
             dnnl_matmul_desc_init(&mm, &p->md[0], &p->md[1], k->bias ? &p->md[3] : NULL, &p->md[2]) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && k->alpha != 1.0f) ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha) == dnnl_success;
    if (ok && k->beta != 0.0f)   /* C = alpha AB + beta C, summed in f32, rounded once */
        ok = dnnl_post_ops_create(&ops) == dnnl_success && dnnl_post_ops_append_sum(ops, k->beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, ops) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &mm, attr, d->engine, NULL) == dnnl_success &&
         dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success;
    /* oneDNN's reference kernels are slower than widening and sgemm */
    ok = ok && strncmp(impl, "ref", 3) != 0 && dnnl_primitive_create(&p->prim, pd) == dnnl_success;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (ops) dnnl_post_ops_destroy(ops);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok ? 1 : -1;
}

static plan *find(struct cpu_dnnl *d, const plan_key *key)
{
    struct cpu_gemm_plans *g = d->gemm;
    for (int i = 0; i < PLANS; i++)
        if (g->plans[i].used && !memcmp(&g->plans[i].key, key, sizeof *key)) return &g->plans[i];
    plan *p = &g->plans[g->next];
    g->next = (g->next + 1) % PLANS;
    if (p->used == 1) dnnl_primitive_destroy(p->prim);
    memset(p, 0, sizeof *p);
    p->key = *key;
    p->used = make_plan(d, p);
    return p;
}

/* run a plan over A, B, C (and the bias): 0, or 1 when oneDNN failed */
static int run(struct cpu_dnnl *d, plan *p, const void *a, const void *b, void *c, const void *bias)
{
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    void *ptr[4] = {(void *)a, (void *)b, c, (void *)bias};
    int nargs = bias ? 4 : 3, ok = 1;
    for (int i = 0; i < nargs && ok; i++) ok = dnnl_memory_create(&mem[i], &p->md[i], d->engine, ptr[i]) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]},
                                   {DNNL_ARG_BIAS, mem[3]}};
        ok = dnnl_primitive_execute(p->prim, d->stream, nargs, args) == dnnl_success &&
             dnnl_stream_wait(d->stream) == dnnl_success;
    }
    for (int i = 0; i < 4; i++) if (mem[i]) dnnl_memory_destroy(mem[i]);
    return ok ? 0 : 1;
}

static void key_of(plan_key *key, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                   int64_t sa, int64_t sb, int64_t sc, float alpha, float beta, int bias)
{
    memset(key, 0, sizeof *key);   /* the padding too: keys are compared whole */
    key->dt = key->odt = dt == MP_F32 ? dnnl_f32 : dnnl_bf16, key->ta = ta, key->tb = tb, key->bias = bias;
    key->batch = batch, key->m = m, key->n = n, key->k = k;
    key->sa = sa, key->sb = sb, key->sc = sc, key->alpha = alpha, key->beta = beta;
}

/* C = alpha op(A) op(B) + beta C for f32 or bf16 through oneDNN: 0 when done, 1
 * when the caller should take its own path */
int cpu_gemm_dnnl(mp_kctx *cx, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                  const void *a, int64_t sa, const void *b, int64_t sb, float beta, void *c, int64_t sc)
{
    struct cpu_dnnl *d = dnnl_of(cx);
    /* sc == 0 with a batch: every item accumulates into one C in turn, which a
     * single matmul cannot express */
    if ((dt != MP_F32 && dt != MP_BF16) || !d || m == 0 || n == 0 || k == 0 || (batch > 1 && sc != m * n)) return 1;
    plan_key key;
    key_of(&key, dt, ta, tb, batch, m, n, k, sa, sb, sc, alpha, beta, 0);
    plan *p = find(d, &key);
    return p->used == 1 ? run(d, p, a, b, c, NULL) : 1;
}

/* the same with bf16 A and B and an f32 C: the products' f32 sums unrounded,
 * for kernels that add more to them before their one rounding (convolution's
 * col2im and its weight gradient over images) */
int cpu_gemm_dnnl_f32out(mp_kctx *cx, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                         const void *a, int64_t sa, const void *b, int64_t sb, float beta, float *c, int64_t sc)
{
    struct cpu_dnnl *d = dnnl_of(cx);
    if (!d || m == 0 || n == 0 || k == 0 || (batch > 1 && sc != m * n)) return 1;
    plan_key key;
    key_of(&key, MP_BF16, ta, tb, batch, m, n, k, sa, sb, sc, alpha, beta, 0);
    key.odt = dnnl_f32;
    plan *p = find(d, &key);
    return p->used == 1 ? run(d, p, a, b, c, NULL) : 1;
}

/* the backend's gemm_bias: C{m,n} = A{m,k} @ B{n,k}^T + bias{n}, the bias
 * added to the f32 accumulators before the one rounding */
int cpu_gemm_bias(mp_kctx *cx, mp_dtype dt, int64_t m, int64_t n, int64_t k, const void *a, const void *b,
                  const void *bias, void *c)
{
    struct cpu_dnnl *d = dnnl_of(cx);
    if ((dt != MP_F32 && dt != MP_BF16) || !d || m == 0 || n == 0 || k == 0) return 1;
    plan_key key;
    key_of(&key, dt, 0, 1, 1, m, n, k, 0, 0, m * n, 1.0f, 0.0f, 1);
    plan *p = find(d, &key);
    return p->used == 1 ? run(d, p, a, b, c, bias) : 1;
}
