/* Times variants.py's kernels alone (v0 as generated, v1-v3 with the next rows prefetched, v4 and v5
 * over other blocks under other bounds, v6 and v7 the row's inputs in registers) beside a
 * copy that reads and writes as many bytes a row (READ_BYTES and WRITE_BYTES per element), on one
 * arena (A) and a table of bound pointers (B) all at one 1 MB buffer. Each: 20 launches in a CUDA
 * graph, best of 5 rounds (../graph_ms.h). */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"
#include "../dump_buffers.h"

#include "floor_copy.h"

typedef void (*kernel)(float *, void *const *, const double *);

#ifdef ONE_ROW
int main() {   /* a kernel of one row a warp, and the same looping over rows on fewer blocks */
    const dump_buffers d = dump_buffers_new(ARENA);
    kernel fn[6] = { v0, v1, v2, v3, v4, v5 };
    const int grid[6] = { GRIDS };
    for (int r = 0; r < 2; r++)
        for (int v = 0; v < 6; v++) {
            cudaFuncAttributes at;
            CK(cudaFuncGetAttributes(&at, fn[v]));
            float ms = graph_ms(d.s, [&] { fn[v]<<<grid[v], 256, 0, d.s>>>(d.A, d.B, d.H); });
            printf("%-24s %5d blocks %3d registers %7.2f us\n", v ? "looping over rows" : "as generated", grid[v], at.numRegs, ms * 1e3);
        }
    CK(cudaGetLastError());
    return 0;
}
#else
int main() {
    const dump_buffers d = dump_buffers_new(ARENA);
    cudaStream_t s = d.s;
    kernel fn[8] = { v0, v1, v2, v3, v4, v5, v6, v7 };
    const int grid[8] = { BLOCKS, BLOCKS, BLOCKS, BLOCKS, 2 * 132, 4 * 132, BLOCKS, 2 * 132 };
    const char *what[8] = { "as generated", "next row into L1", "next row into L2", "next into L1, the one after into L2",
                            "launch bounds (256, 2), 264 blocks", "launch bounds (256, 4), 528 blocks", "row inputs in registers",
                            "  and (256, 2), 264 blocks" };
    const long long n = (long long)ROWS * WIDTH;
    uint4 *in, *out;
    CK(cudaMalloc(&in, n * READ_BYTES));
    CK(cudaMalloc(&out, n * WRITE_BYTES));
    for (int r = 0; r < 2; r++) {
        for (int v = 0; v < 8; v++) {
            cudaFuncAttributes at;
            CK(cudaFuncGetAttributes(&at, fn[v]));
            float ms = graph_ms(s, [&] { fn[v]<<<grid[v], 256, 0, s>>>(d.A, d.B, d.H); });
            printf("%-40s %4d blocks %3d registers %5zu B spilled %7.2f us\n", what[v], grid[v], at.numRegs, at.localSizeBytes, ms * 1e3);
        }
        float ms = graph_ms(s, [&] { floor_copy<<<132 * 8, 256, 0, s>>>(in, out, n * READ_BYTES / 16, n * WRITE_BYTES / 16); });
        printf("%-40s %7.2f us (%d + %d bytes an element: %.2f TB/s)\n", "floor: read, write as many bytes", ms * 1e3, READ_BYTES,
               WRITE_BYTES, (double)n * (READ_BYTES + WRITE_BYTES) / ms * 1e-9);
    }
    CK(cudaGetLastError());
    return 0;
}
#endif
