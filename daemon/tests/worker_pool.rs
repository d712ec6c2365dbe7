//! An isolated engine's pool of workers at the engine level: the real `xpu-worker` serving
//! the cpu engine with fault markers on (`-1003` as an input's first element hangs the run).
//! Executables go to an idle worker, so a hanging run holds up only its own worker (one of
//! its executables run meanwhile moves to the idle worker); dropping an executable never
//! waits for a run in flight on its worker; the hang is stopped.

use std::time::Duration;

use xpu_engine::{Assignment, Engine, Executable, StopToken};
use xpu_ir::{Tensor, TensorData};

const DOUBLE: &str = r#"graph "double" {
  %0: f32[4] = input "x"
  %1: f32[] = constant {value = tensor<f32[]> [2.0]}
  %2: f32[4] = mul(%0, %1)
  return "y" = %2
}"#;

fn pool(processes: usize) -> xpu_runtime::worker::WorkerEngine {
    let workers = xpu_runtime::worker::Workers {
        engines: vec!["cpu".into()],
        program: Some(env!("CARGO_BIN_EXE_xpu-worker").into()),
        max_rss_bytes: 0,
        inject_faults: true,
        processes_per_engine: processes,
        idle_exit: Duration::ZERO,
        spin: xpu_runtime::worker::DEFAULT_SPIN,
    };
    workers.engine("cpu", &xpu_runtime::EngineLibraries::default())
}

fn input(first: f32) -> Vec<Tensor> {
    vec![Tensor::new(vec![4], TensorData::F32(vec![first, 1.0, 2.0, 3.0])).unwrap()]
}

fn prepare(engine: &xpu_runtime::worker::WorkerEngine) -> Box<dyn Executable> {
    let graph = xpu_ir::text::parse(DOUBLE).unwrap();
    engine.prepare(&graph, &Assignment::new("cpu")).unwrap()
}

#[test]
fn a_hanging_run_holds_up_only_its_own_worker() {
    let engine = pool(2);
    let mut first = prepare(&engine);
    let out = first.run(&input(0.5)).unwrap();
    assert_eq!(out.outputs[0].as_slice::<f32>().unwrap(), &[1.0, 2.0, 4.0, 6.0]);
    // A serial load keeps one worker: the next executable goes to the idle first worker.
    let mut second = prepare(&engine);
    second.run(&input(1.0)).unwrap();
    let mut fourth = prepare(&engine);
    fourth.run(&input(4.0)).unwrap();
    let first_pid = engine.worker_pid().expect("the first worker runs");
    // The first executable hangs on its worker until stopped.
    let stop = StopToken::new();
    let stopper = stop.clone();
    let hanging = std::thread::spawn(move || {
        let result = first.run_until(&input(-1003.0), &stopper);
        (first, result)
    });
    std::thread::sleep(Duration::from_millis(500));
    // Dropping an executable of the busy worker returns at once (it used to wait for the
    // worker's lock, i.e. for the hang).
    let (dropped, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(second);
        let _ = dropped.send(());
    });
    let waited = done.recv_timeout(Duration::from_secs(2));
    assert!(waited.is_ok(), "dropping an executable waited for its busy worker");
    // A new executable goes to the idle second worker and runs while the first hangs.
    let mut third = prepare(&engine);
    let out = third.run(&input(3.0)).unwrap();
    assert_eq!(out.outputs[0].as_slice::<f32>().unwrap(), &[6.0, 2.0, 4.0, 6.0]);
    assert!(!hanging.is_finished(), "the first worker still hangs");
    // An executable of the hanging worker, run now, moves to the idle one instead of
    // waiting behind the hang.
    let (ran, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = ran.send(fourth.run(&input(4.0)).map(|out| out.outputs[0].clone()));
    });
    let moved = done.recv_timeout(Duration::from_secs(10)).expect("ran beside the hang");
    assert_eq!(moved.unwrap().as_slice::<f32>().unwrap(), &[8.0, 2.0, 4.0, 6.0]);
    // The hang ignores the stop; its worker is killed after the grace and the run stopped.
    stop.cancel();
    let (mut first, result) = hanging.join().unwrap();
    let Err(error) = result else { panic!("stopped, not finished") };
    let error = error.to_string();
    assert!(error.contains("cancel"), "{error}");
    // Its worker is replaced at the next use and the executable prepared there again.
    let out = first.run(&input(0.5)).unwrap();
    assert_eq!(out.outputs[0].as_slice::<f32>().unwrap(), &[1.0, 2.0, 4.0, 6.0]);
    assert_ne!(engine.worker_pid(), Some(first_pid), "a new first worker");
    third.run(&input(3.0)).unwrap();
}

#[test]
fn a_worker_whose_engine_is_poisoned_retires_and_the_next_run_gets_a_fresh_one() {
    // `-1006` fails the run as a sticky CUDA error does (the engine reports itself poisoned
    // for the process); the worker says so with its reply and exits. The job fails with the
    // engine's error, not a crash, and the next run — the same executable — runs at once on
    // a new worker.
    let engine = pool(1);
    let mut exe = prepare(&engine);
    exe.run(&input(0.5)).unwrap();
    let pid = engine.worker_pid().expect("the worker runs");
    let before = xpu_runtime::worker::stats_snapshot().get("cpu").cloned().unwrap_or_default();
    let error = exe.run(&input(-1006.0)).expect_err("a poisoned run fails");
    assert!(matches!(error, xpu_engine::EngineError::Kernel { .. }), "{error:?}");
    assert!(error.to_string().contains("injected sticky device error"), "{error}");
    let out = exe.run(&input(1.0)).expect("the next run gets a fresh worker");
    assert_eq!(out.outputs[0].as_slice::<f32>().unwrap(), &[2.0, 2.0, 4.0, 6.0]);
    assert_ne!(engine.worker_pid(), Some(pid), "the poisoned worker was replaced");
    let after = xpu_runtime::worker::stats_snapshot().get("cpu").cloned().unwrap_or_default();
    let restarts = |s: &xpu_runtime::worker::EngineWorkerStats, cause: &str| {
        s.restarts.get(cause).copied().unwrap_or(0)
    };
    // Counted as retired-poisoned (process-wide stats: other tests of this binary count
    // their own causes at the same time, so only this cause is compared).
    assert_eq!(restarts(&after, "poisoned"), restarts(&before, "poisoned") + 1);
}

#[test]
fn a_run_on_a_worker_says_what_the_crossing_cost() {
    // The worker reports its own share of a call (inputs read from the shared memory, the
    // run, the outputs written) and the parent the rest: messages and wake-ups.
    let engine = pool(1);
    let mut exe = prepare(&engine);
    let started = std::time::Instant::now();
    let out = exe.run(&input(0.5)).unwrap();
    let call_us = started.elapsed().as_secs_f64() * 1e6;
    let fact = |key: &str| -> f64 {
        let f = out.facts.iter().find(|f| f.key == key).unwrap_or_else(|| panic!("{key}"));
        f.value.parse().unwrap_or_else(|e| panic!("{key} = {}: {e}", f.value))
    };
    let (inputs, served, crossing) =
        (fact("worker.inputs_us"), fact("worker.serve_us"), fact("worker.crossing_us"));
    assert!(0.0 <= inputs && inputs <= served, "inputs {inputs} µs within served {served} µs");
    assert!(crossing >= 0.0);
    assert!(
        served + crossing <= call_us,
        "{served} + {crossing} µs within the call's {call_us} µs"
    );
    // An in-process run has neither.
    let local = xpu_engine_cpu::CpuEngine::new();
    let graph = xpu_ir::text::parse(DOUBLE).unwrap();
    let ran = local.prepare(&graph, &Assignment::new("cpu")).unwrap().run(&input(0.5)).unwrap();
    assert!(ran.facts.iter().all(|f| !f.key.starts_with("worker.")), "{:?}", ran.facts);
}

#[test]
fn ort_in_a_worker_reads_its_inputs_in_place_and_keeps_its_facts_from_run_to_run() {
    // ORT reads the shared memory where the parent wrote the inputs (bools copied), gives
    // the in-process outputs, and the facts it repeats every run cross once (later replies
    // keep them): every run's facts are whole, at every batch.
    let libraries = xpu_runtime::EngineLibraries::default();
    let workers = xpu_runtime::worker::Workers {
        engines: vec!["ort".into()],
        program: Some(env!("CARGO_BIN_EXE_xpu-worker").into()),
        max_rss_bytes: 0,
        inject_faults: false,
        processes_per_engine: 1,
        idle_exit: Duration::ZERO,
        spin: xpu_runtime::worker::DEFAULT_SPIN,
    };
    let worker = workers.engine("ort", &libraries);
    let shared = xpu_runtime::SharedEngines::load(&libraries);
    let local = shared.get("ort").expect("the ort engine").clone();
    let graph = xpu_ir::text::parse(
        r#"graph "g" {
  %0: f32[N,4] = input "x"
  %1: bool[N,4] = input "keep"
  %2: f32[] = constant {value = tensor<f32[]> [2.0]}
  %3: f32[N,4] = mul(%0, %2)
  %4: f32[N,4] = where(%1, %3, %0)
  return "y" = %4
}"#,
    )
    .unwrap();
    let a = Assignment::new("ort");
    let mut remote = worker.prepare(&graph, &a).unwrap();
    let mut here = local.prepare(&graph, &a).unwrap();
    let stable = |facts: &[xpu_engine::Fact]| -> Vec<(String, String)> {
        let varying = ["ort.run_us", "ort.session"];
        facts
            .iter()
            .filter(|f| !varying.contains(&f.key.as_str()) && !f.key.starts_with("worker."))
            .map(|f| (f.key.clone(), f.value.clone()))
            .collect()
    };
    let keys = |facts: &[(String, String)]| facts.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    let mut first: Option<Vec<(String, String)>> = None;
    for n in [1usize, 3, 3, 64] {
        let x: Vec<f32> = (0..n * 4).map(|i| i as f32 - 5.5).collect();
        let keep: Vec<bool> = (0..n * 4).map(|i| i % 3 != 0).collect();
        let inputs =
            [Tensor::from_vec(vec![n, 4], x).unwrap(), Tensor::from_vec(vec![n, 4], keep).unwrap()];
        let got = remote.run(&inputs).unwrap();
        let want = here.run(&inputs).unwrap();
        assert_eq!(got.outputs, want.outputs, "batch {n}");
        // The same facts as in-process (the profiled times aside), and the first run's
        // facts, times and all, on every later run.
        let facts = stable(&got.facts);
        assert_eq!(keys(&facts), keys(&stable(&want.facts)), "batch {n}");
        assert_eq!(&facts, first.get_or_insert_with(|| facts.clone()), "batch {n}");
        assert!(got.facts.iter().any(|f| f.key == "ort.run_us"), "{:?}", got.facts);
        assert!(got.facts.iter().any(|f| f.key == "ort.provider"), "{:?}", got.facts);
    }
}
