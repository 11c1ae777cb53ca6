/* Reverse-mode autograd: walks the forward nodes from the loss back to the leaves and appends,
 * for each op, the nodes of its gradient rule. Gradients of broadcast operands are summed back
 * to the operand's shape (op_unbroadcast). Each rule lives in rule() under its op's name. */
#include "graph/graph.h"

#include <stdlib.h>

/* Does the gradient flow from a node to its k-th source? Indices, conditions and comparisons
 * carry none. */
static bool flows(const tg_node *n, int k) {
    switch (n->op) {
    case OP_SIGN: case OP_STEP: case OP_LESS: case OP_GREATER: case OP_EQUAL: case OP_ONE_HOT:
    case OP_IDENTITY: case OP_ARGMAX:
        return false;
    /* Gradients of gradient ops (second order) are not supported. */
    case OP_GELU_GRAD: case OP_MAXPOOL2D_BWD: case OP_ATTENTION_BWD:
        return false;
    case OP_ATTENTION_LSE: return false;   /* read only by ATTENTION's own gradient */
    case OP_WHERE: return k != 0;
    case OP_GATHER_ROWS: case OP_SCATTER_ROWS: case OP_TAKE_ALONG: case OP_SCATTER_ALONG: return k == 0;
    default: return true;
    }
}

typedef struct {
    tg_graph *g;
    int *acc;        /* per forward node: its gradient node so far, or -1 */
    bool *reach;     /* per forward node: depends on some wrt node */
    int *group;      /* per forward node: find_siblings' group */
    int *wide;       /* per forward node that is the first of a group: its weights side by side (early_wide), or -1 */
} grad_ctx;

static void accumulate(grad_ctx *c, tg_site s, int node, tg_tensor contrib) {
    if (contrib.id < 0) return;
    contrib = op_unbroadcast(s, contrib, c->g->nodes[node].shape);
    if (contrib.id < 0) return;
    if (c->acc[node] < 0) c->acc[node] = contrib.id;
    else c->acc[node] = op_binary(s, OP_ADD, mk_tensor(c->g, c->acc[node]), contrib).id;
}

static tg_tensor num(tg_graph *g, tg_site s, double v) { return op_const(g, s, v, TG_FLOAT32); }
#define MUL(a, b) op_binary(s, OP_MUL, a, b)
#define DIV(a, b) op_binary(s, OP_DIV, a, b)
#define SUB(a, b) op_binary(s, OP_SUB, a, b)
#define ADD(a, b) op_binary(s, OP_ADD, a, b)
/* The adjoint op of this node, with its parameters. */
#define MIRROR(op, shape, nsrc, srcs) op_mirror(g, s, op, id, shape, nsrc, srcs)

/* Gradient of A' @ B' (A' = A or A^T by ta, B' likewise by tb) with respect to A and B. */
static void matmul_rule(grad_ctx *c, tg_site s, const tg_node *n, tg_tensor go) {
    tg_graph *g = c->g;
    tg_tensor a = mk_tensor(g, n->src[0]), b = mk_tensor(g, n->src[1]);
    int ta = (int)n->iarg[0], tb = (int)n->iarg[1];
    if (c->reach[a.id]) {
        tg_tensor da = ta ? op_matmul_t(s, b, go, tb, 1) : op_matmul_t(s, go, b, 0, !tb);
        accumulate(c, s, a.id, da);
    }
    if (c->reach[b.id]) {
        /* A batched A against a 2-D B: fold the batch into the rows so dB is one product rather
         * than a batch of products summed afterwards. */
        tg_shape as = g->nodes[a.id].shape;
        if (g->nodes[b.id].shape.ndim == 2 && as.ndim > 2 && !ta) {
            a = op_reshape(s, a, TG_SHAPE(shape_numel(as) / as.d[as.ndim - 1], as.d[as.ndim - 1]));
            go = op_reshape(s, go, TG_SHAPE(shape_numel(n->shape) / n->shape.d[n->shape.ndim - 1], n->shape.d[n->shape.ndim - 1]));
        }
        tg_tensor db = tb ? op_matmul_t(s, go, a, 1, ta) : op_matmul_t(s, a, go, !ta, 0);
        accumulate(c, s, b.id, db);
    }
}

/* TG_PACK_ATTENTION=1: attention's gradients packed (packs), off by default. */
static bool pack_attention(void) {
    const char *env = getenv("TG_PACK_ATTENTION");
    return env && env[0] == '1';
}

/* Sibling products: products x W_j of one left operand x (no transposes) by 2-D weights W_j
 * that are leaves or made before the first of them (a transformer's q, k and v: the walk
 * reaches the first last, when the gradient of every member's output is whole). With
 * g->group_products their gradients are one product each way, over the gradients of their
 * outputs side by side, G = [G_1 .. G_n]: dx = G [W_1 .. W_n]^T, and [dW_1 .. dW_n] = x^T G,
 * narrowed to each W_j. Three products of a third of the width, and x's gradient added up over
 * them, cost the GPU more than one wide product (char_gpt at bf16: dx 66 -> 24 us a layer on an
 * H200). group[i]: the first member of node i's group (itself for the first), or -1. */
#define MAX_SIBLINGS 16

static bool sibling_product(const tg_graph *g, const bool *reach, int i) {
    const tg_node *n = &g->nodes[i];
    return n->op == OP_MATMUL && !n->iarg[0] && !n->iarg[1] && reach[i] && reach[n->src[1]] &&
           g->nodes[n->src[1]].shape.ndim == 2 && g->nodes[n->src[0]].shape.ndim >= 2;
}

static void find_siblings(const tg_graph *g, const bool *reach, int n0, int *group) {
    for (int i = 0; i < n0; i++) group[i] = -1;
    for (int i = 0; g->group_products && i < n0; i++) {
        if (group[i] >= 0 || !sibling_product(g, reach, i)) continue;
        int members = 1;
        for (int j = i + 1; j < n0 && members < MAX_SIBLINGS; j++)
            if (group[j] < 0 && sibling_product(g, reach, j) && g->nodes[j].src[0] == g->nodes[i].src[0] &&
                (g->nodes[j].src[1] < i || g->nodes[g->nodes[j].src[1]].nsrc == 0)) {
                group[j] = i;
                members++;
            }
        if (members > 1) group[i] = i;
    }
}

/* How many nodes read node id; *last: the last of them. */
static int readers(const tg_graph *g, int id, int *last) {
    int n = 0;
    for (int k = id + 1; k < g->n; k++)
        for (int s = 0; s < g->nodes[k].nsrc; s++)
            if (g->nodes[k].src[s] == id) {
                n++;
                *last = k;
            }
    return n;
}

/* The bias parameter that product id's one reader adds to it, read by nothing else (tg_linear's),
 * or -1. */
static int lone_bias(const tg_graph *g, int id) {
    int add = -1, use;
    if (readers(g, id, &add) != 1 || g->nodes[add].op != OP_ADD) return -1;
    const int b = g->nodes[add].src[g->nodes[add].src[0] == id];
    const tg_node *bn = &g->nodes[b];
    return bn->op == OP_PARAM && bn->shape.ndim == 1 && bn->shape.d[0] == g->nodes[id].shape.d[g->nodes[id].shape.ndim - 1] &&
           readers(g, b, &use) == 1 ? b : -1;
}

/* The packed attention gradient (graph.h: ATTENTION_BWD's iarg[1] = 3) whose parts, in order, the
 * gradients gs[0..n) are (attention_rule's narrows, reshaped), or -1: then it is their concatenation
 * as it lies. */
static int packed_whole(const tg_graph *g, const tg_tensor *gs, int n) {
    int whole = -1;
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        const tg_shape gk = g->nodes[gs[k].id].shape;
        int x = gs[k].id;
        while (g->nodes[x].op == OP_RESHAPE) x = g->nodes[x].src[0];
        const tg_node *part = &g->nodes[x];
        if (part->op != OP_SLICE) return -1;
        const tg_node *p = &g->nodes[part->src[0]];
        const int last = p->shape.ndim - 1;
        if (p->op != OP_ATTENTION_BWD || p->iarg[1] != 3 || (whole >= 0 && part->src[0] != whole) ||
            part->axis != last || part->iarg[0] != at || gk.d[gk.ndim - 1] != part->shape.d[last])
            return -1;
        whole = part->src[0];
        at += part->shape.d[last];
    }
    return whole >= 0 && at == g->nodes[whole].shape.d[g->nodes[whole].shape.ndim - 1] ? whole : -1;
}

/* With packed attention gradients: each group's weights side by side made before the rest of
 * the gradient, when the step's backward starts, where siblings_rule would make them right
 * before the product that reads them, on the critical path behind the biases' sums. */
static void early_wide(grad_ctx *c, int n0) {
    tg_graph *g = c->g;
    for (int i = 0; i < n0; i++) c->wide[i] = -1;
    if (!pack_attention()) return;
    for (int i = 0; i < n0 && ir_ok(g); i++) {
        if (c->group[i] != i) continue;
        tg_tensor ws[MAX_SIBLINGS];
        int n = 0;
        for (int j = i; j < n0 && n < MAX_SIBLINGS; j++)
            if (c->group[j] == i) ws[n++] = mk_tensor(g, g->nodes[j].src[1]);
        c->wide[i] = tg_concat_at(g->nodes[i].site, ws, n, 1).id;
    }
}

/* The gradients of group `first`'s members that have one (their outputs' gradients all final
 * here: every reader of a member comes after the first member). Where each member's output has a
 * bias added to it, the biases' gradients are one sum too, over the columns of G: the GPU's
 * kernel that writes G sums its columns as it goes, where the three sums read the members'
 * gradients again. */
static void siblings_rule(grad_ctx *c, int first, const int *group, int n0) {
    tg_graph *g = c->g;
    const tg_site s = g->nodes[first].site;
    int members[MAX_SIBLINGS], n = 0;
    for (int j = first; j < n0 && n < MAX_SIBLINGS; j++)
        if (group[j] == first && c->acc[j] >= 0) members[n++] = j;
    if (n == 1) {
        const tg_node one = g->nodes[members[0]];   /* a copy: appending nodes may move the array */
        matmul_rule(c, s, &one, mk_tensor(g, c->acc[members[0]]));
    }
    if (n <= 1) return;
    tg_tensor gs[MAX_SIBLINGS], ws[MAX_SIBLINGS];
    for (int k = 0; k < n; k++) {
        gs[k] = mk_tensor(g, c->acc[members[k]]);
        ws[k] = mk_tensor(g, g->nodes[members[k]].src[1]);
    }
    tg_tensor x = mk_tensor(g, g->nodes[first].src[0]);
    const int whole = packed_whole(g, gs, n);
    tg_shape wide = g->nodes[gs[0].id].shape;
    if (whole >= 0) wide.d[wide.ndim - 1] = g->nodes[whole].shape.d[g->nodes[whole].shape.ndim - 1];
    tg_tensor go = whole >= 0 ? op_reshape(s, mk_tensor(g, whole), wide) : tg_concat_at(s, gs, n, -1);
    int bias[MAX_SIBLINGS], biased = 0;   /* the sums right after G: a GPU's column sums compute what they sum */
    for (int k = 0; k < n; k++) {
        bias[k] = lone_bias(g, members[k]);
        biased += bias[k] >= 0 && c->acc[bias[k]] >= 0;
    }
    if (biased == n) {   /* their sums so far, each over one member's gradient, are left unread */
        tg_tensor db = op_unbroadcast(s, go, TG_SHAPE(g->nodes[go.id].shape.d[g->nodes[go.id].shape.ndim - 1]));
        for (int k = 0, at = 0; k < n; k++) {
            const int64_t width = g->nodes[bias[k]].shape.d[0];
            c->acc[bias[k]] = tg_narrow_at(s, db, 0, at, width).id;
            at += (int)width;
        }
    }
    int members_all = 0;
    for (int j = first; j < n0; j++) members_all += group[j] == first;
    tg_tensor w = c->wide[first] >= 0 && n == members_all ? mk_tensor(g, c->wide[first]) : tg_concat_at(s, ws, n, 1);
    if (c->reach[x.id]) accumulate(c, s, x.id, op_matmul_t(s, go, w, 0, 1));
    tg_shape xs = g->nodes[x.id].shape, gsh = g->nodes[go.id].shape;
    if (xs.ndim > 2) {   /* the batch folded into the rows: dW is one product (matmul_rule) */
        x = op_reshape(s, x, TG_SHAPE(shape_numel(xs) / xs.d[xs.ndim - 1], xs.d[xs.ndim - 1]));
        go = op_reshape(s, go, TG_SHAPE(shape_numel(gsh) / gsh.d[gsh.ndim - 1], gsh.d[gsh.ndim - 1]));
    }
    tg_tensor dw = op_matmul_t(s, x, go, 1, 0);
    for (int k = 0, at = 0; k < n; k++) {
        const int64_t width = g->nodes[ws[k].id].shape.d[1];
        accumulate(c, s, ws[k].id, tg_narrow_at(s, dw, 1, at, width));
        at += (int)width;
    }
}

/* A permute of attention output `id` [.., H, T, E] that swaps its heads and rows, as a model
 * merges heads ([.., T, H, E], then a reshape): its node, or -1. */
static int heads_merged(const tg_graph *g, int id) {
    const tg_node *o = &g->nodes[id];
    const int nd = o->shape.ndim;
    for (int j = id + 1; nd >= 3 && j < g->n; j++) {
        const tg_node *p = &g->nodes[j];
        bool swap = p->op == OP_PERMUTE && p->src[0] == id;
        for (int i = 0; swap && i < nd; i++) swap = p->iarg[i] == (i == nd - 3 ? nd - 2 : i == nd - 2 ? nd - 3 : i);
        if (swap) return j;
    }
    return -1;
}

/* Are attention node n's gradients one packed node (graph.h: ATTENTION_BWD's iarg[1] = 3)? With
 * g->group_products and TG_PACK_ATTENTION=1, for heads interleaved and q, k, v of one shape, all
 * three wanted: the gradients of three sibling products (siblings_rule) are then side by side
 * where the attention writes them, not copied there by a kernel (char_gpt at bf16 on an H200: 46
 * us a layer, with the biases' column sums). Off by default, as fast so far (4.07 ms a step
 * either way, bench/RESULTS.md, forty-second session): dq, added up in f32, still needs a copy
 * into its part, and the biases' column sums over the packed rows (37 us a layer) stay on the
 * critical path, where cuBLASLt's bias-gradient epilogue on the weight gradient's product, beside
 * it, would take them off. */
static bool packs(const grad_ctx *c, const tg_node *n) {
    const tg_graph *g = c->g;
    if (!pack_attention()) return false;
    const tg_shape q = g->nodes[n->src[0]].shape;
    bool same = true;
    for (int w = 0; w < 3; w++) same = same && c->reach[n->src[w]] && shapes_equal(g->nodes[n->src[w]].shape, q);
    return g->group_products && n->iarg[3] > 0 && same;
}

/* Gradients of attention with respect to q, k and v, as consecutive ATTENTION_BWD nodes (the
 * ones needed, in that order) reading the forward's output and its row log-sum-exp, the
 * ATTENTION_LSE node tg_attention put right after it. Where the model merges the heads of the
 * output, the gradients read the output from that copy, which lives on anyway (the next product
 * reads it), and the output's own buffer is free once the copy is made: a [.., T, E] buffer less
 * a layer until the backward. */
static void attention_rule(grad_ctx *c, tg_site s, int id, tg_tensor go) {
    tg_graph *g = c->g;
    const tg_node n = g->nodes[id];   /* a copy: appending nodes may move the array */
    const int merged = n.iarg[3] > 0 ? id : heads_merged(g, id);   /* interleaved: out is as merged */
    int srcs[6] = { n.src[0], n.src[1], n.src[2], merged >= 0 ? merged : id, go.id, id + 1 };
    if (id + 1 >= g->n || g->nodes[id + 1].op != OP_ATTENTION_LSE) {
        ir_fail(g, s, "internal: attention node %d has no row statistics after it", id);
        return;
    }
    int grads[3] = { -1, -1, -1 };
    const bool packed = packs(c, &n);
    if (packed) {   /* one node, its three parts narrowed out (siblings_rule takes it whole) */
        const tg_shape qs = g->nodes[n.src[0]].shape;
        const int64_t width = qs.d[qs.ndim - 1] * qs.d[qs.ndim - 2];
        tg_shape ps = qs;
        ps.ndim--;
        ps.d[ps.ndim - 1] = 3 * width;
        tg_tensor d = MIRROR(OP_ATTENTION_BWD, ps, 6, srcs);
        if (d.id < 0) return;
        g->nodes[d.id].iarg[1] = 3;
        g->nodes[d.id].iarg[2] = n.iarg[3];
        for (int w = 0; w < 3; w++) grads[w] = op_reshape(s, tg_narrow_at(s, d, -1, w * width, width), qs).id;
    }
    for (int w = 0; w < 3 && !packed; w++) {
        if (!c->reach[n.src[w]]) continue;
        tg_tensor d = MIRROR(OP_ATTENTION_BWD, g->nodes[n.src[w]].shape, 6, srcs);
        if (d.id < 0) return;
        g->nodes[d.id].iarg[1] = w;
        g->nodes[d.id].iarg[2] = n.iarg[3] > 0 ? n.iarg[3] : merged >= 0 ? n.shape.d[n.shape.ndim - 3] : 0;
        grads[w] = d.id;
    }
    for (int w = 0; w < 3; w++)   /* after all three: accumulating appends nodes between them */
        if (grads[w] >= 0) accumulate(c, s, n.src[w], mk_tensor(g, grads[w]));
}

/* Mask for min/max: 1 where a wins, 0.5 on ties (PyTorch splits the gradient), 0 where b wins. */
static tg_tensor win_mask(tg_graph *g, tg_site s, tg_op cmp, tg_tensor a, tg_tensor b) {
    tg_tensor half_ties = MUL(op_binary(s, OP_EQUAL, a, b), num(g, s, 0.5));
    return ADD(op_binary(s, cmp, a, b), half_ties);
}

static void rule(grad_ctx *c, int id) {
    tg_graph *g = c->g;
    tg_node n = g->nodes[id];   /* a copy: appending nodes may move the array */
    tg_site s = n.site;
    tg_tensor go = mk_tensor(g, c->acc[id]), y = mk_tensor(g, id);
    tg_tensor x = mk_tensor(g, n.src[0]), x1 = mk_tensor(g, n.nsrc > 1 ? n.src[1] : n.src[0]);
    int src0 = n.src[0], src1 = n.src[1];
    switch (n.op) {
    case OP_NEG: accumulate(c, s, src0, op_unary(s, OP_NEG, go)); break;
    case OP_ABS: accumulate(c, s, src0, MUL(go, op_unary(s, OP_SIGN, x))); break;
    case OP_SQUARE: accumulate(c, s, src0, MUL(go, MUL(x, num(g, s, 2)))); break;
    case OP_SQRT: accumulate(c, s, src0, DIV(MUL(go, num(g, s, 0.5)), y)); break;
    case OP_RSQRT: accumulate(c, s, src0, MUL(go, DIV(MUL(y, num(g, s, -0.5)), x))); break;
    case OP_EXP: accumulate(c, s, src0, MUL(go, y)); break;
    case OP_LOG: accumulate(c, s, src0, DIV(go, x)); break;
    case OP_RELU: accumulate(c, s, src0, MUL(go, op_unary(s, OP_STEP, y))); break;   /* y > 0 iff x > 0 */
    case OP_TANH: accumulate(c, s, src0, MUL(go, SUB(num(g, s, 1), op_unary(s, OP_SQUARE, y)))); break;
    case OP_SIGMOID: accumulate(c, s, src0, MUL(go, MUL(y, SUB(num(g, s, 1), y)))); break;
    case OP_ADD:
        if (c->reach[src0]) accumulate(c, s, src0, go);
        if (c->reach[src1]) accumulate(c, s, src1, go);
        break;
    case OP_SUB:
        if (c->reach[src0]) accumulate(c, s, src0, go);
        if (c->reach[src1]) accumulate(c, s, src1, op_unary(s, OP_NEG, go));
        break;
    case OP_MUL:
        if (c->reach[src0]) accumulate(c, s, src0, MUL(go, x1));
        if (c->reach[src1]) accumulate(c, s, src1, MUL(go, x));
        break;
    case OP_DIV:
        if (c->reach[src0]) accumulate(c, s, src0, DIV(go, x1));
        if (c->reach[src1]) accumulate(c, s, src1, op_unary(s, OP_NEG, DIV(MUL(go, y), x1)));
        break;
    case OP_MIN: case OP_MAX: {
        tg_tensor wa = win_mask(g, s, n.op == OP_MAX ? OP_GREATER : OP_LESS, x, x1);
        if (c->reach[src0]) accumulate(c, s, src0, MUL(go, wa));
        if (c->reach[src1]) accumulate(c, s, src1, MUL(go, SUB(num(g, s, 1), wa)));
        break;
    }
    case OP_WHERE: {
        tg_tensor cond = x, zero = num(g, s, 0);
        int srca = n.src[1], srcb = n.src[2];
        if (c->reach[srca]) accumulate(c, s, srca, tg_where_at(s, cond, go, zero));
        if (c->reach[srcb]) accumulate(c, s, srcb, tg_where_at(s, cond, zero, go));
        break;
    }
    case OP_SUM: accumulate(c, s, src0, op_expand(s, go, g->nodes[src0].shape)); break;
    case OP_RESHAPE: accumulate(c, s, src0, op_reshape(s, go, g->nodes[src0].shape)); break;
    case OP_PERMUTE: {
        tg_shape inv = { n.shape.ndim, { 0 } };
        for (int i = 0; i < n.shape.ndim; i++) inv.d[n.iarg[i]] = i;
        accumulate(c, s, src0, tg_permute_at(s, go, inv));
        break;
    }
    case OP_EXPAND: accumulate(c, s, src0, go); break;   /* accumulate unbroadcasts */
    case OP_MATMUL: matmul_rule(c, s, &n, go); break;
    case OP_GATHER_ROWS: accumulate(c, s, src0, op_scatter_rows(s, go, x1, g->nodes[src0].shape.d[0])); break;
    case OP_SCATTER_ROWS: accumulate(c, s, src0, tg_embedding_at(s, go, x1)); break;
    case OP_SOFTMAX: {
        tg_tensor dot = op_sum_keep(s, MUL(go, y), n.axis);
        accumulate(c, s, src0, MUL(y, SUB(go, dot)));
        break;
    }
    case OP_LOG_SOFTMAX: {
        tg_tensor total = op_sum_keep(s, go, n.axis);
        accumulate(c, s, src0, SUB(go, MUL(op_unary(s, OP_EXP, y), total)));
        break;
    }
    case OP_SIN: accumulate(c, s, src0, MUL(go, op_unary(s, OP_COS, x))); break;
    case OP_COS: accumulate(c, s, src0, op_unary(s, OP_NEG, MUL(go, op_unary(s, OP_SIN, x)))); break;
    case OP_GELU: accumulate(c, s, src0, MUL(go, MIRROR(OP_GELU_GRAD, g->nodes[src0].shape, 1, &src0))); break;
    case OP_TAKE_ALONG: {
        int srcs[2] = { go.id, src1 };
        accumulate(c, s, src0, MIRROR(OP_SCATTER_ALONG, g->nodes[src0].shape, 2, srcs));
        break;
    }
    case OP_SCATTER_ALONG: {
        int srcs[2] = { go.id, src1 };
        accumulate(c, s, src0, MIRROR(OP_TAKE_ALONG, g->nodes[src1].shape, 2, srcs));
        break;
    }
    case OP_DROPOUT: accumulate(c, s, src0, MIRROR(OP_DROPOUT, n.shape, 1, &go.id)); break;  /* same mask */
    case OP_SLICE: accumulate(c, s, src0, MIRROR(OP_PAD, g->nodes[src0].shape, 1, &go.id)); break;
    case OP_PAD: accumulate(c, s, src0, MIRROR(OP_SLICE, g->nodes[src0].shape, 1, &go.id)); break;
    case OP_SOFTMAX_CAUSAL: {
        tg_tensor dot = op_sum_keep(s, MUL(go, y), n.shape.ndim - 1);
        accumulate(c, s, src0, MUL(y, SUB(go, dot)));
        break;
    }
    case OP_WHERE_CAUSAL: {
        tg_tensor gx = MIRROR(OP_WHERE_CAUSAL, n.shape, 1, &go.id);
        if (gx.id >= 0) g->nodes[gx.id].farg = 0;   /* masked entries pass no gradient */
        accumulate(c, s, src0, gx);
        break;
    }
    case OP_IM2COL: accumulate(c, s, src0, MIRROR(OP_COL2IM, g->nodes[src0].shape, 1, &go.id)); break;
    case OP_COL2IM: accumulate(c, s, src0, MIRROR(OP_IM2COL, g->nodes[src0].shape, 1, &go.id)); break;
    case OP_MAXPOOL2D: {
        int srcs[2] = { src0, go.id };
        accumulate(c, s, src0, MIRROR(OP_MAXPOOL2D_BWD, g->nodes[src0].shape, 2, srcs));
        break;
    }
    case OP_ATTENTION: attention_rule(c, s, id, go); break;
    default: break;   /* leaves and ops without a gradient */
    }
}

bool grad_build(tg_graph *g, int loss, const int *wrt, int n_wrt, int *grad_out) {
    if (!ir_ok(g)) return false;
    const tg_node ln = g->nodes[loss];   /* a copy: appending nodes may move the array */
    if (ln.numel != 1 || ln.dtype != TG_FLOAT32) {
        char sh[96];
        ir_fail(g, ln.site, "the loss must be an f32 scalar (one element), got %s%s", shape_str(ln.shape, sh),
                ln.dtype == TG_INT32 ? " i32" : "");
        return false;
    }
    int n0 = g->n;
    grad_ctx c = { g, tg_alloc(sizeof(int) * (size_t)n0), tg_alloc(sizeof(bool) * (size_t)n0), tg_alloc(sizeof(int) * (size_t)n0),
                   tg_alloc(sizeof(int) * (size_t)n0) };
    if (!c.acc || !c.reach || !c.group || !c.wide) {
        free(c.acc);
        free(c.reach);
        free(c.group);
        free(c.wide);
        ir_fail(g, ln.site, "out of memory deriving gradients");
        return false;
    }
    tg_graph *outer = tg__trace();   /* the public ops used below append to the traced graph */
    tg__set_trace(g);
    for (int i = 0; i < n0; i++) c.acc[i] = -1;
    for (int k = 0; k < n_wrt; k++) c.reach[wrt[k]] = true;
    for (int i = 0; i < n0; i++) {
        const tg_node *n = &g->nodes[i];
        for (int k = 0; k < n->nsrc && !c.reach[i]; k++) c.reach[i] = flows(n, k) && c.reach[n->src[k]];
        if (n->dtype != TG_FLOAT32) c.reach[i] = false;
    }
    if (c.reach[loss]) c.acc[loss] = op_expand(ln.site, num(g, ln.site, 1), ln.shape).id;
    find_siblings(g, c.reach, n0, c.group);
    early_wide(&c, n0);
    for (int i = loss; i >= 0 && ir_ok(g); i--) {
        if (c.group[i] == i) siblings_rule(&c, i, c.group, n0);
        else if (c.group[i] < 0 && c.reach[i] && c.acc[i] >= 0) rule(&c, i);
    }
    for (int k = 0; k < n_wrt && ir_ok(g); k++) {
        const tg_node wn = g->nodes[wrt[k]];   /* a copy: num() appends, which may move the array */
        grad_out[k] = c.acc[wrt[k]] >= 0 ? c.acc[wrt[k]] : op_expand(wn.site, num(g, wn.site, 0), wn.shape).id;
    }
    free(c.acc);
    free(c.reach);
    free(c.group);
    free(c.wide);
    tg__set_trace(outer);
    return ir_ok(g);
}
