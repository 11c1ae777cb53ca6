/* The expression engine shared by the code generators: see expr.h. */
#include "compile/expr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tg_node *N(const cg *c, int id) { return &c->g->nodes[id]; }
const char *cg_ctype(const tg_node *n) { return n->dtype == TG_INT32 ? "int32_t" : "float"; }
bool cg_is_bound(tg_op op) { return op == OP_INPUT || op == OP_PARAM || op == OP_STATE; }

static bool has_pad(const cg *c, int node, int root, int depth) {
    const tg_node *n = N(c, node);
    if (node != root && (c->mat[node] || cg_is_bound(n->op))) return false;
    if (n->op == OP_PAD || depth > 64) return true;
    for (int k = 0; k < n->nsrc; k++)
        if (has_pad(c, n->src[k], root, depth + 1)) return true;
    return false;
}

bool cg_has_pad(const cg *c, int node, int root) { return has_pad(c, node, root, 0); }

const char *cg_index_type(const cg *c, int root, int64_t numel) {
    return numel < ((int64_t)1 << 31) ? "uint32_t" : "int64_t";
}
static bool in_memory(const cg *c, int id) { return id != c->root && (c->mat[id] || cg_is_bound(N(c, id)->op)); }

void cg_line(cg *c, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sb_printf(&c->body, "        %s\n", buf);
}

/* A fresh variable `name` of `type` holding the expression. */
void cg_def(cg *c, char *name, const char *prefix, const char *type, const char *fmt, ...) {
    char expr[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(expr, sizeof expr, fmt, ap);
    va_end(ap);
    snprintf(name, NAME, "%s%d", prefix, c->ntmp++);
    cg_line(c, "const %s %s = %s;", type, name, expr);
}

/* A float literal for v, inf and NaN included. */
const char *cg_flit(double v, char *buf) {
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

/* name = the sum of coordinates ix->c[from..] times their strides in s (a variable, or "0"). */
static void strided_sum(cg *c, tg_shape s, const ix_t *ix, int from, const char *prefix, char *name) {
    char expr[512] = "0";
    int len = 0;
    for (int k = from; k < s.ndim; k++) {
        if (s.d[k] == 1 || strcmp(ix->c[k], "0") == 0) continue;
        int64_t st = stride_of(s, k);
        len += st == 1 ? snprintf(expr + len, sizeof expr - (size_t)len, "%s%s", len ? " + " : "", ix->c[k])
                       : snprintf(expr + len, sizeof expr - (size_t)len, "%s%s * %lld", len ? " + " : "", ix->c[k], (long long)st);
    }
    if (len == 0) strcpy(name, "0");
    else cg_def(c, name, prefix, "int64_t", "%s", expr);
}

static void ensure_flat(cg *c, tg_shape s, ix_t *ix) {
    if (ix->has_flat) return;
    strided_sum(c, s, ix, 0, "f", ix->flat);
    ix->has_flat = true;
}

/* Is flat index ix the row nesting's (cg.row): i = o * row + u? */
static bool row_nested(const cg *c, const ix_t *ix) { return c->row > 1 && strcmp(ix->flat, c->row_ix[0] ? c->row_ix : "i") == 0; }

static void ensure_coords(cg *c, tg_shape s, ix_t *ix) {
    if (ix->has_coords) return;
    if (row_nested(c, ix) && s.ndim >= 2 && s.d[s.ndim - 1] == c->row) {   /* i = o * row + u */
        const char *o = c->row_o[0] ? c->row_o : "o";
        for (int k = 0; k < s.ndim; k++) {
            int64_t st = stride_of(s, k) / c->row;
            if (s.d[k] == 1) strcpy(ix->c[k], "0");
            else if (k == s.ndim - 1) snprintf(ix->c[k], NAME, "%s", c->row_u[0] ? c->row_u : "u");
            else if (k == 0) cg_def(c, ix->c[k], "c", "int64_t", "%s / %lld", o, (long long)st);
            else cg_def(c, ix->c[k], "c", "int64_t", "(%s / %lld) %% %lld", o, (long long)st, (long long)s.d[k]);
        }
        ix->has_coords = c->row_used = true;
        return;
    }
    int64_t part = s.ndim >= 2 ? s.d[s.ndim - 1] : 0;   /* a part of the row this read runs along: rows of it would do */
    if (row_nested(c, ix) && part >= 16 && part > c->row_part && c->row % part == 0) c->row_part = part;
    for (int k = 0; k < s.ndim; k++) {
        int64_t st = stride_of(s, k);
        if (s.d[k] == 1) strcpy(ix->c[k], "0");
        else if (k == 0 && st == 1) snprintf(ix->c[k], NAME, "%s", ix->flat);
        else if (k == 0) cg_def(c, ix->c[k], "c", "int64_t", "%s / %lld", ix->flat, (long long)st);
        else if (st == 1) cg_def(c, ix->c[k], "c", "int64_t", "%s %% %lld", ix->flat, (long long)s.d[k]);
        else cg_def(c, ix->c[k], "c", "int64_t", "(%s / %lld) %% %lld", ix->flat, (long long)st, (long long)s.d[k]);
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

/* The index into source `src` (NumPy-broadcast to `out`) of the element at ix of `out`. */
static ix_t broadcast_ix(cg *c, tg_shape src, tg_shape out, ix_t *ix) {
    if (shapes_equal(src, out)) return *ix;
    if (src.ndim == 0 || shape_numel(src) == 1) return ix_flat("0");
    ensure_coords(c, out, ix);
    ix_t r = ix_coords(src.ndim);
    int lead = out.ndim - src.ndim;
    for (int k = 0; k < src.ndim; k++)
        if (src.d[k] != 1) strcpy(r.c[k], ix->c[k + lead]);
    return r;
}

static const char *val(cg *c, int id, ix_t ix);
static bool pad_lanes(cg *c, int id, ix_t ix, char *name);

/* The coordinates in `src` of the element at coordinates ix (no flat index: after a permute) of
 * its reshape `out`, where the reshape only merges out's trailing axes into src's last one (the
 * heads of an attention merged back into its width): the leading coordinates as they are, the
 * last one c_a * b + c_b..., with no flat index divided out again. False for other reshapes. */
static bool reshape_coords(cg *c, tg_shape out, tg_shape src, const ix_t *ix, ix_t *si) {
    int lead = src.ndim - 1, m = out.ndim - lead;
    if (ix->has_flat || !ix->has_coords || src.ndim < 1 || m < 1) return false;
    for (int k = 0; k < lead; k++)
        if (out.d[k] != src.d[k]) return false;
    int64_t merged = 1;
    for (int k = lead; k < out.ndim; k++) merged *= out.d[k];
    if (merged != src.d[lead]) return false;
    *si = ix_coords(src.ndim);
    for (int k = 0; k < lead; k++) strcpy(si->c[k], ix->c[k]);
    strided_sum(c, out, ix, lead, "c", si->c[lead]);
    return true;
}

static const char *memo_find(cg *c, int id, const char *key) {
    for (int i = c->n_memo - 1; i >= 0; i--)
        if (c->memo[i].node == id && strcmp(c->memo[i].key, key) == 0) return c->memo[i].name;
    return NULL;
}

bool cg_unplaced(const cg *c, int id) {
    int home = plan_home(c->plan, id);
    return c->plan->offset[home] == PLAN_BOUND && !cg_is_bound(c->g->nodes[home].op) && c->mat[home];
}

void cg_root_line(cg *c, int r) {
    c->root = r;
    const char *v = cg_root_value(c, "i");
    if (!cg_unplaced(c, r)) cg_line(c, "P%d[i] = %s;", r, v);
    if (c->wb_check && c->wb_check[r]) cg_line(c, WB_CHECK_LINE, v, c->flag_slot, r);
    if (c->n_memo > 0) cg_memo_add(c, r, "fi", c->memo[c->n_memo - 1].name);
}

bool cg_try_root(cg *c, int r, bool (*fits)(void *ctx), void *ctx) {
    size_t body_len = c->body.len;
    int n_memo = c->n_memo, ntmp = c->ntmp;
    bool *saved = tg_alloc(sizeof(bool) * (size_t)(c->g->n + 1));
    if (!saved) return false;
    memcpy(saved, c->used, sizeof(bool) * (size_t)c->g->n);
    cg_root_line(c, r);
    bool ok = fits(ctx);
    if (!ok) {
        c->body.len = body_len;
        if (c->body.s) c->body.s[body_len] = 0;
        c->n_memo = n_memo;
        c->ntmp = ntmp;
        memcpy(c->used, saved, sizeof(bool) * (size_t)c->g->n);
    }
    free(saved);
    return ok;
}

const char *cg_memo_add(cg *c, int id, const char *key, const char *name) {
    memo_t copy;   /* key and name may point into the memo array, which growing it moves */
    snprintf(copy.key, sizeof copy.key, "%s", key);
    snprintf(copy.name, NAME, "%s", name);
    copy.node = id;
    memo_t *m = cg_memo_slot(c);
    if (!m) return "0";   /* out of memory: the output is discarded (alloc_failures) */
    *m = copy;
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
    cg_def(c, name, "c", "int64_t", "%s < 0 ? 0 : %s >= %lld ? %lld : %s", v, v, (long long)n, (long long)(n - 1), v);
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

/* The function rounding a bf16 activation (or a product's bias) in this generator's code. */
static const char *bf16_round(const cg *c) { return c->operand_round ? c->operand_round : "tgk_bf16r"; }

static const char *binary_expr(const tg_node *n, bool i32, const char *a, const char *b, char *buf, size_t len) {
    switch (n->op) {
    case OP_ADD: snprintf(buf, len, "%s + %s", a, b); break;
    case OP_SUB: snprintf(buf, len, "%s - %s", a, b); break;
    case OP_MUL: snprintf(buf, len, "%s * %s", a, b); break;
    /* i32: x / 0 is 0 (as the reference) and INT32_MIN / -1 wraps: both would trap on x86. */
    case OP_DIV:
        snprintf(buf, len, i32 ? "(%2$s == -1 ? (int32_t)(0u - (uint32_t)%1$s) : %2$s ? %1$s / %2$s : 0)" : "%s / %s", a, b);
        break;
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

/* The flat index in operand x (of product node n, element at coordinates ix) of its first
 * element along k: the batch coordinates broadcast to x's batch dims, then row `row` or column
 * `col` of x's matrix (the other one is k's). */
static void operand_base(cg *c, const tg_node *n, int x, const ix_t *ix, const char *row, const char *col, char *base) {
    tg_shape s = N(c, x)->shape;
    ix_t r = ix_coords(s.ndim);
    int lead = n->shape.ndim - s.ndim;
    for (int k = 0; k + 2 < s.ndim; k++)
        if (s.d[k] != 1) strcpy(r.c[k], ix->c[k + lead]);
    strcpy(r.c[s.ndim - 2], row);
    strcpy(r.c[s.ndim - 1], col);
    ensure_flat(c, s, &r);
    snprintf(base, NAME, "%s", r.flat);
}

/* A small product computed where it is read (fuse_schedule's FUSE_SMALL_REDUCTIONS): element
 * (batch, m, n) as a loop over k, both operands read from memory and rounded as the graph's
 * precision rounds product operands (c->operand_round), summed in f32 as cuBLAS sums, in four
 * independent partial sums so that a thread has several loads in flight. */
static void product(cg *c, int id, ix_t ix, char *name) {
    const tg_node *n = N(c, id);
    const tg_node *a = N(c, n->src[0]);
    bool ta = n->iarg[0] != 0, tb = n->iarg[1] != 0;
    int nd = n->shape.ndim;
    int64_t M = n->shape.d[nd - 2], Nn = n->shape.d[nd - 1], K = a->shape.d[a->shape.ndim - (ta ? 2 : 1)];
    ensure_coords(c, n->shape, &ix);
    char ab[NAME], bb[NAME];   /* A[m, k] at ab + k * sa; B[k, n] at bb + k * sb */
    operand_base(c, n, n->src[0], &ix, ta ? "0" : ix.c[nd - 2], ta ? ix.c[nd - 2] : "0", ab);
    operand_base(c, n, n->src[1], &ix, tb ? ix.c[nd - 1] : "0", tb ? "0" : ix.c[nd - 1], bb);
    int64_t sa = ta ? M : 1, sb = tb ? 1 : Nn;
    c->used[n->src[0]] = c->used[n->src[1]] = true;
    const char *rf = c->operand_round;
    int sums = K < 4 ? (int)K : 4;
    char term[4][300], total[100];
    int t = c->ntmp++;
    for (int u = 0; u < sums; u++) {
        snprintf(term[u], sizeof term[u], "%s%sP%d[%s + (k%d + %d) * %lld]%s * %s%sP%d[%s + (k%d + %d) * %lld]%s", rf ? rf : "",
                 rf ? "(" : "", n->src[0], ab, t, u, (long long)sa, rf ? ")" : "", rf ? rf : "", rf ? "(" : "", n->src[1], bb, t,
                 u, (long long)sb, rf ? ")" : "");
        cg_line(c, "float s%d_%d = 0.0f;", t, u);
    }
    if (K >= 4)
        cg_line(c, "for (int64_t k%d = 0; k%d < %lld; k%d += 4) { s%d_0 += %s; s%d_1 += %s; s%d_2 += %s; s%d_3 += %s; }", t, t,
                (long long)(K / 4 * 4), t, t, term[0], t, term[1], t, term[2], t, term[3]);
    for (int64_t k = K / 4 * 4; k < K; k++)
        cg_line(c, "{ const int64_t k%d = %lld; s%d_%d += %s; }", t, (long long)k, t, (int)(k % 4), term[0]);
    static const char *const add[5] = { "", "s%1$d_0", "s%1$d_0 + s%1$d_1", "(s%1$d_0 + s%1$d_1) + s%1$d_2",
                                        "(s%1$d_0 + s%1$d_1) + (s%1$d_2 + s%1$d_3)" };
    snprintf(total, sizeof total, add[sums], t);
    cg_def(c, name, "t", "float", "%s", total);
}

/* A short sum computed where it is read (FUSE_SMALL_REDUCTIONS), its terms written out one by one
 * rather than in a loop, so that what they compute stays in scope for the rest of the kernel (the
 * memo may hand it out again), added in double as every sum. */
static void short_sum(cg *c, int id, ix_t ix, char *name) {
    const tg_node *n = N(c, id), *s = N(c, n->src[0]);
    ensure_coords(c, n->shape, &ix);
    int t = c->ntmp++;
    cg_line(c, "double s%d = 0;", t);
    for (int64_t k = 0; k < s->shape.d[n->axis]; k++) {
        ix_t si = ix;
        si.has_flat = false;
        snprintf(si.c[n->axis], NAME, "%lld", (long long)k);
        cg_line(c, "s%d += %s;", t, val(c, n->src[0], si));
    }
    cg_def(c, name, "t", "float", "(float)s%d", t);
}

/* The value of node id at ix, computed (not loaded): the op's expression over its sources. */
static const char *compute(cg *c, int id, ix_t ix, char *name) {
    const tg_node *n = N(c, id);
    const tg_node *s0 = n->nsrc > 0 ? N(c, n->src[0]) : NULL;
    const char *t = cg_ctype(n);
    char e[900];
    switch (n->op) {
    case OP_CONST:
        if (n->dtype == TG_INT32) cg_def(c, name, "t", t, "%lld", (long long)n->farg);
        else cg_def(c, name, "t", t, "%s", cg_flit(n->farg, (char[40]){ 0 }));
        break;
    case OP_HYPER: cg_def(c, name, "t", t, "(float)H[%lld]", (long long)n->iarg[0]); break;
    case OP_IOTA:
        ensure_flat(c, n->shape, &ix);
        cg_def(c, name, "t", t, "(%s)%s", t, ix.flat);
        break;
    case OP_RANDN:
        ensure_flat(c, n->shape, &ix);
        cg_def(c, name, "t", t, "(float)tgk_normal((uint64_t)H[0], %lldull, (uint64_t)%s)", (long long)n->iarg[0], ix.flat);
        break;
    case OP_DROPOUT: {
        ensure_flat(c, n->shape, &ix);
        const char *x = val(c, n->src[0], ix);
        cg_def(c, name, "t", t, "tgk_uniform((uint64_t)H[0], %lldull, (uint64_t)%s) >= %.17g ? (float)((double)%s / %.17g) : 0.0f",
            (long long)n->iarg[0], ix.flat, n->farg, x, 1.0 - n->farg);
        break;
    }
    case OP_NEG: case OP_ABS: case OP_SQUARE: case OP_SQRT: case OP_RSQRT: case OP_EXP: case OP_LOG:
    case OP_RELU: case OP_TANH: case OP_SIGMOID: case OP_SIGN: case OP_STEP: case OP_SIN: case OP_COS:
    case OP_GELU: case OP_GELU_GRAD: case OP_IDENTITY:
        cg_def(c, name, "t", t, "%s", unary_expr(n, val(c, n->src[0], ix), e, sizeof e));
        break;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MIN: case OP_MAX:
    case OP_LESS: case OP_GREATER: case OP_EQUAL: {
        char a[NAME], b[NAME];
        snprintf(a, NAME, "%s", val(c, n->src[0], broadcast_ix(c, s0->shape, n->shape, &ix)));
        snprintf(b, NAME, "%s", val(c, n->src[1], broadcast_ix(c, N(c, n->src[1])->shape, n->shape, &ix)));
        int p = n->op == OP_ADD ? graph_product_addend(c->g, c->bf16, id) : -1;
        if (p >= 0) {   /* a product plus its addend: the addend rounded to bf16 first (a bias; else it is bf16) */
            char *addend = p == n->src[0] ? b : a, r[NAME];
            cg_def(c, r, "t", t, "%s(%s)", bf16_round(c), addend);
            memcpy(addend, r, NAME);
        }
        cg_def(c, name, "t", t, "%s", binary_expr(n, s0->dtype == TG_INT32, a, b, e, sizeof e));
        break;
    }
    case OP_WHERE: {
        char k[NAME], a[NAME], b[NAME];
        snprintf(k, NAME, "%s", val(c, n->src[0], broadcast_ix(c, s0->shape, n->shape, &ix)));
        snprintf(a, NAME, "%s", val(c, n->src[1], broadcast_ix(c, N(c, n->src[1])->shape, n->shape, &ix)));
        snprintf(b, NAME, "%s", val(c, n->src[2], broadcast_ix(c, N(c, n->src[2])->shape, n->shape, &ix)));
        cg_def(c, name, "t", t, "%s != 0 ? %s : %s", k, a, b);
        break;
    }
    case OP_EXPAND:
        cg_def(c, name, "t", t, "%s", val(c, n->src[0], broadcast_ix(c, s0->shape, n->shape, &ix)));
        break;
    case OP_RESHAPE: {
        ix_t si;
        if (c->row && reshape_coords(c, n->shape, s0->shape, &ix, &si)) {
            cg_def(c, name, "t", t, "%s", val(c, n->src[0], si));
            break;
        }
        ensure_flat(c, n->shape, &ix);
        cg_def(c, name, "t", t, "%s", val(c, n->src[0], ix_flat(ix.flat)));
        break;
    }
    case OP_PERMUTE: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix_coords(s0->shape.ndim);
        for (int k = 0; k < n->shape.ndim; k++) strcpy(si.c[n->iarg[k]], ix.c[k]);
        cg_def(c, name, "t", t, "%s", val(c, n->src[0], si));
        break;
    }
    case OP_SLICE: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix;
        si.has_flat = false;
        cg_def(c, si.c[n->axis], "c", "int64_t", "%s + %lld", ix.c[n->axis], (long long)n->iarg[0]);
        cg_def(c, name, "t", t, "%s", val(c, n->src[0], si));
        break;
    }
    case OP_PAD: {
        if (pad_lanes(c, id, ix, name)) break;
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix;
        si.has_flat = false;
        char rel[NAME];
        int64_t len = s0->shape.d[n->axis];
        cg_def(c, rel, "c", "int64_t", "(int64_t)%s - %lld", ix.c[n->axis], (long long)n->iarg[0]);   /* below zero, not wrapped */
        clamped(c, si.c[n->axis], rel, len);
        const char *x = val(c, n->src[0], si);
        cg_def(c, name, "t", t, "(%s >= 0 && %s < %lld) ? %s : 0", rel, rel, (long long)len, x);
        break;
    }
    case OP_WHERE_CAUSAL: {
        ensure_coords(c, n->shape, &ix);
        int r = n->shape.ndim;
        const char *x = val(c, n->src[0], ix);
        cg_def(c, name, "t", t, "%s > %s ? %s : %s", ix.c[r - 1], ix.c[r - 2], cg_flit(n->farg, (char[40]){ 0 }), x);
        break;
    }
    case OP_ONE_HOT: {
        ensure_coords(c, n->shape, &ix);
        ix_t si = ix;
        si.has_flat = false;
        const char *k = val(c, n->src[0], si);
        cg_def(c, name, "t", t, "%s == %s ? 1.0f : 0.0f", k, ix.c[n->shape.ndim - 1]);
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
        cg_def(c, flat, "f", "int64_t", "%s * %lld + %s", row, (long long)dim, ix.c[n->shape.ndim - 1]);
        const char *x = val(c, n->src[0], ix_flat(flat));
        cg_def(c, name, "t", t, "(%s >= 0 && %s < %lld) ? %s : 0.0f", k, k, (long long)rows, x);
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
        cg_def(c, name, "t", t, "(%s >= 0 && %s < %lld) ? %s : 0", k, k, (long long)len, x);
        break;
    }
    case OP_IM2COL: {
        ensure_coords(c, n->shape, &ix);
        int64_t kh = n->iarg[0], kw = n->iarg[1], st = n->iarg[2], pad = n->iarg[3];
        int64_t H = s0->shape.d[2], W = s0->shape.d[3], wo = (W + 2 * pad - kw) / st + 1;
        char y[NAME], x[NAME];
        ix_t si = ix_coords(4);
        strcpy(si.c[0], ix.c[0]);
        cg_def(c, si.c[1], "c", "int64_t", "%s / %lld", ix.c[1], (long long)(kh * kw));
        cg_def(c, y, "c", "int64_t", "(%s / %lld) * %lld - %lld + (%s / %lld) %% %lld", ix.c[2], (long long)wo, (long long)st,
            (long long)pad, ix.c[1], (long long)kw, (long long)kh);
        cg_def(c, x, "c", "int64_t", "(%s %% %lld) * %lld - %lld + %s %% %lld", ix.c[2], (long long)wo, (long long)st,
            (long long)pad, ix.c[1], (long long)kw);
        clamped(c, si.c[2], y, H);
        clamped(c, si.c[3], x, W);
        const char *v = val(c, n->src[0], si);
        cg_def(c, name, "t", t, "(%s >= 0 && %s < %lld && %s >= 0 && %s < %lld) ? %s : 0.0f", y, y, (long long)H, x, x,
            (long long)W, v);
        break;
    }
    case OP_MATMUL: product(c, id, ix, name); break;
    case OP_SUM: short_sum(c, id, ix, name); break;
    default:
        cg_def(c, name, "t", t, "0 /* %s is not pointwise */", op_name(n->op));
        break;
    }
    if (graph_rounds(c->g, c->bf16, id)) {   /* a bf16 activation, rounded where it is computed */
        char r[NAME];
        cg_def(c, r, "t", t, "%s(%s)", bf16_round(c), name);
        memcpy(name, r, NAME);
    }
    return name;
}

/* One load of `lanes` consecutive values: 2 or 4 floats, or 2, 4 or 8 bf16 values two to a word
 * (16 bytes, the widest load). */
const char *cg_vector_type(bool bf16, int lanes) {
    return bf16 ? (lanes == 8 ? "uint4" : lanes == 4 ? "uint2" : "unsigned") : (lanes == 4 ? "float4" : "float2");
}

/* Lane c->lane's element of vector k (c->vec), as a float. */
static void lane_part(cg *c, int k, bool bf16, char *name) {
    static const char *const part[] = { ".x", ".y", ".z", ".w" };
    if (!bf16) cg_def(c, name, "t", "float", "%s%s", c->vec[k].name, part[c->lane]);
    else cg_def(c, name, "t", "float", c->lane % 2 ? "__uint_as_float(%s%s & 0xffff0000u)" : "__uint_as_float(%s%s << 16)",
                c->vec[k].name, c->lanes >= 4 ? part[c->lane / 2] : "");
}

/* Lane c->lane's element of the vector of node id at lane_base (cg.lanes), loading the vector
 * first if no lane has yet; false where its elements are not floats. Arena buffers are 64-byte
 * aligned; a bound leaf's pointer is tested (element by element where it is not aligned). */
static bool lane_load(cg *c, int id, char *name) {
    const tg_node *n = N(c, id);
    int home = plan_home(c->plan, id), k = 0;
    bool bf16 = cg_unplaced(c, id);
    if (n->dtype != TG_FLOAT32 || (c->lanes != 2 && c->lanes != 4 && !(c->lanes == 8 && bf16)) ||
        (bf16 && cg_is_bound(N(c, home)->op)))   /* eight floats: each lane its own */
        return false;
    while (k < c->n_vec && c->vec[k].node != id) k++;
    if (k == c->n_vec) {
        if (k == (int)(sizeof c->vec / sizeof c->vec[0])) return false;
        const char *t = cg_vector_type(bf16, c->lanes);
        const char *b = c->lane_base;
        const int regs = c->row_in_iters * (bf16 ? c->lanes / 2 : c->lanes);
        c->vec[k].node = id;
        if (c->row_in && c->row_in[id] >= 0 && !cg_is_bound(N(c, home)->op) && (c->row_in[id] || c->row_in_regs >= regs)) {
            c->row_in_regs -= c->row_in[id] ? 0 : regs;
            c->row_in[id] = 1;
            cg_def(c, c->vec[k].name, "v", t, "X%d[it]", id);
        } else if (!cg_is_bound(N(c, home)->op))
            cg_def(c, c->vec[k].name, "v", t, "*(const %s *)(P%d + %s)", t, id, b);
        else
            cg_def(c, c->vec[k].name, "v", t, "tgk_load%d(P%d + %s)", c->lanes, id, b);
        c->n_vec++;
    }
    lane_part(c, k, bf16, name);
    return true;
}

/* A PAD along the last axis read at the lanes' own index, its source a float buffer of the arena
 * (or a reshape of one) and every boundary a multiple of the lanes: the lanes fall in the source
 * or in the zeros together, so lane 0 loads the source's vector there, under the test (a
 * predicated load), and each lane takes its element. A concatenation, a sum of such pads, then reads each source once
 * at one wide load, where each element read every source and wasted the loads out of range
 * (char_gpt's q, k and v gradients side by side with their column sums: 77 us). */
static bool pad_lanes(cg *c, int id, ix_t ix, char *name) {
    const tg_node *n = N(c, id);
    const int last = n->shape.ndim - 1, L = c->lanes;
    const int64_t D = n->shape.d[last], len = N(c, n->src[0])->shape.d[last], off = n->iarg[0];
    int src = n->src[0];   /* through reshapes: the same flat index */
    while (L && !in_memory(c, src) && N(c, src)->op == OP_RESHAPE) src = N(c, src)->src[0];
    if ((L != 2 && L != 4) || n->axis != last || D % L || len % L || off % L || !ix.has_flat || strcmp(ix.flat, c->lane_ix) != 0 ||
        !in_memory(c, src) || N(c, src)->dtype != TG_FLOAT32 || cg_is_bound(N(c, plan_home(c->plan, src))->op) ||
        (c->row_vals && c->row_vals[src]) || (c->regs && c->regs[src]) || (c->row_in && c->row_in[src] >= 0))
        return false;
    const bool bf16 = cg_unplaced(c, src);
    int k = 0;
    while (k < c->n_vec && c->vec[k].node != id) k++;
    if (k == c->n_vec) {
        if (c->lane != 0 || k == (int)(sizeof c->vec / sizeof c->vec[0])) return false;
        const char *t = cg_vector_type(bf16, L);
        char rel[NAME];
        cg_def(c, rel, "c", "int64_t", "(int64_t)(%s %% %lld) - %lld", c->lane_base, (long long)D, (long long)off);
        cg_def(c, c->vec[k].name, "v", t, "%s >= 0 && %s < %lld ? *(const %s *)(P%d + (int64_t)(%s / %lld) * %lld + %s) : %s",
               rel, rel, (long long)len, t, src, c->lane_base, (long long)D, (long long)len, rel,
               bf16 ? (L == 4 ? "make_uint2(0, 0)" : "0u") : L == 4 ? "make_float4(0, 0, 0, 0)" : "make_float2(0, 0)");
        c->vec[k].node = id;
        c->n_vec++;
        c->used[src] = true;
    }
    lane_part(c, k, bf16, name);
    return true;
}

static const char *val(cg *c, int id, ix_t ix) {
    const tg_node *n = N(c, id);
    char key[sizeof c->memo[0].key];
    ix_key(&ix, n->shape.ndim, key, sizeof key);
    const char *found = memo_find(c, id, key);
    if (found) return found;
    char name[NAME];
    if (in_memory(c, id)) {
        if (c->row_vals && c->row_vals[id]) {   /* read at the kernel's row (cg_row_local) */
            snprintf(name, sizeof name, "V%d", id);
            return cg_memo_add(c, id, key, name);
        }
        ensure_flat(c, n->shape, &ix);
        bool own = c->lanes && strcmp(ix.flat, c->lane_ix) == 0;
        if (c->regs && c->regs[id]) {
            if (!own) c->regs_missed = true;
            cg_def(c, name, "t", "float", "R%d[it * %d + %d]", id, c->lanes, c->lane);
            return cg_memo_add(c, id, key, name);
        }
        c->used[id] = true;
        if (own && lane_load(c, id, name)) {
            /* a lane of one wide load */
        } else if (cg_unplaced(c, id)) cg_def(c, name, "t", "float", "tgk_bf16f(P%d[%s])", id, ix.flat);   /* kept in bf16 only */
        else cg_def(c, name, "t", cg_ctype(n), "P%d[%s]", id, ix.flat);
    } else {
        compute(c, id, ix, name);
    }
    return cg_memo_add(c, id, key, name);
}


/* ----- shapes for the generators ----- */

void cg_axis_split(tg_shape s, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    *len = s.d[axis];
    for (int k = 0; k < axis; k++) *outer *= s.d[k];
    for (int k = axis + 1; k < s.ndim; k++) *inner *= s.d[k];
}

cg_gemm cg_gemm_of(const tg_graph *g, int id) {
    const tg_node *n = &g->nodes[id], *a = &g->nodes[n->src[0]], *b = &g->nodes[n->src[1]];
    cg_gemm m = { (int)n->iarg[0], (int)n->iarg[1], 0, 0, 0, 0, NULL, NULL };
    m.M = n->shape.d[n->shape.ndim - 2];
    m.N = n->shape.d[n->shape.ndim - 1];
    m.K = m.ta ? a->shape.d[a->shape.ndim - 2] : a->shape.d[a->shape.ndim - 1];
    m.batch = n->numel / (m.M * m.N);
    if (b->numel / (m.K * m.N) == 1 && !m.ta && a->numel / (m.M * m.K) == m.batch) {
        m.M *= m.batch;
        m.batch = 1;
    }
    m.aoff = tg_alloc(sizeof(int64_t) * (size_t)m.batch);
    m.boff = tg_alloc(sizeof(int64_t) * (size_t)m.batch);
    if (!m.aoff || !m.boff) {   /* the caller sees NULL offsets and emits nothing */
        free(m.aoff);
        free(m.boff);
        m.aoff = m.boff = NULL;
        return m;
    }
    tg_shape ob = n->shape, ab = a->shape, bb = b->shape;
    ob.ndim -= 2;
    ab.ndim -= 2;
    bb.ndim -= 2;
    for (int64_t i = 0; i < m.batch && m.batch > 1; i++) {   /* walk the batch dims from the last */
        int64_t rem = i, ast = m.M * m.K, bst = m.K * m.N;
        for (int k = ob.ndim - 1; k >= 0; k--) {
            int64_t ck = rem % ob.d[k];
            rem /= ob.d[k];
            int ka = k - (ob.ndim - ab.ndim), kb = k - (ob.ndim - bb.ndim);
            if (ka >= 0) {
                if (ab.d[ka] != 1) m.aoff[i] += ck * ast;
                ast *= ab.d[ka];
            }
            if (kb >= 0) {
                if (bb.d[kb] != 1) m.boff[i] += ck * bst;
                bst *= bb.d[kb];
            }
        }
    }
    return m;
}

/* ----- what generators ask of expressions ----- */

/* Does `node` read source k at its own flat index (so an element depends only on the same
 * element of that source)? */
bool cg_same_index(const tg_graph *g, int node, int k) {
    const tg_node *n = &g->nodes[node], *s = &g->nodes[n->src[k]];
    switch (n->op) {
    case OP_NEG: case OP_ABS: case OP_SQUARE: case OP_SQRT: case OP_RSQRT: case OP_EXP: case OP_LOG:
    case OP_RELU: case OP_TANH: case OP_SIGMOID: case OP_SIGN: case OP_STEP: case OP_SIN: case OP_COS:
    case OP_GELU: case OP_GELU_GRAD: case OP_IDENTITY: case OP_RESHAPE: case OP_DROPOUT:
        return true;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MIN: case OP_MAX: case OP_LESS: case OP_GREATER:
    case OP_EQUAL: case OP_WHERE: case OP_EXPAND: {
        if (s->shape.ndim != n->shape.ndim) return false;
        for (int i = 0; i < n->shape.ndim; i++)
            if (s->shape.d[i] != n->shape.d[i]) return false;
        return true;
    }
    default:
        return false;
    }
}

/* Does the kernel of `root` read `target` from memory (directly or through inlined nodes)? */
bool cg_expr_reads(const cg *c, int root, int node, int target) {
    if (node == target && node != root) return true;
    const tg_node *n = N(c, node);
    if (node != root && (c->mat[node] || cg_is_bound(n->op))) return false;
    for (int k = 0; k < n->nsrc; k++)
        if (cg_expr_reads(c, root, n->src[k], target)) return true;
    return false;
}

/* [R, L] when node id is a materialized sum over the last axis of its (inlined or materialized)
 * source, with the kept axes in front. */
bool cg_row_sum(const cg *c, int id, int64_t *R, int64_t *L) {
    const tg_node *n = N(c, id);
    if (n->op != OP_SUM || !c->mat[id] || plan_home(c->plan, id) != id) return false;
    const tg_node *s = N(c, n->src[0]);
    if (!c->mat[n->src[0]] && (s->op == OP_SUM || s->op == OP_MATMUL)) return false;   /* absorbed producers */
    for (int k = n->axis + 1; k < s->shape.ndim; k++)
        if (s->shape.d[k] != 1) return false;
    *L = s->shape.d[n->axis];
    *R = s->numel / *L;
    return *L >= 2 && s->numel < ((int64_t)1 << 31);
}

/* Does `node` (evaluated in `state`: 0 element (r, j) of an [R, L] value, 1 row r of an [R] value,
 * -1 elsewhere) read `target` (an [R, L] or [R] member of the row kernel) only within row r? */
bool cg_row_local(const cg *c, int root, int node, int target, int state, int64_t R, int64_t L) {
    if (node == target) return N(c, node)->numel == R * L ? state == 0 : state == 1;
    const tg_node *n = N(c, node);
    if (node != root && (c->mat[node] || cg_is_bound(n->op))) return true;
    for (int k = 0; k < n->nsrc; k++) {
        const tg_node *sk = N(c, n->src[k]);
        int st = -1;
        if (state >= 0 && cg_same_index(c->g, node, k)) {
            st = state;
        } else if (state == 0 && n->shape.d[n->shape.ndim - 1] == L && sk->shape.ndim == n->shape.ndim &&
                   sk->shape.d[sk->shape.ndim - 1] == 1 && n->op != OP_PERMUTE) {
            bool rows = true;   /* a broadcast along the last axis only: the source's flat index is r */
            for (int d = 0; d + 1 < n->shape.ndim; d++) rows &= sk->shape.d[d] == n->shape.d[d];
            if (rows && (n->op == OP_EXPAND || n->op == OP_ADD || n->op == OP_SUB || n->op == OP_MUL || n->op == OP_DIV ||
                         n->op == OP_MIN || n->op == OP_MAX || n->op == OP_LESS || n->op == OP_GREATER ||
                         n->op == OP_EQUAL || n->op == OP_WHERE))
                st = 1;
        }
        if (!cg_row_local(c, root, n->src[k], target, st, R, L)) return false;
    }
    return true;
}

/* ----- the engine's entry points ----- */

void cg_pointer(cg *c, strbuf *decl, int id, bool out, const char *restrict_kw) {
    const tg_node *n = N(c, id);
    int home = plan_home(c->plan, id);
    if (c->inplace && c->inplace[home] >= 0) home = c->inplace[home];
    const char *t = cg_ctype(n), *q = out ? "" : "const ";
    if (cg_is_bound(N(c, home)->op))
        sb_printf(decl, "    %s%s *%s P%d = (%s%s *)B[%d];\n", q, t, restrict_kw, id, q, t, home);
    else if (c->plan->offset[home] == PLAN_BOUND && !out && c->plan->shadow && c->plan->shadow[home] != PLAN_BOUND)
        sb_printf(decl, "    const unsigned short *%s P%d = (const unsigned short *)(A + %zu);\n", restrict_kw, id,
                  c->plan->shadow[home]);   /* a bf16 activation kept only as its bf16 copy: read by cg_value */
    else if (c->plan->offset[home] == PLAN_BOUND)   /* a value kept only as a rounded copy: a planner bug, not a crash */
        c->unsupported = id;
    else
        sb_printf(decl, "    %s%s *%s P%d = (%s%s *)(A + %zu);\n", q, t, restrict_kw, id, q, t, c->plan->offset[home]);
}

bool cg_init(cg *c, const tg_graph *g, const bool *materialized, const tg_plan *plan, strbuf *out) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->mat = materialized;
    c->plan = plan;
    c->out = out;
    c->unsupported = -1;
    c->io_root = -1;
    c->used = tg_alloc(sizeof(bool) * (size_t)(g->n + 1));
    c->cap_memo = 64;
    c->memo = tg_alloc(sizeof(memo_t) * (size_t)c->cap_memo);
    return graph_bf16_values(g, &c->bf16) && c->used && c->memo;
}

memo_t *cg_memo_slot(cg *c) {
    if (c->n_memo == c->cap_memo) {
        memo_t *grown = tg_realloc(c->memo, sizeof(memo_t) * (size_t)c->cap_memo * 2);
        if (!grown) return c->n_memo ? &c->memo[c->n_memo - 1] : NULL;   /* overwritten: output discarded */
        c->memo = grown;
        c->cap_memo *= 2;
    }
    return &c->memo[c->n_memo++];
}

void cg_release(cg *c) {
    free(c->body.s);
    free(c->memo);
    free(c->used);
    free(c->bf16);
    free(c->io);
}

void cg_begin(cg *c, int root) {
    c->root = root;
    c->n_memo = 0;
    c->body.len = 0;
    if (c->body.s) c->body.s[0] = 0;
    memset(c->used, 0, sizeof(bool) * (size_t)c->g->n);
}

const char *cg_root_value(cg *c, const char *flat) {
    char name[NAME];
    compute(c, c->root, ix_flat(flat), name);
    return cg_memo_add(c, c->root, "root", name);
}

const char *cg_value(cg *c, int node, const char *flat) { return val(c, node, ix_flat(flat)); }

/* Every helper, written once with a placeholder for the qualifier. */
static const char *const HELPERS[] = {
    "uint64_t tgk_mix(uint64_t z) {\n"
    "    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;\n"
    "    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;\n"
    "    return z ^ (z >> 31);\n}\n",
    "double tgk_uniform(uint64_t seed, uint64_t salt, uint64_t i) {\n"
    "    uint64_t b = tgk_mix(tgk_mix(seed * 0x9E3779B97F4A7C15ull + salt) + i * 0xD1B54A32D192ED03ull);\n"
    "    return ((double)(b >> 40) + 0.5) * (1.0 / 16777216.0);\n}\n",
    "double tgk_normal(uint64_t seed, uint64_t salt, uint64_t i) {\n"
    "    double u1 = tgk_uniform(seed, salt, 2 * i), u2 = tgk_uniform(seed, salt, 2 * i + 1);\n"
    "    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);\n}\n",
    "float tgk_bf16r(float x) {\n"   /* graph.h's precision_round at bf16 */
    "    union { float f; uint32_t u; } v;\n"
    "    v.f = x;\n"
    "    if ((v.u & 0x7f800000u) != 0x7f800000u) v.u = (v.u + 0x7fffu + ((v.u >> 16) & 1u)) & 0xffff0000u;\n"
    "    return v.f;\n}\n",
    "float tgk_bf16f(unsigned short h) {\n"
    "    union { float f; uint32_t u; } v;\n"
    "    v.u = (uint32_t)h << 16;\n"
    "    return v.f;\n}\n",
    /* Exact GELU through the normal density phi and Mills ratio R(t) = (1 - Phi(t)) / phi(t) at
     * t = |x|: Phi(x) = phi(x) R(t) below zero and 1 - phi(x) R(t) above, one exp2 and one
     * reciprocal (tgk_rcp: each backend's fastest) where erff and expf took over twice the
     * instructions, which made the GPU's bf16 GELU backward wait on arithmetic, not memory
     * (char_gpt's, alone: 79.7 -> 55.3 us). R(t) = tau Q(tau), tau = 1 / (1 + 0.3 t), Q fitted by
     * gelu_fit.py: within 2e-8 of R; in f32 as close to the exact GELU as erff's form. */
    "float tgk_mills(float t) {\n"
    "    const float tau = tgk_rcp(0.3f * t + 1.0f);\n"
    "    float q = 1.092740696e-02f;\n"
    "    q = q * tau - 1.163850255e-01f; q = q * tau + 4.497805909e-01f; q = q * tau - 8.233522760e-01f;\n"
    "    q = q * tau + 7.202503516e-01f; q = q * tau - 3.506944595e-01f; q = q * tau + 3.054383037e-01f;\n"
    "    q = q * tau + 1.783952242e-01f; q = q * tau + 2.795328280e-01f; q = q * tau + 2.993969248e-01f;\n"
    "    return tau * (q * tau + 3.000242672e-01f);\n}\n",
    "float tgk_normal_density(float x) { return 0.39894228040143268f * exp2f(-0.72134752044448170f * x * x); }\n",
    "float tgk_gelu(float x) {\n"
    "    const float p = tgk_normal_density(x) * tgk_mills(fabsf(x));\n"
    "    return x * (x > 0.0f ? 1.0f - p : p);\n}\n",
    "float tgk_gelu_grad(float x) {\n"   /* Phi(x) + x phi(x) */
    "    const float d = tgk_normal_density(x) * (tgk_mills(fabsf(x)) - fabsf(x));\n"
    "    return x > 0.0f ? 1.0f - d : d;\n}\n",
    "float tgk_gelu_tanh(float x) {\n"
    "    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));\n}\n",
    "float tgk_gelu_tanh_grad(float x) {\n"
    "    float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));\n"
    "    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);\n}\n",
};

void cg_prelude(strbuf *out, const char *qualifier) {
    for (size_t i = 0; i < sizeof HELPERS / sizeof HELPERS[0]; i++) sb_printf(out, "%s %s", qualifier, HELPERS[i]);
    sb_printf(out, "\n");
}

void cg_attention_args(const tg_graph *g, int id, int64_t *a) {
    const tg_node *n = &g->nodes[id];
    tg_shape q = g->nodes[n->src[0]].shape, k = g->nodes[n->src[1]].shape;
    tg_shape v = n->op == OP_ATTENTION_LSE ? k : g->nodes[n->src[2]].shape;
    const int rows = n->iarg[3] > 0 ? 3 : 2;   /* interleaved heads: [.., T, H, D] */
    a[1] = q.d[q.ndim - rows];
    a[3] = q.d[q.ndim - 1];
    a[0] = shape_numel(q) / (a[1] * a[3]);
    a[2] = k.d[k.ndim - rows];
    a[4] = v.d[v.ndim - 1];
    a[5] = n->iarg[0];
    memcpy(&a[6], &n->farg, sizeof(double));
    a[7] = n->iarg[3];
}

bool cg_attention_joins(const tg_graph *g, int prev, int next) {
    const tg_node *p = &g->nodes[prev], *n = &g->nodes[next];
    if (p->op == OP_ATTENTION) return n->op == OP_ATTENTION_LSE && next == prev + 1;
    if (p->op != OP_ATTENTION_BWD || n->op != OP_ATTENTION_BWD || next != prev + 1) return false;
    for (int k = 0; k < 6; k++)
        if (p->src[k] != n->src[k]) return false;
    return true;
}
