/* The CPU product kernel alone: GFLOP/s of C = A B for square sizes, on each kernel path this
 * CPU runs (avx512, avx2, portable = OpenBLAS), with 1 thread and with all of OMP_NUM_THREADS,
 * beside the FMA peak of one core measured here (a loop of independent FMAs, eight or sixteen
 * lanes), so the percentage needs no clock frequency from a datasheet. Where the CPU has AVX512-BF16,
 * the AVX-512 path's products of bf16 operands too (vdpbf16ps: two multiply-adds per lane, so up
 * to twice the f32 FMA peak; their error is bf16 rounding's, about 1e-3).
 *
 *   gemm_bench [size ...]          (default 256 512 1024 2048; median of 5 runs each)
 *
 * It calls the library kernel TGK_MATMUL directly, with the arguments generated code passes. */
#include "cpu/cpu.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#ifdef __x86_64__
#include <immintrin.h>

/* The FMA peak of one core: twelve independent accumulator chains (more than latency x ports on
 * current x86 cores), 2 flops per lane per FMA. */
#define PEAK_ITERS 20000000L
__attribute__((target("avx2,fma"))) static double peak_avx2(void) {
    __m256 acc[12], x = _mm256_set1_ps(1.0f), y = _mm256_set1_ps(1e-9f);
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
    double t0 = now();
    for (long it = 0; it < PEAK_ITERS; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(x, y, acc[i]);
    }
    double t = now() - t0;
    float sink = 0;
    for (int i = 0; i < 12; i++) sink += _mm256_cvtss_f32(acc[i]);
    if (sink == 12345.0f) printf(" ");
    return 12.0 * 8 * 2 * PEAK_ITERS / t * 1e-9;
}

__attribute__((target("avx512f,fma"))) static double peak_avx512(void) {
    __m512 acc[12], x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1e-9f);
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
    double t0 = now();
    for (long it = 0; it < PEAK_ITERS; it++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
    }
    double t = now() - t0;
    float sink = 0;
    for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_ps(acc[i]);
    if (sink == 12345.0f) printf(" ");
    return 12.0 * 16 * 2 * PEAK_ITERS / t * 1e-9;
}
#else
static double peak_avx2(void) { return 0; }
static double peak_avx512(void) { return 0; }
#endif

/* Median GFLOP/s of C[n,n] = A B over 5 runs (after one warm-up), on `threads` threads. */
static double product_gflops(int64_t n, int threads, int flags, const float *A, const float *B, float *C) {
    int64_t args[7 + 2] = { 0, 0, n, n, n, 1, flags, 0, 0 };   /* ta, tb, M, N, K, batch, flags, offsets */
    void *bufs[3] = { (void *)A, (void *)B, C };
    void (*matmul)(const int64_t *, void *const *) = (void (*)(const int64_t *, void *const *))cpu_kernels[0];
    omp_set_num_threads(threads);
    matmul(args, bufs);
    double t[5];
    int reps = n <= 512 ? 20 : n <= 1024 ? 3 : 1;
    for (int k = 0; k < 5; k++) {
        double t0 = now();
        for (int r = 0; r < reps; r++) matmul(args, bufs);
        t[k] = (now() - t0) / reps;
    }
    qsort(t, 5, sizeof(double), cmp_double);
    return 2.0 * (double)n * (double)n * (double)n / t[2] * 1e-9;
}

/* Worst relative error of C against a double-precision product, on a few sampled entries. */
static double sample_error(int64_t n, const float *A, const float *B, const float *C) {
    double w = 0;
    for (int s = 0; s < 64; s++) {
        int64_t i = (s * 7919) % n, j = (s * 104729) % n;
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < n; k++) {
            ref += (double)A[i * n + k] * B[k * n + j];
            mag += fabs((double)A[i * n + k] * B[k * n + j]);
        }
        double e = fabs(C[i * n + j] - ref) / (mag > 0 ? mag : 1);
        if (e > w) w = e;
    }
    return w;
}

int main(int argc, char **argv) {
    int64_t sizes[16] = { 256, 512, 1024, 2048 };
    int n_sizes = 4;
    if (argc > 1) {
        n_sizes = 0;
        for (int i = 1; i < argc && n_sizes < 16; i++) sizes[n_sizes++] = atoll(argv[i]);
    }
    cpu_blas_single_threaded();
    int threads = omp_get_max_threads();
    cpu_isa best = cpu_isa_best();
    double peak[3] = { 0, 0, 0 };
    if (best >= CPU_ISA_AVX2) peak[CPU_ISA_AVX2] = peak_avx2();
    if (best >= CPU_ISA_AVX512) peak[CPU_ISA_AVX512] = peak_avx512();
    printf("FMA peak of one core, measured: avx2 %.1f GFLOP/s, avx512 %.1f GFLOP/s (0: not on this CPU)\n",
           peak[CPU_ISA_AVX2], peak[CPU_ISA_AVX512]);
    int64_t max_n = 0;
    for (int i = 0; i < n_sizes; i++) max_n = sizes[i] > max_n ? sizes[i] : max_n;
    float *A = malloc(sizeof(float) * (size_t)(max_n * max_n)), *B = malloc(sizeof(float) * (size_t)(max_n * max_n));
    float *C = malloc(sizeof(float) * (size_t)(max_n * max_n));
    if (!A || !B || !C) return 1;
    for (int64_t i = 0; i < max_n * max_n; i++) {
        A[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        B[i] = (float)((i * 40503u) % 1000) / 500.0f - 1.0f;
    }
    for (int isa = best; isa >= CPU_ISA_PORTABLE; isa--) {
        cpu_kernels_select((cpu_isa)isa);
        for (int bf16 = cpu_isa_bf16((cpu_isa)isa); bf16 >= 0; bf16--)   /* bf16 operands (MM_BF16) first, where the CPU has them */
            for (int i = 0; i < n_sizes; i++) {
                int64_t n = sizes[i];
                double g1 = product_gflops(n, 1, bf16 ? 32 : 0, A, B, C);
                double err = sample_error(n, A, B, C);
                double gt = threads > 1 ? product_gflops(n, threads, bf16 ? 32 : 0, A, B, C) : g1;
                double pk = peak[isa ? isa : CPU_ISA_AVX2];
                printf("%-8s%s n=%5lld  1 thread %6.1f GFLOP/s (%3.0f%% of one core's %s FMA peak)  %d threads %6.1f GFLOP/s "
                       "(%.2fx)  max rel err %.1e\n",
                       cpu_isa_name((cpu_isa)isa), bf16 ? " bf16" : "", (long long)n, g1, pk > 0 ? 100 * g1 / pk : 0,
                       isa == CPU_ISA_AVX512 ? "avx512" : "avx2", threads, gt, gt / g1, err);
                fflush(stdout);
            }
    }
    free(A);
    free(B);
    free(C);
    return 0;
}
