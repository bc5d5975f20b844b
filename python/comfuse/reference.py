"""The CPU reference run of a partitioned program (program.Program): regions through interpret_spec, Graph IR
nodes through eval_node, torch nodes through torch. What the CPU tests compare the rewritten graphs against."""
from __future__ import annotations

import numpy as np
import torch
import torch.fx as fx

from . import _core as C
from .convert import OK


def run(prog, args, mode: str = "spec", ctas: int = 1) -> list:
    """Evaluates the program on CPU tensors: mode "spec" runs regions through interpret_spec (with `ctas`
    column blocks per row), mode "graph" evaluates every Graph IR node with eval_node."""
    if mode == "graph":
        p = type(prog)(prog.conv, prog.part)   # the same program, built without its regions
        if not p.build(with_regions=False):
            raise AssertionError("program: graph mode cannot have cycles")
        steps = p.steps
    else:
        steps = prog.steps
    phs = [n for n in prog.gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(args):
        raise ValueError(f"expected {len(phs)} inputs, got {len(args)}")
    env_fx = {n: a for n, a in zip(phs, args)}
    env_g: dict[str, np.ndarray] = {}
    pg = prog.pg

    def np32(t):
        return np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())

    get_g = prog.ir_reader(env_g, lambda n, src: C.round_to_dtype(np32(env_fx[src]), n.dtype),
                           lambda gid, n: C.eval_node(pg, gid, []), "program")

    def get_fx(a):
        if a in env_fx:
            return env_fx[a]
        v = prog.conv.value.get(a)
        node = prog.conv.graph.node(v)
        gid = pg.find(node.name)
        m = a.meta["val"]
        if gid is None or prog.nodes[gid].op in (OK.Input, OK.Constant):
            if node.op == OK.Input:
                val = env_fx[prog.conv.input_source[node.name]]
                return val.to(m.dtype)
            raise AssertionError(f"program: '{a.name}' is not available")
        arr = C.round_to_dtype(get_g(gid), prog.nodes[gid].dtype)
        return torch.from_numpy(arr).to(m.dtype)

    for s in steps:
        if s.kind == "region":
            fs = prog.regions[s.index].spec
            outs = C.interpret_spec(fs, get_g(fs.gemm.a), get_g(fs.gemm.b),
                                    [get_g(p.node) for p in fs.params], ctas)
            for o, v in zip(fs.outputs, outs):
                env_g[o.name] = v
        elif s.kind == "node":
            n = prog.nodes[s.index]
            env_g[n.name] = C.eval_node(pg, s.index, [get_g(i) for i in n.inputs])
        else:
            t = s.index
            a_, k_ = fx.node.map_arg((t.args, t.kwargs), get_fx)
            env_fx[t] = t.target(*a_, **k_)
    out = next(n for n in prog.gm.graph.nodes if n.op == "output")
    return list(fx.node.map_arg(out.args[0], get_fx))
