"""(For dumps before the thirty-ninth session, whose row kernels finished their column sums themselves, tgk_rows_finish.)
A row kernel (a warp a row, e.g. a layer norm's backward with its column sums: char_gpt bf16's k1094)
timed alone with harness.cu, as generated and with the next rows' lines prefetched:
    python3 variants.py DUMP KERNEL out.cu
Each warp's rows are `stride` apart (its loop `r += stride`), and the first pass over a row waits for
DRAM. v0 as generated; v1 the next row's lines of every buffer the kernel reads by row prefetched
into L1 as the row starts (one line a lane); v2 the same into L2; v3 the next row into L1 and the
one after into L2; v4 and v5 (a kernel with column sums) over 2 and 4 blocks an SM under launch
bounds of 2 and 4 blocks (128 and 64 registers), as generated otherwise; v6 every buffer read by row
loaded into registers as the row starts, which every pass then reads (v7: and as v4). The floor: a copy reading and
writing as many bytes by row (harness.cu). A kernel of one row a warp (a layer norm's forward: k55): as
generated, and each warp looping over rows on 2, 3, 4, 6 and 8 blocks an SM."""
import re, sys
sys.path.insert(0, __file__.rsplit('/', 2)[0])
import dump

src, name = open(sys.argv[1]).read(), sys.argv[2]
k = dump.kernels(src, name)[0]
one = re.search(r'    const int r = \(\(int64_t\)blockIdx.x \* 256 \+ threadIdx.x\) / 32;\n    const int lane = threadIdx.x % 32;\n'
                r'    if \(r >= (\d+)ll\) return;\n', k)
if one:   # a warp a row, one row each: the same over fewer blocks, each warp looping over rows
    rows = int(one.group(1))
    def persistent(to, b):
        body = k.replace(name + '(', to + '(', 1)
        loop = '    const int lane = threadIdx.x %% 32;\n    for (int r = (int)blockIdx.x * 8 + threadIdx.x / 32; r < %d; r += %d) {\n' % (rows, b * 8)
        return body.replace(one.group(0), loop, 1).rstrip()[:-1] + '    }\n}\n'
    grids = [rows // 8, 2 * 132, 3 * 132, 4 * 132, 6 * 132, 8 * 132]
    ks = [k.replace(name + '(', 'v0(', 1)] + [persistent('v%d' % i, b) for i, b in enumerate(grids[1:], 1)]
    offs = [int(x) for x in re.findall(r'A \+ (\d+)', k)]
    open(sys.argv[3], 'w').write(dump.prelude(src) + '\n'.join(ks) + '\n#define ARENA %dll\n#define ONE_ROW 1\n#define GRIDS %s\n'
        '#include "harness.cu"\n' % (max(offs) + (1 << 26), ', '.join(map(str, grids))))
    print('%s: %d rows, a warp each; as generated and looping over %s blocks' % (name, rows, grids[1:]))
    sys.exit(0)
head = re.search(r'for \(int r = \(int\)blockIdx.x \* (\d+) \+ w; r < (\d+)ll; r \+= (\d+)\) \{\n', k)
rows, stride = int(head.group(2)), int(head.group(3))
width = int(re.search(r'\(uint32_t\)r \* (\d+) \+ j', k).group(1))
blocks = stride // int(head.group(1))
types = dict((int(i), t) for t, i in re.findall(r'const (float|unsigned short) \*__restrict__ P(\d+) =', k))
loaded = sorted({int(i) for i in re.findall(r'\*\(const (?:float4|uint2) \*\)\(P(\d+) \+ i\d+\)', k)} & set(types))   # inputs
stored = re.findall(r'\*\((float4|uint2) \*\)\([PS]\d+ \+ i\d+\)', k)

def prefetch(ahead, level):
    """lines of row r + ahead * stride of each buffer read by row, one a lane"""
    out = ['    { const int rn = r + %d; if (rn < %d) {' % (ahead * stride, rows)]
    for i in loaded:
        size = 4 if types[i] == 'float' else 2
        out.append('        if (lane < %d) asm volatile("prefetch.global.%s [%%0];" :: "l"(P%d + (size_t)rn * %d + lane * %d));'
                   % (width * size // 128, level, i, width, 128 // size))
    return '\n'.join(out) + '\n    } }\n'

def variant(name_to, *pf):
    body = k.replace(name + '(', name_to + '(', 1)
    return body.replace(head.group(0), head.group(0) + ''.join(prefetch(a, l) for a, l in pf), 1)

fin = re.search(r'tgk_rows_finish\(\(unsigned \*\)\(A \+ \d+\), part, group, (\d+), (\d+), (\d+)\)', k)

def reblock(body, b, bounds):
    """over b blocks (the same warps a block) under __launch_bounds__(256, bounds)"""
    n, group = int(fin.group(1)), int(fin.group(3))
    body = re.sub(r'__launch_bounds__\(256, \d+\)', '__launch_bounds__(256, %d)' % bounds, body)
    body = body.replace('r += %d)' % stride, 'r += %d)' % (b * (stride // blocks)))
    body = body.replace('part + %dll' % (blocks * n), 'part + %dll' % (b * n))
    body = body.replace(', %d, %d, %d)) return;' % (n, blocks, group), ', %d, %d, %d)) return;' % (n, b, group))
    return re.sub(r'g < %d; g\+\+' % ((blocks + group - 1) // group), 'g < %d; g++' % ((b + group - 1) // group), body)

ks = [variant('v0'), variant('v1', (1, 'L1')), variant('v2', (1, 'L2')), variant('v3', (1, 'L1'), (2, 'L2'))]
def in_registers(body):
    """every buffer read by row loaded into registers as the row starts, the passes reading those"""
    its = width // 128
    vec = {i: 'float4' if types[i] == 'float' else 'uint2' for i in loaded}
    pre = ['    %s X%d[%d];' % (vec[i], i, its) for i in loaded]
    pre.append('    _Pragma("unroll") for (int it = 0; it < %d; it++) {' % its)
    pre.append('        const uint32_t q = (uint32_t)r * %d + 4 * lane + it * 128;' % width)
    pre += ['        X%d[it] = *(const %s *)(P%d + q);' % (i, vec[i], i) for i in loaded]
    pre.append('    }\n')
    body = body.replace(head.group(0), head.group(0) + '\n'.join(pre), 1)
    body = body.replace('    for (int j = 4 * lane; j < %dll; j += 128) {' % width, '    _Pragma("unroll") for (int j = 4 * lane; j < %dll; j += 128) {' % width)
    for i in loaded:
        body = re.sub(r'\*\(const %s \*\)\(P%d \+ i\d+\)' % (vec[i], i), 'X%d[(j - 4 * lane) / 128]' % i, body)
    return body

if fin:   # a row kernel with column sums: as many warps an SM under other bounds
    ks += [reblock(variant('v4'), 2 * 132, 2), reblock(variant('v5'), 4 * 132, 4), in_registers(variant('v6')),
           reblock(in_registers(variant('v7')), 2 * 132, 2)]
else:
    ks += [variant('v4'), variant('v5'), in_registers(variant('v6')), in_registers(variant('v7'))]
offs = [int(x) for x in re.findall(r'A \+ (\d+)', k)]
reads = [4 if types[i] == 'float' else 2 for i in loaded]
writes = [4 if t == 'float4' else 2 for t in stored]
open(sys.argv[3], 'w').write(dump.prelude(src) + '\n'.join(ks) +
    '\n#define ARENA %dll\n#define BLOCKS %d\n#define ROWS %d\n#define WIDTH %d\n#define READ_BYTES %d\n#define WRITE_BYTES %d\n'
    '#include "harness.cu"\n' % (max(offs) + (1 << 26), blocks, rows, width, sum(reads), sum(writes)))
print('%s: %d rows of %d, %d blocks, rows %d apart; read by row: %s; stored by row: %s' %
      (name, rows, width, blocks, stride, ['P%d %s' % (i, types[i]) for i in loaded], stored))
