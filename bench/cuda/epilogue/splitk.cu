/* How fast char_gpt's weight gradients dW[in, out] = X^T dY (a reduction over 16384 rows into an
 * output of few tiles) can run through cuBLASLt, beside what the tuner finds today (the best of
 * the heuristic's first 8 algorithms):
 *  1. the heuristic's first 32, each also with its reduction split in 2-32 parts (the algorithm's
 *     SPLITK_NUM and REDUCTION_SCHEME overridden, where cublasLtMatmulAlgoCheck accepts it);
 *  2. every algorithm id cuBLASLt has for the types, each tile it offers, split in 1-16 parts;
 *  3. the reduction split by hand: one strided-batched product of S chunks of the rows into S
 *     partial outputs, and a kernel that adds them in order (both in the time).
 * Layouts: ta1 tb0 (X and dY as they lie, what the step runs) and ta0 tb1 (both transposed, K
 * along their rows). Each time the best of 5 rounds of 20 launches in a CUDA graph.
 * `splitk qkv`: instead, an attention's three projections of one input X (q, k, v: [16384 x 384]
 * by [384 x 384] each, with a bias) as three products, as one batched product (X's batch stride
 * 0, the weights', outputs' and biases' equal), and as one wide product [16384 x 1152]: forward,
 * weight gradients, input gradient (three products accumulating, or one over 1152).
 * Not part of the build: nvcc -O3 -arch=sm_90 -o splitk bench/cuda/epilogue/splitk.cu -lcublasLt */
#include "lt_harness.h"
#include <string>

struct product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
};

static cudaDataType_t elem(bool bf16) { return bf16 ? CUDA_R_16BF : CUDA_R_32F; }
static cublasComputeType_t compute(bool bf16) { return bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32; }

/* row-major C[M, N] (+ batch of `batch`, strides sa, sb, sc) = op(A) op(B); cuBLASLt's A is our B */
static product make(bool bf16, int M, int N, int K, int ta, int tb, int batch = 1, long long sa = 0, long long sb = 0,
                    long long sc = 0) {
    product r;
    LK(cublasLtMatmulDescCreate(&r.desc, compute(bf16), CUDA_R_32F));
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    /* the row strides: an operand stored [K, M] with ta keeps its full row length even in a chunk */
    LK(cublasLtMatrixLayoutCreate(&r.a, elem(bf16), tb ? K : N, tb ? N : K, tb ? K : N));
    LK(cublasLtMatrixLayoutCreate(&r.b, elem(bf16), ta ? M : K, ta ? K : M, ta ? M : K));
    LK(cublasLtMatrixLayoutCreate(&r.c, CUDA_R_32F, N, M, N));
    if (batch > 1) {
        int32_t n = batch;
        cublasLtMatrixLayout_t *l[3] = { &r.a, &r.b, &r.c };
        long long st[3] = { sb, sa, sc };
        for (int i = 0; i < 3; i++) {
            LK(cublasLtMatrixLayoutSetAttribute(*l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n));
            LK(cublasLtMatrixLayoutSetAttribute(*l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st[i], sizeof st[i]));
        }
    }
    return r;
}

static int heuristic(const product &p, int want, cublasLtMatmulHeuristicResult_t *h) { return lt_algos(p.desc, p.a, p.b, p.c, want, h); }

static bool check(const product &p, const cublasLtMatmulAlgo_t &a) {
    cublasLtMatmulHeuristicResult_t r;
    return cublasLtMatmulAlgoCheck(lt, p.desc, p.a, p.b, p.c, p.c, &a, &r) == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WS;
}

static float run_ms(const product &p, const cublasLtMatmulAlgo_t &a, const void *A, const void *B, void *C) {
    const float one = 1, zero = 0;
    auto go = [&] { return cublasLtMatmul(lt, p.desc, &one, B, p.a, A, p.b, &zero, C, p.c, C, p.c, &a, workspace, WS, stream); };
    if (go() != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(stream) != cudaSuccess) return 1e30f;
    return graph_ms(stream, [&] { go(); }, 5);
}

static unsigned get(const cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoConfigAttributes_t what) {
    uint32_t v = 0;
    size_t w;
    cublasLtMatmulAlgoConfigGetAttribute(&a, what, &v, sizeof v, &w);
    return v;
}

static void set(cublasLtMatmulAlgo_t &a, cublasLtMatmulAlgoConfigAttributes_t what, uint32_t v) {
    cublasLtMatmulAlgoConfigSetAttribute(&a, what, &v, sizeof v);
}

struct best { float ms = 1e30f; unsigned id = 0, tile = 0, split = 0, red = 0; };

static void keep(best &b, float ms, const cublasLtMatmulAlgo_t &a) {
    if (ms < b.ms) b = { ms, get(a, CUBLASLT_ALGO_CONFIG_ID), get(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                         get(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), get(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) };
}

static void show(const char *what, const best &b, double flop) {
    printf("  %-34s %.4f ms %5.0f TF/s (algo %u tile %u split %u reduction %u)\n", what, b.ms, flop / b.ms * 1e-9, b.id, b.tile,
           b.split, b.red);
}

/* out[i] = sum over s < S of part[s][i], in order */
__global__ void add_parts(const float *part, float *out, long long n, int S) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float x = 0;
        for (int s = 0; s < S; s++) x += part[s * n + i];
        out[i] = x;
    }
}

static void shape(bool bf16, int M, int N, int K, int ta, int tb) {
    const size_t es = bf16 ? 2 : 4;
    void *A, *B;
    float *C, *P;
    CK(cudaMalloc(&A, (size_t)M * K * es));
    CK(cudaMalloc(&B, (size_t)K * N * es));
    CK(cudaMalloc(&C, (size_t)M * N * 4));
    CK(cudaMalloc(&P, (size_t)32 * M * N * 4));
    CK(cudaMemset(A, 0x3c, (size_t)M * K * es));
    CK(cudaMemset(B, 0x3c, (size_t)K * N * es));
    const double flop = 2.0 * M * N * K;
    printf("%s dW [%d x %d] over %d, ta%d tb%d\n", bf16 ? "bf16" : "tf32", M, N, K, ta, tb);
    product p = make(bf16, M, N, K, ta, tb);
    cublasLtMatmulHeuristicResult_t h[32];
    int n = heuristic(p, 32, h);
    best first8, first32, split;
    for (int i = 0; i < n; i++) {
        float ms = run_ms(p, h[i].algo, A, B, C);
        if (i < 8) keep(first8, ms, h[i].algo);
        keep(first32, ms, h[i].algo);
        for (uint32_t s : { 1u, 2u, 3u, 4u, 6u, 8u, 12u, 16u, 24u, 32u })
            for (uint32_t red : { (uint32_t)CUBLASLT_REDUCTION_SCHEME_INPLACE, (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE }) {
                cublasLtMatmulAlgo_t a = h[i].algo;
                set(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, s);
                set(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, s > 1 ? red : 0);
                if (check(p, a)) keep(split, run_ms(p, a, A, B, C), a);
            }
    }
    show("heuristic first 8 (the tuner)", first8, flop);
    show("heuristic first 32", first32, flop);
    show("first 32, split overridden", split, flop);
    /* 2: every id and tile */
    int ids[256], n_ids = 0;
    LK(cublasLtMatmulAlgoGetIds(lt, compute(bf16), CUDA_R_32F, elem(bf16), elem(bf16), CUDA_R_32F, CUDA_R_32F, 256, ids, &n_ids));
    best all;
    int tried = 0;
    for (int i = 0; i < n_ids; i++) {
        cublasLtMatmulAlgo_t a0;
        if (cublasLtMatmulAlgoInit(lt, compute(bf16), CUDA_R_32F, elem(bf16), elem(bf16), CUDA_R_32F, CUDA_R_32F, ids[i], &a0) !=
            CUBLAS_STATUS_SUCCESS)
            continue;
        size_t w = 0;
        uint32_t tiles[128];
        int32_t splitk = 0;
        cublasLtMatmulAlgoCapGetAttribute(&a0, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles, &w);
        int n_tiles = (int)(w / sizeof tiles[0]);
        if (n_tiles == 0) tiles[n_tiles++] = 0;
        cublasLtMatmulAlgoCapGetAttribute(&a0, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk, sizeof splitk, &w);
        for (int t = 0; t < n_tiles; t++)
            for (uint32_t s : { 1u, 2u, 4u, 8u, 16u }) {
                if (s > 1 && !splitk) continue;
                cublasLtMatmulAlgo_t a = a0;
                set(a, CUBLASLT_ALGO_CONFIG_TILE_ID, tiles[t]);
                set(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, s);
                set(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, s > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : 0);
                if (!check(p, a)) continue;
                tried++;
                keep(all, run_ms(p, a, A, B, C), a);
            }
    }
    char what[64];
    snprintf(what, sizeof what, "every id and tile (%d of %d ids: %d)", n_ids, n_ids, tried);
    show(what, all, flop);
    /* 3: S chunks of K rows as a batch, then the parts added */
    for (int S : { 2, 3, 4, 6, 8, 12, 16 }) {
        if (K % S) continue;
        const int k = K / S;
        /* chunk z of A (stored [K, M] when ta, else [M, K]) and of B (stored [K, N], else [N, K]) */
        long long sa = ta ? (long long)k * M : k, sb = tb ? k : (long long)k * N;
        product q = make(bf16, M, N, k, ta, tb, S, sa, sb, (long long)M * N);
        const int64_t ld = K;   /* a chunk of an operand stored with K along its rows keeps the full row */
        if (!ta) LK(cublasLtMatrixLayoutSetAttribute(q.b, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld));
        if (tb) LK(cublasLtMatrixLayoutSetAttribute(q.a, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof ld));
        cublasLtMatmulHeuristicResult_t hq[8];
        int nq = heuristic(q, 8, hq);
        best b;
        int which = -1;
        for (int i = 0; i < nq; i++) {
            float ms = run_ms(q, hq[i].algo, A, B, P);
            if (ms < b.ms) which = i;
            keep(b, ms, hq[i].algo);
        }
        if (which < 0) continue;
        const float one = 1, zero = 0;
        const long long nmn = (long long)M * N;
        float ms = graph_ms(stream, [&] {
            cublasLtMatmul(lt, q.desc, &one, B, q.a, A, q.b, &zero, P, q.c, P, q.c, &hq[which].algo, workspace, WS, stream);
            add_parts<<<264, 256, 0, stream>>>(P, C, nmn, S);
        }, 5);
        snprintf(what, sizeof what, "%d chunks batched (product alone %.4f)", S, b.ms);
        best t = b;
        t.ms = ms;
        show(what, t, flop);
    }
    fflush(stdout);
    cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(P);
}

/* the best of the heuristic's first 8 for p (with a bias when `bias`, beta = 1 when `acc`), ms */
static float best8(product &p, const void *A, const void *B, void *C, const float *bias, long long bias_stride, bool acc) {
    if (bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        int32_t bt = CUDA_R_32F;
        LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
        if (bias_stride) LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride, sizeof bias_stride));
    }
    cublasLtMatmulHeuristicResult_t h[8];
    int n = heuristic(p, 8, h);
    float best = 1e30f;
    const float one = 1, beta = acc ? 1 : 0;
    for (int i = 0; i < n; i++) {
        auto go = [&] { return cublasLtMatmul(lt, p.desc, &one, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &h[i].algo, workspace, WS, stream); };
        if (go() != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(stream) != cudaSuccess) continue;
        best = std::min(best, graph_ms(stream, [&] { go(); }, 5));
    }
    return best;
}

static void qkv(bool bf16) {
    const int M = 16384, N = 384, K = 384;
    const size_t es = bf16 ? 2 : 4;
    void *X, *W, *Y, *G;
    float *O, *bias;
    CK(cudaMalloc(&X, (size_t)M * K * es));        /* the input, and dX */
    CK(cudaMalloc(&W, (size_t)3 * K * N * es));    /* the three weights (tf32: transposed, [N, K] each) */
    CK(cudaMalloc(&Y, (size_t)3 * M * N * 4));     /* q, k, v (f32), one after another */
    CK(cudaMalloc(&G, (size_t)3 * M * N * es));    /* their gradients */
    CK(cudaMalloc(&O, (size_t)M * K * 4));         /* dX, or the weight gradients (3 K N of it) */
    CK(cudaMalloc(&bias, (size_t)3 * N * 4));
    CK(cudaMemset(X, 0x3c, (size_t)M * K * es)); CK(cudaMemset(W, 0x3c, (size_t)3 * K * N * es));
    CK(cudaMemset(G, 0x3c, (size_t)3 * M * N * es)); CK(cudaMemset(bias, 0, 3 * N * 4));
    const int tbw = bf16 ? 0 : 1;   /* the forward's weight layout, as the step has it */
    product one = make(bf16, M, N, K, 0, tbw);
    product bat = make(bf16, M, N, K, 0, tbw, 3, 0, (long long)K * N, (long long)M * N);
    product wide = make(bf16, M, 3 * N, K, 0, tbw);
    float f1 = best8(one, X, W, Y, bias, 0, false), fb = best8(bat, X, W, Y, bias, N, false), fw = best8(wide, X, W, Y, bias, 0, false);
    /* dW_z [K, N] = X^T dY_z */
    product dw1 = make(bf16, K, N, M, 1, 0);
    product dwb = make(bf16, K, N, M, 1, 0, 3, 0, (long long)M * N, (long long)K * N);
    product dww = make(bf16, K, 3 * N, M, 1, 0);
    float w1 = best8(dw1, X, G, O, nullptr, 0, false), wb = best8(dwb, X, G, O, nullptr, 0, false), ww = best8(dww, X, G, O, nullptr, 0, false);
    /* dX [M, K] = sum_z dY_z W_z^T (W_z stored [K, N]: B transposed), or one over 3N */
    product dx1 = make(bf16, M, K, N, 0, 1), dxw = make(bf16, M, K, 3 * N, 0, 1);
    float x0 = best8(dx1, G, W, O, nullptr, 0, false), x1 = best8(dx1, G, W, O, nullptr, 0, true), xw = best8(dxw, G, W, O, nullptr, 0, false);
    printf("%s q, k, v [%d x %d] x [%d x %d] + bias: forward 3 x %.4f = %.4f, batched %.4f, wide %.4f ms | dW 3 x %.4f = %.4f, "
           "batched %.4f, wide %.4f | dX %.4f + 2 x %.4f (beta 1) = %.4f, wide %.4f\n", bf16 ? "bf16" : "tf32", M, K, K, N, f1, 3 * f1,
           fb, fw, w1, 3 * w1, wb, ww, x0, x1, x0 + 2 * x1, xw);
    fflush(stdout);
    cudaFree(X); cudaFree(W); cudaFree(Y); cudaFree(G); cudaFree(O); cudaFree(bias);
}

int main(int argc, char **argv) {
    CK(cudaStreamCreate(&stream));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WS));
    if (argc > 1 && std::string(argv[1]) == "qkv") {
        qkv(false);
        qkv(true);
        return 0;
    }
    const int R = 16384;
    static const int IO[][2] = { { 384, 384 }, { 384, 1536 }, { 1536, 384 }, { 384, 1152 }, { 384, 65 } };
    for (int b = 0; b < 2; b++)
        for (auto &s : IO)
            for (int l = 0; l < 2; l++) {
                if (b && l) continue;   /* bf16: every layout within 9% (layouts.cu) */
                shape(b, s[0], s[1], R, l ? 0 : 1, l ? 1 : 0);
            }
    return 0;
}
