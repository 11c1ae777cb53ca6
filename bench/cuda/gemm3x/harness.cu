/* The main of gemm3x.py's harness: the library's tg_gemm3_nn, _nt and _tn (three TF32 products
 * making one f32 product) beside cublasSgemm in f32 and in TF32, each timed as the best of 5
 * rounds, on char_gpt's product shapes and an odd one (edges in M, N and K); every result's
 * worst error on 2000 sampled entries against a product in double, scaled by the sum of |a b|
 * (f32 accumulation's bound is about K * 6e-8 of it). Launched as cuda_products.c's own_launch. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static const int SHARED = 2 * 2 * 128 * 20 * 4;   /* X3_SHARED */

struct job {
    cublasHandle_t h;
    const float *A, *B, *At, *Bt;
    float *C;
    int M, N, K, variant;   /* 0 cuBLAS, 1 nn, 2 nt (B stored transposed), 3 tn (A stored transposed) */
};

static void run(const job &j) {
    if (j.variant == 0) {   /* row-major C = A B is column-major C^T = B^T A^T */
        const float one = 1, zero = 0;
        cublasSgemm(j.h, CUBLAS_OP_N, CUBLAS_OP_N, j.N, j.M, j.K, &one, j.B, j.N, j.A, j.K, &zero, j.C, j.N);
        return;
    }
    static bool set = false;
    if (!set) {
        for (auto f : { tg_gemm3_nn, tg_gemm3_nt, tg_gemm3_tn }) CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
        set = true;
    }
    const dim3 grid((j.N + 127) / 128, (j.M + 127) / 128, 1);
    const int64_t s = 0;
    if (j.variant == 1) tg_gemm3_nn<<<grid, 256, SHARED>>>(j.A, j.B, j.C, j.M, j.N, j.K, s, s);
    if (j.variant == 2) tg_gemm3_nt<<<grid, 256, SHARED>>>(j.A, j.Bt, j.C, j.M, j.N, j.K, s, s);
    if (j.variant == 3) tg_gemm3_tn<<<grid, 256, SHARED>>>(j.At, j.B, j.C, j.M, j.N, j.K, s, s);
}

static float best_ms(const job &j, int reps) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int round = 0; round < 5; round++) {
        CK(cudaEventRecord(a));
        for (int r = 0; r < reps; r++) run(j);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms / reps);
    }
    CK(cudaGetLastError());
    return best;
}

static double worst_error(const std::vector<float> &a, const std::vector<float> &b, const std::vector<float> &c, int M, int N, int K) {
    double worst = 0;
    for (int s = 0; s < 2000; s++) {
        const int i = (int)((size_t)s * 7919 % M), j = (int)((size_t)s * 104729 % N);
        double e = 0, mag = 0;
        for (int k = 0; k < K; k++) {
            const double x = (double)a[(size_t)i * K + k] * b[(size_t)k * N + j];
            e += x;
            mag += fabs(x);
        }
        worst = std::max(worst, fabs(c[(size_t)i * N + j] - e) / mag);
    }
    return worst;
}

int main() {
    const int shapes[][3] = { { 16384, 384, 384 }, { 16384, 1536, 384 }, { 16384, 384, 1536 }, { 384, 384, 16384 }, { 1000, 260, 132 } };
    const char *names[] = { "cublasSgemm f32", "tg_gemm3_nn", "tg_gemm3_nt", "tg_gemm3_tn" };
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    for (auto &sh : shapes) {
        const int M = sh[0], N = sh[1], K = sh[2];
        std::vector<float> a((size_t)M * K), b((size_t)K * N), at(a.size()), bt(b.size()), c((size_t)M * N);
        srand(1);
        for (auto &x : a) x = (float)rand() / RAND_MAX * 2 - 1;
        for (auto &x : b) x = (float)rand() / RAND_MAX * 2 - 1;
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) at[(size_t)k * M + i] = a[(size_t)i * K + k];
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) bt[(size_t)n * K + k] = b[(size_t)k * N + n];
        float *d[5];
        const std::vector<float> *host[4] = { &a, &b, &at, &bt };
        for (int i = 0; i < 4; i++) {
            CK(cudaMalloc(&d[i], host[i]->size() * 4));
            CK(cudaMemcpy(d[i], host[i]->data(), host[i]->size() * 4, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&d[4], c.size() * 4));
        const double gf = 2.0 * M * N * K / 1e9;
        const int reps = std::max(3, (int)(2000 / gf));
        job j = { h, d[0], d[1], d[2], d[3], d[4], M, N, K, 0 };
        float sgemm = 0;
        for (int tf32 = 0; tf32 < 2; tf32++) {
            cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH);
            const float ms = best_ms(j, reps);
            if (!tf32) sgemm = ms;
            CK(cudaMemcpy(c.data(), d[4], c.size() * 4, cudaMemcpyDeviceToHost));
            printf("[%5d x %5d x %5d]  %-16s %.4f ms %6.1f TFLOP/s  err %.1e\n", M, N, K, tf32 ? "cuBLAS tf32" : names[0], ms, gf / ms,
                   worst_error(a, b, c, M, N, K));
        }
        for (j.variant = 1; j.variant <= 3; j.variant++) {
            CK(cudaMemset(d[4], 0, c.size() * 4));
            const float ms = best_ms(j, reps);
            CK(cudaMemcpy(c.data(), d[4], c.size() * 4, cudaMemcpyDeviceToHost));
            printf("[%5d x %5d x %5d]  %-16s %.4f ms %6.1f TFLOP/s  err %.1e  speed vs sgemm %.2f\n", M, N, K, names[j.variant], ms,
                   gf / ms, worst_error(a, b, c, M, N, K), sgemm / ms);
        }
        for (float *p : d) CK(cudaFree(p));
    }
    return 0;
}
