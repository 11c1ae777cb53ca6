/* Times the kernels variants.py wrote (v0-v3) alone, beside a read-two-write-one copy of the
 * same 4-byte elements, on one arena (A), a table of bound pointers (B) all at one 1 MB buffer.
 * Each: 20 launches in a CUDA graph, best of 5 rounds (../graph_ms.h). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"
#include "../dump_buffers.h"

__global__ void copy2(const float4 *a, const float4 *b, float4 *c, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 x = a[i], y = b[i];
        c[i] = make_float4(x.x * y.x, x.y * y.y, x.z * y.z, x.w * y.w);
    }
}

int main() {
    const dump_buffers d = dump_buffers_new(ARENA);
    cudaStream_t s = d.s;
    void (*fn[4])(float *, void *const *, const double *) = { v0, v1, v2, v3 };
#ifndef WHAT   /* variants.py's; loop_variants.py names its own */
#define WHAT { "as generated (unroll 8)", "unroll 4", "unroll 2", "no gelu_grad" }
#endif
    const char *what[4] = WHAT;
    const long long n = (long long)GX * 128 * GY * 768;   /* the elements the kernel reads */
    for (int r = 0; r < 2; r++) {
        for (int v = 0; v < 4; v++) {
            cudaFuncAttributes at;
            CK(cudaFuncGetAttributes(&at, fn[v]));
            float ms = graph_ms(s, [&] { fn[v]<<<dim3(GX, GY), THREADS, 0, s>>>(d.A, d.B, d.H); });
            printf("%-26s %3d registers  %7.2f us\n", what[v], at.numRegs, ms * 1e3);
        }
        float ms = graph_ms(s, [&] { copy2<<<132 * 8, 256, 0, s>>>((float4 *)d.A, (float4 *)(d.A + n), (float4 *)(d.A + 2 * n), n / 4); });
        printf("%-26s              %7.2f us (%lld elements: %.2f TB/s)\n", "read two, write one", ms * 1e3, n, 12.0 * n / ms * 1e-9);
    }
    CK(cudaGetLastError());
    return 0;
}
