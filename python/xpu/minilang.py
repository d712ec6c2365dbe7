"""MiniLang from notebooks: run a program's source and get what it prints as Python
values — tensors as numpy arrays, tables as ``pandas.DataFrame`` when pandas is installed
(else a dict of numpy columns)."""

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


def _table(columns: dict[str, Any]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        return columns
    return pd.DataFrame(columns)


def run(
    source: str,
    inputs: Mapping[str, Any] | None = None,
    policy: Policy | str | os.PathLike[str] | None = None,
    roots: Sequence[str | os.PathLike[str]] = (),
) -> list[Printed]:
    """Runs MiniLang ``source`` with ``inputs`` (name → array) for its ``input("name")``s,
    under ``policy`` (default: built-in), reading files inside ``roots`` (default: the
    working directory). Returns its printed values in order. Raises
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
        else:
            value = item[2]
            out.append(Printed(item[1], _table(value) if isinstance(value, dict) else value))
    return out
