/* char_gpt bf16's G = [dq dk dv] with its column sums, two ways:
 * "strip" as the generated column sum does it (blocks of 32 x 32 threads, a thread 4 columns of 18 rows; k605), and
 * "rows": a block a band of whole rows, a thread 4 columns of every row of the band, its partial sums per block to
 * scratch, then a kernel adding the blocks' partials per column in order. Checks both against the host's sums.
 * cd bench/cuda/colsum_rows && nvcc -O3 -arch=sm_90a -std=c++17 gsum.cu -o /tmp/gsum && /tmp/gsum
 * The question (bench/RESULTS.md, thirty-eighth session, item 6): the generated kernel reads 128-column strips of
 * rows 2,304 bytes apart and waits on its loads at 50% of DRAM's bandwidth; does reading whole rows do better?
 * No (H200, bench/logs/gpu_h200_s42_a_*): strips 35.0 us with their finish, bands of 32 rows 46.5, of 64 rows 50.9. */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"

enum { R = 16384, W = 384, C = 3 * W };

__device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
__device__ __forceinline__ unsigned short rnd(float x) {
    unsigned u = __float_as_uint(x);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ unsigned pack(float a, float b) { return (unsigned)rnd(a) | ((unsigned)rnd(b) << 16); }

/* 4 values of row r, columns c..c+3 of G (c a multiple of 4), from whichever source holds them */
__device__ __forceinline__ float4 g4(const float *dq, const unsigned short *dk, const unsigned short *dv, int r, int c) {
    if (c < W) return *(const float4 *)(dq + (size_t)r * W + c);
    const unsigned short *s = c < 2 * W ? dk + (size_t)r * W + (c - W) : dv + (size_t)r * W + (c - 2 * W);
    uint2 u = *(const uint2 *)s;
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}

/* strip: grid (C / 128, chunks), 1024 threads; lane: 4 columns, y: rows y, y + 32, ... of the chunk */
__global__ void __launch_bounds__(1024) strip(const float *dq, const unsigned short *dk, const unsigned short *dv,
                                              unsigned short *G, double *part, int rows_per_chunk) {
    __shared__ double red[32][33];
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32, c = (blockIdx.x * 32 + lane) * 4;
    const int k0 = blockIdx.y * rows_per_chunk, k1 = min(k0 + rows_per_chunk, R);
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma unroll 8
    for (int k = k0 + y; k < k1; k += 32) {
        float4 v = g4(dq, dk, dv, k, c);
        a0 += v.x; a1 += v.y; a2 += v.z; a3 += v.w;
        *(uint2 *)(G + (size_t)k * C + c) = make_uint2(pack(v.x, v.y), pack(v.z, v.w));
    }
    float a[4] = { a0, a1, a2, a3 };
    for (int j = 0; j < 4; j++) {   /* the 32 y's of each column added in order */
        red[y][lane] = a[j];
        __syncthreads();
        if (y == 0) {
            double t = 0;
            for (int q = 0; q < 32; q++) t += red[q][lane];
            part[(size_t)blockIdx.y * C + c + j] = t;
        }
        __syncthreads();
    }
}

/* rows: grid R / band, C / 4 threads; a thread 4 columns of every row of its block's band */
template <int BAND>
__global__ void __launch_bounds__(C / 4) rows(const float *dq, const unsigned short *dk, const unsigned short *dv,
                                             unsigned short *G, double *part) {
    const int c = threadIdx.x * 4, r0 = blockIdx.x * BAND;
    float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma unroll 8
    for (int r = r0; r < r0 + BAND; r++) {
        float4 v = g4(dq, dk, dv, r, c);
        a0 += v.x; a1 += v.y; a2 += v.z; a3 += v.w;
        *(uint2 *)(G + (size_t)r * C + c) = make_uint2(pack(v.x, v.y), pack(v.z, v.w));
    }
    double *p = part + (size_t)blockIdx.x * C + c;
    p[0] = a0; p[1] = a1; p[2] = a2; p[3] = a3;
}

/* the parts of n blocks added per column, in order */
__global__ void finish(const double *part, int n, float *sums) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t = 0;
    for (int b = 0; b < n; b++) t += part[(size_t)b * C + c];
    sums[c] = (float)t;
}

int main() {
    std::vector<float> hq((size_t)R * W);
    std::vector<unsigned short> hk((size_t)R * W), hv((size_t)R * W);
    unsigned s = 12345;
    auto rnd01 = [&] { s = s * 1664525u + 1013904223u; return (float)((s >> 8) * (1.0 / 16777216.0)) - 0.5f; };
    auto tobf = [](float x) { unsigned u; memcpy(&u, &x, 4); return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); };
    for (size_t i = 0; i < hq.size(); i++) { hq[i] = rnd01(); hk[i] = tobf(rnd01()); hv[i] = tobf(rnd01()); }
    std::vector<double> want(C, 0.0);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < W; j++) {
            unsigned uk = (unsigned)hk[(size_t)r * W + j] << 16, uv = (unsigned)hv[(size_t)r * W + j] << 16;
            float fk, fv;
            memcpy(&fk, &uk, 4);
            memcpy(&fv, &uv, 4);
            want[j] += hq[(size_t)r * W + j];
            want[W + j] += fk;
            want[2 * W + j] += fv;
        }
    float *dq, *sums;
    unsigned short *dk, *dv, *G;
    double *part;
    CK(cudaMalloc(&dq, hq.size() * 4));
    CK(cudaMalloc(&dk, hk.size() * 2));
    CK(cudaMalloc(&dv, hv.size() * 2));
    CK(cudaMalloc(&G, (size_t)R * C * 2));
    CK(cudaMalloc(&part, (size_t)1024 * C * 8));
    CK(cudaMalloc(&sums, C * 4));
    CK(cudaMemcpy(dq, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    auto check = [&](const char *what) {
        std::vector<float> got(C);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(got.data(), sums, C * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int c = 0; c < C; c++) worst = std::max(worst, fabs(got[c] - want[c]) / std::max(1.0, fabs(want[c])));
        printf("%-28s sums against the host's: worst %.3g\n", what, worst);
    };
    const int chunk = 576, chunks = (R + chunk - 1) / chunk;
    auto run_strip = [&] { strip<<<dim3(C / 128, chunks), 1024, 0, st>>>(dq, dk, dv, G, part, chunk); finish<<<(C + 255) / 256, 256, 0, st>>>(part, chunks, sums); };
    auto run_rows32 = [&] { rows<32><<<R / 32, C / 4, 0, st>>>(dq, dk, dv, G, part); finish<<<(C + 255) / 256, 256, 0, st>>>(part, R / 32, sums); };
    auto run_rows64 = [&] { rows<64><<<R / 64, C / 4, 0, st>>>(dq, dk, dv, G, part); finish<<<(C + 255) / 256, 256, 0, st>>>(part, R / 64, sums); };
    run_strip(); check("strip (9 x 29 x 1024)");
    run_rows32(); check("rows, bands of 32");
    run_rows64(); check("rows, bands of 64");
    for (int round = 0; round < 2; round++) {
        printf("strip + finish     %7.2f us\n", 1e3 * graph_ms(st, run_strip));
        printf("rows 32 + finish   %7.2f us\n", 1e3 * graph_ms(st, run_rows32));
        printf("rows 64 + finish   %7.2f us\n", 1e3 * graph_ms(st, run_rows64));
        printf("(bytes: %.1f MB read, %.1f MB written)\n", R * W * 8.0 / 1e6, R * C * 2.0 / 1e6);
    }
    CK(cudaGetLastError());
    return 0;
}
