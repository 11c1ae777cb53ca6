"""Pieces of a `bench --kernels` CUDA dump, for the harnesses that time the library's kernels alone."""
import re

def prelude(src, marker=None):
    """The dump's source up to the first generated kernel after `marker` (a line of the last
    template wanted; None: the whole dump), without the kernels before it, and with <stdint.h>'s
    types for nvcc."""
    end = src.index('extern "C"', src.index(marker)) if marker else len(src)
    pre, i = [], 0
    while True:
        j = src.find('extern "C"', i, end)
        if j < 0: pre.append(src[i:end]); break
        pre.append(src[i:j]); i = src.index('\n}\n', j) + 3
    text = ''.join(pre)
    for t in ['typedef long long int64_t;', 'typedef unsigned long long uint64_t;', 'typedef int int32_t;', 'typedef unsigned uint32_t;']:
        text = text.replace(t, '')
    return '#include <stdint.h>\n' + text

def kernels(src, name):
    """The kernels whose names match the pattern `name`."""
    heads = re.finditer(r'extern "C" __global__ void (__launch_bounds__\([^)]*\) )?' + name + r'\(', src)
    return [src[m.start():src.index('\n}\n', m.start()) + 3] for m in heads]
