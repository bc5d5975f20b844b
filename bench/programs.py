"""Whole C++ programs against torch.compile on the identical math, in one run: the examples (postnorm, rmsnorm, softmax,
ln_softmax, bias_gelu), the two norm sites (examples/bert_layer.cf, examples/llama_block.cf) and random programs with
row reductions (comfuse_random_graphs --bench: 8192 rows, K and N from 768 to 4096, a fixed seed).

  python3 bench/programs.py [--cli build/bin/comfuse] [--rounds 3] [--random 20] [--seed 20261205] [--out FILE.csv]
                            [--programs postnorm,bert_layer,...]

The torch side is the package's own translation of each .cf program (comfuse.to_torch, each op in its declared dtype,
as eager PyTorch runs it): eager, torch.compile default and max-autotune-no-cudagraphs, each timed by
triton.testing.do_bench of the call (wall clock, median). The ComFuse side is `comfuse bench FILE.cf` in three forms,
alternating, `--rounds` invocations each (the median of the invocations' medians; the spread is printed): the
planner's choice, every region fused (--form fused) and every region in the library form (--form library: cuBLASLt's
GEMM + the generated pass).

The table last, per program: the three ComFuse times, torch.compile's best, best ÷ ComFuse (above 1: ComFuse is
faster), and whether the planner's choice is within 3% of the faster form. Then the geometric mean over the named
programs (not the random ones) and the programs under 0.97. Without a GPU: prints "skipped: no GPU" and exits 77.
"""
import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
NAMED = ("postnorm", "rmsnorm", "softmax", "ln_softmax", "bias_gelu", "bert_layer", "llama_block")
FORMS = ("planner", "fused", "library")


def comfuse_us(cli, cf, options=(), optional=False):
    """`comfuse bench FILE.cf OPTIONS...`: its median in µs. optional: None where it fails (e.g. a region no pass
    serves under --form library: that variant has no time), else the failure is raised."""
    args = [cli, "bench", cf, "--iters", "50", *options]
    r = subprocess.run(args, capture_output=True, text=True,
                       env=dict(os.environ, COMFUSE_KERNEL_DIR=os.environ.get("COMFUSE_KERNEL_DIR", f"{ROOT}/kernels")))
    m = re.search(r": median ([0-9.]+) us over", r.stdout)
    if r.returncode != 0 or not m:
        if optional:
            print(f"{' '.join(args)}: exit {r.returncode}, no time for this variant:\n{r.stdout[-400:]}", file=sys.stderr)
            return None
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return float(m.group(1))


def torch_us(cf, device="cuda"):
    """eager, torch.compile default and max-autotune-no-cudagraphs of the program's translation: median µs each."""
    import torch
    from triton.testing import do_bench
    from comfuse import _core as C
    from comfuse import to_torch
    with open(cf) as f:
        g = C.parse_cf(f.read(), cf)
    fn = to_torch.function(g)
    t = to_torch.random_inputs(g, device)
    us = {"eager": do_bench(lambda: fn(t), warmup=25, rep=100)}
    for mode in ("default", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        c = torch.compile(fn, mode=None if mode == "default" else mode)
        c(t)
        us[mode] = do_bench(lambda: c(t), warmup=25, rep=100)
    return {k: v * 1e3 for k, v in us.items()}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cli", default=f"{ROOT}/build/bin/comfuse")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--random", type=int, default=20, help="random programs with row reductions (0: none)")
    p.add_argument("--seed", type=int, default=20261205)
    p.add_argument("--out", default=None, help="CSV file to write")
    p.add_argument("--programs", default=",".join(NAMED))
    a = p.parse_args(argv)
    named = [x for x in a.programs.split(",") if x]
    for x in named:
        if x not in NAMED:
            p.error(f"unknown program {x!r}; choose from {', '.join(NAMED)}")
    import torch
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return SKIP
    programs = [(x, f"{ROOT}/examples/{x}.cf", True) for x in named]
    tmp = tempfile.mkdtemp(prefix="comfuse-programs-")
    if a.random > 0:
        gen = os.path.join(os.path.dirname(a.cli), "comfuse_random_graphs")
        subprocess.run([gen, "--count", str(a.random), "--bench", "--seed", str(a.seed), "-o", tmp], check=True)
        programs += [(f"random/{f[:-3]}", os.path.join(tmp, f), False) for f in sorted(os.listdir(tmp)) if f.endswith(".cf")]
    rows = []
    for name, cf, is_named in programs:
        tu = torch_us(cf)
        best = min(tu["default"], tu["max-autotune-no-cudagraphs"])
        runs = {f: [] for f in FORMS}
        for _ in range(a.rounds):   # the forms alternate
            for form in FORMS:
                runs[form].append(comfuse_us(a.cli, cf, [] if form == "planner" else ["--form", form],
                                             optional=form != "planner"))
        med = {f: statistics.median(xs) if None not in xs else math.nan for f, xs in runs.items()}
        fastest = min(x for x in (med["fused"], med["library"], med["planner"]) if not math.isnan(x))
        rows.append(dict(program=name, named=int(is_named),
                         comfuse_us=round(med["planner"], 1), spread_us=round(max(runs["planner"]) - min(runs["planner"]), 1),
                         fused_us=round(med["fused"], 1), library_us=round(med["library"], 1),
                         eager_us=round(tu["eager"], 1), compile_default_us=round(tu["default"], 1),
                         compile_max_autotune_us=round(tu["max-autotune-no-cudagraphs"], 1),
                         best_compile_div_comfuse=round(best / med["planner"], 3),
                         form_within_3pct=int(med["planner"] <= 1.03 * fastest)))
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(f"{'program':16} {'ComFuse':>8} {'spread':>7} {'fused':>8} {'library':>8} {'eager':>8} {'compile':>8} "
          f"{'max-at':>8} {'best÷CF':>8} {'form ok':>7}")
    for r in rows:
        print(f"{r['program']:16} {r['comfuse_us']:8.1f} {r['spread_us']:7.1f} {r['fused_us']:8.1f} {r['library_us']:8.1f} "
              f"{r['eager_us']:8.1f} {r['compile_default_us']:8.1f} {r['compile_max_autotune_us']:8.1f} "
              f"{r['best_compile_div_comfuse']:8.3f} {'yes' if r['form_within_3pct'] else 'NO':>7}")
    ratios = [r["best_compile_div_comfuse"] for r in rows if r["named"]]
    if ratios:
        print(f"geometric mean over the named programs: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} "
              f"(target >= 1.15)")
    low = [r["program"] for r in rows if r["best_compile_div_comfuse"] < 0.97]
    print(f"programs under 0.97: {', '.join(low) if low else 'none'}")
    wrong = [r["program"] for r in rows if not r["form_within_3pct"]]
    print(f"planner's form more than 3% slower than the other: {', '.join(wrong) if wrong else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
