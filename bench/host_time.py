"""Host time of one comfuse::fused_region call, the kernel excluded (the target: <= 10 us outside CUDA graphs).

The region is BERT-base's FFN2 at batch 32 x 256: rows 8192, K 3072, N 768, bias + residual + LayerNorm (three
stages, the L2 exchange, a cooperative launch); a GELU region of the same shape (no reduction, a plain launch)
for comparison. Each call is timed on the host only: blocks of --block calls (default 100)
between untimed synchronizations, so the launch queue never fills (a full queue would make the host wait for the
GPU; bench/launch_cost.cu found the same time per launch with blocks of 100, 30, 10 and 1). 1000 calls per figure.
The host's own speed varies by tens of percent from run to run: compare figures of one run (torch.mm's is there).

    python3 bench/host_time.py [--block N]    # on the GPU machine, with the package installed

Prints one line per figure: the call as Inductor's code for a model makes it (ops.fused_region_direct: the op's
C++ kernel without the dispatcher, where _torch_ops.so is loaded), the op through the dispatcher (torch.ops), the op's
Python kernel alone, the kernel library's launch alone (RegionKernel.launch on fixed pointers, through nanobind),
one torch.empty, and for scale the dispatcher's round trip to a Python kernel that does nothing and torch.mm.
Then, with the fast path: the op's `.default` overload (how Inductor's code called it before the direct entry),
under no_grad and inference_mode, the dispatcher's round trip to a C++ kernel that does nothing, and the fast
path's own phases timed in C++ (comfuse::_fast_profile: lookup and checks, device guard and stream, outputs,
arguments, launch).
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


BLOCK = 100   # calls between untimed synchronizations (--block)


def per_call(fn, calls: int = 1000, block: int | None = None) -> float:
    block = block or BLOCK
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
    global BLOCK
    if "--block" in sys.argv:
        BLOCK = int(sys.argv[sys.argv.index("--block") + 1])
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
    rows, fast_rows = [], []
    for name, text in GRAPHS.items():
        part = C.partition(C.parse_cf(text, name + ".cf"))
        spec = part.regions[0].spec
        key = ops.register_region(spec)
        ins = ops.random_inputs(spec, "cuda")
        op = torch.ops.comfuse.fused_region
        out = op(key, ins)   # compiles, launches through Python, registers the C++ fast path
        torch.cuda.synchronize()
        direct = ops.fused_region_direct
        before = ops.fast_path_stats()
        t_direct = per_call(lambda: direct(key, ins))
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
        rows.append((name, L.kernel.transport, t_direct, t_op, served, t_py, t_launch, t_empty, t_noop, t_mm))
        if ops._FAST:
            overload = op.default
            t_default = per_call(lambda: overload(key, ins))
            with torch.no_grad():
                t_nograd = per_call(lambda: overload(key, ins))
            with torch.inference_mode():
                t_inference = per_call(lambda: overload(key, ins))
            cnoop = torch.ops.comfuse._fast_noop.default
            t_cnoop = per_call(lambda: cnoop(key, ins))
            phases = torch.ops.comfuse._fast_profile(key, ins, 1000, BLOCK)
            fast_rows.append((name, t_default, t_nograd, t_inference, t_cnoop, phases))
    print("\n| region | transport | call as Inductor's code makes it µs | op through torch.ops µs | of which C++ "
          "fast path | Python kernel alone µs | kernel library launch µs | torch.empty µs | dispatcher to a no-op µs "
          "| torch.mm µs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, tr, t_direct, t_op, served, t_py, t_launch, t_empty, t_noop, t_mm in rows:
        print(f"| {name} | {tr} | {t_direct:.1f} | {t_op:.1f} | {served} calls | {t_py:.1f} | {t_launch:.1f} | "
              f"{t_empty:.1f} | {t_noop:.1f} | {t_mm:.1f} |")
    if fast_rows:
        print("\n| region | .default µs | under no_grad | under inference_mode | dispatcher to a C++ no-op µs | in C++: "
              "lookup, checks | guard, stream | outputs | arguments | launch | whole call µs |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, t_default, t_nograd, t_inference, t_cnoop, ph in fast_rows:
            cpp = " | ".join(f"{v / 1000:.2f}" for v in ph)
            print(f"| {name} | {t_default:.1f} | {t_nograd:.1f} | {t_inference:.1f} | {t_cnoop:.1f} | {cpp} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
