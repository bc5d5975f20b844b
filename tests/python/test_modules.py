"""Real nn.Modules captured with Dynamo, converted to the Graph IR, partitioned, and the converted program
interpreted on the CPU reference interpreters vs torch eager in fp32 (see conftest.py for the numerics)."""
import pytest
import torch

import comfuse
from conftest import assert_fp32_match, bf16_exact, bf16_randn, reference, rel_err
from models import ClassifierHead, CumsumBeforeNorm, CumsumCycle, PostNormEncoderLayer, RMSNormMLP


def capture_one(model, *xs):
    reps = comfuse.capture(model, *xs)
    assert len(reps) == 1, [r.fallback for r in reps]
    rep = reps[0]
    assert rep.analysis is not None, rep.error
    return rep


def check_numerics(model, rep, *xs):
    """The converted program (graph mode, and spec mode with 1 and 3 column blocks) vs torch eager."""
    ref = reference(model, *xs)
    with torch.no_grad():
        plain = model(*xs)
    plain = list(plain) if isinstance(plain, (tuple, list)) else [plain]
    prog = rep.analysis.program
    for mode, ctas in (("graph", 1), ("spec", 1), ("spec", 3)):
        outs = prog.run(rep.example_inputs, mode, ctas)
        assert len(outs) == len(ref)
        for o, r, p in zip(outs, ref, plain):
            assert o.shape == r.shape and o.dtype == r.dtype
            assert_fp32_match(o, r, (mode, ctas))
            assert rel_err(o, p) <= 2e-2  # vs eager without operand rounding: the bf16 GEMM inputs


def region_roots(rep):
    pg = rep.analysis.part.graph
    return [pg.node(r.root).name for r in rep.analysis.part.regions]


def test_postnorm_encoder_layer():
    m = bf16_exact(PostNormEncoderLayer())
    x = bf16_randn(2, 8, 32)
    rep = capture_one(m, x)
    part = rep.analysis.part
    # q + k (one region of two GEMMs on one A), v, o, fc1, fc2 are epilogue roots; the two attention bmm are batched
    # (standard path)
    assert len(part.regions) == 5
    assert [r.spec.gemm.paired for r in part.regions].count(True) == 1
    stages = sorted(r.spec.num_stages() for r in part.regions)
    assert stages == [1, 1, 1, 3, 3]  # o-proj and fc2 carry residual + LayerNorm (mean, var, normalize)
    specs = [str(r.spec) for r in part.regions]
    assert sum("gelu" in s for s in specs) == 1
    assert sum("broadcast.tile" in s and "reduce.mean" in s for s in specs) == 2
    assert not rep.analysis.conv.torch_nodes  # everything converts; closure keeps bmm/softmax/transposes outside
    check_numerics(m, rep, x)


def test_rmsnorm_mlp_block():
    m = bf16_exact(RMSNormMLP())
    x = bf16_randn(2, 8, 32, seed=1)
    rep = capture_one(m, x)
    part = rep.analysis.part
    assert len(part.regions) == 2
    up, down = part.regions
    assert up.spec.num_stages() == 1 and "gelu" in str(up.spec)
    assert down.spec.num_stages() == 2  # mean(x^2) -> x * rsqrt(...) * w
    assert "rsqrt" in str(down.spec) and "broadcast.tile" in str(down.spec)
    check_numerics(m, rep, x)


def test_classifier_head_softmax():
    m = bf16_exact(ClassifierHead())
    x = bf16_randn(4, 32, seed=2)
    rep = capture_one(m, x)
    part = rep.analysis.part
    assert len(part.regions) == 2
    cls = part.regions[1].spec
    assert cls.num_stages() == 3  # max -> sum(exp) -> divide
    assert "reduce.max" in str(cls) and "reduce.sum" in str(cls)
    assert cls.gemm.n == 10
    check_numerics(m, rep, x)


def test_unsupported_op_between_matmul_and_norm():
    m = bf16_exact(CumsumBeforeNorm())
    x = bf16_randn(2, 4, 32, seed=3)
    rep = capture_one(m, x)
    a = rep.analysis
    assert [n.name for n in a.conv.torch_nodes] == ["cumsum"]
    assert len(a.part.regions) == 1
    region = a.part.regions[0]
    assert region.spec.num_stages() == 1  # bias only: the LayerNorm reads cumsum, the softmax a transpose
    pg = a.part.graph
    reasons = {pg.node(i).name: a.part.decisions[i].reason for i in a.part.fallback}
    transposes = [k for k in reasons if k.startswith("permute") or k.startswith("transpose")]
    assert transposes and "transpose reorders the tile across rows" in reasons[transposes[0]]
    check_numerics(m, rep, x)


def test_cycle_through_torch_node_is_broken():
    m = bf16_exact(CumsumCycle())
    x = bf16_randn(2, 4, 32, seed=4)
    rep = capture_one(m, x)
    a = rep.analysis
    names = {n.name: r for n, r in a.conv.torch_nodes.items()}
    assert set(names) == {"cumsum", "add"}
    assert "would create a cycle" in names["add"]
    assert len(a.part.regions) == 1
    check_numerics(m, rep, x)


@pytest.mark.parametrize("model_cls", [PostNormEncoderLayer, RMSNormMLP])
def test_bf16_model_converts_one_to_one(model_cls):
    """A bf16 model: no casts around the GEMMs, operands and params are bf16 in the Spec."""
    m = model_cls().to(torch.bfloat16).eval()
    x = torch.randn(2, 8, 32).to(torch.bfloat16)
    rep = capture_one(m, x)
    for r in rep.analysis.part.regions:
        assert "cast" not in str(r.spec).split("stage 0")[1].split("\n")[1]  # the first op after acc
        assert str(r.spec.gemm.dtype).endswith("BF16")
    assert "CPU tensors" in rep.fallback
    outs = rep.analysis.program.run(rep.example_inputs, "spec", 2)
    with torch.no_grad():
        ref = m(x)
    assert outs[0].dtype == torch.bfloat16 and rel_err(outs[0], ref) < 3e-2
