/* What cuBLASLt's memsets cost in a step's CUDA graph, and what taking them out saves.
 * At tf32 nearly every fast algorithm for char_gpt's products adds a memset node before its
 * kernel (4 or 504 bytes: counters), and the step's timeline shows ~3.6 us idle around each one.
 *  1. For each of char_gpt's product shapes: the best of the heuristic's first 8 (as the tuner),
 *     its workspace size, and the nodes one call adds to a graph (memsets: where, how many bytes,
 *     relative to the workspace it was given; given a slice of it, does the memset follow?).
 *  2. A mock step: 4 rounds of the shapes, each product after a small kernel of ours, as one graph
 *     (A); the same with each call on a workspace slice of its own, the memsets that open a
 *     product's nodes removed from the graph and one memset of all slices first (B). Outputs
 *     compared bit for bit, both timed.
 * Not part of the build: nvcc -O3 -arch=sm_90 -o memsets bench/cuda/epilogue/memsets.cu -lcublasLt */
#include "lt_harness.h"
#include <cstring>

struct shape { int M, N, K, ta, tb; };
static const shape SHAPES[] = {
    { 16384, 384, 384, 0, 1 },  { 16384, 1536, 384, 0, 1 }, { 16384, 384, 1536, 0, 1 }, { 16384, 72, 384, 0, 0 },
    { 16384, 384, 72, 0, 1 },   { 384, 72, 16384, 1, 0 },   { 1536, 384, 16384, 1, 0 }, { 384, 1536, 16384, 1, 0 },
    { 384, 384, 16384, 1, 0 },  { 16384, 384, 384, 0, 0 },  { 16384, 384, 1536, 0, 0 }, { 16384, 1536, 384, 0, 0 },
};
static const int NS = sizeof SHAPES / sizeof SHAPES[0];

struct product {
    shape s;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    size_t ws;
    float *A, *B, *C;
};

static product make(shape s, bool bf16) {
    product r{};
    r.s = s;
    cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    LK(cublasLtMatmulDescCreate(&r.desc, bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
    cublasOperation_t opa = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LK(cublasLtMatrixLayoutCreate(&r.a, t, s.tb ? s.K : s.N, s.tb ? s.N : s.K, s.tb ? s.K : s.N));
    LK(cublasLtMatrixLayoutCreate(&r.b, t, s.ta ? s.M : s.K, s.ta ? s.K : s.M, s.ta ? s.M : s.K));
    LK(cublasLtMatrixLayoutCreate(&r.c, CUDA_R_32F, s.N, s.M, s.N));
    CK(cudaMalloc(&r.A, (size_t)s.M * s.K * 4));
    CK(cudaMalloc(&r.B, (size_t)s.K * s.N * 4));
    CK(cudaMalloc(&r.C, (size_t)s.M * s.N * 4));
    std::vector<float> h((size_t)std::max(s.M * s.K, s.K * s.N));
    for (size_t i = 0; i < h.size(); i++) h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    CK(cudaMemcpy(r.A, h.data(), (size_t)s.M * s.K * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(r.B, h.data(), (size_t)s.K * s.N * 4, cudaMemcpyHostToDevice));
    return r;
}

static cublasStatus_t run(const product &p, void *ws, size_t bytes) {
    const float one = 1, zero = 0;
    return cublasLtMatmul(lt, p.desc, &one, p.B, p.a, p.A, p.b, &zero, p.C, p.c, p.C, p.c, &p.algo, ws, bytes, stream);
}

static void choose(product &p) {
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS, sizeof WS));
    cublasLtMatmulHeuristicResult_t h[8];
    int n = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(lt, p.desc, p.a, p.b, p.c, p.c, pref, 8, h, &n));
    cublasLtMatmulPreferenceDestroy(pref);
    float best = 1e30f;
    for (int i = 0; i < n; i++) {
        p.algo = h[i].algo;
        if (run(p, workspace, WS) != CUBLAS_STATUS_SUCCESS) continue;
        CK(cudaStreamSynchronize(stream));
        float ms = graph_ms(stream, [&] { run(p, workspace, WS); }, 5);
        if (ms < best) { best = ms; p.ws = h[i].workspaceSize; }
    }
    for (int i = 0; i < n; i++)
        if (h[i].workspaceSize == p.ws) {   /* the fastest's (re-found: p.algo is the last tried) */
            p.algo = h[i].algo;
            float ms = graph_ms(stream, [&] { run(p, workspace, WS); }, 5);
            if (ms <= best * 1.02f) break;
        }
}

static std::vector<cudaGraphNode_t> deps(cudaGraphNode_t n, bool up) {
    size_t k = 0;
    if (up) CK(cudaGraphNodeGetDependencies(n, nullptr, nullptr, &k));
    else CK(cudaGraphNodeGetDependentNodes(n, nullptr, nullptr, &k));
    std::vector<cudaGraphNode_t> v(k);
    if (k && up) CK(cudaGraphNodeGetDependencies(n, v.data(), nullptr, &k));
    if (k && !up) CK(cudaGraphNodeGetDependentNodes(n, v.data(), nullptr, &k));
    return v;
}

/* the nodes one call adds, in order (a captured stream is a chain) */
static void describe_nodes(const product &p, char *ws, size_t bytes) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    LK(run(p, ws, bytes));
    CK(cudaStreamEndCapture(stream, &g));
    size_t n = 0;
    CK(cudaGraphGetRootNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> at(n);
    CK(cudaGraphGetRootNodes(g, at.data(), &n));
    cudaGraphNode_t x = n ? at[0] : nullptr;
    while (x) {
        cudaGraphNodeType t;
        CK(cudaGraphNodeGetType(x, &t));
        if (t == cudaGraphNodeTypeMemset) {
            cudaMemsetParams m;
            CK(cudaGraphMemsetNodeGetParams(x, &m));
            printf(" memset(+%lld, %zu x %u bytes, value %u)", (long long)((char *)m.dst - ws), m.width * m.height,
                   m.elementSize, m.value);
        } else printf(" %s", t == cudaGraphNodeTypeKernel ? "kernel" : "other");
        auto next = deps(x, false);
        x = next.empty() ? nullptr : next[0];
    }
    printf("\n");
    CK(cudaGraphDestroy(g));
}

__global__ void touch(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}

static float *scratch;
static const int SCRATCH = 1 << 20;

/* the mock step; private: each product on its own slice, frontier[i] the capture's last node
 * before product i's call */
static cudaGraph_t capture(std::vector<product> &ps, char *slices, size_t slice_bytes, const std::vector<size_t> &off,
                           std::vector<cudaGraphNode_t> *frontier) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    if (slices) CK(cudaMemsetAsync(slices, 0, slice_bytes, stream));
    for (int r = 0; r < 4; r++)
        for (size_t i = 0; i < ps.size(); i++) {
            touch<<<SCRATCH / 256, 256, 0, stream>>>(scratch, SCRATCH);
            if (frontier) {
                cudaStreamCaptureStatus st;
                const cudaGraphNode_t *d = nullptr;
                size_t nd = 0;
                CK(cudaStreamGetCaptureInfo(stream, &st, nullptr, nullptr, &d, nullptr, &nd));
                frontier->push_back(nd == 1 ? d[0] : nullptr);
            }
            if (slices) LK(run(ps[i], slices + off[r * ps.size() + i], ps[i].ws));
            else LK(run(ps[i], workspace, WS));
        }
    CK(cudaStreamEndCapture(stream, &g));
    return g;
}

/* take out each memset into a product's slice that is the first node of its call */
static int strip(cudaGraph_t g, char *slices, size_t slice_bytes, const std::vector<cudaGraphNode_t> &frontier) {
    size_t n = 0;
    CK(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> all(n);
    CK(cudaGraphGetNodes(g, all.data(), &n));
    int removed = 0;
    for (auto x : all) {
        cudaGraphNodeType t;
        CK(cudaGraphNodeGetType(x, &t));
        if (t != cudaGraphNodeTypeMemset) continue;
        cudaMemsetParams m;
        CK(cudaGraphMemsetNodeGetParams(x, &m));
        char *d = (char *)m.dst;
        if (d < slices || d >= slices + slice_bytes || m.value != 0 || m.width * m.height * m.elementSize == slice_bytes) continue;
        auto up = deps(x, true), down = deps(x, false);
        if (up.size() != 1 || std::find(frontier.begin(), frontier.end(), up[0]) == frontier.end()) continue;
        for (auto s : down) CK(cudaGraphAddDependencies(g, &up[0], &s, nullptr, 1));
        CK(cudaGraphDestroyNode(x));
        removed++;
    }
    return removed;
}

static float time_graph(cudaGraph_t g) {
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    float best = replay_ms(stream, x, 10, 1);
    CK(cudaGraphExecDestroy(x));
    return best;
}

static std::vector<std::vector<float>> outputs(const std::vector<product> &ps) {
    std::vector<std::vector<float>> o;
    for (auto &p : ps) {
        o.emplace_back((size_t)p.s.M * p.s.N);
        CK(cudaMemcpy(o.back().data(), p.C, o.back().size() * 4, cudaMemcpyDeviceToHost));
    }
    return o;
}

static void precision(bool bf16) {
    if (bf16) return;   /* the step's bf16 products have few memsets; tf32 first */
    std::vector<product> ps;
    for (int i = 0; i < NS; i++) {
        ps.push_back(make(SHAPES[i], bf16));
        choose(ps.back());
        const shape &s = SHAPES[i];
        printf("[%d x %d] x [%d x %d]%s%s: workspace %zu bytes; nodes:", s.M, s.K, s.K, s.N, s.ta ? " A^T" : "",
               s.tb ? " B^T" : "", ps.back().ws);
        describe_nodes(ps.back(), (char *)workspace, WS);
        printf("    on a slice at +4096 of %zu bytes:", ps.back().ws);
        describe_nodes(ps.back(), (char *)workspace + 4096, ps.back().ws);
    }
    std::vector<size_t> off;
    size_t total = 0;
    for (int r = 0; r < 4; r++)   /* a slice for each call: a call dirties its counters */
        for (auto &p : ps) { off.push_back(total); total += (p.ws + 255) / 256 * 256; }
    char *slices;
    CK(cudaMalloc(&slices, total + 256));
    printf("slices: %zu bytes in all\n", total);
    cudaGraph_t a = capture(ps, nullptr, 0, off, nullptr);
    std::vector<cudaGraphNode_t> frontier;
    cudaGraph_t b = capture(ps, slices, total + 256, off, &frontier);
    size_t na = 0, nb = 0;
    CK(cudaGraphGetNodes(a, nullptr, &na));
    CK(cudaGraphGetNodes(b, nullptr, &nb));
    int removed = strip(b, slices, total + 256, frontier);
    size_t nb2 = 0;
    CK(cudaGraphGetNodes(b, nullptr, &nb2));
    CK(cudaMemset(scratch, 0, SCRATCH * 4));
    float ta = time_graph(a);
    auto oa = outputs(ps);
    for (auto &p : ps) CK(cudaMemset(p.C, 0xff, (size_t)p.s.M * p.s.N * 4));
    float tb = time_graph(b);
    auto ob = outputs(ps);
    bool same = true;
    for (size_t i = 0; i < ps.size(); i++) same = same && memcmp(oa[i].data(), ob[i].data(), oa[i].size() * 4) == 0;
    float ta2 = time_graph(a), tb2 = time_graph(b);
    printf("mock step (%d products, each after a kernel): shared workspace %zu nodes %.4f / %.4f ms; slices, %d memsets "
           "taken out, %zu -> %zu nodes %.4f / %.4f ms; outputs %s\n",
           4 * NS, na, ta, ta2, removed, nb, nb2, tb, tb2, same ? "identical" : "DIFFER");
}

int main() {
    setvbuf(stdout, nullptr, _IONBF, 0);
    CK(cudaStreamCreate(&stream));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WS));
    CK(cudaMalloc(&scratch, SCRATCH * 4));
    precision(false);
    return 0;
}
