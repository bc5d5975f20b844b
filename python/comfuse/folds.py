"""Folded weights of deferred norms, computed once and kept: the `comfuse::fold` op.

A norm finished in the GEMMs that read it (_core.defer_norms) makes values that depend on the model's parameters
alone: W* = diag(g) W rounded to W's dtype, the column sums s of W*, the shift c = beta W + b. In the rewritten
graph each is one `comfuse::fold(key, [sources])` call, whose sources are the parameters it is computed from. The
op computes the value on its first call for those source tensors and returns the same tensor on every later call
while each source is the same tensor at the same version (`Tensor._version`, which every in-place op on it bumps);
otherwise it computes it again, into the same memory (so a CUDA graph that captured a launch reading it sees the new
values after the next eager call, or after `refold()`). One compiled graph may serve several sets of parameters
(the layers of a model whose layer Dynamo compiles once; a graph from Inductor's cache): each set has its own value.

Not seen: a write through `.data` (it bypasses the version counter), and any write to an inference tensor (made
under torch.inference_mode(): it has no version counter) - call `comfuse.refold()` after one, and after changing
parameters in place under CUDA graphs (mode="reduce-overhead"), whose replays do not run the op. A fold that misses
while a CUDA graph is being captured raises (its computation would be captured and replayed): refold before capturing.

The values are read only by `comfuse::fused_region` calls (extern kernels to Inductor, which writes into none of
their inputs; emit.rewrite_keeping_torch checks that nothing else reads a fold). A value whose sources are all gone
is dropped at the next miss of any fold.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
import weakref

import torch

from . import ops
from .convert import OK

log = logging.getLogger("comfuse")


@dataclasses.dataclass
class _Fold:
    label: str                # the Graph IR value it computes (for the log)
    steps: list               # (graph IR id, Program.node_spec, input ids), in topological order
    sources: list             # graph IR ids of the op's inputs, in its order
    consts: dict              # graph IR id -> constant value read by a step
    out: int                  # the graph IR id of the value
    dtype: torch.dtype
    shape: tuple


@dataclasses.dataclass
class _Cached:
    versions: tuple           # the sources' versions it was computed at
    value: torch.Tensor
    sources: list             # weak references to the source tensors (refold())
    ms: float                 # the time its last computation took (host wall clock, the GPU synchronized)


_FOLDS: dict = {}
_CACHE: dict = {}             # key -> {the sources' (address, shape, strides, dtype, device): _Cached}
_LOCK = threading.Lock()
_COUNTER = itertools.count()
_direct_calls = 0             # calls the direct entry served (stats())


def register(label: str, steps: list, sources: list, consts: dict, out: int, dtype, shape) -> str:
    """Registers a fold (the Graph IR steps from its sources to `out`); returns the key the op is called with."""
    with _LOCK:
        key = f"f{next(_COUNTER)}"
        _FOLDS[key] = _Fold(label, list(steps), list(sources), dict(consts), int(out), dtype, tuple(shape))
    return key


def _where(xs) -> tuple:
    return tuple((x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device) for x in xs)


def _version(x: torch.Tensor) -> int:
    """x's version counter; -1 for an inference tensor, which has none (its in-place writes are not seen)."""
    return -1 if x.is_inference() else x._version


def _prune() -> None:
    """Drops the values whose sources are all gone (a deleted model's). Under _LOCK."""
    for d in _CACHE.values():
        for where in [w for w, c in d.items() if all(r() is None for r in c.sources)]:
            del d[where]


def _compute(f: _Fold, xs) -> torch.Tensor:
    env = dict(f.consts)
    env.update(zip(f.sources, xs))
    for gid, spec, ins in f.steps:
        env[gid] = ops.eval_graph_node(spec, *[env[i] for i in ins])
    return env[f.out].to(f.dtype).reshape(f.shape)


def _fill(key: str, xs) -> torch.Tensor:
    """The fold's value for sources xs: the cached one, or computed (into the cached memory where it fits)."""
    f = _FOLDS[key]
    where, versions = _where(xs), tuple(_version(x) for x in xs)
    with _LOCK:
        c = _CACHE.setdefault(key, {}).get(where)
        if c is not None and c.versions == versions and all(r() is x for r, x in zip(c.sources, xs)):
            return c.value
        _prune()
    if any(x.is_cuda for x in xs) and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"comfuse: the folded weight {f.label} must be computed again (a parameter it is folded "
                           f"from changed, or is new) while a CUDA graph is being captured; call comfuse.refold() "
                           f"before capturing")
    t0 = time.perf_counter()
    with torch.no_grad():
        v = _compute(f, xs)
        if c is not None and c.value.shape == v.shape and c.value.dtype == v.dtype and c.value.device == v.device:
            with torch.inference_mode(c.value.is_inference()):   # (one made under inference mode is written there)
                c.value.copy_(v)
            v = c.value
        if v.is_cuda:
            torch.cuda.synchronize(v.device)
    ms = (time.perf_counter() - t0) * 1e3
    with _LOCK:
        _CACHE[key][where] = _Cached(versions, v, [weakref.ref(x) for x in xs], ms)
    log.info("comfuse: folded %s (%s %s, %.1f MB) in %.1f ms%s", f.label, str(v.dtype).split(".")[-1],
             list(v.shape), v.numel() * v.element_size() / 2**20, ms, "" if c is None else " (again: a source changed)")
    return v


def _run_fold(key: str, sources: list[torch.Tensor]) -> torch.Tensor:
    return _fill(key, sources)


def fold_direct(key: str, sources: list) -> torch.Tensor:
    """What Inductor's Python wrapper calls for the op (inductor.py): the value itself where every source is a plain
    tensor or parameter, else the op (a fake tensor, a subclass: the dispatcher's business)."""
    if all(type(x) in (torch.Tensor, torch.nn.Parameter) for x in sources):
        global _direct_calls
        _direct_calls += 1
        return _fill(key, sources)
    return torch.ops.comfuse.fold.default(key, sources)


def _fold_fake(key: str, sources: list[torch.Tensor]) -> torch.Tensor:
    f = _FOLDS[key]
    return sources[0].new_empty(f.shape, dtype=f.dtype)


_LIB = torch.library.Library("comfuse", "FRAGMENT")
_LIB.define("fold(str key, Tensor[] sources) -> Tensor")
_LIB.impl("fold", _run_fold, "CPU")
_LIB.impl("fold", _run_fold, "CUDA")
torch.library.register_fake("comfuse::fold", _fold_fake, lib=_LIB)


def refold() -> int:
    """Computes every folded weight again from its sources, in place: after a write through `.data`, or after
    changing parameters in place under CUDA graphs. Returns how many were computed (a fold whose sources are gone
    is dropped)."""
    done = 0
    with _LOCK:
        entries = [(key, where, c) for key, d in _CACHE.items() for where, c in d.items()]
    for key, where, c in entries:
        xs = [r() for r in c.sources]
        if any(x is None for x in xs):
            with _LOCK:
                _CACHE[key].pop(where, None)
            continue
        with _LOCK:
            c.versions = ()   # computed again, into the same memory
        _fill(key, xs)
        done += 1
    return done


def stats() -> dict:
    """The folded weights this process holds: how many, their bytes, the time their last computations took, and the
    calls the direct entry served so far."""
    with _LOCK:
        _prune()
        cs = [c for d in _CACHE.values() for c in d.values()]
    return {"folds": len(cs), "bytes": sum(c.value.numel() * c.value.element_size() for c in cs),
            "ms": sum(c.ms for c in cs), "direct_calls": _direct_calls}


def subgraph(prog, gid: int) -> tuple[list, list, dict]:
    """The Graph IR steps that compute value `gid` from graph inputs: (steps in topological order, the input ids
    it reads, the constants it reads)."""
    need, stack = set(), [gid]
    sources, consts = set(), {}
    while stack:
        i = stack.pop()
        n = prog.nodes[i]
        if n.op == OK.Input:
            sources.add(i)
        elif n.op == OK.Constant:
            consts[i] = n.value
        elif i not in need:
            need.add(i)
            stack.extend(n.inputs)
    steps = [(i, prog.node_spec(prog.nodes[i]), list(prog.nodes[i].inputs)) for i in sorted(need)]
    return steps, sorted(sources), consts

