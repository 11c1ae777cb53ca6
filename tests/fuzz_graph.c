/* Fuzz harness for the graph builder, compiler and runtime: the input bytes are decoded into the
 * input shapes and data, then a program of up to 24 public op calls (every op and layer of
 * tensorgrad.h) whose operands, shapes, axes and sizes come from the bytes, mostly in range and
 * sometimes not (0, negative, past the rank, overflowing int64, NaN, a tensor of another graph,
 * an invalid tensor). The program is traced as a loss (tg_compile, tg_step, tg_eval_loss) and
 * as a forward (tg_attach, tg_run), on the reference interpreter and now and then on the
 * compiled CPU backend (which runs the C compiler: at most TG_FUZZ_CPU_MAX times a process,
 * default 8, the kernel cache absorbing repeats).
 *
 * Properties, checked with abort() so the fuzzer reports them: no crash, leak or undefined
 * behaviour (the sanitizers); a failed call has a message; a successful step has a finite loss;
 * a failed step leaves every parameter as it was; a successful run's output has the size of its
 * shape. Results may be NaN (a NaN input, log of a negative): that is data, not a failure.
 *
 * libFuzzer (clang): see `make fuzz-clang`; CI's short mode without clang: tests/fuzz_main.c
 * (`make fuzz`). Seeds: tests/fixtures/fuzz_graph/. */
#include "tensorgrad.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(c) do { if (!(c)) { fprintf(stderr, "fuzz_graph: %s failed (line %d)\n", #c, __LINE__); abort(); } } while (0)

/* Sizes no machine has: allocations of them must come back NULL under ASan too. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* ----- reading the bytes: past the end everything reads as 0 ----- */
typedef struct { const uint8_t *p; size_t n, at; } rd;
static unsigned u8(rd *r) { return r->at < r->n ? r->p[r->at++] : 0; }

/* Mostly small valid values, one draw in sixteen from a table of hostile ones (all of which must
 * be rejected: none is a valid size that is merely large, which would only exhaust memory). */
static int64_t dim(rd *r) {
    static const int64_t bad[] = { 0, -1, -7, (int64_t)1 << 61, INT64_MAX, INT64_MIN };
    unsigned b = u8(r);
    return b < 240 ? 1 + b % 5 : bad[b % 6];
}
static int axis(rd *r) {
    static const int bad[] = { TG_ALL, 99, -99, 2147483647 };
    unsigned b = u8(r);
    return b < 240 ? (int)(b % 9) - 4 : bad[b % 4];
}
static int small(rd *r) {   /* strides, kernel sizes, heads, factors */
    static const int bad[] = { 0, -1, 2147483647, -2147483647 - 1 };
    unsigned b = u8(r);
    return b < 240 ? 1 + (int)(b % 3) : bad[b % 4];
}
static int64_t offset(rd *r) {   /* paddings and starts: 0 is valid */
    static const int64_t bad[] = { -1, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN };
    unsigned b = u8(r);
    return b < 240 ? b % 3 : bad[b % 5];
}
static double value(rd *r) {
    static const double v[] = { 0, 1, -1, 0.5, 2, -3, 1e-30, 1e30, -1e30, NAN, INFINITY, -INFINITY, 0.1, 10, -0.5, 4 };
    return v[u8(r) % 16];
}
static tg_shape shape(rd *r) {
    tg_shape s = { 1 + (int)(u8(r) % 4), { 0 } };
    if (u8(r) == 255) s.ndim = (int)(u8(r) % 9) - 1;   /* -1 .. 7 */
    for (int i = 0; i < s.ndim && i < TG_MAX_DIMS; i++) s.d[i] = dim(r);
    return s;
}

/* ----- the model and the program ----- */
static tg_model *M;
static tg_linear LIN;
static tg_embedding_layer EMB;
static tg_layernorm LN;
static tg_rmsnorm RMS;
static tg_conv2d_layer CONV;
static tg_param P;
static tg_train *OTHER;     /* keeps the graph SAVED belongs to */
static tg_tensor SAVED;

typedef struct {
    const uint8_t *prog;
    size_t len;
    int final_mode;         /* how the program's last tensor becomes the loss */
} program;

#define POOL 12
#define MAX_NUMEL 65536     /* a result past this ends the program: memory, not bugs */

static tg_tensor pick(rd *r, const tg_tensor *pool, int n) {
    unsigned b = u8(r);
    if (b == 255) return SAVED;                            /* another graph's tensor */
    if (b == 254) return (tg_tensor){ pool[0].g, -1 };     /* an invalid one */
    return pool[b % (unsigned)n];
}

static int64_t numel_of(tg_tensor t) { return tg_numel(tg_shape_of(t)); }

/* One op call decoded from the bytes; its result. Every call reads the same bytes (operands,
 * then one of each kind of argument, then the op), so a mutation of one op leaves the others'
 * decoding alone. */
static tg_tensor op(rd *r, const tg_tensor *pool, int n) {
    tg_tensor a = pick(r, pool, n), b = pick(r, pool, n), c = pick(r, pool, n);
    int ax = axis(r), ax2 = axis(r), k1 = small(r), k2 = small(r);
    int64_t d1 = dim(r), d2 = dim(r), o = offset(r);
    double v1 = value(r), v2 = value(r);
    unsigned flag = u8(r), count = u8(r) % 6;
    tg_shape s = shape(r);
    tg_tensor xs[4] = { a, b, c, a }, out[4];
    int64_t sizes[4] = { d1, d2, k1, k2 };
    switch (u8(r) % 64) {
    case 0: return tg_add(a, b);
    case 1: return tg_sub(a, v1);
    case 2: return tg_mul(v1, b);
    case 3: return tg_div(a, b);
    case 4: return tg_minimum(a, b);
    case 5: return tg_maximum(a, v1);
    case 6: return tg_less(a, b);
    case 7: return tg_greater(a, b);
    case 8: return tg_where(c, a, b);
    case 9: return tg_neg(a);
    case 10: return tg_abs(a);
    case 11: return tg_square(a);
    case 12: return tg_sqrt(a);
    case 13: return tg_rsqrt(a);
    case 14: return tg_exp(a);
    case 15: return tg_log(a);
    case 16: return tg_relu(a);
    case 17: return tg_tanh(a);
    case 18: return tg_sigmoid(a);
    case 19: return tg_sum(a, ax, (int)(flag & 1));
    case 20: return tg_mean(a, ax, (int)(flag & 1));
    case 21: return tg_reshape_at(TG_HERE, a, s);
    case 22: return tg_reshape(a, -1);
    case 23: {
        tg_shape order = { tg_shape_of(a).ndim, { flag % 4, (flag >> 2) % 4, (flag >> 4) % 4, flag >> 6, 4, 5 } };
        return tg_permute_at(TG_HERE, a, order);
    }
    case 24: return tg_swapaxes(a, ax, ax2);
    case 25: return tg_matmul(a, b);
    case 26: return tg_one_hot(a, d1);
    case 27: return tg_embedding(a, b);
    case 28: return tg_softmax(a, ax);
    case 29: return tg_log_softmax(a, ax);
    case 30: return tg_cross_entropy(a, b, (tg_reduction)(flag % 4));
    case 31: return tg_nll_loss(a, b, (tg_reduction)(flag % 4));
    case 32: return tg_sin(a);
    case 33: return tg_cos(a);
    case 34: return tg_gelu(a);
    case 35: return tg_gelu_tanh(a);
    case 36: return tg_silu(a);
    case 37: return tg_clamp(a, v1, v2);
    case 38: return tg_argmax(a, ax);
    case 39: return tg_argmin(a, ax);
    case 40: return tg_flatten(a, ax);
    case 41: return tg_split_heads(a, k1);
    case 42: return tg_merge_heads(a);
    case 43: return tg_take_along_axis(a, b, ax);
    case 44: return tg_arange(d1, (tg_dtype)(flag % 3));
    case 45: return tg_zeros_at(TG_HERE, s, (tg_dtype)(flag % 3));
    case 46: return tg_ones_at(TG_HERE, s, (tg_dtype)(flag % 3));
    case 47: return tg_randn_at(TG_HERE, s);
    case 48: return tg_narrow(a, ax, o, d2);
    case 49: return tg_concat(xs, (int)count - 1, ax);
    case 50: return tg_stack(xs, (int)count - 1, ax);
    case 51: {
        int k = 1 + (int)(count % 4);
        tg_split(a, sizes, k, ax, out);
        return out[flag % (unsigned)k];
    }
    case 52: return tg_softmax_causal(a);
    case 53: return tg_where_causal(a, v1);
    case 54: return tg_stop_gradient(a);
    case 55: return tg_dropout(a, v1 / 4);
    case 56: return tg_conv2d(a, b, k1, (int)o);
    case 57: return tg_max_pool2d(a, k1, k2, (int)o);
    case 58: return tg_nearest_upsample2d(a, k1);
    case 59: return tg_p(P);
    case 60: return tg_scalar(v1);
    case 61: switch (flag % 5) {
        case 0: return tg_linear(&LIN, a);
        case 1: return tg_embed(&EMB, a);
        case 2: return tg_layernorm(&LN, a);
        case 3: return tg_rmsnorm(&RMS, a);
        default: return tg_conv(&CONV, a);
        }
    case 62: return tg_add(tg_p(LIN.W), a);
    default: return tg_mul(tg_p(EMB.W), a);
    }
}

/* The program over in[0] (f32 x) and in[1] (i32 idx); its last tensor, made a loss or not. */
static tg_tensor run_program(const program *pg, const tg_tensor *in, bool loss) {
    rd r = { pg->prog, pg->len, 0 };
    tg_tensor pool[POOL] = { in[0], in[1] };
    int n = 2, n_ops = (int)(u8(&r) % 24), next = 2;
    tg_tensor last = in[0];
    for (int i = 0; i < n_ops; i++) {
        tg_tensor t = op(&r, pool, n);
        if (t.id < 0 || numel_of(t) > MAX_NUMEL) { last = t; break; }
        last = t;
        pool[next] = t;
        if (n < POOL) n++;
        next = next + 1 < POOL ? next + 1 : 2;
    }
    if (!loss) return last;
    switch (pg->final_mode) {
    case 0: return last;                                               /* often not a scalar */
    case 1: return tg_mean(last, TG_ALL, 0);
    default: return tg_add(tg_sum(last, TG_ALL, 0), tg_sum(tg_square(tg_p(P)), TG_ALL, 0));
    }
}

static tg_tensor as_loss(const void *ctx, const tg_tensor *in) { return run_program(ctx, in, true); }
static tg_tensor as_forward(const void *ctx, const tg_tensor *in) { return run_program(ctx, in, false); }
static tg_tensor other_loss(const void *ctx, const tg_tensor *in) {
    SAVED = tg_linear(&LIN, in[0]);
    return tg_sum(SAVED, TG_ALL, 0);
}

static void cleanup(void) {
    tg_destroy(OTHER);
    tg_model_free(M);
}

static void init(void) {
    atexit(cleanup);   /* the fixtures live as long as the process; freed so the leak check sees nothing */
    M = tg_model_new(3);
    LIN = tg_linear_new(M, "lin", 4, 4, NULL);
    EMB = tg_embedding_new(M, "emb", 6, 4);
    LN = tg_layernorm_new(M, "ln", 4, 0, 1);
    RMS = tg_rmsnorm_new(M, "rms", 4, 0);
    CONV = tg_conv2d_new(M, "conv", 2, 2, 3, 1, 1, 1);
    P = tg_param_new(M, "p", TG_SHAPE(3, 4), tg_init_randn(0.5));
    const tg_input_decl in[] = { TG_F32("x", 2, 4) };
    OTHER = tg_compile(&(tg_train_spec){ .model = M, .loss = other_loss, .inputs = in, .n_inputs = 1,
                                        .optimizer = tg_sgd(0.1, 0, 0, 0), .backend = "reference" }, NULL);
    REQUIRE(OTHER != NULL);
}

/* Every parameter's values, concatenated (to compare before and after a failed step). */
static float *all_params(tg_train *t, size_t *total) {
    size_t n = (size_t)tg_train_param_total(t);
    float *v = malloc(sizeof(float) * (n + 1));
    REQUIRE(v != NULL);
    size_t at = 0;
    for (int i = 0; i < tg_train_n_params(t); i++) {
        size_t k = (size_t)tg_numel(tg_train_param_shape(t, i));
        tg_error err = { "" };
        REQUIRE(tg_download_param(t, tg_train_param_name(t, i), v + at, k, &err) == TG_OK);
        at += k;
    }
    *total = n;
    return v;
}

static int cpu_compiles;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!M) init();
    rd r = { data, size, 0 };
    /* Inputs: x f32 and idx i32, shapes and values from the bytes. */
    tg_input_decl decl[2] = { { "x", TG_FLOAT32, shape(&r) }, { "idx", TG_INT32, shape(&r) } };
    const char *max = getenv("TG_FUZZ_CPU_MAX");
    bool cpu = u8(&r) % 32 == 0 && cpu_compiles < (max ? atoi(max) : 8);
    program pg = { 0 };
    pg.final_mode = (int)(u8(&r) % 3);
    unsigned opt_kind = u8(&r) % 3;
    float xs[4096];
    int32_t is[4096];
    for (int i = 0; i < 4096; i++) {
        xs[i] = i < 64 ? (float)value(&r) : (float)(i % 7) * 0.25f - 0.5f;
        is[i] = i < 16 ? (int32_t)(u8(&r) % 8) - 1 : i % 5;
    }
    pg.prog = data + r.at;
    pg.len = size - r.at;
    size_t nx = 1, ni = 1;
    for (int i = 0; i < decl[0].shape.ndim && i < TG_MAX_DIMS; i++) nx *= (size_t)decl[0].shape.d[i];
    for (int i = 0; i < decl[1].shape.ndim && i < TG_MAX_DIMS; i++) ni *= (size_t)decl[1].shape.d[i];
    if (nx > 4096) nx = 4096;   /* a shape the compile rejects anyway, or the data is short */
    if (ni > 4096) ni = 4096;
    tg_data in[2] = { tg_f32("x", xs, nx), tg_i32("idx", is, ni) };

    tg_optimizer opt = opt_kind == 0 ? tg_adam(0.01) : opt_kind == 1 ? tg_sgd(0.1, 0.9, 1, 0.01) : tg_adamw(0.01, 0.1);
    opt.clip_norm = opt_kind == 2 ? 1.0 : 0;
    tg_error err = { "" };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = M, .loss = as_loss, .ctx = &pg, .inputs = decl, .n_inputs = 2,
                                              .optimizer = opt, .backend = cpu ? "cpu" : "reference" }, &err);
    cpu_compiles += cpu;
    if (!t) {
        REQUIRE(err.msg[0] != 0);
        return 0;
    }
    for (int step = 0; step < 2; step++) {
        size_t n0, n1;
        float *before = all_params(t, &n0);
        tg_result s = tg_step(t, in, 2);
        float *after = all_params(t, &n1);
        if (s.status == TG_OK) {
            REQUIRE(isfinite(s.loss) && s.step == tg_train_step_count(t));
        } else {
            REQUIRE(s.error[0] != 0);
            REQUIRE(n0 == n1 && memcmp(before, after, sizeof(float) * n0) == 0);
        }
        free(before);
        free(after);
    }
    tg_result e = tg_eval_loss(t, in, 2);
    REQUIRE(e.status == TG_OK ? isfinite(e.loss) : e.error[0] != 0);
    tg_forward *f = tg_attach(t, &(tg_forward_spec){ .forward = as_forward, .ctx = &pg, .inputs = decl, .n_inputs = 2 }, &err);
    if (f) {
        tg_result o = tg_run(f, in, 2);
        if (o.status == TG_OK) {
            size_t n = 1;
            for (int i = 0; i < o.output_shape.ndim; i++) n *= (size_t)o.output_shape.d[i];
            REQUIRE(o.output != NULL && o.output_len == n);
        } else {
            REQUIRE(o.error[0] != 0);
        }
    } else {
        REQUIRE(err.msg[0] != 0);
    }
    tg_destroy(t);
    return 0;
}
