"""Rows of the planner's measured table (src/plan/measured.csv) from a bench/epilogue_path CSV: the 'residual' class
(h = X·W + R, one output) for every ComFuse variant that is a planner config.

    python3 bench/epilogue_path/to_measured.py EPILOGUE_PATH_CSV [MEASURED_CSV] > rows.csv

Each row's time is its ratio to cuBLASLt's plain GEMM in the same run, times the table's cuBLASLt time at that shape
(the table's rows stay comparable with each other); at a shape the table has no cuBLASLt row for, the bench's own
cuBLASLt time, and a cuBLASLt row is written too."""
import csv
import re
import sys

# ours_res_<reg|ringbox>_<store|async|inring>_<c1x1|c1x2|c2x2|coop128x256_c2x1>: the planner config it measured (names
# with a suffix after the cluster - a fixed tile order, unordered epilogues - or 32-column boxes, or the tensor-box
# stores from their own SMEM ('tmastore'), are bench variants only). The ring form '_rr' is the ring filled by 64 x 64
# boxes, as Psi renders it; 'inring' is its output written back into the ring and stored from there ('_rr_ir'); the
# row-by-row ring ('ring') is not a planner config any more.
NAME = re.compile(r"^ours_res_(reg|ringbox)_(store|async|inring)_(c\dx\d|coop128x256_c\dx\d)$")


def config_of(name: str):
    m = NAME.match(name)
    if not m:
        return None
    form, store, cl = m.groups()
    if store == "inring" and form != "ringbox":
        return None
    cfg = "128x256x64_" + cl.split("_")[1] + "_coop" if cl.startswith("coop") else "128x128x64_" + cl
    return cfg + ("_rr" if form == "ringbox" else "") + ("_as" if store == "async" else "") + \
        ("_ir" if store == "inring" else "")


def main() -> None:
    rows = list(csv.DictReader(open(sys.argv[1])))
    table = sys.argv[2] if len(sys.argv) > 2 else "src/plan/measured.csv"
    cublas = {}
    for line in open(table):
        f = line.strip().split(",")
        if len(f) > 6 and f[3] == "cublas":
            cublas[(int(f[0]), int(f[1]), int(f[2]))] = float(f[6])
    out = csv.writer(sys.stdout, lineterminator="\n")
    for shape in sorted({(int(r["M"]), int(r["K"]), int(r["N"])) for r in rows}):
        m, k, n = shape
        here = [r for r in rows if (int(r["M"]), int(r["K"]), int(r["N"])) == shape and r["us"]]
        base = next((float(r["us"]) for r in here if r["variant"] == "cublas_plain"), None)
        if base is None:
            continue
        gemm_us = cublas.get(shape)
        if gemm_us is None:
            gemm_us = base
            out.writerow([m, k, n, "cublas", "cublasLt (bench/epilogue_path)", "identity", f"{base:.2f}", "0",
                          f"{2 * m * n * k / base / 1e6:.1f}", "1.0000", 0, 0, "-1.000e+00", "-"])
        for r in here:
            cfg = config_of(r["variant"])
            if cfg is None:
                continue
            ratio = float(r["ratio_cublas"])
            us = ratio * gemm_us
            out.writerow([m, k, n, f"{cfg}_kn_residual", cfg, "residual", f"{us:.2f}",
                          f"{float(r['spread_us']) / base:.4f}", f"{2 * m * n * k / us / 1e6:.1f}", f"{ratio:.4f}",
                          0, 0, r["rel_err"], "-"])


if __name__ == "__main__":
    main()
