"""ComFuse vs torch.compile on the GEMM + epilogue workloads (WORKLOADS.md §1), as time ÷ cuBLAS GEMM alone.

  python3 bench/plot_perf.py --bench DIR/bench.csv --torch torch.csv [--out perf.png] [--title "2026-11-30 abc1234"]

--bench: the CSV of bench/bench_gemm (one "cublas" row per shape, then one row per kernel instance, each with
         its epilogue); ComFuse = the fastest instance of an epilogue ÷ the cuBLAS row of the same run.
--torch: the CSV of bench/torch_compile_ref.py; torch.compile = min(default, max-autotune) ÷ that row's gemm_us.
Each ratio comes from one run only; absolute times from the two runs are never divided by each other.

Prints a markdown table (for docs/PERF.md) and, with --out, draws one subplot per epilogue: grouped bars per
shape, with the 1.03 target as a dashed line. Either input may be left out.
"""
import argparse
import csv
import math
import sys

EPILOGUES = ["postnorm", "rmsnorm", "softmax", "bias_gelu", "ln_softmax"]
TARGET = 1.03


def read_csv(path):
    """[((M, K, N), row)] of a CSV with '#' comment lines, and the shapes in their first-seen order."""
    with open(path, newline="") as f:
        rows = [((int(r["M"]), int(r["K"]), int(r["N"])), r)
                for r in csv.DictReader(line for line in f if not line.startswith("#"))]
    return rows, list(dict.fromkeys(shape for shape, _ in rows))


def read_bench(path):
    """{(M,K,N): {epilogue: (us, ratio, config)}} with the best instance of every plotted epilogue."""
    cublas, best = {}, {}
    rows, order = read_csv(path)
    for shape, row in rows:
        us = float(row["us"])
        if row["variant"] == "cublas":
            cublas[shape] = us
            continue
        epi = row["epilogue"]
        if epi not in EPILOGUES or math.isnan(us):
            continue
        cur = best.setdefault(shape, {}).get(epi)
        if cur is None or us < cur[0]:
            tp = row.get("transport") or "-"
            best[shape][epi] = (us, row["config"] + ("" if tp == "-" else " " + tp))
    out = {}
    for shape, epis in best.items():
        if shape not in cublas:
            print(f"warning: {path}: no cublas row for {shape}; its ComFuse rows are left out", file=sys.stderr)
            continue
        out[shape] = {e: (us, us / cublas[shape], cfg) for e, (us, cfg) in epis.items()}
    return out, order


def read_torch(path):
    """{(M,K,N): {epilogue: (best compiled us, ratio to gemm_us, which mode)}}."""
    out = {}
    rows, order = read_csv(path)
    for shape, row in rows:
        gemm = float(row["gemm_us"])
        cands = [(float(row[c]), m) for c, m in (("compile_default_us", "default"),
                                                  ("compile_max_autotune_us", "max-autotune"))]
        cands = [(us, m) for us, m in cands if not math.isnan(us)]
        if not cands or math.isnan(gemm):
            continue
        us, mode = min(cands)
        epis = out.setdefault(shape, {})
        if row["epilogue"] in epis:
            print(f"warning: {path}: {shape} {row['epilogue']} appears twice; the last row is used",
                  file=sys.stderr)
        epis[row["epilogue"]] = (us, us / gemm, mode)
    return out, order


def shape_label(s):
    return f"{s[0]}×{s[1]}×{s[2]}"


def markdown(cases):
    lines = ["| M, K, N | epilogue | ComFuse µs | ComFuse ÷GEMM | torch.compile best ÷GEMM | speedup |",
             "|---|---|---|---|---|---|"]
    speedups = []
    for shape, epi, cf, tc in cases:
        cf_us = f"{cf[0]:.1f}" if cf else "-"
        cf_r = f"{cf[1]:.3f}" if cf else "-"
        tc_r = f"{tc[1]:.3f}" if tc else "-"
        if cf and tc:
            sp = tc[1] / cf[1]
            speedups.append(sp)
            sp_s = f"{sp:.2f}×"
        else:
            sp_s = "-"
        lines.append(f"| {shape[0]}, {shape[1]}, {shape[2]} | {epi} | {cf_us} | {cf_r} | {tc_r} | {sp_s} |")
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        lines.append("")
        lines.append(f"Geomean speedup over torch.compile: {geo:.2f}× ({len(speedups)} cases).")
    met = [cf[1] <= TARGET for _, _, cf, _ in cases if cf]
    if met:
        lines.append(f"ComFuse within the {TARGET} target: {sum(met)} of {len(met)} cases.")
    return "\n".join(lines)


def plot(cases, shapes, epis, out, title):
    import matplotlib
    matplotlib.use("Agg")   # files only; the machines have no display
    import matplotlib.pyplot as plt

    by = {(s, e): (cf, tc) for s, e, cf, tc in cases}
    ncols = min(len(epis), 3)
    nrows = math.ceil(len(epis) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.2 * nrows), squeeze=False)
    width = 0.38
    series = [("ComFuse best", 0, "tab:blue"), ("torch.compile best", 1, "tab:orange")]
    for ax, epi in zip(axes.flat, epis):
        top = TARGET
        for name, idx, color in series:
            xs, ys = [], []
            for i, s in enumerate(shapes):
                v = by.get((s, epi), (None, None))[idx]
                if v is not None:
                    xs.append(i + (idx - 0.5) * width)
                    ys.append(v[1])
            bars = ax.bar(xs, ys, width, label=name, color=color)
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
            top = max([top] + ys)
        ax.axhline(TARGET, color="black", linestyle="--", linewidth=1, label=f"target {TARGET}")
        ax.set_title(epi)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([shape_label(s) for s in shapes], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("time ÷ cuBLAS GEMM")
        ax.set_ylim(0, top * 1.12)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(epis):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
    head = "GEMM + epilogue: time ÷ cuBLAS GEMM alone (lower is better)"
    fig.suptitle(f"{head}\n{title}" if title else head)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=130)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", help="bench.csv written by bench_gemm --out DIR")
    p.add_argument("--torch", help="CSV written by bench/torch_compile_ref.py --out")
    p.add_argument("--out", help="PNG to write (no plot without it)")
    p.add_argument("--title", default="", help="second title line, e.g. date, commit and device")
    args = p.parse_args(argv)
    if not args.bench and not args.torch:
        p.error("give --bench, --torch or both")

    cf, cf_order = read_bench(args.bench) if args.bench else ({}, [])
    tc, tc_order = read_torch(args.torch) if args.torch else ({}, [])
    # Shapes in the order the bench ran them, then any the torch run alone has.
    shapes = [s for s in cf_order if s in cf] + [s for s in tc_order if s in tc and s not in cf]
    epis = [e for e in EPILOGUES if any(e in d.get(s, {}) for d in (cf, tc) for s in shapes)]
    cases = [(s, e, cf.get(s, {}).get(e), tc.get(s, {}).get(e)) for s in shapes for e in epis]
    cases = [c for c in cases if c[2] or c[3]]
    if not cases:
        print("no GEMM + epilogue rows found", file=sys.stderr)
        return 1

    print(markdown(cases))
    if args.out:
        plot(cases, shapes, epis, args.out, args.title)
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
