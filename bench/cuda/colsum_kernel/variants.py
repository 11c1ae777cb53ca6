"""Edited copies of one generated column-sum kernel (a GELU backward with its bias gradient,
char_gpt's k650 at tf32), to time alone with harness.cu:
    python3 variants.py DUMP KERNEL GRID_X GRID_Y THREADS out.cu
V0 as generated; V1, V2 its loop unrolled 4 and 2 deep (not 8); V3 gelu_grad left out (what
the erf and exp cost); and a copy that reads the kernel's two inputs and writes one (the floor).
The GELU through Mills ratio and a thread's sums in float (the thirty-first session's two further
variants, bench/logs/gpu_h200_s34_b_*) are the library's from 38c6721 on: V0 of a dump of the code
before it against V0 of one after."""
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
offs = [int(x) for x in re.findall(r'A \+ (\d+)', k)]
open(sys.argv[6], 'w').write(dump.prelude(src) + '\n'.join(ks) +
    '\n#define ARENA %dll\n#define GX %s\n#define GY %s\n#define THREADS %s\n#include "harness.cu"\n' % (max(offs) + (1 << 26), gx, gy, threads))
