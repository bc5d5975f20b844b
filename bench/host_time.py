"""Host time of one comfuse::fused_region call, the kernel excluded (issue 13 asks <= 10 us outside CUDA graphs).

The region is BERT-base's FFN2 at batch 32 x 256: rows 8192, K 3072, N 768, bias + residual + LayerNorm (three
stages, the L2 exchange, a cooperative launch); a GELU region of the same shape (no reduction, a plain launch)
for comparison. Each call is timed on the host only: blocks of 100 calls between untimed synchronizations, so the
launch queue never fills (a full queue would make the host wait for the GPU). 1000 calls per figure.

    python3 bench/host_time.py          # on the GPU machine, with the package installed

Prints one line per figure: the op as a model calls it (the C++ fast path where _torch_ops.so is loaded), the op's
Python kernel alone, the kernel library's launch alone (RegionKernel.launch on fixed pointers, through nanobind),
one torch.empty, and for scale the dispatcher's round trip to a Python kernel that does nothing and torch.mm.
"""
from __future__ import annotations

import sys
import time

import torch

GRAPHS = {
    "ffn2_postnorm": "input X : bf16[8192, 3072]\ninput W : bf16[768, 3072]\ninput b : bf16[768]\n"
                     "input R : bf16[8192, 768]\ninput gamma : bf16[768]\ninput beta : bf16[768]\n"
                     "y = layer_norm(add(add(matmul(X, W, transpose_b=true), b), R), gamma, beta, eps=1e-12)\n"
                     "output y\n",
    "ffn2_gelu": "input X : bf16[8192, 3072]\ninput W : bf16[768, 3072]\ninput b : bf16[768]\n"
                 "y = gelu(add(matmul(X, W, transpose_b=true), b))\noutput y\n",
}


def per_call(fn, calls: int = 1000, block: int = 100) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    total = 0.0
    for _ in range(calls // block):
        t = time.perf_counter()
        for _ in range(block):
            fn()
        total += time.perf_counter() - t
        torch.cuda.synchronize()
    return total / (calls // block * block) * 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 77
    import comfuse._core as C
    from comfuse import ops

    lib = torch.library.Library("comfuse_host_bench", "DEF")
    lib.define("noop(str key, Tensor[] inputs) -> Tensor[]")
    lib.impl("noop", lambda key, inputs: [inputs[0]], "CUDA")
    noop = torch.ops.comfuse_host_bench.noop
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, C++ fast path "
          f"{'loaded' if ops._FAST else 'not loaded'}")
    rows = []
    for name, text in GRAPHS.items():
        part = C.partition(C.parse_cf(text, name + ".cf"))
        spec = part.regions[0].spec
        key = ops.register_region(spec)
        ins = ops.random_inputs(spec, "cuda")
        op = torch.ops.comfuse.fused_region
        out = op(key, ins)   # compiles, launches through Python, registers the C++ fast path
        torch.cuda.synchronize()
        before = ops.fast_path_stats()
        t_op = per_call(lambda: op(key, ins))
        after = ops.fast_path_stats()
        t_py = per_call(lambda: ops._run_gpu(key, ins))
        L = ops._LAUNCH[key]
        a, b, *params = ins
        stream = torch.cuda.current_stream().cuda_stream
        outs, ps = [o.data_ptr() for o in out], [p.data_ptr() for p in params]
        t_launch = per_call(lambda: L.kernel.launch(a.data_ptr(), b.data_ptr(), spec.gemm.rows, outs, ps, stream))
        t_empty = per_call(lambda: torch.empty(out[0].shape, dtype=out[0].dtype, device="cuda"))
        t_noop = per_call(lambda: noop("x", ins))
        bt = b.t() if spec.gemm.transpose_b else b
        t_mm = per_call(lambda: torch.mm(a, bt))
        served = after["fast"] - before["fast"]
        rows.append((name, L.kernel.transport, t_op, served, t_py, t_launch, t_empty, t_noop, t_mm))
    print("\n| region | transport | op call µs | of which C++ fast path | Python kernel alone µs | kernel library "
          "launch µs | torch.empty µs | dispatcher to a no-op µs | torch.mm µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, tr, t_op, served, t_py, t_launch, t_empty, t_noop, t_mm in rows:
        print(f"| {name} | {tr} | {t_op:.1f} | {served} calls | {t_py:.1f} | {t_launch:.1f} | {t_empty:.1f} | "
              f"{t_noop:.1f} | {t_mm:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
