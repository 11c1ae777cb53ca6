/* The floor the row kernels' harnesses (harness.cu, pipelined.py) time beside them: a copy reading n16_in and
 * writing n16_out pieces of 16 bytes. */
__global__ void floor_copy(const uint4 *in, uint4 *out, long long n16_in, long long n16_out) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x, step = (long long)gridDim.x * blockDim.x;
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (long long k = i; k < n16_in; k += step) { uint4 v = in[k]; acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w; }
    for (long long k = i; k < n16_out; k += step) out[k] = acc;
}
