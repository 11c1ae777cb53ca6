/* The graph: ops and their contracts, nodes, the IR, shape rules, op builders, autograd, the
 * model's parameter store and the optimizer, which appends its update to the same graph.
 * Nothing here is public API. */
#ifndef TG_GRAPH_H
#define TG_GRAPH_H

#include "tensorgrad.h"
#include "util/util.h"
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>


/* ---------------------------------------------------------------------------------------------
 * Ops. Every node produces exactly one tensor; a node's id is its tensor's id. The comment on
 * each op is the contract its kernels (every backend) implement.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    /* Leaves: values come from outside the node's kernel. */
    OP_INPUT,    /* host data bound per call; name = input name; iarg[0] = input index */
    OP_PARAM,    /* a model parameter, persistent; iarg[0] = param id */
    OP_STATE,    /* optimizer state, persistent, zero at start/reset; iarg[0] = state slot */
    OP_CONST,    /* every element = farg */
    OP_HYPER,    /* every element = hyper[iarg[0]] (per-step scalars the host computes: lr, ...) */

    /* Elementwise unary: out[i] = f(x[i]), same shape and dtype as src0. */
    OP_NEG, OP_ABS, OP_SQUARE, OP_SQRT, OP_RSQRT, OP_EXP, OP_LOG, OP_RELU, OP_TANH, OP_SIGMOID,
    OP_SIGN,     /* -1, 0, 1 */
    OP_STEP,     /* x > 0 ? 1 : 0 */

    /* Elementwise binary with NumPy broadcasting of src0 and src1 to the node's shape.
     * LESS/GREATER/EQUAL give 1 or 0 (dtype f32). MIN/MAX are elementwise. */
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MIN, OP_MAX, OP_LESS, OP_GREATER, OP_EQUAL,
    OP_WHERE,    /* src0 != 0 ? src1 : src2, all three broadcast to the node's shape */

    /* Reduction: sum over axis `axis` of src0; the node's shape is src0's with that dim = 1. */
    OP_SUM,

    /* Movement. RESHAPE: same elements in row-major order, new shape. PERMUTE: out axis i is
     * src0 axis iarg[i]. EXPAND: src0 broadcast (NumPy rules) to the node's shape. */
    OP_RESHAPE, OP_PERMUTE, OP_EXPAND,

    /* Batched matrix product. A = src0, B = src1. iarg[0] = transpose A (its last two axes),
     * iarg[1] = transpose B. After the transposes A is [..., M, K] and B is [..., K, N]; leading
     * (batch) dims broadcast NumPy-style; B (or A) may have only two dims. Out [batch..., M, N].
     * Products are accumulated in double in the reference. */
    OP_MATMUL,

    /* Indexing. ONE_HOT: i32 src0 [...] -> f32 [..., n], n = iarg[0]; out-of-range index -> a
     * zero row. GATHER_ROWS: table src0 [V, D], i32 idx src1 [...] -> [..., D] (row idx of the
     * table; out of range -> zeros). SCATTER_ROWS: the adjoint of GATHER_ROWS: src0 [..., D]
     * values, src1 i32 idx [...]; out [V, D] (V = node shape[0]) zero-filled, then
     * out[idx[i], :] += src0[i, :] for every in-range i. */
    OP_ONE_HOT, OP_GATHER_ROWS, OP_SCATTER_ROWS,

    /* Softmax and log-softmax of src0 along `axis`, stabilised by the max along the axis. */
    OP_SOFTMAX, OP_LOG_SOFTMAX,

    /* More elementwise unary. GELU: iarg[0] = 0 exact 0.5 x (1 + erf(x / sqrt 2)); iarg[0] = 1
     * the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). GELU_GRAD: d GELU / dx of
     * the same form: exact Phi(x) + x phi(x); tanh 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi)
     * (1 + 3 * 0.044715 x^2) with t the tanh above. IDENTITY: a copy (stop_gradient). */
    OP_SIN, OP_COS, OP_GELU, OP_GELU_GRAD, OP_IDENTITY,

    /* ARGMAX: index (i32) of the first maximum of src0 along `axis` (iarg[0] = 1: minimum);
     * node shape = src0's with that dim = 1. */
    OP_ARGMAX,

    /* TAKE_ALONG: src0 x, src1 i32 idx of x's rank, equal to x's shape except along `axis`;
     * node shape = idx shape; out[..i..] = x[..idx[..i..]..] along axis (out of range -> 0).
     * SCATTER_ALONG: its adjoint: src0 values (idx shape), src1 idx; node shape = x's shape;
     * zero-filled, then out[..idx[..i..]..] += values[..i..] for in-range indices. */
    OP_TAKE_ALONG, OP_SCATTER_ALONG,

    /* IOTA: 1-D [n], out[i] = i. RANDN: standard normals, element i = rng_normal(seed, iarg[0],
     * i) with seed = hyper[HYPER_SEED]. DROPOUT: out[i] = rng_uniform(seed, iarg[0], i) >= farg
     * ? src0[i] / (1 - farg) : 0 (so backward recomputes the same mask from the same salt). */
    OP_IOTA, OP_RANDN, OP_DROPOUT,

    /* SLICE: src0 narrowed along `axis` to the node's length, starting at iarg[0].
     * PAD: its adjoint: node shape is larger along `axis`; zeros except out[..start + j..] =
     * src0[..j..] with start = iarg[0]. */
    OP_SLICE, OP_PAD,

    /* Over the last two axes [.., R, C] (row r, column c): SOFTMAX_CAUSAL is the softmax along
     * the last axis of the entries with c <= r, and 0 where c > r. WHERE_CAUSAL: c > r ? farg :
     * src0. */
    OP_SOFTMAX_CAUSAL, OP_WHERE_CAUSAL,

    /* Images, NCHW. iarg for IM2COL/COL2IM: [0] kh, [1] kw, [2] stride, [3] padding.
     * IM2COL: src0 x [N,C,H,W] -> [N, C*kh*kw, Ho*Wo], Ho = (H + 2p - kh) / s + 1 (Wo alike);
     * row (c*kh + i)*kw + j, column oy*Wo + ox holds x[n, c, oy*s - p + i, ox*s - p + j], or 0
     * where that falls in the padding. COL2IM: its adjoint; node shape [N,C,H,W]; zero-filled,
     * then every column entry is added back to the pixel it was read from.
     * MAXPOOL2D: iarg [0] k, [1] stride, [2] padding; src0 [N,C,H,W] -> [N,C,Ho,Wo], the max
     * over each k x k window (padding never wins: it counts as -inf). MAXPOOL2D_BWD: src0 x,
     * src1 upstream gradient [N,C,Ho,Wo]; node shape = x's; zero-filled, then each window's
     * gradient is added at the position of the window's first maximum in row-major order. */
    OP_IM2COL, OP_COL2IM, OP_MAXPOOL2D, OP_MAXPOOL2D_BWD,

    /* Scaled dot-product attention over the last two axes; leading (batch) dims equal in q, k, v.
     * ATTENTION: src q [.., T, D], k [.., S, D], v [.., S, E] -> [.., T, E]: row r is
     * softmax_c(q_r . k_c * farg) weighted over v_c, the c with c > r excluded when iarg[0]
     * (causal; then T == S). ATTENTION_LSE: src q, k (same iarg, farg) -> [.., T]: each row's
     * log-sum-exp of the same scaled, masked scores; tg_attention appends it right after its
     * ATTENTION node (backends may compute both in one pass; the gradient reads it, a forward
     * never does, and schedules drop it there). ATTENTION_BWD: src q, k, v, out, d_out, lse;
     * iarg[1] = 0, 1, 2: the gradient with respect to q, k or v (shape of that operand). The
     * gradient rule appends the ones it needs consecutively, in that order. iarg[1] = 3 (packed,
     * heads interleaved, q, k, v of one shape [.., T, H, D]): all three side by side, [.., T, 3 H
     * D], row t dq's row t then dk's then dv's, as one product's gradient of q, k and v made
     * together would be (grad.c's attention_rule, with g->group_products and TG_PACK_ATTENTION=1).
     * iarg[2] = H > 1: out
     * is given with the head axis and the rows swapped ([.., T, H, E]: the copy a model makes to
     * merge heads, attn_row), so that the output itself need not live until the backward.
     * iarg[3] = H > 0 (all three ops): the heads are interleaved, as a model's linear layers
     * compute them, so that splitting and merging heads copies nothing: q [.., T, H, D], k
     * [.., S, H, D], v [.., S, H, E], ATTENTION's output and d_out [.., T, H, E], each gradient
     * its operand's shape; batch element b is head b % H of outer index b / H (attn_row). The
     * row log-sum-exp is [.., H, T] either way. op_attention takes this form for operands that
     * are such splits (a permute of axes -3 and -2). */
    OP_ATTENTION, OP_ATTENTION_LSE, OP_ATTENTION_BWD,

    OP_COUNT
} tg_op;

/* A value rounded as a product or attention operand of a graph of precision p (tg_precision):
 * bf16 to nearest, ties to even; tf32 to nearest, ties away from zero (the tensor cores' cvt.rna);
 * f32 as is. NaN and infinities pass through. */
static inline float precision_round(tg_precision p, float x) {
    if (p != TG_PRECISION_BF16 && p != TG_PRECISION_TF32) return x;
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    if (p == TG_PRECISION_BF16) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    else u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* precision.c: the activations of a bf16 graph. As autocast does, a bf16 graph rounds to bf16
 * (precision_round) the output of every matrix product (except those a parameter's gradient adds
 * up) and of attention (ATTENTION, and ATTENTION_BWD's gradients of k and v, with the same
 * exception; its statistics and q's gradient, added up in f32 as the key tiles arrive, stay f32),
 * and of every element-wise op whose full-size float operands are all such values (a bias, scale
 * or per-row statistic may be f32; a full-size f32 operand, the residual stream, keeps the result
 * f32); movement ops keep their source's kind. Softmax, norms' statistics, sums, attention's
 * insides, the loss, gradients of parameters and the optimizer stay f32. Every backend rounds
 * at these nodes, so that it may store them in two bytes; the reference does too.
 * graph_bf16_values sets *out to a flag per node (the caller frees it), NULL for the other
 * precisions; false when memory runs out. graph_rounds: does node id round (a bf16 value not
 * merely moved)? */
bool graph_bf16_values(const tg_graph *g, bool **out);
bool graph_rounds(const tg_graph *g, const bool *bf16, int id);
/* Ops whose output a library kernel computes (products, attention) and that round as products do:
 * a backend rounds them after that kernel, where the expression engine rounds the others inline. */
bool graph_library_output(tg_op op);
/* A product plus its addend, rounded once: where a product's only reader adds to it a vector
 * along its last axis (a bias: one value per column, over every row) or a bf16 activation of its
 * shape (a gradient accumulated: the sum of x's gradients through three products) and the sum is
 * a bf16 activation, the product is not rounded itself; the addend is rounded to bf16 (a bias; the
 * other is already) and the sum once: bf16(x W + bf16(b)), autocast's linear, as cuBLASLt's bias
 * epilogue computes it, and bf16(x W + c) as a product with beta = 1 does. graph_product_addend:
 * for such an ADD node id, the product (the other source is the addend), else -1. */
int graph_product_addend(const tg_graph *g, const bool *bf16, int id);
/* Readers of each node (uses[g->n]), the graph's output, write-backs, captures and patch sites
 * counting as readers too. graph_product_bias: for an ADD node id that adds a bias to a product
 * whose only reader it is, that product (at f32 and tf32 one product with a bias epilogue computes
 * the sum exactly), else -1. */
void graph_uses(const tg_graph *g, int *uses);
int graph_product_bias(const tg_graph *g, const int *uses, int id);

/* The hyper slot every graph reserves for its per-call random seed (RANDN, DROPOUT). */
#define HYPER_SEED 0

/* Counter-based random numbers shared by every backend: element i of a call with seed `seed`
 * and per-op salt `salt` is a pure function of the three, so a backward pass recomputes a
 * dropout mask rather than storing it. */
static inline uint64_t rng_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t rng_bits(uint64_t seed, uint64_t salt, uint64_t i) {
    return rng_mix(rng_mix(seed * 0x9E3779B97F4A7C15ull + salt) + i * 0xD1B54A32D192ED03ull);
}
/* Uniform in (0, 1), exactly representable as a float. */
static inline double rng_uniform(uint64_t seed, uint64_t salt, uint64_t i) {
    return ((double)(rng_bits(seed, salt, i) >> 40) + 0.5) * (1.0 / 16777216.0);
}
/* Standard normal by Box-Muller on the uniforms of indices 2i and 2i+1. */
static inline double rng_normal(uint64_t seed, uint64_t salt, uint64_t i) {
    double u1 = rng_uniform(seed, salt, 2 * i), u2 = rng_uniform(seed, salt, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The most sources a node has (ATTENTION_BWD). */
#define TG_MAX_SRC 6

typedef struct {
    tg_op op;
    tg_dtype dtype;
    tg_shape shape;
    int64_t numel;
    int nsrc;
    int src[TG_MAX_SRC];
    int axis;                       /* non-negative after the shape rule */
    int64_t iarg[TG_MAX_DIMS];
    double farg;
    const char *name;               /* owned by the graph (inputs, params) or NULL */
    tg_site site;
} tg_node;

/* A write-back: after the graph ran (and only if the step succeeded), the persistent leaf `dst`
 * (PARAM or STATE) takes the value of node `src`. This is how the optimizer updates state. */
typedef struct { int dst, src; } tg_assign;

/* A named place in a forward (tg_capture, tg_patch): `node` holds the value there. A patch site
 * of a patchable trace also has its replacement INPUT node and its two HYPER slots (replace,
 * then batch mean; each 0 or 1 per call); -1 otherwise. */
typedef struct { char *name; int node, input, hyper; } tg_named;

struct tg_graph {
    tg_node *nodes;
    int n, cap;
    int output;                     /* loss or forward output */
    int guard;                      /* training graphs: finite only when the loss and every gradient
                                     * are (see optim_build), or the loss where the backend checks
                                     * the written values itself; write-backs wait on it. -1: none */
    tg_model *model;
    int *param_node;                /* per model param id: its PARAM node here, or -1 */
    int n_params;
    int *grad_of_param;             /* per model param id: node holding d loss / d param, or -1 */
    int n_state;                    /* OP_STATE slots used */
    int *state_shape_node;          /* per state slot: the PARAM node whose shape it has */
    tg_assign *assigns;
    int n_assigns, cap_assigns;
    int n_hyper;                    /* HYPER slots used */
    tg_named *captures, *patches;
    int n_captures, n_patches;
    bool patchable;                 /* set before tracing: patch sites select their values */
    int product_align;              /* set before tracing: pad weights' rows to a multiple of it (0: never) */
    bool group_products;            /* set before the gradient: sibling products' gradients grouped (grad.c) */
    tg_precision precision;         /* what products and attention compute in (never DEFAULT) */
    char error[TG_ERROR_LEN];       /* first trace error; empty if none */
};

/* ir.c */
tg_graph *ir_new(tg_model *m);
void ir_free(tg_graph *g);
int ir_add(tg_graph *g, tg_site s, tg_op op, tg_dtype dt, tg_shape shape, int nsrc, const int *src);
bool ir_ok(const tg_graph *g);
void ir_fail(tg_graph *g, tg_site s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void ir_add_assign(tg_graph *g, int dst, int src);
const char *op_name(tg_op op);
int64_t shape_numel(tg_shape s);
/* "[64,3]" into buf (at least 96 bytes), returns buf. */
char *shape_str(tg_shape s, char *buf);
void tg__set_trace(tg_graph *g);   /* the graph ops append to on this thread (NULL: none) */
tg_graph *tg__trace(void);
static inline tg_tensor mk_tensor(tg_graph *g, int id) { tg_tensor t = { g, id }; return t; }
static inline const tg_node *node_of(tg_tensor t) { return &t.g->nodes[t.id]; }

static inline bool shapes_equal(tg_shape a, tg_shape b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

/* shape.c: shape rules. Each returns false after recording an error on g. */
bool shape_broadcast(tg_graph *g, tg_site s, const char *op, tg_shape a, tg_shape b, tg_shape *out);
bool shape_axis(tg_graph *g, tg_site s, const char *op, tg_shape x, int axis, int *out);
bool shape_matmul(tg_graph *g, tg_site s, tg_shape a, tg_shape b, tg_shape *out);
bool shape_reshape(tg_graph *g, tg_site s, tg_shape x, tg_shape want, tg_shape *out);
bool shape_permute(tg_graph *g, tg_site s, tg_shape x, tg_shape order, tg_shape *out);
/* q [.., T, D], k [.., S, D], v [.., S, E] with equal leading dims -> [.., T, E]. */
bool shape_attention(tg_graph *g, tg_site s, tg_shape q, tg_shape k, tg_shape v, tg_shape *out);
bool shape_valid(tg_graph *g, tg_site s, const char *op, tg_shape x);

/* ops.c: internal builders without the public macros' argument checks. */
tg_tensor op_unary(tg_site s, tg_op op, tg_tensor x);
tg_tensor op_binary(tg_site s, tg_op op, tg_tensor a, tg_tensor b);
tg_tensor op_sum_keep(tg_site s, tg_tensor x, int axis);     /* axis already normalised */
tg_tensor op_reshape(tg_site s, tg_tensor x, tg_shape shape);
tg_tensor op_expand(tg_site s, tg_tensor x, tg_shape shape);
tg_tensor op_matmul_t(tg_site s, tg_tensor a, tg_tensor b, int ta, int tb);
tg_tensor op_const(tg_graph *g, tg_site s, double v, tg_dtype dt);
tg_tensor op_hyper(tg_graph *g, int slot);
tg_tensor op_state(tg_graph *g, int like_param_node);
tg_tensor op_scatter_rows(tg_site s, tg_tensor vals, tg_tensor idx, int64_t rows);
/* Attention (checked operands): the ATTENTION node, with its ATTENTION_LSE node after it. */
tg_tensor op_attention(tg_site s, tg_tensor q, tg_tensor k, tg_tensor v, bool causal, double scale);
/* Where an attention operand of rows of W values holds the first row of batch element b (of T
 * rows): b's rows one after another, or with h > 0 (graph.h's iarg[3]; ATTENTION_BWD's out by
 * iarg[2]) those of h heads interleaved ([.., T, h, W]); each next row is attn_stride further. */
static inline int64_t attn_row(int64_t b, int64_t T, int64_t W, int64_t h) {
    return h > 1 ? ((b / h) * T * h + b % h) * W : b * T * W;
}
static inline int64_t attn_stride(int64_t W, int64_t h) { return h > 1 ? h * W : W; }
/* The same for the gradients of an ATTENTION_BWD node packed pk to a row (iarg[1] = 3: pk = 3, the
 * heads interleaved, h > 0; the part of dk, dv h W, 2 h W further), rows attn_stride(W, h) pk
 * apart. */
static inline int64_t attn_row_packed(int64_t b, int64_t T, int64_t W, int64_t h, int64_t pk) {
    return pk > 1 ? ((b / h) * T * h * pk + b % h) * W : attn_row(b, T, W, h);
}
/* An f32 node of op `op` carrying the axis/iarg/farg of node `like` (gradient rules use it to
 * emit adjoints: slice for pad, col2im for im2col, the same dropout mask). */
tg_tensor op_mirror(tg_graph *g, tg_site s, tg_op op, int like, tg_shape shape, int nsrc, const int *src);
/* Sum x down to `shape` over the axes NumPy broadcasting added or stretched (gradient of a
 * broadcast). */
tg_tensor op_unbroadcast(tg_site s, tg_tensor x, tg_shape shape);

/* grad.c: appends the nodes of d(loss)/d(wrt[i]) for each i (loss must be a scalar node);
 * grad_out[i] is the gradient node, or a zero constant expanded to the shape when wrt[i] does
 * not affect the loss. Returns false (with g->error set) on failure. */
bool grad_build(tg_graph *g, int loss, const int *wrt, int n_wrt, int *grad_out);

/* model.c */
typedef struct {
    char *name;
    tg_shape shape;
    tg_init init;      /* literal data owned by the model */
    int decay;         /* resolved */
} tg_param_spec;
const tg_param_spec *model_param(const tg_model *m, int id);
int model_find(const tg_model *m, const char *name);
/* Fill dst with the param's initial values, drawn from the model's seed: the same seed gives the
 * same values, independent of other params (each param has its own stream keyed by its name). */
void model_init_param(const tg_model *m, int id, double *dst);

/* optim.c: append the optimizer update of every parameter that has a gradient, and, with guard,
 * the step's guard (g->guard; else the loss). Hyper slots: see optim.c (lr and bias corrections
 * the host computes per step). */
bool optim_build(tg_graph *g, const tg_optimizer *opt, bool guard);
/* Per-step host scalars for step t (1-based) at learning rate lr. */
void optim_hyper(const tg_optimizer *opt, int64_t t, double lr, double *hyper);

#endif
