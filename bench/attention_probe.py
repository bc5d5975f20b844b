"""Which attention a model's forward runs, eager and under Inductor: the SDPA backend eager dispatches to, the tensors
(layout, mask) an opaque SDPA op receives inside Inductor's compiled graph and which fused kernels accept them (PyTorch's
own eligibility checks, eager's first call beside), the attention ops left in Inductor's post-grad graph (a fused SDPA
op, or its decomposition into matmuls and softmax), and the GPU kernels of one compiled forward whose names say
attention or fp32 GEMM. It found why ViT's attention runs as fp32 GEMMs under torch.compile: a mask eager does not
have (docs/log/2026-12-06.md, run e).

    python3 bench/attention_probe.py [--models vit,gpt2] [--cpu-smoke]

Uses bench/hf_models_bench.py's model builders (Hugging Face configs, random weights, bf16). Prints one block per model.
"""
import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models_bench as hmb  # noqa: E402

ATTN_OPS = re.compile(r"aten\.(_scaled_dot_product_\w+|scaled_dot_product_\w+|_softmax|softmax|bmm|baddbmm)\.\w+")


def post_grad_ops(model, kwargs) -> tuple[dict, str]:
    """Attention-related aten ops in Inductor's post-grad graphs of one compile (counts), and the first SDPA node."""
    from torch._inductor import config as ic
    from torch._inductor.custom_graph_pass import CustomGraphPass

    counts: dict = {}
    first = [""]

    class Count(CustomGraphPass):
        def __call__(self, graph):
            for n in graph.nodes:
                if n.op == "call_function" and ATTN_OPS.fullmatch(str(n.target).replace("aten::", "aten.")):
                    k = str(n.target)
                    counts[k] = counts.get(k, 0) + 1
                    if "scaled_dot_product" in k and not first[0]:
                        first[0] = f"{n.format_node()}"

        def uuid(self):
            return None   # (no caching of what this pass saw)

    saved = (ic.post_grad_custom_post_pass, ic.fx_graph_cache)
    ic.post_grad_custom_post_pass, ic.fx_graph_cache = Count(), False
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(**kwargs)
    finally:
        ic.post_grad_custom_post_pass, ic.fx_graph_cache = saved
    return counts, first[0]


def eligibility(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> str:
    """Which fused SDPA kernels PyTorch would take these tensors to, each with the reason it gives when not
    (torch.backends.cuda.can_use_*(..., debug=True) warns it), and the choice itself."""
    import warnings

    out = [f"{tuple(q.shape)} {q.dtype} strides q{tuple(q.stride())} k{tuple(k.stride())} v{tuple(v.stride())} "
           f"offsets {q.storage_offset()}/{k.storage_offset()}/{v.storage_offset()} "
           f"ptr%16 {q.data_ptr() % 16}/{k.data_ptr() % 16}/{v.data_ptr() % 16} mask={attn_mask is not None} "
           f"causal={is_causal} dropout={dropout_p} "
           f"choice={torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)}"]
    params = torch.backends.cuda.SDPAParams(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa)
    for name in ("flash", "efficient", "cudnn"):
        fn = getattr(torch.backends.cuda, f"can_use_{name}_attention", None)
        if fn is None:
            continue
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                ok = fn(params, True)
            except RuntimeError as e:   # (cuDNN's check needs a GPU)
                ok = f"? ({str(e)[:80]})"
        out.append(f"    {name}: {ok}" + ("" if ok else " - " + "; ".join(str(x.message)[:160] for x in w)))
    return "\n".join(out)


def inside_graph(model, kwargs) -> list:
    """The tensors an opaque SDPA op receives inside Inductor's compiled graph (each SDPA call of the Dynamo graph
    replaced by probe::sdpa, which records them and runs F.scaled_dot_product_attention), with eligibility()."""
    seen = []

    @torch.library.custom_op("probe::sdpa", mutates_args=())
    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
            dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
            enable_gqa: bool = False) -> torch.Tensor:
        if len(seen) < 2:
            seen.append(eligibility(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa))
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
            enable_gqa=enable_gqa).contiguous()

    @spy.register_fake
    def _(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return q.new_empty(list(q.shape[:-1]) + [v.shape[-1]])

    from comfuse import masks
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target in masks.SDPA_TARGETS:
                n.target = torch.ops.probe.sdpa.default
        gm.recompile()
        return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(**kwargs)
    torch._dynamo.reset()
    return seen


def sdpa_inputs_seen(model, kwargs) -> list:
    """The (shape, stride, dtype) of each SDPA call of one eager forward, and the backend eager's dispatcher picks."""
    seen = []
    orig = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        if len(seen) == 0 and q.is_cuda:
            print("  eager, first call: " + eligibility(q, k, v, *a, **kw))
        try:
            choice = torch._fused_sdp_choice(q, k, v, *a, **kw)
        except Exception as e:  # (an older torch without the probe)
            choice = f"? ({type(e).__name__})"
        seen.append((tuple(q.shape), tuple(q.stride()), str(q.dtype), kw.get("attn_mask") is not None or
                     (len(a) > 0 and a[0] is not None), choice))
        return orig(q, k, v, *a, **kw)

    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        with torch.no_grad():
            model(**kwargs)
    finally:
        torch.nn.functional.scaled_dot_product_attention = orig
    return seen


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="vit,gpt2")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny configs on the CPU (no kernels)")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    device = "cuda" if cuda else "cpu"
    for name in args.models.split(","):
        model, kwargs = hmb.build(name, device, tiny=not cuda)
        print(f"== {name} on {device}")
        impl = getattr(getattr(model, "config", None), "_attn_implementation", "?")
        print(f"  attention implementation (transformers): {impl}")
        seen = sdpa_inputs_seen(model, kwargs)
        for shape, stride, dtype, masked, choice in sorted(set(seen)):
            print(f"  eager SDPA call: q {shape} stride {stride} {dtype} mask={masked} backend={choice} "
                  f"(x{seen.count((shape, stride, dtype, masked, choice))})")
        if not seen:
            print("  eager: no scaled_dot_product_attention call (the model computes attention itself)")
        if cuda:
            for text in inside_graph(model, kwargs):
                print("  inside Inductor's graph (an opaque SDPA op's inputs): " + text)
        counts, node = post_grad_ops(model, kwargs)
        print("  Inductor post-grad graph, attention ops: " +
              (", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"))
        if node:
            print("    " + node[:220])
        if cuda:
            compiled = torch.compile(model)   # (compiled once: the profiled calls run the cached graph)

            def forward():
                with torch.no_grad():
                    return compiled(**kwargs)

            forward()
            _, summary, _ = hmb.kernels(forward, cuda, label=name)
            print(f"  compiled forward's kernels: {summary[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
