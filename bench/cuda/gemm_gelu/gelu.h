/* What gemm_gelu.cu and chunks.cu share: GELU as the library computes it (expr.c's tgk_gelu through tgk_mills), bf16
 * rounding, and the GELU kernel as generated for char_gpt (k76: 4 values a thread, a loop of 4). */
static __device__ __forceinline__ float rcp(float x) { return __fdividef(1.0f, x); }
static __device__ __forceinline__ float mills(float t) {
    const float tau = rcp(0.3f * t + 1.0f);
    float q = 1.092740696e-02f;
    q = q * tau - 1.163850255e-01f; q = q * tau + 4.497805909e-01f; q = q * tau - 8.233522760e-01f;
    q = q * tau + 7.202503516e-01f; q = q * tau - 3.506944595e-01f; q = q * tau + 3.054383037e-01f;
    q = q * tau + 1.783952242e-01f; q = q * tau + 2.795328280e-01f; q = q * tau + 2.993969248e-01f;
    return tau * (q * tau + 3.000242672e-01f);
}
static __device__ __forceinline__ float gelu(float x) {
    const float p = 0.39894228040143268f * exp2f(-0.72134752044448170f * x * x) * mills(fabsf(x));
    return x * (x > 0.0f ? 1.0f - p : p);
}
static __device__ __forceinline__ unsigned short rnd(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7f800000u) != 0x7f800000u) u = u + 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static __device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

__global__ void gelu_kernel(const unsigned short *h, unsigned short *g) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int64_t i = ((int64_t)blockIdx.x * 1024 + u * 256 + threadIdx.x) * 4;
        const uint2 v = *(const uint2 *)(h + i);
        const float a = __uint_as_float(v.x << 16), b = __uint_as_float(v.x & 0xffff0000u);
        const float c = __uint_as_float(v.y << 16), d = __uint_as_float(v.y & 0xffff0000u);
        *(uint2 *)(g + i) = make_uint2(rnd(gelu(a)) | (unsigned)rnd(gelu(b)) << 16, rnd(gelu(c)) | (unsigned)rnd(gelu(d)) << 16);
    }
}
