"""Capture: a Dynamo FX graph -> the inference ATen graph ComFuse converts.

`aten_graph(gm, example_inputs)` traces the graph with AOTAutograd's export (functionalized, no autograd, static
shapes, one placeholder per Dynamo input) using TorchInductor's decomposition table, so LayerNorm, RMSNorm,
softmax, log_softmax and friends arrive as primitives (var_mean, mean, amax, exp, sum, rsqrt, ...). A few ops are
kept whole because the Graph IR has them as single ops or because the GEMM must stay a GEMM: gelu, silu, and
the matmuls (Inductor rewrites tiny mm/addmm/bmm into pointwise code on CPU).
"""
from __future__ import annotations

import functools

import torch
import torch.fx as fx

aten = torch.ops.aten

_KEEP = (aten.gelu, aten.silu, aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.sigmoid, aten.tanh)


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    from torch._inductor.decomposition import select_decomp_table

    table = dict(select_decomp_table())
    for op in list(table):
        if getattr(op, "overloadpacket", None) in _KEEP:
            del table[op]
    return table


def aten_graph(gm: torch.nn.Module, example_inputs) -> fx.GraphModule:
    """The inference ATen graph of `gm` (a Dynamo graph module, or any module taking only tensors)."""
    from torch._functorch.aot_autograd import aot_export_module

    with torch.no_grad():
        graph, _signature = aot_export_module(gm, list(example_inputs), trace_joint=False,
                                              decompositions=decomposition_table())
    return graph
