"""xpu: run ML and data programs under a policy that pins or prefers engine, kernel,
precision and memory choices, and explains every decision.

>>> import xpu                                                     # doctest: +SKIP
>>> sess = xpu.InferenceSession("model.onnx", engine="ort")        # doctest: +SKIP
>>> out = sess.run({"input": x})                                   # doctest: +SKIP
>>> sess.explain()["decisions"][0]["chosen"]                       # doctest: +SKIP

Importing loads no engine library; engines load when a session or program first needs
them (docs/python.md)."""

from __future__ import annotations

import json
import os
from typing import Any

from . import minilang
from .client import ApiError, Ask, Client, Run
from .errors import (
    EngineUnavailable,
    InputError,
    PlanError,
    PolicyError,
    ProgramError,
    RunError,
    SessionClosed,
    XpuError,
)
from .policy import ExecutionPolicy, KernelPolicy, Policy, PolicyTestReport, PolicyTestResult
from .session import InferenceSession, NodeArg


def from_dlpack(x: Any) -> Any:
    """A DLPack producer (a torch or cupy tensor on the CPU, a numpy array) as a numpy array
    over the same memory, for use as an input; outputs are numpy arrays, which are DLPack
    producers themselves (``torch.from_dlpack(output)``)."""
    import numpy as np

    return np.from_dlpack(x)


def ask(question: str, data: list[str] | tuple[str, ...] = (), *, server: str | None = None,
        token: str | None = None, **options: Any) -> Ask:
    """Asks the model xpud is configured with (``[assistant]``) for a MiniLang program over
    ``data`` (files under the daemon's data roots), checked and dry-run there, every attempt
    stored: ``xpu.ask("total fare per class", ["titanic.csv"], run=True).program``. The
    daemon is ``server`` or ``$XPU_SERVER``; ``options`` are :meth:`Client.ask`'s."""
    url = server or os.environ.get("XPU_SERVER")
    if not url:
        raise ApiError("xpu.ask needs a daemon: pass server=URL or set XPU_SERVER (docs/ask.md)", 0, "no_server")
    return Client(url, token=token).ask(question, data, **options)


def inventory() -> dict[str, Any]:
    """This machine's engines as xpu sees them: each engine, whether it is available (and
    why not), its kernels, devices and facts (the BLAS core, ONNX Runtime's providers)."""
    from . import _engines

    result: dict[str, Any] = json.loads(_engines.native().inventory())
    return result


def __getattr__(name: str) -> Any:
    # The version comes from the native module, loaded only when asked for.
    if name == "__version__":
        from . import _engines

        return str(_engines.native().__version__)
    raise AttributeError(f"module 'xpu' has no attribute {name!r}")


__all__ = [
    "__version__",
    "ApiError",
    "Ask",
    "ask",
    "Client",
    "Run",
    "EngineUnavailable",
    "ExecutionPolicy",
    "from_dlpack",
    "InferenceSession",
    "InputError",
    "KernelPolicy",
    "NodeArg",
    "PlanError",
    "Policy",
    "PolicyTestReport",
    "PolicyTestResult",
    "PolicyError",
    "ProgramError",
    "RunError",
    "SessionClosed",
    "XpuError",
    "inventory",
    "minilang",
]
