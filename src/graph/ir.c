/* The graph IR: an append-only list of nodes in topological order, the first trace error, and
 * the inspection API. */
#include "graph/graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const OP_NAMES[OP_COUNT] = {
    [OP_INPUT] = "input", [OP_PARAM] = "param", [OP_STATE] = "state", [OP_CONST] = "const",
    [OP_HYPER] = "hyper", [OP_NEG] = "neg", [OP_ABS] = "abs", [OP_SQUARE] = "square",
    [OP_SQRT] = "sqrt", [OP_RSQRT] = "rsqrt", [OP_EXP] = "exp", [OP_LOG] = "log",
    [OP_RELU] = "relu", [OP_TANH] = "tanh", [OP_SIGMOID] = "sigmoid", [OP_SIGN] = "sign",
    [OP_STEP] = "step", [OP_ADD] = "add", [OP_SUB] = "sub", [OP_MUL] = "mul", [OP_DIV] = "div",
    [OP_MIN] = "minimum", [OP_MAX] = "maximum", [OP_LESS] = "less", [OP_GREATER] = "greater",
    [OP_EQUAL] = "equal", [OP_WHERE] = "where", [OP_SUM] = "sum", [OP_RESHAPE] = "reshape",
    [OP_PERMUTE] = "permute", [OP_EXPAND] = "expand", [OP_MATMUL] = "matmul",
    [OP_ONE_HOT] = "one_hot", [OP_GATHER_ROWS] = "gather_rows", [OP_SCATTER_ROWS] = "scatter_rows",
    [OP_SOFTMAX] = "softmax", [OP_LOG_SOFTMAX] = "log_softmax", [OP_SIN] = "sin", [OP_COS] = "cos",
    [OP_GELU] = "gelu", [OP_GELU_GRAD] = "gelu_grad", [OP_IDENTITY] = "identity", [OP_ARGMAX] = "argmax",
    [OP_TAKE_ALONG] = "take_along_axis", [OP_SCATTER_ALONG] = "scatter_along_axis", [OP_IOTA] = "arange",
    [OP_RANDN] = "randn", [OP_DROPOUT] = "dropout", [OP_SLICE] = "narrow", [OP_PAD] = "pad",
    [OP_SOFTMAX_CAUSAL] = "softmax_causal", [OP_WHERE_CAUSAL] = "where_causal", [OP_IM2COL] = "im2col",
    [OP_COL2IM] = "col2im", [OP_MAXPOOL2D] = "max_pool2d", [OP_MAXPOOL2D_BWD] = "max_pool2d_backward",
    [OP_ATTENTION] = "attention", [OP_ATTENTION_LSE] = "attention_lse", [OP_ATTENTION_BWD] = "attention_backward",
};

const char *op_name(tg_op op) { return (op >= 0 && op < OP_COUNT && OP_NAMES[op]) ? OP_NAMES[op] : "?"; }

int64_t tg_numel(tg_shape s) { return shape_numel(s); }

int64_t shape_numel(tg_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    return n;
}

char *shape_str(tg_shape s, char *buf) {
    /* Callers give 96 bytes; six 20-digit dimensions (a hostile shape) would not fit, so the
     * tail is cut to ",...]". */
    size_t k = 0;
    buf[k++] = '[';
    for (int i = 0; i < s.ndim && i < TG_MAX_DIMS; i++) {
        char d[24];
        int w = snprintf(d, sizeof d, i ? ",%lld" : "%lld", (long long)s.d[i]);
        if (k + (size_t)w + 6 > 96) { memcpy(buf + k, ",...", 4); k += 4; break; }
        memcpy(buf + k, d, (size_t)w);
        k += (size_t)w;
    }
    buf[k++] = ']';
    buf[k] = 0;
    return buf;
}

/* The graph being traced on this thread: ops reach it through their tensors, but parameters
 * and plain numbers have no tensor to ask. */
static _Thread_local tg_graph *current_trace;
void tg__set_trace(tg_graph *g) { current_trace = g; }
tg_graph *tg__trace(void) { return current_trace; }

tg_graph *ir_new(tg_model *m) {
    tg_graph *g = tg_alloc(sizeof *g);
    if (!g) return NULL;
    g->model = m;
    g->output = -1;
    g->guard = -1;
    g->n_params = m ? tg_model_n_params(m) : 0;
    g->param_node = tg_alloc(sizeof(int) * (size_t)(g->n_params + 1));
    g->grad_of_param = tg_alloc(sizeof(int) * (size_t)(g->n_params + 1));
    if (!g->param_node || !g->grad_of_param) {
        ir_free(g);
        return NULL;
    }
    for (int i = 0; i < g->n_params; i++) g->param_node[i] = g->grad_of_param[i] = -1;
    return g;
}

void ir_free(tg_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == OP_INPUT) free((char *)g->nodes[i].name);
    free(g->nodes);
    free(g->param_node);
    free(g->grad_of_param);
    free(g->state_shape_node);
    free(g->assigns);
    for (int i = 0; i < g->n_captures; i++) free(g->captures[i].name);
    for (int i = 0; i < g->n_patches; i++) free(g->patches[i].name);
    free(g->captures);
    free(g->patches);
    free(g);
}

bool ir_ok(const tg_graph *g) { return g && g->error[0] == 0; }

void ir_fail(tg_graph *g, tg_site s, const char *fmt, ...) {
    if (!g || g->error[0]) return;   /* the first error is the one that explains the rest */
    int k = snprintf(g->error, sizeof g->error, "%s:%d: ", s.file ? s.file : "?", s.line);
    if (k < 0 || k >= (int)sizeof g->error) k = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->error + k, sizeof g->error - (size_t)k, fmt, ap);
    va_end(ap);
}

int ir_add(tg_graph *g, tg_site s, tg_op op, tg_dtype dt, tg_shape shape, int nsrc, const int *src) {
    /* Every shape rule's result passes here: a product of valid dimensions (a broadcast, a
     * matrix product, an upsampling) can still overflow, and no buffer could hold it anyway. */
    if (!shape_valid(g, s, op_name(op), shape)) return -1;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        tg_node *nn = tg_realloc(g->nodes, sizeof(tg_node) * (size_t)cap);
        if (!nn) { ir_fail(g, s, "out of memory growing the graph"); return -1; }
        g->nodes = nn;
        g->cap = cap;
    }
    tg_node *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->dtype = dt;
    n->shape = shape;
    n->numel = shape_numel(shape);
    n->nsrc = nsrc;
    for (int i = 0; i < nsrc; i++) n->src[i] = src[i];
    n->site = s;
    return g->n++;
}

void ir_add_assign(tg_graph *g, int dst, int src) {
    if (!ir_ok(g) || dst < 0 || src < 0) return;   /* after an error: the graph will not be used */
    if (g->n_assigns == g->cap_assigns) {
        int cap = g->cap_assigns ? 2 * g->cap_assigns : 16;
        tg_assign *grown = tg_realloc(g->assigns, sizeof(tg_assign) * (size_t)cap);
        if (!grown) { ir_fail(g, TG_HERE, "out of memory adding an optimizer update"); return; }
        g->assigns = grown;
        g->cap_assigns = cap;
    }
    g->assigns[g->n_assigns++] = (tg_assign){ dst, src };
}

/* ----- inspection ----- */

int tg_graph_n_captures(const tg_graph *g) { return g ? g->n_captures : 0; }
int tg_graph_n_patches(const tg_graph *g) { return g ? g->n_patches : 0; }

static const char *named_at(const tg_named *list, int n, int i, int *node) {
    if (i < 0 || i >= n) return NULL;
    if (node) *node = list[i].node;
    return list[i].name;
}
const char *tg_graph_capture(const tg_graph *g, int i, int *node) { return g ? named_at(g->captures, g->n_captures, i, node) : NULL; }
const char *tg_graph_patch(const tg_graph *g, int i, int *node) { return g ? named_at(g->patches, g->n_patches, i, node) : NULL; }

int tg_graph_n_nodes(const tg_graph *g) { return g ? g->n : 0; }
int tg_graph_output(const tg_graph *g) { return g ? g->output : -1; }

tg_node_info tg_graph_node(const tg_graph *g, int id) {
    tg_node_info info;
    memset(&info, 0, sizeof info);
    if (!g || id < 0 || id >= g->n) return info;
    const tg_node *n = &g->nodes[id];
    info.op = op_name(n->op);
    info.name = n->name;
    info.dtype = n->dtype;
    info.shape = n->shape;
    info.n_inputs = n->nsrc;
    for (int i = 0; i < n->nsrc && i < TG_MAX_SRC; i++) info.inputs[i] = n->src[i];
    info.site = n->site;
    return info;
}

char *tg_graph_dot(const tg_graph *g) {
    if (!g) return NULL;
    strbuf b = { 0 };
    sb_printf(&b, "digraph tensorgrad {\n  node [shape=box, fontname=\"monospace\"];\n");
    char sh[128];
    for (int i = 0; i < g->n; i++) {
        const tg_node *n = &g->nodes[i];
        sb_printf(&b, "  n%d [label=\"%d %s%s%s %s%s\"%s];\n", i, i, op_name(n->op),
                  n->name ? " " : "", n->name ? n->name : "", shape_str(n->shape, sh),
                  n->dtype == TG_INT32 ? " i32" : "", i == g->output ? ", style=bold" : "");
        for (int k = 0; k < n->nsrc; k++) sb_printf(&b, "  n%d -> n%d;\n", n->src[k], i);
    }
    for (int i = 0; i < g->n_assigns; i++)
        sb_printf(&b, "  n%d -> n%d [style=dashed, label=\"write-back\"];\n", g->assigns[i].src, g->assigns[i].dst);
    sb_printf(&b, "}\n");
    return sb_take(&b);
}
