"""Back-to-back GEMM chains (GEMM1 -> F -> GEMM2, docs/kernel-b2b.md "Graph level") captured from nn.Modules:
the frontend's graphs reach partition with the chain intact (Linear -> act -> Linear with nn.Linear's [N, K]
weights, and target attention written out in ops), and the user sees each chain, recognised or not, with the
planner's decision (the DLRM MLP's and the attention's shape classes fuse, where the kernel was measured
faster) in the log and in comfuse.explain; in the backend's CPU reference mode a fused chain becomes one
comfuse::fused_chain call. CPU only: the workload shapes are captured on the meta device (nothing is computed), the small
ones on CPU tensors."""
import importlib.util
import io
import logging

import pytest
import torch
import torch.nn as nn

import comfuse
from conftest import messages

BF16 = torch.bfloat16


class TargetAttention(nn.Module):
    """softmax(q @ k^T * s) @ v on [B, L, D] tensors, written out in ops."""

    def __init__(self, scale: float = 0.125, also_p: bool = False, divide: bool = False):
        super().__init__()
        self.scale, self.also_p, self.divide = scale, also_p, divide

    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2)
        p = torch.softmax(s / self.scale if self.divide else s * self.scale, dim=-1)
        return (p @ v, p) if self.also_p else p @ v


class FFN(nn.Module):
    def __init__(self, d=64, h=256, norm=False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, h), nn.Linear(h, d)
        self.act = nn.LayerNorm(h) if norm else nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MLPReturningHidden(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 16)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h), h


def dlrm_bottom(k=512, n1=256, n2=64):
    return nn.Sequential(nn.Linear(k, n1), nn.ReLU(), nn.Linear(n1, n2), nn.ReLU())


def capture_one(model, *xs):
    reps = comfuse.capture(model.eval(), *xs)
    assert len(reps) == 1, [r.fallback for r in reps]
    assert reps[0].analysis is not None, reps[0].error
    return reps[0]


def only_chain(rep):
    assert len(rep.chains) == 1, rep.chain_lines()
    return rep.chains[0], rep.b2b_plans[0]


def meta(*shape):
    return torch.empty(*shape, device="meta", dtype=BF16)


# ---------------------------------------------------------------- recognised, at the workloads' shapes

def test_dlrm_bottom_mlp_is_one_chain_at_its_shape():
    """DLRM bottom MLP (65536 x 512 -> 256 -> 64, bf16): addmm's bias, nn.Linear's [N, K] weights read
    transposed, ReLU after each GEMM: one elementwise chain whose epilogue2 is bias + ReLU."""
    rep = capture_one(dlrm_bottom().to(device="meta", dtype=BF16), meta(65536, 512))
    c, plan = only_chain(rep)
    assert c.recognised, c.reason
    b = c.spec
    assert b.form == "elementwise" and b.batch == 1 and not b.w1_batched and not b.w2_batched
    g1, g2 = b.first.gemm, b.second.gemm
    assert (g1.rows, g1.k, g1.n) == (65536, 512, 256) and (g2.rows, g2.k, g2.n) == (65536, 256, 64)
    assert g1.transpose_b and g2.transpose_b          # nn.Linear weights stay [N, K]: the NK layout
    assert "relu" in str(b.first) and "relu" in str(b.second) and "broadcast.row" in str(b.second)  # b2 + relu
    # both halves stay what they were: the partition's two regions
    assert (c.region1, c.region2) == (0, 1) and len(rep.regions) == 2
    assert (rep.gemm_name(c.gemm1), rep.gemm_name(c.gemm2)) == ("addmm", "addmm_1")
    assert plan is not None and plan.fuse and plan.config == "128x128x64x64", plan.reason
    assert plan.reason.startswith("fuse, flash-style B2B kernel 128x128x64x64: measured 0.87x two cuBLASLt GEMMs")


def test_target_attention_is_one_softmax_chain_at_its_shape():
    """Target attention (B=1024, Lq=128, Lk=256, D=64): the two bmm with K's transpose absorbed as
    transpose_b, F = softmax(x * s) (torch computes it in f32 between two casts; the converter folds them)."""
    rep = capture_one(TargetAttention(), meta(1024, 128, 64), meta(1024, 256, 64), meta(1024, 256, 64))
    c, plan = only_chain(rep)
    assert c.recognised, c.reason
    b = c.spec
    assert b.form == "softmax" and b.batch == 1024 and b.w1_batched and b.w2_batched
    g1, g2 = b.first.gemm, b.second.gemm
    assert (g1.rows, g1.k, g1.n, g1.transpose_b) == (1024 * 128, 64, 256, True)   # K read as [B, Lk, D]
    assert (g2.rows, g2.k, g2.n, g2.transpose_b) == (1024 * 128, 256, 64, False)
    assert "mul" in str(b.first)                     # the scale is F's elementwise prefix
    assert (c.region1, c.region2) == (-1, -1)        # batched GEMMs: the standard path today
    assert plan.fuse and plan.config == "128x128x64x64_x64", plan.reason
    # the graph has no single-GEMM region, but a chain to fuse: that is not a reason to leave it to Inductor
    assert "no GEMM with a fusable epilogue" not in (rep.fallback or "")


def test_ffn_gelu_tanh_on_3d_activations():
    """Linear -> GELU(tanh) -> Linear on [B, S, D]: the views that flatten B x S are looked through."""
    rep = capture_one(FFN().to(BF16), torch.randn(2, 16, 64, dtype=BF16))
    c, plan = only_chain(rep)
    assert c.recognised, c.reason
    assert c.spec.form == "elementwise" and "gelu_tanh" in str(c.spec.first)
    assert (c.spec.first.gemm.rows, c.spec.first.gemm.n, c.spec.second.gemm.n) == (32, 256, 64)
    assert plan.fuse   # N2 = 64: the DLRM MLP's class
    wide = capture_one(FFN(64, 256).to(BF16), torch.randn(2, 16, 64, dtype=BF16))
    assert only_chain(wide)[1].fuse
    big = capture_one(FFN(768, 3072).to(device="meta", dtype=BF16), meta(16, 1024, 768))
    _, plan = only_chain(big)
    assert not plan.fuse and plan.reason.startswith("fusion does not pay: N2 768 takes 3 column tiles"), plan.reason


@pytest.mark.parametrize("scale,divide", [(0.125, False), (1.0, False), (4.0, True)])
def test_attention_chain_through_the_inductor_pass(scale, divide, caplog):
    """torch.compile(backend="comfuse"): the post-grad graph Inductor hands the pass writes the softmax with the
    scale moved after the max (exp((x - max x) * s), or / s for `/ sqrt(d)`), or with no scale at all; each is
    recognised, and the log says the chain is recognised and why it is not fused."""
    from comfuse import inductor

    caplog.set_level(logging.INFO, logger="comfuse")
    inductor.reset_reports()
    q, k, v = (torch.randn(2, lq, 16, dtype=BF16) for lq in (8, 32, 32))
    m = TargetAttention(scale, divide=divide).eval()
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse")(q, k, v)
        ref = m(q, k, v)
    assert torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
    (rep,) = inductor.reports()
    c, _ = only_chain(rep)
    assert c.recognised and c.spec.form == "softmax", c.reason
    msgs = messages(caplog)
    assert any("back-to-back chain 0: GEMM 'bmm' -> GEMM 'bmm_1': recognised (F softmax)" in s and
               "the planner fuses it (fuse, cluster-form B2B kernel" in s for s in msgs), msgs   # 2 tiles


def test_dlrm_chain_through_the_inductor_pass(caplog):
    from comfuse import inductor

    caplog.set_level(logging.INFO, logger="comfuse")
    inductor.reset_reports()
    m = dlrm_bottom(64, 32, 16).to(BF16).eval()
    with torch.no_grad():
        torch.compile(m, backend="comfuse")(torch.randn(16, 64, dtype=BF16))
    (rep,) = inductor.reports()
    c, _ = only_chain(rep)
    assert c.recognised, c.reason
    assert any("back-to-back chain 0: GEMM 'addmm' -> GEMM 'addmm_1': recognised (F elementwise)" in s
               for s in messages(caplog))


# ---------------------------------------------------------------- what the user sees

def test_explain_lists_the_chain_and_the_decision():
    buf = io.StringIO()
    comfuse.explain(TargetAttention(), *(torch.randn(2, lq, 16, dtype=BF16) for lq in (8, 32, 32)), file=buf)
    text = buf.getvalue()
    assert "back-to-back chains (GEMM1 -> F -> GEMM2 -> epilogue2" in text
    assert "chain 0: GEMM 'bmm' -> GEMM 'bmm_1': recognised (F softmax)" in text
    assert "the planner fuses it (fuse, cluster-form B2B kernel (2 tiles on 132 SMs" in text
    assert "128x128x64x64_x64_c2" in text
    assert "b2b: F softmax" in text                  # the B2BSpec, in the partition's text


def test_explain_without_a_chain_prints_no_chain_section():
    buf = io.StringIO()
    comfuse.explain(nn.Sequential(nn.Linear(32, 16), nn.ReLU()).to(BF16), torch.randn(4, 32, dtype=BF16), file=buf)
    assert "back-to-back" not in buf.getvalue()


# ---------------------------------------------------------------- not recognised, with the reason

def test_intermediate_read_twice_stays_two_regions():
    rep = capture_one(MLPReturningHidden().to(BF16), torch.randn(8, 64, dtype=BF16))
    c, plan = only_chain(rep)
    assert not c.recognised and plan is None
    assert c.reason == "the intermediate must stay on chip, but 'relu' is a graph output: it stays two regions"
    assert len(rep.regions) == 2
    assert rep.chain_lines() == ["chain 0: GEMM 'addmm' -> GEMM 'addmm_1': not recognised: " + c.reason]


def test_attention_probabilities_returned_too_stay_unfused():
    rep = capture_one(TargetAttention(also_p=True), *(torch.randn(2, lq, 16, dtype=BF16) for lq in (8, 32, 32)))
    c, _ = only_chain(rep)
    assert not c.recognised
    assert "the intermediate must stay on chip, but" in c.reason and "is a graph output" in c.reason


def test_layernorm_between_the_linears_is_not_expressible():
    rep = capture_one(FFN(norm=True).to(BF16), torch.randn(2, 8, 64, dtype=BF16))
    c, plan = only_chain(rep)
    assert not c.recognised and plan is None
    assert c.reason.startswith("F is not expressible in a B2B kernel: F reduces over N1 but is not a softmax")
    assert "needs the whole row of S before GEMM2" in c.reason
    assert len(rep.regions) == 2


def test_fp32_attention_is_not_recognised_and_says_why():
    """An fp32 model's GEMMs read bf16 operands through an explicit cast (see docs/pytorch.md, numerics of the CPU
    checks); after a softmax that cast is a fourth node in F's last stage, which recognition does not take.
    ComFuse kernels need bf16/f16 models anyway (an fp32 graph falls back as a whole)."""
    rep = capture_one(TargetAttention(), *(torch.randn(2, lq, 16) for lq in (8, 32, 32)))
    c, _ = only_chain(rep)
    assert not c.recognised
    assert "stage 2 computes more than exp(x - max) / sum" in c.reason


# ---------------------------------------------------------------- the folded softmax computes the same

def test_folded_softmax_program_matches_eager():
    """The converted attention (softmax folded into the logits' dtype) run on the CPU reference interpreters."""
    m = TargetAttention()
    xs = [torch.randn(3, lq, 16, dtype=BF16) for lq in (8, 24, 24)]
    rep = capture_one(m, *xs)
    assert rep.analysis.conv.softmax_folds, "the softmax was not folded"
    with torch.no_grad():
        ref = m(*xs).float()
    for mode in ("graph", "spec"):
        (out,) = rep.analysis.program.run(rep.example_inputs, mode)
        assert out.dtype == BF16 and torch.allclose(out.float(), ref, atol=1e-2, rtol=1e-2), mode


def test_folded_softmax_inside_a_fused_region_keeps_the_aten_graph():
    """A bf16 Linear -> softmax -> Linear: the first region holds the folded softmax; the ATen-keeping rewrite
    (the GPU path) lines the region up with the ATen nodes the fold replaced, and computes the same."""
    m = nn.Sequential(nn.Linear(32, 64), nn.Softmax(dim=-1), nn.Linear(64, 16)).to(BF16).eval()
    x = torch.randn(8, 32, dtype=BF16)
    rep = capture_one(m, x)
    assert rep.analysis.conv.softmax_folds
    c, _ = only_chain(rep)
    assert c.recognised and c.spec.form == "softmax", c.reason
    gm = rep.analysis.program.rewrite_keeping_torch({0, 1})
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
    assert len(calls) == 2
    left = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.amax.default not in left and torch.ops.aten.exp.default not in left
    with torch.no_grad():
        got, ref = gm(*rep.example_inputs)[0], m(x)
    assert torch.allclose(got.float(), ref.float(), atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------- on an H200: the same decisions

def _gpu_analysis(monkeypatch, rep):
    """analyze_graph of a captured graph on fake CUDA tensors of an sm_90 GPU (as test_backend does; no GPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from comfuse import _core, backend

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(_core, "unsupported_device_reason", lambda i: "")
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        inputs = [fake.from_tensor(t).to("cuda:0") for t in rep.example_inputs]
        with torch.no_grad():
            return backend.analyze_graph(rep.gm, inputs)


def test_on_a_hopper_gpu_the_mlp_chain_fuses(monkeypatch):
    rep = _gpu_analysis(monkeypatch, capture_one(dlrm_bottom(64, 32, 16).to(BF16), torch.randn(16, 64, dtype=BF16)))
    assert rep.fallback is None
    c, plan = only_chain(rep)
    assert c.recognised and plan.fuse
    from comfuse import backend

    chains = backend.fused_chains(rep)
    assert chains == {0} and backend.fused_set(rep, False, chains) == set()   # both regions are the chain's


def test_on_a_hopper_gpu_attention_runs_as_its_chain(monkeypatch):
    """No single-GEMM region, one fused chain: the graph does not fall back."""
    rep = _gpu_analysis(monkeypatch, capture_one(TargetAttention(), *(torch.randn(2, lq, 16, dtype=BF16)
                                                                      for lq in (8, 32, 32))))
    assert rep.fallback is None
    assert rep.b2b_plans[0].fuse


# ---------------------------------------------------------------- fused: one comfuse::fused_chain call

@pytest.mark.parametrize("case", ["dlrm", "attention", "attention_div", "ffn_3d"])
def test_a_fused_chain_becomes_one_call_in_the_reference_pass(case, caplog):
    """The backend's CPU reference mode with the ATen-keeping rewrite runs the Inductor pass on CPU tensors: the chain
    the planner fuses becomes
    one comfuse::fused_chain call (its CPU form: the chain's torch ops), its two regions are not fused separately,
    and the compiled model matches eager."""
    from comfuse import inductor

    caplog.set_level(logging.INFO, logger="comfuse")
    inductor.reset_reports()
    torch.manual_seed(0)
    if case == "dlrm":
        m, xs = dlrm_bottom(64, 32, 16).to(BF16), (torch.randn(24, 64, dtype=BF16),)
    elif case == "ffn_3d":
        m, xs = FFN(64, 128).to(BF16), (torch.randn(2, 12, 64, dtype=BF16),)
    else:
        m = TargetAttention(4.0, divide=True) if case == "attention_div" else TargetAttention(0.25)
        xs = tuple(torch.randn(3, lq, 16, dtype=BF16) for lq in (8, 40, 40))
    m = m.eval()
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep"})(*xs)
        ref = m(*xs)
    assert torch.allclose(y.float(), ref.float(), atol=3e-2, rtol=3e-2), (y.float() - ref.float()).abs().max()
    (rep,) = inductor.reports()
    assert rep.fused_chains == {0}, messages(caplog)
    assert not rep.fused & backend_chain_regions(rep)
    msgs = messages(caplog)
    # small chains (fewer tiles than SMs): the cluster form
    assert any("back-to-back chain 0: fused as one kernel (fuse, cluster-form B2B kernel" in s for s in msgs), msgs
    assert any("1 back-to-back chain(s) run as ComFuse kernels" in s for s in msgs), msgs


def backend_chain_regions(rep):
    from comfuse import backend

    return backend.chain_regions(rep, rep.fused_chains)


def test_a_declined_chain_keeps_its_regions(caplog):
    """fuse='planner' with a chain the planner declines (the FFN's class: N2 = 768): its two regions fuse as before."""
    from comfuse import inductor

    caplog.set_level(logging.INFO, logger="comfuse")
    inductor.reset_reports()
    m = FFN(64, 256).to(BF16).eval()
    m.fc2 = nn.Linear(256, 768).to(BF16)
    x = torch.randn(2, 8, 64, dtype=BF16)
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep"})(x)
        ref = m(x)
    assert torch.allclose(y.float(), ref.float(), atol=3e-2, rtol=3e-2)
    (rep,) = inductor.reports()
    assert rep.fused_chains == set()
    assert not rep.b2b_plans[0].fuse and len(rep.fused) == 2


def test_inductor_code_calls_the_chain_direct_entry():
    """A fused chain in Inductor's code is a call of the op's direct entry (extern_kernels.comfuse_fused_chain), as
    a fused region's is (test_inductor.py); on CPU tensors that entry hands the call to the op's reference, and the
    result matches the module."""
    from torch._inductor.utils import run_and_get_code

    from comfuse import inductor

    if importlib.util.find_spec("torch._inductor.codegen.custom_extern_kernel_codegen") is None:
        pytest.skip(f"torch {torch.__version__} has no registry of custom fallback codegen")
    assert inductor.DIRECT_CALLS
    torch._dynamo.reset()
    inductor.reset_reports()
    m = dlrm_bottom(64, 32, 16).to(BF16).eval()
    x = torch.randn(16, 64, dtype=BF16)
    with torch.no_grad():
        f = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep"})
        y, codes = run_and_get_code(f, x)
        ref = m(x)
    code = "\n".join(codes)
    assert sum(len(r.fused_chains) for r in inductor.reports()) == 1
    assert "extern_kernels.comfuse_fused_chain(" in code and "torch.ops.comfuse.fused_chain.default(" not in code
    assert torch.allclose(y.float(), ref.float(), atol=2e-2, rtol=2e-2)
