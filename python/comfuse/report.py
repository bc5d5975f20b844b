"""comfuse.explain(model, *example_inputs): what ComFuse would do with a model, and why."""
from __future__ import annotations

import sys

import torch

from . import _core as C
from .analysis import GraphReport, _gemm_targets, analyze_graph, is_near_tie
from .program import planned_spec


def _shape(n) -> str:
    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        return f"{str(v.dtype).replace('torch.', '')}{list(v.shape)}"
    return "?"


def _target(n) -> str:
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        return f"{t.namespace}.{t._opname}.{t._overloadname}"
    return getattr(t, "__name__", str(t))


def report_text(rep: GraphReport) -> str:

    o = []
    a = rep.analysis
    if a is None:
        o.append(f"== graph {rep.index}: not analyzed")
        o.append(f"backend: {rep.fallback}")
        return "\n".join(o) + "\n"
    part, conv, pg = a.part, a.conv, a.part.graph
    fx_nodes = [n for n in conv.gm.graph.nodes if n.op == "call_function"]
    gemms = [n for n in fx_nodes if n.target in _gemm_targets()]
    o.append(f"== graph {rep.index}: {len(fx_nodes)} ATen node(s), {len(gemms)} GEMM(s), {len(part.regions)} fused "
             f"region(s), {len(part.fallback)} Graph IR node(s) on the standard path, {len(conv.torch_nodes)} "
             f"node(s) left in torch")
    o.append(f"backend: {'uses ComFuse kernels' if not rep.fallback else 'falls back: ' + rep.fallback}")
    o.append("GEMMs:")
    for n in gemms:
        args = ", ".join(_shape(x) for x in n.all_input_nodes)
        head = f"  {n.name} = {_target(n)}({args}) -> {_shape(n)}: "
        if n in conv.torch_nodes:
            o.append(head + "left in torch: " + conv.torch_nodes[n])
            continue
        gid = pg.find(n.name + ".mm")
        if gid is None:
            gid = pg.find(n.name)
        d = part.decisions[gid] if gid is not None else None
        if d is None:
            o.append(head + "not in the program (unused)")
        elif d.kind == C.NodeDecision.Kind.FUSED:
            r = part.regions[d.region]
            paired = r.spec.gemm.paired   # two GEMMs on one A: both GEMMs' lines name the region
            pair = (f", with GEMM '{pg.node(r.spec.gemm.node2 if gid == r.root else r.root).name}' on the same A"
                    if paired else "")
            o.append(head + f"epilogue fused: region {d.region} ({len(r.nodes) - (2 if paired else 1)} epilogue node(s), "
                            f"{r.spec.num_stages()} stage(s){pair})")
        else:
            o.append(head + "epilogue NOT fused: " + d.reason.removeprefix("not fused: "))
    o.append("left outside the fused regions:")
    outside = 0
    for n in fx_nodes:
        if n in conv.torch_nodes:
            o.append(f"  {n.name} = {_target(n)}: left in torch: {conv.torch_nodes[n]}")
            outside += 1
    for gid in part.fallback:
        nd = pg.node(gid)
        o.append(f"  {nd.name} = {C.op_name(nd.op)}: standard path: {part.decisions[gid].reason}")
        outside += 1
    if not outside:
        o.append("  (nothing)")
    # the planner's decision per region, from the measurements compiled into the library (src/plan/)
    o.append("plan (from the measured table; a declined region runs unfused, but for a near tie the GPU times faster):")
    plans = rep.plans or [C.plan_region(planned_spec(part, i)) for i in range(len(part.regions))]
    for i, p in enumerate(plans):
        label = ("fuse" if p.fuse else
                 'declined (a near tie: with fuse="planner" on a GPU it is timed there, and fused if faster)'
                 if is_near_tie(p) else "declined")
        o.append(f"  region {i}: {label}: {p.reason}")
    if not plans:
        o.append("  (no region)")
    if len(rep.b2b_plans) != len(rep.chains):   # a report made without analyze_aten's plans
        rep.b2b_plans = [C.plan_b2b(c.spec) if c.recognised else None for c in rep.chains]
    o.extend(_norm_lines(rep))
    chains = rep.chain_lines()
    if chains:   # only graphs with a matmul reading another GEMM's epilogue as its A operand
        o.append("back-to-back chains (GEMM1 -> F -> GEMM2 -> epilogue2; the B2BSpecs are in the partition below):")
        o.extend("  " + line for line in chains)
    o.append("partition (Fusion Specs):")
    o.extend("  " + line if line else "" for line in part.text(False).rstrip("\n").split("\n"))
    return "\n".join(o) + "\n"


def _norm_lines(rep: GraphReport) -> list[str]:
    """The LayerNorm / RMSNorm sites: as deferred (options={"defer_norms": True}), or what deferral would do."""
    a = rep.analysis
    d = a.deferred if a.deferred is not None else C.defer_norms(a.conv.graph, True)
    lines = d.explain().rstrip("\n").splitlines()
    if not lines:
        return []
    head = ("norms (deferral asked for: finished in the GEMMs that read them, or why not):"
            if a.deferred is not None else
            "norms (not deferred; with options={'defer_norms': True} they would be):")
    return [head] + ["  " + line for line in lines]


class Explanation:
    def __init__(self, graphs: list[GraphReport]):
        self.graphs = graphs

    @property
    def regions(self) -> list:
        return [r for g in self.graphs for r in g.regions]

    def __str__(self) -> str:
        head = f"ComFuse explain: {len(self.graphs)} graph(s) captured\n"
        return head + "".join(report_text(g) for g in self.graphs)

    __repr__ = __str__


def explain(model, *example_inputs, file=sys.stdout, defer_norms=False, **kwargs) -> Explanation:
    """Captures `model` with Dynamo (as torch.compile does), runs it once on `example_inputs` under
    torch.no_grad(), and returns (and prints to `file`, unless None) every GEMM found, whether its epilogue is
    fused, the norm sites, the Fusion Specs and the reason for each node left outside. `defer_norms`: analyze as
    the backend's option of that name does. kwargs go to the model."""
    reports: list[GraphReport] = []

    def collect(gm, ex):
        reports.append(analyze_graph(gm, ex, index=len(reports), defer=defer_norms))
        return gm.forward

    compiled = torch.compile(model, backend=collect)
    with torch.no_grad():
        compiled(*example_inputs, **kwargs)
    e = Explanation(reports)
    if file is not None:
        print(e, file=file)
    return e
