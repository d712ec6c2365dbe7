"""Policies from Python (load, check with located diagnostics, resolve against an inventory
file) and MiniLang programs run from source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import xpu

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "policies" / "examples"
INVENTORIES = ROOT / "policies" / "inventories"


def test_example_policies_load_and_check_against_their_inventory() -> None:
    policy = xpu.Policy.load(EXAMPLES / "latency-gpu.toml")
    assert policy.name == "latency-gpu"
    assert policy.files[0].endswith("latency-gpu.toml") and policy.files[1].endswith("base.toml")
    assert len(policy.sha256) == 64
    assert isinstance(policy.check(INVENTORIES / "h100.toml"), list)
    assert policy.to_dict()["kernels"]["matmul"] == "cuda.cublaslt"


def test_resolve_returns_the_plan_as_data_and_fails_as_policy_test_says(mlp: Path) -> None:
    policy = xpu.Policy.load(EXAMPLES / "latency-gpu.toml")
    mlp_sgr = ROOT / "tests" / "programs" / "mlp.sgr"
    plan = policy.resolve(mlp_sgr, inventory=INVENTORIES / "h100.toml", bind={"N": 64})
    matmuls = [d for d in plan["decisions"] if d["op"] == "matmul"]
    assert matmuls and all(d["chosen"]["kernel"] == "cuda.cublaslt" for d in matmuls)
    # The policy's own test: on a CPU box the pinned cuBLASLt matmul cannot be placed.
    with pytest.raises(xpu.PlanError) as caught:
        policy.resolve(mlp_sgr, inventory=INVENTORIES / "cpu-x86.toml")
    assert "KernelNotPinned" in str(caught.value) or caught.value.codes


def _xpuctl() -> Path:
    import os

    return Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "debug" / "xpuctl"


WITH_TESTS = sorted(p.name for p in EXAMPLES.glob("*.toml") if "[[test]]" in p.read_text())


def test_example_policies_have_tests() -> None:
    assert len(WITH_TESTS) >= 5, WITH_TESTS


@pytest.mark.parametrize("example", WITH_TESTS)
def test_policy_test_agrees_with_xpuctl_policy_test(example: str) -> None:
    import json
    import subprocess

    report = xpu.Policy.load(EXAMPLES / example).test()
    cli = subprocess.run(
        [str(_xpuctl()), "policy", "test", str(EXAMPLES / example), "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )
    expected = json.loads(cli.stdout)
    assert [(r.name, r.ok, list(r.failures)) for r in report] == [
        (t["name"], t["ok"], t["failures"]) for t in expected["tests"]
    ]
    assert (report.passed, report.failed) == (expected["passed"], expected["failed"])
    assert report.ok == (cli.returncode == 0) and len(report) > 0


def test_policy_test_reports_what_did_not_hold(tmp_path: Path) -> None:
    program = ROOT / "tests" / "programs" / "mlp.sgr"
    text = f"""
[policy]
name = "t"
[engines]
order = ["cpu"]
[[test]]
name = "matmuls on cpu"
program = "{program}"
inventory = "{INVENTORIES / 'cpu-x86.toml'}"
bind = {{ N = 4 }}
expect = [{{ op = "matmul", engine = "cpu" }}]
[[test]]
name = "wrongly expects cuda"
program = "{program}"
inventory = "{INVENTORIES / 'cpu-x86.toml'}"
bind = {{ N = 4 }}
expect = [{{ op = "matmul", engine = "cuda" }}]
[[test]]
name = "missing program"
program = "nowhere.sgr"
inventory = "{INVENTORIES / 'cpu-x86.toml'}"
"""
    report = xpu.Policy.from_toml(text, name="t.toml", base_dir=tmp_path).test()
    assert [r.name for r in report] == ["matmuls on cpu", "wrongly expects cuda", "missing program"]
    first, second, third = report.results
    assert first.ok and not second.ok and not third.ok and not report.ok
    assert all("expected cuda" in f for f in second.failures) and second.failures
    assert "nowhere.sgr" in third.failures[0] and str(tmp_path) in third.failures[0]
    assert str(report).splitlines()[-1] == "1 passed, 2 failed"


def test_policy_errors_are_located() -> None:
    with pytest.raises(xpu.PolicyError) as caught:
        xpu.Policy.from_toml('[policy]\nname = "x"\n[precision]\ndefault = "fp12"\n', name="inline.toml")
    (d,) = caught.value.diagnostics
    assert d["file"] == "inline.toml" and d["line"] == 4, d
    with pytest.raises(xpu.PolicyError, match="malformed TOML"):
        xpu.Policy.from_toml("[policy\n")
    with pytest.raises(xpu.PolicyError):
        xpu.Policy.from_toml("[" * 10_000)
    with pytest.raises(xpu.PolicyError):
        xpu.Policy.from_toml("x = " + "[" * 5_000 + "]" * 5_000)
    with pytest.raises(xpu.PolicyError, match="cannot read the policy"):
        xpu.Policy.load("/nonexistent/policy.toml")


def test_minilang_prints_tensors_and_tables(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")  # pandas is in the test venv: this never skips there
    (tmp_path / "people.csv").write_text("name,age,score\nada,36,1.5\nalan,41,\nbob,29,3.0\n")
    source = (
        'let t = load_csv("people.csv")\nprint stats(t, ["mean"])\nlet x = input("x")\nprint x * 2\n'
        'write_npy(x + 1, "plus_one.npy")\n'
    )
    shown = xpu.minilang.run(source, inputs={"x": np.arange(4, dtype=np.float32)}, roots=[tmp_path])
    np.testing.assert_array_equal(np.load(tmp_path / "plus_one.npy"), np.arange(4, dtype=np.float32) + 1)
    values = [p.value for p in shown if p.text is None]
    table, doubled = values[-2], values[-1]
    assert isinstance(table, pd.DataFrame), type(table)
    np.testing.assert_array_equal(doubled, np.arange(4, dtype=np.float32) * 2)


def test_minilang_tables_cross_through_the_arrow_c_stream_interface(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pa = pytest.importorskip("pyarrow")  # in the test venv (requirements.txt): never skips there
    pd = pytest.importorskip("pandas")
    (tmp_path / "people.csv").write_text("name,age,score,ok\nada,36,1.5,true\nalan,,2.5,false\n,29,,\n")
    source = 'let t = load_csv("people.csv")\nprint t\n'
    native = xpu._engines.native().run_minilang(source, {}, None, [str(tmp_path)])
    table = native[0][2]
    assert table.num_rows == 3 and table.column_names == ["name", "age", "score", "ok"]
    arrow = pa.table(table)  # through __arrow_c_stream__: nulls stay nulls, types stay typed
    assert arrow.column("name").to_pylist() == ["ada", "alan", None]
    assert arrow.column("age").to_pylist() == [36, None, 29] and arrow.schema.field("age").type == pa.int64()
    assert arrow.column("score").to_pylist() == [1.5, 2.5, None]
    assert arrow.column("ok").to_pylist() == [True, False, None]
    assert pa.schema(table) == arrow.schema  # __arrow_c_schema__
    # The same table as a DataFrame with pyarrow and without it: equal values.
    with_arrow = xpu.minilang.run(source, roots=[tmp_path])[0].value
    monkeypatch.setattr(xpu.minilang, "_pyarrow", lambda: None)
    without = xpu.minilang.run(source, roots=[tmp_path])[0].value
    assert isinstance(with_arrow, pd.DataFrame) and isinstance(without, pd.DataFrame)
    assert list(with_arrow.columns) == list(without.columns) == ["name", "age", "score", "ok"]
    for c in ["age", "score"]:
        np.testing.assert_array_equal(with_arrow[c].to_numpy(dtype=float), without[c].to_numpy(dtype=float))
    assert with_arrow["name"].isna().tolist() == without["name"].isna().tolist() == [False, False, True]
    # A stream nobody consumed is released with its capsule; a consumed one is not
    # released twice (neither crashes).
    for _ in range(100):
        table.__arrow_c_stream__()
    for _ in range(10):
        assert pa.RecordBatchReader.from_stream(table).read_all().num_rows == 3


def test_minilang_plots_come_back_as_pictures_a_notebook_shows(tmp_path: Path) -> None:
    (tmp_path / "people.csv").write_text("age,fare\n" + "".join(f"{20 + i},{i * 1.5}\n" for i in range(30)))
    source = (
        'let t = load_csv("people.csv")\n'
        'plot(t, x = "age", y = "fare", kind = "scatter", out = "fares.png", title = "Fare")\n'
        'print head(t, 2)\n'
        'plot(t, y = "age", kind = "hist", out = "ages.svg")\n'
    )
    shown = xpu.minilang.run(source, roots=[tmp_path])
    plots = [p for p in shown if isinstance(p.value, xpu.minilang.Plot)]
    assert [Path(p.value.path).name for p in plots] == ["fares.png", "ages.svg"]
    png, svg = plots[0].value, plots[1].value
    assert png.format == "png" and png.data.startswith(b"\x89PNG\r\n\x1a\n")
    assert png._repr_png_() == (tmp_path / "fares.png").read_bytes() and png._repr_svg_() is None
    assert svg.format == "svg" and "<svg" in (svg._repr_svg_() or "") and svg._repr_png_() is None
    # The printed value still comes first, in order.
    assert shown[0].text is None and not isinstance(shown[0].value, xpu.minilang.Plot)


def test_minilang_diagnostics_are_located_and_underlined() -> None:
    with pytest.raises(xpu.ProgramError) as caught:
        xpu.minilang.run("let a = 1\nprint b\n")
    message = str(caught.value)
    assert ":2:" in message and "^" in message, message


def test_minilang_reads_nothing_outside_its_roots(tmp_path: Path) -> None:
    with pytest.raises(xpu.ProgramError, match="outside"):
        xpu.minilang.run('let t = load_csv("/etc/passwd")\nprint t\n', roots=[tmp_path])


def test_inventory_reports_every_engine_with_its_availability() -> None:
    inv = xpu.inventory()
    text = str(inv)
    for engine in ("cpu", "ort", "openvino", "llvm", "cuda", "table"):
        assert engine in text
