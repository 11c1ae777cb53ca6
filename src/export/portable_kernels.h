/* Portable library kernels: the ops generated C does not inline (matrix products with a bias,
 * im2col, col2im or a batch sum folded in; softmax rows, causal softmax, argmax, scatters,
 * col2im, max pooling, attention), in plain C99 with libm only: no intrinsics, no threads (unless
 * TGK_OPENMP), no allocation, no global state.
 *
 * One source, two uses. tg_export_c embeds this text in every exported model (a Makefile rule
 * turns it into a string literal, build/gen/export/portable_kernels.inc), after defining
 * TGK_USE_<KERNEL> for each kernel that model calls, so a file compiles only what it uses. The
 * library compiles it with every kernel (export_kernels.c), and the tests run the CPU backend's
 * generated code on these kernels for every op, forward and backward, against the reference.
 *
 * Not a header: it defines static functions, and has no include guard. The argument layouts
 * (constants in a, buffers in p) are cpu_kernels.c's, since the generator emits the same calls
 * for both; each kernel states its own. Loops run in the order that reads memory contiguously;
 * products accumulate in float (as BLAS does), softmax sums in double (as the library's vector
 * kernels do). TGK_OPENMP (an export with OpenMP pragmas) splits products' rows over threads. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(TGK_USE_MATMUL)
/* Flags of a product (a[6]), as cpu_codegen.c emits them. */
enum { TGK_MM_REDUCE = 1, TGK_MM_IM2COL_B = 2, TGK_MM_COL2IM_C = 4, TGK_MM_BIAS_ROW = 8, TGK_MM_BIAS_COL = 16, TGK_MM_RELU = 64 };

/* An image x [C, H, W] read as its im2col matrix cols [C*kh*kw, ho*wo] without materializing
 * it: g = {C, H, W, kh, kw, stride, pad}. */
typedef struct { const float *x; int64_t C, H, W, kh, kw, s, pad, ho, wo; } tgk_view;

static tgk_view tgk_view_of(const float *x, const int64_t *g) {
    tgk_view v;
    v.x = x;
    v.C = g[0];
    v.H = g[1];
    v.W = g[2];
    v.kh = g[3];
    v.kw = g[4];
    v.s = g[5];
    v.pad = g[6];
    v.ho = (v.H + 2 * v.pad - v.kh) / v.s + 1;
    v.wo = (v.W + 2 * v.pad - v.kw) / v.s + 1;
    return v;
}

/* cols[r, j]: row r = (c*kh + i)*kw + jj, column j = oy*wo + ox holds x[c, oy*s - pad + i,
 * ox*s - pad + jj], or 0 in the padding. */
static float tgk_col(const tgk_view *v, int64_t r, int64_t j) {
    int64_t c = r / (v->kh * v->kw), i = r / v->kw % v->kh, jj = r % v->kw;
    int64_t y = j / v->wo * v->s - v->pad + i, x = j % v->wo * v->s - v->pad + jj;
    return y >= 0 && y < v->H && x >= 0 && x < v->W ? v->x[(c * v->H + y) * v->W + x] : 0.0f;
}

/* The range [lo, hi) of output positions o (0 <= o < n) whose input position o*s - pad + tap
 * lies in [0, size): the others read padding, zeros. */
static void tgk_inside(int64_t size, int64_t s, int64_t pad, int64_t tap, int64_t n, int64_t *lo, int64_t *hi) {
    *lo = pad - tap > 0 ? (pad - tap + s - 1) / s : 0;
    *hi = size - 1 + pad - tap >= 0 ? (size - 1 + pad - tap) / s + 1 : 0;
    if (*hi > n) *hi = n;
}

/* C [M, ho*wo] += op(A) cols, with cols an im2col view: row r of cols is one tap (c, i, jj) of
 * the kernel over the image, read where it lies inside the image; its geometry is worked out
 * once and serves every row of C. */
static void tgk_view_product(int ta, const float *A, int64_t M, int64_t K, const tgk_view *v, float *C) {
    int64_t N = v->ho * v->wo;
    for (int64_t r = 0; r < K; r++) {
        int64_t c = r / (v->kh * v->kw), i = r / v->kw % v->kh, jj = r % v->kw, ylo, yhi, xlo, xhi;
        const float *restrict plane = v->x + c * v->H * v->W;
        tgk_inside(v->H, v->s, v->pad, i, v->ho, &ylo, &yhi);
        tgk_inside(v->W, v->s, v->pad, jj, v->wo, &xlo, &xhi);
        for (int64_t m = 0; m < M; m++) {
            float a = ta ? A[r * M + m] : A[m * K + r];
            for (int64_t oy = ylo; oy < yhi; oy++) {
                float *restrict o = C + m * N + oy * v->wo;
                int64_t base = (oy * v->s - v->pad + i) * v->W - v->pad + jj;   /* input of column 0 */
                if (v->s == 1)
                    for (int64_t ox = xlo; ox < xhi; ox++) o[ox] += a * plane[base + ox];
                else
                    for (int64_t ox = xlo; ox < xhi; ox++) o[ox] += a * plane[base + ox * v->s];
            }
        }
    }
}

/* op(A)[i, k] and op(B)[k, j] of one product: A stored [M, K] (or [K, M] transposed), B stored
 * [K, N] (or [N, K]) or an im2col view. */
static float tgk_a_at(int ta, const float *A, int64_t M, int64_t K, int64_t i, int64_t k) {
    return ta ? A[k * M + i] : A[i * K + k];
}
static float tgk_b_at(int tb, const float *B, const tgk_view *v, int64_t K, int64_t N, int64_t k, int64_t j) {
    if (v) return tb ? tgk_col(v, j, k) : tgk_col(v, k, j);
    return tb ? B[j * K + k] : B[k * N + j];
}

/* c[0..N) += sum over k of a[k * as] B[k, 0..N) (B [K, N] row-major): TGK_NR columns at a time,
 * held in registers over the whole depth. The fixed width lets even -O2 vectorize the inner
 * loops; each element still sums its terms in order of k. */
#define TGK_NR 8
static void tgk_dense_row(const float *a, int64_t as, const float *B, int64_t N, int64_t K, float *restrict c) {
    int64_t j = 0;
    for (; j + TGK_NR <= N; j += TGK_NR) {
        float acc[TGK_NR];
        for (int t = 0; t < TGK_NR; t++) acc[t] = c[j + t];
        for (int64_t k = 0; k < K; k++) {
            const float ak = a[k * as], *restrict b = B + k * N + j;
            for (int t = 0; t < TGK_NR; t++) acc[t] += ak * b[t];
        }
        for (int t = 0; t < TGK_NR; t++) c[j + t] = acc[t];
    }
    for (; j < N; j++) {
        float sum = c[j];
        for (int64_t k = 0; k < K; k++) sum += a[k * as] * B[k * N + j];
        c[j] = sum;
    }
}

/* One product: C [M, N] (+)= op(A) op(B). Unless acc, C starts from a bias per row (brow), per
 * column (bcol) or 0. Untransposed B: rows of C accumulate rows of B (contiguous), or of an
 * im2col view; transposed B: each element is a dot product of two rows. */
static void tgk_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B, const tgk_view *v,
                     float *C, int acc, const float *brow, const float *bcol) {
    int64_t i;
    for (i = 0; i < M && !acc; i++)
        for (int64_t j = 0; j < N; j++) C[i * N + j] = brow ? brow[i] : bcol ? bcol[j] : 0.0f;
    if (v && !tb) {
        tgk_view_product(ta, A, M, K, v, C);
        return;
    }
#if defined(TGK_OPENMP)
    #pragma omp parallel for schedule(static) if (M * N * K >= (1 << 21))
#endif
    for (i = 0; i < M; i++) {
        float *restrict c = C + i * N;
        if (!tb) {
            tgk_dense_row(ta ? A + i : A + i * K, ta ? M : 1, B, N, K, c);
        } else {
            for (int64_t j = 0; j < N; j++) {
                float sum = 0.0f;
                for (int64_t k = 0; k < K; k++) sum += tgk_a_at(ta, A, M, K, i, k) * tgk_b_at(tb, B, v, K, N, k, j);
                c[j] += sum;
            }
        }
    }
}

/* One product whose cols [M, N] go through col2im into img [C, H, W] (geometry g, as a view's):
 * zero-filled, then each element added to the pixel it stands for. Elements are dot products,
 * so no scratch cols matrix is needed. */
static void tgk_gemm_col2im(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, const float *B, const tgk_view *v,
                            const int64_t *g, float *img) {
    tgk_view o = tgk_view_of(0, g);
    memset(img, 0, sizeof(float) * (size_t)(o.C * o.H * o.W));
    for (int64_t r = 0; r < M; r++) {
        int64_t c = r / (o.kh * o.kw), i = r / o.kw % o.kh, jj = r % o.kw;
        for (int64_t j = 0; j < N; j++) {
            int64_t y = j / o.wo * o.s - o.pad + i, x = j % o.wo * o.s - o.pad + jj;
            if (y < 0 || y >= o.H || x < 0 || x >= o.W) continue;
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++) sum += tgk_a_at(ta, A, M, K, r, k) * tgk_b_at(tb, B, v, K, N, k, j);
            img[(c * o.H + y) * o.W + x] += sum;
        }
    }
}

/* a = {ta, tb, M, N, K, batch, flags, [im2col geometry of B: C H W kh kw stride pad], [col2im
 * geometry of C: the same], A offsets[batch], B offsets[batch]}; p = {A, B, C, [bias]}.
 * C[b] = op(A[b]) op(B[b]) for each batch element b. TGK_MM_REDUCE: C = the sum over b.
 * TGK_MM_IM2COL_B: B[b] is the im2col view of the image at B + offset. TGK_MM_COL2IM_C: C[b] goes
 * through col2im into image b of C. TGK_MM_BIAS_ROW / _COL: p[3] is a bias added to every
 * product, one value per row / per column. TGK_MM_RELU (without _REDUCE and _COL2IM_C): C[b]
 * then goes through relu (NaN to 0). */
static void tgk_matmul(const int64_t *a, void *const *p) {
    int ta = (int)a[0], tb = (int)a[1], flags = (int)a[6];
    int64_t M = a[2], N = a[3], K = a[4], batch = a[5];
    const int64_t *geo_b = a + 7, *geo_c = geo_b + ((flags & TGK_MM_IM2COL_B) ? 7 : 0);
    const int64_t *aoff = geo_c + ((flags & TGK_MM_COL2IM_C) ? 7 : 0), *boff = aoff + batch;
    const float *A = (const float *)p[0], *B = (const float *)p[1];
    float *C = (float *)p[2];
    const float *brow = (flags & TGK_MM_BIAS_ROW) ? (const float *)p[3] : 0;
    const float *bcol = (flags & TGK_MM_BIAS_COL) ? (const float *)p[3] : 0;
    for (int64_t b = 0; b < batch; b++) {
        tgk_view v;
        const tgk_view *view = 0;
        if (flags & TGK_MM_IM2COL_B) {
            v = tgk_view_of(B + boff[b], geo_b);
            view = &v;
        }
        if (flags & TGK_MM_COL2IM_C)
            tgk_gemm_col2im(ta, tb, M, N, K, A + aoff[b], B + boff[b], view, geo_c, C + b * geo_c[0] * geo_c[1] * geo_c[2]);
        else
            tgk_gemm(ta, tb, M, N, K, A + aoff[b], B + boff[b], view, C + ((flags & TGK_MM_REDUCE) ? 0 : b * M * N),
                     (flags & TGK_MM_REDUCE) && b > 0, brow, bcol);
        if ((flags & TGK_MM_RELU) && !(flags & (TGK_MM_REDUCE | TGK_MM_COL2IM_C)))
            for (float *c = C + b * M * N; c < C + (b + 1) * M * N; c++) *c = *c > 0.0f ? *c : 0.0f;
    }
}
#endif

#if defined(TGK_USE_SOFTMAX) || defined(TGK_USE_SOFTMAX_CAUSAL)
/* y[k * inner] for k < n = the softmax (or log-softmax) of x[k * inner], and 0 for n <= k <
 * zero_to: the exponentials in float, their sum in double. */
static void tgk_softmax_row(const float *x, float *y, int64_t inner, int64_t n, int take_log, int64_t zero_to) {
    float mx = -INFINITY;
    double sum = 0;
    for (int64_t k = 0; k < n; k++) mx = fmaxf(mx, x[k * inner]);
    for (int64_t k = 0; k < n; k++) {
        float e = expf(x[k * inner] - mx);
        if (!take_log) y[k * inner] = e;
        sum += e;
    }
    if (take_log) {
        float lse = (float)(mx + log(sum));
        for (int64_t k = 0; k < n; k++) y[k * inner] = x[k * inner] - lse;
    } else {
        float inv = (float)(1.0 / sum);
        for (int64_t k = 0; k < n; k++) y[k * inner] *= inv;
    }
    for (int64_t k = n; k < zero_to; k++) y[k * inner] = 0.0f;
}
#endif

#if defined(TGK_USE_SOFTMAX)
/* a = {outer, len, inner, log}; p = {in, out}: softmax (or log-softmax) along the middle axis. */
static void tgk_softmax(const int64_t *a, void *const *p) {
    int64_t len = a[1], inner = a[2];
    const float *in = (const float *)p[0];
    float *out = (float *)p[1];
    for (int64_t oi = 0; oi < a[0] * inner; oi++) {
        int64_t at = (oi / inner) * len * inner + oi % inner;
        tgk_softmax_row(in + at, out + at, inner, len, (int)a[3], len);
    }
}
#endif

#if defined(TGK_USE_SOFTMAX_CAUSAL)
/* a = {batch, rows, cols}; p = {in, out}: row r is the softmax of its columns c <= r, 0 after. */
static void tgk_softmax_causal(const int64_t *a, void *const *p) {
    int64_t rows = a[1], cols = a[2];
    const float *in = (const float *)p[0];
    float *out = (float *)p[1];
    for (int64_t br = 0; br < a[0] * rows; br++) {
        int64_t r = br % rows, keep = r + 1 < cols ? r + 1 : cols;
        tgk_softmax_row(in + br * cols, out + br * cols, 1, keep, 0, cols);
    }
}
#endif

#if defined(TGK_USE_ARGMAX)
/* a = {outer, len, inner, is_min}; p = {in, out i32}: the first extreme along the middle axis,
 * a NaN counting as extreme. */
static void tgk_argmax(const int64_t *a, void *const *p) {
    int64_t len = a[1], inner = a[2];
    int is_min = (int)a[3];
    const float *in = (const float *)p[0];
    int32_t *out = (int32_t *)p[1];
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
#endif

#if defined(TGK_USE_SCATTER_ROWS)
/* a = {n, dim, rows}; p = {values [n, dim], idx i32 [n], out [rows, dim]}: zero-filled, then
 * out[idx[i], :] += values[i, :] for every index in range. */
static void tgk_scatter_rows(const int64_t *a, void *const *p) {
    int64_t n = a[0], dim = a[1], rows = a[2];
    const float *v = (const float *)p[0];
    const int32_t *idx = (const int32_t *)p[1];
    float *out = (float *)p[2];
    memset(out, 0, sizeof(float) * (size_t)(rows * dim));
    for (int64_t i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= rows) continue;
        for (int64_t d = 0; d < dim; d++) out[(int64_t)idx[i] * dim + d] += v[i * dim + d];
    }
}
#endif

#if defined(TGK_USE_SCATTER_ALONG)
/* a = {outer, n_idx, inner, n_out}; p = {values, idx i32 (both [outer, n_idx, inner]), out
 * [outer, n_out, inner]}: zero-filled, then each value added at its index along the middle axis. */
static void tgk_scatter_along(const int64_t *a, void *const *p) {
    int64_t outer = a[0], nk = a[1], inner = a[2], nout = a[3];
    const float *v = (const float *)p[0];
    const int32_t *idx = (const int32_t *)p[1];
    float *out = (float *)p[2];
    memset(out, 0, sizeof(float) * (size_t)(outer * nout * inner));
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < nk; k++)
            for (int64_t j = 0; j < inner; j++) {
                int64_t at = (o * nk + k) * inner + j;
                if (idx[at] >= 0 && idx[at] < nout) out[(o * nout + idx[at]) * inner + j] += v[at];
            }
}
#endif

#if defined(TGK_USE_COL2IM)
/* a = {N, C, H, W, kh, kw, stride, pad}; p = {cols [N, C*kh*kw, ho*wo], out [N, C, H, W]}: the
 * adjoint of im2col, zero-filled, then every column entry added to the pixel it was read from. */
static void tgk_col2im(const int64_t *a, void *const *p) {
    int64_t C = a[1], H = a[2], W = a[3], kh = a[4], kw = a[5], s = a[6], pad = a[7];
    int64_t ho = (H + 2 * pad - kh) / s + 1, wo = (W + 2 * pad - kw) / s + 1;
    const float *cols = (const float *)p[0];
    float *out = (float *)p[1];
    memset(out, 0, sizeof(float) * (size_t)(a[0] * C * H * W));
    for (int64_t n = 0; n < a[0]; n++)
        for (int64_t r = 0; r < C * kh * kw; r++) {
            int64_t c = r / (kh * kw), i = r / kw % kh, jj = r % kw;
            const float *row = cols + (n * C * kh * kw + r) * ho * wo;
            float *plane = out + (n * C + c) * H * W;
            for (int64_t oy = 0; oy < ho; oy++) {
                int64_t y = oy * s - pad + i;
                if (y < 0 || y >= H) continue;
                for (int64_t ox = 0; ox < wo; ox++) {
                    int64_t x = ox * s - pad + jj;
                    if (x >= 0 && x < W) plane[y * W + x] += row[oy * wo + ox];
                }
            }
        }
}
#endif

#if defined(TGK_USE_MAXPOOL) || defined(TGK_USE_MAXPOOL_BWD) || defined(TGK_USE_WINDOW_ARGMAX)
/* The first maximum (row-major) of the k x k window at (oy, ox) of one image plane, as an offset
 * into it; a NaN beats a number; -1 when the window lies wholly in the padding. The library's
 * max pooling (cpu_kernels.c, TGK_USE_WINDOW_ARGMAX) uses it too. */
static int64_t tgk_window_argmax(const float *img, int64_t H, int64_t W, int64_t k, int64_t s, int64_t pad, int64_t oy,
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
#endif

#if defined(TGK_USE_MAXPOOL) || defined(TGK_USE_MAXPOOL_BWD)
/* a = {N, C, H, W, k, k, stride, pad} (backward: then a mask flag); p = {x, out} or, backward,
 * {x, grad out, grad in}: the max of each window, or its gradient added at the window's first
 * maximum (zero-filled first; padding counts as -inf), then with the mask multiplied by step(x). */
static void tgk_maxpool_any(const int64_t *a, void *const *p, int backward) {
    int64_t N = a[0], C = a[1], H = a[2], W = a[3], k = a[4], s = a[6], pad = a[7];
    int64_t ho = (H + 2 * pad - k) / s + 1, wo = (W + 2 * pad - k) / s + 1;
    const float *x = (const float *)p[0];
    if (backward) memset(p[2], 0, sizeof(float) * (size_t)(N * C * H * W));
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *img = x + nc * H * W;
        for (int64_t oy = 0; oy < ho; oy++)
            for (int64_t ox = 0; ox < wo; ox++) {
                int64_t at = tgk_window_argmax(img, H, W, k, s, pad, oy, ox), o = (nc * ho + oy) * wo + ox;
                if (!backward) ((float *)p[1])[o] = at >= 0 ? img[at] : -INFINITY;
                else if (at >= 0) ((float *)p[2])[nc * H * W + at] += ((const float *)p[1])[o];
            }
    }
    if (backward && a[8])
        for (int64_t q = 0; q < N * C * H * W; q++) ((float *)p[2])[q] = ((float *)p[2])[q] * (x[q] > 0.0f ? 1.0f : 0.0f);
}
#endif

#if defined(TGK_USE_MAXPOOL)
static void tgk_maxpool(const int64_t *a, void *const *p) { tgk_maxpool_any(a, p, 0); }
#endif

#if defined(TGK_USE_MAXPOOL_BWD)
static void tgk_maxpool_bwd(const int64_t *a, void *const *p) { tgk_maxpool_any(a, p, 1); }
#endif

#if defined(TGK_USE_ATTENTION) || defined(TGK_USE_ATTENTION_BWD)
/* Attention (OP_ATTENTION, _LSE, _BWD in graph/graph.h; the library's are cpu_attention.c):
 * a = {batch, T, S, D, E, causal, the bits of a double scale, h}; q [T, D], k [S, D], v [S, E]
 * per batch element, or with h > 1 the rows of h heads interleaved ([.., T, h, D]: graph.h's
 * attn_row), and the output and gradients as their operands. Without scratch memory: a row's
 * scores are computed again where they are used (its max, then its weights), never stored. */
typedef struct { int64_t batch, T, S, D, E, h, ldd, lde; int causal; float scale; } tgk_attn;

static tgk_attn tgk_attn_of(const int64_t *a) {
    tgk_attn A;
    double scale;
    memcpy(&scale, &a[6], sizeof scale);
    A.batch = a[0];
    A.T = a[1];
    A.S = a[2];
    A.D = a[3];
    A.E = a[4];
    A.causal = a[5] != 0;
    A.scale = (float)scale;
    A.h = a[7] > 1 ? a[7] : 1;
    A.ldd = A.h * A.D;   /* the rows' strides */
    A.lde = A.h * A.E;
    return A;
}

/* Where batch element b's row 0 of an operand of n rows of w columns is, h heads interleaved. */
static int64_t tgk_attn_at(int64_t b, int64_t n, int64_t w, int64_t h) { return ((b / h) * n * h + b % h) * w; }

static int64_t tgk_attn_kept(const tgk_attn *A, int64_t r) { return A->causal ? (r + 1 < A->S ? r + 1 : A->S) : A->S; }

static float tgk_attn_score(const tgk_attn *A, const float *qr, const float *kc) {
    float dot = 0;
    for (int64_t d = 0; d < A->D; d++) dot += qr[d] * kc[d];
    return dot * A->scale;
}

/* Row r's max score and the sum of exp(score - max) over its kept columns. */
static void tgk_attn_row(const tgk_attn *A, const float *qr, const float *k, int64_t kept, float *mx, double *sum) {
    *mx = -INFINITY;
    for (int64_t c = 0; c < kept; c++) {
        float s = tgk_attn_score(A, qr, k + c * A->ldd);
        if (s > *mx) *mx = s;
    }
    *sum = 0;
    for (int64_t c = 0; c < kept; c++) *sum += exp((double)(tgk_attn_score(A, qr, k + c * A->ldd) - *mx));
}
#endif

#if defined(TGK_USE_ATTENTION)
/* p = {q, k, v, out (or NULL), lse (or NULL)} */
static void tgk_attention(const int64_t *a, void *const *p) {
    const tgk_attn A = tgk_attn_of(a);
    for (int64_t b = 0; b < A.batch; b++) {
        const float *q = (const float *)p[0] + tgk_attn_at(b, A.T, A.D, A.h);
        const float *k = (const float *)p[1] + tgk_attn_at(b, A.S, A.D, A.h);
        const float *v = (const float *)p[2] + tgk_attn_at(b, A.S, A.E, A.h);
        for (int64_t r = 0; r < A.T; r++) {
            int64_t kept = tgk_attn_kept(&A, r);
            float mx;
            double sum;
            tgk_attn_row(&A, q + r * A.ldd, k, kept, &mx, &sum);
            if (p[4]) ((float *)p[4])[b * A.T + r] = mx + (float)log(sum);
            if (!p[3]) continue;
            float *o = (float *)p[3] + tgk_attn_at(b, A.T, A.E, A.h) + r * A.lde;
            for (int64_t e = 0; e < A.E; e++) o[e] = 0;
            for (int64_t c = 0; c < kept; c++) {
                float w = (float)(exp((double)(tgk_attn_score(&A, q + r * A.ldd, k + c * A.ldd) - mx)) / sum);
                for (int64_t e = 0; e < A.E; e++) o[e] += w * v[c * A.lde + e];
            }
        }
    }
}
#endif

#if defined(TGK_USE_ATTENTION_BWD)
/* p = {q, k, v, out, d_out, lse, dq, dk, dv} (any of the last three NULL): with p_c = exp(s_c -
 * lse_r) and delta_r = d_out_r . out_r, ds_c = scale p_c (d_out_r . v_c - delta_r); dq_r =
 * sum_c ds_c k_c, dk_c += ds_c q_r, dv_c += p_c d_out_r. a[9] = h > 1: out's rows are those of h
 * heads interleaved. */
static void tgk_attention_bwd(const int64_t *a, void *const *p) {
    const tgk_attn A = tgk_attn_of(a);
    const int64_t h = a[9] > 1 ? a[9] : 1, os = h * A.E;   /* out's row stride */
    for (int64_t b = 0; b < A.batch; b++) {
        const int64_t qd = tgk_attn_at(b, A.T, A.D, A.h), kd = tgk_attn_at(b, A.S, A.D, A.h), ve = tgk_attn_at(b, A.S, A.E, A.h);
        const float *q = (const float *)p[0] + qd, *k = (const float *)p[1] + kd, *v = (const float *)p[2] + ve;
        const float *o = (const float *)p[3] + tgk_attn_at(b, A.T, A.E, h);
        const float *g = (const float *)p[4] + tgk_attn_at(b, A.T, A.E, A.h), *lse = (const float *)p[5] + b * A.T;
        float *dq = p[6] ? (float *)p[6] + qd : NULL, *dk = p[7] ? (float *)p[7] + kd : NULL;
        float *dv = p[8] ? (float *)p[8] + ve : NULL;
        for (int64_t c = 0; c < A.S; c++) {
            if (dk) memset(dk + c * A.ldd, 0, sizeof(float) * (size_t)A.D);
            if (dv) memset(dv + c * A.lde, 0, sizeof(float) * (size_t)A.E);
        }
        for (int64_t r = 0; r < A.T; r++) {
            const float *qr = q + r * A.ldd, *gr = g + r * A.lde;
            float delta = 0;
            for (int64_t e = 0; e < A.E; e++) delta += gr[e] * o[r * os + e];
            if (dq) for (int64_t d = 0; d < A.D; d++) dq[r * A.ldd + d] = 0;
            for (int64_t c = 0; c < tgk_attn_kept(&A, r); c++) {
                float pc = expf(tgk_attn_score(&A, qr, k + c * A.ldd) - lse[r]), dp = 0;
                for (int64_t e = 0; e < A.E; e++) dp += gr[e] * v[c * A.lde + e];
                float ds = A.scale * pc * (dp - delta);
                if (dq) for (int64_t d = 0; d < A.D; d++) dq[r * A.ldd + d] += ds * k[c * A.ldd + d];
                if (dk) for (int64_t d = 0; d < A.D; d++) dk[c * A.ldd + d] += ds * qr[d];
                if (dv) for (int64_t e = 0; e < A.E; e++) dv[c * A.lde + e] += pc * gr[e];
            }
        }
    }
}
#endif
