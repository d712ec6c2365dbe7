"""ONNX's backend API (``onnx.backend.base.Backend``) over xpu sessions, so ONNX's own
backend test suite — and any harness written against it — runs through xpu.

The engine and policy every ``prepare`` uses come from module-level settings::

    import xpu.onnx_backend as backend
    backend.engine = "ort"          # or None (the policy's order), "cpu", "llvm", "openvino"
    backend.policy = None           # or a path / xpu.Policy
    rep = backend.prepare(model)    # an onnx.ModelProto, its bytes, or a path
    outputs = rep.run([x])          # one array per graph output, in order
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from .policy import Policy
from .session import InferenceSession

try:  # onnx is optional: the backend API is its interface, the session works without it.
    from onnx.backend.base import Backend as _Backend
    from onnx.backend.base import BackendRep as _BackendRep
except ImportError:  # pragma: no cover - exercised only without onnx installed
    _Backend = object  # type: ignore[assignment,misc]
    _BackendRep = object  # type: ignore[assignment,misc]

#: The engine sessions prefer (``None``: the policy's order). Engines it cannot run a node
#: on leave that node to the others (fallback allowed), as a mixed plan would.
engine: str | None = None
#: The policy sessions plan under (a path or an :class:`xpu.Policy`; ``None``: built-in).
policy: str | os.PathLike[str] | Policy | None = None


class XpuRep(_BackendRep):
    """A prepared model: ``run(inputs)`` takes arrays in graph-input order (or a dict by
    name) and returns a tuple of outputs in graph-output order."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self._names = [i.name for i in session.get_inputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            feed = dict(zip(self._names, items))
        return tuple(self.session.run(None, feed))


class XpuBackend(_Backend):
    """xpu as an ONNX backend (CPU devices: xpu's host engines). Subclasses may override
    :meth:`route` to fix an engine and policy of their own."""

    @classmethod
    def route(cls) -> tuple[str | None, str | os.PathLike[str] | Policy | None]:
        """The engine and policy ``prepare`` uses: the module-level settings."""
        return engine, policy

    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> XpuRep:
        source: bytes | str | os.PathLike[str]
        if isinstance(model, (bytes, bytearray)):
            source = bytes(model)
        elif isinstance(model, (str, os.PathLike)):
            source = model
        else:
            source = model.SerializeToString()
        chosen, pol = cls.route()
        session = InferenceSession(source, policy=pol, engine=chosen, fallback=True if chosen else None)
        return XpuRep(session)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Sequence[Any], device: str = "CPU", outputs_info: Any = None, **kwargs: Any) -> tuple[Any, ...]:
        """One node as a model of its own (inputs typed from the arrays given)."""
        import numpy as np
        from onnx import helper

        # Optional inputs left out are named "": they take no array.
        names = [name for name in node.input if name]
        arrays = [np.asarray(x) for x in inputs]
        graph_inputs = [
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in zip(names, arrays)
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        model = helper.make_model(graph)
        return cls.run_model(model, arrays, device)


prepare = XpuBackend.prepare
run_model = XpuBackend.run_model
run_node = XpuBackend.run_node
supports_device = XpuBackend.supports_device
is_compatible = XpuBackend.is_compatible
