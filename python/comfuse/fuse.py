"""fuse_graph: an analyzed graph (analysis.GraphReport) rewritten with the regions and back-to-back chains it fuses as
ComFuse calls, their kernels compiled and, where the planner is checked on the GPU, timed (measure.py). The one
pipeline the torch.compile backend (backend.py) and the Inductor pass (inductor.py) both run."""
from __future__ import annotations

import dataclasses
import logging

import torch

from . import analysis, measure
from .analysis import GraphReport

log = logging.getLogger("comfuse")


@dataclasses.dataclass
class Fused:
    target: object   # the rewritten torch.fx.GraphModule
    fuse: set        # the regions that are comfuse::fused_region calls in it
    chains: set      # the back-to-back chains that are comfuse::fused_chain calls in it


def fuse_graph(rep: GraphReport, ctas: int, fuse_all: bool = False, how: str = "keep", host_us: float | None = None,
               cpu_reference: bool = False, ir_fallback: bool = True) -> Fused | None:
    """The planner's regions (with `fuse_all`, also those declined for speed only) and chains as ComFuse calls.

    how            "keep": the ATen nodes outside the regions kept as they were (rewrite_keeping_torch); "ir": re-emitted
                   from the Graph IR (fp32; no chains)
    host_us        the host cost of a call the GPU timing charges (measure.host_us_per_call); None: its default
    cpu_reference  every region that can take the graph's shapes, run by the CPU reference implementation: no
                   kernels compiled, nothing timed
    ir_fallback    where the regions do not line up with whole ATen nodes, re-emit the rest from the Graph IR instead
                   (the backend can; inside Inductor's pass the graph must keep its ATen nodes: NotKeepable is raised)

    None when the kernels could not be prepared or every planned region lost on the GPU: the graph runs as it was."""
    chains = analysis.fused_chains(rep, fuse_all) if how == "keep" else set()   # (the Graph IR rewrite has no chains)
    timed = not cpu_reference and measure.measuring(fuse_all)
    if cpu_reference:
        fuse = analysis.shapeable(rep, set(range(len(rep.regions)))) - analysis.chain_regions(rep, chains)
    else:
        fuse = analysis.fused_set(rep, fuse_all, chains, timed)
    analysis.log_plans(rep, fuse, chains, timed)
    if how == "keep" and not ir_fallback:
        target, fuse, chains = analysis.keep_rewrite(rep, fuse, ctas, chains, all_regions=cpu_reference)

        def rewrite(f):
            return rep.analysis.program.rewrite_keeping_torch(f, ctas, chains)
    else:
        target = analysis._rewrite(rep, fuse, ctas, how, chains)

        def rewrite(f):
            return analysis._rewrite(rep, f, ctas, how, chains)
    if not cpu_reference and not analysis.prepare_kernels(rep, target):
        return None
    if timed:
        fuse, target = measure.drop_measured_losers(rep, fuse, target, rewrite, host_us=host_us, chains=bool(chains))
        if target is None:
            return None
    return Fused(target, fuse, set(chains) if count_chains(target) else set())


def count_chains(target) -> int:
    """comfuse::fused_chain calls in a rewritten graph."""
    return sum(1 for n in target.graph.nodes if n.op == "call_function" and n.target is torch.ops.comfuse.fused_chain.default)
