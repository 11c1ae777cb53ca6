/* The CUDA backend: its code generator and launch list. */
#ifndef TG_CUDA_H
#define TG_CUDA_H

#include "compile/compile.h"

/* cuda_codegen.c: the CUDA source of a scheduled, planned graph and its launch list, in order:
 * kernels (grid x block threads, each kernel (float *A, void *const *B, const double *H), and for
 * some a cuda_kernel_args),
 * cuBLAS products (row-major op(A) op(B), per-batch offsets) and memsets of a node's buffer. */
typedef enum { CL_KERNEL, CL_GEMM, CL_MEMSET } cuda_launch_kind;
/* The fourth parameter of a kernel compiled once for several launches (attention), as the device
 * source's tga_args: where each buffer is (floats into the arena; -1 none; -2 - i: B[i]; the
 * sources, the outputs, then the outputs' rounded copies: attention_kernel), and the scale. */
typedef struct {
    int64_t at[11];
    float scale;
} cuda_kernel_args;
typedef struct {
    cuda_launch_kind kind;
    int node;                        /* the node whose buffer it writes */
    char name[64];                   /* CL_KERNEL */
    int64_t grid, grid_y;
    int block;
    int shared;                      /* CL_KERNEL: bytes of dynamic shared memory */
    bool takes_args;                 /* CL_KERNEL: args is its fourth parameter */
    cuda_kernel_args args;
    int ta, tb, a, b;                /* CL_GEMM: operands' nodes */
    bool b_transposed;               /* CL_GEMM: B read from its leaf's transposed copy (tshadow), tb set */
    int addend;                      /* CL_GEMM: the node added to the product (cuda_fold_addends), or -1: a bias
                                      * (N values, added to each row) or a value of C's shape */
    int64_t M, N, K, batch, *aoff, *boff;
    int64_t n;                       /* CL_MEMSET: floats to clear (tg_zero) */
    int64_t at;                      /* CL_MEMSET: from this float of the arena's (scratch), or -1: the node's buffer */
    /* CL_KERNEL: the arena it reads and writes, n_io spans {lo, hi, written} in floats from the
     * arena's start (io NULL: not known, so nothing runs beside it: cuda_backend.c's side plan) */
    int64_t (*io)[3];
    int n_io;
} cuda_launch;
typedef struct {
    const tg_graph *g;
    cuda_launch *launch;
    int n, cap;
    int sm;
    size_t prelude;   /* bytes of the source before the first kernel of a node: what every part repeats */
    /* Floats from the arena's start: scratch of the sums cut into chunks, to allocate past the
     * plan's arena and zero once (scratch_end 0: none). */
    size_t scratch_at, scratch_end;
    /* The scratch of the attention backwards that pack their gradients (attention_kernel): dq
     * added up in f32, cleared before each (floats from the arena's start, and how many; 0: none
     * yet). */
    size_t dq_scratch, dq_floats;
    /* Every write-back source's kernel flags a value that is not finite itself (cuda_codegen.c,
     * WB_MARK): the step needs no pass of its own over them (tg_wb_check). */
    bool writebacks_checked;
    /* Steps that replace parameters in place (codegen_cuda's inplace_ok): per node, the leaf its
     * kernel replaced in place, or -1 (NULL: none); grads_checked: kcheck checks every gradient
     * before the first such kernel, and no write-back value is checked. */
    int *inplace;
    bool grads_checked;
} cuda_plan;
/* Written before the device functions that only the kernel after them calls (segments that
 * share their code): the backend compiles that text with the kernel, in the same part. */
#define CUDA_FUNCTIONS_MARK "// functions of the kernel below\n"
/* The hyper scalars' slots on the device: the graph's, at least CUDA_HYPER_SLOTS (patch sites may
 * add more). The write-back flag is the slot after them. */
#define CUDA_HYPER_SLOTS 8
static inline int cuda_hyper_slots(const tg_graph *g) { return g->n_hyper > CUDA_HYPER_SLOTS ? g->n_hyper : CUDA_HYPER_SLOTS; }
/* cuda_attention.c: the device source of flash attention, instantiated by generated kernels. */
extern const char CUDA_ATTENTION_SOURCE[];
/* cuda_products.c: our kernel for small f32 products, a template (in the prelude), and its
 * instances by transposes ta * 2 + tb, tg_gemm_nn, _nt, _tn and _tt (after the generated kernels,
 * those the graph's products use). */
extern const char CUDA_PRODUCT_SOURCE[];
extern const char *const CUDA_PRODUCT_NAMES[4], *const CUDA_PRODUCT_KERNELS[4];
/* Small enough for it: at most 2^27 multiply-adds (a batch of them in one launch), none of M, N
 * and the batch empty (a grid of no blocks is no launch). */
bool cuda_own_product(int64_t M, int64_t N, int64_t K, int64_t batch);
/* Our kernel for f32 products as three TF32 products (f32 graphs), a template (in the prelude)
 * and its instances tg_gemm3_nn, _nt, _tn and _tt, appended as the small kernel's are; the shapes
 * it takes (M, N and K multiples of 4: float4 loads). */
extern const char CUDA_PRODUCT3_SOURCE[];
extern const char *const CUDA_PRODUCT3_NAMES[4], *const CUDA_PRODUCT3_KERNELS[4];
#define CUDA_PRODUCT3_SUM "tg_gemm3_sum"   /* in CUDA_PRODUCT3_SOURCE: adds a split reduction's parts */
bool cuda_x3_product(int64_t M, int64_t N, int64_t K, int64_t batch);
/* The tensor-core kernels (bf16 and tf32, cuda_attention_mma), after CUDA_ATTENTION_SOURCE. */
extern const char CUDA_ATTENTION_MMA_SOURCE[];
/* Their bf16 forms for heads of 64 on Hopper's warpgroup MMAs (sm_90, compiled as sm_90a), after both. */
extern const char CUDA_ATTENTION_WG_SOURCE[];
/* The CUDA generator's refinement of fuse_schedule: a sum that only another sum reads, over an
 * adjacent axis, gets no kernel of its own (the reader sums over both axes at once, as the
 * gradient of a broadcast bias does over batch and time). */
void cuda_refine(const tg_graph *g, const int *keep, int n_keep, bool *materialized);
/* bf16 graphs: each product plus its addend (graph_product_addend) as one product of three
 * sources (the third the addend), which cuBLASLt computes with its bias epilogue (the bias's bf16
 * copy) or with beta = 1 (a bf16 value of C's shape), added before the one rounding, instead of a
 * kernel adding it after the product. Only where cuBLAS would run the product (not computed
 * inline: `inline_small`, FUSE_SMALL_REDUCTIONS), over one batch, not kept, with a leaf for a bias,
 * and where the sum's readers take it as a bf16 value. Returns a copy of g with those adds
 * rewritten (the products they read are then dead), the same node ids; NULL where there is none
 * or memory runs out (g as it is is as valid). cuda_fold_free frees the copy. */
tg_graph *cuda_fold_addends(const tg_graph *g, const int *keep, int n_keep, bool inline_small);
void cuda_fold_free(tg_graph *f);
/* Consecutive pointwise nodes and sums, which the generator may put into one kernel: per node,
 * the last node of its run (plan_build's live_until), -1 outside runs. */
void cuda_kernel_runs(const tg_graph *g, const bool *materialized, const int *alias, int *live_until);
/* Per node, the step whose kernel computes it (plan_build's `born`): its own, or for a column sum
 * (and the pointwise node it sums) further on that sums as many rows of as many columns, the
 * step of an earlier such sum, whose kernel then computes both (sum_kernel). */
void cuda_sums_early(const tg_graph *g, const bool *materialized, const int *alias, int *born);
/* tf32 and bf16: the nodes whose rounded copies the products read (plan_shadows' `want`): the
 * homes (alias: fuse_schedule's) of product operands that a pointwise or row kernel computes,
 * and leaves, and at bf16 every operand of attention on tensor cores (cuda_attention_mma) on a
 * device of compute capability sm (at tf32 it rounds them as it loads them); `only`: those of
 * them that nothing but products and such attention reads, and whose kernel writes the copy,
 * which need no f32 buffer (plan_build's `unplaced`); `want_t`: leaf matrices that a product
 * reads transposed from a copy of their own (plan_shadows' `want_t`, matmul_launch). */
void cuda_shadow_wanted(const tg_graph *g, int sm, const bool *materialized, const int *alias, const int *keep, int n_keep,
                        bool *want, bool *want_t, bool *only);
/* Does attention node id run on tensor cores (sm >= 80; bf16 with head sizes multiples of 16, tf32
 * and f32 (three tf32 products) multiples of 8)? */
bool cuda_attention_mma(const tg_graph *g, int id, int sm);
/* For a device of compute capability sm (90: 9.0). inplace_ok (NULL: none): plan_inplace's
 * candidates, where every gradient has a buffer for kcheck to read; each pointwise kernel whose
 * roots all are replaces their leaves in place. NULL when memory runs out, or with *unsupported
 * set to a node without a CUDA kernel (else -1). */
char *codegen_cuda(const tg_graph *g, const bool *materialized, const tg_plan *plan, const int *inplace_ok, cuda_plan *launches,
                   int sm, int *unsupported);
void cuda_plan_free(cuda_plan *p);


#endif
