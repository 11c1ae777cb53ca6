"""Writes wgmma_ops.h: wgmma m64nNk16 (bf16 in, f32 accumulators, both operands K-major in shared memory) for
N = 128 and 256, and the asm barrier that keeps the accumulators in place, for gemm_gelu.cu.
    python3 gen_wgmma.py"""
out = ["/* written by gen_wgmma.py: wgmma m64nNk16 wrappers for gemm_gelu.cu */"]
for N in (128, 256):
    R = N // 2
    regs = ", ".join("%%%d" % i for i in range(R))
    outs = ", ".join('"+f"(d[%d])' % i for i in range(R))
    out.append("static __device__ __forceinline__ void wg_n%d(float *d, unsigned long long a, unsigned long long b, int acc) {" % N)
    out.append('    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n"' % (R + 2))
    out.append('                 "wgmma.mma_async.sync.aligned.m64n%dk16.f32.bf16.bf16 {%s}, %%%d, %%%d, p, 1, 1, 0, 0;\\n}\\n"' % (N, regs, R, R + 1))
    out.append('                 : %s' % outs)
    out.append('                 : "l"(a), "l"(b), "r"(acc));')
    out.append("}")
    out.append("static __device__ __forceinline__ void wg_keep%d(float *d) {" % N)
    out.append("#pragma unroll")
    out.append('    for (int i = 0; i < %d; i++) asm volatile("" : "+f"(d[i])::"memory");' % R)
    out.append("}")
open(__file__.rsplit('/', 1)[0] + "/wgmma_ops.h" if '/' in __file__ else "wgmma_ops.h", "w").write("\n".join(out) + "\n")
