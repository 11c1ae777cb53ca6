/* C code generation for the compiled CPU backend: one C function per kernel with every shape
 * baked in as a constant, and an entry point that runs them in order. Pointwise and sum kernels
 * are loops around the shared expression engine (expr.h); matrix products and the ops that
 * read whole rows or scatter (softmax, argmax, scatters, pooling) call library kernels
 * (cpu_kernels.c) on materialized buffers.
 *
 * Beyond fuse.c's schedule (codegen_c_refine): products absorb a following bias add, sum over
 * their batch or col2im, and read im2col straight from the image; chains of sums become one
 * reduction; optimizer updates write parameters and state in place. Consecutive pointwise
 * kernels of one size share a loop (an Adam update is one pass over m, v and p).
 *
 * Generated entry: void tg_entry(float *A, void **B, const double *H, void *const *R)
 *   A arena (plan offsets in floats), B bound leaves by node id, H hyper scalars, R library
 *   kernels by tgk id.
 *
 * Standalone (codegen_c_standalone, for tg_export_c): the same kernels as one self-contained
 * translation unit: library kernels called by name (tgk_matmul, ... from the export's portable
 * kernels) rather than through R, the entry static, and every function's parameters marked used
 * so that the file compiles warning-free on its own. Nothing else differs. */
#include "compile/expr.h"
#include "cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const tg_node *N(const cg *c, int id) { return &c->g->nodes[id]; }

/* The generator's state: the expression engine plus the in-place write-back targets. */
typedef struct {
    cg c;                 /* first member: kernels pass &G->c to the engine */
    const int *inplace;   /* per node: the PARAM/STATE leaf its kernel writes in place, or -1; may be NULL */
    int roots[64];        /* the outputs of the kernel being generated */
    int same[64];         /* per root: an earlier root whose buffer (dead by then) it reuses, or -1 */
    int n_roots;
    strbuf slots;         /* the current kernel's buffer slots: arena offsets or bound-leaf indices */
    int n_slots;
    strbuf call;          /* the current kernel's call, for the entry */
    char **texts;         /* kernels emitted so far, in canonical form (see end_kernel) */
    char **names;
    int n_texts, cap_texts;
    bool standalone;      /* codegen_c_standalone: see the top of this file */
    const char *prefix;   /* of the kernel's name, before its first root: "k", or "kround" (round_kernel) */
    const char *pre;      /* a kernel's declarations before its OpenMP region (shared by its threads), or NULL */
} gen;

static int inplace_of(const gen *G, int id) { return G->inplace ? G->inplace[id] : -1; }

/* Standalone: kernel and entry parameters that a function may not read, marked used. */
#define STANDALONE_USED "    (void)A; (void)B; (void)H; (void)R;"

/* The node whose buffer holds node id's values: through the plan's aliases (reshapes and
 * identities sharing a buffer) and unmaterialized reshapes of absorbed producers. */
static int view_base(const cg *c, int id) {
    for (;;) {
        id = plan_home(c->plan, id);
        if (c->mat[id] || (N(c, id)->op != OP_RESHAPE && N(c, id)->op != OP_IDENTITY)) return id;
        id = N(c, id)->src[0];
    }
}

/* The same before planning: through fuse.c's aliases and unmaterialized reshapes. */
static int home_of(const tg_graph *g, const bool *mat, const int *alias, int id) {
    for (;;) {
        if (alias[id] >= 0) id = alias[id];
        if (mat[id] || (g->nodes[id].op != OP_RESHAPE && g->nodes[id].op != OP_IDENTITY)) return id;
        id = g->nodes[id].src[0];
    }
}

/* ----- scheduling refinements (CPU only) -----
 * On top of fuse.c's schedule:
 *  - absorbed producers: a sum read only by another sum (one multi-axis reduction), a batched
 *    product read only by a sum over its batch axis (one accumulating product), a product read
 *    only by col2im (col2im per image of a scratch product), a product read only by the add of
 *    a bias (the product kernel adds it) or by such an add that only a relu reads (the product
 *    kernel applies the relu too: MM_RELU), a max pooling's gradient read only by its product
 *    with the step of the pooling's input (the pooling's kernel multiplies by it), and an
 *    im2col read only by products (packed from the image, never materialized) are computed by
 *    their consumers' kernels: unmaterialized, so the plan keeps their sources alive until then;
 *  - in-place write-backs: an optimizer update whose kernel is the last reader of the parameter
 *    or state it replaces, reading it only at the element it writes, writes the persistent
 *    buffer directly; the generated entry returns before the first such kernel when the guard
 *    (loss + 0 * every gradient) is not finite, so a failed step still leaves parameters and
 *    optimizer state unchanged. */


enum { MM_REDUCE = 1, MM_IM2COL_B = 2, MM_COL2IM_C = 4, MM_BIAS_ROW = 8, MM_BIAS_COL = 16, MM_BF16 = 32, MM_RELU = 64 };   /* cpu_gemm.c k_matmul */

/* Is the ADD node `add` a product (operand k, through views, node mm) plus a bias that the
 * product kernel can add: the other operand, in memory (node *bias, through views: home(o)),
 * one value per row or per column of every product matrix? Returns MM_BIAS_ROW, MM_BIAS_COL or
 * 0. */
static int bias_of(const tg_graph *g, int add, int k, int mm, int bias_home, bool bias_in_memory) {
    const tg_node *a = &g->nodes[add], *m = &g->nodes[mm], *on = &g->nodes[a->src[1 - k]];
    if (a->dtype != TG_FLOAT32 || m->numel != a->numel || on->dtype != TG_FLOAT32 || !bias_in_memory ||
        g->nodes[bias_home].numel != on->numel)
        return 0;
    int r = a->shape.ndim, rm = m->shape.ndim;
    int64_t M = m->shape.d[rm - 2], N = m->shape.d[rm - 1];
    /* The dims of the add that make up a product row (N) and the rows (M). */
    int lo[2], hi[2], d = r - 1;
    int64_t want[2] = { N, M };
    for (int part = 0; part < 2; part++) {
        int64_t p = 1;
        hi[part] = d;
        while (p < want[part] && d >= 0) p *= a->shape.d[d--];
        if (p != want[part] || d == hi[part]) return 0;
        lo[part] = d + 1;
    }
    tg_shape os = on->shape;
    for (int part = 0; part < 2; part++) {   /* columns first: the bias varies only within the part */
        bool ok = true;
        for (int q = 0; q < r && ok; q++) {
            int oq = q - (r - os.ndim);
            int64_t od = oq >= 0 ? os.d[oq] : 1;
            bool inside = q >= lo[part] && q <= hi[part];
            ok = inside ? od == a->shape.d[q] : od == 1;
        }
        if (ok) return part == 0 ? MM_BIAS_COL : MM_BIAS_ROW;
    }
    return 0;
}

/* The product that the ADD node `add` adds a bias to, when the product kernel can add it: the
 * product (through views, each read only here) materialized, read only by the add, and the
 * bias in memory, one value per row or column (bias_of); else -1. */
static int product_of_bias_add(const tg_graph *g, const bool *mat, const int *alias, const int *uses, const bool *kept,
                               int add) {
    const tg_node *nd = &g->nodes[add];
    for (int k = 0; k < 2; k++) {
        int m = nd->src[k];
        bool single = true;   /* each view on the way read only here */
        while ((g->nodes[m].op == OP_RESHAPE || g->nodes[m].op == OP_IDENTITY) && (alias[m] >= 0 || !mat[m])) {
            single &= uses[m] == 1 && !kept[m];
            m = g->nodes[m].src[0];
        }
        int o = home_of(g, mat, alias, nd->src[1 - k]);
        bool in_memory = mat[o] || cg_is_bound(g->nodes[o].op);
        if (single && g->nodes[m].op == OP_MATMUL && mat[m] && !kept[m] && uses[m] == 1 && o != m &&
            bias_of(g, add, k, m, o, in_memory))
            return m;
    }
    return -1;
}

/* Unmaterialize node i, absorbed by its consumer; the views (aliases) on the way to it too. */
static void absorb(const tg_graph *g, bool *mat, int *alias, int i) {
    mat[i] = false;
    alias[i] = -1;
    for (int u = i + 1; u < g->n; u++)
        if (alias[u] == i || (g->nodes[u].op == OP_RESHAPE && g->nodes[u].src[0] == i && !mat[u])) {
            mat[u] = false;
            alias[u] = -1;
        }
}

void codegen_c_refine(const tg_graph *g, const int *keep, int n_keep, bool *mat, int *alias, int *inplace) {
    int n = g->n;
    int *uses = tg_alloc(sizeof(int) * (size_t)(n + 1)), *user = tg_alloc(sizeof(int) * (size_t)(n + 1));
    bool *kept = tg_alloc(sizeof(bool) * (size_t)(n + 1));
    for (int i = 0; i < n; i++) inplace[i] = -1;
    if (!uses || !user || !kept) {   /* the schedule stays unrefined; the caller sees the failure */
        free(uses);
        free(user);
        free(kept);
        return;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i].nsrc; k++) {
            uses[g->nodes[i].src[k]]++;
            user[g->nodes[i].src[k]] = i;
        }
    for (int k = 0; k < n_keep; k++)
        if (keep[k] >= 0) kept[keep[k]] = true;
    for (int k = 0; k < g->n_assigns; k++) kept[g->assigns[k].src] = true;
    if (g->output >= 0 && g->output < n) kept[g->output] = true;

    /* Sums read only by a sum. */
    for (int i = 0; i < n; i++) {
        if (g->nodes[i].op != OP_SUM || !mat[i] || kept[i] || uses[i] != 1) continue;
        int u = user[i];
        if (g->nodes[u].op == OP_SUM && mat[u] && alias[u] < 0 && g->nodes[u].src[0] == i) absorb(g, mat, alias, i);
    }
    /* Batched products read only by a sum over their one batch axis. */
    for (int i = 0; i < n; i++) {
        const tg_node *nd = &g->nodes[i];
        if (nd->op != OP_MATMUL || !mat[i] || kept[i] || uses[i] != 1 || nd->shape.ndim != 3) continue;
        int u = user[i];
        if (g->nodes[u].op == OP_SUM && mat[u] && g->nodes[u].axis == 0 && g->nodes[u].src[0] == i) absorb(g, mat, alias, i);
    }
    /* Products read only by col2im (a convolution's input gradient). */
    for (int i = 0; i < n; i++) {
        const tg_node *nd = &g->nodes[i];
        if (nd->op != OP_COL2IM || !mat[i]) continue;
        int m = nd->src[0];
        if (g->nodes[m].op == OP_MATMUL && mat[m] && !kept[m] && uses[m] == 1 && g->nodes[m].shape.ndim == 3)
            absorb(g, mat, alias, m);
    }
    /* Products read only by the add of a bias; or by the add of a bias that only a relu reads
     * (computed inside the relu's kernel: the product kernel applies the relu too). Not where the
     * sum is a bf16 activation, rounded with its bias rounded (graph_product_addend): the add's
     * kernel computes it. */
    bool *bf16 = NULL;
    bool rounding_known = graph_bf16_values(g, &bf16);
    for (int i = 0; rounding_known && i < n; i++) {
        const tg_node *nd = &g->nodes[i];
        int m = -1, add = nd->op == OP_RELU ? nd->src[0] : i;
        if (mat[i] && alias[i] < 0 && nd->op == OP_ADD) {
            m = product_of_bias_add(g, mat, alias, uses, kept, i);
        } else if (mat[i] && alias[i] < 0 && nd->op == OP_RELU && nd->dtype == TG_FLOAT32) {
            if (g->nodes[add].op == OP_ADD && !mat[add] && uses[add] == 1 && !kept[add])
                m = product_of_bias_add(g, mat, alias, uses, kept, add);
        }
        if (m >= 0 && !(bf16 && (bf16[m] || bf16[add]))) absorb(g, mat, alias, m);
    }
    free(bf16);
    /* A max pooling's gradient read only by its product with the step of the pooling's input
     * (the gradient of max_pool2d(relu(x)), relu's taken at its output): one library call
     * writes the product (masked_pool_grad). */
    for (int i = 0; i < n; i++) {
        const tg_node *nd = &g->nodes[i];
        if (nd->op != OP_MUL || !mat[i] || alias[i] >= 0 || nd->dtype != TG_FLOAT32) continue;
        for (int k = 0; k < 2; k++) {
            int b = nd->src[k], st = nd->src[1 - k];
            const tg_node *nb = &g->nodes[b], *ns = &g->nodes[st];
            if (nb->op == OP_MAXPOOL2D_BWD && mat[b] && alias[b] < 0 && !kept[b] && uses[b] == 1 && nb->numel == nd->numel &&
                nb->dtype == TG_FLOAT32 && ns->op == OP_STEP && !mat[st] && ns->numel == nd->numel &&
                home_of(g, mat, alias, ns->src[0]) == home_of(g, mat, alias, nb->src[0])) {
                absorb(g, mat, alias, b);
                break;
            }
        }
    }
    /* im2col read only as the second operand of products. */
    for (int i = 0; i < n; i++) {
        const tg_node *nd = &g->nodes[i];
        if (nd->op != OP_IM2COL || !mat[i] || kept[i] || uses[i] == 0) continue;
        int x = home_of(g, mat, alias, nd->src[0]);
        bool ok = (mat[x] || cg_is_bound(g->nodes[x].op)) && g->nodes[x].dtype == TG_FLOAT32;
        for (int u = i + 1; ok && u < n; u++) {
            const tg_node *nu = &g->nodes[u];
            for (int k = 0; k < nu->nsrc; k++)
                if (nu->src[k] == i && !(nu->op == OP_MATMUL && k == 1 && nu->src[0] != i)) ok = false;
        }
        if (ok) absorb(g, mat, alias, i);
    }

    /* In-place write-backs after the guard, not where a product kernel computes the add. */
    int guard = g->guard;
    bool guard_ok = g->n_assigns > 0 && guard >= 0 && guard < n && mat[guard] && alias[guard] < 0 &&
                    g->nodes[guard].numel == 1 && g->nodes[guard].dtype == TG_FLOAT32;
    if (guard_ok && plan_inplace(g, keep, n_keep, mat, alias, guard, inplace)) {
        for (int src = 0; src < n; src++) {
            const tg_node *ns = &g->nodes[src];
            for (int q = 0; inplace[src] >= 0 && q < ns->nsrc && ns->op == OP_ADD; q++) {
                int m = home_of(g, mat, alias, ns->src[q]);
                if (!mat[m] && g->nodes[m].op == OP_MATMUL) inplace[src] = -1;
            }
        }
    }
    free(uses);
    free(user);
    free(kept);
}

/* ----- kernels ----- */

/* Declare P<id>: the memory of the node that holds id's values (view_base), or the leaf that
 * node's kernel writes in place; the address comes from the kernel's slot table q (an arena
 * offset or a bound-leaf index), so that kernels alike but for their buffers share one function. */
static void pointer(gen *G, strbuf *decl, int id, bool out) {
    cg *c = &G->c;
    int home = view_base(c, id);
    const tg_node *n = N(c, id);
    const char *t = cg_ctype(n), *q = out ? "" : "const ";
    int dst = inplace_of(G, home), k = G->n_slots++;
    if (dst >= 0 || cg_is_bound(N(c, home)->op)) {
        sb_printf(decl, "    %s%s *restrict P%d = (%s%s *)B[q[%d]];\n", q, t, id, q, t, k);
        sb_printf(&G->slots, "%s%d", k ? ", " : "", dst >= 0 ? dst : home);
    } else {
        sb_printf(decl, "    %s%s *restrict P%d = (%s%s *)(A + q[%d]);\n", q, t, id, q, t, k);
        sb_printf(&G->slots, "%s%zu", k ? ", " : "", c->plan->offset[home]);
    }
}

/* Node names P<id> renumbered by first appearance (P_0, P_1, ...): the text of a kernel up to
 * which nodes it touches. */
static char *canonical(const char *text) {
    strbuf out = { 0 };
    int *ids = NULL, n_ids = 0, cap = 0;
    sb_printf(&out, "%s", "");
    for (const char *p = text; *p;) {
        bool start = p == text || !(p[-1] == '_' || (p[-1] >= '0' && p[-1] <= '9') || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                    (p[-1] >= 'A' && p[-1] <= 'Z'));
        if (start && p[0] == 'P' && p[1] >= '0' && p[1] <= '9') {
            char *end;
            long id = strtol(p + 1, &end, 10);
            int k = 0;
            while (k < n_ids && ids[k] != id) k++;
            if (k == n_ids && n_ids == cap) {
                int *grown = tg_realloc(ids, sizeof(int) * (size_t)(cap ? 2 * cap : 64));
                if (!grown) break;   /* out of memory: the output is discarded (alloc_failures) */
                ids = grown;
                cap = cap ? 2 * cap : 64;
            }
            if (k == n_ids) ids[n_ids++] = (int)id;
            sb_printf(&out, "P_%d", k);
            p = end;
        } else {
            const char *q = p + 1;
            while (*q && *q != 'P') q++;
            sb_printf(&out, "%.*s", (int)(q - p), p);
            p = q;
        }
    }
    free(ids);
    return sb_take(&out);
}

/* Room for one more kernel text and name. */
static bool grow_texts(gen *G) {
    if (G->n_texts < G->cap_texts) return true;
    int cap = G->cap_texts ? 2 * G->cap_texts : 64;
    char **texts = tg_realloc(G->texts, sizeof(char *) * (size_t)cap);
    if (texts) G->texts = texts;
    char **names = texts ? tg_realloc(G->names, sizeof(char *) * (size_t)cap) : NULL;
    if (names) G->names = names;
    if (!names) return false;
    G->cap_texts = cap;
    return true;
}

/* The kernel: pointer declarations (its outputs, then every buffer its body read; a leaf that an
 * output replaces in place is read through that output's pointer, by a macro, so that the
 * vectorizer sees one pointer), then head, body and tail. A parallel kernel declares its pointers
 * inside the OpenMP region, where `restrict` survives outlining (the compiler then needs no
 * run-time alias checks), and shares its loop (the first line of head) among the threads. */
static void end_kernel(gen *G, bool parallel, const char *head, const char *tail) {
    cg *c = &G->c;
    strbuf decl = { 0 }, undef = { 0 }, text = { 0 };
    for (int r = 0; r < G->n_roots; r++) {
        if (G->same[r] >= 0) {   /* one pointer for one buffer, so that the compiler orders the accesses */
            sb_printf(&decl, "#define P%d P%d\n", G->roots[r], G->same[r]);
            sb_printf(&undef, "#undef P%d\n", G->roots[r]);
        } else {
            pointer(G, &decl, G->roots[r], true);
        }
    }
    for (int i = 0; i < c->g->n; i++) {
        if (!c->used[i]) continue;
        bool is_root = false;   /* a row kernel reads what it wrote for the same row */
        for (int r = 0; r < G->n_roots; r++) is_root |= G->roots[r] == i;
        if (is_root) continue;
        int writer = -1;
        for (int r = 0; r < G->n_roots; r++)
            if (inplace_of(G, G->roots[r]) == i) writer = G->roots[r];
        if (writer >= 0) {
            sb_printf(&decl, "#define P%d P%d\n", i, writer);
            sb_printf(&undef, "#undef P%d\n", i);
        } else {
            pointer(G, &decl, i, false);
        }
    }
    if (G->pre) sb_printf(&text, "%s", G->pre);
    if (parallel)   /* each thread in the kernels' floating-point mode (tg_fp_flush: see the prelude) */
        sb_printf(&text, "  #pragma omp parallel\n  {\n    const unsigned fp = tg_fp_flush();\n%s    #pragma omp for schedule(static) nowait\n",
                  decl.s ? decl.s : "");
    else sb_printf(&text, "%s", decl.s ? decl.s : "");
    sb_printf(&text, "%s%s%s%s%s", head ? head : "", sb_str(&c->body), tail ? tail : "", parallel ? "    tg_fp_restore(fp);\n  }\n" : "",
              sb_str(&undef));
    /* Kernels alike but for their buffers (a model's repeated layers, the optimizer's updates of
     * parameters of one shape) share one function: less code to compile. */
    char *canon = canonical(sb_str(&text)), buf[32];
    const char *name = NULL;
    for (int k = 0; canon && k < G->n_texts && !name; k++)
        if (strcmp(G->texts[k], canon) == 0) name = G->names[k];
    snprintf(buf, sizeof buf, "%s%d", G->prefix, G->roots[0]);
    if (!canon || name) {   /* out of memory (the output is discarded: see alloc_failures), or a twin */
        free(canon);
    } else if (grow_texts(G)) {
        G->texts[G->n_texts] = canon;
        G->names[G->n_texts] = tg_strdup(buf);
        name = G->names[G->n_texts++];
        sb_printf(c->out, "static void %s(float *A, void **B, const double *H, void *const *R, const int64_t *q) {\n%s%s}\n\n",
                  buf, G->standalone ? STANDALONE_USED " (void)q;\n" : "", canon);
    } else {
        free(canon);
    }
    G->call.len = 0;
    if (G->call.s) G->call.s[0] = 0;
    sb_printf(&G->call, "    { static const int64_t q[] = { %s }; %s(A, B, H, R, q); }\n", G->slots.s ? G->slots.s : "0",
              name ? name : buf);
    free(decl.s);
    free(undef.s);
    free(text.s);
}

static void begin(gen *G, int root) {
    cg_begin(&G->c, root);
    G->c.ntmp = 0;   /* temporaries numbered per kernel: alike kernels read alike */
    G->roots[0] = root;
    G->n_roots = 1;
    for (int r = 0; r < 64; r++) G->same[r] = -1;
    G->slots.len = 0;
    if (G->slots.s) G->slots.s[0] = 0;
    G->n_slots = 0;
    G->prefix = "k";
    G->pre = NULL;
}

/* Shapes are constants, so whether a loop is worth threads is decided here: small kernels get
 * no OpenMP region at all (each region is an outlined function the compiler must build). */
static bool omp(const cg *c, int64_t work) { return work >= c->parallel_min; }

/* Do two nodes' buffers (as the kernel addresses them) overlap? */
static bool overlap(gen *G, int a, int b) {
    cg *c = &G->c;
    a = view_base(c, a);
    b = view_base(c, b);
    if (a == b) return true;
    int da = inplace_of(G, a), db = inplace_of(G, b);
    int ka = da >= 0 ? da : cg_is_bound(N(c, a)->op) ? a : -1, kb = db >= 0 ? db : cg_is_bound(N(c, b)->op) ? b : -1;
    if (ka >= 0 || kb >= 0) return ka == kb;
    size_t oa = c->plan->offset[a], ob = c->plan->offset[b];
    return oa < ob + (size_t)N(c, b)->numel && ob < oa + (size_t)N(c, a)->numel;
}

/* The product an ADD node absorbed (refinement: the product adds the bias), or -1. */
static int bias_product(const cg *c, int id) {
    const tg_node *n = N(c, id);
    if (!c->mat[id]) return -1;
    if (n->op == OP_RELU && !c->mat[n->src[0]] && N(c, n->src[0])->op == OP_ADD) n = N(c, n->src[0]);   /* MM_RELU */
    if (n->op != OP_ADD) return -1;
    for (int k = 0; k < 2; k++) {
        int m = view_base(c, n->src[k]);
        if (!c->mat[m] && N(c, m)->op == OP_MATMUL) return m;
    }
    return -1;
}


/* The max pooling gradient a MUL node absorbed (refinement: the pooling's kernel multiplies by
 * the step of its input), or -1. */
static int masked_pool_grad(const cg *c, int id) {
    const tg_node *n = N(c, id);
    if (n->op != OP_MUL || !c->mat[id]) return -1;
    for (int k = 0; k < 2; k++)
        if (!c->mat[n->src[k]] && N(c, n->src[k])->op == OP_MAXPOOL2D_BWD) return n->src[k];
    return -1;
}

/* Is node id computed by a library call that absorbed its producer, rather than by a loop? */
static bool library_root(const cg *c, int id) { return bias_product(c, id) >= 0 || masked_pool_grad(c, id) >= 0; }

/* Can the roots so far run as one loop? In-place roots only with in-place roots, no root read
 * from memory (a later root reads an earlier one only at its own element, from the memo), no
 * buffer read overlapping a buffer written, no two outputs overlapping, and a leaf replaced in
 * place read only by the root replacing it. */
static bool group_ok(gen *G) {
    cg *c = &G->c;
    /* In-place roots run only after a finite guard (the entry returns before them otherwise):
     * nothing else may share their loop, so that a failed step still computes the gradients. */
    int n_inplace = 0;
    for (int k = 0; k < G->n_roots; k++) n_inplace += inplace_of(G, G->roots[k]) >= 0;
    if (n_inplace != 0 && n_inplace != G->n_roots) return false;
    for (int k = 0; k < G->n_roots; k++)
        for (int j = 0; j < k; j++)
            if (overlap(G, G->roots[k], G->roots[j])) return false;
    for (int i = 0; i < c->g->n; i++) {
        if (!c->used[i]) continue;
        for (int k = 0; k < G->n_roots; k++) {
            int w = G->roots[k];
            if (i == w) return false;
            if (inplace_of(G, w) == i) {
                for (int j = 0; j < G->n_roots; j++)
                    if (j != k && cg_expr_reads(c, G->roots[j], G->roots[j], i)) return false;
            } else if (overlap(G, i, w)) {
                return false;
            }
        }
    }
    return true;
}

static bool group_fits(void *G) { return group_ok(G); }

/* The body of a pointwise kernel: `first`, then each of next[] in order while it can join
 * (returned: how many joined). */
static int pointwise_roots(gen *G, int first, const int *next, int n_next, const char *it) {
    cg *c = &G->c;
    const tg_node *n = N(c, first);
    begin(G, first);
    cg_root_line(c, first);
    int joined = 0;
    for (int q = 0; q < n_next && G->n_roots < 64; q++) {
        int r = next[q];
        const tg_node *nr = N(c, r);
        if (!fuse_pointwise(nr->op) || nr->numel != n->numel || strcmp(cg_index_type(c, r, nr->numel), it) != 0 ||
            library_root(c, r))
            break;
        G->roots[G->n_roots++] = r;
        if (!cg_try_root(c, r, group_fits, G)) {
            G->n_roots--;
            break;
        }
        joined++;
    }
    return joined;
}

/* One loop over the elements of several pointwise nodes of equal size (pointwise_roots). Where
 * they read a value at other coordinates than their own (a permute, a broadcast), the loop is
 * nested over rows of the output's last axis (cg.row), so that those reads vectorize, or over
 * rows of a part of it (of at least 16) that a read runs along (cg.row_part; merging heads: a
 * head's width, 32, in an output of 128); where none does, the flat loop, which
 * vectorizes as well with one loop fewer (cifar_cnn's element-wise kernels, nested over rows of
 * 32, took 5-15% longer). */
static int pointwise_kernel(gen *G, int first, const int *next, int n_next) {
    cg *c = &G->c;
    const tg_node *n = N(c, first);
    const char *it = cg_index_type(c, first, n->numel);
    int64_t row = n->shape.ndim >= 2 ? n->shape.d[n->shape.ndim - 1] : 1;
    int joined = 0;
    c->row_part = 0;
    c->row_used = false;
    for (c->row = row; c->row >= 16 && n->numel / c->row >= 2; c->row = c->row_part) {   /* the row, then a part a read runs along */
        c->row_used = false;
        c->row_part = 0;
        joined = pointwise_roots(G, first, next, n_next, it);
        if (c->row_used) break;
    }
    if (!c->row_used) {
        c->row = 0;
        joined = pointwise_roots(G, first, next, n_next, it);
    }
    c->root = first;
    char head[256];
    if (c->row)   /* (i in 64 bits: an unsigned 32-bit o * row + u may wrap, which keeps GCC from vectorizing) */
        snprintf(head, sizeof head, "    for (%s o = 0; o < %lld; o++)\n    for (int64_t u = 0; u < %lld; u++) {\n"
                                    "        const int64_t i = (int64_t)o * %lld + u;\n",
                 it, (long long)(n->numel / c->row), (long long)c->row, (long long)c->row);
    else
        snprintf(head, sizeof head, "    for (%s i = 0; i < %lld; i++) {\n", it, (long long)n->numel);
    c->row = 0;
    end_kernel(G, omp(c, n->numel * G->n_roots), head, "    }\n");
    return joined;
}

/* A product's or attention's output rounded in place to bf16 (a bf16 activation:
 * graph_bf16_values); the library kernel itself works in f32. */
static void round_kernel(gen *G, int id) {
    cg *c = &G->c;
    begin(G, id);
    G->prefix = "kround";   /* the library kernel's own call is k<id> */
    cg_line(c, "P%d[i] = tgk_bf16r(P%d[i]);", id, id);
    char head[128];
    snprintf(head, sizeof head, "    for (int64_t i = 0; i < %lld; i++) {\n", (long long)N(c, id)->numel);
    end_kernel(G, omp(c, N(c, id)->numel), head, "    }\n");
}

/* The product behind a reduction's source, when it is an absorbed batched product. */
static void matmul_call(gen *G, int id, int mm, int flags);

/* A sum over the outer and inner axes of its source [R, K, L] (merged groups: reduced, kept,
 * reduced; strides st), such as a convolution's bias gradient over [batch, channels, pixels]:
 * read in memory order, a block of up to 8 kept outputs per iteration of the shared loop (K / 4
 * when smaller, so that a few channels still make a few blocks), each output's L values per r
 * summed in their own vectorized loop and added to its accumulator. One output at a time
 * instead (sum_kernel's order) read a piece of L values, then jumped a whole r ahead: the
 * hardware prefetcher, which stops at page boundaries, restarted at every piece, and the sum
 * took two to three times as long. Accumulation in double. */
static void batch_sum_kernel(gen *G, int id, int x, const int64_t *gsize, const int64_t *st) {
    cg *c = &G->c;
    const tg_node *n = N(c, id), *s = N(c, x);
    int64_t R = gsize[0], K = gsize[1], L = gsize[2], ob = K / 4 < 1 ? 1 : K / 4 > 8 ? 8 : K / 4, nb = (K + ob - 1) / ob;
    const char *it = s->numel < ((int64_t)1 << 31) && !cg_has_pad(c, x, -1) && !c->mat[x] ? "uint32_t" : "int64_t";
    begin(G, id);
    strbuf head = { 0 }, tail = { 0 };
    sb_printf(&head, "    for (int64_t ob = 0; ob < %lld; ob++) {\n", (long long)nb);
    sb_printf(&head, "      const int64_t o0 = ob * %lld, on = %lld - o0 < %lld ? %lld - o0 : %lld;\n", (long long)ob,
              (long long)K, (long long)ob, (long long)K, (long long)ob);
    sb_printf(&head, "      double acc[%lld];\n      for (int64_t j = 0; j < %lld; j++) acc[j] = 0;\n", (long long)ob, (long long)ob);
    sb_printf(&head, "      for (int64_t r = 0; r < %lld; r++)\n      for (int64_t j = 0; j < on; j++) {\n", (long long)R);
    sb_printf(&head, "      double a = 0;\n      #pragma omp simd reduction(+:a)\n");
    sb_printf(&head, "      for (int64_t l = 0; l < %lld; l++) {\n", (long long)L);
    cg_line(c, "const %s xf = (%s)(r * %lld + (o0 + j) * %lld + l * %lld);", it, it, (long long)st[0], (long long)st[1],
            (long long)st[2]);
    cg_line(c, "a += (double)%s;", cg_value(c, x, "xf"));
    sb_printf(&tail, "      }\n      acc[j] += a;\n      }\n");
    sb_printf(&tail, "      for (int64_t j = 0; j < on; j++) P%d[o0 + j] = (%s)acc[j];\n    }\n", id, cg_ctype(n));
    end_kernel(G, nb > 1 && omp(c, s->numel), head.s, tail.s);
    free(head.s);
    free(tail.s);
}

/* Sum over one or more axes of an inlined producer (a chain of sums the refinement left to this
 * kernel). The source's axes, merged where adjacent ones are alike, alternate between kept and
 * reduced groups; the loops follow memory order. When the innermost group is reduced, each
 * output is one accumulator over a vectorized inner loop; when it is kept, a row of
 * accumulators is updated by a vectorized loop along it. Accumulation in double. */
#define SUM_CHUNKS 16   /* sum_kernel's parts of a sum of everything */
#define TEXT_OF(x) TEXT_OF_(x)
#define TEXT_OF_(x) #x

static void sum_kernel(gen *G, int id) {
    cg *c = &G->c;
    const tg_node *n = N(c, id);
    bool red[TG_MAX_DIMS] = { false };
    red[n->axis] = true;
    int x = n->src[0];
    while (!c->mat[x] && N(c, x)->op == OP_SUM) {
        red[N(c, x)->axis] = true;
        x = N(c, x)->src[0];
    }
    if (!c->mat[x] && N(c, x)->op == OP_MATMUL) {   /* an absorbed product: one accumulating call */
        matmul_call(G, id, x, MM_REDUCE);
        return;
    }
    const tg_node *s = N(c, x);
    /* Merged groups: size, stride in the source, reduced. */
    int ng = 0;
    int64_t gsize[TG_MAX_DIMS], gstride[TG_MAX_DIMS];
    bool gred[TG_MAX_DIMS];
    for (int k = 0; k < s->shape.ndim; k++) {
        if (s->shape.d[k] == 1) continue;
        int64_t st = 1;
        for (int j = k + 1; j < s->shape.ndim; j++) st *= s->shape.d[j];
        if (ng > 0 && gred[ng - 1] == red[k]) {
            gsize[ng - 1] *= s->shape.d[k];
            gstride[ng - 1] = st;
        } else {
            gsize[ng] = s->shape.d[k];
            gstride[ng] = st;
            gred[ng++] = red[k];
        }
    }
    if (ng == 3 && gred[0] && !gred[1] && gred[2] && gsize[1] <= 4096) {
        batch_sum_kernel(G, id, x, gsize, gstride);
        return;
    }
    begin(G, id);
    const char *ct = cg_ctype(n);
    bool inner_kept = ng > 0 && !gred[ng - 1];
    /* A 32-bit index keeps an inlined producer's index arithmetic cheap; a source in memory has
     * none, and when the innermost group is reduced, through a 32-bit index GCC no longer sees
     * that the vectorized loop reads consecutive floats (it loads them one lane at a time: a
     * bias gradient's sum over a convolution's output took twice as long). */
    int64_t out = n->numel, J = inner_kept ? gsize[ng - 1] : 1, JB = J > 512 ? 512 : J;
    int64_t nb = (J + JB - 1) / JB, rows = out / J;
    int nkept = inner_kept ? ng - 1 : ng;   /* groups handled by the outer loop (kept ones) */
    strbuf head = { 0 }, tail = { 0 };
    int64_t total = s->numel;
    /* A sum of everything (a loss, the step's finiteness guard over a gradient) in SUM_CHUNKS parts
     * of its outermost group, each thread's parts summed in parallel, then the parts in order: the
     * same result for any number of threads. Its parts start anywhere: through a 32-bit index
     * GCC would not see that they read consecutive floats. */
    const bool chunked = out == 1 && ng >= 1 && gsize[0] >= SUM_CHUNKS && omp(c, s->numel);
    const char *it = !chunked && s->numel < ((int64_t)1 << 31) && !cg_has_pad(c, x, -1) && (inner_kept || !c->mat[x]) ? "uint32_t"
                                                                                                            : "int64_t";
    bool parallel = (rows * nb > 1 || chunked) && omp(c, total);
    if (chunked) G->pre = "  double part[" TEXT_OF(SUM_CHUNKS) "];\n";
    sb_printf(&head, "    for (int64_t ob = 0; ob < %lld; ob++) {\n", (long long)(chunked ? SUM_CHUNKS : rows * nb));
    if (chunked)
        sb_printf(&head, "      const int64_t o = 0, lo = %lld * ob / %d, hi = %lld * (ob + 1) / %d;\n", (long long)gsize[0],
                  SUM_CHUNKS, (long long)gsize[0], SUM_CHUNKS);
    else
        sb_printf(&head, "      const int64_t o = ob / %lld, jb = (ob %% %lld) * %lld;\n", (long long)nb, (long long)nb,
                  (long long)JB);
    /* Kept coordinates of the outer loop: o is their row-major index. */
    sb_printf(&head, "      int64_t base = 0;\n");
    {
        int64_t after = 1;
        for (int k = nkept - 1; k >= 0; k--) {
            if (gred[k]) continue;
            sb_printf(&head, "      base += ((o / %lld) %% %lld) * %lld;\n", (long long)after, (long long)gsize[k],
                      (long long)gstride[k]);
            after *= gsize[k];
        }
    }
    if (inner_kept) {
        sb_printf(&head, "      double acc[%lld];\n      for (int64_t j = 0; j < %lld; j++) acc[j] = 0;\n", (long long)JB,
                  (long long)JB);
        sb_printf(&head, "      const int64_t jn = %lld - jb < %lld ? %lld - jb : %lld;\n", (long long)J, (long long)JB,
                  (long long)J, (long long)JB);
    } else {
        sb_printf(&head, "      double acc = 0;\n");
    }
    /* Reduced groups: nested loops, the innermost reduced group last (vectorized when it is the
     * innermost group of all). */
    int last_red = -1;
    for (int k = 0; k < ng; k++)
        if (gred[k]) last_red = k;
    int depth = 0;
    char off[512] = "base";
    for (int k = 0; k < ng; k++) {
        if (!gred[k]) continue;
        bool vec = !inner_kept && k == last_red;
        if (vec) sb_printf(&head, "      #pragma omp simd reduction(+:acc)\n");
        if (chunked && k == 0) sb_printf(&head, "      for (int64_t r0 = lo; r0 < hi; r0++) {\n");
        else sb_printf(&head, "      for (int64_t r%d = 0; r%d < %lld; r%d++) {\n", k, k, (long long)gsize[k], k);
        size_t len = strlen(off);
        snprintf(off + len, sizeof off - len, " + r%d * %lld", k, (long long)gstride[k]);
        depth++;
    }
    if (inner_kept) {
        sb_printf(&head, "      #pragma omp simd\n      for (int64_t j = 0; j < jn; j++) {\n");
        size_t len = strlen(off);
        snprintf(off + len, sizeof off - len, " + jb + j");
        depth++;
    }
    cg_line(c, "const %s xf = (%s)(%s);", it, it, off);
    const char *v = cg_value(c, x, "xf");
    if (inner_kept) cg_line(c, "acc[j] += (double)%s;", v);
    else cg_line(c, "acc += (double)%s;", v);
    for (int k = 0; k < depth; k++) sb_printf(&tail, "      }\n");
    if (inner_kept)
        sb_printf(&tail, "      for (int64_t j = 0; j < jn; j++) P%d[o * %lld + jb + j] = (%s)acc[j];\n", id, (long long)J, ct);
    else if (chunked)
        sb_printf(&tail, "      part[ob] = acc;\n");
    else
        sb_printf(&tail, "      P%d[o] = (%s)acc;\n", id, ct);
    sb_printf(&tail, "    }\n");
    if (chunked)
        sb_printf(&tail, "    #pragma omp barrier\n    #pragma omp single nowait\n"
                         "    {\n      double acc = 0;\n      for (int k = 0; k < %d; k++) acc += part[k];\n      P%d[0] = (%s)acc;\n    }\n",
                  SUM_CHUNKS, id, ct);
    end_kernel(G, parallel, head.s, tail.s);
    free(head.s);
    free(tail.s);
}

/* ----- row kernels -----
 * A sum along the last axis of an [R, L] source, then the kernels after it that work row by row
 * (elementwise over [R, L], or over the R row values), as one loop over rows: each row is read
 * from memory once and its later passes hit the cache. Layer norm (mean, centre, variance,
 * scale) and the backward passes of layer norm and softmax are such chains. */

enum { ROW_ELEMS, ROW_VALUES, ROW_SUM };


/* The row role of kernel id in an [R, L] row kernel, or -1. */
static int row_role(gen *G, int id, int64_t R, int64_t L) {
    const cg *c = &G->c;
    const tg_node *n = N(c, id);
    int64_t r, l;
    if (cg_row_sum(c, id, &r, &l)) return r == R && l == L ? ROW_SUM : -1;
    if (!fuse_pointwise(n->op) || inplace_of(G, id) >= 0 || library_root(c, id) || cg_has_pad(c, id, id)) return -1;
    return n->numel == R * L ? ROW_ELEMS : n->numel == R ? ROW_VALUES : -1;
}


/* In the body of member m (elements of row r), reads of the row values of earlier members are
 * at row r (row_local checked it): say so, since the compiler cannot see it through the
 * coordinate arithmetic (it would gather). */
static void at_row(cg *c, const int *members, const int *roles, int m) {
    for (int e = 0; e < m; e++) {
        if (roles[e] == ROW_ELEMS || !c->body.s) continue;
        char pat[32];
        int len = snprintf(pat, sizeof pat, "P%d[", members[e]);
        for (char *at = strstr(c->body.s, pat); at; at = strstr(at + len, pat)) {
            char *end = strchr(at + len, ']');
            if (!end) break;
            memmove(at + len + 1, end, strlen(end) + 1);
            at[len] = 'r';
        }
    }
    c->body.len = c->body.s ? strlen(c->body.s) : 0;
}

/* The row kernel starting at the sum order[0]; returns how many of order[] it took (0: none). */
static int row_kernel(gen *G, const int *order, int n_order) {
    cg *c = &G->c;
    int64_t R, L;
    if (!cg_row_sum(c, order[0], &R, &L)) return 0;
    int members[64], roles[64], nm = 0;
    for (int q = 0; q < n_order && nm < 64; q++) {
        int id = order[q], role = row_role(G, id, R, L);
        if (role < 0) break;
        bool ok = true;
        for (int e = 0; e < nm && ok; e++) {
            int start = role == ROW_SUM ? N(c, id)->src[0] : id;
            ok = cg_row_local(c, id, start, members[e], role == ROW_VALUES ? 1 : 0, R, L);
        }
        if (!ok) break;
        members[nm] = id;
        roles[nm++] = role;
    }
    if (nm < 2) return 0;
    /* The bodies, one loop each inside the loop over rows; a member that reads memory a later
     * member writes (other than another member) ends the kernel before that member. */
    for (;;) {
        begin(G, members[0]);
        G->n_roots = 0;
        strbuf text = { 0 };
        for (int m = 0; m < nm; m++) {
            int id = members[m];
            G->roots[G->n_roots++] = id;
            c->root = id;
            c->n_memo = 0;
            c->body.len = 0;
            if (c->body.s) c->body.s[0] = 0;
            /* Elements i = o * L + u of row o: as in pointwise_kernel (cg.row), values read at
             * other coordinates (a row's statistics, a bias) are functions of o alone, hoisted
             * out of the loop over u, and i is 64-bit so that GCC sees it cannot wrap: both keep
             * the loop vectorized where coordinates divided out of i per element did not */
            c->row = roles[m] == ROW_VALUES ? 0 : L;
            if (roles[m] == ROW_SUM) {
                cg_line(c, "const int64_t i = o * %lld + u;", (long long)L);
                cg_line(c, "(void)i;");   /* a sum of values at (o, u) alone (a one-hot's) does not read it */
                cg_line(c, "acc += (double)%s;", cg_value(c, N(c, id)->src[0], "i"));
                at_row(c, members, roles, m);
                sb_printf(&text, "      {\n      double acc = 0;\n      #pragma omp simd reduction(+:acc)\n"
                                 "      for (int64_t u = 0; u < %lld; u++) {\n%s      }\n      P%d[r] = (%s)acc;\n      }\n",
                          (long long)L, sb_str(&c->body), id, cg_ctype(N(c, id)));
            } else if (roles[m] == ROW_ELEMS) {
                cg_line(c, "const int64_t i = o * %lld + u;", (long long)L);
                cg_line(c, "P%d[i] = %s;", id, cg_root_value(c, "i"));
                at_row(c, members, roles, m);
                sb_printf(&text, "      for (int64_t u = 0; u < %lld; u++) {\n%s      }\n", (long long)L, sb_str(&c->body));
            } else {
                cg_line(c, "P%d[r] = %s;", id, cg_root_value(c, "r"));
                sb_printf(&text, "      {\n%s      }\n", sb_str(&c->body));
            }
        }
        c->row = c->row_part = 0;
        bool ok = true;
        for (int i = 0; i < c->g->n && ok; i++) {
            if (!c->used[i]) continue;
            bool member = false;
            for (int m = 0; m < nm; m++) member |= members[m] == i;
            for (int m = 0; m < nm && ok && !member; m++) ok = !overlap(G, i, members[m]);
        }
        /* Members' buffers are apart, or a later one reuses exactly the buffer of an earlier one
         * that no member after it reads (the plan freed it): row by row, the reads come first. */
        for (int m = 0; m < nm && ok; m++)
            for (int k = 0; k < m && ok; k++) {
                if (!overlap(G, members[m], members[k])) continue;
                ok = c->plan->offset[members[m]] == c->plan->offset[members[k]] &&
                     N(c, members[m])->numel == N(c, members[k])->numel;
                for (int later = m + 1; later < nm && ok; later++) {
                    int start = roles[later] == ROW_SUM ? N(c, members[later])->src[0] : members[later];
                    ok = !cg_expr_reads(c, members[later], start, members[k]) && start != members[k];
                }
                if (ok && G->same[m] < 0) G->same[m] = G->same[k] >= 0 ? G->same[k] : members[k];
            }
        if (!ok) {
            free(text.s);
            if (--nm < 2) return 0;
            continue;
        }
        c->body.len = 0;
        if (c->body.s) c->body.s[0] = 0;
        c->root = members[0];
        char head[128];
        snprintf(head, sizeof head, "    for (uint32_t r = 0; r < %lldu; r++) {\n      const int64_t o = r;\n", (long long)R);
        sb_printf(&c->body, "%s", sb_str(&text));
        free(text.s);
        end_kernel(G, R > 1 && omp(c, R * L * nm), head, "    }\n");
        return nm;
    }
}

/* A call of library kernel `fn` with constant arguments and buffer pointers; `id` is the kernel's
 * output (its buffer listed in bufs too). */
/* A call of library kernel fn with constant args and the buffers of nodes bufs (-1: NULL); it
 * writes the nodes outs[0..n_out). */
static void library_call_n(gen *G, const int *outs, int n_out, const char *fn, const int64_t *args, int nargs,
                           const int *bufs, int nbufs) {
    cg *c = &G->c;
    begin(G, outs[0]);
    for (int r = 1; r < n_out; r++) G->roots[G->n_roots++] = outs[r];
    strbuf head = { 0 };
    sb_printf(&head, "    static const int64_t a[] = {");
    for (int i = 0; i < nargs; i++) sb_printf(&head, "%s%lld", i ? ", " : " ", (long long)args[i]);
    sb_printf(&head, " };\n    void *const p[] = {");
    for (int i = 0; i < nbufs; i++) {
        bool out = false;
        for (int r = 0; r < n_out; r++) out |= bufs[i] == outs[r];
        int b = bufs[i] < 0 || out ? bufs[i] : view_base(c, bufs[i]);
        if (b >= 0 && !out) c->used[b] = true;
        if (b < 0) sb_printf(&head, "%s(void *)0", i ? ", " : " ");
        else sb_printf(&head, "%s(void *)P%d", i ? ", " : " ", b);
    }
    if (G->standalone) {   /* TGK_MATMUL -> tgk_matmul(a, p) */
        sb_printf(&head, " };\n    tgk_");
        for (const char *s = fn + 4; *s; s++) sb_printf(&head, "%c", *s >= 'A' && *s <= 'Z' ? *s - 'A' + 'a' : *s);
        sb_printf(&head, "(a, p);\n");
    } else {
        sb_printf(&head, " };\n    ((tgk_fn)R[%s])(a, p);\n", fn);
    }
    end_kernel(G, false, head.s, "");
    free(head.s);
}

static void library_call(gen *G, int id, const char *fn, const int64_t *args, int nargs, const int *bufs, int nbufs) {
    library_call_n(G, &id, 1, fn, args, nargs, bufs, nbufs);
}

/* Attention nodes of one kernel call: ATTENTION with its LSE node when that follows it in the
 * schedule, or the consecutive ATTENTION_BWD nodes of one forward. Returns how many of next[]
 * it took. */
static int attention_call(gen *G, int id, const int *next, int n_next) {
    cg *c = &G->c;
    const tg_node *n = N(c, id);
    int64_t a[11];   /* cg_attention_args, whether q, k, v and d_out are bf16 operands, out's heads, the gradients packed */
    cg_attention_args(c->g, id, a);
    a[8] = c->g->precision == TG_PRECISION_BF16;
    a[9] = n->op == OP_ATTENTION_BWD ? n->iarg[2] : 0;
    a[10] = n->op == OP_ATTENTION_BWD && n->iarg[1] == 3 ? 3 : 1;
    int outs[3] = { id }, n_out = 1;
    for (int k = 0; k < n_next && n_out < 3 && cg_attention_joins(c->g, outs[n_out - 1], next[k]); k++) outs[n_out++] = next[k];
    if (n->op == OP_ATTENTION_BWD) {
        int bufs[9] = { n->src[0], n->src[1], n->src[2], n->src[3], n->src[4], n->src[5], -1, -1, -1 };
        for (int r = 0; r < n_out; r++) {   /* dq, dk or dv; packed (iarg[1] 3, alone): all three into it */
            const int64_t w = N(c, outs[r])->iarg[1];
            for (int k = 0; k < 3; k++)
                if (w == k || w == 3) bufs[6 + k] = outs[r];
        }
        library_call_n(G, outs, n_out, "TGK_ATTENTION_BWD", a, 11, bufs, 9);
    } else {
        bool fwd = n->op == OP_ATTENTION;
        int lse = fwd ? (n_out > 1 ? outs[1] : -1) : id;
        int bufs[5] = { n->src[0], n->src[1], fwd ? n->src[2] : n->src[1], fwd ? id : -1, lse };
        library_call_n(G, outs, n_out, "TGK_ATTENTION", a, 9, bufs, 5);
    }
    return n_out - 1;
}

/* An im2col node's geometry as k_matmul takes it: C H W kh kw stride pad of its image. */
static void im2col_geometry(const cg *c, int node, int64_t *geo) {
    const tg_node *n = N(c, node);
    const tg_shape img = n->op == OP_IM2COL ? N(c, n->src[0])->shape : n->shape;
    geo[0] = img.d[1];
    geo[1] = img.d[2];
    geo[2] = img.d[3];
    for (int k = 0; k < 4; k++) geo[3 + k] = n->iarg[k];
}

/* The product of node mm (cg_gemm_of: per batch element offsets into A and B, or the batch
 * folded into M), written to node id's buffer. flags (MM_*): MM_REDUCE, id is the sum over mm's
 * batch axis; MM_COL2IM_C, id is the col2im of mm; MM_BIAS_ROW / MM_BIAS_COL, id is mm plus a
 * bias (bias_of). A second operand that is an unmaterialized im2col is read from its image
 * (MM_IM2COL_B). */
static void matmul_call(gen *G, int id, int mm, int flags) {
    cg *c = &G->c;
    const tg_node *n = N(c, mm);
    cg_gemm m = cg_gemm_of(c->g, mm);
    int64_t batch = n->numel / (n->shape.d[n->shape.ndim - 2] * n->shape.d[n->shape.ndim - 1]);
    if (m.batch != batch && (flags & ~(MM_BIAS_COL | MM_RELU))) {   /* unfold: these modes need the products apart */
        m.M /= batch;
        m.batch = batch;
        free(m.aoff);
        free(m.boff);
        m.aoff = tg_alloc(sizeof(int64_t) * (size_t)batch);
        m.boff = tg_alloc(sizeof(int64_t) * (size_t)batch);
        for (int64_t i = 0; m.aoff && i < batch; i++) m.aoff[i] = i * m.M * m.K;   /* A contiguous, B shared */
    }
    int bufs[4] = { n->src[0], n->src[1], id, -1 }, nbufs = 3;
    if (flags & (MM_BIAS_ROW | MM_BIAS_COL)) {   /* id is an add of mm and a bias, or (MM_RELU) the relu of one */
        const tg_node *add = (flags & MM_RELU) ? N(c, N(c, id)->src[0]) : N(c, id);
        bufs[3] = view_base(c, add->src[view_base(c, add->src[0]) == mm ? 1 : 0]);
        nbufs = 4;
    }
    int bv = view_base(c, n->src[1]);
    int64_t img = 0;   /* elements per image of an im2col operand */
    if (!c->mat[bv] && N(c, bv)->op == OP_IM2COL) {
        flags |= MM_IM2COL_B;
        bufs[1] = view_base(c, N(c, bv)->src[0]);
        img = N(c, N(c, bv)->src[0])->numel / N(c, N(c, bv)->src[0])->shape.d[0];
    }
    /* args: ta, tb, M, N, K, batch, flags, geometries, then batch offsets of A, then of B. */
    int64_t *args = m.aoff && m.boff ? tg_alloc(sizeof(int64_t) * (size_t)(21 + 2 * m.batch)) : NULL;
    if (!args) {   /* out of memory: no call (the source is discarded: see alloc_failures) */
        free(m.aoff);
        free(m.boff);
        return;
    }
    if (c->g->precision == TG_PRECISION_BF16) flags |= MM_BF16;
    int64_t head[7] = { m.ta, m.tb, m.M, m.N, m.K, m.batch, flags };
    memcpy(args, head, sizeof head);
    int na = 7;
    if (flags & MM_IM2COL_B) {
        im2col_geometry(c, bv, args + na);
        na += 7;
    }
    if (flags & MM_COL2IM_C) {
        im2col_geometry(c, id, args + na);
        na += 7;
    }
    for (int64_t i = 0; i < m.batch; i++) {
        args[na + i] = m.aoff[i];
        args[na + m.batch + i] = (flags & MM_IM2COL_B) ? m.boff[i] / (m.K * m.N) * img : m.boff[i];
    }
    library_call(G, id, "TGK_MATMUL", args, (int)(na + 2 * m.batch), bufs, nbufs);
    free(args);
    free(m.aoff);
    free(m.boff);
}

static void special_kernel(gen *G, int id) {
    cg *c = &G->c;
    const tg_node *n = N(c, id), *s0 = N(c, n->src[0]);
    int two[2] = { n->src[0], id }, three[3] = { n->src[0], n->nsrc > 1 ? n->src[1] : id, id };
    int64_t a[12] = { 0 };
    switch (n->op) {
    case OP_MATMUL: matmul_call(G, id, id, 0); return;
    case OP_COL2IM:
        if (!c->mat[n->src[0]] && s0->op == OP_MATMUL) {   /* an absorbed product: col2im per image */
            matmul_call(G, id, n->src[0], MM_COL2IM_C);
            return;
        }
        break;
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
        cg_axis_split(n->shape, n->axis, &a[0], &a[1], &a[2]);
        a[3] = n->op == OP_LOG_SOFTMAX;
        library_call(G, id, "TGK_SOFTMAX", a, 4, two, 2);
        return;
    case OP_SOFTMAX_CAUSAL: {
        int r = n->shape.ndim;
        a[1] = n->shape.d[r - 2];
        a[2] = n->shape.d[r - 1];
        a[0] = n->numel / (a[1] * a[2]);
        library_call(G, id, "TGK_SOFTMAX_CAUSAL", a, 3, two, 2);
        return;
    }
    case OP_ARGMAX:
        cg_axis_split(s0->shape, n->axis, &a[0], &a[1], &a[2]);
        a[3] = n->iarg[0];
        library_call(G, id, "TGK_ARGMAX", a, 4, two, 2);
        return;
    case OP_SCATTER_ROWS:
        a[0] = N(c, n->src[1])->numel;
        a[1] = n->shape.d[1];
        a[2] = n->shape.d[0];
        library_call(G, id, "TGK_SCATTER_ROWS", a, 3, three, 3);
        return;
    case OP_SCATTER_ALONG:
        cg_axis_split(s0->shape, n->axis, &a[0], &a[1], &a[2]);
        a[3] = n->shape.d[n->axis];
        library_call(G, id, "TGK_SCATTER_ALONG", a, 4, three, 3);
        return;
    default:
        break;
    }
    switch (n->op) {
    case OP_COL2IM: case OP_MAXPOOL2D: case OP_MAXPOOL2D_BWD: {
        const tg_shape img = n->op == OP_MAXPOOL2D ? s0->shape : n->shape;
        for (int k = 0; k < 4; k++) a[k] = img.d[k];
        if (n->op == OP_COL2IM) {
            for (int k = 0; k < 4; k++) a[4 + k] = n->iarg[k];   /* kh kw stride pad */
            library_call(G, id, "TGK_COL2IM", a, 8, two, 2);
        } else {
            a[4] = a[5] = n->iarg[0];                            /* k, k, stride, pad */
            a[6] = n->iarg[1];
            a[7] = n->iarg[2];
            a[8] = 0;                                            /* backward: no mask */
            library_call(G, id, n->op == OP_MAXPOOL2D ? "TGK_MAXPOOL" : "TGK_MAXPOOL_BWD", a, n->op == OP_MAXPOOL2D ? 8 : 9,
                         n->op == OP_MAXPOOL2D ? two : three, n->op == OP_MAXPOOL2D ? 2 : 3);
        }
        return;
    }
    default:
        c->unsupported = id;
        return;
    }
}

/* Node id, a max pooling's gradient (absorbed node pb) times the step of the pooling's input:
 * TGK_MAXPOOL_BWD with its mask flag, writing id's buffer. */
static void masked_pool_call(gen *G, int id, int pb) {
    const tg_node *b = N(&G->c, pb);
    int64_t a[9] = { b->shape.d[0], b->shape.d[1], b->shape.d[2], b->shape.d[3], b->iarg[0], b->iarg[0], b->iarg[1], b->iarg[2], 1 };
    int bufs[3] = { b->src[0], b->src[1], id };
    library_call(G, id, "TGK_MAXPOOL_BWD", a, 9, bufs, 3);
}

/* What every generated C file starts with: headers, the libm functions generated expressions
 * call, declared with OpenMP SIMD variants so that loops calling them vectorize into glibc's
 * libmvec (reached through libm's linker script; built with -fno-math-errno, see cpu_backend.c,
 * so sqrtf vectorizes too), the library-kernel table. */
static const char PRELUDE[] =
    "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n"
    "#pragma omp declare simd notinbranch\nfloat expf(float);\n"
    "#pragma omp declare simd notinbranch\nfloat logf(float);\n"
    "#pragma omp declare simd notinbranch\nfloat tanhf(float);\n"
    "#pragma omp declare simd notinbranch\nfloat exp2f(float);\n"
    "#pragma omp declare simd notinbranch\nfloat sinf(float);\n"
    "#pragma omp declare simd notinbranch\nfloat cosf(float);\n"
    "static inline float tgk_rcp(float x) { return 1.0f / x; }\n"
    "typedef void (*tgk_fn)(const int64_t *a, void *const *p);\n"
    "enum { TGK_MATMUL, TGK_SOFTMAX, TGK_SOFTMAX_CAUSAL, TGK_ARGMAX, TGK_SCATTER_ROWS, TGK_SCATTER_ALONG,\n"
    "       TGK_COL2IM, TGK_MAXPOOL, TGK_MAXPOOL_BWD, TGK_FAILED, TGK_ATTENTION, TGK_ATTENTION_BWD, TGK_MARK };\n";

/* The threads of an OpenMP region run in the library kernels' floating-point mode, each putting
 * its own back as it leaves (cpu.h: fp_flush_denormals); an export keeps IEEE denormals. */
#define FP_KEEP                                                   \
    "static inline unsigned tg_fp_flush(void) { return 0; }\n" \
    "static inline void tg_fp_restore(unsigned m) { (void)m; }\n"
static const char FP_FLUSH[] =
    "#if defined(__x86_64__) && defined(__SSE__)\n#include <xmmintrin.h>\n"
    "static inline unsigned tg_fp_flush(void) { const unsigned m = _mm_getcsr(); _mm_setcsr(m | 0x8040u); return m; }\n"
    "static inline void tg_fp_restore(unsigned m) { _mm_setcsr(m); }\n"
    "#else\n" FP_KEEP "#endif\n";
static const char FP_PORTABLE[] = FP_KEEP;

/* A call of the entry, and for a profile (TG_CPU_PROFILE) the mark after it: the time since the
 * mark before is node's (cpu_kernels.c's k_mark) */
static void entry_call(strbuf *entry, const gen *G, bool profile, int node) {
    sb_printf(entry, "%s", sb_str(&G->call));
    if (profile) sb_printf(entry, "    ((void (*)(int))R[TGK_MARK])(%d);\n", node);
}

static char *generate(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min,
                      const int *inplace, bool standalone, bool profile, int *unsupported) {
    strbuf out = { 0 };
    gen G;
    memset(&G, 0, sizeof G);
    G.prefix = "k";
    cg *c = &G.c;
    long failures = alloc_failures();   /* any allocation failing from here on voids the source */
    if (!cg_init(c, g, materialized, plan, &out)) {
        cg_release(c);
        return NULL;
    }
    c->parallel_min = parallel_min;
    G.inplace = inplace;
    G.standalone = standalone;
    sb_printf(&out, "/* generated by tensorgrad: %d nodes */\n%s%s", g->n, PRELUDE, standalone ? FP_PORTABLE : FP_FLUSH);
    cg_prelude(&out, "static inline");
    strbuf entry = { 0 };
    sb_printf(&entry, "%svoid tg_entry(float *A, void **B, const double *H, void *const *R) {\n%s%s", standalone ? "static " : "",
              standalone ? STANDALONE_USED "\n" : "", profile ? "    ((void (*)(int))R[TGK_MARK])(-1);\n" : "");
    int *order = tg_alloc(sizeof(int) * (size_t)(g->n + 1)), n_order = 0;
    for (int i = 0; order && i < g->n; i++)
        if (materialized[i] && plan->alias[i] < 0) order[n_order++] = i;   /* aliases share a buffer: no kernel */
    bool guarded = false;
    for (int q = 0; q < n_order; q++) {
        int i = order[q];
        const tg_node *n = &g->nodes[i];
        int joined = 0, mm = bias_product(c, i), pb = masked_pool_grad(c, i);
        if (mm >= 0) {
            int add = n->op == OP_RELU ? n->src[0] : i;
            const tg_node *a = &g->nodes[add];
            int k = view_base(c, a->src[0]) == mm ? 0 : 1, o = view_base(c, a->src[1 - k]);
            matmul_call(&G, i, mm, bias_of(g, add, k, mm, o, materialized[o] || cg_is_bound(g->nodes[o].op)) |
                                       (n->op == OP_RELU ? MM_RELU : 0));
        } else if (pb >= 0) masked_pool_call(&G, i, pb);
        else if (fuse_pointwise(n->op)) joined = pointwise_kernel(&G, i, order + q + 1, n_order - q - 1);
        else if (n->op == OP_SUM && (joined = row_kernel(&G, order + q, n_order - q)) > 0) joined--;
        else if (n->op == OP_SUM) sum_kernel(&G, i);
        else if (n->op == OP_ATTENTION || n->op == OP_ATTENTION_LSE || n->op == OP_ATTENTION_BWD)
            joined = attention_call(&G, i, order + q + 1, n_order - q - 1);
        else special_kernel(&G, i);
        for (int r = 0; r <= joined; r++) {   /* bf16 activations out of a library kernel (products, attention) */
            const int o = r ? order[q + r] : i;
            if (graph_library_output(g->nodes[o].op) && graph_rounds(g, c->bf16, o)) {
                entry_call(&entry, &G, profile, i);
                round_kernel(&G, o);
            }
        }
        bool writes_leaf = false;
        for (int r = 0; r < G.n_roots; r++) writes_leaf |= inplace_of(&G, G.roots[r]) >= 0;
        if (writes_leaf && !guarded) {
            /* Parameters and optimizer state are replaced from here on: only when the loss and every
             * gradient are finite (the guard) and every kernel so far got its scratch memory. */
            sb_printf(&entry, "    if (!isfinite(((const float *)(A + %zu))[0]) || ((int (*)(void))R[TGK_FAILED])()) return;\n",
                      plan->offset[g->guard]);
            guarded = true;
        }
        entry_call(&entry, &G, profile, i);
        q += joined;
    }
    sb_printf(&entry, "}\n");
    sb_printf(&out, "%s", sb_str(&entry));
    free(entry.s);
    free(order);
    for (int k = 0; k < G.n_texts; k++) {
        free(G.texts[k]);
        free(G.names[k]);
    }
    free(G.texts);
    free(G.names);
    free(G.slots.s);
    free(G.call.s);
    *unsupported = c->unsupported;
    cg_release(c);
    if (alloc_failures() != failures || *unsupported >= 0) {   /* placeholders or holes: not a program */
        free(out.s);
        return NULL;
    }
    return out.s;
}

char *codegen_c_inplace(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min,
                        const int *inplace, bool profile, int *unsupported) {
    return generate(g, materialized, plan, parallel_min, inplace, false, profile, unsupported);
}

char *codegen_c(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min, int *unsupported) {
    return generate(g, materialized, plan, parallel_min, NULL, false, false, unsupported);
}

char *codegen_c_standalone(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min,
                           int *unsupported) {
    return generate(g, materialized, plan, parallel_min, NULL, true, false, unsupported);
}
