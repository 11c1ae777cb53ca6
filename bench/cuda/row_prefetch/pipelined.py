"""(For dumps before the thirty-ninth session, whose row kernels finished their column sums themselves, tgk_rows_finish.)
A row kernel with column sums whose rows' inputs are in registers (char_gpt bf16's layer norm backward,
k748), timed alone as generated (v0) and with those loads a row ahead (v1: the next row's vectors are
loaded into a second set of registers as the row starts, so that they are in flight while the row's passes
run; the set moved over at the row's end), beside a copy reading and writing as many bytes:
    python3 pipelined.py DUMP KERNEL out.cu && nvcc -O3 -arch=sm_90 -std=c++17 -I. out.cu -o /tmp/pipelined
Measured (H200, ccce3d1's k748, bench/logs/gpu_h200_s42_d_*): 41.7 us as generated, 43.5 a row ahead, 40.8 with
float row sums, 32.5 without the finish (wrong), 34.3 up to the partial sums + 2.5 for a finishing kernel; the copy 29.3.
The library now finishes with a kernel of its own (row_columns_emit, tgk_rows_total)."""
import re, sys
sys.path.insert(0, __file__.rsplit('/', 2)[0])
import dump

src, name = open(sys.argv[1]).read(), sys.argv[2]
k = dump.kernels(src, name)[0]
head = re.search(r'    for \(int r = \(int\)blockIdx.x \* (\d+) \+ w; r < (\d+)ll; r \+= (\d+)\) \{\n', k)
rows, stride = int(head.group(2)), int(head.group(3))
width = int(re.search(r'\(uint32_t\)r \* (\d+) \+ j', k).group(1))
blocks = stride // int(head.group(1))
loads = re.findall(r'    (float4|uint2) X(\d+)\[(\d+)\];\n    _Pragma\("unroll"\) for \(int it = 0; it < \d+; it\+\+\) \{\n'
                   r'        const int j = (.*?);\n        if \(j < (\d+)ll\) X\d+\[it\] = \*\(const \w+ \*\)\(P\d+ \+ \(uint32_t\)r \* \d+ \+ j\);\n    \}\n', k)
assert loads, 'no rows in registers'

def load(x, dst, row):
    t, i, n, j, L = x
    return ('    _Pragma("unroll") for (int it = 0; it < %s; it++) {\n        const int j = %s;\n'
            '        if (j < %sll) %s%s[it] = *(const %s *)(P%s + (uint32_t)(%s) * %d + j);\n    }\n' % (n, j, L, dst, i, t, i, row, width))

def ahead(to):
    body = k.replace(name + '(', to + '(', 1)
    block = ''.join(m.group(0) for m in re.finditer(r'    (float4|uint2) X(\d+)\[(\d+)\];\n    _Pragma.*?\n    \}\n', body, re.S))
    for m in re.finditer(r'    (float4|uint2) X(\d+)\[(\d+)\];\n    _Pragma.*?\n    \}\n', body, re.S):
        body = body.replace(m.group(0), '', 1)
    first = '    const int r0 = (int)blockIdx.x * %s + w;\n' % head.group(1)
    first += ''.join('    %s X%s[%s];\n' % (t, i, n) for t, i, n, _, _ in loads)
    first += '    if (r0 < %d) {\n%s    }\n' % (rows, ''.join(load(x, 'X', 'r0') for x in loads))
    nxt = ''.join('    %s Y%s[%s];\n' % (t, i, n) for t, i, n, _, _ in loads)
    nxt += '    if (r + %d < %d) {\n%s    }\n' % (stride, rows, ''.join(load(x, 'Y', 'r + %d' % stride) for x in loads))
    body = body.replace(head.group(0), first + head.group(0) + nxt, 1)
    moves = ''.join('    _Pragma("unroll") for (int it = 0; it < %s; it++) X%s[it] = Y%s[it];\n' % (n, i, i) for t, i, n, _, _ in loads)
    end = body.index('    }\n    __shared__ double tgc[')
    return body[:end] + moves + body[end:]

def float_rows(to):
    """the row sums added in float (a lane's values, then the warp's tree), not double"""
    body = k.replace(name + '(', to + '(', 1)
    end = body.index('    }\n    __shared__ double tgc[')
    return body[:end].replace('double acc = 0;', 'float acc = 0;').replace('acc += (double)', 'acc += ') + body[end:]

def no_finish(to):
    """(wrong: the floor of the rows' part) the kernel without its blocks' column sums, each block's warps' and the last blocks'"""
    body = k.replace(name + '(', to + '(', 1)
    end = body.index('    }\n    __shared__ double tgc[')
    n = int(re.search(r'float C0\[(\d+)\]', body).group(1))
    keep = '    float z = 0;\n' + ''.join('    _Pragma("unroll") for (int i = 0; i < %d; i++) z += C%d[i];\n' % (n, q) for q in range(3) if 'C%d[' % q in body)
    return body[:end] + '    }\n' + keep + '    if (z == 12345.0f) A[threadIdx.x] = z;\n}\n'

def partials_only(to):
    """the kernel up to its blocks' partial sums: what would stay on the chain with a finishing kernel of its own"""
    body = k.replace(name + '(', to + '(', 1)
    return body[:body.index('    if (!tgk_rows_finish(')] + '}\n'

fin = re.search(r'double \*part = \(double \*\)\(A \+ (\d+)\), \*group = part \+ \d+ll;', k)
finish = r'''
/* the blocks' partial column sums [blocks, n] added per column in block order: 32 columns a block of 256, 8 threads a
 * column each adding every 8th block's, then the 8 added in order */
extern "C" __global__ void __launch_bounds__(256) finish(float *A, int blocks) {
    const double *part = (const double *)(A + %s);
    float *out = A + 64;
    __shared__ double s[8][33];
    const int c = blockIdx.x * 32 + (threadIdx.x & 31), y = threadIdx.x / 32;
    double acc = 0;
    if (c < %d) for (int b = y; b < blocks; b += 8) acc += __ldcg(part + (long long)b * %d + c);
    s[y][threadIdx.x & 31] = acc;
    __syncthreads();
    if (y == 0 && c < %d) {
        double t = 0;
        for (int q = 0; q < 8; q++) t += s[q][threadIdx.x];
        out[c] = (float)t;
    }
}
''' % (fin.group(1), 3 * width, 3 * width, 3 * width)

ks = [k.replace(name + '(', 'v0(', 1), ahead('v1'), float_rows('v2'), no_finish('v3'), partials_only('v4'), finish]
offs = [int(x) for x in re.findall(r'A \+ (\d+)', k)]
types = dict((int(i), t) for t, i in re.findall(r'const (float|unsigned short) \*__restrict__ P(\d+) =', k))
read = sum(4 if t == 'float4' else 2 for t, _, _, _, _ in loads)
write = sum(4 if t == 'float4' else 2 for t in re.findall(r'\*\((float4|uint2) \*\)\([PS]\d+ \+ i\d+\)', k))
main = r'''
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%%s:%%d %%s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#include "../graph_ms.h"
#include "../dump_buffers.h"
#include "floor_copy.h"
typedef void (*kernel)(float *, void *const *, const double *);
int main() {
    const dump_buffers d = dump_buffers_new(%dll);
    kernel fn[5] = { v0, v1, v2, v3, v4 };
    const char *what[5] = { "as generated", "the next row's loads a row ahead", "row sums in float", "(wrong) no column sums' finish", "up to the blocks' partial sums" };
    const long long n = %dll * %d;
    uint4 *in, *out;
    CK(cudaMalloc(&in, n * %d)); CK(cudaMalloc(&out, n * %d));
    for (int r = 0; r < 2; r++) {
        for (int v = 0; v < 5; v++) {
            cudaFuncAttributes at;
            CK(cudaFuncGetAttributes(&at, fn[v]));
            float ms = graph_ms(d.s, [&] { fn[v]<<<%d, 256, 0, d.s>>>(d.A, d.B, d.H); });
            printf("%%-36s %%4d blocks %%3d registers %%5zu B spilled %%7.2f us\n", what[v], %d, at.numRegs, at.localSizeBytes, ms * 1e3);
        }
        printf("%%-36s %%7.2f us\n", "a finishing kernel of its own", 1e3 * graph_ms(d.s, [&] { finish<<<%d, 256, 0, d.s>>>(d.A, %d); }));
        printf("%%-36s %%7.2f us\n", "  the two one after the other", 1e3 * graph_ms(d.s, [&] { v4<<<%d, 256, 0, d.s>>>(d.A, d.B, d.H); finish<<<%d, 256, 0, d.s>>>(d.A, %d); }));
        float ms = graph_ms(d.s, [&] { floor_copy<<<132 * 8, 256, 0, d.s>>>(in, out, n * %d / 16, n * %d / 16); });
        printf("%%-36s %%7.2f us\n", "floor: a copy of as many bytes", ms * 1e3);
    }
    CK(cudaGetLastError());
    return 0;
}
''' % (max(offs) + (1 << 26), rows, width, read, write, blocks, blocks, (3 * width + 31) // 32, blocks, blocks, (3 * width + 31) // 32, blocks, read, write)
open(sys.argv[3], 'w').write(dump.prelude(src) + '\n'.join(ks) + main)
print('%s: %d rows of %d, %d blocks; rows in registers: %s; %d + %d bytes an element' % (name, rows, width, blocks,
      ['X%s %s' % (i, t) for t, i, _, _, _ in loads], read, write))
