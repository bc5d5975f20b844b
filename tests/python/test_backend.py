"""torch.compile(model, backend="comfuse") on CPU, its fallback reasons, and comfuse.explain."""
import importlib.metadata
import io
import logging
import math

import pytest
import torch
from torch.fx.passes.shape_prop import ShapeProp

import comfuse
from conftest import assert_fp32_match, bf16_exact, bf16_randn, messages, reference, rel_err
from models import ClassifierHead, CumsumBeforeNorm, PostNormEncoderLayer, QKVHeads, RMSNormMLP, RotaryQK, SwiGLUMLP


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
    assert_fp32_match(y, ref)
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
    assert_fp32_match(y, reference(m, x)[0])
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
        assert_fp32_match(o, r)
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
            assert_fp32_match(o, r)


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


@pytest.mark.parametrize("cc,name", [((8, 0), "NVIDIA A100-SXM4-80GB"), ((10, 0), "NVIDIA B200")])
def test_fallback_gpu_not_hopper(cc, name, monkeypatch):
    """A bf16 graph on CUDA tensors of a GPU that is not compute capability 9.0 falls back, naming the GPU. No
    GPU needed: the graph is analyzed on fake CUDA tensors, and torch.cuda reports the GPU the test gives."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from comfuse import backend

    m = RMSNormMLP().to(torch.bfloat16).eval()
    rep = comfuse.capture(m, torch.randn(2, 8, 32, dtype=torch.bfloat16))[0]
    assert rep.regions   # on the GPU this graph would have fused regions
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: name)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        inputs = [fake.from_tensor(t).to("cuda:0") for t in rep.example_inputs]
        with torch.no_grad():
            got = backend.analyze_graph(rep.gm, inputs)
    assert got.regions and got.fallback == (f"GPU {name} has compute capability {cc[0]}.{cc[1]}: ComFuse kernels "
                                            f"need 9.0 (H100/H200)")


def test_fallback_fp32_dtype(caplog):
    m = ClassifierHead().eval()
    with torch.no_grad():
        _, log = compile_and_log(caplog, m, torch.randn(4, 32))
    assert "dtype float32 GEMM 'addmm': ComFuse kernels take bf16/f16 operands" in log


def _graph_count(caplog) -> int:
    return sum("region(s), " in s and "standard path" in s for s in messages(caplog))


@pytest.mark.parametrize("runner", ["eager", "inductor"])
def test_dynamic_batch_reuses_the_graph_and_its_regions(runner, caplog):
    """A dynamic batch dim (mark_dynamic here; Dynamo does the same on a second batch size): the graph is
    analyzed once at its example size, keeps its fused regions, and later batch sizes run the same graph - the
    regions take the rows at run time - and match eager."""
    caplog.set_level(logging.INFO, logger="comfuse")
    # (as in test_reference_mode_runs_regions_through_custom_op: Inductor's own fp32 code for the encoder layer's
    # attention differs from eager by ~5e-4 with or without ComFuse, so Inductor runs the RMSNorm block here)
    m = bf16_exact(PostNormEncoderLayer() if runner == "eager" else RMSNormMLP())
    f = torch.compile(m, backend="comfuse", options={"fallback": runner, "reference": True})
    with torch.no_grad():
        for b in (2, 3, 5):
            x = bf16_randn(b, 8, 32, seed=10 + b)
            torch._dynamo.mark_dynamic(x, 0)
            y = f(x)
            assert y.shape == (b, 8, 32)
            assert_fp32_match(y, reference(m, x)[0], b)
    msgs = messages(caplog)
    assert _graph_count(caplog) == 1, msgs
    assert any("has a dynamic batch dim" in s for s in msgs)
    assert any("through the CPU reference implementation" in s for s in msgs)
    assert any("-> one ComFuse kernel" in s for s in msgs)   # the regions survive the symbolic batch


def test_dynamic_batch_after_a_second_batch_size(caplog):
    """Dynamo's automatic dynamic shapes: a second batch size recompiles once with a symbolic batch; after
    that, a third size runs without the backend being called again."""
    caplog.set_level(logging.INFO, logger="comfuse")
    m = bf16_exact(RMSNormMLP())
    f = torch.compile(m, backend="comfuse", options={"fallback": "eager", "reference": True})
    with torch.no_grad():
        for b in (2, 3, 4, 7):
            x = bf16_randn(b, 8, 32, seed=20 + b)
            assert_fp32_match(f(x), reference(m, x)[0], b)
    assert _graph_count(caplog) == 2   # static at b=2, then one dynamic graph for every other size
    assert sum("has a dynamic batch dim" in s for s in messages(caplog)) == 1


def test_dynamic_sequence_dim_keeps_the_regions_that_take_their_rows_from_a(caplog):
    """dynamic=True makes the sequence dim symbolic too. The regions whose outputs have their GEMM's leading dims
    stay fused (the op takes A's [B, S] at run time, and the rewrite builds its reshapes from the graph's own
    size values); a region whose A is flattened to [B*S, K] while its output is [B, S, N] is left to torch, with
    that reason. One graph serves every batch and sequence length, and matches eager."""
    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(0)
    for make, lost in ((RMSNormMLP, 0), (PostNormEncoderLayer, 1)):
        caplog.clear()
        m = _bf16(make())
        f = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep"}, dynamic=True)
        with torch.no_grad():
            for b, sq in ((2, 8), (3, 5), (4, 11)):
                x = torch.randn(b, sq, 32, dtype=torch.bfloat16)
                y = f(x)
                assert y.shape == x.shape and rel_err(y.float(), m(x).float()) <= 2e-2, (make.__name__, b, sq)
        msgs = messages(caplog)
        assert sum("and other dynamic leading dims (e.g. the sequence)" in s for s in msgs) == 1, msgs
        assert sum("region(s) run as ComFuse kernels" in s for s in msgs) == 1, msgs
        assert sum("its outputs regroup the GEMM's rows" in s for s in msgs) == lost, msgs
    # the IR rewrite (reference mode's default) has no form for a second dynamic dim: the same regions, kept ATen
    x = bf16_randn(2, 8, 32, seed=31)
    m = bf16_exact(PostNormEncoderLayer())
    with torch.no_grad():
        y = torch.compile(m, backend="comfuse", options={"fallback": "eager", "reference": True}, dynamic=True)(x)
        assert rel_err(y, reference(m, x)[0]) <= 2e-3


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
    assert len(e.regions) == 5   # q and k: one region of two GEMMs on one A
    assert "ComFuse explain: 1 graph(s) captured" in text
    assert "8 GEMM(s), 5 fused region(s)" in text
    assert "backend: falls back: dtype float32 GEMM 'addmm'" in text
    assert ("addmm_3 = aten.addmm.default(float32[32], float32[16, 32], float32[32, 32]) -> float32[16, 32]: "
            "epilogue fused: region 2 (15 epilogue node(s), 3 stage(s))") in text
    # q and k: one region, each line naming the other GEMM
    assert "epilogue fused: region 0 (4 epilogue node(s), 1 stage(s), with GEMM 'addmm_1.mm' on the same A)" in text
    assert "epilogue fused: region 0 (4 epilogue node(s), 1 stage(s), with GEMM 'addmm.mm' on the same A)" in text
    assert ("bmm = aten.bmm.default(float32[4, 8, 16], float32[4, 16, 8]) -> float32[4, 8, 8]: epilogue NOT fused: "
            "batched matmul (B is [4, 16, 8], with batch dims): runs on the standard path") in text
    assert "splits the row into blocks that no op of the region reads" in text   # the attention heads' view
    assert "gemm: rows=16 N=32 K=64 bf16 B=[N,K], 3 stage(s)" in text
    assert "reduce.mean %5 -> stage 1 bypass(%5)" in text
    # the planner's decision, with its basis, for every region (pinned: the measured table is compiled in)
    assert "plan (from the measured table; a declined region runs unfused, but for a near tie the GPU times faster):" in text
    assert "  region 2: fuse: measured " in text and "for 'postnorm' [" in text


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


@pytest.mark.parametrize("make", [PostNormEncoderLayer, RMSNormMLP, ClassifierHead, SwiGLUMLP])
def test_region_fallback_in_torch_matches_the_reference(make):
    """What a fused_region call runs if its kernel fails to launch on the GPU (with a warning): the region node by
    node in torch. It must give the reference implementation's values, shapes and dtypes."""
    from comfuse import ops

    m = bf16_exact(make())
    x = bf16_randn(2, 8, 32, seed=41)
    rep = comfuse.capture(m, x)[0]
    gm = rep.analysis.program.rewrite()
    checked = []

    class Check(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            out = super().call_function(target, args, kwargs)
            if target is torch.ops.comfuse.fused_region.default:
                key, inputs = args
                alt = ops._run_fallback(key, list(inputs))
                for a, o in zip(alt, out):
                    assert a.shape == o.shape and a.dtype == o.dtype
                    assert_fp32_match(a, o, key)
                checked.append(key)
            return out

    Check(gm).run(*rep.example_inputs)
    assert len(checked) == len(rep.regions) >= 1


def _bf16(model):
    return model.to(torch.bfloat16).eval()


def _captured_bf16(make):
    """A bf16 model of `make`, its input, its one captured graph's report and program, and all its regions."""
    torch.manual_seed(3)
    m = _bf16(make())
    x = bf16_randn(2, 8, 32, seed=42).to(torch.bfloat16)
    rep = comfuse.capture(m, x)[0]
    return m, x, rep, rep.analysis.program, set(range(len(rep.regions)))


def test_fused_calls_get_dense_inputs_inside_inductor(monkeypatch, caplog):
    """Inductor lays out a custom op's inputs freely unless the op's node says which strides it needs (a node a
    pass inserts has no eager strides). The ComFuse calls say: dense. Without it, HF Llama's rotary tables (cos and
    sin from a transposed bmm) reached the kernel transposed, and the C++ fast path handed every call of that
    region to Python, which copied them (~180 us of host time per call on the H200 machine)."""
    from comfuse import ops

    seen = []
    real = ops._np32

    def record(t):   # the CPU reference implementation's view of each input, as Inductor passes it
        seen.append((tuple(t.shape), t.is_contiguous()))
        return real(t)

    monkeypatch.setattr(ops, "_np32", record)
    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(3)
    m = _bf16(RotaryQK(64, 2, hf_freqs=True))
    x = bf16_randn(4, 48, 64, seed=43).to(torch.bfloat16)
    f = torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep", "fuse": "all"})
    with torch.no_grad():
        got, ref = f(x), m(x)
    assert any("1 region(s) run as ComFuse kernels" in s for s in messages(caplog)), messages(caplog)
    assert len(seen) == 5 and (4, 48, 1, 32) in [s for s, _ in seen], seen   # A, B, B2, cos, sin
    assert all(dense for _, dense in seen), seen
    for a, b in zip(got, ref):
        assert rel_err(a.float(), b.float()) < 2e-2


@pytest.mark.parametrize("make", [PostNormEncoderLayer, RMSNormMLP, ClassifierHead, CumsumBeforeNorm, SwiGLUMLP, RotaryQK])
def test_rewrite_keeping_torch_changes_only_the_fused_regions(make):
    """The GPU path's rewrite: each fused region one comfuse::fused_region call, every other ATen node copied as
    it was (bf16 stays bf16; no Graph IR matmul re-emitted), same values as eager within bf16 rounding and as
    the Graph IR rewrite."""
    from comfuse import ops

    m, x, rep, prog, fuse = _captured_bf16(make)
    gm = prog.rewrite_keeping_torch(fuse)
    calls = [n for n in gm.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
    assert len(calls) == len(rep.regions) >= 1
    evals = [n for n in gm.graph.nodes if n.target is ops.eval_graph_node]
    assert all(comfuse.OpKind(n.args[0][0]) != comfuse.OpKind.MatMul for n in evals)   # helpers only
    kept = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    orig = {n.target for n in rep.analysis.conv.torch_nodes}
    assert orig <= kept   # torch nodes (cumsum, ...) stay
    # No cast to a value's own dtype: Inductor realizes one as a copy kernel per call (a weight, an activation).
    gm.graph.lint()
    ShapeProp(gm).propagate(*rep.example_inputs)
    same = [n.name for n in gm.graph.nodes if n.target == torch.ops.prims.convert_element_type.default
            and n.args[0].meta["tensor_meta"].dtype == n.args[1]]
    assert not same, same
    # A value one fused call stores and another takes (a tile parameter, a GEMM operand) is stored in the dtype the
    # reader takes: otherwise each call converts it first (a copy kernel per call)
    stored = {prog.pg.find(o.name): o.dtype for n in calls for o in ops.region_spec(n.args[0]).outputs}
    for n in calls:
        spec = ops.region_spec(n.args[0])
        taken = [(p.node, p.dtype) for p in spec.params] + [(spec.gemm.a, spec.gemm.dtype), (spec.gemm.b, spec.gemm.dtype)]
        for gid, dt in taken:
            assert stored.get(gid, dt) == dt, (prog.pg.node(gid).name, stored[gid], dt)
    if make is SwiGLUMLP:   # gate and up: one call of two GEMMs, up's weight its B2 parameter; no mm left for them
        paired = [ops.region_spec(n.args[0]) for n in calls if ops.region_spec(n.args[0]).gemm.paired]
        assert len(paired) == 1 and len(calls) == 2, [ops.region_spec(n.args[0]).gemm.paired for n in calls]
        assert sum(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes) == 0
    if make is RotaryQK:   # q and k with their rotation: one call; the transposes to [B, H, S, D] stay views after it
        assert len(calls) == 1
        spec = ops.region_spec(calls[0].args[0])
        assert spec.gemm.paired and sum(p.kind == comfuse._core.BroadcastKind.PERIODIC for p in spec.params) == 2
        assert not any(n.target is torch.ops.aten.cat.default for n in gm.graph.nodes)
    if make is PostNormEncoderLayer:
        assert torch.ops.aten.bmm.default in kept   # attention: not fused, kept as ATen bmm
        # q/k/v: read by bf16 ATen views, so the kernel stores bf16 (the Graph IR hands on f32)
        by_gemm = {r.spec.gemm.node: r.spec for r in rep.regions}
        stored = [(ops.region_spec(n.args[0]).outputs[0].dtype,
                   by_gemm[ops.region_spec(n.args[0]).gemm.node].outputs[0].dtype) for n in calls]
        assert (comfuse.DType.BF16, comfuse.DType.F32) in stored, stored
    with torch.no_grad():
        got = gm(*rep.example_inputs)
        ir = prog.rewrite(fuse=fuse)(*rep.example_inputs)
        ref = m(x)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for a, b, c in zip(got, ir, refs):
        assert a.dtype == c.dtype and a.shape == c.shape
        assert rel_err(a.float(), c.float()) <= 2e-2
        assert rel_err(a.float(), b.float()) <= 2e-2


@pytest.mark.parametrize("fused", [True, False])
def test_copies_of_attention_heads_become_views_of_a_dense_output(fused):
    """GPT-2's QKV projection split into q, k and v (fused), and Llama's v projection (not fused), k and v copied
    for the key / value cache as HF's cache does (a clone that keeps the layout): the region's kernel stores the
    split output part by part ([T, B*S, C]), each part is a dense select of it, and the copies are gone; values and
    the cache tensors' strides as eager (the CPU reference of the kernel, laid out as the kernel stores). The
    planner prices the copies it saves."""
    from comfuse import ops

    torch.manual_seed(3)
    m = _bf16(QKVHeads(32, 2, fused=fused))
    x = bf16_randn(2, 8, 32, seed=42).to(torch.bfloat16)
    rep = comfuse.capture(m, x)[0]
    prog = rep.analysis.program
    (ri, lays), = prog.splits.items()
    lay = lays[0]
    assert (lay.part, lay.copies, len(lay.roots)) == ((32, 2, 3) if fused else (32, 1, 1))
    plain = comfuse._core.plan_region(rep.regions[ri].spec)
    plan = rep.plans[ri]
    if fused:   # a split output: its copies go only with the kernel's layout
        assert plan.copy_us > 0 and plan.pass_us == pytest.approx(plain.pass_us + plan.copy_us)
    else:       # not split: cuBLAS's output is as dense as the kernel's (the rewrite drops the copy either way)
        assert plan.copy_us == 0 and plan.pass_us == plain.pass_us == 0 and plan.cublas_alone
    with torch.no_grad():
        ref = m(x)
    fused_gm = prog.rewrite_keeping_torch({ri})
    for fuse in ({ri}, set()):
        gm = fused_gm if fuse else prog.rewrite_keeping_torch(fuse)
        gm.graph.lint()
        calls = [n for n in gm.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
        assert len(calls) == len(fuse)
        clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
        # unfused, the split's parts are column slices: their copies stay; a GEMM's own output is dense
        assert len(clones) == (2 if fused and not fuse else 0), gm.graph
        with torch.no_grad():
            got = gm(*rep.example_inputs)
        for a, b in zip(got, ref):
            assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
            assert rel_err(a.float(), b.float()) <= 2e-2
    spec = ops.region_spec(next(n for n in fused_gm.graph.nodes
                                if n.target is torch.ops.comfuse.fused_region.default).args[0])
    o = spec.outputs[0]
    if fused:
        assert o.split and o.part_cols == 32 and [int(d) for d in o.shape][-2:] == [3, 32], str(spec)
        assert "stored in parts: [3, rows, 32]" in str(spec)
    else:
        assert not o.split and o.copies == 1


def test_copies_that_change_the_layout_stay_and_an_epilogue_prices_the_copies_it_saves():
    """`.contiguous()` on transposed heads copies to [B, H, S, D], not the view's layout: it stays, and nothing is
    stored in parts. Llama's v projection with an epilogue (here a scale): unfused, the copy would read the
    epilogue pass's output, so the region saves it, and the planner's pass counts it."""
    torch.manual_seed(3)
    x = bf16_randn(2, 8, 32, seed=42).to(torch.bfloat16)
    m = _bf16(QKVHeads(32, 2, fused=True, contiguous=True))
    rep = comfuse.capture(m, x)[0]
    prog = rep.analysis.program
    assert prog.splits == {}
    gm = prog.rewrite_keeping_torch(set(range(len(rep.regions))))
    assert sum(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes) == 2
    with torch.no_grad():
        for a, b in zip(gm(*rep.example_inputs), m(x)):
            assert a.stride() == b.stride() and rel_err(a.float(), b.float()) <= 2e-2

    m = _bf16(QKVHeads(32, 2, fused=False, scale=0.5))
    rep = comfuse.capture(m, x)[0]
    prog = rep.analysis.program
    (ri, lays), = prog.splits.items()
    plain = comfuse._core.plan_region(rep.regions[ri].spec)
    plan = rep.plans[ri]
    assert not plan.cublas_alone and plan.copy_us == 0 and plan.pass_us > plain.pass_us   # 2 x 2 bytes x 16 x 32
    gm = prog.rewrite_keeping_torch({ri})
    assert not any(n.target is torch.ops.aten.clone.default for n in gm.graph.nodes)
    with torch.no_grad():
        for a, b in zip(gm(*rep.example_inputs), m(x)):
            assert a.stride() == b.stride() and rel_err(a.float(), b.float()) <= 2e-2


def test_an_output_is_stored_in_whole_parts_of_16_byte_blocks():
    """spec.with_parts refuses parts it cannot lay out, with the reason; one part is the row-major layout."""
    spec = comfuse._core.partition(comfuse.parse_cf(
        "input X : bf16[16, 32]\ninput W : bf16[32, 48]\ninput b : bf16[48]\ny = add(matmul(X, W), b)\noutput y\n",
        "h.cf")).regions[0].spec
    with pytest.raises(ValueError, match="not whole parts of 32"):
        spec.with_parts(0, 32, 1)
    with pytest.raises(ValueError, match="16-byte store blocks"):
        spec.with_parts(0, 12, 1)
    with pytest.raises(ValueError, match="output 1 of 1"):
        spec.with_parts(1, 16, 1)
    with pytest.raises(ValueError, match="4 copies of 3 part"):
        spec.with_parts(0, 16, 4)
    h = spec.with_parts(0, 16, 2)
    assert list(h.outputs[0].shape) == [16, 3, 16] and h.structural_hash() != spec.structural_hash()
    assert h.outputs[0].split and h.outputs[0].copies == 2
    h.verify()
    with pytest.raises(ValueError, match="already stored in parts"):
        h.with_parts(0, 16, 2)
    assert list(h.with_rows(40).outputs[0].shape) == [40, 3, 16]
    one = spec.with_parts(0, 48, 1)
    assert not one.outputs[0].split and list(one.outputs[0].shape) == [16, 48]
    assert one.structural_hash() == spec.structural_hash()


@pytest.mark.parametrize("rewrite,make", [("keep", PostNormEncoderLayer), ("ir", PostNormEncoderLayer),
                                          ("keep", SwiGLUMLP)])
def test_dynamic_batch_bf16_through_both_rewrites(rewrite, make, caplog):
    """A bf16 model with a dynamic batch through the backend (regions on the CPU reference implementation), with
    either way of writing the nodes outside the regions: one graph for every batch size, values as eager. (Both
    models hold a region of two GEMMs on one A: Q + K, SwiGLU's gate + up.)"""
    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(4)
    m = _bf16(make())
    f = torch.compile(m, backend="comfuse", options={"fallback": "eager", "reference": True, "rewrite": rewrite})
    with torch.no_grad():
        for b in (2, 3, 5):
            x = bf16_randn(b, 8, 32, seed=50 + b).to(torch.bfloat16)
            torch._dynamo.mark_dynamic(x, 0)
            assert rel_err(f(x).float(), m(x).float()) <= 2e-2, b
    msgs = messages(caplog)
    assert _graph_count(caplog) == 1, msgs
    assert not any("re-emitted from the Graph IR" in s for s in msgs), msgs


def test_gpu_path_orchestration_with_stand_in_kernels(monkeypatch, caplog):
    """_with_kernels as the GPU path runs it, with the JIT and the kernels replaced by stand-ins: the planner's
    regions become calls in the ATen-keeping rewrite, each distinct kernel is compiled once (in parallel), then
    every region's kernel is loaded; a compile failure falls back to the original graph with a warning."""
    from comfuse import backend, ops

    caplog.set_level(logging.INFO, logger="comfuse")
    compiled, loaded = [], []

    class Kernel:
        name, config, transport, cache_hit, compile_seconds = "stand_in", "128x128x64_c1x1", "none", True, 0.0
        config_reason = ("the prior, measured best; the prior 128x192x64_c2x1 spills registers: 128x128x64_c1x1 "
                         "(no spills) runs instead")
        spill_note = "the prior 128x192x64_c2x1 spills registers: 128x128x64_c1x1 (no spills) runs instead"

    monkeypatch.setattr(ops, "compile_kernel", lambda key: compiled.append(ops.region_spec(key).structural_hash()))
    monkeypatch.setattr(ops, "gpu_kernel", lambda key: loaded.append(key) or Kernel())
    m = _bf16(PostNormEncoderLayer())
    x = bf16_randn(2, 8, 32, seed=60).to(torch.bfloat16)
    rep = comfuse.capture(m, x)[0]
    target = backend._with_kernels(rep, rep.gm, 1, fuse_all=True)
    calls = [n for n in target.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
    assert len(calls) == len(loaded) == len(rep.regions) == 5   # q and k: one region of two GEMMs on one A
    assert sorted(compiled) == sorted(set(compiled))          # each distinct kernel compiled once
    assert not any(n.target is ops.eval_graph_node and comfuse.OpKind(n.args[0][0]) == comfuse.OpKind.MatMul
                   for n in target.graph.nodes)               # ATen-keeping rewrite: attention stays ATen
    assert not any("re-emitted from the Graph IR" in s for s in messages(caplog))
    # a kernel whose prior config spilled says which config runs instead (RegionKernel.config_reason)
    assert any("[128x128x64_c1x1, transport none] (cache hit) (the prior 128x192x64_c2x1 spills registers: "
               "128x128x64_c1x1 (no spills) runs instead)" in s for s in messages(caplog)), messages(caplog)

    def broken(key):
        raise RuntimeError("nvcc failed (stand-in)")

    monkeypatch.setattr(ops, "compile_kernel", broken)
    assert backend._with_kernels(rep, rep.gm, 1, fuse_all=True) is rep.gm
    assert any(r.levelno == logging.WARNING and "could not be prepared" in r.getMessage() for r in caplog.records)


class _RandomBlock(torch.nn.Module):
    """Linear layers followed by a random chain of epilogue ops (some fusable, some not)."""

    OPS = ["gelu", "relu", "tanh", "sigmoid", "silu", "residual", "scale", "layernorm", "rmsnorm", "softmax",
           "cumsum", "linear", "transpose2", "square"]

    def __init__(self, seed, d=32):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.ops = [self.OPS[int(i)] for i in torch.randint(len(self.OPS), (int(torch.randint(2, 7, (1,), generator=g)),),
                                                            generator=g)]
        self.lins = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(1 + self.ops.count("linear")))
        self.ln = torch.nn.LayerNorm(d)
        self.rms = torch.nn.RMSNorm(d)

    def forward(self, x):
        h, li = self.lins[0](x), 1
        for op in self.ops:
            if op == "linear":
                h, li = self.lins[li](h), li + 1
            elif op == "residual":
                h = h + x
            elif op == "scale":
                h = h * 0.5
            elif op == "layernorm":
                h = self.ln(h)
            elif op == "rmsnorm":
                h = self.rms(h)
            elif op == "softmax":
                h = torch.softmax(h, -1)
            elif op == "cumsum":
                h = h.cumsum(-1)
            elif op == "transpose2":
                h = h.transpose(-1, -2).contiguous().transpose(-1, -2)
            elif op == "square":
                h = h * h
            else:
                h = getattr(torch, op)(h) if op in ("tanh", "sigmoid") else getattr(torch.nn.functional, op)(h)
        return h


def test_rewrite_keeping_torch_on_random_blocks():
    """Random Linear + epilogue chains in bf16: the ATen-keeping rewrite (every region fused) either runs and
    matches eager within bf16 rounding, or says why it cannot (NotKeepable) - never a wrong answer."""
    from comfuse.program import NotKeepable

    kept = 0
    for seed in range(24):
        torch._dynamo.reset()   # a fresh module class body each time: stay under Dynamo's recompile limit
        torch.manual_seed(seed)
        m = _bf16(_RandomBlock(seed))
        x = bf16_randn(2, 8, 32, seed=100 + seed).to(torch.bfloat16)
        rep = comfuse.capture(m, x)[0]
        if rep.analysis is None or not rep.regions:
            continue
        try:
            gm = rep.analysis.program.rewrite_keeping_torch(set(range(len(rep.regions))))
        except NotKeepable:
            continue
        kept += 1
        with torch.no_grad():
            got, ref = gm(*rep.example_inputs)[0], m(x)
        assert got.shape == ref.shape and got.dtype == ref.dtype, (seed, m.ops)
        assert rel_err(got.float(), ref.float()) <= 3e-2, (seed, m.ops, rel_err(got.float(), ref.float()))
    assert kept >= 12


# ---------------------------------------------------------------- per-region decisions

def _gpu_analysis(monkeypatch, rep, **kw):
    """analyze_graph of a captured graph on fake CUDA tensors of an sm_90 GPU (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from comfuse import _core, backend

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(_core, "unsupported_device_reason", lambda i: "")
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        inputs = [fake.from_tensor(t).to("cuda:0") for t in rep.example_inputs]
        with torch.no_grad():
            return backend.analyze_graph(rep.gm, inputs, **kw)


def test_fp32_gemm_among_bf16_ones_stays_in_torch_and_the_rest_fuses(monkeypatch, caplog):
    """One fp32 bmm in a bf16 graph: that GEMM stays in torch in fp32 (with its reason, in the report and in
    explain), the bf16 GEMMs' regions still fuse, and the graph as a whole does not fall back."""
    from comfuse import backend, ops
    from models import MixedDtypeBlock

    m = _bf16(MixedDtypeBlock())
    assert m.inv_freq.dtype == torch.float32
    x = bf16_randn(2, 8, 32, seed=70).to(torch.bfloat16)
    rep = comfuse.capture(m, x)[0]
    kept = {n.name: r for n, r in rep.analysis.conv.torch_nodes.items() if n.target == torch.ops.aten.bmm.default}
    assert len(kept) == 1 and next(iter(kept.values())).startswith("dtype float32 GEMM: ComFuse kernels take bf16/f16")
    roots = sorted(rep.analysis.part.graph.node(r.root).name for r in rep.regions)
    assert len(roots) == 2, roots                                  # up + GELU, down + residual + LayerNorm
    assert rep.fallback.startswith("CPU tensors")                  # on the CPU: the device, not the dtype
    got = _gpu_analysis(monkeypatch, rep)
    assert got.fallback is None and len(got.regions) == 2, got.fallback
    # explain shows the same per-region decision
    text = backend_report_text(got)
    bmm_line = next(line for line in text.splitlines() if "aten.bmm" in line and "= aten.bmm" in line)
    assert "left in torch: dtype float32 GEMM" in bmm_line, text
    assert text.count("epilogue fused: region") == 2, text
    # the GPU path's rewrite: two fused calls, the bmm still an fp32 aten.bmm; it runs (CPU reference op)
    monkeypatch.setattr(ops, "compile_kernel", lambda key: None)

    class Kernel:
        name, config, transport, cache_hit, compile_seconds = "stand_in", "128x128x64_c1x1", "none", True, 0.0
        config_reason = "the prior alone (RegionKernel does not search)"
        spill_note = ""

    monkeypatch.setattr(ops, "gpu_kernel", lambda key: Kernel())
    target = backend._with_kernels(rep, rep.gm, 1, fuse_all=True)
    calls = [n for n in target.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
    bmms = [n for n in target.graph.nodes if n.target is torch.ops.aten.bmm.default]
    assert len(calls) == 2 and len(bmms) == 1 and bmms[0].meta["val"].dtype == torch.float32
    with torch.no_grad():
        out, ref = target(*rep.example_inputs)[0], m(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert rel_err(out.float(), ref.float()) <= 2e-2


def backend_report_text(rep):
    from comfuse.report import report_text
    return report_text(rep)


def test_all_fp32_graph_still_falls_back_as_a_whole():
    """Nothing can run when every GEMM is fp32: the whole graph falls back with the dtype reason."""
    from comfuse import backend
    rep = comfuse.capture(ClassifierHead().eval(), torch.randn(4, 32))[0]
    assert rep.fallback.startswith("dtype float32 GEMM 'addmm'")
    assert not any("dtype float32" in r for r in rep.analysis.conv.torch_nodes.values())
    assert backend.dtype_reason(rep.analysis.conv.gm).startswith("dtype float32 GEMM")


def test_graph_with_no_float_op_says_so_instead_of_no_outputs(caplog):
    """Reliability: a graph of int64 ops only reached the Graph IR empty ("graph has no outputs")."""
    class IntOnly(torch.nn.Module):
        def forward(self, i):
            return (i * 3 + 1).sum(-1)

    reps = comfuse.capture(IntOnly(), torch.arange(12).reshape(3, 4))
    assert reps and all(r.error is None for r in reps)
    text = " ".join(r.fallback or "" for r in reps)
    assert "no op of this graph is in the Graph IR" in text, text
    assert "has no outputs" not in text


def test_planned_regions_the_gpu_shows_slower_are_not_fused(monkeypatch, caplog):
    """The planner's choice is checked at the graph's own shapes (backend.measure_fused): a region whose kernel
    takes longer than its cuBLAS GEMM plus the epilogue's memory pass, or wins by less than the margin
    (backend.MEASURE_MARGIN), goes back to torch, with both times logged
    (here as under a CUDA graph, no host time: the next test has that);
    the others stay fused calls. A GEMM with at most a bias is held to the GEMM alone (cuBLAS adds a bias)."""
    from comfuse import backend, ops

    m, x, rep, prog, fuse = _captured_bf16(PostNormEncoderLayer)
    target = prog.rewrite_keeping_torch(fuse)
    reduces = {ri for ri in fuse if rep.regions[ri].spec.num_stages() > 1}
    alone = {ri for ri in fuse if rep.plans[ri].cublas_alone}
    assert reduces and alone and not reduces & alone
    by_gemm = {rep.regions[ri].spec.gemm.node: ri for ri in fuse}
    slow = min(reduces)
    ties = {max(reduces)} - {slow}
    assert ties, reduces
    assert all(rep.plans[ri].pass_us > 0 for ri in reduces)

    def timer(key):   # (fused us, GEMM us): region `slow` 3x its GEMM, GEMM-and-bias regions 1.01x, a tie 0.98x
        ri = by_gemm[ops.region_spec(key).gemm.node]    # the GEMM and its pass, the rest 0.8x
        unfused = 10.0 + rep.plans[ri].pass_us
        return (30.0 if ri == slow else 10.1 if ri in alone else 0.98 * unfused if ri in ties else 0.8 * unfused), 10.0

    monkeypatch.setattr(comfuse.analysis, "prepare_kernels", lambda rep, target: True)
    with caplog.at_level(logging.INFO, logger="comfuse"):
        kept, new = backend.drop_measured_losers(rep, fuse, target, prog.rewrite_keeping_torch, timer, host_us=0.0)
    assert kept == fuse - {slow} - alone - ties, (kept, slow, alone, ties)
    assert kept, "nothing left fused: the test needs a region that wins"
    calls = [n for n in new.graph.nodes if n.target is torch.ops.comfuse.fused_region.default]
    assert {by_gemm[ops.region_spec(n.args[0]).gemm.node] for n in calls} == kept
    assert any(f"region {slow}: on this GPU the kernel takes 30.0 us" in r.getMessage() and "not fused" in r.getMessage()
               for r in caplog.records)
    # a win smaller than the timing's noise is a tie, and stays in torch, so that two compiles decide alike
    assert all(any(f"region {ri}:" in r.getMessage() and "a tie" in r.getMessage() for r in caplog.records)
               for ri in ties)
    with torch.no_grad():
        got = new(*rep.example_inputs)
        ref = m(x)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for a, c in zip(got, refs):
        assert rel_err(a.float(), c.float()) <= 2e-2
    # every region losing: nothing left to rewrite
    _, none = backend.drop_measured_losers(rep, fuse, target, prog.rewrite_keeping_torch, lambda k: (99.0, 1.0),
                                           host_us=0.0)
    assert none is None

    def broken(key):
        raise RuntimeError("launch failed")

    # a kernel that cannot be timed is not fused (a warning), and nothing raises
    _, none = backend.drop_measured_losers(rep, fuse, target, prog.rewrite_keeping_torch, broken, host_us=0.0)
    assert none is None


def test_the_planners_near_ties_are_timed_on_the_gpu(monkeypatch, caplog):
    """With the GPU check (fuse="planner" on a GPU), a region the planner's estimate declines for speed only, by at
    most backend.NEAR_TIE, is compiled and timed with the planner's choice and fused where it wins there (HF Llama's
    o_proj + residual + RMSNorm: estimated ~60 us, 42 us on the H200). One declined by more, or for another
    reason, is not timed; nor is a near tie without the GPU check. An estimate that holds on the GPU keeps it in
    torch."""
    from types import SimpleNamespace as NS

    from comfuse import backend, ops

    m, x, rep, prog, fuse = _captured_bf16(PostNormEncoderLayer)
    assert len(fuse) >= 3
    fields = ("fuse", "verdict", "reason", "fused_us", "unfused_us", "pass_us", "cublas_alone", "copy_us")
    real = [NS(**{f: getattr(p, f) for f in fields}) for p in rep.plans]
    near, far, other = sorted(fuse)[:3]
    plans = [NS(**vars(p)) for p in real]
    V = comfuse._core.Verdict
    for ri, fused, verdict, why in ((near, 130.0, V.Slower, "fusion does not pay: ..."),
                                    (far, 140.0, V.Slower, "fusion does not pay: ..."),
                                    (other, 110.0, V.CannotServe, "a row spans 200 tiles: ...")):
        plans[ri].fuse, plans[ri].verdict, plans[ri].reason = False, verdict, why
        plans[ri].fused_us, plans[ri].unfused_us = fused, 100.0
    monkeypatch.setattr(rep, "plans", plans)
    assert backend.near_ties(rep) == {near}
    planned = fuse - {near, far, other}
    assert backend.fused_set(rep, timed=True) == planned | {near}
    assert backend.fused_set(rep) == planned
    assert backend.fused_set(rep, fuse_all=True, timed=True) == planned | {near, far}   # "all": no timing needed
    with caplog.at_level(logging.INFO, logger="comfuse"):
        backend.log_plans(rep, planned | {near}, timed=True)
    assert f"region {near}: to be timed on this GPU (a near tie" in " ".join(messages(caplog))

    by_gemm = {rep.regions[ri].spec.gemm.node: ri for ri in fuse}
    winner = {near: True}

    def timer(key):   # every kernel 0.7x its GEMM and pass; the near tie as `winner` says
        ri = by_gemm[ops.region_spec(key).gemm.node]
        unfused = 10.0 + plans[ri].pass_us
        return (0.7 if winner.get(ri, True) else 1.2) * unfused, 10.0

    monkeypatch.setattr(comfuse.analysis, "prepare_kernels", lambda rep, target: True)
    timed = planned | {near}
    target = prog.rewrite_keeping_torch(timed)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="comfuse"):
        kept, new = backend.drop_measured_losers(rep, timed, target, prog.rewrite_keeping_torch, timer, host_us=0.0)
    assert kept == timed
    msg = next(s for s in messages(caplog) if f"region {near}:" in s)
    assert msg.endswith("fused (a near tie the planner's estimate declined, timed here)"), msg
    winner[near] = False   # the GPU agrees with the estimate: back to torch, and said so
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="comfuse"):
        kept, new = backend.drop_measured_losers(rep, timed, target, prog.rewrite_keeping_torch, timer, host_us=0.0)
    assert kept == planned
    assert {by_gemm[ops.region_spec(n.args[0]).gemm.node] for n in new.graph.nodes
            if n.target is torch.ops.comfuse.fused_region.default} == planned
    msg = next(s for s in messages(caplog) if f"region {near}:" in s)
    assert "not fused (slower than the GEMM and a separate pass) (a near tie" in msg, msg


def test_a_dynamic_graph_also_times_its_regions_at_a_smaller_size(monkeypatch, caplog):
    """A graph with dynamic sizes runs the kernels compiled for its example sizes at every size: measure_fused also
    times each at a quarter of the batch, a few rows past whole tiles (probe_lead), with the same kernel, and a
    region slower there than its GEMM and pass (scaled to those rows) by more than the margin goes back to torch,
    though it wins at the example sizes. A static graph is timed once."""
    from comfuse import backend, ops

    m, x, rep, prog, fuse = _captured_bf16(PostNormEncoderLayer)
    target = prog.rewrite_keeping_torch(fuse)
    by_gemm = {rep.regions[ri].spec.gemm.node: ri for ri in fuse}
    loser = min(fuse)
    rows = int(rep.regions[loser].spec.gemm.rows)
    calls = []

    def timer(key, lead=None):   # every kernel 0.7x its GEMM and pass; at the probe, `loser` 2x
        calls.append(lead)
        ri = by_gemm[ops.region_spec(key).gemm.node]
        scale = 1.0 if lead is None else math.prod(lead) / rows
        unfused = (10.0 + rep.plans[ri].pass_us) * scale
        return (2.0 if lead is not None and ri == loser else 0.7) * unfused, 10.0 * scale

    assert backend.probe_lead(rep.regions[loser].spec) is None   # 16 rows: too few to probe
    monkeypatch.setattr(comfuse.measure, "probe_lead", lambda spec: (2, 3))
    assert backend.measure_fused(rep, target, fuse, timer, host_us=0.0) == set() and set(calls) == {None}
    monkeypatch.setattr(rep.analysis.conv, "dynamic", True)
    calls.clear()
    with caplog.at_level(logging.INFO, logger="comfuse"):
        lost = backend.measure_fused(rep, target, fuse, timer, host_us=0.0)
    assert lost == {loser} and set(calls) == {None, (2, 3)}, (lost, calls)
    msg = next(s for s in messages(caplog) if f"region {loser}:" in s)
    assert "at 6 rows (a smaller size of this dynamic graph)" in msg and \
        "slower than the GEMM and a separate pass at 6 rows" in msg, msg


def test_the_smaller_size_a_dynamic_graph_is_timed_at():
    """probe_lead: a quarter of the batch, the last leading dim a little longer, so that the rows are a few past a
    whole number of 128-row tiles (where one more row block can cost a second wave); A flattened to whole sequences
    where an output is not laid out over A's leading dims; nothing below 1024 rows."""
    from types import SimpleNamespace as NS

    from comfuse import backend

    def spec(out_shape, outputs=None):
        n = out_shape[-1]
        return NS(gemm=NS(out_shape=out_shape, n=n),
                  outputs=outputs or [NS(shape=out_shape, per_row=False)])

    assert backend.probe_lead(spec([16, 512, 1024])) == (4, 514)          # 2056 rows: 16 tiles + 8 rows
    assert backend.probe_lead(spec([32, 256, 768])) == (8, 257)           # 2056 rows
    assert backend.probe_lead(spec([8192, 768])) == (2056,)
    assert backend.probe_lead(spec([1, 512, 768])) is None                # no quarter of one sequence
    assert backend.probe_lead(spec([8, 512, 768])) == (2, 516)
    # an output with its own leading dims ([B*S/8, 8, N]): whole sequences, A flattened
    assert backend.probe_lead(spec([16, 512, 64], [NS(shape=[1024, 8, 64], per_row=False)])) == (2048,)


def test_outside_a_cuda_graph_a_region_must_win_back_its_host_time(monkeypatch, caplog):
    """A fused_region call costs host time the launches it replaces do not (backend.HOST_US_PER_CALL): outside a
    CUDA graph, a kernel that beats its GEMM and pass by less goes back to torch, since a model of short kernels
    waits on the host (HF BERT-base ran 0.80x Inductor default that way). Under reduce-overhead's CUDA graphs
    nothing is issued per call and the same kernel stays fused."""
    from comfuse import backend, ops

    m, x, rep, prog, fuse = _captured_bf16(PostNormEncoderLayer)
    target = prog.rewrite_keeping_torch(fuse)
    monkeypatch.setattr(comfuse.analysis, "prepare_kernels", lambda rep, target: True)
    monkeypatch.delenv("COMFUSE_HOST_US", raising=False)
    monkeypatch.setattr(ops, "_FAST", False)   # the op's Python kernel
    assert all(rep.plans[ri].pass_us < 10 for ri in fuse)   # so 10 us faster than the GEMM is within the host cost
    timer = lambda key: (50.0, 60.0)   # noqa: E731  every kernel 10 us faster than its GEMM alone
    kept, _ = backend.drop_measured_losers(rep, fuse, target, prog.rewrite_keeping_torch, timer,
                                           host_us=backend.host_us_per_call(graphed=True))
    assert kept == fuse
    with caplog.at_level(logging.INFO, logger="comfuse"):
        kept, none = backend.drop_measured_losers(rep, fuse, target, prog.rewrite_keeping_torch, timer,
                                                  host_us=backend.host_us_per_call(graphed=False))
    assert kept == set() and none is None
    assert any("of host time per call, no CUDA graph" in r.getMessage() and "does not cover the call's host time"
               in r.getMessage() for r in caplog.records)
    # the default reads Inductor's config in effect (the post-grad pass runs inside the compile's patches)
    with torch._inductor.config.patch({"triton.cudagraphs": True}):
        assert backend.host_us_per_call() == 0.0
    with torch._inductor.config.patch({"triton.cudagraphs": False}):
        assert backend.host_us_per_call() == backend.HOST_US_PER_CALL
    monkeypatch.setenv("COMFUSE_HOST_US", "5")
    assert backend.host_us_per_call(graphed=False) == 5.0
    monkeypatch.setenv("COMFUSE_HOST_US", "fast")   # not a number: the default, with a warning
    assert backend.host_us_per_call(graphed=False) == backend.HOST_US_PER_CALL
    # the op's C++ kernel costs the host no more than the GEMM call it replaces: the same kernels stay fused
    monkeypatch.delenv("COMFUSE_HOST_US")
    monkeypatch.setattr(ops, "_FAST", True)
    assert backend.host_us_per_call(graphed=False) == backend.HOST_US_PER_CALL_FAST
    kept, _ = backend.drop_measured_losers(rep, fuse, target, prog.rewrite_keeping_torch, timer,
                                           host_us=backend.host_us_per_call(graphed=False))
    assert kept == fuse
