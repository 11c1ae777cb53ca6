/* The compiled CPU backend: its C code generator and the library kernels generated code calls. */
#ifndef TG_CPU_H
#define TG_CPU_H

#include "compile/compile.h"

/* cpu_codegen.c: the C source of a scheduled, planned graph (entry point tg_entry); the caller
 * frees it. Pointwise kernels of fewer than parallel_min elements run on one thread. NULL when
 * memory runs out, or with *unsupported set to a node that has no CPU kernel (else -1). */
char *codegen_c(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min, int *unsupported);
/* The CPU backend's refinements of fuse.c's schedule (products absorb their bias add and sums,
 * optimizer updates write parameters in place: inplace[i] is the leaf node i's kernel writes,
 * or -1), and the C source of the refined schedule; with `profile`, each call in the entry
 * followed by a mark (TGK_MARK: cpu_profile). */
void codegen_c_refine(const tg_graph *g, const int *keep, int n_keep, bool *materialized, int *alias, int *inplace);
char *codegen_c_inplace(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min,
                        const int *inplace, bool profile, int *unsupported);
/* The same kernels as one self-contained C file for tg_export_c (src/export/): library kernels
 * called by name (tgk_matmul, ...) instead of through the R table, the entry point tg_entry
 * static. For forward graphs (no in-place write-backs). */
char *codegen_c_standalone(const tg_graph *g, const bool *materialized, const tg_plan *plan, int parallel_min,
                           int *unsupported);
/* Pointwise ops of fewer elements than this run on one thread: an OpenMP fork and join costs
 * about 3 us here, what a memory-bound pass over ~100K floats saves on a second core. */
#define CPU_PARALLEL_MIN 131072

/* cpu_kernels.c: the library kernels generated C calls, indexed by its TGK_* ids; threads. */
extern void *const cpu_kernels[];
/* A profile of a graph's steps (TG_CPU_PROFILE=1): seconds[node] sums the time of the entry's
 * calls of each node, between the marks a profiled entry makes (TGK_MARK) while it is the
 * calling thread's (cpu_profile_begin; NULL ends it). */
typedef struct {
    double *seconds;
    double last;   /* the last mark's time */
    int runs;
} cpu_profile;
void cpu_profile_begin(cpu_profile *p);
/* Whether a kernel failed to get scratch memory since the last call (then clears it). */
bool cpu_kernels_failed(void);
void cpu_set_threads(int n);
void cpu_blas_single_threaded(void);

/* cpu_isa.c: the instruction set of the library kernels and the generated code, one choice. */
typedef enum { CPU_ISA_PORTABLE, CPU_ISA_AVX2, CPU_ISA_AVX512 } cpu_isa;
const char *cpu_isa_name(cpu_isa isa);
/* The compiler flags generated code is built with for isa ("" for portable). */
const char *cpu_isa_cflags(cpu_isa isa);
/* The best path this CPU runs; TG_CPU_ISA's choice, or the best (with a note on stderr when the
 * variable asks for one this CPU lacks). */
cpu_isa cpu_isa_best(void);
cpu_isa cpu_isa_choose(void);
/* The library kernels' path from now on (process-wide; each run selects its graph's), and the
 * current one. */
void cpu_kernels_select(cpu_isa isa);
cpu_isa cpu_kernels_isa(void);
/* Whether products of bf16 operands run on this CPU's bf16 dot-product instructions (AVX512-BF16's
 * vdpbf16ps: Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and later) on path isa: only
 * the AVX-512 path has them. The backend's bf16 precision needs this (else it runs f32). */
bool cpu_isa_bf16(cpu_isa isa);

/* cpu_attention.c: library kernels (TGK_ATTENTION, TGK_ATTENTION_BWD). */
void cpu_attention(const int64_t *a, void *const *p);
void cpu_attention_bwd(const int64_t *a, void *const *p);
/* cpu_backend.c, for tests: the library-kernel table generated code runs with (indexed by TGK_*),
 * e.g. export_kernels (src/export/) to test the exported files' kernels on every op; NULL
 * restores cpu_kernels. Applies to the runs that follow. */
void cpu_set_kernel_table(void *const *table);

/* Kernels run with denormal results flushed to zero and denormal inputs read as zero (the FTZ
 * and DAZ bits of x86's MXCSR; elsewhere nothing changes), as TensorFlow's CPU kernels do: a
 * denormal costs an Intel core about a hundred cycles an operation (sin_mlp's Adam update, its
 * squared gradients underflowing, took a quarter of the step). The mode belongs to a thread: each
 * sets it where it enters a kernel's OpenMP region (the backend on the calling thread around a
 * step) and puts its own back where it leaves, so a caller's threads keep theirs. The generated
 * code's regions do the same (cpu_codegen.c's prelude). */
#if defined(__x86_64__) && defined(__SSE__)
#include <xmmintrin.h>
static inline unsigned fp_flush_denormals(void) {
    const unsigned mode = _mm_getcsr();
    _mm_setcsr(mode | 0x8040u);
    return mode;
}
static inline void fp_restore(unsigned mode) { _mm_setcsr(mode); }
#else
static inline unsigned fp_flush_denormals(void) { return 0; }
static inline void fp_restore(unsigned mode) { (void)mode; }
#endif

#endif
