"""ATen FX graph -> ComFuse Graph IR.

`convert(gm)` walks an inference ATen graph (functionalized, decomposed: see `tracing.py`) in order and builds
ONE Graph IR for everything the IR can express. A node the IR cannot express (an unsupported op, an integer
dtype, ...) stays a *torch node*: its tensor operands that were converted become Graph IR outputs, its result
becomes a Graph IR input. The Graph IR is then partitioned by the core (`_core.partition`), which decides what
is fused; `program.py` stitches regions, standard-path Graph IR nodes and torch nodes back into one program.

Conventions:
  * every converted FX node maps to exactly one Graph IR value with the FX node's shape and dtype (a cast or a
    reshape is appended when the natural IR value differs); two-output nodes (var_mean) map to a tuple;
  * Graph IR names are the FX names; helper nodes a handler adds are named "<fx name>.<what>";
  * views that only regroup leading dims are reshapes (Phi treats them as no-ops on the tile), and the GEMM
    looks through the view that flattens a [B, S, K] activation to [B*S, K] and through the [N, K] -> [K, N]
    permute of an nn.Linear weight (transpose_b), so neither is a region boundary;
  * fp32 GEMMs (fp32 modules, used for CPU checks) round their operands to bf16, as tensor cores would: weights
    used only by GEMMs are declared bf16 at the input, other operands get an explicit cast; the product is cast
    back to f32. bf16/f16 graphs convert one to one.
  * dynamic shapes: symbolic sizes in the leading dims (the batch, the sequence, or their product once
    flattened: GEMM rows, a launch argument of the kernels) are converted at their example values;
    `dynamic_reshapes` names the reshapes with a symbolic dim, and `dynamic_dims` says which dims of a value are
    symbolic. The ATen-keeping rewrite builds those reshapes from the graph's own size values; the Graph IR
    rewrite takes a symbolic dim 0 only (`dynamic_inner` says when there is more). A node with a symbolic last
    dim, or one that reduces over a symbolic dim, stays in torch with that reason.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Callable

import torch
import torch.fx as fx

from . import _core as C
from . import rotary

aten = torch.ops.aten
prims = torch.ops.prims

DT = C.DType
OK = C.OpKind

TORCH_TO_DT = {torch.bfloat16: DT.BF16, torch.float16: DT.F16, torch.float32: DT.F32}
DT_TO_TORCH = {DT.BF16: torch.bfloat16, DT.F16: torch.float16, DT.F32: torch.float32}
DT_NAME = {DT.BF16: "bf16", DT.F16: "f16", DT.F32: "f32"}


class Unsupported(Exception):
    """Raised by a handler: the node stays in torch, with this message as the reason."""


class NothingToConvert(Exception):
    """No value of the graph reaches the Graph IR (e.g. a graph of int64 ops only): nothing for ComFuse."""


@dataclasses.dataclass
class Conversion:
    gm: fx.GraphModule                  # the ATen graph that was converted
    graph: Any                          # _core.Graph (before decomposition / dead-code elimination)
    value: dict                         # fx.Node -> Graph IR node id (or tuple of ids) in `graph`
    torch_nodes: dict                   # fx.Node -> reason it stays in torch (call_function nodes only)
    input_source: dict                  # Graph IR input name -> fx.Node whose value feeds it
    gemm_dtype: Any                     # tensor-core dtype used for fp32 GEMMs
    dynamic_reshapes: dict = dataclasses.field(default_factory=dict)   # Reshape name -> its symbolic dims
    dynamic: bool = False               # the graph has symbolic sizes
    dynamic_inner: bool = False         # ... in a dim other than dim 0 (only the ATen-keeping rewrite takes that)
    softmax_folds: dict = dataclasses.field(default_factory=dict)   # downcast fx.Node -> SoftmaxFold it ends
    rotate_half_folds: dict = dataclasses.field(default_factory=dict)   # cat fx.Node -> the slices and neg it folds

    def name_of(self, node: fx.Node) -> str | None:
        v = self.value.get(node)
        if v is None or isinstance(v, tuple):
            return None
        return self.graph.node(v).name


def _meta(node) -> Any:
    return node.meta.get("val", node.meta.get("example_value")) if isinstance(node, fx.Node) else None


def _hint(d) -> int:
    """A size as an int: a symbolic one (torch.SymInt) at its example value."""
    if not isinstance(d, torch.SymInt):
        return int(d)
    h = d.node.hint
    return int(h if h is not None else d.node.shape_env.size_hint(d.node.expr))


def size_hints(shape) -> list[int]:
    return [_hint(d) for d in shape]


def _is_float_tensor(v) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype in TORCH_TO_DT


def _target_name(node: fx.Node) -> str:
    t = node.target
    return str(t) if not callable(t) else getattr(t, "__name__", str(t)) if not isinstance(t, torch._ops.OpOverload) \
        else f"aten.{t._opname}.{t._overloadname}" if t.namespace == "aten" else str(t)


# ops that only move data around: an fp32 weight used through them by GEMMs only is a GEMM operand
_LAYOUT = {aten.permute.default, aten.t.default, aten.transpose.int, aten.view.default, aten.reshape.default,
           aten._unsafe_view.default, aten.clone.default, aten.expand.default, aten.alias.default}
_GEMMS = {aten.mm.default, aten.addmm.default, aten.bmm.default}


def _only_gemm_operand(node: fx.Node) -> bool:
    if not node.users:
        return False
    for u in node.users:
        if u.op != "call_function":
            return False
        if u.target in _GEMMS:
            pos = [i for i, a in enumerate(u.args) if a is node]
            if u.target == aten.addmm.default and 0 in pos:
                return False  # the bias
            continue
        if u.target in _LAYOUT and u.args[0] is node and _only_gemm_operand(u):
            continue
        return False
    return True


_DOWNCASTS = {prims.convert_element_type.default, aten._to_copy.default}


def _only_users(n: fx.Node, *users) -> bool:
    return set(n.users) == set(users)


def _scalar_operand(n: fx.Node, target_ops) -> tuple[fx.Node, float] | None:
    """(x, c) for a mul `n` = x * c (either order) with c a Python scalar; None otherwise."""
    if not (isinstance(n, fx.Node) and n.op == "call_function" and n.target in target_ops and len(n.args) == 2):
        return None
    a, b = n.args
    for x, c in ((a, b), (b, a)):
        if isinstance(x, fx.Node) and isinstance(c, (int, float)) and not isinstance(c, bool):
            return x, float(c)
    return None


@dataclasses.dataclass
class SoftmaxFold:
    """A softmax of a bf16/f16 tensor as the traced graph writes it: computed in f32 between an upcast and a
    downcast (torch's softmax of a half tensor), in either decomposed form, with `out` the downcast:

        z = upcast(x) [* c0];  m = amax(z, d);  e = exp((z - m) [* c or / c]);  out = downcast(e / sum(e, d))

    (the second form, c > 0, is Inductor's: its post-grad pattern moves the scale after the max). It converts to
    one softmax of `x * c0 * c` (or `x * c0 / c`) in x's dtype, whose primitives are exactly what partition's back-to-back
    recognition takes for F (max -> sum(exp(x - max)) -> exp / sum): the two casts are no-ops there, since
    the Graph IR computes in f32 between ops and a matmul rounds its operands to their dtype anyway."""
    x: fx.Node          # the half-precision logits
    dim: int
    scale: list         # (OpKind.Mul or OpKind.Div, constant), applied to x in order
    nodes: list         # the ATen nodes it replaces (upcast ... div), `out` excluded


def find_softmax_fold(out: fx.Node) -> SoftmaxFold | None:
    """The SoftmaxFold ending in downcast `out`, if `out` is one. Each intermediate must be read only inside the
    pattern (otherwise its value is needed elsewhere and folding would compute the softmax twice)."""
    def call(n, *targets):
        return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets

    if not call(out, *_DOWNCASTS) or not isinstance(_meta(out), torch.Tensor):
        return None
    dt = _meta(out).dtype
    div = out.args[0]
    if dt not in (torch.bfloat16, torch.float16) or not call(div, aten.div.Tensor) or not _only_users(div, out):
        return None
    if div.kwargs.get("rounding_mode") is not None or len(div.args) != 2:
        return None
    e, s = div.args
    if not (call(s, aten.sum.dim_IntList) and s.args[0] is e and call(e, aten.exp.default)):
        return None
    rank = len(_meta(div).shape)

    def one_dim(n, dims_at, keep_at):
        dims = n.args[dims_at] if len(n.args) > dims_at else n.kwargs.get("dim")
        keep = n.args[keep_at] if len(n.args) > keep_at else n.kwargs.get("keepdim", False)
        if not keep or not isinstance(dims, (list, tuple)) or len(dims) != 1:
            return None
        return dims[0] % rank

    d = one_dim(s, 1, 2)
    if d is None or s.kwargs.get("dtype") is not None or not _only_users(e, s, div) or not _only_users(s, div):
        return None
    nodes = [div, s, e]
    t, scale = e.args[0], []
    post = _scalar_operand(t, (aten.mul.Tensor, aten.mul.Scalar))
    op = OK.Mul
    if post is None and call(t, aten.div.Tensor, aten.div.Scalar) and t.kwargs.get("rounding_mode") is None:
        post = _scalar_operand(t, (t.target,))
        op = OK.Div
        if post is not None and post[0] is not t.args[0]:
            return None   # c / (z - m)
    if post is not None:
        if post[1] <= 0 or not _only_users(t, e):   # exp((z - max z) * c) is softmax(c z) only for c > 0
            return None
        nodes.append(t)
        t, scale = post[0], [(op, post[1])]
    if not (call(t, aten.sub.Tensor) and t.kwargs.get("alpha", 1) == 1 and _only_users(t, nodes[-1])):
        return None
    z, m = t.args
    if not (call(m, aten.amax.default) and m.args[0] is z and one_dim(m, 1, 2) == d and _only_users(m, t)):
        return None
    if not _only_users(z, m, t):
        return None
    nodes += [t, m]
    pre = _scalar_operand(z, (aten.mul.Tensor, aten.mul.Scalar))
    if pre is not None:
        nodes.append(z)
        z, c0 = pre
        scale.insert(0, (OK.Mul, c0))
        if not _only_users(z, nodes[-1]):
            return None
    if not (call(z, *_DOWNCASTS) and _meta(z).dtype == torch.float32 and isinstance(_meta(z.args[0]), torch.Tensor)
            and _meta(z.args[0]).dtype == dt):
        return None
    nodes.append(z)
    return SoftmaxFold(z.args[0], d, scale, nodes[::-1])


class Converter:
    def __init__(self, gm: fx.GraphModule, gemm_dtype=DT.BF16, force_torch: dict | None = None,
                 constant_inputs=()):
        self.gm = gm
        self.constant_inputs = frozenset(constant_inputs)   # placeholder names whose values are the same every call
        self.g = C.Graph()
        self.gemm_dtype = gemm_dtype
        self.value: dict = {}
        self.torch_nodes: dict = {}
        self.input_source: dict = {}
        self.inputs: dict = {}        # fx.Node -> Graph IR input id
        self.consts: dict = {}
        self.casts: dict = {}
        self.force_torch = dict(force_torch or {})
        self.node: fx.Node | None = None  # the node being converted
        self.dyn: dict = {}           # Graph IR id -> its symbolic dims (frozenset), for values that have any
        self.dynamic_inner = False    # a symbolic dim other than dim 0 somewhere
        self.dynamic_reshapes: dict = {}   # Reshape name -> its symbolic dims
        self.dynamic = False
        self.softmax_folds: dict = {}

    def shape(self, m, what: str) -> tuple[list[int], frozenset]:
        """A tensor's shape as ints (symbolic sizes at their example values), and its symbolic dims. A
        symbolic last dim: Unsupported (a kernel's N and K are compiled in; its rows are not)."""
        syms = frozenset(i for i, d in enumerate(m.shape) if isinstance(d, torch.SymInt))
        if syms:
            self.dynamic = True
        if m.dim() > 1 and m.dim() - 1 in syms:
            raise Unsupported(f"dynamic size in the last dim of '{what}' {list(m.shape)}: ComFuse kernels take "
                              "dynamic leading (row) dims only")
        if syms - {0}:
            self.dynamic_inner = True
        return size_hints(m.shape), syms

    # ---------------------------------------------------------------- helpers
    def name(self, tag: str | None = None) -> str:
        return self.node.name if tag is None else f"{self.node.name}.{tag}"

    def nd(self, i):
        return self.g.node(i)

    def x(self, a) -> int:
        """Graph IR id of a tensor operand (an FX node, or an id a handler already built)."""
        if isinstance(a, _Id):
            return int(a)
        if not isinstance(a, fx.Node):
            raise Unsupported(f"operand {a!r} is not a tensor")
        v = self.value.get(a)
        if isinstance(v, tuple):
            raise Unsupported(f"operand '{a.name}' is a tuple")
        if v is not None:
            return v
        if a in self.inputs:
            return self.inputs[a]
        m = _meta(a)
        if not isinstance(m, torch.Tensor):
            raise Unsupported(f"operand '{a.name}' is not a tensor")
        if m.dtype not in TORCH_TO_DT:
            raise Unsupported(f"operand '{a.name}' has dtype {m.dtype} (the Graph IR has bf16, f16, f32)")
        dt = TORCH_TO_DT[m.dtype]
        if dt == DT.F32 and _only_gemm_operand(a):
            dt = self.gemm_dtype  # a weight: rounded once where it enters, as a tensor-core input
        shape, dyn = self.shape(m, a.name)
        i = self.g.input(a.name, dt, shape, a.name in self.constant_inputs)
        if dyn:
            self.dyn[i] = dyn
        self.inputs[a] = i
        self.input_source[a.name] = a
        return i

    def const(self, v) -> int:
        v = float(v)
        if not math.isfinite(v):
            raise Unsupported(f"non-finite constant {v}")
        if v not in self.consts:
            self.consts[v] = self.g.constant(v, f"const.{len(self.consts)}")
        return self.consts[v]

    def operand(self, a) -> int:
        if isinstance(a, (int, float)) and not isinstance(a, (bool, _Id)):
            return self.const(a)
        return self.x(a)

    def cast(self, i: int, dt, name: str | None = None) -> int:
        n = self.nd(i)
        if n.dtype == dt:
            return i
        key = (i, dt)
        if key not in self.casts:
            self.casts[key] = self.g.cast(i, dt, name or f"{n.name}.{DT_NAME[dt]}")
        return self.casts[key]

    def out_dtype(self):
        m = _meta(self.node)
        return TORCH_TO_DT[m.dtype]

    def binary(self, op, a, b, name) -> int:
        ia, ib = self.operand(a), self.operand(b)
        dt = self.out_dtype()
        if self.nd(ia).op != OK.Constant:
            ia = self.cast(ia, dt)
        if self.nd(ib).op != OK.Constant:
            ib = self.cast(ib, dt)
        return self.g.binary(op, ia, ib, name)

    def keeps_gemm_dtype(self, n: fx.Node, i: int) -> bool:
        """An fp32 weight (or a view of it) read only by GEMMs stays in the tensor-core dtype."""
        m = _meta(n)
        return m.dtype == torch.float32 and self.nd(i).dtype == self.gemm_dtype and _only_gemm_operand(n)

    def finish(self, i: int) -> int:
        """Makes the value match the FX node's dtype and shape exactly."""
        m = _meta(self.node)
        dt = TORCH_TO_DT[m.dtype]
        if self.nd(i).dtype != dt and not self.keeps_gemm_dtype(self.node, i):
            i = self.g.cast(i, dt, self.name("cast"))
        shape, dyn = self.shape(m, self.node.name)
        if list(self.nd(i).shape) != shape:
            i = self.reshape(i, shape, self.name("view"), dyn)
        if dyn:
            self.dyn[i] = dyn
        return i

    def reshape(self, i: int, shape, name, dyn: frozenset = frozenset()) -> int:
        shape = list(shape)
        # collapse chains: reshape(reshape(x)) = reshape(x); a reshape back to the source's shape is the source
        n = self.nd(i)
        while n.op == OK.Reshape:
            i = n.inputs[0]
            n = self.nd(i)
        if list(n.shape) == shape:
            return i
        r = self.g.reshape(i, shape, name)
        if dyn:
            self.dyn[r] = dyn
            self.dynamic_reshapes[name] = dyn
        return r

    def static_dims(self, x: int, ds, what: str) -> None:
        rank = len(self.nd(x).shape)
        bad = sorted({d % rank for d in ds} & self.dyn.get(x, frozenset())) if rank else []
        if bad:
            raise Unsupported(f"{what} over the dynamic dim {bad[0]}")

    # ---------------------------------------------------------------- GEMMs
    def gemm(self, a, b, name, bias=None, beta=1, alpha=1) -> int:
        ia, ib = self.x(a), self.x(b)
        A, B = self.nd(ia), self.nd(ib)
        tb = False
        if len(B.shape) >= 2 and B.op == OK.Transpose and list(B.perm) == list(range(len(B.shape) - 2)) + [
                len(B.shape) - 1, len(B.shape) - 2]:
            ib, tb = B.inputs[0], True  # the nn.Linear weight [N, K], read as transpose_b
        # [B*S, K] = view([B, S, K]): feed the 3-D activation, its leading dims are GEMM rows
        if len(self.nd(ib).shape) == 2 and A.op == OK.Reshape and self.nd(A.inputs[0]).shape[-1] == A.shape[-1]:
            ia = A.inputs[0]
        dt = self.nd(ia).dtype
        if dt == DT.F32 or self.nd(ib).dtype == DT.F32:
            ia, ib = self.cast(ia, self.gemm_dtype), self.cast(ib, self.gemm_dtype)
        mm = self.g.matmul(ia, ib, False, tb, name + ".mm" if (bias is not None or alpha != 1) else name)
        out_dt = self.out_dtype()
        if self.nd(mm).dtype != out_dt:
            mm = self.g.cast(mm, out_dt, name + ".acc")
        if alpha != 1:
            mm = self.g.binary(OK.Mul, mm, self.const(alpha), name + ".alpha")
        if bias is not None and beta != 0:
            ibias = self.cast(self.x(bias), out_dt)
            if beta != 1:
                ibias = self.g.binary(OK.Mul, ibias, self.const(beta), name + ".beta")
            mm = self.g.binary(OK.Add, mm, ibias, name)
        return mm

    # ---------------------------------------------------------------- handlers
    def h_unary(op):
        def f(self, n):
            return self.g.unary(op, self.cast(self.x(n.args[0]), self.out_dtype()), self.name())
        return f

    def h_binary(op, reverse=False):
        def f(self, n):
            a, b = n.args[0], n.args[1]
            alpha = n.kwargs.get("alpha", 1)
            if alpha != 1:  # add/sub: b * alpha; rsub: b - alpha * a
                if reverse:
                    a = _Id(self.g.binary(OK.Mul, self.x(a), self.const(alpha), self.name("alpha")))
                elif isinstance(b, fx.Node):
                    b = _Id(self.g.binary(OK.Mul, self.x(b), self.const(alpha), self.name("alpha")))
                else:
                    b = b * alpha
            if reverse:
                a, b = b, a
            return self.binary(op, a, b, self.name())
        return f

    def h_div(self, n):
        if n.kwargs.get("rounding_mode") is not None:
            raise Unsupported(f"division with rounding_mode={n.kwargs['rounding_mode']!r}")
        return self.binary(OK.Div, n.args[0], n.args[1], self.name())

    def h_clamp(self, n):
        lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
        hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
        i = self.cast(self.x(n.args[0]), self.out_dtype())
        if lo is not None:
            i = self.g.binary(OK.Max, i, self.operand(lo), self.name("min") if hi is not None else self.name())
        if hi is not None:
            i = self.g.binary(OK.Min, i, self.operand(hi), self.name())
        return i

    def h_clamp_min(self, n):
        return self.binary(OK.Max, n.args[0], n.args[1], self.name())

    def h_clamp_max(self, n):
        return self.binary(OK.Min, n.args[0], n.args[1], self.name())

    def h_gelu(self, n):
        approx = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
        op = {"none": OK.Gelu, "tanh": OK.GeluTanh}.get(approx)
        if op is None:
            raise Unsupported(f"gelu approximate={approx!r}")
        return self.g.unary(op, self.x(n.args[0]), self.name())

    def h_pow(self, n):
        e = n.args[1]
        if not isinstance(e, (int, float)) or isinstance(e, bool):
            raise Unsupported("pow with a tensor exponent")
        return self.g.pow(self.x(n.args[0]), float(e), self.name())

    def dims(self, x: int, dims) -> list[int]:
        r = len(self.nd(x).shape)
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            return list(range(r))
        if isinstance(dims, int):
            dims = [dims]
        return sorted({d % r for d in dims}, reverse=True)

    def h_reduce(op):
        def f(self, n):
            x = self.x(n.args[0])
            dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
            keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
            if n.kwargs.get("dtype") is not None:
                x = self.cast(x, TORCH_TO_DT.get(n.kwargs["dtype"], None) or self.out_dtype())
            ds = self.dims(x, dims)
            self.static_dims(x, ds, "reduction")
            for j, d in enumerate(ds):
                x = self.g.reduce(op, x, d, bool(keep), self.name() if j == len(ds) - 1 else self.name(f"d{d}"))
            return x
        return f

    def var_mean(self, n, want_mean: bool):
        x = self.x(n.args[0])
        dims = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim")
        ds = self.dims(x, dims)
        if len(ds) != 1:
            raise Unsupported(f"variance over {len(ds)} dims (the Graph IR reduces one dim at a time)")
        d = ds[0]
        self.static_dims(x, ds, "variance")
        corr = n.kwargs.get("correction", 1)
        if corr is None:
            corr = 1
        keep = n.kwargs.get("keepdim", False)
        size = self.nd(x).shape[d]
        mean = self.g.reduce(OK.Mean, x, d, True, self.name("mean"))
        diff = self.g.binary(OK.Sub, x, mean, self.name("centered"))
        sq = self.g.unary(OK.Square, diff, self.name("sq"))
        if corr == 0:
            var = self.g.reduce(OK.Mean, sq, d, True, self.name("var"))
        else:
            if size - corr <= 0:
                raise Unsupported(f"variance with correction {corr} over {size} elements")
            s = self.g.reduce(OK.Sum, sq, d, True, self.name("sumsq"))
            var = self.g.binary(OK.Div, s, self.const(size - corr), self.name("var"))
        if not keep:
            shape = list(self.nd(x).shape)
            del shape[d]
            dyn = frozenset(i - (i > d) for i in self.dyn.get(x, frozenset()) if i != d)
            var = self.reshape(var, shape, self.name("var.squeeze"), dyn)
            mean = self.reshape(mean, shape, self.name("mean.squeeze"), dyn)
        return (var, mean) if want_mean else var

    def h_var_mean(self, n):
        return self.var_mean(n, True)

    def h_var(self, n):
        return self.var_mean(n, False)

    def h_mm(self, n):
        return self.gemm(n.args[0], n.args[1], self.name())

    def h_addmm(self, n):
        beta = n.kwargs.get("beta", 1)
        alpha = n.kwargs.get("alpha", 1)
        return self.gemm(n.args[1], n.args[2], self.name(), bias=n.args[0], beta=beta, alpha=alpha)

    def h_linear(self, n):
        w = self.x(n.args[1])
        if len(self.nd(w).shape) != 2:
            raise Unsupported("linear with a weight that is not 2-D")
        wt = self.g.transpose(w, [1, 0], self.name("wT"))  # gemm() reads it back as transpose_b
        bias = n.args[2] if len(n.args) > 2 else None
        return self.gemm(n.args[0], _Id(wt), self.name(), bias=bias)

    def h_view(self, n):
        shape, dyn = self.shape(_meta(n), n.name)
        return self.reshape(self.x(n.args[0]), shape, self.name(), dyn)

    def h_permute(self, n):
        x = self.x(n.args[0])
        r = len(self.nd(x).shape)
        if n.target == aten.t.default:
            perm = [1, 0] if r == 2 else list(range(r))
        elif n.target == aten.transpose.int:
            d0, d1 = n.args[1] % r, n.args[2] % r
            perm = list(range(r))
            perm[d0], perm[d1] = perm[d1], perm[d0]
        else:
            perm = [d % r for d in n.args[1]]
        if perm == list(range(r)):
            return x
        return self.g.transpose(x, perm, self.name())

    def h_identity(self, n):
        return self.x(n.args[0])

    def h_expand(self, n):
        x = self.x(n.args[0])
        if list(self.nd(x).shape) != self.shape(_meta(n), n.name)[0]:
            raise Unsupported("expand that broadcasts (materializes a larger tensor)")
        return x

    def h_to(self, n):
        m = _meta(n)
        src = _meta(n.args[0])
        if isinstance(src, torch.Tensor) and src.device != m.device:
            raise Unsupported("device copy")
        for k in ("memory_format", "layout"):
            if n.kwargs.get(k) not in (None, torch.preserve_format, torch.contiguous_format, torch.strided):
                raise Unsupported(f"{k}={n.kwargs[k]}")
        x = self.x(n.args[0])
        dt = TORCH_TO_DT[m.dtype]
        return x if self.nd(x).dtype == dt else self.g.cast(x, dt, self.name())

    def softmax_fold(self, n: fx.Node, f: SoftmaxFold) -> int:
        """The SoftmaxFold ending in `n` as max -> exp(x - max) -> sum -> divide in the logits' dtype (the
        primitives `softmax` decomposes to), named after `n` so that every node maps back to it."""
        x = self.x(f.x)
        self.static_dims(x, [f.dim], "softmax")
        for i, (op, c) in enumerate(f.scale):
            if c != 1.0:
                x = self.g.binary(op, x, self.const(c), self.name(f"scale{i}" if len(f.scale) > 1 else "scale"))
        m = self.g.reduce(OK.ReduceMax, x, f.dim, True, self.name("max"))
        e = self.g.unary(OK.Exp, self.g.binary(OK.Sub, x, m, self.name("shifted")), self.name("exp"))
        return self.g.binary(OK.Div, e, self.g.reduce(OK.Sum, e, f.dim, True, self.name("sum")), self.name())

    def h_getitem(self, n):
        v = self.value.get(n.args[0])
        if not isinstance(v, tuple):
            raise Unsupported(f"getitem of '{n.args[0].name}', which stays in torch")
        return v[n.args[1]]

    HANDLERS: dict[Any, Callable] = {}


class _Id(int):
    """An already-built Graph IR id passed where an FX operand is expected."""


H = Converter
Converter.HANDLERS = {
    aten.neg.default: H.h_unary(OK.Neg), aten.abs.default: H.h_unary(OK.Abs), aten.exp.default: H.h_unary(OK.Exp),
    aten.log.default: H.h_unary(OK.Log), aten.sqrt.default: H.h_unary(OK.Sqrt),
    aten.rsqrt.default: H.h_unary(OK.Rsqrt), aten.tanh.default: H.h_unary(OK.Tanh),
    aten.sigmoid.default: H.h_unary(OK.Sigmoid), aten.relu.default: H.h_unary(OK.Relu),
    aten.silu.default: H.h_unary(OK.Silu), aten.reciprocal.default: H.h_unary(OK.Reciprocal),
    aten.square.default: H.h_unary(OK.Square),
    aten.gelu.default: H.h_gelu,
    aten.add.Tensor: H.h_binary(OK.Add), aten.add.Scalar: H.h_binary(OK.Add),
    aten.sub.Tensor: H.h_binary(OK.Sub), aten.sub.Scalar: H.h_binary(OK.Sub),
    aten.rsub.Tensor: H.h_binary(OK.Sub, reverse=True), aten.rsub.Scalar: H.h_binary(OK.Sub, reverse=True),
    aten.mul.Tensor: H.h_binary(OK.Mul), aten.mul.Scalar: H.h_binary(OK.Mul),
    aten.div.Tensor: H.h_div, aten.div.Scalar: H.h_div, aten.div.Tensor_mode: H.h_div,
    aten.maximum.default: H.h_binary(OK.Max), aten.minimum.default: H.h_binary(OK.Min),
    aten.clamp_min.default: H.h_clamp_min, aten.clamp_max.default: H.h_clamp_max,
    aten.clamp.default: H.h_clamp,
    aten.pow.Tensor_Scalar: H.h_pow,
    aten.sum.dim_IntList: H.h_reduce(OK.Sum), aten.sum.default: H.h_reduce(OK.Sum),
    aten.mean.dim: H.h_reduce(OK.Mean), aten.mean.default: H.h_reduce(OK.Mean),
    aten.amax.default: H.h_reduce(OK.ReduceMax), aten.amin.default: H.h_reduce(OK.ReduceMin),
    aten.var_mean.correction: H.h_var_mean, aten.var.correction: H.h_var,
    aten.mm.default: H.h_mm, aten.addmm.default: H.h_addmm, aten.bmm.default: H.h_mm,
    aten.linear.default: H.h_linear,
    aten.view.default: H.h_view, aten.reshape.default: H.h_view, aten._unsafe_view.default: H.h_view,
    aten.unsqueeze.default: H.h_view, aten.squeeze.dim: H.h_view, aten.squeeze.dims: H.h_view,
    aten.squeeze.default: H.h_view,
    aten.permute.default: H.h_permute, aten.t.default: H.h_permute, aten.transpose.int: H.h_permute,
    aten.clone.default: H.h_identity, aten.alias.default: H.h_identity, aten.detach.default: H.h_identity,
    aten.contiguous.default: H.h_identity, aten.expand.default: H.h_expand,
    aten._to_copy.default: H.h_to, prims.convert_element_type.default: H.h_to,
    operator.getitem: H.h_getitem,
}


def _check_result(conv: Converter, n: fx.Node, v) -> None:
    m = _meta(n)
    vals = v if isinstance(v, tuple) else (v,)
    metas = m if isinstance(m, (tuple, list)) else (m,)
    for i, mm in zip(vals, metas):
        node = conv.g.node(i)
        if list(node.shape) != size_hints(mm.shape) or (node.dtype != TORCH_TO_DT[mm.dtype]
                                                   and not conv.keeps_gemm_dtype(n, i)):
            raise AssertionError(f"convert: '{n.name}' became {node!r}, torch has {mm.dtype}{list(mm.shape)}")


# Checks the tracer inserts that read a tensor only to assert its dtype and shape (Inductor drops them too). Left in,
# each counted as a reader: a fused region then stored the checked value as an extra output (HF Llama's RMSNorm
# wrote its fp32 normalized rows, 32 MB a layer at 8192 x 1024, for an assertion).
_METADATA_CHECKS = {torch.ops.aten._assert_tensor_metadata.default}


def drop_metadata_checks(gm: fx.GraphModule) -> int:
    """Erases the tracer's metadata assertions from `gm` (they produce nothing); returns how many."""
    dropped = 0
    for n in list(gm.graph.nodes):
        if n.op == "call_function" and n.target in _METADATA_CHECKS and not n.users:
            gm.graph.erase_node(n)
            dropped += 1
    if dropped:
        gm.recompile()
    return dropped


def convert(gm: fx.GraphModule, gemm_dtype=DT.BF16, force_torch: dict | None = None,
            constant_inputs=()) -> Conversion:
    """Converts what the Graph IR covers; marks as outputs the values the rest of the program reads.
    `constant_inputs`: the names of placeholders whose values are the same on every call (the model's
    parameters), which become constant Graph IR inputs (a norm deferral folds only those)."""
    drop_metadata_checks(gm)
    rotary.gemm_layout_rotary(gm)
    conv = Converter(gm, gemm_dtype, force_torch, constant_inputs)
    g = conv.g
    # rotate_half as HF writes it (slices, a negation, a cat): one Graph IR op at the cat; its parts are not
    # converted (a slice is not in the Graph IR), and nothing else reads them
    rotations = {n: r for n in gm.graph.nodes if (r := rotary.rotate_half_of(n)) is not None}
    folded_parts = {p for _, parts in rotations.values() for p in parts}
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in folded_parts:
            continue
        if n.meta.get(rotary.MATERIALIZED) and n not in conv.force_torch:
            conv.force_torch[n] = "rotary embedding's cos / sin, materialized one head wide per token for the epilogue"
        conv.node = n
        m = _meta(n)
        reason = conv.force_torch.get(n)
        handler = Converter.HANDLERS.get(n.target)
        if n in rotations:
            handler = lambda c, node, x=rotations[n][0]: c.g.rotate_half(c.cast(c.x(x), c.out_dtype()), c.name())  # noqa: E731
        if reason is None:
            if handler is None:
                reason = f"unsupported op {_target_name(n)} (not in the Graph IR)"
            elif isinstance(m, (tuple, list)):
                if not all(_is_float_tensor(t) for t in m):
                    reason = "a result is not a bf16/f16/f32 tensor"
            elif not _is_float_tensor(m):
                reason = f"result is {m.dtype if isinstance(m, torch.Tensor) else type(m).__name__}, not a " \
                         f"bf16/f16/f32 tensor"
        fold = find_softmax_fold(n) if reason is None else None
        if fold is not None and any(f in conv.torch_nodes for f in fold.nodes):
            fold = None   # a part of it stays in torch (a dynamic size, a forced node): convert it as it is
        if fold is not None:
            handler = lambda c, node, f=fold: c.softmax_fold(node, f)  # noqa: E731
        if reason is None:
            try:
                v = handler(conv, n)
                if not isinstance(v, tuple):
                    v = conv.finish(v)
                _check_result(conv, n, v)
                conv.value[n] = v
                if fold is not None:
                    conv.softmax_folds[n] = fold
                continue
            except Unsupported as e:
                reason = str(e)
            except C.GraphError as e:
                reason = f"the Graph IR refuses it: {e}"
        conv.torch_nodes[n] = reason
    # Values the rest of the program reads leave the Graph IR as outputs.
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    readers = [n for n in conv.torch_nodes] + [out_node]
    marked = set()
    for r in readers:
        for a in r.all_input_nodes:
            v = conv.value.get(a)
            if v is None or isinstance(v, tuple):
                continue
            if g.node(v).op in (OK.Input, OK.Constant) or v in marked:
                continue
            marked.add(v)
            g.output(v)
    if not marked:
        why = "; ".join(f"'{n.name}': {r}" for n, r in list(conv.torch_nodes.items())[:3])
        raise NothingToConvert("no op of this graph is in the Graph IR, every node stays in torch" +
                               (f" ({why}{'; ...' if len(conv.torch_nodes) > 3 else ''})" if why else ""))
    g.verify()
    return Conversion(gm, g, conv.value, conv.torch_nodes, conv.input_source, gemm_dtype, conv.dynamic_reshapes,
                      conv.dynamic, conv.dynamic_inner, conv.softmax_folds,
                      {n: parts for n, (_, parts) in rotations.items() if n in conv.value})
