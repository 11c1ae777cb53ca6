"""The f32 product kernel of three TF32 products (tgk_gemm3, cuda_products.c) on its own, beside
cuBLAS, out of a `bench --kernels` dump of an f32 graph with products it takes.

    build/bench/bench --backend cuda-nvrtc --precision f32 --kernels /tmp/k char_gpt
    python3 bench/cuda/gemm3x/gemm3x.py /tmp/k/char_gpt.cuda-nvrtc.txt v.cu
    nvcc -arch=sm_90 -O3 -w -I bench/cuda/gemm3x -o v v.cu -lcublas && ./v   # on the GPU machine

It writes the dump's device prelude (tgk_gemm3 among its templates) with the instances the dump
has and harness.cu's main, which times them on char_gpt's product shapes (and odd ones) beside
cublasSgemm in f32 and in TF32, and measures each result's error against a product in double on
sampled entries (|c - exact| / sum |a b|). Edit the kernel in the .cu to time a variant; figures
in bench/RESULTS.md (sixteenth session)."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from dump import kernels, prelude

dump = open(sys.argv[1]).read()
ks = kernels(dump, r'tg_gemm3_\w\w') + kernels(dump, 'tg_gemm3_sum')
missing = {'nn', 'nt', 'tn'} - set(k.split('tg_gemm3_')[1][:2] for k in ks)
if missing: sys.exit('the dump has no tg_gemm3_%s: take one of an f32 graph with such products' % ', '.join(sorted(missing)))
open(sys.argv[2], 'w').write(prelude(dump, '#define TG3_BK ') + '\n'.join(ks) + '#include "harness.cu"\n')
