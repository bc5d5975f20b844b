"""The custom op a fused region becomes in the rewritten graph, and torch forms of standard-path Graph IR nodes.

`comfuse::fused_region(key, inputs) -> outputs`: one ComFuse kernel. `key` names a registered FusionSpec;
`inputs` are the GEMM operands A and B followed by the Spec's runtime parameters, in order. Its fake (meta)
implementation gives the output shapes and dtypes, so Dynamo/AOT/Inductor can trace and schedule around it.
Its only real implementation today is the CPU reference (interpret_spec): the GPU kernels (code generation, JIT,
launch) do not exist yet, so the backend never puts this op into a graph that runs on CUDA tensors.
"""
from __future__ import annotations

import itertools
import threading

import numpy as np
import torch

from . import _core as C
from .convert import DT_TO_TORCH, OK

_REGIONS: dict = {}
_LOCK = threading.Lock()
_COUNTER = itertools.count()


def register_region(spec, ctas: int = 1) -> str:
    """Registers a FusionSpec; returns the key the custom op is called with."""
    with _LOCK:
        key = f"r{spec.structural_hash():016x}_{next(_COUNTER)}"
        _REGIONS[key] = (spec, int(ctas))
    return key


def region_spec(key: str):
    return _REGIONS[key][0]


def _np32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to("cpu", torch.float32).numpy())


@torch.library.custom_op("comfuse::fused_region", mutates_args=())
def fused_region(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    spec, ctas = _REGIONS[key]
    if any(t.device.type != "cpu" for t in inputs):
        raise NotImplementedError("comfuse::fused_region: GPU kernels are not implemented yet "
                                  "(only the CPU reference implementation exists)")
    a, b, *params = (_np32(t) for t in inputs)
    outs = C.interpret_spec(spec, a, b, params, ctas)
    return [torch.from_numpy(o).to(DT_TO_TORCH[so.dtype]) for o, so in zip(outs, spec.outputs)]


@fused_region.register_fake
def _fused_region_fake(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    spec, _ = _REGIONS[key]
    dev = inputs[0].device
    return [torch.empty(list(o.shape), dtype=DT_TO_TORCH[o.dtype], device=dev) for o in spec.outputs]


def _round(x: torch.Tensor, dt: int) -> torch.Tensor:
    return x.to(DT_TO_TORCH[C.DType(dt)]).to(torch.float32)


_UNARY = {
    OK.Neg: torch.neg, OK.Abs: torch.abs, OK.Exp: torch.exp, OK.Log: torch.log, OK.Sqrt: torch.sqrt,
    OK.Rsqrt: torch.rsqrt, OK.Tanh: torch.tanh, OK.Sigmoid: torch.sigmoid, OK.Relu: torch.relu,
    OK.Gelu: lambda x: torch.nn.functional.gelu(x), OK.GeluTanh: lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    OK.Silu: torch.nn.functional.silu, OK.Square: torch.square, OK.Reciprocal: torch.reciprocal,
}
_BINARY = {OK.Add: torch.add, OK.Sub: torch.sub, OK.Mul: torch.mul, OK.Div: torch.div,
           OK.Max: torch.maximum, OK.Min: torch.minimum}
_REDUCE = {OK.Sum: torch.sum, OK.Mean: torch.mean, OK.ReduceMax: torch.amax, OK.ReduceMin: torch.amin}


def eval_graph_node(spec: tuple, *xs):
    """One Graph IR node in torch, fp32 values as the Graph IR defines them (a standard-path step)."""
    op, shape, dtype, value, dim, keepdim, ta, tb, perm, cast_to = spec
    op = C.OpKind(op)
    xs = [x.to(torch.float32) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)
          for x in xs]
    if op == OK.MatMul:
        a, b = _round(xs[0], dtype), _round(xs[1], dtype)
        if ta:
            a = a.transpose(-1, -2)
        if tb:
            b = b.transpose(-1, -2)
        return torch.matmul(a, b)
    if op == OK.Cast:
        return _round(xs[0], cast_to)
    if op in _UNARY:
        return _UNARY[op](xs[0])
    if op == OK.Pow:
        return torch.pow(xs[0], value)
    if op in _BINARY:
        return _BINARY[op](xs[0], xs[1])
    if op in _REDUCE:
        return _REDUCE[op](xs[0], dim, keepdim=keepdim)
    if op == OK.Transpose:
        return xs[0].permute(list(perm)).contiguous()
    if op == OK.Reshape:
        return xs[0].reshape(list(shape))
    raise NotImplementedError(f"eval_graph_node: {C.op_name(op)}")
