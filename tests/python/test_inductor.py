"""ComFuse inside TorchInductor (comfuse/inductor.py): the post-grad pass, Inductor's modes and options through
backend="comfuse", and the opt-in for backend="inductor". CPU only: the pass runs the regions through the custom
op's CPU reference implementation (options reference=True, rewrite="keep")."""
import importlib.util
import logging

import pytest
import torch

import comfuse
from conftest import bf16_randn, messages, rel_err
from models import ClassifierHead, PostNormEncoderLayer, RMSNormMLP


def _bf16(m):
    return m.to(torch.bfloat16).eval()


def test_pass_fuses_inside_inductor_with_one_trace(monkeypatch, caplog):
    """backend="comfuse" on the pass path: Inductor's own AOT trace is the only one (tracing.aten_graph is not
    called), the pass replaces every region with a fused call, Inductor compiles the rest, and the result
    matches eager within bf16 rounding."""
    from comfuse import tracing

    caplog.set_level(logging.INFO, logger="comfuse")
    monkeypatch.setattr(tracing, "aten_graph", lambda *a: pytest.fail("a second trace of the graph"))
    m = _bf16(PostNormEncoderLayer())
    x = bf16_randn(2, 8, 32, seed=80).to(torch.bfloat16)
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep"})(x)
        ref = m(x)
    assert y.dtype == ref.dtype and rel_err(y.float(), ref.float()) <= 2e-2
    assert any("5 region(s) run as ComFuse kernels (CPU reference implementation)" in s for s in messages(caplog))


def test_pass_on_cpu_without_reference_only_analyzes(caplog):
    """On CPU tensors (no reference), the pass analyzes and logs per region but changes nothing; GELU left whole
    by ComFuse's decompositions is decomposed as Inductor would (else Inductor could not lower it)."""
    caplog.set_level(logging.INFO, logger="comfuse")
    m = _bf16(RMSNormMLP())
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse")(x)
        assert rel_err(y.float(), m(x).float()) <= 2e-2
    msgs = messages(caplog)
    assert any("-> one ComFuse kernel" in s for s in msgs)
    assert any("runs without ComFuse kernels: CPU tensors" in s for s in msgs)


def _captured_patches(monkeypatch):
    import torch._inductor.compile_fx as cfx

    seen = []
    real = cfx.compile_fx

    def spy(gm, ex, config_patches=None, decompositions=None, **kw):
        if config_patches:   # the outer call (compile_fx calls itself again with the patches applied)
            seen.append((dict(config_patches), decompositions))
        return real(gm, ex, config_patches=config_patches, decompositions=decompositions, **kw)

    monkeypatch.setattr(cfx, "compile_fx", spy)
    return seen


def test_mode_and_inductor_options_reach_inductor(monkeypatch):
    """Inductor's mode comes through torch.compile(mode=...) or options={"mode": ...}, its options through
    options={"inductor": {...}}, ComFuse's own beside them; the pass is installed with ComFuse's settings."""
    from comfuse.inductor import ComFusePass
    from comfuse.tracing import decomposition_table

    seen = _captured_patches(monkeypatch)
    m = _bf16(RMSNormMLP())
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.compile(m, backend="comfuse", mode="max-autotune-no-cudagraphs")(x)
        torch._dynamo.reset()
        torch.compile(m, backend="comfuse", options={"mode": "max-autotune-no-cudagraphs", "fuse": "all",
                                                      "inductor": {"epilogue_fusion": False}})(x)
        torch._dynamo.reset()
        torch.compile(m, backend=comfuse.compile_backend(mode="max-autotune-no-cudagraphs", fuse="all"))(x)
    assert len(seen) == 3
    for patches, decomps in seen:
        assert patches["max_autotune"] is True and patches["coordinate_descent_tuning"] is True
        assert isinstance(patches["post_grad_custom_post_pass"], ComFusePass)
        assert decomps == decomposition_table()
    assert seen[0][0]["post_grad_custom_post_pass"].fuse == "planner"
    assert seen[1][0]["epilogue_fusion"] is False and seen[1][0]["post_grad_custom_post_pass"].fuse == "all"
    assert seen[2][0]["post_grad_custom_post_pass"].fuse == "all"


def test_reduce_overhead_mode_is_accepted(monkeypatch):
    seen = _captured_patches(monkeypatch)
    m = _bf16(RMSNormMLP())
    with torch.no_grad():
        torch.compile(m, backend="comfuse", mode="reduce-overhead")(torch.randn(2, 8, 32, dtype=torch.bfloat16))
    assert seen[0][0]["triton.cudagraphs"] is True


@pytest.mark.parametrize("options,match", [
    ({"mode": "fastest"}, "fastest"),
    ({"max_autotune": True}, "Inductor's go in options={'inductor'"),
    ({"fallback": "eager", "mode": "max-autotune"}, "mode and Inductor options need fallback='inductor'"),
])
def test_bad_options_are_refused_clearly(options, match):
    from comfuse.backend import comfuse_backend

    with pytest.raises(Exception, match=match):
        comfuse_backend(None, [], options=options)
    with pytest.raises(ValueError, match="given twice"):
        comfuse_backend(None, [], mode="max-autotune", options={"mode": "max-autotune"})


def test_opt_in_from_backend_inductor(caplog):
    """comfuse.enable_inductor_pass(): a plain torch.compile(model) runs the pass (its report says what it
    decided: on CPU tensors, analysis only); disable_inductor_pass() removes it."""
    caplog.set_level(logging.INFO, logger="comfuse")
    m = _bf16(PostNormEncoderLayer())
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    p = comfuse.enable_inductor_pass()
    try:
        assert torch._inductor.config.post_grad_custom_post_pass is p and p.uuid()
        with torch.no_grad():
            y = torch.compile(m)(x)
            assert rel_err(y.float(), m(x).float()) <= 2e-2
    finally:
        comfuse.disable_inductor_pass()
    assert torch._inductor.config.post_grad_custom_post_pass is None
    assert len(p.reports) == 1 and p.reports[0].fallback.startswith("CPU tensors")
    # Inductor's decompositions there: GELU arrives as x * 0.5 * (1 + erf(x / sqrt(2))); the pass folds it back
    # into one GELU, so FFN1's region holds it, as under backend="comfuse"
    rep = p.reports[0]
    assert len(rep.regions) == 5   # q and k: one region of two GEMMs on one A
    pg = rep.analysis.part.graph
    assert any(any(pg.node(i).op == comfuse.OpKind.Gelu for i in r.nodes) for r in rep.regions)
    assert not any(n.target == torch.ops.aten.erf.default for n in rep.analysis.conv.torch_nodes)


def test_fold_erf_gelu_and_back():
    """fold_erf_gelu finds Inductor's decomposition of GELU; decompose_leftovers writes an unfused GELU back as
    Inductor's decomposition; the graph computes the same values throughout."""
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from comfuse.inductor import decompose_leftovers, fold_erf_gelu

    def f(x, w):
        return torch.nn.functional.gelu(x @ w) + 1

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(f, select_decomp_table(), tracing_mode="fake")(x, w)
    assert any(n.target == torch.ops.aten.erf.default for n in gm.graph.nodes)
    assert fold_erf_gelu(gm.graph) == 1
    assert not any(n.target == torch.ops.aten.erf.default for n in gm.graph.nodes)
    gm.recompile()
    assert torch.allclose(gm(x, w), f(x, w), atol=1e-6)
    assert decompose_leftovers(gm.graph) == 1
    gm.recompile()
    assert any(n.target == torch.ops.aten.erf.default for n in gm.graph.nodes)
    assert torch.allclose(gm(x, w), f(x, w), atol=1e-6)


def test_pass_skips_training_graphs(caplog):
    """A graph that needs gradients runs through Inductor without the pass (with a warning); installed by the
    opt-in, the pass recognizes AOTAutograd's training graphs and leaves them."""
    caplog.set_level(logging.INFO, logger="comfuse")
    m = RMSNormMLP().to(torch.bfloat16)
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    y = torch.compile(m, backend="comfuse")(x)
    y.float().sum().backward()
    assert m.up.weight.grad is not None
    assert any(r.levelno == logging.WARNING and "graph needs gradients" in r.getMessage() for r in caplog.records)
    torch._dynamo.reset()
    p = comfuse.enable_inductor_pass()
    try:
        torch.compile(m)(x).float().sum().backward()
    finally:
        comfuse.disable_inductor_pass()
    assert p.reports and all(r.fallback.startswith("training graph") for r in p.reports)


def test_uuid_covers_settings_and_library():
    from comfuse.inductor import ComFusePass

    a, b = ComFusePass(), ComFusePass(fuse="all")
    assert a.uuid() == ComFusePass().uuid() and a.uuid() != b.uuid()


def test_sdpa_kept_whole_as_one_op():
    """attention="eager" (the default on CUDA tensors before torch 2.11): each SDPA call of the Dynamo graph becomes comfuse::sdpa,
    which runs the kernel eager picks; it traces (fake implementation) and computes what SDPA computes, mask
    and scale included."""
    import torch.nn.functional as F

    from comfuse import ops

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3).transpose(1, 2)

    q, k, v = (torch.randn(2, 3, 8, 4) for _ in range(3))
    mask = torch.zeros(2, 1, 8, 8)
    mask[1, :, :, 6:] = float("-inf")
    graphs = []

    def keep(gm, ex):
        assert ops.keep_sdpa_whole(gm) == 1
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, ex)

    with torch.no_grad():
        got = torch.compile(Attn(), backend=keep)(q, k, v, mask)
        ref = Attn()(q, k, v, mask)
    assert torch.allclose(got, ref, atol=1e-6)
    assert any(n.target is torch.ops.comfuse.sdpa.default for n in graphs[0].graph.nodes)


def test_pass_with_a_dynamic_batch(caplog):
    """A dynamic batch through the pass: one graph, analyzed once at its example sizes; every batch size runs
    the same fused calls (the rows are taken at run time) and matches eager."""
    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(0)
    m = _bf16(PostNormEncoderLayer())
    f = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep"})
    with torch.no_grad():
        for b in (4, 3, 6):
            x = torch.randn(b, 8, 32, dtype=torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            y = f(x)
            assert y.shape == x.shape and rel_err(y.float(), m(x).float()) <= 2e-2, b
    msgs = messages(caplog)
    assert sum("has a dynamic batch dim" in s for s in msgs) == 1, msgs
    assert sum("region(s) run as ComFuse kernels" in s for s in msgs) == 1, msgs


def test_attention_auto_leaves_sdpa_to_inductor_from_torch_2_11():
    """attention="auto": from torch 2.11 tracing keeps SDPA on a fused kernel (measured for BERT, Llama, GPT-2 on
    the H200) and comfuse::sdpa would only add host time; before, SDPA is kept whole."""
    from comfuse import backend

    assert backend.default_attention("2.11.0+cu130") == "inductor"
    assert backend.default_attention("2.12.1") == "inductor"
    assert backend.default_attention("3.0.0") == "inductor"
    assert backend.default_attention("2.10.0") == "eager"
    assert backend.default_attention("2.9.1+cu128") == "eager"
    with pytest.raises(ValueError, match="attention must be 'auto', 'eager' or 'inductor'"):
        backend.comfuse_backend(torch.fx.symbolic_trace(torch.nn.Linear(4, 4)), [torch.randn(2, 4)],
                                options={"attention": "flash"})


def test_inductor_code_calls_the_direct_entry_and_it_defers_to_the_op():
    """Inductor's Python wrapper calls a fused region through its direct entry (extern_kernels.comfuse_fused_region:
    the op's C++ kernel without the dispatcher's trip), not torch.ops.comfuse.fused_region.default; the entry hands
    every call it cannot serve itself to the op - here CPU tensors (the op's CPU reference), and any call under a
    TorchDispatchMode, which must then see the op - and the results match eager."""
    from torch._inductor.utils import run_and_get_code
    from torch.utils._python_dispatch import TorchDispatchMode

    from comfuse import inductor, ops

    if importlib.util.find_spec("torch._inductor.codegen.custom_extern_kernel_codegen") is None:
        pytest.skip(f"torch {torch.__version__} has no registry of custom fallback codegen")
    assert inductor.DIRECT_CALLS
    torch._dynamo.reset()
    m = _bf16(PostNormEncoderLayer())
    x = bf16_randn(2, 8, 32, seed=81).to(torch.bfloat16)
    with torch.no_grad():
        f = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep"})
        y, codes = run_and_get_code(f, x)
        ref = m(x)
    code = "\n".join(codes)
    assert "extern_kernels.comfuse_fused_region(" in code
    assert "torch.ops.comfuse.fused_region.default(" not in code   # (comments still name the op)
    assert rel_err(y.float(), ref.float()) <= 2e-2

    # the entry itself: the op's result, the op seen by a dispatch mode, a clear error on a wrong call
    key = next(k for k in ops._REGIONS)
    spec = ops.region_spec(key)
    ins = ops.random_inputs(spec, "cpu")
    direct = ops.fused_region_direct
    assert all(torch.equal(a, b) for a, b in zip(direct(key, ins), torch.ops.comfuse.fused_region(key, ins)))

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen() as seen:
        direct(key, ins)
    assert "comfuse.fused_region.default" in seen.ops
    if ops._FAST:   # the C++ entry (else direct is the OpOverload, which raises its own errors)
        from comfuse import _torch_ops

        with pytest.raises(TypeError, match="takes 2 arguments"):
            direct(key)
        # where a CUDA call would skip the dispatcher (tests/python/test_gpu_ops.py checks that it then does)
        assert _torch_ops.plain_context()
        with torch.no_grad():
            assert _torch_ops.plain_context()
        with torch.inference_mode():
            assert _torch_ops.plain_context()
        with Seen():
            assert not _torch_ops.plain_context()
        with torch._subclasses.fake_tensor.FakeTensorMode():
            assert not _torch_ops.plain_context()
        with torch.overrides.TorchFunctionMode():
            assert not _torch_ops.plain_context()


@pytest.mark.parametrize("copy_op,lowered", [("device_put", True), ("_to_copy", False)])
def test_inductor_lowers_the_scalar_copy_the_rewrite_inserts(copy_op, lowered):
    """emit._on_device copies a CPU scalar that a fused call reads to the GPU with prims.device_put (dynamic=True
    hands float attributes over as 0-dim CPU tensors). A post-grad pass's node must be one Inductor lowers: it
    lowers device_put (a copy_ in its code), while an aten._to_copy inserted there fails the compile (Inductor
    decomposes that op before its passes and refuses a fallback for it). Checked on the CPU, a copy to the CPU."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class InsertCopy(CustomGraphPass):
        def __call__(self, g):
            s = next(n for n in g.nodes if n.op == "placeholder" and n.meta["val"].dim() == 0)
            with g.inserting_after(s):
                if copy_op == "device_put":
                    c = g.call_function(torch.ops.prims.device_put.default, (s, torch.device("cpu"), True))
                else:
                    c = g.call_function(torch.ops.aten._to_copy.default, (s,), {"device": torch.device("cpu")})
            c.meta["val"] = s.meta["val"].clone()
            s.replace_all_uses_with(c, delete_user_cb=lambda u: u is not c)

        def uuid(self):
            return copy_op

    def f(x, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    torch._dynamo.reset()
    x, eps = torch.randn(4, 8), torch.tensor(1e-6, dtype=torch.float64)
    with torch._inductor.config.patch(post_grad_custom_post_pass=InsertCopy(), fx_graph_cache=False):
        g = torch.compile(f, backend="inductor")
        if lowered:
            assert rel_err(g(x, eps), f(x, eps)) < 1e-5
        else:
            with pytest.raises(Exception, match="both a fallback and a decomp"):
                g(x, eps)
    torch._dynamo.reset()
