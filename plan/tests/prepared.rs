//! Prepare once, run many: the prepared cache hands back the GraphExec a plan was prepared
//! into, reports `prepared` then `reused` per partition, gives the same outputs either way,
//! and keeps within its bounds (plans, idle executables per plan, bytes of weights).

use std::sync::Arc;

use xpu_engine::Registry;
use xpu_ir::Tensor;
use xpu_plan::{CapturePlan, PrepareOutcome, PreparedCache};

const GRAPH: &str = r#"graph "t" {
  %0: f32[4,8] = input "x"
  %1: f32[8,8] = constant {value = tensor<f32[8,8]> [SPLAT]}
  %2: f32[4,8] = matmul(%0, %1) @name("fc")
  %3: f32[4,8] = relu(%2) @name("act")
  return "y" = %3
}"#;

/// A plan of the graph whose weight is `scale` everywhere (a different plan per scale).
fn plan(reg: &Registry, scale: f32) -> Arc<CapturePlan> {
    let weights = vec![format!("{scale:?}"); 64].join(", ");
    let g = xpu_ir::text::parse(&GRAPH.replace("SPLAT", &weights)).unwrap();
    let p =
        xpu_policy::Loader::new().load_text("t.toml", None, "[policy]\nname = \"t\"\n").unwrap();
    Arc::new(xpu_plan::plan(&g, &p, &reg.inventory()).unwrap().0)
}

fn registry() -> Registry {
    let mut reg = Registry::new();
    reg.register(Arc::new(xpu_engine_cpu::CpuEngine::new()));
    reg
}

fn input() -> Vec<Tensor> {
    vec![Tensor::from_vec(vec![4, 8], (0..32).map(|i| i as f32 - 10.0).collect()).unwrap()]
}

#[test]
fn a_repeated_plan_reuses_its_prepared_executable() {
    let reg = registry();
    let cache = PreparedCache::new(8, 2, 1 << 20);
    let p = plan(&reg, 0.5);
    let mut outcomes = Vec::new();
    let mut outputs = Vec::new();
    for _ in 0..3 {
        let mut exec = cache.checkout(&p, &reg).unwrap();
        let run = exec.run(&input()).unwrap();
        assert_eq!(run.prepared.len(), p.partitions.len());
        outcomes.push(run.prepared[0].outcome);
        assert!(run.prepared[0].prepare_nanos > 0);
        outputs.push(run.outputs);
        assert_eq!(cache.checkin(exec), 0);
    }
    assert_eq!(
        outcomes,
        [PrepareOutcome::Prepared, PrepareOutcome::Reused, PrepareOutcome::Reused]
    );
    assert!(outputs.windows(2).all(|w| w[0] == w[1]), "reuse changes no result");
    let s = cache.stats();
    assert_eq!((s.prepared, s.reused, s.idle, s.plans), (1, 2, 1, 1));
    assert_eq!(s.bytes, 64 * 4, "the weights the kept executable holds");
    // Two jobs at once take two executables; both are kept, up to two per plan.
    let a = cache.checkout(&p, &reg).unwrap();
    let b = cache.checkout(&p, &reg).unwrap();
    let c = cache.checkout(&p, &reg).unwrap();
    assert_eq!((cache.stats().prepared, cache.stats().reused), (3, 3));
    assert_eq!(cache.checkin(a) + cache.checkin(b), 0);
    assert_eq!(cache.checkin(c), 1, "a third idle executable is over the per-plan bound");
    assert_eq!(cache.stats().idle, 2);
}

#[test]
fn the_bounds_evict_the_least_recently_used_plan() {
    let reg = registry();
    // Room for two plans' weights (256 bytes each), and for three plans.
    let cache = PreparedCache::new(3, 1, 600);
    let plans: Vec<_> = [1.0, 2.0, 3.0].iter().map(|&s| plan(&reg, s)).collect();
    for p in &plans[..2] {
        let exec = cache.checkout(p, &reg).unwrap();
        assert_eq!(cache.checkin(exec), 0);
    }
    // Using the first makes the second the least recently used.
    let exec = cache.checkout(&plans[0], &reg).unwrap();
    assert_eq!(cache.checkin(exec), 0);
    let exec = cache.checkout(&plans[2], &reg).unwrap();
    assert_eq!(cache.checkin(exec), 1, "over 600 bytes: one plan's executable goes");
    let s = cache.stats();
    assert_eq!((s.idle, s.bytes, s.evicted), (2, 512, 1));
    assert_eq!(s.reused, 1);
    let before = cache.stats().prepared;
    let exec = cache.checkout(&plans[1], &reg).unwrap();
    assert_eq!(cache.stats().prepared, before + 1, "the evicted plan prepares again");
    drop(exec);
    let exec = cache.checkout(&plans[0], &reg).unwrap();
    assert_eq!(cache.stats().reused, 2, "the recently used plan was kept");
    drop(exec);
    // A cache of no plans keeps nothing; one smaller than an executable keeps nothing.
    for cache in [PreparedCache::new(0, 4, 1 << 20), PreparedCache::new(8, 4, 100)] {
        let exec = cache.checkout(&plans[0], &reg).unwrap();
        assert_eq!(cache.checkin(exec), 1);
        assert_eq!(cache.stats().idle, 0);
    }
}

#[test]
fn plans_are_told_apart_by_identity_not_by_address_reuse() {
    let reg = registry();
    let cache = PreparedCache::new(8, 1, 1 << 20);
    let first = plan(&reg, 1.0);
    let exec = cache.checkout(&first, &reg).unwrap();
    cache.checkin(exec);
    // The cache holds the plan alive: a new plan cannot take its address, so it prepares.
    drop(first);
    let second = plan(&reg, 2.0);
    let mut exec = cache.checkout(&second, &reg).unwrap();
    let y = exec.run(&input()).unwrap().outputs;
    assert_eq!(exec.runs(), 1);
    // Row 3 of x is 14..=21: relu(2 × 140).
    let want = input()[0].as_slice::<f32>().unwrap()[24..].iter().sum::<f32>() * 2.0;
    assert_eq!(want, 280.0);
    assert_eq!(y[0].as_slice::<f32>().unwrap()[24], want, "the second plan's weights ran");
}
