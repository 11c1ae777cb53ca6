/* The compiled CPU backend: its C code generator and the library kernels generated code calls. */
#ifndef TG_CPU_H
#define TG_CPU_H

#include "compile/compile.h"

/* cpu_codegen.c: the C source of a scheduled, planned graph (entry point tg_entry); the caller
 * frees it. Pointwise kernels of fewer than parallel_min elements run on one thread. */
char *codegen_c(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min);
/* The CPU backend's refinements of fuse.c's schedule (products absorb their bias add and sums,
 * optimizer updates write parameters in place: inplace[i] is the leaf node i's kernel writes,
 * or -1), and the C source of the refined schedule. */
void codegen_c_refine(const tg_graph *g, const int *keep, int n_keep, bool *materialized, int *alias, int *inplace);
char *codegen_c_inplace(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min,
                        const int *inplace);
/* The same kernels as one self-contained C file for tg_export_c (src/export/): library kernels
 * called by name (tgk_matmul, ...) instead of through the R table, the entry point tg_entry
 * static. For forward graphs (no in-place write-backs). */
char *codegen_c_standalone(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min);
/* Pointwise ops of fewer elements than this run on one thread: an OpenMP fork and join costs
 * about 3 us here, what a memory-bound pass over ~100K floats saves on a second core. */
#define CPU_PARALLEL_MIN 131072

/* cpu_kernels.c: the library kernels generated C calls, indexed by its TGK_* ids; threads. */
extern void *const cpu_kernels[];
/* Whether a kernel failed to get scratch memory since the last call (then clears it). */
bool cpu_kernels_failed(void);
void cpu_set_threads(int n);
void cpu_blas_single_threaded(void);
/* On: the CPU library kernels take their portable paths even where AVX-512 ones exist (tests). */
void cpu_kernels_portable(bool on);
/* cpu_backend.c, for tests: the library-kernel table generated code runs with (indexed by TGK_*),
 * e.g. export_kernels (src/export/) to test the exported files' kernels on every op; NULL
 * restores cpu_kernels. Applies to the runs that follow. */
void cpu_set_kernel_table(void *const *table);

#endif
