"""Back-to-back GEMM chains (back-to-back GEMMs) as a chart for docs/PERF.md: the kernel ÷ its baseline per workload (two
cuBLASLt GEMMs for the MLPs, SDPA's flash kernel for attention), and torch.compile's Inductor ÷ ComFuse per module.

  python3 bench/plot_b2b.py --ratios docs/data/b2b_ratios_2026-12-02.csv --torch docs/data/b2b_torch_2026-12-02.csv \
                            [--out docs/perf-b2b.png] [--title TEXT]

--ratios: workload, baseline, ratio, target, source ('#' lines are comments); each ratio from one run.
--torch:  the CSV of bench/b2b_torch_bench.py (workload, comfuse_us, inductor_us, ..., speedup_vs_inductor).
Prints both as markdown tables; with --out draws two panels with the targets as dashed lines.
"""
import argparse
import csv


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def label(workload: str) -> str:
    """A bar's label in short lines: words, then the shape cut before its first arrow."""
    return workload.replace(" ", "\n").replace("->", "\n->", 1)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--ratios", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--out")
    p.add_argument("--title", default="")
    a = p.parse_args(argv)
    ratios, torch_rows = read(a.ratios), read(a.torch)
    print("| workload | ÷ | ratio | target |\n|---|---|---|---|")
    for r in ratios:
        print(f"| {r['workload']} | {r['baseline']} | {float(r['ratio']):.3f} | ≤ {r['target']} |")
    print("\n| module | Inductor ÷ ComFuse |\n|---|---|")
    for r in torch_rows:
        print(f"| {r['workload']} | {float(r['speedup_vs_inductor']):.2f} |")
    if not a.out:
        return 0
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [7, 4]})
    xs = range(len(ratios))
    colors = ["tab:green" if float(r["ratio"]) <= float(r["target"]) else "tab:red" for r in ratios]
    ax1.bar(xs, [float(r["ratio"]) for r in ratios], color=colors)
    for i, r in enumerate(ratios):
        ax1.hlines(float(r["target"]), i - 0.4, i + 0.4, colors="k", linestyles="dashed")
        ax1.text(i, float(r["ratio"]) + 0.03, f"{float(r['ratio']):.2f}", ha="center", fontsize=8)
    ax1.set_xticks(list(xs), [label(r["workload"]) for r in ratios], fontsize=7)
    ax1.set_ylabel("B2B kernel time ÷ baseline (lower is better)")
    ax1.set_title("kernel ÷ two cuBLASLt GEMMs (MLPs) or SDPA flash (attention); dashed: target", fontsize=9)
    xs2 = range(len(torch_rows))
    sp = [float(r["speedup_vs_inductor"]) for r in torch_rows]
    ax2.bar(xs2, sp, color=["tab:green" if v >= 1.5 else "tab:red" for v in sp])
    ax2.axhline(1.5, color="k", linestyle="dashed")
    for i, v in enumerate(sp):
        ax2.text(i, v + 0.05, f"{v:.2f}", ha="center", fontsize=8)
    ax2.set_xticks(list(xs2), [label(r["workload"]) for r in torch_rows], fontsize=7)
    ax2.set_ylabel("Inductor time ÷ ComFuse time (higher is better)")
    ax2.set_title("torch.compile modules, default mode; dashed: 1.5x target", fontsize=9)
    if a.title:
        fig.suptitle(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
