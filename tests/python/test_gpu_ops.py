"""The custom op's CUDA implementation: a fused region compiled by comfuse._core.RegionKernel and launched on
the current stream, against the op's CPU reference implementation on the same bf16 inputs. Also: a second batch
size reuses the compiled kernel (M is a launch argument). Skips, saying so, without a compute-capability-9.0 GPU.
"""
import pytest
import torch

import comfuse._core as C
import models
from comfuse import ops
from conftest import messages, rel_err

GRAPHS = {
    "bias_gelu": "y = gelu(add(matmul(X, W), b), approximate=\"tanh\")\noutput y\n",
    "postnorm": "y = layer_norm(add(add(matmul(X, W), b), R), gamma, beta, eps=1e-5)\noutput y\n",
    "softmax": "y = softmax(add(matmul(X, W), b))\noutput y\n",
}


def _gpu_reason():
    if not torch.cuda.is_available():
        return "no GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"no GPU of compute capability 9.0 ({torch.cuda.get_device_name()})"
    return C.unsupported_device_reason(0) or None


requires_hopper = pytest.mark.skipif(_gpu_reason() is not None, reason=f"skipped: {_gpu_reason()}")


def _region(name, m, k, n):
    text = (f"input X : bf16[{m}, {k}]\ninput W : bf16[{k}, {n}]\ninput b : bf16[{n}]\ninput R : bf16[{m}, {n}]\n"
            f"input gamma : bf16[{n}]\ninput beta : bf16[{n}]\n" + GRAPHS[name])
    part = C.partition(C.parse_cf(text, name + ".cf"))
    assert len(part.regions) == 1
    return part.regions[0].spec


def _inputs(spec, m, k, n, gen):
    values = {"X": torch.rand(m, k, generator=gen) * 2 - 1, "W": torch.rand(k, n, generator=gen) * 2 - 1,
              "b": torch.rand(n, generator=gen) * 2 - 1, "R": torch.rand(m, n, generator=gen) * 8 - 4,
              "gamma": torch.rand(n, generator=gen) + 0.5, "beta": torch.rand(n, generator=gen) * 2 - 1}
    order = ["X", "W"] + [p.name for p in spec.params]
    return [values[name].to(torch.bfloat16) for name in order]


@requires_hopper
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_fused_region_on_gpu_matches_the_cpu_reference(name):
    m, k, n = 1000, 520, 264
    spec = _region(name, m, k, n)
    key = ops.register_region(spec)
    gen = torch.Generator().manual_seed(1234)
    cpu = _inputs(spec, m, k, n, gen)
    ref = torch.ops.comfuse.fused_region(key, cpu)
    got = torch.ops.comfuse.fused_region(key, [t.cuda() for t in cpu])
    torch.cuda.synchronize()
    for g, r in zip(got, ref):
        assert g.device.type == "cuda" and g.shape == r.shape and g.dtype == r.dtype
        assert torch.isfinite(g.float()).all()
        assert rel_err(g, r) <= 1e-2, (name, rel_err(g, r))


@requires_hopper
def test_a_new_batch_size_reuses_the_compiled_kernel():
    k, n = 520, 264
    spec = _region("postnorm", 1000, k, n)
    key = ops.register_region(spec)
    gen = torch.Generator().manual_seed(99)
    first = ops.gpu_kernel(key)
    for m in (1000, 777, 2048):
        cpu = _inputs(spec, m, k, n, gen)
        # the CPU reference is shape-static: a region traced at this M gives the expected values
        ref = torch.ops.comfuse.fused_region(ops.register_region(_region("postnorm", m, k, n)), cpu)
        got = torch.ops.comfuse.fused_region(key, [t.cuda() for t in cpu])
        torch.cuda.synchronize()
        assert got[0].shape == (m, n)
        assert rel_err(got[0], ref[0]) <= 1e-2
        assert ops.gpu_kernel(key) is first   # no recompilation for another M


def test_gpu_reason_is_reported_without_a_gpu():
    # the module loads without a driver, and says why kernels cannot run
    reason = C.unsupported_device_reason(0)
    assert isinstance(reason, str)
    if not torch.cuda.is_available():
        assert reason, "a machine without a GPU must give a reason"


def _models():
    # GPU-sized versions of the CPU test modules (N a multiple of 8 so that every GEMM is TMA-aligned)
    return {"PostNormEncoderLayer": lambda: models.PostNormEncoderLayer(d=256, heads=4, ffn=512),
            "RMSNormMLP": lambda: models.RMSNormMLP(d=256, hidden=768),
            "ClassifierHead": lambda: models.ClassifierHead(d=256, classes=64),
            "CumsumBeforeNorm": lambda: models.CumsumBeforeNorm(d=256)}


@requires_hopper
@pytest.mark.parametrize("fuse", ["planner", "all"])
@pytest.mark.parametrize("name", ["PostNormEncoderLayer", "RMSNormMLP", "ClassifierHead", "CumsumBeforeNorm"])
def test_backend_matches_inductor_on_the_gpu(name, fuse, caplog):
    """torch.compile(backend="comfuse") on CUDA bf16 matches backend="inductor" within bf16 tolerance: with the
    planner's choice, and with every region a kernel can serve fused (fuse="all", so the kernels surely run)."""
    import logging

    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(7)
    m = _models()[name]().to(torch.bfloat16).cuda().eval()
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = torch.compile(m, backend="inductor")(x)
        torch._dynamo.reset()
        got = torch.compile(m, backend="comfuse", options={"fuse": fuse})(x)
    torch.cuda.synchronize()
    refs, gots = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
    for g, r in zip(gots, refs):
        assert g.shape == r.shape and g.dtype == r.dtype
        assert torch.isfinite(g.float()).all()
        assert rel_err(g, r) <= 2e-2, (name, rel_err(g, r))
    msgs = messages(caplog)
    assert not any("could not be prepared" in s for s in msgs), msgs
    if fuse == "all":
        assert any("region(s) run as ComFuse kernels" in s for s in msgs), msgs[-6:]


@requires_hopper
def test_backend_dynamic_batch_on_the_gpu(caplog):
    """A dynamic batch dim: one graph, kernels compiled once; later batch sizes reuse them and match eager.
    Batch 1 is Dynamo's own special case (it specializes sizes 0 and 1): a second graph, whose kernels all come
    from the JIT cache."""
    import logging

    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(8)
    m = _models()["PostNormEncoderLayer"]().to(torch.bfloat16).cuda().eval()
    f = torch.compile(m, backend="comfuse", options={"fuse": "all"})
    compiled = None
    with torch.no_grad():
        for b in (4, 3, 6, 1):
            x = torch.randn(b, 64, 256, device="cuda", dtype=torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            y = f(x)
            torch.cuda.synchronize()
            assert y.shape == x.shape
            assert rel_err(y, m(x)) <= 2e-2, b
            if compiled is None:
                compiled = dict(ops._KERNELS)
            if b != 1:
                assert ops._KERNELS == compiled, "a new batch size compiled or registered a new kernel"
    msgs = messages(caplog)
    assert sum("has a dynamic batch dim" in s for s in msgs) == 1, msgs
    assert sum("region(s) run as ComFuse kernels" in s for s in msgs) == 2, msgs
    second = [s for s in msgs if s.startswith("comfuse: graph") and "kernel comfuse_" in s][-6:]
    assert second and all("(cache hit)" in s for s in second), second


@requires_hopper
def test_backend_dynamic_sequence_on_the_gpu(caplog):
    """dynamic=True (a symbolic batch and sequence length) on the GPU: one graph, its kernels compiled once;
    other batch sizes and sequence lengths reuse them and match eager (docs/pytorch.md, "Dynamic shapes")."""
    import logging

    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(9)
    m = _models()["RMSNormMLP"]().to(torch.bfloat16).cuda().eval()
    f = torch.compile(m, backend="comfuse", options={"fuse": "all"}, dynamic=True)
    compiled = None
    with torch.no_grad():
        for b, s in ((4, 64), (3, 40), (5, 72)):
            x = torch.randn(b, s, 256, device="cuda", dtype=torch.bfloat16)
            y = f(x)
            torch.cuda.synchronize()
            assert y.shape == x.shape and rel_err(y, m(x)) <= 2e-2, (b, s)
            if compiled is None:
                compiled = dict(ops._KERNELS)
            assert ops._KERNELS == compiled, "another batch or sequence length compiled a new kernel"
    msgs = messages(caplog)
    assert sum("and other dynamic leading dims" in s for s in msgs) == 1, msgs
    assert sum("region(s) run as ComFuse kernels" in s for s in msgs) == 1, msgs
