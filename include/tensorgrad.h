/* tensorgrad: train neural networks inside ordinary C programs.
 *
 * A model is a tree of named parameters (tg_model). A forward function, written with the ops
 * below, is traced once into a static-shape graph; tg_compile derives gradients by reverse-mode
 * autograd, appends the optimizer update to the same graph, plans buffers and hands the graph to
 * a backend. tg_step then runs one whole training step and returns the loss as a value.
 *
 *   tg_model *m = tg_model_new(42);
 *   tg_linear l1 = tg_linear_new(m, "l1", 64, 128, NULL), l2 = tg_linear_new(m, "l2", 128, 10, NULL);
 *   static tg_tensor loss(const void *ctx, const tg_tensor *in) {
 *       return tg_cross_entropy(tg_linear(&l2, tg_relu(tg_linear(&l1, in[0]))), in[1], TG_MEAN);
 *   }
 *   tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss,
 *       .inputs = (tg_input_decl[]){ TG_F32("x", 64, 64), TG_I32("y", 64) }, .n_inputs = 2,
 *       .optimizer = tg_adamw(1e-3, 0.01) }, &err);
 *   tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xs, 64*64), tg_i32("y", ys, 64) }, 2);
 *
 * Errors never abort the caller. Op calls made with bad shapes record "file.c:LINE: tg_op: ..."
 * in the graph being traced; tg_compile then fails with that message. Run-time failures come
 * back in tg_result.status / tg_result.error.
 *
 * Thread model: one trace at a time per thread (tracing state is thread-local); calls on handles
 * from several threads serialize (see "Threads" below).
 */
#ifndef TENSORGRAD_H
#define TENSORGRAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version this header describes; tg_version() gives the library's, and the shared library's
 * soname is libtensorgrad.so.TG_VERSION_MAJOR. */
#define TG_VERSION_MAJOR 0
#define TG_VERSION_MINOR 2
#define TG_VERSION_PATCH 0
#define TG_VERSION_STRING "0.2.0"

/* Marks the public functions: the library is built with -fvisibility=hidden, so these are the
 * only symbols its shared object exports. */
#if defined(_WIN32)
#define TG_API
#elif defined(__GNUC__)
#define TG_API __attribute__((visibility("default")))
#else
#define TG_API
#endif

#define TG_MAX_DIMS 6
#define TG_ERROR_LEN 512

/* ---------------------------------------------------------------------------------------------
 * Basic values
 * ------------------------------------------------------------------------------------------- */

typedef enum { TG_FLOAT32 = 0, TG_INT32 = 1 } tg_dtype;

/* A shape by value. TG_SHAPE(2, 3) builds {2, {2, 3}}; TG_SHAPE0 is a scalar (ndim 0). */
typedef struct { int ndim; int64_t d[TG_MAX_DIMS]; } tg_shape;
#define TG_SHAPE(...) ((tg_shape){ (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), { __VA_ARGS__ } })
#define TG_SHAPE0 ((tg_shape){ 0, { 0 } })

/* Where an op was called from; op macros fill it in so errors name the caller's line. */
typedef struct { const char *file; int line; } tg_site;
#define TG_HERE ((tg_site){ __FILE__, __LINE__ })

/* A caller-owned error buffer. Functions that can fail take a tg_error * (may be NULL). */
typedef struct { char msg[TG_ERROR_LEN]; } tg_error;

typedef enum { TG_OK = 0, TG_FAILED = 1, TG_ABORTED = 2 } tg_status;

/* ---------------------------------------------------------------------------------------------
 * Models: a tree of named parameters with init specs. Values live in the compiled handles, so
 * several graphs can share them; the model itself is a description and is never mutated by
 * compiling.
 * ------------------------------------------------------------------------------------------- */

typedef struct tg_model tg_model;
typedef struct { tg_model *model; int id; } tg_param;  /* id < 0: invalid (an error was recorded) */

typedef enum { TG_INIT_RANDN, TG_INIT_KAIMING, TG_INIT_ZEROS, TG_INIT_ONES, TG_INIT_LITERAL } tg_init_kind;

/* How a parameter starts. randn: N(0, std^2), std default 0.02. kaiming: N(0, (gain/sqrt(fan_in))^2)
 * with fan_in = shape[0] and gain default sqrt(2). literal: copies n values, which must equal the
 * parameter's element count. decay: whether AdamW decays it; -1 picks the default (yes for
 * randn/kaiming/literal, no for zeros/ones). */
typedef struct {
    tg_init_kind kind;
    double scale;          /* std (randn) or gain (kaiming); 0 = default */
    const float *data;     /* literal values, copied at tg_param_new */
    size_t n;
    int decay;             /* -1 default, 0 no, 1 yes */
} tg_init;

TG_API tg_init tg_init_randn(double std);
TG_API tg_init tg_init_kaiming(double gain);
TG_API tg_init tg_init_zeros(void);
TG_API tg_init tg_init_ones(void);
TG_API tg_init tg_init_literal(const float *data, size_t n);
TG_API tg_init tg_init_decay(tg_init init, int decay);   /* the same init with an explicit decay flag */

TG_API tg_model *tg_model_new(uint64_t seed);   /* NULL only when out of memory */
TG_API void tg_model_free(tg_model *m);
TG_API uint64_t tg_model_seed(const tg_model *m);
/* The first error recorded while declaring parameters (duplicate name, bad shape), or NULL. */
TG_API const char *tg_model_error(const tg_model *m);

/* Names: tg_model_push(m, "layers.%d", i) opens a scope; parameter names are the scopes joined
 * by '.' and then the local name, e.g. "layers.0.attn.q.W". */
TG_API void tg_model_push(tg_model *m, const char *fmt, ...);
TG_API void tg_model_pop(tg_model *m);
TG_API tg_param tg_param_new(tg_model *m, const char *name, tg_shape shape, tg_init init);

TG_API int tg_model_n_params(const tg_model *m);
/* Elements of a shape (1 for a scalar). */
TG_API int64_t tg_numel(tg_shape s);
TG_API const char *tg_model_param_name(const tg_model *m, int i);
TG_API tg_shape tg_model_param_shape(const tg_model *m, int i);

/* ---------------------------------------------------------------------------------------------
 * Tensors and ops. A tg_tensor is a cheap handle to a node of the graph being traced. Every op is
 * a macro that passes the caller's file:line; the _at function is the same op with an explicit
 * site. Ops on an invalid tensor return an invalid tensor (only the first error is kept).
 * ------------------------------------------------------------------------------------------- */

typedef struct tg_graph tg_graph;
typedef struct { tg_graph *g; int id; } tg_tensor;

/* A parameter as a tensor of the graph being traced (only valid inside a forward function). */
TG_API tg_tensor tg_p_at(tg_site s, tg_param p);
#define tg_p(p) tg_p_at(TG_HERE, p)

/* Scalars: tg_scalar(2.5) is a constant of shape []; it takes the dtype of the tensor it meets. */
TG_API tg_tensor tg_scalar_at(tg_site s, double v);
#define tg_scalar(v) tg_scalar_at(TG_HERE, v)
/* Binary ops accept a tensor or a plain number on either side: tg_sub(1.0, x), tg_mul(x, 2). */
static inline tg_tensor tg__as_tensor(tg_tensor t) { return t; }
TG_API tg_tensor tg__number(double v);
#define TG_T(x) _Generic((x), tg_tensor: tg__as_tensor, default: tg__number)(x)

/* Elementwise binary, NumPy broadcasting. less/greater return f32 0/1. */
TG_API tg_tensor tg_add_at(tg_site s, tg_tensor a, tg_tensor b);
TG_API tg_tensor tg_sub_at(tg_site s, tg_tensor a, tg_tensor b);
TG_API tg_tensor tg_mul_at(tg_site s, tg_tensor a, tg_tensor b);
TG_API tg_tensor tg_div_at(tg_site s, tg_tensor a, tg_tensor b);
/* minimum/maximum: on ties the gradient is split half and half, as torch.minimum/maximum. */
TG_API tg_tensor tg_minimum_at(tg_site s, tg_tensor a, tg_tensor b);
TG_API tg_tensor tg_maximum_at(tg_site s, tg_tensor a, tg_tensor b);
TG_API tg_tensor tg_less_at(tg_site s, tg_tensor a, tg_tensor b);
TG_API tg_tensor tg_greater_at(tg_site s, tg_tensor a, tg_tensor b);
/* where(cond, a, b): cond != 0 selects a. All three broadcast. No gradient to cond. */
TG_API tg_tensor tg_where_at(tg_site s, tg_tensor cond, tg_tensor a, tg_tensor b);
#define tg_add(a, b) tg_add_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_sub(a, b) tg_sub_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_mul(a, b) tg_mul_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_div(a, b) tg_div_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_minimum(a, b) tg_minimum_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_maximum(a, b) tg_maximum_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_less(a, b) tg_less_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_greater(a, b) tg_greater_at(TG_HERE, TG_T(a), TG_T(b))
#define tg_where(c, a, b) tg_where_at(TG_HERE, TG_T(c), TG_T(a), TG_T(b))

/* Elementwise unary. */
TG_API tg_tensor tg_neg_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_abs_at(tg_site s, tg_tensor x);       /* gradient sign(x), 0 at 0 (as PyTorch) */
TG_API tg_tensor tg_square_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_sqrt_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_rsqrt_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_exp_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_log_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_relu_at(tg_site s, tg_tensor x);      /* gradient 0 at 0 (as PyTorch) */
TG_API tg_tensor tg_tanh_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_sigmoid_at(tg_site s, tg_tensor x);
#define tg_neg(x) tg_neg_at(TG_HERE, x)
#define tg_abs(x) tg_abs_at(TG_HERE, x)
#define tg_square(x) tg_square_at(TG_HERE, x)
#define tg_sqrt(x) tg_sqrt_at(TG_HERE, x)
#define tg_rsqrt(x) tg_rsqrt_at(TG_HERE, x)
#define tg_exp(x) tg_exp_at(TG_HERE, x)
#define tg_log(x) tg_log_at(TG_HERE, x)
#define tg_relu(x) tg_relu_at(TG_HERE, x)
#define tg_tanh(x) tg_tanh_at(TG_HERE, x)
#define tg_sigmoid(x) tg_sigmoid_at(TG_HERE, x)

/* Reductions over one axis (negative counts from the end) or, with TG_ALL, over every axis. */
#define TG_ALL INT32_MIN
TG_API tg_tensor tg_sum_at(tg_site s, tg_tensor x, int axis, int keepdims);
TG_API tg_tensor tg_mean_at(tg_site s, tg_tensor x, int axis, int keepdims);
#define tg_sum(x, axis, keepdims) tg_sum_at(TG_HERE, x, axis, keepdims)
#define tg_mean(x, axis, keepdims) tg_mean_at(TG_HERE, x, axis, keepdims)

/* Shape ops. reshape: one dimension may be -1. permute: a full reorder of the axes. */
TG_API tg_tensor tg_reshape_at(tg_site s, tg_tensor x, tg_shape shape);
TG_API tg_tensor tg_permute_at(tg_site s, tg_tensor x, tg_shape order);
TG_API tg_tensor tg_swapaxes_at(tg_site s, tg_tensor x, int a, int b);
#define tg_reshape(x, ...) tg_reshape_at(TG_HERE, x, TG_SHAPE(__VA_ARGS__))
#define tg_permute(x, ...) tg_permute_at(TG_HERE, x, TG_SHAPE(__VA_ARGS__))
#define tg_swapaxes(x, a, b) tg_swapaxes_at(TG_HERE, x, a, b)

/* Matrix product: [..., M, K] x [K, N] or [..., M, K] x [..., K, N] (batch dims broadcast). */
TG_API tg_tensor tg_matmul_at(tg_site s, tg_tensor a, tg_tensor b);
#define tg_matmul(a, b) tg_matmul_at(TG_HERE, a, b)

/* Indexing. one_hot: i32 [...] -> f32 [..., n]; out-of-range indices give a zero row.
 * embedding: table [V, D], i32 indices [...] -> [..., D]; an out-of-range index gives zeros. */
TG_API tg_tensor tg_one_hot_at(tg_site s, tg_tensor idx, int64_t n);
TG_API tg_tensor tg_embedding_at(tg_site s, tg_tensor table, tg_tensor idx);
#define tg_one_hot(idx, n) tg_one_hot_at(TG_HERE, idx, n)
#define tg_embedding(table, idx) tg_embedding_at(TG_HERE, table, idx)

/* Softmax family over one axis, computed stably (max subtracted). */
TG_API tg_tensor tg_softmax_at(tg_site s, tg_tensor x, int axis);
TG_API tg_tensor tg_log_softmax_at(tg_site s, tg_tensor x, int axis);
#define tg_softmax(x, axis) tg_softmax_at(TG_HERE, x, axis)
#define tg_log_softmax(x, axis) tg_log_softmax_at(TG_HERE, x, axis)

/* Losses. logits / log-probs [..., C] with i32 targets [...] in 0..C-1 (as PyTorch with the class
 * axis last). TG_NONE keeps the per-element losses (shape of targets). */
typedef enum { TG_MEAN = 0, TG_SUM = 1, TG_NONE = 2 } tg_reduction;
TG_API tg_tensor tg_cross_entropy_at(tg_site s, tg_tensor logits, tg_tensor targets, tg_reduction r);
TG_API tg_tensor tg_nll_loss_at(tg_site s, tg_tensor logp, tg_tensor targets, tg_reduction r);
#define tg_cross_entropy(logits, targets, r) tg_cross_entropy_at(TG_HERE, logits, targets, r)
#define tg_nll_loss(logp, targets, r) tg_nll_loss_at(TG_HERE, logp, targets, r)

/* More elementwise. gelu: the exact erf form, PyTorch's default; gelu_tanh: the tanh
 * approximation (F.gelu(x, approximate="tanh")). silu: x * sigmoid(x). clamp: min(max(x, lo), hi)
 * as torch.clamp (gradient passes where lo <= x <= hi; lo > hi gives hi everywhere). */
TG_API tg_tensor tg_sin_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_cos_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_gelu_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_gelu_tanh_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_silu_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_clamp_at(tg_site s, tg_tensor x, double lo, double hi);
#define tg_sin(x) tg_sin_at(TG_HERE, x)
#define tg_cos(x) tg_cos_at(TG_HERE, x)
#define tg_gelu(x) tg_gelu_at(TG_HERE, x)
#define tg_gelu_tanh(x) tg_gelu_tanh_at(TG_HERE, x)
#define tg_silu(x) tg_silu_at(TG_HERE, x)
#define tg_clamp(x, lo, hi) tg_clamp_at(TG_HERE, x, lo, hi)

/* argmax/argmin: i32 index of the first extreme along axis (the axis is removed), or of the
 * flattened tensor with TG_ALL (a scalar). No gradient. Ties: the first index, as PyTorch on CPU. */
TG_API tg_tensor tg_argmax_at(tg_site s, tg_tensor x, int axis);
TG_API tg_tensor tg_argmin_at(tg_site s, tg_tensor x, int axis);
#define tg_argmax(x, axis) tg_argmax_at(TG_HERE, x, axis)
#define tg_argmin(x, axis) tg_argmin_at(TG_HERE, x, axis)

/* flatten: axes start.. merged into one (torch.flatten(x, start)). split_heads: [..., T, H*Dh] ->
 * [..., H, T, Dh]; merge_heads is its inverse. */
TG_API tg_tensor tg_flatten_at(tg_site s, tg_tensor x, int start);
TG_API tg_tensor tg_split_heads_at(tg_site s, tg_tensor x, int n_heads);
TG_API tg_tensor tg_merge_heads_at(tg_site s, tg_tensor x);
#define tg_flatten(x, start) tg_flatten_at(TG_HERE, x, start)
#define tg_split_heads(x, n_heads) tg_split_heads_at(TG_HERE, x, n_heads)
#define tg_merge_heads(x) tg_merge_heads_at(TG_HERE, x)

/* take_along_axis (torch.take_along_dim / gather): idx i32 of x's rank, equal to x's shape except
 * along axis; out-of-range indices give 0. */
TG_API tg_tensor tg_take_along_axis_at(tg_site s, tg_tensor x, tg_tensor idx, int axis);
#define tg_take_along_axis(x, idx, axis) tg_take_along_axis_at(TG_HERE, x, idx, axis)

/* Builders. arange: [n] holding 0..n-1. randn: N(0, 1) drawn anew each step (or run) from the
 * model seed and the step number; no gradient. */
TG_API tg_tensor tg_arange_at(tg_site s, int64_t n, tg_dtype dt);
TG_API tg_tensor tg_zeros_at(tg_site s, tg_shape shape, tg_dtype dt);
TG_API tg_tensor tg_ones_at(tg_site s, tg_shape shape, tg_dtype dt);
TG_API tg_tensor tg_randn_at(tg_site s, tg_shape shape);
#define tg_arange(n, dt) tg_arange_at(TG_HERE, n, dt)
#define tg_zeros(dt, ...) tg_zeros_at(TG_HERE, TG_SHAPE(__VA_ARGS__), dt)
#define tg_ones(dt, ...) tg_ones_at(TG_HERE, TG_SHAPE(__VA_ARGS__), dt)
#define tg_randn(...) tg_randn_at(TG_HERE, TG_SHAPE(__VA_ARGS__))

/* Structure. narrow: length elements from start along axis. concat: along an existing axis, any
 * number of inputs. stack: along a new axis. split: into pieces of the given sizes (which must
 * add up to the axis length); writes n tensors to out. */
TG_API tg_tensor tg_narrow_at(tg_site s, tg_tensor x, int axis, int64_t start, int64_t length);
TG_API tg_tensor tg_concat_at(tg_site s, const tg_tensor *xs, int n, int axis);
TG_API tg_tensor tg_stack_at(tg_site s, const tg_tensor *xs, int n, int axis);
TG_API void tg_split_at(tg_site s, tg_tensor x, const int64_t *sizes, int n, int axis, tg_tensor *out);
#define tg_narrow(x, axis, start, length) tg_narrow_at(TG_HERE, x, axis, start, length)
/* Variadic so a compound literal (its commas are not inside parentheses) passes through:
 * tg_concat((tg_tensor[]){ a, b }, 2, -1). */
#define tg_concat(...) tg_concat_at(TG_HERE, __VA_ARGS__)
#define tg_stack(...) tg_stack_at(TG_HERE, __VA_ARGS__)
#define tg_split(...) tg_split_at(TG_HERE, __VA_ARGS__)

/* Attention helpers over the last two axes [.., T, T] (row = query, column = key).
 * softmax_causal: softmax along the last axis of the entries with column <= row; 0 above the
 * diagonal (PyTorch: masked_fill(~tril, -inf).softmax(-1)). where_causal: fill above the diagonal. */
TG_API tg_tensor tg_softmax_causal_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_where_causal_at(tg_site s, tg_tensor x, double fill);
#define tg_softmax_causal(x) tg_softmax_causal_at(TG_HERE, x)
#define tg_where_causal(x, fill) tg_where_causal_at(TG_HERE, x, fill)

/* Scaled dot-product attention, fused: q [.., T, D], k [.., S, D], v [.., S, E] (the same leading
 * dims, e.g. [B, heads, T, D] from tg_split_heads) -> [.., T, E], row r = softmax over c of
 * (q_r . k_c * scale) weighting the rows v_c; causal keeps only c <= r (as softmax_causal).
 * PyTorch: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale). Backends run
 * it without ever storing the [T, S] scores (flash attention on CUDA; the gradient recomputes
 * them from each row's saved log-sum-exp). The same computation written out, softmax(q @ kᵀ *
 * scale) @ v with tg_softmax_causal or tg_softmax(.., -1), is recognised when it is traced and
 * runs fused too (set TG_NO_FUSE=1 to keep it as written). Operands straight from tg_split_heads
 * are read where they lie, and an output merged with tg_merge_heads is written merged: splitting
 * and merging heads around attention copies nothing. */
TG_API tg_tensor tg_attention_at(tg_site s, tg_tensor q, tg_tensor k, tg_tensor v, int causal, double scale);
#define tg_attention(q, k, v, causal, scale) tg_attention_at(TG_HERE, q, k, v, causal, scale)

/* stop_gradient: x, through which no gradient flows (x.detach()). dropout: inverted (kept values
 * scaled by 1/(1-p)); the mask is a hash of the step's seed, this call's place in the graph and
 * the element index, so backward recomputes it; p = 0 adds no node; 0 <= p < 1. No train/eval
 * flag: trace a forward without dropout for evaluation. */
TG_API tg_tensor tg_stop_gradient_at(tg_site s, tg_tensor x);
TG_API tg_tensor tg_dropout_at(tg_site s, tg_tensor x, double p);
#define tg_stop_gradient(x) tg_stop_gradient_at(TG_HERE, x)
#define tg_dropout(x, p) tg_dropout_at(TG_HERE, x, p)

/* Captures and patch sites: named places in a forward, both returning x.
 * capture: after each step or run, x's values and shape can be read by name
 * (tg_train_capture, tg_forward_capture). A graph without captures compiles exactly as before.
 * patch: a place where a forward handle can replace x's values per call (tg_patch_set: zeros,
 * the batch mean, given values, or the values x takes on another input) without retracing. In a
 * training graph, or while no patch is set, a site is x itself: inactive sites cost nothing (a
 * handle with patches set runs a second compiled variant in which every site selects its value).
 * Names are unique per graph; patch sites must be f32. */
TG_API tg_tensor tg_capture_at(tg_site s, const char *name, tg_tensor x);
TG_API tg_tensor tg_patch_at(tg_site s, const char *name, tg_tensor x);
#define tg_capture(name, x) tg_capture_at(TG_HERE, name, x)
#define tg_patch(name, x) tg_patch_at(TG_HERE, name, x)

/* Images, NCHW. conv2d: x [N,C,H,W], w [O,C,kh,kw] -> [N,O,Ho,Wo] (F.conv2d without bias; zero
 * padding). max_pool2d: k x k windows (F.max_pool2d; padding counts as -inf, padding <= k/2).
 * nearest_upsample2d: each pixel repeated factor x factor times (F.interpolate mode="nearest"). */
TG_API tg_tensor tg_conv2d_at(tg_site s, tg_tensor x, tg_tensor w, int stride, int padding);
TG_API tg_tensor tg_max_pool2d_at(tg_site s, tg_tensor x, int k, int stride, int padding);
TG_API tg_tensor tg_nearest_upsample2d_at(tg_site s, tg_tensor x, int factor);
#define tg_conv2d(x, w, stride, padding) tg_conv2d_at(TG_HERE, x, w, stride, padding)
#define tg_max_pool2d(x, k, stride, padding) tg_max_pool2d_at(TG_HERE, x, k, stride, padding)
#define tg_nearest_upsample2d(x, factor) tg_nearest_upsample2d_at(TG_HERE, x, factor)

/* Inspecting a tensor while tracing (for the forward function's own asserts). */
TG_API tg_shape tg_shape_of(tg_tensor t);
TG_API tg_dtype tg_dtype_of(tg_tensor t);

/* ---------------------------------------------------------------------------------------------
 * Layers: parameters declared once, used in forward functions.
 * ------------------------------------------------------------------------------------------- */

/* Linear: y = x W + b, W [in, out], b [out]. Options may be NULL: W randn(0.02), b zeros. */
typedef struct { int no_bias; tg_init init; int has_init; } tg_linear_opts;
typedef struct { tg_param W, b; int has_bias; } tg_linear;
TG_API tg_linear tg_linear_new(tg_model *m, const char *name, int64_t in, int64_t out, const tg_linear_opts *opts);
TG_API tg_tensor tg_linear_at(tg_site s, const tg_linear *l, tg_tensor x);
#define tg_linear(l, x) tg_linear_at(TG_HERE, l, x)

/* Embedding: W [vocab, dim], randn(0.02). */
typedef struct { tg_param W; } tg_embedding_layer;
TG_API tg_embedding_layer tg_embedding_new(tg_model *m, const char *name, int64_t vocab, int64_t dim);
TG_API tg_tensor tg_embed_at(tg_site s, const tg_embedding_layer *e, tg_tensor idx);
#define tg_embed(e, idx) tg_embed_at(TG_HERE, e, idx)

/* LayerNorm over the last axis: g ones, b zeros (no decay), eps default 1e-5 (eps <= 0: default). */
typedef struct { tg_param g, b; int has_bias; double eps; } tg_layernorm;
TG_API tg_layernorm tg_layernorm_new(tg_model *m, const char *name, int64_t dim, double eps, int bias);
TG_API tg_tensor tg_layernorm_at(tg_site s, const tg_layernorm *ln, tg_tensor x);
#define tg_layernorm(ln, x) tg_layernorm_at(TG_HERE, ln, x)

/* RMSNorm over the last axis: x * rsqrt(mean(x^2) + eps) * g; g ones, no decay; eps default 1e-6
 * (eps <= 0: default). */
typedef struct { tg_param g; double eps; } tg_rmsnorm;
TG_API tg_rmsnorm tg_rmsnorm_new(tg_model *m, const char *name, int64_t dim, double eps);
TG_API tg_tensor tg_rmsnorm_at(tg_site s, const tg_rmsnorm *l, tg_tensor x);
#define tg_rmsnorm(l, x) tg_rmsnorm_at(TG_HERE, l, x)

/* Conv2d: W [out, in, k, k] drawn N(0, 2 / (in k k)) (He init over the true fan-in), b [out]
 * zeros (bias != 0). */
typedef struct { tg_param W, b; int has_bias, stride, padding; } tg_conv2d_layer;
TG_API tg_conv2d_layer tg_conv2d_new(tg_model *m, const char *name, int64_t in, int64_t out, int k, int stride,
                              int padding, int bias);
TG_API tg_tensor tg_conv_at(tg_site s, const tg_conv2d_layer *l, tg_tensor x);
#define tg_conv(l, x) tg_conv_at(TG_HERE, l, x)

/* ---------------------------------------------------------------------------------------------
 * Optimizers and learning-rate schedules (values, copied at compile).
 * ------------------------------------------------------------------------------------------- */

/* Learning rate at step t = 1, 2, ...; with c = t - 1 steps completed (PyTorch's T_cur):
 *   CONSTANT     peak
 *   LINEAR       peak + (final - peak) * min(c, steps) / steps
 *   COSINE       final + (peak - final) * (1 + cos(pi * min(c, steps) / steps)) / 2
 *   WARMUP       peak * t / steps for t <= steps, then *after evaluated at t - steps
 *                (after NULL: constant peak)
 *   STAIRCASE    peak * gamma^floor(c / every)
 *   MULTISTEP    peak * gamma^(number of milestones m with m <= c)                      */
typedef enum { TG_LR_CONSTANT, TG_LR_LINEAR, TG_LR_COSINE, TG_LR_WARMUP, TG_LR_STAIRCASE, TG_LR_MULTISTEP } tg_lr_kind;
#define TG_MAX_MILESTONES 16
typedef struct tg_schedule {
    tg_lr_kind kind;
    double peak, final, gamma;
    int64_t steps, every;
    int64_t milestones[TG_MAX_MILESTONES];
    int n_milestones;
    const struct tg_schedule *after;   /* WARMUP only; copied at use */
} tg_schedule;

TG_API tg_schedule tg_lr_constant(double lr);
TG_API tg_schedule tg_lr_linear(double peak, double final, int64_t steps);
TG_API tg_schedule tg_lr_cosine(double peak, double final, int64_t steps);
TG_API tg_schedule tg_lr_warmup(double peak, int64_t steps, const tg_schedule *after);
TG_API tg_schedule tg_lr_staircase(double peak, int64_t every, double gamma);
TG_API tg_schedule tg_lr_multistep(double peak, const int64_t *milestones, int n, double gamma);
TG_API double tg_schedule_at(const tg_schedule *s, int64_t t);   /* the lr at step t (t >= 1) */

typedef enum { TG_OPT_ADAM, TG_OPT_ADAMW, TG_OPT_SGD } tg_opt_kind;

/* PyTorch's update formulas (torch.optim.Adam, AdamW, SGD with dampening 0).
 * Adam and SGD weight_decay is L2 (wd * p added to the gradient); AdamW's is decoupled
 * (p *= 1 - lr * wd). Every form applies only to parameters whose decay flag is set (so biases
 * and norm gains, zeros/ones-initialised, are not decayed unless asked).
 * clip_norm > 0 scales all gradients by min(1, clip_norm / (global L2 norm + 1e-6)) first. */
typedef struct {
    tg_opt_kind kind;
    tg_schedule lr;
    double b1, b2, eps, weight_decay, momentum;
    int nesterov;
    double clip_norm;
    /* Per-parameter decay by name, overriding the param's decay flag. Returns 1
     * (decay), 0 (don't) or -1 (keep the flag). NULL: the flags decide. */
    int (*decay_filter)(const char *name, void *ctx);
    void *decay_ctx;
} tg_optimizer;

TG_API tg_optimizer tg_adam(double lr);                       /* b1 0.9, b2 0.999, eps 1e-8 */
TG_API tg_optimizer tg_adamw(double lr, double weight_decay);
TG_API tg_optimizer tg_sgd(double lr, double momentum, int nesterov, double weight_decay);

/* ---------------------------------------------------------------------------------------------
 * Compiling and running.
 * ------------------------------------------------------------------------------------------- */

/* Inputs are declared by name; TG_F32("x", 64, 784) and TG_I32("y", 64) are initializers, usable
 * in static arrays and in compound literals: (tg_input_decl[]){ TG_F32("x", 64, 784), ... }. */
typedef struct { const char *name; tg_dtype dtype; tg_shape shape; } tg_input_decl;
#define TG_SHAPE_INIT(...) { (int)(sizeof((int64_t[]){ __VA_ARGS__ }) / sizeof(int64_t)), { __VA_ARGS__ } }
#define TG_F32(name, ...) { name, TG_FLOAT32, TG_SHAPE_INIT(__VA_ARGS__) }
#define TG_I32(name, ...) { name, TG_INT32, TG_SHAPE_INIT(__VA_ARGS__) }

/* Data for a call (or for tg_upload_params), by name. */
typedef struct { const char *name; tg_dtype dtype; const void *data; size_t n; } tg_data;
static inline tg_data tg_f32(const char *name, const float *p, size_t n) { tg_data d = { name, TG_FLOAT32, p, n }; return d; }
static inline tg_data tg_i32(const char *name, const int32_t *p, size_t n) { tg_data d = { name, TG_INT32, p, n }; return d; }

typedef tg_tensor (*tg_forward_fn)(const void *ctx, const tg_tensor *inputs);

/* The arithmetic of matrix products (convolutions are products too) and attention:
 *   F32   f32 (the default; TF32 off). On CUDA, attention's products run on tensor cores as
 *         three TF32 products each (operands split into a rounded part and its rest), which
 *         carries f32's precision, as PyTorch's f32 attention does; so do matrix products
 *         whose shape that makes faster than cuBLAS's f32 kernels (timed once per shape; an
 *         error of about 1e-6 of the sum of |a b|, where f32's own is 1e-7 and TF32's 1e-4).
 *   TF32  products and attention's products on TF32 tensor cores (operands rounded to a 10-bit
 *         mantissa, f32 sums). Inside attention the forward's probabilities stay f32, while
 *         the backward rounds the probabilities and score gradients it multiplies, as flash
 *         attention's backward does (in BF16 too); everything else f32.
 *   BF16  mixed precision as torch.autocast(dtype=torch.bfloat16) does it: the operands of
 *         products and attention are rounded to bfloat16, sums stay f32; so are activations
 *         (the output of a product or of attention, attention's gradients of k and v, and
 *         element-wise work on them such as a bias, GELU or ReLU, but not a sum with an f32
 *         tensor of its size, such as the residual stream; a product plus a bias per column is
 *         rounded once, the bias rounded to bf16 first, as autocast's linear and cuBLASLt's
 *         bias epilogue compute it, and so is a product plus another's output, as a product
 *         with beta = 1 computes it), which lets a backend keep them in two bytes; parameters,
 *         their gradients, optimizer state, softmax, norms, reductions, attention's gradient
 *         of q (added up in f32) and the loss stay f32. bf16 keeps f32's exponent range, so no
 *         loss scaling is needed (unlike fp16).
 * The reference interpreter rounds at the same points, so each precision has an exact oracle.
 * A backend without the hardware runs what it can, never silently (tg_train_precision says what
 * runs): the "cpu" backend runs BF16 where the CPU has AVX512-BF16 (vdpbf16ps products; denormal
 * operands count as zero there) and f32 otherwise, and f32 for TF32. At every precision the "cpu"
 * backend's kernels on x86-64 flush denormal results to zero and read denormal inputs as zero
 * (magnitudes below 1.2e-38; a denormal costs an Intel core ~100 cycles an operation), as
 * TensorFlow's CPU kernels do; the calling thread's floating-point mode is restored after each
 * call. Checkpoints are always f32 and move freely between precisions. */
typedef enum { TG_PRECISION_DEFAULT = 0, TG_PRECISION_F32, TG_PRECISION_TF32, TG_PRECISION_BF16 } tg_precision;

/* One process of a multi-process data-parallel job (see "Data-parallel training" below). Zero
 * fields take their values from the environment, as torchrun sets it: each TG_ variable first,
 * then torchrun's name without the prefix. */
typedef struct {
    int world_size;              /* processes in the job; 0: $TG_WORLD_SIZE / $WORLD_SIZE, and rank
                                  * and local rank from the environment too (none set: a job of 1) */
    int rank;                    /* with world_size set: this process, 0 .. world_size - 1 */
    int local_rank;              /* with world_size set: its index on its host (the GPU it uses
                                  * when .devices is not given) */
    const char *master_addr;     /* rank 0's host name or address; NULL: $TG_MASTER_ADDR /
                                  * $MASTER_ADDR, else "127.0.0.1" */
    int master_port;             /* rank 0's TCP port; 0: $TG_MASTER_PORT / $MASTER_PORT, else 29500 */
    double timeout_s;            /* joining, and each step's wait for the other ranks; 0:
                                  * $TG_DIST_TIMEOUT (seconds), else 600 */
} tg_dist_spec;

typedef struct {
    tg_model *model;
    tg_forward_fn loss;          /* must return a scalar (one element) */
    const void *ctx;             /* passed to loss as is */
    const tg_input_decl *inputs;
    int n_inputs;
    tg_optimizer optimizer;
    const char *backend;         /* "cpu" (default, or $TG_BACKEND), "cuda", "reference" */
    tg_precision precision;      /* DEFAULT: f32 */
    /* Data parallel (see below); both unset: one replica, as before. */
    const int *devices;          /* CUDA ordinals this process trains on, a replica on each */
    int n_devices;
    const tg_dist_spec *dist;    /* set: this process is one rank of a multi-process job */
} tg_train_spec;

/* A forward's inputs may leave dimensions open: TG_F32("x", TG_ANY, 784). The graph is then
 * traced and compiled for each concrete size on first use (found from the data's element
 * counts; all open dimensions of one call must agree) and kept, least recently used evicted
 * beyond max_variants. */
#define TG_ANY (-1)
typedef struct {
    tg_forward_fn forward;
    const void *ctx;
    const tg_input_decl *inputs;
    int n_inputs;
    int max_variants;            /* compiled sizes kept for open dimensions; 0 = 8 */
    tg_precision precision;      /* DEFAULT: the training handle's */
} tg_forward_spec;

typedef struct tg_train tg_train;
typedef struct tg_forward tg_forward;

/* Result of a call: a value, never a crash. For tg_run, output points at the handle's own copy
 * (valid until the next call on that handle: threads sharing a forward use tg_run_submit or
 * tg_flight_run, which copy, or a forward each). */
typedef struct {
    tg_status status;
    float loss;               /* tg_step */
    int64_t step;             /* tg_step: the step number just completed (1-based) */
    const float *output;      /* tg_run */
    size_t output_len;
    tg_shape output_shape;
    char error[TG_ERROR_LEN];
} tg_result;

/* NULL on failure, with err->msg set (trace-time shape errors name the caller's file:line). */
TG_API tg_train *tg_compile(const tg_train_spec *spec, tg_error *err);

/* Data-parallel training, as PyTorch's DistributedDataParallel: every replica holds the whole
 * model and runs forward and backward on its share of the batch; the loss and the gradients are
 * then averaged over all replicas, and every replica applies that same update, so parameters
 * stay identical.
 *
 * One process, several GPUs: .devices = (int[]){ 0, 1 }, .n_devices = 2. Inputs are declared and
 * passed at the global batch: tg_step splits every input's first dimension evenly over the
 * devices in order (device k gets rows [k B/n, (k+1) B/n)); a first dimension the device count
 * does not divide is a tg_compile error that says so.
 * Several processes (one or more GPUs each, on one host or many): .dist = &(tg_dist_spec){ 0 }
 * in every process, launched as torchrun launches them (torchrun --nproc_per_node 2 --no-python
 * ./train, or your own launcher setting TG_RANK, TG_WORLD_SIZE, TG_LOCAL_RANK, TG_MASTER_ADDR,
 * TG_MASTER_PORT). Each process declares and passes its own local batch. tg_compile meets the
 * other ranks: rank 0 listens on master_port (every interface), the others connect to
 * master_addr, and all check that they run the same job (world size, replicas per process, the
 * parameters' names and sizes); it fails, naming what disagrees or who did not come, within
 * timeout_s. Without .devices a process uses GPU local_rank.
 *
 *  - The loss tg_step returns is the mean of the replicas' losses: with a mean-reduced loss
 *    (TG_MEAN) and an even split, the loss of the whole batch, and its gradient; a loss summed
 *    over the batch (TG_SUM) comes out as the whole batch's divided by the replica count.
 *  - Gradient clipping and the non-finite guard see the averaged gradients, so every replica of
 *    every rank skips a bad step together and leaves its parameters unchanged.
 *  - A rank that exits or hangs makes the others' step fail within timeout_s naming it (never a
 *    hang); such a handle refuses further steps: destroy it.
 *  - Random ops (dropout, randn) draw differently on each replica.
 *  - Attached forwards, tg_eval_loss (at the declared shapes), captures and
 *    tg_download_param_grad (the averaged gradient) use replica 0: the first device.
 *  - tg_upload_params, tg_load and tg_reset change every replica of this process: in a
 *    multi-process job make the same calls on every rank (e.g. load the same checkpoint;
 *    tg_save from rank 0 only, all ranks hold the same values). Checkpoints are the same files
 *    as one replica's and move freely between replica counts. tg_replace_model is refused.
 *  - "cuda": replicas are GPUs; the averaging is an NCCL all-reduce of the gradients, captured
 *    inside the step's CUDA graph when a process drives one GPU. NCCL is loaded with dlopen
 *    ($TG_NCCL_LIB, else libnccl.so.2) and NCCL_NVLS_ENABLE is set to 0 unless already set.
 *    "cpu" and "reference": replicas run one after another in this process (.devices only
 *    counts them) and processes average over TCP: the same logic, without any GPU. */
/* Whether data-parallel training with more than one replica can run on backend `name` here: 1,
 * or 0 with the reason (e.g. NCCL or the CUDA driver missing) in why. */
TG_API int tg_distributed_available(const char *name, char *why, size_t why_len);
/* This process's rank (0 when alone) and the replicas of the whole job (1 without data
 * parallelism); -1 for a dead handle. */
TG_API int tg_train_rank(const tg_train *t);
TG_API int tg_train_replicas(const tg_train *t);
/* A step whose loss or any gradient element is NaN or infinite fails, naming the first parameter
 * (in declaration order) whose gradient is not finite, and leaves parameters, optimizer state
 * and the step count as they were.
 * No inputs (NULL, 0): the step runs on the batch the previous step left in the backend's input
 * buffers, copying nothing: for full-batch training, or one batch kept on the GPU (as a PyTorch
 * loop stepping on tensors already on the device). An error before any step was given inputs. */
TG_API tg_result tg_step(tg_train *t, const tg_data *inputs, int n_inputs);
/* n_steps steps in one call: every input holds n_steps batches back to back (n = n_steps times
 * the declared element count), step s reading the s-th. The same as calling tg_step on each batch
 * in turn, stopping at the first step that fails (its result is returned, naming the step; the
 * steps before it count, it and those after change nothing); losses (NULL, or n_steps floats)
 * gets the loss of each step that ran. On a GPU the steps are queued without waiting for each
 * loss, so the device runs them back to back, as a PyTorch loop that replays a CUDA graph and
 * reads the loss once at the end: the way to train fastest on batches already in host memory.
 * No inputs (NULL, 0): n_steps steps on the batch the previous step left (as tg_step). */
TG_API tg_result tg_steps(tg_train *t, const tg_data *inputs, int n_inputs, int n_steps, float *losses);
/* The loss at the current parameters without an update (held-out evaluation), with the training
 * input shapes; for other batch sizes, attach the loss function as a forward with TG_ANY dims. */
TG_API tg_result tg_eval_loss(tg_train *t, const tg_data *inputs, int n_inputs);
TG_API void tg_destroy(tg_train *t);  /* frees attached forwards too */

/* A forward graph that shares t's parameter buffers: every step is visible to it at once.
 * Without open dimensions it is compiled here (trace errors come back now); with them, at the
 * first call of each size. Freed by tg_destroy(t), or earlier by tg_detach. */
TG_API tg_forward *tg_attach(tg_train *t, const tg_forward_spec *spec, tg_error *err);
TG_API tg_result tg_run(tg_forward *f, const tg_data *inputs, int n_inputs);
TG_API void tg_detach(tg_forward *f);

/* Swap the model behind t: the loss function, its ctx, the inputs and the backend stay (so the
 * loss function must now describe m: point its ctx's layers at m's first); parameters are m's,
 * initialized from its seed; the optimizer is *opt (NULL: keep the current one); the step count
 * restarts at 0. On failure t is unchanged. Attached forwards stay valid and are traced again,
 * against m, at their next call. Calls queued (tg_step_submit, tg_run_submit) resolve
 * TG_ABORTED, even when the replacement fails; a call in flight resolves TG_ABORTED too. */
TG_API tg_status tg_replace_model(tg_train *t, tg_model *m, const tg_optimizer *opt, tg_error *err);

/* Captured values (tg_capture) of the handle's last call: shape (if shape is non-NULL) and,
 * when dst is non-NULL, the n values (n must be the element count). */
TG_API tg_status tg_train_capture(tg_train *t, const char *name, float *dst, size_t n, tg_shape *shape, tg_error *err);
TG_API tg_status tg_forward_capture(tg_forward *f, const char *name, float *dst, size_t n, tg_shape *shape, tg_error *err);
/* One head of a captured attention map: values of shape [B, H, T, S] (or [H, T, S]) -> the
 * [B, T, S] (or [T, S]) of head `head`, into dst of n elements; its shape to *head_shape. */
TG_API tg_status tg_capture_head(const float *values, tg_shape shape, int head, float *dst, size_t n, tg_shape *head_shape,
                          tg_error *err);

/* Activation patching on a forward handle (sites are tg_patch calls in its function):
 *   TG_PATCH_OFF     the site passes its value through
 *   TG_PATCH_ZERO    zeros
 *   TG_PATCH_MEAN    the mean over the batch (axis 0) of the site's own values in this call
 *   TG_PATCH_VALUES  n given values (copied), the site's element count
 * A site name is checked at the next call (an unknown name fails it). tg_patch_from sets VALUES
 * to what the site holds when the forward runs on other inputs (sites patched as they are set);
 * tg_patch_clear turns every site off. */
typedef enum { TG_PATCH_OFF, TG_PATCH_ZERO, TG_PATCH_MEAN, TG_PATCH_VALUES } tg_patch_mode;
TG_API tg_status tg_patch_set(tg_forward *f, const char *site, tg_patch_mode mode, const float *values, size_t n, tg_error *err);
TG_API tg_status tg_patch_from(tg_forward *f, const char *site, const tg_data *inputs, int n_inputs, tg_error *err);
TG_API void tg_patch_clear(tg_forward *f);

/* Threads. Every call on a training handle and the forwards attached to it takes one lock, so
 * calls from several threads serialize safely. A handle that was destroyed is recognized and
 * refused (as long as its address has not been reused by a new handle).
 * Async: a submit copies the inputs and queues the call on the handle's worker thread (one per
 * training handle, started on first use, calls in submission order); tg_wait blocks until it is
 * done and returns its result (a run's output stays valid until tg_job_free; free every job).
 * A submit returns NULL only for a handle that is not live, or when memory runs out; a bad call
 * fails at tg_wait. A call queued or in flight when the model is replaced or the handle destroyed
 * resolves TG_ABORTED. Do not destroy a handle while another thread is calling it.
 * Single flight (live previews): at most one call running and one waiting; a newer call displaces
 * the waiting one, whose caller gets TG_ABORTED. tg_flight_run blocks and copies the output into
 * out (out_len elements at most). */
typedef struct tg_job tg_job;
TG_API tg_job *tg_step_submit(tg_train *t, const tg_data *inputs, int n_inputs);
TG_API tg_job *tg_run_submit(tg_forward *f, const tg_data *inputs, int n_inputs);
TG_API tg_result tg_wait(tg_job *j);
TG_API int tg_job_done(tg_job *j);   /* 1 once tg_wait would not block */
TG_API void tg_job_free(tg_job *j);
typedef struct tg_flight tg_flight;
TG_API tg_flight *tg_flight_new(tg_forward *f);
TG_API tg_result tg_flight_run(tg_flight *fl, const tg_data *inputs, int n_inputs, float *out, size_t out_len);
TG_API void tg_flight_free(tg_flight *fl);

/* Parameters by name. upload is partial: names not given keep their values. */
TG_API int tg_train_n_params(const tg_train *t);
TG_API const char *tg_train_param_name(const tg_train *t, int i);
TG_API tg_shape tg_train_param_shape(const tg_train *t, int i);
TG_API int64_t tg_train_param_total(const tg_train *t);   /* elements over all parameters */
TG_API tg_status tg_download_param(tg_train *t, const char *name, float *dst, size_t n, tg_error *err);
TG_API tg_status tg_download_param_grad(tg_train *t, const char *name, float *dst, size_t n, tg_error *err);
TG_API tg_status tg_upload_params(tg_train *t, const tg_data *params, int n, tg_error *err);

/* Re-init parameters from the model's seed and/or zero the optimizer state and step counter.
 * TG_FAILED (nothing changed) for a NULL handle or when host memory for the values runs out. */
TG_API tg_status tg_reset(tg_train *t, int params, int optimizer);
TG_API void tg_set_lr(tg_train *t, double lr);
/* A schedule given mid-training is rebased: its step 1 is the next step. */
TG_API void tg_set_schedule(tg_train *t, const tg_schedule *s);
TG_API int64_t tg_train_step_count(const tg_train *t);
TG_API double tg_train_lr(const tg_train *t);  /* the lr the next step will use */

/* Checkpoints in safetensors format (read by PyTorch's and Hugging Face's tools): every
 * parameter as an F32 tensor under its name; with with_optimizer, also the optimizer state as
 * "optimizer.<param>.<k>" (Adam: k = 0 for m, 1 for v; SGD: 0 for the momentum buffer) and the
 * step count and schedule base in the metadata, so training resumes where it stopped, bit for
 * bit, except on CUDA where a model has gathers (embeddings), max pooling of overlapping windows
 * or attention: CUDA adds up their gradients (attention's dq) in memory as they arrive, in an
 * order that varies from run to run, so such runs, resumed or not, part in the last bits (as
 * PyTorch's default CUDA kernels do). tg_load needs every parameter of the model in the file
 * with its shape (other tensors are ignored) and changes nothing unless the whole file is good. */
TG_API tg_status tg_save(tg_train *t, const char *path, int with_optimizer, tg_error *err);
TG_API tg_status tg_load(tg_train *t, const char *path, int with_optimizer, tg_error *err);

/* ---------------------------------------------------------------------------------------------
 * Export: a trained forward as one C file that needs nothing but libm.
 * ------------------------------------------------------------------------------------------- */

/* tg_export_c(f, "model.c", &opts, &err) writes f's function, traced at f's input shapes, with
 * the parameters' current values, as one C99 file (plus, optionally, a header) that compiles on
 * its own (cc -std=c99 -O2 model.c main.c -lm) and computes what tg_run(f) computes on the cpu
 * backend: the same schedule, fusion and buffer plan, with plain portable kernels in place of
 * the library's. With prefix "digits" and one f32 input "x" the file defines
 *   #define DIGITS_ARENA_FLOATS n, DIGITS_IN_X_SIZE n, DIGITS_OUT_SIZE n
 *   void digits_forward(const float *in_x, float *out);     one static arena: not reentrant
 *   void digits_forward_arena(float *arena, const float *in_x, float *out);   reentrant
 * Inputs come in declaration order, i32 ones as const int32_t *; out gets the forward's one
 * output (several outputs: return them flattened and concatenated with tg_concat). No dynamic
 * allocation (the arena is sized by the buffer plan), no threads unless openmp. With
 * external_weights the weights are static arrays that int digits_init(const char *path) fills
 * from a safetensors file (0 or a DIGITS_E_* code; digits_init_error() says why): the file
 * written to weights_path, or any tg_save checkpoint of the model; otherwise they are embedded
 * as static const arrays. TG_FAILED with err set for a NULL or destroyed forward, a bad prefix,
 * an open input dimension (TG_ANY) without open_size, an op that draws random numbers per call
 * (dropout, randn), a path that cannot be written (each file is written whole or not at all). */
typedef struct {
    const char *prefix;          /* a C identifier for the API's names; NULL: "model" */
    const char *header_path;     /* also write a header declaring the API there; NULL: none */
    int external_weights;        /* read the weights at <prefix>_init(path) instead of embedding them */
    const char *weights_path;    /* with external_weights: write them there now (NULL: don't) */
    int openmp;                  /* keep the CPU backend's OpenMP pragmas (then -fopenmp gives threads) */
    int64_t open_size;           /* the size of open (TG_ANY) input dimensions; 0: none may be open */
} tg_export_opts;
TG_API tg_status tg_export_c(tg_forward *f, const char *path, const tg_export_opts *opts, tg_error *err);

/* ---------------------------------------------------------------------------------------------
 * Inspection
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    const char *op;           /* "matmul", "add", "param", ... */
    const char *name;         /* parameter or input name, or NULL */
    tg_dtype dtype;
    tg_shape shape;
    int n_inputs;
    int inputs[6];            /* node ids */
    tg_site site;
} tg_node_info;

TG_API const tg_graph *tg_train_graph(const tg_train *t);
TG_API const tg_graph *tg_forward_graph(const tg_forward *f);
TG_API int tg_graph_n_nodes(const tg_graph *g);
TG_API tg_node_info tg_graph_node(const tg_graph *g, int id);
TG_API int tg_graph_output(const tg_graph *g);            /* the loss or forward output node */
/* Graphviz DOT text; the caller frees it. */
TG_API char *tg_graph_dot(const tg_graph *g);
/* Bytes of intermediate memory the buffer plan needs (parameters and state not counted). */
TG_API size_t tg_train_planned_bytes(const tg_train *t);
/* The generated kernel source of the handle's graph (C for "cpu", CUDA C for "cuda"; for a
 * forward, the variant of its last call), or NULL (the reference interpreter, or not compiled
 * yet). Valid until the handle's next call or change. */
TG_API const char *tg_train_kernel_source(const tg_train *t);
/* Device launches one training step makes on CUDA (kernels, cuBLAS products, memsets, the
 * write-back pass), or -1 on backends that do not launch work (reference, cpu). */
TG_API int tg_train_launch_count(const tg_train *t);
/* The precision the handle's step runs (see tg_precision): what was asked, or what the backend
 * runs instead (f32 on "cpu"); TG_PRECISION_DEFAULT for a dead handle. */
TG_API tg_precision tg_train_precision(const tg_train *t);
TG_API const char *tg_precision_name(tg_precision p);   /* "f32", "tf32", "bf16" */
TG_API const char *tg_forward_kernel_source(const tg_forward *f);
/* Compiled variants a forward holds now (sizes of its open dimensions, plain or patchable). */
TG_API int tg_forward_n_variants(const tg_forward *f);
/* Captures and patch sites of a graph, by index. */
TG_API int tg_graph_n_captures(const tg_graph *g);
TG_API const char *tg_graph_capture(const tg_graph *g, int i, int *node);
TG_API int tg_graph_n_patches(const tg_graph *g);
TG_API const char *tg_graph_patch(const tg_graph *g, int i, int *node);

/* Can this backend run here? 1 if so; else 0 with the reason in why (e.g. "CUDA is not
 * available: no CUDA device"). Backends: "cpu" (default), "cuda", "reference". */
TG_API int tg_backend_available(const char *name, char *why, size_t why_len);

/* The library's version, "MAJOR.MINOR.PATCH" (TG_VERSION_STRING of the header it was built with). */
TG_API const char *tg_version(void);

#ifdef __cplusplus
}
#endif
#endif
