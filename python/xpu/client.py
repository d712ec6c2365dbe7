"""The xpud client: submit jobs, wait for them, fetch outputs as numpy arrays or
DataFrames, explain, search, list and cancel runs, ask the daemon's model for MiniLang
programs (docs/ask.md) — over the REST API (docs/daemon.md),
with the standard library's HTTP client. Request and response fields are the OpenAPI
document's (`schemas/openapi.json`); python/tests checks them against it."""

from __future__ import annotations

import base64
import io
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import XpuError
from .policy import Policy

# Fields the client writes and reads, by OpenAPI schema: the test holds them to the document.
SENT: dict[str, tuple[str, ...]] = {
    "SubmitJob": ("program", "inputs", "policy", "policy_toml", "labels", "wait"),
    "ProgramSpec": ("name", "source", "source_base64", "path"),
    "InputSpec": ("npy_base64", "csv_base64"),
    "AskRequest": ("question", "data", "policy", "run", "allow_writes", "max_attempts", "labels"),
}
READ: dict[str, tuple[str, ...]] = {
    "RunDto": ("run_id", "status", "policy", "program", "outputs", "error", "run_us", "queue_us", "labels"),
    "OutputDto": ("name", "dtype", "shape", "url"),
    "ErrorBody": ("code", "message", "details"),
    "SearchHitDto": ("kind", "run_id", "score", "snippet"),
    "AskDto": ("ask_id", "status", "question", "program", "error", "attempts", "examples", "tokens",
               "elapsed_ms", "run", "model", "accepted"),
    "AskRunDto": ("run_id", "status", "refused"),
    "AcceptedDto": ("ask_id", "newly"),
    "RunList": ("runs", "next_cursor"),
}


class ApiError(XpuError):
    """An error the server answered with: ``status`` (HTTP), ``code`` (the API's stable
    code: ``invalid_program``, ``not_found``, ``queue_full`` …), ``message`` and
    ``details``; ``code`` is ``unreachable`` when the server could not be reached."""

    status: int
    code: str
    details: Any

    def __init__(self, message: str, status: int = 0, code: str = "", details: Any = None, **attrs: Any) -> None:
        super().__init__(message, **attrs)
        self.status, self.code, self.details = status, code, details


@dataclass
class Run:
    """A run as the server reports it; ``outputs`` are fetched on first access."""

    client: "Client" = field(repr=False)
    run_id: str
    status: str
    policy: str
    program: str
    error: str | None
    run_us: int | None
    queue_us: int | None
    labels: dict[str, str]
    output_specs: list[dict[str, Any]] = field(repr=False)
    _outputs: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def outputs(self) -> dict[str, Any]:
        """Output name → numpy array (tensors) or DataFrame/dict of columns (tables)."""
        if self._outputs is None:
            self._outputs = {o["name"]: self.client._output(self.run_id, o) for o in self.output_specs}
        return self._outputs

    def explain(self) -> dict[str, Any]:
        return self.client.explain(self.run_id)


@dataclass
class Ask:
    """An ask as the server reports it: ``status`` is ``running`` or how it ended
    (``accepted``, ``out_of_attempts``, ``out_of_tokens``, ``out_of_time``,
    ``endpoint_failed``, ``failed``: ended before the model answered, see ``error``);
    ``program`` is the MiniLang program that passed the check and the
    dry run; ``attempts`` every reply with its findings; ``run`` the run it started."""

    client: "Client" = field(repr=False)
    ask_id: str
    status: str
    question: str
    program: str | None
    error: str | None
    attempts: list[dict[str, Any]] = field(repr=False)
    examples: list[str]
    tokens: int
    elapsed_ms: int
    model: str
    accepted: bool
    run: Run | None
    refused: str | None

    def accept(self) -> bool:
        """Makes this ask an example for the server's later prompts; False when it was."""
        return self.client.accept(self.ask_id)


class Client:
    """A connection to xpud: ``Client("http://127.0.0.1:8080", token=None)`` (the token
    also from ``$XPU_TOKEN``)."""

    def __init__(self, server: str, token: str | None = None, timeout: float = 60.0) -> None:
        self.server = server.rstrip("/")
        self.token = token if token is not None else os.environ.get("XPU_TOKEN")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None) -> tuple[bytes, str]:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = json.loads(raw)
                raise ApiError(f"{e.code} {err.get('code')}: {err.get('message')}", e.code, err.get("code", ""), err.get("details")) from None
            except (ValueError, AttributeError):
                raise ApiError(f"{e.code}: {raw[:200]!r}", e.code, "http_error") from None
        except TimeoutError:
            # The request may have been taken (a submitted job keeps running): not retried.
            raise ApiError(f"{self.server} did not answer within {self.timeout} s", 0, "timeout") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, TimeoutError):
                raise ApiError(f"{self.server} did not answer within {self.timeout} s", 0, "timeout") from None
            raise ApiError(f"cannot reach {self.server}: {reason}", 0, "unreachable") from None

    def _json(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None) -> Any:
        raw, _ = self._request(method, path, body, query)
        return json.loads(raw)

    def _run(self, dto: Mapping[str, Any]) -> Run:
        return Run(self, dto["run_id"], dto["status"], dto.get("policy", ""), dto.get("program", ""),
                   dto.get("error"), dto.get("run_us"), dto.get("queue_us"), dict(dto.get("labels") or {}),
                   list(dto.get("outputs") or []))

    def submit(
        self,
        program: str | os.PathLike[str] | bytes,
        inputs: Mapping[str, Any] | None = None,
        policy: str | Policy | None = None,
        labels: Mapping[str, str] | None = None,
        wait: bool = True,
        name: str | None = None,
    ) -> Run:
        """Submits a job. ``program``: a file's path (its text or bytes are sent), MiniLang
        source text (``name`` defaults to ``job.ml``) or an ONNX model's bytes. ``inputs``:
        arrays (sent as ``.npy``) or DataFrames (sent as CSV). ``policy``: a policy name on
        the server, or an :class:`xpu.Policy` (its effective TOML is not sent: give a name
        or a TOML string starting with ``[``). ``wait``: until it finishes."""
        spec: dict[str, Any] = {}
        if isinstance(program, bytes):
            spec = {"name": name or "model.onnx", "source_base64": base64.b64encode(program).decode()}
        elif isinstance(program, os.PathLike) or (isinstance(program, str) and _looks_like_path(program)):
            path = os.fspath(program)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path}: no such program file")
            with open(path, "rb") as f:
                raw = f.read()
            spec = {"name": name or os.path.basename(path)}
            if path.lower().endswith(".onnx"):
                spec["source_base64"] = base64.b64encode(raw).decode()
            else:
                spec["source"] = raw.decode()
        else:
            spec = {"name": name or "job.ml", "source": str(program)}
        body: dict[str, Any] = {"program": spec, "wait": wait}
        if inputs:
            body["inputs"] = {k: _input_spec(v) for k, v in inputs.items()}
        if isinstance(policy, str) and ("\n" in policy or "=" in policy or policy.lstrip().startswith("[")):
            body["policy_toml"] = policy
        elif isinstance(policy, str):
            body["policy"] = policy
        elif isinstance(policy, Policy):
            body["policy"] = policy.name
        if labels:
            body["labels"] = dict(labels)
        return self._run(self._json("POST", "/v1/jobs", body))

    def run(self, run_id: str) -> Run:
        return self._run(self._json("GET", f"/v1/runs/{_quote(run_id)}"))

    def explain(self, run_id: str) -> dict[str, Any]:
        """The run's stored explanation (the same JSON as ``xpuctl explain --format json``)."""
        result: dict[str, Any] = self._json("GET", f"/v1/runs/{_quote(run_id)}/explain")
        return result

    def search(self, query: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Full-text search over stored runs: hits with ``run_id``, ``score``, ``snippet``."""
        hits: list[dict[str, Any]] = self._json("GET", "/v1/search", query={"q": query, "limit": limit})
        return hits

    def runs(self, status: str | None = None, policy: str | None = None, label: str | None = None,
             limit: int | None = None, cursor: str | None = None) -> list[Run]:
        """Stored runs, newest first (one page)."""
        page = self._json("GET", "/v1/runs", query={"status": status, "policy": policy, "label": label, "limit": limit, "cursor": cursor})
        return [self._run(r) for r in page["runs"]]

    def ask(
        self,
        question: str,
        data: list[str] | tuple[str, ...] = (),
        policy: str | None = None,
        run: bool = False,
        allow_writes: bool = False,
        max_attempts: int | None = None,
        labels: Mapping[str, str] | None = None,
        wait: bool = True,
        wait_timeout: float = 3600.0,
    ) -> Ask:
        """Asks the model the server's ``[assistant]`` names for a MiniLang program over
        ``data`` (files under the server's data roots). The server checks and dry-runs every
        program on a sample and feeds the problems back; with ``run`` the accepted program
        runs as a job (one that writes files only with ``allow_writes``). ``wait``: until
        the ask ends (polled; at most ``wait_timeout`` seconds)."""
        body: dict[str, Any] = {"question": question, "data": list(data), "run": run, "allow_writes": allow_writes}
        if policy is not None:
            body["policy"] = policy
        if max_attempts is not None:
            body["max_attempts"] = max_attempts
        if labels:
            body["labels"] = dict(labels)
        deadline = time.monotonic() + wait_timeout
        while True:
            try:
                dto = self._json("POST", "/v1/asks", body)
                break
            except ApiError as e:
                # The daemon's asks are all busy (limits.asks_at_once): wait and ask again.
                if e.status != 429 or time.monotonic() + 5 > deadline:
                    raise
                time.sleep(5)
        while wait and dto["status"] == "running":
            if time.monotonic() > deadline:
                raise ApiError(f"ask {dto['ask_id']} still running after {wait_timeout} s", 0, "timeout")
            time.sleep(0.25)
            dto = self._json("GET", f"/v1/asks/{_quote(dto['ask_id'])}")
        ask = self._ask(dto)
        # The run it started may outlast the daemon's own wait: waited for here too.
        while wait and ask.run is not None and ask.run.status in ("queued", "running"):
            if time.monotonic() > deadline:
                raise ApiError(f"run {ask.run.run_id} still running after {wait_timeout} s", 0, "timeout")
            time.sleep(0.25)
            ask.run = self.run(ask.run.run_id)
        return ask

    def get_ask(self, ask_id: str) -> Ask:
        return self._ask(self._json("GET", f"/v1/asks/{_quote(ask_id)}"))

    def accept(self, ask_or_run_id: str) -> bool:
        """Makes a stored ask (or the ask that started a run) an example for later prompts;
        False when it was one already."""
        return bool(self._json("POST", f"/v1/asks/{_quote(ask_or_run_id)}/accept", {})["newly"])

    def ask_stats(self, since_us: int | None = None) -> list[dict[str, Any]]:
        """Per model and day: first replies that parsed, checked and ran, answers after
        feedback, attempts and tokens per answer."""
        rows: list[dict[str, Any]] = self._json("GET", "/v1/asks/stats", query={"since_us": since_us})
        return rows

    def _ask(self, dto: Mapping[str, Any]) -> Ask:
        run_dto = dto.get("run") or {}
        run = self.run(run_dto["run_id"]) if run_dto.get("run_id") else None
        return Ask(self, dto["ask_id"], dto["status"], dto["question"], dto.get("program"), dto.get("error"),
                   list(dto.get("attempts") or []), list(dto.get("examples") or []), int(dto.get("tokens") or 0),
                   int(dto.get("elapsed_ms") or 0), dto.get("model", ""), bool(dto.get("accepted")), run,
                   run_dto.get("refused"))

    def cancel(self, run_id: str) -> Run:
        return self._run(self._json("POST", f"/v1/runs/{_quote(run_id)}/cancel"))

    def _output(self, run_id: str, spec: Mapping[str, Any]) -> Any:
        import numpy as np

        raw, kind = self._request("GET", f"/v1/runs/{_quote(run_id)}/outputs/{_quote(spec['name'])}")
        if spec.get("dtype") == "table" or "csv" in kind:
            try:
                import pandas as pd

                return pd.read_csv(io.BytesIO(raw))
            except ImportError:
                return raw.decode()
        return np.load(io.BytesIO(raw), allow_pickle=False)


_PROGRAM_EXTENSIONS = (".ml", ".onnx", ".sgr", ".json")


def _looks_like_path(text: str) -> bool:
    """A string that names a program file rather than holding MiniLang source."""
    return "\n" not in text and (os.path.isfile(text) or text.lower().endswith(_PROGRAM_EXTENSIONS))


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _input_spec(value: Any) -> dict[str, str]:
    import numpy as np

    if hasattr(value, "to_csv"):
        return {"csv_base64": base64.b64encode(value.to_csv(index=False).encode()).decode()}
    buf = io.BytesIO()
    np.save(buf, np.asarray(value), allow_pickle=False)
    return {"npy_base64": base64.b64encode(buf.getvalue()).decode()}
