/* Optimizers and learning-rate schedules against hand-written PyTorch formulas.
 *
 * The model is a sum of tiny quadratics: for every parameter p_k (shape [n_k]),
 *     loss += sum(0.5 * c_k * p_k^2) + sum(d_k * p_k)
 * with f32 inputs c_k > 0 and d_k drawn afresh for every step, so the gradient is c_k * p_k + d_k
 * and the host knows it exactly. Each step the test downloads the parameters, computes the
 * gradient and the PyTorch update in double, runs tg_step and compares.
 *
 * Tolerances. The runtime is f32: every op result (and so the stored p, m, v) is rounded to float.
 * One step of any optimizer here is a handful of f32 roundings (2^-24 relative each) of quantities
 * no larger than |p| or |update|, so one step checked from the library's own previous p is good
 * to ~5e-7 of max(|p|, |update|): the checks use 1e-6 relative to that scale (tol_step). The
 * optimizer state (m, v, momentum buffer) is not downloadable, so the host carries its own in
 * double; its drift from the library's f32 state is a few roundings per step, relative to the
 * state, i.e. another ~1e-7 of the update. Whole trajectories computed purely on the host (never
 * re-synchronised to the library's p) additionally accumulate one rounding of p per step; after
 * NSTEPS = 8 steps that is up to 8 * 2^-24 * |p| ~ 5e-7 |p| plus the per-step error, so they are
 * compared at 1e-6 * max(1, |p|) as well (CHECK_CLOSE) -- still far below the effect of any formula
 * slip (a wrong bias correction or decay is >= 1e-4 here).
 */
#include "tensorgrad.h"
#include "check.h"

#include <stdlib.h>
#include <string.h>

#define MAXP 6        /* parameters in one model */
#define MAXN 8        /* elements in one parameter */
#define NSTEPS 8      /* steps per optimizer case */
#define MAXSTEPS 12

static const double tol_step = 1e-6;
static int verbose;

/* |a - b| <= tol * max(|a|, |b|, scale): relative to the magnitudes the computation involved. */
static int near(double a, double b, double scale, double tol) {
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    if (scale > m) m = scale;
    return fabs(a - b) <= tol * m;
}
#define CHECK_NEAR(a, b, scale, tol, ...) CHECK(near((a), (b), (scale), (tol)), __VA_ARGS__)

static double max_err_step, max_err_traj;   /* reported with TG_VERBOSE=1 */

/* ---------------------------------------------------------------------------------------------
 * Host learning-rate schedules (written from the formulas in tensorgrad.h, independent of the
 * library's structs).
 * ------------------------------------------------------------------------------------------- */
typedef struct hsched {
    tg_lr_kind kind;
    double peak, final, gamma;
    int64_t steps, every;
    int64_t ms[4];
    int nms;
    const struct hsched *after;
} hsched;

static double hs_at(const hsched *s, int64_t t) {
    double c = (double)(t - 1);
    switch (s->kind) {
    case TG_LR_CONSTANT: return s->peak;
    case TG_LR_LINEAR: {
        double f = (c < (double)s->steps ? c : (double)s->steps) / (double)s->steps;
        return s->peak + (s->final - s->peak) * f;
    }
    case TG_LR_COSINE: {
        double f = (c < (double)s->steps ? c : (double)s->steps) / (double)s->steps;
        return s->final + (s->peak - s->final) * (1.0 + cos(M_PI * f)) / 2.0;
    }
    case TG_LR_WARMUP:
        if (t <= s->steps) return s->peak * (double)t / (double)s->steps;
        return s->after ? hs_at(s->after, t - s->steps) : s->peak;
    case TG_LR_STAIRCASE: {
        int64_t k = (t - 1) / s->every;
        double lr = s->peak;
        for (int64_t i = 0; i < k; i++) lr *= s->gamma;
        return lr;
    }
    case TG_LR_MULTISTEP: {
        double lr = s->peak;
        for (int i = 0; i < s->nms; i++) if (s->ms[i] <= t - 1) lr *= s->gamma;
        return lr;
    }
    }
    return NAN;
}

/* The library's schedule for a host description, built with the public constructors. `after`
 * schedules are kept in static storage because the struct stores a pointer. */
static tg_schedule lib_after_store[16];
static int lib_after_n;
static tg_schedule lib_sched(const hsched *h) {
    switch (h->kind) {
    case TG_LR_CONSTANT: return tg_lr_constant(h->peak);
    case TG_LR_LINEAR: return tg_lr_linear(h->peak, h->final, h->steps);
    case TG_LR_COSINE: return tg_lr_cosine(h->peak, h->final, h->steps);
    case TG_LR_WARMUP: {
        const tg_schedule *after = NULL;
        if (h->after) {
            int i = lib_after_n++ % 16;
            lib_after_store[i] = lib_sched(h->after);
            after = &lib_after_store[i];
        }
        return tg_lr_warmup(h->peak, h->steps, after);
    }
    case TG_LR_STAIRCASE: return tg_lr_staircase(h->peak, h->every, h->gamma);
    case TG_LR_MULTISTEP: return tg_lr_multistep(h->peak, h->ms, h->nms, h->gamma);
    }
    return tg_lr_constant(NAN);
}

static const hsched HS_COS_AFTER = { TG_LR_COSINE, 0.03, 0.003, 0, 4, 0, {0}, 0, NULL };
static const hsched HS_LIN_AFTER = { TG_LR_LINEAR, 0.08, 0.02, 0, 3, 0, {0}, 0, NULL };

static const struct { const char *label; hsched s; } schedules[] = {
    { "constant",          { TG_LR_CONSTANT, 0.05, 0, 0, 0, 0, {0}, 0, NULL } },
    { "linear",            { TG_LR_LINEAR, 0.1, 0.01, 0, 5, 0, {0}, 0, NULL } },
    { "linear up",         { TG_LR_LINEAR, 0.01, 0.07, 0, 4, 0, {0}, 0, NULL } },
    { "cosine",            { TG_LR_COSINE, 0.1, 0.001, 0, 6, 0, {0}, 0, NULL } },
    { "cosine to 0",       { TG_LR_COSINE, 0.08, 0.0, 0, 3, 0, {0}, 0, NULL } },
    { "warmup",            { TG_LR_WARMUP, 0.1, 0, 0, 3, 0, {0}, 0, NULL } },
    { "warmup+cosine",     { TG_LR_WARMUP, 0.03, 0, 0, 3, 0, {0}, 0, &HS_COS_AFTER } },
    { "warmup+linear",     { TG_LR_WARMUP, 0.08, 0, 0, 2, 0, {0}, 0, &HS_LIN_AFTER } },
    { "staircase",         { TG_LR_STAIRCASE, 0.1, 0, 0.5, 0, 3, {0}, 0, NULL } },
    { "staircase every 1", { TG_LR_STAIRCASE, 0.09, 0, 0.8, 0, 1, {0}, 0, NULL } },
    { "multistep",         { TG_LR_MULTISTEP, 0.1, 0, 0.3, 0, 0, {2, 5}, 2, NULL } },
    { "multistep 3",       { TG_LR_MULTISTEP, 0.06, 0, 0.5, 0, 0, {1, 4, 7}, 3, NULL } },
};
#define N_SCHEDULES (int)(sizeof schedules / sizeof schedules[0])

/* ---------------------------------------------------------------------------------------------
 * Host optimizer: PyTorch's torch.optim.Adam / AdamW / SGD (dampening 0), in double.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    tg_opt_kind kind;
    hsched lr;
    double b1, b2, eps, wd, mu;
    int nesterov;
    double clip;
} hopt;

typedef struct {
    double m[MAXP][MAXN], v[MAXP][MAXN], buf[MAXP][MAXN];
    int64_t t;       /* steps taken (Adam's bias-correction step) */
    int64_t base;    /* schedule offset: a schedule set after `base` steps has its step 1 next */
} hstate;

typedef struct {
    int np;
    int n[MAXP];
    int decay[MAXP];
} hshape;

/* One step on p (in place) with gradient g (overwritten: clipped). Returns the lr it used. */
static double hopt_step(const hopt *o, hstate *st, const hshape *sh, double p[MAXP][MAXN], double g[MAXP][MAXN]) {
    st->t++;
    double lr = hs_at(&o->lr, st->t - st->base);
    if (o->clip > 0) {
        double ss = 0;
        for (int k = 0; k < sh->np; k++) for (int i = 0; i < sh->n[k]; i++) ss += g[k][i] * g[k][i];
        double scale = o->clip / (sqrt(ss) + 1e-6);
        if (scale > 1) scale = 1;
        for (int k = 0; k < sh->np; k++) for (int i = 0; i < sh->n[k]; i++) g[k][i] *= scale;
    }
    for (int k = 0; k < sh->np; k++) {
        for (int i = 0; i < sh->n[k]; i++) {
            double gi = g[k][i], *pi = &p[k][i];
            switch (o->kind) {
            case TG_OPT_ADAM:
            case TG_OPT_ADAMW: {
                if (o->kind == TG_OPT_ADAM) gi += o->wd * *pi;
                else if (sh->decay[k]) *pi *= 1 - lr * o->wd;
                double *m = &st->m[k][i], *v = &st->v[k][i];
                *m = o->b1 * *m + (1 - o->b1) * gi;
                *v = o->b2 * *v + (1 - o->b2) * gi * gi;
                double bc1 = 1 - pow(o->b1, (double)st->t), bc2 = 1 - pow(o->b2, (double)st->t);
                *pi -= lr / bc1 * *m / (sqrt(*v) / sqrt(bc2) + o->eps);
                break;
            }
            case TG_OPT_SGD: {
                gi += o->wd * *pi;
                double upd = gi;
                if (o->mu != 0) {
                    double *b = &st->buf[k][i];
                    *b = st->t == 1 ? gi : o->mu * *b + gi;
                    upd = o->nesterov ? gi + o->mu * *b : *b;
                }
                *pi -= lr * upd;
                break;
            }
            }
        }
    }
    return lr;
}

/* ---------------------------------------------------------------------------------------------
 * The quadratic model.
 * ------------------------------------------------------------------------------------------- */
typedef struct {
    const char *name;
    int n;
    tg_init_kind kind;
    int decay;              /* -1: default */
    const float *lit;       /* literal data */
    double std;             /* randn */
} pspec;

typedef struct {
    int np;
    tg_param p[MAXP];
} quad;

static const char *const CNAME[MAXP] = { "c0", "c1", "c2", "c3", "c4", "c5" };
static const char *const DNAME[MAXP] = { "d0", "d1", "d2", "d3", "d4", "d5" };

static tg_tensor quad_loss(const void *ctx, const tg_tensor *in) {
    const quad *q = ctx;
    tg_tensor loss = { 0 };
    for (int k = 0; k < q->np; k++) {
        tg_tensor p = tg_p(q->p[k]);
        tg_tensor quadratic = tg_sum(tg_mul(tg_mul(0.5, in[2 * k]), tg_square(p)), TG_ALL, 0);
        tg_tensor linear = tg_sum(tg_mul(in[2 * k + 1], p), TG_ALL, 0);
        tg_tensor term = tg_add(quadratic, linear);
        loss = k ? tg_add(loss, term) : term;
    }
    return loss;
}

typedef struct {
    tg_model *m;
    quad q;
    tg_train *t;
    hshape sh;
    const pspec *ps;
    tg_input_decl decl[2 * MAXP];
    float c[MAXSTEPS][MAXP][MAXN], d[MAXSTEPS][MAXP][MAXN];
} rig;

static tg_init spec_init(const pspec *s) {
    tg_init init;
    switch (s->kind) {
    case TG_INIT_LITERAL: init = tg_init_literal(s->lit, (size_t)s->n); break;
    case TG_INIT_RANDN: init = tg_init_randn(s->std); break;
    case TG_INIT_ZEROS: init = tg_init_zeros(); break;
    case TG_INIT_ONES: init = tg_init_ones(); break;
    default: init = tg_init_kaiming(0); break;
    }
    return s->decay >= 0 ? tg_init_decay(init, s->decay) : init;
}

static int default_decay(tg_init_kind k) { return k == TG_INIT_RANDN || k == TG_INIT_KAIMING || k == TG_INIT_LITERAL; }

/* Declares the model (seed 7) and draws data: c in [clo, chi], d in [-dmag, dmag]. */
static void rig_model(rig *r, const pspec *ps, int np, double clo, double chi, double dmag) {
    memset(r, 0, sizeof *r);
    r->m = tg_model_new(7);
    r->ps = ps;
    r->q.np = r->sh.np = np;
    for (int k = 0; k < np; k++) {
        r->q.p[k] = tg_param_new(r->m, ps[k].name, TG_SHAPE(ps[k].n), spec_init(&ps[k]));
        r->sh.n[k] = ps[k].n;
        r->sh.decay[k] = ps[k].decay >= 0 ? ps[k].decay : default_decay(ps[k].kind);
        r->decl[2 * k] = (tg_input_decl)TG_F32(CNAME[k], ps[k].n);
        r->decl[2 * k + 1] = (tg_input_decl)TG_F32(DNAME[k], ps[k].n);
    }
    CHECK(tg_model_error(r->m) == NULL, "model error: %s", tg_model_error(r->m));
    for (int s = 0; s < MAXSTEPS; s++)
        for (int k = 0; k < np; k++)
            for (int i = 0; i < ps[k].n; i++) {
                r->c[s][k][i] = (float)check_uniform(clo, chi);
                r->d[s][k][i] = (float)check_uniform(-dmag, dmag);
            }
}

static tg_train *rig_compile(rig *r, tg_optimizer opt) {
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = r->m, .loss = quad_loss, .ctx = &r->q, .inputs = r->decl,
                                              .n_inputs = 2 * r->q.np, .optimizer = opt }, &err);
    CHECK(t != NULL, "tg_compile: %s", err.msg);
    return t;
}

static void rig_free(rig *r) {
    tg_destroy(r->t);
    tg_model_free(r->m);
}

/* Data of step slot s (0-based). */
static tg_result rig_step(rig *r, tg_train *t, int s) {
    tg_data in[2 * MAXP];
    for (int k = 0; k < r->q.np; k++) {
        in[2 * k] = tg_f32(CNAME[k], r->c[s][k], (size_t)r->sh.n[k]);
        in[2 * k + 1] = tg_f32(DNAME[k], r->d[s][k], (size_t)r->sh.n[k]);
    }
    return tg_step(t, in, 2 * r->q.np);
}

static void get_params(rig *r, tg_train *t, double p[MAXP][MAXN]) {
    for (int k = 0; k < r->q.np; k++) {
        float buf[MAXN];
        tg_error err = { { 0 } };
        tg_status st = tg_download_param(t, r->ps[k].name, buf, (size_t)r->sh.n[k], &err);
        CHECK(st == TG_OK, "download %s: %s", r->ps[k].name, err.msg);
        for (int i = 0; i < r->sh.n[k]; i++) p[k][i] = st == TG_OK ? buf[i] : NAN;
    }
}

static void get_params_f(rig *r, tg_train *t, float p[MAXP][MAXN]) {
    for (int k = 0; k < r->q.np; k++) {
        tg_error err = { { 0 } };
        CHECK(tg_download_param(t, r->ps[k].name, p[k], (size_t)r->sh.n[k], &err) == TG_OK, "download %s: %s",
              r->ps[k].name, err.msg);
    }
}

static void put_params_f(rig *r, tg_train *t, float p[MAXP][MAXN]) {
    tg_data d[MAXP];
    for (int k = 0; k < r->q.np; k++) d[k] = tg_f32(r->ps[k].name, p[k], (size_t)r->sh.n[k]);
    tg_error err = { { 0 } };
    CHECK(tg_upload_params(t, d, r->q.np, &err) == TG_OK, "upload: %s", err.msg);
}

static void host_grad(const rig *r, int s, double p[MAXP][MAXN], double g[MAXP][MAXN]) {
    for (int k = 0; k < r->sh.np; k++)
        for (int i = 0; i < r->sh.n[k]; i++) g[k][i] = (double)r->c[s][k][i] * p[k][i] + (double)r->d[s][k][i];
}

/* The loss at p and the sum of |terms| (the scale its f32 evaluation is accurate to). */
static double host_loss(const rig *r, int s, double p[MAXP][MAXN], double *scale) {
    double l = 0, a = 0;
    for (int k = 0; k < r->sh.np; k++)
        for (int i = 0; i < r->sh.n[k]; i++) {
            double q = 0.5 * r->c[s][k][i] * p[k][i] * p[k][i], lin = r->d[s][k][i] * p[k][i];
            l += q + lin;
            a += fabs(q) + fabs(lin);
        }
    *scale = a;
    return l;
}

/* ---------------------------------------------------------------------------------------------
 * Running one optimizer case, step by step.
 * ------------------------------------------------------------------------------------------- */
typedef enum { EV_NONE, EV_SET_LR, EV_SET_SCHEDULE } ev_kind;
typedef struct {
    ev_kind kind;
    int before_step;     /* applied just before this (1-based) step */
    double lr;
    hsched sched;
} event;

static float LIT5[5], LIT5B[5], LIT3[3], SMALL5[5];

/* Parameter tables. */
static const pspec P_MIXED[] = {
    { "lit", 5, TG_INIT_LITERAL, -1, LIT5, 0 },
    { "rn", 4, TG_INIT_RANDN, -1, NULL, 0.7 },
    { "one", 3, TG_INIT_ONES, -1, NULL, 0 },
    { "zero", 3, TG_INIT_ZEROS, -1, NULL, 0 },
};
/* Only parameters with the decay flag set (L2 cases). */
static const pspec P_DECAY[] = {
    { "lit", 5, TG_INIT_LITERAL, -1, LIT5, 0 },
    { "rn", 4, TG_INIT_RANDN, -1, NULL, 0.7 },
    { "one_d", 3, TG_INIT_ONES, 1, NULL, 0 },
};
/* Every combination of init kind and decay flag, for AdamW. */
static const pspec P_ADAMW[] = {
    { "lit", 5, TG_INIT_LITERAL, -1, LIT5, 0 },        /* default: decayed */
    { "rn", 4, TG_INIT_RANDN, -1, NULL, 0.7 },         /* default: decayed */
    { "one", 3, TG_INIT_ONES, -1, NULL, 0 },           /* default: not decayed */
    { "zero", 3, TG_INIT_ZEROS, -1, NULL, 0 },         /* default: not decayed */
    { "one_d", 3, TG_INIT_ONES, 1, NULL, 0 },          /* explicit: decayed */
    { "lit_nd", 5, TG_INIT_LITERAL, 0, LIT5B, 0 },     /* explicit: not decayed */
};
/* Two parameters for global-norm clipping. */
static const pspec P_CLIP[] = {
    { "a", 5, TG_INIT_LITERAL, -1, LIT5, 0 },
    { "b", 3, TG_INIT_LITERAL, -1, LIT3, 0 },
};
/* Small start values (schedule cases: the update is a large part of p, so p pins the lr down). */
static const pspec P_SMALL[] = {
    { "s", 5, TG_INIT_LITERAL, -1, SMALL5, 0 },
};

static void check_init_values(rig *r, double p[MAXP][MAXN], const char *label) {
    for (int k = 0; k < r->sh.np; k++) {
        const pspec *s = &r->ps[k];
        for (int i = 0; i < s->n; i++) {
            double want = s->kind == TG_INIT_LITERAL ? s->lit[i] : s->kind == TG_INIT_ONES ? 1.0 : 0.0;
            if (s->kind == TG_INIT_RANDN) continue;
            CHECK(p[k][i] == want, "%s: init %s[%d] = %.9g, want %.9g", label, s->name, i, p[k][i], want);
        }
    }
}

/* Runs `steps` steps of `opt` (library) and `ho` (host) on a fresh model. Every step is checked
 * from the library's previous parameters (the host keeps its own optimizer state); the whole
 * trajectory is also recomputed on the host alone from the initial values. */
static void run_case(const char *label, const pspec *ps, int np, tg_optimizer opt, hopt ho, int steps,
                     const event *ev, double clo, double chi, double dmag) {
    rig r;
    rig_model(&r, ps, np, clo, chi, dmag);
    r.t = rig_compile(&r, opt);
    if (!r.t) { rig_free(&r); return; }

    double p[MAXP][MAXN], traj[MAXP][MAXN], g[MAXP][MAXN], gt[MAXP][MAXN], want[MAXP][MAXN];
    hstate st, st_traj;
    memset(&st, 0, sizeof st);
    memset(&st_traj, 0, sizeof st_traj);
    hopt ho_traj = ho;
    get_params(&r, r.t, p);
    check_init_values(&r, p, label);
    memcpy(traj, p, sizeof p);
    int clipped = 0;

    for (int s = 1; s <= steps; s++) {
        if (ev && ev->before_step == s) {
            if (ev->kind == EV_SET_LR) {
                tg_set_lr(r.t, ev->lr);
                ho.lr = ho_traj.lr = (hsched){ TG_LR_CONSTANT, ev->lr, 0, 0, 0, 0, {0}, 0, NULL };
            } else {
                tg_schedule ls = lib_sched(&ev->sched);
                tg_set_schedule(r.t, &ls);
                ho.lr = ho_traj.lr = ev->sched;
                st.base = st_traj.base = s - 1;
            }
        }
        double lr_want = hs_at(&ho.lr, s - st.base);
        CHECK_NEAR(tg_train_lr(r.t), lr_want, 1e-15, 1e-12, "%s: tg_train_lr before step %d = %.12g, want %.12g", label, s,
                   tg_train_lr(r.t), lr_want);

        host_grad(&r, s - 1, p, g);
        if (ho.clip > 0) {
            double ss = 0;
            for (int k = 0; k < np; k++) for (int i = 0; i < r.sh.n[k]; i++) ss += g[k][i] * g[k][i];
            clipped += sqrt(ss) > ho.clip;
        }
        double lscale, lwant = host_loss(&r, s - 1, p, &lscale);
        memcpy(want, p, sizeof p);
        hopt_step(&ho, &st, &r.sh, want, g);
        host_grad(&r, s - 1, traj, gt);
        hopt_step(&ho_traj, &st_traj, &r.sh, traj, gt);

        tg_result res = rig_step(&r, r.t, s - 1);
        CHECK(res.status == TG_OK, "%s: step %d failed: %s", label, s, res.error);
        CHECK(res.step == s, "%s: step %d reported step %lld", label, s, (long long)res.step);
        CHECK(tg_train_step_count(r.t) == s, "%s: step count %lld after step %d", label,
              (long long)tg_train_step_count(r.t), s);
        CHECK_NEAR(res.loss, lwant, lscale, tol_step, "%s: loss at step %d: %.9g vs %.9g", label, s, res.loss, lwant);

        double pold[MAXP][MAXN];
        memcpy(pold, p, sizeof p);
        get_params(&r, r.t, p);
        for (int k = 0; k < np; k++)
            for (int i = 0; i < r.sh.n[k]; i++) {
                double scale = fmax(fabs(pold[k][i]), fabs(want[k][i] - pold[k][i]));
                double e = fabs(p[k][i] - want[k][i]) / fmax(scale, fmax(fabs(p[k][i]), fabs(want[k][i])));
                if (e > max_err_step) max_err_step = e;
                CHECK_NEAR(p[k][i], want[k][i], scale, tol_step, "%s: step %d %s[%d] = %.9g, want %.9g (from %.9g)",
                           label, s, ps[k].name, i, p[k][i], want[k][i], pold[k][i]);
            }
    }
    if (ho.clip > 0 && ho.clip < 1) CHECK(clipped == steps, "%s: clipping triggered in %d of %d steps", label, clipped, steps);
    for (int k = 0; k < np; k++)
        for (int i = 0; i < r.sh.n[k]; i++) {
            double e = fabs(p[k][i] - traj[k][i]) / fmax(1, fabs(traj[k][i]));
            if (e > max_err_traj) max_err_traj = e;
            CHECK_CLOSE(p[k][i], traj[k][i], 1e-6, label);
        }
    rig_free(&r);
}

/* ---------------------------------------------------------------------------------------------
 * Cases
 * ------------------------------------------------------------------------------------------- */
static hopt h_adam(double lr) { return (hopt){ TG_OPT_ADAM, { TG_LR_CONSTANT, lr, 0, 0, 0, 0, {0}, 0, NULL }, 0.9, 0.999, 1e-8, 0, 0, 0, 0 }; }
static hopt h_sgd(double lr, double mu, int nesterov, double wd) {
    return (hopt){ TG_OPT_SGD, { TG_LR_CONSTANT, lr, 0, 0, 0, 0, {0}, 0, NULL }, 0, 0, 0, wd, mu, nesterov, 0 };
}

static void test_constructors(void) {
    tg_optimizer a = tg_adam(0.003);
    CHECK(a.kind == TG_OPT_ADAM && a.lr.kind == TG_LR_CONSTANT && a.lr.peak == 0.003, "tg_adam kind/lr");
    CHECK(a.b1 == 0.9 && a.b2 == 0.999 && a.eps == 1e-8 && a.weight_decay == 0 && a.clip_norm == 0,
          "tg_adam defaults b1 %g b2 %g eps %g wd %g clip %g", a.b1, a.b2, a.eps, a.weight_decay, a.clip_norm);
    tg_optimizer w = tg_adamw(0.002, 0.05);
    CHECK(w.kind == TG_OPT_ADAMW && w.lr.kind == TG_LR_CONSTANT && w.lr.peak == 0.002 && w.weight_decay == 0.05,
          "tg_adamw kind/lr/wd");
    CHECK(w.b1 == 0.9 && w.b2 == 0.999 && w.eps == 1e-8 && w.clip_norm == 0, "tg_adamw defaults");
    tg_optimizer s = tg_sgd(0.1, 0.9, 1, 0.01);
    CHECK(s.kind == TG_OPT_SGD && s.lr.kind == TG_LR_CONSTANT && s.lr.peak == 0.1 && s.momentum == 0.9 &&
          s.nesterov == 1 && s.weight_decay == 0.01 && s.clip_norm == 0, "tg_sgd fields");
}

static void test_adam(void) {
    run_case("adam", P_MIXED, 4, tg_adam(0.02), h_adam(0.02), NSTEPS, NULL, 0.5, 1.5, 1.0);

    /* Non-default b1, b2 and a large eps (its place in the denominator matters at this size). */
    tg_optimizer o = tg_adam(0.03);
    o.b1 = 0.8; o.b2 = 0.99; o.eps = 0.1;
    hopt h = h_adam(0.03);
    h.b1 = 0.8; h.b2 = 0.99; h.eps = 0.1;
    run_case("adam b1 0.8 b2 0.99 eps 0.1", P_MIXED, 4, o, h, NSTEPS, NULL, 0.5, 1.5, 1.0);

    /* L2 weight decay: added to the gradient (so it also enters m and v). */
    o = tg_adam(0.02); o.weight_decay = 0.3;
    h = h_adam(0.02); h.wd = 0.3;
    run_case("adam L2 0.3", P_DECAY, 3, o, h, NSTEPS, NULL, 0.5, 1.5, 1.0);

    /* A schedule: lr(t) enters the update at step t. */
    o = tg_adam(0); h = h_adam(0);
    h.lr = schedules[6].s;   /* warmup + cosine */
    o.lr = lib_sched(&h.lr);
    run_case("adam warmup+cosine", P_MIXED, 4, o, h, NSTEPS + 2, NULL, 0.5, 1.5, 1.0);
}

static void test_adamw(void) {
    hopt h = h_adam(0.02);
    h.kind = TG_OPT_ADAMW; h.wd = 0.5;
    run_case("adamw 0.5", P_ADAMW, 6, tg_adamw(0.02, 0.5), h, NSTEPS, NULL, 0.5, 1.5, 1.0);

    /* The decoupled decay uses the scheduled lr. */
    tg_optimizer o = tg_adamw(0, 0.4);
    h.wd = 0.4;
    h.lr = schedules[1].s;   /* linear */
    o.lr = lib_sched(&h.lr);
    run_case("adamw linear schedule", P_ADAMW, 6, o, h, NSTEPS, NULL, 0.5, 1.5, 1.0);

    /* Directly: after one AdamW step a ones-init parameter (no decay) moved by exactly the Adam
     * step (|step| = lr at t = 1), while an explicitly decayed one also shrank by lr * wd. */
    static const pspec two[] = { { "plain", 3, TG_INIT_ONES, -1, NULL, 0 }, { "decayed", 3, TG_INIT_ONES, 1, NULL, 0 } };
    rig r;
    rig_model(&r, two, 2, 0.5, 1.5, 1.0);
    /* Same data for both parameters, so the only difference is the decay. */
    memcpy(r.c[0][1], r.c[0][0], sizeof r.c[0][0]);
    memcpy(r.d[0][1], r.d[0][0], sizeof r.d[0][0]);
    r.t = rig_compile(&r, tg_adamw(0.05, 0.2));
    if (r.t) {
        double p[MAXP][MAXN];
        CHECK(rig_step(&r, r.t, 0).status == TG_OK, "adamw decay flag: step");
        get_params(&r, r.t, p);
        for (int i = 0; i < 3; i++) {
            double g = r.c[0][0][i] + r.d[0][0][i];
            double adam_step = 0.05 * (g > 0 ? 1 : -1) * fabs(g) / (fabs(g) + 1e-8);
            CHECK_NEAR(p[0][i], 1 - adam_step, 1, 1e-6, "adamw: ones param without decay flag: %.9g", p[0][i]);
            CHECK_NEAR(p[1][i], 1 * (1 - 0.05 * 0.2) - adam_step, 1, 1e-6, "adamw: decayed ones param: %.9g", p[1][i]);
            CHECK(fabs(p[0][i] - p[1][i]) > 0.005, "adamw: decay flag makes no difference");
        }
    }
    rig_free(&r);
}

static void test_sgd(void) {
    static const struct { const char *label; double lr, mu; int nesterov; double wd; int decay_only; } cases[] = {
        { "sgd", 0.1, 0, 0, 0, 0 },
        { "sgd momentum 0.9", 0.05, 0.9, 0, 0, 0 },
        { "sgd nesterov 0.9", 0.05, 0.9, 1, 0, 0 },
        { "sgd momentum 0.5", 0.1, 0.5, 0, 0, 0 },
        { "sgd L2 0.2", 0.1, 0, 0, 0.2, 1 },
        { "sgd momentum L2", 0.05, 0.8, 0, 0.1, 1 },
        { "sgd nesterov L2", 0.05, 0.7, 1, 0.1, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hopt h = h_sgd(cases[i].lr, cases[i].mu, cases[i].nesterov, cases[i].wd);
        tg_optimizer o = tg_sgd(cases[i].lr, cases[i].mu, cases[i].nesterov, cases[i].wd);
        if (cases[i].decay_only) run_case(cases[i].label, P_DECAY, 3, o, h, NSTEPS, NULL, 0.5, 1.5, 1.0);
        else run_case(cases[i].label, P_MIXED, 4, o, h, NSTEPS, NULL, 0.5, 1.5, 1.0);
    }
}

static void test_clip(void) {
    /* Gradients of ~1 per element over 8 elements: global norm ~2-3, so 0.5 always clips. */
    static const struct { const char *label; tg_opt_kind kind; double lr, mu, wd, clip; int nesterov; } cases[] = {
        { "clip sgd", TG_OPT_SGD, 0.1, 0, 0, 0.5, 0 },
        { "clip sgd momentum", TG_OPT_SGD, 0.05, 0.9, 0, 0.3, 0 },
        { "clip sgd nesterov L2", TG_OPT_SGD, 0.05, 0.9, 0.2, 0.4, 1 },
        { "clip adam L2", TG_OPT_ADAM, 0.02, 0, 0.5, 0.2, 0 },
        { "clip adamw", TG_OPT_ADAMW, 0.02, 0, 0.5, 0.2, 0 },
        { "clip not triggered", TG_OPT_SGD, 0.1, 0.5, 0, 100, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hopt h;
        tg_optimizer o;
        if (cases[i].kind == TG_OPT_SGD) {
            h = h_sgd(cases[i].lr, cases[i].mu, cases[i].nesterov, cases[i].wd);
            o = tg_sgd(cases[i].lr, cases[i].mu, cases[i].nesterov, cases[i].wd);
        } else {
            h = h_adam(cases[i].lr);
            h.kind = cases[i].kind;
            h.wd = cases[i].wd;
            h.eps = 0.05;     /* makes Adam's update depend on the gradient's scale */
            o = cases[i].kind == TG_OPT_ADAM ? tg_adam(cases[i].lr) : tg_adamw(cases[i].lr, cases[i].wd);
            o.weight_decay = cases[i].wd;
            o.eps = 0.05;
        }
        h.clip = o.clip_norm = cases[i].clip;
        run_case(cases[i].label, P_CLIP, 2, o, h, NSTEPS, NULL, 0.5, 1.5, 1.0);
    }

    /* One SGD step by hand: p - lr * g * clip / (|g| + 1e-6). */
    rig r;
    rig_model(&r, P_CLIP, 2, 0.5, 1.5, 1.0);
    tg_optimizer o = tg_sgd(1.0, 0, 0, 0);
    o.clip_norm = 0.25;
    r.t = rig_compile(&r, o);
    if (r.t) {
        double p0[MAXP][MAXN], p1[MAXP][MAXN], g[MAXP][MAXN], ss = 0;
        get_params(&r, r.t, p0);
        host_grad(&r, 0, p0, g);
        for (int k = 0; k < 2; k++) for (int i = 0; i < r.sh.n[k]; i++) ss += g[k][i] * g[k][i];
        double norm = sqrt(ss), moved = 0;
        CHECK(rig_step(&r, r.t, 0).status == TG_OK, "clip by hand: step");
        get_params(&r, r.t, p1);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < r.sh.n[k]; i++) {
                double want = p0[k][i] - g[k][i] * 0.25 / (norm + 1e-6);
                CHECK_NEAR(p1[k][i], want, fabs(p0[k][i]), 1e-6, "clip by hand %d/%d: %.9g vs %.9g", k, i, p1[k][i], want);
                moved += (p1[k][i] - p0[k][i]) * (p1[k][i] - p0[k][i]);
            }
        /* The whole update (both parameters together) has length clip_norm * lr. */
        CHECK_NEAR(sqrt(moved), 0.25, 0, 1e-5, "clip: global update norm %.9g", sqrt(moved));
    }
    rig_free(&r);
}

/* ---------------------------------------------------------------------------------------------
 * Schedules
 * ------------------------------------------------------------------------------------------- */
static void test_schedule_values(void) {
    /* Hand-computed points (checks the host formulas themselves). */
    static const struct { int sched; int64_t t; double want; } points[] = {
        { 0, 1, 0.05 }, { 0, 100, 0.05 },
        { 1, 1, 0.1 }, { 1, 3, 0.1 - 0.09 * 2 / 5 }, { 1, 6, 0.01 }, { 1, 50, 0.01 },
        { 4, 1, 0.08 }, { 4, 2, 0.08 * 0.75 }, { 4, 4, 0.0 }, { 4, 9, 0.0 },
        { 5, 1, 0.1 / 3 }, { 5, 3, 0.1 }, { 5, 4, 0.1 }, { 5, 40, 0.1 },
        { 6, 2, 0.02 }, { 6, 4, 0.03 }, { 6, 6, 0.003 + 0.027 * 0.5 }, { 6, 8, 0.003 }, { 6, 30, 0.003 },
        { 7, 3, 0.08 }, { 7, 4, 0.06 },
        { 8, 3, 0.1 }, { 8, 4, 0.05 }, { 8, 6, 0.05 }, { 8, 7, 0.025 },
        { 10, 2, 0.1 }, { 10, 3, 0.03 }, { 10, 5, 0.03 }, { 10, 6, 0.1 * 0.3 * 0.3 },
        { 11, 1, 0.06 }, { 11, 2, 0.03 }, { 11, 5, 0.015 }, { 11, 8, 0.0075 },
    };
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
        const hsched *h = &schedules[points[i].sched].s;
        CHECK_NEAR(hs_at(h, points[i].t), points[i].want, 0, 1e-12, "host %s at %lld: %.12g vs %.12g",
                   schedules[points[i].sched].label, (long long)points[i].t, hs_at(h, points[i].t), points[i].want);
        tg_schedule s = lib_sched(h);
        CHECK_NEAR(tg_schedule_at(&s, points[i].t), points[i].want, 1e-15, 1e-12, "tg_schedule_at %s at %lld: %.12g vs %.12g",
                   schedules[points[i].sched].label, (long long)points[i].t, tg_schedule_at(&s, points[i].t), points[i].want);
    }
    /* Every schedule at t = 1..25 against the host formula. */
    for (int j = 0; j < N_SCHEDULES; j++) {
        tg_schedule s = lib_sched(&schedules[j].s);
        CHECK(s.kind == schedules[j].s.kind, "%s: constructor kind %d", schedules[j].label, (int)s.kind);
        for (int64_t t = 1; t <= 25; t++) {
            double want = hs_at(&schedules[j].s, t), got = tg_schedule_at(&s, t);
            CHECK_NEAR(got, want, 1e-15, 1e-12, "tg_schedule_at %s at %lld: %.12g vs %.12g", schedules[j].label,
                       (long long)t, got, want);
        }
    }
}

/* Each schedule driving plain SGD: before step t tg_train_lr is lr(t), and the update is lr(t) * g. */
static void test_schedule_training(void) {
    for (int j = 0; j < N_SCHEDULES; j++) {
        hopt h = h_sgd(0, 0, 0, 0);
        h.lr = schedules[j].s;
        tg_optimizer o = tg_sgd(0, 0, 0, 0);
        o.lr = lib_sched(&h.lr);
        char label[64];
        snprintf(label, sizeof label, "sgd schedule %s", schedules[j].label);
        /* c small, |d| ~ 1: the gradient is ~d and the update ~lr * d is the bulk of p. */
        run_case(label, P_SMALL, 1, o, h, 10, NULL, 0.05, 0.1, 1.5);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Live changes: tg_set_lr and tg_set_schedule.
 * ------------------------------------------------------------------------------------------- */
static void test_live_changes(void) {
    event ev = { EV_SET_LR, 4, 0.025, { 0 } };
    run_case("sgd set_lr", P_SMALL, 1, tg_sgd(0.1, 0, 0, 0), h_sgd(0.1, 0, 0, 0), 7, &ev, 0.05, 0.1, 1.5);
    run_case("sgd momentum set_lr", P_MIXED, 4, tg_sgd(0.05, 0.9, 0, 0), h_sgd(0.05, 0.9, 0, 0), 7, &ev, 0.5, 1.5, 1.0);
    /* Adam keeps counting its bias-correction steps across the change. */
    run_case("adam set_lr", P_MIXED, 4, tg_adam(0.05), h_adam(0.05), 7, &ev, 0.5, 1.5, 1.0);

    ev = (event){ EV_SET_SCHEDULE, 4, 0, schedules[1].s };   /* linear 0.1 -> 0.01 over 5 */
    run_case("sgd set_schedule linear", P_SMALL, 1, tg_sgd(0.02, 0, 0, 0), h_sgd(0.02, 0, 0, 0), 11, &ev, 0.05, 0.1, 1.5);
    ev = (event){ EV_SET_SCHEDULE, 3, 0, schedules[7].s };   /* warmup + linear */
    run_case("sgd set_schedule warmup", P_SMALL, 1, tg_sgd(0.02, 0, 0, 0), h_sgd(0.02, 0, 0, 0), 10, &ev, 0.05, 0.1, 1.5);
    ev = (event){ EV_SET_SCHEDULE, 4, 0, schedules[10].s };  /* multistep */
    {
        hopt h = h_sgd(0, 0, 0, 0);
        h.lr = schedules[3].s;
        tg_optimizer o = tg_sgd(0, 0, 0, 0);
        o.lr = lib_sched(&h.lr);
        run_case("sgd cosine then set_schedule multistep", P_SMALL, 1, o, h, 11, &ev, 0.05, 0.1, 1.5);
    }
    ev = (event){ EV_SET_SCHEDULE, 5, 0, HS_COS_AFTER };
    run_case("adam set_schedule cosine", P_MIXED, 4, tg_adam(0.01), h_adam(0.01), 10, &ev, 0.5, 1.5, 1.0);
}

/* ---------------------------------------------------------------------------------------------
 * tg_reset
 * ------------------------------------------------------------------------------------------- */
static int same_params(float a[MAXP][MAXN], float b[MAXP][MAXN], const rig *r) {
    for (int k = 0; k < r->sh.np; k++)
        if (memcmp(a[k], b[k], sizeof(float) * (size_t)r->sh.n[k])) return 0;
    return 1;
}

static void test_reset(void) {
    hsched warm = schedules[6].s;    /* warmup + cosine: the lr depends on the step count */
    tg_optimizer opts[3] = { tg_adam(0), tg_sgd(0.05, 0.9, 1, 0), tg_adamw(0, 0.3) };
    opts[0].lr = lib_sched(&warm);
    opts[2].lr = lib_sched(&warm);
    const char *names[3] = { "adam", "sgd nesterov", "adamw" };

    for (int j = 0; j < 3; j++) {
        /* reset(t, 0, 1): the optimizer restarts; the parameters are kept. */
        rig r;
        rig_model(&r, P_MIXED, 4, 0.5, 1.5, 1.0);
        r.t = rig_compile(&r, opts[j]);
        tg_train *fresh = rig_compile(&r, opts[j]), *cont = rig_compile(&r, opts[j]);
        if (!r.t || !fresh || !cont) { tg_destroy(fresh); tg_destroy(cont); rig_free(&r); continue; }
        for (int s = 0; s < 4; s++) {
            CHECK(rig_step(&r, r.t, s).status == TG_OK, "%s reset: step", names[j]);
            CHECK(rig_step(&r, cont, s).status == TG_OK, "%s reset: step", names[j]);
        }
        float before[MAXP][MAXN], after[MAXP][MAXN], q[MAXP][MAXN], f[MAXP][MAXN], c[MAXP][MAXN];
        get_params_f(&r, r.t, before);
        tg_reset(r.t, 0, 1);
        get_params_f(&r, r.t, after);
        CHECK(same_params(before, after, &r), "%s: tg_reset(t, 0, 1) changed the parameters", names[j]);
        CHECK(tg_train_step_count(r.t) == 0, "%s: step count %lld after reset", names[j], (long long)tg_train_step_count(r.t));
        double lr1 = opts[j].kind == TG_OPT_SGD ? 0.05 : hs_at(&warm, 1);
        CHECK_NEAR(tg_train_lr(r.t), lr1, 1e-15, 1e-12, "%s: lr after reset %.9g, want lr(1) %.9g", names[j], tg_train_lr(r.t), lr1);

        /* A fresh handle started from the same parameters follows the same trajectory. */
        put_params_f(&r, fresh, after);
        for (int s = 4; s < 8; s++) {
            tg_result a = rig_step(&r, r.t, s), b = rig_step(&r, fresh, s);
            CHECK(a.status == TG_OK && b.status == TG_OK, "%s reset: step", names[j]);
            CHECK(a.step == s - 3, "%s: step after reset reports %lld, want %d", names[j], (long long)a.step, s - 3);
            CHECK(a.loss == b.loss, "%s: loss after reset %.9g vs fresh %.9g", names[j], a.loss, b.loss);
            CHECK(rig_step(&r, cont, s).status == TG_OK, "%s reset: step", names[j]);
        }
        get_params_f(&r, r.t, q);
        get_params_f(&r, fresh, f);
        get_params_f(&r, cont, c);
        CHECK(same_params(q, f, &r), "%s: trajectory after tg_reset(t, 0, 1) differs from a fresh run", names[j]);
        /* Sanity: without the reset the trajectory is different (the test can tell). */
        CHECK(!same_params(q, c, &r), "%s: reset made no difference", names[j]);
        tg_destroy(fresh);
        tg_destroy(cont);
        rig_free(&r);
    }

    /* reset(t, 1, 0): parameters back to the seeded init; the optimizer carries on. */
    rig r;
    rig_model(&r, P_MIXED, 4, 0.5, 1.5, 1.0);
    r.t = rig_compile(&r, tg_adam(0.05));
    tg_train *twin = rig_compile(&r, tg_adam(0.05));
    if (r.t && twin) {
        float init[MAXP][MAXN], now[MAXP][MAXN], other[MAXP][MAXN];
        get_params_f(&r, r.t, init);
        for (int s = 0; s < 3; s++) {
            CHECK(rig_step(&r, r.t, s).status == TG_OK, "reset params: step");
            CHECK(rig_step(&r, twin, s).status == TG_OK, "reset params: step");
        }
        get_params_f(&r, r.t, now);
        CHECK(!same_params(init, now, &r), "reset params: training did not move the parameters");
        tg_reset(r.t, 1, 0);
        get_params_f(&r, r.t, now);
        CHECK(same_params(init, now, &r), "tg_reset(t, 1, 0) did not restore the initial values");
        CHECK(now[0][2] == LIT5[2] && now[2][1] == 1.0f && now[3][0] == 0.0f, "reset params: literal/ones/zeros values");
        CHECK(tg_train_step_count(r.t) == 3, "tg_reset(t, 1, 0) changed the step count to %lld",
              (long long)tg_train_step_count(r.t));
        /* A new model with the same seed and declarations gives the same values. */
        rig r2;
        rig_model(&r2, P_MIXED, 4, 0.5, 1.5, 1.0);
        r2.t = rig_compile(&r2, tg_sgd(0.1, 0, 0, 0));
        if (r2.t) {
            get_params_f(&r2, r2.t, other);
            CHECK(same_params(init, other, &r), "reset params: seeded init differs from a new model with the same seed");
        }
        rig_free(&r2);
        /* The optimizer state was kept: step 4 equals a twin's step 4 from the same parameters. */
        put_params_f(&r, twin, init);
        CHECK(rig_step(&r, r.t, 3).status == TG_OK && rig_step(&r, twin, 3).status == TG_OK, "reset params: step 4");
        get_params_f(&r, r.t, now);
        get_params_f(&r, twin, other);
        CHECK(same_params(now, other, &r), "tg_reset(t, 1, 0) also reset the optimizer state");

        /* reset(t, 1, 1): exactly a fresh start. */
        tg_train *fresh = rig_compile(&r, tg_adam(0.05));
        tg_reset(r.t, 1, 1);
        CHECK(tg_train_step_count(r.t) == 0, "tg_reset(t, 1, 1): step count");
        for (int s = 0; s < 4 && fresh; s++) {
            tg_result a = rig_step(&r, r.t, s), b = rig_step(&r, fresh, s);
            CHECK(a.status == TG_OK && b.status == TG_OK && a.loss == b.loss && a.step == b.step,
                  "tg_reset(t, 1, 1): step %d differs from a fresh handle", s + 1);
        }
        if (fresh) {
            get_params_f(&r, r.t, now);
            get_params_f(&r, fresh, other);
            CHECK(same_params(now, other, &r), "tg_reset(t, 1, 1): parameters differ from a fresh handle");
        }
        tg_destroy(fresh);
    }
    tg_destroy(twin);
    rig_free(&r);
}

int main(void) {
    verbose = getenv("TG_VERBOSE") != NULL;
    /* Literal start values away from zero (|p| in [0.5, 2]) so that the checks are relative. */
    for (int i = 0; i < 5; i++) {
        LIT5[i] = (float)((i % 2 ? -1 : 1) * check_uniform(0.5, 2.0));
        LIT5B[i] = (float)((i % 2 ? 1 : -1) * check_uniform(0.5, 2.0));
        SMALL5[i] = (float)check_uniform(-0.05, 0.05);
    }
    for (int i = 0; i < 3; i++) LIT3[i] = (float)((i % 2 ? -1 : 1) * check_uniform(0.5, 2.0));

    test_constructors();
    test_schedule_values();
    test_adam();
    test_adamw();
    test_sgd();
    test_clip();
    test_schedule_training();
    test_live_changes();
    test_reset();
    if (verbose) printf("max relative error: per step %.3g, whole trajectory %.3g\n", max_err_step, max_err_traj);
    return check_report("test_optim");
}
