"""The kernel pack (docs/pytorch.md, "The first call"): its structure list reads, and a kernel built into a pack by
`comfuse pack` is what a frontend's region of the same structure at another width finds there, with an empty cache of
its own and no nvcc run (real nvcc, no GPU)."""
import os
import shutil
import subprocess
import time

import pytest

import comfuse

C = comfuse._core
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(ROOT, "build", "bin", "comfuse")


def test_the_structure_list_reads_one_spec_per_kernel():
    """kernels/pack/structures.txt (written on the GPU by scripts/kernel_pack_structures.py --device cuda): every
    block reads back to the same text, one block per kernel name."""
    text = open(os.path.join(ROOT, "kernels", "pack", "structures.txt")).read()
    blocks, cur = [], []
    for line in text.splitlines():
        if not cur and (not line or line.startswith("#")):
            continue
        cur.append(line)
        if line == "end":
            blocks.append("\n".join(cur) + "\n")
            cur = []
    assert not cur and len(blocks) >= 20
    specs = [C.spec_from_text(b) for b in blocks]
    assert [s.to_text() for s in specs] == blocks
    assert len({s.kernel_hash() for s in specs}) == len(specs)


def test_a_region_finds_its_kernel_in_the_pack(tmp_path, monkeypatch):
    if not os.path.exists(CLI):
        pytest.skip("no CLI build (scripts/setup.sh builds build/bin/comfuse)")
    from comfuse import ops

    if not ops._cutlass_dir() or shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"):
        pytest.skip("no CUTLASS headers or no nvcc")
    g = C.parse_cf("input X : bf16[4096, 512]\ninput W : bf16[512, 512]\ninput b : bf16[512]\n"
                   "y = gelu(add(matmul(X, W), b), approximate=\"tanh\")\noutput y\n")
    spec = C.partition(g).regions[0].spec
    (tmp_path / "list.txt").write_text("# one structure\n" + spec.to_text())
    assert C.spec_from_text(spec.to_text()).to_text() == spec.to_text()
    pack = tmp_path / "pack"
    r = subprocess.run([CLI, "pack", str(tmp_path / "list.txt"), "-o", str(pack), "--rows", "4096", "--dims", "512",
                        "--jobs", "1", "--as-written"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 distinct kernels" in r.stdout, r.stdout
    assert (pack / "pack.txt").exists() and not list(pack.glob("*.lock"))

    # a frontend's region of the same structure at another width: its own empty cache, the pack named
    monkeypatch.setenv("COMFUSE_KERNEL_PACK", str(pack))
    assert ops.kernel_pack() == (str(pack), 1)
    g2 = C.parse_cf("input X : bf16[4096, 640]\ninput W : bf16[640, 512]\ninput b : bf16[512]\n"
                    "y = gelu(add(matmul(X, W), b), approximate=\"tanh\")\noutput y\n")
    spec2 = C.partition(g2).regions[0].spec
    assert spec2.kernel_hash() == spec.kernel_hash() and spec2.structural_hash() != spec.structural_hash()
    opts = dict(ops._kernel_options(), cache_dir=str(tmp_path / "user-cache"))
    t0 = time.time()
    name, hit, secs, from_pack = C.compile_region(spec2, **opts)
    assert hit and from_pack and secs == 0, (name, hit, secs, from_pack)
    assert time.time() - t0 < 5
    assert not (tmp_path / "user-cache").exists() or not any(p.is_dir() for p in (tmp_path / "user-cache").iterdir())

