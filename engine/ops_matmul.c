/*
 * ops_matmul.c: matrix products and linear layers. matmul takes 2-D, batched
 * 3-D, a batch times one matrix (one big GEMM), one matrix times a batch, and
 * 1-D operands as numpy treats them (a vector is a row on the left and a column
 * on the right, and that dim is dropped). linear computes x @ w^T + b with the
 * bias in the backend's GEMM epilogue (gemm_bias) where it has one, else loaded
 * into the output before the GEMM accumulates onto it: either way the result
 * is rounded once, as a GPU GEMM with a bias epilogue does.
 *
 * An autocast weight (a cast the cast cache made: its storage's keep_wide) is
 * widened once per version of its values, into an f32 copy kept with its
 * storage, and handed to the backend's gemm_wide already widened, where the
 * backend's GEMM widens the dtype's operands (supports "gemm_wide": the CPU's
 * f16, and its bf16 below AVX512-core). Without it the
 * forward and the backward GEMM each widened the weight again (the MLP's
 * 784x512 weight: 1.6 MB written and read back per use). The copy costs 4
 * bytes per element of the cast's storage (for an optimizer's arena, its
 * whole working copy) for as long as the storage lives; a version bump (any
 * in-place write) makes the next GEMM widen it again. An optimizer step is the
 * exception: it writes a current copy along with the working copy
 * (engine/optim.c, backend optim_step's wide) and tags it current again.
 * Two more operands are kept so (keep_widened): a recorded linear's input,
 * which the weight gradient's GEMM reads again in the backward, and the
 * gradient that dx's and dw's GEMMs both read; the copy goes with their
 * storage (the saved input's at the end of its backward).
 */
#include <string.h>
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"
#include "engine/backward.h"

/* the f32 copy of t's values for a GEMM (engine/tensor.h: mp_storage.wide),
 * widened now if its storage changed since; NULL when t has none to keep (not
 * an autocast cast, or the backend's GEMM takes no widened operand of its
 * dtype), or when memory for it runs out (the GEMM then widens, as before) */
static const float *wide_operand(const mp_tensor *t)
{
    mp_storage *st = t->st;
    if (!st->keep_wide || (st->wide && st->wide_dtype != (int)t->dtype)) return NULL;
    const mp_backend *be = mp_be(t);
    if (!be->gemm_wide || (be->supports && !be->supports(be->ctx, "gemm_wide", t->dtype))) return NULL;
    if (!st->wide || st->wide_version != st->version) {
        int64_t n = (int64_t)(st->nbytes / mp_dtype_size(t->dtype));
        if (!st->wide && !(st->wide = mp_empty(MP_F32, t->dev, 1, &n))) {
            mp_clear_error();
            st->keep_wide = false;   /* not tried again for every GEMM */
            return NULL;
        }
        st->wide_dtype = (int)t->dtype;
        MP_K(t, cast, mp_data(st->wide), MP_F32, st->data, t->dtype, n, 0);
        st->wide_version = st->version;
    }
    return (const float *)mp_data(st->wide) + t->offset;
}

/* keep t's values widened with its storage from the next GEMM that reads it
 * on, where the backend's GEMM widens t's dtype (gemm_wide): for an operand
 * that a second GEMM reads again (linear's input, which the weight gradient
 * reads in the backward; the gradient that dx's and dw's GEMMs both read).
 * Only where t is its whole storage (an op's output): the copy widens the
 * whole storage, and a batch that is a view of a dataset held in f16 would
 * keep the whole dataset widened */
static void keep_widened(mp_tensor *t)
{
    const mp_backend *be = mp_be(t);
    if ((t->dtype == MP_F16 || t->dtype == MP_BF16) && t->offset == 0 &&
        (size_t)t->numel * mp_dtype_size(t->dtype) == t->st->nbytes && be->gemm_wide &&
        (!be->supports || be->supports(be->ctx, "gemm_wide", t->dtype)))
        t->st->keep_wide = true;
}

/* C = alpha op(A) @ op(B) + beta C in dtype dt on c's backend, with the kept
 * widened copy of an operand that has one (gemm_wide); 0, or -1 for want of
 * working memory */
static int gemm_run(const mp_tensor *c, mp_dtype dt, int ta, int tb, int64_t batch, int64_t m, int64_t n, int64_t k,
                    float alpha, const mp_tensor *a, int64_t sa, const mp_tensor *b, int64_t sb, float beta,
                    void *cdata, int64_t sc)
{
    const float *wa = a->dtype == dt ? wide_operand(a) : NULL, *wb = b->dtype == dt ? wide_operand(b) : NULL;
    if (wa || wb) {
        int rc = MP_K(c, gemm_wide, dt, ta, tb, batch, m, n, k, alpha, wa ? (const void *)wa : mp_data(a), wa != NULL,
                      sa, wb ? (const void *)wb : mp_data(b), wb != NULL, sb, beta, cdata, sc, NULL, NULL);
        if (rc <= 0) return rc;
    }
    return MP_K(c, gemm, dt, ta, tb, batch, m, n, k, alpha, mp_data(a), sa, mp_data(b), sb, beta, cdata, sc);
}

/* the 2-D product op(A) @ op(B) in dtype dt on be's gemm_wide with one of its
 * epilogues (kernels/backend.h): bias {n} (dt) starting C's sums, or acc
 * {m,n} (f32) taking C's rounded values added (cdata unused); operands with a
 * kept widened copy go widened. 0 done, 1 declined (no gemm_wide for dt, or
 * the backend's), -1 for want of working memory */
static int gemm_epilogue(const mp_backend *be, mp_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                         const mp_tensor *a, const mp_tensor *b, const void *bias, void *cdata, float *acc)
{
    if (!be->gemm_wide || (be->supports && !be->supports(be->ctx, "gemm_wide", dt)) || a->dtype != dt ||
        b->dtype != dt)
        return 1;
    const float *wa = wide_operand(a), *wb = wide_operand(b);
    return be->gemm_wide(be->ctx, dt, ta, tb, 1, m, n, k, 1.0f, wa ? (const void *)wa : mp_data(a), wa != NULL, 0,
                         wb ? (const void *)wb : mp_data(b), wb != NULL, 0, 0.0f, cdata, m * n, bias, acc);
}

/* C{batch,m,n} = op(A) @ op(B) as a new tensor (2-D when batch is 0) */
static mp_tensor *gemm_new(mp_dtype dt, mp_device dev, int ta, int tb, int64_t batch, int64_t m, int64_t n,
                           int64_t k, const mp_tensor *a, int64_t sa, const mp_tensor *b, int64_t sb)
{
    int64_t shape[3] = {batch, m, n};
    mp_tensor *c = batch ? mp_empty(dt, dev, 3, shape) : mp_empty(dt, dev, 2, shape + 1);
    if (c && gemm_run(c, dt, ta, tb, batch ? batch : 1, m, n, k, 1.0f, a, sa, b, sb, 0.0f, mp_data(c), m * n)) {
        mp_release(c);
        return mp_fail(MP_EOOM, "out of memory: no working memory for a %lldx%lldx%lld product",
                       (long long)m, (long long)n, (long long)k), NULL;
    }
    return c;
}

/* a^T of the last two dims (a copy), or NULL; a NULL a gives NULL */
static mp_tensor *last_t(mp_tensor *a) { return a ? mp_transpose(a, -2, -1) : NULL; }
/* a @ b, then a and b released; NULL when either is */
static mp_tensor *matmul_take(mp_tensor *a, mp_tensor *b)
{
    mp_tensor *r = a && b ? mp_matmul(a, b) : NULL;
    mp_release(a), mp_release(b);
    return r;
}

/* matmul_backward from recording ops (create_graph): dA = dC @ B^T, summed
 * over the batch when A was one matrix for all of it; dB = A^T @ dC, over all
 * rows as one product when B was */
static int matmul_backward_graph(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *a = nd->saved[0], *b = nd->saved[1];
    if (mp_edge_wants(nd, 0)) {
        mp_tensor *d = matmul_take(mp_retain(g), last_t(b));
        if (d && a->ndim == 2 && d->ndim == 3) {
            mp_tensor *s = mp_reduce(MP_SUM, d, 1, 0);
            mp_release(d);
            d = s;
        }
        if (!(gin[0] = d)) return -1;
    }
    if (mp_edge_wants(nd, 1)) {
        if (a->ndim == 3 && b->ndim == 2) {
            int64_t ak[2] = {-1, a->shape[2]}, gn[2] = {-1, g->shape[2]};
            mp_tensor *a2 = mp_reshape(a, 2, ak), *g2 = a2 ? mp_reshape(g, 2, gn) : NULL;
            gin[1] = matmul_take(last_t(g2 ? a2 : NULL), g2);
            mp_release(a2);
        } else {
            gin[1] = matmul_take(last_t(a), mp_retain(g));
        }
        if (!gin[1]) return -1;
    }
    return 0;
}

/* gradients of C = A @ B for the 2-D/3-D cases of mp_matmul */
static int matmul_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    if (mp_grad_enabled()) return matmul_backward_graph(nd, g, gin);
    mp_tensor *a = nd->saved[0], *b = nd->saved[1];
    mp_dtype dt = g->dtype;
    int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], n = b->shape[b->ndim - 1];
    int64_t batch = a->ndim == 3 ? a->shape[0] : b->ndim == 3 ? b->shape[0] : 0;
    if (mp_edge_wants(nd, 0)) {
        if (b->ndim == 2)   /* dA{..,m,k} = dC{..,m,n} @ B^T, all rows as one GEMM */
            gin[0] = gemm_new(dt, g->dev, 0, 1, 0, a->numel / k, k, n, g, 0, b, 0);
        else {
            gin[0] = gemm_new(dt, g->dev, 0, 1, batch, m, k, n, g, m * n, b, k * n);
            if (gin[0] && a->ndim == 2) {   /* A was shared by every batch item */
                mp_tensor *s = mp_reduce(MP_SUM, gin[0], 1, 0);
                mp_release(gin[0]);
                gin[0] = s;
            }
        }
        if (!gin[0]) return -1;
        if (a->ndim == 3 && gin[0]->ndim == 2) {
            mp_tensor *r = mp_reshape(gin[0], 3, a->shape);
            mp_release(gin[0]);
            if (!(gin[0] = r)) return -1;
        }
    }
    if (mp_edge_wants(nd, 1)) {
        if (b->ndim == 2)   /* dB{k,n} = A^T @ dC over all rows */
            gin[1] = gemm_new(dt, g->dev, 1, 0, 0, k, n, a->numel / k, a, 0, g, 0);
        else
            gin[1] = gemm_new(dt, g->dev, 1, 0, batch, k, n, m, a, a->ndim == 3 ? m * k : 0, g, m * n);
        if (!gin[1]) return -1;
    }
    return 0;
}

static int check_pair(const mp_tensor *a, const mp_tensor *b);

/* the 2-d/3-d product, the op that autograd records */
static mp_tensor *matmul_fwd(mp_op_ctx *c)
{
    mp_tensor *a = c->in[0], *b = c->in[1];
    char b1[128], b2[128];
    if (check_pair(a, b)) return NULL;
    if (a->ndim == 3 && b->ndim == 3 && a->shape[0] != b->shape[0])
        return mp_fail(MP_EINVAL, "batch sizes of %s and %s differ (%lld vs %lld)",
                       mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                       mp_shape_str(b->ndim, b->shape, b2, sizeof b2),
                       (long long)a->shape[0], (long long)b->shape[0]), NULL;
    int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], k2 = b->shape[b->ndim - 2];
    int64_t n = b->shape[b->ndim - 1];
    if (k != k2)
        return mp_fail(MP_EINVAL, "shapes %s and %s do not match (%lld vs %lld)",
                       mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                       mp_shape_str(b->ndim, b->shape, b2, sizeof b2), (long long)k, (long long)k2), NULL;
    mp_tensor *o;
    if (a->ndim == 3 && b->ndim == 2) {   /* one big GEMM: {batch*m, k} @ {k, n} */
        o = gemm_new(a->dtype, a->dev, 0, 0, 0, a->shape[0] * m, n, k, a, 0, b, 0);
        if (o) {
            int64_t shape[3] = {a->shape[0], m, n};
            mp_tensor *r = mp_view(o, 3, shape, 0);
            mp_release(o);
            o = r;
        }
    } else if (a->ndim == 2 && b->ndim == 2) {
        o = gemm_new(a->dtype, a->dev, 0, 0, 0, m, n, k, a, 0, b, 0);
    } else {
        int64_t batch = a->ndim == 3 ? a->shape[0] : b->shape[0];
        o = gemm_new(a->dtype, a->dev, 0, 0, batch, m, n, k, a, a->ndim == 3 ? m * k : 0, b,
                     b->ndim == 3 ? k * n : 0);
    }
    if (o && (mp_keep(c, 0, a) || mp_keep(c, 1, b))) mp_release(o), o = NULL;
    return o;
}

static const mp_op matmul_op = {.name = "matmul", .ac = MP_AC_LOW, .nin = 2, .forward = matmul_fwd,
                                .backward = matmul_backward, .double_backward = true};
MP_OP_REGISTER(matmul_op);

static mp_tensor *matmul_core(mp_tensor *a, mp_tensor *b)
{
    mp_op_ctx c = {0};
    mp_tensor *in[2] = {a, b};
    return mp_apply(&matmul_op, &c, 2, in);
}

static int check_pair(const mp_tensor *a, const mp_tensor *b)
{
    if (a->dev != b->dev)
        return mp_fail(MP_EINVAL, "tensors are on different devices (%s and %s)",
                       mp_device_name(a->dev), mp_device_name(b->dev));
    if (a->dtype != b->dtype)
        return mp_fail(MP_EINVAL, "dtypes %s and %s differ (cast one with :to())",
                       mp_dtype_name(a->dtype), mp_dtype_name(b->dtype));
    if (!mp_is_float(a->dtype))
        return mp_fail(MP_EINVAL, "matmul needs a float dtype (got %s)", mp_dtype_name(a->dtype));
    return 0;
}

/* t {batch..., r, c} as {B, r, c} (B the batch dims' product) after broadcasting
 * its batch dims to bs (nbs dims): a view when they already are bs, else an
 * expanded copy (whose backward sums back: mp_expand) */
static mp_tensor *batch3(mp_tensor *t, int nbs, const int64_t *bs, int64_t B)
{
    int64_t full[MP_MAXDIM];
    memcpy(full, bs, sizeof(int64_t) * (size_t)nbs);
    full[nbs] = t->shape[t->ndim - 2], full[nbs + 1] = t->shape[t->ndim - 1];
    bool same = t->ndim == nbs + 2;
    for (int d = 0; same && d < nbs; d++) same = t->shape[d] == bs[d];
    mp_tensor *e = same ? mp_retain(t) : mp_expand(t, nbs + 2, full), *r = NULL;
    int64_t three[3] = {B, full[nbs], full[nbs + 1]};
    if (e) r = mp_reshape(e, 3, three);
    mp_release(e);
    return r;
}

/* a{..., m, k} @ b{..., k, n} with the batch dims broadcast as numpy does; both at
 * least 2-d. A side whose batch is all ones is one matrix for every item (a
 * stride-0 operand of the batched GEMM: no copy); two batches that differ are
 * broadcast to the common shape first. */
static mp_tensor *matmul_batched(mp_tensor *a, mp_tensor *b)
{
    char b1[128], b2[128];
    int na = a->ndim - 2, nb = b->ndim - 2, nbs = na > nb ? na : nb;
    int64_t bs[MP_MAXDIM], A = 1, Bn = 1, B = 1;
    for (int i = 0; i < nbs; i++) {   /* right-aligned, as broadcasting */
        int ia = i - (nbs - na), ib = i - (nbs - nb);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return mp_fail(MP_EINVAL, "batch dims of %s and %s do not broadcast (dim %d: %lld vs %lld)",
                           mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                           mp_shape_str(b->ndim, b->shape, b2, sizeof b2), i + 1, (long long)da,
                           (long long)db), NULL;
        bs[i] = da > db ? da : db;
        A *= da, Bn *= db, B *= bs[i];
    }
    int64_t m = a->shape[a->ndim - 2], n = b->shape[b->ndim - 1];
    if (a->shape[a->ndim - 1] != b->shape[b->ndim - 2])
        return mp_fail(MP_EINVAL, "shapes %s and %s do not match (%lld vs %lld)",
                       mp_shape_str(a->ndim, a->shape, b1, sizeof b1), mp_shape_str(b->ndim, b->shape, b2, sizeof b2),
                       (long long)a->shape[a->ndim - 1], (long long)b->shape[b->ndim - 2]), NULL;
    int64_t mat_a[2] = {m, a->shape[a->ndim - 1]}, mat_b[2] = {b->shape[b->ndim - 2], n};
    mp_tensor *x = A == 1 ? mp_reshape(a, 2, mat_a) : batch3(a, nbs, bs, B);
    mp_tensor *y = x ? (Bn == 1 ? mp_reshape(b, 2, mat_b) : batch3(b, nbs, bs, B)) : NULL;
    mp_tensor *c = y ? matmul_core(x, y) : NULL, *r = NULL;
    if (c) {   /* {bs..., m, n} */
        int64_t out[MP_MAXDIM];
        memcpy(out, bs, sizeof(int64_t) * (size_t)nbs);
        out[nbs] = m, out[nbs + 1] = n;
        r = mp_reshape(c, nbs + 2, out);
    }
    mp_release(x), mp_release(y), mp_release(c);
    return r;
}

mp_tensor *mp_matmul(mp_tensor *a, mp_tensor *b)
{
    if (a->ndim < 1 || b->ndim < 1)
        return mp_fail(MP_EINVAL, "matmul needs operands of at least 1 dim (got %d-d and %d-d)", a->ndim, b->ndim), NULL;
    if (a->ndim == 2 && b->ndim == 2) return matmul_core(a, b);
    if (a->ndim > 1 && b->ndim > 1) return matmul_batched(a, b);
    /* vectors: a row on the left, a column on the right, dropped from the result */
    char b1[128], b2[128];
    int64_t ka = a->shape[a->ndim - 1], kb = b->ndim == 1 ? b->shape[0] : b->shape[b->ndim - 2];
    if (ka != kb)
        return mp_fail(MP_EINVAL, "shapes %s and %s do not match (%lld vs %lld)",
                       mp_shape_str(a->ndim, a->shape, b1, sizeof b1),
                       mp_shape_str(b->ndim, b->shape, b2, sizeof b2), (long long)ka, (long long)kb), NULL;
    int64_t row[2] = {1, ka}, col[2] = {kb, 1};
    mp_tensor *a2 = a->ndim == 1 ? mp_reshape(a, 2, row) : mp_retain(a);
    mp_tensor *b2t = a2 && b->ndim == 1 ? mp_reshape(b, 2, col) : a2 ? mp_retain(b) : NULL;
    mp_tensor *c = b2t ? (a2->ndim == 2 && b2t->ndim == 2 ? matmul_core(a2, b2t) : matmul_batched(a2, b2t)) : NULL, *r = NULL;
    if (c) {
        int64_t shape[MP_MAXDIM];
        int nd = 0;
        for (int d = 0; d < c->ndim; d++) {
            bool drop = (a->ndim == 1 && d == c->ndim - 2) || (b->ndim == 1 && d == c->ndim - 1);
            if (!drop) shape[nd++] = c->shape[d];
        }
        r = mp_reshape(c, nd, shape);
    }
    mp_release(a2);
    mp_release(b2t);
    mp_release(c);
    return r;
}

/* ---- linear: x{.., in} @ w{out, in}^T + b{out} ---- */

/* linear's gradients from recording ops (create_graph), g as {rows, out}:
 * for the inputs x, w (and b) whose edges of nd want one */
static int linear_grads_graph(mp_node *nd, mp_tensor *x, mp_tensor *w, mp_tensor *g, mp_tensor **gin)
{
    int64_t out = w->shape[0], in = w->shape[1], flat[2] = {-1, out}, xflat[2] = {-1, in};
    mp_tensor *g2 = mp_reshape(g, 2, flat);
    if (!g2) return -1;
    int rc = 0;
    if (mp_edge_wants(nd, 0)) {   /* dx = g @ w */
        mp_tensor *d = mp_matmul(g2, w);
        gin[0] = d ? mp_reshape(d, x->ndim, x->shape) : NULL;
        mp_release(d);
        if (!gin[0]) rc = -1;
    }
    if (rc == 0 && mp_edge_wants(nd, 1) && !(gin[1] = matmul_take(last_t(g2), mp_reshape(x, 2, xflat))))
        rc = -1;   /* dw = g^T @ x */
    if (rc == 0 && nd->nin > 2 && mp_edge_wants(nd, 2) && !(gin[2] = mp_reduce(MP_SUM, g2, 1, 0))) rc = -1;
    mp_release(g2);
    return rc;
}

/* linear's gradients with the backend's GEMMs and one reduce over the rows for
 * the bias, g {rows.., out} of x's dtype */
static int linear_grads(mp_node *nd, mp_tensor *x, mp_tensor *w, mp_tensor *g, mp_tensor **gin)
{
    int64_t out = w->shape[0], in = w->shape[1], rows = x->numel / in;
    if (mp_edge_wants(nd, 0) && mp_edge_wants(nd, 1)) keep_widened(g);   /* read by both GEMMs */
    if (mp_edge_wants(nd, 0)) {   /* dx{rows,in} = g{rows,out} @ w{out,in} */
        mp_tensor *d = gemm_new(g->dtype, g->dev, 0, 0, 0, rows, in, out, g, 0, w, 0);
        gin[0] = d ? mp_reshape(d, x->ndim, x->shape) : NULL;
        mp_release(d);
        if (!gin[0]) return -1;
    }
    bool wants_db = nd->nin > 2 && mp_edge_wants(nd, 2);
    const mp_backend *be = mp_be(g);
    if (wants_db && mp_edge_wants(nd, 1) && be->gemm_wgrad_bias && rows > 0) {   /* db in dw's GEMM epilogue */
        int64_t wshape[2] = {out, in};
        mp_tensor *dw = mp_empty(g->dtype, g->dev, 2, wshape), *db = dw ? mp_empty(g->dtype, g->dev, 1, &out) : NULL;
        int rc = db ? MP_K(dw, gemm_wgrad_bias, g->dtype, rows, out, in, mp_data(g), mp_data(x), mp_data(dw), mp_data(db))
                    : -2;
        if (rc == 0) {
            gin[1] = dw, gin[2] = db;
            return 0;
        }
        mp_release(dw), mp_release(db);
        if (rc == -2) return -1;
        if (rc < 0)
            return mp_fail(MP_EOOM, "out of memory: no working memory for a %lldx%lldx%lld product",
                           (long long)out, (long long)in, (long long)rows);
    }
    /* dw straight into the f32 .grad of the master weight that w is the cast of,
     * where the walk says nothing else is to see dw (engine/backward.h
     * mp_backward_sink): rounded to g's dtype and added as the cast's backward
     * would, without dw written and read back */
    mp_tensor *sink = mp_edge_wants(nd, 1) ? mp_backward_sink(nd, 1) : NULL;
    int rc = sink ? gemm_epilogue(be, g->dtype, 1, 0, out, in, rows, g, x, NULL, NULL, mp_data(sink)) : 1;
    if (rc < 0)
        return mp_fail(MP_EOOM, "out of memory: no working memory for a %lldx%lldx%lld product",
                       (long long)out, (long long)in, (long long)rows);
    if (rc == 0) sink->st->version++;   /* an in-place write, as the cast's add */
    else if (mp_edge_wants(nd, 1) && !(gin[1] = gemm_new(g->dtype, g->dev, 1, 0, 0, out, in, rows, g, 0, x, 0)))
        return -1;   /* dw{out,in} = g^T @ x */
    if (wants_db) {
        int64_t flat[2] = {rows, out};
        mp_tensor *g2 = mp_reshape(g, 2, flat);
        gin[2] = g2 ? mp_reduce(MP_SUM, g2, 1, 0) : NULL;
        mp_release(g2);
        if (!gin[2]) return -1;
    }
    return 0;
}

static int linear_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    if (mp_grad_enabled()) return linear_grads_graph(nd, nd->saved[0], nd->saved[1], g, gin);
    return linear_grads(nd, nd->saved[0], nd->saved[1], g, gin);
}

/* the shapes, dtypes and devices of linear's x, w, b (b may be NULL); 0 or -1 */
static int linear_check(const mp_tensor *x, const mp_tensor *w, const mp_tensor *b)
{
    char b1[128], b2[128];
    if (check_pair(x, w) || (b && check_pair(x, b))) return -1;
    if (w->ndim != 2)
        return mp_fail(MP_EINVAL, "weight must be 2-d {out, in} (got %s)",
                       mp_shape_str(w->ndim, w->shape, b1, sizeof b1)), -1;
    if (x->ndim < 1 || x->shape[x->ndim - 1] != w->shape[1])
        return mp_fail(MP_EINVAL, "input %s does not match weight %s (last dim must be %lld)",
                       mp_shape_str(x->ndim, x->shape, b1, sizeof b1),
                       mp_shape_str(w->ndim, w->shape, b2, sizeof b2), (long long)w->shape[1]), -1;
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return mp_fail(MP_EINVAL, "bias %s does not match weight %s (expected {%lld})",
                       mp_shape_str(b->ndim, b->shape, b1, sizeof b1),
                       mp_shape_str(w->ndim, w->shape, b2, sizeof b2), (long long)w->shape[0]), -1;
    return 0;
}

/* y = x @ w^T + b as a new tensor of x's dtype (b may be NULL), checked first */
static mp_tensor *linear_product(mp_tensor *x, mp_tensor *w, mp_tensor *b)
{
    if (linear_check(x, w, b)) return NULL;
    int64_t out = w->shape[0], in = w->shape[1], rows = x->numel / in, shape[MP_MAXDIM];
    for (int d = 0; d < x->ndim; d++) shape[d] = d == x->ndim - 1 ? out : x->shape[d];
    mp_tensor *y = mp_empty(x->dtype, x->dev, x->ndim, shape);
    if (!y) return NULL;
    const mp_backend *be = mp_be(y);
    int rc = b && be->gemm_bias ? MP_K(y, gemm_bias, x->dtype, rows, out, in, mp_data(x), mp_data(w), mp_data(b), mp_data(y))
                                : 1;
    if (rc == 1 && b) rc = gemm_epilogue(be, x->dtype, 0, 1, rows, out, in, x, w, mp_data(b), mp_data(y), NULL);
    if (rc < 0) {
        mp_release(y);
        return mp_fail(MP_EOOM, "out of memory: no working memory for a %lldx%lldx%lld product",
                       (long long)rows, (long long)out, (long long)in), NULL;
    }
    if (rc == 0) return y;   /* the bias in the GEMM's epilogue */
    float beta = 0.0f;
    if (b) {   /* every row of y starts as the bias: 0 + b broadcast over the rows */
        mp_tensor *zero = mp_full(x->dtype, x->dev, 1, &out, 0);
        if (!zero) { mp_release(y); return NULL; }
        mp_bcast bc = {.ndim = 2, .shape = {rows, out}, .sa = {0, 1}, .sb = {0, 1}};
        MP_K(y, binary, MP_ADD, x->dtype, mp_data(y), mp_data(zero), mp_data(b), &bc);
        mp_release(zero);
        beta = 1.0f;
    }
    if (gemm_run(y, x->dtype, 0, 1, 1, rows, out, in, 1.0f, x, 0, w, 0, beta, mp_data(y), 0)) {
        mp_release(y);
        return mp_fail(MP_EOOM, "out of memory: no working memory for a %lldx%lldx%lld product",
                       (long long)rows, (long long)out, (long long)in), NULL;
    }
    return y;
}

static mp_tensor *linear_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *w = c->in[1];
    if (c->record && w->requires_grad) keep_widened(x);   /* the weight gradient's GEMM reads x again */
    mp_tensor *y = linear_product(x, w, c->in[2]);
    if (y && (mp_keep(c, 0, x) || mp_keep(c, 1, w))) mp_release(y), y = NULL;
    return y;
}

static const mp_op linear_op = {.name = "linear", .ac = MP_AC_LOW, .nin = 3, .forward = linear_fwd,
                                .backward = linear_backward, .double_backward = true};
MP_OP_REGISTER(linear_op);

mp_tensor *mp_linear(mp_tensor *x, mp_tensor *w, mp_tensor *b)
{
    mp_op_ctx c = {0};
    mp_tensor *in[3] = {x, w, b};
    return mp_apply(&linear_op, &c, 3, in);
}

/* ---- linear_gelu: gelu(x @ w^T + b), one op ----
 *
 * The MLP's first layer and its activation as one op, so a backend can write
 * the activation in the GEMM's epilogue (gemm_bias_gelu: cuBLASLt's
 * GELU_AUX_BIAS, which also writes the pre-activation for the backward) in
 * place of a GEMM, then a pass reading the product back and writing the GELU.
 * Without such an epilogue (the CPU, the erf form on CUDA) it is linear's
 * product (bias in the GEMM's epilogue where there is one) and then one GELU
 * pass: the values of mp_linear then mp_unary(MP_GELU) bit for bit, both
 * rounded to x's dtype at the same two places. Its autocast class is linear's
 * (low), and GELU's (none) keeps the dtype it is given, so under autocast too
 * the values are linear's then gelu's.
 *
 * Saved: x, w, b (for a backward that builds a graph) and the pre-activation
 * h = x @ w^T + b, which the two ops kept as gelu's input: no more memory than
 * before. Backward: dh = g * gelu'(h) (the unary_grad kernel, gelu's backward),
 * then linear's gradients of dh. With create_graph it recomputes h with
 * mp_linear (the saved h is cut from x, w and b) and builds dh from
 * gelu_backward, so the gradient can be differentiated again. */

typedef struct { double form; } linear_gelu_args;   /* 0: the erf form; 1: the tanh approximation */

static int linear_gelu_backward(mp_node *nd, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *x = nd->saved[0], *w = nd->saved[1], *b = nd->saved[2], *h = nd->saved[3];
    double form = MP_NODE_ARGS(nd, linear_gelu_args)->form;
    if (mp_grad_enabled()) {
        mp_tensor *h2 = mp_linear(x, w, b), *dh = h2 ? mp_gelu_backward(g, h2, form) : NULL;
        mp_release(h2);
        int rc = dh ? linear_grads_graph(nd, x, w, dh, gin) : -1;
        mp_release(dh);
        return rc;
    }
    mp_tensor *dh = mp_empty(g->dtype, g->dev, g->ndim, g->shape);
    if (!dh) return -1;
    MP_K(dh, unary_grad, MP_GELU, g->dtype, mp_data(dh), mp_data(g), mp_data(h), NULL, g->numel, form);
    int rc = linear_grads(nd, x, w, dh, gin);
    mp_release(dh);
    return rc;
}

static mp_tensor *linear_gelu_fwd(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *w = c->in[1], *b = c->in[2], *h = NULL, *y = NULL;
    double form = MP_OP_ARGS(c, linear_gelu_args)->form;
    if (linear_check(x, w, b)) return NULL;
    const mp_backend *be = mp_be(x);
    if (b && be->gemm_bias_gelu) {   /* both in the GEMM's epilogue */
        int64_t out = w->shape[0], in = w->shape[1], rows = x->numel / in, shape[MP_MAXDIM];
        for (int d = 0; d < x->ndim; d++) shape[d] = d == x->ndim - 1 ? out : x->shape[d];
        h = mp_empty(x->dtype, x->dev, x->ndim, shape);
        y = h ? mp_empty(x->dtype, x->dev, x->ndim, shape) : NULL;
        if (!y) { mp_release(h); return NULL; }
        int rc = MP_K(y, gemm_bias_gelu, x->dtype, rows, out, in, mp_data(x), mp_data(w), mp_data(b), form, mp_data(y),
                      mp_data(h));
        if (rc < 0) {
            mp_release(h), mp_release(y);
            return mp_fail(MP_EOOM, "out of memory: no working memory for a %lldx%lldx%lld product",
                           (long long)rows, (long long)out, (long long)in), NULL;
        }
        if (rc > 0) mp_release(h), mp_release(y), h = y = NULL;   /* declined: the two passes below */
    }
    if (!y) {
        if (!(h = linear_product(x, w, b))) return NULL;
        if (!(y = mp_empty(h->dtype, h->dev, h->ndim, h->shape))) { mp_release(h); return NULL; }
        MP_K(y, unary, MP_GELU, h->dtype, mp_data(y), mp_data(h), h->numel, form);
    }
    if (mp_keep(c, 0, x) || mp_keep(c, 1, w) || mp_keep(c, 2, b) || mp_keep(c, 3, h)) mp_release(y), y = NULL;
    mp_release(h);
    return y;
}

static const mp_op linear_gelu_op = {.name = "linear_gelu", .ac = MP_AC_LOW, .nin = 3, .forward = linear_gelu_fwd,
                                     .backward = linear_gelu_backward, .args_size = sizeof(linear_gelu_args),
                                     .double_backward = true};
MP_OP_REGISTER(linear_gelu_op);

mp_tensor *mp_linear_gelu(mp_tensor *x, mp_tensor *w, mp_tensor *b, bool tanh_form)
{
    linear_gelu_args args = {.form = tanh_form ? 1.0 : 0.0};
    mp_op_ctx c = {.args = &args};
    mp_tensor *in[3] = {x, w, b};
    return mp_apply(&linear_gelu_op, &c, 3, in);
}
