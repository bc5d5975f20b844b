"""Attention masks computed from constants (comfuse/masks.py): one that keeps every position is dropped before
tracing, and the causal mask of a square attention becomes is_causal=True, so SDPA can take its fused kernels;
every other mask stays."""
import logging

import pytest
import torch
import torch.nn.functional as F

import comfuse  # noqa: F401  (registers the backend)
from comfuse import masks
from conftest import rel_err


def _graph(fn, *inputs):
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture)(*inputs)
    assert len(graphs) == 1
    return graphs[0]


def _masks_left(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in masks.SDPA_TARGETS
            and masks._mask_of(n) is not None]


def _qkv(s=17):
    return [torch.randn(2, 3, s, 8) for _ in range(3)]


def test_an_all_true_mask_from_constants_is_dropped():
    # what HF's bidirectional mask helper builds under torch.compile: arange(S) >= 0, expanded
    def attend(q, k, v):
        s = q.shape[2]
        keep = (torch.arange(s, device=q.device)[None, None, :, None] >= 0).expand(q.shape[0], -1, s, s)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.3)

    q, k, v = _qkv()
    gm = _graph(attend, q, k, v)
    assert len(_masks_left(gm)) == 1
    assert masks.drop_trivial_masks(gm) == {"dropped": 1, "causal": 0}
    assert not _masks_left(gm)
    assert not any("arange" in str(n.target) for n in gm.graph.nodes)   # the mask's computation is gone too
    got = gm(q, k, v)
    assert rel_err(got[0] if isinstance(got, tuple) else got, attend(q, k, v)) <= 1e-6


def test_a_zero_float_mask_in_the_fourth_argument_is_dropped():
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, torch.zeros(q.shape[2], q.shape[2]))

    gm = _graph(attend, *_qkv())
    assert masks.drop_trivial_masks(gm) == {"dropped": 1, "causal": 0} and not _masks_left(gm)


def test_a_constant_causal_mask_becomes_is_causal():
    # what HF's causal mask helper builds under torch.compile (GPT-2, Llama): kv_index <= q_index, expanded
    def attend(q, k, v):
        s = q.shape[2]
        i = torch.arange(s, device=q.device)
        causal = (i[None, None, None, :] <= i[None, None, :, None]).expand(q.shape[0], -1, s, s)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal)

    q, k, v = _qkv()
    gm = _graph(attend, q, k, v)
    assert masks.drop_trivial_masks(gm) == {"dropped": 0, "causal": 1}
    assert not _masks_left(gm)
    sdpa = [n for n in gm.graph.nodes if n.target in masks.SDPA_TARGETS]
    assert sdpa[0].kwargs["is_causal"] is True
    got = gm(q, k, v)
    assert rel_err(got[0] if isinstance(got, tuple) else got, attend(q, k, v)) <= 1e-6


def test_masks_of_a_graph_on_the_meta_device_are_judged_on_the_cpu():
    """A model captured without weights (the meta device: the CPU capture test, the kernel pack's estimate) builds
    its masks there too; they are computed on the CPU, so the graph the backend fuses is the one a GPU would see."""
    def attend(q, k, v):
        s = q.shape[2]
        i = torch.arange(s, device=q.device)
        causal = (i[None, None, None, :] <= i[None, None, :, None]).expand(q.shape[0], -1, s, s)
        keep = (i[None, None, :, None] >= 0).expand(q.shape[0], -1, s, s)
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=causal),
                F.scaled_dot_product_attention(q, k, v, attn_mask=keep))

    gm = _graph(attend, *[t.to("meta") for t in _qkv(16)])
    assert masks.drop_trivial_masks(gm) == {"dropped": 1, "causal": 1}
    assert not _masks_left(gm)


@pytest.mark.parametrize("case", ["causal_not_square", "causal_shifted", "from_an_input", "random", "float_bias"])
def test_masks_that_mask_something_else_or_are_not_constant_stay(case):
    def attend(q, k, v, m):
        s, t = q.shape[2], k.shape[2]
        i, j = torch.arange(s, device=q.device), torch.arange(t, device=q.device)
        mask = {"causal_not_square": lambda: j[None, :] <= i[:, None],   # 17 queries, 9 keys: not what is_causal means
                "causal_shifted": lambda: j[None, :] <= i[:, None] + 1,
                "from_an_input": lambda: m > -10,          # all True here, but an input: not known at compile time
                "random": lambda: torch.rand(s, t) >= 0,    # all True, but not a function of its arguments
                "float_bias": lambda: torch.full((s, t), 0.5)}[case]()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = _qkv()
    if case == "causal_not_square":
        k, v = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    gm = _graph(attend, q, k, v, torch.zeros(17, k.shape[2]))
    assert masks.drop_trivial_masks(gm) == {"dropped": 0, "causal": 0}
    assert len(_masks_left(gm)) == 1


def _through_the_backend(model, caplog, **inputs) -> str:
    """Runs a bf16 HF model through backend="comfuse" (CPU reference implementation), checks it against eager and
    returns what the backend logged about masks."""
    model = model.to(torch.bfloat16).eval()
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="comfuse"), torch.no_grad():
        got = torch.compile(model, backend="comfuse", options={"reference": True})(**inputs)
        ref = model(**inputs)
    assert rel_err(got.last_hidden_state.float(), ref.last_hidden_state.float()) <= 2e-2   # (bf16 regions)
    said = [r.getMessage() for r in caplog.records if "attention masks computed from constants" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    return said[0]


def test_vit_through_the_backend_drops_its_mask_and_matches_eager(caplog):
    """A tiny ViT (HF): under torch.compile its attention gets an all-True mask (see masks.py); the backend drops
    it, says so, and the result matches eager."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                                 image_size=32, patch_size=8)
    said = _through_the_backend(transformers.ViTModel(cfg, add_pooling_layer=False), caplog,
                                pixel_values=torch.randn(2, 3, 32, 32, dtype=torch.bfloat16))
    assert "2 masking nothing dropped and 0 causal" in said, said


def test_gpt2_through_the_backend_gets_is_causal_and_matches_eager(caplog):
    """A tiny GPT-2 (HF): under torch.compile its attention gets an explicit causal mask where eager passes
    is_causal=True; the backend turns it back into is_causal=True, says so, and the result matches eager."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=128, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    said = _through_the_backend(transformers.GPT2Model(cfg), caplog, input_ids=torch.randint(0, 128, (2, 16)))
    assert "0 masking nothing dropped and 2 causal" in said, said
