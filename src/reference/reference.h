/* The reference interpreter, the oracle every other backend is tested against. */
#ifndef TG_REFERENCE_H
#define TG_REFERENCE_H

#include "compile/compile.h"

/* interp.c: the reference interpreter. Every value is a double; with round_f32 set, each
 * f32 node's result is rounded to float after its kernel, so it computes what an f32 machine
 * does (up to accumulation order) and, unset, runs the same graph in double precision for
 * gradient checks. A bf16 graph's activations (graph_bf16_values) are rounded to bf16 either
 * way. */
typedef struct ref_exec ref_exec;
ref_exec *ref_exec_new(const tg_graph *g, const tg_plan *plan, bool round_f32);   /* NULL: out of memory */
void ref_exec_bind(ref_exec *e, int node, double *storage);   /* for INPUT/PARAM/STATE leaves */
void ref_exec_run(ref_exec *e, const double *hyper);          /* every non-leaf node in order */
double *ref_exec_value(ref_exec *e, int node);
void ref_exec_free(ref_exec *e);
/* One node's kernel: reads bufs[src], writes bufs[id]. */
void ref_eval_node(const tg_graph *g, int id, double *const *bufs, const double *hyper);

#endif
