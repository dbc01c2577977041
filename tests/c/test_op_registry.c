/*
 * test_op_registry.c: ops described once (engine/op.h): the registry, autocast's
 * table seeded from the descriptions, a node with more inputs and saved tensors
 * than the old fixed caps, and an op defined outside the engine (here) that runs
 * through mp_apply like the engine's own.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include "engine/ops.h"
#include "engine/op.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/error.h"

Test(op_registry, every_op_is_described_once_with_one_class)
{
    const mp_op *op;
    int n = 0;
    for (int i = 0; (op = mp_op_at(i)); i++, n++) {
        cr_assert(op->name && op->name[0] && strlen(op->name) < 32, "op %d has a bad name", i);
        cr_assert(op->forward, "%s has no forward", op->name);
        cr_assert(op->nin == -1 || op->nin >= 1, "%s: arity %d", op->name, op->nin);
        /* a name shared by two descriptions (mul: tensor and scalar) has one class */
        const mp_op *first = mp_op_find(op->name);
        cr_assert_eq(first->ac, op->ac, "%s has two autocast classes", op->name);
        cr_assert_eq(mp_autocast_class(op->name), op->ac, "autocast's table disagrees on %s", op->name);
    }
    cr_assert_gt(n, 40);
    cr_assert_lt(n, 256, "the registry is full: raise MAX_OPS in engine/op.c");
    cr_assert_eq(mp_autocast_class("matmul"), MP_AC_LOW);
    cr_assert_eq(mp_autocast_class("softmax"), MP_AC_F32);
    cr_assert_eq(mp_autocast_class("add"), MP_AC_PROMOTE);
    cr_assert_eq(mp_autocast_class("no such op"), MP_AC_NONE);
}

static mp_tensor *leaf(double v)
{
    int64_t two = 2;
    double vals[2] = {v, -v};
    mp_tensor *t = mp_from_f64(MP_F32, MP_CPU, 1, &two, vals);
    cr_assert(t && mp_set_requires_grad(t, true) == 0);
    return t;
}

Test(op_registry, cat_of_nine_is_one_node)
{
    mp_tensor *ts[9];
    for (int i = 0; i < 9; i++) ts[i] = leaf(i + 1);
    mp_tensor *y = mp_cat(9, ts, 1);
    cr_assert(y, "%s", mp_error());
    cr_assert_eq(y->numel, 18);
    cr_assert_str_eq(y->grad_fn->name, "cat");
    cr_assert_eq(y->grad_fn->nin, 9);
    int64_t w = 18;
    mp_tensor *r = mp_arange(18, MP_F32, MP_CPU), *p = mp_binary(MP_MUL, y, r), *s = mp_reduce(MP_SUM, p, 0, 0);
    cr_assert(s && mp_backward(s, NULL) == 0, "%s", mp_error());
    for (int i = 0; i < 9; i++) {
        double g[2];
        cr_assert_eq(mp_read_f64(ts[i]->grad, 0, 2, g), 0);
        cr_assert_eq(g[0], 2 * i);
        cr_assert_eq(g[1], 2 * i + 1);
        mp_release(ts[i]);
    }
    (void)w;
    mp_release(y), mp_release(r), mp_release(p), mp_release(s);
}

/* An op of this file: y = x * 7, whose backward reads seven kept tensors (the
 * old node kept at most four), each a scalar 1. */
#define NKEEP 7
typedef struct {
    double factor;                 /* given: y = x * factor */
    mp_dtype seen;                 /* set by the forward: the input's dtype after autocast */
} many_args;

static int many_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    const many_args *a = MP_NODE_ARGS(n, many_args);
    cr_assert_eq(a->seen, MP_F32, "the node keeps what the forward wrote into its arguments");
    cr_assert_eq(a->factor, 7);
    cr_assert_eq(n->nsaved, NKEEP);
    double total = 0;
    for (int i = 0; i < NKEEP; i++) {
        double v;
        cr_assert(n->saved[i]);
        cr_assert_eq(mp_read_f64(n->saved[i], 0, 1, &v), 0);
        total += v;
    }
    gin[0] = mp_unary(MP_MULS, g, total);
    return gin[0] ? 0 : -1;
}

static mp_tensor *many_forward(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0], *y = mp_to_raw(x, x->dtype, x->dev);
    /* a forward computes without recording: the op's own node is its backward
     * (an inner node on the output would be overwritten by the op's, and leak) */
    bool was = mp_set_grad_enabled(false);
    many_args *a = MP_OP_ARGS(c, many_args);
    mp_tensor *m = y ? mp_unary(MP_MULS, y, a->factor) : NULL;
    mp_set_grad_enabled(was);
    mp_release(y);
    a->seen = x->dtype;
    for (int i = NKEEP - 1; m && i >= 0; i--) {
        mp_tensor *one = mp_full(MP_F32, MP_CPU, 0, NULL, 1);
        if (!one || mp_keep(c, i, one)) mp_release(m), m = NULL;
        mp_release(one);
    }
    return m;
}

static const mp_op many_op = {.name = "test_many_saved", .ac = MP_AC_F32, .nin = 1, .forward = many_forward,
                              .backward = many_backward, .args_size = sizeof(many_args)};
MP_OP_REGISTER(many_op);

Test(op_registry, an_op_keeps_any_number_of_tensors_and_follows_autocast)
{
    cr_assert_eq(mp_op_find("test_many_saved"), &many_op);
    cr_assert_eq(mp_autocast_class("test_many_saved"), MP_AC_F32);
    mp_tensor *x = leaf(3), *h = mp_to(x, MP_F16, MP_CPU);
    int tok = mp_autocast_enter(true, MP_F16);
    many_args args = {.factor = 7};
    mp_op_ctx c = {.args = &args};
    mp_tensor *y = mp_apply(&many_op, &c, 1, &h);
    mp_autocast_exit(tok);
    cr_assert(y, "%s", mp_error());
    cr_assert_eq(y->dtype, MP_F32, "the f32 class casts the f16 input up");
    cr_assert_str_eq(y->grad_fn->name, "test_many_saved");
    cr_assert_eq(c.nsaved, 0, "the node took the kept tensors");
    mp_tensor *s = mp_reduce(MP_SUM, y, 0, 0);
    cr_assert(s && mp_backward(s, NULL) == 0, "%s", mp_error());
    double g[2];
    cr_assert_eq(mp_read_f64(x->grad, 0, 2, g), 0);
    cr_assert_eq(g[0], NKEEP);
    cr_assert_eq(g[1], NKEEP);
    mp_release(x), mp_release(h), mp_release(y), mp_release(s);
}

Test(op_registry, no_node_without_a_gradient_and_nothing_kept)
{
    int64_t two = 2;
    mp_tensor *x = mp_full(MP_F32, MP_CPU, 1, &two, 2);
    many_args args = {.factor = 7};
    mp_op_ctx c = {.args = &args};
    mp_tensor *y = mp_apply(&many_op, &c, 1, &x);
    cr_assert(y && !y->grad_fn && !y->requires_grad);
    cr_assert_eq(c.nsaved, 0);
    mp_release(x), mp_release(y);
}

/* the bytes of address space this process has mapped (VmSize) */
static size_t mapped_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}

/* A kernel takes its working memory from its backend's context; when it cannot
 * have it, the op fails with an out-of-memory error naming it and writes
 * nothing (the CPU kernels once skipped rows and returned garbage). The
 * address-space limit lets the output come from the allocator's cache while the
 * kernel's 64 MiB of row scratch cannot be mapped. */
Test(op_registry, a_kernel_without_working_memory_is_an_error)
{
#ifdef __SANITIZE_ADDRESS__
    cr_skip_test("AddressSanitizer maps its own memory under the same limit");
#endif
    int64_t shape[2] = {1, (int64_t)1 << 24};   /* one row of 64 MiB */
    mp_tensor *x = mp_full(MP_F32, MP_CPU, 2, shape, 1.0), *warm = mp_full(MP_F32, MP_CPU, 2, shape, 0.0);
    cr_assert(x && warm, "%s", mp_error());
    mp_release(warm);   /* its block stays cached for the softmax's output */
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    lim = old;
    lim.rlim_cur = mapped_bytes() + ((size_t)16 << 20);
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
    mp_clear_error();
    mp_tensor *y = mp_softmax(x, 2, 0);
    cr_assert_eq(setrlimit(RLIMIT_AS, &old), 0);
    cr_assert_null(y, "the softmax ran without its working memory");
    cr_assert_eq(mp_errcode_last(), MP_EOOM);
    cr_assert(strstr(mp_error(), "softmax kernel"), "%s", mp_error());
    y = mp_softmax(x, 2, 0);   /* with the memory back, it runs */
    cr_assert(y, "%s", mp_error());
    double v;
    cr_assert_eq(mp_read_f64(y, 12345, 1, &v), 0);
    cr_assert_float_eq(v, 1.0 / (1 << 24), 1e-12);
    mp_release(x), mp_release(y);
}

/* an op's needs (engine/op.h) name entries of the table: offsets of function
 * pointers past the name and context, which the CPU backend fills (it runs
 * every op) */
Test(op_registry, needs_name_entries_of_the_table)
{
    const mp_op *op;
    int named = 0;
    for (int i = 0; (op = mp_op_at(i)); i++)
        for (size_t e = 0; e < sizeof op->needs / sizeof op->needs[0] && op->needs[e]; e++, named++) {
            unsigned short off = op->needs[e];
            cr_assert(off >= offsetof(mp_backend, ctx) + sizeof(mp_kctx *) && off < sizeof(mp_backend) &&
                          off % sizeof(void (*)(void)) == 0,
                      "%s needs %u: not an entry of mp_backend", op->name, off);
            cr_assert(mp_backend_has(&mp_cpu_backend, off), "%s needs entry %u, which the CPU lacks", op->name, off);
        }
    cr_assert_geq(named, 8, "conv2d, attention, pooling, batch_norm and topk name their entries");
}
