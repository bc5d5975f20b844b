"""Shared helpers for the PyTorch frontend tests (CPU only, fp32 modules).

Numerics (see docs/pytorch.md): ComFuse GEMMs read bf16/f16 operands (tensor-core inputs) and compute everything
else in fp32. The fp32 modules here are given bf16-representable weights and inputs, so a first-level GEMM is
exact fp32 math; an activation that feeds a second GEMM is rounded to bf16 by the converted program, as a
tensor core would read it. The reference is torch eager on the same module with exactly that rounding applied
to the operands of mm/addmm/bmm (`tensor_core_operands`), nothing else changed.
"""
import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# The source tree's python/ first (setup.sh copies comfuse._core there), unless the installed package is under
# test (scripts/gpu-python.sh on the device, where the module is built for the image's Python).
if not os.environ.get("COMFUSE_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

aten = torch.ops.aten


class tensor_core_operands(TorchDispatchMode):
    """Rounds the fp32 operands of every GEMM to bf16 (what a tensor core reads); the rest stays fp32."""

    OPS = {aten.mm.default: (0, 1), aten.addmm.default: (1, 2), aten.bmm.default: (0, 1)}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        pos = self.OPS.get(func)
        if pos:
            args = list(args)
            for i in pos:
                if args[i].dtype == torch.float32:
                    args[i] = args[i].to(torch.bfloat16).to(torch.float32)
        return func(*args, **kwargs)


def bf16_exact(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return model.eval()


def bf16_randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).to(torch.float32)


# The CPU path vs the reference: both sides are fp32 with the same bf16 rounding of GEMM operands, and agree to
# ~1e-7 - except that an intermediate feeding a second GEMM (attention probabilities, an FFN activation) is
# rounded to bf16, and a value within an fp32 ulp or two of a bf16 rounding boundary can round the other way on
# one side (the two sum LayerNorm/softmax in different orders). Such a flip moves one row (token) of the result
# by up to ~3e-4 and no other; it happens in a few percent of random models. So every row must match to
# FP32_TOL, except at most one row in eight, which must match to FLIP_ROW_TOL. A rounding missing or added
# everywhere moves every row by ~2e-3, and a wrong op far more: both still fail.
FP32_TOL = 1e-5
FLIP_ROW_TOL = 1e-3


def assert_fp32_match(out, ref, what=""):
    o, r = out.detach().double(), ref.detach().double()
    assert o.shape == r.shape, (what, o.shape, r.shape)
    assert torch.isfinite(o).all(), what
    o, r = o.reshape(-1, o.shape[-1] if o.dim() else 1), r.reshape(-1, r.shape[-1] if r.dim() else 1)
    rows = ((o - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)).tolist()
    off = [(i, e) for i, e in enumerate(rows) if e > FP32_TOL]
    assert len(off) <= max(1, len(rows) // 8) and all(e <= FLIP_ROW_TOL for _, e in off), \
        (what, f"{len(off)} of {len(rows)} rows off by more than {FP32_TOL}", off[:8])


def rel_err(out, ref) -> float:
    out, ref = out.detach().cpu().double(), ref.detach().cpu().double()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm())


def reference(model, *xs):
    with torch.no_grad(), tensor_core_operands():
        y = model(*xs)
    return list(y) if isinstance(y, (tuple, list)) else [y]


def hopper_reason(devices: int = 1) -> str | None:
    """Why the GPU tests cannot run here (None: they can): `devices` GPUs of compute capability 9.0 that ComFuse
    kernels run on."""
    from comfuse import _core

    if not torch.cuda.is_available():
        return "no GPU"
    if torch.cuda.device_count() < devices:
        return (f"{torch.cuda.device_count()} GPU here: this needs a machine with {devices} "
                f"(the nvidia-h200-x{devices} kind)")
    for d in range(devices):
        if torch.cuda.get_device_capability(d) != (9, 0):
            return f"{'no GPU' if d == 0 else f'cuda:{d} is not a GPU'} of compute capability 9.0 " \
                   f"({torch.cuda.get_device_name(d)})"
        why = _core.unsupported_device_reason(d)
        if why:
            return why
    return None


def messages(caplog) -> list[str]:
    """What the "comfuse" logger said during the test."""
    return [r.getMessage() for r in caplog.records if r.name == "comfuse"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
