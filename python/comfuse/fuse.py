"""fuse_graph: an analyzed graph rewritten with its fused regions and chains as ComFuse calls, their kernels compiled
and, where the planner is checked on the GPU, timed (measure.py). What the backend runs for each Dynamo graph."""
from __future__ import annotations

import logging

import torch

from . import analysis, measure
from .analysis import GraphReport

log = logging.getLogger("comfuse")

def fuse_graph(rep: GraphReport, gm, ctas: int, fuse_all: bool = False, how: str = "keep",
                  graphed: bool = False):
    """The rewritten graph with the planner's fused regions (with `fuse_all`, also those declined for speed
    only) as comfuse::fused_region calls, their kernels compiled now; `gm` on failure."""
    chains = analysis.fused_chains(rep, fuse_all) if how == "keep" else set()   # (the Graph IR rewrite has no chains)
    timed = measure.measuring(fuse_all)
    fuse = analysis.fused_set(rep, fuse_all, chains, timed)
    analysis.log_plans(rep, fuse, chains, timed)
    try:
        target = analysis._rewrite(rep, fuse, ctas, how, chains)
    except Exception as e:   # fallback, never failure
        log.warning("comfuse: graph %d: ComFuse kernels could not be prepared (%s: %s); running it without them",
                    rep.index, type(e).__name__, e)
        return gm
    if not analysis.prepare_kernels(rep, target):
        return gm
    if measure.measuring(fuse_all):
        fuse, target = measure.drop_measured_losers(rep, fuse, target, lambda f: analysis._rewrite(rep, f, ctas, how, chains),
                                            host_us=measure.host_us_per_call(graphed), chains=bool(chains))
        if target is None:
            return gm
    n = count_chains(target)
    log.info("comfuse: graph %d: %d region(s)%s run as ComFuse kernels", rep.index, len(fuse),
             f" and {n} back-to-back chain(s)" if n else "")
    return target


def count_chains(target) -> int:
    """comfuse::fused_chain calls in a rewritten graph."""
    return sum(1 for n in target.graph.nodes if n.op == "call_function" and n.target is torch.ops.comfuse.fused_chain.default)
