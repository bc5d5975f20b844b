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
import glob
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The source tree's package where its extension was built for this Python (scripts/setup.sh), else the installed one
# (on the device: `pip install --no-build-isolation --no-deps .` with the image's own Python).
if glob.glob(os.path.join(ROOT, "python", "comfuse", f"_core.cpython-{sys.version_info[0]}{sys.version_info[1]}*")):
    sys.path.insert(0, os.path.join(ROOT, "python"))
NAMED = ("postnorm", "rmsnorm", "softmax", "ln_softmax", "bias_gelu", "bert_layer", "llama_block")
FORMS = ("planner", "fused", "library")


def comfuse_bench(cli, cf, options=(), optional=False, log=None):
    """`comfuse bench FILE.cf OPTIONS...`: {"us": its median in µs, "pass_us", "copy_us" (where every region runs a
    library pass: the passes' time, the graph less its cuBLASLt GEMMs, and a device copy of the bytes they move; else
    nan), "regions" (with --each-region: {region: its kernel alone ÷ its cuBLASLt GEMM(s)})}. optional: None where it fails (e.g. a region no pass serves under
    --form library: that variant has no time), else the failure is raised. log: a file the output is appended to."""
    args = [cli, "bench", cf, "--iters", "50", *options]
    r = subprocess.run(args, capture_output=True, text=True,
                       env=dict(os.environ, COMFUSE_KERNEL_DIR=os.environ.get("COMFUSE_KERNEL_DIR", f"{ROOT}/kernels")))
    if log:   # the whole output: the plan, the configs the search chose, every kernel's median
        with open(log, "a") as f:
            f.write(f"$ {' '.join(args)}\n{r.stdout}{r.stderr}\n")
    m = re.search(r": median ([0-9.]+) us over", r.stdout)
    if r.returncode != 0 or not m:
        if optional:
            print(f"{' '.join(args)}: exit {r.returncode}, no time for this variant:\n{r.stdout[-400:]}", file=sys.stderr)
            return None
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    out = {"us": float(m.group(1)), "pass_us": math.nan, "copy_us": math.nan, "regions": {}}
    # (--each-region) each region's kernel alone ÷ its own cuBLASLt GEMM(s): {region: ratio}
    for i, ratio in re.findall(r"^  region ([0-9]+): cuBLASLt .*; its kernel alone .*÷ cuBLAS = ([0-9.]+)", r.stdout, re.M):
        out["regions"][int(i)] = float(ratio)
    p = re.search(r"the passes take ~(-?[0-9.]+) us .* take ([0-9.]+) us as a device copy", r.stdout)
    if p:
        out["pass_us"], out["copy_us"] = float(p.group(1)), float(p.group(2))
    return out


def comfuse_us(cli, cf, options=(), optional=False, log=None):
    """comfuse_bench's median alone (None where an optional variant failed)."""
    b = comfuse_bench(cli, cf, options, optional, log)
    return None if b is None else b["us"]


def inductor_epilogue_us(cf, device="cuda"):
    """The program's epilogue alone under torch.compile (default mode): every matmul's output given as an input
    (comfuse.to_torch.function(.., given=matmul names)), so Inductor fuses the rest into its own pass(es). Median µs
    of do_bench; the pass the library form's generated pass is held to."""
    import torch
    from triton.testing import do_bench
    from comfuse import _core as C
    from comfuse import to_torch
    with open(cf) as f:
        g = C.parse_cf(f.read(), cf)
    mm = to_torch.matmul_names(g)
    t = {**to_torch.random_inputs(g, device), **to_torch.given_inputs(g, mm, device)}
    torch._dynamo.reset()
    c = torch.compile(to_torch.function(g, given=mm))
    c(t)
    return do_bench(lambda: c(t), warmup=25, rep=100) * 1e3


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
    p.add_argument("--passes", action="store_true",
                   help="also the library form's generated pass alone against a device copy and Inductor's pass for "
                        "the same epilogue (the named programs)")
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
    writer = None
    if a.out:   # a row per program as it is measured: a run cut short keeps what it measured
        out_file = open(a.out, "w", newline="")
    for name, cf, is_named in programs:
        tu = torch_us(cf)
        best = min(tu["default"], tu["max-autotune-no-cudagraphs"])
        runs = {f: [] for f in FORMS}
        passes = []   # (pass µs, copy µs) of the library form's invocations
        for _ in range(a.rounds):   # the forms alternate
            for form in FORMS:
                b = comfuse_bench(a.cli, cf, [] if form == "planner" else ["--form", form], optional=form != "planner")
                runs[form].append(None if b is None else b["us"])
                if form == "library" and b is not None:
                    passes.append((b["pass_us"], b["copy_us"]))
        med = {f: statistics.median(xs) if None not in xs else math.nan for f, xs in runs.items()}
        pass_us = statistics.median(x for x, _ in passes) if passes else math.nan
        copy_us = statistics.median(y for _, y in passes) if passes else math.nan
        ind_us = inductor_epilogue_us(cf) if a.passes and is_named and not math.isnan(pass_us) else math.nan
        fastest = min(x for x in (med["fused"], med["library"], med["planner"]) if not math.isnan(x))
        rows.append(dict(program=name, named=int(is_named),
                         comfuse_us=round(med["planner"], 1), spread_us=round(max(runs["planner"]) - min(runs["planner"]), 1),
                         fused_us=round(med["fused"], 1), library_us=round(med["library"], 1),
                         eager_us=round(tu["eager"], 1), compile_default_us=round(tu["default"], 1),
                         compile_max_autotune_us=round(tu["max-autotune-no-cudagraphs"], 1),
                         best_compile_div_comfuse=round(best / med["planner"], 3),
                         form_within_3pct=int(med["planner"] <= 1.03 * fastest),
                         pass_us=round(pass_us, 1), copy_us=round(copy_us, 1),
                         pass_div_copy=round(pass_us / copy_us, 3) if copy_us == copy_us else math.nan,
                         inductor_pass_us=round(ind_us, 1)))
        print(f"measured {name}: {rows[-1]}", flush=True)
        if a.out:
            if writer is None:
                writer = csv.DictWriter(out_file, fieldnames=list(rows[0]))
                writer.writeheader()
            writer.writerow(rows[-1])
            out_file.flush()
    if a.out:
        out_file.close()
    print(f"{'program':16} {'ComFuse':>8} {'spread':>7} {'fused':>8} {'library':>8} {'eager':>8} {'compile':>8} "
          f"{'max-at':>8} {'best÷CF':>8} {'form ok':>7}")
    for r in rows:
        print(f"{r['program']:16} {r['comfuse_us']:8.1f} {r['spread_us']:7.1f} {r['fused_us']:8.1f} {r['library_us']:8.1f} "
              f"{r['eager_us']:8.1f} {r['compile_default_us']:8.1f} {r['compile_max_autotune_us']:8.1f} "
              f"{r['best_compile_div_comfuse']:8.3f} {'yes' if r['form_within_3pct'] else 'NO':>7}")
    if a.passes:
        print(f"\n{'program':16} {'pass':>8} {'copy':>8} {'pass÷copy':>9} {'Inductor':>9} {'ok':>4}   "
              f"(the library form's generated pass alone; target: ÷ copy <= 1.15 and <= Inductor's pass)")
        for r in rows:
            if r["named"] and r["pass_us"] == r["pass_us"]:
                ok = r["pass_div_copy"] <= 1.15 and r["pass_us"] <= r["inductor_pass_us"]
                print(f"{r['program']:16} {r['pass_us']:8.1f} {r['copy_us']:8.1f} {r['pass_div_copy']:9.3f} "
                      f"{r['inductor_pass_us']:9.1f} {'yes' if ok else 'NO':>4}")
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
