//! `xpu-bench isolation MODEL BATCH REPS THREADS`: the ort engine in-process against the
//! same engine in a worker process (issue 20's bar: ≤ 50 µs more per call at batch 1, ≤ 5%
//! at batch 64), after a warm-up, medians compared in two orders: alternately call by call,
//! then in runs of 25 calls a side. Also the worker's cold start (to its first answer) and
//! its restart after a SIGKILL.

use std::time::Instant;

use anyhow::{Context, Result};
use xpu_engine::{Assignment, Engine};

pub fn run(path: &str, batch: usize, reps: usize, threads: u32) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    let g = xpu_onnx::import_model(&bytes)?;
    let inputs = crate::model_inputs(&g, batch)?;
    let mut a = Assignment::new("ort");
    a.options.threads = Some(threads);
    let libraries = xpu_runtime::EngineLibraries::default();
    let shared = xpu_runtime::SharedEngines::load(&libraries);
    let local = shared.get("ort").context("this build has no ort engine")?.clone();
    // `XPU_BENCH_SPIN_US` overrides the spin budget (`isolation.spin_us`; 0 blocks at
    // once): the two measured in separate runs, since a spinning worker keeps a vCPU awake
    // for every other process too.
    let mut workers = xpu_runtime::worker::Workers::native();
    if let Some(us) = std::env::var("XPU_BENCH_SPIN_US").ok().and_then(|v| v.parse().ok()) {
        workers.spin = std::time::Duration::from_micros(us);
    }
    let worker = workers.engine("ort", &libraries);
    let started = Instant::now();
    let _ = worker.capabilities();
    let cold_start = started.elapsed();
    let mut exes = [local.prepare(&g, &a)?, worker.prepare(&g, &a)?];
    let warm_until = Instant::now() + std::time::Duration::from_millis(300);
    while Instant::now() < warm_until {
        for exe in &mut exes {
            exe.run(&inputs)?;
        }
    }
    // Two orders, each side's median per order. Call by call: the worker waits idle through
    // every in-process call, as it would for sparse jobs, and each request wakes it. In runs
    // of RUN calls a side: a stream of calls, as a job's nodes or a busy daemon send them.
    let by_call = time_sides(&mut exes, &inputs, reps, 1)?;
    let in_runs = time_sides(&mut exes, &inputs, reps, RUN)?;
    eprintln!(
        "ort.run_us, median: in-process {:.1}, in the worker {:.1} (call by call); {:.1}, {:.1} \
         (in runs)",
        by_call.engine[0], by_call.engine[1], in_runs.engine[0], in_runs.engine[1]
    );
    for (order, sides) in [("call by call", &by_call), ("in runs", &in_runs)] {
        let [inputs_us, serve_us, crossing_us] = sides.worker;
        eprintln!(
            "worker, median µs ({order}): inputs read {inputs_us:.1}, served {serve_us:.1}, \
             crossing {crossing_us:.1}"
        );
    }
    let (inproc, isolated) = (by_call.call[0], by_call.call[1]);
    let (inproc_runs, isolated_runs) = (in_runs.call[0], in_runs.call[1]);
    // Restart after a crash: kill the worker, then time the next call (new worker, the
    // executable prepared again there, the run).
    let pid = worker.worker_pid().context("the worker runs")?;
    // SAFETY: kill signals the worker, a child of this process.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(100));
    let at = Instant::now();
    exes[1].run(&inputs)?;
    let restart = at.elapsed();
    println!(
        "isolation {path} batch {batch}: in-process {inproc:.1} µs, worker {isolated:.1} µs, \
         overhead {:.1} µs ({:.1}%); in runs of {RUN}: in-process {inproc_runs:.1} µs, worker \
         {isolated_runs:.1} µs, overhead {:.1} µs ({:.1}%); spin {} µs; worker cold start \
         {:.1} ms, restart after SIGKILL + re-prepare + run {:.1} ms",
        isolated - inproc,
        (isolated / inproc - 1.0) * 100.0,
        isolated_runs - inproc_runs,
        (isolated_runs / inproc_runs - 1.0) * 100.0,
        workers.spin.as_micros(),
        cold_start.as_secs_f64() * 1e3,
        restart.as_secs_f64() * 1e3
    );
    Ok(())
}

/// Calls a side makes in a row in the second order.
const RUN: usize = 25;

/// Medians of each side's call time and of its engine's own time (`ort.run_us`), and of
/// the worker's facts on where its calls' time went (`worker.inputs_us`, `worker.serve_us`,
/// `worker.crossing_us`).
struct Sides {
    call: [f64; 2],
    engine: [f64; 2],
    worker: [f64; 3],
}

const WORKER_FACTS: [&str; 3] = ["worker.inputs_us", "worker.serve_us", "worker.crossing_us"];

/// Times `reps` calls of each executable, the two sides taking turns every `run` calls.
fn time_sides(
    exes: &mut [Box<dyn xpu_engine::Executable>; 2],
    inputs: &[xpu_ir::Tensor],
    reps: usize,
    run: usize,
) -> Result<Sides> {
    let mut times = [Vec::with_capacity(reps), Vec::with_capacity(reps)];
    // The engine's own time per run (its `ort.run_us` fact), to tell the crossing's cost
    // from a difference in the engine's compute.
    let mut engine = [Vec::with_capacity(reps), Vec::with_capacity(reps)];
    let mut worker: [Vec<f64>; 3] = Default::default();
    let fact = |out: &xpu_engine::Execution, key: &str| {
        let f = out.facts.iter().find(|f| f.key == key);
        f.and_then(|f| f.value.parse().ok()).unwrap_or(f64::NAN)
    };
    for _ in 0..reps.div_ceil(run) {
        for (side, ((exe, t), e)) in exes.iter_mut().zip(&mut times).zip(&mut engine).enumerate() {
            for _ in 0..run {
                let at = Instant::now();
                let out = exe.run(inputs)?;
                t.push(at.elapsed().as_secs_f64() * 1e6);
                e.push(fact(&out, "ort.run_us"));
                if side == 1 {
                    for (w, key) in worker.iter_mut().zip(WORKER_FACTS) {
                        w.push(fact(&out, key));
                    }
                }
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let [t0, t1] = &mut times;
    let [e0, e1] = &mut engine;
    let [w0, w1, w2] = &mut worker;
    Ok(Sides {
        call: [median(t0), median(t1)],
        engine: [median(e0), median(e1)],
        worker: [median(w0), median(w1), median(w2)],
    })
}

/// `xpu-bench ipc-floor WORK_US REPS`: what one blocking round trip over a Unix socket costs
/// on this machine when each side works `WORK_US` between messages, as the caller and an
/// engine's worker do — the floor under the worker's overhead, whatever the protocol. Two
/// threads, not processes: a wake-up of a sleeping thread costs the same (on a VM, an idle
/// vCPU is halted and the host must reschedule it), without a second program to start.
pub fn floor(work_us: f64, reps: usize) -> Result<()> {
    use std::io::{Read, Write};
    let (mut caller, mut worker) = std::os::unix::net::UnixStream::pair()?;
    let work = std::time::Duration::from_secs_f64(work_us / 1e6);
    let spin = move || {
        let until = Instant::now() + work;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    };
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let mut byte = [0u8; 1];
        while worker.read(&mut byte)? == 1 {
            spin();
            worker.write_all(&byte)?;
        }
        Ok(())
    });
    let mut times = Vec::with_capacity(reps);
    let mut byte = [0u8; 1];
    for _ in 0..reps {
        let at = Instant::now();
        caller.write_all(&byte)?;
        caller.read_exact(&mut byte)?;
        times.push((at.elapsed().as_secs_f64() * 1e6 - work_us).max(0.0));
        spin();
    }
    drop(caller);
    echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    times.sort_by(f64::total_cmp);
    println!(
        "ipc floor: a socket round trip with {work_us:.0} µs of work on each side costs {:.1} µs \
         (median of {reps}; p90 {:.1})",
        times[reps / 2],
        times[reps * 9 / 10]
    );
    Ok(())
}
