"""The partitioned program: fused regions, standard-path Graph IR nodes and torch nodes in one schedule.

`analyze(aten_gm)` converts an ATen graph (convert.py), partitions the Graph IR with the core and orders three
kinds of steps into one program:

  region  a fused GEMM + epilogue (one ComFuse kernel; its FusionSpec)
  node    a Graph IR node on the standard path (transpose, a reduction over rows, ...)
  torch   an ATen node the Graph IR does not cover (it stays as it was)

The core's partition sees only the Graph IR, in which a torch node's result is a plain input. A region can
therefore read a value that a torch node computes from that same region's output (matmul -> cumsum -> add
with the matmul): a cycle. `analyze` finds such cycles and leaves the region node that closes one in torch
(with that reason), then converts again, until the program is acyclic.

This module schedules (Program.build, with named value keys: TorchValue, IrValue). The program's other two jobs
live beside it, and Program's methods of the same names call them: reference.py runs it on the CPU reference
interpreters (`run`), emit.py writes it back as an FX graph in which each region is one call of the
`comfuse::fused_region` custom op (`rewrite`, `rewrite_keeping_torch`) — the graph TorchInductor compiles.
"""
from __future__ import annotations

import dataclasses
import heapq
from typing import Any, NamedTuple

import torch.fx as fx

from . import _core as C
from . import emit, parts, reference
from .convert import OK, Conversion, convert
from .emit import NotKeepable, emit_aten_node  # noqa: F401  (re-exported: program.NotKeepable)


class TorchValue(NamedTuple):
    """The result of an ATen node that stays in torch (or feeds a Graph IR input)."""
    node: fx.Node


class IrValue(NamedTuple):
    """A Graph IR value, by name."""
    name: str


@dataclasses.dataclass
class Step:
    kind: str                 # "region" | "node" | "torch"
    index: Any                # region index | p.graph node id | fx.Node
    reads: list
    writes: list
    first: int                # position of its first FX node (stable tie-break)


class Program:
    def __init__(self, conv: Conversion, part, deferred=None):
        self.conv = conv
        self.part = part                  # _core.Partition of conv.graph (or of its norm-deferred rewrite)
        self.deferred = deferred          # _core.DeferredProgram when norms were deferred (analyze(defer=True))
        # Graph IR values the rewrite made (folded weights, per-row factors, rebuilt values): no ATen node holds them
        self.made: frozenset = frozenset() if deferred is None else frozenset(
            n.name for n in deferred.graph.nodes) - frozenset(n.name for n in conv.graph.nodes)
        self.pg = part.graph              # decomposed, dead-code-free Graph IR (names kept)
        self.regions = list(part.regions)
        self.gm = conv.gm
        self.fx_by_name = {n.name: n for n in self.gm.graph.nodes}
        self.pos = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        self.nodes = self.pg.nodes
        self.steps: list[Step] = []
        self.cycle: tuple | None = None   # (value name, region index, [region node ids]) when not acyclic
        # {region: {output: parts.SplitLayout}}: outputs whose parts torch copies (the key / value cache), stored
        # in parts where split, so that the copies become views
        self.splits: dict = parts.find_for_regions(self)

    # ------------------------------------------------------------ value keys
    def fx_of(self, name: str) -> fx.Node | None:
        return self.fx_by_name.get(name.split(".")[0])

    def key_of_g(self, gid: int):
        """What provides Graph IR value gid: None (always there), a TorchValue or an IrValue."""
        n = self.nodes[gid]
        if n.op == OK.Input:
            src = self.conv.input_source[n.name]
            return TorchValue(src) if src in self.conv.torch_nodes else None
        if n.op == OK.Constant:
            return None
        return IrValue(n.name)

    def key_of_fx(self, a: fx.Node):
        if a in self.conv.torch_nodes:
            return TorchValue(a)
        v = self.conv.value.get(a)
        if v is None:
            return None  # placeholder / get_attr
        gid = self.pg.find(self.conv.graph.node(v).name)
        if gid is None:
            # an input / constant the core dropped as dead cannot be read here; a converted value always exists
            src = self.conv.graph.node(v)
            return TorchValue(self.conv.input_source[src.name]) if src.op == OK.Input and \
                self.conv.input_source[src.name] in self.conv.torch_nodes else None
        return self.key_of_g(gid)

    def first_pos(self, names) -> int:
        ps = [self.pos[f] for f in (self.fx_of(nm) for nm in names) if f is not None]
        return min(ps) if ps else 0

    # ------------------------------------------------------------ schedule
    def build(self, with_regions: bool = True) -> bool:
        steps: list[Step] = []
        in_region = set()
        if with_regions:
            for ri, r in enumerate(self.regions):
                fs = r.spec
                reads = [self.key_of_g(fs.gemm.a), self.key_of_g(fs.gemm.b)] + [self.key_of_g(p.node) for p in fs.params]
                writes = [IrValue(o.name) for o in fs.outputs]
                steps.append(Step("region", ri, [k for k in reads if k], writes,
                                  self.first_pos([self.nodes[i].name for i in r.nodes])))
                in_region.update(r.nodes)
            order = [i for fused, i in self.part.schedule if not fused]
        else:
            order = [n.id for n in self.nodes if n.op not in (OK.Input, OK.Constant)]
        for gid in order:
            n = self.nodes[gid]
            reads = [self.key_of_g(i) for i in n.inputs]
            steps.append(Step("node", gid, [k for k in reads if k], [IrValue(n.name)], self.first_pos([n.name])))
        for t in self.conv.torch_nodes:
            reads = [self.key_of_fx(a) for a in t.all_input_nodes]
            steps.append(Step("torch", t, [k for k in reads if k], [TorchValue(t)], self.pos[t]))
        # Kahn, ties broken by FX position
        producer = {}
        for si, s in enumerate(steps):
            for w in s.writes:
                producer[w] = si
        succ = [set() for _ in steps]
        indeg = [0] * len(steps)
        for si, s in enumerate(steps):
            for r in s.reads:
                p = producer.get(r)
                if p is None:
                    raise AssertionError(f"program: no step provides {r}")
                if p != si and si not in succ[p]:
                    succ[p].add(si)
                    indeg[si] += 1
        ready = [(s.first, si) for si, s in enumerate(steps) if indeg[si] == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            _, si = heapq.heappop(ready)
            out.append(steps[si])
            for t in succ[si]:
                indeg[t] -= 1
                if indeg[t] == 0:
                    heapq.heappush(ready, (steps[t].first, t))
        if len(out) != len(steps):
            self.cycle = self._find_cycle(steps, [si for si in range(len(steps)) if indeg[si] > 0])
            return False
        self.steps = out
        return True

    def _find_cycle(self, steps, stuck):
        """A value outside a region on a cycle (a torch node, or a standard-path node computed from one), its
        name, and the region nodes that read it."""
        stuck_regions = [steps[si].index for si in stuck if steps[si].kind == "region"]
        stuck_keys = {w for si in stuck if steps[si].kind != "region" for w in steps[si].writes}
        for ri in stuck_regions:
            r = self.regions[ri]
            for gid in r.nodes:
                for i in self.nodes[gid].inputs:
                    k = self.key_of_g(i)
                    if k and k in stuck_keys and i not in r.nodes:
                        readers = [g for g in r.nodes if i in self.nodes[g].inputs]
                        name = k.node.name if isinstance(k, TorchValue) else k.name
                        return (name, ri, readers)
        raise AssertionError("program: cycle without a torch node between regions")

    # ------------------------------------------------------------ reading Graph IR values
    def ir_reader(self, env: dict, from_input, from_constant, who: str):
        """`get(gid)`: Graph IR value gid as a run (reference.py) or an emission (emit.py) holds it in `env`,
        by node name. A value not there yet must be an input or a constant: made once, on its first read, by
        `from_input(node, its fx source)` or `from_constant(gid, node)`, and kept in `env`. Anything else is
        read before its step computes it, which names `who` in the error."""
        def get(gid):
            n = self.nodes[gid]
            if n.name in env:
                return env[n.name]
            if n.op == OK.Input:
                v = from_input(n, self.conv.input_source[n.name])
            elif n.op == OK.Constant:
                v = from_constant(gid, n)
            else:
                raise AssertionError(f"{who}: '{n.name}' read before it is computed")
            env[n.name] = v
            return v
        return get

    # ------------------------------------------------------------ the other two jobs, in their own modules
    def run(self, args, mode: str = "spec", ctas: int = 1) -> list:
        """The CPU reference run (reference.run)."""
        return reference.run(self, args, mode, ctas)

    def rewrite(self, ctas: int = 1, fuse=None) -> fx.GraphModule:
        """The program re-emitted from the Graph IR (emit.rewrite)."""
        return emit.rewrite(self, ctas, fuse)

    def rewrite_keeping_torch(self, fuse, ctas: int = 1, chains=()) -> fx.GraphModule:
        """The ATen graph with only the regions in `fuse` and the back-to-back chains in `chains` changed
        (emit.rewrite_keeping_torch)."""
        return emit.rewrite_keeping_torch(self, fuse, ctas, chains)

    def region_in_torch(self, ri: int):
        return emit.region_in_torch(self, ri)

    def node_spec(self, n) -> tuple:
        """A hashable description of a Graph IR node for ops.eval_graph_node. A reshape with one symbolic dim
        (a dynamic batch, or batch x sequence flattened) gets -1 there: torch infers it at run time. One with
        more has no such form: its shape entries are None there, and evaluating it raises."""
        shape = tuple(n.shape)
        dyn = self.conv.dynamic_reshapes.get(n.name) if n.op == OK.Reshape else None
        if dyn:
            shape = tuple((-1 if len(dyn) == 1 else None) if i in dyn else d for i, d in enumerate(shape))
        return (n.op.value, shape, n.dtype.value, float(n.value), int(n.dim), bool(n.keepdim),
                bool(n.transpose_a), bool(n.transpose_b), tuple(n.perm), n.cast_to.value)


@dataclasses.dataclass
class Analysis:
    conv: Conversion
    part: Any
    program: Program
    demoted: dict            # fx.Node -> reason (region nodes left in torch to break a cycle)
    deferred: Any = None     # _core.DeferredProgram: the norm sites, when norms were deferred


def defer_setting(defer) -> str:
    """A `defer_norms` option as "off", "on" or "auto" (ValueError for anything else)."""
    if isinstance(defer, bool):
        return "on" if defer else "off"
    if not isinstance(defer, str) or defer not in ("off", "on", "auto"):
        raise ValueError(f"defer_norms must be True / False, 'on' / 'off' or 'auto', got {defer!r}")
    return defer


def _torch_program_us(graph, keep: dict, fuse_all: bool = False) -> float:
    """The planner's estimate of `graph` with every norm site deferred except those in `keep`, as a PyTorch program
    runs it: each region fused where the planner fuses it (with `fuse_all`, also where it declines for speed only),
    else as cuBLAS plus Inductor's pass (unfused_us), priced with the dtypes the rewrite stores (planned_spec). The
    folds are computed once per binding of the weights and are not counted."""
    d = C.defer_norms(graph, True, keep)
    part = C.partition_deferred(d) if any(s.deferred for s in d.sites) else C.partition(graph)
    total = 0.0
    for i in range(len(part.regions)):
        p = C.plan_region(planned_spec(part, i))
        fused = p.fuse or (fuse_all and p.verdict == C.Verdict.Slower)
        total += p.fused_us if fused and p.fused_us >= 0 else max(0.0, p.unfused_us)
    return total


def choose_deferral(graph, fuse_all: bool = False) -> tuple[dict, dict]:
    """defer_norms="auto": the norm sites whose deferral lowers the planner's estimate of the whole graph
    (_torch_program_us) by C.DEFER_MARGIN (the C++ planner's kDeferMargin), each site priced with and without it in
    program order, against the choices before it (as the C++ compiler's --defer-norms auto does, with a PyTorch
    program's alternative to a fused region: Inductor).
    Returns (keep, priced): the norms left as written and the deferred ones, each with the estimates it rests on."""
    keep: dict = {}
    priced: dict = {}
    current = None
    for s in C.defer_norms(graph, True).sites:
        if not s.deferred:
            continue
        if current is None:
            current = _torch_program_us(graph, keep, fuse_all)
        as_written = _torch_program_us(graph, {**keep, s.norm: ""}, fuse_all)
        estimates = (f"the planner's estimate of the graph: ~{current:.1f} us with it finished in its readers, "
                     f"~{as_written:.1f} us as written (defer_norms='auto': finished in its readers where "
                     f"{100 * C.DEFER_MARGIN:.0f}% lower)")
        if current >= as_written * (1.0 - C.DEFER_MARGIN):   # deferred only where estimated clearly faster
            keep[s.norm] = estimates
            current = as_written
        else:
            priced[s.norm] = estimates
    return keep, priced


def analyze(aten_gm: fx.GraphModule, gemm_dtype=C.DType.BF16, max_rounds: int = 64,
            keep_in_torch: dict | None = None, defer=False, constant_inputs=(), fuse_all: bool = False) -> Analysis:
    """`keep_in_torch`: ATen nodes to leave in torch from the start, with the reason (e.g. fp32 GEMMs of a bf16
    graph: they keep their own dtype, and every other region still fuses). `defer` (a defer_setting): with "on",
    every LayerNorm / RMSNorm whose readers are GEMMs with a weight among `constant_inputs` (placeholder names: the
    model's parameters) is finished in those GEMMs (_core.defer_norms; docs/pytorch.md, "Norms finished in the GEMMs
    that read them"); with "auto", those of them whose deferral the planner estimates faster (choose_deferral; with
    `fuse_all`, the backend's fuse="all", regions declined for speed only are priced fused, as they will run)."""
    setting = defer_setting(defer)
    force: dict = dict(keep_in_torch or {})
    for _ in range(max_rounds):
        conv = convert(aten_gm, gemm_dtype, force, constant_inputs)
        if setting == "auto":
            deferred = C.defer_norms(conv.graph, True, *choose_deferral(conv.graph, fuse_all))
        else:
            deferred = C.defer_norms(conv.graph, True) if setting == "on" else None
        part = C.partition(conv.graph) if deferred is None else C.partition_deferred(deferred)
        prog = Program(conv, part, deferred)
        if prog.build():
            return Analysis(conv, part, prog, {n: r for n, r in force.items()}, deferred)
        t, ri, readers = prog.cycle
        root = prog.nodes[prog.regions[ri].root].name
        for gid in readers:
            f = prog.fx_of(prog.nodes[gid].name)
            force[f] = (f"reads '{t}', which is computed outside the region from GEMM '{root}' whose epilogue "
                        f"this would join: fusing it would create a cycle")
    raise RuntimeError("comfuse: could not make the partitioned program acyclic")


def planned_spec(part, ri: int, layouts: dict | None = None):
    """Region `ri`'s Spec with the output dtypes the rewrite stores (emit.rewrite_keeping_torch, stored_dtypes), for
    the planner to price: a value the Graph IR hands on in f32 is stored in its own bf16/f16 dtype where every
    reader rounds to it anyway - torch ops (in the node's dtype), and other regions that take it as a GEMM operand
    or a tile parameter in that dtype. Priced in f32, such a region looked 2 bytes per element dearer than the
    kernel it becomes (HF BERT's out-projection and FFN2 + residual + LayerNorm: declined). `layouts`: the region's
    outputs whose copies become views (Program.splits), which the planner prices with the copies they save."""
    fs = parts.apply(part.regions[ri].spec, layouts)
    g = part.graph

    def taken_as(nid: int, dt) -> bool:
        """Every other region reading value `nid` takes it in dtype `dt`."""
        for rj, r in enumerate(part.regions):
            if rj == ri:
                continue
            s = r.spec
            if nid in (s.gemm.a, s.gemm.b) and s.gemm.dtype != dt:
                return False
            if any(p.node == nid and p.dtype != dt for p in s.params):
                return False
        return True

    narrow = (C.DType.BF16, C.DType.F16)
    dts = []
    for o in fs.outputs:
        own = g.node(o.node).dtype
        keep = o.dtype != C.DType.F32 or o.per_row or own not in narrow or not taken_as(o.node, own)
        dts.append(o.dtype if keep else own)
    return fs if dts == [o.dtype for o in fs.outputs] else fs.with_output_dtypes(dts)
