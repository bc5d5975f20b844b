"""The nanobind module comfuse._core: Graph builder, partition, interpreters."""
import os

import numpy as np
import pytest

import comfuse
from comfuse import _core as C

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def postnorm_graph(m=8, k=16, n=24):
    g = C.Graph()
    x = g.input("X", C.DType.BF16, [m, k])
    w = g.input("W", C.DType.BF16, [n, k])
    b = g.input("b", C.DType.BF16, [n])
    r = g.input("R", C.DType.BF16, [m, n])
    gamma = g.input("gamma", C.DType.BF16, [n])
    beta = g.input("beta", C.DType.BF16, [n])
    h = g.matmul(x, w, transpose_b=True, name="h")
    s = g.binary(C.OpKind.Add, g.binary(C.OpKind.Add, h, b), r, "s")
    y = g.layer_norm(s, gamma, beta, 1e-5, "y")
    g.output(y)
    return g


def feed(g, seed=0):
    rng = np.random.default_rng(seed)
    return {g.node(i).name: rng.standard_normal(g.node(i).shape).astype(np.float32) for i in g.inputs}


def test_build_partition_interpret():
    g = postnorm_graph()
    p = C.partition(g)
    assert len(p.regions) == 1 and list(p.fallback) == []
    spec = p.regions[0].spec
    assert spec.num_stages() == 3
    assert (spec.gemm.rows, spec.gemm.n, spec.gemm.k, spec.gemm.transpose_b) == (8, 24, 16, True)
    assert [pp.kind for pp in spec.params] == [C.BroadcastKind.ROW, C.BroadcastKind.TILE, C.BroadcastKind.ROW,
                                               C.BroadcastKind.ROW]
    text = p.text(True)
    assert "region 0: GEMM 'h' + " in text and "reduce.mean" in text and "explain:" in text
    ins = feed(g)
    ref = C.interpret_graph(g, ins, C.Precision.F64)["y"]
    for ctas in (1, 2, 5):
        out = C.interpret_partitioned(p, ins, ctas)["y"]
        assert out.shape == (8, 24) and out.dtype == np.float32
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-2  # output rounded to bf16
    a = C.interpret_graph(g, ins)["y"]
    b = C.interpret_partitioned(p, ins, 3)["y"]
    assert np.linalg.norm(a - b) / np.linalg.norm(a) < 1e-5


def test_interpret_spec_and_eval_node():
    g = postnorm_graph()
    p = C.partition(g)
    fs = p.regions[0].spec
    ins = feed(g, 1)
    rounded = {k: C.round_to_dtype(v, C.DType.BF16) for k, v in ins.items()}
    pg = p.graph
    name = lambda i: pg.node(i).name  # noqa: E731
    outs = C.interpret_spec(fs, rounded[name(fs.gemm.a)], rounded[name(fs.gemm.b)],
                            [rounded[pp.name] for pp in fs.params], 4)
    ref = C.interpret_partitioned(p, ins, 4)["y"]
    np.testing.assert_array_equal(outs[0], ref)
    h = pg.find("h")
    v = C.eval_node(pg, h, [rounded["X"], rounded["W"]])
    np.testing.assert_allclose(v, rounded["X"].astype(np.float64) @ rounded["W"].T.astype(np.float64), rtol=1e-5,
                               atol=1e-5)


def test_rotary_embedding_partitions_into_the_pair_and_interprets_as_torch_writes_it():
    """examples/small/rope.cf: q and k with their rotary embedding in one region (two GEMMs on one A), rotate_half
    and the periodic cos / sin in its Spec; the Graph IR interpreter, the partitioned program (Spec interpreter)
    and numpy's cat(-x[..., D/2:], x[..., :D/2]) agree."""
    g = C.parse_cf(open(os.path.join(ROOT, "examples", "small", "rope.cf")).read(), "rope.cf")
    p = C.partition(g)
    assert len(p.regions) == 1 and list(p.fallback) == []
    spec = p.regions[0].spec
    assert spec.gemm.paired and [pp.kind for pp in spec.params] == [C.BroadcastKind.WEIGHT, C.BroadcastKind.PERIODIC,
                                                                    C.BroadcastKind.PERIODIC]
    assert "rotate_half[32]" in str(spec) and "broadcast.periodic" in str(spec)
    ins = feed(g, 3)
    r = {k: C.round_to_dtype(v, C.DType.BF16) for k, v in ins.items()}
    ref = C.interpret_graph(g, ins, C.Precision.F64)
    for w, out in (("Wq", "qr"), ("Wk", "kr")):
        x = (r["X"].astype(np.float64) @ r[w].T.astype(np.float64)).reshape(2, 4, 2, 32)
        rot = np.concatenate([-x[..., 16:], x[..., :16]], -1)
        want = x * r["cos"] + rot * r["sin"]
        assert np.linalg.norm(ref[out] - want) / np.linalg.norm(want) < 4e-3   # the graph's output: bf16
        got = C.interpret_partitioned(p, ins, 2)[out]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2   # stored as bf16


def test_round_to_dtype():
    x = np.array([1.0 + 2 ** -9, 1.0 + 3 * 2 ** -9, 65504.0 * 2], dtype=np.float32)
    assert list(C.round_to_dtype(x, C.DType.BF16)[:2]) == [1.0, 1.0 + 2 ** -7]
    assert np.isinf(C.round_to_dtype(x, C.DType.F16)[2])


def test_graph_errors_are_value_errors():
    g = C.Graph()
    x = g.input("x", C.DType.F32, [4, 8])
    with pytest.raises(C.GraphError, match="operands must be bf16 or f16"):
        g.matmul(x, x)
    with pytest.raises(ValueError, match="shape mismatch"):
        y = g.input("y", C.DType.F32, [3, 8])
        g.binary(C.OpKind.Add, x, y)
    with pytest.raises(ValueError):
        C.parse_cf("input x : f32[2]\ny = frob(x)\noutput y\n", "bad.cf")


def test_parse_cf_example_roundtrip():
    text = open(os.path.join(ROOT, "examples", "small", "postnorm.cf")).read()
    g = C.parse_cf(text, "postnorm.cf")
    assert C.parse_cf(g.to_cf()).to_cf() == g.to_cf()
    p = comfuse.partition(g)
    assert "3 stage(s)" in C.print_partition(p, False)
    ops = [C.op_name(n.op) for n in C.decompose(g).nodes]
    assert "layer_norm" not in ops and ops.count("mean") == 2


def test_installed_package_carries_the_kernel_headers(monkeypatch, tmp_path):
    """The wheel holds comfuse/kernels/comfuse/*.cuh, so an installed comfuse JIT-compiles without a source tree;
    ops.kernel_dir() prefers $COMFUSE_KERNEL_DIR, then the package's own copy."""
    import importlib.metadata
    import os

    from comfuse import ops

    files = {str(f) for f in importlib.metadata.files("comfuse")}
    assert "comfuse/kernels/comfuse/gemm.cuh" in files
    assert "comfuse/kernels/comfuse/abi_entry.cuh" in files
    monkeypatch.setenv("COMFUSE_KERNEL_DIR", str(tmp_path))
    assert ops.kernel_dir() == str(tmp_path)
    monkeypatch.delenv("COMFUSE_KERNEL_DIR")
    d = ops.kernel_dir()
    assert d == "" or os.path.isfile(os.path.join(d, "comfuse", "gemm.cuh"))
