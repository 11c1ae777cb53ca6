/* The portable C the exported files carry, as text: portable_kernels.h and portable_loader.h
 * turned into string literals by the Makefile (build/gen/export/NAME.inc), so that the files
 * compiled and tested in the tree are the ones embedded, with no copy to drift. */
#include "export/export.h"

const char export_kernels_text[] =
#include "export/portable_kernels.inc"
    ;

const char export_loader_text[] =
#include "export/portable_loader.inc"
    ;
