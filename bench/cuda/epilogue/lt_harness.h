/* What the cuBLASLt harnesses of this folder share: their headers, stream, handle and workspace,
 * the error checks of the CUDA runtime (CK) and of cuBLASLt (LK, exiting with the status), and
 * the graph timer. */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { printf("%s:%d status %d\n", __FILE__, __LINE__, (int)s_); exit(1); } } while (0)
#include "../graph_ms.h"

/* what every harness's products run on: one stream, one handle, a 32 MB workspace */
static cudaStream_t stream;
static cublasLtHandle_t lt;
static void *workspace;
static const size_t WS = 32u << 20;

/* The heuristic's first `want` algorithms for a product of `desc` over layouts a, b and c (C and D
 * alike) within the workspace, into h; how many (0: none, or the call failed). */
static int lt_algos(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                    int want, cublasLtMatmulHeuristicResult_t *h) {
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS, sizeof WS));
    int n = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, want, h, &n) != CUBLAS_STATUS_SUCCESS) n = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    return n;
}
