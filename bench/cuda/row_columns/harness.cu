/* Times variants.py's kernels alone (f0-f5 the fused layer norm backward with its column sums, rowk and colk the two
 * kernels it replaces, and both of those in a row) on one arena (A) and a table of bound pointers (B) all at one 1 MB
 * buffer. Each: 20 launches in a CUDA graph, best of 5 rounds (../graph_ms.h). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"
#include "../dump_buffers.h"

int main() {
    const dump_buffers d = dump_buffers_new(ARENA);
    cudaStream_t s = d.s;
    typedef void (*kernel)(float *, void *const *, const double *);
    kernel fn[6] = { f0, f1, f2, f3, f4, f5 };
    const int grid[6] = { BLOCKS, BLOCKS, 396, BLOCKS, BLOCKS, 396 };
    const char *what[6] = { "fused, as generated", "fused, launch bounds (256, 4)", "fused, 396 blocks", "  its tail cut",
                            "  its tail cut", "  its tail cut" };
    for (int r = 0; r < 2; r++) {
        for (int v = 0; v < 6; v++) {
            cudaFuncAttributes at;
            CK(cudaFuncGetAttributes(&at, fn[v]));
            float ms = graph_ms(s, [&] { fn[v]<<<grid[v], 256, 0, s>>>(d.A, d.B, d.H); });
            printf("%-32s %4d blocks %3d registers %5zu B spilled %7.2f us\n", what[v], grid[v], at.numRegs, at.localSizeBytes, ms * 1e3);
        }
        float row = graph_ms(s, [&] { rowk<<<ROWS * 32 / 256, 256, 0, s>>>(d.A, d.B, d.H); });
        float col = graph_ms(s, [&] { colk<<<dim3(COLK_X, COLK_Y), 1024, 0, s>>>(d.A, d.B, d.H); });
        float both = graph_ms(s, [&] { colk<<<dim3(COLK_X, COLK_Y), 1024, 0, s>>>(d.A, d.B, d.H); rowk<<<ROWS * 32 / 256, 256, 0, s>>>(d.A, d.B, d.H); });
        printf("row kernel %7.2f us, column sums %7.2f us, both in a row %7.2f us\n", row * 1e3, col * 1e3, both * 1e3);
    }
    CK(cudaGetLastError());
    return 0;
}
