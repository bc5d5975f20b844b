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
