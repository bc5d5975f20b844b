"""The norm sites of WORKLOADS.md §1 as whole programs, ComFuse against torch.compile on the identical math, in one run:
examples/llama_block.cf (o_proj + residual, RMSNorm, gate/up, SiLU·mul) and examples/bert_layer.cf (out-proj + bias +
residual, LayerNorm, FFN1 + GELU, FFN2 + bias + the rebuilt residual, LayerNorm), both at 8192 tokens, bf16.

  python3 bench/norm_sites.py [--cli build/bin/comfuse] [--rounds 3] [--out FILE.csv] [--programs llama_block,bert_layer]
      [--variants off,on,auto,on/whole,on/fused,on/ir,on/cfg:1=128x192x64_c2x1_coop] [--logs DIR]

Per program: eager PyTorch, torch.compile default and max-autotune-no-cudagraphs of the package's translation of the
program (comfuse.to_torch; triton.testing.do_bench of the call, median), then `comfuse bench FILE.cf` in each variant
(--defer-norms off, on, and auto: the planner's choice per site; with /fused or /library every region forced to that
form; with /ir the ring form's output written back into the ring, --store-in-ring on; with /whole the row statistics
stored whole by the producer's last tile, --row-parts off; with /cfg:I=NAME+J=NAME regions I and J in those kernel
configs, --config I=NAME,J=NAME, the others the planner's), alternating, `--rounds`
invocations each (the median of each invocation's median; the spread is printed). The table last: ComFuse's time and
torch.compile's best ÷ it (above 1: ComFuse is faster), and each region's kernel alone ÷ its own cuBLASLt GEMM(s)
(`comfuse bench --each-region`; a region with two GEMMs on one A, gate/up, against both). Without a GPU: prints "skipped: no GPU" and exits 77.
"""
import argparse
import csv
import os
import statistics
import sys

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ("llama_block", "bert_layer")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cli", default=f"{ROOT}/build/bin/comfuse")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="CSV file to write")
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--variants", default="off,on",
                   help="--defer-norms off|on|auto, each optionally /fused or /library (every region forced to that "
                        "form) "
                        "or /ir (--store-in-ring on: the ring form's output written back into the ring) "
                        "or /whole (--row-parts off: row statistics stored whole by the producer's last tile) "
                        "or /cfg:I=NAME+J=NAME (--config I=NAME,J=NAME: those regions in those configs)")
    p.add_argument("--logs", default=None, help="folder for each `comfuse bench` output (plan, chosen configs)")
    p.add_argument("--no-torch", action="store_true", help="ComFuse's variants only (no eager or torch.compile times)")
    a = p.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        defer, _, form = v.partition("/")
        known_form = form in ("", "fused", "library", "ir", "whole") or form.startswith("cfg:")
        if defer not in ("off", "on", "auto") or not known_form:
            p.error(f"unknown variant {v!r}: off, on or auto, optionally followed by /fused, /library, /ir, /whole or "
                    f"/cfg:I=NAME")
    if a.logs:
        os.makedirs(a.logs, exist_ok=True)
    programs = [x for x in a.programs.split(",") if x]
    for x in programs:
        if x not in PROGRAMS:
            p.error(f"unknown program {x!r}; choose from {', '.join(PROGRAMS)}")
    import torch
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return SKIP
    from programs import comfuse_bench, torch_us   # (bench/programs.py: the same timing of both sides)
    rows = []
    for name in programs:
        cf = f"{ROOT}/examples/{name}.cf"
        nan = float("nan")
        us = {"eager": nan, "default": nan, "max-autotune-no-cudagraphs": nan} if a.no_torch else torch_us(cf)
        best = min(us["default"], us["max-autotune-no-cudagraphs"])
        runs = {v: [] for v in variants}
        for _ in range(a.rounds):   # the variants alternate
            for v in variants:
                defer, _, form = v.partition("/")
                opts = ["--defer-norms", defer] + (["--store-in-ring", "on"] if form == "ir" else
                                                    ["--row-parts", "off"] if form == "whole" else
                                                    ["--config", form[4:].replace("+", ",")] if form.startswith("cfg:") else
                                                    ["--form", form] if form else [])
                tag = "".join(c if c.isalnum() or c in "_-" else "_" for c in v)
                log = os.path.join(a.logs, f"{name}_{tag}.log") if a.logs else None
                runs[v].append(comfuse_bench(a.cli, cf, opts + ["--each-region"], optional=bool(form), log=log))
        for v, bs in runs.items():
            bs = [b for b in bs if b is not None]
            if not bs:
                continue
            xs = [b["us"] for b in bs]
            med = statistics.median(xs)
            # each region's kernel alone ÷ its cuBLASLt GEMM(s), the median over the rounds: "0:1.105 1:0.962"
            regions = sorted({i for b in bs for i in b["regions"]})
            alone = " ".join(f"{i}:{statistics.median(b['regions'][i] for b in bs if i in b['regions']):.3f}"
                             for i in regions)
            rows.append(dict(program=name, variant=v, comfuse_us=round(med, 1),
                             spread_us=round(max(xs) - min(xs), 1), eager_us=round(us["eager"], 1),
                             compile_default_us=round(us["default"], 1),
                             compile_max_autotune_us=round(us["max-autotune-no-cudagraphs"], 1),
                             best_compile_div_comfuse=round(best / med, 3), regions_div_cublas=alone))
            print(f"measured {rows[-1]}", flush=True)   # (as it goes: a run cut short still tells)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(f"{'program':12} {'variant':11} {'ComFuse us':>11} {'spread':>7} {'eager':>8} {'compile':>8} {'max-at':>8} {'best ÷ ComFuse':>15}  each region alone ÷ its cuBLASLt GEMM(s)")
    for r in rows:
        print(f"{r['program']:12} {r['variant']:11} {r['comfuse_us']:11.1f} {r['spread_us']:7.1f} {r['eager_us']:8.1f} "
              f"{r['compile_default_us']:8.1f} {r['compile_max_autotune_us']:8.1f} {r['best_compile_div_comfuse']:15.3f}"
              f"  {r['regions_div_cublas']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
