"""Each kernel's GPU time in the last launch of a program, from `ncu --csv --metrics gpu__time_duration.sum` of
`comfuse run FILE.cf --launches L` (L >= 2 identical launches last): the kernels in order, their µs, the total.

  python3 bench/ncu_kernels.py NCU.csv

The last launch is the shortest trailing sequence of kernel names that the sequence before it repeats. A diagnosis of
where a program's time goes, not a result: ncu serializes kernels and flushes caches between them.
"""
import csv
import sys


def rows(path):
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]   # ncu's own messages (==PROF==) are not CSV
    out = []
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000 if unit in ("ns", "nsecond") else v * 1000 if unit in ("ms", "msecond") else v
        out.append((r["Kernel Name"], us))
    return out


def last_launch(ks):
    names = [k for k, _ in ks]
    for p in range(1, len(names) // 2 + 1):
        if names[-p:] == names[-2 * p:-p]:
            return ks[-p:]
    return ks


def main(argv):
    if len(argv) != 1:
        print(__doc__)
        return 2
    ks = rows(argv[0])
    if not ks:
        print(f"no kernel times in {argv[0]}")
        return 1
    last = last_launch(ks)
    for name, us in last:
        print(f"{us:9.1f} us  {name[:110]}")
    print(f"{sum(us for _, us in last):9.1f} us  total of {len(last)} kernels (of {len(ks)} profiled)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
