"""The norm sites of WORKLOADS.md §1 as whole programs, ComFuse against torch.compile on the identical math, in one run:
examples/llama_block.cf (o_proj + residual, RMSNorm, gate/up, SiLU·mul) and examples/bert_layer.cf (out-proj + bias +
residual, LayerNorm, FFN1 + GELU, FFN2 + bias + the rebuilt residual, LayerNorm), both at 8192 tokens, bf16.

  python3 bench/norm_sites.py [--cli build/bin/comfuse] [--rounds 3] [--out FILE.csv] [--programs llama_block,bert_layer]

Per program: eager PyTorch, torch.compile default and max-autotune-no-cudagraphs (triton.testing.do_bench of the call,
median), then `comfuse bench FILE.cf` with --defer-norms off and on, alternating, `--rounds` invocations each (the
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
PROGRAMS = ("llama_block", "bert_layer")


def llama_block(t):
    """examples/llama_block.cf: returns (h, m)."""
    import torch
    import torch.nn.functional as F
    h = t["A"] @ t["Wo"].t() + t["R"]
    y = F.rms_norm(h, (h.shape[-1],), t["g"], 1e-6)
    return h, F.silu(y @ t["Wg"].t()) * (y @ t["Wu"].t())


def bert_layer(t):
    """examples/bert_layer.cf: returns out."""
    import torch.nn.functional as F
    h = t["A"] @ t["Wo"].t() + t["bo"] + t["R"]
    y = F.layer_norm(h, (h.shape[-1],), t["g1"], t["b1"], 1e-12)
    f = F.gelu(y @ t["W1"].t() + t["c1"])
    h2 = f @ t["W2"].t() + t["c2"] + y
    return F.layer_norm(h2, (h2.shape[-1],), t["g2"], t["b2"], 1e-12)


def inputs_of(cf_path, device):
    """Random bf16 tensors for every `input NAME : bf16[...]` of the .cf file (weights scaled by 1/sqrt(fan-in), norm
    weights near 1)."""
    import torch
    t = {}
    for line in open(cf_path):
        m = re.match(r"input (\w+) : bf16\[([0-9, ]+)\]", line)
        if not m:
            continue
        shape = [int(x) for x in m.group(2).split(",")]
        x = torch.randn(shape, device=device)
        name = m.group(1)
        if name.startswith("W"):
            x = x / shape[-1] ** 0.5
        if name.startswith("g"):
            x = 1 + 0.1 * x
        t[name] = x.to(torch.bfloat16)
    return t


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
        fn = {"llama_block": llama_block, "bert_layer": bert_layer}[name]
        t = inputs_of(cf, "cuda")
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
