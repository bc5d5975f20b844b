"""Real nn.Modules the frontend tests capture (fp32; small sizes so CPU interpretation is fast)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class PostNormEncoderLayer(nn.Module):
    """BERT-style post-norm Transformer encoder layer: self-attention, then Linear + GELU + Linear, each with a
    residual add and nn.LayerNorm."""

    def __init__(self, d=32, heads=2, ffn=64):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1 = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.act = nn.GELU()
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        split = lambda t: t.view(b, s, self.h, self.dh).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dh), dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.fc2(self.act(self.fc1(x))))


class RMSNormMLP(nn.Module):
    """Post-norm MLP block with nn.RMSNorm: RMSNorm(x + W2 · GELU_tanh(W1 x + b1))."""

    def __init__(self, d=32, hidden=96):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d, bias=False)
        self.norm = nn.RMSNorm(d, eps=1e-6)

    def forward(self, x):
        return self.norm(x + self.down(F.gelu(self.up(x), approximate="tanh")))


class SwiGLUMLP(nn.Module):
    """Llama's gated MLP with a residual: x + W_down · (SiLU(W_gate x) * (W_up x)), no biases. The gate and up
    GEMMs read the same x and their epilogue combines them: one region of two GEMMs (GemmDesc.paired)."""

    def __init__(self, d=32, hidden=64):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


class RotaryQK(nn.Module):
    """Attention's q and k projections with the rotary embedding as HF's Llama applies it (apply_rotary_pos_emb on
    q and k seen as heads and transposed, cos and sin [1, 1, S, D] in the model's dtype); returns both as
    [B, H, S, D]. The ComFuse pass moves the rotation onto the GEMMs' layout (comfuse/rotary.py): one region of
    two GEMMs on one A with rotate_half and the periodic cos / sin in its epilogue."""

    def __init__(self, d=32, heads=2, hf_freqs=False):
        super().__init__()
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.heads, self.dh, self.hf_freqs = heads, d // heads, hf_freqs

    def forward(self, x):
        b, s, _ = x.shape
        inv = 1.0 / (10000 ** (torch.arange(0, self.dh, 2, dtype=torch.float32, device=x.device) / self.dh))
        pos = torch.arange(s, dtype=torch.float32, device=x.device)
        if self.hf_freqs:   # as HF's LlamaRotaryEmbedding: a bmm [B, D/2, 1] x [B, 1, S], transposed (not dense)
            freqs = torch.bmm(inv[None, :, None].expand(b, -1, 1), pos[None, None].expand(b, 1, s)).transpose(1, 2)
        else:
            freqs = (pos[:, None] * inv[None, :])[None]
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]

        def rotate_half(t):
            return torch.cat([-t[..., self.dh // 2:], t[..., :self.dh // 2]], -1)

        q = self.q(x).view(b, s, self.heads, self.dh).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, self.dh).transpose(1, 2)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class QKVHeads(nn.Module):
    """Attention's inputs as HF's GPT-2 makes them (fused=True: one QKV projection with a bias, split into q, k and
    v) or as Llama's v projection (fused=False: one bias-free projection): seen as heads and transposed, k and v
    copied for the key / value cache as HF's cache does (`cat` onto an empty cache: a clone that keeps the layout;
    contiguous=True: `.contiguous()`, a copy to [B, H, S, D] instead), and q, k, v read by attention. Returns
    (attention, k, v). ComFuse stores the fused projection in parts (comfuse/parts.py): the first kind of copy goes.
    The epilogue (`scale`: a multiply after the GEMM) makes the region more than cuBLAS alone."""

    def __init__(self, d=32, heads=2, fused=True, contiguous=False, scale=None):
        super().__init__()
        self.fused, self.heads, self.dh, self.contiguous, self.scale = fused, heads, d // heads, contiguous, scale
        self.proj = nn.Linear(d, 3 * d if fused else d, bias=fused)

    def forward(self, x):
        b, s, d = x.shape

        def heads(t):
            return t.view(b, s, self.heads, self.dh).transpose(1, 2)

        def copy(t):
            return t.contiguous() if self.contiguous else t.clone()

        y = self.proj(x) if self.scale is None else self.proj(x) * self.scale
        if not self.fused:
            v = copy(heads(y))
            return v * 2.0, v
        q, k, v = y.split(d, dim=2)
        q, k, v = heads(q), copy(heads(k)), copy(heads(v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True), k, v


class ClassifierHead(nn.Module):
    """Pooler (Linear + tanh) and a classifier Linear followed by softmax over the classes."""

    def __init__(self, d=32, classes=10):
        super().__init__()
        self.pool = nn.Linear(d, d)
        self.cls = nn.Linear(d, classes)

    def forward(self, x):
        return torch.softmax(self.cls(torch.tanh(self.pool(x))), dim=-1)


class CumsumBeforeNorm(nn.Module):
    """An op the Graph IR does not have (cumsum) between the matmul and the LayerNorm, and a transpose (which the
    IR has but an epilogue cannot absorb) before a softmax."""

    def __init__(self, d=32):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        h = self.lin(x)
        return self.ln(h.cumsum(-1)), torch.softmax(h.transpose(-1, -2), dim=-1)


class CumsumCycle(nn.Module):
    """cumsum of the GEMM output added back to it: fusing the add would make a cycle through torch."""

    def __init__(self, d=32):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        h = self.lin(x)
        return self.ln(h + h.cumsum(-1))


class MixedDtypeBlock(nn.Module):
    """A bf16 MLP block (Linear + GELU, Linear + residual + LayerNorm) beside an fp32 batched GEMM, as in a
    Llama rotary embedding (inv_freq @ positions in fp32) or an upcast attention score: the fp32 bmm must stay
    in torch in fp32 while the bf16 regions still fuse. Cast the module to bf16 (its fp32 buffer stays fp32)."""

    def __init__(self, d=32, hidden=64):
        super().__init__()
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.ln = nn.LayerNorm(d)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d), persistent=False)

    def _apply(self, fn, recurse=True):   # keep inv_freq fp32 through .to(torch.bfloat16), as HF rotary does
        inv = self.inv_freq
        out = super()._apply(fn, recurse)
        self.inv_freq = inv.to(self.ln.weight.device)
        return out

    def forward(self, x):
        b, s, d = x.shape
        pos = (torch.ones_like(x[..., :1]).float().cumsum(1) - 1).transpose(1, 2)   # [b, 1, s]: 0 .. s-1
        freqs = torch.bmm(self.inv_freq[None, :, None].expand(b, -1, 1).float(), pos).transpose(1, 2)  # fp32 GEMM
        rot = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(x.dtype)
        h = self.ln(x + self.down(F.gelu(self.up(x))))
        return h * rot
