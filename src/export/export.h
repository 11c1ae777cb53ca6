/* Exporting a forward as one dependency-free C file: internal pieces shared by the files of
 * src/export/ and the tests. portable_kernels.h holds the library kernels exported files carry.
 * Nothing here is public API. */
#ifndef TG_EXPORT_H
#define TG_EXPORT_H

#include "compile/compile.h"

/* export_kernels.c: portable_kernels.h compiled whole, indexed by the generated code's TGK_* ids
 * (for cpu_set_kernel_table). */
extern void *const export_kernels[];

#endif
