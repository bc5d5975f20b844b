"""BERT-size post-norm Transformer encoder stacks through torch.compile: backend="comfuse" against
backend="inductor" (default and max-autotune-no-cudagraphs), bf16 inference, in one process (WORKLOADS.md §3).

    python3 bench/bert_bench.py [--models base,large] [--batch 32] [--seq 512] [--modes default,max-autotune]
                                [--comfuse planner,all] [--out FILE.csv] [--budget-s S]

comfuse variants: "planner" is backend="comfuse" as a user gets it (the planner fuses the regions its measured
table says pay); "all" adds options={"fuse": "all"} (every region a kernel can serve, to measure the kernels).

Each model is the standard post-norm encoder layer (self-attention through SDPA, residual + LayerNorm, GELU FFN,
residual + LayerNorm) stacked 12 (base: hidden 768, 12 heads, FFN 3072) or 24 times (large: 1024, 16, 4096).
Timing: triton.testing.do_bench (median, µs). Correctness: every compiled output against eager within bf16
tolerance (normwise relative error printed; never fatal). Without a GPU: "skipped: no GPU", exit 77.
A hidden --cpu-smoke runs a tiny fp32 stack on the CPU (default mode, eager timer) to check the code path.
"""
import argparse
import csv
import logging
import math
import re
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {"base": dict(layers=12, hidden=768, heads=12, ffn=3072),
           "large": dict(layers=24, hidden=1024, heads=16, ffn=4096),
           "smoke": dict(layers=2, hidden=64, heads=4, ffn=128)}
MODES = {"default": None, "max-autotune": "max-autotune-no-cudagraphs"}


class EncoderLayer(nn.Module):
    """Post-norm: x = LN(x + Attn(x)); x = LN(x + FFN(x)) (BERT)."""

    def __init__(self, hidden, heads, ffn):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.proj(a))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x), approximate="tanh")))


class Encoder(nn.Module):
    def __init__(self, layers, hidden, heads, ffn):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="base,large")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--modes", default="default,max-autotune", help="inductor modes to compare with")
    p.add_argument("--comfuse", default="planner,all", help="comfuse variants: planner, all")
    p.add_argument("--out", default=None)
    p.add_argument("--budget-s", type=float, default=math.inf, help="stop starting new models after S seconds")
    p.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in models:
        if m not in CONFIGS:
            p.error(f"unknown model {m!r} (base, large)")
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r} (default, max-autotune)")
    if a.cpu_smoke:
        device, dtype, models, modes, batch, seq = "cpu", torch.float32, ["smoke"], ["default"], 2, 16

        def bench(fn):
            fn()
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
    else:
        if not torch.cuda.is_available():
            print("skipped: no GPU")
            return 77
        from triton.testing import do_bench

        device, dtype, batch, seq = "cuda", torch.bfloat16, a.batch, a.seq

        def bench(fn):
            return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1000
    class Count(logging.Handler):   # how many regions each comfuse variant runs as ComFuse kernels
        fused = 0

        def emit(self, r):
            m = re.search(r"(\d+) region\(s\) run as ComFuse kernels", r.getMessage())
            if m:
                Count.fused += int(m.group(1))

    logging.getLogger("comfuse").addHandler(Count())
    logging.getLogger("comfuse").setLevel(logging.INFO)
    cf_variants = [v.strip() for v in a.comfuse.split(",") if v.strip()]
    t0 = time.perf_counter()
    rows = []
    for name in models:
        if time.perf_counter() - t0 > a.budget_s:
            print(f"budget spent: stopping before {name}")
            break
        torch.manual_seed(0)
        model = Encoder(**CONFIGS[name]).to(device, dtype).eval()
        x = torch.randn(batch, seq, CONFIGS[name]["hidden"], device=device, dtype=dtype)
        row = {"model": name, "batch": batch, "seq": seq}
        with torch.no_grad():
            ref = model(x)
            row["eager_us"] = bench(lambda: model(x))
            variants = [("comfuse" if v == "planner" else f"comfuse_{v}",
                         dict(backend="comfuse", options={"fuse": v})) for v in cf_variants]
            variants += [(f"inductor_{m}", dict(backend="inductor", mode=MODES[m])) for m in modes]
            for label, kw in variants:
                torch._dynamo.reset()
                Count.fused = 0
                tc = time.perf_counter()
                try:
                    compiled = torch.compile(model, **kw)
                    out = compiled(x)
                    row[f"{label}_compile_s"] = time.perf_counter() - tc
                    row[f"{label}_us"] = bench(lambda: compiled(x))
                    row[f"{label}_err"] = rel(out, ref)
                except Exception as e:   # one failing variant must not cost the others' numbers
                    row[f"{label}_us"] = math.nan
                    print(f"{name}: {label}: FAILED: {type(e).__name__}: {str(e).splitlines()[-1][:300]}", flush=True)
                    continue
                if label.startswith("comfuse"):
                    row[f"{label}_kernels"] = Count.fused
                print(f"{name}: {label}: {row[f'{label}_us']:.0f} us, compile {row[f'{label}_compile_s']:.0f} s, "
                      f"rel err vs eager {row[f'{label}_err']:.2e}" +
                      (f", {Count.fused} region(s) as ComFuse kernels" if label.startswith("comfuse") else ""),
                      flush=True)
        best = min((row[f"inductor_{m}_us"] for m in modes), key=lambda v: math.inf if math.isnan(v) else v)
        for v in cf_variants:
            label = "comfuse" if v == "planner" else f"comfuse_{v}"
            row[f"{label}_speedup_vs_inductor_best"] = best / row[f"{label}_us"]
            print(f"{name}: {label} {row[f'{label}_us']:.0f} us, inductor best {best:.0f} us: "
                  f"{row[f'{label}_speedup_vs_inductor_best']:.3f}x", flush=True)
        rows.append(row)
        del model, x
        if device == "cuda":
            torch.cuda.empty_cache()
    if a.out and rows:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
