/* Error paths: every one returns an error value (NULL, TG_FAILED, a message) and never aborts, and
 * the objects involved stay usable afterwards. Trace-time shape errors name this file and the
 * line of the op call (checked against __LINE__ recorded on the same line) and the shapes. */
#include "tensorgrad.h"
#include "check.h"

#include <stdlib.h>
#include <string.h>

static tg_error err;

static int has(const char *msg, const char *part) { return msg && strstr(msg, part) != NULL; }

/* "test_errors.c:LINE" */
static const char *site_str(int line) {
    static char buf[64];
    snprintf(buf, sizeof buf, "test_errors.c:%d", line);
    return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Trace-time errors. One forward function, one case per op; inputs x [4,3], y [4,5], idx i32 [4];
 * parameter W [4,10].
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    BAD_MATMUL, BAD_MATMUL_BATCH, BAD_ADD, BAD_MUL, BAD_SUB, BAD_WHERE, BAD_SUM_AXIS, BAD_MEAN_AXIS, BAD_SOFTMAX_AXIS,
    BAD_RESHAPE_COUNT, BAD_RESHAPE_TWO_FREE, BAD_PERMUTE_DUP, BAD_PERMUTE_LEN, BAD_SWAPAXES, BAD_CROSS_ENTROPY,
    BAD_NOT_SCALAR, BAD_TWO_ERRORS, GOOD
} bad_kind;

typedef struct { bad_kind kind; tg_param W; } bad_ctx;
static int bad_line, second_line;

static tg_tensor bad_forward(const void *ctx, const tg_tensor *in) {
    const bad_ctx *c = ctx;
    tg_tensor x = in[0], y = in[1], idx = in[2], W = tg_p(c->W), r;
    switch (c->kind) {
    case BAD_MATMUL: bad_line = __LINE__; r = tg_matmul(x, W); break;                     /* [4,3] x [4,10] */
    case BAD_MATMUL_BATCH: bad_line = __LINE__; r = tg_matmul(tg_reshape(y, 2, 2, 5), tg_reshape(x, 3, 4)); break;
    case BAD_ADD: bad_line = __LINE__; r = tg_add(x, y); break;                           /* [4,3] + [4,5] */
    case BAD_MUL: bad_line = __LINE__; r = tg_mul(y, x); break;
    case BAD_SUB: bad_line = __LINE__; r = tg_sub(x, tg_reshape(W, 10, 4)); break;        /* [4,3] - [10,4] */
    case BAD_WHERE: bad_line = __LINE__; r = tg_where(x, x, y); break;
    case BAD_SUM_AXIS: bad_line = __LINE__; r = tg_sum(x, 2, 0); break;
    case BAD_MEAN_AXIS: bad_line = __LINE__; r = tg_mean(x, -3, 1); break;
    case BAD_SOFTMAX_AXIS: bad_line = __LINE__; r = tg_softmax(x, 5); break;
    case BAD_RESHAPE_COUNT: bad_line = __LINE__; r = tg_reshape(x, 5, 2); break;          /* 12 elements into 10 */
    case BAD_RESHAPE_TWO_FREE: bad_line = __LINE__; r = tg_reshape(x, -1, -1); break;
    case BAD_PERMUTE_DUP: bad_line = __LINE__; r = tg_permute(x, 0, 0); break;
    case BAD_PERMUTE_LEN: bad_line = __LINE__; r = tg_permute(x, 1, 0, 2); break;
    case BAD_SWAPAXES: bad_line = __LINE__; r = tg_swapaxes(x, 0, 2); break;
    case BAD_CROSS_ENTROPY: {
        tg_tensor logits = tg_reshape(x, 3, 4);    /* 3 rows, 4 targets */
        bad_line = __LINE__; return tg_cross_entropy(logits, idx, TG_MEAN);
    }
    case BAD_NOT_SCALAR: bad_line = __LINE__; return tg_matmul(x, tg_reshape(W, 10, 4)); /* wrong: [4,3] x [10,4] */
    case BAD_TWO_ERRORS: {
        /* Only the first error is kept, later ones (and ops on invalid tensors) add nothing. */
        bad_line = __LINE__; tg_tensor a = tg_matmul(x, W);
        second_line = __LINE__; tg_tensor b = tg_add(x, y);
        r = tg_add(a, b);
        break;
    }
    case GOOD: default: r = tg_matmul(tg_swapaxes(x, 0, 1), W); break;              /* [3,4] x [4,10] */
    }
    return tg_sum(r, TG_ALL, 0);
}

/* A non-scalar loss from valid ops. */
static tg_tensor vector_forward(const void *ctx, const tg_tensor *in) {
    const bad_ctx *c = ctx;
    return tg_matmul(tg_swapaxes(in[0], 0, 1), tg_p(c->W));   /* [3,10] */
}

static const struct { bad_kind kind; const char *label; const char *parts[4]; } bad_cases[] = {
    { BAD_MATMUL, "matmul", { "matmul", "[4,3]", "[4,10]" } },
    { BAD_MATMUL_BATCH, "batched matmul", { "matmul", "[2,2,5]", "[3,4]" } },
    { BAD_ADD, "add broadcast", { "add", "[4,3]", "[4,5]" } },
    { BAD_MUL, "mul broadcast", { "mul", "[4,5]", "[4,3]" } },
    { BAD_SUB, "sub broadcast", { "sub", "[4,3]", "[10,4]" } },
    { BAD_WHERE, "where broadcast", { "where" } },
    { BAD_SUM_AXIS, "sum axis", { "sum", "axis" } },
    { BAD_MEAN_AXIS, "mean axis", { "mean", "axis" } },
    { BAD_SOFTMAX_AXIS, "softmax axis", { "softmax", "axis" } },
    { BAD_RESHAPE_COUNT, "reshape count", { "reshape", "[4,3]", "[5,2]" } },
    { BAD_RESHAPE_TWO_FREE, "reshape two -1", { "reshape" } },
    { BAD_PERMUTE_DUP, "permute duplicate", { "permute" } },
    { BAD_PERMUTE_LEN, "permute length", { "permute" } },
    { BAD_SWAPAXES, "swapaxes axis", { "swapaxes" } },
    { BAD_CROSS_ENTROPY, "cross_entropy targets", { "cross_entropy" } },
    { BAD_NOT_SCALAR, "matmul in a loss", { "matmul", "[4,3]", "[10,4]" } },
    { BAD_TWO_ERRORS, "first error kept", { "matmul", "[4,3]", "[4,10]" } },
};

static tg_model *bad_model(bad_ctx *c) {
    tg_model *m = tg_model_new(1);
    c->W = tg_param_new(m, "W", TG_SHAPE(4, 10), tg_init_randn(0.1));
    return m;
}

static tg_train *bad_compile(tg_model *m, bad_ctx *c, tg_forward_fn fn) {
    const tg_input_decl in[] = { TG_F32("x", 4, 3), TG_F32("y", 4, 5), TG_I32("idx", 4) };
    memset(&err, 0, sizeof err);
    return tg_compile(&(tg_train_spec){ .model = m, .loss = fn, .ctx = c, .inputs = in, .n_inputs = 3,
                                       .optimizer = tg_adam(0.01) }, &err);
}

static float X[12], Y[20];
static int32_t IDX[4] = { 0, 1, 2, 0 };
#define BAD_DATA (tg_data[]){ tg_f32("x", X, 12), tg_f32("y", Y, 20), tg_i32("idx", IDX, 4) }, 3

/* The model is still usable: a good graph compiles and steps. */
static void check_good_after(tg_model *m, bad_ctx *c, const char *after) {
    c->kind = GOOD;
    tg_train *t = bad_compile(m, c, bad_forward);
    CHECK(t != NULL, "after %s: good compile failed: %s", after, err.msg);
    if (t) {
        tg_result r = tg_step(t, BAD_DATA);
        CHECK(r.status == TG_OK && r.step == 1, "after %s: good step failed: %s", after, r.error);
    }
    tg_destroy(t);
}

static void test_trace_errors(void) {
    for (int i = 0; i < 12; i++) X[i] = (float)check_uniform(-1, 1);
    for (int i = 0; i < 20; i++) Y[i] = (float)check_uniform(-1, 1);
    bad_ctx c;
    tg_model *m = bad_model(&c);
    for (size_t k = 0; k < sizeof bad_cases / sizeof bad_cases[0]; k++) {
        const char *label = bad_cases[k].label;
        c.kind = bad_cases[k].kind;
        bad_line = second_line = -1;
        tg_train *t = bad_compile(m, &c, bad_forward);
        CHECK(t == NULL, "%s: compile succeeded", label);
        tg_destroy(t);
        CHECK(bad_line > 0, "%s: the forward was not traced", label);
        if (getenv("TG_VERBOSE")) printf("%-22s %s\n", label, err.msg);
        CHECK(has(err.msg, site_str(bad_line)), "%s: message lacks %s: \"%s\"", label, site_str(bad_line), err.msg);
        for (int j = 0; j < 4 && bad_cases[k].parts[j]; j++)
            CHECK(has(err.msg, bad_cases[k].parts[j]), "%s: message lacks \"%s\": \"%s\"", label, bad_cases[k].parts[j], err.msg);
        if (second_line > 0)
            CHECK(!has(err.msg, site_str(second_line)), "%s: message names the second error: \"%s\"", label, err.msg);
        check_good_after(m, &c, label);
    }

    /* A loss that is not a scalar. */
    tg_train *t = bad_compile(m, &c, vector_forward);
    CHECK(t == NULL, "non-scalar loss compiled");
    CHECK(has(err.msg, "scalar"), "non-scalar loss: message \"%s\"", err.msg);
    tg_destroy(t);
    check_good_after(m, &c, "non-scalar loss");

    /* err may be NULL. */
    c.kind = BAD_MATMUL;
    const tg_input_decl in[] = { TG_F32("x", 4, 3), TG_F32("y", 4, 5), TG_I32("idx", 4) };
    t = tg_compile(&(tg_train_spec){ .model = m, .loss = bad_forward, .ctx = &c, .inputs = in, .n_inputs = 3,
                                    .optimizer = tg_adam(0.01) }, NULL);
    CHECK(t == NULL, "bad compile with a NULL error buffer succeeded");
    tg_destroy(t);

    /* The same errors through tg_attach; the training handle is unaffected. */
    c.kind = GOOD;
    t = bad_compile(m, &c, bad_forward);
    CHECK(t != NULL, "good compile: %s", err.msg);
    if (t) {
        bad_ctx fc = c;
        fc.kind = BAD_ADD;
        memset(&err, 0, sizeof err);
        tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = bad_forward, .ctx = &fc, .inputs = in, .n_inputs = 3 }, &err);
        CHECK(f == NULL, "attach of a bad forward succeeded");
        CHECK(has(err.msg, site_str(bad_line)) && has(err.msg, "[4,3]") && has(err.msg, "[4,5]"),
              "attach error message \"%s\" (want %s)", err.msg, site_str(bad_line));
        tg_result r = tg_step(t, BAD_DATA);
        CHECK(r.status == TG_OK && r.step == 1, "step after a failed attach: %s", r.error);
        fc.kind = GOOD;
        f = tg_attach(t, &(tg_forward_spec){ .forward = bad_forward, .ctx = &fc, .inputs = in, .n_inputs = 3 }, &err);
        CHECK(f != NULL, "good attach after a failed one: %s", err.msg);
        if (f) CHECK(tg_run(f, BAD_DATA).status == TG_OK, "run after a failed attach");
    }
    tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Parameter declaration errors
 * ------------------------------------------------------------------------------------------- */
typedef struct { tg_param p; } one_param;
static tg_tensor one_param_loss(const void *ctx, const tg_tensor *in) {
    const one_param *o = ctx;
    return tg_sum(tg_mul(tg_p(o->p), in[0]), TG_ALL, 0);
}

static void test_param_errors(void) {
    static const float lit[3] = { 1, 2, 3 };
    tg_model *m = tg_model_new(3);
    CHECK(tg_model_error(m) == NULL, "fresh model has an error: %s", tg_model_error(m));
    tg_param a = tg_param_new(m, "block.weight", TG_SHAPE(3), tg_init_randn(0));
    tg_param b = tg_param_new(m, "block.weight", TG_SHAPE(3), tg_init_zeros());
    CHECK(a.id >= 0, "first param invalid");
    CHECK(b.id < 0, "duplicate name accepted (id %d)", b.id);
    CHECK(has(tg_model_error(m), "block.weight"), "duplicate: model error \"%s\"", tg_model_error(m));
    /* The same through scopes. */
    tg_model_push(m, "block");
    tg_param b2 = tg_param_new(m, "weight", TG_SHAPE(3), tg_init_zeros());
    tg_model_pop(m);
    CHECK(b2.id < 0, "duplicate name through a scope accepted");
    /* A parameter that failed to declare cannot be used: the compile fails with a message. */
    one_param o = { b };
    const tg_input_decl in[] = { TG_F32("x", 3) };
    memset(&err, 0, sizeof err);
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = one_param_loss, .ctx = &o, .inputs = in, .n_inputs = 1,
                                              .optimizer = tg_sgd(0.1, 0, 0, 0) }, &err);
    CHECK(t == NULL && err.msg[0], "compile using an invalid parameter: %p \"%s\"", (void *)t, err.msg);
    tg_destroy(t);
    tg_model_free(m);

    static const struct { const char *label; tg_shape shape; int literal_n; } decl_cases[] = {
        { "literal too short", { 1, { 5 } }, 3 },
        { "literal too long", { 1, { 2 } }, 3 },
        { "negative dimension", { 2, { 3, -2 } }, 0 },
        { "too many dimensions", { TG_MAX_DIMS + 1, { 1, 1, 1, 1, 1, 1 } }, 0 },
        { "negative ndim", { -1, { 3 } }, 0 },
    };
    for (size_t k = 0; k < sizeof decl_cases / sizeof decl_cases[0]; k++) {
        tg_model *mm = tg_model_new(3);
        tg_init init = decl_cases[k].literal_n ? tg_init_literal(lit, (size_t)decl_cases[k].literal_n) : tg_init_ones();
        tg_param p = tg_param_new(mm, "bad", decl_cases[k].shape, init);
        CHECK(p.id < 0, "%s: accepted", decl_cases[k].label);
        CHECK(tg_model_error(mm) && tg_model_error(mm)[0], "%s: no model error", decl_cases[k].label);
        /* The model stays usable for further (good) declarations. */
        tg_param q = tg_param_new(mm, "good", TG_SHAPE(3), tg_init_literal(lit, 3));
        CHECK(q.id >= 0, "%s: a good declaration after the error failed", decl_cases[k].label);
        tg_model_free(mm);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Compile-time errors other than shapes
 * ------------------------------------------------------------------------------------------- */
static void test_compile_errors(void) {
    static const float lit[3] = { 1, 2, 3 };
    tg_model *m = tg_model_new(4);
    one_param o = { tg_param_new(m, "w", TG_SHAPE(3), tg_init_literal(lit, 3)) };
    const tg_input_decl good_in[] = { TG_F32("x", 3) };
    const tg_input_decl neg_in[] = { TG_F32("x", -3) };
    const tg_input_decl dup_in[] = { TG_F32("x", 3), TG_F32("x", 3) };
    tg_train_spec good = { .model = m, .loss = one_param_loss, .ctx = &o, .inputs = good_in, .n_inputs = 1,
                           .optimizer = tg_sgd(0.1, 0, 0, 0) };
    struct { const char *label; tg_train_spec spec; const char *part; } cases[7];
    int n = 0;
    cases[n].label = "no model"; cases[n].spec = good; cases[n].spec.model = NULL; cases[n++].part = NULL;
    cases[n].label = "no loss"; cases[n].spec = good; cases[n].spec.loss = NULL; cases[n++].part = NULL;
    cases[n].label = "inputs NULL"; cases[n].spec = good; cases[n].spec.inputs = NULL; cases[n++].part = NULL;
    cases[n].label = "negative input dim"; cases[n].spec = good; cases[n].spec.inputs = neg_in; cases[n++].part = "x";
    cases[n].label = "duplicate input"; cases[n].spec = good; cases[n].spec.inputs = dup_in; cases[n].spec.n_inputs = 2;
    cases[n++].part = "x";
    cases[n].label = "unknown backend"; cases[n].spec = good; cases[n].spec.backend = "no-such-backend";
    cases[n++].part = "no-such-backend";
    for (int k = 0; k < n; k++) {
        memset(&err, 0, sizeof err);
        tg_train *t = tg_compile(&cases[k].spec, &err);
        CHECK(t == NULL, "%s: compiled", cases[k].label);
        CHECK(err.msg[0] != 0, "%s: no message", cases[k].label);
        if (cases[k].part) CHECK(has(err.msg, cases[k].part), "%s: message \"%s\" lacks \"%s\"", cases[k].label, err.msg, cases[k].part);
        tg_destroy(t);
        t = tg_compile(&cases[k].spec, NULL);
        CHECK(t == NULL, "%s (no error buffer): compiled", cases[k].label);
        tg_destroy(t);
    }
    memset(&err, 0, sizeof err);
    CHECK(tg_compile(NULL, &err) == NULL && err.msg[0], "tg_compile(NULL)");
    CHECK(tg_compile(NULL, NULL) == NULL, "tg_compile(NULL, NULL)");
    tg_train *t = tg_compile(&good, &err);
    CHECK(t != NULL, "good compile after errors: %s", err.msg);
    if (t) CHECK(tg_step(t, (tg_data[]){ tg_f32("x", lit, 3) }, 1).status == TG_OK, "good step after compile errors");
    tg_destroy(t);
    tg_model_free(m);
}

/* ---------------------------------------------------------------------------------------------
 * Run-time errors
 * ------------------------------------------------------------------------------------------- */
typedef struct { tg_param p; } quad;
static tg_tensor quad_loss(const void *ctx, const tg_tensor *in) {
    const quad *q = ctx;
    tg_tensor p = tg_p(q->p);
    return tg_add(tg_sum(tg_mul(tg_mul(0.5, in[0]), tg_square(p)), TG_ALL, 0), tg_sum(tg_mul(in[1], p), TG_ALL, 0));
}
static tg_tensor quad_forward(const void *ctx, const tg_tensor *in) {
    const quad *q = ctx;
    return tg_mul(tg_p(q->p), in[0]);
}

static const float P0[5] = { 1.0f, -2.0f, 0.5f, 3.0f, -0.25f };
static float COEF[5] = { 1, 2, 0.5f, 1.5f, 1 }, OFFSET[5] = { 0.1f, -0.3f, 0.2f, 0.7f, -0.9f };
static const int32_t IOFFSET[5] = { 1, 2, 3, 4, 5 };

static tg_train *quad_compile(tg_model *m, quad *q) {
    const tg_input_decl in[] = { TG_F32("coef", 5), TG_F32("offset", 5) };
    memset(&err, 0, sizeof err);
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = quad_loss, .ctx = q, .inputs = in, .n_inputs = 2,
                                              .optimizer = tg_adam(0.1) }, &err);
    CHECK(t != NULL, "compile: %s", err.msg);
    return t;
}

static int params_are(tg_train *t, const float *want) {
    float p[5];
    if (tg_download_param(t, "weights", p, 5, NULL) != TG_OK) return 0;
    return memcmp(p, want, sizeof p) == 0;
}

static void test_step_errors(void) {
    tg_model *m = tg_model_new(5);
    quad q = { tg_param_new(m, "weights", TG_SHAPE(5), tg_init_literal(P0, 5)) };
    tg_train *t = quad_compile(m, &q), *fresh = quad_compile(m, &q);
    if (!t || !fresh) { tg_destroy(t); tg_destroy(fresh); tg_model_free(m); return; }

    float nan_offset[5], short_offset[4] = { 1, 2, 3, 4 }, long_offset[6] = { 1, 2, 3, 4, 5, 6 };
    memcpy(nan_offset, OFFSET, sizeof nan_offset);
    nan_offset[2] = NAN;
    tg_data good_coef = tg_f32("coef", COEF, 5);
    static const char *either[] = { "coef", "offset" };
    struct { const char *label; tg_data d[2]; int n; const char *name, *alt; } cases[] = {
        { "missing input", { good_coef }, 1, "offset", NULL },
        { "missing first input", { tg_f32("offset", OFFSET, 5) }, 1, "coef", NULL },
        { "no inputs", { { 0 } }, 0, NULL, NULL },
        { "wrong dtype", { good_coef, tg_i32("offset", IOFFSET, 5) }, 2, "offset", NULL },
        { "too few elements", { good_coef, tg_f32("offset", short_offset, 4) }, 2, "offset", NULL },
        { "too many elements", { good_coef, tg_f32("offset", long_offset, 6) }, 2, "offset", NULL },
        { "NULL data", { good_coef, tg_f32("offset", NULL, 5) }, 2, "offset", NULL },
        { "unknown name instead of a declared one", { good_coef, tg_f32("offest", OFFSET, 5) }, 2, "offset", "offest" },
        { "NaN loss", { good_coef, tg_f32("offset", nan_offset, 5) }, 2, NULL, NULL },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *label = cases[k].label;
        tg_result r = tg_step(t, cases[k].n ? cases[k].d : NULL, cases[k].n);
        CHECK(r.status == TG_FAILED, "%s: status %d", label, (int)r.status);
        if (getenv("TG_VERBOSE")) printf("step %-22s %s\n", label, r.error);
        CHECK(r.error[0] != 0, "%s: no message", label);
        if (cases[k].name)
            CHECK(has(r.error, cases[k].name) || (cases[k].alt && has(r.error, cases[k].alt)), "%s: message \"%s\" does not name %s",
                  label, r.error, cases[k].name);
        else if (cases[k].n == 0) CHECK(has(r.error, either[0]) || has(r.error, either[1]), "%s: message \"%s\" names no input", label, r.error);
        CHECK(params_are(t, P0), "%s: parameters changed", label);
        CHECK(tg_train_step_count(t) == 0, "%s: step count %lld", label, (long long)tg_train_step_count(t));
        if (strcmp(label, "NaN loss") != 0) {
            tg_result e = tg_eval_loss(t, cases[k].n ? cases[k].d : NULL, cases[k].n);
            CHECK(e.status == TG_FAILED && e.error[0], "%s: tg_eval_loss status %d", label, (int)e.status);
        }
    }
    /* The handle is still usable, and the failures left no trace in the optimizer: the first good
     * step equals a fresh handle's. */
    tg_data good[2] = { good_coef, tg_f32("offset", OFFSET, 5) };
    tg_result a = tg_step(t, good, 2), b = tg_step(fresh, good, 2);
    CHECK(a.status == TG_OK && a.step == 1, "good step after errors: %d %s", (int)a.status, a.error);
    CHECK(b.status == TG_OK && a.loss == b.loss, "good step: loss %.9g vs fresh %.9g", a.loss, b.loss);
    float pa[5], pb[5];
    CHECK(tg_download_param(t, "weights", pa, 5, NULL) == TG_OK && tg_download_param(fresh, "weights", pb, 5, NULL) == TG_OK &&
          memcmp(pa, pb, sizeof pa) == 0 && memcmp(pa, P0, sizeof pa) != 0, "parameters after a good step differ from a fresh handle's");
    /* A NaN after some training also leaves the parameters alone. */
    tg_result r = tg_step(t, (tg_data[]){ good_coef, tg_f32("offset", nan_offset, 5) }, 2);
    CHECK(r.status == TG_FAILED && r.error[0], "NaN loss at step 2: status %d", (int)r.status);
    CHECK(params_are(t, pa), "NaN loss at step 2 changed the parameters");
    CHECK(tg_train_step_count(t) == 1, "NaN loss at step 2: step count %lld", (long long)tg_train_step_count(t));
    a = tg_step(t, good, 2);
    b = tg_step(fresh, good, 2);
    CHECK(a.status == TG_OK && a.step == 2 && b.status == TG_OK && a.loss == b.loss, "step 2 after a NaN");
    CHECK(tg_download_param(t, "weights", pa, 5, NULL) == TG_OK && tg_download_param(fresh, "weights", pb, 5, NULL) == TG_OK &&
          memcmp(pa, pb, sizeof pa) == 0, "a failed NaN step changed the optimizer state");

    /* Attached forward: missing / wrong inputs. */
    const tg_input_decl fin[] = { TG_F32("probe_in", 5) };
    memset(&err, 0, sizeof err);
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = quad_forward, .ctx = &q, .inputs = fin, .n_inputs = 1 }, &err);
    CHECK(f != NULL, "attach: %s", err.msg);
    if (f) {
        tg_result fr = tg_run(f, NULL, 0);
        CHECK(fr.status == TG_FAILED && has(fr.error, "probe_in"), "run without inputs: %d \"%s\"", (int)fr.status, fr.error);
        fr = tg_run(f, (tg_data[]){ tg_f32("probe_in", COEF, 4) }, 1);
        CHECK(fr.status == TG_FAILED && has(fr.error, "probe_in"), "run with 4 of 5 elements: %d \"%s\"", (int)fr.status, fr.error);
        fr = tg_run(f, (tg_data[]){ tg_i32("probe_in", IOFFSET, 5) }, 1);
        CHECK(fr.status == TG_FAILED && has(fr.error, "probe_in"), "run with i32 data: %d \"%s\"", (int)fr.status, fr.error);
        fr = tg_run(f, (tg_data[]){ tg_f32("probe_in", COEF, 5) }, 1);
        CHECK(fr.status == TG_OK && fr.output_len == 5, "good run after errors: %s", fr.error);
    }
    tg_destroy(t);
    tg_destroy(fresh);
    tg_model_free(m);
}

static void test_param_io_errors(void) {
    tg_model *m = tg_model_new(6);
    quad q = { tg_param_new(m, "weights", TG_SHAPE(5), tg_init_literal(P0, 5)) };
    tg_train *t = quad_compile(m, &q);
    if (!t) { tg_model_free(m); return; }
    float v4[4] = { 9, 9, 9, 9 }, v5[5] = { 9, 9, 9, 9, 9 }, v6[6] = { 9, 9, 9, 9, 9, 9 }, dst[5];
    struct { const char *label; tg_data d[2]; int n; const char *part; } cases[] = {
        { "unknown name", { tg_f32("no_such_param", v5, 5) }, 1, "no_such_param" },
        { "too few elements", { tg_f32("weights", v4, 4) }, 1, "weights" },
        { "too many elements", { tg_f32("weights", v6, 6) }, 1, "weights" },
        { "i32 data", { tg_i32("weights", IOFFSET, 5) }, 1, "weights" },
        { "NULL data", { tg_f32("weights", NULL, 5) }, 1, "weights" },
        { "NULL name", { tg_f32(NULL, v5, 5) }, 1, NULL },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memset(&err, 0, sizeof err);
        tg_status st = tg_upload_params(t, cases[k].d, cases[k].n, &err);
        CHECK(st == TG_FAILED, "upload %s: status %d", cases[k].label, (int)st);
        CHECK(err.msg[0], "upload %s: no message", cases[k].label);
        if (cases[k].part) CHECK(has(err.msg, cases[k].part), "upload %s: message \"%s\"", cases[k].label, err.msg);
        CHECK(params_are(t, P0), "upload %s: parameters changed", cases[k].label);
        CHECK(tg_upload_params(t, cases[k].d, cases[k].n, NULL) == TG_FAILED, "upload %s without an error buffer", cases[k].label);
    }
    memset(&err, 0, sizeof err);
    CHECK(tg_download_param(t, "no_such_param", dst, 5, &err) == TG_FAILED && has(err.msg, "no_such_param"),
          "download of an unknown name: \"%s\"", err.msg);
    memset(&err, 0, sizeof err);
    CHECK(tg_download_param_grad(t, "no_such_param", dst, 5, &err) == TG_FAILED && err.msg[0], "grad download of an unknown name");
    CHECK(tg_download_param(t, "weights", NULL, 5, &err) == TG_FAILED, "download into NULL");
    CHECK(tg_download_param(t, NULL, dst, 5, NULL) == TG_FAILED, "download of a NULL name");
    /* Still usable. */
    CHECK(tg_upload_params(t, (tg_data[]){ tg_f32("weights", v5, 5) }, 1, &err) == TG_OK, "good upload: %s", err.msg);
    CHECK(params_are(t, v5), "good upload after errors not applied");
    tg_result r = tg_step(t, (tg_data[]){ tg_f32("coef", COEF, 5), tg_f32("offset", OFFSET, 5) }, 2);
    CHECK(r.status == TG_OK && r.step == 1, "good step after I/O errors: %s", r.error);
    tg_destroy(t);
    tg_model_free(m);
}

/* NULL handles: an error value, never a crash. */
static void test_null_handles(void) {
    float x[5] = { 0 };
    tg_data d[1] = { tg_f32("x", x, 5) };
    tg_result r = tg_step(NULL, d, 1);
    CHECK(r.status == TG_FAILED && r.error[0], "tg_step(NULL): status %d", (int)r.status);
    r = tg_eval_loss(NULL, d, 1);
    CHECK(r.status == TG_FAILED && r.error[0], "tg_eval_loss(NULL): status %d", (int)r.status);
    r = tg_run(NULL, d, 1);
    CHECK(r.status == TG_FAILED && r.error[0], "tg_run(NULL): status %d", (int)r.status);
    CHECK(r.output == NULL && r.output_len == 0, "tg_run(NULL) output");
    tg_destroy(NULL);
    tg_model_free(NULL);
    tg_reset(NULL, 1, 1);
    tg_set_lr(NULL, 0.1);
    tg_schedule s = tg_lr_constant(0.1);
    tg_set_schedule(NULL, &s);
    memset(&err, 0, sizeof err);
    CHECK(tg_attach(NULL, &(tg_forward_spec){ .forward = quad_forward, .inputs = NULL, .n_inputs = 0 }, &err) == NULL && err.msg[0],
          "tg_attach(NULL)");
    memset(&err, 0, sizeof err);
    CHECK(tg_download_param(NULL, "w", x, 5, &err) == TG_FAILED && err.msg[0], "tg_download_param(NULL)");
    CHECK(tg_download_param_grad(NULL, "w", x, 5, NULL) == TG_FAILED, "tg_download_param_grad(NULL)");
    CHECK(tg_upload_params(NULL, d, 1, NULL) == TG_FAILED, "tg_upload_params(NULL)");
    CHECK(check_passed > 0, "reached the end");
}

int main(void) {
    test_trace_errors();
    test_param_errors();
    test_compile_errors();
    test_step_errors();
    test_param_io_errors();
    test_null_handles();
    return check_report("test_errors");
}
