"""ComFuse inside TorchInductor: the fused-region replacement as an Inductor post-grad graph pass.

Inductor traces the graph once (AOTAutograd, with ComFuse's decomposition table when the `comfuse` backend
drives it, so GELU, SiLU and the GEMMs arrive whole), runs its own post-grad passes, then calls `ComFusePass` on
the inference ATen graph. The pass analyzes that graph (convert, partition, plan), decides per region, and
replaces each region it fuses with one `comfuse::fused_region` call; every other node stays as it was, in its
own dtype, and Inductor compiles it with the user's mode and options (max-autotune, reduce-overhead, ...).

    torch.compile(model, backend="comfuse", mode="max-autotune-no-cudagraphs")      # the backend
    comfuse.enable_inductor_pass()                                                   # or inside backend="inductor"
    torch.compile(model, mode="reduce-overhead")

The pass never fails a compile: anything unexpected leaves the graph as it was, with a warning.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import operator
import os
import uuid as _uuid

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from . import _core as C
from . import analysis, folds, fuse, inductor_options, ops, program
from .program import NotKeepable

log = logging.getLogger("comfuse")

# The regions a rewritten graph calls are registered in this process (ops._REGIONS): an Inductor FX-graph-cache
# entry written here must not be loaded by another process, so the pass's uuid carries this token.
_PROCESS_TOKEN = _uuid.uuid4().hex
_REPORTS: list = []   # every GraphReport the passes of this process made (reports(), reset_reports())


def reports() -> list:
    """The GraphReports of every graph a ComFusePass saw in this process since reset_reports(), in order; each
    has `.fused` (the region indices that became comfuse::fused_region calls) and `.plans`."""
    return list(_REPORTS)


def reset_reports() -> None:
    _REPORTS.clear()


@functools.lru_cache(maxsize=1)
def _library_fingerprint() -> str:
    """What changes the pass's output for the same graph: the library version and the compiled core (which holds
    the planner's measured table, src/plan/measured.csv), and where the kernel headers come from."""
    from . import __version__   # (the package's own metadata)

    h = hashlib.sha256(__version__.encode())
    with open(C.__file__, "rb") as f:
        h.update(f.read())
    h.update(os.environ.get("COMFUSE_KERNEL_DIR", "").encode())
    return h.hexdigest()


class ComFusePass(CustomGraphPass):
    """The post-grad pass. `fuse`: "planner" (regions the planner expects to win) or "all" (also those it
    declines for speed only). `reference`: on CPU tensors, fuse every region through the custom op's CPU
    reference implementation (to check the pass end to end without a GPU). `ctas`: column blocks per row in
    the reference implementation. `reports` collects each graph's GraphReport (with `.fused`, the regions
    that became ComFuse calls)."""

    def __init__(self, fuse: str = "planner", reference: bool = False, ctas: int = 1, defer_norms=False,
                 parameters=(), inputs: int | None = None):
        if fuse not in ("planner", "all"):
            raise ValueError(f"comfuse: fuse must be 'planner' or 'all', got {fuse!r}")
        self.fuse, self.reference, self.ctas = fuse, bool(reference), int(ctas)
        # Norms finished in their GEMM readers (`defer_norms`), whose weights are the graph inputs at `parameters`
        # (the positions of the model's parameters among its `inputs` inputs: the backend knows them, the opt-in
        # does not)
        self.defer_norms, self.parameters = program.defer_setting(defer_norms), tuple(parameters)
        self.inputs = inputs
        self.reports: list = []

    def uuid(self):
        return hashlib.sha256(f"{_library_fingerprint()}|{self.fuse}|{self.reference}|{self.ctas}|{self.defer_norms}|"
                              f"{self.parameters}|{self.inputs}|{_PROCESS_TOKEN}".encode()).hexdigest()

    def __call__(self, graph: fx.Graph) -> None:
        try:
            self._run(graph)
        except Exception as e:   # fallback, never failure
            log.warning("comfuse: the post-grad pass left a graph unchanged (%s: %s)", type(e).__name__, e)
        # ops ComFuse's decomposition table kept whole (GELU, SiLU) that are still here: Inductor's form (without
        # it Inductor cannot lower them, so a failure here is not swallowed)
        decompose_leftovers(graph)

    # ---------------------------------------------------------------------------------------------------
    def _run(self, graph: fx.Graph) -> None:
        gm = graph.owning_module
        rep = analysis.GraphReport(next(analysis._GRAPH_IDS))
        rep.fused = set()
        self.reports.append(rep)
        _REPORTS.append(rep)
        if _is_training_graph():
            rep.fallback = ("training graph (AOTAutograd forward/backward): ComFuse compiles inference graphs; "
                            "run the model under torch.no_grad() or torch.inference_mode()")
            analysis.log_report(rep)
            return
        fold_erf_gelu(graph)   # (opt-in from backend="inductor": GELU arrives decomposed)
        vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
        sym = [f"input {i}" for i, v in enumerate(vals) if isinstance(v, torch.SymInt) or (
            isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape))]
        analysis.analyze_aten(rep, gm, vals, self.fuse == "all", sym, self.defer_norms, self.parameters, self.inputs)
        cpu_reference = (self.reference and (rep.regions or analysis.fused_chains(rep, self.fuse == "all"))
                         and rep.fallback is not None and rep.fallback.startswith("CPU tensors"))
        if cpu_reference:
            rep.fallback = None
        analysis.log_report(rep)
        if rep.fallback:
            return
        try:
            done = fuse.fuse_graph(rep, self.ctas, self.fuse == "all", "keep", cpu_reference=cpu_reference,
                                   ir_fallback=False)
        except NotKeepable as e:
            log.info("comfuse: graph %d runs without ComFuse kernels: its fused regions do not line up with "
                     "whole ATen nodes (%s)", rep.index, e)
            return
        if done is None:
            log.info("comfuse: graph %d runs without ComFuse kernels: its kernels could not be prepared, or every "
                     "planned region was slower on this GPU than its GEMM and a separate pass", rep.index)
            return
        target, fused, chains = done.target, done.fuse, done.chains
        _replace_graph(graph, target.graph)
        rep.fused = fused
        rep.fused_chains = chains
        log.info("comfuse: graph %d: %d region(s)%s run as ComFuse kernels%s", rep.index, len(fused),
                 f" and {len(chains)} back-to-back chain(s)" if chains else "",
                 " (CPU reference implementation)" if cpu_reference else "")


def _const_operand(n, value: float, tol: float = 1e-6):
    """The other operand of a binary mul/add `n` whose one operand is the scalar `value` (None if not so)."""
    if not (isinstance(n, fx.Node) and n.op == "call_function" and len(n.args) == 2):
        return None
    a, b = n.args
    if isinstance(b, (int, float)) and not isinstance(b, bool) and abs(b - value) <= tol * max(1.0, abs(value)):
        return a
    if isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a - value) <= tol * max(1.0, abs(value)):
        return b
    return None


def fold_erf_gelu(graph: fx.Graph) -> int:
    """Finds GELU as Inductor's decomposition writes it, x * 0.5 * (1 + erf(x * 1/sqrt(2))), and puts one
    aten.gelu node in its place, so that the Graph IR (which has GELU but no erf) can fuse it: the opt-in from
    backend="inductor" sees GELU only decomposed. Where its region is not fused, decompose_leftovers writes it
    back as Inductor's decomposition. Returns how many were folded."""
    aten = torch.ops.aten
    muls = (aten.mul.Tensor, aten.mul.Scalar)
    adds = (aten.add.Tensor, aten.add.Scalar)
    folded = 0
    for m in list(graph.nodes):
        if m.op != "call_function" or m.target not in muls or len(m.args) != 2:
            continue
        for half, one_plus in (m.args, m.args[::-1]):
            if not (isinstance(half, fx.Node) and isinstance(one_plus, fx.Node)):
                continue
            if half.target not in muls or one_plus.target not in adds:
                continue
            x = _const_operand(half, 0.5)
            erf = _const_operand(one_plus, 1.0)
            if x is None or not isinstance(erf, fx.Node) or erf.target != aten.erf.default:
                continue
            if _const_operand(erf.args[0], 0.7071067811865476) is not x or erf.args[0].target not in muls:
                continue
            with graph.inserting_before(m):
                g = graph.call_function(aten.gelu.default, (x,))
            g.meta["val"] = m.meta.get("val")
            m.replace_all_uses_with(g)
            graph.erase_node(m)
            folded += 1
            break
    if folded:
        graph.eliminate_dead_code()
    return folded


def decompose_leftovers(graph: fx.Graph) -> int:
    """Decomposes, in place, the nodes Inductor has no lowering for because ComFuse's decomposition table
    (tracing.decomposition_table) kept them whole for the Graph IR: GELU and SiLU outside fused regions get
    Inductor's own decomposition, as without ComFuse. Returns how many were decomposed."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings
    from torch.fx.experimental.proxy_tensor import make_fx

    table = select_decomp_table()
    todo = [n for n in graph.nodes if n.op == "call_function" and n.target in table and n.target not in lowerings]
    if not todo:
        return 0
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    for n in todo:
        tensor_args = [a for a in n.args if isinstance(a, fx.Node)]
        if len(tensor_args) != len(n.args) and not all(isinstance(a, fx.Node) for a in n.args[:len(tensor_args)]):
            continue
        consts, kwargs, target = n.args[len(tensor_args):], dict(n.kwargs), n.target

        def fn(*xs, _t=target, _c=consts, _k=kwargs):
            return table[_t](*xs, *_c, **_k)

        with fake_mode if fake_mode is not None else _nullcontext():
            sub = make_fx(fn, table)(*[a.meta["val"] for a in tensor_args])
        env = dict(zip([p for p in sub.graph.nodes if p.op == "placeholder"], tensor_args))
        result = None
        with graph.inserting_before(n):
            for s in sub.graph.nodes:
                if s.op == "placeholder":
                    continue
                if s.op == "output":
                    result = env[s.args[0]] if isinstance(s.args[0], fx.Node) else None
                    continue
                if s.op == "get_attr":
                    raise AssertionError(f"comfuse: the decomposition of {target} reads a constant")
                env[s] = graph.node_copy(s, lambda a: env[a])
        if result is None:
            raise AssertionError(f"comfuse: the decomposition of {target} has no single tensor result")
        n.replace_all_uses_with(result)
        graph.erase_node(n)
    return len(todo)


def _is_training_graph() -> bool:
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    return bool(getattr(meta, "is_train", False))


def _fill_fake_values(g: fx.Graph, fake_mode) -> None:
    """Gives each call node of `g` without one a fake value (for fused_region: its fake implementation), as
    Inductor's lowering reads node.meta["val"]; the ComFuse calls also get the input strides they need."""
    for n in g.nodes:
        if n.op != "call_function" or "val" in n.meta:
            continue
        args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["val"])
        if n.target is operator.getitem:
            n.meta["val"] = args[0][args[1]]
            continue
        with fake_mode if fake_mode is not None else _nullcontext():
            n.meta["val"] = n.target(*args, **kwargs)
            if n.target in (torch.ops.comfuse.fused_region.default, torch.ops.comfuse.fused_chain.default):
                # The strides the kernel needs: dense inputs. Inductor holds a custom op's inputs to the strides
                # in eager_input_vals, and to none for an op a pass inserted without them: it then picks their
                # layouts freely (HF Llama's rotary tables came transposed, and every call went through Python).
                n.meta["eager_input_vals"] = ((args[0], [t.contiguous() for t in args[1]]), {})


def _replace_graph(graph: fx.Graph, new: fx.Graph) -> None:
    """Makes `graph` compute what `new` computes, in place (Inductor's later passes hold `graph`): `new`'s nodes
    get their fake values first (so a failure leaves `graph` untouched), then are copied in before the output,
    the output is pointed at them, and the old nodes left unused are removed. Placeholders correspond one to
    one, in order."""
    old_phs = [n for n in graph.nodes if n.op == "placeholder"]
    new_phs = [n for n in new.nodes if n.op == "placeholder"]
    if [n.name for n in old_phs] != [n.name for n in new_phs]:
        raise AssertionError("comfuse: the rewritten graph's placeholders differ")
    for o, n in zip(old_phs, new_phs):
        if "val" in o.meta:
            n.meta["val"] = o.meta["val"]
    _fill_fake_values(new, torch._guards.detect_fake_mode([n.meta.get("val") for n in old_phs]))
    env = dict(zip(new_phs, old_phs))
    out = graph.output_node()
    result = None
    with graph.inserting_before(out):
        for n in new.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                result = fx.node.map_arg(n.args[0], lambda a: env[a])
                continue
            env[n] = graph.node_copy(n, lambda a: env[a])
    out.args = (result,)
    graph.eliminate_dead_code()
    graph.lint()


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def inductor_config(fuse: str = "planner", reference: bool = False, ctas: int = 1, mode: str | None = None,
                    options: dict | None = None, defer_norms=False, parameters=(),
                    inputs: int | None = None) -> dict:
    """The Inductor config patches for one compile with ComFuse: the mode's options (torch._inductor's
    list_mode_options), the user's Inductor options, and ComFusePass as the post-grad custom pass."""
    return inductor_options.patches(mode, options, ComFusePass(fuse=fuse, reference=reference, ctas=ctas,
                                                               defer_norms=defer_norms, parameters=parameters,
                                                               inputs=inputs))


def enable_inductor_pass(fuse: str = "planner") -> ComFusePass:
    """Opt in from backend="inductor": installs ComFusePass as Inductor's post-grad custom pass (process-wide,
    torch._inductor.config.post_grad_custom_post_pass), so every later torch.compile(model) - any mode - fuses
    the regions ComFuse serves. Returns the pass (its `.reports` say what each graph did). Inductor's own
    decompositions apply there: GELU arrives decomposed (the pass folds the erf form back into one GELU,
    fold_erf_gelu; the tanh form fuses as the elementwise chain it is). Undo with disable_inductor_pass()."""
    p = ComFusePass(fuse=fuse)
    torch._inductor.config.post_grad_custom_post_pass = p
    return p


def disable_inductor_pass() -> None:
    if isinstance(torch._inductor.config.post_grad_custom_post_pass, ComFusePass):
        torch._inductor.config.post_grad_custom_post_pass = None


# ---- The calls in Inductor's code -------------------------------------------------------------------------------
# A fused region is one comfuse::fused_region node, which Inductor keeps as a fallback kernel: by default its
# Python wrapper calls torch.ops.comfuse.fused_region.default(key, [...]), i.e. the dispatcher's trip from Python
# (2.7-4.4 us of a ~10 us call on the H200 machine). Inductor's registry of custom fallback codegen
# (torch 2.11: codegen/custom_extern_kernel_codegen.py) lets the Python wrapper call the op's direct entry
# instead, ops.fused_region_direct (the same C++ kernel, without the dispatcher; it hands any call the dispatcher
# would treat specially back to the op), reached as extern_kernels.comfuse_fused_region like Inductor's own
# extern kernels. The C++ and FX wrappers keep the op. Where the registry is absent, nothing changes. A folded
# weight's op (folds.py) has a Python direct entry: its cached value without the dispatcher (~2.7 us a call against
# ~5.6 on the build machine).
_DIRECT_NAMES = {"fused_region": ("comfuse_fused_region", ops.fused_region_direct),
                 "fused_chain": ("comfuse_fused_chain", ops.fused_chain_direct),
                 "fold": ("comfuse_fold", folds.fold_direct)}


def _direct_codegen(name: str):
    def codegen(node, writeline) -> None:
        from torch._inductor.virtualized import V

        w = V.graph.wrapper_code
        if V.graph.cpp_wrapper or getattr(V.graph, "fx_wrapper", False):
            from torch._inductor.codegen.wrapper import ExternKernelAllocLine

            writeline(ExternKernelAllocLine(w, node))   # the op, as without this hook
            return
        args = ", ".join([*node.codegen_args(), *node.codegen_kwargs()])
        writeline(f"{w.declare}{node.get_name()} = extern_kernels.{name}({args}){w.ending}")
    return codegen


def _route_to_direct_entries() -> bool:
    """Makes Inductor's Python wrapper call the direct entries (above); False where this torch has no registry
    (Inductor's code then calls the ops, as before)."""
    try:
        from torch._inductor.codegen.custom_extern_kernel_codegen import (CUSTOM_EXTERN_KERNEL_CODEGEN,
                                                                           CustomCodegen)
        from torch._inductor.select_algorithm import extern_kernels

    except ImportError as e:
        log.info("comfuse: Inductor's code calls the ops through the dispatcher (%s)", e)
        return False
    for op_name, (name, entry) in _DIRECT_NAMES.items():
        setattr(extern_kernels, name, entry)
        codegen = CustomCodegen(python=_direct_codegen(name))
        CUSTOM_EXTERN_KERNEL_CODEGEN[f"torch.ops.comfuse.{op_name}.default"] = codegen
    return True


DIRECT_CALLS = _route_to_direct_entries()
