/* char_gpt's token-embedding gradient: out[idx[r], :] += v[r, :] for 16,384 rows of 384 into 65 rows,
 * two ways: "atomic" as generated (tgk_scatter_rows: a thread an element, an atomic each), and "shared": a block
 * a band of rows and 128 columns, added up in shared memory (65 x 128 floats), then one atomic a value a block.
 * Checks both against the host's sums. Measured (H200, bench/logs/gpu_h200_s42_a_*): atomics 16.9 us with the
 * zeroing, shared memory 24.0-74.0 (bands of 64-512 rows): the atomics stay.
 * cd bench/cuda/scatter_rows && nvcc -O3 -arch=sm_90a -std=c++17 scatter.cu -o /tmp/scatter && /tmp/scatter */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"

enum { N = 16384, D = 384, V = 65, CW = 128 };

__global__ void zero(float *p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = 0; }

__global__ void atomic_rows(const float *v, const int *idx, float *out) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)N * D) return;
    const int r = idx[e / D];
    if (r >= 0 && r < V) atomicAdd(out + (int64_t)r * D + e % D, v[e]);
}

/* grid (D / CW, N / band); 256 threads: lane 4 columns, warp y rows y, y + 8, ... of the band */
__global__ void __launch_bounds__(256) shared_rows(const float *v, const int *idx, float *out, int band) {
    __shared__ float acc[V * CW];
    for (int i = threadIdx.x; i < V * CW; i += 256) acc[i] = 0;
    __syncthreads();
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32, c = lane * 4, c0 = blockIdx.x * CW;
    const int r0 = blockIdx.y * band, r1 = min(r0 + band, (int)N);
#pragma unroll 4
    for (int r = r0 + y; r < r1; r += 8) {
        const int t = idx[r];
        if (t < 0 || t >= V) continue;
        const float4 x = *(const float4 *)(v + (int64_t)r * D + c0 + c);
        float *a = acc + t * CW + c;
        atomicAdd(a, x.x); atomicAdd(a + 1, x.y); atomicAdd(a + 2, x.z); atomicAdd(a + 3, x.w);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < V * CW; i += 256)
        if (acc[i] != 0) atomicAdd(out + (int64_t)(i / CW) * D + c0 + i % CW, acc[i]);
}

int main() {
    std::vector<float> hv((size_t)N * D);
    std::vector<int> hi(N);
    unsigned s = 12345;
    auto rnd = [&] { s = s * 1664525u + 1013904223u; return s >> 8; };
    for (auto &x : hv) x = (float)(rnd() * (1.0 / 16777216.0)) - 0.5f;
    for (auto &x : hi) x = (int)(rnd() % V);
    std::vector<double> want((size_t)V * D, 0.0);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < D; j++) want[(size_t)hi[r] * D + j] += hv[(size_t)r * D + j];
    float *v, *out;
    int *idx;
    CK(cudaMalloc(&v, hv.size() * 4));
    CK(cudaMalloc(&idx, N * 4));
    CK(cudaMalloc(&out, V * D * 4));
    CK(cudaMemcpy(v, hv.data(), hv.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(idx, hi.data(), N * 4, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    auto check = [&](const char *what) {
        std::vector<float> got(V * D);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(got.data(), out, V * D * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int i = 0; i < V * D; i++) worst = std::max(worst, fabs(got[i] - want[i]) / std::max(1.0, fabs(want[i])));
        printf("%-24s against the host's: worst %.3g\n", what, worst);
    };
    auto run_atomic = [&] { zero<<<(V * D + 255) / 256, 256, 0, st>>>(out, V * D); atomic_rows<<<N * D / 256, 256, 0, st>>>(v, idx, out); };
    auto run_shared = [&](int band) { zero<<<(V * D + 255) / 256, 256, 0, st>>>(out, V * D); shared_rows<<<dim3(D / CW, (N + band - 1) / band), 256, 0, st>>>(v, idx, out, band); };
    run_atomic(); check("atomic");
    for (int band : {64, 128, 256, 512}) { run_shared(band); char t[64]; snprintf(t, 64, "shared, bands of %d", band); check(t); }
    for (int round = 0; round < 2; round++) {
        printf("atomic + zero            %7.2f us\n", 1e3 * graph_ms(st, run_atomic));
        for (int band : {64, 128, 256, 512}) printf("shared %3d + zero        %7.2f us\n", band, 1e3 * graph_ms(st, [&] { run_shared(band); }));
        printf("zero alone               %7.2f us\n", 1e3 * graph_ms(st, [&] { zero<<<(V * D + 255) / 256, 256, 0, st>>>(out, V * D); }));
    }
    CK(cudaGetLastError());
    return 0;
}
