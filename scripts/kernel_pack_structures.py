"""Writes kernels/pack/structures.txt: the kernel structures the PyTorch backend generates for the Hugging Face model
families (bench/hf_families.py, captured on the meta device: no GPU, no weights), one Spec per distinct kernel
(FusionSpec.kernel_hash: N and K left out), as the backend registers it (stored dtypes and parts applied). The
package's build compiles them over a grid of sizes into comfuse/kernel_pack (`comfuse pack`), so a model's first
call finds its kernels built.

    PYTHONPATH=python .venv/bin/python scripts/kernel_pack_structures.py [--check]

--check: exit 1 (and say which) when the file is not what the capture gives now (a CPU test runs it)."""
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


def captured(model, kwargs) -> list:
    """comfuse.capture with keyword inputs: each graph's report."""
    from comfuse.backend import analyze_graph

    reports = []

    def collect(gm, ex):
        reports.append(analyze_graph(gm, ex, index=len(reports)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=collect)(**kwargs)
    return reports


def family(name: str):
    with torch.device("meta"):
        model, inputs = FAMILIES[name]()
        model = model.to(torch.bfloat16).eval()
    return model, dict(zip(["input_ids"] if name != "vit-base" else ["pixel_values"], inputs))


def bench_model(name: str):
    """A model of bench/hf_models_bench.py (its test bed, and the models outside it), on the meta device."""
    import hf_models_bench

    model, kwargs = hf_models_bench.build(name, "meta")
    if getattr(model.config, "use_cache", False):   # (a forward pass, as the benchmark times it: no key / value cache)
        model.config.use_cache = False
    return model, kwargs


def registered_specs(model, kwargs, what: str) -> list:
    """The Specs the backend registers for every region of the model it may fuse (fused, or declined for speed
    only), in the order it registers them."""
    specs = []
    for rep in captured(model, kwargs):
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


def structures(models: dict) -> str:
    """The list: one Spec per kernel, the first model's (name -> thunk returning (model, kwargs)) first."""
    seen, blocks = {}, []
    for name, make in models.items():
        for fs in registered_specs(*make(), name):
            h = fs.kernel_hash()
            if h in seen:
                continue
            seen[h] = name
            g = fs.gemm
            blocks.append(f"# {name}: {len(fs.params)} params, {len(fs.outputs)} outputs, {fs.num_stages()} stage(s); "
                          f"captured at {g.rows}x{g.n}x{g.k}; kernel {h:016x}\n" + fs.to_text())
    head = ("# The kernel pack's structures (comfuse pack; the package's build compiles them into comfuse/kernel_pack).\n"
            "# Written by scripts/kernel_pack_structures.py from the regions the PyTorch backend registers for the\n"
            "# families of bench/hf_families.py; one Spec per kernel (N and K are the grid's). Do not edit.\n")
    return head + "\n".join(blocks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    ap.add_argument("--model", help="a model of bench/hf_models_bench.py instead of the families (e.g. bert-large): "
                                    "its kernels' list, for `comfuse pack ... --covers FILE`")
    ap.add_argument("--out", default=OUT, help="where to write the list (default: the pack's)")
    args = ap.parse_args()
    if args.model:
        text = structures({args.model: lambda: bench_model(args.model)})
    else:
        text = structures({name: (lambda n=name: family(n)) for name in FAMILIES})
    out = args.out if args.model or args.out != OUT else OUT
    n = sum(1 for line in text.splitlines() if line == "end")
    if args.check:
        old = open(out).read() if os.path.exists(out) else ""
        if old != text:
            print(f"{out} is not what the capture gives now: run scripts/kernel_pack_structures.py", file=sys.stderr)
            return 1
        print(f"{out}: up to date ({n} structures)")
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(f"wrote {out}: {n} structures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
