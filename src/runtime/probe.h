/* A test hook: run any traced function on any backend, with gradients w.r.t. its inputs. */
#ifndef TG_PROBE_H
#define TG_PROBE_H

#include "graph/graph.h"

/* probe.c: for tests. Traces fn like tg_compile does, optionally adds gradients with respect to
 * every f32 input and every parameter the graph uses, and runs it on a backend: tg_probe_new on
 * the reference in double precision (round_f32 false) or emulated f32, tg_probe_new_on on any
 * backend by name. Values are exchanged as host doubles: fill the input and parameter arrays
 * (parameters start from the model's init), run, then read outputs and gradients. */
typedef struct tg_probe tg_probe;
tg_probe *tg_probe_new(tg_model *m, tg_forward_fn fn, const void *ctx, const tg_input_decl *inputs,
                       int n_inputs, bool grads, bool round_f32, tg_error *err);
/* tg_probe_new_at: on a backend at a precision (tg_probe_new_on: f32). */
tg_probe *tg_probe_new_at(const char *backend, tg_precision precision, tg_model *m, tg_forward_fn fn, const void *ctx,
                          const tg_input_decl *inputs, int n_inputs, bool grads, tg_error *err);
tg_probe *tg_probe_new_on(const char *backend, tg_model *m, tg_forward_fn fn, const void *ctx,
                          const tg_input_decl *inputs, int n_inputs, bool grads, tg_error *err);
double *tg_probe_input(tg_probe *p, int i);         /* numel doubles to fill before run */
double *tg_probe_param(tg_probe *p, int param_id);  /* NULL if the graph does not use it */
bool tg_probe_run(tg_probe *p);                     /* false if the backend failed */
void tg_probe_set_seed(tg_probe *p, uint64_t seed); /* for randn/dropout; default 0 */
const double *tg_probe_output(tg_probe *p);
tg_shape tg_probe_output_shape(tg_probe *p);
const double *tg_probe_input_grad(tg_probe *p, int i);        /* NULL for i32 inputs */
const double *tg_probe_param_grad(tg_probe *p, int param_id); /* NULL if unused */
const tg_graph *tg_probe_graph(tg_probe *p);
void tg_probe_free(tg_probe *p);

#endif
