"""The measuring planner's policy: where the planner's estimate is checked on the GPU, a fused region is timed
against its GEMM and separate pass (plus the host cost of a call outside CUDA graphs), and the regions the GPU shows
slower are left to torch."""
from __future__ import annotations

import logging
import math
import os

import torch

from . import analysis, ops
from .analysis import GraphReport, measuring  # noqa: F401  (measure.measuring: the policy's switch)

log = logging.getLogger("comfuse")

# GPU cycles of the kernel that holds the stream before each timed block (torch.cuda._sleep, ~1 ms): long enough
# for the host to queue the block's launches, so that the events time the kernels back to back. Without it a block
# of short kernels is timed at the host's pace: HF Llama's 8192 x 1024 x 1024 GEMMs measured 31.8 us fused and 43.1
# us through torch.matmul, where the model's profile shows 25.9 and 26 us (2026-12-03).
_HOLD_CYCLES = 2_000_000


def _time_pair_us(fn, other, blocks: int = 9, launches: int = 10) -> tuple[float, float]:
    """(fn us, other us): medians over `blocks` of the mean GPU time of `launches` back-to-back calls (CUDA events),
    the two timed in alternating blocks so that a clock or host drift during the measurement moves both alike.
    Each block waits behind a sleeping kernel while the host queues it."""
    for f in (fn, other):
        for _ in range(3):
            f()
    times: tuple[list, list] = ([], [])
    for _ in range(blocks):
        for f, ts in zip((fn, other), times):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(_HOLD_CYCLES)
            start.record()
            for _ in range(launches):
                f()
            stop.record()
            stop.synchronize()
            ts.append(start.elapsed_time(stop) * 1e3 / launches)
    return tuple(sorted(ts)[len(ts) // 2] for ts in times)


def time_region_on_gpu(key: str, lead: tuple | None = None) -> tuple[float, float]:
    """(fused kernel us, cuBLAS GEMM us) of a registered region at its Spec's shapes (or its kernel run with A's
    leading dims `lead`, as a dynamic graph runs it at another size), on random inputs, timed in alternating blocks
    (a region of two GEMMs on one A: both cuBLAS GEMMs). The copies an output stored in parts saves are priced by
    the planner (PlanDecision.copy_us, in pass_us), as the epilogue pass is: torch's own copy of a column slice
    takes 2.5x Inductor's (GPT-2's k and v: ~18 us against ~7 us each on the H200)."""

    spec = ops.region_spec(key)
    a, b, *params = ops.random_inputs(spec if lead is None else spec.with_rows(math.prod(lead)), "cuda")
    if lead is not None:
        a = a.view(*lead, a.shape[-1])
    bt = b.t() if spec.gemm.transpose_b else b
    if spec.gemm.paired:   # two GEMMs on one A (SwiGLU's gate and up): what torch runs is both
        b2 = params[spec.gemm.b2_param]
        b2t = b2.t() if spec.gemm.transpose_b else b2
        return _time_pair_us(lambda: ops._run_gpu(key, [a, b, *params]),
                             lambda: (torch.matmul(a, bt), torch.matmul(a, b2t)))
    return _time_pair_us(lambda: ops._run_gpu(key, [a, b, *params]), lambda: torch.matmul(a, bt))


def probe_lead(spec) -> tuple | None:
    """The smaller size a region of a dynamic graph is also timed at (measure_fused), as A's leading dims: a quarter
    of the batch (the GEMM's first leading dim), with the last dim a little longer, so that the rows are a few more
    than a whole number of 128-row tiles. The sizes a dynamic graph meets are rarely whole tiles, and one more
    row block can take a kernel into a second wave: on the H200, Llama's down_proj + residual + RMSNorm (128 x 128
    tiles, 8 to a row block, exchanging through L2) took 23.7 us at 2048 rows and 38 us at 2072, where 136 tiles
    meet 132 SMs. Where an output is not laid out over A's leading dims, whole sequences are kept (A flattened to
    rows). None where fewer than 1024 rows are left."""

    lead = [int(d) for d in spec.gemm.out_shape[:-1]]
    first, inner = lead[0] // 4, math.prod(lead[1:])
    if first * inner < 1024:
        return None
    if not all(ops.has_gemm_lead(spec, o) for o in spec.outputs):
        return (first * inner,)
    if len(lead) == 1:
        return (first + 8,)
    return (first, *lead[1:-1], lead[-1] + -(-8 // (first * math.prod(lead[1:-1]))))


# A fused kernel must beat what it replaces by this fraction to be kept (measure_fused). Two timings of one kernel
# in one process differ by up to ~4% (HF BERT-base's FFN2 + residual + LayerNorm: 69.1 and 66.5 us against 68.0 and
# 68.9 for the GEMM and its pass, 2026-12-03), and the pass is an estimate: without a margin a region that
# is a tie flips between compiles and runs are not reproducible. Within the margin the region stays in torch,
# the form Inductor would run anyway.
MEASURE_MARGIN = 0.05


# Host time of one comfuse::fused_region call beyond the launches it replaces (Inductor's GEMM and its epilogue
# pass). With the op's Python kernel: 25-45 us per call on the H200 machines, kernel excluded, less ~10 us for those
# two launches; outside a CUDA graph a model of short kernels waits for it (HF BERT-base ran 0.80x Inductor default
# with 24 fused regions whose kernels beat the GEMM and a pass by 1-30 us each, and 1.09x in reduce-overhead).
# With the C++ fast path (ops._FAST, python/src/torch_ops.cpp) and Inductor's code calling it directly
# (ops.fused_region_direct): 5.9-9.4 us per call, against 11.8-19.5 us for the torch.mm call alone on the same machine
# (bench/host_time.py, docs/log/2026-12-03.md): a region costs the host no more than what it replaces.
HOST_US_PER_CALL = 20.0        # the Python kernel
HOST_US_PER_CALL_FAST = 0.0    # the C++ fast path


def host_us_per_call(graphed: bool | None = None) -> float:
    """What a fused region must win back on the host: HOST_US_PER_CALL, or HOST_US_PER_CALL_FAST where the op's
    C++ kernel is loaded (the COMFUSE_HOST_US environment variable overrides both), or 0 where the graph runs as a
    CUDA graph (mode="reduce-overhead": nothing is issued per call). `graphed` None: Inductor's config in effect
    says (the post-grad pass runs inside the compile's patches)."""

    if graphed is None:
        graphed = bool(torch._inductor.config.triton.cudagraphs)
    if graphed:
        return 0.0
    default = HOST_US_PER_CALL_FAST if ops._FAST else HOST_US_PER_CALL
    given = os.environ.get("COMFUSE_HOST_US")
    try:
        return default if given is None else max(0.0, float(given))
    except ValueError:
        log.warning("comfuse: COMFUSE_HOST_US=%r is not a number of microseconds; using %.0f", given, default)
        return default


def measure_fused(rep: GraphReport, target, fuse: set, timer=time_region_on_gpu, host_us: float | None = None) -> set:
    """The planner's choice checked on this GPU at the graph's own shapes: each fused region's kernel is timed
    against the cuBLAS GEMM of its shape (torch.matmul) plus the memory-bound pass Inductor would run for the
    epilogue (a GEMM with at most a bias: none, cuBLAS adds it). The planner reads a table measured at other
    shapes and on other epilogues, and its estimate can miss by tens of percent (GPT-2's c_proj + residual +
    LayerNorm: ~67 us predicted, ~100 us in the model), so a region the GPU shows slower is not fused.
    Outside a CUDA graph the kernel must also win back the call's host time (`host_us`, default
    host_us_per_call()), and win by MEASURE_MARGIN: a tie stays in torch, so that runs are reproducible. A graph
    with dynamic sizes runs its kernels, compiled for the example sizes, at other sizes too: there each kernel is
    also timed at probe_lead (a quarter of the batch, a few rows past whole tiles), where fewer or partly filled
    tiles can make it slower than cuBLAS (Llama at 8 x 259 tokens: the GPU time 0.94x Inductor's with the example's
    choice), and must not be slower there by more than the margin. Returns the regions that lost; each region's
    times are logged. One timing per distinct kernel and shape (~40 ms each).
    `timer(key, lead=None) -> (fused us, GEMM us)`."""

    if host_us is None:
        host_us = host_us_per_call()
    dynamic = rep.analysis is not None and rep.analysis.conv.dynamic

    by_gemm = {rep.regions[ri].spec.gemm.node: ri for ri in fuse}
    done: dict = {}
    lost = set()
    for n in target.graph.nodes:
        if n.op != "call_function" or n.target is not torch.ops.comfuse.fused_region.default:
            continue
        key = n.args[0]
        spec = ops.region_spec(key)
        ri = by_gemm.get(spec.gemm.node)
        if ri is None:
            continue
        sig = (spec.structural_hash(), spec.gemm.rows)
        if sig not in done:
            probe = probe_lead(spec) if dynamic else None
            try:
                times = timer(key) + (timer(key, probe) if probe else ())
            except Exception as e:   # a kernel that cannot be timed is not run: fallback, never failure
                log.warning("comfuse: graph %d region %d: not fused: timing its kernel failed (%s: %s)", rep.index,
                            ri, type(e).__name__, e)
                times = (float("inf"), 0.0)
            done[sig] = (times, rep.plans[ri].pass_us, probe)   # the planner's pass (none: cuBLAS alone)
        (fused_us, gemm_us, *small), pass_us, lead = done[sig]
        unfused_us = gemm_us + pass_us
        keep = fused_us + host_us <= unfused_us * (1.0 - MEASURE_MARGIN)
        why = ("fused" if keep else
               "not fused (slower than the GEMM and a separate pass)" if fused_us > unfused_us else
               "not fused (what it saves does not cover the call's host time)" if fused_us + host_us > unfused_us else
               f"not fused (a tie: it wins by less than the {MEASURE_MARGIN:.0%} margin, within the timing's noise)")
        at_probe = ""
        if small:   # the same kernel at the smaller size (the pass scales with the rows)
            probe = math.prod(lead)
            small_pass = pass_us * probe / int(spec.gemm.rows)
            at_probe = (f"; at {probe} rows (a smaller size of this dynamic graph) {small[0]:.1f} us against "
                        f"{small[1]:.1f} us (+ ~{small_pass:.1f} us)")
            if keep and small[0] + host_us > (small[1] + small_pass) * (1.0 + MEASURE_MARGIN):
                keep, why = False, f"not fused (slower than the GEMM and a separate pass at {probe} rows)"
        if not rep.plans[ri].fuse:
            why += " (a near tie the planner's estimate declined, timed here)"
        log.info("comfuse: graph %d region %d: on this GPU the kernel takes %.1f us%s, the cuBLAS GEMM%s %.1f us (+ an "
                 "epilogue pass ~%.1f us)%s: %s", rep.index, ri, fused_us,
                 f" (+ ~{host_us:.0f} us of host time per call, no CUDA graph)" if host_us else "",
                 "s (two on one A)" if spec.gemm.paired else "", gemm_us, pass_us, at_probe, why)
        if not keep:
            lost.add(ri)
    return lost


def drop_measured_losers(rep: GraphReport, fuse: set, target, rewrite, timer=time_region_on_gpu,
                         host_us: float | None = None, chains: bool = False):
    """(fuse, target) with the regions the GPU shows slower (measure_fused) left to torch: the graph rewritten
    without them by `rewrite(fuse)`, whose kernels are those already compiled (cache hits). target is None
    when nothing is left to run as ComFuse kernels (with `chains`, the rewrite keeps its back-to-back chains)."""
    lost = measure_fused(rep, target, fuse, timer, host_us)
    if not lost:
        return fuse, target
    fuse = fuse - lost
    target = rewrite(fuse) if fuse or chains else None
    if target is not None and not analysis.prepare_kernels(rep, target):
        target = None
    return fuse, target
