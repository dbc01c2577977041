/*
 * test_quant.c: a tensor's quantization metadata (engine/tensor.h, mp_quant):
 * the scales live as long as the tensor and its views, their shape is checked
 * against the kind, and an op that does not declare it reads quantized data
 * refuses it by name (mp_apply), before autocast could cast the raw values.
 * Also: an op's arguments read as a struct of the wrong size stop the program.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>
#include "engine/ops.h"
#include "engine/op.h"
#include "engine/memory.h"
#include "engine/autocast.h"
#include "engine/error.h"

static mp_tensor *full(mp_dtype dt, int64_t r, int64_t c, double v)
{
    int64_t shape[2] = {r, c};
    mp_tensor *t = mp_full(dt, MP_CPU, 2, shape, v);
    cr_assert(t, "%s", mp_error());
    return t;
}

Test(quant, scales_live_with_the_tensor_and_its_views)
{
    int64_t before = mp_memory(MP_CPU).allocs;
    mp_tensor *t = full(MP_F16, 4, 256, 1), *s = full(MP_F32, 4, 2, 0.5);
    cr_assert_eq(mp_set_quant(t, MP_QUANT_1X128, s), 0, "%s", mp_error());
    cr_assert_eq(s->refs, 2, "the tensor holds its scales");
    cr_assert_eq(t->quant.block[0], 1);
    cr_assert_eq(t->quant.block[1], 128);
    mp_release(s);
    int64_t half[2] = {2, 256};
    mp_tensor *v = mp_view(t, 2, half, 256);   /* the second half of the rows */
    cr_assert(v, "%s", mp_error());
    cr_assert_eq(v->quant.kind, MP_QUANT_1X128, "a view keeps the metadata");
    cr_assert_eq(v->quant.scales, s);
    cr_assert_eq(s->refs, 2);
    mp_release(t);
    cr_assert_eq(s->refs, 1, "the view alone holds them now");
    mp_release(v);
    cr_assert_eq(mp_memory(MP_CPU).allocs, before, "the scales went with the last view");
}

Test(quant, set_checks_the_scales_and_none_releases_them)
{
    int64_t before = mp_memory(MP_CPU).allocs;
    mp_tensor *t = full(MP_F16, 300, 200, 1);
    mp_tensor *bad = full(MP_F32, 2, 2, 1), *f16 = full(MP_F16, 3, 2, 1), *good = full(MP_F32, 3, 2, 1);
    cr_assert_eq(mp_set_quant(t, MP_QUANT_128X128, bad), -1);
    cr_assert(strstr(mp_error(), "128x128 scales of a {300,200} tensor must be {3,2} (got {2,2})"), "%s", mp_error());
    cr_assert_eq(mp_set_quant(t, MP_QUANT_128X128, f16), -1);
    cr_assert(strstr(mp_error(), "scales must be plain f32"), "%s", mp_error());
    cr_assert_eq(mp_set_quant(t, MP_QUANT_TENSOR, NULL), -1, "a kind with scales needs them");
    cr_assert_eq(mp_set_quant(t, MP_QUANT_128X128, t), -1, "not its own");
    cr_assert_eq(t->quant.kind, MP_QUANT_NONE, "a refused call leaves the tensor plain");
    cr_assert_eq(mp_set_quant(t, MP_QUANT_128X128, good), 0, "%s", mp_error());
    mp_tensor *one = mp_full(MP_F32, MP_CPU, 1, (int64_t[]){1}, 2);
    cr_assert_eq(mp_set_quant(one, MP_QUANT_TENSOR, NULL), -1);
    cr_assert_eq(mp_set_quant(t, MP_QUANT_TENSOR, one), 0, "%s", mp_error());
    cr_assert_eq(good->refs, 1, "the scales before were released");
    cr_assert_eq(mp_set_quant(t, MP_QUANT_NONE, NULL), 0);
    cr_assert_eq(one->refs, 1);
    cr_assert_null(t->quant.scales);
    mp_release(t), mp_release(bad), mp_release(f16), mp_release(good), mp_release(one);
    cr_assert_eq(mp_memory(MP_CPU).allocs, before);
}

Test(quant, mx_scales_are_e8m0_bytes_per_1x32)
{
    int64_t before = mp_memory(MP_CPU).allocs;
    mp_tensor *t = full(MP_F16, 3, 70, 1);   /* ceil(70 / 32) = 3 blocks per row */
    mp_tensor *f32 = full(MP_F32, 3, 3, 1), *short_ = full(MP_U8, 3, 2, 127), *good = full(MP_U8, 3, 3, 127);
    cr_assert_eq(mp_set_quant(t, MP_QUANT_MX, f32), -1);
    cr_assert(strstr(mp_error(), "mx scales must be plain u8"), "%s", mp_error());
    cr_assert_eq(mp_set_quant(t, MP_QUANT_1X128, good), -1, "u8 scales are MX's alone");
    cr_assert(strstr(mp_error(), "1x128 scales must be plain f32"), "%s", mp_error());
    cr_assert_eq(mp_set_quant(t, MP_QUANT_MX, short_), -1);
    cr_assert(strstr(mp_error(), "mx scales of a {3,70} tensor must be {3,3} (got {3,2})"), "%s", mp_error());
    cr_assert_eq(mp_set_quant(t, MP_QUANT_MX, good), 0, "%s", mp_error());
    cr_assert_eq(t->quant.block[0], 1);
    cr_assert_eq(t->quant.block[1], 32);
    cr_assert_str_eq(mp_quant_name(MP_QUANT_MX), "mx");
    mp_release(t), mp_release(f32), mp_release(short_), mp_release(good);
    cr_assert_eq(mp_memory(MP_CPU).allocs, before);
}

Test(quant, ops_that_do_not_read_it_refuse_it_by_name)
{
    mp_tensor *t = full(MP_F32, 2, 128, 3), *s = full(MP_F32, 2, 1, 1), *plain = full(MP_F32, 2, 128, 1);
    cr_assert_eq(mp_set_quant(t, MP_QUANT_1X128, s), 0, "%s", mp_error());
    cr_assert_null(mp_unary(MP_RELU, t, 0));
    cr_assert(strstr(mp_error(), "relu does not take quantized tensors (input 1 is 1x128-quantized f32)"), "%s",
              mp_error());
    cr_assert_null(mp_binary(MP_ADD, plain, t));
    cr_assert(strstr(mp_error(), "add does not take quantized tensors (input 2"), "%s", mp_error());
    cr_assert_null(mp_reshape(t, 1, (int64_t[]){256}));
    cr_assert(strstr(mp_error(), "reshape does not take"), "%s", mp_error());
    /* under autocast the refusal comes first: a cast would read the raw values */
    mp_tensor *w = full(MP_F32, 128, 4, 1);
    int tok = mp_autocast_enter(true, MP_BF16);
    mp_tensor *y = mp_matmul(t, w);
    mp_autocast_exit(tok);
    cr_assert_null(y);
    cr_assert(strstr(mp_error(), "matmul does not take quantized tensors"), "%s", mp_error());
    mp_release(t), mp_release(s), mp_release(plain), mp_release(w);
}

/* an op that reads quantized inputs itself: stored * its one scale */
static mp_tensor *dequant_forward(mp_op_ctx *c)
{
    mp_tensor *x = c->in[0];
    cr_assert_eq(x->quant.kind, MP_QUANT_TENSOR, "the op sees the metadata");
    double scale;
    cr_assert_eq(mp_read_f64(x->quant.scales, 0, 1, &scale), 0);
    mp_tensor *plain = mp_view(x, x->ndim, x->shape, x->offset);
    cr_assert(plain);
    mp_set_quant(plain, MP_QUANT_NONE, NULL);
    mp_tensor *y = mp_unary(MP_MULS, plain, scale);
    mp_release(plain);
    return y;
}

static const mp_op dequant_op = {.name = "test_dequant", .nin = 1, .forward = dequant_forward, .quantized = true};
MP_OP_REGISTER(dequant_op);

Test(quant, an_op_that_declares_it_reads_it)
{
    mp_tensor *t = full(MP_F32, 2, 3, 3), *s = mp_full(MP_F32, MP_CPU, 1, (int64_t[]){1}, 0.5);
    cr_assert_eq(mp_set_quant(t, MP_QUANT_TENSOR, s), 0, "%s", mp_error());
    mp_op_ctx c = {0};
    mp_tensor *y = mp_apply(&dequant_op, &c, 1, &t);
    cr_assert(y, "%s", mp_error());
    cr_assert_eq(y->quant.kind, MP_QUANT_NONE, "its output is plain");
    double v;
    cr_assert_eq(mp_read_f64(y, 0, 1, &v), 0);
    cr_assert_eq(v, 1.5);
    mp_release(t), mp_release(s), mp_release(y);
}

/* arguments read as a struct the description does not declare */
typedef struct { double a, b; } two_doubles;
static mp_tensor *wrong_forward(mp_op_ctx *c)
{
    (void)MP_OP_ARGS(c, two_doubles);
    return mp_retain(c->in[0]);
}
static const mp_op wrong_op = {.name = "test_wrong_args", .nin = 1, .forward = wrong_forward, .args_size = sizeof(int)};
MP_OP_REGISTER(wrong_op);

Test(op_args, a_struct_of_another_size_stops_the_program, .signal = SIGABRT)
{
    mp_tensor *t = full(MP_F32, 1, 1, 1);
    int one = 1;
    mp_op_ctx c = {.args = &one};
    mp_apply(&wrong_op, &c, 1, &t);
}
