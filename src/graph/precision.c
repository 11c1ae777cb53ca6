/* Where a bf16 graph rounds its activations (graph.h's graph_bf16_values): the rule every
 * backend and the reference follow, so that a backend may store those values in two bytes. */
#include "graph/graph.h"

#include <stdlib.h>

/* Ops that only move or select values: their output is bf16 exactly when their source is. */
static bool moves(tg_op op) {
    return op == OP_RESHAPE || op == OP_PERMUTE || op == OP_EXPAND || op == OP_SLICE || op == OP_PAD || op == OP_IDENTITY;
}

/* Products and attention: rounded as autocast rounds them (attention's output, and the gradients
 * of k and v; q's is added up in f32 as the key tiles arrive, and stays f32), unless a parameter's
 * gradient adds them up (f32_products). */
bool graph_library_output(tg_op op) { return op == OP_MATMUL || op == OP_ATTENTION || op == OP_ATTENTION_BWD; }

/* Element-by-element arithmetic, rounded when its full-size operands are bf16 values. */
static bool arithmetic(tg_op op) {
    switch (op) {
    case OP_NEG: case OP_ABS: case OP_SQUARE: case OP_SQRT: case OP_RSQRT: case OP_EXP: case OP_LOG:
    case OP_RELU: case OP_TANH: case OP_SIGMOID: case OP_SIGN: case OP_STEP: case OP_SIN: case OP_COS:
    case OP_GELU: case OP_GELU_GRAD: case OP_DROPOUT:
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MIN: case OP_MAX: case OP_WHERE:
        return true;
    default:
        return false;
    }
}

/* An element-wise node is a bf16 activation when one source is and every other float source is
 * smaller (broadcast: a bias, a scale, a per-row statistic): autocast's promotion, with
 * parameters cast down. A full-size f32 operand (the residual stream) keeps the result f32. */
static bool follows(const tg_graph *g, const tg_node *n, const bool *bf16) {
    bool any = false;
    for (int k = 0; k < n->nsrc; k++) {
        const tg_node *s = &g->nodes[n->src[k]];
        if (s->dtype != TG_FLOAT32) continue;
        if (bf16[n->src[k]]) any = true;
        else if (s->numel >= n->numel && s->op != OP_CONST && s->op != OP_HYPER) return false;
    }
    return any;
}

/* The products (and attention's gradients) that stay f32: those a parameter's gradient adds up
 * (dW = x^T dy, through adds and reshapes), as the gradients and the optimizer are f32, and those
 * only sums read (a batch of weight gradients, a convolution's input gradient through col2im),
 * whose sum is f32 too. */
static void f32_products(const tg_graph *g, bool *f32, int *stack) {
    int *sums = stack;   /* first, per node: -1 once read by anything but a sum, else how many sums read it */
    for (int i = 0; i < g->n; i++) sums[i] = 0;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].nsrc; k++) {
            int *r = &sums[g->nodes[i].src[k]];
            *r = g->nodes[i].op != OP_SUM && g->nodes[i].op != OP_COL2IM ? -1 : *r < 0 ? -1 : *r + 1;
        }
    for (int i = 0; i < g->n; i++) f32[i] = graph_library_output(g->nodes[i].op) && sums[i] > 0 && i != g->output;
    for (int p = 0; p < g->n_params; p++) {
        int top = 0;
        if (g->grad_of_param && g->grad_of_param[p] >= 0) stack[top++] = g->grad_of_param[p];
        while (top > 0) {
            const tg_node *n = &g->nodes[stack[--top]];
            if (graph_library_output(n->op)) f32[stack[top]] = true;
            if (n->op != OP_ADD && !moves(n->op)) continue;
            for (int k = 0; k < n->nsrc && top < g->n; k++) stack[top++] = n->src[k];
        }
    }
}

/* Is source k of ADD node `add` a product, the other source its addend (graph_product_addend):
 * a vector along the sum's last axis (a bias), or a bf16 activation of the sum's shape (bf16 NULL:
 * a bias only)? */
static bool product_and_addend(const tg_graph *g, const bool *bf16, const tg_node *add, int k) {
    const tg_node *p = &g->nodes[add->src[k]], *b = &g->nodes[add->src[1 - k]];
    int r = add->shape.ndim;
    if (add->op != OP_ADD || add->nsrc != 2 || p->op != OP_MATMUL || p->dtype != TG_FLOAT32 || b->dtype != TG_FLOAT32 ||
        p->numel != add->numel || r < 2 || add->src[0] == add->src[1])
        return false;
    bool bias = b->shape.ndim >= 1 && b->shape.d[b->shape.ndim - 1] == add->shape.d[r - 1] && b->numel == add->shape.d[r - 1];
    return bias || (bf16 && b->numel == add->numel && bf16[add->src[1 - k]]);
}

/* A value the caller sees keeps its rounding: it counts as read twice. */
void graph_uses(const tg_graph *g, int *uses) {
    for (int i = 0; i < g->n; i++) uses[i] = 0;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].nsrc; k++) uses[g->nodes[i].src[k]]++;
    if (g->output >= 0) uses[g->output] += 2;
    for (int k = 0; k < g->n_assigns; k++) uses[g->assigns[k].src] += 2;
    for (int k = 0; k < g->n_captures; k++) uses[g->captures[k].node] += 2;
    for (int k = 0; k < g->n_patches; k++) uses[g->patches[k].node] += 2;
}

int graph_product_addend(const tg_graph *g, const bool *bf16, int id) {
    const tg_node *n = &g->nodes[id];
    if (!bf16 || !bf16[id] || n->op != OP_ADD) return -1;
    for (int k = 0; k < 2; k++)
        if (product_and_addend(g, bf16, n, k) && !bf16[n->src[k]]) return n->src[k];   /* an f32 product's sum is never bf16 */
    return -1;
}

int graph_product_bias(const tg_graph *g, const int *uses, int id) {
    const tg_node *n = &g->nodes[id];
    for (int k = 0; k < 2 && n->op == OP_ADD; k++)
        if (product_and_addend(g, NULL, n, k) && uses[n->src[k]] == 1) return n->src[k];
    return -1;
}

bool graph_bf16_values(const tg_graph *g, bool **out) {
    *out = NULL;
    if (g->precision != TG_PRECISION_BF16) return true;
    bool *bf16 = tg_alloc(sizeof(bool) * (size_t)(g->n + 1)), *f32 = tg_alloc(sizeof(bool) * (size_t)(g->n + 1));
    int *stack = tg_alloc(sizeof(int) * (size_t)(g->n + 1));
    if (!bf16 || !f32 || !stack) {
        free(bf16);
        free(f32);
        free(stack);
        return false;
    }
    f32_products(g, f32, stack);
    for (int i = 0; i < g->n; i++) {
        const tg_node *n = &g->nodes[i];
        bf16[i] = false;
        if (n->dtype != TG_FLOAT32) continue;
        if (graph_library_output(n->op)) bf16[i] = !f32[i] && !(n->op == OP_ATTENTION_BWD && n->iarg[1] == 0);
        else if (moves(n->op)) bf16[i] = bf16[n->src[0]];
        else if (arithmetic(n->op)) bf16[i] = follows(g, n, bf16);
    }
    graph_uses(g, stack);   /* products whose only reader adds their bias (or a bf16 value): rounded once, with it */
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < 2 && bf16[i]; k++) {
            int p = g->nodes[i].src[k];
            if (product_and_addend(g, bf16, &g->nodes[i], k) && bf16[p] && stack[p] == 1) {
                bf16[p] = false;
                break;
            }
        }
    free(f32);
    free(stack);
    *out = bf16;
    return true;
}

bool graph_rounds(const tg_graph *g, const bool *bf16, int id) {
    return bf16 && bf16[id] && !moves(g->nodes[id].op);
}
