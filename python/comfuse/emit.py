"""FX emission of a partitioned program (program.Program): the graph TorchInductor compiles, in which each fused
region is one `comfuse::fused_region` call (and each fused back-to-back chain one `comfuse::fused_chain` call).

  rewrite                the program re-emitted from the Graph IR: standard-path nodes as torch ops in fp32 (the
                         semantics the CPU checks compare against), torch nodes copied
  rewrite_keeping_torch  the ATen graph with only the fused regions changed: every other node copied as it was,
                         in its own dtype (the GPU path, and ComFusePass inside Inductor)
  region_in_torch        a region computed node by node with torch ops (the custom op's fallback)
  emit_aten_node         one Graph IR node as ATen nodes (helper values before a fused call)
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch
import torch.fx as fx

from . import _core as C
from . import folds, ops, parts
from .rotary import rotate_half_nodes
from .convert import DT_TO_TORCH, OK, TORCH_TO_DT, size_hints


_VIEWS = (torch.ops.aten.reshape.default, torch.ops.aten.view.default)


def _dtype_of(v):
    """The dtype of FX value `v` where it is known without running the graph (its fake value, or through the
    reshapes and casts this module adds), else None."""
    while isinstance(v, fx.Node):
        val = v.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.dtype
        if v.target == torch.ops.prims.convert_element_type.default:
            return v.args[1]
        if v.target is operator.getitem and getattr(v.args[0], "target", None) is torch.ops.comfuse.fused_region.default:
            return DT_TO_TORCH[ops.region_spec(v.args[0].args[0]).outputs[v.args[1]].dtype]
        if v.target is torch.ops.comfuse.fused_chain.default:
            return torch.bfloat16
        if v.target not in _VIEWS:
            return None
        v = v.args[0]
    return None


def _device_of(v):
    """The device of FX value `v` where its fake value (or that of what this module's casts and reshapes read)
    gives it, and whether it is 0-dim; (None, False) where unknown."""
    while isinstance(v, fx.Node):
        val = v.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device, val.dim() == 0
        if v.target != torch.ops.prims.convert_element_type.default and v.target not in _VIEWS:
            return None, False
        v = v.args[0]
    return None, False


def _on_device(g: fx.Graph, ins: list) -> list:
    """A fused call's inputs with 0-dim CPU tensors copied to the GPU the others are on. Under dynamic=True, Dynamo
    hands float attributes (an RMSNorm's eps) to the graph as 0-dim CPU tensors; torch ops take such scalars with
    CUDA tensors, the kernel reads its parameters from GPU memory."""
    where = [_device_of(v) for v in ins]
    devs = {d for d, _ in where if d is not None and d.type != "cpu"}
    if len(devs) != 1:
        return ins
    dev = devs.pop()
    # prims.device_put: Inductor lowers it (a copy_ in its code); a post-grad aten._to_copy it cannot (it
    # decomposes that op before its passes, and refuses a fallback for it). Non-blocking: a blocking copy to
    # the GPU synchronizes the stream; from pageable memory the driver stages the value before returning.
    return [g.call_function(torch.ops.prims.device_put.default, (v, dev, True))
            if d is not None and d.type == "cpu" and scalar else v for v, (d, scalar) in zip(ins, where)]


def _cast(g: fx.Graph, v, dtype):
    """v in `dtype`: v itself when it already is. A cast to the same dtype is not free: Inductor realizes it
    as a copy kernel in front of the extern fused_region call (a weight and an activation copied per call)."""
    if _dtype_of(v) == dtype:
        return v
    return g.call_function(torch.ops.prims.convert_element_type.default, (v, dtype))


class NotKeepable(Exception):
    """rewrite_keeping_torch cannot express this program (rewrite can)."""


class RegionOutputs(NamedTuple):
    """The outputs of fused region `region` (what a later step may wait for)."""
    region: int


class _CopyNode(NamedTuple):
    """A step of rewrite_keeping_torch: copy ATen node `node` as it was."""
    node: fx.Node


class _EmitRegion(NamedTuple):
    """A step of rewrite_keeping_torch: emit fused region `region` once `deps` exist."""
    region: int
    deps: set


def new_graph(prog):
    """A new FX graph with this program's placeholders (meta kept) and attributes, and the map to them."""
    g = fx.Graph()
    env_fx: dict = {}
    for n in prog.gm.graph.nodes:
        if n.op == "placeholder":
            env_fx[n] = g.placeholder(n.name)
            env_fx[n].meta = dict(n.meta)
        elif n.op == "get_attr":
            env_fx[n] = g.get_attr(n.target)
            env_fx[n].meta = dict(n.meta)
    return g, env_fx


def rewrite(prog, ctas: int = 1, fuse=None) -> fx.GraphModule:
    """The program as an FX graph: each region one `comfuse::fused_region` call, standard-path Graph IR
    nodes as torch ops (fp32 math, as the Graph IR defines them), torch nodes copied. `fuse`: the indices
    of the regions to fuse (default all); the others are emitted node by node like the standard path."""

    if prog.conv.dynamic_inner:   # its reshapes take -1 for one dynamic dim (Program.node_spec), no more
        raise NotKeepable("symbolic sizes beyond dim 0: the Graph IR rewrite takes a dynamic dim 0 only")
    g, env_fx = new_graph(prog)
    env_g: dict = {}
    pg = prog.pg

    get_g = prog.ir_reader(env_g, lambda n, src: _cast(g, env_fx[src], DT_TO_TORCH[n.dtype]),
                           lambda gid, n: n.value, "rewrite")

    def get_fx(a):
        if a in env_fx:
            return env_fx[a]
        node = prog.conv.graph.node(prog.conv.value[a])
        gid = pg.find(node.name)
        dt = a.meta["val"].dtype
        if gid is None or prog.nodes[gid].op in (OK.Input, OK.Constant):
            src = env_fx[prog.conv.input_source[node.name]]
        else:
            src = get_g(gid)
        return _cast(g, src, dt)

    for s in prog.steps:
        if s.kind == "region" and (fuse is None or s.index in fuse):
            fs = prog.regions[s.index].spec
            for o, v in zip(fs.outputs, fused_call(prog, g, s.index, fs, ctas, get_g)):
                env_g[o.name] = v
        elif s.kind in ("region", "node"):   # a region not fused: node by node (topological, root first)
            for gid in prog.regions[s.index].nodes if s.kind == "region" else [s.index]:
                n = prog.nodes[gid]
                env_g[n.name] = g.call_function(ops.eval_graph_node,
                                                (prog.node_spec(n), *[get_g(i) for i in n.inputs]))
        else:
            t = s.index
            env_fx[t] = g.node_copy(t, get_fx)
    out = next(n for n in prog.gm.graph.nodes if n.op == "output")
    g.output(fx.node.map_arg(out.args[0], get_fx))
    gm = fx.GraphModule(prog.gm, g)
    return gm


def chain_group(ci: int) -> int:
    """The group id of back-to-back chain `ci` next to the regions' own indices (>= 0) in rewrite_keeping_torch."""
    return -1 - ci


def rewrite_keeping_torch(prog, fuse, ctas: int = 1, chains=()) -> fx.GraphModule:
    """The ATen graph with only the regions in `fuse` and the back-to-back chains in `chains` (indices into the
    partition's b2b list; their two regions must not be in `fuse`) changed: each region becomes one
    `comfuse::fused_region` call, each chain one `comfuse::fused_chain` call, and every other node - standard-path
    ops, declined regions, torch nodes - is copied as it was (a bf16 model stays bf16 there, for TorchInductor to
    compile as it would without ComFuse). Raises NotKeepable when a fused region or chain does not line up with
    whole ATen nodes; `rewrite` then serves (for the regions alone)."""

    cg = prog.conv.graph
    groups = {ri: list(prog.regions[ri].nodes) for ri in fuse}
    groups.update({chain_group(ci): list(prog.part.b2b[ci].nodes) for ci in chains})

    def label(gi):
        return f"region {gi}" if gi >= 0 else f"back-to-back chain {-1 - gi}"
    live = {n.name for n in prog.nodes}

    def resolve(i) -> str:
        """The live Graph IR value an ATen node's converted value is: reshapes the core dropped as dead
        (a view folded into the next one) are looked through."""
        while cg.node(i).name not in live and cg.node(i).op == OK.Reshape:
            i = cg.node(i).inputs[0]
        return cg.node(i).name

    region_of_name = {prog.nodes[gid].name: gi for gi, nodes in groups.items() for gid in nodes}
    fx_values: dict = {}            # live Graph IR name -> the ATen nodes whose value it is (maybe reshaped)
    absorbed: dict = {}             # ATen node -> index of the fused region that computes it
    for f, v in prog.conv.value.items():
        ids = v if isinstance(v, tuple) else (v,)
        names = [resolve(i) for i in ids]
        if not isinstance(v, tuple):
            fx_values.setdefault(names[0], []).append(f)
        rs = {region_of_name.get(nm) for nm in names}
        if rs != {None}:
            if len(rs) != 1 or None in rs:
                raise NotKeepable(f"ATen node '{f.name}' is split across a fused region's or chain's boundary")
            absorbed[f] = rs.pop()
    # A folded softmax (convert.SoftmaxFold) is computed from the logits by nodes named after its last ATen node:
    # the ATen nodes it replaces go where that one goes (into the region, or copied as they were).
    for out, fold in prog.conv.softmax_folds.items():
        if out in absorbed:
            absorbed.update({f: absorbed[out] for f in fold.nodes})
    # So is a folded rotate_half (rotary.rotate_half_of): its slices and negation go where its cat goes.
    for cat, folded in prog.conv.rotate_half_folds.items():
        if cat in absorbed:
            absorbed.update({f: absorbed[cat] for f in folded})
    # Values the core folded away (fold_idioms: gelu_new's pow, tanh, ... become one gelu_tanh named after its last
    # node) are read only by the idiom: each goes where all its readers go (readers come later: walked backwards).
    for f in reversed(list(prog.gm.graph.nodes)):
        v = prog.conv.value.get(f)
        if f in absorbed or v is None or isinstance(v, tuple) or resolve(v) in live:
            continue
        rs = {absorbed.get(u) for u in f.users}
        if len(rs) == 1 and None not in rs:
            absorbed[f] = rs.pop()
    for gi, nodes in groups.items():
        for gid in nodes:
            if prog.nodes[gid].name in prog.made:   # a value the norm deferral made: no ATen node holds it
                continue
            f = prog.fx_of(prog.nodes[gid].name)
            if f is None or absorbed.get(f) != gi:
                raise NotKeepable(f"{label(gi)} holds part of ATen node "
                                  f"'{f.name if f is not None else prog.nodes[gid].name}'")

    def source(name):
        """The ATen node (outside fused regions) a Graph IR value is read from, if there is one."""
        return next((f for f in fx_values.get(name, []) if f not in absorbed), None)

    def deps(gid, acc):
        """What a fused call's input is made from (through helper casts and views): ATen nodes, and
        RegionOutputs(j) for the outputs of fused region j."""
        n = prog.nodes[gid]
        f = source(n.name)
        if n.name in region_of_name:
            acc.add(RegionOutputs(region_of_name[n.name]))
        elif f is not None:
            acc.add(f)
        elif n.op == OK.Input:
            acc.add(prog.conv.input_source[n.name])
        elif n.op != OK.Constant:
            for i in n.inputs:
                deps(i, acc)
        return acc

    g, env_fx = new_graph(prog)
    env_g: dict = {}
    # The graph's own size values (placeholders and size arithmetic whose value is a SymInt), by expression, and
    # emitted first: a reshape to a symbolic shape takes them as arguments.
    sizes: dict = {}
    for n in prog.gm.graph.nodes:
        if isinstance(n.meta.get("val"), torch.SymInt):
            sizes.setdefault(str(n.meta["val"].node.expr), n)
            if n.op == "call_function" and n not in absorbed and all(a in env_fx for a in n.all_input_nodes):
                env_fx[n] = g.node_copy(n, lambda a: env_fx[a])

    def size_arg(d):
        """A size as a reshape argument: an int, or the node of the graph that computes this symbolic size."""
        if not isinstance(d, torch.SymInt):
            return int(d)
        f = sizes.get(str(d.node.expr))
        if f is None or f not in env_fx:
            raise NotKeepable(f"no node of the graph computes the size {d}")
        return env_fx[f]

    def reshape(v, have, want):
        """v (ints `have`) to shape `want` (ints, or symbolic sizes of the graph: one dynamic dim becomes -1, more
        are taken from the graph's size nodes)."""
        if list(have) == size_hints(want):
            return v
        syms = [i for i, d in enumerate(want) if isinstance(d, torch.SymInt)]
        target = [-1 if len(syms) == 1 and i in syms else size_arg(d) for i, d in enumerate(want)]
        return g.call_function(torch.ops.aten.reshape.default, (v, target))

    def symbolic_shape(n):
        """Graph IR value n's shape with its symbolic sizes: that of an ATen node with its value and shape."""
        src = prog.conv.input_source.get(n.name) if n.op == OK.Input else None
        for f in ([src] if src is not None else []) + fx_values.get(n.name, []):
            val = f.meta.get("val")
            if isinstance(val, torch.Tensor) and size_hints(val.shape) == list(n.shape):
                return list(val.shape)
        if any(isinstance(d, torch.SymInt) for f in fx_values.get(n.name, []) for d in f.meta["val"].shape):
            if not prog.conv.dynamic_inner:   # only dim 0 is dynamic: torch infers it
                return [-1] + list(n.shape)[1:]
            raise NotKeepable(f"no ATen node has the shape of '{n.name}' {list(n.shape)} with its symbolic sizes")
        return list(n.shape)

    def value_of(gid):
        n = prog.nodes[gid]
        if n.name not in env_g:
            f = source(n.name)
            if f is not None and f in env_fx:
                have = f.meta["val"].shape   # the ATen node may be a view of the value: back to its shape
                want = list(n.shape) if size_hints(have) == list(n.shape) else symbolic_shape(n)
                v = reshape(env_fx[f], size_hints(have), want)
                env_g[n.name] = _cast(g, v, DT_TO_TORCH[n.dtype])
            elif n.op == OK.Input:
                env_g[n.name] = _cast(g, env_fx[prog.conv.input_source[n.name]], DT_TO_TORCH[n.dtype])
            elif n.op == OK.Constant:
                env_g[n.name] = n.value
            elif is_fold(n):   # (a region's folds are emitted together first: emit_region)
                env_g[n.name] = fold_call(prog, g, [gid], value_of)[0]
            else:   # a helper value (a cast, a view) between ATen nodes and a fused call
                env_g[n.name] = emit_aten_node(g, n, prog.node_spec(n), [value_of(i) for i in n.inputs])
        return env_g[n.name]

    def stored_dtypes(ri):
        """Each output in the dtype its ATen readers have (bf16 rather than the f32 a value handed on within
        the Graph IR keeps): the torch ops reading it round to that dtype anyway, so the kernel stores less.
        An output another fused region reads keeps the Graph IR's f32 hand-off, unless every such region takes
        it in one bf16/f16 dtype (a tile parameter, or a GEMM operand): the launch would round it to that dtype
        (a copy kernel per call: LLaMA's SiLU(gate) read by the up projection), so the kernel stores it so."""
        fs = prog.regions[ri].spec
        out = []
        for o in fs.outputs:
            dts = {f.meta["val"].dtype for f in fx_values.get(o.name, []) if absorbed.get(f) == ri}
            gid = prog.pg.find(o.name)
            fused_reader = any(gid in list(n.inputs) and region_of_name.get(n.name, ri) != ri for n in prog.nodes)
            narrow = len(dts) == 1 and next(iter(dts)) in (torch.bfloat16, torch.float16)
            if narrow and o.dtype == C.DType.F32 and not fused_reader:
                out.append(TORCH_TO_DT[next(iter(dts))])
                continue
            taken = {p.dtype for rj in fuse if rj != ri for p in prog.regions[rj].spec.params if p.node == gid}
            taken |= {prog.regions[rj].spec.gemm.dtype for rj in fuse if rj != ri
                      if gid in (prog.regions[rj].spec.gemm.a, prog.regions[rj].spec.gemm.b)}
            same = len(taken) == 1 and next(iter(taken)) in (C.DType.BF16, C.DType.F16) and (
                not dts or {TORCH_TO_DT.get(d) for d in dts} == taken)
            out.append(next(iter(taken)) if fused_reader and same and o.dtype == C.DType.F32 else o.dtype)
        return out

    def is_fold(n) -> bool:
        return prog.deferred is not None and n.name in prog.deferred.folds

    def emit_region(ri):
        fs = prog.regions[ri].spec
        # the folded weights the region reads, from one comfuse::fold call (one host call, not one per value)
        feeds = list(dict.fromkeys([fs.gemm.b] + [p.node for p in fs.params]))
        todo_folds = [i for i in feeds if is_fold(prog.nodes[i]) and prog.nodes[i].name not in env_g]
        if todo_folds:
            for i, v in zip(todo_folds, fold_call(prog, g, todo_folds, value_of)):
                env_g[prog.nodes[i].name] = v
        dts = stored_dtypes(ri)
        if dts != [o.dtype for o in fs.outputs]:
            fs = fs.with_output_dtypes(dts)
        lays = prog.splits.get(ri, {})
        fs = parts.apply(fs, lays)
        emitted.add(RegionOutputs(ri))
        for j, (o, out) in enumerate(zip(fs.outputs, fused_call(prog, g, ri, fs, ctas, value_of))):
            env_g[o.name] = out
            if j in lays:   # stored in parts (parts.find): each part of the split is a select of it
                lead = [int(d) for d in o.shape][:-2]   # (the split it replaces is left dead, and eliminated below)
                parts.emit_parts(g, out, lays[j], lead, env_fx, reshape)
            for f in fx_values.get(o.name, []):
                if absorbed.get(f) == ri:
                    env_fx[f] = _cast(g, reshape(out, list(o.shape), f.meta["val"].shape), f.meta["val"].dtype)

    def emit_chain(ci):
        gi = chain_group(ci)
        o = prog.part.b2b[ci].spec.second.outputs[0]
        emitted.add(RegionOutputs(gi))
        out = chain_call(prog, g, ci, value_of)
        env_g[o.name] = out
        for f in fx_values.get(o.name, []):
            if absorbed.get(f) == gi:
                env_fx[f] = _cast(g, reshape(out, list(o.shape), f.meta["val"].shape), f.meta["val"].dtype)

    # Kahn over ATen nodes (in their order) and fused calls: each goes once all it reads exists.
    todo = [_CopyNode(n) for n in prog.gm.graph.nodes
            if n.op == "call_function" and n not in absorbed and n not in env_fx]
    todo += [_EmitRegion(ri, set().union(*[deps(i, set()) for i in
                                           [prog.regions[ri].spec.gemm.a, prog.regions[ri].spec.gemm.b] +
                                           [p.node for p in prog.regions[ri].spec.params]]))
             for ri in sorted(fuse)]
    todo += [_EmitRegion(chain_group(ci), set().union(*[deps(i, set()) for i in chain_feeds(prog, ci)]))
             for ci in sorted(chains)]
    # copies of parts that are dense here (parts.py): each replaced by the view it copies
    dropped = parts.dropped_copies(prog.gm, {ri: prog.splits[ri] for ri in fuse if ri in prog.splits},
                                   [t.node for t in todo if isinstance(t, _CopyNode)])
    emitted: set = set()
    ready = lambda a: a in emitted if isinstance(a, RegionOutputs) else a in env_fx  # noqa: E731
    need = lambda t: t.node.all_input_nodes if isinstance(t, _CopyNode) else t.deps  # noqa: E731
    while todo:
        left = []
        for t in todo:
            if all(ready(a) for a in need(t)):
                if isinstance(t, _CopyNode):
                    if t.node in dropped:
                        env_fx[t.node] = env_fx[t.node.args[0]]
                    elif t.node not in env_fx:   # (a part of a fused output stands in for it: emit_region)
                        env_fx[t.node] = g.node_copy(t.node, lambda a: env_fx[a])
                elif t.region >= 0:
                    emit_region(t.region)
                else:
                    emit_chain(-1 - t.region)
            else:
                left.append(t)
        if len(left) == len(todo):
            stuck = next(a for a in need(left[0]) if not ready(a))
            raise NotKeepable(f"{stuck!r} is never computed outside the fused regions")
        todo = left
    out = next(n for n in prog.gm.graph.nodes if n.op == "output")
    missing = [a.name for a in out.all_input_nodes if a not in env_fx]
    if missing:
        raise NotKeepable(f"graph outputs {missing} are inside fused regions or chains but not their outputs")
    g.output(fx.node.map_arg(out.args[0], lambda a: env_fx[a]))
    gm = fx.GraphModule(prog.gm, g)
    gm.graph.eliminate_dead_code()
    _check_fold_readers(gm)
    gm.recompile()
    return gm


def _check_fold_readers(gm: fx.GraphModule) -> None:
    """A folded weight is one cached tensor (folds.py): only ComFuse's fused calls may read it. Inductor's own code
    could write into an input it reads last (an in-place reuse), which would corrupt the cache."""
    fused = (torch.ops.comfuse.fused_region.default, torch.ops.comfuse.fused_chain.default)
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.comfuse.fold.default:
            values = list(n.users)   # the getitems of its values
            other = [u.name for u in values if u.target is not operator.getitem]
            other += [r.name for u in values if u.target is operator.getitem for r in u.users if r.target not in fused]
            if other:
                raise NotKeepable(f"the folded weight of '{n.args[0]}' would be read by '{other[0]}', not by a fused "
                                  f"call only")


def fused_call(prog, g: fx.Graph, ri: int, fs, ctas: int, value) -> list:
    """Region `ri` (as Spec `fs`) as one comfuse::fused_region call in `g`, its inputs read through
    `value(graph IR id)`; the call's outputs, in the Spec's order."""

    key = ops.register_region(fs, ctas, fallback=region_in_torch(prog, ri))
    ins = _on_device(g, [value(fs.gemm.a), value(fs.gemm.b)] + [value(p.node) for p in fs.params])
    call = g.call_function(torch.ops.comfuse.fused_region.default, (key, ins))
    return [g.call_function(operator.getitem, (call, j)) for j in range(len(fs.outputs))]


def fold_call(prog, g: fx.Graph, gids: list, value) -> list:
    """Values of a deferred norm that depend on the model's parameters alone (a folded weight, its column sums, a
    shift) as one comfuse::fold call in `g`, which computes them once and keeps them (folds.py); its sources are
    read through `value(graph IR id)`. The values' nodes, in the order of `gids`."""
    ns = [prog.nodes[i] for i in gids]
    steps, sources, consts = folds.subgraph(prog, gids)
    key = folds.register([n.name for n in ns], steps, sources, consts,
                         [(i, DT_TO_TORCH[n.dtype], [int(d) for d in n.shape]) for i, n in zip(gids, ns)])
    call = g.call_function(torch.ops.comfuse.fold.default, (key, [value(i) for i in sources]))
    return [g.call_function(operator.getitem, (call, j)) for j in range(len(gids))]


def chain_feeds(prog, ci: int) -> list:
    """The Graph IR ids a comfuse::fused_chain call of chain `ci` reads, in its order: X, W1, W2, then b1 and b2 where
    the kernel reads them."""
    b = prog.part.b2b[ci].spec
    b1, b2 = b.bias_params
    return ([b.first.gemm.a, b.first.gemm.b, b.second.gemm.b] + ([b.first.params[b1].node] if b1 >= 0 else []) +
            ([b.second.params[b2].node] if b2 >= 0 else []))


def chain_call(prog, g: fx.Graph, ci: int, value):
    """Back-to-back chain `ci` as one comfuse::fused_chain call in `g`, its inputs read through `value(graph IR id)`;
    the call's output (epilogue2's value)."""

    key = ops.register_chain(prog.part.b2b[ci].spec, fallback=chain_in_torch(prog, ci))
    return g.call_function(torch.ops.comfuse.fused_chain.default, (key, [value(i) for i in chain_feeds(prog, ci)]))


def chain_in_torch(prog, ci: int):
    """The chain computed node by node with torch ops (`ops.eval_graph_node`), as a function of the fused call's
    inputs returning epilogue2's value: the op's CPU form, and what it runs if the kernel cannot."""

    ch = prog.part.b2b[ci]
    feeds = chain_feeds(prog, ci)
    steps = [(gid, prog.node_spec(prog.nodes[gid]), list(prog.nodes[gid].inputs)) for gid in ch.nodes
             if gid not in feeds]
    consts = {i: prog.nodes[i].value for _, _, ins in steps for i in ins if prog.nodes[i].op == OK.Constant}
    out = ch.spec.second.outputs[0].node

    def run(inputs):
        env = dict(consts)
        env.update(zip(feeds, inputs))
        for gid, spec, ins in steps:
            env[gid] = ops.eval_graph_node(spec, *[env[i] for i in ins])
        return env[out]
    return run


def region_in_torch(prog, ri: int):
    """The region computed node by node with torch ops (`ops.eval_graph_node`), as a function of the fused
    call's inputs [A, B, *params] returning its outputs: what the custom op runs if the kernel cannot."""

    fs = prog.regions[ri].spec
    steps = [(gid, prog.node_spec(prog.nodes[gid]), list(prog.nodes[gid].inputs)) for gid in prog.regions[ri].nodes]
    consts = {i: prog.nodes[i].value for _, _, ins in steps for i in ins if prog.nodes[i].op == OK.Constant}
    feeds = [fs.gemm.a, fs.gemm.b] + [p.node for p in fs.params]
    outs = [o.node for o in fs.outputs]

    def run(inputs):
        env = dict(consts)
        env.update(zip(feeds, inputs))
        for gid, spec, ins in steps:
            env[gid] = ops.eval_graph_node(spec, *[env[i] for i in ins])
        return [env[o] for o in outs]
    return run


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
        if None in spec[1]:
            raise NotKeepable(f"the helper reshape '{n.name}' has two dynamic dims")
        return g.call_function(_A.reshape.default, (f32[0], list(spec[1])))
    if op == OK.Transpose:
        return g.call_function(_A.clone.default, (g.call_function(_A.permute.default, (f32[0], list(n.perm))),),
                               {"memory_format": torch.contiguous_format})
    if op == OK.RotateHalf:
        return rotate_half_nodes(lambda target, *args: g.call_function(target, args), f32[0], int(n.shape[-1]))
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


