/*
 * test_graph.c: the autograd layers without caps: the backward's flush
 * telemetry counts any number of op names (the backends have MP_FLUSH_SLOTS
 * slots; the host folds them into its own table when they run out), the
 * autocast cast cache keeps any number of master weights, autocast's op
 * classes take any number of names, and a backward listener sees the walk in
 * order.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include "engine/ops.h"
#include "engine/op.h"
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/error.h"

/* ---- many op names through one counted backward ---- */

#define NNAMES (MP_FLUSH_SLOTS + 6)

static char names[NNAMES][16];
static mp_op chain_ops[NNAMES];

/* a new tensor with x's values (mp_to_raw would hand back x itself, and the
 * node recorded on it would then hold x, its own input: a cycle never freed) */
static mp_tensor *fresh_copy(mp_tensor *x)
{
    mp_tensor *o = mp_empty(x->dtype, x->dev, x->ndim, x->shape);
    if (o) MP_K(x, copy, mp_data(o), mp_data(x), mp_nbytes(x));
    return o;
}

static mp_tensor *copy_forward(mp_op_ctx *c)
{
    return fresh_copy(c->in[0]);
}

/* the gradient rounded to f16: the CPU backend counts that rounding into the
 * slot of this node's name */
static int round_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    gin[0] = mp_to_raw(g, MP_F16, g->dev);
    return gin[0] ? 0 : -1;
}

Test(graph, flush_telemetry_counts_more_op_names_than_the_device_has_slots)
{
    for (int k = 0; k < NNAMES; k++) {
        snprintf(names[k], sizeof names[k], "t_flush_%02d", k);
        chain_ops[k] = (mp_op){.name = names[k], .nin = 1, .forward = copy_forward, .backward = round_backward};
    }
    int64_t three = 3;
    double xv[3] = {1, 2, 3}, wv[3] = {1, 1e-10, 1e6};   /* in f16: kept, zero, inf */
    mp_tensor *x = mp_from_f64(MP_F32, MP_CPU, 1, &three, xv), *w = mp_from_f64(MP_F32, MP_CPU, 1, &three, wv);
    cr_assert(x && w && mp_set_requires_grad(x, true) == 0);
    mp_tensor *y = mp_retain(x);
    for (int k = 0; k < NNAMES; k++) {
        mp_op_ctx c = {0};
        mp_tensor *z = mp_apply(&chain_ops[k], &c, 1, &y);
        cr_assert(z, "%s", mp_error());
        mp_release(y);
        y = z;
    }
    mp_tensor *p = mp_binary(MP_MUL, y, w), *s = mp_reduce(MP_SUM, p, 0, 0);
    cr_assert(s);
    mp_autograd_count_flush(true);
    mp_autograd_flush_reset();
    cr_assert_eq(mp_backward(s, NULL), 0, "%s", mp_error());
    mp_autograd_count_flush(false);

    bool seen[NNAMES] = {0};
    int64_t c[3];
    const char *name;
    int n = 0;
    for (int i = 0; (name = mp_autograd_flush_entry(i, c)); i++, n++) {
        int k;
        if (sscanf(name, "t_flush_%d", &k) != 1) continue;   /* mul's and sum's */
        cr_assert(k >= 0 && k < NNAMES && !seen[k], "%s twice", name);
        seen[k] = true;
        /* the last op's backward runs first and meets w's gradient: 1e-10 becomes
         * zero and 1e6 inf; the others round three values, none lost */
        int64_t zero = k == NNAMES - 1, inf = k == NNAMES - 1;
        cr_assert(c[0] == 3 && c[1] == zero && c[2] == inf, "%s: %lld %lld %lld", name, (long long)c[0],
                  (long long)c[1], (long long)c[2]);
    }
    for (int k = 0; k < NNAMES; k++) cr_assert(seen[k], "t_flush_%02d was not counted (%d names)", k, n);
    cr_assert_eq(n, NNAMES + 2, "every op name and mul's and sum's");

    /* read again: the folded sums stay, and a reset forgets them */
    cr_assert_str_eq(mp_autograd_flush_entry(0, c), "sum");
    mp_autograd_flush_reset();
    cr_assert_null(mp_autograd_flush_entry(0, c));
    mp_release(x), mp_release(w), mp_release(y), mp_release(p), mp_release(s);
}

/* ---- the cast cache keeps every master weight of a region ---- */

#define NWEIGHTS 1100   /* more than the old fixed cache (1024) */

static mp_tensor *seen_input;

static mp_tensor *see_forward(mp_op_ctx *c)
{
    seen_input = mp_retain(c->in[0]);   /* what autocast handed the op */
    return fresh_copy(c->in[0]);
}

static const mp_op low_op = {.name = "t_low", .ac = MP_AC_LOW, .nin = 1, .forward = see_forward};
MP_OP_REGISTER(low_op);

static mp_tensor *cast_of(mp_tensor *w)
{
    mp_op_ctx c = {0};
    mp_tensor *y = mp_apply(&low_op, &c, 1, &w);
    cr_assert(y, "%s", mp_error());
    mp_release(y);
    mp_tensor *s = seen_input;
    seen_input = NULL;
    return s;
}

Test(graph, the_autocast_cache_keeps_every_master_weight_of_a_region)
{
    static mp_tensor *w[NWEIGHTS], *first[NWEIGHTS];
    int64_t two = 2;
    for (int i = 0; i < NWEIGHTS; i++) {
        w[i] = mp_full(MP_F32, MP_CPU, 1, &two, i);
        cr_assert(w[i] && mp_set_requires_grad(w[i], true) == 0);
    }
    int tok = mp_autocast_enter(true, MP_F16);
    cr_assert_geq(tok, 0);
    for (int i = 0; i < NWEIGHTS; i++) {
        first[i] = cast_of(w[i]);
        cr_assert_eq(first[i]->dtype, MP_F16);
    }
    for (int i = 0; i < NWEIGHTS; i++) {
        mp_tensor *again = cast_of(w[i]);
        cr_assert_eq(again, first[i], "weight %d was cast a second time in the region", i);
        mp_release(again);
    }
    mp_autocast_exit(tok);
    for (int i = 0; i < NWEIGHTS; i++) {
        cr_assert_eq(first[i]->refs, 1, "the region's end let go of weight %d's cast", i);
        mp_release(first[i]), mp_release(w[i]);
    }
}

/* ---- a backward listener ---- */

static int begun, done, ended;
static size_t walked;

static void on_begin(mp_node *const *order, size_t n)
{
    begun++, walked = n;
    for (size_t i = 1; i < n; i++) cr_assert_gt(order[i - 1]->seq, order[i]->seq, "reverse creation order");
}
static int on_node(const mp_node *x) { done++; return 0; }
static int on_end(int rc) { ended++; return rc; }

static mp_backward_listener counter = {.begin = on_begin, .node_done = on_node, .end = on_end};

/* ---- autocast's op classes take any number of names ---- */

Test(graph, autocast_classes_keep_every_registered_name)
{
    /* 300 names: more than the registry's ops and twice what the table once
     * held (128, past which registrations failed) */
    char name[32];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "t_class_%d", i);
        cr_assert_eq(mp_autocast_register(name, i % 2 ? MP_AC_LOW : MP_AC_F32), 0, "%s: %s", name, mp_error());
    }
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "t_class_%d", i);
        cr_assert_eq(mp_autocast_class(name), i % 2 ? MP_AC_LOW : MP_AC_F32, "%s lost its class", name);
    }
    cr_assert_eq(mp_autocast_class("matmul"), MP_AC_LOW, "the ops' own classes stay");
}

Test(graph, a_listener_follows_the_walk)
{
    mp_backward_listen(&counter);
    mp_backward_listen(&counter);   /* once is enough */
    int64_t two = 2;
    mp_tensor *x = mp_full(MP_F32, MP_CPU, 1, &two, 3);
    cr_assert(mp_set_requires_grad(x, true) == 0);
    mp_tensor *y = mp_binary(MP_MUL, x, x), *s = mp_reduce(MP_SUM, y, 0, 0);
    cr_assert_eq(mp_backward(s, NULL), 0, "%s", mp_error());
    cr_assert(begun == 1 && walked == 2 && done == 2 && ended == 1, "%d %zu %d %d", begun, walked, done, ended);
    /* from a leaf there is no walk: only the end */
    mp_tensor *g = mp_full(MP_F32, MP_CPU, 1, &two, 1);
    cr_assert_eq(mp_backward(x, g), 0, "%s", mp_error());
    cr_assert(begun == 1 && done == 2 && ended == 2);
    mp_release(x), mp_release(y), mp_release(s), mp_release(g);
}
