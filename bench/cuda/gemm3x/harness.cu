/* The main of gemm3x.py's harness: the library's tg_gemm3_nn, _nt and _tn (three TF32 products
 * making one f32 product) beside cublasSgemm in f32 and in TF32, each timed as the best of 5
 * rounds, on char_gpt's product shapes and an odd one (edges in M, N and K); every result's
 * worst error on 2000 sampled entries against a product in double, scaled by the sum of |a b|
 * (f32 accumulation's bound is about K * 6e-8 of it). Launched as cuda_products.c's own_launch
 * and own_run: a split reduction's parts in a workspace, then tg_gemm3_sum. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

static const int SHARED = 3 * 2 * 4608 * 4;   /* LT_X3_BYTES */
static const size_t WORKSPACE = 32u << 20;
static int sms;
static float *workspace;

/* cuda_products.c's x3_parts */
static int parts_of(int M, int N, int K) {
    const long tiles = (long)((M + 127) / 128) * ((N + 127) / 128), room = 2L * sms;
    long parts = std::min(tiles >= room ? 1 : room / tiles, (long)(K + 31) / 32 / 4);
    parts = std::min(parts, (long)(WORKSPACE / 4) / ((long)M * N));
    return parts > 1 ? (int)parts : 1;
}

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
        for (auto f : { tg_gemm3_nn, tg_gemm3_nt, tg_gemm3_tn }) {
            CK(cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
            CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, SHARED));
        }
        set = true;
    }
    const int S = parts_of(j.M, j.N, j.K);
    const dim3 grid((j.N + 127) / 128, (j.M + 127) / 128, S);
    const int64_t s = 0;
    float *to = S > 1 ? workspace : j.C;
    if (j.variant == 1) tg_gemm3_nn<<<grid, 128, SHARED>>>(j.A, j.B, to, j.M, j.N, j.K, s, s, S);
    if (j.variant == 2) tg_gemm3_nt<<<grid, 128, SHARED>>>(j.A, j.Bt, to, j.M, j.N, j.K, s, s, S);
    if (j.variant == 3) tg_gemm3_tn<<<grid, 128, SHARED>>>(j.At, j.B, to, j.M, j.N, j.K, s, s, S);
    if (S > 1) {
        const int64_t n4 = (int64_t)j.M * j.N / 4;
        tg_gemm3_sum<<<(unsigned)std::min<int64_t>((n4 + 255) / 256, 4 * sms), 256>>>((const float4 *)workspace, (float4 *)j.C, n4, S, n4);
    }
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
    for (float x : c)
        if (std::isnan(x)) return HUGE_VAL;   /* unwritten: the output was poisoned with NaN */
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
    const int shapes[][3] = { { 16384, 384, 384 }, { 16384, 1536, 384 }, { 16384, 384, 1536 }, { 384, 384, 16384 }, { 384, 1536, 16384 },
                              { 1536, 384, 16384 }, { 1000, 260, 132 }, { 44, 92, 2052 } };
    const char *names[] = { "cublasSgemm f32", "tg_gemm3_nn", "tg_gemm3_nt", "tg_gemm3_tn" };
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaMalloc(&workspace, WORKSPACE));
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
            CK(cudaMemset(d[4], 0xff, c.size() * 4));   /* NaN: an unwritten entry shows */
            const float ms = best_ms(j, reps);
            CK(cudaMemcpy(c.data(), d[4], c.size() * 4, cudaMemcpyDeviceToHost));
            printf("[%5d x %5d x %5d]  %-16s %.4f ms %6.1f TFLOP/s  err %.1e  speed vs sgemm %.2f  parts %d\n", M, N, K, names[j.variant],
                   ms, gf / ms, worst_error(a, b, c, M, N, K), sgemm / ms, parts_of(M, N, K));
        }
        for (float *p : d) CK(cudaFree(p));
    }
    return 0;
}
