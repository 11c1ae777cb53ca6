/* A question for the f32 products (issue 18's f32 target): can f32 matrix products on an H100 run
 * faster than cuBLAS's SGEMM at f32's accuracy, as three TF32 tensor-core products (a = ah + al,
 * b = bh + bl, each part rounded to TF32; a b ~ ah bh + ah bl + al bh, which our f32 attention
 * already does)? This times such a kernel (mma.sync m16n8k8, 128 x 128 block tiles) beside
 * cublasSgemm on char_gpt's forward product shapes, and measures both errors against a product in
 * double on sampled entries. Not part of the build:
 *   nvcc -O3 -arch=sm_90 -o gemm3x bench/cuda/gemm3x/gemm3x.cu -lcublas && ./gemm3x */
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

#ifndef MINB
#define MINB 1   /* blocks an SM: 2 bounds registers to 128 */
#endif
enum { BM = 128, BN = 128, THREADS = 256 };

__device__ __forceinline__ unsigned tf32(float x) {
    unsigned u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
    return u;
}

__device__ __forceinline__ void mma(float *c, const unsigned *a, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* A 128 x BK tile of op(A), or BK x 128 of op(B), staged in registers as float4s along the
 * dimension that is contiguous in memory, then stored split into TF32 parts: KROW (the tile's
 * rows of 128 run along K: A, or B transposed) as [128][BK + 4], else as [BK][128 + 8]; either
 * way a fragment's lanes read distinct banks. */
template <int BK, bool KROW>
struct tile {
    enum { N4 = 128 * BK / 4 / THREADS, LD = KROW ? BK + 4 : 128 + 8, WORDS = KROW ? 128 * (BK + 4) : BK * (128 + 8) };
    float4 r[N4];
    __device__ void load(const float *src, int64_t ld, int r0, int k0, int rmax, int kmax, int tid) {
#pragma unroll
        for (int h = 0; h < N4; h++) {
            const int e = tid + h * THREADS;
            const int a = KROW ? e / (BK / 4) : e / 32, b = KROW ? 4 * (e % (BK / 4)) : 4 * (e % 32);
            const int rr = KROW ? r0 + a : r0 + b, kk = KROW ? k0 + b : k0 + a;   /* element (row, k) of the tile's first */
            const bool ok = KROW ? rr < rmax && kk < kmax : rr < rmax && kk < kmax;
            r[h] = ok ? *(const float4 *)(src + (KROW ? (int64_t)rr * ld + kk : (int64_t)kk * ld + rr)) : make_float4(0, 0, 0, 0);
        }
    }
    __device__ void store(unsigned *hi, unsigned *lo, int tid) const {
#pragma unroll
        for (int h = 0; h < N4; h++) {
            const int e = tid + h * THREADS;
            const int a = KROW ? e / (BK / 4) : e / 32, b = KROW ? 4 * (e % (BK / 4)) : 4 * (e % 32);
            const float4 x = r[h];
            const uint4 H = make_uint4(tf32(x.x), tf32(x.y), tf32(x.z), tf32(x.w));
            *(uint4 *)(hi + a * LD + b) = H;
            if (lo)
                *(uint4 *)(lo + a * LD + b) = make_uint4(tf32(x.x - __uint_as_float(H.x)), tf32(x.y - __uint_as_float(H.y)),
                                                         tf32(x.z - __uint_as_float(H.z)), tf32(x.w - __uint_as_float(H.w)));
        }
    }
    /* element (row i, depth k) of the tile as stored */
    static __device__ unsigned at(const unsigned *s, int i, int k) { return KROW ? s[i * LD + k] : s[k * LD + i]; }
};

/* C [M, N] = op(A) op(B), row-major, batch z at A + z sa, B + z sb, C + z M N; M, N, K multiples of
 * 4, A and B 16-byte aligned. 8 warps as 2 x 4, a warp's tile 64 x 32 (4 x 4 mma tiles). Shared
 * memory holds each tile's TF32 parts, split once as the tile is stored; the next tile's loads
 * are in flight in registers while this one is multiplied. X3 0: one TF32 product. */
template <int X3, int TA, int TB, int BK>
__global__ void __launch_bounds__(THREADS, MINB) gemm3x(const float *__restrict__ A, const float *__restrict__ B, float *__restrict__ C,
                                                     int M, int N, int K, int64_t sa, int64_t sb) {
    typedef tile<BK, !TA> ta_t;
    typedef tile<BK, (bool)TB> tb_t;
    extern __shared__ __align__(16) unsigned sm[];
    unsigned *Ah = sm, *Al = Ah + ta_t::WORDS, *Bh = Al + (X3 ? ta_t::WORDS : 0), *Bl = Bh + tb_t::WORDS;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / 4, wn = warp % 4;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    A += blockIdx.z * sa;
    B += blockIdx.z * sb;
    C += (int64_t)blockIdx.z * M * N;
    ta_t a_t;
    tb_t b_t;
    const int64_t lda = TA ? M : K, ldb = TB ? K : N;
    a_t.load(A, lda, m0, 0, M, K, tid);
    b_t.load(B, ldb, n0, 0, N, K, tid);
    a_t.store(Ah, X3 ? Al : nullptr, tid);
    b_t.store(Bh, X3 ? Bl : nullptr, tid);
    __syncthreads();
    float acc[4][4][4] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
        if (k0 + BK < K) {
            a_t.load(A, lda, m0, k0 + BK, M, K, tid);
            b_t.load(B, ldb, n0, k0 + BK, N, K, tid);
        }
#pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
            unsigned ah[4][4], al[4][4], bh[4][2], bl[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = 64 * wm + 16 * i + g;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    ah[i][q] = ta_t::at(Ah, r + 8 * (q & 1), ks + t + 4 * (q >> 1));
                    if (X3) al[i][q] = ta_t::at(Al, r + 8 * (q & 1), ks + t + 4 * (q >> 1));
                }
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int c = 32 * wn + 8 * j + g;
                bh[j][0] = tb_t::at(Bh, c, ks + t);
                bh[j][1] = tb_t::at(Bh, c, ks + t + 4);
                if (X3) {
                    bl[j][0] = tb_t::at(Bl, c, ks + t);
                    bl[j][1] = tb_t::at(Bl, c, ks + t + 4);
                }
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    if (X3) {   /* the small terms first */
                        mma(acc[i][j], al[i], bh[j][0], bh[j][1]);
                        mma(acc[i][j], ah[i], bl[j][0], bl[j][1]);
                    }
                    mma(acc[i][j], ah[i], bh[j][0], bh[j][1]);
                }
        }
        __syncthreads();
        if (k0 + BK < K) {
            a_t.store(Ah, X3 ? Al : nullptr, tid);
            b_t.store(Bh, X3 ? Bl : nullptr, tid);
            __syncthreads();
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int r = m0 + 64 * wm + 16 * i + g, c = n0 + 32 * wn + 8 * j + 2 * t;
            if (c >= N) continue;
            if (r < M) *(float2 *)(C + (int64_t)r * N + c) = make_float2(acc[i][j][0], acc[i][j][1]);
            if (r + 8 < M) *(float2 *)(C + (int64_t)(r + 8) * N + c) = make_float2(acc[i][j][2], acc[i][j][3]);
        }
}

template <int X3, int TA, int TB, int BK>
static void launch(const float *A, const float *B, float *C, int M, int N, int K) {
    const int smem = (X3 ? 2 : 1) * 4 * (tile<BK, !TA>::WORDS + tile<BK, (bool)TB>::WORDS);
    static bool once = false;
    if (!once) { CK(cudaFuncSetAttribute(gemm3x<X3, TA, TB, BK>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)); once = true; }
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM, 1);
    gemm3x<X3, TA, TB, BK><<<grid, THREADS, smem>>>(A, B, C, M, N, K, 0, 0);
}

static float best_ms(cudaStream_t s, int reps, void (*run)(void *), void *ctx) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int round = 0; round < 5; round++) {
        CK(cudaEventRecord(a, s));
        for (int r = 0; r < reps; r++) run(ctx);
        CK(cudaEventRecord(b, s));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms / reps);
    }
    return best;
}

struct job { cublasHandle_t h; const float *A, *B, *At, *Bt; float *C; int M, N, K, variant; };
static void run_sgemm(void *p) {
    job *j = (job *)p;
    const float one = 1, zero = 0;   /* row-major C = A B is column-major C^T = B^T A^T */
    cublasSgemm(j->h, CUBLAS_OP_N, CUBLAS_OP_N, j->N, j->M, j->K, &one, j->B, j->N, j->A, j->K, &zero, j->C, j->N);
}
static const char *const VARIANTS[] = { "3x nn bk16", "3x nn bk32", "3x nt bk16", "3x tn bk16", "3x nt bk32", "3x tn bk32", "1x nn bk16" };
static void run_ours(void *p) {
    job *j = (job *)p;
    switch (j->variant) {
    case 0: launch<1, 0, 0, 16>(j->A, j->B, j->C, j->M, j->N, j->K); break;
    case 1: launch<1, 0, 0, 32>(j->A, j->B, j->C, j->M, j->N, j->K); break;
    case 2: launch<1, 0, 1, 16>(j->A, j->Bt, j->C, j->M, j->N, j->K); break;
    case 3: launch<1, 1, 0, 16>(j->At, j->B, j->C, j->M, j->N, j->K); break;
    case 4: launch<1, 0, 1, 32>(j->A, j->Bt, j->C, j->M, j->N, j->K); break;
    case 5: launch<1, 1, 0, 32>(j->At, j->B, j->C, j->M, j->N, j->K); break;
    case 6: launch<0, 0, 0, 16>(j->A, j->B, j->C, j->M, j->N, j->K); break;
    }
}

/* worst |c - exact| / (|a| |b| summed over k) on sampled entries: the error a product's own
 * rounding leaves, scaled as f32 accumulation's bound is */
static double worst_error(const std::vector<float> &a, const std::vector<float> &b, const std::vector<float> &c, int M, int N, int K) {
    double worst = 0;
    for (int s = 0; s < 2000; s++) {
        int i = (int)((size_t)s * 7919 % M), j = (int)((size_t)s * 104729 % N);
        double e = 0, mag = 0;
        for (int k = 0; k < K; k++) {
            e += (double)a[(size_t)i * K + k] * b[(size_t)k * N + j];
            mag += fabs((double)a[(size_t)i * K + k] * b[(size_t)k * N + j]);
        }
        worst = std::max(worst, fabs(c[(size_t)i * N + j] - e) / mag);
    }
    return worst;
}

int main() {
    const int shapes[][3] = { { 16384, 384, 384 }, { 16384, 1536, 384 }, { 16384, 384, 1536 }, { 384, 384, 16384 }, { 1000, 260, 132 } };
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
        float *dA, *dB, *dAt, *dBt, *dC;
        CK(cudaMalloc(&dA, a.size() * 4));
        CK(cudaMalloc(&dB, b.size() * 4));
        CK(cudaMalloc(&dAt, a.size() * 4));
        CK(cudaMalloc(&dBt, b.size() * 4));
        CK(cudaMalloc(&dC, c.size() * 4));
        CK(cudaMemcpy(dA, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dB, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dAt, at.data(), a.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dBt, bt.data(), b.size() * 4, cudaMemcpyHostToDevice));
        const double gf = 2.0 * M * N * K / 1e9;
        const int reps = std::max(3, (int)(2000 / gf));
        job j = { h, dA, dB, dAt, dBt, dC, M, N, K, 0 };
        cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
        float ms_s = best_ms(0, reps, run_sgemm, &j);
        CK(cudaMemcpy(c.data(), dC, c.size() * 4, cudaMemcpyDeviceToHost));
        printf("[%5d x %5d x %5d]  cublasSgemm   %.4f ms %5.1f TFLOP/s  err %.1e\n", M, N, K, ms_s, gf / ms_s, worst_error(a, b, c, M, N, K));
        cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH);
        float ms_t = best_ms(0, reps, run_sgemm, &j);
        CK(cudaMemcpy(c.data(), dC, c.size() * 4, cudaMemcpyDeviceToHost));
        printf("[%5d x %5d x %5d]  cuBLAS tf32   %.4f ms %5.1f TFLOP/s  err %.1e\n", M, N, K, ms_t, gf / ms_t, worst_error(a, b, c, M, N, K));
        for (int v = 0; v < 7; v++) {
            j.variant = v;
            CK(cudaMemset(dC, 0, c.size() * 4));
            float ms = best_ms(0, reps, run_ours, &j);
            CK(cudaGetLastError());
            CK(cudaMemcpy(c.data(), dC, c.size() * 4, cudaMemcpyDeviceToHost));
            printf("[%5d x %5d x %5d]  ours %s  %.4f ms %5.1f TFLOP/s  err %.1e  speed vs sgemm %.2f\n", M, N, K, VARIANTS[v], ms,
                   gf / ms, worst_error(a, b, c, M, N, K), ms_s / ms);
        }
        CK(cudaFree(dA));
        CK(cudaFree(dB));
        CK(cudaFree(dAt));
        CK(cudaFree(dBt));
        CK(cudaFree(dC));
    }
    return 0;
}
