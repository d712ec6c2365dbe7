#!/usr/bin/env python3
"""Evaluates `xpuctl ask` on the question set in tests/ask: execution accuracy, first-attempt
success per stage, attempts and tokens, with the feedback loop off and on.

    python tools/ask_eval.py --xpuctl target/debug/xpuctl \\
        --endpoint http://127.0.0.1:8080/v1 --model NAME [--out report.json] [--limit N]
    python tools/ask_eval.py --xpuctl target/debug/xpuctl --self-check

The question set: files NNN-slug.ml in the questions directory (default tests/ask), each
beginning with

    # question: How many passengers survived, by class?
    # data: titanic.csv

(`# data:` lists the files the question is about, space-separated, possibly none) and then
the reference program. The data: examples/titanic.csv, examples/sales.xlsx,
examples/regions.csv and orders.csv, written by gen_orders.py from the questions directory,
all copied into one scratch directory that every program runs in.

What it does:
  1. runs every reference once, `xpuctl run REF --format json`, and keeps its outputs;
  2. for each question runs `xpuctl ask QUESTION --data F ... --endpoint URL --model NAME
     --format json --run` twice: with `--max-attempts 1` (mode feedback_off: the first
     program the model writes, diagnostics never sent back) and with the default attempts
     (mode feedback_on);
  3. an answer is correct when it was accepted, its run exited 0, and its outputs equal the
     reference's by value (below).

Equal by value. `xpuctl run --format json` lists the run's outputs, one per `print` of a
tensor or a table: a tensor as a .npy file, a table as a CSV file (header row, missing cells
empty); its `prints` give every print in program order, an output by name or the text of a
value computed at compile time (a number, a string, a list such as `columns(t)`), which is
compared as its JSON value (or as text).
Two runs are equal when:
  * they have the same number of outputs, and the outputs pair up in order; except that
    when every output on both sides is a scalar or a vector (below: a 1x1 or one-row or
    one-column table counts as one), their cells are compared all together, so two counts
    printed one by one equal a one-row table of the two counts;
  * each pair has the same shape once dimensions of size 1 are dropped: a table of R rows
    and C columns has the shape [R, C], so a 1x1 table equals a scalar tensor holding the
    same number, a one-row table equals a vector of its cells, a [3, 1] tensor equals a [3]
    one;
  * cells are equal one by one, in row order: numbers within 1e-6 relative (1e-9 absolute
    near zero), whatever their types (an integer count equals the same float sum, a bool
    equals 1 or 0); missing cells (an empty CSV cell, NaN) equal each other and nothing
    else; any other text exactly;
  * table column names are not compared (the model names its aggregates as it likes), but
    the number and the order of the columns are; `--strict-names` compares names too.
Row order matters: every question that returns several rows says how they are ordered.

Exit status: 0 once the measurement ran, however low the accuracy; 2 on a setup error
(xpuctl missing, a question file without its header, a data file missing, a reference that
fails or prints nothing comparable, `xpuctl ask` refusing its configuration); with
`--self-check`, 1 when the self-check fails.

`--self-check` needs no model: it treats each reference as the answer, runs it as `ask --run`
runs an answer (its own directory, `--format json`, relative output paths) and scores it with
the same code (it must be 100% correct); it also checks that every pair of references with
different outputs compares unequal, and a few perturbations of the comparison.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE_FILES = ["titanic.csv", "sales.xlsx", "regions.csv"]
REL_TOL = 1e-6
ABS_TOL = 1e-9
MODES = [("feedback_off", ["--max-attempts", "1"]), ("feedback_on", [])]


class SetupError(Exception):
    pass


# ---------------------------------------------------------------------------------------
# Questions


class Question:
    def __init__(self, path: str, question: str, data: list[str], program: str):
        self.path = path
        self.id = os.path.basename(path)[:-3]
        self.question = question
        self.data = data
        self.program = program


def load_questions(qdir: str) -> list[Question]:
    if not os.path.isdir(qdir):
        raise SetupError(f"questions directory {qdir} not found")
    names = sorted(n for n in os.listdir(qdir) if re.fullmatch(r"\d{3}-[\w-]+\.ml", n))
    if not names:
        raise SetupError(f"no NNN-slug.ml questions in {qdir}")
    out = []
    for n in names:
        path = os.path.join(qdir, n)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        lines = text.splitlines()
        q = lines[0] if lines else ""
        d = lines[1] if len(lines) > 1 else ""
        if not q.startswith("# question:") or not d.startswith("# data:"):
            raise SetupError(f"{path}: must begin with '# question: …' and '# data: …'")
        question = q[len("# question:"):].strip()
        if not question:
            raise SetupError(f"{path}: empty question")
        out.append(Question(os.path.abspath(path), question, d[len("# data:"):].split(), text))
    return out


def prepare_data(data_dir: str, qdir: str, questions: list[Question]) -> None:
    os.makedirs(data_dir, exist_ok=True)
    for name in EXAMPLE_FILES:
        src = os.path.join(ROOT, "examples", name)
        if not os.path.isfile(src):
            raise SetupError(f"{src} not found")
        shutil.copy(src, data_dir)
    gen = os.path.join(qdir, "gen_orders.py")
    if not os.path.isfile(gen):
        gen = os.path.join(ROOT, "tests", "ask", "gen_orders.py")
    r = subprocess.run([sys.executable, gen, data_dir], capture_output=True, text=True)
    if r.returncode != 0:
        raise SetupError(f"{gen} failed: {r.stderr.strip()}")
    for q in questions:
        for f in q.data:
            if not os.path.isfile(os.path.join(data_dir, f)):
                raise SetupError(f"{q.id}: data file {f} is not in the scratch data")


# ---------------------------------------------------------------------------------------
# Outputs: .npy and .csv files read into (shape, cells, column names)


NPY_TYPES = {"f8": "d", "f4": "f", "f2": "e", "i8": "q", "i4": "i", "i2": "h", "i1": "b",
             "u8": "Q", "u4": "I", "u2": "H", "u1": "B", "b1": "?"}


def read_npy(path: str) -> tuple[list[int], list]:
    """A .npy file (format 1-3) of numbers or bools: its shape and its cells, row-major."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    major = data[6]
    if major == 1:
        (hlen,), start = struct.unpack("<H", data[8:10]), 10
    else:
        (hlen,), start = struct.unpack("<I", data[8:12]), 12
    header = ast.literal_eval(data[start:start + hlen].decode("latin1"))
    descr, shape = header["descr"], list(header["shape"])
    order, code = descr[0], descr[1:]
    if code not in NPY_TYPES:
        raise ValueError(f"{path}: unsupported dtype {descr}")
    fmt = ("<" if order in "<|=" else ">") + NPY_TYPES[code]
    n = math.prod(shape)
    values = list(struct.unpack_from(fmt[0] + fmt[1] * n, data, start + hlen))
    if header.get("fortran_order") and len(shape) > 1:
        values = fortran_to_c(values, shape)
    return shape, values


def fortran_to_c(values: list, shape: list[int]) -> list:
    out = []
    strides = [1]
    for d in shape[:-1]:
        strides.append(strides[-1] * d)
    def walk(dim: int, offset: int):
        if dim == len(shape):
            out.append(values[offset])
            return
        for i in range(shape[dim]):
            walk(dim + 1, offset + i * strides[dim])
    walk(0, 0)
    return out


def read_table(path: str) -> tuple[list[int], list, list[str]]:
    import csv
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        return [0, 0], [], []
    header, body = rows[0], rows[1:]
    return [len(body), len(header)], [c for r in body for c in r], header


def load_output(o: dict, base: str) -> dict:
    """One entry of `outputs` as {shape, cells, columns}; cells normalised by `cell`."""
    if "value" in o:  # a compile-time value, should the JSON ever carry them inline
        shape, cells = nested(o["value"])
        return {"name": o.get("name"), "shape": shape, "cells": [cell(c) for c in cells],
                "columns": None}
    path = o["file"]
    if not os.path.isabs(path):
        path = os.path.join(base, path)
    if o.get("dtype") == "table" or path.endswith(".csv"):
        shape, cells, columns = read_table(path)
    else:
        (shape, cells), columns = read_npy(path), None
    return {"name": o.get("name"), "shape": shape, "cells": [cell(c) for c in cells],
            "columns": columns}


def nested(v) -> tuple[list[int], list]:
    if isinstance(v, list):
        parts = [nested(x) for x in v]
        inner = parts[0][0] if parts else []
        return [len(v)] + inner, [c for p in parts for c in p[1]]
    return [], [v]


def cell(v):
    """None for missing, float for numbers and bools, str for other text."""
    if v is None:
        return None
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return None if isinstance(v, float) and math.isnan(v) else float(v)
    s = str(v)
    if s == "":
        return None
    low = s.strip().lower()
    if low == "true":
        return 1.0
    if low == "false":
        return 0.0
    try:
        x = float(s)
    except ValueError:
        return s
    return None if math.isnan(x) else x


def load_run(run_json, base: str) -> list[dict]:
    """The outputs of a `xpuctl run --format json`, in print order."""
    if not isinstance(run_json, dict) or not isinstance(run_json.get("outputs"), list):
        raise ValueError("the run printed no JSON with `outputs`")
    if isinstance(run_json.get("prints"), list):
        # Print order as the run reports it: outputs by name, and the text of values
        # computed at compile time (numbers, strings, lists), read as JSON where it is.
        by_name = {o.get("name"): o for o in run_json["outputs"]}
        items = []
        for p in run_json["prints"]:
            if "output" in p and p["output"] in by_name:
                items.append(load_output(by_name[p["output"]], base))
            elif "text" in p:
                try:
                    value = json.loads(p["text"])
                except ValueError:
                    value = p["text"]
                items.append(load_output({"name": None, "value": value}, base))
        return items
    outs = list(run_json["outputs"])
    def key(o):
        m = re.fullmatch(r"print_(\d+)", str(o.get("name", "")))
        return int(m.group(1)) if m else math.inf
    outs.sort(key=key)  # stable: unnamed ones keep their place at the end
    return [load_output(o, base) for o in outs]


# ---------------------------------------------------------------------------------------
# Comparison


def squeeze(shape: list[int]) -> list[int]:
    return [d for d in shape if d != 1]


def cells_equal(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isinf(a) or math.isinf(b):
            return a == b
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return a == b


def show(c) -> str:
    return "missing" if c is None else repr(c)


def compare(ref: list[dict], ans: list[dict], strict_names: bool = False) -> tuple[bool, str]:
    """Whether an answer's outputs equal the reference's by value, and why not."""
    if len(ref) != len(ans):
        flat = lambda outs: all(len(squeeze(o["shape"])) <= 1 for o in outs)
        if ref and ans and flat(ref) and flat(ans):
            # Scalars and vectors printed one by one or together: compare all their cells.
            rc = [c for o in ref for c in o["cells"]]
            ac = [c for o in ans for c in o["cells"]]
            if len(rc) == len(ac) and all(cells_equal(x, y) for x, y in zip(rc, ac)):
                return True, ""
        return False, f"{len(ans)} printed output(s), the reference has {len(ref)}"
    for i, (r, a) in enumerate(zip(ref, ans), 1):
        rs, as_ = squeeze(r["shape"]), squeeze(a["shape"])
        if rs != as_:
            return False, f"output {i}: shape {a['shape']}, the reference's {r['shape']}"
        if strict_names and r["columns"] is not None and a["columns"] is not None \
                and r["columns"] != a["columns"]:
            return False, f"output {i}: columns {a['columns']}, the reference's {r['columns']}"
        for j, (x, y) in enumerate(zip(r["cells"], a["cells"])):
            if not cells_equal(x, y):
                where = f"cell {j}"
                if len(r["shape"]) == 2 and r["shape"][1]:
                    where = f"row {j // r['shape'][1]}, column {j % r['shape'][1]}"
                return False, f"output {i}, {where}: {show(y)}, the reference's {show(x)}"
    return True, ""


# ---------------------------------------------------------------------------------------
# Running xpuctl


def run_reference(xpuctl: str, q: Question, data_dir: str, out_dir: str) -> list[dict]:
    cmd = [xpuctl, "run", q.path, "--format", "json", "--out", out_dir]
    r = subprocess.run(cmd, cwd=data_dir, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SetupError(f"reference {q.id} failed (exit {r.returncode}): {r.stderr.strip()}")
    try:
        outs = load_run(json.loads(r.stdout), data_dir)
    except (ValueError, OSError, KeyError) as e:
        raise SetupError(f"reference {q.id}: {e}")
    if not outs:
        raise SetupError(f"reference {q.id} prints no tensor or table, nothing to compare")
    return outs


def ask(xpuctl: str, q: Question, data_dir: str, args, extra: list[str]) -> dict:
    """One `xpuctl ask … --run`: its JSON record, or {"error": …}."""
    shutil.rmtree(os.path.join(data_dir, "out"), ignore_errors=True)
    cmd = [xpuctl, "ask", q.question]
    for f in q.data:
        cmd += ["--data", f]
    cmd += ["--endpoint", args.endpoint, "--model", args.model, "--format", "json", "--run",
            "--out", os.path.join(data_dir, "out")]
    cmd += extra
    try:
        r = subprocess.run(cmd, cwd=data_dir, capture_output=True, text=True,
                           timeout=args.ask_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"xpuctl ask did not finish in {args.ask_timeout} s"}
    if r.returncode == 2:
        raise SetupError(f"xpuctl ask refused its arguments: {r.stderr.strip()}")
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return {"error": f"xpuctl ask (exit {r.returncode}) printed no JSON: "
                         f"{r.stderr.strip()[-500:]}"}


def self_answer(xpuctl: str, q: Question, data_dir: str) -> dict:
    """The reference as if a model had written it: an ask record whose run is made as
    `ask --run` makes it (program in its own directory, the data directory as working
    directory, `--format json`, the default relative output directory)."""
    shutil.rmtree(os.path.join(data_dir, "out"), ignore_errors=True)
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "answer.ml")
        with open(prog, "w", encoding="utf-8") as f:
            f.write(q.program)
        t0 = time.monotonic()
        r = subprocess.run([xpuctl, "run", prog, "--format", "json"], cwd=data_dir,
                           capture_output=True, text=True, timeout=600)
        ms = int((time.monotonic() - t0) * 1e3)
    try:
        stdout = json.loads(r.stdout)
    except json.JSONDecodeError:
        stdout = r.stdout
    attempt = {"n": 1, "verdict": {"findings": [], "feedback": ""}, "prompt_tokens": 0,
               "completion_tokens": 0, "latency_ms": ms}
    return {"outcome": "accepted", "program": q.program, "attempts": [attempt], "tokens": 0,
            "run": {"exit_code": r.returncode, "stdout": stdout, "stderr": r.stderr}}


# ---------------------------------------------------------------------------------------
# Scoring


def first_attempt(record: dict) -> dict:
    """Whether the first program parsed, checked (names, types, lowering) and dry-ran clean;
    each stage implies the ones before it."""
    attempts = record.get("attempts") or []
    if not attempts:
        return {"parse": False, "check": False, "dry_run": False}
    stages = {f.get("stage") for f in attempts[0].get("verdict", {}).get("findings", [])}
    parse = "parse" not in stages
    check = parse and "check" not in stages
    return {"parse": parse, "check": check, "dry_run": check and not stages}


def score(q: Question, record: dict, ref: list[dict], data_dir: str, strict: bool) -> dict:
    attempts = record.get("attempts") or []
    row = {
        "id": q.id,
        "question": q.question,
        "outcome": record.get("outcome", "error"),
        "attempts": len(attempts),
        "prompt_tokens": sum(a.get("prompt_tokens", 0) for a in attempts),
        "completion_tokens": sum(a.get("completion_tokens", 0) for a in attempts),
        "latency_ms": sum(a.get("latency_ms", 0) for a in attempts),
        "first_attempt": first_attempt(record),
        "program": record.get("program"),
        "correct": False,
        "why": "",
    }
    row["tokens"] = row["prompt_tokens"] + row["completion_tokens"]
    if "error" in record and "outcome" not in record:
        row["why"] = record["error"]
        return row
    if row["outcome"] != "accepted":
        row["why"] = f"not accepted: {row['outcome']}" + (
            f" ({record['error']})" if record.get("error") else "")
        return row
    run = record.get("run")
    if not isinstance(run, dict):
        row["why"] = "no run in the answer (was --run given?)"
        return row
    if run.get("exit_code") != 0:
        row["why"] = f"the run exited {run.get('exit_code')}: {str(run.get('stderr', ''))[-300:]}"
        return row
    try:
        outs = load_run(run.get("stdout"), data_dir)
    except (ValueError, OSError, KeyError) as e:
        row["why"] = f"unreadable run output: {e}"
        return row
    row["correct"], row["why"] = compare(ref, outs, strict)
    return row


def summarise(rows: list[dict]) -> dict:
    n = len(rows)
    def mean(xs):
        xs = list(xs)
        return sum(xs) / len(xs) if xs else 0.0
    acc = sum(r["outcome"] == "accepted" for r in rows)
    cor = sum(r["correct"] for r in rows)
    return {
        "questions": n,
        "accepted": acc,
        "accepted_rate": acc / n if n else 0.0,
        "correct": cor,
        "execution_accuracy": cor / n if n else 0.0,
        "first_attempt": {s: mean(r["first_attempt"][s] for r in rows)
                          for s in ("parse", "check", "dry_run")},
        "mean_attempts": mean(r["attempts"] for r in rows),
        "mean_tokens": mean(r["tokens"] for r in rows),
        "mean_prompt_tokens": mean(r["prompt_tokens"] for r in rows),
        "mean_completion_tokens": mean(r["completion_tokens"] for r in rows),
        "mean_latency_ms": mean(r["latency_ms"] for r in rows),
        "errors": sum(r["outcome"] == "error" for r in rows),
    }


def print_table(modes: dict) -> None:
    head = (f"{'mode':<14}{'n':>4}{'accepted':>10}{'correct':>9}{'exec acc':>10}"
            f"{'1st parse':>11}{'1st check':>11}{'1st run':>9}{'attempts':>10}{'tokens':>9}")
    print(head)
    print("-" * len(head))
    for name, m in modes.items():
        s = m["summary"]
        fa = s["first_attempt"]
        print(f"{name:<14}{s['questions']:>4}{s['accepted']:>10}{s['correct']:>9}"
              f"{s['execution_accuracy']:>10.1%}{fa['parse']:>11.1%}{fa['check']:>11.1%}"
              f"{fa['dry_run']:>9.1%}{s['mean_attempts']:>10.2f}{s['mean_tokens']:>9.0f}")


# ---------------------------------------------------------------------------------------
# Self-check of the comparison


def comparison_tests() -> list[str]:
    """Failures of a few fixed cases of `compare` (empty when all pass)."""
    t = lambda shape, cells, cols=None: {"shape": shape, "cells": [cell(c) for c in cells],
                                         "columns": cols}
    cases = [
        ([t([1, 1], ["891"], ["n"])], [t([], [891])], True, "1x1 table = scalar"),
        ([t([1, 1], ["891"], ["n"])], [t([1, 1], ["891.0"], ["count"])], True, "names ignored"),
        ([t([2], [1.0, 2.0])], [t([2, 1], [1.0, 2.0])], True, "[2] = [2, 1]"),
        ([t([1], [0.5])], [t([1], [0.5 * (1 + 1e-9)])], True, "within 1e-6"),
        ([t([1], [0.5])], [t([1], [0.5 * (1 + 1e-4)])], False, "beyond 1e-6"),
        ([t([1, 1], [""])], [t([], [float("nan")])], True, "missing = NaN"),
        ([t([1, 1], [""])], [t([], [0.0])], False, "missing != 0"),
        ([t([1, 1], ["True"])], [t([], [True])], True, "bool text = bool"),
        ([t([2, 1], ["a", "b"])], [t([2, 1], ["b", "a"])], False, "row order"),
        ([t([1, 2], ["1", "2"])], [t([2, 1], ["1", "2"])], True, "1x2 = 2x1 once squeezed"),
        ([t([2, 2], ["1", "2", "3", "4"])], [t([2, 2], ["1", "3", "2", "4"])], False, "transposed"),
        ([t([1], [1.0])], [t([1], [1.0]), t([1], [1.0])], False, "extra print"),
        ([t([1, 1], ["6"]), t([1, 1], ["5"])], [t([1, 2], ["6", "5"], ["a", "b"])], True,
         "two scalar prints = one row of two"),
        ([t([1, 1], ["6"]), t([1, 1], ["5"])], [t([1, 2], ["5", "6"])], False,
         "two scalar prints, other order"),
        ([t([2, 2], ["1", "2", "3", "4"])], [t([2], [1, 2]), t([2], [3, 4])], False,
         "a matrix is not two vectors"),
        ([t([0, 2], [])], [t([0, 2], [])], True, "empty tables"),
        ([t([2, 1], ["Ana", "Ben"])], [t([2, 1], ["ana", "Ben"])], False, "text exact"),
    ]
    fails = []
    for ref, ans, want, what in cases:
        got, why = compare(ref, ans)
        if got != want:
            fails.append(f"{what}: compare gave {got} ({why}), expected {want}")
    # strict names
    a, b = [t([1, 1], ["1"], ["n"])], [t([1, 1], ["1"], ["m"])]
    if compare(a, b, strict_names=True)[0]:
        fails.append("--strict-names: different names compared equal")
    return fails


# ---------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--xpuctl", required=True, help="the xpuctl binary")
    ap.add_argument("--endpoint", help="chat-completions API base, e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--model", help="the model name")
    ap.add_argument("--out", help="write the JSON report here")
    ap.add_argument("--limit", type=int, help="only the first N questions")
    ap.add_argument("--questions", default=None, help="questions directory (default tests/ask)")
    ap.add_argument("--ask-timeout", type=float, default=900, help="seconds per ask (900)")
    ap.add_argument("--strict-names", action="store_true",
                    help="tables must also have the reference's column names")
    ap.add_argument("--keep", help="use this directory for the scratch data and keep it")
    ap.add_argument("--self-check", action="store_true",
                    help="score each reference as its own answer (no model); must be 100%%")
    args = ap.parse_args()

    try:
        return evaluate(args)
    except SetupError as e:
        print(f"ask_eval: setup error: {e}", file=sys.stderr)
        return 2


def evaluate(args) -> int:
    xpuctl = shutil.which(args.xpuctl) or args.xpuctl
    if not (os.path.isfile(xpuctl) and os.access(xpuctl, os.X_OK)):
        raise SetupError(f"xpuctl not found or not executable: {args.xpuctl}")
    xpuctl = os.path.abspath(xpuctl)
    if not args.self_check and not (args.endpoint and args.model):
        raise SetupError("--endpoint and --model are needed (or --self-check)")
    qdir = args.questions
    if qdir is None:
        qdir = "tests/ask" if os.path.isdir("tests/ask") else os.path.join(ROOT, "tests", "ask")
    questions = load_questions(qdir)
    if args.limit:
        questions = questions[:args.limit]

    scratch = args.keep or tempfile.mkdtemp(prefix="ask_eval.")
    try:
        data_dir = os.path.join(scratch, "data")
        prepare_data(data_dir, qdir, questions)
        print(f"{len(questions)} questions; data in {data_dir}", file=sys.stderr)
        refs = {}
        for q in questions:
            refs[q.id] = run_reference(xpuctl, q, data_dir, os.path.join(scratch, "ref", q.id))

        report = {
            "xpuctl": xpuctl,
            "questions_dir": os.path.abspath(qdir),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "comparison": ("outputs of `xpuctl run --format json` in print order; shapes "
                           "equal once size-1 dims are dropped (scalars and vectors compared "
                           "all together when the print counts differ); numbers within "
                           f"{REL_TOL:g} relative / {ABS_TOL:g} absolute; missing = NaN; text "
                           "exact; column names " + ("compared" if args.strict_names
                                                     else "not compared")),
            "modes": {},
        }
        if args.self_check:
            report["self_check"] = True
            rows = []
            for q in questions:
                record = self_answer(xpuctl, q, data_dir)
                rows.append(score(q, record, refs[q.id], data_dir, args.strict_names))
            report["modes"]["self_check"] = {"summary": summarise(rows), "questions": rows}
            fails = comparison_tests()
            # Every two references with different outputs must compare unequal, else the
            # comparison is too lenient to tell answers apart.
            ids = [q.id for q in questions]
            pairs = lenient = 0
            lenient_pairs = []
            for i, a in enumerate(ids):
                for b in ids[i + 1:]:
                    pairs += 1
                    if compare(refs[a], refs[b], args.strict_names)[0]:
                        lenient += 1
                        lenient_pairs.append([a, b])
            report["cross_check"] = {"pairs": pairs, "equal_pairs": lenient_pairs,
                                     "comparison_test_failures": fails}
        else:
            report["endpoint"], report["model"] = args.endpoint, args.model
            for mode, extra in MODES:
                rows = []
                for q in questions:
                    record = ask(xpuctl, q, data_dir, args, extra)
                    row = score(q, record, refs[q.id], data_dir, args.strict_names)
                    rows.append(row)
                    mark = "ok " if row["correct"] else "-- "
                    print(f"{mode} {mark}{q.id} {row['outcome']} {row['attempts']} attempt(s)"
                          + (f": {row['why'].splitlines()[0]}" if row["why"] else ""), file=sys.stderr)
                report["modes"][mode] = {"summary": summarise(rows), "questions": rows}
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)

    print_table(report["modes"])
    if args.self_check:
        s = report["modes"]["self_check"]["summary"]
        cc = report["cross_check"]
        wrong = [r for r in report["modes"]["self_check"]["questions"] if not r["correct"]]
        for r in wrong:
            print(f"self-check: {r['id']} not correct: {r['why']}")
        print(f"cross-check: {cc['pairs']} pairs of references, "
              f"{len(cc['equal_pairs'])} compare equal"
              + (f" {cc['equal_pairs']}" if cc["equal_pairs"] else ""))
        for f in cc["comparison_test_failures"]:
            print(f"comparison test failed: {f}")
        ok = s["correct"] == s["questions"] and not cc["comparison_test_failures"]
        print("self-check " + ("passed" if ok else "FAILED"))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.self_check and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
