"""Device diagnostic for the BERT-large launch failure (docs/log/2026-12-01.md): every region of a one-layer
BERT-large encoder - its shapes, plan and kernel - launched on its own through comfuse::fused_region, then the
layer through torch.compile(backend="comfuse"). Run from the repository root on a GPU: python3 bench/bert_diag.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bert_bench import Encoder, CONFIGS  # noqa: E402
from comfuse import ops  # noqa: E402
import comfuse  # noqa: E402

if not torch.cuda.is_available():
    print("skipped: no GPU")
    sys.exit(77)
cfg = dict(CONFIGS["large"]); cfg["layers"] = 1
m = Encoder(**cfg).cuda().to(torch.bfloat16).eval()
x = torch.randn(32, 512, 1024, device="cuda", dtype=torch.bfloat16)
reps = comfuse.capture(m, x)
rep = reps[0]
for i, (r, p) in enumerate(zip(rep.regions, rep.plans)):
    g = r.spec.gemm
    print(f"region {i}: rows={g.rows} N={g.n} K={g.k} tb={g.transpose_b} params={[ (q.name, str(q.kind), list(q.shape)) for q in r.spec.params]} outs={[ (o.name, list(o.shape), str(o.dtype)) for o in r.spec.outputs]} fuse={p.fuse} {p.reason[:80]}", flush=True)
    key = ops.register_region(r.spec)
    try:
        k = ops.gpu_kernel(key)
        print(f"  kernel {k.name} {k.config} {k.transport}", flush=True)
        a = torch.randn(g.rows, g.k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(g.n * g.k, device="cuda", dtype=torch.bfloat16).view(g.n, g.k)
        ps = [torch.randn([int(d) for d in q.shape], device="cuda", dtype=torch.bfloat16) for q in r.spec.params]
        outs = torch.ops.comfuse.fused_region(key, [a, b] + ps)
        torch.cuda.synchronize()
        print("  standalone launch ok", [tuple(o.shape) for o in outs], flush=True)
    except Exception as e:
        print("  standalone FAILED:", type(e).__name__, str(e)[:300], flush=True)
with torch.no_grad():
    try:
        y = torch.compile(m, backend="comfuse")(x); torch.cuda.synchronize(); print("graph ok", flush=True)
    except Exception as e:
        print("graph FAILED:", str(e).splitlines()[-1][:300], flush=True)
