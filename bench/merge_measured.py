#!/usr/bin/env python3
"""Adds the rows of new instances to the planner's measured table (src/plan/measured.csv) without re-running the
whole bench: each new row keeps the ratio to cuBLASLt measured in its own run (the median over the given runs) and
takes its microseconds from the table's cuBLASLt time for that shape, so it compares with the table's other rows
as ratios do. Rows whose config already appears in the table are replaced.

    bench/merge_measured.py --table src/plan/measured.csv --suffix _rr RUN1.csv [RUN2.csv ...] --note "..."

RUN*.csv: comfuse_gpu_bench --out DIR's bench.csv. Only configs ending in --suffix (an instance form, e.g. "_rr";
"" takes every config) are taken.

    --replace-measured: replace only the rows the runs measured (same shape and variant) and keep every other row,
    e.g. after a kernel change that affects some instances at some shapes (re-run just those).
"""
import argparse
import csv
import io
import statistics
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", required=True)
    ap.add_argument("--suffix", required=True, help="config suffix of the rows to merge, e.g. _rr")
    ap.add_argument("--note", required=True, help="a comment line recording where the merged rows come from")
    ap.add_argument("--replace-measured", action="store_true",
                    help="replace only the (shape, variant) rows the runs measured; keep the rest of the table")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()

    with open(a.table) as f:
        lines = f.read().splitlines()
    comments = [l for l in lines if l.startswith("#")]
    body = [l for l in lines if not l.startswith("#")]
    header = body[0].split(",")
    table = list(csv.DictReader(io.StringIO("\n".join(body))))
    cublas = {(r["M"], r["K"], r["N"]): float(r["us"]) for r in table if r["variant"] == "cublas"}

    ratios: dict = {}
    sample: dict = {}
    for run in a.runs:
        for r in csv.DictReader(open(run)):
            if not r["config"].endswith(a.suffix) or r["variant"] == "cublas" or float(r["us"]) <= 0:
                continue
            key = (r["M"], r["K"], r["N"], r["variant"])
            ratios.setdefault(key, []).append(float(r["ratio_cublas"]))
            sample[key] = r
    if not ratios:
        print(f"merge_measured: no rows with a config ending in {a.suffix}", file=sys.stderr)
        return 1
    if a.replace_measured:
        keep = [r for r in table if (r["M"], r["K"], r["N"], r["variant"]) not in ratios]
    else:
        keep = [r for r in table if not r["config"].endswith(a.suffix)]
    added = 0
    for key, rs in sorted(ratios.items()):
        shape = key[:3]
        if shape not in cublas:
            print(f"merge_measured: no cuBLASLt row for {'x'.join(shape)} in the table; skipped {key[3]}", file=sys.stderr)
            continue
        r = dict(sample[key])
        ratio = statistics.median(rs)
        r["ratio_cublas"] = f"{ratio:.4f}"
        r["us"] = f"{ratio * cublas[shape]:.2f}"
        flops = 2.0 * int(r["M"]) * int(r["K"]) * int(r["N"])
        r["tflops"] = f"{flops / (float(r['us']) * 1e-6) / 1e12:.1f}"
        keep.append(r)
        added += 1
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=header, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in keep:
        w.writerow(r)
    with open(a.table, "w") as f:
        f.write("\n".join(comments + ["# " + a.note]) + "\n" + out.getvalue())
    print(f"merge_measured: {added} rows ({a.suffix}) merged into {a.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
