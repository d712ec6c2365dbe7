"""Policies from Python: load, check and resolve them as ``xpuctl policy`` does, and the
keyword arguments of :class:`xpu.InferenceSession` (``device``, ``engine``,
``kernel_policy``, ``exec_policy``, ``fp16`` …) mapped onto the same policy model."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from . import _engines
from .errors import PolicyError

PathLike = str | os.PathLike[str]


class Policy:
    """A loaded, merged and structurally checked policy (immutable).

    Build one with :meth:`load` (a TOML file and its ``extends`` parents),
    :meth:`from_toml` (text) or :meth:`default`; errors raise :class:`xpu.PolicyError`
    with each diagnostic's file, line and column."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    @staticmethod
    def load(path: PathLike) -> "Policy":
        """Loads a policy file (``extends`` parents resolved next to it)."""
        return Policy(_engines.native().Policy.load(os.fspath(path)))

    @staticmethod
    def from_toml(text: str, name: str = "<string>", base_dir: PathLike | None = None) -> "Policy":
        """A policy from TOML text; ``name`` stands for the file in diagnostics and
        relative ``extends`` resolve against ``base_dir``."""
        return Policy(_engines.native().Policy.from_toml(text, name, None if base_dir is None else os.fspath(base_dir)))

    @staticmethod
    def default() -> "Policy":
        """The built-in default policy: every engine of this machine, in its order."""
        return Policy(_engines.native().Policy.default())

    @property
    def name(self) -> str:
        return str(self._native.name)

    @property
    def sha256(self) -> str:
        """SHA-256 of the effective policy (what explanations and the store record)."""
        return str(self._native.sha256)

    @property
    def files(self) -> list[str]:
        """The policy file and its ``extends`` parents, child first."""
        return list(self._native.files)

    def to_dict(self) -> dict[str, Any]:
        """The effective policy: every key after merging its layers."""
        result: dict[str, Any] = json.loads(self._native.to_json())
        return result

    def check(self, inventory: PathLike | None = None) -> list[dict[str, Any]]:
        """Checks the policy against an inventory file (``None``: this machine's engines).
        Raises :class:`xpu.PolicyError` on errors; returns the warnings."""
        return list(self._native.check(None if inventory is None else os.fspath(inventory)))

    def resolve(
        self, model: PathLike, inventory: PathLike | None = None, bind: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """The plan a run of ``model`` would make: the explanation as data (every node's
        engine, kernel, precision, the rule that chose it and the rejected candidates with
        reason codes). Raises :class:`xpu.EngineUnavailable` or :class:`xpu.PlanError`."""
        text = self._native.resolve(
            os.fspath(model), None if inventory is None else os.fspath(inventory), dict(bind or {})
        )
        result: dict[str, Any] = json.loads(text)
        return result

    def test(self) -> "PolicyTestReport":
        """Runs the policy's ``[[test]]`` blocks as ``xpuctl policy test`` does: each test's
        program planned on its inventory and its expectations checked (placements, no
        fallback, transfers, peak memory, an expected failure code). Programs and
        inventories are relative to the policy file (to the working directory for a policy
        from text without ``base_dir``). Nothing runs; a failing test does not raise:
        ``report.ok`` says whether all passed."""
        return PolicyTestReport(
            [PolicyTestResult(name, file, tuple(failures)) for file, name, failures in self._native.test()]
        )

    def layered(self, toml_text: str, name: str = "<keyword arguments>") -> "Policy":
        """``toml_text`` over this policy, merged as ``extends`` would; a key set to two
        different values raises :class:`xpu.PolicyError` naming it."""
        return Policy(self._native.layered(toml_text, name))

    def __repr__(self) -> str:
        return str(self._native.__repr__())


@dataclass(frozen=True)
class PolicyTestResult:
    """One ``[[test]]`` block's result: what did not hold (``failures``; empty: passed)."""

    name: str
    file: str
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        head = f"{'PASS' if self.ok else 'FAIL'} {self.file} {self.name}"
        return "\n    ".join([head, *self.failures])


@dataclass(frozen=True)
class PolicyTestReport:
    """The results of :meth:`Policy.test`, in the policy's order; prints as
    ``xpuctl policy test`` does."""

    results: list[PolicyTestResult]

    @property
    def passed(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        return len(self.results) - self.passed

    @property
    def ok(self) -> bool:
        """No test failed (as ``xpuctl policy test``'s exit status: a policy without tests
        passes, and prints that it has none)."""
        return self.failed == 0

    def __iter__(self) -> Iterator[PolicyTestResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __str__(self) -> str:
        lines = [str(r) for r in self.results] or ["no [[test]] blocks found"]
        return "\n".join([*lines, f"{self.passed} passed, {self.failed} failed"])

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


@dataclass(frozen=True)
class KernelPolicy:
    """Kernels pinned per op class or op name: ``KernelPolicy(matmul="cublasLt",
    attention="flash_v2")``. A short name resolves to the known kernel it names
    (``cublasLt`` → ``cuda.cublaslt``); a list is a preference order."""

    kernels: Mapping[str, str | list[str]] = field(default_factory=dict)

    def __init__(self, **kernels: str | list[str]) -> None:
        object.__setattr__(self, "kernels", dict(kernels))


@dataclass(frozen=True)
class ExecutionPolicy:
    """How a session executes: ``precision`` (fp32, fp16, bf16, tf32, int8) the float nodes
    run at, ``static_shape`` (the first run's shapes are the only ones accepted),
    ``threads`` per engine, ``capture`` ("eager" or "graph"), ``determinism``
    ("off", "tolerance", "bitwise"), ``timeout`` ("30s", "500ms") and ``performance``
    ("latency": OpenVINO's latency hint, and ONNX Runtime's threads spin between runs as
    onnxruntime's own Python default does; "throughput")."""

    precision: str | None = None
    static_shape: bool = False
    threads: int | None = None
    capture: str | None = None
    determinism: str | None = None
    timeout: str | None = None
    performance: str | None = None


# Engine names as people say them → (xpu engine, kernel it implies, or None).
_ENGINE_ALIASES: dict[str, tuple[str, str | None]] = {
    "tensorrt": ("ort", "ort.tensorrt"),
    "trt": ("ort", "ort.tensorrt"),
    "onnxruntime": ("ort", None),
    "ort": ("ort", None),
    "openvino": ("openvino", None),
    "cuda": ("cuda", None),
    "cpu": ("cpu", None),
    "llvm": ("llvm", None),
}

# What an engine runs a device on: (engine, device kind) → kernel.
_DEVICE_KERNELS: dict[tuple[str, str], str] = {
    ("ort", "cuda"): "ort.cuda",
    ("ort", "cpu"): "ort.cpu",
    ("openvino", "cpu"): "openvino.cpu",
    ("openvino", "gpu"): "openvino.gpu",
    ("openvino", "npu"): "openvino.npu",
}


def resolve_kernel(name: str) -> str:
    """``cublasLt`` → ``cuda.cublaslt``; a full name (``cpu.gemm``) is kept. Unknown names
    raise :class:`xpu.PolicyError` listing the known kernels."""
    known: list[str] = [str(k) for k in _engines.native().kernels()]
    if "." in name:
        if name in known:
            return name
    else:
        matches = [k for k in known if k.split(".", 1)[1] == name.lower()]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise PolicyError(f"kernel `{name}` is ambiguous: {', '.join(matches)}; give the full name")
    raise PolicyError(f"no kernel named `{name}`; known kernels: {', '.join(known)}")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def session_layer(
    device: str | None = None,
    engine: str | None = None,
    kernel_policy: KernelPolicy | None = None,
    exec_policy: ExecutionPolicy | None = None,
    fp16: bool = False,
    bf16: bool = False,
    fallback: bool | None = None,
) -> str:
    """The TOML layer :class:`xpu.InferenceSession`'s keyword arguments stand for."""
    sections: dict[str, dict[str, Any]] = {}
    rules: list[dict[str, Any]] = []
    kind, index = _device(device)
    xpu_engine, implied = (None, None)
    if engine is not None:
        if engine.lower() not in _ENGINE_ALIASES:
            raise PolicyError(f"engine `{engine}` is not one xpu knows: {', '.join(sorted(_ENGINE_ALIASES))}")
        xpu_engine, implied = _ENGINE_ALIASES[engine.lower()]
    elif kind == "cuda":
        xpu_engine = "cuda"
    elif kind in ("gpu", "npu"):
        # OpenVINO is the engine with GPU and NPU plugins.
        xpu_engine = "openvino"
    if xpu_engine is not None:
        engines: dict[str, Any] = {"order": [xpu_engine]}
        if fallback:
            engines = {"order": [xpu_engine] + [e for e in ("cuda", "ort", "openvino", "llvm", "cpu") if e != xpu_engine],
                       "fallback": "allow"}
        elif fallback is False:
            engines["fallback"] = "deny"
        sections["engines"] = engines
        kernel = implied or (_DEVICE_KERNELS.get((xpu_engine, kind)) if kind else None)
        if kind is not None and kernel is None and not (xpu_engine == "cuda" and kind == "cuda") and not (
            xpu_engine in ("cpu", "llvm") and kind == "cpu"
        ):
            raise PolicyError(f"engine `{engine or xpu_engine}` has no kernel for device `{device}`")
        if implied is not None and kind is not None and kind != "cuda":
            raise PolicyError(f"engine `{engine}` runs on cuda devices, not `{device}`")
        # A rule pins every node to the kernel; with fallback allowed the engine order alone
        # says where to go first (a rule would leave no other candidate).
        if kernel is not None and not fallback:
            rules.append({"name": f"device {device or kernel} (keyword arguments)", "engine": xpu_engine, "kernel": kernel})
    elif kind == "cpu":
        sections["engines"] = {"deny": ["cuda"]}
    if fallback is not None and "engines" not in sections:
        sections["engines"] = {"fallback": "allow" if fallback else "deny"}
    elif fallback is not None and "fallback" not in sections["engines"]:
        sections["engines"]["fallback"] = "allow" if fallback else "deny"
    if index not in (None, 0):
        raise PolicyError(f"device `{device}`: xpu places work on device 0 of a kind; pin other devices in the inventory")
    if kernel_policy is not None and kernel_policy.kernels:
        pinned = {
            key: [resolve_kernel(k) for k in value] if isinstance(value, list) else resolve_kernel(value)
            for key, value in kernel_policy.kernels.items()
        }
        sections["kernels"] = pinned
        # A pinned kernel's engine joins the order after the chosen engine: `engine=` says
        # where the rest runs, the pins where their ops run.
        if "engines" in sections and "order" in sections["engines"]:
            order = sections["engines"]["order"]
            for value in pinned.values():
                for k in value if isinstance(value, list) else [value]:
                    owner = k.split(".", 1)[0]
                    if owner not in order:
                        order.insert(1, owner) if fallback else order.append(owner)
    if fp16 and bf16:
        raise PolicyError("fp16=True and bf16=True: choose one precision")
    precision = "fp16" if fp16 else "bf16" if bf16 else None
    if exec_policy is not None and exec_policy.precision is not None:
        if precision is not None and precision != exec_policy.precision:
            raise PolicyError(f"precision: fp16/bf16 say {precision}, exec_policy says {exec_policy.precision}")
        precision = exec_policy.precision
    if precision is not None:
        sections["precision"] = {"default": precision}
    if exec_policy is not None:
        execution = {
            k: v
            for k, v in (
                ("threads", exec_policy.threads),
                ("capture", exec_policy.capture),
                ("determinism", exec_policy.determinism),
                ("timeout", exec_policy.timeout),
                ("performance", exec_policy.performance),
            )
            if v is not None
        }
        if execution:
            sections["execution"] = execution
    lines: list[str] = []
    for section, keys in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in keys.items())
        lines.append("")
    for rule in rules:
        lines.append("[[rule]]")
        lines.append(f"name = {_toml(rule['name'])}")
        lines.append("when = {}")
        lines.append(f"engine = {_toml(rule['engine'])}")
        lines.append(f"kernel = {_toml(rule['kernel'])}")
        lines.append("")
    return "\n".join(lines)


def _device(device: str | None) -> tuple[str | None, int | None]:
    if device is None:
        return None, None
    kind, _, index = device.lower().partition(":")
    if kind not in ("cpu", "cuda", "gpu", "npu"):
        raise PolicyError(f"device `{device}`: expected cpu, cuda[:N], gpu or npu")
    if index and not index.isdigit():
        raise PolicyError(f"device `{device}`: the index after `:` must be a number")
    return kind, int(index) if index else None
