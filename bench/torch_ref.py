"""Cross-check of the cuBLAS baseline: torch.matmul (bf16, cuBLAS) on the WORKLOADS.md §1 shapes,
timed like bench_gemm (CUDA events per launch, median, inputs rotated past L2) and also with
triton.testing.do_bench when triton is importable. Prints one line per shape."""
import math
import statistics
import sys

import torch

SHAPES = [(16384, 1024, 1024), (16384, 4096, 1024), (8192, 4096, 4096), (8192, 16384, 4096), (4096, 4096, 8192)]


def main():
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 77
    try:
        from triton.testing import do_bench
    except Exception:  # noqa: BLE001
        do_bench = None
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'M,K,N':>20} {'events us':>10} {'TFLOP/s':>8} {'do_bench us':>12}")
    for m, k, n in SHAPES:
        set_bytes = 2 * (m * k + k * n + m * n)
        nsets = max(2, math.ceil(240e6 / set_bytes))
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        ws = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        for i in range(5):
            torch.matmul(xs[i % nsets], ws[i % nsets], out=outs[i % nsets])
        reps = 30
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for i, (a, b) in enumerate(ev):
            j = i % nsets
            a.record()
            torch.matmul(xs[j], ws[j], out=outs[j])
            b.record()
        torch.cuda.synchronize()
        us = statistics.median(a.elapsed_time(b) * 1000 for a, b in ev)
        db = float("nan")
        if do_bench is not None:
            db = do_bench(lambda: torch.matmul(xs[0], ws[0], out=outs[0]), warmup=25, rep=100,
                          return_mode="median") * 1000
        print(f"{m:>6},{k:>6},{n:>6} {us:10.1f} {2 * m * n * k / us / 1e6:8.1f} {db:12.1f}")
        del xs, ws, outs
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
