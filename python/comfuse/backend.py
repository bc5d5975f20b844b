"""The torch.compile backend `comfuse` (registered through the `torch_dynamo_backends` entry point).

    model = torch.compile(model, backend="comfuse")

For each graph Dynamo captures: decide whether ComFuse kernels may be used at all (inference, a Hopper GPU,
bf16/f16 GEMMs); capture the inference ATen graph, convert it to the Graph IR, partition it, and
log (INFO, logger "comfuse") the regions that become ComFuse kernels. On CUDA inputs of an sm_90 GPU, the regions
the planner fuses become `comfuse::fused_region` calls (`Program.rewrite_keeping_torch`: every other ATen node is
kept as it was), each compiled by the JIT before the graph runs, and TorchInductor compiles the rest of the graph
around them. Any graph that cannot use ComFuse
kernels - or whose kernels fail to compile - runs through TorchInductor (or eager) unchanged; the log says why.

Dynamic shapes: when Dynamo makes the batch dim symbolic (a second batch size, dynamic=True, mark_dynamic), the
graph is analyzed at its example sizes and the kernels take the rows M at launch, so every later batch size
runs the same compiled kernels (no nvcc, no new graph). Nodes with a symbolic size in another dim (e.g. a
dynamic sequence length inside attention) stay in torch, with that reason in the log and in `explain`.

Options (torch.compile(..., options={...})):
  fallback   "inductor" (default) or "eager": what runs the graph
  reference  True: on CPU tensors, run the rewritten graph with the CPU reference implementation of
             `comfuse::fused_region` (slow; checks capture, conversion and rewrite end to end)
  ctas       column blocks per row in the reference implementation (default 1)
  fuse       "planner" (default): the regions the planner expects to be faster fused; "all": also those it
             declines for speed only (to measure them; regions no kernel can serve still run unfused)
  defer_norms  True: each LayerNorm / RMSNorm finished in the GEMMs that read it, the norm's weights folded into
             theirs (the model's parameters only; comfuse.refold() after changing them through .data); "auto":
             only the sites whose deferral the planner estimates faster (explain() gives both estimates)
  rewrite    how the nodes outside fused regions are written: "keep" (default on the GPU) copies the ATen
             nodes as they were, so a bf16 model stays bf16 there (falls back to "ir" where a region does
             not line up with whole ATen nodes, logged); "ir" (default with `reference`) re-emits the Graph
             IR's nodes in fp32, the semantics the CPU checks compare against
"""
from __future__ import annotations

import logging

import torch
import torch._inductor.compile_fx as inductor_compile   # (looked up at each call: tests and users may wrap it)

from . import masks, ops, program, tracing
from .analysis import (GraphReport, _GRAPH_IDS, _gemm_targets, _rewrite, _tensors, analyze_aten,  # noqa: F401
                       analyze_graph, chain_regions, device_reason, dtype_reason, fused_chains, fused_set,
                       is_near_tie, keep_rewrite, log_plans, log_report, near_ties, parameter_positions, planned,
                       precheck, prepare_kernels, shapeable, NEAR_TIE)
from .fuse import count_chains, fuse_graph
from .inductor import inductor_config
from .measure import (HOST_US_PER_CALL, HOST_US_PER_CALL_FAST, MEASURE_MARGIN, drop_measured_losers,  # noqa: F401
                      host_us_per_call, measure_fused, measuring, probe_lead, time_region_on_gpu)

log = logging.getLogger("comfuse")

# (the names above are this module's for the code that calls them as backend.<name>; the decisions live in
# analysis.py, the GPU timing in measure.py, the shared pipeline in fuse.py)


def _with_kernels(rep: GraphReport, gm, ctas: int, fuse_all: bool = False, how: str = "keep", graphed: bool = False):
    """The rewritten graph with the planner's fused regions (with `fuse_all`, also those declined for speed only) as
    comfuse::fused_region calls, their kernels compiled now (fuse_graph); `gm` on failure."""
    try:
        done = fuse_graph(rep, ctas, fuse_all, how, host_us=host_us_per_call(graphed))
    except Exception as e:   # fallback, never failure
        log.warning("comfuse: graph %d: ComFuse kernels could not be prepared (%s: %s); running it without them",
                    rep.index, type(e).__name__, e)
        return gm
    if done is None:
        return gm
    n = count_chains(done.target)
    log.info("comfuse: graph %d: %d region(s)%s run as ComFuse kernels", rep.index, len(done.fuse),
             f" and {n} back-to-back chain(s)" if n else "")
    return done.target


_COMFUSE_OPTIONS = ("fallback", "reference", "ctas", "fuse", "rewrite", "mode", "inductor", "attention", "defer_norms")


def default_attention(version: str | None = None) -> str:
    """attention="auto": "inductor" from torch 2.11, "eager" before. Tracing picks an SDPA kernel the way eager does;
    with torch 2.11 on the H200, Inductor ran HF BERT (padding mask), the Llama-style model and GPT-2 on cuDNN's
    fused attention kernel, while comfuse::sdpa (a Python custom op, then eager's kernel selection) cost ~150 us of
    host time per call against Inductor's ~11 (docs/log/2026-12-02.md): in default mode, BERT-base ran 0.80x
    Inductor with it. Earlier torch decomposed BERT's masked SDPA into an fp32 math path, which comfuse::sdpa avoids."""
    major, minor = (int(x) for x in (version or torch.__version__).split("+")[0].split(".")[:2])
    return "inductor" if (major, minor) >= (2, 11) else "eager"


def comfuse_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
    """The `comfuse` torch.compile backend. Inductor's mode comes from torch.compile(mode=...) or, since
    torch.compile refuses mode= together with options=, from options={"mode": ...}; Inductor's own options go
    in options={"inductor": {...}}. See docs/pytorch.md."""
    opts = dict(options or {})
    unknown = sorted(set(opts) - set(_COMFUSE_OPTIONS))
    if unknown:
        raise ValueError(f"comfuse backend: unknown options {unknown} (ComFuse's: {list(_COMFUSE_OPTIONS)}; "
                         f"Inductor's go in options={{'inductor': {{...}}}})")
    runner = opts.pop("fallback", "inductor")
    reference = bool(opts.pop("reference", False))
    ctas = int(opts.pop("ctas", 1))
    fuse = opts.pop("fuse", "planner")
    if fuse not in ("planner", "all"):
        raise ValueError(f"comfuse backend: fuse must be 'planner' or 'all', got {fuse!r}")
    how = opts.pop("rewrite", "ir" if reference else "keep")
    if how not in ("keep", "ir"):
        raise ValueError(f"comfuse backend: rewrite must be 'keep' or 'ir', got {how!r}")
    if runner not in ("inductor", "eager"):
        raise ValueError(f"comfuse backend: fallback must be 'inductor' or 'eager', got {runner!r}")
    mode = opts.pop("mode", None) if mode is None else mode
    if "mode" in opts:
        raise ValueError("comfuse backend: Inductor's mode given twice (mode= and options['mode'])")
    if mode not in (None, "default"):
        torch._inductor.list_mode_options(mode)   # raises for an unknown mode, with the list
    inductor_opts = dict(opts.pop("inductor", None) or {})
    if runner == "eager" and (mode not in (None, "default") or inductor_opts):
        raise ValueError("comfuse backend: mode and Inductor options need fallback='inductor'")

    try:
        defer = program.defer_setting(opts.pop("defer_norms", False))
    except ValueError as e:
        raise ValueError(f"comfuse backend: {e}") from None
    attention = opts.pop("attention", "auto")
    if attention not in ("auto", "eager", "inductor"):
        raise ValueError(f"comfuse backend: attention must be 'auto', 'eager' or 'inductor', got {attention!r}")
    if attention == "auto":
        attention = default_attention()
    masks.drop_trivial_masks(gm)   # (an all-True mask would keep SDPA off its fused kernels: masks.py)
    if attention == "eager" and any(t.device.type == "cuda" for t in _tensors(example_inputs)):
        n = ops.keep_sdpa_whole(gm)
        if n:
            log.info("comfuse: %d scaled_dot_product_attention call(s) kept whole (comfuse::sdpa: the kernel eager "
                     "picks)", n)

    if runner == "inductor" and how == "keep":
        return _compile_with_pass(gm, example_inputs, fuse, reference, ctas, mode, inductor_opts, defer)

    # fallback="eager", or the fp32 "ir" rewrite the CPU reference checks use: analyze the Dynamo graph here
    # and hand the rewritten graph to eager or to Inductor.
    subclasses = _subclass_inputs(example_inputs)
    if subclasses:   # AOTAutograd's export takes no tensor subclass; Inductor's own trace unwraps them
        log.warning("comfuse: graph %d: inputs of tensor subclass %s (a tensor-parallel model?): ComFuse fuses such "
                    "graphs inside Inductor's pass only (fallback='inductor', rewrite='keep', the defaults); "
                    "running it with %s", next(_GRAPH_IDS), ", ".join(subclasses), runner)
        if runner == "eager":
            return gm.forward
        patches = inductor_config(mode=mode, options=inductor_opts)
        patches.pop("post_grad_custom_post_pass")
        return inductor_compile.compile_fx(gm, example_inputs, config_patches=patches)
    rep = analyze_graph(gm, example_inputs, fuse_all=fuse == "all", defer=defer)
    if rep.fallback and rep.fallback.startswith("graph needs gradients"):
        log.warning("comfuse: graph %d: %s; running it with %s", rep.index, rep.fallback, runner)
    log_report(rep)

    target = gm
    if rep.fallback is None and not reference:
        graphed = runner == "inductor" and (mode == "reduce-overhead" or
                                            bool((inductor_opts or {}).get("triton.cudagraphs")))
        target = _with_kernels(rep, gm, ctas, fuse == "all", how, graphed)
    elif (reference and rep.analysis is not None and rep.regions and
            all(t.device.type == "cpu" for t in _tensors(example_inputs)) and
            not (rep.fallback or "").startswith("graph needs gradients")):
        try:
            target = _rewrite(rep, shapeable(rep, set(range(len(rep.regions)))), ctas, how)
            log.info("comfuse: graph %d: running %d region(s) through the CPU reference implementation",
                     rep.index, len(rep.regions))
        except Exception as e:   # fallback, never failure
            log.warning("comfuse: graph %d runs without ComFuse kernels: %s: %s", rep.index, type(e).__name__, e)
    if runner == "eager":
        return target.forward
    patches = inductor_config(mode=mode, options=inductor_opts)
    patches.pop("post_grad_custom_post_pass")
    return inductor_compile.compile_fx(target, example_inputs, config_patches=patches)


def _subclass_inputs(example_inputs) -> list[str]:
    """The type names of the inputs that are tensor subclasses AOTAutograd unwraps (DTensor, ...), sorted."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return sorted({type(x).__name__ for x in example_inputs if isinstance(x, torch.Tensor) and
                   is_traceable_wrapper_subclass(x)})


def _compile_with_pass(gm, example_inputs, fuse, reference, ctas, mode, inductor_opts, defer="off"):
    """Inductor compiles the Dynamo graph with the user's mode and options; ComFusePass replaces the fused
    regions in its post-grad graph (one AOT trace). A graph that needs gradients skips the pass; on a device
    ComFuse kernels cannot run on (CPU tensors without `reference`, a GPU other than sm_90), the pass only
    analyzes and logs."""
    why = precheck(gm, example_inputs)
    patches = inductor_config(fuse=fuse, reference=reference, ctas=ctas, mode=mode, options=inductor_opts,
                              defer_norms=defer, parameters=parameter_positions(example_inputs),
                              inputs=len(example_inputs))
    if why:
        log.warning("comfuse: graph %d: %s; running it with Inductor", next(_GRAPH_IDS), why)
        patches.pop("post_grad_custom_post_pass")
        return inductor_compile.compile_fx(gm, example_inputs, config_patches=patches)
    # ComFuse's decompositions: Inductor's, less those that would split what the Graph IR has whole (GELU,
    # SiLU, the GEMMs)
    return inductor_compile.compile_fx(gm, example_inputs, config_patches=patches,
                                       decompositions=tracing.decomposition_table())


def compile_backend(mode: str | None = None, fuse: str = "planner", inductor: dict | None = None, **options):
    """A configured `comfuse` backend, torch.compile(model, backend=comfuse.compile_backend(...)): Inductor's `mode`
    and options (`inductor`), and ComFuse's own (`fuse`, and the rest of comfuse_backend's options) in one call."""
    opts = dict(options, fuse=fuse, mode=mode, inductor=inductor)

    def comfuse_configured(gm, example_inputs):
        return comfuse_backend(gm, example_inputs, options={k: v for k, v in opts.items() if v is not None})

    return comfuse_configured
