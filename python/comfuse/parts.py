"""Outputs stored part by part, and the copies of attention heads that become views.

HF attention views a projection's output as heads and transposes it; the key / value cache then copies k and v
(`torch.cat` onto an empty cache, a preserve-format `clone` in the post-grad ATen graph):

    y = addmm(bias, x, W)                  [B*S, T*C]   (views to [B, S, T*C] allowed)
    q, k, v = split(view(y), C, dim=-1)    T equal parts (GPT-2's fused QKV projection; T = 1: no split)
    k = permute(view(k, [B, S, H, D]), [0, 2, 1, 3])
    k = clone(k)                           dense, in k's own dim order: [B, S, H, D] in memory

The copy is needed only because a part is a column slice of y. A preserve-format copy of a view chain (views,
then permutes) of a dense tensor is the view itself, value for value and stride for stride, so where the part is
dense the clone is dropped and the view stands in for it:
- a region whose output is split has its kernel store it part by part (SpecOutput.part_cols, PartMajor in
  kernels/comfuse/epilogue/store.cuh): a [T, B*S, C] buffer, every part a dense [B*S, C] matrix;
- an output that is not split is dense already: a fused region's, or a GEMM's left to torch (Llama's v).
Nothing here depends on the batch or sequence size, which may be symbolic.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.fx as fx

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_PERMUTES = (aten.permute.default, aten.transpose.int)
_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)
# GEMMs torch runs that write a fresh dense output (cuBLAS, Inductor's templates)
_TORCH_GEMMS = (aten.mm.default, aten.addmm.default, aten.bmm.default)


class SplitLayout(NamedTuple):
    part: int          # C: columns per part (N: the output is not split)
    copies: int        # parts whose copy becomes a view
    roots: tuple       # per part t: the ATen node whose value is part t (a split's getitem, or the output's node)
    clones: tuple      # the copies that become views (copies_of each root)


def _shape(n):
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return list(v.shape) if isinstance(v, torch.Tensor) else None


def _only_user(n):
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _graph_outputs(g: fx.Graph) -> set:
    out = next(n for n in g.nodes if n.op == "output")
    return set(out.all_input_nodes)


def copies_of(root: fx.Node, outputs: set) -> list:
    """The clones that copy a view chain of `root`'s value, where that value is dense: root, then views (while
    nothing is permuted), then permutes, then a clone that keeps the layout (preserve format; or contiguous
    format after views alone). At most one, so that no two graph outputs share memory the original did not share;
    none where root or the chain is itself a graph output."""
    found, todo = [], [(root, False)]
    while todo:
        n, permuted = todo.pop()
        if n in outputs:
            return []
        for u in n.users:
            if u.op != "call_function":
                continue
            if u.target in _VIEWS and not permuted:
                todo.append((u, False))
            elif u.target in _PERMUTES:
                todo.append((u, True))
            elif u.target is aten.clone.default:
                fmt = u.kwargs.get("memory_format")
                if fmt in (None, torch.preserve_format) or (fmt is torch.contiguous_format and not permuted):
                    found.append(u)
    return found[:1]


def find(out: fx.Node, n_cols: int, outputs: set) -> SplitLayout | None:
    """The layout of a region output whose ATen node is `out` ([..., N]), where copies of its parts can become
    views: its value read only through one split of the last dim into equal parts of a whole number of 16-byte
    blocks (or not split), and at least one part copied (copies_of). Else None."""
    node = out
    for _ in range(3):   # through views that keep the last dim N, to the split
        nxt = _only_user(node)
        if node in outputs or nxt is None or nxt.op != "call_function" or nxt.target not in _VIEWS:
            break
        s = _shape(nxt)
        if s is None or s[-1] != n_cols:
            break
        node = nxt
    split = _only_user(node)
    roots = [out]
    if split is not None and split.op == "call_function" and split.target in _SPLITS and node not in outputs:
        s = _shape(node)
        dim = int(split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0))
        sizes = split.args[1]
        C = int(sizes) if split.target is aten.split.Tensor else int(sizes[0])
        if s is None or dim % len(s) != len(s) - 1 or C <= 0 or n_cols % C or C % 8:
            return None
        if split.target is aten.split_with_sizes.default and any(int(x) != C for x in sizes):
            return None
        if not all(u.op == "call_function" and u.target.__name__ == "getitem" for u in split.users):
            return None
        by_index = {int(u.args[1]): u for u in split.users}
        if len(by_index) != len(split.users):
            return None
        roots = [by_index.get(t) for t in range(n_cols // C)]
    else:
        C = n_cols
    clones = tuple(c for r in roots if r is not None for c in copies_of(r, outputs))
    return SplitLayout(C, len(clones), tuple(roots), clones) if clones else None


def find_for_regions(prog) -> dict:
    """{region index: {output index: SplitLayout}} for the regions of a Program (program.Program)."""
    found: dict = {}
    outputs = _graph_outputs(prog.gm.graph)
    for ri, r in enumerate(prog.regions):
        fs = r.spec
        for j, o in enumerate(fs.outputs):
            if o.per_row:
                continue
            f = prog.fx_of(o.name)
            lay = find(f, int(fs.gemm.n), outputs) if f is not None else None
            if lay is not None:
                found.setdefault(ri, {})[j] = lay
    return found


def apply(fs, layouts: dict | None):
    """Spec `fs` with the outputs in `layouts` ({output index: SplitLayout}) stored in parts, their copies noted
    for the planner."""
    for j, lay in sorted((layouts or {}).items()):
        fs = fs.with_parts(j, lay.part, lay.copies)
    return fs


def dropped_copies(gm: fx.GraphModule, layouts: dict, torch_nodes) -> set:
    """The clones a rewrite drops (each replaced by the view it copies): those of the parts of fused regions'
    outputs (`layouts`: {region: {output: SplitLayout}} of the fused regions), and those of GEMMs left to torch
    (`torch_nodes`: the ATen nodes the rewrite copies)."""
    outputs = _graph_outputs(gm.graph)
    gemms = [n for n in torch_nodes if n.op == "call_function" and n.target in _TORCH_GEMMS]
    return ({c for lays in layouts.values() for lay in lays.values() for c in lay.clones} |
            {c for n in gemms for c in copies_of(n, outputs)})


def emit_parts(g: fx.Graph, out: fx.Node, lay: SplitLayout, lead: list, env_fx: dict, reshape) -> None:
    """In the rewritten graph `g`: each part of the original graph's split (its getitem) becomes part t of the fused
    call's output `out` ([*lead, T, C], stored in parts): a select, dense, seen in the getitem's shape (`reshape`:
    the rewrite's, symbolic sizes allowed)."""
    if len(lay.roots) < 2:   # not split: stored row-major
        return
    for t, root in enumerate(lay.roots):
        if root is not None:
            sel = g.call_function(aten.select.int, (out, len(lead), t))
            env_fx[root] = reshape(sel, [*lead, lay.part], root.meta["val"].shape)
