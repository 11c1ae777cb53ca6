/* C code generation for the compiled CPU backend: one C function per kernel with every shape
 * baked in as a constant, and an entry point that runs them in order. Pointwise and sum kernels
 * are loops around the shared expression engine (codegen.h); matrix products and the ops that
 * read whole rows or scatter (softmax, argmax, scatters, pooling) call library kernels
 * (kernels_cpu.c) on materialized buffers.
 *
 * Generated entry: void tg_entry(float *A, void **B, const double *H, void *const *R)
 *   A arena (plan offsets in floats), B bound leaves by node id, H hyper scalars, R library
 *   kernels by tgk id. */
#include "codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tg_node *N(const cg *c, int id) { return &c->g->nodes[id]; }

/* ----- kernels ----- */

static void pointer(cg *c, strbuf *decl, int id, bool out) { cg_pointer(c, decl, id, out, "restrict"); }

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
    cg_begin(c, id);
    cg_line(c, "P%d[i] = %s;", id, cg_root_value(c, "i"));
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
    cg_begin(c, id);
    char flat[NAME];
    cg_def(c, flat, "f", "int64_t", "(o * %lld + k) * %lld + j", (long long)len, (long long)inner);
    cg_line(c, "acc += %s;", cg_value(c, n->src[0], flat));
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
    snprintf(tail, sizeof tail, "      }\n      P%d[oj] = (%s)acc;\n    }\n", id, cg_ctype(n));
    end_kernel(c, head, tail);
}

/* A call of library kernel `fn` with constant arguments and buffer pointers. */
static void library_call(cg *c, int id, const char *fn, const int64_t *args, int nargs, const int *bufs, int nbufs) {
    cg_begin(c, id);
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

/* Batched matmul through the library kernel: a = {ta, tb, M, N, K, batch, A offsets[batch],
 * B offsets[batch]}. */
static void matmul_kernel(cg *c, int id) {
    const tg_node *n = N(c, id);
    cg_gemm m = cg_gemm_of(c->g, id);
    int64_t *args = tg_xmalloc(sizeof(int64_t) * (size_t)(6 + 2 * m.batch));
    int64_t head[6] = { m.ta, m.tb, m.M, m.N, m.K, m.batch };
    memcpy(args, head, sizeof head);
    memcpy(args + 6, m.aoff, sizeof(int64_t) * (size_t)m.batch);
    memcpy(args + 6 + m.batch, m.boff, sizeof(int64_t) * (size_t)m.batch);
    int bufs[3] = { n->src[0], n->src[1], id };
    library_call(c, id, "TGK_MATMUL", args, (int)(6 + 2 * m.batch), bufs, 3);
    free(args);
    free(m.aoff);
    free(m.boff);
}

static void special_kernel(cg *c, int id) {
    const tg_node *n = N(c, id), *s0 = N(c, n->src[0]);
    int two[2] = { n->src[0], id }, three[3] = { n->src[0], n->nsrc > 1 ? n->src[1] : id, id };
    int64_t a[12] = { 0 };
    switch (n->op) {
    case OP_MATMUL: matmul_kernel(c, id); return;
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
        cg_axis_split(n->shape, n->axis, &a[0], &a[1], &a[2]);
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
        cg_axis_split(s0->shape, n->axis, &a[0], &a[1], &a[2]);
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
        cg_axis_split(s0->shape, n->axis, &a[0], &a[1], &a[2]);
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

/* What every generated C file starts with: headers, the library-kernel table, the helpers. */
static const char PRELUDE[] =
    "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n"
    "typedef void (*tgk_fn)(const int64_t *a, void *const *p);\n"
    "enum { TGK_MATMUL, TGK_SOFTMAX, TGK_SOFTMAX_CAUSAL, TGK_ARGMAX, TGK_SCATTER_ROWS, TGK_SCATTER_ALONG,\n"
    "       TGK_COL2IM, TGK_MAXPOOL, TGK_MAXPOOL_BWD };\n";

char *codegen_c(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min) {
    strbuf out = { 0 };
    cg c;
    cg_init(&c, g, materialized, plan, &out);
    c.parallel_min = parallel_min;
    sb_printf(&out, "/* generated by tensorgrad: %d nodes */\n%s", g->n, PRELUDE);
    cg_prelude(&out, "static inline");
    strbuf entry = { 0 };
    sb_printf(&entry, "void tg_entry(float *A, void **B, const double *H, void *const *R) {\n");
    for (int i = 0; i < g->n; i++) {
        if (!materialized[i] || plan->alias[i] >= 0) continue;   /* inlined, or sharing a buffer */
        const tg_node *n = &g->nodes[i];
        if (fuse_pointwise(n->op)) pointwise_kernel(&c, i);
        else if (n->op == OP_SUM) sum_kernel(&c, i);
        else special_kernel(&c, i);
        sb_printf(&entry, "    k%d(A, B, H, R);\n", i);
    }
    sb_printf(&entry, "}\n");
    sb_printf(&out, "%s", entry.s);
    free(entry.s);
    cg_release(&c);
    return out.s;
}
