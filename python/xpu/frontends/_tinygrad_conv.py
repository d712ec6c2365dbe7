"""tinygrad's convolution recognised and raised to one SGR-ML ``conv``.

tinygrad 0.14 writes ``conv2d`` (any number of spatial dims, stride, dilation, padding,
groups) as a chain of movement ops that lays the input's windows out — pad, repeat,
reshape, shrink, permute, expand over the output channels — a multiply with the weight
reshaped to match, and a sum over (input channel, kernel window). The chain differs with
every stride and dilation, so it is not matched op by op: it is *run* on indices. The
input's element numbers (−1 for padding) go through the same movement ops in numpy, and
the result must equal, element for element, the windows a convolution with the derived
stride, dilation and padding reads; the weight's side likewise. Only then is the pattern
raised, so a graph that merely resembles a convolution stays arithmetic (and exact).
Index arrays over :data:`LIMIT` elements are not built: such a convolution stays
arithmetic too."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

#: The most elements an index array may have while a chain is run on it (int32: 128 MiB).
LIMIT = 1 << 25
#: How many candidate operands (UOps of the right shape on a chain) are tried per side.
TRIES = 3
_MOVEMENT = ("RESHAPE", "EXPAND", "PERMUTE", "PAD", "SHRINK", "FLIP")


class Conv(NamedTuple):
    """A raised convolution: ``conv(x, w)`` then a reshape to the REDUCE's shape."""

    x: Any
    w: Any
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    group: int


def const_ints(u: Any) -> list[int] | None:
    """The integers a movement argument holds: a STACK of constants, or one constant."""
    if u.op.name == "CONST":
        return [int(u.arg)]
    if u.op.name == "STACK" and all(c.op.name == "CONST" for c in u.src):
        return [int(c.arg) for c in u.src]
    return None


def _chain(top: Any, inputs: Any) -> list[Any]:
    """The movement ops from ``top`` down, ending at the first UOp that is not one (or is an
    input): [top, …, leaf]."""
    chain = [top]
    while chain[-1].op.name in _MOVEMENT and chain[-1] not in inputs:
        chain.append(chain[-1].src[0])
    return chain


def _run(chain: list[Any], start: int) -> np.ndarray | None:
    """The element numbers of ``chain[start]`` moved by ``chain[start-1] … chain[0]``, −1
    where padding is read; None when an argument is symbolic or an array is too big."""
    base = chain[start]
    if int(np.prod(base.shape)) > LIMIT:
        raise _TooLarge(int(np.prod(base.shape)))
    idx: np.ndarray = np.arange(int(np.prod(base.shape)), dtype=np.int32).reshape(tuple(base.shape))
    for u in reversed(chain[:start]):
        name, shape = u.op.name, tuple(int(d) for d in u.shape)
        if name == "RESHAPE":
            if idx.size > LIMIT:
                raise _TooLarge(idx.size)
            idx = idx.reshape(shape)
        elif name == "EXPAND":
            idx = np.broadcast_to(idx.reshape((1,) * (len(shape) - idx.ndim) + idx.shape), shape)
        elif name == "PERMUTE":
            idx = idx.transpose(tuple(int(p) for p in u.arg))
        elif name == "FLIP":
            idx = np.flip(idx, tuple(i for i, f in enumerate(u.arg) if f))
        elif name in ("PAD", "SHRINK"):
            first, second = const_ints(u.src[1]), const_ints(u.src[2])
            if first is None or second is None:
                return None
            if name == "SHRINK":
                idx = idx[tuple(slice(b, b + n) for b, n in zip(first, shape))]
            else:
                if int(np.prod(shape)) > LIMIT:
                    raise _TooLarge(int(np.prod(shape)))
                after = [o - i - b for o, i, b in zip(second, idx.shape, first)]
                idx = np.pad(idx, list(zip(first, after)), constant_values=-1)
        if tuple(idx.shape) != shape:
            return None
    return idx


def _operands(chain: list[Any], want: Any) -> list[int]:
    """The positions in ``chain`` (below its top) of the UOps whose shape ``want`` accepts,
    deepest first, at most :data:`TRIES`."""
    found = [i for i in range(len(chain) - 1, 0, -1) if want(tuple(int(d) for d in chain[i].shape))]
    return found[:TRIES]


def _single(idx: np.ndarray, axes: list[int]) -> np.ndarray | None:
    """``idx`` with the broadcast ``axes`` (stride 0: the same along them) taken once."""
    for a in axes:
        if idx.shape[a] != 1 and idx.strides[a] != 0:
            return None
    return idx[tuple(slice(0, 1) if a in axes else slice(None) for a in range(idx.ndim))]


def _windows(n: int, c: int, size: tuple[int, ...], o: tuple[int, ...], k: tuple[int, ...],
             s: list[int], d: list[int], p: list[int], group: int, cin: int) -> np.ndarray:
    """What a convolution reads, as element numbers of x (n, c, *size) (−1: padding),
    shaped (n, group, 1, *o, cin, *k) like tinygrad's multiply."""
    spatial = len(size)
    nn = np.arange(n, dtype=np.int32).reshape((n,) + (1,) * (2 + 2 * spatial + 1))
    gg = np.arange(group, dtype=np.int32).reshape((1, group) + (1,) * (1 + 2 * spatial + 1))
    cc = np.arange(cin, dtype=np.int32).reshape((1, 1, 1) + (1,) * spatial + (cin,) + (1,) * spatial)
    flat = (nn * c + gg * cin + cc)
    valid = np.ones((1,) * (4 + 2 * spatial), dtype=bool)
    for j in range(spatial):
        oo = np.arange(o[j], dtype=np.int32).reshape((1,) * (3 + j) + (o[j],) + (1,) * (2 * spatial - j))
        kk = np.arange(k[j], dtype=np.int32).reshape((1,) * (4 + spatial + j) + (k[j],) + (1,) * (spatial - 1 - j))
        at = oo * s[j] + kk * d[j] - p[j]
        valid = valid & (at >= 0) & (at < size[j])
        flat = flat * size[j] + at
    return np.where(valid, flat, -1)


def _derive(a: np.ndarray, size: tuple[int, ...], spatial: int) -> tuple[list[int], list[int], list[int]] | None:
    """Stride, dilation and padding before, per spatial axis, read off the windows of the
    first image, group and channel (``a`` is (*o, *k) of element numbers)."""
    s, d, p = [], [], []
    hits = np.argwhere(a >= 0)
    if hits.size == 0:
        return None
    # Lines through the first element read from x (not padding): along o_j and along k_j.
    first = tuple(int(i) for i in hits[0])
    for j in range(spatial):
        inner = int(np.prod(size[j + 1:]))
        coord = np.where(a >= 0, (a // inner) % size[j], -1)
        o_line = coord[tuple(slice(None) if i == j else first[i] for i in range(2 * spatial))]
        k_line = coord[tuple(slice(None) if i == spatial + j else first[i] for i in range(2 * spatial))]
        step, dil = _step(o_line), _step(k_line)
        if step is None or dil is None or step < 1 or dil < 1:
            return None
        # The window element gives the padding: at = o·s + k·d − p.
        p.append(first[j] * step + first[spatial + j] * dil - int(coord[first]))
        s.append(step)
        d.append(dil)
    return s, d, p


def _step(line: np.ndarray) -> int | None:
    """The difference between neighbouring valid entries of a 1-d coordinate line."""
    for i in range(len(line) - 1):
        if line[i] >= 0 and line[i + 1] >= 0:
            return int(line[i + 1] - line[i])
    return 1 if len(line) == 1 else None


def match(u: Any, inputs: Any, notes: list[str]) -> Conv | None:
    """The convolution REDUCE ``u`` ends, proven on indices, or None; ``notes`` gets a line
    when one looked like a convolution but was too large to prove."""
    if u.op.name != "REDUCE" or u.arg[0].name != "ADD":
        return None
    n_reduced = int(u.arg[1])
    perm_op = u.src[0]
    if perm_op.op.name != "PERMUTE" or perm_op.src[0].op.name != "MUL":
        return None
    mul = perm_op.src[0]
    r = len(mul.shape)
    spatial = (r - 4) // 2
    if spatial < 1 or r != 4 + 2 * spatial or not 1 <= n_reduced <= 1 + spatial:
        return None
    # The reduced axes moved to the front, the rest after them in order. tinygrad reduces
    # (channel, window) but skips those of size 1.
    if not all(isinstance(dim, int) for dim in mul.shape):
        return None
    shape = tuple(int(dim) for dim in mul.shape)
    perm = tuple(int(p) for p in perm_op.arg)
    reduced, kept = perm[:n_reduced], perm[n_reduced:]
    trailing = range(3 + spatial, r)
    if (
        kept != tuple(sorted(kept)) or not set(reduced) <= set(trailing)
        or any(shape[a] != 1 for a in trailing if a not in reduced)
    ):
        return None
    n, group, rcout = shape[:3]
    o, cin, k = shape[3:3 + spatial], shape[3 + spatial], shape[4 + spatial:]
    for a_top, b_top in ((mul.src[0], mul.src[1]), (mul.src[1], mul.src[0])):
        try:
            found = _prove(a_top, b_top, inputs, n, group, rcout, o, cin, k, spatial)
        except _TooLarge as e:
            notes.append(f"a convolution-shaped product {shape} stays arithmetic: proving it needs an index "
                         f"array of {e.args[0]:,} elements (limit {LIMIT:,}); import it in smaller batches")
            return None
        if found is not None:
            return found
    return None


class _TooLarge(Exception):
    """An index array over :data:`LIMIT` elements would be needed."""


def _prove(a_top: Any, b_top: Any, inputs: Any, n: int, group: int, rcout: int, o: tuple[int, ...],
           cin: int, k: tuple[int, ...], spatial: int) -> Conv | None:
    a_chain, b_chain = _chain(a_top, inputs), _chain(b_top, inputs)
    if not all(isinstance(dim, int) for u in a_chain + b_chain for dim in u.shape):
        return None
    wshape = (group * rcout, cin, *k)
    for wi in _operands(b_chain, lambda s: s == wshape):
        for xi in _operands(a_chain, lambda s: len(s) == 2 + spatial and s[0] == n and s[1] == group * cin):
            found = _prove_at(a_chain, xi, b_chain, wi, wshape, n, group, rcout, o, cin, k, spatial)
            if found is not None:
                return found
    return None


def _prove_at(a_chain: list[Any], xi: int, b_chain: list[Any], wi: int, wshape: tuple[int, ...], n: int,
              group: int, rcout: int, o: tuple[int, ...], cin: int, k: tuple[int, ...], spatial: int) -> Conv | None:
    """The proof with x at ``a_chain[xi]`` and w at ``b_chain[wi]``."""
    x_uop, w_uop = a_chain[xi], b_chain[wi]
    size = tuple(int(dim) for dim in x_uop.shape[2:])
    a = _run(a_chain, xi)
    b = _run(b_chain, wi)
    if a is None or b is None:
        return None
    # The weight is the same for every image and output position; the windows for every
    # output channel.
    b1 = _single(b, [0, *range(3, 3 + spatial)])
    a1 = _single(a, [2])
    if a1 is None or b1 is None:
        return None
    want_b = np.arange(int(np.prod(wshape))).reshape((1, group, rcout) + (1,) * spatial + (cin, *k))
    if not np.array_equal(b1, want_b):
        return None
    whole: tuple[Any, ...] = (slice(None),) * spatial
    first = a1[(0, 0, 0) + whole + (0,) + whole]
    derived = _derive(first, size, spatial)
    if derived is None:
        return None
    s, d, p = derived
    if min(p) < 0:
        return None
    want_a = _windows(n, group * cin, size, o, k, s, d, p, group, cin)
    if not np.array_equal(a1, want_a):
        return None
    # ONNX pads: before as derived; after so the output has exactly o positions.
    after = [max(0, (o[j] - 1) * s[j] + (k[j] - 1) * d[j] + 1 - size[j] - p[j]) for j in range(spatial)]
    for j in range(spatial):
        if (size[j] + p[j] + after[j] - (k[j] - 1) * d[j] - 1) // s[j] + 1 != o[j]:
            return None
    return Conv(x_uop, w_uop, tuple(s), tuple(d), tuple(p + after), group)
