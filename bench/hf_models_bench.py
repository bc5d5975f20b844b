"""Hugging Face models through torch.compile on the GPU: backend="comfuse" against backend="inductor" in the same
Inductor mode, and eager; bf16 inference; models built from configs with random weights (no downloads).

    python3 bench/hf_models_bench.py [--models bert,llama,gpt2 | testbed] [--modes default,max-autotune-no-cudagraphs,reduce-overhead]
                                     [--comfuse planner,all] [--out FILE.csv] [--budget-s S] [--iters N] [--dynamic]

Models (the real-model test bed): bert = BertModel(BertConfig()) at 32 x 256 with a padding mask; bert-large (24
layers, 1024) at 32 x 512; llama = a 4-layer LlamaModel (hidden 1024, SwiGLU 2816, 16 heads, RMSNorm, rotary) at
16 x 512; gpt2 = a 6-layer GPT2Model at 16 x 512; vit = ViTModel(ViTConfig()) (ViT-base, patch 16) on 64 images of
224 x 224; qwen2 = a 4-layer Qwen2Model (hidden 1024, SwiGLU 2816, 16 heads, 4 key/value heads: grouped-query
attention, biased Q/K/V) at 16 x 512; opt = a 6-layer OPTModel at OPT-125m's widths (pre-norm LayerNorm, ReLU FFN)
at 16 x 512; gemma = a 4-layer GemmaModel (hidden 1024, GeGLU 4096, 8 heads of 128, one key/value head, RMSNorm
scaled by 1 + w) at 16 x 512. "small" = BERT-base at 1 x 128 (the small-batch latency case).

Per model: eager; then per mode, Inductor and ComFuse (per --comfuse variant: "planner" is what a user gets,
"all" also fuses the regions the planner declines for speed only; "+defer" after either, e.g. "planner+defer",
finishes each LayerNorm / RMSNorm in the GEMMs that read it, options={"defer_norms": True}, and notes the folded
weights' count, memory and folding time; "+sdpa" keeps each scaled_dot_product_attention call whole,
options={"attention": "eager"}, e.g. "planner+sdpa"; "+ind" leaves each to Inductor, options={"attention":
"inductor"}). Every compiled output is checked against eager (normwise relative error <= 2e-2 in bf16), and its
error against an fp32 copy of the model is printed, ComFuse's also as a multiple of Inductor's (the target: <= 1.1x;
a note where it is over). ComFuse's fused regions are counted from the post-grad pass's reports
(comfuse.inductor.reports()) and classified: "norm" (a row reduction: LayerNorm / RMSNorm) and "act" (an
activation: GELU, gelu_new's tanh, SiLU); with fuse="all" each model must reach the per-layer counts of the
real-model regions (BERT: out-proj + LN, FFN1 + GELU, FFN2 + LN; Llama: o_proj + RMSNorm, down_proj + RMSNorm; GPT-2:
c_fc + gelu_new, c_proj + LN). The attention kernels of each run are listed from the profiler (flash / cuDNN /
efficient vs an fp32 GEMM), so "attention stays fused" can be read off. After each model, the host time of one
fused-region call as Inductor's code makes it (the op's direct entry; the kernel excluded, averaged over 1000 calls)
of its largest reduction region, and through torch.ops for scale.

--rounds R (default 5): after a mode's variants were compiled and timed one after the other, they are timed again
in R interleaved rounds (eager, Inductor, ComFuse..., then the reverse order, and so on), each round every variant
once, each a median of at least --iters calls and at least 100 ms of them; the "interleaved" columns are the medians
over the rounds with their spread ((slowest - fastest round) ÷ median), the faster of eager's and Inductor's
medians ÷ ComFuse's (the target's ratio) and Inductor's ÷ ComFuse's. Measured back to back, a host-bound
model's ratio moves by tens of percent with the host's speed (docs/log/2026-12-02.md); interleaved, the
drift falls on every variant alike. (Dynamo's cache is reset between compiles, so each variant recompiles once,
untimed, at its first interleaved call.) "GPU us" is one call's kernels' summed durations (profiler, mean of 3
calls): what the kernels alone change, unmoved by the host.

--dynamic: after each model's runs, backend="comfuse" with dynamic=True over three batch/sequence sizes, each
against eager, counting the ComFuse graphs and kernels the later sizes added (expected: none), and timed at each
size against Inductor's own dynamic=True compile.

Prints a table last; exit status 1 if an output is wrong, a required region is missing or a run failed.
Without a GPU: "skipped: no GPU", exit 77. --cpu-smoke runs a tiny GPT-2 (or the tiny configs of --models) on the
CPU through the pass (reference implementation) to check this script's code path.
"""
import argparse
import csv
import logging
import os
import re
import sys
import tempfile
import time
import traceback

import torch

MODELS = ("bert", "bert-large", "llama", "gpt2", "vit", "qwen2", "opt", "gemma", "phi", "small")
# The models the speed targets are held to (docs/pytorch.md, "Measured"): five named ones, and OPT and the
# Gemma-style model for a ReLU FFN and GeGLU with RMSNorm by 1 + w.
TEST_BED = ("bert", "gpt2", "llama", "vit", "qwen2", "opt", "gemma")
LAYERS = {"bert": 12, "bert-large": 24, "llama": 4, "gpt2": 6, "vit": 12, "qwen2": 4, "opt": 6, "gemma": 4,
          "phi": 4, "small": 12}
# fused regions required per layer with fuse="all" (the real-model targets)
REQUIRED = {"bert": {"norm": 2, "act": 1}, "bert-large": {"norm": 2, "act": 1}, "small": {"norm": 2, "act": 1},
            "llama": {"norm": 2}, "gpt2": {"norm": 2, "act": 1}}
ATTN = re.compile(r"flash|fmha|cudnn|efficient_attention|attention|sdpa", re.I)
F32_GEMM = re.compile(r"sgemm|gemm.*f32|f32.*gemm|gemmSN|cutlass_80_simt", re.I)
GPU_RANGE = re.compile(r"Torch-Compiled Region|## |ProfilerStep")   # ranges the profiler shows on the GPU, not work


# Token models with a tiny config for --cpu-smoke: (transformers class prefix, full config, tiny config).
TOKEN_MODELS = {
    "qwen2": ("Qwen2", dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048),
              dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)),
    # OPT-125m's widths: pre-norm LayerNorm, a ReLU FFN, learned positions
    "opt": ("OPT", dict(hidden_size=768, num_hidden_layers=6, num_attention_heads=12, ffn_dim=3072,
                        word_embed_proj_dim=768, vocab_size=50272, max_position_embeddings=2048),
            dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, ffn_dim=128, word_embed_proj_dim=64,
                 vocab_size=128, max_position_embeddings=64)),
    # Phi-1.5's widths, 4 layers: attention and MLP in parallel from one LayerNorm, biased projections, gelu_new,
    # rotary embeddings on half of each head. Outside the test bed, and outside the families the kernel pack's
    # structures come from (bench/hf_families.py): what the pack does for a model it was not made from.
    "phi": ("Phi", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32,
                        partial_rotary_factor=0.5, vocab_size=51200, max_position_embeddings=2048),
            dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                 partial_rotary_factor=0.5, vocab_size=128, max_position_embeddings=64)),
    # Gemma-style: RMSNorm scaled by (1 + w), GeGLU (tanh GELU gate), one key / value head
    "gemma": ("Gemma", dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=1, head_dim=128, vocab_size=32000, max_position_embeddings=2048),
              dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, vocab_size=128, max_position_embeddings=64)),
}


def build(name: str, device: str, tiny: bool = False):
    import transformers as tf

    torch.manual_seed(0)
    if name in ("bert", "small", "bert-large"):
        cfg = tf.BertConfig() if name != "bert-large" else tf.BertConfig(hidden_size=1024, num_hidden_layers=24,
                                                                         num_attention_heads=16,
                                                                         intermediate_size=4096)
        batch, seq = {"bert": (32, 256), "small": (1, 128), "bert-large": (32, 512)}[name]
        model = tf.BertModel(cfg, add_pooling_layer=False)
    elif name == "llama":
        cfg = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                             num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)
        batch, seq = 16, 512
        model = tf.LlamaModel(cfg)
    elif name in TOKEN_MODELS:   # (the full config at 16 x 512, or the tiny one for --cpu-smoke at 2 x 16)
        cls, full, small = TOKEN_MODELS[name]
        cfg = getattr(tf, cls + "Config")(**(small if tiny else full))
        batch, seq = (2, 16) if tiny else (16, 512)
        model = getattr(tf, cls + "Model")(cfg)
    elif name == "vit":   # images, not tokens: pixel_values
        cfg = tf.ViTConfig() if not tiny else tf.ViTConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                                           intermediate_size=128, image_size=32, patch_size=8)
        model = tf.ViTModel(cfg, add_pooling_layer=False)
        model = model.to(device=device, dtype=torch.bfloat16).eval()
        g = torch.Generator().manual_seed(1)
        n = 64 if not tiny else 2
        px = torch.randn(n, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)
        return model, {"pixel_values": px.to(device=device, dtype=torch.bfloat16)}
    else:
        cfg = tf.GPT2Config(n_layer=6) if not tiny else tf.GPT2Config(n_embd=64, n_layer=1, n_head=2,
                                                                      vocab_size=128, n_positions=64)
        batch, seq = (16, 512) if not tiny else (2, 16)
        model = tf.GPT2Model(cfg)
    model = model.to(device=device, dtype=torch.bfloat16 if device == "cuda" else torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g).to(device)
    kwargs = {"input_ids": ids}
    if name.startswith("bert") or name == "small":   # a padding mask: the last quarter of every other row
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[1::2, seq - seq // 4:] = 0
        kwargs["attention_mask"] = mask.to(device)
    return model, kwargs


def resized(kwargs, batch: int, seq: int) -> dict:
    """The model's inputs at another batch size and sequence length (new token ids; the padding mask, if any,
    as build() makes it)."""
    ids = kwargs["input_ids"]
    g = torch.Generator().manual_seed(batch * 1000 + seq)
    out = {"input_ids": torch.randint(0, int(ids.max()) + 1, (batch, seq), generator=g).to(ids.device)}
    if "attention_mask" in kwargs:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[1::2, seq - seq // 4:] = 0
        out["attention_mask"] = mask.to(ids.device)
    return out


def dynamic_check(model, kwargs, cuda: bool) -> dict:
    """backend="comfuse" with dynamic=True over three (batch, sequence) sizes: each output against eager at its
    size, whether the later sizes needed a new graph or a new kernel (expected: no recompiles), and the time
    against Inductor's own dynamic=True compile at each size (`vs_inductor`, Inductor ÷ ComFuse)."""
    import comfuse
    from comfuse import inductor, ops

    b, s = kwargs["input_ids"].shape
    sizes = [(b, s), (max(2, b // 2), s // 2 + 3), (b, max(8, s - 17))]
    torch._dynamo.reset()
    inductor.reset_reports()
    f = torch.compile(model, backend=comfuse.compile_backend(fuse="planner"), dynamic=True)
    errs, kernels_after_first, graphs_after_first, times = [], None, None, []
    for i, (bb, ss) in enumerate(sizes):
        kw = resized(kwargs, bb, ss) if i else kwargs
        errs.append(rel_err(run(f, kw), run(model, kw)))
        times.append(timed(lambda: run(f, kw), 10, cuda))
        if i == 0:
            kernels_after_first, graphs_after_first = len(ops._KERNELS), len(inductor.reports())
    out = dict(sizes=sizes, errs=errs, times=times, new_kernels=len(ops._KERNELS) - kernels_after_first,
               new_graphs=len(inductor.reports()) - graphs_after_first,
               fused=region_kinds(inductor.reports())["total"])
    # Inductor's own dynamic=True compile at the same sizes, each size timed in turn with ComFuse's (interleaved)
    g = torch.compile(model, backend="inductor", dynamic=True)
    out["vs_inductor"] = []
    for i, (bb, ss) in enumerate(sizes):
        kw = resized(kwargs, bb, ss) if i else kwargs
        run(g, kw)
        ti, tc = timed(lambda: run(g, kw), 10, cuda), timed(lambda: run(f, kw), 10, cuda)
        out["vs_inductor"].append(ti / tc)
    return out


def row_ratios(rs, sep: str = ", ") -> str:
    return sep.join(f"{r:.3f}x" for r in rs)


def run(model, kwargs):
    with torch.no_grad():
        return model(**kwargs).last_hidden_state


def timed(fn, iters: int, cuda: bool, fastest: list | None = None) -> float:
    """Median µs of fn() (CUDA events on the GPU). `fastest`, when given, gets the fastest call appended: in a
    host-bound mode the machine's host speed drifts between and within runs (docs/log/2026-12-02.md), and
    the fastest of many calls is the estimate that noise from other work on the host moves least."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e6)
    ts.sort()
    if fastest is not None:
        fastest.append(ts[0])
    return ts[len(ts) // 2]


def fuse_of(variant: str) -> str:
    """A --comfuse variant's fuse option: "planner" / "all" (before any "+")."""
    return variant.split("+")[0]


def defers(variant: str) -> bool:
    """Whether a --comfuse variant finishes norms in their GEMMs ("planner+defer", "all+defer")."""
    return "defer" in variant.split("+")[1:]


def attention_of(variant: str) -> str:
    """A --comfuse variant's attention option: "eager" with "+sdpa" (each SDPA call kept whole, comfuse::sdpa),
    "inductor" with "+ind" (every SDPA call left to Inductor's tracing), else "auto"."""
    flags = variant.split("+")[1:]
    return "eager" if "sdpa" in flags else "inductor" if "ind" in flags else "auto"


def valid_variant(variant: str) -> bool:
    base, *flags = variant.split("+")
    return (base in ("planner", "all") and all(f in ("defer", "sdpa", "ind") for f in flags)
            and len(set(flags)) == len(flags) and not {"sdpa", "ind"} <= set(flags))


def backend_label(row) -> str:
    return row["backend"] + ("" if row["fuse"] == "-" else " " + row["fuse"])


def interleave(compiled, kwargs, rounds: int, iters: int, cuda: bool):
    """Times the variants of one mode in `rounds` interleaved rounds (forward order, then reversed, ...), each a
    median of `iters` calls. `compiled` is [(row, fn)], eager first and Inductor second, then ComFuse's. Sets
    row["us_interleaved"] (the median over rounds) and row["spread_interleaved"] ((slowest - fastest round) ÷ the
    median) on every row, and on every ComFuse row "vs_inductor_interleaved" and "vs_best_interleaved" (the faster
    of eager's and Inductor's medians over this row's: the issue's ratio) with "eager_us_interleaved"."""
    per = [[] for _ in compiled]
    order = list(range(len(compiled)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            f = compiled[i][1]
            per[i].append(timed(lambda: run(f, kwargs), iters, cuda))
    for (row, _), ts in zip(compiled, per):
        ts = sorted(ts)
        row["us_interleaved"] = ts[len(ts) // 2]
        row["spread_interleaved"] = (ts[-1] - ts[0]) / row["us_interleaved"]
    eager, ind = compiled[0][0]["us_interleaved"], compiled[1][0]["us_interleaved"]
    for row, _ in compiled[2:]:
        row["vs_inductor_interleaved"] = f"{ind / row['us_interleaved']:.3f}x"
        row["vs_best_interleaved"] = f"{min(eager, ind) / row['us_interleaved']:.3f}x"
        row["eager_us_interleaved"] = eager


def iters_for(us: float, iters: int, round_ms: float = 100.0) -> int:
    """At least `iters` calls, and at least `round_ms` of them, so that a round shows host cost as steady use does."""
    return max(iters, int(round_ms * 1e3 / us) + 1) if us == us and us > 0 else iters


def float32_copy(model, kwargs):
    """The model and its floating inputs in fp32: the reference both compiled variants' errors are taken against."""
    import copy
    m32 = copy.deepcopy(model).float()
    kw32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kwargs.items()}
    return m32, kw32


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def kernels(fn, cuda: bool, label: str = "", calls: int = 3) -> tuple[str, str, float]:
    """The attention kernels and fp32 GEMM kernels a call runs (profiler, `calls` calls), as short strings, and the
    GPU time of one call: its kernels' summed durations, without the gaps between them. Unlike a wall-clock time,
    that is what the kernels alone change, and the host's speed does not move it. With a label, also prints the
    calls' GPU kernels by total time (the top 10, or $HF_BENCH_TOP: where a slow run's time goes)."""
    if not cuda:
        return "-", "-", float("nan")
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if label else [])) as p:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = p.key_averages()
    names = {e.key for e in events}
    # the GPU's own events (kernels, copies), without the ranges Inductor marks on the GPU around them
    gpu_us = sum(e.device_time_total for e in events
                 if e.device_type == DeviceType.CUDA and not GPU_RANGE.match(e.key)) / calls
    if label:
        timed = sorted(((getattr(e, "device_time_total", 0.0) or getattr(e, "cuda_time_total", 0.0), e.count, e.key)
                        for e in events), reverse=True)
        total = sum(t for t, _, _ in timed if t > 0)
        print(f"{label}: GPU kernels, total {total:.0f} us" + "".join(
            f"\n    {t:9.0f} us {c:4d}x  {k[:110]}" for t, c, k in timed[:int(os.environ.get("HF_BENCH_TOP", 10))] if t > 0))
        # where the host's time goes (a forward whose GPU work is shorter than its host work is host-bound)
        host = sorted(((e.self_cpu_time_total, e.count, e.key) for e in events if e.self_cpu_time_total > 0),
                      reverse=True)
        print(f"{label}: host (self CPU), total {sum(t for t, _, _ in host):.0f} us under the profiler" + "".join(
            f"\n    {t:9.0f} us {c:4d}x  {k[:110]}" for t, c, k in host[:12]))
    attn = sorted(n for n in names if ATTN.search(n))
    f32 = sorted(n for n in names if F32_GEMM.search(n))
    short = lambda xs: ";".join(x[:48] for x in xs[:2]) or "none"  # noqa: E731
    return short(attn), short(f32), gpu_us


def region_kinds(reps) -> dict:
    """Fused regions by kind over the pass's reports: norm (a row reduction), act (an activation), other."""
    from comfuse import _core as C

    kinds = {"norm": 0, "act": 0, "other": 0, "total": 0}
    for rep in reps:
        if rep.analysis is None:
            continue
        pg = rep.analysis.part.graph
        for i in getattr(rep, "fused", ()):
            ops = {C.op_name(pg.node(j).op) for j in rep.analysis.part.regions[i].nodes}
            kinds["total"] += 1
            if ops & {"mean", "sum", "reduce_max"}:
                kinds["norm"] += 1
            elif ops & {"gelu", "tanh", "silu", "sigmoid"}:
                kinds["act"] += 1
            else:
                kinds["other"] += 1
    return kinds


def host_time_us(calls: int = 1000) -> tuple[str, float, float]:
    """Host (CPU) time of one comfuse::fused_region call, the kernel excluded (launches are asynchronous; timed in
    blocks of 100 calls, synchronized in between): the registered region with the most reductions and the largest K
    (BERT-base's FFN2 + residual + LayerNorm after a BERT run), on fresh inputs of its shapes."""
    from comfuse import ops

    if not ops._REGIONS:
        return "-", float("nan"), float("nan")
    key = max(ops._REGIONS, key=lambda k: (ops._REGIONS[k][0].num_stages(), ops._REGIONS[k][0].gemm.k))
    spec = ops._REGIONS[key][0]
    g = spec.gemm
    ins = ops.random_inputs(spec, "cuda")
    a, b, *params = ins
    op = torch.ops.comfuse.fused_region

    def per_call(fn, block: int = 100) -> float:
        # enqueue time only: blocks of 100 calls with an untimed synchronize between them, so that the launch
        # queue never fills (a full queue would make the host wait for the kernels and time them instead)
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        total = 0.0
        for _ in range(max(1, calls // block)):
            t = time.perf_counter()
            for _ in range(block):
                fn()
            total += time.perf_counter() - t
            torch.cuda.synchronize()
        return total / (max(1, calls // block) * block) * 1e6

    # as Inductor's code for the model calls it: the op's direct entry (inductor.py); through torch.ops for scale
    direct = ops.fused_region_direct
    bt = b.t() if g.transpose_b else b
    # the target's two numbers (host per call <= 0.5x torch.mm's) alternate over five rounds: the host's speed drifts
    # within a run, and alike for both
    rounds = [(per_call(lambda: direct(key, ins)), per_call(lambda: torch.mm(a, bt))) for _ in range(5)]
    host = sorted(r[0] for r in rounds)[2]
    mm = sorted(r[1] for r in rounds)[2]
    ratios = sorted(r[0] / r[1] for r in rounds)
    via_op = per_call(lambda: op(key, ins))
    # the parts: the C++ launch alone (RegionKernel.launch on fixed pointers) and one output allocation
    launch = ops._LAUNCH[key]
    outs = [torch.empty(s, dtype=d, device="cuda") for s, d in zip(launch.out_shapes(tuple(a.shape)), launch.out_dtypes)]
    ptrs = ([o.data_ptr() for o in outs], [p.data_ptr() for p in params])
    stream = torch.cuda.current_stream().cuda_stream
    cpp = per_call(lambda: launch.kernel.launch(a.data_ptr(), b.data_ptr(), g.rows, ptrs[0], ptrs[1], stream))
    alloc = per_call(lambda: torch.empty(outs[0].shape, dtype=outs[0].dtype, device="cuda"))
    # what the op costs without the dispatcher (the Python body alone), and two references of this machine's
    # speed: the dispatcher's round trip to a Python kernel that does nothing, and an ATen GEMM call
    body = per_call(lambda: ops._run_gpu(key, ins))
    noop = per_call(lambda: _noop_op()("x", ins))
    fast = ops.fast_path_stats()
    return (f"rows={g.rows} N={g.n} K={g.k} stages={spec.num_stages()}; C++ fast path "
            f"{'on' if fast['enabled'] else 'off'} ({fast['fast']} calls served, {fast['slow']} handed to Python); "
            f"through torch.ops {via_op:.1f} us; parts: C++ launch {cpp:.1f} us, "
            f"one output allocation {alloc:.1f} us, the Python kernel alone (no dispatcher) {body:.1f} us; for "
            f"scale: the dispatcher to a Python kernel that does nothing {noop:.1f} us; torch.mm {mm:.1f} us, "
            f"the fused call ÷ torch.mm over five alternating rounds {ratios[2]:.2f} "
            f"({ratios[0]:.2f}-{ratios[-1]:.2f})"), host, mm


_NOOP = None


def _noop_op():
    """comfuse_bench::noop(str, Tensor[]) -> Tensor[]: fused_region's schema and dispatch, a body that does nothing."""
    global _NOOP
    if _NOOP is None:
        lib = torch.library.Library("comfuse_bench", "DEF")
        lib.define("noop(str key, Tensor[] inputs) -> Tensor[]")
        lib.impl("noop", lambda key, inputs: [inputs[0]], "CUDA")
        _NOOP = (lib, torch.ops.comfuse_bench.noop)
    return _NOOP[1]


def target_table(rows) -> list[str]:
    """The test bed's table (docs/pytorch.md, "Measured"): one line per model, mode and ComFuse variant, against the
    targets: the faster of eager and Inductor ÷ ComFuse over the interleaved rounds (>= 1.10x; spreads beside),
    ComFuse's error against the fp32 run ÷ Inductor's (<= 1.1x), the compile time the first call adds to
    Inductor's (<= 15 s), and the host time of a fused call ÷ torch.mm's (<= 0.5x)."""
    host = {r["model"]: r for r in rows if r["mode"] == "host time"}
    nan = float("nan")
    out = ["| model | mode | variant | eager µs | Inductor µs | ComFuse µs | faster of eager and Inductor ÷ ComFuse "
           "(target >= 1.10x) | spreads eager / Inductor / ComFuse | error vs fp32 ÷ Inductor's (<= 1.1x) | "
           "first call added (<= 15 s) | host per call ÷ torch.mm (<= 0.5x) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["backend"] != "comfuse" or r["mode"] in ("host time", "dynamic") or "us_interleaved" not in r:
            continue
        ind = next((x for x in rows if x["model"] == r["model"] and x["mode"] == r["mode"]
                    and x["backend"] == "inductor" and "us_interleaved" in x), None)
        eager_il = r.get("eager_us_interleaved", nan)
        eager_sp = next((x.get("spread_interleaved", nan) for x in rows if x["model"] == r["model"]
                         and x["mode"] == r["mode"] and x["backend"] == "eager"), nan)
        h = host.get(r["model"])
        ev = r.get("err_vs_inductor")
        out.append(f"| {r['model']} | {r['mode']} | {r['fuse']} | {eager_il:.0f} | "
                   f"{ind['us_interleaved'] if ind else nan:.0f} | {r['us_interleaved']:.0f} | "
                   f"**{r.get('vs_best_interleaved', '-')}** | {eager_sp:.1%} / "
                   f"{ind['spread_interleaved'] if ind else nan:.1%} / {r['spread_interleaved']:.1%} | "
                   f"{'-' if ev is None else f'{ev:.2f}x'} | "
                   f"{r.get('compile_s', nan) - (ind.get('compile_s', nan) if ind else nan):.0f} s | "
                   f"{(h['us'] / h['mm_us']) if h else nan:.2f}x |")
    return out


def first_call_table(rows) -> list[str]:
    """The first call of each model, mode and ComFuse variant (--first-call, --cold-cache): Inductor's compile, ComFuse's,
    the time ComFuse adds (target <= 15 s), the kernels nvcc compiled for it (those the kernel pack held compile
    none), and ComFuse's error against the fp32 run ÷ Inductor's (<= 1.1x)."""
    nan = float("nan")
    out = ["| model | mode | variant | Inductor's first call s | ComFuse's first call s | added (target <= 15 s) | "
           "kernels compiled (empty cache) | error vs fp32 ÷ Inductor's (<= 1.1x) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["backend"] != "comfuse" or "compile_s" not in r:
            continue
        ind = next((x for x in rows if x["model"] == r["model"] and x["mode"] == r["mode"]
                    and x["backend"] == "inductor" and "compile_s" in x), None)
        ind_s = ind["compile_s"] if ind else nan
        ev = r.get("err_vs_inductor")
        out.append(f"| {r['model']} | {r['mode']} | {r['fuse']} | {ind_s:.1f} | {r['compile_s']:.1f} | "
                   f"**{r['compile_s'] - ind_s:.1f} s** | {r.get('kernels_compiled', '-')} | "
                   f"{'-' if ev is None else f'{ev:.2f}x'} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=None,
                    help="default: bert,llama,gpt2 (with --cpu-smoke: gpt2); 'testbed': the seven families of the "
                         "targets' table (" + ",".join(TEST_BED) + ")")
    ap.add_argument("--modes", default="default,max-autotune-no-cudagraphs,reduce-overhead")
    ap.add_argument("--comfuse", default="planner,all")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per mode (0: none)")
    ap.add_argument("--out", default="hf_models.csv")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new runs after this many seconds")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--cold-cache", action="store_true",
                    help="every ComFuse compile starts from an empty kernel cache of its own (COMFUSE_CACHE_DIR): the "
                         "first call of a new user; the package's kernel pack, if it has one, is still used")
    ap.add_argument("--first-call", action="store_true",
                    help="only the first call: compile time and errors of each variant, no timing rounds")
    ap.add_argument("--dynamic", action="store_true",
                    help="also run backend='comfuse' with dynamic=True over three batch/sequence sizes")
    a = ap.parse_args()
    import comfuse
    from comfuse import inductor

    cuda = torch.cuda.is_available() and not a.cpu_smoke
    if not cuda and not a.cpu_smoke:
        print("skipped: no GPU")
        return 77
    logging.basicConfig(filename=a.out.replace(".csv", "") + ".log", level=logging.INFO, filemode="w")
    logging.getLogger("comfuse").setLevel(logging.INFO)
    device = "cuda" if cuda else "cpu"
    t0 = time.time()
    rows, failures = [], []
    models = [m for m in (a.models or ("gpt2" if a.cpu_smoke else "bert,llama,gpt2")).split(",") if m]
    models = [x for m in models for x in (TEST_BED if m == "testbed" else (m,))]
    modes = ["default"] if a.cpu_smoke else [m for m in a.modes.split(",") if m]
    variants = [v for v in a.comfuse.split(",") if v]
    bad = [v for v in variants if not valid_variant(v)]
    if bad:
        raise SystemExit(f"unknown --comfuse variants {bad} (planner or all, then +defer and / or one of +sdpa, +ind)")
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, comfuse {comfuse.__version__}, "
          f"{torch.cuda.get_device_name() if cuda else 'CPU smoke'}", flush=True)
    for name in models:
        if name not in MODELS:
            raise SystemExit(f"unknown model {name!r} (one of {MODELS})")
        model, kwargs = build(name, device, tiny=a.cpu_smoke)
        ref = run(model, kwargs)
        m32, kw32 = float32_copy(model, kwargs)
        ref32 = run(m32, kw32)   # errors against fp32: ComFuse's must stay within 1.1x Inductor's
        del m32
        if a.first_call:
            run(model, kwargs)
            eager_us, iters, (attn, f32, gpu_us) = float("nan"), 1, ("-", "-", float("nan"))
        else:
            eager_us = timed(lambda: run(model, kwargs), a.iters, cuda)
            iters = iters_for(eager_us, a.iters)   # back to back: eager's count for every variant of this model
            attn, f32, gpu_us = kernels(lambda: run(model, kwargs), cuda)
        eager_row = dict(model=name, mode="eager", backend="eager", fuse="-", us=eager_us, vs_inductor="-",
                         rel_err=0.0, fused="-", attention=attn, f32_gemm=f32, gpu_us=gpu_us, note="",
                         err_fp32=rel_err(ref, ref32))
        rows.append(eager_row)
        print(f"{name}: eager {eager_us:.0f} us; attention {attn}; fp32 GEMMs {f32}", flush=True)
        for mode in modes:
            ind_us = ind_min = ind_gpu = ind_err32 = None
            compiled = [(dict(eager_row), model)]   # (row, fn) of this mode for the interleaved rounds, eager first
            for backend, fuse in [("inductor", "-")] + [("comfuse", v) for v in variants]:
                if time.time() - t0 > a.budget_s:
                    print(f"budget reached: skipping {name} {mode} {backend} {fuse}")
                    continue
                torch._dynamo.reset()
                inductor.reset_reports()
                row = dict(model=name, mode=mode, backend=backend, fuse=fuse, us=float("nan"), vs_inductor="-",
                           rel_err=float("nan"), fused="-", attention="-", f32_gemm="-", note="")
                try:
                    m = mode if mode != "default" else None
                    if backend == "inductor":
                        f = torch.compile(model, mode=m)
                    elif a.cpu_smoke:
                        f = torch.compile(model, backend="comfuse",
                                          options={"reference": True, "rewrite": "keep", "fuse": fuse_of(fuse),
                                                   "defer_norms": defers(fuse), "attention": attention_of(fuse)})
                    else:
                        f = torch.compile(model, backend=comfuse.compile_backend(mode=m, fuse=fuse_of(fuse),
                                                                                 defer_norms=defers(fuse),
                                                                                 attention=attention_of(fuse)))
                    cache = None
                    if a.cold_cache and backend == "comfuse":   # an empty kernel cache: what a new user's first call meets
                        cache = tempfile.mkdtemp(prefix="comfuse-cold-cache-")
                        os.environ["COMFUSE_CACHE_DIR"] = cache
                    tc = time.time()
                    folds0 = comfuse.fold_stats()
                    out = run(f, kwargs)
                    row["compile_s"] = time.time() - tc
                    row["note"] = f"compile {row['compile_s']:.0f} s"
                    if cache:   # the kernels nvcc compiled into it (those found in the kernel pack leave nothing)
                        row["kernels_compiled"] = sum(1 for e in os.scandir(cache) if e.is_dir() and len(e.name) == 32)
                        row["note"] += f" (empty cache: {row['kernels_compiled']} kernel(s) compiled)"
                    if defers(fuse):
                        st = {k: v - folds0[k] for k, v in comfuse.fold_stats().items()}   # this compile's
                        row["note"] += f"; {st['folds']} folded weights, {st['bytes'] / 2**20:.1f} MB, {st['ms']:.0f} ms"
                    row["rel_err"] = rel_err(out, ref)
                    row["err_fp32"] = rel_err(out, ref32)
                    fastest: list = []
                    if a.first_call:
                        fastest.append(float("nan"))
                    else:
                        row["us"] = timed(lambda: run(f, kwargs), iters, cuda, fastest)
                    row["us_min"] = fastest[0]
                    compiled.append((row, f))
                    if not a.first_call:
                        row["attention"], row["f32_gemm"], row["gpu_us"] = kernels(lambda: run(f, kwargs), cuda,
                                                                                    f"{name} {mode} {backend} {fuse}")
                    if backend == "inductor":
                        ind_us, ind_min, ind_gpu, ind_err32 = row["us"], row["us_min"], row.get("gpu_us", float("nan")), row["err_fp32"]
                    else:
                        if ind_us:   # the error target: within 1.1x Inductor's, both against the fp32 run
                            row["err_vs_inductor"] = row["err_fp32"] / max(ind_err32, 1e-30)
                            if row["err_vs_inductor"] > 1.1:
                                row["note"] += f"; error {row['err_vs_inductor']:.2f}x Inductor's (fp32 reference)"
                        k = region_kinds(inductor.reports())
                        row["fused"] = f"{k['total']} (norm {k['norm']}, act {k['act']}, other {k['other']})"
                        if ind_us:
                            # fastest calls' ratio first (less moved by host noise), the medians' after it
                            row["vs_inductor"] = f"{ind_min / row['us_min']:.3f}x (median {ind_us / row['us']:.3f}x)"
                            if ind_gpu == ind_gpu and row["gpu_us"] > 0:   # (nan without a GPU)
                                row["vs_inductor_gpu"] = f"{ind_gpu / row['gpu_us']:.3f}x"
                        need = REQUIRED.get(name, {})
                        layers = 1 if a.cpu_smoke else LAYERS[name]
                        missing = {kk: (k[kk], n * layers) for kk, n in need.items() if k[kk] < n * layers}
                        if fuse == "all" and missing and not a.cpu_smoke:   # (not "+defer": its norms are in GEMMs)
                            row["note"] += f"; MISSING regions {missing}"
                            failures.append(f"{name} {mode} fuse=all: regions missing {missing}")
                    if not row["rel_err"] <= 2e-2:
                        failures.append(f"{name} {mode} {backend} {fuse}: rel err {row['rel_err']:.3g}")
                        row["note"] += "; WRONG OUTPUT"
                except Exception as e:   # record, go on with the next configuration
                    row["note"] = f"FAILED {type(e).__name__}: {str(e)[:120]}"
                    failures.append(f"{name} {mode} {backend} {fuse}: {type(e).__name__}: {e}")
                    traceback.print_exc()
                rows.append(row)
                print(f"{name} {mode} {backend} {fuse}: {row['us']:.0f} us {row['vs_inductor']} err "
                      f"{row['rel_err']:.2e} fused {row['fused']} {row['note']}", flush=True)
            if a.rounds > 0 and not a.first_call and len(compiled) > 2 and compiled[1][0]["backend"] == "inductor":
                try:
                    # each round >= 100 ms of the fastest variant's calls (a CUDA-graph replay is faster than eager)
                    fastest_us = min(r["us"] for r, _ in compiled if r["us"] == r["us"])
                    interleave(compiled, kwargs, a.rounds, iters_for(fastest_us, a.iters), cuda)
                    for row, _ in compiled:
                        print(f"{name} {mode} {backend_label(row)}: interleaved {row['us_interleaved']:.0f} us "
                              f"(spread {row['spread_interleaved']:.1%}) {row.get('vs_best_interleaved', '')} "
                              f"{row.get('vs_inductor_interleaved', '')}", flush=True)
                    rows.append(dict(compiled[0][0], mode=mode, backend="eager", note="interleaved with this mode"))
                except Exception as e:   # the back-to-back numbers stand; say why there are no others
                    print(f"{name} {mode}: interleaved rounds failed ({type(e).__name__}: {e})", flush=True)
        if a.dynamic and "input_ids" in kwargs and (cuda or a.cpu_smoke) and time.time() - t0 <= a.budget_s:
            row = dict(model=name, mode="dynamic", backend="comfuse", fuse="planner", us=float("nan"),
                       vs_inductor="-", rel_err=float("nan"), fused="-", attention="-", f32_gemm="-", note="")
            try:
                d = dynamic_check(model, kwargs, cuda)
                row.update(us=d["times"][-1], rel_err=max(d["errs"]), fused=str(d["fused"]),
                           vs_inductor=row_ratios(d["vs_inductor"], " / "),
                           note=f"sizes {d['sizes']}: {', '.join(f'{t:.0f}' for t in d['times'])} us; after the "
                                f"first: {d['new_graphs']} new ComFuse graph(s), {d['new_kernels']} new kernel(s); "
                                f"Inductor dynamic=True / ComFuse per size: {row_ratios(d['vs_inductor'])}")
                if not row["rel_err"] <= 2e-2:
                    failures.append(f"{name} dynamic: rel err {row['rel_err']:.3g}")
            except Exception as e:
                row["note"] = f"FAILED {type(e).__name__}: {str(e)[:120]}"
                failures.append(f"{name} dynamic: {type(e).__name__}: {e}")
                traceback.print_exc()
            rows.append(row)
            print(f"{name} dynamic: {row['note']} err {row['rel_err']:.2e}", flush=True)
        if cuda and not a.first_call and "comfuse" in {r["backend"] for r in rows if r["model"] == name}:
            try:
                what, us, mm_us = host_time_us()
                print(f"{name}: host time per fused-region call {us:.1f} us, {us / mm_us:.2f}x torch.mm's ({what}; "
                      f"the target: <= 0.5x)")
                rows.append(dict(model=name, mode="host time", backend="comfuse", fuse="-", us=us, mm_us=mm_us,
                                 vs_inductor="-",
                                 rel_err=float("nan"), fused="-", attention="-", f32_gemm="-",
                                 note=f"per fused_region call, kernel excluded: {what}"))
            except Exception as e:
                print(f"{name}: host time not measured ({type(e).__name__}: {e})")
        del model
        if cuda:
            torch.cuda.empty_cache()
    with open(a.out, "w", newline="") as fh:
        fields = list(dict.fromkeys(k for r in rows for k in r))   # every row's keys, in first-seen order
        w = csv.DictWriter(fh, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)
    print("\n| model | mode | backend | fuse | us | Inductor / this | interleaved us (spread) | faster of eager and "
          "Inductor / this, interleaved | Inductor / this, interleaved | GPU us | Inductor / this, GPU time | rel err "
          "| err vs fp32 (÷ Inductor's) | fused regions | attention kernels | fp32 GEMMs | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        il, e32, ev = r.get("us_interleaved"), r.get("err_fp32"), r.get("err_vs_inductor")
        il_s = "-" if il is None else f"{il:.0f} ({r['spread_interleaved']:.1%})"
        e32_s = ("-" if e32 is None else f"{e32:.2e}") + ("" if ev is None else f" ({ev:.2f}x)")
        print(f"| {r['model']} | {r['mode']} | {r['backend']} | {r['fuse']} | {r['us']:.0f} | {r['vs_inductor']} | "
              f"{il_s} | {r.get('vs_best_interleaved', '-')} | {r.get('vs_inductor_interleaved', '-')} | "
              f"{r.get('gpu_us', float('nan')):.0f} | {r.get('vs_inductor_gpu', '-')} | {r['rel_err']:.2e} | "
              f"{e32_s} | {r['fused']} | {r['attention']} | {r['f32_gemm']} | {r['note']} |")
    if a.first_call:
        print("\nThe first call" + (" (each ComFuse compile from an empty kernel cache)" if a.cold_cache else "") + ":\n")
        for line in first_call_table(rows):
            print(line)
    else:
        print("\nAgainst the targets (interleaved rounds; docs/pytorch.md keeps this table):\n")
        for line in target_table(rows):
            print(line)
    for f in failures:
        print("FAILURE:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
