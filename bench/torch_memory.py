"""Peak CUDA memory of the PyTorch peer's char_gpt training step (torch.cuda.max_memory_allocated),
eager and compile-ro, with the peer's own model and step (bench/peers/torch_workloads.py)."""
import sys
sys.argv = [sys.argv[0], "cuda"]
sys.path.insert(0, "bench/peers")
import torch
import torch_workloads as tw

for mode in ["eager", "compile-ro"]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    tw.bench("char_gpt", tw.workloads()["char_gpt"], mode, 5)
    print(f"char_gpt cuda {mode} max_memory_allocated={torch.cuda.max_memory_allocated() / 2**20:.1f}MB", flush=True)
