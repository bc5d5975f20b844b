"""comfuse.to_torch: a .cf program as a PyTorch function (the torch side of bench/programs.py). With fp32 between ops
it equals the library-form interpreter (the GEMM's output rounded, then fp32) on random programs, to 1e-5; as eager
PyTorch runs it (each op in its declared dtype) it is within `comfuse run --check`'s tolerance (1e-2 normwise) of the
fp32 program on the examples."""
import glob
import os
import subprocess

import numpy as np
import pytest
import torch

from comfuse import _core as C
from comfuse import to_torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
GENERATOR = os.path.join(ROOT, "build", "bin", "comfuse_random_graphs")


def graph_of(path):
    with open(path) as f:
        return C.parse_cf(f.read(), path)


def rel_err(got, want):
    got, want = got.astype(np.float64), want.astype(np.float64)
    den = max(float(np.sum(want * want)), 1e-6 * want.size)
    return float(np.sqrt(np.sum((got - want) ** 2) / den))


def check(g, seed=0, intermediates="declared"):
    ins = to_torch.random_inputs(g, seed=seed)
    got = to_torch.function(g, intermediates)(ins)
    feed = {k: v.float().numpy() for k, v in ins.items()}
    if intermediates == "f32":   # the same rounding points: the GEMM's stored output, the casts, the outputs
        ref, tol = C.interpret_partitioned(C.partition(g), feed, 1, True), 1e-5
    else:
        ref, tol = C.interpret_graph(g, feed), 1e-2
    assert set(got) == set(ref)
    for name, t in got.items():
        assert t.dtype == to_torch._DTYPES[g.node(g.find(name)).dtype], name
        assert tuple(t.shape) == tuple(ref[name].shape), name
        e = rel_err(t.float().numpy(), ref[name])
        assert e <= tol, f"{name}: {e:.3e}\n{g.to_cf()}"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "examples", "small", "*.cf"))),
                         ids=lambda p: os.path.basename(p))
def test_small_examples(path):
    check(graph_of(path))
    check(graph_of(path), intermediates="f32")


def test_random_programs(tmp_path):
    if not os.path.exists(GENERATOR):
        pytest.skip("build/bin/comfuse_random_graphs not built")
    subprocess.run([GENERATOR, "--count", "30", "--small", "-o", str(tmp_path)], check=True, capture_output=True)
    files = sorted(tmp_path.glob("*.cf"))
    assert len(files) == 30
    for i, f in enumerate(files):
        check(graph_of(str(f)), seed=i, intermediates="f32")


def test_it_is_what_pytorch_writes():
    g = C.parse_cf("input X : bf16[4, 8]\ninput W : bf16[16, 8]\ninput g : bf16[16]\n"
                   "y = rms_norm(matmul(X, W, transpose_b=true), g, eps=1e-6)\noutput y\n")
    ins = to_torch.random_inputs(g, seed=3)
    want = torch.nn.functional.rms_norm(ins["X"] @ ins["W"].t(), (16,), ins["g"], 1e-6)
    assert torch.equal(to_torch.function(g)(ins)["y"], want)


def test_relabel_keeps_the_value_where_cast_rounds_it():
    g = C.parse_cf("input x : f32[4, 8]\ninput b : bf16[4, 8]\n"
                   "r = relabel(mul(x, 3.0), dtype=bf16)\nc = cast(mul(x, 3.0), dtype=bf16)\n"
                   "s = add(r, b)\nt = add(c, b)\noutput s, t\n")
    check(g)
    check(g, intermediates="f32")
    ins = to_torch.random_inputs(g, seed=5)
    out = to_torch.function(g, "f32")(ins)
    x3, b = ins["x"].float() * 3.0, ins["b"].float()
    assert torch.equal(out["s"], (x3 + b).to(torch.bfloat16))
    assert torch.equal(out["t"], (x3.to(torch.bfloat16).float() + b).to(torch.bfloat16))
    assert not torch.equal(out["s"], out["t"])


def test_a_node_without_a_torch_form_is_refused_by_name(monkeypatch):
    g = C.parse_cf("input X : bf16[4, 8]\ninput W : bf16[8, 16]\ny = exp(matmul(X, W))\noutput y\n")
    monkeypatch.delitem(to_torch._UNARY, C.OpKind.Exp)
    with pytest.raises(to_torch.UnsupportedNode, match="no PyTorch form for exp"):
        to_torch.function(g)


def test_the_epilogue_alone_given_the_matmul_outputs():
    # The epilogue alone (bench/programs.py's Inductor pass) fed the GEMM's own output is the whole program.
    g = graph_of(os.path.join(ROOT, "examples", "small", "postnorm.cf"))
    mm = to_torch.matmul_names(g)
    assert len(mm) == 1
    ins = to_torch.random_inputs(g, seed=5)
    env = dict(ins)
    full = to_torch.function(g)
    epilogue = to_torch.function(g, given=mm)
    node = g.node(g.find(mm[0]))
    a, b = (ins[g.node(i).name] for i in node.inputs)
    env[mm[0]] = a @ (b.t() if node.transpose_b else b)
    for name, t in full(ins).items():
        assert torch.equal(epilogue(env)[name], t), name
    fresh = to_torch.given_inputs(g, mm, seed=2)
    assert fresh[mm[0]].shape == tuple(node.shape) and fresh[mm[0]].dtype == torch.bfloat16
    assert epilogue({**ins, **fresh}).keys() == full(ins).keys()
    with pytest.raises(ValueError, match="no computed node of the program: nope"):
        to_torch.function(g, given=["nope"])
