"""The peer's char_gpt step at bf16 with SDPA under inductor (compile mode), its kernels timed by
PyTorch's profiler over 5 steps: where an expert's PyTorch spends its step. Run from the
repository's root: python3 bench/cuda/attention/torch_profile.py"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "peers"))
sys.argv = ["torch_workloads.py", "cuda", "--precision", "bf16", "--sdpa"]
import torch, torch_workloads as tw
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
m, batch, loss_fn, lr = tw.workloads()["char_gpt"]()
m = m.cuda(); batch = tuple(t.cuda() for t in batch)
opt = torch.optim.Adam(m.parameters(), lr=lr, fused=True)
def f(m, b):
    with torch.autocast("cuda", dtype=torch.bfloat16): return loss_fn(m, b)
f = torch.compile(f)
def step():
    opt.zero_grad(set_to_none=True)
    loss = f(m, batch); loss.backward(); opt.step()
for _ in range(8): step()
torch.cuda.synchronize()
N = 5
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(N): step()
    torch.cuda.synchronize()
rows = []
for e in prof.key_averages():
    t = getattr(e, "device_time_total", None)
    if t is None: t = e.cuda_time_total
    if t > 0: rows.append((t / N, e.count // N, e.key))
rows.sort(reverse=True)
tot = sum(r[0] for r in rows)
print(f"torch kernels per step: {sum(r[1] for r in rows)} launches, {tot/1e3:.3f} ms in kernels")
for t, c, k in rows[:60]: print(f"{t/1e3:8.3f} ms {c:4d}x  {k[:150]}")
