"""What ComFuse decides for one captured graph, before any kernel runs: whether ComFuse may run it at all, the
analysis (convert, partition, plan) in a GraphReport, which regions and back-to-back chains to fuse, the rewritten
graph, and the kernels compiled for it. The torch.compile backend (backend.py) and the Inductor pass (inductor.py)
both decide through these; the GPU timing that checks the decisions is measure.py."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import os
from typing import Any

import torch

from . import _core as C
from . import ops, program, tracing
from .convert import NothingToConvert
from .program import NotKeepable

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


def analyze_graph(gm, example_inputs, index: int | None = None, fuse_all: bool = False,
                  defer=False) -> GraphReport:
    """Capture + convert + partition one Dynamo graph, and the reason it falls back (if it does). `defer` (the
    backend's defer_norms): norms finished in the GEMMs that read them, where the weights are the model's
    parameters."""

    rep = GraphReport(next(_GRAPH_IDS) if index is None else index)
    rep.fallback = precheck(gm, example_inputs)

    try:
        aten_gm = tracing.aten_graph(gm, example_inputs)
    except Exception as e:  # analysis must never break the user's model
        rep.error = f"{type(e).__name__}: {e}"
        rep.fallback = rep.fallback or f"ComFuse could not analyze the graph ({rep.error})"
        return rep
    return analyze_aten(rep, aten_gm, example_inputs, fuse_all, _symbolic_inputs(gm, example_inputs), defer,
                        parameter_positions(example_inputs), len(example_inputs))


def parameter_positions(example_inputs) -> tuple:
    """The graph inputs that are the model's parameters (nn.Parameter), as (position, shape, dtype name): with
    Dynamo's inlined modules a parameter is a graph input, and the exported and the post-grad ATen graphs keep the
    inputs' order (analyze_aten checks each placeholder's shape and dtype against it)."""
    return tuple((i, tuple(int(d) for d in x.shape), str(x.dtype)) for i, x in enumerate(example_inputs)
                 if isinstance(x, torch.nn.Parameter))


def _has(placeholder, shape: tuple, dtype: str) -> bool:
    """Placeholder's value has this shape and dtype (a parameter's, parameter_positions)."""
    v = placeholder.meta.get("val")
    return isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(shape) and str(v.dtype) == dtype


def analyze_aten(rep: GraphReport, aten_gm, example_inputs, fuse_all: bool = False, sym=(), defer=False,
                 constant_positions=(), inputs: int | None = None) -> GraphReport:
    """The analysis of one inference ATen graph (from `tracing.aten_graph`, or Inductor's post-grad graph):
    regions, the planner's decision per region, and the reason the whole graph falls back, if it does. With
    `defer`, norms are finished in their GEMM readers whose weights are graph inputs at `constant_positions` of
    the `inputs` inputs the positions were taken from: where the graph has another number of placeholders (an
    input deduplicated or lifted on the way), no position is trusted and nothing is folded."""

    try:
        defer = program.defer_setting(defer)
        bad, good = gemm_dtypes(aten_gm)
        # Per region: an fp32 GEMM among bf16/f16 ones stays in torch in its own dtype. A graph whose GEMMs are
        # all fp32 is converted as it is (rounding its GEMM operands, for the CPU reference checks) and falls
        # back as a whole below.
        placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
        constant = [placeholders[i].name for i, shape, dtype in constant_positions
                    if i < len(placeholders) and _has(placeholders[i], shape, dtype)]
        if defer != "off" and inputs is not None and inputs != len(placeholders):
            log.info("comfuse: graph %d norm deferral: the graph has %d inputs where the model gave %d; which are "
                     "parameters is not known, so no weight is folded", rep.index, len(placeholders), inputs)
            constant = []
        elif defer != "off" and len(constant) != len(constant_positions):
            log.info("comfuse: graph %d norm deferral: %d of the model's %d parameters are not where the graph's "
                     "inputs say (another shape or dtype there); those are not folded", rep.index,
                     len(constant_positions) - len(constant), len(constant_positions))
        rep.analysis = program.analyze(aten_gm, keep_in_torch=bad if good else None, defer=defer,
                                       constant_inputs=constant, fuse_all=fuse_all)
    except NothingToConvert as e:  # not a failure: the graph has nothing ComFuse handles
        rep.fallback = rep.fallback or str(e)
        return rep
    except Exception as e:  # analysis must never break the user's model
        rep.error = f"{type(e).__name__}: {e}"
        rep.fallback = rep.fallback or f"ComFuse could not analyze the graph ({rep.error})"
        return rep

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
        if a.deferred is not None:
            for line in a.deferred.explain().splitlines() or ["no LayerNorm / RMSNorm site"]:
                log.info("comfuse: graph %d norm deferral: %s", rep.index, line)
        if a.conv.dynamic:
            log.info("comfuse: graph %d has a dynamic batch dim%s: analyzed at its example sizes; the kernels take "
                     "the rows M at launch, so other sizes reuse them", rep.index,
                     " and other dynamic leading dims (e.g. the sequence)" if a.conv.dynamic_inner else "")
    if rep.fallback:
        log.info("comfuse: graph %d runs without ComFuse kernels: %s", rep.index, rep.fallback)


def _declined_for_speed_only(p) -> bool:
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


def measuring(fuse_all: bool) -> bool:
    """Whether the planner's choice is checked on the GPU (measure_fused): with fuse="planner", unless
    COMFUSE_MEASURE=0. fuse="all" fuses what it is told."""
    return not fuse_all and os.environ.get("COMFUSE_MEASURE", "1") != "0" and torch.cuda.is_available()


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
            results = [j.result() for j in jobs]
        # what the first call cost: kernels found in the package's kernel pack or the user's cache, or compiled
        got = [r for r in results[:len(distinct)] if r]
        compiled = [r for r in got if not r[1]]
        if got:
            log.info("comfuse: graph %d: %d region kernel(s) prepared: %d from the kernel pack, %d from the cache, "
                     "%d compiled by nvcc%s", rep.index, len(got), sum(1 for r in got if r[3]),
                     sum(1 for r in got if r[1] and not r[3]), len(compiled),
                     f" ({max(r[2] for r in compiled):.0f} s, in parallel)" if compiled else "")
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
