/* Times variants.py's kernels (v0-v3) of N bf16 values alone, beside a 16-byte copy of the same
 * bytes, on one arena A holding uniform values in [-4, 4) at the source. Each: 20 launches in a
 * CUDA graph, best of 5 rounds (../graph_ms.h). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"

__global__ void copy16(const uint4 *a, uint4 *c, long long n16) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) c[i] = a[i];
}

__global__ void fill(unsigned short *x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = (unsigned short)(__float_as_uint(-4.0f + 8.0f * (float)((i * 2654435761ull) % 65536) / 65536.0f) >> 16);
}

int main() {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    float *A;
    CK(cudaMalloc(&A, ARENA * 4));
    fill<<<1024, 256>>>((unsigned short *)(A + SRC), N);
    const int threads[4] = { 256, 256, 256, 256 };
    const long long blocks[4] = { N / 4096, N / 4096, N / 4096, N / 2048 };
    void (*fn[4])(float *, void *const *, const double *) = { v0, v1, v2, v3 };
    const char *what[4] = { "as generated (4 values x 4)", "no gelu", "8 values x 2 (16 bytes)", "8 values x 1" };
    for (int r = 0; r < 2; r++) {
        for (int v = 0; v < 4; v++) {
            cudaFuncAttributes at;
            CK(cudaFuncGetAttributes(&at, fn[v]));
            float ms = graph_ms(s, [&] { fn[v]<<<blocks[v], threads[v], 0, s>>>(A, nullptr, nullptr); });
            printf("%-28s %3d registers  %7.2f us\n", what[v], at.numRegs, ms * 1e3);
        }
        float ms = graph_ms(s, [&] { copy16<<<132 * 8, 256, 0, s>>>((uint4 *)(A + SRC), (uint4 *)(A + DST), N / 8); });
        printf("%-28s               %7.2f us (%.2f TB/s)\n", "copy, 16 bytes a thread", ms * 1e3, 4.0 * N / ms * 1e-9);
    }
    CK(cudaGetLastError());
    return 0;
}
