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


# The CPU-path tolerance vs the reference (normwise). Both sides are fp32 with the same bf16 rounding of GEMM
# operands, so they usually agree to ~1e-7; but an intermediate that feeds a second GEMM (attention
# probabilities, an FFN activation) is rounded to bf16, and an fp32 value that lands within an ulp of a rounding
# boundary can round the other way on one side. One such flip in these small tensors moves the result by ~1e-5
# (seen in CI); a missing or extra rounding everywhere is ~2e-3, so 1e-4 still catches that.
FP32_TOL = 1e-4


def rel_err(out, ref) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm())


def reference(model, *xs):
    with torch.no_grad(), tensor_core_operands():
        y = model(*xs)
    return list(y) if isinstance(y, (tuple, list)) else [y]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
