#!/usr/bin/env python3
"""GPU reliability checks of the fused kernels (reliability, docs/reliability.md), run by scripts/gpu-reliability.sh on the device.

For one kernel family (an epilogue pattern) and each of its cross-CTA transports, a region is compiled with
comfuse._core.RegionKernel (the PyTorch custom op's kernel) and checked against the CPU reference interpreter
(torch.ops.comfuse.fused_region on CPU tensors) under:

  replays     1000 CUDA-graph replays, the inputs changed between replays, outputs checked every 100th
  streams     two streams launching the same kernel concurrently on different data (200 launches each, direct
              and as two captured graphs replayed side by side)
  multi_m     back-to-back launches with different M (rows) on one stream and one workspace, no sync between
  device1     the same on cuda:1 (skipped, saying so, with one GPU)
  contention  a holder kernel keeps SMs busy (half of them, then all) for a second while the fused kernel is
              launched: it must complete correctly, or fail with a clear error; never hang

  python3 scripts/gpu_reliability.py --precompile                 # every family's kernels, in parallel
  python3 scripts/gpu_reliability.py --family NAME --json FILE    # the checks of one family -> JSON lines
  python3 scripts/gpu_reliability.py --summarize DIR              # the table of every DIR/*.json

Each check appends one JSON line as soon as it ends, so a hang (the shell's timeout) loses only that check.
"""
import argparse
import concurrent.futures
import faulthandler
import glob
import json
import os
import sys
import time
import traceback

M, K, N = 1000, 520, 264           # odd M; N = 264 spans 3 column tiles of 128 (DSMEM fits, L2 exchanges)
TOL = 1e-2                         # bf16 normwise, as tests/python/test_gpu_ops.py
REDUCING = ["l2", "dsmem_p2p", "dsmem_leader"]
FAMILIES = {
    # name: (graph text after the inputs, transports)
    "bias_gelu": ('y = gelu(add(matmul(X, W), b), approximate="tanh")\noutput y\n', [""]),
    "rmsnorm": ("y = rms_norm(add(matmul(X, W), b), gamma, eps=1e-6)\noutput y\n", REDUCING),
    "postnorm": ("y = layer_norm(add(add(matmul(X, W), b), R), gamma, beta, eps=1e-5)\noutput y\n", REDUCING),
    "softmax": ("y = softmax(add(matmul(X, W), b))\noutput y\n", REDUCING),
    "prenorm2": ("h = add(add(matmul(X, W), b), R)\ny = rms_norm(h, gamma, eps=1e-6)\noutput h, y\n", REDUCING),
}


def cf_text(family: str, m: int = M) -> str:
    return (f"input X : bf16[{m}, {K}]\ninput W : bf16[{K}, {N}]\ninput b : bf16[{N}]\ninput R : bf16[{m}, {N}]\n"
            f"input gamma : bf16[{N}]\ninput beta : bf16[{N}]\n" + FAMILIES[family][0])


def spec_of(C, family: str, m: int = M):
    part = C.partition(C.parse_cf(cf_text(family, m), family + ".cf"))
    assert len(part.regions) == 1, f"{family}: expected one region, got {len(part.regions)}"
    return part.regions[0].spec


def precompile() -> int:
    import comfuse._core as C
    from comfuse import ops

    opts = ops._kernel_options()
    jobs = [(f, t) for f, (_, tps) in FAMILIES.items() for t in tps]

    def one(job):
        f, t = job
        t0 = time.time()
        try:
            name, hit, secs, _ = C.compile_region(spec_of(C, f), transport=t, **opts)
            return f"{f}/{t or 'none'}: {name} ({'cache hit' if hit else f'{secs:.0f} s'})"
        except Exception as e:  # reported; the family's checks then fail with the same error
            return f"{f}/{t or 'none'}: FAILED to compile after {time.time() - t0:.0f} s: {e}"

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        for line in pool.map(one, jobs):
            print("precompile:", line, flush=True)
    return 0


# ------------------------------------------------------------------------------------------------- checks

class Family:
    """One family's region at one transport, with its inputs, kernel and CPU reference."""

    def __init__(self, C, ops, torch, family, transport, device):
        self.C, self.ops, self.torch, self.family, self.transport, self.dev = C, ops, torch, family, transport, device
        self.spec = spec_of(C, family)
        self.key = ops.register_region(self.spec)
        opts = ops._kernel_options()
        with torch.cuda.device(device):
            self.kernel = C.RegionKernel(self.spec, transport=transport, **opts)
        self.names = ["X", "W"] + [p.name for p in self.spec.params]

    def inputs(self, seed, m=M):
        """CPU bf16 inputs in the op's order; X (and R) depend on `seed`, the weights do not."""
        torch = self.torch
        g = torch.Generator().manual_seed(1000 + seed)
        gw = torch.Generator().manual_seed(7)
        vals = {"X": torch.rand(m, K, generator=g) * 2 - 1, "R": torch.rand(m, N, generator=g) * 8 - 4,
                "W": torch.rand(K, N, generator=gw) * 2 - 1, "b": torch.rand(N, generator=gw) * 2 - 1,
                "gamma": torch.rand(N, generator=gw) + 0.5, "beta": torch.rand(N, generator=gw) * 2 - 1}
        return [vals[n].to(torch.bfloat16) for n in self.names]

    def reference(self, cpu_inputs):
        return [r.float() for r in self.torch.ops.comfuse.fused_region(self.key, cpu_inputs)]

    def outputs(self, m=M):
        from comfuse.convert import DT_TO_TORCH

        return [self.torch.full(self.ops._out_shape(self.spec, o, (m, K)), float("nan"), dtype=DT_TO_TORCH[o.dtype],
                                device=self.dev) for o in self.spec.outputs]

    def launch(self, ins, outs, stream, m=M):
        with self.torch.cuda.device(self.dev):  # the kernel's host half launches on the current device (ops.py)
            self.kernel.launch(ins[0].data_ptr(), ins[1].data_ptr(), m, [o.data_ptr() for o in outs],
                               [p.data_ptr() for p in ins[2:]], stream.cuda_stream)


def rel_err(torch, got, ref) -> float:
    got = got.float().cpu()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-6))


def worst(torch, outs, refs) -> float:
    return max(rel_err(torch, o, r) for o, r in zip(outs, refs))


def wait(torch, event, seconds) -> bool:
    """Polls `event` up to `seconds`: False when it has not completed (a hang, for the caller to report)."""
    deadline = time.time() + seconds
    while not event.query():
        if time.time() > deadline:
            return False
        time.sleep(0.001)
    return True


def check_replays(fam, torch, dev, n=1000, every=100):
    s = torch.cuda.Stream(dev)
    pool = [fam.inputs(seed) for seed in range(5)]
    refs = [fam.reference(p) for p in pool]
    gpu_pool = [[t.to(dev) for t in p] for p in pool]
    ins = [t.clone() for t in gpu_pool[0]]
    outs = fam.outputs()
    with torch.cuda.stream(s):
        fam.launch(ins, outs, s)          # warm-up on the capture stream: its workspace exists before capture
    s.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        fam.launch(ins, outs, s)
    checks, bad, err = 0, 0, 0.0
    with torch.cuda.stream(s):
        for i in range(n):
            src = gpu_pool[i % len(gpu_pool)]
            for dst, t in zip(ins, src):  # new inputs before every replay (X and R change; same for W, params)
                dst.copy_(t, non_blocking=True)
            graph.replay()
            if (i + 1) % every == 0:
                s.synchronize()
                e = worst(torch, outs, refs[i % len(gpu_pool)])
                checks += 1
                bad += e > TOL
                err = max(err, e)
    s.synchronize()
    return bad == 0, f"{n} replays, {checks} checks, {bad} mismatches, max rel err {err:.2e}"


def check_streams(fam, torch, dev, n=200):
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    cpu1, cpu2 = fam.inputs(11), fam.inputs(12)
    ref1, ref2 = fam.reference(cpu1), fam.reference(cpu2)
    in1, in2 = [t.to(dev) for t in cpu1], [t.to(dev) for t in cpu2]
    out1, out2 = fam.outputs(), fam.outputs()
    torch.cuda.synchronize(dev)
    for _ in range(n):                    # interleaved, no synchronization between the streams
        fam.launch(in1, out1, s1)
        fam.launch(in2, out2, s2)
    e_direct = max(worst(torch, out1, ref1), worst(torch, out2, ref2))
    # the same as two captured graphs replayed side by side
    graphs = []
    for s, ins, outs in ((s1, in1, out1), (s2, in2, out2)):
        for o in outs:
            o.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        s.synchronize()
        with torch.cuda.graph(g, stream=s):
            fam.launch(ins, outs, s)
        graphs.append((s, g))
    for _ in range(n):
        for s, g in graphs:
            with torch.cuda.stream(s):
                g.replay()
    torch.cuda.synchronize(dev)
    e_graph = max(worst(torch, out1, ref1), worst(torch, out2, ref2))
    ok = e_direct <= TOL and e_graph <= TOL
    return ok, f"2 streams x {n} launches: max rel err {e_direct:.2e} direct, {e_graph:.2e} as graphs"


def check_multi_m(fam, torch, dev):
    ms = [4096, 1000, 1, 8, 777, 2048, 129, 4095, 3]   # the largest first: the workspace is sized once
    s = torch.cuda.Stream(dev)
    cases = []
    for i, m in enumerate(ms):
        cpu = fam.inputs(100 + i, m)
        cases.append((m, cpu, [t.to(dev) for t in cpu], fam.outputs(m)))
    torch.cuda.synchronize(dev)
    for m, _, ins, outs in cases:         # back to back on one stream, one workspace, no sync
        fam.launch(ins, outs, s, m)
    s.synchronize()
    errs = [worst(torch, outs, fam.reference(cpu)) for m, cpu, _, outs in cases]
    bad = [f"M={m}: {e:.2e}" for (m, *_), e in zip(cases, errs) if e > TOL]
    return not bad, f"M = {ms}: max rel err {max(errs):.2e}" + (f"; off: {', '.join(bad)}" if bad else "")


HOLDER_SRC = r"""
extern "C" __global__ void holder(unsigned long long ns, unsigned long long started_addr) {
  extern __shared__ char smem[];
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  // mapped pinned host memory: the host sees which CTAs are resident (a plain store, no system atomics)
  if (threadIdx.x == 0) reinterpret_cast<volatile int*>(started_addr)[blockIdx.x] = 1;
  volatile char* s = smem;
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    s[threadIdx.x] = (char)t;
  } while (t - t0 < ns);
}
"""


def check_contention(fam, torch, dev, hold_s=1.0):
    """A holder kernel (one CTA per SM: it takes most of an SM's shared memory) spins for `hold_s` on half the
    SMs, then on all of them, while the fused kernel is launched on another stream."""
    try:
        import cupy
    except Exception as e:  # no CuPy: nothing else here launches an arbitrary kernel
        return None, f"not run: CuPy unavailable ({e})"
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    smem = 200 * 1024
    with cupy.cuda.Device(torch.device(dev).index or 0):
        kern = cupy.RawKernel(HOLDER_SRC, "holder")
        kern.max_dynamic_shared_size_bytes = smem
        details, ok = [], True
        for label, blocks in (("half", sms // 2), ("all", sms)):
            cpu = fam.inputs(21)
            ref = fam.reference(cpu)
            ins = [t.to(dev) for t in cpu]
            outs = fam.outputs()
            started = torch.zeros(blocks, dtype=torch.int32).pin_memory()
            hs, fs = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
            done, hold_done = torch.cuda.Event(), torch.cuda.Event()
            torch.cuda.synchronize(dev)
            t0 = time.time()
            with cupy.cuda.ExternalStream(hs.cuda_stream):
                kern((blocks,), (128,), (cupy.uint64(int(hold_s * 1e9)), cupy.uint64(started.data_ptr())),
                     shared_mem=smem)
            hold_done.record(hs)
            while int(started.sum()) < blocks and time.time() - t0 < 5:   # wait until the holder is resident
                time.sleep(0.0005)
            resident = int(started.sum())
            t1 = time.time()
            try:
                fam.launch(ins, outs, fs)
                done.record(fs)
            except RuntimeError as e:  # a clear error is an allowed outcome (the caller falls back)
                wait(torch, hold_done, hold_s + 30)
                details.append(f"{label}: clear error: {e}")
                continue
            if not wait(torch, done, hold_s + 30):
                details.append(f"{label}: HANG (not done {hold_s + 30:.0f} s after launch)")
                ok = False
                break
            t_done = time.time() - t1
            wait(torch, hold_done, hold_s + 30)
            e = worst(torch, outs, ref)
            ok = ok and e <= TOL and resident == blocks
            details.append(f"{label} ({resident}/{blocks} holder CTAs resident, holding {hold_s:.1f} s): fused "
                           f"kernel done {t_done * 1e3:.0f} ms after its launch, rel err {e:.2e}")
    return ok, "; ".join(details)


def run_family(family, out_json, checks):
    import torch

    import comfuse._core as C
    from comfuse import ops

    faulthandler.enable()
    transports = FAMILIES[family][1]
    ngpu = torch.cuda.device_count()

    def emit(check, transport, ok, detail, seconds):
        row = {"family": family, "transport": transport or "none", "check": check,
               "result": "SKIP" if ok is None else ("ok" if ok else "FAIL"), "detail": detail,
               "seconds": round(seconds, 1)}
        with open(out_json, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{family}/{row['transport']}] {check}: {row['result']}: {detail} ({seconds:.1f} s)", flush=True)

    for tp in transports:
        try:
            fam = Family(C, ops, torch, family, tp, "cuda:0")
        except Exception as e:
            emit("compile", tp, False, f"{type(e).__name__}: {e}", 0)
            continue
        plan = [("replays", check_replays), ("streams", check_streams), ("multi_m", check_multi_m),
                ("contention", check_contention)]
        for name, fn in plan:
            if checks and name not in checks:
                continue
            t0 = time.time()
            faulthandler.dump_traceback_later(240, exit=True)   # a hang ends the process with its stack
            try:
                ok, detail = fn(fam, torch, "cuda:0")
            except Exception as e:
                ok, detail = False, f"{type(e).__name__}: {e}".strip()
                traceback.print_exc()
            faulthandler.cancel_dump_traceback_later()
            emit(name, tp, ok, detail, time.time() - t0)
        if not checks or "device1" in checks:
            t0 = time.time()
            if ngpu < 2:
                emit("device1", tp, None, f"skipped: {ngpu} GPU(s) here; cuda:1 needs a machine with two "
                                          "(the nvidia-h200-x2 kind)", 0)
            else:
                faulthandler.dump_traceback_later(240, exit=True)
                try:
                    fam1 = Family(C, ops, torch, family, tp, "cuda:1")
                    ok1, d1 = check_replays(fam1, torch, "cuda:1", n=200, every=50)
                    ok2, d2 = check_multi_m(fam1, torch, "cuda:1")
                    ok, detail = ok1 and ok2, f"cuda:1: {d1}; {d2}"
                except Exception as e:
                    ok, detail = False, f"{type(e).__name__}: {e}".strip()
                    traceback.print_exc()
                faulthandler.cancel_dump_traceback_later()
                emit("device1", tp, ok, detail, time.time() - t0)
    return 0


def summarize(directory) -> int:
    rows = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            rows += [json.loads(line, strict=False) for line in f if line.strip()]
    if not rows:
        print("gpu-reliability: no results")
        return 1
    checks = ["compile", "replays", "streams", "multi_m", "device1", "contention", "cli_check", "memcheck",
              "racecheck", "synccheck"]
    present = [c for c in checks if any(r["check"] == c for r in rows)]
    keys = []
    for r in rows:
        k = (r["family"], r["transport"])
        if k not in keys:
            keys.append(k)
    print("| family | transport | " + " | ".join(present) + " |")
    print("|---|---|" + "---|" * len(present))
    for fam, tp in keys:
        cells = []
        for c in present:
            got = [r for r in rows if (r["family"], r["transport"], r["check"]) == (fam, tp, c)]
            cells.append(got[-1]["result"] if got else "")
        print(f"| {fam} | {tp} | " + " | ".join(cells) + " |")
    print()
    for r in rows:   # every result's figures (FAIL and SKIP rows say why)
        print(f"{r['result']:>4}  {r['family']}/{r['transport']} {r['check']}: {r['detail']}")
    failed = sum(r["result"] == "FAIL" for r in rows)
    skipped = sum(r["result"] == "SKIP" for r in rows)
    print(f"gpu-reliability: {len(rows)} results, {failed} FAILED, {skipped} skipped")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--family", choices=sorted(FAMILIES))
    ap.add_argument("--json", help="results file (JSON lines) for --family")
    ap.add_argument("--checks", default="", help="comma-separated subset of replays,streams,multi_m,contention,device1")
    ap.add_argument("--summarize", metavar="DIR")
    ap.add_argument("--list", action="store_true", help="the families, one a line")
    a = ap.parse_args()
    if a.list:
        print("\n".join(FAMILIES))
        return 0
    if a.precompile:
        return precompile()
    if a.summarize:
        return summarize(a.summarize)
    if a.family and a.json:
        return run_family(a.family, a.json, [c for c in a.checks.split(",") if c])
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
