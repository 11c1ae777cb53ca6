/* The ops documented after tg_nll_loss in tensorgrad.h (sin ... nearest_upsample2d) and the
 * layers tg_rmsnorm / tg_conv, checked four ways:
 *
 *  1. Forward values against naive float64 loops written here (independent of the library), run
 *     through the reference interpreter (tg_probe) in double precision (tolerance 1e-12) and
 *     with every f32 node rounded to float (tolerance 1e-5); both use check_close's measure
 *     |a - b| <= tol * max(1, |a|, |b|). Output shape and dtype are checked too.
 *  2. Gradients against central finite differences in double precision. For an op case the loss
 *     is sum(op(inputs) * W), W a fixed random input of the op's output shape (+-[0.5, 1.5]).
 *     Every element of every f32 input (W included) and of every parameter is perturbed by
 *     +-H = 1e-6 and the measure is
 *         |analytic - numeric| / max(|analytic|, |numeric|, 1e-5) <= 1e-4
 *     (the floor allows an absolute 1e-9 where the true gradient is ~0: the rounding noise of
 *     the central difference). Inputs stay away from kinks (max_pool inputs are distinct by a
 *     margin, clamp inputs away from the bounds); the kinks themselves get exact checks.
 *     Inputs that must get no gradient are checked to be exactly 0.
 *  3. Trace-time errors: tg_probe_new returns NULL with a message naming this file and the line
 *     of the op call (__LINE__ on the same line), the op and the offending shape(s).
 *  4. randn / dropout seeding, and AdamW's decay_filter through the public API.
 *
 * Everything is table driven: one forward function (op_forward) driven by an opctx, one naive
 * reference (ref_eval), and small case tables per op. */
#include "internal.h"
#include "check.h"
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "probe_util.h"
#include <sys/wait.h>
#include <unistd.h>

#define TOL64 1e-12
#define TOL32 1e-5

/* Seeds for randn/dropout, using all 64 bits (small seeds: see test_seed_bits). */
#define SEED_A 0x9E3779B97F4A7C15ull
#define SEED_B 0x243F6A8885A308D3ull
/* Below 2^53: the probe's (double) seed slot holds it exactly, so the kernels see this value. */
#define SEED_C 0x000F6A8885A308D3ull

/* ---------------------------------------------------------------------------------------------
 * What to test
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    O_SIN, O_COS, O_GELU, O_GELU_TANH, O_SILU, O_CLAMP,
    O_ARGMAX, O_ARGMIN, O_FLATTEN, O_SPLIT_HEADS, O_MERGE_HEADS, O_HEADS_ROUND,
    O_TAKE, O_ARANGE, O_ZEROS, O_ONES, O_BUILD_MIX,
    O_NARROW, O_CONCAT, O_STACK, O_CONCAT_DUP, O_STACK_DUP, O_SPLIT_PIECE, O_SPLIT_REV,
    O_SOFTMAX_CAUSAL, O_WHERE_CAUSAL, O_STOP_GRAD, O_DROPOUT,
    O_CONV2D, O_MAXPOOL, O_UPSAMPLE, O_RMSNORM, O_CONV_LAYER
} opk;
static const char *const opname[] = {
    "sin", "cos", "gelu", "gelu_tanh", "silu", "clamp",
    "argmax", "argmin", "flatten", "split_heads", "merge_heads", "merge_heads(split_heads)",
    "take_along_axis", "arange", "zeros", "ones", "x * ones + (arange + zeros)",
    "narrow", "concat", "stack", "concat(a, b, a)", "stack(a, b, a)", "split (one piece)", "split (pieces concatenated in reverse)",
    "softmax_causal", "where_causal", "stop_gradient", "dropout",
    "conv2d", "max_pool2d", "nearest_upsample2d", "tg_rmsnorm", "tg_conv"
};

typedef struct {
    opk op;
    double lo, hi;       /* clamp bounds; where_causal fill = lo; dropout p = lo; rmsnorm eps given = lo */
    int axis;            /* argmax/argmin, flatten start, take, narrow, concat, stack, split */
    int64_t start, len;  /* narrow; arange n = len */
    int n;               /* heads; inputs of concat/stack; number of split sizes */
    int64_t sizes[6];    /* split */
    int piece;           /* split: which piece */
    int k, stride, pad;  /* conv2d/max_pool2d/tg_conv; upsample factor = k */
    tg_dtype dt;         /* builders */
    tg_shape shp;        /* zeros/ones */
    const void *layer;   /* tg_rmsnorm or tg_conv2d_layer */
} opctx;

static tg_tensor op_forward(const void *vc, const tg_tensor *in) {
    const opctx *c = vc;
    switch (c->op) {
    case O_SIN: return tg_sin(in[0]);
    case O_COS: return tg_cos(in[0]);
    case O_GELU: return tg_gelu(in[0]);
    case O_GELU_TANH: return tg_gelu_tanh(in[0]);
    case O_SILU: return tg_silu(in[0]);
    case O_CLAMP: return tg_clamp(in[0], c->lo, c->hi);
    case O_ARGMAX: return tg_argmax(in[0], c->axis);
    case O_ARGMIN: return tg_argmin(in[0], c->axis);
    case O_FLATTEN: return tg_flatten(in[0], c->axis);
    case O_SPLIT_HEADS: return tg_split_heads(in[0], c->n);
    case O_MERGE_HEADS: return tg_merge_heads(in[0]);
    case O_HEADS_ROUND: return tg_merge_heads(tg_split_heads(in[0], c->n));
    case O_TAKE: return tg_take_along_axis(in[0], in[1], c->axis);
    case O_ARANGE: return tg_arange(c->len, c->dt);
    case O_ZEROS: return tg_zeros_at(TG_HERE, c->shp, c->dt);
    case O_ONES: return tg_ones_at(TG_HERE, c->shp, c->dt);
    case O_BUILD_MIX:   /* in[0] [3,4] */
        return tg_add(tg_mul(in[0], tg_ones(TG_FLOAT32, 3, 4)), tg_add(tg_arange(4, TG_FLOAT32), tg_zeros(TG_FLOAT32, 3, 1)));
    case O_NARROW: return tg_narrow(in[0], c->axis, c->start, c->len);
    case O_CONCAT: return tg_concat(in, c->n, c->axis);
    case O_STACK: return tg_stack(in, c->n, c->axis);
    case O_CONCAT_DUP: case O_STACK_DUP: {   /* the same tensor twice: its gradients add up */
        tg_tensor aba[3] = { in[0], in[1], in[0] };
        return c->op == O_CONCAT_DUP ? tg_concat(aba, 3, c->axis) : tg_stack(aba, 3, c->axis);
    }
    case O_SPLIT_PIECE: case O_SPLIT_REV: {
        tg_tensor out[6], rev[6];
        tg_split(in[0], c->sizes, c->n, c->axis, out);
        if (c->op == O_SPLIT_PIECE) return out[c->piece];
        for (int i = 0; i < c->n; i++) rev[i] = out[c->n - 1 - i];
        return tg_concat(rev, c->n, c->axis);
    }
    case O_SOFTMAX_CAUSAL: return tg_softmax_causal(in[0]);
    case O_WHERE_CAUSAL: return tg_where_causal(in[0], c->lo);
    case O_STOP_GRAD: return tg_stop_gradient(in[0]);
    case O_DROPOUT: return tg_dropout(in[0], c->lo);
    case O_CONV2D: return tg_conv2d(in[0], in[1], c->stride, c->pad);
    case O_MAXPOOL: return tg_max_pool2d(in[0], c->k, c->stride, c->pad);
    case O_UPSAMPLE: return tg_nearest_upsample2d(in[0], c->k);
    case O_RMSNORM: return tg_rmsnorm((const tg_rmsnorm *)c->layer, in[0]);
    case O_CONV_LAYER: return tg_conv((const tg_conv2d_layer *)c->layer, in[0]);
    }
    return in[0];
}

/* ---------------------------------------------------------------------------------------------
 * The naive float64 reference (host tensors ht: probe_util.h)
 * ------------------------------------------------------------------------------------------- */

static int norm_axis(int axis, int ndim) { return axis < 0 ? axis + ndim : axis; }

static double gelu_ref(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double gelu_tanh_ref(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static ht ref_arg(ht x, int axis, bool want_min) {
    bool better;
    if (axis == TG_ALL) {
        ht o = ht_new(TG_SHAPE0);
        int64_t best = 0;
        for (int64_t i = 1; i < nel(x.s); i++) {
            better = want_min ? x.v[i] < x.v[best] : x.v[i] > x.v[best];
            if (better) best = i;
        }
        o.v[0] = (double)best;
        return o;
    }
    int a = norm_axis(axis, x.s.ndim);
    tg_shape s = { 0, { 0 } };
    for (int i = 0; i < x.s.ndim; i++) if (i != a) s.d[s.ndim++] = x.s.d[i];
    ht o = ht_new(s);
    int64_t outer, n, inner;
    split_around(x.s, a, &outer, &n, &inner);
    for (int64_t p = 0; p < outer; p++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t best = 0;
            for (int64_t k = 1; k < n; k++) {
                double v = x.v[(p * n + k) * inner + i], b = x.v[(p * n + best) * inner + i];
                better = want_min ? v < b : v > b;
                if (better) best = k;
            }
            o.v[p * inner + i] = (double)best;
        }
    return o;
}

static ht ref_narrow(ht x, int axis, int64_t start, int64_t len) {
    int a = norm_axis(axis, x.s.ndim);
    tg_shape s = x.s;
    s.d[a] = len;
    ht o = ht_new(s);
    int64_t outer, n, inner;
    split_around(x.s, a, &outer, &n, &inner);
    for (int64_t p = 0; p < outer; p++)
        for (int64_t j = 0; j < len; j++)
            for (int64_t i = 0; i < inner; i++) o.v[(p * len + j) * inner + i] = x.v[(p * n + start + j) * inner + i];
    return o;
}

static ht ref_concat(const ht *x, int cnt, int axis) {
    int a = norm_axis(axis, x[0].s.ndim);
    tg_shape s = x[0].s;
    s.d[a] = 0;
    for (int k = 0; k < cnt; k++) s.d[a] += x[k].s.d[a];
    ht o = ht_new(s);
    int64_t outer, total, inner, off = 0;
    split_around(s, a, &outer, &total, &inner);
    for (int k = 0; k < cnt; k++) {
        int64_t nk = x[k].s.d[a];
        for (int64_t p = 0; p < outer; p++)
            for (int64_t j = 0; j < nk; j++)
                for (int64_t i = 0; i < inner; i++) o.v[(p * total + off + j) * inner + i] = x[k].v[(p * nk + j) * inner + i];
        off += nk;
    }
    return o;
}

static ht ref_stack(const ht *x, int cnt, int axis) {
    int nd = x[0].s.ndim, a = axis < 0 ? axis + nd + 1 : axis;
    tg_shape s = { nd + 1, { 0 } };
    for (int i = 0, j = 0; i < s.ndim; i++) s.d[i] = i == a ? cnt : x[0].s.d[j++];
    ht o = ht_new(s);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < a; i++) outer *= x[0].s.d[i];
    for (int i = a; i < nd; i++) inner *= x[0].s.d[i];
    for (int k = 0; k < cnt; k++)
        for (int64_t p = 0; p < outer; p++)
            for (int64_t i = 0; i < inner; i++) o.v[(p * cnt + k) * inner + i] = x[k].v[p * inner + i];
    return o;
}

/* [..., T, H*Dh] -> [..., H, T, Dh] (merge: the inverse). */
static ht ref_heads(ht x, int heads, bool merge) {
    int nd = x.s.ndim;
    tg_shape s = x.s;
    int64_t H, T, Dh;
    if (!merge) {
        T = x.s.d[nd - 2]; H = heads; Dh = x.s.d[nd - 1] / heads;
        s.ndim = nd + 1;
        s.d[nd - 2] = H; s.d[nd - 1] = T; s.d[nd] = Dh;
    } else {
        H = x.s.d[nd - 3]; T = x.s.d[nd - 2]; Dh = x.s.d[nd - 1];
        s.ndim = nd - 1;
        s.d[nd - 3] = T; s.d[nd - 2] = H * Dh;
    }
    ht o = ht_new(s);
    int64_t B = nel(x.s) / (H * T * Dh);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t d = 0; d < Dh; d++) {
                    int64_t tdh = ((b * T + t) * H + h) * Dh + d;   /* [.., T, H*Dh] */
                    int64_t htd = ((b * H + h) * T + t) * Dh + d;   /* [.., H, T, Dh] */
                    if (merge) o.v[tdh] = x.v[htd];
                    else o.v[htd] = x.v[tdh];
                }
    return o;
}

static ht ref_take(ht x, ht idx, int axis) {
    int a = norm_axis(axis, x.s.ndim);
    ht o = ht_new(idx.s);
    int64_t outer, n, inner, m = idx.s.d[a];
    split_around(x.s, a, &outer, &n, &inner);
    for (int64_t p = 0; p < outer; p++)
        for (int64_t j = 0; j < m; j++)
            for (int64_t i = 0; i < inner; i++) {
                double k = idx.v[(p * m + j) * inner + i];
                o.v[(p * m + j) * inner + i] = k >= 0 && k < (double)n ? x.v[(p * n + (int64_t)k) * inner + i] : 0;
            }
    return o;
}

/* Over the last two axes [.., R, C]: softmax over columns c <= r (causal) or the fill. */
static ht ref_causal(ht x, bool softmax, double fillv) {
    int nd = x.s.ndim;
    int64_t R = x.s.d[nd - 2], C = x.s.d[nd - 1], B = nel(x.s) / (R * C);
    ht o = ht_new(x.s);
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < R; r++) {
            const double *px = x.v + (b * R + r) * C;
            double *po = o.v + (b * R + r) * C;
            if (!softmax) {
                for (int64_t c = 0; c < C; c++) po[c] = c > r ? fillv : px[c];
                continue;
            }
            double mx = -INFINITY, z = 0;
            for (int64_t c = 0; c < C && c <= r; c++) mx = px[c] > mx ? px[c] : mx;
            for (int64_t c = 0; c < C && c <= r; c++) z += exp(px[c] - mx);
            for (int64_t c = 0; c < C; c++) po[c] = c <= r ? exp(px[c] - mx) / z : 0;
        }
    return o;
}

/* Direct convolution, zero padding: out[n,o,y,x] = sum_{c,i,j} x[n,c,y*s-p+i,x*s-p+j] w[o,c,i,j]. */
static ht ref_conv(ht x, ht w, int s, int p) {
    int64_t N = x.s.d[0], C = x.s.d[1], H = x.s.d[2], W = x.s.d[3];
    int64_t O = w.s.d[0], kh = w.s.d[2], kw = w.s.d[3];
    int64_t Ho = (H + 2 * p - kh) / s + 1, Wo = (W + 2 * p - kw) / s + 1;
    ht o = ht_new(TG_SHAPE(N, O, Ho, Wo));
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < O; oc++)
            for (int64_t oy = 0; oy < Ho; oy++)
                for (int64_t ox = 0; ox < Wo; ox++) {
                    double acc = 0;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t i = 0; i < kh; i++)
                            for (int64_t j = 0; j < kw; j++) {
                                int64_t iy = oy * s - p + i, ix = ox * s - p + j;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                                acc += x.v[((n * C + c) * H + iy) * W + ix] * w.v[((oc * C + c) * kh + i) * kw + j];
                            }
                    o.v[((n * O + oc) * Ho + oy) * Wo + ox] = acc;
                }
    return o;
}

/* Max over each k x k window; positions in the padding never count. */
static ht ref_maxpool(ht x, int k, int s, int p) {
    int64_t N = x.s.d[0], C = x.s.d[1], H = x.s.d[2], W = x.s.d[3];
    int64_t Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
    ht o = ht_new(TG_SHAPE(N, C, Ho, Wo));
    for (int64_t pl = 0; pl < N * C; pl++)
        for (int64_t oy = 0; oy < Ho; oy++)
            for (int64_t ox = 0; ox < Wo; ox++) {
                double mx = -INFINITY;
                for (int64_t i = 0; i < k; i++)
                    for (int64_t j = 0; j < k; j++) {
                        int64_t iy = oy * s - p + i, ix = ox * s - p + j;
                        if (iy >= 0 && iy < H && ix >= 0 && ix < W && x.v[(pl * H + iy) * W + ix] > mx)
                            mx = x.v[(pl * H + iy) * W + ix];
                    }
                o.v[(pl * Ho + oy) * Wo + ox] = mx;
            }
    return o;
}

static ht ref_upsample(ht x, int f) {
    int64_t N = x.s.d[0], C = x.s.d[1], H = x.s.d[2], W = x.s.d[3];
    ht o = ht_new(TG_SHAPE(N, C, H * f, W * f));
    for (int64_t pl = 0; pl < N * C; pl++)
        for (int64_t y = 0; y < H * f; y++)
            for (int64_t xx = 0; xx < W * f; xx++) o.v[(pl * H * f + y) * W * f + xx] = x.v[(pl * H + y / f) * W + xx / f];
    return o;
}

static ht ref_eval(const opctx *c, const ht *x, tg_model *m, double *const *pv) {
    if (c->op <= O_CLAMP) {
        ht o = ht_new(x[0].s);
        for (int64_t i = 0; i < nel(o.s); i++) {
            double v = x[0].v[i];
            switch (c->op) {
            case O_SIN: o.v[i] = sin(v); break;
            case O_COS: o.v[i] = cos(v); break;
            case O_GELU: o.v[i] = gelu_ref(v); break;
            case O_GELU_TANH: o.v[i] = gelu_tanh_ref(v); break;
            case O_SILU: o.v[i] = v / (1 + exp(-v)); break;
            default: o.v[i] = fmin(fmax(v, c->lo), c->hi); break;   /* torch.clamp: min(max(x, lo), hi) */
            }
        }
        return o;
    }
    switch (c->op) {
    case O_ARGMAX: case O_ARGMIN: return ref_arg(x[0], c->axis, c->op == O_ARGMIN);
    case O_FLATTEN: {
        tg_shape s = x[0].s;
        if (s.ndim == 0) s = TG_SHAPE(1);
        else {
            int a = norm_axis(c->axis, s.ndim);
            for (int i = a + 1; i < s.ndim; i++) s.d[a] *= s.d[i];
            s.ndim = a + 1;
        }
        ht o = ht_new(s);
        memcpy(o.v, x[0].v, (size_t)nel(s) * sizeof(double));
        return o;
    }
    case O_SPLIT_HEADS: return ref_heads(x[0], c->n, false);
    case O_MERGE_HEADS: return ref_heads(x[0], 0, true);
    case O_STOP_GRAD: case O_HEADS_ROUND: {
        ht o = ht_new(x[0].s);
        memcpy(o.v, x[0].v, (size_t)nel(o.s) * sizeof(double));
        return o;
    }
    case O_TAKE: return ref_take(x[0], x[1], c->axis);
    case O_ARANGE: {
        ht o = ht_new(TG_SHAPE(c->len));
        for (int64_t i = 0; i < c->len; i++) o.v[i] = (double)i;
        return o;
    }
    case O_ZEROS: case O_ONES: {
        ht o = ht_new(c->shp);
        for (int64_t i = 0; i < nel(o.s); i++) o.v[i] = c->op == O_ONES;
        return o;
    }
    case O_BUILD_MIX: {
        ht o = ht_new(x[0].s);
        for (int64_t i = 0; i < nel(o.s); i++) o.v[i] = x[0].v[i] + (double)(i % 4);
        return o;
    }
    case O_NARROW: return ref_narrow(x[0], c->axis, c->start, c->len);
    case O_CONCAT: return ref_concat(x, c->n, c->axis);
    case O_STACK: return ref_stack(x, c->n, c->axis);
    case O_CONCAT_DUP: case O_STACK_DUP: {
        ht aba[3] = { x[0], x[1], x[0] };
        return c->op == O_CONCAT_DUP ? ref_concat(aba, 3, c->axis) : ref_stack(aba, 3, c->axis);
    }
    case O_SPLIT_PIECE: case O_SPLIT_REV: {
        ht piece[6];
        int64_t off = 0;
        for (int i = 0; i < c->n; i++) {
            piece[c->n - 1 - i] = ref_narrow(x[0], c->axis, off, c->sizes[i]);   /* reversed order */
            off += c->sizes[i];
        }
        ht o;
        if (c->op == O_SPLIT_PIECE) {
            o = piece[c->n - 1 - c->piece];
            piece[c->n - 1 - c->piece].v = NULL;
        } else {
            o = ref_concat(piece, c->n, c->axis);
        }
        for (int i = 0; i < c->n; i++) free(piece[i].v);
        return o;
    }
    case O_SOFTMAX_CAUSAL: return ref_causal(x[0], true, 0);
    case O_WHERE_CAUSAL: return ref_causal(x[0], false, c->lo);
    case O_CONV2D: return ref_conv(x[0], x[1], c->stride, c->pad);
    case O_MAXPOOL: return ref_maxpool(x[0], c->k, c->stride, c->pad);
    case O_UPSAMPLE: return ref_upsample(x[0], c->k);
    case O_RMSNORM: {
        const tg_rmsnorm *l = c->layer;
        double eps = c->lo > 0 ? c->lo : 1e-6;   /* the documented default, not the layer's field */
        int64_t D = x[0].s.d[x[0].s.ndim - 1], rows = nel(x[0].s) / D;
        ht o = ht_new(x[0].s);
        for (int64_t r = 0; r < rows; r++) {
            double ms = 0;
            for (int64_t k = 0; k < D; k++) ms += x[0].v[r * D + k] * x[0].v[r * D + k];
            ms /= (double)D;
            for (int64_t k = 0; k < D; k++) o.v[r * D + k] = x[0].v[r * D + k] / sqrt(ms + eps) * pv[l->g.id][k];
        }
        return o;
    }
    case O_CONV_LAYER: {
        const tg_conv2d_layer *l = c->layer;
        ht w = { tg_model_param_shape(m, l->W.id), pv[l->W.id] }, o = ref_conv(x[0], w, c->stride, c->pad);
        if (c->n) {   /* has a bias */
            int64_t O = o.s.d[1], hw = o.s.d[2] * o.s.d[3];
            for (int64_t i = 0; i < nel(o.s); i++) o.v[i] += pv[l->b.id][(i / hw) % O];
        }
        return o;
    }
    default: return ht_new(x[0].s);
    }
}

static tg_dtype ref_dtype(const opctx *c, const tg_input_decl *decl) {
    switch (c->op) {
    case O_ARGMAX: case O_ARGMIN: return TG_INT32;
    case O_ARANGE: case O_ZEROS: case O_ONES: return c->dt;
    default: return decl[0].dtype;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Forward cases: fill inputs and parameters once, compute the expectation with the loops
 * above, run the probe in double and in emulated f32, compare shape, dtype and every element.
 * ------------------------------------------------------------------------------------------- */

static int n_fwd_cases;

static void run_case(const char *what, const opctx *c, tg_model *model, int n_in, const inspec *ins) {
    tg_model *m = model ? model : tg_model_new(7);
    host_case h;
    host_case_fill(&h, m, n_in, ins);
    ht want = ref_eval(c, h.x, m, h.pv);
    n_fwd_cases++;
    probe_compare_forward(what, m, op_forward, c, &h, want, (int)ref_dtype(c, h.decl), SEED_A, TOL64, TOL32);
    free(want.v);
    host_case_free(&h);
    if (!model) tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Gradients by central finite differences (probe_util.h, as test_grad.c)
 * ------------------------------------------------------------------------------------------- */

/* An op case: check the gradients of sum(op * W), W random of the op's output shape. */
static tg_probe *grad_case_seeded(const char *what, const opctx *c, tg_model *model, int n_in, const inspec *ins,
                                  uint64_t seed, bool keep) {
    return op_gradcheck(what, op_forward, c, model, n_in, ins, seed, keep);
}
static void grad_case(const char *what, const opctx *c, tg_model *model, int n_in, const inspec *ins) {
    grad_case_seeded(what, c, model, n_in, ins, SEED_A, false);
}

/* Both: forward against the reference and gradient by finite differences. */
static void both(const char *what, const opctx *c, tg_model *model, int n_in, const inspec *ins) {
    run_case(what, c, model, n_in, ins);
    grad_case(what, c, model, n_in, ins);
}

/* ---------------------------------------------------------------------------------------------
 * Elementwise: sin, cos, gelu, gelu_tanh, silu, clamp
 * ------------------------------------------------------------------------------------------- */

static void test_elementwise(void) {
    char what[200], b1[96];
    static const opk ops[] = { O_SIN, O_COS, O_GELU, O_GELU_TANH, O_SILU };
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++) {
        opctx c = { .op = ops[k] };
        inspec ins[] = { FIN("x", -4, 4, 3, 1, 7), FIN("x", -10, 10, 5), QIN("x", 2, 5) };
        for (size_t i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "%s %s%s", opname[ops[k]], shape_s(ins[i].d.shape, b1), i == 2 ? " (quantized)" : "");
            both(what, &c, NULL, 1, &ins[i]);
        }
    }
    /* Known values, as PyTorch prints them: F.gelu(1) and F.gelu(-2), exact and tanh forms. */
    static const struct { opk op; double x, want; } known[] = {
        { O_GELU, 1.0, 0.8413447460685429 }, { O_GELU, -2.0, -0.04550026389635842 },
        { O_GELU_TANH, 1.0, 0.8411919906082768 }, { O_GELU_TANH, -2.0, -0.04540230591222494 },
    };
    for (size_t k = 0; k < sizeof known / sizeof *known; k++) {
        opctx c = { .op = known[k].op };
        tg_input_decl d[1] = { TG_F32("x", 1) };
        tg_error err;
        memset(&err, 0, sizeof err);
        tg_model *m = tg_model_new(1);
        tg_probe *p = tg_probe_new(m, op_forward, &c, d, 1, false, false, &err);
        CHECK(p != NULL, "%s(%g): %s", opname[known[k].op], known[k].x, err.msg);
        if (p) {
            tg_probe_input(p, 0)[0] = known[k].x;
            tg_probe_run(p);
            snprintf(what, sizeof what, "%s(%g) vs PyTorch", opname[known[k].op], known[k].x);
            CHECK_CLOSE(tg_probe_output(p)[0], known[k].want, 1e-15, what);
            tg_probe_free(p);
        }
        tg_model_free(m);
    }

    /* clamp: values on the bounds, lo > hi (hi everywhere), lo == hi, infinite bounds, i32. */
    struct { double lo, hi; inspec x; } cl[] = {
        { -0.5, 0.5, QIN("x", 4, 5) }, { -0.5, 0.5, FIN("x", -2, 2, 3, 1, 5) }, { 0.25, -0.25, FIN("x", -2, 2, 7) },
        { 0.5, 0.5, QIN("x", 3, 4) }, { -INFINITY, 0.5, FIN("x", -2, 2, 9) }, { -0.5, INFINITY, FIN("x", -2, 2, 9) },
        { -1, 2, IIN("x", -4, 4, 3, 5) },
    };
    for (size_t k = 0; k < sizeof cl / sizeof *cl; k++) {
        opctx c = { .op = O_CLAMP, .lo = cl[k].lo, .hi = cl[k].hi };
        snprintf(what, sizeof what, "clamp(x %s%s, %g, %g)", shape_s(cl[k].x.d.shape, b1),
                 cl[k].x.d.dtype == TG_INT32 ? " i32" : cl[k].x.fill == F_QUANT ? " on the bounds" : "", cl[k].lo, cl[k].hi);
        run_case(what, &c, NULL, 1, &cl[k].x);
        if (cl[k].x.fill == F_UNI) grad_case(what, &c, NULL, 1, &cl[k].x);   /* off the bounds: FD applies */
    }
    /* At the kinks: the gradient passes where lo <= x <= hi (bounds included) and is 0 outside;
     * with lo > hi it is 0 everywhere. Exact. */
    static const double bounds[][2] = { { -0.5, 0.5 }, { 0.5, 0.5 }, { 0.5, -0.5 }, { -1, 1 } };
    for (size_t k = 0; k < sizeof bounds / sizeof *bounds; k++) {
        double lo = bounds[k][0], hi = bounds[k][1];
        opctx c = { .op = O_CLAMP, .lo = lo, .hi = hi };
        wctx w = { op_forward, &c, 1 };
        inspec ins[2] = { QIN("x", 6, 5), AIN("W", 0.5, 1.5, 6, 5) };
        tg_model *m = tg_model_new(2);
        snprintf(what, sizeof what, "clamp(x, %g, %g) gradient at the bounds", lo, hi);
        tg_probe *p = make_probe(what, m, weighted_loss, &w, 2, ins, true, false, 0);
        if (p) {
            const double *x = tg_probe_input(p, 0), *W = tg_probe_input(p, 1), *g = tg_probe_input_grad(p, 0);
            int bad = 0, on_lo = 0, on_hi = 0, inside = 0;
            for (int i = 0; i < 30; i++) {
                bool pass = lo <= x[i] && x[i] <= hi;
                on_lo += x[i] == lo;
                on_hi += x[i] == hi;
                inside += pass;
                if (!g || g[i] != (pass ? W[i] : 0.0)) bad++;
            }
            CHECK(on_lo > 0 && on_hi > 0, "%s: the test wants values on both bounds (%d, %d)", what, on_lo, on_hi);
            CHECK(bad == 0, "%s: %d of 30 gradients are not W where lo <= x <= hi and 0 elsewhere (%d inside)",
                  what, bad, inside);
            tg_probe_free(p);
        }
        tg_model_free(m);
    }
}

/* ---------------------------------------------------------------------------------------------
 * argmax / argmin
 * ------------------------------------------------------------------------------------------- */

/* Uses of argmax that carry no gradient to x: one_hot and a comparison. x = in[0] [4,5]. */
static tg_tensor arg_nograd_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor hot = tg_one_hot(tg_argmax(in[0], -1), 5);          /* [4,5] */
    tg_tensor cmp = tg_less(tg_argmin(in[0], 0), 2);              /* [5] f32 0/1 */
    tg_tensor flat = tg_one_hot(tg_argmax(in[0], TG_ALL), 3);     /* [3], usually a zero row */
    return tg_add(tg_add(tg_sum(tg_mul(hot, in[1]), TG_ALL, 0), tg_sum(tg_mul(cmp, in[2]), TG_ALL, 0)),
                  tg_sum(tg_mul(flat, in[3]), TG_ALL, 0));
}
/* x reaches the loss through a product with its own argmax one-hot and through take_along_axis
 * at the argmax: the gradient is W at each row's maximum, by the product/gather only. */
static tg_tensor arg_select_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor hot = tg_one_hot(tg_argmax(in[0], 1), 5);                              /* [4,5] */
    tg_tensor mins = tg_take_along_axis(in[0], tg_reshape(tg_argmin(in[0], -1), 4, 1), 1);   /* [4,1] */
    return tg_add(tg_sum(tg_mul(tg_mul(in[0], hot), in[1]), TG_ALL, 0), tg_sum(tg_mul(mins, in[2]), TG_ALL, 0));
}

static void test_argmax(void) {
    char what[200], b1[96];
    static const int axes[] = { 0, 1, 2, -1, -2, -3, TG_ALL };
    inspec xs[] = { FIN("x", -2, 2, 3, 5, 7), QIN("x", 3, 5, 7), QIN("x", 4, 1, 6), FIN("x", -2, 2, 9) };
    for (int op = O_ARGMAX; op <= O_ARGMIN; op++)
        for (size_t i = 0; i < sizeof xs / sizeof *xs; i++)
            for (size_t a = 0; a < sizeof axes / sizeof *axes; a++) {
                int nd = xs[i].d.shape.ndim;
                if (axes[a] != TG_ALL && (axes[a] >= nd || axes[a] < -nd)) continue;
                opctx c = { .op = (opk)op, .axis = axes[a] };
                char ax[16];
                if (axes[a] == TG_ALL) snprintf(ax, sizeof ax, "TG_ALL");
                else snprintf(ax, sizeof ax, "%d", axes[a]);
                snprintf(what, sizeof what, "%s %s%s axis %s", opname[op], shape_s(xs[i].d.shape, b1),
                         xs[i].fill == F_QUANT ? " (ties)" : "", ax);
                run_case(what, &c, NULL, 1, &xs[i]);
            }
    /* Ties -> the first index, spelled out: */
    {
        opctx c = { .op = O_ARGMAX, .axis = -1 };
        tg_input_decl d[1] = { TG_F32("x", 2, 4) };
        tg_model *m = tg_model_new(1);
        tg_error err;
        memset(&err, 0, sizeof err);
        static const double v[8] = { 1, 3, 3, 0, -2, -2, -2, -2 };
        for (int op = O_ARGMAX; op <= O_ARGMIN; op++) {
            c.op = (opk)op;
            tg_probe *p = tg_probe_new(m, op_forward, &c, d, 1, false, false, &err);
            CHECK(p != NULL, "%s ties: %s", opname[op], err.msg);
            if (!p) continue;
            memcpy(tg_probe_input(p, 0), v, sizeof v);
            tg_probe_run(p);
            const double *o = tg_probe_output(p);
            double w0 = op == O_ARGMAX ? 1 : 3;   /* [1,3,3,0]: max at 1 and 2, min at 3 */
            CHECK(o[0] == w0 && o[1] == 0, "%s of [[1,3,3,0],[-2,-2,-2,-2]]: got [%g, %g], want [%g, 0]",
                  opname[op], o[0], o[1], w0);
            tg_probe_free(p);
        }
        tg_model_free(m);
    }
    /* No gradient through argmax/argmin. */
    tg_model *m = tg_model_new(4);
    inspec ng[4] = { ZIN("x", -2, 2, 4, 5), AIN("W", 0.5, 1.5, 4, 5), AIN("W2", 0.5, 1.5, 5), AIN("W3", 0.5, 1.5, 3) };
    gradcheck("argmax/argmin only through one_hot and less: x gets exactly 0", m, arg_nograd_loss, NULL, 4, ng, 0, false);
    inspec sel[3] = { FIN("x", -2, 2, 4, 5), AIN("W", 0.5, 1.5, 4, 5), AIN("W2", 0.5, 1.5, 4, 1) };
    tg_probe *p = gradcheck("x * one_hot(argmax(x)) + take_along_axis(x, argmin(x))", m, arg_select_loss, NULL, 3, sel, 0, true);
    if (p) {
        /* The analytic gradient, exactly: W at each row's max, W2 at each row's min, 0 elsewhere. */
        const double *x = tg_probe_input(p, 0), *W = tg_probe_input(p, 1), *W2 = tg_probe_input(p, 2);
        const double *g = tg_probe_input_grad(p, 0);
        int bad = 0;
        for (int r = 0; r < 4; r++) {
            int mx = 0, mn = 0;
            for (int k = 1; k < 5; k++) {
                if (x[r * 5 + k] > x[r * 5 + mx]) mx = k;
                if (x[r * 5 + k] < x[r * 5 + mn]) mn = k;
            }
            for (int k = 0; k < 5; k++) {
                double want = (k == mx ? W[r * 5 + k] : 0) + (k == mn ? W2[r] : 0);
                if (g[r * 5 + k] != want) bad++;
            }
        }
        CHECK(bad == 0, "x * one_hot(argmax(x)) + take_along_axis(x, argmin(x)): %d of 20 gradients differ from W/W2 at the extremes", bad);
        tg_probe_free(p);
    }
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * flatten, split_heads / merge_heads, take_along_axis
 * ------------------------------------------------------------------------------------------- */

static void test_layout(void) {
    char what[200], b1[96];
    inspec x3 = FIN("x", -2, 2, 2, 3, 4), x4 = FIN("x", -2, 2, 2, 1, 3, 5);
    inspec scalar = { { "x", TG_FLOAT32, TG_SHAPE0 }, F_UNI, -2, 2, false }, xi = IIN("x", -5, 5, 2, 3, 4);
    struct { int start; const inspec *in; } fl[] = {
        { 0, &x3 }, { 1, &x3 }, { 2, &x3 }, { -1, &x3 }, { -2, &x3 }, { -3, &x3 }, { 1, &x4 }, { 2, &x4 }, { 0, &scalar },
        { 1, &xi },
    };
    for (size_t k = 0; k < sizeof fl / sizeof *fl; k++) {
        opctx c = { .op = O_FLATTEN, .axis = fl[k].start };
        snprintf(what, sizeof what, "flatten %s%s start %d", shape_s(fl[k].in->d.shape, b1),
                 fl[k].in->d.dtype == TG_INT32 ? " i32" : "", fl[k].start);
        if (fl[k].in->d.dtype == TG_INT32) run_case(what, &c, NULL, 1, fl[k].in);
        else both(what, &c, NULL, 1, fl[k].in);
    }

    struct { inspec x; int heads; } sh[] = {
        { FIN("x", -2, 2, 2, 5, 6), 3 }, { FIN("x", -2, 2, 5, 6), 2 }, { FIN("x", -2, 2, 2, 1, 3, 4), 4 },
        { FIN("x", -2, 2, 3, 7), 1 }, { FIN("x", -2, 2, 1, 4, 6), 6 },
    };
    for (size_t k = 0; k < sizeof sh / sizeof *sh; k++) {
        opctx c = { .op = O_SPLIT_HEADS, .n = sh[k].heads };
        snprintf(what, sizeof what, "split_heads %s into %d", shape_s(sh[k].x.d.shape, b1), sh[k].heads);
        both(what, &c, NULL, 1, &sh[k].x);
        c.op = O_HEADS_ROUND;
        snprintf(what, sizeof what, "merge_heads(split_heads(%s, %d)) is x", shape_s(sh[k].x.d.shape, b1), sh[k].heads);
        run_case(what, &c, NULL, 1, &sh[k].x);
    }
    inspec mh[] = { FIN("x", -2, 2, 2, 3, 5, 2), FIN("x", -2, 2, 3, 5, 2), FIN("x", -2, 2, 2, 1, 1, 4, 3), FIN("x", -2, 2, 1, 4, 1) };
    for (size_t k = 0; k < sizeof mh / sizeof *mh; k++) {
        opctx c = { .op = O_MERGE_HEADS };
        snprintf(what, sizeof what, "merge_heads %s", shape_s(mh[k].d.shape, b1));
        both(what, &c, NULL, 1, &mh[k]);
    }

    /* take_along_axis: idx ranges include out-of-range values (-1 and n) which give 0 and no
     * gradient; more indices than positions along the axis, so duplicates accumulate. */
    struct { inspec x, idx; int axis; } ta[] = {
        { FIN("x", -2, 2, 3, 4, 5), IIN("i", -1, 4, 3, 6, 5), 1 },    /* middle axis, duplicates */
        { FIN("x", -2, 2, 3, 4, 5), IIN("i", 0, 3, 3, 2, 5), -2 },
        { FIN("x", -2, 2, 3, 4, 5), IIN("i", 0, 5, 3, 4, 7), -1 },    /* last axis, 5 is out of range */
        { FIN("x", -2, 2, 3, 4, 5), IIN("i", 0, 2, 1, 4, 5), 0 },
        { FIN("x", -2, 2, 6), IIN("i", -1, 6, 9), 0 },
        { FIN("x", -2, 2, 2, 1, 3), IIN("i", 0, 0, 2, 4, 3), 1 },     /* size-1 axis: every index 0 */
    };
    for (size_t k = 0; k < sizeof ta / sizeof *ta; k++) {
        opctx c = { .op = O_TAKE, .axis = ta[k].axis };
        char b2[96];
        snprintf(what, sizeof what, "take_along_axis x %s idx %s axis %d", shape_s(ta[k].x.d.shape, b1),
                 shape_s(ta[k].idx.d.shape, b2), ta[k].axis);
        inspec in2[2] = { ta[k].x, ta[k].idx };
        both(what, &c, NULL, 2, in2);
    }
    {   /* i32 values */
        inspec in2[2] = { IIN("x", -9, 9, 3, 4), IIN("i", -1, 4, 3, 5) };
        opctx c = { .op = O_TAKE, .axis = 1 };
        run_case("take_along_axis i32 x [3,4] idx [3,5] axis 1", &c, NULL, 2, in2);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Builders: arange, zeros, ones; structure: narrow, concat, stack, split
 * ------------------------------------------------------------------------------------------- */

static void test_builders(void) {
    char what[200], b1[96];
    static const int64_t ns[] = { 1, 7 };
    for (int dt = TG_FLOAT32; dt <= TG_INT32; dt++) {
        const char *dn = dt == TG_INT32 ? "i32" : "f32";
        for (size_t k = 0; k < 2; k++) {
            opctx c = { .op = O_ARANGE, .len = ns[k], .dt = (tg_dtype)dt };
            snprintf(what, sizeof what, "arange(%lld, %s)", (long long)ns[k], dn);
            run_case(what, &c, NULL, 0, NULL);
        }
        tg_shape shapes[] = { TG_SHAPE(2, 3), TG_SHAPE(1), TG_SHAPE0, TG_SHAPE(2, 1, 3, 1) };
        for (int op = O_ZEROS; op <= O_ONES; op++)
            for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
                opctx c = { .op = (opk)op, .shp = shapes[k], .dt = (tg_dtype)dt };
                snprintf(what, sizeof what, "%s(%s, %s)", opname[op], shape_s(shapes[k], b1), dn);
                run_case(what, &c, NULL, 0, NULL);
            }
    }
    inspec x = FIN("x", -2, 2, 3, 4);
    opctx c = { .op = O_BUILD_MIX };
    both("x * ones(3,4) + (arange(4) + zeros(3,1))", &c, NULL, 1, &x);
}

static void test_structure(void) {
    char what[200], b1[96];
    inspec x = FIN("x", -2, 2, 3, 5, 4), xi = IIN("x", -9, 9, 3, 5, 4);
    struct { int axis; int64_t start, len; } nw[] = {
        { 0, 1, 2 }, { 1, 0, 1 }, { 1, 2, 3 }, { -1, 3, 1 }, { 2, 0, 4 } /* the whole axis */, { -2, 4, 1 }, { 0, 0, 3 },
    };
    for (size_t k = 0; k < sizeof nw / sizeof *nw; k++) {
        opctx c = { .op = O_NARROW, .axis = nw[k].axis, .start = nw[k].start, .len = nw[k].len };
        snprintf(what, sizeof what, "narrow [3,5,4] axis %d start %lld length %lld", nw[k].axis, (long long)nw[k].start,
                 (long long)nw[k].len);
        both(what, &c, NULL, 1, &x);
    }
    {
        opctx c = { .op = O_NARROW, .axis = 1, .start = 1, .len = 3 };
        run_case("narrow i32 [3,5,4] axis 1 start 1 length 3", &c, NULL, 1, &xi);
    }

    /* concat of 1, 2 and 3+ inputs along the first, a middle and the last axis */
    struct { int n, axis; inspec in[4]; } cc[] = {
        { 1, 0, { FIN("a", -2, 2, 2, 3) } },
        { 1, -1, { FIN("a", -2, 2, 2, 3, 4) } },
        { 2, 0, { FIN("a", -2, 2, 2, 3, 4), FIN("b", -2, 2, 1, 3, 4) } },
        { 2, 1, { FIN("a", -2, 2, 2, 3, 4), FIN("b", -2, 2, 2, 5, 4) } },
        { 2, -1, { FIN("a", -2, 2, 2, 3, 1), FIN("b", -2, 2, 2, 3, 4) } },
        { 3, 1, { FIN("a", -2, 2, 2, 1, 3), FIN("b", -2, 2, 2, 4, 3), FIN("c", -2, 2, 2, 2, 3) } },
        { 4, 2, { FIN("a", -2, 2, 2, 3, 1), FIN("b", -2, 2, 2, 3, 2), FIN("c", -2, 2, 2, 3, 1), FIN("d", -2, 2, 2, 3, 3) } },
        { 3, 0, { FIN("a", -2, 2, 5), FIN("b", -2, 2, 1), FIN("c", -2, 2, 3) } },
        { 3, -3, { FIN("a", -2, 2, 1, 2, 3), FIN("b", -2, 2, 3, 2, 3), FIN("c", -2, 2, 1, 2, 3) } },
    };
    for (size_t k = 0; k < sizeof cc / sizeof *cc; k++) {
        opctx c = { .op = O_CONCAT, .n = cc[k].n, .axis = cc[k].axis };
        int w = snprintf(what, sizeof what, "concat of %d along %d:", cc[k].n, cc[k].axis);
        for (int i = 0; i < cc[k].n; i++) w += snprintf(what + w, sizeof what - (size_t)w, " %s", shape_s(cc[k].in[i].d.shape, b1));
        both(what, &c, NULL, cc[k].n, cc[k].in);
    }
    {
        inspec ii[2] = { IIN("a", -9, 9, 2, 3), IIN("b", -9, 9, 2, 2) };
        opctx c = { .op = O_CONCAT, .n = 2, .axis = 1 };
        run_case("concat i32 [2,3] [2,2] along 1", &c, NULL, 2, ii);
    }

    /* stack along a new first, middle and last axis */
    struct { int n, axis; inspec in[3]; } st[] = {
        { 1, 0, { FIN("a", -2, 2, 2, 3) } },
        { 2, 0, { FIN("a", -2, 2, 2, 3), FIN("b", -2, 2, 2, 3) } },
        { 2, -1, { FIN("a", -2, 2, 2, 3), FIN("b", -2, 2, 2, 3) } },
        { 2, 2, { FIN("a", -2, 2, 2, 3), FIN("b", -2, 2, 2, 3) } },
        { 3, 1, { FIN("a", -2, 2, 2, 1, 3), FIN("b", -2, 2, 2, 1, 3), FIN("c", -2, 2, 2, 1, 3) } },
        { 3, -1, { FIN("a", -2, 2, 4), FIN("b", -2, 2, 4), FIN("c", -2, 2, 4) } },
        { 3, -2, { FIN("a", -2, 2, 3, 2), FIN("b", -2, 2, 3, 2), FIN("c", -2, 2, 3, 2) } },
    };
    for (size_t k = 0; k < sizeof st / sizeof *st; k++) {
        opctx c = { .op = O_STACK, .n = st[k].n, .axis = st[k].axis };
        snprintf(what, sizeof what, "stack of %d %s along new axis %d", st[k].n, shape_s(st[k].in[0].d.shape, b1), st[k].axis);
        both(what, &c, NULL, st[k].n, st[k].in);
    }

    struct { opk op; int axis; inspec in[2]; } dup[] = {
        { O_CONCAT_DUP, 1, { FIN("a", -2, 2, 2, 3, 2), FIN("b", -2, 2, 2, 1, 2) } },
        { O_CONCAT_DUP, -1, { FIN("a", -2, 2, 3, 2), FIN("b", -2, 2, 3, 4) } },
        { O_STACK_DUP, 0, { FIN("a", -2, 2, 2, 3), FIN("b", -2, 2, 2, 3) } },
        { O_STACK_DUP, -1, { FIN("a", -2, 2, 2, 3), FIN("b", -2, 2, 2, 3) } },
    };
    for (size_t k = 0; k < sizeof dup / sizeof *dup; k++) {
        opctx c = { .op = dup[k].op, .axis = dup[k].axis };
        char b2[96];
        snprintf(what, sizeof what, "%s a %s b %s axis %d", opname[dup[k].op], shape_s(dup[k].in[0].d.shape, b1),
                 shape_s(dup[k].in[1].d.shape, b2), dup[k].axis);
        both(what, &c, NULL, 2, dup[k].in);
    }

    /* split into sizes: each piece forward; all pieces (concatenated in reverse) for gradients */
    struct { int axis, n; int64_t sizes[4]; inspec x; } sp[] = {
        { 1, 3, { 1, 2, 2 }, FIN("x", -2, 2, 2, 5, 3) },
        { -1, 2, { 3, 1 }, FIN("x", -2, 2, 3, 2, 4) },
        { 0, 4, { 1, 1, 1, 1 }, FIN("x", -2, 2, 4, 3) },
        { 0, 1, { 6 }, FIN("x", -2, 2, 6) },
        { -2, 2, { 2, 5 }, FIN("x", -2, 2, 7, 1) },
    };
    for (size_t k = 0; k < sizeof sp / sizeof *sp; k++) {
        opctx c = { .op = O_SPLIT_PIECE, .axis = sp[k].axis, .n = sp[k].n };
        memcpy(c.sizes, sp[k].sizes, sizeof sp[k].sizes);
        for (int i = 0; i < sp[k].n; i++) {
            c.piece = i;
            snprintf(what, sizeof what, "split %s axis %d piece %d of %d", shape_s(sp[k].x.d.shape, b1), sp[k].axis, i, sp[k].n);
            run_case(what, &c, NULL, 1, &sp[k].x);
        }
        c.op = O_SPLIT_REV;
        snprintf(what, sizeof what, "split %s axis %d into %d, concatenated in reverse", shape_s(sp[k].x.d.shape, b1),
                 sp[k].axis, sp[k].n);
        both(what, &c, NULL, 1, &sp[k].x);
    }
}

/* ---------------------------------------------------------------------------------------------
 * softmax_causal, where_causal, stop_gradient
 * ------------------------------------------------------------------------------------------- */

static void test_causal(void) {
    char what[200], b1[96];
    /* The contract is over [.., R, C] with c <= r kept, so non-square tails are allowed. */
    inspec sc[] = {
        FIN("x", -3, 3, 2, 3, 5, 5), FIN("x", -3, 3, 4, 6), FIN("x", -3, 3, 6, 4), FIN("x", -3, 3, 1, 1),
        FIN("x", -3, 3, 3, 1, 1), FIN("x", -30, 30, 2, 7, 7), QIN("x", 2, 4, 4),
    };
    for (size_t k = 0; k < sizeof sc / sizeof *sc; k++) {
        opctx c = { .op = O_SOFTMAX_CAUSAL };
        snprintf(what, sizeof what, "softmax_causal %s%s", shape_s(sc[k].d.shape, b1), sc[k].fill == F_QUANT ? " (ties)" : "");
        run_case(what, &c, NULL, 1, &sc[k]);
        if (sc[k].hi < 10) grad_case(what, &c, NULL, 1, &sc[k]);   /* (saturated +-30: forward stability only) */
    }
    struct { double fill; inspec x; } wc[] = {
        { -1e9, FIN("x", -3, 3, 2, 4, 4) }, { -4, FIN("x", -3, 3, 2, 4, 4) }, { 0, FIN("x", -3, 3, 3, 5) },
        { 2.5, FIN("x", -3, 3, 5, 3) },
        { -INFINITY, FIN("x", -3, 3, 1, 3, 3) }, { 7, IIN("x", -5, 5, 2, 3, 3) },
    };
    for (size_t k = 0; k < sizeof wc / sizeof *wc; k++) {
        opctx c = { .op = O_WHERE_CAUSAL, .lo = wc[k].fill };
        snprintf(what, sizeof what, "where_causal %s%s fill %g", shape_s(wc[k].x.d.shape, b1),
                 wc[k].x.d.dtype == TG_INT32 ? " i32" : "", wc[k].fill);
        run_case(what, &c, NULL, 1, &wc[k].x);
        /* (a fill of -1e9 makes the loss ~1e10: central differences would be noise) */
        if (wc[k].x.d.dtype == TG_FLOAT32 && fabs(wc[k].fill) < 100) grad_case(what, &c, NULL, 1, &wc[k].x);
    }
    inspec sg = FIN("x", -2, 2, 3, 1, 4);
    opctx c = { .op = O_STOP_GRAD };
    run_case("stop_gradient [3,1,4] forward is x", &c, NULL, 1, &sg);
}

/* ---------------------------------------------------------------------------------------------
 * randn, stop_gradient and dropout: no gradient / the same mask, seeding
 * ------------------------------------------------------------------------------------------- */

typedef struct { tg_param P; double p; } rctx;

static tg_tensor randn_big(const void *ctx, const tg_tensor *in) { return tg_randn(100, 100); }
static tg_tensor randn_two(const void *ctx, const tg_tensor *in) {
    tg_tensor two[2] = { tg_randn(500), tg_randn(500) };
    return tg_stack(two, 2, 0);
}
/* loss = sum(x + randn) + sum(stop_gradient(P) * x): d/dx = 1 + P, d/dP = 0. */
static tg_tensor randn_loss(const void *vc, const tg_tensor *in) {
    const rctx *c = vc;
    tg_tensor a = tg_sum(tg_add(in[0], tg_randn(3, 4)), TG_ALL, 0);
    return tg_add(a, tg_sum(tg_mul(tg_stop_gradient(tg_p(c->P)), in[0]), TG_ALL, 0));
}
/* loss = sum(x * randn * W): a fixed draw at a fixed seed, checked by finite differences */
static tg_tensor randn_mul_loss(const void *vc, const tg_tensor *in) {
    return tg_sum(tg_mul(tg_mul(in[0], tg_randn(3, 1, 4)), in[1]), TG_ALL, 0);
}
static tg_tensor dropout_fwd(const void *vc, const tg_tensor *in) { return tg_dropout(in[0], ((const rctx *)vc)->p); }
static tg_tensor dropout_times2(const void *vc, const tg_tensor *in) {
    return tg_mul(tg_dropout(in[0], ((const rctx *)vc)->p), 2);
}
static tg_tensor plain_times2(const void *vc, const tg_tensor *in) { return tg_mul(in[0], 2); }
static tg_tensor dropout_two(const void *vc, const tg_tensor *in) {
    tg_tensor two[2] = { tg_dropout(in[0], 0.5), tg_dropout(in[0], 0.5) };
    return tg_stack(two, 2, 0);
}

/* The node id of the first node of op `op` in the probe's graph (for the salt), or -1. */
static int find_op(tg_probe *p, const char *op) {
    const tg_graph *g = tg_probe_graph(p);
    for (int i = 0; i < tg_graph_n_nodes(g); i++)
        if (strcmp(tg_graph_node(g, i).op, op) == 0) return i;
    return -1;
}

static int64_t count_diff(const double *a, const double *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}

static void test_randn(void) {
    tg_model *m = tg_model_new(5);
    tg_input_decl none[1] = { TG_F32("unused", 1) };
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, randn_big, NULL, none, 0, false, false, &err);
    CHECK(p != NULL, "randn(100, 100): %s", err.msg);
    if (p) {
        const int64_t n = 10000;
        double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
        tg_probe_set_seed(p, SEED_A);
        tg_probe_run(p);
        memcpy(a, tg_probe_output(p), n * sizeof(double));
        tg_probe_run(p);
        CHECK(count_diff(a, tg_probe_output(p), n) == 0, "randn: two runs at the same seed differ");
        tg_probe_set_seed(p, SEED_B);
        tg_probe_run(p);
        memcpy(b, tg_probe_output(p), n * sizeof(double));
        CHECK(count_diff(a, b, n) > n * 99 / 100, "randn: seeds A and B share %lld of %lld values",
              (long long)(n - count_diff(a, b, n)), (long long)n);
        tg_probe_set_seed(p, SEED_A);
        tg_probe_run(p);
        CHECK(count_diff(a, tg_probe_output(p), n) == 0, "randn: back at seed A, the values differ");
        for (int s = 0; s < 2; s++) {
            const double *v = s ? b : a;
            double mean = 0, var = 0;
            for (int64_t i = 0; i < n; i++) mean += v[i];
            mean /= (double)n;
            for (int64_t i = 0; i < n; i++) var += (v[i] - mean) * (v[i] - mean);
            double sd = sqrt(var / (double)(n - 1));
            /* the sample mean has sd 0.01, the sample sd about 0.007 */
            CHECK(fabs(mean) < 0.05 && fabs(sd - 1) < 0.05, "randn seed %c: mean %g sd %g, want ~0 and ~1", s ? 'B' : 'A', mean, sd);
        }
        /* The kernel contract: element i = rng_normal(seed, salt, i), salt = the node's iarg[0]. */
        int id = find_op(p, "randn");
        CHECK(id >= 0, "randn: no randn node in the graph");
        if (id >= 0) {
            uint64_t salt = (uint64_t)tg_probe_graph(p)->nodes[id].iarg[0];
            tg_probe_set_seed(p, SEED_C);
            tg_probe_run(p);
            const double *o = tg_probe_output(p);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) bad += o[i] != rng_normal(SEED_C, salt, (uint64_t)i);
            CHECK(bad == 0, "randn: %lld of %lld values are not rng_normal(seed, salt, i)", (long long)bad, (long long)n);
        }
        free(a);
        free(b);
        tg_probe_free(p);
    }
    /* Two randn calls in one graph draw different values. */
    p = tg_probe_new(m, randn_two, NULL, none, 0, false, false, &err);
    CHECK(p != NULL, "stack(randn, randn): %s", err.msg);
    if (p) {
        tg_probe_set_seed(p, SEED_A);
        tg_probe_run(p);
        const double *o = tg_probe_output(p);
        CHECK(count_diff(o, o + 500, 500) == 500, "two randn calls in one graph share %lld of 500 values",
              (long long)(500 - count_diff(o, o + 500, 500)));
        tg_probe_free(p);
    }

    /* No gradient through randn; none through stop_gradient. */
    rctx c = { tg_param_new(m, "P", TG_SHAPE(3, 4), tg_init_randn(1)), 0 };
    inspec ins[1] = { FIN("x", -2, 2, 3, 4) };
    p = make_probe("x + randn, stop_gradient(P) * x", m, randn_loss, &c, 1, ins, true, false, SEED_A);
    if (p) {
        const double *gx = tg_probe_input_grad(p, 0), *gp = tg_probe_param_grad(p, c.P.id), *P = tg_probe_param(p, c.P.id);
        int bx = 0, bp = 0;
        for (int i = 0; i < 12; i++) {
            bx += !gx || gx[i] != 1 + P[i];
            bp += !gp || gp[i] != 0.0;
        }
        CHECK(bx == 0, "sum(x + randn) + sum(stop_gradient(P) * x): d/dx must be 1 + P exactly; %d of 12 differ", bx);
        CHECK(bp == 0, "stop_gradient(P): d/dP must be exactly 0; %d of 12 differ (or no gradient)", bp);
        tg_probe_free(p);
    }
    inspec mi[2] = { FIN("x", -2, 2, 3, 1, 4), AIN("W", 0.5, 1.5, 3, 1, 4) };
    gradcheck("x * randn(3,1,4) * W at a fixed seed", m, randn_mul_loss, NULL, 2, mi, SEED_B, false);
    tg_model_free(m);
}

static void test_dropout(void) {
    char what[200];
    tg_model *m = tg_model_new(6);
    tg_input_decl d[1] = { TG_F32("x", 100, 100) };
    tg_error err;
    memset(&err, 0, sizeof err);

    /* p = 0 adds no node; p > 0 adds exactly one. */
    {
        rctx c0 = { { NULL, -1 }, 0 }, c5 = { { NULL, -1 }, 0.5 };
        tg_probe *a = tg_probe_new(m, dropout_times2, &c0, d, 1, false, false, &err);
        tg_probe *b = tg_probe_new(m, plain_times2, NULL, d, 1, false, false, &err);
        tg_probe *c = tg_probe_new(m, dropout_times2, &c5, d, 1, false, false, &err);
        CHECK(a && b && c, "dropout node count probes: %s", err.msg);
        if (a && b && c) {
            int na = tg_graph_n_nodes(tg_probe_graph(a)), nb = tg_graph_n_nodes(tg_probe_graph(b));
            int nc = tg_graph_n_nodes(tg_probe_graph(c));
            CHECK(na == nb, "dropout(x, 0) * 2 has %d nodes, x * 2 has %d: p = 0 must add none", na, nb);
            CHECK(nc == nb + 1, "dropout(x, 0.5) * 2 has %d nodes, x * 2 has %d: want one more", nc, nb);
        }
        tg_probe_free(a);
        tg_probe_free(b);
        tg_probe_free(c);
    }

    static const double ps[] = { 0.1, 0.5, 0.9 };
    inspec xin = AIN("x", 0.5, 2, 100, 100);
    const int64_t n = 10000;
    for (size_t k = 0; k < sizeof ps / sizeof *ps; k++) {
        rctx c = { { NULL, -1 }, ps[k] };
        for (int mode = 0; mode < 2; mode++) {
            bool f32 = mode == 1;
            snprintf(what, sizeof what, "dropout p %g [%s]", ps[k], f32 ? "f32" : "f64");
            tg_probe *p = make_probe(what, m, dropout_fwd, &c, 1, &xin, false, f32, SEED_A);
            if (!p) continue;
            const double *x = tg_probe_input(p, 0);
            double *a = malloc(n * sizeof(double));
            memcpy(a, tg_probe_output(p), n * sizeof(double));
            int64_t kept = 0, bad = 0;
            for (int64_t i = 0; i < n; i++) {
                if (a[i] != 0) kept++;
                if (a[i] != 0 && !check_close(a[i], x[i] / (1 - ps[k]), f32 ? TOL32 : TOL64)) bad++;
            }
            double frac = (double)kept / (double)n, sd = sqrt(ps[k] * (1 - ps[k]) / (double)n);
            CHECK(fabs(frac - (1 - ps[k])) < 5 * sd, "%s: kept fraction %g, want %g +- %g", what, frac, 1 - ps[k], 5 * sd);
            CHECK(bad == 0, "%s: %lld kept values are not x / (1 - p)", what, (long long)bad);
            if (!f32) {
                tg_probe_run(p);
                CHECK(count_diff(a, tg_probe_output(p), n) == 0, "%s: the same seed gives a different mask", what);
                tg_probe_set_seed(p, SEED_B);
                tg_probe_run(p);
                int64_t diff = count_diff(a, tg_probe_output(p), n);
                /* two independent masks disagree on a fraction 2 p (1 - p) of the elements */
                double want = 2 * ps[k] * (1 - ps[k]);
                CHECK(fabs((double)diff / (double)n - want) < 0.05, "%s: seeds A and B: masks differ on %lld of %lld, want ~%g",
                      what, (long long)diff, (long long)n, want);
                /* the kernel contract: kept iff rng_uniform(seed, salt, i) >= p */
                int id = find_op(p, "dropout");
                CHECK(id >= 0, "%s: no dropout node", what);
                if (id >= 0) {
                    uint64_t salt = (uint64_t)tg_probe_graph(p)->nodes[id].iarg[0];
                    tg_probe_set_seed(p, SEED_C);
                    tg_probe_run(p);
                    const double *o = tg_probe_output(p);
                    int64_t off = 0;
                    for (int64_t i = 0; i < n; i++) off += (o[i] != 0) != (rng_uniform(SEED_C, salt, (uint64_t)i) >= ps[k]);
                    CHECK(off == 0, "%s: %lld mask entries disagree with rng_uniform(seed, salt, i) >= p", what, (long long)off);
                }
            }
            free(a);
            tg_probe_free(p);
        }
    }
    /* Two dropout calls in one graph draw different masks. */
    {
        inspec x2 = AIN("x", 0.5, 2, 1000);
        tg_probe *p = make_probe("stack(dropout(x), dropout(x))", m, dropout_two, NULL, 1, &x2, false, false, SEED_A);
        if (p) {
            int64_t diff = count_diff(tg_probe_output(p), tg_probe_output(p) + 1000, 1000);
            CHECK(diff > 350 && diff < 650, "two dropout(x, 0.5) calls in one graph: masks differ on %lld of 1000, want ~500",
                  (long long)diff);
            tg_probe_free(p);
        }
    }
    /* Gradient at a fixed seed (backward recomputes the mask). */
    static const double gp[] = { 0.3, 0.7 };
    for (size_t k = 0; k < 2; k++) {
        opctx c = { .op = O_DROPOUT, .lo = gp[k] };
        inspec x = FIN("x", -2, 2, 4, 1, 9);
        snprintf(what, sizeof what, "dropout p %g [4,1,9] at a fixed seed", gp[k]);
        tg_probe *p = grad_case_seeded(what, &c, NULL, 1, &x, SEED_B, true);
        if (p) {
            const double *g = tg_probe_input_grad(p, 0), *W = tg_probe_input(p, 1);
            int zeros = 0, bad = 0;
            for (int i = 0; i < 36; i++) {
                zeros += g[i] == 0;
                if (g[i] != 0 && !check_close(g[i], W[i] / (1 - gp[k]), TOL64)) bad++;
            }
            CHECK(zeros > 0 && zeros < 36, "%s: the mask should drop some but not all of 36 (%d dropped)", what, zeros);
            CHECK(bad == 0, "%s: %d kept gradients are not W / (1 - p)", what, bad);
            tg_probe_free(p);
        }
    }
    tg_model_free(m);
}

/* Seeds are 64-bit: small seeds (low bits only) must still give different draws. */
static void test_seed_bits(void) {
    tg_model *m = tg_model_new(5);
    tg_input_decl none[1] = { TG_F32("unused", 1) };
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, randn_big, NULL, none, 0, false, false, &err);
    CHECK(p != NULL, "randn(100, 100): %s", err.msg);
    if (p) {
        static const uint64_t pairs[][2] = { { 1, 2 }, { 0, 1 }, { 0, 1u << 20 } };
        double *a = malloc(10000 * sizeof(double));
        for (size_t k = 0; k < 3; k++) {
            tg_probe_set_seed(p, pairs[k][0]);
            tg_probe_run(p);
            memcpy(a, tg_probe_output(p), 10000 * sizeof(double));
            tg_probe_set_seed(p, pairs[k][1]);
            tg_probe_run(p);
            int64_t diff = count_diff(a, tg_probe_output(p), 10000);
            CHECK(diff > 9900, "tg_probe_set_seed %llu vs %llu: randn differs on only %lld of 10000 values",
                  (unsigned long long)pairs[k][0], (unsigned long long)pairs[k][1], (long long)diff);
        }
        free(a);
        tg_probe_free(p);
    }
    tg_model_free(m);
}

/* randn and dropout through the public API: a new draw every call. */
static tg_tensor api_loss(const void *vc, const tg_tensor *in) {
    const rctx *c = vc;
    return tg_sum(tg_mul(tg_p(c->P), in[0]), TG_ALL, 0);
}
static tg_tensor api_noise(const void *vc, const tg_tensor *in) {
    tg_tensor two[2] = { tg_randn(64), tg_dropout(in[0], 0.5) };
    return tg_concat(two, 2, 0);
}

static void test_random_api(void) {
    tg_model *m = tg_model_new(9);
    rctx c = { tg_param_new(m, "P", TG_SHAPE(64), tg_init_randn(1)), 0 };
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = api_loss, .ctx = &c,
                                              .inputs = (tg_input_decl[]){ TG_F32("x", 64) }, .n_inputs = 1,
                                              .optimizer = tg_sgd(0.1, 0, 0, 0) }, &err);
    CHECK(t != NULL, "random api: compile: %s", err.msg);
    if (!t) { tg_model_free(m); return; }
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = api_noise, .inputs = (tg_input_decl[]){ TG_F32("x", 64) },
                                                     .n_inputs = 1 }, &err);
    CHECK(f != NULL, "random api: attach: %s", err.msg);
    if (f) {
        float x[64], first[128];
        for (int i = 0; i < 64; i++) x[i] = 1;
        tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", x, 64) }, 1);
        CHECK(r.status == TG_OK && r.output_len == 128, "random api: run 1: %s", r.error);
        if (r.status == TG_OK) {
            memcpy(first, r.output, sizeof first);
            r = tg_run(f, (tg_data[]){ tg_f32("x", x, 64) }, 1);
            int dr = 0, dd = 0, kept = 0;
            for (int i = 0; i < 64; i++) {
                dr += first[i] != r.output[i];
                dd += first[64 + i] != r.output[64 + i];
                kept += first[64 + i] == 2.0f;
            }
            CHECK(dr == 64, "tg_run twice: randn repeats %d of 64 values", 64 - dr);
            CHECK(dd > 10, "tg_run twice: the dropout masks agree on %d of 64", 64 - dd);
            CHECK(kept > 10 && kept < 54, "tg_run: dropout(ones, 0.5) kept %d of 64 (as 2.0)", kept);
        }
    }
    tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Images: conv2d, max_pool2d, nearest_upsample2d
 * ------------------------------------------------------------------------------------------- */

static void test_images(void) {
    char what[200], b1[96], b2[96];
    struct { int stride, pad; inspec x, w; } cv[] = {
        { 1, 0, FIN("x", -2, 2, 2, 3, 7, 5), FIN("w", -1, 1, 4, 3, 3, 3) },
        { 1, 1, FIN("x", -2, 2, 2, 3, 7, 5), FIN("w", -1, 1, 4, 3, 3, 3) },
        { 2, 0, FIN("x", -2, 2, 2, 3, 7, 5), FIN("w", -1, 1, 4, 3, 3, 3) },
        { 2, 1, FIN("x", -2, 2, 2, 3, 7, 5), FIN("w", -1, 1, 4, 3, 3, 3) },
        { 1, 0, FIN("x", -2, 2, 1, 2, 5, 6), FIN("w", -1, 1, 3, 2, 2, 2) },
        { 2, 1, FIN("x", -2, 2, 1, 2, 5, 6), FIN("w", -1, 1, 3, 2, 2, 2) },
        { 2, 0, FIN("x", -2, 2, 2, 2, 6, 6), FIN("w", -1, 1, 2, 2, 2, 2) },
        { 1, 1, FIN("x", -2, 2, 1, 2, 4, 5), FIN("w", -1, 1, 2, 2, 2, 3) },   /* non-square kernel */
        { 1, 0, FIN("x", -2, 2, 3, 1, 3, 3), FIN("w", -1, 1, 1, 1, 3, 3) },   /* one output pixel */
        { 1, 0, FIN("x", -2, 2, 2, 3, 4, 1), FIN("w", -1, 1, 2, 3, 1, 1) },   /* 1x1 kernel, W = 1 */
        { 3, 2, FIN("x", -2, 2, 1, 1, 5, 5), FIN("w", -1, 1, 1, 1, 3, 3) },
        { 1, 2, FIN("x", -2, 2, 1, 2, 3, 3), FIN("w", -1, 1, 2, 2, 2, 2) },   /* padding >= kernel: zero borders */
        { 2, 0, FIN("x", -2, 2, 1, 1, 6, 5), FIN("w", -1, 1, 1, 1, 1, 1) },   /* 1x1 kernel, stride 2 */
    };
    for (size_t k = 0; k < sizeof cv / sizeof *cv; k++) {
        opctx c = { .op = O_CONV2D, .stride = cv[k].stride, .pad = cv[k].pad };
        inspec in2[2] = { cv[k].x, cv[k].w };
        snprintf(what, sizeof what, "conv2d x %s w %s stride %d padding %d", shape_s(cv[k].x.d.shape, b1),
                 shape_s(cv[k].w.d.shape, b2), cv[k].stride, cv[k].pad);
        both(what, &c, NULL, 2, in2);
    }

    /* max_pool2d: inputs distinct by a margin (a unique max per window); all-negative inputs
     * where padding must not win. */
    struct { int k, stride, pad; inspec x; } mp[] = {
        { 2, 2, 0, DIN("x", -2, 2, 2, 3, 7, 5) },
        { 3, 2, 1, DIN("x", -2, 2, 2, 3, 7, 5) },
        { 3, 2, 1, DIN("x", -3, -0.5, 1, 2, 5, 6) },
        { 2, 1, 0, DIN("x", -2, 2, 1, 2, 4, 5) },
        { 2, 2, 1, DIN("x", -3, -0.5, 1, 2, 5, 4) },
        { 3, 1, 1, DIN("x", -2, 2, 1, 1, 3, 3) },
        { 3, 3, 0, DIN("x", -2, 2, 2, 1, 7, 8) },
        { 1, 1, 0, DIN("x", -2, 2, 1, 2, 2, 3) },
        { 2, 3, 0, DIN("x", -2, 2, 1, 2, 7, 8) },    /* stride > k: rows and columns skipped */
        { 5, 1, 2, DIN("x", -3, -0.5, 1, 1, 3, 2) }, /* windows larger than the image */
    };
    for (size_t k = 0; k < sizeof mp / sizeof *mp; k++) {
        opctx c = { .op = O_MAXPOOL, .k = mp[k].k, .stride = mp[k].stride, .pad = mp[k].pad };
        snprintf(what, sizeof what, "max_pool2d %s k %d stride %d padding %d%s", shape_s(mp[k].x.d.shape, b1), mp[k].k,
                 mp[k].stride, mp[k].pad, mp[k].x.hi < 0 ? " (all negative)" : "");
        both(what, &c, NULL, 1, &mp[k].x);
    }
    /* Ties (a constant image): each window's gradient goes to its first maximum (row-major). */
    {
        opctx c = { .op = O_MAXPOOL, .k = 3, .stride = 2, .pad = 1 };
        wctx w = { op_forward, &c, 1 };
        inspec ins[2] = { { TG_F32("x", 1, 1, 5, 5), F_UNI, 0.5, 0.5, false }, AIN("W", 0.5, 1.5, 1, 1, 3, 3) };
        tg_model *m = tg_model_new(1);
        tg_probe *p = make_probe("max_pool2d ties", m, weighted_loss, &w, 2, ins, true, false, 0);
        if (p) {
            const double *W = tg_probe_input(p, 1), *g = tg_probe_input_grad(p, 0);
            double want[25] = { 0 };
            for (int oy = 0; oy < 3; oy++)
                for (int ox = 0; ox < 3; ox++) {
                    int y = oy * 2 - 1 < 0 ? 0 : oy * 2 - 1, x = ox * 2 - 1 < 0 ? 0 : ox * 2 - 1;   /* first real pixel */
                    want[y * 5 + x] += W[oy * 3 + ox];
                }
            int bad = 0;
            for (int i = 0; i < 25; i++) bad += !check_close(g[i], want[i], TOL64);
            CHECK(bad == 0, "max_pool2d k3 s2 p1 on a constant 5x5: %d of 25 gradients are not at each window's first max", bad);
            tg_probe_free(p);
        }
        tg_model_free(m);
    }

    struct { int f; inspec x; } up[] = {
        { 2, FIN("x", -2, 2, 2, 3, 3, 4) }, { 3, FIN("x", -2, 2, 1, 2, 1, 5) }, { 1, FIN("x", -2, 2, 1, 2, 3, 3) },
        { 3, FIN("x", -2, 2, 2, 1, 3, 2) },
    };
    for (size_t k = 0; k < sizeof up / sizeof *up; k++) {
        opctx c = { .op = O_UPSAMPLE, .k = up[k].f };
        snprintf(what, sizeof what, "nearest_upsample2d %s factor %d", shape_s(up[k].x.d.shape, b1), up[k].f);
        both(what, &c, NULL, 1, &up[k].x);
    }
    {
        inspec xi = IIN("x", -9, 9, 1, 2, 2, 3);
        opctx c = { .op = O_UPSAMPLE, .k = 2 };
        run_case("nearest_upsample2d i32 [1,2,2,3] factor 2", &c, NULL, 1, &xi);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Layers: tg_rmsnorm and tg_conv (tg_conv2d_layer), parameters through the probe
 * ------------------------------------------------------------------------------------------- */

static void test_layers(void) {
    tg_model *m = tg_model_new(12);
    tg_rmsnorm rms = tg_rmsnorm_new(m, "rms", 5, 0), rms2 = tg_rmsnorm_new(m, "rms2", 5, 0.5);
    tg_conv2d_layer cb = tg_conv2d_new(m, "conv", 3, 4, 3, 1, 1, 1);
    tg_conv2d_layer cn = tg_conv2d_new(m, "conv2", 2, 3, 2, 2, 0, 0);
    CHECK(tg_model_error(m) == NULL, "layers: model error: %s", tg_model_error(m));
    CHECK(rms.eps == 1e-6 && rms2.eps == 0.5, "tg_rmsnorm eps %g / %g, want the default 1e-6 / 0.5", rms.eps, rms2.eps);
    CHECK(cb.has_bias && !cn.has_bias, "tg_conv2d_new bias flags %d %d", cb.has_bias, cn.has_bias);
    /* names, init and decay flags as documented */
    static const struct { const char *name; int decay; } names[] = {
        { "rms.g", 0 }, { "rms2.g", 0 }, { "conv.W", 1 }, { "conv.b", 0 }, { "conv2.W", 1 },
    };
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        int id = model_find(m, names[k].name);
        CHECK(id >= 0, "layers: no parameter %s", names[k].name);
        if (id >= 0) CHECK(model_param(m, id)->decay == names[k].decay, "%s: decay flag %d, want %d", names[k].name,
                           model_param(m, id)->decay, names[k].decay);
    }
    char b1[96];
    tg_shape ws = tg_model_param_shape(m, cb.W.id), bs = tg_model_param_shape(m, cb.b.id);
    CHECK(same_shape(ws, TG_SHAPE(4, 3, 3, 3)) && same_shape(bs, TG_SHAPE(4)), "conv W %s b %s", shape_s(ws, b1), shape_s(bs, b1));

    inspec x2 = FIN("x", -2, 2, 3, 5), x3 = FIN("x", -2, 2, 2, 3, 5), x1 = FIN("x", -2, 2, 1, 1, 5);
    inspec img = FIN("x", -2, 2, 2, 3, 5, 4), img2 = FIN("x", -2, 2, 1, 2, 7, 6);
    struct { const char *what; opctx c; const inspec *in; } cases[] = {
        { "tg_rmsnorm eps default x [3,5]", { .op = O_RMSNORM, .layer = &rms }, &x2 },
        { "tg_rmsnorm eps default x [2,3,5]", { .op = O_RMSNORM, .layer = &rms }, &x3 },
        { "tg_rmsnorm eps default x [1,1,5]", { .op = O_RMSNORM, .layer = &rms }, &x1 },
        { "tg_rmsnorm eps 0.5 x [2,3,5]", { .op = O_RMSNORM, .layer = &rms2, .lo = 0.5 }, &x3 },
        { "tg_conv 3->4 k3 s1 p1 bias x [2,3,5,4]", { .op = O_CONV_LAYER, .layer = &cb, .stride = 1, .pad = 1, .n = 1 }, &img },
        { "tg_conv 2->3 k2 s2 p0 no bias x [1,2,7,6]", { .op = O_CONV_LAYER, .layer = &cn, .stride = 2, .pad = 0, .n = 0 }, &img2 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) both(cases[k].what, &cases[k].c, m, 1, cases[k].in);
    tg_model_free(m);

    /* The conv init: W ~ N(0, 2 / (in k k)) over the true fan-in, b zeros; rmsnorm g ones. */
    m = tg_model_new(13);
    tg_conv2d_layer big = tg_conv2d_new(m, "big", 16, 32, 3, 1, 1, 1);
    tg_rmsnorm r8 = tg_rmsnorm_new(m, "r8", 8, 0);
    opctx c = { .op = O_CONV_LAYER, .layer = &big, .stride = 1, .pad = 1, .n = 1 };
    tg_input_decl d[1] = { TG_F32("x", 1, 16, 3, 3) };
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, op_forward, &c, d, 1, false, false, &err);
    CHECK(p != NULL, "conv init probe: %s", err.msg);
    if (p) {
        const double *W = tg_probe_param(p, big.W.id), *b = tg_probe_param(p, big.b.id);
        int64_t n = 32 * 16 * 9;
        double mean = 0, var = 0, want = sqrt(2.0 / (16 * 9));
        for (int64_t i = 0; i < n; i++) mean += W[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (W[i] - mean) * (W[i] - mean);
        double sd = sqrt(var / (double)(n - 1));
        CHECK(fabs(sd / want - 1) < 0.05 && fabs(mean) < 0.01, "tg_conv2d_new(16 -> 32, k 3) W: mean %g sd %g, want 0 and %g",
              mean, sd, want);
        int nz = 0;
        for (int i = 0; i < 32; i++) nz += b[i] != 0;
        CHECK(nz == 0, "tg_conv2d_new: %d of 32 biases are not 0", nz);
        tg_probe_free(p);
    }
    opctx cr = { .op = O_RMSNORM, .layer = &r8 };
    tg_input_decl d8[1] = { TG_F32("x", 2, 8) };
    p = tg_probe_new(m, op_forward, &cr, d8, 1, false, false, &err);
    CHECK(p != NULL, "rmsnorm init probe: %s", err.msg);
    if (p) {
        const double *g = tg_probe_param(p, r8.g.id);
        int ones = 0;
        for (int i = 0; i < 8; i++) ones += g[i] == 1;
        CHECK(ones == 8, "tg_rmsnorm_new: %d of 8 g values are 1", ones);
        tg_probe_free(p);
    }
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Composite models
 * ------------------------------------------------------------------------------------------- */

typedef struct { tg_linear q, k, v; tg_rmsnorm norm; int heads; } cattn;
/* Causal multi-head attention with dropout on the probabilities, a residual, rmsnorm, gelu. */
static tg_tensor cattn_loss(const void *vc, const tg_tensor *in) {
    const cattn *a = vc;
    tg_tensor x = in[0];                                              /* [2,5,6] */
    tg_tensor q = tg_split_heads(tg_linear(&a->q, x), a->heads);     /* [2,2,5,3] */
    tg_tensor k = tg_split_heads(tg_linear(&a->k, x), a->heads);
    tg_tensor v = tg_split_heads(tg_linear(&a->v, x), a->heads);
    tg_tensor s = tg_mul(tg_matmul(q, tg_swapaxes(k, -1, -2)), 1.0 / sqrt(3.0));
    tg_tensor att = tg_dropout(tg_softmax_causal(s), 0.2);
    tg_tensor o = tg_merge_heads(tg_matmul(att, v));                  /* [2,5,6] */
    tg_tensor h = tg_gelu(tg_rmsnorm(&a->norm, tg_add(o, x)));
    return tg_mean(tg_square(tg_sub(h, in[1])), TG_ALL, 0);
}

typedef struct { tg_conv2d_layer c1, c2; } cnn;
/* conv -> silu -> max_pool -> upsample -> concat with the input -> strided conv -> flatten ->
 * cross entropy over the 3 * 2 * 2 = 12 features. */
static tg_tensor cnn_loss(const void *vc, const tg_tensor *in) {
    const cnn *n = vc;
    tg_tensor h = tg_silu(tg_conv(&n->c1, in[0]));                    /* [2,3,6,6] */
    h = tg_nearest_upsample2d(tg_max_pool2d(h, 2, 2, 0), 2);          /* [2,3,6,6] */
    tg_tensor both2[2] = { h, in[0] };
    h = tg_conv(&n->c2, tg_concat(both2, 2, 1));                      /* [2,5,6,6] -> [2,3,2,2] */
    tg_tensor logits = tg_flatten(tg_sin(h), 1);                      /* [2,12] */
    return tg_cross_entropy(logits, in[1], TG_MEAN);
}

static void test_models(void) {
    tg_model *m = tg_model_new(31);
    cattn a = { tg_linear_new(m, "q", 6, 6, NULL), tg_linear_new(m, "k", 6, 6, NULL), tg_linear_new(m, "v", 6, 6, NULL),
                tg_rmsnorm_new(m, "norm", 6, 0), 2 };
    CHECK(tg_model_error(m) == NULL, "model error: %s", tg_model_error(m));
    inspec ins[2] = { FIN("x", -1, 1, 2, 5, 6), FIN("y", -1, 1, 2, 5, 6) };
    gradcheck("model: causal 2-head attention + dropout + residual + rmsnorm + gelu", m, cattn_loss, &a, 2, ins, SEED_A, false);
    tg_model_free(m);

    m = tg_model_new(32);
    cnn n = { tg_conv2d_new(m, "c1", 2, 3, 3, 1, 1, 1), tg_conv2d_new(m, "c2", 5, 3, 3, 2, 0, 1) };
    CHECK(tg_model_error(m) == NULL, "model error: %s", tg_model_error(m));
    inspec cins[2] = { FIN("x", -1, 1, 2, 2, 6, 6), IIN("y", 0, 11, 2) };
    gradcheck("model: conv + silu + max_pool + upsample + concat + conv + flatten + cross_entropy", m, cnn_loss, &n, 2, cins,
              0, false);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Trace-time errors: inputs x [4,3] f32, idx [4,3] i32, img [2,3,5,5], w [4,2,3,3] (C mismatch)
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    E_SIN_I32, E_COS_I32, E_GELU_I32, E_GELU_TANH_I32, E_SILU_I32,
    E_ARGMAX_AXIS, E_ARGMIN_AXIS, E_FLATTEN_AXIS, E_SPLIT_HEADS_DIV, E_SPLIT_HEADS_RANK, E_SPLIT_HEADS_ZERO,
    E_MERGE_HEADS_RANK, E_TAKE_SHAPE, E_TAKE_RANK, E_TAKE_F32_IDX, E_TAKE_AXIS,
    E_ARANGE_ZERO, E_ZEROS_DIM, E_ONES_DIM, E_RANDN_DIM,
    E_NARROW_END, E_NARROW_START, E_NARROW_LEN, E_NARROW_AXIS,
    E_CONCAT_SHAPE, E_CONCAT_RANK, E_CONCAT_NONE, E_CONCAT_AXIS, E_CONCAT_DTYPE,
    E_STACK_SHAPE, E_STACK_AXIS, E_STACK_NONE,
    E_SPLIT_SUM, E_SPLIT_NEG, E_SPLIT_AXIS,
    E_SOFTMAX_CAUSAL_RANK, E_SOFTMAX_CAUSAL_I32, E_WHERE_CAUSAL_RANK,
    E_DROPOUT_ONE, E_DROPOUT_NEG, E_DROPOUT_NAN, E_DROPOUT_I32,
    E_CONV_CHANNELS, E_CONV_W_RANK, E_CONV_X_RANK, E_CONV_TOO_BIG, E_CONV_STRIDE,
    E_POOL_PAD, E_POOL_K, E_POOL_STRIDE, E_POOL_RANK, E_POOL_TOO_BIG,
    E_UPSAMPLE_FACTOR, E_UPSAMPLE_RANK,
    E_CONV_LAYER, E_RMSNORM_LAYER
} ekind;

typedef struct { ekind kind; const tg_conv2d_layer *conv; const tg_rmsnorm *rms; } ectx;
static int err_line;

static tg_tensor err_forward(const void *vc, const tg_tensor *in) {
    const ectx *c = vc;
    tg_tensor x = in[0], idx = in[1], img = in[2], w = in[3], out[3];
    tg_tensor pair[2] = { x, x };
    static const int64_t bad_sum[2] = { 1, 1 }, bad_neg[2] = { 4, -1 };
    switch (c->kind) {
    case E_SIN_I32: err_line = __LINE__; return tg_sin(idx);
    case E_COS_I32: err_line = __LINE__; return tg_cos(idx);
    case E_GELU_I32: err_line = __LINE__; return tg_gelu(idx);
    case E_GELU_TANH_I32: err_line = __LINE__; return tg_gelu_tanh(idx);
    case E_SILU_I32: err_line = __LINE__; return tg_silu(idx);
    case E_ARGMAX_AXIS: err_line = __LINE__; return tg_argmax(x, 2);
    case E_ARGMIN_AXIS: err_line = __LINE__; return tg_argmin(x, -3);
    case E_FLATTEN_AXIS: err_line = __LINE__; return tg_flatten(x, 2);
    case E_SPLIT_HEADS_DIV: err_line = __LINE__; return tg_split_heads(x, 2);
    case E_SPLIT_HEADS_RANK: { tg_tensor v = tg_reshape(x, 12); err_line = __LINE__; return tg_split_heads(v, 3); }
    case E_SPLIT_HEADS_ZERO: err_line = __LINE__; return tg_split_heads(x, 0);
    case E_MERGE_HEADS_RANK: err_line = __LINE__; return tg_merge_heads(x);
    case E_TAKE_SHAPE: { tg_tensor i2 = tg_reshape(tg_narrow(idx, 0, 0, 2), 2, 3); err_line = __LINE__; return tg_take_along_axis(x, i2, 1); }
    case E_TAKE_RANK: { tg_tensor i1 = tg_reshape(idx, 12); err_line = __LINE__; return tg_take_along_axis(x, i1, 0); }
    case E_TAKE_F32_IDX: err_line = __LINE__; return tg_take_along_axis(x, x, 1);
    case E_TAKE_AXIS: err_line = __LINE__; return tg_take_along_axis(x, idx, 2);
    case E_ARANGE_ZERO: err_line = __LINE__; return tg_arange(0, TG_FLOAT32);
    case E_ZEROS_DIM: err_line = __LINE__; return tg_zeros(TG_FLOAT32, 2, 0);
    case E_ONES_DIM: err_line = __LINE__; return tg_ones(TG_INT32, -1, 3);
    case E_RANDN_DIM: err_line = __LINE__; return tg_randn(0, 3);
    case E_NARROW_END: err_line = __LINE__; return tg_narrow(x, 1, 2, 2);
    case E_NARROW_START: err_line = __LINE__; return tg_narrow(x, 0, -1, 2);
    case E_NARROW_LEN: err_line = __LINE__; return tg_narrow(x, 0, 1, 0);
    case E_NARROW_AXIS: err_line = __LINE__; return tg_narrow(x, 2, 0, 1);
    case E_CONCAT_SHAPE: { tg_tensor xs[2] = { x, tg_reshape(x, 2, 6) }; err_line = __LINE__; return tg_concat(xs, 2, 0); }
    case E_CONCAT_RANK: { tg_tensor xs[2] = { x, tg_reshape(x, 4, 3, 1) }; err_line = __LINE__; return tg_concat(xs, 2, 0); }
    case E_CONCAT_NONE: err_line = __LINE__; return tg_concat(pair, 0, 0);
    case E_CONCAT_AXIS: err_line = __LINE__; return tg_concat(pair, 2, 2);
    case E_CONCAT_DTYPE: { tg_tensor xs[2] = { x, idx }; err_line = __LINE__; return tg_concat(xs, 2, 0); }
    case E_STACK_SHAPE: { tg_tensor xs[2] = { x, tg_reshape(x, 3, 4) }; err_line = __LINE__; return tg_stack(xs, 2, 0); }
    case E_STACK_AXIS: err_line = __LINE__; return tg_stack(pair, 2, 3);
    case E_STACK_NONE: err_line = __LINE__; return tg_stack(pair, 0, 0);
    case E_SPLIT_SUM: err_line = __LINE__; tg_split(x, bad_sum, 2, 1, out); return out[0];
    case E_SPLIT_NEG: err_line = __LINE__; tg_split(x, bad_neg, 2, 1, out); return out[0];
    case E_SPLIT_AXIS: err_line = __LINE__; tg_split(x, bad_sum, 2, -3, out); return out[0];
    case E_SOFTMAX_CAUSAL_RANK: { tg_tensor v = tg_reshape(x, 12); err_line = __LINE__; return tg_softmax_causal(v); }
    case E_SOFTMAX_CAUSAL_I32: err_line = __LINE__; return tg_softmax_causal(idx);
    case E_WHERE_CAUSAL_RANK: { tg_tensor v = tg_reshape(x, 12); err_line = __LINE__; return tg_where_causal(v, 0); }
    case E_DROPOUT_ONE: err_line = __LINE__; return tg_dropout(x, 1);
    case E_DROPOUT_NEG: err_line = __LINE__; return tg_dropout(x, -0.25);
    case E_DROPOUT_NAN: err_line = __LINE__; return tg_dropout(x, NAN);
    case E_DROPOUT_I32: err_line = __LINE__; return tg_dropout(idx, 0.5);
    case E_CONV_CHANNELS: err_line = __LINE__; return tg_conv2d(img, w, 1, 0);
    case E_CONV_W_RANK: { tg_tensor w3 = tg_reshape(w, 4, 2, 9); err_line = __LINE__; return tg_conv2d(img, w3, 1, 0); }
    case E_CONV_X_RANK: err_line = __LINE__; return tg_conv2d(x, w, 1, 0);
    case E_CONV_TOO_BIG: { tg_tensor w7 = tg_reshape(tg_concat(pair, 2, 0), 1, 3, 2, 4); err_line = __LINE__; return tg_conv2d(tg_narrow(img, 2, 0, 1), w7, 1, 0); }
    case E_CONV_STRIDE: { tg_tensor w3 = tg_narrow(tg_reshape(tg_concat(pair, 2, 0), 2, 3, 2, 2), 0, 0, 1); err_line = __LINE__; return tg_conv2d(img, w3, 0, 0); }
    case E_POOL_PAD: err_line = __LINE__; return tg_max_pool2d(img, 2, 2, 2);
    case E_POOL_K: err_line = __LINE__; return tg_max_pool2d(img, 0, 1, 0);
    case E_POOL_STRIDE: err_line = __LINE__; return tg_max_pool2d(img, 2, 0, 0);
    case E_POOL_RANK: err_line = __LINE__; return tg_max_pool2d(x, 2, 2, 0);
    case E_POOL_TOO_BIG: err_line = __LINE__; return tg_max_pool2d(img, 7, 1, 0);
    case E_UPSAMPLE_FACTOR: err_line = __LINE__; return tg_nearest_upsample2d(img, 0);
    case E_UPSAMPLE_RANK: err_line = __LINE__; return tg_nearest_upsample2d(x, 2);
    case E_CONV_LAYER: err_line = __LINE__; return tg_conv(c->conv, img);
    case E_RMSNORM_LAYER: err_line = __LINE__; return tg_rmsnorm(c->rms, x);
    }
    return x;
}

/* Each case: the strings its message must hold (besides "test_ops_more.c:LINE"). alt: an
 * acceptable alternative to parts[0] (the op the layer is written with). */
static const struct { ekind kind; const char *label; const char *alt; const char *parts[4]; } err_cases[] = {
    { E_SIN_I32, "sin of i32", NULL, { "tg_sin", "i32" } },
    { E_COS_I32, "cos of i32", NULL, { "tg_cos", "i32" } },
    { E_GELU_I32, "gelu of i32", NULL, { "tg_gelu", "i32" } },
    { E_GELU_TANH_I32, "gelu_tanh of i32", NULL, { "tg_gelu_tanh", "i32" } },
    { E_SILU_I32, "silu of i32", NULL, { "tg_silu", "i32" } },
    { E_ARGMAX_AXIS, "argmax axis 2", NULL, { "tg_argmax", "axis 2", "[4,3]" } },
    { E_ARGMIN_AXIS, "argmin axis -3", NULL, { "tg_argmin", "axis -3", "[4,3]" } },
    { E_FLATTEN_AXIS, "flatten start 2", NULL, { "tg_flatten", "axis 2", "[4,3]" } },
    { E_SPLIT_HEADS_DIV, "split_heads 3 into 2", NULL, { "tg_split_heads", "[4,3]", "2 heads" } },
    { E_SPLIT_HEADS_RANK, "split_heads rank 1", NULL, { "tg_split_heads", "[12]" } },
    { E_SPLIT_HEADS_ZERO, "split_heads 0 heads", NULL, { "tg_split_heads", "[4,3]", "0 heads" } },
    { E_MERGE_HEADS_RANK, "merge_heads rank 2", NULL, { "tg_merge_heads", "[4,3]" } },
    { E_TAKE_SHAPE, "take_along_axis shapes", NULL, { "tg_take_along_axis", "[4,3]", "[2,3]" } },
    { E_TAKE_RANK, "take_along_axis rank", NULL, { "tg_take_along_axis", "[4,3]", "[12]" } },
    { E_TAKE_F32_IDX, "take_along_axis f32 indices", NULL, { "tg_take_along_axis", "i32" } },
    { E_TAKE_AXIS, "take_along_axis axis 2", NULL, { "tg_take_along_axis", "axis 2", "[4,3]" } },
    { E_ARANGE_ZERO, "arange 0", NULL, { "tg_arange", "length 0" } },
    { E_ZEROS_DIM, "zeros [2,0]", NULL, { "tg_zeros", "[2,0]" } },
    { E_ONES_DIM, "ones [-1,3]", NULL, { "tg_ones", "[-1,3]" } },
    { E_RANDN_DIM, "randn [0,3]", NULL, { "tg_randn", "[0,3]" } },
    { E_NARROW_END, "narrow past the end", NULL, { "tg_narrow", "[4,3]", "axis 1" } },
    { E_NARROW_START, "narrow start -1", NULL, { "tg_narrow", "[4,3]" } },
    { E_NARROW_LEN, "narrow length 0", NULL, { "tg_narrow", "[4,3]" } },
    { E_NARROW_AXIS, "narrow axis 2", NULL, { "tg_narrow", "axis 2", "[4,3]" } },
    { E_CONCAT_SHAPE, "concat shapes", NULL, { "tg_concat", "[4,3]", "[2,6]" } },
    { E_CONCAT_RANK, "concat ranks", NULL, { "tg_concat", "[4,3]", "[4,3,1]" } },
    { E_CONCAT_NONE, "concat of none", NULL, { "tg_concat" } },
    { E_CONCAT_AXIS, "concat axis 2", NULL, { "tg_concat", "axis 2", "[4,3]" } },
    { E_CONCAT_DTYPE, "concat f32 with i32", NULL, { "tg_concat", "i32" } },
    { E_STACK_SHAPE, "stack shapes", NULL, { "tg_stack", "[4,3]", "[3,4]" } },
    { E_STACK_AXIS, "stack axis 3", NULL, { "tg_stack", "axis 3", "[4,3]" } },
    { E_STACK_NONE, "stack of none", NULL, { "tg_stack" } },
    { E_SPLIT_SUM, "split sizes 1+1 of 3", NULL, { "tg_split", "[4,3]" } },
    { E_SPLIT_NEG, "split size -1", NULL, { "tg_split", "[4,3]" } },
    { E_SPLIT_AXIS, "split axis -3", NULL, { "tg_split", "axis -3", "[4,3]" } },
    { E_SOFTMAX_CAUSAL_RANK, "softmax_causal rank 1", NULL, { "tg_softmax_causal", "[12]" } },
    { E_SOFTMAX_CAUSAL_I32, "softmax_causal of i32", NULL, { "tg_softmax_causal", "i32" } },
    { E_WHERE_CAUSAL_RANK, "where_causal rank 1", NULL, { "tg_where_causal", "[12]" } },
    { E_DROPOUT_ONE, "dropout p 1", NULL, { "tg_dropout", "p = 1" } },
    { E_DROPOUT_NEG, "dropout p -0.25", NULL, { "tg_dropout", "-0.25" } },
    { E_DROPOUT_NAN, "dropout p NaN", NULL, { "tg_dropout", "nan" } },
    { E_DROPOUT_I32, "dropout of i32", NULL, { "tg_dropout", "i32" } },
    { E_CONV_CHANNELS, "conv2d channels", NULL, { "tg_conv2d", "[2,3,5,5]", "[4,2,3,3]" } },
    { E_CONV_W_RANK, "conv2d 3-D weight", NULL, { "tg_conv2d", "[2,3,5,5]", "[4,2,9]" } },
    { E_CONV_X_RANK, "conv2d 2-D input", NULL, { "tg_conv2d", "[4,3]" } },
    { E_CONV_TOO_BIG, "conv2d kernel taller than the input", NULL, { "tg_conv2d", "[2,3,1,5]", "[1,3,2,4]" } },
    { E_CONV_STRIDE, "conv2d stride 0", NULL, { "tg_conv2d", "stride 0", "[2,3,5,5]" } },
    { E_POOL_PAD, "max_pool2d padding > k/2", NULL, { "tg_max_pool2d", "[2,3,5,5]", "padding 2" } },
    { E_POOL_K, "max_pool2d k 0", NULL, { "tg_max_pool2d", "[2,3,5,5]", "k 0" } },
    { E_POOL_STRIDE, "max_pool2d stride 0", NULL, { "tg_max_pool2d", "[2,3,5,5]", "stride 0" } },
    { E_POOL_RANK, "max_pool2d 2-D input", NULL, { "tg_max_pool2d", "[4,3]" } },
    { E_POOL_TOO_BIG, "max_pool2d window larger than the input", NULL, { "tg_max_pool2d", "[2,3,5,5]", "k 7" } },
    { E_UPSAMPLE_FACTOR, "nearest_upsample2d factor 0", NULL, { "tg_nearest_upsample2d", "factor 0" } },
    { E_UPSAMPLE_RANK, "nearest_upsample2d 2-D input", NULL, { "tg_nearest_upsample2d", "[4,3]" } },
    { E_CONV_LAYER, "tg_conv in 2 channels on a 3-channel image", NULL, { "tg_conv", "[2,3,5,5]", "[4,2,3,3]" } },
    { E_RMSNORM_LAYER, "tg_rmsnorm dim 5 on [4,3]", "tg_mul", { "tg_rmsnorm", "[4,3]", "[5]" } },
};

/* Traces the case in a child process first, so that a crash (a division by zero, say) fails a
 * check instead of ending the test. True when the child exited normally. */
static bool survives(tg_model *m, const ectx *c, const tg_input_decl *in, int *sig) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return true;   /* cannot tell: go ahead */
    if (pid == 0) {
        tg_error e;
        tg_probe_free(tg_probe_new(m, err_forward, c, in, 4, true, false, &e));
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    *sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void test_errors(void) {
    tg_model *m = tg_model_new(1);
    tg_conv2d_layer conv = tg_conv2d_new(m, "conv", 2, 4, 3, 1, 0, 1);
    tg_rmsnorm rms = tg_rmsnorm_new(m, "rms", 5, 0);
    const tg_input_decl in[] = { TG_F32("x", 4, 3), TG_I32("idx", 4, 3), TG_F32("img", 2, 3, 5, 5), TG_F32("w", 4, 2, 3, 3) };
    for (size_t k = 0; k < sizeof err_cases / sizeof *err_cases; k++) {
        ectx c = { err_cases[k].kind, &conv, &rms };
        const char *label = err_cases[k].label;
        tg_error err;
        memset(&err, 0, sizeof err);
        err_line = -1;
        int sig = 0;
        bool alive = survives(m, &c, in, &sig);
        CHECK(alive, "%s: tracing crashed (signal %d)", label, sig);
        if (!alive) continue;
        for (int grads = 0; grads < 2; grads++) {
            tg_probe *p = tg_probe_new(m, err_forward, &c, in, 4, grads, false, &err);
            CHECK(p == NULL, "%s: tg_probe_new succeeded (grads %d)", label, grads);
            tg_probe_free(p);
        }
        CHECK(err_line > 0, "%s: the forward was not traced", label);
        if (getenv("TG_VERBOSE")) printf("%-44s %s\n", label, err.msg);
        char site[64];
        snprintf(site, sizeof site, "test_ops_more.c:%d:", err_line);
        CHECK(strstr(err.msg, site) != NULL, "%s: message lacks \"%s\": \"%s\"", label, site, err.msg);
        for (int j = 0; j < 4 && err_cases[k].parts[j]; j++) {
            const char *part = err_cases[k].parts[j], *alt = j == 0 ? err_cases[k].alt : NULL;
            bool ok = strstr(err.msg, part) != NULL || (alt && strstr(err.msg, alt) != NULL);
            CHECK(ok, "%s: message lacks \"%s\"%s%s: \"%s\"", label, part, alt ? " or " : "", alt ? alt : "", err.msg);
        }
    }
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * AdamW decay_filter through the public API
 * ------------------------------------------------------------------------------------------- */

#define AW_N 4
typedef struct { tg_param p[5]; } awctx;
static const char *const aw_names[5] = { "lin.W", "lin.b", "norm.g", "keep.W", "keep.b" };

/* loss = sum((lin.W + lin.b + norm.g + keep.W + keep.b) * x): every gradient is x. */
static tg_tensor aw_loss(const void *vc, const tg_tensor *in) {
    const awctx *c = vc;
    tg_tensor s = tg_p(c->p[0]);
    for (int i = 1; i < 5; i++) s = tg_add(s, tg_p(c->p[i]));
    return tg_sum(tg_mul(s, in[0]), TG_ALL, 0);
}

typedef struct { int calls; } awfilter_ctx;
/* 0 for names ending in ".b", 1 otherwise, -1 (keep the param's flag) for "keep.W". */
static int aw_filter(const char *name, void *vctx) {
    ((awfilter_ctx *)vctx)->calls++;
    if (strcmp(name, "keep.W") == 0) return -1;
    size_t n = strlen(name);
    return n >= 2 && strcmp(name + n - 2, ".b") == 0 ? 0 : 1;
}

static void test_adamw_filter(void) {
    static const float lit[5][AW_N] = {
        { 0.5f, -1.25f, 2.0f, 0.75f }, { -0.5f, 1.5f, 0.25f, -2.0f }, { 1, 1, 1, 1 }, { 1.75f, -0.5f, 0.125f, 3.0f },
        { 2.5f, -1.0f, 0.5f, 1.25f },
    };
    /* Flags: lin.W literal (yes), lin.b literal (yes), norm.g ones (no), keep.W literal forced no,
     * keep.b literal forced yes. */
    static const int flag[5] = { 1, 1, 0, 0, 1 };
    /* With the filter: lin.W 1, lin.b 0, norm.g 1, keep.W -1 -> its flag (no), keep.b 0. */
    static const int filtered[5] = { 1, 0, 1, 0, 0 };
    const double lr = 0.1, wd = 0.5, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    for (int use_filter = 0; use_filter < 2; use_filter++) {
        tg_model *m = tg_model_new(3);
        awctx c;
        for (int i = 0; i < 5; i++) {
            tg_init init = i == 2 ? tg_init_ones() : tg_init_literal(lit[i], AW_N);
            if (i >= 3) init = tg_init_decay(init, flag[i]);
            tg_model_push(m, "%.*s", (int)(strchr(aw_names[i], '.') - aw_names[i]), aw_names[i]);
            c.p[i] = tg_param_new(m, strchr(aw_names[i], '.') + 1, TG_SHAPE(AW_N), init);
            tg_model_pop(m);
            CHECK(strcmp(tg_model_param_name(m, c.p[i].id), aw_names[i]) == 0, "adamw: param %d is named %s, want %s", i,
                  tg_model_param_name(m, c.p[i].id), aw_names[i]);
        }
        CHECK(tg_model_error(m) == NULL, "adamw: model error %s", tg_model_error(m));
        awfilter_ctx fc = { 0 };
        tg_optimizer opt = tg_adamw(lr, wd);
        if (use_filter) {
            opt.decay_filter = aw_filter;
            opt.decay_ctx = &fc;
        }
        const char *mode = use_filter ? "with decay_filter" : "without decay_filter";
        tg_error err;
        memset(&err, 0, sizeof err);
        tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = aw_loss, .ctx = &c,
                                                  .inputs = (tg_input_decl[]){ TG_F32("x", AW_N) }, .n_inputs = 1,
                                                  .optimizer = opt }, &err);
        CHECK(t != NULL, "adamw %s: compile: %s", mode, err.msg);
        if (!t) { tg_model_free(m); continue; }
        if (use_filter) CHECK(fc.calls >= 5, "adamw: decay_filter called %d times (with decay_ctx), want one per param", fc.calls);
        const int *decays = use_filter ? filtered : flag;

        /* Reference AdamW state in double, from the downloaded initial values. */
        double p[5][AW_N], mm[5][AW_N] = { { 0 } }, vv[5][AW_N] = { { 0 } };
        for (int i = 0; i < 5; i++) {
            float buf[AW_N];
            CHECK(tg_download_param(t, aw_names[i], buf, AW_N, &err) == TG_OK, "adamw: download %s: %s", aw_names[i], err.msg);
            for (int j = 0; j < AW_N; j++) p[i][j] = buf[j];
        }
        /* Step 1 with x = 0 (zero gradients: only the decay moves a parameter), step 2 with x != 0. */
        static const float xs[2][AW_N] = { { 0, 0, 0, 0 }, { 0.5f, -2.0f, 1.0f, 0.25f } };
        for (int step = 1; step <= 2; step++) {
            double before[5][AW_N];
            memcpy(before, p, sizeof p);
            tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", xs[step - 1], AW_N) }, 1);
            CHECK(r.status == TG_OK && r.step == step, "adamw %s: step %d: %s", mode, step, r.error);
            double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
            for (int i = 0; i < 5; i++) {
                for (int j = 0; j < AW_N; j++) {   /* torch.optim.AdamW, one step */
                    double g = xs[step - 1][j];
                    if (decays[i]) p[i][j] *= 1 - lr * wd;
                    mm[i][j] = b1 * mm[i][j] + (1 - b1) * g;
                    vv[i][j] = b2 * vv[i][j] + (1 - b2) * g * g;
                    p[i][j] -= lr / bc1 * mm[i][j] / (sqrt(vv[i][j]) / sqrt(bc2) + eps);
                }
                float got[AW_N] = { NAN, NAN, NAN, NAN }, grad[AW_N] = { NAN, NAN, NAN, NAN };
                tg_download_param(t, aw_names[i], got, AW_N, &err);
                tg_download_param_grad(t, aw_names[i], grad, AW_N, &err);
                int off = 0, gbad = 0, shrank = 0, same = 0;
                for (int j = 0; j < AW_N; j++) {
                    off += !check_close(got[j], p[i][j], 1e-6);
                    gbad += grad[j] != xs[step - 1][j];
                    shrank += fabs(got[j]) < fabs(before[i][j]);
                    same += got[j] == (float)before[i][j];
                }
                CHECK(off == 0, "adamw %s step %d: %s: %d of %d values differ from the AdamW formula (decay %d)", mode, step,
                      aw_names[i], off, AW_N, decays[i]);
                CHECK(gbad == 0, "adamw %s step %d: %s: gradient is not x", mode, step, aw_names[i]);
                if (step == 1) {   /* zero gradient: decayed params shrink, the others stay exactly */
                    if (decays[i]) CHECK(shrank == AW_N, "adamw %s: %s should have decayed (%d of %d shrank)", mode,
                                         aw_names[i], shrank, AW_N);
                    else CHECK(same == AW_N, "adamw %s: %s should not have decayed (%d of %d unchanged)", mode,
                               aw_names[i], same, AW_N);
                }
                for (int j = 0; j < AW_N; j++) p[i][j] = got[j];   /* follow the f32 values */
            }
        }
        tg_destroy(t);
        tg_model_free(m);
    }
}

int main(void) {
    test_elementwise();
    test_argmax();
    test_layout();
    test_builders();
    test_structure();
    test_causal();
    test_randn();
    test_dropout();
    test_seed_bits();
    test_random_api();
    test_images();
    test_layers();
    test_models();
    test_errors();
    test_adamw_filter();
    printf("test_ops_more: %d forward cases (each in f64 and f32), %d gradient probes, %lld gradient elements by finite "
           "differences; worst rel err %.3g (%s)\n",
           n_fwd_cases, fd_stats.cases, (long long)fd_stats.elements, fd_stats.worst_err, fd_stats.worst_what);
    return check_report("test_ops_more");
}
