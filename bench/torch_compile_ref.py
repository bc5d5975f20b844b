"""The PyTorch alternatives of WORKLOADS.md §1, measured in one process: cuBLAS GEMM alone (torch.matmul),
eager, torch.compile (default) and torch.compile (max-autotune-no-cudagraphs) for every GEMM + epilogue.

  python3 bench/torch_compile_ref.py [--modes default,max-autotune] [--shapes "M,K,N;M,K,N"]
                                     [--epilogues postnorm,rmsnorm,...] [--out FILE.csv] [--budget-s S]

Epilogues (h = X·W + b + R; X [M,K], W [K,N], b/gamma/beta [N], R [M,N], all bf16):
  postnorm    layer_norm(h) * gamma + beta                   (eps 1e-5)
  rmsnorm     h * rsqrt(mean(h², -1) + 1e-6) * gamma
  softmax     softmax(X·W + b, -1)
  bias_gelu   gelu_tanh(X·W + b)
  ln_softmax  softmax(layer_norm(h) * gamma + beta, -1)

Timing: triton.testing.do_bench(warmup=25 ms, rep=100 ms, median), reported in µs. The GEMM alone is
timed before and after each case's compiled variants (gemm_us, gemm_us_after), so drift shows; ratios
should only be taken within one run. Compiled outputs are checked against eager (max abs error printed,
never fatal). The CSV is rewritten after every case, so a run cut short keeps what it measured.
Without a GPU: prints "skipped: no GPU" and exits 77.
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(16384, 1024, 1024), (16384, 4096, 1024), (8192, 4096, 4096), (8192, 16384, 4096),
          (4096, 4096, 8192), (1000, 520, 264)]
# Tiny shapes for --cpu-smoke: one aligned, one odd.
SMOKE_SHAPES = [(64, 32, 48), (37, 20, 24)]

MODES = {"default": None, "max-autotune": "max-autotune-no-cudagraphs"}
CSV_COLUMNS = ["M", "K", "N", "epilogue", "gemm_us", "gemm_us_after", "eager_us", "compile_default_us",
               "compile_max_autotune_us"]
SKIP = 77


# Epilogues, written as a user would write them in eager PyTorch. All take the same arguments so that one
# input set serves every case; the ones that do not use R / gamma / beta simply ignore them.
def postnorm(x, w, b, r, gamma, beta):
    h = x @ w + b + r
    return F.layer_norm(h, (h.shape[-1],), gamma, beta, eps=1e-5)


def rmsnorm(x, w, b, r, gamma, beta):
    h = x @ w + b + r
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma


def softmax(x, w, b, r, gamma, beta):
    return torch.softmax(x @ w + b, dim=-1)


def bias_gelu(x, w, b, r, gamma, beta):
    return F.gelu(x @ w + b, approximate="tanh")


def ln_softmax(x, w, b, r, gamma, beta):
    h = x @ w + b + r
    return torch.softmax(F.layer_norm(h, (h.shape[-1],), gamma, beta, eps=1e-5), dim=-1)


EPILOGUES = {f.__name__: f for f in (postnorm, rmsnorm, softmax, bias_gelu, ln_softmax)}


def parse_shapes(text):
    shapes = []
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        parts = [int(v) for v in item.split(",")]
        if len(parts) != 3 or min(parts) <= 0:
            raise argparse.ArgumentTypeError(f"bad shape {item!r}: want M,K,N")
        shapes.append(tuple(parts))
    if not shapes:
        raise argparse.ArgumentTypeError("no shapes given")
    return shapes


def parse_list(allowed):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {bad or text!r}; choose from {', '.join(allowed)}")
        return items
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", type=parse_list(list(MODES)), default=list(MODES),
                   help="torch.compile modes to time, comma-separated (default: default,max-autotune; "
                        "max-autotune means max-autotune-no-cudagraphs)")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help='"M,K,N;M,K,N" (default: the WORKLOADS.md §1 shapes plus 1000,520,264)')
    p.add_argument("--epilogues", type=parse_list(list(EPILOGUES)), default=list(EPILOGUES),
                   help=f"comma-separated subset of {','.join(EPILOGUES)} (default: all)")
    p.add_argument("--out", default=None, help="CSV file to write (rewritten after every case)")
    p.add_argument("--budget-s", type=float, default=math.inf,
                   help="start no new (shape, epilogue) case once this many seconds have passed")
    # Development aid: the whole case/compile/check/CSV path on the CPU in float32 with tiny shapes and
    # the default compile mode, so the logic is known to work before any GPU time is spent on it.
    p.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def make_inputs(m, k, n, device, dtype, gen):
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)
    # X scaled by 1/sqrt(K) so that X·W ~ N(0, 1): values stay in a sane range for bf16 and softmax.
    return dict(x=randn(m, k, scale=k ** -0.5), w=randn(k, n), b=randn(n, scale=0.5), r=randn(m, n),
                gamma=1.0 + randn(n, scale=0.1), beta=randn(n, scale=0.1))


def gpu_timer():
    from triton.testing import do_bench

    def bench(fn):
        return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3   # ms -> µs
    return bench


def cpu_timer(fn, reps=5):
    # Stand-in for do_bench in --cpu-smoke: only the code path matters there, not the numbers.
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def check(name, out, ref, dtype):
    """Prints the max abs error of a compiled output against eager; returns True when within tolerance."""
    out, ref = out.float(), ref.float()
    err = (out - ref).abs()
    # Eager rounds every intermediate (X·W, +b, +R) to bf16 while Inductor keeps them in fp32, so the two
    # legitimately differ by a few bf16 ulps of the output; fp32 (--cpu-smoke) must agree far closer.
    atol, rtol = (5e-2, 2e-2) if dtype == torch.bfloat16 else (1e-4, 1e-4)
    ok = bool(torch.isfinite(out).all()) and bool((err <= atol + rtol * ref.abs()).all())
    print(f"    {name:<22} max abs err vs eager {err.max().item():.3e}{'' if ok else '  MISMATCH'}", flush=True)
    return ok


def fmt(v):
    return "nan" if v is None or math.isnan(v) else f"{v:.2f}"


def write_csv(path, rows):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(",".join(CSV_COLUMNS) + "\n")
        for r in rows:
            f.write(",".join(str(r[c]) if c in ("M", "K", "N", "epilogue") else fmt(r[c]) for c in CSV_COLUMNS)
                    + "\n")
    os.replace(tmp, path)


def print_table(rows):
    print(f"\n{'M':>6} {'K':>6} {'N':>6} {'epilogue':<11} {'gemm':>8} {'gemm2':>8} {'eager':>8} "
          f"{'default':>8} {'max-at':>8} {'eager÷':>7} {'best÷':>7}")
    for r in rows:
        best = min((v for v in (r["compile_default_us"], r["compile_max_autotune_us"]) if not math.isnan(v)),
                   default=math.nan)
        g = r["gemm_us"]
        print(f"{r['M']:>6} {r['K']:>6} {r['N']:>6} {r['epilogue']:<11} {fmt(g):>8} {fmt(r['gemm_us_after']):>8} "
              f"{fmt(r['eager_us']):>8} {fmt(r['compile_default_us']):>8} {fmt(r['compile_max_autotune_us']):>8} "
              f"{r['eager_us'] / g:7.3f} {best / g:7.3f}")
    print("(µs, medians; ÷ = time / gemm_us of the same case; best = min of the compile modes)")


def run_case(shape, epi, inp, modes, bench, dtype):
    m, k, n = shape
    fn = EPILOGUES[epi]
    args = tuple(inp[a] for a in ("x", "w", "b", "r", "gamma", "beta"))
    x, w = inp["x"], inp["w"]
    row = dict(M=m, K=k, N=n, epilogue=epi, gemm_us=math.nan, gemm_us_after=math.nan, eager_us=math.nan,
               compile_default_us=math.nan, compile_max_autotune_us=math.nan)

    row["gemm_us"] = bench(lambda: torch.matmul(x, w))
    ref = fn(*args)
    row["eager_us"] = bench(lambda: fn(*args))
    for mode in modes:
        # A clean slate for every compile: no cached graph from the previous case or mode is reused, and
        # memory held by earlier compiled graphs is let go.
        torch._dynamo.reset()
        col = "compile_default_us" if mode == "default" else "compile_max_autotune_us"
        try:
            t0 = time.perf_counter()
            cfn = torch.compile(fn, mode=MODES[mode], fullgraph=True, dynamic=False)
            out = cfn(*args)   # compiles
            if out.is_cuda:
                torch.cuda.synchronize()
            print(f"    compile {mode}: {time.perf_counter() - t0:.1f} s", flush=True)
            check(f"compile {mode}", out, ref, dtype)
            del out
            row[col] = bench(lambda: cfn(*args))
        except Exception as e:  # noqa: BLE001 - one failing mode must not lose the rest of the run
            print(f"    compile {mode} FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  flush=True)
    torch._dynamo.reset()
    row["gemm_us_after"] = bench(lambda: torch.matmul(x, w))
    g0, g1 = row["gemm_us"], row["gemm_us_after"]
    if abs(g1 - g0) > 0.03 * min(g0, g1):
        print(f"    note: GEMM before/after differ by more than 3% ({g0:.1f} vs {g1:.1f} µs)", flush=True)
    return row


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    if args.cpu_smoke:
        device, dtype, bench = "cpu", torch.float32, cpu_timer
        shapes = args.shapes or SMOKE_SHAPES
        modes = ["default"]
    else:
        if not torch.cuda.is_available():
            print("skipped: no GPU")
            return SKIP
        device, dtype, bench = "cuda", torch.bfloat16, gpu_timer()
        shapes = args.shapes or SHAPES
        modes = args.modes
        import triton
        print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    # max-autotune compiles many GEMM candidates; let Inductor use every core for it. Must be set before
    # the first compile, which creates the worker pool. The CPU smoke compiles in-process: a worker pool
    # there only competes with the timed CPU kernels.
    torch._inductor.config.compile_threads = 1 if args.cpu_smoke else (os.cpu_count() or 1)
    print(f"modes: {','.join(modes)}; shapes: {len(shapes)}; epilogues: {','.join(args.epilogues)}; "
          f"budget: {args.budget_s} s", flush=True)

    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    rows = []
    stopped = False
    for shape in shapes:
        if stopped:
            break
        inp = make_inputs(*shape, device, dtype, gen)
        for epi in args.epilogues:
            elapsed = time.perf_counter() - t_start
            if elapsed >= args.budget_s:
                print(f"budget of {args.budget_s} s spent ({elapsed:.0f} s): stopping before "
                      f"{shape} {epi}", flush=True)
                stopped = True
                break
            print(f"[{elapsed:6.0f} s] M={shape[0]} K={shape[1]} N={shape[2]} {epi}", flush=True)
            rows.append(run_case(shape, epi, inp, modes, bench, dtype))
            if args.out:
                write_csv(args.out, rows)
        del inp
        if device == "cuda":
            torch.cuda.empty_cache()

    if rows:
        print_table(rows)
    if args.out:
        write_csv(args.out, rows)
        print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
