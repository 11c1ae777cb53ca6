/* The main of attention.py's harness: char_gpt's bf16 (or, with TF32, tf32) causal attention (a batch of 64, T = 256, 6
 * heads of 64, interleaved as the model's splits leave them) forward, and backward with dq's
 * zeroing, each timed as the best of 5 rounds of `reps` launches; then every output checked on
 * four heads against a reference in double precision from the same bf16 operands (the worst
 * |error| / max(1, |value|), as test_backend measures attention). Not part of the build. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
static const int NB = 64, NH = 6, T = 256, D = 64, BH = NB * NH;
#ifdef TF32   /* tf32 kernels (attention.py harness DUMP OUT tf32): operands in f32, given with tf32's mantissa */
typedef float elem;
static elem bf(float x) { unsigned u; memcpy(&u, &x, 4); u = (u + 0x1000) & 0xffffe000u; memcpy(&x, &u, 4); return x; }
static float fb(elem x) { return x; }
#else
typedef unsigned short elem;
static elem bf(float x) { unsigned u; memcpy(&u, &x, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static float fb(elem h) { unsigned u = (unsigned)h << 16; float x; memcpy(&x, &u, 4); return x; }
#endif
static size_t at(int b, int t, int d) { return (((size_t)(b / NH) * T + t) * NH + b % NH) * D + d; }
int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 50;
    const size_t n = (size_t)NB * T * NH * D, h = n * sizeof(elem) / 4;   /* floats: f32 tensor, operand tensor */
    size_t off = 0;
    auto take = [&](size_t k) { size_t o = off; off += (k + 63) / 64 * 64; return (long long)o; };
    long long q = take(h), k = take(h), v = take(h), g = take(h), o = take(n), os = take(h), lse = take((size_t)BH * T),
              dq = take(n), dk = take(n), dv = take(n), dks = take(h), dvs = take(h);
    float *A; CK(cudaMalloc(&A, off * 4));
    std::vector<elem> hq(n), hk(n), hv(n), hg(n);
    srand(1);
    auto gs = [] { double u = (rand() + 1.0) / (RAND_MAX + 2.0), w = (rand() + 1.0) / (RAND_MAX + 2.0); return (float)(sqrt(-2 * log(u)) * cos(6.283185307 * w)); };
    for (size_t i = 0; i < n; i++) { hq[i] = bf(gs()); hk[i] = bf(gs()); hv[i] = bf(gs()); hg[i] = bf(gs()); }
    CK(cudaMemcpy(A + q, hq.data(), n * sizeof(elem), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(A + k, hk.data(), n * sizeof(elem), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(A + v, hv.data(), n * sizeof(elem), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(A + g, hg.data(), n * sizeof(elem), cudaMemcpyHostToDevice));
    tga_args fa = {}, ba = {};
    for (int i = 0; i < 11; i++) fa.at[i] = ba.at[i] = -1;
    fa.at[0] = q; fa.at[1] = k; fa.at[2] = v; fa.at[3] = o; fa.at[4] = lse; fa.at[5] = os; fa.scale = 0.125f * 1.4426950408889634f;
    ba.at[0] = q; ba.at[1] = k; ba.at[2] = v; ba.at[3] = o; ba.at[4] = g; ba.at[5] = lse; ba.at[6] = dq; ba.at[7] = dk; ba.at[8] = dv;
    ba.at[9] = dks; ba.at[10] = dvs; ba.scale = 0.125f;
#ifdef BWD_OB   /* a backward that reads the output's bf16 copy (attention.py: a kernel name ending _ob) */
    ba.at[3] = os;
#endif
    const int fsm = FWD_SMEM, bsm = BWD_SMEM;
    CK(cudaFuncSetAttribute(ATTN_FWD, cudaFuncAttributeMaxDynamicSharedMemorySize, fsm));
    CK(cudaFuncSetAttribute(ATTN_BWD, cudaFuncAttributeMaxDynamicSharedMemorySize, bsm));
    auto fwd = [&] { ATTN_FWD<<<BH * FWD_TILES, FWD_THREADS, fsm>>>(A, nullptr, nullptr, fa); };
    auto bwd = [&] {
#ifndef NOMEMSET   /* -DNOMEMSET: the backward alone (dq then wrong) */
        cudaMemsetAsync(A + dq, 0, n * 4);
#endif
#ifdef BWD_PRE   /* a variant's kernel that runs before the backward (variants.py) */
        BWD_PRE;
#endif
        ATTN_BWD<<<BH * BWD_TILES, BWD_THREADS, bsm>>>(A, nullptr, nullptr, ba);
    };
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    float best[2] = { 1e9f, 1e9f };
    for (int round = 0; round < 5; round++)
        for (int w = 0; w < 2; w++) {
            for (int i = 0; i < 3; i++) w ? bwd() : fwd();
            cudaEventRecord(e0);
            for (int i = 0; i < reps; i++) w ? bwd() : fwd();
            cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1);
            if (ms / reps < best[w]) best[w] = ms / reps;
        }
    CK(cudaGetLastError());
    fwd(); bwd(); CK(cudaDeviceSynchronize());
    {   /* dq is added up in memory as blocks arrive: how many of 100 more backwards give other bits than this one */
        std::vector<float> a(n), b(n);
        CK(cudaMemcpy(a.data(), A + dq, n * 4, cudaMemcpyDeviceToHost));
        int differ = 0;
        for (int i = 0; i < 100; i++) {
            bwd();
            CK(cudaMemcpy(b.data(), A + dq, n * 4, cudaMemcpyDeviceToHost));
            differ += memcmp(a.data(), b.data(), n * 4) != 0;
        }
        printf("%s: %d of 100 backwards' dq differ in some bit from the first's\n", VARIANT, differ);
        fwd(); bwd(); CK(cudaDeviceSynchronize());
    }
    std::vector<float> ho(n), hl((size_t)BH * T), hdq(n), hdk(n), hdv(n);
    CK(cudaMemcpy(ho.data(), A + o, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl.data(), A + lse, hl.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdq.data(), A + dq, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdk.data(), A + dk, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hdv.data(), A + dv, n * 4, cudaMemcpyDeviceToHost));
    double worst[5] = { 0 };   /* out, lse, dq, dk, dv: |err| / max(1, |ref|) */
    const int heads[] = { 0, 7, 200, BH - 1 };
    for (int b : heads) {
        std::vector<double> P((size_t)T * T), dP((size_t)T * T), L(T), ro((size_t)T * D), delta(T);
        for (int r = 0; r < T; r++) {
            double m = -1e300;
            for (int c = 0; c <= r; c++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)fb(hq[at(b, r, d)]) * fb(hk[at(b, c, d)]);
                P[(size_t)r * T + c] = s * 0.125; m = fmax(m, s * 0.125);
            }
            double l = 0;
            for (int c = 0; c <= r; c++) l += exp(P[(size_t)r * T + c] - m);
            L[r] = m + log(l);
            for (int c = 0; c <= r; c++) P[(size_t)r * T + c] = exp(P[(size_t)r * T + c] - L[r]);
            for (int d = 0; d < D; d++) {
                double s = 0;
                for (int c = 0; c <= r; c++) s += P[(size_t)r * T + c] * fb(hv[at(b, c, d)]);
                ro[(size_t)r * D + d] = s;
                worst[0] = fmax(worst[0], fabs(s - ho[at(b, r, d)]) / fmax(1, fabs(s)));
            }
            worst[1] = fmax(worst[1], fabs(L[r] - hl[(size_t)b * T + r]) / fmax(1, fabs(L[r])));
            double dl = 0;
            for (int d = 0; d < D; d++) dl += (double)fb(hg[at(b, r, d)]) * ho[at(b, r, d)];
            delta[r] = dl;
            for (int c = 0; c <= r; c++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)fb(hg[at(b, r, d)]) * fb(hv[at(b, c, d)]);
                dP[(size_t)r * T + c] = P[(size_t)r * T + c] * (s - dl) * 0.125;
            }
        }
        for (int r = 0; r < T; r++)
            for (int d = 0; d < D; d++) {
                double sq = 0, sk = 0, sv = 0;
                for (int c = 0; c <= r; c++) sq += dP[(size_t)r * T + c] * fb(hk[at(b, c, d)]);
                for (int x = r; x < T; x++) { sk += dP[(size_t)x * T + r] * fb(hq[at(b, x, d)]); sv += P[(size_t)x * T + r] * fb(hg[at(b, x, d)]); }
                worst[2] = fmax(worst[2], fabs(sq - hdq[at(b, r, d)]) / fmax(1, fabs(sq)));
                worst[3] = fmax(worst[3], fabs(sk - hdk[at(b, r, d)]) / fmax(1, fabs(sk)));
                worst[4] = fmax(worst[4], fabs(sv - hdv[at(b, r, d)]) / fmax(1, fabs(sv)));
            }
    }
    const double ff = 4.0 * BH * T * T * D / 2, bf_ = 10.0 * BH * T * T * D / 2;   /* causal: half the products */
    printf("%s fwd %.1f us (%.0f TFLOP/s)  bwd+memset %.1f us (%.0f TFLOP/s)  err out %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", VARIANT,
           best[0] * 1e3, ff / best[0] / 1e9, best[1] * 1e3, bf_ / best[1] / 1e9, worst[0], worst[1], worst[2], worst[3], worst[4]);
    return 0;
}
