/* Fused attention (tg_attention and the written-out form it is recognised in):
 *  - forward against float64 loops written here (scores, masked softmax, weighted sum), in
 *    double and emulated f32 on the reference interpreter;
 *  - gradients with respect to q, k and v against central finite differences (reference, f64);
 *  - recognition: softmax(q @ kᵀ * c) @ v written out with softmax_causal or softmax(-1), the
 *    number multiplied on either side, divided or absent, becomes one attention node and gives
 *    the written-out values (reference and CPU); forms it must not take stay as written;
 *  - schedules: a forward never computes the row statistics only the gradient reads, and a
 *    training step plans no [T, S] scores;
 *  - shape, dtype and scale errors name the caller's line.
 * test_backend compares every backend with the reference on more shapes. */
#include "internal.h"
#include "check.h"
#include "probe_util.h"

#include <stdlib.h>
#include <string.h>

/* ----- the float64 reference ----- */

/* out [.., T, E] of q [.., T, D], k [.., S, D], v [.., S, E]: for each row the scores
 * q_r . k_c * scale over the kept columns (c <= r when causal), their softmax, the weighted sum. */
static ht attention_f64(ht q, ht k, ht v, bool causal, double scale) {
    int nd = q.s.ndim;
    int64_t T = q.s.d[nd - 2], D = q.s.d[nd - 1], S = k.s.d[nd - 2], E = v.s.d[nd - 1], B = nel(q.s) / (T * D);
    tg_shape os = q.s;
    os.d[nd - 1] = E;
    ht out = ht_new(os);
    double *s = calloc((size_t)S + 1, sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < T; r++) {
            int64_t kept = causal && r + 1 < S ? r + 1 : S;
            double mx = -INFINITY, sum = 0;
            for (int64_t c = 0; c < kept; c++) {
                s[c] = 0;
                for (int64_t d = 0; d < D; d++) s[c] += q.v[(b * T + r) * D + d] * k.v[(b * S + c) * D + d];
                s[c] *= scale;
                if (s[c] > mx) mx = s[c];
            }
            for (int64_t c = 0; c < kept; c++) sum += (s[c] = exp(s[c] - mx));
            for (int64_t e = 0; e < E; e++) {
                double acc = 0;
                for (int64_t c = 0; c < kept; c++) acc += s[c] / sum * v.v[(b * S + c) * E + e];
                out.v[(b * T + r) * E + e] = acc;
            }
        }
    free(s);
    return out;
}

/* ----- forwards under test ----- */

typedef enum {
    FUSED,          /* tg_attention */
    WRITTEN,        /* softmax(q @ swapaxes(k) * c) @ v */
    WRITTEN_LEFT,   /* c * (q @ kᵀ) */
    WRITTEN_DIV,    /* (q @ kᵀ) / (1 / c) */
    WRITTEN_NONE,   /* no scale (c = 1) */
    BROADCAST_K,    /* k without the batch dims: not attention's shapes */
    TENSOR_SCALE,   /* the scale a tensor, not a number */
    SOFTMAX_AXIS0,  /* a softmax over another axis */
} form;

typedef struct { form f; bool causal; double scale; } actx;

static tg_tensor softmax_of(const actx *a, tg_tensor x) { return a->causal ? tg_softmax_causal(x) : tg_softmax(x, -1); }

static tg_tensor attn_fwd(const void *vc, const tg_tensor *in) {
    const actx *a = vc;
    tg_tensor q = in[0], k = in[1], v = in[2];
    tg_tensor s = tg_matmul(q, tg_swapaxes(k, -1, -2));
    switch (a->f) {
    case FUSED: return tg_attention(q, k, v, a->causal, a->scale);
    case WRITTEN: return tg_matmul(softmax_of(a, tg_mul(s, a->scale)), v);
    case WRITTEN_LEFT: return tg_matmul(softmax_of(a, tg_mul(a->scale, s)), v);
    case WRITTEN_DIV: return tg_matmul(softmax_of(a, tg_div(s, 1.0 / a->scale)), v);
    case WRITTEN_NONE: return tg_matmul(softmax_of(a, s), v);
    case BROADCAST_K: return tg_matmul(softmax_of(a, tg_mul(tg_matmul(q, tg_swapaxes(tg_sum(k, 0, 0), -1, -2)), a->scale)), v);
    case TENSOR_SCALE: return tg_matmul(softmax_of(a, tg_mul(s, tg_exp(tg_mul(tg_sum(q, TG_ALL, 0), 0.0)))), v);
    case SOFTMAX_AXIS0: return tg_matmul(tg_softmax(tg_mul(s, a->scale), 0), v);
    }
    return q;
}

static const char *const FORM_NAME[] = { "tg_attention", "written", "written, number on the left", "written, divided",
                                         "written, no scale", "k broadcast", "tensor scale", "softmax over axis 0" };

typedef struct { const char *what; inspec in[3]; bool causal; } shape_case;

static const shape_case SHAPES[] = {
    { "[2,2,5,4] causal", { FIN("q", -1, 1, 2, 2, 5, 4), FIN("k", -1, 1, 2, 2, 5, 4), FIN("v", -1, 1, 2, 2, 5, 4) }, true },
    { "[3,7,6] x [3,4,6] x [3,4,5]", { FIN("q", -1, 1, 3, 7, 6), FIN("k", -1, 1, 3, 4, 6), FIN("v", -1, 1, 3, 4, 5) }, false },
    { "[1,3] one row causal", { FIN("q", -1, 1, 1, 3), FIN("k", -1, 1, 1, 3), FIN("v", -1, 1, 1, 2) }, true },
    { "[2,6,3] x [2,4,3] causal, T > S", { FIN("q", -1, 1, 2, 6, 3), FIN("k", -1, 1, 2, 4, 3), FIN("v", -1, 1, 2, 4, 2) }, true },
};
#define N_SHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static int count_op(const tg_graph *g, const char *op) {
    int n = 0;
    for (int i = 0; i < tg_graph_n_nodes(g); i++) n += strcmp(tg_graph_node(g, i).op, op) == 0;
    return n;
}

/* ----- forward values ----- */

static void test_forward(void) {
    char what[200];
    for (int k = 0; k < N_SHAPES; k++) {
        actx a = { FUSED, SHAPES[k].causal, 0.7 };
        tg_model *m = tg_model_new(1);
        host_case h;
        host_case_fill(&h, m, 3, SHAPES[k].in);
        ht want = attention_f64(h.x[0], h.x[1], h.x[2], a.causal, a.scale);
        snprintf(what, sizeof what, "tg_attention %s", SHAPES[k].what);
        probe_compare_forward(what, m, attn_fwd, &a, &h, want, TG_FLOAT32, 0, 1e-12, 2e-6);
        free(want.v);
        host_case_free(&h);
        tg_model_free(m);
    }
}

/* ----- gradients ----- */

static tg_tensor self_attention(const void *vc, const tg_tensor *in) { return tg_attention(in[0], in[0], in[0], 1, 0.5); }
static tg_tensor merged_attention(const void *vc, const tg_tensor *in) {
    return tg_merge_heads(tg_attention(in[0], in[1], in[2], 1, 0.5));
}

/* Heads split from [B, T, H * D] rows and merged back, as a model does (tg_split_heads,
 * tg_merge_heads): attention reads the rows where they are (heads interleaved, graph.h's
 * iarg[3]) and writes its output merged. */
static tg_tensor split_attention(const void *vc, const tg_tensor *in) {
    return tg_merge_heads(tg_attention(tg_split_heads(in[0], 3), tg_split_heads(in[1], 3), tg_split_heads(in[2], 3), 1, 0.5));
}

/* The graph of probe p (forward and gradients): attention and its gradients read no permute, the
 * gradients read the output from the attention node itself, and no node reads a permute (the
 * splits of heads are left unread). */
static void check_interleaved(tg_probe *p) {
    const tg_graph *g = p ? tg_probe_graph(p) : NULL;
    int attn = -1, bwd = 0, from_attn = 0, read_permutes = 0, attn_permutes = 0;
    for (int i = 0; g && i < tg_graph_n_nodes(g); i++) {
        tg_node_info x = tg_graph_node(g, i);
        bool is_attn = strcmp(x.op, "attention") == 0, is_bwd = strcmp(x.op, "attention_backward") == 0;
        if (is_attn) attn = i;
        for (int k = 0; k < x.n_inputs; k++) {
            bool permute = strcmp(tg_graph_node(g, x.inputs[k]).op, "permute") == 0;
            read_permutes += permute;
            attn_permutes += permute && (is_attn || is_bwd);
        }
        bwd += is_bwd;
        from_attn += is_bwd && x.inputs[3] == attn;
    }
    CHECK(g && attn >= 0 && attn_permutes == 0 && bwd == 3 && from_attn == 3,
          "split heads: attention and its %d gradients read %d permutes (want 0), the gradients the output itself (%d of 3)",
          bwd, attn_permutes, from_attn);
    CHECK(g && read_permutes == 0, "split heads: no node reads a permute (%d do)", read_permutes);
}

static void test_gradients(void) {
    char what[200];
    for (int k = 0; k < N_SHAPES; k++) {
        actx a = { FUSED, SHAPES[k].causal, 0.9 };
        snprintf(what, sizeof what, "tg_attention %s", SHAPES[k].what);
        op_gradcheck(what, attn_fwd, &a, NULL, 3, SHAPES[k].in, 0, false);
    }
    /* self-attention: q, k and v one tensor, so its gradient is the sum of all three */
    inspec x = FIN("x", -1, 1, 2, 5, 3);
    op_gradcheck("tg_attention(x, x, x) causal", self_attention, NULL, NULL, 1, &x, 0, false);
    /* heads merged after attention, as a model does: the gradients read the output from the
     * merged copy [B, T, H, E] (ATTENTION_BWD's iarg[2]), so the output's own buffer need not
     * live until the backward */
    inspec qkv[3] = { FIN("q", -1, 1, 2, 3, 5, 4), FIN("k", -1, 1, 2, 3, 5, 4), FIN("v", -1, 1, 2, 3, 5, 6) };
    tg_probe *p = op_gradcheck("tg_merge_heads(tg_attention) causal", merged_attention, NULL, NULL, 3, qkv, 0, true);
    const tg_graph *g = p ? tg_probe_graph(p) : NULL;
    int bwd = 0, from_merged = 0;
    for (int i = 0; g && i < tg_graph_n_nodes(g); i++) {
        tg_node_info n = tg_graph_node(g, i);
        if (strcmp(n.op, "attention_backward") != 0) continue;
        bwd++;
        from_merged += strcmp(tg_graph_node(g, n.inputs[3]).op, "permute") == 0;
    }
    CHECK(bwd == 3 && from_merged == 3, "%d of %d attention gradients read the output from the merged heads, want 3 of 3",
          from_merged, bwd);
    tg_probe_free(p);
    inspec rows[3] = { FIN("q", -1, 1, 2, 5, 12), FIN("k", -1, 1, 2, 5, 12), FIN("v", -1, 1, 2, 5, 6) };
    p = op_gradcheck("tg_merge_heads(tg_attention(tg_split_heads)) causal", split_attention, NULL, NULL, 3, rows, 0, true);
    check_interleaved(p);
    tg_probe_free(p);
}

/* ----- recognition of the written-out form ----- */

/* Runs fn on backend with the same random inputs each time; the output copied (caller frees),
 * NULL on failure; *n_attention: the graph's attention nodes. */
static double *run_on(const char *backend, tg_forward_fn fn, const actx *a, const inspec *ins, int *n_attention) {
    tg_model *m = tg_model_new(1);
    tg_input_decl d[3] = { ins[0].d, ins[1].d, ins[2].d };
    tg_error err;
    tg_probe *p = tg_probe_new_on(backend, m, fn, a, d, 3, false, &err);
    CHECK(p != NULL, "%s on %s: %s", FORM_NAME[a->f], backend, p ? "" : err.msg);
    double *out = NULL;
    if (p) {
        check_rng = 42;
        for (int i = 0; i < 3; i++) fill(&ins[i], tg_probe_input(p, i), nel(ins[i].d.shape));
        CHECK(tg_probe_run(p), "%s on %s: run", FORM_NAME[a->f], backend);
        int64_t n = nel(tg_probe_output_shape(p));
        out = malloc(sizeof(double) * (size_t)n);
        memcpy(out, tg_probe_output(p), sizeof(double) * (size_t)n);
        *n_attention = count_op(tg_probe_graph(p), "attention");
        tg_probe_free(p);
    }
    tg_model_free(m);
    return out;
}

static void test_recognition(void) {
    const shape_case *sc = &SHAPES[0];
    int64_t n = 2 * 2 * 5 * 4;
    const char *backends[] = { "reference", "cpu", "cuda" };   /* cuda where there is a GPU (tests/run_gpu.sh) */
    int n_backends = tg_backend_available("cuda", NULL, 0) ? 3 : 2;
    for (int b = 0; b < n_backends; b++)
        for (int causal = 0; causal < 2; causal++) {
            actx fused = { FUSED, causal, 0.6 };
            int n_att = 0;
            double *want = run_on(backends[b], attn_fwd, &fused, sc->in, &n_att);
            CHECK(n_att == 1, "tg_attention is one attention node (%d)", n_att);
            for (form f = WRITTEN; f <= SOFTMAX_AXIS0; f++) {
                actx a = { f, causal, f == WRITTEN_NONE ? 1.0 : 0.6 };
                double *got = run_on(backends[b], attn_fwd, &a, sc->in, &n_att);
                bool taken = f <= WRITTEN_NONE;
                CHECK(n_att == (taken ? 1 : 0), "%s %s on %s: %d attention nodes, want %d", FORM_NAME[f],
                      causal ? "causal" : "", backends[b], n_att, taken ? 1 : 0);
                if (f == WRITTEN_NONE) {   /* same values as tg_attention with scale 1 */
                    actx one = { FUSED, causal, 1.0 };
                    free(want);
                    want = run_on(backends[b], attn_fwd, &one, sc->in, &n_att);
                }
                double worst = 0;
                for (int64_t i = 0; taken && got && want && i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]));
                CHECK(!taken || (got && worst <= 1e-6), "%s on %s: written-out and fused differ by %.3g", FORM_NAME[f],
                      backends[b], worst);
                free(got);
            }
            free(want);
        }
    /* TG_NO_FUSE keeps the written-out form as written, with the same values. */
    actx a = { WRITTEN, true, 0.6 }, fused = { FUSED, true, 0.6 };
    int n_att = 0;
    setenv("TG_NO_FUSE", "1", 1);
    double *plain = run_on("reference", attn_fwd, &a, sc->in, &n_att);
    unsetenv("TG_NO_FUSE");
    CHECK(n_att == 0, "TG_NO_FUSE=1: no attention node (%d)", n_att);
    double *f = run_on("reference", attn_fwd, &fused, sc->in, &n_att);
    double worst = 0;
    for (int64_t i = 0; plain && f && i < n; i++) worst = fmax(worst, fabs(plain[i] - f[i]));
    CHECK(plain && f && worst <= 1e-6, "written-out (not fused) and fused agree: %.3g", worst);
    free(plain);
    free(f);
}

/* ----- schedules: no row statistics in a forward, no [T, S] scores in a step ----- */

typedef struct { tg_linear qkv; int heads; } tiny_gpt;

static tg_tensor gpt_logits(const void *vc, const tg_tensor *in) {
    const tiny_gpt *g = vc;
    tg_tensor x = in[0];   /* [B, T, 16] */
    tg_tensor q = tg_split_heads(tg_linear(&g->qkv, x), g->heads);
    tg_tensor att = tg_softmax_causal(tg_mul(tg_matmul(q, tg_swapaxes(q, -1, -2)), 0.25));
    return tg_merge_heads(tg_matmul(att, q));
}

static tg_tensor gpt_loss(const void *vc, const tg_tensor *in) { return tg_mean(tg_square(gpt_logits(vc, in)), TG_ALL, 0); }

static int count_str(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = s ? strstr(s, sub) : NULL; p; p = strstr(p + 1, sub)) n++;
    return n;
}

static void test_schedules(void) {
    enum { B = 2, T = 512, C = 16 };
    tg_model *m = tg_model_new(5);
    tiny_gpt g = { tg_linear_new(m, "qkv", C, C, NULL), 2 };
    tg_error err;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = gpt_loss, .ctx = &g,
                                               .inputs = (tg_input_decl[]){ TG_F32("x", B, T, C) }, .n_inputs = 1,
                                               .optimizer = tg_adam(1e-3), .backend = "cpu" }, &err);
    CHECK(t != NULL, "compile: %s", t ? "" : err.msg);
    if (!t) { tg_model_free(m); return; }
    size_t scores = (size_t)B * 2 * T * T * sizeof(float);
    CHECK(tg_train_planned_bytes(t) < scores, "a training step plans %zu bytes, less than one [B, H, T, T] (%zu)",
          tg_train_planned_bytes(t), scores);
    const char *src = tg_train_kernel_source(t);
    CHECK(count_str(src, "R[TGK_ATTENTION]") == 1 && count_str(src, "R[TGK_ATTENTION_BWD]") == 1,
          "the step calls the fused forward (with its row statistics) and backward once each");
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = gpt_logits, .ctx = &g,
                                                     .inputs = (tg_input_decl[]){ TG_F32("x", 1, T, C) }, .n_inputs = 1 }, &err);
    CHECK(f != NULL, "attach: %s", f ? "" : err.msg);
    const char *fsrc = f ? tg_forward_kernel_source(f) : NULL;
    CHECK(count_str(fsrc, "R[TGK_ATTENTION]") == 1 && count_str(fsrc, "(void *)0 };\n    ((tgk_fn)R[TGK_ATTENTION])") == 1,
          "a forward computes attention without the row statistics only a gradient reads");
    float *x = malloc(sizeof(float) * B * T * C);
    check_rng = 3;
    for (int i = 0; i < B * T * C; i++) x[i] = (float)check_uniform(-1, 1);
    tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, B * T * C) }, 1);
    CHECK(r.status == TG_OK && isfinite(r.loss), "a step: %s", r.error);
    free(x);
    tg_destroy(t);
    tg_model_free(m);
}

/* ----- errors ----- */

static int err_line;
static tg_tensor bad_fwd(const void *vc, const tg_tensor *in) {
    int which = *(const int *)vc;
    tg_tensor q = in[0], k = in[1], v = in[2];
    err_line = __LINE__ + 2;
    switch (which) {
    case 0: return tg_attention(q, tg_narrow(k, -1, 0, 3), v, 1, 1.0);        /* D differs */
    case 1: return tg_attention(q, k, tg_narrow(v, -2, 0, 2), 0, 1.0);        /* S differs */
    case 2: return tg_attention(q, tg_reshape(k, 10, 4), v, 0, 1.0);          /* rank differs */
    case 3: return tg_attention(q, k, v, 0, INFINITY);                         /* scale not finite */
    case 4: return tg_attention(tg_argmax(q, -1), k, v, 0, 1.0);              /* i32 operand */
    default: return tg_attention(tg_narrow(q, 0, 0, 1), k, v, 0, 1.0);      /* batch dims differ */
    }
}

static void test_errors(void) {
    static const char *const want[] = { "same last dimension", "same number of rows", "same rank", "not finite",
                                        "needs an f32 tensor", "same leading dimensions" };
    tg_input_decl d[3] = { TG_F32("q", 2, 5, 4), TG_F32("k", 2, 5, 4), TG_F32("v", 2, 5, 4) };
    for (int w = 0; w < 6; w++) {
        tg_model *m = tg_model_new(1);
        tg_error err = { "" };
        tg_probe *p = tg_probe_new(m, bad_fwd, &w, d, 3, false, true, &err);
        char line[32];
        snprintf(line, sizeof line, "test_attention.c:%d:", err_line + w);
        CHECK(p == NULL && strstr(err.msg, want[w]) && strstr(err.msg, line) && strstr(err.msg, "tg_attention"),
              "error %d names the line and the problem: %s", w, err.msg);
        if (p) tg_probe_free(p);
        tg_model_free(m);
    }
}

int main(void) {
    test_forward();
    test_gradients();
    test_recognition();
    test_schedules();
    test_errors();
    printf("test_attention: %d probes, %lld gradient elements by finite differences; worst rel err %.3g (%s)\n",
           fd_stats.cases, (long long)fd_stats.elements, fd_stats.worst_err, fd_stats.worst_what);
    return check_report("test_attention");
}
