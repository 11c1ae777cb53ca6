/* Library kernels of the compiled CPU backend: the ops generated code does not inline (matrix
 * products, with im2col, col2im and bias folded in where the schedule asks; row-wise softmax,
 * argmax, scatters, pooling), in f32 with OpenMP. Each takes its constants in `a` and its buffers
 * in `p` (layouts in cpu_codegen.c), so generated code calls them through one function-pointer
 * type. Hot paths have AVX-512 versions, chosen at run time; portable code (and OpenBLAS for the
 * products) otherwise. */
#include "cpu/cpu.h"

#include <cblas.h>
#include <float.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Rows are spread over threads only when there is enough work to pay for waking them (a fork
 * and join costs about 3 us): PARALLEL_WORK elements for row-wise kernels, PARALLEL_MACS
 * multiply-adds (some 12 us on one core: below that a second thread measurably does not pay) for
 * products. */
#define PARALLEL_WORK 32768
#define PARALLEL_MACS (1 << 21)

/* ----- matrix products -----
 * C[M,N] = op(A) op(B) (or += when accumulating), row-major with leading dimensions. On CPUs with
 * AVX-512 a packed, register-blocked kernel of our own: OpenBLAS 0.3.21 picks its AVX2 Haswell
 * kernels on Zen 4/5, ~95 GFLOP/s per core on the benchmark's shapes where this one reaches
 * 180-210 (the FMA units give ~220). OpenBLAS otherwise. Either way one call runs on the calling
 * thread; k_matmul spreads the work over OpenMP threads. */

/* Per-thread scratch memory, kept for the thread's life (freed when it exits): a product's
 * packing buffers, a convolution's per-image cols. */
typedef struct {
    float *pack;
    float *scratch;
    size_t scratch_len;
} thread_buffers;

static pthread_key_t buffers_key;
static pthread_once_t buffers_once = PTHREAD_ONCE_INIT;

static void buffers_free(void *p) {
    thread_buffers *b = p;
    free(b->pack);
    free(b->scratch);
    free(b);
}

static void buffers_init(void) { pthread_key_create(&buffers_key, buffers_free); }

static thread_buffers *buffers(void) {
    pthread_once(&buffers_once, buffers_init);
    thread_buffers *b = pthread_getspecific(buffers_key);
    if (!b && (b = calloc(1, sizeof *b)) != NULL && pthread_setspecific(buffers_key, b) != 0) {
        free(b);
        b = NULL;
    }
    return b;
}

/* Set when a kernel found no scratch memory and so left its output wrong: see k_failed. */
static atomic_int scratch_failed;

/* n floats of this thread's scratch (NULL when out of memory, which is then recorded). */
float *cpu_scratch(size_t n) {
    thread_buffers *b = buffers();
    if (b && b->scratch_len < n) {
        free(b->scratch);
        b->scratch = tg_alloc_aligned64(n * sizeof(float));
        b->scratch_len = b->scratch ? n : 0;
    }
    if (!b || !b->scratch) scratch_failed = 1;
    return b ? b->scratch : NULL;
}

/* An operand read through im2col (the cols matrix [C*kh*kw, ho*wo] of one image x [C, H, W]),
 * never materialized: products pack it straight from the image. */
typedef struct {
    const float *x;
    int64_t C, H, W, kh, kw, s, pad, ho, wo;
} im2col_view;

static im2col_view im2col_of(const float *x, const int64_t *g) {
    im2col_view v = { x, g[0], g[1], g[2], g[3], g[4], g[5], g[6], 0, 0 };
    v.ho = (v.H + 2 * v.pad - v.kh) / v.s + 1;
    v.wo = (v.W + 2 * v.pad - v.kw) / v.s + 1;
    return v;
}

/* Elements [j0, j0 + n) of row r of the cols matrix into dst. */
static void im2col_segment(const im2col_view *v, int64_t r, int64_t j0, int64_t n, float *dst) {
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

/* Tests turn the AVX-512 paths off (cpu_kernels_portable) to cover the portable ones (OpenBLAS,
 * plain loops) on AVX-512 machines too. */
static bool portable;
void cpu_kernels_portable(bool on) { portable = on; }

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HAVE_AVX512_GEMM 1
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,fma,avx2,avx")))
#define GEMM_MR 8      /* rows of a register tile */
#define GEMM_NR 32     /* columns of a register tile: two 16-float vectors */
#define GEMM_KC 256    /* depth of a packed block */
#define GEMM_MC 128    /* rows of a packed A block */
#define GEMM_NC 512    /* columns of a packed B block */
#define GEMM_WORK ((size_t)(GEMM_MC * GEMM_KC + GEMM_KC * GEMM_NC))

/* im2col_segment with sixteen-lane loads (expand-loads, so that nothing outside the image is
 * addressed) for stride 1; the scalar one otherwise. */
AVX512 static void im2col_segment_avx512(const im2col_view *v, int64_t r, int64_t j0, int64_t n, float *dst) {
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

/* Eight floats from each of eight rows (rows[r] + k) into eight rows of dst, stride apart,
 * transposed: dst[i * stride + r] = rows[r][k + i]. */
AVX512 static inline void transpose8(const float *const *rows, int64_t k, float *dst, int64_t stride) {
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

/* Pack rows [i0, i0 + mc) x depth [p0, p0 + kc) of op(A) into GEMM_MR-row panels, k-major within
 * a panel (ap[panel][k][r]), rows past mc zero. */
AVX512 static void pack_a(int ta, const float *A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float *ap) {
    for (int64_t ir = 0; ir < mc; ir += GEMM_MR) {
        int64_t mr = mc - ir < GEMM_MR ? mc - ir : GEMM_MR;
        float *dst = ap + ir * kc;
        if (!ta) {
            const float *rows[GEMM_MR];
            for (int r = 0; r < GEMM_MR; r++) rows[r] = A + (i0 + ir + (r < mr ? r : 0)) * lda + p0;
            if (mr == GEMM_MR) {
                int64_t k = 0;
                for (; k + 8 <= kc; k += 8) transpose8(rows, k, dst + k * GEMM_MR, GEMM_MR);
                for (; k < kc; k++)
                    for (int r = 0; r < GEMM_MR; r++) dst[k * GEMM_MR + r] = rows[r][k];
            } else {
                for (int64_t k = 0; k < kc; k++)
                    for (int r = 0; r < GEMM_MR; r++) dst[k * GEMM_MR + r] = r < mr ? rows[r][k] : 0.0f;
            }
        } else {   /* op(A)[i, k] = A[k * lda + i]: GEMM_MR contiguous floats per k */
            const float *src = A + p0 * lda + i0 + ir;
            __mmask8 m = (__mmask8)((1u << mr) - 1);
            for (int64_t k = 0; k < kc; k++) _mm256_storeu_ps(dst + k * GEMM_MR, _mm256_maskz_loadu_ps(m, src + k * lda));
        }
    }
}

/* Pack depth [p0, p0 + kc) x columns [j0, j0 + nc) of op(B) into GEMM_NR-column panels
 * (bp[panel][k][c]), columns past nc zero. */
AVX512 static void pack_b(int tb, const float *B, int64_t ldb, const im2col_view *v, int64_t p0, int64_t kc, int64_t j0,
                          int64_t nc, float *bp) {
    for (int64_t jr = 0; jr < nc; jr += GEMM_NR) {
        int64_t nr = nc - jr < GEMM_NR ? nc - jr : GEMM_NR;
        float *dst = bp + jr * kc;
        if (v && !tb) {   /* op(B) = cols: row k of cols, columns j0 + jr .. */
            for (int64_t k = 0; k < kc; k++) {
                im2col_segment_avx512(v, p0 + k, j0 + jr, nr, dst + k * GEMM_NR);
                for (int64_t c = nr; c < GEMM_NR; c++) dst[k * GEMM_NR + c] = 0.0f;
            }
        } else if (v) {   /* op(B) = cols^T: rows j0 + jr .. of cols, depth p0 .., then the transposing pack */
            float rows[GEMM_NR * GEMM_KC];
            for (int64_t c = 0; c < nr; c++) im2col_segment_avx512(v, j0 + jr + c, p0, kc, rows + c * kc);
            pack_b(1, rows, kc, NULL, 0, kc, 0, nr, dst);
        } else if (!tb) {
            const float *src = B + p0 * ldb + j0 + jr;
            __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
            __mmask16 m1 = (__mmask16)(nr <= 16 ? 0 : nr >= 32 ? 0xffff : (1u << (nr - 16)) - 1);
            for (int64_t k = 0; k < kc; k++) {
                _mm512_storeu_ps(dst + k * GEMM_NR, _mm512_maskz_loadu_ps(m0, src + k * ldb));
                _mm512_storeu_ps(dst + k * GEMM_NR + 16, _mm512_maskz_loadu_ps(m1, src + k * ldb + 16));
            }
        } else {   /* op(B)[k, j] = B[j * ldb + k] */
            int64_t c = 0;
            for (; c + 8 <= nr; c += 8) {
                const float *s0 = B + (j0 + jr + c) * ldb + p0, *cols[8];
                for (int r = 0; r < 8; r++) cols[r] = s0 + r * ldb;
                int64_t k = 0;
                for (; k + 8 <= kc; k += 8) transpose8(cols, k, dst + k * GEMM_NR + c, GEMM_NR);
                for (; k < kc; k++)
                    for (int64_t cc = 0; cc < 8; cc++) dst[k * GEMM_NR + c + cc] = s0[cc * ldb + k];
            }
            for (; c < GEMM_NR; c++) {
                if (c < nr) {
                    const float *src = B + (j0 + jr + c) * ldb + p0;
                    for (int64_t k = 0; k < kc; k++) dst[k * GEMM_NR + c] = src[k];
                } else {
                    for (int64_t k = 0; k < kc; k++) dst[k * GEMM_NR + c] = 0.0f;
                }
            }
        }
    }
}

/* The register tile: C[mr, nr] (+)= the product of a packed A panel and a packed B panel. */
AVX512 static inline __attribute__((always_inline)) void gemm_tile(int64_t kc, const float *ap, const float *bp, float *C,
                                                                     int64_t ldc, int64_t mr, int64_t nr, int acc,
                                                                     const float *brow, const float *bcol) {
    /* Every loop over the tile's rows is unrolled with constant bounds (rows past mr are guarded,
     * not skipped by a variable bound), so the sixteen accumulators stay in registers. */
    __m512 c0[GEMM_MR], c1[GEMM_MR];
#pragma GCC unroll 8
    for (int r = 0; r < GEMM_MR; r++) {
        c0[r] = _mm512_setzero_ps();
        c1[r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 8
        for (int r = 0; r < GEMM_MR; r++) {
            __m512 a = _mm512_set1_ps(ap[r]);
            c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
        }
        ap += GEMM_MR;
        bp += GEMM_NR;
    }
    /* What the tile adds to: C itself (acc), else a bias per row (brow) or per column (bcol). */
    __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
    __mmask16 m1 = (__mmask16)(nr <= 16 ? 0 : nr >= 32 ? 0xffff : (1u << (nr - 16)) - 1);
    __m512 bc0 = _mm512_setzero_ps(), bc1 = _mm512_setzero_ps();
    if (!acc && bcol) {
        bc0 = _mm512_maskz_loadu_ps(m0, bcol);
        bc1 = _mm512_maskz_loadu_ps(m1, bcol + 16);
    }
#pragma GCC unroll 8
    for (int r = 0; r < GEMM_MR; r++) {
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

AVX512 static void gemm_avx512(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                               int64_t ldb, const im2col_view *v, int64_t vj, float *C, int64_t ldc, int acc,
                               const float *brow, const float *bcol, float *work) {
    float *ap = work, *bp = work + GEMM_MC * GEMM_KC;
    for (int64_t jc = 0; jc < N; jc += GEMM_NC) {
        int64_t nc = N - jc < GEMM_NC ? N - jc : GEMM_NC;
        for (int64_t pc = 0; pc < K; pc += GEMM_KC) {
            int64_t kc = K - pc < GEMM_KC ? K - pc : GEMM_KC;
            pack_b(tb, B, ldb, v, pc, kc, (v ? vj : 0) + jc, nc, bp);
            int acc_here = acc || pc > 0;
            for (int64_t ic = 0; ic < M; ic += GEMM_MC) {
                int64_t mc = M - ic < GEMM_MC ? M - ic : GEMM_MC;
                pack_a(ta, A, lda, ic, mc, pc, kc, ap);
                for (int64_t jr = 0; jr < nc; jr += GEMM_NR) {
                    int64_t nr = nc - jr < GEMM_NR ? nc - jr : GEMM_NR;
                    for (int64_t ir = 0; ir < mc; ir += GEMM_MR) {
                        int64_t mr = mc - ir < GEMM_MR ? mc - ir : GEMM_MR;
                        gemm_tile(kc, ap + ir * kc, bp + jr * kc, C + (ic + ir) * ldc + jc + jr, ldc, mr, nr, acc_here,
                                  brow && !acc_here ? brow + ic + ir : NULL, bcol && !acc_here ? bcol + jc + jr : NULL);
                    }
                }
            }
        }
    }
}

static int have_avx512(void) {
    static int have = -1;
    if (have < 0)
        have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq");
    return have && !portable;
}

/* This thread's packing buffers. */
static float *pack_buffers(void) {
    thread_buffers *b = buffers();
    if (b && !b->pack) b->pack = tg_alloc_aligned64(GEMM_WORK * sizeof(float));
    return b ? b->pack : NULL;   /* NULL: the caller takes the OpenBLAS path, which needs none */
}
#endif

/* The cols matrix of an im2col view, materialized (where no packing kernel of ours reads it). */
static float *im2col_materialize(const im2col_view *v) {
    int64_t rows = v->C * v->kh * v->kw, cols = v->ho * v->wo;
    float *m = tg_alloc_aligned64(sizeof(float) * (size_t)(rows * cols));
    if (!m) scratch_failed = 1;
    if (m)
        for (int64_t r = 0; r < rows; r++) im2col_segment(v, r, 0, cols, m + r * cols);
    return m;
}

#ifdef HAVE_AVX512_GEMM
/* y[0..n) = y0[0..n) (or 0 when y0 is NULL; a value c0 when y0 == y: y itself) + a x[0..n) */
AVX512 static void axpy_row(float *y, const float *y0, float c0, float a, const float *x, int64_t n) {
    __m512 va = _mm512_set1_ps(a), vc = _mm512_set1_ps(c0);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = (__mmask16)(n - j >= 16 ? 0xffff : (1u << (n - j)) - 1);
        __m512 base = y0 ? _mm512_maskz_loadu_ps(m, y0 + j) : vc;
        _mm512_mask_storeu_ps(y + j, m, _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + j), base));
    }
}

AVX512 static float dot_row(const float *a, const float *b, int64_t n) {
    __m512 s = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, b + k), s);
    }
    return _mm512_reduce_add_ps(s);
}

/* Products with one row, one column or a depth of one (layers of width 1), where the packed
 * kernel would mostly multiply padding: direct loops over the unit-stride side. C (row stride ldc)
 * is overwritten with the bias (brow, bcol) or 0 plus the product, or accumulated into (acc). */
AVX512 static void gemm_skinny(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                               int64_t ldb, float *C, int64_t ldc, int acc, const float *brow, const float *bcol) {
    int64_t ak = ta ? lda : 1, ai = ta ? 1 : lda;   /* A(i, k) = A[i * ai + k * ak] */
    int64_t bk = tb ? 1 : ldb, bj = tb ? ldb : 1;   /* B(k, j) = B[k * bk + j * bj] */
    if (K == 1 && bj == 1) {   /* C[i, :] = init + A(i, 0) B(0, :) */
        for (int64_t i = 0; i < M; i++) {
            float *c = C + i * ldc;
            axpy_row(c, acc ? c : bcol, brow ? brow[i] : 0.0f, A[i * ai], B, N);
        }
    } else if (M == 1 && bj == 1) {   /* C[0, :] = init + sum_k A(0, k) B(k, :) */
        axpy_row(C, acc ? C : bcol, brow ? brow[0] : 0.0f, A[0], B, N);
        for (int64_t k = 1; k < K; k++) axpy_row(C, C, 0.0f, A[k * ak], B + k * bk, N);
    } else if (N == 1 && ak == 1 && bk == 1) {   /* C[i, 0] = init + A(i, :) . B(:, 0) */
        for (int64_t i = 0; i < M; i++)
            C[i * ldc] = (acc ? C[i * ldc] : brow ? brow[i] : bcol ? bcol[0] : 0.0f) + dot_row(A + i * ai, B, K);
    } else if (N == 1 && ai == 1 && ldc == 1) {   /* C[:, 0] = init + sum_k A(:, k) B(k, 0) */
        axpy_row(C, acc ? C : brow, bcol ? bcol[0] : 0.0f, B[0], A, M);
        for (int64_t k = 1; k < K; k++) axpy_row(C, C, 0.0f, B[k * bk], A + k * ak, M);
    } else {   /* any other thin shape: plain loops */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                float sum = acc ? C[i * ldc + j] : brow ? brow[i] : bcol ? bcol[j] : 0.0f;
                for (int64_t k = 0; k < K; k++) sum += A[i * ai + k * ak] * B[k * bk + j * bj];
                C[i * ldc + j] = sum;
            }
    }
}
#endif

/* One product on the calling thread: C (+)= op(A) op(B), op(A) [M, K], op(B) [K, N], C row stride
 * ldc. lda and ldb are the stored row strides of A and B. B is an im2col view instead when v is
 * set, starting at column vj of op(B). Unless accumulating, a bias per row (brow) or per column
 * (bcol) is added. */
static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                 const im2col_view *v, int64_t vj, float *C, int64_t ldc, int acc, const float *brow, const float *bcol) {
    if (M <= 0 || N <= 0) return;
    float *w = NULL;
#ifdef HAVE_AVX512_GEMM
    if (have_avx512()) w = pack_buffers();
#endif
#ifdef HAVE_AVX512_GEMM
    if (w && !v && K > 0 && (M == 1 || N == 1 || K == 1)) {
        gemm_skinny(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, acc, brow, bcol);
        return;
    }
#endif
    if (!acc && (K <= 0 || !w) && (brow || bcol || K <= 0)) {   /* C = the bias (or 0), then accumulate */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = brow ? brow[i] : bcol ? bcol[j] : 0.0f;
        acc = 1;
    }
    if (K <= 0) return;
#ifdef HAVE_AVX512_GEMM
    if (w) {
        gemm_avx512(ta, tb, M, N, K, A, lda, B, ldb, v, vj, C, ldc, acc, brow, bcol, w);
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
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, 1.0f, A, (blasint)lda, B, (blasint)ldb, acc ? 1.0f : 0.0f, C, (blasint)ldc);
    free(m);
}

/* Part t of T of one product: a block of rows (in whole register tiles) when there are enough,
 * else a block of columns. */
static void gemm_part(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B, const im2col_view *v,
                      float *C, int acc, const float *brow, const float *bcol, int t, int T) {
    int64_t lda = ta ? M : K, ldb = tb ? K : N;
    if (T == 1) {
        gemm(ta, tb, M, N, K, A, lda, B, ldb, v, 0, C, N, acc, brow, bcol);
    } else if (M >= 16 * T || M >= N) {
        int64_t tiles = (M + 7) / 8, r0 = tiles * t / T * 8, r1 = tiles * (t + 1) / T * 8;
        if (r1 > M) r1 = M;
        if (r1 > r0)
            gemm(ta, tb, r1 - r0, N, K, A + (ta ? r0 : r0 * lda), lda, B, ldb, v, 0, C + r0 * N, N, acc, brow ? brow + r0 : NULL,
                 bcol);
    } else {
        int64_t tiles = (N + 31) / 32, c0 = tiles * t / T * 32, c1 = tiles * (t + 1) / T * 32;
        if (c1 > N) c1 = N;
        if (c1 > c0)
            gemm(ta, tb, M, c1 - c0, K, A, lda, v ? B : B + (tb ? c0 * ldb : c0), ldb, v, c0, C + c0, N, acc, brow,
                 bcol ? bcol + c0 : NULL);
    }
}

enum { MM_REDUCE = 1, MM_IM2COL_B = 2, MM_COL2IM_C = 4, MM_BIAS_ROW = 8, MM_BIAS_COL = 16 };

static void col2im_image(const float *cols, float *img, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t s,
                         int64_t pad);

/* a = {ta, tb, M, N, K, batch, flags, [im2col geometry of B: C H W kh kw stride pad], [col2im
 * geometry of C: the same], A offsets[batch], B offsets[batch]}; p = {A, B, C}.
 * Without flags C[b] = op(A[b]) op(B[b]) for each batch element b. MM_REDUCE: C = the sum over b
 * (a batched product followed by a sum over its batch axis, as a convolution's weight gradient).
 * MM_IM2COL_B: B[b] is the im2col view of the image at B + offset (a convolution's cols, never
 * materialized). MM_COL2IM_C: C[b] goes through col2im into image b of C (a convolution's input
 * gradient; the cols never materialized either). MM_BIAS_ROW / MM_BIAS_COL: p[3] is a bias added
 * to every product, one value per row / per column (a layer's bias). Threads split the batch or, for few products,
 * each product's rows or columns. */
static void k_matmul(const int64_t *a, void *const *p) {
    int ta = (int)a[0], tb = (int)a[1], flags = (int)a[6];
    int64_t M = a[2], N = a[3], K = a[4], batch = a[5];
    const int64_t *geo_b = a + 7, *geo_c = a + 7 + ((flags & MM_IM2COL_B) ? 7 : 0);
    const int64_t *aoff = geo_c + ((flags & MM_COL2IM_C) ? 7 : 0), *boff = aoff + batch;
    const float *A = p[0], *B = p[1];
    float *C = p[2];
    const float *brow = (flags & MM_BIAS_ROW) ? p[3] : NULL, *bcol = (flags & MM_BIAS_COL) ? p[3] : NULL;
    bool view = flags & MM_IM2COL_B;
    /* Threads only for enough work: an OpenMP region, even one that runs on one thread, costs
     * microseconds (libgomp builds a team), as much as a small product. */
    int threads = M * N * K * batch >= PARALLEL_MACS ? omp_get_max_threads() : 1;
    if (flags & MM_COL2IM_C) {   /* per image: the product into a scratch cols matrix, then col2im */
        im2col_view g = im2col_of(NULL, geo_c);
        #pragma omp parallel num_threads(threads) if (threads > 1)
        {
            float *cols = cpu_scratch((size_t)(M * N));
            #pragma omp for schedule(static)
            for (int64_t b = 0; b < batch; b++) {
                if (!cols) continue;
                im2col_view v = view ? im2col_of(B + boff[b], geo_b) : (im2col_view){ 0 };
                gemm_part(ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL, cols, 0, NULL, NULL, 0, 1);
                col2im_image(cols, C + b * g.C * g.H * g.W, g.C, g.H, g.W, g.kh, g.kw, g.s, g.pad);
            }
        }
        return;
    }
    if (threads == 1) {
        for (int64_t b = 0; b < batch; b++) {
            im2col_view v = view ? im2col_of(B + boff[b], geo_b) : (im2col_view){ 0 };
            gemm_part(ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL, C + ((flags & MM_REDUCE) ? 0 : b * M * N),
                      (flags & MM_REDUCE) && b > 0, brow, bcol, 0, 1);
        }
        return;
    }
    if (!(flags & MM_REDUCE) && batch >= threads) {
        #pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t b = 0; b < batch; b++) {
            im2col_view v = view ? im2col_of(B + boff[b], geo_b) : (im2col_view){ 0 };
            gemm_part(ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL, C + b * M * N, 0, brow, bcol, 0, 1);
        }
        return;
    }
    #pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        for (int64_t b = 0; b < batch; b++) {
            im2col_view v = view ? im2col_of(B + boff[b], geo_b) : (im2col_view){ 0 };
            gemm_part(ta, tb, M, N, K, A + aoff[b], B + boff[b], view ? &v : NULL, C + ((flags & MM_REDUCE) ? 0 : b * M * N),
                      (flags & MM_REDUCE) && b > 0, brow, bcol, t, T);
        }
    }
}

#ifdef HAVE_AVX512_GEMM
__m512 _ZGVeN16v_expf(__m512 x);   /* glibc's libmvec (through libm's linker script) */

/* y[0..n) = softmax (or log-softmax) of x[0..n), y[n..zero_to) = 0; sixteen lanes at a time,
 * the sum of the exponentials in double. */
AVX512 static void softmax_row_avx512(const float *x, float *y, int64_t n, int take_log, int64_t zero_to) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, x + k));
    }
    float mx = _mm512_reduce_max_ps(vmax);
    __m512 vmx = _mm512_set1_ps(mx);
    __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
    for (int64_t k = 0; k < n; k += 16) {
        __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
        __m512 e = _mm512_maskz_mov_ps(m, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + k), vmx)));
        if (!take_log) _mm512_mask_storeu_ps(y + k, m, e);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    if (take_log) {
        __m512 lse = _mm512_set1_ps((float)(mx + log(sum)));
        for (int64_t k = 0; k < n; k += 16) {
            __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
            _mm512_mask_storeu_ps(y + k, m, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + k), lse));
        }
    } else {
        __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
        for (int64_t k = 0; k < n; k += 16) {
            __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);
            _mm512_mask_storeu_ps(y + k, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + k), inv));
        }
    }
    for (int64_t k = n; k < zero_to; k++) y[k] = 0.0f;
}
#endif

/* a = {outer, len, inner, log}; p = {in, out}: softmax (or log-softmax) along the middle axis. */
static void k_softmax(const int64_t *a, void *const *p) {
    int64_t outer = a[0], len = a[1], inner = a[2];
    int take_log = (int)a[3];
    const float *in = p[0];
    float *out = p[1];
#ifdef HAVE_AVX512_GEMM
    if (inner == 1 && have_avx512()) {   /* contiguous rows */
        #pragma omp parallel for schedule(static) if (outer * len >= PARALLEL_WORK)
        for (int64_t o = 0; o < outer; o++) softmax_row_avx512(in + o * len, out + o * len, len, take_log, len);
        return;
    }
#endif
    #pragma omp parallel for schedule(static) if (outer * len * inner >= PARALLEL_WORK)
    for (int64_t oi = 0; oi < outer * inner; oi++) {
        const float *x = in + (oi / inner) * len * inner + oi % inner;
        float *y = out + (oi / inner) * len * inner + oi % inner;
        float mx = -INFINITY;
        for (int64_t k = 0; k < len; k++) mx = fmaxf(mx, x[k * inner]);
        double sum = 0;
        for (int64_t k = 0; k < len; k++) sum += exp((double)x[k * inner] - mx);
        if (take_log) {
            float lse = (float)(mx + log(sum));
            for (int64_t k = 0; k < len; k++) y[k * inner] = x[k * inner] - lse;
        } else {
            for (int64_t k = 0; k < len; k++) y[k * inner] = (float)(exp((double)x[k * inner] - mx) / sum);
        }
    }
}

/* a = {batch, rows, cols}; p = {in, out}: row r keeps columns c <= r. */
static void k_softmax_causal(const int64_t *a, void *const *p) {
    int64_t rows = a[1], cols = a[2];
    const float *in = p[0];
    float *out = p[1];
#ifdef HAVE_AVX512_GEMM
    if (have_avx512()) {
        #pragma omp parallel for schedule(static) if (a[0] * rows * cols >= PARALLEL_WORK)
        for (int64_t br = 0; br < a[0] * rows; br++) {
            int64_t r = br % rows, keep = r + 1 < cols ? r + 1 : cols;
            softmax_row_avx512(in + br * cols, out + br * cols, keep, 0, cols);
        }
        return;
    }
#endif
    #pragma omp parallel for schedule(static) if (a[0] * rows * cols >= PARALLEL_WORK)
    for (int64_t br = 0; br < a[0] * rows; br++) {
        int64_t r = br % rows, keep = r + 1 < cols ? r + 1 : cols;
        const float *x = in + br * cols;
        float *y = out + br * cols;
        float mx = -INFINITY;
        for (int64_t c = 0; c < keep; c++) mx = fmaxf(mx, x[c]);
        float sum = 0;
        for (int64_t c = 0; c < keep; c++) {
            y[c] = expf(x[c] - mx);
            sum += y[c];
        }
        float inv = 1.0f / sum;
        for (int64_t c = 0; c < keep; c++) y[c] *= inv;
        for (int64_t c = keep; c < cols; c++) y[c] = 0;
    }
}

/* a = {outer, len, inner, is_min}; p = {in, out i32}: first extreme, NaN counting as extreme. */
static void k_argmax(const int64_t *a, void *const *p) {
    int64_t len = a[1], inner = a[2];
    int is_min = (int)a[3];
    const float *in = p[0];
    int32_t *out = p[1];
    for (int64_t oi = 0; oi < a[0] * inner; oi++) {
        const float *x = in + (oi / inner) * len * inner + oi % inner;
        int64_t best = 0;
        for (int64_t k = 1; k < len && x[best * inner] == x[best * inner]; k++) {
            float v = x[k * inner], b = x[best * inner];
            if (v != v || (is_min ? v < b : v > b)) best = k;
        }
        out[oi] = (int32_t)best;
    }
}

/* a = {n, dim, rows}; p = {values [n, dim], idx i32 [n], out [rows, dim]}. */
static void k_scatter_rows(const int64_t *a, void *const *p) {
    int64_t n = a[0], dim = a[1], rows = a[2];
    const float *v = p[0];
    const int32_t *idx = p[1];
    float *out = p[2];
    memset(out, 0, sizeof(float) * (size_t)(rows * dim));
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= rows) continue;
        float *dst = out + (int64_t)idx[i] * dim;
        for (int64_t d = 0; d < dim; d++) dst[d] += v[i * dim + d];
    }
}

/* a = {outer, n_idx, inner, n_out}; p = {values, idx i32, out}. */
static void k_scatter_along(const int64_t *a, void *const *p) {
    int64_t outer = a[0], nk = a[1], inner = a[2], nout = a[3];
    const float *v = p[0];
    const int32_t *idx = p[1];
    float *out = p[2];
    memset(out, 0, sizeof(float) * (size_t)(outer * nout * inner));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < nk; k++)
            for (int64_t j = 0; j < inner; j++) {
                int64_t at = (o * nk + k) * inner + j;
                if (idx[at] >= 0 && idx[at] < nout) out[(o * nout + idx[at]) * inner + j] += v[at];
            }
}

/* dst[0..n) += src[0..n) */
#ifdef HAVE_AVX512_GEMM
AVX512 static void add_row_avx512(float *dst, const float *src, int64_t n) {
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) _mm512_storeu_ps(dst + k, _mm512_add_ps(_mm512_loadu_ps(dst + k), _mm512_loadu_ps(src + k)));
    if (k < n) {
        __mmask16 m = (__mmask16)((1u << (n - k)) - 1);
        _mm512_mask_storeu_ps(dst + k, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + k), _mm512_maskz_loadu_ps(m, src + k)));
    }
}
#endif

static void add_row(float *dst, const float *src, int64_t n) {
#ifdef HAVE_AVX512_GEMM
    if (have_avx512()) {
        add_row_avx512(dst, src, n);
        return;
    }
#endif
    for (int64_t k = 0; k < n; k++) dst[k] += src[k];
}

/* One image's col2im: img [C, H, W] = the adjoint of im2col applied to cols [C*kh*kw, ho*wo]. */
static void col2im_image(const float *cols, float *img, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t s,
                         int64_t pad) {
    int64_t ho = (H + 2 * pad - kh) / s + 1, wo = (W + 2 * pad - kw) / s + 1;
    memset(img, 0, sizeof(float) * (size_t)(C * H * W));
    for (int64_t c = 0; c < C; c++) {
        float *plane = img + c * H * W;
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                const float *row = cols + ((c * kh + i) * kw + j) * ho * wo;
                /* output columns whose input column x = ox * s - pad + j is inside the image */
                int64_t lo = pad - j > 0 ? (pad - j + s - 1) / s : 0, hi = W - 1 + pad - j >= 0 ? (W - 1 + pad - j) / s + 1 : 0;
                if (hi > wo) hi = wo;
                for (int64_t oy = 0; oy < ho; oy++) {
                    int64_t y = oy * s - pad + i;
                    if (y < 0 || y >= H || hi <= lo) continue;
                    float *dst = plane + y * W + lo * s - pad + j;
                    const float *src = row + oy * wo + lo;
                    if (s == 1) add_row(dst, src, hi - lo);
                    else
                        for (int64_t ox = 0; ox < hi - lo; ox++) dst[ox * s] += src[ox];
                }
            }
    }
}

/* a = {N, C, H, W, kh, kw, stride, pad}; p = {cols [N, C*kh*kw, Ho*Wo], out [N,C,H,W]}. */
static void k_col2im(const int64_t *a, void *const *p) {
    int64_t N = a[0], C = a[1], H = a[2], W = a[3], kh = a[4], kw = a[5], s = a[6], pad = a[7];
    int64_t ho = (H + 2 * pad - kh) / s + 1, wo = (W + 2 * pad - kw) / s + 1;
    const float *cols = p[0];
    float *out = p[1];
    #pragma omp parallel for schedule(static) if (N * C * kh * kw * ho * wo >= PARALLEL_WORK)
    for (int64_t nc = 0; nc < N * C; nc++)
        col2im_image(cols + nc * kh * kw * ho * wo, out + nc * H * W, 1, H, W, kh, kw, s, pad);
}

/* The first maximum (row-major) of the window at (oy, ox) of one image plane, as an offset. */
static int64_t window_argmax(const float *img, int64_t H, int64_t W, int64_t k, int64_t s, int64_t pad, int64_t oy,
                             int64_t ox) {
    int64_t best = -1;
    for (int64_t i = 0; i < k; i++) {
        int64_t y = oy * s - pad + i;
        if (y < 0 || y >= H) continue;
        for (int64_t j = 0; j < k; j++) {
            int64_t x = ox * s - pad + j;
            if (x < 0 || x >= W) continue;
            float v = img[y * W + x];
            if (best < 0 || v > img[best] || (v != v && img[best] == img[best])) best = y * W + x;
        }
    }
    return best;
}

#ifdef HAVE_AVX512_GEMM
/* 2x2 windows, stride 2, of one row pair (r0, r1), sixteen windows per step; out (forward) or
 * gin rows g0, g1 (backward, from gout). */
AVX512 static void maxpool2_rows(const float *r0, const float *r1, int64_t wo, float *out, const float *gout, float *g0,
                                 float *g1) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int64_t ox = 0; ox < wo; ox += 16) {
        int64_t n = wo - ox < 16 ? wo - ox : 16;
        __mmask16 m = (__mmask16)((1u << n) - 1);
        __mmask16 mlo = (__mmask16)(n >= 8 ? 0xffff : (1u << (2 * n)) - 1);
        __mmask16 mhi = (__mmask16)(n <= 8 ? 0 : (1u << (2 * n - 16)) - 1);
        __m512 a0 = _mm512_maskz_loadu_ps(mlo, r0 + 2 * ox), a1 = _mm512_maskz_loadu_ps(mhi, r0 + 2 * ox + 16);
        __m512 b0 = _mm512_maskz_loadu_ps(mlo, r1 + 2 * ox), b1 = _mm512_maskz_loadu_ps(mhi, r1 + 2 * ox + 16);
        __m512 w[4] = { _mm512_permutex2var_ps(a0, even, a1), _mm512_permutex2var_ps(a0, odd, a1),
                        _mm512_permutex2var_ps(b0, even, b1), _mm512_permutex2var_ps(b0, odd, b1) };
        __m512 best = w[0];
        __m512i bi = _mm512_setzero_si512();
        for (int q = 1; q < 4; q++) {
            __mmask16 t = _mm512_cmp_ps_mask(w[q], best, _CMP_GT_OQ) |
                          (_mm512_cmp_ps_mask(w[q], w[q], _CMP_UNORD_Q) & _mm512_cmp_ps_mask(best, best, _CMP_ORD_Q));
            best = _mm512_mask_mov_ps(best, t, w[q]);
            bi = _mm512_mask_mov_epi32(bi, t, _mm512_set1_epi32(q));
        }
        if (out) {
            _mm512_mask_storeu_ps(out + ox, m, best);
            continue;
        }
        __m512 g = _mm512_maskz_loadu_ps(m, gout + ox), z[4];
        for (int q = 0; q < 4; q++) z[q] = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(bi, _mm512_set1_epi32(q)), g);
        _mm512_mask_storeu_ps(g0 + 2 * ox, mlo, _mm512_permutex2var_ps(z[0], lo, z[1]));
        _mm512_mask_storeu_ps(g0 + 2 * ox + 16, mhi, _mm512_permutex2var_ps(z[0], hi, z[1]));
        _mm512_mask_storeu_ps(g1 + 2 * ox, mlo, _mm512_permutex2var_ps(z[2], lo, z[3]));
        _mm512_mask_storeu_ps(g1 + 2 * ox + 16, mhi, _mm512_permutex2var_ps(z[2], hi, z[3]));
    }
}
#endif

/* Windows that tile the image exactly (k = stride, no padding, sizes divisible): no bounds, and
 * the backward writes every input element once, so it needs no zero-fill. The first maximum in
 * row-major order wins, a NaN over a number. */
static void maxpool_tiled(const float *img, int64_t H, int64_t W, int64_t k, const float *gout, float *gin, float *out) {
    int64_t ho = H / k, wo = W / k;
#ifdef HAVE_AVX512_GEMM
    if (k == 2 && have_avx512()) {
        for (int64_t oy = 0; oy < ho; oy++)
            maxpool2_rows(img + 2 * oy * W, img + (2 * oy + 1) * W, wo, out ? out + oy * wo : NULL,
                          gout ? gout + oy * wo : NULL, gin ? gin + 2 * oy * W : NULL, gin ? gin + (2 * oy + 1) * W : NULL);
        return;
    }
#endif
    for (int64_t oy = 0; oy < ho; oy++)
        for (int64_t ox = 0; ox < wo; ox++) {
            const float *w0 = img + oy * k * W + ox * k;
            float bv = w0[0];
            int64_t bi = 0;
            for (int64_t i = 0; i < k; i++)
                for (int64_t j = 0; j < k; j++) {
                    float v = w0[i * W + j];
                    bool take = (v > bv) | ((v != v) & (bv == bv));
                    bv = take ? v : bv;
                    bi = take ? i * W + j : bi;
                }
            if (out) {
                out[oy * wo + ox] = bv;
            } else {
                float g = gout[oy * wo + ox], *d = gin + oy * k * W + ox * k;
                for (int64_t i = 0; i < k; i++)
                    for (int64_t j = 0; j < k; j++) d[i * W + j] = i * W + j == bi ? g : 0.0f;
            }
        }
}

/* a = {N, C, H, W, k, k, stride, pad}; p = {in, out} or, backward, {x, grad out, grad in}. */
static void maxpool(const int64_t *a, void *const *p, bool backward) {
    int64_t N = a[0], C = a[1], H = a[2], W = a[3], k = a[4], s = a[6], pad = a[7];
    int64_t ho = (H + 2 * pad - k) / s + 1, wo = (W + 2 * pad - k) / s + 1;
    const float *x = p[0];
    bool tiled = k == s && pad == 0 && H % k == 0 && W % k == 0;
    if (backward && !tiled) memset(p[2], 0, sizeof(float) * (size_t)(N * C * H * W));
    #pragma omp parallel for schedule(static) if (N * C * H * W >= PARALLEL_WORK)
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *img = x + nc * H * W;
        if (tiled) {
            if (backward) maxpool_tiled(img, H, W, k, (const float *)p[1] + nc * ho * wo, (float *)p[2] + nc * H * W, NULL);
            else maxpool_tiled(img, H, W, k, NULL, NULL, (float *)p[1] + nc * ho * wo);
            continue;
        }
        for (int64_t oy = 0; oy < ho; oy++)
            for (int64_t ox = 0; ox < wo; ox++) {
                int64_t at = window_argmax(img, H, W, k, s, pad, oy, ox), o = (nc * ho + oy) * wo + ox;
                if (backward) {
                    if (at >= 0) ((float *)p[2])[nc * H * W + at] += ((const float *)p[1])[o];
                } else {
                    ((float *)p[1])[o] = at >= 0 ? img[at] : -INFINITY;
                }
            }
    }
}

static void k_maxpool(const int64_t *a, void *const *p) { maxpool(a, p, false); }
static void k_maxpool_bwd(const int64_t *a, void *const *p) { maxpool(a, p, true); }

/* Indexed by the TGK_* enum of the generated prelude (cpu_codegen.c). */
/* TGK_FAILED: whether a kernel failed to get scratch memory (generated code asks before it
 * replaces parameters in place). */
static int k_failed(void) { return scratch_failed; }
bool cpu_kernels_failed(void) { return atomic_exchange(&scratch_failed, 0) != 0; }

void *const cpu_kernels[] = {
    (void *)k_matmul, (void *)k_softmax, (void *)k_softmax_causal, (void *)k_argmax, (void *)k_scatter_rows,
    (void *)k_scatter_along, (void *)k_col2im, (void *)k_maxpool, (void *)k_maxpool_bwd, (void *)k_failed,
    (void *)cpu_attention, (void *)cpu_attention_bwd,
};

void cpu_set_threads(int n) { omp_set_num_threads(n); }

/* OpenBLAS single-threaded for good (see k_matmul); called whenever a CPU graph is prepared,
 * since OpenBLAS may (re)initialise its thread pool after a load-time constructor of ours. */
void cpu_blas_single_threaded(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}
