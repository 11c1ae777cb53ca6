/* Column sums of char_gpt's [16384, 384] gradients, as the step has them: a bias gradient from an f32
 * or a bf16 source, and a layer norm's two parameter sums (dy bf16, x f32 with its row's mean and
 * reciprocal deviation). The library's generated form (a column a thread, 32 row groups, 22 chunks
 * of 768 rows, the last block adding the chunks) beside a form with VEC neighbouring columns a
 * thread (16- or 8-byte loads), Y row groups and PER rows a thread, and a plain read of the same
 * bytes (the floor). Each: 20 launches in a CUDA graph (../graph_ms.h), sources rotated over 8
 * copies (cold: past the 50 MB L2) or one (hot: as a source its producer just wrote may be).
 * Not part of the build: nvcc -O3 -arch=sm_90 -std=c++17 -o cv colsum_vec.cu; run on the GPU. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"

static const int R = 16384, C = 384, COPIES = 8;
typedef unsigned short bf16;

__device__ inline float bf(bf16 h) { return __uint_as_float((unsigned)h << 16); }

/* Source element loaders: NS sums of a row's VEC columns from j. */
struct Bias32 {   /* sum of an f32 gradient */
    const float *g;
    static const int NS = 1;
    template <int VEC> __device__ void load(int k, int j, float (&v)[1][VEC]) const {
        if (VEC == 4) { float4 q = *(const float4 *)(g + (size_t)k * C + j); v[0][0] = q.x; v[0][1] = q.y; v[0][2] = q.z; v[0][3] = q.w; }
        else if (VEC == 2) { float2 q = *(const float2 *)(g + (size_t)k * C + j); v[0][0] = q.x; v[0][1 % VEC] = q.y; }
        else v[0][0] = g[(size_t)k * C + j];
    }
};
template <int VEC> __device__ inline void load_bf(const bf16 *p, float *v) {
    if (VEC == 8) { uint4 q = *(const uint4 *)p; unsigned w[4] = { q.x, q.y, q.z, q.w };
        for (int i = 0; i < 4; i++) { v[2 * i] = __uint_as_float(w[i] << 16); v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); } }
    else if (VEC == 4) { uint2 q = *(const uint2 *)p; unsigned w[2] = { q.x, q.y };
        for (int i = 0; i < 2; i++) { v[2 * i] = __uint_as_float(w[i] << 16); v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u); } }
    else if (VEC == 2) { unsigned q = *(const unsigned *)p; v[0] = __uint_as_float(q << 16); v[1 % VEC] = __uint_as_float(q & 0xffff0000u); }
    else v[0] = bf(*p);
}
struct Bias16 {   /* sum of a bf16 gradient */
    const bf16 *g;
    static const int NS = 1;
    template <int VEC> __device__ void load(int k, int j, float (&v)[1][VEC]) const { load_bf<VEC>(g + (size_t)k * C + j, v[0]); }
};
struct Norm {     /* a layer norm's weight and bias gradients: dy (x - mean) rstd and dy */
    const bf16 *dy;
    const float *x, *mean, *rstd;
    static const int NS = 2;
    template <int VEC> __device__ void load(int k, int j, float (&v)[2][VEC]) const {
        load_bf<VEC>(dy + (size_t)k * C + j, v[0]);
        float xs[VEC];
        if (VEC == 4) { float4 q = *(const float4 *)(x + (size_t)k * C + j); xs[0] = q.x; xs[1 % VEC] = q.y; xs[2 % VEC] = q.z; xs[3 % VEC] = q.w; }
        else if (VEC == 2) { float2 q = *(const float2 *)(x + (size_t)k * C + j); xs[0] = q.x; xs[1 % VEC] = q.y; }
        else if (VEC == 8) { float4 q = *(const float4 *)(x + (size_t)k * C + j), p = *(const float4 *)(x + (size_t)k * C + j + 4);
            xs[0] = q.x; xs[1] = q.y; xs[2] = q.z; xs[3] = q.w; xs[4 % VEC] = p.x; xs[5 % VEC] = p.y; xs[6 % VEC] = p.z; xs[7 % VEC] = p.w; }
        else xs[0] = x[(size_t)k * C + j];
        const float m = mean[k] * (1.0f / C), s = rstd[k];
        for (int i = 0; i < VEC; i++) v[1][i] = v[0][i] * ((xs[i] - m) * s);
    }
};

/* The library's form: a column a thread, Y = 32, chunks of 768 rows (24 a thread, unrolled 8). */
__device__ double column_total(double acc, double (*part)[33]) {
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;
    part[y][lane] = acc;
    __syncthreads();
    acc = part[lane][y];
    for (int s = 16; s > 0; s /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    return acc;
}
__device__ bool last_block(unsigned *count, int arrivals) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(count, 1u) == (unsigned)arrivals - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    return last;
}
template <class S> __global__ void __launch_bounds__(1024) generated(S s, float *out, double *sums, unsigned *count) {
    __shared__ double part[S::NS][32][33];
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;
    const int j = blockIdx.x * 32 + lane, oc = blockIdx.x * 32 + y, k0 = blockIdx.y * 768, k1 = min(k0 + 768, R);
    float acc[S::NS] = {};
#pragma unroll 8
    for (int it = 0; it < 24; it++) {
        const int k = k0 + y + it * 32;
        if (k >= k1) continue;
        float v[S::NS][1];
        s.template load<1>(k, j, v);
        for (int q = 0; q < S::NS; q++) acc[q] += v[q][0];
    }
    double tot[S::NS];
    for (int q = 0; q < S::NS; q++) {
        tot[q] = column_total(acc[q], part[q]);
        if (lane == 0) sums[((size_t)q * gridDim.y + blockIdx.y) * C + oc] = tot[q];
    }
    if (!last_block(count + blockIdx.x, gridDim.y)) return;
    for (int q = 0; q < S::NS; q++) {
        double a = 0;
        for (int b = lane; b < (int)gridDim.y; b += 32) a += __ldcg(sums + ((size_t)q * gridDim.y + b) * C + oc);
        for (int o = 16; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
        if (lane == 0) out[q * C + oc] = (float)a;
    }
}

/* VEC columns a thread, Y row groups, PER rows a thread (unrolled), the block's row groups added in
 * shared memory, each chunk's sums to scratch, the last block of a column group adding them. */
template <class S, int VEC, int Y, int PER> __global__ void __launch_bounds__(32 * Y) vec(S s, float *out, double *sums, unsigned *count) {
    constexpr int NS = S::NS, W = 32 * VEC;   /* columns a block */
    __shared__ float red[Y][NS][W + 1];
    __shared__ double fin[32 * Y];
    const int lane = threadIdx.x & 31, y = threadIdx.x / 32;
    const int c0 = blockIdx.x * W, j = c0 + lane * VEC, k0 = blockIdx.y * (Y * PER);
    float acc[NS][VEC] = {};
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const int k = k0 + y + i * Y;
        if (k < R) {
            float v[NS][VEC];
            s.template load<VEC>(k, j, v);
            for (int q = 0; q < NS; q++)
                for (int e = 0; e < VEC; e++) acc[q][e] += v[q][e];
        }
    }
    for (int q = 0; q < NS; q++)
        for (int e = 0; e < VEC; e++) red[y][q][lane * VEC + e] = acc[q][e];
    __syncthreads();
    for (int o = threadIdx.x; o < NS * W; o += 32 * Y) {   /* output o: sum o / W, column o % W */
        double t = 0;
        for (int r = 0; r < Y; r++) t += red[r][o / W][o % W];
        sums[((size_t)(o / W) * gridDim.y + blockIdx.y) * C + c0 + o % W] = t;
    }
    if (!last_block(count + blockIdx.x, gridDim.y)) return;
    /* Each output's chunks split over P = threads / outputs threads, in a fixed order. */
    constexpr int OUT = NS * W, P = (32 * Y) / OUT > 0 ? (32 * Y) / OUT : 1;
    for (int o0 = 0; o0 < OUT; o0 += 32 * Y / P) {
        const int o = o0 + threadIdx.x % (32 * Y / P), p = threadIdx.x / (32 * Y / P);
        double t = 0;
        if (o < OUT)
            for (int b = p; b < (int)gridDim.y; b += P) t += __ldcg(sums + ((size_t)(o / W) * gridDim.y + b) * C + c0 + o % W);
        fin[threadIdx.x] = t;
        __syncthreads();
        if (p == 0 && o < OUT) {
            for (int r = 1; r < P; r++) t += fin[threadIdx.x + r * (32 * Y / P)];
            out[(o / W) * C + c0 + o % W] = (float)t;
        }
        __syncthreads();
    }
}

/* The floor: the same bytes read, 16 at a time, one float atomic a block. */
__global__ void readall(const float4 *p, long long n4, float *out) {
    float a = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
        float4 v = p[i];
        a += v.x + v.y + v.z + v.w;
    }
    for (int o = 16; o > 0; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
    if ((threadIdx.x & 31) == 0 && a == 12345.0f) atomicAdd(out, a);
}

static std::vector<double> want[3];
static float *d_out;
static double *d_sums;
static unsigned *d_count;
static cudaStream_t st;

static double error_of(int which, int ns) {
    std::vector<float> got(2 * C);
    CK(cudaMemcpy(got.data(), d_out, sizeof(float) * 2 * C, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (int i = 0; i < ns * C; i++) worst = std::max(worst, fabs(got[i] - want[which][i]) / (1e-3 + fabs(want[which][i])));
    return worst;
}

template <class S> static void time_form(const char *name, int which, S *src, dim3 grid, int threads,
                                         void (*k)(S, float *, double *, unsigned *), double bytes) {
    CK(cudaMemset(d_out, 0, sizeof(float) * 2 * C));
    k<<<grid, threads, 0, st>>>(src[0], d_out, d_sums, d_count);
    CK(cudaStreamSynchronize(st));
    CK(cudaGetLastError());
    const double err = error_of(which, S::NS);
    int i = 0;
    float cold = graph_ms(st, [&] { k<<<grid, threads, 0, st>>>(src[i++ % COPIES], d_out, d_sums, d_count); });
    float hot = graph_ms(st, [&] { k<<<grid, threads, 0, st>>>(src[0], d_out, d_sums, d_count); });
    printf("  %-34s blocks %4d x %4d  cold %6.2f us (%.2f TB/s)  hot %6.2f us  err %.1e\n", name, grid.x * grid.y, threads,
           cold * 1e3, bytes / (cold * 1e-3) * 1e-12, hot * 1e3, err);
}

template <class S, int VEC, int Y, int PER> static void time_vec(int which, S *src, double bytes) {
    char name[64];
    snprintf(name, sizeof name, "vec=%d Y=%d per=%d", VEC, Y, PER);
    dim3 grid(C / (32 * VEC), (R + Y * PER - 1) / (Y * PER));
    time_form<S>(name, which, src, grid, 32 * Y, vec<S, VEC, Y, PER>, bytes);
}

template <class S> static void suite(int which, S *src, double bytes, bool bf_only) {
    time_form<S>("generated (vec 1, Y 32, 22 chunks)", which, src, dim3(C / 32, 22), 1024, generated<S>, bytes);
    time_vec<S, 4, 8, 16>(which, src, bytes);
    time_vec<S, 4, 8, 32>(which, src, bytes);
    time_vec<S, 4, 16, 16>(which, src, bytes);
    time_vec<S, 4, 16, 8>(which, src, bytes);
    time_vec<S, 4, 32, 8>(which, src, bytes);
    time_vec<S, 4, 4, 32>(which, src, bytes);
    time_vec<S, 2, 16, 16>(which, src, bytes);
    time_vec<S, 2, 8, 32>(which, src, bytes);
    if (bf_only) time_vec<S, 4, 8, 24>(which, src, bytes);
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
    CK(cudaStreamCreate(&st));
    const size_t n = (size_t)R * C;
    std::vector<float> hx(n), hm(R), hr(R);
    std::vector<bf16> hb(n);
    srand(1);
    for (size_t i = 0; i < n; i++) {
        hx[i] = (float)rand() / RAND_MAX * 2 - 1;
        float f = (float)rand() / RAND_MAX * 2 - 1;
        unsigned u;
        memcpy(&u, &f, 4);
        hb[i] = (bf16)(u >> 16);
    }
    for (int k = 0; k < R; k++) { hm[k] = ((float)rand() / RAND_MAX - 0.5f) * C * 0.1f; hr[k] = 0.5f + (float)rand() / RAND_MAX; }
    for (int q = 0; q < 3; q++) want[q].assign(2 * C, 0.0);
    for (size_t i = 0; i < n; i++) {
        const int k = (int)(i / C), j = (int)(i % C);
        unsigned u = (unsigned)hb[i] << 16;
        float b;
        memcpy(&b, &u, 4);
        want[0][j] += hx[i];
        want[1][j] += b;
        want[2][j] += b;
        want[2][C + j] += (double)b * ((hx[i] - hm[k] * (1.0f / C)) * hr[k]);
    }
    float *x[COPIES], *mean, *rstd;
    bf16 *h[COPIES];
    for (int c = 0; c < COPIES; c++) {
        CK(cudaMalloc(&x[c], n * 4));
        CK(cudaMalloc(&h[c], n * 2));
        CK(cudaMemcpy(x[c], hx.data(), n * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(h[c], hb.data(), n * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&mean, R * 4));
    CK(cudaMalloc(&rstd, R * 4));
    CK(cudaMemcpy(mean, hm.data(), R * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(rstd, hr.data(), R * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_out, 2 * C * 4));
    CK(cudaMalloc(&d_sums, (size_t)2 * 4096 * C * 8));
    CK(cudaMalloc(&d_count, 4096 * 4));
    CK(cudaMemset(d_count, 0, 4096 * 4));
    int i = 0;
    float floor32 = graph_ms(st, [&] { readall<<<132 * 8, 256, 0, st>>>((const float4 *)x[i++ % COPIES], (long long)n / 4, d_out); });
    i = 0;
    float floor16 = graph_ms(st, [&] { readall<<<132 * 8, 256, 0, st>>>((const float4 *)h[i++ % COPIES], (long long)n / 8, d_out); });
    printf("read floor, cold: f32 [%d, %d] %.2f us (%.2f TB/s), bf16 %.2f us (%.2f TB/s)\n", R, C, floor32 * 1e3,
           n * 4 / (floor32 * 1e-3) * 1e-12, floor16 * 1e3, n * 2 / (floor16 * 1e-3) * 1e-12);
    Bias32 b32[COPIES];
    Bias16 b16[COPIES];
    Norm nm[COPIES];
    for (int c = 0; c < COPIES; c++) { b32[c] = { x[c] }; b16[c] = { h[c] }; nm[c] = { h[c], x[(c + 1) % COPIES], mean, rstd }; }
    printf("bias gradient, f32 source:\n");
    suite<Bias32>(0, b32, n * 4.0, false);
    printf("bias gradient, bf16 source:\n");
    suite<Bias16>(1, b16, n * 2.0, true);
    printf("layer norm weight and bias gradients (dy bf16, x f32):\n");
    suite<Norm>(2, nm, n * 6.0, false);
    return 0;
}
