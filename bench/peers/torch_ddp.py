"""The PyTorch peer for data-parallel training: DistributedDataParallel over NCCL, the way PyTorch
users train on several GPUs.

Same model as torch_workloads.py's char_gpt (and char_gpt_small), copied below unchanged, 64
sequences (16 for char_gpt_small) per GPU; gpt2_small is the same model at GPT-2 small's shape
(vocabulary 50257, T 512, d 768, 12 heads, 12 layers), 8 sequences per GPU; fused Adam, DDP's bucketed all-reduce overlapping the
backward. Launch it as the issue asks:

  torchrun --nproc_per_node 2 bench/peers/torch_ddp.py [--precision f32|tf32|bf16] [--modes eager,compile]
                                                       [--sdpa] [--steps N] [workload ...]
  python3 bench/peers/torch_ddp.py ...      one process, one GPU, no DDP: the scaling baseline

Modes: eager (DDP + fused Adam) and compile (torch.compile of the DDP module: inductor kernels,
the all-reduce split at DDP's bucket boundaries). Rank 0 prints one line per mode in
torch_workloads.py's format, followed by the world size and samples (sequences) per second over
all GPUs: ms/step is the median of 5 repeats of N steps after 5 warm-up steps.
NCCL_NVLS_ENABLE=0 unless set (NVLink multicast off, as the GPU machines require)."""
import os, time, math, statistics, argparse

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")   # before NCCL initialises
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("workloads", nargs="*")
ap.add_argument("--precision", default="f32", choices=["f32", "tf32", "bf16"])
ap.add_argument("--modes", default="eager,compile")
ap.add_argument("--sdpa", action="store_true")
ap.add_argument("--steps", type=int, default=0)
args = ap.parse_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
if world > 1:
    dist.init_process_group("nccl", device_id=dev)
torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
torch.backends.cudnn.allow_tf32 = args.precision == "tf32"

# ----- torch_workloads.py's GPT, unchanged -----
class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d); self.q = nn.Linear(d, d); self.k = nn.Linear(d, d); self.v = nn.Linear(d, d); self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d); self.f1 = nn.Linear(d, 4 * d); self.f2 = nn.Linear(4 * d, d)
    def forward(self, x):
        B, T, D = x.shape
        y = self.ln1(x)
        q, k, v = [t(y).view(B, T, self.h, D // self.h).transpose(1, 2) for t in (self.q, self.k, self.v)]
        if args.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.h)
            mask = torch.ones(T, T, device=x.device, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = att @ v
        y = y.transpose(1, 2).reshape(B, T, D)
        x = x + self.o(y)
        return x + self.f2(F.gelu(self.f1(self.ln2(x))))

class GPT(nn.Module):
    def __init__(self, V, T, d, h, L):
        super().__init__()
        self.tok = nn.Embedding(V, d); self.pos = nn.Embedding(T, d)
        self.blocks = nn.ModuleList([Block(d, h) for _ in range(L)])
        self.lnf = nn.LayerNorm(d); self.head = nn.Linear(d, V)
    def forward(self, idx):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks: x = b(x)
        return self.head(self.lnf(x))

# name: (V, T, d, h, L, sequences per GPU, steps per repeat)
WORKLOADS = dict(char_gpt_small=(65, 64, 128, 4, 2, 16, 200), char_gpt=(65, 256, 384, 6, 6, 64, 50),
                 gpt2_small=(50257, 512, 768, 12, 12, 8, 20))   # GPT-2 small's shape, for the scaling runs

def bench(name, mode):
    V, T, d, h, L, B, steps = WORKLOADS[name]
    steps = args.steps or steps
    torch.manual_seed(0)              # the same initial parameters on every rank
    m = GPT(V, T, d, h, L).to(dev)
    torch.manual_seed(1 + rank)       # each rank its own batch
    x = torch.randint(0, V, (B, T), device=dev); y = torch.randint(0, V, (B, T), device=dev)
    model = DDP(m, device_ids=[local]) if world > 1 else m
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    def loss_fn(mdl, x, y):
        if args.precision == "bf16":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return F.cross_entropy(mdl(x).view(-1, V), y.view(-1))
        return F.cross_entropy(mdl(x).view(-1, V), y.view(-1))
    fwd = model if mode == "eager" else torch.compile(model)
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(fwd, x, y); loss.backward(); opt.step()
        return loss
    for _ in range(5): step()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(steps): loss = step()
        l = loss.item()                 # waits for this rank's steps (and, through DDP, the others')
        if world > 1: dist.barrier()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    med = statistics.median(times)
    nparam = sum(p.numel() for p in m.parameters())
    tag = args.precision + ("+sdpa" if args.sdpa else "")
    if rank == 0:
        print(f"{name:16s} cuda {tag:9s} ddp-{mode:6s} params={nparam:9d} ms/step median={med:8.3f} min={min(times):8.3f} "
              f"loss={l:.4f} world={world} samples/s={world * B * 1e3 / med:.1f}", flush=True)

for name in (args.workloads or ["char_gpt"]):
    for mode in args.modes.split(","):
        try: bench(name, mode)
        except Exception as e:
            if rank == 0: print(f"{name} ddp-{mode} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
if world > 1: dist.destroy_process_group()
