/* Library kernels of the compiled CPU backend: the ops generated code does not inline (matrix
 * products through OpenBLAS, row-wise softmax, argmax, scatters, pooling), in f32 with OpenMP.
 * Each takes its constants in `a` and its buffers in `p` (layouts in codegen_c.c), so generated
 * code calls them through one function-pointer type. */
#include "internal.h"

#include <cblas.h>
#include <float.h>
#include <omp.h>
#include <string.h>

/* Rows are spread over threads only when there is enough work to pay for waking them. */
#define PARALLEL_WORK 32768

/* One product C[rows r0..r1) = op(A) op(B) on the calling thread; op(A)'s rows are A's rows, or
 * its columns when transposed, so a row block is an offset either way. */
static void sgemm_rows(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C,
                       int64_t r0, int64_t r1) {
    if (r1 <= r0) return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)(r1 - r0),
                (blasint)N, (blasint)K, 1.0f, A + (ta ? r0 : r0 * K), (blasint)(ta ? M : K), B, (blasint)(tb ? K : N),
                0.0f, C + r0 * N, (blasint)N);
}

/* a = {ta, tb, M, N, K, batch, A offsets[batch], B offsets[batch]}; p = {A, B, C}.
 * OpenBLAS runs single-threaded (its own thread pool fights OpenMP's); threads split the batch
 * or, for one large product, its rows. */
static void k_matmul(const int64_t *a, void *const *p) {
    int ta = (int)a[0], tb = (int)a[1];
    int64_t M = a[2], N = a[3], K = a[4], batch = a[5];
    const float *A = p[0], *B = p[1];
    float *C = p[2];
    int threads = omp_get_max_threads();
    bool big = M * N * K >= 4 * PARALLEL_WORK;
    if (batch >= threads && batch > 1) {
        #pragma omp parallel for schedule(static) if (big || batch * M * N * K >= 4 * PARALLEL_WORK)
        for (int64_t b = 0; b < batch; b++) sgemm_rows(ta, tb, M, N, K, A + a[6 + b], B + a[6 + batch + b], C + b * M * N, 0, M);
        return;
    }
    for (int64_t b = 0; b < batch; b++) {
        const float *Ab = A + a[6 + b], *Bb = B + a[6 + batch + b];
        float *Cb = C + b * M * N;
        #pragma omp parallel for schedule(static) if (big)
        for (int t = 0; t < threads; t++) sgemm_rows(ta, tb, M, N, K, Ab, Bb, Cb, M * t / threads, M * (t + 1) / threads);
    }
}

/* a = {outer, len, inner, log}; p = {in, out}: softmax (or log-softmax) along the middle axis. */
static void k_softmax(const int64_t *a, void *const *p) {
    int64_t outer = a[0], len = a[1], inner = a[2];
    int take_log = (int)a[3];
    const float *in = p[0];
    float *out = p[1];
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

/* a = {N, C, H, W, kh, kw, stride, pad}; p = {cols [N, C*kh*kw, Ho*Wo], out [N,C,H,W]}. */
static void k_col2im(const int64_t *a, void *const *p) {
    int64_t N = a[0], C = a[1], H = a[2], W = a[3], kh = a[4], kw = a[5], s = a[6], pad = a[7];
    int64_t ho = (H + 2 * pad - kh) / s + 1, wo = (W + 2 * pad - kw) / s + 1;
    const float *cols = p[0];
    float *out = p[1];
    memset(out, 0, sizeof(float) * (size_t)(N * C * H * W));
    #pragma omp parallel for schedule(static) if (N * C * kh * kw * ho * wo >= PARALLEL_WORK)
    for (int64_t nc = 0; nc < N * C; nc++) {
        float *img = out + nc * H * W;
        for (int64_t i = 0; i < kh; i++)
            for (int64_t j = 0; j < kw; j++) {
                const float *row = cols + ((nc * kh + i) * kw + j) * ho * wo;
                for (int64_t oy = 0; oy < ho; oy++) {
                    int64_t y = oy * s - pad + i;
                    if (y < 0 || y >= H) continue;
                    for (int64_t ox = 0; ox < wo; ox++) {
                        int64_t x = ox * s - pad + j;
                        if (x >= 0 && x < W) img[y * W + x] += row[oy * wo + ox];
                    }
                }
            }
    }
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

/* a = {N, C, H, W, k, k, stride, pad}; p = {in, out} or, backward, {x, grad out, grad in}. */
static void maxpool(const int64_t *a, void *const *p, bool backward) {
    int64_t N = a[0], C = a[1], H = a[2], W = a[3], k = a[4], s = a[6], pad = a[7];
    int64_t ho = (H + 2 * pad - k) / s + 1, wo = (W + 2 * pad - k) / s + 1;
    const float *x = p[0];
    if (backward) memset(p[2], 0, sizeof(float) * (size_t)(N * C * H * W));
    #pragma omp parallel for schedule(static) if (N * C * H * W >= PARALLEL_WORK)
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *img = x + nc * H * W;
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

/* Indexed by the TGK_* enum of the generated prelude (codegen_c.c). */
void *const cpu_kernels[] = {
    (void *)k_matmul, (void *)k_softmax, (void *)k_softmax_causal, (void *)k_argmax, (void *)k_scatter_rows,
    (void *)k_scatter_along, (void *)k_col2im, (void *)k_maxpool, (void *)k_maxpool_bwd,
};

void cpu_set_threads(int n) { omp_set_num_threads(n); }

/* OpenBLAS single-threaded for good (see k_matmul); called whenever a CPU graph is prepared,
 * since OpenBLAS may (re)initialise its thread pool after a load-time constructor of ours. */
void cpu_blas_single_threaded(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}
