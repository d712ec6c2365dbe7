#!/usr/bin/env python3
"""`make soak`: a bounded soak of a release xpud on loopback (issue 20, point 5; docs/soak.md).

Client threads submit a mix of jobs for --minutes: MiniLang table and tensor programs, the
example ONNX model on the cpu, ort, openvino and llvm engines (the last three in their worker
processes, xpud's default), requests that must be refused, and jobs cancelled while they run.
Meanwhile xpud gets SIGHUP (a policy reload) every --hup-every seconds and one engine worker
is killed with SIGKILL every --kill-every seconds. A sampler records xpud's resident memory,
its open file descriptors and its workers every two seconds.

At the end the clients stop, every acknowledged run is waited for, xpud is stopped with
SIGTERM (it drains) and started again on the same data directory, and every acknowledged run
is read back: it must be there with the final status it had.

Bars (exit status 1 when one is missed): no acknowledged run lost, xpud's RSS at the end
within 10% of its RSS after warm-up, its open file descriptors flat (the quiescent count at
the end no more than 4 above the one after warm-up), no 5xx answer, every refused request a
4xx, every job's outcome one its kind allows (a job may fail only because a worker was killed
under it). The report (Markdown and JSON) goes to --out.
"""

import argparse
import base64
import collections
import http.client
import io
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
FINAL = {"succeeded", "failed", "cancelled", "timed_out"}
CRASH = re.compile(r"engine (\w+) crashed \(([^)]*)\)")
# What xpud holds open for each live worker: its request socket (two handles), its control
# socket, the shared-memory file and /proc/<worker>/statm. An engine's pool grows with
# concurrency and shrinks when idle, so the fd bar is on the rest.
FDS_PER_WORKER = 5


def npy_b64(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return base64.b64encode(buf.getvalue()).decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """One keep-alive HTTP connection (one per thread), reopened when the server drops it."""

    def __init__(self, port, timeout=180):
        self.port, self.timeout, self.conn = port, timeout, None

    def request(self, method, path, body=None, raw=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            status, payload = self._exchange(method, path, data, headers)
        except (ConnectionError, http.client.HTTPException, OSError):
            # A keep-alive connection the server closed: once more on a new one.
            self.conn.close()
            self.conn = None
            status, payload = self._exchange(method, path, data, headers)
        try:
            return status, (json.loads(payload) if payload else None)
        except ValueError:
            return status, payload.decode(errors="replace")

    def _exchange(self, method, path, data, headers):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        self.conn.request(method, path, body=data, headers=headers)
        r = self.conn.getresponse()
        return r.status, r.read()


class Daemon:
    def __init__(self, xpud, data_dir, policies, roots, log_path):
        self.xpud, self.data_dir, self.policies, self.roots = xpud, data_dir, policies, roots
        self.log_path, self.proc, self.port = log_path, None, None

    def start(self):
        self.port = free_port()
        env = dict(os.environ)
        env.update({
            "XPU_POLICY_DIRS": json.dumps([self.policies]),
            "XPU_DATA_ROOTS": json.dumps(self.roots),
            "XPU_MODEL_ROOTS": json.dumps(self.roots),
            "XPU_LOG": "warn",
        })
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [self.xpud, "--dev", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data_dir],
            env=env, stdout=log, stderr=log)
        client, until = Client(self.port, timeout=5), time.time() + 60
        while time.time() < until:
            if self.proc.poll() is not None:
                raise SystemExit(f"xpud exited ({self.proc.returncode}) while starting: see {self.log_path}")
            try:
                if client.request("GET", "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("xpud did not become ready in 60 s")

    def stop(self, timeout=90):
        """SIGTERM (xpud drains), then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return "killed after not stopping in %d s" % timeout

    def rss_kib(self, pid=None, field="VmRSS"):
        """Resident KiB: `VmRSS` (all), `RssAnon` (the heap: what a leak grows) or `RssFile`
        (mapped files: the search index's segments, reclaimable page cache)."""
        try:
            with open(f"/proc/{pid or self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith(field + ":"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def fds(self):
        try:
            return len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        except OSError:
            return -1

    def workers(self):
        """Engine worker processes: (pid, engine)."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                if ppid != self.proc.pid:
                    continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                if b"--engine" in argv:
                    found.append((int(entry), argv[argv.index(b"--engine") + 1].decode()))
            except (OSError, ValueError, IndexError):
                continue
        return found


class Jobs:
    """The job mix. Each kind returns (outcome, run_id or None, detail); outcome is what the
    report counts, e.g. `ok`, `refused 422`, `failed: engine ort crashed (SIGKILL)`."""

    def __init__(self):
        x = np.load(os.path.join(ROOT, "examples", "mlp_input.npy"))
        self.mlp_inputs = {n: npy_b64(np.resize(x, (n, x.shape[1])).astype(np.float32)) for n in (1, 3, 16)}
        # A chain of 256² matmuls: long enough (tens of ms) to be cancelled while it runs.
        src = ["let x = input(\"x\")", "let y0 = x"]
        src += [f"let y{i} = tanh(y{i - 1} @ x)" for i in range(1, 81)]
        self.chain = "\n".join(src + ["print y80", ""])
        self.chain_x = npy_b64((np.random.default_rng(1).standard_normal((256, 256)) / 32).astype(np.float32))
        self.kinds = [
            # (name, weight, function)
            ("table", 3, self.table),
            ("tensors", 2, self.tensors),
            ("mlp cpu", 3, lambda c, rng: self.mlp(c, rng, "cpu-only")),
            ("mlp ort", 3, lambda c, rng: self.mlp(c, rng, "ort-cpu")),
            ("mlp openvino", 2, lambda c, rng: self.mlp(c, rng, "openvino-cpu")),
            ("mlp llvm", 2, lambda c, rng: self.mlp(c, rng, "llvm-host")),
            ("bad request", 3, self.bad),
            ("cancel", 1, self.cancel),
            ("read", 2, self.read),
        ]
        self.known_runs = []

    def pick(self, rng):
        total = sum(w for _, w, _ in self.kinds)
        r = rng.uniform(0, total)
        for name, weight, fn in self.kinds:
            r -= weight
            if r <= 0:
                return name, fn
        return self.kinds[-1][0], self.kinds[-1][2]

    @staticmethod
    def outcome(status, value):
        if status >= 500:
            return f"5xx {status}: {str(value)[:200]}"
        if status not in (200, 202):
            return f"refused {status}"
        if not isinstance(value, dict) or "run_id" not in value:
            return f"answer without a run: {str(value)[:200]}"
        if value["status"] == "succeeded":
            return "ok"
        crash = CRASH.search(value.get("error") or "")
        if value["status"] == "failed" and crash:
            return f"failed: worker {crash.group(1)} crashed ({crash.group(2)})"
        return f"{value['status']}: {(value.get('error') or '')[:160]}"

    def submit(self, c, body):
        status, value = c.request("POST", "/v1/jobs", body)
        run = value.get("run_id") if isinstance(value, dict) and status in (200, 202) else None
        if run:
            self.known_runs.append(run)
        return self.outcome(status, value), run, value

    def table(self, c, rng):
        program = rng.choice(["pivot.ml", "pipeline.ml"])
        out, run, _ = self.submit(c, {"program": {"path": program}, "wait": True})
        return out, run

    def tensors(self, c, rng):
        out, run, _ = self.submit(c, {"program": {"path": "tensors.ml"}, "wait": True})
        return out, run

    def mlp(self, c, rng, policy):
        n = rng.choice(list(self.mlp_inputs))
        body = {"program": {"path": "mlp.onnx"}, "policy": policy, "wait": True,
                "inputs": {"x": {"npy_base64": self.mlp_inputs[n]}}}
        out, run, _ = self.submit(c, body)
        return out, run

    def bad(self, c, rng, choice=None):
        """A request xpud must refuse with a 4xx (and stay up)."""
        choice = rng.randrange(8) if choice is None else choice
        if choice == 0:
            status, value = c.request("POST", "/v1/jobs", raw=b"{\"program\": {\"source\": ")
        elif choice == 1:
            status, value = c.request("POST", "/v1/jobs", {"program": {"path": "tensors.ml"}, "policy": "no-such-policy"})
        elif choice == 2:
            status, value = c.request("POST", "/v1/jobs", {"program": {"name": "bad.ml", "source": "let x = (1 +\n"}})
        elif choice == 3:
            status, value = c.request("POST", "/v1/jobs", {"program": {"path": "../../../etc/passwd"}})
        elif choice == 4:
            status, value = c.request("POST", "/v1/jobs", {"program": {"path": "mlp.onnx"},
                                                           "inputs": {"x": {"npy_base64": "not base64 at all!"}}})
        elif choice == 5:
            status, value = c.request("POST", "/v1/jobs", raw=b"[" * 100_000 + b"]" * 100_000)
        elif choice == 6:
            status, value = c.request("GET", "/v1/runs/no-such-run")
        else:
            status, value = c.request("POST", "/v1/jobs", {"program": {"path": "mlp.onnx"}, "wait": True,
                                                           "inputs": {"x": {"dtype": "f32", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}}})
            if status in (200, 202) and isinstance(value, dict) and value.get("run_id"):
                # A shape the model does not take may be refused at submit or fail its run.
                self.known_runs.append(value["run_id"])
                return ("failed as it must" if value.get("status") == "failed" else f"accepted: {value.get('status')}"), value["run_id"]
        if status >= 500:
            return f"5xx {status}: {str(value)[:200]}", None
        if 400 <= status < 500:
            return "refused as it must", None
        return f"accepted: {status} {str(value)[:160]}", None

    def cancel(self, c, rng):
        policy = rng.choice(["ort-cpu", "cpu-only"])
        body = {"program": {"name": "chain.ml", "source": self.chain}, "policy": policy, "wait": False,
                "inputs": {"x": {"npy_base64": self.chain_x}}}
        status, value = c.request("POST", "/v1/jobs", body)
        if status != 202 or not isinstance(value, dict):
            return self.outcome(status, value), None
        run = value["run_id"]
        self.known_runs.append(run)
        time.sleep(rng.uniform(0, 0.08))
        status, _ = c.request("POST", f"/v1/runs/{run}/cancel")
        if status not in (200, 202, 409):
            return f"cancel answered {status}", run
        final = wait_final(c, run)
        if final is None:
            return "cancelled run never ended", run
        out = self.outcome(200, final)
        # How far the chain got before the cancel landed varies; the status is the outcome.
        return f"cancel -> {'cancelled' if final['status'] == 'cancelled' else out}", run

    def read(self, c, rng):
        if not self.known_runs:
            status, _ = c.request("GET", "/v1/runs?limit=5")
        else:
            run = rng.choice(self.known_runs[-200:])
            path = rng.choice([f"/v1/runs/{run}", f"/v1/runs/{run}/explain", "/v1/runs?limit=5",
                                    "/v1/search?q=mlp", "/metrics"])
            status, _ = c.request("GET", path)
        if status >= 500:
            return f"5xx {status} on a read", None
        return ("read ok" if status == 200 else f"read {status}"), None


def wait_final(c, run, timeout=180):
    until = time.time() + timeout
    while time.time() < until:
        status, value = c.request("GET", f"/v1/runs/{run}")
        if status == 200 and value.get("status") in FINAL:
            return value
        time.sleep(0.05)
    return None


# What each kind may end as; anything else misses the "outcomes" bar.
def allowed(kind, outcome):
    if outcome.startswith("5xx") or outcome.startswith("answer without"):
        return False
    if "crashed (SIGKILL)" in outcome or "(quarantined)" in outcome:
        # A worker killed under the job by the soak itself: any job that runs may meet it
        # (and a partition whose worker it killed three times is refused from then on).
        return kind not in ("bad request", "read")
    if kind == "bad request":
        return outcome in ("refused as it must", "failed as it must")
    if kind == "cancel":
        return outcome in ("cancel -> ok", "cancel -> cancelled")
    if kind == "read":
        # 404: a run not stored yet; 409: the explanation of a run still running.
        return outcome in ("read ok", "read 404", "read 409")
    return outcome == "ok"


def metric_lines(c, prefix):
    status, text = c.request("GET", "/metrics")
    if status != 200 or not isinstance(text, str):
        return []
    return [l for l in text.splitlines() if l.startswith(prefix)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=float(os.environ.get("SOAK_MINUTES", 5)))
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between worker kills")
    ap.add_argument("--hup-every", type=float, default=20.0, help="seconds between SIGHUPs")
    ap.add_argument("--warmup", type=float, default=None, help="seconds (default: a fifth of the run, at least 20)")
    ap.add_argument("--xpud", default=os.path.join(TARGET, "release", "xpud"))
    ap.add_argument("--out", default=os.path.join(ROOT, ".cache", "soak"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-rss-bar", action="store_true",
                    help="report RSS growth without a bar (the short CI soak on a debug build, too short to settle)")
    args = ap.parse_args()
    duration = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else max(20.0, duration / 5)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)

    work = tempfile.mkdtemp(prefix="xpu-soak-")
    policies = os.path.join(ROOT, "policies", "examples")
    roots = [os.path.join(ROOT, "examples")]
    log_path = os.path.join(args.out, "xpud.log")
    open(log_path, "w").close()
    daemon = Daemon(args.xpud, os.path.join(work, "var"), policies, roots, log_path)
    daemon.start()
    print(f"xpud {args.xpud} on 127.0.0.1:{daemon.port}, data {work}/var; {args.minutes} min, "
          f"{args.clients} clients, a worker killed every {args.kill_every:.0f} s, SIGHUP every {args.hup_every:.0f} s",
          flush=True)

    jobs = Jobs()
    # Every kind (and every refused request) once before the clock starts: a kind that cannot
    # work here fails loudly now.
    c0 = Client(daemon.port)
    firsts = [(name, lambda c, fn=fn: fn(c, rng)) for name, _, fn in jobs.kinds]
    firsts += [("bad request", lambda c, i=i: jobs.bad(c, rng, i)) for i in range(8)]
    for name, fn in firsts:
        out, _ = fn(c0)
        if not allowed(name, out):
            daemon.stop()
            raise SystemExit(f"soak: the first '{name}' job ended '{out}'; see {log_path}")

    lock = threading.Lock()
    records = []  # (t, kind, outcome, run_id, seconds)
    samples = []  # (t, rss, fds, workers, workers' rss, requests, rss anon, rss file, duckdb) KiB
    events = []   # (t, what)
    stop = threading.Event()
    t0 = time.time()

    def client_loop(seed):
        c, local = Client(daemon.port), random.Random(seed)
        while not stop.is_set():
            kind, fn = jobs.pick(local)
            started = time.time()
            try:
                out, run = fn(c, local)
            except Exception as e:  # a dropped connection is an outcome, not a crash of the soak
                out, run = f"client error: {type(e).__name__}: {e}", None
            with lock:
                records.append((started - t0, kind, out, run, time.time() - started))

    def chaos_loop():
        next_kill, next_hup = t0 + args.kill_every, t0 + args.hup_every
        while not stop.wait(0.2):
            now = time.time()
            if now >= next_hup:
                daemon.proc.send_signal(signal.SIGHUP)
                events.append((now - t0, "SIGHUP"))
                next_hup += args.hup_every
            if now >= next_kill:
                workers = daemon.workers()
                if workers:
                    pid, engine = rng.choice(workers)
                    try:
                        os.kill(pid, signal.SIGKILL)
                        events.append((now - t0, f"SIGKILL {engine} worker {pid}"))
                    except ProcessLookupError:
                        pass
                next_kill += args.kill_every

    sampler_client = Client(daemon.port, timeout=30)

    def duckdb_kib():
        """The store's DuckDB memory (its buffer pool, bounded by store.memory_limit_mb)."""
        try:
            status, value = sampler_client.request(
                "POST", "/v1/sql", {"query": "SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()"})
            return int(value["rows"][0][0]) // 1024 if status == 200 else 0
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return 0

    def sampler_loop():
        while True:
            workers = daemon.workers()
            with lock:
                done = len(records)
            samples.append((time.time() - t0, daemon.rss_kib(), daemon.fds(), len(workers),
                            sum(daemon.rss_kib(p) for p, _ in workers), done,
                            daemon.rss_kib(field="RssAnon"), daemon.rss_kib(field="RssFile"),
                            duckdb_kib()))
            if stop.wait(2.0):
                return

    threads = [threading.Thread(target=client_loop, args=(args.seed * 1000 + i,), daemon=True)
               for i in range(args.clients)]
    threads += [threading.Thread(target=chaos_loop, daemon=True), threading.Thread(target=sampler_loop, daemon=True)]
    for t in threads:
        t.start()
    last_print = 0
    while time.time() - t0 < duration:
        time.sleep(1)
        if time.time() - last_print >= 30:
            last_print = time.time()
            s = samples[-1] if samples else None
            if s:
                print(f"  {s[0]:6.0f} s: {s[5]} requests, xpud RSS {s[1] / 1024:.0f} MiB, {s[2]} fds, "
                      f"{s[3]} workers ({s[4] / 1024:.0f} MiB)", flush=True)
    stop.set()
    for t in threads:
        t.join(timeout=300)
    elapsed = time.time() - t0

    # Every acknowledged run to its end, then the quiescent counts.
    c = Client(daemon.port)
    acknowledged = {}
    for _, kind, out, run, _ in records:
        if run:
            final = wait_final(c, run)
            acknowledged[run] = final["status"] if final else None
    time.sleep(1.0)
    # Less the descriptors held for live workers (see FDS_PER_WORKER).
    fds_end = daemon.fds() - FDS_PER_WORKER * len(daemon.workers())
    rss_end = daemon.rss_kib()
    restarts = metric_lines(c, "xpu_worker_restarts_total")
    crashed = metric_lines(c, "xpu_worker_crashed_jobs_total")
    stopped = daemon.stop()

    # Restarted on the same data: every acknowledged run is there, with the status it had.
    daemon.start()
    c = Client(daemon.port)
    lost, changed = [], []
    for run, status in acknowledged.items():
        code, value = c.request("GET", f"/v1/runs/{run}")
        if code != 200:
            lost.append(run)
        elif value.get("status") != status:
            changed.append((run, status, value.get("status")))
    daemon.stop()
    shutil.rmtree(work, ignore_errors=True)

    report = build_report(args, elapsed, warmup, records, samples, events, acknowledged, lost, changed,
                          fds_end, rss_end, restarts, crashed, stopped)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report["markdown"])
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump({k: v for k, v in report.items() if k != "markdown"}, f, indent=1)
    print(report["markdown"])
    print(f"report: {os.path.join(args.out, 'report.md')}")
    sys.exit(0 if report["passed"] else 1)


def build_report(args, elapsed, warmup, records, samples, events, acknowledged, lost, changed,
                 fds_end, rss_end, restarts, crashed, stopped):
    mix = collections.Counter((kind, out) for _, kind, out, _, _ in records)
    by_kind = collections.Counter(kind for _, kind, _, _, _ in records)
    latency = collections.defaultdict(list)
    for _, kind, out, _, secs in records:
        latency[kind].append(secs)
    bad_outcomes = {k: n for k, n in mix.items() if not allowed(*k)}
    fivexx = sum(n for (_, out), n in mix.items() if out.startswith("5xx"))
    after = [s for s in samples if s[0] >= warmup]
    def median(values):
        return sorted(values)[len(values) // 2]

    # Medians of 20 s windows (ten samples): single samples swing ±15% with the batches in
    # flight.
    first, last = after[:10] or samples[-1:], samples[-10:]
    rss_base, rss_tail = median([s[1] for s in first]), median([s[1] for s in last])
    growth = rss_tail / rss_base - 1 if rss_base else float("nan")
    # What DuckDB says it holds (its buffer pool, within store.memory_limit_mb): context for
    # the RSS figure, not subtracted from it (DuckDB counts memory it has allocated, which
    # is not all resident).
    duck_base, duck_tail = median([s[8] for s in first]), median([s[8] for s in last])
    # Each live worker holds FDS_PER_WORKER of xpud's descriptors, and an engine's pool grows
    # and shrinks with concurrency: the bar is on the descriptors held for anything else.
    fd_after = [s[2] - FDS_PER_WORKER * s[3] for s in after] or [fds_end]
    # The quiescent fd count after warm-up is not observable while clients run: the minimum
    # over the post-warm-up samples stands for it (connections in flight only add).
    fd_floor = min(fd_after)
    checks = {
        "no acknowledged run lost (after SIGTERM and a restart)": not lost and not changed and None not in acknowledged.values(),
        f"xpud RSS growth after warm-up < 10% ({growth * 100:+.1f}%"
        f"{'; reported only: --no-rss-bar' if args.no_rss_bar else ''})": growth < 0.10 or args.no_rss_bar,
        f"open fds flat, less {FDS_PER_WORKER} per live worker (quiescent at the end {fds_end}, floor after warm-up {fd_floor})": fds_end <= fd_floor + 4,
        f"no 5xx ({fivexx})": fivexx == 0,
        f"every outcome allowed for its kind ({sum(bad_outcomes.values())} not)": not bad_outcomes,
        f"xpud drained and exited 0 on SIGTERM ({stopped})": stopped == 0,
    }
    passed = all(checks.values())
    md = [f"# Soak: {elapsed / 60:.1f} min, {args.clients} clients (seed {args.seed})", ""]
    md += [f"- requests: {len(records)} ({len(records) / elapsed:.1f}/s); acknowledged runs: {len(acknowledged)} "
           f"({len(acknowledged) / elapsed:.1f}/s)",
           f"- events: {sum(1 for _, e in events if e == 'SIGHUP')} SIGHUP, "
           f"{sum(1 for _, e in events if e.startswith('SIGKILL'))} worker kills "
           f"({', '.join(e for _, e in events if e.startswith('SIGKILL')) or 'none'})",
           f"- lost runs: {len(lost)}; status changed across the restart: {len(changed)}",
           f"- xpud RSS: {rss_base / 1024:.0f} MiB after warm-up ({warmup:.0f} s), {rss_tail / 1024:.0f} MiB at the end "
           f"({growth * 100:+.1f}%), max {max(s[1] for s in samples) / 1024:.0f} MiB; quiescent {rss_end / 1024:.0f} MiB; "
           f"DuckDB's own count {duck_base / 1024:.0f} → {duck_tail / 1024:.0f} MiB; heap (RssAnon) "
           f"{median([s[6] for s in first]) / 1024:.0f} → {median([s[6] for s in last]) / 1024:.0f} MiB, mapped files "
           f"(RssFile) {median([s[7] for s in first]) / 1024:.0f} → {median([s[7] for s in last]) / 1024:.0f} MiB",
           f"- open fds: {min(s[2] for s in samples)}–{max(s[2] for s in samples)} while running; less {FDS_PER_WORKER} per "
           f"live worker: {fd_floor} floor after warm-up, {fds_end} quiescent at the end",
           f"- worker restarts (metrics): {'; '.join(restarts) or 'none'}",
           f"- jobs failed by a worker crash (metrics): {'; '.join(crashed) or 'none'}", ""]
    md += ["| bar | result |", "|---|---|"] + [f"| {k} | {'pass' if v else '**FAIL**'} |" for k, v in checks.items()]
    md += ["", "| kind | outcome | count | allowed |", "|---|---|---|---|"]
    for (kind, out), n in sorted(mix.items()):
        md.append(f"| {kind} | {out.replace('|', '/')} | {n} | {'yes' if allowed(kind, out) else '**no**'} |")
    md += ["", "| kind | requests | median s | p99 s |", "|---|---|---|---|"]
    for kind in sorted(by_kind):
        v = sorted(latency[kind])
        md.append(f"| {kind} | {by_kind[kind]} | {v[len(v) // 2]:.3f} | {v[min(len(v) - 1, int(len(v) * 0.99))]:.3f} |")
    md += ["", "| t (s) | requests | xpud RSS MiB | DuckDB's count MiB | fds | workers | workers' RSS MiB |",
           "|---|---|---|---|---|---|---|"]
    step = max(1, len(samples) // 20)
    for s in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        md.append(f"| {s[0]:.0f} | {s[5]} | {s[1] / 1024:.0f} | {s[8] / 1024:.0f} | {s[2]} | {s[3]} | {s[4] / 1024:.0f} |")
    return {
        "passed": passed, "checks": checks, "elapsed_s": elapsed, "requests": len(records),
        "acknowledged": len(acknowledged), "lost": lost, "changed": changed,
        "mix": [[k, o, n] for (k, o), n in sorted(mix.items())], "samples": samples, "events": events,
        "rss_growth": growth, "fds_end": fds_end, "fd_floor": fd_floor, "markdown": "\n".join(md) + "\n",
    }


if __name__ == "__main__":
    main()
