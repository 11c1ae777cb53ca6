/* C code generation for the compiled CPU backend: one C function per kernel with every shape
 * baked in as a constant, and an entry point that runs them in order.
 *
 * A kernel computes one materialized node. Pointwise kernels loop over the node's elements and
 * evaluate the inlined producers as an expression tree of temporaries; each source is read at
 * an index derived from the output's (broadcast, permute, reshape, narrow, pad, gathers), so
 * movement never copies. Sum kernels evaluate their inlined producer inside the reduction.
 * Matrix products and the ops that read whole rows or scatter (softmax, argmax, scatters,
 * pooling) call library kernels (kernels_cpu.c) on materialized buffers.
 *
 * Generated entry: void tg_entry(float *A, void **B, const double *H, void *const *R)
 *   A arena (plan offsets in floats), B bound leaves by node id, H hyper scalars, R library
 *   kernels by tgk id. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME 24

/* An index into a node: its flat position and/or its coordinates, as names of generated
 * variables or literals. */
typedef struct {
    bool has_flat, has_coords;
    char flat[NAME];
    char c[TG_MAX_DIMS][NAME];
} ix_t;

typedef struct { int node; char key[TG_MAX_DIMS * NAME + 8]; char name[NAME]; } memo_t;

typedef struct {
    const tg_graph *g;
    const bool *mat;
    const tg_plan *plan;
    strbuf *out;
    strbuf body;
    int root, ntmp;
    memo_t *memo;
    int n_memo, cap_memo;
    bool *used;          /* per node: read from memory by the current kernel */
    int parallel_min;    /* elements below which a kernel runs on one thread */
} cg;

static const tg_node *N(const cg *c, int id) { return &c->g->nodes[id]; }
static const char *ctype(const tg_node *n) { return n->dtype == TG_INT32 ? "int32_t" : "float"; }
static bool is_bound(tg_op op) { return op == OP_INPUT || op == OP_PARAM || op == OP_STATE; }
static bool in_memory(const cg *c, int id) { return id != c->root && (c->mat[id] || is_bound(N(c, id)->op)); }

static void line(cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(cg *c, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sb_printf(&c->body, "        %s\n", buf);
}

/* A fresh variable `name` of `type` holding the expression. */
static void def(cg *c, char *name, const char *prefix, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void def(cg *c, char *name, const char *prefix, const char *type, const char *fmt, ...) {
    char expr[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(expr, sizeof expr, fmt, ap);
    va_end(ap);
    snprintf(name, NAME, "%s%d", prefix, c->ntmp++);
    line(c, "const %s %s = %s;", type, name, expr);
}

/* A float literal for v, inf and NaN included. */
static const char *flit(double v, char *buf) {
    if (isnan(v)) return strcpy(buf, "NAN");
    if (isinf(v)) return strcpy(buf, v > 0 ? "INFINITY" : "-INFINITY");
    snprintf(buf, 40, "%.9ef", v);
    return buf;
}

static int64_t stride_of(tg_shape s, int k) {
    int64_t st = 1;
    for (int i = k + 1; i < s.ndim; i++) st *= s.d[i];
    return st;
}

static void ensure_flat(cg *c, tg_shape s, ix_t *ix) {
    if (ix->has_flat) return;
    char expr[512] = "0";
    int len = 0;
    for (int k = 0; k < s.ndim; k++) {
        if (s.d[k] == 1 || strcmp(ix->c[k], "0") == 0) continue;
        int64_t st = stride_of(s, k);
        len += st == 1 ? snprintf(expr + len, sizeof expr - (size_t)len, "%s%s", len ? " + " : "", ix->c[k])
                       : snprintf(expr + len, sizeof expr - (size_t)len, "%s%s * %lld", len ? " + " : "", ix->c[k], (long long)st);
    }
    if (len == 0) strcpy(ix->flat, "0");
    else def(c, ix->flat, "f", "int64_t", "%s", expr);
    ix->has_flat = true;
}

static void ensure_coords(cg *c, tg_shape s, ix_t *ix) {
    if (ix->has_coords) return;
    for (int k = 0; k < s.ndim; k++) {
        int64_t st = stride_of(s, k);
        if (s.d[k] == 1) strcpy(ix->c[k], "0");
        else if (k == 0 && st == 1) snprintf(ix->c[k], NAME, "%s", ix->flat);
        else if (k == 0) def(c, ix->c[k], "c", "int64_t", "%s / %lld", ix->flat, (long long)st);
        else if (st == 1) def(c, ix->c[k], "c", "int64_t", "%s %% %lld", ix->flat, (long long)s.d[k]);
        else def(c, ix->c[k], "c", "int64_t", "(%s / %lld) %% %lld", ix->flat, (long long)st, (long long)s.d[k]);
    }
    ix->has_coords = true;
}

static ix_t ix_flat(const char *flat) {
    ix_t ix;
    memset(&ix, 0, sizeof ix);
    ix.has_flat = true;
    snprintf(ix.flat, NAME, "%s", flat);
    return ix;
}

static ix_t ix_coords(int nd) {
    ix_t ix;
    memset(&ix, 0, sizeof ix);
    ix.has_coords = true;
    for (int k = 0; k < nd; k++) strcpy(ix.c[k], "0");
    return ix;
}

static bool same_shape(tg_shape a, tg_shape b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

/* The index into source `src` (NumPy-broadcast to `out`) of the element at ix of `out`. */
static ix_t broadcast_ix(cg *c, tg_shape src, tg_shape out, ix_t *ix) {
    if (same_shape(src, out)) return *ix;
    if (src.ndim == 0 || shape_numel(src) == 1) return ix_flat("0");
    ensure_coords(c, out, ix);
    ix_t r = ix_coords(src.ndim);
    int lead = out.ndim - src.ndim;
    for (int k = 0; k < src.ndim; k++)
        if (src.d[k] != 1) strcpy(r.c[k], ix->c[k + lead]);
    return r;
}

static const char *val(cg *c, int id, ix_t ix);

static const char *memo_find(cg *c, int id, const char *key) {
    for (int i = c->n_memo - 1; i >= 0; i--)
        if (c->memo[i].node == id && strcmp(c->memo[i].key, key) == 0) return c->memo[i].name;
    return NULL;
}

static const char *memo_add(cg *c, int id, const char *key, const char *name) {
    if (c->n_memo == c->cap_memo) {
        c->cap_memo = c->cap_memo ? 2 * c->cap_memo : 64;
        c->memo = realloc(c->memo, sizeof(memo_t) * (size_t)c->cap_memo);
    }
    memo_t *m = &c->memo[c->n_memo++];
    m->node = id;
    snprintf(m->key, sizeof m->key, "%s", key);
    snprintf(m->name, NAME, "%s", name);
    return m->name;
}

static void ix_key(const ix_t *ix, int nd, char *key, size_t len) {
    if (ix->has_flat) { snprintf(key, len, "f%s", ix->flat); return; }
    size_t k = (size_t)snprintf(key, len, "c");
    for (int i = 0; i < nd && k < len; i++) k += (size_t)snprintf(key + k, len - k, ",%s", ix->c[i]);
}

/* Clamp coordinate expression v into [0, n) as a new variable (reads in range even where the
 * value will be masked out, so the expression stays branch-free). */
static void clamped(cg *c, char *name, const char *v, int64_t n) {
    def(c, name, "c", "int64_t", "%s < 0 ? 0 : %s >= %lld ? %lld : %s", v, v, (long long)n, (long long)(n - 1), v);
}

static const char *unary_expr(const tg_node *n, const char *a, char *buf, size_t len) {
    bool i32 = n->dtype == TG_INT32;
    switch (n->op) {
    case OP_NEG: snprintf(buf, len, "-%s", a); break;
    case OP_ABS: snprintf(buf, len, i32 ? "(%s < 0 ? -%s : %s)" : "fabsf(%s)", a, a, a); break;
    case OP_SQUARE: snprintf(buf, len, "%s * %s", a, a); break;
    case OP_SQRT: snprintf(buf, len, "sqrtf(%s)", a); break;
    case OP_RSQRT: snprintf(buf, len, "1.0f / sqrtf(%s)", a); break;
    case OP_EXP: snprintf(buf, len, "expf(%s)", a); break;
    case OP_LOG: snprintf(buf, len, "logf(%s)", a); break;
    case OP_RELU: snprintf(buf, len, "%s > 0.0f ? %s : 0.0f", a, a); break;
    case OP_TANH: snprintf(buf, len, "tanhf(%s)", a); break;
    case OP_SIGMOID: snprintf(buf, len, "1.0f / (1.0f + expf(-%s))", a); break;
    case OP_SIGN: snprintf(buf, len, "(%s > 0) - (%s < 0)", a, a); break;
    case OP_STEP: snprintf(buf, len, "%s > 0.0f ? 1.0f : 0.0f", a); break;
    case OP_SIN: snprintf(buf, len, "sinf(%s)", a); break;
    case OP_COS: snprintf(buf, len, "cosf(%s)", a); break;
    case OP_GELU: snprintf(buf, len, n->iarg[0] ? "tgk_gelu_tanh(%s)" : "tgk_gelu(%s)", a); break;
    case OP_GELU_GRAD: snprintf(buf, len, n->iarg[0] ? "tgk_gelu_tanh_grad(%s)" : "tgk_gelu_grad(%s)", a); break;
    case OP_IDENTITY: snprintf(buf, len, "%s", a); break;
    default: snprintf(buf, len, "0 /* ? */"); break;
    }
    return buf;
}

static const char *binary_expr(const tg_node *n, bool i32, const char *a, const char *b, char *buf, size_t len) {
    switch (n->op) {
    case OP_ADD: snprintf(buf, len, "%s + %s", a, b); break;
    case OP_SUB: snprintf(buf, len, "%s - %s", a, b); break;
    case OP_MUL: snprintf(buf, len, "%s * %s", a, b); break;
    case OP_DIV: snprintf(buf, len, i32 ? "(%2$s ? %1$s / %2$s : 0)" : "%s / %s", a, b); break;
    /* NaN-propagating exactly as the reference (x != x is the NaN test). */
    case OP_MIN: snprintf(buf, len, "((%1$s < %2$s || %1$s != %1$s) ? %1$s : %2$s)", a, b); break;
    case OP_MAX: snprintf(buf, len, "((%1$s > %2$s || %1$s != %1$s) ? %1$s : %2$s)", a, b); break;
    case OP_LESS: snprintf(buf, len, "(%s < %s ? 1.0f : 0.0f)", a, b); break;
    case OP_GREATER: snprintf(buf, len, "(%s > %s ? 1.0f : 0.0f)", a, b); break;
    case OP_EQUAL: snprintf(buf, len, "(%s == %s ? 1.0f : 0.0f)", a, b); break;
    default: snprintf(buf, len, "0"); break;
    }
    return buf;
}

/* The value of node id at ix, computed (not loaded): the op's expression over its sources. */
static const char *compute(cg *c, int id, ix_t ix, char *name) {
    const tg_node *n = N(c, id);
    const tg_node *s0 = n->nsrc > 0 ? N(c, n->src[0]) : NULL;
    const char *t = ctype(n);
    char e[900];
    switch (n->op) {
    case OP_CONST:
        if (n->dtype == TG_INT32) def(c, name, "t", t, "%lld", (long long)n->farg);
        else def(c, name, "t", t, "%s", flit(n->farg, (char[40]){ 0 }));
        break;
    case OP_HYPER: def(c, name, "t", t, "(float)H[%lld]", (long long)n->iarg[0]); break;
    case OP_IOTA:
        ensure_flat(c, n->shape, &ix);
        def(c, name, "t", t, "(%s)%s", t, ix.flat);
        break;
    case OP_RANDN:
        ensure_flat(c, n->shape, &ix);
        def(c, name, "t", t, "(float)tgk_normal((uint64_t)H[0], %lldull, (uint64_t)%s)", (long long)n->iarg[0], ix.flat);
        break;
    case OP_DROPOUT: {
        ensure_flat(c, n->shape, &ix);
        const char *x = val(c, n->src[0], ix);
        def(c, name, "t", t, "tgk_uniform((uint64_t)H[0], %lldull, (uint64_t)%s) >= %.17g ? (float)((double)%s / %.17g) : 0.0f",
            (long long)n->iarg[0], ix.flat, n->farg, x, 1.0 - n->farg);
        break;
    }
    case OP_NEG: case OP_ABS: case OP_SQUARE: case OP_SQRT: case OP_RSQRT: case OP_EXP: case OP_LOG:
    case OP_RELU: case OP_TANH: case OP_SIGMOID: case OP_SIGN: case OP_STEP: case OP_SIN: case OP_COS:
    case OP_GELU: case OP_GELU_GRAD: case OP_IDENTITY:
        def(c, name, "t", t, "%s", unary_expr(n, val(c, n->src[0], ix), e, sizeof e));
        break;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MIN: case OP_MAX:
    case OP_LESS: case OP_GREATER: case OP_EQUAL: {
        char a[NAME], b[NAME];
        snprintf(a, NAME, "%s", val(c, n->src[0], broadcast_ix(c, s0->shape, n->shape, &ix)));
        snprintf(b, NAME, "%s", val(c, n->src[1], broadcast_ix(c, N(c, n->src[1])->shape, n->shape, &ix)));
        def(c, name, "t", t, "%s", binary_expr(n, s0->dtype == TG_INT32, a, b, e, sizeof e));
        break;
    }
    case OP_WHERE: {
        char k[NAME], a[NAME], b[NAME];
        snprintf(k, NAME, "%s", val(c, n->src[0], broadcast_ix(c, s0->shape, n->shape, &ix)));
        snprintf(a, NAME, "%s", val(c, n->src[1], broadcast_ix(c, N(c, n->src[1])->shape, n->shape, &ix)));
        snprintf(b, NAME, "%s", val(c, n->src[2], broadcast_ix(c, N(c, n->src[2])->shape, n->shape, &ix)));
        def(c, name, "t", t, "%s != 0 ? %s : %s", k, a, b);
        break;
    }
    case OP_EXPAND:
        def(c, name, "t", t, "%s", val(c, n->src[0], broadcast_ix(c, s0->shape, n->shape, &ix)));
        break;
    case OP_RESHAPE:
        ensure_flat(c, n->shape, &ix);
        def(c, name, "t", t, "%s", val(c, n->src[0], ix_flat(ix.flat)));
        break;
    case OP_PERMUTE: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix_coords(s0->shape.ndim);
        for (int k = 0; k < n->shape.ndim; k++) strcpy(si.c[n->iarg[k]], ix.c[k]);
        def(c, name, "t", t, "%s", val(c, n->src[0], si));
        break;
    }
    case OP_SLICE: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix;
        si.has_flat = false;
        def(c, si.c[n->axis], "c", "int64_t", "%s + %lld", ix.c[n->axis], (long long)n->iarg[0]);
        def(c, name, "t", t, "%s", val(c, n->src[0], si));
        break;
    }
    case OP_PAD: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix;
        si.has_flat = false;
        char rel[NAME];
        int64_t len = s0->shape.d[n->axis];
        def(c, rel, "c", "int64_t", "%s - %lld", ix.c[n->axis], (long long)n->iarg[0]);
        clamped(c, si.c[n->axis], rel, len);
        const char *x = val(c, n->src[0], si);
        def(c, name, "t", t, "(%s >= 0 && %s < %lld) ? %s : 0", rel, rel, (long long)len, x);
        break;
    }
    case OP_WHERE_CAUSAL: {
        ensure_coords(c, n->shape, &ix);
        int r = n->shape.ndim;
        const char *x = val(c, n->src[0], ix);
        def(c, name, "t", t, "%s > %s ? %s : %s", ix.c[r - 1], ix.c[r - 2], flit(n->farg, (char[40]){ 0 }), x);
        break;
    }
    case OP_ONE_HOT: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix;
        si.has_flat = false;
        const char *k = val(c, n->src[0], si);
        def(c, name, "t", t, "%s == %s ? 1.0f : 0.0f", k, ix.c[n->shape.ndim - 1]);
        break;
    }
    case OP_GATHER_ROWS: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix;
        si.has_flat = false;
        char k[NAME], row[NAME], flat[NAME];
        int64_t rows = s0->shape.d[0], dim = s0->shape.d[1];
        snprintf(k, NAME, "%s", val(c, n->src[1], si));
        clamped(c, row, k, rows);
        def(c, flat, "f", "int64_t", "%s * %lld + %s", row, (long long)dim, ix.c[n->shape.ndim - 1]);
        const char *x = val(c, n->src[0], ix_flat(flat));
        def(c, name, "t", t, "(%s >= 0 && %s < %lld) ? %s : 0.0f", k, k, (long long)rows, x);
        break;
    }
    case OP_TAKE_ALONG: {
        ensure_coords(c, n->shape, &ix);
        char k[NAME];
        int64_t len = s0->shape.d[n->axis];
        snprintf(k, NAME, "%s", val(c, n->src[1], ix));
        ix_t si = ix;
        si.has_flat = false;
        clamped(c, si.c[n->axis], k, len);
        const char *x = val(c, n->src[0], si);
        def(c, name, "t", t, "(%s >= 0 && %s < %lld) ? %s : 0", k, k, (long long)len, x);
        break;
    }
    case OP_IM2COL: {
        ensure_coords(c, n->shape, &ix);
        int64_t kh = n->iarg[0], kw = n->iarg[1], st = n->iarg[2], pad = n->iarg[3];
        int64_t H = s0->shape.d[2], W = s0->shape.d[3], wo = (W + 2 * pad - kw) / st + 1;
        char y[NAME], x[NAME];
        ix_t si = ix_coords(4);
        strcpy(si.c[0], ix.c[0]);
        def(c, si.c[1], "c", "int64_t", "%s / %lld", ix.c[1], (long long)(kh * kw));
        def(c, y, "c", "int64_t", "(%s / %lld) * %lld - %lld + (%s / %lld) %% %lld", ix.c[2], (long long)wo, (long long)st,
            (long long)pad, ix.c[1], (long long)kw, (long long)kh);
        def(c, x, "c", "int64_t", "(%s %% %lld) * %lld - %lld + %s %% %lld", ix.c[2], (long long)wo, (long long)st,
            (long long)pad, ix.c[1], (long long)kw);
        clamped(c, si.c[2], y, H);
        clamped(c, si.c[3], x, W);
        const char *v = val(c, n->src[0], si);
        def(c, name, "t", t, "(%s >= 0 && %s < %lld && %s >= 0 && %s < %lld) ? %s : 0.0f", y, y, (long long)H, x, x,
            (long long)W, v);
        break;
    }
    default:
        def(c, name, "t", t, "0 /* %s is not pointwise */", op_name(n->op));
        break;
    }
    return name;
}

static const char *val(cg *c, int id, ix_t ix) {
    const tg_node *n = N(c, id);
    char key[sizeof c->memo[0].key];
    ix_key(&ix, n->shape.ndim, key, sizeof key);
    const char *found = memo_find(c, id, key);
    if (found) return found;
    char name[NAME];
    if (in_memory(c, id)) {
        ensure_flat(c, n->shape, &ix);
        c->used[id] = true;
        def(c, name, "t", ctype(n), "P%d[%s]", id, ix.flat);
    } else {
        compute(c, id, ix, name);
    }
    return memo_add(c, id, key, name);
}

/* ----- kernels ----- */

static void pointer(cg *c, strbuf *decl, int id, bool out) {
    const tg_node *n = N(c, id);
    const char *t = ctype(n), *q = out ? "" : "const ";
    if (is_bound(n->op))
        sb_printf(decl, "    %s%s *restrict P%d = (%s%s *)B[%d];\n", q, t, id, q, t, id);
    else
        sb_printf(decl, "    %s%s *restrict P%d = (%s%s *)(A + %zu);\n", q, t, id, q, t, c->plan->offset[id]);
}

static void begin_kernel(cg *c, int id) {
    c->root = id;
    c->n_memo = 0;
    c->body.len = 0;
    if (c->body.s) c->body.s[0] = 0;
    memset(c->used, 0, sizeof(bool) * (size_t)c->g->n);
}

/* The kernel's pointer declarations (every buffer its body read, then its output) and body. */
static void end_kernel(cg *c, const char *head, const char *tail) {
    strbuf decl = { 0 };
    for (int i = 0; i < c->g->n; i++)
        if (c->used[i]) pointer(c, &decl, i, false);
    pointer(c, &decl, c->root, true);
    sb_printf(c->out, "static void k%d(float *A, void **B, const double *H, void *const *R) {\n%s%s%s%s}\n\n", c->root,
              decl.s, head, c->body.s ? c->body.s : "", tail);
    free(decl.s);
}

/* Shapes are constants, so whether a loop is worth threads is decided here: small kernels get
 * no OpenMP region at all (each region is an outlined function the compiler must build). */
static const char *omp(const cg *c, int64_t work) {
    return work >= c->parallel_min ? "    #pragma omp parallel for schedule(static)\n" : "";
}

static void pointwise_kernel(cg *c, int id) {
    const tg_node *n = N(c, id);
    begin_kernel(c, id);
    const char *v = compute(c, id, ix_flat("i"), (char[NAME]){ 0 });
    char name[NAME];
    snprintf(name, NAME, "%s", v);
    line(c, "P%d[i] = %s;", id, name);
    char head[256];
    snprintf(head, sizeof head, "%s    for (int64_t i = 0; i < %lldll; i++) {\n", omp(c, n->numel), (long long)n->numel);
    end_kernel(c, head, "    }\n");
}

/* Sum over one axis of an inlined producer: [outer, len, inner] -> [outer, 1, inner]. */
static void sum_kernel(cg *c, int id) {
    const tg_node *n = N(c, id), *s = N(c, n->src[0]);
    int64_t outer = 1, len = s->shape.d[n->axis], inner = 1;
    for (int k = 0; k < n->axis; k++) outer *= s->shape.d[k];
    for (int k = n->axis + 1; k < s->shape.ndim; k++) inner *= s->shape.d[k];
    begin_kernel(c, id);
    char flat[NAME];
    def(c, flat, "f", "int64_t", "(o * %lld + k) * %lld + j", (long long)len, (long long)inner);
    const char *v = val(c, n->src[0], ix_flat(flat));
    line(c, "acc += %s;", v);
    char head[512];
    snprintf(head, sizeof head,
             "%s"
             "    for (int64_t oj = 0; oj < %lldll; oj++) {\n"
             "      const int64_t o = oj / %lld, j = oj %% %lld;\n"
             "      double acc = 0;\n"
             "      for (int64_t k = 0; k < %lldll; k++) {\n",
             omp(c, outer > 1 || inner > 1 ? outer * len * inner : 0), (long long)(outer * inner), (long long)inner,
             (long long)inner, (long long)len);
    char tail[128];
    snprintf(tail, sizeof tail, "      }\n      P%d[oj] = (%s)acc;\n    }\n", id, ctype(n));
    end_kernel(c, head, tail);
}

/* A call of library kernel `fn` with constant arguments and buffer pointers. */
static void library_call(cg *c, int id, const char *fn, const int64_t *args, int nargs, const int *bufs, int nbufs) {
    begin_kernel(c, id);
    strbuf head = { 0 };
    sb_printf(&head, "    static const int64_t a[] = {");
    for (int i = 0; i < nargs; i++) sb_printf(&head, "%s%lld", i ? ", " : " ", (long long)args[i]);
    sb_printf(&head, " };\n    void *const p[] = {");
    for (int i = 0; i < nbufs; i++) {
        if (bufs[i] != id) c->used[bufs[i]] = true;
        sb_printf(&head, "%s(void *)P%d", i ? ", " : " ", bufs[i]);
    }
    sb_printf(&head, " };\n    ((tgk_fn)R[%s])(a, p);\n", fn);
    end_kernel(c, head.s, "");
    free(head.s);
}

/* Batched matmul: per batch element, offsets into A and B (broadcast batch dims step 0), or one
 * product with the batch folded into M when B is shared and A is untransposed. */
static void matmul_kernel(cg *c, int id) {
    const tg_node *n = N(c, id), *a = N(c, n->src[0]), *b = N(c, n->src[1]);
    int ta = (int)n->iarg[0], tb = (int)n->iarg[1], r = n->shape.ndim;
    int64_t M = n->shape.d[r - 2], Nn = n->shape.d[r - 1];
    int64_t K = ta ? a->shape.d[a->shape.ndim - 2] : a->shape.d[a->shape.ndim - 1];
    int64_t batch = shape_numel(n->shape) / (M * Nn);
    int64_t bsize = shape_numel(b->shape) / (K * Nn), asize = shape_numel(a->shape) / (M * K);
    int bufs[3] = { n->src[0], n->src[1], id };
    if (bsize == 1 && !ta && asize == batch) {
        int64_t args[8] = { ta, tb, M * batch, Nn, K, 1, 0, 0 };
        library_call(c, id, "TGK_MATMUL", args, 8, bufs, 3);
        return;
    }
    /* args: ta, tb, M, N, K, batch, then batch offsets of A, then of B (elements). */
    int64_t *args = tg_xmalloc(sizeof(int64_t) * (size_t)(6 + 2 * batch));
    int64_t head[6] = { ta, tb, M, Nn, K, batch };
    memcpy(args, head, sizeof head);
    tg_shape out_batch = n->shape, ab = a->shape, bb = b->shape;
    out_batch.ndim -= 2;
    ab.ndim -= 2;
    bb.ndim -= 2;
    for (int64_t i = 0; i < batch; i++) {
        int64_t rem = i, ao = 0, bo = 0, ast = M * K, bst = K * Nn;
        for (int k = out_batch.ndim - 1; k >= 0; k--) {
            int64_t ck = rem % out_batch.d[k];
            rem /= out_batch.d[k];
            int ka = k - (out_batch.ndim - ab.ndim), kb = k - (out_batch.ndim - bb.ndim);
            if (ka >= 0) {
                if (ab.d[ka] != 1) ao += ck * ast;
                ast *= ab.d[ka];
            }
            if (kb >= 0) {
                if (bb.d[kb] != 1) bo += ck * bst;
                bst *= bb.d[kb];
            }
        }
        args[6 + i] = ao;
        args[6 + batch + i] = bo;
    }
    library_call(c, id, "TGK_MATMUL", args, (int)(6 + 2 * batch), bufs, 3);
    free(args);
}

static void axis_split(tg_shape s, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    *len = s.d[axis];
    for (int k = 0; k < axis; k++) *outer *= s.d[k];
    for (int k = axis + 1; k < s.ndim; k++) *inner *= s.d[k];
}

static void special_kernel(cg *c, int id) {
    const tg_node *n = N(c, id), *s0 = N(c, n->src[0]);
    int two[2] = { n->src[0], id }, three[3] = { n->src[0], n->nsrc > 1 ? n->src[1] : id, id };
    int64_t a[12] = { 0 };
    switch (n->op) {
    case OP_MATMUL: matmul_kernel(c, id); return;
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
        axis_split(n->shape, n->axis, &a[0], &a[1], &a[2]);
        a[3] = n->op == OP_LOG_SOFTMAX;
        library_call(c, id, "TGK_SOFTMAX", a, 4, two, 2);
        return;
    case OP_SOFTMAX_CAUSAL: {
        int r = n->shape.ndim;
        a[1] = n->shape.d[r - 2];
        a[2] = n->shape.d[r - 1];
        a[0] = n->numel / (a[1] * a[2]);
        library_call(c, id, "TGK_SOFTMAX_CAUSAL", a, 3, two, 2);
        return;
    }
    case OP_ARGMAX:
        axis_split(s0->shape, n->axis, &a[0], &a[1], &a[2]);
        a[3] = n->iarg[0];
        library_call(c, id, "TGK_ARGMAX", a, 4, two, 2);
        return;
    case OP_SCATTER_ROWS:
        a[0] = N(c, n->src[1])->numel;
        a[1] = n->shape.d[1];
        a[2] = n->shape.d[0];
        library_call(c, id, "TGK_SCATTER_ROWS", a, 3, three, 3);
        return;
    case OP_SCATTER_ALONG:
        axis_split(s0->shape, n->axis, &a[0], &a[1], &a[2]);
        a[3] = n->shape.d[n->axis];
        library_call(c, id, "TGK_SCATTER_ALONG", a, 4, three, 3);
        return;
    case OP_COL2IM: case OP_MAXPOOL2D: case OP_MAXPOOL2D_BWD: {
        const tg_shape img = n->op == OP_MAXPOOL2D ? s0->shape : n->shape;
        for (int k = 0; k < 4; k++) a[k] = img.d[k];
        if (n->op == OP_COL2IM) {
            for (int k = 0; k < 4; k++) a[4 + k] = n->iarg[k];   /* kh kw stride pad */
            library_call(c, id, "TGK_COL2IM", a, 8, two, 2);
        } else {
            a[4] = a[5] = n->iarg[0];                            /* k, k, stride, pad */
            a[6] = n->iarg[1];
            a[7] = n->iarg[2];
            library_call(c, id, n->op == OP_MAXPOOL2D ? "TGK_MAXPOOL" : "TGK_MAXPOOL_BWD", a, 8,
                         n->op == OP_MAXPOOL2D ? two : three, n->op == OP_MAXPOOL2D ? 2 : 3);
        }
        return;
    }
    default:
        return;
    }
}

/* The prelude every generated file starts with: the pieces of internal.h the kernels use. */
static const char PRELUDE[] =
    "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n"
    "typedef void (*tgk_fn)(const int64_t *a, void *const *p);\n"
    "enum { TGK_MATMUL, TGK_SOFTMAX, TGK_SOFTMAX_CAUSAL, TGK_ARGMAX, TGK_SCATTER_ROWS, TGK_SCATTER_ALONG,\n"
    "       TGK_COL2IM, TGK_MAXPOOL, TGK_MAXPOOL_BWD };\n"
    "static inline uint64_t tgk_mix(uint64_t z) {\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;\n"
    "    return z ^ (z >> 31);\n}\n"
    "static inline double tgk_uniform(uint64_t seed, uint64_t salt, uint64_t i) {\n"
    "    uint64_t b = tgk_mix(tgk_mix(seed * 0x9E3779B97F4A7C15ull + salt) + i * 0xD1B54A32D192ED03ull);\n"
    "    return ((double)(b >> 40) + 0.5) * (1.0 / 16777216.0);\n}\n"
    "static inline double tgk_normal(uint64_t seed, uint64_t salt, uint64_t i) {\n"
    "    double u1 = tgk_uniform(seed, salt, 2 * i), u2 = tgk_uniform(seed, salt, 2 * i + 1);\n"
    "    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);\n}\n"
    "static inline float tgk_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }\n"
    "static inline float tgk_gelu_grad(float x) {\n"
    "    return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x);\n}\n"
    "static inline float tgk_gelu_tanh(float x) {\n"
    "    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));\n}\n"
    "static inline float tgk_gelu_tanh_grad(float x) {\n"
    "    float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));\n"
    "    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);\n}\n\n";

char *codegen_c(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min) {
    strbuf out = { 0 };
    cg c = { .g = g, .mat = materialized, .plan = plan, .out = &out, .parallel_min = parallel_min };
    c.used = tg_xmalloc(sizeof(bool) * (size_t)(g->n + 1));
    sb_printf(&out, "/* generated by tensorgrad: %d nodes */\n%s", g->n, PRELUDE);
    strbuf entry = { 0 };
    sb_printf(&entry, "void tg_entry(float *A, void **B, const double *H, void *const *R) {\n");
    for (int i = 0; i < g->n; i++) {
        if (!materialized[i]) continue;
        const tg_node *n = &g->nodes[i];
        if (fuse_pointwise(n->op)) pointwise_kernel(&c, i);
        else if (n->op == OP_SUM) sum_kernel(&c, i);
        else special_kernel(&c, i);
        sb_printf(&entry, "    k%d(A, B, H, R);\n", i);
    }
    sb_printf(&entry, "}\n");
    sb_printf(&out, "%s", entry.s);
    free(entry.s);
    free(c.body.s);
    free(c.memo);
    free(c.used);
    return out.s;
}
