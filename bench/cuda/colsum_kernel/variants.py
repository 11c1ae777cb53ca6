"""Edited copies of one generated column-sum kernel (a GELU backward with its bias gradient,
char_gpt's k650 at tf32), to time alone with harness.cu:
    python3 variants.py DUMP KERNEL GRID_X GRID_Y THREADS out.cu
V0 as generated; V1, V2 its loop unrolled 4 and 2 deep (not 8); V3 gelu_grad left out (what
the erf and exp cost); V4 gelu_grad from the normal's density and Mills ratio (one exp, one
reciprocal, a polynomial: MILLS below); V5 V4 with each thread's sums in float, widened to double
once; and a copy that reads the kernel's two inputs and writes one (the floor)."""
import re, sys
sys.path.insert(0, __file__.rsplit('/', 2)[0])
import dump

src, name = open(sys.argv[1]).read(), sys.argv[2]
gx, gy, threads = sys.argv[3], sys.argv[4], sys.argv[5]
k = dump.kernels(src, name)[0]
ks = [k.replace(name + '(', 'v0('),
      k.replace(name + '(', 'v1(').replace('#pragma unroll 8', '#pragma unroll 4'),
      k.replace(name + '(', 'v2(').replace('#pragma unroll 8', '#pragma unroll 2'),
      re.sub(r'tgk_gelu_grad\(([^)]*)\)', r'(\1)', k.replace(name + '(', 'v3(')),
      k.replace(name + '(', 'v4(').replace('tgk_gelu_grad(', 'mills_gelu_grad('),
      re.sub(r'acc(\d) \+= ', r'facc\1 += ', k.replace(name + '(', 'v5(').replace('tgk_gelu_grad(', 'mills_gelu_grad(')
             .replace('double acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;', 'double acc0, acc1, acc2, acc3; float facc0 = 0, facc1 = 0, facc2 = 0, facc3 = 0;')
             .replace('    double *sums', '    acc0 = facc0, acc1 = facc1, acc2 = facc2, acc3 = facc3;\n    double *sums'))]
MILLS = """
/* (1 - Phi(t)) / phi(t) = tau Q(tau), tau = 1 / (1 + 0.3 t): Q fitted at Chebyshev nodes, t in [0, 14] */
static __device__ inline float mills(float t) {
    const float tau = __fdividef(1.0f, fmaf(0.3f, t, 1.0f));
    float q = 1.092740696e-02f;
    q = fmaf(q, tau, -1.163850255e-01f); q = fmaf(q, tau, 4.497805909e-01f); q = fmaf(q, tau, -8.233522760e-01f);
    q = fmaf(q, tau, 7.202503516e-01f); q = fmaf(q, tau, -3.506944595e-01f); q = fmaf(q, tau, 3.054383037e-01f);
    q = fmaf(q, tau, 1.783952242e-01f); q = fmaf(q, tau, 2.795328280e-01f); q = fmaf(q, tau, 2.993969248e-01f);
    q = fmaf(q, tau, 3.000242672e-01f);
    return tau * q;
}
static __device__ inline float mills_gelu_grad(float x) {
    const float t = fabsf(x), d = 0.39894228040143268f * exp2f(-0.72134752044448170f * x * x) * (mills(t) - t);
    return x > 0.0f ? 1.0f - d : d;
}
"""
# every generated kernel removed from the dump: the prelude, with the templates' kernels
pre, last = [], 0
for m in re.finditer(r'extern "C" __global__', src):
    if m.start() < last: continue
    pre.append(src[last:m.start()]); last = src.index('\n}\n', m.start()) + 3
pre.append(src[last:])
text = ''.join(pre)
for t in ['typedef long long int64_t;', 'typedef unsigned long long uint64_t;', 'typedef int int32_t;', 'typedef unsigned uint32_t;']:
    text = text.replace(t, '')
offs = [int(x) for x in re.findall(r'A \+ (\d+)', k)]
open(sys.argv[6], 'w').write('#include <stdint.h>\n' + text + MILLS + '\n'.join(ks) +
    '\n#define ARENA %dll\n#define GX %s\n#define GY %s\n#define THREADS %s\n#include "harness.cu"\n' % (max(offs) + (1 << 26), gx, gy, threads))
