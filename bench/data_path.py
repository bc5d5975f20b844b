"""The epilogue's data path as a C++ user meets it: `comfuse bench` of small programs whose epilogue reads a residual
tile and writes one or more outputs, at the shapes of WORKLOADS.md §1, next to cuBLASLt's plain GEMM and its GEMM
with C (beta = 1, in place), which `comfuse bench` times in the same process.

  python3 bench/data_path.py [--cli build/bin/comfuse] [--rounds 3] [--shapes 16384x1024x1024,...]
                             [--programs res,biasres,res2out,resrow] [--variants planner,128x128x64_c1x2_rr,...]
                             [--out FILE.csv] [--logs DIR]
  python3 bench/data_path.py --emit DIR [--shapes ...] [--programs ...]
      writes each program at each shape to DIR/<program>_<MxKxN>.cf and prints "<program>_<MxKxN> <path>" a line
      (what a device script compiles before it checks or times them); no GPU needed

Programs (M x K x N, bf16, X·W with W [K, N]):
  res      h = X·W + R
  biasres  h = X·W + b + R
  res2out  h = X·W + R; y = h * g (g a [N] row vector): two outputs
  resrow   h = X·W + R; s = mean(h², keepdim) in f32: a per-row output
Variants: `planner` (the planner's choice and its config search) or a config name (`--config NAME`: every region in
that config, the fused kernel timed as the fused kernel). They alternate, `--rounds` invocations each; the median of
the invocations' ratios is held to the targets, and the spread (max - min of the invocations) printed. The table
last. Without a GPU: prints "skipped: no GPU" and exits 77.
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile

SKIP = 77
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = ("16384x1024x1024", "8192x1024x1024", "8192x768x768", "8192x3072x768", "8192x4096x4096")
PROGRAMS = {
    "res": ("", "h = add(matmul(X, W), R)\noutput h\n"),
    "biasres": ("input b : bf16[{n}]\n", "h = add(add(matmul(X, W), b), R)\noutput h\n"),
    "res2out": ("input g : bf16[{n}]\n", "h = add(matmul(X, W), R)\ny = mul(h, g)\noutput h, y\n"),
    "resrow": ("", "h = add(matmul(X, W), R)\nhf = cast(h, dtype=f32)\ns = mean(pow(hf, 2.0), dim=-1)\noutput h, s\n"),
}


def program(name, m, k, n):
    extra, body = PROGRAMS[name]
    return (f"# bench/data_path.py: {name} at {m}x{k}x{n}\ninput X : bf16[{m}, {k}]\ninput W : bf16[{k}, {n}]\n"
            f"input R : bf16[{m}, {n}]\n" + extra.format(n=n) + "\n" + body)


def bench(cli, cf, variant, log):
    args = [cli, "bench", cf, "--iters", "50"] + ([] if variant == "planner" else ["--config", variant])
    r = subprocess.run(args, capture_output=True, text=True,
                       env=dict(os.environ, COMFUSE_KERNEL_DIR=os.environ.get("COMFUSE_KERNEL_DIR", f"{ROOT}/kernels")))
    with open(log, "a") as f:
        f.write(f"$ {' '.join(args)}\n{r.stdout}{r.stderr}\n")
    us = re.search(r": median ([0-9.]+) us over", r.stdout)
    plain = re.search(r"alone: ([0-9.]+) us; fused graph ÷ cuBLAS = ([0-9.]+)", r.stdout)
    beta1 = re.search(r"plain GEMM for the rest: ([0-9.]+) us \(([0-9.]+) x the plain\); fused graph ÷ that = ([0-9.]+)",
                      r.stdout)
    config = re.search(r"^config search: .*?: (\S+?),", r.stdout, re.M)
    if r.returncode != 0 or not us or not plain:
        print(f"{' '.join(args)}: exit {r.returncode}, no time:\n{(r.stdout + r.stderr)[-600:]}", file=sys.stderr)
        return None
    return {"us": float(us.group(1)), "cublas_us": float(plain.group(1)), "ratio": float(plain.group(2)),
            "beta1_ratio_plain": float(beta1.group(2)) if beta1 else float("nan"),
            "ratio_beta1": float(beta1.group(3)) if beta1 else float("nan"),
            "config": config.group(1) if config else variant}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cli", default=f"{ROOT}/build/bin/comfuse")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--variants", default="planner,128x128x64_c1x2_rr,128x128x64_c1x2_rg")
    p.add_argument("--out", default=None)
    p.add_argument("--logs", default=None)
    p.add_argument("--emit", default=None, metavar="DIR", help="write the programs' .cf files to DIR and list them")
    a = p.parse_args(argv)
    programs = [x for x in a.programs.split(",") if x]
    for x in programs:
        if x not in PROGRAMS:
            p.error(f"unknown program {x!r}; choose from {', '.join(PROGRAMS)}")
    shapes = []
    for s in a.shapes.split(","):
        try:
            m, k, n = (int(v) for v in s.split("x"))
        except ValueError:
            p.error(f"a shape is MxKxN, got {s!r}")
        shapes.append((m, k, n))
    variants = [v for v in a.variants.split(",") if v]
    if a.emit:
        os.makedirs(a.emit, exist_ok=True)
        for (m, k, n) in shapes:
            for name in programs:
                cf = os.path.join(a.emit, f"{name}_{m}x{k}x{n}.cf")
                with open(cf, "w") as f:
                    f.write(program(name, m, k, n))
                print(f"{name}_{m}x{k}x{n} {cf}")
        return 0
    try:
        gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:   # no driver tools at all
        gpu = False
    if not gpu:
        print("skipped: no GPU")
        return SKIP
    work = tempfile.mkdtemp(prefix="data_path_")
    logs = a.logs or work
    os.makedirs(logs, exist_ok=True)
    rows = []
    for (m, k, n) in shapes:
        for name in programs:
            cf = os.path.join(work, f"{name}_{m}x{k}x{n}.cf")
            with open(cf, "w") as f:
                f.write(program(name, m, k, n))
            runs = {v: [] for v in variants}
            for _ in range(a.rounds):   # the variants alternate
                for v in variants:
                    b = bench(a.cli, cf, v, os.path.join(logs, f"{name}_{m}x{k}x{n}.log"))
                    if b:
                        runs[v].append(b)
            for v in variants:
                if not runs[v]:
                    rows.append({"M": m, "K": k, "N": n, "program": name, "variant": v})
                    continue
                ratios = [b["ratio"] for b in runs[v]]
                rows.append({"M": m, "K": k, "N": n, "program": name, "variant": v, "config": runs[v][-1]["config"],
                             "us": statistics.median(b["us"] for b in runs[v]),
                             "ratio_cublas": statistics.median(ratios), "spread": max(ratios) - min(ratios),
                             "ratio_beta1": statistics.median(b["ratio_beta1"] for b in runs[v]),
                             "beta1_ratio_plain": statistics.median(b["beta1_ratio_plain"] for b in runs[v]),
                             "invocations": len(ratios)})
            for r in rows[-len(variants):]:
                print(f"{m}x{k}x{n} {name:8s} {r['variant']:26s} " +
                      (f"{r['us']:8.1f} us  ÷cuBLASLt {r['ratio_cublas']:.3f} (spread {r['spread']:.3f})  "
                       f"÷beta1 {r['ratio_beta1']:.3f}  [{r['config']}]" if "us" in r else "failed"), flush=True)
    fields = ["M", "K", "N", "program", "variant", "config", "us", "ratio_cublas", "spread", "ratio_beta1",
              "beta1_ratio_plain", "invocations"]
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields, restval="")
            w.writeheader()
            w.writerows({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    print("\n| shape | program | variant | config | µs | ÷ cuBLASLt (spread) | ÷ cuBLASLt β=1 | cuBLASLt β=1 ÷ plain |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "us" not in r:
            print(f"| {r['M']}x{r['K']}x{r['N']} | {r['program']} | {r['variant']} | failed | | | | |")
            continue
        print(f"| {r['M']}x{r['K']}x{r['N']} | {r['program']} | {r['variant']} | {r['config']} | {r['us']:.1f} | "
              f"{r['ratio_cublas']:.3f} ({r['spread']:.3f}) | {r['ratio_beta1']:.3f} | {r['beta1_ratio_plain']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
