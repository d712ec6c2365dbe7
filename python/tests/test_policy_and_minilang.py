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
    source = 'let t = load_csv("people.csv")\nprint stats(t, ["mean"])\nlet x = input("x")\nprint x * 2\n'
    shown = xpu.minilang.run(source, inputs={"x": np.arange(4, dtype=np.float32)}, roots=[tmp_path])
    values = [p.value for p in shown if p.text is None]
    table, doubled = values[-2], values[-1]
    assert isinstance(table, pd.DataFrame), type(table)
    np.testing.assert_array_equal(doubled, np.arange(4, dtype=np.float32) * 2)


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
