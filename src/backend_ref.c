/* The reference interpreter: every tensor is an array of doubles, every op a plain loop. It is
 * the oracle the other backends are tested against, so each kernel follows its op's contract in
 * internal.h as literally as possible; speed matters only as far as the model tests need it
 * (matmul and elementwise loops over contiguous runs). */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ref_exec {
    const tg_graph *g;      /* borrowed: must outlive the executor */
    double *arena;
    double **bufs;          /* per node: its values (arena slot or bound storage) */
    bool round_f32;
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

static double sign(double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }

/* NaN-propagating, like torch.minimum/maximum (fmin/fmax would drop the NaN). */
static double min2(double a, double b) { return (a < b || isnan(a)) ? a : b; }
static double max2(double a, double b) { return (a > b || isnan(a)) ? a : b; }

/* Integer division of i32 values held in doubles: C's truncation toward zero. Division by zero
 * has no defined result; 0 keeps the value finite and deterministic. */
static double idiv(double a, double b) { return b == 0 ? 0.0 : (double)((int64_t)a / (int64_t)b); }

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
    default:         abort();
    }
#undef EACH
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

/* ---------------------------------------------------------------------------------------------
 * Matmul
 * ------------------------------------------------------------------------------------------- */

/* C[M,N] = A'[M,K] B[K,N] with B contiguous row-major. A' is A or, with ta, the transpose of A
 * stored [K,M]. The i-k-j order keeps the inner loop contiguous in B and C and sums over k in
 * order, as the naive triple loop does. */
static void matmul_one(double *restrict c, const double *restrict a, const double *restrict b,
                       int64_t M, int64_t K, int64_t N, bool ta)
{
    for (int64_t i = 0; i < M; i++) {
        double *crow = c + i * N;
        memset(crow, 0, (size_t)N * sizeof *crow);
        for (int64_t k = 0; k < K; k++) {
            double aik = ta ? a[k * M + i] : a[i * K + k];
            const double *brow = b + k * N;
            for (int64_t j = 0; j < N; j++)
                crow[j] += aik * brow[j];
        }
    }
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

    /* A transposed B is copied to [K,N] so the one i-k-j kernel serves every case; a B shared by
     * consecutive batches (a 2-D weight) is copied once. */
    double *bt = tb ? tg_xmalloc((size_t)(K * N > 0 ? K * N : 1) * sizeof *bt) : NULL;
    const double *a0 = bufs[n->src[0]], *b0 = bufs[n->src[1]], *bt_of = NULL;
    do {
        for (int64_t j = 0; j < len; j++) {
            const double *a = a0 + r.off[0] + j * sa, *b = b0 + r.off[1] + j * sb;
            if (tb) {
                if (b != bt_of)
                    transpose(bt, b, K, N);
                bt_of = b;
                b = bt;
            }
            matmul_one(out, a, b, M, K, N, ta);
            out += M * N;
        }
    } while (runs_next(&r));
    free(bt);
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

/* ---------------------------------------------------------------------------------------------
 * Dispatch and the executor
 * ------------------------------------------------------------------------------------------- */

static void fill(double *out, int64_t n, double v)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = v;
}

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
    case OP_COUNT:
        abort();
    }
}

static bool is_bound_leaf(tg_op op) { return op == OP_INPUT || op == OP_PARAM || op == OP_STATE; }

ref_exec *ref_exec_new(const tg_graph *g, const tg_plan *plan, bool round_f32)
{
    ref_exec *e = tg_xmalloc(sizeof *e);
    e->g = g;
    e->round_f32 = round_f32;
    e->arena = tg_xmalloc((plan->arena > 0 ? plan->arena : 1) * sizeof *e->arena);
    e->bufs = tg_xmalloc((size_t)(g->n > 0 ? g->n : 1) * sizeof *e->bufs);
    for (int i = 0; i < g->n; i++)
        e->bufs[i] = plan->offset[i] == PLAN_BOUND ? NULL : e->arena + plan->offset[i];
    return e;
}

void ref_exec_bind(ref_exec *e, int node, double *storage) { e->bufs[node] = storage; }

void ref_exec_run(ref_exec *e, const double *hyper)
{
    const tg_graph *g = e->g;
    for (int id = 0; id < g->n; id++) {
        const tg_node *n = &g->nodes[id];
        /* A non-leaf the plan left without memory is not needed by this run; a node that did
         * need it would fault on the NULL rather than read stale data. */
        if (is_bound_leaf(n->op) || !e->bufs[id])
            continue;
        ref_eval_node(g, id, e->bufs, hyper);
        if (e->round_f32 && n->dtype == TG_FLOAT32) {
            double *v = e->bufs[id];
            for (int64_t i = 0; i < n->numel; i++)
                v[i] = (double)(float)v[i];
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
    free(e);
}
