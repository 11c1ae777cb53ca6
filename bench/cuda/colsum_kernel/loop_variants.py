"""Edited copies of one generated column-sum kernel's row loop, to time alone with harness.cu:
    python3 loop_variants.py DUMP KERNEL GRID_X GRID_Y THREADS out.cu
V0 as generated (unroll 8, each row tested against the chunk's end); V1 without the test (every
chunk taken as whole: wrong for the last, for timing only); V2 unrolled whole; V3 both. Asks
whether the test in the loop keeps the loads of several rows from being in flight at once
(char_gpt bf16's k605, G = [dq dk dv] with its column sums: latency-bound on its loads, 50% of
DRAM's bandwidth alone, bench/logs/gpu_h200_s41_i_*): it does not (bench/logs/gpu_h200_s41_j_*)."""
import re, sys
sys.path.insert(0, __file__.rsplit('/', 2)[0])
import dump

src, name = open(sys.argv[1]).read(), sys.argv[2]
gx, gy, threads = sys.argv[3], sys.argv[4], sys.argv[5]
k = dump.kernels(src, name)[0]
test = re.search(r'\n\s*if \(k >= k1\) continue;', k).group(0)
v = [k.replace(name + '(', 'v%d(' % i) for i in range(4)]
ks = [v[0], v[1].replace(test, ''), v[2].replace('#pragma unroll 8', '#pragma unroll'),
      v[3].replace(test, '').replace('#pragma unroll 8', '#pragma unroll')]
what = '{ "as generated (unroll 8)", "no test of the row", "unrolled whole", "both" }'
offs = [int(x) for x in re.findall(r'A \+ (\d+)', k)]
open(sys.argv[6], 'w').write(dump.prelude(src) + '\n'.join(ks) +
    '\n#define ARENA %dll\n#define GX %s\n#define GY %s\n#define THREADS %s\n#define WHAT %s\n#include "harness.cu"\n'
    % (max(offs) + (1 << 26), gx, gy, threads, what))
