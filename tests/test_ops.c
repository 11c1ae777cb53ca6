/* Forward values of every public op, checked against naive float64 loops written here
 * (independent of the library). Each case is traced and run through the reference interpreter
 * (tg_probe) twice: in double precision (tolerance 1e-12, check_close's relative measure) and
 * with every f32 node rounded to float (tolerance 1e-5). One forward function, driven by an
 * opctx, serves every case; the cases are small loops over tables in main. */
#include "internal.h"
#include "check.h"
#include "probe_util.h"
#include "core_ops.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* What to test: the op table and op_forward are in core_ops.h (shared with test_grad.c). */

/* ---------------------------------------------------------------------------------------------
 * The naive float64 reference (inputs, host tensors ht and the probe runs: probe_util.h)
 * ------------------------------------------------------------------------------------------- */

/* NumPy broadcast of two (compatible) shapes. */
static tg_shape bshape(tg_shape a, tg_shape b) {
    tg_shape o = { a.ndim > b.ndim ? a.ndim : b.ndim, { 0 } };
    for (int i = 0; i < o.ndim; i++) {
        int64_t da = i < a.ndim ? a.d[a.ndim - 1 - i] : 1, db = i < b.ndim ? b.d[b.ndim - 1 - i] : 1;
        o.d[o.ndim - 1 - i] = da == 1 ? db : da;
    }
    return o;
}
/* The flat index in `in` of the element broadcasting maps to element `flat` of `out`. */
static int64_t bidx(tg_shape out, tg_shape in, int64_t flat) {
    int64_t idx = 0, stride = 1;
    for (int i = out.ndim - 1, j = in.ndim - 1; j >= 0; i--, j--) {
        int64_t c = flat % out.d[i];
        flat /= out.d[i];
        if (in.d[j] != 1) idx += c * stride;
        stride *= in.d[j];
    }
    return idx;
}

static double ref_bin(opk op, double a, double b) {
    switch (op) {
    case O_ADD: return a + b;
    case O_SUB: return a - b;
    case O_MUL: return a * b;
    case O_DIV: return a / b;
    case O_MIN: return a < b ? a : b;
    case O_MAX: return a > b ? a : b;
    case O_LESS: return a < b ? 1 : 0;
    default: return a > b ? 1 : 0;
    }
}
static double ref_un(opk op, double x) {
    switch (op) {
    case O_NEG: return -x;
    case O_ABS: return fabs(x);
    case O_SQUARE: return x * x;
    case O_SQRT: return sqrt(x);
    case O_RSQRT: return 1 / sqrt(x);
    case O_EXP: return exp(x);
    case O_LOG: return log(x);
    case O_RELU: return x > 0 ? x : 0;
    case O_TANH: return tanh(x);
    default: return 1 / (1 + exp(-x));
    }
}
/* Elementwise over broadcast operands: 2 operands (binary op) or 3 (where). */
static ht ref_elementwise(opk op, int n, const ht *a) {
    tg_shape s = a[0].s;
    for (int k = 1; k < n; k++) s = bshape(s, a[k].s);
    ht o = ht_new(s);
    for (int64_t i = 0; i < nel(s); i++) {
        double v[3];
        for (int k = 0; k < n; k++) v[k] = a[k].v[bidx(s, a[k].s, i)];
        o.v[i] = n == 3 ? (v[0] != 0 ? v[1] : v[2]) : ref_bin(op, v[0], v[1]);
    }
    return o;
}
static ht ref_reduce(ht x, int axis, int keep, bool mean) {
    ht o;
    if (axis == TG_ALL) {
        tg_shape s = { keep ? x.s.ndim : 0, { 0 } };
        for (int i = 0; i < s.ndim; i++) s.d[i] = 1;
        o = ht_new(s);
        for (int64_t i = 0; i < nel(x.s); i++) o.v[0] += x.v[i];
        if (mean) o.v[0] /= (double)nel(x.s);
        return o;
    }
    if (axis < 0) axis += x.s.ndim;
    tg_shape s = { 0, { 0 } };
    for (int i = 0; i < x.s.ndim; i++)
        if (i != axis) s.d[s.ndim++] = x.s.d[i];
        else if (keep) s.d[s.ndim++] = 1;
    o = ht_new(s);
    int64_t outer, n, inner;
    split_around(x.s, axis, &outer, &n, &inner);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < inner; i++) {
            double acc = 0;
            for (int64_t k = 0; k < n; k++) acc += x.v[(a * n + k) * inner + i];
            o.v[a * inner + i] = mean ? acc / (double)n : acc;
        }
    return o;
}
static ht ref_permute(ht x, const int64_t *order) {
    tg_shape s = { x.s.ndim, { 0 } };
    for (int i = 0; i < s.ndim; i++) s.d[i] = x.s.d[order[i]];
    ht o = ht_new(s);
    int64_t xstride[TG_MAX_DIMS], st = 1;
    for (int i = x.s.ndim - 1; i >= 0; i--) { xstride[i] = st; st *= x.s.d[i]; }
    for (int64_t f = 0; f < nel(s); f++) {
        int64_t rem = f, src = 0;
        for (int i = s.ndim - 1; i >= 0; i--) { src += (rem % s.d[i]) * xstride[order[i]]; rem /= s.d[i]; }
        o.v[f] = x.v[src];
    }
    return o;
}
/* [..., M, K] x [..., K, N] with NumPy-broadcast batch dims (either side may be 2-D). */
static ht ref_matmul(ht a, ht b) {
    int an = a.s.ndim, bn = b.s.ndim;
    int64_t M = a.s.d[an - 2], K = a.s.d[an - 1], N = b.s.d[bn - 1];
    tg_shape ab = a.s, bb = b.s;
    ab.ndim -= 2;
    bb.ndim -= 2;
    tg_shape batch = bshape(ab, bb), s = batch;
    s.d[s.ndim++] = M;
    s.d[s.ndim++] = N;
    ht o = ht_new(s);
    for (int64_t bi = 0; bi < nel(batch); bi++) {
        const double *pa = a.v + bidx(batch, ab, bi) * M * K, *pb = b.v + bidx(batch, bb, bi) * K * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) acc += pa[m * K + k] * pb[k * N + n];
                o.v[(bi * M + m) * N + n] = acc;
            }
    }
    return o;
}
static ht ref_softmax(ht x, int axis, bool logm) {
    if (axis < 0) axis += x.s.ndim;
    ht o = ht_new(x.s);
    int64_t outer, n, inner;
    split_around(x.s, axis, &outer, &n, &inner);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < inner; i++) {
            const double *px = x.v + a * n * inner + i;
            double *po = o.v + a * n * inner + i, mx = px[0], z = 0;
            for (int64_t k = 1; k < n; k++) if (px[k * inner] > mx) mx = px[k * inner];
            for (int64_t k = 0; k < n; k++) z += exp(px[k * inner] - mx);
            for (int64_t k = 0; k < n; k++)
                po[k * inner] = logm ? px[k * inner] - mx - log(z) : exp(px[k * inner] - mx) / z;
        }
    return o;
}
/* Rows of a table [V, D] picked by idx; out-of-range rows are zero. */
static ht ref_gather(ht table, ht idx) {
    int64_t V = table.s.d[0], D = table.s.d[1];
    tg_shape s = idx.s;
    s.d[s.ndim++] = D;
    ht o = ht_new(s);
    for (int64_t i = 0; i < nel(idx.s); i++) {
        int64_t r = (int64_t)idx.v[i];
        if (r >= 0 && r < V) memcpy(o.v + i * D, table.v + r * D, (size_t)D * sizeof(double));
    }
    return o;
}
/* nll of log-probs [..., C] at targets [...], then reduced. */
static ht ref_nll(ht logp, ht t, tg_reduction red) {
    int64_t C = logp.s.d[logp.s.ndim - 1], n = nel(t.s);
    ht per = ht_new(t.s);
    for (int64_t i = 0; i < n; i++) per.v[i] = -logp.v[i * C + (int64_t)t.v[i]];
    if (red == TG_NONE) return per;
    ht o = ref_reduce(per, TG_ALL, 0, red == TG_MEAN);
    free(per.v);
    return o;
}

static ht ref_eval(const opctx *c, const ht *x, tg_model *m, double *const *pv) {
    double num = c->num;
    if (c->op <= O_WHERE) {
        ht a[3], nh = { TG_SHAPE0, &num };
        int n = c->op == O_WHERE ? 3 : 2, k = 0, j = 0;
        if (c->op == O_WHERE) a[k++] = x[j++];
        if (c->side == S_NUM_L) a[k++] = nh;
        a[k++] = x[j++];
        if (c->side == S_TT) a[k++] = x[j++];
        if (c->side == S_NUM_R || c->side == S_SCALAR_R) a[k++] = nh;
        return ref_elementwise(c->op, n, a);
    }
    if (c->op >= O_NEG && c->op <= O_SIGMOID) {
        ht o = ht_new(x[0].s);
        for (int64_t i = 0; i < nel(o.s); i++) o.v[i] = ref_un(c->op, x[0].v[i]);
        return o;
    }
    switch (c->op) {
    case O_SUM: case O_MEAN: return ref_reduce(x[0], c->axis, c->keep, c->op == O_MEAN);
    case O_RESHAPE: {
        tg_shape s = c->shp;
        int64_t known = 1;
        for (int i = 0; i < s.ndim; i++) if (s.d[i] != -1) known *= s.d[i];
        for (int i = 0; i < s.ndim; i++) if (s.d[i] == -1) s.d[i] = nel(x[0].s) / known;
        ht o = ht_new(s);
        memcpy(o.v, x[0].v, (size_t)nel(s) * sizeof(double));
        return o;
    }
    case O_PERMUTE: return ref_permute(x[0], c->shp.d);
    case O_SWAPAXES: {
        int nd = x[0].s.ndim, a = c->axis < 0 ? c->axis + nd : c->axis, b = c->axis2 < 0 ? c->axis2 + nd : c->axis2;
        int64_t order[TG_MAX_DIMS];
        for (int i = 0; i < nd; i++) order[i] = i;
        order[a] = b;
        order[b] = a;
        return ref_permute(x[0], order);
    }
    case O_MATMUL: return ref_matmul(x[0], x[1]);
    case O_ONE_HOT: {
        tg_shape s = x[0].s;
        s.d[s.ndim++] = c->n;
        ht o = ht_new(s);
        for (int64_t i = 0; i < nel(x[0].s); i++)
            if (x[0].v[i] >= 0 && x[0].v[i] < (double)c->n) o.v[i * c->n + (int64_t)x[0].v[i]] = 1;
        return o;
    }
    case O_EMBEDDING: return ref_gather(x[0], x[1]);
    case O_SOFTMAX: case O_LOG_SOFTMAX: return ref_softmax(x[0], c->axis, c->op == O_LOG_SOFTMAX);
    case O_CE: {
        ht lp = ref_softmax(x[0], -1, true), o = ref_nll(lp, x[1], c->red);
        free(lp.v);
        return o;
    }
    case O_NLL: return ref_nll(x[0], x[1], c->red);
    case O_PMUL: {
        const tg_param *p = c->layer;
        ht a[2] = { x[0], { tg_model_param_shape(m, p->id), pv[p->id] } };
        return ref_elementwise(O_MUL, 2, a);
    }
    case O_LINEAR: {
        const tg_linear *l = c->layer;
        ht W = { tg_model_param_shape(m, l->W.id), pv[l->W.id] }, o = ref_matmul(x[0], W);
        int64_t N = W.s.d[1];
        if (l->has_bias)
            for (int64_t i = 0; i < nel(o.s); i++) o.v[i] += pv[l->b.id][i % N];
        return o;
    }
    case O_EMBED: {
        const tg_embedding_layer *e = c->layer;
        ht W = { tg_model_param_shape(m, e->W.id), pv[e->W.id] };
        return ref_gather(W, x[0]);
    }
    case O_LAYERNORM: {
        const tg_layernorm *ln = c->layer;
        double eps = num > 0 ? num : 1e-5;
        int64_t D = x[0].s.d[x[0].s.ndim - 1], rows = nel(x[0].s) / D;
        ht o = ht_new(x[0].s);
        for (int64_t r = 0; r < rows; r++) {
            const double *px = x[0].v + r * D;
            double mu = 0, var = 0;
            for (int64_t k = 0; k < D; k++) mu += px[k];
            mu /= (double)D;
            for (int64_t k = 0; k < D; k++) var += (px[k] - mu) * (px[k] - mu);
            var /= (double)D;
            for (int64_t k = 0; k < D; k++)
                o.v[r * D + k] = (px[k] - mu) / sqrt(var + eps) * pv[ln->g.id][k] + (ln->has_bias ? pv[ln->b.id][k] : 0);
        }
        return o;
    }
    default: return ht_new(x[0].s);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Running one case: fill inputs and parameters once, compute the expectation with the loops
 * above, run the probe in double and in emulated f32, compare shape and every element.
 * ------------------------------------------------------------------------------------------- */

static int n_cases;

static void run_case(const char *what, const opctx *c, tg_model *model, int n_in, const inspec *ins) {
    tg_model *m = model ? model : tg_model_new(7);
    host_case h;
    host_case_fill(&h, m, n_in, ins);
    ht want = ref_eval(c, h.x, m, h.pv);
    n_cases++;
    /* No dtype check (-1) and no randomness in these graphs (seed 0). */
    probe_compare_forward(what, m, op_forward, c, &h, want, -1, 0, 1e-12, 1e-5);
    free(want.v);
    host_case_free(&h);
    if (!model) tg_model_free(m);
}

static const char *axis_s(int axis, char *buf) {
    if (axis == TG_ALL) return "TG_ALL";
    sprintf(buf, "%d", axis);
    return buf;
}

/* ---------------------------------------------------------------------------------------------
 * The cases
 * ------------------------------------------------------------------------------------------- */

static void test_binary(void) {
    static const opk ops[] = { O_ADD, O_SUB, O_MUL, O_DIV, O_MIN, O_MAX, O_LESS, O_GREATER };
    /* Second operands stay away from zero (div). */
    inspec pairs[][2] = {
        { FIN("a", -2, 2, 3, 5),    AIN("b", 0.5, 2, 3, 5) },
        { FIN("a", -2, 2, 3, 1, 5), AIN("b", 0.5, 2, 7, 1) },      /* size-1 axes both ways, ranks 3 and 2 */
        { FIN("a", -2, 2, 5),       AIN("b", 0.5, 2, 2, 3, 1) },   /* rank 1 vs rank 3 */
        { FIN("a", -2, 2, 1, 1),    AIN("b", 0.5, 2, 4, 3) },
        { FIN("a", -2, 2, 2, 3, 5), AIN("b", 0.5, 2, 1) },
    };
    inspec ties[2] = { QIN("a", 4, 5), QIN("b", 4, 1) };
    inspec one = AIN("x", 0.5, 2, 3, 1, 5);
    char what[200], b1[96], b2[96];
    for (size_t o = 0; o < sizeof ops / sizeof *ops; o++) {
        opctx c = { .op = ops[o], .side = S_TT };
        for (size_t k = 0; k < sizeof pairs / sizeof *pairs; k++) {
            snprintf(what, sizeof what, "%s %s %s", opname[ops[o]], shape_s(pairs[k][0].d.shape, b1), shape_s(pairs[k][1].d.shape, b2));
            run_case(what, &c, NULL, 2, pairs[k]);
        }
        if (ops[o] != O_DIV) {
            snprintf(what, sizeof what, "%s with ties", opname[ops[o]]);
            run_case(what, &c, NULL, 2, ties);
        }
        static const struct { int side; double num; const char *form; } forms[] = {
            { S_NUM_L, 1.25, "number, x" }, { S_NUM_R, -0.75, "x, number" }, { S_SCALAR_R, 1.5, "x, tg_scalar" },
        };
        for (size_t f = 0; f < 3; f++) {
            c.side = forms[f].side;
            c.num = forms[f].num;
            snprintf(what, sizeof what, "%s(%s %g)", opname[ops[o]], forms[f].form, forms[f].num);
            run_case(what, &c, NULL, 1, &one);
        }
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
        run_case(what, &c, NULL, 3, cases[k]);
    }
    inspec two[2] = { CIN("c", 3, 1, 5), FIN("x", -2, 2, 4, 5) };
    static const struct { int side; double num; const char *name; } forms[] = {
        { S_NUM_L, 2.5, "where(c, 2.5, x)" }, { S_NUM_R, -0.5, "where(c, x, -0.5)" }, { S_SCALAR_R, 0.25, "where(c, x, tg_scalar(0.25))" },
    };
    for (size_t f = 0; f < 3; f++) {
        c.side = forms[f].side;
        c.num = forms[f].num;
        run_case(forms[f].name, &c, NULL, 2, two);
    }
}

static void test_unary(void) {
    static const struct { opk op; double lo, hi; bool quant; } un[] = {
        { O_NEG, -3, 3, true }, { O_ABS, -3, 3, true }, { O_SQUARE, -3, 3, true }, { O_SQRT, 0.05, 4, false },
        { O_RSQRT, 0.05, 4, false }, { O_EXP, -4, 4, true }, { O_LOG, 0.05, 4, false }, { O_RELU, -3, 3, true },
        { O_TANH, -3, 3, true }, { O_SIGMOID, -8, 8, true },
    };
    char what[200], b1[96];
    for (size_t k = 0; k < sizeof un / sizeof *un; k++) {
        opctx c = { .op = un[k].op };
        inspec ins[] = { FIN("x", un[k].lo, un[k].hi, 3, 1, 7), FIN("x", un[k].lo, un[k].hi, 5), QIN("x", 2, 5) };
        for (size_t i = 0; i < (un[k].quant ? 3u : 2u); i++) {
            snprintf(what, sizeof what, "%s %s%s", opname[un[k].op], shape_s(ins[i].d.shape, b1), i == 2 ? " (exact zeros)" : "");
            run_case(what, &c, NULL, 1, &ins[i]);
        }
    }
}

static void test_reduce(void) {
    static const int axes[] = { 0, 1, 2, -1, -2, -3, TG_ALL };
    inspec x3 = FIN("x", -2, 2, 3, 5, 7), x1 = FIN("x", -2, 2, 4, 1, 3), v = FIN("x", -2, 2, 7);
    char what[200], b1[96], b2[16];
    for (int op = O_SUM; op <= O_MEAN; op++)
        for (int keep = 0; keep < 2; keep++) {
            for (size_t a = 0; a < sizeof axes / sizeof *axes; a++) {
                opctx c = { .op = (opk)op, .axis = axes[a], .keep = keep };
                snprintf(what, sizeof what, "%s %s axis %s keepdims %d", opname[op], shape_s(x3.d.shape, b1), axis_s(axes[a], b2), keep);
                run_case(what, &c, NULL, 1, &x3);
            }
            int more[] = { 1, -2, 0 };
            for (int a = 0; a < 3; a++) {
                opctx c = { .op = (opk)op, .axis = more[a], .keep = keep };
                snprintf(what, sizeof what, "%s [4,1,3] axis %d keepdims %d", opname[op], more[a], keep);
                run_case(what, &c, NULL, 1, &x1);
            }
            int vaxes[] = { 0, -1, TG_ALL };
            for (int a = 0; a < 3; a++) {
                opctx c = { .op = (opk)op, .axis = vaxes[a], .keep = keep };
                snprintf(what, sizeof what, "%s [7] axis %s keepdims %d", opname[op], axis_s(vaxes[a], b2), keep);
                run_case(what, &c, NULL, 1, &v);
            }
        }
}

static void test_shape_ops(void) {
    char what[200], b1[96], b2[96];
    inspec x = FIN("x", -2, 2, 3, 5, 2), x4 = FIN("x", -2, 2, 2, 1, 3, 5);
    tg_shape reshapes[] = { TG_SHAPE(5, -1), TG_SHAPE(-1), TG_SHAPE(30), TG_SHAPE(2, -1, 5), TG_SHAPE(3, 1, 10, 1), TG_SHAPE(-1, 1) };
    for (size_t k = 0; k < sizeof reshapes / sizeof *reshapes; k++) {
        opctx c = { .op = O_RESHAPE, .shp = reshapes[k] };
        snprintf(what, sizeof what, "reshape %s -> %s", shape_s(x.d.shape, b1), shape_s(reshapes[k], b2));
        run_case(what, &c, NULL, 1, &x);
    }
    struct { tg_shape order; const inspec *in; } perms[] = {
        { TG_SHAPE(2, 0, 1), &x }, { TG_SHAPE(1, 2, 0), &x }, { TG_SHAPE(0, 2, 1), &x }, { TG_SHAPE(0, 1, 2), &x },
        { TG_SHAPE(3, 1, 0, 2), &x4 }, { TG_SHAPE(2, 3, 1, 0), &x4 },
    };
    for (size_t k = 0; k < sizeof perms / sizeof *perms; k++) {
        opctx c = { .op = O_PERMUTE, .shp = perms[k].order };
        snprintf(what, sizeof what, "permute %s by %s", shape_s(perms[k].in->d.shape, b1), shape_s(perms[k].order, b2));
        run_case(what, &c, NULL, 1, perms[k].in);
    }
    struct { int a, b; const inspec *in; } swaps[] = {
        { 0, 2, &x }, { 1, 2, &x }, { 2, 1, &x }, { -1, -2, &x }, { 0, -1, &x }, { 1, 3, &x4 }, { 0, 0, &x },
    };
    for (size_t k = 0; k < sizeof swaps / sizeof *swaps; k++) {
        opctx c = { .op = O_SWAPAXES, .axis = swaps[k].a, .axis2 = swaps[k].b };
        snprintf(what, sizeof what, "swapaxes %s %d %d", shape_s(swaps[k].in->d.shape, b1), swaps[k].a, swaps[k].b);
        run_case(what, &c, NULL, 1, swaps[k].in);
    }
}

static void test_matmul(void) {
    inspec mm[][2] = {
        { FIN("a", -2, 2, 3, 5),       FIN("b", -2, 2, 5, 4) },
        { FIN("a", -2, 2, 2, 3, 5),    FIN("b", -2, 2, 5, 4) },      /* [B,M,K] x [K,N] */
        { FIN("a", -2, 2, 2, 3, 5),    FIN("b", -2, 2, 2, 5, 4) },   /* batched */
        { FIN("a", -2, 2, 2, 1, 3, 5), FIN("b", -2, 2, 3, 5, 4) },   /* batch dims broadcast both ways */
        { FIN("a", -2, 2, 1, 3, 5),    FIN("b", -2, 2, 4, 5, 2) },
        { FIN("a", -2, 2, 3, 5),       FIN("b", -2, 2, 2, 5, 4) },   /* unbatched A, batched B */
        { FIN("a", -2, 2, 3, 1),       FIN("b", -2, 2, 1, 4) },      /* K = 1: outer product */
        { FIN("a", -2, 2, 2, 1, 5),    FIN("b", -2, 2, 5, 1) },      /* M = N = 1 */
    };
    opctx c = { .op = O_MATMUL };
    char what[200], b1[96], b2[96];
    for (size_t k = 0; k < sizeof mm / sizeof *mm; k++) {
        snprintf(what, sizeof what, "matmul %s x %s", shape_s(mm[k][0].d.shape, b1), shape_s(mm[k][1].d.shape, b2));
        run_case(what, &c, NULL, 2, mm[k]);
    }
}

static void test_indexing(void) {
    char what[200], b1[96], b2[96];
    struct { inspec idx; int64_t n; } oh[] = {
        { IIN("i", -1, 4, 2, 3), 4 },   /* -1 and 4 are out of range: zero rows */
        { IIN("i", 0, 6, 5), 5 },
        { IIN("i", 0, 0, 1), 1 },
        { IIN("i", -2, 3, 3, 1, 3), 3 },
    };
    for (size_t k = 0; k < sizeof oh / sizeof *oh; k++) {
        opctx c = { .op = O_ONE_HOT, .n = oh[k].n };
        snprintf(what, sizeof what, "one_hot %s n %lld", shape_s(oh[k].idx.d.shape, b1), (long long)oh[k].n);
        run_case(what, &c, NULL, 1, &oh[k].idx);
    }
    inspec em[][2] = {
        { FIN("t", -2, 2, 5, 3), IIN("i", -1, 5, 2, 4) },   /* -1 and 5 out of range: zero rows */
        { FIN("t", -2, 2, 5, 3), IIN("i", 0, 4, 7) },
        { FIN("t", -2, 2, 1, 7), IIN("i", 0, 0, 3, 1) },
    };
    opctx c = { .op = O_EMBEDDING };
    for (size_t k = 0; k < sizeof em / sizeof *em; k++) {
        snprintf(what, sizeof what, "embedding table %s idx %s", shape_s(em[k][0].d.shape, b1), shape_s(em[k][1].d.shape, b2));
        run_case(what, &c, NULL, 2, em[k]);
    }
}

static void test_softmax(void) {
    struct { inspec x; int axis; } sm[] = {
        { FIN("x", -4, 4, 3, 5), -1 }, { FIN("x", -4, 4, 3, 5), 1 }, { FIN("x", -4, 4, 3, 5), 0 },
        { FIN("x", -4, 4, 2, 5, 3), 1 }, { FIN("x", -4, 4, 2, 5, 3), -2 }, { FIN("x", -4, 4, 2, 5, 3), -1 },
        { FIN("x", -4, 4, 2, 5, 3), 0 }, { FIN("x", -4, 4, 4, 1), -1 }, { FIN("x", -30, 30, 3, 7), -1 },
    };
    char what[200], b1[96];
    for (int op = O_SOFTMAX; op <= O_LOG_SOFTMAX; op++)
        for (size_t k = 0; k < sizeof sm / sizeof *sm; k++) {
            opctx c = { .op = (opk)op, .axis = sm[k].axis };
            snprintf(what, sizeof what, "%s %s axis %d", opname[op], shape_s(sm[k].x.d.shape, b1), sm[k].axis);
            run_case(what, &c, NULL, 1, &sm[k].x);
        }
}

static void test_losses(void) {
    inspec ce[][2] = {
        { FIN("x", -3, 3, 6, 5),    IIN("t", 0, 4, 6) },
        { FIN("x", -3, 3, 2, 3, 4), IIN("t", 0, 3, 2, 3) },
        { FIN("x", -3, 3, 1, 3),    IIN("t", 0, 2, 1) },
        { FIN("x", -3, 3, 5, 1),    IIN("t", 0, 0, 5) },   /* one class: ce is 0 */
    };
    char what[200], b1[96];
    for (int op = O_CE; op <= O_NLL; op++)
        for (int r = TG_MEAN; r <= TG_NONE; r++)
            for (size_t k = 0; k < sizeof ce / sizeof *ce; k++) {
                opctx c = { .op = (opk)op, .red = (tg_reduction)r };
                snprintf(what, sizeof what, "%s %s reduction %s", opname[op], shape_s(ce[k][0].d.shape, b1), redname[r]);
                run_case(what, &c, NULL, 2, ce[k]);
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
    CHECK(lin.has_bias && !nob.has_bias, "tg_linear has_bias %d / no_bias %d", lin.has_bias, nob.has_bias);

    inspec x2 = FIN("x", -2, 2, 3, 5), x3 = FIN("x", -2, 2, 2, 3, 5), x1 = FIN("x", -2, 2, 1, 5);
    inspec idx[] = { IIN("i", 0, 5, 2, 5), IIN("i", 0, 5, 4), IIN("i", -1, 6, 3, 1, 2) };
    struct { const char *what; opctx c; const inspec *in; } cases[] = {
        { "tg_linear x [3,5]", { .op = O_LINEAR, .layer = &lin }, &x2 },
        { "tg_linear x [2,3,5]", { .op = O_LINEAR, .layer = &lin }, &x3 },
        { "tg_linear no bias x [2,3,5]", { .op = O_LINEAR, .layer = &nob }, &x3 },
        { "tg_linear x [1,5]", { .op = O_LINEAR, .layer = &lin }, &x1 },
        { "tg_embed idx [2,5]", { .op = O_EMBED, .layer = &emb }, &idx[0] },
        { "tg_embed idx [4]", { .op = O_EMBED, .layer = &emb }, &idx[1] },
        { "tg_embed idx [3,1,2] (out of range -1, 6)", { .op = O_EMBED, .layer = &emb }, &idx[2] },
        { "tg_layernorm eps default x [3,5]", { .op = O_LAYERNORM, .layer = &ln, .num = 0 }, &x2 },
        { "tg_layernorm eps default x [2,3,5]", { .op = O_LAYERNORM, .layer = &ln, .num = 0 }, &x3 },
        { "tg_layernorm eps 0.5 no bias x [2,3,5]", { .op = O_LAYERNORM, .layer = &ln2, .num = 0.5 }, &x3 },
        { "mul(x [2,3,5], tg_p [1,5])", { .op = O_PMUL, .layer = &P }, &x3 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) run_case(cases[k].what, &cases[k].c, m, 1, cases[k].in);
    tg_model_free(m);
}

int main(void) {
    test_binary();
    test_where();
    test_unary();
    test_reduce();
    test_shape_ops();
    test_matmul();
    test_indexing();
    test_softmax();
    test_losses();
    test_layers();
    printf("test_ops: %d cases, each in f64 and f32\n", n_cases);
    return check_report("test_ops");
}
