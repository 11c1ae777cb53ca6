/* Library kernels of the compiled CPU backend: the ops generated code does not inline, in f32
 * with OpenMP. Matrix products (with im2col, col2im and bias folded in) are in cpu_gemm.c; here
 * the row-wise ones (softmax, argmax, scatters, col2im, pooling), the per-thread scratch memory
 * every kernel shares, and the table generated code calls them through. Each kernel takes its
 * constants in `a` and its buffers in `p` (layouts in cpu_codegen.c), so generated code calls
 * them through one function-pointer type. Hot paths have AVX2 and AVX-512 versions, chosen by
 * the run's ISA (cpu_isa.c); portable code otherwise. */
#include "cpu/cpu_kernels.h"

#include <cblas.h>
#include <float.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Per-thread scratch memory, kept for the thread's life (freed when it exits): a product's
 * packing buffers, a convolution's per-image cols, a zero-padded copy of one image. */
typedef struct {
    float *pack, *scratch, *panels, *image;
    size_t pack_len, scratch_len, panels_len, image_len;
} thread_buffers;

static pthread_key_t buffers_key;
static pthread_once_t buffers_once = PTHREAD_ONCE_INIT;

static void buffers_free(void *p) {
    thread_buffers *b = p;
    free(b->pack);
    free(b->scratch);
    free(b->panels);
    free(b->image);
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

void kernel_failed(void) { scratch_failed = 1; }

/* *buf grown to at least n floats (kept as it is when large enough); NULL when out of memory. */
static float *grow(float **buf, size_t *len, size_t n) {
    if (*len < n) {
        free(*buf);
        *buf = tg_alloc_aligned64(n * sizeof(float));
        *len = *buf ? n : 0;
    }
    return *buf;
}

float *kernel_scratch(size_t n) {
    thread_buffers *b = buffers();
    float *s = b ? grow(&b->scratch, &b->scratch_len, n) : NULL;
    if (!s) kernel_failed();
    return s;
}

float *kernel_pack(size_t n) {
    thread_buffers *b = buffers();
    return b ? grow(&b->pack, &b->pack_len, n) : NULL;
}

float *kernel_panels(size_t n) {
    thread_buffers *b = buffers();
    return b ? grow(&b->panels, &b->panels_len, n) : NULL;
}

float *kernel_image(size_t n) {
    thread_buffers *b = buffers();
    return b ? grow(&b->image, &b->image_len, n) : NULL;
}

/* The run's vector path for the row kernels. */
#ifdef CPU_X86
#include <immintrin.h>
static bool use_avx512(void) { return cpu_kernels_isa() == CPU_ISA_AVX512; }
static bool use_avx2(void) { return cpu_kernels_isa() == CPU_ISA_AVX2; }
#endif

#ifdef CPU_X86
__m512 _ZGVeN16v_expf(__m512 x);   /* glibc's libmvec (through libm's linker script) */

/* y[0..n) = softmax (or log-softmax) of x[0..n), y[n..zero_to) = 0; sixteen lanes at a time,
 * the sum of the exponentials in double. */
TARGET_AVX512 static void softmax_row_avx512(const float *x, float *y, int64_t n, int take_log, int64_t zero_to) {
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

__m256 _ZGVdN8v_expf(__m256 x);   /* libmvec's AVX2 expf */

/* The sum of a vector's eight lanes, in double. */
TARGET_AVX2 static double sum8(__m256 v) {
    __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* softmax_row_avx512 in eight lanes: whole vectors, then the tail one element at a time. The sum
 * of the exponentials is accumulated in double per vector (as the reference does). */
TARGET_AVX2 static void softmax_row_avx2(const float *x, float *y, int64_t n, int take_log, int64_t zero_to) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int64_t k = 0, n8 = n / 8 * 8;
    for (; k < n8; k += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + k));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float mx = fmaxf(_mm_cvtss_f32(m4), _mm_cvtss_f32(_mm_movehdup_ps(m4)));
    for (; k < n; k++) mx = fmaxf(mx, x[k]);
    __m256 vmx = _mm256_set1_ps(mx);
    double sum = 0;
    for (k = 0; k < n8; k += 8) {
        __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + k), vmx));
        if (!take_log) _mm256_storeu_ps(y + k, e);
        sum += sum8(e);
    }
    for (; k < n; k++) {
        float e = expf(x[k] - mx);
        if (!take_log) y[k] = e;
        sum += e;
    }
    if (take_log) {
        float lse = (float)(mx + log(sum));
        __m256 vl = _mm256_set1_ps(lse);
        for (k = 0; k < n8; k += 8) _mm256_storeu_ps(y + k, _mm256_sub_ps(_mm256_loadu_ps(x + k), vl));
        for (; k < n; k++) y[k] = x[k] - lse;
    } else {
        float inv = (float)(1.0 / sum);
        __m256 vi = _mm256_set1_ps(inv);
        for (k = 0; k < n8; k += 8) _mm256_storeu_ps(y + k, _mm256_mul_ps(_mm256_loadu_ps(y + k), vi));
        for (; k < n; k++) y[k] *= inv;
    }
    for (k = n; k < zero_to; k++) y[k] = 0.0f;
}

/* The run's vector softmax row (or NULL: the portable loops). */
typedef void (*softmax_row_fn)(const float *x, float *y, int64_t n, int take_log, int64_t zero_to);
static softmax_row_fn softmax_row(void) {
    return use_avx512() ? softmax_row_avx512 : use_avx2() ? softmax_row_avx2 : NULL;
}
#endif

/* a = {outer, len, inner, log}; p = {in, out}: softmax (or log-softmax) along the middle axis. */
static void k_softmax(const int64_t *a, void *const *p) {
    int64_t outer = a[0], len = a[1], inner = a[2];
    int take_log = (int)a[3];
    const float *in = p[0];
    float *out = p[1];
#ifdef CPU_X86
    softmax_row_fn row = softmax_row();
    if (inner == 1 && row) {   /* contiguous rows */
        #pragma omp parallel if (outer * len >= PARALLEL_WORK)
        {
            const unsigned fp = fp_flush_denormals();
            #pragma omp for schedule(static)
            for (int64_t o = 0; o < outer; o++) row(in + o * len, out + o * len, len, take_log, len);
            fp_restore(fp);
        }
        return;
    }
#endif
    #pragma omp parallel if (outer * len * inner >= PARALLEL_WORK)
    {
        const unsigned fp = fp_flush_denormals();
        #pragma omp for schedule(static)
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
        fp_restore(fp);
    }
}

/* a = {batch, rows, cols}; p = {in, out}: row r keeps columns c <= r. */
static void k_softmax_causal(const int64_t *a, void *const *p) {
    int64_t rows = a[1], cols = a[2];
    const float *in = p[0];
    float *out = p[1];
#ifdef CPU_X86
    softmax_row_fn row = softmax_row();
    if (row) {
        #pragma omp parallel if (a[0] * rows * cols >= PARALLEL_WORK)
        {
            const unsigned fp = fp_flush_denormals();
            #pragma omp for schedule(static)
            for (int64_t br = 0; br < a[0] * rows; br++) {
                int64_t r = br % rows, keep = r + 1 < cols ? r + 1 : cols;
                row(in + br * cols, out + br * cols, keep, 0, cols);
            }
            fp_restore(fp);
        }
        return;
    }
#endif
    #pragma omp parallel if (a[0] * rows * cols >= PARALLEL_WORK)
    {
        const unsigned fp = fp_flush_denormals();
        #pragma omp for schedule(static)
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
        fp_restore(fp);
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
#ifdef CPU_X86
TARGET_AVX512 static void add_row_avx512(float *dst, const float *src, int64_t n) {
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) _mm512_storeu_ps(dst + k, _mm512_add_ps(_mm512_loadu_ps(dst + k), _mm512_loadu_ps(src + k)));
    if (k < n) {
        __mmask16 m = (__mmask16)((1u << (n - k)) - 1);
        _mm512_mask_storeu_ps(dst + k, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + k), _mm512_maskz_loadu_ps(m, src + k)));
    }
}

TARGET_AVX2 static void add_row_avx2(float *dst, const float *src, int64_t n) {
    int64_t k = 0;
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, _mm256_add_ps(_mm256_loadu_ps(dst + k), _mm256_loadu_ps(src + k)));
    for (; k < n; k++) dst[k] += src[k];
}
#endif

static void add_row(float *dst, const float *src, int64_t n) {
#ifdef CPU_X86
    if (use_avx512()) {
        add_row_avx512(dst, src, n);
        return;
    }
    if (use_avx2()) {
        add_row_avx2(dst, src, n);
        return;
    }
#endif
    for (int64_t k = 0; k < n; k++) dst[k] += src[k];
}

/* One image's col2im: img [C, H, W] = the adjoint of im2col applied to cols [C*kh*kw, ho*wo]. */
void col2im_image(const float *cols, float *img, int64_t C, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t s,
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
    #pragma omp parallel if (N * C * kh * kw * ho * wo >= PARALLEL_WORK)
    {
        const unsigned fp = fp_flush_denormals();
        #pragma omp for schedule(static)
        for (int64_t nc = 0; nc < N * C; nc++)
            col2im_image(cols + nc * kh * kw * ho * wo, out + nc * H * W, 1, H, W, kh, kw, s, pad);
        fp_restore(fp);
    }
}

/* The first maximum (row-major) of a window: the exported files' own (one source). */
#define TGK_USE_WINDOW_ARGMAX
#include "export/portable_kernels.h"

#ifdef CPU_X86
/* 2x2 windows, stride 2, of one row pair (r0, r1), sixteen windows per step; out (forward) or
 * gin rows g0, g1 (backward, from gout). */
TARGET_AVX512 static void maxpool2_rows(const float *r0, const float *r1, int64_t wo, float *out, const float *gout, float *g0,
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

/* maxpool2_rows in eight lanes, for the whole groups of eight windows; returns how many windows
 * it did (the caller does the rest). Even and odd columns are split with in-lane shuffles and a
 * cross-lane permute (and joined back the same way in the backward). */
TARGET_AVX2 static int64_t maxpool2_rows_avx2(const float *r0, const float *r1, int64_t wo, float *out, const float *gout,
                                              float *g0, float *g1) {
    int64_t ox = 0;
    for (; ox + 8 <= wo; ox += 8) {
        __m256 w[4];
        for (int row = 0; row < 2; row++) {
            const float *r = row ? r1 : r0;
            __m256 a0 = _mm256_loadu_ps(r + 2 * ox), a1 = _mm256_loadu_ps(r + 2 * ox + 8);
            w[2 * row] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a0, a1, 0x88)), 0xD8));
            w[2 * row + 1] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a0, a1, 0xDD)), 0xD8));
        }
        __m256 best = w[0], bi = _mm256_setzero_ps();   /* bi: the winning window element, as a float 0..3 */
        for (int q = 1; q < 4; q++) {
            __m256 take = _mm256_or_ps(_mm256_cmp_ps(w[q], best, _CMP_GT_OQ),
                                       _mm256_and_ps(_mm256_cmp_ps(w[q], w[q], _CMP_UNORD_Q), _mm256_cmp_ps(best, best, _CMP_ORD_Q)));
            best = _mm256_blendv_ps(best, w[q], take);
            bi = _mm256_blendv_ps(bi, _mm256_set1_ps((float)q), take);
        }
        if (out) {
            _mm256_storeu_ps(out + ox, best);
            continue;
        }
        __m256 g = _mm256_loadu_ps(gout + ox), z[4];
        for (int q = 0; q < 4; q++) {
            z[q] = _mm256_and_ps(_mm256_cmp_ps(bi, _mm256_set1_ps((float)q), _CMP_EQ_OQ), g);
            z[q] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(z[q]), 0xD8));
        }
        _mm256_storeu_ps(g0 + 2 * ox, _mm256_unpacklo_ps(z[0], z[1]));
        _mm256_storeu_ps(g0 + 2 * ox + 8, _mm256_unpackhi_ps(z[0], z[1]));
        _mm256_storeu_ps(g1 + 2 * ox, _mm256_unpacklo_ps(z[2], z[3]));
        _mm256_storeu_ps(g1 + 2 * ox + 8, _mm256_unpackhi_ps(z[2], z[3]));
    }
    return ox;
}
#endif

/* Windows [ox0, ox1) of output row oy, one at a time (maxpool_tiled's portable path and the
 * AVX2 path's tails). */
static void maxpool_tiled_row(const float *img, int64_t W, int64_t k, int64_t oy, int64_t ox0, int64_t ox1, int64_t wo,
                              const float *gout, float *gin, float *out) {
    for (int64_t ox = ox0; ox < ox1; ox++) {
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

/* Windows that tile the image exactly (k = stride, no padding, sizes divisible): no bounds, and
 * the backward writes every input element once, so it needs no zero-fill. The first maximum in
 * row-major order wins, a NaN over a number. */
static void maxpool_tiled(const float *img, int64_t H, int64_t W, int64_t k, const float *gout, float *gin, float *out) {
    int64_t ho = H / k, wo = W / k;
    for (int64_t oy = 0; oy < ho; oy++) {
        int64_t done = 0;
#ifdef CPU_X86
        if (k == 2 && (use_avx512() || use_avx2())) {
            const float *r0 = img + 2 * oy * W, *r1 = r0 + W;
            float *o = out ? out + oy * wo : NULL, *g0 = gin ? gin + 2 * oy * W : NULL, *g1 = gin ? g0 + W : NULL;
            const float *go = gout ? gout + oy * wo : NULL;
            if (use_avx512()) maxpool2_rows(r0, r1, wo, o, go, g0, g1), done = wo;
            else done = maxpool2_rows_avx2(r0, r1, wo, o, go, g0, g1);
        }
#endif
        maxpool_tiled_row(img, W, k, oy, done, wo, wo, gout, gin, out);
    }
}

/* g[i] = g[i] * step(x[i]) (x > 0 ? 1 : 0), as the graph's product computes it (a NaN or
 * infinite g times 0 is NaN), with step's 1.0f or 0.0f made from the comparison's bits: written
 * as a choice, GCC makes it a branch per element, which relu's outputs, positive at random,
 * mispredict every other time (a quarter of a CNN's step); this way the loop vectorizes. */
static inline float step_bits(float x) {
    uint32_t b = (uint32_t)-(int32_t)(x > 0.0f) & 0x3f800000u;   /* 1.0f or 0.0f */
    float m;
    memcpy(&m, &b, sizeof m);
    return m;
}

static void mask_by_step(float *g, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) g[i] = g[i] * step_bits(x[i]);
}

/* a = {N, C, H, W, k, k, stride, pad}; p = {in, out} or, backward (a[8]: mask), {x, grad out,
 * grad in}. With the mask, grad in is then multiplied by step(x) (x > 0 ? 1 : 0), plane by plane
 * while it is in cache: the gradient of max_pool2d(relu(.)) through the relu too, which else is
 * one more pass over the layer's activations. */
static void maxpool(const int64_t *a, void *const *p, bool backward) {
    int64_t N = a[0], C = a[1], H = a[2], W = a[3], k = a[4], s = a[6], pad = a[7];
    int64_t ho = (H + 2 * pad - k) / s + 1, wo = (W + 2 * pad - k) / s + 1;
    const float *x = p[0];
    bool tiled = k == s && pad == 0 && H % k == 0 && W % k == 0;
    if (backward && !tiled) memset(p[2], 0, sizeof(float) * (size_t)(N * C * H * W));
    #pragma omp parallel if (N * C * H * W >= PARALLEL_WORK)
    {
        const unsigned fp = fp_flush_denormals();
        #pragma omp for schedule(static)
        for (int64_t nc = 0; nc < N * C; nc++) {
            const float *img = x + nc * H * W;
            if (tiled) {
                if (backward) maxpool_tiled(img, H, W, k, (const float *)p[1] + nc * ho * wo, (float *)p[2] + nc * H * W, NULL);
                else maxpool_tiled(img, H, W, k, NULL, NULL, (float *)p[1] + nc * ho * wo);
            } else {
                for (int64_t oy = 0; oy < ho; oy++)
                    for (int64_t ox = 0; ox < wo; ox++) {
                        int64_t at = tgk_window_argmax(img, H, W, k, s, pad, oy, ox), o = (nc * ho + oy) * wo + ox;
                        if (backward) {
                            if (at >= 0) ((float *)p[2])[nc * H * W + at] += ((const float *)p[1])[o];
                        } else {
                            ((float *)p[1])[o] = at >= 0 ? img[at] : -INFINITY;
                        }
                    }
            }
            if (backward && a[8]) mask_by_step((float *)p[2] + nc * H * W, img, H * W);
        }
        fp_restore(fp);
    }
}

static void k_maxpool(const int64_t *a, void *const *p) { maxpool(a, p, false); }
static void k_maxpool_bwd(const int64_t *a, void *const *p) { maxpool(a, p, true); }

/* Indexed by the TGK_* enum of the generated prelude (cpu_codegen.c). */
/* TGK_FAILED: whether a kernel failed to get scratch memory (generated code asks before it
 * replaces parameters in place). */
static int k_failed(void) { return scratch_failed; }
bool cpu_kernels_failed(void) { return atomic_exchange(&scratch_failed, 0) != 0; }

/* TGK_MARK (a profiled entry's, between its calls): the time since the last mark is node's; -1
 * starts a step. */
static _Thread_local cpu_profile *profiling;
void cpu_profile_begin(cpu_profile *p) { profiling = p; }
static void k_mark(int node) {
    cpu_profile *p = profiling;
    if (!p) return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    if (node >= 0) p->seconds[node] += t - p->last;
    p->last = t;
}

void *const cpu_kernels[] = {
    (void *)k_matmul, (void *)k_softmax, (void *)k_softmax_causal, (void *)k_argmax, (void *)k_scatter_rows,
    (void *)k_scatter_along, (void *)k_col2im, (void *)k_maxpool, (void *)k_maxpool_bwd, (void *)k_failed,
    (void *)cpu_attention, (void *)cpu_attention_bwd, (void *)k_mark,
};

void cpu_set_threads(int n) { omp_set_num_threads(n); }

/* OpenBLAS single-threaded for good (see k_matmul); called whenever a CPU graph is prepared,
 * since OpenBLAS may (re)initialise its thread pool after a load-time constructor of ours. */
void cpu_blas_single_threaded(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}
