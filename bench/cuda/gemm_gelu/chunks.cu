/* char_gpt bf16's MLP forward as a chain, fc1 = x W1 + b1 -> g = gelu(fc1) -> y = g W2 + b2 ([16384 x 384] x
 * [384 x 1536], then [16384 x 1536] x [1536 x 384]; cuBLASLt with the BIAS epilogue, each shape's best of the
 * heuristic's first 8, and the GELU kernel as generated), run one after another, against the rows cut into C chunks
 * pipelined over three streams (fc1 of chunk i+1 and fc2 of chunk i-1 beside the GELU of chunk i), in a CUDA graph.
 * Measured (H200, bench/logs/gpu_h200_s42_c_*): one after another 115-118 us, pipelined in 2, 4 or 8 chunks 122-142:
 * the products leave no room for the GELU beside them.
 * cd bench/cuda/gemm_gelu && nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 chunks.cu -o /tmp/chunks -lcublasLt */
#include "../epilogue/lt_harness.h"
#include <cstring>
#include <cstdint>

enum { M = 16384, D = 384, F = 1536 };

#include "gelu.h"

#include "lt_bias.h"

static void *ws2, *ws3;   /* the other streams' workspaces */

int main() {
    CK(cudaStreamCreate(&stream));
    LK(cublasLtCreate(&lt));
    CK(cudaMalloc(&workspace, WS)); CK(cudaMalloc(&ws2, WS)); CK(cudaMalloc(&ws3, WS));
    unsigned short *x, *w1, *w2, *b1, *b2, *h, *g, *y;
    CK(cudaMalloc(&x, (size_t)M * D * 2)); CK(cudaMalloc(&w1, (size_t)D * F * 2)); CK(cudaMalloc(&w2, (size_t)F * D * 2));
    CK(cudaMalloc(&b1, F * 2)); CK(cudaMalloc(&b2, D * 2));
    CK(cudaMalloc(&h, (size_t)M * F * 2)); CK(cudaMalloc(&g, (size_t)M * F * 2)); CK(cudaMalloc(&y, (size_t)M * D * 2));
    {
        std::vector<unsigned short> v((size_t)M * F);
        unsigned s = 1;
        for (auto &e : v) { s = s * 1664525u + 1013904223u; e = (unsigned short)(0x3c00 + ((s >> 16) & 0x3ff)) ^ (unsigned short)((s >> 31) << 15); }
        CK(cudaMemcpy(x, v.data(), (size_t)M * D * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w1, v.data() + 7, (size_t)D * F * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(w2, v.data() + 99, (size_t)D * F * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b1, v.data() + 5, F * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(b2, v.data() + 3, D * 2, cudaMemcpyHostToDevice));
    }
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t ev[64];
    for (auto &e : ev) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (int C : {1, 2, 4, 8}) {
        const int mc = M / C;
        product p1 = make(mc, F, D, b1), p2 = make(mc, D, F, b2);
        tune(p1, x, w1, h); tune(p2, g, w2, y);
        auto seq = [&] {
            for (int i = 0; i < C; i++) run(p1, p1.pick, x + (size_t)i * mc * D, w1, h + (size_t)i * mc * F, stream, workspace);
            gelu_kernel<<<M * F / 4096, 256, 0, stream>>>(h, g);
            for (int i = 0; i < C; i++) run(p2, p2.pick, g + (size_t)i * mc * F, w2, y + (size_t)i * mc * D, stream, workspace);
        };
        /* stream: fc1 chunks; s1: GELU of chunk i after its fc1; s2: fc2 of chunk i after its GELU; joined at the end */
        auto piped = [&] {
            CK(cudaEventRecord(ev[0], stream));
            CK(cudaStreamWaitEvent(s1, ev[0])); CK(cudaStreamWaitEvent(s2, ev[0]));
            for (int i = 0; i < C; i++) {
                run(p1, p1.pick, x + (size_t)i * mc * D, w1, h + (size_t)i * mc * F, stream, workspace);
                CK(cudaEventRecord(ev[1 + i], stream));
                CK(cudaStreamWaitEvent(s1, ev[1 + i]));
                gelu_kernel<<<mc * F / 4096, 256, 0, s1>>>(h + (size_t)i * mc * F, g + (size_t)i * mc * F);
                CK(cudaEventRecord(ev[20 + i], s1));
                CK(cudaStreamWaitEvent(s2, ev[20 + i]));
                run(p2, p2.pick, g + (size_t)i * mc * F, w2, y + (size_t)i * mc * D, s2, ws2);
            }
            CK(cudaEventRecord(ev[40], s1)); CK(cudaEventRecord(ev[41], s2));
            CK(cudaStreamWaitEvent(stream, ev[40])); CK(cudaStreamWaitEvent(stream, ev[41]));
        };
        for (int round = 0; round < 2; round++) {
            printf("chunks %d: fc1 chunk %6.2f us (algo %d), fc2 chunk %6.2f us (algo %d)\n", C,
                   1e3 * graph_ms(stream, [&] { run(p1, p1.pick, x, w1, h, stream, workspace); }), p1.pick,
                   1e3 * graph_ms(stream, [&] { run(p2, p2.pick, g, w2, y, stream, workspace); }), p2.pick);
            printf("chunks %d: one after another %7.2f us, pipelined %7.2f us\n", C, 1e3 * graph_ms(stream, seq), 1e3 * graph_ms(stream, piped));
        }
    }
    printf("GELU alone %7.2f us\n", 1e3 * graph_ms(stream, [&] { gelu_kernel<<<M * F / 4096, 256, 0, stream>>>(h, g); }));
    return 0;
}
