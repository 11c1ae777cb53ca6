/* Every backend against the reference interpreter, op by op (ggml's test-backend-ops is the
 * model): each case runs forward and all gradients on the reference (f32) and on the compiled
 * CPU backend, fused and unfused (and on the library kernels' portable paths, and on the
 * portable kernels exported files carry), on the same random inputs; outputs and gradients must
 * agree to 1e-4 relative. Then the kernel cache (miss, hit, corrupt file), compiler failures, and whole
 * training runs compared step by step. TG_TEST_CASES=a,b runs only the cases whose names contain
 * a or b (a device run's extra passes), TG_TEST_SHARD=k/n the k-th of n shares of them (n
 * processes at once). TG_TEST_CUDA_ONLY runs only what a GPU machine adds: every case and the
 * trained models on CUDA at each precision, the CPU's bf16 path. */
#include "check.h"
#include "internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    ADD, SUB, MUL, DIV, MINIMUM, MAXIMUM, LESS, WHERE, NEG, ABS, SQUARE, SQRT, RSQRT, EXP, LOG, RELU, TANH,
    SIGMOID, SIN, COS, GELU, GELU_WIDE, GELU_TANH, SILU, CLAMP, SUM0, SUM_LAST, SUM_ALL, MEAN1, RESHAPE, PERMUTE,
    SWAPAXES, MATMUL, MATMUL_BATCHED, MATMUL_BCAST, ONE_HOT, EMBEDDING, SOFTMAX, SOFTMAX_MID, LOG_SOFTMAX,
    CROSS_ENTROPY, NLL_SUM, ARGMAX, ARGMIN_ALL, FLATTEN, SPLIT_HEADS, SPLIT_HEADS_BIAS, MERGE_HEADS, TAKE_ALONG, ARANGE, ONES,
    NARROW, CONCAT3, STACK, SPLIT, SOFTMAX_CAUSAL, WHERE_CAUSAL, STOP_GRADIENT, DROPOUT, RANDN, CONV2D,
    CONV2D_S2, CONV2D_BIG, CONV2D_BIAS, CONV2D_P2, CONV2D_P0, CONV2D_BIAS_RELU, CONV_BLOCK, LINEAR, LINEAR_RELU, LINEAR_GELU, PRODUCTS_SUMMED,
    MAXPOOL, MAXPOOL_PAD, MAXPOOL_RELU, MAXPOOL_PAD_RELU,
    UPSAMPLE, LAYERNORM_CHAIN, ATTENTION, SCALAR_CHAIN, FUSED_ATTN, FUSED_ATTN_CAUSAL, MERGED_ATTN, SPLIT_ATTN, SPLIT_ATTN_CAUSAL, QKV_BIAS, PROJ_ATTN, SOFTMAX_BIAS, CE_BIAS,
};

typedef struct {
    const char *name;
    int op;
    int n_in;
    tg_input_decl in[3];
    int i32_max;      /* i32 inputs are drawn from [0, i32_max) (a few out of range when negative) */
    bool positive;    /* f32 inputs from [0.5, 2] instead of [-2, 2] */
    bool long_sums;   /* dot products long enough that rounding differs by summation order: errors
                       * are measured against the output's RMS rather than each element */
} bcase;

static tg_tensor op_fwd(const bcase *c, const tg_tensor *in) {
    /* A case has 1 to 3 inputs; the ones it lacks are never used by its op. */
    tg_tensor none = { NULL, -1 };
    tg_tensor x = in[0], y = c->n_in > 1 ? in[1] : none, z = c->n_in > 2 ? in[2] : none;
    switch (c->op) {
    case ADD: return tg_add(x, y);
    case SUB: return tg_sub(1.5, tg_sub(x, y));
    case MUL: return tg_mul(x, y);
    case DIV: return tg_div(x, y);
    case MINIMUM: return tg_minimum(x, y);
    case MAXIMUM: return tg_maximum(x, y);
    case LESS: return tg_mul(tg_less(x, y), x);
    case WHERE: return tg_where(tg_greater(x, 0.0), y, tg_mul(x, 3.0));
    case NEG: return tg_neg(x);
    case ABS: return tg_abs(x);
    case SQUARE: return tg_square(x);
    case SQRT: return tg_sqrt(x);
    case RSQRT: return tg_rsqrt(x);
    case EXP: return tg_exp(x);
    case LOG: return tg_log(x);
    case RELU: return tg_relu(x);
    case TANH: return tg_tanh(x);
    case SIGMOID: return tg_sigmoid(x);
    case SIN: return tg_sin(x);
    case COS: return tg_cos(x);
    case GELU: return tg_gelu(x);
    case GELU_WIDE: return tg_gelu(tg_mul(x, tg_scalar(7)));
    case GELU_TANH: return tg_gelu_tanh(x);
    case SILU: return tg_silu(x);
    case CLAMP: return tg_clamp(x, -0.5, 0.7);
    case SUM0: return tg_sum(x, 0, 0);
    case SUM_LAST: return tg_sum(tg_mul(x, y), -1, 1);
    case SUM_ALL: return tg_sum(tg_exp(x), TG_ALL, 0);
    case MEAN1: return tg_mean(x, 1, 0);
    case RESHAPE: return tg_reshape(tg_tanh(x), 5, -1);
    case PERMUTE: return tg_permute(tg_mul(x, 2.0), 2, 0, 1);
    case SWAPAXES: return tg_add(tg_swapaxes(x, 0, 2), 1.0);
    case MATMUL: return tg_matmul(x, y);
    case MATMUL_BATCHED: return tg_matmul(x, y);
    case MATMUL_BCAST: return tg_matmul(x, tg_swapaxes(y, -1, -2));
    case ONE_HOT: return tg_mul(tg_one_hot(z, 7), x);
    case EMBEDDING: return tg_embedding(x, z);
    case SOFTMAX: return tg_softmax(x, -1);
    case SOFTMAX_MID: return tg_softmax(x, 1);
    case LOG_SOFTMAX: return tg_log_softmax(x, 0);
    case CROSS_ENTROPY: return tg_cross_entropy(x, z, TG_MEAN);
    case SOFTMAX_BIAS: return tg_softmax(tg_add(x, y), -1);   /* the source computed in the softmax's kernel */
    case CE_BIAS: return tg_cross_entropy(tg_add(x, y), z, TG_MEAN);
    case NLL_SUM: return tg_nll_loss(tg_log_softmax(x, -1), z, TG_SUM);
    case ARGMAX: return tg_argmax(x, 1);
    case ARGMIN_ALL: return tg_argmin(x, TG_ALL);
    case FLATTEN: return tg_flatten(tg_mul(x, x), 1);
    case SPLIT_HEADS: return tg_split_heads(x, 2);
    case SPLIT_HEADS_BIAS: return tg_split_heads(tg_add(x, y), 2);
    case MERGE_HEADS: return tg_merge_heads(tg_sigmoid(x));
    case TAKE_ALONG: return tg_take_along_axis(x, z, 1);
    case ARANGE: return tg_mul(x, tg_arange(6, TG_FLOAT32));
    case ONES: return tg_add(x, tg_ones(TG_FLOAT32, 4, 6));
    case NARROW: return tg_narrow(tg_exp(x), 1, 2, 3);
    case CONCAT3: return tg_concat((tg_tensor[]){ x, tg_square(x), y }, 3, 1);
    case STACK: return tg_stack((tg_tensor[]){ x, tg_neg(x), y }, 3, -1);
    case SPLIT: {
        tg_tensor parts[3];
        tg_split(x, (int64_t[]){ 1, 3, 2 }, 3, 1, parts);
        return tg_add(tg_mul(parts[0], parts[2]), tg_sum(parts[1], 1, 1));
    }
    case SOFTMAX_CAUSAL: return tg_softmax_causal(x);
    case WHERE_CAUSAL: return tg_where_causal(x, -3.0);
    case STOP_GRADIENT: return tg_mul(tg_stop_gradient(x), y);
    case DROPOUT: return tg_dropout(x, 0.3);
    case RANDN: return tg_add(x, tg_randn(4, 6));
    case CONV2D: return tg_conv2d(x, y, 1, 1);
    case CONV2D_S2: return tg_conv2d(x, y, 2, 0);
    case CONV2D_BIG: return tg_relu(tg_conv2d(x, y, 2, 1));
    case CONV2D_BIAS: return tg_add(tg_conv2d(x, y, 1, 1), tg_reshape(z, -1, 1, 1));
    case CONV2D_P2: return tg_conv2d(x, y, 1, 2);
    case CONV2D_P0: return tg_conv2d(x, y, 1, 0);
    case CONV2D_BIAS_RELU: return tg_relu(tg_add(tg_conv2d(x, y, 1, 1), tg_reshape(z, -1, 1, 1)));
    case CONV_BLOCK: return tg_max_pool2d(tg_relu(tg_add(tg_conv2d(x, y, 1, 1), tg_reshape(z, -1, 1, 1))), 2, 2, 0);
    case LINEAR: return tg_add(tg_matmul(x, y), z);
    case LINEAR_RELU: return tg_relu(tg_add(tg_matmul(x, y), z));
    case LINEAR_GELU: return tg_gelu(tg_add(tg_matmul(x, y), z));
    case PRODUCTS_SUMMED: return tg_add(tg_add(tg_matmul(x, y), tg_matmul(x, z)), tg_matmul(tg_square(x), y));
    case MAXPOOL: return tg_max_pool2d(x, 2, 2, 0);
    case MAXPOOL_PAD: return tg_max_pool2d(x, 3, 2, 1);
    case MAXPOOL_RELU: return tg_max_pool2d(tg_relu(x), 2, 2, 0);
    case MAXPOOL_PAD_RELU: return tg_max_pool2d(tg_relu(x), 3, 2, 1);
    case UPSAMPLE: return tg_nearest_upsample2d(x, 2);
    case LAYERNORM_CHAIN: {
        tg_tensor mu = tg_mean(x, -1, 1), xc = tg_sub(x, mu);
        return tg_mul(tg_mul(xc, tg_rsqrt(tg_add(tg_mean(tg_square(xc), -1, 1), 1e-5))), y);
    }
    case ATTENTION: {
        tg_tensor q = tg_split_heads(x, 2), k = tg_split_heads(y, 2);
        tg_tensor att = tg_softmax_causal(tg_mul(tg_matmul(q, tg_swapaxes(k, -1, -2)), 0.5));
        return tg_merge_heads(tg_matmul(att, k));
    }
    case SCALAR_CHAIN: return tg_div(tg_add(tg_mul(x, 2.0), 1.0), tg_add(tg_square(x), 1.0));
    case FUSED_ATTN: return tg_attention(x, y, z, 0, 0.3);
    case FUSED_ATTN_CAUSAL: return tg_attention(x, y, z, 1, 1.0 / sqrt((double)node_of(x)->shape.d[node_of(x)->shape.ndim - 1]));
    case MERGED_ATTN: return tg_merge_heads(tg_attention(x, y, z, 1, 0.25));
    case SPLIT_ATTN: case SPLIT_ATTN_CAUSAL: {   /* [.., T, H, D] operands, split and merged as a model does */
        tg_tensor o = tg_attention(tg_swapaxes(x, -3, -2), tg_swapaxes(y, -3, -2), tg_swapaxes(z, -3, -2), c->op == SPLIT_ATTN_CAUSAL,
                                   c->op == SPLIT_ATTN_CAUSAL ? 0.25 : 0.3);
        return tg_swapaxes(o, -3, -2);
    }
    case QKV_BIAS: {   /* q, k and v as biased projections, as a transformer block has them */
        tg_tensor w[3], b[3], h[3];
        tg_split(y, (int64_t[]){ 16, 16, 16 }, 3, 1, w);
        tg_split(z, (int64_t[]){ 16, 16, 16 }, 3, 0, b);
        for (int k = 0; k < 3; k++) h[k] = tg_split_heads(tg_add(tg_matmul(x, w[k]), b[k]), 2);
        return tg_merge_heads(tg_attention(h[0], h[1], h[2], 1, 0.25));
    }
    case PROJ_ATTN: {   /* attention reads a biased projection: on CUDA the bias is the product's (cuda_fold_addends) */
        tg_tensor h = tg_split_heads(tg_add(tg_matmul(x, y), z), 2);   /* entries ~20: a small scale keeps softmax soft */
        return tg_merge_heads(tg_attention(h, h, h, 1, 1e-3));
    }
    }
    return x;
}

#define F(name, ...) TG_F32(name, __VA_ARGS__)
#define I(name, ...) TG_I32(name, __VA_ARGS__)
static const bcase CASES[] = {
    { "add broadcast", ADD, 2, { F("x", 3, 1, 5), F("y", 4, 1) }, 0, false, false },
    { "sub scalar", SUB, 2, { F("x", 7), F("y", 1) }, 0, false, false },
    { "mul", MUL, 2, { F("x", 5, 6), F("y", 5, 6) }, 0, false, false },
    { "div", DIV, 2, { F("x", 4, 3), F("y", 3) }, 0, true, false },
    { "minimum", MINIMUM, 2, { F("x", 3, 4), F("y", 4) }, 0, false, false },
    { "maximum", MAXIMUM, 2, { F("x", 3, 4), F("y", 3, 1) }, 0, false, false },
    { "less", LESS, 2, { F("x", 9), F("y", 9) }, 0, false, false },
    { "where", WHERE, 2, { F("x", 2, 5), F("y", 5) }, 0, false, false },
    { "neg", NEG, 1, { F("x", 3, 3) }, 0, false, false },
    { "abs", ABS, 1, { F("x", 11) }, 0, false, false },
    { "square", SQUARE, 1, { F("x", 11) }, 0, false, false },
    { "sqrt", SQRT, 1, { F("x", 11) }, 0, true, false },
    { "rsqrt", RSQRT, 1, { F("x", 11) }, 0, true, false },
    { "exp", EXP, 1, { F("x", 11) }, 0, false, false },
    { "log", LOG, 1, { F("x", 11) }, 0, true, false },
    { "relu", RELU, 1, { F("x", 4, 5) }, 0, false, false },
    { "tanh", TANH, 1, { F("x", 4, 5) }, 0, false, false },
    { "sigmoid", SIGMOID, 1, { F("x", 4, 5) }, 0, false, false },
    { "sin", SIN, 1, { F("x", 13) }, 0, false, false },
    { "cos", COS, 1, { F("x", 13) }, 0, false, false },
    { "gelu", GELU, 1, { F("x", 13) }, 0, false, false },
    /* GELU on [-14, 14]: the compiled backends' Mills-ratio form (expr.c, tgk_mills) in its tails too */
    { "gelu, wide inputs", GELU_WIDE, 1, { F("x", 64) }, 0, false, false },
    /* A million elements: CUDA's pointwise kernels take several a thread (pointwise_kernel's
     * ELEMS); at bf16 the product's output, the bias added and the gelu are bf16 activations, the
     * product's kept in bf16 only. (Among a million draws some land where gelu's gradient
     * crosses zero: errors against the RMS, as for long sums.) */
    { "gelu, a million elements", GELU, 1, { F("x", 1024, 1024) }, 0, false, true },
    { "gelu(matmul + bias), a million elements", LINEAR_GELU, 3, { F("x", 1024, 40), F("y", 40, 1024), F("b", 1024) }, 0, false,
      true },
    { "gelu_tanh", GELU_TANH, 1, { F("x", 13) }, 0, false, false },
    { "silu", SILU, 1, { F("x", 13) }, 0, false, false },
    { "clamp", CLAMP, 1, { F("x", 13) }, 0, false, false },
    { "sum axis 0", SUM0, 1, { F("x", 6, 5) }, 0, false, false },
    { "sum last keep (fused mul)", SUM_LAST, 2, { F("x", 3, 4, 5), F("y", 5) }, 0, false, false },
    { "sum all (fused exp)", SUM_ALL, 1, { F("x", 3, 7) }, 0, false, false },
    { "sum all, long (rows cut in chunks on CUDA, their sums added in order)", SUM_ALL, 1, { F("x", 40, 300) }, 0, false, true },
    { "mean axis 1", MEAN1, 1, { F("x", 2, 5, 3) }, 0, false, false },
    { "sum axis 0, long (chunked on CUDA)", SUM0, 1, { F("x", 3000, 3) }, 0, false, false },
    /* few rows of many columns: one thread a column (a pair at 131,072 columns), every row (thin_sum);
     * among so many sums some cancel to near zero (errors against the RMS) */
    { "sum axis 0, few rows of many columns", SUM0, 1, { F("x", 48, 50000) }, 0, false, true },
    { "sum axis 0, few rows of many columns in pairs", SUM0, 1, { F("x", 20, 131072) }, 0, false, true },
    { "sum axis 0, long, 3 column groups (chunked on CUDA)", SUM0, 1, { F("x", 700, 70) }, 0, false, false },
    { "mean axis 1, long, outer and inner (chunked on CUDA)", MEAN1, 1, { F("x", 3, 400, 50) }, 0, false, false },
    { "sum last, long rows (a warp each on CUDA)", SUM_LAST, 2, { F("x", 2, 3, 700), F("y", 700) }, 0, false, false },
    { "reshape", RESHAPE, 1, { F("x", 2, 3, 5) }, 0, false, false },
    { "permute", PERMUTE, 1, { F("x", 2, 3, 4) }, 0, false, false },
    { "swapaxes", SWAPAXES, 1, { F("x", 2, 3, 4) }, 0, false, false },
    { "matmul", MATMUL, 2, { F("x", 5, 7), F("y", 7, 3) }, 0, false, false },
    { "matmul batched x 2-D", MATMUL_BATCHED, 2, { F("x", 2, 3, 4), F("y", 4, 5) }, 0, false, false },
    { "matmul broadcast batch", MATMUL_BCAST, 2, { F("x", 2, 1, 3, 4), F("y", 3, 5, 4) }, 0, false, false },
    /* Shapes past the CPU product's register tiles (AVX-512 8 x 32, AVX2 6 x 16) and packed
     * blocks (128 or 144 x 256 x 512), with ragged edges; a bias the product kernel adds;
     * batches the weight gradient sums. */
    { "matmul past the blocks", MATMUL, 2, { F("x", 137, 300), F("y", 300, 531) }, 0, false, true },
    { "matmul past the AVX2 blocks", MATMUL, 2, { F("x", 151, 263), F("y", 263, 517) }, 0, false, true },
    { "matmul deeper than two bf16 blocks, odd depth", MATMUL, 2, { F("x", 9, 1031), F("y", 1031, 7) }, 0, false, true },
    { "matmul + bias (fused add)", LINEAR, 3, { F("x", 45, 70), F("y", 70, 33), F("b", 33) }, 0, false, true },
    /* a sum of products, as x's gradient through q, k and v (at bf16 one product adds the last's
     * output: beta = 1, cuda_fold_addends) */
    { "three products summed", PRODUCTS_SUMMED, 3, { F("x", 40, 48), F("y", 48, 36), F("z", 48, 36) }, 0, false, true },
    /* relu(product + bias): the product kernel applies the relu (MM_RELU), on the whole product or,
     * above PARALLEL_MACS, on each thread's block of columns */
    { "matmul + bias + relu (fused)", LINEAR_RELU, 3, { F("x", 45, 70), F("y", 70, 33), F("b", 33) }, 0, false, true },
    { "matmul + bias + relu, split among threads", LINEAR_RELU, 3, { F("x", 64, 300), F("y", 300, 130), F("b", 130) },
      0, false, true },
    { "matmul batched, long", MATMUL_BATCHED, 2, { F("x", 3, 70, 260), F("y", 260, 41) }, 0, false, true },
    { "matmul broadcast, skinny", MATMUL_BCAST, 2, { F("x", 2, 1, 1, 40), F("y", 3, 17, 40) }, 0, false, true },
    /* Few output tiles over a long reduction, one product and a batch of them: CUDA's f32
     * tensor-core kernel splits the reduction in parts (x3_parts), and so do cuBLASLt's
     * algorithms, whose parts must be added in f32 where C is a bf16 activation */
    { "matmul, long reduction in parts", MATMUL, 2, { F("x", 36, 2052), F("y", 2052, 92) }, 0, false, true },
    { "matmul batched, long reduction in parts", MATMUL_BCAST, 2, { F("x", 2, 1, 20, 1024), F("y", 3, 44, 1024) }, 0, false, true },
    { "one_hot", ONE_HOT, 3, { F("x", 4, 7), F("unused", 1), I("z", 4) }, -7, false, false },
    { "embedding", EMBEDDING, 3, { F("x", 6, 4), F("unused", 1), I("z", 2, 3) }, -6, false, false },
    { "softmax", SOFTMAX, 1, { F("x", 3, 6) }, 0, false, false },
    { "softmax middle axis", SOFTMAX_MID, 1, { F("x", 2, 5, 3) }, 0, false, false },
    { "log_softmax axis 0", LOG_SOFTMAX, 1, { F("x", 4, 3) }, 0, false, false },
    { "cross_entropy", CROSS_ENTROPY, 3, { F("x", 5, 4), F("unused", 1), I("z", 5) }, 4, false, false },
    /* rows of 4096 and more: a block per row on CUDA (ROW_BLOCK_MIN) */
    { "softmax of x + b, rows of 4500", SOFTMAX_BIAS, 2, { F("x", 3, 4500), F("b", 4500) }, 0, false, false },
    { "cross_entropy of x + b, 5000 classes", CE_BIAS, 3, { F("x", 3, 5000), F("b", 5000), I("z", 3) }, 5000, false, false },
    { "nll_loss sum", NLL_SUM, 3, { F("x", 2, 3, 4), F("unused", 1), I("z", 2, 3) }, 4, false, false },
    { "argmax", ARGMAX, 1, { F("x", 3, 5, 2) }, 0, false, false },
    { "argmin all", ARGMIN_ALL, 1, { F("x", 3, 5) }, 0, false, false },
    { "flatten", FLATTEN, 1, { F("x", 2, 3, 4) }, 0, false, false },
    { "split_heads", SPLIT_HEADS, 1, { F("x", 2, 3, 4) }, 0, false, false },
    /* rows of 16 and more: the CPU generator nests these loops over the output's last axis
     * (cpu_codegen.c's pointwise_kernel), reading the permuted and broadcast operands along it */
    { "split_heads of a biased width, rows of 32", SPLIT_HEADS_BIAS, 2, { F("x", 3, 5, 64), F("y", 64) }, 0, false, false },
    { "swapaxes, rows of 20", SWAPAXES, 1, { F("x", 20, 3, 17) }, 0, false, false },
    { "merge_heads", MERGE_HEADS, 1, { F("x", 2, 2, 3, 5) }, 0, false, false },
    { "merge_heads of 4 heads of 16: CPU loops over rows of 16 in 64", MERGE_HEADS, 1, { F("x", 2, 4, 3, 16) }, 0, false, false },
    { "take_along_axis", TAKE_ALONG, 3, { F("x", 3, 5, 2), F("unused", 1), I("z", 3, 4, 2) }, -5, false, false },
    { "arange", ARANGE, 1, { F("x", 4, 6) }, 0, false, false },
    { "ones", ONES, 1, { F("x", 4, 6) }, 0, false, false },
    { "narrow", NARROW, 1, { F("x", 3, 6) }, 0, false, false },
    { "concat 3", CONCAT3, 2, { F("x", 2, 3), F("y", 2, 4) }, 0, false, false },
    { "stack", STACK, 2, { F("x", 2, 3), F("y", 2, 3) }, 0, false, false },
    { "split", SPLIT, 1, { F("x", 4, 6) }, 0, false, false },
    { "softmax_causal", SOFTMAX_CAUSAL, 1, { F("x", 2, 5, 5) }, 0, false, false },
    { "where_causal", WHERE_CAUSAL, 1, { F("x", 3, 4, 4) }, 0, false, false },
    { "stop_gradient", STOP_GRADIENT, 2, { F("x", 5), F("y", 5) }, 0, false, false },
    { "dropout", DROPOUT, 1, { F("x", 8, 9) }, 0, false, false },
    { "randn", RANDN, 1, { F("x", 4, 6) }, 0, false, false },
    { "conv2d pad 1", CONV2D, 2, { F("x", 2, 3, 5, 6), F("y", 4, 3, 3, 3) }, 0, false, false },
    { "conv2d stride 2", CONV2D_S2, 2, { F("x", 2, 2, 7, 5), F("y", 3, 2, 2, 2) }, 0, false, false },
    { "conv2d + bias (fused: a bias per row of the product)", CONV2D_BIAS, 3,
      { F("x", 2, 3, 9, 10), F("y", 20, 3, 3, 3), F("b", 20) }, 0, false, true },
    { "conv2d stride 2 pad 1, wide", CONV2D_BIG, 2, { F("x", 3, 5, 37, 41), F("y", 16, 5, 3, 3) }, 0, false, true },
    /* a weight gradient summed over five images on two threads or more: each thread sums whole
     * images (reduce_by_batch in cpu_gemm.c) */
    { "conv2d, five images", CONV2D, 2, { F("x", 5, 8, 24, 24), F("y", 16, 8, 3, 3) }, 0, false, true },
    /* stride 1 on the vector paths: products pack from a zero-padded copy of each image, a panel
     * one copy per tap where it lies in one output row, else one per piece of a row; weight
     * gradients transpose eight taps at a time (zeros past the last); input gradients add whole
     * rows into a padded image. Odd sizes cut output rows across the panels of 16 and 32. */
    { "conv2d 5x5 pad 2, odd sizes", CONV2D_P2, 2, { F("x", 3, 4, 11, 13), F("y", 6, 4, 5, 5) }, 0, false, true },
    { "conv2d pad 0", CONV2D_P0, 2, { F("x", 2, 3, 9, 7), F("y", 5, 3, 3, 3) }, 0, false, true },
    { "conv2d one image, rows wider than a panel", CONV2D, 2, { F("x", 1, 3, 6, 45), F("y", 7, 3, 3, 3) }, 0, false, true },
    /* the bias gradient: a sum over images and positions of a gradient in memory */
    { "conv2d + bias + relu, seven images", CONV2D_BIAS_RELU, 3,
      { F("x", 7, 5, 12, 12), F("y", 9, 5, 3, 3), F("b", 9) }, 0, false, true },
    /* input gradients gathered eight columns at a time (col2im_s1): rows of 8 or more, the last
     * eight overlapping, taps shifted in at both edges; output rows shorter than 8 take the
     * scalar col2im */
    { "conv2d pad 0, rows of 8 and more", CONV2D_P0, 2, { F("x", 2, 3, 10, 12), F("y", 4, 3, 3, 3) }, 0, false, true },
    { "conv2d 5x5 pad 0, output rows of 7", CONV2D_P0, 2, { F("x", 2, 2, 9, 11), F("y", 3, 2, 5, 5) }, 0, false, true },
    /* a CNN block: relu(conv + bias) from the product kernel, max pooling's gradient times relu's
     * step in one call, the bias gradient summed per channel in memory order (3 channels: a
     * block each) */
    { "conv + bias + relu + max_pool2d", CONV_BLOCK, 3, { F("x", 3, 4, 10, 14), F("y", 3, 4, 3, 3), F("b", 3) }, 0, false, true },
    { "max_pool2d", MAXPOOL, 1, { F("x", 2, 3, 6, 4) }, 0, false, false },
    { "max_pool2d, rows of 8-window groups and a tail", MAXPOOL, 1, { F("x", 2, 3, 4, 38) }, 0, false, false },
    { "max_pool2d pad", MAXPOOL_PAD, 1, { F("x", 1, 2, 5, 7) }, 0, false, false },
    /* the gradient of max_pool2d(relu(x)): the pooling's kernel multiplies by step(relu(x)) */
    { "max_pool2d of relu", MAXPOOL_RELU, 1, { F("x", 2, 3, 4, 38) }, 0, false, false },
    { "max_pool2d pad of relu (overlapping windows)", MAXPOOL_PAD_RELU, 1, { F("x", 2, 2, 7, 9) }, 0, false, false },
    { "nearest_upsample2d", UPSAMPLE, 1, { F("x", 2, 2, 3, 4) }, 0, false, false },
    { "layernorm chain", LAYERNORM_CHAIN, 2, { F("x", 3, 4, 8), F("y", 8) }, 0, false, false },
    { "layernorm chain, rows of 4500 (a block per row on CUDA)", LAYERNORM_CHAIN, 2, { F("x", 3, 4500), F("y", 4500) }, 0, false, true },
    { "causal attention", ATTENTION, 2, { F("x", 2, 5, 8), F("y", 2, 5, 8) }, 0, false, false },
    { "scalar chain", SCALAR_CHAIN, 1, { F("x", 3, 5) }, 0, false, false },
    /* Fused attention: tiles of 64 rows on CUDA, so lengths past, below and at one tile; one row;
     * head sizes that are and are not multiples of 16; keys other than queries in number and
     * width (non-causal). */
    { "attention causal T=70 D=16", FUSED_ATTN_CAUSAL, 3, { F("q", 2, 2, 70, 16), F("k", 2, 2, 70, 16), F("v", 2, 2, 70, 16) }, 0, false, true },
    { "attention causal T=1 D=8", FUSED_ATTN_CAUSAL, 3, { F("q", 3, 1, 8), F("k", 3, 1, 8), F("v", 3, 1, 8) }, 0, false, false },
    { "attention T=5 S=9 D=8 E=12", FUSED_ATTN, 3, { F("q", 2, 5, 8), F("k", 2, 9, 8), F("v", 2, 9, 12) }, 0, false, true },
    { "attention T=33 S=130 D=80 E=24", FUSED_ATTN, 3, { F("q", 2, 33, 80), F("k", 2, 130, 80), F("v", 2, 130, 24) }, 0, false, true },
    { "attention causal T=130 D=64", FUSED_ATTN_CAUSAL, 3, { F("q", 1, 2, 130, 64), F("k", 1, 2, 130, 64), F("v", 1, 2, 130, 64) }, 0, false, true },
    { "attention causal T=64 D=128", FUSED_ATTN_CAUSAL, 3, { F("q", 2, 64, 128), F("k", 2, 64, 128), F("v", 2, 64, 128) }, 0, false, true },
    /* heads of 64 at bf16 on an H100/H200 run on warpgroup MMAs: keys past, below and at one tile, not causal */
    { "attention T=70 S=130 D=64", FUSED_ATTN, 3, { F("q", 2, 70, 64), F("k", 2, 130, 64), F("v", 2, 130, 64) }, 0, false, true },
    /* heads merged after attention, as a model does: its gradients read the output from the
     * merged copy ([B, T, H, E], ATTENTION_BWD's iarg[2]), across tiles and with odd heads */
    { "attention causal, 3 heads merged, T=70 D=16", MERGED_ATTN, 3, { F("q", 2, 3, 70, 16), F("k", 2, 3, 70, 16), F("v", 2, 3, 70, 16) }, 0, false, true },
    { "attention causal, 5 heads merged, T=9 D=8", MERGED_ATTN, 3, { F("q", 1, 5, 9, 8), F("k", 1, 5, 9, 8), F("v", 1, 5, 9, 8) }, 0, false, false },
    /* heads interleaved ([.., T, H, D], graph.h's iarg[3]): operands that are splits of heads
     * are read where they are, and the output is written merged */
    { "attention causal, heads interleaved, T=70 H=3 D=16", SPLIT_ATTN_CAUSAL, 3, { F("q", 2, 70, 3, 16), F("k", 2, 70, 3, 16), F("v", 2, 70, 3, 16) }, 0, false, true },
    { "attention causal, heads interleaved, T=130 H=2 D=64", SPLIT_ATTN_CAUSAL, 3, { F("q", 1, 130, 2, 64), F("k", 1, 130, 2, 64), F("v", 1, 130, 2, 64) }, 0, false, true },
    { "attention causal, heads interleaved, T=1 H=4 D=16", SPLIT_ATTN_CAUSAL, 3, { F("q", 3, 1, 4, 16), F("k", 3, 1, 4, 16), F("v", 3, 1, 4, 16) }, 0, false, false },
    { "attention, heads interleaved, T=5 S=9 H=2 D=8 E=12", SPLIT_ATTN, 3, { F("q", 2, 5, 2, 8), F("k", 2, 9, 2, 8), F("v", 2, 9, 2, 12) }, 0, false, true },
    { "attention, heads interleaved, T=67 S=40 H=5 D=32 E=16", SPLIT_ATTN, 3, { F("q", 67, 5, 32), F("k", 40, 5, 32), F("v", 40, 5, 16) }, 0, false, true },
    { "attention, heads interleaved, T=33 S=100 H=2 D=64", SPLIT_ATTN, 3, { F("q", 33, 2, 64), F("k", 100, 2, 64), F("v", 100, 2, 64) }, 0, false, true },
    { "attention 2-D T=7 S=3 D=5", FUSED_ATTN, 3, { F("q", 7, 5), F("k", 3, 5), F("v", 3, 4) }, 0, false, false },
    /* the three bias gradients' sums, which the gradient's order puts between their products, as
     * one CUDA kernel (cuda_sums_early): over 512 rows in chunks, and over 20 in one pass; at f32
     * (nvrtc_qkv_sums checks that tf32 and bf16 steps merge them too; test_precision trains a GPT
     * at bf16 on CUDA against f32) */
    { "q, k, v projections with biases into attention", QKV_BIAS, 3, { F("x", 8, 64, 16), F("w", 16, 48), F("b", 48) }, 0, false, true },
    { "q, k, v projections, 20 rows", QKV_BIAS, 3, { F("x", 4, 5, 16), F("w", 16, 48), F("b", 48) }, 0, false, true },
    /* 128 rows and a reduction of 256: our tensor-core product kernel splits it in two, and its
     * parts' sum adds the bias (cuda_products.c; cuda_precisions folds it with TG_CUDA_FOLD=all) */
    { "attention of a projection with a bias", PROJ_ATTN, 3, { F("x", 2, 64, 256), F("w", 256, 32), F("b", 32) }, 0, false, true },
};
#define N_CASES ((int)(sizeof CASES / sizeof CASES[0]))

/* The op's output, or, with a weight input W of its shape, the scalar sum(out * W) whose
 * gradients reach every input. */
typedef struct { const bcase *c; bool weighted; } fwd_ctx;

static tg_tensor fwd(const void *ctx, const tg_tensor *in) {
    const fwd_ctx *f = ctx;
    tg_tensor out = op_fwd(f->c, in);
    return f->weighted ? tg_sum(tg_mul(out, in[f->c->n_in]), TG_ALL, 0) : out;
}

static void fill_inputs(tg_probe *p, const bcase *c, int n_in, uint64_t seed) {
    check_rng = seed;
    const tg_graph *g = tg_probe_graph(p);
    for (int i = 0; i < n_in; i++) {
        double *v = tg_probe_input(p, i);
        for (int64_t e = 0; e < g->nodes[i].numel; e++) {
            if (g->nodes[i].dtype == TG_INT32) {
                int range = c->i32_max < 0 ? -c->i32_max + 2 : c->i32_max;
                v[e] = (double)(check_next() % (uint64_t)range) - (c->i32_max < 0 ? 1 : 0);
            } else {
                v[e] = c->positive && i < c->n_in ? check_uniform(0.5, 2) : check_uniform(-2, 2);
            }
        }
    }
}

/* Worst relative difference of two arrays: |a - b| / max(floor, |a|, |b|), floor 1e-3 (it keeps
 * exact zeros from inflating it) or, for long sums, the RMS of b: an element that cancels to near
 * zero carries the rounding of its terms, which are of the output's size. Attention: below. */
#define TOLERANCE 1e-4

static double worst_of(const bcase *c, const double *a, const double *b, int64_t n, int64_t *past) {
    /* Attention gradients are sums of p (dp - delta), terms of the inputs' size (~1) that cancel:
     * with one key (T = 1, causal) dq and dk are exactly 0 and each backend gets rounding noise of
     * ~1e-7 in two different orders. Their errors are measured against that size. */
    bool attention = c->op == ATTENTION || c->op == FUSED_ATTN || c->op == FUSED_ATTN_CAUSAL || c->op == MERGED_ATTN ||
                     c->op == SPLIT_ATTN || c->op == SPLIT_ATTN_CAUSAL;
    double floor = attention ? 1 : 1e-3, w = 0;
    if (c->long_sums) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += b[i] * b[i];
        floor = fmax(floor, sqrt(ss / (double)n));
    }
    *past = 0;
    for (int64_t i = 0; i < n; i++) {
        double m = fmax(floor, fmax(fabs(a[i]), fabs(b[i])));
        double e = fabs(a[i] - b[i]) / m;
        if (!(e <= w)) w = e;   /* NaN sticks */
        *past += !(e <= TOLERANCE);
    }
    return w;
}

/* Does a backend's result match the reference's at precision p? Both round at the same points
 * (precision_round: product and attention operands; at bf16 also the activations of
 * graph_bf16_values), so they differ by summation order: every element within TOLERANCE (set
 * above). A value that differs by an f32 rounding before it is rounded can land on the
 * neighbouring bf16 or TF32 value when it lies near a tie (one step: at most 2^-7 or 2^-10
 * relative), and what it feeds moves by as much: there, at most 1% of the elements (or 2) may
 * differ by up to two steps, 2^-6 at bf16 where the graph rounds activations, 2^-9 at tf32
 * (a product's operand computed by another product: with our small-product kernel in blocks of 4
 * warps, 8 of 40960 gradient elements of gelu(matmul + bias) at 1.3e-4 on an H100; attention's
 * backward, whose p and ds are rounded as operands: 12 of 6720 at 4.6e-4 on the cpu backend at
 * bf16); f32 gets no allowance. On the H100, before activations were rounded, the worst over every
 * op at tf32 and bf16 was 1.6e-5. Attention's output at bf16 is such an activation, and one step
 * of one of its elements moves its row's delta = d_out . out, and with it the gradient of every
 * key that row sees (dk sums over the rows): there 5% (84 of 4480 dk elements at 9.6e-4 for the
 * causal T = 70, D = 16 case on an H200). */
static bool matches(const tg_graph *g, double worst, int64_t past, int64_t n) {
    bool *bf16, rounds = false, attention = false;   /* does the graph round a computed value? (else, or out of memory: no allowance) */
    graph_bf16_values(g, &bf16);
    for (int i = 0; bf16 && i < g->n; i++) {
        rounds |= graph_rounds(g, bf16, i) || g->nodes[i].op == OP_ATTENTION_BWD;
        attention |= g->nodes[i].op == OP_ATTENTION && graph_rounds(g, bf16, i);
    }
    free(bf16);
    double two_steps = g->precision == TG_PRECISION_TF32 ? 0x1p-9 : rounds && g->precision == TG_PRECISION_BF16 ? 0x1p-6 : 0;
    if (two_steps == 0) return worst <= TOLERANCE;
    const int64_t few = attention ? n / 20 : n / 100;   /* (bf16 only: a rounded attention output) */
    return worst <= two_steps && past <= (few > 2 ? few : 2);
}

/* The worst error seen per precision, for the summary line. */
static double worst_seen[4];

/* Is the case named `name` among TG_TEST_CASES's comma-separated parts of names (all without it),
 * and in TG_TEST_SHARD's share (k/n: several processes run the cases between them)? */
static bool case_chosen(const char *name) {
    const char *only = getenv("TG_TEST_CASES"), *shard = getenv("TG_TEST_SHARD");
    int k = 0, n = 1;
    if (shard && sscanf(shard, "%d/%d", &k, &n) == 2 && n > 1) {   /* k/n: the cases whose name hashes to k mod n */
        unsigned h = 5381;
        for (const char *c = name; *c; c++) h = h * 33 + (unsigned char)*c;
        if ((int)(h % (unsigned)n) != k) return false;
    }
    char part[64];
    for (const char *s = only; s && *s; s += strcspn(s, ",") + (s[strcspn(s, ",")] == ',')) {
        snprintf(part, sizeof part, "%.*s", (int)strcspn(s, ","), s);
        if (part[0] && strstr(name, part)) return true;
    }
    return !only;
}

/* Compare one case on a backend with the reference at precision p: forward, then every input
 * gradient. */
static void compare_case(const char *backend, tg_precision p, const bcase *c, const char *label) {
    /* Products of products' results through attention: at tf32 and bf16, values that land near a
     * rounding boundary round apart on the two sides more often than matches() allows */
    if ((c->op == QKV_BIAS || c->op == PROJ_ATTN) && p != TG_PRECISION_F32) return;
    if (!case_chosen(c->name)) return;
    tg_model *m = tg_model_new(1);
    tg_error err;
    fwd_ctx plain = { c, false };
    tg_probe *ref = tg_probe_new_at("reference", p, m, fwd, &plain, c->in, c->n_in, false, &err);
    CHECK(ref != NULL, "%s: reference probe: %s", c->name, err.msg);
    if (!ref) { tg_model_free(m); return; }
    tg_probe *be = tg_probe_new_at(backend, p, m, fwd, &plain, c->in, c->n_in, false, &err);
    CHECK(be != NULL, "%s %s: probe: %s", c->name, label, err.msg);
    tg_shape out_shape = tg_probe_output_shape(ref);
    tg_dtype out_dtype = tg_probe_graph(ref)->nodes[tg_probe_graph(ref)->output].dtype;
    if (be) {
        fill_inputs(ref, c, c->n_in, 7);
        fill_inputs(be, c, c->n_in, 7);
        tg_probe_set_seed(ref, 99);
        tg_probe_set_seed(be, 99);
        CHECK(tg_probe_run(ref) && tg_probe_run(be), "%s: run failed", c->name);
        int64_t past, n = shape_numel(out_shape);
        double w = worst_of(c, tg_probe_output(be), tg_probe_output(ref), n, &past);
        CHECK(matches(tg_probe_graph(ref), w, past, n), "%s %s forward: worst rel err %.3g, %lld of %lld past %g", c->name, label, w, (long long)past,
              (long long)n, TOLERANCE);
        worst_seen[p] = fmax(worst_seen[p], w);
        tg_probe_free(be);
    }
    tg_probe_free(ref);
    if (out_dtype == TG_INT32) { tg_model_free(m); return; }

    /* gradients: sum(out * W) with W an extra random input of the output's shape */
    tg_input_decl decls[4];
    memcpy(decls, c->in, sizeof c->in);
    decls[c->n_in] = (tg_input_decl){ "W", TG_FLOAT32, out_shape };
    fwd_ctx weighted = { c, true };
    ref = tg_probe_new_at("reference", p, m, fwd, &weighted, decls, c->n_in + 1, true, &err);
    be = tg_probe_new_at(backend, p, m, fwd, &weighted, decls, c->n_in + 1, true, &err);
    CHECK(ref && be, "%s %s: gradient probes: %s", c->name, label, err.msg);
    if (ref && be) {
        fill_inputs(ref, c, c->n_in + 1, 11);
        fill_inputs(be, c, c->n_in + 1, 11);
        tg_probe_set_seed(ref, 5);
        tg_probe_set_seed(be, 5);
        CHECK(tg_probe_run(ref) && tg_probe_run(be), "%s: run failed", c->name);
        for (int i = 0; i <= c->n_in; i++) {
            const double *gr = tg_probe_input_grad(ref, i), *gb = tg_probe_input_grad(be, i);
            if (!gr) continue;
            int64_t past, n = tg_probe_graph(ref)->nodes[i].numel;
            double w = worst_of(c, gb, gr, n, &past);
            CHECK(matches(tg_probe_graph(ref), w, past, n), "%s %s: gradient of input %d: worst rel err %.3g, %lld of %lld past %g", c->name, label, i,
                  w, (long long)past, (long long)n, TOLERANCE);
            worst_seen[p] = fmax(worst_seen[p], w);
        }
    }
    tg_probe_free(ref);
    tg_probe_free(be);
    tg_model_free(m);
}

/* ----- the kernel cache and compiler failures ----- */

static int count_files(const char *dir, const char *suffix) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls '%s' 2>/dev/null | grep -c '%s$'", dir, suffix);
    FILE *f = popen(cmd, "r");
    int n = 0;
    if (f && fscanf(f, "%d", &n) != 1) n = 0;
    if (f) pclose(f);
    return n;
}

static tg_model *cache_model;

static tg_probe *cache_probe(tg_error *err) {
    static fwd_ctx ctx;
    ctx = (fwd_ctx){ &CASES[0], false };
    return tg_probe_new_on("cpu", cache_model, fwd, &ctx, CASES[0].in, CASES[0].n_in, false, err);
}

static void test_cache(const char *dir) {
    cache_model = tg_model_new(1);
    char sub[700];
    snprintf(sub, sizeof sub, "%s/cache", dir);
    setenv("TG_CACHE_DIR", sub, 1);
    tg_error err;
    tg_probe *p = cache_probe(&err);
    CHECK(p != NULL, "cold compile: %s", err.msg);
    CHECK(count_files(sub, ".so") == 1, "cache miss writes one shared object (%d)", count_files(sub, ".so"));
    tg_probe_free(p);

    /* The same graph for another instruction set is another build (the flags name the ISA, and
     * they are part of the key): a cache moved to a CPU with fewer features never hands it code
     * it cannot run. */
    if (cpu_isa_best() != CPU_ISA_PORTABLE) {
        setenv("TG_CPU_ISA", "portable", 1);
        p = cache_probe(&err);
        CHECK(p != NULL && count_files(sub, ".so") == 2, "another ISA, another shared object (%d): %s", count_files(sub, ".so"),
              p ? "" : err.msg);
        tg_probe_free(p);
        unsetenv("TG_CPU_ISA");
        p = cache_probe(&err);
        CHECK(p != NULL && count_files(sub, ".so") == 2, "back to the best ISA: a cache hit (%d)", count_files(sub, ".so"));
        tg_probe_free(p);
    }

    char cmd[800];
    snprintf(cmd, sizeof cmd, "touch -d '2000-01-01' '%s'/*.so", sub);
    CHECK(system(cmd) == 0, "touch");
    p = cache_probe(&err);
    CHECK(p != NULL, "warm compile: %s", err.msg);
    snprintf(cmd, sizeof cmd, "find '%s' -name '*.so' -newermt '2001-01-01' | grep -q .", sub);
    CHECK(system(cmd) != 0, "a cache hit does not rebuild the shared object");
    tg_probe_free(p);

    snprintf(cmd, sizeof cmd, "for f in '%s'/*.so; do echo garbage > \"$f\"; done", sub);
    CHECK(system(cmd) == 0, "corrupt");
    p = cache_probe(&err);
    CHECK(p != NULL, "a corrupt cached file is rebuilt: %s", p ? "" : err.msg);
    if (p) {
        fill_inputs(p, &CASES[0], CASES[0].n_in, 3);
        CHECK(tg_probe_run(p), "run after rebuild");
        const double *x = tg_probe_input(p, 0), *y = tg_probe_input(p, 1), *o = tg_probe_output(p);
        CHECK_CLOSE(o[0], (float)x[0] + (float)y[0], 1e-6, "rebuilt kernels compute");
    }
    tg_probe_free(p);

    /* A compiler that fails, one that does not exist: errors. A cache directory that cannot be
     * created: the kernels are built in a temporary directory instead (test_faults has more). */
    setenv("TG_CACHE_DIR", dir, 1);
    setenv("TG_CFLAGS", "-O1 -DTG_TEST_DIFFERENT_HASH", 1);
    setenv("TG_CC", "false", 1);
    p = cache_probe(&err);
    CHECK(p == NULL && strstr(err.msg, "kernel compilation failed"), "failing compiler: %s", err.msg);
    setenv("TG_CC", "/nonexistent/cc", 1);
    p = cache_probe(&err);
    CHECK(p == NULL && strstr(err.msg, "'/nonexistent/cc' was not found") && strstr(err.msg, "TG_CC") &&
              strstr(err.msg, "'reference' backend runs"),
          "missing compiler: the message names it, TG_CC and the backend that still runs: %s", err.msg);
    char why[512];
    CHECK(!tg_backend_available("cpu", why, sizeof why) && strstr(why, "TG_CC"), "cpu unavailable without a compiler: %s", why);
    CHECK(tg_backend_available("reference", why, sizeof why), "the reference backend needs no compiler");
    unsetenv("TG_CC");
    CHECK(tg_backend_available("cpu", why, sizeof why), "cpu available with the system compiler: %s", why);
    unsetenv("TG_CFLAGS");
    snprintf(sub, sizeof sub, "%s/file", dir);
    FILE *f = fopen(sub, "w");
    if (f) fclose(f);
    snprintf(sub, sizeof sub, "%s/file/cache", dir);
    setenv("TG_CACHE_DIR", sub, 1);
    p = cache_probe(&err);
    CHECK(p != NULL, "an unusable cache directory falls back to a temporary one: %s", p ? "" : err.msg);
    tg_probe_free(p);
    setenv("TG_CACHE_DIR", dir, 1);

}

/* ----- training runs compared step by step ----- */

static tg_linear l1, l2;
static tg_conv2d_layer conv;
static tg_tensor mlp_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor h = tg_gelu(tg_linear(&l1, in[0]));
    return tg_cross_entropy(tg_linear(&l2, tg_dropout(h, 0.1)), in[1], TG_MEAN);
}
/* mlp_loss's layers: 6 -> 16 -> 5, or 6 -> 32 -> 300 with a wide head (rows of 300 are not a
 * multiple of 8, so a backend aligning products pads them). */
static void mlp_layers(tg_model *m, bool wide_head) {
    l1 = tg_linear_new(m, "l1", 6, wide_head ? 32 : 16, NULL);
    l2 = tg_linear_new(m, "l2", wide_head ? 32 : 16, wide_head ? 300 : 5, NULL);
}
/* MODEL_RESIDUAL_LN: h = l1(x), h + lh(layer norm(h)), l2: on CUDA the layer norm's weight and bias
 * gradients, and l1's bias gradient after them, are summed in the row kernel of its backward
 * (row_columns), at 300 rows of 520 in two groups of blocks and two chunks of columns */
static tg_linear lh;
static tg_layernorm res_ln;
static tg_tensor residual_ln_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor h = tg_linear(&l1, in[0]);
    return tg_cross_entropy(tg_linear(&l2, tg_add(h, tg_linear(&lh, tg_layernorm(&res_ln, h)))), in[1], TG_MEAN);
}
static void residual_ln_layers(tg_model *m) {
    l1 = tg_linear_new(m, "l1", 6, 520, NULL);
    res_ln = tg_layernorm_new(m, "ln", 520, 1e-5, 1);
    lh = tg_linear_new(m, "lh", 520, 520, NULL);
    l2 = tg_linear_new(m, "l2", 520, 5, NULL);
}
/* Two causal attention layers of two heads of 16 over 70 rows (two query tiles on CUDA, the
 * second short), each reading projections split into heads and merged back, trained step by step:
 * on CUDA each backward's dq is added up with atomics into memory zeroed before it, layer after
 * layer and step after step. */
static tg_linear attn_proj[2][4];
static tg_tensor attention_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor h = tg_linear(&l1, in[0]);
    for (int i = 0; i < 2; i++) {
        tg_tensor q = tg_split_heads(tg_linear(&attn_proj[i][0], h), 2), k = tg_split_heads(tg_linear(&attn_proj[i][1], h), 2);
        tg_tensor v = tg_split_heads(tg_linear(&attn_proj[i][2], h), 2);
        h = tg_add(h, tg_linear(&attn_proj[i][3], tg_merge_heads(tg_attention(q, k, v, 1, 0.25))));
    }
    return tg_cross_entropy(tg_linear(&l2, h), in[1], TG_MEAN);
}
static void attention_layers(tg_model *m) {
    l1 = tg_linear_new(m, "l1", 6, 32, NULL);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            char name[16];
            snprintf(name, sizeof name, "a%d.%c", i, "qkvo"[j]);
            attn_proj[i][j] = tg_linear_new(m, name, 32, 32, NULL);
        }
    l2 = tg_linear_new(m, "l2", 32, 5, NULL);
}
static tg_tensor cnn_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor h = tg_max_pool2d(tg_relu(tg_conv(&conv, in[0])), 2, 2, 0);
    return tg_cross_entropy(tg_linear(&l2, tg_flatten(h, 1)), in[1], TG_MEAN);
}

/* The number of a graph's nodes of op `op` (tg_node_info's name). */
static int count_op(const tg_graph *g, const char *op) {
    int n = 0;
    for (int i = 0; i < tg_graph_n_nodes(g); i++) n += strcmp(tg_graph_node(g, i).op, op) == 0;
    return n;
}

enum { MODEL_MLP, MODEL_CNN, MODEL_WIDE_HEAD, MODEL_RESIDUAL_LN, MODEL_ATTENTION, MODEL_ATTENTION_GROUPED };

/* MODEL_WIDE_HEAD: an MLP whose last weight has rows of 300, not a multiple of 8: with
 * TG_PAD_PRODUCTS=8 the backend's graph pads it to 304 columns and narrows the product
 * (tg_matmul; their gradients: a pad and a narrow more), the reference's does not, and the
 * steps still agree. MODEL_ATTENTION_GROUPED: MODEL_ATTENTION with TG_GROUP_PRODUCTS=1 on the
 * backend: each layer's q, k and v products have their gradients as one product each way
 * (grad.c's find_siblings; eight products fewer in the graph), the reference's three each. */
static void train_compare(const char *backend, const char *name, tg_forward_fn loss, tg_input_decl *in, int model) {
    float losses[2][12], grads[2][32 * 32 + 32] = { { 0 } };   /* attention: the last step's gradients of a1.k.W and a1.v.b */
    for (int b = 0; b < 2; b++) {
        tg_model *m = tg_model_new(3);
        if (model == MODEL_CNN) {
            conv = tg_conv2d_new(m, "conv", 2, 4, 3, 1, 1, 1);
            l2 = tg_linear_new(m, "l2", 4 * 3 * 3, 5, NULL);
        } else if (model == MODEL_RESIDUAL_LN) {
            residual_ln_layers(m);
        } else if (model == MODEL_ATTENTION || model == MODEL_ATTENTION_GROUPED) {
            attention_layers(m);
        } else {
            mlp_layers(m, model == MODEL_WIDE_HEAD);
        }
        tg_optimizer opt = tg_adamw(model == MODEL_RESIDUAL_LN || model >= MODEL_ATTENTION ? 1e-3 : 1e-2, 0.1);
        opt.clip_norm = 0.5;
        tg_error err;
        bool pad = b && model == MODEL_WIDE_HEAD;
        if (pad) setenv("TG_PAD_PRODUCTS", "8", 1);
        setenv("TG_GROUP_PRODUCTS", b && model == MODEL_ATTENTION_GROUPED ? "1" : "0", 1);
        setenv("TG_PACK_ATTENTION", b && model == MODEL_ATTENTION_GROUPED ? "1" : "0", 1);
        tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss, .inputs = in, .n_inputs = 2,
                                                   .optimizer = opt, .backend = b ? backend : "reference" }, &err);
        unsetenv("TG_PAD_PRODUCTS");
        unsetenv("TG_GROUP_PRODUCTS");
        unsetenv("TG_PACK_ATTENTION");
        CHECK(t != NULL, "%s: compile: %s", name, err.msg);
        if (!t) { tg_model_free(m); return; }
        if (model >= MODEL_ATTENTION) {   /* 10 forward, 19 backward (l1's input needs no gradient), 8 fewer grouped */
            const bool grouped = b && model == MODEL_ATTENTION_GROUPED;
            const int products = count_op(tg_train_graph(t), "matmul"), want = grouped ? 21 : 29;
            const int bwd = count_op(tg_train_graph(t), "attention_backward");   /* grouped: a layer's three gradients packed */
            CHECK(products == want && bwd == (grouped ? 2 : 6), "%s on %s: %d products (expected %d), %d attention backward "
                  "nodes (expected %d)", name, b ? backend : "reference", products, want, bwd, grouped ? 2 : 6);
        }
        if (model == MODEL_WIDE_HEAD)
            CHECK(count_op(tg_train_graph(t), "pad") == (pad ? 2 : 0) && count_op(tg_train_graph(t), "narrow") == (pad ? 2 : 0),
                  "%s on %s: %d pad, %d narrow nodes", name, b ? backend : "reference", count_op(tg_train_graph(t), "pad"),
                  count_op(tg_train_graph(t), "narrow"));
        int64_t nx = shape_numel(in[0].shape), ny = shape_numel(in[1].shape);
        float *x = malloc(sizeof(float) * (size_t)nx);
        int32_t *y = malloc(sizeof(int32_t) * (size_t)ny);
        check_rng = 42;
        for (int64_t i = 0; i < nx; i++) x[i] = (float)check_uniform(-1, 1);
        for (int64_t i = 0; i < ny; i++) y[i] = (int32_t)(check_next() % 5);
        for (int s = 0; s < 12; s++) {
            tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, (size_t)nx), tg_i32("y", y, (size_t)ny) }, 2);
            losses[b][s] = r.status == TG_OK ? r.loss : NAN;
        }
        if (model >= MODEL_ATTENTION)   /* grouped: parts of one product's and one sum's values */
            CHECK(tg_download_param_grad(t, "a1.k.W", grads[b], 32 * 32, &err) == TG_OK &&
                  tg_download_param_grad(t, "a1.v.b", grads[b] + 32 * 32, 32, &err) == TG_OK, "%s: gradients: %s", name, err.msg);
        free(x);
        free(y);
        tg_destroy(t);
        tg_model_free(m);
    }
    double w = 0, scale = 0, gw = 0;
    for (int s = 0; s < 12; s++) w = fmax(w, fabs(losses[0][s] - losses[1][s]) / fmax(1, fabs(losses[0][s])));
    for (int k = 0; model >= MODEL_ATTENTION && k < 32 * 32 + 32; k++) scale = fmax(scale, fabs(grads[0][k]));
    for (int k = 0; model >= MODEL_ATTENTION && k < 32 * 32 + 32; k++) gw = fmax(gw, fabs(grads[0][k] - grads[1][k]) / scale);
    CHECK(model < MODEL_ATTENTION || (scale > 0 && gw <= 1e-3), "%s: %s vs reference, the last step's gradients of a1.k.W and a1.v.b: "
          "worst %.3g of the largest (%.3g)", name, backend, gw, scale);
    CHECK(w <= 1e-4 && losses[1][11] < losses[1][0], "%s: %s vs reference losses over 12 steps: worst %.3g (%.4f -> %.4f)",
          name, backend, w, losses[1][0], losses[1][11]);
}

/* The width rule of padded products (ops.c's padded_width): with an alignment of 8, a head of
 * 65 columns is padded (72: 11% more product, on cuBLAS's aligned kernels), one of 63 is not. */
static void padded_widths(void) {
    static const int widths[] = { 63, 65 };
    for (int w = 0; w < 2; w++) {
        tg_model *m = tg_model_new(3);
        l1 = tg_linear_new(m, "l1", 6, 16, NULL);
        l2 = tg_linear_new(m, "l2", 16, widths[w], NULL);
        tg_error err;
        setenv("TG_PAD_PRODUCTS", "8", 1);
        tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .optimizer = tg_adam(1e-3), .backend = "reference",
                                                   .inputs = (tg_input_decl[]){ TG_F32("x", 8, 6), TG_I32("y", 8) }, .n_inputs = 2 },
                                 &err);
        unsetenv("TG_PAD_PRODUCTS");
        int pads = t ? count_op(tg_train_graph(t), "pad") : -1;
        CHECK(pads == (widths[w] >= 64 ? 2 : 0), "a %d-wide head, products aligned to 8: %d pad nodes (%s)", widths[w], pads,
              t ? "" : err.msg);
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* Does a probe's graph hold a product or attention (which tf32 and bf16 change)? */
static bool has_product(tg_probe *p) {
    const tg_graph *g = tg_probe_graph(p);
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == OP_MATMUL || g->nodes[i].op == OP_ATTENTION) return true;
    return false;
}

/* The CUDA schedule computes a product of at most 16 multiply-adds per element, and a sum of at
 * most 16 elements, inside the kernel that reads it (FUSE_SMALL_REDUCTIONS), longer ones through
 * cuBLAS or a kernel of their own, and the CPU's schedule every one in its own kernel or library
 * call; the generated code runs on the device (the CUDA cases above). */
static void test_small_reduction_schedule(void) {
    static const bcase cases[4] = {
        { "linear, k = 16", LINEAR, 3, { F("x", 6, 16), F("y", 16, 5), F("b", 5) }, 0, false, false },
        { "linear, k = 17", LINEAR, 3, { F("x", 6, 17), F("y", 17, 5), F("b", 5) }, 0, false, false },
        { "mean of 16", MEAN1, 1, { F("x", 4, 16, 3) }, 0, false, false },
        { "mean of 17", MEAN1, 1, { F("x", 4, 17, 3) }, 0, false, false },
    };
    tg_model *m = tg_model_new(1);
    for (int k = 0; k < 4; k++) {
        fwd_ctx plain = { &cases[k], false };
        tg_error err;
        tg_probe *p = tg_probe_new_at("reference", TG_PRECISION_F32, m, fwd, &plain, cases[k].in, cases[k].n_in, false, &err);
        CHECK(p != NULL, "%s: probe: %s", cases[k].name, err.msg);
        if (!p) continue;
        const tg_graph *g = tg_probe_graph(p);
        int r = -1, keep = g->output;
        for (int i = 0; i < g->n; i++)
            if (g->nodes[i].op == (k < 2 ? OP_MATMUL : OP_SUM)) r = i;
        bool mat[64], own[64];
        int alias[64];
        CHECK(r >= 0 && r != keep && g->n <= 64, "%s: one reduction, read by one more node, in a graph of %d nodes", cases[k].name, g->n);
        if (r >= 0 && r != keep && g->n <= 64) {
            fuse_schedule(g, &keep, 1, true, FUSE_RECOMPUTE | FUSE_SMALL_REDUCTIONS, mat, alias);
            fuse_schedule(g, &keep, 1, true, FUSE_RECOMPUTE, own, alias);
            CHECK(mat[r] == (k % 2 == 1) && mat[keep], "%s: the GPU schedule %s", cases[k].name,
                  k % 2 == 0 ? "computes it in its reader's kernel" : "gives it a kernel (or a cuBLAS call) of its own");
            CHECK(own[r], "%s: without FUSE_SMALL_REDUCTIONS it has a buffer", cases[k].name);
        }
        tg_probe_free(p);
    }
    tg_model_free(m);
}

/* Without a GPU, every case's CUDA kernels (forward and gradients) are still generated and
 * compiled by NVRTC for sm_90a when NVRTC is installed, so a broken template fails here: every
 * case at f32, and those with products or attention at tf32 and bf16 too (operand shadows, the
 * tensor-core attention). */
static void nvrtc_compile_all(void) {
    tg_model *m = tg_model_new(1);
    tg_error err;
    int compiled = 0;
    bool product = false;
    for (int k = 0; k < 3 * N_CASES; k++) {
        const bcase *c = &CASES[k % N_CASES];
        tg_precision prec = k < N_CASES ? TG_PRECISION_F32 : k < 2 * N_CASES ? TG_PRECISION_TF32 : TG_PRECISION_BF16;
        fwd_ctx plain = { c, false };
        if (prec != TG_PRECISION_F32) {   /* the f32 probe says whether this precision changes anything */
            tg_probe *f = tg_probe_new_at("reference", TG_PRECISION_F32, m, fwd, &plain, c->in, c->n_in, false, &err);
            product = f && has_product(f);
            tg_probe_free(f);
            if (!product) continue;
        }
        tg_probe *p = tg_probe_new_at("cuda-nvrtc", prec, m, fwd, &plain, c->in, c->n_in, false, &err);
        if (!p && strstr(err.msg, "not available")) {
            printf("test_backend: NVRTC not installed, CUDA kernels not compiled (%s)\n", err.msg);
            break;
        }
        CHECK(p != NULL, "%s: NVRTC compile of the forward at %s: %s", c->name, tg_precision_name(prec), err.msg);
        if (!p) continue;
        tg_shape out = tg_probe_output_shape(p);
        bool i32 = tg_probe_graph(p)->nodes[tg_probe_graph(p)->output].dtype == TG_INT32;
        tg_probe_free(p);
        compiled++;
        if (i32) continue;
        tg_input_decl decls[4];
        memcpy(decls, c->in, sizeof c->in);
        decls[c->n_in] = (tg_input_decl){ "W", TG_FLOAT32, out };
        fwd_ctx weighted = { c, true };
        p = tg_probe_new_at("cuda-nvrtc", prec, m, fwd, &weighted, decls, c->n_in + 1, true, &err);
        CHECK(p != NULL, "%s: NVRTC compile of the gradients at %s: %s", c->name, tg_precision_name(prec), err.msg);
        compiled += p != NULL;
        tg_probe_free(p);
    }
    if (compiled) printf("test_backend: %d graphs' CUDA kernels compiled by NVRTC for sm_90a\n", compiled);
    tg_model_free(m);
}

/* The vector-lane paths of the CUDA generator (cuda_codegen.c: lane_body, sum_lanes), read from
 * the source NVRTC compiles. A bf16 MLP whose GELU covers 2^25 elements and whose first bias
 * gradient sums 8192 rows of 4096 columns takes four lanes in the sum by default (each thread of
 * that sum still sums 16 rows) and eight in the GELU (it stores bf16 alone); a batch of 128 keeps
 * one lane everywhere by default (its GELU has 2^19 elements); TG_CUDA_LANES forces its count on
 * every sum the shapes allow, and on element-wise kernels of 2^20 elements and more. Adam's
 * update of the 4.2 M parameters, a segment a parameter, takes four lanes by default (every
 * segment's length divides by four) and the forced count when forced. */
static tg_linear wide1, wide2;
static tg_tensor wide_loss(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(tg_linear(&wide2, tg_gelu(tg_linear(&wide1, in[0]))), in[1], TG_MEAN);
}

/* The MLP above's layers in a new model */
static tg_model *wide_layers(void) {
    tg_model *m = tg_model_new(4);
    wide1 = tg_linear_new(m, "l1", 1024, 4096, NULL);
    wide2 = tg_linear_new(m, "l2", 4096, 16, NULL);
    return m;
}

/* The MLP above compiled by cuda-nvrtc for a batch of `rows` (NULL with err set). */
static tg_train *wide_step(tg_model **m, tg_precision precision, int rows, tg_error *err) {
    *m = wide_layers();
    return tg_compile(&(tg_train_spec){ .model = *m, .loss = wide_loss, .optimizer = tg_adam(1e-3), .backend = "cuda-nvrtc",
                                        .precision = precision,
                                        .inputs = (tg_input_decl[]){ TG_F32("x", rows, 1024), TG_I32("y", rows) }, .n_inputs = 2 },
                      err);
}

/* q, k and v projections into causal attention, as a transformer block has them: their bias
 * gradients, which the gradient's order puts between their products, are summed in one kernel
 * (cuda_sums_early) at every precision. */
static tg_linear qkv[3];

static tg_tensor qkv_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor h[3];
    for (int k = 0; k < 3; k++) h[k] = tg_split_heads(tg_linear(&qkv[k], in[0]), 2);
    return tg_mean(tg_square(tg_merge_heads(tg_attention(h[0], h[1], h[2], 1, 0.25))), TG_ALL, 0);
}

/* CUDA pads at tf32 and bf16 by itself (product_align), not at f32 (no faster there, and more
 * memory); the padded graph's steps against the reference's, on the device. */
static void cuda_padded_products(void) {
    for (int p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++) {
        tg_model *m = tg_model_new(3);
        mlp_layers(m, true);
        tg_error err = { { 0 } };
        tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .optimizer = tg_adam(1e-3), .backend = "cuda",
                                                   .precision = (tg_precision)p,
                                                   .inputs = (tg_input_decl[]){ TG_F32("x", 8, 6), TG_I32("y", 8) }, .n_inputs = 2 },
                                 &err);
        int pads = t ? count_op(tg_train_graph(t), "pad") : -1;
        CHECK(pads == (p == TG_PRECISION_F32 ? 0 : 2), "cuda %s, a 300-wide head: %d pad nodes (%s)",
              tg_precision_name((tg_precision)p), pads, t ? "" : err.msg);
        tg_destroy(t);
        tg_model_free(m);
    }
    train_compare("cuda", "mlp with a 300-wide head, padded products", mlp_loss,
                  (tg_input_decl[]){ TG_F32("x", 8, 6), TG_I32("y", 8) }, MODEL_WIDE_HEAD);
}

/* cuBLASLt's counters (cuda_counters.c): the products of an MLP of char_gpt's widths at tf32 and
 * bf16, where cuBLASLt's algorithms zero a counter before their kernels, on windows of their own
 * zeroed once a step with those memsets out of the graph (the default), and on the shared
 * workspace with them (TG_CUDA_COUNTERS=0): the same algorithms in one process, so the same bits,
 * in the losses and in l1's weight after four steps. (Which memsets leave the graph depends on
 * the algorithms the GPU's cuBLASLt picks; bench/cuda/timeline shows them gone.) */
static tg_tensor wide_mlp_loss(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(tg_linear(&l2, tg_gelu(tg_linear(&l1, in[0]))), in[1], TG_MEAN);
}
static void cuda_counters(void) {
    enum { ROWS = 8192, IN = 384, HIDDEN = 1536, STEPS = 4 };
    float *x = malloc(sizeof(float) * ROWS * IN), *w[2] = { malloc(sizeof(float) * IN * HIDDEN), malloc(sizeof(float) * IN * HIDDEN) };
    int32_t *y = malloc(sizeof(int32_t) * ROWS);
    check_rng = 7;
    for (int i = 0; i < ROWS * IN; i++) x[i] = (float)check_uniform(-1, 1);
    for (int i = 0; i < ROWS; i++) y[i] = (int32_t)(check_next() % 5);
    for (tg_precision p = TG_PRECISION_TF32; p <= TG_PRECISION_BF16 && x && y && w[0] && w[1]; p++) {
        float losses[2][STEPS];
        for (int off = 0; off < 2; off++) {
            if (off) setenv("TG_CUDA_COUNTERS", "0", 1);
            tg_model *m = tg_model_new(11);
            l1 = tg_linear_new(m, "l1", IN, HIDDEN, NULL);
            l2 = tg_linear_new(m, "l2", HIDDEN, 5, NULL);
            tg_error err = { { 0 } };
            tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = wide_mlp_loss, .optimizer = tg_adam(1e-3), .backend = "cuda",
                                                       .precision = p, .n_inputs = 2,
                                                       .inputs = (tg_input_decl[]){ TG_F32("x", ROWS, IN), TG_I32("y", ROWS) } },
                                     &err);
            CHECK(t != NULL, "counters: compile: %s", err.msg);
            for (int s = 0; s < STEPS && t; s++) {
                tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, (size_t)ROWS * IN), tg_i32("y", y, ROWS) }, 2);
                losses[off][s] = r.status == TG_OK ? r.loss : NAN;
            }
            CHECK(t && tg_download_param(t, "l1.W", w[off], (size_t)IN * HIDDEN, &err) == TG_OK, "counters: l1.W: %s", err.msg);
            tg_destroy(t);
            tg_model_free(m);
            unsetenv("TG_CUDA_COUNTERS");
        }
        CHECK(memcmp(losses[0], losses[1], sizeof losses[0]) == 0 && memcmp(w[0], w[1], sizeof(float) * IN * HIDDEN) == 0 &&
                  losses[0][STEPS - 1] < losses[0][0],
              "cuda %s: cuBLASLt's counters zeroed once a step (losses %.6f -> %.6f) and before each product (%.6f -> %.6f): "
              "not the same bits", tg_precision_name(p), losses[0][0], losses[0][STEPS - 1], losses[1][0], losses[1][STEPS - 1]);
    }
    free(x);
    free(y);
    free(w[0]);
    free(w[1]);
}

/* Products run at once (cuda_backend.c, together_plan): three projections of one input, q, k and
 * v of a small transformer's widths (1,024 rows of 128), read it and write buffers of their own,
 * and run each on a stream of its own (TG_CUDA_TOGETHER=verbose says which on stderr; at bf16
 * always, at f32 and tf32 where the tuner picks cuBLASLt for them, not our small-product kernel);
 * trained three steps so, and in turn (TG_CUDA_TOGETHER=0): the same algorithms in one process,
 * so the same bits in the losses and in q's weight at every precision (a race between them would
 * not keep them). Their loss, mean((q k + v)^2) element by element, is summed in a
 * fixed order (attention's dq is not, on CUDA). */
enum { QKV_WIDTH = 128 };
static tg_tensor qkv_mix_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor h[3];
    for (int k = 0; k < 3; k++) h[k] = tg_linear(&qkv[k], in[0]);
    return tg_mean(tg_square(tg_add(tg_mul(h[0], h[1]), h[2])), TG_ALL, 0);
}

/* What the library says on stderr between stderr_grab and stderr_take (into said, size bytes). */
typedef struct { int saved; FILE *log; } stderr_capture;
static stderr_capture stderr_grab(void) {
    stderr_capture c = { dup(2), tmpfile() };
    if (c.log) fflush(stderr), dup2(fileno(c.log), 2);
    return c;
}
static void stderr_take(stderr_capture c, char *said, size_t size) {
    said[0] = 0;
    if (c.log) {
        fflush(stderr);
        dup2(c.saved, 2);
        rewind(c.log);
        said[fread(said, 1, size - 1, c.log)] = 0;
        fclose(c.log);
    }
    close(c.saved);
}

/* The losses of three steps of qkv_mix_loss on x ([rows, 128]), q's weight after them into w, and
 * whether stderr said that products ran at once. */
static bool qkv_mix_steps(tg_precision p, const float *x, int rows, float *losses, float *w) {
    char said[4096];
    stderr_capture cap = stderr_grab();
    tg_model *m = tg_model_new(13);
    for (int k = 0; k < 3; k++) qkv[k] = tg_linear_new(m, (const char *[]){ "q", "k", "v" }[k], QKV_WIDTH, QKV_WIDTH, NULL);
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = qkv_mix_loss, .optimizer = tg_adam(1e-3), .backend = "cuda",
                                               .precision = p, .inputs = (tg_input_decl[]){ TG_F32("x", rows, QKV_WIDTH) }, .n_inputs = 1 },
                             &err);
    CHECK(t != NULL, "together: compile: %s", err.msg);
    for (int s = 0; s < 3 && t; s++) {
        tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, (size_t)rows * QKV_WIDTH) }, 1);
        losses[s] = r.status == TG_OK ? r.loss : NAN;
    }
    CHECK(t && tg_download_param(t, "q.W", w, QKV_WIDTH * QKV_WIDTH, &err) == TG_OK, "together: q.W: %s", err.msg);
    tg_destroy(t);
    tg_model_free(m);
    stderr_take(cap, said, sizeof said);
    return strstr(said, "run at once") != NULL;
}

static void cuda_together(void) {
    enum { ROWS = 1024 };
    const size_t weights = sizeof(float) * QKV_WIDTH * QKV_WIDTH;
    float *x = malloc(sizeof(float) * ROWS * QKV_WIDTH), *w[2] = { malloc(weights), malloc(weights) };
    check_rng = 3;
    for (int i = 0; x && i < ROWS * QKV_WIDTH; i++) x[i] = (float)check_uniform(-1, 1);
    for (int p = TG_PRECISION_F32; p <= TG_PRECISION_BF16 && x && w[0] && w[1]; p++) {
        float losses[2][3];
        setenv("TG_CUDA_TOGETHER", "verbose", 1);
        bool grouped = qkv_mix_steps((tg_precision)p, x, ROWS, losses[0], w[0]);
        setenv("TG_CUDA_TOGETHER", "0", 1);
        bool alone = !qkv_mix_steps((tg_precision)p, x, ROWS, losses[1], w[1]);
        unsetenv("TG_CUDA_TOGETHER");
        CHECK(alone && (grouped || p != TG_PRECISION_BF16), "cuda %s: q, k and v's products run at once by default (%s), in turn with "
              "TG_CUDA_TOGETHER=0 (%s)", tg_precision_name((tg_precision)p), grouped ? "yes" : "no", alone ? "yes" : "no");
        CHECK(memcmp(losses[0], losses[1], sizeof losses[0]) == 0 && memcmp(w[0], w[1], weights) == 0 &&
                  losses[0][2] < losses[0][0],
              "cuda %s: q, k and v's products at once (losses %.6f -> %.6f) and in turn (%.6f -> %.6f): not the same bits",
              tg_precision_name((tg_precision)p), losses[0][0], losses[0][2], losses[1][0], losses[1][2]);
    }
    free(x);
    free(w[0]);
    free(w[1]);
}

/* `loss` over m's layers compiled for CUDA at precision p with Adam, three steps on x [rows, cols]
 * and y [rows], each checked, its loss into losses[s] (NAN where it failed; losses may be NULL).
 * NULL where the compile failed (checked; `what` names the case in the messages). */
static tg_train *cuda_three_steps(const char *what, tg_model *m, tg_forward_fn loss, tg_precision p, const float *x, int rows,
                                  int cols, const int32_t *y, float *losses) {
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = loss, .optimizer = tg_adam(1e-3), .backend = "cuda", .precision = p,
                                               .n_inputs = 2,
                                               .inputs = (tg_input_decl[]){ TG_F32("x", rows, cols), TG_I32("y", rows) } },
                             &err);
    CHECK(t != NULL, "%s: compile: %s", what, err.msg);
    for (int s = 0; s < 3 && t; s++) {
        tg_result r = tg_step(t, (tg_data[]){ tg_f32("x", x, (size_t)rows * cols), tg_i32("y", y, (size_t)rows) }, 2);
        CHECK(r.status == TG_OK, "%s: step %d: %s", what, s, r.error);
        if (losses) losses[s] = r.status == TG_OK ? r.loss : NAN;
    }
    return t;
}

static int count_text(const char *s, const char *what) {
    int n = 0;
    for (; s && (s = strstr(s, what)); s++) n++;
    return n;
}

/* Launches off the critical path on a side stream (cuda_backend.c, side_plan): MODEL_RESIDUAL_LN's
 * step over 256 rows, whose layer norm's and biases' column sums (at tf32 and bf16 also weight
 * gradients' products; at f32 ours, on the shared workspace, stay) no later launch reads, trained
 * three steps so (TG_CUDA_SIDE=verbose says which go beside, on stderr), with every product that
 * may beside, ours too, on the side stream's workspace (TG_CUDA_SIDE_FLOP=0, as char_gpt's large
 * weight gradients go) and with every launch on one stream (=0): the same bits in the losses and
 * in lh's weight at every precision (a launch beside that read a buffer before it was written, or
 * after the plan handed it on, or shared a workspace with a product at once, would not keep
 * them). Returns how many launches went beside. */
static int residual_steps(tg_precision p, const char *side, const char *flop, const float *x, const int32_t *y, int rows,
                          float *losses, float *w) {
    char said[16384];
    stderr_capture cap = stderr_grab();
    setenv("TG_CUDA_SIDE", side, 1);
    if (flop) setenv("TG_CUDA_SIDE_FLOP", flop, 1);
    tg_model *m = tg_model_new(17);
    residual_ln_layers(m);
    tg_error err = { { 0 } };
    tg_train *t = cuda_three_steps("side stream", m, residual_ln_loss, p, x, rows, 6, y, losses);
    CHECK(t && tg_download_param(t, "lh.W", w, 520 * 520, &err) == TG_OK, "side stream: lh.W: %s", err.msg);
    tg_destroy(t);
    tg_model_free(m);
    unsetenv("TG_CUDA_SIDE");
    unsetenv("TG_CUDA_SIDE_FLOP");
    stderr_take(cap, said, sizeof said);
    return count_text(said, "beside:");
}

/* Buffers cleared as soon as their memory is free, beside the launches between (cuda_backend.c,
 * clear_early): MODEL_ATTENTION's step, whose attention backwards' dq (added up in memory) is free
 * some launches before each backward, trained three steps with TG_CUDA_SIDE=verbose (which says
 * each early clear on stderr), by default and with TG_CUDA_CLEAR_EARLY=0 (each clear right before
 * its backward). The last step's gradients of both layers' q weights (through dq) agree within
 * the order of dq's additions (atomics: not the same bits twice): a clear late, racing the
 * backward's additions or missed would leave other values in dq. Which clears go early depends on
 * where the plan puts dq at each precision: at least one of the three runs must have one. Returns
 * how many early clears stderr listed; grads gets a0.q.W's and a1.q.W's. */
static int attention_clear_steps(tg_precision p, const char *early, const float *x, const int32_t *y, float *grads) {
    char said[16384];
    stderr_capture cap = stderr_grab();
    setenv("TG_CUDA_SIDE", "verbose", 1);
    setenv("TG_CUDA_CLEAR_EARLY", early, 1);
    tg_model *m = tg_model_new(3);
    attention_layers(m);
    tg_error err = { { 0 } };
    tg_train *t = cuda_three_steps("early clears", m, attention_loss, p, x, 70, 6, y, NULL);
    CHECK(t && tg_download_param_grad(t, "a0.q.W", grads, 32 * 32, &err) == TG_OK &&
              tg_download_param_grad(t, "a1.q.W", grads + 32 * 32, 32 * 32, &err) == TG_OK,
          "early clears: q's gradients: %s", err.msg);
    tg_destroy(t);
    tg_model_free(m);
    unsetenv("TG_CUDA_SIDE");
    unsetenv("TG_CUDA_CLEAR_EARLY");
    stderr_take(cap, said, sizeof said);
    return count_text(said, "cleared early:");
}

static void cuda_early_clear(void) {
    float x[70 * 6], grads[2][2 * 32 * 32];
    int32_t y[70];
    check_rng = 9;
    for (int i = 0; i < 70 * 6; i++) x[i] = (float)check_uniform(-1, 1);
    for (int i = 0; i < 70; i++) y[i] = (int32_t)(check_next() % 5);
    int early[3] = { 0 }, total = 0;
    for (int p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++) {
        const char *name = tg_precision_name((tg_precision)p);
        total += early[p - TG_PRECISION_F32] = attention_clear_steps((tg_precision)p, "1", x, y, grads[0]);
        const int in_place = attention_clear_steps((tg_precision)p, "0", x, y, grads[1]);
        CHECK(in_place == 0, "cuda %s: %d buffers cleared early with TG_CUDA_CLEAR_EARLY=0", name, in_place);
        double worst = 0, largest = 0;
        for (int i = 0; i < 2 * 32 * 32; i++) {
            worst = fmax(worst, fabs((double)grads[0][i] - grads[1][i]));
            largest = fmax(largest, fabs((double)grads[1][i]));
        }
        CHECK(largest > 0 && worst <= 2e-3 * largest, "cuda %s: q's gradients with early clears within %.3g of in place's (largest %.3g)",
              name, worst, largest);
    }
    CHECK(total > 0, "cuda: buffers cleared early by default: f32 %d, tf32 %d, bf16 %d (none: this test runs no early clear)", early[0],
          early[1], early[2]);
}

/* The wide MLP's bf16 step, three of them on 256 rows, TG_CUDA_ELEMS set to `elems`: l1's weights
 * after them into w (4096 x 1024), and whether its GELU (2^20 values, bf16 alone) took groups of
 * eight lanes. */
static bool eight_lane_steps(const char *elems, float *w) {
    enum { ROWS = 256 };
    float *x = malloc(sizeof(float) * ROWS * 1024);
    int32_t y[ROWS];
    check_rng = 11;
    for (int i = 0; x && i < ROWS * 1024; i++) x[i] = (float)check_uniform(-1, 1);
    for (int i = 0; i < ROWS; i++) y[i] = (int32_t)(check_next() % 16);
    setenv("TG_CUDA_ELEMS", elems, 1);
    tg_model *m = wide_layers();
    tg_error err = { { 0 } };
    float losses[3] = { NAN, NAN, NAN };
    tg_train *t = x ? cuda_three_steps("eight lanes", m, wide_loss, TG_PRECISION_BF16, x, ROWS, 1024, y, losses) : NULL;
    unsetenv("TG_CUDA_ELEMS");
    for (int s = 0; s < 3 && t; s++) CHECK(isfinite(losses[s]), "eight lanes, TG_CUDA_ELEMS=%s: step %d's loss %g", elems, s, losses[s]);
    CHECK(t && tg_download_param(t, "l1.W", w, 4096 * 1024, &err) == TG_OK, "eight lanes: l1.W: %s", err.msg);
    const char *src = t ? tg_train_kernel_source(t) : NULL;
    const bool eight = src && strstr(src, "+ threadIdx.x) * 8;");
    tg_destroy(t);
    tg_model_free(m);
    free(x);
    return eight;
}

/* Eight lanes a thread (cuda_codegen.c's bf16_only) compute what four do, bit for bit: the same
 * arithmetic an element, only the loads and stores wider. */
static void cuda_eight_lanes(void) {
    float *w[2] = { malloc(sizeof(float) * 4096 * 1024), malloc(sizeof(float) * 4096 * 1024) };
    if (!w[0] || !w[1]) {
        free(w[0]);
        free(w[1]);
        return;
    }
    const bool eight = eight_lane_steps("4", w[0]), four = eight_lane_steps("1", w[1]);
    CHECK(eight && !four, "cuda bf16: the GELU of 2^20 values in eights by default (%d), not with one group a thread (%d)", eight,
          four);
    CHECK(memcmp(w[0], w[1], sizeof(float) * 4096 * 1024) == 0, "cuda bf16: eight lanes and four: l1.W not the same bits");
    free(w[0]);
    free(w[1]);
}

static void cuda_side_stream(void) {
    enum { ROWS = 256 };
    const size_t weights = sizeof(float) * 520 * 520;
    float *x = malloc(sizeof(float) * ROWS * 6), *w[3] = { malloc(weights), malloc(weights), malloc(weights) };
    int32_t *y = malloc(sizeof(int32_t) * ROWS);
    check_rng = 5;
    for (int i = 0; x && i < ROWS * 6; i++) x[i] = (float)check_uniform(-1, 1);
    for (int i = 0; y && i < ROWS; i++) y[i] = (int32_t)(check_next() % 5);
    for (int p = TG_PRECISION_F32; p <= TG_PRECISION_BF16 && x && y && w[0] && w[1] && w[2]; p++) {
        float losses[3][3];
        const char *name = tg_precision_name((tg_precision)p);
        int beside = residual_steps((tg_precision)p, "verbose", NULL, x, y, ROWS, losses[0], w[0]);
        int products = residual_steps((tg_precision)p, "verbose", "0", x, y, ROWS, losses[2], w[2]);
        int alone = residual_steps((tg_precision)p, "0", NULL, x, y, ROWS, losses[1], w[1]);
        CHECK(beside > 0 && alone == 0, "cuda %s: %d launches beside the critical path by default, %d with TG_CUDA_SIDE=0", name,
              beside, alone);
        CHECK(products > beside || (products == beside && p != TG_PRECISION_F32),
              "cuda %s: %d launches beside with every product that may, %d by default", name, products, beside);
        CHECK(isfinite(losses[0][2]) && losses[0][2] != losses[0][0], "cuda %s: side stream: the steps train (losses %.6f -> %.6f)",
              name, losses[0][0], losses[0][2]);
        for (int v = 0; v < 2; v++)
            CHECK(memcmp(losses[2 * v], losses[1], sizeof losses[1]) == 0 && memcmp(w[2 * v], w[1], weights) == 0,
                  "cuda %s: side stream%s (losses %.9g -> %.9g) and one stream (%.9g -> %.9g): not the same bits", name,
                  v ? " with every product" : "", losses[2 * v][0], losses[2 * v][2], losses[1][0], losses[1][2]);
    }
    free(x);
    free(y);
    for (int v = 0; v < 3; v++) free(w[v]);
}

/* The q, k and v step's kernels, TG_CUDA_FOLD set to `fold` (NULL: the default), their gradients
 * not grouped (TG_GROUP_PRODUCTS=0: grouped, the three bias gradients are one sum). */
static int qkv_kernels(tg_precision p, const char *fold) {
    if (fold) setenv("TG_CUDA_FOLD", fold, 1);
    setenv("TG_GROUP_PRODUCTS", "0", 1);
    tg_model *m = tg_model_new(5);
    for (int k = 0; k < 3; k++) qkv[k] = tg_linear_new(m, (const char *[]){ "q", "k", "v" }[k], 32, 32, NULL);
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = qkv_loss, .optimizer = tg_adam(1e-3), .backend = "cuda-nvrtc",
                                               .precision = p, .inputs = (tg_input_decl[]){ TG_F32("x", 8, 64, 32) }, .n_inputs = 1 },
                             &err);
    const char *src = t ? tg_train_kernel_source(t) : NULL;
    CHECK(src && strstr(src, " acc0 = 0, acc1 = 0, acc2 = 0;"), "%s, TG_CUDA_FOLD=%s: the q, k and v bias gradients summed in "
          "one kernel (%s)", tg_precision_name(p), fold ? fold : "", err.msg);
    int n = count_text(src, "__global__");
    tg_destroy(t);
    tg_model_free(m);
    unsetenv("TG_CUDA_FOLD");
    unsetenv("TG_GROUP_PRODUCTS");
    return n;
}

/* The three projections' biases, which attention reads from memory, are added by their products
 * (cuda_fold_addends: cuBLASLt's epilogue or our product kernels'), not by three kernels of their
 * own: at bf16 always, at f32 and tf32 where a product has a wave of tiles (FOLD_FULL_OUTPUTS; these
 * 512 x 32 do not), or with TG_CUDA_FOLD=all. */
static void nvrtc_qkv_sums(void) {
    for (tg_precision p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++) {
        int plain = qkv_kernels(p, "0"), by_rule = qkv_kernels(p, NULL), all = qkv_kernels(p, "all");
        int want = p == TG_PRECISION_BF16 ? 3 : 0;
        CHECK(plain > 0 && plain - by_rule == want && plain - all == 3, "%s: folding the q, k and v biases into their products "
              "saves %d kernels of %d (expected %d), %d with TG_CUDA_FOLD=all (expected 3)", tg_precision_name(p), plain - by_rule,
              plain, want, plain - all);
    }
}

/* How many kernels of the source contain `a`, and `b` too where b is not NULL */
static int kernels_with(const char *src, const char *a, const char *b) {
    int n = 0;
    for (const char *k = src ? strstr(src, "__global__ void ") : NULL; k; ) {
        const char *next = strstr(k + 1, "__global__ void "), *end = next ? next : k + strlen(k);
        const char *x = strstr(k, a), *y = b ? strstr(k, b) : k;
        n += x && x < end && y && y < end;
        k = next;
    }
    return n;
}

/* MODEL_ATTENTION's bf16 step compiled by cuda-nvrtc, TG_CUDA_LANES and TG_GROUP_PRODUCTS set to
 * `lanes` and `group` (NULL: the default). */
static tg_train *attention_bf16_step(tg_model **m, const char *lanes, const char *group, tg_error *err) {
    if (lanes) setenv("TG_CUDA_LANES", lanes, 1);
    if (group) setenv("TG_GROUP_PRODUCTS", group, 1);
    *m = tg_model_new(3);
    attention_layers(*m);
    tg_train *t = tg_compile(&(tg_train_spec){ .model = *m, .loss = attention_loss, .optimizer = tg_adam(1e-3), .backend = "cuda-nvrtc",
                                               .precision = TG_PRECISION_BF16,
                                               .inputs = (tg_input_decl[]){ TG_F32("x", 2, 70, 6), TG_I32("y", 2, 70) }, .n_inputs = 2 },
                             err);
    unsetenv("TG_CUDA_LANES");
    unsetenv("TG_GROUP_PRODUCTS");
    return t;
}

/* MODEL_ATTENTION's bf16 step compiled by cuda-nvrtc, its products' gradients not grouped
 * (TG_GROUP_PRODUCTS=0: grouped, dq is no product's operand): each layer's q, k and v bias gradients are
 * summed in one kernel, which also writes dq's rounded copy as it reads dq (added up in f32 memory
 * by the attention's backward): q's sum brought forward to k's and v's (sum_copy_store). With
 * TG_CUDA_LANES=2 the same kernel sums two columns a thread, six accumulators, and stores the
 * copy's pairs packed (sum_lanes). */
static void nvrtc_qkv_copy(void) {
    static const struct { const char *lanes, *sums, *copy; } runs[] = {
        { NULL, "float acc0 = 0, acc1 = 0, acc2 = 0;", "] = tgk_round_bf16(" },
        { "2", "float acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0, acc4 = 0, acc5 = 0;", ") = tgk_pack_bf16(" },
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = attention_bf16_step(&m, runs[r].lanes, "0", &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL;
        const int both = kernels_with(src, runs[r].sums, runs[r].copy);
        CHECK(src && both == 2, "bf16 attention layers, lanes %s: %d kernels sum q's, k's and v's bias gradients and write dq's copy "
              "(expected 2) %s", runs[r].lanes ? runs[r].lanes : "default", both, err.msg);
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* MODEL_ATTENTION's bf16 step compiled by cuda-nvrtc with its products' gradients grouped (the
 * default there), four lanes forced: each layer's q, k and v gradients side by side (a sum of
 * three pads), which the kernel summing their columns writes, read one vector of four under a
 * test of its range per source (pad_lanes), the f32 dq and the bf16 dk and dv. */
static void nvrtc_grouped_concat(void) {
    tg_model *m;
    tg_error err = { { 0 } };
    tg_train *t = attention_bf16_step(&m, "4", NULL, &err);
    const char *src = t ? tg_train_kernel_source(t) : NULL;
    const int f32 = kernels_with(src, "? *(const float4 *)(P", "? *(const uint2 *)(P");
    CHECK(src && f32 == 2 && count_op(tg_train_graph(t), "matmul") == 21,
          "bf16 attention layers, grouped: %d kernels read G's sources a vector at a time (expected 2) %s", f32, err.msg);
    tg_destroy(t);
    tg_model_free(m);
}

/* The same with TG_PACK_ATTENTION=1: each layer's q, k and v gradients packed side by side by the
 * attention's backward (its kernel named _p3: PK 3; grad.c's packs), dq copied in after it by a
 * kernel of its own (attn_dq_), which the products read as they lie: no kernel puts them together,
 * and the kernel summing the three biases' gradients reads the packed bf16 values only. */
static void nvrtc_packed_gradients(void) {
    tg_model *m;
    tg_error err = { { 0 } };
    setenv("TG_PACK_ATTENTION", "1", 1);
    tg_train *t = attention_bf16_step(&m, "4", NULL, &err);
    unsetenv("TG_PACK_ATTENTION");
    const char *src = t ? tg_train_kernel_source(t) : NULL;
    const int together = kernels_with(src, "? *(const float4 *)(P", "? *(const uint2 *)(P");
    const int packed = kernels_with(src, "void attn_bwd_", "_p3"), copies = kernels_with(src, "void attn_dq_", NULL);
    CHECK(src && together == 0 && packed == 1 && copies == 1 && count_op(tg_train_graph(t), "attention_backward") == 2 &&
          count_op(tg_train_graph(t), "matmul") == 21, "bf16 attention layers, grouped and packed: %d kernels put the gradients "
          "together (expected 0), %d attention backward kernels pack them, %d copy dq in (expected 1, 1) %s", together, packed,
          copies, err.msg);
    tg_destroy(t);
    tg_model_free(m);
}

/* A layer norm between two linear layers, its backward inside the gradient (the first layer's
 * output needs one): what the generated kernels are checked for below. */
static tg_linear ln_in, ln_out;
static tg_layernorm ln_mid;
static tg_tensor ln_loss(const void *ctx, const tg_tensor *in) {
    return tg_cross_entropy(tg_linear(&ln_out, tg_layernorm(&ln_mid, tg_linear(&ln_in, in[0]))), in[1], TG_MEAN);
}

static tg_train *ln_step(tg_model **m, tg_precision precision, int rows, tg_error *err) {
    *m = tg_model_new(6);
    ln_in = tg_linear_new(*m, "in", 32, 128, NULL);
    ln_mid = tg_layernorm_new(*m, "ln", 128, 1e-5, 1);
    ln_out = tg_linear_new(*m, "out", 128, 10, NULL);
    return tg_compile(&(tg_train_spec){ .model = *m, .loss = ln_loss, .optimizer = tg_adam(1e-3), .backend = "cuda-nvrtc",
                                        .precision = precision,
                                        .inputs = (tg_input_decl[]){ TG_F32("x", rows, 32), TG_I32("y", rows) }, .n_inputs = 2 },
                      err);
}

/* How many coordinates the source's row kernels (a thread group a row r) and column sums
 * (blocks of 1024 threads) divide out of an element's index ("i12 / 128", "f7 % 128": they name
 * their element indices i<n> and f<n>). */
static int divided_indices(const char *src) {
    int n = 0;
    for (const char *k = strstr(src, "__global__ void "); k; ) {
        const char *next = strstr(k + 1, "__global__ void "), *end = next ? next : k + strlen(k);
        const char *r = strstr(k, "const int64_t r = (");
        bool rows = (r && r < end) || strncmp(k + 16, "__launch_bounds__(1024)", 23) == 0;
        for (const char *op = k; rows && (op = strpbrk(op + 1, "/%")) && op < end; ) {
            const char *q = op - 1;
            if (op[-1] != ' ' || op[1] != ' ') continue;
            while (q > k && q[-1] >= '0' && q[-1] <= '9') q--;
            n += q < op - 1 && (q[-1] == 'i' || q[-1] == 'f') && !isalnum((unsigned char)q[-2]) && q[-2] != '_';
        }
        k = next;
    }
    return n;
}

/* How many times the source's row kernels read back a row value they stored ("if (lane == 0)
 * P<id>[r] = ..." and a later "P<id>[" in the same kernel): none, as the value stays in the
 * variable every lane holds (cuda_codegen.c's row_vals); *stored: how many such stores there are. */
static int row_values_read_back(const char *src, int *stored) {
    static const char STORE[] = "if (lane == 0) P";
    int n = 0;
    *stored = 0;
    for (const char *k = strstr(src, "__global__ void "); k; ) {
        const char *next = strstr(k + 1, "__global__ void "), *end = next ? next : k + strlen(k);
        for (const char *st = strstr(k, STORE); st && st < end; st = strstr(st + 1, STORE)) {
            char name[24];
            int id = atoi(st + strlen(STORE));
            snprintf(name, sizeof name, "P%d[", id);
            (*stored)++;
            for (const char *u = strstr(k, name); u && u < end; u = strstr(u + 1, name)) n += u != st + strlen(STORE) - 1;
        }
        k = next;
    }
    return n;
}

/* How many coordinates of the source's row kernels and column sums (a row r, a column oj, a row k
 * of a column, a place j in a row) are declared 64-bit, and (*narrow) how many 32-bit: a graph
 * whose indices fit 32 bits should have none of the first (cuda_codegen.c's head_type). The
 * prelude's helpers, which take their sizes as arguments, are not counted. */
static int wide_coordinates(const char *src, int *narrow) {
    static const char *const WIDE[] = { "const int64_t r = ", "const int64_t oj = ", "const int64_t k = ", "for (int64_t k = k0",
                                        "for (int64_t j = ", "const int64_t j = " };
    static const char *const SHORT[] = { "const int r = ", "const int oj = " };
    int wide = 0;
    *narrow = 0;
    src = strstr(src, "    tgk_prior();");   /* the generated kernels, past the prelude's helpers */
    for (size_t w = 0; src && w < sizeof WIDE / sizeof WIDE[0]; w++)
        for (const char *k = strstr(src, WIDE[w]); k; k = strstr(k + 1, WIDE[w])) wide++;
    for (size_t w = 0; src && w < sizeof SHORT / sizeof SHORT[0]; w++)
        for (const char *k = strstr(src, SHORT[w]); k; k = strstr(k + 1, SHORT[w])) (*narrow)++;
    return wide;
}

/* The name of the kernel declared at k ("__global__ void "), past its launch bounds if any */
static const char *kernel_name(const char *k) {
    k += strlen("__global__ void ");
    if (strncmp(k, "__launch_bounds__(", 18) == 0 && strstr(k, ") ")) k = strstr(k, ") ") + 2;
    return k;
}

/* How many kernels of the source begin otherwise than with tgk_prior (the prelude's own kernels,
 * launched as usual, aside); *n: how many there are. */
static int kernels_without_prior(const char *src, int *n) {
    static const char K[] = "__global__ void ";
    int bad = 0;
    *n = 0;
    for (const char *k = strstr(src, K); k; k = strstr(k + 1, K)) {
        const char *name = kernel_name(k), *body = strstr(k, "{\n");
        static const char *const usual[] = { "tg_wb_check", "tg_to_", "tg_writeback", "tg_add_addend", "tg_begin", "tg_report" };
        bool aside = false;
        for (size_t u = 0; u < sizeof usual / sizeof usual[0]; u++) aside |= strncmp(name, usual[u], strlen(usual[u])) == 0;
        if (aside) continue;
        (*n)++;
        bad += !body || strncmp(body + 2, "    tgk_prior();", 16) != 0;
    }
    return bad;
}

/* Distinct nodes the source checks for non-finite values as it stores them (WB_MARK) */
static int checked_nodes(const char *src) {
    int ids[64], n = 0;
    for (const char *m = strstr(src, "/* checks "); m; m = strstr(m + 1, "/* checks ")) {
        int id = atoi(m + 10), k = 0;
        while (k < n && ids[k] != id) k++;
        if (k == n && n < 64) ids[n++] = id;
    }
    return n;
}

/* The check of the gradients: how many it reads (a segment each) over kcheck and its pieces
 * (kcheck0, kcheck1, ..); *last: where the last of those kernels begins (NULL: none). */
static int checked_gradients(const char *src, int *pieces, const char **last) {
    int n = 0;
    *pieces = 0;
    *last = NULL;
    for (const char *k = strstr(src, "void kcheck"); k; k = strstr(k + 1, "void kcheck")) {
        const char *end = strstr(k, "\n}\n");
        for (const char *b = strstr(k, "bad |= "); b && end && b < end; b = strstr(b + 1, "bad |= ")) n++;
        *pieces += k[strlen("void kcheck")] != '(';
        *last = k;
    }
    return n;
}

/* Leaves replaced in place: outputs declared at a bound leaf's buffer ("float *__restrict__ P<id>
 * = (float *)B[..]"); *guarded: whether the check (kcheck and its pieces) comes before the first
 * kernel that replaces one, and every such kernel starts with the guard. */
static int inplace_outputs(const char *src, bool *guarded) {
    int n = 0, pieces;
    const char *check, *first = NULL;
    checked_gradients(src, &pieces, &check);
    *guarded = check != NULL;
    for (const char *k = strstr(src, "__global__ void "); k; k = strstr(k + 1, "__global__ void ")) {
        if (kernel_name(k)[0] != 'k') continue;
        const char *end = strstr(k, "\n}\n"), *guard = strstr(k, "    const float tgk_loss = ");
        int here = 0;
        for (const char *d = strstr(k, "    float *__restrict__ P"); d && end && d < end; d = strstr(d + 1, "    float *__restrict__ P"))
            here += strstr(d, "= (float *)B[") == strchr(d, '=');
        if (here && !first) first = k;
        if (here) *guarded &= guard && end && guard < end;
        n += here;
    }
    if (first) *guarded &= check < first;
    return n;
}

/* The gradients' check in pieces (cuda_codegen.c's grad_check_piece): the layer-norm step at bf16
 * with TG_CUDA_CHECK_PIECE=1 checks each gradient once it is computed, in pieces beside kcheck,
 * every one of the six exactly once and all before the first kernel that replaces a leaf; by
 * default (a piece takes at least 2^20 values) kcheck alone checks them. */
static void nvrtc_check_pieces(void) {
    for (int forced = 0; forced < 2; forced++) {
        if (forced) setenv("TG_CUDA_CHECK_PIECE", "1", 1);
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = ln_step(&m, TG_PRECISION_BF16, 64, &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL, *last;
        int pieces = 0, checked = src ? checked_gradients(src, &pieces, &last) : -1;
        bool guarded;
        const int inplace = src ? inplace_outputs(src, &guarded) : 0;
        CHECK(src && checked == 6 && (forced ? pieces >= 2 : pieces == 0) && inplace == 18 && guarded,
              "TG_CUDA_CHECK_PIECE %s: %d gradients checked (expected 6) in %d pieces and kcheck, %s: %s", forced ? "1" : "unset",
              checked, pieces, src && guarded ? "before the updates in place" : "not all before the updates in place", err.msg);
        unsetenv("TG_CUDA_CHECK_PIECE");
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* The generated step at each precision: every kernel of ours waits for the one before it first
 * (it may be launched early); the 18 values written back (six parameters, each with Adam's two
 * moments) replace their leaves in place, after kcheck found every gradient finite, and none of
 * them is checked (TG_CUDA_INPLACE=0: the kernels computing them check each value they store, so
 * the step's copy back needs no pass of its own over them). At f32 the layer norm's backward is
 * one row kernel that keeps its centred gradient in registers (with TG_CUDA_ROW_REGS=0 in a
 * buffer); at tf32 and bf16 the input gradient it makes of it is a kernel of its own here (a
 * product reads it rounded), which reads the centred gradient from memory: nothing may stay in
 * registers then. Row kernels and column
 * sums read per-row values and the layer norm's weights at coordinates of their rows (row_lane),
 * dividing none out of an element's index, in 32-bit coordinates (every index fits); a row
 * kernel's own sums and statistics are read back from registers, not from the buffers they are
 * stored in. */
static void nvrtc_generated_kernels(void) {
    for (int p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++)
        for (int regs = 1; regs >= 0; regs--) {
            if (regs) unsetenv("TG_CUDA_ROW_REGS");
            else setenv("TG_CUDA_ROW_REGS", "0", 1);
            tg_model *m;
            tg_error err = { { 0 } };
            tg_train *t = ln_step(&m, (tg_precision)p, 64, &err);
            const char *src = t ? tg_train_kernel_source(t) : NULL, *prec = tg_precision_name((tg_precision)p);
            CHECK(src != NULL, "%s: NVRTC compiles the layer-norm step: %s", prec, err.msg);
            if (src) {
                int n, bad = kernels_without_prior(src, &n);
                CHECK(n > 5 && bad == 0, "%s: %d of %d generated kernels begin otherwise than with tgk_prior", prec, bad, n);
                bool guarded;
                int inplace = inplace_outputs(src, &guarded);
                CHECK(inplace == 18 && guarded && checked_nodes(src) == 0,
                      "%s: %d leaves replaced in place (expected 18), %s, %d values checked (expected none)", prec, inplace,
                      guarded ? "after kcheck, guarded" : "not all after kcheck and guarded", checked_nodes(src));
                bool in_regs = strstr(src, "float R") && strstr(src, "_Pragma(\"unroll\") for (int it");
                CHECK(in_regs == (regs == 1 && p == TG_PRECISION_F32), "%s, TG_CUDA_ROW_REGS %s: the layer norm's backward %s registers", prec,
                      regs ? "unset" : "0", in_regs ? "keeps a member in" : "keeps nothing in");
                CHECK(divided_indices(src) == 0, "%s: %d coordinates divided out of a row kernel's or column sum's element index", prec,
                      divided_indices(src));
                int stored, back = row_values_read_back(src, &stored);
                CHECK(stored >= 3 && back == 0, "%s: row kernels read back %d of the %d row values they store", prec, back, stored);
                int narrow, wide = wide_coordinates(src, &narrow);
                CHECK(wide == 0 && narrow >= 2, "%s: row kernels and column sums declare %d coordinates 64-bit and %d 32-bit", prec,
                      wide, narrow);
            }
            tg_destroy(t);
            tg_model_free(m);
            if (!regs) continue;
            setenv("TG_CUDA_INPLACE", "0", 1);
            t = ln_step(&m, (tg_precision)p, 64, &err);
            src = t ? tg_train_kernel_source(t) : NULL;
            bool guarded;
            CHECK(src && checked_nodes(src) == 18 && inplace_outputs(src, &guarded) == 0 && !strstr(src, "void kcheck("),
                  "%s, TG_CUDA_INPLACE=0: %d write-back sources checked where computed (expected 18), none in place", prec,
                  src ? checked_nodes(src) : -1);
            unsetenv("TG_CUDA_INPLACE");
            tg_destroy(t);
            tg_model_free(m);
        }
    unsetenv("TG_CUDA_ROW_REGS");
}

/* An optimizer's update, one kernel with a segment per parameter (or per run of parameters of
 * one size), calls one function from the segments whose code is the same but for the buffers
 * (cuda_codegen.c, share_segments): NVRTC then compiles that code once. Every function is
 * defined after the mark that keeps it in the part with its kernel, and called at least twice;
 * a segment not alike any other stays inline. NVRTC compiling the step in parts (as many as this
 * machine's processors) checks that each part has the functions its kernels call. */
static void nvrtc_shared_segments(void) {
    for (int p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++) {
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = ln_step(&m, (tg_precision)p, 64, &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL, *prec = tg_precision_name((tg_precision)p);
        CHECK(src != NULL, "%s: NVRTC compiles the layer-norm step: %s", prec, err.msg);
        int defs = 0, calls = 0, unmarked = 0, once = 0;
        for (const char *d = src ? strstr(src, "__noinline__ void tgs") : NULL; d; d = strstr(d + 1, "__noinline__ void tgs")) {
            char name[40], call[64];
            sscanf(d + strlen("__noinline__ void "), "%39[a-z0-9_]", name);
            snprintf(call, sizeof call, "        %s(H, ", name);
            int n = 0;
            for (const char *c = strstr(src, call); c; c = strstr(c + 1, call)) n++;
            const char *mark = strstr(src, "// functions of the kernel below\n"), *last = NULL;
            for (; mark && mark < d; mark = strstr(mark + 1, "// functions of the kernel below\n")) last = mark;
            unmarked += !last || strstr(last, "__global__") < d;
            once += n < 2;
            calls += n;
            defs++;
        }
        CHECK(defs >= 1 && unmarked == 0 && once == 0, "%s: %d functions shared by the update's segments (%d after no mark of "
              "their kernel, %d called fewer than twice; %d calls)", prec, defs, unmarked, once, calls);
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* At tf32 kleaves also writes a transposed copy of a weight whose forward product has 2^31
 * multiply-adds or more, which that product reads (cuda_codegen.c's reads_leaf_transposed): the
 * wide MLP's first layer at 8192 rows ([8192 x 1024] x [1024 x 4096]), not its second (2^29), nor
 * any at 128 rows unless TG_CUDA_TRANSPOSED=1 (then both), nor any at f32 or bf16. A copy's tile is
 * read along the weight's rows (4096 apart) and written along the copy's (1024 apart). The product
 * reads the copy with B transposed: at 128 rows the second layer's forward runs through our small
 * kernel's nn instance, through its nt one where it reads the copy (nvrtc_own_products' rule). */
static void nvrtc_transposed_leaves(void) {
    static const struct { tg_precision precision; int rows; const char *env; int copies; } runs[] = {
        { TG_PRECISION_TF32, 8192, NULL, 1 }, { TG_PRECISION_TF32, 128, NULL, 0 }, { TG_PRECISION_TF32, 128, "1", 2 },
        { TG_PRECISION_TF32, 8192, "0", 0 }, { TG_PRECISION_F32, 8192, NULL, 0 }, { TG_PRECISION_BF16, 8192, "1", 0 },
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        if (runs[r].env) setenv("TG_CUDA_TRANSPOSED", runs[r].env, 1);
        else unsetenv("TG_CUDA_TRANSPOSED");
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = wide_step(&m, runs[r].precision, runs[r].rows, &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL, *prec = tg_precision_name(runs[r].precision);
        CHECK(src != NULL, "%s, %d rows: NVRTC compiles the step: %s", prec, runs[r].rows, err.msg);
        /* four values a thread (both layers' sizes divide by four): read along the weight's rows, the tile
         * written along the copy's; the second layer's plain rounded copy (its input gradient's operand; the
         * first has none) stored from the same load */
        int copies = 0, first = 0;
        const char *put = "= make_float4(tgT[x][y], tgT[x + 1][y], tgT[x + 2][y], tgT[x + 3][y]);";
        for (const char *d = src ? strstr(src, put) : NULL; d; d = strstr(d + 1, put)) copies++;
        if (src && strstr(src, "const int64_t i = (r0 + y) * 4096ll + j0 + x;") &&
            strstr(src, " + (j0 + y) * 1024ll + r0 + x) = make_float4(tgT[x][y]"))
            first = 1;
        CHECK(copies == runs[r].copies && first == (runs[r].copies > 0), "%s, %d rows, TG_CUDA_TRANSPOSED=%s: kleaves writes %d "
              "transposed weights (expected %d; the first layer's %s)", prec, runs[r].rows, runs[r].env ? runs[r].env : "(unset)",
              copies, runs[r].copies, first ? "among them" : "not");
        bool plain = src && strstr(src, " + i) = t;");
        CHECK(plain == (runs[r].copies == 2), "%s, %d rows, TG_CUDA_TRANSPOSED=%s: the second layer's plain copy %s from its tile",
              prec, runs[r].rows, runs[r].env ? runs[r].env : "(unset)", plain ? "is stored" : "is not stored");
        if (src && runs[r].precision == TG_PRECISION_TF32 && runs[r].rows == 128) {
            bool nn = strstr(src, "void __launch_bounds__(512) tg_gemm_nn(") != NULL;
            CHECK(nn == (runs[r].copies == 0), "tf32, 128 rows, TG_CUDA_TRANSPOSED=%s: the forward product %s our nn kernel",
                  runs[r].env ? runs[r].env : "(unset)", nn ? "runs" : "does not run");
        }
        tg_destroy(t);
        tg_model_free(m);
    }
    unsetenv("TG_CUDA_TRANSPOSED");
}

/* A bias gradient over 64 rows of 65,536 columns: one kernel sums every row of a column in one
 * thread (thin_sum), storing the gradient it sums (its producer); not over 256 rows. */
static tg_linear thin_layer;

static tg_tensor thin_loss(const void *ctx, const tg_tensor *in) { return tg_mean(tg_square(tg_linear(&thin_layer, in[0])), TG_ALL, 0); }

static void nvrtc_thin_sums(void) {
    for (int rows = 64; rows <= 256; rows *= 4) {
        tg_model *m = tg_model_new(5);
        thin_layer = tg_linear_new(m, "l", 8, 65536, NULL);
        tg_error err = { { 0 } };
        tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = thin_loss, .optimizer = tg_sgd(0.1, 0, 0, 0), .backend = "cuda-nvrtc",
                                                   .inputs = (tg_input_decl[]){ TG_F32("x", rows, 8) }, .n_inputs = 1 },
                                 &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL;
        CHECK(src != NULL, "thin sums, %d rows: NVRTC compiles the step: %s", rows, err.msg);
        char loop[60];
        snprintf(loop, sizeof loop, "for (int k = 0; k < %d; k++) {", rows);
        bool thin = src && strstr(src, loop) && strstr(src, "if (oj >= 65536ll) return;");
        CHECK(thin == (rows == 64), "thin sums, %d rows: the bias gradient %s summed a column a thread", rows, thin ? "is" : "is not");
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* A GPT's embeddings: a token's row by index plus its position's, 32 wide, through a layer norm
 * (its backward a row kernel, as at char_gpt's 384) and a head, over 20 sequences of 5. On CUDA
 * the gradient at their sum is scattered into the token table's gradient and summed over the
 * batch for the position table's by one kernel (cuda_codegen.c's scatter_with_sum; over fewer
 * than 17 sequences the sum is computed inline where it is read instead: fuse_small_reduction). */
static tg_embedding_layer emb_tok, emb_pos;
static tg_layernorm emb_ln;
static tg_tensor embedding_pair_loss(const void *ctx, const tg_tensor *in) {
    tg_tensor x = tg_add(tg_embed(&emb_tok, in[0]), tg_embed(&emb_pos, tg_arange(5, TG_INT32)));
    return tg_cross_entropy(tg_linear(&l2, tg_layernorm(&emb_ln, x)), in[1], TG_MEAN);
}
static tg_train *embedding_pair_step(const char *backend, tg_model **m, tg_error *err) {
    *m = tg_model_new(8);
    emb_tok = tg_embedding_new(*m, "tok", 7, 32);
    emb_pos = tg_embedding_new(*m, "pos", 5, 32);
    emb_ln = tg_layernorm_new(*m, "ln", 32, 0, 1);
    l2 = tg_linear_new(*m, "l2", 32, 5, NULL);
    return tg_compile(&(tg_train_spec){ .model = *m, .loss = embedding_pair_loss, .optimizer = tg_adam(1e-2), .backend = backend,
                                        .inputs = (tg_input_decl[]){ TG_I32("z", 20, 5), TG_I32("y", 20, 5) }, .n_inputs = 2 },
                      err);
}

/* The embeddings' gradients after a step on `backend` against the reference's (float64 sums
 * rounded once: within 1e-5 of the largest), and on cuda-nvrtc the one kernel is there. */
static void embedding_pair(const char *backend) {
    int32_t z[100], y[100];
    check_rng = 21;
    for (int i = 0; i < 100; i++) z[i] = (int32_t)(check_next() % 7), y[i] = (int32_t)(check_next() % 5);
    float grads[2][12 * 32];
    for (int b = 0; b < 2; b++) {
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = embedding_pair_step(b ? backend : "reference", &m, &err);
        tg_result r = t ? tg_step(t, (tg_data[]){ tg_i32("z", z, 100), tg_i32("y", y, 100) }, 2) : (tg_result){ 0 };
        CHECK(t && r.status == TG_OK && tg_download_param_grad(t, "tok.W", grads[b], 7 * 32, &err) == TG_OK &&
                  tg_download_param_grad(t, "pos.W", grads[b] + 7 * 32, 5 * 32, &err) == TG_OK,
              "token and position embeddings on %s: %s %s", b ? backend : "reference", err.msg, r.error);
        tg_destroy(t);
        tg_model_free(m);
    }
    double worst = 0, largest = 0;
    for (int i = 0; i < 12 * 32; i++) largest = fmax(largest, fabs(grads[0][i]));
    for (int i = 0; i < 12 * 32; i++) worst = fmax(worst, fabs((double)grads[0][i] - grads[1][i]));
    CHECK(largest > 0 && worst <= 1e-5 * largest, "token and position embeddings on %s: gradients within %.3g of the reference's "
          "(largest %.3g)", backend, worst, largest);
}

static void nvrtc_embedding_pair(void) {
    tg_model *m;
    tg_error err = { { 0 } };
    tg_train *t = embedding_pair_step("cuda-nvrtc", &m, &err);
    const char *src = t ? tg_train_kernel_source(t) : NULL;
    CHECK(src && count_text(src, "tgk_scatter_rows_sum4(P") == 1 && count_text(src, "tgk_scatter_rows4(P") == 1,
          "token and position embeddings: NVRTC compiles the step, one kernel scattering the token rows and summing the "
          "positions' (and a scatter of the positions' by row): %s", err.msg);
    tg_destroy(t);
    tg_model_free(m);
}

/* A forward whose output sums exp of its 12,000 inputs (one row no row kernel takes): cut into
 * chunks of a warp each on CUDA, whose sums the row's last warp adds in chunk order, the same
 * bits every run, with no float atomics. */
static tg_tensor long_sum_forward(const void *ctx, const tg_tensor *in) { return tg_sum(tg_exp(in[0]), TG_ALL, 0); }
static void nvrtc_chunked_sums(void) {
    tg_model *m = tg_model_new(5);
    thin_layer = tg_linear_new(m, "l", 8, 4, NULL);
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = thin_loss, .optimizer = tg_sgd(0.1, 0, 0, 0), .backend = "cuda-nvrtc",
                                               .inputs = (tg_input_decl[]){ TG_F32("x", 4, 8) }, .n_inputs = 1 },
                             &err);
    tg_forward *f = t ? tg_attach(t, &(tg_forward_spec){ .forward = long_sum_forward, .n_inputs = 1,
                                                         .inputs = (tg_input_decl[]){ TG_F32("x", 40, 300) } },
                                  &err)
                      : NULL;
    const char *src = f ? tg_forward_kernel_source(f) : NULL;
    CHECK(src != NULL, "long sum: NVRTC compiles the forward: %s", err.msg);
    bool in_order = src && strstr(src, "part[w] = acc0;"), atomics = src && strstr(src, "atomicAdd(P");
    CHECK(in_order && !atomics, "long sum: chunks' sums %s in order, %s with atomics", in_order ? "added" : "not added",
          atomics ? "some" : "none");
    if (f) tg_detach(f);
    tg_destroy(t);
    tg_model_free(m);
}

/* Each column sum cut into chunks leaves its partial sums in scratch of its own (cuda_codegen.c's
 * sum_scratch), so that sums may run at once on the side stream: the bf16 wide MLP's step over
 * 8,192 rows has several, none at the scratch of another. */
static void nvrtc_scratch_apart(void) {
    tg_model *m;
    tg_error err = { { 0 } };
    tg_train *t = wide_step(&m, TG_PRECISION_BF16, 8192, &err);
    const char *src = t ? tg_train_kernel_source(t) : NULL;
    CHECK(src != NULL, "scratch apart: NVRTC compiles the step: %s", err.msg);
    long long at[64];
    int n = 0, same = 0;
    for (const char *q = src; q && n < 64 && (q = strstr(q, "double *sums = (double *)(A + ")); q++) {
        at[n] = atoll(q + strlen("double *sums = (double *)(A + "));
        for (int k = 0; k < n; k++) same += at[k] == at[n];
        n++;
    }
    CHECK(n >= 2 && same == 0, "scratch apart: %d chunked sums, %d at another's scratch", n, same);
    tg_destroy(t);
    tg_model_free(m);
}

/* What a weight gradient's product beside the chain reads stays live until the chain's next
 * product (cuda_backend.c, hold_side_inputs): the wide MLP's bf16 step with every product that may
 * beside (TG_CUDA_SIDE_FLOP=0) keeps l2's weight gradient's [8192, 4096] operand while the
 * hidden layer's gradient is computed, so its plan needs more memory than with every launch on one
 * stream (TG_CUDA_SIDE=0), where that memory is handed on. */
static void nvrtc_side_hold(void) {
    size_t bytes[2] = { 0, 0 };
    for (int v = 0; v < 2; v++) {
        setenv(v ? "TG_CUDA_SIDE_FLOP" : "TG_CUDA_SIDE", "0", 1);
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = wide_step(&m, TG_PRECISION_BF16, 8192, &err);
        unsetenv(v ? "TG_CUDA_SIDE_FLOP" : "TG_CUDA_SIDE");
        CHECK(t != NULL, "side hold: NVRTC compiles the step: %s", err.msg);
        bytes[v] = t ? tg_train_planned_bytes(t) : 0;
        tg_destroy(t);
        tg_model_free(m);
    }
    CHECK(bytes[0] > 0 && bytes[1] > bytes[0], "side hold: the plan with every product beside %zu bytes, on one stream %zu", bytes[1],
          bytes[0]);
}

/* MODEL_RESIDUAL_LN's step compiled by cuda-nvrtc: with TG_CUDA_ROW_COLUMNS=1 its layer norm's two
 * parameter gradients, and l1's bias gradient after them (the sum of the row kernel's output:
 * row_trailing_sum), are summed in one row kernel, in chunks of 512 columns over 38 blocks, whose
 * 3 x 520 partial sums a block one kernel after it adds up (tgk_rows_total); by default (300 rows:
 * fewer than row_columns takes) and with =0 in column-sum kernels of their own. (At tf32 and bf16 this graph's kernel order puts the two sums
 * apart; char_gpt's are summed in its row kernels.) */
static void nvrtc_row_columns(void) {
    for (int on = 2; on >= 0; on--) {
        if (on < 2) setenv("TG_CUDA_ROW_COLUMNS", on ? "1" : "0", 1);
        tg_model *m = tg_model_new(3);
        residual_ln_layers(m);
        tg_error err = { { 0 } };
        tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = residual_ln_loss, .optimizer = tg_adam(1e-3), .backend = "cuda-nvrtc",
                                                   .inputs = (tg_input_decl[]){ TG_F32("x", 300, 6), TG_I32("y", 300) }, .n_inputs = 2 },
                                 &err);
        unsetenv("TG_CUDA_ROW_COLUMNS");
        const char *src = t ? tg_train_kernel_source(t) : NULL;
        CHECK(src != NULL, "NVRTC compiles the residual layer norm's step: %s", err.msg);
        const char *fin = src ? strstr(src, ", 1560ll, 38ll, col);") : NULL;
        bool one = fin && !strstr(fin + 1, "tgk_rows_total((") && kernels_with(src, "__shared__ double tgc[8][512];", NULL) == 1;
        CHECK(on == 1 ? one : src && !strstr(src, "tgk_rows_total(("), "TG_CUDA_ROW_COLUMNS %s: the layer norm's parameter "
              "gradients are %s its backward's row kernel", on == 2 ? "unset" : on ? "1" : "0", fin ? "summed in" : "not summed in");
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* A row kernel's inputs held in registers (cuda_codegen.c, cg.row_in): with TG_CUDA_ROW_COLUMNS=1
 * the layer norm's backward between two linear layers (4,096 rows of 128 floats, four a lane), whose
 * row kernel sums its parameters' gradients, loads the rows it reads into X<id>[it] arrays as each
 * row starts, under launch bounds of two blocks an SM; with TG_CUDA_ROW_INPUTS=0 none, under
 * bounds of three; with =1 the forward's row kernel (its mean and variance) too. */
static void nvrtc_row_inputs(void) {
    static const struct { const char *env; int fused, plain; const char *bounds; } runs[] = {
        { NULL, 1, 0, "__launch_bounds__(256, 2)" }, { "0", 0, 0, "__launch_bounds__(256, 3)" }, { "1", 1, 1, "__launch_bounds__(256, 2)" },
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        setenv("TG_CUDA_ROW_COLUMNS", "1", 1);
        if (runs[r].env) setenv("TG_CUDA_ROW_INPUTS", runs[r].env, 1);
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = ln_step(&m, TG_PRECISION_F32, 4096, &err);
        unsetenv("TG_CUDA_ROW_COLUMNS");
        unsetenv("TG_CUDA_ROW_INPUTS");
        const char *src = t ? tg_train_kernel_source(t) : NULL;
        /* kernels loading rows into registers, with the column sums' finish and without */
        const char *in = "[it] = *(const float4 *)(P";
        const int fused = kernels_with(src, in, "__shared__ double tgc["), plain = kernels_with(src, in, NULL) - fused;
        const char *label = runs[r].env ? runs[r].env : "unset";
        CHECK(src && fused == runs[r].fused && (runs[r].plain ? plain >= 1 : plain == 0) && strstr(src, runs[r].bounds),
              "TG_CUDA_ROW_INPUTS %s: %d row kernels with column sums and %d without load their rows into registers (expected %d "
              "and %s%d), %s %s", label, fused, plain, runs[r].fused, runs[r].plain ? "at least " : "", runs[r].plain,
              src && strstr(src, runs[r].bounds) ? "under" : "not under", runs[r].bounds);
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* The most lanes a column sum of `src` takes (its head: "oc = (... + y) * L;"), and a large
 * element-wise kernel ("g = (... + threadIdx.x) * L;") */
static int lanes_in(const char *src, const char *head) {
    char pat[40];
    for (int l = 8; l >= 1; l /= 2) {
        snprintf(pat, sizeof pat, "%s) * %d;", head, l);
        if (strstr(src, pat)) return l;
    }
    return 0;
}

static void nvrtc_lanes(void) {
    static const struct { const char *lanes; int rows, sum, gelu, update; } runs[] = {   /* expected lanes: sums, GELU, Adam */
        { NULL, 8192, 4, 8, 4 }, { NULL, 128, 1, 0, 4 }, { "4", 128, 4, 0, 4 }, { "2", 8192, 2, 2, 2 }, { "1", 8192, 1, 1, 0 },
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        if (runs[r].lanes) setenv("TG_CUDA_LANES", runs[r].lanes, 1);
        else unsetenv("TG_CUDA_LANES");
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = wide_step(&m, TG_PRECISION_BF16, runs[r].rows, &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL, *label = runs[r].lanes ? runs[r].lanes : "default";
        CHECK(t != NULL && src, "lanes %s, %d rows: NVRTC compiles the step: %s", label, runs[r].rows, err.msg);
        if (src) {   /* the GELU: 2^25 elements, or 2^19 (too few for ELEMS_MIN: one lane, no group loop) */
            int sum = lanes_in(src, "+ y"), gelu = lanes_in(src, "+ threadIdx.x");
            CHECK(sum == runs[r].sum, "lanes %s, %d rows: column sums take %d lanes (expected %d)", label, runs[r].rows, sum,
                  runs[r].sum);
            CHECK(gelu == runs[r].gelu, "lanes %s, %d rows: large element-wise kernels take %d lanes (expected %d)", label,
                  runs[r].rows, gelu, runs[r].gelu);
            int update = 0;   /* the update's first segment: i = (g - 0) * lanes */
            for (int l = 4; l >= 2 && !update; l /= 2) {
                char pat[40];
                snprintf(pat, sizeof pat, "((g - 0ll) * %d)", l);
                if (strstr(src, pat)) update = l;
            }
            CHECK(update == runs[r].update, "lanes %s, %d rows: the optimizer's segments take %d lanes (expected %d)", label,
                  runs[r].rows, update, runs[r].update);
        }
        tg_destroy(t);
        tg_model_free(m);
    }
    unsetenv("TG_CUDA_LANES");
}

/* Our kernel for small products (cuda_products.c) is compiled in only for the f32 and tf32
 * products of at most 2^27 multiply-adds, one instance per pair of transposes they use: the bf16
 * MLP above has none; at f32 with 128 rows, the second layer's three products (forward, input
 * gradient, weight gradient: nn, nt, tn) are small, the first layer's weight gradient (2^29) is
 * not; with 8192 rows none is. Which of ours and cuBLASLt's runs is timed on the device
 * (tests/run_gpu.sh runs every product through ours, TG_CUDA_OWN_GEMM). */
static void nvrtc_own_products(void) {
    static const struct { tg_precision precision; int rows; const char *has; } runs[] = {
        { TG_PRECISION_F32, 128, "nn nt tn" }, { TG_PRECISION_TF32, 128, "nn nt tn" }, { TG_PRECISION_BF16, 128, "" },
        { TG_PRECISION_F32, 8192, "" },
    };
    static const char *const NAMES[] = { "nn", "nt", "tn", "tt" };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = wide_step(&m, runs[r].precision, runs[r].rows, &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL, *prec = tg_precision_name(runs[r].precision);
        CHECK(t != NULL && src, "%s, %d rows: NVRTC compiles the step: %s", prec, runs[r].rows, err.msg);
        for (int k = 0; k < 4 && src; k++) {
            char name[40];
            snprintf(name, sizeof name, "void __launch_bounds__(512) tg_gemm_%s(", NAMES[k]);
            bool want = strstr(runs[r].has, NAMES[k]) != NULL, has = strstr(src, name) != NULL;
            CHECK(has == want, "%s, %d rows: our product kernel tg_gemm_%s %s (expected %s)", prec, runs[r].rows, NAMES[k],
                  has ? "compiled in" : "left out", want ? "in" : "out");
        }
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* Which leaves the first kernel rounds (kleaves' shadow pointers): the product operands, and at
 * bf16 the first layer's bias too, which cuBLASLt adds to its product (cuda_fold_addends); not the
 * second layer's, whose sum softmax reads from memory, nor any at tf32 (a bias the epilogue adds
 * there is f32). So at bf16 x, W1, b1 and W2 (4), at tf32 x, W1 and W2 (3); a fold that stopped
 * happening drops bf16 to 3. */
static void nvrtc_bias_folds(void) {
    static const struct { tg_precision precision; int leaves; } runs[] = { { TG_PRECISION_BF16, 4 }, { TG_PRECISION_TF32, 3 } };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        tg_model *m;
        tg_error err = { { 0 } };
        tg_train *t = wide_step(&m, runs[r].precision, 128, &err);
        const char *src = t ? tg_train_kernel_source(t) : NULL, *prec = tg_precision_name(runs[r].precision);
        CHECK(t != NULL && src, "%s: NVRTC compiles the step: %s", prec, err.msg);
        const char *k = src ? strstr(src, "void kleaves(") : NULL, *end = k ? strstr(k, "const int64_t g") : NULL;
        int n = 0;
        for (const char *s = k; s && end && (s = strstr(s, "__restrict__ S")) && s < end; s++) n++;
        CHECK(n == runs[r].leaves, "%s: the first kernel rounds %d leaves (expected %d)", prec, n, runs[r].leaves);
        tg_destroy(t);
        tg_model_free(m);
    }
}

/* Every op through each kernel path this CPU runs below its best (the runs above took the best),
 * forced with TG_CPU_ISA: the packed products with AVX2 register tiles, the portable loops and
 * OpenBLAS, which an AVX-512 machine would otherwise never run. The generated code is built for
 * the same ISA. Then names the CPU lacks, or that do not exist, fall back to the best. */
static void test_isa_paths(void) {
    cpu_isa best = cpu_isa_best();
    printf("test_backend: this CPU runs the %s path (TG_CPU_ISA=%s)\n", cpu_isa_name(best),
           getenv("TG_CPU_ISA") ? getenv("TG_CPU_ISA") : "");
    for (int isa = CPU_ISA_PORTABLE; isa < (int)best; isa++) {
        char label[64];
        snprintf(label, sizeof label, "%s kernels", cpu_isa_name((cpu_isa)isa));
        setenv("TG_CPU_ISA", cpu_isa_name((cpu_isa)isa), 1);
        for (int i = 0; i < N_CASES; i++) {
            if (!case_chosen(CASES[i].name)) continue;
            compare_case("cpu", TG_PRECISION_F32, &CASES[i], label);
            CHECK(cpu_kernels_isa() == (cpu_isa)isa, "%s %s: ran the %s kernels", CASES[i].name, label,
                  cpu_isa_name(cpu_kernels_isa()));
        }
    }
    setenv("TG_CPU_ISA", "sse9", 1);
    CHECK(cpu_isa_choose() == best, "an unknown TG_CPU_ISA falls back to the best path");
    setenv("TG_CPU_ISA", "avx512", 1);
    CHECK(cpu_isa_choose() == (best == CPU_ISA_AVX512 ? CPU_ISA_AVX512 : best), "TG_CPU_ISA=avx512 where the CPU lacks it falls back");
    setenv("TG_CPU_ISA", "portable", 1);
    CHECK(cpu_isa_choose() == CPU_ISA_PORTABLE, "TG_CPU_ISA=portable is always there");
    unsetenv("TG_CPU_ISA");
    CHECK(cpu_isa_choose() == best, "without TG_CPU_ISA, the best path");
    CHECK(strcmp(cpu_isa_cflags(CPU_ISA_AVX2), "-mavx2 -mfma") == 0 && strstr(cpu_isa_cflags(CPU_ISA_AVX512), "-mavx512f") &&
              !strstr(cpu_isa_cflags(CPU_ISA_AVX2), "march"),
          "generated code is built with the ISA's own flags, never -march=native");
}

/* bf16 on the CPU: where the AVX-512 path has AVX512-BF16, products take bf16 operands through
 * vdpbf16ps and attention rounds its operands, so every op at bf16 matches the reference's bf16
 * emulation (which an f32 run would not, by about 1e-3); elsewhere, and on the AVX2 path, the
 * backend says it runs f32. */
static void test_cpu_bf16(void) {
    bool has = cpu_isa_bf16(cpu_isa_best());
    printf("test_backend: cpu bf16 products %s\n", has ? "through AVX512-BF16" : "not on this CPU (bf16 runs f32)");
    tg_model *m = tg_model_new(1);
    fwd_ctx plain = { &CASES[0], false };
    tg_error err;
    tg_probe *p = tg_probe_new_at("cpu", TG_PRECISION_BF16, m, fwd, &plain, CASES[0].in, CASES[0].n_in, false, &err);
    CHECK(p && tg_probe_graph(p)->precision == (has ? TG_PRECISION_BF16 : TG_PRECISION_F32), "cpu at bf16 runs %s",
          p ? tg_precision_name(tg_probe_graph(p)->precision) : err.msg);
    tg_probe_free(p);
    p = tg_probe_new_at("cpu", TG_PRECISION_TF32, m, fwd, &plain, CASES[0].in, CASES[0].n_in, false, &err);
    CHECK(p && tg_probe_graph(p)->precision == TG_PRECISION_F32, "cpu at tf32 runs f32 (no TF32 on a CPU)");
    tg_probe_free(p);
    setenv("TG_CPU_ISA", "avx2", 1);
    p = tg_probe_new_at("cpu", TG_PRECISION_BF16, m, fwd, &plain, CASES[0].in, CASES[0].n_in, false, &err);
    CHECK(p && tg_probe_graph(p)->precision == TG_PRECISION_F32, "cpu at bf16 on the AVX2 path runs f32");
    tg_probe_free(p);
    unsetenv("TG_CPU_ISA");
    tg_model_free(m);
    for (int i = 0; has && i < N_CASES; i++) compare_case("cpu", TG_PRECISION_BF16, &CASES[i], "cpu bf16");
    if (has) printf("test_backend: cpu bf16 against the reference, worst rel err %.3g\n", worst_seen[TG_PRECISION_BF16]);
    worst_seen[TG_PRECISION_BF16] = 0;
}

/* Through the public API a compiler failure is a NULL handle and the compiler's message. */
static void test_compile_failure(void) {
    setenv("TG_CC", "false", 1);
    setenv("TG_CFLAGS", "-O1 -DTG_TEST_DIFFERENT_HASH2", 1);
    tg_model *m = tg_model_new(1);
    mlp_layers(m, false);
    tg_error err = { { 0 } };
    tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .inputs = (tg_input_decl[]){ TG_F32("x", 8, 6), TG_I32("y", 8) },
                                               .n_inputs = 2, .optimizer = tg_adam(1e-3), .backend = "cpu" }, &err);
    CHECK(t == NULL && strstr(err.msg, "kernel compilation failed"), "tg_compile with a failing compiler: %s", err.msg);
    tg_destroy(t);
    tg_model_free(m);
    unsetenv("TG_CC");
    unsetenv("TG_CFLAGS");
}

/* Every case on CUDA at each precision against the reference. */
static void cuda_precisions(void) {
    static const char *const label[4] = { "", "cuda", "cuda tf32", "cuda bf16" };
    for (tg_precision p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++)
        for (int i = 0; i < N_CASES; i++) compare_case("cuda", p, &CASES[i], label[p]);
    printf("test_backend: cuda against the reference, worst rel err: f32 %.3g, tf32 %.3g, bf16 %.3g\n",
           worst_seen[TG_PRECISION_F32], worst_seen[TG_PRECISION_TF32], worst_seen[TG_PRECISION_BF16]);
    /* The cases' products are small: the CUDA schedule computes them inside the kernels that read
     * them. Through cuBLAS too, as larger ones go: through cuBLASLt or our product kernels
     * (tests/run_gpu.sh forces ours: TG_CUDA_X3, TG_CUDA_OWN_GEMM), a product's bias by cuBLASLt's
     * epilogue or our tensor-core kernel's store, at bf16 a product's sum with another's by beta =
     * 1 (cuda_fold_addends; the small kernel takes neither); then
     * every case at f32 through cublasGemmEx (where cuBLASLt has no algorithm for a product), and
     * the cases with addends at tf32 and bf16 (its f32 sums, then the addend added, and at bf16 the
     * sum rounded: tg_add_addend). */
    static const char *const lt_label[4] = { "", "cuda, cuBLASLt", "cuda tf32, cuBLASLt", "cuda bf16, cuBLASLt" };
    static const char *const ex_label[4] = { "", "cuda, cublasGemmEx", "cuda tf32, cublasGemmEx", "cuda bf16, cublasGemmEx" };
    setenv("TG_CUDA_SMALL_REDUCTIONS", "0", 1);
    setenv("TG_CUDA_FOLD", "all", 1);   /* at f32 and tf32 too: the cases' products are far smaller than a wave */
    setenv("TG_CUDA_LT", "1", 1);
    for (tg_precision p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++)
        for (int i = 0; i < N_CASES; i++) compare_case("cuda", p, &CASES[i], lt_label[p]);
    setenv("TG_CUDA_LT", "0", 1);
    for (tg_precision p = TG_PRECISION_F32; p <= TG_PRECISION_BF16; p++)
        for (int i = 0; i < N_CASES; i++)
            if (p == TG_PRECISION_F32 || strstr(CASES[i].name, "bias") || strstr(CASES[i].name, "products summed"))
                compare_case("cuda", p, &CASES[i], ex_label[p]);
    unsetenv("TG_CUDA_LT");
    unsetenv("TG_CUDA_FOLD");
    unsetenv("TG_CUDA_SMALL_REDUCTIONS");
}

/* Whole models trained on `backend` beside the reference, step by step (the models' names are
 * cases of TG_TEST_CASES too). */
static void train_models(const char *backend) {
    if (case_chosen("mlp+gelu+dropout, adamw, clipping"))
        train_compare(backend, "mlp+gelu+dropout, adamw, clipping", mlp_loss, (tg_input_decl[]){ TG_F32("x", 8, 6), TG_I32("y", 8) },
                      MODEL_MLP);
    if (case_chosen("cnn"))
        train_compare(backend, "cnn", cnn_loss, (tg_input_decl[]){ TG_F32("x", 3, 2, 6, 6), TG_I32("y", 3) }, MODEL_CNN);
    if (case_chosen("mlp with a 300-wide head, padded products"))
        train_compare(backend, "mlp with a 300-wide head, padded products", mlp_loss,
                      (tg_input_decl[]){ TG_F32("x", 8, 6), TG_I32("y", 8) }, MODEL_WIDE_HEAD);
    if (case_chosen("residual layer norm")) {   /* on CUDA its sums in the row kernel (nvrtc_row_columns) */
        setenv("TG_CUDA_ROW_COLUMNS", "1", 1);
        train_compare(backend, "residual layer norm", residual_ln_loss, (tg_input_decl[]){ TG_F32("x", 300, 6), TG_I32("y", 300) },
                      MODEL_RESIDUAL_LN);
        unsetenv("TG_CUDA_ROW_COLUMNS");
    }
    if (case_chosen("token and position embeddings")) embedding_pair(backend);
    if (case_chosen("two attention layers"))
        train_compare(backend, "two attention layers", attention_loss, (tg_input_decl[]){ TG_F32("x", 2, 70, 6), TG_I32("y", 2, 70) },
                      MODEL_ATTENTION);
    if (case_chosen("two attention layers, grouped products"))
        train_compare(backend, "two attention layers, grouped products", attention_loss,
                      (tg_input_decl[]){ TG_F32("x", 2, 70, 6), TG_I32("y", 2, 70) }, MODEL_ATTENTION_GROUPED);
    if (case_chosen("two attention layers, grouped products, four lanes")) {   /* on CUDA: G's sources read a vector at a time (pad_lanes) */
        setenv("TG_CUDA_LANES", "4", 1);
        train_compare(backend, "two attention layers, grouped products, four lanes", attention_loss,
                      (tg_input_decl[]){ TG_F32("x", 2, 70, 6), TG_I32("y", 2, 70) }, MODEL_ATTENTION_GROUPED);
        unsetenv("TG_CUDA_LANES");
    }
}

int main(void) {
    char dir[] = "/tmp/tg_test_backend_XXXXXX";
    if (!mkdtemp(dir)) return 1;
    setenv("TG_CACHE_DIR", dir, 1);
    if (getenv("TG_TEST_CUDA_ONLY")) {   /* device runs: the passes a GPU machine adds (cuda, and cpu bf16) */
        test_cpu_bf16();
        if (tg_backend_available("cuda", NULL, 0)) {
            cuda_precisions();
            cuda_padded_products();
            cuda_counters();
            cuda_together();
            cuda_side_stream();
            cuda_early_clear();
            cuda_eight_lanes();
            train_models("cuda");
        }
        return check_report("test_backend");
    }
    for (int fused = 1; fused >= 0; fused--) {
        if (fused) unsetenv("TG_NO_FUSE");
        else setenv("TG_NO_FUSE", "1", 1);
        for (int i = 0; i < N_CASES; i++) compare_case("cpu", TG_PRECISION_F32, &CASES[i], fused ? "fused" : "unfused");
    }
    unsetenv("TG_NO_FUSE");
    setenv("TG_FUSE_RECOMPUTE", "1", 1);   /* the CUDA backend's schedule: shared cheap values recomputed */
    for (int i = 0; i < N_CASES; i++) compare_case("cpu", TG_PRECISION_F32, &CASES[i], "fused, recomputing");
    unsetenv("TG_FUSE_RECOMPUTE");
    test_isa_paths();
    test_cpu_bf16();
    padded_widths();
    test_small_reduction_schedule();
    /* The kernels every exported file carries (src/export/portable_kernels.h), run by the CPU
     * backend's generated code: every op, forward and backward, fused and unfused. */
    cpu_set_kernel_table(export_kernels);
    for (int fused = 1; fused >= 0; fused--) {
        if (fused) unsetenv("TG_NO_FUSE");
        else setenv("TG_NO_FUSE", "1", 1);
        for (int i = 0; i < N_CASES; i++)
            compare_case("cpu", TG_PRECISION_F32, &CASES[i], fused ? "export kernels" : "export kernels, unfused");
    }
    unsetenv("TG_NO_FUSE");
    cpu_set_kernel_table(NULL);
    test_cache(dir);
    test_compile_failure();
    char why[256];
    bool cuda = tg_backend_available("cuda", why, sizeof why);
    printf("test_backend: cuda %s%s\n", cuda ? "available" : "not available: ", why);
    const char *backends[2] = { "cpu", "cuda" };
    for (int b = 0; b < (cuda ? 2 : 1); b++) {
        if (b) cuda_precisions();
        if (b) cuda_counters();
        if (b) cuda_together();
        if (b) cuda_side_stream();
        if (b) cuda_early_clear();
        if (b) cuda_eight_lanes();
        train_models(backends[b]);
    }
    if (case_chosen("two attention layers, grouped products"))   /* the reference's packed gradients (attention_backward) */
        train_compare("reference", "two attention layers, grouped products, on the reference", attention_loss,
                      (tg_input_decl[]){ TG_F32("x", 2, 70, 6), TG_I32("y", 2, 70) }, MODEL_ATTENTION_GROUPED);
    if (!cuda) {
        /* Without a GPU: a reason, and a compile that fails cleanly with it. */
        CHECK(strlen(why) > 0 && strstr(why, "CUDA"), "tg_backend_available(cuda) gives a reason: '%s'", why);
        tg_model *m = tg_model_new(1);
        mlp_layers(m, false);
        tg_error err = { { 0 } };
        tg_train *t = tg_compile(&(tg_train_spec){ .model = m, .loss = mlp_loss, .optimizer = tg_adam(1e-3), .backend = "cuda",
                                                   .inputs = (tg_input_decl[]){ TG_F32("x", 8, 6), TG_I32("y", 8) }, .n_inputs = 2 }, &err);
        CHECK(t == NULL && strstr(err.msg, "CUDA is not available"), "tg_compile on cuda without a GPU: %s", err.msg);
        tg_model_free(m);
        nvrtc_compile_all();
        if (tg_backend_available("cuda-nvrtc", NULL, 0)) {
            nvrtc_lanes();
            nvrtc_own_products();
            nvrtc_bias_folds();
            nvrtc_qkv_sums();
            nvrtc_qkv_copy();
            nvrtc_grouped_concat();
            nvrtc_packed_gradients();
            nvrtc_generated_kernels();
            nvrtc_check_pieces();
            nvrtc_embedding_pair();
            nvrtc_shared_segments();
            nvrtc_transposed_leaves();
            nvrtc_thin_sums();
            nvrtc_row_columns();
            nvrtc_row_inputs();
            nvrtc_chunked_sums();
            nvrtc_scratch_apart();
            nvrtc_side_hold();
        }
    }
    char cmd[100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_report("test_backend");
}
