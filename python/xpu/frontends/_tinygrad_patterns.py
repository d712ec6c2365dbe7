"""Patterns of tinygrad's UOp graph (0.14) that the importer raises to one SGR-ML op.

tinygrad writes a matrix product as a broadcast multiply and a sum, and softmax,
log-softmax and layer norm as their arithmetic (max, exp2, sums, reciprocals). Each matcher
here recognises one such subgraph from its last UOp and returns what the raised op reads,
or None. A matcher checks every UOp of the pattern — the op, the axis, the constants
(1/ln 2, 1/n) — and that the same value flows where the formula needs it (UOps are
hash-consed: the same computation is the same object), so a graph that only looks alike
stays arithmetic and is still imported exactly."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

#: The ops that pass a value through unchanged in a graph that is not scheduled yet.
PASS = ("DETACH", "CONTIGUOUS", "CONTIGUOUS_BACKWARD", "NOOP")


class Raised(NamedTuple):
    """One SGR-ML op for a tinygrad subgraph: ``op`` reads ``operands`` (UOps)."""

    op: str
    operands: tuple[Any, ...]
    axis: int = -1
    epsilon: float = 0.0
    #: A convolution's attributes (``_tinygrad_conv.Conv``).
    conv: Any = None


def strip(u: Any) -> Any:
    while u.op.name in PASS:
        u = u.src[0]
    return u


def const_value(u: Any) -> float | None:
    """The number a constant subexpression holds (``CONST``, or its reciprocal: tinygrad
    divides by n as a multiply by ``RECIPROCAL(n)``)."""
    u = strip(u)
    if u.op.name == "CONST" and isinstance(u.arg, (int, float)) and not isinstance(u.arg, bool):
        return float(u.arg)
    if u.op.name == "RECIPROCAL":
        v = const_value(u.src[0])
        return 1.0 / v if v else None
    return None


def _close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-9)


def scaled(u: Any, factor: float) -> Any | None:
    """x where ``u`` is ``MUL(x, factor)`` (either way round)."""
    u = strip(u)
    if u.op.name != "MUL":
        return None
    a, b = u.src
    if _close(const_value(b), factor):
        return a
    if _close(const_value(a), factor):
        return b
    return None


def _ordered(u: Any, op: str) -> list[tuple[Any, Any]]:
    """The two orders of a binary ``op``'s operands, or none."""
    u = strip(u)
    if u.op.name != op or len(u.src) != 2:
        return []
    a, b = u.src
    return [(a, b), (b, a)]


def kept_reduce(u: Any, kind: str) -> tuple[Any, int] | None:
    """(x, axis) where ``u`` is x reduced by ``kind`` over one axis with the axis kept:
    tinygrad moves the axis to the front (``PERMUTE``, none for axis 0), reduces the first
    axis (``REDUCE(kind, 1)``) and reshapes the axis back in as 1."""
    u = strip(u)
    if u.op.name != "RESHAPE":
        return None
    r = u.src[0]
    if r.op.name != "REDUCE" or r.arg[0].name != kind or int(r.arg[1]) != 1:
        return None
    p = r.src[0]
    if p.op.name == "PERMUTE":
        perm = tuple(int(i) for i in p.arg)
        axis = perm[0]
        if perm != (axis, *(i for i in range(len(perm)) if i != axis)):
            return None
        x = p.src[0]
    else:
        axis, x = 0, p
    shape = tuple(x.shape)
    if tuple(u.shape) != shape[:axis] + (1,) + shape[axis + 1:]:
        return None
    return x, axis


def centred(u: Any, kind: str, scale: float | None = None) -> tuple[Any, int] | None:
    """(x, axis) where ``u`` is ``x - reduce(x, axis, keepdim)``, the reduce scaled by
    ``scale`` (1/n: a mean) when given: ``ADD(x, MUL(reduced, -1))``."""
    for x, neg in _ordered(u, "ADD"):
        reduced = scaled(neg, -1.0)
        if reduced is None:
            continue
        if scale is not None:
            reduced = scaled(reduced, scale)
            if reduced is None:
                continue
        found = kept_reduce(reduced, kind)
        if found is not None and found[0] is x:
            return found
    return None


def _exp(u: Any) -> Any | None:
    """x where ``u`` is e^x as tinygrad writes it: ``EXP2(MUL(x, 1/ln 2))``."""
    u = strip(u)
    if u.op.name != "EXP2":
        return None
    return scaled(u.src[0], 1 / math.log(2))


def softmax(u: Any) -> Raised | None:
    """``e * RECIPROCAL(sum(e, axis))`` with e = exp(x - max(x, axis))."""
    for e, r in _ordered(u, "MUL"):
        r = strip(r)
        if r.op.name != "RECIPROCAL":
            continue
        total = kept_reduce(r.src[0], "ADD")
        if total is None or strip(total[0]) is not strip(e):
            continue
        inner = _exp(e)
        c = centred(inner, "MAX") if inner is not None else None
        if c is not None and c[1] == total[1]:
            return Raised("softmax", (c[0],), axis=c[1])
    return None


def log_softmax(u: Any) -> Raised | None:
    """``c - log(sum(exp(c), axis))`` with c = x - max(x, axis); tinygrad's log is
    ``LOG2(·) * ln 2``."""
    for c, neg in _ordered(u, "ADD"):
        log = scaled(neg, -1.0)
        log = scaled(log, math.log(2)) if log is not None else None
        if log is None or strip(log).op.name != "LOG2":
            continue
        total = kept_reduce(strip(log).src[0], "ADD")
        inner = _exp(total[0]) if total is not None else None
        if inner is None or strip(inner) is not strip(c):
            continue
        found = centred(c, "MAX")
        if found is not None and total is not None and found[1] == total[1]:
            return Raised("log_softmax", (found[0],), axis=found[1])
    return None


def layer_norm(u: Any) -> Raised | None:
    """``c * RECIPROCAL(SQRT(sum(c·c, axis)/n + eps))`` with c = x - sum(x, axis)/n, over
    the last axis (tinygrad's ``layernorm()`` without its affine)."""
    for c, r in _ordered(u, "MUL"):
        r = strip(r)
        if r.op.name != "RECIPROCAL" or strip(r.src[0]).op.name != "SQRT":
            continue
        for var, eps in _ordered(strip(r.src[0]).src[0], "ADD"):
            epsilon = const_value(eps)
            if epsilon is None:
                continue
            shape = tuple(c.shape)
            n = shape[-1] if shape else 0
            if not n:
                continue
            squares = scaled(var, 1.0 / n)
            total = kept_reduce(squares, "ADD") if squares is not None else None
            if total is None or total[1] != len(shape) - 1:
                continue
            pairs = _ordered(total[0], "MUL")
            if not pairs or pairs[0][0] is not pairs[0][1] or strip(pairs[0][0]) is not strip(c):
                continue
            found = centred(c, "ADD", scale=1.0 / n)
            if found is not None and found[1] == len(shape) - 1:
                return Raised("layer_normalization", (found[0],), axis=-1, epsilon=epsilon)
    return None


def product(u: Any) -> Raised | None:
    """tinygrad's matrix product: REDUCE(ADD, 1) of the shared axis moved to the front
    (PERMUTE (r-1, 0, …, r-2)) of MUL(a, b), where a is (…, M, 1, K) and b is (…, 1, N, K)
    (either way round)."""
    if u.op.name != "REDUCE":
        return None
    kind, n = u.arg
    p = u.src[0]
    if kind.name != "ADD" or int(n) != 1 or p.op.name != "PERMUTE":
        return None
    mul = p.src[0]
    r = len(mul.shape)
    if r < 3 or tuple(p.arg) != (r - 1, *range(r - 1)) or mul.op.name != "MUL":
        return None
    for a, b in ((mul.src[0], mul.src[1]), (mul.src[1], mul.src[0])):
        # Shapes broadcast numpy-style: a missing leading axis is a 1.
        sa, sb = tuple(a.shape), tuple(b.shape)
        if (
            len(sa) >= 3 and len(sb) >= 2 and max(len(sa), len(sb)) == r
            and sa[-2] == 1 and (len(sb) < 3 or sb[-3] == 1) and sa[-1] == sb[-1]
        ):
            return Raised("matmul", (a, b))
    return None


def match(u: Any) -> Raised | None:
    """The pattern ``u`` ends, if any."""
    name = u.op.name
    if name == "REDUCE":
        return product(u)
    if name == "MUL":
        return softmax(u) or layer_norm(u)
    if name == "ADD":
        return log_softmax(u)
    return None
