/* From a traced graph to what a compiled backend runs: the schedule (which nodes get memory)
 * and the liveness-based buffer plan. The shared expression engine is in expr.h. */
#ifndef TG_COMPILE_H
#define TG_COMPILE_H

#include "graph/graph.h"

/* plan.c: liveness-based buffer plan. Non-leaf nodes get an offset (in elements) into one arena;
 * leaves bound from outside (INPUT, PARAM, STATE) get PLAN_BOUND. `keep` lists nodes whose
 * values must survive to the end of the run (outputs, gradients, write-back sources). */
#define PLAN_BOUND ((size_t)-1)
/* The largest arena a plan accepts, in elements (2^60: its bytes still fit a size_t). */
#define PLAN_MAX_ARENA ((size_t)1 << 60)
typedef struct {
    size_t *offset;     /* per node */
    size_t arena;       /* elements */
    int *alias;         /* per node: the node whose buffer it shares (no kernel of its own), or -1 */
    int *last;          /* per node: the step (node index) of its buffer's last reader; n: kept */
    size_t *shadow;     /* NULL, or per node: the offset of its rounded copy (plan_shadows), or PLAN_BOUND */
    size_t *tshadow;    /* NULL, or per node: the offset of a leaf matrix's rounded copy transposed, or PLAN_BOUND */
    int *born;          /* NULL, or per node: the step its buffer is first written (plan_build's `born`) */
} tg_plan;
/* False (nothing allocated) when memory runs out or the arena would pass PLAN_MAX_ARENA.
 * `materialized` (NULL: every node) marks the nodes that get memory; the others are computed
 * inside the kernels that read them, so a buffer they read stays live until those kernels ran.
 * Nodes not materialized get PLAN_BOUND too. `alias` (NULL: none) names, per node, the node
 * whose buffer it shares; that buffer then stays live as long as either is read. `live_until`
 * (NULL: none): per node, a later node until whose kernel what it reads stays live (a generator
 * that runs several nodes in one kernel must not find their inputs overwritten by its outputs).
 * `unplaced` (NULL: none) marks computed nodes that get no buffer (PLAN_BOUND): their values
 * live only in their shadows (plan_shadows). `born` (NULL: none): per node, an earlier step at
 * which a kernel computes it ahead of its turn (a generator bringing work forward), its own
 * index otherwise; its buffer is then live from there. */
bool plan_build(const tg_graph *g, const int *keep, int n_keep, const bool *materialized, const int *alias,
                const int *live_until, const bool *unplaced, const int *born, tg_plan *out);
/* Rounded copies ("shadows") of the nodes marked in `want`, each numel * elem_bytes bytes, placed
 * after the arena (which grows to hold them) with lifetimes of their own: a leaf's from the start
 * (a kernel rounds the leaves first), any other node's from its own step, each to its node's
 * last reader. The kernel that computes a node writes its shadow beside it (tf32 and bf16
 * products read shadows instead of rounding their operands in a pass of their own). `want_t`
 * (NULL: none) marks leaf matrices [R, C] that also get a rounded copy transposed, [C, R]
 * (tshadow), as long-lived as their shadows. False when memory runs out or the arena would pass
 * PLAN_MAX_ARENA (p->shadow may be set: plan_free). */
bool plan_shadows(const tg_graph *g, tg_plan *p, const bool *want, const bool *want_t, int elem_bytes);
/* The node whose buffer holds node id's values (itself unless it is an alias). */
static inline int plan_home(const tg_plan *p, int id) { return p->alias && p->alias[id] >= 0 ? p->alias[id] : id; }
void plan_free(tg_plan *p);
/* In-place write-backs: per node, the PARAM or STATE leaf that write-back source's kernel may
 * write directly instead of a buffer of its own (-1: none). A source qualifies when it is an
 * element-wise node with a buffer of its own (materialized, no alias) after node `after`, the
 * only write-back of its leaf and the leaf's only write-back, not kept, its leaf read by no node
 * after it, and its expression reads the leaf only at the element it writes. The caller still
 * decides which kernels may do it (a failed step must change nothing). False (all -1) when
 * memory runs out. */
bool plan_inplace(const tg_graph *g, const int *keep, int n_keep, const bool *mat, const int *alias, int after, int *inplace);
/* Are all reads of `target` in node's expression (computed inline in root's kernel, root
 * evaluated at each flat index) at root's own index? `same`: node is evaluated at root's index. */
bool plan_reads_same_index(const tg_graph *g, const bool *mat, int root, int node, int target, bool same);

/* fuse.c: the scheduler of compiled backends. materialized[i] says whether node i gets memory
 * (computed by a kernel of its own) or is computed inside the kernels that read it; a node no
 * kept value or write-back depends on gets neither (it never runs). fuse = false materializes
 * every other node (the unfused schedule, for tests). `gpu` (FUSE_* flags) asks for what pays
 * where a launch costs more than the work (a GPU; on a CPU it only adds work):
 * FUSE_RECOMPUTE: a cheap value that several kernels read is computed in each of them instead;
 * FUSE_SMALL_REDUCTIONS: a small matrix product or sum (fuse_small_reduction) is computed
 * inside the kernels that read it, a few terms per element, instead of by cuBLAS or a kernel of
 * its own;
 * FUSE_SOFTMAX_INPUT: softmax and log-softmax compute their source's expression (once per pass
 * over a row: three times) rather than read it from memory. */
enum { FUSE_RECOMPUTE = 1, FUSE_SMALL_REDUCTIONS = 2, FUSE_SOFTMAX_INPUT = 4 };
bool fuse_pointwise(tg_op op);
/* Is node id a product or sum small enough to compute inline: few terms per element (each
 * element's are added by one thread), and, for a product, few multiply-adds in all? */
bool fuse_small_reduction(const tg_graph *g, int id);
/* alias[i] >= 0: node i (a reshape or identity of a buffer already in memory) shares the buffer
 * of node alias[i] and gets no kernel; -1 otherwise. */
void fuse_schedule(const tg_graph *g, const int *keep, int n_keep, bool fuse, unsigned gpu, bool *materialized,
                   int *alias);

#endif
