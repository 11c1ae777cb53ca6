/* Precision settings (tg_precision) on the reference interpreter, the oracle of every backend:
 *  - the rounding itself: bf16 to nearest even, tf32 to nearest with ties away, NaN and
 *    infinities untouched, exact at the halfway cases;
 *  - products, convolutions and attention at tf32 and bf16 against float64 loops over the
 *    operands rounded the same way (so the emulation is exact, not merely close); at bf16 the
 *    activations rounded too (a product's output, a bias added to it, its gelu), but not an
 *    elementwise op of f32 inputs, nor a residual sum with an f32 tensor;
 *  - the settings through the API: what each backend runs (tg_train_precision: the cpu backend
 *    runs bf16 where the CPU has AVX512-BF16, else f32, and says which), forwards inheriting the
 *    training handle's setting, an unknown value refused, checkpoints moving between precisions;
 *  - training quality, short form: the digits MLP trained in bf16 ends within a few percent of
 *    f32 (on the reference, and on the cpu backend where it runs bf16); at length: the digits CNN
 *    (on that cpu, and where a GPU is, tests/run_gpu.sh) and chargpt (GPU).
 * test_backend compares CUDA with the reference at each precision. */
#include "internal.h"
#include "cpu/cpu.h"
#include "check.h"
#include "probe_util.h"
#include "run_example.h"

#include <stdlib.h>
#include <string.h>

static float bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_rounding(void) {
    const tg_precision BF = TG_PRECISION_BF16, TF = TG_PRECISION_TF32;
    /* bf16 keeps 8 bits of mantissa (7 stored): 1 + 2^-8 is halfway between 1 and 1 + 2^-7. */
    CHECK(precision_round(BF, 1.0f + 0x1p-8f) == 1.0f, "bf16: a tie rounds to the even 1.0");
    CHECK(precision_round(BF, 1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f, "bf16: a tie rounds to the even 1 + 2^-6");
    CHECK(precision_round(BF, 1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f, "bf16: past the tie rounds up");
    CHECK(precision_round(BF, -(1.0f + 0x1p-9f)) == -1.0f, "bf16: below the tie rounds down, sign kept");
    /* tf32 keeps 11 bits (10 stored): 1 + 2^-11 is a tie, rounded away from zero. */
    CHECK(precision_round(TF, 1.0f + 0x1p-11f) == 1.0f + 0x1p-10f, "tf32: a tie rounds away from zero");
    CHECK(precision_round(TF, -(1.0f + 0x1p-11f)) == -(1.0f + 0x1p-10f), "tf32: a negative tie too");
    CHECK(precision_round(TF, 1.0f + 0x1p-12f) == 1.0f, "tf32: below the tie rounds down");
    CHECK(precision_round(TG_PRECISION_F32, 1.0f + 0x1p-20f) == 1.0f + 0x1p-20f, "f32: nothing rounded");
    CHECK(isnan(precision_round(BF, NAN)) && isnan(precision_round(TF, NAN)), "NaN stays NaN");
    CHECK(precision_round(BF, INFINITY) == INFINITY && precision_round(TF, -INFINITY) == -INFINITY, "infinities stay");
    CHECK(precision_round(BF, bits(0x7f7fffffu)) == INFINITY, "bf16: the largest float rounds to infinity");
    /* every rounded value is representable: the low bits are zero */
    check_rng = 17;
    int bad = 0;
    for (int i = 0; i < 10000; i++) {
        float x = (float)check_uniform(-100, 100), b = precision_round(BF, x), t = precision_round(TF, x);
        uint32_t ub, ut;
        memcpy(&ub, &b, 4);
        memcpy(&ut, &t, 4);
        bad += (ub & 0xffffu) != 0 || (ut & 0x1fffu) != 0 || fabsf(b - x) > fabsf(x) * 0x1p-8f || fabsf(t - x) > fabsf(x) * 0x1p-11f;
    }
    CHECK(bad == 0, "%d of 10000 values rounded outside half an ulp or with low bits set", bad);
}

/* ----- operations at each precision against float64 over rounded operands ----- */

typedef enum { MATMUL, MATMUL_BT, CONV, ATTENTION, ELEMENTWISE, GELU_BIAS, RESIDUAL } opk;
typedef struct { opk op; } pctx;

static tg_tensor op_fwd(const void *vc, const tg_tensor *in) {
    switch (((const pctx *)vc)->op) {
    case MATMUL: return tg_matmul(in[0], in[1]);
    case MATMUL_BT: return tg_matmul(in[0], tg_swapaxes(in[1], -1, -2));
    case CONV: return tg_conv2d(in[0], in[1], 1, 1);
    case ATTENTION: return tg_attention(in[0], in[1], in[2], 1, 0.4);
    case ELEMENTWISE: return tg_mul(tg_exp(in[0]), in[1]);
    case GELU_BIAS: return tg_gelu(tg_add(tg_matmul(in[0], in[1]), in[2]));
    case RESIDUAL: return tg_add(in[2], tg_matmul(in[0], in[1]));
    }
    return in[0];
}

/* The operands rounded at precision p (in place). */
static void round_all(tg_precision p, ht *x, int n) {
    for (int i = 0; i < n; i++)
        for (int64_t e = 0; e < nel(x[i].s); e++) x[i].v[e] = precision_round(p, (float)x[i].v[e]);
}

static double gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2))); }

/* float64 of the op on (already rounded) operands */
static ht expect(opk op, const ht *x) {
    if (op == GELU_BIAS || op == RESIDUAL) {   /* [B, M, K] x [K, N], then with x[2] (f32): [N] bias or [B, M, N] */
        ht out = expect(MATMUL, x);
        int64_t N = out.s.d[2];
        for (int64_t e = 0; e < nel(out.s); e++)
            out.v[e] = op == RESIDUAL ? x[2].v[e] + out.v[e] : gelu(out.v[e] + x[2].v[e % N]);
        return out;
    }
    if (op == MATMUL || op == MATMUL_BT) {   /* [B, M, K] x [K, N] (or [N, K] transposed) */
        int64_t B = x[0].s.d[0], M = x[0].s.d[1], K = x[0].s.d[2], N = op == MATMUL ? x[1].s.d[1] : x[1].s.d[0];
        ht out = ht_new(TG_SHAPE(B, M, N));
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double acc = 0;
                    for (int64_t k = 0; k < K; k++)
                        acc += x[0].v[(b * M + i) * K + k] * (op == MATMUL ? x[1].v[k * N + j] : x[1].v[j * K + k]);
                    out.v[(b * M + i) * N + j] = acc;
                }
        return out;
    }
    if (op == CONV) {   /* x [N, C, H, W], w [O, C, 3, 3], stride 1, padding 1 */
        const int64_t *xd = x[0].s.d, *wd = x[1].s.d;
        int64_t N = xd[0], C = xd[1], H = xd[2], W = xd[3], O = wd[0];
        ht out = ht_new(TG_SHAPE(N, O, H, W));
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++)
                for (int64_t y = 0; y < H; y++)
                    for (int64_t z = 0; z < W; z++) {
                        double acc = 0;
                        for (int64_t c = 0; c < C; c++)
                            for (int64_t i = 0; i < 3; i++)
                                for (int64_t j = 0; j < 3; j++) {
                                    int64_t yy = y + i - 1, zz = z + j - 1;
                                    if (yy >= 0 && yy < H && zz >= 0 && zz < W)
                                        acc += x[0].v[((n * C + c) * H + yy) * W + zz] * x[1].v[((o * C + c) * 3 + i) * 3 + j];
                                }
                        out.v[((n * O + o) * H + y) * W + z] = acc;
                    }
        return out;
    }
    if (op == ATTENTION) {   /* [B, T, D] causal, scale 0.4 */
        int64_t B = x[0].s.d[0], T = x[0].s.d[1], D = x[0].s.d[2];
        ht out = ht_new(x[0].s);
        double *s = calloc((size_t)T, sizeof(double));
        for (int64_t b = 0; b < B; b++)
            for (int64_t r = 0; r < T; r++) {
                double mx = -INFINITY, sum = 0;
                for (int64_t c = 0; c <= r; c++) {
                    s[c] = 0;
                    for (int64_t d = 0; d < D; d++) s[c] += x[0].v[(b * T + r) * D + d] * x[1].v[(b * T + c) * D + d];
                    s[c] *= 0.4;
                    mx = fmax(mx, s[c]);
                }
                for (int64_t c = 0; c <= r; c++) sum += (s[c] = exp(s[c] - mx));
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0;
                    for (int64_t c = 0; c <= r; c++) acc += s[c] / sum * x[2].v[(b * T + c) * D + d];
                    out.v[(b * T + r) * D + d] = acc;
                }
            }
        free(s);
        return out;
    }
    ht out = ht_new(x[0].s);   /* elementwise: nothing rounded at any precision */
    for (int64_t i = 0; i < nel(x[0].s); i++) out.v[i] = exp(x[0].v[i]) * x[1].v[i];
    return out;
}

/* bf16 graphs round their activations (graph_bf16_values): a product's or attention's output; a product plus
 * its bias once, with the bias rounded to bf16 first (autocast's linear: graph_product_addend), and
 * the gelu of that; a residual sum of f32 x[2] and a rounded product stays f32.
 * `want`: the op on the rounded operands rx, replaced by what a bf16 graph computes. */
static void activations(opk op, ht *want, const ht *rx) {
    const tg_precision BF = TG_PRECISION_BF16;
    if (op == MATMUL || op == MATMUL_BT || op == CONV || op == ATTENTION)
        for (int64_t e = 0; e < nel(want->s); e++) want->v[e] = precision_round(BF, (float)want->v[e]);
    if (op != GELU_BIAS && op != RESIDUAL) return;
    ht mm = expect(MATMUL, rx);
    int64_t N = mm.s.d[2];
    for (int64_t e = 0; e < nel(mm.s); e++) {
        if (op == RESIDUAL) want->v[e] = rx[2].v[e] + precision_round(BF, (float)mm.v[e]);
        else want->v[e] = precision_round(BF, (float)gelu(precision_round(BF, (float)(mm.v[e] + precision_round(BF, (float)rx[2].v[e % N])))));
    }
    free(mm.v);
}

static void test_operations(void) {
    static const struct { const char *what; opk op; int n; inspec in[3]; } cases[] = {
        { "matmul [2,5,33] x [33,7]", MATMUL, 2, { FIN("a", -2, 2, 2, 5, 33), FIN("b", -2, 2, 33, 7) } },
        { "matmul [1,4,20] x [6,20]T", MATMUL_BT, 2, { FIN("a", -2, 2, 1, 4, 20), FIN("b", -2, 2, 6, 20) } },
        { "conv2d [2,3,5,6] * [4,3,3,3]", CONV, 2, { FIN("x", -2, 2, 2, 3, 5, 6), FIN("w", -1, 1, 4, 3, 3, 3) } },
        { "attention [2,9,8] causal", ATTENTION, 3, { FIN("q", -2, 2, 2, 9, 8), FIN("k", -2, 2, 2, 9, 8), FIN("v", -2, 2, 2, 9, 8) } },
        { "exp(x) * y", ELEMENTWISE, 2, { FIN("x", -2, 2, 3, 7), FIN("y", -2, 2, 3, 7) } },
        { "gelu([2,5,33] x [33,7] + b)", GELU_BIAS, 3, { FIN("a", -2, 2, 2, 5, 33), FIN("b", -1, 1, 33, 7), FIN("c", -1, 1, 7) } },
        { "r + [2,5,33] x [33,7]", RESIDUAL, 3, { FIN("a", -2, 2, 2, 5, 33), FIN("b", -1, 1, 33, 7), FIN("r", -2, 2, 2, 5, 7) } },
    };
    const tg_precision precisions[] = { TG_PRECISION_F32, TG_PRECISION_TF32, TG_PRECISION_BF16 };
    char what[200];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int pi = 0; pi < 3; pi++) {
            tg_precision p = precisions[pi];
            pctx c = { cases[k].op };
            tg_model *m = tg_model_new(1);
            host_case h;
            host_case_fill(&h, m, cases[k].n, cases[k].in);
            ht rx[3];
            for (int i = 0; i < cases[k].n; i++) {   /* the operands as this precision sees them */
                rx[i] = ht_new(h.x[i].s);
                memcpy(rx[i].v, h.x[i].v, sizeof(double) * (size_t)nel(h.x[i].s));
            }
            bool rounds = cases[k].op != ELEMENTWISE;
            bool linear = cases[k].op == GELU_BIAS || cases[k].op == RESIDUAL;   /* a product, then f32 x[2] */
            if (rounds) round_all(p, rx, linear ? 2 : cases[k].n);
            ht want = expect(cases[k].op, rx);
            if (p == TG_PRECISION_BF16) activations(cases[k].op, &want, rx);
            tg_error err;
            tg_probe *pr = tg_probe_new_at("reference-f64", p, m, op_fwd, &c, h.decl, cases[k].n, false, &err);
            CHECK(pr != NULL, "%s: probe: %s", cases[k].what, pr ? "" : err.msg);
            if (pr) {
                for (int i = 0; i < cases[k].n; i++) memcpy(tg_probe_input(pr, i), h.x[i].v, sizeof(double) * (size_t)nel(h.x[i].s));
                CHECK(tg_probe_run(pr), "%s: run", cases[k].what);
                double worst = 0;
                for (int64_t e = 0; e < nel(want.s); e++)
                    worst = fmax(worst, fabs(tg_probe_output(pr)[e] - want.v[e]) / fmax(1, fabs(want.v[e])));
                snprintf(what, sizeof what, "%s at %s", cases[k].what, tg_precision_name(p));
                CHECK(worst <= 1e-12, "%s: the reference differs from float64 over rounded operands by %.3g", what, worst);
                /* and the rounding matters: unrounded operands give another result */
                if (rounds && p != TG_PRECISION_F32) {
                    ht plain = expect(cases[k].op, h.x);
                    double diff = 0;
                    for (int64_t e = 0; e < nel(plain.s); e++) diff = fmax(diff, fabs(plain.v[e] - want.v[e]));
                    CHECK(diff > 1e-6, "%s: rounding changes the result (by %.3g)", what, diff);
                    free(plain.v);
                }
                tg_probe_free(pr);
            }
            for (int i = 0; i < cases[k].n; i++) free(rx[i].v);
            free(want.v);
            host_case_free(&h);
            tg_model_free(m);
        }
}

/* ----- attention's gradients at each precision against float64 ----- */

static tg_tensor attention_weighted(const void *ctx, const tg_tensor *in) {
    return tg_sum(tg_mul(tg_attention(in[0], in[1], in[2], 1, 0.4), in[3]), TG_ALL, 0);
}

/* The gradients of sum(attention(q, k, v) * w) (causal, scale 0.4, [B, T, D]) in float64, with q,
 * k, v and w (the incoming gradient) rounded, and (round_p) the backward's p and ds rounded where
 * they enter its products: g[0..2] = dq, dk, dv. At bf16 the output is a bf16 activation (the
 * backward's delta = w . out reads it rounded), and so are dk and dv. */
static void attention_grads(tg_precision prec, const ht *x, bool round_p, ht *g) {
    const int64_t B = x[0].s.d[0], T = x[0].s.d[1], D = x[0].s.d[2];
    double *p = calloc((size_t)T, sizeof(double)), *out = calloc((size_t)D, sizeof(double));
    for (int i = 0; i < 3; i++) g[i] = ht_new(x[i].s);
    for (int64_t b = 0; b < B && p && out; b++)
        for (int64_t r = 0; r < T; r++) {
            const double *q = x[0].v + (b * T + r) * D, *w = x[3].v + (b * T + r) * D;
            double mx = -INFINITY, sum = 0, delta = 0;
            for (int64_t c = 0; c <= r; c++) {
                double dot = 0;
                for (int64_t d = 0; d < D; d++) dot += q[d] * x[1].v[(b * T + c) * D + d];
                p[c] = dot * 0.4;
                mx = fmax(mx, p[c]);
            }
            for (int64_t c = 0; c <= r; c++) sum += exp(p[c] - mx);
            for (int64_t c = 0; c <= r; c++) p[c] = exp(p[c] - mx) / sum;
            for (int64_t d = 0; d < D; d++) {
                out[d] = 0;
                for (int64_t c = 0; c <= r; c++) out[d] += p[c] * x[2].v[(b * T + c) * D + d];
                delta += w[d] * (prec == TG_PRECISION_BF16 ? precision_round(prec, (float)out[d]) : out[d]);
            }
            for (int64_t c = 0; c <= r; c++) {
                const double *k = x[1].v + (b * T + c) * D, *v = x[2].v + (b * T + c) * D;
                double dp = 0;
                for (int64_t d = 0; d < D; d++) dp += w[d] * v[d];
                double ds = p[c] * (dp - delta) * 0.4, pc = p[c];
                if (round_p && prec != TG_PRECISION_F32) ds = precision_round(prec, (float)ds), pc = precision_round(prec, (float)pc);
                for (int64_t d = 0; d < D; d++) {
                    g[0].v[(b * T + r) * D + d] += ds * k[d];
                    g[1].v[(b * T + c) * D + d] += ds * q[d];
                    g[2].v[(b * T + c) * D + d] += pc * w[d];
                }
            }
        }
    for (int i = 1; i < 3 && prec == TG_PRECISION_BF16; i++)
        for (int64_t e = 0; e < nel(g[i].s); e++) g[i].v[e] = precision_round(prec, (float)g[i].v[e]);
    free(p);
    free(out);
}

/* The reference's attention gradients are float64 over the rounded operands, the backward's p and
 * ds rounded as its products' operands at tf32 and bf16 (and that rounding shows). */
static void test_attention_gradients(void) {
    inspec in[4] = { FIN("q", -2, 2, 2, 9, 8), FIN("k", -2, 2, 2, 9, 8), FIN("v", -2, 2, 2, 9, 8), FIN("w", -1, 1, 2, 9, 8) };
    const tg_precision precisions[] = { TG_PRECISION_F32, TG_PRECISION_TF32, TG_PRECISION_BF16 };
    for (int pi = 0; pi < 3; pi++) {
        tg_precision p = precisions[pi];
        tg_model *m = tg_model_new(1);
        host_case h;
        host_case_fill(&h, m, 4, in);
        ht rx[4], want[3], plain[3];
        for (int i = 0; i < 4; i++) {
            rx[i] = ht_new(h.x[i].s);
            memcpy(rx[i].v, h.x[i].v, sizeof(double) * (size_t)nel(h.x[i].s));
        }
        round_all(p, rx, 4);
        attention_grads(p, rx, true, want);
        attention_grads(p, rx, false, plain);
        tg_error err;
        tg_probe *pr = tg_probe_new_at("reference-f64", p, m, attention_weighted, NULL, h.decl, 4, true, &err);
        CHECK(pr != NULL, "attention gradients: probe: %s", pr ? "" : err.msg);
        for (int i = 0; pr && i < 4; i++) memcpy(tg_probe_input(pr, i), h.x[i].v, sizeof(double) * (size_t)nel(h.x[i].s));
        CHECK(pr && tg_probe_run(pr), "attention gradients: run");
        for (int i = 0; pr && i < 3; i++) {
            double worst = 0, diff = 0;
            for (int64_t e = 0; e < nel(want[i].s); e++) {
                worst = fmax(worst, fabs(tg_probe_input_grad(pr, i)[e] - want[i].v[e]) / fmax(1, fabs(want[i].v[e])));
                diff = fmax(diff, fabs(plain[i].v[e] - want[i].v[e]));
            }
            CHECK(worst <= 1e-12, "attention's gradient of input %d at %s: the reference differs from float64 by %.3g", i,
                  tg_precision_name(p), worst);
            if (p != TG_PRECISION_F32)
                CHECK(diff > 1e-6, "attention's gradient of input %d at %s: rounding p and ds changes it by %.3g", i,
                      tg_precision_name(p), diff);
        }
        tg_probe_free(pr);
        for (int i = 0; i < 4; i++) free(rx[i].v);
        for (int i = 0; i < 3; i++) free(want[i].v), free(plain[i].v);
        host_case_free(&h);
        tg_model_free(m);
    }
}

/* ----- the CPU's floating-point mode ----- */

#if defined(__x86_64__) && defined(__SSE__)
#include <xmmintrin.h>
#define FLUSHES 1
#define FP_MODE() _mm_getcsr()
#define FP_SET(m) _mm_setcsr(m)
#else
#define FLUSHES 0
#define FP_MODE() 0u
#define FP_SET(m) ((void)(m))
#endif

/* The cpu backend's kernels flush denormal results to zero on x86 (cpu.h: fp_flush_denormals),
 * and the calling thread's mode comes back as it was, flushing or not. exp(-50) * 1e-18 is a
 * denormal float (1.9e-40), exp(-50) * 1e-10 a normal one. */
static void test_denormals(void) {
    pctx c = { ELEMENTWISE };
    inspec in[2] = { FIN("x", -2, 2, 3, 7), FIN("y", -2, 2, 3, 7) };
    tg_model *m = tg_model_new(1);
    host_case h;
    host_case_fill(&h, m, 2, in);
    tg_error err;
    tg_probe *pr = tg_probe_new_at("cpu", TG_PRECISION_F32, m, op_fwd, &c, h.decl, 2, false, &err);
    CHECK(pr != NULL, "denormals: cpu probe: %s", pr ? "" : err.msg);
    if (pr) {
        const unsigned caller = FP_MODE();
        for (int flushing = 0; flushing < 2; flushing++) {
            const unsigned mode = flushing ? caller | 0x8040u : caller & ~0x8040u;
            for (int i = 0; i < 2; i++) memcpy(tg_probe_input(pr, i), h.x[i].v, sizeof(double) * 21);
            tg_probe_input(pr, 0)[0] = tg_probe_input(pr, 0)[1] = -50;
            tg_probe_input(pr, 1)[0] = 1e-18;
            tg_probe_input(pr, 1)[1] = 1e-10;
            FP_SET(mode);
            bool ran = tg_probe_run(pr);
            const unsigned after = FP_MODE();
            FP_SET(caller);
            CHECK(ran, "denormals: run");
            CHECK(after == mode, "denormals: the caller's floating-point mode %#x came back as %#x", mode, after);
            const double *out = tg_probe_output(pr), tiny = (double)(expf(-50) * 1e-18f);
            CHECK(tiny != 0 && tiny < 1.17549435e-38, "denormals: the case makes a denormal (%g)", tiny);
            CHECK(FLUSHES ? out[0] == 0 : fabs(out[0] - tiny) <= 1e-45, "denormals: %g where %s", out[0],
                  FLUSHES ? "the kernel flushes to zero" : "IEEE keeps the denormal");
            CHECK(fabs(out[1] - exp(-50) * 1e-10) <= 1e-6 * exp(-50) * 1e-10, "denormals: a normal result kept (%g)", out[1]);
        }
        tg_probe_free(pr);
    }
    host_case_free(&h);
    tg_model_free(m);
}

/* ----- the settings through the API ----- */

static tg_linear lin;
static tg_tensor mlp_loss(const void *ctx, const tg_tensor *in) { return tg_mean(tg_square(tg_linear(&lin, in[0])), TG_ALL, 0); }
static tg_tensor mlp_out(const void *ctx, const tg_tensor *in) { return tg_linear(&lin, in[0]); }

static tg_train *compile_at(tg_model *m, const char *backend, tg_precision p, tg_error *err) {
    return tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .inputs = (tg_input_decl[]){ TG_F32("x", 4, 6) },
                                        .n_inputs = 1, .optimizer = tg_adam(1e-2), .backend = backend, .precision = p }, err);
}

static void test_api(void) {
    tg_model *m = tg_model_new(3);
    lin = tg_linear_new(m, "l", 6, 5, NULL);
    tg_error err;
    float x[24];
    check_rng = 5;
    for (int i = 0; i < 24; i++) x[i] = (float)check_uniform(-1, 1);
    tg_data in[1] = { tg_f32("x", x, 24) };

    tg_train *ref = compile_at(m, "reference", TG_PRECISION_BF16, &err);
    tg_train *cpu = compile_at(m, "cpu", TG_PRECISION_BF16, &err);
    tg_train *f32 = compile_at(m, "reference", TG_PRECISION_DEFAULT, &err);
    CHECK(ref && cpu && f32, "compile: %s", err.msg);
    if (!ref || !cpu || !f32) return;
    CHECK(tg_train_precision(ref) == TG_PRECISION_BF16, "the reference runs bf16 as asked");
    bool cpu_bf16 = cpu_isa_bf16(cpu_isa_choose());
    CHECK(tg_train_precision(cpu) == (cpu_bf16 ? TG_PRECISION_BF16 : TG_PRECISION_F32),
          "the cpu backend says it runs %s when asked for bf16 (this CPU %s AVX512-BF16)", cpu_bf16 ? "bf16" : "f32",
          cpu_bf16 ? "has" : "lacks");
    CHECK(tg_train_precision(f32) == TG_PRECISION_F32, "the default is f32");
    CHECK(!strcmp(tg_precision_name(TG_PRECISION_BF16), "bf16") && !strcmp(tg_precision_name(TG_PRECISION_TF32), "tf32"), "names");

    /* a forward inherits the handle's precision unless it names one */
    tg_forward *fb = tg_attach(ref, &(tg_forward_spec){ .forward = mlp_out, .inputs = (tg_input_decl[]){ TG_F32("x", 4, 6) },
                                                        .n_inputs = 1 }, &err);
    tg_forward *ff = tg_attach(ref, &(tg_forward_spec){ .forward = mlp_out, .inputs = (tg_input_decl[]){ TG_F32("x", 4, 6) },
                                                        .n_inputs = 1, .precision = TG_PRECISION_F32 }, &err);
    CHECK(fb && ff, "attach: %s", err.msg);
    if (fb && ff) {
        tg_result a = tg_run(fb, in, 1);
        float out_b[20];
        memcpy(out_b, a.output, sizeof out_b);
        tg_result b = tg_run(ff, in, 1);
        double diff = 0;
        for (int i = 0; i < 20; i++) diff = fmax(diff, fabs(out_b[i] - b.output[i]));
        CHECK(a.status == TG_OK && b.status == TG_OK && diff > 1e-5 && diff < 0.05,
              "the inherited bf16 forward and an f32 one differ by bf16 rounding (%.3g)", diff);
    }

    /* unknown values are refused, with the valid names */
    tg_train *bad = compile_at(m, "reference", (tg_precision)7, &err);
    CHECK(!bad && strstr(err.msg, "unknown precision 7") && strstr(err.msg, "BF16"), "unknown precision: %s", err.msg);
    tg_forward *badf = tg_attach(ref, &(tg_forward_spec){ .forward = mlp_out, .inputs = (tg_input_decl[]){ TG_F32("x", 4, 6) },
                                                          .n_inputs = 1, .precision = (tg_precision)-2 }, &err);
    CHECK(!badf && strstr(err.msg, "unknown precision"), "unknown forward precision: %s", err.msg);

    /* checkpoints are f32 and move between precisions: bf16 state saved, f32 handle resumes */
    for (int s = 0; s < 3; s++) CHECK(tg_step(ref, in, 1).status == TG_OK, "bf16 step");
    CHECK(tg_save(ref, "/tmp/tg_test_precision.safetensors", 1, &err) == TG_OK, "save: %s", err.msg);
    CHECK(tg_load(f32, "/tmp/tg_test_precision.safetensors", 1, &err) == TG_OK, "load into f32: %s", err.msg);
    float wa[30], wb[30];
    CHECK(tg_download_param(ref, "l.W", wa, 30, &err) == TG_OK && tg_download_param(f32, "l.W", wb, 30, &err) == TG_OK,
          "download");
    CHECK(memcmp(wa, wb, sizeof wa) == 0 && tg_train_step_count(f32) == 3, "the f32 handle has the bf16 handle's state");
    remove("/tmp/tg_test_precision.safetensors");
    tg_destroy(ref);
    tg_destroy(cpu);
    tg_destroy(f32);
    tg_model_free(m);
}

/* ----- training quality, short form ----- */

static double final_loss(void) {
    double loss = -1, l;
    int e, n;
    for (const char *line = example_output; line && *line; line = next_line(line))
        if (sscanf(line, "epoch %d/%d loss %lf", &e, &n, &l) == 3) loss = l;
    return loss;
}

static double accuracy(void) {
    const char *s = strstr(example_output, "test accuracy ");
    double acc = -1;
    if (s) sscanf(s, "test accuracy %lf%%", &acc);
    return acc;
}

/* The digits MLP trained 8 epochs in f32 and in bf16 on a backend: the reference (everywhere), and
 * the cpu backend where its products run bf16 (AVX512-BF16). */
static void test_quality(const char *backend) {
    char args[200];
    snprintf(args, sizeof args, "--epochs 8 --backend %s --precision f32", backend);
    int rc = run_example("digits", args);
    double loss32 = final_loss(), acc32 = accuracy();
    CHECK(rc == 0 && loss32 > 0, "digits f32 on %s: exit %d\n%s", backend, rc, example_output);
    snprintf(args, sizeof args, "--epochs 8 --backend %s --precision bf16", backend);
    rc = run_example("digits", args);
    double loss16 = final_loss(), acc16 = accuracy();
    CHECK(rc == 0 && loss16 > 0 && strstr(example_output, "bf16"), "digits bf16 on %s: exit %d\n%s", backend, rc,
          example_output);
    printf("test_precision: digits MLP, 8 epochs on %s: loss %.4f (f32) vs %.4f (bf16), accuracy %.2f%% vs %.2f%%\n",
           backend, loss32, loss16, acc32, acc16);
    CHECK(fabs(loss16 - loss32) <= 0.05 * loss32, "%s: bf16 loss %.4f within 5%% of f32's %.4f", backend, loss16, loss32);
    CHECK(fabs(acc16 - acc32) <= 1.5, "%s: bf16 accuracy %.2f%% within 1.5 points of f32's %.2f%%", backend, acc16, acc32);
}

/* The last "held-out X" chargpt printed. */
static double final_heldout(void) {
    double h = -1;
    for (const char *p = strstr(example_output, "held-out "); p; p = strstr(p + 1, "held-out ")) sscanf(p, "held-out %lf", &h);
    return h;
}

/* At length on a backend with bf16 hardware: the digits CNN in bf16 within half a point of f32's
 * accuracy (the cpu backend where it has AVX512-BF16, in a second; cuda where a GPU is:
 * tests/run_gpu.sh), and on cuda, given a text in $TG_TEST_CORPUS, chargpt's held-out loss after
 * 2000 steps in bf16 within 2% of f32's. */
static void test_quality_long(const char *backend) {
    char args[600];
    double acc[2], held[2] = { -1, -1 };
    const char *corpus = strcmp(backend, "cuda") == 0 ? getenv("TG_TEST_CORPUS") : NULL;
    for (int k = 0; k < 2; k++) {
        const char *p = k ? "bf16" : "f32";
        snprintf(args, sizeof args, "--cnn --epochs 30 --backend %s --precision %s", backend, p);
        int rc = run_example("digits", args);
        acc[k] = accuracy();
        CHECK(rc == 0 && acc[k] > 0, "digits %s: exit %d\n%s", args, rc, example_output);
        if (!corpus) continue;
        snprintf(args, sizeof args, "'%s' --steps 2000 --sample-every 0 --sample-len 0 --backend cuda --precision %s", corpus, p);
        rc = run_example("chargpt", args);
        held[k] = final_heldout();
        CHECK(rc == 0 && held[k] > 0, "chargpt %s: exit %d\n%s", args, rc, example_output);
    }
    printf("test_precision: %s: digits CNN accuracy %.2f%% (f32) vs %.2f%% (bf16)", backend, acc[0], acc[1]);
    if (corpus) printf("; chargpt held-out after 2000 steps %.4f vs %.4f", held[0], held[1]);
    printf("\n");
    CHECK(fabs(acc[1] - acc[0]) <= 0.5, "%s: digits CNN bf16 accuracy %.2f%% within 0.5 points of f32's %.2f%%", backend,
          acc[1], acc[0]);
    CHECK(!corpus || fabs(held[1] - held[0]) <= 0.02 * held[0], "chargpt: bf16 held-out %.4f within 2%% of f32's %.4f",
          held[1], held[0]);
}

int main(int argc, char **argv) {
    example_dir_init(argv[0]);
    test_rounding();
    test_operations();
    test_attention_gradients();
    test_denormals();
    test_api();
    test_quality("reference");
    if (cpu_isa_bf16(cpu_isa_choose())) {
        test_quality("cpu");
        test_quality_long("cpu");
    }
    char why[256];
    if (tg_backend_available("cuda", why, sizeof why)) test_quality_long("cuda");
    return check_report("test_precision");
}
