"""Norms finished in the GEMMs that read them, through torch.compile (options={"defer_norms": True}): the sites found
in a model's own ops, the rewritten graph against eager and an fp32 run, the folded weights computed once and again
when a parameter changes, the switch, and comfuse.explain. On the CPU the fused regions run through the CPU
reference implementation (reference=True, rewrite="keep": the pass inside Inductor, as on the GPU)."""
import logging

import pytest
import torch

import comfuse
from comfuse import folds
from conftest import hopper_reason

BF16 = torch.bfloat16


class HFRMSNorm(torch.nn.Module):
    """Hugging Face's LlamaRMSNorm: the variance and the product in fp32, the weight applied in the input's dtype."""

    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LlamaMLPBlock(torch.nn.Module):
    """o_proj + residual (h, the residual stream), RMSNorm, gate / up, SiLU * up, down + residual."""

    def __init__(self, d=256, f=512):
        super().__init__()
        self.o = torch.nn.Linear(d, d, bias=False)
        self.norm = HFRMSNorm(d)
        self.gate = torch.nn.Linear(d, f, bias=False)
        self.up = torch.nn.Linear(d, f, bias=False)
        self.down = torch.nn.Linear(f, d, bias=False)

    def forward(self, a, r):
        h = self.o(a) + r
        y = self.norm(h)
        return h + self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y))


class BertOutput(torch.nn.Module):
    """Post-norm: LayerNorm(out-proj + residual), FFN1 + GELU, FFN2 + the residual of that LayerNorm, LayerNorm."""

    def __init__(self, d=256, f=512):
        super().__init__()
        self.o = torch.nn.Linear(d, d)
        self.ln = torch.nn.LayerNorm(d)
        self.f1 = torch.nn.Linear(d, f)
        self.f2 = torch.nn.Linear(f, d)
        self.ln2 = torch.nn.LayerNorm(d)

    def forward(self, a, r):
        y = self.ln(self.o(a) + r)
        return self.ln2(y + self.f2(torch.nn.functional.gelu(self.f1(y))))


def _model(cls, seed=0):
    torch.manual_seed(seed)
    m = cls().to(BF16).eval()
    with torch.no_grad():   # norm weights away from 1, biases away from 0: the folds must matter
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 32, 256, generator=g).to(BF16) for _ in range(2)]


def _err(x, ref):
    return ((x.float() - ref).norm() / ref.norm()).item()


def _fp32(m, xs):
    import copy

    with torch.no_grad():
        return copy.deepcopy(m).float()(*[x.float() for x in xs])


def _compiled(m, **options):
    torch._dynamo.reset()
    return torch.compile(m, backend="comfuse", options={"reference": True, "rewrite": "keep", "fuse": "all",
                                                        **options})


def _messages(caplog):
    return [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("cls, folded, rebuilt", [(LlamaMLPBlock, 2, 0), (BertOutput, 1, 1)])
def test_a_models_norm_is_finished_in_its_gemms_and_matches_eager(cls, folded, rebuilt, caplog):
    caplog.set_level(logging.INFO, logger="comfuse")
    m, xs = _model(cls), _inputs()
    ref = _fp32(m, xs)
    with torch.no_grad():
        eager = m(*xs)
        got = _compiled(m, defer_norms=True)(*xs)
    sites = [s for s in _messages(caplog) if "norm deferral: norm" in s]
    assert len(sites) == 1, _messages(caplog)
    finished = sites[0].split("finished in ")[1].split(";")[0].split()
    assert len(finished) == folded, sites
    assert ("rebuilt by" in sites[0]) == bool(rebuilt), sites
    # within eager's own error against the fp32 model (two bf16 roundings; docs/kernel-reduce.md)
    assert _err(got, ref) <= max(1.25 * _err(eager, ref), 4e-3), (_err(got, ref), _err(eager, ref))
    assert any("folded " in s for s in _messages(caplog)), "the folds ran"


@pytest.mark.parametrize("cls", [LlamaMLPBlock, BertOutput])
def test_the_graph_ir_rewrite_defers_too(cls, caplog):
    """rewrite="ir" (ComFuse's own trace; the folds are standard-path nodes, computed per call in fp32)."""
    caplog.set_level(logging.INFO, logger="comfuse")
    m, xs = _model(cls), _inputs()
    ref = _fp32(m, xs)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(m, backend="comfuse", options={"reference": True, "defer_norms": True})(*xs)
        eager = m(*xs)
    assert any("norm deferral: norm" in s and "finished in" in s for s in _messages(caplog)), _messages(caplog)
    assert _err(got, ref) <= max(1.25 * _err(eager, ref), 4e-3), (_err(got, ref), _err(eager, ref))


def test_folded_weights_are_computed_once_and_again_when_a_parameter_changes(caplog):
    caplog.set_level(logging.INFO, logger="comfuse")
    m, xs = _model(LlamaMLPBlock), _inputs()
    c = _compiled(m, defer_norms=True)
    with torch.no_grad():
        c(*xs)
        n_first = sum("folded " in s for s in _messages(caplog))
        # gate's and up's W* (RMSNorm: no column sums, no shift), in one call: the two GEMMs are one region
        assert n_first == 1 and "mm_1%w_folded, mm_2%w_folded" in _messages(caplog)[-1], _messages(caplog)
        c(*xs)
        assert sum("folded " in s for s in _messages(caplog)) == n_first, "a second call folds nothing"
        # an in-place change of the norm's weight bumps its version: both folds are computed again
        m.norm.weight.mul_(1.5)
        got = c(*xs)
        again = [s for s in _messages(caplog) if "again: a source changed" in s]
        assert len(again) == 1, _messages(caplog)
        assert _err(got, _fp32(m, xs)) <= max(1.25 * _err(m(*xs), _fp32(m, xs)), 4e-3)
        # a write through .data is not seen (it bypasses the version counter): stale until comfuse.refold()
        m.gate.weight.data.mul_(-1.0)
        stale = c(*xs)
        assert _err(stale, _fp32(m, xs)) > 0.05
        assert comfuse.refold() >= 2
        fresh = c(*xs)
        assert _err(fresh, _fp32(m, xs)) <= max(1.25 * _err(m(*xs), _fp32(m, xs)), 4e-3)
        # a parameter moved to a new address (`.data =`): folded anew there, and the value at the old address dropped
        held = folds.stats()["folds"]
        m.up.weight.data = m.up.weight.data.clone()
        moved = c(*xs)
        assert _err(moved, _fp32(m, xs)) <= max(1.25 * _err(m(*xs), _fp32(m, xs)), 4e-3)
        assert folds.stats()["folds"] == held
    st = comfuse.fold_stats()
    assert st["folds"] >= 2 and st["bytes"] >= 2 * 512 * 256 * 2 and st["ms"] > 0, st


def test_one_compiled_graph_serving_two_models_keeps_a_fold_for_each(caplog):
    """Two models of one class: the second compile is the first one's graph (Inductor's cache: the same fold keys),
    as the layers of a model whose layer Dynamo compiles once would be. Each parameter set keeps its own folds:
    alternating calls compute nothing again."""
    caplog.set_level(logging.INFO, logger="comfuse")
    m1, m2 = _model(LlamaMLPBlock, seed=3), _model(LlamaMLPBlock, seed=4)
    xs = _inputs()
    c1, c2 = _compiled(m1, defer_norms=True), _compiled(m2, defer_norms=True)
    with torch.no_grad():
        for _ in range(3):
            for m, c in ((m1, c1), (m2, c2)):
                got = c(*xs)
                ref = _fp32(m, xs)
                assert _err(got, ref) <= max(1.25 * _err(m(*xs), ref), 4e-3)
    msgs = _messages(caplog)
    assert sum("folded " in s for s in msgs) == 2, msgs   # one fold call per model, each computing both W*
    assert not any("again" in s for s in msgs), msgs


def test_deferral_is_off_by_default_and_explain_says_what_it_would_do(caplog, capsys):
    caplog.set_level(logging.INFO, logger="comfuse")
    m, xs = _model(BertOutput), _inputs()
    with torch.no_grad():
        _compiled(m)(*xs)
    assert not any("norm deferral" in s for s in _messages(caplog))
    e = comfuse.explain(m, *xs, file=None)
    text = str(e)
    assert "norms (not deferred; with options={'defer_norms': True} they would be):" in text, text
    assert "finished in addmm_1" in text, text
    e = comfuse.explain(m, *xs, file=None, defer_norms=True)
    assert "norms (deferral asked for: finished in the GEMMs that read them, or why not):" in str(e)


@pytest.mark.parametrize("cls", [LlamaMLPBlock, BertOutput])
def test_auto_defers_where_the_planner_estimates_the_graph_faster(cls, caplog):
    """defer_norms="auto": each site is priced as the whole graph with and without its deferral (regions the
    planner declines at Inductor's cost), the cheaper is taken, explain() gives both estimates, and the model
    matches eager either way."""
    import re

    caplog.set_level(logging.INFO, logger="comfuse")
    m, xs = _model(cls), _inputs()
    ref = _fp32(m, xs)
    with torch.no_grad():
        eager = m(*xs)
        got = _compiled(m, defer_norms="auto")(*xs)
    sites = [s for s in _messages(caplog) if "norm deferral: norm" in s]
    assert len(sites) == 1, _messages(caplog)
    est = re.search(r"~([0-9.]+) us with it finished in its readers, ~([0-9.]+) us as written \(defer_norms='auto': "
                    r"finished in its readers where ([0-9]+)% lower\)", sites[0])
    assert est, sites
    deferred, as_written = float(est.group(1)), float(est.group(2))
    assert int(est.group(3)) == round(100 * comfuse._core.DEFER_MARGIN), sites
    clearly_faster = deferred < as_written * (1 - comfuse._core.DEFER_MARGIN)
    assert ("finished in" in sites[0]) == clearly_faster, sites
    assert ("not deferred: the planner's estimate" in sites[0]) == (not clearly_faster), sites
    assert _err(got, ref) <= max(1.25 * _err(eager, ref), 4e-3), (_err(got, ref), _err(eager, ref))
    text = str(comfuse.explain(m, *xs, file=None, defer_norms="auto"))
    assert "(defer_norms='auto': " in text, text


def test_a_site_kept_by_name_says_why():
    """The core's keep list (what "auto" fills in): the named norm is left as written with the reason given, the
    others are deferred; `priced` is what a deferred site's explanation quotes."""
    from comfuse import _core as C

    g = C.parse_cf("""
input A : bf16[64, 32]
input Wo : bf16[32, 32] const
input g : bf16[32] const
input Wg : bf16[48, 32] const
h = matmul(A, Wo, transpose_b=true)
y = rms_norm(h, g, eps=1e-6)
z = matmul(y, Wg, transpose_b=true)
output h, z
""")
    on = C.defer_norms(g, True)
    assert [s.deferred for s in on.sites] == [True], on.explain()
    kept = C.defer_norms(g, True, {on.sites[0].norm: "because the test says so"})
    assert not kept.sites[0].deferred and kept.sites[0].why == "because the test says so", kept.explain()
    priced = C.defer_norms(g, True, {}, {on.sites[0].norm: "estimates"})
    assert priced.sites[0].priced == "estimates" and "(estimates)" in priced.explain(), priced.explain()


def test_a_weight_that_is_not_a_parameter_is_not_folded(caplog):
    """The GEMM's weight is an input of the forward (not a parameter): it may change every call, so the norm stays
    where it is, and the log says why."""

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.o = torch.nn.Linear(256, 256, bias=False)
            self.norm = HFRMSNorm(256)

        def forward(self, a, r, w):
            return torch.nn.functional.linear(self.norm(self.o(a) + r), w)

    caplog.set_level(logging.INFO, logger="comfuse")
    m = _model(Block)
    a, r = _inputs()
    w = torch.randn(384, 256).to(BF16)
    with torch.no_grad():
        got = _compiled(m, defer_norms=True)(a, r, w)
        ref = _fp32(m, [a, r, w])
    sites = [s for s in _messages(caplog) if "norm deferral: norm" in s]
    assert sites and "not deferred" in sites[0] and "is not declared constant" in sites[0], sites
    assert _err(got, ref) <= 1e-2


def test_the_option_is_checked():
    from comfuse.program import defer_setting

    assert [defer_setting(x) for x in (True, False, "on", "off", "auto")] == ["on", "off", "on", "off", "auto"]
    for bad in (1, 0, "yes", None):
        with pytest.raises(ValueError, match="defer_norms must be"):
            defer_setting(bad)
    with pytest.raises(Exception, match="defer_norms must be True / False, 'on' / 'off' or 'auto'"):   # (Dynamo wraps the backend's error)
        torch.compile(torch.nn.Linear(4, 4), backend="comfuse", options={"defer_norms": "yes"})(torch.randn(2, 4))


@pytest.mark.skipif(hopper_reason() is not None, reason=f"skipped: {hopper_reason()}")
@pytest.mark.parametrize("cls", [LlamaMLPBlock, BertOutput])
def test_deferred_norms_run_on_the_gpu_and_match_eager(cls, caplog):
    caplog.set_level(logging.INFO, logger="comfuse")
    m = _model(cls).cuda()
    xs = [torch.randn(16, 512, 256, device="cuda", dtype=BF16) for _ in range(2)]
    ref = _fp32(m, xs)
    with torch.no_grad():
        eager = m(*xs)
        torch._dynamo.reset()
        got = torch.compile(m, backend="comfuse", options={"fuse": "all", "defer_norms": True})(*xs)
        torch.cuda.synchronize()
    assert any("norm deferral: norm" in s and "finished in" in s for s in _messages(caplog)), _messages(caplog)
    assert any("run as ComFuse kernels" in s for s in _messages(caplog)), _messages(caplog)
    assert _err(got, ref) <= max(1.25 * _err(eager, ref), 5e-3), (_err(got, ref), _err(eager, ref))
    assert folds.stats()["folds"] >= 1


@pytest.mark.parametrize("name, sites", [("bert", 2), ("llama", 2), ("gpt2", 2), ("qwen2", 2), ("vit", 2)])
def test_hugging_face_models_defer_their_norm_sites_on_cpu(name, sites, caplog):
    """Each LayerNorm / RMSNorm site whose readers are GEMMs is finished in them: BERT's embedding LayerNorm (into Q,
    K and V) and its layer's attention-output LayerNorm (into FFN1; a post-norm, whose input holds the embedding
    LayerNorm's output through the residual), the pre-norms of Llama, GPT-2, Qwen2 (into biased Q, K and V of
    grouped-query attention, and gate / up) and ViT (layernorm_before into Q, K and V, layernorm_after into the
    MLP). The model matches eager as closely as without deferral. With "auto" every site is deferred or says why not,
    with the planner's estimates of the graph both ways."""
    transformers = pytest.importorskip("transformers")   # noqa: F841  (test_hf_models builds the tiny configs)
    from test_hf_models import _tiny, _tiny_inputs

    caplog.set_level(logging.INFO, logger="comfuse")
    torch.manual_seed(0)
    m = _tiny(name).to(BF16).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    kwargs = {k: v.to(BF16) if v.is_floating_point() else v for k, v in _tiny_inputs(name).items()}
    errs = {}
    with torch.no_grad():
        ref = m(**kwargs).last_hidden_state.float()
        for defer in (False, True):
            got = _compiled(m, defer_norms=defer)(**kwargs).last_hidden_state
            errs[defer] = ((got.float() - ref).norm() / ref.norm()).item()
    deferred = [s for s in _messages(caplog) if "norm deferral: norm" in s and "finished in" in s]
    assert len(deferred) == sites, _messages(caplog)
    assert errs[True] <= max(1.25 * errs[False], 1e-2), errs
    caplog.clear()
    with torch.no_grad():
        got = _compiled(m, defer_norms="auto")(**kwargs).last_hidden_state
    assert ((got.float() - ref).norm() / ref.norm()).item() <= max(1.25 * errs[False], 1e-2)
    priced = [s for s in _messages(caplog) if "norm deferral: norm" in s and "(defer_norms='auto': " in s]
    assert len(priced) == sites, _messages(caplog)


def test_inductor_code_reads_folded_weights_through_the_direct_entry():
    """A folded weight in Inductor's code is a call of the fold's direct entry (extern_kernels.comfuse_fold: the
    cached value without the dispatcher's trip), not of the op."""
    import importlib.util

    from torch._inductor.utils import run_and_get_code

    from comfuse import inductor

    if importlib.util.find_spec("torch._inductor.codegen.custom_extern_kernel_codegen") is None:
        pytest.skip(f"torch {torch.__version__} has no registry of custom fallback codegen")
    assert inductor.DIRECT_CALLS
    m, xs = _model(LlamaMLPBlock, seed=5), _inputs()
    with torch.no_grad():
        got, codes = run_and_get_code(_compiled(m, defer_norms=True), *xs)
        ref = _fp32(m, xs)
    code = "\n".join(codes)
    assert code.count("extern_kernels.comfuse_fold(") == 1 and "torch.ops.comfuse.fold.default(" not in code, code
    assert _err(got, ref) <= max(1.25 * _err(m(*xs), ref), 4e-3)
    # the entry serves the calls itself (the sources are parameters), without the dispatcher
    before = folds.stats()["direct_calls"]
    with torch.no_grad():
        _compiled(m, defer_norms=True)(*xs)
    assert folds.stats()["direct_calls"] >= before + 1


def test_positions_that_do_not_line_up_fold_nothing(caplog):
    """The parameters are found by their positions among the model's inputs; where the graph has another number of
    placeholders, no position is trusted: every site is left as it was (nothing stale can be folded)."""
    from comfuse import analysis, tracing

    caplog.set_level(logging.INFO, logger="comfuse")
    m, xs = _model(LlamaMLPBlock), _inputs()
    (rep,) = comfuse.capture(m, *xs)
    ex = rep.example_inputs
    aten = tracing.aten_graph(rep.gm, ex)
    params = analysis.parameter_positions(ex)
    assert len(params) == 5   # o, norm, gate, up, down
    ok = analysis.analyze_aten(analysis.GraphReport(901), aten, ex, defer=True, constant_positions=params,
                               inputs=len(ex))
    assert any(s.deferred for s in ok.analysis.deferred.sites)
    off = analysis.analyze_aten(analysis.GraphReport(902), aten, ex, defer=True, constant_positions=params,
                                inputs=len(ex) + 1)
    assert not any(s.deferred for s in off.analysis.deferred.sites)
    assert any("graph 902 norm deferral: the graph has" in s for s in _messages(caplog)), _messages(caplog)
    # a position whose placeholder has another shape than the parameter recorded there is not trusted either
    moved = tuple((i, (7,) + shape, dtype) for i, shape, dtype in params)
    off = analysis.analyze_aten(analysis.GraphReport(903), aten, ex, defer=True, constant_positions=moved,
                                inputs=len(ex))
    assert not any(s.deferred for s in off.analysis.deferred.sites)
    assert any("graph 903 norm deferral: 5 of the model's 5 parameters are not where" in s
               for s in _messages(caplog)), _messages(caplog)


def test_inference_tensors_fold_and_refold_on_request(caplog):
    """Parameters made under torch.inference_mode() have no version counter: they fold (once), an in-place change is
    not seen, and comfuse.refold() picks it up (docs/pytorch.md)."""
    caplog.set_level(logging.INFO, logger="comfuse")
    with torch.inference_mode():
        m, xs = _model(LlamaMLPBlock, seed=6), _inputs()
        c = _compiled(m, defer_norms=True)
        first = c(*xs)
        assert _err(first, _fp32(m, xs)) <= max(1.25 * _err(m(*xs), _fp32(m, xs)), 4e-3)
        m.norm.weight.mul_(-1.0)
        assert _err(c(*xs), _fp32(m, xs)) > 0.05   # not seen
        assert comfuse.refold() >= 2
        assert _err(c(*xs), _fp32(m, xs)) <= max(1.25 * _err(m(*xs), _fp32(m, xs)), 4e-3)


def test_a_deleted_models_folds_are_dropped():
    import gc

    m, xs = _model(LlamaMLPBlock, seed=7), _inputs()
    with torch.no_grad():
        _compiled(m, defer_norms=True)(*xs)
    held = folds.stats()["folds"]
    del m
    torch._dynamo.reset()   # (Dynamo's cache holds the compiled graph, which holds the parameters)
    gc.collect()
    assert folds.stats()["folds"] <= held - 2
