"""xpu.Client against a real xpud (the test build's, --dev on a free port), and its fields
held to the OpenAPI document."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import xpu
from xpu import client as client_module

ROOT = Path(__file__).resolve().parents[2]


def test_the_client_fields_are_the_openapi_documents() -> None:
    schemas = json.loads((ROOT / "schemas" / "openapi.json").read_text())["components"]["schemas"]
    for table in (client_module.SENT, client_module.READ):
        for schema, fields in table.items():
            known = set(schemas[schema]["properties"])
            assert set(fields) <= known, f"{schema}: {set(fields) - known} not in the document"
    for schema in ("SubmitJob",):
        required = set(schemas[schema].get("required", []))
        assert required <= set(client_module.SENT[schema]), f"{schema} requires {required}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "xpud"
    assert binary.exists(), f"{binary}: cargo test --workspace builds it"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path_factory.mktemp("xpud")
    proc = subprocess.Popen(
        [str(binary), "--dev", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail("xpud did not become ready")
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_submit_wait_outputs_explain_search_and_list(server: str) -> None:
    c = xpu.Client(server)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    run = c.submit('let x = input("x")\nprint x * 2\n', inputs={"x": x}, labels={"team": "py"})
    assert run.status == "succeeded", run
    (value,) = run.outputs.values()
    np.testing.assert_array_equal(value, x * 2)
    explained = run.explain()
    assert explained["decisions"], explained.keys()
    assert any(r.run_id == run.run_id for r in c.runs(label="team=py"))
    assert isinstance(c.search("team"), list)
    assert c.run(run.run_id).status == "succeeded"


def test_server_errors_carry_the_api_code(server: str) -> None:
    c = xpu.Client(server)
    with pytest.raises(xpu.ApiError) as caught:
        c.submit("let = oops\n")
    assert caught.value.status in (400, 422) and caught.value.code, caught.value
    with pytest.raises(xpu.ApiError) as missing:
        c.run("01NOSUCHRUN0000000000000000")
    assert missing.value.status in (400, 404)


def test_a_server_that_is_down_is_reported_not_hung() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(xpu.ApiError) as caught:
        xpu.Client(f"http://127.0.0.1:{port}", timeout=5).run("x")
    assert caught.value.code == "unreachable" and time.monotonic() - started < 10


def test_a_missing_program_file_is_named_not_sent_as_source() -> None:
    with pytest.raises(FileNotFoundError, match="nope.ml"):
        xpu.Client("http://127.0.0.1:9").submit("nope.ml")


class _StandIn:
    """A chat-completions endpoint answering scripted replies in order (the last repeats)."""

    def __init__(self, replies: list[str]) -> None:
        import http.server
        import threading

        self.requests: list[dict[str, Any]] = []
        stand = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the standard library's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand.requests.append(body)
                content = replies[min(len(stand.requests), len(replies)) - 1]
                raw = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 50, "completion_tokens": 10}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def test_ask_through_the_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand = _StandIn([
        'print load_csv("titanic.csv") |> filter(Agee > 70)',
        'print load_csv("titanic.csv") |> filter(Age > 70) |> select(["Name"])\n',
    ])
    binary = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "xpud"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XPU_ASSISTANT__ENDPOINT=stand.url, XPU_ASSISTANT__MODEL="tiny")
    proc = subprocess.Popen([str(binary), "--dev", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/readyz", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "xpud did not become ready"
                time.sleep(0.2)
        monkeypatch.setenv("XPU_SERVER", url)
        answer = xpu.ask("passengers over 70", ["titanic.csv"], run=True)
        assert answer.status == "accepted", answer
        assert [a["failed_at"] for a in answer.attempts] == ["check", None]
        assert answer.attempts[0]["findings"][0]["code"] == "E0208"
        assert answer.run is not None and answer.run.status == "succeeded"
        (printed,) = answer.run.outputs.values()
        assert "Asplund, Mr. Lewis" in str(printed)
        assert answer.accept() is True and answer.accept() is False
        assert xpu.Client(url).get_ask(answer.ask_id).accepted
        stats = xpu.Client(url).ask_stats()
        assert stats[0]["asks"] == 1 and stats[0]["answered"] == 1.0
        assert stand.requests[1]["messages"][-1]["content"].count("E0208") >= 1
        monkeypatch.delenv("XPU_SERVER")
        with pytest.raises(xpu.ApiError, match="needs a daemon"):
            xpu.ask("q")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
