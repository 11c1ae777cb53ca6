/* Gradients by reverse-mode autograd, checked against central finite differences in double
 * precision on the reference interpreter (tg_probe, round_f32 = false).
 *
 * For an op case, the loss is sum(op(inputs) * W), W a fixed random f32 input of the op's output
 * shape with entries +-[0.5, 1.5], so every output element matters. Every element of every f32
 * input (W included) and of every parameter the graph uses is perturbed by +-H and the central
 * difference n = (f(x+H) - f(x-H)) / 2H is compared with the analytic gradient a:
 *
 *     |a - n| / max(|a|, |n|, GRAD_FLOOR) <= GRAD_TOL
 *
 * GRAD_FLOOR keeps the measure from blowing up where the true gradient is ~0: there the central
 * difference carries a rounding noise of about eps * |loss| / H ~ 1e-10..1e-9 (losses are sums of
 * ~100 terms), so an absolute error of GRAD_TOL * GRAD_FLOOR = 1e-9 is allowed there and pure
 * relative error elsewhere. (A floor of 1e-6 fails on exactly such a case: the key bias of the
 * attention model has a true gradient of 0, analytic 7e-18, numeric -1.1e-10.)
 *
 * Inputs stay away from non-differentiable points (relu/abs away from 0, min/max operands apart,
 * sqrt/log/rsqrt positive); the min/max tie case is tested on its own (gradient split half and
 * half; the central difference at a tie also gives exactly 1/2). Inputs that must get no
 * gradient (the cond of where, both operands of less/greater) are checked to be exactly 0.
 *
 * GRAD_H, GRAD_TOL, GRAD_FLOOR and the checking loop itself live in probe_util.h (shared with
 * test_ops_more.c). */
#include "internal.h"
#include "check.h"
#include "probe_util.h"
#include "core_ops.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* What to test: the op table and op_forward are in core_ops.h (shared with test_ops.c). */

/* An op case: the gradients of sum(op(inputs) * W) (probe_util.h: op_gradcheck). These graphs
 * draw no random numbers, so the seed (0) does not matter. */
static void grad_case(const char *what, const opctx *c, tg_model *model, int n_in, const inspec *ins) {
    op_gradcheck(what, op_forward, c, model, n_in, ins, 0, false);
}


/* ---------------------------------------------------------------------------------------------
 * The cases
 * ------------------------------------------------------------------------------------------- */

static void test_binary(void) {
    static const opk ops[] = { O_ADD, O_SUB, O_MUL, O_DIV, O_MIN, O_MAX };
    inspec pairs[][2] = {
        { FIN("a", -2, 2, 3, 5),    AIN("b", 0.5, 2, 3, 5) },
        { FIN("a", -2, 2, 3, 1, 5), AIN("b", 0.5, 2, 7, 1) },      /* both operands broadcast */
        { FIN("a", -2, 2, 5),       AIN("b", 0.5, 2, 2, 3, 1) },   /* rank 1 vs rank 3 */
        { FIN("a", -2, 2, 2, 3, 5), AIN("b", 0.5, 2, 1) },
    };
    inspec one = AIN("x", 0.5, 2, 3, 1, 5);
    char what[200], b1[96], b2[96];
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        opctx c = { .op = ops[o], .side = S_TT };
        for (size_t k = 0; k < sizeof pairs / sizeof *pairs; k++) {
            snprintf(what, sizeof what, "%s %s %s", opname[ops[o]], shape_s(pairs[k][0].d.shape, b1), shape_s(pairs[k][1].d.shape, b2));
            grad_case(what, &c, NULL, 2, pairs[k]);
        }
        static const struct { int side; double num; const char *form; } forms[] = {
            { S_NUM_L, 1.25, "number, x" }, { S_NUM_R, -0.75, "x, number" }, { S_SCALAR_R, 1.5, "x, tg_scalar" },
        };
        for (size_t f = 0; f < 3; f++) {
            c.side = forms[f].side;
            c.num = forms[f].num;
            snprintf(what, sizeof what, "%s(%s %g)", opname[ops[o]], forms[f].form, forms[f].num);
            grad_case(what, &c, NULL, 1, &one);
        }
    }
    /* less / greater: no gradient to either operand. */
    inspec cmp[][2] = { { ZIN("a", -2, 2, 3, 5), ZIN("b", -2, 2, 3, 5) }, { ZIN("a", -2, 2, 3, 1, 5), ZIN("b", -2, 2, 7, 1) } };
    for (int op = O_LESS; op <= O_GREATER; op++) {
        opctx c = { .op = (opk)op };
        for (size_t k = 0; k < 2; k++) {
            snprintf(what, sizeof what, "%s %s %s", opname[op], shape_s(cmp[k][0].d.shape, b1), shape_s(cmp[k][1].d.shape, b2));
            grad_case(what, &c, NULL, 2, cmp[k]);
        }
        inspec z = ZIN("x", -2, 2, 4, 3);
        c.side = S_NUM_L;
        c.num = 0.25;
        snprintf(what, sizeof what, "%s(0.25, x)", opname[op]);
        grad_case(what, &c, NULL, 1, &z);
    }
}

/* Ties of minimum/maximum: the gradient is split half and half (as torch.minimum/maximum). */
static void test_ties(void) {
    char what[200];
    for (int op = O_MIN; op <= O_MAX; op++) {
        opctx c = { .op = (opk)op };
        /* Explicitly, same shapes: d/da = W * (a wins ? 1 : tie ? 0.5 : 0). */
        inspec ins[3] = { QIN("a", 4, 5), QIN("b", 4, 5), AIN("W", 0.5, 1.5, 4, 5) };
        wctx w = { op_forward, &c, 2 };
        tg_model *m = tg_model_new(5);
        snprintf(what, sizeof what, "%s ties, exact split", opname[op]);
        tg_probe *p = gradcheck(what, m, weighted_loss, &w, 3, ins, 0, true);
        if (p) {
            const double *a = tg_probe_input(p, 0), *b = tg_probe_input(p, 1), *W = tg_probe_input(p, 2);
            const double *ga = tg_probe_input_grad(p, 0), *gb = tg_probe_input_grad(p, 1);
            int nties = 0, bad = 0;
            for (int i = 0; i < 20; i++) {
                bool a_wins = op == O_MIN ? a[i] < b[i] : a[i] > b[i];
                double sa = a[i] == b[i] ? 0.5 : a_wins ? 1 : 0;
                nties += a[i] == b[i];
                if (ga[i] != sa * W[i] || gb[i] != (1 - sa) * W[i]) bad++;
            }
            CHECK(nties > 0 && nties < 20, "%s: the test wants some ties, has %d of 20", what, nties);
            CHECK(bad == 0, "%s: %d of 20 gradient pairs are not W * (1, 0), (1/2, 1/2) or (0, 1)", what, bad);
            tg_probe_free(p);
        }
        tg_model_free(m);
        /* With broadcasting, by finite differences (exact 1/2 at a tie). */
        inspec bc[2] = { QIN("a", 4, 1, 5), QIN("b", 3, 1) };
        snprintf(what, sizeof what, "%s ties [4,1,5] [3,1]", opname[op]);
        grad_case(what, &c, NULL, 2, bc);
        inspec one = QIN("x", 3, 5);
        c.side = S_NUM_R;
        c.num = 0.5;
        snprintf(what, sizeof what, "%s(x, 0.5) ties", opname[op]);
        grad_case(what, &c, NULL, 1, &one);
    }
}

static void test_where(void) {
    inspec cases[][3] = {
        { CIN("c", 3, 5),    FIN("a", -2, 2, 3, 5), FIN("b", -2, 2, 3, 5) },
        { CIN("c", 3, 1, 5), FIN("a", -2, 2, 7, 1), FIN("b", -2, 2, 5) },
        { CIN("c", 4, 1),    FIN("a", -2, 2, 1, 3), FIN("b", -2, 2, 2, 4, 3) },
    };
    char what[200], b1[96], b2[96], b3[96];
    opctx c = { .op = O_WHERE, .side = S_TT };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        snprintf(what, sizeof what, "where %s %s %s", shape_s(cases[k][0].d.shape, b1),
                 shape_s(cases[k][1].d.shape, b2), shape_s(cases[k][2].d.shape, b3));
        grad_case(what, &c, NULL, 3, cases[k]);
    }
    inspec two[2] = { CIN("c", 3, 1, 5), FIN("x", -2, 2, 4, 5) };
    static const struct { int side; double num; const char *name; } forms[] = {
        { S_NUM_L, 2.5, "where(c, 2.5, x)" }, { S_NUM_R, -0.5, "where(c, x, -0.5)" }, { S_SCALAR_R, 0.25, "where(c, x, tg_scalar(0.25))" },
    };
    for (size_t f = 0; f < 3; f++) {
        c.side = forms[f].side;
        c.num = forms[f].num;
        grad_case(forms[f].name, &c, NULL, 2, two);
    }
}

static void test_unary(void) {
    static const struct { opk op; fillk fill; double lo, hi; } un[] = {
        { O_NEG, F_UNI, -2, 2 }, { O_ABS, F_AWAY, 0.1, 2 }, { O_SQUARE, F_UNI, -2, 2 }, { O_SQRT, F_UNI, 0.3, 3 },
        { O_RSQRT, F_UNI, 0.3, 3 }, { O_EXP, F_UNI, -2, 2 }, { O_LOG, F_UNI, 0.3, 3 }, { O_RELU, F_AWAY, 0.1, 2 },
        { O_TANH, F_UNI, -3, 3 }, { O_SIGMOID, F_UNI, -4, 4 },
    };
    char what[200], b1[96];
    for (size_t k = 0; k < sizeof un / sizeof *un; k++) {
        opctx c = { .op = un[k].op };
        inspec ins[2] = { { TG_F32("x", 3, 1, 7), un[k].fill, un[k].lo, un[k].hi, false },
                          { TG_F32("x", 5), un[k].fill, un[k].lo, un[k].hi, false } };
        for (int i = 0; i < 2; i++) {
            snprintf(what, sizeof what, "%s %s", opname[un[k].op], shape_s(ins[i].d.shape, b1));
            grad_case(what, &c, NULL, 1, &ins[i]);
        }
    }
}

static void test_reduce(void) {
    static const int axes[] = { 0, 1, 2, -1, -2, -3, TG_ALL };
    inspec x3 = FIN("x", -2, 2, 3, 4, 5), x1 = FIN("x", -2, 2, 4, 1, 3);
    char what[200];
    for (int op = O_SUM; op <= O_MEAN; op++)
        for (int keep = 0; keep < 2; keep++) {
            for (size_t a = 0; a < sizeof axes / sizeof *axes; a++) {
                opctx c = { .op = (opk)op, .axis = axes[a], .keep = keep };
                if (axes[a] == TG_ALL) snprintf(what, sizeof what, "%s [3,4,5] TG_ALL keepdims %d", opname[op], keep);
                else snprintf(what, sizeof what, "%s [3,4,5] axis %d keepdims %d", opname[op], axes[a], keep);
                grad_case(what, &c, NULL, 1, &x3);
            }
            opctx c = { .op = (opk)op, .axis = 1, .keep = keep };
            snprintf(what, sizeof what, "%s [4,1,3] axis 1 keepdims %d", opname[op], keep);
            grad_case(what, &c, NULL, 1, &x1);
        }
}

static void test_shape_ops(void) {
    char what[200], b1[96];
    inspec x = FIN("x", -2, 2, 3, 5, 2), x4 = FIN("x", -2, 2, 2, 1, 3, 5);
    tg_shape reshapes[] = { TG_SHAPE(5, -1), TG_SHAPE(-1), TG_SHAPE(2, -1, 5), TG_SHAPE(3, 1, 10, 1) };
    for (size_t k = 0; k < sizeof reshapes / sizeof *reshapes; k++) {
        opctx c = { .op = O_RESHAPE, .shp = reshapes[k] };
        snprintf(what, sizeof what, "reshape [3,5,2] -> %s", shape_s(reshapes[k], b1));
        grad_case(what, &c, NULL, 1, &x);
    }
    struct { tg_shape order; const inspec *in; } perms[] = {
        { TG_SHAPE(2, 0, 1), &x }, { TG_SHAPE(1, 2, 0), &x }, { TG_SHAPE(3, 1, 0, 2), &x4 },
    };
    for (size_t k = 0; k < sizeof perms / sizeof *perms; k++) {
        opctx c = { .op = O_PERMUTE, .shp = perms[k].order };
        snprintf(what, sizeof what, "permute %s by %s", perms[k].in == &x ? "[3,5,2]" : "[2,1,3,5]", shape_s(perms[k].order, b1));
        grad_case(what, &c, NULL, 1, perms[k].in);
    }
    struct { int a, b; const inspec *in; } swaps[] = { { 0, 2, &x }, { -1, -2, &x }, { 1, 3, &x4 } };
    for (size_t k = 0; k < sizeof swaps / sizeof *swaps; k++) {
        opctx c = { .op = O_SWAPAXES, .axis = swaps[k].a, .axis2 = swaps[k].b };
        snprintf(what, sizeof what, "swapaxes %s %d %d", swaps[k].in == &x ? "[3,5,2]" : "[2,1,3,5]", swaps[k].a, swaps[k].b);
        grad_case(what, &c, NULL, 1, swaps[k].in);
    }
}

static void test_matmul(void) {
    inspec mm[][2] = {
        { FIN("a", -2, 2, 3, 5),       FIN("b", -2, 2, 5, 4) },
        { FIN("a", -2, 2, 2, 3, 5),    FIN("b", -2, 2, 5, 4) },      /* [B,M,K] x [K,N]: dB sums over B */
        { FIN("a", -2, 2, 2, 3, 5),    FIN("b", -2, 2, 2, 5, 4) },
        { FIN("a", -2, 2, 2, 1, 3, 5), FIN("b", -2, 2, 3, 5, 4) },   /* batch dims broadcast both ways */
        { FIN("a", -2, 2, 3, 5),       FIN("b", -2, 2, 2, 5, 4) },   /* dA sums over B's batch */
        { FIN("a", -2, 2, 3, 1),       FIN("b", -2, 2, 1, 4) },
        { FIN("a", -2, 2, 2, 1, 5),    FIN("b", -2, 2, 5, 1) },
    };
    opctx c = { .op = O_MATMUL };
    char what[200], b1[96], b2[96];
    for (size_t k = 0; k < sizeof mm / sizeof *mm; k++) {
        snprintf(what, sizeof what, "matmul %s x %s", shape_s(mm[k][0].d.shape, b1), shape_s(mm[k][1].d.shape, b2));
        grad_case(what, &c, NULL, 2, mm[k]);
    }
}

static void test_embedding(void) {
    /* Repeated indices accumulate; out-of-range ones (-1, 5) contribute nothing. */
    inspec em[][2] = {
        { FIN("t", -2, 2, 5, 3), IIN("i", -1, 5, 2, 4) },
        { FIN("t", -2, 2, 4, 3), IIN("i", 0, 3, 7) },
    };
    opctx c = { .op = O_EMBEDDING };
    char what[200], b1[96], b2[96];
    for (size_t k = 0; k < sizeof em / sizeof *em; k++) {
        snprintf(what, sizeof what, "embedding table %s idx %s", shape_s(em[k][0].d.shape, b1), shape_s(em[k][1].d.shape, b2));
        grad_case(what, &c, NULL, 2, em[k]);
    }
}

static void test_softmax(void) {
    struct { inspec x; int axis; } sm[] = {
        { FIN("x", -3, 3, 3, 5), -1 }, { FIN("x", -3, 3, 3, 5), 0 }, { FIN("x", -3, 3, 2, 5, 3), 1 },
        { FIN("x", -3, 3, 2, 5, 3), -1 }, { FIN("x", -3, 3, 4, 1), -1 },
    };
    char what[200], b1[96];
    for (int op = O_SOFTMAX; op <= O_LOG_SOFTMAX; op++)
        for (size_t k = 0; k < sizeof sm / sizeof *sm; k++) {
            opctx c = { .op = (opk)op, .axis = sm[k].axis };
            snprintf(what, sizeof what, "%s %s axis %d", opname[op], shape_s(sm[k].x.d.shape, b1), sm[k].axis);
            grad_case(what, &c, NULL, 1, &sm[k].x);
        }
}

static void test_losses(void) {
    inspec ce[][2] = {
        { FIN("x", -3, 3, 6, 5),    IIN("t", 0, 4, 6) },
        { FIN("x", -3, 3, 2, 3, 4), IIN("t", 0, 3, 2, 3) },
        { FIN("x", -3, 3, 1, 3),    IIN("t", 0, 2, 1) },
    };
    char what[200], b1[96];
    for (int op = O_CE; op <= O_NLL; op++)
        for (int r = TG_MEAN; r <= TG_NONE; r++)
            for (size_t k = 0; k < sizeof ce / sizeof *ce; k++) {
                opctx c = { .op = (opk)op, .red = (tg_reduction)r };
                snprintf(what, sizeof what, "%s %s reduction %s", opname[op], shape_s(ce[k][0].d.shape, b1), redname[r]);
                grad_case(what, &c, NULL, 2, ce[k]);
            }
}

static void test_layers(void) {
    tg_model *m = tg_model_new(11);
    tg_linear lin = tg_linear_new(m, "lin", 5, 4, NULL);
    tg_linear nob = tg_linear_new(m, "nob", 5, 4, &(tg_linear_opts){ .no_bias = 1 });
    tg_embedding_layer emb = tg_embedding_new(m, "emb", 6, 3);
    tg_layernorm ln = tg_layernorm_new(m, "ln", 5, 0, 1), ln2 = tg_layernorm_new(m, "ln2", 5, 0.5, 0);
    tg_param P = tg_param_new(m, "P", TG_SHAPE(1, 5), tg_init_randn(1));
    CHECK(tg_model_error(m) == NULL, "model error: %s", tg_model_error(m));
    inspec x2 = FIN("x", -2, 2, 3, 5), x3 = FIN("x", -2, 2, 2, 3, 5);
    inspec idx[] = { IIN("i", 0, 5, 2, 5), IIN("i", -1, 6, 3, 1, 2) };
    struct { const char *what; opctx c; const inspec *in; } cases[] = {
        { "tg_linear x [3,5]", { .op = O_LINEAR, .layer = &lin }, &x2 },
        { "tg_linear x [2,3,5]", { .op = O_LINEAR, .layer = &lin }, &x3 },
        { "tg_linear no bias x [2,3,5]", { .op = O_LINEAR, .layer = &nob }, &x3 },
        { "tg_embed idx [2,5]", { .op = O_EMBED, .layer = &emb }, &idx[0] },
        { "tg_embed idx [3,1,2] (out of range -1, 6)", { .op = O_EMBED, .layer = &emb }, &idx[1] },
        { "tg_layernorm x [3,5]", { .op = O_LAYERNORM, .layer = &ln }, &x2 },
        { "tg_layernorm x [2,3,5]", { .op = O_LAYERNORM, .layer = &ln }, &x3 },
        { "tg_layernorm eps 0.5 no bias x [2,3,5]", { .op = O_LAYERNORM, .layer = &ln2 }, &x3 },
        { "mul(x [2,3,5], tg_p [1,5])", { .op = O_PMUL, .layer = &P }, &x3 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) grad_case(cases[k].what, &cases[k].c, m, 1, cases[k].in);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Composite models
 * ------------------------------------------------------------------------------------------- */

typedef struct { tg_embedding_layer emb; tg_linear l1, l2; tg_layernorm ln; } mlp;
/* embed(idx) + x -> linear -> tanh -> layernorm -> linear -> cross_entropy(mean) */
static tg_tensor mlp_loss(const void *vc, const tg_tensor *in) {
    const mlp *n = vc;
    tg_tensor h = tg_add(tg_embed(&n->emb, in[0]), in[1]);        /* [4,3,5] */
    h = tg_layernorm(&n->ln, tg_tanh(tg_linear(&n->l1, h)));       /* [4,3,7] */
    return tg_cross_entropy(tg_linear(&n->l2, h), in[2], TG_MEAN);
}

typedef struct { tg_linear q, k, v; } attn;
/* One attention head: softmax(q k^T / sqrt(d)) v over [B,T,D], then mean((out - y)^2). */
static tg_tensor attn_loss(const void *vc, const tg_tensor *in) {
    const attn *a = vc;
    tg_tensor x = in[0];
    tg_tensor q = tg_linear(&a->q, x), k = tg_linear(&a->k, x), v = tg_linear(&a->v, x);
    tg_tensor s = tg_mul(tg_matmul(q, tg_swapaxes(k, -1, -2)), 1.0 / sqrt(3.0));
    tg_tensor o = tg_matmul(tg_softmax(s, -1), v);
    return tg_mean(tg_square(tg_sub(o, in[1])), TG_ALL, 0);
}

static void test_models(void) {
    tg_model *m = tg_model_new(21);
    mlp n = {
        tg_embedding_new(m, "emb", 6, 5), tg_linear_new(m, "l1", 5, 7, NULL), tg_linear_new(m, "l2", 7, 3, NULL),
        tg_layernorm_new(m, "ln", 7, 0, 1),
    };
    CHECK(tg_model_error(m) == NULL, "model error: %s", tg_model_error(m));
    inspec ins[3] = { IIN("idx", 0, 5, 4, 3), FIN("x", -1, 1, 4, 3, 5), IIN("y", 0, 2, 4, 3) };
    gradcheck("model embed+linear+tanh+layernorm+linear+cross_entropy", m, mlp_loss, &n, 3, ins, 0, false);
    tg_model_free(m);

    m = tg_model_new(22);
    attn a = { tg_linear_new(m, "q", 4, 3, NULL), tg_linear_new(m, "k", 4, 3, NULL), tg_linear_new(m, "v", 4, 3, NULL) };
    inspec ains[2] = { FIN("x", -1, 1, 2, 5, 4), FIN("y", -1, 1, 2, 5, 3) };
    gradcheck("model attention head + mse", m, attn_loss, &a, 2, ains, 0, false);
    tg_model_free(m);
}

/* A non-scalar loss cannot be differentiated: tg_probe_new says so. */
static tg_tensor not_scalar(const void *ctx, const tg_tensor *in) { return tg_tanh(in[0]); }

static void test_nonscalar_loss(void) {
    tg_model *m = tg_model_new(1);
    tg_input_decl d[1] = { TG_F32("x", 3, 5) };
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, not_scalar, NULL, d, 1, false, false, &err);
    CHECK(p != NULL, "a non-scalar output without gradients is fine: %s", err.msg);
    if (p) tg_probe_free(p);
    memset(&err, 0, sizeof err);
    p = tg_probe_new(m, not_scalar, NULL, d, 1, true, false, &err);
    CHECK(p == NULL, "a [3,5] loss with grads = true must fail");
    CHECK(strstr(err.msg, "scalar") != NULL, "the error should mention 'scalar': \"%s\"", err.msg);
    if (p) tg_probe_free(p);
    tg_model_free(m);
}

int main(void) {
    test_binary();
    test_ties();
    test_where();
    test_unary();
    test_reduce();
    test_shape_ops();
    test_matmul();
    test_embedding();
    test_softmax();
    test_losses();
    test_layers();
    test_models();
    test_nonscalar_loss();
    printf("test_grad: %d probes, %lld gradient elements by finite differences; worst rel err %.3g (%s)\n",
           fd_stats.cases, (long long)fd_stats.elements, fd_stats.worst_err, fd_stats.worst_what);
    return check_report("test_grad");
}
