"""MiniLang from notebooks: run a program's source and get what it prints as Python
values — tensors as numpy arrays, tables as ``pandas.DataFrame`` when pandas is installed
(read through the Arrow C stream interface when pyarrow is too; else a dict of numpy
columns) — and the charts its ``plot`` statements draw, which a
notebook shows inline."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from . import _engines
from .policy import Policy


@dataclass(frozen=True)
class Printed:
    """One ``print`` of a program: ``text`` for a string, else ``name`` and ``value``."""

    name: str | None
    value: Any
    text: str | None = None


@dataclass(frozen=True)
class Plot:
    """A chart a program's ``plot`` drew: the file it wrote (``path``) and its bytes
    (``data``: PNG or SVG, as ``format`` says). IPython and Jupyter show it inline."""

    path: str
    data: bytes

    @property
    def format(self) -> str:
        return "svg" if self.path.lower().endswith(".svg") else "png"

    def _repr_png_(self) -> bytes | None:
        return self.data if self.format == "png" else None

    def _repr_svg_(self) -> str | None:
        return self.data.decode("utf-8") if self.format == "svg" else None


def _table(table: Any) -> Any:
    """A printed table (an ``ArrowTable``, Arrow's C stream protocol): a DataFrame read
    through Arrow when pyarrow is installed, else one built from numpy columns; without
    pandas, the dict of numpy columns."""
    try:
        import pandas as pd
    except ImportError:
        return table.columns()
    pa = _pyarrow()
    if pa is not None:
        try:
            return pa.table(table).to_pandas()
        except TypeError:  # a pyarrow without Arrow's stream protocol (before 15)
            pass
    return pd.DataFrame(table.columns())


def _pyarrow() -> Any:
    """pyarrow when installed, else ``None``."""
    try:
        import pyarrow
    except ImportError:
        return None
    return pyarrow


def run(
    source: str,
    inputs: Mapping[str, Any] | None = None,
    policy: Policy | str | os.PathLike[str] | None = None,
    roots: Sequence[str | os.PathLike[str]] = (),
) -> list[Printed]:
    """Runs MiniLang ``source`` with ``inputs`` (name → array) for its ``input("name")``s,
    under ``policy`` (default: built-in), reading files inside ``roots`` (default: the
    working directory). Returns its printed values in order, then a :class:`Plot` for each
    chart a ``plot`` drew (``name`` ``plot_N``, the file also written). Raises
    :class:`xpu.ProgramError` with the located, underlined diagnostics when it does not
    compile."""
    pol = policy if isinstance(policy, Policy) else Policy.load(policy) if policy is not None else None
    items = _engines.native().run_minilang(
        source, dict(inputs or {}), None if pol is None else pol._native, [os.fspath(r) for r in roots]
    )
    out: list[Printed] = []
    for item in items:
        if item[0] == "text":
            out.append(Printed(None, item[1], text=item[1]))
        elif item[0] == "plot":
            out.append(Printed(item[1], Plot(item[2], bytes(item[3]))))
        else:
            value = item[2]
            out.append(Printed(item[1], _table(value) if hasattr(value, "__arrow_c_stream__") else value))
    return out
