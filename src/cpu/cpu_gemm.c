/* Matrix products of the compiled CPU backend (the library kernel TGK_MATMUL): C (+)= op(A) op(B),
 * row-major with leading dimensions, with what the schedule folds into a product: a bias add and
 * a relu after it, a sum over a batch (a weight gradient), im2col packed straight from the image
 * (a convolution's cols are never materialized) and col2im (a convolution's input gradient).
 *
 * On x86-64 with AVX2 + FMA or AVX-512, a packed, register-blocked product of our own, in the
 * structure of BLIS: B is packed in blocks of KC x NC, A in blocks of MC x KC, and an MR x NR
 * register tile multiplies one panel of each. The driver and the packing here are the same for
 * both instruction sets; the tile, its sizes and a few row helpers come from cpu_gemm_x86.c, by
 * the run's ISA (cpu_isa.c). Debian's OpenBLAS 0.3.21 reaches about 95 GFLOP/s per core on Zen
 * 4/5 where our AVX-512 tile does 180-210, and runs single-threaded per call here (our threads
 * split the products), so it is only the portable path (no AVX2, or not x86-64).
 *
 * One call of gemm runs on the calling thread; k_matmul spreads the work over OpenMP threads. */
#include "cpu/cpu_kernels.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* Products of fewer multiply-adds than this run on one thread: some 12 us on one core, below
 * which a second thread measurably does not pay. (gemm_bench on a 2-core Ice Lake VM, AVX2 path:
 * square n = 64, this size, 1.1-1.8x on 2 threads; n = 80-128, 1.6-1.9x. It was 2^21, which
 * kept sin_mlp's 2^20-multiply-add products on one thread.) */
#define PARALLEL_MACS (1 << 18)

void im2col_segment(const im2col_view *v, int64_t r, int64_t j0, int64_t n, float *dst) {
    int64_t c = r / (v->kh * v->kw), i = r / v->kw % v->kh, jj = r % v->kw;
    const float *plane = v->x + c * v->H * v->W;
    int64_t j = j0, end = j0 + n;
    while (j < end) {
        int64_t oy = j / v->wo, ox = j % v->wo, len = v->wo - ox < end - j ? v->wo - ox : end - j;
        int64_t y = oy * v->s - v->pad + i;
        float *d = dst + (j - j0);
        if (y < 0 || y >= v->H) {
            memset(d, 0, sizeof(float) * (size_t)len);
        } else if (v->s == 1) {
            int64_t x0 = ox - v->pad + jj;   /* input column of d[0] */
            int64_t a = x0 < 0 ? -x0 : 0, b = v->W - x0 < len ? v->W - x0 : len;
            if (b < a) b = a;
            for (int64_t q = 0; q < a; q++) d[q] = 0.0f;
            if (b > a) memcpy(d + a, plane + y * v->W + x0 + a, sizeof(float) * (size_t)(b - a));
            for (int64_t q = b; q < len; q++) d[q] = 0.0f;
        } else {
            for (int64_t q = 0; q < len; q++) {
                int64_t xx = (ox + q) * v->s - v->pad + jj;
                d[q] = xx >= 0 && xx < v->W ? plane[y * v->W + xx] : 0.0f;
            }
        }
        j += len;
    }
}

/* Rows [p0, p0 + kc) of the cols matrix at columns [j, j + n) into dst (row k at dst + k * ld):
 * what kc calls of im2col_segment give, with the columns' output positions found once and the
 * rows' (channel, kernel row, kernel column) stepped rather than divided out per row. A
 * convolution's packing calls this for every panel of NR columns: per-call divisions and
 * memcpy of 16 floats were a tenth of cifar_cnn's step. */
static inline __attribute__((always_inline)) void im2col_rows(const im2col_view *v, int64_t p0, int64_t kc, int64_t j,
                                                              int64_t n, float *dst, int64_t ld) {
    int64_t c = p0 / (v->kh * v->kw), i = p0 / v->kw % v->kh, jj = p0 % v->kw, oy0 = j / v->wo, ox0 = j % v->wo;
    for (int64_t k = 0; k < kc; k++, dst += ld) {
        const float *plane = v->x + c * v->H * v->W;
        int64_t oy = oy0, ox = ox0;
        for (int64_t q0 = 0; q0 < n; q0 += v->wo - ox, ox = 0, oy++) {   /* one piece per output row */
            int64_t len = v->wo - ox < n - q0 ? v->wo - ox : n - q0, y = oy * v->s - v->pad + i;
            float *d = dst + q0;
            if (y < 0 || y >= v->H) {
                for (int64_t q = 0; q < len; q++) d[q] = 0.0f;
                continue;
            }
            const float *row = plane + y * v->W;
            int64_t x0 = ox * v->s - v->pad + jj;
            if (v->s == 1) {
                int64_t a = x0 < 0 ? -x0 : 0, b = v->W - x0 < len ? v->W - x0 : len;
                if (b < a) b = a;
                for (int64_t q = 0; q < a; q++) d[q] = 0.0f;
                for (int64_t q = a; q < b; q++) d[q] = row[x0 + q];
                for (int64_t q = b; q < len; q++) d[q] = 0.0f;
            } else {
                for (int64_t q = 0; q < len; q++) {
                    int64_t xx = x0 + q * v->s;
                    d[q] = xx >= 0 && xx < v->W ? row[xx] : 0.0f;
                }
            }
        }
        if (++jj == v->kw) {
            jj = 0;
            if (++i == v->kh) {
                i = 0;
                c++;
            }
        }
    }
}

static im2col_view im2col_of(const float *x, const int64_t *g) {
    im2col_view v = { x, g[0], g[1], g[2], g[3], g[4], g[5], g[6], 0, 0 };
    v.ho = (v.H + 2 * v.pad - v.kh) / v.s + 1;
    v.wo = (v.W + 2 * v.pad - v.kw) / v.s + 1;
    return v;
}

/* The cols matrix of an im2col view, materialized (for OpenBLAS, which reads memory). */
static float *im2col_materialize(const im2col_view *v) {
    int64_t rows = v->C * v->kh * v->kw, cols = v->ho * v->wo;
    float *m = tg_alloc_aligned64(sizeof(float) * (size_t)(rows * cols));
    if (!m) kernel_failed();
    if (m)
        for (int64_t r = 0; r < rows; r++) im2col_segment(v, r, 0, cols, m + r * cols);
    return m;
}

/* The packed product's kernel for the run's ISA, or NULL (the portable path). */
static const gemm_kernel *gemm_kernel_now(void) {
#ifdef CPU_X86
    switch (cpu_kernels_isa()) {
    case CPU_ISA_AVX512: return &gemm_kernel_avx512;
    case CPU_ISA_AVX2: return &gemm_kernel_avx2;
    default: return NULL;
    }
#else
    return NULL;
#endif
}

#ifdef CPU_X86
#include <immintrin.h>

/* ----- packing (AVX2: both vector paths have it) ----- */

/* Eight floats from each of eight rows (rows[r] + k) into eight rows of dst, stride apart,
 * transposed: dst[i * stride + r] = rows[r][k + i]. */
TARGET_AVX2 static inline void transpose8(const float *const *rows, int64_t k, float *dst, int64_t stride) {
    __m256 r0 = _mm256_loadu_ps(rows[0] + k), r1 = _mm256_loadu_ps(rows[1] + k);
    __m256 r2 = _mm256_loadu_ps(rows[2] + k), r3 = _mm256_loadu_ps(rows[3] + k);
    __m256 r4 = _mm256_loadu_ps(rows[4] + k), r5 = _mm256_loadu_ps(rows[5] + k);
    __m256 r6 = _mm256_loadu_ps(rows[6] + k), r7 = _mm256_loadu_ps(rows[7] + k);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst + 0 * stride, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + 1 * stride, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * stride, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * stride, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * stride, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * stride, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * stride, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * stride, _mm256_permute2f128_ps(u3, u7, 0x31));
}

/* dst[0..n) = src[0..n): eight floats at a time. Packing copies pieces of a few to a few dozen
 * floats, too short for a call of memcpy to pay. */
TARGET_AVX2 static inline void copy_floats(float *dst, const float *src, int64_t n) {
    int64_t q = 0;
    for (; q + 8 <= n; q += 8) _mm256_storeu_ps(dst + q, _mm256_loadu_ps(src + q));
    for (; q < n; q++) dst[q] = src[q];
}

/* The view v read through a copy of its image with the zero border stored (pad 0, H + 2 pad rows
 * of W + 2 pad), in this thread's image buffer, so that packing never tests a coordinate against
 * the image's edges: at stride 1 every packed row is then a few plain copies (im2col_rows_s1,
 * im2col_cols_s1). The copy is a fraction of the cols it stands for (kh kw / s^2 times the
 * image's size). Without memory for it, v as it was (the packing handles any view). */
TARGET_AVX2 static im2col_view padded_view(im2col_view v) {
    if (v.pad == 0) return v;
    int64_t Hp = v.H + 2 * v.pad, Wp = v.W + 2 * v.pad;
    float *dst = kernel_image((size_t)(v.C * Hp * Wp));
    if (!dst) return v;
    for (int64_t c = 0; c < v.C; c++) {
        float *plane = dst + c * Hp * Wp;
        memset(plane, 0, sizeof(float) * (size_t)(v.pad * Wp + v.pad));   /* top rows, left of the first */
        for (int64_t y = 0; y < v.H; y++) {
            float *row = plane + (y + v.pad) * Wp + v.pad;
            copy_floats(row, v.x + (c * v.H + y) * v.W, v.W);
            for (int64_t q = v.W; q < v.W + 2 * v.pad; q++) row[q] = 0.0f;   /* right of this row, left of the next */
        }
        memset(plane + (v.H + v.pad) * Wp + v.pad, 0, sizeof(float) * (size_t)(v.pad * Wp - v.pad));   /* bottom rows */
    }
    v.x = dst;
    v.H = Hp;
    v.W = Wp;
    v.pad = 0;
    return v;
}

/* im2col_rows for a stride-1 view without padding (padded_view's): the n columns are a few pieces
 * along output rows, each a plain copy from the tap's plane, at offsets every row shares. A panel
 * within one output row (the usual case) is one copy of NR floats, a constant size. */
TARGET_AVX2 static inline __attribute__((always_inline)) void im2col_rows_s1(const im2col_view *v, int64_t p0, int64_t kc,
                                                                           int64_t j, int64_t n, float *dst, const int NR) {
    int64_t off[GEMM_NR_MAX], len[GEMM_NR_MAX], np = 0;   /* piece p: len[p] columns from offset off[p] */
    for (int64_t q = 0, oy = j / v->wo, ox = j % v->wo; q < n; q += len[np++], ox = 0, oy++) {
        len[np] = v->wo - ox < n - q ? v->wo - ox : n - q;
        off[np] = oy * v->W + ox;
    }
    int64_t c = p0 / (v->kh * v->kw), i = p0 / v->kw % v->kh, jj = p0 % v->kw;
    for (int64_t k = 0; k < kc; k++, dst += NR) {
        const float *tap = v->x + (c * v->H + i) * v->W + jj;   /* cols row (c, i, jj) at output (0, 0) */
        if (np == 1 && n == NR) {
            memcpy(dst, tap + off[0], sizeof(float) * NR);
        } else {
            for (int64_t p = 0, q = 0; p < np; q += len[p++]) copy_floats(dst + q, tap + off[p], len[p]);
        }
        if (++jj == v->kw) {
            jj = 0;
            if (++i == v->kh) {
                i = 0;
                c++;
            }
        }
    }
}

/* A row of zeros as long as any piece a packing reads (at most a depth block). */
static const float ZEROS[GEMM_KC_MAX];

/* The transposed packing of a stride-1 view without padding: depth [p0, p0 + kc) (output
 * positions) x columns [j, j + nr) (cols rows, taps) into dst[k * NR + c], columns past nr zero
 * (a weight gradient's op(B) = cols^T). Along an output row a tap's values are contiguous, so
 * eight taps' rows transpose eight positions at a time (transpose8), from the image itself. */
TARGET_AVX2 static inline __attribute__((always_inline)) void im2col_cols_s1(const im2col_view *v, int64_t p0, int64_t kc,
                                                                           int64_t j, int64_t nr, float *dst, const int NR) {
    const float *tap[GEMM_NR_MAX];   /* cols row j + c at output (0, 0) */
    for (int64_t c = 0, r = j; c < nr; c++, r++)
        tap[c] = v->x + (r / (v->kh * v->kw) * v->H + r / v->kw % v->kh) * v->W + r % v->kw;
    for (int64_t k = 0, oy = p0 / v->wo, ox = p0 % v->wo; k < kc; ox = 0, oy++) {   /* one piece per output row */
        int64_t len = v->wo - ox < kc - k ? v->wo - ox : kc - k, off = oy * v->W + ox;
        float *d = dst + k * NR;
        for (int c = 0; c < NR; c += 8) {   /* (NR is a multiple of 8; columns past nr read zeros) */
            const float *rows[8];
            for (int r = 0; r < 8; r++) rows[r] = c + r < nr ? tap[c + r] + off : ZEROS;
            int64_t t = 0;
            for (; t + 8 <= len; t += 8) transpose8(rows, t, d + t * NR + c, NR);
            for (; t < len; t++)
                for (int r = 0; r < 8; r++) d[t * NR + c + r] = rows[r][t];
        }
        k += len;
    }
}

/* Pack rows [i0, i0 + mc) x depth [p0, p0 + kc) of op(A) into MR-row panels, k-major within a
 * panel (ap[panel][k][r]), rows past mc zero. MR is a constant at each (inlined) call. */
TARGET_AVX2 static inline __attribute__((always_inline)) void pack_a_mr(int ta, const float *A, int64_t lda, int64_t i0,
                                                                      int64_t mc, int64_t p0, int64_t kc, float *ap,
                                                                      const int MR) {
    for (int64_t ir = 0; ir < mc; ir += MR) {
        int64_t mr = mc - ir < MR ? mc - ir : MR;
        float *dst = ap + ir * kc;
        if (ta) {   /* op(A)[i, k] = A[k * lda + i]: MR contiguous floats per k */
            const float *src = A + p0 * lda + i0 + ir;
            if (mr == MR) {   /* (memcpy of a constant size: inline vector moves, where GCC's -O2 copies
                                  * the floats one by one) */
                for (int64_t k = 0; k < kc; k++) memcpy(dst + k * MR, src + k * lda, sizeof(float) * MR);
            } else {
                for (int64_t k = 0; k < kc; k++)
                    for (int r = 0; r < MR; r++) dst[k * MR + r] = r < mr ? src[k * lda + r] : 0.0f;
            }
            continue;
        }
        const float *rows[8];   /* eight row pointers for transpose8; past MR, repeats of the last */
        for (int r = 0; r < 8; r++) rows[r] = A + (i0 + ir + (r < mr ? r : mr - 1)) * lda + p0;
        int64_t k = 0;
        if (mr == MR && MR == 8) {
            for (; k + 8 <= kc; k += 8) transpose8(rows, k, dst + k * MR, MR);
        } else if (mr == MR) {
            /* Rows of MR < 8 floats: each transposed row stored whole, its last 8 - MR floats
             * landing on the next row, which the next store (or, after the last row, the next
             * block or the loop below) writes over; so the last block goes through t instead. */
            for (; k + 8 < kc; k += 8) transpose8(rows, k, dst + k * MR, MR);
            float t[64];
            for (; k + 8 <= kc; k += 8) {
                transpose8(rows, k, t, 8);
                for (int i = 0; i < 8; i++)
                    for (int r = 0; r < MR; r++) dst[(k + i) * MR + r] = t[i * 8 + r];
            }
        }
        for (; k < kc; k++)
            for (int r = 0; r < MR; r++) dst[k * MR + r] = r < mr ? rows[r][k] : 0.0f;
    }
}

TARGET_AVX2 static void pack_b(const gemm_kernel *gk, int tb, const float *B, int64_t ldb, const im2col_view *v, int64_t p0,
                               int64_t kc, int64_t j0, int64_t nc, float *bp);

/* Pack depth [p0, p0 + kc) x columns [j0, j0 + nc) of op(B) (or of the cols of view v) into
 * NR-column panels (bp[panel][k][c]), columns past nc zero. NR is a constant at each call. */
TARGET_AVX2 static inline __attribute__((always_inline)) void pack_b_nr(const gemm_kernel *gk, int tb, const float *B,
                                                                      int64_t ldb, const im2col_view *v, int64_t p0,
                                                                      int64_t kc, int64_t j0, int64_t nc, float *bp,
                                                                      const int NR) {
    if (!v && !tb) {   /* op(B) = B: row by row across the panels, so that B is read in order */
        const float *src = B + p0 * ldb + j0;
        for (int64_t k = 0; k < kc; k++, src += ldb) {
            int64_t jr = 0;
            for (; jr + NR <= nc; jr += NR) memcpy(bp + jr * kc + k * NR, src + jr, sizeof(float) * NR);
            for (int64_t c = 0; jr < nc && c < NR; c++) bp[jr * kc + k * NR + c] = jr + c < nc ? src[jr + c] : 0.0f;
        }
        return;
    }
    for (int64_t jr = 0; jr < nc; jr += NR) {
        int64_t nr = nc - jr < NR ? nc - jr : NR;
        float *dst = bp + jr * kc;
        if (v && !tb) {   /* op(B) = cols: rows p0 .. of cols, columns j0 + jr .. */
            if (v->pad == 0 && v->s == 1) im2col_rows_s1(v, p0, kc, j0 + jr, nr, dst, NR);
            else im2col_rows(v, p0, kc, j0 + jr, nr, dst, NR);
            for (int64_t k = 0; nr < NR && k < kc; k++)
                for (int64_t c = nr; c < NR; c++) dst[k * NR + c] = 0.0f;
        } else if (v && v->pad == 0 && v->s == 1) {   /* op(B) = cols^T, from the image */
            im2col_cols_s1(v, p0, kc, j0 + jr, nr, dst, NR);
        } else if (v) {   /* op(B) = cols^T: rows j0 + jr .. of cols, depth p0 .., then the transposing pack */
            float rows[GEMM_NR_MAX * GEMM_KC_MAX];
            for (int64_t c = 0; c < nr; c++) gk->segment(v, j0 + jr + c, p0, kc, rows + c * kc);
            pack_b(gk, 1, rows, kc, NULL, 0, kc, 0, nr, dst);
        } else {   /* op(B)[k, j] = B[j * ldb + k]: eight columns at a time through transpose8 */
            int64_t c = 0;
            for (; c + 8 <= nr; c += 8) {
                const float *s0 = B + (j0 + jr + c) * ldb + p0, *cols[8];
                for (int r = 0; r < 8; r++) cols[r] = s0 + r * ldb;
                int64_t k = 0;
                for (; k + 8 <= kc; k += 8) transpose8(cols, k, dst + k * NR + c, NR);
                for (; k < kc; k++)
                    for (int64_t cc = 0; cc < 8; cc++) dst[k * NR + c + cc] = s0[cc * ldb + k];
            }
            for (; c < NR; c++) {
                const float *src = B + (j0 + jr + c) * ldb + p0;
                for (int64_t k = 0; k < kc; k++) dst[k * NR + c] = c < nr ? src[k] : 0.0f;
            }
        }
    }
}

/* The packing routines for the kernel's tile sizes (8 x 32 for AVX-512, 6 x 16 for AVX2). */
TARGET_AVX2 static void pack_a(const gemm_kernel *gk, int ta, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
                               int64_t kc, float *ap) {
    if (gk->mr == 8) pack_a_mr(ta, A, lda, i0, mc, p0, kc, ap, 8);
    else pack_a_mr(ta, A, lda, i0, mc, p0, kc, ap, 6);
}

TARGET_AVX2 static void pack_b(const gemm_kernel *gk, int tb, const float *B, int64_t ldb, const im2col_view *v, int64_t p0,
                               int64_t kc, int64_t j0, int64_t nc, float *bp) {
    if (gk->nr == 32) pack_b_nr(gk, tb, B, ldb, v, p0, kc, j0, nc, bp, 32);
    else pack_b_nr(gk, tb, B, ldb, v, p0, kc, j0, nc, bp, 16);
}

/* M rows in whole MR-row panels: the rows a packed A holds. */
static inline int64_t whole_panels(const gemm_kernel *gk, int64_t M) { return (M + gk->mr - 1) / gk->mr * gk->mr; }

/* The packed product: for each block of B (kc x nc, packed once) and of A (mc x kc), every
 * register tile; the tile adds the bias on the first depth block and accumulates on the others. */
TARGET_AVX2 static void gemm_packed(const gemm_kernel *gk, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A,
                                    int64_t lda, const float *B, int64_t ldb, const im2col_view *v, int64_t vj, float *C,
                                    int64_t ldc, int acc, const float *brow, const float *bcol, const float *apre,
                                    float *work) {
    float *ap = work, *bp = work + gk->mc * gk->kc;
    const int64_t Mp = whole_panels(gk, M);
    for (int64_t jc = 0; jc < N; jc += gk->nc) {
        int64_t nc = N - jc < gk->nc ? N - jc : gk->nc;
        for (int64_t pc = 0; pc < K; pc += gk->kc) {
            int64_t kc = K - pc < gk->kc ? K - pc : gk->kc;
            pack_b(gk, tb, B, ldb, v, pc, kc, (v ? vj : 0) + jc, nc, bp);
            if (gk->pairs) gk->pairs(bp, kc, nc, gk->nr);
            int acc_here = acc || pc > 0;
            for (int64_t ic = 0; ic < M; ic += gk->mc) {
                int64_t mc = M - ic < gk->mc ? M - ic : gk->mc;
                const float *a = apre ? apre + pc * Mp + ic * kc : ap;
                if (!apre) {
                    pack_a(gk, ta, A, lda, ic, mc, pc, kc, ap);
                    if (gk->pairs) gk->pairs(ap, kc, mc, gk->mr);
                }
                for (int64_t jr = 0; jr < nc; jr += gk->nr) {
                    int64_t nr = nc - jr < gk->nr ? nc - jr : gk->nr;
                    for (int64_t ir = 0; ir < mc; ir += gk->mr) {
                        int64_t mr = mc - ir < gk->mr ? mc - ir : gk->mr;
                        gk->tile(kc, a + ir * kc, bp + jr * kc, C + (ic + ir) * ldc + jc + jr, ldc, mr, nr, acc_here,
                                 brow && !acc_here ? brow + ic + ir : NULL, bcol && !acc_here ? bcol + jc + jr : NULL);
                    }
                }
            }
        }
    }
}

/* op(A) [M, K] packed whole, as gemm_packed reads it: depth block pc, row block ic at dst + pc Mp +
 * ic kc (Mp: M in whole panels). For an A every product of a batch shares (a convolution's
 * weights), packed once rather than once per image. */
TARGET_AVX2 static void pack_a_whole(const gemm_kernel *gk, int ta, int64_t M, int64_t K, const float *A, int64_t lda,
                                     float *dst) {
    const int64_t Mp = whole_panels(gk, M);
    for (int64_t pc = 0; pc < K; pc += gk->kc) {
        int64_t kc = K - pc < gk->kc ? K - pc : gk->kc;
        for (int64_t ic = 0; ic < M; ic += gk->mc) {
            int64_t mc = M - ic < gk->mc ? M - ic : gk->mc;
            pack_a(gk, ta, A, lda, ic, mc, pc, kc, dst + pc * Mp + ic * kc);
            if (gk->pairs) gk->pairs(dst + pc * Mp + ic * kc, kc, mc, gk->mr);
        }
    }
}
#endif

/* Products with one row, one column or a depth of one (layers of width 1), where the packed
 * kernel would mostly multiply padding: direct loops over the unit-stride side, with the ISA's
 * row helpers. C (row stride ldc) is overwritten with the bias (brow, bcol) or 0 plus the
 * product, or accumulated into (acc). */
static void gemm_skinny(const gemm_kernel *gk, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float *C, int64_t ldc, int acc, const float *brow, const float *bcol) {
    int64_t ak = ta ? lda : 1, ai = ta ? 1 : lda;   /* A(i, k) = A[i * ai + k * ak] */
    int64_t bk = tb ? 1 : ldb, bj = tb ? ldb : 1;   /* B(k, j) = B[k * bk + j * bj] */
    if (K == 1 && bj == 1) {   /* C[i, :] = init + A(i, 0) B(0, :) */
        for (int64_t i = 0; i < M; i++) {
            float *c = C + i * ldc;
            gk->axpy(c, acc ? c : bcol, brow ? brow[i] : 0.0f, A[i * ai], B, N);
        }
    } else if (M == 1 && bj == 1) {   /* C[0, :] = init + sum_k A(0, k) B(k, :) */
        gk->axpy(C, acc ? C : bcol, brow ? brow[0] : 0.0f, A[0], B, N);
        for (int64_t k = 1; k < K; k++) gk->axpy(C, C, 0.0f, A[k * ak], B + k * bk, N);
    } else if (N == 1 && ak == 1 && bk == 1) {   /* C[i, 0] = init + A(i, :) . B(:, 0) */
        for (int64_t i = 0; i < M; i++)
            C[i * ldc] = (acc ? C[i * ldc] : brow ? brow[i] : bcol ? bcol[0] : 0.0f) + gk->dot(A + i * ai, B, K);
    } else if (N == 1 && ai == 1 && ldc == 1) {   /* C[:, 0] = init + sum_k A(:, k) B(k, 0) */
        gk->axpy(C, acc ? C : brow, bcol ? bcol[0] : 0.0f, B[0], A, M);
        for (int64_t k = 1; k < K; k++) gk->axpy(C, C, 0.0f, B[k * bk], A + k * ak, M);
    } else {   /* any other thin shape: plain loops */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                float sum = acc ? C[i * ldc + j] : brow ? brow[i] : bcol ? bcol[j] : 0.0f;
                for (int64_t k = 0; k < K; k++) sum += A[i * ai + k * ak] * B[k * bk + j * bj];
                C[i * ldc + j] = sum;
            }
    }
}

/* One product on the calling thread: C (+)= op(A) op(B), op(A) [M, K], op(B) [K, N], C row stride
 * ldc. lda and ldb are the stored row strides of A and B. B is an im2col view instead when v is
 * set, starting at column vj of op(B). Unless accumulating, a bias per row (brow) or per column
 * (bcol) is added. gk: the packed kernel, or NULL for OpenBLAS. */
static void gemm(const gemm_kernel *gk, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *B, int64_t ldb, const im2col_view *v, int64_t vj, float *C, int64_t ldc, int acc,
                 const float *brow, const float *bcol, const float *apre) {
    if (M <= 0 || N <= 0) return;
    float *w = gk ? kernel_pack((size_t)(gk->mc * gk->kc + gk->kc * gk->nc)) : NULL;
    if (w && !v && K > 0 && !gk->pairs && (M == 1 || N == 1 || K == 1)) {
        gemm_skinny(gk, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc, brow, bcol);
        return;
    }
    if (!acc && (K <= 0 || !w) && (brow || bcol || K <= 0)) {   /* C = the bias (or 0), then accumulate */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = brow ? brow[i] : bcol ? bcol[j] : 0.0f;
        acc = 1;
    }
    if (K <= 0) return;
#ifdef CPU_X86
    if (w) {
        gemm_packed(gk, ta, tb, M, N, K, A, lda, B, ldb, v, vj, C, ldc, acc, brow, bcol, apre, w);
        return;
    }
#endif
    float *m = NULL;
    if (v) {   /* OpenBLAS reads memory: the view's columns vj.. of op(B), from a materialized copy */
        m = im2col_materialize(v);
        if (!m) return;
        ldb = v->ho * v->wo;
        B = tb ? m + vj * ldb : m + vj;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N,
                (int)K, 1.0f, A, (int)lda, B, (int)ldb, acc ? 1.0f : 0.0f, C, (int)ldc);
    free(m);
}

void kernel_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                 float *C, int64_t ldc, int acc) {
    gemm(gemm_kernel_now(), ta, tb, M, N, K, A, lda, B, ldb, NULL, 0, C, ldc, acc, NULL, NULL, NULL);
}

/* C[i, j] = max(C[i, j], 0) over rows x cols (row stride ldc), as relu computes it (NaN to 0):
 * MM_RELU, on the block a thread has just written, while it is still in cache. */
static void relu_block(float *C, int64_t rows, int64_t cols, int64_t ldc) {
    for (int64_t i = 0; i < rows; i++, C += ldc)
        for (int64_t j = 0; j < cols; j++) C[j] = C[j] > 0.0f ? C[j] : 0.0f;
}

/* Part t of T of one product: a block of rows or of columns (in whole register tiles). Each part
 * packs the whole of the other operand (B for a block of rows, A for a block of columns), so the
 * larger side is split and the packing repeated in every part is the smaller one. apre: A packed
 * whole already (pack_a_whole), or NULL. relu: the part's block of C goes through relu after. */
static void gemm_part(const gemm_kernel *gk, int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B,
                      const im2col_view *v, float *C, int acc, const float *brow, const float *bcol, const float *apre,
                      bool relu, int t, int T) {
    int64_t lda = ta ? M : K, ldb = tb ? K : N, mr = gk ? gk->mr : 8, nr = gk ? gk->nr : 32;
    if (T == 1) {
        gemm(gk, ta, tb, M, N, K, A, lda, B, ldb, v, 0, C, N, acc, brow, bcol, apre);
        if (relu) relu_block(C, M, N, N);
    } else if (M >= 2 * mr * T ? M >= N || N < 2 * nr * T : M >= N) {
        int64_t tiles = (M + mr - 1) / mr, r0 = tiles * t / T * mr, r1 = tiles * (t + 1) / T * mr;
        if (r1 > M) r1 = M;
        if (r1 > r0)
            gemm(gk, ta, tb, r1 - r0, N, K, A + (ta ? r0 : r0 * lda), lda, B, ldb, v, 0, C + r0 * N, N, acc,
                 brow ? brow + r0 : NULL, bcol, NULL);
        if (relu && r1 > r0) relu_block(C + r0 * N, r1 - r0, N, N);
    } else {
        int64_t tiles = (N + nr - 1) / nr, c0 = tiles * t / T * nr, c1 = tiles * (t + 1) / T * nr;
        if (c1 > N) c1 = N;
        if (c1 > c0)
            gemm(gk, ta, tb, M, c1 - c0, K, A, lda, v ? B : B + (tb ? c0 * ldb : c0), ldb, v, c0, C + c0, N, acc, brow,
                 bcol ? bcol + c0 : NULL, apre);
        if (relu && c1 > c0) relu_block(C + c0, M, c1 - c0, N);
    }
}

/* Image x's im2col view (geometry geo) as kernel gk reads it: through padded_view for the packed
 * kernels. One per thread at a time: the padded copy lives in the thread's image buffer. */
static im2col_view view_of(const gemm_kernel *gk, const float *x, const int64_t *geo) {
    im2col_view v = im2col_of(x, geo);
#ifdef CPU_X86
    if (gk) v = padded_view(v);
#endif
    return v;
}

#ifdef CPU_X86
/* col2im_image for stride 1 on the vector paths, gathered: each image element is the sum of the
 * cols values of the taps that read it, added in registers and stored once, eight columns at a
 * time (the last eight overlapping the ones before when W is not a multiple of eight). A tap's
 * eight values start at output column t = x + pad - jj; near an edge, where part of [t, t + 8)
 * is outside [0, wo), they are loaded from the nearest eight inside and moved into place, with
 * zeros where there is no value. Adding each tap's rows into the image in turn (scatter) cost
 * three times as much: every row a load, add and store over the previous tap's store. img:
 * [C, H, W]; cols: [C kh kw, ho wo]. Needs W and wo of at least 8 (else false). */
TARGET_AVX2 static bool col2im_s1(const float *cols, float *img, const im2col_view *g) {
    int64_t n = g->ho * g->wo;
    if (g->W < 8 || g->wo < 8) return false;
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t c = 0; c < g->C; c++) {
        const float *cc = cols + c * g->kh * g->kw * n;
        for (int64_t y = 0; y < g->H; y++) {
            float *d = img + (c * g->H + y) * g->W;
            /* kernel rows whose output row y + pad - i is inside [0, ho) */
            int64_t i0 = y + g->pad - (g->ho - 1) > 0 ? y + g->pad - (g->ho - 1) : 0;
            int64_t i1 = y + g->pad < g->kh - 1 ? y + g->pad : g->kh - 1;
            for (int64_t x0 = 0; x0 < g->W; x0 += 8) {
                int64_t x = x0 + 8 <= g->W ? x0 : g->W - 8;
                __m256 s = _mm256_setzero_ps();
                for (int64_t jj = 0; jj < g->kw; jj++) {
                    int64_t t = x + g->pad - jj, base = t < 0 ? 0 : t > g->wo - 8 ? g->wo - 8 : t;
                    /* lane l takes loaded lane l + (t - base), or 0 where that is outside 0..7 */
                    __m256i at = _mm256_add_epi32(iota, _mm256_set1_epi32((int)(t - base)));
                    __m256 keep = _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), at),
                                                                          _mm256_cmpgt_epi32(_mm256_set1_epi32(8), at)));
                    for (int64_t i = i0; i <= i1; i++) {
                        __m256 v = _mm256_loadu_ps(cc + (i * g->kw + jj) * n + (y + g->pad - i) * g->wo + base);
                        if (t != base) v = _mm256_and_ps(_mm256_permutevar8x32_ps(v, at), keep);
                        s = _mm256_add_ps(s, v);
                    }
                }
                _mm256_storeu_ps(d + x, s);
            }
        }
    }
    return true;
}
#endif

/* One image's col2im (geometry g) after a product into cols. */
static void col2im_for(const gemm_kernel *gk, const float *cols, float *img, const im2col_view *g) {
#ifdef CPU_X86
    if (gk && g->s == 1 && col2im_s1(cols, img, g)) return;
#endif
    col2im_image(cols, img, g->C, g->H, g->W, g->kh, g->kw, g->s, g->pad);
}

/* A batched product summed over its batch (MM_REDUCE: a weight gradient) on T threads: thread t
 * sums its share of the batch, whole products, into a part of its own (thread 0 into C), and the
 * parts are then added into C in thread order, so a thread count always gives the same result.
 * Split by rows or columns instead, every thread would pack the whole of the other operand for
 * every batch element (a convolution's im2col of each image). geo_b: B is an im2col view. */
#define REDUCE_PART_MAX (1 << 20)   /* floats of C per part: the parts live in per-thread scratch */

static void reduce_by_batch(const gemm_kernel *gk, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t batch,
                            const float *A, const float *B, const int64_t *aoff, const int64_t *boff,
                            const int64_t *geo_b, float *C, const float *brow, const float *bcol, int threads) {
    float *part[64];
    if (threads > 64) threads = 64;
    #pragma omp parallel num_threads(threads)
    {
        const unsigned fp = fp_flush_denormals();
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        float *mine = t == 0 ? C : kernel_scratch((size_t)(M * N));
        part[t] = mine;
        for (int64_t b = batch * t / T; mine && b < batch * (t + 1) / T; b++) {
            im2col_view v = geo_b ? view_of(gk, B + boff[b], geo_b) : (im2col_view){ 0 };
            bool first = b == batch * t / T;
            gemm_part(gk, ta, tb, M, N, K, A + aoff[b], B + boff[b], geo_b ? &v : NULL, mine, !first,
                      t == 0 ? brow : NULL, t == 0 ? bcol : NULL, NULL, false, 0, 1);
        }
        #pragma omp barrier
        for (int64_t i = M * N * t / T; i < M * N * (t + 1) / T; i++)   /* C += the other parts, in order */
            for (int u = 1; u < T; u++)
                if (part[u]) C[i] += part[u][i];
        fp_restore(fp);
    }
}

/* The A of every product of a batch, packed once by the calling thread for all threads to read,
 * when the batch shares it (a convolution's weights, for its forward and input gradient); else
 * NULL, and each product packs its own. */
#define SHARED_A_MAX (1 << 20)   /* floats */

static const float *shared_a(const gemm_kernel *gk, int ta, int64_t M, int64_t K, const float *A, const int64_t *aoff,
                             int64_t batch) {
#ifdef CPU_X86
    const int64_t Mp = gk ? whole_panels(gk, M) : 0;
    if (!gk || batch < 2 || Mp * K > SHARED_A_MAX || M == 1 || K == 1) return NULL;
    for (int64_t b = 1; b < batch; b++)
        if (aoff[b] != aoff[0]) return NULL;
    float *dst = kernel_panels((size_t)(Mp * K));
    if (dst) pack_a_whole(gk, ta, M, K, A + aoff[0], ta ? M : K, dst);
    return dst;
#else
    (void)gk, (void)ta, (void)M, (void)K, (void)A, (void)aoff, (void)batch;
    return NULL;
#endif
}

enum { MM_REDUCE = 1, MM_IM2COL_B = 2, MM_COL2IM_C = 4, MM_BIAS_ROW = 8, MM_BIAS_COL = 16, MM_BF16 = 32, MM_RELU = 64 };

/* a = {ta, tb, M, N, K, batch, flags, [im2col geometry of B: C H W kh kw stride pad], [col2im
 * geometry of C: the same], A offsets[batch], B offsets[batch]}; p = {A, B, C}.
 * Without flags C[b] = op(A[b]) op(B[b]) for each batch element b. MM_REDUCE: C = the sum over b
 * (a batched product followed by a sum over its batch axis, as a convolution's weight gradient).
 * MM_IM2COL_B: B[b] is the im2col view of the image at B + offset (a convolution's cols, never
 * materialized). MM_COL2IM_C: C[b] goes through col2im into image b of C (a convolution's input
 * gradient; the cols never materialized either). MM_BIAS_ROW / MM_BIAS_COL: p[3] is a bias added
 * to every product, one value per row / per column (a layer's bias). MM_BF16: the operands are
 * rounded to bf16 (a graph of bf16 precision), the sums stay f32. MM_RELU (not with MM_REDUCE or
 * MM_COL2IM_C): C = relu(the product (+ bias)), a layer's activation, each thread's block of C
 * right after its product. Threads split the batch or, for few products, each product's rows or
 * columns. */
void k_matmul(const int64_t *a, void *const *p) {
    int ta = (int)a[0], tb = (int)a[1], flags = (int)a[6];
    int64_t M = a[2], N = a[3], K = a[4], batch = a[5];
    const int64_t *geo_b = a + 7, *geo_c = a + 7 + ((flags & MM_IM2COL_B) ? 7 : 0);
    const int64_t *aoff = geo_c + ((flags & MM_COL2IM_C) ? 7 : 0), *boff = aoff + batch;
    const float *A = p[0], *B = p[1];
    float *C = p[2];
    const float *brow = (flags & MM_BIAS_ROW) ? p[3] : NULL, *bcol = (flags & MM_BIAS_COL) ? p[3] : NULL;
    bool view = flags & MM_IM2COL_B, relu = (flags & MM_RELU) && !(flags & (MM_REDUCE | MM_COL2IM_C));
    const gemm_kernel *gk = gemm_kernel_now();
#ifdef CPU_X86
    /* (cpu_precision gives a graph bf16 only where this holds; a process that changes TG_CPU_ISA
     * under a compiled bf16 graph gets f32 products) */
    if ((flags & MM_BF16) && cpu_isa_bf16(cpu_kernels_isa())) gk = &gemm_kernel_avx512_bf16;
#endif
    /* Threads only for enough work: an OpenMP region, even one that runs on one thread, costs
     * microseconds (libgomp builds a team), as much as a small product. */
    int threads = M * N * K * batch >= PARALLEL_MACS ? omp_get_max_threads() : 1;
    const float *apre = (flags & MM_REDUCE) ? NULL : shared_a(gk, ta, M, K, A, aoff, batch);
    if (flags & MM_COL2IM_C) {   /* per image: the product into a scratch cols matrix, then col2im */
        im2col_view g = im2col_of(NULL, geo_c);
        #pragma omp parallel num_threads(threads) if (threads > 1)
        {
            const unsigned fp = fp_flush_denormals();
            float *cols = kernel_scratch((size_t)(M * N));
            #pragma omp for schedule(static)
            for (int64_t b = 0; b < batch; b++) {
                if (!cols) continue;
                im2col_view v = view ? view_of(gk, B + boff[b], geo_b) : (im2col_view){ 0 };
                gemm_part(gk, ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL, cols, 0, NULL, NULL, apre, false, 0, 1);
                col2im_for(gk, cols, C + b * g.C * g.H * g.W, &g);
            }
            fp_restore(fp);
        }
        return;
    }
    if (threads == 1) {
        for (int64_t b = 0; b < batch; b++) {
            im2col_view v = view ? view_of(gk, B + boff[b], geo_b) : (im2col_view){ 0 };
            gemm_part(gk, ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL,
                      C + ((flags & MM_REDUCE) ? 0 : b * M * N), (flags & MM_REDUCE) && b > 0, brow, bcol, apre, relu, 0, 1);
        }
        return;
    }
    if ((flags & MM_REDUCE) && batch >= 2 * threads && M * N <= REDUCE_PART_MAX) {
        reduce_by_batch(gk, ta, tb, M, N, K, batch, A, B, aoff, boff, view ? geo_b : NULL, C, brow, bcol, threads);
        return;
    }
    if (!(flags & MM_REDUCE) && batch >= threads) {
        #pragma omp parallel num_threads(threads)
        {
            const unsigned fp = fp_flush_denormals();
            #pragma omp for schedule(static)
            for (int64_t b = 0; b < batch; b++) {
                im2col_view v = view ? view_of(gk, B + boff[b], geo_b) : (im2col_view){ 0 };
                gemm_part(gk, ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL, C + b * M * N, 0, brow, bcol, apre, relu,
                          0, 1);
            }
            fp_restore(fp);
        }
        return;
    }
    #pragma omp parallel num_threads(threads)
    {
        const unsigned fp = fp_flush_denormals();
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        for (int64_t b = 0; b < batch; b++) {
            im2col_view v = view ? view_of(gk, B + boff[b], geo_b) : (im2col_view){ 0 };
            gemm_part(gk, ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL,
                      C + ((flags & MM_REDUCE) ? 0 : b * M * N), (flags & MM_REDUCE) && b > 0, brow, bcol, apre, relu, t, T);
        }
        fp_restore(fp);
    }
}
