"""bench/programs.py and bench/norm_sites.py without a GPU: they say so and exit 77 (CI's machines have none)."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("script", ["programs.py", "norm_sites.py"])
def test_skips_without_a_gpu(script):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the script would run the comparison")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), "--rounds", "1"], capture_output=True,
                       text=True)
    assert r.returncode == 77, r.stdout + r.stderr
    assert "skipped: no GPU" in r.stdout


def test_unknown_program_is_a_usage_error():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "programs.py"), "--programs", "resnet"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown program 'resnet'" in r.stderr


def test_model_bench_ratios_are_against_the_faster_of_eager_and_inductor(monkeypatch):
    """bench/hf_models_bench.py's interleaved rounds: eager joins them, and a ComFuse row's ratio is the faster of
    eager's and Inductor's medians over its own (the target's), with each row's spread over the rounds."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import hf_models_bench as hb
    finally:
        sys.path.pop(0)
    times = {"eager": iter([900, 1000, 1100]), "inductor": iter([2000, 2000, 2000]), "comfuse": iter([800, 850, 810])}
    monkeypatch.setattr(hb, "timed", lambda fn, iters, cuda: next(times[fn()]))
    monkeypatch.setattr(hb, "run", lambda f, kwargs: f())
    rows = [{"backend": b} for b in ("eager", "inductor", "comfuse")]
    hb.interleave([(r, (lambda b=r["backend"]: b)) for r in rows], {}, rounds=3, iters=1, cuda=False)
    eager, ind, cf = rows
    assert (eager["us_interleaved"], ind["us_interleaved"], cf["us_interleaved"]) == (1000, 2000, 810)
    assert cf["vs_best_interleaved"] == f"{1000 / 810:.3f}x" and cf["vs_inductor_interleaved"] == f"{2000 / 810:.3f}x"
    assert eager["spread_interleaved"] == 0.2 and ind["spread_interleaved"] == 0.0
    assert "vs_best_interleaved" not in ind
    assert hb.iters_for(2000.0, 50) == 51 and hb.iters_for(5000.0, 50) == 50   # a round is >= 100 ms


def test_model_bench_target_table_has_one_line_per_model_and_mode():
    """The bench's last table: the interleaved ratio to the faster of eager and Inductor, the spreads, the error
    ratio, the compile time the first call adds and the host time against torch.mm's, per model and mode."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import hf_models_bench as hb
    finally:
        sys.path.pop(0)
    rows = [dict(model="m", mode="eager", backend="eager", fuse="-", us=1000.0, note=""),
            dict(model="m", mode="default", backend="inductor", fuse="-", us=900.0, note="compile 5 s", compile_s=5.0,
                 us_interleaved=900.0, spread_interleaved=0.05),
            dict(model="m", mode="default", backend="comfuse", fuse="planner", us=700.0, note="compile 25 s",
                 compile_s=25.0,
                 us_interleaved=720.0, spread_interleaved=0.01, eager_us_interleaved=1000.0,
                 vs_best_interleaved="1.250x", err_vs_inductor=0.9),
            dict(model="m", mode="default", backend="eager", fuse="-", us=1000.0, note="interleaved with this mode",
                 us_interleaved=1000.0, spread_interleaved=0.02),
            dict(model="m", mode="host time", backend="comfuse", fuse="-", us=8.0, mm_us=20.0,
                 note="per fused_region call, kernel excluded: ...; for scale: ..., torch.mm 20.0 us")]
    table = hb.target_table(rows)
    assert len(table) == 3, table
    assert table[2] == ("| m | default | planner | 1000 | 900 | 720 | **1.250x** | 2.0% / 5.0% / 1.0% | 0.90x | 20 s "
                        "| 0.40x |"), table[2]


def test_model_bench_first_call_table_says_what_comfuse_adds():
    """--first-call --cold-cache: per model, mode and variant, the compile time ComFuse's first call adds to
    Inductor's, the kernels nvcc compiled for it (none for those the kernel pack held) and the error ratio."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import hf_models_bench as hb
    finally:
        sys.path.pop(0)
    rows = [dict(model="m", mode="eager", backend="eager", fuse="-", us=float("nan"), note=""),
            dict(model="m", mode="default", backend="inductor", fuse="-", compile_s=8.0, note=""),
            dict(model="m", mode="default", backend="comfuse", fuse="planner", compile_s=17.5, kernels_compiled=1,
                 err_vs_inductor=0.95, note=""),
            dict(model="n", mode="default", backend="comfuse", fuse="planner", note="FAILED")]   # no compile time
    lines = hb.first_call_table(rows)
    assert len(lines) == 3, lines
    assert lines[2] == "| m | default | planner | 8.0 | 17.5 | **9.5 s** | 1 | 0.95x |"


def test_comfuse_bench_reads_each_regions_ratio(tmp_path):
    """bench/programs.py's comfuse_bench reads `comfuse bench --each-region`'s lines: the graph's median and, per
    region, its kernel alone ÷ its own cuBLASLt GEMM(s) (a dual-B region's line names both GEMMs)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import programs
    finally:
        sys.path.pop(0)
    out = ("examples/llama_block.cf: median 192.4 us over 52 samples of 11 launches (fastest sample 181.7, slowest "
           "241.9), 548.5 TFLOP/s\n"
           "cuBLASLt GEMMs of the same shapes alone: 179.4 us; fused graph ÷ cuBLAS = 1.055\n"
           "  region 0: cuBLASLt 8192x1024x1024 (M x N x K) 29.7 us; its kernel alone 37.2 us (fastest sample 35.4, "
           "slowest 43.1): ÷ cuBLAS = 1.254, ÷ cuBLAS with C = 1.297\n"
           "  region 1: cuBLASLt 2 x 8192x2816x1024 (M x N x K) 149.7 us; its kernel alone 153.1 us (fastest sample "
           "144.9, slowest 162.0): ÷ cuBLAS = 1.023\n")
    cli = tmp_path / "fake_comfuse"
    (tmp_path / "out.txt").write_text(out)
    cli.write_text(f"#!/bin/sh\ncat {tmp_path / 'out.txt'}\n")
    cli.chmod(0o755)
    b = programs.comfuse_bench(str(cli), "examples/llama_block.cf", ["--each-region"])
    assert b["us"] == 192.4
    assert b["regions"] == {0: 1.254, 1: 1.023}
