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

The program runs on the CPU reference interpreters (`run`: regions through interpret_spec, Graph IR nodes
through eval_node, torch nodes through torch), or is written back as an FX graph in which each region is one
call of the `comfuse::fused_region` custom op (`rewrite`) — the graph TorchInductor compiles.
"""
from __future__ import annotations

import dataclasses
import heapq
import operator
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from . import _core as C
from .convert import DT_TO_TORCH, OK, TORCH_TO_DT, Conversion, size_hints, convert


def _cast(g: fx.Graph, v, dtype):
    return g.call_function(torch.ops.prims.convert_element_type.default, (v, dtype))


class NotKeepable(Exception):
    """Program.rewrite_keeping_torch cannot express this program (Program.rewrite can)."""


@dataclasses.dataclass
class Step:
    kind: str                 # "region" | "node" | "torch"
    index: Any                # region index | p.graph node id | fx.Node
    reads: list
    writes: list
    first: int                # position of its first FX node (stable tie-break)


class Program:
    def __init__(self, conv: Conversion, part):
        self.conv = conv
        self.part = part                  # _core.Partition of conv.graph
        self.pg = part.graph              # decomposed, dead-code-free Graph IR (names kept)
        self.regions = list(part.regions)
        self.gm = conv.gm
        self.fx_by_name = {n.name: n for n in self.gm.graph.nodes}
        self.pos = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        self.nodes = self.pg.nodes
        self.steps: list[Step] = []
        self.cycle: tuple | None = None   # (value name, region index, [region node ids]) when not acyclic

    # ------------------------------------------------------------ value keys
    def fx_of(self, name: str) -> fx.Node | None:
        return self.fx_by_name.get(name.split(".")[0])

    def key_of_g(self, gid: int):
        """What provides Graph IR value gid: None (always there), ("fx", node) or ("g", name)."""
        n = self.nodes[gid]
        if n.op == OK.Input:
            src = self.conv.input_source[n.name]
            return ("fx", src) if src in self.conv.torch_nodes else None
        if n.op == OK.Constant:
            return None
        return ("g", n.name)

    def key_of_fx(self, a: fx.Node):
        if a in self.conv.torch_nodes:
            return ("fx", a)
        v = self.conv.value.get(a)
        if v is None:
            return None  # placeholder / get_attr
        gid = self.pg.find(self.conv.graph.node(v).name)
        if gid is None:
            # an input / constant the core dropped as dead cannot be read here; a converted value always exists
            src = self.conv.graph.node(v)
            return ("fx", self.conv.input_source[src.name]) if src.op == OK.Input and \
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
                writes = [("g", o.name) for o in fs.outputs]
                steps.append(Step("region", ri, [k for k in reads if k], writes,
                                  self.first_pos([self.nodes[i].name for i in r.nodes])))
                in_region.update(r.nodes)
            order = [i for fused, i in self.part.schedule if not fused]
        else:
            order = [n.id for n in self.nodes if n.op not in (OK.Input, OK.Constant)]
        for gid in order:
            n = self.nodes[gid]
            reads = [self.key_of_g(i) for i in n.inputs]
            steps.append(Step("node", gid, [k for k in reads if k], [("g", n.name)], self.first_pos([n.name])))
        for t in self.conv.torch_nodes:
            reads = [self.key_of_fx(a) for a in t.all_input_nodes]
            steps.append(Step("torch", t, [k for k in reads if k], [("fx", t)], self.pos[t]))
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
                        name = k[1].name if k[0] == "fx" else k[1]
                        return (name, ri, readers)
        raise AssertionError("program: cycle without a torch node between regions")

    # ------------------------------------------------------------ CPU reference
    def run(self, args, mode: str = "spec", ctas: int = 1) -> list:
        """Evaluates the program on CPU tensors: mode "spec" runs regions through interpret_spec (with `ctas`
        column blocks per row), mode "graph" evaluates every Graph IR node with eval_node."""
        if mode == "graph":
            p = Program(self.conv, self.part)
            if not p.build(with_regions=False):
                raise AssertionError("program: graph mode cannot have cycles")
            steps = p.steps
        else:
            steps = self.steps
        phs = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(phs) != len(args):
            raise ValueError(f"expected {len(phs)} inputs, got {len(args)}")
        env_fx = {n: a for n, a in zip(phs, args)}
        env_g: dict[str, np.ndarray] = {}
        pg = self.pg

        def np32(t):
            return np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())

        def get_g(gid):
            n = self.nodes[gid]
            if n.name in env_g:
                return env_g[n.name]
            if n.op == OK.Input:
                src = self.conv.input_source[n.name]
                v = C.round_to_dtype(np32(env_fx[src]), n.dtype)
            elif n.op == OK.Constant:
                v = C.eval_node(pg, gid, [])
            else:
                raise AssertionError(f"program: '{n.name}' read before it is computed")
            env_g[n.name] = v
            return v

        def get_fx(a):
            if a in env_fx:
                return env_fx[a]
            v = self.conv.value.get(a)
            node = self.conv.graph.node(v)
            gid = pg.find(node.name)
            m = a.meta["val"]
            if gid is None or self.nodes[gid].op in (OK.Input, OK.Constant):
                if node.op == OK.Input:
                    val = env_fx[self.conv.input_source[node.name]]
                    return val.to(m.dtype)
                raise AssertionError(f"program: '{a.name}' is not available")
            arr = C.round_to_dtype(get_g(gid), self.nodes[gid].dtype)
            return torch.from_numpy(arr).to(m.dtype)

        for s in steps:
            if s.kind == "region":
                fs = self.regions[s.index].spec
                outs = C.interpret_spec(fs, get_g(fs.gemm.a), get_g(fs.gemm.b),
                                        [get_g(p.node) for p in fs.params], ctas)
                for o, v in zip(fs.outputs, outs):
                    env_g[o.name] = v
            elif s.kind == "node":
                n = self.nodes[s.index]
                env_g[n.name] = C.eval_node(pg, s.index, [get_g(i) for i in n.inputs])
            else:
                t = s.index
                a_, k_ = fx.node.map_arg((t.args, t.kwargs), get_fx)
                env_fx[t] = t.target(*a_, **k_)
        out = next(n for n in self.gm.graph.nodes if n.op == "output")
        return list(fx.node.map_arg(out.args[0], get_fx))

    # ------------------------------------------------------------ FX rewrite
    def _new_graph(self):
        """A new FX graph with this program's placeholders (meta kept) and attributes, and the map to them."""
        g = fx.Graph()
        env_fx: dict = {}
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                env_fx[n] = g.placeholder(n.name)
                env_fx[n].meta = dict(n.meta)
            elif n.op == "get_attr":
                env_fx[n] = g.get_attr(n.target)
        return g, env_fx

    def rewrite(self, ctas: int = 1, fuse=None) -> fx.GraphModule:
        """The program as an FX graph: each region one `comfuse::fused_region` call, standard-path Graph IR
        nodes as torch ops (fp32 math, as the Graph IR defines them), torch nodes copied. `fuse`: the indices
        of the regions to fuse (default all); the others are emitted node by node like the standard path."""
        from . import ops

        g, env_fx = self._new_graph()
        env_g: dict = {}
        pg = self.pg

        def get_g(gid):
            n = self.nodes[gid]
            if n.name in env_g:
                return env_g[n.name]
            if n.op == OK.Input:
                src = self.conv.input_source[n.name]
                v = _cast(g, env_fx[src], DT_TO_TORCH[n.dtype])
            elif n.op == OK.Constant:
                v = n.value
            else:
                raise AssertionError(f"rewrite: '{n.name}' read before it is computed")
            env_g[n.name] = v
            return v

        def get_fx(a):
            if a in env_fx:
                return env_fx[a]
            node = self.conv.graph.node(self.conv.value[a])
            gid = pg.find(node.name)
            dt = a.meta["val"].dtype
            if gid is None or self.nodes[gid].op in (OK.Input, OK.Constant):
                src = env_fx[self.conv.input_source[node.name]]
            else:
                src = get_g(gid)
            return _cast(g, src, dt)

        for s in self.steps:
            if s.kind == "region" and (fuse is None or s.index in fuse):
                fs = self.regions[s.index].spec
                for o, v in zip(fs.outputs, self._fused_call(g, s.index, fs, ctas, get_g)):
                    env_g[o.name] = v
            elif s.kind in ("region", "node"):   # a region not fused: node by node (topological, root first)
                for gid in self.regions[s.index].nodes if s.kind == "region" else [s.index]:
                    n = self.nodes[gid]
                    env_g[n.name] = g.call_function(ops.eval_graph_node,
                                                    (self.node_spec(n), *[get_g(i) for i in n.inputs]))
            else:
                t = s.index
                env_fx[t] = g.node_copy(t, get_fx)
        out = next(n for n in self.gm.graph.nodes if n.op == "output")
        g.output(fx.node.map_arg(out.args[0], get_fx))
        gm = fx.GraphModule(self.gm, g)
        return gm


    def rewrite_keeping_torch(self, fuse, ctas: int = 1) -> fx.GraphModule:
        """The ATen graph with only the regions in `fuse` changed: each becomes one `comfuse::fused_region` call,
        and every other node - standard-path ops, declined regions, torch nodes - is copied as it was (a bf16
        model stays bf16 there, for TorchInductor to compile as it would without ComFuse). Raises NotKeepable
        when a fused region does not line up with whole ATen nodes; `rewrite` then serves."""
        from . import ops

        cg = self.conv.graph
        live = {n.name for n in self.nodes}

        def resolve(i) -> str:
            """The live Graph IR value an ATen node's converted value is: reshapes the core dropped as dead
            (a view folded into the next one) are looked through."""
            while cg.node(i).name not in live and cg.node(i).op == OK.Reshape:
                i = cg.node(i).inputs[0]
            return cg.node(i).name

        region_of_name = {self.nodes[gid].name: ri for ri in fuse for gid in self.regions[ri].nodes}
        fx_values: dict = {}            # live Graph IR name -> the ATen nodes whose value it is (maybe reshaped)
        absorbed: dict = {}             # ATen node -> index of the fused region that computes it
        for f, v in self.conv.value.items():
            ids = v if isinstance(v, tuple) else (v,)
            names = [resolve(i) for i in ids]
            if not isinstance(v, tuple):
                fx_values.setdefault(names[0], []).append(f)
            rs = {region_of_name.get(nm) for nm in names}
            if rs != {None}:
                if len(rs) != 1 or None in rs:
                    raise NotKeepable(f"ATen node '{f.name}' is split across a fused region's boundary")
                absorbed[f] = rs.pop()
        for ri in fuse:
            for gid in self.regions[ri].nodes:
                f = self.fx_of(self.nodes[gid].name)
                if f is None or absorbed.get(f) != ri:
                    raise NotKeepable(f"region {ri} holds part of ATen node "
                                      f"'{f.name if f is not None else self.nodes[gid].name}'")

        def source(name):
            """The ATen node (outside fused regions) a Graph IR value is read from, if there is one."""
            return next((f for f in fx_values.get(name, []) if f not in absorbed), None)

        def deps(gid, acc):
            """What a fused call's input is made from (through helper casts and views): ATen nodes, and
            ("region", j) for an output of fused region j."""
            n = self.nodes[gid]
            f = source(n.name)
            if n.name in region_of_name:
                acc.add(("region", region_of_name[n.name]))
            elif f is not None:
                acc.add(f)
            elif n.op == OK.Input:
                acc.add(self.conv.input_source[n.name])
            elif n.op != OK.Constant:
                for i in n.inputs:
                    deps(i, acc)
            return acc

        g, env_fx = self._new_graph()
        env_g: dict = {}

        def reshape(v, have, want, dynamic: bool):
            """v from shape `have` to `want` (ints); a dynamic batch's dim 0 becomes -1 (the rest is static)."""
            if list(have) == list(want):
                return v
            return g.call_function(torch.ops.aten.reshape.default, (v, [-1] + list(want)[1:] if dynamic else list(want)))

        def symbolic(shape) -> bool:
            if any(isinstance(d, torch.SymInt) for d in list(shape)[1:]):
                raise NotKeepable("a symbolic size outside dim 0")
            return any(isinstance(d, torch.SymInt) for d in shape)

        def reshaped(v, have, want):
            """v (Graph IR shape `have`) as an ATen node's shape `want` (maybe symbolic in dim 0)."""
            return reshape(v, have, size_hints(want), symbolic(want))

        def value_of(gid):
            n = self.nodes[gid]
            if n.name not in env_g:
                f = source(n.name)
                if f is not None and f in env_fx:
                    have = f.meta["val"].shape   # the ATen node may be a view of the value: back to its shape
                    v = reshape(env_fx[f], size_hints(have), list(n.shape), symbolic(have))
                    env_g[n.name] = _cast(g, v, DT_TO_TORCH[n.dtype])
                elif n.op == OK.Input:
                    env_g[n.name] = _cast(g, env_fx[self.conv.input_source[n.name]], DT_TO_TORCH[n.dtype])
                elif n.op == OK.Constant:
                    env_g[n.name] = n.value
                else:   # a helper value (a cast, a view) between ATen nodes and a fused call
                    env_g[n.name] = emit_aten_node(g, n, self.node_spec(n), [value_of(i) for i in n.inputs])
            return env_g[n.name]

        def stored_dtypes(ri):
            """Each output in the dtype its ATen readers have (bf16 rather than the f32 a value handed on within
            the Graph IR keeps): the torch ops reading it round to that dtype anyway, so the kernel stores less.
            An output another fused region reads keeps the Graph IR's f32 hand-off."""
            fs = self.regions[ri].spec
            out = []
            for o in fs.outputs:
                dts = {f.meta["val"].dtype for f in fx_values.get(o.name, []) if absorbed.get(f) == ri}
                gid = self.pg.find(o.name)
                fused_reader = any(gid in list(n.inputs) and region_of_name.get(n.name, ri) != ri for n in self.nodes)
                narrow = len(dts) == 1 and next(iter(dts)) in (torch.bfloat16, torch.float16)
                out.append(TORCH_TO_DT[next(iter(dts))] if narrow and o.dtype == C.DType.F32 and not fused_reader
                           else o.dtype)
            return out

        def emit_region(ri):
            fs = self.regions[ri].spec
            dts = stored_dtypes(ri)
            if dts != [o.dtype for o in fs.outputs]:
                fs = fs.with_output_dtypes(dts)
            emitted.add(("region", ri))
            for o, out in zip(fs.outputs, self._fused_call(g, ri, fs, ctas, value_of)):
                env_g[o.name] = out
                for f in fx_values.get(o.name, []):
                    if absorbed.get(f) == ri:
                        env_fx[f] = _cast(g, reshaped(out, list(o.shape), f.meta["val"].shape), f.meta["val"].dtype)

        # Kahn over ATen nodes (in their order) and fused calls: each goes once all it reads exists.
        todo = [("fx", n) for n in self.gm.graph.nodes if n.op == "call_function" and n not in absorbed]
        todo += [("region", ri, set().union(*[deps(i, set()) for i in
                                              [self.regions[ri].spec.gemm.a, self.regions[ri].spec.gemm.b] +
                                              [p.node for p in self.regions[ri].spec.params]]))
                 for ri in sorted(fuse)]
        emitted: set = set()
        ready = lambda a: a in emitted if isinstance(a, tuple) else a in env_fx  # noqa: E731
        while todo:
            left = []
            for t in todo:
                need = t[1].all_input_nodes if t[0] == "fx" else t[2]
                if all(ready(a) for a in need):
                    if t[0] == "fx":
                        env_fx[t[1]] = g.node_copy(t[1], lambda a: env_fx[a])
                    else:
                        emit_region(t[1])
                else:
                    left.append(t)
            if len(left) == len(todo):
                stuck = next(a for a in (left[0][1].all_input_nodes if left[0][0] == "fx" else left[0][2])
                             if not ready(a))
                raise NotKeepable(f"{stuck!r} is never computed outside the fused regions")
            todo = left
        out = next(n for n in self.gm.graph.nodes if n.op == "output")
        missing = [a.name for a in out.all_input_nodes if a not in env_fx]
        if missing:
            raise NotKeepable(f"graph outputs {missing} are inside fused regions but not their outputs")
        g.output(fx.node.map_arg(out.args[0], lambda a: env_fx[a]))
        gm = fx.GraphModule(self.gm, g)
        gm.graph.eliminate_dead_code()
        gm.recompile()
        return gm

    def _fused_call(self, g: fx.Graph, ri: int, fs, ctas: int, value) -> list:
        """Region `ri` (as Spec `fs`) as one comfuse::fused_region call in `g`, its inputs read through
        `value(graph IR id)`; the call's outputs, in the Spec's order."""
        from . import ops

        key = ops.register_region(fs, ctas, fallback=self.region_in_torch(ri))
        ins = [value(fs.gemm.a), value(fs.gemm.b)] + [value(p.node) for p in fs.params]
        call = g.call_function(torch.ops.comfuse.fused_region.default, (key, ins))
        return [g.call_function(operator.getitem, (call, j)) for j in range(len(fs.outputs))]

    def region_in_torch(self, ri: int):
        """The region computed node by node with torch ops (`ops.eval_graph_node`), as a function of the fused
        call's inputs [A, B, *params] returning its outputs: what the custom op runs if the kernel cannot."""
        from . import ops

        fs = self.regions[ri].spec
        steps = [(gid, self.node_spec(self.nodes[gid]), list(self.nodes[gid].inputs)) for gid in self.regions[ri].nodes]
        consts = {i: self.nodes[i].value for _, _, ins in steps for i in ins if self.nodes[i].op == OK.Constant}
        feeds = [fs.gemm.a, fs.gemm.b] + [p.node for p in fs.params]
        outs = [o.node for o in fs.outputs]

        def run(inputs):
            env = dict(consts)
            env.update(zip(feeds, inputs))
            for gid, spec, ins in steps:
                env[gid] = ops.eval_graph_node(spec, *[env[i] for i in ins])
            return [env[o] for o in outs]
        return run

    def node_spec(self, n) -> tuple:
        """A hashable description of a Graph IR node for ops.eval_graph_node. A reshape whose dim 0 is symbolic
        (a dynamic batch) gets -1 there: its other dims are static, so torch infers dim 0 at run time."""
        shape = tuple(n.shape)
        if n.op == OK.Reshape and n.name in self.conv.dynamic_reshapes:
            shape = (-1,) + shape[1:]
        return (n.op.value, shape, n.dtype.value, float(n.value), int(n.dim), bool(n.keepdim),
                bool(n.transpose_a), bool(n.transpose_b), tuple(n.perm), n.cast_to.value)


_A = torch.ops.aten
_ATEN_UNARY = {OK.Neg: _A.neg.default, OK.Abs: _A.abs.default, OK.Exp: _A.exp.default, OK.Log: _A.log.default,
               OK.Sqrt: _A.sqrt.default, OK.Rsqrt: _A.rsqrt.default, OK.Tanh: _A.tanh.default,
               OK.Sigmoid: _A.sigmoid.default, OK.Relu: _A.relu.default, OK.Reciprocal: _A.reciprocal.default}
_ATEN_BINARY = {OK.Add: _A.add.Tensor, OK.Sub: _A.sub.Tensor, OK.Mul: _A.mul.Tensor, OK.Div: _A.div.Tensor,
                OK.Max: _A.maximum.default, OK.Min: _A.minimum.default}
_ATEN_BINARY_SCALAR = {OK.Max: _A.clamp_min.default, OK.Min: _A.clamp_max.default}
_ATEN_REDUCE = {OK.Sum: _A.sum.dim_IntList, OK.Mean: _A.mean.dim, OK.ReduceMax: _A.amax.default,
                OK.ReduceMin: _A.amin.default}


def emit_aten_node(g: fx.Graph, n, spec: tuple, xs: list):
    """Graph IR node `n` as ATen nodes in `g` (fp32 values, as the Graph IR defines them; `spec` is
    Program.node_spec(n)): the form a graph Inductor lowers directly can hold, unlike ops.eval_graph_node
    (a Python function AOTAutograd must trace first). Raises NotKeepable for an op without one here."""
    op = n.op
    f32 = [_cast(g, x, torch.float32) if isinstance(x, fx.Node) else float(x) for x in xs]
    if op == OK.Cast:
        return _cast(g, _cast(g, f32[0], DT_TO_TORCH[n.cast_to]), torch.float32)
    if op == OK.Reshape:
        return g.call_function(_A.reshape.default, (f32[0], list(spec[1])))
    if op == OK.Transpose:
        return g.call_function(_A.clone.default, (g.call_function(_A.permute.default, (f32[0], list(n.perm))),),
                               {"memory_format": torch.contiguous_format})
    if op in _ATEN_UNARY:
        return g.call_function(_ATEN_UNARY[op], (f32[0],))
    if op == OK.Square:
        return g.call_function(_A.mul.Tensor, (f32[0], f32[0]))
    if op in (OK.Gelu, OK.GeluTanh):
        return g.call_function(_A.gelu.default, (f32[0],), {"approximate": "tanh" if op == OK.GeluTanh else "none"})
    if op == OK.Silu:
        return g.call_function(_A.silu.default, (f32[0],))
    if op == OK.Pow:
        return g.call_function(_A.pow.Tensor_Scalar, (f32[0], float(n.value)))
    if op in _ATEN_BINARY:
        a, b = f32
        if not isinstance(a, fx.Node):
            if op in (OK.Add, OK.Mul, OK.Max, OK.Min):
                a, b = b, a
            else:   # constant - x, constant / x
                a = g.call_function(_A.full_like.default, (b, a))
        if not isinstance(b, fx.Node) and op in _ATEN_BINARY_SCALAR:
            return g.call_function(_ATEN_BINARY_SCALAR[op], (a, b))
        return g.call_function(_ATEN_BINARY[op], (a, b))
    if op in _ATEN_REDUCE:
        return g.call_function(_ATEN_REDUCE[op], (f32[0], [int(n.dim)], bool(n.keepdim)))
    raise NotKeepable(f"no ATen form here for the Graph IR op '{C.op_name(op)}' ('{n.name}')")


@dataclasses.dataclass
class Analysis:
    conv: Conversion
    part: Any
    program: Program
    demoted: dict            # fx.Node -> reason (region nodes left in torch to break a cycle)


def analyze(aten_gm: fx.GraphModule, gemm_dtype=C.DType.BF16, max_rounds: int = 64,
            keep_in_torch: dict | None = None) -> Analysis:
    """`keep_in_torch`: ATen nodes to leave in torch from the start, with the reason (e.g. fp32 GEMMs of a bf16
    graph: they keep their own dtype, and every other region still fuses)."""
    force: dict = dict(keep_in_torch or {})
    for _ in range(max_rounds):
        conv = convert(aten_gm, gemm_dtype, force)
        part = C.partition(conv.graph)
        prog = Program(conv, part)
        if prog.build():
            return Analysis(conv, part, prog, {n: r for n, r in force.items()})
        t, ri, readers = prog.cycle
        root = prog.nodes[prog.regions[ri].root].name
        for gid in readers:
            f = prog.fx_of(prog.nodes[gid].name)
            force[f] = (f"reads '{t}', which is computed outside the region from GEMM '{root}' whose epilogue "
                        f"this would join: fusing it would create a cycle")
    raise RuntimeError("comfuse: could not make the partitioned program acyclic")
