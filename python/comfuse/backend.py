"""The torch.compile backend `comfuse` (registered through the `torch_dynamo_backends` entry point).

    model = torch.compile(model, backend="comfuse")

For each graph Dynamo captures: decide whether ComFuse kernels may be used at all (inference, a Hopper GPU,
bf16/f16 GEMMs); capture the inference ATen graph, convert it to the Graph IR, partition it, and
log (INFO, logger "comfuse") the regions that become ComFuse kernels. On CUDA inputs of an sm_90 GPU, the regions
the planner fuses become `comfuse::fused_region` calls (`Program.rewrite_keeping_torch`: every other ATen node is
kept as it was), each compiled by the JIT before the graph runs, and TorchInductor compiles the rest of the graph
around them. Any graph that cannot use ComFuse
kernels - or whose kernels fail to compile - runs through TorchInductor (or eager) unchanged; the log says why.

Dynamic shapes: when Dynamo makes the batch dim symbolic (a second batch size, dynamic=True, mark_dynamic), the
graph is analyzed at its example sizes and the kernels take the rows M at launch, so every later batch size
runs the same compiled kernels (no nvcc, no new graph). Nodes with a symbolic size in another dim (e.g. a
dynamic sequence length inside attention) stay in torch, with that reason in the log and in `explain`.

Options (torch.compile(..., options={...})):
  fallback   "inductor" (default) or "eager": what runs the graph
  reference  True: on CPU tensors, run the rewritten graph with the CPU reference implementation of
             `comfuse::fused_region` (slow; checks capture, conversion and rewrite end to end)
  ctas       column blocks per row in the reference implementation (default 1)
  fuse       "planner" (default): the regions the planner expects to be faster fused; "all": also those it
             declines for speed only (to measure them; regions no kernel can serve still run unfused)
  rewrite    how the nodes outside fused regions are written: "keep" (default on the GPU) copies the ATen
             nodes as they were, so a bf16 model stays bf16 there (falls back to "ir" where a region does
             not line up with whole ATen nodes, logged); "ir" (default with `reference`) re-emits the Graph
             IR's nodes in fp32, the semantics the CPU checks compare against
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import math
import os
from typing import Any

import torch

log = logging.getLogger("comfuse")
_GRAPH_IDS = itertools.count()

GEMM_DTYPES = (torch.bfloat16, torch.float16)
_GEMM_TARGETS = None


def _gemm_targets():
    global _GEMM_TARGETS
    if _GEMM_TARGETS is None:
        aten = torch.ops.aten
        _GEMM_TARGETS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default}
    return _GEMM_TARGETS


@dataclasses.dataclass
class GraphReport:
    """What ComFuse decided for one captured graph."""
    index: int
    fallback: str | None = None       # why the graph does not use ComFuse kernels (None: it would)
    analysis: Any = None              # program.Analysis, when the graph could be analyzed
    error: str | None = None          # why analysis failed, if it did
    gm: Any = None                    # the Dynamo graph and the inputs it was captured with (comfuse.capture)
    example_inputs: Any = None
    plans: list = dataclasses.field(default_factory=list)   # the planner's decision per region
    b2b_plans: list = dataclasses.field(default_factory=list)   # per back-to-back chain: its B2BPlanDecision
                                                                 # (None: not recognised, the chain's reason says why)
    fused_chains: set = dataclasses.field(default_factory=set)  # the chains that became comfuse::fused_chain calls

    @property
    def regions(self) -> list:
        return list(self.analysis.part.regions) if self.analysis else []

    @property
    def chains(self) -> list:
        """The back-to-back candidates partition found (_core.B2BChain: GEMM1 -> F -> GEMM2), recognised or not."""
        return list(getattr(self.analysis.part, "b2b", [])) if self.analysis else []   # (a core built before B2B: none)

    def gemm_name(self, gid: int) -> str:
        """A GEMM of the partitioned Graph IR by the name of its ATen node (addmm, bmm_1, ...)."""
        name = self.analysis.part.graph.node(gid).name
        f = self.analysis.program.fx_of(name)
        return f.name if f is not None else name

    def chain_lines(self) -> list[str]:
        """One line per back-to-back chain: what it is, and why it is not (or is) fused as one kernel."""
        out = []
        for i, (c, p) in enumerate(zip(self.chains, self.b2b_plans)):
            head = f"chain {i}: GEMM '{self.gemm_name(c.gemm1)}' -> GEMM '{self.gemm_name(c.gemm2)}': "
            if not c.recognised:
                out.append(head + "not recognised: " + c.reason)
            else:
                out.append(head + f"recognised (F {c.spec.form}): {c.reason}; " +
                           ("the planner fuses it (" + p.reason + ")" if p.fuse else "not fused: " + p.reason))
        return out


def _tensors(xs):
    return [x for x in xs if isinstance(x, torch.Tensor)]


def _symbolic_inputs(gm, example_inputs) -> list[str]:
    out = []
    for n, x in zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs):
        ev = n.meta.get("example_value", x)
        if isinstance(ev, torch.SymInt) or isinstance(x, torch.SymInt):
            out.append(f"{n.name} (a size)")
        elif isinstance(ev, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in ev.shape):
            out.append(f"{n.name}{list(ev.shape)}")
    return out


def precheck(gm, example_inputs) -> str | None:
    """Reasons that need no analysis: gradients."""
    ts = _tensors(example_inputs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return ("graph needs gradients (autograd is on and an input requires grad): ComFuse compiles inference "
                "graphs; run the model under torch.no_grad() or torch.inference_mode()")
    return None


def _dynamic_reason(rep: GraphReport, sym: list[str]) -> str:
    """Why a graph with symbolic sizes has no fusable region: the first node kept in torch for a dynamic size."""
    why = next((r for r in rep.analysis.conv.torch_nodes.values() if "dynamic" in r), None) if rep.analysis else None
    return ("dynamic shapes (symbolic sizes in " + ", ".join(sym[:4]) + (", ..." if len(sym) > 4 else "") +
            "): no GEMM epilogue left to fuse" + (f" ({why})" if why else ""))


def device_reason(example_inputs) -> str | None:
    # 0-dim CPU tensors go with CUDA ones in torch ops (Dynamo passes float attributes so under dynamic=True); the
    # rewrite copies those a fused call reads to the GPU (emit._on_device)
    every = _tensors(example_inputs)
    if not every:
        return None
    ts = [t for t in every if t.dim() > 0 or t.device.type != "cpu"] or every
    if any(t.device.type == "cpu" for t in ts):
        return "CPU tensors: ComFuse kernels run on NVIDIA Hopper GPUs (sm_90)"
    devs = {t.device for t in ts if t.device.type == "cuda"}
    for d in devs:
        cc = torch.cuda.get_device_capability(d)
        if cc != (9, 0):
            return (f"GPU {torch.cuda.get_device_name(d)} has compute capability {cc[0]}.{cc[1]}: ComFuse kernels "
                    f"need 9.0 (H100/H200)")
    if any(t.device.type not in ("cpu", "cuda") for t in ts):
        return f"{ts[0].device.type} tensors: ComFuse kernels run on NVIDIA Hopper GPUs"
    return None


def _gemm_dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


def gemm_dtypes(aten_gm) -> tuple[dict, list]:
    """The GEMMs ComFuse kernels cannot take for their dtype (fx.Node -> reason), and those they can."""
    bad, good = {}, []
    for n in aten_gm.graph.nodes:
        if n.op == "call_function" and n.target in _gemm_targets():
            dt = n.meta["val"].dtype
            if dt in GEMM_DTYPES:
                good.append(n)
            else:
                bad[n] = (f"dtype {_gemm_dtype_name(dt)} GEMM: ComFuse kernels take bf16/f16 operands; it stays in "
                          f"torch in its own dtype")
    return bad, good


def dtype_reason(aten_gm) -> str | None:
    """Why no GEMM of the graph can run as a ComFuse kernel for its dtype (None: at least one can). A graph
    with bf16/f16 GEMMs keeps only its other GEMMs in torch (per region, `gemm_dtypes`)."""
    bad, good = gemm_dtypes(aten_gm)
    if bad and not good:
        n = next(iter(bad))
        return (f"dtype {_gemm_dtype_name(n.meta['val'].dtype)} GEMM '{n.name}': ComFuse kernels take bf16/f16 "
                f"operands (cast the model with .to(torch.bfloat16))")
    return None


def analyze_graph(gm, example_inputs, index: int | None = None, fuse_all: bool = False) -> GraphReport:
    """Capture + convert + partition one Dynamo graph, and the reason it falls back (if it does)."""
    from . import tracing

    rep = GraphReport(next(_GRAPH_IDS) if index is None else index)
    rep.fallback = precheck(gm, example_inputs)

    try:
        aten_gm = tracing.aten_graph(gm, example_inputs)
    except Exception as e:  # analysis must never break the user's model
        rep.error = f"{type(e).__name__}: {e}"
        rep.fallback = rep.fallback or f"ComFuse could not analyze the graph ({rep.error})"
        return rep
    return analyze_aten(rep, aten_gm, example_inputs, fuse_all, _symbolic_inputs(gm, example_inputs))


def analyze_aten(rep: GraphReport, aten_gm, example_inputs, fuse_all: bool = False, sym=()) -> GraphReport:
    """The analysis of one inference ATen graph (from `tracing.aten_graph`, or Inductor's post-grad graph):
    regions, the planner's decision per region, and the reason the whole graph falls back, if it does."""
    from . import program
    from .convert import NothingToConvert

    try:
        bad, good = gemm_dtypes(aten_gm)
        # Per region: an fp32 GEMM among bf16/f16 ones stays in torch in its own dtype. A graph whose GEMMs are
        # all fp32 is converted as it is (rounding its GEMM operands, for the CPU reference checks) and falls
        # back as a whole below.
        rep.analysis = program.analyze(aten_gm, keep_in_torch=bad if good else None)
    except NothingToConvert as e:  # not a failure: the graph has nothing ComFuse handles
        rep.fallback = rep.fallback or str(e)
        return rep
    except Exception as e:  # analysis must never break the user's model
        rep.error = f"{type(e).__name__}: {e}"
        rep.fallback = rep.fallback or f"ComFuse could not analyze the graph ({rep.error})"
        return rep
    from . import _core as C

    rep.b2b_plans = [C.plan_b2b(c.spec) if c.recognised else None for c in rep.chains]
    fused_chain = any(p is not None and (p.fuse or (fuse_all and _declined_for_speed_only(p))) for p in rep.b2b_plans)
    no_region = None if rep.regions or fused_chain else (_dynamic_reason(rep, sym) if sym else
                                                          "no GEMM with a fusable epilogue in this graph")
    declined = [p for p in rep.b2b_plans if p is not None and not p.fuse]
    if no_region and declined:   # e.g. attention: two batched GEMMs, a recognised chain that is not fused yet
        no_region += (f" ({len(declined)} back-to-back chain(s) recognised, not fused: {declined[0].reason})")
    rep.fallback = rep.fallback or dtype_reason(aten_gm) or no_region or device_reason(example_inputs)
    # priced as the rewrite stores them (program.planned_spec: handed-on values in their own bf16/f16 dtype)
    rep.plans = [C.plan_region(program.planned_spec(rep.analysis.part, i, rep.analysis.program.splits.get(i)))
                 for i in range(len(rep.regions))]
    if rep.fallback is None:
        dev = next(t.device for t in _tensors(example_inputs) if t.device.type == "cuda")
        why = C.unsupported_device_reason(dev.index or 0)
        if why:
            rep.fallback = f"ComFuse kernels cannot run here: {why}"
        elif not fused_chain and not planned(rep, fuse_all, measuring(fuse_all)):
            rep.fallback = "the planner declines every region: " + "; ".join(
                f"region {i}: {p.reason}" for i, p in enumerate(rep.plans))
    return rep


def log_report(rep: GraphReport) -> None:
    if rep.analysis is not None:
        a = rep.analysis
        pg = a.part.graph
        for i, r in enumerate(a.part.regions):
            g = r.spec.gemm
            second = f" and GEMM '{pg.node(g.node2).name}' on the same A" if g.paired else ""
            log.info("comfuse: graph %d region %d: GEMM '%s'%s [rows=%d N=%d K=%d %s] + %d epilogue node(s), "
                     "%d stage(s) -> one ComFuse kernel", rep.index, i, pg.node(r.root).name, second, g.rows, g.n, g.k,
                     str(g.dtype).split(".")[-1].lower(), len(r.nodes) - (2 if g.paired else 1), r.spec.num_stages())
        log.info("comfuse: graph %d: %d region(s), %d Graph IR node(s) on the standard path, %d node(s) left in torch",
                 rep.index, len(a.part.regions), len(a.part.fallback), len(a.conv.torch_nodes))
        for line in rep.chain_lines():
            log.info("comfuse: graph %d back-to-back %s", rep.index, line)
        if a.conv.dynamic:
            log.info("comfuse: graph %d has a dynamic batch dim%s: analyzed at its example sizes; the kernels take "
                     "the rows M at launch, so other sizes reuse them", rep.index,
                     " and other dynamic leading dims (e.g. the sequence)" if a.conv.dynamic_inner else "")
    if rep.fallback:
        log.info("comfuse: graph %d runs without ComFuse kernels: %s", rep.index, rep.fallback)


def _declined_for_speed_only(p) -> bool:
    from . import _core as C   # (the extension; this module is imported before it is needed)
    return p.verdict == C.Verdict.Slower


# With fuse="planner" on a GPU, a region the planner's estimate declines for speed only, by no more than this
# fraction of the GEMM and its pass, is compiled and timed too (measure_fused), and fused where it wins there: the
# estimate scales a table measured at other shapes and epilogues and can miss by tens of percent either way: HF
# Llama's o_proj + residual + RMSNorm (two outputs, 8192 x 1024 x 1024) was estimated at ~60 us and took 42 us
# (docs/log/2026-12-04.md). Each one costs its kernel's compile (once per structure).
NEAR_TIE = 0.35


def is_near_tie(p) -> bool:
    """Whether the planner declines a region for speed only, with its estimated fused time within NEAR_TIE of the
    GEMM and its separate pass."""
    return _declined_for_speed_only(p) and p.fused_us <= p.unfused_us * (1.0 + NEAR_TIE)


def near_ties(rep: GraphReport) -> set:
    """The regions that are near ties (is_near_tie): measure_fused times them with the planner's choice."""
    return {i for i, p in enumerate(rep.plans) if is_near_tie(p)}


def planned(rep: GraphReport, fuse_all: bool = False, timed: bool = False) -> set:
    """The regions the planner fuses; with `fuse_all` also those it declines for speed only; with `timed` (the
    choice is checked on the GPU: measuring) also its near ties, to be timed."""
    return {i for i, p in enumerate(rep.plans)
            if p.fuse or (fuse_all and _declined_for_speed_only(p)) or (timed and is_near_tie(p))}


def keep_rewrite(rep: GraphReport, fuse: set, ctas: int, chains=(), all_regions: bool = False):
    """(target, fuse, chains): rewrite_keeping_torch with the regions in `fuse` and the back-to-back chains in
    `chains`. Where the chains do not line up with whole ATen nodes, it is said and they are left out, their regions
    joining `fuse` where the planner fuses them (all of them with `all_regions`). Raises NotKeepable when the regions
    alone do not line up either."""
    from .program import NotKeepable

    prog = rep.analysis.program
    try:
        return prog.rewrite_keeping_torch(fuse, ctas, chains), fuse, set(chains)
    except NotKeepable as e:
        if not chains:
            raise
        log.info("comfuse: graph %d: back-to-back chains %s not fused (%s)", rep.index, sorted(chains), e)
    fuse = fuse | {r for r in chain_regions(rep, chains) if all_regions or rep.plans[r].fuse}
    return prog.rewrite_keeping_torch(fuse, ctas), fuse, set()


def _rewrite(rep: GraphReport, fuse: set, ctas: int, how: str, chains=()):
    """The program with the regions in `fuse` as comfuse::fused_region calls and the back-to-back chains in `chains`
    as comfuse::fused_chain calls (see the `rewrite` option; the Graph IR rewrite has no chains: pass none)."""
    from .program import NotKeepable

    prog = rep.analysis.program
    # symbolic sizes beyond dim 0 (a dynamic sequence): only the ATen-keeping rewrite expresses them
    if how == "keep" or prog.conv.dynamic_inner:
        try:
            return keep_rewrite(rep, fuse, ctas, chains)[0]
        except NotKeepable as e:
            fuse = fuse | {r for r in chain_regions(rep, chains) if rep.plans[r].fuse}   # (the IR rewrite: no chains)
            if prog.conv.dynamic_inner:
                raise
            log.info("comfuse: graph %d: nodes outside the fused regions re-emitted from the Graph IR (fp32): %s",
                     rep.index, e)
    return prog.rewrite(ctas, fuse=fuse)


def fused_set(rep: GraphReport, fuse_all: bool = False, chains=(), timed: bool = False) -> set:
    """The regions to fuse (planned), less those a dynamic sequence rules out (shapeable) and those the
    back-to-back chains in `chains` compute."""
    return shapeable(rep, planned(rep, fuse_all, timed)) - chain_regions(rep, chains)


def fused_chains(rep: GraphReport, fuse_all: bool = False) -> set:
    """The recognised back-to-back chains to run as one kernel each (comfuse::fused_chain): those the planner fuses
    (plan_b2b: where the flash-style kernel was measured faster), with `fuse_all` also those it declines for speed
    only. None in a graph with a dynamic dim other than dim 0 (the chain's batch would have to be known)."""
    if rep.analysis is None or rep.analysis.conv.dynamic_inner:
        return set()
    return {ci for ci, (c, p) in enumerate(zip(rep.chains, rep.b2b_plans))
            if c.recognised and p is not None and (p.fuse or (fuse_all and _declined_for_speed_only(p)))}


def chain_regions(rep: GraphReport, chains) -> set:
    """The partition's regions the chains in `chains` replace (GEMM1's and GEMM2's, where they are regions)."""
    return {r for ci in chains for r in (rep.chains[ci].region1, rep.chains[ci].region2) if r >= 0}


def shapeable(rep: GraphReport, fuse: set) -> set:
    """`fuse` less, with a dynamic dim other than dim 0 (a sequence), the regions whose outputs regroup their rows
    (A flattened to [rows, K], an output [B, S, N]): shaping those outputs would need the sequence length, which
    A no longer has. Each one dropped is logged."""
    from . import ops

    if rep.analysis is None or not rep.analysis.conv.dynamic_inner:
        return set(fuse)
    out = set()
    for i in sorted(fuse):
        spec = rep.regions[i].spec
        if all(ops.has_gemm_lead(spec, o) for o in spec.outputs):   # A's leading dims, symbolic ones included
            out.add(i)
        else:
            log.info("comfuse: graph %d region %d: not fused: its outputs regroup the GEMM's rows, and a dynamic "
                     "dim other than dim 0 would have to be known to shape them", rep.index, i)
    return out


def log_plans(rep: GraphReport, fuse: set, chains=(), timed: bool = False) -> None:
    computed = chain_regions(rep, chains)
    for i, p in enumerate(rep.plans):
        label = ("part of a fused back-to-back chain" if i in computed else
                 "fused" if p.fuse else
                 f"to be timed on this GPU (a near tie: the estimate declines it by less than {NEAR_TIE:.0%})"
                 if timed and i in fuse else
                 "fused (fuse='all'; the planner would not)" if i in fuse else "not fused")
        log.info("comfuse: graph %d region %d: %s (%s)", rep.index, i, label, p.reason)
    for ci in sorted(chains):
        log.info("comfuse: graph %d back-to-back chain %d: fused as one kernel (%s)", rep.index, ci, rep.b2b_plans[ci].reason)


def prepare_kernels(rep: GraphReport, target) -> bool:
    """Compiles the kernels of every comfuse::fused_region call in `target` now (so that a compile failure
    falls back here, not while the model runs); False, with a warning, if one fails."""
    from . import ops

    try:
        keys = [n.args[0] for n in target.graph.nodes
                if n.op == "call_function" and n.target is torch.ops.comfuse.fused_region.default]
        chain_keys = [n.args[0] for n in target.graph.nodes
                      if n.op == "call_function" and n.target is torch.ops.comfuse.fused_chain.default]
        # nvcc runs with the GIL released: distinct kernels (one per structure: every layer of a stack shares
        # one) compile into the cache in parallel; the libraries are then loaded here, on this thread, as cache
        # hits (milliseconds each).
        distinct = list({(ops.region_spec(k).structural_hash(), ops.region_spec(k).gemm.rows): k for k in keys}.values())
        workers = max(1, min(len(distinct) + len(chain_keys), os.cpu_count() or 1, 16))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            jobs = [pool.submit(ops.compile_kernel, k) for k in distinct] + \
                   [pool.submit(ops.chain_kernel, k) for k in chain_keys]   # (a chain's kernel is loaded, too)
            for j in jobs:
                j.result()
        kernels = [ops.gpu_kernel(k) for k in keys]
        for k in kernels:
            spills = k.spill_note
            log.info("comfuse: graph %d: kernel %s [%s, transport %s]%s%s", rep.index, k.name, k.config,
                     k.transport, " (cache hit)" if k.cache_hit else f" compiled in {k.compile_seconds:.1f} s",
                     f" ({spills})" if spills else "")
        for key in chain_keys:
            k = ops.chain_kernel(key)
            log.info("comfuse: graph %d: back-to-back kernel %s [%s]%s", rep.index, k.name, k.config,
                     " (cache hit)" if k.cache_hit else f" compiled in {k.compile_seconds:.1f} s")
    except Exception as e:   # fallback, never failure
        log.warning("comfuse: graph %d: ComFuse kernels could not be prepared (%s: %s); running it without them",
                    rep.index, type(e).__name__, e)
        return False
    return True


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
    from . import ops

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
    from . import ops

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
    from . import ops

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
    from . import ops

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


def measuring(fuse_all: bool) -> bool:
    """Whether the planner's choice is checked on the GPU (measure_fused): with fuse="planner", unless
    COMFUSE_MEASURE=0. fuse="all" fuses what it is told."""
    return not fuse_all and os.environ.get("COMFUSE_MEASURE", "1") != "0" and torch.cuda.is_available()


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
    if target is not None and not prepare_kernels(rep, target):
        target = None
    return fuse, target


def _with_kernels(rep: GraphReport, gm, ctas: int, fuse_all: bool = False, how: str = "keep",
                  graphed: bool = False):
    """The rewritten graph with the planner's fused regions (with `fuse_all`, also those declined for speed
    only) as comfuse::fused_region calls, their kernels compiled now; `gm` on failure."""
    chains = fused_chains(rep, fuse_all) if how == "keep" else set()   # (the Graph IR rewrite has no chains)
    timed = measuring(fuse_all)
    fuse = fused_set(rep, fuse_all, chains, timed)
    log_plans(rep, fuse, chains, timed)
    try:
        target = _rewrite(rep, fuse, ctas, how, chains)
    except Exception as e:   # fallback, never failure
        log.warning("comfuse: graph %d: ComFuse kernels could not be prepared (%s: %s); running it without them",
                    rep.index, type(e).__name__, e)
        return gm
    if not prepare_kernels(rep, target):
        return gm
    if measuring(fuse_all):
        fuse, target = drop_measured_losers(rep, fuse, target, lambda f: _rewrite(rep, f, ctas, how, chains),
                                            host_us=host_us_per_call(graphed), chains=bool(chains))
        if target is None:
            return gm
    n = count_chains(target)
    log.info("comfuse: graph %d: %d region(s)%s run as ComFuse kernels", rep.index, len(fuse),
             f" and {n} back-to-back chain(s)" if n else "")
    return target


def count_chains(target) -> int:
    """comfuse::fused_chain calls in a rewritten graph."""
    return sum(1 for n in target.graph.nodes if n.op == "call_function" and n.target is torch.ops.comfuse.fused_chain.default)


_COMFUSE_OPTIONS = ("fallback", "reference", "ctas", "fuse", "rewrite", "mode", "inductor", "attention")


def default_attention(version: str | None = None) -> str:
    """attention="auto": "inductor" from torch 2.11, "eager" before. Tracing picks an SDPA kernel the way eager does;
    with torch 2.11 on the H200, Inductor ran HF BERT (padding mask), the Llama-style model and GPT-2 on cuDNN's
    fused attention kernel, while comfuse::sdpa (a Python custom op, then eager's kernel selection) cost ~150 us of
    host time per call against Inductor's ~11 (docs/log/2026-12-02.md): in default mode, BERT-base ran 0.80x
    Inductor with it. Earlier torch decomposed BERT's masked SDPA into an fp32 math path, which comfuse::sdpa avoids."""
    major, minor = (int(x) for x in (version or torch.__version__).split("+")[0].split(".")[:2])
    return "inductor" if (major, minor) >= (2, 11) else "eager"


def comfuse_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """The `comfuse` torch.compile backend. Inductor's mode comes from torch.compile(mode=...) or, since
    torch.compile refuses mode= together with options=, from options={"mode": ...}; Inductor's own options go
    in options={"inductor": {...}}. See docs/pytorch.md."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(_COMFUSE_OPTIONS))
    if unknown:
        raise ValueError(f"comfuse backend: unknown options {unknown} (ComFuse's: {list(_COMFUSE_OPTIONS)}; "
                         f"Inductor's go in options={{'inductor': {{...}}}})")
    runner = opts.pop("fallback", "inductor")
    reference = bool(opts.pop("reference", False))
    ctas = int(opts.pop("ctas", 1))
    fuse = opts.pop("fuse", "planner")
    if fuse not in ("planner", "all"):
        raise ValueError(f"comfuse backend: fuse must be 'planner' or 'all', got {fuse!r}")
    how = opts.pop("rewrite", "ir" if reference else "keep")
    if how not in ("keep", "ir"):
        raise ValueError(f"comfuse backend: rewrite must be 'keep' or 'ir', got {how!r}")
    if runner not in ("inductor", "eager"):
        raise ValueError(f"comfuse backend: fallback must be 'inductor' or 'eager', got {runner!r}")
    mode = opts.pop("mode", None) if mode is None else mode
    if "mode" in opts:
        raise ValueError("comfuse backend: Inductor's mode given twice (mode= and options['mode'])")
    if mode not in (None, "default"):
        torch._inductor.list_mode_options(mode)   # raises for an unknown mode, with the list
    inductor_opts = dict(opts.pop("inductor", None) or {})
    if runner == "eager" and (mode not in (None, "default") or inductor_opts):
        raise ValueError("comfuse backend: mode and Inductor options need fallback='inductor'")

    attention = opts.pop("attention", "auto")
    if attention not in ("auto", "eager", "inductor"):
        raise ValueError(f"comfuse backend: attention must be 'auto', 'eager' or 'inductor', got {attention!r}")
    if attention == "auto":
        attention = default_attention()
    if attention == "eager" and any(t.device.type == "cuda" for t in _tensors(example_inputs)):
        from . import ops

        n = ops.keep_sdpa_whole(gm)
        if n:
            log.info("comfuse: %d scaled_dot_product_attention call(s) kept whole (comfuse::sdpa: the kernel eager "
                     "picks)", n)

    if runner == "inductor" and how == "keep":
        return _compile_with_pass(gm, example_inputs, fuse, reference, ctas, mode, inductor_opts)

    # fallback="eager", or the fp32 "ir" rewrite the CPU reference checks use: analyze the Dynamo graph here
    # and hand the rewritten graph to eager or to Inductor.
    rep = analyze_graph(gm, example_inputs, fuse_all=fuse == "all")
    if rep.fallback and rep.fallback.startswith("graph needs gradients"):
        log.warning("comfuse: graph %d: %s; running it with %s", rep.index, rep.fallback, runner)
    log_report(rep)

    target = gm
    if rep.fallback is None and not reference:
        graphed = runner == "inductor" and (mode == "reduce-overhead" or
                                            bool((inductor_opts or {}).get("triton.cudagraphs")))
        target = _with_kernels(rep, gm, ctas, fuse == "all", how, graphed)
    elif (reference and rep.analysis is not None and rep.regions and
            all(t.device.type == "cpu" for t in _tensors(example_inputs)) and
            not (rep.fallback or "").startswith("graph needs gradients")):
        try:
            target = _rewrite(rep, shapeable(rep, set(range(len(rep.regions)))), ctas, how)
            log.info("comfuse: graph %d: running %d region(s) through the CPU reference implementation",
                     rep.index, len(rep.regions))
        except Exception as e:   # fallback, never failure
            log.warning("comfuse: graph %d runs without ComFuse kernels: %s: %s", rep.index, type(e).__name__, e)
    if runner == "eager":
        return target.forward
    from torch._inductor.compile_fx import compile_fx

    from .inductor import inductor_config

    patches = inductor_config(mode=mode, options=inductor_opts)
    patches.pop("post_grad_custom_post_pass")
    return compile_fx(target, example_inputs, config_patches=patches)


def _compile_with_pass(gm, example_inputs, fuse, reference, ctas, mode, inductor_opts):
    """Inductor compiles the Dynamo graph with the user's mode and options; ComFusePass replaces the fused
    regions in its post-grad graph (one AOT trace). A graph that needs gradients skips the pass; on a device
    ComFuse kernels cannot run on (CPU tensors without `reference`, a GPU other than sm_90), the pass only
    analyzes and logs."""
    from torch._inductor.compile_fx import compile_fx

    from . import tracing
    from .inductor import inductor_config

    why = precheck(gm, example_inputs)
    patches = inductor_config(fuse=fuse, reference=reference, ctas=ctas, mode=mode, options=inductor_opts)
    if why:
        log.warning("comfuse: graph %d: %s; running it with Inductor", next(_GRAPH_IDS), why)
        patches.pop("post_grad_custom_post_pass")
        return compile_fx(gm, example_inputs, config_patches=patches)
    # ComFuse's decompositions: Inductor's, less those that would split what the Graph IR has whole (GELU,
    # SiLU, the GEMMs)
    return compile_fx(gm, example_inputs, config_patches=patches, decompositions=tracing.decomposition_table())


def compile_backend(mode: str | None = None, fuse: str = "planner", inductor: dict | None = None, **options):
    """A configured `comfuse` backend, torch.compile(model, backend=comfuse.compile_backend(...)): Inductor's `mode`
    and options (`inductor`), and ComFuse's own (`fuse`, and the rest of comfuse_backend's options) in one call."""
    opts = dict(options, fuse=fuse, mode=mode, inductor=inductor)

    def comfuse_configured(gm, example_inputs):
        return comfuse_backend(gm, example_inputs, options={k: v for k, v in opts.items() if v is not None})

    return comfuse_configured
