/* The buffer plan: every computed node gets a place in one arena, and two nodes share memory
 * when their lifetimes (from their own step to their last consumer's) do not overlap. A node's
 * output never overlaps its inputs, which are still live when it runs. */
#include "compile/compile.h"

#include <stdlib.h>
#include <string.h>

#define ALIGN 16   /* elements: keeps every buffer 64-byte aligned for vector loads of floats */

static bool is_bound(tg_op op) { return op == OP_INPUT || op == OP_PARAM || op == OP_STATE; }

typedef struct { size_t off, size; int last; } live_buf;

/* Lowest offset where `size` fits between the live buffers (kept sorted by offset). */
static size_t first_fit(const live_buf *live, int n, size_t size) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (live[i].off >= at + size) break;
        if (live[i].off + live[i].size > at) at = live[i].off + live[i].size;
    }
    return at;
}

/* Place a buffer of `numel` elements, needed from step `at` to step `last`, among the live ones:
 * its offset, PLAN_BOUND past PLAN_MAX_ARENA. */
static size_t place(live_buf *live, int *n_live, int at, size_t numel, int last, size_t *arena) {
    int w = 0;   /* drop buffers whose last reader ran before this step */
    for (int j = 0; j < *n_live; j++)
        if (live[j].last >= at) live[w++] = live[j];
    *n_live = w;
    size_t size = (numel + ALIGN - 1) / ALIGN * ALIGN;
    size_t off = first_fit(live, w, size);
    if (off > PLAN_MAX_ARENA - size) return PLAN_BOUND;   /* no machine has that much memory; sizes stay exact */
    int pos = w;
    while (pos > 0 && live[pos - 1].off > off) { live[pos] = live[pos - 1]; pos--; }
    live[pos] = (live_buf){ off, size, last };
    (*n_live)++;
    if (off + size > *arena) *arena = off + size;
    return off;
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
    live_buf *live = tg_alloc(sizeof(live_buf) * (size_t)(n + 1));
    out->offset = tg_alloc(sizeof(size_t) * (size_t)(n + 1));
    out->alias = tg_alloc(sizeof(int) * (size_t)(n + 1));
    out->born = tg_alloc(sizeof(int) * (size_t)(n + 1));
    out->shadow = NULL;
    out->arena = 0;
    int *seq = NULL;
    for (int i = 0; out->born && i < n; i++) out->born[i] = born && born[i] >= 0 && born[i] < i ? born[i] : i;
    if (out->born) seq = birth_order(out->born, n);
    if (!last || !live || !out->offset || !out->alias || !seq) {
        free(seq);
        free(live);
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

    int n_live = 0;
    for (int s = 0; s < n; s++) {   /* by birth: an alias is born with (after) its home */
        int i = seq[s];
        bool none = is_bound(g->nodes[i].op) || (materialized && !materialized[i]) || (unplaced && unplaced[i]);
        if (none) { out->offset[i] = PLAN_BOUND; continue; }
        if (out->alias[i] >= 0) { out->offset[i] = out->offset[out->alias[i]]; continue; }
        out->offset[i] = place(live, &n_live, out->born[i], (size_t)g->nodes[i].numel, last[i], &out->arena);
        if (out->offset[i] == PLAN_BOUND) {
            free(seq);
            free(live);
            plan_free(out);
            return false;
        }
    }
    free(seq);
    free(live);
    return true;
}

bool plan_shadows(const tg_graph *g, tg_plan *p, const bool *want, int elem_bytes) {
    int n = g->n;
    live_buf *live = tg_alloc(sizeof(live_buf) * (size_t)(n + 1));
    p->shadow = tg_alloc(sizeof(size_t) * (size_t)(n + 1));
    if (!live || !p->shadow) {
        free(live);
        return false;
    }
    int *seq = birth_order(p->born, n);
    if (!seq) {
        free(live);
        return false;
    }
    size_t base = p->arena, top = 0;
    int n_live = 0;
    for (int pass = 0; pass < 2; pass++)   /* leaves first: they are rounded before the first kernel */
        for (int s = 0; s < n; s++) {
            int i = seq[s];
            if (is_bound(g->nodes[i].op) != (pass == 0)) continue;
            p->shadow[i] = PLAN_BOUND;
            if (!want[i]) continue;
            size_t off = place(live, &n_live, pass ? p->born[i] : 0, ((size_t)g->nodes[i].numel * (size_t)elem_bytes + 3) / 4,
                               p->last[i], &top);
            if (off == PLAN_BOUND || base > PLAN_MAX_ARENA - top) {
                free(seq);
                free(live);
                return false;
            }
            p->shadow[i] = base + off;
        }
    p->arena = base + top;
    free(seq);
    free(live);
    return true;
}

void plan_free(tg_plan *p) {
    free(p->offset);
    free(p->alias);
    free(p->last);
    free(p->shadow);
    free(p->born);
    p->born = NULL;
    p->offset = NULL;
    p->alias = NULL;
    p->last = NULL;
    p->shadow = NULL;
}
