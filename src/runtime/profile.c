/* A backend's profile (TG_CUDA_PROFILE, TG_CPU_PROFILE), printed when its graph is released. */
#include "runtime/backend.h"

#include <stdio.h>
#include <stdlib.h>

static void print_call(const tg_graph *g, const profile_call *c, int i, int runs) {
    fprintf(stderr, "  #%-4d %-8s %-16s %s %8.3f ms\n", i, c->kind, c->node >= 0 ? op_name(g->nodes[c->node].op) : c->kind, c->what,
            1e3 * c->seconds / runs);
}

void profile_print(const char *backend, const char *unit, const char *note, const tg_graph *g, const profile_call *calls, int n,
                   int runs, bool all) {
    double *by_op = tg_alloc(sizeof(double) * (OP_COUNT + 1)), total = 0;
    bool *shown = tg_alloc(sizeof(bool) * ((size_t)n + 1));
    const char *none = "none";   /* what calls of no node are (a memset) */
    if (runs < 1) runs = 1;
    for (int i = 0; i < n && by_op; i++) {
        by_op[calls[i].node >= 0 ? (int)g->nodes[calls[i].node].op : OP_COUNT] += calls[i].seconds;
        total += calls[i].seconds;
        if (calls[i].node < 0) none = calls[i].kind;
    }
    fprintf(stderr, "tensorgrad %s profile (%d nodes, %d %s, %d runs, %.3f ms per run in %s%s):\n", backend, g->n, n, unit, runs,
            1e3 * total / runs, unit, note);
    for (int op = 0; op <= OP_COUNT && by_op; op++)
        if (by_op[op] > 0.005 * total)
            fprintf(stderr, "  %-20s %8.3f ms  %5.1f%%\n", op == OP_COUNT ? none : op_name((tg_op)op), 1e3 * by_op[op] / runs,
                    100 * by_op[op] / total);
    for (int k = 0; k < 40 && shown; k++) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (!shown[i] && (best < 0 || calls[i].seconds > calls[best].seconds)) best = i;
        if (best < 0) break;
        shown[best] = true;
        print_call(g, &calls[best], best, runs);
    }
    if (all) {
        fprintf(stderr, "every %s, in order:\n", unit);
        for (int i = 0; i < n; i++) print_call(g, &calls[i], i, runs);
    }
    free(shown);
    free(by_op);
}
