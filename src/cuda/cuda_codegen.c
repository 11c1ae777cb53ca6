/* CUDA code generation: the same schedule, plan and expression engine as the C backend
 * (expr.h), wrapped in __global__ kernels with every shape baked in, plus a launch list that
 * the CUDA backend replays (and captures into one CUDA graph): kernel launches, cuBLAS matrix
 * products and buffers to clear (CL_MEMSET, by the prelude's tg_zero), in graph order.
 *
 * Every kernel takes (float *A, void *const *B, const double *H): the device arena (plan offsets
 * in floats), the device table of bound leaves by node id, and the device copy of the hyper
 * scalars. Pointwise kernels use one thread per element; sums one thread per output, or a block
 * per output when there are few outputs; row-wise softmax a warp per row; scatters clear their
 * output, then accumulate with atomics. */
#include "compile/expr.h"
#include "cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 256
/* The most threads of a piece of the gradients' check: a kernel that loops over its values to
 * leave room beside the chain (cuda_backend.c's leaves_room) */
enum { CHECK_THREADS = 128 * BLOCK };
/* A pointwise kernel of one segment of at least ELEMS_MIN elements gives each thread ELEMS groups
 * of LANES consecutive elements, where the segment is a multiple of BLOCK * ELEMS (* LANES), or
 * ELEMS / 2 groups of MAX_LANES (pointwise_kernel). */
#define ELEMS 4
#define ELEMS_MIN (1 << 20)
#define LANES 4
#define MAX_LANES 8   /* a pointwise kernel's, where it stores bf16 only (pointwise_kernel) */

static const tg_node *N(const cg *c, int id) { return &c->g->nodes[id]; }

static cuda_launch *add_launch(cuda_plan *p, cuda_launch_kind kind, int node) {
    static _Thread_local cuda_launch lost;   /* out of memory: filled in, then discarded (alloc_failures) */
    cuda_launch *l = &lost;
    if (p->n == p->cap) {
        cuda_launch *grown = tg_realloc(p->launch, sizeof(cuda_launch) * (size_t)(p->cap ? 2 * p->cap : 64));
        if (grown) {
            p->launch = grown;
            p->cap = p->cap ? 2 * p->cap : 64;
        }
    }
    if (p->n < p->cap) l = &p->launch[p->n++];
    else {
        free(l->aoff);   /* a product's offsets from an earlier lost launch */
        free(l->boff);
        free(l->io);
    }
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->node = node;
    l->addend = -1;
    return l;
}

/* The launch of the kernel just generated for `node`, with what it reads and writes where that was
 * noted for it (io_node) and it writes no bound leaf. */
static cuda_launch *kernel_launch(cg *c, cuda_plan *p, int node, int64_t threads, int block) {
    cuda_launch *l = add_launch(p, CL_KERNEL, node);
    snprintf(l->name, sizeof l->name, "k%d", node);
    l->block = block;
    l->grid = (threads + block - 1) / block;
    l->grid_y = 1;
    if (c->io_root == node && !c->io_bound && c->n_io > 0 && (l->io = tg_alloc(sizeof *l->io * (size_t)c->n_io))) {
        memcpy(l->io, c->io, sizeof *l->io * (size_t)c->n_io);
        l->n_io = c->n_io;
    }
    c->n_io = 0;
    c->io_root = -1;
    c->io_bound = false;
    return l;
}

/* Noted for the kernel being generated: it reads (or writes) `floats` floats of the arena from lo.
 * Out of memory, it writes a bound leaf as far as its launch is concerned: nothing runs beside it. */
static void io_span(cg *c, size_t lo, int64_t floats, bool write) {
    if (c->n_io == c->cap_io) {
        int cap = c->cap_io ? 2 * c->cap_io : 64;
        int64_t(*grown)[3] = tg_realloc(c->io, sizeof *grown * (size_t)cap);
        if (!grown) {
            c->io_bound = true;
            return;
        }
        c->io = grown;
        c->cap_io = cap;
    }
    c->io[c->n_io][0] = (int64_t)lo;
    c->io[c->n_io][1] = (int64_t)lo + floats;
    c->io[c->n_io++][2] = write;
}

static bool has_shadow(const cg *c, int id);

/* Noted: the kernel reads (or writes) node id: its buffer and its rounded copies, wherever it has
 * them (more than it touches is only less at once). A bound leaf's buffer lies outside the
 * arena: written (an update in place), nothing may run beside the kernel. */
static void io_node(cg *c, int id, bool write) {
    const int home = plan_home(c->plan, id);
    if (cg_is_bound(N(c, home)->op) || (c->inplace && c->inplace[home] >= 0)) {
        c->io_bound |= write;
        return;
    }
    const int64_t n = N(c, home)->numel > N(c, id)->numel ? N(c, home)->numel : N(c, id)->numel;
    const int64_t copy = c->g->precision == TG_PRECISION_BF16 ? (n + 1) / 2 : n;
    if (c->plan->offset[home] != PLAN_BOUND) io_span(c, c->plan->offset[home], n, write);
    if (has_shadow(c, home)) io_span(c, c->plan->shadow[home], copy, write);
    if (id != home && has_shadow(c, id)) io_span(c, c->plan->shadow[id], copy, write);
    if (c->plan->tshadow && c->plan->tshadow[home] != PLAN_BOUND) io_span(c, c->plan->tshadow[home], n, write);
}

static void memset_launch(cuda_plan *p, int node) {
    cuda_launch *l = add_launch(p, CL_MEMSET, node);
    l->n = p->g->nodes[node].numel;
    l->at = -1;
}

static void pointer(cg *c, strbuf *decl, int id, bool out) { cg_pointer(c, decl, id, out, "__restrict__"); }

/* ----- rounded copies of product operands (tf32, bf16) -----
 * A product at tf32 or bf16 reads its operands rounded. Where a kernel of ours computes an operand
 * element by element, it also writes the rounded value beside the f32 one, into the node's
 * shadow (plan_shadows), and the product reads the shadow: no rounding pass of its own. Leaves
 * (parameters, inputs) are rounded by one kernel at the start of the run. */

static int home_of(const int *alias, int x) { return alias[x] >= 0 ? alias[x] : x; }

/* Does the kernel computing home node h also write its rounded copy (shadow_store)? Pointwise and
 * row kernels do, kleaves for the leaves, and attention for its output and the gradients of k
 * and v; products, sums, the other special kernels and attention's dq (added up in memory as it arrives:
 * filled after it, fills_shadow) do not. */
static bool writes_shadow(const tg_graph *g, const bool *materialized, int h) {
    const tg_node *n = &g->nodes[h];
    bool attention = n->op == OP_ATTENTION || (n->op == OP_ATTENTION_BWD && n->iarg[1] != 0);
    return cg_is_bound(n->op) || (materialized[h] && (fuse_pointwise(n->op) || attention));
}

/* Is home node h's rounded copy made by a pass right after its kernel (fill_shadow)? */
static bool fills_shadow(const tg_graph *g, const bool *materialized, int h) {
    return materialized[h] && g->nodes[h].op == OP_ATTENTION_BWD && g->nodes[h].iarg[1] == 0;
}

bool cuda_attention_mma(const tg_graph *g, int id, int sm) {
    int64_t a[8];
    cg_attention_args(g, id, a);
    const int k = g->precision == TG_PRECISION_BF16 ? 16 : 8;   /* the mma's k (f32: three tf32 products) */
    return sm >= 80 && a[3] % k == 0 && a[4] % k == 0;
}

static bool is_attention(tg_op op) { return op == OP_ATTENTION || op == OP_ATTENTION_LSE || op == OP_ATTENTION_BWD; }

/* Does attention node id run on warpgroup MMAs (cuda_attention.c's CUDA_ATTENTION_WG_SOURCE): bf16
 * heads of 64 on sm_90 (compiled as sm_90a)? TG_CUDA_WGMMA=0: never (the mma.sync kernels; A/B runs, tests). */
static bool attention_wg(const tg_graph *g, int id, int sm) {
    const char *env = getenv("TG_CUDA_WGMMA");
    int64_t a[8];
    cg_attention_args(g, id, a);
    return sm == 90 && g->precision == TG_PRECISION_BF16 && a[3] == 64 && a[4] == 64 && !(env && env[0] == '0');
}

/* Does attention node i read its operands as rounded copies (on tensor cores at bf16; at tf32
 * it rounds them as it loads them, at f32 it splits them)? */
static bool attention_reads_copies(const tg_graph *g, int i, int sm) {
    return g->precision == TG_PRECISION_BF16 && is_attention(g->nodes[i].op) && cuda_attention_mma(g, i, sm);
}

/* The sources of attention node n that enter its products (q, k, v; d_out in the backward), read
 * as rounded copies where attention_reads_copies; in the backward also out, where it is a bf16
 * activation (bf16: graph_bf16_values; its bf16 value is its copy). Returns how many (their src
 * indices in ops). */
static int attention_operands(const tg_node *n, const bool *bf16, int *ops) {
    static const int fwd[] = { 0, 1, 2 }, lse[] = { 0, 1 }, bwd[] = { 0, 1, 2, 4 };
    const int *o = n->op == OP_ATTENTION ? fwd : n->op == OP_ATTENTION_LSE ? lse : bwd;
    int k = n->op == OP_ATTENTION ? 3 : n->op == OP_ATTENTION_LSE ? 2 : 4;
    memcpy(ops, o, sizeof(int) * (size_t)k);
    if (n->op == OP_ATTENTION_BWD && bf16 && bf16[n->src[3]]) ops[k++] = 3;
    return k;
}

/* A product through cuBLAS (not one computed inline: fuse_small_reduction), which reads its
 * operands' rounded copies at tf32 and bf16. */
static bool on_cublas(const tg_graph *g, const bool *materialized, int id) {
    return g->nodes[id].op == OP_MATMUL && materialized[id];
}

/* The source of sum `id` past the sums it absorbed (cuda_refine), and the axes they span. */
static int sum_source(const tg_graph *g, const bool *materialized, int id, int *lo, int *hi) {
    int x = g->nodes[id].src[0];
    *lo = *hi = g->nodes[id].axis;
    for (; g->nodes[x].op == OP_SUM && !materialized[x]; x = g->nodes[x].src[0]) {
        *lo = g->nodes[x].axis < *lo ? g->nodes[x].axis : *lo;
        *hi = g->nodes[x].axis > *hi ? g->nodes[x].axis : *hi;
    }
    return x;
}

/* Does sum b compute its source a itself (sum_kernel's producer)? Callers pass as a the node
 * right before b in kernel order; a must be pointwise and b's source, and b must leave an inner
 * block (a sum over the last axes is row_kernel's, which reads its source from memory). Then a
 * is written, and summed, where it is computed: the sum needs no buffer of it. */
static bool sums_its_source(const tg_graph *g, const bool *materialized, int a, int b) {
    int lo, hi;
    if (!fuse_pointwise(g->nodes[a].op) || g->nodes[b].op != OP_SUM || sum_source(g, materialized, b, &lo, &hi) != a)
        return false;
    int64_t inner = 1;
    for (int k = hi + 1; k < g->nodes[a].shape.ndim; k++) inner *= g->nodes[a].shape.d[k];
    return inner > 1;
}

/* Does product `id` read its B operand, a leaf matrix [K, N] untransposed, from the leaf's
 * transposed copy (tshadow) instead? At tf32, from 2^31 multiply-adds: Hopper's warpgroup MMAs
 * read TF32 operands only with K running along their rows in shared memory, and cuBLASLt's
 * kernels for a forward X W (W's rows run along N) are the slower for it (an H200,
 * [16384 x 1536] x [1536 x 384]: 0.081 ms, 0.059 from W's transpose; 7-27% at each of
 * char_gpt's shapes, bench/cuda/epilogue/layouts.cu); the small workloads' steps were slower
 * with the copies. The input gradient dY W^T reads W's rows along K already: both copies are
 * kept. TG_CUDA_TRANSPOSED=0 takes no copy, =1 one for every such product (tests). */
static bool reads_leaf_transposed(const tg_graph *g, const bool *materialized, const int *alias, int id) {
    const char *env = getenv("TG_CUDA_TRANSPOSED");
    const double least = env && env[0] == '1' ? 0 : 0x1p31;
    if (g->precision != TG_PRECISION_TF32 || !on_cublas(g, materialized, id) || (env && env[0] == '0')) return false;
    const tg_node *w = &g->nodes[home_of(alias, g->nodes[id].src[1])];
    cg_gemm m = cg_gemm_of(g, id);
    bool whole = m.batch == 1 && m.boff && m.boff[0] == 0 && !m.tb && m.K * m.N == w->numel && w->shape.ndim >= 2 &&
                 w->shape.d[w->shape.ndim - 1] == m.N && (double)m.M * (double)m.N * (double)m.K >= least;
    free(m.aoff);
    free(m.boff);
    return whole && cg_is_bound(w->op) && w->dtype == TG_FLOAT32;
}

void cuda_shadow_wanted(const tg_graph *g, int sm, const bool *materialized, const int *alias, const int *keep, int n_keep,
                        bool *want, bool *want_t, bool *only) {
    for (int i = 0; i < g->n; i++) want[i] = want_t[i] = only[i] = false;
    if (g->precision == TG_PRECISION_F32) return;
    bool *bf16;
    graph_bf16_values(g, &bf16);   /* NULL when memory runs out: every activation in f32 too */
    for (int i = 0; i < g->n; i++) {   /* our kernels' products round their operands as they read them */
        const tg_node *n = &g->nodes[i];
        if (!materialized[i]) continue;
        int ops[5], n_ops = 0;
        if (on_cublas(g, materialized, i)) {   /* operands that no kernel of ours computes go through a slot; so does an addend */
            for (int k = 0; k < n->nsrc; k++) {   /* an addend is added in f32 at tf32 (cuda_fold_addends) */
                int h = home_of(alias, n->src[k]);
                if (k == 1 && reads_leaf_transposed(g, materialized, alias, i)) {
                    want_t[h] = true;
                    continue;
                }
                if ((k < 2 || g->precision == TG_PRECISION_BF16) && (writes_shadow(g, materialized, h) || fills_shadow(g, materialized, h)))
                    ops[n_ops++] = k;
            }
        } else if (attention_reads_copies(g, i, sm)) {   /* all: attention_kernel fills the others */
            n_ops = attention_operands(n, bf16, ops);
        }
        for (int k = 0; k < n_ops; k++) {
            int h = home_of(alias, n->src[ops[k]]);
            want[h] |= g->nodes[h].dtype == TG_FLOAT32;
        }
    }
    /* A computed node whose kernel writes its copy, and that only products and tensor-core
     * attention read, keeps no f32 copy at all; nor does a bf16 activation (graph_bf16_values:
     * its f32 value is its bf16 one) computed by one of our kernels or by cuBLAS, where every
     * reader is a product or reads it through the expression engine (cg_value). Attention writes
     * f32 where its results are not bf16 activations (its statistics, dq). */
    for (int i = 0; i < g->n; i++) {
        const tg_op op = g->nodes[i].op;
        bool computed = !cg_is_bound(op) && alias[i] < 0 && (!is_attention(op) || (bf16 && bf16[i]));
        only[i] = computed && ((want[i] && writes_shadow(g, materialized, i)) ||
                               (bf16 && bf16[i] && (writes_shadow(g, materialized, i) || on_cublas(g, materialized, i))));
    }
    for (int k = 0; k < n_keep; k++)
        if (keep[k] >= 0) only[home_of(alias, keep[k])] = false;
    for (int k = 0; k < g->n_assigns; k++) only[home_of(alias, g->assigns[k].src)] = false;
    /* Who reads what: kernels, and the nodes they compute inline (not the dead ones, as the
     * products and transposes of an attention written out that became an ATTENTION node). */
    bool *live = tg_alloc(sizeof(bool) * (size_t)(g->n + 1));
    if (!live) {   /* out of memory: every copy beside its f32 value (the source is discarded anyway) */
        for (int i = 0; i < g->n; i++) only[i] = false;
        free(bf16);
        return;
    }
    for (int i = 0; i < g->n; i++) live[i] = materialized[i] || alias[i] >= 0;
    for (int i = g->n - 1; i >= 0; i--)
        for (int k = 0; live[i] && k < g->nodes[i].nsrc; k++) live[g->nodes[i].src[k]] = true;
    int prev = -1;   /* the kernel order's node before i */
    for (int i = 0; i < g->n; i++) {
        const tg_node *n = &g->nodes[i];
        bool own = prev >= 0 && sums_its_source(g, materialized, prev, i);   /* reads its source from a register */
        if (materialized[i] && alias[i] < 0) prev = i;
        if (!live[i] || alias[i] >= 0 || on_cublas(g, materialized, i)) continue;   /* relabels, and cuBLAS's products: they read copies */
        bool mma = attention_reads_copies(g, i, sm);
        bool expr = !materialized[i] || fuse_pointwise(n->op) || n->op == OP_SUM;   /* reads through cg_value */
        for (int k = 0; k < n->nsrc; k++) {
            int h = home_of(alias, n->src[k]);
            bool f32_out = k == 3 && !(bf16 && bf16[h]);   /* such attention reads lse, and out unless bf16, as f32 */
            if ((!mma || k == 5 || f32_out) && !(own && k == 0) && !(expr && bf16 && bf16[h])) only[h] = false;
        }
    }
    for (int i = 0; i < g->n; i++) want[i] |= only[i];
    free(live);
    free(bf16);
}

static bool has_shadow(const cg *c, int id) { return c->plan->shadow && c->plan->shadow[id] != PLAN_BOUND; }

static const char *shadow_type(const cg *c) { return c->g->precision == TG_PRECISION_BF16 ? "unsigned short" : "float"; }

static void shadow_pointer(const cg *c, strbuf *decl, int id) {
    if (has_shadow(c, id))
        sb_printf(decl, "    %s *__restrict__ S%d = (%s *)(A + %zu);\n", shadow_type(c), id, shadow_type(c), c->plan->shadow[id]);
}

static const char *round_fn(const cg *c) { return c->g->precision == TG_PRECISION_BF16 ? "tgk_round_bf16" : "tgk_round_tf32"; }

/* After the statement that stores root r's value at index `at` (the value is the newest memo
 * entry): its rounded copy too. */
static void shadow_store(cg *c, int r, const char *at) {
    if (has_shadow(c, r) && c->n_memo > 0) cg_line(c, "S%d[%s] = %s(%s);", r, at, round_fn(c), c->memo[c->n_memo - 1].name);
}

/* Segments [lo, hi) of a pointwise kernel (segment k: thread indices up to ends[k], its code
 * segs[k]) as a tree of comparisons: a thread finds its segment in log2 of their number (an
 * optimizer update has one a parameter; a chain of them cost the last ones a comparison each). */
static void segment_tree(strbuf *out, const strbuf *segs, const int64_t *ends, int lo, int hi) {
    if (hi - lo == 1) {
        sb_printf(out, "%s", sb_str(&segs[lo]));
        return;
    }
    const int mid = (lo + hi) / 2;
    sb_printf(out, "    if (g < %lldll) {\n", (long long)ends[mid - 1]);
    segment_tree(out, segs, ends, lo, mid);
    sb_printf(out, "    } else {\n");
    segment_tree(out, segs, ends, mid, hi);
    sb_printf(out, "    }\n");
}

/* Kernel `name` over n segments (a leaf or a gradient each: segment_tree finds value g's), its
 * pointers declared in decl, `head` and `tail` around the tree; `total` threads, thread `index`
 * (g, or g0 where the head loops over values from it), launched under node `first`. */
static void segments_kernel(cg *c, cuda_plan *p, const char *name, const strbuf *decl, const strbuf *segs, const int64_t *ends,
                            int n, int first, int64_t total, const char *index, const char *head, const char *tail) {
    strbuf code = { 0 };
    segment_tree(&code, segs, ends, 0, n);
    sb_printf(c->out, "extern \"C\" __global__ void %s(float *A, void *const *B, const double *H) {\n    tgk_prior();\n%s"
                      "    const int64_t %s = (int64_t)blockIdx.x * %d + threadIdx.x;\n%s%s%s}\n\n",
              name, sb_str(decl), index, BLOCK, head, sb_str(&code), tail);
    free(code.s);
    kernel_launch(c, p, first, total, BLOCK);
    snprintf(p->launch[p->n - 1].name, sizeof p->launch[p->n - 1].name, "%s", name);
}

/* One leaf's segment of kleaves: thread g (from `start`) rounds four neighbouring values where
 * the leaf's length divides by four (16-byte loads where its pointer allows: a bound leaf need not
 * be aligned), else one. */
static void leaf_segment(const cg *c, strbuf *seg, int id, int64_t start) {
    if (N(c, id)->numel % 4) {
        sb_printf(seg, "        S%d[g - %lldll] = %s(((const float *)B[%d])[g - %lldll]);\n", id, (long long)start, round_fn(c), id,
                  (long long)start);
        return;
    }
    sb_printf(seg, "        const int64_t i = (g - %lldll) * 4;\n        const float4 v = tgk_load4((const float *)B[%d] + i);\n",
              (long long)start, id);
    if (c->g->precision == TG_PRECISION_BF16)
        sb_printf(seg, "        *(uint2 *)(S%d + i) = make_uint2(tgk_pack_bf16(v.x, v.y), tgk_pack_bf16(v.z, v.w));\n", id);
    else
        sb_printf(seg, "        *(float4 *)(S%d + i) = make_float4(tgk_round_tf32(v.x), tgk_round_tf32(v.y), tgk_round_tf32(v.z), "
                       "tgk_round_tf32(v.w));\n", id);
}

static bool has_tshadow(const cg *c, int id) { return c->plan->tshadow && c->plan->tshadow[id] != PLAN_BOUND; }

/* Threads of leaf id's segment of kleaves that writes its transposed copy (tf32; the leaf as
 * [R, C], C its last dimension, reads_leaf_transposed's N): a block of them for each 32 x 32 tile. */
static int64_t transposed_threads(const tg_node *w) {
    const int64_t C = w->shape.d[w->shape.ndim - 1], R = w->numel / C;
    return ((R + 31) / 32) * ((C + 31) / 32) * BLOCK;
}

/* Does leaf id's transposed segment move its tile four values a thread (rows and columns both
 * multiples of four, so that every 16-byte piece lies wholly in or out), writing its plain rounded
 * copy too where it has one? */
static bool transposed_vectors(const cg *c, int id) {
    const tg_node *w = N(c, id);
    const int64_t C = w->shape.d[w->shape.ndim - 1];
    return C % 4 == 0 && (w->numel / C) % 4 == 0;
}

/* That segment: the tile read along the leaf's rows into shared memory (tgT, kleaves' own), and
 * written along the copy's. Its blocks are whole (kleaves puts these segments first), so every
 * thread of one meets the barrier. Four values a thread where transposed_vectors, the plain
 * rounded copy (S) stored from the same load, so each leaf is read once: kleaves at char_gpt tf32
 * 68 -> 37 us on an H200 (one value a thread, and a second read for the plain copy). */
static void leaf_transposed_segment(const cg *c, strbuf *seg, int id, int64_t start) {
    const tg_node *w = N(c, id);
    const long long C = (long long)w->shape.d[w->shape.ndim - 1], R = (long long)w->numel / C, tc = (C + 31) / 32;
    sb_printf(seg, "        const int64_t b = (g - %lldll) / %d, r0 = b / %lld * 32, j0 = b %% %lld * 32;\n", (long long)start, BLOCK, tc,
              tc);
    if (transposed_vectors(c, id)) {
        sb_printf(seg, "        const int y = threadIdx.x / 8, x = threadIdx.x %% 8 * 4;\n");
        sb_printf(seg, "        if (r0 + y < %lldll && j0 + x < %lldll) {\n", R, C);
        sb_printf(seg, "            const int64_t i = (r0 + y) * %lldll + j0 + x;\n", C);
        sb_printf(seg, "            const float4 v = tgk_load4((const float *)B[%d] + i);\n", id);
        sb_printf(seg, "            const float4 t = make_float4(tgk_round_tf32(v.x), tgk_round_tf32(v.y), tgk_round_tf32(v.z), "
                       "tgk_round_tf32(v.w));\n");
        if (has_shadow(c, id)) sb_printf(seg, "            *(float4 *)(S%d + i) = t;\n", id);
        sb_printf(seg, "            tgT[y][x] = t.x; tgT[y][x + 1] = t.y; tgT[y][x + 2] = t.z; tgT[y][x + 3] = t.w;\n        }\n");
        sb_printf(seg, "        __syncthreads();\n");
        sb_printf(seg, "        if (j0 + y < %lldll && r0 + x < %lldll)\n", C, R);
        sb_printf(seg, "            *(float4 *)(T%d + (j0 + y) * %lldll + r0 + x) = make_float4(tgT[x][y], tgT[x + 1][y], tgT[x + 2][y], "
                       "tgT[x + 3][y]);\n", id, R);
        return;
    }
    sb_printf(seg, "        const int x = threadIdx.x %% 32;\n");
    sb_printf(seg, "        for (int y = threadIdx.x / 32; y < 32; y += %d)\n", BLOCK / 32);
    sb_printf(seg, "            tgT[y][x] = r0 + y < %lldll && j0 + x < %lldll ? tgk_round_tf32(((const float *)B[%d])[(r0 + y) * %lldll + "
                   "j0 + x]) : 0.0f;\n", R, C, id, C);
    sb_printf(seg, "        __syncthreads();\n");
    sb_printf(seg, "        for (int y = threadIdx.x / 32; y < 32; y += %d)\n", BLOCK / 32);
    sb_printf(seg, "            if (j0 + y < %lldll && r0 + x < %lldll) T%d[(j0 + y) * %lldll + r0 + x] = tgT[x][y];\n", C, R, id, R);
}

/* The first kernel of a run, when leaves have shadows: every such leaf rounded, a segment each
 * (the leaves of the product operands: parameters, and inputs fed straight to a product), after
 * the transposed copies (tshadow), found by a tree of comparisons (segment_tree). */
static void leaf_kernel(cg *c, cuda_plan *p) {
    strbuf decl = { 0 };
    int n_leaves = 0, first = -1;
    for (int i = 0; i < c->g->n; i++) n_leaves += cg_is_bound(N(c, i)->op) ? has_shadow(c, i) + has_tshadow(c, i) : 0;
    strbuf *segs = tg_alloc(sizeof(strbuf) * (size_t)(n_leaves + 1));
    int64_t *ends = tg_alloc(sizeof(int64_t) * (size_t)(n_leaves + 1)), total = 0;
    int k = 0;   /* segments */
    for (int t = 1; t >= 0 && segs && ends; t--)
        for (int i = 0; i < c->g->n; i++) {
            if (!cg_is_bound(N(c, i)->op) || !(t ? has_tshadow(c, i) : has_shadow(c, i))) continue;
            if (!t && has_tshadow(c, i) && transposed_vectors(c, i)) {   /* its transposed segment wrote S */
                shadow_pointer(c, &decl, i);
                continue;
            }
            if (first < 0) first = i;
            if (t && total == 0) sb_printf(&decl, "    __shared__ float tgT[32][33];\n");
            if (t) sb_printf(&decl, "    float *__restrict__ T%d = (float *)(A + %zu);\n", i, c->plan->tshadow[i]);
            else shadow_pointer(c, &decl, i);
            segs[k] = (strbuf){ 0 };
            sb_printf(&segs[k], "    {\n");
            if (t) leaf_transposed_segment(c, &segs[k], i, total);
            else leaf_segment(c, &segs[k], i, total);
            sb_printf(&segs[k], "    }\n");
            total += t ? transposed_threads(N(c, i)) : N(c, i)->numel % 4 ? N(c, i)->numel : N(c, i)->numel / 4;
            ends[k++] = total;
        }
    if (first >= 0 && segs && ends) {
        char head[80];
        snprintf(head, sizeof head, "    if (g >= %lldll) return;\n", (long long)total);
        segments_kernel(c, p, "kleaves", &decl, segs, ends, k, first, total, "g", head, "");
    }
    for (int q = 0; segs && q < k; q++) free(segs[q].s);
    free(segs);
    free(ends);
    free(decl.s);
}

/* ----- parameters replaced in place -----
 * A training step replaces each parameter and optimizer state where it is (plan_inplace), not
 * through a buffer of its own copied back at the end (a pass over all of them: 0.11 ms a step at
 * char_gpt). A step whose loss or any gradient is not finite must change nothing, so kcheck reads
 * every gradient first and sets the flag; each kernel that replaces leaves starts with the guard
 * (guard_head) and returns when the loss, the flag or the poison of a failed step queued before
 * it is not finite. */

/* kcheck: every gradient optim_build updates from, a segment each (four values a thread where
 * the length divides by four), the flag set where one is not finite. Emitted right before the
 * first kernel that replaces a leaf (or last: the check is the step's contract either way).
 * Gradients finished well before then are checked in pieces as they are (grad_check_piece), so
 * that kcheck, on the chain at the step's end, reads only the last few. */
static void grad_check_emit(cg *c, cuda_plan *p, const char *name, bool piece, int64_t upto) {
    const tg_graph *g = c->g;
    strbuf decl = { 0 };
    strbuf *segs = tg_alloc(sizeof(strbuf) * (size_t)(g->n_params + 1));
    int64_t *ends = tg_alloc(sizeof(int64_t) * (size_t)(g->n_params + 1)), total = 0;
    int n = 0, first = -1;
    for (int i = 0; segs && ends && i < g->n_params; i++) {
        int gr = g->grad_of_param[i];
        if (g->param_node[i] < 0 || gr < 0 || gr > upto || (c->checked && c->checked[i])) continue;
        if (c->checked) c->checked[i] = true;
        if (first < 0) first = gr;
        pointer(c, &decl, gr, false);
        if (piece) io_node(c, gr, false);
        const int64_t numel = N(c, gr)->numel, per = numel % 4 ? 1 : 4;
        segs[n] = (strbuf){ 0 };
        if (per == 4)
            sb_printf(&segs[n], "    {\n        const float4 v = tgk_load4(P%d + (g - %lldll) * 4);\n"
                                "        bad |= !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);\n    }\n",
                      gr, (long long)total);
        else
            sb_printf(&segs[n], "    bad |= !isfinite(P%d[g - %lldll]);\n", gr, (long long)total);
        total += numel / per;
        ends[n++] = total;
    }
    if (n > 0) {
        /* a piece: a bounded grid looping over its values (beside the chain it leaves room:
         * cuda_backend.c's leaves_room), noted as reading its gradients (io_root) */
        const int64_t threads = piece && total > CHECK_THREADS ? CHECK_THREADS : total;
        char head[200], tail[160];
        if (piece)
            snprintf(head, sizeof head, "    bool bad = false;\n    for (int64_t g = g0; g < %lldll; g += %lldll) {\n", (long long)total,
                     (long long)threads);
        else snprintf(head, sizeof head, "    bool bad = false;\n    if (g < %lldll) {\n", (long long)total);
        snprintf(tail, sizeof tail, "    }\n    if (__any_sync(0xffffffffu, bad) && threadIdx.x %% 32 == 0) *(float *)(H + %d) = NAN;\n",
                 c->flag_slot);
        if (piece) c->io_root = first;
        segments_kernel(c, p, name, &decl, segs, ends, n, first, threads, piece ? "g0" : "g", head, tail);
    }
    c->n_io = 0;
    c->io_root = -1;
    for (int k = 0; segs && k < n; k++) free(segs[k].s);
    free(segs);
    free(ends);
    free(decl.s);
}

/* The rest of the gradients, in kcheck */
static void grad_check_kernel(cg *c, cuda_plan *p) {
    c->kcheck_out = true;
    grad_check_emit(c, p, "kcheck", false, INT64_MAX);
}

/* Values a piece of the check takes at least (TG_CUDA_CHECK_PIECE; 0: kcheck alone checks all):
 * about a transformer layer's parameters. */
static int64_t check_piece_floats(void) {
    const char *env = getenv("TG_CUDA_CHECK_PIECE");
    return env ? atoll(env) : (int64_t)1 << 20;
}

/* Once node `upto` is computed: a piece of the check (kcheck0, kcheck1, ..) over the gradients
 * computed by then and not yet checked, where they are at least check_piece_floats(). */
static void grad_check_piece(cg *c, cuda_plan *p, int upto) {
    const tg_graph *g = c->g;
    const int64_t least = check_piece_floats();
    int64_t ready = 0;
    for (int i = 0; c->checked && least > 0 && i < g->n_params; i++) {
        int gr = g->grad_of_param[i];
        if (g->param_node[i] >= 0 && gr >= 0 && gr <= upto && !c->checked[i]) ready += N(c, gr)->numel;
    }
    if (least <= 0 || ready < least) return;
    char name[32];
    snprintf(name, sizeof name, "kcheck%d", c->n_check_pieces++);
    grad_check_emit(c, p, name, true, upto);
}

/* May the roots of this pointwise kernel (segment k: roots[firsts[k] .. firsts[k + 1])) replace
 * their leaves in place? All of them or none (the guard skips the whole kernel), and a root that
 * reads another's leaf reads it at its own element in the same segment (the same thread, before
 * that root's store). */
static bool inplace_group(const cg *c, const int *roots, const int *firsts, int n_segs) {
    const int n = firsts[n_segs];
    for (int r = 0; r < n; r++)
        if (!c->inplace || c->inplace_ok[roots[r]] < 0) return false;
    for (int sr = 0; sr < n_segs; sr++)
        for (int r = firsts[sr]; r < firsts[sr + 1]; r++)
            for (int sq = 0; sq < n_segs; sq++)
                for (int q = firsts[sq]; q < firsts[sq + 1]; q++) {
                    int dst = c->inplace_ok[roots[r]];
                    if (q == r || !cg_expr_reads(c, roots[q], roots[q], dst)) continue;
                    if (sq != sr || !plan_reads_same_index(c->g, c->mat, roots[q], roots[q], dst, true)) return false;
                }
    return true;
}

/* The head and the end of a kernel that replaces leaves: block 0's first thread reports the loss
 * and the flag beside each other (one copy for the host, as tg_writeback does), and in a failed
 * step marks it (the poison, which the steps queued behind it read) before every thread leaves.
 * The report is written last in a step that goes on. */
static void guard_head(const cg *c, strbuf *head, strbuf *tail) {
    const int f = c->flag_slot, loss = c->g->output;
    sb_printf(head, "    const float tgk_loss = P%d[0], tgk_flag = *(const float *)(H + %d);\n"
                    "    if (!isfinite(tgk_loss + tgk_flag + *(const float *)(H + %d))) {\n"
                    "        if (blockIdx.x == 0 && threadIdx.x == 0) {\n"
                    "            float *report = (float *)(H + %d);\n"
                    "            report[0] = tgk_loss, report[1] = tgk_flag;\n"
                    "            *(float *)(H + %d) = NAN;\n        }\n        return;\n    }\n",
              loss, f, f + 2, f + 1, f + 2);
    sb_printf(tail, "    if (blockIdx.x == 0 && threadIdx.x == 0) {\n        float *report = (float *)(H + %d);\n"
                    "        report[0] = P%d[0], report[1] = *(const float *)(H + %d);\n    }\n", f + 1, loss, f);
}

/* The root replacing leaf `leaf` in place in the kernel of these roots (c->aliased), or -1. Under
 * restrict the leaf's reads must go through a pointer based on the root's (its old value is read
 * where the new one is stored). Declared without restrict instead, the two made every pointer of
 * the kernel a possible alias: char_gpt's update loaded all of its 170 pointers up front, 255
 * registers and spills, eleven times slower (90 registers so, 64 copying back). */
static int replaced_by(const cg *c, const int *roots, int n_roots, int leaf) {
    for (int r = 0; c->aliased && r < n_roots; r++)
        if (c->inplace[roots[r]] == leaf) return roots[r];
    return -1;
}

/* The kernel k<roots[0]>: pointer declarations for every buffer the body read (plus extra ones)
 * and for its outputs, then the head, the body, the tail. `bounds`: its __launch_bounds__ (with a
 * block above 256 threads the compiler must fit a thread's registers to it, else the launch
 * fails), or "". */
static void end_kernel_roots(cg *c, const int *roots, int n_roots, const int *extra, int n_extra, const char *head,
                             const char *tail, const char *bounds) {
    strbuf decl = { 0 };
    for (int i = 0; i < n_extra; i++) c->used[extra[i]] = true;
    for (int r = 0; r < n_roots; r++) c->used[roots[r]] = false;
    for (int i = 0; i < c->g->n; i++)   /* each pointer declared is noted for the launch (io_node) */
        if (c->used[i] && replaced_by(c, roots, n_roots, i) < 0) {
            pointer(c, &decl, i, false);
            io_node(c, i, false);
        }
    for (int r = 0; r < n_roots; r++) {
        if (!cg_unplaced(c, roots[r])) pointer(c, &decl, roots[r], true);
        shadow_pointer(c, &decl, roots[r]);
        io_node(c, roots[r], true);
    }
    if (c->copy_written) {
        shadow_pointer(c, &decl, c->copy_by_sum);
        io_node(c, c->copy_by_sum, true);
    }
    c->io_root = roots[0];
    for (int i = 0; i < c->g->n; i++)   /* a leaf read where a root replaces it: through the root's own pointer */
        if (c->used[i] && replaced_by(c, roots, n_roots, i) >= 0)
            sb_printf(&decl, "    const float *P%d = P%d;\n", i, replaced_by(c, roots, n_roots, i));
    sb_printf(c->out, "extern \"C\" __global__ void %sk%d(float *A, void *const *B, const double *H) {\n    tgk_prior();\n%s%s%s%s}\n\n",
              bounds, roots[0], sb_str(&decl), head, sb_str(&c->body), tail);
    free(decl.s);
}

static void end_kernel(cg *c, const int *extra, int n_extra, const char *head, const char *tail) {
    end_kernel_roots(c, &c->root, 1, extra, n_extra, head, tail, "");
}

/* Do two nodes' buffers overlap in the arena? (Bound leaves live outside it.) */
static bool arena_overlap(const cg *c, int a, int b) {
    a = plan_home(c->plan, a);
    b = plan_home(c->plan, b);
    size_t oa = c->plan->offset[a], ob = c->plan->offset[b];
    if (oa == PLAN_BOUND || ob == PLAN_BOUND) return a == b;
    return oa < ob + (size_t)N(c, b)->numel && ob < oa + (size_t)N(c, a)->numel;
}

/* Can the roots so far share one kernel, a thread per element index i? Each thread then touches
 * index i of every output only, so it is race-free when no two outputs share memory and nothing
 * read from memory shares memory with an output (a later root of a segment reads an earlier one
 * from its register: the memo). Checked incrementally: the newest root against everything, the
 * buffers its expression newly reads against every root. */
typedef struct { const cg *c; const int *roots; int n_roots; bool *seen; } group;

static bool group_ok(void *ctx) {
    const group *gr = ctx;
    const cg *c = gr->c;
    int r = gr->roots[gr->n_roots - 1];
    for (int q = 0; q < gr->n_roots - 1; q++)
        if (arena_overlap(c, r, gr->roots[q])) return false;
    for (int u = 0; u < c->g->n; u++) {
        if (!c->used[u]) continue;
        if (arena_overlap(c, u, r)) return false;
        for (int q = 0; !gr->seen[u] && q < gr->n_roots - 1; q++)
            if (arena_overlap(c, u, gr->roots[q])) return false;
    }
    return true;
}

/* Adds root r to the kernel if it is race-free there. */
static bool join(cg *c, group *gr, int *roots, int r) {
    roots[gr->n_roots++] = r;
    if (!cg_try_root(c, r, group_ok, gr)) {
        gr->n_roots--;
        return false;
    }
    shadow_store(c, r, "i");
    memcpy(gr->seen, c->used, sizeof(bool) * (size_t)c->g->n);
    return true;
}

#define MAX_ROOTS 512

void cuda_refine(const tg_graph *g, const int *keep, int n_keep, bool *materialized) {
    int *uses = tg_alloc(sizeof(int) * (size_t)(g->n + 1));
    if (!uses) return;   /* the plainer schedule is as valid */
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].nsrc; k++) uses[g->nodes[i].src[k]]++;
    for (int k = 0; k < n_keep; k++)
        if (keep[k] >= 0) uses[keep[k]] += 2;
    for (int k = 0; k < g->n_assigns; k++) uses[g->assigns[k].src] += 2;
    for (int i = 0; i < g->n; i++) {
        const tg_node *n = &g->nodes[i];
        if (n->op != OP_SUM || !materialized[i]) continue;
        int lo = n->axis, hi = n->axis, x = n->src[0], count = 1;
        for (; g->nodes[x].op == OP_SUM && !materialized[x]; x = g->nodes[x].src[0], count++) {
            lo = g->nodes[x].axis < lo ? g->nodes[x].axis : lo;
            hi = g->nodes[x].axis > hi ? g->nodes[x].axis : hi;
        }
        const tg_node *s = &g->nodes[x];
        bool apart = s->axis != lo - 1 && s->axis != hi + 1;   /* the axes must stay one block */
        if (s->op == OP_SUM && materialized[x] && uses[x] == 1 && !apart && s->axis != n->axis) materialized[x] = false;
    }
    free(uses);
}

/* Ops whose readers read their source where it lies (a view, not a kernel of their own). */
static bool views(tg_op op) {
    return op == OP_RESHAPE || op == OP_PERMUTE || op == OP_EXPAND || op == OP_SLICE || op == OP_IDENTITY;
}

/* Do the readers of node id, through reshapes, permutes and slices, take its value as a bf16
 * activation: element-wise kernels and sums (through the expression engine), products and
 * attention (through its rounded copy)? Not softmax, which reads its source's f32 buffer (or
 * computes its source itself): a product whose output it reads would need a rounding pass. */
static bool read_as_bf16(const tg_graph *g, int id, int depth) {
    for (int i = id + 1; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].nsrc; k++) {
            if (g->nodes[i].src[k] != id) continue;
            tg_op op = g->nodes[i].op;
            if (views(op) ? depth > 8 || !read_as_bf16(g, i, depth + 1)
                     : !(fuse_pointwise(op) || op == OP_SUM || op == OP_MATMUL || is_attention(op)))
                return false;
        }
    return true;
}

/* Is node id, through reshapes, permutes and slices, an operand of a product or of attention,
 * which read their operands from memory: does the value need a kernel that writes it? (Where
 * element-wise kernels and row kernels alone read a product's sum plus its bias, they add the
 * bias themselves, and an epilogue would only cost the product time.) */
static bool read_from_memory(const tg_graph *g, int id, int depth) {
    for (int i = id + 1; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].nsrc; k++) {
            if (g->nodes[i].src[k] != id) continue;
            tg_op op = g->nodes[i].op;
            if (views(op) ? depth < 8 && read_from_memory(g, i, depth + 1) : op == OP_MATMUL || is_attention(op)) return true;
        }
    return false;
}

/* The outputs an f32 or tf32 product needs for its bias to be folded: about a wave of 128 x 128
 * tiles (128 of them). cuBLASLt has no split-reduction algorithm with a bias epilogue, and a
 * product with fewer tiles than the GPU has SMs runs faster split (one H200, one binary,
 * alternating, TG_CUDA_FOLD=0 against the default: char_gpt_small's q, k and v, [1024 x 128]
 * outputs, 0.394 -> 0.402 ms a step at f32 and 0.345 -> 0.347 at tf32 when folded; char_gpt's,
 * [16384 x 384], 22.29 -> 22.17 and 10.10 -> 9.87). */
#define FOLD_FULL_OUTPUTS (128 * 128 * 128)

/* Would the add `id` of product p and addend b (graph_product_addend's at bf16, graph_product_bias's
 * at f32 and tf32) be folded: a product cuBLAS or our product kernels run (not one computed
 * inline), over one batch, neither kept; a bias a leaf (at bf16 kleaves rounds it); at bf16 also a
 * matrix that another product cuBLAS writes in bf16 (`nodes`: the graph's so far, a folded sum
 * among them), and the sum read as bf16 values; at f32 and tf32 a sum that a product or attention
 * reads, of `full` outputs or more? */
static bool foldable(const tg_graph *g, const tg_node *nodes, int id, int p, int b, const int *keep, int n_keep,
                     bool inline_small, int64_t full) {
    for (int k = 0; k < n_keep; k++)
        if (keep[k] == p || keep[k] == id) return false;
    cg_gemm m = cg_gemm_of(g, p);
    free(m.aoff);
    free(m.boff);
    const bool bf = g->precision == TG_PRECISION_BF16, bias = g->nodes[b].numel < g->nodes[id].numel;
    bool addend_ok = bias ? cg_is_bound(g->nodes[b].op)
                          : bf && nodes[b].op == OP_MATMUL && (nodes[b].nsrc > 2 || !(inline_small && fuse_small_reduction(g, b)));
    return m.batch == 1 && !(inline_small && fuse_small_reduction(g, p)) && addend_ok &&
           (bf ? read_as_bf16(g, id, 0) : m.M * m.N >= full && read_from_memory(g, id, 0));
}

/* At bf16 the products whose sums are bf16 activations (graph_product_addend); at f32 and tf32
 * those whose only reader adds a bias (f32 sums: the epilogue, cuBLASLt's or our product
 * kernels', computes what the add did). TG_CUDA_FOLD=0 folds nothing (A/B runs, tests), =all
 * every such product whatever its size (tests, whose products are small). */
tg_graph *cuda_fold_addends(const tg_graph *g, const int *keep, int n_keep, bool inline_small) {
    const bool bf = g->precision == TG_PRECISION_BF16;
    const char *fold = getenv("TG_CUDA_FOLD");
    const int64_t full = fold && strcmp(fold, "all") == 0 ? 0 : FOLD_FULL_OUTPUTS;
    bool *bf16 = NULL;
    int *uses = NULL;
    if ((fold && fold[0] == '0') || (bf && (!graph_bf16_values(g, &bf16) || !bf16))) return NULL;
    if (!bf && (uses = tg_alloc(sizeof(int) * (size_t)(g->n + 1)))) graph_uses(g, uses);
    tg_graph *f = tg_alloc(sizeof *f);
    tg_node *nodes = tg_alloc(sizeof(tg_node) * (size_t)(g->n + 1));
    int folded = 0;
    for (int i = 0; f && nodes && (bf || uses) && i < g->n; i++) {
        nodes[i] = g->nodes[i];
        int p = bf ? graph_product_addend(g, bf16, i) : graph_product_bias(g, uses, i);
        int b = p < 0 ? -1 : g->nodes[i].src[g->nodes[i].src[0] == p];
        if (p < 0 || !foldable(g, nodes, i, p, b, keep, n_keep, inline_small, full)) continue;
        tg_node *n = &nodes[i];   /* the add's node, shape and name; the product's sources and transposes */
        n->op = OP_MATMUL;
        n->nsrc = 3;
        n->src[0] = g->nodes[p].src[0];
        n->src[1] = g->nodes[p].src[1];
        n->src[2] = b;
        memcpy(n->iarg, g->nodes[p].iarg, sizeof n->iarg);
        n->axis = g->nodes[p].axis;
        folded++;
    }
    free(uses);
    bool *after = NULL, kept = folded && f && nodes;
    if (kept && bf) {   /* each folded product is a bf16 activation, as the add was (not one only sums read) */
        *f = *g;
        f->nodes = nodes;
        kept = graph_bf16_values(f, &after) && after;
        for (int i = 0; kept && i < g->n; i++)
            if (nodes[i].op != g->nodes[i].op && !after[i]) nodes[i] = g->nodes[i];
    }
    free(bf16);
    free(after);
    if (!kept) {   /* nothing folded, or out of memory: g as it is */
        free(nodes);
        free(f);
        return NULL;
    }
    *f = *g;
    f->nodes = nodes;
    return f;
}

void cuda_fold_free(tg_graph *f) {
    if (!f) return;
    free(f->nodes);
    free(f);
}

void cuda_kernel_runs(const tg_graph *g, const bool *materialized, const int *alias, int *live_until) {
    int start = -1, count = 0;
    for (int i = 0; i < g->n; i++) live_until[i] = -1;
    for (int i = 0; i <= g->n; i++) {
        tg_op op = i < g->n ? g->nodes[i].op : OP_COUNT;
        bool point = i < g->n && materialized[i] && alias[i] < 0 && (fuse_pointwise(op) || op == OP_SUM);
        bool other = i < g->n && materialized[i] && alias[i] < 0 && !point;
        if (point && start >= 0 && count < MAX_ROOTS) {   /* the run goes on */
            count++;
            continue;
        }
        if ((point || other || i == g->n) && start >= 0) {   /* the run [start, i) ends */
            int end = start;
            for (int j = start; j < i; j++)
                if (materialized[j] && alias[j] < 0) end = j;
            for (int j = start; j < i; j++) live_until[j] = end;
            start = -1;
        }
        if (point) {
            start = i;
            count = 1;
        }
    }
}

static bool sum_producer(const cg *c, int a, int b);

/* How many of order[] a kernel of several nodes may take: not a node without a buffer that the
 * sum right after it computes (sum_kernel's producer: nothing else could read it). order[0]
 * stays: the caller offered it to the sum first. */
static int before_sum_producer(const cg *c, const int *order, int n_order) {
    int n = 1;
    while (n + 1 < n_order && !(cg_unplaced(c, order[n]) && sum_producer(c, order[n], order[n + 1]))) n++;
    return n + 1 < n_order ? n : n_order;
}

/* Vector lanes (cg.lanes): lane `lane` of `lanes` consecutive elements from flat index `base`,
 * its index variable defined for lanes after the first. */
static void lane_begin(cg *c, const char *it, const char *base, int lanes, int lane) {
    c->lanes = lanes;
    c->lane = lane;
    c->n_memo = 0;
    if (lane == 0) {
        c->n_vec = 0;
        snprintf(c->lane_base, NAME, "%s", base);
        snprintf(c->lane_ix, NAME, "%s", base);
    } else {
        cg_def(c, c->lane_ix, "i", it, "%s + %d", base, lane);
    }
}

/* The type of a kernel's own coordinates (row, column, place in a row) where its flat index type
 * is `it`: int where that is 32 bits. With 64-bit coordinates every element's index was an
 * emulated 64-bit multiply-add: char_gpt's GELU backward with its bias gradient took 89.6 us, 78.0
 * in int, the layer norm's weight gradients 20.7 and 17.2 (bf16, H100, each kernel alone; the
 * step 6.357 -> 6.315 ms). Signed: a coordinate may enter a subtraction (a slice's offset). */
static const char *head_type(const char *it) { return strcmp(it, "uint32_t") == 0 ? "int" : "int64_t"; }

/* Lane k reads element o * L + j + k (flat index ix) as row o's (cg.row; o an expression:
 * r in a row kernel, (o * len + k) in a column sum): the other coordinates of a value read there
 * are functions of o alone, which the compiler hoists out of the loop, where dividing them out of
 * the flat index cost every element several divisions (a layer norm's backward reads four
 * per-row values an element; a bias gradient's producer its bias). Off with L 0. */
static void row_lane(cg *c, int64_t L, const char *ix, const char *o, int k) {
    c->row = L;
    snprintf(c->row_ix, NAME, "%s", L ? ix : "");
    snprintf(c->row_o, NAME, "%s", L ? o : "");
    if (L && k) snprintf(c->row_u, NAME, "(j + %d)", k);
    else snprintf(c->row_u, NAME, "%s", L ? "j" : "");
}

/* Lane `lane`'s value of root r (c->root becomes r), which later roots of the lane read from the
 * memo; copied into v. */
static void lane_root(cg *c, int r, char *v) {
    char key[NAME + 1];
    snprintf(key, sizeof key, "f%s", c->lane_ix);
    c->root = r;
    snprintf(v, NAME, "%s", cg_root_value(c, c->lane_ix));
    cg_memo_add(c, r, key, v);
}

/* "*(float4 *)(<p><id> + at) = make_float4(x0, x1, x2, x3);", or float2 of two, or one */
static void store_floats(cg *c, char p, int id, const char *at, int lanes, char (*x)[NAME + 20]) {
    if (lanes > 1 && p == 'P' && c->inplace_ok && c->inplace_ok[id] >= 0) {   /* maybe a leaf's (cg.inplace): unaligned */
        if (lanes == 4) cg_line(c, "tgk_store4(P%d + %s, make_float4(%s, %s, %s, %s));", id, at, x[0], x[1], x[2], x[3]);
        else cg_line(c, "tgk_store2(P%d + %s, make_float2(%s, %s));", id, at, x[0], x[1]);
        return;
    }
    if (lanes == 1) cg_line(c, "%c%d[%s] = %s;", p, id, at, x[0]);
    else if (lanes == 4) cg_line(c, "*(float4 *)(%c%d + %s) = make_float4(%s, %s, %s, %s);", p, id, at, x[0], x[1], x[2], x[3]);
    else cg_line(c, "*(float2 *)(%c%d + %s) = make_float2(%s, %s);", p, id, at, x[0], x[1]);
}

/* Node id's rounded copy of values v[0..lanes) stored from flat index `at` as one vector (eight
 * lanes: bf16 only, a pointwise kernel's root kept in bf16 alone) */
static void shadow_lanes(cg *c, int id, char (*v)[NAME], int lanes, const char *at) {
    char x[4][NAME + 20];
    if (c->g->precision != TG_PRECISION_BF16 || lanes == 1) {
        for (int k = 0; k < lanes; k++) snprintf(x[k], sizeof x[k], "%s(%s)", round_fn(c), v[k]);
        store_floats(c, 'S', id, at, lanes, x);
    } else if (lanes == 2) {
        cg_line(c, "*(unsigned *)(S%d + %s) = tgk_pack_bf16(%s, %s);", id, at, v[0], v[1]);
    } else if (lanes == 4) {
        cg_line(c, "*(uint2 *)(S%d + %s) = make_uint2(tgk_pack_bf16(%s, %s), tgk_pack_bf16(%s, %s));", id, at, v[0], v[1],
                v[2], v[3]);
    } else {
        cg_line(c, "*(uint4 *)(S%d + %s) = make_uint4(tgk_pack_bf16(%s, %s), tgk_pack_bf16(%s, %s), tgk_pack_bf16(%s, %s), "
                   "tgk_pack_bf16(%s, %s));", id, at, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
    }
}

/* Root id's values v[0..lanes) stored from flat index `at` as one vector, and its rounded copy
 * as another (bf16: pairs packed by tgk_pack_bf16). */
static void lane_stores(cg *c, int id, char (*v)[NAME], int lanes, const char *at) {
    char x[MAX_LANES][NAME + 20];
    for (int k = 0; k < lanes; k++) snprintf(x[k], sizeof x[k], "%s", v[k]);
    if (!cg_unplaced(c, id)) store_floats(c, 'P', id, at, lanes, x);
    for (int k = 0; k < lanes && c->wb_check && c->wb_check[id]; k++) cg_line(c, WB_CHECK_LINE, v[k], c->flag_slot, id);
    if (has_shadow(c, id)) shadow_lanes(c, id, v, lanes, at);
}

/* LANES, or TG_CUDA_LANES (1, 2 or 4), which also forces that many on every column sum whose
 * width allows it (*forced): for tests of each path, and A/B runs */
static int lanes_wanted(bool *forced) {
    const char *e = getenv("TG_CUDA_LANES");
    int l = e ? atoi(e) : LANES;
    if (forced) *forced = e != NULL;
    return l == 2 || l == 4 ? l : 1;
}

/* Are the nodes floats (what lane_stores stores)? */
static bool floats(const cg *c, const int *ids, int n) {
    for (int r = 0; r < n; r++)
        if (ids[r] >= 0 && N(c, ids[r])->dtype != TG_FLOAT32) return false;
    return true;
}

/* Does a kernel of roots[0..n) store their bf16 copies alone? Then eight lanes make 16-byte
 * stores, and the loads of bf16 sources 16 bytes too (a float source's lanes each load their
 * own): char_gpt's GELU (25 M values) took 33.8 us
 * alone in groups of four, 29.8 in groups of eight, a 16-byte copy of its bytes 27.1
 * (bench/cuda/pointwise_kernel, bench/logs/gpu_h200_s34_d_*). */
static bool bf16_only(const cg *c, const int *roots, int n) {
    if (c->g->precision != TG_PRECISION_BF16) return false;   /* tf32's rounded copies are floats */
    for (int r = 0; r < n; r++)
        if (!cg_unplaced(c, roots[r])) return false;
    return n > 0;
}

/* The flat index type of a kernel over `numel` elements of each of roots[0..n): 32 bits where
 * every root's allows it (cg_index_type). */
static const char *roots_index_type(const cg *c, const int *roots, int n, int64_t numel) {
    for (int r = 0; r < n; r++)
        if (strcmp(cg_index_type(c, roots[r], numel), "uint32_t") != 0) return "int64_t";
    return "uint32_t";
}

/* The body of a pointwise kernel's segment (its roots chosen) again, for `lanes` consecutive
 * elements a thread from index i: each lane computes every root in turn, then each root and its
 * rounded copy are stored as vectors. */
static strbuf lane_body(cg *c, const int *roots, int n_roots, int lanes) {
    const char *it = roots_index_type(c, roots, n_roots, N(c, roots[0])->numel);
    char (*v)[MAX_LANES][NAME] = tg_alloc(sizeof *v * (size_t)n_roots);
    strbuf code = { 0 };
    c->body.len = 0;
    if (c->body.s) c->body.s[0] = 0;
    if (!v) return code;   /* out of memory: the source is discarded (alloc_failures) */
    for (int k = 0; k < lanes; k++) {
        lane_begin(c, it, "i", lanes, k);
        for (int r = 0; r < n_roots; r++) lane_root(c, roots[r], v[r][k]);
    }
    c->lanes = 0;
    for (int r = 0; r < n_roots; r++) lane_stores(c, roots[r], v[r], lanes, "i");
    free(v);
    sb_printf(&code, "%s", sb_str(&c->body));
    return code;
}

/* ----- segments that share their code -----
 * An optimizer's update is one kernel with a segment per parameter (pointwise_kernel), and the
 * segments differ only in the buffers they name. Inlined, char_gpt's 77 segments were 508 KB of
 * source that NVRTC took 4.1 s over, the longest wait of its cold compile (compile_parts runs the
 * parts in parallel, but a kernel is compiled whole). Segments alike call one function instead:
 * a template over their pointers' types, not inlined, so compiled once: 73 KB, 0.3 s. Its
 * pointers are not __restrict__: an update in place reads and writes one buffer through two. */

typedef struct { char (*name)[NAME]; int n, cap; } names;

/* The index of s[0..len) in l, added if new; -1 when memory runs out. */
static int name_index(names *l, const char *s, int len) {
    for (int i = 0; i < l->n; i++)
        if (strncmp(l->name[i], s, (size_t)len) == 0 && l->name[i][len] == 0) return i;
    if (len >= NAME) return -1;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char (*grown)[NAME] = tg_realloc(l->name, sizeof *grown * (size_t)cap);
        if (!grown) return -1;
        l->name = grown;
        l->cap = cap;
    }
    memcpy(l->name[l->n], s, (size_t)len);
    l->name[l->n][len] = 0;
    return l->n++;
}

static bool ident_char(char x) { return (x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z') || (x >= '0' && x <= '9') || x == '_'; }

/* A segment's code with its pointers (P or S and a number: the kernel's buffers) renamed p0, p1,
 * ... in order of first use, their names kept in *ptrs, and its temporaries (another letter and a
 * number) renamed alike: segments whose canonical code is the same compute the same thing on other
 * buffers. False where the code names the kernel's own variables (A, B, g, tgk_ values of its
 * head), which a function would not see, or memory ran out. */
static bool canonical(const char *code, strbuf *out, names *ptrs) {
    names temps = { 0 };
    bool ok = true;
    const char *s = code, *copied = code;
    while (*s && ok) {
        if (!ident_char(*s)) {
            s++;
            continue;
        }
        const char *t = s;
        while (ident_char(*s)) s++;
        const int len = (int)(s - t);
        if (t[0] >= '0' && t[0] <= '9') continue;   /* a number, suffix and all (6240ll) */
        int digits = 1;
        while (digits < len && t[digits] >= '0' && t[digits] <= '9') digits++;
        if ((len == 1 && (t[0] == 'A' || t[0] == 'B' || t[0] == 'g')) || (strncmp(t, "tgk_", 4) == 0 && *s != '(')) ok = false;
        if (len == 1 || digits < len) continue;   /* i, H, a function's name */
        sb_printf(out, "%.*s", (int)(t - copied), copied);
        const bool ptr = t[0] == 'P' || t[0] == 'S';
        const int at = name_index(ptr ? ptrs : &temps, t, len);
        ok = at >= 0;
        if (ptr) sb_printf(out, "p%d", at);
        else sb_printf(out, "%c_%d", t[0], at);
        copied = s;
    }
    sb_printf(out, "%s", copied);
    free(temps.name);
    return ok && !out->oom;
}

/* Segment k's code from its body (i: its first element, of type its[k], from first[k]), for
 * kernel k<kernel>: the body in a block of its own, or, where another segment's body is the same
 * but for its names (canonical), a call of the function they share, defined in *fns. */
static void share_segments(int kernel, strbuf *segs, const char **its, char (*first)[60], int n, strbuf *fns) {
    strbuf *canon = tg_alloc(sizeof *canon * (size_t)n);
    names *ptrs = tg_alloc(sizeof *ptrs * (size_t)n);
    int *same = tg_alloc(sizeof *same * (size_t)n), *uses = tg_alloc(sizeof *uses * (size_t)n), *fn = tg_alloc(sizeof *fn * (size_t)n);
    bool *ok = tg_alloc(sizeof *ok * (size_t)n);
    const bool mem = canon && ptrs && same && uses && fn && ok;   /* else each inlined */
    int n_fns = 0;
    for (int k = 0; k < n && mem; k++) {
        ok[k] = canonical(sb_str(&segs[k]), &canon[k], &ptrs[k]);
        same[k] = k;
        for (int j = 0; j < k && ok[k] && same[k] == k; j++)
            if (ok[j] && same[j] == j && strcmp(its[j], its[k]) == 0 && strcmp(sb_str(&canon[j]), sb_str(&canon[k])) == 0) same[k] = j;
        uses[same[k]]++;
    }
    for (int k = 0; k < n; k++) {
        strbuf body = segs[k];
        segs[k] = (strbuf){ 0 };
        const int r = mem && ok[k] ? same[k] : -1;
        if (r >= 0 && uses[r] > 1) {
            if (r == k) {
                fn[k] = n_fns++;
                sb_printf(fns, "template <");
                for (int q = 0; q < ptrs[k].n; q++) sb_printf(fns, "%sclass T%d", q ? ", " : "", q);
                sb_printf(fns, "> static __device__ __noinline__ void tgs%d_%d(const double *H, %s i", kernel, fn[k], its[k]);
                for (int q = 0; q < ptrs[k].n; q++) sb_printf(fns, ", T%d p%d", q, q);
                sb_printf(fns, ") {\n%s}\n", sb_str(&canon[k]));
            }
            sb_printf(&segs[k], "        tgs%d_%d(H, (%s)(%s)", kernel, fn[r], its[k], first[k]);
            for (int q = 0; q < ptrs[k].n; q++) sb_printf(&segs[k], ", %s", ptrs[k].name[q]);
            sb_printf(&segs[k], ");\n");
        } else {
            sb_printf(&segs[k], "    {\n        const %s i = (%s)(%s);\n%s    }\n", its[k], its[k], first[k], sb_str(&body));
        }
        free(body.s);
    }
    for (int k = 0; k < n && mem; k++) {
        free(canon[k].s);
        free(ptrs[k].name);
    }
    free(canon);
    free(ptrs);
    free(same);
    free(uses);
    free(fn);
    free(ok);
}

/* One kernel for the pointwise node order[0] and as many of the pointwise nodes after it in
 * order[] as can join it race-free (group_ok). Nodes of one size form a segment (a thread per
 * element, later roots reading earlier ones from registers); segments of other sizes follow in
 * the same kernel, each over its own range of thread indices (segment_tree). A whole optimizer
 * update, every parameter's m, v and new value, is then one launch. Returns how many of order[]
 * it took. */
static int pointwise_kernel(cg *c, cuda_plan *p, const int *order, int n_order) {
    int roots[MAX_ROOTS], firsts[MAX_ROOTS + 1];   /* segment k's roots: roots[firsts[k] .. firsts[k + 1]) */
    const char *its[MAX_ROOTS];
    group gr = { c, roots, 0, tg_alloc(sizeof(bool) * (size_t)(c->g->n + 1)) };
    strbuf *segs = tg_alloc(sizeof(strbuf) * MAX_ROOTS);
    int64_t *ends = tg_alloc(sizeof(int64_t) * MAX_ROOTS), *sizes = tg_alloc(sizeof(int64_t) * MAX_ROOTS);
    if (!gr.seen || !segs || !ends || !sizes) {   /* out of memory: the source is discarded (alloc_failures) */
        free(gr.seen);
        free(segs);
        free(ends);
        free(sizes);
        return 1;
    }
    strbuf code = { 0 };
    int q = 0, n_segs = 0;
    int64_t total = 0;
    cg_begin(c, order[0]);
    n_order = before_sum_producer(c, order, n_order);
    while (q < n_order && fuse_pointwise(N(c, order[q])->op) && gr.n_roots < MAX_ROOTS) {
        int64_t numel = N(c, order[q])->numel;
        int first = gr.n_roots;
        c->n_memo = 0;   /* a segment's temporaries live in its own block */
        c->body.len = 0;
        if (c->body.s) c->body.s[0] = 0;
        if (gr.n_roots == 0) {   /* the first root: nothing to race with */
            roots[gr.n_roots++] = order[q];
            cg_root_line(c, order[q]);
            shadow_store(c, order[q], "i");
            memcpy(gr.seen, c->used, sizeof(bool) * (size_t)c->g->n);
        } else if (!join(c, &gr, roots, order[q])) {
            break;
        }
        for (q++; q < n_order && gr.n_roots < MAX_ROOTS; q++)
            if (!fuse_pointwise(N(c, order[q])->op) || N(c, order[q])->numel != numel || !join(c, &gr, roots, order[q])) break;
        its[n_segs] = roots_index_type(c, roots + first, gr.n_roots - first, numel);
        segs[n_segs] = (strbuf){ 0 };
        sb_printf(&segs[n_segs], "%s", sb_str(&c->body));
        firsts[n_segs] = first;
        sizes[n_segs++] = numel;
        total += numel;
    }
    firsts[n_segs] = gr.n_roots;
    /* One large segment: each thread takes ELEMS groups of LANES consecutive elements, the
     * groups a block apart, so that many loads are in flight together (one element a thread
     * leaves HBM idle while each thread waits on its loads), and wide: four bf16 values are
     * one 8-byte load (lane_body), eight in half the groups where it stores bf16 alone
     * (bf16_only). Several segments of as many elements in all (an optimizer's update of every
     * parameter): LANES elements a thread in each segment whose length divides by it (fewer, in
     * threads that each wait longer, where there is less work: sin_mlp's update of 4,353
     * parameters took 0.008 ms more). */
    int elems = 1, lanes = 1, want = getenv("TG_CUDA_ELEMS") ? atoi(getenv("TG_CUDA_ELEMS")) : ELEMS;   /* the variables: A/B runs */
    bool forced;
    int want_lanes = lanes_wanted(&forced);
    bool one = n_segs == 1 && total >= ELEMS_MIN, wide = want_lanes > 1 && (total >= ELEMS_MIN || forced) && floats(c, roots, gr.n_roots);
    if (one && want > 1 && want <= 16 && total % (BLOCK * want) == 0) elems = want;
    if (one && wide && total % (BLOCK * elems * want_lanes) == 0) lanes = want_lanes;
    if (lanes == 4 && elems % 2 == 0 && bf16_only(c, roots, gr.n_roots)) lanes = 8, elems /= 2;
    int64_t threads = 0;   /* thread g's segment: the first k with g < ends[k] */
    char (*first)[60] = tg_alloc(sizeof *first * (size_t)(n_segs + 1));
    strbuf fns = { 0 };   /* functions segments share */
    for (int k = 0; k < n_segs && first; k++) {
        /* its first element: g (one segment: the head makes g a group's first) or from the segment's first thread */
        int l = lanes > 1 ? lanes : wide && !one && sizes[k] % want_lanes == 0 ? want_lanes : 1;
        snprintf(first[k], sizeof first[k], "g");
        if (lanes == 1) snprintf(first[k], sizeof first[k], l > 1 ? "(g - %lldll) * %d" : "g - %lldll", (long long)threads, l);
        if (l > 1) {
            free(segs[k].s);
            segs[k] = lane_body(c, roots + firsts[k], firsts[k + 1] - firsts[k], l);
        }
        threads += sizes[k] / l;
        ends[k] = threads;
    }
    if (first) share_segments(roots[0], segs, its, first, n_segs, &fns);   /* else out of memory: discarded */
    free(first);
    const bool exact = elems * lanes > 1;   /* the launch covers every element once: no bound to test, and the
                                             * compiler may move each group's loads ahead of the others' work */
    if (!exact) sb_printf(&code, "    if (g < %lldll) {\n", (long long)threads);
    segment_tree(&code, segs, ends, 0, n_segs);
    if (!exact) sb_printf(&code, "    }\n");
    for (int k = 0; k < n_segs; k++) free(segs[k].s);
    free(segs);
    free(ends);
    free(sizes);
    char head[300];
    if (exact)
        snprintf(head, sizeof head, "    #pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                                    "    const int64_t g = ((int64_t)blockIdx.x * %d + u * %d + threadIdx.x) * %d;\n",
                 elems, BLOCK * elems, BLOCK, lanes);
    else
        snprintf(head, sizeof head, "    const int64_t g = (int64_t)blockIdx.x * %d + threadIdx.x;\n", BLOCK);
    c->body.len = 0;   /* the kernel's body: its segments */
    if (c->body.s) c->body.s[0] = 0;
    sb_printf(&c->body, "%s", sb_str(&code));
    free(code.s);
    c->root = roots[0];
    strbuf guarded = { 0 }, tail = { 0 };
    const bool inplace = inplace_group(c, roots, firsts, n_segs);
    sb_printf(&tail, "%s", exact ? "    }\n" : "");
    if (inplace) {
        if (!c->kcheck_out) grad_check_kernel(c, p);
        for (int r = 0; r < gr.n_roots; r++) c->inplace[roots[r]] = c->inplace_ok[roots[r]];
        guard_head(c, &guarded, &tail);
    }
    sb_printf(&guarded, "%s", head);
    c->aliased = inplace;
    if (fns.len) sb_printf(c->out, "%s%s\n", CUDA_FUNCTIONS_MARK, fns.s);
    free(fns.s);
    /* The update: four blocks an SM at most 64 registers. Its segments left NVRTC at 90, two blocks
     * an SM, too few loads in flight: char_gpt's bf16 update 105.8 -> 83.0 us (pointers spilled
     * once, read back at most once; bench/logs/gpu_h200_s39_b_*). */
    char bounds[40] = "";
    if (inplace) snprintf(bounds, sizeof bounds, "__launch_bounds__(%d, 4) ", BLOCK);
    end_kernel_roots(c, roots, gr.n_roots, inplace ? &c->g->output : NULL, inplace, sb_str(&guarded), sb_str(&tail), bounds);
    c->aliased = false;
    free(guarded.s);
    free(tail.s);
    kernel_launch(c, p, roots[0], exact ? total / elems / lanes : threads, BLOCK);
    free(gr.seen);
    return q;
}

/* Sums cut into chunks leave their partial sums past the plan's arena: SUM_COUNTERS counters
 * (zero when allocated, and left zero by every kernel that uses them), then the partials, as
 * doubles. Each kernel has scratch of its own, so that sums may run at once (cuda_backend.c's side
 * plan; char_gpt's 50 take about 6 MB). Returns where the counters are (in floats from the arena's
 * start), noting the first and the end. */
enum { SUM_COUNTERS = 1024 };
enum { Y = 32 };   /* a column sum's row groups: blocks of 32 x 32 threads */
enum { FLOAT_TERMS = 64 };   /* the most values a column sum's thread adds in float (sum_kernel_body) */

static size_t sum_scratch(cg *c, cuda_plan *p, int64_t partials) {
    if (!p->scratch_end) p->scratch_at = p->scratch_end = (c->plan->arena + 1) & ~(size_t)1;   /* doubles aligned */
    const size_t at = p->scratch_end;
    p->scratch_end = at + SUM_COUNTERS + 2 * (size_t)partials;
    io_span(c, at, (int64_t)(p->scratch_end - at), true);
    return at;
}

/* Sum id's source past the sums it absorbed (returned), as [outer, len, inner] around the axes
 * summed. */
static int split_of(const tg_graph *g, const bool *mat, int id, int64_t *outer, int64_t *len, int64_t *inner) {
    int lo, hi, x = sum_source(g, mat, id, &lo, &hi);
    const tg_node *s = &g->nodes[x];
    *outer = *len = *inner = 1;
    for (int k = 0; k < s->shape.ndim; k++) *(k < lo ? outer : k <= hi ? len : inner) *= s->shape.d[k];
    return x;
}

static int sum_split(const cg *c, int id, int64_t *outer, int64_t *len, int64_t *inner) { return split_of(c->g, c->mat, id, outer, len, inner); }

/* Does node b sum as many rows of as many columns as sum a (whose source has `numel` elements,
 * split [outer, len, inner]), in a's dtype? Its source, or -1. */
static int sum_alike(const tg_graph *g, const bool *mat, int a, int b, int64_t outer, int64_t len, int64_t inner, int64_t numel) {
    int64_t bo, bl, bi;
    if (g->nodes[b].op != OP_SUM || g->nodes[b].dtype != g->nodes[a].dtype) return -1;
    int xb = split_of(g, mat, b, &bo, &bl, &bi);
    return bo == outer && bl == len && bi == inner && g->nodes[xb].numel == numel ? xb : -1;
}

enum { MAX_SIBLINGS = 4 };   /* sums over the same rows that one column-sum kernel computes */

/* With sum b's line in the body: does the kernel computing sums[0..n) (and the producer, or -1)
 * stay race-free with b in it? Nothing it reads may share memory with what it writes, and b
 * must not read the others' results. */
static bool sibling_ok(const cg *c, const int *sums, int n, int producer, int b) {
    if (producer >= 0 && arena_overlap(c, b, producer)) return false;
    for (int s = 0; s < n; s++)
        if (arena_overlap(c, b, sums[s])) return false;
    for (int u = 0; u < c->g->n; u++) {
        if (!c->used[u]) continue;
        if (arena_overlap(c, u, b) || (producer >= 0 && u != producer && arena_overlap(c, u, producer))) return false;
        for (int s = 0; s < n; s++)
            if (arena_overlap(c, u, sums[s])) return false;
    }
    return true;
}

/* How a column sum of `outs` columns over `len` rows, `lanes` columns a thread, is cut: blocks of
 * 32 x lanes columns, each column's rows in `chunks` (grid y). A thread sums at most 8 rows in one
 * pass with no chunks: the chunks' last block costs a fence, an atomic and a second read (on an
 * H100, one sum a launch: [256, 64] 3.5 us in 4 chunks, 2.4 in one pass; [128, 512] 3.6 and 2.0).
 * Where one pass is not enough, at most 16 rows a thread (enough loads in flight), and down to 2
 * while the blocks would not fill the GPU twice over (264: two per SM of an H100). Measured on
 * whole steps: at most 8 costs char_gpt 4%, 32 gains nothing; down to 4 costs char_gpt_small
 * 1-2% (its sums compute their producers), though a bare sum of [1024, 512] is faster so. Then
 * the chunks are trimmed to whole waves of 264 blocks (a last wave part full runs at part of the
 * bandwidth): char_gpt's [16384, 384] sums in 22 chunks of 24 rows a thread, not 32 of 16, took
 * its bf16 step from 7.48 to 7.29 ms (H100; 44 chunks, two whole waves: 7.62). Returns the
 * rows a thread sums. */
static int64_t column_plan(int64_t outs, int64_t len, int lanes, int64_t *blocks, int64_t *chunks) {
    int64_t per = (len + Y - 1) / Y;
    *blocks = (outs + 32 * lanes - 1) / (32 * lanes);
    *chunks = 1;
    bool split = per > 8;
    while (split && *blocks <= SUM_COUNTERS && per > 2 && (per > 16 || *blocks * *chunks < 264)) {
        *chunks *= 2;
        per = (len + *chunks * Y - 1) / (*chunks * Y);
    }
    if (*chunks > 1 && *blocks * *chunks > 264 && *blocks * *chunks % 264) {   /* whole waves */
        int64_t c = *blocks * *chunks / 264 * 264 / *blocks;
        if (c >= 2) {
            *chunks = c;
            per = (len + *chunks * Y - 1) / (*chunks * Y);
        }
    }
    return per;
}

/* A column sum kernel's body again (sum_kernel) for `lanes` neighbouring columns a thread: from
 * f = (o * len + k) * inner + j, j a multiple of lanes, lane v adds element f + v of sum q's
 * source srcs[q] into acc<q lanes + v> (its producer prods[q] instead, computed and stored here,
 * where it has one; the rounded copy sum_copy_store writes, stored as a vector too). */
static void sum_lanes(cg *c, const char *it, int64_t len, int64_t inner, const int *sums, const int *srcs, const int *prods,
                      int n_sums, int lanes) {
    char base[NAME], v[MAX_SIBLINGS][4][NAME];
    c->body.len = 0;
    if (c->body.s) c->body.s[0] = 0;
    c->n_memo = 0;
    cg_def(c, base, "f", it, "(%s)((o * %lld + k) * %lld + j)", it, (long long)len, (long long)inner);
    char o[NAME];
    snprintf(o, sizeof o, "(o * %lld + k)", (long long)len);
    int copy = -1;   /* the sum whose source's rounded copy it stores (sum_copy_store) */
    for (int k = 0; k < lanes; k++) {
        lane_begin(c, it, base, lanes, k);
        row_lane(c, inner, c->lane_ix, o, k);
        for (int q = 0; q < n_sums; q++) {
            if (prods[q] >= 0) lane_root(c, prods[q], v[q][k]);
            else snprintf(v[q][k], NAME, "%s", cg_value(c, srcs[q], c->lane_ix));
            if (prods[q] < 0 && sums[q] == c->copy_sum && plan_home(c->plan, srcs[q]) == c->copy_by_sum) copy = q;
            cg_line(c, "acc%d += %s;", q * lanes + k, v[q][k]);
        }
    }
    c->lanes = 0;
    row_lane(c, 0, "", "", 0);
    for (int q = 0; q < n_sums; q++)
        if (prods[q] >= 0) lane_stores(c, prods[q], v[q], lanes, base);
    if (copy >= 0) {
        shadow_lanes(c, c->copy_by_sum, v[copy], lanes, base);
        c->copy_written = true;
    }
}

/* Are the kernel's outputs outs[0..n) race-free: none sharing memory with another or with a
 * buffer the kernel reads? */
static bool outputs_apart(const cg *c, const int *outs, int n) {
    for (int a = 0; a < n; a++) {
        for (int b = 0; b < a; b++)
            if (arena_overlap(c, outs[a], outs[b])) return false;
        for (int u = 0; u < c->g->n; u++)
            if (c->used[u] && arena_overlap(c, u, outs[a])) return false;
    }
    return true;
}

/* How far ahead in kernel order a sum may be brought forward. One launch less: char_gpt_small's
 * three [1024, 128] sums as one kernel, bf16 0.332 -> 0.321 ms a step on an H100; char_gpt's k
 * and v bias gradients ([16384, 384]; q's makes dq's rounded copy, in a kernel of its own), first slower
 * on an H100 (8.20 -> 8.24 ms, before the side stream and the layer norm's sums in its row
 * kernel), now faster on an H200: bf16 4.476 / 4.434 -> 4.428 / 4.425, tf32 8.447 -> 8.360
 * (bench/logs/gpu_h200_s39_f_*). */
enum { FAR_WINDOW = 24 };

/* Where sum b is copy_sum (sum_copying) and x, its source, is copy_by_sum: the copy stored from
 * v, the value read at flat (the sum reads every element once). Whether it stored it. */
static bool sum_copy_store(cg *c, int b, int x, const char *flat, const char *v) {
    if (b != c->copy_sum || plan_home(c->plan, x) != c->copy_by_sum) return false;
    cg_line(c, "S%d[%s] = %s(%s);", c->copy_by_sum, flat, round_fn(c), v);
    return c->copy_written = true;
}

/* A sum further on (next[q], with its producer next[q - 1] where it has one) that sums as many
 * rows of as many columns, brought into this kernel (first node i0) with its line as sum n_sums:
 * one launch for the bias gradients of q, k and v after an attention's backward, which the
 * gradient's order puts between their products (q's also writes dq's rounded copy, sum_copy_store:
 * char_gpt bf16 4.443 -> 4.428 ms a step, char_gpt_small 0.227 -> 0.220; bench/logs/gpu_h200_s39_g_*). Only where the plan placed its buffers from
 * step i0 on (cuda_sums_early's `born`: nothing live in between shares their memory) and
 * everything it reads was computed before i0. Returns its producer, -1 for none, -2 when it does
 * not join (nothing emitted). */
static int far_sibling(cg *c, const int *next, const bool *done, int q, const char *flat, int i0, int *roots, int n_roots,
                       int n_sums, bool *before, int *src) {
    int b = next[q], pb = q > 0 && !done[q - 1] && sum_producer(c, next[q - 1], b) ? next[q - 1] : -1;
    *src = -1;
    if (c->plan->born[b] != i0 || (pb >= 0 && c->plan->born[pb] != i0)) return -2;
    size_t body_len = c->body.len;
    int n_memo = c->n_memo, root = c->root;
    memcpy(before, c->used, sizeof(bool) * (size_t)c->g->n);
    const char *v;
    bool copied = false;
    if (pb >= 0) {
        c->root = pb;
        v = cg_root_value(c, flat);
        if (!cg_unplaced(c, pb)) cg_line(c, "P%d[%s] = %s;", pb, flat, v);
        shadow_store(c, pb, flat);
        c->root = root;
    } else {
        int lo, hi;
        const int x = *src = sum_source(c->g, c->mat, b, &lo, &hi);
        v = cg_value(c, x, flat);
        copied = sum_copy_store(c, b, x, flat, v);
    }
    cg_line(c, "acc%d += %s;", n_sums, v);
    bool ok = true;
    for (int u = 0; u < c->g->n && ok; u++)
        ok = !c->used[u] || before[u] || home_of(c->plan->alias, u) < i0 || cg_is_bound(N(c, u)->op);   /* read: computed before */
    roots[n_roots] = b;
    if (pb >= 0) roots[n_roots + 1] = pb;
    if (ok && outputs_apart(c, roots, n_roots + 1 + (pb >= 0))) return pb;
    c->body.len = body_len;
    c->body.s[body_len] = 0;
    c->n_memo = n_memo;
    memcpy(c->used, before, sizeof(bool) * (size_t)c->g->n);
    if (copied) c->copy_written = false;
    return -2;
}

/* Is node x's value at hand before step i0: a leaf, computed before it (an alias: its home, as
 * attention's gradients reshaped), or computed inline from such (within a few steps of
 * inlining)? */
static bool ready_before(const tg_graph *g, const bool *mat, const int *alias, int x, int i0, int depth) {
    if (cg_is_bound(g->nodes[x].op)) return true;
    if (mat[x]) return home_of(alias, x) < i0;
    for (int k = 0; k < g->nodes[x].nsrc; k++)
        if (depth > 32 || !ready_before(g, mat, alias, g->nodes[x].src[k], i0, depth + 1)) return false;
    return true;
}

void cuda_sums_early(const tg_graph *g, const bool *mat, const int *alias, int *born) {
    int *order = tg_alloc(sizeof(int) * (size_t)(g->n + 1)), n = 0;
    for (int i = 0; i < g->n; i++) {
        born[i] = i;
        if (order && mat[i] && alias[i] < 0) order[n++] = i;
    }
    for (int q = 0; q + 1 < n; q++) {   /* a column sum (and its producer) at q, and those that join it */
        int id = order[q], i0 = id, k0 = q + 1;
        if (born[id] != id) continue;
        if (born[order[q + 1]] == order[q + 1] && sums_its_source(g, mat, id, order[q + 1])) id = order[k0++];
        int64_t outer, len, inner;
        if (g->nodes[id].op != OP_SUM) continue;
        int64_t numel = g->nodes[split_of(g, mat, id, &outer, &len, &inner)].numel;
        if (inner == 1) continue;
        for (int k = k0, n_sums = 1; k < n && k < k0 + MAX_SIBLINGS + FAR_WINDOW && n_sums < MAX_SIBLINGS; k++) {
            int b = order[k], a = order[k - 1];
            int xb = born[b] == b ? sum_alike(g, mat, id, b, outer, len, inner, numel) : -1;
            if (xb < 0) continue;
            bool produced = born[a] == a && a != id && sums_its_source(g, mat, a, b), ok = true;
            for (int s = 0; produced && s < g->nodes[a].nsrc; s++) ok &= ready_before(g, mat, alias, g->nodes[a].src[s], i0, 0);
            if (!ok || (!produced && !ready_before(g, mat, alias, xb, i0, 0))) continue;
            born[b] = i0;
            if (produced) born[a] = i0;
            n_sums++;
        }
        q = k0 - 1;
    }
    free(order);
}

static void fill_shadow(cg *c, cuda_plan *p, int id);

/* "acc0 = 0, acc1 = 0, ...": a column sum's n accumulators, declared together (each item as
 * `item`, its %d the accumulator's number, given twice) */
static void sum_accumulators(char *out, size_t len, int n, const char *item) {
    out[0] = 0;
    for (int q = 0; q < n; q++) {
        snprintf(out + strlen(out), len - strlen(out), "%s", q ? ", " : "");
        snprintf(out + strlen(out), len - strlen(out), item, q, q);
    }
}

/* A column sum of few rows and many columns (a position embedding's gradient: 64 rows of 98,304
 * columns, summed over the batch): a thread sums every row of its `lanes` neighbouring columns,
 * in order, and stores them. The 32 x 32 blocks below would leave each thread two rows, and the
 * block's totals at the end: char_gpt's took 23 us on an H200, 10 so (two lanes). THIN_ROWS at
 * most, and THIN_THREADS threads at least, the widest lanes that keep them: with fewer, too few
 * loads are in flight (cifar_cnn's [64, 32768] sum of its first convolution's gradient, 128
 * blocks of one lane, made its step 4% slower). */
enum { THIN_ROWS = 128, THIN_THREADS = 49152 };

static bool thin_sum(cg *c, cuda_plan *p, const char *it, int64_t outer, int64_t len, int64_t inner, const int *srcs,
                     const int *prods, const int *sums, int n_sums, const int *roots, int n_roots, int n_far) {
    const int64_t outs = outer * inner;
    if (len > THIN_ROWS || n_far || outs < THIN_THREADS) return false;
    bool forced;
    int L = 1;
    for (int l = lanes_wanted(&forced); l > 1 && L == 1 && floats(c, prods, n_sums); l = forced ? 1 : l / 2)
        if (inner % l == 0 && (forced || outs / l >= THIN_THREADS)) L = l;
    if (L > 1) sum_lanes(c, it, len, inner, sums, srcs, prods, n_sums, L);
    const char *ht = head_type(it);
    char head[600], accs[200];
    sum_accumulators(accs, sizeof accs, n_sums * L, "acc%d = 0");
    snprintf(head, sizeof head,
             "    const %s oj = ((int64_t)blockIdx.x * %d + threadIdx.x) * %d;\n    if (oj >= %lldll) return;\n"
             "    const %s o = oj / %lld, j = oj %% %lld;\n    double %s;\n#pragma unroll 8\n    for (%s k = 0; k < %lld; k++) {\n",
             ht, BLOCK, L, (long long)outs, ht, (long long)inner, (long long)inner, accs, ht, (long long)len);
    strbuf tail = { 0 };
    sb_printf(&tail, "    }\n");
    for (int q = 0; q < n_sums; q++)
        for (int v = 0; v < L; v++) sb_printf(&tail, "    P%d[oj + %d] = (%s)acc%d;\n", sums[q], v, cg_ctype(N(c, sums[q])), q * L + v);
    end_kernel_roots(c, roots, n_roots, NULL, 0, head, sb_str(&tail), "");
    free(tail.s);
    kernel_launch(c, p, sums[0], outs / L, BLOCK);
    return true;
}

/* Sum over one axis: [outer, len, inner] -> [outer, 1, inner], reading coalesced:
 *  - contiguous rows (inner == 1): a warp per row, lanes striding the row, a shuffle reduction;
 *    when there are too few rows to fill the GPU (a sum over everything: one row), each row is
 *    cut into chunks of at least 1024, a warp each, added into the zeroed output with atomics;
 *  - otherwise blocks of 32 outputs x 32 row groups, neighbouring threads on neighbouring
 *    elements, the 32 partial sums of each output added by a warp; where a thread would sum more
 *    than a few elements, the axis is cut into chunks (grid y) whose sums the last block to
 *    finish adds up in a fixed order (tgk_last_block): no memset, no atomics on the output, the
 *    same result every run. The sums right after it in next[] that sum as many rows of as many
 *    columns (a layer norm's two parameter gradients) join it, up to MAX_SIBLINGS in one kernel;
 *    *taken says how many; then such sums further on (far_sibling), marked in done[].
 * `producer` (or -1) is the sum's source, a pointwise node computed here rather than by a
 * kernel of its own: each element is visited once, so it is stored where it is summed (a bias
 * gradient and the gradient it sums, one launch). False, with nothing emitted, when that would
 * race (its buffer shares memory with something the kernel reads). */
static bool sum_kernel_body(cg *c, cuda_plan *p, int id, int producer, const int *next, bool *done, int n_next, int *taken) {
    const tg_node *n = N(c, id);
    int64_t outer, len, inner;
    int x = sum_split(c, id, &outer, &len, &inner);
    const tg_node *s = N(c, x);
    int64_t outs = outer * inner;
    bool rows = inner == 1 && len >= 32;
    *taken = 0;
    if (producer >= 0 && inner == 1) return false;   /* rows: row_kernel's (it also takes what follows) */
    cg_begin(c, producer >= 0 ? producer : id);
    char flat[NAME];
    const char *it = s->numel < ((int64_t)1 << 31) && !cg_has_pad(c, x, -1) ? "uint32_t" : "int64_t";
    cg_def(c, flat, "f", it, "(%s)((o * %lld + k) * %lld + j)", it, (long long)len, (long long)inner);
    char o[NAME];
    snprintf(o, sizeof o, "(o * %lld + k)", (long long)len);
    if (inner > 1) row_lane(c, inner, flat, o, 0);
    if (producer >= 0) {
        const char *v = cg_root_value(c, flat);
        if (!cg_unplaced(c, producer)) cg_line(c, "P%d[%s] = %s;", producer, flat, v);
        shadow_store(c, producer, flat);
        cg_line(c, "acc0 += %s;", v);
        for (int u = 0; u < c->g->n; u++)
            if (u != producer && (c->used[u] || u == id) && arena_overlap(c, u, producer)) return false;
    } else {
        const char *v = cg_value(c, x, flat);
        cg_line(c, "acc0 += %s;", v);
        sum_copy_store(c, id, x, flat, v);
    }
    int sums[MAX_SIBLINGS] = { id }, srcs[MAX_SIBLINGS] = { x }, prods[MAX_SIBLINGS] = { producer }, n_sums = 1;
    bool *before = rows ? NULL : tg_alloc(sizeof(bool) * (size_t)(c->g->n + 1));
    for (int q = 0; before && q < n_next && n_sums < MAX_SIBLINGS; q++) {
        int b = next[q], xb = done[q] || plan_home(c->plan, b) != b ? -1 : sum_alike(c->g, c->mat, id, b, outer, len, inner, s->numel);
        if (xb < 0) break;
        size_t body_len = c->body.len;
        int n_memo = c->n_memo;
        memcpy(before, c->used, sizeof(bool) * (size_t)c->g->n);
        cg_line(c, "acc%d += %s;", n_sums, cg_value(c, xb, flat));
        if (!sibling_ok(c, sums, n_sums, producer, b)) {   /* take its line back out */
            c->body.len = body_len;
            c->body.s[body_len] = 0;
            c->n_memo = n_memo;
            memcpy(c->used, before, sizeof(bool) * (size_t)c->g->n);
            break;
        }
        srcs[n_sums] = xb;
        prods[n_sums] = -1;
        sums[n_sums++] = b;
    }
    *taken = n_sums - 1;
    int roots[2 * MAX_SIBLINGS], n_roots = n_sums, n_far = 0;
    memcpy(roots, sums, sizeof(int) * (size_t)n_sums);
    if (producer >= 0) roots[n_roots++] = producer;
    int near = n_roots;   /* roots[near ..): brought forward, their shadows filled here */
    int i0 = producer >= 0 ? producer : id;
    for (int q = *taken; before && q < n_next && q < *taken + FAR_WINDOW && n_sums < MAX_SIBLINGS; q++) {
        int b = next[q], pb, xb;
        if (done[q] || plan_home(c->plan, b) != b || sum_alike(c->g, c->mat, id, b, outer, len, inner, s->numel) < 0) continue;
        if ((pb = far_sibling(c, next, done, q, flat, i0, roots, n_roots, n_sums, before, &xb)) == -2) continue;
        done[q] = true;
        if (pb >= 0) done[q - 1] = true;
        n_roots += 1 + (pb >= 0);
        srcs[n_sums] = xb;
        prods[n_sums] = pb;
        sums[n_sums++] = b;
        n_far++;
    }
    free(before);
    c->root = id;
    char head[900];
    const char *ht = head_type(it);
    if (rows) {
        int64_t chunks = 1;   /* warps enough for about 64k threads, each lane summing >= 32 */
        while (outs <= SUM_COUNTERS && outs * chunks * 32 < 65536 && len / (chunks * 2) >= 1024) chunks *= 2;
        int64_t chunk = (len + chunks - 1) / chunks;
        snprintf(head, sizeof head,
                 "    const %s w = ((int64_t)blockIdx.x * %d + threadIdx.x) / 32, j = 0;\n"
                 "    if (w >= %lldll) return;\n"
                 "    const %s o = w / %lld, k0 = (w %% %lld) * %lld, k1 = k0 + %lld < %lldll ? k0 + %lld : %lldll;\n"
                 "    double acc0 = 0;\n"
                 "#pragma unroll 4\n"
                 "    for (%s k = k0 + (threadIdx.x & 31); k < k1; k += 32) {\n",
                 ht, BLOCK, (long long)(outs * chunks), ht, (long long)chunks, (long long)chunks, (long long)chunk, (long long)chunk,
                 (long long)len, (long long)chunk, (long long)len, ht);
        /* Cut into chunks (a warp each: w = o * chunks + its chunk), the warps' sums go to scratch
         * and the last of a row's warps to finish adds them in chunk order (as tgk_last_block):
         * the same sum every run, where adding them with atomics would take another order each */
        char st[600], tail[800];
        const size_t at = chunks > 1 ? sum_scratch(c, p, outs * chunks) : 0;
        if (chunks > 1)
            snprintf(st, sizeof st,
                     "{\n        double *part = (double *)(A + %zu);\n        unsigned *count = (unsigned *)(A + %zu);\n"
                     "        part[w] = acc0;\n        __threadfence();\n"
                     "        if (atomicAdd(count + o, 1u) != %lldu) return;\n        __threadfence();\n"
                     "        double t = 0;\n        for (int q = 0; q < %lld; q++) t += __ldcg(part + o * %lld + q);\n"
                     "        P%d[o] = (%s)t;\n        count[o] = 0u;\n    }",
                     at + SUM_COUNTERS, at, (long long)chunks - 1, (long long)chunks, (long long)chunks, id, cg_ctype(n));
        else snprintf(st, sizeof st, "P%d[o] = (%s)acc0;", id, cg_ctype(n));
        snprintf(tail, sizeof tail,
                 "    }\n"
                 "    for (int s = 16; s > 0; s /= 2) acc0 += __shfl_xor_sync(0xffffffffu, acc0, s);\n"
                 "    if ((threadIdx.x & 31) == 0) %s\n", st);
        end_kernel(c, NULL, 0, head, tail);
        kernel_launch(c, p, id, outs * chunks * 32, BLOCK);
        return true;
    }
    if (!c->copy_written && thin_sum(c, p, it, outer, len, inner, srcs, prods, sums, n_sums, roots, n_roots, n_far)) return true;
    /* Lanes (neighbouring columns a thread) where each thread still sums 16 rows with them: with
     * fewer rows the column totals at the end outweigh the wider loads (four lanes on every sum
     * the shapes allow: char_gpt_small bf16 0.335 -> 0.393 ms, mnist_mlp f32 0.104 -> 0.117) */
    bool forced;
    int L = 1;
    int64_t blocks, chunks;
    for (int l = lanes_wanted(&forced); l > 1 && L == 1 && floats(c, prods, n_sums); l = forced ? 1 : l / 2)
        if (inner % l == 0 && (forced || column_plan(outs, len, l, &blocks, &chunks) >= 16)) L = l;
    if (L > 1) sum_lanes(c, it, len, inner, sums, srcs, prods, n_sums, L);
    column_plan(outs, len, L, &blocks, &chunks);
    int64_t chunk = (len + chunks - 1) / chunks;
    /* Chunks of whole row groups: each thread's loop then has a count known at compile time (the
     * last chunk's threads skip the rows past the end), unrolled with no one-by-one remainder:
     * char_gpt's step bf16 6.396 -> 6.336 ms, tf32 11.71 -> 11.57 on an H100 (the GELU backward's
     * and the layer norm's sums replayed alone by Nsight Compute did not move; other sums did). */
    const bool fixed = chunks > 1;
    if (fixed) {
        chunk = (chunk + Y - 1) / Y * Y;
        chunks = (len + chunk - 1) / chunk;
    }
    size_t at = chunks > 1 ? sum_scratch(c, p, n_sums * chunks * outs) : 0;
    /* A thread's few values added in float, the block's and the chunks' totals in double: each
     * value's widening and double add made the bf16 GELU backward's sum wait on arithmetic
     * (55.3 -> 48.1 us alone, bench/logs/gpu_h200_s34_b_*); at most FLOAT_TERMS values keep
     * the float sum within 4e-6 of their sizes' sum (64 roundings of 2^-24). */
    const char *acc_type = (chunk + Y - 1) / Y <= FLOAT_TERMS ? "float" : "double";
    char accs[200], widened[200];
    sum_accumulators(accs, sizeof accs, n_sums * L, "acc%d = 0");
    sum_accumulators(widened, sizeof widened, n_sums * L, "tot%d = acc%d");
    snprintf(head, sizeof head,
             "    __shared__ double part[%d][%d][33];\n"
             "    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;\n"
             "    const %s oj = ((int64_t)blockIdx.x * 32 + lane) * %d;\n"
             "    const int64_t oc = ((int64_t)blockIdx.x * 32 + y) * %d;\n"
             "    const %s o = oj / %lld, j = oj %% %lld, k0 = (%s)blockIdx.y * %lld;\n"
             "    const %s k1 = oj >= %lldll ? k0 : k0 + %lld < %lldll ? k0 + %lld : %lldll;\n"
             "    %s %s;\n"
             "#pragma unroll 8\n",   /* loads in flight: a thread's are independent, only its sum is not */
             n_sums, Y, ht, L, L, ht, (long long)inner, (long long)inner, ht, (long long)chunk, ht, (long long)outs, (long long)chunk,
             (long long)len, (long long)chunk, (long long)len, acc_type, accs);
    if (fixed)
        snprintf(head + strlen(head), sizeof head - strlen(head),
                 "    for (int it = 0; it < %lld; it++) {\n        const %s k = k0 + y + it * %d;\n        if (k >= k1) continue;\n",
                 (long long)(chunk / Y), ht, Y);
    else
        snprintf(head + strlen(head), sizeof head - strlen(head), "    for (%s k = k0 + y; k < k1; k += %d) {\n", ht, Y);
    /* Warp y writes output oc of each sum: straight when the block summed every row, else its
     * partial sums to scratch, and the last block of the column group adds them up. */
    strbuf tail = { 0 };
    sb_printf(&tail, "    }\n    double %s;\n", widened);
    if (chunks > 1) sb_printf(&tail, "    double *sums = (double *)(A + %zu);\n", at + SUM_COUNTERS);
    for (int q = 0; q < n_sums; q++)   /* acc<q L + v>: sum q of column oc + v */
        for (int v = 0, a = q * L; v < L; v++, a++) {
            if (v) sb_printf(&tail, "    __syncthreads();\n");   /* every warp done reading the column total before */
            sb_printf(&tail, "    tot%d = tgk_column_total(tot%d, part[%d]);\n", a, a, q);
            if (chunks > 1)
                sb_printf(&tail, "    if (lane == 0 && oc + %d < %lldll) sums[(%lldll + blockIdx.y) * %lldll + oc + %d] = tot%d;\n", v,
                          (long long)outs, (long long)(q * chunks), (long long)outs, v, a);
            else sb_printf(&tail, "    if (lane == 0 && oc + %d < %lldll) P%d[oc + %d] = (%s)tot%d;\n", v, (long long)outs, sums[q], v, cg_ctype(n), a);
        }
    if (chunks > 1) {
        sb_printf(&tail, "    if (!tgk_last_block((unsigned *)(A + %zu) + blockIdx.x, %lld)) return;\n", at, (long long)chunks);
        for (int q = 0; q < n_sums; q++)
            for (int v = 0, a = q * L; v < L; v++, a++)
                sb_printf(&tail, "    tot%d = tgk_column_chunks(sums + %lldll, %lld, %lldll, oc + %d);\n"
                                 "    if (lane == 0 && oc + %d < %lldll) P%d[oc + %d] = (%s)tot%d;\n",
                          a, (long long)(q * chunks * outs), (long long)chunks, (long long)outs, v, v, (long long)outs, sums[q], v, cg_ctype(n), a);
    }
    end_kernel_roots(c, roots, n_roots, NULL, 0, head, sb_str(&tail), "__launch_bounds__(1024) ");
    free(tail.s);
    kernel_launch(c, p, id, blocks * 32 * Y, 32 * Y);
    p->launch[p->n - 1].grid_y = chunks;
    for (int r = near; r < n_roots; r++) fill_shadow(c, p, roots[r]);
    return true;
}

/* sum_kernel_body, its row nesting (row_lane) undone on every way out */
static bool sum_kernel(cg *c, cuda_plan *p, int id, int producer, const int *next, bool *done, int n_next, int *taken) {
    bool ok = sum_kernel_body(c, p, id, producer, next, done, n_next, taken);
    row_lane(c, 0, "", "", 0);
    return ok;
}

/* Does sum_kernel compute pointwise node `a`, the source of sum `b` right after it? */
static bool sum_producer(const cg *c, int a, int b) { return sums_its_source(c->g, c->mat, a, b) && plan_home(c->plan, a) == a; }

/* ----- row kernels -----
 * A sum along the last axis of an [R, L] source, then the kernels after it that work row by row
 * (elementwise over [R, L], or over the R row values), as one kernel with a warp per row: layer
 * norm (mean, centre, variance, scale), softmax and cross-entropy and their backward passes each
 * become one launch instead of several. Lane l takes elements j = l, l + 32, ... of every
 * [R, L] member, so the elements a lane reads back (cg_row_local: only at its own (r, j)) are
 * its own; a row value (a sum, or an [R] member) stays in a variable every lane holds for the
 * members after it (row_vals), and lane 0 stores it for later kernels, then a __syncwarp, which
 * orders that store where row_vals could not be allocated and lanes read the value back. */

enum { ROW_ELEMS, ROW_VALUES, ROW_SUM };

static int row_role(const cg *c, int id, int64_t R, int64_t L) {
    const tg_node *n = N(c, id);
    int64_t r, l;
    if (cg_row_sum(c, id, &r, &l)) return r == R && l == L ? ROW_SUM : -1;
    if (!fuse_pointwise(n->op) || plan_home(c->plan, id) != id) return -1;
    return n->numel == R * L ? ROW_ELEMS : n->numel == R ? ROW_VALUES : -1;
}

#define MAX_ROW_MEMBERS 32

/* Rows at least this long take a block each in row and softmax kernels (a classifier over a
 * vocabulary), shorter ones a warp: a warp alone keeps too few loads in flight over 50,000
 * columns. */
#define ROW_BLOCK_MIN 4096

/* Row elements a thread may hold in registers (cg.regs) across a warp-per-row kernel's loops */
#define ROW_REGS_MAX 48

/* Does a node other than members[0..nm) read node id, directly or through nodes computed where
 * they are read? (reach: scratch, a flag per node) */
static bool read_elsewhere(const cg *c, int id, const int *members, int nm, bool *reach) {
    memset(reach, 0, sizeof(bool) * (size_t)c->g->n);
    reach[id] = true;
    for (int i = id + 1; i < c->g->n; i++) {
        const tg_node *n = N(c, i);
        bool reads = false;
        for (int k = 0; k < n->nsrc; k++) reads |= reach[n->src[k]] && (n->src[k] == id || !c->mat[n->src[k]]);
        if (!reads) continue;
        if (!c->mat[i]) reach[i] = true;
        else {
            bool member = false;
            for (int m = 0; m < nm; m++) member |= members[m] == i;
            if (!member) return true;
        }
    }
    return false;
}

/* Marks in regs the ROW_ELEMS members that nothing after this kernel reads (not kept, read by no
 * other node, not rounded for a product): they need no buffer, only an array of `per` registers
 * a thread, as long as the arrays fit ROW_REGS_MAX. A layer norm's backward computes the centred
 * gradient, sums it and reads it once more: a [rows, width] buffer written and read twice, else.
 * A lead member (row_lead) is stored for the kernels after this one and held in registers too.
 * How many it marked. */
static int row_registers(const cg *c, const int *members, const int *roles, int nm, int per, int lead, bool *regs) {
    int kept = 0;
    bool *reach = tg_alloc(sizeof(bool) * (size_t)(c->g->n + 1));
    memset(regs, 0, sizeof(bool) * (size_t)c->g->n);
    for (int m = 0; reach && m < nm && (kept + 1) * per <= ROW_REGS_MAX; m++) {
        int id = members[m];
        if (roles[m] != ROW_ELEMS ||
            (m >= lead && (c->plan->last[id] == c->g->n || has_shadow(c, id) || read_elsewhere(c, id, members, nm, reach))))
            continue;
        regs[id] = true;
        kept++;
    }
    free(reach);
    return kept;
}

/* The loop of a member whose body is in c->body: unrolled where it reads or writes registers */
static const char *row_loop(const cg *c, const char *plain, const char *unrolled) {
    const char *body = sb_str(&c->body);
    return (c->regs && strstr(body, "[it * ")) || (c->row_in && strstr(body, "[it]")) ? unrolled : plain;
}

/* Registers a thread may give the arrays of a row kernel's inputs (cg.row_in): a layer norm
 * backward's three rows of 384 (two f32, one bf16) take 30 */
#define ROW_INPUT_REGS 32

/* Which row kernels hold their inputs' rows in registers (cg.row_in), each row read from memory
 * once, with one wide load a vector, as the row starts: by default those with column sums
 * (row_columns; char_gpt's step, one binary alternating (bench/logs/gpu_h200_s40_h_*): bf16
 * 4.470 -> 4.343 ms, tf32 8.805 -> 8.692), TG_CUDA_ROW_INPUTS=1 every warp-per-row kernel (a layer
 * norm's forward 22.0 -> 20.3 us, the steps the same within noise), =0 none. */
static bool row_inputs_wanted(int n_cols) {
    const char *env = getenv("TG_CUDA_ROW_INPUTS");
    return env ? env[0] == '1' : n_cols > 0;
}

/* The code that fills X<id>[it] with the vectors of the row a lane reads of every node the
 * kernel's passes read from registers (row_in[id] == 1), as the row starts */
static void row_inputs_load(const cg *c, strbuf *out, int lanes, int64_t iters, int64_t L, const char *ht, const char *it) {
    for (int id = 0; id < c->g->n; id++) {
        if (c->row_in[id] != 1) continue;
        const char *t = cg_vector_type(cg_unplaced(c, id), lanes);
        sb_printf(out, "    %s X%d[%lld];\n    _Pragma(\"unroll\") for (int it = 0; it < %lld; it++) {\n", t, id, (long long)iters,
                  (long long)iters);
        sb_printf(out, "        const %s j = %d * lane + it * %d;\n        if (j < %lldll) X%d[it] = *(const %s *)(P%d + (%s)r * %lld + j);\n    }\n",
                  ht, lanes, lanes * 32, (long long)L, id, t, id, it, (long long)L);
    }
}

/* Is pointwise node a, right before sum b in kernel order, the [R, L] source that b sums along
 * its rows? Then the row kernel computes and stores a first (a residual add before a layer
 * norm), where a kernel of its own would write it and the row kernel read it back. */
static bool row_lead(const cg *c, int a, int b) {
    int lo, hi;
    return fuse_pointwise(N(c, a)->op) && N(c, b)->op == OP_SUM && sum_source(c->g, c->mat, b, &lo, &hi) == a &&
           !sums_its_source(c->g, c->mat, a, b) && plan_home(c->plan, a) == a && !cg_unplaced(c, a);
}

/* ----- column sums inside a row kernel -----
 * A layer norm's backward sums the gradient and the gradient times the normalised input over its
 * rows (the bias's and weight's gradients) right before the row kernel that reads the same two
 * [R, L] values row by row: one kernel (row_columns) reads them once, and where the sum right
 * after the row kernel adds up its output (the bias gradient of the product before the layer
 * norm: row_trailing_sum), that too. Its blocks, at most ROW_COLUMN_SM an SM (which its launch
 * bounds fit the registers to: one wave), step over the rows; each lane adds its
 * elements of every sum's source into registers (floats: a few rows a lane), the block's warps'
 * into shared memory (doubles, in warp order, in chunks of ROW_COLUMN_CHUNK columns), the block's
 * sums into scratch, which a kernel of their own adds up (tgk_rows_total) in a fixed order, so
 * every run gives the same sums. On an H200 (char_gpt, 16,384 rows of 384), first with at most 528 blocks: 45-52
 * us where the two kernels took 57 at tf32, the step 9.55 -> 9.46 ms; at bf16 52 against 28.5 +
 * 22, the step no faster: NVRTC gave it 72 registers, three blocks an SM, a wave and a third.
 * Alone (bench/cuda/row_columns): 54.9 us so, 47.9 under launch bounds of four blocks an SM (64
 * registers, a few spilled), 44.6 with 396 blocks of three, against 33.2 + 15.0 for the two
 * kernels (52 in a row). With 396 under bounds of three, char_gpt's step (one binary, alternating,
 * bench/logs/gpu_h200_s39_e_*): bf16 4.612 / 4.581 ms -> 4.456 / 4.458, with the bias gradient
 * 4.429 / 4.427; tf32 8.611 -> 8.537 -> 8.461. By default from ROW_COLUMN_ROWS rows (char_gpt_small's
 * 1,024 were a little slower: 0.350 -> 0.356 ms at tf32); TG_CUDA_ROW_COLUMNS=0 never, =1 wherever
 * the kernel order allows it (tests). (132: an H100's or H200's SMs.) Such a kernel holds the rows
 * it reads in registers (row_inputs_wanted), which take two blocks an SM (ROW_COLUMN_SM_INPUTS):
 * with three a block under bounds of 80 registers it spilled, and every pass over a row read its
 * inputs again from L1 or L2; alone (bench/cuda/row_prefetch, char_gpt bf16's k1094) 52.3 us ->
 * 42.0 (49.0 with two blocks an SM and no registers for the rows; a copy of as many bytes 29.1). */
enum { ROW_COLUMN_SM = 3, ROW_COLUMN_SM_INPUTS = 2, ROW_COLUMN_CHUNK = 512, ROW_COLUMN_ROWS = 4096 };

static void row_columns_emit(cg *c, cuda_plan *p, const int *members, int nm, const int *cols, int n_cols, int64_t R, int64_t L,
                             int lanes, int64_t iters, const char *ht, int per_sm) {
    const int warps = BLOCK / 32;
    const int64_t most = per_sm * 132, blocks = (R + warps - 1) / warps < most ? (R + warps - 1) / warps : most;
    const int64_t n = n_cols * L, chunk = L < ROW_COLUMN_CHUNK ? L : ROW_COLUMN_CHUNK;
    const size_t at = sum_scratch(c, p, blocks * n), part = at + SUM_COUNTERS;
    strbuf head = { 0 }, tail = { 0 };
    sb_printf(&head, "    const int lane = threadIdx.x %% 32, w = threadIdx.x / 32;\n");
    for (int q = 0; q < n_cols; q++) sb_printf(&head, "    float C%d[%lld] = {};\n", q, (long long)(iters * lanes));
    sb_printf(&head, "    for (%s r = (%s)blockIdx.x * %d + w; r < %lldll; r += %lld) {\n", ht, ht, warps, (long long)R,
              (long long)(blocks * warps));
    sb_printf(&tail, "    }\n    __shared__ double tgc[%d][%lld];\n", warps, (long long)chunk);
    sb_printf(&tail, "    double *part = (double *)(A + %zu);\n", part);
    for (int q = 0; q < n_cols; q++)
        for (int64_t c0 = 0; c0 < L; c0 += chunk) {   /* the warps' sums of columns [c0, c1) of sum q */
            const long long c1 = c0 + chunk < L ? c0 + chunk : L;
            sb_printf(&tail, "    _Pragma(\"unroll\") for (int it = 0; it < %lld; it++) {\n", (long long)iters);
            sb_printf(&tail, "        const int j = %d * lane + it * %d;\n", lanes, lanes * 32);
            for (int k = 0; k < lanes; k++)
                sb_printf(&tail, "        if (j + %d >= %lld && j + %d < %lld) tgc[w][j + %d - %lld] = C%d[it * %d + %d];\n", k,
                          (long long)c0, k, c1, k, (long long)c0, q, lanes, k);
            sb_printf(&tail, "    }\n    __syncthreads();\n");
            sb_printf(&tail, "    for (int x = threadIdx.x; x < %lld; x += %d) {\n        double s = 0;\n", c1 - (long long)c0, BLOCK);
            sb_printf(&tail, "        for (int y = 0; y < %d; y++) s += tgc[y][x];\n", warps);
            sb_printf(&tail, "        part[(int64_t)blockIdx.x * %lld + %lld + x] = s;\n    }\n    __syncthreads();\n", (long long)n,
                      (long long)(q * L + c0));
        }
    char bounds[40];
    snprintf(bounds, sizeof bounds, "__launch_bounds__(%d, %d) ", BLOCK, per_sm);
    end_kernel_roots(c, members, nm, NULL, 0, sb_str(&head), sb_str(&tail), bounds);
    kernel_launch(c, p, members[0], blocks * BLOCK, BLOCK);
    /* The blocks' partial sums added up by a kernel of their own (k<cols[0]>): the last blocks of
     * the row kernel adding them all (in groups of 32 blocks, then the groups') took char_gpt
     * bf16's layer norm backward from 34.3 to 41.7 us alone, where this kernel takes 2.5
     * (bench/cuda/row_prefetch/pipelined.py) */
    head.len = tail.len = 0;
    sb_printf(&head, "    const int64_t col = (int64_t)blockIdx.x * 32 + (threadIdx.x & 31);\n");
    sb_printf(&head, "    const double s = tgk_rows_total((const double *)(A + %zu), %lldll, %lldll, col);\n", part, (long long)n,
              (long long)blocks);
    sb_printf(&head, "    if (threadIdx.x >= 32 || col >= %lldll) return;\n", (long long)n);
    for (int q = 0; q < n_cols; q++)
        sb_printf(&head, "    %sif (col < %lld) P%d[col - %lld] = (%s)s;\n", q ? "else " : "", (long long)((q + 1) * L), cols[q],
                  (long long)(q * L), cg_ctype(N(c, cols[q])));
    const bool copy = c->copy_written;
    cg_begin(c, cols[0]);
    c->copy_written = false;
    io_span(c, at, (int64_t)(SUM_COUNTERS + 2 * blocks * n), false);
    end_kernel_roots(c, cols, n_cols, NULL, 0, sb_str(&head), "", "__launch_bounds__(256) ");
    kernel_launch(c, p, cols[0], (n + 31) / 32 * 256, 256);
    c->copy_written = copy;
    free(head.s);
    free(tail.s);
}

static int row_kernel(cg *c, cuda_plan *p, const int *order, int n_order, int *cols, int *srcs, int n_cols);

/* Does the sum right after a row kernel's members (order[nm]) add up one of them over the same
 * rows? A layer norm's backward feeds its input gradient to the bias gradient of the product
 * before it: then the kernel adds that up too (as column sum cols[n_cols]), a read of an [R, L]
 * f32 buffer less. Returns 1 if so, else 0. */
static int row_trailing_sum(const cg *c, const int *order, int n_order, const int *members, const int *roles, int nm, int64_t R,
                            int64_t L, int *cols, int *srcs, int n_cols) {
    int64_t outer, len, inner;
    if (nm >= n_order || n_cols > MAX_SIBLINGS) return 0;
    const int b = order[nm];
    if (N(c, b)->op != OP_SUM || plan_home(c->plan, b) != b || N(c, b)->dtype != TG_FLOAT32) return 0;
    const int x = sum_split(c, b, &outer, &len, &inner);
    for (int m = 0; m < nm; m++)
        if (members[m] == x && roles[m] == ROW_ELEMS && outer == 1 && len == R && inner == L) {
            cols[n_cols] = b;
            srcs[n_cols] = x;
            return 1;
        }
    return 0;
}

/* Column sums order[0..) over the rows of the row kernel that follows them, as one kernel with it
 * (row_columns_emit); how many of order[] it took (0: none). */
static int row_columns(cg *c, cuda_plan *p, const int *order, int n_order) {
    const char *env = getenv("TG_CUDA_ROW_COLUMNS");
    int64_t outer, len, inner, R, L;
    const int id = order[0];
    if ((env && env[0] == '0') || N(c, id)->op != OP_SUM || plan_home(c->plan, id) != id || N(c, id)->dtype != TG_FLOAT32) return 0;
    const int x = sum_split(c, id, &outer, &len, &inner);
    if (outer != 1 || inner < 2) return 0;
    if (!(env && env[0] == '1') && len < ROW_COLUMN_ROWS) return 0;
    int cols[MAX_SIBLINGS + 1] = { id }, srcs[MAX_SIBLINGS + 1] = { x }, n_cols = 1;   /* + row_trailing_sum's */
    while (n_cols < n_order && n_cols < MAX_SIBLINGS && plan_home(c->plan, order[n_cols]) == order[n_cols]) {
        const int xb = sum_alike(c->g, c->mat, id, order[n_cols], outer, len, inner, N(c, x)->numel);
        if (xb < 0) break;
        srcs[n_cols] = xb;
        cols[n_cols] = order[n_cols];
        n_cols++;
    }
    if (n_cols >= n_order || !cg_row_sum(c, order[n_cols], &R, &L) || R != len || L != inner) return 0;
    const int taken = row_kernel(c, p, order + n_cols, n_order - n_cols, cols, srcs, n_cols);
    return taken ? n_cols + taken : 0;
}

/* The row kernel of the sum order[0], or of order[1] led by its source order[0] (row_lead);
 * returns how many of order[] it took (0: none). With column sums cols[0..n_cols) over its [R, L]
 * rows (sources srcs[]; row_columns), every warp takes rows R / (blocks x warps) apart, each lane
 * adding its elements of the sums' sources into registers, and the blocks' partial sums are added
 * up at the end (row_columns_emit). */
static int row_kernel(cg *c, cuda_plan *p, const int *order, int n_order, int *cols, int *srcs, int n_cols) {
    int64_t R, L;
    const int lead = n_order >= 2 && row_lead(c, order[0], order[1]) ? 1 : 0;
    if (!cg_row_sum(c, order[lead], &R, &L)) return 0;
    const bool block = L >= ROW_BLOCK_MIN;
    if (n_cols && (block || lead)) return 0;
    const int step = block ? BLOCK : 32;
    const char *sync = block ? "__syncthreads()" : "__syncwarp()";
    const char *max_iters = getenv("TG_CUDA_ROW_REGS");   /* n: registers only where a loop takes at most n turns; 0: never */
    bool *regs = tg_alloc(sizeof(bool) * (size_t)(c->g->n + 1)), try_regs = regs && !block;
    bool *vals = tg_alloc(sizeof(bool) * (size_t)(c->g->n + 1));
    signed char *row_in = !block && row_inputs_wanted(n_cols) ? tg_alloc((size_t)c->g->n + 1) : NULL;
    n_order = before_sum_producer(c, order, n_order);
    int members[MAX_ROW_MEMBERS], roles[MAX_ROW_MEMBERS], nm = 0;
    for (int q = 0; q < n_order && nm < MAX_ROW_MEMBERS; q++) {
        int id = order[q], role = row_role(c, id, R, L);
        if (role < 0) break;
        bool ok = true;
        for (int e = 0; e < nm && ok; e++)
            ok = cg_row_local(c, id, role == ROW_SUM ? N(c, id)->src[0] : id, members[e], role == ROW_VALUES ? 1 : 0, R, L);
        if (!ok) break;
        members[nm] = id;
        roles[nm++] = role;
    }
    for (; nm >= 2; nm--) {   /* as many members as run race-free: no buffer read is written too */
        cg_begin(c, members[0]);
        const char *it = "uint32_t";
        for (int m = 0; m < nm; m++)
            if (strcmp(cg_index_type(c, roles[m] == ROW_SUM ? N(c, members[m])->src[0] : members[m], R * L), "uint32_t") != 0)
                it = "int64_t";
        /* `lanes` consecutive elements a thread (cg.lanes: contiguous sources read as vectors) */
        int lanes = lanes_wanted(NULL);
        for (int m = 0; m < nm; m++)
            if (L % lanes != 0 || (roles[m] == ROW_ELEMS && !floats(c, &members[m], 1))) lanes = 1;
        char plain[120], unrolled[200], base[NAME], v[4][NAME];
        const char *ht = head_type(R * step < ((int64_t)1 << 31) ? it : "int64_t");
        const int64_t iters = (L + lanes * step - 1) / (lanes * step);
        const bool iters_ok = !max_iters || iters <= atoi(max_iters);
        const int kept = try_regs && iters_ok ? row_registers(c, members, roles, nm, (int)iters * lanes, lead, regs) : 0;
        strbuf text = { 0 };
        /* a loop touching registers is unrolled, so that every index of their arrays is a constant */
        snprintf(plain, sizeof plain, "    for (%s j = %d * lane; j < %lldll; j += %d) {\n", ht, lanes, (long long)L, lanes * step);
        snprintf(unrolled, sizeof unrolled,
                 "    _Pragma(\"unroll\") for (int it = 0; it < %lld; it++) {\n"
                 "        const %s j = %d * lane + it * %d;\n        if (j >= %lldll) continue;\n",
                 (long long)iters, ht, lanes, lanes * step, (long long)L);
        for (int m = 0; m < nm && kept; m++)
            if (regs[members[m]]) sb_printf(&text, "    float R%d[%lld];\n", members[m], (long long)(iters * lanes));
        c->regs = kept ? regs : NULL;
        c->regs_missed = false;
        if (vals) memset(vals, 0, sizeof(bool) * (size_t)c->g->n);
        c->row_vals = vals;
        c->row_in = lanes > 1 ? row_in : NULL;
        c->row_in_regs = ROW_INPUT_REGS;
        c->row_in_iters = (int)iters;
        for (int i = 0; c->row_in && i < c->g->n; i++) {   /* what the kernel writes is read from memory */
            c->row_in[i] = 0;
            for (int m = 0; m < nm; m++)
                if (plan_home(c->plan, i) == plan_home(c->plan, members[m])) c->row_in[i] = -1;
        }
        for (int m = 0; m < nm; m++) {
            int id = members[m];
            c->root = id;
            c->n_memo = 0;
            c->body.len = 0;
            if (c->body.s) c->body.s[0] = 0;
            if (roles[m] != ROW_VALUES) cg_def(c, base, "i", it, "(%s)r * %lld + j", it, (long long)L);
            if (roles[m] == ROW_SUM) {
                for (int k = 0; k < lanes; k++) {
                    lane_begin(c, it, base, lanes, k);
                    row_lane(c, L, c->lane_ix, "r", k);
                    cg_line(c, "acc += (double)%s;", cg_value(c, N(c, id)->src[0], c->lane_ix));
                }
                c->lanes = 0;
                row_lane(c, 0, "", "", 0);
                sb_printf(&text, "    %s V%d;\n    {\n    double acc = 0;\n%s%s    }\n", cg_ctype(N(c, id)), id,
                          row_loop(c, plain, unrolled), sb_str(&c->body));
                sb_printf(&text, "    acc = %s;\n", block ? "tgk_block_sum_d(acc)" : "tgk_warp<tgk_add>(acc)");
                sb_printf(&text, "    V%d = (%s)acc;\n    if (lane == 0) P%d[r] = V%d;\n    %s;\n    }\n", id, cg_ctype(N(c, id)), id,
                          id, sync);
            } else if (roles[m] == ROW_ELEMS) {
                for (int k = 0; k < lanes; k++) {
                    lane_begin(c, it, base, lanes, k);
                    row_lane(c, L, c->lane_ix, "r", k);
                    lane_root(c, id, v[k]);
                }
                c->lanes = 0;
                row_lane(c, 0, "", "", 0);
                for (int k = 0; k < lanes && c->regs && c->regs[id]; k++) cg_line(c, "R%d[it * %d + %d] = %s;", id, lanes, k, v[k]);
                if (!c->regs || !c->regs[id] || m < lead) lane_stores(c, id, v, lanes, base);
                sb_printf(&text, "%s%s    }\n", row_loop(c, plain, unrolled), sb_str(&c->body));
            } else {
                cg_line(c, "const %s v = %s;", cg_ctype(N(c, id)), cg_root_value(c, "r"));
                shadow_store(c, id, "r");   /* every lane stores the same value */
                if (!cg_unplaced(c, id)) cg_line(c, "if (lane == 0) P%d[r] = v;", id);
                cg_line(c, "V%d = v;", id);
                sb_printf(&text, "    %s V%d;\n    {\n%s    %s;\n    }\n", cg_ctype(N(c, id)), id, sb_str(&c->body), sync);
            }
            if (vals && roles[m] != ROW_ELEMS) vals[id] = true;   /* later members read it from V<id> */
        }
        c->regs = NULL;
        c->row_vals = NULL;
        const int trailing = n_cols ? row_trailing_sum(c, order, n_order, members, roles, nm, R, L, cols, srcs, n_cols) : 0;
        for (int q = 0; q < n_cols + trailing; q++) {   /* lane's elements of column sum q's source into C<q> */
            c->root = cols[q];
            c->n_memo = 0;
            c->body.len = 0;
            if (c->body.s) c->body.s[0] = 0;
            cg_def(c, base, "i", it, "(%s)r * %lld + j", it, (long long)L);
            for (int k = 0; k < lanes; k++) {
                lane_begin(c, it, base, lanes, k);
                row_lane(c, L, c->lane_ix, "r", k);
                cg_line(c, "C%d[it * %d + %d] += %s;", q, lanes, k, cg_value(c, srcs[q], c->lane_ix));
            }
            c->lanes = 0;
            row_lane(c, 0, "", "", 0);
            sb_printf(&text, "%s%s    }\n", unrolled, sb_str(&c->body));
        }
        bool inputs = false;   /* the rows of inputs the passes read from registers, loaded first */
        for (int i = 0; c->row_in && i < c->g->n; i++) inputs |= c->row_in[i] == 1;
        if (inputs) {
            strbuf loads = { 0 };
            row_inputs_load(c, &loads, lanes, iters, L, ht, it);
            sb_printf(&loads, "%s", sb_str(&text));
            free(text.s);
            text = loads;
        }
        c->row_in = NULL;
        if (c->regs_missed) {   /* a member read off its own lane: this many members again, in buffers */
            free(text.s);
            try_regs = false;
            nm++;
            continue;
        }
        bool ok = true;
        for (int i = 0; i < c->g->n && ok; i++)
            for (int m = 0; m < nm && ok; m++) {
                bool member = false;
                for (int e = 0; e < nm; e++) member |= members[e] == i;
                if ((c->used[i] && !member) || (member && i != members[m])) ok = !arena_overlap(c, i, members[m]);
            }
        /* The sums' outputs apart from each other. A kernel after it writes them (tgk_rows_total): they
         * may take the memory of what the row kernel reads. */
        for (int a = 0; ok && a < n_cols + trailing; a++)
            for (int b = 0; b < a; b++) ok &= !arena_overlap(c, cols[a], cols[b]);
        if (!ok && n_cols) {   /* not with fewer members either: the sums' kernel of their own */
            free(text.s);
            break;
        }
        if (!ok) {
            free(text.s);
            continue;
        }
        c->body.len = 0;
        if (c->body.s) c->body.s[0] = 0;
        sb_printf(&c->body, "%s", sb_str(&text));
        free(text.s);
        c->root = members[0];
        if (n_cols) {
            row_columns_emit(c, p, members, nm, cols, n_cols + trailing, R, L, lanes, iters, ht, inputs ? ROW_COLUMN_SM_INPUTS : ROW_COLUMN_SM);
            free(regs);
            free(vals);
            free(row_in);
            return nm + trailing;
        }
        char head[200];
        snprintf(head, sizeof head,
                 "    const %s r = ((int64_t)blockIdx.x * %d + threadIdx.x) / %d;\n    const int lane = threadIdx.x %% %d;\n"
                 "    if (r >= %lldll) return;\n", ht, BLOCK, step, step, (long long)R);
        end_kernel_roots(c, members, nm, NULL, 0, head, "", "");
        kernel_launch(c, p, members[0], R * step, BLOCK);
        free(regs);
        free(vals);
        free(row_in);
        return nm;
    }
    free(regs);
    free(vals);
    free(row_in);
    return 0;
}

/* A kernel that calls one prelude device function with constant arguments. */
static void call_kernel(cg *c, cuda_plan *p, int id, const int *srcs, int nsrc, int64_t threads, int block,
                        const char *fmt, ...) __attribute__((format(printf, 8, 9)));
static void call_kernel(cg *c, cuda_plan *p, int id, const int *srcs, int nsrc, int64_t threads, int block,
                        const char *fmt, ...) {
    cg_begin(c, id);
    char call[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(call, sizeof call, fmt, ap);
    va_end(ap);
    char head[700];
    snprintf(head, sizeof head, "    %s;\n", call);
    end_kernel(c, srcs, nsrc, head, "");
    kernel_launch(c, p, id, threads, block);
}

/* ----- a token and a position embedding's gradients in one pass -----
 * A GPT adds a token's row of one table and its position's row of another: the gradient X
 * [B, T, C] of that sum is scattered into the token table's gradient by rows (scatter_rows) and
 * summed over the batch for the position table's. Both read all of X (25 MB at char_gpt, 13 us
 * the sum and 15 the scatter in the step); one kernel reads it once. */

/* The scatter of rows after sum a that may compute sum a too: a sum of f32 X over its outer rows
 * ([len, inner] -> [inner]), X scattered by rows of a multiple of four floats that divides inner
 * (tgk_scatter_rows4's case), and nothing up to the scatter reads the sum. -1 where there is none
 * (one pass over the nodes after a: the first reader of the sum ends it). */
static int scatter_taking_sum(const cg *c, int a) {
    int64_t outer, len, inner;
    const int x = sum_split(c, a, &outer, &len, &inner), hx = plan_home(c->plan, x), ha = plan_home(c->plan, a);
    if (outer != 1 || N(c, a)->dtype != TG_FLOAT32 || N(c, x)->dtype != TG_FLOAT32 || !c->mat[hx] || cg_is_bound(N(c, hx)->op) ||
        cg_is_bound(N(c, ha)->op))
        return -1;
    for (int s = a + 1; s < c->g->n; s++) {
        const tg_node *n = N(c, s);
        for (int r = 0; c->plan->alias[s] < 0 && r < n->nsrc; r++)
            if (plan_home(c->plan, n->src[r]) == ha) return -1;
        if (n->op != OP_SCATTER_ROWS || !c->mat[s] || c->plan->alias[s] >= 0 || plan_home(c->plan, n->src[0]) != hx) continue;
        const int64_t dim = n->shape.d[1], idx_n = N(c, n->src[1])->numel;
        const bool fits = dim % 4 == 0 && idx_n * dim == N(c, x)->numel && inner % dim == 0 && idx_n * dim < INT32_MAX &&
                          !cg_is_bound(N(c, plan_home(c->plan, s))->op);
        return fits ? s : -1;
    }
    return -1;
}

/* Scatter s and the sum it took (c->scatter_sum): thread e on four columns of a position walks
 * a chunk of the batch in order, adding each row into the token rows (a vector reduction) and
 * into its own total; the chunks' totals (grid y: at least 2^16 threads in all, where a column
 * group's counter is free) are added in order by the last block of each column group, as a
 * chunked column sum's are (tgk_scatter_rows_sum4). At char_gpt one chunk (24,576 threads) took
 * 28 us, the two kernels 30. */
static void scatter_with_sum(cg *c, cuda_plan *p, int s) {
    enum { SCATTER_BLOCK = 64 };
    const tg_node *n = N(c, s);
    const int a = c->scatter_sum, srcs[2] = { n->src[0], n->src[1] };
    int64_t outer, len, inner;
    sum_split(c, a, &outer, &len, &inner);
    const int64_t per4 = inner / 4, blocks = (per4 + SCATTER_BLOCK - 1) / SCATTER_BLOCK;
    int chunks = 1;
    while (blocks <= SUM_COUNTERS && per4 * chunks < 65536 && len / (chunks * 2) >= 4) chunks *= 2;
    const size_t at = chunks > 1 ? sum_scratch(c, p, per4 * 4 * chunks) : 0;
    cg_begin(c, s);
    char head[400];
    snprintf(head, sizeof head, "    tgk_scatter_rows_sum4(P%d, P%d, P%d, P%d, (double *)(A + %zu), (unsigned *)(A + %zu), %d, %d, %d, %d, %lldll);\n",
             srcs[0], srcs[1], s, a, at + SUM_COUNTERS, at, (int)per4, (int)(n->shape.d[1] / 4), (int)len, chunks,
             (long long)n->shape.d[0]);
    const int roots[2] = { s, a };
    end_kernel_roots(c, roots, 2, srcs, 2, head, "", "");
    kernel_launch(c, p, s, blocks * SCATTER_BLOCK, SCATTER_BLOCK);
    p->launch[p->n - 1].grid_y = chunks;
    c->scatter_sum = c->sum_scatter = -1;
}

/* Batched product through cuBLAS; the backend turns regular offsets into one strided-batched
 * call. */
static void matmul_launch(cg *c, cuda_plan *p, int id) {
    const tg_node *n = N(c, id);
    cg_gemm m = cg_gemm_of(c->g, id);
    cuda_launch *l = add_launch(p, CL_GEMM, id);
    l->ta = m.ta;
    l->tb = m.tb;
    l->M = m.M;
    l->N = m.N;
    l->K = m.K;
    l->batch = m.batch;
    l->aoff = m.aoff;
    l->boff = m.boff;
    l->a = n->src[0];
    l->b = n->src[1];
    l->addend = n->nsrc > 2 ? n->src[2] : -1;
    l->b_transposed = reads_leaf_transposed(c->g, c->mat, c->plan->alias, id) && has_tshadow(c, plan_home(c->plan, l->b));
    if (l->b_transposed) l->tb = 1;   /* B^T's rows, the copy's, run along K */
}

/* Where a kernel compiled once for several launches finds node id's buffer (cuda_kernel_args):
 * its rounded copy, or its f32 values: floats into the arena, or -2 - h for B[h] (a bound leaf). */
static int64_t buffer_at(cg *c, int id, bool rounded) {
    int h = plan_home(c->plan, id);
    size_t at = rounded ? c->plan->shadow[h] : c->plan->offset[h];
    if (!rounded && cg_is_bound(N(c, h)->op)) return -2 - (int64_t)h;
    if (at == PLAN_BOUND) c->unsupported = id;   /* no such buffer: a planner bug, not a crash */
    return (int64_t)at;
}

/* Has a launch before run the kernel `name` (one compiled for several launches, attention's)? */
static bool compiled(const cuda_plan *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (p->launch[i].kind == CL_KERNEL && !strcmp(p->launch[i].name, name)) return true;
    return false;
}

/* The scratch of the attention backwards that pack their gradients (graph.h: ATTENTION_BWD's
 * iarg[1] = 3): `floats` of dq, cleared before each (clear_scratch). One for all of them, since
 * they run one after another (each noted as writing all of it, so that the side plan keeps them
 * so): char_gpt's six layers share 25 MB. Returns where. */
static size_t dq_scratch(cg *c, cuda_plan *p, int64_t floats) {
    const size_t want = (size_t)floats;
    if (p->dq_floats < want) {   /* 128-byte aligned: the bulk reductions' rows need 16 */
        if (!p->scratch_end) p->scratch_at = p->scratch_end = (c->plan->arena + 1) & ~(size_t)1;
        p->dq_scratch = (p->scratch_end + 31) & ~(size_t)31;
        p->dq_floats = want;
        p->scratch_end = p->dq_scratch + want;
    }
    io_span(c, p->dq_scratch, (int64_t)want, true);
    return p->dq_scratch;
}

/* The scratch at `at` cleared for the launch after it (node id's): the early clear of
 * cuda_backend.c moves it beside, after the last launch before that touches it. The copy of dq
 * that zeroed it as it read it took 88 us a layer for 28 (char_gpt at bf16, H200): stores of
 * zeros ran at 0.4 TB/s in that kernel. */
static void clear_scratch(cuda_plan *p, int id, size_t at, int64_t floats) {
    cuda_launch *l = add_launch(p, CL_MEMSET, id);
    l->n = floats;
    l->at = (int64_t)at;
}

/* After a backward that packs its gradients: dq, added up in the scratch at args->at[6], copied
 * into its part of the packed rows (args->at[7], the copy's at[9]), rows of hd values (H D), four
 * a thread (cuda_attention.c's tgk_attention_dq). r: rounded to bf16 as stored (a bf16 value). */
static void packed_dq(cg *c, cuda_plan *p, int id, const cuda_kernel_args *args, int64_t n, int64_t hd, bool r) {
    const tg_precision prec = c->g->precision;
    char name[sizeof p->launch->name];
    snprintf(name, sizeof name, "attn_dq_%lldx%lld_%s%s", (long long)(n / hd), (long long)hd,
             prec == TG_PRECISION_BF16 ? "bf16" : prec == TG_PRECISION_F32 ? "f32" : "tf32", r ? "_r" : "");
    if (!compiled(p, name))
        sb_printf(c->out, "extern \"C\" __global__ void %s(float *A, void *const *B, const double *H, tga_args a) {\n"
                          "    tgk_prior();\n    tgk_attention_dq<%lld, %d, %s>(tga_at<float>(A, B, a.at[6]), tga_at<float>(A, B, a.at[7]), "
                          "tga_at<void>(A, B, a.at[9]), %lldll);\n}\n\n",
                  name, (long long)hd, prec == TG_PRECISION_BF16 ? 2 : prec == TG_PRECISION_F32 ? 0 : 1, r ? "true" : "false",
                  (long long)n);
    dq_scratch(c, p, n);
    io_node(c, id, true);
    c->io_root = id;
    cuda_launch *l = kernel_launch(c, p, id, (n + 3) / 4, 256);
    snprintf(l->name, sizeof l->name, "%s", name);
    l->takes_args = true;
    l->args = *args;
}

/* Attention nodes of one kernel (cg_attention_joins: ATTENTION with its LSE, or the gradients
 * of one forward), a block per row tile of one batch element (device code and tile sizes in
 * cuda_attention.c). The kernel depends only on the shapes and the precision, and a model's layers
 * share those: it is compiled once, named for them, and each launch passes its buffers
 * (cuda_kernel_args), which spares the compiler a copy per layer. Returns how many of next[] it
 * took. */
static int attention_kernel(cg *c, cuda_plan *p, int id, const int *next, int n_next) {
    const tg_node *n = N(c, id);
    int64_t a[8];
    double scale;
    cg_attention_args(c->g, id, a);
    memcpy(&scale, &a[6], sizeof scale);
    const long long B = a[0], T = a[1], S = a[2], D = a[3], E = a[4];
    const tg_precision prec = c->g->precision;
    const bool bf = prec == TG_PRECISION_BF16, f32 = prec == TG_PRECISION_F32, bwd = n->op == OP_ATTENTION_BWD;
    const bool fwd = n->op == OP_ATTENTION;   /* else ATTENTION_LSE alone: no output rows */
    const bool mma = cuda_attention_mma(c->g, id, p->sm);   /* tensor cores: operands read as rounded copies at bf16 */
    const bool wg = mma && attention_wg(c->g, id, p->sm);
    const char *policy = !mma ? "" : bf ? "tgm_bf16, " : f32 ? "tgm_f32x3, " : "tgm_tf32, ";
    const char *rnd = mma ? "" : bf ? ", 2" : f32 ? ", 0" : ", 1";   /* SIMT: operands rounded on load */
    const long long pad = bf ? 8 : 4, elem = bf ? 2 : 4;   /* the policy's row padding and element bytes */
    int outs[3] = { id }, n_out = 1;
    for (int k = 0; k < n_next && n_out < 3 && cg_attention_joins(c->g, outs[n_out - 1], next[k]); k++) outs[n_out++] = next[k];
    /* The kernel's buffers: the sources (q, k, v, then out, d_out, lse backward), then the outputs
     * (out, lse forward; dq, dk, dv backward); operands of tensor cores as rounded copies. */
    cuda_kernel_args args = { .scale = (float)(bwd ? scale : scale * 1.4426950408889634) };
    bool rounded[11] = { false };
    int ops[5], n_ops = attention_reads_copies(c->g, id, p->sm) ? attention_operands(n, c->bf16, ops) : 0;
    for (int k = 0; k < 11; k++) args.at[k] = -1;
    for (int o = 0; o < n_ops; o++) rounded[ops[o]] = true;
    for (int k = 0; k < n->nsrc; k++) args.at[k] = buffer_at(c, n->src[k], rounded[k]);
    int rb = 0;   /* the outputs that are bf16 activations (bit 0 out, bits 1, 2 dk, dv) */
    const int pk = bwd && n->iarg[1] == 3 ? 3 : 1;   /* packed: its buffer, as dk's (at[7]), its copy's as dk's (at[9]) */
    if (pk > 1) {
        args.at[7] = cg_unplaced(c, id) ? -1 : buffer_at(c, id, false);
        if (has_shadow(c, id)) args.at[9] = buffer_at(c, id, true);
        if (graph_rounds(c->g, c->bf16, id)) rb = 6;
        args.at[6] = (int64_t)dq_scratch(c, p, B * T * D);
        clear_scratch(p, id, (size_t)args.at[6], B * T * D);
    } else if (bwd) {   /* dq, dk, dv (maybe their copies only); the rounded copies of dk, dv (at[9], at[10]) where products read them */
        for (int r = 0; r < n_out; r++) {
            const int w = (int)N(c, outs[r])->iarg[1];
            args.at[6 + w] = cg_unplaced(c, outs[r]) ? -1 : buffer_at(c, outs[r], false);
            if (graph_rounds(c->g, c->bf16, outs[r])) rb |= 1 << w;
            if (w > 0 && has_shadow(c, outs[r])) args.at[8 + w] = buffer_at(c, outs[r], true);
            if (w == 0) memset_launch(p, outs[r]);   /* dq is added up in memory (tgm_add_dq) */
        }
    } else {   /* out, lse, and out's rounded copy (at[5]) */
        if (!fwd) args.at[2] = args.at[1];   /* v unread */
        args.at[3] = fwd && !cg_unplaced(c, id) ? buffer_at(c, id, false) : -1;   /* at bf16 maybe its copy only */
        if (fwd && graph_rounds(c->g, c->bf16, id)) rb = 1;
        args.at[4] = !fwd ? buffer_at(c, id, false) : n_out > 1 ? buffer_at(c, outs[1], false) : -1;
        if (fwd && has_shadow(c, id)) args.at[5] = buffer_at(c, id, true);
    }
    const long long heads = bwd && n->iarg[2] > 1 ? n->iarg[2] : 1;   /* out's layout (graph.h: attn_row) */
    const long long inter = a[7] > 1 ? a[7] : 1;                       /* the operands' (graph.h: iarg[3]) */
    char name[sizeof p->launch->name], last[60];   /* last: the template's OUT (forward), RND (SIMT), heads (backward), inter, RB */
    snprintf(name, sizeof name, "attn%s_%s%s_%lldx%lldx%lldx%lld%s", bwd ? "_bwd" : fwd ? "" : "_lse", mma ? "" : "simt_",
             bf ? "bf16" : f32 ? (mma ? "f32x3" : "f32") : "tf32", T, S, D, E, a[5] ? "_causal" : "");
    snprintf(last, sizeof last, "%s%s", bwd ? "" : fwd ? ", true" : ", false", rnd);
    if (bwd) {
        snprintf(last + strlen(last), sizeof last - strlen(last), ", %lld", heads);
        snprintf(name + strlen(name), sizeof name - strlen(name), "_h%lld", heads);
    }
    if (rb) snprintf(name + strlen(name), sizeof name - strlen(name), "_r%d", rb);
    snprintf(last + strlen(last), sizeof last - strlen(last), ", %lld, %d", inter, rb);
    if (bwd) snprintf(last + strlen(last), sizeof last - strlen(last), ", %d", pk);
    if (pk > 1) snprintf(name + strlen(name), sizeof name - strlen(name), "_p%d", pk);
    if (inter > 1) snprintf(name + strlen(name), sizeof name - strlen(name), "_i%lld", inter);
    if (rounded[3]) snprintf(name + strlen(name), sizeof name - strlen(name), "_ob");   /* out read as bf16 */
    if (wg) snprintf(name + strlen(name), sizeof name - strlen(name), "_wg");
    if (!compiled(p, name)) {
        /* bf16's tensor-core forward bounded to 128 registers (137 unbounded), four blocks an SM
         * (char_gpt's layer, when blocks were 8 warps: 56 -> 49 us, two an SM against one); tf32's
         * and f32's need more. The warpgroup backward at three an SM (168 registers, 74 KB) */
        const char *bounds = wg && bwd ? "__launch_bounds__(128, 3) " : mma && !bwd && bf ? "__launch_bounds__(128, 4) " : "";
        sb_printf(c->out, "extern \"C\" __global__ void %s%s(float *A, void *const *B, const double *H, tga_args a) {\n"
                          "    tgk_prior();\n    tgk_attention%s%s<",
                  bounds, name, bwd ? "_bwd" : "", wg ? "_wg" : mma ? "_mma" : "");
        if (wg)   /* shapes and sizes: heads of 64 at bf16 */
            sb_printf(c->out, "%lld, %lld, %s%s>(", T, S, a[5] ? "true" : "false", last);
        else
            sb_printf(c->out, "%s%lld, %lld, %lld, %lld, %s%s>(", policy, T, S, D, E, a[5] ? "true" : "false", last);
        for (int k = 0; k < (bwd ? 11 : 6); k++)
            sb_printf(c->out, "tga_at<%s%s>(A, B, a.at[%d]), ", k < (bwd ? 6 : 3) ? "const " : "",
                      rounded[k] ? shadow_type(c) : k >= (bwd ? 9 : 5) ? "void" : "float", k);
        sb_printf(c->out, "a.scale);\n}\n\n");
    }
    for (int k = 0; k < n->nsrc; k++) io_node(c, n->src[k], false);
    for (int r = 0; r < n_out; r++) io_node(c, outs[r], true);
    c->io_root = id;
    int64_t tiles = bwd ? (S + 63) / 64 : (T + 63) / 64;
    int block = mma ? 128 : 256;   /* tensor cores: 4 warps of 16 rows */
    cuda_launch *l = kernel_launch(c, p, id, tiles * B * block, block);
    snprintf(l->name, sizeof l->name, "%s", name);
    l->takes_args = true;
    l->args = args;
    if (wg)   /* 64 x 64 bf16 tiles (8 KB), 1 KB to align them: q and two stages of k, v forward; k, v,
               * two stages of q and d_out (3 KB more each: dq's rows), ds, the rows' lse and delta, and
               * out's rows where it is read as bf16 backward */
        l->shared = bwd ? 1024 + (rounded[3] ? 8 : 7) * 8192 + 2 * 3072 + 4 * 128 : 1024 + 5 * 8192;
    else if (bwd)
        l->shared = mma ? (int)(4 * 128 + elem * (2 * 64 * (D + pad + E + pad) + 64 * (D + pad)) + 4 * 64 * 72)
                        : (int)(4 * (64 * (D + 1) * 2 + 64 * (E + 1) * 2 + 64 * 65 + 128));
    else
        l->shared = mma ? (int)(elem * 2 * 64 * (D + pad + E + pad)) : (int)(4 * (64 * (D + 1) * 2 + 64 * E + 64 * 65));
    if (pk > 1) packed_dq(c, p, id, &args, B * T * D, D * inter, rb != 0);
    return n_out - 1;
}

/* Does node k's kernel read home node id (through views and nodes it computes inline)? */
static bool reads_home(const cg *c, int k, int id) {
    for (int s = 0; s < N(c, k)->nsrc; s++) {
        const int x = N(c, k)->src[s];
        if (plan_home(c->plan, x) == id || (!c->mat[x] && reads_home(c, x, id))) return true;
    }
    return false;
}

/* The sum that writes home node id's rounded copy as it reads it, or -1: where a pass would fill
 * the copy after id's kernel (attention's dq, added up in memory) and the first kernel after
 * order[next - 1] to read id is a sum of it. That sum reads every element once and writes the
 * copy beside (sum_kernel_body), where a pass of its own would read the f32 values again (bf16
 * char_gpt: 10 us a layer on an H200). */
static int sum_copying(const cg *c, int id, const int *order, const bool *done, int next, int n_order) {
    int lo, hi;
    if (!fills_shadow(c->g, c->mat, id) || !has_shadow(c, id)) return -1;
    for (int q = next; q < n_order; q++) {
        const int k = order[q];
        if (done[q] || !reads_home(c, k, id)) continue;
        return N(c, k)->op == OP_SUM && plan_home(c->plan, k) == k && plan_home(c->plan, sum_source(c->g, c->mat, k, &lo, &hi)) == id ? k : -1;
    }
    return -1;
}

/* After a product through cuBLAS that wrote f32: its values rounded in place when it is a bf16
 * activation (graph_bf16_values), and its rounded copy when it has one (read by attention on
 * tensor cores): one pass right after the node is computed. */
static void fill_shadow(cg *c, cuda_plan *p, int id) {
    bool rounds = on_cublas(c->g, c->mat, id) && graph_rounds(c->g, c->bf16, id);
    bool fills = has_shadow(c, id) && !writes_shadow(c->g, c->mat, id);
    if (cg_unplaced(c, id) || (!rounds && !fills)) return;   /* unplaced: cuBLAS wrote the bf16 copy itself */
    strbuf decl = { 0 };
    pointer(c, &decl, id, rounds);
    shadow_pointer(c, &decl, id);
    /* four values a thread where they come in whole fours (16-byte loads: the pass is bandwidth) */
    const long long n = (long long)N(c, id)->numel, w = n % 4 == 0 ? 4 : 1;
    const char *x[4] = { w == 4 ? "v.x" : "v", "v.y", "v.z", "v.w" }, *rf = round_fn(c);
    strbuf body = { 0 };
    for (int e = 0; e < w && rounds; e++) sb_printf(&body, " %s = tgk_round_bf16_float(%s);", x[e], x[e]);
    if (rounds) sb_printf(&body, w == 4 ? " *(float4 *)(P%d + i) = v;" : " P%d[i] = v;", id);
    if (fills && w == 1)
        sb_printf(&body, " S%d[i] = %s(v);", id, rf);
    else if (fills && c->g->precision == TG_PRECISION_BF16)
        sb_printf(&body, " *(uint2 *)(S%d + i) = make_uint2(tgk_pack_bf16(v.x, v.y), tgk_pack_bf16(v.z, v.w));", id);
    else if (fills)
        sb_printf(&body, " *(float4 *)(S%d + i) = make_float4(%s(v.x), %s(v.y), %s(v.z), %s(v.w));", id, rf, rf, rf, rf);
    sb_printf(c->out, "extern \"C\" __global__ void kfill%d(float *A, void *const *B, const double *H) {\n    tgk_prior();\n%s"
                      "    const int64_t i = ((int64_t)blockIdx.x * %d + threadIdx.x) * %lld;\n"
                      "    if (i < %lldll) { %s v = %s(P%d + i);%s }\n}\n\n",
              id, sb_str(&decl), BLOCK, w, n, w == 4 ? "float4" : "float", w == 4 ? "*(const float4 *)" : "*", id, sb_str(&body));
    free(decl.s);
    free(body.s);
    io_node(c, id, true);
    c->io_root = id;
    kernel_launch(c, p, id, n / w, BLOCK);
    snprintf(p->launch[p->n - 1].name, sizeof p->launch[p->n - 1].name, "kfill%d", id);
}

/* Softmax (or log-softmax) of a source computed in the kernel (fuse_schedule's
 * FUSE_SOFTMAX_INPUT): tgk_softmax_row's three passes over a row, a warp per row (a block per
 * long row), each pass evaluating the source's expression at element (o, k, i) of
 * [outer, len, inner]; in 32-bit indices where they fit, so that the source's coordinates are
 * cheap divisions. */
static void softmax_kernel(cg *c, cuda_plan *p, int id, int64_t outer, int64_t len, int64_t inner) {
    const tg_node *n = N(c, id);
    const bool block = len >= ROW_BLOCK_MIN;
    const int step = block ? BLOCK : 32;
    const char *scope = block ? "block" : "warp";
    strbuf text = { 0 };
    cg_begin(c, id);
    for (int q = 0; q < 3; q++) {
        c->n_memo = 0;
        c->body.len = 0;
        if (c->body.s) c->body.s[0] = 0;
        if (n->numel < (1ll << 30)) cg_line(c, "const uint32_t f = (uint32_t)(base + k * %lldll);", (long long)inner);
        else cg_line(c, "const int64_t f = base + k * %lldll;", (long long)inner);
        const char *v = cg_value(c, n->src[0], "f");
        if (q == 0) cg_line(c, "mx = fmaxf(mx, %s);", v);   /* the row's max, its sum of exponentials, the output */
        else if (q == 1) cg_line(c, "sum += expf(%s - mx);", v);
        else if (n->op == OP_LOG_SOFTMAX) cg_line(c, "P%d[f] = %s - lse;", id, v);
        else cg_line(c, "P%d[f] = expf(%s - mx) * inv;", id, v);
        sb_printf(&text, "    for (int64_t k = lane; k < %lldll; k += %d) {\n%s    }\n", (long long)len, step, sb_str(&c->body));
        if (q == 0) sb_printf(&text, "    mx = tgk_%s_max(mx);\n", scope);
        if (q == 1) sb_printf(&text, "    sum = tgk_%s_sum(sum);\n    const float lse = mx + logf(sum), inv = 1.0f / sum;\n", scope);
    }
    c->body.len = 0;
    if (c->body.s) c->body.s[0] = 0;
    sb_printf(&c->body, "%s", sb_str(&text));
    free(text.s);
    char head[300];
    snprintf(head, sizeof head,
             "    const int64_t row = ((int64_t)blockIdx.x * %d + threadIdx.x) / %d;\n"
             "    const int lane = threadIdx.x %% %d;\n"
             "    if (row >= %lldll) return;\n"
             "    const int64_t base = (row / %lld) * %lld + row %% %lld;\n"
             "    float mx = -INFINITY, sum = 0;\n",
             BLOCK, step, step, (long long)(outer * inner), (long long)inner, (long long)(len * inner), (long long)inner);
    end_kernel(c, NULL, 0, head, "");
    kernel_launch(c, p, id, outer * inner * step, BLOCK);
}

static void special_kernel(cg *c, cuda_plan *p, int id) {
    const tg_node *n = N(c, id), *s0 = N(c, n->src[0]);
    int src0 = n->src[0], src01[2] = { n->src[0], n->nsrc > 1 ? n->src[1] : n->src[0] };
    int64_t o, len, in;
    switch (n->op) {
    case OP_MATMUL: matmul_launch(c, p, id); return;
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
        cg_axis_split(n->shape, n->axis, &o, &len, &in);
        if (!c->mat[src0] && !cg_is_bound(s0->op)) softmax_kernel(c, p, id, o, len, in);
        else call_kernel(c, p, id, &src0, 1, o * in * 32, BLOCK, "tgk_softmax(P%d, P%d, %lldll, %lldll, %lldll, %d)", src0, id,
                         (long long)o, (long long)len, (long long)in, n->op == OP_LOG_SOFTMAX);
        return;
    case OP_SOFTMAX_CAUSAL: {
        int64_t rows = n->shape.d[n->shape.ndim - 2], cols = n->shape.d[n->shape.ndim - 1];
        call_kernel(c, p, id, &src0, 1, n->numel / cols * 32, BLOCK, "tgk_softmax_causal(P%d, P%d, %lldll, %lldll, %lldll)",
                    src0, id, (long long)(n->numel / cols), (long long)rows, (long long)cols);
        return;
    }
    case OP_ARGMAX:
        cg_axis_split(s0->shape, n->axis, &o, &len, &in);
        call_kernel(c, p, id, &src0, 1, o * in, BLOCK, "tgk_argmax(P%d, P%d, %lldll, %lldll, %lldll, %d)", src0, id,
                    (long long)o, (long long)len, (long long)in, (int)n->iarg[0]);
        return;
    case OP_SCATTER_ROWS: {
        int64_t idx_n = N(c, n->src[1])->numel, dim = n->shape.d[1];
        memset_launch(p, id);
        if (c->sum_scatter == id) {
            scatter_with_sum(c, p, id);
            return;
        }
        if (dim % 4 == 0 && idx_n * dim < INT32_MAX && !cg_is_bound(N(c, plan_home(c->plan, src0))->op) &&
            !cg_is_bound(N(c, plan_home(c->plan, id))->op))   /* rows of the arena's, 16-byte aligned */
            call_kernel(c, p, id, src01, 2, idx_n * dim / 4, BLOCK, "tgk_scatter_rows4(P%d, P%d, P%d, %d, %d, %lldll)", src01[0],
                        src01[1], id, (int)(idx_n * dim / 4), (int)(dim / 4), (long long)n->shape.d[0]);
        else
            call_kernel(c, p, id, src01, 2, idx_n * dim, BLOCK, "tgk_scatter_rows(P%d, P%d, P%d, %lldll, %lldll, %lldll)",
                        src01[0], src01[1], id, (long long)idx_n, (long long)dim, (long long)n->shape.d[0]);
        return;
    }
    case OP_SCATTER_ALONG:
        cg_axis_split(s0->shape, n->axis, &o, &len, &in);
        memset_launch(p, id);
        call_kernel(c, p, id, src01, 2, s0->numel, BLOCK, "tgk_scatter_along(P%d, P%d, P%d, %lldll, %lldll, %lldll, %lldll)",
                    src01[0], src01[1], id, (long long)o, (long long)len, (long long)in, (long long)n->shape.d[n->axis]);
        return;
    case OP_COL2IM: {
        const int64_t *a = n->iarg, *d = n->shape.d;
        call_kernel(c, p, id, &src0, 1, n->numel, BLOCK,
                    "tgk_col2im(P%d, P%d, %lldll, %lldll, %lldll, %lldll, %lldll, %lldll, %lldll, %lldll)", src0, id,
                    (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3], (long long)a[0], (long long)a[1],
                    (long long)a[2], (long long)a[3]);
        return;
    }
    case OP_MAXPOOL2D: {
        const int64_t *a = n->iarg, *d = s0->shape.d;
        call_kernel(c, p, id, &src0, 1, n->numel, BLOCK,
                    "tgk_maxpool(P%d, 0, P%d, %lldll, %lldll, %lldll, %lldll, %lldll, %lldll, %lldll)", src0, id,
                    (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3], (long long)a[0], (long long)a[1],
                    (long long)a[2]);
        return;
    }
    case OP_MAXPOOL2D_BWD: {   /* one thread per window of the upstream gradient */
        const int64_t *a = n->iarg, *d = n->shape.d;
        memset_launch(p, id);
        call_kernel(c, p, id, src01, 2, N(c, n->src[1])->numel, BLOCK,
                    "tgk_maxpool(P%d, P%d, P%d, %lldll, %lldll, %lldll, %lldll, %lldll, %lldll, %lldll)", src01[0],
                    src01[1], id, (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3], (long long)a[0],
                    (long long)a[1], (long long)a[2]);
        return;
    }
    default:
        c->unsupported = id;
        return;
    }
}

/* Device helpers for the kernels above: warp-per-row softmax, argmax, scatters with atomics,
 * col2im as a gather (no atomics), max-pooling forward and backward, the end of a column sum. */
static const char DEVICE_KERNELS[] =
    /* The sums of a block of 32 columns x 32 row groups: its 32 row groups' partial sums of each
     * column added by a warp (warp y: column y), a shuffle tree over them rather than 31 adds in
     * a row; every lane of warp y gets the same total. */
    "static __device__ double tgk_column_total(double acc, double (*part)[33]) {\n"
    "    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;\n"
    "    part[y][lane] = acc;\n"
    "    __syncthreads();\n"
    "    acc = part[lane][y];\n"
    "    for (int s = 16; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);\n"
    "    return acc;\n}\n"
    /* Is this block the last of `arrivals` blocks to get here (counted in *count, after a fence:
     * what they wrote before is seen)? The last leaves the counter zero for the next use. A column
     * sum cut into chunks (grid y) leaves each block's sums in scratch, and the last block of a
     * column group (count[x]) adds them up (tgk_column_chunks: chunk b's at sums[b * outs + oc]),
     * the same way every run. */
    "static __device__ bool tgk_last_block(unsigned *count, int64_t arrivals) {\n"
    "    __shared__ bool last;\n"
    "    __threadfence();\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        last = atomicAdd(count, 1u) == arrivals - 1;\n"
    "        if (last) *count = 0;\n"
    "    }\n"
    "    __syncthreads();\n"
    "    return last;\n}\n"
    /* row_columns' finish, a kernel of 256 threads a block of 32 columns: the row kernel's blocks'
     * partial sums part[blocks, n] of column col added in a fixed order (warp y every 8th block's
     * from block y, then the 8 warps' in order); the total in warp 0's lanes. */
    "static __device__ double tgk_rows_total(const double *part, int64_t n, int64_t blocks, int64_t col) {\n"
    "    __shared__ double s[8][33];\n"
    "    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;\n"
    "    double acc = 0;\n"
    "    if (col < n) for (int64_t b = y; b < blocks; b += 8) acc += __ldcg(part + b * n + col);\n"
    "    s[y][lane] = acc;\n"
    "    __syncthreads();\n"
    "    double t = 0;\n"
    "    for (int q = 0; q < 8; q++) t += s[q][lane];\n"
    "    return t;\n}\n"
    "static __device__ double tgk_column_chunks(const double *sums, int64_t chunks, int64_t outs, int64_t oc) {\n"
    "    double acc = 0;\n"
    "    for (int64_t b = threadIdx.x & 31; oc < outs && b < chunks; b += 32) acc += __ldcg(sums + b * outs + oc);\n"
    "    for (int s = 16; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);\n"
    "    return acc;\n}\n"
    /* A warp's and a block's max and sum, in every thread (T float or double, OP one of the two
     * below); the block's: each warp's, then every warp reduces the warps'. The first barrier keeps
     * a call from overwriting what the last one's slower warps read. */
    "struct tgk_max { static __device__ float f(float a, float b) { return fmaxf(a, b); } };\n"
    "struct tgk_add { template <typename T> static __device__ T f(T a, T b) { return a + b; } };\n"
    "template <typename OP, typename T> static __device__ T tgk_warp(T v) {\n"
    "    for (int o = 16; o > 0; o /= 2) v = OP::f(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n}\n"
    "template <typename OP, typename T> static __device__ T tgk_block(T v, T none) {\n"
    "    __shared__ T part[32];\n"
    "    v = tgk_warp<OP>(v);\n"
    "    __syncthreads();\n"
    "    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = v;\n"
    "    __syncthreads();\n"
    "    return tgk_warp<OP>((threadIdx.x & 31) < blockDim.x / 32 ? part[threadIdx.x & 31] : none);\n}\n"
    "static __device__ float tgk_warp_max(float v) { return tgk_warp<tgk_max>(v); }\n"
    "static __device__ float tgk_warp_sum(float v) { return tgk_warp<tgk_add>(v); }\n"
    "static __device__ float tgk_block_max(float v) { return tgk_block<tgk_max>(v, -INFINITY); }\n"
    "static __device__ float tgk_block_sum(float v) { return tgk_block<tgk_add>(v, 0.0f); }\n"
    "static __device__ double tgk_block_sum_d(double v) { return tgk_block<tgk_add>(v, 0.0); }\n"
    /* row r = (o, j): elements o*len*inner + k*inner + j, k < keep; a warp per row */
    "static __device__ void tgk_softmax_row(const float *x, float *y, int64_t len, int64_t inner, int64_t keep, int take_log) {\n"
    "    const int lane = threadIdx.x & 31;\n"
    "    float mx = -INFINITY;\n"
    "    for (int64_t k = lane; k < keep; k += 32) mx = fmaxf(mx, x[k * inner]);\n"
    "    mx = tgk_warp_max(mx);\n"
    "    float sum = 0;\n"
    "    for (int64_t k = lane; k < keep; k += 32) sum += expf(x[k * inner] - mx);\n"
    "    sum = tgk_warp_sum(sum);\n"
    "    const float lse = mx + logf(sum), inv = 1.0f / sum;\n"
    "    for (int64_t k = lane; k < len; k += 32)\n"
    "        y[k * inner] = k >= keep ? 0.0f : take_log ? x[k * inner] - lse : expf(x[k * inner] - mx) * inv;\n"
    "}\n"
    "static __device__ void tgk_softmax(const float *x, float *y, int64_t outer, int64_t len, int64_t inner, int take_log) {\n"
    "    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;\n"
    "    if (row >= outer * inner) return;\n"
    "    const int64_t base = (row / inner) * len * inner + row % inner;\n"
    "    tgk_softmax_row(x + base, y + base, len, inner, len, take_log);\n}\n"
    "static __device__ void tgk_softmax_causal(const float *x, float *y, int64_t nrows, int64_t rows, int64_t cols) {\n"
    "    const int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;\n"
    "    if (row >= nrows) return;\n"
    "    const int64_t r = row % rows, keep = r + 1 < cols ? r + 1 : cols;\n"
    "    tgk_softmax_row(x + row * cols, y + row * cols, cols, 1, keep, 0);\n}\n"
    "static __device__ void tgk_argmax(const float *x, int32_t *out, int64_t outer, int64_t len, int64_t inner, int is_min) {\n"
    "    const int64_t oi = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (oi >= outer * inner) return;\n"
    "    const float *v = x + (oi / inner) * len * inner + oi % inner;\n"
    "    int64_t best = 0;\n"
    "    for (int64_t k = 1; k < len && v[best * inner] == v[best * inner]; k++) {\n"
    "        const float a = v[k * inner], b = v[best * inner];\n"
    "        if (a != a || (is_min ? a < b : a > b)) best = k;\n"
    "    }\n"
    "    out[oi] = (int32_t)best;\n}\n"
    "static __device__ void tgk_scatter_rows(const float *v, const int32_t *idx, float *out, int64_t n, int64_t dim, int64_t rows) {\n"
    "    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (e >= n * dim) return;\n"
    "    const int32_t r = idx[e / dim];\n"
    "    if (r >= 0 && r < rows) atomicAdd(out + (int64_t)r * dim + e % dim, v[e]);\n}\n"
    /* four neighbouring floats added into memory (16-byte aligned): one vector reduction on sm_90,
     * a quarter of the atomics (char_gpt's token embedding gradient adds 16,384 rows into 65), else
     * four */
    "static __device__ void tgk_red_add4(float *o, float4 x) {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\" :: \"l\"(o), \"f\"(x.x), \"f\"(x.y), \"f\"(x.z), \"f\"(x.w) : \"memory\");\n"
    "#else\n"
    "    atomicAdd(o, x.x); atomicAdd(o + 1, x.y); atomicAdd(o + 2, x.z); atomicAdd(o + 3, x.w);\n"
    "#endif\n}\n"
    /* four neighbouring elements of a row a thread (rows of 4 dim4 floats, 16-byte aligned) */
    "static __device__ void tgk_scatter_rows4(const float *v, const int32_t *idx, float *out, int n4, int dim4, int64_t rows) {\n"
    "    const int e = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (e >= n4) return;\n"
    "    const int32_t r = idx[e / dim4];\n"
    "    if (r >= 0 && r < rows) tgk_red_add4(out + ((int64_t)r * dim4 + e % dim4) * 4, *(const float4 *)(v + 4ll * e));\n}\n"
    /* scatter_with_sum's: per4 pieces of four columns a row of the batch (one position's row), len
     * rows (the batch) in `chunks` chunks (grid y), each piece's rows of a chunk added into the
     * token rows and into its total in order, in double as a thin sum adds; chunks' totals left in
     * part[chunk][piece], added in chunk order by the last block of each column group */
    "static __device__ void tgk_scatter_rows_sum4(const float *v, const int32_t *idx, float *out, float *total, double *part,\n"
    "                                             unsigned *count, int per4, int dim4, int len, int chunks, int64_t rows) {\n"
    "    const int e = blockIdx.x * blockDim.x + threadIdx.x, c = blockIdx.y;\n"
    "    const int b0 = (int)((int64_t)len * c / chunks), b1 = (int)((int64_t)len * (c + 1) / chunks);\n"
    "    double t0 = 0, t1 = 0, t2 = 0, t3 = 0;\n"
    "#pragma unroll 8\n"
    "    for (int b = b0; e < per4 && b < b1; b++) {\n"
    "        const int r = b * per4 + e;\n"
    "        const float4 x = *(const float4 *)(v + 4ll * r);\n"
    "        const int32_t t = idx[r / dim4];\n"
    "        t0 += x.x; t1 += x.y; t2 += x.z; t3 += x.w;\n"
    "        if (t >= 0 && t < rows) tgk_red_add4(out + ((int64_t)t * dim4 + e % dim4) * 4, x);\n"
    "    }\n"
    "    if (chunks > 1) {\n"
    "        double *q = part + ((int64_t)c * per4 + e) * 4;\n"
    "        if (e < per4) q[0] = t0, q[1] = t1, q[2] = t2, q[3] = t3;\n"
    "        if (!tgk_last_block(count + blockIdx.x, chunks)) return;\n"
    "        t0 = t1 = t2 = t3 = 0;\n"
    "        for (int k = 0; e < per4 && k < chunks; k++) {\n"
    "            q = part + ((int64_t)k * per4 + e) * 4;\n"
    "            t0 += __ldcg(q); t1 += __ldcg(q + 1); t2 += __ldcg(q + 2); t3 += __ldcg(q + 3);\n"
    "        }\n"
    "    }\n"
    "    if (e < per4) *(float4 *)(total + 4ll * e) = make_float4((float)t0, (float)t1, (float)t2, (float)t3);\n}\n"
    "static __device__ void tgk_scatter_along(const float *v, const int32_t *idx, float *out, int64_t outer, int64_t nk,\n"
    "                                         int64_t inner, int64_t nout) {\n"
    "    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (e >= outer * nk * inner) return;\n"
    "    const int64_t o = e / (nk * inner), j = e % inner;\n"
    "    const int32_t t = idx[e];\n"
    "    if (t >= 0 && t < nout) atomicAdd(out + (o * nout + t) * inner + j, v[e]);\n}\n"
    /* out pixel (n, c, y, x) sums every column entry read from it */
    "static __device__ void tgk_col2im(const float *cols, float *out, int64_t N, int64_t C, int64_t H, int64_t W,\n"
    "                                  int64_t kh, int64_t kw, int64_t s, int64_t pad) {\n"
    "    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (e >= N * C * H * W) return;\n"
    "    const int64_t x = e % W, y = (e / W) % H, nc = e / (H * W);\n"
    "    const int64_t ho = (H + 2 * pad - kh) / s + 1, wo = (W + 2 * pad - kw) / s + 1;\n"
    "    float acc = 0;\n"
    "    for (int64_t i = 0; i < kh; i++) {\n"
    "        const int64_t ty = y + pad - i;\n"
    "        if (ty < 0 || ty % s != 0 || ty / s >= ho) continue;\n"
    "        for (int64_t j = 0; j < kw; j++) {\n"
    "            const int64_t tx = x + pad - j;\n"
    "            if (tx < 0 || tx % s != 0 || tx / s >= wo) continue;\n"
    "            acc += cols[((nc * kh + i) * kw + j) * ho * wo + (ty / s) * wo + tx / s];\n"
    "        }\n"
    "    }\n"
    "    out[e] = acc;\n}\n"
    /* forward (g == 0): out = window max; backward: out[first max] += g, one thread per window */
    "static __device__ void tgk_maxpool(const float *x, const float *g, float *out, int64_t N, int64_t C, int64_t H,\n"
    "                                   int64_t W, int64_t k, int64_t s, int64_t pad) {\n"
    "    const int64_t ho = (H + 2 * pad - k) / s + 1, wo = (W + 2 * pad - k) / s + 1;\n"
    "    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (e >= N * C * ho * wo) return;\n"
    "    const int64_t ox = e % wo, oy = (e / wo) % ho, nc = e / (ho * wo);\n"
    "    const float *img = x + nc * H * W;\n"
    "    int64_t best = -1;\n"
    "    for (int64_t i = 0; i < k; i++) {\n"
    "        const int64_t y = oy * s - pad + i;\n"
    "        if (y < 0 || y >= H) continue;\n"
    "        for (int64_t j = 0; j < k; j++) {\n"
    "            const int64_t xx = ox * s - pad + j;\n"
    "            if (xx < 0 || xx >= W) continue;\n"
    "            const float v = img[y * W + xx];\n"
    "            if (best < 0 || v > img[best] || (v != v && img[best] == img[best])) best = y * W + xx;\n"
    "        }\n"
    "    }\n"
    "    if (g) { if (best >= 0) atomicAdd(out + nc * H * W + best, g[e]); }\n"
    "    else out[e] = best >= 0 ? img[best] : -INFINITY;\n}\n"
    /* The end of a training step. tg_wb_check: a value to write back that is NaN or infinite (as
     * every update of a parameter whose gradient was) sets *flag (zeroed before) to NaN.
     * tg_writeback: write-back y of the table (blockIdx.y) copies its source into its persistent
     * buffer, only if loss + *flag is finite, so a step with a NaN or infinite loss or gradient
     * changes nothing. One pass over the new values, instead of a reduction per gradient. Such a
     * step also sets *poison, which stays until the host clears it: the steps queued behind it
     * (tg_steps) change nothing either. Its first thread reports the loss and the flag side by
     * side, for the host to read in one copy. */
    "struct tgk_copy { const float *src; float *dst; long long n; };\n"
    "extern \"C\" __global__ void tg_wb_check(float *flag, const tgk_copy *table) {\n"
    "    const tgk_copy c = table[blockIdx.y];\n"
    "    bool bad = false;\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < c.n; i += (long long)gridDim.x * blockDim.x)\n"
    "        bad |= !isfinite(c.src[i]);\n"
    "    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *flag = NAN;\n}\n"
    /* Four or two floats from p (a bound leaf's pointer, which need not be 16-byte aligned): one
     * vector load where the address allows, element by element where not */
    "static __device__ inline float4 tgk_load4(const float *p) {\n"
    "    return ((unsigned long long)p & 15) == 0 ? *(const float4 *)p : make_float4(p[0], p[1], p[2], p[3]);\n}\n"
    "static __device__ inline float2 tgk_load2(const float *p) {\n"
    "    return ((unsigned long long)p & 7) == 0 ? *(const float2 *)p : make_float2(p[0], p[1]);\n}\n"
    /* and stored so (a leaf replaced in place) */
    "static __device__ inline void tgk_store4(float *p, float4 v) {\n"
    "    if (((unsigned long long)p & 15) == 0) *(float4 *)p = v;\n"
    "    else p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;\n}\n"
    "static __device__ inline void tgk_store2(float *p, float2 v) {\n"
    "    if (((unsigned long long)p & 7) == 0) *(float2 *)p = v;\n    else p[0] = v.x, p[1] = v.y;\n}\n"
    /* Operands of a product rounded as the reference's precision_round rounds them: tf32 to
     * nearest, ties away (an f32 with 13 low bits clear); bf16 to nearest even. */
    "static __device__ inline float tgk_round_tf32(float x) {\n"
    "    const unsigned u = __float_as_uint(x);\n"
    "    return (u & 0x7f800000u) == 0x7f800000u ? x : __uint_as_float((u + 0x1000u) & 0xffffe000u);\n}\n"
    /* x as two TF32 parts for a product that carries f32's precision in three tf32 products:
     * hi = x rounded (as tgk_round_tf32, in two integer operations: an infinite or NaN x leaves
     * lo NaN, so the product is NaN, non-finite either way), lo = what is left, exact in f32,
     * which the tensor cores read as TF32 by dropping its low 13 bits (an error of at most 2^-21
     * x, against f32's 2^-24) */
    "static __device__ inline void tgk_split_tf32(float x, unsigned &hi, unsigned &lo) {\n"
    "    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;\n"
    "    lo = __float_as_uint(x - __uint_as_float(hi));\n}\n"
    "static __device__ inline unsigned short tgk_round_bf16(float x) {\n"   /* one instruction from sm_80 on */
    "#if __CUDA_ARCH__ >= 800\n"
    "    unsigned short h;\n"
    "    asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(x));\n"
    "    return h;\n"
    "#else\n"
    "    const unsigned u = __float_as_uint(x);\n"
    "    return (unsigned short)(((u & 0x7f800000u) == 0x7f800000u ? u : u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "#endif\n}\n"
    "static __device__ inline float tgk_round_bf16_float(float x) { return __uint_as_float((unsigned)tgk_round_bf16(x) << 16); }\n"
    /* two values rounded, as the bf16 pair of a 4-byte store: lo at the lower address */
    "static __device__ inline unsigned tgk_pack_bf16(float lo, float hi) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    unsigned d;\n"
    "    asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(d) : \"f\"(hi), \"f\"(lo));\n"
    "    return d;\n"
    "#else\n"
    "    return (unsigned)tgk_round_bf16(lo) | (unsigned)tgk_round_bf16(hi) << 16;\n"
    "#endif\n}\n"
    /* A graph's ends (cuda_backend.c's graph_begin, report_loss): the run's hyper scalars (and the
     * flag's zero after them) read from the host's pinned memory, and cuBLASLt's counters zeroed,
     * as the graph's first kernel; the loss and the flag written into the host's pinned memory as
     * its last. Copy and memset nodes cost a step about 20 us between them (char_gpt, H200). */
    "extern \"C\" __global__ void tg_begin(const double *hyper, double *dst, int n, unsigned *zero, int n_zero) {\n"
    "    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = hyper[i];\n"
    "    for (int i = threadIdx.x; i < n_zero; i += blockDim.x) zero[i] = 0u;\n}\n"
    "extern \"C\" __global__ void tg_report(const float *src, float *dst, int n) {\n"
    "    if ((int)threadIdx.x < n) dst[threadIdx.x] = src[threadIdx.x];\n}\n"
    /* a buffer cleared for sums added up in memory (CL_MEMSET: attention's dq, scattered rows): a
     * kernel, not a memset node, so that it and the kernel after it launch early (cuda_start);
     * four floats a thread, over as many blocks as the launch has */
    "extern \"C\" __global__ void tg_zero(float *p, long long n) {\n"
    "    tgk_prior();\n"
    "    for (long long i = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += 4ll * gridDim.x * blockDim.x)\n"
    "        if (i + 4 <= n && ((unsigned long long)p & 15) == 0) *(float4 *)(p + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n"
    "        else for (long long k = i; k < i + 4 && k < n; k++) p[k] = 0.0f;\n"
    "}\n"
    /* a product's addend where cuBLASLt does not add it (cuda_fold_addends): the product's f32
     * sums plus the addend (a bias: `cols` values for every row; a matrix: cols = n), bf16 or
     * f32, rounded once */
    "extern \"C\" __global__ void tg_add_addend(const float *sums, const void *addend, int addend_bf16, void *C, long long n,\n"
    "                                         long long cols, int c_bf16) {\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {\n"
    "        const long long j = i % cols;\n"
    "        const float v = sums[i] + (addend_bf16 ? __uint_as_float((unsigned)((const unsigned short *)addend)[j] << 16)\n"
    "                                              : ((const float *)addend)[j]);\n"
    "        if (c_bf16) ((unsigned short *)C)[i] = tgk_round_bf16(v);\n"
    "        else ((float *)C)[i] = v;\n"
    "    }\n"
    "}\n"
    "extern \"C\" __global__ void tg_to_tf32(const float *src, float *dst, long long n) {\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)\n"
    "        dst[i] = tgk_round_tf32(src[i]);\n}\n"
    "extern \"C\" __global__ void tg_to_bf16(const float *src, unsigned short *dst, long long n) {\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)\n"
    "        dst[i] = tgk_round_bf16(src[i]);\n}\n"
    "extern \"C\" __global__ void tg_writeback(const float *loss, const float *flag, float *poison, const tgk_copy *table,\n"
    "                                        float *report) {\n"
    "    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) report[0] = *loss, report[1] = *flag;\n"
    "    if (!isfinite(*loss + *flag + *poison)) {\n"
    "        if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *poison = NAN;\n"
    "        return;\n"
    "    }\n"
    "    const tgk_copy c = table[blockIdx.y];\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < c.n; i += (long long)gridDim.x * blockDim.x)\n"
    "        c.dst[i] = c.src[i];\n}\n\n";

/* tgk_prior, the first statement of every generated kernel: launched early (programmatic
 * dependent launch, sm_90 on: cuda_backend.c's cuda_start), a kernel's blocks may start while
 * the kernel before it on the stream still runs, so each waits here for that kernel's results
 * (and so for everything before it) before it reads or writes memory; then lets the kernel after
 * it start the same way. Launched as usual, or before sm_90, it does nothing. */
static const char HEADER[] =
    "typedef long long int64_t;\ntypedef unsigned long long uint64_t;\ntypedef int int32_t;\ntypedef unsigned uint32_t;\n"
    "#define INFINITY __int_as_float(0x7f800000)\n#define NAN __int_as_float(0x7fffffff)\n"
    "static __device__ inline float tgk_rcp(float x) { return __fdividef(1.0f, x); }\n"
    "static __device__ __forceinline__ void tgk_prior(void) {\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "    asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");\n"
    "#endif\n}\n\n";

/* Write-back sources to check where they are stored: those with a buffer of their own (an alias
 * is stored by its home's kernel). NULL when the graph writes nothing back. */
static bool *writeback_sources(const tg_graph *g, const tg_plan *plan) {
    bool *src = g->n_assigns > 0 ? tg_alloc(sizeof(bool) * (size_t)(g->n + 1)) : NULL;
    for (int k = 0; src && k < g->n_assigns; k++)
        if (plan_home(plan, g->assigns[k].src) == g->assigns[k].src) src[g->assigns[k].src] = true;
    return src;
}

/* Did the source check every write-back source's values (WB_MARK after each check)? Marks read
 * back from the final text, so that code a generator discarded counts for nothing. */
static bool writebacks_checked(const tg_graph *g, const char *source) {
    bool *seen = tg_alloc(sizeof(bool) * (size_t)(g->n + 1)), all = seen != NULL && g->n_assigns > 0;
    for (const char *m = strstr(source, WB_MARK); m && seen; m = strstr(m + 1, WB_MARK)) {
        int id = atoi(m + strlen(WB_MARK));
        if (id >= 0 && id < g->n) seen[id] = true;
    }
    for (int k = 0; all && k < g->n_assigns; k++) all = seen[g->assigns[k].src];
    free(seen);
    return all;
}

char *codegen_cuda(const tg_graph *g, const bool *materialized, const tg_plan *plan, const int *inplace_ok, cuda_plan *launches,
                   int sm, int *unsupported) {
    strbuf out = { 0 };
    cg c;
    long failures = alloc_failures();   /* any allocation failing from here on voids the source */
    memset(launches, 0, sizeof *launches);
    launches->sm = sm;
    launches->g = g;
    if (!cg_init(&c, g, materialized, plan, &out)) {
        cg_release(&c);
        return NULL;
    }
    sb_printf(&out, "/* generated by tensorgrad: %d nodes */\n%s", g->n, HEADER);
    cg_prelude(&out, "static __device__ inline");
    sb_printf(&out, "%s", DEVICE_KERNELS);
    for (int i = 0; i < g->n; i++)   /* only graphs with attention pay for compiling it */
        if (materialized[i] && is_attention(g->nodes[i].op)) {
            sb_printf(&out, "%s%s%s", CUDA_ATTENTION_SOURCE, sm >= 80 ? CUDA_ATTENTION_MMA_SOURCE : "", sm == 90 ? CUDA_ATTENTION_WG_SOURCE : "");
            break;
        }
    if (g->precision != TG_PRECISION_BF16) sb_printf(&out, "%s", CUDA_PRODUCT_SOURCE);
    if (g->precision == TG_PRECISION_F32) sb_printf(&out, "%s", CUDA_PRODUCT3_SOURCE);
    launches->prelude = out.len;
    c.operand_round = g->precision == TG_PRECISION_BF16 ? "tgk_round_bf16_float" : g->precision == TG_PRECISION_TF32 ? "tgk_round_tf32" : NULL;
    bool *wb_src = inplace_ok ? NULL : writeback_sources(g, plan);   /* in place: the gradients are checked instead */
    c.wb_check = wb_src;
    c.flag_slot = cuda_hyper_slots(g);
    c.inplace_ok = inplace_ok;
    if (inplace_ok && (c.inplace = tg_alloc(sizeof(int) * (size_t)(g->n + 1))))
        for (int i = 0; i < g->n; i++) c.inplace[i] = -1;
    if (inplace_ok) c.checked = tg_alloc(sizeof(bool) * (size_t)(g->n_params + 1));   /* NULL: kcheck alone */
    for (int i = 0; c.checked && i < g->n_params; i++) c.checked[i] = false;
    c.copy_by_sum = c.copy_sum = -1;
    c.scatter_sum = c.sum_scatter = -1;
    leaf_kernel(&c, launches);
    int *order = tg_alloc(sizeof(int) * (size_t)(g->n + 1)), n_order = 0;
    bool *done = tg_alloc(sizeof(bool) * (size_t)(g->n + 1));   /* brought forward into an earlier kernel (sum_kernel) */
    for (int i = 0; order && done && i < g->n; i++)
        if (materialized[i] && plan->alias[i] < 0) done[n_order] = false, order[n_order++] = i;   /* aliases share a buffer: no kernel */
    for (int q = 0; q < n_order; q++) {
        if (done[q]) continue;
        int i = order[q], taken, first = q, n = q + 1;   /* kernels take nodes from order[q .. n) */
        while (n < n_order && !done[n]) n++;
        tg_op op = g->nodes[i].op;
        if (op == OP_SUM && c.sum_scatter < 0 && i != c.copy_sum && (c.sum_scatter = scatter_taking_sum(&c, i)) >= 0) {
            c.scatter_sum = i;   /* computed by that scatter's kernel */
            continue;
        }
        if (q + 1 < n && sum_producer(&c, i, order[q + 1]) &&
            sum_kernel(&c, launches, order[q + 1], i, order + q + 2, done + q + 2, n_order - q - 2, &taken))
            q += 1 + taken;
        else if (op == OP_SUM && (taken = row_columns(&c, launches, order + q, n - q)) > 0) q += taken - 1;
        else if ((op == OP_SUM || fuse_pointwise(op)) && (taken = row_kernel(&c, launches, order + q, n - q, NULL, NULL, 0)) > 0)
            q += taken - 1;
        else if (fuse_pointwise(op)) q += pointwise_kernel(&c, launches, order + q, n - q) - 1;
        else if (op == OP_SUM && sum_kernel(&c, launches, i, -1, order + q + 1, done + q + 1, n_order - q - 1, &taken)) q += taken;
        else if (is_attention(op)) q += attention_kernel(&c, launches, i, order + q + 1, n - q - 1);
        else special_kernel(&c, launches, i);
        bool target = c.copy_written;   /* this kernel was the one to write copy_by_sum's copy (its sum maybe brought forward) */
        for (int k = first; k <= q; k++) target |= order[k] == c.copy_sum;
        if (target && !c.copy_written) fill_shadow(&c, launches, c.copy_by_sum);   /* the sum did not take it */
        if (target) c.copy_by_sum = c.copy_sum = -1, c.copy_written = false;
        for (int k = first; k <= q; k++) {
            const int by = c.copy_by_sum < 0 ? sum_copying(&c, order[k], order, done, q + 1, n_order) : -1;
            if (by >= 0) c.copy_by_sum = order[k], c.copy_sum = by;
            else fill_shadow(&c, launches, order[k]);
        }
        if (inplace_ok && !c.kcheck_out) grad_check_piece(&c, launches, order[q]);
    }
    if (c.copy_by_sum >= 0) fill_shadow(&c, launches, c.copy_by_sum);   /* (its sum was never reached: no reader either) */
    free(order);
    free(done);
    if (inplace_ok && !c.kcheck_out) grad_check_kernel(&c, launches);   /* no kernel replaced a leaf */
    launches->inplace = c.inplace;
    free(c.checked);
    launches->grads_checked = inplace_ok != NULL;
    bool used[4] = { false }, used3[4] = { false };   /* our product kernels' instances (f32 and tf32 graphs; f32) */
    for (int i = 0; i < launches->n && g->precision != TG_PRECISION_BF16; i++) {
        const cuda_launch *l = &launches->launch[i];
        if (l->kind == CL_GEMM && cuda_own_product(l->M, l->N, l->K, l->batch)) used[l->ta * 2 + l->tb] = true;
        if (l->kind == CL_GEMM && g->precision == TG_PRECISION_F32 && cuda_x3_product(l->M, l->N, l->K, l->batch))
            used3[l->ta * 2 + l->tb] = true;
    }
    for (int k = 0; k < 4; k++) sb_printf(&out, "%s%s", used[k] ? CUDA_PRODUCT_KERNELS[k] : "", used3[k] ? CUDA_PRODUCT3_KERNELS[k] : "");
    *unsupported = c.unsupported;
    cg_release(&c);
    free(wb_src);
    launches->writebacks_checked = out.s && !inplace_ok && writebacks_checked(g, out.s);
    if (alloc_failures() != failures || *unsupported >= 0) {   /* placeholders or holes: not a program */
        free(out.s);
        cuda_plan_free(launches);
        return NULL;
    }
    return out.s;
}

void cuda_plan_free(cuda_plan *p) {
    for (int i = 0; i < p->n; i++) {
        free(p->launch[i].aoff);
        free(p->launch[i].boff);
        free(p->launch[i].io);
    }
    free(p->launch);
    free(p->inplace);
    memset(p, 0, sizeof *p);
}
