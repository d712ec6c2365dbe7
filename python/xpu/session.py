"""``xpu.InferenceSession``: a model planned once under a policy and run many times, with
the ONNX Runtime shape of the API (``get_inputs``, ``get_outputs``, ``run``) so serving
code can switch with one import, and xpu's explanation of every decision."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, overload

from typing import TYPE_CHECKING

from . import _engines
from .errors import InputError, PolicyError
from .policy import ExecutionPolicy, KernelPolicy, Policy, session_layer

PathLike = str | os.PathLike[str]

_ORT_TYPES = {
    "f32": "tensor(float)",
    "f64": "tensor(double)",
    "f16": "tensor(float16)",
    "bf16": "tensor(bfloat16)",
    "i8": "tensor(int8)",
    "i16": "tensor(int16)",
    "i32": "tensor(int32)",
    "i64": "tensor(int64)",
    "u8": "tensor(uint8)",
    "u16": "tensor(uint16)",
    "u32": "tensor(uint32)",
    "u64": "tensor(uint64)",
    "bool": "tensor(bool)",
    "string": "tensor(string)",
}


if TYPE_CHECKING:
    import numpy as np

# xpu's dtype names → numpy's (for lists and scalars given as inputs).
_NUMPY_TYPES = {
    "f32": "float32", "f64": "float64", "f16": "float16", "i8": "int8", "i16": "int16",
    "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
    "u64": "uint64", "bool": "bool",
}


@dataclass(frozen=True)
class NodeArg:
    """An input or output of a session, as ONNX Runtime describes it: ``name``, ``shape``
    (ints, strings for symbolic dims, ``None`` for unknown ones) and ``type``
    (``tensor(float)``); ``dtype`` is xpu's name (``f32``)."""

    name: str
    shape: list[int | str | None]
    type: str
    dtype: str


class InferenceSession:
    """A model planned and prepared once under a policy; ``run`` reuses both.

    >>> sess = xpu.InferenceSession("mlp.onnx", engine="ort")        # doctest: +SKIP
    >>> out = sess.run({"x": x})                                      # doctest: +SKIP

    Keyword arguments map onto xpu's policy model and layer over ``policy`` (a TOML file,
    an :class:`xpu.Policy`, or the built-in default) as ``extends`` would; a key both set
    differently raises :class:`xpu.PolicyError` naming it.

    - ``device``: ``"cpu"``, ``"cuda"``/``"cuda:0"``, ``"gpu"`` or ``"npu"``.
    - ``engine`` (or ``backend``): ``cpu``, ``ort``/``onnxruntime``, ``tensorrt`` (ONNX
      Runtime's TensorRT provider, ``ort.tensorrt``), ``openvino``, ``cuda``, ``llvm``.
    - ``kernel_policy``: :class:`xpu.KernelPolicy`; ``exec_policy``:
      :class:`xpu.ExecutionPolicy`; ``fp16``/``bf16``: the precision float nodes run at.
    - ``fallback``: ``True`` lets nodes the chosen engine cannot run go to other engines
      (and the explanation says so); ``False`` forbids it; ``None`` keeps the policy's.
    - ``borrow_inputs``: read writable numpy inputs in place too (the caller promises not to
      change an array while a run reads it). Read-only, C-contiguous, aligned arrays of a
      numeric dtype are always read in place; other inputs are copied once, and
      ``explain()``'s run facts (``input.copied``) say which and why.

    A policy that needs what this machine lacks raises :class:`xpu.EngineUnavailable`
    naming the engine, device and reason, at construction.
    """

    def __init__(
        self,
        model: PathLike | bytes,
        *,
        policy: PathLike | Policy | None = None,
        device: str | None = None,
        engine: str | None = None,
        backend: str | None = None,
        kernel_policy: KernelPolicy | None = None,
        exec_policy: ExecutionPolicy | None = None,
        fp16: bool = False,
        bf16: bool = False,
        fallback: bool | None = None,
        borrow_inputs: bool = False,
    ) -> None:
        if engine is not None and backend is not None and engine != backend:
            raise PolicyError(f"engine={engine!r} and backend={backend!r} name different engines")
        base = policy if isinstance(policy, Policy) else Policy.load(policy) if policy is not None else Policy.default()
        layer = session_layer(device, engine or backend, kernel_policy, exec_policy, fp16, bf16, fallback)
        self._policy = base.layered(layer) if layer.strip() else base
        self._static = exec_policy.static_shape if exec_policy is not None else False
        self._shapes: dict[str, tuple[int, ...]] | None = None
        program = model if isinstance(model, bytes) else os.fspath(model)
        self._native = _engines.native().Session(program, self._policy._native, borrow_inputs)
        self._inputs = [NodeArg(n, list(s), _ORT_TYPES.get(d, d), d) for n, s, d in self._native.inputs()]
        self._outputs = [NodeArg(n, list(s), _ORT_TYPES.get(d, d), d) for n, s, d in self._native.outputs()]
        self._output_names = [o.name for o in self._outputs]
        import numpy as np

        self._ndarray = np.ndarray

    @property
    def policy(self) -> Policy:
        """The effective policy the session plans under."""
        return self._policy

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs in order."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs in order."""
        return list(self._outputs)

    @overload
    def run(self, output_names: Mapping[str, Any], input_feed: None = None) -> dict[str, np.ndarray]: ...

    @overload
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any]) -> list[np.ndarray]: ...

    def run(self, output_names: Any = None, input_feed: Any = None, run_options: Any = None) -> Any:
        """``run(feed)`` returns ``{output name: array}``; ``run(output_names, feed)`` (ONNX
        Runtime's form; ``None`` for every output) returns a list in ``output_names`` order.
        ``run_options`` (ONNX Runtime's ``RunOptions``) is accepted so such calls work
        unchanged; its settings (log level, tags) do not apply to xpu's engines. The GIL is
        released while the engines run; one session serves many threads."""
        # The common call, `run({name: ndarray})`, takes the shortest path: its feed goes to
        # the native run as it is (a per-call cost users of small models feel).
        feed: Any
        if input_feed is None and isinstance(output_names, Mapping):
            feed, wanted, as_dict = output_names, None, True
        else:
            feed, wanted, as_dict = input_feed, output_names, False
        if type(feed) is not dict:
            if not isinstance(feed, Mapping):
                raise InputError("the input feed must be a mapping of input name to array")
            feed = dict(feed)
        if self._static:
            self._check_static(feed)
        ndarray = self._ndarray
        for v in feed.values():
            if type(v) is not ndarray:
                feed = {k: v if type(v) is ndarray else self._as_array(k, v) for k, v in feed.items()}
                break
        values = self._native.run(feed)
        if as_dict:
            return dict(zip(self._output_names, values))
        if wanted is None:
            return list(values)
        by_name = dict(zip(self._output_names, values))
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise InputError(
                f"no output named {', '.join(map(repr, missing))}; the outputs are {', '.join(self._output_names)}"
            )
        return [by_name[n] for n in wanted]

    def _as_array(self, name: Any, value: Any) -> Any:
        """Lists and scalars become arrays of the input's own dtype (as ONNX Runtime's
        Python API would need them spelled); arrays pass as they are."""
        import numpy as np

        if isinstance(value, np.ndarray) or not isinstance(name, str):
            return value
        if hasattr(value, "__dlpack__"):
            # A DLPack producer (torch, cupy, jax …): viewed through numpy without a copy
            # when it lives in host memory.
            try:
                return np.from_dlpack(value)
            except (BufferError, RuntimeError, TypeError, ValueError) as e:
                raise InputError(
                    f"input `{name}` cannot be read through DLPack: {e} (xpu takes host memory: move it to the CPU first)",
                    input=name,
                ) from None
        arg = next((i for i in self._inputs if i.name == name), None)
        dtype = _NUMPY_TYPES.get(arg.dtype) if arg is not None else None
        try:
            array = self._converted(value)
            if dtype is None or array.dtype == dtype:
                return array
            # Lists and scalars of Python numbers take the input's dtype: any number for a
            # float input, integers that keep their values for an integer input. Anything
            # else (an array-like with a dtype of its own included) stays as it is and is
            # refused by its dtype, as a numpy array of another dtype is.
            if array.dtype.kind in "biuf" and not hasattr(value, "dtype"):
                target = np.dtype(dtype)
                if target.kind == "f":
                    return self._frozen(array.astype(target))
                if target.kind in "iu" and array.dtype.kind in "biu":
                    converted = array.astype(target)
                    if np.array_equal(converted, array):
                        return self._frozen(converted)
            return array
        except (TypeError, ValueError, OverflowError) as e:
            raise InputError(f"input `{name}` cannot be read as an array of {arg.dtype if arg else '?'}: {e}", input=name) from None

    @staticmethod
    def _converted(value: Any) -> Any:
        """``numpy.asarray(value)``; an array numpy made from Python numbers is no one
        else's, so it is marked read-only and read in place."""
        import numpy as np

        array = np.asarray(value)
        return InferenceSession._frozen(array) if array.flags.owndata and not hasattr(value, "__array__") else array

    @staticmethod
    def _frozen(array: Any) -> Any:
        array.flags.writeable = False
        return array

    def _check_static(self, feed: Mapping[str, Any]) -> None:
        import numpy as np

        shapes = {name: tuple(np.shape(value)) for name, value in feed.items()}
        if self._shapes is None:
            self._shapes = shapes
        elif shapes != self._shapes:
            changed = [n for n in shapes if shapes[n] != self._shapes.get(n)]
            name = changed[0] if changed else next(iter(shapes), "")
            raise InputError(
                f"input `{name}` has shape {shapes.get(name)}; static_shape=True fixed it at "
                f"{self._shapes.get(name)} on the first run",
                input=name,
            )

    def explain(self) -> dict[str, Any]:
        """The structured explanation (as ``xpuctl explain --format json``): every node's
        engine, kernel, device and precision, the policy rule that chose it and the rejected
        candidates with reason codes; after a run, that run's timings, transfers and engine
        facts too."""
        result: dict[str, Any] = json.loads(self._native.explain())
        return result

    @property
    def last_run(self) -> dict[str, Any] | None:
        """The last run's per-node timings, transfers, engine facts and prepared/reused
        partitions; ``None`` before the first run."""
        if not self._native.has_run():
            return None
        ex = self.explain()
        return {k: ex.get(k, []) for k in ("timings", "transfers_done", "facts", "prepared")}

    def close(self) -> None:
        """Releases the prepared engines; later calls raise :class:`xpu.SessionClosed`."""
        self._native.close()

    def __enter__(self) -> "InferenceSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
