/* Fused attention on the CPU (OP_ATTENTION, _LSE, _BWD; contracts in graph/graph.h): q [.., T, D],
 * k [.., S, D], v [.., S, E], one head (leading index) at a time. Scores exist a block of rows
 * at a time, never as the [T, S] matrix: the forward keeps a block of RB rows' scores, the
 * backward one row's, recomputed from the row's saved log-sum-exp.
 *
 * Every inner loop is an axpy over a contiguous row (k and v are transposed per head into
 * scratch first), so the compiler vectorizes it without reassociating a sum. Threads split heads
 * and row blocks in the forward, heads in the backward (each head's dk and dv rows are written
 * by one thread: no atomics, and the same result on any thread count). */
#include "cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>

/* Below this many multiply-adds a kernel runs on one thread (as products: cpu_kernels.c). */
#define PARALLEL_MACS (1 << 21)

/* a = {batch, T, S, D, E, causal, scale as the bits of a double}. */
typedef struct { int64_t batch, T, S, D, E; bool causal; float scale; } attn;

static attn attn_of(const int64_t *a) {
    double scale;
    memcpy(&scale, &a[6], sizeof scale);
    return (attn){ a[0], a[1], a[2], a[3], a[4], a[5] != 0, (float)scale };
}

static int64_t kept(const attn *A, int64_t r) { return A->causal ? (r + 1 < A->S ? r + 1 : A->S) : A->S; }

/* dst [cols, rows] = src [rows, cols]ᵀ */
static void transpose(const float *src, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[c * rows + r] = src[r * cols + c];
}

/* s[c] = scale * q_r . k_c for c < n, with kt = kᵀ [D, S]. */
static void scores(const attn *A, const float *qr, const float *kt, int64_t n, float *s) {
    for (int64_t c = 0; c < n; c++) s[c] = 0;
    for (int64_t d = 0; d < A->D; d++) {
        const float qd = qr[d] * A->scale, *kd = kt + d * A->S;
        #pragma omp simd
        for (int64_t c = 0; c < n; c++) s[c] += qd * kd[c];
    }
}

/* Rows of scores to a block of the forward: enough work per block to amortize the transposes. */
#define RB 16

/* p = {q, k, v, out (or NULL), lse (or NULL)} */
void cpu_attention(const int64_t *a, void *const *p) {
    const attn A = attn_of(a);
    const float *q = p[0], *k = p[1], *v = p[2];
    float *out = p[3], *lse = p[4];
    const int64_t blocks = (A.T + RB - 1) / RB, work = A.batch * A.T * A.S * (A.D + A.E);
    #pragma omp parallel for schedule(dynamic) if (work >= PARALLEL_MACS)
    for (int64_t bb = 0; bb < A.batch * blocks; bb++) {
        const int64_t b = bb / blocks, r0 = bb % blocks * RB, r1 = r0 + RB < A.T ? r0 + RB : A.T;
        float *kt = kernel_scratch((size_t)(A.D * A.S + A.S));
        if (!kt) continue;   /* recorded: the step fails */
        float *s = kt + A.D * A.S;
        transpose(k + b * A.S * A.D, A.S, A.D, kt);
        for (int64_t r = r0; r < r1; r++) {
            const int64_t n = kept(&A, r);
            scores(&A, q + (b * A.T + r) * A.D, kt, n, s);
            float mx = -INFINITY;
            for (int64_t c = 0; c < n; c++) mx = fmaxf(mx, s[c]);
            double sum = 0;
            for (int64_t c = 0; c < n; c++) sum += (s[c] = expf(s[c] - mx));
            if (lse) lse[b * A.T + r] = mx + (float)log(sum);
            if (!out) continue;
            float *o = out + (b * A.T + r) * A.E, inv = (float)(1.0 / sum);
            for (int64_t e = 0; e < A.E; e++) o[e] = 0;
            for (int64_t c = 0; c < n; c++) {
                const float pc = s[c] * inv, *vc = v + (b * A.S + c) * A.E;
                #pragma omp simd
                for (int64_t e = 0; e < A.E; e++) o[e] += pc * vc[e];
            }
        }
    }
}

/* One head of the backward (pointers offset to it): with p_c = exp(s_c - lse_r) and delta_r =
 * d_out_r . out_r: dp_c = d_out_r . v_c, ds_c = scale p_c (dp_c - delta_r); dq_r = sum_c ds_c
 * k_c, dk_c += ds_c q_r, dv_c += p_c d_out_r. dq, dk, dv may be NULL (not wanted). */
static void backward_head(const attn *A, const float *q, const float *k, const float *v, const float *o,
                          const float *dout, const float *lse, float *dq, float *dk, float *dv, float *buf) {
    float *kt = buf, *vt = kt + A->D * A->S, *s = vt + A->E * A->S, *dp = s + A->S;
    transpose(k, A->S, A->D, kt);
    transpose(v, A->S, A->E, vt);
    if (dk) memset(dk, 0, sizeof(float) * (size_t)(A->S * A->D));
    if (dv) memset(dv, 0, sizeof(float) * (size_t)(A->S * A->E));
    for (int64_t r = 0; r < A->T; r++) {
        const int64_t n = kept(A, r);
        const float *qr = q + r * A->D, *gr = dout + r * A->E;
        float delta = 0;
        for (int64_t e = 0; e < A->E; e++) delta += gr[e] * o[r * A->E + e];
        scores(A, qr, kt, n, s);
        for (int64_t c = 0; c < n; c++) s[c] = expf(s[c] - lse[r]), dp[c] = 0;
        for (int64_t e = 0; e < A->E; e++) {
            const float ge = gr[e], *ve = vt + e * A->S;
            #pragma omp simd
            for (int64_t c = 0; c < n; c++) dp[c] += ge * ve[c];
        }
        for (int64_t c = 0; c < n; c++) dp[c] = A->scale * s[c] * (dp[c] - delta);   /* ds */
        if (dq) {
            float *dqr = dq + r * A->D;
            for (int64_t d = 0; d < A->D; d++) dqr[d] = 0;
            for (int64_t c = 0; c < n; c++) {
                const float dsc = dp[c], *kc = k + c * A->D;
                #pragma omp simd
                for (int64_t d = 0; d < A->D; d++) dqr[d] += dsc * kc[d];
            }
        }
        for (int64_t c = 0; dk && c < n; c++) {
            const float dsc = dp[c];
            float *dkc = dk + c * A->D;
            #pragma omp simd
            for (int64_t d = 0; d < A->D; d++) dkc[d] += dsc * qr[d];
        }
        for (int64_t c = 0; dv && c < n; c++) {
            const float pc = s[c];
            float *dvc = dv + c * A->E;
            #pragma omp simd
            for (int64_t e = 0; e < A->E; e++) dvc[e] += pc * gr[e];
        }
    }
}

/* p = {q, k, v, out, d_out, lse, dq, dk, dv} (any of the last three NULL) */
void cpu_attention_bwd(const int64_t *a, void *const *p) {
    const attn A = attn_of(a);
    const float *q = p[0], *k = p[1], *v = p[2], *o = p[3], *dout = p[4], *lse = p[5];
    float *dq = p[6], *dk = p[7], *dv = p[8];
    const int64_t work = A.batch * A.T * A.S * (2 * A.D + 2 * A.E);
    #pragma omp parallel for schedule(dynamic) if (work >= PARALLEL_MACS)
    for (int64_t b = 0; b < A.batch; b++) {
        float *buf = kernel_scratch((size_t)((A.D + A.E + 2) * A.S));
        if (!buf) continue;   /* recorded: the step fails */
        backward_head(&A, q + b * A.T * A.D, k + b * A.S * A.D, v + b * A.S * A.E, o + b * A.T * A.E,
                      dout + b * A.T * A.E, lse + b * A.T, dq ? dq + b * A.T * A.D : NULL,
                      dk ? dk + b * A.S * A.D : NULL, dv ? dv + b * A.S * A.E : NULL, buf);
    }
}

