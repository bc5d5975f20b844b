"""Attention masks computed from constants, made what eager passes before a Dynamo graph is traced: dropped where
they mask nothing, turned back into is_causal=True where they are the causal mask.

Under torch.compile, Hugging Face's mask helpers build an explicit all-True boolean mask for a bidirectional
attention that eager runs with no mask at all: they skip the mask only when not exporting, and
torch.compiler.is_exporting() is True under Dynamo with torch 2.11, so ViT's graph computes `arange(S) >= 0`
expanded to [B, 1, S, S] and passes it to scaled_dot_product_attention. With a mask SDPA cannot take the flash
kernel, and where S is not a multiple of 8 (ViT's 197 patches + 1) neither the memory-efficient nor cuDNN's, so
the trace decomposes the call into the math path (fp32 bmm and softmax): ViT-base ran 1.8x eager's time on the
H200 (docs/log/2026-12-06.md, runs d and e).

The same helpers build an explicit causal mask (`kv_index <= q_index`, all constants) for GPT-2's and Llama's
attention under torch.compile, where eager passes is_causal=True: with it SDPA runs a masked kernel over every
block instead of skipping the blocks above the diagonal.

A mask computed from constants alone (no graph input, no parameter, no random or uninitialized op) is evaluated
here, once, at compile time. Where it keeps every position (a bool mask all True, a float mask all 0), the call
gets attn_mask=None; where it is a bool mask of a square attention (as many queries as keys) equal to the lower
triangle, diagonal included, in every batch and head, the call gets attn_mask=None and is_causal=True. Both are the
same attention, which SDPA can then run on its fused kernels as eager does.
"""
import logging

import torch

log = logging.getLogger("comfuse")

# scaled_dot_product_attention as a Dynamo graph calls it
SDPA_TARGETS = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)
# ops whose value is not a function of their arguments (random, uninitialized memory)
_NOT_PURE = ("rand", "bernoulli", "dropout", "normal", "uniform", "empty", "multinomial", "poisson", "exponential",
             "geometric", "cauchy", "random")
_MAX_NODES = 64   # a mask's computation is a handful of ops; larger ones are left alone


def _mask_of(n: torch.fx.Node):
    """(where, the mask node): where is ("kw", "attn_mask") or ("arg", 3); None without a mask node."""
    if isinstance(n.kwargs.get("attn_mask"), torch.fx.Node):
        return ("kw", "attn_mask"), n.kwargs["attn_mask"]
    if len(n.args) > 3 and isinstance(n.args[3], torch.fx.Node):
        return ("arg", 3), n.args[3]
    return None


def constant_value(node: torch.fx.Node, memo: dict | None = None):
    """The value of `node` computed from constants alone, or None where it depends on a graph input, an attribute,
    a module call or an op that is not a pure function of its arguments, or takes more than _MAX_NODES nodes."""
    memo = {} if memo is None else memo
    seen = [0]

    def value(n):
        if n in memo:
            return memo[n]
        seen[0] += 1
        if seen[0] > _MAX_NODES or n.op not in ("call_function", "call_method"):
            memo[n] = None
            return None
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target))
        if any(w in name.lower() for w in _NOT_PURE):
            memo[n] = None
            return None
        missing = []

        def arg(a):
            v = value(a)
            if v is None:
                missing.append(a)
            return v

        args = torch.fx.node.map_aggregate(torch.fx.node.map_arg(n.args, arg), _off_meta)
        kwargs = torch.fx.node.map_aggregate(torch.fx.node.map_arg(n.kwargs, arg), _off_meta)
        if missing:
            memo[n] = None
            return None
        with torch.no_grad():
            out = getattr(args[0], n.target)(*args[1:], **kwargs) if n.op == "call_method" else n.target(*args, **kwargs)
        memo[n] = out
        return out

    return value(node)


def _off_meta(v):
    """A meta tensor has no values: a constant a graph builds on the meta device (a model captured without weights,
    comfuse.capture on meta) is computed on the CPU instead, so that its mask is judged as it is on a GPU."""
    if isinstance(v, torch.device) and v.type == "meta":
        return torch.device("cpu")
    return "cpu" if isinstance(v, str) and v == "meta" else v


def keeps_every_position(mask) -> bool:
    """Whether an SDPA mask value masks nothing: bool all True, or a float (additive) mask all 0."""
    if not isinstance(mask, torch.Tensor) or mask.numel() == 0:
        return False
    if mask.dtype == torch.bool:
        return bool(mask.all())
    if mask.is_floating_point():
        return bool((mask == 0).all())
    return False


def is_causal_mask(mask, q_len: int, k_len: int) -> bool:
    """Whether an SDPA mask value is what is_causal=True means for a square attention: bool, its last two dims
    [L, L] with L queries and L keys, True exactly on and below the diagonal in every batch and head."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() < 2 or q_len != k_len:
        return False
    if tuple(mask.shape[-2:]) != (q_len, k_len):
        return False
    tril = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device).tril()
    return bool(torch.equal(mask, tril.expand_as(mask)))


def _seq_lens(n: torch.fx.Node):
    """The query and key sequence lengths of an SDPA call (its q's and k's example values), or None."""
    q, k = (a.meta.get("example_value") if isinstance(a, torch.fx.Node) else None for a in n.args[:2])
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)):
        return None
    lq, lk = q.shape[-2], k.shape[-2]
    if not (type(lq) is int and type(lk) is int):   # (a symbolic length: int() on it would add a guard)
        return None
    return lq, lk


def _set_arg(n: torch.fx.Node, kind: str, key, value) -> None:
    if kind == "kw":
        n.kwargs = {**n.kwargs, key: value}
    else:
        n.args = n.args[:key] + (value,) + n.args[key + 1:]


def drop_trivial_masks(gm: torch.fx.GraphModule) -> dict:
    """On each scaled_dot_product_attention call of a Dynamo graph whose mask is computed from constants alone: a
    mask that keeps every position becomes attn_mask=None, and the causal mask of a square attention becomes
    attn_mask=None with is_causal=True (see the module's docstring). Returns {"dropped": n, "causal": n}."""
    done = {"dropped": 0, "causal": 0}
    memo: dict = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in SDPA_TARGETS:
            continue
        found = _mask_of(n)
        if found is None:
            continue
        (kind, key), mask = found
        try:
            v = constant_value(mask, memo)
        except Exception:   # (an op that does not run outside the trace: leave the mask as it is)
            continue
        if keeps_every_position(v):
            _set_arg(n, kind, key, None)
            done["dropped"] += 1
            continue
        if not (isinstance(v, torch.Tensor) and v.dtype == torch.bool):
            continue
        lens = _seq_lens(n)
        already_causal = n.kwargs.get("is_causal", n.args[5] if len(n.args) > 5 else False)
        if lens and already_causal is False and is_causal_mask(v, *lens):
            _set_arg(n, kind, key, None)
            _set_arg(n, *(("arg", 5) if len(n.args) > 5 else ("kw", "is_causal")), True)
            done["causal"] += 1
    if done["dropped"] or done["causal"]:
        gm.graph.eliminate_dead_code()
        gm.recompile()
        log.info("comfuse: of the attention masks computed from constants at compile time, %d masking nothing dropped "
                 "and %d causal ones replaced by is_causal=True, so SDPA can take its fused kernels as in eager",
                 done["dropped"], done["causal"])
    return done
