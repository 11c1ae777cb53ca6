/* cuBLASLt's epilogues for the backward and for f32 outputs, at char_gpt's shapes, for each of our
 * precisions (bf16: bf16 operands, f32 sums; tf32: f32 operands on TF32 tensor cores; f32):
 *  1. the weight gradient dW[in, out] = X^T dY with the bias gradient (dY's column sums) as
 *     BGRADA or BGRADB: how many algorithms the heuristic offers with an f32 bias gradient, their
 *     best time beside the plain product plus a column-sum kernel, and the sums' largest error;
 *  2. the forward product with BIAS where the output is f32 (tf32 and f32 graphs);
 *  3. beta = 1 (D = A B + C, in place: a gradient accumulated), C in f32 and (bf16) in bf16,
 *     beside beta = 0.
 * Each the best of the heuristic's first 8 algorithms, 20 launches in a CUDA graph, best of 5.
 * Not part of the build: nvcc -O3 -arch=sm_90 -o bgrad bench/cuda/epilogue/bgrad.cu -lcublasLt; run on the GPU machine. */
#include "lt_harness.h"

enum prec { BF16, TF32, F32 };
static const char *const PREC_NAMES[] = { "bf16", "tf32", "f32" };

struct product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulHeuristicResult_t h[8];
    int n_algos;
};

/* Row-major C[M, N] = op(A) op(B) as column-major C^T = op(B)^T op(A)^T (cuBLASLt's A is our B).
 * ta: our A is [K, M]; tb: our B is [N, K]. ep: the epilogue, with its vector `vec` (f32). */
static product make(prec p, int M, int N, int K, int ta, int tb, cublasLtEpilogue_t ep, const void *vec, bool c_bf16) {
    product r;
    cudaDataType_t t = p == BF16 ? CUDA_R_16BF : CUDA_R_32F;
    LK(cublasLtMatmulDescCreate(&r.desc, p == TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (ep != CUBLASLT_EPILOGUE_DEFAULT) {
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec));
        int32_t vt = CUDA_R_32F;
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vt, sizeof vt));
    }
    LK(cublasLtMatrixLayoutCreate(&r.a, t, tb ? K : N, tb ? N : K, tb ? K : N));
    LK(cublasLtMatrixLayoutCreate(&r.b, t, ta ? M : K, ta ? K : M, ta ? M : K));
    LK(cublasLtMatrixLayoutCreate(&r.c, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, N));
    r.n_algos = lt_algos(r.desc, r.a, r.b, r.c, 8, r.h);
    return r;
}

static cublasStatus_t run(const product &p, int algo, const void *A, const void *B, void *C, float beta = 0) {
    const float one = 1;
    return cublasLtMatmul(lt, p.desc, &one, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.h[algo].algo, workspace, WS, stream);
}

static float best_of(const product &p, const void *A, const void *B, void *C, int *which, float beta = 0) {
    float best = 1e30f;
    for (int k = 0; k < p.n_algos; k++) {
        if (run(p, k, A, B, C, beta) != CUBLAS_STATUS_SUCCESS) continue;
        float t = graph_ms(stream, [&] { run(p, k, A, B, C, beta); }, 5);
        if (t < best) best = t, *which = k;
    }
    return best;
}

/* column sums of a row-major [R, N] matrix: blocks of 32 columns x 32 row lanes, 64 chunks of rows
 * added by atomics (the out vector zeroed first): about what the library's own column sums do */
template <class T> __global__ void colsum(const T *x, float *out, int R, int N) {
    int j = blockIdx.x * 32 + (threadIdx.x & 31), y = threadIdx.x >> 5;
    int per = (R + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per, r1 = min(R, r0 + per);
    float acc = 0;
    if (j < N)
        for (int r = r0 + y; r < r1; r += 32) acc += (float)x[(size_t)r * N + j];
    __shared__ float part[32][33];
    part[y][threadIdx.x & 31] = acc;
    __syncthreads();
    if (y == 0 && j < N) {
        float s = 0;
        for (int k = 0; k < 32; k++) s += part[k][threadIdx.x & 31];
        atomicAdd(out + j, s);
    }
}

static void fill(void *dev, size_t n, bool bf16, float scale, unsigned seed) {
    srand(seed);
    if (bf16) {
        std::vector<__nv_bfloat16> h(n);
        for (auto &x : h) x = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f) * scale);
        CK(cudaMemcpy(dev, h.data(), n * 2, cudaMemcpyHostToDevice));
    } else {
        std::vector<float> h(n);
        for (auto &x : h) x = (rand() / (float)RAND_MAX - 0.5f) * scale;
        CK(cudaMemcpy(dev, h.data(), n * 4, cudaMemcpyHostToDevice));
    }
}

/* 1. dW[in, out] = X[R, in]^T dY[R, out] with dbias[out] = sum over R of dY */
static void weight_gradient(prec p, int R, int in, int out) {
    const bool h = p == BF16;
    const size_t es = h ? 2 : 4;
    void *X, *dY, *dW, *db, *db2;
    CK(cudaMalloc(&X, (size_t)R * in * es));
    CK(cudaMalloc(&dY, (size_t)R * out * es));
    CK(cudaMalloc(&dW, (size_t)in * out * 4));
    CK(cudaMalloc(&db, out * 4));
    CK(cudaMalloc(&db2, out * 4));
    fill(X, (size_t)R * in, h, 1, 1);
    fill(dY, (size_t)R * out, h, 0.1f, 2);
    product plain = make(p, in, out, R, 1, 0, CUBLASLT_EPILOGUE_DEFAULT, nullptr, false);
    product ga = make(p, in, out, R, 1, 0, CUBLASLT_EPILOGUE_BGRADA, db, false);
    product gb = make(p, in, out, R, 1, 0, CUBLASLT_EPILOGUE_BGRADB, db, false);
    int w0 = 0, wa = 0, wb = 0;
    float t0 = best_of(plain, X, dY, dW, &w0);
    dim3 grid((out + 31) / 32, 64);
    auto sums = [&] {
        cudaMemsetAsync(db2, 0, out * 4, stream);
        if (h) colsum<<<grid, 1024, 0, stream>>>((const __nv_bfloat16 *)dY, (float *)db2, R, out);
        else colsum<<<grid, 1024, 0, stream>>>((const float *)dY, (float *)db2, R, out);
    };
    float ts = graph_ms(stream, sums, 5);
    float ta = ga.n_algos ? best_of(ga, X, dY, dW, &wa) : -1, tb = gb.n_algos ? best_of(gb, X, dY, dW, &wb) : -1;
    sums();
    std::vector<float> ref(out), got(out);
    CK(cudaMemcpy(ref.data(), db2, out * 4, cudaMemcpyDeviceToHost));
    double ea = -1, eb = -1;
    for (int v = 0; v < 2; v++) {
        const product &g = v ? gb : ga;
        if (!g.n_algos || run(g, v ? wb : wa, X, dY, dW) != CUBLAS_STATUS_SUCCESS) continue;
        CK(cudaMemcpy(got.data(), db, out * 4, cudaMemcpyDeviceToHost));
        double e = 0, m = 0;
        for (int j = 0; j < out; j++) e = std::max(e, (double)fabsf(got[j] - ref[j])), m = std::max(m, (double)fabsf(ref[j]));
        (v ? eb : ea) = e / m;
    }
    printf("%-4s dW [%d x %d x %d ta] | plain %.4f + sums %.4f = %.4f | BGRADA %.4f (%d algos, err %.2g) | BGRADB %.4f (%d algos, err %.2g)\n",
           PREC_NAMES[p], in, out, R, t0, ts, t0 + ts, ta, ga.n_algos, ea, tb, gb.n_algos, eb);
    cudaFree(X); cudaFree(dY); cudaFree(dW); cudaFree(db); cudaFree(db2);
}

/* 2. and 3.: Y[R, N] = X[R, K] W[K, N]: with BIAS (f32 output, f32 bias), and with beta = 1 */
static void forward(prec p, int R, int N, int K) {
    const bool h = p == BF16;
    const size_t es = h ? 2 : 4;
    void *X, *W, *Y, *b;
    CK(cudaMalloc(&X, (size_t)R * K * es));
    CK(cudaMalloc(&W, (size_t)K * N * es));
    CK(cudaMalloc(&Y, (size_t)R * N * 4));
    CK(cudaMalloc(&b, N * 4));
    fill(X, (size_t)R * K, h, 1, 3);
    fill(W, (size_t)K * N, h, 0.1f, 4);
    fill(b, N, false, 1, 5);
    int w = 0;
    product plain = make(p, R, N, K, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, nullptr, false);
    product bias = make(p, R, N, K, 0, 0, CUBLASLT_EPILOGUE_BIAS, b, false);
    float t0 = best_of(plain, X, W, Y, &w), t1 = bias.n_algos ? best_of(bias, X, W, Y, &w) : -1;
    float t2 = best_of(plain, X, W, Y, &w, 1.0f);
    printf("%-4s Y [%d x %d x %d] f32 out | plain %.4f | BIAS f32 bias %.4f (%d algos) | beta=1 %.4f", PREC_NAMES[p], R, N, K, t0, t1,
           bias.n_algos, t2);
    if (h) {
        product p16 = make(p, R, N, K, 0, 0, CUBLASLT_EPILOGUE_DEFAULT, nullptr, true);
        float t3 = best_of(p16, X, W, Y, &w), t4 = best_of(p16, X, W, Y, &w, 1.0f);
        printf(" | bf16 out: plain %.4f, beta=1 %.4f", t3, t4);
    }
    printf("\n");
    cudaFree(X); cudaFree(W); cudaFree(Y); cudaFree(b);
}

int main() {
    CK(cudaStreamCreate(&stream));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WS));
    static const int WG[][3] = { { 16384, 384, 384 }, { 16384, 384, 1536 }, { 16384, 1536, 384 }, { 1024, 128, 128 }, { 1024, 128, 512 } };
    for (int p = 0; p < 3; p++)
        for (auto &s : WG) weight_gradient((prec)p, s[0], s[1], s[2]);
    static const int FW[][3] = { { 16384, 384, 384 }, { 16384, 1536, 384 }, { 1024, 128, 128 } };
    for (int p = 0; p < 3; p++)
        for (auto &s : FW) forward((prec)p, s[0], s[1], s[2]);
    return 0;
}
