/* CUDA code generation: the same schedule, plan and expression engine as the C backend
 * (expr.h), wrapped in __global__ kernels with every shape baked in, plus a launch list that
 * the CUDA backend replays (and captures into one CUDA graph): kernel launches, cuBLAS matrix
 * products and memsets, in graph order.
 *
 * Every kernel takes (float *A, void *const *B, const double *H): the device arena (plan offsets
 * in floats), the device table of bound leaves by node id, and the device copy of the hyper
 * scalars. Pointwise kernels use one thread per element; sums one thread per output, or a block
 * per output when there are few outputs; row-wise softmax a warp per row; scatters memset then
 * accumulate with atomics. */
#include "compile/expr.h"
#include "cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 256

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
    }
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->node = node;
    return l;
}

static void kernel_launch(cuda_plan *p, int node, int64_t threads, int block) {
    cuda_launch *l = add_launch(p, CL_KERNEL, node);
    snprintf(l->name, sizeof l->name, "k%d", node);
    l->block = block;
    l->grid = (threads + block - 1) / block;
    l->grid_y = 1;
}

static void memset_launch(cuda_plan *p, int node) { add_launch(p, CL_MEMSET, node)->n = p->g->nodes[node].numel; }

static void pointer(cg *c, strbuf *decl, int id, bool out) { cg_pointer(c, decl, id, out, "__restrict__"); }

/* The kernel k<roots[0]>: pointer declarations for every buffer the body read (plus extra ones)
 * and for its outputs, then the head, the body, the tail. */
static void end_kernel_roots(cg *c, const int *roots, int n_roots, const int *extra, int n_extra, const char *head,
                             const char *tail) {
    strbuf decl = { 0 };
    for (int i = 0; i < n_extra; i++) c->used[extra[i]] = true;
    for (int r = 0; r < n_roots; r++) c->used[roots[r]] = false;
    for (int i = 0; i < c->g->n; i++)
        if (c->used[i]) pointer(c, &decl, i, false);
    for (int r = 0; r < n_roots; r++) pointer(c, &decl, roots[r], true);
    sb_printf(c->out, "extern \"C\" __global__ void k%d(float *A, void *const *B, const double *H) {\n%s%s%s%s}\n\n",
              roots[0], sb_str(&decl), head, sb_str(&c->body), tail);
    free(decl.s);
}

static void end_kernel(cg *c, const int *extra, int n_extra, const char *head, const char *tail) {
    end_kernel_roots(c, &c->root, 1, extra, n_extra, head, tail);
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
 * read from memory shares memory with an output (a later root reads an earlier one from its
 * register: the memo). */
typedef struct { const cg *c; const int *roots; int n_roots; } group;

static bool group_ok(void *ctx) {
    const group *gr = ctx;
    const cg *c = gr->c;
    const int *roots = gr->roots;
    int n_roots = gr->n_roots;
    for (int r = 0; r < n_roots; r++) {
        for (int q = 0; q < r; q++)
            if (arena_overlap(c, roots[r], roots[q])) return false;
        for (int u = 0; u < c->g->n; u++)
            if (c->used[u] && arena_overlap(c, u, roots[r])) return false;
    }
    return true;
}

#define MAX_ROOTS 16

/* One kernel for the pointwise node order[0] and as many of the nodes after it in order[] as
 * can join it: pointwise, of its size, race-free together (group_ok). An optimizer update (a
 * parameter's m, v and new value) then runs as one kernel instead of three. Returns how many of
 * order[] it took. */
static int pointwise_kernel(cg *c, cuda_plan *p, const int *order, int n_order) {
    int id = order[0], roots[MAX_ROOTS] = { id };
    group gr = { c, roots, 1 };
    const tg_node *n = N(c, id);
    cg_begin(c, id);
    cg_root_line(c, id);
    for (int q = 1; q < n_order && gr.n_roots < MAX_ROOTS; q++) {
        int r = order[q];
        if (!fuse_pointwise(N(c, r)->op) || N(c, r)->numel != n->numel) break;
        roots[gr.n_roots++] = r;
        if (!cg_try_root(c, r, group_ok, &gr)) {
            gr.n_roots--;
            break;
        }
    }
    int n_roots = gr.n_roots;
    c->root = id;
    char head[200];
    snprintf(head, sizeof head,
             "    const int64_t i = (int64_t)blockIdx.x * %d + threadIdx.x;\n    if (i >= %lldll) return;\n    {\n",
             BLOCK, (long long)n->numel);
    end_kernel_roots(c, roots, n_roots, NULL, 0, head, "    }\n");
    kernel_launch(p, id, n->numel, BLOCK);
    return n_roots;
}

/* Sum over one axis: [outer, len, inner] -> [outer, 1, inner], reading coalesced:
 *  - contiguous rows (inner == 1): a warp per row, lanes striding the row, a shuffle reduction;
 *    when there are too few rows to fill the GPU (a sum over everything: one row), each row is
 *    cut into chunks of at least 1024, a warp each, added into the zeroed output with atomics;
 *  - otherwise a thread per output, neighbouring threads on neighbouring elements; when that
 *    gives too few threads, the axis is cut into chunks (grid y) summed into the zeroed output
 *    with atomics (so the order of the additions varies from run to run, by rounding only). */
static void sum_kernel(cg *c, cuda_plan *p, int id) {
    const tg_node *n = N(c, id), *s = N(c, n->src[0]);
    int64_t outer = 1, len = s->shape.d[n->axis], inner = 1;
    for (int k = 0; k < n->axis; k++) outer *= s->shape.d[k];
    for (int k = n->axis + 1; k < s->shape.ndim; k++) inner *= s->shape.d[k];
    int64_t outs = outer * inner;
    cg_begin(c, id);
    char flat[NAME];
    cg_def(c, flat, "f", "int64_t", "(o * %lld + k) * %lld + j", (long long)len, (long long)inner);
    cg_line(c, "acc += %s;", cg_value(c, n->src[0], flat));
    char head[700], tail[400];
    if (inner == 1 && len >= 32) {
        int64_t chunks = 1;   /* warps enough for about 64k threads, each lane summing >= 32 */
        while (outs * chunks * 32 < 65536 && len / (chunks * 2) >= 1024) chunks *= 2;
        int64_t chunk = (len + chunks - 1) / chunks;
        snprintf(head, sizeof head,
                 "    const int64_t w = ((int64_t)blockIdx.x * %d + threadIdx.x) / 32, j = 0;\n"
                 "    if (w >= %lldll) return;\n"
                 "    const int64_t o = w / %lld, k0 = (w %% %lld) * %lld, k1 = k0 + %lld < %lldll ? k0 + %lld : %lldll;\n"
                 "    double acc = 0;\n"
                 "    for (int64_t k = k0 + (threadIdx.x & 31); k < k1; k += 32) {\n",
                 BLOCK, (long long)(outs * chunks), (long long)chunks, (long long)chunks, (long long)chunk, (long long)chunk,
                 (long long)len, (long long)chunk, (long long)len);
        char st[100];
        if (chunks > 1) snprintf(st, sizeof st, "atomicAdd(P%d + o, (%s)acc)", id, cg_ctype(n));
        else snprintf(st, sizeof st, "P%d[o] = (%s)acc", id, cg_ctype(n));
        snprintf(tail, sizeof tail,
                 "    }\n"
                 "    for (int s = 16; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);\n"
                 "    if ((threadIdx.x & 31) == 0) %s;\n", st);
        if (chunks > 1) memset_launch(p, id);
        end_kernel(c, NULL, 0, head, tail);
        kernel_launch(p, id, outs * chunks * 32, BLOCK);
        return;
    }
    int64_t chunks = 1;   /* enough threads to fill the GPU: about 64k */
    while (outs * chunks < 65536 && len / (chunks * 2) >= 64) chunks *= 2;
    int64_t chunk = (len + chunks - 1) / chunks;
    snprintf(head, sizeof head,
             "    const int64_t oj = (int64_t)blockIdx.x * %d + threadIdx.x;\n"
             "    if (oj >= %lldll) return;\n"
             "    const int64_t o = oj / %lld, j = oj %% %lld, k0 = (int64_t)blockIdx.y * %lld;\n"
             "    const int64_t k1 = k0 + %lld < %lldll ? k0 + %lld : %lldll;\n"
             "    double acc = 0;\n"
             "    for (int64_t k = k0; k < k1; k++) {\n",
             BLOCK, (long long)outs, (long long)inner, (long long)inner, (long long)chunk, (long long)chunk,
             (long long)len, (long long)chunk, (long long)len);
    if (chunks > 1) snprintf(tail, sizeof tail, "    }\n    atomicAdd(P%d + oj, (%s)acc);\n", id, cg_ctype(n));
    else snprintf(tail, sizeof tail, "    }\n    P%d[oj] = (%s)acc;\n", id, cg_ctype(n));
    if (chunks > 1) memset_launch(p, id);
    end_kernel(c, NULL, 0, head, tail);
    kernel_launch(p, id, outs, BLOCK);
    p->launch[p->n - 1].grid_y = chunks;
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
    kernel_launch(p, id, threads, block);
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
}

static void special_kernel(cg *c, cuda_plan *p, int id) {
    const tg_node *n = N(c, id), *s0 = N(c, n->src[0]);
    int src0 = n->src[0], src01[2] = { n->src[0], n->nsrc > 1 ? n->src[1] : n->src[0] };
    int64_t o, len, in;
    switch (n->op) {
    case OP_MATMUL: matmul_launch(c, p, id); return;
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
        cg_axis_split(n->shape, n->axis, &o, &len, &in);
        call_kernel(c, p, id, &src0, 1, o * in * 32, BLOCK, "tgk_softmax(P%d, P%d, %lldll, %lldll, %lldll, %d)", src0, id,
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
        return;
    }
}

/* Device helpers for the kernels above: warp-per-row softmax, argmax, scatters with atomics,
 * col2im as a gather (no atomics), max-pooling forward and backward. */
static const char DEVICE_KERNELS[] =
    "static __device__ float tgk_warp_max(float v) {\n"
    "    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
    "    return v;\n}\n"
    "static __device__ float tgk_warp_sum(float v) {\n"
    "    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
    "    return v;\n}\n"
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
     * changes nothing. One pass over the new values, instead of a reduction per gradient. */
    "struct tgk_copy { const float *src; float *dst; long long n; };\n"
    "extern \"C\" __global__ void tg_wb_check(float *flag, const tgk_copy *table) {\n"
    "    const tgk_copy c = table[blockIdx.y];\n"
    "    bool bad = false;\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < c.n; i += (long long)gridDim.x * blockDim.x)\n"
    "        bad |= !isfinite(c.src[i]);\n"
    "    if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *flag = NAN;\n}\n"
    "extern \"C\" __global__ void tg_writeback(const float *loss, const float *flag, const tgk_copy *table) {\n"
    "    if (!isfinite(*loss + *flag)) return;\n"
    "    const tgk_copy c = table[blockIdx.y];\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < c.n; i += (long long)gridDim.x * blockDim.x)\n"
    "        c.dst[i] = c.src[i];\n}\n\n";

static const char HEADER[] =
    "typedef long long int64_t;\ntypedef unsigned long long uint64_t;\ntypedef int int32_t;\n"
    "#define INFINITY __int_as_float(0x7f800000)\n#define NAN __int_as_float(0x7fffffff)\n\n";

char *codegen_cuda(const tg_graph *g, const bool *materialized, const tg_plan *plan, cuda_plan *launches) {
    strbuf out = { 0 };
    cg c;
    long failures = alloc_failures();   /* any allocation failing from here on voids the source */
    memset(launches, 0, sizeof *launches);
    launches->g = g;
    if (!cg_init(&c, g, materialized, plan, &out)) {
        cg_release(&c);
        return NULL;
    }
    sb_printf(&out, "/* generated by tensorgrad: %d nodes */\n%s", g->n, HEADER);
    cg_prelude(&out, "static __device__ inline");
    sb_printf(&out, "%s", DEVICE_KERNELS);
    int *order = tg_alloc(sizeof(int) * (size_t)(g->n + 1)), n_order = 0;
    for (int i = 0; order && i < g->n; i++)
        if (materialized[i] && plan->alias[i] < 0) order[n_order++] = i;   /* aliases share a buffer: no kernel */
    for (int q = 0; q < n_order; q++) {
        int i = order[q];
        tg_op op = g->nodes[i].op;
        if (fuse_pointwise(op)) q += pointwise_kernel(&c, launches, order + q, n_order - q) - 1;
        else if (op == OP_SUM) sum_kernel(&c, launches, i);
        else special_kernel(&c, launches, i);
    }
    free(order);
    cg_release(&c);
    if (alloc_failures() != failures) {   /* the generator went on with placeholders */
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
    }
    free(p->launch);
    memset(p, 0, sizeof *p);
}
