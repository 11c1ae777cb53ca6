/* The expression engine shared by the code generators (cpu_codegen.c for the CPU, cuda_codegen.c
 * for CUDA). A kernel computes one materialized node; its loop body is a list of statements that
 * evaluate the node's inlined producers as temporaries. Each source is read at an index derived
 * from the output's (broadcast, permute, reshape, narrow, pad, gathers), so movement never copies.
 * The statements are plain C expressions over float/int32_t values, libm functions and the
 * prelude's helpers, valid C and valid CUDA alike; buffers are read as P<node>[index], which each
 * generator declares in its kernel wrapper. Internal to the code generators. */
#ifndef TG_CODEGEN_H
#define TG_CODEGEN_H

#include "compile/compile.h"

#define NAME 24

/* An index into a node: its flat position and/or its coordinates, as names of generated
 * variables or literals. */
typedef struct {
    bool has_flat, has_coords;
    char flat[NAME];
    char c[TG_MAX_DIMS][NAME];
} ix_t;

typedef struct { int node; char key[TG_MAX_DIMS * NAME + 8]; char name[NAME]; } memo_t;

typedef struct {
    const tg_graph *g;
    const bool *mat;
    const tg_plan *plan;
    strbuf *out;
    strbuf body;
    int root, ntmp;
    memo_t *memo;
    int n_memo, cap_memo;
    bool *used;          /* per node: read from memory by the current kernel */
    int parallel_min;    /* CPU: elements below which a kernel runs on one thread */
    const char *operand_round;   /* products computed inline: the function rounding each operand (NULL: none);
                                  * at bf16 also the activations' (else tgk_bf16r) */
    bool *bf16;          /* bf16 graphs: the activations rounded to bf16 (graph_bf16_values), else NULL */
    int unsupported;     /* a node the generator has no kernel or no buffer for (the source is void), or -1 */
    /* CUDA vector lanes (lanes 0: off): a thread computes `lanes` (2, 4 or 8) consecutive elements,
     * the first at flat index lane_base (a multiple of lanes), lane `lane` at index lane_ix. A
     * float buffer read at exactly lane_ix is loaded once for all lanes, as one vector at
     * lane_base (float4, or four bf16 in a uint2), the first time a lane reads it: one wide load
     * where there were `lanes` narrow ones. */
    int lanes, lane;
    char lane_base[NAME], lane_ix[NAME];
    struct { int node; char name[NAME]; } vec[32];
    int n_vec;
    /* CUDA row kernels (NULL: off): per node, whether its row elements live in a register array
     * R<node>[it * lanes + lane] of the kernel's unrolled loop (iteration `it`) instead of its
     * buffer. Read anywhere but at lane_ix, such a node sets regs_missed (the kernel is then
     * generated again without). */
    const bool *regs;
    bool regs_missed;
    /* CUDA row kernels (NULL: off): per node, -1 where the kernel writes it, else 1 once a lane's
     * vector of it at the row's own elements was read from X<node>[it], a register array the kernel
     * fills as each row starts (row_kernel: one wide load a vector, the passes over the row reading
     * registers), 0 before; row_in_regs: the registers a thread may still give such arrays, each
     * row_in_iters vectors. */
    signed char *row_in;
    int row_in_regs, row_in_iters;
    /* CUDA row kernels (NULL: off): per node, whether its value for the kernel's row is in the
     * variable V<node>, which every thread of the row holds (a row's sum or statistic that later
     * members read back: a register, not a store, a barrier and a load) */
    const bool *row_vals;
    /* CUDA: the arena the kernel being generated reads and writes, as spans [lo, hi) in floats from
     * its start, written or not, for its launch (cuda_codegen.c's io_node, kernel_launch): which
     * launches may run beside each other. io_bound: it writes a bound leaf (an update in place). */
    int64_t (*io)[3];
    int n_io, cap_io, io_root;
    bool io_bound;
    /* CUDA (NULL: off): per node, whether each value it stores is checked to be finite, a value
     * that is not setting the write-back flag, float at H + flag_slot (cuda_codegen.c's WB_MARK) */
    const bool *wb_check;
    int flag_slot;
    /* CUDA (NULL: off): per node, the PARAM or STATE leaf its kernel replaces in place (its values
     * are that leaf's buffer: cg_pointer), or -1; inplace_ok: which may (plan_inplace's
     * candidates); kcheck_out: the kernel that checks every gradient first (kcheck) is emitted;
     * checked: per parameter, its gradient checked by an earlier piece of it (kcheck0, kcheck1..);
     * aliased: the kernel being declared replaces leaves (cuda_codegen.c's replaced_by). */
    int *inplace;
    const int *inplace_ok;
    bool *checked;
    int n_check_pieces;
    bool kcheck_out, aliased;
    /* CUDA: a node whose rounded copy the sum copy_sum writes as it reads it (attention's dq: no
     * pass of its own), or -1; that sum's kernel sets copy_written once it did */
    int copy_by_sum, copy_sum;
    bool copy_written;
    /* CUDA: a sum over the batch that the scatter sum_scatter computes with its rows (a token and
     * a position embedding's gradients, one pass: cuda_codegen.c's scatter_taking_sum), or -1 */
    int scatter_sum, sum_scatter;
    /* CPU row runs (row 0: off): an element-wise loop nested as flat index i = o * row + u, u < row.
     * The coordinates of a value of that innermost size read at index i are u and functions of o
     * alone, which the compiler hoists out of the loop over u: a permuted or broadcast read is
     * then contiguous along u and vectorizes, where coordinates divided out of i per element did
     * not. row_used: a coordinate was found that way (else the flat loop does as well);
     * row_part: else the last axis of a read's coordinates that divides row (merging heads: a
     * head's width), 0 for none. */
    int64_t row, row_part;
    bool row_used;
    /* The names of that nesting where they are not i, o and u (empty: those): a CUDA row kernel's
     * lane reads element r * L + j + lane of row r (cuda_codegen.c's row_lane). */
    char row_ix[NAME], row_o[NAME], row_u[NAME];
} cg;


/* The check of a write-back source's value (cg.wb_check): value, flag slot, node. The comment
 * marks the node as checked in the source (cuda_codegen.c reads the marks back). */
#define WB_CHECK_LINE "if (!isfinite(%s)) *(float *)(H + %d) = NAN;   /* checks %d */"
#define WB_MARK "/* checks "

/* False when memory runs out (cg_release still frees what it got). */
bool cg_init(cg *c, const tg_graph *g, const bool *materialized, const tg_plan *plan, strbuf *out);
/* A new memo entry. When memory runs out it reuses the last one: the generator goes on, and its
 * output is discarded (see alloc_failures). */
memo_t *cg_memo_slot(cg *c);
/* Remembers that node id's value under key (an index expression) is the variable name; returns
 * the stored name. */
const char *cg_memo_add(cg *c, int id, const char *key, const char *name);
void cg_release(cg *c);
/* Start the kernel of node `root`: an empty body, nothing read yet. */
void cg_begin(cg *c, int root);
/* The name of a variable holding the root's value at flat index `flat` (computed, not loaded). */
const char *cg_root_value(cg *c, const char *flat);
/* Kernels with several outputs (one thread or loop per element index i): cg_root_line appends
 * "P<r>[i] = <r's value at i>;" and lets later outputs read r's value from the memo rather than
 * memory; cg_try_root does the same for one more output r, keeps it when fits(ctx) says the
 * kernel may have it (c->used then says what the kernel reads from memory), else takes it back
 * out and returns false. */
void cg_root_line(cg *c, int r);
/* A computed node without a buffer of its own (plan_build's `unplaced`): its kernel stores only
 * its shadow, and nothing reads P<id>. */
bool cg_unplaced(const cg *c, int id);
bool cg_try_root(cg *c, int r, bool (*fits)(void *ctx), void *ctx);
/* The same for any node: loaded from memory when materialized, computed when inlined. */
const char *cg_value(cg *c, int node, const char *flat);
/* A statement, and a fresh variable `name` of `type` holding an expression. */
void cg_line(cg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cg_def(cg *c, char *name, const char *prefix, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
const char *cg_ctype(const tg_node *n);        /* "float" or "int32_t" */
/* The CUDA vector type of `lanes` values loaded at once: 2 or 4 floats, or 2, 4 or 8 bf16 values packed */
const char *cg_vector_type(bool bf16, int lanes);
/* Declare P<id>, the pointer to node id's values: its arena slot or bound buffer, or those of the
 * node it aliases, or the leaf it replaces in place (cg.inplace); `restrict_kw` is the language's
 * spelling of restrict. */
void cg_pointer(cg *c, strbuf *decl, int id, bool out, const char *restrict_kw);
/* A MATMUL node as BLAS sees it: op(A) [M, K] x op(B) [K, N], `batch` products, aoff/boff the
 * element offsets of each product's A and B (broadcast batch dims step 0; the caller frees them).
 * With B shared and A untransposed, the batch folds into M: one product. */
typedef struct { int ta, tb; int64_t M, N, K, batch, *aoff, *boff; } cg_gemm;
cg_gemm cg_gemm_of(const tg_graph *g, int id);
/* A shape as [outer, len, inner] around `axis`. */
void cg_axis_split(tg_shape s, int axis, int64_t *outer, int64_t *len, int64_t *inner);
/* Does `node` read source k at its own flat index (an element depends only on the same element
 * of that source)? */
bool cg_same_index(const tg_graph *g, int node, int k);
/* Does the kernel of `root` read `target` from memory (directly or through inlined nodes)? */
bool cg_expr_reads(const cg *c, int root, int node, int target);
/* Row kernels: a sum along the last axis of an [R, L] source, and the kernels after it that work
 * row by row. cg_row_sum: [R, L] when node id is a materialized sum over the last axis of its
 * source (kept axes in front). cg_row_local: does `node` (evaluated in `state`: 0 element (r, j)
 * of an [R, L] value, 1 row r of an [R] value, -1 elsewhere) read `target` (an [R, L] or [R]
 * member of the row kernel) only within row r? */
bool cg_row_sum(const cg *c, int id, int64_t *R, int64_t *L);
bool cg_row_local(const cg *c, int root, int node, int target, int state, int64_t R, int64_t L);
/* An attention node's constants: {batch, T, S, D, E, causal, the bits of its double scale, the
 * heads interleaved in its operands (graph.h: iarg[3]; 0 none)}. */
void cg_attention_args(const tg_graph *g, int id, int64_t *a);
/* Does node next join node prev's attention kernel? ATTENTION_LSE right after its ATTENTION, or
 * the ATTENTION_BWD of another operand right after one of the same forward. */
bool cg_attention_joins(const tg_graph *g, int prev, int next);
bool cg_is_bound(tg_op op);                    /* INPUT, PARAM, STATE */
/* Flat indices are 32-bit unsigned where a kernel's elements fit, so that the divisions and
 * remainders by constants that turn them into coordinates are 32-bit (they vectorize in C, and
 * are a multiply-high instead of a long sequence in CUDA; a concatenation's, sums of pads, took
 * 77 us at 64 bits in char_gpt's step). A PAD offsets its coordinate in 64 bits, below zero
 * rather than wrapped. cg_index_type: "uint32_t" or "int64_t" for the flat index of root's
 * kernel over numel elements. cg_has_pad: is a PAD computed in the kernel of root (root -1:
 * node itself is read from memory if materialized)? */
bool cg_has_pad(const cg *c, int node, int root);
const char *cg_index_type(const cg *c, int root, int64_t numel);
const char *cg_flit(double v, char *buf);      /* a float literal, inf and NaN included */
/* The helpers generated expressions call (random numbers, GELU), each function declared with
 * `qualifier` ("static inline" in C, "static __device__ inline" in CUDA). */
void cg_prelude(strbuf *out, const char *qualifier);

#endif
