/* The buffer plan: every computed node gets a place in one arena, and two nodes share memory
 * when their lifetimes (from their own step to their last consumer's) do not overlap. A node's
 * output never overlaps its inputs, which are still live when it runs. */
#include "compile/compile.h"
#include "compile/expr.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 16   /* elements: keeps every buffer 64-byte aligned for vector loads of floats */

static bool is_bound(tg_op op) { return op == OP_INPUT || op == OP_PARAM || op == OP_STATE; }

/* A buffer to place: its size and the steps it is live, from its birth to its last reader
 * (inclusive); two buffers whose lifetimes meet must not overlap. */
typedef struct { size_t size, off; int from, to; } span;

static size_t aligned(size_t numel) { return (numel + ALIGN - 1) / ALIGN * ALIGN; }

/* Offsets for the spans taken in `order`: each at the lowest offset clear of the spans placed
 * before it whose lifetimes meet its own (by_off: scratch of n, the placed ones by offset).
 * `births`: the order is by birth, so a span that ended before the current one began ends before
 * every later one begins too, and leaves the list (placing stays linear in the live spans).
 * Returns the arena's size in elements, or PLAN_BOUND past PLAN_MAX_ARENA. */
static size_t place_spans(span *s, const int *order, int n, int *by_off, bool births) {
    size_t top = 0;
    int placed = 0;
    for (int q = 0; q < n; q++) {
        span *x = &s[order[q]];
        size_t at = 0;
        int w = 0;
        for (int j = 0; j < placed; j++) {
            const span *y = &s[by_off[j]];
            if (births && y->to < x->from) continue;   /* dead for good: dropped */
            by_off[w++] = by_off[j];
            if (y->to < x->from || y->from > x->to || y->off >= at + x->size) continue;
            if (y->off + y->size > at) at = y->off + y->size;
        }
        placed = w;
        if (at > PLAN_MAX_ARENA - x->size) return PLAN_BOUND;
        x->off = at;
        int pos = placed++;
        while (pos > 0 && s[by_off[pos - 1]].off > at) { by_off[pos] = by_off[pos - 1]; pos--; }
        by_off[pos] = order[q];
        if (at + x->size > top) top = at + x->size;
    }
    return top;
}

typedef struct { size_t size; int k; } by_size;

static int larger_first(const void *a, const void *b) {
    const by_size *x = a, *y = b;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->k - y->k;   /* then as given: birth order */
}

/* Offsets for n spans given in birth order (s[k].off; arena: the size in elements): placed as
 * they are born, or the largest first, whichever needs less memory. Each greedy order leaves
 * holes the other avoids: births pack the forward's short-lived temporaries, sizes keep the large
 * saved activations together. The largest-first pass compares every pair of spans, a cost that
 * grows with the square of their number: graphs of more than LARGEST_FIRST_MAX buffers skip it.
 * False when memory runs out or past PLAN_MAX_ARENA. */
#define LARGEST_FIRST_MAX 16384
static bool place_all(span *s, int n, size_t *arena) {
    int *order = tg_alloc(sizeof(int) * (size_t)(n + 1)), *by_off = tg_alloc(sizeof(int) * (size_t)(n + 1));
    size_t *birth = tg_alloc(sizeof(size_t) * (size_t)(n + 1));
    by_size *sizes = tg_alloc(sizeof(by_size) * (size_t)(n + 1));
    bool ok = order && by_off && birth && sizes;
    if (ok) {
        for (int k = 0; k < n; k++) order[k] = k;
        size_t births = place_spans(s, order, n, by_off, true), largest = PLAN_BOUND;
        if (n <= LARGEST_FIRST_MAX) {
            for (int k = 0; k < n; k++) birth[k] = s[k].off, sizes[k] = (by_size){ s[k].size, k };
            qsort(sizes, (size_t)n, sizeof *sizes, larger_first);
            for (int k = 0; k < n; k++) order[k] = sizes[k].k;
            largest = place_spans(s, order, n, by_off, false);
            if (largest > births)
                for (int k = 0; k < n; k++) s[k].off = birth[k];
        }
        *arena = largest < births ? largest : births;
        ok = *arena != PLAN_BOUND;
    }
    free(order);
    free(by_off);
    free(birth);
    free(sizes);
    return ok;
}

/* The nodes in the order their buffers are born (by step, then index): a counting sort. */
static int *birth_order(const int *born, int n) {
    int *seq = tg_alloc(sizeof(int) * (size_t)(n + 1)), *start = tg_alloc(sizeof(int) * (size_t)(n + 2));
    if (seq && start) {
        memset(start, 0, sizeof(int) * (size_t)(n + 2));
        for (int i = 0; i < n; i++) start[born[i] + 1]++;
        for (int t = 0; t < n; t++) start[t + 1] += start[t];
        for (int i = 0; i < n; i++) seq[start[born[i]]++] = i;
    }
    free(start);
    if (!start) {
        free(seq);
        return NULL;
    }
    return seq;
}

bool plan_build(const tg_graph *g, const int *keep, int n_keep, const bool *materialized, const int *alias,
                const int *live_until, const bool *unplaced, const int *born, tg_plan *out) {
    int n = g->n;
    int *last = out->last = tg_alloc(sizeof(int) * (size_t)(n + 1));
    out->offset = tg_alloc(sizeof(size_t) * (size_t)(n + 1));
    out->alias = tg_alloc(sizeof(int) * (size_t)(n + 1));
    out->born = tg_alloc(sizeof(int) * (size_t)(n + 1));
    out->shadow = out->tshadow = NULL;
    out->arena = 0;
    int *seq = NULL;
    for (int i = 0; out->born && i < n; i++) out->born[i] = born && born[i] >= 0 && born[i] < i ? born[i] : i;
    if (out->born) seq = birth_order(out->born, n);
    if (!last || !out->offset || !out->alias || !seq) {
        free(seq);
        plan_free(out);
        return false;
    }
    for (int i = 0; i < n; i++) out->alias[i] = alias ? alias[i] : -1;
    /* A buffer is read last by the last kernel that reads it, directly or through nodes
     * computed inside that kernel; consumers come after their sources, so one backward sweep
     * settles it. */
    for (int i = 0; i < n; i++) last[i] = i;
    for (int k = 0; k < n_keep; k++)
        if (keep[k] >= 0) last[keep[k]] = n;
    for (int k = 0; k < g->n_assigns; k++) last[g->assigns[k].src] = n;
    for (int i = n - 1; i >= 0; i--) {
        int reader = (!materialized || materialized[i]) ? i : last[i];
        if (live_until && live_until[i] > reader) reader = live_until[i];
        for (int k = 0; k < g->nodes[i].nsrc; k++)
            if (last[g->nodes[i].src[k]] < reader) last[g->nodes[i].src[k]] = reader;
        if (out->alias[i] >= 0 && last[out->alias[i]] < last[i]) last[out->alias[i]] = last[i];   /* shared buffer */
    }

    /* The buffers in birth order (an alias is born with, after, its home: it takes its offset) */
    span *sp = tg_alloc(sizeof(span) * (size_t)(n + 1));
    int *of = tg_alloc(sizeof(int) * (size_t)(n + 1)), n_sp = 0;
    bool ok = sp && of;
    for (int s = 0; ok && s < n; s++) {
        int i = seq[s];
        bool none = is_bound(g->nodes[i].op) || (materialized && !materialized[i]) || (unplaced && unplaced[i]);
        out->offset[i] = PLAN_BOUND;
        if (none || out->alias[i] >= 0) continue;
        of[n_sp] = i;
        sp[n_sp++] = (span){ aligned((size_t)g->nodes[i].numel), 0, out->born[i], last[i] };
    }
    ok = ok && place_all(sp, n_sp, &out->arena);
    for (int k = 0; ok && k < n_sp; k++) out->offset[of[k]] = sp[k].off;
    for (int s = 0; ok && s < n; s++)
        if (out->alias[seq[s]] >= 0) out->offset[seq[s]] = out->offset[out->alias[seq[s]]];
    free(sp);
    free(of);
    free(seq);
    if (!ok) plan_free(out);
    return ok;
}

bool plan_shadows(const tg_graph *g, tg_plan *p, const bool *want, const bool *want_t, int elem_bytes) {
    int n = g->n, *seq = birth_order(p->born, n), *of = tg_alloc(sizeof(int) * (size_t)(2 * n + 1)), n_sp = 0;
    span *sp = tg_alloc(sizeof(span) * (size_t)(2 * n + 1));
    p->shadow = tg_alloc(sizeof(size_t) * (size_t)(n + 1));
    p->tshadow = tg_alloc(sizeof(size_t) * (size_t)(n + 1));
    bool ok = seq && of && sp && p->shadow && p->tshadow;
    for (int pass = 0; ok && pass < 2; pass++)   /* leaves first: they are rounded before the first kernel */
        for (int s = 0; s < n; s++) {
            int i = seq[s];
            if (is_bound(g->nodes[i].op) != (pass == 0)) continue;
            p->shadow[i] = p->tshadow[i] = PLAN_BOUND;
            size_t size = aligned(((size_t)g->nodes[i].numel * (size_t)elem_bytes + 3) / 4);
            for (int t = 0; t < 2; t++) {   /* of[k] >= n: node of[k] - n's transposed copy */
                if (!(t ? pass == 0 && want_t && want_t[i] : want[i])) continue;
                of[n_sp] = i + t * n;
                sp[n_sp++] = (span){ size, 0, pass ? p->born[i] : 0, p->last[i] };
            }
        }
    size_t top = 0, base = p->arena;
    ok = ok && place_all(sp, n_sp, &top) && base <= PLAN_MAX_ARENA - top;
    for (int k = 0; ok && k < n_sp; k++) *(of[k] < n ? &p->shadow[of[k]] : &p->tshadow[of[k] - n]) = base + sp[k].off;
    if (ok) p->arena = base + top;
    free(seq);
    free(of);
    free(sp);
    return ok;
}

/* Are all reads of `target` in the expression of `node` (inlined below `root`) at root's flat
 * index? `same`: node is evaluated at root's flat index. */
bool plan_reads_same_index(const tg_graph *g, const bool *mat, int root, int node, int target, bool same) {
    if (node == target) return same;
    const tg_node *n = &g->nodes[node];
    if (node != root && (mat[node] || cg_is_bound(n->op))) return true;
    for (int k = 0; k < n->nsrc; k++)
        if (!plan_reads_same_index(g, mat, root, n->src[k], target, same && cg_same_index(g, node, k))) return false;
    return true;
}

bool plan_inplace(const tg_graph *g, const int *keep, int n_keep, const bool *mat, const int *alias, int after, int *inplace) {
    int n = g->n;
    for (int i = 0; i < n; i++) inplace[i] = -1;
    int *last = tg_alloc(sizeof(int) * (size_t)(n + 1));
    bool *kept = tg_alloc(sizeof(bool) * (size_t)(n + 1));
    if (!last || !kept) {
        free(last);
        free(kept);
        return false;
    }
    for (int k = 0; k < n_keep; k++)
        if (keep[k] >= 0) kept[keep[k]] = true;
    for (int k = 0; k < g->n_assigns; k++) kept[g->assigns[k].src] = true;
    if (g->output >= 0 && g->output < n) kept[g->output] = true;
    /* last[i]: the last node whose kernel reads i's buffer */
    for (int i = 0; i < n; i++) last[i] = kept[i] ? n : i;
    for (int i = n - 1; i >= 0; i--) {
        int reader = mat[i] ? i : last[i];
        for (int k = 0; k < g->nodes[i].nsrc; k++)
            if (last[g->nodes[i].src[k]] < reader) last[g->nodes[i].src[k]] = reader;
        if (alias[i] >= 0 && last[alias[i]] < last[i]) last[alias[i]] = last[i];
    }
    for (int k = 0; k < g->n_assigns; k++) {
        int dst = g->assigns[k].dst, src = g->assigns[k].src;
        const tg_node *ns = &g->nodes[src], *nd = &g->nodes[dst];
        bool ok = mat[src] && alias[src] < 0 && fuse_pointwise(ns->op) && ns->numel == nd->numel && ns->dtype == nd->dtype &&
                  src > after && (nd->op == OP_PARAM || nd->op == OP_STATE) && last[dst] <= src;
        for (int j = 0; ok && j < n_keep; j++) ok = keep[j] != src;
        for (int j = 0; ok && j < g->n_assigns; j++)
            if (j != k) ok = g->assigns[j].src != src && g->assigns[j].dst != dst;
        if (ok && plan_reads_same_index(g, mat, src, src, dst, true)) inplace[src] = dst;
    }
    free(last);
    free(kept);
    return true;
}

void plan_free(tg_plan *p) {
    free(p->offset);
    free(p->alias);
    free(p->last);
    free(p->shadow);
    free(p->tshadow);
    free(p->born);
    p->born = NULL;
    p->offset = NULL;
    p->alias = NULL;
    p->last = NULL;
    p->shadow = p->tshadow = NULL;
}
