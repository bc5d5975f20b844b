"""Heads-major outputs: a fused region stores attention's [batch, heads, seq, head_dim] layout itself.

HF attention splits a projection's output into heads and transposes it; where the result must be contiguous (GPT-2's
fused QKV projection split into q, k and v; the key / value cache, which clones k and v), torch runs a copy kernel
per tensor after the GEMM. The pattern, in the post-grad ATen graph:

    y = addmm(bias, x, W)                  [B*S, T*C]   (one region output; views to [B, S, T*C] allowed)
    q, k, v = split(view(y), C, dim=2)     T parts (T = 1: no split)
    k = permute(view(k, [B, S, H, D]), [0, 2, 1, 3])
    k = clone(k)                           the copy (for some parts)

Here the region's kernel stores y heads-major instead (SpecOutput.heads_rows, kernels/comfuse/epilogue/store.cuh
HeadsMajor): one contiguous [T, B, H, S, D] buffer, which the fused call returns as its [B, S, T, H, D] view, and
each part's permute is a contiguous view of it: the clones go. S must be a static size (the kernel divides by it);
the batch may be dynamic.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.fx as fx

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
_SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)


class HeadsLayout(NamedTuple):
    seq: int               # S: rows per batch
    part: int              # C: columns per part (N when the output is not split)
    head_dim: int          # D
    copies: int            # parts that torch copied (their clone goes)
    parts: tuple           # per part t: (its permute node, [its clone nodes]) of the original graph, or None


def _shape(n):
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return list(v.shape) if isinstance(v, torch.Tensor) else None


def _static(d) -> bool:
    return isinstance(d, int) and not isinstance(d, torch.SymInt)


def _only_user(n):
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def _is_heads_permute(n) -> bool:
    if n.op != "call_function":
        return False
    if n.target is aten.permute.default:
        return list(n.args[1]) == [0, 2, 1, 3]
    if n.target is aten.transpose.int:
        return sorted(int(d) % 4 for d in n.args[1:3]) == [1, 2]
    return False


def _is_dense_clone(n) -> bool:
    if n.op != "call_function" or n.target is not aten.clone.default:
        return False
    fmt = n.kwargs.get("memory_format")
    return fmt in (None, torch.contiguous_format)


def _part(p, B, S, C):
    """(head_dim, permute node, clone nodes) of one part [B, S, C] seen as heads and transposed, or None."""
    view = _only_user(p)
    if view is None or view.op != "call_function" or view.target not in _VIEWS:
        return None
    vs = _shape(view)
    if vs is None or len(vs) != 4 or vs[:2] != [B, S] or not (_static(vs[2]) and _static(vs[3])) or vs[2] * vs[3] != C:
        return None
    perm = _only_user(view)
    if perm is None or not _is_heads_permute(perm):
        return None
    return vs[3], perm, [u for u in perm.users if _is_dense_clone(u)]


def find(out: fx.Node, n_cols: int) -> HeadsLayout | None:
    """The heads layout of a region output whose ATen node is `out` ([rows, N] or already [B, S, N]), when every
    reader of it is the pattern above and at least one part is copied; else None."""
    node, s = out, _shape(out)
    for _ in range(3):   # through views to [B, S, N], or to the view [B, S, H, D] of an output that is not split
        if s is None or s[-1] != n_cols or len(s) == 3:
            break
        nxt = _only_user(node)
        ns = _shape(nxt) if nxt is not None and nxt.op == "call_function" and nxt.target in _VIEWS else None
        if ns is not None and len(ns) == 4 and ns[2] * ns[3] == n_cols:
            s = ns[:2] + [n_cols]
            break
        node, s = nxt, ns
    if s is None or len(s) != 3 or s[-1] != n_cols or not _static(s[1]):
        return None
    B, S, N = s
    split = _only_user(node)
    if split is not None and split.op == "call_function" and split.target in _SPLITS:
        if int(split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)) % 3 != 2:
            return None
        sizes = split.args[1]
        C = int(sizes) if split.target is aten.split.Tensor else int(sizes[0])
        if split.target is aten.split_with_sizes.default and any(int(x) != C for x in sizes):
            return None
        if C <= 0 or N % C:
            return None
        users = list(split.users)
        if not all(u.op == "call_function" and u.target.__name__ == "getitem" for u in users):
            return None
        by_index = {int(u.args[1]): u for u in users}
        if len(by_index) != len(users):
            return None
        parts_of = [by_index.get(t) for t in range(N // C)]
    else:
        C, parts_of = N, [node]
    found, dims = [], set()
    for p in parts_of:
        if p is None:
            found.append(None)
            continue
        r = _part(p, B, S, C)
        if r is None:
            return None
        dims.add(r[0])
        found.append((r[1], r[2]))
    copies = sum(1 for f in found if f is not None and f[1])
    if len(dims) != 1 or copies == 0:
        return None
    D = dims.pop()
    if D % 8:
        return None
    return HeadsLayout(int(S), int(C), int(D), copies, tuple(found))


def find_for_regions(prog) -> dict:
    """{region index: {output index: HeadsLayout}} for the regions of a Program (program.Program)."""
    found: dict = {}
    for ri, r in enumerate(prog.regions):
        fs = r.spec
        for j, o in enumerate(fs.outputs):
            if o.per_row:
                continue
            f = prog.fx_of(o.name)
            lay = find(f, int(fs.gemm.n)) if f is not None else None
            if lay is not None and int(fs.gemm.rows) % lay.seq == 0:
                found.setdefault(ri, {})[j] = lay
    return found


def apply(fs, layouts: dict | None):
    """Spec `fs` with the outputs in `layouts` ({output index: HeadsLayout}) stored heads-major."""
    for j, lay in sorted((layouts or {}).items()):
        fs = fs.with_heads(j, lay.seq, lay.part, lay.head_dim, lay.copies)
    return fs


def emit_views(g: fx.Graph, out: fx.Node, lay: HeadsLayout, env_fx: dict) -> None:
    """In the rewritten graph `g`: each part's permute (and its clones) of the original graph becomes a view of the
    fused call's heads-major output `out` ([B, S, T, H, D]): select part t, then the permute, which is contiguous."""
    for t, p in enumerate(lay.parts):
        if p is None:
            continue
        perm, clones = p
        sel = g.call_function(aten.select.int, (out, 2, t))
        view = g.call_function(aten.permute.default, (sel, [0, 2, 1, 3]))
        env_fx[perm] = view
        for c in clones:
            env_fx[c] = view


def provided(lay_by_out: dict) -> set:
    """The original graph's nodes that emit_views provides (not to be copied)."""
    return {n for lay in lay_by_out.values() for p in lay.parts if p is not None for n in (p[0], *p[1])}
