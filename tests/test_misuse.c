/* API misuse: every public function called with what a careless or hostile caller might pass
 * (NULL handles and arrays, wrong names, dtypes and element counts, bad dimensions and axes,
 * shapes whose element count overflows, tensors of another graph, non-scalar losses, NaN and
 * infinite data, bad optimizer settings). Each call must come back as an error value whose
 * message names the problem, and the handles involved must stay usable: a valid tg_step or
 * tg_run right after it succeeds. Destroyed handles are refused by name.
 * The number of cases is printed, so a shrinking suite shows. */
#include "tensorgrad.h"
#include "check.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Huge shapes reach malloc with sizes no machine has: under AddressSanitizer that must return
 * NULL (as the C library does) rather than stop the test. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static int n_cases;

static int has(const char *msg, const char *part) { return msg && part && strstr(msg, part) != NULL; }

/* One misuse: its error message must be non-empty and contain `part`. */
static void expect_msg(const char *label, const char *msg, const char *part) {
    n_cases++;
    if (getenv("TG_VERBOSE")) printf("%-40s %s\n", label, msg ? msg : "(none)");
    CHECK(msg && msg[0], "%s: no message", label);
    CHECK(has(msg, part), "%s: message \"%s\" lacks \"%s\"", label, msg ? msg : "", part);
}

/* ---------------------------------------------------------------------------------------------
 * The model every case returns to: l1 (x [2,3] -> 4 logits), cross entropy with y [2].
 * T trains on the reference interpreter, F is a forward attached to it, T2 holds the graph a
 * tensor is saved from (for the two-graphs cases).
 * ------------------------------------------------------------------------------------------- */
static tg_model *M;
static tg_linear L1;
static tg_param UNUSED_P;   /* declared but never used by the loss: it has no gradient */
static tg_train *T, *T2;
static tg_forward *F;
static tg_tensor SAVED;     /* a tensor of T2's graph */

static const float X[6] = { 0.5f, -1.0f, 0.25f, 1.5f, 0.75f, -0.5f };
static const int32_t Y[2] = { 1, 3 };
static const tg_input_decl IN[] = { TG_F32("x", 2, 3), TG_I32("y", 2) };
#define GOOD_DATA (tg_data[]){ tg_f32("x", X, 6), tg_i32("y", Y, 2) }, 2

static tg_tensor good_loss(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(tg_linear(&L1, in[0]), in[1], TG_MEAN);
}

static tg_tensor good_forward(const void *ctx, const tg_tensor *in) { return tg_linear(&L1, in[0]); }

static tg_tensor saving_loss(const void *ctx, const tg_tensor *in) {
    SAVED = tg_linear(&L1, in[0]);
    return tg_cross_entropy(SAVED, in[1], TG_MEAN);
}

static tg_train *compile_on(const char *backend, tg_forward_fn loss, tg_error *err) {
    return tg_compile(&(tg_train_spec){ .model = M, .loss = loss, .inputs = IN, .n_inputs = 2, .optimizer = tg_adam(0.01),
                                       .backend = backend }, err);
}

/* The handles still work: a valid step of T and a valid run of F. */
static void still_usable(const char *after) {
    tg_result r = tg_step(T, GOOD_DATA);
    CHECK(r.status == TG_OK, "after %s: valid tg_step failed: %s", after, r.error);
    r = tg_run(F, (tg_data[]){ tg_f32("x", X, 6) }, 1);
    CHECK(r.status == TG_OK && r.output_len == 8, "after %s: valid tg_run failed: %s", after, r.error);
}

static void setup(void) {
    M = tg_model_new(11);
    L1 = tg_linear_new(M, "l1", 3, 4, NULL);
    UNUSED_P = tg_param_new(M, "unused", TG_SHAPE(2), tg_init_ones());
    tg_error err = { "" };
    T = compile_on("reference", good_loss, &err);
    CHECK(T != NULL, "setup: %s", err.msg);
    T2 = compile_on("reference", saving_loss, &err);
    CHECK(T2 != NULL, "setup: %s", err.msg);
    F = T ? tg_attach(T, &(tg_forward_spec){ .forward = good_forward, .inputs = IN, .n_inputs = 1 }, &err) : NULL;
    CHECK(F != NULL, "setup attach: %s", err.msg);
}

/* ---------------------------------------------------------------------------------------------
 * Trace-time misuse: one forward, one case per misuse; each compile must fail with a message
 * naming the problem, and then the model still compiles and steps.
 * ------------------------------------------------------------------------------------------- */
typedef enum {
    NULL_TENSOR, ID_OUT_OF_RANGE, NEGATIVE_ID, OTHER_GRAPH_BINARY, OTHER_GRAPH_UNARY, OTHER_GRAPH_WHERE, RETURN_OTHER_GRAPH,
    RETURN_INVALID, SQRT_I32, MATMUL_I32, ADD_MIXED, EMBED_F32_IDX, ONE_HOT_F32, CE_F32_TARGETS, WHERE_MIXED, CONCAT_MIXED,
    SUM_AXIS, MEAN_AXIS, SOFTMAX_ALL, ARGMAX_AXIS, NARROW_AXIS, FLATTEN_AXIS, SWAPAXES_AXIS, TAKE_AXIS, CONCAT_AXIS,
    STACK_AXIS, SPLIT_AXIS, LOG_SOFTMAX_AXIS, ZEROS_ZERO, ONES_NEGATIVE, RANDN_ZERO, ARANGE_ZERO, ARANGE_NEGATIVE,
    ONE_HOT_ZERO, RESHAPE_ZERO, RESHAPE_MINUS2, RESHAPE_RANK7, RESHAPE_RANK_NEG, PERMUTE_RANK7, NARROW_EMPTY,
    NARROW_NEG_START, NARROW_OVERFLOW, SPLIT_NULL_SIZES, SPLIT_ZERO_N, SPLIT_NEG_SIZE, SPLIT_OVERFLOW, SPLIT_NULL_OUT,
    CONCAT_NULL, CONCAT_ZERO, CONCAT_NEG, STACK_ZERO, SPLIT_HEADS_ZERO, SPLIT_HEADS_INDIVISIBLE, MERGE_HEADS_2D,
    CONV_STRIDE0, CONV_PAD_NEG, CONV_2D_INPUT, CONV_WEIGHT_RANK, POOL_K0, POOL_PAD, POOL_3D, UPSAMPLE_ZERO,
    UPSAMPLE_OVERFLOW, DROPOUT_ONE, DROPOUT_NEG, DROPOUT_NAN, BROADCAST_OVERFLOW, MATMUL_OVERFLOW, ONE_HOT_OVERFLOW,
    ZEROS_OVERFLOW, HUGE_ALLOC, LOSS_VECTOR, LOSS_I32, P_INVALID, P_OTHER_MODEL, P_FORGED, LINEAR_NULL, EMBED_NULL,
    LAYERNORM_NULL, RMSNORM_NULL, CONV_NULL, TAKE_SHAPES, CE_SHAPES, EMBED_TABLE_3D, MATMUL_1D, SOFTMAX_CAUSAL_1D,
    WHERE_CAUSAL_1D, LINEAR_WIDTH, N_TRACE_CASES
} trace_kind;

static const struct { trace_kind kind; const char *label, *part; } TRACE_CASES[] = {
    { NULL_TENSOR, "op on a NULL tensor", "invalid tensor" },
    { ID_OUT_OF_RANGE, "op on a tensor id past the graph", "invalid tensor" },
    { NEGATIVE_ID, "op on a negative tensor id", "invalid tensor" },
    { OTHER_GRAPH_BINARY, "add of tensors of two graphs", "another graph" },
    { OTHER_GRAPH_UNARY, "exp of another graph's tensor", "another graph" },
    { OTHER_GRAPH_WHERE, "where with another graph's condition", "another graph" },
    { RETURN_OTHER_GRAPH, "loss from another graph", "another graph" },
    { RETURN_INVALID, "loss is an invalid tensor", "invalid tensor" },
    { SQRT_I32, "sqrt of i32", "f32" },
    { MATMUL_I32, "matmul of i32", "f32" },
    { ADD_MIXED, "add of f32 and i32", "dtypes differ" },
    { EMBED_F32_IDX, "embedding with f32 indices", "must be i32" },
    { ONE_HOT_F32, "one_hot of f32", "must be i32" },
    { CE_F32_TARGETS, "cross_entropy with f32 targets", "must be i32" },
    { WHERE_MIXED, "where with f32 and i32 branches", "dtypes differ" },
    { CONCAT_MIXED, "concat of f32 and i32", "i32" },
    { SUM_AXIS, "sum over axis 2 of a 2-D tensor", "axis 2" },
    { MEAN_AXIS, "mean over axis -3", "axis -3" },
    { SOFTMAX_ALL, "softmax over TG_ALL", "axis" },
    { ARGMAX_AXIS, "argmax over axis 5", "axis 5" },
    { NARROW_AXIS, "narrow along axis 9", "axis 9" },
    { FLATTEN_AXIS, "flatten from axis 4", "axis 4" },
    { SWAPAXES_AXIS, "swapaxes 0 and 7", "axis 7" },
    { TAKE_AXIS, "take_along_axis axis 3", "axis 3" },
    { CONCAT_AXIS, "concat along axis 4", "axis 4" },
    { STACK_AXIS, "stack along axis 5", "axis 5" },
    { SPLIT_AXIS, "split along axis -5", "axis -5" },
    { LOG_SOFTMAX_AXIS, "log_softmax over axis 2", "axis 2" },
    { ZEROS_ZERO, "zeros with a 0 dimension", "dimension <= 0" },
    { ONES_NEGATIVE, "ones with a negative dimension", "dimension <= 0" },
    { RANDN_ZERO, "randn with a 0 dimension", "dimension <= 0" },
    { ARANGE_ZERO, "arange(0)", "positive" },
    { ARANGE_NEGATIVE, "arange(-3)", "positive" },
    { ONE_HOT_ZERO, "one_hot with 0 classes", "positive" },
    { RESHAPE_ZERO, "reshape to a 0 dimension", "positive" },
    { RESHAPE_MINUS2, "reshape with -2", "positive" },
    { RESHAPE_RANK7, "reshape to rank 7", "rank 7" },
    { RESHAPE_RANK_NEG, "reshape to rank -1", "rank -1" },
    { PERMUTE_RANK7, "permute with 7 axes", "7 axes" },
    { NARROW_EMPTY, "narrow of length 0", "outside" },
    { NARROW_NEG_START, "narrow from -1", "outside" },
    { NARROW_OVERFLOW, "narrow start + length overflowing", "outside" },
    { SPLIT_NULL_SIZES, "split with NULL sizes", "sizes" },
    { SPLIT_ZERO_N, "split into 0 pieces", "sizes" },
    { SPLIT_NEG_SIZE, "split with a negative size", "sizes" },
    { SPLIT_OVERFLOW, "split sizes overflowing", "sizes" },
    { SPLIT_NULL_OUT, "split into a NULL array", "NULL output" },
    { CONCAT_NULL, "concat of a NULL array", "at least one" },
    { CONCAT_ZERO, "concat of 0 tensors", "at least one" },
    { CONCAT_NEG, "concat of -1 tensors", "at least one" },
    { STACK_ZERO, "stack of 0 tensors", "at least one" },
    { SPLIT_HEADS_ZERO, "split_heads into 0 heads", "0 heads" },
    { SPLIT_HEADS_INDIVISIBLE, "split_heads 4 into 3", "3 heads" },
    { MERGE_HEADS_2D, "merge_heads of 2-D", "merge_heads" },
    { CONV_STRIDE0, "conv2d stride 0", "stride 0" },
    { CONV_PAD_NEG, "conv2d padding -1", "padding -1" },
    { CONV_2D_INPUT, "conv2d of a 2-D input", "4-D" },
    { CONV_WEIGHT_RANK, "conv2d with a 2-D weight", "weight" },
    { POOL_K0, "max_pool2d k 0", "k 0" },
    { POOL_PAD, "max_pool2d padding > k/2", "padding 2" },
    { POOL_3D, "max_pool2d of 3-D", "4-D" },
    { UPSAMPLE_ZERO, "upsample by 0", "factor 0" },
    { UPSAMPLE_OVERFLOW, "upsample overflowing", "too large" },
    { DROPOUT_ONE, "dropout p = 1", "p = 1" },
    { DROPOUT_NEG, "dropout p = -0.5", "p = -0.5" },
    { DROPOUT_NAN, "dropout p = NaN", "p = nan" },
    { BROADCAST_OVERFLOW, "broadcast overflowing int64", "too large" },
    { MATMUL_OVERFLOW, "matmul result overflowing int64", "too large" },
    { ONE_HOT_OVERFLOW, "one_hot with 2^62 classes", "too large" },
    { ZEROS_OVERFLOW, "zeros [2^40, 2^40]", "too large" },
    { HUGE_ALLOC, "a 2^59-element intermediate", "memory" },
    { LOSS_VECTOR, "loss that is not a scalar", "scalar" },
    { LOSS_I32, "i32 loss", "f32 scalar" },
    { P_INVALID, "tg_p of a failed declaration", "invalid parameter" },
    { P_OTHER_MODEL, "tg_p of another model's parameter", "another model" },
    { P_FORGED, "tg_p of a forged parameter id", "out of range" },
    { LINEAR_NULL, "tg_linear(NULL, x)", "NULL layer" },
    { EMBED_NULL, "tg_embed(NULL, idx)", "NULL layer" },
    { LAYERNORM_NULL, "tg_layernorm(NULL, x)", "NULL layer" },
    { RMSNORM_NULL, "tg_rmsnorm(NULL, x)", "NULL layer" },
    { CONV_NULL, "tg_conv(NULL, x)", "NULL layer" },
    { TAKE_SHAPES, "take_along_axis shapes disagree", "must agree" },
    { CE_SHAPES, "cross_entropy targets' shape", "targets" },
    { EMBED_TABLE_3D, "embedding of a 3-D table", "2-D" },
    { MATMUL_1D, "matmul of a 1-D tensor", "at least 2" },
    { SOFTMAX_CAUSAL_1D, "softmax_causal of 1-D", "at least 2" },
    { WHERE_CAUSAL_1D, "where_causal of 1-D", "at least 2" },
    { LINEAR_WIDTH, "linear of the wrong width", "matmul" },
};

static tg_model *OTHER_MODEL;
static tg_param OTHER_P, FAILED_P;

/* The misuse of case k, given x [2,3] f32 and y [2] i32; returns what the loss would be. */
static tg_tensor misuse(trace_kind k, tg_tensor x, tg_tensor y) {
    const int64_t big = (int64_t)1 << 32;
    tg_tensor r = x, parts[2] = { x, x }, out[2];
    switch (k) {
    case NULL_TENSOR: r = tg_relu(((tg_tensor){ NULL, -1 })); break;
    case ID_OUT_OF_RANGE: r = tg_relu(((tg_tensor){ x.g, 99999 })); break;
    case NEGATIVE_ID: r = tg_relu(((tg_tensor){ x.g, -5 })); break;
    case OTHER_GRAPH_BINARY: r = tg_add(x, tg_sum(SAVED, TG_ALL, 0)); break;
    case OTHER_GRAPH_UNARY: r = tg_exp(SAVED); break;
    case OTHER_GRAPH_WHERE: r = tg_where(SAVED, x, x); break;
    case RETURN_OTHER_GRAPH: return tg_sum(x, TG_ALL, 0).id >= 0 ? SAVED : x;
    case RETURN_INVALID: return (tg_tensor){ x.g, -1 };
    case SQRT_I32: r = tg_sqrt(y); break;
    case MATMUL_I32: r = tg_matmul(tg_reshape(y, 1, 2), tg_reshape(y, 2, 1)); break;
    case ADD_MIXED: r = tg_add(tg_sum(x, 1, 0), y); break;
    case EMBED_F32_IDX: r = tg_embedding(x, x); break;
    case ONE_HOT_F32: r = tg_one_hot(x, 4); break;
    case CE_F32_TARGETS: return tg_cross_entropy(x, tg_sum(x, 1, 0), TG_MEAN);
    case WHERE_MIXED: r = tg_where(tg_sum(x, 1, 0), tg_sum(x, 1, 0), y); break;
    case CONCAT_MIXED: parts[1] = tg_reshape(y, 2, 1); r = tg_concat(parts, 2, 1); break;
    case SUM_AXIS: r = tg_sum(x, 2, 0); break;
    case MEAN_AXIS: r = tg_mean(x, -3, 0); break;
    case SOFTMAX_ALL: r = tg_softmax(x, TG_ALL); break;
    case ARGMAX_AXIS: r = tg_add(x, tg_sum(tg_argmax(x, 5), TG_ALL, 0)); break;
    case NARROW_AXIS: r = tg_narrow(x, 9, 0, 1); break;
    case FLATTEN_AXIS: r = tg_flatten(x, 4); break;
    case SWAPAXES_AXIS: r = tg_swapaxes(x, 0, 7); break;
    case TAKE_AXIS: r = tg_take_along_axis(x, tg_reshape(y, 2, 1), 3); break;
    case CONCAT_AXIS: r = tg_concat(parts, 2, 4); break;
    case STACK_AXIS: r = tg_stack(parts, 2, 5); break;
    case SPLIT_AXIS: tg_split(x, (int64_t[]){ 1, 2 }, 2, -5, out); r = out[0]; break;
    case LOG_SOFTMAX_AXIS: r = tg_log_softmax(x, 2); break;
    case ZEROS_ZERO: r = tg_add(x, tg_sum(tg_zeros(TG_FLOAT32, 0, 3), TG_ALL, 0)); break;
    case ONES_NEGATIVE: r = tg_add(x, tg_sum(tg_ones(TG_FLOAT32, 2, -3), TG_ALL, 0)); break;
    case RANDN_ZERO: r = tg_add(x, tg_sum(tg_randn(2, 0), TG_ALL, 0)); break;
    case ARANGE_ZERO: r = tg_add(x, tg_sum(tg_arange(0, TG_FLOAT32), TG_ALL, 0)); break;
    case ARANGE_NEGATIVE: r = tg_add(x, tg_sum(tg_arange(-3, TG_FLOAT32), TG_ALL, 0)); break;
    case ONE_HOT_ZERO: r = tg_one_hot(y, 0); break;
    case RESHAPE_ZERO: r = tg_reshape(x, 0, 6); break;
    case RESHAPE_MINUS2: r = tg_reshape(x, -2, 3); break;
    case RESHAPE_RANK7: r = tg_reshape_at(TG_HERE, x, (tg_shape){ 7, { 1, 1, 1, 1, 1, 6 } }); break;
    case RESHAPE_RANK_NEG: r = tg_reshape_at(TG_HERE, x, (tg_shape){ -1, { 6 } }); break;
    case PERMUTE_RANK7: r = tg_permute_at(TG_HERE, x, (tg_shape){ 7, { 1, 0 } }); break;
    case NARROW_EMPTY: r = tg_narrow(x, 1, 0, 0); break;
    case NARROW_NEG_START: r = tg_narrow(x, 1, -1, 2); break;
    case NARROW_OVERFLOW: r = tg_narrow(x, 1, INT64_MAX, INT64_MAX); break;
    case SPLIT_NULL_SIZES: tg_split(x, NULL, 2, 1, out); r = out[0]; break;
    case SPLIT_ZERO_N: tg_split(x, (int64_t[]){ 3 }, 0, 1, out); r = out[0]; break;
    case SPLIT_NEG_SIZE: tg_split(x, (int64_t[]){ 4, -1 }, 2, 1, out); r = out[0]; break;
    case SPLIT_OVERFLOW: tg_split(x, (int64_t[]){ INT64_MAX, INT64_MAX }, 2, 1, out); r = out[0]; break;
    case SPLIT_NULL_OUT: tg_split(x, (int64_t[]){ 1, 2 }, 2, 1, NULL); break;
    case CONCAT_NULL: r = tg_concat(NULL, 2, 0); break;
    case CONCAT_ZERO: r = tg_concat(parts, 0, 0); break;
    case CONCAT_NEG: r = tg_concat(parts, -1, 0); break;
    case STACK_ZERO: r = tg_stack(parts, 0, 0); break;
    case SPLIT_HEADS_ZERO: r = tg_split_heads(x, 0); break;
    case SPLIT_HEADS_INDIVISIBLE: r = tg_split_heads(tg_reshape(x, 1, 6), 3) ; r = tg_split_heads(tg_ones(TG_FLOAT32, 2, 4), 3); break;
    case MERGE_HEADS_2D: r = tg_merge_heads(x); break;
    case CONV_STRIDE0: r = tg_conv2d(tg_reshape(x, 1, 1, 2, 3), tg_ones(TG_FLOAT32, 1, 1, 1, 1), 0, 0); break;
    case CONV_PAD_NEG: r = tg_conv2d(tg_reshape(x, 1, 1, 2, 3), tg_ones(TG_FLOAT32, 1, 1, 1, 1), 1, -1); break;
    case CONV_2D_INPUT: r = tg_conv2d(x, tg_ones(TG_FLOAT32, 1, 1, 1, 1), 1, 0); break;
    case CONV_WEIGHT_RANK: r = tg_conv2d(tg_reshape(x, 1, 1, 2, 3), x, 1, 0); break;
    case POOL_K0: r = tg_max_pool2d(tg_reshape(x, 1, 1, 2, 3), 0, 1, 0); break;
    case POOL_PAD: r = tg_max_pool2d(tg_reshape(x, 1, 1, 2, 3), 2, 1, 2); break;
    case POOL_3D: r = tg_max_pool2d(tg_reshape(x, 1, 2, 3), 1, 1, 0); break;
    case UPSAMPLE_ZERO: r = tg_nearest_upsample2d(tg_reshape(x, 1, 1, 2, 3), 0); break;
    case UPSAMPLE_OVERFLOW: r = tg_nearest_upsample2d(tg_zeros(TG_FLOAT32, 1, 1, (int64_t)1 << 29, (int64_t)1 << 29), 1 << 30); break;
    case DROPOUT_ONE: r = tg_dropout(x, 1.0); break;
    case DROPOUT_NEG: r = tg_dropout(x, -0.5); break;
    case DROPOUT_NAN: r = tg_dropout(x, NAN); break;
    case BROADCAST_OVERFLOW: r = tg_add(tg_zeros(TG_FLOAT32, big, 1), tg_zeros(TG_FLOAT32, 1, big)); break;
    case MATMUL_OVERFLOW: r = tg_matmul(tg_zeros(TG_FLOAT32, big, 1), tg_zeros(TG_FLOAT32, 1, big)); break;
    case ONE_HOT_OVERFLOW: r = tg_one_hot(y, (int64_t)1 << 62); break;
    case ZEROS_OVERFLOW: r = tg_zeros(TG_FLOAT32, (int64_t)1 << 40, (int64_t)1 << 40); break;
    case HUGE_ALLOC: r = tg_add(x, tg_sum(tg_add(tg_zeros(TG_FLOAT32, (int64_t)1 << 29, 1), tg_zeros(TG_FLOAT32, 1, (int64_t)1 << 30)), TG_ALL, 0)); break;
    case LOSS_VECTOR: return tg_sum(x, 1, 0);
    case LOSS_I32: return tg_argmax(x, TG_ALL);
    case P_INVALID: r = tg_add(x, tg_sum(tg_p(FAILED_P), TG_ALL, 0)); break;
    case P_OTHER_MODEL: r = tg_add(x, tg_sum(tg_p(OTHER_P), TG_ALL, 0)); break;
    case P_FORGED: r = tg_add(x, tg_sum(tg_p(((tg_param){ M, 999 })), TG_ALL, 0)); break;
    case LINEAR_NULL: r = tg_linear(NULL, x); break;
    case EMBED_NULL: r = tg_embed(NULL, y); break;
    case LAYERNORM_NULL: r = tg_layernorm(NULL, x); break;
    case RMSNORM_NULL: r = tg_rmsnorm(NULL, x); break;
    case CONV_NULL: r = tg_conv(NULL, tg_reshape(x, 1, 1, 2, 3)); break;
    case TAKE_SHAPES: r = tg_take_along_axis(x, tg_reshape(y, 1, 2), 1); break;
    case CE_SHAPES: return tg_cross_entropy(x, tg_reshape(tg_concat((tg_tensor[]){ y, y }, 2, 0), 4), TG_MEAN);
    case EMBED_TABLE_3D: r = tg_embedding(tg_reshape(x, 1, 2, 3), y); break;
    case MATMUL_1D: r = tg_matmul(tg_reshape(x, 6), x); break;
    case SOFTMAX_CAUSAL_1D: r = tg_softmax_causal(tg_reshape(x, 6)); break;
    case WHERE_CAUSAL_1D: r = tg_where_causal(tg_reshape(x, 6), 0); break;
    case LINEAR_WIDTH: r = tg_linear(&L1, tg_reshape(x, 3, 2)); break;
    case N_TRACE_CASES: break;
    }
    return tg_sum(r, TG_ALL, 0);
}

static trace_kind current;
static tg_tensor misuse_loss(const void *ctx, const tg_tensor *in) { return misuse(current, in[0], in[1]); }

static void test_trace_misuse(void) {
    OTHER_MODEL = tg_model_new(1);
    OTHER_P = tg_param_new(OTHER_MODEL, "w", TG_SHAPE(3), tg_init_ones());
    FAILED_P = tg_param_new(OTHER_MODEL, "", TG_SHAPE(3), tg_init_ones());   /* fails: empty name */
    CHECK(sizeof TRACE_CASES / sizeof TRACE_CASES[0] == N_TRACE_CASES, "every trace case has a row");
    for (size_t k = 0; k < sizeof TRACE_CASES / sizeof TRACE_CASES[0]; k++) {
        current = TRACE_CASES[k].kind;
        tg_error err = { "" };
        tg_train *t = compile_on("reference", misuse_loss, &err);
        CHECK(t == NULL, "%s: compiled", TRACE_CASES[k].label);
        tg_destroy(t);
        expect_msg(TRACE_CASES[k].label, err.msg, TRACE_CASES[k].part);
        /* The same misuse through tg_attach fails the same way and leaves T alone. */
        tg_forward *f = T ? tg_attach(T, &(tg_forward_spec){ .forward = misuse_loss, .inputs = IN, .n_inputs = 2 }, &err) : NULL;
        CHECK(f == NULL || current == LOSS_VECTOR || current == LOSS_I32 || current == HUGE_ALLOC,
              "%s: attach succeeded", TRACE_CASES[k].label);
        still_usable(TRACE_CASES[k].label);
    }
    /* The model itself is unharmed: a fresh handle compiles and trains. */
    tg_error err = { "" };
    tg_train *t = compile_on("reference", good_loss, &err);
    CHECK(t && tg_step(t, GOOD_DATA).status == TG_OK, "a fresh compile after the trace misuse: %s", err.msg);
    tg_destroy(t);
    tg_model_free(OTHER_MODEL);
}

/* Ops called outside any forward function have no graph to record an error on: they return an
 * invalid tensor and leave every compiled graph as it was. */
static void test_outside_tracing(void) {
    int before = tg_graph_n_nodes(tg_train_graph(T2));
    tg_tensor r[] = { tg_relu(SAVED), tg_add(SAVED, SAVED), tg_p(L1.W), tg_scalar(1.0), tg_zeros(TG_FLOAT32, 2, 2),
                      tg_arange(3, TG_INT32), tg_randn(2), tg_linear(&L1, SAVED), tg_sum(SAVED, 0, 0), tg_concat((tg_tensor[]){ SAVED, SAVED }, 2, 0) };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        n_cases++;
        CHECK(r[i].id < 0, "op %zu outside tracing gave a valid tensor %d", i, r[i].id);
    }
    n_cases++;
    CHECK(tg_graph_n_nodes(tg_train_graph(T2)) == before, "ops outside tracing changed a compiled graph: %d -> %d nodes",
          before, tg_graph_n_nodes(tg_train_graph(T2)));
    tg_shape s = tg_shape_of((tg_tensor){ NULL, -1 });
    CHECK(s.ndim == 0 && tg_dtype_of((tg_tensor){ NULL, 7 }) == TG_FLOAT32, "shape/dtype of an invalid tensor");
    n_cases++;
    CHECK(tg_step(T2, GOOD_DATA).status == TG_OK, "T2 steps after ops outside tracing");
    still_usable("ops outside tracing");
}

/* ---------------------------------------------------------------------------------------------
 * Models and parameters
 * ------------------------------------------------------------------------------------------- */
static void expect_model_error(const char *label, tg_model *m, const char *part) {
    expect_msg(label, tg_model_error(m), part);
    /* The error is also what a compile of that model says. */
    tg_error err = { "" };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = good_loss, .inputs = IN, .n_inputs = 2,
                                              .optimizer = tg_adam(0.1), .backend = "reference" }, &err);
    CHECK(t == NULL && has(err.msg, part), "%s: compile of the model: \"%s\"", label, err.msg);
    tg_destroy(t);
}

static void test_model_misuse(void) {
    static const float lit[3] = { 1, 2, 3 };
    /* NULL models. */
    tg_model_free(NULL);
    tg_model_push(NULL, "a");
    tg_model_pop(NULL);
    n_cases += 3;
    CHECK(tg_model_seed(NULL) == 0 && tg_model_error(NULL) == NULL && tg_model_n_params(NULL) == 0, "NULL model getters");
    CHECK(tg_model_param_name(NULL, 0) == NULL && tg_model_param_name(M, -1) == NULL && tg_model_param_name(M, 99) == NULL,
          "param names out of range");
    CHECK(tg_model_param_shape(M, 99).ndim == 0 && tg_model_param_shape(NULL, 0).ndim == 0, "param shapes out of range");
    CHECK(tg_param_new(NULL, "w", TG_SHAPE(3), tg_init_ones()).id < 0, "tg_param_new(NULL)");
    tg_linear nl = tg_linear_new(NULL, "l", 3, 4, NULL);
    CHECK(nl.W.id < 0 && nl.b.id < 0, "tg_linear_new(NULL)");
    n_cases += 5;

    static const struct { const char *label, *name; tg_shape shape; int kind; const char *part; } cases[] = {
        { "param name NULL", NULL, { 1, { 3 } }, 0, "empty parameter name" },
        { "param name empty", "", { 1, { 3 } }, 0, "empty parameter name" },
        { "param with a 0 dimension", "w", { 2, { 3, 0 } }, 0, "dimension 1 is 0" },
        { "param with a negative dimension", "w", { 1, { -4 } }, 0, "dimension 0 is -4" },
        { "param of rank 7", "w", { 7, { 1, 1, 1, 1, 1, 1 } }, 0, "rank 7" },
        { "param of rank 0", "w", { 0, { 0 } }, 0, "rank 0" },
        { "param of 2^93 elements", "w", { 3, { 1ll << 31, 1ll << 31, 1ll << 31 } }, 0, "too many" },
        { "param literal NULL data", "w", { 1, { 3 } }, 1, "literal" },
        { "param literal short", "w", { 1, { 4 } }, 2, "literal" },
        { "param init scale NaN", "w", { 1, { 3 } }, 3, "not finite" },
        { "param init scale inf", "w", { 1, { 3 } }, 4, "not finite" },
        { "param init kind 9", "w", { 1, { 3 } }, 5, "init kind" },
        { "duplicate param", "l1.W", { 1, { 3 } }, 0, "duplicate" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        tg_model *m = tg_model_new(2);
        tg_linear_new(m, "l1", 3, 4, NULL);   /* the good model's parameters, so good_loss could use them */
        tg_init init = tg_init_ones();
        if (cases[k].kind == 1) init = tg_init_literal(NULL, 3);
        if (cases[k].kind == 2) init = tg_init_literal(lit, 3);
        if (cases[k].kind == 3) init = tg_init_randn(NAN);
        if (cases[k].kind == 4) init = tg_init_kaiming(INFINITY);
        if (cases[k].kind == 5) init.kind = (tg_init_kind)9;
        tg_param p = tg_param_new(m, cases[k].name, cases[k].shape, init);
        CHECK(p.id < 0, "%s: accepted", cases[k].label);
        expect_model_error(cases[k].label, m, cases[k].part);
        tg_model_free(m);
    }
    struct { const char *label, *part; int kind; } scopes[] = {
        { "push a NULL scope", "NULL scope", 0 }, { "pop with no scope", "no scope", 1 },
        { "scopes nested 40 deep", "deeper", 2 }, { "scope name of 600 characters", "too long", 3 },
        { "tg_linear_new named NULL", "empty parameter name", 4 }, { "tg_conv2d_new with k = 0", "dimension", 5 },
        { "tg_embedding_new of -3 rows", "dimension", 6 }, { "tg_layernorm_new of dim 0", "dimension", 7 },
    };
    char longname[601];
    memset(longname, 'a', 600);
    longname[600] = 0;
    for (size_t k = 0; k < sizeof scopes / sizeof scopes[0]; k++) {
        tg_model *m = tg_model_new(3);
        switch (scopes[k].kind) {
        case 0: tg_model_push(m, NULL); break;
        case 1: tg_model_pop(m); break;
        case 2: for (int i = 0; i < 40; i++) tg_model_push(m, "s%d", i); break;
        case 3: tg_model_push(m, "%s", longname); break;
        case 4: tg_linear_new(m, NULL, 3, 4, NULL); break;
        case 5: tg_conv2d_new(m, "c", 1, 2, 0, 1, 0, 1); break;
        case 6: tg_embedding_new(m, "e", -3, 4); break;
        case 7: tg_layernorm_new(m, "ln", 0, 1e-5, 1); break;
        }
        expect_model_error(scopes[k].label, m, scopes[k].part);
        tg_model_free(m);
    }
    still_usable("model misuse");
}

/* ---------------------------------------------------------------------------------------------
 * tg_compile specs
 * ------------------------------------------------------------------------------------------- */
static void test_compile_misuse(void) {
    const tg_input_decl no_name[] = { { NULL, TG_FLOAT32, TG_SHAPE_INIT(2, 3) }, TG_I32("y", 2) };
    const tg_input_decl empty_name[] = { { "", TG_FLOAT32, TG_SHAPE_INIT(2, 3) }, TG_I32("y", 2) };
    const tg_input_decl bad_dtype[] = { { "x", (tg_dtype)7, TG_SHAPE_INIT(2, 3) }, TG_I32("y", 2) };
    const tg_input_decl rank7[] = { { "x", TG_FLOAT32, { 7, { 1, 1, 1, 1, 2, 3 } } }, TG_I32("y", 2) };
    const tg_input_decl rank_neg[] = { { "x", TG_FLOAT32, { -1, { 6 } } }, TG_I32("y", 2) };
    const tg_input_decl dim0[] = { TG_F32("x", 2, 0), TG_I32("y", 2) };
    const tg_input_decl dim_neg[] = { TG_F32("x", -2, 3), TG_I32("y", 2) };
    const tg_input_decl overflow[] = { TG_F32("x", 1ll << 40, 1ll << 40), TG_I32("y", 2) };
    const tg_input_decl overflow6[] = { { "x", TG_FLOAT32, { 6, { INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX } } },
                                        TG_I32("y", 2) };
    const tg_input_decl dup[] = { TG_F32("x", 2, 3), TG_F32("x", 2, 3) };
    const tg_input_decl wrong_shape[] = { TG_F32("x", 2, 5), TG_I32("y", 2) };
    tg_train_spec good = { .model = M, .loss = good_loss, .inputs = IN, .n_inputs = 2, .optimizer = tg_adam(0.01),
                           .backend = "reference" };
    struct { const char *label; tg_train_spec spec; const char *part; } cases[40];
    int n = 0;
#define SPEC_CASE(l, p, ...) do { cases[n].label = l; cases[n].part = p; cases[n].spec = good; { tg_train_spec *s = &cases[n].spec; __VA_ARGS__; } n++; } while (0)
    SPEC_CASE("compile: NULL model", "model", s->model = NULL);
    SPEC_CASE("compile: NULL loss", "loss", s->loss = NULL);
    SPEC_CASE("compile: inputs NULL", "inputs", s->inputs = NULL);
    SPEC_CASE("compile: n_inputs -1", "inputs", s->n_inputs = -1);
    SPEC_CASE("compile: input name NULL", "no name", s->inputs = no_name);
    SPEC_CASE("compile: input name empty", "no name", s->inputs = empty_name);
    SPEC_CASE("compile: input dtype 7", "dtype 7", s->inputs = bad_dtype);
    SPEC_CASE("compile: input of rank 7", "rank 7", s->inputs = rank7);
    SPEC_CASE("compile: input of rank -1", "rank -1", s->inputs = rank_neg);
    SPEC_CASE("compile: input with a 0 dimension", "dimension <= 0", s->inputs = dim0);
    SPEC_CASE("compile: input with a negative dimension", "dimension <= 0", s->inputs = dim_neg);
    SPEC_CASE("compile: input of 2^80 elements", "too large", s->inputs = overflow);
    SPEC_CASE("compile: input of six INT64_MAX dimensions", "too large", s->inputs = overflow6);
    SPEC_CASE("compile: duplicate input names", "twice", s->inputs = dup);
    SPEC_CASE("compile: input shape the loss rejects", "matmul", s->inputs = wrong_shape);
    SPEC_CASE("compile: unknown backend", "no-such", s->backend = "no-such");
    SPEC_CASE("compile: optimizer kind 9", "unknown kind 9", s->optimizer.kind = (tg_opt_kind)9);
    SPEC_CASE("compile: lr NaN", "finite", s->optimizer = tg_adam(NAN));
    SPEC_CASE("compile: lr inf", "finite", s->optimizer = tg_sgd(INFINITY, 0, 0, 0));
    SPEC_CASE("compile: b1 = 1", "b1 = 1", s->optimizer.b1 = 1);
    SPEC_CASE("compile: b2 = -0.1", "b2 = -0.1", s->optimizer.b2 = -0.1);
    SPEC_CASE("compile: eps = -1", "eps = -1", s->optimizer.eps = -1);
    SPEC_CASE("compile: eps NaN", "eps = nan", s->optimizer.eps = NAN);
    SPEC_CASE("compile: momentum NaN", "momentum", s->optimizer = tg_sgd(0.1, NAN, 0, 0));
    SPEC_CASE("compile: momentum -1", "momentum", s->optimizer = tg_sgd(0.1, -1, 0, 0));
    SPEC_CASE("compile: weight_decay inf", "weight_decay", s->optimizer = tg_adamw(0.1, INFINITY));
    SPEC_CASE("compile: clip_norm NaN", "clip_norm", s->optimizer.clip_norm = NAN);
    SPEC_CASE("compile: schedule kind 42", "unknown kind 42", s->optimizer.lr.kind = (tg_lr_kind)42);
    SPEC_CASE("compile: schedule gamma NaN", "gamma", s->optimizer.lr = tg_lr_staircase(0.1, 10, NAN));
    SPEC_CASE("compile: cuda without a GPU", "CUDA", s->backend = "cuda");
#undef SPEC_CASE
    char why[256];
    bool cuda = tg_backend_available("cuda", why, sizeof why);
    for (int k = 0; k < n; k++) {
        if (cuda && has(cases[k].label, "cuda")) continue;
        tg_error err = { "" };
        tg_train *t = tg_compile(&cases[k].spec, &err);
        CHECK(t == NULL, "%s: compiled", cases[k].label);
        tg_destroy(t);
        expect_msg(cases[k].label, err.msg, cases[k].part);
        CHECK(tg_compile(&cases[k].spec, NULL) == NULL, "%s (no error buffer): compiled", cases[k].label);
    }
    tg_error err = { "" };
    CHECK(tg_compile(NULL, &err) == NULL, "tg_compile(NULL)");
    expect_msg("compile: NULL spec", err.msg, "no spec");
    still_usable("compile misuse");
}

/* ---------------------------------------------------------------------------------------------
 * Steps, evaluations and runs with bad data
 * ------------------------------------------------------------------------------------------- */

/* Every parameter and optimizer value and the step count, as tg_save writes them. */
static char *state_of(tg_train *t, long *len) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/tg_misuse_%d.safetensors", (int)getpid());
    *len = 0;
    if (tg_save(t, path, 1, NULL) != TG_OK) return NULL;
    FILE *f = fopen(path, "rb");
    char *data = NULL;
    if (f && fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)*len)))
        if (fread(data, 1, (size_t)*len, f) != (size_t)*len) { free(data); data = NULL; }
    if (f) fclose(f);
    remove(path);
    return data;
}

static void test_data_misuse(tg_train *t, tg_forward *f, const char *backend) {
    static const int32_t y_bad[2] = { 1, 2 };
    static const float x5[5] = { 1, 2, 3, 4, 5 };
    float x_nan[6], x_inf[6], x_ninf[6];
    memcpy(x_nan, X, sizeof X);
    memcpy(x_inf, X, sizeof X);
    memcpy(x_ninf, X, sizeof X);
    x_nan[4] = NAN;
    x_inf[0] = INFINITY;
    x_ninf[2] = -INFINITY;
    tg_data gx = tg_f32("x", X, 6), gy = tg_i32("y", Y, 2);
    tg_data bad_dtype_x = gx;
    bad_dtype_x.dtype = (tg_dtype)7;
    struct { const char *label; tg_data d[3]; int n; bool null_array; const char *part; } cases[] = {
        { "NULL array, n = 2", { { 0 } }, 2, true, "no array" },
        { "n = -1", { gx, gy }, -1, false, "no array" },
        { "no inputs", { { 0 } }, 0, false, "missing input" },
        { "missing y", { gx }, 1, false, "missing input 'y'" },
        { "unknown name", { gx, gy, tg_f32("z", X, 6) }, 3, false, "unknown input 'z'" },
        { "NULL name", { gx, tg_i32(NULL, Y, 2) }, 2, false, "(null)" },
        { "name given twice", { gx, gy, gx }, 3, false, "twice" },
        { "f32 data for i32 y", { gx, tg_f32("y", X, 2) }, 2, false, "expected i32" },
        { "i32 data for f32 x", { tg_i32("x", Y, 6), gy }, 2, false, "expected f32" },
        { "dtype 7", { bad_dtype_x, gy }, 2, false, "unknown dtype" },
        { "5 elements for 6", { tg_f32("x", x5, 5), gy }, 2, false, "expected 6 elements" },
        { "7 elements for 6", { tg_f32("x", X, 7), gy }, 2, false, "got 7" },
        { "SIZE_MAX elements", { tg_f32("x", X, SIZE_MAX), gy }, 2, false, "expected 6" },
        { "NULL data", { tg_f32("x", NULL, 6), gy }, 2, false, "NULL data" },
        { "NaN in x", { tg_f32("x", x_nan, 6), gy }, 2, false, "NaN" },
        { "+inf in x", { tg_f32("x", x_inf, 6), gy }, 2, false, "is " },
        { "-inf in x", { tg_f32("x", x_ninf, 6), gy }, 2, false, "is " },
    };
    (void)y_bad;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char label[96];
        snprintf(label, sizeof label, "%s: step: %s", backend, cases[k].label);
        const tg_data *d = cases[k].null_array ? NULL : cases[k].d;
        tg_result r;
        if (cases[k].n != 0 || cases[k].null_array) {   /* none: tg_step runs on the batch kept (test_session) */
            long n0, n1;
            char *s0 = state_of(t, &n0);
            int64_t steps = tg_train_step_count(t);
            r = tg_step(t, d, cases[k].n);
            char *s1 = state_of(t, &n1);
            CHECK(r.status == TG_FAILED, "%s: status %d", label, (int)r.status);
            expect_msg(label, r.error, cases[k].part);
            CHECK(s0 && s1 && n0 == n1 && memcmp(s0, s1, (size_t)n0) == 0 && tg_train_step_count(t) == steps,
                  "%s: parameters, optimizer state or step count changed", label);
            free(s0);
            free(s1);
        }
        snprintf(label, sizeof label, "%s: eval: %s", backend, cases[k].label);
        r = tg_eval_loss(t, d, cases[k].n);
        CHECK(r.status == TG_FAILED, "%s: status %d", label, (int)r.status);
        expect_msg(label, r.error, cases[k].part);
        tg_result g = tg_step(t, GOOD_DATA);
        CHECK(g.status == TG_OK, "%s: valid step after it: %s", label, g.error);
        /* The forward takes only x: the same bad x, and NaN flows through as data. */
        bool bad_x = cases[k].n == 2 && !cases[k].null_array && cases[k].d[0].name && strcmp(cases[k].d[0].name, "x") == 0 &&
                     (cases[k].d[0].data != X || cases[k].d[0].n != 6 || cases[k].d[0].dtype != TG_FLOAT32);
        if (bad_x) {
            snprintf(label, sizeof label, "%s: run: %s", backend, cases[k].label);
            r = tg_run(f, cases[k].d, 1);
            n_cases++;
            if (has(cases[k].label, "in x")) {
                bool nonfinite = false;
                for (size_t i = 0; r.status == TG_OK && i < r.output_len; i++) nonfinite |= !isfinite(r.output[i]);
                CHECK(r.status == TG_OK && nonfinite, "%s: a forward passes non-finite data through: status %d", label, (int)r.status);
            } else {
                CHECK(r.status == TG_FAILED && r.error[0], "%s: status %d", label, (int)r.status);
            }
            r = tg_run(f, (tg_data[]){ gx }, 1);
            CHECK(r.status == TG_OK, "%s: valid run after it: %s", label, r.error);
        }
    }
    tg_result r = tg_run(f, (tg_data[]){ gx, gy }, 2);
    CHECK(r.status == TG_FAILED, "run with an input it does not take");
    expect_msg("run: an input the forward does not take", r.error, "unknown input 'y'");
    r = tg_run(f, NULL, 1);
    expect_msg("run: NULL array", r.error, "no array");
    r = tg_run(f, NULL, 0);
    expect_msg("run: no inputs", r.error, "missing input 'x'");
}

static void test_null_handles(void) {
    tg_result r = tg_step(NULL, GOOD_DATA);
    expect_msg("tg_step(NULL)", r.error, "NULL training handle");
    r = tg_steps(NULL, GOOD_DATA, 1, NULL);
    expect_msg("tg_steps(NULL)", r.error, "NULL training handle");
    r = tg_eval_loss(NULL, GOOD_DATA);
    expect_msg("tg_eval_loss(NULL)", r.error, "NULL training handle");
    r = tg_run(NULL, GOOD_DATA);
    expect_msg("tg_run(NULL)", r.error, "NULL forward handle");
    tg_error err = { "" };
    CHECK(tg_attach(NULL, &(tg_forward_spec){ .forward = good_forward, .inputs = IN, .n_inputs = 1 }, &err) == NULL, "attach NULL");
    expect_msg("tg_attach(NULL, spec)", err.msg, "NULL training handle");
    CHECK(tg_attach(T, NULL, &err) == NULL, "attach NULL spec");
    expect_msg("tg_attach(t, NULL)", err.msg, "NULL spec");
    tg_destroy(NULL);
    tg_reset(NULL, 1, 1);
    tg_set_lr(NULL, 0.1);
    tg_schedule s = tg_lr_constant(0.1);
    tg_set_schedule(NULL, &s);
    tg_set_schedule(T, NULL);
    n_cases += 5;
    CHECK(tg_train_step_count(NULL) == 0 && tg_train_lr(NULL) == 0 && tg_train_n_params(NULL) == 0, "NULL getters");
    CHECK(tg_train_param_name(NULL, 0) == NULL && tg_train_param_name(T, -1) == NULL && tg_train_param_name(T, 99) == NULL,
          "param name out of range");
    CHECK(tg_train_param_shape(NULL, 0).ndim == 0 && tg_train_param_shape(T, 99).ndim == 0, "param shape out of range");
    CHECK(tg_train_graph(NULL) == NULL && tg_forward_graph(NULL) == NULL && tg_graph_n_nodes(NULL) == 0 &&
          tg_graph_output(NULL) == -1 && tg_graph_dot(NULL) == NULL && tg_train_planned_bytes(NULL) == 0, "NULL inspection");
    const tg_graph *g = tg_train_graph(T);
    CHECK(tg_graph_node(g, -1).op == NULL && tg_graph_node(g, tg_graph_n_nodes(g)).op == NULL && tg_graph_node(NULL, 0).op == NULL,
          "nodes out of range");
    n_cases += 5;
    still_usable("NULL handles");
}

/* Every function that takes a handle, called with one that was destroyed: refused by name (the
 * library keeps a registry of live handles), never a read of freed memory (ASan checks). */
static void test_destroyed_handles(void) {
    tg_error err = { "" };
    tg_train *t = compile_on("reference", good_loss, &err);
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = good_forward, .inputs = IN, .n_inputs = 1 }, &err) : NULL;
    CHECK(t && f, "setup: %s", err.msg);
    if (!t || !f) return;
    tg_destroy(t);
    float buf[12];
    tg_result r = tg_step(t, GOOD_DATA);
    expect_msg("tg_step(destroyed)", r.error, "destroyed");
    r = tg_steps(t, GOOD_DATA, 1, NULL);
    expect_msg("tg_steps(destroyed)", r.error, "destroyed");
    r = tg_eval_loss(t, GOOD_DATA);
    expect_msg("tg_eval_loss(destroyed)", r.error, "destroyed");
    r = tg_run(f, (tg_data[]){ tg_f32("x", X, 6) }, 1);
    expect_msg("tg_run(forward of destroyed)", r.error, "destroyed");
    CHECK(tg_attach(t, &(tg_forward_spec){ .forward = good_forward, .inputs = IN, .n_inputs = 1 }, &err) == NULL, "attach");
    expect_msg("tg_attach(destroyed)", err.msg, "destroyed");
    CHECK(tg_download_param(t, "l1.b", buf, 4, &err) == TG_FAILED, "download");
    expect_msg("tg_download_param(destroyed)", err.msg, "destroyed");
    CHECK(tg_download_param_grad(t, "l1.b", buf, 4, &err) == TG_FAILED, "grad");
    expect_msg("tg_download_param_grad(destroyed)", err.msg, "destroyed");
    CHECK(tg_upload_params(t, (tg_data[]){ tg_f32("l1.b", buf, 4) }, 1, &err) == TG_FAILED, "upload");
    expect_msg("tg_upload_params(destroyed)", err.msg, "destroyed");
    CHECK(tg_save(t, "/tmp/never.safetensors", 1, &err) == TG_FAILED, "save");
    expect_msg("tg_save(destroyed)", err.msg, "destroyed");
    CHECK(tg_load(t, "/tmp/never.safetensors", 1, &err) == TG_FAILED, "load");
    expect_msg("tg_load(destroyed)", err.msg, "destroyed");
    CHECK(tg_replace_model(t, M, NULL, &err) == TG_FAILED, "replace");
    expect_msg("tg_replace_model(destroyed)", err.msg, "destroyed");
    CHECK(tg_train_capture(t, "h", buf, 1, NULL, &err) == TG_FAILED, "train capture");
    expect_msg("tg_train_capture(destroyed)", err.msg, "destroyed");
    CHECK(tg_forward_capture(f, "h", buf, 1, NULL, &err) == TG_FAILED, "forward capture");
    expect_msg("tg_forward_capture(destroyed)", err.msg, "destroyed");
    CHECK(tg_patch_set(f, "h", TG_PATCH_ZERO, NULL, 0, &err) == TG_FAILED, "patch set");
    expect_msg("tg_patch_set(destroyed)", err.msg, "destroyed");
    CHECK(tg_patch_from(f, "h", (tg_data[]){ tg_f32("x", X, 6) }, 1, &err) == TG_FAILED, "patch from");
    expect_msg("tg_patch_from(destroyed)", err.msg, "destroyed");
    CHECK(tg_reset(t, 1, 1) == TG_FAILED, "reset");
    tg_set_lr(t, 0.1);
    tg_patch_clear(f);
    tg_detach(f);
    tg_destroy(t);
    CHECK(tg_step_submit(t, GOOD_DATA) == NULL && tg_run_submit(f, (tg_data[]){ tg_f32("x", X, 6) }, 1) == NULL, "submit");
    CHECK(tg_train_step_count(t) == 0 && tg_train_lr(t) == 0 && tg_train_n_params(t) == 0 && tg_train_param_name(t, 0) == NULL &&
          tg_train_graph(t) == NULL && tg_forward_graph(f) == NULL && tg_train_planned_bytes(t) == 0 && tg_train_param_total(t) == 0 &&
          tg_train_kernel_source(t) == NULL && tg_forward_kernel_source(f) == NULL && tg_forward_n_variants(f) == 0, "getters");
    n_cases += 8;   /* reset, set_lr, patch_clear, detach, destroy again, submits, getters */
    still_usable("destroyed handles");
}

/* ---------------------------------------------------------------------------------------------
 * Attach
 * ------------------------------------------------------------------------------------------- */
static int attach_kind;
static tg_tensor attach_forward(const void *ctx, const tg_tensor *in) {
    switch (attach_kind) {
    case 0: return tg_argmax(tg_linear(&L1, in[0]), -1);    /* i32 output */
    case 1: return SAVED;                                    /* another graph's tensor */
    case 2: return tg_linear(&L1, tg_reshape(in[0], 3, 2));  /* shape error */
    default: return tg_add(tg_zeros(TG_FLOAT32, 1ll << 32, 1), tg_zeros(TG_FLOAT32, 1, 1ll << 32));
    }
}

static void test_attach_misuse(void) {
    const tg_input_decl dup[] = { TG_F32("x", 2, 3), TG_F32("x", 2, 3) };
    struct { const char *label; tg_forward_spec spec; int kind; const char *part; } cases[] = {
        { "attach: NULL forward", { NULL, NULL, IN, 1, 0, TG_PRECISION_DEFAULT }, 0, "forward" },
        { "attach: inputs NULL", { attach_forward, NULL, NULL, 1, 0, TG_PRECISION_DEFAULT }, 0, "inputs" },
        { "attach: duplicate inputs", { attach_forward, NULL, dup, 2, 0, TG_PRECISION_DEFAULT }, 0, "twice" },
        { "attach: i32 output", { attach_forward, NULL, IN, 1, 0, TG_PRECISION_DEFAULT }, 0, "f32" },
        { "attach: output of another graph", { attach_forward, NULL, IN, 1, 0, TG_PRECISION_DEFAULT }, 1, "another graph" },
        { "attach: shape error", { attach_forward, NULL, IN, 1, 0, TG_PRECISION_DEFAULT }, 2, "matmul" },
        { "attach: overflowing broadcast", { attach_forward, NULL, IN, 1, 0, TG_PRECISION_DEFAULT }, 3, "too large" },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        attach_kind = cases[k].kind;
        tg_error err = { "" };
        tg_forward *f = tg_attach(T, &cases[k].spec, &err);
        CHECK(f == NULL, "%s: attached", cases[k].label);
        expect_msg(cases[k].label, err.msg, cases[k].part);
        still_usable(cases[k].label);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Parameters, learning rates, checkpoints, backends
 * ------------------------------------------------------------------------------------------- */
static int params_unchanged(const float *before) {
    float now[12];
    return tg_download_param(T, "l1.W", now, 12, NULL) == TG_OK && memcmp(now, before, sizeof now) == 0;
}

static void test_param_misuse(void) {
    float w[12], dst[12], nan_w[12], inf_w[12];
    tg_error err = { "" };
    CHECK(tg_download_param(T, "l1.W", w, 12, &err) == TG_OK, "download: %s", err.msg);
    memcpy(nan_w, w, sizeof w);
    memcpy(inf_w, w, sizeof w);
    nan_w[7] = NAN;
    inf_w[0] = -INFINITY;
    struct { const char *label; int op; const char *name; float *dst; size_t n; const char *part; } dl[] = {
        { "download: NULL handle", 0, "l1.W", dst, 12, "NULL training handle" },
        { "download: NULL name", 0, NULL, dst, 12, "(null)" },
        { "download: unknown name", 0, "l9.W", dst, 12, "l9.W" },
        { "download: 11 of 12 elements", 0, "l1.W", dst, 11, "12 elements, not 11" },
        { "download: SIZE_MAX elements", 0, "l1.W", dst, SIZE_MAX, "12 elements" },
        { "download: NULL destination", 0, "l1.W", NULL, 12, "NULL destination" },
        { "grad download: NULL handle", 1, "l1.W", dst, 12, "NULL training handle" },
        { "grad download: unknown name", 1, "nope", dst, 12, "nope" },
        { "grad download: wrong count", 1, "l1.b", dst, 3, "4 elements, not 3" },
        { "grad download: NULL destination", 1, "l1.W", NULL, 12, "NULL destination" },
        { "grad download: unused parameter", 1, "unused", dst, 2, "does not affect" },
    };
    for (size_t k = 0; k < sizeof dl / sizeof dl[0]; k++) {
        memset(&err, 0, sizeof err);
        tg_train *t = has(dl[k].label, "NULL handle") ? NULL : T;
        tg_status st = dl[k].op ? tg_download_param_grad(t, dl[k].name, dl[k].dst, dl[k].n, &err)
                                : tg_download_param(t, dl[k].name, dl[k].dst, dl[k].n, &err);
        CHECK(st == TG_FAILED, "%s: status %d", dl[k].label, (int)st);
        expect_msg(dl[k].label, err.msg, dl[k].part);
    }
    struct { const char *label; tg_data d[2]; int n; bool null_array; const char *part; } up[] = {
        { "upload: NULL array", { { 0 } }, 1, true, "no array" },
        { "upload: n = -1", { tg_f32("l1.W", w, 12) }, -1, false, "no array" },
        { "upload: unknown name", { tg_f32("l1.V", w, 12) }, 1, false, "l1.V" },
        { "upload: NULL name", { tg_f32(NULL, w, 12) }, 1, false, "(null)" },
        { "upload: 11 elements", { tg_f32("l1.W", w, 11) }, 1, false, "not 11" },
        { "upload: i32 data", { tg_i32("l1.W", (const int32_t *)w, 12) }, 1, false, "f32" },
        { "upload: NULL data", { tg_f32("l1.W", NULL, 12) }, 1, false, "f32 data" },
        { "upload: NaN value", { tg_f32("l1.W", nan_w, 12) }, 1, false, "element 7 is NaN" },
        { "upload: -inf value", { tg_f32("l1.W", inf_w, 12) }, 1, false, "element 0 is infinite" },
        { "upload: a good entry then a bad one", { tg_f32("l1.W", w, 12), tg_f32("l1.b", w, 5) }, 2, false, "l1.b" },
    };
    for (size_t k = 0; k < sizeof up / sizeof up[0]; k++) {
        memset(&err, 0, sizeof err);
        CHECK(tg_download_param(T, "l1.W", w, 12, NULL) == TG_OK, "download");
        tg_status st = tg_upload_params(T, up[k].null_array ? NULL : up[k].d, up[k].n, &err);
        CHECK(st == TG_FAILED, "%s: status %d", up[k].label, (int)st);
        expect_msg(up[k].label, err.msg, up[k].part);
        CHECK(params_unchanged(w), "%s: parameters changed", up[k].label);
        CHECK(tg_upload_params(NULL, up[k].d, 1, NULL) == TG_FAILED, "upload to NULL");
    }
    still_usable("parameter misuse");
}

static void test_lr_misuse(void) {
    float w[12];
    const double bad[] = { NAN, INFINITY, -1.0 };
    for (int k = 0; k < 3; k++) {
        char label[64];
        snprintf(label, sizeof label, "tg_set_lr(%g) then a step", bad[k]);
        CHECK(tg_download_param(T, "l1.W", w, 12, NULL) == TG_OK, "download");
        int64_t steps = tg_train_step_count(T);
        tg_set_lr(T, bad[k]);
        tg_result r = tg_step(T, GOOD_DATA);
        CHECK(r.status == TG_FAILED, "%s: status %d", label, (int)r.status);
        expect_msg(label, r.error, "learning rate");
        CHECK(params_unchanged(w) && tg_train_step_count(T) == steps, "%s: the step changed something", label);
        tg_set_lr(T, 0.01);
        still_usable(label);
    }
    /* A warmup that hands over to itself with no warmup steps: a cycle, which must end. */
    tg_schedule cyc = tg_lr_warmup(0.01, 0, NULL);
    cyc.after = &cyc;
    n_cases += 3;
    CHECK(isfinite(tg_schedule_at(&cyc, 5)) && tg_schedule_at(NULL, 1) == 0, "a cyclic schedule's value");
    tg_set_schedule(T, &cyc);
    CHECK(isfinite(tg_train_lr(T)), "tg_train_lr with a cyclic schedule");
    still_usable("a cyclic schedule");
    tg_schedule ms = tg_lr_multistep(0.02, NULL, 3, 0.5);
    CHECK(tg_schedule_at(&ms, 10) == 0.02, "multistep with NULL milestones: %g", tg_schedule_at(&ms, 10));
    tg_set_lr(T, 0.01);
}

static void test_checkpoint_misuse(void) {
    char path[96], other[96];
    snprintf(path, sizeof path, "/tmp/tg_misuse_ck_%d.safetensors", (int)getpid());
    snprintf(other, sizeof other, "/tmp/tg_misuse_other_%d.safetensors", (int)getpid());
    float w[12];
    CHECK(tg_download_param(T, "l1.W", w, 12, NULL) == TG_OK, "download");
    tg_error err = { "" };
    CHECK(tg_save(NULL, path, 1, &err) == TG_FAILED, "save NULL");
    expect_msg("tg_save(NULL)", err.msg, "NULL training handle");
    CHECK(tg_save(T, NULL, 1, &err) == TG_FAILED, "save NULL path");
    expect_msg("tg_save(t, NULL)", err.msg, "NULL path");
    CHECK(tg_save(T, "/nonexistent-dir/x.safetensors", 1, &err) == TG_FAILED, "save into a missing directory");
    expect_msg("tg_save into a missing directory", err.msg, "nonexistent-dir");
    CHECK(tg_load(NULL, path, 1, &err) == TG_FAILED, "load NULL");
    expect_msg("tg_load(NULL)", err.msg, "NULL training handle");
    CHECK(tg_load(T, NULL, 1, &err) == TG_FAILED, "load NULL path");
    expect_msg("tg_load(t, NULL)", err.msg, "NULL path");
    CHECK(tg_load(T, "/nonexistent-dir/x.safetensors", 1, &err) == TG_FAILED, "load of a missing file");
    expect_msg("tg_load of a missing file", err.msg, "nonexistent-dir");
    /* A checkpoint of another model (its parameter is not ours), one without optimizer state
     * loaded with it, and a truncated one. */
    tg_model *m2 = tg_model_new(5);
    tg_linear l2 = tg_linear_new(m2, "l2", 3, 4, NULL);
    (void)l2;
    CHECK(tg_save(T, path, 0, &err) == TG_OK, "save: %s", err.msg);
    CHECK(tg_load(T, path, 1, &err) == TG_FAILED, "load with optimizer from a file without");
    expect_msg("tg_load: optimizer state missing", err.msg, "optimizer");
    FILE *f = fopen(path, "rb");
    char buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    f = fopen(other, "wb");
    if (f) {
        fwrite(buf, 1, n / 2, f);
        fclose(f);
    }
    CHECK(tg_load(T, other, 0, &err) == TG_FAILED, "load of a truncated file");
    expect_msg("tg_load of a truncated file", err.msg, other);
    tg_model_free(m2);
    CHECK(params_unchanged(w), "failed loads changed the parameters");
    remove(path);
    remove(other);
    still_usable("checkpoint misuse");
}

static void test_backend_misuse(void) {
    char why[64] = "untouched", tiny[4] = "xyz";
    CHECK(tg_backend_available(NULL, why, sizeof why) == 1, "NULL backend name picks the default");
    CHECK(tg_backend_available("no-such", why, sizeof why) == 0, "unknown backend available");
    expect_msg("tg_backend_available(\"no-such\")", why, "no-such");
    CHECK(tg_backend_available("no-such", tiny, sizeof tiny) == 0 && strlen(tiny) == 3, "a 4-byte buffer is cut, not overrun");
    CHECK(tg_backend_available("no-such", NULL, 64) == 0 && tg_backend_available("no-such", why, 0) == 0, "NULL / 0-length buffers");
    CHECK(strlen(tg_version()) > 0, "tg_version");
    n_cases += 4;
}

int main(void) {
    setup();
    if (!T || !T2 || !F) return check_report("test_misuse");
    test_trace_misuse();
    test_outside_tracing();
    test_model_misuse();
    test_compile_misuse();
    test_null_handles();
    test_destroyed_handles();
    test_attach_misuse();
    test_data_misuse(T, F, "reference");
    /* The same data misuse on the compiled CPU backend. */
    tg_error err = { "" };
    tg_train *tc = compile_on("cpu", good_loss, &err);
    CHECK(tc != NULL, "cpu compile: %s", err.msg);
    tg_forward *fc = tc ? tg_attach(tc, &(tg_forward_spec){ .forward = good_forward, .inputs = IN, .n_inputs = 1 }, &err) : NULL;
    if (tc && fc) test_data_misuse(tc, fc, "cpu");
    tg_destroy(tc);
    test_param_misuse();
    test_lr_misuse();
    test_checkpoint_misuse();
    test_backend_misuse();
    tg_destroy(T);
    tg_destroy(T2);
    tg_model_free(M);
    printf("test_misuse: %d misuse cases, each followed by a valid call on the same handle\n", n_cases);
    return check_report("test_misuse");
}
