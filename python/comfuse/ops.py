"""The custom op a fused region becomes in the rewritten graph, and torch forms of standard-path Graph IR nodes.

`comfuse::fused_region(key, inputs) -> outputs`: one ComFuse kernel. `key` names a registered FusionSpec;
`inputs` are the GEMM operands A and B followed by the Spec's runtime parameters, in order. Its fake (meta)
implementation gives the output shapes and dtypes, so Dynamo/AOT/Inductor can trace and schedule around it.
On CPU tensors it runs the CPU reference (interpret_spec). On CUDA tensors of a compute-capability-9.0 GPU it
runs the generated kernel: comfuse._core.RegionKernel plans the region, generates its CUDA C++, JIT-compiles it
(cached on disk) and launches it on the current stream. The batch dimension M is a launch argument, so a new
batch size reuses the compiled kernel. After a region's first launch its calls are served by the op's C++ CUDA
kernel (comfuse/_torch_ops.so, python/src/torch_ops.cpp) without Python, where that library loads; the Python
kernel (_run_gpu) handles every call the C++ one hands back. If the launch fails and the backend registered the
region's torch form, that runs instead, with a warning. The backend puts this op into the graphs it rewrites; it
can also be called directly, torch.ops.comfuse.fused_region(key, inputs), with a key from register_region.
"""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import logging
import os
import threading

import numpy as np
import torch

from . import _core as C
from . import masks
from .convert import DT_TO_TORCH, OK

log = logging.getLogger("comfuse")
_REGIONS: dict = {}
_FALLBACK: dict = {}     # key -> torch implementation of the region (from the backend's program)
_BROKEN: dict = {}       # key -> why its kernel failed to launch (it then runs through _FALLBACK)
_LOCK = threading.Lock()
_NO_SWITCH = contextlib.nullcontext()
_COUNTER = itertools.count()


def register_region(spec, ctas: int = 1, fallback=None) -> str:
    """Registers a FusionSpec; returns the key the custom op is called with. `fallback(inputs) -> outputs`, if
    given, computes the region with torch ops: used (with a warning) if its kernel fails to launch."""
    with _LOCK:
        key = f"r{spec.structural_hash():016x}_{next(_COUNTER)}"
        _REGIONS[key] = (spec, int(ctas))
        if fallback is not None:
            _FALLBACK[key] = fallback
    return key


def region_spec(key: str):
    return _REGIONS[key][0]


_KERNELS: dict = {}


def _cutlass_dir() -> str:
    """CUTLASS's headers: $COMFUSE_CUTLASS_DIR, else the nvidia-cutlass package's (cutlass_library/source/include)."""
    env = os.environ.get("COMFUSE_CUTLASS_DIR")
    if env:
        return env
    spec = importlib.util.find_spec("cutlass_library")
    if spec and spec.submodule_search_locations:
        return os.path.join(list(spec.submodule_search_locations)[0], "source", "include")
    return ""


def kernel_dir() -> str:
    """ComFuse's kernel headers: $COMFUSE_KERNEL_DIR, else the copy installed inside this package (comfuse/kernels),
    else "" (the build's source tree, compiled into libcomfuse)."""
    env = os.environ.get("COMFUSE_KERNEL_DIR")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
    return here if os.path.isfile(os.path.join(here, "comfuse", "gemm.cuh")) else ""


def kernel_pack() -> tuple[str, int]:
    """The kernel pack the JIT looks in first (docs/pytorch.md, "The first call"): its folder and how many kernels its
    pack.txt lists; ("", 0) where there is none (a development build, or COMFUSE_KERNEL_PACK=off)."""
    dirs = C.kernel_pack_dirs(kernel_dir())   # ($COMFUSE_KERNEL_PACK, else this package's comfuse/kernel_pack)
    listing = os.path.join(dirs[0], "pack.txt") if dirs else ""
    if not os.path.isfile(listing):
        return "", 0
    with open(listing) as f:
        return dirs[0], sum(1 for line in f if line.strip() and not line.startswith("#"))


def _kernel_options() -> dict:
    return dict(kernel_dir=kernel_dir(), cutlass_dir=_cutlass_dir(), cache_dir=os.environ.get("COMFUSE_CACHE_DIR", ""))


def compile_kernel(key: str):
    """JIT-compiles a registered region's kernel into the cache without loading it (any thread; the GIL is
    released while nvcc runs). Returns (kernel name, cache hit, nvcc seconds)."""
    spec, _ = _REGIONS[key]
    return C.compile_region(spec, **_kernel_options())


def gpu_kernel(key: str):
    """The compiled kernel of a registered region (compiled on first use, then cached per key)."""
    with _LOCK:
        k = _KERNELS.get(key)
    if k is None:
        spec, _ = _REGIONS[key]
        k = C.RegionKernel(spec, **_kernel_options())
        with _LOCK:
            k = _KERNELS.setdefault(key, k)
    return k


def random_inputs(spec, device: str) -> list[torch.Tensor]:
    """[A, B, *params] of a region at its Spec's shapes and dtypes, normal random values (timing, benchmarks)."""
    g = spec.gemm
    dt = DT_TO_TORCH[g.dtype]
    a = torch.randn(g.rows, g.k, device=device).to(dt)
    b = torch.randn(*((g.n, g.k) if g.transpose_b else (g.k, g.n)), device=device).to(dt)
    return [a, b] + [torch.randn([int(d) for d in p.shape], device=device).to(DT_TO_TORCH[p.dtype])   # (0-dim: eps)
                     for p in spec.params]


def _split_out(spec, o) -> tuple[list, list]:
    """Spec output `o`'s shape as (rows part, columns part): the columns part is the shortest suffix whose product
    is the row's width (N, or 1 for a per-row output): [N], [H, D] for a value seen as heads ([B, S, H, D]), or
    [T, C] for one stored in parts."""
    shape = [int(d) for d in o.shape]
    width = 1 if o.per_row else int(spec.gemm.n)
    k, tail = len(shape) - 1, shape[-1]
    while tail != width and k > 0:
        k -= 1
        tail *= shape[k]
    return shape[:k], shape[k:]


def has_gemm_lead(spec, o) -> bool:
    """Whether Spec output `o` has its GEMM's leading dims (then it takes A's leading dims at run time)."""
    return _split_out(spec, o)[0] == [int(d) for d in spec.gemm.out_shape[:-1]]


def _out_shape(spec, o, a_shape) -> list:
    """Output `o`'s shape for A of shape `a_shape` (ints, or SymInts while tracing dynamic sizes: no branch here
    depends on a symbolic value). Outputs are [..., N] (or [..., H, D]: N seen as heads; [..., T, C]: stored in
    parts) or [..., 1] over the GEMM's rows: with A's leading dims when the Spec's output has the GEMM's leading
    dims (a property of the Spec, not of the sizes: a symbolic batch or sequence dim takes A's value), else the
    Spec's own leading dims with dim 0 scaled to A's rows. For the traced A this is the Spec's shape."""
    lead, last = _split_out(spec, o)
    a_lead = list(a_shape[:-1])
    if len(lead) == len(a_lead) and (has_gemm_lead(spec, o) or all(isinstance(d, int) and d == e
                                                               for d, e in zip(a_lead[1:], lead[1:]))):
        return a_lead + last
    rows = 1
    for d in a_lead:
        rows = rows * d
    inner = 1
    for d in lead[1:]:
        inner *= d
    return [rows // inner] + lead[1:] + last


def _empty_out(o, shape, dtype, device) -> torch.Tensor:
    """An uninitialized output of Spec output `o` with logical `shape`, in the layout the kernel stores: row-major,
    or, stored in parts (SpecOutput.part_cols), its [..., T, C] shape as a contiguous [T, ..., C] buffer."""
    if not o.split:
        return torch.empty(shape, dtype=dtype, device=device)
    lead = len(shape) - 2
    return torch.empty([shape[lead], *shape[:lead], shape[-1]], dtype=dtype, device=device).movedim(0, lead)


def _laid_out(o, t: torch.Tensor) -> torch.Tensor:
    """Values `t` (logical shape) in the layout of Spec output `o` (the CPU reference's and the torch fallback's
    outputs, made like the kernel's)."""
    return t if not o.split else _empty_out(o, list(t.shape), t.dtype, t.device).copy_(t)


class _GpuLaunch:
    """One registered region's CUDA launch with everything a call does not change worked out once: the GEMM's K
    and N, the dtypes, the kernel (compiled or loaded on first use), the output shapes per A shape. Keeps the
    host time of a call small (the target: <= 10 us outside CUDA graphs). `fast`: what the C++ fast path holds
    (None: not registered there yet; else the workspace rows it holds per stream). `ws`: the L2 workspace per
    stream of a region that reduces (_workspace)."""
    __slots__ = ("key", "spec", "k", "kn", "dtype", "param_dtypes", "out_dtypes", "shapes", "kernel", "fast", "ws",
                 "retired", "reduces")

    def __init__(self, key: str, spec):
        g = spec.gemm
        self.key, self.spec, self.k, self.kn = key, spec, int(g.k), int(g.k) * int(g.n)
        self.dtype = DT_TO_TORCH[g.dtype]
        self.param_dtypes = [DT_TO_TORCH[p.dtype] for p in spec.params]
        self.out_dtypes = [DT_TO_TORCH[o.dtype] for o in spec.outputs]
        self.shapes: dict = {}      # A's shape -> the outputs' shapes
        self.kernel = None
        self.fast = None
        self.ws: dict = {}          # raw stream -> (partials, counters, rows)
        self.retired: list = []     # workspaces replaced by larger ones (kept alive: _workspace)
        self.reduces = spec.num_stages() > 1

    def out_shapes(self, a_shape) -> list:
        s = self.shapes.get(a_shape)
        if s is None:
            if len(self.shapes) >= 256:   # (a dynamic sequence length: many shapes; keep the memory bounded)
                self.shapes.clear()
            s = self.shapes[a_shape] = [_out_shape(self.spec, o, a_shape) for o in self.spec.outputs]
        return s


_LAUNCH: dict = {}
_CC90: set = set()      # device indices checked to be compute capability 9.0 (queried once per device)


def _dense(t: torch.Tensor, dtype) -> torch.Tensor:
    """`t` in the kernel's dtype, contiguous and 16-byte aligned (TMA, cp.async); itself when it already is."""
    if t.dtype != dtype:
        t = t.to(dtype)
    if not t.is_contiguous():
        t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


# COMFUSE_WORKSPACE=kernel: the kernel library's own workspace per stream (cuMemAlloc; growing it synchronizes the
# stream, so a capture must not be the stream's first call of a region) instead of PyTorch's allocator.
_WS_FROM_TORCH = os.environ.get("COMFUSE_WORKSPACE", "torch") != "kernel"


def _allocate_outside_pools(dev: int, sizes: list) -> list:
    """uint8 tensors of `sizes` bytes from PyTorch's caching allocator on device `dev`, allocated on a thread of
    their own. CUDA-graph captures and the warm-up runs of Inductor's CUDA-graph trees route the allocations of
    the thread that runs them to the graph's memory pool (torch._C._cuda_beginAllocateCurrentThreadToPool), where
    a tensor that outlives the run is an error ("tensors in the cudagraph pool not tracked as outputs"; seen on the
    H200 under mode="reduce-overhead" when the workspace was allocated on the calling thread). Rare: once per
    region, stream and growth."""
    out: list = []
    err: list = []

    def work():
        try:
            with torch.cuda.device(dev):
                out.extend(torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes)
        except BaseException as e:   # re-raised on the calling thread
            err.append(e)

    t = threading.Thread(target=work, name="comfuse-workspace")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out


def _workspace(L: _GpuLaunch, dev: int, stream: int, rows: int):
    """The region's L2 workspace on `stream`, holding at least `rows` rows: two uint8 tensors from PyTorch's caching
    allocator (_allocate_outside_pools), zeroed on `stream` before the launch (the exchange's launch numbers start at
    zero with the partials); a capture records the zeroing, so every replay starts from zero. Nothing synchronizes.
    A batch larger than the workspace holds gets a new one of at least twice the rows; the old one is kept
    (L.retired) rather than freed: kernels queued on `stream` may still use it, and its memory belongs to the
    allocating thread's stream, which knows nothing of them."""
    w = L.ws.get(stream)
    if w is None or w[2] < rows:
        if w is not None:
            L.retired.append(w)
        ws_rows = max(rows, 2 * w[2]) if w is not None else rows
        partials, counters = _allocate_outside_pools(dev, list(L.kernel.workspace_bytes(ws_rows)))
        partials.zero_()   # on `stream`: ordered before the launch
        counters.zero_()
        w = L.ws[stream] = (partials, counters, ws_rows)
    return w


def _check_device(dev: int) -> None:
    if dev not in _CC90:
        if tuple(torch.cuda.get_device_capability(dev)) != (9, 0):
            raise RuntimeError(f"comfuse::fused_region: {torch.cuda.get_device_name(dev)} is not compute capability "
                               "9.0 (H100/H200); the backend falls back before this point")
        _CC90.add(dev)


def _run_gpu(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    L = _LAUNCH.get(key)
    if L is None:
        L = _LAUNCH.setdefault(key, _GpuLaunch(key, _REGIONS[key][0]))
    a, b = inputs[0], inputs[1]
    dev = a.get_device()
    _check_device(dev)
    for t in inputs:
        if t.get_device() != dev:
            raise ValueError("comfuse::fused_region: inputs on different CUDA devices")
    if a.shape[-1] != L.k or b.numel() != L.kn:
        raise ValueError(f"comfuse::fused_region: A {tuple(a.shape)} / B {tuple(b.shape)} do not match "
                         f"the region's K={L.k}, N={L.kn // L.k}")
    a, b = _dense(a, L.dtype), _dense(b, L.dtype)
    params = [_dense(t, d) for t, d in zip(inputs[2:], L.param_dtypes)]
    rows = a.numel() // L.k   # M: leading dims of A flattened, taken at run time
    outs = [_empty_out(o, s, d, dev) for o, s, d in zip(L.spec.outputs, L.out_shapes(tuple(a.shape)), L.out_dtypes)]
    if rows == 0:
        return outs
    if key in _BROKEN:
        return _run_fallback(key, [a, b] + params)
    stream = torch._C._cuda_getCurrentRawStream(dev)
    try:
        if L.kernel is None:
            L.kernel = gpu_kernel(key)
        # the device context only where it is not current already (a switch costs host time per launch)
        with torch.cuda.device(dev) if dev != torch._C._cuda_getDevice() else _NO_SWITCH:
            if L.reduces and _WS_FROM_TORCH:
                ws = _workspace(L, dev, stream, rows)
                L.kernel.launch(a.data_ptr(), b.data_ptr(), rows, [o.data_ptr() for o in outs],
                                [p.data_ptr() for p in params], stream, ws[0].data_ptr(), ws[1].data_ptr(), ws[2])
            else:
                L.kernel.launch(a.data_ptr(), b.data_ptr(), rows, [o.data_ptr() for o in outs],
                                [p.data_ptr() for p in params], stream)
    except RuntimeError as e:   # fallback, never failure: the region's torch form, when the backend gave one
        if _FAST:
            torch.ops.comfuse._fast_forget(key)
        w = L.ws.get(stream)
        if w is not None:   # a failed launch may leave this stream's exchange mid-protocol: start from zero again
            w[0].zero_()
            w[1].zero_()
        if key not in _FALLBACK:
            raise
        _BROKEN[key] = str(e)
        log.warning("comfuse: %s; this region runs unfused (torch ops) from now on", e)
        return _run_fallback(key, [a, b] + params)
    if _FAST:
        _fast_register(L, stream, rows)
    return outs


# ScalarType numbers of c10 (c10/core/ScalarType.h), for the C++ fast path's registration
_SCALAR_TYPE = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}


def _fast_description(L: _GpuLaunch, entry: int, base: list) -> list:
    """comfuse::_fast_register's description of a region (layout: python/src/torch_ops.cpp, fast_register): the
    launch entry, the fixed arguments `base` ([abi, n, k, lda, ldb, ld, transport], RegionKernel.recipe), whether
    it reduces, the dtypes, and each output's shape rule and whether it is stored in parts."""
    desc = [entry, *base, int(L.spec.num_stages() > 1), _SCALAR_TYPE[L.dtype], len(L.param_dtypes),
            *[_SCALAR_TYPE[d] for d in L.param_dtypes], len(L.out_dtypes)]
    for o, d in zip(L.spec.outputs, L.out_dtypes):
        lead, cols = _split_out(L.spec, o)
        desc += [_SCALAR_TYPE[d], int(has_gemm_lead(L.spec, o)), len(lead), *lead, len(cols), *cols,
                 int(o.split)]
    return desc


def _fast_register(L: _GpuLaunch, stream: int, rows: int) -> None:
    """After a launch on the Python path: hands the region (once) and this stream's workspace (when it is new or
    grew) to the C++ fast path, which serves the following calls of this key by itself. The workspace stays
    Python's (L.ws keeps the tensors alive); the fast path holds its pointers."""
    if L.fast is not None and (not L.reduces or L.fast.get(stream, 0) >= rows):
        return
    if L.fast is None:
        entry, base = L.kernel.recipe()
        torch.ops.comfuse._fast_register(L.key, _fast_description(L, entry, base))
        L.fast = {}
    if L.reduces:
        if _WS_FROM_TORCH:
            partials, counters, ws_rows = L.ws[stream]
            p, c = partials.data_ptr(), counters.data_ptr()
        else:
            p, c, ws_rows = L.kernel.own_workspace(stream, rows)
        torch.ops.comfuse._fast_workspace(L.key, stream, p, c, ws_rows)
        L.fast[stream] = ws_rows


def _run_fallback(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    spec, _ = _REGIONS[key]
    outs = _FALLBACK[key](inputs)
    return [_laid_out(so, o.to(DT_TO_TORCH[so.dtype]).reshape(_out_shape(spec, so, inputs[0].shape)))
            for o, so in zip(outs, spec.outputs)]


def _np32(t: torch.Tensor) -> np.ndarray:
    # (np.ascontiguousarray would make a 0-d scalar parameter 1-d)
    return t.detach().to("cpu", torch.float32).contiguous().numpy()


def _run_cpu(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The CPU reference (interpret_spec) of a region, for tests and the backend's reference mode."""
    spec, ctas = _REGIONS[key]
    if any(t.device.type != "cpu" for t in inputs):
        raise ValueError("comfuse::fused_region: inputs must all be on the CPU or all on one CUDA device")
    a, b, *params = (_np32(t) for t in inputs)
    rows = a.size // spec.gemm.k
    if rows != spec.gemm.rows:   # another batch size: the same Spec over `rows` rows, per-row values 2-D
        shapes = [_out_shape(spec, o, inputs[0].shape) for o in spec.outputs]
        spec = spec.with_rows(rows)
        params = [p.reshape([int(d) for d in sp.shape]) for p, sp in zip(params, spec.params)]
        outs = C.interpret_spec(spec, a.reshape(rows, -1), b, params, ctas)
        outs = [o.reshape(sh) for o, sh in zip(outs, shapes)]
    else:
        outs = C.interpret_spec(spec, a, b, params, ctas)
    return [_laid_out(so, torch.from_numpy(o).to(DT_TO_TORCH[so.dtype])) for o, so in zip(outs, spec.outputs)]


def _fused_region_fake(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    spec, _ = _REGIONS[key]
    dev = inputs[0].device
    return [_empty_out(o, _out_shape(spec, o, inputs[0].shape), DT_TO_TORCH[o.dtype], dev) for o in spec.outputs]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
          dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
          enable_gqa: bool = False) -> torch.Tensor:
    """comfuse::sdpa: F.scaled_dot_product_attention as one opaque op: at run time PyTorch picks its kernel as in
    eager (flash, cuDNN, memory-efficient), where tracing would decompose it into a math path (fp32 bmm + softmax)
    for some masks. The result has q's memory layout where its last dim matches v's (empty_like(q)): how the
    flash and cuDNN kernels allocate it, so for q a transposed view of [B, S, H, D] the model's
    transpose(1, 2).reshape() after it is a view, not a copy. The fake implementation says the same; another
    kernel's result is copied into that layout. Its CUDA kernel is C++ where _torch_ops.so loads (the same
    steps, python/src/torch_ops.cpp: sdpa_cuda); this one serves the CPU, and CUDA without that library."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    want = torch.empty_like(q, device="meta").stride() if out.shape == q.shape else None
    if want is None:
        return out.contiguous()
    if out.stride() == want:
        return out
    return torch.empty_like(q).copy_(out)


def _sdpa_fake(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    shape = list(q.shape[:-1]) + [v.shape[-1]]
    return torch.empty_like(q) if v.shape[-1] == q.shape[-1] else q.new_empty(shape)


def _load_fast_path() -> bool:
    """Loads comfuse/_torch_ops.so, the op's CUDA kernel in C++ (python/src/torch_ops.cpp), built against the
    PyTorch the package was built with. False (the op's CUDA kernel is then _run_gpu) where it is absent, where
    COMFUSE_FAST_PATH=0, or where it does not load into this PyTorch (with a warning: another torch version)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_ops.so")
    if os.environ.get("COMFUSE_FAST_PATH", "1") == "0" or not os.path.isfile(path):
        return False
    try:
        torch.ops.load_library(path)
        return True
    except (OSError, RuntimeError) as e:
        log.warning("comfuse: the C++ fast path (%s) does not load into torch %s (%s); the op runs in Python "
                    "(rebuild the package against this torch)", path, torch.__version__, e)
        return False


# The op is defined with torch.library.Library and a kernel per device rather than torch.library.custom_op:
# custom_op wraps every call in Python autograd and aliasing checks (~25 us of host time per call measured on
# the build machine, against ~9 us for this form). Inference only: there is no autograd formula.
# Its CUDA kernel is C++ where _torch_ops.so loads (_FAST): a call of a region that has launched once runs there
# without Python; every other call goes on to fused_region_slow, the Python kernel _run_gpu.
_LIB = torch.library.Library("comfuse", "FRAGMENT")
_LIB.define("fused_region(str key, Tensor[] inputs) -> Tensor[]")
_LIB.define("fused_region_slow(str key, Tensor[] inputs) -> Tensor[]")
_LIB.define("fused_chain(str key, Tensor[] inputs) -> Tensor")        # (below: back-to-back chains)
_LIB.define("fused_chain_slow(str key, Tensor[] inputs) -> Tensor")
_LIB.define("sdpa(Tensor q, Tensor k, Tensor v, Tensor? attn_mask=None, float dropout_p=0.0, bool is_causal=False, "
            "float? scale=None, bool enable_gqa=False) -> Tensor")   # (attention="eager": keep_sdpa_whole below)
_FAST = _load_fast_path()
_LIB.impl("sdpa", _sdpa, "CPU")
if not torch._C._dispatch_has_kernel_for_dispatch_key("comfuse::sdpa", "CUDA"):   # (a library built without it)
    _LIB.impl("sdpa", _sdpa, "CUDA")
torch.library.register_fake("comfuse::sdpa", _sdpa_fake, lib=_LIB)
sdpa = torch.ops.comfuse.sdpa
_LIB.impl("fused_region_slow" if _FAST else "fused_region", _run_gpu, "CUDA")
_LIB.impl("fused_region", _run_cpu, "CPU")
torch.library.register_fake("comfuse::fused_region", _fused_region_fake, lib=_LIB)
torch.library.register_fake("comfuse::fused_region_slow", _fused_region_fake, lib=_LIB)
fused_region = torch.ops.comfuse.fused_region


def fast_path_stats() -> dict:
    """The C++ fast path's counters: calls it served, calls it handed to the Python kernel, regions it holds
    (all 0 without it); and `why`: for each region of this process that was handed on, why its last such call
    was (e.g. "a parameter: device, dtype, not contiguous or not 16-byte aligned")."""
    if not _FAST:
        return {"enabled": False, "fast": 0, "slow": 0, "regions": 0, "why": {}}
    fast, slow, regions = torch.ops.comfuse._fast_stats()
    why = {k: w for k in list(_REGIONS) if (w := torch.ops.comfuse._fast_why(k))}
    return {"enabled": True, "fast": fast, "slow": slow, "regions": regions, "why": why}


def _round(x: torch.Tensor, dt: int) -> torch.Tensor:
    return x.to(DT_TO_TORCH[C.DType(dt)]).to(torch.float32)


_UNARY = {
    OK.Neg: torch.neg, OK.Abs: torch.abs, OK.Exp: torch.exp, OK.Log: torch.log, OK.Sqrt: torch.sqrt,
    OK.Rsqrt: torch.rsqrt, OK.Tanh: torch.tanh, OK.Sigmoid: torch.sigmoid, OK.Relu: torch.relu,
    OK.Gelu: lambda x: torch.nn.functional.gelu(x), OK.GeluTanh: lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    OK.Silu: torch.nn.functional.silu, OK.Square: torch.square, OK.Reciprocal: torch.reciprocal,
}
_BINARY = {OK.Add: torch.add, OK.Sub: torch.sub, OK.Mul: torch.mul, OK.Div: torch.div,
           OK.Max: torch.maximum, OK.Min: torch.minimum}
_REDUCE = {OK.Sum: torch.sum, OK.Mean: torch.mean, OK.ReduceMax: torch.amax, OK.ReduceMin: torch.amin}


def eval_graph_node(spec: tuple, *xs):
    """One Graph IR node in torch, fp32 values as the Graph IR defines them (a standard-path step)."""
    op, shape, dtype, value, dim, keepdim, ta, tb, perm, cast_to = spec
    op = C.OpKind(op)
    xs = [x.to(torch.float32) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float32)
          for x in xs]
    if op == OK.MatMul:
        if xs[0].is_cuda and C.DType(dtype) != C.DType.F32:
            # on the GPU, a bf16/f16 tensor-core GEMM (fp32 accumulation; its output rounded to bf16/f16 is
            # within the IR's tolerance) instead of an fp32 one
            t = DT_TO_TORCH[C.DType(dtype)]
            a, b = xs[0].to(t), xs[1].to(t)
        else:
            a, b = _round(xs[0], dtype), _round(xs[1], dtype)
        if ta:
            a = a.transpose(-1, -2)
        if tb:
            b = b.transpose(-1, -2)
        return torch.matmul(a, b).to(torch.float32)
    if op == OK.Cast:
        return _round(xs[0], cast_to)
    if op in _UNARY:
        return _UNARY[op](xs[0])
    if op == OK.Pow:
        return torch.pow(xs[0], value)
    if op in _BINARY:
        return _BINARY[op](xs[0], xs[1])
    if op in _REDUCE:
        return _REDUCE[op](xs[0], dim, keepdim=keepdim)
    if op == OK.Transpose:
        return xs[0].permute(list(perm)).contiguous()
    if op == OK.RotateHalf:
        h = xs[0].shape[-1] // 2
        return torch.cat([-xs[0][..., h:], xs[0][..., :h]], -1)
    if op == OK.Reshape:
        if None in shape:   # two symbolic dims (Program.node_spec): no static form
            raise NotImplementedError("eval_graph_node: a reshape with two dynamic dims")
        return xs[0].reshape(list(shape))   # -1 at a dynamic dim (Program.node_spec)
    raise NotImplementedError(f"eval_graph_node: {C.op_name(op)}")


def keep_sdpa_whole(gm: torch.fx.GraphModule) -> int:
    """Replaces each scaled_dot_product_attention call of a Dynamo graph by comfuse::sdpa (same arguments), so
    that the attention reaches the GPU as the fused kernel eager uses. Returns how many were replaced."""
    count = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in masks.SDPA_TARGETS:
            n.target = torch.ops.comfuse.sdpa.default
            count += 1
    if count:
        gm.recompile()
    return count


# ---- back-to-back chains: comfuse::fused_chain(key, [x, w1, w2, (b1), (b2)]) -> out ----------------------------
#
# One recognised chain GEMM1 -> F -> GEMM2 -> epilogue2 (docs/kernel-b2b.md) as the flash-style kernel, the
# intermediate never written to memory. `key` names a registered B2BSpec; the inputs are X, W1 and W2 as the graph
# holds them (W1 / W2 in the Spec's layouts, per batch when batched), then the biases the kernel reads (the Spec's
# bias_params). The output is X's leading dims by N2, in bf16. A chain's first CUDA call runs here (_run_chain_gpu:
# compiles the kernel, makes inputs dense); later ones run in the C++ kernel of _torch_ops.so (python/src/torch_ops.cpp).
# On CPU tensors, and wherever the kernel refuses a launch (with a warning), the chain's torch form runs.

_CHAINS: dict = {}          # key -> _Chain
_CHAIN_KERNELS: dict = {}   # key -> C.ChainKernel


class _Chain:
    __slots__ = ("spec", "k", "n1", "n2", "has_b1", "has_b2", "batched", "fallback")

    def __init__(self, spec, fallback):
        self.spec, self.fallback = spec, fallback
        self.k, self.n1, self.n2 = int(spec.first.gemm.k), int(spec.n1), int(spec.n2)
        b1, b2 = spec.bias_params
        self.has_b1, self.has_b2 = b1 >= 0, b2 >= 0
        self.batched = spec.batch > 1 and spec.w1_batched   # weights per batch; else one GEMM over every row


def register_chain(spec, fallback=None) -> str:
    """Registers a B2BSpec; returns the key comfuse::fused_chain is called with. `fallback(inputs) -> out`, if given,
    computes the chain with torch ops (CPU tensors, and a launch the kernel refuses)."""
    with _LOCK:
        key = f"c{next(_COUNTER)}"
        _CHAINS[key] = _Chain(spec, fallback)
    return key


def chain_kernel(key: str):
    """The compiled kernel of a registered chain (compiled on first use, then cached per key)."""
    with _LOCK:
        k = _CHAIN_KERNELS.get(key)
    if k is None:
        o = _kernel_options()
        k = C.ChainKernel(_CHAINS[key].spec, o["kernel_dir"], o["cutlass_dir"], o["cache_dir"])
        with _LOCK:
            k = _CHAIN_KERNELS.setdefault(key, k)
    return k


def _chain_out_shape(ch: _Chain, x_shape) -> list:
    return list(x_shape[:-1]) + [ch.n2]


def _chain_fallback(key: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    ch = _CHAINS[key]
    if ch.fallback is None:
        raise RuntimeError(f"comfuse::fused_chain {key}: no torch form registered for this chain")
    return ch.fallback(inputs).to(torch.bfloat16).reshape(_chain_out_shape(ch, inputs[0].shape))


def _run_chain_gpu(key: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    ch = _CHAINS[key]
    x = inputs[0]
    dev = x.get_device()
    _check_device(dev)
    if any(t.get_device() != dev for t in inputs):
        raise ValueError("comfuse::fused_chain: inputs on different CUDA devices")
    if x.shape[-1] != ch.k:
        raise ValueError(f"comfuse::fused_chain: X {tuple(x.shape)} does not have the chain's K={ch.k}")
    rows = x.numel() // ch.k
    batch = 1
    if ch.batched:
        for d in x.shape[:-2]:
            batch *= d
    out = torch.empty(_chain_out_shape(ch, x.shape), dtype=torch.bfloat16, device=dev)
    if rows == 0:
        return out
    if key in _BROKEN:
        return _chain_fallback(key, inputs)
    x, w1, w2, *bias = (_dense(t, torch.bfloat16) for t in inputs)
    b1 = bias.pop(0).data_ptr() if ch.has_b1 else 0
    b2 = bias.pop(0).data_ptr() if ch.has_b2 else 0
    stream = torch._C._cuda_getCurrentRawStream(dev)
    try:
        if w1.numel() != batch * ch.k * ch.n1 or w2.numel() != batch * ch.n1 * ch.n2:
            raise ValueError(f"comfuse::fused_chain: W1 {tuple(w1.shape)} / W2 {tuple(w2.shape)} do not match K={ch.k}, "
                             f"N1={ch.n1}, N2={ch.n2} over {batch} batch(es)")
        kernel = chain_kernel(key)
        with torch.cuda.device(dev) if dev != torch._C._cuda_getDevice() else _NO_SWITCH:
            kernel.launch(x.data_ptr(), w1.data_ptr(), b1, w2.data_ptr(), b2, out.data_ptr(), rows, batch, stream)
    except (RuntimeError, ValueError) as e:   # fallback, never failure: the chain's torch form, when there is one
        if _FAST_CHAIN:
            torch.ops.comfuse._fast_forget(key)
        if ch.fallback is None:
            raise
        _BROKEN[key] = str(e)
        log.warning("comfuse: %s; this back-to-back chain runs unfused (torch ops) from now on", e)
        return _chain_fallback(key, inputs)
    if _FAST_CHAIN:   # later calls go to the C++ kernel (it hands back what it cannot serve)
        torch.ops.comfuse._fast_chain_register(key, [kernel.entry, C.KERNEL_ABI, ch.k, ch.n1, ch.n2, int(ch.has_b1),
                                                     int(ch.has_b2), int(ch.batched)])
    return out


def _run_chain_cpu(key: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    if any(t.device.type != "cpu" for t in inputs):
        raise ValueError("comfuse::fused_chain: inputs must all be on the CPU or all on one CUDA device")
    return _chain_fallback(key, inputs)


def _fused_chain_fake(key: str, inputs: list[torch.Tensor]) -> torch.Tensor:
    return torch.empty(_chain_out_shape(_CHAINS[key], inputs[0].shape), dtype=torch.bfloat16, device=inputs[0].device)


# The C++ kernel of _torch_ops.so serves a chain after its first launch here (a library built before chains has
# none: then this is the op's CUDA kernel).
_FAST_CHAIN = _FAST and torch._C._dispatch_has_kernel_for_dispatch_key("comfuse::fused_chain", "CUDA")
_LIB.impl("fused_chain_slow" if _FAST_CHAIN else "fused_chain", _run_chain_gpu, "CUDA")
_LIB.impl("fused_chain", _run_chain_cpu, "CPU")
torch.library.register_fake("comfuse::fused_chain", _fused_chain_fake, lib=_LIB)
torch.library.register_fake("comfuse::fused_chain_slow", _fused_chain_fake, lib=_LIB)


def _load_direct_entries():
    """The ops' direct Python entries: comfuse._torch_ops.fused_region / fused_chain (python/src/
    torch_ops_direct.cpp) call the ops' C++ CUDA kernels without the dispatcher's trip from Python (2.7-4.4 us of
    a call on the H200 machine), and hand every call they cannot take as the op would - CPU tensors, a trace,
    a dispatch mode, autograd - to the op itself. Inductor's code for a rewritten graph calls these (inductor.py).
    The ops' own OpOverloads where the C++ library is not loaded."""
    region_op, chain_op = torch.ops.comfuse.fused_region.default, torch.ops.comfuse.fused_chain.default
    if not _FAST:
        return region_op, chain_op
    try:
        from . import _torch_ops as direct
        direct.set_fallbacks(region_op, chain_op)
        return direct.fused_region, direct.fused_chain
    except (ImportError, AttributeError) as e:   # a library built before the direct entries
        log.warning("comfuse: the C++ library has no direct entries (%s); Inductor's code calls the ops "
                    "(rebuild the package)", e)
        return region_op, chain_op


fused_region_direct, fused_chain_direct = _load_direct_entries()
