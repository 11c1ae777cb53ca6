"""(For dumps before the thirty-ninth session, whose row kernels finished their column sums themselves, tgk_rows_finish.)
A layer norm's backward with its two column sums (dgamma, dbeta) as one kernel (TG_CUDA_ROW_COLUMNS=1's
row_columns_emit) against the two kernels it replaces, each timed alone with harness.cu:
    python3 variants.py FUSED_DUMP PLAIN_DUMP ROW_KERNEL COLUMN_KERNEL out.cu
FUSED_DUMP and PLAIN_DUMP: `bench --kernels` dumps with and without TG_CUDA_ROW_COLUMNS=1 (char_gpt bf16: the
row kernel k559, the column sums k550). Variants of the fused kernel: as generated (its blocks and registers as
NVRTC leaves them), under __launch_bounds__(256, 4) (64 registers: four blocks an SM, the generated 528 blocks
one wave), and with 396 blocks (three an SM at its own registers); the tail cut (no finishing adds) of each."""
import re, sys
sys.path.insert(0, __file__.rsplit('/', 2)[0])
import dump

fused_src, plain_src, row, col = [sys.argv[i] if i > 2 else open(sys.argv[i]).read() for i in (1, 2, 3, 4)][:4]
fused = dump.kernels(fused_src, row)[0]
m = re.search(r'r \+= (\d+)\)', fused); stride = int(m.group(1))
m = re.search(r'tgk_rows_finish\(\(unsigned \*\)\(A \+ \d+\), part, group, (\d+), (\d+), (\d+)\)', fused)
n, blocks, group = int(m.group(1)), int(m.group(2)), int(m.group(3))
warps = stride // blocks

def reblock(k, b):
    """the fused kernel over b blocks"""
    groups = (b + group - 1) // group
    k = k.replace('r += %d)' % stride, 'r += %d)' % (b * warps))
    k = k.replace('part + %dll' % (blocks * n), 'part + %dll' % (b * n))
    k = k.replace(', %d, %d, %d)) return;' % (n, blocks, group), ', %d, %d, %d)) return;' % (n, b, group))
    return re.sub(r'g < %d; g\+\+' % ((blocks + group - 1) // group), 'g < %d; g++' % groups, k)

def cut(k):
    """no finishing adds: each block's partial sums only"""
    return re.sub(r'    if \(!tgk_rows_finish.*', '}\n', k, flags=re.S)

named = lambda k, name: re.sub(r'void (__launch_bounds__\([^)]*\) )?%s\(' % row, 'void \\1%s(' % name, k, count=1)
lb4 = fused.replace('void %s(' % row, 'void __launch_bounds__(256, 4) %s(' % row)
ks = [named(fused, 'f0'), named(lb4, 'f1'), named(reblock(fused, 3 * 132), 'f2'),
      named(cut(fused), 'f3'), named(cut(lb4), 'f4'), named(cut(reblock(fused, 3 * 132)), 'f5'),
      named(dump.kernels(plain_src, row)[0], 'rowk'), re.sub(r'void (__launch_bounds__\([^)]*\) )?%s\(' % col, 'void \\1colk(', dump.kernels(plain_src, col)[0])]
ck = dump.kernels(plain_src, col)[0]
chunk, lanes = int(re.search(r'k0 = \(\w+\)blockIdx.y \* (\d+)', ck).group(1)), int(re.search(r'\+ lane\) \* (\d+);', ck).group(1))
outs, rows = int(re.search(r'oj >= (\d+)ll', ck).group(1)), int(re.search(r'r >= (\d+)ll', dump.kernels(plain_src, row)[0]).group(1))
offs = [int(x) for x in re.findall(r'A \+ (\d+)', ''.join(ks))]
open(sys.argv[5], 'w').write(dump.prelude(fused_src) + '\n'.join(ks) +
    '\n#define ARENA %dll\n#define BLOCKS %d\n#define ROWS %d\n#define COLK_X %d\n#define COLK_Y %d\n#include "harness.cu"\n' %
    (max(offs) + (1 << 26), blocks, rows, (outs + 32 * lanes - 1) // (32 * lanes), (rows + chunk - 1) // chunk))
