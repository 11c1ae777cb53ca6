/* Column sums on an H100, one launch a graph node, 20 nodes a graph (as TG_CUDA_PROFILE=graph times a launch):
 * the chunked last-block kernel of cuda_codegen.c at several rows a thread and block heights, one pass, float atomics
 * into a zeroed output and thread-block clusters, beside an element-wise kernel over the same data (the floor).
 * Not part of the build: nvcc -O3 -arch=sm_90 -std=c++17 -o colsum_bench bench/cuda/colsum_bench.cu, run on the GPU machine.
 * Figures in bench/RESULTS.md (ninth CUDA session) and bench/logs/gpu_h100_s12_colsum_*.txt. */
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cmath>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

// This block's partial sums of x * w over its rows of chunk blockIdx.y, column by column: thread
// (y, lane) sums rows y, y + Y, ... (PER of them) of column blockIdx.x * 32 + lane into part[y][lane].
template <int Y, int PER>
__device__ void block_partials(const float *x, const float *w, int R, int C, int chunks, double (*part)[33]) {
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;
    const int j = blockIdx.x * 32 + lane;
    const int chunk = (R + chunks - 1) / chunks, k0 = blockIdx.y * chunk, k1 = min(k0 + chunk, R);
    double acc = 0;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int k = k0 + y + i * Y;
        if (k < k1 && j < C) acc += x[(size_t)k * C + j] * w[(size_t)k * C + j];
    }
    part[y][lane] = acc;
    __syncthreads();
}

// Column oc's total over the block's Y row groups (every lane of the warp gets it).
template <int Y>
__device__ double block_column(double (*part)[33], int oc) {
    const int lane = threadIdx.x & 31;
    double a = lane < Y ? part[lane][oc] : 0;
    for (int s = 16; s > 0; s /= 2) a += __shfl_xor_sync(0xffffffffu, a, s);
    return a;
}

__device__ bool column_last(unsigned *count, int chunks) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(count + blockIdx.x, 1u) == chunks - 1;
        if (last) count[blockIdx.x] = 0;
    }
    __syncthreads();
    return last;
}

// Blocks of 32 columns x Y row groups, grid y = chunks, the last block of a column group adding
// the chunks' totals (cuda_codegen.c's column sums). Warp y writes columns y, y + Y, ...
template <int Y, int PER>
__global__ void __launch_bounds__(32 * Y) colsum_chunks(const float *x, const float *w, float *out, double *sums, unsigned *count, int R, int C, int chunks) {
    __shared__ double part[32][33];
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;
    block_partials<Y, PER>(x, w, R, C, chunks, part);
    for (int oc = y; oc < 32; oc += Y) {
        double a = block_column<Y>(part, oc);
        if (lane == 0 && blockIdx.x * 32 + oc < C) {
            if (chunks == 1) out[blockIdx.x * 32 + oc] = (float)a;
            else sums[(size_t)blockIdx.y * C + blockIdx.x * 32 + oc] = a;
        }
    }
    if (chunks == 1) return;
    if (!column_last(count, chunks)) return;
    for (int oc = y; oc < 32; oc += Y) {
        double a = 0;
        int c = blockIdx.x * 32 + oc;
        for (int b = lane; c < C && b < chunks; b += 32) a += __ldcg(sums + (size_t)b * C + c);
        for (int s = 16; s > 0; s /= 2) a += __shfl_xor_sync(0xffffffffu, a, s);
        if (lane == 0 && c < C) out[c] = (float)a;
    }
}

// The same partials added with float atomics into a zeroed output: what combining costs at least
template <int Y, int PER>
__global__ void __launch_bounds__(32 * Y) colsum_atomic(const float *x, const float *w, float *out, int R, int C, int chunks) {
    __shared__ double part[32][33];
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;
    block_partials<Y, PER>(x, w, R, C, chunks, part);
    for (int oc = y; oc < 32; oc += Y) {
        double a = block_column<Y>(part, oc);
        if (lane == 0 && blockIdx.x * 32 + oc < C) atomicAdd(out + blockIdx.x * 32 + oc, (float)a);
    }
}

// An element-wise kernel over the same data: the floor of one launch reading it
__global__ void elementwise(const float *x, const float *w, float *o, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) o[i] = x[i] * w[i];
}

// A cluster of blocks along y: block y's column totals added by block 0 through distributed shared memory
template <int Y, int PER>
__global__ void __launch_bounds__(32 * Y) colsum_cluster(const float *x, const float *w, float *out, int R, int C, int chunks) {
    __shared__ double part[32][33];
    __shared__ double tot[32];
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;
    block_partials<Y, PER>(x, w, R, C, chunks, part);
    for (int oc = y; oc < 32; oc += Y) {
        double a = block_column<Y>(part, oc);
        if (lane == 0) tot[oc] = a;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    if (blockIdx.y == 0 && threadIdx.x < 32) {
        double a = 0;
        unsigned base = (unsigned)__cvta_generic_to_shared(tot + threadIdx.x);
        for (int b = 0; b < chunks; b++) {
            unsigned remote;
            double v;
            asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(base), "r"(b));
            asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(remote));
            a += v;
        }
        if (blockIdx.x * 32 + threadIdx.x < C) out[blockIdx.x * 32 + threadIdx.x] = (float)a;
    }
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

struct Shape { int R, C; };

static float *dx, *dw, *dout;
static double *dsums;
static unsigned *dcount;

template <typename F>
static float time_graph(F launch, bool memset_first, int n_nodes = 20) {
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n_nodes; i++) {
        if (memset_first) CK(cudaMemsetAsync(dout, 0, 4 * 4096, s));
        launch(s);
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 20; i++) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    for (int rep = 0; rep < 7; rep++) {
        cudaEventRecord(a, s);
        for (int i = 0; i < 50; i++) CK(cudaGraphLaunch(ge, s));
        cudaEventRecord(b, s);
        CK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms * 1000 / (50 * n_nodes));
    }
    std::sort(t.begin(), t.end());
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g); cudaStreamDestroy(s);
    return t[3];
}

static double check(int R, int C, const std::vector<float> &hx, const std::vector<float> &hw) {
    std::vector<float> o(C);
    CK(cudaMemcpy(o.data(), dout, 4 * C, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int c = 0; c < C; c++) {
        double e = 0;
        for (int r = 0; r < R; r++) e += (double)hx[(size_t)r * C + c] * hw[(size_t)r * C + c];
        worst = fmax(worst, fabs(o[c] - e) / (1 + fabs(e)));
    }
    return worst;
}

template <int Y, int PER>
static void chunked(const char *name, int R, int C, const std::vector<float> &hx, const std::vector<float> &hw) {
    int chunks = (R + Y * PER - 1) / (Y * PER);
    dim3 grid((C + 31) / 32, chunks);
    float us = time_graph([&](cudaStream_t s) { colsum_chunks<Y, PER><<<grid, 32 * Y, 0, s>>>(dx, dw, dout, dsums, dcount, R, C, chunks); }, false);
    printf("  %-34s Y=%2d per=%2d blocks=%4d chunks=%3d  %6.2f us  err %.1e\n", name, Y, PER, grid.x * grid.y, chunks, us, check(R, C, hx, hw));
}
template <int Y, int PER>
static void atomics(int R, int C, const std::vector<float> &hx, const std::vector<float> &hw) {
    int chunks = (R + Y * PER - 1) / (Y * PER);
    dim3 grid((C + 31) / 32, chunks);
    float us = time_graph([&](cudaStream_t s) { colsum_atomic<Y, PER><<<grid, 32 * Y, 0, s>>>(dx, dw, dout, R, C, chunks); }, true);
    float us0 = time_graph([&](cudaStream_t s) { (void)s; }, true);
    (void)us0;
    printf("  %-34s Y=%2d per=%2d blocks=%4d chunks=%3d  %6.2f us (with a memset node each; memset alone %.2f)  err %.1e\n", "atomics", Y, PER, grid.x * grid.y, chunks, us, us0,
           check(R, C, hx, hw));
}
template <int Y, int PER>
static void cluster(int R, int C, const std::vector<float> &hx, const std::vector<float> &hw) {
    int chunks = (R + Y * PER - 1) / (Y * PER);
    if (chunks > 8) return;
    dim3 grid((C + 31) / 32, chunks);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1; at[0].val.clusterDim.y = chunks; at[0].val.clusterDim.z = 1;
    cfg.gridDim = grid; cfg.blockDim = dim3(32 * Y); cfg.attrs = at; cfg.numAttrs = 1;
    float us = time_graph([&](cudaStream_t s) { cfg.stream = s; CK(cudaLaunchKernelEx(&cfg, colsum_cluster<Y, PER>, (const float *)dx, (const float *)dw, dout, R, C, chunks)); }, false);
    printf("  %-34s Y=%2d per=%2d blocks=%4d chunks=%3d  %6.2f us  err %.1e\n", "cluster", Y, PER, grid.x * grid.y, chunks, us, check(R, C, hx, hw));
}

int main() {
    Shape shapes[] = { { 1024, 128 }, { 1024, 512 }, { 256, 64 }, { 128, 512 }, { 16384, 384 }, { 16384, 1536 }, { 16384, 768 }, { 4096, 384 } };
    size_t maxn = 16384 * 1536;
    CK(cudaMalloc(&dx, 4 * maxn)); CK(cudaMalloc(&dw, 4 * maxn)); CK(cudaMalloc(&dout, 4 * maxn));
    CK(cudaMalloc(&dsums, 8 * 1 << 20)); CK(cudaMalloc(&dcount, 4 * 4096));
    CK(cudaMemset(dcount, 0, 4 * 4096));
    cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
    printf("%s, %d SMs\n", p.name, p.multiProcessorCount);
    float empty = time_graph([&](cudaStream_t s) { elementwise<<<1, 32, 0, s>>>(dx, dw, dout, 0); }, false);
    printf("empty kernel: %.2f us\n", empty);
    for (Shape sh : shapes) {
        int R = sh.R, C = sh.C;
        size_t n = (size_t)R * C;
        std::vector<float> hx(n), hw(n);
        for (size_t i = 0; i < n; i++) { hx[i] = (float)((i * 2654435761u) % 1000) / 500 - 1; hw[i] = (float)((i * 40503u) % 777) / 388 - 1; }
        CK(cudaMemcpy(dx, hx.data(), 4 * n, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dw, hw.data(), 4 * n, cudaMemcpyHostToDevice));
        printf("[%d, %d]\n", R, C);
        float ew = time_graph([&](cudaStream_t s) { elementwise<<<(n + 255) / 256, 256, 0, s>>>(dx, dw, dout + 0, (int)n); }, false);
        printf("  %-34s %6.2f us\n", "element-wise x*w (writes n)", ew);
        bool small = R <= 1024;   /* small: the launch's latency; large: its traffic */
        if (small) chunked<32, 2>("chunks, last block", R, C, hx, hw);
        chunked<32, 4>("chunks, last block", R, C, hx, hw);
        chunked<32, 8>("chunks, last block", R, C, hx, hw);
        if (!small) chunked<32, 12>("chunks, last block", R, C, hx, hw);
        chunked<32, 16>("chunks, last block", R, C, hx, hw);
        if (!small) chunked<32, 24>("chunks, last block", R, C, hx, hw);
        chunked<32, 32>(small ? "one pass" : "chunks, last block", R, C, hx, hw);
        chunked<8, 4>("chunks, last block", R, C, hx, hw);
        chunked<8, 8>("chunks, last block", R, C, hx, hw);
        if (small) chunked<16, 4>("chunks, last block", R, C, hx, hw);
        else chunked<16, 24>("chunks, last block", R, C, hx, hw);
        atomics<32, 2>(R, C, hx, hw);
        if (small) {
            cluster<32, 4>(R, C, hx, hw);
            cluster<8, 16>(R, C, hx, hw);
        }
    }
    return 0;
}
