"""Folded weights of deferred norms, computed once and kept: the `comfuse::fold` op.

A norm finished in the GEMMs that read it (_core.defer_norms) makes values that depend on the model's parameters
alone: W* = diag(g) W rounded to W's dtype, the column sums s of W*, the shift c = beta W + b. In the rewritten
graph the values a fused region reads are one `comfuse::fold(key, [sources])` call (one host call per region: a
LayerNorm's reader takes three), whose sources are the parameters they are computed from. The op computes the
values on its first call for those source tensors and returns the same tensors on every later call while each
source is the same tensor at the same version (`Tensor._version`, which every in-place op on it bumps); otherwise
it computes them again, into the same memory (so a CUDA graph that captured a launch reading them sees the new
values after the next eager call, or after `refold()`). One compiled graph may serve several sets of parameters
(the layers of a model whose layer Dynamo compiles once; a graph from Inductor's cache): each set has its own
values.

Not seen: a write through `.data` (it bypasses the version counter), and any write to an inference tensor (made
under torch.inference_mode(): it has no version counter) - call `comfuse.refold()` after one, and after changing
parameters in place under CUDA graphs (mode="reduce-overhead"), whose replays do not run the op. A fold that misses
while a CUDA graph is being captured raises (its computation would be captured and replayed): refold before capturing.

The values are read only by `comfuse::fused_region` calls (extern kernels to Inductor, which writes into none of
their inputs; emit.rewrite_keeping_torch checks that nothing else reads a fold). A value with a source gone, or
computed from the same tensors at another address, is dropped at the next miss of a fold.
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
    labels: list              # the Graph IR values it computes (for the log)
    steps: list               # (graph IR id, Program.node_spec, input ids), in topological order
    sources: list             # graph IR ids of the op's inputs, in its order
    consts: dict              # graph IR id -> constant value read by a step
    outs: list                # (graph IR id, torch dtype, shape) of each value, in the op's order


@dataclasses.dataclass
class _Cached:
    versions: tuple           # the sources' versions they were computed at
    values: list
    sources: list             # weak references to the source tensors (refold())
    ms: float                 # the time their last computation took (host wall clock, the GPU synchronized)


_FOLDS: dict = {}
_CACHE: dict = {}             # key -> {the sources' (address, shape, strides, dtype, device): _Cached}
_LOCK = threading.Lock()
_COUNTER = itertools.count()
_direct_calls = 0             # calls the direct entry served (stats())


def register(labels: list, steps: list, sources: list, consts: dict, outs: list) -> str:
    """Registers a fold (the Graph IR steps from its sources to each of `outs`, (id, dtype, shape)); returns the key
    the op is called with."""
    with _LOCK:
        key = f"f{next(_COUNTER)}"
        _FOLDS[key] = _Fold(list(labels), list(steps), list(sources), dict(consts),
                            [(int(i), dt, tuple(sh)) for i, dt, sh in outs])
    return key


def _where(xs) -> tuple:
    return tuple((x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device) for x in xs)


def _version(x: torch.Tensor) -> int:
    """x's version counter; -1 for an inference tensor, which has none (its in-place writes are not seen)."""
    return -1 if x.is_inference() else x._version


def _prune(key: str | None = None, xs=()) -> None:
    """Drops the values that cannot be read again: those with a source gone (a deleted model's), and those of fold
    `key` computed from the very tensors xs at another address or shape (`p.data = new` moved a parameter). Under
    _LOCK."""
    for k, d in _CACHE.items():
        for where in [w for w, c in d.items() if any(r() is None for r in c.sources) or
                      (k == key and all(r() is x for r, x in zip(c.sources, xs)))]:
            del d[where]


def _compute(f: _Fold, xs) -> list:
    env = dict(f.consts)
    env.update(zip(f.sources, xs))
    for gid, spec, ins in f.steps:
        env[gid] = ops.eval_graph_node(spec, *[env[i] for i in ins])
    return [env[i].to(dt).reshape(sh) for i, dt, sh in f.outs]


def _fill(key: str, xs) -> list:
    """The fold's values for sources xs: the cached ones, or computed (into the cached memory where they fit)."""
    f = _FOLDS[key]
    where, versions = _where(xs), tuple(_version(x) for x in xs)
    with _LOCK:
        c = _CACHE.setdefault(key, {}).get(where)
        if c is not None and c.versions == versions and all(r() is x for r, x in zip(c.sources, xs)):
            return c.values
        if c is None:
            _prune(key, xs)
    if any(x.is_cuda for x in xs) and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"comfuse: the folded weights {', '.join(f.labels)} must be computed again (a parameter "
                           f"they are folded from changed, or is new) while a CUDA graph is being captured; call "
                           f"comfuse.refold() before capturing")
    t0 = time.perf_counter()
    with torch.no_grad():
        vs = _compute(f, xs)
        if c is not None:   # into the same memory
            for j, (old, v) in enumerate(zip(c.values, vs)):
                if old.shape == v.shape and old.dtype == v.dtype and old.device == v.device:
                    with torch.inference_mode(old.is_inference()):   # (one made under inference mode is written there)
                        old.copy_(v)
                    vs[j] = old
        for v in vs:
            if v.is_cuda:
                torch.cuda.synchronize(v.device)
                break
    ms = (time.perf_counter() - t0) * 1e3
    with _LOCK:
        _CACHE[key][where] = _Cached(versions, vs, [weakref.ref(x) for x in xs], ms)
    log.info("comfuse: folded %s (%s, %.1f MB) in %.1f ms%s", ", ".join(f.labels),
             ", ".join(f"{str(v.dtype).split('.')[-1]} {list(v.shape)}" for v in vs),
             sum(v.numel() * v.element_size() for v in vs) / 2**20, ms,
             "" if c is None else " (again: a source changed)")
    return vs


def _run_fold(key: str, sources: list[torch.Tensor]) -> list[torch.Tensor]:
    return _fill(key, sources)


def fold_direct(key: str, sources: list) -> list:
    """What Inductor's Python wrapper calls for the op (inductor.py): the value itself where every source is a plain
    tensor or parameter, else the op (a fake tensor, a subclass: the dispatcher's business)."""
    if all(type(x) in (torch.Tensor, torch.nn.Parameter) for x in sources):
        global _direct_calls
        _direct_calls += 1
        return _fill(key, sources)
    return torch.ops.comfuse.fold.default(key, sources)


def _fold_fake(key: str, sources: list[torch.Tensor]) -> list[torch.Tensor]:
    return [sources[0].new_empty(sh, dtype=dt) for _, dt, sh in _FOLDS[key].outs]


_LIB = torch.library.Library("comfuse", "FRAGMENT")
_LIB.define("fold(str key, Tensor[] sources) -> Tensor[]")
_LIB.impl("fold", _run_fold, "CPU")
_LIB.impl("fold", _run_fold, "CUDA")
torch.library.register_fake("comfuse::fold", _fold_fake, lib=_LIB)


def refold() -> int:
    """Computes every folded weight again from its sources, in place: after a write through `.data`, or after
    changing parameters in place under CUDA graphs. Returns how many values were computed (those whose sources are
    gone are dropped)."""
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
        done += len(_fill(key, xs))
    return done


def stats() -> dict:
    """The folded weights this process holds: how many values, their bytes, the time their last computations took,
    and the calls the direct entry served so far."""
    with _LOCK:
        _prune()
        cs = [c for d in _CACHE.values() for c in d.values()]
    return {"folds": sum(len(c.values) for c in cs),
            "bytes": sum(v.numel() * v.element_size() for c in cs for v in c.values),
            "ms": sum(c.ms for c in cs), "direct_calls": _direct_calls}


def subgraph(prog, gids: list) -> tuple[list, list, dict]:
    """The Graph IR steps that compute the values `gids` from graph inputs: (steps in topological order, the input
    ids they read, the constants they read)."""
    need, stack = set(), list(gids)
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

