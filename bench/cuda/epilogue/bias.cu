/* cuBLASLt's BIAS epilogue at char_gpt's and char_gpt_small's forward product shapes, bf16 operands
 * and output, f32 sums: does the heuristic offer algorithms with an f32 bias (our parameters' type)
 * and with a bf16 bias (cuBLASLt's default, Dtype), and how long does each product take beside the
 * plain product followed by a bias-add kernel that rounds to bf16 (what the library runs today:
 * the q, k and v bias adds of bench/RESULTS.md's profiles)? Each the best of the heuristic's first 8
 * algorithms, 20 launches in a CUDA graph, best of 5; results checked against the plain product
 * plus the bias, in f32.
 * Not part of the build: nvcc -O3 -arch=sm_90 -o bias bench/cuda/epilogue/bias.cu -lcublasLt; run on the GPU machine. */
#include "lt_harness.h"

/* row-major C[M, N] = A[M, K] B[K, N] (+ bias[N]) as column-major C^T = B^T A^T: cuBLASLt's m = N */
struct product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulHeuristicResult_t h[8];
    int n_algos;
};

static product make(int M, int N, int K, int bias_type, const void *bias) {   /* bias_type -1: no epilogue */
    product p;
    LK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (bias_type >= 0) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        int32_t t = bias_type;
        LK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
    }
    LK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, N, K, N));   /* our B, [K, N] row-major */
    LK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));   /* our A */
    LK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, N, M, N));
    p.n_algos = lt_algos(p.desc, p.a, p.b, p.c, 8, p.h);
    return p;
}

static void run(const product &p, int algo, const void *A, const void *B, void *C) {
    const float one = 1, zero = 0;
    LK(cublasLtMatmul(lt, p.desc, &one, B, p.a, A, p.b, &zero, C, p.c, C, p.c, &p.h[algo].algo, workspace, WS, stream));
}

/* what the library runs after the plain product: C = round_bf16(C + bias) */
__global__ void add_bias(__nv_bfloat16 *C, const float *bias, long long n, int N) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        C[i] = __float2bfloat16(__bfloat162float(C[i]) + bias[i % N]);
}

static float best_of(const product &p, const void *A, const void *B, void *C, int *which) {
    float best = 1e30f;
    for (int k = 0; k < p.n_algos; k++) {
        float t = graph_ms(stream, [&] { run(p, k, A, B, C); }, 5);
        if (t < best) best = t, *which = k;
    }
    return best;
}

int main() {
    CK(cudaStreamCreate(&stream));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WS));
    static const int SHAPES[][3] = { { 16384, 384, 384 }, { 16384, 1536, 384 }, { 16384, 384, 1536 }, { 1024, 128, 128 }, { 1024, 512, 128 } };
    printf("%-20s | %-22s | %-26s | %-26s | max |diff| vs plain + add (bf16 ulps of 1)\n", "M x N x K", "plain + add kernel (ms)", "BIAS, f32 bias (ms, algos)", "BIAS, bf16 bias (ms, algos)");
    for (auto &sh : SHAPES) {
        const int M = sh[0], N = sh[1], K = sh[2];
        std::vector<__nv_bfloat16> ha((size_t)M * K), hb((size_t)K * N);
        std::vector<float> hbias(N);
        std::vector<__nv_bfloat16> hbias16(N);
        srand(7);
        for (auto &x : ha) x = __float2bfloat16(rand() / (float)RAND_MAX - 0.5f);
        for (auto &x : hb) x = __float2bfloat16((rand() / (float)RAND_MAX - 0.5f) * 0.1f);
        for (int j = 0; j < N; j++) hbias[j] = rand() / (float)RAND_MAX - 0.5f, hbias16[j] = __float2bfloat16(hbias[j]);
        void *A, *B, *C, *C2, *bias32, *bias16;
        CK(cudaMalloc(&A, ha.size() * 2));
        CK(cudaMalloc(&B, hb.size() * 2));
        CK(cudaMalloc(&C, (size_t)M * N * 2));
        CK(cudaMalloc(&C2, (size_t)M * N * 2));
        CK(cudaMalloc(&bias32, N * 4));
        CK(cudaMalloc(&bias16, N * 2));
        CK(cudaMemcpy(A, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(B, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(bias32, hbias.data(), N * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(bias16, hbias16.data(), N * 2, cudaMemcpyHostToDevice));
        product plain = make(M, N, K, -1, nullptr), f32b = make(M, N, K, CUDA_R_32F, bias32), bf16b = make(M, N, K, CUDA_R_16BF, bias16);
        int w0 = 0, w1 = 0, w2 = 0;
        float t0 = best_of(plain, A, B, C, &w0);
        const long long n = (long long)M * N;
        float tadd = graph_ms(stream, [&] { add_bias<<<(unsigned)std::min<long long>((n + 255) / 256, 4096), 256, 0, stream>>>((__nv_bfloat16 *)C, (const float *)bias32, n, N); }, 5);
        float t1 = f32b.n_algos ? best_of(f32b, A, B, C2, &w1) : -1;
        float t2 = bf16b.n_algos ? best_of(bf16b, A, B, C2, &w2) : -1;
        /* the reference: plain product, then the add kernel once */
        run(plain, w0, A, B, C);
        add_bias<<<4096, 256, 0, stream>>>((__nv_bfloat16 *)C, (const float *)bias32, n, N);
        std::vector<__nv_bfloat16> ref(n), got(n);
        CK(cudaMemcpy(ref.data(), C, n * 2, cudaMemcpyDeviceToHost));
        double d1 = -1, d2 = -1;
        for (int v = 1; v <= 2; v++) {
            const product &p = v == 1 ? f32b : bf16b;
            if (!p.n_algos) continue;
            run(p, v == 1 ? w1 : w2, A, B, C2);
            CK(cudaMemcpy(got.data(), C2, n * 2, cudaMemcpyDeviceToHost));
            double d = 0;
            for (long long i = 0; i < n; i++) d = std::max(d, (double)fabsf(__bfloat162float(got[i]) - __bfloat162float(ref[i])));
            (v == 1 ? d1 : d2) = d;
        }
        CK(cudaStreamSynchronize(stream));
        char mnk[40];
        snprintf(mnk, sizeof mnk, "%d x %d x %d", M, N, K);
        printf("%-20s | %.4f + %.4f = %.4f | %.4f (%d algos)            | %.4f (%d algos)            | %.3g / %.3g\n", mnk, t0, tadd, t0 + tadd,
               t1, f32b.n_algos, t2, bf16b.n_algos, d1, d2);
        cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(C2); cudaFree(bias32); cudaFree(bias16);
    }
    return 0;
}
