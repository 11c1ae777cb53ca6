"""Edited copies of one generated bf16 pointwise kernel of one source and one output, four values a
thread four times (char_gpt's GELU forward, k76), to time alone with harness.cu:
    python3 variants.py DUMP KERNEL ELEMENTS out.cu
V0 as generated; V1 its gelu left out (what the arithmetic costs); V2 eight values a thread (16-byte
loads and stores) twice; V3 eight values a thread once (twice the blocks)."""
import re, sys
sys.path.insert(0, __file__.rsplit('/', 2)[0])
import dump

src, name, n = open(sys.argv[1]).read(), sys.argv[2], int(sys.argv[3])
k = dump.kernels(src, name)[0]
src_ptr = re.search(r'const unsigned short \*__restrict__ (P\d+) = \(const unsigned short \*\)\(A \+ (\d+)\);', k)
dst_ptr = re.search(r'unsigned short \*__restrict__ (S\d+) = \(unsigned short \*\)\(A \+ (\d+)\);', k)
wide = '''extern "C" __global__ void %s(float *A, void *const *B, const double *H) {
    const unsigned short *__restrict__ x = (const unsigned short *)(A + %s);
    unsigned short *__restrict__ y = (unsigned short *)(A + %s);
    #pragma unroll
    for (int u = 0; u < %d; u++) {
        const uint32_t i = ((uint32_t)blockIdx.x * %d + u * 256 + threadIdx.x) * 8;
        const uint4 v = *(const uint4 *)(x + i);
        const unsigned w[4] = { v.x, v.y, v.z, v.w };
        unsigned o[4];
        for (int h = 0; h < 4; h++)
            o[h] = tgk_pack_bf16(tgk_gelu(__uint_as_float(w[h] << 16)), tgk_gelu(__uint_as_float(w[h] & 0xffff0000u)));
        *(uint4 *)(y + i) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}
'''
ks = [k.replace(name + '(', 'v0('),
      re.sub(r'tgk_gelu\(([^)]*)\)', r'(\1)', k.replace(name + '(', 'v1(')),
      wide % ('v2', src_ptr.group(2), dst_ptr.group(2), 2, 512),
      wide % ('v3', src_ptr.group(2), dst_ptr.group(2), 1, 256)]
offs = [int(x) for x in re.findall(r'A \+ (\d+)', k)]
open(sys.argv[4], 'w').write(dump.prelude(src) + '\n'.join(ks) +
    '\n#define ARENA %dll\n#define N %dll\n#define SRC %s\n#define DST %s\n#include "harness.cu"\n' %
    (max(offs) + (1 << 26), n, src_ptr.group(2), dst_ptr.group(2)))
