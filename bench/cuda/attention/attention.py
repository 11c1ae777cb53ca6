"""char_gpt's bf16 (or tf32) attention kernels on their own, out of a `bench --kernels` dump.

    build/bench/bench --backend cuda-nvrtc --precision bf16 --kernels /tmp/k char_gpt
    python3 bench/cuda/attention/attention.py harness /tmp/k/char_gpt.cuda-nvrtc.txt v.cu [bf16|tf32]
    nvcc -arch=sm_90a -O3 -w -I bench/cuda/attention -DVARIANT='"v"' -DFWD_SMEM=36864 -DFWD_TILES=4 \\
         -DFWD_THREADS=128 -DBWD_SMEM=64992 -DBWD_TILES=4 -DBWD_THREADS=128 -o v v.cu   # on the GPU machine (variants.py writes the -D's)
    python3 bench/cuda/attention/attention.py regs /tmp/k/char_gpt.cuda-nvrtc.txt       # any machine with nvcc

`harness` writes the dump's device prelude and attention source with the two kernels of char_gpt
(causal, 256 x 256, 6 interleaved heads of 64; ATTN_FWD and ATTN_BWD name them) and harness.cu's
main, which times them and checks them against a double-precision reference on four heads (edit
the kernels in the .cu to time a variant: leave a stage out, change a bound). `regs` compiles
every attention kernel of a dump for sm_90a and prints registers and spills. The launch sizes (the
-D's) are cuda_codegen.c's (attention_kernel's tiles, block and shared memory); figures in
bench/RESULTS.md (fifteenth CUDA session)."""
import os, re, subprocess, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from dump import kernels, prelude

def split(src):
    """The dump's source without its kernels (prelude and attention templates)."""
    return prelude(src, '#define TGA_T 64')

def main():
    what, dump = sys.argv[1], open(sys.argv[2]).read()
    if what == 'harness':
        p = sys.argv[4] if len(sys.argv) > 4 else 'bf16'
        ks = kernels(dump, r'attn_%s_256x256x64x64_causal\w*' % p) + kernels(dump, r'attn_bwd_%s_256x256x64x64_causal\w*' % p)
        names = ['#define ATTN_%s %s\n' % (w, re.search(r'(attn\w*)\(', k).group(1)) for w, k in zip(['FWD', 'BWD'], ks)]
        tf32 = '#define TF32 1\n' if p == 'tf32' else ''
        if '_ob' in re.search(r'(attn\w*)\(', ks[1]).group(1): tf32 += '#define BWD_OB 1\n'
        open(sys.argv[3], 'w').write(split(dump) + '\n'.join(ks) + ''.join(names) + tf32 + '#include "harness.cu"\n')
    elif what == 'regs':
        open('/tmp/attention_regs.cu', 'w').write(split(dump) + '\n'.join(kernels(dump, r'attn\w*')))
        nvcc = os.environ.get('NVCC', 'nvcc')
        r = subprocess.run([nvcc, '-arch=sm_90a', '-cubin', '-w', '-Xptxas', '-v', '-o', '/tmp/attention_regs.cubin',
                            '/tmp/attention_regs.cu'], capture_output=True, text=True)
        name = None
        for line in r.stderr.splitlines():
            m = re.search(r"Compiling entry function '(\w+)'", line)
            if m: name = m.group(1)
            if 'spill' in line or 'Used' in line or 'error' in line: print(name, line.strip())

if __name__ == '__main__':
    main()
