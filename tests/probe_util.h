/* Shared by the op tests (test_ops.c, test_grad.c, test_ops_more.c), which all drive the
 * reference interpreter (tg_probe): input specs and their random filling, host tensors for the
 * naive float64 references, the forward comparison in f64 and emulated f32, and the central
 * finite-difference gradient check. Each test keeps its own op table, reference and tolerances'
 * reasons; what is here is the machinery they had copied.
 *
 * Header-only (static functions) because each tests/test_*.c is built as its own program.
 * Include after "internal.h" and "check.h". */
#ifndef TG_PROBE_UTIL_H
#define TG_PROBE_UTIL_H
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The most inputs a case declares: up to 6 op inputs, plus the loss weight W of a gradient case. */
#define PROBE_MAXIN 7
/* The most model parameters a forward case copies in. */
#define PROBE_MAXPARAM 32

/* ---------------------------------------------------------------------------------------------
 * Inputs: a declaration plus how to fill it. Every value is float-representable so that the
 * f32 runs see exactly the same inputs.
 * ------------------------------------------------------------------------------------------- */

typedef enum {
    F_UNI,       /* uniform in [lo, hi] */
    F_AWAY,      /* random sign times uniform in [lo, hi] (lo > 0: away from zero) */
    F_QUANT,     /* one of -1, -0.5, 0, 0.5, 1 (ties between operands, exact zeros, exact bounds) */
    F_COND,      /* 0 with probability 0.4, else uniform in [lo, hi] (a where condition) */
    F_DISTINCT,  /* a shuffle of n evenly spaced values in [lo, hi]: distinct by a margin */
    F_INT        /* integers lo..hi inclusive (i32 inputs) */
} fillk;
/* zero: the input must get an exactly zero gradient (no finite differences for it). */
typedef struct { tg_input_decl d; fillk fill; double lo, hi; bool zero; } inspec;
#define FIN(nm, lo, hi, ...) { TG_F32(nm, __VA_ARGS__), F_UNI, lo, hi, false }
#define AIN(nm, lo, hi, ...) { TG_F32(nm, __VA_ARGS__), F_AWAY, lo, hi, false }
#define QIN(nm, ...)         { TG_F32(nm, __VA_ARGS__), F_QUANT, 0, 0, false }
#define DIN(nm, lo, hi, ...) { TG_F32(nm, __VA_ARGS__), F_DISTINCT, lo, hi, false }
#define ZIN(nm, lo, hi, ...) { TG_F32(nm, __VA_ARGS__), F_UNI, lo, hi, true }
/* A where condition: never differentiable, so it must get an exactly zero gradient. */
#define CIN(nm, ...)         { TG_F32(nm, __VA_ARGS__), F_COND, -2, 2, true }
#define IIN(nm, lo, hi, ...) { TG_I32(nm, __VA_ARGS__), F_INT, lo, hi, false }

static inline double f32r(double v) { return (double)(float)v; }

/* Draws from check.h's deterministic stream; the number of draws per kind is fixed, so a test's
 * inputs depend only on the order of its fills. */
static inline void fill(const inspec *s, double *v, int64_t n) {
    if (s->fill == F_DISTINCT) {
        for (int64_t i = 0; i < n; i++) v[i] = f32r(n > 1 ? s->lo + (s->hi - s->lo) * (double)i / (double)(n - 1) : s->lo);
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)(check_next() % (uint64_t)(i + 1));
            double t = v[i]; v[i] = v[j]; v[j] = t;
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        switch (s->fill) {
        case F_UNI: v[i] = f32r(check_uniform(s->lo, s->hi)); break;
        case F_AWAY: v[i] = f32r(check_uniform(s->lo, s->hi)) * (check_uniform(0, 1) < 0.5 ? -1 : 1); break;
        case F_QUANT: v[i] = -1 + 0.5 * floor(check_uniform(0, 5)); break;
        case F_COND: v[i] = check_uniform(0, 1) < 0.4 ? 0 : f32r(check_uniform(s->lo, s->hi)); break;
        case F_INT: v[i] = floor(check_uniform(s->lo, s->hi + 1)); if (v[i] > s->hi) v[i] = s->hi; break;
        default: break;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Shapes and host tensors (for the naive float64 references)
 * ------------------------------------------------------------------------------------------- */

static inline int64_t nel(tg_shape s) { return tg_numel(s); }
static inline bool same_shape(tg_shape a, tg_shape b) {
    if (a.ndim != b.ndim) return false;
    for (int i = 0; i < a.ndim; i++) if (a.d[i] != b.d[i]) return false;
    return true;
}
/* Not `inline`, unlike the rest: inlined into callers' snprintf(what, ...) it makes gcc's
 * -Wformat-truncation (an error here) flag descriptions that are meant to be cut short. */
static __attribute__((unused)) char *shape_s(tg_shape s, char *buf) {   /* buf: at least 96 bytes */
    int k = sprintf(buf, "[");
    for (int i = 0; i < s.ndim; i++) k += sprintf(buf + k, "%s%lld", i ? "," : "", (long long)s.d[i]);
    sprintf(buf + k, "]");
    return buf;
}

typedef struct { tg_shape s; double *v; } ht;
/* One spare element: a shape with a zero extent still gets a pointer that free() and the
 * references can use. */
static inline ht ht_new(tg_shape s) { ht t = { s, calloc((size_t)nel(s) + 1, sizeof(double)) }; return t; }

/* outer x n x inner split of a shape around axis ax */
static inline void split_around(tg_shape s, int ax, int64_t *outer, int64_t *n, int64_t *inner) {
    *outer = *inner = 1;
    for (int i = 0; i < ax; i++) *outer *= s.d[i];
    *n = s.d[ax];
    for (int i = ax + 1; i < s.ndim; i++) *inner *= s.d[i];
}

/* ---------------------------------------------------------------------------------------------
 * Forward cases: the inputs and parameters are filled once on the host (the reference reads
 * them), then copied into a probe per precision, whose output is compared element by element.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    int n_in, np;
    ht x[PROBE_MAXIN];
    tg_input_decl decl[PROBE_MAXIN];
    double *pv[PROBE_MAXPARAM];   /* parameter values by id; params past PROBE_MAXPARAM stay NULL */
} host_case;

/* Fills the inputs from ins, then every parameter of m uniform in [-1.5, 1.5]. */
static inline void host_case_fill(host_case *h, tg_model *m, int n_in, const inspec *ins) {
    memset(h, 0, sizeof *h);
    h->n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        h->decl[i] = ins[i].d;
        h->x[i] = ht_new(ins[i].d.shape);
        fill(&ins[i], h->x[i].v, nel(h->x[i].s));
    }
    h->np = tg_model_n_params(m);
    for (int k = 0; k < h->np && k < PROBE_MAXPARAM; k++) {
        tg_shape ps = tg_model_param_shape(m, k);
        h->pv[k] = calloc((size_t)nel(ps), sizeof(double));
        inspec u = FIN("p", -1.5, 1.5, 1);
        fill(&u, h->pv[k], nel(ps));
    }
}
static inline void host_case_free(host_case *h) {
    for (int i = 0; i < h->n_in; i++) free(h->x[i].v);
    for (int k = 0; k < h->np && k < PROBE_MAXPARAM; k++) free(h->pv[k]);
}

/* Runs fn over the host case in double (f64) and with every f32 node rounded to float (f32) and
 * compares the output's shape and every element with want, to tol64 / tol32 by check_close. An
 * element equal to want also passes: check_close cannot match infinities (inf - inf is NaN).
 * seed: for tg_probe_set_seed (it matters only to graphs with randn/dropout). want_dtype: the
 * output dtype to check, or -1 for none. */
static inline void probe_compare_forward(const char *what, tg_model *m, tg_forward_fn fn, const void *ctx,
                                         const host_case *h, ht want, int want_dtype, uint64_t seed,
                                         double tol64, double tol32) {
    for (int mode = 0; mode < 2; mode++) {
        bool f32 = mode == 1;
        double tol = f32 ? tol32 : tol64;
        const char *mname = f32 ? "f32" : "f64";
        tg_error err;
        memset(&err, 0, sizeof err);
        tg_probe *p = tg_probe_new(m, fn, ctx, h->decl, h->n_in, false, f32, &err);
        CHECK(p != NULL, "%s [%s]: tg_probe_new failed: %s", what, mname, err.msg);
        if (!p) continue;
        for (int i = 0; i < h->n_in; i++) memcpy(tg_probe_input(p, i), h->x[i].v, (size_t)nel(h->x[i].s) * sizeof(double));
        for (int k = 0; k < h->np && k < PROBE_MAXPARAM; k++) {
            double *dst = tg_probe_param(p, k);
            if (dst) memcpy(dst, h->pv[k], (size_t)nel(tg_model_param_shape(m, k)) * sizeof(double));
        }
        tg_probe_set_seed(p, seed);
        tg_probe_run(p);
        tg_shape gs = tg_probe_output_shape(p);
        char b1[96], b2[96];
        CHECK(same_shape(gs, want.s), "%s [%s]: output shape %s, want %s", what, mname, shape_s(gs, b1), shape_s(want.s, b2));
        if (want_dtype >= 0) {
            const tg_graph *g = tg_probe_graph(p);
            tg_dtype got_dt = tg_graph_node(g, tg_graph_output(g)).dtype;
            CHECK(got_dt == (tg_dtype)want_dtype, "%s [%s]: output dtype %s, want %s", what, mname,
                  got_dt == TG_INT32 ? "i32" : "f32", want_dtype == TG_INT32 ? "i32" : "f32");
        }
        if (same_shape(gs, want.s)) {
            const double *got = tg_probe_output(p);
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < nel(want.s); i++)
                if (got[i] != want.v[i] && !check_close(got[i], want.v[i], tol)) { bad++; if (first < 0) first = i; }
            CHECK(bad == 0, "%s [%s]: %lld of %lld elements differ; first [%lld]: got %.17g want %.17g",
                  what, mname, (long long)bad, (long long)nel(want.s), (long long)first,
                  first >= 0 ? got[first] : 0.0, first >= 0 ? want.v[first] : 0.0);
        }
        tg_probe_free(p);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Gradients by central finite differences in double precision
 *
 * Every element of every f32 input and of every parameter the graph uses is perturbed by +-H and
 * the central difference n = (f(x+H) - f(x-H)) / 2H is compared with the analytic gradient a:
 *
 *     |a - n| / max(|a|, |n|, GRAD_FLOOR) <= GRAD_TOL
 *
 * The floor allows an absolute GRAD_TOL * GRAD_FLOOR = 1e-9 where the true gradient is ~0: there
 * the central difference carries a rounding noise of about eps * |loss| / H ~ 1e-10..1e-9.
 * ------------------------------------------------------------------------------------------- */

#define GRAD_H 1e-6
#define GRAD_TOL 1e-4
#define GRAD_FLOOR 1e-5

/* What the finite-difference checks covered, for the tests' summary lines. */
static struct {
    int cases;
    int64_t elements;
    double worst_err;
    char worst_what[240];
} fd_stats;

/* Compares one gradient tensor `an` (copied before perturbing) with central differences of the
 * loss in v[0..n), then runs the probe once more at the unperturbed point. */
static inline void fd_compare(const char *what, const char *which, tg_probe *p, double *v, const double *an, int64_t n) {
    int64_t bad = 0, first = -1;
    double worst = 0, fa = 0, fn = 0;
    for (int64_t i = 0; i < n; i++) {
        double x0 = v[i];
        v[i] = x0 + GRAD_H;
        tg_probe_run(p);
        double fp = tg_probe_output(p)[0];
        v[i] = x0 - GRAD_H;
        tg_probe_run(p);
        double fm = tg_probe_output(p)[0];
        v[i] = x0;
        double num = (fp - fm) / (2 * GRAD_H), a = an[i];
        double den = fmax(fmax(fabs(a), fabs(num)), GRAD_FLOOR), e = fabs(a - num) / den;
        if (!(e <= GRAD_TOL)) { bad++; if (first < 0) { first = i; fa = a; fn = num; } }
        if (e > worst || e != e) worst = e;
    }
    tg_probe_run(p);   /* back to the unperturbed point: later gradients are read from this run */
    fd_stats.elements += n;
    if (worst > fd_stats.worst_err) {
        fd_stats.worst_err = worst;
        snprintf(fd_stats.worst_what, sizeof fd_stats.worst_what, "%s, %s", what, which);
    }
    CHECK(bad == 0, "%s: d/d%s: %lld of %lld elements off (worst rel err %.3g); first [%lld]: analytic %.12g numeric %.12g",
          what, which, (long long)bad, (long long)n, worst, (long long)first, fa, fn);
}

/* A probe over fn with inputs filled from ins and every used parameter uniform in [-1.5, 1.5],
 * seeded and run once. */
static inline tg_probe *make_probe(const char *what, tg_model *m, tg_forward_fn fn, const void *ctx, int n_in,
                                   const inspec *ins, bool grads, bool f32, uint64_t seed) {
    tg_input_decl decl[PROBE_MAXIN] = { { 0 } };   /* (initialised: gcc -O1 -fsanitize warns otherwise) */
    for (int i = 0; i < n_in; i++) decl[i] = ins[i].d;
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, fn, ctx, decl, n_in, grads, f32, &err);
    CHECK(p != NULL, "%s: tg_probe_new failed: %s", what, err.msg);
    if (!p) return NULL;
    for (int i = 0; i < n_in; i++) fill(&ins[i], tg_probe_input(p, i), nel(ins[i].d.shape));
    for (int k = 0; k < tg_model_n_params(m); k++) {
        double *pv = tg_probe_param(p, k);
        inspec u = FIN("p", -1.5, 1.5, 1);
        if (pv) fill(&u, pv, nel(tg_model_param_shape(m, k)));
    }
    tg_probe_set_seed(p, seed);
    tg_probe_run(p);
    return p;
}

/* Checks the gradient of every f32 input (exactly zero where the spec says so; i32 inputs must
 * have none) and of every used parameter. Returns the probe (run at the unperturbed point) when
 * keep is set, else frees it. */
static inline tg_probe *gradcheck(const char *what, tg_model *m, tg_forward_fn fn, const void *ctx, int n_in,
                                  const inspec *ins, uint64_t seed, bool keep) {
    tg_probe *p = make_probe(what, m, fn, ctx, n_in, ins, true, false, seed);
    if (!p) return NULL;
    fd_stats.cases++;
    char b1[96];
    tg_shape os = tg_probe_output_shape(p);
    CHECK(os.ndim == 0, "%s: loss shape %s, want []", what, shape_s(os, b1));
    CHECK(isfinite(tg_probe_output(p)[0]), "%s: loss %g", what, tg_probe_output(p)[0]);
    for (int i = 0; i < n_in; i++) {
        const double *g = tg_probe_input_grad(p, i);
        int64_t n = nel(ins[i].d.shape);
        char which[64];
        snprintf(which, sizeof which, "input %s", ins[i].d.name);
        if (ins[i].d.dtype == TG_INT32) {
            CHECK(g == NULL, "%s: i32 %s has a gradient", what, which);
            continue;
        }
        CHECK(g != NULL, "%s: no gradient for %s", what, which);
        if (!g) continue;
        double *an = malloc((size_t)n * sizeof(double));
        memcpy(an, g, (size_t)n * sizeof(double));
        if (ins[i].zero) {
            int64_t nz = 0;
            for (int64_t k = 0; k < n; k++) nz += an[k] != 0.0;
            CHECK(nz == 0, "%s: %s must get an exactly zero gradient; %lld of %lld elements nonzero", what, which,
                  (long long)nz, (long long)n);
        } else {
            fd_compare(what, which, p, tg_probe_input(p, i), an, n);
        }
        free(an);
    }
    for (int k = 0; k < tg_model_n_params(m); k++) {
        double *pv = tg_probe_param(p, k);
        const double *g = tg_probe_param_grad(p, k);
        CHECK((pv == NULL) == (g == NULL), "%s: param %s: value %p but gradient %p", what, tg_model_param_name(m, k),
              (void *)pv, (const void *)g);
        if (!pv || !g) continue;
        int64_t n = nel(tg_model_param_shape(m, k));
        double *an = malloc((size_t)n * sizeof(double));
        memcpy(an, g, (size_t)n * sizeof(double));
        char which[96];
        snprintf(which, sizeof which, "param %s", tg_model_param_name(m, k));
        fd_compare(what, which, p, pv, an, n);
        free(an);
    }
    tg_probe_run(p);
    if (keep) return p;
    tg_probe_free(p);
    return NULL;
}

/* loss = sum(fn(ctx, in[0..n)) * in[n]): a scalar in which every output element of fn matters. */
typedef struct { tg_forward_fn fn; const void *ctx; int n; } wctx;
static inline tg_tensor weighted_loss(const void *vc, const tg_tensor *in) {
    const wctx *w = vc;
    return tg_sum(tg_mul(w->fn(w->ctx, in), in[w->n]), TG_ALL, 0);
}

/* An op case: find fn's output shape, add an input W of that shape (+-[0.5, 1.5]), and check the
 * gradients of sum(fn * W). model NULL: a fresh one. Returns the probe when keep is set. */
static inline tg_probe *op_gradcheck(const char *what, tg_forward_fn fn, const void *ctx, tg_model *model, int n_in,
                                     const inspec *ins, uint64_t seed, bool keep) {
    tg_model *m = model ? model : tg_model_new(3);
    tg_input_decl decl[PROBE_MAXIN] = { { 0 } };   /* (initialised: gcc -O1 -fsanitize warns otherwise) */
    for (int i = 0; i < n_in; i++) decl[i] = ins[i].d;
    tg_error err;
    memset(&err, 0, sizeof err);
    tg_probe *p = tg_probe_new(m, fn, ctx, decl, n_in, false, false, &err), *kept = NULL;
    CHECK(p != NULL, "%s: tg_probe_new (forward only) failed: %s", what, err.msg);
    if (p) {
        tg_shape os = tg_probe_output_shape(p);
        tg_probe_free(p);
        if (os.ndim == 0) os = TG_SHAPE(1);   /* W [1] broadcasts against a scalar output */
        inspec all[PROBE_MAXIN];
        memcpy(all, ins, (size_t)n_in * sizeof *all);
        all[n_in] = (inspec){ { "W", TG_FLOAT32, os }, F_AWAY, 0.5, 1.5, false };
        wctx w = { fn, ctx, n_in };
        kept = gradcheck(what, m, weighted_loss, &w, n_in + 1, all, seed, keep);
    }
    if (!model) tg_model_free(m);
    return kept;
}
#endif
