"""Tensor-parallel models (torch.distributed DTensor, parallelize_module) under backend="comfuse": each rank fuses its
local GEMMs (the shard's shapes), the collectives stay in torch, and the result is eager's.

- Two ranks on the CPU (gloo), the fused regions run by the CPU reference implementation: runs everywhere, CI too.
- One rank on the GPU (NCCL, world size 1), the real kernels.
- Two ranks on two GPUs (NCCL): skipped, with the reason, where the machine has fewer.

Each rank runs in its own process (torch.multiprocessing.spawn) and writes what it saw to a JSON file the test reads.
"""
import json
import logging
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from conftest import hopper_reason

HIDDEN, FFN = 128, 512            # the CPU model: each of two ranks holds FFN / 2 columns of `up`, rows of `down`
GPU_HIDDEN, GPU_FFN = 1024, 4096  # the GPU model, large enough for the planner to fuse its GEMMs


class TPBlock(torch.nn.Module):
    """A post-norm FFN block: LayerNorm(x + down(gelu(up(x)))), `up` split by columns and `down` by rows across the
    ranks (Megatron's MLP split: one all-reduce after `down`)."""

    def __init__(self, hidden, ffn):
        super().__init__()
        self.up = torch.nn.Linear(hidden, ffn)
        self.down = torch.nn.Linear(ffn, hidden)
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, backend: str, out_dir: str) -> None:
    """One rank: the block split over `world` ranks, compiled with backend="comfuse", against eager; what it fused
    goes to out_dir/rank<r>.json."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from comfuse import inductor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gpu = backend == "nccl"
    device = f"cuda:{rank}" if gpu else "cpu"
    if gpu:
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cuda" if gpu else "cpu", (world,))
        hidden, ffn = (GPU_HIDDEN, GPU_FFN) if gpu else (HIDDEN, FFN)
        torch.manual_seed(0)   # the same full weights on every rank; each keeps its shard
        block = TPBlock(hidden, ffn).to(device=device, dtype=torch.bfloat16).eval()
        block = parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
        torch.manual_seed(1)
        x = torch.randn(8 if gpu else 2, 512 if gpu else 32, hidden, device=device, dtype=torch.bfloat16)
        options = {"fuse": "all"} if gpu else {"fuse": "all", "reference": True, "rewrite": "keep"}
        inductor.reset_reports()
        with torch.no_grad():
            ref = block(x)
            got = torch.compile(block, backend="comfuse", options=options)(x)
        if gpu:
            torch.cuda.synchronize()
        gemms, kept = [], []
        for rep in inductor.reports():
            if rep.analysis is None:
                continue
            for i in sorted(rep.fused):
                g = rep.regions[i].spec.gemm
                gemms.append(["region", g.n, g.k])
            for ci in sorted(rep.fused_chains):
                c = rep.chains[ci].spec
                gemms += [["chain", c.first.gemm.n, c.first.gemm.k], ["chain", c.second.gemm.n, c.second.gemm.k]]
            kept += sorted({str(n.target) for n in rep.analysis.conv.torch_nodes})
        err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"err": err, "gemms": gemms, "kept": kept, "shape": list(got.shape),
                       "reports": len(inductor.reports())}, f)
    finally:
        dist.destroy_process_group()


def _run(world: int, backend: str, tmp_path) -> list:
    mp.spawn(_rank_main, args=(world, _free_port(), backend, str(tmp_path)), nprocs=world, join=True)
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]


def _check(results, world, hidden, ffn, tol, both=False):
    """Every rank matches eager within `tol` (normwise), fused GEMMs of its shard's shapes only (`up`: N = ffn /
    world, K = hidden; `down`: N = hidden, K = ffn / world), both of them with `both`, and kept the all-reduce."""
    shard = {(ffn // world, hidden), (hidden, ffn // world)}
    for r, res in enumerate(results):
        assert res["err"] <= tol, (r, res)
        assert res["reports"] >= 1, (r, res)
        fused = {(n, k) for _, n, k in res["gemms"]}
        assert fused, f"rank {r} fused nothing: {res}"
        assert fused <= shard and (not both or fused == shard), (r, fused, shard)
        if world > 1:   # the all-reduce after `down` stays in torch
            assert any("all_reduce" in t for t in res["kept"]), res["kept"]


def _distributed_reason(backend):
    import torch.distributed as dist

    if not dist.is_available():
        return "torch.distributed is not available"
    if backend == "gloo" and not dist.is_gloo_available():
        return "gloo is not available"
    if backend == "nccl" and not dist.is_nccl_available():
        return "NCCL is not available"
    return None


@pytest.mark.skipif(_distributed_reason("gloo") is not None, reason=f"skipped: {_distributed_reason('gloo')}")
def test_two_ranks_on_the_cpu_fuse_their_shards_and_match_eager(tmp_path):
    results = _run(2, "gloo", tmp_path)
    _check(results, 2, HIDDEN, FFN, tol=2e-2, both=True)
    # both ranks agree (the output is replicated after the all-reduce)
    assert results[0]["shape"] == results[1]["shape"] == [2, 32, HIDDEN]


def _gpu_reason(count):
    return hopper_reason(count) or _distributed_reason("nccl")


@pytest.mark.skipif(_gpu_reason(1) is not None, reason=f"skipped: {_gpu_reason(1)}")
def test_world_size_one_on_the_gpu_fuses_and_matches_eager(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="comfuse")
    (res,) = _run(1, "nccl", tmp_path)
    _check([res], 1, GPU_HIDDEN, GPU_FFN, tol=2e-2)


@pytest.mark.skipif(_gpu_reason(2) is not None, reason=f"skipped: {_gpu_reason(2)}")
def test_two_ranks_on_two_gpus_fuse_their_shards_and_match_eager(tmp_path):
    results = _run(2, "nccl", tmp_path)
    _check(results, 2, GPU_HIDDEN, GPU_FFN, tol=2e-2)


def _rank_ir_rewrite(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank compiling with rewrite='ir' (the Dynamo graph analyzed outside Inductor): the DTensor inputs are
    named in a warning and the graph runs with Inductor, unfused, correctly."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        records = []
        handler = logging.Handler()
        handler.emit = lambda rec: records.append(rec.getMessage())
        logging.getLogger("comfuse").addHandler(handler)
        logging.getLogger("comfuse").setLevel(logging.INFO)
        torch.manual_seed(0)
        block = TPBlock(HIDDEN, FFN).to(torch.bfloat16).eval()
        block = parallelize_module(block, init_device_mesh("cpu", (world,)),
                                   {"up": ColwiseParallel(), "down": RowwiseParallel()})
        x = torch.randn(2, 32, HIDDEN, dtype=torch.bfloat16)
        with torch.no_grad():
            ref = block(x)
            got = torch.compile(block, backend="comfuse", options={"reference": True})(x)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"equal": torch.allclose(got.float(), ref.float(), atol=2e-2, rtol=2e-2),
                       "messages": records}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(_distributed_reason("gloo") is not None, reason=f"skipped: {_distributed_reason('gloo')}")
def test_the_ir_rewrite_says_it_cannot_take_dtensor_inputs_and_runs_unfused(tmp_path):
    mp.spawn(_rank_ir_rewrite, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for r in range(2):
        res = json.load(open(tmp_path / f"rank{r}.json"))
        assert res["equal"], res
        assert any("inputs of tensor subclass DTensor" in m and "running it with inductor" in m
                   for m in res["messages"]), res["messages"]
