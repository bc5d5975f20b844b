"""Which attention a model's forward runs, eager and under Inductor: the SDPA backend eager dispatches to, the attention
ops left in Inductor's post-grad graph (a fused SDPA op, or its decomposition into matmuls and softmax), and the GPU
kernels of one compiled forward whose names say attention or fp32 GEMM. Finds the node Inductor decomposes (ViT: its
attention runs as fp32 GEMMs under torch.compile, docs/log/2026-12-06.md).

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


def traced_choices(model, kwargs) -> list:
    """The SDPA kernel tracing picks for each call of the Dynamo graph (comfuse.ops.sdpa_choice on the fake
    example values: what attention="auto" reads), as (q shape, q stride, choice)."""
    from comfuse import ops

    found = []

    def backend(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target in ops._SDPA_TARGETS:
                q = n.args[0].meta.get("example_value") if isinstance(n.args[0], torch.fx.Node) else None
                found.append((tuple(q.shape) if q is not None else "?", tuple(q.stride()) if q is not None else "?",
                              ops.sdpa_choice(n)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(**kwargs)
    torch._dynamo.reset()
    return found


def sdpa_inputs_seen(model, kwargs) -> list:
    """The (shape, stride, dtype) of each SDPA call of one eager forward, and the backend eager's dispatcher picks."""
    seen = []
    orig = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
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
        traced = traced_choices(model, kwargs)
        for shape, stride, choice in sorted(set(traced), key=str):
            print(f"  traced SDPA call (Dynamo's fake tensors): q {shape} stride {stride} backend={choice} "
                  f"(x{traced.count((shape, stride, choice))})")
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
