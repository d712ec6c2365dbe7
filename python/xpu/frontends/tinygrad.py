"""tinygrad frontend: a tinygrad computation as an SGR-ML program.

``to_sgr(y, inputs={"x": x})`` walks the UOp graph of the given tensors *before
scheduling* (``Tensor.uop``) and returns the SGR-ML program — its JSON form, verified by
xpu's IR, or the text form with ``format="text"`` — which every xpu tool loads
(``xpu.InferenceSession(path)``, ``xpuctl run``, ``xpud``). Tensors named in ``inputs``
become the program's inputs; every other realised buffer becomes a constant (a weight).
Only the tinygrad versions in :data:`SUPPORTED` are read: its UOp graph changes between
releases, and a graph read wrongly would be a silent wrong program. An op this importer
does not map is refused with its name, the reason and the tinygrad version.

Mapped: constants (weakly typed expressions of them folded), buffers, every elementwise op
but BITCAST and THREEFRY, integer division, remainders, bitwise ops and shifts with
tinygrad's meaning, REDUCE (add, max, mul), the movement ops, CAST, CONTIGUOUS, COPY and
filled buffers (AFTER of a STORE). Matrix products, convolutions, softmax, log-softmax and
layer norm are raised to ``matmul``, ``conv``, ``softmax``, ``log_softmax`` and
``layer_normalization`` (``_tinygrad_patterns``, ``_tinygrad_conv``), so they run where a
policy places those ops; :func:`import_graph` reports what was raised. docs/frontends.md
has the whole table."""

from __future__ import annotations

import importlib.metadata
import math
from typing import Any, Mapping

import numpy as np

from ..errors import ProgramError
from . import _tinygrad_conv as convolution
from . import _tinygrad_patterns as patterns

#: tinygrad releases whose UOp graph this importer reads (major.minor).
SUPPORTED = ("0.14",)

# tinygrad dtype names -> SGR-ML dtypes.
# tinygrad 0.14's dtype names (its C type names) -> SGR-ML dtypes.
_DTYPES = {
    "float": "f32", "half": "f16", "__bf16": "bf16", "double": "f64",
    "signed char": "i8", "short": "i16", "int": "i32", "long": "i64",
    "unsigned char": "u8", "unsigned short": "u16", "unsigned int": "u32", "unsigned long": "u64",
    "bool": "bool",
}
_NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "f64": np.float64, "i8": np.int8, "i16": np.int16,
          "i32": np.int32, "i64": np.int64, "u8": np.uint8, "u16": np.uint16, "u32": np.uint32,
          "u64": np.uint64, "bool": np.bool_}

_FLOATS = ("f32", "f16", "bf16", "f64")
_UNARY = {"SIN": "sin", "SQRT": "sqrt", "RECIPROCAL": "reciprocal", "NEG": "neg"}
_BINARY = {"ADD": "add", "MUL": "mul", "SUB": "sub", "FDIV": "div", "MAX": "max", "POW": "pow"}
_COMPARE = {"CMPLT": "less", "CMPEQ": "equal"}
_BOOLEAN = {"ADD": "or", "MAX": "or", "MUL": "and"}
_REDUCE = {"ADD": "reduce_sum", "MAX": "reduce_max", "MUL": "reduce_prod"}
# Ops that pass their input through unchanged in a graph that is not scheduled yet.
# COPY moves a value to another device: the same value.
_IDENTITY = {*patterns.PASS, "COPY"}
_INTEGER = ("AND", "OR", "XOR", "CDIV", "CMOD", "FLOORDIV", "FLOORMOD", "SHL", "SHR")


class TinygradImportError(ProgramError):
    """A tinygrad graph xpu cannot import: ``op`` names the UOp, ``version`` tinygrad's."""

    def __init__(self, message: str, op: str = "", version: str = "") -> None:
        super().__init__(message)
        self.op, self.version = op, version


def tinygrad_version() -> str:
    try:
        return importlib.metadata.version("tinygrad")
    except importlib.metadata.PackageNotFoundError:
        raise TinygradImportError("tinygrad is not installed (pip install 'xpu[tinygrad]')") from None


def check_version() -> str:
    """The installed tinygrad's version, if it is one this importer reads."""
    version = tinygrad_version()
    if ".".join(version.split(".")[:2]) not in SUPPORTED:
        raise TinygradImportError(
            f"tinygrad {version} is not supported: xpu reads the UOp graph of tinygrad "
            f"{', '.join(s + '.x' for s in SUPPORTED)} (pip install 'tinygrad~={SUPPORTED[-1]}.0')",
            version=version,
        )
    return version


def _sgr_dtype(dtype: Any, version: str) -> str:
    name = getattr(dtype, "name", str(dtype))
    if name in _DTYPES:
        return _DTYPES[name]
    # A weakly typed constant that no operand typed: tinygrad's defaults.
    if name in ("weakfloat", "weakint"):
        return "f32" if name == "weakfloat" else "i32"
    raise TinygradImportError(f"tinygrad dtype {name} has no SGR-ML equivalent (tinygrad {version})",
                              version=version)


def _typed(values: Any, dtype: str) -> np.ndarray:
    """Python numbers as an array of SGR-ML ``dtype`` as tinygrad's C code would hold them:
    integers wrap (a -1 of u32 is 4294967295), floats out of range are ±inf."""
    target = np.dtype(_NUMPY.get(dtype, np.float32))
    if target.kind not in "iu" or (isinstance(values, np.ndarray) and values.dtype != object):
        with np.errstate(over="ignore"):
            return np.asarray(values, dtype=np.float64 if target.kind == "f" else None).astype(target)
    flat = np.asarray(values, dtype=object).reshape(-1)
    mask = (1 << (8 * target.itemsize)) - 1
    unsigned = np.array([int(v) & mask for v in flat], dtype=f"u{target.itemsize}")
    typed: np.ndarray = unsigned.view(target).reshape(np.shape(values))
    return typed


def _ty(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(str(d) for d in shape)}]"


def _le_bytes(flat: np.ndarray, dtype: str) -> bytes:
    """Little-endian element bytes; bf16 (held as f32 here) rounded to nearest even."""
    if dtype != "bf16":
        return np.ascontiguousarray(flat).astype(np.dtype(_NUMPY[dtype]).newbyteorder("<")).tobytes()
    bits = np.ascontiguousarray(flat, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.ascontiguousarray(flat, dtype=np.float32))
    return np.where(nan, 0x7FC0, rounded).astype("<u2").tobytes()


def _literal(values: np.ndarray, dtype: str) -> str:
    flat = values.reshape(-1)
    if flat.size > 16:
        import base64

        return 'b64"' + base64.b64encode(_le_bytes(flat, dtype)).decode() + '"'

    def one(v: Any) -> str:
        if dtype == "bool":
            return "true" if v else "false"
        if dtype.startswith(("f", "bf")):
            f = float(v)
            return "nan" if math.isnan(f) else ("inf" if f == math.inf else "-inf" if f == -math.inf else repr(f))
        return str(int(v))

    return "[" + ", ".join(one(v) for v in flat) + "]"


class _Writer:
    """SGR-ML text, one value per line, each UOp emitted once."""

    def __init__(self, inputs: Mapping[Any, str], version: str) -> None:
        self.inputs = inputs
        self.version = version
        self.lines: list[str] = []
        self.names: dict[Any, tuple[str, str, tuple[int, ...]]] = {}
        self.count = 0
        #: Patterns raised to one SGR-ML op, by that op.
        self.raised: dict[str, int] = {}
        self._matched: dict[Any, patterns.Raised | None] = {}
        self._folded: dict[Any, np.ndarray | None] = {}
        self._weights: dict[Any, np.ndarray | None] = {}
        #: What the import left undone and why (a convolution too large to prove, …).
        self.notes: list[str] = []

    def pattern(self, u: Any) -> patterns.Raised | None:
        """The raisable pattern UOp ``u`` ends (memoised: matchers look a few levels down)."""
        if u not in self._matched:
            self.shape(u)  # a symbolic dimension is refused here, before any matcher reads it
            found = patterns.match(u)
            if found is None and u.op.name == "REDUCE":
                conv = convolution.match(u, self.inputs, self.notes)
                found = None if conv is None else patterns.Raised("conv", (conv.x, conv.w), conv=conv)
            if found is not None and found.op != "matmul" and _sgr_dtype(u.dtype, self.version) not in _FLOATS:
                found = None
            self._matched[u] = found
        return self._matched[u]

    def new(self, dtype: str, shape: tuple[int, ...], rhs: str) -> str:
        name = f"%{self.count}"
        self.count += 1
        self.lines.append(f"  {name}: {_ty(dtype, shape)} = {rhs}")
        return name

    def const(self, values: Any, dtype: str, shape: tuple[int, ...] = ()) -> str:
        array: np.ndarray = np.broadcast_to(_typed(values, dtype), shape)
        return self.new(dtype, shape, f"constant {{value = tensor<{_ty(dtype, shape)}> {_literal(array, dtype)}}}")

    def ints(self, values: list[int]) -> str:
        return self.const(np.asarray(values, dtype=np.int64), "i64", (len(values),))

    def refuse(self, u: Any, why: str = "") -> TinygradImportError:
        op = u.op.name
        where = f" ({why})" if why else ""
        made = _made_by(u)
        return TinygradImportError(
            f"tinygrad op {op}{made} is not imported yet{where} (tinygrad {self.version}); docs/frontends.md "
            "lists the mapped ops", op=op, version=self.version)

    def value(self, u: Any, like: str | None = None) -> tuple[str, str, tuple[int, ...]]:
        """(name, dtype, shape) of the SGR-ML value computing UOp ``u``; ``like`` types a
        weakly typed constant after its consumer."""
        key = (u, like) if self.constant(u) else u
        if key in self.names:
            return self.names[key]
        # Iterative over long chains: recursion on sources one level at a time is bounded by
        # Python's limit, so deep graphs are walked in topological order first.
        self._prepare(u)
        out = self._emit(u, like)
        self.names[key] = out
        return out

    def _prepare(self, root: Any) -> None:
        order: list[Any] = []
        seen: set[Any] = set()
        stack: list[tuple[Any, bool]] = [(root, False)]
        while stack:
            u, done = stack.pop()
            if done:
                order.append(u)
                continue
            if u in seen or u in self.names:
                continue
            seen.add(u)
            stack.append((u, True))
            if u not in self.inputs and u.op.name != "BUFFER" and not self.constant(u):
                # A raised pattern reads its operands, not the arithmetic under it.
                stack.extend((s, False) for s in self._sources(u))
        for u in order[:-1]:
            # Constants are written where they are read, typed like their consumer.
            if not self.constant(u) and u not in self.names:
                self.names[u] = self._emit(u, None)

    def folded(self, u: Any) -> np.ndarray | None:
        """The value of ``u`` when it is a constant: a ``CONST``, a ``STACK`` of them, or a
        weakly typed expression of constants (tinygrad's Python numbers: ``1/n``, ``-1·c``),
        computed here in f64 and typed later like the value it meets. None otherwise."""
        if u in self._folded:
            return self._folded[u]
        found: np.ndarray | None = None
        if u not in self.inputs:
            found = _fold(u, self)
        self._folded[u] = found
        return found

    def constant(self, u: Any) -> bool:
        return self.folded(u) is not None

    def weight(self, u: Any) -> np.ndarray | None:
        """The data of ``u`` when it is a realised buffer (not an input) seen through
        movement ops only — a weight as a product reads it — else None."""
        if u in self._weights:
            return self._weights[u]
        found: np.ndarray | None = None
        chain = convolution._chain(u, self.inputs)
        leaf = chain[-1]
        buf = getattr(leaf, "buffer", None) if leaf.op.name == "BUFFER" and leaf not in self.inputs else None
        if buf is not None and buf.is_allocated() and u.op.name in convolution._MOVEMENT:
            idx = convolution._run(chain, len(chain) - 1)
            if idx is not None:
                data = _buffer_data(buf, _sgr_dtype(leaf.dtype, self.version)).reshape(-1)
                found = np.where(idx >= 0, data[np.maximum(idx, 0)], 0).astype(data.dtype)
        self._weights[u] = found
        return found

    def _sources(self, u: Any) -> tuple[Any, ...]:
        """The UOps the SGR-ML for ``u`` reads: a raised pattern's operands, the value an
        ``AFTER`` stores, or its sources."""
        raised = self.pattern(u)
        if raised is not None and raised.op == "matmul" and self.weight(raised.operands[1]) is not None:
            return (raised.operands[0],)
        if raised is not None:
            return tuple(raised.operands)
        stored = _stored(u)
        return (stored,) if stored is not None else tuple(u.src)

    def shape(self, u: Any) -> tuple[int, ...]:
        """``u``'s shape, which must be concrete: SGR-ML from tinygrad has no symbols."""
        dims = []
        try:
            described = u.shape
        except (IndexError, RuntimeError, ValueError) as e:
            # tinygrad itself cannot shape the graph (operands that do not broadcast, …).
            raise TinygradImportError(f"tinygrad could not describe the graph at {u.op.name}: {e} "
                                      f"(tinygrad {self.version})", op=u.op.name, version=self.version) from None
        for d in described:
            if not isinstance(d, int):
                try:
                    symbol = str(d.render())
                except Exception:  # any rendering failure: the op's name says enough
                    symbol = "a Variable"
                raise TinygradImportError(
                    f"tinygrad {u.op.name} has a symbolic dimension ({symbol[:80]}): import the graph with every "
                    f"Variable replaced by a number (tinygrad {self.version})", op=u.op.name, version=self.version)
            dims.append(int(d))
        return tuple(dims)

    def _emit(self, u: Any, like: str | None) -> tuple[str, str, tuple[int, ...]]:
        op = u.op.name
        shape = self.shape(u)
        if u in self.inputs:
            dtype = _sgr_dtype(u.dtype, self.version)
            return self.new(dtype, shape, f'input "{self.inputs[u]}"'), dtype, shape
        folded = self.folded(u)
        if folded is not None:
            dtype = like or _sgr_dtype(u.dtype, self.version)
            values = _typed(folded, dtype).reshape(shape)
            flat = values.reshape(-1)
            if flat.size > 16 and (flat == flat[0]).all():
                # A filled tensor (Tensor.full, ones): one number, expanded where it is read.
                one = self.const(flat[0], dtype)
                return self.new(dtype, shape, f"expand({one}, {self.ints(list(shape))})"), dtype, shape
            return self.const(values, dtype, shape), dtype, shape
        if op == "BUFFER":
            return self._buffer(u)
        if op == "STACK":
            return self._stack(u, shape)
        if op in _IDENTITY:
            return self.value(u.src[0])
        if op == "AFTER":
            # A buffer filled by a STORE (Tensor.full, ones, …): the value stored.
            stored = _stored(u)
            if stored is None:
                raise self.refuse(u, "a buffer written in part or by something other than one STORE")
            dtype = _sgr_dtype(u.dtype, self.version)
            x, xdtype, _ = self.value(stored, like=dtype if self.constant(stored) else None)
            if xdtype != dtype:
                x = self.new(dtype, shape, f"cast({x}) {{to = dtype<{dtype}>}}")
            return x, dtype, shape
        if op == "RESHAPE":
            x, dtype, _ = self.value(u.src[0])
            return self.new(dtype, shape, f"reshape({x}, {self.ints(list(shape))})"), dtype, shape
        if op == "EXPAND":
            x, dtype, _ = self.value(u.src[0])
            return self.new(dtype, shape, f"expand({x}, {self.ints(list(shape))})"), dtype, shape
        if op == "PERMUTE":
            x, dtype, _ = self.value(u.src[0])
            perm = ", ".join(str(int(p)) for p in u.arg)
            return self.new(dtype, shape, f"transpose({x}) {{perm = [{perm}]}}"), dtype, shape
        if op in ("PAD", "SHRINK"):
            return self._window(u, shape)
        if op == "FLIP":
            x, dtype, xs = self.value(u.src[0])
            axes = [i for i, f in enumerate(u.arg) if f]
            big = -(2**63)
            starts, ends, ax, steps = (self.ints([-1] * len(axes)), self.ints([big] * len(axes)),
                                       self.ints(axes), self.ints([-1] * len(axes)))
            return self.new(dtype, shape, f"slice({x}, {starts}, {ends}, {ax}, {steps})"), dtype, shape
        if op == "CAST":
            x, _, _ = self.value(u.src[0])
            dtype = _sgr_dtype(u.dtype, self.version)
            return self.new(dtype, shape, f"cast({x}) {{to = dtype<{dtype}>}}"), dtype, shape
        raised = self.pattern(u)
        if raised is not None and raised.op == "matmul":
            return self._matmul(u, raised, shape)
        if raised is not None and raised.op == "conv":
            return self._conv(raised, shape)
        if raised is not None:
            return self._normalisation(raised, shape)
        if op == "REDUCE":
            return self._reduce(u, shape)
        return self._elementwise(u, op, shape)

    def _conv(self, raised: patterns.Raised, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        """A convolution, raised: ``conv(x, w)`` (n, cout, *o), reshaped to tinygrad's
        (n, groups, cout/groups, *o)."""
        c = raised.conv
        x, dtype, xs = self.value(c.x)
        w, wdtype, ws = self.value(c.w)
        if wdtype != dtype:
            raise self.refuse(c.x, f"a convolution of {dtype} and {wdtype}")
        out = (xs[0], ws[0], *shape[3:1 + len(xs)])

        def ints(v: tuple[int, ...]) -> str:
            return "[" + ", ".join(map(str, v)) + "]"

        attrs = (f"{{dilations = {ints(c.dilations)}, group = {c.group}, kernel_shape = {ints(ws[2:])}, "
                 f"pads = {ints(c.pads)}, strides = {ints(c.strides)}}}")
        conv = self.new(dtype, out, f"conv({x}, {w}) {attrs}")
        self.raised["conv"] = self.raised.get("conv", 0) + 1
        return self.new(dtype, shape, f"reshape({conv}, {self.ints(list(shape))})"), dtype, shape

    def _normalisation(self, raised: patterns.Raised, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        """softmax, log_softmax (along an axis) and layer_normalization (over the last axis,
        scale 1: tinygrad's affine stays its multiply and add)."""
        x, dtype, xs = self.value(raised.operands[0])
        self.raised[raised.op] = self.raised.get(raised.op, 0) + 1
        if raised.op == "layer_normalization":
            ones = self.const(np.ones(xs[-1:]), dtype, xs[-1:])
            attrs = f"{{axis = -1, epsilon = {raised.epsilon!r}}}"
            return self.new(dtype, shape, f"layer_normalization({x}, {ones}) {attrs}"), dtype, shape
        return self.new(dtype, shape, f"{raised.op}({x}) {{axis = {raised.axis}}}"), dtype, shape

    def _stack(self, u: Any, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        """STACK of tensors (``cat``, ``stack``): each given a leading axis of 1, joined."""
        parts = []
        dtype = _sgr_dtype(u.dtype, self.version)
        for s in u.src:
            x, _, xs = self.value(s, like=dtype if self.constant(s) else None)
            one = (1, *xs)
            parts.append(self.new(dtype, one, f"reshape({x}, {self.ints(list(one))})"))
        return self.new(dtype, shape, f"concat({', '.join(parts)}) {{axis = 0}}"), dtype, shape

    def _buffer(self, u: Any) -> tuple[str, str, tuple[int, ...]]:
        dtype = _sgr_dtype(u.dtype, self.version)
        buf = getattr(u, "buffer", None)
        if buf is None or not buf.is_allocated():
            raise TinygradImportError(
                f"a tinygrad buffer of {tuple(u.shape)} that is neither realised nor an input: name it in "
                f"inputs=, or realize() it (tinygrad {self.version})", op="BUFFER", version=self.version)
        shape = self.shape(u)
        return self.const(_buffer_data(buf, dtype).reshape(shape), dtype, shape), dtype, shape

    def _window(self, u: Any, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        x, dtype, xs = self.value(u.src[0])
        first, second = _ints(u.src[1], self), _ints(u.src[2], self)
        if u.op.name == "SHRINK":
            # The window starts at the first source's offsets and spans the result's shape.
            starts, ends = self.ints(first), self.ints([b + o for b, o in zip(first, shape)])
            axes = self.ints(list(range(len(first))))
            return self.new(dtype, shape, f"slice({x}, {starts}, {ends}, {axes})"), dtype, shape
        # PAD's sources: the padding before each axis, and the padded shape.
        after = [o - i - b for o, i, b in zip(second, xs, first)]
        pads = self.ints(first + after)
        return self.new(dtype, shape, f"pad({x}, {pads})"), dtype, shape

    def _reduce(self, u: Any, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        # REDUCE (op, n) reduces the first n axes of its source (tinygrad 0.14).
        kind, n = u.arg
        if kind.name not in _REDUCE:
            raise self.refuse(u, f"reduce with {kind.name}")
        if int(n) == 0:
            return self.value(u.src[0])
        x, dtype, _ = self.value(u.src[0])
        axes = self.ints(list(range(int(n))))
        return self.new(dtype, shape, f"{_REDUCE[kind.name]}({x}, {axes}) {{keepdims = 0}}"), dtype, shape

    def _matmul(self, u: Any, raised: patterns.Raised, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        """A product (:func:`patterns.product`) raised: matmul(a as (…, M, K), b as (…, K, N))."""
        a, b = raised.operands
        x, dtype, sa = self.value(a)
        sb = self.shape(b)
        nk = sb[:-3] + sb[-2:]
        kn = nk[:-2] + (nk[-1], nk[-2])
        weight = self.weight(b)
        if weight is not None:
            # A weight is written already laid out (…, K, N): nothing to transpose per run.
            ydtype = _sgr_dtype(b.dtype, self.version)
            right = self.const(np.swapaxes(weight.reshape(nk), -1, -2), ydtype, kn) if ydtype == dtype else ""
        else:
            y, ydtype, _ = self.value(b)
            if ydtype == dtype:
                right_nk = self.new(dtype, nk, f"reshape({y}, {self.ints(list(nk))})")
                perm = list(range(len(nk) - 2)) + [len(nk) - 1, len(nk) - 2]
                right = self.new(dtype, kn, f"transpose({right_nk}) {{perm = [{', '.join(map(str, perm))}]}}")
        if ydtype != dtype or dtype == "bool":
            raise self.refuse(u, f"a product of {dtype} and {ydtype}")
        left_shape = sa[:-2] + sa[-1:]
        left = self.new(dtype, left_shape, f"reshape({x}, {self.ints(list(left_shape))})")
        self.raised["matmul"] = self.raised.get("matmul", 0) + 1
        return self.new(dtype, shape, f"matmul({left}, {right})"), dtype, shape

    def _operands(self, u: Any) -> tuple[list[str], str]:
        """The operands' names, constants typed after the first operand that is not one."""
        typed = next((self.value(s)[1] for s in u.src if not self.constant(s)), None)
        names = [self.value(s, like=typed if self.constant(s) else None)[0] for s in u.src]
        return names, typed or _sgr_dtype(u.dtype, self.version)

    def _elementwise(self, u: Any, op: str, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        if op in _UNARY or op in ("EXP2", "LOG2"):
            (x,), dtype = self._operands(u)
            result = _sgr_dtype(u.dtype, self.version)
            if result != dtype and not u.dtype.name.startswith("weak"):
                # tinygrad computes a float op of an integer input in floats, without a cast
                # node: the cast is written here.
                x, dtype = self.new(result, shape, f"cast({x}) {{to = dtype<{result}>}}"), result
            if op == "EXP2":  # 2^x = e^(x·ln 2)
                scaled = self.new(dtype, shape, f"mul({x}, {self.const(math.log(2), dtype)})")
                return self.new(dtype, shape, f"exp({scaled})"), dtype, shape
            if op == "LOG2":  # log2 x = ln x / ln 2
                ln = self.new(dtype, shape, f"log({x})")
                return self.new(dtype, shape, f"mul({ln}, {self.const(1 / math.log(2), dtype)})"), dtype, shape
            return self.new(dtype, shape, f"{_UNARY[op]}({x})"), dtype, shape
        if op in _BINARY:
            (a, b), dtype = self._operands(u)
            if dtype == "bool" and op in _BOOLEAN:
                # On bools tinygrad's + and max are or, * is and.
                return self.new("bool", shape, f"{_BOOLEAN[op]}({a}, {b})"), "bool", shape
            return self.new(dtype, shape, f"{_BINARY[op]}({a}, {b})"), dtype, shape
        if op in _COMPARE or op == "CMPNE":
            (a, b), _ = self._operands(u)
            if op == "CMPNE":
                eq = self.new("bool", shape, f"equal({a}, {b})")
                return self.new("bool", shape, f"not({eq})"), "bool", shape
            return self.new("bool", shape, f"{_COMPARE[op]}({a}, {b})"), "bool", shape
        if op in _INTEGER:
            return self._integer(u, op, shape)
        if op == "TRUNC":
            (x,), dtype = self._operands(u)
            if dtype not in _FLOATS:
                return x, dtype, shape
            # Toward zero: ceil below zero, floor from zero up.
            below = self.new("bool", shape, f"less({x}, {self.const(0, dtype)})")
            up, down = self.new(dtype, shape, f"ceil({x})"), self.new(dtype, shape, f"floor({x})")
            return self.new(dtype, shape, f"where({below}, {up}, {down})"), dtype, shape
        if op == "MULACC":
            (a, b, c), dtype = self._operands(u)
            product = self.new(dtype, shape, f"mul({a}, {b})")
            return self.new(dtype, shape, f"add({product}, {c})"), dtype, shape
        if op == "WHERE":
            cond = self.value(u.src[0])[0]
            typed = next((self.value(s)[1] for s in u.src[1:] if not self.constant(s)), None)
            typed = typed or _sgr_dtype(u.dtype, self.version)
            a, b = (self.value(s, like=typed if self.constant(s) else None)[0] for s in u.src[1:])
            return self.new(typed, shape, f"where({cond}, {a}, {b})"), typed, shape
        if op == "BITCAST":
            x, xdtype, xs = self.value(u.src[0])
            dtype = _sgr_dtype(u.dtype, self.version)
            if np.dtype(_NUMPY[xdtype]).itemsize != np.dtype(_NUMPY[dtype]).itemsize or "bf16" in (xdtype, dtype):
                raise self.refuse(u, f"a bitcast of {xdtype} to {dtype}: only between types of one width")
            return self.new(dtype, shape, f"bit_cast({x}) {{to = dtype<{dtype}>}}"), dtype, shape
        if op == "THREEFRY":
            raise self.refuse(u, "random numbers: draw them in tinygrad and pass them as an input")
        raise self.refuse(u)

    def _integer(self, u: Any, op: str, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        """Integer division, remainders, bitwise ops and shifts, with tinygrad's meaning:
        FLOORDIV and FLOORMOD round toward −∞ (Python's // and %), CDIV and CMOD toward zero
        (C's), AND/OR/XOR of bools are logical, shifts of signed ints are arithmetic."""
        if op in ("SHL", "SHR") and not _sgr_dtype(u.dtype, self.version).startswith("u"):
            return self._signed_shift(u, op, shape)
        (a, b), dtype = self._operands(u)
        if dtype == "bool" and op in ("AND", "OR", "XOR"):
            return self.new("bool", shape, f"{op.lower()}({a}, {b})"), "bool", shape
        if dtype in _FLOATS or dtype == "bool":
            raise self.refuse(u, f"{op} of {dtype}")
        if op in ("AND", "OR", "XOR"):
            return self.new(dtype, shape, f"bitwise_{op.lower()}({a}, {b})"), dtype, shape
        if op == "CDIV":
            return self.new(dtype, shape, f"div({a}, {b})"), dtype, shape
        if op in ("CMOD", "FLOORMOD"):
            fmod = 1 if op == "CMOD" else 0
            return self.new(dtype, shape, f"mod({a}, {b}) {{fmod = {fmod}}}"), dtype, shape
        if op == "FLOORDIV":
            return self._floor_div(a, b, dtype, shape, self.shape(u.src[1])), dtype, shape
        direction = "LEFT" if op == "SHL" else "RIGHT"
        return self.new(dtype, shape, f'bit_shift({a}, {b}) {{direction = "{direction}"}}'), dtype, shape

    def _floor_div(self, a: str, b: str, dtype: str, shape: tuple[int, ...], b_shape: tuple[int, ...]) -> str:
        """a // b rounded toward −∞ without overflow at the ends of the range: the truncating
        quotient, less one where the remainder is not 0 and its sign differs from b's."""
        q = self.new(dtype, shape, f"div({a}, {b})")
        if dtype.startswith("u"):
            return q
        r = self.new(dtype, shape, f"mod({a}, {b}) {{fmod = 1}}")
        zero = self.const(0, dtype)
        signs = self.new("bool", shape, f"xor({self.new('bool', shape, f'less({r}, {zero})')}, "
                                        f"{self.new('bool', b_shape, f'less({b}, {zero})')})")
        inexact = self.new("bool", shape, f"not({self.new('bool', shape, f'equal({r}, {zero})')})")
        down = self.new("bool", shape, f"and({inexact}, {signs})")
        return self.new(dtype, shape, f"sub({q}, {self.new(dtype, shape, f'cast({down}) {{to = dtype<{dtype}>}}')})")

    def _signed_shift(self, u: Any, op: str, shape: tuple[int, ...]) -> tuple[str, str, tuple[int, ...]]:
        """A shift of a signed integer by a constant k: a multiply by 2^k (wrapping as C's
        shift does) or a floor division by 2^k (an arithmetic shift right)."""
        x, dtype, _ = self.value(u.src[0])
        if dtype in _FLOATS or dtype == "bool":
            raise self.refuse(u, f"{op} of {dtype}")
        k = self.folded(u.src[1])
        if k is None or k.size != 1:
            raise self.refuse(u, f"{op} of {dtype} by a computed amount")
        amount, width = int(k.reshape(-1)[0]), 8 * np.dtype(_NUMPY[dtype]).itemsize
        if not 0 <= amount < width:
            raise self.refuse(u, f"{op} of {dtype} by {amount}: the amount must be 0 to {width - 1}")
        if op == "SHL":
            return self.new(dtype, shape, f"mul({x}, {self.const(1 << amount, dtype)})"), dtype, shape
        if amount == width - 1:
            # 2^(width−1) does not fit: the sign alone is left (−1 or 0).
            negative = self.new("bool", shape, f"less({x}, {self.const(0, dtype)})")
            sign = f"where({negative}, {self.const(-1, dtype)}, {self.const(0, dtype)})"
            return self.new(dtype, shape, sign), dtype, shape
        return self._floor_div(x, self.const(1 << amount, dtype), dtype, shape, ()), dtype, shape


# Weakly typed constant expressions, computed in f64 (integers as Python ints would).
_FOLD_UNARY = {"NEG": np.negative, "RECIPROCAL": np.reciprocal, "SQRT": np.sqrt, "EXP2": np.exp2,
               "LOG2": np.log2, "SIN": np.sin, "TRUNC": np.trunc}
_FOLD_BINARY = {"ADD": np.add, "MUL": np.multiply, "SUB": np.subtract, "FDIV": np.divide, "MAX": np.maximum,
                "POW": np.power}


def _fold(u: Any, w: _Writer) -> np.ndarray | None:
    op = u.op.name
    if op == "CONST":
        return np.asarray(u.arg)
    weak = getattr(u.dtype, "name", "").startswith("weak")
    if op != "STACK" and not weak:
        return None  # before reading the sources: a long chain of typed ops is not walked
    srcs = [w.folded(s) for s in u.src]
    if op == "STACK":
        if any(v is None for v in srcs):
            return None
        if not srcs:  # the empty shape, an argument of RESHAPE to ()
            return np.zeros(0, np.int64)
        return np.asarray([v for v in srcs if v is not None]).reshape(w.shape(u))
    if not srcs or srcs[0] is None:
        return None
    x: np.ndarray = srcs[0]
    with np.errstate(all="ignore"):
        if op in ("RESHAPE", "EXPAND"):
            return np.broadcast_to(x.reshape(-1)[0] if x.size == 1 else x, w.shape(u)) if op == "EXPAND" \
                else x.reshape(w.shape(u))
        if op in _FOLD_UNARY:
            result: np.ndarray = _FOLD_UNARY[op](x.astype(np.float64) if op != "NEG" else x)
            return result
        if op in _FOLD_BINARY and len(srcs) == 2 and srcs[1] is not None:
            result = _FOLD_BINARY[op](x, srcs[1])
            return result
    return None


def _buffer_data(buf: Any, dtype: str) -> np.ndarray:
    """A realised tinygrad buffer's elements as numpy (bf16 as f32: tinygrad 0.14's
    ``numpy()`` reads bf16 bytes as f32 words, so the bits are widened here)."""
    raw = np.asarray(buf.numpy())
    if dtype == "bf16":
        bits = np.frombuffer(raw.tobytes(), dtype="<u2").astype(np.uint32) << 16
        widened: np.ndarray = bits.view(np.float32)
        return widened
    typed: np.ndarray = raw.astype(_NUMPY[dtype])
    return typed


def _made_by(u: Any) -> str:
    """Where in the user's code ``u`` comes from, as far as tinygrad records it: the Tensor
    method that made it (tinygrad 0.14 keeps its name, not a file and line)."""
    try:
        from tinygrad.uop.ops import all_metadata
    except ImportError:  # another layout: nothing recorded
        return ""
    names = [m.name for m in all_metadata.get(u, ()) if getattr(m, "name", "")]
    return f" (made by Tensor.{names[0]})" if names else ""


def _stored(u: Any) -> Any | None:
    """The value ``AFTER(target, STORE(target, value))`` holds when the store writes the
    whole target, else None."""
    if u.op.name != "AFTER" or len(u.src) != 2:
        return None
    target, store = u.src
    if store.op.name != "STORE" or len(store.src) != 2 or store.src[0] is not target:
        return None
    value = store.src[1]
    if tuple(value.shape) != tuple(target.shape):
        return None
    return value


def _reached(roots: list[Any]) -> set[Any]:
    """Every UOp the roots read, iteratively."""
    seen: set[Any] = set()
    stack = list(roots)
    while stack:
        u = stack.pop()
        if u not in seen:
            seen.add(u)
            stack.extend(u.src)
    return seen


def _ints(u: Any, w: _Writer) -> list[int]:
    """The integers a movement op's argument holds (``_tinygrad_conv.const_ints``), or refused."""
    found = convolution.const_ints(u)
    if found is None:
        raise w.refuse(u, "a movement argument that is not constant (a symbolic shape)")
    return found


def to_sgr(*outputs: Any, inputs: Mapping[str, Any] | None = None, name: str = "tinygrad",
           format: str = "json") -> str:
    """The SGR-ML program computing ``outputs`` (tinygrad tensors), with the tensors of
    ``inputs`` as the program's inputs by name; outputs are named ``output_0``, … ``format``
    is ``"json"`` (the JSON form, ``schemas/sgr.schema.json``, verified) or ``"text"``
    (the text form); every xpu tool loads either (``.json`` / ``.sgr``)."""
    imported = import_graph(*outputs, inputs=inputs, name=name)
    if format == "text":
        return imported.sgr
    if format == "json":
        return imported.json()
    raise ValueError(f"format {format!r}: expected 'json' or 'text'")


class Imported:
    """What :func:`import_graph` made: the SGR-ML text, the patterns raised to one op (by
    op), how many SGR-ML values the rest became, and ``notes``: what was left undone and
    why (a convolution too large to prove stays arithmetic)."""

    def __init__(self, sgr: str, raised: dict[str, int], values: int, notes: list[str] | None = None) -> None:
        self.sgr, self.raised, self.values = sgr, raised, values
        self.notes = notes or []

    def __repr__(self) -> str:
        return f"Imported(values={self.values}, raised={self.raised})"

    def json(self) -> str:
        """The program's JSON form, parsed and verified by xpu's own IR (a program the
        importer wrote wrongly is refused here, naming the line)."""
        from .._engines import native

        text: str = native().sgr_json(self.sgr)
        return text


def import_graph(*outputs: Any, inputs: Mapping[str, Any] | None = None, name: str = "tinygrad") -> Imported:
    """:func:`to_sgr` with what the import did: ``raised`` counts the tinygrad patterns
    written as one SGR-ML op (``{"matmul": 2}``)."""
    version = check_version()
    if not outputs:
        raise TinygradImportError("to_sgr needs at least one output tensor", version=version)
    by_uop: dict[Any, str] = {}
    for n, t in (inputs or {}).items():
        if not n or any(c in n for c in ('"', "\\", "\n")):
            raise TinygradImportError(f"input name {n!r}: not empty, no quotes, backslashes or newlines",
                                      version=version)
        # A 0-d tensor realises as a CONST, shared with every equal constant: not an input.
        if getattr(t.uop.base, "op", None) is None or t.uop.base.op.name != "BUFFER":
            raise TinygradImportError(
                f"input {n!r} is not a realised buffer (a {t.uop.base.op.name}; 0-d tensors are constants "
                f"in tinygrad: give it shape (1,))", version=version)
        if t.uop in by_uop:
            raise TinygradImportError(f"inputs {by_uop[t.uop]!r} and {n!r} are the same tensor", version=version)
        by_uop[t.uop] = n
    w = _Writer(by_uop, version)
    # SGR-ML declares every input before the first node.
    for u in by_uop:
        w.names[u] = w._emit(u, None)
    returned = []
    for i, t in enumerate(outputs):
        try:
            value, _, _ = w.value(t.uop)
        except RecursionError:
            # Only a graph with a cycle (a tinygrad bug) recurses this deep: walks are iterative.
            raise TinygradImportError(f"output {i}: the graph has a cycle (tinygrad {version})",
                                      version=version) from None
        returned.append(f'"output_{i}" = {value}')
    reached = _reached([t.uop for t in outputs])
    for u, n in by_uop.items():
        if u not in reached:
            raise TinygradImportError(
                f"input {n!r} does not reach the outputs: was a value computed from it realised "
                f"(.realize(), .numpy()) on the way? It would be read as a constant", version=version)
    body = "\n".join(w.lines)
    name = name.replace("\\", "_").replace('"', "_")
    sgr = f'graph "{name}" {{\n{body}\n  return {", ".join(returned)}\n}}\n'
    return Imported(sgr, dict(w.raised), w.count, list(w.notes))


def compile(fn: Any, *example_inputs: Any, names: list[str] | None = None, **session: Any) -> Any:
    """Traces ``fn`` — a Python function of tinygrad tensors returning one or more tensors —
    on ``example_inputs`` (numpy arrays; their shapes are the program's) into an
    :class:`xpu.InferenceSession`; ``session`` takes its keyword arguments (``policy=``,
    ``engine=``, …). Inputs are named ``names`` or ``input_0``, ``input_1``, …"""
    import os
    import tempfile

    from ..session import InferenceSession
    from tinygrad.tensor import Tensor

    tensors = [_input_tensor(np.asarray(x)) for x in example_inputs]
    names = names or [f"input_{i}" for i in range(len(tensors))]
    if len(names) != len(tensors):
        raise TinygradImportError(f"{len(names)} names for {len(tensors)} inputs", version=tinygrad_version())
    out = fn(*tensors)
    outputs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    sgr = to_sgr(*outputs, inputs=dict(zip(names, tensors)), name=getattr(fn, "__name__", "tinygrad"), format="text")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "program.sgr")
        with open(path, "w") as f:
            f.write(sgr)
        return InferenceSession(path, **session)


def _input_tensor(array: np.ndarray) -> Any:
    """A realised tensor of ``array`` backed by a buffer (a 0-d tensor would be a CONST)."""
    from tinygrad.tensor import Tensor

    if array.ndim == 0:
        raise TinygradImportError("0-d inputs are constants in tinygrad: give the input shape (1,)",
                                  version=tinygrad_version())
    return Tensor(np.ascontiguousarray(array)).realize()


def main(argv: list[str] | None = None) -> int:
    """``python -m xpu.frontends.tinygrad FILE.py:FN --input NAME=D0,D1 … -o OUT.sgr``: calls
    FN on realised tensors of the given shapes (zeros) and writes the SGR-ML program."""
    import argparse
    import importlib.util
    import os
    import sys

    p = argparse.ArgumentParser(prog="python -m xpu.frontends.tinygrad", description=main.__doc__)
    p.add_argument("target", help="FILE.py:FUNCTION")
    p.add_argument("--input", action="append", default=[], help="NAME=D0,D1,… (f32)")
    p.add_argument("-o", "--output", required=True, help="OUT.sgr (text form) or OUT.json (JSON form)")
    args = p.parse_args(argv)
    file, _, fn_name = args.target.rpartition(":")
    if not file or not fn_name:
        p.error(f"{args.target}: expected FILE.py:FUNCTION")
    if not os.path.isfile(file):
        p.error(f"{file}: no such file")
    spec = importlib.util.spec_from_file_location("xpu_tinygrad_model", file)
    if spec is None or spec.loader is None:
        p.error(f"{file}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, fn_name, None)
    if fn is None:
        p.error(f"{file} has no function {fn_name}")
    inputs: dict[str, Any] = {}
    for item in args.input:
        name, eq, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not eq or not name or not shape or min(shape) < 1 or name in inputs:
            p.error(f"--input {item}: expected NAME=D0,D1,… (dims ≥ 1, each name once)")
        inputs[name] = _input_tensor(np.zeros(shape, np.float32))
    try:
        out = fn(*inputs.values())
        outputs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        imported = import_graph(*outputs, inputs=inputs, name=fn_name)
    except TinygradImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        program = imported.json() if args.output.endswith(".json") else imported.sgr
    except ProgramError as e:
        print(f"error: the imported program does not verify: {e}", file=sys.stderr)
        return 1
    with open(args.output, "w") as f:
        f.write(program)
    for note in imported.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"{args.output}: {imported.values} values, raised {imported.raised or 'nothing'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
