"""scripts/gpu_reliability.py runs only on the device machine; its CPU half is checked here so that it works the
first time there: every family is one region, the CPU reference and the output buffers agree in shape at every
M the checks use, and the summary table reads the JSON lines the shell script writes."""
import importlib.util
import json
import os

import pytest
import torch

import comfuse._core as C
from comfuse import ops

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gpu_reliability.py")
_spec = importlib.util.spec_from_file_location("gpu_reliability", _PATH)
rel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rel)


class CpuFamily(rel.Family):
    """The script's Family without its kernel (no GPU here)."""

    def __init__(self, family):
        self.C, self.ops, self.torch, self.family, self.transport, self.dev = C, ops, torch, family, "", "cpu"
        self.spec = rel.spec_of(C, family)
        self.key = ops.register_region(self.spec)
        self.names = ["X", "W"] + [p.name for p in self.spec.params]


@pytest.mark.parametrize("family", sorted(rel.FAMILIES))
def test_family_is_one_region_with_matching_reference_shapes(family):
    f = CpuFamily(family)
    reduces = f.spec.num_stages() > 1
    assert reduces == (rel.FAMILIES[family][1] == rel.REDUCING)
    for m in (rel.M, 1, 4096):
        ins = f.inputs(3, m)
        assert [t.dtype for t in ins] == [torch.bfloat16] * len(ins)
        ref = f.reference(ins)
        outs = f.outputs(m)
        assert [tuple(o.shape) for o in outs] == [tuple(r.shape) for r in ref]
        assert all(torch.isfinite(r).all() for r in ref)
        assert rel.rel_err(torch, ref[0], ref[0]) == 0.0


def test_summary_table_reads_the_shell_rows(tmp_path, capsys):
    rows = [{"family": "postnorm", "transport": "l2", "check": "replays", "result": "ok", "detail": "1000 replays",
             "seconds": 1.0},
            {"family": "postnorm", "transport": "l2", "check": "device1", "result": "SKIP", "detail": "1 GPU",
             "seconds": 0}]
    (tmp_path / "a.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # as scripts/gpu-reliability.sh's row() writes it (a tab survives in the detail: strict=False)
    (tmp_path / "cli.json").write_text('{"family": "softmax", "transport": "dsmem_p2p", "check": "memcheck", '
                                       '"result": "FAIL", "detail": "exit 9:\tERROR SUMMARY: 1 error", "seconds": 0}\n')
    assert rel.summarize(str(tmp_path)) == 1
    out = capsys.readouterr().out
    assert "| family | transport | replays | device1 | memcheck |" in out
    assert "| postnorm | l2 | ok | SKIP |  |" in out
    assert "1 FAILED, 1 skipped" in out
