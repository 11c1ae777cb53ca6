"""PyTorch's peak device memory for training steps of the peer's workloads, the figure issue 18
compares char_gpt's memory against: torch.cuda.max_memory_allocated() after a few eager steps,
in MiB (2^20 bytes), the unit bench.c's `allocated=` is printed in.

Usage (on the GPU machine): python3 bench/peer_memory.py [--precision P] [--sdpa] [workload ...]
The options are torch_workloads.py's (copied verbatim from the shared peers: imported, not changed).
"""
import os, sys

sys.argv = [sys.argv[0], "cuda"] + sys.argv[1:]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import torch
import torch_workloads as tw

for name in sorted(tw.only) or ["char_gpt"]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    tw.bench(name, tw.workloads()[name], "eager", 3)
    tag = tw.args.precision + ("+sdpa" if tw.args.sdpa else "")
    print(f"{name:16s} cuda {tag:9s} eager      max_memory_allocated={torch.cuda.max_memory_allocated() / 2**20:.1f}MiB",
          flush=True)
