"""The exceptions xpu raises. Every one derives from :class:`XpuError` and names what is
wrong: the input, the policy key (with file, line and column), the engine and device."""

from __future__ import annotations

from typing import Any


class XpuError(Exception):
    """Base class of every xpu error."""

    def __init__(self, message: str, **attrs: Any) -> None:
        super().__init__(message)
        self.message = message
        for key, value in attrs.items():
            setattr(self, key, value)


class ProgramError(XpuError):
    """A program or model that cannot be read, parsed, type-checked or verified. The
    message starts with the file's name; MiniLang diagnostics are rendered with their
    line, column and an underline."""


class PolicyError(XpuError, ValueError):
    """A policy that does not load or check. ``diagnostics`` lists each problem as a dict:
    ``code`` (P0002 …), ``severity``, ``file``, ``line``, ``column``, ``key``
    (``engines.order``), ``message`` and ``help``."""

    diagnostics: list[dict[str, Any]]

    def __init__(self, message: str, diagnostics: list[dict[str, Any]] | None = None, **attrs: Any) -> None:
        super().__init__(message, **attrs)
        self.diagnostics = diagnostics or []


class PlanError(XpuError):
    """No plan exists under the policy for this program on this machine (a node no allowed
    engine can run, a fallback budget exceeded …). ``codes`` lists the reason codes."""

    codes: list[str]
    policy: str

    def __init__(self, message: str, codes: list[str] | None = None, policy: str = "", **attrs: Any) -> None:
        super().__init__(message, **attrs)
        self.codes = codes or []
        self.policy = policy


class EngineUnavailable(PlanError):
    """The policy needs an engine or kernel this machine does not have (no GPU, no
    TensorRT provider, a library missing): ``engine``, ``device`` and ``reason`` say which
    and why. A policy that allows fallback plans elsewhere instead and says so in
    ``explain()``."""

    engine: str
    device: str
    reason: str

    def __init__(self, message: str, engine: str = "", device: str = "", reason: str = "", **attrs: Any) -> None:
        super().__init__(message, **attrs)
        self.engine = engine
        self.device = device
        self.reason = reason


class InputError(XpuError, ValueError):
    """An input that does not fit the program: unknown or missing name, dtype, rank or
    shape, or an array xpu cannot read (object dtype, non-native byte order). ``input``
    names it when the problem is one input's."""

    input: str | None

    def __init__(self, message: str, input: str | None = None, **attrs: Any) -> None:
        super().__init__(message, **attrs)
        self.input = input


class RunError(XpuError):
    """A run that failed in an engine (the message names the partition and engine)."""


class SessionClosed(XpuError):
    """The session was used after ``close()``."""


__all__ = [
    "XpuError",
    "ProgramError",
    "PolicyError",
    "PlanError",
    "EngineUnavailable",
    "InputError",
    "RunError",
    "SessionClosed",
]
