/*
 * ops.h: the engine's tensor operations.
 *
 * Each op validates its arguments (shape, dtype, device, ranges), picks the
 * output dtype, allocates the output and calls the backend through its table.
 * On failure it returns NULL (or -1) with a message in mp_error().
 *
 * Dims follow the Lua face: 1-based, negative counts from the end (-1 is the
 * last). Index *values* (argmax, max's indices) are 0-based class ids, the same
 * numbering as labels and cross-entropy targets, as in PyTorch.
 *
 * The one header of all engine/ops_*.c, the exception to one header per .c
 * file: callers use ops of many kinds at once, and each kind is a file of one
 * to fifteen functions. ops_create.c: creation, the random stream, reading
 * values, promotion, casts and copies; ops_shape.c: dims, reshape, transpose,
 * narrow; ops_dims.c: unsqueeze, squeeze, permute, expand, stack;
 * ops_index.c: index checks, index_select; ops_gather.c: gather, scatter,
 * scatter_add; ops_select.c; ops_math.c:
 * arithmetic, broadcasting, reductions; ops_matmul.c: matmul, linear;
 * ops_nn.c: softmax to where; ops_attention.c; ops_conv.c; ops_pool.c;
 * ops_batch_norm.c; ops_stats.c: var, std, norm, any, all; ops_scan.c: cumsum.
 */
#ifndef MP_OPS_H
#define MP_OPS_H

#include "engine/tensor.h"

/* creation */
mp_tensor *mp_full(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape, double value);
mp_tensor *mp_arange(int64_t n, mp_dtype dt, mp_device dev);
mp_tensor *mp_rand(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape);
mp_tensor *mp_randn(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape);
mp_tensor *mp_from_f64(mp_dtype dt, mp_device dev, int ndim, const int64_t *shape,
                       const double *values);
/* -1 inside a capture: the replays would not seed again (capture_guard.h) */
int mp_manual_seed(uint64_t seed);
/* the random stream's position, for checkpoints. A capture's draws leave it
 * where it was; each replay of the graph advances it (mp_rng_reserve) */
void mp_rng_get(uint64_t *seed, uint64_t *offset);
void mp_rng_set(uint64_t seed, uint64_t offset);
/* mp_rng_set for a user's state (mp.set_rng_state): -1 inside a capture, as
 * mp_manual_seed; the engine's own host draws (a loader's shuffle) use
 * mp_rng_set, which a capture allows */
int mp_rng_restore(uint64_t seed, uint64_t offset);
/* n counters of the stream for one draw on a device: false with the stream's
 * (seed, offset), which then moves on by n; true inside a capture, with offset
 * relative to the capture's start (its own count) and the stream unmoved: each
 * replay draws at the stream's position of its time (kernels/backend.h
 * graph_replay, engine/capture.c) */
bool mp_rng_reserve(uint64_t n, uint64_t *seed, uint64_t *offset);
/* capture.c's: a capture opens (its count from 0), and closes (the counters
 * it reserved, which each replay takes from the stream) */
void mp_rng_capture_begin(void);
uint64_t mp_rng_capture_end(void);

/* reading values back: `count` elements from flat index `start`, as doubles */
int mp_read_f64(const mp_tensor *t, int64_t start, int64_t count, double *out);

/* dtype and device */
mp_dtype mp_promote(mp_dtype a, mp_dtype b);
mp_tensor *mp_to(mp_tensor *t, mp_dtype dt, mp_device dev);   /* new reference; t itself if nothing changes */
/* the same; saturate: a cast into FP8 (e4m3, e5m2) takes values past the
 * largest finite one to it (with their sign) instead of to NaN (e4m3) or inf
 * (e5m2); mp_to is saturate = false, as PyTorch's .to() */
mp_tensor *mp_to_sat(mp_tensor *t, mp_dtype dt, mp_device dev, bool saturate);
/* scaled FP8 (engine/ops_fp8.c). fp8_quantize: x (f32/f16/bf16, k its last
 * dim) as fmt (MP_E4M3 / MP_E5M2) codes carrying their decode scales (t->quant,
 * kind MP_QUANT_TENSOR / _1X128 / _128X128); scale: a given f32 {1}
 * quantization multiplier on x's device (tensor kind; NULL: FP8_MAX / amax per
 * group); *amax: x's amax, a new f32 {1} tensor on x's device; counts (NULL:
 * not wanted; else read back, a wait): values saturated, nonzero values
 * flushed to zero; *counts_dev (counts_dev NULL: not wanted): the same two
 * counts as a new f32 {2} tensor {saturated, flushed} on x's device, no wait
 * (each exact below 2^24, else rounded to the nearest f32). fp8_matmul: a {m, k} b {n, k} quantized -> a b^T {m, n} of
 * dtype out; acc_bits 0: f32 sums (fast: the device's fast accumulation),
 * else the CPU's modelled accumulator with promote_every (0: never), its
 * partial sums rounded as acc_round says (mp_fp8_acc_round: nearest even,
 * or toward zero) */
typedef struct { int64_t saturated, flushed; } mp_fp8_counts;
mp_tensor *mp_fp8_quantize(mp_tensor *x, mp_dtype fmt, mp_quant_kind kind, mp_tensor *scale, mp_tensor **amax,
                           mp_fp8_counts *counts, mp_tensor **counts_dev);
mp_tensor *mp_fp8_matmul(mp_tensor *a, mp_tensor *b, mp_dtype out, int acc_bits, int64_t promote_every,
                         int acc_round, bool fast);
/* q's codes as a plain e4m3/e5m2 tensor over the same storage, without scales */
mp_tensor *mp_fp8_codes(mp_tensor *q);
/* t (a parameter in an optimizer's arena) as f16/bf16 from the arena's working
 * copy; any other tensor as mp_to */
mp_tensor *mp_arena_cast(mp_tensor *t, mp_dtype dt);
/* a cast node's gradient added into an f32 leaf's .grad in one pass (engine/
 * ops_create.c; engine/backward.c calls it): 0 done, 1 not such a node */
struct mp_node;
int mp_cast_backward_into(struct mp_node *n, mp_tensor *leaf);
/* leaf's .grad when n is a cast of the f32 leaf into f16/bf16 whose gradient
 * mp_cast_backward_into would add there (before that gradient exists), else NULL */
mp_tensor *mp_cast_grad_target(const struct mp_node *n, const mp_tensor *leaf);
/* a narrow's gradient added in place into acc, its input's sum so far
 * (engine/ops_shape.c); 1 declined, 0 done */
int mp_narrow_backward_into(struct mp_node *n, mp_tensor *acc);
mp_tensor *mp_to_raw(mp_tensor *t, mp_dtype dt, mp_device dev); /* the same, never recorded by autograd */
mp_tensor *mp_clone(mp_tensor *t);
/* copy src's values (cast to dst's dtype, from any device) into dst, in place */
int mp_copy_(mp_tensor *dst, mp_tensor *src);

/* shape: reshape/view and narrow along dim 1 share storage */
int mp_dim(const mp_tensor *t, int d, int *out);              /* user dim -> 0-based */
mp_tensor *mp_reshape(mp_tensor *t, int ndim, const int64_t *shape);  /* one -1 allowed */
mp_tensor *mp_transpose(mp_tensor *t, int d1, int d2);
mp_tensor *mp_narrow(mp_tensor *t, int d, int64_t start, int64_t len);  /* start 1-based */

/* every value of the i32 tensor idx lies in [0, n); the error names `what` */
/* what: a string literal (an asynchronous backend may report it after the op) */
int mp_check_indices(const mp_tensor *idx, int64_t n, const char *what);
/* ops_select.c: t's slice at index (1-based, negative from the end) along dim,
 * that dim dropped; the lower (tril) or upper (triu) triangle of the last two
 * dims from diagonal k (0 the main one, k > 0 above it), zeros elsewhere;
 * value where mask (u8/i32, broadcast to t) is nonzero; uniform integers in
 * [lo, hi) (hi - lo <= 2^24) */
mp_tensor *mp_select(mp_tensor *t, int dim, int64_t index);
mp_tensor *mp_tril(mp_tensor *t, int64_t k);
mp_tensor *mp_triu(mp_tensor *t, int64_t k);
mp_tensor *mp_masked_fill(mp_tensor *t, mp_tensor *mask, double value);
mp_tensor *mp_randint(int64_t lo, int64_t hi, mp_dtype dt, mp_device dev, int ndim, const int64_t *shape);
/* the k largest (or smallest) values along dim, in order, and in *indices their
 * 0-based positions (i32); sort: all of them; ties keep index order, NaN ranks
 * above every number. The values are differentiable. */
mp_tensor *mp_topk(mp_tensor *x, int64_t k, int dim, bool largest, mp_tensor **indices);
mp_tensor *mp_sort(mp_tensor *x, int dim, bool descending, mp_tensor **indices);
/* n draws (0-based i32 categories) from each row of probs (1-d or 2-d, any
 * nonnegative weights), with or without replacement, from the random stream */
mp_tensor *mp_multinomial(mp_tensor *probs, int64_t n, bool replacement);

/* t's entries at 0-based i32 indices idx (1-d) along dim */
mp_tensor *mp_index_select(mp_tensor *t, int dim, mp_tensor *idx);

/* arithmetic */
mp_tensor *mp_binary(mp_binop op, mp_tensor *a, mp_tensor *b);
/* a OP s, or s OP a when scalar_first */
mp_tensor *mp_binary_scalar(mp_binop op, mp_tensor *a, double s, int scalar_first);
mp_tensor *mp_unary(mp_unop op, mp_tensor *a, double p);
/* g * gelu'(x) as the recording op gelu_backward (form: 0 erf, 1 tanh), for
 * gradients that are differentiated again */
mp_tensor *mp_gelu_backward(mp_tensor *g, mp_tensor *x, double form);
int mp_broadcast(const mp_tensor *a, const mp_tensor *b, mp_bcast *bc);

/* reductions; dim 0 means all dims (a scalar result) */
mp_tensor *mp_reduce(mp_redop op, mp_tensor *a, int dim, int keepdim);

/* ops_stats.c: statistics of x over dim (0: all dims), composed of the ops
 * above; f16/bf16 computed in f32 and rounded once. var divides by the count
 * minus correction (1: PyTorch's unbiased default); std is its square root;
 * norm takes p > 0, inf or -inf (x / ||x|| has gradient 0 at 0 for p = 2).
 * any and all: u8, whether any / every element is nonzero (NaN counts). */
mp_tensor *mp_var(mp_tensor *x, int dim, double correction, bool keepdim);
mp_tensor *mp_std(mp_tensor *x, int dim, double correction, bool keepdim);
mp_tensor *mp_norm(mp_tensor *x, double p, int dim, bool keepdim);
mp_tensor *mp_any(mp_tensor *x, int dim, bool keepdim);
mp_tensor *mp_all(mp_tensor *x, int dim, bool keepdim);
/* ops_scan.c: the inclusive prefix sum along dim (integers give f32, as sum) */
mp_tensor *mp_cumsum(mp_tensor *x, int dim);

/* matmul: {m,k}@{k,n}, batched {b,m,k}@{b,k,n}, {b,m,k}@{k,n}, 1-D as in numpy */
mp_tensor *mp_matmul(mp_tensor *a, mp_tensor *b);

typedef enum { MP_REDUCE_MEAN, MP_REDUCE_SUM, MP_REDUCE_NONE } mp_reduction;

/* neural-network ops (ops_nn.c), all differentiable */
mp_tensor *mp_softmax(mp_tensor *x, int dim, int log);
mp_tensor *mp_cross_entropy(mp_tensor *logits, mp_tensor *target, mp_reduction red);
mp_tensor *mp_mse_loss(mp_tensor *a, mp_tensor *b);
mp_tensor *mp_layer_norm(mp_tensor *x, mp_tensor *w, mp_tensor *b, double eps);   /* w, b may be NULL */
#define MP_LAYER_NORM_EPS 1e-5   /* PyTorch's default eps, the one default of mp.layer_norm and nn.LayerNorm */
mp_tensor *mp_rms_norm(mp_tensor *x, mp_tensor *w, double eps);   /* x / sqrt(mean(x^2) + eps) * w; w may be NULL */
/* PyTorch's eps None: the epsilon of x's dtype; rms_norm computes in f32 (autocast
 * class f32), so f32's: the one default of mp.rms_norm and nn.RMSNorm */
#define MP_RMS_NORM_EPS 1.1920928955078125e-07
mp_tensor *mp_embedding(mp_tensor *idx, mp_tensor *w);
mp_tensor *mp_dropout(mp_tensor *x, double p, bool training);
mp_tensor *mp_cat(int n, mp_tensor *const *ts, int dim);
mp_tensor *mp_where(mp_tensor *cond, mp_tensor *a, mp_tensor *b);

/* softmax(q k^T * scale [causal]) v over the last two dims, dropout p on the
 * probabilities; scale NULL: 1/sqrt(d); a scale given must be finite, NaN included (ops_attention.c) */
/* convolution and pooling over NCHW (ops_conv.c, ops_pool.c); pairs are {rows, columns} */
mp_tensor *mp_conv2d(mp_tensor *x, mp_tensor *w, mp_tensor *b, const int64_t stride[2], const int64_t padding[2],
                     const int64_t dilation[2], int64_t groups);                        /* b may be NULL */
mp_tensor *mp_max_pool2d(mp_tensor *x, const int64_t k[2], const int64_t stride[2], const int64_t padding[2]);
mp_tensor *mp_avg_pool2d(mp_tensor *x, const int64_t k[2], const int64_t stride[2], const int64_t padding[2]);
mp_tensor *mp_adaptive_avg_pool2d(mp_tensor *x, const int64_t out[2]);
/* batch norm over dim 2 (ops_batch_norm.c): running buffers f32, updated in place
 * when training (may then be NULL); w, b may be NULL */
mp_tensor *mp_batch_norm(mp_tensor *x, mp_tensor *running_mean, mp_tensor *running_var, mp_tensor *w, mp_tensor *b,
                         bool training, double momentum, double eps);
/* relu(batch_norm(x) + z) (z may be NULL; relu false: no ReLU) as one op where
 * the backend fuses them (ops_batch_norm.c): the values of the three ops */
mp_tensor *mp_batch_norm_act(mp_tensor *x, mp_tensor *running_mean, mp_tensor *running_var, mp_tensor *w, mp_tensor *b,
                             mp_tensor *z, bool relu, bool training, double momentum, double eps);
#define MP_BATCH_NORM_MOMENTUM 0.1   /* PyTorch's defaults, the one default of mp.batch_norm and nn.BatchNorm2d */
#define MP_BATCH_NORM_EPS 1e-5
mp_tensor *mp_attention(mp_tensor *q, mp_tensor *k, mp_tensor *v, bool causal, const double *scale, double dropout);
/* the fused recurrent cells (ops_rnn.c): lstm_cell's gates {b, 4h} (i, f, g, o) and
 * c_prev {b, h} give {2, b, h} = {h, c}; gru_cell's gi, gh {b, 3h} (r, z, n) and
 * h_prev {b, h} give h {b, h} */
mp_tensor *mp_lstm_cell(mp_tensor *gates, mp_tensor *c_prev);
mp_tensor *mp_gru_cell(mp_tensor *gi, mp_tensor *gh, mp_tensor *h_prev);

/* x{.., in} @ w{out, in}^T + b{out}; b may be NULL */
mp_tensor *mp_linear(mp_tensor *x, mp_tensor *w, mp_tensor *b);
/* gelu(x @ w^T + b) as one op (ops_matmul.c: the values of mp_linear then
 * mp_unary(MP_GELU), the GELU in the GEMM's epilogue where the backend has
 * one); tanh_form: GELU's tanh approximation, else the erf form; b may be NULL */
mp_tensor *mp_linear_gelu(mp_tensor *x, mp_tensor *w, mp_tensor *b, bool tanh_form);

/* ops_dims.c: a size-1 dim inserted at dim (1..ndim+1, negative from the end:
 * -1 after the last), size-1 dims dropped (dim 0: all of them; a dim of
 * another size stays), both views as reshape; dims reordered (dims[d], 1-based
 * or negative, is the input dim of output dim d: a copy); sizes as PyTorch's
 * expand (new leading dims, -1 keeps one, size-1 dims repeat: a copy); n
 * tensors of one shape stacked along a new dim (placed as unsqueeze's) */
mp_tensor *mp_unsqueeze(mp_tensor *t, int dim);
mp_tensor *mp_squeeze(mp_tensor *t, int dim);
mp_tensor *mp_permute(mp_tensor *t, int n, const int *dims);
mp_tensor *mp_expand_sizes(mp_tensor *t, int ndim, const int64_t *sizes);
mp_tensor *mp_stack(int n, mp_tensor *const *ts, int dim);

/* ops_gather.c: PyTorch's gather, scatter and scatter_add along dim (out of
 * place): idx (i32, 0-based values) has x's number of dims and no larger size
 * than x's but along dim (scatter: nor than src's in any dim); the gather has
 * idx's shape; the scatters are x with src's values (its corner of idx's
 * shape) set or added at the indexed places; scatter_value sets a number */
mp_tensor *mp_gather(mp_tensor *x, int dim, mp_tensor *idx);
mp_tensor *mp_scatter(mp_tensor *x, int dim, mp_tensor *idx, mp_tensor *src, bool add);
mp_tensor *mp_scatter_value(mp_tensor *x, int dim, mp_tensor *idx, double value);
/* x limited to [*lo, *hi] (ops_clamp.c); either bound may be NULL, not both;
 * NaN passes through, the gradient is 1 where lo <= x <= hi, else 0 */
mp_tensor *mp_clamp(mp_tensor *x, const double *lo, const double *hi);

/* In-place ops (ops_inplace.c): self = self op other, written into self's
 * storage, whose version they bump (engine/graph.h checks saved tensors
 * against it). The result must keep self's shape (other broadcasts into it)
 * and fit self's dtype (no float result into an integer tensor). In grad mode
 * a leaf that requires grad is refused, as is a storage that a view recorded
 * for autograd shares; a tensor with history, or one combined with a tensor
 * that requires grad, takes the op's node as its grad_fn (rebased, as in
 * PyTorch). 0, or -1 with an error. */
int mp_binary_(mp_binop op, mp_tensor *self, mp_tensor *other);
int mp_binary_scalar_(mp_binop op, mp_tensor *self, double s);
int mp_unary_(mp_unop op, mp_tensor *self, double p);
int mp_clamp_(mp_tensor *self, const double *lo, const double *hi);
int mp_fill_(mp_tensor *self, double v);   /* fill_ and zero_: the gradient to self's history is zero */

/* for backward functions (ops_math.c): g summed down to shape (broadcasting
 * undone), and g broadcast up to shape (a copy) */
mp_tensor *mp_sum_to(mp_tensor *g, int ndim, const int64_t *shape);
mp_tensor *mp_expand(mp_tensor *g, int ndim, const int64_t *shape);

#endif
