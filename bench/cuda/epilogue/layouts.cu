/* Which operand layouts cuBLASLt runs fastest at char_gpt's product shapes, per precision. Row-major
 * C[M, N] = op(A) op(B) over K; an operand is "K-major" when its rows run along K (A untransposed,
 * B transposed), the layout Hopper's warpgroup MMAs read TF32 from (bf16 they read either way).
 * The step's three products of a linear layer take: the forward X W (B = W: N-major), the input
 * gradient dY W^T (both K-major), the weight gradient X^T dY (both M/N-major). For each shape,
 * every combination of ta, tb, with a tiled transpose's time beside (what a copy of an operand in
 * the other layout costs). Each the best of the heuristic's first 8 (and first 32) algorithms, 20
 * launches in a CUDA graph, best of 5.
 * Not part of the build: nvcc -O3 -arch=sm_90 -o layouts bench/cuda/epilogue/layouts.cu -lcublasLt */
#include "lt_harness.h"

struct product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulHeuristicResult_t h[32];
    int n_algos;
};

/* as bgrad.cu's make: cuBLASLt's A is our B */
static product make(bool bf16, int M, int N, int K, int ta, int tb, int want) {
    product r;
    cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    LK(cublasLtMatmulDescCreate(&r.desc, bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
    cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LK(cublasLtMatmulDescSetAttribute(r.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    LK(cublasLtMatrixLayoutCreate(&r.a, t, tb ? K : N, tb ? N : K, tb ? K : N));
    LK(cublasLtMatrixLayoutCreate(&r.b, t, ta ? M : K, ta ? K : M, ta ? M : K));
    LK(cublasLtMatrixLayoutCreate(&r.c, CUDA_R_32F, N, M, N));
    r.n_algos = lt_algos(r.desc, r.a, r.b, r.c, want, r.h);
    return r;
}

static float best_of(const product &p, const void *A, const void *B, void *C) {
    float best = 1e30f;
    const float one = 1, zero = 0;
    for (int k = 0; k < p.n_algos; k++) {
        auto go = [&] {
            return cublasLtMatmul(lt, p.desc, &one, B, p.a, A, p.b, &zero, C, p.c, C, p.c, &p.h[k].algo, workspace, WS, stream);
        };
        if (go() != CUBLAS_STATUS_SUCCESS) continue;
        best = std::min(best, graph_ms(stream, [&] { go(); }, 5));
    }
    return best;
}

/* out[c, r] = in[r, c] for a row-major [R, C] f32 matrix, 32 x 32 tiles through shared memory */
__global__ void transpose(const float *in, float *out, int R, int C) {
    __shared__ float t[32][33];
    int c = blockIdx.x * 32 + threadIdx.x, r0 = blockIdx.y * 32;
    for (int y = threadIdx.y; y < 32; y += 8)
        if (r0 + y < R && c < C) t[y][threadIdx.x] = in[(size_t)(r0 + y) * C + c];
    __syncthreads();
    int r = r0 + threadIdx.x, c0 = blockIdx.x * 32;
    for (int y = threadIdx.y; y < 32; y += 8)
        if (c0 + y < C && r < R) out[(size_t)(c0 + y) * R + r] = t[threadIdx.x][y];
}

static void shape(bool bf16, const char *what, int M, int N, int K) {
    const size_t es = bf16 ? 2 : 4;
    void *A, *B, *C;
    CK(cudaMalloc(&A, (size_t)M * K * es));
    CK(cudaMalloc(&B, (size_t)K * N * es));
    CK(cudaMalloc(&C, (size_t)M * N * 4));
    CK(cudaMemset(A, 0x3c, (size_t)M * K * es));
    CK(cudaMemset(B, 0x3c, (size_t)K * N * es));
    printf("%-4s %-10s [%5d x %5d x %5d]", bf16 ? "bf16" : "tf32", what, M, N, K);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            product p8 = make(bf16, M, N, K, ta, tb, 8), p32 = make(bf16, M, N, K, ta, tb, 32);
            float t8 = best_of(p8, A, B, C), t32 = best_of(p32, A, B, C);
            printf(" | ta%d tb%d %.4f / %.4f ms %5.0f TF/s", ta, tb, t8, t32, 2e-9 * M * N * K / std::min(t8, t32));
        }
    if (!bf16) {
        float *T;
        CK(cudaMalloc(&T, (size_t)M * K * 4));
        dim3 g((K + 31) / 32, (M + 31) / 32), b(32, 8);
        float tt = graph_ms(stream, [&] { transpose<<<g, b, 0, stream>>>((const float *)A, T, M, K); }, 5);
        printf(" | transpose A [%d x %d] %.4f ms", M, K, tt);
        cudaFree(T);
    }
    printf("\n");
    fflush(stdout);
    cudaFree(A); cudaFree(B); cudaFree(C);
}

int main() {
    CK(cudaStreamCreate(&stream));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WS));
    const int R = 16384;
    static const int IO[][2] = { { 384, 384 }, { 384, 1536 }, { 1536, 384 }, { 384, 1152 } };
    for (int b = 0; b < 2; b++)
        for (auto &s : IO) {
            shape(b, "forward", R, s[1], s[0]);   /* Y[R, out] = X[R, in] W[in, out] */
            shape(b, "dW", s[0], s[1], R);        /* dW[in, out] = X^T dY over R */
        }
    return 0;
}
