/* Every internal header at once, for the tests that reach inside the library (they build with
 * -Isrc). The library's own files include only the stage headers they use. */
#ifndef TG_INTERNAL_H
#define TG_INTERNAL_H

#include "util/util.h"
#include "graph/graph.h"
#include "compile/compile.h"
#include "reference/reference.h"
#include "cpu/cpu.h"
#include "cuda/cuda.h"
#include "export/export.h"
#include "runtime/backend.h"
#include "runtime/probe.h"
#include "io/cache.h"

#endif
