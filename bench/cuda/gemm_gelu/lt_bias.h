/* What gemm_gelu.cu and chunks.cu share: a cuBLASLt product with the BIAS epilogue at bf16 (the heuristic's first 8,
 * the fastest of them picked by tune), run on a stream and workspace. Needs lt_harness.h. */
struct product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulHeuristicResult_t h[8];
    int n_algos, pick;
};
/* row-major C[m, n] = A[m, k] B[k, n] + bias (bf16) */
static product make(int m, int n, int k, const void *bias) {
    product r;
    LK(cublasLtMatmulDescCreate(&r.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op = CUBLAS_OP_N;
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    int32_t vt = CUDA_R_16BF;
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op, sizeof op));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op, sizeof op));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vt, sizeof vt));
    LK(cublasLtMatrixLayoutCreate(&r.a, CUDA_R_16BF, n, k, n));
    LK(cublasLtMatrixLayoutCreate(&r.b, CUDA_R_16BF, k, m, k));
    LK(cublasLtMatrixLayoutCreate(&r.c, CUDA_R_16BF, n, m, n));
    r.n_algos = lt_algos(r.desc, r.a, r.b, r.c, 8, r.h);
    r.pick = 0;
    return r;
}
static cublasStatus_t run(const product &p, int k, const void *A, const void *B, void *C, cudaStream_t s, void *w) {
    const float one = 1, zero = 0;
    return cublasLtMatmul(lt, p.desc, &one, B, p.a, A, p.b, &zero, C, p.c, C, p.c, &p.h[k].algo, w, WS, s);
}
static void tune(product &p, const void *A, const void *B, void *C) {
    float best = 1e30f;
    for (int k = 0; k < p.n_algos; k++) {
        if (run(p, k, A, B, C, stream, workspace) != CUBLAS_STATUS_SUCCESS) continue;
        float t = graph_ms(stream, [&] { run(p, k, A, B, C, stream, workspace); }, 5);
        if (t < best) best = t, p.pick = k;
    }
}
