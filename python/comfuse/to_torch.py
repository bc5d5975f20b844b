"""A `.cf` program (Graph IR) as a PyTorch function: the torch side of a whole-program comparison (bench/programs.py),
made from the program itself rather than written by hand per program.

    fn = to_torch.function(graph)          # graph: comfuse._core.Graph (parse_cf, or built)
    outs = fn(inputs)                      # inputs: {name: tensor}; returns {output name: tensor}
    compiled = torch.compile(fn)           # the same math for Inductor

Each node runs as eager PyTorch runs it, in the node's declared dtype: a bf16 add is a bf16 tensor op (computed in fp32
and rounded, as PyTorch does), a matmul takes its operands in the matmul's dtype, composite ops (layer_norm, rms_norm,
softmax, log_softmax, var) are torch's own functions. Constants are Python scalars. So the function is what a PyTorch
user would write for the program (what bench/programs.py gives torch.compile).

function(graph, intermediates="f32") is the same translation with the values between ops kept in fp32, as the
interpreters keep them; only each matmul's output is rounded to its dtype (the library GEMM's, and eager PyTorch's,
stored output). tests/python/test_to_torch.py holds that form to the library-form interpreter
(interpret_partitioned(.., library_form=True)) within 1e-5 on random programs, and the eager form to the fp32 program
within `run --check`'s tolerance on the examples.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from . import _core as C

_DTYPES = {C.DType.BF16: torch.bfloat16, C.DType.F16: torch.float16, C.DType.F32: torch.float32}

_UNARY: dict = {
    C.OpKind.Neg: torch.neg,
    C.OpKind.Abs: torch.abs,
    C.OpKind.Exp: torch.exp,
    C.OpKind.Log: torch.log,
    C.OpKind.Sqrt: torch.sqrt,
    C.OpKind.Rsqrt: torch.rsqrt,
    C.OpKind.Tanh: torch.tanh,
    C.OpKind.Sigmoid: torch.sigmoid,
    C.OpKind.Relu: torch.relu,
    C.OpKind.Gelu: lambda x: F.gelu(x),
    C.OpKind.GeluTanh: lambda x: F.gelu(x, approximate="tanh"),
    C.OpKind.Silu: F.silu,
    C.OpKind.Square: torch.square,
    C.OpKind.Reciprocal: torch.reciprocal,
}

_BINARY: dict = {
    C.OpKind.Add: torch.add,
    C.OpKind.Sub: torch.sub,
    C.OpKind.Mul: torch.mul,
    C.OpKind.Div: torch.div,
    C.OpKind.Max: torch.maximum,
    C.OpKind.Min: torch.minimum,
}

_REDUCE: dict = {
    C.OpKind.Sum: lambda x, d, k: torch.sum(x, d, keepdim=k),
    C.OpKind.Mean: lambda x, d, k: torch.mean(x, d, keepdim=k),
    C.OpKind.ReduceMax: lambda x, d, k: torch.amax(x, d, keepdim=k),
    C.OpKind.ReduceMin: lambda x, d, k: torch.amin(x, d, keepdim=k),
}


class UnsupportedNode(ValueError):
    """A node this translation has no PyTorch form for (named in the message)."""


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _node_fn(n, f32: bool = False) -> Callable:
    """The PyTorch form of node n: a function of its operands' values (tensors, or Python floats for constants).
    f32: operands and result in fp32 (a cast rounds to its dtype and comes back; a matmul rounds its output)."""
    op, dt = n.op, _DTYPES[n.dtype]
    if op in _UNARY:
        f = _UNARY[op]
        return lambda x: f(x)
    if op == C.OpKind.Cast:
        if n.is_relabel:   # the value under n's dtype, unrounded
            return (lambda x: x) if f32 else (lambda x: x.to(dt))
        to = _DTYPES[n.cast_to]
        return (lambda x: x.to(to).to(torch.float32)) if f32 else (lambda x: x.to(to))
    if op in _BINARY:
        f = _BINARY[op]

        def binary(a, b):
            if not torch.is_tensor(a) and not torch.is_tensor(b):
                return torch.tensor(f(torch.tensor(a), torch.tensor(b)).item(), dtype=dt)
            if not torch.is_tensor(a):   # (torch.maximum / minimum take tensors only)
                a = torch.tensor(a, dtype=b.dtype, device=b.device)
            if not torch.is_tensor(b):
                b = torch.tensor(b, dtype=a.dtype, device=a.device)
            return f(a, b)
        return binary
    if op == C.OpKind.Pow:
        e = n.value
        return lambda x: torch.pow(x, e)
    if op == C.OpKind.MatMul:
        ta, tb = n.transpose_a, n.transpose_b

        def matmul(a, b):
            a = a.to(dt).transpose(-1, -2) if ta else a.to(dt)
            b = b.to(dt).transpose(-1, -2) if tb else b.to(dt)
            if f32:
                # fp32 sums rounded once to dt, as the library GEMM and the interpreters compute; a CPU bf16 matmul
                # may sum otherwise (on an AVX2 machine one of 960 outputs of a random program rounded differently)
                return (a.float() @ b.float()).to(dt).to(torch.float32)
            return a @ b
        return matmul
    if op in _REDUCE:
        f, d, k = _REDUCE[op], n.dim, n.keepdim
        return lambda x: f(x, d, k)
    if op == C.OpKind.Transpose:
        perm = list(n.perm)
        return lambda x: x.permute(perm)
    if op == C.OpKind.Reshape:
        shape = list(n.shape)
        return lambda x: x.reshape(shape)
    if op == C.OpKind.RotateHalf:
        return _rotate_half
    if op in (C.OpKind.LayerNorm, C.OpKind.RmsNorm):
        eps, layer = n.value, op == C.OpKind.LayerNorm
        d = n.shape[-1]

        def norm(x, w=None, b=None):
            if layer:
                return F.layer_norm(x, (d,), w, b, eps)
            return F.rms_norm(x, (d,), w, eps)
        return norm
    if op == C.OpKind.Softmax:
        d = n.dim
        return lambda x: torch.softmax(x, d)
    if op == C.OpKind.LogSoftmax:
        d = n.dim
        return lambda x: torch.log_softmax(x, d)
    if op == C.OpKind.Var:
        d, corr, k = n.dim, n.correction, n.keepdim
        return lambda x: torch.var(x, d, correction=corr, keepdim=k)
    raise UnsupportedNode(f"node '{n.name}': no PyTorch form for {C.op_name(op)}")


def function(graph, intermediates: str = "declared", given=()) -> Callable[[dict], dict]:
    """The program as a function of its inputs by name, returning its outputs by name, each in its declared dtype.
    intermediates: "declared" (each op in its node's dtype, as eager PyTorch) or "f32" (fp32 between ops, as the
    interpreters). given: names of computed nodes whose values the caller passes in as inputs instead (e.g. every
    matmul's output: the function is then the program's epilogue alone; see matmul_names / given_inputs).
    Raises UnsupportedNode for a node without a PyTorch form (before any tensor work)."""
    if intermediates not in ("declared", "f32"):
        raise ValueError(f"intermediates must be 'declared' or 'f32', got {intermediates!r}")
    f32 = intermediates == "f32"
    nodes = list(graph.nodes)
    given = set(given)
    unknown = given - {n.name for n in nodes if n.op not in (C.OpKind.Input, C.OpKind.Constant)}
    if unknown:
        raise ValueError(f"given names no computed node of the program: {', '.join(sorted(unknown))}")
    steps = []   # (node id, fn, operand ids, dtype kept) in the graph's (topological) order
    for n in nodes:
        if n.op in (C.OpKind.Input, C.OpKind.Constant) or n.name in given:
            continue
        steps.append((n.id, _node_fn(n, f32), list(n.inputs), torch.float32 if f32 else _DTYPES[n.dtype]))
    inputs = [(i, nodes[i].name, _DTYPES[nodes[i].dtype]) for i in graph.inputs]
    inputs += [(n.id, n.name, _DTYPES[n.dtype]) for n in nodes if n.name in given]
    constants = {n.id: float(n.value) for n in nodes if n.op == C.OpKind.Constant}
    outputs = [(name, i, _DTYPES[nodes[i].dtype]) for name, i in graph.outputs]

    def run(tensors: dict) -> dict:
        env: dict = dict(constants)
        for i, name, dt in inputs:   # rounded to the declared dtype (as the interpreters take them)
            t = tensors[name]
            t = t if t.dtype == dt else t.to(dt)
            env[i] = t.to(torch.float32) if f32 else t
        for i, fn, args, dt in steps:
            v = fn(*(env[a] for a in args))
            env[i] = v.to(dt) if torch.is_tensor(v) and v.dtype != dt else v
        return {name: env[i] if env[i].dtype == dt else env[i].to(dt) for name, i, dt in outputs}

    return run


def matmul_names(graph) -> list:
    """The names of the program's matmul nodes (for function(graph, given=...): the epilogue alone)."""
    return [n.name for n in graph.nodes if n.op == C.OpKind.MatMul]


def given_inputs(graph, names, device="cpu", seed: int = 1) -> dict:
    """Uniform [-1, 1) values for the given nodes, in their declared dtypes and shapes (on `device`)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    by_name = {n.name: n for n in graph.nodes}
    return {x: (torch.rand(list(by_name[x].shape), generator=gen) * 2 - 1).to(_DTYPES[by_name[x].dtype]).to(device)
            for x in names}


def random_inputs(graph, device="cpu", seed: int = 0) -> dict:
    """Uniform [-1, 1) inputs for every graph input, in its declared dtype (on `device`). Inputs named W*: scaled by
    1/sqrt(their last dim), so that GEMM outputs stay O(1); named g* (norm weights): 1 + 0.1 u."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = {}
    for i in graph.inputs:
        n = graph.node(i)
        x = torch.rand(list(n.shape), generator=gen) * 2 - 1
        if n.name.startswith("W"):
            x = x / max(n.shape[-1], 1) ** 0.5
        elif n.name.startswith("g"):
            x = 1 + 0.1 * x
        out[n.name] = x.to(_DTYPES[n.dtype]).to(device)
    return out
