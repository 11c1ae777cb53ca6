/* Fused attention on the CPU (OP_ATTENTION, _LSE, _BWD; contracts in graph/graph.h): q [.., T, D],
 * k [.., S, D], v [.., S, E], one head (leading index) at a time. Scores exist one block of RB
 * query rows at a time, in per-thread scratch, never as the [T, S] matrix of every head: the
 * backward recomputes a block's probabilities from the rows' saved log-sum-exp.
 *
 * The products of a block (scores = q kᵀ, then p v; in the backward also d_out vᵀ, ds k, dsᵀ q,
 * pᵀ d_out) run in the packed product kernel (kernel_gemm, the run's ISA); what lies between them
 * (mask, exp, row sums, ds = p (dp - delta)) is a pass over the block's rows, the exponentials
 * through libmvec's vector expf. Threads split heads and row blocks in the forward, heads in the
 * backward (a head's dk and dv are written by one thread: no atomics, and the same result on any
 * thread count). */
#include "cpu/cpu_kernels.h"

#include <math.h>
#include <string.h>

/* Below this many multiply-adds a kernel runs on one thread (as products: cpu_kernels.c). */
#define PARALLEL_MACS (1 << 21)

/* Query rows per block: the block's scores [RB, S] stay in cache between its products. */
#define RB 64

/* a = {batch, T, S, D, E, causal, scale as the bits of a double, the heads interleaved in the
 * operands (graph.h: attn_row), bf16, (backward) out's heads and the gradients' parts a row
 * (graph.h: attn_row_packed; 3: dq, dk and dv all point at the first)}. bf16: q, k, v and d_out are
 * rounded to bf16 as operands (a graph of bf16 precision), as the reference does, and so are the
 * backward's p and ds; the products then run in f32 on the rounded copies (the forward's p is not
 * rounded, so the p v product has no bf16 operand pair for vdpbf16ps: the same arithmetic as f32,
 * a copy's cost more). */
typedef struct { int64_t batch, T, S, D, E, heads, out_heads, pk; bool causal, bf16; float scale; } attn;

static attn attn_of(const int64_t *a, bool backward) {
    double scale;
    memcpy(&scale, &a[6], sizeof scale);
    return (attn){ a[0], a[1], a[2], a[3], a[4], a[7], backward ? a[9] : 0, backward ? a[10] : 1, a[5] != 0, a[8] != 0, (float)scale };
}

/* Rows of an operand: where the first is, and the stride between them. */
typedef struct { const float *p; int64_t ld; } rows;

/* Rows [r0, r0 + n) of batch element b of operand x of W columns (attn_row's layout), or (bf16)
 * their values rounded to bf16 in dst, one row after another; dst advanced past what it used. */
static rows operand(const attn *A, const float *x, int64_t b, int64_t T, int64_t W, int64_t r0, int64_t n, float **dst) {
    const int64_t ld = attn_stride(W, A->heads);
    x += attn_row(b, T, W, A->heads) + r0 * ld;
    if (!A->bf16) return (rows){ x, ld };
    float *r = *dst;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < W; j++) r[i * W + j] = precision_round(TG_PRECISION_BF16, x[i * ld + j]);
    *dst += n * W;
    return (rows){ r, W };
}

/* The columns row r attends to, and the most any row of the block [r0, r1) does. */
static int64_t kept(const attn *A, int64_t r) { return A->causal ? (r + 1 < A->S ? r + 1 : A->S) : A->S; }

/* ----- s[c] = exp(s[c] - m) for c < n, returning the sum in double ----- */

static double exp_sub_portable(float *s, int64_t n, float m) {
    double sum = 0;
    for (int64_t c = 0; c < n; c++) sum += (s[c] = expf(s[c] - m));
    return sum;
}

#ifdef CPU_X86
#include <immintrin.h>
__m256 _ZGVdN8v_expf(__m256 x);    /* glibc's libmvec (through libm's linker script) */
__m512 _ZGVeN16v_expf(__m512 x);

TARGET_AVX2 static double exp_sub_avx2(float *s, int64_t n, float m) {
    int64_t c = 0;
    double sum = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(s + c), _mm256_set1_ps(m)));
        _mm256_storeu_ps(s + c, e);
        __m256d t = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)), _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        __m128d u = _mm_add_pd(_mm256_castpd256_pd128(t), _mm256_extractf128_pd(t, 1));
        sum += _mm_cvtsd_f64(_mm_add_sd(u, _mm_unpackhi_pd(u, u)));
    }
    return sum + exp_sub_portable(s + c, n - c, m);
}

TARGET_AVX512 static double exp_sub_avx512(float *s, int64_t n, float m) {
    double sum = 0;
    for (int64_t c = 0; c < n; c += 16) {
        __mmask16 k = (__mmask16)(n - c >= 16 ? 0xffff : (1u << (n - c)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, _ZGVeN16v_expf(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + c), _mm512_set1_ps(m))));
        _mm512_mask_storeu_ps(s + c, k, e);
        sum += _mm512_reduce_add_pd(_mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(e)),
                                                  _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1))));
    }
    return sum;
}
#endif

typedef double (*exp_sub_fn)(float *s, int64_t n, float m);

static exp_sub_fn exp_sub_for(cpu_isa isa) {
#ifdef CPU_X86
    if (isa == CPU_ISA_AVX512) return exp_sub_avx512;
    if (isa == CPU_ISA_AVX2) return exp_sub_avx2;
#endif
    return exp_sub_portable;
}

/* ----- forward ----- */

/* Rows [r0, r1) of one head (q: its query row r0; out: its row 0, rows ldo apart): s [RB, S]
 * scratch. Row r's probabilities over its kept columns, zeros past them (so the block's p v
 * product needs no mask). */
static void forward_block(const attn *A, exp_sub_fn exp_sub, rows q, rows k, rows v, float *out, int64_t ldo,
                          float *lse, int64_t r0, int64_t r1, float *s) {
    const int64_t n_rows = r1 - r0, cols = kept(A, r1 - 1);   /* the block's widest row */
    kernel_gemm(0, 1, n_rows, cols, A->D, q.p, q.ld, k.p, k.ld, s, A->S, 0);
    for (int64_t i = 0; i < n_rows; i++) {
        float *si = s + i * A->S, mx = -INFINITY;
        const int64_t n = kept(A, r0 + i);
        for (int64_t c = 0; c < n; c++) mx = fmaxf(mx, si[c] *= A->scale);
        double sum = exp_sub(si, n, mx);
        const float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < n; c++) si[c] *= inv;
        for (int64_t c = n; c < cols; c++) si[c] = 0;
        if (lse) lse[r0 + i] = mx + (float)log(sum);
    }
    if (out) kernel_gemm(0, 0, n_rows, A->E, cols, s, A->S, v.p, v.ld, out + r0 * ldo, ldo, 0);
}

/* p = {q, k, v, out (or NULL), lse (or NULL)} */
void cpu_attention(const int64_t *a, void *const *p) {
    const attn A = attn_of(a, false);
    const float *q = p[0], *k = p[1], *v = p[2];
    float *out = p[3], *lse = p[4];
    const exp_sub_fn exp_sub = exp_sub_for(cpu_kernels_isa());
    const int64_t blocks = (A.T + RB - 1) / RB, work = A.batch * A.T * A.S * (A.D + A.E);
    #pragma omp parallel if (work >= PARALLEL_MACS)
    {
        const unsigned fp = fp_flush_denormals();
        #pragma omp for schedule(dynamic)
        for (int64_t bb = 0; bb < A.batch * blocks; bb++) {
            const int64_t b = bb / blocks, r0 = bb % blocks * RB, r1 = r0 + RB < A.T ? r0 + RB : A.T;
            float *s = kernel_scratch((size_t)(RB * A.S + (A.bf16 ? RB * A.D + A.S * (A.D + A.E) : 0)));
            if (!s) continue;   /* recorded: the step fails */
            float *copies = s + RB * A.S;   /* the block's q rows; the head's k and v (1/RB of the block's work) */
            const rows qb = operand(&A, q, b, A.T, A.D, r0, r1 - r0, &copies);
            const rows kh = operand(&A, k, b, A.S, A.D, 0, A.S, &copies), vh = operand(&A, v, b, A.S, A.E, 0, A.S, &copies);
            forward_block(&A, exp_sub, qb, kh, vh, out ? out + attn_row(b, A.T, A.E, A.heads) : NULL,
                          attn_stride(A.E, A.heads), lse ? lse + b * A.T : NULL, r0, r1, s);
        }
        fp_restore(fp);
    }
}

/* ----- backward ----- */

/* Gradient rows of W columns (n of them, ld apart; NULL: not wanted) set to zero. */
static void zero_rows(float *x, int64_t n, int64_t W, int64_t ld) {
    for (int64_t i = 0; x && i < n; i++) memset(x + i * ld, 0, sizeof(float) * (size_t)W);
}

/* p and ds enter the backward's products as bf16 operands, as the reference rounds them. */
static void round_bf16_row(float *p, float *ds, int64_t n) {
    for (int64_t c = 0; c < n; c++) {
        p[c] = precision_round(TG_PRECISION_BF16, p[c]);
        ds[c] = precision_round(TG_PRECISION_BF16, ds[c]);
    }
}

/* One head (operands and gradients offset to it, the gradients' rows ld apart as their operands'
 * in memory; out's rows attn_stride(E, out_heads) apart), a block of query rows at a time: with
 * p_c = exp(s_c - lse_r) and delta_r = d_out_r . out_r, dp = d_out vᵀ, ds = scale p (dp - delta);
 * dq = ds k, dk += dsᵀ q, dv += pᵀ d_out. dq, dk, dv may be NULL (not wanted). buf: 2 RB S floats. */
static void backward_head(const attn *A, exp_sub_fn exp_sub, rows q, rows k, rows v, const float *o, rows dout,
                          const float *lse, float *dq, float *dk, float *dv, float *buf) {
    float *pb = buf, *ds = buf + RB * A->S;
    const int64_t ldd = attn_stride(A->D, A->heads) * A->pk, lde = attn_stride(A->E, A->heads) * A->pk;
    const int64_t os = attn_stride(A->E, A->out_heads);
    zero_rows(dk, A->S, A->D, ldd);
    zero_rows(dv, A->S, A->E, lde);
    for (int64_t r0 = 0; r0 < A->T; r0 += RB) {
        const int64_t r1 = r0 + RB < A->T ? r0 + RB : A->T, n_rows = r1 - r0, cols = kept(A, r1 - 1);
        const float *qb = q.p + r0 * q.ld, *gb = dout.p + r0 * dout.ld;
        kernel_gemm(0, 1, n_rows, cols, A->D, qb, q.ld, k.p, k.ld, pb, A->S, 0);
        kernel_gemm(0, 1, n_rows, cols, A->E, gb, dout.ld, v.p, v.ld, ds, A->S, 0);
        for (int64_t i = 0; i < n_rows; i++) {
            float *pi = pb + i * A->S, *di = ds + i * A->S, delta = 0;
            const int64_t r = r0 + i, n = kept(A, r);
            const float *orow = o + r * os, *grow = gb + i * dout.ld;
            for (int64_t e = 0; e < A->E; e++) delta += grow[e] * orow[e];
            for (int64_t c = 0; c < n; c++) pi[c] *= A->scale;
            exp_sub(pi, n, lse[r]);
            #pragma omp simd
            for (int64_t c = 0; c < n; c++) di[c] = A->scale * pi[c] * (di[c] - delta);
            if (A->bf16) round_bf16_row(pi, di, n);
            for (int64_t c = n; c < cols; c++) pi[c] = di[c] = 0;
        }
        if (dq) kernel_gemm(0, 0, n_rows, A->D, cols, ds, A->S, k.p, k.ld, dq + r0 * ldd, ldd, 0);
        if (dk) kernel_gemm(1, 0, cols, A->D, n_rows, ds, A->S, qb, q.ld, dk, ldd, 1);
        if (dv) kernel_gemm(1, 0, cols, A->E, n_rows, pb, A->S, gb, dout.ld, dv, lde, 1);
    }
}

/* p = {q, k, v, out, d_out, lse, dq, dk, dv} (any of the last three NULL) */
void cpu_attention_bwd(const int64_t *a, void *const *p) {
    const attn A = attn_of(a, true);
    const float *q = p[0], *k = p[1], *v = p[2], *o = p[3], *dout = p[4], *lse = p[5];
    float *dq = p[6], *dk = p[7], *dv = p[8];
    if (A.pk > 1) {   /* one row of three parts: dq's, dk's, dv's */
        dk += A.heads * A.D;
        dv += 2 * A.heads * A.D;
    }
    const exp_sub_fn exp_sub = exp_sub_for(cpu_kernels_isa());
    const int64_t work = A.batch * A.T * A.S * (2 * A.D + 2 * A.E);
    #pragma omp parallel if (work >= PARALLEL_MACS)
    {
        const unsigned fp = fp_flush_denormals();
        #pragma omp for schedule(dynamic)
        for (int64_t b = 0; b < A.batch; b++) {
            float *buf = kernel_scratch((size_t)(2 * RB * A.S + (A.bf16 ? (A.T + A.S) * (A.D + A.E) : 0)));
            if (!buf) continue;   /* recorded: the step fails */
            float *copies = buf + 2 * RB * A.S;
            const rows qh = operand(&A, q, b, A.T, A.D, 0, A.T, &copies), kh = operand(&A, k, b, A.S, A.D, 0, A.S, &copies);
            const rows vh = operand(&A, v, b, A.S, A.E, 0, A.S, &copies), gh = operand(&A, dout, b, A.T, A.E, 0, A.T, &copies);
            backward_head(&A, exp_sub, qh, kh, vh, o + attn_row(b, A.T, A.E, A.out_heads), gh, lse + b * A.T,
                          dq ? dq + attn_row_packed(b, A.T, A.D, A.heads, A.pk) : NULL,
                          dk ? dk + attn_row_packed(b, A.S, A.D, A.heads, A.pk) : NULL,
                          dv ? dv + attn_row_packed(b, A.S, A.E, A.heads, A.pk) : NULL, buf);
        }
        fp_restore(fp);
    }
}
