/* The export's portable kernels (portable_kernels.h) compiled into the library, every one of
 * them, as a table in the order of the generated code's TGK_* ids: tests hand it to the CPU
 * backend (cpu_set_kernel_table) so that the kernels every exported file carries run on every
 * op, forward and backward, against the reference interpreter. */
#include "export/export.h"

#define TGK_USE_MATMUL
#define TGK_USE_SOFTMAX
#define TGK_USE_SOFTMAX_CAUSAL
#define TGK_USE_ARGMAX
#define TGK_USE_SCATTER_ROWS
#define TGK_USE_SCATTER_ALONG
#define TGK_USE_COL2IM
#define TGK_USE_MAXPOOL
#define TGK_USE_MAXPOOL_BWD
#define TGK_USE_ATTENTION
#define TGK_USE_ATTENTION_BWD
#include "export/portable_kernels.h"

/* TGK_FAILED: these kernels need no scratch memory, so they never fail. */
static int tgk_failed(void) { return 0; }

void *const export_kernels[] = {
    (void *)tgk_matmul, (void *)tgk_softmax, (void *)tgk_softmax_causal, (void *)tgk_argmax, (void *)tgk_scatter_rows,
    (void *)tgk_scatter_along, (void *)tgk_col2im, (void *)tgk_maxpool, (void *)tgk_maxpool_bwd, (void *)tgk_failed,
    (void *)tgk_attention, (void *)tgk_attention_bwd,
};
