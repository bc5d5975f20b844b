"""Rotary position embeddings (HF's apply_rotary_pos_emb) in the layout of the GEMM that produces them.

A Llama-style attention computes, for q (and k) = X·W seen as heads,

    t = permute(view(q, [B, S, H, D]), [0, 2, 1, 3])                      # [B, H, S, D]
    out = t * cos + cat([-t[..., D/2:], t[..., :D/2]], -1) * sin          # rotate_half(t) * sin
    cos, sin: [B or 1, 1, S, D]                                           # one head wide, per token

Everything after the permute is elementwise over the last dim (which the permute keeps), so it can run before it,
on the GEMM's own [B, S, H, D] layout: there every operand is a function of the GEMM's element coordinates, and
the epilogue of the GEMM computes it (rotate_half swaps registers; cos and sin are one [B*S, D] block per row,
BroadcastKind::Periodic). `gemm_layout_rotary(gm)` rewrites the ATen graph to that form:

    u = view(q, [B, S, H, D]);  c = clone(expand(permute(cos), [B, S, 1, D]))  (s likewise, once per cos / sin)
    out = permute(u * c + cat([-u[..., D/2:], u[..., :D/2]], -1) * s, [0, 2, 1, 3])

The result is the same tensor (same values, a permuted view instead of a dense [B, H, S, D]); torch ops run it
where ComFuse does not fuse it. The materialized cos and sin (1 MB each at 8192 tokens x 64) are torch nodes, made
once per forward and shared by every layer. `rotate_half_of(cat)` finds rotate_half as HF writes it; the
converter turns it into one Graph IR rotate_half.
"""
from __future__ import annotations

import sys

import torch
import torch.fx as fx

aten = torch.ops.aten

# The node meta key that marks the materialized cos / sin: the converter keeps them in torch (a copy is not an
# epilogue op), so the kernel reads them as a dense [rows, D] parameter.
MATERIALIZED = "comfuse_rotary_table"


def _call(n, *targets) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def _arg(n: fx.Node, i: int, name: str, default):
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _static(d) -> int | None:
    return d if isinstance(d, int) else None


def rotate_half_of(cat: fx.Node):
    """(x, [lo, hi, neg]) when `cat` is rotate_half(x) = cat([-x[..., D/2:], x[..., :D/2]], dim=-1) with D static
    and even, and the slices and the negation read by nothing else; else None."""
    if not _call(cat, aten.cat.default) or not isinstance(_val(cat), torch.Tensor):
        return None
    parts, r = cat.args[0], _val(cat).dim()
    if not isinstance(parts, (list, tuple)) or len(parts) != 2 or _arg(cat, 1, "dim", 0) % r != r - 1:
        return None
    neg, lo = parts
    if not _call(neg, aten.neg.default) or not _call(lo, aten.slice.Tensor):
        return None
    hi = neg.args[0]
    if not _call(hi, aten.slice.Tensor) or hi.args[0] is not lo.args[0]:
        return None
    x = lo.args[0]
    d = _static(_val(x).shape[-1]) if isinstance(_val(x), torch.Tensor) else None
    if d is None or d % 2:
        return None

    def bounds(s):
        if _arg(s, 1, "dim", 0) % r != r - 1 or _arg(s, 4, "step", 1) != 1:
            return None
        start, end = _arg(s, 2, "start", 0), _arg(s, 3, "end", sys.maxsize)
        return (start or 0), min(end if end is not None else sys.maxsize, d)

    if bounds(lo) != (0, d // 2) or bounds(hi) != (d // 2, d):
        return None
    if set(neg.users) != {cat} or set(lo.users) != {cat} or set(hi.users) != {neg}:
        return None
    return x, [lo, hi, neg]


def _through_views(n: fx.Node) -> fx.Node:
    """The node whose value `n` views (through view, reshape and unsqueeze)."""
    while _call(n, aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default):
        n = n.args[0]
    return n


def rotate_half_nodes(call, x, d: int):
    """rotate_half(x) over a last dim of d as HF writes it, cat([-x[..., d/2:], x[..., :d/2]], -1), built with
    `call(target, *args)` (which makes one node): the form rotate_half_of recognises."""
    hi = call(aten.slice.Tensor, x, -1, d // 2, d)
    return call(aten.cat.default, [call(aten.neg.default, hi), call(aten.slice.Tensor, x, -1, 0, d // 2)], -1)


def _mul_operands(m: fx.Node, x: fx.Node):
    """The other operand of mul `m` = x * o (either order), a tensor node; else None."""
    if not _call(m, aten.mul.Tensor) or len(m.args) != 2:
        return None
    a, b = m.args
    o = b if a is x else a if b is x else None
    return o if isinstance(o, fx.Node) and isinstance(_val(o), torch.Tensor) else None


class _Builder:
    """New ATen nodes with their fake values (the converter reads shapes and dtypes from node.meta["val"])."""

    def __init__(self, gm: fx.GraphModule):
        self.graph = gm.graph
        self.fake = torch._guards.detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
        self.sizes: dict = {}   # symbolic size -> its node (one sym_size per size)

    def __call__(self, target, *args, **kwargs) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        vals = fx.node.map_arg(args, _val), fx.node.map_arg(kwargs, _val)
        if self.fake is not None:
            with self.fake:
                node.meta["val"] = target(*vals[0], **vals[1])
        else:
            node.meta["val"] = target(*vals[0], **vals[1])
        return node

    def size(self, d):
        """Size d as an argument: an int, or a graph input's node that holds the symbolic size (a placeholder, or
        sym_size of an input tensor), never a value computed from a GEMM: the table must not depend on the GEMM
        whose epilogue reads it. None when no graph input has it."""
        if not isinstance(d, torch.SymInt):
            return int(d)
        expr = str(d.node.expr)
        if expr not in self.sizes:
            self.sizes[expr] = self._find_size(expr)
        return self.sizes[expr]

    def _find_size(self, expr: str):
        for p in self.graph.nodes:
            if p.op != "placeholder":
                continue
            v = p.meta.get("val")
            if isinstance(v, torch.SymInt) and str(v.node.expr) == expr:
                return p
            if isinstance(v, torch.Tensor):
                for i, e in enumerate(v.shape):
                    if isinstance(e, torch.SymInt) and str(e.node.expr) == expr:
                        with self.graph.inserting_after(p):
                            return self(aten.sym_size.int, p, i)
        return None


def gemm_layout_rotary(gm: fx.GraphModule) -> int:
    """Rewrites every rotary embedding of a GEMM's heads (module docstring) to run before the permute; returns
    how many. Leaves anything else unchanged."""
    b = _Builder(gm)
    tables: dict = {}
    done = 0
    for cat in list(gm.graph.nodes):
        rh = rotate_half_of(cat)
        if rh is None:
            continue
        t = rh[0]
        if not _call(t, aten.permute.default) or len(_val(t).shape) != 4 or [d % 4 for d in t.args[1]] != [0, 2, 1, 3]:
            continue
        u = t.args[0]
        if not _call(_through_views(u), aten.mm.default, aten.addmm.default):
            continue   # only what a GEMM produces: elsewhere the permuted form is as good
        if len(cat.users) != 1:
            continue
        m_sin = next(iter(cat.users))
        sin = _mul_operands(m_sin, cat)
        if sin is None or len(m_sin.users) != 1:
            continue
        add = next(iter(m_sin.users))
        if not _call(add, aten.add.Tensor) or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
            continue
        m_cos = add.args[0] if add.args[1] is m_sin else add.args[1]
        cos = _mul_operands(m_cos, t)
        if cos is None or len(m_cos.users) != 1:
            continue
        shape = _val(t).shape   # [B, H, S, D]
        ok = True
        for c in (cos, sin):
            cs = _val(c).shape
            ok = ok and len(cs) == 4 and cs[1] == 1 and cs[3] == shape[3] and cs[2] == shape[2] and cs[0] in (1, shape[0])
            ok = ok and _val(c).dtype == _val(t).dtype
        rows = [b.size(d) for d in _val(u).shape[:2]] if ok else [None]   # B and S, from the graph's inputs
        if None in rows:
            continue
        with gm.graph.inserting_before(add):
            def table(c):   # [B or 1, 1, S, D] -> a dense [B, S, 1, D], once per table (each layer unsqueezes it anew)
                key = (_through_views(c), tuple(str(x) for x in _val(c).shape))
                if key not in tables:
                    e = b(aten.expand.default, b(aten.permute.default, c, [0, 2, 1, 3]), [*rows, 1, shape[3]])
                    tables[key] = b(aten.clone.default, e, memory_format=torch.contiguous_format)
                    tables[key].meta[MATERIALIZED] = True
                return tables[key]
            d = shape[3]
            rot = rotate_half_nodes(b, u, d)
            y = b(aten.add.Tensor, b(aten.mul.Tensor, u, table(cos)), b(aten.mul.Tensor, rot, table(sin)))
            out = b(aten.permute.default, y, [0, 2, 1, 3])
        add.replace_all_uses_with(out)
        for dead in (add, m_sin, m_cos, cat, *rh[1][::-1], t):
            if not dead.users:
                gm.graph.erase_node(dead)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done
