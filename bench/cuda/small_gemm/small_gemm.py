"""The small f32 product kernel (tgk_gemm, cuda_products.c) on its own, beside cuBLAS, out of a
`bench --kernels` dump of an f32 graph that has its instances.

    build/bench/bench --backend cuda-nvrtc --precision f32 --kernels /tmp/k sin_mlp
    python3 bench/cuda/small_gemm/small_gemm.py /tmp/k/sin_mlp.cuda-nvrtc.txt v.cu
    nvcc -arch=sm_90 -O3 -w -I bench/cuda/small_gemm -o v v.cu -lcublas && ./v   # on the GPU machine

Each kernel is timed as the step's graph runs it: 20 launches captured in a CUDA graph, the graph
replayed, best of 5 rounds; sin_mlp's and mnist_mlp's product shapes; each result checked against
a product in double. Edit the kernel in the .cu to time a variant; figures in bench/RESULTS.md
(eighteenth session)."""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from dump import kernels, prelude

dump = open(sys.argv[1]).read()
ks = kernels(dump, r'tg_gemm_\w\w')
open(sys.argv[2], 'w').write(prelude(dump, '#define TGG_KC') + '\n'.join(ks) + '#include "harness.cu"\n')
