"""torch.compile(model, backend="comfuse") on CPU, its fallback reasons, and comfuse.explain."""
import importlib.metadata
import io
import logging

import pytest
import torch

import comfuse
from conftest import bf16_exact, bf16_randn, reference, rel_err
from models import ClassifierHead, CumsumBeforeNorm, PostNormEncoderLayer, RMSNormMLP


def messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "comfuse"]


def test_entry_point_registers_backend():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert any(ep.name == "comfuse" and ep.value == "comfuse.backend:comfuse_backend" for ep in eps)
    assert "comfuse" in torch._dynamo.list_backends(exclude_tags=())


def test_compile_cpu_inductor_matches_eager(caplog):
    caplog.set_level(logging.INFO, logger="comfuse")
    m = RMSNormMLP().eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse")(x)
        ref = m(x)
    assert rel_err(y, ref) < 1e-5
    msgs = messages(caplog)
    assert any("region 1: GEMM 'addmm_1.mm'" in s or "region 1: GEMM" in s for s in msgs)
    assert any("-> one ComFuse kernel" in s for s in msgs)
    assert any("runs without ComFuse kernels: dtype float32" in s for s in msgs)


def test_compile_eager_fallback_option():
    m = PostNormEncoderLayer().eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse", options={"fallback": "eager"})(x)
        assert rel_err(y, m(x)) < 1e-6


@pytest.mark.parametrize("runner", ["eager", "inductor"])
def test_reference_mode_runs_regions_through_custom_op(runner, caplog):
    """options={"reference": True}: the rewritten graph (regions as comfuse::fused_region calls, CPU reference
    implementation) runs, through eager or TorchInductor, and matches torch eager."""
    caplog.set_level(logging.INFO, logger="comfuse")
    m = bf16_exact(PostNormEncoderLayer() if runner == "eager" else ClassifierHead())
    x = bf16_randn(2, 8, 32, seed=5)
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse", options={"fallback": runner, "reference": True, "ctas": 2})(x)
    assert rel_err(y, reference(m, x)[0]) <= 1e-5
    assert any("through the CPU reference implementation" in s for s in messages(caplog))


def test_rewritten_graph_calls_custom_op():
    m = bf16_exact(CumsumBeforeNorm())
    x = bf16_randn(2, 4, 32, seed=6)
    rep = comfuse.capture(m, x)[0]
    gm = rep.analysis.program.rewrite()
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
    assert len(calls) == 1
    assert any(n.target is torch.ops.aten.cumsum.default for n in gm.graph.nodes)
    outs = gm(*rep.example_inputs)
    for o, r in zip(outs, reference(m, x)):
        assert rel_err(o, r) <= 1e-5
    # the fake implementation gives shapes and dtypes without running anything
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as fm:
        fins = [fm.from_tensor(t) for t in rep.example_inputs]
        fouts = gm(*fins)
    assert [tuple(o.shape) for o in fouts] == [tuple(o.shape) for o in outs]


def test_rewrite_fuses_only_the_regions_asked_for():
    """The backend fuses the planner's regions only: the others are emitted node by node, same values."""
    m = bf16_exact(PostNormEncoderLayer())
    x = bf16_randn(2, 8, 32, seed=7)
    rep = comfuse.capture(m, x)[0]
    n_regions = len(rep.regions)
    assert n_regions >= 2
    for fuse in (set(), {0}, set(range(1, n_regions))):
        gm = rep.analysis.program.rewrite(fuse=fuse)
        calls = [n for n in gm.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
        assert len(calls) == len(fuse)
        for o, r in zip(gm(*rep.example_inputs), reference(m, x)):
            assert rel_err(o, r) <= 1e-5


# ---------------------------------------------------------------- fallbacks, each with its logged reason

def compile_and_log(caplog, model, *xs, **kw):
    caplog.set_level(logging.INFO, logger="comfuse")
    y = torch.compile(model, backend="comfuse", options={"fallback": "eager"}, **kw)(*xs)
    return y, "\n".join(messages(caplog))


def test_fallback_needs_gradients(caplog):
    m = RMSNormMLP()  # train mode, grad enabled
    x = torch.randn(2, 8, 32)
    y, log = compile_and_log(caplog, m, x)
    assert "graph needs gradients" in log
    assert any(r.levelno == logging.WARNING and "graph needs gradients" in r.getMessage() for r in caplog.records)
    y.sum().backward()  # still a training graph
    assert m.up.weight.grad is not None


def test_fallback_cpu_tensors(caplog):
    m = RMSNormMLP().to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        y, log = compile_and_log(caplog, m, x)
        assert torch.equal(y, m(x))
    assert "runs without ComFuse kernels: CPU tensors: ComFuse kernels run on NVIDIA Hopper GPUs" in log


def test_fallback_fp32_dtype(caplog):
    m = ClassifierHead().eval()
    with torch.no_grad():
        _, log = compile_and_log(caplog, m, torch.randn(4, 32))
    assert "dtype float32 GEMM 'addmm': ComFuse kernels take bf16/f16 operands" in log


def test_fallback_dynamic_shapes(caplog):
    m = ClassifierHead().eval()
    with torch.no_grad():
        y, log = compile_and_log(caplog, m, torch.randn(5, 32), dynamic=True)
        assert y.shape == (5, 10)
    assert "dynamic shapes (symbolic sizes in" in log


def test_fallback_no_fusable_gemm(caplog):
    m = torch.nn.Sequential(torch.nn.Softmax(-1)).eval()
    with torch.no_grad():
        _, log = compile_and_log(caplog, m, torch.randn(4, 8).bfloat16())
    assert "no GEMM with a fusable epilogue" in log


# ---------------------------------------------------------------- explain, pinned

def explain_text(model, *xs):
    buf = io.StringIO()
    e = comfuse.explain(model, *xs, file=buf)
    assert buf.getvalue().strip() == str(e).strip()
    return e, str(e)


def test_explain_encoder_layer():
    e, text = explain_text(bf16_exact(PostNormEncoderLayer()), bf16_randn(2, 8, 32))
    assert len(e.regions) == 6
    assert "ComFuse explain: 1 graph(s) captured" in text
    assert "8 GEMM(s), 6 fused region(s)" in text
    assert "backend: falls back: dtype float32 GEMM 'addmm'" in text
    assert ("addmm_3 = aten.addmm.default(float32[32], float32[16, 32], float32[32, 32]) -> float32[16, 32]: "
            "epilogue fused: region 3 (15 epilogue node(s), 3 stage(s))") in text
    assert ("bmm = aten.bmm.default(float32[4, 8, 16], float32[4, 16, 8]) -> float32[4, 8, 8]: epilogue NOT fused: "
            "batched matmul (B is [4, 16, 8], with batch dims): runs on the standard path") in text
    assert "changes the last dim: rows would no longer be GEMM rows" in text
    assert "gemm: rows=16 N=32 K=64 bf16 B=[N,K], 3 stage(s)" in text
    assert "reduce.mean %5 -> stage 1 bypass(%5)" in text
    # the planner's decision, with its basis, for every region (pinned: the measured table is compiled in)
    assert "plan (from the measured table; a declined region runs unfused):" in text
    assert "  region 3: fuse: measured " in text and "for 'postnorm' [" in text


def test_explain_unsupported_op():
    _, text = explain_text(bf16_exact(CumsumBeforeNorm()), bf16_randn(2, 4, 32))
    assert "cumsum = aten.cumsum.default: left in torch: unsupported op aten.cumsum.default (not in the Graph IR)" in text
    assert "transpose reorders the tile across rows: not expressible as an epilogue" in text
    assert "epilogue fused: region 0 (2 epilogue node(s), 1 stage(s))" in text


def test_explain_bf16_rmsnorm():
    m = RMSNormMLP().to(torch.bfloat16).eval()
    _, text = explain_text(m, torch.randn(2, 8, 32, dtype=torch.bfloat16))
    assert "backend: falls back: CPU tensors" in text
    assert "mm = aten.mm.default(bfloat16[16, 96], bfloat16[96, 32]) -> bfloat16[16, 32]: epilogue fused: " \
           "region 1 (9 epilogue node(s), 2 stage(s))" in text
    # the decomposed RMSNorm computes in fp32: the bf16 weight is widened by a cast outside the kernel
    assert "left outside the fused regions:\n  arg4_1.f32 = cast: standard path: not fused: reads no GEMM " \
           "epilogue value\nplan" in text
    assert " = gelu" in text and " = rsqrt %" in text
