/* Op builders: each public op checks its operands (dtype, graph, shape rule), then appends a node.
 * Composite ops (mean, cross_entropy, ...) are written in terms of the primitive nodes, so their
 * gradients come for free. */
#include "graph/graph.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tg_tensor BAD = { NULL, -1 };
static tg_tensor bad(tg_graph *g) { tg_tensor t = { g, -1 }; return t; }

/* Internal builders read their operands' nodes before appending: after the first error (a
 * shape too large, memory) an operand may be the invalid result of the failed op. */
static bool live(tg_tensor t) { return t.g && ir_ok(t.g) && t.id >= 0 && t.id < t.g->n; }

static tg_tensor emit(tg_graph *g, tg_site s, tg_op op, tg_dtype dt, tg_shape shape, int nsrc, const int *src) {
    if (!ir_ok(g)) return bad(g);
    return mk_tensor(g, ir_add(g, s, op, dt, shape, nsrc, src));
}

/* A tensor operand is usable when it belongs to the graph being traced and that graph has no
 * error yet. Errors are recorded on the traced graph, never on the tensor's: another graph may
 * be compiled already. Outside tracing there is no graph to record an error on (and appending
 * to a compiled graph would change what a backend planned), so the result is just an invalid
 * tensor. */
static bool usable(tg_site s, const char *op, tg_tensor x) {
    tg_graph *g = tg__trace();
    if (!g || !ir_ok(g)) return false;
    if (x.g && x.g != g) { ir_fail(g, s, "%s: tensor belongs to another graph", op); return false; }
    if (!x.g || x.id < 0 || x.id >= g->n) { ir_fail(g, s, "%s: invalid tensor (from a failed op or outside tracing)", op); return false; }
    return true;
}

static bool same_graph(tg_site s, const char *op, tg_tensor a, tg_tensor b) {
    if (!usable(s, op, a) || !usable(s, op, b)) return false;
    if (a.g != b.g) { ir_fail(a.g, s, "%s: operands belong to two different graphs", op); return false; }
    return true;
}

static bool need_f32(tg_site s, const char *op, tg_tensor x) {
    if (node_of(x)->dtype == TG_FLOAT32) return true;
    ir_fail(x.g, s, "%s: needs an f32 tensor, got i32", op);
    return false;
}

static bool need_i32(tg_site s, const char *op, const char *what, tg_tensor x) {
    if (node_of(x)->dtype == TG_INT32) return true;
    ir_fail(x.g, s, "%s: %s must be i32, got f32", op, what);
    return false;
}

/* ----- leaves ----- */

tg_tensor op_const(tg_graph *g, tg_site s, double v, tg_dtype dt) {
    /* An i32 constant holds a 32-bit integer: 0.5, NaN or 1e30 meeting an i32 tensor is an
     * error, not a value each backend would convert its own way. */
    if (dt == TG_INT32 && !(v == trunc(v) && v >= INT32_MIN && v <= INT32_MAX)) {
        ir_fail(g, s, "%g is not a 32-bit integer: an i32 tensor meets only whole numbers", v);
        return bad(g);
    }
    tg_tensor t = emit(g, s, OP_CONST, dt, TG_SHAPE0, 0, NULL);
    if (t.id >= 0) g->nodes[t.id].farg = v;
    return t;
}

tg_tensor op_hyper(tg_graph *g, int slot) {
    tg_tensor t = emit(g, TG_HERE, OP_HYPER, TG_FLOAT32, TG_SHAPE0, 0, NULL);
    if (t.id >= 0) g->nodes[t.id].iarg[0] = slot;
    if (slot >= g->n_hyper) g->n_hyper = slot + 1;
    return t;
}

tg_tensor op_state(tg_graph *g, int like_param_node) {
    const tg_node *p = &g->nodes[like_param_node];
    tg_tensor t = emit(g, p->site, OP_STATE, TG_FLOAT32, p->shape, 0, NULL);
    if (t.id < 0) return t;
    g->nodes[t.id].iarg[0] = g->n_state;
    int *grown = tg_realloc(g->state_shape_node, sizeof(int) * (size_t)(g->n_state + 1));
    if (!grown) {
        ir_fail(g, g->nodes[like_param_node].site, "out of memory for optimizer state");
        return bad(g);
    }
    g->state_shape_node = grown;
    g->state_shape_node[g->n_state++] = like_param_node;
    return t;
}

tg_tensor tg_scalar_at(tg_site s, double v) {
    tg_graph *g = tg__trace();
    return g ? op_const(g, s, v, TG_FLOAT32) : BAD;
}

tg_tensor tg__number(double v) { return tg_scalar_at((tg_site){ "(number)", 0 }, v); }

tg_tensor tg_p_at(tg_site s, tg_param p) {
    tg_graph *g = tg__trace();
    if (!g || !ir_ok(g)) return bad(g);
    if (p.id < 0 || p.model != g->model || p.id >= g->n_params) {
        ir_fail(g, s, "tg_p: %s", p.id < 0 ? "invalid parameter (its declaration failed)"
                                  : p.model != g->model ? "parameter of another model"
                                                        : "parameter id out of range for this model");
        return bad(g);
    }
    if (g->param_node[p.id] >= 0) return mk_tensor(g, g->param_node[p.id]);
    const tg_param_spec *ps = model_param(g->model, p.id);
    tg_tensor t = emit(g, s, OP_PARAM, TG_FLOAT32, ps->shape, 0, NULL);
    if (t.id < 0) return t;
    g->nodes[t.id].iarg[0] = p.id;
    g->nodes[t.id].name = ps->name;
    g->param_node[p.id] = t.id;
    return t;
}

tg_shape tg_shape_of(tg_tensor t) { return (t.g && t.id >= 0 && t.id < t.g->n) ? node_of(t)->shape : TG_SHAPE0; }
tg_dtype tg_dtype_of(tg_tensor t) { return (t.g && t.id >= 0 && t.id < t.g->n) ? node_of(t)->dtype : TG_FLOAT32; }

/* ----- elementwise ----- */

tg_tensor op_unary(tg_site s, tg_op op, tg_tensor x) {
    if (!live(x)) return bad(x.g);
    const tg_node *n = node_of(x);
    return emit(x.g, s, op, n->dtype, n->shape, 1, &x.id);
}

/* A plain number meeting an i32 tensor becomes an i32 constant (2 * idx stays integral). */
static tg_tensor adopt_dtype(tg_site s, tg_tensor num, tg_dtype dt) {
    if (!live(num)) return num;
    const tg_node *n = node_of(num);
    if (n->dtype == dt || n->op != OP_CONST || n->shape.ndim != 0) return num;
    return op_const(num.g, s, n->farg, dt);
}

tg_tensor op_binary(tg_site s, tg_op op, tg_tensor a, tg_tensor b) {
    if (!live(a) || !live(b)) return bad(a.g);
    tg_shape out;
    char name[40];
    snprintf(name, sizeof name, "tg_%s", op_name(op));
    if (!shape_broadcast(a.g, s, name, node_of(a)->shape, node_of(b)->shape, &out)) return bad(a.g);
    tg_dtype dt = (op == OP_LESS || op == OP_GREATER || op == OP_EQUAL) ? TG_FLOAT32 : node_of(a)->dtype;
    int src[2] = { a.id, b.id };
    return emit(a.g, s, op, dt, out, 2, src);
}

static tg_tensor binary(tg_site s, const char *name, tg_op op, tg_tensor a, tg_tensor b) {
    if (!same_graph(s, name, a, b)) return bad(a.g ? a.g : b.g);
    b = adopt_dtype(s, b, node_of(a)->dtype);
    if (live(b)) a = adopt_dtype(s, a, node_of(b)->dtype);
    if (!live(a) || !live(b)) return bad(a.g);   /* a number that is no i32 */
    if (node_of(a)->dtype != node_of(b)->dtype) {
        ir_fail(a.g, s, "%s: operand dtypes differ (%s vs %s)", name, node_of(a)->dtype == TG_INT32 ? "i32" : "f32",
                node_of(b)->dtype == TG_INT32 ? "i32" : "f32");
        return bad(a.g);
    }
    if (!ir_ok(a.g)) return bad(a.g);
    return op_binary(s, op, a, b);
}

tg_tensor tg_add_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_add", OP_ADD, a, b); }
tg_tensor tg_sub_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_sub", OP_SUB, a, b); }
tg_tensor tg_mul_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_mul", OP_MUL, a, b); }
tg_tensor tg_div_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_div", OP_DIV, a, b); }
tg_tensor tg_minimum_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_minimum", OP_MIN, a, b); }
tg_tensor tg_maximum_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_maximum", OP_MAX, a, b); }
tg_tensor tg_less_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_less", OP_LESS, a, b); }
tg_tensor tg_greater_at(tg_site s, tg_tensor a, tg_tensor b) { return binary(s, "tg_greater", OP_GREATER, a, b); }

tg_tensor tg_where_at(tg_site s, tg_tensor c, tg_tensor a, tg_tensor b) {
    if (!same_graph(s, "tg_where", a, b) || !same_graph(s, "tg_where", c, a)) return bad(a.g ? a.g : b.g);
    b = adopt_dtype(s, b, node_of(a)->dtype);
    if (live(b)) a = adopt_dtype(s, a, node_of(b)->dtype);
    if (!live(a) || !live(b)) return bad(a.g);   /* a number that is no i32 */
    if (node_of(a)->dtype != node_of(b)->dtype) { ir_fail(a.g, s, "tg_where: the two branches' dtypes differ"); return bad(a.g); }
    tg_shape ab, out;
    if (!shape_broadcast(a.g, s, "tg_where", node_of(a)->shape, node_of(b)->shape, &ab) ||
        !shape_broadcast(a.g, s, "tg_where (condition)", node_of(c)->shape, ab, &out))
        return bad(a.g);
    int src[3] = { c.id, a.id, b.id };
    return emit(a.g, s, OP_WHERE, node_of(a)->dtype, out, 3, src);
}

static tg_tensor unary(tg_site s, const char *name, tg_op op, tg_tensor x, bool float_only) {
    if (!usable(s, name, x)) return bad(x.g);
    if (float_only && !need_f32(s, name, x)) return bad(x.g);
    return op_unary(s, op, x);
}

tg_tensor tg_neg_at(tg_site s, tg_tensor x) { return unary(s, "tg_neg", OP_NEG, x, false); }
tg_tensor tg_abs_at(tg_site s, tg_tensor x) { return unary(s, "tg_abs", OP_ABS, x, false); }
tg_tensor tg_square_at(tg_site s, tg_tensor x) { return unary(s, "tg_square", OP_SQUARE, x, false); }
tg_tensor tg_sqrt_at(tg_site s, tg_tensor x) { return unary(s, "tg_sqrt", OP_SQRT, x, true); }
tg_tensor tg_rsqrt_at(tg_site s, tg_tensor x) { return unary(s, "tg_rsqrt", OP_RSQRT, x, true); }
tg_tensor tg_exp_at(tg_site s, tg_tensor x) { return unary(s, "tg_exp", OP_EXP, x, true); }
tg_tensor tg_log_at(tg_site s, tg_tensor x) { return unary(s, "tg_log", OP_LOG, x, true); }
tg_tensor tg_relu_at(tg_site s, tg_tensor x) { return unary(s, "tg_relu", OP_RELU, x, true); }
tg_tensor tg_tanh_at(tg_site s, tg_tensor x) { return unary(s, "tg_tanh", OP_TANH, x, true); }
tg_tensor tg_sigmoid_at(tg_site s, tg_tensor x) { return unary(s, "tg_sigmoid", OP_SIGMOID, x, true); }

/* ----- reductions ----- */

tg_tensor op_sum_keep(tg_site s, tg_tensor x, int axis) {
    if (!live(x)) return bad(x.g);
    tg_shape out = node_of(x)->shape;
    out.d[axis] = 1;
    tg_tensor t = emit(x.g, s, OP_SUM, node_of(x)->dtype, out, 1, &x.id);
    if (t.id >= 0) x.g->nodes[t.id].axis = axis;
    return t;
}

static tg_shape drop_axis(tg_shape x, int axis) {
    for (int i = axis; i + 1 < x.ndim; i++) x.d[i] = x.d[i + 1];
    x.ndim--;
    return x;
}

static tg_tensor reduce_sum(tg_site s, const char *name, tg_tensor x, int axis, int keepdims) {
    if (!usable(s, name, x)) return bad(x.g);
    tg_shape in = node_of(x)->shape;
    if (axis == TG_ALL) {
        tg_tensor flat = op_reshape(s, x, TG_SHAPE(shape_numel(in)));
        tg_tensor r = op_sum_keep(s, flat, 0);
        tg_shape out = in;
        for (int i = 0; i < out.ndim; i++) out.d[i] = 1;
        if (!keepdims) out.ndim = 0;
        return r.id < 0 ? r : op_reshape(s, r, out);
    }
    int a;
    if (!shape_axis(x.g, s, name, in, axis, &a)) return bad(x.g);
    tg_tensor r = op_sum_keep(s, x, a);
    return (keepdims || r.id < 0) ? r : op_reshape(s, r, drop_axis(in, a));
}

tg_tensor tg_sum_at(tg_site s, tg_tensor x, int axis, int keepdims) { return reduce_sum(s, "tg_sum", x, axis, keepdims); }

tg_tensor tg_mean_at(tg_site s, tg_tensor x, int axis, int keepdims) {
    if (!usable(s, "tg_mean", x) || !need_f32(s, "tg_mean", x)) return bad(x.g);
    tg_shape in = node_of(x)->shape;
    int64_t n = shape_numel(in);
    if (axis != TG_ALL) {
        int a;
        if (!shape_axis(x.g, s, "tg_mean", in, axis, &a)) return bad(x.g);
        n = in.d[a];
    }
    tg_tensor r = reduce_sum(s, "tg_mean", x, axis, keepdims);
    if (r.id < 0) return r;
    return op_binary(s, OP_MUL, r, op_const(x.g, s, 1.0 / (double)n, TG_FLOAT32));
}

/* ----- movement ----- */

tg_tensor op_reshape(tg_site s, tg_tensor x, tg_shape shape) {
    if (!live(x)) return bad(x.g);
    if (shapes_equal(node_of(x)->shape, shape)) return x;
    return emit(x.g, s, OP_RESHAPE, node_of(x)->dtype, shape, 1, &x.id);
}

tg_tensor op_expand(tg_site s, tg_tensor x, tg_shape shape) {
    if (!live(x)) return bad(x.g);
    if (shapes_equal(node_of(x)->shape, shape)) return x;
    return emit(x.g, s, OP_EXPAND, node_of(x)->dtype, shape, 1, &x.id);
}

tg_tensor tg_reshape_at(tg_site s, tg_tensor x, tg_shape shape) {
    tg_shape out;
    if (!usable(s, "tg_reshape", x) || !shape_reshape(x.g, s, node_of(x)->shape, shape, &out)) return bad(x.g);
    return op_reshape(s, x, out);
}

tg_tensor tg_permute_at(tg_site s, tg_tensor x, tg_shape order) {
    tg_shape out;
    if (!usable(s, "tg_permute", x) || !shape_permute(x.g, s, node_of(x)->shape, order, &out)) return bad(x.g);
    bool identity = true;
    for (int i = 0; i < order.ndim; i++) {
        if (order.d[i] < 0) order.d[i] += order.ndim;
        identity = identity && order.d[i] == i;
    }
    if (identity) return x;
    const tg_node *p = node_of(x);   /* a permute undoing the one before it: that one's source */
    bool undoes = p->op == OP_PERMUTE;
    for (int i = 0; undoes && i < order.ndim; i++) undoes = p->iarg[order.d[i]] == i;
    if (undoes) return mk_tensor(x.g, p->src[0]);
    tg_tensor t = emit(x.g, s, OP_PERMUTE, node_of(x)->dtype, out, 1, &x.id);
    if (t.id >= 0)
        for (int i = 0; i < order.ndim; i++) x.g->nodes[t.id].iarg[i] = order.d[i];
    return t;
}

tg_tensor tg_swapaxes_at(tg_site s, tg_tensor x, int a, int b) {
    if (!usable(s, "tg_swapaxes", x)) return bad(x.g);
    tg_shape in = node_of(x)->shape;
    int ia, ib;
    if (!shape_axis(x.g, s, "tg_swapaxes", in, a, &ia) || !shape_axis(x.g, s, "tg_swapaxes", in, b, &ib)) return bad(x.g);
    tg_shape order = { in.ndim, { 0 } };
    for (int i = 0; i < in.ndim; i++) order.d[i] = i;
    order.d[ia] = ib;
    order.d[ib] = ia;
    return tg_permute_at(s, x, order);
}

/* Sum x down to `shape`: over the leading axes broadcasting added and the axes it stretched
 * from 1. */
tg_tensor op_unbroadcast(tg_site s, tg_tensor x, tg_shape shape) {
    if (!live(x)) return bad(x.g);
    tg_shape xs = node_of(x)->shape;
    if (shapes_equal(xs, shape)) return x;
    int lead = xs.ndim - shape.ndim;
    for (int i = 0; i < xs.ndim && x.id >= 0; i++) {
        bool stretched = i < lead || (shape.d[i - lead] == 1 && xs.d[i] != 1);
        if (stretched) x = op_sum_keep(s, x, i);
    }
    return x.id < 0 ? x : op_reshape(s, x, shape);
}

/* ----- matrix product ----- */

static tg_shape transpose_last2(tg_shape x) {
    int64_t t = x.d[x.ndim - 1];
    x.d[x.ndim - 1] = x.d[x.ndim - 2];
    x.d[x.ndim - 2] = t;
    return x;
}

tg_tensor op_matmul_t(tg_site s, tg_tensor a, tg_tensor b, int ta, int tb) {
    if (!live(a) || !live(b)) return bad(a.g);
    tg_shape sa = node_of(a)->shape, sb = node_of(b)->shape, out;
    if (ta) sa = transpose_last2(sa);
    if (tb) sb = transpose_last2(sb);
    if (!shape_matmul(a.g, s, sa, sb, &out)) return bad(a.g);
    int src[2] = { a.id, b.id };
    tg_tensor t = emit(a.g, s, OP_MATMUL, TG_FLOAT32, out, 2, src);
    if (t.id >= 0) {
        a.g->nodes[t.id].iarg[0] = ta;
        a.g->nodes[t.id].iarg[1] = tb;
    }
    return t;
}

/* ----- attention ----- */

/* Is node p a PERMUTE that swaps axes -3 and -2 of its source and keeps the others (a model's
 * split of heads, [.., T, H, D] -> [.., H, T, D])? */
static bool splits_heads(const tg_node *p) {
    const int nd = p->shape.ndim;
    bool swap = p->op == OP_PERMUTE && nd >= 3;
    for (int i = 0; swap && i < nd; i++) swap = p->iarg[i] == (i == nd - 3 ? nd - 2 : i == nd - 2 ? nd - 3 : i);
    return swap;
}

/* Attention over operands given as they are, or (all three splits of heads) over the splits'
 * sources with the heads interleaved (graph.h: iarg[3]), its output swapped back for the caller:
 * a model's split of heads and its merge (tg_permute_at cancels the swaps) copy nothing then. */
tg_tensor op_attention(tg_site s, tg_tensor q, tg_tensor k, tg_tensor v, bool causal, double scale) {
    if (!live(q) || !live(k) || !live(v)) return bad(q.g);
    tg_shape out;
    if (!shape_attention(q.g, s, node_of(q)->shape, node_of(k)->shape, node_of(v)->shape, &out)) return bad(q.g);
    tg_graph *g = q.g;
    const bool heads = splits_heads(node_of(q)) && splits_heads(node_of(k)) && splits_heads(node_of(v));
    const int nd = out.ndim;
    tg_shape rows = out, made = out;   /* rows: [.., H, T] either way */
    rows.ndim--;
    if (heads) {
        made.d[nd - 3] = out.d[nd - 2];
        made.d[nd - 2] = out.d[nd - 3];
    }
    int src[3] = { q.id, k.id, v.id };
    for (int i = 0; heads && i < 3; i++) src[i] = g->nodes[src[i]].src[0];
    tg_tensor t = emit(g, s, OP_ATTENTION, TG_FLOAT32, made, 3, src);
    if (t.id < 0) return t;
    g->nodes[t.id].iarg[0] = causal;
    g->nodes[t.id].iarg[3] = heads ? out.d[nd - 3] : 0;
    g->nodes[t.id].farg = scale;
    if (op_mirror(g, s, OP_ATTENTION_LSE, t.id, rows, 2, src).id < 0) return bad(g);
    return heads ? tg_swapaxes_at(s, t, -3, -2) : t;
}

tg_tensor tg_attention_at(tg_site s, tg_tensor q, tg_tensor k, tg_tensor v, int causal, double scale) {
    const char *name = "tg_attention";
    if (!same_graph(s, name, q, k) || !same_graph(s, name, q, v) || !need_f32(s, name, q) || !need_f32(s, name, k) ||
        !need_f32(s, name, v))
        return bad(q.g ? q.g : k.g);
    if (!isfinite(scale)) { ir_fail(q.g, s, "tg_attention: scale %g is not finite", scale); return bad(q.g); }
    return op_attention(s, q, k, v, causal != 0, scale);
}

/* Is node p a PERMUTE that swaps the last two axes of its source and keeps the others? */
static bool swaps_last_two(const tg_node *p) {
    int nd = p->shape.ndim;
    if (p->op != OP_PERMUTE || nd < 2 || p->iarg[nd - 2] != nd - 1 || p->iarg[nd - 1] != nd - 2) return false;
    for (int i = 0; i < nd - 2; i++)
        if (p->iarg[i] != i) return false;
    return true;
}

/* Attention written out, softmax(q @ kᵀ * c) @ v, with softmax_causal or a softmax over the last
 * axis and c a plain number (multiplied on either side, divided, or absent): true with its
 * operands when node a (the softmax) and v complete one. Operands whose shapes attention does
 * not take (broadcast batch dimensions) are left as written. */
static bool attention_pattern(const tg_graph *g, int a, int v, int *q, int *k, bool *causal, double *scale) {
    const tg_node *sm = &g->nodes[a];
    bool last_axis = sm->op == OP_SOFTMAX && sm->axis == sm->shape.ndim - 1;
    if (sm->op != OP_SOFTMAX_CAUSAL && !last_axis) return false;
    *causal = sm->op == OP_SOFTMAX_CAUSAL;
    *scale = 1;
    const tg_node *x = &g->nodes[sm->src[0]];
    if (x->op == OP_MUL || x->op == OP_DIV) {
        int kc = g->nodes[x->src[1]].op == OP_CONST ? 1 : x->op == OP_MUL && g->nodes[x->src[0]].op == OP_CONST ? 0 : -1;
        const tg_node *c = kc >= 0 ? &g->nodes[x->src[kc]] : NULL;
        if (!c || c->shape.ndim != 0 || (x->op == OP_DIV && c->farg == 0)) return false;
        *scale = x->op == OP_DIV ? 1.0 / c->farg : c->farg;
        x = &g->nodes[x->src[1 - kc]];
    }
    if (x->op != OP_MATMUL || x->iarg[0] != 0) return false;
    const tg_node *kt = &g->nodes[x->src[1]];
    *q = x->src[0];
    if (x->iarg[1]) *k = x->src[1];
    else if (swaps_last_two(kt)) *k = kt->src[0];
    else return false;
    const tg_shape qs = g->nodes[*q].shape, ks = g->nodes[*k].shape, vs = g->nodes[v].shape;
    bool same_lead = qs.ndim >= 2 && ks.ndim == qs.ndim && vs.ndim == qs.ndim;
    for (int i = 0; same_lead && i < qs.ndim - 2; i++) same_lead = qs.d[i] == ks.d[i] && qs.d[i] == vs.d[i];
    return same_lead && isfinite(*scale) && !getenv("TG_NO_FUSE");
}

static tg_tensor op_slice_pad(tg_site s, tg_op op, tg_tensor x, int axis, int64_t start, int64_t length);

/* The width a weight b [K, N] is padded to before a product (graph->product_align), or 0 to
 * leave it: a parameter (or one transposed) whose rows are not a multiple of the alignment and
 * at least 8 alignments long, so that padding adds at most 12.5% to the product (cuBLAS's
 * unaligned kernels are several times slower: char_gpt's head of 65, its product and two
 * gradients took 62 us a step on them, 26 padded to 72, 35 with the pad and the narrowing; bf16,
 * H100) and never touches an attention's operands. */
static int64_t padded_width(const tg_graph *g, int b) {
    const tg_node *w = &g->nodes[b];
    int64_t align = g->product_align, n = w->shape.ndim == 2 ? w->shape.d[1] : 0;
    if (align <= 1 || n % align == 0 || n < 8 * align) return 0;
    bool weight = w->op == OP_PARAM || (swaps_last_two(w) && g->nodes[w->src[0]].op == OP_PARAM);
    return weight ? (n + align - 1) / align * align : 0;
}

tg_tensor tg_matmul_at(tg_site s, tg_tensor a, tg_tensor b) {
    if (!same_graph(s, "tg_matmul", a, b) || !need_f32(s, "tg_matmul", a) || !need_f32(s, "tg_matmul", b))
        return bad(a.g ? a.g : b.g);
    int q, k;
    bool causal;
    double scale;
    if (attention_pattern(a.g, a.id, b.id, &q, &k, &causal, &scale))
        return op_attention(s, mk_tensor(a.g, q), mk_tensor(a.g, k), b, causal, scale);
    int64_t wide = padded_width(a.g, b.id);
    if (!wide) return op_matmul_t(s, a, b, 0, 0);
    /* Zero columns in, narrowed out: the same values, and a vocabulary of 50257 no longer puts
     * the forward product and both its gradients on cuBLAS's unaligned kernels (4-5x slower) */
    tg_tensor y = op_matmul_t(s, a, op_slice_pad(s, OP_PAD, b, 1, 0, wide), 0, 0);
    return live(y) ? op_slice_pad(s, OP_SLICE, y, node_of(y)->shape.ndim - 1, 0, node_of(b)->shape.d[1]) : y;
}

/* ----- indexing ----- */

static bool append_dim(tg_graph *g, tg_site s, const char *op, tg_shape x, int64_t d, tg_shape *out) {
    if (x.ndim >= TG_MAX_DIMS) { ir_fail(g, s, "%s: result would have more than %d dimensions", op, TG_MAX_DIMS); return false; }
    *out = x;
    out->d[out->ndim++] = d;
    return true;
}

tg_tensor tg_one_hot_at(tg_site s, tg_tensor idx, int64_t n) {
    tg_shape out;
    if (!usable(s, "tg_one_hot", idx) || !need_i32(s, "tg_one_hot", "indices", idx)) return bad(idx.g);
    if (n <= 0) { ir_fail(idx.g, s, "tg_one_hot: class count %lld must be positive", (long long)n); return bad(idx.g); }
    if (!append_dim(idx.g, s, "tg_one_hot", node_of(idx)->shape, n, &out)) return bad(idx.g);
    tg_tensor t = emit(idx.g, s, OP_ONE_HOT, TG_FLOAT32, out, 1, &idx.id);
    if (t.id >= 0) idx.g->nodes[t.id].iarg[0] = n;
    return t;
}

tg_tensor tg_embedding_at(tg_site s, tg_tensor table, tg_tensor idx) {
    if (!same_graph(s, "tg_embedding", table, idx) || !need_f32(s, "tg_embedding", table) ||
        !need_i32(s, "tg_embedding", "indices", idx))
        return bad(table.g ? table.g : idx.g);
    tg_shape ts = node_of(table)->shape, out;
    char st[96];
    if (ts.ndim != 2) { ir_fail(table.g, s, "tg_embedding: table %s must be 2-D [vocab, dim]", shape_str(ts, st)); return bad(table.g); }
    if (!append_dim(table.g, s, "tg_embedding", node_of(idx)->shape, ts.d[1], &out)) return bad(table.g);
    int src[2] = { table.id, idx.id };
    return emit(table.g, s, OP_GATHER_ROWS, TG_FLOAT32, out, 2, src);
}

tg_tensor op_scatter_rows(tg_site s, tg_tensor vals, tg_tensor idx, int64_t rows) {
    if (!live(vals) || !live(idx)) return bad(vals.g);
    tg_shape vs = node_of(vals)->shape;
    tg_shape out = TG_SHAPE(rows, vs.d[vs.ndim - 1]);
    int src[2] = { vals.id, idx.id };
    return emit(vals.g, s, OP_SCATTER_ROWS, TG_FLOAT32, out, 2, src);
}

/* ----- softmax and losses ----- */

static tg_tensor softmax_like(tg_site s, const char *name, tg_op op, tg_tensor x, int axis) {
    int a;
    if (!usable(s, name, x) || !need_f32(s, name, x) || !shape_axis(x.g, s, name, node_of(x)->shape, axis, &a))
        return bad(x.g);
    tg_tensor t = op_unary(s, op, x);
    if (t.id >= 0) x.g->nodes[t.id].axis = a;
    return t;
}

tg_tensor tg_softmax_at(tg_site s, tg_tensor x, int axis) { return softmax_like(s, "tg_softmax", OP_SOFTMAX, x, axis); }
tg_tensor tg_log_softmax_at(tg_site s, tg_tensor x, int axis) { return softmax_like(s, "tg_log_softmax", OP_LOG_SOFTMAX, x, axis); }

/* logp [..., C] and targets [...] must agree on the leading dims. */
static bool check_targets(tg_site s, const char *name, tg_tensor logp, tg_tensor targets) {
    if (!same_graph(s, name, logp, targets) || !need_f32(s, name, logp) || !need_i32(s, name, "targets", targets))
        return false;
    tg_shape ls = node_of(logp)->shape, ts = node_of(targets)->shape;
    bool ok = ls.ndim >= 1 && ts.ndim == ls.ndim - 1;
    for (int i = 0; ok && i < ts.ndim; i++) ok = ls.d[i] == ts.d[i];
    if (!ok) {
        char a[96], b[96];
        ir_fail(logp.g, s, "%s: scores %s and targets %s: targets must have the scores' shape without the class axis",
                name, shape_str(ls, a), shape_str(ts, b));
    }
    return ok;
}

static tg_tensor reduce_loss(tg_site s, tg_tensor per_item, tg_reduction r) {
    if (per_item.id >= 0 && r != TG_MEAN && r != TG_SUM && r != TG_NONE) {
        ir_fail(per_item.g, s, "unknown reduction %d (TG_MEAN, TG_SUM or TG_NONE)", (int)r);
        return bad(per_item.g);
    }
    if (r == TG_NONE || per_item.id < 0) return per_item;
    return r == TG_SUM ? tg_sum_at(s, per_item, TG_ALL, 0) : tg_mean_at(s, per_item, TG_ALL, 0);
}

static tg_tensor nll(tg_site s, tg_tensor logp, tg_tensor targets, tg_reduction r) {
    tg_shape ls = node_of(logp)->shape;
    tg_tensor hot = tg_one_hot_at(s, targets, ls.d[ls.ndim - 1]);
    tg_tensor picked = hot.id < 0 ? hot : reduce_sum(s, "tg_nll_loss", op_binary(s, OP_MUL, logp, hot), -1, 0);
    return picked.id < 0 ? picked : reduce_loss(s, op_unary(s, OP_NEG, picked), r);
}

tg_tensor tg_nll_loss_at(tg_site s, tg_tensor logp, tg_tensor targets, tg_reduction r) {
    if (!check_targets(s, "tg_nll_loss", logp, targets)) return bad(logp.g ? logp.g : targets.g);
    return nll(s, logp, targets, r);
}

tg_tensor tg_cross_entropy_at(tg_site s, tg_tensor logits, tg_tensor targets, tg_reduction r) {
    if (!check_targets(s, "tg_cross_entropy", logits, targets)) return bad(logits.g ? logits.g : targets.g);
    tg_tensor logp = softmax_like(s, "tg_cross_entropy", OP_LOG_SOFTMAX, logits, -1);
    return logp.id < 0 ? logp : nll(s, logp, targets, r);
}

/* A node of op `op` that carries the parameters (axis, iarg, farg) of `like`: how gradient rules
 * emit the adjoint of a forward op (slice for pad, col2im for im2col, the same dropout mask). */
tg_tensor op_mirror(tg_graph *g, tg_site s, tg_op op, int like, tg_shape shape, int nsrc, const int *src) {
    tg_tensor t = emit(g, s, op, TG_FLOAT32, shape, nsrc, src);
    if (t.id < 0) return t;
    const tg_node *l = &g->nodes[like];
    tg_node *n = &g->nodes[t.id];
    n->axis = l->axis;
    n->farg = l->farg;
    for (int i = 0; i < TG_MAX_DIMS; i++) n->iarg[i] = l->iarg[i];
    return t;
}

/* ----- more elementwise ----- */

tg_tensor tg_sin_at(tg_site s, tg_tensor x) { return unary(s, "tg_sin", OP_SIN, x, true); }
tg_tensor tg_cos_at(tg_site s, tg_tensor x) { return unary(s, "tg_cos", OP_COS, x, true); }

static tg_tensor op_gelu(tg_site s, tg_op op, tg_tensor x, int tanh_form) {
    tg_tensor t = op_unary(s, op, x);
    if (t.id >= 0) x.g->nodes[t.id].iarg[0] = tanh_form;
    return t;
}

tg_tensor tg_gelu_at(tg_site s, tg_tensor x) {
    return usable(s, "tg_gelu", x) && need_f32(s, "tg_gelu", x) ? op_gelu(s, OP_GELU, x, 0) : bad(x.g);
}

tg_tensor tg_gelu_tanh_at(tg_site s, tg_tensor x) {
    return usable(s, "tg_gelu_tanh", x) && need_f32(s, "tg_gelu_tanh", x) ? op_gelu(s, OP_GELU, x, 1) : bad(x.g);
}

tg_tensor tg_silu_at(tg_site s, tg_tensor x) {
    if (!usable(s, "tg_silu", x) || !need_f32(s, "tg_silu", x)) return bad(x.g);
    return op_binary(s, OP_MUL, x, op_unary(s, OP_SIGMOID, x));
}

tg_tensor tg_clamp_at(tg_site s, tg_tensor x, double lo, double hi) {
    if (!usable(s, "tg_clamp", x)) return bad(x.g);
    tg_dtype dt = node_of(x)->dtype;
    tg_tensor lo_t = op_const(x.g, s, lo, dt), hi_t = op_const(x.g, s, hi, dt);
    tg_tensor low = tg_where_at(s, op_binary(s, OP_LESS, x, lo_t), lo_t, x);
    return tg_where_at(s, op_binary(s, OP_GREATER, low, hi_t), hi_t, low);
}

/* ----- argmax / argmin ----- */

static tg_tensor arg_extreme(tg_site s, const char *name, tg_tensor x, int axis, int is_min) {
    if (!usable(s, name, x)) return bad(x.g);
    tg_shape in = node_of(x)->shape, out;
    int a = 0;
    if (axis == TG_ALL) {
        x = op_reshape(s, x, TG_SHAPE(shape_numel(in)));
        out = TG_SHAPE0;
    } else {
        if (!shape_axis(x.g, s, name, in, axis, &a)) return bad(x.g);
        out = drop_axis(in, a);
    }
    tg_shape keep = node_of(x)->shape;
    keep.d[a] = 1;
    tg_tensor t = emit(x.g, s, OP_ARGMAX, TG_INT32, keep, 1, &x.id);
    if (t.id < 0) return t;
    x.g->nodes[t.id].axis = a;
    x.g->nodes[t.id].iarg[0] = is_min;
    return op_reshape(s, t, out);
}

tg_tensor tg_argmax_at(tg_site s, tg_tensor x, int axis) { return arg_extreme(s, "tg_argmax", x, axis, 0); }
tg_tensor tg_argmin_at(tg_site s, tg_tensor x, int axis) { return arg_extreme(s, "tg_argmin", x, axis, 1); }

/* ----- layout helpers ----- */

tg_tensor tg_flatten_at(tg_site s, tg_tensor x, int start) {
    int a;
    if (!usable(s, "tg_flatten", x)) return bad(x.g);
    tg_shape in = node_of(x)->shape;
    if (in.ndim == 0) return op_reshape(s, x, TG_SHAPE(1));
    if (!shape_axis(x.g, s, "tg_flatten", in, start, &a)) return bad(x.g);
    tg_shape out = in;
    out.ndim = a + 1;
    for (int i = a + 1; i < in.ndim; i++) out.d[a] *= in.d[i];
    return op_reshape(s, x, out);
}

tg_tensor tg_split_heads_at(tg_site s, tg_tensor x, int n_heads) {
    if (!usable(s, "tg_split_heads", x)) return bad(x.g);
    tg_shape in = node_of(x)->shape;
    char sh[96];
    if (in.ndim < 2 || in.ndim >= TG_MAX_DIMS || n_heads <= 0 || in.d[in.ndim - 1] % n_heads) {
        ir_fail(x.g, s, "tg_split_heads: %s cannot be split into %d heads (needs [..., T, D] with D divisible)",
                shape_str(in, sh), n_heads);
        return bad(x.g);
    }
    tg_shape mid = in;   /* [..., T, H, Dh] */
    mid.d[in.ndim - 1] = n_heads;
    mid.d[in.ndim] = in.d[in.ndim - 1] / n_heads;
    mid.ndim++;
    return tg_swapaxes_at(s, op_reshape(s, x, mid), -3, -2);
}

tg_tensor tg_merge_heads_at(tg_site s, tg_tensor x) {
    if (!usable(s, "tg_merge_heads", x)) return bad(x.g);
    tg_shape in = node_of(x)->shape;
    char sh[96];
    if (in.ndim < 3) { ir_fail(x.g, s, "tg_merge_heads: %s needs [..., H, T, Dh]", shape_str(in, sh)); return bad(x.g); }
    tg_tensor t = tg_swapaxes_at(s, x, -3, -2);   /* [..., T, H, Dh] */
    tg_shape out = node_of(t)->shape;
    out.d[out.ndim - 2] *= out.d[out.ndim - 1];
    out.ndim--;
    return op_reshape(s, t, out);
}

/* ----- take_along_axis ----- */

static tg_tensor op_along(tg_site s, tg_op op, tg_tensor vals, tg_tensor idx, int axis, tg_shape out) {
    if (!live(vals) || !live(idx)) return bad(vals.g);
    int src[2] = { vals.id, idx.id };
    tg_tensor t = emit(vals.g, s, op, node_of(vals)->dtype, out, 2, src);
    if (t.id >= 0) vals.g->nodes[t.id].axis = axis;
    return t;
}

tg_tensor tg_take_along_axis_at(tg_site s, tg_tensor x, tg_tensor idx, int axis) {
    const char *name = "tg_take_along_axis";
    if (!same_graph(s, name, x, idx) || !need_i32(s, name, "indices", idx)) return bad(x.g ? x.g : idx.g);
    tg_shape xs = node_of(x)->shape, is = node_of(idx)->shape;
    int a;
    if (!shape_axis(x.g, s, name, xs, axis, &a)) return bad(x.g);
    bool ok = xs.ndim == is.ndim;
    for (int i = 0; ok && i < xs.ndim; i++) ok = i == a || xs.d[i] == is.d[i];
    if (!ok) {
        char sa[96], sb[96];
        ir_fail(x.g, s, "%s: input %s and indices %s must agree except along axis %d", name, shape_str(xs, sa),
                shape_str(is, sb), axis);
        return bad(x.g);
    }
    return op_along(s, OP_TAKE_ALONG, x, idx, a, is);
}

/* ----- builders ----- */

/* The graph a builder with no tensor operand appends to, if tracing and still error-free. */
static tg_graph *trace_ok(void) {
    tg_graph *g = tg__trace();
    return g && ir_ok(g) ? g : NULL;
}

static bool known_dtype(tg_graph *g, tg_site s, const char *op, tg_dtype dt) {
    if (dt == TG_FLOAT32 || dt == TG_INT32) return true;
    ir_fail(g, s, "%s: unknown dtype %d", op, (int)dt);
    return false;
}

tg_tensor tg_arange_at(tg_site s, int64_t n, tg_dtype dt) {
    tg_graph *g = trace_ok();
    if (!g || !known_dtype(g, s, "tg_arange", dt)) return bad(tg__trace());
    if (n <= 0) { ir_fail(g, s, "tg_arange: length %lld must be positive", (long long)n); return bad(g); }
    return emit(g, s, OP_IOTA, dt, TG_SHAPE(n), 0, NULL);
}

static tg_tensor filled(tg_site s, const char *name, tg_shape shape, tg_dtype dt, double v) {
    tg_graph *g = trace_ok();
    if (!g || !known_dtype(g, s, name, dt) || !shape_valid(g, s, name, shape)) return bad(tg__trace());
    tg_tensor t = emit(g, s, OP_CONST, dt, shape, 0, NULL);
    if (t.id >= 0) g->nodes[t.id].farg = v;
    return t;
}

tg_tensor tg_zeros_at(tg_site s, tg_shape shape, tg_dtype dt) { return filled(s, "tg_zeros", shape, dt, 0); }
tg_tensor tg_ones_at(tg_site s, tg_shape shape, tg_dtype dt) { return filled(s, "tg_ones", shape, dt, 1); }

/* Random ops are salted with their node id: unique in the graph and the same at every trace. */
static tg_tensor salted(tg_tensor t) {
    if (t.id >= 0) t.g->nodes[t.id].iarg[0] = t.id;
    return t;
}

tg_tensor tg_randn_at(tg_site s, tg_shape shape) {
    tg_graph *g = trace_ok();
    if (!g || !shape_valid(g, s, "tg_randn", shape)) return bad(tg__trace());
    return salted(emit(g, s, OP_RANDN, TG_FLOAT32, shape, 0, NULL));
}

/* ----- structure ----- */

static tg_tensor op_slice_pad(tg_site s, tg_op op, tg_tensor x, int axis, int64_t start, int64_t length) {
    if (!live(x)) return bad(x.g);
    tg_shape out = node_of(x)->shape;
    out.d[axis] = length;
    tg_tensor t = emit(x.g, s, op, node_of(x)->dtype, out, 1, &x.id);
    if (t.id >= 0) {
        x.g->nodes[t.id].axis = axis;
        x.g->nodes[t.id].iarg[0] = start;
    }
    return t;
}

tg_tensor tg_narrow_at(tg_site s, tg_tensor x, int axis, int64_t start, int64_t length) {
    int a;
    if (!usable(s, "tg_narrow", x) || !shape_axis(x.g, s, "tg_narrow", node_of(x)->shape, axis, &a)) return bad(x.g);
    tg_shape in = node_of(x)->shape;
    if (start < 0 || length <= 0 || start >= in.d[a] || length > in.d[a] - start) {
        char sh[96];
        ir_fail(x.g, s, "tg_narrow: start %lld, length %lld is outside axis %d of %s", (long long)start,
                (long long)length, axis, shape_str(in, sh));
        return bad(x.g);
    }
    if (length == in.d[a]) return x;
    return op_slice_pad(s, OP_SLICE, x, a, start, length);
}

/* Concatenation as a sum of zero-padded inputs: each pad is index arithmetic a fused backend
 * folds into one loop, and the gradient of each input is a plain slice. */
static tg_tensor concat(tg_site s, const char *name, const tg_tensor *xs, int n, int axis) {
    tg_graph *g = tg__trace();
    if (n <= 0 || !xs) {
        if (g) ir_fail(g, s, "%s: needs at least one tensor", name);
        return bad(g);
    }
    for (int i = 0; i < n; i++)
        if (!same_graph(s, name, xs[0], xs[i])) return bad(xs[0].g);
    tg_shape first = node_of(xs[0])->shape;
    int a;
    if (!shape_axis(xs[0].g, s, name, first, axis, &a)) return bad(xs[0].g);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        tg_shape si = node_of(xs[i])->shape;
        if (node_of(xs[i])->dtype != node_of(xs[0])->dtype) {
            ir_fail(xs[0].g, s, "%s: input %d is %s but input 0 is %s", name, i, node_of(xs[i])->dtype == TG_INT32 ? "i32" : "f32",
                    node_of(xs[0])->dtype == TG_INT32 ? "i32" : "f32");
            return bad(xs[0].g);
        }
        bool ok = si.ndim == first.ndim;
        for (int k = 0; ok && k < si.ndim; k++) ok = k == a || si.d[k] == first.d[k];
        if (!ok) {
            char sa[96], sb[96];
            ir_fail(xs[0].g, s, "%s: input %d %s does not match input 0 %s except along axis %d", name, i,
                    shape_str(si, sa), shape_str(first, sb), axis);
            return bad(xs[0].g);
        }
        if (__builtin_add_overflow(total, si.d[a], &total)) {
            ir_fail(xs[0].g, s, "%s: the result along axis %d is too large", name, axis);
            return bad(xs[0].g);
        }
    }
    if (n == 1) return xs[0];
    tg_tensor sum = { xs[0].g, -1 };
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        tg_tensor padded = op_slice_pad(s, OP_PAD, xs[i], a, at, total);
        at += node_of(xs[i])->shape.d[a];
        sum = sum.id < 0 ? padded : op_binary(s, OP_ADD, sum, padded);
    }
    return sum;
}

tg_tensor tg_concat_at(tg_site s, const tg_tensor *xs, int n, int axis) { return concat(s, "tg_concat", xs, n, axis); }

tg_tensor tg_stack_at(tg_site s, const tg_tensor *xs, int n, int axis) {
    tg_graph *g = tg__trace();
    if (n <= 0 || !xs || !usable(s, "tg_stack", xs[0])) {
        if (g && (n <= 0 || !xs)) ir_fail(g, s, "tg_stack: needs at least one tensor");
        return bad(g);
    }
    tg_shape in = node_of(xs[0])->shape;
    int a = axis < 0 ? axis + in.ndim + 1 : axis;
    if (a < 0 || a > in.ndim || in.ndim >= TG_MAX_DIMS) {
        char sh[96];
        ir_fail(xs[0].g, s, "tg_stack: axis %d is out of range for stacking %s", axis, shape_str(in, sh));
        return bad(xs[0].g);
    }
    tg_tensor *ys = tg_alloc(sizeof(tg_tensor) * (size_t)n);
    if (!ys) { ir_fail(xs[0].g, s, "tg_stack: out of memory"); return bad(xs[0].g); }
    for (int i = 0; i < n; i++) {
        if (!same_graph(s, "tg_stack", xs[0], xs[i])) { free(ys); return bad(xs[0].g); }
        tg_shape si = node_of(xs[i])->shape, up = { si.ndim + 1, { 0 } };
        bool same = si.ndim == in.ndim;
        for (int k = 0; same && k < in.ndim; k++) same = si.d[k] == in.d[k];
        if (!same) {
            char sa[96], sb[96];
            ir_fail(xs[0].g, s, "tg_stack: input %d %s differs from input 0 %s", i, shape_str(si, sa), shape_str(in, sb));
            free(ys);
            return bad(xs[0].g);
        }
        for (int k = 0, j = 0; k < up.ndim; k++) up.d[k] = k == a ? 1 : si.d[j++];
        ys[i] = op_reshape(s, xs[i], up);
    }
    tg_tensor r = concat(s, "tg_stack", ys, n, a);
    free(ys);
    return r;
}

void tg_split_at(tg_site s, tg_tensor x, const int64_t *sizes, int n, int axis, tg_tensor *out) {
    for (int i = 0; out && i < n; i++) out[i] = bad(x.g);
    int a;
    if (!out && usable(s, "tg_split", x)) ir_fail(x.g, s, "tg_split: NULL output array");
    if (!out || !usable(s, "tg_split", x) || !shape_axis(x.g, s, "tg_split", node_of(x)->shape, axis, &a)) return;
    int64_t total = 0, len = node_of(x)->shape.d[a];
    bool ok = sizes && n > 0;
    for (int i = 0; ok && i < n; i++) {
        ok = sizes[i] > 0 && sizes[i] <= len - total;   /* never past the axis, so never overflowing */
        if (ok) total += sizes[i];
    }
    if (!ok || total != len) {
        char sh[96];
        ir_fail(x.g, s, "tg_split: sizes must be positive and add up to %lld (axis %d of %s)",
                (long long)node_of(x)->shape.d[a], axis, shape_str(node_of(x)->shape, sh));
        return;
    }
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        out[i] = tg_narrow_at(s, x, a, at, sizes[i]);
        at += sizes[i];
    }
}

/* ----- attention helpers ----- */

static bool need_square_tail(tg_site s, const char *name, tg_tensor x) {
    tg_shape in = node_of(x)->shape;
    if (in.ndim >= 2) return true;
    char sh[96];
    ir_fail(x.g, s, "%s: %s needs at least 2 dimensions [.., T, T]", name, shape_str(in, sh));
    return false;
}

tg_tensor tg_softmax_causal_at(tg_site s, tg_tensor x) {
    const char *name = "tg_softmax_causal";
    if (!usable(s, name, x) || !need_f32(s, name, x) || !need_square_tail(s, name, x)) return bad(x.g);
    return op_unary(s, OP_SOFTMAX_CAUSAL, x);
}

static tg_tensor op_where_causal(tg_site s, tg_tensor x, double fill) {
    tg_tensor t = op_unary(s, OP_WHERE_CAUSAL, x);
    if (t.id >= 0) x.g->nodes[t.id].farg = fill;
    return t;
}

tg_tensor tg_where_causal_at(tg_site s, tg_tensor x, double fill) {
    const char *name = "tg_where_causal";
    if (!usable(s, name, x) || !need_square_tail(s, name, x)) return bad(x.g);
    if (node_of(x)->dtype == TG_INT32 && !(fill == trunc(fill) && fill >= INT32_MIN && fill <= INT32_MAX)) {
        ir_fail(x.g, s, "%s: fill %g is not a 32-bit integer (the tensor is i32)", name, fill);
        return bad(x.g);
    }
    return op_where_causal(s, x, fill);
}

/* ----- autograd control and dropout ----- */

tg_tensor tg_stop_gradient_at(tg_site s, tg_tensor x) {
    return usable(s, "tg_stop_gradient", x) ? op_unary(s, OP_IDENTITY, x) : bad(x.g);
}

static tg_tensor op_dropout(tg_site s, tg_tensor x, double p, int64_t salt) {
    tg_tensor t = op_unary(s, OP_DROPOUT, x);
    if (t.id >= 0) {
        x.g->nodes[t.id].farg = p;
        x.g->nodes[t.id].iarg[0] = salt;
    }
    return t;
}

tg_tensor tg_dropout_at(tg_site s, tg_tensor x, double p) {
    if (!usable(s, "tg_dropout", x) || !need_f32(s, "tg_dropout", x)) return bad(x.g);
    if (!(p >= 0 && p < 1)) { ir_fail(x.g, s, "tg_dropout: p = %g must be in [0, 1)", p); return bad(x.g); }
    if (p == 0) return x;
    tg_tensor t = op_dropout(s, x, p, 0);
    return t.id < 0 ? t : salted(t);
}

/* ----- images ----- */

static bool need_nchw(tg_site s, const char *name, tg_tensor x) {
    if (node_of(x)->shape.ndim == 4) return true;
    char sh[96];
    ir_fail(x.g, s, "%s: input %s must be 4-D [N, C, H, W]", name, shape_str(node_of(x)->shape, sh));
    return false;
}

/* The output extent of a window of size k sliding with stride over n + 2 pad; <= 0 if none fits. */
static int64_t window_out(int64_t n, int64_t k, int64_t stride, int64_t pad) {
    return (stride <= 0 || k <= 0 || n + 2 * pad < k) ? 0 : (n + 2 * pad - k) / stride + 1;
}

static tg_tensor op_im2col(tg_site s, tg_op op, tg_tensor x, const int64_t *args, tg_shape out) {
    tg_tensor t = emit(x.g, s, op, TG_FLOAT32, out, 1, &x.id);
    for (int i = 0; t.id >= 0 && i < 4; i++) x.g->nodes[t.id].iarg[i] = args[i];
    return t;
}

tg_tensor tg_conv2d_at(tg_site s, tg_tensor x, tg_tensor w, int stride, int padding) {
    const char *name = "tg_conv2d";
    if (!same_graph(s, name, x, w) || !need_f32(s, name, x) || !need_f32(s, name, w) || !need_nchw(s, name, x))
        return bad(x.g ? x.g : w.g);
    tg_shape xs = node_of(x)->shape, ws = node_of(w)->shape;
    char sa[96], sb[96];
    if (ws.ndim != 4 || ws.d[1] != xs.d[1]) {
        ir_fail(x.g, s, "%s: input %s and weight %s: the weight must be [O, %lld, kh, kw]", name, shape_str(xs, sa),
                shape_str(ws, sb), (long long)xs.d[1]);
        return bad(x.g);
    }
    int64_t ho = window_out(xs.d[2], ws.d[2], stride, padding), wo = window_out(xs.d[3], ws.d[3], stride, padding);
    if (stride <= 0 || padding < 0 || ho <= 0 || wo <= 0) {
        ir_fail(x.g, s, "%s: input %s, weight %s, stride %d, padding %d give no output", name, shape_str(xs, sa),
                shape_str(ws, sb), stride, padding);
        return bad(x.g);
    }
    int64_t args[4] = { ws.d[2], ws.d[3], stride, padding };
    int64_t ckk, cols;
    if (__builtin_mul_overflow(xs.d[1], ws.d[2], &ckk) || __builtin_mul_overflow(ckk, ws.d[3], &ckk) ||
        __builtin_mul_overflow(ho, wo, &cols)) {
        ir_fail(x.g, s, "%s: input %s and weight %s give a column matrix too large", name, shape_str(xs, sa), shape_str(ws, sb));
        return bad(x.g);
    }
    tg_tensor col = op_im2col(s, OP_IM2COL, x, args, TG_SHAPE(xs.d[0], ckk, cols));
    if (col.id < 0) return col;
    tg_tensor out = op_matmul_t(s, op_reshape(s, w, TG_SHAPE(ws.d[0], ckk)), col, 0, 0);
    return out.id < 0 ? out : op_reshape(s, out, TG_SHAPE(xs.d[0], ws.d[0], ho, wo));
}

tg_tensor tg_max_pool2d_at(tg_site s, tg_tensor x, int k, int stride, int padding) {
    const char *name = "tg_max_pool2d";
    if (!usable(s, name, x) || !need_f32(s, name, x) || !need_nchw(s, name, x)) return bad(x.g);
    tg_shape xs = node_of(x)->shape;
    int64_t ho = window_out(xs.d[2], k, stride, padding), wo = window_out(xs.d[3], k, stride, padding);
    if (k <= 0 || stride <= 0 || padding < 0 || padding > k / 2 || ho <= 0 || wo <= 0) {
        char sh[96];
        ir_fail(x.g, s, "%s: input %s with k %d, stride %d, padding %d: needs k, stride > 0, padding <= k/2 "
                "and at least one window", name, shape_str(xs, sh), k, stride, padding);
        return bad(x.g);
    }
    tg_tensor t = emit(x.g, s, OP_MAXPOOL2D, TG_FLOAT32, TG_SHAPE(xs.d[0], xs.d[1], ho, wo), 1, &x.id);
    if (t.id >= 0) {
        x.g->nodes[t.id].iarg[0] = k;
        x.g->nodes[t.id].iarg[1] = stride;
        x.g->nodes[t.id].iarg[2] = padding;
    }
    return t;
}

/* Upsampling as a broadcast: [N,C,H,1,W,1] expanded to [N,C,H,f,W,f]; its gradient is the
 * broadcast's, a sum over each f x f block. */
tg_tensor tg_nearest_upsample2d_at(tg_site s, tg_tensor x, int factor) {
    const char *name = "tg_nearest_upsample2d";
    if (!usable(s, name, x) || !need_nchw(s, name, x)) return bad(x.g);
    if (factor <= 0) { ir_fail(x.g, s, "%s: factor %d must be positive", name, factor); return bad(x.g); }
    tg_shape xs = node_of(x)->shape;
    int64_t n = xs.d[0], c = xs.d[1], h = xs.d[2], w = xs.d[3], hf, wf;
    if (__builtin_mul_overflow(h, factor, &hf) || __builtin_mul_overflow(w, factor, &wf)) {
        ir_fail(x.g, s, "%s: factor %d makes the image too large", name, factor);
        return bad(x.g);
    }
    tg_tensor up = op_expand(s, op_reshape(s, x, TG_SHAPE(n, c, h, 1, w, 1)), TG_SHAPE(n, c, h, factor, w, factor));
    return up.id < 0 ? up : op_reshape(s, up, TG_SHAPE(n, c, hf, wf));
}

/* ----- named places: captures and patch sites ----- */

/* Append {name, node} to a graph's list of captures or patch sites; false (error recorded) when
 * the name is missing or taken. */
static bool add_named(tg_site s, const char *op, tg_graph *g, tg_named **list, int *n, const char *name, int node) {
    if (!name || !name[0]) { ir_fail(g, s, "%s: no name given", op); return false; }
    for (int i = 0; i < *n; i++)
        if (strcmp((*list)[i].name, name) == 0) { ir_fail(g, s, "%s: the name '%s' is used twice", op, name); return false; }
    tg_named *grown = tg_realloc(*list, sizeof(tg_named) * (size_t)(*n + 1));
    char *copy = tg_strdup(name);
    if (grown) *list = grown;
    if (!grown || !copy) {
        free(copy);
        ir_fail(g, s, "%s: out of memory", op);
        return false;
    }
    (*list)[(*n)++] = (tg_named){ copy, node, -1, -1 };
    return true;
}

tg_tensor tg_capture_at(tg_site s, const char *name, tg_tensor x) {
    if (!usable(s, "tg_capture", x)) return bad(x.g);
    if (!add_named(s, "tg_capture", x.g, &x.g->captures, &x.g->n_captures, name, x.id)) return bad(x.g);
    return x;
}

/* In a patchable trace, the site's value is where(replace, R, where(mean, batch mean of x, x)),
 * R an extra INPUT node that the runtime fills per call; otherwise x itself. */
tg_tensor tg_patch_at(tg_site s, const char *name, tg_tensor x) {
    if (!usable(s, "tg_patch", x) || !need_f32(s, "tg_patch", x)) return bad(x.g);
    tg_graph *g = x.g;
    if (!add_named(s, "tg_patch", g, &g->patches, &g->n_patches, name, x.id)) return bad(g);
    if (!g->patchable) return x;
    tg_named *site = &g->patches[g->n_patches - 1];
    site->hyper = g->n_hyper > HYPER_SEED + 1 ? g->n_hyper : HYPER_SEED + 1;   /* two slots after the seed's */
    tg_tensor r = emit(g, s, OP_INPUT, TG_FLOAT32, node_of(x)->shape, 0, NULL);
    if (r.id < 0) return bad(g);
    char *rname = tg_alloc(strlen(name) + 7);
    if (!rname) {
        ir_fail(g, s, "tg_patch: out of memory");
        return bad(g);
    }
    sprintf(rname, "patch:%s", name);
    g->nodes[r.id].name = rname;
    g->nodes[r.id].iarg[0] = -1;
    site->input = r.id;
    tg_tensor mean = node_of(x)->shape.ndim > 0 ? tg_mean_at(s, x, 0, 1) : x;
    tg_tensor kept = tg_where_at(s, op_hyper(g, site->hyper + 1), mean, x);
    return tg_where_at(s, op_hyper(g, site->hyper), r, kept);
}
