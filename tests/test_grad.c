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
 * gradient (the cond of where, both operands of less/greater) are checked to be exactly 0. */
#include "internal.h"
#include "check.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define GRAD_H 1e-6
#define GRAD_TOL 1e-4
#define GRAD_FLOOR 1e-5

/* ---------------------------------------------------------------------------------------------
 * What to test (the same op table as test_ops.c)
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    O_ADD, O_SUB, O_MUL, O_DIV, O_MIN, O_MAX, O_LESS, O_GREATER,                 /* binary */
    O_WHERE,
    O_NEG, O_ABS, O_SQUARE, O_SQRT, O_RSQRT, O_EXP, O_LOG, O_RELU, O_TANH, O_SIGMOID, /* unary */
    O_SUM, O_MEAN, O_RESHAPE, O_PERMUTE, O_SWAPAXES, O_MATMUL, O_EMBEDDING,
    O_SOFTMAX, O_LOG_SOFTMAX, O_CE, O_NLL,
    O_PMUL,          /* in[0] * tg_p(param) */
    O_LINEAR, O_EMBED, O_LAYERNORM
} opk;
static const char *const opname[] = {
    "add", "sub", "mul", "div", "minimum", "maximum", "less", "greater", "where",
    "neg", "abs", "square", "sqrt", "rsqrt", "exp", "log", "relu", "tanh", "sigmoid",
    "sum", "mean", "reshape", "permute", "swapaxes", "matmul", "embedding",
    "softmax", "log_softmax", "cross_entropy", "nll_loss", "mul(x, tg_p)", "tg_linear",
    "tg_embed", "tg_layernorm"
};
static const char *const redname[] = { "mean", "sum", "none" };

enum { S_TT, S_NUM_L, S_NUM_R, S_SCALAR_R };   /* operand forms, as in test_ops.c */

typedef struct {
    opk op;
    int side;
    double num;
    int axis, axis2, keep;
    tg_shape shp;
    tg_reduction red;
    const void *layer;
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
static tg_tensor bin_nt(opk op, double a, tg_tensor b) {
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
static tg_tensor bin_tn(opk op, tg_tensor a, double b) {
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

/* loss = sum(op(in[0..n)) * in[n]) */
typedef struct { const opctx *op; int n; } wctx;
static tg_tensor weighted_loss(const void *vc, const tg_tensor *in) {
    const wctx *w = vc;
    return tg_sum(tg_mul(op_forward(w->op, in), in[w->n]), TG_ALL, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Inputs
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    F_UNI,     /* uniform in [lo, hi] */
    F_AWAY,    /* random sign times uniform in [lo, hi] (lo > 0: away from zero) */
    F_QUANT,   /* one of -1, -0.5, 0, 0.5, 1: ties between operands */
    F_COND,    /* 0 with probability 0.4, else uniform in [lo, hi] */
    F_INT      /* integers lo..hi inclusive (i32 inputs) */
} fillk;
/* zero: the input must get an exactly zero gradient (no finite differences for it). */
typedef struct { tg_input_decl d; fillk fill; double lo, hi; bool zero; } inspec;
#define FIN(nm, lo, hi, ...) { TG_F32(nm, __VA_ARGS__), F_UNI, lo, hi, false }
#define AIN(nm, lo, hi, ...) { TG_F32(nm, __VA_ARGS__), F_AWAY, lo, hi, false }
#define QIN(nm, ...)         { TG_F32(nm, __VA_ARGS__), F_QUANT, 0, 0, false }
#define ZIN(nm, ...)         { TG_F32(nm, __VA_ARGS__), F_UNI, -2, 2, true }
#define CIN(nm, ...)         { TG_F32(nm, __VA_ARGS__), F_COND, -2, 2, true }
#define IIN(nm, lo, hi, ...) { TG_I32(nm, __VA_ARGS__), F_INT, lo, hi, false }

static double f32r(double v) { return (double)(float)v; }

static void fill(const inspec *s, double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        switch (s->fill) {
        case F_UNI: v[i] = f32r(check_uniform(s->lo, s->hi)); break;
        case F_AWAY: v[i] = f32r(check_uniform(s->lo, s->hi)) * (check_uniform(0, 1) < 0.5 ? -1 : 1); break;
        case F_QUANT: v[i] = -1 + 0.5 * floor(check_uniform(0, 5)); break;
        case F_COND: v[i] = check_uniform(0, 1) < 0.4 ? 0 : f32r(check_uniform(s->lo, s->hi)); break;
        case F_INT: v[i] = floor(check_uniform(s->lo, s->hi + 1)); if (v[i] > s->hi) v[i] = s->hi; break;
        }
    }
}

static int64_t nel(tg_shape s) {
    int64_t n = 1;
    for (int i = 0; i < s.ndim; i++) n *= s.d[i];
    return n;
}
static char *shape_s(tg_shape s, char *buf) {   /* buf: at least 96 bytes */
    int k = sprintf(buf, "[");
    for (int i = 0; i < s.ndim; i++) k += sprintf(buf + k, "%s%lld", i ? "," : "", (long long)s.d[i]);
    sprintf(buf + k, "]");
    return buf;
}

/* ---------------------------------------------------------------------------------------------
 * The finite-difference check of any scalar-valued forward function
 * ------------------------------------------------------------------------------------------- */

static int n_cases;
static int64_t n_elements;
static double worst_err;
static char worst_what[240];

/* Compares one gradient tensor `an` (copied before perturbing) with central differences of the
 * loss in v[0..n), then runs the probe once more at the unperturbed point. */
static void fd_compare(const char *what, const char *which, tg_probe *p, double *v, const double *an, int64_t n) {
    int64_t bad = 0, first = -1;
    double worst = 0, fa = 0, fn = 0;
    for (int64_t i = 0; i < n; i++) {
        double x0 = v[i];
        v[i] = x0 + GRAD_H;
        tg_probe_run(p);
        double fp = tg_probe_output(p)[0];
        v[i] = x0 - GRAD_H;
        tg_probe_run(p);
        double fm = tg_probe_output(p)[0];
        v[i] = x0;
        double num = (fp - fm) / (2 * GRAD_H), a = an[i];
        double den = fmax(fmax(fabs(a), fabs(num)), GRAD_FLOOR), err = fabs(a - num) / den;
        if (!(err <= GRAD_TOL)) { bad++; if (first < 0) { first = i; fa = a; fn = num; } }
        if (err > worst || err != err) worst = err;
    }
    tg_probe_run(p);   /* back to the unperturbed point: later gradients are read from this run */
    n_elements += n;
    if (worst > worst_err) { worst_err = worst; snprintf(worst_what, sizeof worst_what, "%s, %s", what, which); }
    CHECK(bad == 0, "%s: d/d%s: %lld of %lld elements off (worst rel err %.3g); first [%lld]: analytic %.12g numeric %.12g",
          what, which, (long long)bad, (long long)n, worst, (long long)first, fa, fn);
}

/* Fills inputs and every parameter the graph uses, runs with gradients and checks them all.
 * Returns the probe (already run at the unperturbed point) when keep is set, else frees it. */
static tg_probe *gradcheck(const char *what, tg_model *m, tg_forward_fn fn, const void *ctx, int n_in,
                           const inspec *ins, bool keep) {
    tg_input_decl decl[6] = { { 0 } };   /* (initialised: gcc -O1 -fsanitize warns otherwise) */
    for (int i = 0; i < n_in; i++) decl[i] = ins[i].d;
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, fn, ctx, decl, n_in, true, false, &err);
    CHECK(p != NULL, "%s: tg_probe_new failed: %s", what, err.msg);
    if (!p) return NULL;
    n_cases++;
    for (int i = 0; i < n_in; i++) fill(&ins[i], tg_probe_input(p, i), nel(ins[i].d.shape));
    int np = tg_model_n_params(m);
    for (int k = 0; k < np; k++) {
        double *pv = tg_probe_param(p, k);
        inspec u = FIN("p", -1.5, 1.5, 1);
        if (pv) fill(&u, pv, nel(tg_model_param_shape(m, k)));
    }
    tg_probe_run(p);
    char b1[96];
    tg_shape os = tg_probe_output_shape(p);
    CHECK(os.ndim == 0, "%s: loss shape %s, want []", what, shape_s(os, b1));
    CHECK(isfinite(tg_probe_output(p)[0]), "%s: loss %g", what, tg_probe_output(p)[0]);

    for (int i = 0; i < n_in; i++) {
        const double *g = tg_probe_input_grad(p, i);
        int64_t n = nel(ins[i].d.shape);
        char which[64];
        snprintf(which, sizeof which, "input %s", ins[i].d.name);
        if (ins[i].d.dtype == TG_INT32) {
            CHECK(g == NULL, "%s: i32 %s has a gradient", what, which);
            continue;
        }
        CHECK(g != NULL, "%s: no gradient for %s", what, which);
        if (!g) continue;
        double *an = malloc((size_t)n * sizeof(double));
        memcpy(an, g, (size_t)n * sizeof(double));
        if (ins[i].zero) {
            int64_t nz = 0;
            for (int64_t k = 0; k < n; k++) nz += an[k] != 0.0;
            CHECK(nz == 0, "%s: %s must get an exactly zero gradient; %lld of %lld elements nonzero",
                  what, which, (long long)nz, (long long)n);
        } else {
            fd_compare(what, which, p, tg_probe_input(p, i), an, n);
        }
        free(an);
    }
    for (int k = 0; k < np; k++) {
        double *pv = tg_probe_param(p, k);
        const double *g = tg_probe_param_grad(p, k);
        CHECK((pv == NULL) == (g == NULL), "%s: param %s: value %p but gradient %p", what,
              tg_model_param_name(m, k), (void *)pv, (const void *)g);
        if (!pv || !g) continue;
        int64_t n = nel(tg_model_param_shape(m, k));
        double *an = malloc((size_t)n * sizeof(double));
        memcpy(an, g, (size_t)n * sizeof(double));
        char which[96];
        snprintf(which, sizeof which, "param %s", tg_model_param_name(m, k));
        fd_compare(what, which, p, pv, an, n);
        free(an);
    }
    tg_probe_run(p);
    if (keep) return p;
    tg_probe_free(p);
    return NULL;
}

/* An op case: find the op's output shape, add W of that shape, check sum(op * W). */
static void grad_case(const char *what, const opctx *c, tg_model *model, int n_in, const inspec *ins) {
    tg_model *m = model ? model : tg_model_new(3);
    tg_input_decl decl[6] = { { 0 } };   /* (initialised: gcc -O1 -fsanitize warns otherwise) */
    for (int i = 0; i < n_in; i++) decl[i] = ins[i].d;
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, op_forward, c, decl, n_in, false, false, &err);
    CHECK(p != NULL, "%s: tg_probe_new (forward only) failed: %s", what, err.msg);
    if (p) {
        tg_shape os = tg_probe_output_shape(p);
        tg_probe_free(p);
        if (os.ndim == 0) os = TG_SHAPE(1);   /* W [1] broadcasts against a scalar output */
        inspec all[6];
        memcpy(all, ins, (size_t)n_in * sizeof *all);
        all[n_in] = (inspec){ { "W", TG_FLOAT32, os }, F_AWAY, 0.5, 1.5, false };
        wctx w = { c, n_in };
        gradcheck(what, m, weighted_loss, &w, n_in + 1, all, false);
    }
    if (!model) tg_model_free(m);
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
    inspec cmp[][2] = { { ZIN("a", 3, 5), ZIN("b", 3, 5) }, { ZIN("a", 3, 1, 5), ZIN("b", 7, 1) } };
    for (int op = O_LESS; op <= O_GREATER; op++) {
        opctx c = { .op = (opk)op };
        for (size_t k = 0; k < 2; k++) {
            snprintf(what, sizeof what, "%s %s %s", opname[op], shape_s(cmp[k][0].d.shape, b1), shape_s(cmp[k][1].d.shape, b2));
            grad_case(what, &c, NULL, 2, cmp[k]);
        }
        inspec z = ZIN("x", 4, 3);
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
        wctx w = { &c, 2 };
        tg_model *m = tg_model_new(5);
        snprintf(what, sizeof what, "%s ties, exact split", opname[op]);
        tg_probe *p = gradcheck(what, m, weighted_loss, &w, 3, ins, true);
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
    gradcheck("model embed+linear+tanh+layernorm+linear+cross_entropy", m, mlp_loss, &n, 3, ins, false);
    tg_model_free(m);

    m = tg_model_new(22);
    attn a = { tg_linear_new(m, "q", 4, 3, NULL), tg_linear_new(m, "k", 4, 3, NULL), tg_linear_new(m, "v", 4, 3, NULL) };
    inspec ains[2] = { FIN("x", -1, 1, 2, 5, 4), FIN("y", -1, 1, 2, 5, 3) };
    gradcheck("model attention head + mse", m, attn_loss, &a, 2, ains, false);
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
           n_cases, (long long)n_elements, worst_err, worst_what);
    return check_report("test_grad");
}
