"""PyTorch's side of `make gpu-check`, and the report that puts both sides together.

`python torch_side.py bench OUT.json` times, on the GPU, PyTorch eager doing what the
example programs do (the fused chains and row groups, op by op as written, on 16M-element
f32 tensors) and torch.matmul on bf16 at 4096³ and 8192³.
`python torch_side.py report XPU.json TORCH.json REPORT.md` writes the report: the cuda
engine's conformance rows, its bandwidth against a device copy, its time against torch
eager (ratios), graph replay against eager launches, and the GEMM figures.
"""
import json
import sys

ROWS = 16 * 1024


def timed(torch, fn, reps=20):
    """Median milliseconds of `fn` on the current stream (CUDA events), after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


# The fused chains and row groups the issue's bars name (written out op by op).
ISSUE_SET = {"gelu_chain", "silu_chain", "mish_chain", "softplus_chain",
             "softmax_rows", "layernorm_rows", "rmsnorm_rows", "logsumexp_rows"}


def programs(torch):
    """Program file stem -> (inputs, torch eager function), matching tests/programs."""
    g = torch.Generator(device="cuda").manual_seed(7)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g, dtype=torch.float32)
    x, b, s, s_rows, gamma = r(ROWS, 1024), r(1024), r(1024), r(ROWS, 1), r(1024)

    def gelu(x, b):
        v = x + b
        return v * (torch.tanh((v + v.pow(3.0) * 0.044715) * 0.7978845608028654) + 1.0) * 0.5

    def silu(x, s, b):
        v = x * s + b
        return v / (torch.exp(-v) + 1.0)

    def mish(x, b):
        v = x + b
        return v * torch.tanh(torch.log(torch.exp(v) + 1.0))

    def softplus(x, s, b):
        return torch.log(torch.exp(x * s + b) + 1.0)

    def softmax(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    def layernorm(x, g, b):
        d = x - x.mean(-1, keepdim=True)
        return d / torch.sqrt((d * d).mean(-1, keepdim=True) + 1e-5) * g + b

    def rmsnorm(x, g):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * g

    def logsumexp(x):
        m = x.amax(-1, keepdim=True)
        return torch.log(torch.exp(x - m).sum(-1, keepdim=True)) + m

    return {
        "gelu_chain": ((x, b), gelu),
        "silu_chain": ((x, s, b), silu),
        "mish_chain": ((x, b), mish),
        "softplus_chain": ((x, s_rows, b), softplus),
        "softmax_rows": ((x,), softmax),
        "softmax_op_rows": ((x,), lambda x: torch.softmax(x, -1)),
        # References: one fused torch kernel each, for what a read-only row kernel reaches.
        "sum_rows (reference)": ((x,), lambda x: x.sum(-1, keepdim=True)),
        "logsumexp (torch fused)": ((x,), lambda x: torch.logsumexp(x, -1, keepdim=True)),
        "layernorm_rows": ((x, gamma, b), layernorm),
        "rmsnorm_rows": ((x, gamma), rmsnorm),
        "logsumexp_rows": ((x,), logsumexp),
    }


def bench(out):
    import torch
    rows = {}
    for name, (args, fn) in programs(torch).items():
        rows[name] = {"ms": timed(torch, lambda: fn(*args))}
    gemm = {}
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        bm = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        ms = timed(torch, lambda: a @ bm, reps=10)
        gemm[str(n)] = {"ms": ms, "tflops": 2 * n ** 3 / (ms / 1e3) / 1e12}
    json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
               "programs": rows, "gemm_bf16": gemm}, open(out, "w"), indent=2)


def report(xpu_path, torch_path, out):
    xpu, th = json.load(open(xpu_path)), json.load(open(torch_path))
    lines = ["# gpu-check report", ""]
    if not xpu.get("available"):
        lines += [f"The cuda engine is unavailable: {xpu.get('reason')}", ""]
    else:
        lines += [f"Engine: {xpu['engine']}; torch {th['torch']} on {th['device']}.", "",
                  "## Programs against the cpu engine (batch 37, eager and captured runs)", "",
                  "| program | ok | max relative error |", "|---|---|---|"]
        for r in xpu["conformance"]:
            ok = "unsupported (runs elsewhere under a plan)" if r.get("unsupported") else r["ok"]
            detail = r.get("max_relative_error", r.get("error"))
            if r.get("kernels"):
                detail = f"{detail} ({', '.join(r['kernels'])})"
            if r.get("bitwise_repeats") is False:
                detail = f"{detail}; bitwise runs did NOT repeat their bits"
            lines.append(f"| {r['program']} | {ok} | {detail} |")
        lines += ["", f"Device-to-device copy: {xpu['device_copy_gbps']:.0f} GB/s (read + write).", "",
                  "## 16M-element programs: time against torch eager, bandwidth against the copy", "",
                  "Device times: CUDA events around the kernels (xpu) and around the ops (torch); "
                  "wall: a whole run_values call, synchronised.", "",
                  "Default math (FMA contraction, approximate division) eager and captured; "
                  "`bitwise`: determinism = \"bitwise\" (strict IEEE math), eager. Bars read from the best of the default two.", "",
                  "| program | xpu eager device ms (wall) | xpu graph device ms (wall) | xpu bitwise device ms (of copy) | torch eager ms | × torch (best) | of copy (best) | bars |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in xpu["throughput"]:
            t = th["programs"].get(r["program"], {}).get("ms")
            if "error" not in r and t is None:
                e, g, b = r["eager"], r["graph"], r["bitwise"]
                lines.append(f"| {r['program']} | {e['device_ms']:.3f} ({e['ms']:.3f}) | {g['device_ms']:.3f} ({g['ms']:.3f}) | {b['device_ms']:.3f} ({b['of_copy']:.2f}) | | | {max(e['of_copy'], g['of_copy']):.2f} | |")
                continue
            if "error" in r or t is None:
                lines.append(f"| {r['program']} | {r.get('error', '')} | | | {t} | | | |")
                continue
            e, g, b = r["eager"], r["graph"], r["bitwise"]
            best = min(e["device_ms"], g["device_ms"])
            of_copy = max(e["of_copy"], g["of_copy"])
            ratio = t / best
            if r["program"] in ISSUE_SET:
                bars = ("met" if ratio >= 1.5 and of_copy >= 0.8 else "MISSED") + " (≥ 1.5×, ≥ 0.80)"
            else:
                # Not one of the issue's written-out programs: torch runs it as one fused
                # kernel, so only the bandwidth bar applies.
                bars = ("met" if of_copy >= 0.8 else "MISSED") + " (≥ 0.80; torch fused)"
            lines.append(f"| {r['program']} | {e['device_ms']:.3f} ({e['ms']:.3f}) | {g['device_ms']:.3f} ({g['ms']:.3f}) | {b['device_ms']:.3f} ({b['of_copy']:.2f}) | {t:.3f} | {ratio:.2f} | {of_copy:.2f} | {bars} |")
        lse = th["programs"].get("logsumexp (torch fused)", {}).get("ms")
        if lse:
            gbps = (16 * 1024 * 1024 * 4) / (lse / 1e3) / 1e9
            lines += ["", f"torch.logsumexp (one fused kernel): {lse:.3f} ms, "
                          f"{gbps / xpu['device_copy_gbps']:.2f} of the copy (its reads only, as above)."]
        tr = xpu.get("transfers", {})
        if "error" in tr:
            lines += ["", f"Transfers: {tr['error']}"]
        elif tr:
            lines += ["", f"## Host transfers of {tr['bytes'] >> 20} MiB (GB/s, median of whole calls)", "",
                      "| host memory | upload | download | round trip equal |", "|---|---|---|---|"]
            for name in ("pageable", "pinned"):
                r = tr[name]
                lines.append(f"| {name} | {r['upload_gbps']:.1f} | {r['download_gbps']:.1f} | {r['round_trip_equal']} |")
        oom = xpu.get("out_of_memory")
        if oom:
            lines += ["", f"Out of memory (a 512 GiB arena): ok {oom['ok']}: {oom.get('error')}; a small program runs after: {oom.get('runs_after')}"]
        sticky = xpu.get("sticky_error")
        if sticky:
            w, p = sticky.get("worker", {}), sticky.get("in_process", {})
            lines += ["", f"Sticky error (a kernel that traps), ok {sticky['ok']}. In a worker process: "
                      f"ok {w.get('ok')}: the job's error: {w.get('error')}; worker replaced: "
                      f"{w.get('worker_replaced')}; restarts: {w.get('restarts')}; the executables "
                      f"prepared before it, run again: {w.get('runs_after')}. In this process: ok "
                      f"{p.get('ok')}: {p.get('error')}; available after: {p.get('available_after')}; "
                      f"a new executable: {p.get('a_new_executable')}"]
        wc = xpu.get("whole_capture", [])
        if wc:
            lines += ["", "## Partitions with cuBLASLt calls captured whole (batch 37, device-resident, µs per whole call, median)", "",
                      "| program | eager | graph replay | × | outputs equal | capture |", "|---|---|---|---|---|---|"]
            for r in wc:
                if "error" in r:
                    lines.append(f"| {r['program']} | {r['error']} | | | | |")
                else:
                    lines.append(f"| {r['program']} | {r['eager_us']:.1f} | {r['graph_us']:.1f} | {r['eager_us'] / r['graph_us']:.2f} | {r['equal']} | {r['capture']} |")
        rp = xpu["graph_replay"]
        if "error" in rp:
            lines += ["", f"Graph replay: {rp['error']}"]
        else:
            e, g = rp["eager"]["us_per_kernel"], rp["graph"]["us_per_kernel"]
            lines += ["", f"Graph replay of {rp['kernels']} kernels: {g:.2f} µs per kernel replayed, "
                      f"{e:.2f} µs eager: {e / g:.2f}× (bar ≥ 2×); capture + instantiate "
                      f"{rp['graph'].get('capture_and_instantiate_ms')} ms once. Facts: {rp['graph']['facts']}"]
        lines += ["", "## cuda.cublaslt against the cpu engine (f32 on the same rounded inputs)", "",
                  "| case | ok | max relative error (tolerance) | plan |", "|---|---|---|---|"]
        for r in xpu.get("cublaslt", []):
            if "error" in r:
                lines.append(f"| {r['case']} | False | {r['error']} | |")
            elif "mismatches" in r:
                found = "; ".join(r["mismatches"]) or "every NaN and infinity as on the cpu engine"
                lines.append(f"| {r['case']} | {r['ok']} | {found} | {r['plan']} |")
            else:
                lines.append(f"| {r['case']} | {r['ok']} | {r['max_relative_error']:.2e} ({r['tolerance']}) | {r['plan']} |")
    if xpu.get("planned"):
        lines += ["", "## Programs planned under latency-gpu.toml (cuda + cpu engines, GraphExec) against the planned graph on the cpu engine", "",
                  "| program | ok | max relative error (tolerance; vs the f32 program) | partitions | kernels |", "|---|---|---|---|---|"]
        for r in xpu["planned"]:
            if "error" in r:
                lines.append(f"| {r['program']} | False | {r['error']} | | |")
            elif "not_planned" in r:
                lines.append(f"| {r['program']} | not planned (the policy's answer) | {r['not_planned'][:200]} | | |")
            else:
                lines.append(f"| {r['program']} | {r['ok']} | {r['max_relative_error']:.2e} ({r.get('tolerance', 2e-2):.1e}; {r['vs_f32_program']:.2e}) | {'; '.join(r['partitions'])} | {', '.join(r['kernels'])} |")
    lines += ["", "## bf16 GEMM (device time, CUDA events, median)", "",
              "| n³ | cuda.cublaslt TFLOP/s | torch.matmul TFLOP/s | ratio | bar ≥ 0.95 | plan |", "|---|---|---|---|---|---|"]
    for n, r in th["gemm_bf16"].items():
        x = xpu.get("gemm_bf16", {}).get(n)
        if not x or "error" in x:
            why = (x or {}).get("error") or xpu.get("unavailable_kernels", {}).get("cuda.cublaslt", "n/a")
            lines.append(f"| {n} | {why} | {r['tflops']:.0f} | | | |")
            continue
        ratio = x["tflops"] / r["tflops"]
        lines.append(f"| {n} | {x['tflops']:.0f} | {r['tflops']:.0f} | {ratio:.3f} | {'met' if ratio >= 0.95 else 'MISSED'} | {x['plan']} |")
    open(out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1] == "bench":
        bench(sys.argv[2])
    else:
        report(*sys.argv[2:5])
