# Where the warps of one kernel stall, from an Nsight Compute source-page export:
#   ncu -i REPORT --page source --csv --print-source sass > sass.csv   (scripts/gpu-check.sh --ncu writes it)
#   python3 bench/ncu_stalls.py sass.csv [N]
# Prints the stall reasons over all warp samples, then the N hottest SASS instructions with their two main reasons
# and how often they ran (warp-level executions).
import csv
import sys


def num(x: str) -> float:
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    rows = list(csv.reader(open(sys.argv[1])))
    hdr, data = rows[1], rows[2:]   # row 0 names the kernel
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "(Not Issued)" not in h]
    samples = "Warp Stall Sampling (All Samples)"
    total = sum(num(r[ix[samples]]) for r in data) or 1.0
    print(f"total samples {total:.0f}")
    per_reason = {s: sum(num(r[ix[s]]) for r in data) for s in stalls}
    for s, v in sorted(per_reason.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {s:28s} {v:8.0f} {100 * v / total:5.1f}%")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    for r in sorted(data, key=lambda r: -num(r[ix[samples]]))[:n]:
        s = num(r[ix[samples]])
        top = sorted(((num(r[ix[k]]), k[6:]) for k in stalls), reverse=True)[:2]
        print(f"{s:6.0f} {100 * s / total:5.1f}%  {top[0][1]}:{top[0][0]:.0f} {top[1][1]}:{top[1][0]:.0f}  "
              f"exec={r[ix['Instructions Executed']]:>8}  {r[1][:70]}")


if __name__ == "__main__":
    main()
