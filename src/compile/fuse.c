/* The scheduler of compiled backends: which nodes get memory (materialized, each computed by a
 * kernel of its own) and which are computed inside the kernels that read them (inlined).
 *
 * Pointwise ops — those whose element at an output coordinate is a function of their sources'
 * elements at coordinates derived from it — inline into their consumer: chains of elementwise
 * ops become one loop, movement ops (reshape, permute, expand, narrow, pad) become index
 * arithmetic, and gathers (embedding, one_hot, take_along_axis, im2col) read through computed
 * indices. A reduction (sum) reads its inlined producer directly. On a GPU a small matrix
 * product or sum is computed where it is read too (a few terms per element), and softmax
 * computes its source (a classifier's bias add). Everything else (larger products, softmax on
 * a CPU, scatters, pooling) reads materialized sources from memory. */
#include "compile/compile.h"

#include <stdlib.h>

bool fuse_pointwise(tg_op op) {
    switch (op) {
    case OP_CONST: case OP_HYPER: case OP_IOTA: case OP_RANDN:
    case OP_NEG: case OP_ABS: case OP_SQUARE: case OP_SQRT: case OP_RSQRT: case OP_EXP: case OP_LOG:
    case OP_RELU: case OP_TANH: case OP_SIGMOID: case OP_SIGN: case OP_STEP:
    case OP_SIN: case OP_COS: case OP_GELU: case OP_GELU_GRAD: case OP_IDENTITY:
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MIN: case OP_MAX:
    case OP_LESS: case OP_GREATER: case OP_EQUAL: case OP_WHERE:
    case OP_RESHAPE: case OP_PERMUTE: case OP_EXPAND: case OP_SLICE: case OP_PAD:
    case OP_WHERE_CAUSAL: case OP_DROPOUT:
    case OP_ONE_HOT: case OP_GATHER_ROWS: case OP_TAKE_ALONG: case OP_IM2COL:
        return true;
    default:
        return false;
    }
}

/* Cheap enough to recompute in every consumer rather than store. */
static bool trivial(tg_op op) { return op == OP_CONST || op == OP_HYPER || op == OP_IOTA; }

/* The cost of recomputing an op in each consumer: 0 for relabelling (index arithmetic), 1 for
 * arithmetic without transcendentals, comparisons and one-hot, more than CHEAP_OPS otherwise. */
enum { CHEAP_OPS = 8 };   /* the most ops a value read by several kernels is recomputed with */

static int recompute_cost(tg_op op) {
    switch (op) {
    case OP_RESHAPE: case OP_IDENTITY: case OP_EXPAND:
        return 0;
    case OP_CONST: case OP_HYPER: case OP_IOTA: case OP_NEG: case OP_ADD: case OP_SUB: case OP_MUL:
    case OP_LESS: case OP_GREATER: case OP_EQUAL: case OP_WHERE: case OP_ONE_HOT:
        return 1;
    default:
        return CHEAP_OPS + 1;
    }
}

/* A value read by k kernels, of n elements, whose inlined expression reads `reads` distinct
 * elements from memory: recomputed in each of them when that moves less data than storing it
 * once and reading it k times (k reads < reads + n + k n), and costs few ops. Then it needs no
 * kernel of its own: the gradient of a cross-entropy, -one_hot(y) / n, read by two kernels, or a
 * residual sum x + f(x) that a layer norm and the next residual both read. At equal data it is
 * stored: each reader then streams one array instead of two (a residual sum x + y read by three
 * kernels, char_gpt's at bf16 on an H100: the layer norm's column sums 0.020 -> 0.030 ms a
 * launch recomputing it). */
static bool worth_recomputing(int k, int64_t n, int64_t reads, int ops) {
    return ops <= CHEAP_OPS && (double)k * (double)reads < (double)reads + (double)n * (k + 1);
}

/* Small reductions: a product of at most SMALL_REDUCTION multiply-adds per element (and
 * SMALL_PRODUCT_MACS in all, past which the tensor cores' arithmetic counts), or a sum of at
 * most SMALL_REDUCTION elements. A library call for such a product costs more than its work (on
 * an H100 3-6 us, and a launch gap), and a kernel for such a sum (a cross-entropy's sum over 10
 * classes) about 2 us; computed inside the kernel that reads it (the bias add, the activation's
 * gradient) either adds a few operations per element. Not longer ones: a thread's loop over k
 * waits on its loads, and a kernel of a few thousand elements has too few threads to hide that
 * (on an H100, products with k = 64 to 512 inline made sin_mlp's step 0.069 -> 0.128 ms). */
enum { SMALL_PRODUCT_MACS = 1 << 21, SMALL_REDUCTION = 16 };

bool fuse_small_reduction(const tg_graph *g, int id) {
    const tg_node *n = &g->nodes[id];
    if ((n->op != OP_SUM && n->op != OP_MATMUL) || n->nsrc > 2) return false;   /* a product with its bias: the library's */
    const tg_shape *a = &g->nodes[n->src[0]].shape;
    if (n->op == OP_SUM) return n->dtype == TG_FLOAT32 && a->d[n->axis] <= SMALL_REDUCTION;
    int64_t k = a->d[a->ndim - (n->iarg[0] ? 2 : 1)];
    return k >= 1 && k <= SMALL_REDUCTION && (double)n->numel * (double)k <= SMALL_PRODUCT_MACS;
}

/* Does this consumer read the source through an inlined expression? Pointwise ops and sum do,
 * and softmax with FUSE_SOFTMAX_INPUT; the rest read memory. */
static bool reads_inline(tg_op consumer, unsigned gpu) {
    return fuse_pointwise(consumer) || consumer == OP_SUM ||
           ((gpu & FUSE_SOFTMAX_INPUT) && (consumer == OP_SOFTMAX || consumer == OP_LOG_SOFTMAX));
}

/* Reshapes and identities only relabel memory: when one must be in memory and its source already
 * is, it shares the source's buffer (chains resolve to the first buffer). */
static void find_aliases(const tg_graph *g, const bool *materialized, int *alias) {
    for (int i = 0; i < g->n; i++) {
        const tg_node *n = &g->nodes[i];
        alias[i] = -1;
        if ((n->op != OP_RESHAPE && n->op != OP_IDENTITY) || !materialized[i]) continue;
        int s = n->src[0];
        tg_op sop = g->nodes[s].op;
        bool in_memory = materialized[s] || sop == OP_INPUT || sop == OP_PARAM || sop == OP_STATE;
        if (in_memory) alias[i] = alias[s] >= 0 ? alias[s] : s;
    }
}

void fuse_schedule(const tg_graph *g, const int *keep, int n_keep, bool fuse, unsigned gpu, bool *materialized,
                   int *alias) {
    int n = g->n;
    int *uses = tg_alloc(sizeof(int) * (size_t)(n + 1));
    bool *memory_read = tg_alloc(sizeof(bool) * (size_t)(n + 1));
    bool *other_size = tg_alloc(sizeof(bool) * (size_t)(n + 1));   /* read by something not pointwise of its size */
    bool *by_reduction = tg_alloc(sizeof(bool) * (size_t)(n + 1));   /* read by something not pointwise */
    bool *kept = tg_alloc(sizeof(bool) * (size_t)(n + 1));
    bool *needed = tg_alloc(sizeof(bool) * (size_t)(n + 1));
    int *ops = tg_alloc(sizeof(int) * (size_t)(n + 1));
    int64_t *reads = tg_alloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!uses || !memory_read || !other_size || !by_reduction || !kept || !needed || !ops || !reads) {   /* no memory to analyse: the unfused schedule, as valid */
        fuse = false;
        free(needed);
        needed = NULL;
    }
    for (int k = 0; needed && k < n_keep; k++)
        if (keep[k] >= 0) kept[keep[k]] = needed[keep[k]] = true;
    for (int k = 0; needed && k < g->n_assigns; k++) kept[g->assigns[k].src] = needed[g->assigns[k].src] = true;
    for (int i = n - 1; needed && i >= 0; i--)   /* what the kept values depend on; the rest never runs */
        for (int k = 0; needed[i] && k < g->nodes[i].nsrc; k++) needed[g->nodes[i].src[k]] = true;
    for (int i = 0; fuse && i < n; i++)
        for (int k = 0; needed[i] && k < g->nodes[i].nsrc; k++) {
            int s = g->nodes[i].src[k];
            uses[s]++;
            if (!reads_inline(g->nodes[i].op, gpu)) memory_read[s] = true;
            if (!fuse_pointwise(g->nodes[i].op) || g->nodes[i].numel != g->nodes[s].numel) other_size[s] = true;
            if (!fuse_pointwise(g->nodes[i].op)) by_reduction[s] = true;
        }
    for (int i = 0; i < n; i++) {
        tg_op op = g->nodes[i].op;
        if (fuse) ops[i] = 0, reads[i] = g->nodes[i].numel;   /* in memory (or a leaf): a load of it */
        if (op == OP_INPUT || op == OP_PARAM || op == OP_STATE || (needed && !needed[i])) { materialized[i] = false; continue; }
        bool inline_ok = false;
        if (fuse && fuse_pointwise(op) && !kept[i] && !memory_read[i]) {
            int count = recompute_cost(op);   /* its expression's ops and reads, as far as it is inlined */
            int64_t from = 0;
            for (int k = 0; k < g->nodes[i].nsrc; k++) {
                count += ops[g->nodes[i].src[k]];
                from += reads[g->nodes[i].src[k]];
            }
            inline_ok = uses[i] <= 1 || trivial(op) || ((gpu & FUSE_RECOMPUTE) && worth_recomputing(uses[i], g->nodes[i].numel, from, count));
            if (inline_ok) ops[i] = count, reads[i] = from;
        } else if (fuse && (gpu & FUSE_SMALL_REDUCTIONS) && fuse_small_reduction(g, i) && !kept[i] && !memory_read[i] &&
                   (op == OP_MATMUL || !by_reduction[i])) {
            /* read by one kernel, or by pointwise nodes of its size (an optimizer's m and v,
             * which one thread per element computes together); a sum only by pointwise nodes (a
             * sum read by a sum is the reader's, over both axes: cuda_refine) */
            inline_ok = uses[i] <= 1 || !other_size[i];
            ops[i] = CHEAP_OPS + 1;   /* never recomputed as part of a cheap value */
        }
        materialized[i] = !inline_ok;
    }
    if (fuse) find_aliases(g, materialized, alias);
    else
        for (int i = 0; i < n; i++) alias[i] = -1;
    free(uses);
    free(ops);
    free(reads);
    free(memory_read);
    free(other_size);
    free(by_reduction);
    free(kept);
    free(needed);
}
