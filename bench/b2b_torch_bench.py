"""Back-to-back chains through torch.compile: a DLRM bottom MLP module (65536 x 512 -> 256 -> 64, bf16,
nn.Linear + ReLU twice) and a target-attention module (softmax(q @ k^T * s) @ v written out in ops, B = 1024, Lq = 128,
Lk = 256, D = 64, and the other two WORKLOADS.md §2 shapes), backend="comfuse" against backend="inductor" (default
mode) and eager, in one process.

    python3 bench/b2b_torch_bench.py [--out FILE.csv] [--rounds R] [--iters N]

Per workload: eager; Inductor; ComFuse. Every compiled output is checked against the fp32 computation of the same
module on the same inputs (normwise relative error <= 2e-2), and ComFuse must have run the chain as one
comfuse::fused_chain call (comfuse.inductor.reports()). Timing: CUDA events around N back-to-back calls, the
variants interleaved over R rounds (Inductor, ComFuse, eager, then the reverse order, ...), each variant's median
over the rounds; "speedup" is Inductor's median ÷ ComFuse's. Prints a table last; exit 1 if an output is wrong or
a chain did not fuse. Without a GPU: "skipped: no GPU", exit 77. --cpu-smoke: tiny shapes on the CPU through the
pass's reference implementation (this script's code path, no timing).
"""
import argparse
import csv
import sys

import torch
import torch.nn as nn

SKIP = 77


class TargetAttention(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1) @ v


def dlrm(k, n1, n2):
    return nn.Sequential(nn.Linear(k, n1), nn.ReLU(), nn.Linear(n1, n2), nn.ReLU())


def workloads(cpu: bool):
    if cpu:
        return [("dlrm", dlrm(64, 32, 16), [(96, 64)]), ("attention", TargetAttention(0.25), [(3, 8, 16), (3, 40, 16), (3, 40, 16)])]
    return [("dlrm 65536x512->256->64", dlrm(512, 256, 64), [(65536, 512)]),
            ("attention 1024x128x256x64", TargetAttention(0.125), [(1024, 128, 64), (1024, 256, 64), (1024, 256, 64)]),
            ("attention 512x256x512x64", TargetAttention(0.125), [(512, 256, 64), (512, 512, 64), (512, 512, 64)]),
            ("attention 256x1024x1024x64", TargetAttention(0.125), [(256, 1024, 64), (256, 1024, 64), (256, 1024, 64)])]


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-12))


def timed(fn, xs, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn(*xs)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--cpu-smoke", action="store_true")
    a = ap.parse_args()
    cpu = a.cpu_smoke
    if not cpu and not torch.cuda.is_available():
        print("skipped: no GPU")
        return SKIP
    import comfuse
    from comfuse import inductor

    dev = "cpu" if cpu else "cuda"
    rows, ok = [], True
    for name, model, shapes in workloads(cpu):
        torch.manual_seed(0)
        model = model.to(dev, torch.bfloat16).eval()
        xs = [torch.randn(*s, device=dev, dtype=torch.bfloat16) for s in shapes]
        with torch.no_grad():
            ref = model.float()(*[x.float() for x in xs])
            model = model.to(torch.bfloat16)
            torch._dynamo.reset()
            inductor.reset_reports()
            opts = {"reference": True, "rewrite": "keep"} if cpu else {}
            variants = {"comfuse": torch.compile(model, backend="comfuse", options=opts)}
            out = variants["comfuse"](*xs)
            reps = inductor.reports()
            chains = sum(len(r.fused_chains) for r in reps)
            err = {"comfuse": rel_err(out, ref)}
            torch._dynamo.reset()
            variants["inductor"] = torch.compile(model, backend="inductor")
            err["inductor"] = rel_err(variants["inductor"](*xs), ref)
            variants["eager"] = model
            err["eager"] = rel_err(model(*xs), ref)
            good = chains == 1 and all(e <= 2e-2 for e in err.values())
            ok = ok and good
            us = {k: [] for k in variants}
            if not cpu:
                order = ["inductor", "comfuse", "eager"]
                for v in order:   # warm-up (compiled already; the first calls allocate)
                    timed(variants[v], xs, 3)
                for r in range(a.rounds):
                    for v in (order if r % 2 == 0 else order[::-1]):
                        us[v].append(timed(variants[v], xs, a.iters))
            med = {k: sorted(v)[len(v) // 2] if v else float("nan") for k, v in us.items()}
            row = {"workload": name, "comfuse_us": med["comfuse"], "inductor_us": med["inductor"],
                   "eager_us": med["eager"], "speedup_vs_inductor": med["inductor"] / med["comfuse"],
                   "fused_chains": chains, "err_comfuse": err["comfuse"], "err_inductor": err["inductor"],
                   "ok": good}
            rows.append(row)
            print(f"{name}: comfuse {med['comfuse']:.1f} us, inductor {med['inductor']:.1f} us, eager "
                  f"{med['eager']:.1f} us; fused chains {chains}; rel err {err['comfuse']:.2e} (inductor "
                  f"{err['inductor']:.2e}){'' if good else '  FAIL'}", flush=True)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("\n| workload | ComFuse µs | Inductor µs | eager µs | Inductor ÷ ComFuse | chains fused | rel err |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['comfuse_us']:.1f} | {r['inductor_us']:.1f} | {r['eager_us']:.1f} | "
              f"{r['speedup_vs_inductor']:.2f} | {r['fused_chains']} | {r['err_comfuse']:.1e} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
