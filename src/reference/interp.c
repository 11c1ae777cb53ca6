/* The reference interpreter: every tensor is an array of doubles, every op a plain loop. It is
 * the oracle the other backends are tested against, so each kernel follows its op's contract in
 * internal.h as literally as possible; speed matters only as far as the model tests need it
 * (matmul and elementwise loops over contiguous runs). */
#include "reference/reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ref_exec {
    const tg_graph *g;      /* borrowed: must outlive the executor */
    double *arena;
    double **bufs;          /* per node: its values (arena slot or bound storage) */
    bool round_f32;
    bool *bf16;             /* bf16 graphs: the activations rounded to bf16 (graph_bf16_values) */
};

/* ---------------------------------------------------------------------------------------------
 * Shapes and strided iteration
 * ------------------------------------------------------------------------------------------- */

static int64_t prod(const int64_t *d, int from, int to)
{
    int64_t p = 1;
    for (int i = from; i < to; i++)
        p *= d[i];
    return p;
}

/* Row-major element strides of a contiguous tensor. */
static void contiguous_strides(tg_shape s, int64_t *stride)
{
    int64_t st = 1;
    for (int i = s.ndim - 1; i >= 0; i--) {
        stride[i] = st;
        st *= s.d[i];
    }
}

/* Strides that read src broadcast (NumPy rules, right-aligned) to a tensor of `out` dims: stride 0
 * on the dims src lacks or has as 1. */
static void broadcast_strides(tg_shape src, tg_shape out, int64_t *stride)
{
    int64_t own[TG_MAX_DIMS];
    contiguous_strides(src, own);
    int lead = out.ndim - src.ndim;
    for (int i = 0; i < out.ndim; i++) {
        int j = i - lead;
        stride[i] = (j < 0 || src.d[j] == 1) ? 0 : own[j];
    }
}

/* Walks a contiguous output in runs along its last (merged) dim while tracking, for up to three
 * sources read through arbitrary per-dim strides, the offset where each run starts. Dims of size
 * 1 are dropped and neighbours merged where every source steps through them as one, so
 * same-shape and trailing-broadcast cases become a few long runs instead of many short ones. */
typedef struct {
    int nd, nsrc;
    int64_t dim[TG_MAX_DIMS];
    int64_t stride[3][TG_MAX_DIMS];
    int64_t idx[TG_MAX_DIMS];
    int64_t off[3];
} runs;

static bool mergeable(const runs *r, int64_t (*stride)[TG_MAX_DIMS], int d, int64_t dim)
{
    for (int s = 0; s < r->nsrc; s++)
        if (r->stride[s][r->nd - 1] != stride[s][d] * dim)
            return false;
    return true;
}

static void runs_init(runs *r, tg_shape out, int nsrc, int64_t (*stride)[TG_MAX_DIMS])
{
    memset(r, 0, sizeof *r);
    r->nsrc = nsrc;
    for (int d = 0; d < out.ndim; d++) {
        if (out.d[d] == 1)
            continue;
        if (r->nd > 0 && mergeable(r, stride, d, out.d[d])) {
            r->dim[r->nd - 1] *= out.d[d];
            for (int s = 0; s < nsrc; s++)
                r->stride[s][r->nd - 1] = stride[s][d];
            continue;
        }
        r->dim[r->nd] = out.d[d];
        for (int s = 0; s < nsrc; s++)
            r->stride[s][r->nd] = stride[s][d];
        r->nd++;
    }
    if (r->nd == 0)    /* a single element: one run of length 1 */
        r->dim[r->nd++] = 1;
}

static int64_t run_len(const runs *r) { return r->dim[r->nd - 1]; }
static int64_t run_stride(const runs *r, int s) { return r->stride[s][r->nd - 1]; }

/* Moves to the next run; false after the last. */
static bool runs_next(runs *r)
{
    for (int d = r->nd - 2; d >= 0; d--) {
        for (int s = 0; s < r->nsrc; s++)
            r->off[s] += r->stride[s][d];
        if (++r->idx[d] < r->dim[d])
            return true;
        for (int s = 0; s < r->nsrc; s++)
            r->off[s] -= r->stride[s][d] * r->dim[d];
        r->idx[d] = 0;
    }
    return false;
}

/* A node's shape as [outer, n, inner] around `axis` (SUM, SOFTMAX). */
static void split_axis(tg_shape s, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = prod(s.d, 0, axis);
    *n = s.d[axis];
    *inner = prod(s.d, axis + 1, s.ndim);
}

/* ---------------------------------------------------------------------------------------------
 * Elementwise
 * ------------------------------------------------------------------------------------------- */

static double sigmoid(double x)
{
    /* For very negative x, exp(-x) overflows and 1/(1+inf) flushes to 0; e/(1+e) keeps the tiny
     * value. The two forms agree elsewhere. */
    if (x >= 0)
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

static void fill(double *out, int64_t n, double v)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = v;
}

static double sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }

/* NaN-propagating, like torch.minimum/maximum (fmin/fmax would drop the NaN). */
static double min2(double a, double b) { return (a < b || isnan(a)) ? a : b; }
static double max2(double a, double b) { return (a > b || isnan(a)) ? a : b; }

/* Integer division of i32 values held in doubles (whole numbers in int32 range: see wrap_i32):
 * C's truncation toward zero. Division by zero has no defined result; 0 keeps the value finite
 * and deterministic. INT32_MIN / -1 wraps, as in the generated kernels. */
static double idiv(double a, double b) { return b == 0 ? 0.0 : b == -1 ? -a : (double)((int64_t)a / (int64_t)b); }

/* An i32 result wrapped to 32-bit two's complement, as the compiled kernels (built with
 * -fwrapv) compute it: held in a double it would otherwise grow past int32, and past what a
 * conversion to an integer type may take. Exact while the double is (below 2^53). */
static double wrap_i32(double v) {
    if (!isfinite(v)) return 0;
    double w = fmod(trunc(v), 4294967296.0);
    if (w >= 2147483648.0) w -= 4294967296.0;
    if (w < -2147483648.0) w += 4294967296.0;
    return w;
}

static void unary(tg_op op, double *restrict o, const double *restrict x, int64_t n)
{
#define EACH(expr) for (int64_t i = 0; i < n; i++) { double v = x[i]; o[i] = (expr); }
    switch (op) {
    case OP_NEG:     EACH(-v); break;
    case OP_ABS:     EACH(fabs(v)); break;
    case OP_SQUARE:  EACH(v * v); break;
    case OP_SQRT:    EACH(sqrt(v)); break;
    case OP_RSQRT:   EACH(1.0 / sqrt(v)); break;
    case OP_EXP:     EACH(exp(v)); break;
    case OP_LOG:     EACH(log(v)); break;
    case OP_RELU:    EACH(v > 0 ? v : 0.0); break;
    case OP_TANH:    EACH(tanh(v)); break;
    case OP_SIGMOID: EACH(sigmoid(v)); break;
    case OP_SIGN:    EACH(sign(v)); break;
    case OP_STEP:    EACH(v > 0 ? 1.0 : 0.0); break;
    case OP_SIN:     EACH(sin(v)); break;
    case OP_COS:     EACH(cos(v)); break;
    default:         abort();
    }
#undef EACH
}

#define SQRT_2 1.41421356237309504880
#define INV_SQRT_2PI 0.39894228040143267794     /* 1 / sqrt(2 pi) */
#define SQRT_2_OVER_PI 0.79788456080286535588   /* sqrt(2 / pi) */
#define GELU_C 0.044715

/* GELU and its derivative; tanh_form picks the tanh approximation over the exact erf form. */
static void gelu(bool grad, bool tanh_form, double *restrict o, const double *restrict x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        if (tanh_form) {
            double t = tanh(SQRT_2_OVER_PI * (v + GELU_C * v * v * v));
            o[i] = grad ? 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * SQRT_2_OVER_PI *
                              (1.0 + 3.0 * GELU_C * v * v)
                        : 0.5 * v * (1.0 + t);
        } else {
            double e = erf(v / SQRT_2);
            o[i] = grad ? 0.5 * (1.0 + e) + v * INV_SQRT_2PI * exp(-0.5 * v * v)
                        : 0.5 * v * (1.0 + e);
        }
    }
}

/* One run of a binary op: o[j] = f(a[j*sa], b[j*sb]). */
static void binary_run(tg_op op, bool i32, double *restrict o, const double *a, int64_t sa,
                       const double *b, int64_t sb, int64_t n)
{
#define EACH(expr) for (int64_t j = 0; j < n; j++) { double x = a[j * sa], y = b[j * sb]; o[j] = (expr); }
    switch (op) {
    case OP_ADD:     EACH(x + y); break;
    case OP_SUB:     EACH(x - y); break;
    case OP_MUL:     EACH(x * y); break;
    case OP_DIV:     EACH(i32 ? idiv(x, y) : x / y); break;
    case OP_MIN:     EACH(min2(x, y)); break;
    case OP_MAX:     EACH(max2(x, y)); break;
    case OP_LESS:    EACH(x < y ? 1.0 : 0.0); break;
    case OP_GREATER: EACH(x > y ? 1.0 : 0.0); break;
    case OP_EQUAL:   EACH(x == y ? 1.0 : 0.0); break;
    default:         abort();
    }
#undef EACH
}

/* The ops that read their sources broadcast to the node's shape: EXPAND (one source), the
 * binary ops (two) and WHERE (three). */
static void broadcast_eval(const tg_graph *g, const tg_node *n, double *out, double *const *bufs)
{
    int64_t stride[3][TG_MAX_DIMS];
    const double *src[3];
    for (int s = 0; s < n->nsrc; s++) {
        const tg_node *sn = &g->nodes[n->src[s]];
        broadcast_strides(sn->shape, n->shape, stride[s]);
        src[s] = bufs[n->src[s]];
    }
    runs r;
    runs_init(&r, n->shape, n->nsrc, stride);
    int64_t len = run_len(&r), s0 = run_stride(&r, 0);
    bool i32 = n->dtype == TG_INT32;
    do {
        const double *a = src[0] + r.off[0];
        if (n->op == OP_EXPAND) {
            for (int64_t j = 0; j < len; j++)
                out[j] = a[j * s0];
        } else if (n->op == OP_WHERE) {
            const double *x = src[1] + r.off[1], *y = src[2] + r.off[2];
            int64_t s1 = run_stride(&r, 1), s2 = run_stride(&r, 2);
            for (int64_t j = 0; j < len; j++)
                out[j] = a[j * s0] != 0 ? x[j * s1] : y[j * s2];
        } else {
            binary_run(n->op, i32, out, a, s0, src[1] + r.off[1], run_stride(&r, 1), len);
        }
        out += len;
    } while (runs_next(&r));
}

/* ---------------------------------------------------------------------------------------------
 * Reductions and movement
 * ------------------------------------------------------------------------------------------- */

static void sum_axis(const tg_node *x, int axis, double *restrict out, const double *restrict in)
{
    int64_t outer, n, inner;
    split_axis(x->shape, axis, &outer, &n, &inner);
    for (int64_t o = 0; o < outer; o++) {
        double *row = out + o * inner;
        const double *blk = in + o * n * inner;
        memset(row, 0, (size_t)inner * sizeof *row);
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < inner; i++)
                row[i] += blk[j * inner + i];
    }
}

static void permute(const tg_node *n, const tg_node *x, double *out, const double *in)
{
    int64_t own[TG_MAX_DIMS], stride[1][TG_MAX_DIMS];
    contiguous_strides(x->shape, own);
    for (int i = 0; i < n->shape.ndim; i++)
        stride[0][i] = own[n->iarg[i]];
    runs r;
    runs_init(&r, n->shape, 1, stride);
    int64_t len = run_len(&r), s0 = run_stride(&r, 0);
    do {
        const double *a = in + r.off[0];
        for (int64_t j = 0; j < len; j++)
            out[j] = a[j * s0];
        out += len;
    } while (runs_next(&r));
}

static void softmax(const tg_node *n, double *out, const double *in)
{
    int64_t outer, len, inner;
    split_axis(n->shape, n->axis, &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            const double *x = in + o * len * inner + i;
            double *y = out + o * len * inner + i;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < len; j++)
                mx = fmax(mx, x[j * inner]);
            for (int64_t j = 0; j < len; j++) {
                y[j * inner] = exp(x[j * inner] - mx);
                sum += y[j * inner];
            }
            if (n->op == OP_SOFTMAX) {
                for (int64_t j = 0; j < len; j++)
                    y[j * inner] /= sum;
            } else {
                double lse = mx + log(sum);
                for (int64_t j = 0; j < len; j++)
                    y[j * inner] = x[j * inner] - lse;
            }
        }
    }
}

/* Index of the first maximum (or, with want_min, minimum) along `axis`. A NaN counts as the
 * extreme, like max2/min2 (and torch.argmax): the first NaN wins. */
static void argmax(const tg_node *x, int axis, bool want_min, double *restrict out,
                   const double *restrict in)
{
    int64_t outer, len, inner;
    split_axis(x->shape, axis, &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t i = 0; i < inner; i++) {
            const double *v = in + o * len * inner + i;
            int64_t best = 0;
            for (int64_t j = 1; j < len && !isnan(v[best * inner]); j++) {
                double a = v[j * inner], b = v[best * inner];
                if (isnan(a) || (want_min ? a < b : a > b))
                    best = j;
            }
            out[o * inner + i] = (double)best;
        }
    }
}

/* SLICE and PAD: the longer tensor along the axis (SLICE's source, PAD's output) is
 * [outer, len, inner], the shorter [outer, m, inner]; the shorter one is the longer one's
 * positions start .. start + m - 1 along the axis. */
static void slice_pad(const tg_node *n, const tg_node *x, double *out, const double *in)
{
    bool pad = n->op == OP_PAD;
    int64_t outer, len, inner, m = (pad ? x : n)->shape.d[n->axis], start = n->iarg[0];
    split_axis((pad ? n : x)->shape, n->axis, &outer, &len, &inner);
    size_t run = (size_t)(m * inner) * sizeof *out;
    if (pad)
        memset(out, 0, (size_t)n->numel * sizeof *out);
    if (run == 0)   /* an empty source may have no storage at all */
        return;
    for (int64_t o = 0; o < outer; o++) {
        if (pad)
            memcpy(out + (o * len + start) * inner, in + o * m * inner, run);
        else
            memcpy(out + o * m * inner, in + (o * len + start) * inner, run);
    }
}

/* Over the last two axes [.., R, C]: SOFTMAX_CAUSAL of row r over its columns c <= r (0 above
 * the diagonal), WHERE_CAUSAL (c > r ? farg : x). */
static void causal(const tg_node *n, double *out, const double *in)
{
    int nd = n->shape.ndim;
    int64_t R = n->shape.d[nd - 2], C = n->shape.d[nd - 1];
    int64_t mats = n->numel / (R * C);
    for (int64_t b = 0; b < mats; b++) {
        for (int64_t r = 0; r < R; r++) {
            const double *x = in + (b * R + r) * C;
            double *y = out + (b * R + r) * C;
            int64_t keep = r + 1 < C ? r + 1 : C;     /* columns c <= r */
            if (n->op == OP_WHERE_CAUSAL) {
                memcpy(y, x, (size_t)keep * sizeof *y);
                fill(y + keep, C - keep, n->farg);
                continue;
            }
            double mx = -INFINITY, sum = 0;
            for (int64_t c = 0; c < keep; c++)
                mx = fmax(mx, x[c]);
            for (int64_t c = 0; c < keep; c++) {
                y[c] = exp(x[c] - mx);
                sum += y[c];
            }
            for (int64_t c = 0; c < keep; c++)
                y[c] /= sum;
            fill(y + keep, C - keep, 0.0);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Matmul
 * ------------------------------------------------------------------------------------------- */

/* C[M,N] = A'[M,K] B[K,N] with B contiguous row-major. A' is A or, with ta, the transpose of A
 * stored [K,M]. The i-k-j order keeps the inner loop contiguous in B and C and sums over k in
 * order, as the naive triple loop does. */
/* b is [K,N], or stored [N,K] when tb (read strided, in the same order of accumulation). */
static void matmul_one(double *restrict c, const double *restrict a, const double *restrict b,
                       int64_t M, int64_t K, int64_t N, bool ta, bool tb)
{
    for (int64_t i = 0; i < M; i++) {
        double *crow = c + i * N;
        memset(crow, 0, (size_t)N * sizeof *crow);
        for (int64_t k = 0; k < K; k++) {
            double aik = ta ? a[k * M + i] : a[i * K + k];
            if (tb) {
                for (int64_t j = 0; j < N; j++)
                    crow[j] += aik * b[j * K + k];
                continue;
            }
            const double *brow = b + k * N;
            for (int64_t j = 0; j < N; j++)
                crow[j] += aik * brow[j];
        }
    }
}

/* x as an operand of a product at the graph's precision: rounded at tf32 and bf16, as is at f32
 * (where the interpreter keeps double). */
static double operand_round(tg_precision p, double x)
{
    return p == TG_PRECISION_TF32 || p == TG_PRECISION_BF16 ? precision_round(p, (float)x) : x;
}

/* A copy of n values rounded as operands of a product at precision p (precision_round), or NULL
 * when p rounds nothing (f32), or when there is no memory for the copy: the interpreter is the
 * tests' oracle and would then compute unrounded, which the tests' tolerances expose. */
static double *rounded(tg_precision p, const double *v, int64_t n)
{
    if (p != TG_PRECISION_TF32 && p != TG_PRECISION_BF16)
        return NULL;
    double *r = tg_alloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    for (int64_t i = 0; r && i < n; i++)
        r[i] = operand_round(p, v[i]);
    return r;
}

/* dst[K,N] = transpose of src stored [N,K]. */
static void transpose(double *restrict dst, const double *restrict src, int64_t K, int64_t N)
{
    for (int64_t j = 0; j < N; j++)
        for (int64_t k = 0; k < K; k++)
            dst[k * N + j] = src[j * K + k];
}

/* Batch strides (in elements) of a matmul operand broadcast to the output's batch dims. */
static void batch_strides(tg_shape operand, tg_shape out_batch, int64_t *stride)
{
    tg_shape batch = operand;
    batch.ndim -= 2;
    int64_t matrix = operand.d[batch.ndim] * operand.d[batch.ndim + 1];
    broadcast_strides(batch, out_batch, stride);
    for (int i = 0; i < out_batch.ndim; i++)
        stride[i] *= matrix;
}

static void matmul(const tg_graph *g, const tg_node *n, double *out, double *const *bufs)
{
    const tg_node *an = &g->nodes[n->src[0]], *bn = &g->nodes[n->src[1]];
    bool ta = n->iarg[0] != 0, tb = n->iarg[1] != 0;
    int nd = n->shape.ndim;
    int64_t M = n->shape.d[nd - 2], N = n->shape.d[nd - 1];
    int64_t K = an->shape.d[an->shape.ndim - (ta ? 2 : 1)];

    tg_shape batch = n->shape;
    batch.ndim -= 2;
    int64_t stride[2][TG_MAX_DIMS];
    batch_strides(an->shape, batch, stride[0]);
    batch_strides(bn->shape, batch, stride[1]);
    runs r;
    runs_init(&r, batch, 2, stride);
    int64_t len = run_len(&r), sa = run_stride(&r, 0), sb = run_stride(&r, 1);

    /* A transposed B is copied to [K,N] for contiguous reads; a B shared by consecutive batches
     * (a 2-D weight) is copied once. Without memory for the copy, B is read strided in place. */
    double *bt = tb ? tg_alloc((size_t)(K * N > 0 ? K * N : 1) * sizeof *bt) : NULL;
    const double *a0 = bufs[n->src[0]], *b0 = bufs[n->src[1]], *bt_of = NULL;
    double *ar = rounded(g->precision, a0, an->numel), *br = rounded(g->precision, b0, bn->numel);
    a0 = ar ? ar : a0;
    b0 = br ? br : b0;
    do {
        for (int64_t j = 0; j < len; j++) {
            const double *a = a0 + r.off[0] + j * sa, *b = b0 + r.off[1] + j * sb;
            if (bt) {
                if (b != bt_of)
                    transpose(bt, b, K, N);
                bt_of = b;
                b = bt;
            }
            matmul_one(out, a, b, M, K, N, ta, tb && !bt);
            out += M * N;
        }
    } while (runs_next(&r));
    free(bt);
    free(ar);
    free(br);
}

/* ---------------------------------------------------------------------------------------------
 * Indexing. Indices are i32 values held in doubles; anything outside [0, limit) (including NaN,
 * which fails both comparisons) selects nothing.
 * ------------------------------------------------------------------------------------------- */

static bool in_range(double v, int64_t limit) { return v >= 0 && v < (double)limit; }

static void one_hot(const tg_node *n, const tg_node *idx, double *out, const double *in)
{
    int64_t classes = n->iarg[0];
    memset(out, 0, (size_t)n->numel * sizeof *out);
    for (int64_t i = 0; i < idx->numel; i++)
        if (in_range(in[i], classes))
            out[i * classes + (int64_t)in[i]] = 1.0;
}

static void gather_rows(const tg_node *table, const tg_node *idx, double *out, const double *tab,
                        const double *ix)
{
    int64_t V = table->shape.d[0], D = table->shape.d[1];
    for (int64_t i = 0; i < idx->numel; i++) {
        if (in_range(ix[i], V))
            memcpy(out + i * D, tab + (int64_t)ix[i] * D, (size_t)D * sizeof *out);
        else
            memset(out + i * D, 0, (size_t)D * sizeof *out);
    }
}

static void scatter_rows(const tg_node *n, const tg_node *idx, double *out, const double *vals,
                         const double *ix)
{
    int64_t V = n->shape.d[0], D = n->shape.d[1];
    memset(out, 0, (size_t)n->numel * sizeof *out);
    for (int64_t i = 0; i < idx->numel; i++) {
        if (!in_range(ix[i], V))
            continue;
        double *row = out + (int64_t)ix[i] * D;
        for (int64_t j = 0; j < D; j++)
            row[j] += vals[i * D + j];
    }
}

/* TAKE_ALONG and SCATTER_ALONG around `axis`: idx (and TAKE's output, SCATTER's values) is
 * [outer, m, inner], x (TAKE's source, SCATTER's output) is [outer, len, inner].
 * TAKE: out[o, j, i] = x[o, idx[o, j, i], i]. SCATTER, its adjoint: out zero-filled, then
 * out[o, idx[o, j, i], i] += vals[o, j, i]. */
static void take_along(const tg_node *n, const tg_node *x, double *restrict out,
                       const double *restrict in, const double *restrict ix)
{
    int64_t outer, m, inner, len = x->shape.d[n->axis];
    split_axis(n->shape, n->axis, &outer, &m, &inner);
    for (int64_t o = 0; o < outer; o++) {
        const double *src = in + o * len * inner;
        for (int64_t j = 0; j < m; j++) {
            int64_t at = (o * m + j) * inner;
            for (int64_t i = 0; i < inner; i++)
                out[at + i] = in_range(ix[at + i], len) ? src[(int64_t)ix[at + i] * inner + i] : 0.0;
        }
    }
}

static void scatter_along(const tg_node *n, const tg_node *idx, double *restrict out,
                          const double *restrict vals, const double *restrict ix)
{
    int64_t outer, m, inner, len = n->shape.d[n->axis];
    split_axis(idx->shape, n->axis, &outer, &m, &inner);
    memset(out, 0, (size_t)n->numel * sizeof *out);
    for (int64_t o = 0; o < outer; o++) {
        double *dst = out + o * len * inner;
        for (int64_t j = 0; j < m; j++) {
            int64_t at = (o * m + j) * inner;
            for (int64_t i = 0; i < inner; i++)
                if (in_range(ix[at + i], len))
                    dst[(int64_t)ix[at + i] * inner + i] += vals[at + i];
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Random numbers (counter-based, see internal.h): element i depends only on seed, salt and i.
 * ------------------------------------------------------------------------------------------- */

static void randn(const tg_node *n, double *out, const double *hyper)
{
    uint64_t seed = (uint64_t)hyper[HYPER_SEED], salt = (uint64_t)n->iarg[0];
    for (int64_t i = 0; i < n->numel; i++)
        out[i] = rng_normal(seed, salt, (uint64_t)i);
}

static void dropout(const tg_node *n, double *restrict out, const double *restrict in,
                    const double *hyper)
{
    uint64_t seed = (uint64_t)hyper[HYPER_SEED], salt = (uint64_t)n->iarg[0];
    double p = n->farg;
    for (int64_t i = 0; i < n->numel; i++)
        out[i] = rng_uniform(seed, salt, (uint64_t)i) >= p ? in[i] / (1.0 - p) : 0.0;
}

/* ---------------------------------------------------------------------------------------------
 * Images, NCHW. Window position i (of kernel size k) of output position oy reads input row
 * oy * s - p + i; for each (kernel offset, axis) the outputs whose reads land inside the image
 * form one contiguous range [lo, hi), so the inner loops need no bounds checks.
 * ------------------------------------------------------------------------------------------- */

/* The output positions o in [0, n_out) with 0 <= o * s - p + i < n_in. */
static void valid_range(int64_t i, int64_t s, int64_t p, int64_t n_in, int64_t n_out, int64_t *lo,
                        int64_t *hi)
{
    int64_t off = i - p;    /* reads o * s + off */
    int64_t a = off >= 0 ? 0 : (-off + s - 1) / s;                  /* first o with o*s+off >= 0 */
    int64_t b = n_in - off <= 0 ? 0 : (n_in - off - 1) / s + 1;     /* first o with o*s+off >= n_in */
    *lo = a < n_out ? a : n_out;
    *hi = b < n_out ? b : n_out;
    if (*hi < *lo)
        *hi = *lo;
}

/* IM2COL (adjoint false): cols [N, C*kh*kw, Ho*Wo] from x [N, C, H, W].
 * COL2IM (adjoint true): x zero-filled, then every column entry added back to its pixel. */
static void im2col(const tg_node *n, const tg_node *src, bool adjoint, double *restrict out,
                   const double *restrict in)
{
    const tg_node *img = adjoint ? n : src;
    int64_t N = img->shape.d[0], C = img->shape.d[1], H = img->shape.d[2], W = img->shape.d[3];
    int64_t kh = n->iarg[0], kw = n->iarg[1], s = n->iarg[2], p = n->iarg[3];
    int64_t Ho = (H + 2 * p - kh) / s + 1, Wo = (W + 2 * p - kw) / s + 1;
    if (adjoint)
        memset(out, 0, (size_t)n->numel * sizeof *out);
    for (int64_t b = 0; b < N; b++) {
        for (int64_t c = 0; c < C; c++) {
            int64_t plane = (b * C + c) * H * W;
            for (int64_t i = 0; i < kh; i++) {
                int64_t ylo, yhi;
                valid_range(i, s, p, H, Ho, &ylo, &yhi);
                for (int64_t j = 0; j < kw; j++) {
                    int64_t xlo, xhi;
                    valid_range(j, s, p, W, Wo, &xlo, &xhi);
                    int64_t row = ((b * C + c) * kh + i) * kw + j;   /* of [N * C*kh*kw, Ho*Wo] */
                    for (int64_t oy = 0; oy < Ho; oy++) {
                        int64_t at = (row * Ho + oy) * Wo;
                        bool inside = oy >= ylo && oy < yhi;
                        int64_t pix = plane + (oy * s - p + i) * W - p + j;   /* + ox * s */
                        if (adjoint) {
                            if (inside)
                                for (int64_t ox = xlo; ox < xhi; ox++)
                                    out[pix + ox * s] += in[at + ox];
                            continue;
                        }
                        if (!inside) {
                            fill(out + at, Wo, 0.0);
                            continue;
                        }
                        fill(out + at, xlo, 0.0);
                        for (int64_t ox = xlo; ox < xhi; ox++)
                            out[at + ox] = in[pix + ox * s];
                        fill(out + at + xhi, Wo - xhi, 0.0);
                    }
                }
            }
        }
    }
}

/* Flat index (in the [H, W] plane) of the first maximum of the window of output (oy, ox), in
 * row-major order; padding never wins (a NaN does, like max2). -1 if the window lies wholly in
 * the padding. */
static int64_t window_argmax(const double *plane, int64_t H, int64_t W, int64_t k, int64_t s,
                             int64_t p, int64_t oy, int64_t ox)
{
    int64_t y0 = oy * s - p, x0 = ox * s - p, best = -1;
    int64_t y1 = y0 + k < H ? y0 + k : H, x1 = x0 + k < W ? x0 + k : W;
    for (int64_t y = y0 > 0 ? y0 : 0; y < y1; y++) {
        for (int64_t x = x0 > 0 ? x0 : 0; x < x1; x++) {
            double v = plane[y * W + x];
            if (best < 0 || v > plane[best] || (isnan(v) && !isnan(plane[best])))
                best = y * W + x;
        }
    }
    return best;
}

/* MAXPOOL2D (bwd false): out [N, C, Ho, Wo] = the max of each window of x.
 * MAXPOOL2D_BWD (bwd true): out shaped like x, zero-filled, then each window's upstream
 * gradient added at the window's first maximum. */
static void maxpool2d(const tg_node *n, const tg_node *x, bool bwd, double *restrict out,
                      const double *restrict in, const double *restrict grad)
{
    int64_t N = x->shape.d[0], C = x->shape.d[1], H = x->shape.d[2], W = x->shape.d[3];
    int64_t k = n->iarg[0], s = n->iarg[1], p = n->iarg[2];
    int64_t Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
    if (bwd)
        memset(out, 0, (size_t)n->numel * sizeof *out);
    for (int64_t pl = 0; pl < N * C; pl++) {
        const double *plane = in + pl * H * W;
        for (int64_t oy = 0; oy < Ho; oy++) {
            for (int64_t ox = 0; ox < Wo; ox++) {
                int64_t at = (pl * Ho + oy) * Wo + ox;
                int64_t best = window_argmax(plane, H, W, k, s, p, oy, ox);
                if (bwd) {
                    if (best >= 0)
                        out[pl * H * W + best] += grad[at];
                } else {
                    out[at] = best >= 0 ? plane[best] : -INFINITY;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Attention (OP_ATTENTION, _LSE, _BWD): q [.., T, D], k [.., S, D], v [.., S, E] (or [.., T, H, D]
 * and so on: heads interleaved, graph.h's iarg[3]), batch by batch
 * ------------------------------------------------------------------------------------------- */

typedef struct { int64_t batch, T, S, D, E, heads, out_heads; bool causal; double scale; tg_precision prec; } attn_dims;

static attn_dims attn_dims_of(const tg_graph *g, const tg_node *n)
{
    const int rows = n->iarg[3] > 0 ? 3 : 2;   /* interleaved heads: [.., T, H, D] (graph.h) */
    tg_shape q = g->nodes[n->src[0]].shape, v = g->nodes[n->src[2 < n->nsrc ? 2 : 1]].shape;
    attn_dims a = { 1, q.d[q.ndim - rows], g->nodes[n->src[1]].shape.d[q.ndim - rows], q.d[q.ndim - 1], v.d[v.ndim - 1],
                    n->iarg[3], n->op == OP_ATTENTION_BWD ? n->iarg[2] : 0, n->iarg[0] != 0, n->farg, g->precision };
    a.batch = shape_numel(q) / (a.T * a.D);
    return a;
}

/* Where row r of batch element b of an operand of W columns lies, laid out as the node says
 * (attn_row). */
static int64_t attn_at(const attn_dims *a, int64_t b, int64_t rows, int64_t W, int64_t r)
{
    return attn_row(b, rows, W, a->heads) + r * attn_stride(W, a->heads);
}

/* The columns query row r attends to: all S, or c <= r when causal. */
static int64_t attn_kept(const attn_dims *a, int64_t r) { return a->causal ? (r + 1 < a->S ? r + 1 : a->S) : a->S; }

/* The scaled score of query row r against key row c of batch element b. */
static double attn_score(const attn_dims *a, const double *q, const double *k, int64_t b, int64_t r, int64_t c)
{
    const double *qr = q + attn_at(a, b, a->T, a->D, r), *kc = k + attn_at(a, b, a->S, a->D, c);
    double dot = 0;
    for (int64_t d = 0; d < a->D; d++)
        dot += qr[d] * kc[d];
    return dot * a->scale;
}

/* Row r's log-sum-exp over its kept columns, in one pass (running max, rescaled sum): no scratch,
 * so the interpreter allocates nothing it could fail to get. */
static double attn_lse(const attn_dims *a, const double *q, const double *k, int64_t b, int64_t r)
{
    double mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < attn_kept(a, r); c++) {
        double x = attn_score(a, q, k, b, r, c);
        if (x > mx) {
            sum = sum * exp(mx - x) + 1;
            mx = x;
        } else {
            sum += exp(x - mx);
        }
    }
    return mx + log(sum);
}

/* ATTENTION (lse NULL) or ATTENTION_LSE (out NULL). */
static void attention(const attn_dims *a, const double *q, const double *k, const double *v, double *out, double *lse)
{
    for (int64_t b = 0; b < a->batch; b++) {
        for (int64_t r = 0; r < a->T; r++) {
            double l = attn_lse(a, q, k, b, r);
            if (lse)
                lse[b * a->T + r] = l;
            if (!out)
                continue;
            double *o = out + attn_at(a, b, a->T, a->E, r);
            memset(o, 0, sizeof(double) * (size_t)a->E);
            for (int64_t c = 0; c < attn_kept(a, r); c++) {
                double p = exp(attn_score(a, q, k, b, r, c) - l);
                const double *vc = v + attn_at(a, b, a->S, a->E, c);
                for (int64_t e = 0; e < a->E; e++)
                    o[e] += p * vc[e];
            }
        }
    }
}

/* ATTENTION_BWD: with p_c = exp(s_c - lse_r) and delta_r = d_out_r . out_r (= sum_c p_c dp_c):
 * dp_c = d_out_r . v_c, ds_c = scale p_c (dp_c - delta_r); dq_r = sum_c ds_c k_c, dk_c += ds_c
 * q_r, dv_c += p_c d_out_r, where p_c and ds_c enter those products as operands, rounded at tf32
 * and bf16 (as flash attention's backward rounds them; ds_c from the unrounded p_c). w picks the
 * one added into grad (zeroed): 0 dq, 1 dk, 2 dv, as the rows of pk parts (graph.h's
 * attn_row_packed). */
static void attention_backward(const attn_dims *a, int w, int64_t pk, double *const *in, double *grad)
{
    const double *q = in[0], *k = in[1], *v = in[2], *o = in[3], *dout = in[4], *lse = in[5];
    const int64_t rows = w == 0 ? a->T : a->S, cols = w == 2 ? a->E : a->D, part = pk > 1 ? w * a->heads * cols : 0;
    for (int64_t b = 0; b < a->batch; b++) {
        const double *ob = o + attn_row(b, a->T, a->E, a->out_heads);
        const int64_t os = attn_stride(a->E, a->out_heads);
        for (int64_t r = 0; r < a->T; r++) {
            const double *gr = dout + attn_at(a, b, a->T, a->E, r), *qr = q + attn_at(a, b, a->T, a->D, r);
            double delta = 0;
            for (int64_t e = 0; e < a->E; e++)
                delta += gr[e] * ob[r * os + e];
            for (int64_t c = 0; c < attn_kept(a, r); c++) {
                const double *kc = k + attn_at(a, b, a->S, a->D, c), *vc = v + attn_at(a, b, a->S, a->E, c);
                double p = exp(attn_score(a, q, k, b, r, c) - lse[b * a->T + r]), dp = 0;
                for (int64_t e = 0; e < a->E; e++)
                    dp += gr[e] * vc[e];
                double ds = operand_round(a->prec, p * (dp - delta) * a->scale);
                p = operand_round(a->prec, p);
                double *dr = grad + part + attn_row_packed(b, rows, cols, a->heads, pk) +
                             (w == 0 ? r : c) * attn_stride(cols, a->heads) * pk;
                if (w == 0)
                    for (int64_t d = 0; d < a->D; d++)
                        dr[d] += ds * kc[d];
                else if (w == 1)
                    for (int64_t d = 0; d < a->D; d++)
                        dr[d] += ds * qr[d];
                else
                    for (int64_t e = 0; e < a->E; e++)
                        dr[e] += p * gr[e];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Dispatch and the executor
 * ------------------------------------------------------------------------------------------- */

void ref_eval_node(const tg_graph *g, int id, double *const *bufs, const double *hyper)
{
    const tg_node *n = &g->nodes[id];
    double *out = bufs[id];
    const tg_node *s0 = n->nsrc > 0 ? &g->nodes[n->src[0]] : NULL;
    const tg_node *s1 = n->nsrc > 1 ? &g->nodes[n->src[1]] : NULL;
    const double *in0 = n->nsrc > 0 ? bufs[n->src[0]] : NULL;
    const double *in1 = n->nsrc > 1 ? bufs[n->src[1]] : NULL;

    /* Empty tensors: nothing to write, and the strided walks assume at least one element. */
    if (n->numel == 0)
        return;
    switch (n->op) {
    case OP_INPUT: case OP_PARAM: case OP_STATE:
        break;
    case OP_CONST:
        fill(out, n->numel, n->farg);
        break;
    case OP_HYPER:
        fill(out, n->numel, hyper[n->iarg[0]]);
        break;
    case OP_NEG: case OP_ABS: case OP_SQUARE: case OP_SQRT: case OP_RSQRT: case OP_EXP:
    case OP_LOG: case OP_RELU: case OP_TANH: case OP_SIGMOID: case OP_SIGN: case OP_STEP:
        unary(n->op, out, in0, n->numel);
        break;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_MIN: case OP_MAX:
    case OP_LESS: case OP_GREATER: case OP_EQUAL: case OP_WHERE: case OP_EXPAND:
        broadcast_eval(g, n, out, bufs);
        break;
    case OP_SUM:
        sum_axis(s0, n->axis, out, in0);
        break;
    case OP_RESHAPE:
        memcpy(out, in0, (size_t)n->numel * sizeof *out);
        break;
    case OP_PERMUTE:
        permute(n, s0, out, in0);
        break;
    case OP_MATMUL:
        matmul(g, n, out, bufs);
        break;
    case OP_ONE_HOT:
        one_hot(n, s0, out, in0);
        break;
    case OP_GATHER_ROWS:
        gather_rows(s0, s1, out, in0, in1);
        break;
    case OP_SCATTER_ROWS:
        scatter_rows(n, s1, out, in0, in1);
        break;
    case OP_SOFTMAX: case OP_LOG_SOFTMAX:
        softmax(n, out, in0);
        break;
    case OP_SIN: case OP_COS:
        unary(n->op, out, in0, n->numel);
        break;
    case OP_GELU: case OP_GELU_GRAD:
        gelu(n->op == OP_GELU_GRAD, n->iarg[0] != 0, out, in0, n->numel);
        break;
    case OP_IDENTITY:
        memcpy(out, in0, (size_t)n->numel * sizeof *out);
        break;
    case OP_ARGMAX:
        argmax(s0, n->axis, n->iarg[0] != 0, out, in0);
        break;
    case OP_TAKE_ALONG:
        take_along(n, s0, out, in0, in1);
        break;
    case OP_SCATTER_ALONG:
        scatter_along(n, s1, out, in0, in1);
        break;
    case OP_IOTA:
        for (int64_t i = 0; i < n->numel; i++)
            out[i] = (double)i;
        break;
    case OP_RANDN:
        randn(n, out, hyper);
        break;
    case OP_DROPOUT:
        dropout(n, out, in0, hyper);
        break;
    case OP_SLICE: case OP_PAD:
        slice_pad(n, s0, out, in0);
        break;
    case OP_SOFTMAX_CAUSAL: case OP_WHERE_CAUSAL:
        causal(n, out, in0);
        break;
    case OP_IM2COL: case OP_COL2IM:
        im2col(n, s0, n->op == OP_COL2IM, out, in0);
        break;
    case OP_MAXPOOL2D: case OP_MAXPOOL2D_BWD:
        maxpool2d(n, s0, n->op == OP_MAXPOOL2D_BWD, out, in0, in1);
        break;
    case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_BWD: {
        /* tf32, bf16: q, k, v (and the incoming gradient) rounded; the backward rounds p and ds as
         * it uses them; scores, softmax and sums f32 */
        attn_dims a = attn_dims_of(g, n);
        tg_precision p = g->precision;
        double *srcs[6], *copies[6] = { NULL };
        for (int k = 0; k < n->nsrc; k++) {
            bool operand = k < 3 || k == 4;
            copies[k] = operand ? rounded(p, bufs[n->src[k]], g->nodes[n->src[k]].numel) : NULL;
            srcs[k] = copies[k] ? copies[k] : bufs[n->src[k]];
        }
        if (n->op == OP_ATTENTION_BWD) {
            const int which = (int)n->iarg[1];   /* 3: all three, packed */
            memset(out, 0, sizeof(double) * (size_t)n->numel);
            for (int w = which == 3 ? 0 : which; w <= (which == 3 ? 2 : which); w++)
                attention_backward(&a, w, which == 3 ? 3 : 1, srcs, out);
        }
        else if (n->op == OP_ATTENTION_LSE)
            attention(&a, srcs[0], srcs[1], NULL, NULL, out);
        else
            attention(&a, srcs[0], srcs[1], srcs[2], out, NULL);
        for (int k = 0; k < n->nsrc; k++)
            free(copies[k]);
        break;
    }
    case OP_COUNT:
        abort();
    }
}

static bool is_bound_leaf(tg_op op) { return op == OP_INPUT || op == OP_PARAM || op == OP_STATE; }

void ref_exec_free(ref_exec *e);

ref_exec *ref_exec_new(const tg_graph *g, const tg_plan *plan, bool round_f32)
{
    ref_exec *e = tg_alloc(sizeof *e);
    if (!e)
        return NULL;
    e->g = g;
    e->round_f32 = round_f32;
    if (!graph_bf16_values(g, &e->bf16)) {
        free(e);
        return NULL;
    }
    e->arena = tg_alloc((plan->arena > 0 ? plan->arena : 1) * sizeof *e->arena);
    e->bufs = tg_alloc((size_t)(g->n > 0 ? g->n : 1) * sizeof *e->bufs);
    if (!e->arena || !e->bufs) {
        ref_exec_free(e);
        return NULL;
    }
    for (int i = 0; i < g->n; i++)
        e->bufs[i] = plan->offset[i] == PLAN_BOUND ? NULL : e->arena + plan->offset[i];
    return e;
}

void ref_exec_bind(ref_exec *e, int node, double *storage) { e->bufs[node] = storage; }

/* Node id, whose addend is first rounded to bf16 where it is a product plus its addend
 * (graph_product_addend: a bias; the other addends already are): read through a rounded copy. */
static void eval_rounding_addend(ref_exec *e, int id, const double *hyper)
{
    const tg_node *n = &e->g->nodes[id];
    int p = graph_product_addend(e->g, e->bf16, id), b = p < 0 ? -1 : n->src[0] == p ? n->src[1] : n->src[0];
    double *kept = b < 0 ? NULL : e->bufs[b], *copy = b < 0 ? NULL : rounded(TG_PRECISION_BF16, kept, e->g->nodes[b].numel);
    if (copy)
        e->bufs[b] = copy;
    ref_eval_node(e->g, id, e->bufs, hyper);
    if (copy) {
        e->bufs[b] = kept;
        free(copy);
    }
}

void ref_exec_run(ref_exec *e, const double *hyper)
{
    const tg_graph *g = e->g;
    for (int id = 0; id < g->n; id++) {
        const tg_node *n = &g->nodes[id];
        /* A non-leaf the plan left without memory is not needed by this run; a node that did
         * need it would fault on the NULL rather than read stale data. */
        if (is_bound_leaf(n->op) || !e->bufs[id])
            continue;
        eval_rounding_addend(e, id, hyper);
        if (e->round_f32 && n->dtype == TG_FLOAT32) {
            double *v = e->bufs[id];
            for (int64_t i = 0; i < n->numel; i++)
                v[i] = (double)(float)v[i];
        }
        if (graph_rounds(g, e->bf16, id)) {
            double *v = e->bufs[id];
            for (int64_t i = 0; i < n->numel; i++)
                v[i] = (double)precision_round(TG_PRECISION_BF16, (float)v[i]);
        }
        if (n->dtype == TG_INT32) {
            double *v = e->bufs[id];
            for (int64_t i = 0; i < n->numel; i++)
                v[i] = wrap_i32(v[i]);
        }
    }
}

double *ref_exec_value(ref_exec *e, int node) { return e->bufs[node]; }

void ref_exec_free(ref_exec *e)
{
    if (!e)
        return;
    free(e->arena);
    free(e->bufs);
    free(e->bf16);
    free(e);
}
