/* The x86-64 register tiles of the packed product (cpu_gemm.c holds the driver and the packing
 * they share): AVX-512 (8 rows x 32 columns: sixteen 16-float accumulators) and AVX2 + FMA (6 x
 * 16: twelve 8-float accumulators, the other four of the sixteen ymm registers for the two B
 * vectors and the broadcast A value). Each tile folds in what a product adds to: C itself when
 * accumulating, else a bias per row or per column. Each set comes with the row helpers of the
 * skinny products (axpy, dot) and an im2col segment reader. The functions carry target
 * attributes, so the library builds for baseline x86-64 and these run only where cpu_isa.c has
 * found the features. */
#include "cpu/cpu_kernels.h"

#ifdef CPU_X86
#include <immintrin.h>
#include <math.h>

/* A tile reads (or write-allocates) C only after its k loop, and the rows of a large C, a row
 * stride apart, are rarely in cache then: asking for them before the loop hides that wait behind
 * the FMAs (65% -> 80% of the AVX2 peak for n = 2048 on Zen 3). Prefetches never fault, so rows
 * past the edge of C are harmless. */
static inline __attribute__((always_inline)) void prefetch_tile(const float *C, int64_t ldc, const int rows, const int cols) {
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm_prefetch((const char *)(C + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + r * ldc + cols - 1), _MM_HINT_T0);
        if (cols > 16) _mm_prefetch((const char *)(C + r * ldc + 16), _MM_HINT_T0);
    }
}

/* ----- AVX-512: 8 x 32 ----- */

/* im2col_segment with sixteen-lane loads (expand-loads, so that nothing outside the image is
 * addressed) for stride 1; the scalar one otherwise. */
TARGET_AVX512 static void segment_avx512(const im2col_view *v, int64_t r, int64_t j0, int64_t n, float *dst) {
    if (v->s != 1) {
        im2col_segment(v, r, j0, n, dst);
        return;
    }
    int64_t c = r / (v->kh * v->kw), i = r / v->kw % v->kh, jj = r % v->kw;
    const float *plane = v->x + c * v->H * v->W;
    int64_t j = j0, end = j0 + n, oy = j0 / v->wo, ox = j0 % v->wo;
    while (j < end) {
        int64_t len = v->wo - ox < end - j ? v->wo - ox : end - j, y = oy - v->pad + i, x0 = ox - v->pad + jj;
        float *d = dst + (j - j0);
        for (int64_t q = 0; q < len; q += 16) {
            int64_t cnt = len - q < 16 ? len - q : 16, xq = x0 + q;
            int64_t lo = xq < 0 ? -xq : 0, hi = v->W - xq < cnt ? v->W - xq : cnt;
            __m512 val = _mm512_setzero_ps();
            if (y >= 0 && y < v->H && hi > lo)
                val = _mm512_maskz_expandloadu_ps((__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1)), plane + y * v->W + xq + lo);
            _mm512_mask_storeu_ps(d + q, (__mmask16)((1u << cnt) - 1), val);
        }
        j += len;
        ox = 0;
        oy++;
    }
}

/* The tile's accumulators added to what the tile adds to: C itself (acc), else a bias per row
 * (brow) or per column (bcol); then stored, masked past nr columns and mr rows. */
TARGET_AVX512 static inline __attribute__((always_inline)) void tile_avx512_store(__m512 *c0, __m512 *c1, float *C, int64_t ldc,
                                                                                int64_t mr, int64_t nr, int acc,
                                                                                const float *brow, const float *bcol) {
    __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
    __mmask16 m1 = (__mmask16)(nr <= 16 ? 0 : nr >= 32 ? 0xffff : (1u << (nr - 16)) - 1);
    __m512 bc0 = _mm512_setzero_ps(), bc1 = _mm512_setzero_ps();
    if (!acc && bcol) {
        bc0 = _mm512_maskz_loadu_ps(m0, bcol);
        bc1 = _mm512_maskz_loadu_ps(m1, bcol + 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
        if (r >= mr) break;
        float *cr = C + r * ldc;
        if (acc) {
            c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, cr));
            c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, cr + 16));
        } else if (brow) {
            c0[r] = _mm512_add_ps(c0[r], _mm512_set1_ps(brow[r]));
            c1[r] = _mm512_add_ps(c1[r], _mm512_set1_ps(brow[r]));
        } else {
            c0[r] = _mm512_add_ps(c0[r], bc0);
            c1[r] = _mm512_add_ps(c1[r], bc1);
        }
        _mm512_mask_storeu_ps(cr, m0, c0[r]);
        _mm512_mask_storeu_ps(cr + 16, m1, c1[r]);
    }
}

TARGET_AVX512 static void tile_avx512(int64_t kc, const float *ap, const float *bp, float *C, int64_t ldc, int64_t mr,
                                      int64_t nr, int acc, const float *brow, const float *bcol) {
    /* Every loop over the tile's rows is unrolled with constant bounds (rows past mr are guarded,
     * not skipped by a variable bound), so the sixteen accumulators stay in registers. */
    __m512 c0[8], c1[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
    }
    prefetch_tile(C, ldc, 8, 32);
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            __m512 a = _mm512_set1_ps(ap[r]);
            c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
        }
        ap += 8;
        bp += 32;
    }
    tile_avx512_store(c0, c1, C, ldc, mr, nr, acc, brow, bcol);
}

TARGET_AVX512 static void axpy_avx512(float *y, const float *y0, float c0, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a), vc = _mm512_set1_ps(c0);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = (__mmask16)(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
        __m512 base = y0 ? _mm512_maskz_loadu_ps(m, y0 + j) : vc;
        _mm512_mask_storeu_ps(y + j, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + j), base));
    }
}

TARGET_AVX512 static float dot_avx512(const float *a, const float *b, int64_t n) {
    __m512 s = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), s);
    }
    return _mm512_reduce_add_ps(s);
}

/* Blocks: an A block of 128 x 256 (128 KB) stays in L2, a B panel of 256 x 32 (32 KB) in L1. */
const gemm_kernel gemm_kernel_avx512 = { 8, 32, 256, 128, 512, tile_avx512, segment_avx512, axpy_avx512, dot_avx512, NULL };

/* ----- AVX512-BF16: 8 x 32, bf16 operands ----- */

/* Packed panels of f32 (panel after panel, kc x w each, depth-major: row k holds the w values of
 * depth k) rounded to bf16 to nearest even, in place, depth paired: row p of a panel becomes w
 * 32-bit words, depth 2p in the low half and 2p + 1 in the high half (0 past kc), the operand
 * layout of vdpbf16ps. Row p is written over f32 row p once rows 2p and 2p + 1 have been read,
 * so in place is safe. */
TARGET_AVX512_BF16 static void pair_panels(float *panels, int64_t kc, int64_t n, int w) {
    const __mmask16 m = (__mmask16)(w >= 16 ? 0xffff : (1u << w) - 1);
    for (float *p = panels; p < panels + n * kc; p += w * kc)
        for (int64_t k = 0; 2 * k < kc; k++)
            for (int c = 0; c < w; c += 16) {
                __m512 lo = _mm512_maskz_loadu_ps(m, p + 2 * k * w + c);
                __m512 hi = 2 * k + 1 < kc ? _mm512_maskz_loadu_ps(m, p + (2 * k + 1) * w + c) : _mm512_setzero_ps();
                __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(lo));
                __m512i h = _mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(hi)), 16);
                _mm512_mask_storeu_epi32(p + k * w + c, m, _mm512_or_si512(l, h));
            }
}

/* tile_avx512 on paired bf16 panels: each vdpbf16ps adds two depths' products (exact in f32) to
 * an f32 accumulator, twice the multiply-adds of an FMA per instruction. */
TARGET_AVX512_BF16 static void tile_avx512_bf16(int64_t kc, const float *ap, const float *bp, float *C, int64_t ldc,
                                                int64_t mr, int64_t nr, int acc, const float *brow, const float *bcol) {
    __m512 c0[8], c1[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
    }
    prefetch_tile(C, ldc, 8, 32);
    for (int64_t k = 0; 2 * k < kc; k++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_ps(bp), b1 = (__m512bh)_mm512_loadu_ps(bp + 16);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            __m512bh a = (__m512bh)_mm512_set1_ps(ap[r]);   /* one pair, its bits as they are */
            c0[r] = _mm512_dpbf16_ps(c0[r], a, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], a, b1);
        }
        ap += 8;
        bp += 32;
    }
    tile_avx512_store(c0, c1, C, ldc, mr, nr, acc, brow, bcol);
}

const gemm_kernel gemm_kernel_avx512_bf16 = { 8, 32, 512, 128, 512, tile_avx512_bf16, segment_avx512,
                                              axpy_avx512, dot_avx512, pair_panels };

/* ----- AVX2 + FMA: 6 x 16 ----- */

/* The epilogue of a tile at the right edge of C (nr < 16), from the accumulators stored in t:
 * one element at a time (a small share of the tiles, and no masked stores, which are slow on
 * AMD). */
static void tile_avx2_edge(float t[6][16], float *C, int64_t ldc, int64_t mr, int64_t nr, int acc, const float *brow,
                           const float *bcol) {
    for (int64_t r = 0; r < mr; r++)
        for (int64_t c = 0; c < nr; c++)
            C[r * ldc + c] = t[r][c] + (acc ? C[r * ldc + c] : brow ? brow[r] : bcol ? bcol[c] : 0.0f);
}

TARGET_AVX2 static void tile_avx2(int64_t kc, const float *ap, const float *bp, float *C, int64_t ldc, int64_t mr, int64_t nr,
                                  int acc, const float *brow, const float *bcol) {
    /* As in tile_avx512: constant-bound, unrolled row loops keep the twelve accumulators in
     * registers. */
    __m256 c0[6], c1[6];
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
        c0[r] = _mm256_setzero_ps();
        c1[r] = _mm256_setzero_ps();
    }
    prefetch_tile(C, ldc, 6, 16);
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            __m256 a = _mm256_broadcast_ss(ap + r);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
        ap += 6;
        bp += 16;
    }
    if (nr < 16) {   /* (the accumulators' addresses are never taken: they stay in registers) */
        float t[6][16];
#pragma GCC unroll 6
        for (int r = 0; r < 6; r++) {
            _mm256_storeu_ps(t[r], c0[r]);
            _mm256_storeu_ps(t[r] + 8, c1[r]);
        }
        tile_avx2_edge(t, C, ldc, mr, nr, acc, brow, bcol);
        return;
    }
    __m256 bc0 = _mm256_setzero_ps(), bc1 = _mm256_setzero_ps();
    if (!acc && bcol) {
        bc0 = _mm256_loadu_ps(bcol);
        bc1 = _mm256_loadu_ps(bcol + 8);
    }
#pragma GCC unroll 6
    for (int r = 0; r < 6; r++) {
        if (r >= mr) break;
        float *cr = C + r * ldc;
        if (acc) {
            c0[r] = _mm256_add_ps(c0[r], _mm256_loadu_ps(cr));
            c1[r] = _mm256_add_ps(c1[r], _mm256_loadu_ps(cr + 8));
        } else if (brow) {
            c0[r] = _mm256_add_ps(c0[r], _mm256_set1_ps(brow[r]));
            c1[r] = _mm256_add_ps(c1[r], _mm256_set1_ps(brow[r]));
        } else {
            c0[r] = _mm256_add_ps(c0[r], bc0);
            c1[r] = _mm256_add_ps(c1[r], bc1);
        }
        _mm256_storeu_ps(cr, c0[r]);
        _mm256_storeu_ps(cr + 8, c1[r]);
    }
}

TARGET_AVX2 static void axpy_avx2(float *y, const float *y0, float c0, float a, const float *x, int64_t n) {
    __m256 va = _mm256_set1_ps(a), vc = _mm256_set1_ps(c0);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 base = y0 ? _mm256_loadu_ps(y0 + j) : vc;
        _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), base));
    }
    for (; j < n; j++) y[j] = fmaf(a, x[j], y0 ? y0[j] : c0);
}

TARGET_AVX2 static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), _mm256_loadu_ps(b + k + 8), s1);
    }
    for (; k + 8 <= n; k += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), s0);
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float sum = _mm_cvtss_f32(h);
    for (; k < n; k++) sum = fmaf(a[k], b[k], sum);
    return sum;
}

/* Blocks: an A block of 144 x 256 (144 KB) in L2 (Zen 2/3 have 512 KB), a B panel of 256 x 16
 * (16 KB) in L1. */
const gemm_kernel gemm_kernel_avx2 = { 6, 16, 256, 144, 512, tile_avx2, im2col_segment, axpy_avx2, dot_avx2, NULL };
#endif
