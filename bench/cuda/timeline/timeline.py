"""Where a training step's GPU time goes, from tracer.c's timeline.

    python3 bench/cuda/timeline/timeline.py trace.txt kleaves [top] [list]

A step starts at each launch of the marker kernel (ours: kleaves, the first kernel of a step at
tf32 and bf16, at f32 the step's first kernel by its exact name, e.g. 'k2$'; PyTorch under inductor: its embedding kernel, e.g. triton_poi_fused_embedding_0).
Over the last five whole steps: the wall time a step, the kernels' exclusive time (each kernel's
end less the later of its start and the previous kernel's end: a kernel launched early, while the
one before it runs, counts from that one's end) and the idle time with no kernel running; the
time with kernels on one stream, on several at once (a side stream's beside the chain), on none; then
the idle time by the categories of the kernels either side of each gap (a memset node waits for
the kernel before it, and the kernel after it for the memset); then each kernel's exclusive
time a step, by category and by name. With `list`, then the last of those steps launch by launch:
its start from the step's, its length, the idle time before it, its stream, its name."""
import collections, sys

def load(path):
    """(start, end, name, stream) of each kernel and memset, by start"""
    ev = []
    for line in open(path):
        p = line.split(None, 7)
        if len(p) == 8 and p[0] in 'KM':
            name = p[7].strip() if p[0] == 'K' else 'memset %s B' % p[3]
            ev.append((int(p[1]), int(p[2]), name, int(p[6])))
    ev.sort()
    return ev

def streams(ev, steps):
    """Time a step with kernels running on one stream, on several at once, on none. (In a replayed
    CUDA graph the streams are the graph's own: which one holds the critical path can change.)"""
    t = collections.Counter()
    for a, b in steps:
        lo_step, hi_step = ev[a][0], ev[b][0]
        cuts = sorted({x for s, e, _, _ in ev[a:b] for x in (s, e) if lo_step <= x <= hi_step} | {lo_step, hi_step})
        for lo, hi in zip(cuts, cuts[1:]):
            mid = (lo + hi) / 2
            on = {st for s, e, _, st in ev[a:b] if s <= mid < e}
            t['several' if len(on) > 1 else 'one' if on else 'none'] += hi - lo
    return t

def category(name):
    if 'nvjet' in name or 'gemm' in name or 'splitK' in name: return 'products (cuBLAS)'
    if 'attn_bwd' in name or 'bprop' in name: return 'attention backward'
    if 'attn' in name or 'fprop' in name: return 'attention'
    return 'memset' if name.startswith('memset') else 'other'

def main():
    ev, marker = load(sys.argv[1]), sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    exact = marker.endswith('$')   # 'k2$': that kernel's name only (f32 steps have no kleaves)
    starts = [i for i, e in enumerate(ev) if (e[2] == marker[:-1] if exact else e[2].startswith(marker))]
    steps = list(zip(starts[-7:-2], starts[-6:-1]))
    if not steps: sys.exit('fewer than 3 steps marked by %s' % marker)
    names, cats, gaps = collections.defaultdict(float), collections.defaultdict(float), collections.defaultdict(float)
    wall = busy = 0.0
    for a, b in steps:
        wall += ev[b][0] - ev[a][0]
        prev, before = ev[a][0], 'start'
        for s, e, name, _ in ev[a:b]:
            x = max(0, e - max(s, prev))
            if s > prev: gaps[(before, category(name))] += s - prev
            prev, before = max(prev, e), category(name)
            busy += x
            names[name[:80]] += x
            cats[category(name)] += x
    n = len(steps)
    print('%d steps: %.3f ms a step, kernels %.3f ms exclusive, idle %.3f ms, %d launches a step' %
          (n, wall / n / 1e6, busy / n / 1e6, (wall - busy) / n / 1e6, (steps[-1][1] - steps[-1][0])))
    t = streams(ev, steps)
    print('  streams busy: ' + ', '.join('%s %.1f us' % (k, t[k] / n / 1e3) for k in ('one', 'several', 'none')))
    for k, v in sorted(cats.items(), key=lambda x: -x[1]): print('  %-20s %8.1f us' % (k, v / n / 1e3))
    for k, v in sorted(gaps.items(), key=lambda x: -x[1])[:6]: print('  idle after %s before %s: %.1f us' % (k[0], k[1], v / n / 1e3))
    for k, v in sorted(names.items(), key=lambda x: -x[1])[:top]: print('  %8.1f us  %s' % (v / n / 1e3, k))
    if 'list' in sys.argv[4:]: listing(ev, *steps[-1])

def listing(ev, a, b):
    print('\n   start    length   idle  stream  name (the last step, launch by launch, us)')
    t0, prev = ev[a][0], ev[a][0]
    for s, e, name, st in ev[a:b]:
        print('%8.1f %8.1f %6.1f %6d  %s' % ((s - t0) / 1e3, (e - s) / 1e3, max(0, s - prev) / 1e3, st, name[:70]))
        prev = max(prev, e)

if __name__ == '__main__':
    main()
