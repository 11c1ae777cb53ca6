/* Exporting a forward as one dependency-free C file (tg_export_c): internal pieces shared by the
 * files of src/export/ and the tests. export.c checks the call, traces the forward and schedules
 * it as the CPU backend does; emit.c writes the file around the CPU generator's standalone
 * output; tidy.c makes that output compile warning-free on its own; portable_kernels.h and
 * portable_loader.h are C99 text embedded in every exported file. Nothing here is public API. */
#ifndef TG_EXPORT_H
#define TG_EXPORT_H

#include "compile/compile.h"

/* export_kernels.c: portable_kernels.h compiled whole, indexed by the generated code's TGK_* ids
 * (for cpu_set_kernel_table). */
extern void *const export_kernels[];

/* export_text.c: the text of portable_kernels.h and portable_loader.h (build/gen/export/). */
extern const char export_kernels_text[];
extern const char export_loader_text[];

/* A forward ready to write out: its graph scheduled and planned as the CPU backend does, the
 * standalone kernel source, and the values of the parameters it reads. */
typedef struct {
    const tg_graph *g;
    const tg_plan *plan;
    const char *kernels;          /* codegen_c_standalone's output, tidied */
    float **values;               /* per model param id: its values, or NULL when the graph does not read it */
    const char *prefix;           /* a C identifier */
    bool external;                /* weights read at <prefix>_init(path) rather than embedded */
    bool openmp;                  /* OpenMP pragmas kept */
} export_model;

/* emit.c: the C file and its header, as text (NULL when memory runs out). */
char *export_source(const export_model *m);
char *export_header(const export_model *m);

/* tidy.c: generated C made to compile with -std=c99 -Wall -Wextra -Werror and no OpenMP:
 * definitions of temporaries and pointers that nothing reads are removed (their expressions are
 * pure), helpers that nothing calls too, and, unless keep_omp, every "#pragma omp" line. A new
 * string (NULL: out of memory). */
char *export_tidy(const char *source, bool keep_omp);

#endif
