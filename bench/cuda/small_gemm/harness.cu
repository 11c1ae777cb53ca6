/* The main of small_gemm.py's harness: the library's tg_gemm_nn/_nt/_tn in blocks of 4, 8 and 16
 * warps beside cuBLAS's default SGEMM, on small products; and an empty kernel with and without the
 * library kernel's shared memory, the floor of a launch. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"

extern "C" __global__ void empty_kernel(float *p) { extern __shared__ float s[]; if (p) s[threadIdx.x] = *p; }

typedef void (*kern)(const float *, const float *, float *, int, int, int, int64_t, int64_t);
struct shape { int M, N, K, ta, tb; const char *what; };
static const shape SHAPES[] = {
    { 256, 64, 64, 0, 0, "sin_mlp" }, { 256, 1, 64, 0, 0, "sin_mlp" }, { 64, 1, 256, 1, 0, "sin_mlp" },
    { 256, 64, 64, 0, 1, "sin_mlp" }, { 64, 64, 256, 1, 0, "sin_mlp" }, { 1, 64, 256, 1, 0, "sin_mlp" },
    { 128, 512, 784, 0, 0, "mnist" }, { 128, 512, 512, 0, 0, "mnist" }, { 128, 10, 512, 0, 0, "mnist" },
    { 512, 10, 128, 1, 0, "mnist" }, { 128, 512, 512, 0, 1, "mnist" }, { 512, 512, 128, 1, 0, "mnist" },
    { 784, 512, 128, 1, 0, "mnist" }, { 100, 37, 300, 0, 0, "odd" }, { 37, 100, 300, 1, 0, "odd" }, { 100, 37, 300, 0, 1, "odd" },
};

static cudaStream_t stream;

/* 20 launches of f in a graph, replayed 20 times, best of 5: ms a launch */
/* worst |c - exact| / sum |a b| over C */
static double check(const shape &s, const std::vector<float> &a, const std::vector<float> &b, const float *dC) {
    std::vector<float> c((size_t)s.M * s.N);
    CK(cudaMemcpy(c.data(), dC, c.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int m = 0; m < s.M; m++)
        for (int n = 0; n < s.N; n++) {
            double e = 0, mag = 0;
            for (int k = 0; k < s.K; k++) {
                double x = s.ta ? a[(size_t)k * s.M + m] : a[(size_t)m * s.K + k];
                double y = s.tb ? b[(size_t)n * s.K + k] : b[(size_t)k * s.N + n];
                e += x * y, mag += fabs(x * y);
            }
            worst = std::max(worst, fabs(c[(size_t)m * s.N + n] - e) / (mag + 1e-30));
        }
    return worst;
}

int main() {
    CK(cudaStreamCreate(&stream));
    cublasHandle_t h;
    cublasCreate(&h);
    cublasSetStream(h, stream);
    kern lib[2][2] = { { tg_gemm_nn, tg_gemm_nt }, { tg_gemm_tn, nullptr } };
    for (auto f : { tg_gemm_nn, tg_gemm_nt, tg_gemm_tn })
        CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * 12800));
    CK(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * 12800));
    for (int W : { 0, 4, 8, 16 })
        printf("empty kernel, 32 blocks of 128 threads, %6d bytes shared: %.4f ms\n", W * 12800,
               graph_ms(stream, [&] { empty_kernel<<<32, 128, W * 12800, stream>>>(nullptr); }));
    float *dA, *dB, *dC;
    CK(cudaMalloc(&dA, 4 << 20));
    CK(cudaMalloc(&dB, 4 << 20));
    CK(cudaMalloc(&dC, 4 << 20));
    srand(1);
    printf("%-6s %-18s %8s | %-23s | %s\n", "", "M x N x K", "cuBLAS", "library W=4/8/16", "worst error");
    for (const shape &s : SHAPES) {
        std::vector<float> a((size_t)s.M * s.K), b((size_t)s.K * s.N);
        for (auto &x : a) x = rand() / (float)RAND_MAX - 0.5f;
        for (auto &x : b) x = rand() / (float)RAND_MAX - 0.5f;
        CK(cudaMemcpy(dA, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dB, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
        const float one = 1, zero = 0;   /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T */
        float cub = graph_ms(stream, [&] {
            cublasSgemm(h, s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, s.ta ? CUBLAS_OP_T : CUBLAS_OP_N, s.N, s.M, s.K, &one, dB, s.tb ? s.K : s.N,
                        dA, s.ta ? s.M : s.K, &zero, dC, s.N);
        });
        float t[3];
        double err = 0;
        for (int i = 0; i < 3; i++) {
            const int W = 4 << i, shared = W * 12800;   /* LT_OWN_WARP_BYTES a warp */
            const kern f = lib[s.ta][s.tb];
            const dim3 grid((s.N + 31) / 32, (s.M + 15) / 16, 1);
            t[i] = graph_ms(stream, [&] { f<<<grid, 32 * W, shared, stream>>>(dA, dB, dC, s.M, s.N, s.K, 0, 0); });
            CK(cudaMemset(dC, 0, 4 << 20));
            f<<<grid, 32 * W, shared, stream>>>(dA, dB, dC, s.M, s.N, s.K, 0, 0);
            CK(cudaStreamSynchronize(stream));
            err = std::max(err, check(s, a, b, dC));
        }
        char mnk[40];
        snprintf(mnk, sizeof mnk, "%d x %d x %d%s%s", s.M, s.N, s.K, s.ta ? " ta" : "", s.tb ? " tb" : "");
        printf("%-6s %-18s %8.4f | %.4f %.4f %.4f | %.1e\n", s.what, mnk, cub, t[0], t[1], t[2], err);
    }
    return 0;
}
