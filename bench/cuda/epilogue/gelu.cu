/* cuBLASLt's GELU epilogues at bf16, as char_gpt's MLP would use them:
 *  1. which GELU they compute: a product with an f32 output and its pre-activation (aux, f32)
 *     over [-8, 8], against the exact erf form (PyTorch's F.gelu, ours) and the tanh form; the
 *     same for DGELU's derivative;
 *  2. what they cost at char_gpt's shapes: the forward [16384 x 384] x [384 x 1536] with BIAS
 *     against GELU_AUX_BIAS (bf16 output and aux), and the backward dH = dY W2^T [16384 x 1536]
 *     (K = 384) plain against DGELU and DGELU_BGRAD; beside a plain bf16 GELU kernel's time.
 * Best of the heuristic's first 8 algorithms, 20 launches in a CUDA graph, best of 5.
 * Not part of the build: nvcc -O3 -arch=sm_90 -o gelu bench/cuda/epilogue/gelu.cu -lcublasLt; run on the GPU machine. */
#include "lt_harness.h"

struct product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulHeuristicResult_t h[8];
    int n_algos;
};

/* Row-major C[M, N] = A[M, K] op(B) as column-major C^T = op(B)^T A^T; tb: our B is [N, K].
 * vec: the bias (or bias gradient, f32 unless vec_bf16); aux: the pre-activation, type of C. */
static product make(int M, int N, int K, bool tb, cublasLtEpilogue_t ep, const void *vec, bool vec_bf16, const void *aux,
                    bool c_bf16) {
    product r;
    LK(cublasLtMatmulDescCreate(&r.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    if (vec) {
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof vec));
        int32_t vt = vec_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vt, sizeof vt));
    }
    if (aux) {
        int64_t ld = N;
        int32_t at = c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof at));
    }
    LK(cublasLtMatrixLayoutCreate(&r.a, CUDA_R_16BF, tb ? K : N, tb ? N : K, tb ? K : N));
    LK(cublasLtMatrixLayoutCreate(&r.b, CUDA_R_16BF, K, M, K));
    LK(cublasLtMatrixLayoutCreate(&r.c, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, N, M, N));
    r.n_algos = lt_algos(r.desc, r.a, r.b, r.c, 8, r.h);
    return r;
}

static cublasStatus_t run(const product &p, int algo, const void *A, const void *B, void *C) {
    const float one = 1, zero = 0;
    return cublasLtMatmul(lt, p.desc, &one, B, p.a, A, p.b, &zero, C, p.c, C, p.c, &p.h[algo].algo, workspace, WS, stream);
}

static float best_of(const product &p, const void *A, const void *B, void *C) {
    float best = -1;
    for (int k = 0; k < p.n_algos; k++) {
        if (run(p, k, A, B, C) != CUBLAS_STATUS_SUCCESS) continue;
        float t = graph_ms(stream, [&] { run(p, k, A, B, C); }, 5);
        if (best < 0 || t < best) best = t;
    }
    return best;
}

static void fill(void *dev, size_t n, bool bf16, float lo, float hi, unsigned seed) {
    srand(seed);
    std::vector<__nv_bfloat16> h16(bf16 ? n : 0);
    std::vector<float> h32(bf16 ? 0 : n);
    for (size_t i = 0; i < n; i++) {
        float x = lo + (hi - lo) * (rand() / (float)RAND_MAX);
        if (bf16) h16[i] = __float2bfloat16(x); else h32[i] = x;
    }
    CK(cudaMemcpy(dev, bf16 ? (void *)h16.data() : (void *)h32.data(), n * (bf16 ? 2 : 4), cudaMemcpyHostToDevice));
}

static double gelu_erf(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }
static double dgelu_erf(double x) { return 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI); }
static double dgelu_tanh(double x) {
    double u = sqrt(2 / M_PI) * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
}

/* 1. f32 outputs: D = gelu(X W + b) with aux = X W + b; then D' = (X W) * gelu'(aux) */
static void which_gelu() {
    const int M = 4096, N = 256, K = 64;
    void *X, *W, *b, *D, *aux, *D2;
    CK(cudaMalloc(&X, (size_t)M * K * 2));
    CK(cudaMalloc(&W, (size_t)K * N * 2));
    CK(cudaMalloc(&b, N * 4));
    CK(cudaMalloc(&D, (size_t)M * N * 4));
    CK(cudaMalloc(&D2, (size_t)M * N * 4));
    CK(cudaMalloc(&aux, (size_t)M * N * 4));
    fill(X, (size_t)M * K, true, -0.5f, 0.5f, 1);
    fill(W, (size_t)K * N, true, -0.5f, 0.5f, 2);
    fill(b, N, false, -8, 8, 3);
    product f = make(M, N, K, false, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b, false, aux, false);
    product g = make(M, N, K, false, CUBLASLT_EPILOGUE_DGELU, nullptr, false, aux, false);
    product plain = make(M, N, K, false, CUBLASLT_EPILOGUE_DEFAULT, nullptr, false, nullptr, false);
    printf("algorithms: GELU_AUX_BIAS %d, DGELU %d (f32 out)\n", f.n_algos, g.n_algos);
    if (!f.n_algos || !g.n_algos || run(f, 0, X, W, D) != CUBLAS_STATUS_SUCCESS) { printf("no GELU epilogue at f32 out\n"); return; }
    std::vector<float> d(M * N), a(M * N), p(M * N), d2(M * N);
    CK(cudaMemcpy(d.data(), D, d.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(a.data(), aux, a.size() * 4, cudaMemcpyDeviceToHost));
    bool dg = run(g, 0, X, W, D2) == CUBLAS_STATUS_SUCCESS && run(plain, 0, X, W, D) == CUBLAS_STATUS_SUCCESS;
    CK(cudaStreamSynchronize(stream));
    CK(cudaMemcpy(p.data(), D, p.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(d2.data(), D2, d2.size() * 4, cudaMemcpyDeviceToHost));
    double e[4] = { 0, 0, 0, 0 }, lo = 1e9, hi = -1e9;
    for (size_t i = 0; i < d.size(); i++) {
        lo = std::min(lo, (double)a[i]), hi = std::max(hi, (double)a[i]);
        e[0] = std::max(e[0], fabs(d[i] - gelu_erf(a[i])));
        e[1] = std::max(e[1], fabs(d[i] - gelu_tanh(a[i])));
        if (dg) {
            e[2] = std::max(e[2], fabs(d2[i] - p[i] * dgelu_erf(a[i])));
            e[3] = std::max(e[3], fabs(d2[i] - p[i] * dgelu_tanh(a[i])));
        }
    }
    printf("pre-activation in [%.2f, %.2f]; GELU: max |D - erf form| %.3g, |D - tanh form| %.3g; DGELU%s: |D - erf| %.3g, |D - tanh| %.3g\n", lo, hi,
           e[0], e[1], dg ? "" : " (failed)", e[2], e[3]);
}

__global__ void gelu_kernel(const __nv_bfloat16 *x, __nv_bfloat16 *y, size_t n) {
    size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    uint4 v = *(const uint4 *)(x + i);
    __nv_bfloat16 *e = (__nv_bfloat16 *)&v;
    for (int k = 0; k < 8; k++) {
        float t = __bfloat162float(e[k]);
        e[k] = __float2bfloat16(0.5f * t * (1 + erff(t * 0.70710678f)));
    }
    *(uint4 *)(y + i) = v;
}

/* 2. char_gpt's MLP at bf16 */
static void costs() {
    const int M = 16384, H = 1536, C = 384;
    void *X, *W1, *b1, *Hpre, *Hout, *dY, *W2, *dH, *db;
    CK(cudaMalloc(&X, (size_t)M * C * 2));
    CK(cudaMalloc(&W1, (size_t)C * H * 2));
    CK(cudaMalloc(&b1, H * 4));
    CK(cudaMalloc(&Hpre, (size_t)M * H * 2));
    CK(cudaMalloc(&Hout, (size_t)M * H * 2));
    CK(cudaMalloc(&dY, (size_t)M * C * 2));
    CK(cudaMalloc(&W2, (size_t)H * C * 2));
    CK(cudaMalloc(&dH, (size_t)M * H * 2));
    CK(cudaMalloc(&db, H * 4));
    fill(X, (size_t)M * C, true, -1, 1, 4);
    fill(W1, (size_t)C * H, true, -0.1f, 0.1f, 5);
    fill(b1, H, true, -0.1f, 0.1f, 6);
    fill(dY, (size_t)M * C, true, -0.01f, 0.01f, 7);
    fill(W2, (size_t)H * C, true, -0.1f, 0.1f, 8);
    product bias = make(M, H, C, false, CUBLASLT_EPILOGUE_BIAS, b1, true, nullptr, true);
    product gelu = make(M, H, C, false, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b1, true, Hpre, true);
    product back = make(M, H, C, true, CUBLASLT_EPILOGUE_DEFAULT, nullptr, false, nullptr, true);
    product dgelu = make(M, H, C, true, CUBLASLT_EPILOGUE_DGELU, nullptr, false, Hpre, true);
    product dgelu_b = make(M, H, C, true, CUBLASLT_EPILOGUE_DGELU_BGRAD, db, false, Hpre, true);
    size_t n = (size_t)M * H;
    float tg = graph_ms(stream, [&] { gelu_kernel<<<n / 8 / 256, 256, 0, stream>>>((const __nv_bfloat16 *)Hpre, (__nv_bfloat16 *)Hout, n); }, 5);
    printf("forward [%d x %d x %d] bf16: BIAS %.4f (%d algos) + gelu kernel %.4f | GELU_AUX_BIAS %.4f (%d algos)\n", M, H, C,
           best_of(bias, X, W1, Hout), bias.n_algos, tg, best_of(gelu, X, W1, Hout), gelu.n_algos);
    printf("backward dH [%d x %d x %d tb] bf16: plain %.4f (%d) | DGELU %.4f (%d) | DGELU_BGRAD f32 %.4f (%d)\n", M, H, C,
           best_of(back, dY, W2, dH), back.n_algos, best_of(dgelu, dY, W2, dH), dgelu.n_algos, best_of(dgelu_b, dY, W2, dH),
           dgelu_b.n_algos);
}

int main() {
    CK(cudaStreamCreate(&stream));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WS));
    which_gelu();
    costs();
    return 0;
}
