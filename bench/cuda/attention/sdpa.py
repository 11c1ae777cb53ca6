"""PyTorch's scaled_dot_product_attention at the harness's shape (bf16, causal, [64, 256, 6, 64]
viewed as [B, H, T, D] as the peer's model does), forward alone and backward alone, per backend.
The backward goes through autograd, so it includes the gradients' bookkeeping: in a step, the
profiler (torch_profile.py) is the fairer figure."""
import torch, torch.nn.functional as F
torch.manual_seed(0)
B, T, H, D = 64, 256, 6, 64
x = [torch.randn(B, T, H, D, device='cuda', dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
q, k, v = [t.transpose(1, 2) for t in x]
g = torch.randn(B, H, T, D, device='cuda', dtype=torch.bfloat16)
from torch.nn.attention import sdpa_kernel, SDPBackend
def tm(f, n=50):
    for _ in range(3): f()
    best = 1e9
    for _ in range(5):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        for _ in range(n): f()
        b.record(); torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / n)
    return best * 1e3
for name, be in [('flash', SDPBackend.FLASH_ATTENTION), ('cudnn', SDPBackend.CUDNN_ATTENTION), ('efficient', SDPBackend.EFFICIENT_ATTENTION)]:
    try:
        with sdpa_kernel(be):
            f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            tf = tm(f)
            o = f()
            def fb():
                for t in x: t.grad = None
                o.backward(g, retain_graph=True)
            tb = tm(fb)
        print(f"torch {torch.__version__} sdpa {name}: fwd {tf:.1f} us, bwd {tb:.1f} us")
    except Exception as e:
        print(name, 'failed', str(e)[:200])
