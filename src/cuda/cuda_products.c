/* Matrix products through cuBLASLt, each with an algorithm chosen for its shape by timing.
 *
 * cuBLAS's own choice (cublasGemmEx: the first of cuBLASLt's heuristic list) is made for large
 * products. A step of a small model is mostly products with few output tiles and a long
 * reduction ([128, 784] x [784, 512] fills 4 of an H100's 132 SMs with 128 x 128 tiles), where
 * a variant that splits the reduction, or uses smaller tiles, runs several times faster. So each
 * distinct product (shape, transposes, batch, precision, operand alignment) runs the heuristic's
 * first LT_CANDIDATES algorithms on its own buffers before the step's graph is captured, and
 * keeps the fastest; the heuristic's first wins ties within 3%. Every cuBLASLt algorithm is
 * deterministic (a split reduction adds its parts in a fixed order), so a choice is a fixed
 * summation order; choices are remembered per process and kept in the kernel cache (checked
 * again with cublasLtMatmulAlgoCheck when read), so a process finds the same ones as the last.
 *
 * A small f32 product (f32 and tf32 graphs) has one more candidate, a kernel of ours (tgk_gemm
 * below): cuBLAS's f32 kernels for such shapes take 5-10 us where the arithmetic takes one or
 * two (an H100: [256, 64] x [64, 64] 10 us, [128, 512] x [512, 10] 5.8 us), bound by the
 * latency of their loads over a long reduction on few SMs. Ours splits the reduction over the
 * warps of a block instead, each copying its slice with every load in flight at once.
 *
 * An f32 graph's products have another (tgk_gemm3 below): three TF32 tensor-core products in
 * place of one f32 product, with f32's precision.
 *
 * TG_CUDA_TUNE=0 takes the heuristic's first without timing; TG_CUDA_TUNE=verbose prints every
 * choice with the candidates' times; TG_CUDA_OWN_GEMM=0 leaves the small-product kernel out, =4,
 * 8 or 16 takes it wherever it may run, in blocks of that many warps; TG_CUDA_X3=0 leaves the
 * tensor-core one out, =1 takes it wherever it may run (the tests' way to run every product
 * through each). */
#include "cuda/cuda.h"
#include "cuda/cuda_api.h"
#include "io/cache.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ----- our kernel for small products ----- */

/* Row-major C[M, N] = op(A) op(B), f32, batch z at A + z sa, B + z sb, C + z M N. A block computes
 * a 16 x 32 tile of C with W warps (blockDim.x = 32 W), warp w summing the w-th slice of K (a
 * multiple of 4), up to 52 of it at a time, over shared tiles of its own: cp.async copies them
 * with every load in flight and no registers held, so a warp waits about one memory latency per
 * chunk, and warps need no barrier in the loop. Such a kernel is bound by each warp's chain of
 * instructions (one block of few warps an SM), so the tiles are copied 16 bytes at a time where
 * their rows start aligned, and only the elements of the warp's slice; a lane sums a 4 x 4 block
 * of the tile, reading 4 of K at once as float4 (B^T's tile, whose rows a float4 read would
 * take with 4-way bank conflicts, by single floats from rows of odd length). The warps' sums
 * are added in warp order (a fixed order: the result does not depend on timing). */
const char CUDA_PRODUCT_SOURCE[] =
    "#define TGG_KC 52\n#define TGG_WARP 3200\n"   /* floats a warp: A 16 x (KC + 4) or KC x 20, then B KC x 36 or 32 x (KC + 1) */
    "static __device__ inline void tgg_copy(float *dst, const float *src, bool ok) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);\n"
    "    asm volatile(\"cp.async.ca.shared.global [%0], [%1], 4, %2;\\n\" :: \"r\"(a), \"l\"(src), \"r\"(ok ? 4 : 0));\n"
    "#else\n"
    "    *dst = ok ? *src : 0.0f;\n"
    "#endif\n}\n"
    "static __device__ inline void tgg_copy16(float *dst, const float *src, bool ok) {\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "    const unsigned a = (unsigned)__cvta_generic_to_shared(dst);\n"
    "    asm volatile(\"cp.async.ca.shared.global [%0], [%1], 16, %2;\\n\" :: \"r\"(a), \"l\"(src), \"r\"(ok ? 16 : 0));\n"
    "#else\n"
    "    *(float4 *)dst = ok ? *(const float4 *)src : make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n"
    "#endif\n}\n"
    /* rows x cols floats from src (row stride ld) to dst (row stride ldd), V floats a copy, zeros
     * past row rvalid and column cvalid (a multiple of V); the copies do not wait for each other */
    "template <int V>\n"
    "static __device__ inline void tgg_tile(float *dst, int ldd, const float *src, int64_t ld, int rows, int rvalid, int cols,\n"
    "                                       int cvalid, int lane) {\n"
    "    const int G = cols / V;\n"
    "    for (int e = lane; e < rows * G; e += 32) {\n"
    "        const int r = e / G, c = (e - r * G) * V;\n"
    "        const bool ok = r < rvalid && c < cvalid;\n"
    "        const float *from = ok ? src + r * ld + c : src;\n"
    "        if (V == 4) tgg_copy16(dst + r * ldd + c, from, ok);\n"
    "        else tgg_copy(dst + r * ldd + c, from, ok);\n"
    "    }\n}\n"
    "template <int TA, int TB>\n"
    "static __device__ void tgk_gemm(const float *A, const float *B, float *C, int M, int N, int K, int64_t sa, int64_t sb) {\n"
    "    extern __shared__ float tgg_sm[];\n"
    "    const int W = blockDim.x / 32, w = threadIdx.x / 32, lane = threadIdx.x & 31;\n"
    "    const int m0 = blockIdx.y * 16, n0 = blockIdx.x * 32, rm = (lane >> 3) * 4, cn = (lane & 7) * 4;\n"
    "    A += blockIdx.z * sa;\n"
    "    B += blockIdx.z * sb;\n"
    "    C += (int64_t)blockIdx.z * M * N;\n"
    "    const bool va = ((unsigned long long)A & 15) == 0 && sa % 4 == 0 && (TA ? M : K) % 4 == 0;\n"   /* rows start aligned */
    "    const bool vb = !TB && ((unsigned long long)B & 15) == 0 && sb % 4 == 0 && N % 4 == 0;\n"
    "    const int slice = ((K + W - 1) / W + 3) & ~3, kc = min(slice, TGG_KC);\n"
    "    const int k_begin = min(K, w * slice), k_end = min(K, k_begin + slice);\n"
    "    const int la = TA ? 20 : kc + 4, lb = TB ? kc + 1 : 36;\n"   /* the tiles' row strides */
    "    float *As = tgg_sm + w * TGG_WARP, *Bs = As + 20 * kc + 64;\n"
    "    float acc[4][4] = {};\n"
    "    for (int k0 = k_begin; k0 < k_end; k0 += kc) {\n"
    "        const int kn = min(kc, k_end - k0), k4 = (kn + 3) & ~3;\n"   /* past kn: zeros */
    "        float part[4][4] = {};\n"   /* the chunk's sums, added to acc after it: rounding grows with the chunks, not K */
    "        const float *a = TA ? A + (int64_t)k0 * M + m0 : A + (int64_t)m0 * K + k0;\n"
    "        const float *b = TB ? B + (int64_t)n0 * K + k0 : B + (int64_t)k0 * N + n0;\n"
    "        if (TA && va) tgg_tile<4>(As, la, a, M, k4, kn, 16, M - m0, lane);\n"
    "        else if (TA) tgg_tile<1>(As, la, a, M, k4, kn, 16, M - m0, lane);\n"
    "        else if (va) tgg_tile<4>(As, la, a, K, 16, M - m0, k4, kn, lane);\n"
    "        else tgg_tile<1>(As, la, a, K, 16, M - m0, k4, kn, lane);\n"
    "        if (TB) tgg_tile<1>(Bs, lb, b, K, 32, N - n0, k4, kn, lane);\n"
    "        else if (vb) tgg_tile<4>(Bs, lb, b, N, k4, kn, 32, N - n0, lane);\n"
    "        else tgg_tile<1>(Bs, lb, b, N, k4, kn, 32, N - n0, lane);\n"
    "#if __CUDA_ARCH__ >= 800\n"
    "        asm volatile(\"cp.async.wait_all;\\n\" ::: \"memory\");\n"
    "#endif\n"
    "        __syncwarp();\n"
    "        for (int k = 0; k < k4; k += 4) {\n"
    "            float x[4][4], y[4][4];\n"   /* x[i][kk] = A(rm + i, k + kk), y[kk][j] = B(k + kk, cn + j) */
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++) {\n"
    "                const float4 v = *(const float4 *)(TA ? As + (k + i) * la + rm : As + (rm + i) * la + k);\n"
    "                if (TA) x[0][i] = v.x, x[1][i] = v.y, x[2][i] = v.z, x[3][i] = v.w;\n"
    "                else x[i][0] = v.x, x[i][1] = v.y, x[i][2] = v.z, x[i][3] = v.w;\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++) {\n"
    "                if (TB) {\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < 4; j++) y[j][i] = Bs[(cn + i) * lb + k + j];\n"
    "                } else {\n"
    "                    const float4 v = *(const float4 *)(Bs + (k + i) * lb + cn);\n"
    "                    y[i][0] = v.x, y[i][1] = v.y, y[i][2] = v.z, y[i][3] = v.w;\n"
    "                }\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int kk = 0; kk < 4; kk++)\n"
    "#pragma unroll\n"
    "                for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "                    for (int j = 0; j < 4; j++) part[i][j] = fmaf(x[i][kk], y[kk][j], part[i][j]);\n"
    "        }\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 4; j++) acc[i][j] += part[i][j];\n"
    "        __syncwarp();\n"
    "    }\n"
    "    __syncthreads();\n"   /* the tiles' memory now holds each warp's 16 x 32 sums */
    "#pragma unroll\n"
    "    for (int i = 0; i < 4; i++)\n"
    "        *(float4 *)(tgg_sm + w * 512 + (rm + i) * 32 + cn) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);\n"
    "    __syncthreads();\n"
    "    for (int e = threadIdx.x; e < 512; e += blockDim.x) {\n"
    "        const int m = m0 + e / 32, n = n0 + e % 32;\n"
    "        if (m >= M || n >= N) continue;\n"
    "        float s = tgg_sm[e];\n"
    "        for (int q = 1; q < W; q++) s += tgg_sm[q * 512 + e];\n"
    "        C[(int64_t)m * N + n] = s;\n"
    "    }\n}\n";

/* A product template's four instances, by transposes ta * 2 + tb: kernels `prefix`_nn, _nt, _tn
 * and _tt calling fn<ta, tb>, with the bias pointer where `bias` is ", bias" (every instance takes
 * it: own_run passes the same arguments to each) and `more` parameters after the shape's (passed
 * on as `pass`) */
#define GEMM_NAMES(prefix) { prefix "_nn", prefix "_nt", prefix "_tn", prefix "_tt" }
#define GEMM_INSTANCE(bounds, fn, name, ta, tb, bias, more, pass)                                                      \
    "extern \"C\" __global__ void __launch_bounds__(" bounds ") " name                                                 \
    "(const float *A, const float *B, float *C, const float *bias, int M, int N, int K, int64_t sa, int64_t sb" more \
    ") {\n    tgk_prior();\n    " fn "<" #ta ", " #tb ">(A, B, C" bias ", M, N, K, sa, sb" pass ");\n}\n"
#define GEMM_INSTANCES(bounds, fn, prefix, bias, more, pass)                                                           \
    { GEMM_INSTANCE(bounds, fn, prefix "_nn", 0, 0, bias, more, pass), GEMM_INSTANCE(bounds, fn, prefix "_nt", 0, 1, bias, more, pass), \
      GEMM_INSTANCE(bounds, fn, prefix "_tn", 1, 0, bias, more, pass), GEMM_INSTANCE(bounds, fn, prefix "_tt", 1, 1, bias, more, pass) }

/* The small kernel adds no bias: a product whose bias is folded has a wave of output tiles
 * (cuda_fold_addends), past the small kernel's sizes but for the shallowest reductions. */
const char *const CUDA_PRODUCT_NAMES[4] = GEMM_NAMES("tg_gemm");
const char *const CUDA_PRODUCT_KERNELS[4] = GEMM_INSTANCES("512", "tgk_gemm", "tg_gemm", "", "", "");

/* ----- our kernel for f32 products on tensor cores -----
 *
 * An f32 graph's products may run as three TF32 products (x = xh + xl, xh rounded to TF32 and xl
 * the rest: a b ~ ah bh + ah bl + al bh, the small terms first), which carries f32's precision (the
 * error bench/cuda/gemm3x measures: 1e-7 to 2e-6 of the sum of |a b|, against SGEMM's 2e-8 to 2e-7
 * and TF32's 1e-4) on units eight times faster than f32's, where it beats cuBLAS's f32 kernels by
 * 3%, timed as any candidate (an H100: 1.35-1.58x cublasSgemm at char_gpt's shapes,
 * bench/RESULTS.md's seventeenth session). A block of 4 warps (2 x 2) computes a 128 x 128 tile of
 * C, a warp 64 x 64 (4 x 8 mma.m16n8k8 tiles): each fragment loaded from shared memory serves 8 or
 * 4 tiles, three times, so the loads stay far below the tensor cores' rate. Tiles of op(A) and
 * op(B), 32 of K deep, are copied by cp.async three stages ahead of their use, as they lie in
 * memory (float4s along whichever axis is contiguous: M, N and K multiples of 4, A and B 16-byte
 * aligned, x3_fits), rows along K as [128][36] words (read by ldmatrix), else as [32][136] (single
 * words): either way a fragment's 32 lanes read distinct banks. A fragment is split into its TF32
 * parts in registers as it is read (tgk_split_tf32: two integer operations and a subtraction;
 * cvt.rna.tf32 alone compiles to four, which cost 10-15% here). Where C has fewer tiles than the
 * GPU has room for blocks, the reduction is split too (S parts, blockIdx.z = batch * S + part, each
 * part's sums to a slice of the workspace), and tg_gemm3_sum adds the parts in order: the same sum
 * whatever ran first. */
const char CUDA_PRODUCT3_SOURCE[] =
    "#define TG3_BK 32\n#define TG3_STAGES 3\n#define TG3_KC 36\n#define TG3_KS 136\n#define TG3_TILE 4608\n"
    "static __device__ inline void tg3_mma(float *c, const unsigned *a, const unsigned *b) {\n"
    "    asm volatile(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n\"\n"
    "                 : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "                 : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n}\n"
    "static __device__ inline void tg3_ldsm(unsigned *r, const float *p) {\n"
    "    const unsigned a = (unsigned)__cvta_generic_to_shared(p);\n"
    "    asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\\n\"\n"
    "                 : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));\n}\n"
    /* A 128 x 32 tile of op(A), or of op(B) transposed, rows r0.. and K k0.. of src into dst: KC
     * when K is contiguous in memory (dst [128][TG3_KC]), else [32][TG3_KS]; zeros past rmax, kmax */
    "template <bool KC>\n"
    "static __device__ inline void tg3_copy(float *dst, const float *src, int64_t ld, int r0, int k0, int rmax, int kmax) {\n"
    "#pragma unroll\n"
    "    for (int h = 0; h < 8; h++) {\n"
    "        const int e = threadIdx.x + 128 * h, a = KC ? e / 8 : e / 32, b = KC ? 4 * (e % 8) : 4 * (e % 32);\n"
    "        const int rr = r0 + (KC ? a : b), kk = k0 + (KC ? b : a);\n"
    "        const bool ok = rr < rmax && kk < kmax;\n"
    "        const float *from = ok ? src + (KC ? (int64_t)rr * ld + kk : (int64_t)kk * ld + rr) : src;\n"
    "        const unsigned to = (unsigned)__cvta_generic_to_shared(dst + a * (KC ? TG3_KC : TG3_KS) + b);\n"
    "        asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\" :: \"r\"(to), \"l\"(from), \"r\"(ok ? 16 : 0));\n"
    "    }\n}\n"
    /* The 16 x 8 A fragment of rows r.. and K k.. of a tile (mma's a0..a3: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)) */
    "template <bool KC>\n"
    "static __device__ inline void tg3_afrag(unsigned *a, const float *s, int r, int k) {\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    if (KC) tg3_ldsm(a, s + (r + (lane & 15)) * TG3_KC + k + 4 * (lane >> 4));\n"
    "    else\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < 4; q++) a[q] = __float_as_uint(s[(k + t + 4 * (q >> 1)) * TG3_KS + r + g + 8 * (q & 1)]);\n}\n"
    /* The B fragments of two 8 x 8 tiles, columns n.. and n + 8.., K k..: b[0], b[1] the first's (t, g), (t + 4, g) */
    "template <bool KC>\n"
    "static __device__ inline void tg3_bfrag(unsigned *b, const float *s, int n, int k) {\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "    if (KC) tg3_ldsm(b, s + (n + (lane & 7) + 8 * (lane >> 4)) * TG3_KC + k + 4 * ((lane >> 3) & 1));\n"
    "    else\n"
    "#pragma unroll\n"
    "        for (int q = 0; q < 4; q++) b[q] = __float_as_uint(s[(k + t + 4 * (q & 1)) * TG3_KS + n + 8 * (q >> 1) + g]);\n}\n"
    /* A warp's 64 x 64 sums (rows r0.., columns c0..) stored, each column's bias added where BIAS:
     * x + -0 is x for every x, so a kernel without one stores exactly what it summed, in the code
     * it had before there was a bias */
    "template <bool BIAS>\n"
    "static __device__ inline void tg3_store(const float (&acc)[4][8][4], float *C, const float *bias, int M, int N, int r0, int c0) {\n"
    "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 8; j++) {\n"
    "            const int r = r0 + 16 * i + g, c = c0 + 8 * j + 2 * t;\n"
    "            if (c >= N) continue;\n"
    "            const float b0 = BIAS ? bias[c] : -0.0f, b1 = BIAS ? bias[c + 1] : -0.0f;\n"
    "            if (r < M) *(float2 *)(C + (int64_t)r * N + c) = make_float2(acc[i][j][0] + b0, acc[i][j][1] + b1);\n"
    "            if (r + 8 < M) *(float2 *)(C + (int64_t)(r + 8) * N + c) = make_float2(acc[i][j][2] + b0, acc[i][j][3] + b1);\n"
    "        }\n}\n"
    "template <int TA, int TB>\n"
    "static __device__ void tgk_gemm3(const float *A, const float *B, float *C, const float *bias, int M, int N, int K, int64_t sa,\n"
    "                                 int64_t sb, int S) {\n"
    "    extern __shared__ __align__(16) float tg3_sm[];\n"
    "    const int warp = threadIdx.x >> 5, wm = 64 * (warp >> 1), wn = 64 * (warp & 1);\n"
    "    const int m0 = blockIdx.y * 128, n0 = blockIdx.x * 128, part = blockIdx.z % S;\n"
    "    const int64_t lda = TA ? M : K, ldb = TB ? K : N;\n"
    "    A += blockIdx.z / S * sa;\n"
    "    B += blockIdx.z / S * sb;\n"
    "    C += (int64_t)blockIdx.z * M * N;\n"
    "    const int tiles = (K + TG3_BK - 1) / TG3_BK, kt0 = (int)((int64_t)part * tiles / S), kt1 = (int)((int64_t)(part + 1) * tiles / S);\n"
    "#pragma unroll\n"
    "    for (int s = 0; s < TG3_STAGES - 1; s++) {\n"
    "        if (kt0 + s < kt1) {\n"
    "            tg3_copy<!TA>(tg3_sm + 2 * s * TG3_TILE, A, lda, m0, (kt0 + s) * TG3_BK, M, K);\n"
    "            tg3_copy<(bool)TB>(tg3_sm + (2 * s + 1) * TG3_TILE, B, ldb, n0, (kt0 + s) * TG3_BK, N, K);\n"
    "        }\n"
    "        asm volatile(\"cp.async.commit_group;\\n\" ::);\n"
    "    }\n"
    "    float acc[4][8][4] = {};\n"
    "    for (int kt = kt0; kt < kt1; kt++) {\n"
    "        asm volatile(\"cp.async.wait_group %0;\\n\" :: \"n\"(TG3_STAGES - 2));\n"
    "        __syncthreads();\n"   /* this stage is in; every warp is done with the one the next copy overwrites */
    "        const int next = kt + TG3_STAGES - 1, ns = (next - kt0) % TG3_STAGES;\n"
    "        if (next < kt1) {\n"
    "            tg3_copy<!TA>(tg3_sm + 2 * ns * TG3_TILE, A, lda, m0, next * TG3_BK, M, K);\n"
    "            tg3_copy<(bool)TB>(tg3_sm + (2 * ns + 1) * TG3_TILE, B, ldb, n0, next * TG3_BK, N, K);\n"
    "        }\n"
    "        asm volatile(\"cp.async.commit_group;\\n\" ::);\n"
    "        const float *As = tg3_sm + 2 * ((kt - kt0) % TG3_STAGES) * TG3_TILE, *Bs = As + TG3_TILE;\n"
    "#pragma unroll\n"
    "        for (int ks = 0; ks < TG3_BK; ks += 8) {\n"
    "            unsigned ah[4][4], al[4][4], bh[8][2], bl[8][2];\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++) {\n"
    "                unsigned a[4];\n"
    "                tg3_afrag<!TA>(a, As, wm + 16 * i, ks);\n"
    "#pragma unroll\n"
    "                for (int q = 0; q < 4; q++) tgk_split_tf32(__uint_as_float(a[q]), ah[i][q], al[i][q]);\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int j = 0; j < 8; j += 2) {\n"
    "                unsigned b[4];\n"
    "                tg3_bfrag<(bool)TB>(b, Bs, wn + 8 * j, ks);\n"
    "#pragma unroll\n"
    "                for (int q = 0; q < 4; q++) tgk_split_tf32(__uint_as_float(b[q]), bh[j + (q >> 1)][q & 1], bl[j + (q >> 1)][q & 1]);\n"
    "            }\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < 8; j++) tg3_mma(acc[i][j], al[i], bh[j]);\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < 8; j++) tg3_mma(acc[i][j], ah[i], bl[j]);\n"
    "#pragma unroll\n"
    "            for (int i = 0; i < 4; i++)\n"
    "#pragma unroll\n"
    "                for (int j = 0; j < 8; j++) tg3_mma(acc[i][j], ah[i], bh[j]);\n"
    "        }\n"
    "    }\n"
    "    asm volatile(\"cp.async.wait_group 0;\\n\" ::);\n"
    "    if (bias) tg3_store<true>(acc, C, bias, M, N, m0 + wm, n0 + wn);\n"
    "    else tg3_store<false>(acc, C, bias, M, N, m0 + wm, n0 + wn);\n"
    "}\n"
    /* C = the sum of the S parts P[z][0..S) of each of the batch's products, in order, plus the
     * bias of the column (N of them; none where NULL), four values a thread (n4 = M N / 4 a product) */
    "extern \"C\" __global__ void __launch_bounds__(256) " CUDA_PRODUCT3_SUM "(const float4 *P, float4 *C, int64_t n4, int S, int64_t total4,\n"
    "                                                                     const float *bias, int N) {\n"
    "    tgk_prior();\n"
    "    for (int64_t e = (int64_t)blockIdx.x * 256 + threadIdx.x; e < total4; e += (int64_t)gridDim.x * 256) {\n"
    "        const float4 *p = P + e / n4 * S * n4 + e % n4;\n"
    "        float4 s = p[0];\n"
    "        for (int q = 1; q < S; q++) {\n"
    "            const float4 x = p[q * n4];\n"
    "            s.x += x.x, s.y += x.y, s.z += x.z, s.w += x.w;\n"
    "        }\n"
    "        if (bias) {\n"   /* single floats: a bias need not be 16-byte aligned */
    "            const float *b = bias + e % n4 % (N / 4) * 4;\n"
    "            s.x += b[0], s.y += b[1], s.z += b[2], s.w += b[3];\n"
    "        }\n"
    "        C[e] = s;\n"
    "    }\n}\n";

const char *const CUDA_PRODUCT3_NAMES[4] = GEMM_NAMES("tg_gemm3");
const char *const CUDA_PRODUCT3_KERNELS[4] = GEMM_INSTANCES("128, 2", "tgk_gemm3", "tg_gemm3", ", bias", ", int S", ", S");

bool cuda_x3_product(int64_t M, int64_t N, int64_t K, int64_t batch) {
    return M >= 1 && N >= 1 && K >= 1 && M % 4 == 0 && N % 4 == 0 && K % 4 == 0 && batch >= 1 && batch <= 65535 &&
           (M + 127) / 128 <= 65535 && M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX;
}

enum { OWN_BM = 16, OWN_BN = 32 };
/* Our kernels as timed: the small one in blocks of 4, 8 and 16 warps (more warps, shorter slices
 * of K), then the tensor-core one */
static const int OWN_CHOICES[] = { 4, 8, 16, OWN_X3 };

bool cuda_own_product(int64_t M, int64_t N, int64_t K, int64_t batch) {
    return M >= 1 && N >= 1 && batch >= 1 && M <= 65535 * (int64_t)OWN_BM && N <= INT32_MAX && K <= INT32_MAX && batch <= 65535 &&
           (double)M * (double)N * (double)K * (double)batch <= (double)(1 << 27);
}

/* Can our tensor-core kernel (OWN_X3) take shape s: f32 operands and result in an f32 graph,
 * float4 loads and float2 stores aligned */
static bool x3_fits(const lt_shape *s) {
    return !s->bf16 && !s->c_bf16 && !s->tf32 && cuda_x3_product(s->M, s->N, s->K, s->batch) && s->align[0] % 16 == 0 &&
           s->align[1] % 16 == 0 && s->align[2] % 8 == 0 && s->a_stride % 4 == 0 && s->b_stride % 4 == 0;
}

static int64_t least(int64_t a, int64_t b) { return a < b ? a : b; }

/* How many parts the tensor-core kernel splits shape s's reduction into: enough for C's tiles
 * to fill the GPU's room for blocks (two an SM), each part at least 4 of its 32-deep tiles of
 * K, all parts' sums in the workspace. */
static int x3_parts(const lt_shape *s, const lt_device *d) {
    const int64_t tiles = (s->M + 127) / 128 * ((s->N + 127) / 128) * s->batch, room = 2 * (int64_t)d->sms;
    int64_t parts = least(tiles >= room ? 1 : room / tiles, (s->K + 31) / 32 / 4);
    parts = least(parts, (int64_t)(d->workspace_bytes / sizeof(float)) / (s->M * s->N * s->batch));
    parts = least(parts, 65535 / s->batch);
    return parts > 1 ? (int)parts : 1;
}

/* Can our kernel take shape s (f32 operands and result: cuda_own_product) in blocks of `warps`
 * (OWN_X3: the tensor-core kernel, its reduction in `parts`), and how is it launched. */
static bool own_launch(const lt_shape *s, const lt_device *d, int warps, unsigned grid[3], unsigned *block, unsigned *shared,
                       int *parts) {
    *parts = 1;
    if (warps == OWN_X3) {
        if (!x3_fits(s)) return false;
        *parts = x3_parts(s, d);
        grid[0] = (unsigned)((s->N + 127) / 128);
        grid[1] = (unsigned)((s->M + 127) / 128);
        grid[2] = (unsigned)(s->batch * *parts);
        *block = 128;
        *shared = LT_X3_BYTES;
        return true;
    }
    if (warps < 1 || warps > d->own_warps || s->bf16 || s->c_bf16 || !cuda_own_product(s->M, s->N, s->K, s->batch)) return false;
    grid[0] = (unsigned)((s->N + OWN_BN - 1) / OWN_BN);
    grid[1] = (unsigned)((s->M + OWN_BM - 1) / OWN_BM);
    grid[2] = (unsigned)s->batch;
    *block = (unsigned)(32 * warps);
    *shared = (unsigned)(LT_OWN_WARP_BYTES * warps);
    return true;
}

/* Our kernel's run of p, its bias (the tensor-core kernel's only) added where it stores C; a split
 * reduction's parts go to the workspace, and tg_gemm3_sum adds them and the bias into C. */
static int own_run(const lt_product *p, const lt_device *d, const void *A, const void *B, void *C, bool early) {
    const lt_shape *s = &p->shape;
    unsigned grid[3], block, shared;
    int parts;
    if (!own_launch(s, d, p->own_warps, grid, &block, &shared, &parts)) return -1;
    int M = (int)s->M, N = (int)s->N, K = (int)s->K;
    int64_t sa = s->a_stride, sb = s->b_stride;
    void *to = parts > 1 ? (void *)d->workspace : C;
    const void *bias = parts > 1 ? NULL : p->bias;   /* a split reduction's bias: its parts' sum adds it */
    void *args[] = { &A, &B, &to, &bias, &M, &N, &K, &sa, &sb, &parts };
    CUresult r = cuda_start(p->own, grid, block, shared, d->stream, args, early);
    if (r || parts == 1) return r;
    int64_t n4 = s->M * s->N / 4, total4 = n4 * s->batch;
    const unsigned sum_grid[3] = { (unsigned)least((total4 + 255) / 256, 4 * (int64_t)d->sms), 1, 1 };
    void *sum_args[] = { &to, &C, &n4, &parts, &total4, (void *)&p->bias, &N };
    return cuda_start(p->own_sum, sum_grid, 256, 0, d->stream, sum_args, early);
}

typedef struct {                                /* cublasLtMatmulHeuristicResult_t */
    lt_algo algo;
    size_t workspace;
    int state;
    float waves;
    int reserved[4];
} lt_heuristic;

static struct {
    int (*Create)(void **);
    size_t (*GetVersion)(void);
    int (*DescCreate)(void **, int, int);
    int (*DescDestroy)(void *);
    int (*DescSetAttribute)(void *, int, const void *, size_t);
    int (*LayoutCreate)(void **, int, uint64_t, uint64_t, int64_t);
    int (*LayoutDestroy)(void *);
    int (*LayoutSetAttribute)(void *, int, const void *, size_t);
    int (*PrefCreate)(void **);
    int (*PrefDestroy)(void *);
    int (*PrefSetAttribute)(void *, int, const void *, size_t);
    int (*GetHeuristic)(void *, void *, void *, void *, void *, void *, void *, int, lt_heuristic *, int *);
    int (*AlgoCheck)(void *, void *, void *, void *, void *, void *, const lt_algo *, lt_heuristic *);
    int (*ConfigGetAttribute)(const lt_algo *, int, void *, size_t, size_t *);
    int (*Matmul)(void *, void *, const void *, const void *, void *, const void *, void *, const void *, const void *, void *,
                  void *, void *, const lt_algo *, void *, size_t, CUstream);
} lt;

static const char *const LT_NAMES[] = {
    "cublasLtCreate", "cublasLtGetVersion", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
    "cublasLtMatrixLayoutSetAttribute", "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulAlgoCheck",
    "cublasLtMatmulAlgoConfigGetAttribute", "cublasLtMatmul",
};
static const char *const LT_LIBS[] = { "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so", NULL };

/* cublasLt.h's numbers for what is used here */
enum {
    LT_R_32F = 0, LT_R_16BF = 14, LT_COMPUTE_32F = 68, LT_COMPUTE_32F_FAST_TF32 = 77,
    LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_EPILOGUE = 7, LT_DESC_BIAS_POINTER = 8, LT_DESC_BIAS_TYPE = 26,
    LT_EPILOGUE_BIAS = 4,
    LT_LAYOUT_BATCH_COUNT = 5, LT_LAYOUT_BATCH_STRIDE = 6,
    LT_PREF_MAX_WORKSPACE = 1, LT_PREF_REDUCTION_MASK = 3, LT_PREF_ALIGN_A = 5,   /* _B, _C, _D: 6, 7, 8 */
    LT_REDUCTION_COMPUTE_TYPE = 2,
    LT_CONFIG_ID = 0, LT_CONFIG_TILE = 1, LT_CONFIG_SPLITK = 2, LT_CONFIG_REDUCTION = 3,
};

#define LT_CANDIDATES 8
#define LT_TIMED_RUNS 20

static struct {
    pthread_once_t once;
    bool ok;
    pthread_mutex_t mu;
    struct lt_memo { int device; lt_shape shape; lt_algo algo; size_t workspace; int own_warps; } *memo;
    int n_memo, cap_memo;
} g_lt = { .once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER };

static void load(void) {
    for (const char *const *name = LT_LIBS; *name && !g_lt.ok; name++) {
        void *lib = dlopen(*name, RTLD_NOW | RTLD_LOCAL);
        if (!lib) continue;
        g_lt.ok = true;
        for (size_t i = 0; i < sizeof LT_NAMES / sizeof *LT_NAMES && g_lt.ok; i++)
            g_lt.ok = (((void **)&lt)[i] = dlsym(lib, LT_NAMES[i])) != NULL;
    }
}

static bool lt_available(void) {
    pthread_once(&g_lt.once, load);
    return g_lt.ok;
}

void *lt_handle_new(void) {
    void *h = NULL;
    return lt_available() && lt.Create(&h) == 0 ? h : NULL;
}

/* ----- descriptors ----- */

static bool set_batch(void *layout, const lt_shape *s, int64_t stride) {
    int32_t count = (int32_t)s->batch;
    return s->batch <= 1 || (lt.LayoutSetAttribute(layout, LT_LAYOUT_BATCH_COUNT, &count, sizeof count) == 0 &&
                             lt.LayoutSetAttribute(layout, LT_LAYOUT_BATCH_STRIDE, &stride, sizeof stride) == 0);
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our B. */
static bool describe(lt_product *p, const lt_shape *s) {
    int type = s->bf16 ? LT_R_16BF : LT_R_32F, compute = s->tf32 ? LT_COMPUTE_32F_FAST_TF32 : LT_COMPUTE_32F;
    int32_t ta = s->tb, tb = s->ta;
    int64_t c_stride = s->M * s->N;
    return lt.DescCreate(&p->desc, compute, LT_R_32F) == 0 &&
           lt.DescSetAttribute(p->desc, LT_DESC_TRANSA, &ta, sizeof ta) == 0 &&
           lt.DescSetAttribute(p->desc, LT_DESC_TRANSB, &tb, sizeof tb) == 0 &&
           lt.LayoutCreate(&p->layout[0], type, (uint64_t)(s->tb ? s->K : s->N), (uint64_t)(s->tb ? s->N : s->K),
                           s->tb ? s->K : s->N) == 0 &&
           lt.LayoutCreate(&p->layout[1], type, (uint64_t)(s->ta ? s->M : s->K), (uint64_t)(s->ta ? s->K : s->M),
                           s->ta ? s->M : s->K) == 0 &&
           lt.LayoutCreate(&p->layout[2], s->c_bf16 ? LT_R_16BF : LT_R_32F, (uint64_t)s->N, (uint64_t)s->M, s->N) == 0 &&
           set_batch(p->layout[0], s, s->b_stride) && set_batch(p->layout[1], s, s->a_stride) &&
           set_batch(p->layout[2], s, c_stride);
}

void lt_product_free(lt_product *p) {
    if (p->desc) lt.DescDestroy(p->desc);
    for (int i = 0; i < 3; i++)
        if (p->layout[i]) lt.LayoutDestroy(p->layout[i]);
    memset(p, 0, sizeof *p);
}

int lt_run(const lt_product *p, const lt_device *d, const void *A, const void *B, void *C, bool early, CUdeviceptr ws) {
    const float one = 1, beta = p->addend ? 1 : 0;
    if (p->own) return own_run(p, d, A, B, C, early);
    return lt.Matmul(d->handle, p->desc, &one, B, p->layout[0], A, p->layout[1], &beta, p->addend ? p->addend : C, p->layout[2],
                     C, p->layout[2], &p->algo, (void *)(ws ? ws : d->workspace), ws ? p->workspace : d->workspace_bytes,
                     d->stream);
}

/* The heuristic's candidates for this shape, best guess first; how many (0: none). */
static int candidates(const lt_product *p, const lt_device *d, const lt_shape *s, lt_heuristic *out) {
    void *pref = NULL;
    uint64_t ws = d->workspace_bytes;
    int n = 0;
    /* A split reduction adds its parts in f32 (or not at all): the other schemes add them in C's
     * type, which for a bf16 C rounds every partial sum to bf16 */
    uint32_t reduction = LT_REDUCTION_COMPUTE_TYPE;
    bool ok = lt.PrefCreate(&pref) == 0 && lt.PrefSetAttribute(pref, LT_PREF_MAX_WORKSPACE, &ws, sizeof ws) == 0 &&
              (!s->c_bf16 || lt.PrefSetAttribute(pref, LT_PREF_REDUCTION_MASK, &reduction, sizeof reduction) == 0);
    for (int k = 0; k < 4 && ok; k++) {   /* A, B, C, D: what our addresses are aligned to */
        uint32_t a = s->align[k == 0 ? 1 : k == 1 ? 0 : 2];
        ok = lt.PrefSetAttribute(pref, LT_PREF_ALIGN_A + k, &a, sizeof a) == 0;
    }
    if (ok && lt.GetHeuristic(d->handle, p->desc, p->layout[0], p->layout[1], p->layout[2], p->layout[2], pref, LT_CANDIDATES,
                              out, &n) != 0)
        n = 0;
    if (pref) lt.PrefDestroy(pref);
    int kept = 0;
    for (int i = 0; i < n && ok; i++)
        if (out[i].state == 0 && out[i].workspace <= d->workspace_bytes) out[kept++] = out[i];
    return ok ? kept : 0;
}

/* Milliseconds per run of p as it stands (an algorithm, or our kernel), +inf if it fails. The runs
 * are captured into a graph and replayed, as the step's graph runs them: run eagerly, a small
 * product's time would be the host's, cuBLASLt's few microseconds of setup per call. */
static double time_one(const lt_product *p, const lt_device *d, const void *A, const void *B, void *C) {
    CUevent ev[2] = { NULL, NULL };
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    float ms = INFINITY;
    bool ran = lt_run(p, d, A, B, C, false, 0) == 0, ok = ran && cu.StreamBeginCapture(d->stream, CU_CAPTURE_THREAD_LOCAL) == 0;
    for (int r = 0; r < LT_TIMED_RUNS && ok; r++) ok = lt_run(p, d, A, B, C, d->early, 0) == 0;   /* early as in a step */
    if (ran) ok = cu.StreamEndCapture(d->stream, &graph) == 0 && ok;   /* ends a capture even when a run failed */
    ok = ok && cu.GraphInstantiate(&exec, graph, 0) == 0 && cu.EventCreate(&ev[0], 0) == 0 && cu.EventCreate(&ev[1], 0) == 0 &&
         cu.GraphLaunch(exec, d->stream) == 0 && cu.EventRecord(ev[0], d->stream) == 0 && cu.GraphLaunch(exec, d->stream) == 0 &&
         cu.EventRecord(ev[1], d->stream) == 0 && cu.EventSynchronize(ev[1]) == 0 && cu.EventElapsedTime(&ms, ev[0], ev[1]) == 0;
    for (int i = 0; i < 2; i++)
        if (ev[i]) cu.EventDestroy(ev[i]);
    if (exec) cu.GraphExecDestroy(exec);
    if (graph) cu.GraphDestroy(graph);
    return ok ? ms / LT_TIMED_RUNS : INFINITY;
}

static unsigned config(const lt_algo *a, int attr) {
    uint32_t v = 0;
    size_t written = 0;
    lt.ConfigGetAttribute(a, attr, &v, sizeof v, &written);
    return v;
}

/* The function of ours that own_warps names (OWN_X3: the tensor-core kernel), NULL where absent */
static CUfunction own_fn(const lt_ours *ours, int own_warps) {
    return own_warps == OWN_X3 ? ours->x3 : own_warps ? ours->small : NULL;
}

/* p to run on our kernel that own_warps names (0 or absent: cuBLASLt); whether it does */
static bool own_set(lt_product *p, const lt_ours *ours, int own_warps) {
    p->own = own_fn(ours, own_warps);
    p->own_warps = p->own ? own_warps : 0;
    p->own_sum = own_warps == OWN_X3 ? ours->x3_sum : NULL;
    return p->own != NULL;
}

/* own: the warps of our fastest kernel (OWN_X3: tensor cores; ours won: starred), own_ms its time */
static void report(const lt_shape *s, const lt_heuristic *h, const double *ms, int n, int best, double own_ms, int own, bool won) {
    fprintf(stderr, "tensorgrad: product [%lld x %lld] x [%lld x %lld]%s%s x%lld %s%s%s:", (long long)s->M, (long long)s->K,
            (long long)s->K, (long long)s->N, s->ta ? " (A^T)" : "", s->tb ? " (B^T)" : "", (long long)s->batch,
            s->bf16 ? "bf16" : s->tf32 ? "tf32" : "f32", s->c_bf16 ? " to bf16" : "",
            s->bias ? " + bias" : s->accumulate ? " + C" : "");
    for (int i = 0; i < n; i++)
        fprintf(stderr, " %s%.4f (algo %u tile %u split %u reduction %u)", i == best && !won ? "*" : "", ms ? ms[i] : NAN,
                config(&h[i].algo, LT_CONFIG_ID), config(&h[i].algo, LT_CONFIG_TILE), config(&h[i].algo, LT_CONFIG_SPLITK),
                config(&h[i].algo, LT_CONFIG_REDUCTION));
    if (!isnan(own_ms) && own == OWN_X3) fprintf(stderr, " %s%.4f (ours, 3 x tf32)", won ? "*" : "", own_ms);
    else if (!isnan(own_ms)) fprintf(stderr, " %s%.4f (ours, %d warps)", won ? "*" : "", own_ms, own);
    fprintf(stderr, " ms\n");
}

/* The candidate to keep: the fastest, but the heuristic's first when within 3% of it. */
static int choose(const double *ms, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (ms[i] < ms[best]) best = i;
    return ms[0] <= 1.03 * ms[best] ? 0 : best;
}

/* ----- remembered choices: this process's, and the kernel cache's ----- */

/* A choice remembered: its algorithm, and which kernel of ours where one won (`ours`: their functions). */
static bool memo_find(int device, const lt_shape *s, lt_product *p, const lt_ours *ours) {
    bool found = false;
    pthread_mutex_lock(&g_lt.mu);
    for (int i = 0; i < g_lt.n_memo && !found; i++)
        if (g_lt.memo[i].device == device && memcmp(&g_lt.memo[i].shape, s, sizeof *s) == 0) {
            p->algo = g_lt.memo[i].algo;
            p->workspace = g_lt.memo[i].workspace;
            own_set(p, ours, g_lt.memo[i].own_warps);
            found = true;
        }
    pthread_mutex_unlock(&g_lt.mu);
    return found;
}

static void memo_add(int device, const lt_shape *s, const lt_product *p) {
    pthread_mutex_lock(&g_lt.mu);
    if (g_lt.n_memo == g_lt.cap_memo) {   /* out of memory: not remembered, only chosen again */
        int cap = g_lt.cap_memo ? 2 * g_lt.cap_memo : 64;
        struct lt_memo *m = realloc(g_lt.memo, sizeof *m * (size_t)cap);
        if (m) {
            g_lt.memo = m;
            g_lt.cap_memo = cap;
        }
    }
    if (g_lt.n_memo < g_lt.cap_memo)
        g_lt.memo[g_lt.n_memo++] = (struct lt_memo){ device, *s, p->algo, p->workspace, p->own_warps };
    pthread_mutex_unlock(&g_lt.mu);
}

/* The kernel cache's file for this shape on this device and cuBLASLt version, chosen with or
 * without our kernels among the candidates (their source in the key: a changed kernel of ours is
 * timed again); false if none. */
static bool cache_path(const lt_device *d, const lt_shape *s, const lt_ours *ours, char *path, size_t len) {
    char dir[900], key[300];
    tg_error ignore;
    if (!cache_dir(dir, sizeof dir, &ignore)) return false;
    snprintf(key, sizeof key, "cublasLt %zu, parts added in f32, %s%s%s", lt.GetVersion(), d->name, ours->small ? " and ours" : "",
             ours->x3 ? " and 3 x tf32 in parts" : "");
    uint64_t h = cache_hash(cache_hash(1469598103934665603ull, key, strlen(key)), s, sizeof *s);
    if (ours->small) h = cache_hash(h, CUDA_PRODUCT_SOURCE, strlen(CUDA_PRODUCT_SOURCE));
    if (ours->x3) h = cache_hash(h, CUDA_PRODUCT3_SOURCE, strlen(CUDA_PRODUCT3_SOURCE));
    snprintf(path, len, "%s/%016llx.lt", dir, (unsigned long long)h);
    return true;
}

typedef struct { lt_algo algo; uint32_t own_warps; } lt_choice;   /* a choice as the kernel cache keeps it (0: cuBLASLt) */

static bool cached(lt_product *p, const lt_device *d, const char *path, const lt_ours *ours) {
    size_t len = 0;
    lt_choice *c = cache_read(path, &len);
    lt_heuristic check;
    bool ok = c && len == sizeof *c && (!c->own_warps || own_fn(ours, (int)c->own_warps)) &&
              lt.AlgoCheck(d->handle, p->desc, p->layout[0], p->layout[1], p->layout[2], p->layout[2], &c->algo, &check) == 0 &&
              check.workspace <= d->workspace_bytes;
    if (ok) {
        p->algo = c->algo;
        p->workspace = check.workspace;
        own_set(p, ours, (int)c->own_warps);
    }
    free(c);
    return ok;
}

/* ----- choosing ----- */

/* TG_CUDA_OWN_GEMM: 0 never our small-product kernel; 4, 8 or 16 it in blocks of that many warps
 * wherever it may run; else (-1) timed against cuBLASLt. */
static int own_mode(void) {
    const char *v = getenv("TG_CUDA_OWN_GEMM");
    int w = v ? atoi(v) : -1;
    return w == 0 || w == 4 || w == 8 || w == 16 ? w : -1;
}

/* TG_CUDA_X3: 0 never our tensor-core kernel; 1 it wherever it may run (before the small one);
 * else (-1) timed against cuBLASLt. */
static int x3_mode(void) {
    const char *v = getenv("TG_CUDA_X3");
    return v && (v[0] == '0' || v[0] == '1') ? v[0] - '0' : -1;
}

/* Our kernels, where the fastest beats the best of cuBLASLt's (ms) by 3%: the small one in each
 * block size, the tensor-core one. Returns the fastest (its own_warps), with its time in own_ms,
 * whether it won or not. */
static int own_try(lt_product *p, const lt_device *d, const lt_ours *ours, double ms, double *own_ms, const void *A,
                   const void *B, void *C) {
    int best = 0;
    *own_ms = INFINITY;
    for (size_t i = 0; i < sizeof OWN_CHOICES / sizeof *OWN_CHOICES; i++) {
        const int w = OWN_CHOICES[i];
        unsigned grid[3], block, shared;
        int parts;
        if (!own_launch(&p->shape, d, w, grid, &block, &shared, &parts) || !own_set(p, ours, w)) continue;
        double t = time_one(p, d, A, B, C);
        if (t < *own_ms) {
            *own_ms = t;
            best = w;
        }
    }
    bool won = best && *own_ms < 0.97 * ms;
    own_set(p, ours, won ? best : 0);
    return best;
}

/* The bias epilogue (s->bias): values of C's type (bf16, or f32 at f32 and tf32). */
static bool describe_bias(lt_product *p, const lt_shape *s, const void *bias) {
    int32_t epilogue = LT_EPILOGUE_BIAS, type = s->c_bf16 ? LT_R_16BF : LT_R_32F;
    return !s->bias || (lt.DescSetAttribute(p->desc, LT_DESC_EPILOGUE, &epilogue, sizeof epilogue) == 0 &&
                        lt.DescSetAttribute(p->desc, LT_DESC_BIAS_POINTER, &bias, sizeof bias) == 0 &&
                        lt.DescSetAttribute(p->desc, LT_DESC_BIAS_TYPE, &type, sizeof type) == 0);
}

bool lt_product_init(lt_product *p, const lt_device *d, const lt_shape *s, lt_ours ours, const void *A, const void *B,
                     void *C, const void *addend) {
    memset(p, 0, sizeof *p);
    p->shape = *s;
    unsigned grid[3], block, shared;
    int mode = own_mode(), x3 = x3_mode(), parts;
    if (mode == 0 || !own_launch(s, d, mode > 0 ? mode : OWN_CHOICES[0], grid, &block, &shared, &parts)) ours.small = NULL;
    if (x3 == 0 || !ours.x3_sum || !own_launch(s, d, OWN_X3, grid, &block, &shared, &parts)) ours.x3 = NULL;
    if (s->accumulate) ours.small = ours.x3 = NULL;   /* ours add no matrix; */
    if (s->bias) ours.small = NULL;                     /* the tensor-core one adds a bias */
    p->addend = s->accumulate ? addend : NULL;
    p->bias = s->bias ? addend : NULL;
    if (!lt_available() || !d->handle || !describe(p, s) || !describe_bias(p, s, addend)) goto fail;
    const int forced = ours.x3 && x3 == 1 ? OWN_X3 : ours.small && mode > 0 ? mode : 0;
    if (forced) {   /* not remembered, so that a timed choice is not displaced */
        own_set(p, &ours, forced);
        return true;
    }
    if (memo_find(d->ordinal, s, p, &ours)) return true;
    char path[1000];
    const char *tune = getenv("TG_CUDA_TUNE");
    bool timed = !(tune && tune[0] == '0'), verbose = tune && strcmp(tune, "verbose") == 0;
    bool on_disk = timed && cache_path(d, s, &ours, path, sizeof path);
    if (on_disk && cached(p, d, path, &ours)) {
        memo_add(d->ordinal, s, p);
        return true;
    }
    lt_heuristic h[LT_CANDIDATES];
    int n = candidates(p, d, s, h), best = 0;
    if (n == 0) goto fail;
    double ms[LT_CANDIDATES] = { 0 }, own_ms = NAN;
    int own_best = 0;
    const bool any_ours = ours.small || ours.x3, compare = timed && (n > 1 || any_ours);
    for (int i = 0; i < n && compare; i++) {
        p->algo = h[i].algo;
        ms[i] = time_one(p, d, A, B, C);
    }
    if (compare) best = choose(ms, n);
    if (compare && isinf(ms[best])) goto fail;   /* none ran */
    if (any_ours && compare) own_best = own_try(p, d, &ours, ms[best], &own_ms, A, B, C);
    if (verbose) report(s, h, compare ? ms : NULL, n, best, own_ms, own_best, p->own != NULL);
    p->algo = h[best].algo;
    p->workspace = h[best].workspace;
    if (timed) memo_add(d->ordinal, s, p);
    if (on_disk) {
        tg_error ignore;   /* a cache that cannot be written only costs time */
        lt_choice c = { p->algo, (uint32_t)p->own_warps };
        cache_write(path, &c, sizeof c, &ignore);
    }
    return true;
fail:
    lt_product_free(p);
    return false;
}
