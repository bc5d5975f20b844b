"""The norm sites of WORKLOADS.md §1 as whole programs, ComFuse against torch.compile on the identical math, in one run:
examples/llama_block.cf (o_proj + residual, RMSNorm, gate/up, SiLU·mul) and examples/bert_layer.cf (out-proj + bias +
residual, LayerNorm, FFN1 + GELU, FFN2 + bias + the rebuilt residual, LayerNorm), both at 8192 tokens, bf16.

  python3 bench/norm_sites.py [--cli build/bin/comfuse] [--rounds 3] [--out FILE.csv] [--programs llama_block,bert_layer]

Per program: eager PyTorch, torch.compile default and max-autotune-no-cudagraphs of the package's translation of the
program (comfuse.to_torch; triton.testing.do_bench of the call, median), then `comfuse bench FILE.cf` with --defer-norms off and on, alternating, `--rounds` invocations each (the
median of each invocation's median; the spread is printed). The table last: ComFuse's time and torch.compile's best ÷
it (above 1: ComFuse is faster). Without a GPU: prints "skipped: no GPU" and exits 77.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
PROGRAMS = ("llama_block", "bert_layer")


def comfuse_us(cli, cf, defer):
    """`comfuse bench` of the program: its median in µs."""
    r = subprocess.run([cli, "bench", cf, "--defer-norms", defer], capture_output=True, text=True,
                       env=dict(os.environ, COMFUSE_KERNEL_DIR=os.environ.get("COMFUSE_KERNEL_DIR", f"{ROOT}/kernels")))
    m = re.search(r": median ([0-9.]+) us over", r.stdout)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"comfuse bench {cf} --defer-norms {defer} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return float(m.group(1))


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cli", default=f"{ROOT}/build/bin/comfuse")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="CSV file to write")
    p.add_argument("--programs", default=",".join(PROGRAMS))
    a = p.parse_args(argv)
    programs = [x for x in a.programs.split(",") if x]
    for x in programs:
        if x not in PROGRAMS:
            p.error(f"unknown program {x!r}; choose from {', '.join(PROGRAMS)}")
    import torch
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return SKIP
    from triton.testing import do_bench
    rows = []
    for name in programs:
        cf = f"{ROOT}/examples/{name}.cf"
        from comfuse import _core as C
        from comfuse import to_torch
        with open(cf) as f:
            g = C.parse_cf(f.read(), cf)
        fn = to_torch.function(g)
        t = to_torch.random_inputs(g, "cuda")
        us = {"eager": do_bench(lambda: fn(t), warmup=25, rep=100)}
        for mode in ("default", "max-autotune-no-cudagraphs"):
            torch._dynamo.reset()
            c = torch.compile(fn, mode=None if mode == "default" else mode)
            c(t)
            us[mode] = do_bench(lambda: c(t), warmup=25, rep=100)
        best = min(us["default"], us["max-autotune-no-cudagraphs"])
        runs = {"off": [], "on": []}
        for _ in range(a.rounds):   # the two forms alternate
            for defer in ("off", "on"):
                runs[defer].append(comfuse_us(a.cli, cf, defer))
        for defer, xs in runs.items():
            med = statistics.median(xs)
            rows.append(dict(program=name, defer_norms=defer, comfuse_us=round(med, 1),
                             spread_us=round(max(xs) - min(xs), 1), eager_us=round(us["eager"] * 1e3, 1),
                             compile_default_us=round(us["default"] * 1e3, 1),
                             compile_max_autotune_us=round(us["max-autotune-no-cudagraphs"] * 1e3, 1),
                             best_compile_div_comfuse=round(best * 1e3 / med, 3)))
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(f"{'program':12} {'defer':5} {'ComFuse us':>11} {'spread':>7} {'eager':>8} {'compile':>8} {'max-at':>8} {'best ÷ ComFuse':>15}")
    for r in rows:
        print(f"{r['program']:12} {r['defer_norms']:5} {r['comfuse_us']:11.1f} {r['spread_us']:7.1f} {r['eager_us']:8.1f} "
              f"{r['compile_default_us']:8.1f} {r['compile_max_autotune_us']:8.1f} {r['best_compile_div_comfuse']:15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
