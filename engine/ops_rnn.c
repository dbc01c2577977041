/*
 * ops_rnn.c: the fused recurrent cells, one op each with its own backward
 * (kernels/backend.h: lstm_cell, gru_cell). The projections are GEMMs the
 * caller runs before (mp.nn.LSTM: one over the whole sequence for the input,
 * one per step for the hidden state); the cell does the rest of a step in one
 * kernel, and its backward in one more. An op has one output, so the LSTM cell
 * returns its h and c stacked as {2, b, h} (the binding selects them).
 *
 * Autocast: low precision, as PyTorch's autocast lists lstm_cell and gru_cell
 * (and cuDNN's RNN) with the GEMMs: the cell takes what the low-precision
 * projections give, computes in f32 inside and rounds its state once.
 *
 * Saved: the cell's inputs only (the pre-activations and the previous state);
 * the backward kernel recomputes the activations from them, the same values
 * as the forward's.
 */
#include "engine/ops.h"
#include "engine/error.h"
#include "engine/op.h"

/* every input a float tensor of one dtype and device, each {b, k_i * h} */
static int check_cell(mp_op_ctx *c, const char *const *names, const int *mult, int64_t *b_out, int64_t *h_out)
{
    mp_tensor *const *in = c->in;
    char b1[128], b2[128];
    for (int i = 0; i < c->nin; i++) {
        if (!mp_is_float(in[i]->dtype))
            return mp_fail(MP_EINVAL, "%s must be a float tensor (got %s)", names[i], mp_dtype_name(in[i]->dtype));
        if (in[i]->dtype != in[0]->dtype || in[i]->dev != in[0]->dev)
            return mp_fail(MP_EINVAL, "%s is %s on %s, %s %s on %s", names[i], mp_dtype_name(in[i]->dtype),
                           mp_device_name(in[i]->dev), names[0], mp_dtype_name(in[0]->dtype),
                           mp_device_name(in[0]->dev));
        if (in[i]->ndim != 2)
            return mp_fail(MP_EINVAL, "%s must be 2-d {batch, %s} (got %s)", names[i], mult[i] == 1 ? "hidden" :
                           mult[i] == 3 ? "3 * hidden" : "4 * hidden",
                           mp_shape_str(in[i]->ndim, in[i]->shape, b1, sizeof b1));
    }
    /* the state's width is the hidden size; the gates must be mult times it */
    int s = c->nin - 1;
    int64_t b = in[s]->shape[0], h = in[s]->shape[1];
    for (int i = 0; i < s; i++)
        if (in[i]->shape[0] != b || in[i]->shape[1] != mult[i] * h)
            return mp_fail(MP_EINVAL, "%s %s does not match %s %s (expected {%lld, %lld})", names[i],
                           mp_shape_str(in[i]->ndim, in[i]->shape, b1, sizeof b1), names[s],
                           mp_shape_str(in[s]->ndim, in[s]->shape, b2, sizeof b2), (long long)b,
                           (long long)(mult[i] * h));
    *b_out = b, *h_out = h;
    return 0;
}

/* ---- LSTM: gates {b, 4h}, c_prev {b, h} -> {2, b, h} = {h, c} ---- */

static int lstm_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *gates = n->saved[0], *cp = n->saved[1];
    int64_t b = cp->shape[0], h = cp->shape[1];
    mp_tensor *gc = mp_to_raw(g, gates->dtype, gates->dev);
    mp_tensor *dg = gc ? mp_empty(gates->dtype, gates->dev, 2, gates->shape) : NULL;
    mp_tensor *dc = dg ? mp_empty(cp->dtype, cp->dev, 2, cp->shape) : NULL;
    int rc = -1;
    if (dc) {
        MP_K(gates, lstm_cell_grad, gates->dtype, mp_data(dg), mp_data(dc), mp_data(gc), mp_data(gates), mp_data(cp),
             b, h);
        gin[0] = mp_retain(dg), gin[1] = mp_retain(dc), rc = 0;
    }
    mp_release(gc), mp_release(dg), mp_release(dc);
    return rc;
}

static mp_tensor *lstm_fwd(mp_op_ctx *c)
{
    static const char *const names[] = {"gates", "c_prev"};
    static const int mult[] = {4, 1};
    int64_t b, h;
    if (check_cell(c, names, mult, &b, &h)) return NULL;
    mp_tensor *gates = c->in[0], *cp = c->in[1];
    int64_t shape[3] = {2, b, h};
    mp_tensor *hc = mp_empty(gates->dtype, gates->dev, 3, shape);
    if (!hc) return NULL;
    MP_K(gates, lstm_cell, gates->dtype, mp_data(hc), mp_data(gates), mp_data(cp), b, h);
    if (mp_keep(c, 0, gates) || mp_keep(c, 1, cp)) mp_release(hc), hc = NULL;
    return hc;
}

static const mp_op lstm_cell_op = {.name = "lstm_cell", .ac = MP_AC_LOW, .nin = 2, .forward = lstm_fwd,
                                   .backward = lstm_backward,
                                   .needs = {MP_BE_ENTRY(lstm_cell), MP_BE_ENTRY(lstm_cell_grad)}};
MP_OP_REGISTER(lstm_cell_op);

mp_tensor *mp_lstm_cell(mp_tensor *gates, mp_tensor *c_prev)
{
    mp_op_ctx c = {0};
    mp_tensor *in[2] = {gates, c_prev};
    return mp_apply(&lstm_cell_op, &c, 2, in);
}

/* ---- GRU: gi, gh {b, 3h}, h_prev {b, h} -> h {b, h} ---- */

static int gru_backward(mp_node *n, mp_tensor *g, mp_tensor **gin)
{
    mp_tensor *gi = n->saved[0], *gh = n->saved[1], *hp = n->saved[2];
    int64_t b = hp->shape[0], h = hp->shape[1];
    mp_tensor *gc = mp_to_raw(g, hp->dtype, hp->dev);
    mp_tensor *dgi = gc ? mp_empty(gi->dtype, gi->dev, 2, gi->shape) : NULL;
    mp_tensor *dgh = dgi ? mp_empty(gh->dtype, gh->dev, 2, gh->shape) : NULL;
    mp_tensor *dhp = dgh ? mp_empty(hp->dtype, hp->dev, 2, hp->shape) : NULL;
    int rc = -1;
    if (dhp) {
        MP_K(hp, gru_cell_grad, hp->dtype, mp_data(dgi), mp_data(dgh), mp_data(dhp), mp_data(gc), mp_data(gi),
             mp_data(gh), mp_data(hp), b, h);
        gin[0] = mp_retain(dgi), gin[1] = mp_retain(dgh), gin[2] = mp_retain(dhp), rc = 0;
    }
    mp_release(gc), mp_release(dgi), mp_release(dgh), mp_release(dhp);
    return rc;
}

static mp_tensor *gru_fwd(mp_op_ctx *c)
{
    static const char *const names[] = {"gi", "gh", "h_prev"};
    static const int mult[] = {3, 3, 1};
    int64_t b, h;
    if (check_cell(c, names, mult, &b, &h)) return NULL;
    mp_tensor *gi = c->in[0], *gh = c->in[1], *hp = c->in[2];
    mp_tensor *hy = mp_empty(hp->dtype, hp->dev, 2, hp->shape);
    if (!hy) return NULL;
    MP_K(hp, gru_cell, hp->dtype, mp_data(hy), mp_data(gi), mp_data(gh), mp_data(hp), b, h);
    if (mp_keep(c, 0, gi) || mp_keep(c, 1, gh) || mp_keep(c, 2, hp)) mp_release(hy), hy = NULL;
    return hy;
}

static const mp_op gru_cell_op = {.name = "gru_cell", .ac = MP_AC_LOW, .nin = 3, .forward = gru_fwd,
                                  .backward = gru_backward,
                                  .needs = {MP_BE_ENTRY(gru_cell), MP_BE_ENTRY(gru_cell_grad)}};
MP_OP_REGISTER(gru_cell_op);

mp_tensor *mp_gru_cell(mp_tensor *gi, mp_tensor *gh, mp_tensor *h_prev)
{
    mp_op_ctx c = {0};
    mp_tensor *in[3] = {gi, gh, h_prev};
    return mp_apply(&gru_cell_op, &c, 3, in);
}
