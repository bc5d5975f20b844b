"""The custom op's CUDA implementation: a fused region compiled by comfuse._core.RegionKernel and launched on
the current stream, against the op's CPU reference implementation on the same bf16 inputs. Also: a second batch
size reuses the compiled kernel (M is a launch argument). Skips, saying so, without a compute-capability-9.0 GPU.
"""
import contextlib
import copy
import threading

import pytest
import torch

import comfuse
import comfuse._core as C
import models
from comfuse import inductor, ops
from conftest import hopper_reason, messages, rel_err

GRAPHS = {
    "bias_gelu": "y = gelu(add(matmul(X, W), b), approximate=\"tanh\")\noutput y\n",
    "postnorm": "y = layer_norm(add(add(matmul(X, W), b), R), gamma, beta, eps=1e-5)\noutput y\n",
    "softmax": "y = softmax(add(matmul(X, W), b))\noutput y\n",
    # a per-row output that only leaves the kernel (ReduceToRow: no exchange), next to two tile outputs
    "row_stats": "h = add(add(matmul(X, W), b), R)\ny = mul(h, gamma)\nms = mean(mul(h, h), dim=-1)\noutput h, y, ms\n",
}


def _gpu_reason():
    return hopper_reason(1)


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


def _gpu_matches_cpu(key, cpu: list, what) -> list:
    """Region `key` on the GPU against its CPU reference on the same inputs: every output on the GPU, of the
    reference's shape and dtype, finite, within 1e-2 (normwise). Returns the reference's outputs."""
    ref = torch.ops.comfuse.fused_region(key, cpu)
    got = torch.ops.comfuse.fused_region(key, [t.cuda() for t in cpu])
    torch.cuda.synchronize()
    assert len(got) == len(ref) == len(ops.region_spec(key).outputs)
    for g, r in zip(got, ref):
        assert g.device.type == "cuda" and g.shape == r.shape and g.dtype == r.dtype, (what, g.shape, r.shape)
        assert torch.isfinite(g.float()).all()
        assert rel_err(g, r) <= 1e-2, (what, rel_err(g, r))
    return ref


@requires_hopper
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_fused_region_on_gpu_matches_the_cpu_reference(name):
    m, k, n = 1000, 520, 264
    spec = _region(name, m, k, n)
    key = ops.register_region(spec)
    gen = torch.Generator().manual_seed(1234)
    _gpu_matches_cpu(key, _inputs(spec, m, k, n, gen), name)


@requires_hopper
def test_a_per_row_output_is_right_call_after_call_on_gpu():
    """ReduceToRow's words carry the launch's tag (row_output.cuh): three calls with fresh inputs (a stale word taken
    for this launch's would give a row the previous call's partials) all match the CPU reference."""
    m, k, n = 1000, 520, 264
    spec = _region("row_stats", m, k, n)
    assert C.plan_region(spec).transport == "none"   # no exchange: ReduceToRow
    key = ops.register_region(spec)
    gen = torch.Generator().manual_seed(4321)
    for call in range(3):
        _gpu_matches_cpu(key, _inputs(spec, m, k, n, gen), f"row_stats call {call}")


@requires_hopper
def test_a_per_row_output_is_right_as_the_rows_shrink_and_grow_on_gpu():
    """One kernel and one workspace at 2048, 1000, 300 and 2048 rows again: the launches of fewer rows leave the
    arrival counts of the row blocks they do not reach behind, and the row blocks they reach must still agree on
    the launch (each launch adds C to each count it touches). Every call matches the CPU reference."""
    k, n = 520, 264
    key = ops.register_region(_region("row_stats", 2048, k, n))
    gen = torch.Generator().manual_seed(2468)
    for m in (2048, 1000, 300, 2048, 1000):
        spec = _region("row_stats", m, k, n)
        cpu = _inputs(spec, m, k, n, gen)
        ref = torch.ops.comfuse.fused_region(ops.register_region(spec), cpu)
        got = torch.ops.comfuse.fused_region(key, [t.cuda() for t in cpu])
        torch.cuda.synchronize()
        for g, r in zip(got, ref):
            assert g.shape == r.shape and torch.isfinite(g.float()).all(), (m, g.shape)
            assert rel_err(g, r) <= 1e-2, (m, rel_err(g, r))


# Two GEMMs on one A, one kernel (GemmConfig<.., DualB>): SwiGLU combines them; attention's Q and K store both.
PAIRED = {
    "swiglu": ("", "y = mul(silu(matmul(X, Wg, transpose_b=true)), matmul(X, Wu, transpose_b=true))\noutput y\n"),
    "qk": ("input b : bf16[{n}]\ninput b2 : bf16[{n}]\n",
           "q = add(matmul(X, Wg, transpose_b=true), b)\nk = add(matmul(X, Wu, transpose_b=true), b2)\n"
           "output q\noutput k\n"),
}


@requires_hopper
@pytest.mark.parametrize("name", sorted(PAIRED))
def test_two_gemms_on_one_a_on_gpu_match_the_cpu_reference(name):
    """M not a multiple of the tile and N not a multiple of the output tile: X·Wg and X·Wu from one accumulator
    tile, against the CPU reference on the same bf16 inputs."""
    m, k, n = 1000, 520, 264
    extra, body = PAIRED[name]
    text = f"input X : bf16[{m}, {k}]\ninput Wg : bf16[{n}, {k}]\ninput Wu : bf16[{n}, {k}]\n" + extra.format(n=n) + body
    part = C.partition(C.parse_cf(text, name + ".cf"))
    assert len(part.regions) == 1 and part.regions[0].spec.gemm.paired
    spec = part.regions[0].spec
    key = ops.register_region(spec)
    gen = torch.Generator().manual_seed(4321)
    values = {"X": torch.rand(m, k, generator=gen) * 2 - 1, "Wg": torch.rand(n, k, generator=gen) * 2 - 1,
              "Wu": torch.rand(n, k, generator=gen) * 2 - 1, "b": torch.rand(n, generator=gen) * 2 - 1,
              "b2": torch.rand(n, generator=gen) * 2 - 1}
    _gpu_matches_cpu(key, [values[name].to(torch.bfloat16) for name in ["X", "Wg"] + [p.name for p in spec.params]], name)


@requires_hopper
@pytest.mark.parametrize("heads,d,paired", [(4, 64, True), (2, 128, True), (4, 64, False)])
def test_rotary_embedding_in_the_epilogue_on_gpu_matches_the_cpu_reference(heads, d, paired):
    """Rotary embedding of attention's q (and k) in the epilogue (examples/rope.cf): rotate_half swaps registers
    within a head, cos and sin are [rows, D] blocks read per token. 1000 rows (not a multiple of the tile),
    K = 520; head_dim 128 on a pair needs a 256-wide MMA tile. Against the CPU reference on the same inputs."""
    b, s, k = 8, 125, 520
    n = heads * d
    text = (f"input X : bf16[{b}, {s}, {k}]\ninput Wq : bf16[{n}, {k}]\ninput Wk : bf16[{n}, {k}]\n"
            f"input cos : bf16[{b}, {s}, 1, {d}]\ninput sin : bf16[{b}, {s}, 1, {d}]\n"
            f"q = reshape(matmul(X, Wq, transpose_b=true), shape=[{b}, {s}, {heads}, {d}])\n"
            "qr = add(mul(q, cos), mul(rotate_half(q), sin))\noutput qr\n")
    if paired:
        text += (f"k = reshape(matmul(X, Wk, transpose_b=true), shape=[{b}, {s}, {heads}, {d}])\n"
                 "kr = add(mul(k, cos), mul(rotate_half(k), sin))\noutput kr\n")
    part = C.partition(C.parse_cf(text, "rope.cf"))
    assert len(part.regions) == 1 and part.regions[0].spec.gemm.paired == paired
    spec = part.regions[0].spec
    assert sum(p.kind == C.BroadcastKind.PERIODIC for p in spec.params) == 2
    key = ops.register_region(spec)
    gen = torch.Generator().manual_seed(2468)
    shapes = {"X": (b, s, k), "Wq": (n, k), "Wk": (n, k), "cos": (b, s, 1, d), "sin": (b, s, 1, d)}
    values = {nm: (torch.rand(*sh, generator=gen) * 2 - 1).to(torch.bfloat16) for nm, sh in shapes.items()}
    ref = _gpu_matches_cpu(key, [values[nm] for nm in ["X", "Wq"] + [p.name for p in spec.params]], (heads, d, paired))
    # and the rotation itself: the CPU reference against torch's own rotary formula (fp32 GEMM of the bf16 inputs)
    qh = (values["X"].float() @ values["Wq"].float().t()).view(b, s, heads, d)
    rot = torch.cat([-qh[..., d // 2:], qh[..., :d // 2]], -1)
    want = qh * values["cos"].float() + rot * values["sin"].float()
    assert rel_err(ref[0].float().view(b, s, heads, d), want) <= 1e-2


@requires_hopper
@pytest.mark.parametrize("parts,c", [(3, 128), (2, 256)])
def test_an_output_stored_in_parts_on_gpu_matches_the_cpu_reference(parts, c):
    """A projection stored part by part (comfuse/parts.py; PartMajor in store.cuh) at 1000 rows (not a multiple of
    the tile) and again at 600 (the kernel takes any row count): the kernel's output has the reference's values
    and its [T, rows, C] layout, each part a dense [rows, C] matrix."""
    k = 520
    n = parts * c
    text = f"input X : bf16[1000, {k}]\ninput W : bf16[{k}, {n}]\ninput b : bf16[{n}]\ny = add(matmul(X, W), b)\noutput y\n"
    spec = C.partition(C.parse_cf(text, "parts.cf")).regions[0].spec.with_parts(0, c, parts - 1)
    key = ops.register_region(spec)
    gen = torch.Generator().manual_seed(97)
    x, w, bias = ((torch.rand(*sh, generator=gen) * 2 - 1).to(torch.bfloat16) for sh in ((1000, k), (k, n), (n,)))
    ref = _gpu_matches_cpu(key, [x, w, bias], (parts, c))[0]
    for rows in (1000, 600):
        got = torch.ops.comfuse.fused_region(key, [x[:rows].cuda(), w.cuda(), bias.cuda()])[0]
        assert got.shape == (rows, parts, c) and got.stride() == (c, rows * c, 1)
        assert all(got[:, t].is_contiguous() for t in range(parts))
        assert rel_err(got.float().cpu(), ref[:rows].float()) <= 1e-2
    want = (x.float() @ w.float() + bias.float()).view(1000, parts, c)
    assert rel_err(ref.float(), want) <= 1e-2


@requires_hopper
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_qkv_heads_through_the_backend_on_gpu(mode):
    """GPT-2's QKV projection split into q, k and v, k and v copied for the cache as HF's cache does (QKVHeads),
    through the backend inside Inductor: one fused call stores the parts, no copy kernel is left, and the outputs
    match eager, the cache tensors with eager's strides."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(5)
    m = models.QKVHeads(768, 12, fused=True).cuda().to(torch.bfloat16).eval()
    x = torch.randn(4, 256, 768, device="cuda").to(torch.bfloat16)
    inductor.reset_reports()
    f = torch.compile(m, backend=comfuse.compile_backend(mode=mode, fuse="all"))
    with torch.no_grad():
        ref = m(x)
        for _ in range(3):   # (reduce-overhead: warm-up, record, replay)
            got = f(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            got = f(x)
            torch.cuda.synchronize()
    reps = inductor.reports()
    assert reps and len(reps[-1].fused) == 1, [r.fused for r in reps]
    for a, r in zip(got, ref):
        assert a.shape == r.shape and a.stride() == r.stride() and rel_err(a.float(), r.float()) <= 2e-2
    kernels = {e.key for e in p.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA}
    # the fused GEMM and attention: no copy of k or v (and no other kernel; under CUDA graphs, the graph's own copy
    # of the input x into its static buffer, one multi-tensor copy)
    others = {k for k in kernels if not (k.startswith(("void comfuse::", "Memset")) or "sdpa" in k or "attention" in k
                                         or (mode == "reduce-overhead" and "multi_tensor_apply_kernel" in k))}
    assert not others, others


@requires_hopper
def test_a_prior_that_spills_is_passed_over_on_the_gpu():
    """GPT-2's c_fc + bias + gelu_new written out with a constant that keeps it from folding into one gelu_tanh
    (0.04471): at 8192 x 768 -> 3072 the planner's prior, 128x192x64, spills registers with it (docs/PERF.md,
    2026-12-03), so the kernel the op runs is the next candidate that does not, and says so. Its values
    match the CPU reference (at 512 rows: the kernel takes any M)."""
    k, n = 768, 3072

    def region(m):
        text = (f"input X : bf16[{m}, {k}]\ninput W : bf16[{k}, {n}]\ninput b : bf16[{n}]\nh = add(matmul(X, W), b)\n"
                "y = mul(mul(h, 0.5), add(tanh(mul(add(h, mul(pow(h, 3.0), 0.04471)), 0.7978845608028654)), 1.0))\n"
                "output y\n")
        return C.partition(C.parse_cf(text, "gelu_new_unfolded.cf")).regions[0].spec

    key = ops.register_region(region(8192))
    kernel = ops.gpu_kernel(key)
    assert "spills registers" in kernel.config_reason and kernel.config != "128x192x64_c2x1", kernel.config_reason
    gen = torch.Generator().manual_seed(77)
    cpu = [(torch.rand(*shape, generator=gen) * 2 - 1).to(torch.bfloat16) for shape in ((512, k), (k, n), (n,))]
    ref = torch.ops.comfuse.fused_region(ops.register_region(region(512)), cpu)[0]
    got = torch.ops.comfuse.fused_region(key, [t.cuda() for t in cpu])[0]
    torch.cuda.synchronize()
    assert rel_err(got, ref) <= 1e-2


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


def _replays_match_the_reference(g, static, out, m, k, n, seeds):
    """Replays CUDA graph `g` of a postnorm region (inputs `static`, output `out`) with fresh inputs per seed, the
    output poisoned first, against the CPU reference."""
    for seed in seeds:
        fresh = _inputs(_region("postnorm", m, k, n), m, k, n, torch.Generator().manual_seed(seed))
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref = torch.ops.comfuse.fused_region(ops.register_region(_region("postnorm", m, k, n)), fresh)[0]
        assert rel_err(out.cpu(), ref) <= 1e-2


@requires_hopper
@pytest.mark.skipif(not ops._FAST, reason="skipped: the C++ fast path (comfuse/_torch_ops.so) is not built")
def test_the_cpp_fast_path_serves_repeat_calls():
    # The first call of a region runs the Python kernel, which registers the region with the C++ fast path; later
    # calls with dense inputs of the kernel's dtypes run there. A larger batch (the workspace grows), a transposed
    # view (copied first) and a 3-D A go back to Python, and come out right every time. So does a CUDA graph.
    k, n = 520, 264
    key = ops.register_region(_region("postnorm", 1000, k, n))
    gen = torch.Generator().manual_seed(7)

    def check(m, shape_a=None, mangle=None):
        cpu = _inputs(_region("postnorm", m, k, n), m, k, n, gen)
        ref = torch.ops.comfuse.fused_region(ops.register_region(_region("postnorm", m, k, n)), cpu)[0]
        gpu = [t.cuda() for t in cpu]
        if shape_a is not None:
            gpu[0] = gpu[0].reshape(shape_a)
        if mangle is not None:
            gpu = mangle(gpu)
        got = torch.ops.comfuse.fused_region(key, gpu)[0]
        torch.cuda.synchronize()
        spec = ops.region_spec(key)   # the Python kernel's shape rule: a 2-D region keeps 2-D outputs
        assert list(got.shape) == ops._out_shape(spec, spec.outputs[0], tuple(gpu[0].shape))
        assert rel_err(got.reshape(m, n), ref) <= 1e-2
        return ops.fast_path_stats()

    s0 = ops.fast_path_stats()
    s1 = check(1000)                      # Python: first call, registers
    s2 = check(1000)                      # C++
    assert s2["fast"] == s1["fast"] + 1 and s2["regions"] >= 1
    # The fast path's phases timed in C++ (comfuse::_fast_profile, bench/host_time.py): 100 calls after 20 untimed
    # ones, every one served there.
    timed = [t.cuda() for t in _inputs(_region("postnorm", 1000, k, n), 1000, k, n, gen)]
    phases = torch.ops.comfuse._fast_profile(key, timed, 100)
    assert len(phases) == 6 and min(phases) > 0 and sum(phases[:5]) <= phases[5]
    s2 = ops.fast_path_stats()
    s3 = check(3000)                      # Python: the workspace grows
    assert s3["slow"] == s2["slow"] + 1 and s3["why"][key] == "workspace too small"
    s4 = check(3000)
    s5 = check(2000, shape_a=(40, 50, k))  # a 3-D A: C++ (rows = numel / K; a [2000, N] output as in Python)
    assert s5["fast"] == s4["fast"] + 1 == s3["fast"] + 2
    # W as a transposed view: not dense, so the Python kernel copies it
    s6 = check(1000, mangle=lambda g: [g[0], g[1].t().contiguous().t()] + g[2:])
    assert s6["slow"] == s5["slow"] + 1
    assert s6["why"][key] == "B: device, dtype, not contiguous or not 16-byte aligned"
    assert s0["fast"] < s6["fast"]
    # a CUDA graph of a C++-path call, replayed with new inputs: warmed up on the capture stream first, so the
    # captured call is the C++ one (the workspace is per stream)
    cpu = _inputs(_region("postnorm", 1000, k, n), 1000, k, n, gen)
    static = [t.cuda() for t in cpu]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.ops.comfuse.fused_region(key, static)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        out = torch.ops.comfuse.fused_region(key, static)[0]
    _replays_match_the_reference(g, static, out, 1000, k, n, seeds=(11, 12))


@requires_hopper
@pytest.mark.skipif(not ops._FAST, reason="skipped: the C++ fast path (comfuse/_torch_ops.so) is not built")
@pytest.mark.parametrize("case", ["heads_view", "mask", "causal_gqa", "head_dim_differs"])
def test_sdpa_runs_in_cpp_as_eager_does(case):
    # comfuse::sdpa (attention="eager") on CUDA tensors is the C++ kernel: eager's result, in q's layout where the
    # head dims agree (so the model's transpose + reshape after it stays a view), and the same as the Python kernel
    assert torch._C._dispatch_has_kernel_for_dispatch_key("comfuse::sdpa", "CUDA")
    gen = torch.Generator(device="cuda").manual_seed(hash(case) % 1000)
    b, s, h, d = 4, 197, 12, 64

    def heads(hh, dd):   # [B, S, H, D] seen as [B, H, S, D], as HF's attention does
        return torch.randn(b, s, hh, dd, device="cuda", generator=gen, dtype=torch.bfloat16).transpose(1, 2)

    q, k, v = heads(h, d), heads(h, d), heads(h, d)
    kw = {}
    if case == "mask":
        kw["attn_mask"] = torch.randn(b, 1, s, s, device="cuda", generator=gen, dtype=torch.bfloat16)
    if case == "causal_gqa":
        k, v = heads(4, d), heads(4, d)
        kw.update(is_causal=True, enable_gqa=True, scale=0.2)
    if case == "head_dim_differs":
        v = heads(h, 32)
    got = torch.ops.comfuse.sdpa(q, k, v, **kw)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    python = ops._sdpa(q, k, v, **kw)
    torch.cuda.synchronize()
    assert got.shape == want.shape and torch.equal(got, python)
    assert rel_err(got.float(), want.float()) <= 1e-3
    if case == "head_dim_differs":
        assert got.is_contiguous()
    else:
        assert got.stride() == q.stride()
        assert got.transpose(1, 2).reshape(b, s, h * d).data_ptr() == got.data_ptr()   # a view


@requires_hopper
@pytest.mark.skipif(not ops._FAST, reason="skipped: the C++ fast path (comfuse/_torch_ops.so) is not built")
def test_the_direct_entry_serves_calls_in_cpp():
    # ops.fused_region_direct, which Inductor's code calls (inductor.py): the op's C++ kernel without the
    # dispatcher. Its first call of a region reaches the Python kernel through the C++ one, later ones are served
    # in C++; a call that needs autograd goes through the op; the profiler still sees the op's name; a CUDA graph
    # of a direct call replays right with new inputs.
    k, n, m = 520, 264, 1000
    key = ops.register_region(_region("postnorm", m, k, n))
    gen = torch.Generator().manual_seed(17)
    direct = ops.fused_region_direct
    assert direct is not torch.ops.comfuse.fused_region.default

    def check(gpu, cpu):
        before = ops.fast_path_stats()
        got = direct(key, gpu)
        torch.cuda.synchronize()
        ref = torch.ops.comfuse.fused_region(ops.register_region(_region("postnorm", m, k, n)), cpu)[0]
        assert isinstance(got, list) and len(got) == 1 and rel_err(got[0], ref) <= 1e-2
        after = ops.fast_path_stats()
        return after["fast"] - before["fast"], after["slow"] - before["slow"]

    cpu = _inputs(_region("postnorm", m, k, n), m, k, n, gen)
    gpu = [t.cuda() for t in cpu]
    assert check(gpu, cpu) == (0, 1)           # first call: the Python kernel registers the region
    for _ in range(3):
        cpu = _inputs(_region("postnorm", m, k, n), m, k, n, gen)
        assert check([t.cuda() for t in cpu], cpu) == (1, 0)
    # autograd: the op takes it (its own C++ kernel still serves it)
    cpu = _inputs(_region("postnorm", m, k, n), m, k, n, gen)
    gpu = [t.cuda() for t in cpu]
    gpu[2].requires_grad_(True)
    with torch.enable_grad():
        assert check(gpu, cpu) == (1, 0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        direct(key, [t.cuda() for t in cpu])
    assert any(e.name == "comfuse::fused_region" for e in prof.events())
    static = [t.cuda() for t in _inputs(_region("postnorm", m, k, n), m, k, n, gen)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        direct(key, static)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        out = direct(key, static)[0]
    _replays_match_the_reference(g, static, out, m, k, n, seeds=(21, 22))


@requires_hopper
def test_a_reducing_region_is_captured_on_a_stream_it_never_ran_on():
    # The L2 workspace comes from PyTorch's caching allocator, zeroed on the stream, with no synchronization: a
    # region that reduces can be captured into a CUDA graph on a new stream, with a batch larger than any before
    # (its workspace is allocated during the capture, outside the graph's pool; the graph zeroes it), and replays
    # right with new inputs.
    k, n = 520, 264
    key = ops.register_region(_region("postnorm", 1000, k, n))
    gen = torch.Generator().manual_seed(21)
    first = [t.cuda() for t in _inputs(_region("postnorm", 1000, k, n), 1000, k, n, gen)]
    torch.ops.comfuse.fused_region(key, first)   # compiled and registered on the current stream
    torch.cuda.synchronize()
    L = ops._LAUNCH[key]
    m = 2 * max([1000] + [w[2] for w in L.ws.values()])   # more rows than any stream's workspace holds
    static = [t.cuda() for t in _inputs(_region("postnorm", m, k, n), m, k, n, gen)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        out = torch.ops.comfuse.fused_region(key, static)[0]
    assert L.ws[side.cuda_stream][2] >= m
    _replays_match_the_reference(g, static, out, m, k, n, seeds=(22, 23))


@requires_hopper
def test_the_workspace_stays_out_of_a_thread_routed_memory_pool():
    # Inductor's CUDA-graph trees route the calling thread's allocations to the graph's pool during their warm-up
    # runs, and fail when a tensor allocated there outlives the run: the region's workspace must come from outside
    # (ops._allocate_outside_pools), while its outputs land in the pool like any op's.
    k, n = 520, 264
    key = ops.register_region(_region("postnorm", 1000, k, n))
    gen = torch.Generator().manual_seed(31)
    cpu = _inputs(_region("postnorm", 1000, k, n), 1000, k, n, gen)
    ins = [t.cuda() for t in cpu]
    pool = torch.cuda.MemPool()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.use_mem_pool(pool):
        out = torch.ops.comfuse.fused_region(key, ins)[0]
    torch.cuda.synchronize()

    def in_pool(t):
        return any(g["address"] <= t.data_ptr() < g["address"] + g["total_size"] for g in pool.snapshot())

    assert in_pool(out)
    partials, counters, _ = ops._LAUNCH[key].ws[s.cuda_stream]
    assert not in_pool(partials) and not in_pool(counters)
    ref = torch.ops.comfuse.fused_region(ops.register_region(_region("postnorm", 1000, k, n)), cpu)[0]
    assert rel_err(out.cpu(), ref) <= 1e-2


def test_the_fast_path_registration_checks_its_description():
    if not ops._FAST:
        pytest.skip("skipped: the C++ fast path (comfuse/_torch_ops.so) is not built")
    with pytest.raises(RuntimeError, match="description too short"):
        torch.ops.comfuse._fast_register("no-such-region", [1, C.KERNEL_ABI, 8])
    with pytest.raises(RuntimeError, match=f"kernel ABI 999, this library {C.KERNEL_ABI}"):
        torch.ops.comfuse._fast_register("no-such-region", [1, 999])
    with pytest.raises(RuntimeError, match="is not registered"):
        torch.ops.comfuse._fast_workspace("no-such-region", 0, 0, 0, 0)
    before = ops.fast_path_stats()["regions"]
    # a whole description: entry, abi, n, k, lda, ldb, ld, transport, reduces, dtype, 0 params, 1 output (dtype,
    # A's leading dims, 1 leading dim, 100, 1 column dim, 64, row-major)
    desc = [1, C.KERNEL_ABI, 64, 32, 32, 64, 64, 0, 0, 15, 0, 1, 15, 1, 1, 100, 1, 64, 0]
    with pytest.raises(RuntimeError, match="output columns"):
        torch.ops.comfuse._fast_register("test-region-0", desc[:-3] + [0])
    with pytest.raises(RuntimeError, match=r"an output stored in parts is \[lead..., T, C\]"):
        torch.ops.comfuse._fast_register("test-region-0", desc[:-1] + [1])
    torch.ops.comfuse._fast_register("test-region", desc)
    assert ops.fast_path_stats()["regions"] == before + 1
    with pytest.raises(RuntimeError, match="description too long"):
        torch.ops.comfuse._fast_register("test-region-2", desc + [0])
    torch.ops.comfuse._fast_forget("test-region")
    assert ops.fast_path_stats()["regions"] == before


def test_the_fast_path_shapes_outputs_as_the_python_kernel_does():
    """The C++ fast path computes each call's output shapes itself (torch_ops.cpp, out_shape): for regions traced
    2-D and 3-D and A of other batch and sequence sizes, the same shapes as the Python kernel's rule (_out_shape),
    so a call served in C++ returns what one served in Python would. No GPU: the region is registered with a
    description only."""
    if not ops._FAST:
        pytest.skip("skipped: the C++ fast path (comfuse/_torch_ops.so) is not built")
    graphs = {
        "2-D": ("input X : bf16[64, 96]\ninput W : bf16[96, 32]\ninput b : bf16[32]\n", [(64, 96), (1000, 96),
                                                                                        (4, 25, 96), (2, 3, 5, 96)]),
        "3-D": ("input X : bf16[4, 8, 96]\ninput W : bf16[96, 32]\ninput b : bf16[32]\n", [(4, 8, 96), (2, 8, 96),
                                                                                           (4, 13, 96), (32, 96),
                                                                                           (3, 2, 8, 96)]),
        # N = 32 seen as 4 heads of 8 (rotate_half per head): outputs [B, S, 4, 8]
        "heads": ("input X : bf16[4, 8, 96]\ninput W : bf16[96, 32]\ninput b : bf16[32]\n", [(4, 8, 96), (2, 8, 96),
                                                                                             (4, 13, 96)]),
        # h stored in 2 parts of 16 (comfuse/parts.py): [..., 2, 16]
        "parts": ("input X : bf16[4, 8, 96]\ninput W : bf16[96, 32]\ninput b : bf16[32]\n", [(4, 8, 96), (2, 8, 96),
                                                                                             (4, 13, 96), (32, 96)]),
    }
    bodies = {"heads": "h = add(matmul(X, W), b)\ny = rotate_half(reshape(h, shape=[4, 8, 4, 8]))\noutput h\noutput y\n"}
    for name, (inputs, a_shapes) in graphs.items():
        body = bodies.get(name, "h = add(matmul(X, W), b)\ny = gelu(h)\noutput h\noutput y\n")
        spec = C.partition(C.parse_cf(inputs + body, "shapes.cf")).regions[0].spec
        if name == "parts":
            spec = spec.with_parts(0, 16, 1)
        key = ops.register_region(spec)
        L = ops._GpuLaunch(key, spec)
        g = spec.gemm
        torch.ops.comfuse._fast_register(key, ops._fast_description(L, 1, [C.KERNEL_ABI, int(g.n), int(g.k), int(g.k),
                                                                           int(g.n), int(g.n), 0]))
        try:
            for a in a_shapes:
                flat = list(torch.ops.comfuse._fast_out_shapes(key, list(a)))
                got = []
                while flat:
                    rank, flat = flat[0], flat[1:]
                    got.append(flat[:rank])
                    flat = flat[rank:]
                want = [list(ops._out_shape(spec, o, a)) for o in spec.outputs]
                assert got == want, (name, a, got, want)
                if name == "heads":
                    assert want[1] == [*a[:-1], 4, 8], want
                if name == "parts":
                    assert want[0] == [*(a[:-1] if len(a) == 3 else [a[0] // 8, 8]), 2, 16], want
                    out = ops._empty_out(spec.outputs[0], want[0], torch.bfloat16, "cpu")
                    assert out.shape == tuple(want[0]) and all(out.select(-2, t).is_contiguous() for t in range(2))
        finally:
            torch.ops.comfuse._fast_forget(key)


def test_the_workspace_is_allocated_on_a_thread_of_its_own(monkeypatch):
    # (CPU) Inductor's CUDA-graph trees route the calling thread's allocations to their pool during warm-up; the
    # workspace must come from another thread (ops._allocate_outside_pools), and a failure there is raised here.
    seen = []
    real_empty = torch.empty

    def recording_empty(n, dtype=None, device=None):
        seen.append((threading.get_ident(), device))
        return real_empty(n, dtype=dtype)

    monkeypatch.setattr(torch, "empty", recording_empty)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    out = ops._allocate_outside_pools(3, [48, 16])
    assert [t.numel() for t in out] == [48, 16] and all(t.dtype == torch.uint8 for t in out)
    assert len(seen) == 2 and all(tid != threading.get_ident() and dev == 3 for tid, dev in seen)

    def failing(*a, **k):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(torch, "empty", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        ops._allocate_outside_pools(0, [8])


def test_the_workspace_grows_by_doubling_and_keeps_the_old_one(monkeypatch):
    # (CPU) ops._workspace: zeroed before use, reused while it holds the rows, replaced by one of at least twice the
    # rows when a batch outgrows it; the replaced one is kept alive (kernels still queued may use it).
    key = ops.register_region(_region("postnorm", 1000, 520, 264))
    L = ops._GpuLaunch(key, ops.region_spec(key))

    class Kernel:
        def workspace_bytes(self, rows):
            return rows * 8, 16

    L.kernel = Kernel()
    monkeypatch.setattr(ops, "_allocate_outside_pools",
                        lambda dev, sizes: [torch.full((n,), 7, dtype=torch.uint8) for n in sizes])
    w1 = ops._workspace(L, 0, 11, 100)
    assert w1[2] == 100 and w1[0].numel() == 800 and w1[1].numel() == 16
    assert int(w1[0].sum()) == 0 and int(w1[1].sum()) == 0
    assert ops._workspace(L, 0, 11, 60) is w1          # holds the rows: the same one
    w2 = ops._workspace(L, 0, 11, 150)                # outgrown: at least twice the rows
    assert w2[2] == 200 and w2[0].numel() == 1600 and L.retired == [w1]
    assert ops._workspace(L, 0, 12, 10)[2] == 10      # per stream
    assert ops._workspace(L, 0, 11, 900)[2] == 900


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
        if ops._FAST:   # Inductor's code calls the direct entry; calls after the first are served in C++
            compiled = torch.compile(m, backend="comfuse", options={"fuse": fuse})
            with torch.no_grad():
                compiled(x)
                before = ops.fast_path_stats()
                again = compiled(x)
            after = ops.fast_path_stats()
            assert after["fast"] > before["fast"] and after["slow"] == before["slow"], (before, after)
            again = again if isinstance(again, tuple) else (again,)
            assert all(rel_err(g, r) <= 2e-2 for g, r in zip(again, refs))


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


def _second_gpu_reason():
    if _gpu_reason() is not None:
        return _gpu_reason()
    if torch.cuda.device_count() < 2:
        return f"{torch.cuda.device_count()} GPU here: cuda:1 needs a machine with two (the nvidia-h200-x2 kind)"
    if torch.cuda.get_device_capability(1) != (9, 0):
        return f"cuda:1 is not of compute capability 9.0 ({torch.cuda.get_device_name(1)})"
    return C.unsupported_device_reason(1) or None


@pytest.mark.skipif(_second_gpu_reason() is not None, reason=f"skipped: {_second_gpu_reason()}")
@pytest.mark.parametrize("name", ["PostNormEncoderLayer", "RMSNormMLP"])
def test_a_model_on_the_second_gpu_fuses_and_matches_eager(name, caplog):
    """A model on cuda:1 (the current device left at cuda:0): its regions compile and run as ComFuse kernels on
    cuda:1, with cuda:1's SM count and shared memory, and it matches eager there; then the same model on cuda:0
    in the same process, so nothing cached for one device serves the other."""
    import logging

    caplog.set_level(logging.INFO, logger="comfuse")
    assert torch.cuda.current_device() == 0
    torch.manual_seed(11)
    for dev in ("cuda:1", "cuda:0"):
        torch._dynamo.reset()
        m = _models()[name]().to(torch.bfloat16).to(dev).eval()
        x = torch.randn(4, 64, 256, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            ref = m(x)
            got = torch.compile(m, backend="comfuse", options={"fuse": "all"})(x)
        torch.cuda.synchronize(dev)
        assert got.device == torch.device(dev) and got.shape == ref.shape
        assert torch.isfinite(got.float()).all()
        assert rel_err(got, ref) <= 2e-2, (dev, rel_err(got, ref))
    msgs = messages(caplog)
    assert sum("region(s) run as ComFuse kernels" in s for s in msgs) == 2, msgs[-8:]
    assert not any("could not be prepared" in s for s in msgs), msgs


# ---------------------------------------------------------------- back-to-back chains: comfuse::fused_chain

class _TargetAttention(torch.nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1) @ v


def _chain_cases():
    """(name, module, input shapes): odd shapes (M, N1, N2 not multiples of the tiles; a batch of 3)."""
    dlrm = torch.nn.Sequential(torch.nn.Linear(520, 200), torch.nn.ReLU(), torch.nn.Linear(200, 40), torch.nn.ReLU())
    gelu = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(96, 64))
    return [("dlrm_odd", dlrm, [(1000, 520)]), ("gelu_3d", gelu, [(3, 333, 64)]),
            ("attention_odd", _TargetAttention(0.7), [(3, 1000, 64), (3, 200, 64), (3, 200, 64)])]


@requires_hopper
@pytest.mark.parametrize("case", [c[0] for c in _chain_cases()])
def test_a_fused_chain_on_the_gpu_matches_fp32(case, caplog):
    """torch.compile(backend="comfuse") runs the chain as one comfuse::fused_chain call: within bf16 of the fp32
    module on fresh random inputs; repeat calls go through the C++ fast path; a CUDA graph replays it with new inputs."""
    import logging

    from comfuse import inductor

    caplog.set_level(logging.INFO, logger="comfuse")
    name, m, shapes = next(c for c in _chain_cases() if c[0] == case)
    m = m.cuda().eval()                              # the fp32 reference
    mb = copy.deepcopy(m).to(torch.bfloat16)         # what is compiled
    xs = [torch.randn(*s, device="cuda") for s in shapes]
    with torch.no_grad():
        ref = m(*xs)
        xb = [x.to(torch.bfloat16) for x in xs]
        inductor.reset_reports()
        torch._dynamo.reset()
        f = torch.compile(mb, backend="comfuse")
        before = ops.fast_path_stats()
        got = f(*xb)
        got2 = f(*xb)
        torch.cuda.synchronize()
    assert sum(len(r.fused_chains) for r in inductor.reports()) == 1, messages(caplog)
    assert rel_err(got.float(), ref) <= 1e-2 and torch.equal(got, got2)
    if ops._FAST_CHAIN:
        assert ops.fast_path_stats()["fast"] > before["fast"]   # the second call ran in C++
    # CUDA-graph replay with new inputs
    static = [x.clone() for x in xb]
    with torch.no_grad():
        f(*static)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = f(*static)
        for seed in (1, 2):
            torch.manual_seed(seed)
            new = [torch.randn(*s, device="cuda") for s in shapes]
            for dst, src in zip(static, new):
                dst.copy_(src.to(torch.bfloat16))
            g.replay()
            torch.cuda.synchronize()
            assert rel_err(out.float(), m(*new)) <= 1e-2, seed
