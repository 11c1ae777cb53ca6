/* The core op table shared by test_ops.c (forward values) and test_grad.c (gradients): which op
 * a case runs, in which operand form, and one forward function that builds it from an opctx. Kept
 * in one place so that both tests exercise exactly the same calls. Header-only: each test is its
 * own program. Include after "internal.h". */
#ifndef TG_CORE_OPS_H
#define TG_CORE_OPS_H

typedef enum {
    O_ADD, O_SUB, O_MUL, O_DIV, O_MIN, O_MAX, O_LESS, O_GREATER,                 /* binary */
    O_WHERE,
    O_NEG, O_ABS, O_SQUARE, O_SQRT, O_RSQRT, O_EXP, O_LOG, O_RELU, O_TANH, O_SIGMOID, /* unary */
    O_SUM, O_MEAN, O_RESHAPE, O_PERMUTE, O_SWAPAXES, O_MATMUL, O_ONE_HOT, O_EMBEDDING,
    O_SOFTMAX, O_LOG_SOFTMAX, O_CE, O_NLL,
    O_PMUL,          /* in[0] * tg_p(param) */
    O_LINEAR, O_EMBED, O_LAYERNORM
} opk;
static const char *const opname[] = {
    "add", "sub", "mul", "div", "minimum", "maximum", "less", "greater", "where",
    "neg", "abs", "square", "sqrt", "rsqrt", "exp", "log", "relu", "tanh", "sigmoid",
    "sum", "mean", "reshape", "permute", "swapaxes", "matmul", "one_hot", "embedding",
    "softmax", "log_softmax", "cross_entropy", "nll_loss", "mul(x, tg_p)", "tg_linear",
    "tg_embed", "tg_layernorm"
};
static const char *const redname[] = { "mean", "sum", "none" };

/* How a binary op (or where's last two operands) gets its operands. */
enum {
    S_TT,        /* all tensors: in[0], in[1] (where: in[0], in[1], in[2]) */
    S_NUM_L,     /* plain number on the left:  tg_sub(1.5, x)      where(c, 1.5, x) */
    S_NUM_R,     /* plain number on the right: tg_sub(x, 1.5)      where(c, x, 1.5) */
    S_SCALAR_R   /* tg_scalar() on the right:  tg_sub(x, tg_scalar(1.5)) */
};

typedef struct {
    opk op;
    int side;            /* S_*: binary ops and where */
    double num;          /* the number for S_NUM_* / S_SCALAR_R; layernorm: the eps given */
    int axis, axis2, keep;
    tg_shape shp;        /* reshape target or permute order */
    int64_t n;           /* one_hot classes */
    tg_reduction red;
    const void *layer;   /* tg_linear, tg_embedding_layer, tg_layernorm or tg_param */
} opctx;

static tg_tensor bin_tt(opk op, tg_tensor a, tg_tensor b) {
    switch (op) {
    case O_ADD: return tg_add(a, b);
    case O_SUB: return tg_sub(a, b);
    case O_MUL: return tg_mul(a, b);
    case O_DIV: return tg_div(a, b);
    case O_MIN: return tg_minimum(a, b);
    case O_MAX: return tg_maximum(a, b);
    case O_LESS: return tg_less(a, b);
    default: return tg_greater(a, b);
    }
}
static tg_tensor bin_nt(opk op, double a, tg_tensor b) {   /* plain number on the left */
    switch (op) {
    case O_ADD: return tg_add(a, b);
    case O_SUB: return tg_sub(a, b);
    case O_MUL: return tg_mul(a, b);
    case O_DIV: return tg_div(a, b);
    case O_MIN: return tg_minimum(a, b);
    case O_MAX: return tg_maximum(a, b);
    case O_LESS: return tg_less(a, b);
    default: return tg_greater(a, b);
    }
}
static tg_tensor bin_tn(opk op, tg_tensor a, double b) {   /* plain number on the right */
    switch (op) {
    case O_ADD: return tg_add(a, b);
    case O_SUB: return tg_sub(a, b);
    case O_MUL: return tg_mul(a, b);
    case O_DIV: return tg_div(a, b);
    case O_MIN: return tg_minimum(a, b);
    case O_MAX: return tg_maximum(a, b);
    case O_LESS: return tg_less(a, b);
    default: return tg_greater(a, b);
    }
}
static tg_tensor unary(opk op, tg_tensor x) {
    switch (op) {
    case O_NEG: return tg_neg(x);
    case O_ABS: return tg_abs(x);
    case O_SQUARE: return tg_square(x);
    case O_SQRT: return tg_sqrt(x);
    case O_RSQRT: return tg_rsqrt(x);
    case O_EXP: return tg_exp(x);
    case O_LOG: return tg_log(x);
    case O_RELU: return tg_relu(x);
    case O_TANH: return tg_tanh(x);
    default: return tg_sigmoid(x);
    }
}

static tg_tensor op_forward(const void *vc, const tg_tensor *in) {
    const opctx *c = vc;
    if (c->op <= O_GREATER) {
        switch (c->side) {
        case S_NUM_L: return bin_nt(c->op, c->num, in[0]);
        case S_NUM_R: return bin_tn(c->op, in[0], c->num);
        case S_SCALAR_R: return bin_tt(c->op, in[0], tg_scalar(c->num));
        default: return bin_tt(c->op, in[0], in[1]);
        }
    }
    if (c->op >= O_NEG && c->op <= O_SIGMOID) return unary(c->op, in[0]);
    switch (c->op) {
    case O_WHERE:
        switch (c->side) {
        case S_NUM_L: return tg_where(in[0], c->num, in[1]);
        case S_NUM_R: return tg_where(in[0], in[1], c->num);
        case S_SCALAR_R: return tg_where(in[0], in[1], tg_scalar(c->num));
        default: return tg_where(in[0], in[1], in[2]);
        }
    case O_SUM: return tg_sum(in[0], c->axis, c->keep);
    case O_MEAN: return tg_mean(in[0], c->axis, c->keep);
    case O_RESHAPE: return tg_reshape_at(TG_HERE, in[0], c->shp);
    case O_PERMUTE: return tg_permute_at(TG_HERE, in[0], c->shp);
    case O_SWAPAXES: return tg_swapaxes(in[0], c->axis, c->axis2);
    case O_MATMUL: return tg_matmul(in[0], in[1]);
    case O_ONE_HOT: return tg_one_hot(in[0], c->n);
    case O_EMBEDDING: return tg_embedding(in[0], in[1]);
    case O_SOFTMAX: return tg_softmax(in[0], c->axis);
    case O_LOG_SOFTMAX: return tg_log_softmax(in[0], c->axis);
    case O_CE: return tg_cross_entropy(in[0], in[1], c->red);
    case O_NLL: return tg_nll_loss(in[0], in[1], c->red);
    case O_PMUL: return tg_mul(in[0], tg_p(*(const tg_param *)c->layer));
    case O_LINEAR: return tg_linear((const tg_linear *)c->layer, in[0]);
    case O_EMBED: return tg_embed((const tg_embedding_layer *)c->layer, in[0]);
    case O_LAYERNORM: return tg_layernorm((const tg_layernorm *)c->layer, in[0]);
    default: return in[0];
    }
}
#endif
