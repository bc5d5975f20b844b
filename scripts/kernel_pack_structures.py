"""Writes the kernel pack's structure list (kernels/pack/structures.txt): the Specs the PyTorch backend registers for
the Hugging Face model families of bench/hf_families.py (real widths, two layers), one per kernel
(FusionSpec.kernel_hash: N and K left out). The package's build compiles them over a grid of sizes into
comfuse/kernel_pack (`comfuse pack`), so a model's first call finds its kernels built.

    python3 scripts/kernel_pack_structures.py --device cuda [--out FILE]       on the GPU machine: the list
    python3 scripts/kernel_pack_structures.py --device cuda --models gpt2,phi --out FILE
    PYTHONPATH=python .venv/bin/python scripts/kernel_pack_structures.py --device meta --models gpt2 --out FILE

--device cuda compiles each model with backend="comfuse" (fuse="all"; a decoder with and without its key / value cache;
nothing timed, nvcc replaced by a program that fails, so no kernel is built) and takes the Specs it registers: those of the regions Inductor's pass finds in the
graphs Inductor makes for the GPU, which is what a model's first call compiles. --device meta (no GPU) captures the
Dynamo graphs on the meta device and rewrites them as the backend would: the same structures except where Inductor's
GPU graphs differ (GPT-2's and Qwen2's Q/K/V projections, 2026-12-06), so a list made there is an estimate, for
`comfuse pack LIST --covers FILE`. --models: models of bench/hf_models_bench.py (its test bed and the models outside
it) instead of the families."""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import comfuse  # noqa: E402
from comfuse import analysis, ops  # noqa: E402
from hf_families import FAMILIES  # noqa: E402

C = comfuse._core
OUT = os.path.join(ROOT, "kernels", "pack", "structures.txt")


def family(name: str, device: str):
    with torch.device(device):   # (built there: no weights on meta, no copy from the CPU on the GPU)
        model, inputs = FAMILIES[name]()
    model = model.to(dtype=torch.bfloat16).eval()
    return model, dict(zip(["input_ids"] if name != "vit-base" else ["pixel_values"], inputs))


def bench_model(name: str, device: str):
    """A model of bench/hf_models_bench.py (its test bed, and the models outside it)."""
    import hf_models_bench

    model, kwargs = hf_models_bench.build(name, device)   # (as the benchmark calls it: a decoder with its cache)
    if device == "meta" and getattr(model.config, "use_cache", False):   # (a cache update does not trace on meta)
        model.config.use_cache = False
    return model, kwargs


def specs_on_meta(model, kwargs, what: str) -> list:
    """The Specs the backend would register for every region of the model it may fuse, from the Dynamo graphs
    captured on the meta device (an estimate: see the module's docstring)."""
    specs = []
    torch._dynamo.reset()
    for rep in comfuse.capture(model, drop_masks=True, **kwargs):   # (the masks as the backend has them)
        if rep.analysis is None:
            continue
        fuse = {ri for ri, r in enumerate(rep.regions) if C.plan_region(r.spec).verdict != C.Verdict.CannotServe}
        if not fuse:
            continue
        before = set(ops._REGIONS)
        try:
            analysis.keep_rewrite(rep, fuse, ctas=1)
        except Exception as e:   # regions that do not line up with whole ATen nodes: the backend keeps torch there
            print(f"{what}: graph {rep.index}: not rewritten ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        specs += [ops._REGIONS[k][0] for k in ops._REGIONS if k not in before]
    return specs


def specs_on_gpu(model, kwargs, what: str) -> list:
    """The Specs backend="comfuse" registers compiling the model on the GPU (every region it may fuse: fuse="all"),
    nothing timed and no kernel built (see main); a decoder's twice, with and without its key / value cache (the
    default, use_cache=True, returns the keys and values: their projection stores other outputs, e.g. GPT-2's Q/K/V
    projection, 2026-12-06)."""
    out = []
    caches = (False, True) if hasattr(model.config, "use_cache") else (None,)
    for cache in caches:
        if cache is not None:
            model.config.use_cache = cache
        torch._dynamo.reset()
        before = set(ops._REGIONS)
        f = torch.compile(model, backend=comfuse.compile_backend(fuse="all"))
        with torch.no_grad():
            f(**kwargs)
        torch.cuda.synchronize()
        out += [ops._REGIONS[k][0] for k in ops._REGIONS if k not in before]
    return out


def structures(models: dict, device: str) -> str:
    """The list: one Spec per kernel, the first model's (name -> thunk returning (model, kwargs)) first."""
    seen, blocks = {}, []
    for name, make in models.items():
        model, kwargs = make()
        specs = specs_on_gpu(model, kwargs, name) if device == "cuda" else specs_on_meta(model, kwargs, name)
        del model
        print(f"{name}: {len(specs)} region Specs", file=sys.stderr, flush=True)
        for fs in specs:
            h = fs.kernel_hash()
            if h in seen:
                continue
            seen[h] = name
            g = fs.gemm
            blocks.append(f"# {name}: {len(fs.params)} params, {len(fs.outputs)} outputs, {fs.num_stages()} stage(s); "
                          f"captured at {g.rows}x{g.n}x{g.k}; kernel {h:016x}\n" + fs.to_text())
    how = ("compiled on the GPU with backend=\"comfuse\"" if device == "cuda"
           else "captured on the meta device (an estimate)")
    head = ("# The kernel pack's structures (comfuse pack; the package's build compiles them into comfuse/kernel_pack).\n"
            f"# Written by scripts/kernel_pack_structures.py: the Specs of the regions of {', '.join(models)}, {how};\n"
            "# one Spec per kernel (N and K are the grid's). Do not edit.\n")
    return head + "\n".join(blocks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "meta"), required=True)
    ap.add_argument("--models", help="models of bench/hf_models_bench.py (comma-separated) instead of the families")
    ap.add_argument("--out", default=OUT, help="where to write the list (default: the pack's)")
    args = ap.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("kernel_pack_structures: --device cuda needs a GPU", file=sys.stderr)
            return 2
        # nothing timed, and no kernel built: an nvcc that fails at once (the regions fall back, their Specs stay)
        os.environ["COMFUSE_MEASURE"] = "0"
        os.environ["COMFUSE_NVCC"] = "/bin/false"
        import tempfile

        os.environ["COMFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="comfuse-structures-")
        os.environ.setdefault("COMFUSE_LOG", "quiet")
    if args.models:
        models = {m: (lambda m=m: bench_model(m, args.device)) for m in args.models.split(",") if m}
    else:
        models = {name: (lambda n=name: family(n, args.device)) for name in FAMILIES}
    text = structures(models, args.device)
    n = sum(1 for line in text.splitlines() if line == "end")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {n} structures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
