/* Runtime behaviour: seeded init, parameter upload/download, gradients, held-out evaluation,
 * attached forwards that share parameters, scoped names, graph inspection and a small MLP that
 * learns a synthetic task.
 *
 * Tolerances: the runtime computes in f32 (each op result rounded to float), so values that the
 * host computes in double from the same inputs agree to a few roundings, 2^-24 relative each, of
 * the magnitudes involved; comparisons are at 1e-6 relative to those magnitudes. */
#include "tensorgrad.h"
#include "check.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int near(double a, double b, double scale, double tol) {
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    if (scale > m) m = scale;
    return fabs(a - b) <= tol * m;
}
#define CHECK_NEAR(a, b, scale, tol, ...) CHECK(near((a), (b), (scale), (tol)), __VA_ARGS__)

static tg_error err;

static tg_status download(tg_train *t, const char *name, float *dst, size_t n) {
    err.msg[0] = 0;
    tg_status st = tg_download_param(t, name, dst, n, &err);
    CHECK(st == TG_OK, "download %s: %s", name, err.msg);
    return st;
}

/* ---------------------------------------------------------------------------------------------
 * Seeded initialisation
 * ------------------------------------------------------------------------------------------- */
#define NA 20000
static const float LIT6[6] = { 0.5f, -1.25f, 3.0f, 0.0f, -7.5f, 1e-3f };

typedef struct { tg_param p[16]; int n; } plist;

/* loss = x * sum_k mean(p_k^2): every parameter is used (and so lives in the handle). */
static tg_tensor all_params_loss(const void *ctx, const tg_tensor *in) {
    const plist *pl = ctx;
    tg_tensor acc = tg_mean(tg_square(tg_p(pl->p[0])), TG_ALL, 0);
    for (int k = 1; k < pl->n; k++) acc = tg_add(acc, tg_mean(tg_square(tg_p(pl->p[k])), TG_ALL, 0));
    return tg_sum(tg_mul(in[0], acc), TG_ALL, 0);
}

static tg_train *compile_all(tg_model *m, plist *pl) {
    const tg_input_decl x1[] = { TG_F32("x", 1) };
    err.msg[0] = 0;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = all_params_loss, .ctx = pl, .inputs = x1, .n_inputs = 1,
                                              .optimizer = tg_sgd(0.1, 0, 0, 0) }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    return t;
}

static const struct { const char *name; int64_t d0, d1; tg_init_kind kind; double scale; } INIT_TABLE[] = {
    { "a", NA, 0, TG_INIT_RANDN, 0.5 },
    { "a2", NA, 0, TG_INIT_RANDN, 0.5 },          /* same init as "a": still its own values */
    { "c", NA, 0, TG_INIT_RANDN, 0 },             /* default std 0.02 */
    { "k", 400, 50, TG_INIT_KAIMING, 0 },         /* default gain sqrt(2), fan_in 400 */
    { "k1", 256, 80, TG_INIT_KAIMING, 1.0 },      /* gain 1, fan_in 256 */
    { "z", 7, 0, TG_INIT_ZEROS, 0 },
    { "o", 7, 0, TG_INIT_ONES, 0 },
    { "l", 6, 0, TG_INIT_LITERAL, 0 },
};
#define N_INIT (int)(sizeof INIT_TABLE / sizeof INIT_TABLE[0])

static double init_std(int i) {
    switch (INIT_TABLE[i].kind) {
    case TG_INIT_RANDN: return INIT_TABLE[i].scale > 0 ? INIT_TABLE[i].scale : 0.02;
    case TG_INIT_KAIMING: return (INIT_TABLE[i].scale > 0 ? INIT_TABLE[i].scale : sqrt(2.0)) / sqrt((double)INIT_TABLE[i].d0);
    default: return 0;
    }
}

static size_t init_numel(int i) { return (size_t)(INIT_TABLE[i].d0 * (INIT_TABLE[i].d1 ? INIT_TABLE[i].d1 : 1)); }

static tg_model *init_model(uint64_t seed, plist *pl) {
    tg_model *m = tg_model_new(seed);
    pl->n = N_INIT;
    for (int i = 0; i < N_INIT; i++) {
        tg_shape s = INIT_TABLE[i].d1 ? TG_SHAPE(INIT_TABLE[i].d0, INIT_TABLE[i].d1) : TG_SHAPE(INIT_TABLE[i].d0);
        tg_init init;
        switch (INIT_TABLE[i].kind) {
        case TG_INIT_RANDN: init = tg_init_randn(INIT_TABLE[i].scale); break;
        case TG_INIT_KAIMING: init = tg_init_kaiming(INIT_TABLE[i].scale); break;
        case TG_INIT_ZEROS: init = tg_init_zeros(); break;
        case TG_INIT_ONES: init = tg_init_ones(); break;
        default: init = tg_init_literal(LIT6, 6); break;
        }
        pl->p[i] = tg_param_new(m, INIT_TABLE[i].name, s, init);
        CHECK(pl->p[i].id >= 0, "param %s: %s", INIT_TABLE[i].name, tg_model_error(m));
    }
    CHECK(tg_model_error(m) == NULL, "model error: %s", tg_model_error(m));
    return m;
}

static float *download_all(tg_train *t) {
    size_t total = 0;
    for (int i = 0; i < N_INIT; i++) total += init_numel(i);
    float *v = calloc(total, sizeof *v), *w = v;
    for (int i = 0; i < N_INIT; i++) {
        if (t) download(t, INIT_TABLE[i].name, w, init_numel(i));
        w += init_numel(i);
    }
    return v;
}

static void test_init(void) {
    plist pa, pb, pc;
    tg_model *ma = init_model(1234, &pa), *mb = init_model(1234, &pb), *mc = init_model(1235, &pc);
    CHECK(tg_model_seed(ma) == 1234 && tg_model_seed(mc) == 1235, "tg_model_seed");
    CHECK(tg_model_n_params(ma) == N_INIT, "tg_model_n_params %d", tg_model_n_params(ma));
    for (int i = 0; i < N_INIT && i < tg_model_n_params(ma); i++) {
        CHECK(strcmp(tg_model_param_name(ma, i), INIT_TABLE[i].name) == 0, "tg_model_param_name(%d) = %s", i,
              tg_model_param_name(ma, i));
        tg_shape s = tg_model_param_shape(ma, i);
        CHECK(s.ndim == (INIT_TABLE[i].d1 ? 2 : 1) && s.d[0] == INIT_TABLE[i].d0 &&
              (s.ndim == 1 || s.d[1] == INIT_TABLE[i].d1), "tg_model_param_shape(%d)", i);
    }
    tg_train *ta = compile_all(ma, &pa), *tb = compile_all(mb, &pb), *tc = compile_all(mc, &pc);
    float *va = download_all(ta), *vb = download_all(tb), *vc = download_all(tc);
    float *wa = va, *wb = vb, *wc = vc;
    for (int i = 0; i < N_INIT; i++) {
        size_t n = init_numel(i), differ = 0;
        const char *name = INIT_TABLE[i].name;
        CHECK(memcmp(wa, wb, n * sizeof *wa) == 0, "%s: same seed gave different values", name);
        for (size_t j = 0; j < n; j++) differ += wa[j] != wc[j];
        if (INIT_TABLE[i].kind == TG_INIT_RANDN || INIT_TABLE[i].kind == TG_INIT_KAIMING) {
            CHECK(differ > n * 99 / 100, "%s: another seed changed only %zu of %zu values", name, differ, n);
            double sum = 0, sq = 0, want = init_std(i);
            for (size_t j = 0; j < n; j++) { sum += wa[j]; sq += (double)wa[j] * wa[j]; }
            double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
            /* Sampling error of the std is ~1/sqrt(2n) = 0.5% relative at n = 20000: 3% is ~6 sigma. */
            CHECK(fabs(sd / want - 1) < 0.03, "%s: std %.5g, want %.5g", name, sd, want);
            CHECK(fabs(mean) < 5 * want / sqrt((double)n), "%s: mean %.3g for std %.3g", name, mean, want);
        } else {
            CHECK(differ == 0, "%s: a deterministic init depends on the seed", name);
            for (size_t j = 0; j < n; j++) {
                float want = INIT_TABLE[i].kind == TG_INIT_ZEROS ? 0.0f : INIT_TABLE[i].kind == TG_INIT_ONES ? 1.0f : LIT6[j];
                CHECK(wa[j] == want, "%s[%zu] = %.9g, want %.9g", name, j, wa[j], want);
            }
        }
        wa += n; wb += n; wc += n;
    }
    /* "a" and "a2" have the same init spec but are different draws. */
    size_t same = 0;
    for (size_t j = 0; j < NA; j++) same += va[j] == va[NA + j];
    CHECK(same < NA / 100, "params a and a2 share %zu of %d values", same, NA);

    /* A parameter's values depend on the seed and its name, not on the other declarations. */
    plist pd = { .n = 1 };
    tg_model *md = tg_model_new(1234);
    tg_param_new(md, "other", TG_SHAPE(33), tg_init_randn(1.0));
    pd.p[0] = tg_param_new(md, "a", TG_SHAPE(NA), tg_init_randn(0.5));
    tg_train *td = compile_all(md, &pd);
    float *vd = calloc(NA, sizeof *vd);
    if (td) download(td, "a", vd, NA);
    CHECK(td && memcmp(vd, va, NA * sizeof *vd) == 0, "param a changed when declared after another param");

    free(va); free(vb); free(vc); free(vd);
    tg_destroy(ta); tg_destroy(tb); tg_destroy(tc); tg_destroy(td);
    tg_model_free(ma); tg_model_free(mb); tg_model_free(mc); tg_model_free(md);
}

/* ---------------------------------------------------------------------------------------------
 * The quadratic model: loss = sum(0.5 c p^2) + sum(d p) + sum(0.5 e q^2) + sum(f q).
 * ------------------------------------------------------------------------------------------- */
typedef struct { tg_param p, q; } quad;
static const float P0[5] = { 1.5f, -0.75f, 2.0f, -1.25f, 0.5f };
typedef struct { float c[5], d[5], e[3], f[3]; } quad_data;

static tg_tensor quad_loss(const void *ctx, const tg_tensor *in) {
    const quad *q = ctx;
    tg_tensor p = tg_p(q->p), r = tg_p(q->q);
    tg_tensor lp = tg_add(tg_sum(tg_mul(tg_mul(0.5, in[0]), tg_square(p)), TG_ALL, 0), tg_sum(tg_mul(in[1], p), TG_ALL, 0));
    tg_tensor lq = tg_add(tg_sum(tg_mul(tg_mul(0.5, in[2]), tg_square(r)), TG_ALL, 0), tg_sum(tg_mul(in[3], r), TG_ALL, 0));
    return tg_add(lp, lq);
}

static tg_model *quad_model(quad *q) {
    tg_model *m = tg_model_new(99);
    q->p = tg_param_new(m, "p", TG_SHAPE(5), tg_init_literal(P0, 5));
    q->q = tg_param_new(m, "q", TG_SHAPE(3), tg_init_randn(1.0));
    return m;
}

static tg_train *quad_compile(tg_model *m, quad *q, tg_optimizer opt) {
    const tg_input_decl quad_in[] = { TG_F32("c", 5), TG_F32("d", 5), TG_F32("e", 3), TG_F32("f", 3) };
    err.msg[0] = 0;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = quad_loss, .ctx = q, .inputs = quad_in, .n_inputs = 4,
                                              .optimizer = opt }, &err);
    CHECK(t != NULL, "compile quad: %s", err.msg);
    return t;
}

static void quad_fill(quad_data *qd) {
    for (int i = 0; i < 5; i++) { qd->c[i] = (float)check_uniform(0.5, 1.5); qd->d[i] = (float)check_uniform(-1, 1); }
    for (int i = 0; i < 3; i++) { qd->e[i] = (float)check_uniform(0.5, 1.5); qd->f[i] = (float)check_uniform(-1, 1); }
}

#define QUAD_DATA(qd) (tg_data[]){ tg_f32("c", (qd)->c, 5), tg_f32("d", (qd)->d, 5), tg_f32("e", (qd)->e, 3), tg_f32("f", (qd)->f, 3) }, 4

static double quad_host_loss(const quad_data *qd, const float *p, const float *q, double *scale) {
    double l = 0, a = 0;
    for (int i = 0; i < 5; i++) {
        double t1 = 0.5 * qd->c[i] * p[i] * p[i], t2 = (double)qd->d[i] * p[i];
        l += t1 + t2; a += fabs(t1) + fabs(t2);
    }
    for (int i = 0; i < 3; i++) {
        double t1 = 0.5 * qd->e[i] * q[i] * q[i], t2 = (double)qd->f[i] * q[i];
        l += t1 + t2; a += fabs(t1) + fabs(t2);
    }
    *scale = a;
    return l;
}

static void test_upload_download(void) {
    quad q;
    tg_model *m = quad_model(&q);
    tg_train *t = quad_compile(m, &q, tg_adam(0.05));
    if (!t) { tg_model_free(m); return; }
    CHECK(tg_train_n_params(t) == 2, "tg_train_n_params %d", tg_train_n_params(t));
    float p[5], qv[3], p2[5], q2[3];
    download(t, "p", p, 5);
    download(t, "q", qv, 3);
    CHECK(memcmp(p, P0, sizeof p) == 0, "literal init of p");

    /* Partial upload: only p changes. */
    float newp[5] = { -3.0f, 0.125f, 7.0f, 1e-4f, -0.5f };
    err.msg[0] = 0;
    CHECK(tg_upload_params(t, (tg_data[]){ tg_f32("p", newp, 5) }, 1, &err) == TG_OK, "upload p: %s", err.msg);
    download(t, "p", p2, 5);
    download(t, "q", q2, 3);
    CHECK(memcmp(p2, newp, sizeof p2) == 0, "uploaded p not read back");
    CHECK(memcmp(q2, qv, sizeof q2) == 0, "a partial upload of p changed q");

    /* download -> steps -> upload the saved values -> the same values come back, and the next step
     * from them matches a second handle started from the same values. */
    float sp[5], sq[3];
    download(t, "p", sp, 5);
    download(t, "q", sq, 3);
    quad_data qd;
    quad_fill(&qd);
    for (int s = 0; s < 3; s++) CHECK(tg_step(t, QUAD_DATA(&qd)).status == TG_OK, "step");
    download(t, "p", p2, 5);
    CHECK(memcmp(p2, sp, sizeof p2) != 0, "steps did not move p");
    err.msg[0] = 0;
    CHECK(tg_upload_params(t, (tg_data[]){ tg_f32("q", sq, 3), tg_f32("p", sp, 5) }, 2, &err) == TG_OK, "upload: %s", err.msg);
    download(t, "p", p2, 5);
    download(t, "q", q2, 3);
    CHECK(memcmp(p2, sp, sizeof p2) == 0 && memcmp(q2, sq, sizeof q2) == 0, "download -> upload round trip");

    /* The parameter list. */
    int seen = 0;
    for (int i = 0; i < tg_train_n_params(t); i++) {
        const char *n = tg_train_param_name(t, i);
        tg_shape s = tg_train_param_shape(t, i);
        if (n && strcmp(n, "p") == 0) { seen |= 1; CHECK(s.ndim == 1 && s.d[0] == 5, "shape of p"); }
        if (n && strcmp(n, "q") == 0) { seen |= 2; CHECK(s.ndim == 1 && s.d[0] == 3, "shape of q"); }
    }
    CHECK(seen == 3, "tg_train_param_name lists p and q");
    tg_destroy(t);
    tg_model_free(m);
}

static void test_grad_and_eval(void) {
    quad q;
    tg_model *m = quad_model(&q);
    tg_train *t = quad_compile(m, &q, tg_adam(0.05)), *u = quad_compile(m, &q, tg_adam(0.05));
    if (!t || !u) { tg_destroy(t); tg_destroy(u); tg_model_free(m); return; }
    quad_data qd[4];
    for (int s = 0; s < 4; s++) quad_fill(&qd[s]);

    for (int s = 0; s < 3; s++) {
        float p[5], qv[3], gp[5], gq[3];
        download(t, "p", p, 5);
        download(t, "q", qv, 3);
        tg_result r = tg_step(t, QUAD_DATA(&qd[s]));
        CHECK(r.status == TG_OK, "step: %s", r.error);
        err.msg[0] = 0;
        CHECK(tg_download_param_grad(t, "p", gp, 5, &err) == TG_OK, "grad p: %s", err.msg);
        CHECK(tg_download_param_grad(t, "q", gq, 3, &err) == TG_OK, "grad q: %s", err.msg);
        /* The gradient of the step just taken, at the parameters before it. */
        for (int i = 0; i < 5; i++) {
            double cp = (double)qd[s].c[i] * p[i], want = cp + qd[s].d[i];
            CHECK_NEAR(gp[i], want, fabs(cp) + fabs(qd[s].d[i]), 1e-6, "step %d grad p[%d] %.9g vs %.9g", s + 1, i, gp[i], want);
        }
        for (int i = 0; i < 3; i++) {
            double eq = (double)qd[s].e[i] * qv[i], want = eq + qd[s].f[i];
            CHECK_NEAR(gq[i], want, fabs(eq) + fabs(qd[s].f[i]), 1e-6, "step %d grad q[%d] %.9g vs %.9g", s + 1, i, gq[i], want);
        }

        /* tg_eval_loss: the loss at the current parameters; nothing changes. */
        float pa[5], qa[3], pb[5], qb[3];
        download(t, "p", pa, 5);
        download(t, "q", qa, 3);
        double scale, want = quad_host_loss(&qd[3], pa, qa, &scale);
        tg_result e = tg_eval_loss(t, QUAD_DATA(&qd[3]));
        CHECK(e.status == TG_OK, "eval: %s", e.error);
        CHECK_NEAR(e.loss, want, scale, 1e-6, "eval loss %.9g vs %.9g", e.loss, want);
        download(t, "p", pb, 5);
        download(t, "q", qb, 3);
        CHECK(memcmp(pa, pb, sizeof pa) == 0 && memcmp(qa, qb, sizeof qa) == 0, "tg_eval_loss changed parameters");
        CHECK(tg_train_step_count(t) == s + 1, "tg_eval_loss changed the step count: %lld", (long long)tg_train_step_count(t));
        CHECK(e.loss != r.loss, "eval and step data are different, so should their losses be");
        /* The twin takes the same steps without evaluations. */
        CHECK(tg_step(u, QUAD_DATA(&qd[s])).status == TG_OK, "twin step");
    }
    /* Evaluations left the optimizer state alone: the trajectories agree exactly. */
    tg_result a = tg_step(t, QUAD_DATA(&qd[0])), b = tg_step(u, QUAD_DATA(&qd[0]));
    CHECK(a.status == TG_OK && b.status == TG_OK && a.step == 4 && b.step == 4, "step 4");
    float pt[5], pu[5];
    download(t, "p", pt, 5);
    download(u, "p", pu, 5);
    CHECK(memcmp(pt, pu, sizeof pt) == 0, "tg_eval_loss changed the optimizer's trajectory");
    tg_destroy(t);
    tg_destroy(u);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Attached forwards share the parameters.
 * ------------------------------------------------------------------------------------------- */
static tg_tensor scaled_forward(const void *ctx, const tg_tensor *in) {
    const quad *q = ctx;
    return tg_mul(tg_reshape(tg_p(q->p), 1, 5), in[0]);   /* [1,5] * [3,5] -> [3,5] */
}

static void check_forward_output(tg_forward *f, const float *x, tg_train *t, const char *when) {
    float p[5];
    download(t, "p", p, 5);
    tg_result r = tg_run(f, (tg_data[]){ tg_f32("x", x, 15) }, 1);
    CHECK(r.status == TG_OK, "%s: run: %s", when, r.error);
    if (r.status != TG_OK) return;
    CHECK(r.output_shape.ndim == 2 && r.output_shape.d[0] == 3 && r.output_shape.d[1] == 5, "%s: output shape", when);
    CHECK(r.output_len == 15 && r.output != NULL, "%s: output_len %zu", when, r.output_len);
    if (r.output_len != 15 || !r.output) return;
    for (int i = 0; i < 15; i++) {
        double want = (double)p[i % 5] * x[i];
        CHECK_NEAR(r.output[i], want, 0, 1e-6, "%s: output[%d] %.9g vs %.9g", when, i, r.output[i], want);
    }
}

static void test_attach(void) {
    quad q;
    tg_model *m = quad_model(&q);
    tg_train *t = quad_compile(m, &q, tg_sgd(0.2, 0, 0, 0));
    if (!t) { tg_model_free(m); return; }
    const tg_input_decl xin[] = { TG_F32("x", 3, 5) };
    err.msg[0] = 0;
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = scaled_forward, .ctx = &q, .inputs = xin, .n_inputs = 1 }, &err);
    CHECK(f != NULL, "tg_attach: %s", err.msg);
    if (!f) { tg_destroy(t); tg_model_free(m); return; }
    const tg_graph *fg = tg_forward_graph(f);
    CHECK(fg != NULL && tg_graph_n_nodes(fg) > 0, "tg_forward_graph");
    if (fg) {
        tg_node_info out = tg_graph_node(fg, tg_graph_output(fg));
        CHECK(out.shape.ndim == 2 && out.shape.d[0] == 3 && out.shape.d[1] == 5, "forward graph output shape");
    }

    float x[15];
    for (int i = 0; i < 15; i++) x[i] = (float)check_uniform(-2, 2);
    check_forward_output(f, x, t, "before training");
    tg_result r0 = tg_run(f, (tg_data[]){ tg_f32("x", x, 15) }, 1);
    float before[15];
    if (r0.status == TG_OK && r0.output_len == 15) memcpy(before, r0.output, sizeof before);

    quad_data qd;
    quad_fill(&qd);
    CHECK(tg_step(t, QUAD_DATA(&qd)).status == TG_OK, "step");
    check_forward_output(f, x, t, "after a step");
    tg_result r1 = tg_run(f, (tg_data[]){ tg_f32("x", x, 15) }, 1);
    CHECK(r1.status == TG_OK && r1.output_len == 15 && memcmp(before, r1.output, sizeof before) != 0,
          "the forward output did not change after a step");

    float newp[5] = { 1, 2, 3, 4, 5 };
    CHECK(tg_upload_params(t, (tg_data[]){ tg_f32("p", newp, 5) }, 1, NULL) == TG_OK, "upload");
    check_forward_output(f, x, t, "after an upload");

    /* A second forward on the same handle sees the same parameters. */
    tg_forward *f2 = tg_attach(t, &(tg_forward_spec){ .forward = scaled_forward, .ctx = &q, .inputs = xin, .n_inputs = 1 }, &err);
    CHECK(f2 != NULL, "second tg_attach: %s", err.msg);
    if (f2) check_forward_output(f2, x, t, "second forward");
    tg_destroy(t);   /* frees f and f2 */
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Scoped names
 * ------------------------------------------------------------------------------------------- */
typedef struct { tg_linear l[3]; tg_param scale; tg_layernorm ln; } stack;
static tg_tensor stack_loss(const void *ctx, const tg_tensor *in) {
    const stack *s = ctx;
    tg_tensor h = in[0];
    for (int i = 0; i < 3; i++) h = tg_tanh(tg_linear(&s->l[i], h));
    h = tg_layernorm(&s->ln, tg_mul(h, tg_p(s->scale)));
    return tg_mean(tg_square(h), TG_ALL, 0);
}

static void test_names(void) {
    tg_model *m = tg_model_new(5);
    stack s;
    for (int i = 0; i < 3; i++) {
        tg_model_push(m, "layers.%d", i);
        s.l[i] = tg_linear_new(m, "l", 4, 4, NULL);
        tg_model_pop(m);
    }
    tg_model_push(m, "head");
    tg_model_push(m, "proj");
    s.scale = tg_param_new(m, "scale", TG_SHAPE(4), tg_init_ones());
    tg_model_pop(m);
    s.ln = tg_layernorm_new(m, "ln", 4, 0, 1);
    tg_model_pop(m);
    CHECK(tg_model_error(m) == NULL, "model error: %s", tg_model_error(m));

    static const struct { const char *name; int ndim; int64_t d0, d1; } want[] = {
        { "layers.0.l.W", 2, 4, 4 }, { "layers.0.l.b", 1, 4, 0 }, { "layers.1.l.W", 2, 4, 4 }, { "layers.1.l.b", 1, 4, 0 },
        { "layers.2.l.W", 2, 4, 4 }, { "layers.2.l.b", 1, 4, 0 }, { "head.proj.scale", 1, 4, 0 }, { "head.ln.g", 1, 4, 0 },
        { "head.ln.b", 1, 4, 0 },
    };
    int nw = (int)(sizeof want / sizeof want[0]);
    CHECK(tg_model_n_params(m) == nw, "model has %d params, want %d", tg_model_n_params(m), nw);

    const tg_input_decl in[] = { TG_F32("x", 2, 4) };
    err.msg[0] = 0;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = stack_loss, .ctx = &s, .inputs = in, .n_inputs = 1,
                                              .optimizer = tg_adamw(1e-3, 0.01) }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    if (t) {
        CHECK(tg_train_n_params(t) == nw, "handle has %d params, want %d", tg_train_n_params(t), nw);
        for (int w = 0; w < nw; w++) {
            int found = 0, found_model = 0;
            for (int i = 0; i < tg_train_n_params(t); i++) {
                const char *n = tg_train_param_name(t, i);
                if (n && strcmp(n, want[w].name) == 0) {
                    found++;
                    tg_shape sh = tg_train_param_shape(t, i);
                    CHECK(sh.ndim == want[w].ndim && sh.d[0] == want[w].d0 && (sh.ndim == 1 || sh.d[1] == want[w].d1),
                          "shape of %s", n);
                }
            }
            for (int i = 0; i < tg_model_n_params(m); i++)
                found_model += strcmp(tg_model_param_name(m, i), want[w].name) == 0;
            CHECK(found == 1, "tg_train_param_name lists %s %d times", want[w].name, found);
            CHECK(found_model == 1, "tg_model_param_name lists %s %d times", want[w].name, found_model);
        }
        float w0[16];
        download(t, "layers.1.l.W", w0, 16);
        float g[4];
        download(t, "head.ln.g", g, 4);
        CHECK(g[0] == 1 && g[3] == 1, "layernorm gain starts at 1");
    }
    tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Inspection
 * ------------------------------------------------------------------------------------------- */
typedef struct { tg_param W; } inspect_ctx;
static int line_matmul, line_square, line_sum;
static tg_tensor inspect_loss(const void *ctx, const tg_tensor *in) {
    const inspect_ctx *c = ctx;
    tg_tensor w = tg_p(c->W);
    line_matmul = __LINE__; tg_tensor h = tg_matmul(in[0], w);
    line_square = __LINE__; tg_tensor sq = tg_square(h);
    line_sum = __LINE__; return tg_sum(sq, TG_ALL, 0);
}

static int shape_is(tg_shape s, int ndim, int64_t d0, int64_t d1) {
    return s.ndim == ndim && (ndim < 1 || s.d[0] == d0) && (ndim < 2 || s.d[1] == d1);
}

static int from_this_file(tg_site s) {
    return s.file && strstr(s.file, "test_runtime.c") != NULL;
}

static void test_inspect(void) {
    tg_model *m = tg_model_new(3);
    static const float w[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
    inspect_ctx c = { tg_param_new(m, "W", TG_SHAPE(3, 4), tg_init_literal(w, 12)) };
    const tg_input_decl in[] = { TG_F32("x", 2, 3) };
    err.msg[0] = 0;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = inspect_loss, .ctx = &c, .inputs = in, .n_inputs = 1,
                                              .optimizer = tg_sgd(0.1, 0, 0, 0) }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    if (!t) { tg_model_free(m); return; }
    const tg_graph *g = tg_train_graph(t);
    CHECK(g != NULL, "tg_train_graph");
    if (!g) { tg_destroy(t); tg_model_free(m); return; }
    int n = tg_graph_n_nodes(g);
    /* Forward (input, param, matmul, square, sum) + backward + update: well over 5 nodes. */
    CHECK(n > 5, "tg_graph_n_nodes %d", n);

    int ix = -1, iw = -1, imm = -1, isq = -1;
    for (int i = 0; i < n; i++) {
        tg_node_info ni = tg_graph_node(g, i);
        CHECK(ni.op != NULL, "node %d has no op name", i);
        if (!ni.op) continue;
        CHECK(ni.n_inputs >= 0 && ni.n_inputs <= 4, "node %d: n_inputs %d", i, ni.n_inputs);
        for (int k = 0; k < ni.n_inputs && k < 4; k++)
            CHECK(ni.inputs[k] >= 0 && ni.inputs[k] < n, "node %d input %d = %d", i, k, ni.inputs[k]);
        if (ni.name && strcmp(ni.name, "x") == 0 && ix < 0) ix = i;
        if (ni.name && strcmp(ni.name, "W") == 0 && strcmp(ni.op, "param") == 0 && iw < 0) iw = i;
    }
    CHECK(ix >= 0 && iw >= 0, "input x (%d) and param W (%d) nodes", ix, iw);
    if (ix >= 0) {
        tg_node_info ni = tg_graph_node(g, ix);
        CHECK(shape_is(ni.shape, 2, 2, 3) && ni.dtype == TG_FLOAT32 && ni.n_inputs == 0, "input node x");
    }
    if (iw >= 0) CHECK(shape_is(tg_graph_node(g, iw).shape, 2, 3, 4) && tg_graph_node(g, iw).n_inputs == 0, "param node W");
    for (int i = 0; i < n && ix >= 0 && iw >= 0; i++) {
        tg_node_info ni = tg_graph_node(g, i);
        if (ni.op && strcmp(ni.op, "matmul") == 0 && ni.n_inputs == 2 && ni.inputs[0] == ix && ni.inputs[1] == iw) imm = i;
    }
    CHECK(imm >= 0, "no matmul node of x and W");
    if (imm >= 0) {
        tg_node_info mm = tg_graph_node(g, imm);
        CHECK(shape_is(mm.shape, 2, 2, 4) && mm.dtype == TG_FLOAT32, "matmul shape [2,4]");
        CHECK(from_this_file(mm.site), "matmul site file %s", mm.site.file ? mm.site.file : "(null)");
        CHECK(mm.site.line == line_matmul, "matmul site line %d, want %d", mm.site.line, line_matmul);
        for (int i = 0; i < n; i++) {
            tg_node_info ni = tg_graph_node(g, i);
            if (ni.op && strcmp(ni.op, "square") == 0 && ni.n_inputs == 1 && ni.inputs[0] == imm) isq = i;
        }
        CHECK(isq >= 0, "no square node of the matmul");
        if (isq >= 0) {
            tg_node_info sq = tg_graph_node(g, isq);
            CHECK(shape_is(sq.shape, 2, 2, 4), "square shape");
            CHECK(from_this_file(sq.site) && sq.site.line == line_square, "square site %s:%d, want line %d",
                  sq.site.file ? sq.site.file : "(null)", sq.site.line, line_square);
        }
    }
    int out = tg_graph_output(g);
    CHECK(out >= 0 && out < n, "tg_graph_output %d", out);
    if (out >= 0 && out < n) {
        tg_node_info o = tg_graph_node(g, out);
        CHECK(o.shape.ndim == 0 || (o.shape.ndim == 1 && o.shape.d[0] == 1), "loss node is a scalar");
        CHECK(from_this_file(o.site) && o.site.line == line_sum, "loss node site %s:%d, want line %d",
              o.site.file ? o.site.file : "(null)", o.site.line, line_sum);
    }
    char *dot = tg_graph_dot(g);
    CHECK(dot && strstr(dot, "digraph"), "tg_graph_dot text");
    CHECK(dot && strstr(dot, "matmul"), "tg_graph_dot names the ops");
    free(dot);
    CHECK(tg_train_planned_bytes(t) > 0, "tg_train_planned_bytes");
    CHECK(tg_version() != NULL && tg_version()[0] != 0, "tg_version");
    tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * A small MLP learns the XOR of two signs.
 * ------------------------------------------------------------------------------------------- */
#define NPTS 128
typedef struct { tg_linear l1, l2; } mlp;
static tg_tensor mlp_logits(const void *ctx, const tg_tensor *in) {
    const mlp *n = ctx;
    return tg_linear(&n->l2, tg_relu(tg_linear(&n->l1, in[0])));
}
static tg_tensor mlp_loss(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(mlp_logits(ctx, in), in[1], TG_MEAN);
}

static void test_mlp(void) {
    static float xs[NPTS * 2];
    static int32_t ys[NPTS];
    for (int i = 0; i < NPTS; i++) {
        double a = check_uniform(-1, 1), b = check_uniform(-1, 1);
        xs[2 * i] = (float)a; xs[2 * i + 1] = (float)b;
        ys[i] = (a > 0) != (b > 0);
    }
    tg_model *m = tg_model_new(2024);
    tg_linear_opts ko = { .init = tg_init_kaiming(0), .has_init = 1 };
    mlp net = { tg_linear_new(m, "l1", 2, 32, &ko), tg_linear_new(m, "l2", 32, 2, NULL) };
    const tg_input_decl in[] = { TG_F32("x", NPTS, 2), TG_I32("y", NPTS) };
    err.msg[0] = 0;
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .ctx = &net, .inputs = in, .n_inputs = 2,
                                              .optimizer = tg_adam(0.03) }, &err);
    CHECK(t != NULL, "compile mlp: %s", err.msg);
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = mlp_logits, .ctx = &net, .inputs = in, .n_inputs = 1 }, &err) : NULL;
    CHECK(f != NULL, "attach mlp: %s", err.msg);
    if (!t || !f) { tg_destroy(t); tg_model_free(m); return; }
    tg_data data[2] = { tg_f32("x", xs, NPTS * 2), tg_i32("y", ys, NPTS) };
    tg_result e0 = tg_eval_loss(t, data, 2);
    CHECK(e0.status == TG_OK, "eval: %s", e0.error);
    /* Small output weights: the initial loss is close to log 2. */
    CHECK(fabs(e0.loss - log(2.0)) < 0.05, "initial loss %.4f", e0.loss);
    float last = 0;
    int failures = 0;
    for (int s = 0; s < 300; s++) {
        tg_result r = tg_step(t, data, 2);
        failures += r.status != TG_OK;
        last = r.loss;
    }
    CHECK(failures == 0, "%d failed steps", failures);
    tg_result e1 = tg_eval_loss(t, data, 2);
    CHECK(e1.status == TG_OK, "eval: %s", e1.error);
    /* The stated goal: the loss falls by at least 20x in 300 Adam steps (from ~log 2). */
    if (getenv("TG_VERBOSE")) printf("mlp: loss %.4f -> %.4f\n", e0.loss, e1.loss);
    CHECK(e1.loss < e0.loss / 20, "loss fell only from %.4f to %.4f (last step %.4f)", e0.loss, e1.loss, last);
    tg_result o = tg_run(f, data, 1);
    CHECK(o.status == TG_OK && o.output_len == NPTS * 2 && shape_is(o.output_shape, 2, NPTS, 2), "mlp forward: %s", o.error);
    if (o.status == TG_OK && o.output_len == NPTS * 2) {
        int correct = 0;
        for (int i = 0; i < NPTS; i++) correct += (o.output[2 * i + 1] > o.output[2 * i]) == (ys[i] == 1);
        CHECK(correct >= NPTS * 95 / 100, "accuracy %d / %d", correct, NPTS);
    }
    tg_destroy(t);
    tg_model_free(m);
}

/* The mlp's losses over a few steps on the cpu backend (false: it failed to compile). */
static bool mlp_losses(const float *xs, const int32_t *ys, float *loss, int steps) {
    tg_model *m = tg_model_new(7);
    mlp net = { tg_linear_new(m, "l1", 2, 32, NULL), tg_linear_new(m, "l2", 32, 2, NULL) };
    const tg_input_decl in[] = { TG_F32("x", NPTS, 2), TG_I32("y", NPTS) };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .ctx = &net, .inputs = in, .n_inputs = 2,
                                              .optimizer = tg_adam(0.03), .backend = "cpu" }, &err);
    CHECK(t != NULL, "compile mlp: %s", err.msg);
    tg_data data[2] = { tg_f32("x", xs, NPTS * 2), tg_i32("y", ys, NPTS) };
    for (int s = 0; t && s < steps; s++) loss[s] = tg_step(t, data, 2).loss;
    tg_destroy(t);
    tg_model_free(m);
    return t != NULL;
}

/* TG_CPU_PROFILE=1: the same values, and where the time went printed (to stderr) when the graph
 * is released. */
static void test_cpu_profile(void) {
    static float xs[NPTS * 2];
    static int32_t ys[NPTS];
    for (int i = 0; i < NPTS; i++) {
        xs[2 * i] = (float)check_uniform(-1, 1);
        xs[2 * i + 1] = (float)check_uniform(-1, 1);
        ys[i] = xs[2 * i] > xs[2 * i + 1];
    }
    float plain[5], profiled[5];
    char path[] = "/tmp/tg_profile_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    bool ok = mlp_losses(xs, ys, plain, 5);
    fflush(stderr);
    if (fd >= 0 && saved >= 0) dup2(fd, 2);
    setenv("TG_CPU_PROFILE", "1", 1);
    ok = mlp_losses(xs, ys, profiled, 5) && ok;
    unsetenv("TG_CPU_PROFILE");
    fflush(stderr);
    if (saved >= 0) dup2(saved, 2);
    CHECK(ok && memcmp(plain, profiled, sizeof plain) == 0, "profiled losses differ: %.6f vs %.6f", plain[4], profiled[4]);
    char text[4096] = "";
    FILE *f = fd >= 0 ? fopen(path, "r") : NULL;
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[n] = 0;
    if (f) fclose(f);
    CHECK(strstr(text, "tensorgrad cpu profile (") && strstr(text, ", 5 runs,") && strstr(text, "matmul"),
          "no profile printed: %.200s", text);
    if (fd >= 0) close(fd);
    if (saved >= 0) close(saved);
    unlink(path);
}

/* A sum of everything large enough for threads (the CPU's sum_kernel cuts it into fixed parts)
 * gives the same value on one thread as on two. Its terms make the order visible: +-1e30 every
 * 4096 elements and ones between, so which ones survive depends on where partial sums start
 * (one part in order: 4095; two halves: 8190). */
#define NBIG (1 << 18)
static tg_tensor big_sum_loss(const void *ctx, const tg_tensor *in) {
    return tg_add(mlp_loss(ctx, in), tg_mul(tg_sum(in[2], TG_ALL, 0), tg_scalar(1e-3)));
}

static void test_sum_threads(void) {
    static float xs[NPTS * 2], z[NBIG];
    static int32_t ys[NPTS];
    for (int i = 0; i < NPTS; i++) {
        xs[2 * i] = (float)check_uniform(-1, 1);
        xs[2 * i + 1] = (float)check_uniform(-1, 1);
        ys[i] = xs[2 * i] > xs[2 * i + 1];
    }
    for (int i = 0; i < NBIG; i++) z[i] = i % 4096 ? 1.0f : (i / 4096) % 2 ? -1e30f : 1e30f;
    tg_model *m = tg_model_new(7);
    mlp net = { tg_linear_new(m, "l1", 2, 32, NULL), tg_linear_new(m, "l2", 32, 2, NULL) };
    const tg_input_decl in[] = { TG_F32("x", NPTS, 2), TG_I32("y", NPTS), TG_F32("z", NBIG) };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = big_sum_loss, .ctx = &net, .inputs = in, .n_inputs = 3,
                                              .optimizer = tg_adam(0.03), .backend = "cpu" }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    tg_data data[3] = { tg_f32("x", xs, NPTS * 2), tg_i32("y", ys, NPTS), tg_f32("z", z, NBIG) };
    tg_result one = { 0 }, two = { 0 };
    if (t) {
        omp_set_num_threads(1);
        one = tg_eval_loss(t, data, 3);
        omp_set_num_threads(2);
        two = tg_eval_loss(t, data, 3);
    }
    CHECK(one.status == TG_OK && two.status == TG_OK && isfinite(one.loss) && one.loss == two.loss,
          "one thread %.9g, two %.9g", one.loss, two.loss);
    tg_destroy(t);
    tg_model_free(m);
}

int main(void) {
    test_init();
    test_upload_download();
    test_grad_and_eval();
    test_attach();
    test_names();
    test_inspect();
    test_mlp();
    test_cpu_profile();
    test_sum_threads();
    return check_report("test_runtime");
}
