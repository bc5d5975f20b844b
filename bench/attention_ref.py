"""The PyTorch alternatives of WORKLOADS.md §2's target attention, O = softmax(Q·Kᵀ·s)·V on 3-D batched
operands (Q [B, Lq, D], K and V [B, Lk, D], bf16, s = 1/sqrt(D)), measured in one process:

  sdpa_flash     F.scaled_dot_product_attention restricted to the flash backend (the issue's baseline)
  sdpa_default   F.scaled_dot_product_attention with PyTorch's own backend choice
  eager          torch.softmax(q @ k.transpose(-1, -2) * s, -1) @ v
  compile_*      that eager function through torch.compile, default and max-autotune-no-cudagraphs

  python3 bench/attention_ref.py [--shapes "B,Lq,Lk,D;..."] [--out FILE.csv]

Timing: triton.testing.do_bench (warmup 25 ms, rep 100 ms, median) in µs, fresh random inputs per shape.
Each variant's output is compared with the fp32 math on the same inputs (max abs error printed). Without a
GPU: prints "skipped: no GPU" and exits 77.
"""
import argparse
import csv
import math
import sys

SHAPES = [(1024, 128, 256, 64), (512, 256, 512, 64), (256, 1024, 1024, 64)]
SKIP = 77


def attention(q, k, v, scale):
    import torch
    return torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return SKIP
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";") if s]
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| B, Lq, Lk, D | sdpa_flash µs | sdpa_default µs | eager µs | compile default µs | compile max-autotune µs |")
    print("|---|---|---|---|---|---|")
    for (B, Lq, Lk, D) in shapes:
        torch.manual_seed(B * 7 + Lq)
        q = torch.randn(B, Lq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Lk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, Lk, D, device="cuda", dtype=torch.bfloat16)
        s = 1.0 / math.sqrt(D)
        ref = attention(q.float(), k.float(), v.float(), s)
        res = {}

        def flash():
            # SDPA's kernels take [B, heads, L, D]: one head
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], scale=s)[:, 0]

        def sdpa_default():
            return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], scale=s)[:, 0]

        variants = [("sdpa_flash", flash), ("sdpa_default", sdpa_default), ("eager", lambda: attention(q, k, v, s))]
        torch._dynamo.reset()
        c_default = torch.compile(attention)
        c_max = torch.compile(attention, mode="max-autotune-no-cudagraphs")
        variants += [("compile_default", lambda: c_default(q, k, v, s)), ("compile_max_autotune", lambda: c_max(q, k, v, s))]
        for name, fn in variants:
            try:
                out = fn()
                err = (out.float() - ref).abs().max().item()
                us = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1000.0
            except Exception as e:  # a backend the build lacks: say so, keep going
                print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}", file=sys.stderr)
                us, err = float("nan"), float("nan")
            res[name] = us
            print(f"  {name}: {us:.1f} us, max abs err vs fp32 {err:.2e}", file=sys.stderr)
        print(f"| {B}, {Lq}, {Lk}, {D} | {res['sdpa_flash']:.1f} | {res['sdpa_default']:.1f} | {res['eager']:.1f} | "
              f"{res['compile_default']:.1f} | {res['compile_max_autotune']:.1f} |", flush=True)
        rows.append({"B": B, "Lq": Lq, "Lk": Lk, "D": D, **{k_: round(v_, 2) for k_, v_ in res.items()}})
    if args.out:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
