"""ComFuse: fuses post-GEMM epilogues (bias, activations, residuals, LayerNorm/RMSNorm/Softmax) into Hopper
GEMM kernels.

    import torch, comfuse
    model = torch.compile(model.eval(), backend="comfuse")   # the backend is found by name, no import needed
    model = torch.compile(model.eval(), backend="comfuse", mode="max-autotune-no-cudagraphs")   # Inductor's mode
    comfuse.enable_inductor_pass()                            # or: inside backend="inductor"
    comfuse.explain(model, x)                                 # what would be fused, and why not

`comfuse._core` is the compiler core (Graph IR builder, partition, Phi, CPU reference interpreters). The torch
parts (capture, convert, program, backend, explain) import torch lazily, so `import comfuse` is cheap.
"""
from . import _core
from ._core import DType, Graph, OpKind, interpret_graph, interpret_partitioned, interpret_spec, parse_cf, partition

__version__ = "0.1.0"


def explain(model, *example_inputs, **kwargs):
    from .report import explain as _explain

    return _explain(model, *example_inputs, **kwargs)


def refold() -> int:
    """Computes every folded weight of the deferred norms again, in place, from the parameters it was folded from:
    after a write through `.data`, or after changing parameters in place under CUDA graphs (docs/pytorch.md,
    "Norms finished in the GEMMs that read them"). Returns how many were computed."""
    from .folds import refold as _refold

    return _refold()


def fold_stats() -> dict:
    """The folded weights this process holds: {"folds": count, "bytes": their memory, "ms": their computation}."""
    from .folds import stats as _stats

    return _stats()


def enable_inductor_pass(fuse: str = "planner"):
    """Opt in from backend="inductor": every later torch.compile(model, ...) runs ComFuse's post-grad pass
    (see comfuse.inductor.enable_inductor_pass). Returns the pass."""
    from .inductor import enable_inductor_pass as _enable

    return _enable(fuse)


def disable_inductor_pass() -> None:
    from .inductor import disable_inductor_pass as _disable

    _disable()


def compile_backend(mode: str | None = None, fuse: str = "planner", inductor: dict | None = None, **options):
    """The `comfuse` backend with Inductor's mode and options and ComFuse's own in one call:
    torch.compile(model, backend=comfuse.compile_backend(mode="reduce-overhead", fuse="all"))."""
    from .backend import compile_backend as _cb

    return _cb(mode=mode, fuse=fuse, inductor=inductor, **options)


def capture(model, *example_inputs, dynamic: bool | None = None, drop_masks: bool = False, **example_kwargs) -> list:
    """Captures `model` with Dynamo on `example_inputs` / `example_kwargs` (under torch.no_grad()) and analyzes each
    graph: a list of backend.GraphReport, each with `.analysis` (conversion, partition, program), `.gm` and
    `.example_inputs` (the Dynamo graph and its inputs, parameters included, in placeholder order). `dynamic` goes
    to torch.compile. With `drop_masks`, the attention masks computed from constants are first made what the
    backend makes them (masks.py; on the meta device too): the graphs, and so the regions, the backend fuses."""
    import torch

    from . import masks
    from .backend import analyze_graph

    reports = []

    def collect(gm, ex):
        if drop_masks:
            masks.drop_trivial_masks(gm)
        rep = analyze_graph(gm, ex, index=len(reports))
        rep.gm, rep.example_inputs = gm, list(ex)
        reports.append(rep)
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=collect, dynamic=dynamic)(*example_inputs, **example_kwargs)
    return reports


__all__ = ["DType", "Graph", "OpKind", "capture", "compile_backend", "disable_inductor_pass", "enable_inductor_pass",
           "explain", "fold_stats", "interpret_graph", "interpret_partitioned", "refold",
           "interpret_spec", "parse_cf", "partition"]
