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
from typing import Iterator

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
