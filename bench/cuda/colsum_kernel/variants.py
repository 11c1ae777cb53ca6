"""Edited copies of one generated column-sum kernel (a GELU backward with its bias gradient,
char_gpt's k650 at tf32), to time alone with harness.cu:
    python3 variants.py DUMP KERNEL GRID_X GRID_Y THREADS out.cu
V0 as generated; V1, V2 its loop unrolled 4 and 2 deep (not 8); V3 gelu_grad left out (what
the erf and exp cost); and a copy that reads the kernel's two inputs and writes one (the floor)."""
import re, sys
sys.path.insert(0, __file__.rsplit('/', 2)[0])
import dump

src, name = open(sys.argv[1]).read(), sys.argv[2]
gx, gy, threads = sys.argv[3], sys.argv[4], sys.argv[5]
k = dump.kernels(src, name)[0]
ks = [k.replace(name + '(', 'v0('),
      k.replace(name + '(', 'v1(').replace('#pragma unroll 8', '#pragma unroll 4'),
      k.replace(name + '(', 'v2(').replace('#pragma unroll 8', '#pragma unroll 2'),
      re.sub(r'tgk_gelu_grad\(([^)]*)\)', r'(\1)', k.replace(name + '(', 'v3('))]
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
open(sys.argv[6], 'w').write('#include <stdint.h>\n' + text + '\n'.join(ks) +
    '\n#define ARENA %dll\n#define GX %s\n#define GY %s\n#define THREADS %s\n#include "harness.cu"\n' % (max(offs) + (1 << 26), gx, gy, threads))
