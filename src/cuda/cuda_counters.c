/* cuBLASLt's counters, zeroed once a step instead of before every product.
 *
 * At tf32 most of cuBLASLt's fast algorithms for large products keep counters in their workspace
 * and zero them with a memset before their kernel: 4 bytes at the start of a 131-byte workspace,
 * or, for the split reductions, 504 bytes at the end of a 16.5 MB one. In a step's CUDA graph each
 * memset is a node of its own and the GPU idles around it: it starts only once the kernel ahead
 * of it has ended, and the product's kernel only once it has (about 4 us a memset; 84 of them in
 * char_gpt's tf32 step, bench/RESULTS.md).
 *
 * So the first capture of a launch list learns which product calls open with such a memset, and
 * where in the workspace it lands (`counters_learn`); each of those calls then gets a window of
 * its own in one allocation, placed so that its counters lie outside the windows of every call
 * before it (a later call may reuse an earlier one's scratch, never the counters still ahead of
 * it); one memset at the start of the launch list zeroes all the counters, and after each
 * capture the memsets that open those calls are taken out of the graph (`counters_strip`):
 * nothing between the start and a call touches its counters, so they are still zero when it
 * begins. Each memset is checked against the calls before it in the graph itself and stays where
 * anything is not as planned. TG_CUDA_COUNTERS=0: every product on the shared workspace; =verbose: how many memsets
 * left each captured graph and how many stayed, on stderr. */
#include "cuda_api.h"
#include "../util/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW_ALIGN 256   /* cuBLAS's workspace alignment */

static size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static bool graph_api(void) {
    return cu.StreamGetCaptureInfo && cu.GraphGetNodes && cu.GraphGetRootNodes && cu.GraphNodeGetType && cu.GraphMemsetNodeGetParams &&
           cu.GraphNodeGetDependencies && cu.GraphNodeGetDependentNodes && cu.GraphAddDependencies && cu.GraphDestroyNode;
}

void counters_free(cuda_counters *c) {
    if (c->base) cu.MemFree(c->base);
    free(c->first);
    free(c->window);
    free(c->calls);
    memset(c, 0, sizeof *c);
}

bool counters_init(cuda_counters *c, int n_launches, const int64_t *calls) {
    const char *env = getenv("TG_CUDA_COUNTERS");
    memset(c, 0, sizeof *c);
    if ((env && env[0] == '0') || !graph_api()) return true;   /* never windows */
    c->first = tg_alloc(sizeof(int) * (size_t)(n_launches + 1));
    if (!c->first) return false;
    for (int i = 0; i < n_launches; i++) {
        c->first[i] = calls[i] > 0 ? c->n_windows : -1;
        c->n_windows += (int)calls[i];
    }
    c->window = tg_alloc(sizeof(counter_window) * (size_t)(c->n_windows + 1));
    c->calls = tg_alloc(sizeof(counter_call) * (size_t)(c->n_windows + 1));
    if (!c->window || !c->calls) {
        counters_free(c);
        return false;
    }
    for (int w = 0; w < c->n_windows; w++) c->window[w] = (counter_window){ .offset = -1 };
    return true;
}

void counters_begin(cuda_counters *c, CUdeviceptr shared) {
    c->n_calls = 0;
    c->capturing = true;
    c->shared = shared;
}

CUdeviceptr counters_window(const cuda_counters *c, int launch, int64_t call) {
    if (!c->first || c->first[launch] < 0) return 0;
    const counter_window *w = &c->window[c->first[launch] + call];
    return w->offset >= 0 ? c->base + (size_t)w->offset : 0;
}

CUdeviceptr counters_slice(cuda_counters *c, int launch, const lt_product *p, int64_t call, CUstream stream) {
    if (!c->first || c->first[launch] < 0) return 0;
    CUdeviceptr at = counters_window(c, launch, call);
    int status = 0;
    const CUgraphNode *last = NULL;
    size_t n_last = 0;
    if (c->capturing && c->n_calls < c->n_windows &&
        cu.StreamGetCaptureInfo(stream, &status, NULL, NULL, &last, &n_last) == 0 && status == CU_CAPTURE_STATUS_ACTIVE) {
        counter_call *k = &c->calls[c->n_calls++];
        *k = (counter_call){ .at = at ? at : c->shared, .bytes = p->workspace, .window = c->first[launch] + (int)call };
        if (n_last <= COUNTER_DEPS) {
            k->n_before = (int)n_last;
            memcpy(k->before, last, sizeof(CUgraphNode) * n_last);
        }
    }
    return at;
}

/* Are the n nodes of `up` the call's nodes before it, in any order? */
static bool same_before(const counter_call *k, const CUgraphNode *up, size_t n) {
    if (k->n_before == 0 || (size_t)k->n_before != n) return false;
    for (size_t i = 0; i < n; i++) {
        int j = 0;
        while (j < k->n_before && k->before[j] != up[i]) j++;
        if (j == k->n_before) return false;
    }
    return true;
}

/* The call that memset node m opens, its bytes in `ms`: the one whose last nodes before it are
 * m's dependencies (one, or several where the call follows a join of streams) and whose workspace
 * holds what m sets; -1 for any other memset. */
static int opened_call(const cuda_counters *c, CUgraphNode m, cu_memset_params *ms) {
    CUgraphNode up[COUNTER_DEPS];
    size_t n_up = 0;
    if (cu.GraphMemsetNodeGetParams(m, ms) || ms->value != 0 || ms->height != 1 ||
        cu.GraphNodeGetDependencies(m, NULL, NULL, &n_up) || n_up == 0 || n_up > COUNTER_DEPS ||
        cu.GraphNodeGetDependencies(m, up, NULL, &n_up))
        return -1;
    size_t bytes = ms->width * ms->element_size;
    for (int k = 0; k < c->n_calls; k++)
        if (same_before(&c->calls[k], up, n_up))
            return ms->dst >= c->calls[k].at && ms->dst + bytes <= c->calls[k].at + c->calls[k].bytes ? k : -1;
    return -1;
}

bool counters_learn(cuda_counters *c, int launch, int64_t calls, const lt_product *p, const lt_device *d, const void *A,
                    const void *B, void *C) {
    CUgraph g = NULL;
    CUgraphNode first;
    size_t n = 0;
    int type = -1;
    cu_memset_params ms;
    if (!c->first || c->first[launch] < 0 || p->own || p->workspace == 0) return true;
    if (cu.StreamBeginCapture(d->stream, CU_CAPTURE_THREAD_LOCAL)) return false;
    int rc = lt_run(p, d, A, B, C, false, 0);
    if (cu.StreamEndCapture(d->stream, &g) || rc) return false;
    /* the call's first node (its graph's root) a memset of its workspace: counters */
    if (cu.GraphGetRootNodes(g, NULL, &n) == 0 && n == 1 && cu.GraphGetRootNodes(g, &first, &n) == 0 &&
        cu.GraphNodeGetType(first, &type) == 0 &&
        type == CU_GRAPH_NODE_TYPE_MEMSET && cu.GraphMemsetNodeGetParams(first, &ms) == 0 && ms.value == 0 && ms.height == 1 &&
        ms.dst >= d->workspace && ms.dst + ms.width * ms.element_size <= d->workspace + p->workspace)
        for (int64_t j = 0; j < calls; j++)   /* a batch's calls: one algorithm */
            c->window[c->first[launch] + j] = (counter_window){ -1, p->workspace, ms.dst - d->workspace,
                                                                ms.dst - d->workspace + ms.width * ms.element_size };
    cu.GraphDestroy(g);
    return true;
}

/* Windows for the calls with counters, in the order they run: those with counters at an offset
 * first, each placed so that its counters start past the end of every window before it, then
 * those with counters at their start, after all of them. The counters lie together at the end. */
bool counters_place(cuda_counters *c) {
    size_t end = 0;
    c->zero_from = SIZE_MAX;
    for (int pass = 0; pass < 2 && c->first; pass++)
        for (int i = 0; i < c->n_windows; i++) {
            counter_window *w = &c->window[i];
            if (w->to == 0 || (w->from > 0) != (pass == 0)) continue;
            size_t at = end > w->from ? align_up(end - w->from, WINDOW_ALIGN) : 0;
            w->offset = (int64_t)at;
            end = at + w->bytes > end ? at + w->bytes : end;
            if (at + w->from < c->zero_from) c->zero_from = at + w->from;
        }
    c->zero_from &= ~(size_t)3;
    c->zero_to = align_up(end, WINDOW_ALIGN);
    if (!end) return true;
    if (cu.MemAlloc(&c->base, c->zero_to)) {   /* every call stays on the shared workspace */
        for (int i = 0; i < c->n_windows; i++) c->window[i].offset = -1;
        c->base = 0;
        return false;
    }
    return true;
}

/* Is what memset ms sets zeroed at the start, and outside the window of every call before call k? */
static bool zero_until(const cuda_counters *c, int k, const cu_memset_params *ms) {
    CUdeviceptr from = ms->dst, to = from + ms->width * ms->element_size;
    if (!c->base || from < c->base + c->zero_from || to > c->base + c->zero_to) return false;
    for (int j = 0; j < k; j++)
        if (from < c->calls[j].at + c->calls[j].bytes && c->calls[j].at < to) return false;
    return true;
}

/* Take memset m, which opens call k, out of g where that is safe. */
static void take_out(cuda_counters *c, CUgraph g, CUgraphNode m, int k, const cu_memset_params *ms) {
    CUgraphNode down[4];
    size_t n_down = 0;
    if (!zero_until(c, k, ms) || cu.GraphNodeGetDependentNodes(m, NULL, NULL, &n_down) || n_down > 4 ||
        cu.GraphNodeGetDependentNodes(m, down, NULL, &n_down))
        return;
    const counter_call *call = &c->calls[k];
    for (size_t i = 0; i < n_down; i++)
        for (int j = 0; j < call->n_before; j++)
            if (cu.GraphAddDependencies(g, &call->before[j], &down[i], NULL, 1)) return;   /* edges more and m kept: still right */
    if (cu.GraphDestroyNode(m) == 0) c->taken++;
}

int counters_strip(cuda_counters *c, CUgraph g) {
    size_t n = 0;
    c->taken = c->kept = 0;
    if (!c->base || cu.GraphGetNodes(g, NULL, &n) || !n) return 0;
    CUgraphNode *nodes = tg_alloc(sizeof(CUgraphNode) * n);
    if (nodes && cu.GraphGetNodes(g, nodes, &n) == 0)
        for (size_t i = 0; i < n; i++) {
            int type = -1, k;
            cu_memset_params ms;
            if (cu.GraphNodeGetType(nodes[i], &type) || type != CU_GRAPH_NODE_TYPE_MEMSET) continue;
            int before = c->taken;
            if ((k = opened_call(c, nodes[i], &ms)) >= 0) take_out(c, g, nodes[i], k, &ms);
            c->kept += c->taken == before;
        }
    free(nodes);
    if (getenv("TG_CUDA_COUNTERS") && strcmp(getenv("TG_CUDA_COUNTERS"), "verbose") == 0)
        fprintf(stderr, "tensorgrad: cuBLASLt's counters: %d memsets out of the step's graph, %d kept (the first the counters' own)\n",
                c->taken, c->kept);
    return c->taken;
}
